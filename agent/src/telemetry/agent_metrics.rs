//! infertrace's own counters, exported next to the spec's metrics (`infertrace_*` names, so
//! they never collide with them): what the kernel side lost, what the decoders had to skip,
//! and how the engines' frontend instants were found. What each engine's tracker could not use
//! is counted in its folder (`engines/<engine>/losses.rs`). A dashboard that shows the spec's
//! numbers should show these too: a gap in a trace is visible here.
use super::metrics::{MetricDef, Registry};
use crate::{
    capture::KernelCounters, decode::flows::FlowStats, engines::common::handoff::HandoffStats,
};

pub const fn counter(name: &'static str, description: &'static str) -> MetricDef {
    MetricDef::counter(name, "Count", description)
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
pub static ALL: [&MetricDef; 14] = [
    &CAPTURED_SYSCALLS,
    &CUDA_LOOKUP_READ_FAILURES,
    &LOST_RECORDS,
    &TRUNCATED_SYSCALLS,
    &UNREADABLE_CHUNKS,
    &MAP_FULL,
    &STREAM_GAPS,
    &TAKEN_OVER,
    &NEXT_ITERATION,
    &AT_ARRIVAL,
    &HANDED_OVER,
    &SEND_PROBED,
    &AT_SEND,
    &TRACES,
];

/// Sets each counter, without dimensions, to its total so far.
pub fn set_totals(r: &mut Registry, totals: &[(&MetricDef, u64)]) {
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

/// How an engine instance's frontend instants were found (each instance's own totals).
pub fn handoffs(r: &mut Registry, handoffs: &HandoffStats) {
    set_totals(
        r,
        &[
            (&TAKEN_OVER, handoffs.taken_over),
            (&NEXT_ITERATION, handoffs.next_iteration),
            (&AT_ARRIVAL, handoffs.at_arrival),
            (&HANDED_OVER, handoffs.handed_over),
            (&SEND_PROBED, handoffs.send_probed),
            (&AT_SEND, handoffs.at_send),
        ],
    );
}

/// Request traces reported, over every engine instance.
pub fn traces(r: &mut Registry, traces: u64) {
    set_totals(r, &[(&TRACES, traces)]);
}
