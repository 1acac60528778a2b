//! Compares infertrace's SGLang spans (its JSONL output) with SGLang's own tracing of the same
//! run (`--enable-trace`, collected by `otlp_receiver.py`): the request spans one for one,
//! their tokens and finish reasons, their latencies, and the stage spans under them.
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    path::Path,
};

use serde_json::Value;

use crate::vllm_truth::{Report, json_lines, last_metrics, metric_total, percentile, prom};

/// How far infertrace's instants may be from SGLang's, at p50 and p99 (p90 where fewer than
/// 100 values make the p99 their largest), in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    pub p50_s: f64,
    pub p99_s: f64,
}

impl Tolerance {
    /// The failure, if absolute differences `values` are beyond it.
    fn exceeded(&self, key: &str, values: &[f64]) -> Option<String> {
        let tail = if values.len() >= 100 { 99.0 } else { 90.0 };
        let (p50, p99) = (percentile(values, 50.0), percentile(values, tail));
        (p50 > self.p50_s || p99 > self.p99_s).then(|| {
            format!(
                "{key}: p50 {p50:.6} s / p{tail} {p99:.6} s beyond {} / {} s",
                self.p50_s, self.p99_s
            )
        })
    }
}

/// The tolerances of one live run: request-span latencies (frontend clock) and the dispatch
/// edges; the durations of the scheduler loop's stage spans (decode steps, prefill chunks),
/// which the issue asks to be close to SGLang's; and the instants of that loop (those spans'
/// edges, the first decode batch's scheduling, each decode batch's scheduling), which are the
/// syscalls around SGLang's stamps (docs/accuracy.md): a batch's output hand-over comes after
/// SGLang has stamped and traced every request of the batch, so the edges carry that walk as
/// an offset, which a step's two edges share and its duration does not, and a scheduler
/// thread held off the CPU between a stamp and its next syscall moves infertrace's.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub latencies: Tolerance,
    pub loop_durations: Tolerance,
    pub loop_edges: Tolerance,
    /// How far the wall clock moved at most during the run (the agent's summary; 0: it did
    /// not, or a replay). SGLang converts a request's stage edges with the offset it read at
    /// the request's arrival and infertrace each instant with the offset of its time, so the
    /// requests in flight at a move differ by up to the move ([`check_sglang_stamps`]).
    pub wall_clock_moved_s: f64,
}

impl Bounds {
    /// These bounds for a live run whose agent wrote `stderr` (its summary says how far the
    /// wall clock moved, if it did).
    pub fn with_clock_of(self, stderr: &str) -> Self {
        let moved_us = stderr
            .split("the wall clock moved ")
            .nth(1)
            .and_then(|rest| rest.split("by at most ").nth(1))
            .and_then(|rest| rest.split(' ').next()?.parse::<f64>().ok());
        Self {
            wall_clock_moved_s: moved_us.map_or(0.0, |us| us * 1e-6),
            ..self
        }
    }
}

/// One scheduler on this 2-core machine: the 1 ms at p50 and 5 ms at p99 for the
/// request-span latencies. The loop's stage spans, which the issue asks to be close and
/// reported: their durations within 1 ms at p50 and 10 ms at p99, their instants within 2 ms
/// and 15 ms. SGLang stamps each request of a batch in turn while it processes the batch's
/// result (its own tracing of every later request included) and infertrace sees the batch's
/// hand-over after all of it: the instants carry that walk as an offset that grows with a
/// slower or busier machine (a step's two edges share it, its duration does not), and a
/// scheduler held off the CPU in between moves the tail. Measured (docs/accuracy.md):
/// decode_loop end p50 0.22-0.25 ms, p99 2.8-3.2 ms on the development machine on a quiet
/// morning, p50 0.56-0.68 ms, p99 4.8-6.0 ms (mean signed +1.0 ms) in CI runs and on the same
/// machine later the same day; the steps' durations p50 0.10-0.11 ms, p99 4.7-6.0 ms. The
/// steps are compared with SGLang's last stamp of their batch ([`compare_decode_steps`]): with
/// the test's rounds and crowds (2026-12-07, both encodings) end p50 0.35-0.43 ms, p99 4.1-4.4
/// ms, durations p50 0.05-0.06 ms, p99 4.0-4.6 ms (each request's own stamp: end p50 0.58-0.72
/// ms, p99 4.7-5.1 ms).
pub const ONE_SCHEDULER: Bounds = Bounds {
    latencies: Tolerance {
        p50_s: 1e-3,
        p99_s: 5e-3,
    },
    loop_durations: Tolerance {
        p50_s: 1e-3,
        p99_s: 10e-3,
    },
    loop_edges: Tolerance {
        p50_s: 2e-3,
        p99_s: 15e-3,
    },
    wall_clock_moved_s: 0.0,
};
/// Two schedulers behind a DP controller on the same 2 cores: each scheduler has a core for
/// its model, and main, the detokenizer, the agent and the controller (which polls its socket
/// without pause: a core's worth of CPU whenever it gets one) take turns with them, so every
/// process is held off the CPU between a stamp and its next syscall far more often. Measured
/// in three runs (docs/accuracy.md): time to first token p99 3.3-6.9 ms, decode 3.6-6.4 ms
/// (p50 at most 0.5 ms, as with one scheduler). With the rounds and crowds of the test's
/// workload (484 requests, four runs on 2026-12-06/07), a decode step's end against SGLang's last
/// stamp of the batch: p50 0.52-1.04 ms, p99 11.0-12.8 ms; the steps' durations p50 0.75-1.34
/// ms, p99 10.5-12.1 ms (against each request's own stamp, SGLang's walk over the batch
/// included: end p50 1.18-2.19 ms, which one CI run found beyond 2 ms).
pub const DATA_PARALLEL_ON_2_CORES: Bounds = Bounds {
    latencies: Tolerance {
        p50_s: 1e-3,
        p99_s: 10e-3,
    },
    loop_durations: Tolerance {
        p50_s: 2e-3,
        p99_s: 25e-3,
    },
    loop_edges: Tolerance {
        p50_s: 2e-3,
        p99_s: 25e-3,
    },
    wall_clock_moved_s: 0.0,
};
/// A PD decode server (SGLang's fake transfer backend) with two clients, one streaming: the
/// loop's bounds as with one scheduler; the request latencies p50 1 ms, p99 10 ms. Measured in
/// five runs on 2026-12-04 (60-120 requests): latency p50 at most 0.33 ms, p99 (nearest rank)
/// 2.8-6.5 ms, the furthest requests not streamed, infertrace's end earlier than SGLang's:
/// main took the final output over (its mailbox read, infertrace's instant) and was held off
/// the CPU before its output handler stamped it. The loop's instants sit later than on a
/// server without disaggregation: a decode server's scheduler takes longer from its last
/// stamp of a batch to the batch's output hand-over (p50 0.40 ms on a quiet machine, 0.98 ms
/// in a CI run on a busier one), so decode_loop edges differ by p50 0.42-0.67 ms and 0.92-1.18
/// ms there (mean signed +1.2 ms; schedule events p99 7.5 ms, largest 16.6 ms), while the
/// steps' durations stay within p50 0.14 ms, p99 5.2 ms (docs/accuracy.md).
pub const PD_DECODE_ON_2_CORES: Bounds = Bounds {
    latencies: Tolerance {
        p50_s: 1e-3,
        p99_s: 10e-3,
    },
    ..ONE_SCHEDULER
};
/// SGLang's own "dispatched" stamp is taken after `sock_send` returns, so a main thread held
/// off the CPU (or the GIL) after sending stamps it late: when that stamp comes after the
/// scheduler process already had the request (SGLang's own `request_process` start, or the
/// kernel's timestamp of the scheduler's receive, which infertrace's scheduler thread span
/// starts at), SGLang's latencies that start there (prefill, inference) are off by at least
/// that lag, and the p99 check allows it on top (reported per request when over this).
pub const LATE_DISPATCH_S: f64 = 1e-3;
/// The latencies that start at the dispatch instant.
const FROM_DISPATCH: [&str; 2] = [
    "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_inference",
];
/// SGLang stamps a request finished in main's loop as it walks the requests of one output
/// message, after its work for the requests before it (building their outputs, ending their
/// spans; on 2 busy cores also the GIL or the CPU given to another thread meanwhile: one CI
/// run had 4.5 ms between two requests of one message). infertrace's instant is the loop's
/// take-over of the whole message (the iteration in which the task handles it), so SGLang's
/// stamp of a request after its stamp of the message's first one lags by that work, which no
/// syscall marks: the p99 check allows it on top for the latencies that end there (reported
/// per request when over this). The message's requests are those infertrace ended at the same
/// instant; the first one's own difference is checked in full, and once: main held off the CPU
/// after its take-over (one CI run: 11.4 ms) delays every stamp of the message, and counted
/// for each of its requests, one such moment was the p99 of a whole run.
pub const LATE_IN_MESSAGE_S: f64 = 1e-3;
/// The latencies that end when main's loop handles the request's final output.
const TO_FINISH: [&str; 3] = [
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.latency.time_in_model_inference",
];
/// Stage edges SGLang times itself and sends on the wire (`--enable-metrics`): the same
/// CLOCK_MONOTONIC value on both sides, turned into wall time with different offsets (SGLang's
/// `time.time() - perf_counter()`, recalibrated per request and quantized to 256 ns by float
/// arithmetic; infertrace's, measured at attach), which differ by a few microseconds.
pub const SCHEDULER_EDGE_S: f64 = 20e-6;
/// SGLang recalibrates that offset at every request's arrival in the scheduler by reading
/// `time.time()` and `time.perf_counter()` one after the other, nothing bracketing the pair,
/// and converts each stamp with the offset of the moment it traces it (`req_time_stats.py`:
/// a `prefill_waiting` span with the start of `prefill_forward` when the forward pass
/// begins, the end of `prefill_forward` when it finished). A scheduler held off the CPU
/// between the two reads shifts every stamp converted until the next request recalibrates:
/// seen in live runs as one request's four edges all 0.115 ms off, as the end of
/// `prefill_forward` 48 µs off for one request and its other edges exact, and as those ends
/// of the 8 requests of one prefill batch 67 µs off. So the edges converted together must
/// agree with each other exactly, and the groups shifted as a whole must share their shift
/// with the others of the same calibration: at most one such calibration per hundred
/// requests (two at least: [`miscalibrations_allowed`]), each within this, and each the way a
/// pause between the two reads shifts them (SGLang's stamps earlier than infertrace's instants).
pub const SGLANG_CALIBRATION_S: f64 = 1e-3;

/// How many of SGLang's miscalibrated offsets a run of `requests` may show: one per hundred,
/// two at least. A CI run on 2026-12-07 had two in the PD decode server's 120 requests (20.7
/// and 63.5 µs, both the way a pause between the reads makes them); the five data-parallel
/// runs kept from those days, none in 464.
fn miscalibrations_allowed(requests: usize) -> usize {
    (requests / 100).max(2)
}

/// Checks the edges SGLang stamps itself and infertrace takes from the wire (signed
/// differences; `what` names them), in `groups`: per request id, the edges SGLang converted to
/// wall time at once, with one offset. See SCHEDULER_EDGE_S and SGLANG_CALIBRATION_S. Returns
/// the number of edges compared.
fn check_sglang_stamps(
    r: &mut Report,
    what: &str,
    groups: &[(&str, Vec<f64>)],
    wall_clock_moved_s: f64,
) -> usize {
    // Groups without such edges (a stage left out) count for nothing.
    let groups: Vec<&(&str, Vec<f64>)> = groups.iter().filter(|(_, d)| !d.is_empty()).collect();
    let mut shifted = Vec::new();
    for (id, diffs) in &groups {
        let Some(first) = diffs.first() else { continue };
        let (low, high) = diffs
            .iter()
            .fold((*first, *first), |(l, h), v| (l.min(*v), h.max(*v)));
        // A request in flight when the wall clock moved: edges on both sides of the move.
        if high - low > SCHEDULER_EDGE_S + wall_clock_moved_s {
            r.fail(format!(
                "{id}: {what} converted together differ from SGLang's by {:.9} s",
                high - low
            ));
        }
        let shift = (low + high) / 2.0;
        // SGLang reads time.time() before time.perf_counter(): a pause between them makes its
        // offset smaller and its converted stamps earlier than the instants, never later.
        if shift < -(SCHEDULER_EDGE_S + wall_clock_moved_s) {
            r.fail(format!(
                "{id}: {what} {:.9} s later than infertrace's, which SGLang's calibration \
                 cannot make them",
                -shift
            ));
        }
        if shift.abs() > SCHEDULER_EDGE_S {
            shifted.push((*id, shift));
        }
    }
    let edges: Vec<f64> = groups.iter().flat_map(|(_, d)| d.clone()).collect();
    let requests: std::collections::BTreeSet<&str> = groups.iter().map(|(id, _)| *id).collect();
    let _ = writeln!(
        r.text,
        "{what} ({} values, {} requests): |infertrace - SGLang| p50 {:.4} ms, max {:.4} ms; \
         edges shifted as a whole (SGLang's offset calibration): {shifted:?}",
        edges.len(),
        requests.len(),
        percentile(&edges, 50.0) * 1e3,
        percentile(&edges, 100.0) * 1e3,
    );
    // Requests whose edges SGLang converted with the offset from before a move.
    let moved: Vec<&(&str, f64)> = shifted
        .iter()
        .filter(|(_, shift)| shift.abs() <= SCHEDULER_EDGE_S + wall_clock_moved_s)
        .filter(|_| wall_clock_moved_s > 0.0)
        .collect();
    if !moved.is_empty() {
        let _ = writeln!(
            r.text,
            "{what}: {} shifted within the wall clock's move of {:.1} µs: {moved:?}",
            moved.len(),
            wall_clock_moved_s * 1e6
        );
    }
    shifted.retain(|(_, shift)| {
        wall_clock_moved_s == 0.0 || shift.abs() > SCHEDULER_EDGE_S + wall_clock_moved_s
    });
    let calibrations = distinct_shifts(shifted.iter().map(|(_, shift)| *shift));
    let allowed = miscalibrations_allowed(requests.len());
    if calibrations > allowed
        || shifted
            .iter()
            .any(|(_, shift)| shift.abs() > SGLANG_CALIBRATION_S)
    {
        r.fail(format!(
            "{what}: shifted beyond {SCHEDULER_EDGE_S} s by {calibrations} different offsets \
             (at most {allowed}, each within {SGLANG_CALIBRATION_S} s): {shifted:?}"
        ));
    }
    edges.len()
}

/// Checks instants infertrace takes before SGLang's stamps (`differences`: infertrace's less
/// SGLang's): none later than SGLang's beyond SCHEDULER_EDGE_S (and a move of the wall clock),
/// but where SGLang converted its stamp with one of its miscalibrated offsets: at most
/// [`miscalibrations_allowed`], each within SGLANG_CALIBRATION_S.
fn check_never_after(r: &mut Report, key: &str, differences: &[f64], wall_clock_moved_s: f64) {
    let late: Vec<f64> = differences
        .iter()
        .copied()
        .filter(|&d| d > SCHEDULER_EDGE_S + wall_clock_moved_s)
        .collect();
    let allowed = miscalibrations_allowed(differences.len());
    if late.len() > allowed || late.iter().any(|&d| d > SGLANG_CALIBRATION_S) {
        r.fail(format!(
            "{key}: {} after SGLang's by over {SCHEDULER_EDGE_S} s (at most {allowed}, each \
             within {SGLANG_CALIBRATION_S} s): {late:?}",
            late.len()
        ));
    }
}

/// How many different shifts `shifts` holds: values within SCHEDULER_EDGE_S of the next
/// are one (the groups converted with one of SGLang's calibrations).
fn distinct_shifts(shifts: impl Iterator<Item = f64>) -> usize {
    let mut sorted: Vec<f64> = shifts.collect();
    sorted.sort_by(f64::total_cmp);
    let breaks = sorted
        .windows(2)
        .filter(|pair| pair[1] - pair[0] > SCHEDULER_EDGE_S)
        .count();
    if sorted.is_empty() { 0 } else { breaks + 1 }
}

/// The start of `api_server_dispatch` (the end of `tokenize`) must agree to the latencies'
/// bounds at p50 and p99 (p90 for fewer than 100 values): infertrace's instant is main's entry
/// into `pickle.dumps`, a few tens of microseconds of Python after SGLang's stamp, more when
/// main's thread was held off the CPU in between (docs/accuracy.md).
/// The same for `dpc_dispatch` (data parallelism), which starts at the DP controller's entry
/// into `pickle.dumps` for the request.
const DISPATCH_EDGES: [&str; 4] = [
    "api_server_dispatch start",
    "tokenize end",
    "dpc_dispatch start",
    "DP Controller end",
];
/// SGLang's label of its DP controller's thread span.
const DP_CONTROLLER: &str = "DP Controller";

const LATENCIES: [&str; 5] = [
    "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.latency.time_in_model_inference",
];

/// One span, from either side: OTLP JSON (SGLang's) or infertrace's JSONL.
struct SpanView<'a> {
    name: &'a str,
    id: &'a str,
    parent: &'a str,
    start: u64,
    end: u64,
    attributes: &'a Value,
    /// Span ids of the spans it links to (same trace).
    links: Vec<&'a str>,
}

fn number(v: &Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str()?.parse().ok())
}

fn ours_view(v: &Value) -> Option<SpanView<'_>> {
    (v["type"] == "span").then(|| SpanView {
        name: v["name"].as_str().unwrap_or_default(),
        id: v["span_id"].as_str().unwrap_or_default(),
        parent: v["parent_span_id"].as_str().unwrap_or_default(),
        start: v["start_time_unix_nano"].as_u64().unwrap_or(0),
        end: v["end_time_unix_nano"].as_u64().unwrap_or(0),
        attributes: &v["attributes"],
        links: v["links"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default(),
    })
}

fn their_view(v: &Value) -> SpanView<'_> {
    let ns = |k: &str| v[k].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
    SpanView {
        name: v["name"].as_str().unwrap_or_default(),
        id: v["spanId"].as_str().unwrap_or_default(),
        parent: v["parentSpanId"].as_str().unwrap_or_default(),
        start: ns("startTimeUnixNano"),
        end: ns("endTimeUnixNano"),
        attributes: &v["attributes"],
        links: v["links"]
            .as_array()
            .map(|a| a.iter().filter_map(|l| l["spanId"].as_str()).collect())
            .unwrap_or_default(),
    }
}

/// Names of the spans `span` links to, on its own side.
fn linked_names<'a>(all: &'a [SpanView<'a>], span: &SpanView) -> Vec<&'a str> {
    span.links
        .iter()
        .filter_map(|id| all.iter().find(|s| s.id == *id).map(|s| s.name))
        .collect()
}

/// A request span: `{role} Req {rid[:8]}`, role empty or a PD role.
fn is_request(s: &SpanView) -> bool {
    s.name
        .split_once(" Req ")
        .is_some_and(|(role, _)| matches!(role, "" | "prefill" | "decode"))
}

fn rid<'a>(s: &SpanView<'a>) -> &'a str {
    s.attributes["gen_ai.request.id"]
        .as_str()
        .unwrap_or_default()
}

/// How long after the scheduler process had the request SGLang's main process stamped it
/// dispatched (`api_server_dispatch` end): positive only when that stamp lagged the send it
/// follows. The scheduler had it at the earlier of SGLang's own `request_process` start and
/// the scheduler's receive syscall (`ours_scheduler_start`: infertrace's scheduler thread span
/// starts at the kernel's timestamp of it).
fn dispatch_lag(their_stages: &[&SpanView], ours_scheduler_start: Option<u64>) -> Option<f64> {
    let edge = |name: &str| their_stages.iter().find(|s| s.name == name);
    let dispatched = edge("api_server_dispatch")?.end;
    let received = [
        edge("request_process").map(|s| s.start),
        ours_scheduler_start,
    ]
    .into_iter()
    .flatten()
    .min()?;
    Some((dispatched as f64 - received as f64) / 1e9)
}

/// When SGLang's dispatch stamp falls between infertrace's dispatched instant (main's hand-over
/// to libzmq: its Tokenizer thread span's end) and the scheduler process's receipt of the bytes
/// (its scheduler thread span's start, a kernel timestamp), how far after the hand-over: both
/// instants lie in the one interval during which the request was on its way, neither side's
/// error. On two busy cores that interval was seen to last over 10 ms (main's I/O thread kept
/// off the CPU), with SGLang's stamp 5-6 ms into it.
fn stamp_within_dispatch(
    their_stages: &[&SpanView],
    ours_dispatched: Option<u64>,
    ours_scheduler_start: Option<u64>,
) -> f64 {
    let stamp = their_stages
        .iter()
        .find(|s| s.name == "api_server_dispatch")
        .map(|s| s.end);
    match (ours_dispatched, stamp, ours_scheduler_start) {
        (Some(from), Some(stamp), Some(to)) if from <= stamp && stamp <= to => {
            (stamp - from) as f64 / 1e9
        }
        _ => 0.0,
    }
}

/// A request's finish stamp in its output message (LATE_IN_MESSAGE_S).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct FinishLag {
    /// How long after its stamp of the message's first request SGLang stamped this one.
    after_first: f64,
    /// What the p99 check allows on top for the latencies that end there: for the message's
    /// first request nothing (its difference is the check of infertrace's instant of the
    /// take-over); for the others SGLang's stamp's whole lag after that instant, which the first
    /// one's check has already counted, so that one late message counts once, not once per
    /// request in it.
    allowed: f64,
}

/// For each request, its finish stamp's lag in its output message: `ours` and `theirs` are the
/// request spans, whose ends are the finish instants; a message's requests are those infertrace
/// ended at one instant.
fn finish_lags_in_message<'a>(
    ours: &[&SpanView<'a>],
    theirs: &[&SpanView],
) -> BTreeMap<&'a str, FinishLag> {
    let their_end = |id: &str| theirs.iter().find(|t| rid(t) == id).map(|t| t.end);
    let mut messages: BTreeMap<u64, Vec<(&str, u64)>> = BTreeMap::new();
    for request in ours {
        if let Some(end) = their_end(rid(request)) {
            messages
                .entry(request.end)
                .or_default()
                .push((rid(request), end));
        }
    }
    let mut lags = BTreeMap::new();
    for (&take_over, requests) in &messages {
        let Some(&(first_id, first)) = requests.iter().min_by_key(|&&(_, end)| end) else {
            continue;
        };
        for &(id, end) in requests {
            let allowed = if id == first_id {
                0.0
            } else {
                end.saturating_sub(take_over) as f64 / 1e9
            };
            let after_first = (end - first) as f64 / 1e9;
            lags.insert(
                id,
                FinishLag {
                    after_first,
                    allowed,
                },
            );
        }
    }
    lags
}

/// The thread span labelled `label` under request span `parent`, whatever its PD role prefix
/// (`Decode Scheduler`, `DecodeTokenizer`).
fn thread_span<'a>(all: &'a [SpanView<'a>], parent: &str, label: &str) -> Option<&'a SpanView<'a>> {
    all.iter().find(|s| {
        s.parent == parent
            && s.name
                .split_once("(host:")
                .is_some_and(|(name, _)| name.contains(label))
    })
}

/// Stage spans of a request: the children of its thread spans.
fn stages<'a>(all: &'a [SpanView<'a>], request: &SpanView) -> Vec<&'a SpanView<'a>> {
    let threads: Vec<&str> = all
        .iter()
        .filter(|s| s.parent == request.id && s.name.contains("(host:"))
        .map(|s| s.id)
        .collect();
    all.iter().filter(|s| threads.contains(&s.parent)).collect()
}

/// A whole run against SGLang's own tracing and `/metrics`: the request and stage spans
/// ([`compare`]), the loop's stages ([`compare_loop_stages`]) and the request counters
/// ([`compare_metrics`]).
pub fn compare_run(
    ours: &Path,
    theirs: &Path,
    bounds: Bounds,
    metrics_before: &str,
    metrics_after: &str,
) -> Report {
    let mut report = compare(ours, theirs, bounds);
    report.add(compare_loop_stages(ours, theirs, bounds));
    report.add(compare_metrics(ours, metrics_before, metrics_after));
    report
}

/// Compare infertrace's JSONL (`ours`) with SGLang's OTLP spans (`theirs`).
pub fn compare(ours: &Path, theirs: &Path, bounds: Bounds) -> Report {
    let ours_json = json_lines(ours);
    let theirs_json = json_lines(theirs);
    let ours: Vec<SpanView> = ours_json.iter().filter_map(ours_view).collect();
    let theirs: Vec<SpanView> = theirs_json.iter().map(their_view).collect();
    let mut r = Report::default();
    // SGLang's request spans of engine requests: not its health checks (infertrace leaves them
    // out) nor the n>1 parents (they never reach the scheduler; no usage).
    let truth: Vec<&SpanView> = theirs
        .iter()
        .filter(|s| is_request(s) && !rid(s).starts_with("HEALTH_CHECK_"))
        .filter(|s| !s.attributes["gen_ai.usage.prompt_tokens"].is_null())
        .collect();
    let requests: Vec<&SpanView> = ours.iter().filter(|s| is_request(s)).collect();
    let _ = writeln!(
        r.text,
        "SGLang: {} request spans of engine requests; infertrace: {} request spans, {} spans in all",
        truth.len(),
        requests.len(),
        ours.len()
    );
    for ours_req in &requests {
        if !truth.iter().any(|t| rid(t) == rid(ours_req)) {
            r.fail(format!("infertrace invented request {}", rid(ours_req)));
        }
    }
    let mut diffs: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    // The request furthest from SGLang's, per latency: where to look first.
    let mut worst: BTreeMap<&str, (f64, &str)> = BTreeMap::new();
    // The differences the p99 check reads, less SGLang's own dispatch lag (LATE_DISPATCH_S).
    let mut checked: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    // The request furthest from SGLang's after that allowance, per latency.
    let mut worst_checked: BTreeMap<&str, (f64, &str)> = BTreeMap::new();
    let mut late_dispatches: Vec<String> = Vec::new();
    let mut inside_dispatch: Vec<String> = Vec::new();
    let finish_lags = finish_lags_in_message(&requests, &truth);
    let mut late_in_message: Vec<String> = Vec::new();
    let mut staged = 0;
    let mut links_compared = 0;
    // SGLang's own stamps, per request and conversion (check_sglang_stamps).
    let mut stamped: Vec<(&str, Vec<f64>)> = Vec::new();
    for theirs_req in &truth {
        let id = rid(theirs_req);
        let Some(ours_req) = requests.iter().find(|s| rid(s) == id) else {
            r.fail(format!("no request span for {id}"));
            continue;
        };
        if ours_req.name != theirs_req.name {
            r.fail(format!(
                "{id}: name {:?}, SGLang {:?}",
                ours_req.name, theirs_req.name
            ));
        }
        for key in [
            "gen_ai.usage.prompt_tokens",
            "gen_ai.usage.completion_tokens",
            "gen_ai.usage.cached_tokens",
            "gen_ai.response.finish_reasons",
        ] {
            let (a, b) = (&ours_req.attributes[key], &theirs_req.attributes[key]);
            let same = match (number(a), number(b)) {
                (Some(x), Some(y)) => x == y,
                _ => a == b,
            };
            if !same {
                r.fail(format!("{id}: {key} infertrace {a}, SGLang {b}"));
            }
        }
        let their_stages = stages(&theirs, theirs_req);
        let ours_thread = |label: &str| thread_span(&ours, ours_req.id, label);
        let ours_scheduler_start = ours_thread("Scheduler").map(|s| s.start);
        let late = dispatch_lag(&their_stages, ours_scheduler_start)
            .unwrap_or(0.0)
            .max(0.0);
        if late > LATE_DISPATCH_S {
            late_dispatches.push(format!("{id} ({:.2} ms)", late * 1e3));
        }
        let within = stamp_within_dispatch(
            &their_stages,
            ours_thread("Tokenizer").map(|s| s.end),
            ours_scheduler_start,
        );
        if within > LATE_DISPATCH_S {
            inside_dispatch.push(format!("{id} ({:.2} ms)", within * 1e3));
        }
        let lag = late.max(within);
        let finish_lag = finish_lags.get(id).copied().unwrap_or_default();
        if finish_lag.after_first > LATE_IN_MESSAGE_S {
            late_in_message.push(format!("{id} ({:.2} ms)", finish_lag.after_first * 1e3));
        }
        for key in LATENCIES {
            if let (Some(a), Some(b)) = (
                number(&ours_req.attributes[key]),
                number(&theirs_req.attributes[key]),
            ) {
                diffs.entry(key).or_default().push(a - b);
                let allowed = if FROM_DISPATCH.contains(&key) {
                    lag
                } else {
                    0.0
                } + if TO_FINISH.contains(&key) {
                    finish_lag.allowed
                } else {
                    0.0
                };
                let beyond_allowance = ((a - b).abs() - allowed).max(0.0);
                checked.entry(key).or_default().push(beyond_allowance);
                let worst_allowed = worst_checked.entry(key).or_insert((0.0, id));
                if beyond_allowance > worst_allowed.0 {
                    *worst_allowed = (beyond_allowance, id);
                }
                let worst = worst.entry(key).or_insert((0.0, id));
                if (a - b).abs() > worst.0 {
                    *worst = ((a - b).abs(), id);
                }
            }
        }
        // n>1: SGLang files the warm-up's scheduler stages under the parent request.
        let has_scheduler = theirs
            .iter()
            .any(|s| s.parent == theirs_req.id && s.name.contains("Scheduler"));
        if !has_scheduler {
            continue;
        }
        // Thread spans: the same labels and ranks (host and pid differ from run to run).
        let threads = |all: &[SpanView], parent: &str| -> Vec<String> {
            let mut names: Vec<String> = all
                .iter()
                .filter(|s| s.parent == parent && s.name.contains("(host:"))
                .map(|s| s.name.split("(host:").next().unwrap_or_default().to_owned())
                .collect();
            names.sort();
            names
        };
        let (ours_threads, theirs_threads) =
            (threads(&ours, ours_req.id), threads(&theirs, theirs_req.id));
        if ours_threads != theirs_threads {
            r.fail(format!(
                "{id}: threads {ours_threads:?}, SGLang {theirs_threads:?}"
            ));
        }
        staged += 1;
        // The DP controller's thread: it ends at its hand-over to a scheduler's socket, as
        // SGLang's (bounded with the dispatch edges); it starts when it took the request
        // over, before SGLang's, which starts after unpickling it (reported).
        if let (Some(a), Some(b)) = (
            thread_span(&ours, ours_req.id, DP_CONTROLLER),
            thread_span(&theirs, theirs_req.id, DP_CONTROLLER),
        ) {
            diffs
                .entry("DP Controller start")
                .or_default()
                .push(seconds_between(a.start, b.start));
            diffs
                .entry("DP Controller end")
                .or_default()
                .push(seconds_between(a.end, b.end));
        }
        // SGLang converts the edges of prefill_waiting with the start of prefill_forward when
        // the forward pass begins, and the end of prefill_forward when it finished.
        let (mut at_forward_entry, mut at_prefill_finish) = (Vec::new(), Vec::new());
        for stage in stages(&ours, ours_req) {
            if stage.name == "decode_loop" {
                continue;
            }
            let Some(theirs_stage) = their_stages.iter().find(|t| t.name == stage.name) else {
                r.fail(format!("{id}: SGLang has no {}", stage.name));
                continue;
            };
            // Links: the same previous stage. Without main's serialization (a recording made
            // before its probe) infertrace's tokenize stands for SGLang's tokenize +
            // api_server_dispatch; without the loop, its decode_forward for SGLang's
            // decode_waiting + decode_forward; without the DP controller's serialization
            // (its first requests, see compare_loop_stages) request_process links to main's
            // last stage; on a PD decode server, whose stages before the queue are not
            // produced (compare_pd_decode), decode_waiting links to the last stage before.
            let (ours_links, theirs_links) = (
                linked_names(&ours, stage),
                linked_names(&theirs, theirs_stage),
            );
            let same = ours_links.len() == theirs_links.len()
                && ours_links.iter().zip(&theirs_links).all(|(a, b)| {
                    a == b
                        || (*a == "tokenize" && *b == "api_server_dispatch")
                        || (*a == "prefill_forward" && *b == "decode_waiting")
                        || (matches!(*a, "tokenize" | "api_server_dispatch")
                            && *b == "dpc_dispatch")
                        || (matches!(*a, "tokenize" | "api_server_dispatch" | "dpc_dispatch")
                            && *b == "decode_transferred")
                });
            if same {
                links_compared += ours_links.len();
            } else {
                r.fail(format!(
                    "{id}: {} links to {ours_links:?}, SGLang's to {theirs_links:?}",
                    stage.name
                ));
            }
            let (start, end) = (
                seconds_between(stage.start, theirs_stage.start),
                seconds_between(stage.end, theirs_stage.end),
            );
            let includes_dispatch = stage.attributes["infertrace.includes_dispatch"] == true;
            match stage.name {
                "tokenize" if includes_dispatch => diffs
                    .entry("tokenize (+dispatch) end")
                    .or_default()
                    .push(end),
                "tokenize" => diffs.entry("tokenize end").or_default().push(end),
                "api_server_dispatch" => diffs
                    .entry("api_server_dispatch start")
                    .or_default()
                    .push(start),
                "dpc_dispatch" => diffs.entry("dpc_dispatch start").or_default().push(start),
                "request_process" => diffs
                    .entry("request_process start")
                    .or_default()
                    .push(start),
                "decode_forward" => diffs.entry("decode_forward end").or_default().push(end),
                "prefill_waiting" => at_forward_entry.extend([start, end]),
                "prefill_forward" => {
                    at_forward_entry.push(start);
                    at_prefill_finish.push(end);
                }
                _ => {}
            }
        }
        stamped.push((id, at_forward_entry));
        stamped.push((id, at_prefill_finish));
    }
    let _ = writeln!(
        r.text,
        "stage spans compared for {staged} requests, {links_compared} stage links equal"
    );
    for (key, values) in &diffs {
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let _ = writeln!(
            r.text,
            "{key} ({} values): |infertrace - SGLang| p50 {:.4} ms, p99 {:.4} ms, max {:.4} ms (mean signed {:+.4} ms){}",
            values.len(),
            percentile(values, 50.0) * 1e3,
            percentile(values, 99.0) * 1e3,
            percentile(values, 100.0) * 1e3,
            mean * 1e3,
            worst
                .get(key)
                .map(|(_, rid)| format!(", furthest: {rid}"))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        r.text,
        "SGLang's dispatch stamp after the scheduler's receipt by over {} ms (that lag is allowed on top in the prefill and inference p99 check): {late_dispatches:?}",
        LATE_DISPATCH_S * 1e3
    );
    let _ = writeln!(
        r.text,
        "SGLang's dispatch stamp over {} ms into the interval between infertrace's hand-over and the scheduler's receipt (allowed likewise): {inside_dispatch:?}",
        LATE_DISPATCH_S * 1e3
    );
    let _ = writeln!(
        r.text,
        "SGLang's finish stamp after its stamp of the first request of the same output by over {} ms (allowed on top in the e2e, decode and inference p99 check): {late_in_message:?}",
        LATE_IN_MESSAGE_S * 1e3
    );
    for (key, (beyond, id)) in &worst_checked {
        let _ = writeln!(
            r.text,
            "{key}: furthest after the allowance {:.4} ms ({id})",
            beyond * 1e3
        );
    }
    for key in LATENCIES {
        let p50 = diffs.get(key).map_or(0.0, |v| percentile(v, 50.0));
        let limits = bounds.latencies;
        if p50 > limits.p50_s {
            r.fail(format!("{key}: p50 {p50:.6} s beyond {} s", limits.p50_s));
        }
        let p99 = checked.get(key).map_or(0.0, |v| percentile(v, 99.0));
        if p99 > limits.p99_s {
            r.fail(format!("{key}: p99 {p99:.6} s beyond {} s", limits.p99_s));
        }
    }
    for key in DISPATCH_EDGES {
        // As for the loop's edges: the p99 of fewer than 100 values is their largest.
        if let Some(failure) = diffs
            .get(key)
            .and_then(|values| bounds.latencies.exceeded(key, values))
        {
            r.fail(failure);
        }
    }
    check_sglang_stamps(
        &mut r,
        "prefill_waiting and prefill_forward edges",
        &stamped,
        bounds.wall_clock_moved_s,
    );
    if staged * 5 < truth.len() * 4 {
        r.fail(format!(
            "stages compared for only {staged} of {} requests",
            truth.len()
        ));
    }
    r
}

/// Compare infertrace's SGLang counters (its last metrics snapshot) with SGLang's `/metrics`
/// over the same run: counts exactly, latency sums to within 5 ms per request.
pub fn compare_metrics(ours: &Path, metrics_before: &str, metrics_after: &str) -> Report {
    let ours = json_lines(ours);
    let metrics = last_metrics(&ours);
    let delta = |name: &str| prom(metrics_after, name, &[]) - prom(metrics_before, name, &[]);
    let mut r = Report::default();
    let requests = delta("sglang:num_requests_total");
    for (ours_name, theirs_name, per_request) in [
        ("num_requests_total", "sglang:num_requests_total", 0.0),
        ("prompt_tokens_total", "sglang:prompt_tokens_total", 0.0),
        (
            "generation_tokens_total",
            "sglang:generation_tokens_total",
            0.0,
        ),
        (
            "gen_ai_sglang_cached_tokens_total",
            "sglang:cached_tokens_total",
            0.0,
        ),
        (
            "gen_ai_server_time_to_first_token",
            "sglang:time_to_first_token_seconds_sum",
            5e-3,
        ),
        (
            "gen_ai_server_request_duration",
            "sglang:e2e_request_latency_seconds_sum",
            5e-3,
        ),
        (
            "gen_ai_server_time_per_output_token",
            "sglang:request_time_per_output_token_seconds_sum",
            5e-3,
        ),
        (
            "sglang_inter_token_latency_seconds",
            "sglang:inter_token_latency_seconds_sum",
            5e-3,
        ),
    ] {
        let (a, b) = (metric_total(metrics, ours_name, None), delta(theirs_name));
        let _ = writeln!(
            r.text,
            "{ours_name}: infertrace {a:.4}, SGLang {theirs_name} {b:.4}"
        );
        if (a - b).abs() > per_request * requests + 1e-9 {
            r.fail(format!(
                "{ours_name}: infertrace {a}, SGLang {theirs_name} {b}"
            ));
        }
    }
    r
}

/// The number after `name` in a log line (`#running-req: 3,` -> 3), read independently of the
/// agent's parser.
fn logged_number(line: &str, name: &str) -> Option<f64> {
    let start = line.find(name)? + name.len();
    let digits: String = line[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse().ok()
}

/// Compare infertrace's SGLang snapshot counters with the statistics reports the scheduler
/// wrote to its log during the same run (`log`: the bytes of SGLang's log file written while
/// the agent was attached): as many reports, and the same sum of each reported value.
pub fn compare_scheduler_reports(ours: &Path, log: &str) -> Report {
    let ours = json_lines(ours);
    let metrics = last_metrics(&ours);
    let reports: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("] Decode batch, "))
        .collect();
    let mut r = Report::default();
    if reports.len() < 5 {
        r.fail(format!(
            "SGLang wrote {} decode statistics reports: too few to compare",
            reports.len()
        ));
    }
    let ours_count = metric_total(metrics, "sglang_log_count", None);
    let _ = writeln!(
        r.text,
        "sglang_log_count: infertrace {ours_count}, SGLang's log {} reports",
        reports.len()
    );
    if ours_count != reports.len() as f64 {
        r.fail(format!(
            "sglang_log_count {ours_count}, SGLang logged {} reports",
            reports.len()
        ));
    }
    for (ours_name, logged) in [
        ("sglang_num_running_reqs", "#running-req: "),
        ("sglang_num_queue_reqs", "#queue-req: "),
        ("sglang_num_used_tokens", "#token: "),
        ("sglang_token_usage", "token usage: "),
        ("sglang_gen_throughput", "gen throughput (token/s): "),
    ] {
        let theirs: f64 = reports
            .iter()
            .map(|line| logged_number(line, logged).unwrap_or(f64::NAN))
            .sum();
        let ours = metric_total(metrics, ours_name, None);
        let _ = writeln!(
            r.text,
            "{ours_name}: infertrace {ours:.4}, SGLang's log {theirs:.4} (sum of `{}`)",
            logged.trim_end_matches(": ")
        );
        // Values printed with two decimals at most: their sums agree to rounding.
        if (ours - theirs).abs() > 1e-6 * theirs.abs().max(1.0) || theirs.is_nan() {
            r.fail(format!(
                "{ours_name}: infertrace {ours}, SGLang's log {theirs}"
            ));
        }
    }
    r
}

/// `retract` event times per rid, from one side's spans: each event belongs to the request
/// span above the span that carries it (an n>1 call's trace holds several).
fn retract_events(lines: &[Value], ours: bool) -> BTreeMap<String, Vec<u64>> {
    fn text(v: &Value, key: &str) -> String {
        v[key].as_str().unwrap_or_default().to_string()
    }
    let (id, parent) = if ours {
        ("span_id", "parent_span_id")
    } else {
        ("spanId", "parentSpanId")
    };
    let by_id: BTreeMap<String, &Value> = lines.iter().map(|v| (text(v, id), v)).collect();
    fn rid_above<'a>(
        by_id: &BTreeMap<String, &'a Value>,
        parent: &str,
        mut span: &'a Value,
    ) -> Option<String> {
        for _ in 0..16 {
            if span["name"].as_str()?.starts_with(" Req ") {
                return span["attributes"]["rid"].as_str().map(str::to_string);
            }
            span = by_id.get(&text(span, parent))?;
        }
        None
    }
    let mut times: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for v in lines {
        for event in v["events"].as_array().into_iter().flatten() {
            if event["name"] != "retract" {
                continue;
            }
            let at = if ours {
                event["time_unix_nano"].as_u64()
            } else {
                event["timeUnixNano"].as_str().and_then(|s| s.parse().ok())
            };
            if let (Some(rid), Some(at)) = (rid_above(&by_id, parent, v), at) {
                times.entry(rid).or_default().push(at);
            }
        }
    }
    times
}

/// infertrace's `retract` events against SGLang's own: none where SGLang has none, never more
/// per request than SGLang's, each within `RETRACT_S` before SGLang's (SGLang stamps its event
/// when it puts the request back in its queue, just after it logs the retraction); and every
/// one of SGLang's accounted for: placed, or counted as not placed (`unplaced`, from the
/// agent's summary, which its exported counter must say too), some of them placed.
pub fn compare_retractions(ours: &Path, theirs: &Path, unplaced: usize) -> Report {
    // infertrace's instant is the log line's write, SGLang's its re-queueing right after it
    // (about 0.02 ms later), unless the scheduler is held off the CPU in between: a CI run
    // on a busy machine had one of 26 events 5.66 ms before SGLang's. Retractions here come
    // over 100 ms apart, so 20 ms cannot reach a neighbour's.
    const RETRACT_S: f64 = 20e-3;
    let ours_json = json_lines(ours);
    let ours = retract_events(&ours_json, true);
    let theirs = retract_events(&json_lines(theirs), false);
    let mut r = Report::default();
    let exported = metric_total(
        last_metrics(&ours_json),
        "infertrace_sglang_retractions_unplaced_total",
        None,
    );
    if exported != unplaced as f64 {
        r.fail(format!(
            "infertrace_sglang_retractions_unplaced_total {exported}, the summary {unplaced}"
        ));
    }
    let total: usize = theirs.values().map(Vec::len).sum();
    let (mut placed, mut distances) = (0usize, Vec::new());
    for (rid, at) in &ours {
        placed += at.len();
        let Some(truth) = theirs.get(rid) else {
            r.fail(format!("{rid}: {} retract events, SGLang none", at.len()));
            continue;
        };
        if at.len() > truth.len() {
            r.fail(format!(
                "{rid}: {} retract events, SGLang {}",
                at.len(),
                truth.len()
            ));
        }
        for &ns in at {
            // infertrace - SGLang to the nearest of SGLang's: ours is the log line's write,
            // SGLang's the re-queueing after it.
            let nearest = truth
                .iter()
                .map(|&t| (ns as f64 - t as f64) / 1e9)
                .min_by(|a, b| a.abs().total_cmp(&b.abs()))
                .unwrap_or(f64::INFINITY);
            distances.push(nearest);
            if !(-RETRACT_S..=1e-4).contains(&nearest) {
                r.fail(format!(
                    "{rid}: retract at {ns}, {nearest:+.6} s from SGLang's nearest"
                ));
            }
        }
    }
    let _ = writeln!(
        r.text,
        "retract events: infertrace {placed} placed + {unplaced} not placed, SGLang {total} \
         over {} requests",
        theirs.len(),
    );
    let _ = writeln!(r.text, "{}", describe_differences("retract", &distances));
    if placed == 0 || placed + unplaced != total {
        r.fail(format!(
            "{placed} placed + {unplaced} not placed, SGLang {total} retract events"
        ));
    }
    r
}

/// Stage spans of a request and the stages nested in them (`decode_loop` under
/// `decode_forward`, `chunked_prefill` under `prefill_forward`).
fn stages_within<'a>(all: &'a [SpanView<'a>], request: &SpanView) -> Vec<&'a SpanView<'a>> {
    let top = stages(all, request);
    let nested: Vec<&SpanView> = all
        .iter()
        .filter(|s| top.iter().any(|t| t.id == s.parent))
        .collect();
    top.into_iter().chain(nested).collect()
}

/// One `schedule` event, from either side.
struct Schedule<'a> {
    ns: u64,
    bid: &'a str,
    forward_mode: &'a str,
    batch_size: Option<i64>,
}

/// `a - b`, two instants in nanoseconds, in seconds.
fn seconds_between(a: u64, b: u64) -> f64 {
    (a as f64 - b as f64) / 1e9
}

/// infertrace's duration of a span minus SGLang's (seconds), from their (start, end) edges.
fn duration_difference(ours: (u64, u64), theirs: (u64, u64)) -> f64 {
    let length = |(start, end): (u64, u64)| end as f64 - start as f64;
    (length(ours) - length(theirs)) / 1e9
}

/// Reports the signed differences `values` (seconds) of `key` (`describe_differences`), and
/// fails `r` when they are beyond `tolerance`.
fn report_within(r: &mut Report, key: &str, values: &[f64], tolerance: Tolerance) {
    let _ = writeln!(r.text, "{}", describe_differences(key, values));
    if let Some(failure) = tolerance.exceeded(key, values) {
        r.fail(failure);
    }
}

/// One line on the signed differences `values` (seconds) of `key`: their absolute p50, tail
/// (p99, or p90 under 100 values, as `Tolerance::exceeded` reads them) and largest, and their
/// mean.
fn describe_differences(key: &str, values: &[f64]) -> String {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    // The nearest-rank p99 of fewer than 100 values is their largest: one step the 2-core
    // machine held off the CPU would decide it; the tail there is the p90.
    let tail = if values.len() >= 100 { 99.0 } else { 90.0 };
    format!(
        "{key} ({} values): |infertrace - SGLang| p50 {:.4} ms, p{tail} {:.4} ms, max {:.4} ms \
         (mean signed {:+.4} ms)",
        values.len(),
        percentile(values, 50.0) * 1e3,
        percentile(values, tail) * 1e3,
        percentile(values, 100.0) * 1e3,
        mean * 1e3
    )
}

/// The (start, end) of each of `stages` named `name`, in order.
fn edges_named(stages: &[&SpanView], name: &str) -> Vec<(u64, u64)> {
    let mut edges: Vec<(u64, u64)> = stages
        .iter()
        .filter(|s| s.name == name)
        .map(|s| (s.start, s.end))
        .collect();
    edges.sort();
    edges
}

/// The forward modes of `events`, in order.
fn schedule_modes<'a>(events: &[Schedule<'a>]) -> Vec<&'a str> {
    events.iter().map(|s| s.forward_mode).collect()
}

fn our_schedules<'a>(stages: &[&'a SpanView<'a>], all: &'a [Value]) -> Vec<Schedule<'a>> {
    let ids: Vec<&str> = stages.iter().map(|s| s.id).collect();
    let mut out: Vec<Schedule> = all
        .iter()
        .filter(|v| v["type"] == "span" && ids.contains(&v["span_id"].as_str().unwrap_or("")))
        .flat_map(|v| v["events"].as_array().into_iter().flatten())
        .filter(|e| e["name"] == "schedule")
        .map(|e| Schedule {
            ns: e["time_unix_nano"].as_u64().unwrap_or(0),
            bid: e["attributes"]["bid"].as_str().unwrap_or_default(),
            forward_mode: e["attributes"]["forward_mode"].as_str().unwrap_or_default(),
            batch_size: e["attributes"]["batch_size"].as_i64(),
        })
        .collect();
    out.sort_by_key(|s| s.ns);
    out
}

fn their_schedules<'a>(stages: &[&'a SpanView<'a>], all: &'a [Value]) -> Vec<Schedule<'a>> {
    let ids: Vec<&str> = stages.iter().map(|s| s.id).collect();
    let attribute = |e: &'a Value, key: &str| -> Option<&'a Value> {
        e["attributes"]
            .as_array()?
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| &a["value"])
    };
    let mut out: Vec<Schedule> = all
        .iter()
        .filter(|v| ids.contains(&v["spanId"].as_str().unwrap_or("")))
        .flat_map(|v| v["events"].as_array().into_iter().flatten())
        .filter(|e| e["name"] == "schedule")
        .map(|e| Schedule {
            ns: e["timeUnixNano"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            bid: attribute(e, "bid")
                .and_then(|v| v["stringValue"].as_str())
                .unwrap_or_default(),
            forward_mode: attribute(e, "forward_mode")
                .and_then(|v| v["stringValue"].as_str())
                .unwrap_or_default(),
            batch_size: attribute(e, "batch_size")
                .and_then(|v| v["intValue"].as_str())
                .and_then(|s| s.parse().ok()),
        })
        .collect();
    out.sort_by_key(|s| s.ns);
    out
}

/// A prefill batch's `schedule` is SGLang's own forward entry, never later than SGLang's event.
const PREFILL_SCHEDULE: &str = "schedule (prefill batch)";
/// The end of a request's `decode_waiting`: the marker of the iteration that scheduled its first
/// decode batch, never later than SGLang's stamp of that batch.
const DECODE_WAITING_END: &str = "decode_waiting end";
/// Instants infertrace takes before SGLang builds the batch, which SGLang stamps after it:
/// checked to be never later than SGLang's, as their distance is SGLang's own work in between
/// (a prefill batch's admission; the merge of the prefill batch that ended the wait), which
/// no syscall shows and which grows with the machine's load (docs/accuracy.md). Which batch
/// they belong to is checked exactly, by the batch ids and the order of the `schedule` events.
const BEFORE_SGLANG_BUILDS_THE_BATCH: [&str; 2] = [PREFILL_SCHEDULE, DECODE_WAITING_END];
/// Main's first messages after attach are sent before the capture has matched its hand-overs
/// to its sockets' writes (three votes): they are timed again once it has, but their
/// requests' dispatch start may not be known by then, and their `tokenize` then covers
/// `api_server_dispatch` and says so.
const SENT_BEFORE_SOCKETS_LEARNT: usize = 3;

/// The rids of the first `n` requests infertrace saw start.
fn first_started<'a>(ours: &[SpanView<'a>], n: usize) -> Vec<&'a str> {
    let mut by_start: Vec<&SpanView> = ours.iter().filter(|s| is_request(s)).collect();
    by_start.sort_by_key(|s| s.start);
    by_start.iter().take(n).map(|s| rid(s)).collect()
}

/// The stages SGLang produced for each request, against infertrace's from a live capture (one
/// that followed the scheduler's loop: replays of recordings made before the mailbox polls were
/// captured lack it, and main's serialization too): every stage SGLang produced is there
/// (`api_server_dispatch` included), as many `decode_loop`s and `chunked_prefill`s with their
/// durations (`bounds.loop_durations`) and edges (`bounds.loop_edges`) close, the same
/// `decode_waiting`s, and the same `schedule` events: one per batch the request was in, in the
/// same order and forward mode, batch sizes equal where infertrace gives one, and infertrace's
/// batch ids grouping the requests exactly as SGLang's.
pub fn compare_loop_stages(ours: &Path, theirs: &Path, bounds: Bounds) -> Report {
    let ours_json = json_lines(ours);
    let theirs_json = json_lines(theirs);
    let ours: Vec<SpanView> = ours_json.iter().filter_map(ours_view).collect();
    let theirs: Vec<SpanView> = theirs_json.iter().map(their_view).collect();
    let mut r = Report::default();
    let mut diffs: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut durations: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut bids: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    let mut their_bids: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    let (mut requests, mut events, mut sizes, mut lost_by_sglang, mut aborted) = (0, 0, 0, 0, 0);
    let mut nested: BTreeMap<&str, usize> = BTreeMap::new();
    // Every request's decode steps, compared after the loop.
    let mut decode_steps: Vec<DecodeStep> = Vec::new();
    let first_sent = first_started(&ours, SENT_BEFORE_SOCKETS_LEARNT);
    let mut undivided = 0;
    // The DP controller's first requests likewise, per scheduler socket it sends to: their
    // dpc_dispatch is left out (its thread span stays).
    let schedulers = theirs
        .iter()
        .filter(|s| s.name.starts_with("Scheduler") && s.name.contains("[DP "))
        .map(|s| s.name.split("(host:").next().unwrap_or_default())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        .max(1);
    let first_passed = first_started(&ours, SENT_BEFORE_SOCKETS_LEARNT * schedulers);
    let mut controller_only = 0;
    for theirs_req in theirs.iter().filter(|s| is_request(s)) {
        let id = rid(theirs_req);
        let Some(ours_req) = ours.iter().find(|s| is_request(s) && rid(s) == id) else {
            continue;
        };
        let (ours_stages, their_stages) = (
            stages_within(&ours, ours_req),
            stages_within(&theirs, theirs_req),
        );
        if !their_stages.iter().any(|s| s.name == "prefill_forward") {
            // n>1: SGLang files the warm-up's stages under the parent request.
            continue;
        }
        // infertrace does not follow an aborted request through the loop (its abort arrives
        // mid-iteration): it must not have placed any of its batches, and has only what its
        // outputs show (a streamed one's decode loops).
        let is_aborted = theirs_req.attributes["gen_ai.response.finish_reasons"]
            .as_str()
            .is_some_and(|r| r.contains("abort"));
        aborted += usize::from(is_aborted);
        let from_the_loop =
            |name: &str| matches!(name, "decode_waiting" | "chunked_prefill" | "decode_loop");
        requests += 1;
        let their_names: std::collections::BTreeSet<&str> =
            their_stages.iter().map(|s| s.name).collect();
        let covers_dispatch = ours_stages
            .iter()
            .any(|s| s.name == "tokenize" && s.attributes["infertrace.includes_dispatch"] == true);
        for name in their_names {
            if ours_stages.iter().any(|s| s.name == name) || (is_aborted && from_the_loop(name)) {
                continue;
            }
            if name == "api_server_dispatch" && covers_dispatch && first_sent.contains(&id) {
                undivided += 1;
                continue;
            }
            if name == "dpc_dispatch"
                && first_passed.contains(&id)
                && thread_span(&ours, ours_req.id, DP_CONTROLLER).is_some()
            {
                controller_only += 1;
                continue;
            }
            r.fail(format!("{id}: infertrace has no {name}"));
        }
        for (name, start_key, end_key, duration_key) in [
            (
                "decode_loop",
                "decode_loop start",
                "decode_loop end",
                "decode_loop duration",
            ),
            (
                "chunked_prefill",
                "chunked_prefill start",
                "chunked_prefill end",
                "chunked_prefill duration",
            ),
        ] {
            let (ours_nested, their_nested) = (
                edges_named(&ours_stages, name),
                edges_named(&their_stages, name),
            );
            if is_aborted && ours_nested.is_empty() {
                continue;
            }
            if ours_nested.len() != their_nested.len() {
                r.fail(format!(
                    "{id}: {} {name} spans, SGLang {}",
                    ours_nested.len(),
                    their_nested.len()
                ));
                continue;
            }
            *nested.entry(name).or_default() += ours_nested.len();
            if name == "decode_loop" {
                decode_steps.extend(ours_nested.iter().copied().zip(their_nested));
                continue;
            }
            for (a, b) in ours_nested.iter().zip(&their_nested) {
                diffs
                    .entry(start_key)
                    .or_default()
                    .push(seconds_between(a.0, b.0));
                diffs
                    .entry(end_key)
                    .or_default()
                    .push(seconds_between(a.1, b.1));
                durations
                    .entry(duration_key)
                    .or_default()
                    .push(duration_difference(*a, *b));
            }
        }
        if let (Some(a), Some(b)) = (
            edges_named(&ours_stages, "decode_waiting").first(),
            edges_named(&their_stages, "decode_waiting").first(),
        ) {
            diffs
                .entry(DECODE_WAITING_END)
                .or_default()
                .push(seconds_between(a.1, b.1));
        }
        let (mut ours_events, their_events) = (
            our_schedules(&ours_stages, &ours_json),
            their_schedules(&their_stages, &theirs_json),
        );
        if is_aborted {
            if !ours_events.is_empty() {
                r.fail(format!("{id}: aborted, yet schedule events placed"));
            }
            continue;
        }
        // SGLang records the event of the batch that ends a request's decode_waiting at that
        // span's end, and its trace can lose it (an event goes to a later slice that covers
        // it; none may): its own decode_waiting proves the batch, so infertrace's event there
        // is left out of the comparison, and counted.
        if ours_events.len() == their_events.len() + 1
            && let Some(waited) = edges_named(&their_stages, "decode_waiting")
                .first()
                .map(|w| w.1)
            && !their_events.iter().any(|e| e.ns == waited)
            && let Some(at) = ours_events.iter().position(|e| {
                e.forward_mode == "decode"
                    && seconds_between(e.ns, waited).abs() <= bounds.loop_edges.p99_s
            })
        {
            ours_events.remove(at);
            lost_by_sglang += 1;
        }
        if schedule_modes(&ours_events) != schedule_modes(&their_events) {
            let count =
                |e: &[Schedule], mode: &str| e.iter().filter(|s| s.forward_mode == mode).count();
            let first_difference = schedule_modes(&ours_events)
                .iter()
                .zip(schedule_modes(&their_events))
                .position(|(a, b)| *a != b);
            r.fail(format!(
                "{id}: schedule events {} prefill + {} decode, SGLang {} + {} (first different: {first_difference:?})",
                count(&ours_events, "prefill"),
                count(&ours_events, "decode"),
                count(&their_events, "prefill"),
                count(&their_events, "decode"),
            ));
            continue;
        }
        for (a, b) in ours_events.iter().zip(&their_events) {
            events += 1;
            diffs
                .entry(if a.forward_mode == "prefill" {
                    PREFILL_SCHEDULE
                } else {
                    "schedule (decode batch)"
                })
                .or_default()
                .push(seconds_between(a.ns, b.ns));
            if let Some(size) = a.batch_size {
                sizes += 1;
                if Some(size) != b.batch_size {
                    r.fail(format!(
                        "{id}: a {} batch of {size}, SGLang's of {:?}",
                        a.forward_mode, b.batch_size
                    ));
                }
            }
            bids.entry(a.bid).or_default().insert(b.bid);
            their_bids.entry(b.bid).or_default().insert(a.bid);
        }
    }
    compare_decode_steps(&mut r, &decode_steps, bounds);
    let split = bids
        .values()
        .chain(their_bids.values())
        .filter(|s| s.len() > 1)
        .count();
    if split > 0 {
        r.fail(format!(
            "{split} batch ids do not group the requests as SGLang's do"
        ));
    }
    let _ = writeln!(
        r.text,
        "loop stages compared for {requests} requests ({aborted} aborted: their batches not \
         followed): \
         {nested:?} nested spans, {events} schedule events ({sizes} with a batch size, \
         {lost_by_sglang} at a decode_waiting end missing from SGLang's trace), {} batches; \
         {undivided} of the first {SENT_BEFORE_SOCKETS_LEARNT} requests sent with tokenize \
         covering api_server_dispatch; {controller_only} of the first {} passed through a DP \
         controller without dpc_dispatch",
        bids.len(),
        first_passed.len()
    );
    for (key, values) in &diffs {
        let _ = writeln!(r.text, "{}", describe_differences(key, values));
        if BEFORE_SGLANG_BUILDS_THE_BATCH.contains(key) {
            check_never_after(&mut r, key, values, bounds.wall_clock_moved_s);
        } else if let Some(failure) = bounds.loop_edges.exceeded(key, values) {
            r.fail(failure);
        }
    }
    for (key, values) in &durations {
        report_within(&mut r, key, values, bounds.loop_durations);
    }
    if requests == 0 || events == 0 {
        r.fail("no request's loop stages compared".to_string());
    }
    r
}

/// One request's decode step (`decode_loop`): infertrace's (start, end), SGLang's.
type DecodeStep = ((u64, u64), (u64, u64));

/// The decode steps (`decode_loop`s) of every request, infertrace's edges against SGLang's.
/// A step of a batch ends for all its requests at once, and infertrace times it once: at the
/// hand-over of the batch's output. SGLang stamps each request of the batch in turn while it
/// processes the batch's result, with its own tracing of each request in between, so its stamps
/// of one batch spread over that walk, and more so the more requests the batch holds and the
/// busier the machine (docs/accuracy.md: a tenth of the batches spread over a millisecond on
/// two schedulers sharing 2 cores, the largest over 20 ms). What infertrace can be held to is
/// the batch's step: each edge is compared with SGLang's last stamp of the batch that the edge
/// is infertrace's hand-over of (`loop_edges`, the durations between them `loop_durations`;
/// a first step's start, the prefill's end, with the request's own stamp). The differences
/// from each request's own stamps, the walk included, are reported.
fn compare_decode_steps(r: &mut Report, steps: &[DecodeStep], bounds: Bounds) {
    let mut last_stamp: HashMap<u64, u64> = HashMap::new();
    for &((_, ours_end), (_, their_end)) in steps {
        let last = last_stamp.entry(ours_end).or_insert(their_end);
        *last = (*last).max(their_end);
    }
    let batch_step = |(start, end): (u64, u64), (their_start, their_end): (u64, u64)| {
        (
            last_stamp.get(&start).copied().unwrap_or(their_start),
            last_stamp.get(&end).copied().unwrap_or(their_end),
        )
    };
    let mut per_request: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut per_batch: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for &(ours, theirs) in steps {
        let batch = batch_step(ours, theirs);
        for (values, reference) in [(&mut per_request, theirs), (&mut per_batch, batch)] {
            values
                .entry("start")
                .or_default()
                .push(seconds_between(ours.0, reference.0));
            values
                .entry("end")
                .or_default()
                .push(seconds_between(ours.1, reference.1));
            values
                .entry("duration")
                .or_default()
                .push(duration_difference(ours, reference));
        }
    }
    let spread: Vec<f64> = steps
        .iter()
        .map(|&((_, ours_end), (_, their_end))| seconds_between(last_stamp[&ours_end], their_end))
        .collect();
    if !spread.is_empty() {
        let _ = writeln!(
            r.text,
            "decode steps: {} in {} batches; SGLang's stamp of a request before its last of the \
             batch: p50 {:.4} ms, p99 {:.4} ms, max {:.4} ms",
            steps.len(),
            last_stamp.len(),
            percentile(&spread, 50.0) * 1e3,
            percentile(&spread, 99.0) * 1e3,
            percentile(&spread, 100.0) * 1e3,
        );
    }
    for (edge, values) in &per_request {
        let key = format!("decode_loop {edge} (each request's own stamp, reported)");
        let _ = writeln!(r.text, "{}", describe_differences(&key, values));
    }
    for (edge, values) in &per_batch {
        let key = format!("decode_loop {edge} (SGLang's last stamp of the batch)");
        if *edge == "duration" {
            report_within(r, &key, values, bounds.loop_durations);
        } else {
            report_within(r, &key, values, bounds.loop_edges);
        }
    }
}

/// A PD decode server's stages before its queue, whose instants are on no wire infertrace
/// reads (docs/accuracy.md): not produced.
const DECODE_NODE_UNMEASURED: [&str; 4] = [
    "decode_prepare",
    "decode_bootstrap",
    "decode_transferred",
    "fake_output",
];

/// A PD decode server (SGLang's fake transfer backend): every request span has SGLang's name
/// and `bootstrap_room`; infertrace has every stage SGLang produced but the ones it cannot
/// measure (`DECODE_NODE_UNMEASURED`); `decode_waiting` (the scheduler's own instants) and
/// `decode_forward`'s start to float precision; every request's decode loops one for one (a
/// streamed request's timed by its outputs, the others by the scheduler's loop) and its
/// `schedule` events on its stage spans, in the same number, their instants within
/// `bounds.loop_edges` (the decode loops' durations within `bounds.loop_durations`), the batch
/// sizes infertrace gives equal. `streamed`: the rids the client streamed.
pub fn compare_pd_decode(ours: &Path, theirs: &Path, streamed: &[&str], bounds: Bounds) -> Report {
    let ours_json = json_lines(ours);
    let theirs_json = json_lines(theirs);
    let ours: Vec<SpanView> = ours_json.iter().filter_map(ours_view).collect();
    let theirs: Vec<SpanView> = theirs_json.iter().map(their_view).collect();
    let mut r = Report::default();
    let (mut requests, mut stamped) = (0, Vec::new());
    let (mut loop_edges, mut loop_edges_not_streamed) = (Vec::new(), Vec::new());
    let (mut loop_durations, mut loop_durations_not_streamed) = (Vec::new(), Vec::new());
    let mut schedule_edges = Vec::new();
    let first_sent = first_started(&ours, SENT_BEFORE_SOCKETS_LEARNT);
    let their_requests = theirs
        .iter()
        .filter(|s| is_request(s) && !rid(s).starts_with("HEALTH_CHECK_"));
    for theirs_req in their_requests {
        let id = rid(theirs_req);
        let Some(ours_req) = ours.iter().find(|s| is_request(s) && rid(s) == id) else {
            r.fail(format!("{id}: no request span"));
            continue;
        };
        requests += 1;
        let room = |s: &SpanView| s.attributes["bootstrap_room"].clone();
        if ours_req.name != theirs_req.name || room(ours_req) != room(theirs_req) {
            r.fail(format!(
                "{id}: {:?} bootstrap_room {}, SGLang {:?} {}",
                ours_req.name,
                room(ours_req),
                theirs_req.name,
                room(theirs_req)
            ));
        }
        let (ours_stages, their_stages) = (
            stages_within(&ours, ours_req),
            stages_within(&theirs, theirs_req),
        );
        let is_streamed = streamed.contains(&id);
        // As in compare_loop_stages: main's first requests have one tokenize that says so.
        let covers_dispatch = ours_stages
            .iter()
            .any(|s| s.name == "tokenize" && s.attributes["infertrace.includes_dispatch"] == true);
        for theirs_stage in &their_stages {
            let name = theirs_stage.name;
            let unmeasured = DECODE_NODE_UNMEASURED.contains(&name)
                || (name == "api_server_dispatch" && covers_dispatch && first_sent.contains(&id));
            if !unmeasured && !ours_stages.iter().any(|s| s.name == name) {
                r.fail(format!("{id}: infertrace has no {name}"));
            }
        }
        // Converted together when the forward pass begins (check_sglang_stamps).
        let mut exact = Vec::new();
        for (name, start_only) in [("decode_waiting", false), ("decode_forward", true)] {
            if let (Some(a), Some(b)) = (
                edges_named(&ours_stages, name).first(),
                edges_named(&their_stages, name).first(),
            ) {
                exact.push(seconds_between(a.0, b.0));
                if !start_only {
                    exact.push(seconds_between(a.1, b.1));
                }
            }
        }
        stamped.push((id, exact));
        let (a, b) = (
            edges_named(&ours_stages, "decode_loop"),
            edges_named(&their_stages, "decode_loop"),
        );
        if a.len() != b.len() {
            r.fail(format!(
                "{id}: {} decode_loop spans, SGLang {}",
                a.len(),
                b.len()
            ));
        }
        let (edges, durations) = if is_streamed {
            (&mut loop_edges, &mut loop_durations)
        } else {
            (
                &mut loop_edges_not_streamed,
                &mut loop_durations_not_streamed,
            )
        };
        for (a, b) in a.iter().zip(&b) {
            edges.extend([seconds_between(a.0, b.0), seconds_between(a.1, b.1)]);
            durations.push(duration_difference(*a, *b));
        }
        // The batches it was in: one event per batch, on its stage spans as SGLang's.
        let (ours_events, their_events) = (
            our_schedules(&ours_stages, &ours_json),
            their_schedules(&their_stages, &theirs_json),
        );
        if schedule_modes(&ours_events) != schedule_modes(&their_events) {
            r.fail(format!(
                "{id}: schedule events {:?}, SGLang {:?}",
                schedule_modes(&ours_events),
                schedule_modes(&their_events)
            ));
        }
        for (a, b) in ours_events.iter().zip(&their_events) {
            schedule_edges.push(seconds_between(a.ns, b.ns));
            if a.batch_size.is_some() && a.batch_size != b.batch_size {
                r.fail(format!(
                    "{id}: a batch of {:?}, SGLang's of {:?}",
                    a.batch_size, b.batch_size
                ));
            }
        }
    }
    let exact = check_sglang_stamps(
        &mut r,
        "decode_waiting edges and decode_forward start",
        &stamped,
        bounds.wall_clock_moved_s,
    );
    let _ = writeln!(r.text, "PD decode server: {requests} requests");
    for (what, values, tolerance) in [
        ("streamed decode_loop edges", &loop_edges, bounds.loop_edges),
        (
            "decode_loop edges not streamed",
            &loop_edges_not_streamed,
            bounds.loop_edges,
        ),
        (
            "streamed decode_loop durations",
            &loop_durations,
            bounds.loop_durations,
        ),
        (
            "decode_loop durations not streamed",
            &loop_durations_not_streamed,
            bounds.loop_durations,
        ),
        (
            "schedule (decode batch)",
            &schedule_edges,
            bounds.loop_edges,
        ),
    ] {
        if values.is_empty() {
            r.fail(format!("no {what} compared"));
        }
        report_within(&mut r, what, values, tolerance);
    }
    if requests == 0 || exact == 0 {
        r.fail("nothing of a PD decode server compared".to_string());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_runs_clock_moves_come_from_the_agents_summary() {
        let summary = "INFO ... 0 vanished fds; the wall clock moved 2 times, by at most 67.4 µs \
                       (instants converted with the offset of their time)";
        let bounds = ONE_SCHEDULER.with_clock_of(summary);
        assert!((bounds.wall_clock_moved_s - 67.4e-6).abs() < 1e-12);
        assert_eq!(
            ONE_SCHEDULER.with_clock_of("no move").wall_clock_moved_s,
            0.0
        );
        // A request in flight at the move: its edges differ by the move, and it is not counted
        // as shifted; without the move its edges converted together disagree.
        let per_request = [("a", vec![0.0, 67e-6]), ("b", vec![67e-6, 67e-6])];
        let mut r = Report::default();
        check_sglang_stamps(&mut r, "edges", &per_request, 67.4e-6);
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        let mut r = Report::default();
        check_sglang_stamps(&mut r, "edges", &per_request, 0.0);
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert!(r.failures[0].starts_with("a: "), "{:?}", r.failures);
    }

    #[test]
    fn edges_shifted_by_one_of_sglangs_calibrations_are_one_offset() {
        // The ends of prefill_forward of one prefill batch, all converted after a calibration
        // 66.56 µs off, their other edges exact: one offset.
        let mut groups: Vec<(&str, Vec<f64>)> = Vec::new();
        for id in ["a", "b", "c", "d", "e", "f", "g", "h"] {
            groups.push((id, vec![0.0, 0.0, 0.0]));
            groups.push((id, vec![66.56e-6]));
        }
        let mut r = Report::default();
        check_sglang_stamps(&mut r, "edges", &groups, 0.0);
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        // Two different offsets among 8 requests (the fewest runs may show).
        groups[15].1 = vec![30e-6];
        let mut r = Report::default();
        check_sglang_stamps(&mut r, "edges", &groups, 0.0);
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        // Three: more calibrations gone wrong than a run of 8 requests may have.
        groups[13].1 = vec![120e-6];
        let mut r = Report::default();
        check_sglang_stamps(&mut r, "edges", &groups, 0.0);
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        // A group SGLang stamped later than infertrace's instants: no calibration does that.
        groups[13].1 = vec![66.56e-6];
        groups[15].1 = vec![-66.56e-6];
        let mut r = Report::default();
        check_sglang_stamps(&mut r, "edges", &groups, 0.0);
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert!(
            r.failures[0].contains("cannot make them"),
            "{:?}",
            r.failures
        );
        // Edges converted together that disagree.
        groups[15].1 = vec![66.56e-6];
        groups[0].1 = vec![0.0, 50e-6, 0.0];
        let mut r = Report::default();
        check_sglang_stamps(&mut r, "edges", &groups, 0.0);
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert!(r.failures[0].starts_with("a: "), "{:?}", r.failures);
    }

    #[test]
    fn instants_before_sglangs_batch_stamps_are_never_after_them() {
        // Markers 0.2-4.5 ms before SGLang's stamps of the batches built after them.
        let mut before: Vec<f64> = (0..100).map(|k| -(0.2e-3 + f64::from(k) * 43e-6)).collect();
        let mut r = Report::default();
        check_never_after(&mut r, DECODE_WAITING_END, &before, 0.0);
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        // Two stamps SGLang converted with calibrations 66 and 25 µs off: allowed.
        before[7] = 66e-6;
        before[9] = 25e-6;
        let mut r = Report::default();
        check_never_after(&mut r, DECODE_WAITING_END, &before, 0.0);
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        // A third one, or one an iteration later (a batch placed in the wrong iteration).
        for late in [30e-6, 4e-3] {
            let mut wrong = before.clone();
            wrong[8] = late;
            let mut r = Report::default();
            check_never_after(&mut r, DECODE_WAITING_END, &wrong, 0.0);
            assert_eq!(r.failures.len(), 1, "{late}: {:?}", r.failures);
        }
        before[7] = 4e-3;
        let mut r = Report::default();
        check_never_after(&mut r, DECODE_WAITING_END, &before, 0.0);
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    }

    fn request(attributes: &Value, end: u64) -> SpanView<'_> {
        SpanView {
            name: " Req",
            id: "",
            parent: "",
            start: 0,
            end,
            attributes,
            links: Vec::new(),
        }
    }

    #[test]
    fn a_request_is_allowed_sglangs_walk_over_the_earlier_ones_of_its_message() {
        let ids: Vec<Value> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| json!({ "gen_ai.request.id": id }))
            .collect();
        // infertrace ended a, b and c at one take-over, d at the next; SGLang stamped b first.
        let ours = [
            request(&ids[0], 100),
            request(&ids[1], 100),
            request(&ids[2], 100),
            request(&ids[3], 200),
        ];
        let theirs = [
            request(&ids[0], 900),
            request(&ids[1], 400),
            request(&ids[2], 5_400),
            request(&ids[3], 700),
        ];
        let lags = finish_lags_in_message(
            &ours.iter().collect::<Vec<_>>(),
            &theirs.iter().collect::<Vec<_>>(),
        );
        // b's difference is checked in full; a's and c's lag after the take-over is allowed
        // (b's check counted the instant), and reported after b's stamp.
        let lag = |after_first: f64, allowed: f64| FinishLag {
            after_first,
            allowed,
        };
        assert_eq!(
            lags,
            BTreeMap::from([
                ("a", lag(500e-9, 800e-9)),
                ("b", lag(0.0, 0.0)),
                ("c", lag(5_000e-9, 5_300e-9)),
                ("d", lag(0.0, 0.0)),
            ])
        );
    }
}
