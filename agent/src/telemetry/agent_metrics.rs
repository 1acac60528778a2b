//! infertrace's own counters, exported next to the spec's metrics (`infertrace_*` names, so
//! they never collide with them): what the kernel side lost, what the decoders had to skip,
//! and what the engine's tracker (vLLM's or SGLang's) could not use. A dashboard that shows
//! the spec's numbers should show these too: a gap in a trace is visible here.
use super::metrics::{Kind, MetricDef, Registry};
use crate::{
    capture::KernelCounters,
    decode::flows::FlowStats,
    engines::{
        common::handoff::HandoffStats, sglang::tracker::SglangStats, vllm::tracker::VllmStats,
    },
};

const fn counter(name: &'static str, description: &'static str) -> MetricDef {
    MetricDef {
        name,
        kind: Kind::Counter,
        unit: "Count",
        description,
    }
}

pub const CAPTURED_SYSCALLS: MetricDef = counter(
    "infertrace_captured_syscalls_total",
    "Syscalls whose payload the kernel side copied.",
);
pub const LOST_RECORDS: MetricDef = counter(
    "infertrace_lost_records_total",
    "Records dropped because the ring buffer was full.",
);
pub const TRUNCATED_SYSCALLS: MetricDef = counter(
    "infertrace_truncated_syscalls_total",
    "Syscalls larger than --cap-bytes (their end was not copied).",
);
pub const UNREADABLE_CHUNKS: MetricDef = counter(
    "infertrace_unreadable_chunks_total",
    "Payload chunks the kernel could not read from the process's memory.",
);
pub const MAP_FULL: MetricDef = counter(
    "infertrace_map_full_total",
    "Kernel map insertions that failed because a map was full.",
);
pub const CUDA_LOOKUP_READ_FAILURES: MetricDef = counter(
    "infertrace_cuda_lookup_read_failures_total",
    "CUDA driver lookups whose answer (handle or name) could not be read: kernels left unnamed.",
);
pub const STREAM_GAPS: MetricDef = counter(
    "infertrace_stream_gaps_total",
    "Syscalls of a byte stream that were lost or incomplete.",
);
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
pub const SGLANG_UNDECODABLE: MetricDef = counter(
    "infertrace_sglang_undecodable_messages_total",
    "SGLang messages that did not decode (unknown class, opcode or layout): their requests' \
     spans lack what they carried.",
);
pub const SGLANG_WITHOUT_REQUEST: MetricDef = counter(
    "infertrace_sglang_outputs_without_request_total",
    "SGLang outputs of requests never seen (sent before attach, or their request was lost): \
     not traced.",
);
pub const SGLANG_EVICTED: MetricDef = counter(
    "infertrace_sglang_requests_evicted_total",
    "SGLang requests dropped unreported because too many were in flight.",
);
pub const SGLANG_RETRACTIONS_UNPLACED: MetricDef = counter(
    "infertrace_sglang_retractions_unplaced_total",
    "SGLang retractions whose request or instant was not certain: no retract event emitted.",
);
pub const SGLANG_LOOP_LEFT_OUT: MetricDef = counter(
    "infertrace_sglang_loop_requests_left_out_total",
    "SGLang requests whose decode steps and batches the scheduler's loop did not show whole \
     (retracted, aborted, or a step not seen): their loop stages and schedule events left out.",
);
pub const SGLANG_DISPATCH_UNKNOWN: MetricDef = counter(
    "infertrace_sglang_dispatch_starts_unknown_total",
    "SGLang requests whose dispatch start was not seen (the sender's serialization not probed \
     or not certain): one span covers the stage before it and the dispatch, by `dispatcher`.",
);
pub const TAKEN_OVER: MetricDef = counter(
    "infertrace_outputs_taken_over_total",
    "Engine outputs timed when the frontend's event loop took them over (its mailbox read).",
);
pub const NEXT_ITERATION: MetricDef = counter(
    "infertrace_outputs_next_iteration_total",
    "Of the outputs taken over, those timed when the event loop began its next iteration after \
     the mailbox read (vLLM handles outputs one iteration after reading them).",
);
pub const AT_ARRIVAL: MetricDef = counter(
    "infertrace_outputs_at_arrival_total",
    "Engine outputs timed at their arrival in the frontend (its loop was busy, or its mailbox \
     was not known yet): their requests' first-token and end times are lower bounds.",
);
pub const HANDED_OVER: MetricDef = counter(
    "infertrace_sends_handed_over_total",
    "Messages sent timed when the application handed them to libzmq's I/O thread.",
);
pub const SEND_PROBED: MetricDef = counter(
    "infertrace_sends_probed_total",
    "Of the messages sent timed at their hand-over, those the probe on libzmq's zmq_msg_send \
     timed (the rest: the application's write to the I/O thread's mailbox).",
);
pub const AT_SEND: MetricDef = counter(
    "infertrace_sends_at_send_total",
    "Messages sent timed at the I/O thread's write (it was awake already, or its mailbox was \
     not known yet): a little later than the application's send.",
);
pub const TRACES: MetricDef = counter(
    "infertrace_traces_total",
    "Request traces reported (an API call with its engine requests).",
);

/// Every agent metric, for exporters that declare instruments up front.
pub static ALL: [&MetricDef; 24] = [
    &CAPTURED_SYSCALLS,
    &CUDA_LOOKUP_READ_FAILURES,
    &LOST_RECORDS,
    &TRUNCATED_SYSCALLS,
    &UNREADABLE_CHUNKS,
    &MAP_FULL,
    &STREAM_GAPS,
    &UNDECODABLE,
    &WITHOUT_ADD,
    &EVICTED,
    &LAYOUT_SWITCHES,
    &SGLANG_UNDECODABLE,
    &SGLANG_WITHOUT_REQUEST,
    &SGLANG_EVICTED,
    &SGLANG_RETRACTIONS_UNPLACED,
    &SGLANG_LOOP_LEFT_OUT,
    &SGLANG_DISPATCH_UNKNOWN,
    &TAKEN_OVER,
    &NEXT_ITERATION,
    &AT_ARRIVAL,
    &HANDED_OVER,
    &SEND_PROBED,
    &AT_SEND,
    &TRACES,
];

/// Sets each counter, without dimensions, to its total so far.
fn set_totals(r: &mut Registry, totals: &[(&MetricDef, u64)]) {
    for &(def, value) in totals {
        r.set_total(def, Vec::new(), value as f64);
    }
}

/// Totals of the capture stage.
pub fn capture(r: &mut Registry, kernel: &KernelCounters, flows: &FlowStats) {
    set_totals(
        r,
        &[
            (&CAPTURED_SYSCALLS, kernel.captured_syscalls),
            (&LOST_RECORDS, kernel.ring_full),
            (&TRUNCATED_SYSCALLS, kernel.truncated_syscalls),
            (&UNREADABLE_CHUNKS, kernel.read_failed),
            (&MAP_FULL, kernel.map_full),
            (&CUDA_LOOKUP_READ_FAILURES, kernel.cuda_read_failed),
            (&STREAM_GAPS, flows.gaps),
        ],
    );
}

/// Totals of the vLLM tracker.
pub fn vllm(r: &mut Registry, stats: &VllmStats, layout_switches: u64) {
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

/// Totals of the SGLang tracker.
pub fn sglang(r: &mut Registry, stats: &SglangStats) {
    set_totals(
        r,
        &[
            (&SGLANG_UNDECODABLE, stats.undecodable),
            (&SGLANG_WITHOUT_REQUEST, stats.outputs_without_request),
            (&SGLANG_EVICTED, stats.evicted),
            (&SGLANG_RETRACTIONS_UNPLACED, stats.retractions_unplaced),
            (&SGLANG_LOOP_LEFT_OUT, stats.loop_requests_not_placed),
        ],
    );
    for (dispatcher, value) in [
        ("tokenizer", stats.dispatch_starts_unknown),
        ("dp_controller", stats.dpc_dispatch_starts_unknown),
    ] {
        let dims = vec![("dispatcher", dispatcher.into())];
        r.set_total(&SGLANG_DISPATCH_UNKNOWN, dims, value as f64);
    }
}

/// Totals of the pipeline: how the frontend's instants were found, traces reported.
pub fn pipeline(r: &mut Registry, handoffs: &HandoffStats, traces: u64) {
    set_totals(
        r,
        &[
            (&TAKEN_OVER, handoffs.taken_over),
            (&NEXT_ITERATION, handoffs.next_iteration),
            (&AT_ARRIVAL, handoffs.at_arrival),
            (&HANDED_OVER, handoffs.handed_over),
            (&SEND_PROBED, handoffs.send_probed),
            (&AT_SEND, handoffs.at_send),
            (&TRACES, traces),
        ],
    );
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
        sglang(&mut r, &stats);
        // A later snapshot replaces the totals rather than adding to them.
        sglang(&mut r, &stats);
        for (def, value) in [
            (&SGLANG_UNDECODABLE, 1.0),
            (&SGLANG_WITHOUT_REQUEST, 2.0),
            (&SGLANG_EVICTED, 3.0),
            (&SGLANG_RETRACTIONS_UNPLACED, 4.0),
            (&SGLANG_LOOP_LEFT_OUT, 5.0),
            (&SGLANG_DISPATCH_UNKNOWN, 13.0),
        ] {
            assert_eq!(r.total(def.name), value, "{}", def.name);
        }
        let by_dispatcher: Vec<(String, f64)> = r
            .snapshot()
            .into_iter()
            .filter(|s| s.name == SGLANG_DISPATCH_UNKNOWN.name)
            .map(|s| (s.dimensions["dispatcher"].clone(), s.value))
            .collect();
        assert_eq!(
            by_dispatcher,
            [("dp_controller".into(), 7.0), ("tokenizer".into(), 6.0)]
        );
        assert_eq!(r.total(UNDECODABLE.name), 0.0, "no vLLM counters");
    }
}
