//! Request traces and engine steps -> the spec's spans and metrics (names, attributes, units
//! and dimensions exactly as the spec writes them). Pure: exporters take it from here.
pub mod agent_metrics;
pub mod api_metrics;
pub mod entry_span;
pub mod gpu;
pub mod metrics;
pub mod profile;
pub mod python_samples;
pub mod sglang_metrics;
pub mod sglang_spans;
pub mod span;
pub mod vllm_metrics;
pub mod vllm_spans;

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

/// Converts the capture clock (CLOCK_MONOTONIC, which vLLM's `time.monotonic()` also reads)
/// and wall-clock seconds into Unix nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, ns, measured when the capture started.
    pub realtime_minus_monotonic_ns: i128,
}

impl Clock {
    pub fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        to_u64(i128::from(monotonic_ns) + self.realtime_minus_monotonic_ns)
    }

    /// A CLOCK_MONOTONIC time in seconds (an engine timestamp).
    pub fn unix_ns_of_mono_secs(&self, seconds: f64) -> u64 {
        to_u64((seconds * 1e9).round() as i128 + self.realtime_minus_monotonic_ns)
    }

    /// Nanoseconds from a wall-clock instant in seconds (vLLM's `arrival_time`) to a capture
    /// time; 0 when the capture time is earlier.
    pub fn ns_since_wall_secs(&self, wall_secs: f64, monotonic_ns: u64) -> u64 {
        self.unix_ns(monotonic_ns)
            .saturating_sub(self.unix_ns_of_wall_secs(wall_secs))
    }

    /// A wall-clock time in seconds (`time.time()`).
    pub fn unix_ns_of_wall_secs(&self, seconds: f64) -> u64 {
        to_u64((seconds * 1e9).round() as i128)
    }
}

fn to_u64(ns: i128) -> u64 {
    u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
}
