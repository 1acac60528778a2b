//! What SGLang's tracker could not use, as `infertrace_sglang_*` counters next to the spec's
//! metrics.
use super::tracker::SglangStats;
use crate::telemetry::{
    agent_metrics::{counter, set_totals},
    metrics::{MetricDef, Registry},
};

pub const UNDECODABLE: MetricDef = counter(
    "infertrace_sglang_undecodable_messages_total",
    "SGLang messages that did not decode (unknown class, opcode or layout): their requests' \
     spans lack what they carried.",
);
pub const WITHOUT_REQUEST: MetricDef = counter(
    "infertrace_sglang_outputs_without_request_total",
    "SGLang outputs of requests never seen (sent before attach, or their request was lost): \
     not traced.",
);
pub const EVICTED: MetricDef = counter(
    "infertrace_sglang_requests_evicted_total",
    "SGLang requests dropped unreported because too many were in flight.",
);
pub const RETRACTIONS_UNPLACED: MetricDef = counter(
    "infertrace_sglang_retractions_unplaced_total",
    "SGLang retractions whose request or instant was not certain: no retract event emitted.",
);
pub const LOOP_LEFT_OUT: MetricDef = counter(
    "infertrace_sglang_loop_requests_left_out_total",
    "SGLang requests whose decode steps and batches the scheduler's loop did not show whole \
     (retracted, aborted, or a step not seen): their loop stages and schedule events left out.",
);
pub const DISPATCH_UNKNOWN: MetricDef = counter(
    "infertrace_sglang_dispatch_starts_unknown_total",
    "SGLang requests whose dispatch start was not seen (the sender's serialization not probed \
     or not certain): one span covers the stage before it and the dispatch, by `dispatcher`.",
);
/// Every counter here, for exporters that declare instruments up front.
pub static ALL: [&MetricDef; 6] = [
    &UNDECODABLE,
    &WITHOUT_REQUEST,
    &EVICTED,
    &RETRACTIONS_UNPLACED,
    &LOOP_LEFT_OUT,
    &DISPATCH_UNKNOWN,
];

/// Totals of the SGLang tracker.
pub fn totals(r: &mut Registry, stats: &SglangStats) {
    set_totals(
        r,
        &[
            (&UNDECODABLE, stats.undecodable),
            (&WITHOUT_REQUEST, stats.outputs_without_request),
            (&EVICTED, stats.evicted),
            (&RETRACTIONS_UNPLACED, stats.retractions_unplaced),
            (&LOOP_LEFT_OUT, stats.loop_requests_not_placed),
        ],
    );
    for (dispatcher, value) in [
        ("tokenizer", stats.dispatch_starts_unknown),
        ("dp_controller", stats.dpc_dispatch_starts_unknown),
    ] {
        let dims = vec![("dispatcher", dispatcher.into())];
        r.set_total(&DISPATCH_UNKNOWN, dims, value as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_losses_are_exported_as_totals_and_dispatch_starts_by_dispatcher() {
        let stats = SglangStats {
            undecodable: 1,
            outputs_without_request: 2,
            evicted: 3,
            retractions_unplaced: 4,
            loop_requests_not_placed: 5,
            dispatch_starts_unknown: 6,
            dpc_dispatch_starts_unknown: 7,
            ..SglangStats::default()
        };
        let mut r = Registry::default();
        totals(&mut r, &stats);
        // A later snapshot replaces the totals rather than adding to them.
        totals(&mut r, &stats);
        for (def, value) in [
            (&UNDECODABLE, 1.0),
            (&WITHOUT_REQUEST, 2.0),
            (&EVICTED, 3.0),
            (&RETRACTIONS_UNPLACED, 4.0),
            (&LOOP_LEFT_OUT, 5.0),
            (&DISPATCH_UNKNOWN, 13.0),
        ] {
            assert_eq!(r.total(def.name), value, "{}", def.name);
        }
        let by_dispatcher: Vec<(String, f64)> = r
            .snapshot()
            .into_iter()
            .filter(|s| s.name == DISPATCH_UNKNOWN.name)
            .map(|s| (s.dimensions["dispatcher"].clone(), s.value))
            .collect();
        assert_eq!(
            by_dispatcher,
            [("dp_controller".into(), 7.0), ("tokenizer".into(), 6.0)]
        );
    }
}
