//! A server's or a request's part under prefill/decode (PD) disaggregation, whatever the
//! engine; each engine spells it its own way on its spans.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdRole {
    /// Computes the prompt's KV cache and hands it on (vLLM's KV producer).
    Prefill,
    /// Takes the KV cache over and generates (vLLM's KV consumer).
    Decode,
}

impl PdRole {
    /// As SGLang writes it in its request span's name (`{role} Req …`).
    pub fn name(self) -> &'static str {
        match self {
            PdRole::Prefill => "prefill",
            PdRole::Decode => "decode",
        }
    }

    /// As SGLang prefixes its thread labels (`Decode Scheduler`, `DecodeTokenizer`).
    pub fn label(self) -> &'static str {
        match self {
            PdRole::Prefill => "Prefill",
            PdRole::Decode => "Decode",
        }
    }

    /// vLLM's `gen_ai.pd_role`: its KV connector's `producer` / `consumer`, `none` when the
    /// request is not disaggregated.
    pub fn kv_role(role: Option<PdRole>) -> &'static str {
        match role {
            Some(PdRole::Prefill) => "producer",
            Some(PdRole::Decode) => "consumer",
            None => "none",
        }
    }
}
