//! SGLang: rebuilds each request's life from the messages between the TokenizerManager (main
//! process), the scheduler and the detokenizer, and joins it to the HTTP call that caused it.
//!
//! Each message is captured twice, leaving one process and entering the next; which copy is
//! used is fixed by class and direction, so nothing counts twice:
//! - `TokenizedGenerateReqInput` leaving main: the request (`sent_ns`; its dispatch began at
//!   its serialization, `dispatch_start`); entering the scheduler: when the scheduler got it
//!   (`scheduler_recv_ns`), read for its request id alone (`SglangDecoder::request_rid`).
//!   With data parallelism (`--dp-size`) it passes through the DP controller on its way:
//!   entering it, then leaving it for one of the schedulers (`dp_controller`).
//! - `BatchTokenIDOutput` leaving the scheduler: when the scheduler finished the step that
//!   produced it (`scheduler_output_ns`), and its time stats as the scheduler wrote them.
//! - `BatchStrOutput` entering main: what the frontend learnt and when (first output, finish,
//!   counts); timed at main's event loop take-over (`handoff`).
//! - `AbortReq` leaving main: the client went away; entering main with a finish reason: the
//!   scheduler ended a request outside the output stream (aborted while queued).
//!
//! Times are capture times (CLOCK_MONOTONIC ns), moved to the application thread's instant
//! where its eventfds show it (`handoff`: a message taken over by main's event loop or the
//! scheduler's loop, a message handed to the I/O thread); the scheduler's time stats are its
//! `time.perf_counter()`, the same clock, in seconds.
use crate::{FastMap, FastSet};

use super::{
    dispatch_start::DispatchStarts,
    log::{self as sglang_log, DecodeStats, SchedulerLog},
    output_receipts::OutputReceipts,
    retractions::RetractionLog,
    scheduler_loop::{LoopView, RequestSteps, SchedulerLoops, StatsLine},
    wire::{
        self, OutputStage, RidOutput, SchedulerTimes, SglangDecoder, SglangFinish, SglangMessage,
        SglangOutputs, SglangRequest, SglangSampling, TraceContext,
    },
};
use crate::decode::flows::Decoded;
use crate::engines::common::pd_role::PdRole;
use crate::engines::common::{
    handoff::{Handling, HandoffStats, Handoffs},
    in_flight::InFlight,
    iteration_work::{IterationLaunches, IterationSamples},
    join::{ApiExchange, EngineRequestInfo, Joiner, Outcome},
};

/// Requests followed at once; beyond it the oldest is dropped and counted.
const MAX_IN_FLIGHT: usize = 65_536;
/// Capture instants kept per request (scheduler steps, outputs); later ones are counted.
pub const MAX_STEPS_PER_REQUEST: usize = 4096;
/// rids of SGLang's own `/health` probes (a real one-token generate).
const HEALTH_CHECK_PREFIX: &str = "HEALTH_CHECK_";
/// Retractions placed per request.
const MAX_RETRACTIONS_PER_REQUEST: usize = 64;
/// Requests whose receipts (or the DP controller's send) are held until main's send of them is
/// decoded.
const MAX_EARLY_RECEIPTS: usize = 1024;
/// Hops held per request: a request makes three (the DP controller's receipt and send, the
/// scheduler's receipt); more are a rid used twice, or bytes that only look like requests.
const MAX_EARLY_HOPS: usize = 3;

/// A scheduler's parallel ranks, as SGLang's thread span names show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ranks {
    pub tp: u32,
    pub pp: u32,
    /// Only under a data-parallel controller.
    pub dp: Option<u32>,
}

/// The ranks in a scheduler's title: `sglang::scheduler` plus `_DP{d}`, `_PP{p}`, `_TP{t}`
/// (and others) for each parallelism larger than 1 (scheduler.py); a rank not shown is 0.
/// None for another process.
pub fn scheduler_ranks(cmdline: &[String]) -> Option<Ranks> {
    let title = cmdline.first()?.split_whitespace().next()?;
    let suffix = title.strip_prefix("sglang::scheduler")?;
    let mut ranks = Ranks::default();
    for part in suffix.split('_').filter(|p| !p.is_empty()) {
        let number = |prefix: &str| part.strip_prefix(prefix)?.parse::<u32>().ok();
        if let Some(n) = number("TP") {
            ranks.tp = n;
        } else if let Some(n) = number("PP") {
            ranks.pp = n;
        } else if let Some(n) = number("DP") {
            ranks.dp = Some(n);
        }
    }
    Some(ranks)
}

/// SGLang's data-parallel controller (`sglang::data_parallel_controller`, its title).
pub fn is_dp_controller(cmdline: &[String]) -> bool {
    cmdline
        .first()
        .and_then(|c| c.split_whitespace().next())
        .is_some_and(|title| title == "sglang::data_parallel_controller")
}

/// The server's `--stream-interval` (tokens per streamed output) from the command line of
/// SGLang's main process (`python -m sglang.launch_server ...`, `sglang serve ...`): its
/// default, 1, when the flag is absent; None for other processes (the scheduler and the
/// detokenizer retitle themselves `sglang::...`).
pub fn server_stream_interval(cmdline: &[String]) -> Option<u64> {
    if !launches_server(cmdline) {
        return None;
    }
    match option_value(cmdline, "--stream-interval") {
        Some(v) => v.parse().ok(),
        None => Some(1),
    }
}

/// The value of option `flag` on a command line, given as `flag VALUE` or `flag=VALUE`.
fn option_value<'a>(cmdline: &'a [String], flag: &str) -> Option<&'a str> {
    cmdline.iter().enumerate().find_map(|(i, arg)| {
        if arg == flag {
            cmdline.get(i + 1).map(String::as_str)
        } else {
            arg.strip_prefix(flag)?.strip_prefix('=')
        }
    })
}

/// `python -m sglang.launch_server ...` or `sglang serve ...`: SGLang's main process.
fn launches_server(cmdline: &[String]) -> bool {
    cmdline.iter().enumerate().any(|(i, arg)| {
        arg == "sglang.launch_server"
            || ((arg == "sglang" || arg.ends_with("/sglang"))
                && cmdline.get(i + 1).is_some_and(|a| a == "serve"))
    })
}

/// A scheduler's own `perf_counter()` stamp (CLOCK_MONOTONIC seconds) as a capture time.
fn scheduler_ns(seconds: f64) -> u64 {
    (seconds * 1e9).round() as u64
}

/// The server's PD role, from its main process's command line: None for a server that is not
/// disaggregated (`null`, SGLang's default) and for other processes.
pub fn server_pd_role(cmdline: &[String]) -> Option<PdRole> {
    if !launches_server(cmdline) {
        return None;
    }
    match option_value(cmdline, "--disaggregation-mode")? {
        "prefill" => Some(PdRole::Prefill),
        "decode" => Some(PdRole::Decode),
        _ => None,
    }
}

/// Whether the server's schedulers run the overlap loop (SGLang's default; off with
/// `--disable-overlap-schedule`), from its main process's command line; None for others.
pub fn server_overlaps(cmdline: &[String]) -> Option<bool> {
    launches_server(cmdline).then(|| !cmdline.iter().any(|a| a == "--disable-overlap-schedule"))
}

/// A request's pass through SGLang's data-parallel controller, which takes it from main and
/// passes it on to one of its schedulers (capture times, moved to the controller's thread's
/// instants when the trace is made).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DpControllerHop {
    pub pid: u32,
    /// When the controller took the request over.
    pub received_ns: Option<u64>,
    /// When it handed the request to a scheduler's socket.
    pub sent_ns: Option<u64>,
    /// When it began dispatching the request (its first `pickle.dumps` for it), when certain.
    pub dispatch_start_ns: Option<u64>,
}

/// What a process after main did with a request: a message of it reaching or leaving that
/// process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    DpControllerReceived,
    DpControllerSent,
    SchedulerReceived,
}

/// One SGLang engine request (one rid), as the main process and the scheduler saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SglangTimeline {
    pub rid: String,
    pub prompt_tokens: Option<u64>,
    /// Which requests share one prompt (`SglangRequest::prompt_key`).
    pub prompt_key: Option<u64>,
    pub sampling: SglangSampling,
    /// The request's own flag; an n>1 prefix warm-up is never streamed, whatever its call.
    pub stream: bool,
    /// Tokens per streamed output: the request's own interval, else its server's.
    pub stream_interval: Option<u64>,
    pub bootstrap_room: Option<u64>,
    /// SGLang's own tracing context, when its tracing is on.
    pub trace: Option<TraceContext>,
    /// The main (TokenizerManager) process and the scheduler that served the request.
    pub frontend_pid: u32,
    /// Its way through the DP controller, with data parallelism.
    pub dp_controller: Option<DpControllerHop>,
    pub scheduler_pid: Option<u32>,
    /// The scheduler's ranks, when its title was seen.
    pub scheduler_ranks: Option<Ranks>,
    /// Capture time main handed the request to ZeroMQ (first byte sent).
    pub sent_ns: u64,
    /// Capture time main began serializing it (its `pickle.dumps` entry), when the probe saw
    /// that the request was its hand-over's one serialization.
    pub dispatch_start_ns: Option<u64>,
    /// Capture time the scheduler received it (last byte).
    pub scheduler_recv_ns: Option<u64>,
    /// Capture times the scheduler sent each output carrying this request (first byte).
    pub scheduler_output_ns: Vec<u64>,
    /// Per output, what the scheduler launched on the GPU since the output before (CPU-side;
    /// filled by the pipeline when the CUDA probes saw it).
    pub gpu_per_output: Vec<Option<IterationLaunches>>,
    /// The scheduler process's Python samples in the same windows.
    pub python_per_output: Vec<Option<IterationSamples>>,
    /// Capture times main took over the first and the final output (see `handoff`); a
    /// request main aborted ends when the scheduler's abort output reached it.
    pub first_output_ns: Option<u64>,
    pub finished_ns: Option<u64>,
    /// Capture time main took over the latest output.
    pub last_output_ns: Option<u64>,
    /// Capture times main received each output, bounded.
    pub output_ns: Vec<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub retractions: Option<u64>,
    /// The retraction count of the scheduler's latest output for it, and the capture times
    /// of the retractions placed (`retractions`), and of those that could not be placed.
    pub retractions_seen: u64,
    pub retracted_ns: Vec<u64>,
    pub retractions_unplaced: u64,
    pub finish: Option<SglangFinish>,
    /// The scheduler's instants, with `--enable-metrics`.
    pub times: Option<SchedulerTimes>,
    /// What the scheduler's loop showed of it (`scheduler_loop`): its decode steps, its wait
    /// for the first decode batch, the batches it was in.
    pub loop_view: Option<LoopView>,
    /// Its server's schedulers run the overlap loop.
    pub overlap: bool,
    /// Its server's part under PD disaggregation.
    pub pd_role: Option<PdRole>,
    /// Main sent an `AbortReq` for it (the client went away).
    pub aborted_by_frontend: bool,
    /// The scheduler dropped it from its queue (an `AbortReq` back to main, no output): SGLang
    /// leaves it out of its request counters.
    pub dropped_while_queued: bool,
    pub steps_dropped: u32,
}

impl SglangTimeline {
    /// Process `pid` (of `ranks`, a scheduler's) did `hop` with the request at `ns`.
    fn hop(&mut self, pid: u32, hop: Hop, ns: u64, ranks: Option<Ranks>) {
        let dp_controller = || DpControllerHop {
            pid,
            ..DpControllerHop::default()
        };
        match hop {
            Hop::SchedulerReceived => {
                self.scheduler_pid = Some(pid);
                self.scheduler_ranks = ranks;
                self.scheduler_recv_ns.get_or_insert(ns);
            }
            Hop::DpControllerReceived => {
                let d = self.dp_controller.get_or_insert_with(dp_controller);
                d.received_ns.get_or_insert(ns);
            }
            Hop::DpControllerSent => {
                let d = self.dp_controller.get_or_insert_with(dp_controller);
                d.sent_ns.get_or_insert(ns);
            }
        }
    }

    fn new(request: &SglangRequest, frontend_pid: u32, sent_ns: u64) -> Self {
        Self {
            rid: request.rid.clone(),
            prompt_tokens: request.prompt_tokens,
            prompt_key: request.prompt_key,
            sampling: request.sampling.clone(),
            stream: request.stream,
            bootstrap_room: request.bootstrap_room,
            trace: request.trace.clone(),
            frontend_pid,
            sent_ns,
            ..Self::default()
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    fn push_bounded(list: &mut Vec<u64>, ns: u64, dropped: &mut u32) {
        if list.len() < MAX_STEPS_PER_REQUEST {
            list.push(ns);
        } else {
            *dropped += 1;
        }
    }

    /// Apply this request's part of a `BatchStrOutput` main received at `recv_ns`.
    fn apply(&mut self, out: &RidOutput, recv_ns: u64) {
        self.first_output_ns.get_or_insert(recv_ns);
        self.last_output_ns = Some(recv_ns);
        Self::push_bounded(&mut self.output_ns, recv_ns, &mut self.steps_dropped);
        // Counts are cumulative: the latest output's are the request's.
        self.prompt_tokens = out.prompt_tokens.or(self.prompt_tokens);
        self.completion_tokens = out.completion_tokens.or(self.completion_tokens);
        self.cached_tokens = out.cached_tokens.or(self.cached_tokens);
        self.retractions = out.retractions.or(self.retractions);
        if let Some(finish) = &out.finish {
            self.finish = Some(finish.clone());
            self.finished_ns = Some(recv_ns);
        }
    }
}

/// The scheduler's output at `ns` says the request was retracted `count` times so far: its
/// retractions since the scheduler's previous output for it (or its receipt) are placed at
/// the retraction lines of that window when they are exactly as many (`retractions`).
fn place_retractions(
    t: &mut SglangTimeline,
    count: Option<u64>,
    (scheduler, ns): (u32, u64),
    log: &mut RetractionLog,
    stats: &mut SglangStats,
) {
    let Some(count) = count.filter(|&c| c > t.retractions_seen) else {
        return;
    };
    let new = count - t.retractions_seen;
    t.retractions_seen = count;
    let after = t
        .scheduler_output_ns
        .last()
        .copied()
        .or(t.scheduler_recv_ns)
        .unwrap_or(t.sent_ns);
    match log.place(scheduler, after, ns, new) {
        Some(at) if t.retracted_ns.len() + at.len() <= MAX_RETRACTIONS_PER_REQUEST => {
            stats.retractions_placed += new;
            t.retracted_ns.extend(at);
        }
        _ => {
            stats.retractions_unplaced += new;
            t.retractions_unplaced += new;
        }
    }
}

impl EngineRequestInfo for SglangTimeline {
    fn api_id(&self) -> &str {
        &self.rid
    }

    fn sent_ns(&self) -> u64 {
        self.sent_ns
    }

    fn done_ns(&self) -> u64 {
        self.finished_ns.unwrap_or(self.sent_ns)
    }

    fn prompt_key(&self) -> Option<u64> {
        self.prompt_key
    }

    /// tokenizer_manager.py, n>1: the prompt sent alone first, `max_new_tokens` 0, not
    /// streamed, under a regenerated rid.
    fn is_prefix_warmup(&self) -> bool {
        self.sampling.max_new_tokens == Some(0) && !self.stream
    }

    /// Each sample of an n>1 call has a fresh rid and carries the call's n; the response is
    /// named after the first.
    fn unrelated_samples(&self) -> u64 {
        self.sampling.n.unwrap_or(1)
    }
}

/// A finished request: the API call (when seen) and the engine requests it made.
pub type SglangTrace = Outcome<SglangTimeline>;

/// Counters of what the tracker saw and could not use.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct SglangStats {
    pub requests: u64,
    /// Main's receipts of outputs, and those of them that repeated a scheduler's send
    /// (`output_receipts`: not decoded again).
    pub outputs: u64,
    pub outputs_repeating_sends: u64,
    /// Messages that looked like SGLang's but did not decode.
    pub undecodable: u64,
    /// `/health` probes, left out of the traces.
    pub health_checks: u64,
    /// Outputs for a rid whose request was never seen (sent before attach, or lost).
    pub outputs_without_request: u64,
    pub evicted: u64,
    pub unfinished_at_end: u64,
    /// Lines of the schedulers' logs read, and the statistics reports among them.
    pub log_lines: u64,
    pub stats_reports: u64,
    /// Retractions of requests put at the instant their scheduler logged them, and those
    /// whose instant was not certain (left out).
    pub retractions_placed: u64,
    pub retractions_unplaced: u64,
    /// Scheduler loop iterations followed (`scheduler_loop`), and the requests with scheduler
    /// time stats whose decode steps and batches the loop showed, or could not (left out).
    pub loop_iterations: u64,
    pub loop_requests_placed: u64,
    pub loop_requests_not_placed: u64,
    /// Requests whose dispatch start main's serialization showed, and those it did not (no
    /// `pickle.dumps` probe, the hand-over not probed, or not one serialization before it).
    pub dispatch_starts: u64,
    pub dispatch_starts_unknown: u64,
    /// The same for the DP controller's dispatch of requests that passed through one.
    pub dpc_dispatch_starts: u64,
    pub dpc_dispatch_starts_unknown: u64,
}

pub struct SglangTracker {
    decoder: SglangDecoder,
    /// Scheduler processes' ranks, from their titles.
    ranks: FastMap<u32, Ranks>,
    /// DP controller processes, from their titles.
    dp_controllers: FastSet<u32>,
    /// Main processes' `--stream-interval`, from their command lines.
    stream_intervals: FastMap<u32, u64>,
    /// Main processes whose schedulers do not run the overlap loop.
    no_overlap: FastSet<u32>,
    /// Main processes of PD-disaggregated servers, and their part.
    pd_roles: FastMap<u32, PdRole>,
    loops: SchedulerLoops,
    in_flight: InFlight<SglangTimeline>,
    joiner: Joiner<SglangTimeline>,
    handoffs: Handoffs,
    dispatch_starts: DispatchStarts,
    now_ns: u64,
    /// The schedulers' statistics reports since the pipeline last took them.
    reports: Vec<DecodeStats>,
    /// What the processes after main did with requests (rid -> process, hop, when), decoded
    /// before main's send of the same request: each side's record is stamped when its syscall
    /// returned, and the reader's can return first (or land in an earlier drain).
    early_receipts: FastMap<String, Vec<(u32, Hop, u64)>>,
    retraction_log: RetractionLog,
    output_receipts: OutputReceipts,
    pub stats: SglangStats,
}

impl Default for SglangTracker {
    fn default() -> Self {
        Self {
            decoder: SglangDecoder::default(),
            ranks: FastMap::default(),
            dp_controllers: FastSet::default(),
            stream_intervals: FastMap::default(),
            no_overlap: FastSet::default(),
            pd_roles: FastMap::default(),
            loops: SchedulerLoops::default(),
            in_flight: InFlight::new(MAX_IN_FLIGHT),
            joiner: Joiner::default(),
            handoffs: Handoffs::default(),
            dispatch_starts: DispatchStarts::default(),
            now_ns: 0,
            reports: Vec::new(),
            early_receipts: FastMap::default(),
            retraction_log: RetractionLog::default(),
            output_receipts: OutputReceipts::default(),
            stats: SglangStats::default(),
        }
    }
}

impl SglangTracker {
    /// Requests being followed now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn handoff_stats(&self) -> HandoffStats {
        self.handoffs.stats
    }

    /// The schedulers' statistics reports read since the last call.
    pub fn take_reports(&mut self) -> Vec<DecodeStats> {
        std::mem::take(&mut self.reports)
    }

    /// Take one decoded message.
    pub fn feed(&mut self, decoded: &Decoded) {
        self.now_ns = self.now_ns.max(decoded.end_ns());
        match decoded {
            Decoded::Http { exchange, .. } => {
                if let Some(api) = ApiExchange::from_exchange(exchange) {
                    self.joiner.add_api(api, self.now_ns);
                }
            }
            Decoded::Wakeup(wakeup) => self.handoffs.wakeup(wakeup),
            Decoded::Handover(handover) => {
                if handover.tid == handover.tgid && self.ranks.contains_key(&handover.tgid) {
                    self.loops
                        .handed_over(handover.tgid, handover.socket, handover.ns);
                }
                self.handoffs.handed_over(handover);
                self.dispatch_starts.handed_over(handover);
            }
            Decoded::Serializing(s) => self.dispatch_starts.serializing(s),
            // SGLang's frontend handles an output in the task that read it: the mailbox read
            // is its instant, with no loop iteration to wait for.
            // GPU steps and Python samples go to the pipeline's own stages.
            Decoded::LoopWait(wait) => self.handoffs.loop_waited(wait),
            Decoded::Cuda(_)
            | Decoded::PySample(_)
            | Decoded::Clock(_)
            | Decoded::Traced(_)
            | Decoded::Pod { .. }
            | Decoded::Exited { .. } => {}
            // The schedulers' loops; main's polls are its asyncio loop's business.
            Decoded::MailboxPoll(poll) if self.ranks.contains_key(&poll.tgid) => {
                self.stats.loop_iterations += self.loops.poll(poll);
            }
            Decoded::MailboxPoll(_) => {}
            // Only schedulers' logs are read.
            Decoded::Log(log) => {
                self.stats.log_lines += 1;
                match sglang_log::parse(&log.line) {
                    Some(SchedulerLog::DecodeStats(report)) => {
                        self.stats.stats_reports += 1;
                        let requests = report.running_reqs;
                        self.loops
                            .logged(log.tgid, log.ns, StatsLine::Decode { requests });
                        self.reports.push(report);
                    }
                    Some(SchedulerLog::PrefillBatch { new_seqs }) => {
                        let requests = new_seqs;
                        self.loops
                            .logged(log.tgid, log.ns, StatsLine::Prefill { requests });
                    }
                    Some(SchedulerLog::Retract { requests }) => {
                        self.retraction_log.logged(log.tgid, log.ns, requests);
                    }
                    None => {}
                }
            }
            Decoded::Process(info) => {
                if let Some(ranks) = scheduler_ranks(&info.cmdline) {
                    self.ranks.insert(info.pid, ranks);
                }
                if is_dp_controller(&info.cmdline) {
                    self.dp_controllers.insert(info.pid);
                }
                if let Some(interval) = server_stream_interval(&info.cmdline) {
                    self.stream_intervals.insert(info.pid, interval);
                }
                if server_overlaps(&info.cmdline) == Some(false) {
                    self.no_overlap.insert(info.pid);
                }
                if let Some(role) = server_pd_role(&info.cmdline) {
                    self.pd_roles.insert(info.pid, role);
                }
            }
            Decoded::Zmtp {
                tgid,
                fd,
                outgoing,
                message,
            } => {
                // A scheduler's (or DP controller's) receipt of a request is read for its id
                // alone: main's send of it was decoded in full.
                if !*outgoing && let Some(rid) = self.decoder.request_rid(&message.frames) {
                    let last_ns = message.last_ns.max(message.first_ns);
                    self.request_received(*tgid, rid, last_ns);
                    return;
                }
                let decoded = match self.receipt_of_a_send(&message.frames, *outgoing) {
                    Some(items) => Some(Ok(SglangMessage::Outputs(SglangOutputs {
                        stage: OutputStage::Strings,
                        items,
                        leading: None,
                    }))),
                    None => self.decoder.decode(&message.frames),
                };
                // A message sent is known by the key its hand-over is looked up by.
                let mut first_ns = message.first_ns;
                if *outgoing {
                    // Every message sent moves its socket's hand-overs on; the instants asked
                    // about are those of requests and of the scheduler's outputs.
                    let asked = match &decoded {
                        Some(Ok(SglangMessage::Request(r))) => {
                            !r.rid.starts_with(HEALTH_CHECK_PREFIX)
                        }
                        Some(Ok(SglangMessage::Outputs(o))) => o.stage == OutputStage::TokenIds,
                        _ => false,
                    };
                    let last_frame = message.frames.last().map_or(0, Vec::len);
                    first_ns = self.handoffs.sent(*tgid, *fd, first_ns, last_frame, asked);
                }
                match decoded {
                    Some(Ok(m)) => {
                        let last_ns = message.last_ns.max(first_ns);
                        // How main's handle_loop gets a message it received (`handoff`).
                        let handling = if wire::is_pickled(&message.frames) {
                            Handling::NextIteration
                        } else {
                            Handling::AtTakeOver
                        };
                        self.message(*tgid, *outgoing, m, (first_ns, last_ns), handling);
                    }
                    Some(Err(e)) => {
                        self.stats.undecodable += 1;
                        tracing::debug!("undecodable SGLang message: {e}");
                    }
                    None => {}
                }
            }
        }
    }

    /// The outputs of the scheduler's send that main's receipt `frames` repeats, if it is one.
    fn receipt_of_a_send(&mut self, frames: &[Vec<u8>], outgoing: bool) -> Option<Vec<RidOutput>> {
        if outgoing {
            return None;
        }
        match self.decoder.output_head(frames)? {
            (OutputStage::Strings, leading) => {
                let items = self.output_receipts.received(leading)?;
                self.stats.outputs_repeating_sends += 1;
                Some(items)
            }
            _ => None,
        }
    }

    fn message(
        &mut self,
        tgid: u32,
        outgoing: bool,
        m: SglangMessage,
        (first_ns, last_ns): (u64, u64),
        handling: Handling,
    ) {
        let dp_controller = self.dp_controllers.contains(&tgid);
        match (m, outgoing) {
            (SglangMessage::Request(r), true) if dp_controller => {
                self.hop(&r.rid, tgid, Hop::DpControllerSent, first_ns);
            }
            (SglangMessage::Request(r), true) => {
                if r.rid.starts_with(HEALTH_CHECK_PREFIX) {
                    self.stats.health_checks += 1;
                    return;
                }
                self.stats.requests += 1;
                let mut timeline = SglangTimeline::new(&r, tgid, first_ns);
                timeline.overlap = !self.no_overlap.contains(&tgid);
                timeline.pd_role = self.pd_roles.get(&tgid).copied();
                timeline.stream_interval = r
                    .sampling
                    .stream_interval
                    .or_else(|| self.stream_intervals.get(&tgid).copied());
                for (pid, hop, ns) in self.early_receipts.remove(&r.rid).unwrap_or_default() {
                    timeline.hop(pid, hop, ns, self.ranks.get(&pid).copied());
                }
                self.stats.evicted += self.in_flight.insert(r.rid.clone(), timeline);
            }
            (SglangMessage::Request(r), false) => self.request_received(tgid, &r.rid, last_ns),
            (SglangMessage::Outputs(o), true) if o.stage == OutputStage::TokenIds => {
                match self.prebuilt_hand_over(tgid, &o.items, first_ns) {
                    Some(handed_over) => self.loops.prebuilt_output(tgid, handed_over),
                    None => self.loops.output_sent(tgid, first_ns),
                }
                for item in &o.items {
                    if let Some(t) = self.in_flight.get_mut(&item.rid) {
                        place_retractions(
                            t,
                            item.retractions,
                            (tgid, first_ns),
                            &mut self.retraction_log,
                            &mut self.stats,
                        );
                        SglangTimeline::push_bounded(
                            &mut t.scheduler_output_ns,
                            first_ns,
                            &mut t.steps_dropped,
                        );
                        // The scheduler's own values: the detokenizer re-bases them onto its
                        // clock offset before passing them on (pickle mode).
                        t.times = item.times.or(t.times);
                    }
                }
                if let Some(leading) = o.leading {
                    self.output_receipts.sent(leading, o.items);
                }
            }
            (SglangMessage::Outputs(o), false) if o.stage == OutputStage::Strings => {
                self.stats.outputs += 1;
                self.handoffs.received(tgid, last_ns, true, handling);
                for item in &o.items {
                    self.output(item, last_ns);
                }
            }
            (SglangMessage::Abort(a), true) if a.finish.is_none() => {
                if let Some(t) = self.in_flight.get_mut(&a.rid) {
                    t.aborted_by_frontend = true;
                }
            }
            // The scheduler ended a request outside the output stream (aborted while queued).
            (SglangMessage::Abort(a), false) if a.finish.is_some() => {
                self.handoffs.received(tgid, last_ns, true, handling);
                if let Some(t) = self.in_flight.get_mut(&a.rid) {
                    t.dropped_while_queued = t.first_output_ns.is_none();
                    t.finish = a.finish;
                    t.finished_ns = Some(last_ns);
                }
                if let Some(t) = self.in_flight.remove(&a.rid) {
                    self.joiner.add_engine(t);
                }
            }
            _ => {}
        }
    }

    /// A scheduler or the DP controller (`tgid`) received request `rid`, its receipt ending
    /// at `last_ns`.
    fn request_received(&mut self, tgid: u32, rid: &str, last_ns: u64) {
        // The scheduler's and the DP controller's loops are no asyncio loops.
        self.handoffs
            .received(tgid, last_ns, true, Handling::AtTakeOver);
        let hop = if self.dp_controllers.contains(&tgid) {
            Hop::DpControllerReceived
        } else {
            Hop::SchedulerReceived
        };
        self.hop(rid, tgid, hop, last_ns);
    }

    /// Process `pid` did `hop` with request `rid` at `ns`: kept until main's send of it is
    /// decoded, when that has not been yet.
    fn hop(&mut self, rid: &str, pid: u32, hop: Hop, ns: u64) {
        let ranks = self.ranks.get(&pid).copied();
        if let Some(t) = self.in_flight.get_mut(rid) {
            t.hop(pid, hop, ns, ranks);
            return;
        }
        if rid.starts_with(HEALTH_CHECK_PREFIX) {
            return;
        }
        if self.early_receipts.len() >= MAX_EARLY_RECEIPTS {
            // Requests whose send never came (sent before attach).
            self.early_receipts.clear();
        }
        let held = self.early_receipts.entry(rid.to_owned()).or_default();
        if held.len() < MAX_EARLY_HOPS {
            held.push((pid, hop, ns));
        }
    }

    fn output(&mut self, item: &RidOutput, recv_ns: u64) {
        let Some(t) = self.in_flight.get_mut(&item.rid) else {
            if !item.rid.starts_with(HEALTH_CHECK_PREFIX) {
                self.stats.outputs_without_request += 1;
            }
            return;
        };
        t.apply(item, recv_ns);
        if t.is_finished()
            && let Some(t) = self.in_flight.remove(&item.rid)
        {
            self.joiner.add_engine(t);
        }
    }

    /// Report what has waited long enough at capture time `now_ns`.
    pub fn advance(&mut self, now_ns: u64) -> Vec<SglangTrace> {
        self.now_ns = self.now_ns.max(now_ns);
        let outcomes = self.joiner.advance(self.now_ns);
        outcomes.into_iter().map(|o| self.trace(o)).collect()
    }

    /// End of the session: report everything finished; unfinished requests are counted.
    pub fn finish(&mut self) -> Vec<SglangTrace> {
        self.stats.unfinished_at_end += self.in_flight.clear() as u64;
        let outcomes = self.joiner.finish();
        outcomes.into_iter().map(|o| self.trace(o)).collect()
    }

    /// When the scheduler handed over a request's final output: as the capture matched it to
    /// its write, else the loop thread's latest hand-over before that write.
    fn final_hand_over(&self, t: &SglangTimeline) -> Option<u64> {
        let written = *t.scheduler_output_ns.last()?;
        Some(self.output_hand_over(t.scheduler_pid?, written))
    }

    /// When scheduler `scheduler` handed over the output its I/O thread wrote at `written`
    /// (that write's instant when no hand-over is known).
    fn output_hand_over(&self, scheduler: u32, written: u64) -> u64 {
        let matched = self.handoffs.taken_at(written);
        if matched != written {
            return matched;
        }
        self.loops
            .output_handed_over(scheduler, written)
            .unwrap_or(written)
    }

    /// When a PD decode server handed over output `items`, first written at `written`, if
    /// they are its prebuilt batch's (each request's first output, in the iteration that
    /// stamped its forward entry); None for any other output.
    fn prebuilt_hand_over(&self, scheduler: u32, items: &[RidOutput], written: u64) -> Option<u64> {
        // Checked first, as it is cheap and false for every other server's outputs.
        let first_outputs_on_decode_server = !items.is_empty()
            && items.iter().all(|item| {
                self.in_flight.get(&item.rid).is_some_and(|t| {
                    t.pd_role == Some(PdRole::Decode) && t.scheduler_output_ns.is_empty()
                })
            });
        if !first_outputs_on_decode_server {
            return None;
        }
        let handed_over = self.output_hand_over(scheduler, written);
        items
            .iter()
            .all(|item| {
                item.times
                    .and_then(|times| times.forward_entry)
                    .is_some_and(|f| {
                        self.loops
                            .same_iteration(scheduler, scheduler_ns(f), handed_over)
                    })
            })
            .then_some(handed_over)
    }

    /// The scheduler loop's view of a request it decoded: one with the scheduler's own time
    /// stats (its forward entry and prefill end; a PD decode server's has no prefill) that was
    /// neither retracted nor aborted.
    fn loop_view(&mut self, t: &SglangTimeline) -> Option<LoopView> {
        let times = t.times?;
        let pd_decode = t.pd_role == Some(PdRole::Decode);
        let forward_entry_ns = scheduler_ns(times.forward_entry?);
        let steps = RequestSteps {
            scheduler: t.scheduler_pid?,
            forward_entry_ns,
            prefill_end_ns: if pd_decode {
                forward_entry_ns
            } else {
                scheduler_ns(times.prefill_finished?)
            },
            // Its hand-over: the I/O thread may write it after the loop's next iteration began.
            final_output_ns: self.final_hand_over(t)?,
            completion_tokens: t.completion_tokens?,
            finishes_by_length: t.finish.as_ref().is_some_and(|f| f.kind == "length"),
            overlap: t.overlap,
            pd_decode,
        };
        // An abort arrives in the middle of an iteration and ends the request at some later
        // result: which iterations were its steps is not certain.
        let aborted = t.finish.as_ref().is_some_and(|f| f.kind == "abort");
        let handoffs = &self.handoffs;
        let view = (t.retractions_seen == 0 && t.steps_dropped == 0 && !aborted)
            .then(|| self.loops.view(&steps, &|ns| handoffs.taken_at(ns)))
            .flatten();
        if view.is_some() {
            self.stats.loop_requests_placed += 1;
        } else {
            self.stats.loop_requests_not_placed += 1;
        }
        view
    }

    /// Capture instants moved to the application's: when main's event loop or the scheduler
    /// took a message over, when main or the scheduler handed one to its I/O thread.
    fn trace(&mut self, mut outcome: SglangTrace) -> SglangTrace {
        for t in &mut outcome.engine {
            t.loop_view = self.loop_view(t);
        }
        let at = |ns: u64| self.handoffs.taken_at(ns);
        for t in &mut outcome.engine {
            t.sent_ns = at(t.sent_ns);
            t.dispatch_start_ns = self.dispatch_starts.started(t.frontend_pid, t.sent_ns);
            count(
                t.dispatch_start_ns,
                &mut self.stats.dispatch_starts,
                &mut self.stats.dispatch_starts_unknown,
            );
            if let Some(d) = &mut t.dp_controller {
                d.received_ns = d.received_ns.map(at);
                d.sent_ns = d.sent_ns.map(at);
                d.dispatch_start_ns = d
                    .sent_ns
                    .and_then(|sent| self.dispatch_starts.started(d.pid, sent));
                count(
                    d.dispatch_start_ns,
                    &mut self.stats.dpc_dispatch_starts,
                    &mut self.stats.dpc_dispatch_starts_unknown,
                );
            }
            t.scheduler_recv_ns = t.scheduler_recv_ns.map(at);
            for ns in &mut t.scheduler_output_ns {
                *ns = at(*ns);
            }
            t.first_output_ns = t.first_output_ns.map(at);
            t.last_output_ns = t.last_output_ns.map(at);
            t.finished_ns = t.finished_ns.map(at);
        }
        outcome
    }
}

/// One more instant found, or one more not.
fn count(found: Option<u64>, seen: &mut u64, unknown: &mut u64) {
    *if found.is_some() { seen } else { unknown } += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn title(t: &str) -> Vec<String> {
        vec![t.to_owned()]
    }

    #[test]
    fn the_main_process_command_line_gives_the_stream_interval() {
        let args = |s: &str| -> Vec<String> { s.split(' ').map(str::to_owned).collect() };
        let interval = |s: &str| server_stream_interval(&args(s));
        assert_eq!(
            interval("python -m sglang.launch_server --model-path m"),
            Some(1)
        );
        assert_eq!(
            interval("python -m sglang.launch_server --stream-interval 4 --port 1"),
            Some(4)
        );
        assert_eq!(
            interval("/venv/bin/sglang serve --stream-interval=2"),
            Some(2)
        );
        assert_eq!(
            interval("python -m sglang.launch_server --stream-interval x"),
            None
        );
        assert_eq!(interval("sglang::scheduler"), None);
        let role = |s: &str| server_pd_role(&args(s));
        assert_eq!(role("python -m sglang.launch_server --model-path m"), None);
        assert_eq!(
            role("python -m sglang.launch_server --disaggregation-mode decode"),
            Some(PdRole::Decode)
        );
        assert_eq!(
            role("/venv/bin/sglang serve --disaggregation-mode=prefill"),
            Some(PdRole::Prefill)
        );
        assert_eq!(
            role("python -m sglang.launch_server --disaggregation-mode null"),
            None
        );
        assert_eq!(role("sglang::scheduler --disaggregation-mode decode"), None);
        assert_eq!(
            interval("python -m vllm.entrypoints.openai.api_server"),
            None
        );
    }

    #[test]
    fn scheduler_titles_give_ranks() {
        let r = |tp, pp, dp| Some(Ranks { tp, pp, dp });
        assert_eq!(scheduler_ranks(&title("sglang::scheduler")), r(0, 0, None));
        assert_eq!(
            scheduler_ranks(&title("sglang::scheduler_TP1")),
            r(1, 0, None)
        );
        assert_eq!(
            scheduler_ranks(&title("sglang::scheduler_DP1_TP3")),
            r(3, 0, Some(1))
        );
        assert_eq!(
            scheduler_ranks(&title("sglang::scheduler_PP1_TP0_EP0")),
            r(0, 1, None)
        );
        assert_eq!(scheduler_ranks(&title("sglang::detokenizer")), None);
        assert!(is_dp_controller(&title("sglang::data_parallel_controller")));
        assert!(!is_dp_controller(&title("sglang::scheduler_DP0")));
        assert!(!is_dp_controller(&[]));
        assert_eq!(scheduler_ranks(&["python".into(), "-m".into()]), None);
        assert_eq!(scheduler_ranks(&[]), None);
    }

    #[test]
    fn a_receipt_decoded_before_its_send_still_times_the_request() {
        let mut tracker = SglangTracker::default();
        let request = |rid: &str| {
            SglangMessage::Request(Box::new(SglangRequest {
                rid: rid.into(),
                ..SglangRequest::default()
            }))
        };
        // The scheduler's read returned before main's write did.
        tracker.message(20, false, request("r1"), (900, 1_000), Handling::AtTakeOver);
        tracker.message(10, true, request("r1"), (950, 960), Handling::AtTakeOver);
        let t = tracker.in_flight.get_mut("r1").expect("in flight");
        assert_eq!(
            (t.scheduler_pid, t.scheduler_recv_ns),
            (Some(20), Some(1_000))
        );
        assert!(tracker.early_receipts.is_empty());
        // In order, as usual.
        tracker.message(
            10,
            true,
            request("r2"),
            (2_000, 2_010),
            Handling::AtTakeOver,
        );
        tracker.message(
            20,
            false,
            request("r2"),
            (2_020, 2_030),
            Handling::AtTakeOver,
        );
        let t = tracker.in_flight.get_mut("r2").expect("in flight");
        assert_eq!(
            (t.scheduler_pid, t.scheduler_recv_ns),
            (Some(20), Some(2_030))
        );
    }

    #[test]
    fn a_request_is_followed_through_the_dp_controller_in_whatever_order_its_hops_are_decoded() {
        let mut tracker = SglangTracker::default();
        let (main, controller, scheduler) = (10, 11, 12);
        let process = |pid: u32, title: &str| {
            Decoded::Process(crate::capture::ProcessInfo {
                pid,
                ppid: None,
                comm: String::new(),
                cmdline: vec![title.to_owned()],
            })
        };
        tracker.feed(&process(controller, "sglang::data_parallel_controller"));
        tracker.feed(&process(scheduler, "sglang::scheduler_DP1"));
        let request = |rid: &str| {
            SglangMessage::Request(Box::new(SglangRequest {
                rid: rid.into(),
                ..SglangRequest::default()
            }))
        };
        // In order: main's send, the controller's receipt and send, the scheduler's receipt.
        tracker.message(main, true, request("r1"), (100, 110), Handling::AtTakeOver);
        tracker.message(
            controller,
            false,
            request("r1"),
            (115, 120),
            Handling::AtTakeOver,
        );
        tracker.message(
            controller,
            true,
            request("r1"),
            (130, 140),
            Handling::AtTakeOver,
        );
        tracker.message(
            scheduler,
            false,
            request("r1"),
            (145, 150),
            Handling::AtTakeOver,
        );
        // The controller's and the scheduler's records decoded before main's send.
        tracker.message(
            controller,
            false,
            request("r2"),
            (215, 220),
            Handling::AtTakeOver,
        );
        tracker.message(
            controller,
            true,
            request("r2"),
            (230, 240),
            Handling::AtTakeOver,
        );
        tracker.message(
            scheduler,
            false,
            request("r2"),
            (245, 250),
            Handling::AtTakeOver,
        );
        tracker.message(main, true, request("r2"), (200, 210), Handling::AtTakeOver);
        for (rid, at) in [("r1", 0), ("r2", 100)] {
            let t = tracker.in_flight.get_mut(rid).expect("in flight");
            assert_eq!((t.frontend_pid, t.sent_ns), (main, 100 + at));
            let hop = t.dp_controller.expect("the controller's hop");
            assert_eq!(
                (hop.pid, hop.received_ns, hop.sent_ns),
                (controller, Some(120 + at), Some(130 + at))
            );
            assert_eq!(
                (t.scheduler_pid, t.scheduler_recv_ns),
                (Some(scheduler), Some(150 + at))
            );
            assert_eq!(t.scheduler_ranks.and_then(|r| r.dp), Some(1));
        }
        // The controller's sends are not requests of their own.
        assert_eq!(tracker.stats.requests, 2);
        assert!(tracker.early_receipts.is_empty());
    }

    #[test]
    fn a_retraction_is_put_on_the_request_whose_count_rose() {
        use crate::decode::flows::LogLine;
        let mut tracker = SglangTracker::default();
        let request = SglangMessage::Request(Box::new(SglangRequest {
            rid: "r1".into(),
            ..SglangRequest::default()
        }));
        tracker.message(10, true, request.clone(), (100, 110), Handling::AtTakeOver);
        tracker.message(20, false, request, (120, 130), Handling::AtTakeOver);
        let output = |retractions| {
            SglangMessage::Outputs(SglangOutputs {
                stage: OutputStage::TokenIds,
                items: vec![RidOutput {
                    rid: "r1".into(),
                    retractions: Some(retractions),
                    ..RidOutput::default()
                }],
                leading: None,
            })
        };
        tracker.message(20, true, output(0), (200, 210), Handling::AtTakeOver);
        let retract = |ns| {
            Decoded::Log(LogLine {
                tgid: 20,
                ns,
                line: "[t] KV cache pool is full. Retract requests. #retracted_reqs: 1".into(),
            })
        };
        tracker.feed(&retract(250));
        tracker.message(20, true, output(1), (300, 310), Handling::AtTakeOver);
        // Two retraction lines, one of them this request's: not placed.
        tracker.feed(&retract(350));
        tracker.feed(&retract(360));
        tracker.message(20, true, output(2), (400, 410), Handling::AtTakeOver);
        let t = tracker.in_flight.get_mut("r1").expect("in flight");
        assert_eq!(t.retracted_ns, vec![250]);
        assert_eq!(t.retractions_unplaced, 1);
        assert_eq!(
            (
                tracker.stats.retractions_placed,
                tracker.stats.retractions_unplaced
            ),
            (1, 1)
        );
    }
}
