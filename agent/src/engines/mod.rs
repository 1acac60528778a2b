//! The engines: the interface every engine implements (`engine`), one folder per engine kind
//! (how discovery recognises its processes, its wire format, request tracking, spans, metrics
//! and loss counters), the machinery they share (`common`), and the registry of kinds below.
//! Pure: no I/O, time comes from the captures. docs/architecture.md says where a byte goes.
pub mod common;
pub mod engine;
pub mod sglang;
pub mod vllm;

use serde::{Deserialize, Serialize};

use crate::discover::recognition::Recognition;
use engine::EngineKind;

/// The registry of engine kinds: an engine is a variant here, an entry in [`Engine::ALL`] and
/// an arm in [`kind`]; everything else about it is in its folder. The variant's name is how
/// recordings and `infertrace discover --json` spell the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    /// Every engine, in the order discovery tries them.
    pub const ALL: [Engine; 2] = [Engine::Vllm, Engine::Sglang];

    /// As shown to users ("vLLM").
    pub fn name(self) -> &'static str {
        self.recognition().name
    }

    /// How discovery recognises its processes.
    pub fn recognition(self) -> &'static Recognition {
        kind(&self).recognition()
    }
}

/// The kind of an engine.
pub fn kind(engine: &Engine) -> &'static dyn EngineKind {
    match engine {
        Engine::Vllm => &vllm::Vllm,
        Engine::Sglang => &sglang::Sglang,
    }
}

/// The kind that traces a server: its engine's; a process that is not an engine is traced as
/// vLLM is (its tracker makes entry spans from any OpenAI-compatible server's API calls, and
/// nothing of an engine's wire is expected).
pub fn kind_or_default(engine: Option<&Engine>) -> &'static dyn EngineKind {
    kind(engine.unwrap_or(&Engine::Vllm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_has_its_own_kind_and_title_prefix() {
        for engine in Engine::ALL {
            assert_eq!(kind(&engine).engine(), engine);
            let others = Engine::ALL.iter().filter(|&&e| e != engine);
            for other in others {
                assert_ne!(
                    engine.recognition().title_prefix,
                    other.recognition().title_prefix
                );
            }
        }
    }
}
