//! What vLLM's tracker could not use, as `infertrace_vllm_*` counters next to the spec's
//! metrics.
use super::tracker::VllmStats;
use crate::telemetry::{
    agent_metrics::{counter, set_totals},
    metrics::{MetricDef, Registry},
};

pub const UNDECODABLE: MetricDef = counter(
    "infertrace_vllm_undecodable_messages_total",
    "vLLM messages that did not decode with any known layout.",
);
pub const WITHOUT_ADD: MetricDef = counter(
    "infertrace_vllm_requests_without_add_total",
    "Engine requests seen only by their outputs (sent before attach, or their ADD was lost).",
);
pub const EVICTED: MetricDef = counter(
    "infertrace_vllm_requests_evicted_total",
    "Requests dropped unreported because too many were in flight.",
);
pub const LAYOUT_SWITCHES: MetricDef = counter(
    "infertrace_vllm_layout_switches_total",
    "Times vLLM messages fitted another version's field table than the detected version's.",
);
/// Every counter here, for exporters that declare instruments up front.
pub static ALL: [&MetricDef; 4] = [&UNDECODABLE, &WITHOUT_ADD, &EVICTED, &LAYOUT_SWITCHES];

/// Totals of the vLLM tracker.
pub fn totals(r: &mut Registry, stats: &VllmStats, layout_switches: u64) {
    set_totals(
        r,
        &[
            (&UNDECODABLE, stats.undecodable),
            (&WITHOUT_ADD, stats.requests_without_add),
            (&EVICTED, stats.evicted),
            (&LAYOUT_SWITCHES, layout_switches),
        ],
    );
}
