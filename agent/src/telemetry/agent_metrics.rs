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
    "Syscalls the kernel side captured (copied, or for streamed text reported by time and size).",
);
pub const ELIDED_WRITES: MetricDef = counter(
    "infertrace_elided_writes_total",
    "Streamed text writes the kernel side reported by time and size only (not copied).",
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
pub const AFTER_LONG_ITERATION: MetricDef = counter(
    "infertrace_outputs_after_long_iteration_total",
    "Of the outputs counted at their arrival, those that reached the frontend while its event \
     loop was held in one iteration over 50 ms (a garbage collection pass, a CPU-bound \
     callback): timed at that iteration's end instead.",
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
pub const RECORDS: MetricDef = counter(
    "infertrace_records_total",
    "Kernel records read from the ring buffer.",
);
pub const BAD_RECORDS: MetricDef = counter(
    "infertrace_bad_records_total",
    "Kernel records that could not be parsed.",
);
pub const IN_FLIGHT: MetricDef = MetricDef::gauge(
    "infertrace_requests_in_flight",
    "Count",
    "Requests of an engine instance being followed now.",
);
pub const ENGINES: MetricDef = MetricDef::gauge(
    "infertrace_engines",
    "Count",
    "Servers traced now, by engine.",
);
pub const EXPORT_QUEUE: MetricDef = MetricDef::gauge(
    "infertrace_export_queue_depth",
    "Count",
    "Spans handed to the OTLP exporter and not sent yet (queued, batched or being sent).",
);
pub const EXPORTED_SPANS: MetricDef = counter(
    "infertrace_exported_spans_total",
    "Spans the OTLP collector accepted.",
);
pub const FAILED_SPANS: MetricDef = counter(
    "infertrace_export_failed_spans_total",
    "Spans whose OTLP export failed (the collector refused them or could not be reached).",
);
pub const DROPPED_SPANS: MetricDef = counter(
    "infertrace_export_dropped_spans_total",
    "Spans dropped before export because the OTLP queue was full.",
);
pub const EXPORTED_POINTS: MetricDef = counter(
    "infertrace_exported_points_total",
    "Metric points the OTLP collector accepted.",
);
pub const FAILED_POINTS: MetricDef = counter(
    "infertrace_export_failed_points_total",
    "Metric points whose OTLP export failed.",
);
pub const CPU_SECONDS: MetricDef = MetricDef::counter(
    "infertrace_cpu_seconds_total",
    "Seconds",
    "CPU time the agent used (user and system).",
);
pub const RESIDENT_MEMORY: MetricDef = MetricDef::gauge(
    "infertrace_resident_memory_bytes",
    "Bytes",
    "The agent's resident memory.",
);
pub const BUILD_INFO: MetricDef = MetricDef::gauge(
    "infertrace_build_info",
    "Count",
    "1, with the agent's version as a dimension.",
);

/// Every agent metric, for exporters that declare instruments up front.
pub static ALL: [&MetricDef; 29] = [
    &CAPTURED_SYSCALLS,
    &ELIDED_WRITES,
    &CUDA_LOOKUP_READ_FAILURES,
    &LOST_RECORDS,
    &TRUNCATED_SYSCALLS,
    &UNREADABLE_CHUNKS,
    &MAP_FULL,
    &STREAM_GAPS,
    &TAKEN_OVER,
    &NEXT_ITERATION,
    &AT_ARRIVAL,
    &AFTER_LONG_ITERATION,
    &HANDED_OVER,
    &SEND_PROBED,
    &AT_SEND,
    &TRACES,
    &RECORDS,
    &BAD_RECORDS,
    &IN_FLIGHT,
    &ENGINES,
    &EXPORT_QUEUE,
    &EXPORTED_SPANS,
    &FAILED_SPANS,
    &DROPPED_SPANS,
    &EXPORTED_POINTS,
    &FAILED_POINTS,
    &CPU_SECONDS,
    &RESIDENT_MEMORY,
    &BUILD_INFO,
];

/// What the OTLP exporter did so far (absent without OTLP export).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportTotals {
    pub queued_spans: u64,
    pub exported_spans: u64,
    pub failed_spans: u64,
    pub dropped_spans: u64,
    pub exported_points: u64,
    pub failed_points: u64,
}

/// The OTLP exporter's totals.
pub fn export(r: &mut Registry, totals: &ExportTotals) {
    set_totals(
        r,
        &[
            (&EXPORTED_SPANS, totals.exported_spans),
            (&FAILED_SPANS, totals.failed_spans),
            (&DROPPED_SPANS, totals.dropped_spans),
            (&EXPORTED_POINTS, totals.exported_points),
            (&FAILED_POINTS, totals.failed_points),
        ],
    );
    r.set(&EXPORT_QUEUE, Vec::new(), totals.queued_spans as f64);
}

/// An engine instance's requests in flight (in its scope).
pub fn in_flight(r: &mut Registry, requests: usize) {
    r.set(&IN_FLIGHT, Vec::new(), requests as f64);
}

/// The servers traced now, by engine (`vllm`, `sglang`).
pub fn engines(r: &mut Registry, by_engine: &[(&'static str, usize)]) {
    for &(engine, count) in by_engine {
        r.set(&ENGINES, vec![("engine", engine.to_owned())], count as f64);
    }
}

/// The agent's own process: records read, CPU, memory, version.
pub fn process(r: &mut Registry, records: u64, bad_records: u64) {
    set_totals(r, &[(&RECORDS, records), (&BAD_RECORDS, bad_records)]);
    // SAFETY: all-zero is a valid rusage; RUSAGE_SELF with a valid out pointer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    r.set_total(
        &CPU_SECONDS,
        Vec::new(),
        secs(usage.ru_utime) + secs(usage.ru_stime),
    );
    if let Some(resident) = resident_bytes() {
        r.set(&RESIDENT_MEMORY, Vec::new(), resident as f64);
    }
    r.set(
        &BUILD_INFO,
        vec![("version", env!("CARGO_PKG_VERSION").to_owned())],
        1.0,
    );
}

/// CPU seconds (user + system) this process used, and its peak RSS in KiB.
pub fn own_usage() -> (f64, i64) {
    // SAFETY: all-zero is a valid rusage; RUSAGE_SELF with a valid out pointer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime) + secs(usage.ru_stime), usage.ru_maxrss)
}

/// Resident memory now (/proc/self/statm's second field, in pages).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf without preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

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
            (&ELIDED_WRITES, kernel.sse_elided),
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
            (&AFTER_LONG_ITERATION, handoffs.after_long_iteration),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_says_what_it_reads_uses_and_exports() {
        let mut r = Registry::default();
        process(&mut r, 10, 1);
        engines(&mut r, &[("vllm", 2), ("sglang", 0)]);
        export(
            &mut r,
            &ExportTotals {
                queued_spans: 3,
                exported_spans: 7,
                failed_spans: 2,
                ..ExportTotals::default()
            },
        );
        assert_eq!(r.value("infertrace_records_total", &[]), Some(10.0));
        assert_eq!(r.value("infertrace_bad_records_total", &[]), Some(1.0));
        assert!(
            r.value("infertrace_cpu_seconds_total", &[])
                .is_some_and(|s| s > 0.0)
        );
        assert!(
            r.value("infertrace_resident_memory_bytes", &[])
                .is_some_and(|b| b > 1e6)
        );
        assert_eq!(
            r.value(
                "infertrace_build_info",
                &[("version", env!("CARGO_PKG_VERSION"))]
            ),
            Some(1.0)
        );
        assert_eq!(
            r.value("infertrace_engines", &[("engine", "vllm")]),
            Some(2.0)
        );
        assert_eq!(
            r.value("infertrace_engines", &[("engine", "sglang")]),
            Some(0.0)
        );
        assert_eq!(r.value("infertrace_export_queue_depth", &[]), Some(3.0));
        assert_eq!(
            r.value("infertrace_export_failed_spans_total", &[]),
            Some(2.0)
        );
    }
}
