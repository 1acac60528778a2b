//! The engines: the interface every engine implements (`engine`), one folder per engine kind
//! (its wire format, request tracking, spans, metrics and loss counters), the machinery they
//! share (`common`), and the registry of kinds below. Pure: no I/O, time comes from the
//! captures. docs/architecture.md says where a byte goes.
pub mod common;
pub mod engine;
pub mod sglang;
pub mod vllm;

use crate::discover::engine::Engine;
use engine::EngineKind;

/// The registry of engine kinds: one line per engine.
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
