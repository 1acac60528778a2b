//! Request traces and engine steps -> the spec's spans and metrics (names, attributes, units
//! and dimensions exactly as the spec writes them). Pure: exporters take it from here.
pub mod agent_metrics;
pub mod api_metrics;
pub mod clock;
pub mod entry_span;
pub mod gpu;
pub mod metrics;
pub mod profile;
pub mod python_samples;
pub mod resource;
pub mod span;

pub use clock::Clock;

/// What the spans contain.
#[derive(Clone, Debug)]
pub struct SpanOptions {
    /// 0: entry + `llm_request`; 1: + stage spans; 2: + per-iteration events.
    pub granularity: u8,
    /// SGLang's trace level: native stage spans above it are left out; 0 leaves out the
    /// native hierarchy.
    pub sglang_trace_level: u8,
    /// Prompt and output text on entry spans.
    pub capture_content: bool,
    /// Model name when the API call did not say (the engine's served model name).
    pub default_model: Option<String>,
    /// The host's identity (`/etc/machine-id`), which SGLang's thread spans carry.
    pub host_id: Option<String>,
}

impl Default for SpanOptions {
    fn default() -> Self {
        Self {
            granularity: 1,
            sglang_trace_level: 3,
            capture_content: false,
            default_model: None,
            host_id: None,
        }
    }
}
