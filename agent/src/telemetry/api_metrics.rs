//! Metrics of the API layer, the same for every engine: `genai_llm_usage_tokens` per call.
use super::metrics::{MetricDef, Registry};
use crate::engines::common::join::{ApiExchange, EngineSide};

pub const USAGE_TOKENS: MetricDef = MetricDef::counter(
    "genai_llm_usage_tokens",
    "Count",
    "Input and output token consumption, distinguished by usageType.",
);

/// `genai_llm_usage_tokens` of one answered API call: its `usage`, else the engine's counts.
pub fn api_usage(
    r: &mut Registry,
    api: &ApiExchange,
    engine: &EngineSide,
    default_model: Option<&str>,
) {
    let Some(op) = api.call.operation else {
        return;
    };
    if api.call.status.is_none_or(|s| s >= 400) {
        return;
    }
    let model = api
        .call
        .model
        .clone()
        .or_else(|| default_model.map(str::to_owned))
        .unwrap_or_else(|| "unknown".into());
    let (input, output) = engine.tokens(&api.call);
    for (usage_type, count) in [("input", input), ("output", output)] {
        let Some(count) = count else { continue };
        let dims = vec![
            ("callType", "gen_ai".into()),
            ("callKind", "custom_entry".into()),
            ("rpcType", "2100".into()),
            ("modelName", model.clone()),
            ("spanKind", op.span_kind().into()),
            ("usageType", usage_type.into()),
        ];
        r.add(&USAGE_TOKENS, dims, count as f64);
    }
}
