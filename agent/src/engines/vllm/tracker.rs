//! vLLM V1: rebuilds each request's life from the API server's side of the ZeroMQ traffic
//! (ADD and ABORT it sends, EngineCoreOutputs it receives) and joins it to the HTTP call that
//! caused it.
//!
//! Only the frontend's copies are used (ADD *sent*, outputs *received*): the EngineCore's
//! copies of the same messages are seen too but would count everything twice. Engine times
//! (events, step timestamps) are the engine's `time.monotonic()`, the same clock as the capture
//! timestamps; `arrival_time` is the frontend's wall clock.
use std::collections::HashMap;

use super::wire::{
    EngineOutputs, EngineRequest, EventKind, FinishReason, InputMessage, RequestOutput, Sampling,
    SchedulerStats, VllmDecoder,
};
use crate::decode::flows::Decoded;
use crate::engines::common::{
    handoff::{Handling, HandoffStats, Handoffs},
    in_flight::InFlight,
    iteration_work::{IterationLaunches, IterationSamples},
    join::{ApiExchange, EngineRequestInfo, EngineSide, Joiner, Outcome},
    pd_role::PdRole,
};

/// Requests followed at once; beyond it the oldest is dropped and counted.
const MAX_IN_FLIGHT: usize = 65_536;
/// Requests whose outputs arrived before their ADD, held at once (see [`Orphan`]).
const MAX_ORPHANS: usize = 4096;
/// How long (capture time) outputs wait for their ADD.
const ORPHAN_WAIT_NS: u64 = 1_000_000_000;
/// Per-iteration records kept per request (granularity 2); later ones are counted, not kept.
pub const MAX_STEPS_PER_REQUEST: usize = 4096;
/// Steps reserved at most when a request arrives (see [`VllmTimeline::new`]).
const STEPS_RESERVED: usize = 128;

/// What one engine iteration did to a request (span events at granularity 2).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestStep {
    pub kind: StepKind,
    /// Engine CLOCK_MONOTONIC seconds.
    pub timestamp: f64,
    pub token_ids: Vec<u64>,
    pub logprobs: Option<Vec<f32>>,
    /// What the iteration launched on the GPU (CPU-side), when the CUDA probes saw it.
    pub gpu: Option<IterationLaunches>,
    /// The Python samples of the engine's threads during the iteration, when there were any.
    pub python: Option<IterationSamples>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    Wait,
    Prefill,
    Decode,
    Preempted,
}

/// One engine request from ADD to its end, as the frontend saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct VllmTimeline {
    pub request_id: String,
    pub external_id: Option<String>,
    pub sampling: Option<Sampling>,
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens served from a cache (prefix cache + remote KV), when the engine said.
    pub cached_tokens: Option<u64>,
    /// Frontend wall clock at arrival, seconds.
    pub arrival_time: f64,
    pub trace_headers: Vec<(String, String)>,
    pub pd_role: Option<PdRole>,
    /// Capture time (CLOCK_MONOTONIC ns) the frontend sent the ADD.
    pub add_sent_ns: u64,
    /// Engine event times, CLOCK_MONOTONIC seconds: first QUEUED, first SCHEDULED.
    pub queued: Option<f64>,
    pub scheduled: Option<f64>,
    /// Engine step timestamps of the first and last outputs with tokens.
    pub first_token: Option<f64>,
    pub last_token: Option<f64>,
    /// Capture times the frontend took over the first and the final output: when its event
    /// loop was woken for them (see `handoff`), else when their bytes arrived. A request the
    /// frontend aborted ends when it sent the ABORT.
    pub first_output_ns: Option<u64>,
    pub finished_ns: Option<u64>,
    /// Capture time the latest output was received.
    pub last_output_ns: Option<u64>,
    /// Capture times of every output received (for detokenization time), bounded.
    pub output_ns: Vec<u64>,
    pub completion_tokens: u64,
    pub preemptions: u32,
    pub finish_reason: Option<FinishReason>,
    /// The frontend sent ABORT (the client went away or the request was cancelled).
    pub aborted_by_frontend: bool,
    pub engine_index: Option<u64>,
    pub steps: Vec<RequestStep>,
    pub steps_dropped: u32,
}

impl VllmTimeline {
    fn new(request: &EngineRequest, ts_ns: u64) -> Self {
        Self {
            request_id: request.request_id.clone(),
            external_id: request.external_req_id.clone(),
            sampling: request.sampling.clone(),
            prompt_tokens: request.prompt_tokens,
            cached_tokens: None,
            arrival_time: request.arrival_time,
            trace_headers: request.trace_headers.clone(),
            pd_role: request.pd_role,
            add_sent_ns: ts_ns,
            queued: None,
            scheduled: None,
            first_token: None,
            last_token: None,
            first_output_ns: None,
            finished_ns: None,
            last_output_ns: None,
            output_ns: Vec::new(),
            completion_tokens: 0,
            preemptions: 0,
            finish_reason: None,
            aborted_by_frontend: false,
            engine_index: None,
            // Its wait, an output per token and one to spare, up to a bound: grown by
            // doubling instead, each step copied at each growth, this was 2 % of the agent on
            // a live vLLM load (and twice that of a replay).
            steps: Vec::with_capacity(
                request
                    .sampling
                    .as_ref()
                    .and_then(|s| s.max_tokens)
                    .map_or(0, |tokens| (tokens as usize).saturating_add(2))
                    .min(STEPS_RESERVED),
            ),
            steps_dropped: 0,
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// Whether the engine reported its QUEUED/SCHEDULED events (log stats on).
    pub fn has_engine_events(&self) -> bool {
        self.queued.is_some() && self.scheduled.is_some()
    }

    fn step(&mut self, step: RequestStep) {
        if self.steps.len() < MAX_STEPS_PER_REQUEST {
            self.steps.push(step);
        } else {
            self.steps_dropped += 1;
        }
    }

    /// Apply this request's part of an engine step received at `recv_ns`. Returns the prompt
    /// tokens to count when this was the request's first output (vLLM counts them then).
    fn apply(&mut self, out: RequestOutput, step_ts: f64, engine: u64, recv_ns: u64) -> u64 {
        self.engine_index = Some(engine);
        for event in &out.events {
            match event.kind {
                EventKind::Queued => {
                    self.queued.get_or_insert(event.timestamp);
                    self.step(RequestStep {
                        kind: StepKind::Wait,
                        timestamp: event.timestamp,
                        token_ids: Vec::new(),
                        logprobs: None,
                        gpu: None,
                        python: None,
                    });
                }
                // vLLM keeps the first SCHEDULED: preemptions do not reset it.
                EventKind::Scheduled => {
                    self.scheduled.get_or_insert(event.timestamp);
                }
                EventKind::Preempted => {
                    self.preemptions += 1;
                    self.step(RequestStep {
                        kind: StepKind::Preempted,
                        timestamp: event.timestamp,
                        token_ids: Vec::new(),
                        logprobs: None,
                        gpu: None,
                        python: None,
                    });
                }
                EventKind::Unknown(_) => {}
            }
        }
        let first = self.first_output_ns.is_none();
        let mut prompt_counted = 0;
        if first {
            self.first_output_ns = Some(recv_ns);
            // vLLM stamps the first token with the step time of the request's first output.
            self.first_token = Some(step_ts);
            if let Some(prefill) = &out.prefill {
                self.cached_tokens = Some(prefill.cached);
                if prefill.prompt.is_some() {
                    self.prompt_tokens = prefill.prompt;
                }
            }
            prompt_counted = self.prompt_tokens.unwrap_or(0);
        }
        self.last_token = Some(step_ts);
        self.last_output_ns = Some(recv_ns);
        if self.output_ns.len() < MAX_STEPS_PER_REQUEST {
            self.output_ns.push(recv_ns);
        }
        self.completion_tokens += out.new_token_ids.len() as u64;
        self.step(RequestStep {
            kind: if first {
                StepKind::Prefill
            } else {
                StepKind::Decode
            },
            timestamp: step_ts,
            token_ids: out.new_token_ids,
            logprobs: out.logprobs,
            gpu: None,
            python: None,
        });
        if let Some(reason) = out.finish_reason {
            self.finish_reason = Some(reason);
            self.finished_ns = Some(recv_ns);
        }
        prompt_counted
    }
}

impl EngineRequestInfo for VllmTimeline {
    fn api_id(&self) -> &str {
        self.external_id.as_deref().unwrap_or(&self.request_id)
    }

    fn sent_ns(&self) -> u64 {
        self.add_sent_ns
    }

    fn done_ns(&self) -> u64 {
        self.finished_ns.unwrap_or(self.add_sent_ns)
    }
}

/// Outputs of a request whose ADD has not been decoded (yet). Messages of different sockets are
/// decoded independently, so an ADD can be handed over after the first outputs for it (e.g.
/// while the ADD's stream is still being resynchronised after attach); they are held briefly
/// and applied when the ADD comes. Requests sent before attach never get one.
struct Orphan {
    first_seen_ns: u64,
    outputs: Vec<(RequestOutput, f64, u64, u64)>,
}

/// What one engine step changed, for the metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// False for a report of late-applied outputs, which is not an engine iteration.
    pub iteration: bool,
    pub engine_index: u64,
    /// The process that received the step's outputs (the API server).
    pub frontend: u32,
    /// The engine's stamp of the step (CLOCK_MONOTONIC seconds).
    pub timestamp: f64,
    /// The step reported its scheduler state (log stats on).
    pub scheduler: Option<SchedulerStats>,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
}

/// What a call's engine requests add to its entry span: the prompt (counted once for n>1),
/// the tokens generated over all of them, and when the last one ended.
pub fn engine_side(engine: &[VllmTimeline]) -> EngineSide {
    EngineSide {
        input_tokens: engine.iter().find_map(|e| e.prompt_tokens),
        output_tokens: (!engine.is_empty())
            .then(|| engine.iter().map(|e| e.completion_tokens).sum()),
        finished_ns: engine.iter().filter_map(|e| e.finished_ns).max(),
    }
}

/// A finished request: the API call (when seen) and the engine requests it made.
#[derive(Clone, Debug, PartialEq)]
pub struct VllmTrace {
    pub api: Option<ApiExchange>,
    pub engine: Vec<VllmTimeline>,
}

/// Output of the tracker, in the order things completed.
#[derive(Clone, Debug, PartialEq)]
pub enum VllmEvent {
    Step(StepReport),
    Request(Box<VllmTrace>),
}

/// Counters of what the tracker could not use.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct VllmStats {
    pub adds: u64,
    pub steps: u64,
    /// Messages that looked like vLLM's but did not decode.
    pub undecodable: u64,
    /// Requests with outputs whose ADD was never seen (sent before attach, or lost).
    pub requests_without_add: u64,
    /// Requests dropped because too many were in flight.
    pub evicted: u64,
    /// Requests still unfinished when the session ended (not reported).
    pub unfinished_at_end: u64,
}

/// The vLLM request tracker: decoded messages in, finished requests and step reports out.
pub struct VllmTracker {
    decoder: VllmDecoder,
    in_flight: InFlight<VllmTimeline>,
    joiner: Joiner<VllmTimeline>,
    /// Requests the frontend aborted, with when: vLLM drops their later outputs uncounted,
    /// and so do we.
    aborted: HashMap<String, u64>,
    orphans: HashMap<String, Orphan>,
    handoffs: Handoffs,
    /// Latest capture time seen.
    now_ns: u64,
    pub stats: VllmStats,
}

impl VllmTracker {
    pub fn new(decoder: VllmDecoder) -> Self {
        Self {
            decoder,
            in_flight: InFlight::new(MAX_IN_FLIGHT),
            joiner: Joiner::default(),
            aborted: HashMap::new(),
            orphans: HashMap::new(),
            handoffs: Handoffs::default(),
            now_ns: 0,
            stats: VllmStats::default(),
        }
    }

    pub fn decoder(&self) -> &VllmDecoder {
        &self.decoder
    }

    /// How the frontend instants were found.
    /// Requests being followed now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn handoff_stats(&self) -> HandoffStats {
        self.handoffs.stats
    }

    /// Take one decoded message; finished requests and steps go to `out`.
    pub fn feed(&mut self, decoded: &Decoded, out: &mut Vec<VllmEvent>) {
        self.now_ns = self.now_ns.max(decoded.end_ns());
        match decoded {
            Decoded::Http { exchange, .. } => {
                if let Some(api) = ApiExchange::from_exchange(exchange) {
                    self.joiner.add_api(api, self.now_ns);
                }
            }
            Decoded::Zmtp {
                outgoing: true,
                message,
                ..
            } => match self.decoder.input(&message.frames) {
                Some(Ok(InputMessage::Add(request))) => {
                    self.stats.adds += 1;
                    self.start(VllmTimeline::new(&request, message.first_ns), out);
                }
                Some(Ok(InputMessage::Abort(ids))) => {
                    if self.aborted.len() >= MAX_IN_FLIGHT {
                        self.aborted.clear();
                    }
                    for id in ids {
                        self.orphans.remove(&id);
                        if let Some(t) = self.in_flight.remove(&id) {
                            self.aborted_by_frontend(t, message.first_ns);
                        }
                        self.aborted.insert(id, message.first_ns);
                    }
                }
                Some(Ok(InputMessage::Control(_))) | None => {}
                Some(Err(e)) => self.undecodable(&e),
            },
            Decoded::Zmtp {
                tgid,
                outgoing: false,
                message,
                ..
            } => match self.decoder.outputs(&message.frames) {
                Some(Ok(step)) => {
                    // Any output may be asked about: a first token, a finish, the output
                    // that completed a stop string.
                    let keep = !step.is_utility && !step.outputs.is_empty();
                    self.handoffs
                        .received(*tgid, message.last_ns, keep, Handling::NextIteration);
                    if !step.is_utility {
                        let mut report = self.step(step, message.last_ns);
                        report.frontend = *tgid;
                        out.push(VllmEvent::Step(report));
                    }
                }
                None => {}
                Some(Err(e)) => self.undecodable(&e),
            },
            Decoded::Wakeup(wakeup) => self.handoffs.wakeup(wakeup),
            Decoded::LoopWait(wait) => self.handoffs.loop_waited(wait),
            // GPU steps and Python samples go to the pipeline's own stages; vLLM's sends are
            // timed at their write; its loops are followed by their epoll waits.
            Decoded::Process(_)
            | Decoded::Traced(_)
            | Decoded::Pod { .. }
            | Decoded::Exited { .. }
            | Decoded::MailboxPoll(_)
            | Decoded::Cuda(_)
            | Decoded::PySample(_)
            | Decoded::Handover(_)
            | Decoded::Serializing(_)
            | Decoded::Log(_)
            | Decoded::Clock(_) => {}
        }
    }

    /// Report what has waited long enough at capture time `now_ns` (call after each batch and
    /// on a timer, so that results come out when traffic stops).
    pub fn advance(&mut self, now_ns: u64, out: &mut Vec<VllmEvent>) {
        self.now_ns = self.now_ns.max(now_ns);
        let before = self.orphans.len();
        let cutoff = self.now_ns.saturating_sub(ORPHAN_WAIT_NS);
        self.orphans.retain(|_, o| o.first_seen_ns > cutoff);
        self.stats.requests_without_add += (before - self.orphans.len()) as u64;
        for outcome in self.joiner.advance(self.now_ns) {
            out.push(VllmEvent::Request(Box::new(self.trace(outcome))));
        }
    }

    fn undecodable(&mut self, error: &crate::engines::vllm::wire::VllmError) {
        self.stats.undecodable += 1;
        tracing::debug!("undecodable vLLM message: {error}");
    }

    fn aborted_by_frontend(&mut self, mut t: VllmTimeline, at_ns: u64) {
        t.aborted_by_frontend = true;
        t.finish_reason = Some(FinishReason::Abort);
        t.finished_ns = Some(at_ns);
        self.joiner.add_engine(t);
    }

    fn start(&mut self, mut timeline: VllmTimeline, out: &mut Vec<VllmEvent>) {
        let id = timeline.request_id.clone();
        if let Some(orphan) = self.orphans.remove(&id) {
            let mut report = StepReport::default();
            for (output, step_ts, engine, recv_ns) in orphan.outputs {
                report.engine_index = engine;
                report.prompt_tokens += timeline.apply(output, step_ts, engine, recv_ns);
            }
            out.push(VllmEvent::Step(report));
            if timeline.is_finished() {
                self.joiner.add_engine(timeline);
                return;
            }
        }
        if let Some(&at_ns) = self.aborted.get(&id) {
            self.aborted_by_frontend(timeline, at_ns);
            return;
        }
        self.stats.evicted += self.in_flight.insert(timeline.request_id.clone(), timeline);
    }

    /// Apply an engine step's outputs, each moved into its request's timeline.
    fn step(&mut self, step: EngineOutputs, recv_ns: u64) -> StepReport {
        self.stats.steps += 1;
        let mut report = StepReport {
            iteration: !step.outputs.is_empty(),
            engine_index: step.engine_index,
            timestamp: step.timestamp,
            scheduler: step.scheduler_stats,
            ..StepReport::default()
        };
        for out in step.outputs {
            if self.aborted.contains_key(&out.request_id) {
                continue;
            }
            report.generation_tokens += out.new_token_ids.len() as u64;
            report.preemptions += out
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Preempted)
                .count() as u64;
            let Some(timeline) = self.in_flight.get_mut(&out.request_id) else {
                self.orphan(out, step.timestamp, step.engine_index, recv_ns);
                continue;
            };
            report.prompt_tokens += timeline.apply(out, step.timestamp, step.engine_index, recv_ns);
            if timeline.is_finished() {
                let id = timeline.request_id.clone();
                if let Some(t) = self.in_flight.remove(&id) {
                    self.joiner.add_engine(t);
                }
            }
        }
        report
    }

    /// Hold `out`, of a step at engine time `step_ts` of engine `engine`, until its ADD comes.
    fn orphan(&mut self, out: RequestOutput, step_ts: f64, engine: u64, recv_ns: u64) {
        if !self.orphans.contains_key(&out.request_id) && self.orphans.len() >= MAX_ORPHANS {
            self.stats.requests_without_add += 1;
            return;
        }
        let orphan = self
            .orphans
            .entry(out.request_id.clone())
            .or_insert_with(|| Orphan {
                first_seen_ns: recv_ns,
                outputs: Vec::new(),
            });
        if orphan.outputs.len() < MAX_STEPS_PER_REQUEST {
            orphan.outputs.push((out, step_ts, engine, recv_ns));
        }
    }

    /// A joined request as reported: frontend instants moved to when the event loop took the
    /// outputs over, and frontend aborts that were vLLM's own stop-string finishes told apart.
    fn trace(&self, outcome: Outcome<VllmTimeline>) -> VllmTrace {
        let mut engine = outcome.engine;
        // vLLM's frontend also sends ABORT for a request it finished itself: a stop string is
        // matched during detokenization, in the API server, which then tells the engine to
        // stop. Such a request's response is complete (a client that went away leaves it cut
        // short or missing), and vLLM counts it as finished with reason stop, at the output
        // that completed the string.
        let own_stop = outcome
            .api
            .as_ref()
            .is_some_and(|api| api.complete && api.call.status == Some(200));
        for t in &mut engine {
            if own_stop && t.aborted_by_frontend {
                t.aborted_by_frontend = false;
                t.finish_reason = Some(FinishReason::Stop);
                t.finished_ns = t.last_output_ns.or(t.finished_ns);
            }
            t.first_output_ns = t.first_output_ns.map(|ns| self.handoffs.taken_at(ns));
            if !t.aborted_by_frontend {
                t.finished_ns = t.finished_ns.map(|ns| self.handoffs.taken_at(ns));
            }
        }
        VllmTrace {
            api: outcome.api,
            engine,
        }
    }

    /// End of the session: report everything finished; unfinished requests are counted.
    pub fn finish(&mut self, out: &mut Vec<VllmEvent>) {
        self.stats.unfinished_at_end += self.in_flight.clear() as u64;
        self.stats.requests_without_add += self.orphans.len() as u64;
        self.orphans.clear();
        for outcome in self.joiner.finish() {
            out.push(VllmEvent::Request(Box::new(self.trace(outcome))));
        }
    }
}

#[cfg(test)]
mod tests {
    use rmpv::Value;

    use super::*;
    use crate::decode::{
        http::{HttpExchange, HttpRequest, HttpResponse},
        zmtp::ZmtpMessage,
    };
    use crate::engines::common::join::{ABANDONED_GRACE_NS, GRACE_NS};
    use crate::engines::vllm::wire::SCHEMAS;

    const MS: u64 = 1_000_000;
    /// Capture time (CLOCK_MONOTONIC ns) around which the tests happen: 1000 s.
    const T0: u64 = 1_000_000_000_000;
    /// A ZeroMQ message's first byte is captured this long before its last.
    const MSG_NS: u64 = 2_000;
    /// Frontend wall clock at arrival, seconds.
    const ARRIVAL: f64 = 1_760_000_000.25;

    fn enc(value: &Value) -> Vec<u8> {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, value).expect("encode");
        bytes
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    fn map(entries: Vec<(&str, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    fn ids(tokens: &[u64]) -> Value {
        Value::Array(tokens.iter().map(|&t| Value::from(t)).collect())
    }

    fn tracker() -> VllmTracker {
        VllmTracker::new(VllmDecoder::new(SCHEMAS[1]))
    }

    /// A ZeroMQ message completed at `at` (its first byte [`MSG_NS`] earlier).
    fn zmtp(outgoing: bool, at: u64, frames: Vec<Vec<u8>>) -> Decoded {
        Decoded::Zmtp {
            tgid: 7,
            fd: 30,
            outgoing,
            message: ZmtpMessage {
                first_ns: at - MSG_NS,
                last_ns: at,
                frames,
            },
        }
    }

    fn sampling(max_tokens: u64) -> Value {
        map(vec![
            ("temperature", Value::F64(0.0)),
            ("max_tokens", Value::from(max_tokens)),
        ])
    }

    /// ADD of vLLM 0.14+: an `EngineCoreRequest` of 22 fields.
    fn add(at: u64, id: &str, external: Option<&str>, prompt: u64, sampling: Value) -> Decoded {
        let mut f = vec![Value::Nil; 22];
        f[0] = s(id);
        f[1] = ids(&(0..prompt).map(|t| 100 + t).collect::<Vec<_>>());
        f[3] = sampling;
        f[5] = Value::F64(ARRIVAL);
        f[11] = Value::from(0);
        f[12] = Value::from(0);
        f[13] = Value::from(0);
        f[15] = Value::Boolean(false);
        f[16] = external.map_or(Value::Nil, s);
        zmtp(true, at, vec![vec![0x00], enc(&Value::Array(f))])
    }

    fn abort(at: u64, request_ids: &[&str]) -> Decoded {
        let list = Value::Array(request_ids.iter().map(|id| s(id)).collect());
        zmtp(true, at, vec![vec![0x01], enc(&list)])
    }

    /// An `EngineCoreOutput` (12 fields, the optional ones nil).
    fn output(id: &str, tokens: &[u64]) -> Vec<Value> {
        let mut f = vec![Value::Nil; 12];
        f[0] = s(id);
        f[1] = ids(tokens);
        f
    }

    fn finishing(mut f: Vec<Value>, reason: u64) -> Vec<Value> {
        f[5] = Value::from(reason);
        f
    }

    /// Events as (type, timestamp): 1 QUEUED, 2 SCHEDULED, 3 PREEMPTED.
    fn with_events(mut f: Vec<Value>, events: &[(u64, f64)]) -> Vec<Value> {
        f[7] = Value::Array(
            events
                .iter()
                .map(|&(kind, ts)| {
                    map(vec![
                        ("type", Value::from(kind)),
                        ("timestamp", Value::F64(ts)),
                    ])
                })
                .collect(),
        );
        f
    }

    fn with_prefill(mut f: Vec<Value>, prompt: u64, cached: u64) -> Vec<Value> {
        f[11] = map(vec![
            ("num_prompt_tokens", Value::from(prompt)),
            ("num_cached_tokens", Value::from(cached)),
        ]);
        f
    }

    /// One `EngineCoreOutputs` received by the frontend at `at`.
    fn step(
        at: u64,
        engine: u64,
        ts: f64,
        outputs: Vec<Vec<Value>>,
        scheduler: Option<Value>,
    ) -> Decoded {
        let body = Value::Array(vec![
            Value::from(engine),
            Value::Array(outputs.into_iter().map(Value::Array).collect()),
            scheduler.unwrap_or(Value::Nil),
            Value::F64(ts),
        ]);
        zmtp(false, at, vec![enc(&body)])
    }

    fn scheduler(running: u64, waiting: u64, usage: f64) -> Value {
        map(vec![
            ("num_running_reqs", Value::from(running)),
            ("num_waiting_reqs", Value::from(waiting)),
            ("kv_cache_usage", Value::F64(usage)),
            (
                "prefix_cache_stats",
                map(vec![
                    ("reset", Value::Boolean(false)),
                    ("requests", Value::from(1)),
                    ("queries", Value::from(16)),
                    ("hits", Value::from(8)),
                ]),
            ),
        ])
    }

    /// An HTTP exchange: request body received by `req_at`, response (status, JSON body)
    /// completed at `resp_at`; no response when the client went away.
    fn http(
        path: &str,
        body: &str,
        response: Option<(u16, &str)>,
        req_at: u64,
        resp_at: u64,
    ) -> Decoded {
        let json = || vec![("content-type".to_owned(), b"application/json".to_vec())];
        Decoded::Http {
            tgid: 7,
            fd: 26,
            exchange: Box::new(HttpExchange {
                request: Some(HttpRequest {
                    method: "POST".into(),
                    path: path.into(),
                    version: 1,
                    headers: json(),
                    body: body.as_bytes().to_vec(),
                    first_ns: req_at - 1_000,
                    last_ns: req_at,
                    body_truncated: false,
                }),
                response: response.map(|(status, body)| HttpResponse {
                    status,
                    reason: "OK".into(),
                    version: 1,
                    headers: json(),
                    body: body.as_bytes().to_vec(),
                    first_ns: resp_at - 1_000,
                    last_ns: resp_at,
                    sse_events: Vec::new(),
                    body_truncated: false,
                    sse_truncated: false,
                    body_elided: 0,
                }),
                complete: response.is_some(),
            }),
        }
    }

    const CHAT_BODY: &str =
        r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;

    fn chat_response(id: &str, finish_reason: &str) -> String {
        format!(
            r#"{{"id":"{id}","model":"tiny","choices":[{{"index":0,"message":{{"role":"assistant","content":"abc"}},"finish_reason":"{finish_reason}"}}],"usage":{{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}}}"#
        )
    }

    fn feed(t: &mut VllmTracker, messages: &[Decoded]) -> Vec<VllmEvent> {
        let mut out = Vec::new();
        for m in messages {
            t.feed(m, &mut out);
        }
        out
    }

    fn step_reports(events: &[VllmEvent]) -> Vec<StepReport> {
        events
            .iter()
            .filter_map(|e| match e {
                VllmEvent::Step(s) => Some(s.clone()),
                VllmEvent::Request(_) => None,
            })
            .collect()
    }

    fn traces(events: &[VllmEvent]) -> Vec<VllmTrace> {
        events
            .iter()
            .filter_map(|e| match e {
                VllmEvent::Request(r) => Some((**r).clone()),
                VllmEvent::Step(_) => None,
            })
            .collect()
    }

    fn advance(t: &mut VllmTracker, now: u64) -> Vec<VllmTrace> {
        let mut out = Vec::new();
        t.advance(now, &mut out);
        assert!(step_reports(&out).is_empty());
        traces(&out)
    }

    fn finish(t: &mut VllmTracker) -> Vec<VllmTrace> {
        let mut out = Vec::new();
        t.finish(&mut out);
        traces(&out)
    }

    fn kinds(t: &VllmTimeline) -> Vec<StepKind> {
        t.steps.iter().map(|s| s.kind).collect()
    }

    #[test]
    fn a_request_is_joined_to_its_call_after_the_grace_period() {
        const ID: &str = "chatcmpl-X-abcdef12";
        let mut t = tracker();
        let response = chat_response("chatcmpl-X", "length");
        let events = feed(
            &mut t,
            &[
                add(T0, ID, Some("chatcmpl-X"), 5, sampling(4)),
                step(
                    T0 + 60 * MS,
                    0,
                    1000.050,
                    vec![with_prefill(
                        with_events(output(ID, &[11]), &[(1, 1000.001), (2, 1000.010)]),
                        5,
                        2,
                    )],
                    Some(scheduler(1, 0, 0.25)),
                ),
                step(T0 + 80 * MS, 0, 1000.070, vec![output(ID, &[12])], None),
                step(
                    T0 + 100 * MS,
                    0,
                    1000.090,
                    vec![finishing(output(ID, &[13]), 1)],
                    None,
                ),
                http(
                    "/v1/chat/completions",
                    CHAT_BODY,
                    Some((200, &response)),
                    T0 - 5 * MS,
                    T0 + 105 * MS,
                ),
            ],
        );
        assert!(traces(&events).is_empty());
        assert_eq!(step_reports(&events).len(), 3);
        assert_eq!((t.stats.adds, t.stats.steps), (1, 3));

        // Both sides wait GRACE_NS after the response's last byte.
        let end = T0 + 105 * MS;
        assert!(advance(&mut t, end + GRACE_NS - 1).is_empty());
        let done = advance(&mut t, end + GRACE_NS);
        assert_eq!(done.len(), 1);
        let api = done[0].api.as_ref().expect("joined to its call");
        assert_eq!(api.call.response_id.as_deref(), Some("chatcmpl-X"));
        assert_eq!(api.call.status, Some(200));
        let [e] = done[0].engine.as_slice() else {
            panic!("one engine request: {:?}", done[0].engine);
        };
        assert_eq!(e.request_id, ID);
        assert_eq!(e.external_id.as_deref(), Some("chatcmpl-X"));
        assert_eq!(e.arrival_time, ARRIVAL);
        assert_eq!(e.add_sent_ns, T0 - MSG_NS, "ADD: its first byte");
        assert_eq!(e.queued, Some(1000.001));
        assert_eq!(e.scheduled, Some(1000.010));
        assert_eq!(e.first_token, Some(1000.050));
        assert_eq!(e.last_token, Some(1000.090));
        assert_eq!(e.completion_tokens, 3);
        assert_eq!(e.prompt_tokens, Some(5));
        assert_eq!(e.cached_tokens, Some(2));
        assert_eq!(e.finish_reason, Some(FinishReason::Length));
        // Outputs: the capture time of their last byte.
        assert_eq!(e.first_output_ns, Some(T0 + 60 * MS));
        assert_eq!(e.finished_ns, Some(T0 + 100 * MS));
        assert_eq!(e.output_ns, [T0 + 60 * MS, T0 + 80 * MS, T0 + 100 * MS]);
        assert_eq!(e.engine_index, Some(0));
        assert_eq!(e.preemptions, 0);
        assert!(!e.aborted_by_frontend);
        assert!(e.has_engine_events());
        assert_eq!(
            kinds(e),
            [
                StepKind::Wait,
                StepKind::Prefill,
                StepKind::Decode,
                StepKind::Decode
            ]
        );
        assert_eq!(e.steps[1].token_ids, [11]);
        assert_eq!(e.steps[1].timestamp, 1000.050);
        assert_eq!(e.sampling.as_ref().and_then(|s| s.max_tokens), Some(4));
        // Nothing left behind.
        assert!(finish(&mut t).is_empty());
        assert_eq!(t.stats.unfinished_at_end, 0);
        assert_eq!(t.stats.requests_without_add, 0);
    }

    fn wake(at: u64, write: bool) -> Decoded {
        Decoded::Wakeup(crate::decode::flows::Wakeup {
            tgid: 7,
            tid: if write { 8 } else { 7 },
            fd: 23,
            ns: at,
            write,
        })
    }

    #[test]
    fn outputs_are_timed_when_the_event_loop_took_them_over() {
        const WARM: &str = "cmpl-w-0-abcdef12";
        const ID: &str = "cmpl-a-0-abcdef12";
        let mut t = tracker();
        // Each output wakes the loop 20 µs after it arrives; the loop reads 4 ms later.
        let mut messages = vec![add(T0, WARM, None, 5, sampling(3))];
        let signalled = |messages: &mut Vec<Decoded>, at: u64, output: Vec<Value>| {
            messages.push(step(at, 0, 1.0, vec![output], None));
            messages.push(wake(at + 20_000, true));
            messages.push(wake(at + 4 * MS, false));
        };
        // Three outputs teach the tracker which eventfd is the mailbox.
        signalled(&mut messages, T0 + 10 * MS, output(WARM, &[1]));
        signalled(&mut messages, T0 + 20 * MS, output(WARM, &[2]));
        signalled(
            &mut messages,
            T0 + 30 * MS,
            finishing(output(WARM, &[3]), 1),
        );
        messages.push(add(T0 + 35 * MS, ID, None, 5, sampling(2)));
        signalled(&mut messages, T0 + 40 * MS, output(ID, &[1]));
        signalled(&mut messages, T0 + 50 * MS, finishing(output(ID, &[2]), 1));
        feed(&mut t, &messages);
        let done = finish(&mut t);
        let timeline = |id: &str| {
            done.iter()
                .flat_map(|d| &d.engine)
                .find(|e| e.request_id == id)
                .cloned()
                .unwrap()
        };
        let warm = timeline(WARM);
        assert_eq!(
            warm.first_output_ns,
            Some(T0 + 10 * MS),
            "mailbox not known yet"
        );
        assert_eq!(warm.finished_ns, Some(T0 + 34 * MS));
        let a = timeline(ID);
        assert_eq!(a.first_output_ns, Some(T0 + 44 * MS));
        assert_eq!(a.finished_ns, Some(T0 + 54 * MS));
        // Arrivals stay the arrivals.
        assert_eq!(a.output_ns, [T0 + 40 * MS, T0 + 50 * MS]);
        assert_eq!(
            t.handoff_stats(),
            HandoffStats {
                taken_over: 3,
                at_arrival: 2,
                ..HandoffStats::default()
            }
        );
    }

    #[test]
    fn step_reports_count_tokens_preemptions_and_iterations() {
        const A: &str = "cmpl-A-0-aaaaaaaa";
        const B: &str = "cmpl-B-0-bbbbbbbb";
        let mut t = tracker();
        let events = feed(
            &mut t,
            &[
                add(T0, A, Some("cmpl-A-0"), 5, sampling(8)),
                add(T0 + MS, B, Some("cmpl-B-0"), 3, sampling(8)),
                step(
                    T0 + 10 * MS,
                    1,
                    10.0,
                    vec![with_prefill(
                        with_events(output(A, &[1]), &[(1, 9.0), (2, 9.5)]),
                        5,
                        0,
                    )],
                    Some(scheduler(1, 1, 0.5)),
                ),
                step(
                    T0 + 20 * MS,
                    1,
                    10.1,
                    vec![
                        output(A, &[2]),
                        with_prefill(with_events(output(B, &[7, 8]), &[(1, 9.1)]), 3, 1),
                    ],
                    None,
                ),
                step(
                    T0 + 30 * MS,
                    1,
                    10.2,
                    vec![finishing(output(B, &[9]), 1)],
                    None,
                ),
                // A step without outputs is not an iteration.
                step(T0 + 40 * MS, 1, 10.3, vec![], Some(scheduler(0, 1, 0.1))),
                // A was preempted and scheduled again: its prompt is not counted again.
                step(
                    T0 + 50 * MS,
                    1,
                    10.4,
                    vec![finishing(
                        with_events(output(A, &[3]), &[(3, 10.25), (2, 10.35)]),
                        0,
                    )],
                    None,
                ),
            ],
        );
        let stats = |n_running, n_waiting, usage| {
            Some(SchedulerStats {
                num_running_reqs: n_running,
                num_waiting_reqs: n_waiting,
                kv_cache_usage: usage,
                prefix_cache: Some(crate::engines::vllm::wire::PrefixCacheStats {
                    reset: false,
                    requests: 1,
                    queries: 16,
                    hits: 8,
                }),
                step_counter: None,
            })
        };
        let report =
            |timestamp, iteration, scheduler, prompt_tokens, generation_tokens, preemptions| {
                StepReport {
                    iteration,
                    engine_index: 1,
                    frontend: 7,
                    timestamp,
                    scheduler,
                    prompt_tokens,
                    generation_tokens,
                    preemptions,
                }
            };
        assert_eq!(
            step_reports(&events),
            [
                report(10.0, true, stats(1, 1, 0.5), 5, 1, 0),
                report(10.1, true, None, 3, 3, 0),
                report(10.2, true, None, 0, 1, 0),
                report(10.3, false, stats(0, 1, 0.1), 0, 0, 0),
                report(10.4, true, None, 0, 1, 1),
            ]
        );
        let done = finish(&mut t);
        assert_eq!(done.len(), 2);
        let a = done
            .iter()
            .flat_map(|d| &d.engine)
            .find(|e| e.request_id == A)
            .expect("A reported");
        assert_eq!(a.preemptions, 1);
        // vLLM keeps the first SCHEDULED.
        assert_eq!(a.scheduled, Some(9.5));
        assert_eq!(a.completion_tokens, 3);
        assert_eq!(a.engine_index, Some(1));
        assert_eq!(
            kinds(a),
            [
                StepKind::Wait,
                StepKind::Prefill,
                StepKind::Decode,
                StepKind::Preempted,
                StepKind::Decode
            ]
        );
        assert_eq!(a.steps[3].timestamp, 10.25);
        let b = done
            .iter()
            .flat_map(|d| &d.engine)
            .find(|e| e.request_id == B)
            .expect("B reported");
        assert_eq!(b.completion_tokens, 3);
        assert_eq!(b.cached_tokens, Some(1));
        assert_eq!(b.steps[1].token_ids, [7, 8]);
        // QUEUED only (SCHEDULED missing): no engine events for the spans.
        assert!(!b.has_engine_events());
    }

    #[test]
    fn outputs_before_their_add_are_applied_when_it_comes() {
        const O: &str = "cmpl-O-0-cccccccc";
        const P: &str = "cmpl-P-0-dddddddd";
        let mut t = tracker();
        let early = feed(
            &mut t,
            &[
                step(
                    T0,
                    0,
                    5.0,
                    vec![
                        with_prefill(with_events(output(O, &[1]), &[(1, 4.0), (2, 4.5)]), 4, 0),
                        with_prefill(output(P, &[5]), 6, 0),
                    ],
                    None,
                ),
                step(
                    T0 + 20 * MS,
                    0,
                    5.1,
                    vec![finishing(output(O, &[2]), 0)],
                    None,
                ),
            ],
        );
        // Tokens count when they arrive, the prompt only with the ADD.
        assert_eq!(
            step_reports(&early)
                .iter()
                .map(|r| (r.iteration, r.prompt_tokens, r.generation_tokens))
                .collect::<Vec<_>>(),
            [(true, 0, 2), (true, 0, 1)]
        );
        // Still waiting just before a second has passed.
        assert!(advance(&mut t, T0 + ORPHAN_WAIT_NS - 1).is_empty());
        assert_eq!(t.stats.requests_without_add, 0);

        // The ADDs, decoded late (sent before the outputs).
        let late = feed(
            &mut t,
            &[
                add(T0 - 40 * MS, O, Some("cmpl-O-0"), 4, sampling(2)),
                add(T0 - 30 * MS, P, Some("cmpl-P-0"), 6, sampling(2)),
            ],
        );
        let orphan_report = |prompt_tokens| StepReport {
            iteration: false,
            engine_index: 0,
            frontend: 0,
            timestamp: 0.0,
            scheduler: None,
            prompt_tokens,
            generation_tokens: 0,
            preemptions: 0,
        };
        assert_eq!(step_reports(&late), [orphan_report(4), orphan_report(6)]);
        // P goes on as a request in flight.
        let rest = feed(
            &mut t,
            &[step(
                T0 + ORPHAN_WAIT_NS,
                0,
                6.0,
                vec![finishing(output(P, &[6]), 1)],
                None,
            )],
        );
        assert_eq!(step_reports(&rest)[0].generation_tokens, 1);
        assert_eq!(step_reports(&rest)[0].prompt_tokens, 0);

        let done = finish(&mut t);
        assert_eq!(t.stats.requests_without_add, 0);
        assert_eq!(t.stats.unfinished_at_end, 0);
        let o = &done
            .iter()
            .find(|d| d.engine[0].request_id == O)
            .expect("O")
            .engine[0];
        assert_eq!(o.add_sent_ns, T0 - 40 * MS - MSG_NS);
        assert_eq!(o.queued, Some(4.0));
        assert_eq!(o.scheduled, Some(4.5));
        assert_eq!((o.first_token, o.last_token), (Some(5.0), Some(5.1)));
        assert_eq!(o.first_output_ns, Some(T0));
        assert_eq!(o.finished_ns, Some(T0 + 20 * MS));
        assert_eq!(o.completion_tokens, 2);
        assert_eq!(o.finish_reason, Some(FinishReason::Stop));
        let p = &done
            .iter()
            .find(|d| d.engine[0].request_id == P)
            .expect("P")
            .engine[0];
        assert_eq!(p.completion_tokens, 2);
        assert_eq!(p.prompt_tokens, Some(6));
        assert_eq!(p.finish_reason, Some(FinishReason::Length));
        assert_eq!(kinds(p), [StepKind::Prefill, StepKind::Decode]);
    }

    #[test]
    fn outputs_whose_add_never_comes_are_counted_after_a_second() {
        let mut t = tracker();
        let events = feed(
            &mut t,
            &[
                step(T0, 0, 5.0, vec![output("ghost-1", &[1])], None),
                step(T0 + 500 * MS, 0, 5.5, vec![output("ghost-2", &[1])], None),
                step(T0 + 600 * MS, 0, 5.6, vec![output("ghost-1", &[2])], None),
            ],
        );
        assert_eq!(
            step_reports(&events)
                .iter()
                .map(|r| r.generation_tokens)
                .sum::<u64>(),
            3
        );
        assert!(advance(&mut t, T0 + ORPHAN_WAIT_NS - 1).is_empty());
        assert_eq!(t.stats.requests_without_add, 0);
        // Counted from its first output, not its latest.
        assert!(advance(&mut t, T0 + ORPHAN_WAIT_NS).is_empty());
        assert_eq!(t.stats.requests_without_add, 1);
        assert!(advance(&mut t, T0 + 500 * MS + ORPHAN_WAIT_NS).is_empty());
        assert_eq!(t.stats.requests_without_add, 2);
        // An ADD that comes after all is a new request (no outputs applied).
        let late = feed(
            &mut t,
            &[add(
                T0 + 2 * ORPHAN_WAIT_NS,
                "ghost-1",
                None,
                3,
                sampling(4),
            )],
        );
        assert!(late.is_empty());
        assert!(finish(&mut t).is_empty());
        assert_eq!(t.stats.unfinished_at_end, 1);
        assert_eq!(t.stats.requests_without_add, 2);
    }

    #[test]
    fn a_frontend_abort_ends_the_request() {
        const A: &str = "chatcmpl-Z-abcdef12";
        const B: &str = "cmpl-B-0-bbbbbbbb";
        let mut t = tracker();
        let events = feed(
            &mut t,
            &[
                add(T0, A, Some("chatcmpl-Z"), 5, sampling(16)),
                add(T0 + MS, B, Some("cmpl-B-0"), 3, sampling(16)),
                step(
                    T0 + 50 * MS,
                    0,
                    10.0,
                    vec![
                        with_events(output(A, &[1]), &[(1, 9.0), (2, 9.1)]),
                        output(B, &[5]),
                    ],
                    None,
                ),
                abort(T0 + 70 * MS, &[A]),
                // Outputs for A after its ABORT: vLLM drops them uncounted.
                step(
                    T0 + 80 * MS,
                    0,
                    10.1,
                    vec![finishing(output(A, &[2, 3]), 2), output(B, &[6])],
                    None,
                ),
                // The client's call: it went away before any response.
                http(
                    "/v1/chat/completions",
                    CHAT_BODY,
                    None,
                    T0 - 2 * MS,
                    T0 - 2 * MS,
                ),
            ],
        );
        let reports = step_reports(&events);
        assert_eq!(reports.len(), 2);
        assert_eq!(reports[0].generation_tokens, 2);
        assert_eq!(reports[0].prompt_tokens, 5 + 3);
        assert_eq!(reports[1].generation_tokens, 1, "A's tokens after ABORT");
        assert!(reports[1].iteration);

        // A call the client abandoned waits longer for its request.
        assert!(advance(&mut t, T0 + 80 * MS + ABANDONED_GRACE_NS - 1).is_empty());
        let done = advance(&mut t, T0 + 80 * MS + ABANDONED_GRACE_NS);
        assert_eq!(done.len(), 1);
        let api = done[0].api.as_ref().expect("the abandoned call");
        assert_eq!(api.call.status, None);
        let [a] = done[0].engine.as_slice() else {
            panic!("A joined to the abandoned call: {:?}", done[0].engine);
        };
        assert_eq!(a.request_id, A);
        assert_eq!(a.finish_reason, Some(FinishReason::Abort));
        assert!(a.aborted_by_frontend);
        assert_eq!(a.finished_ns, Some(T0 + 70 * MS - MSG_NS));
        assert_eq!(a.completion_tokens, 1);
        assert_eq!(a.first_output_ns, Some(T0 + 50 * MS));
        // B is still running.
        assert!(finish(&mut t).is_empty());
        assert_eq!(t.stats.unfinished_at_end, 1);
    }

    #[test]
    fn an_abort_decoded_before_its_add() {
        const A: &str = "cmpl-A-0-aaaaaaaa";
        let mut t = tracker();
        let events = feed(
            &mut t,
            &[
                abort(T0 + 10 * MS, &[A]),
                add(T0, A, Some("cmpl-A-0"), 5, sampling(16)),
                step(
                    T0 + 20 * MS,
                    0,
                    10.0,
                    vec![with_events(output(A, &[1]), &[(1, 9.0), (2, 9.1)])],
                    None,
                ),
            ],
        );
        let reports = step_reports(&events);
        assert_eq!(reports.len(), 1);
        assert_eq!(
            (reports[0].generation_tokens, reports[0].prompt_tokens),
            (0, 0)
        );
        // Its outputs are not held as orphans either.
        assert!(advance(&mut t, T0 + 20 * MS + ORPHAN_WAIT_NS).is_empty());
        assert_eq!(t.stats.requests_without_add, 0);
        let done = finish(&mut t);
        assert_eq!(t.stats.unfinished_at_end, 0);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].api, None);
        let a = &done[0].engine[0];
        assert_eq!(a.request_id, A);
        assert_eq!(a.finish_reason, Some(FinishReason::Abort));
        assert!(a.aborted_by_frontend);
        assert_eq!(a.finished_ns, Some(T0 + 10 * MS - MSG_NS));
        assert_eq!(a.add_sent_ns, T0 - MSG_NS);
        assert_eq!(a.completion_tokens, 0);
        assert_eq!(a.first_output_ns, None);
    }

    #[test]
    fn n2_children_are_joined_to_one_call() {
        const C0: &str = "0_cmpl-Y-0-abcdef12";
        const C1: &str = "1_cmpl-Y-0-abcdef12";
        let mut t = tracker();
        let child_sampling = || {
            map(vec![
                ("n", Value::from(1)),
                ("max_tokens", Value::from(2)),
                ("seed", Value::from(7)),
            ])
        };
        let response = r#"{"id":"cmpl-Y","model":"tiny","choices":[
            {"index":0,"text":"ab","finish_reason":"length"},
            {"index":1,"text":"c","finish_reason":"stop"}],
            "usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}"#;
        feed(
            &mut t,
            &[
                add(T0, C0, Some("cmpl-Y-0"), 4, child_sampling()),
                add(T0 + 10_000, C1, Some("cmpl-Y-0"), 4, child_sampling()),
                // Another call's request, not to be claimed.
                add(
                    T0 + 20_000,
                    "cmpl-W-0-eeeeeeee",
                    Some("cmpl-W-0"),
                    2,
                    sampling(1),
                ),
                step(
                    T0 + 30 * MS,
                    0,
                    10.0,
                    vec![
                        with_prefill(output(C0, &[1]), 4, 0),
                        with_prefill(finishing(output(C1, &[2]), 0), 4, 4),
                        finishing(output("cmpl-W-0-eeeeeeee", &[3]), 1),
                    ],
                    None,
                ),
                step(
                    T0 + 40 * MS,
                    0,
                    10.1,
                    vec![finishing(output(C0, &[4]), 1)],
                    None,
                ),
                http(
                    "/v1/completions",
                    r#"{"model":"tiny","prompt":"hi","n":2,"max_tokens":2}"#,
                    Some((200, response)),
                    T0 - MS,
                    T0 + 45 * MS,
                ),
            ],
        );
        let done = advance(&mut t, T0 + 45 * MS + GRACE_NS);
        assert_eq!(done.len(), 1);
        let api = done[0].api.as_ref().expect("the call");
        assert_eq!(api.call.n, Some(2));
        let mut children: Vec<_> = done[0]
            .engine
            .iter()
            .map(|e| e.request_id.as_str())
            .collect();
        children.sort();
        assert_eq!(children, [C0, C1]);
        let tokens: u64 = done[0].engine.iter().map(|e| e.completion_tokens).sum();
        assert_eq!(tokens, 3);
        // The other request is reported alone, 2 * GRACE_NS after it finished.
        let alone = advance(&mut t, T0 + 30 * MS + 2 * GRACE_NS);
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].api, None);
        assert_eq!(alone[0].engine[0].request_id, "cmpl-W-0-eeeeeeee");
    }

    #[test]
    fn an_invalid_call_is_reported_alone() {
        let mut t = tracker();
        feed(
            &mut t,
            &[
                http(
                    "/v1/chat/completions",
                    r#"{"model":"tiny","messages":"oops"}"#,
                    Some((
                        400,
                        r#"{"error":{"message":"bad request","type":"BadRequestError","code":400}}"#,
                    )),
                    T0,
                    T0 + 2 * MS,
                ),
                // A request another client sent right after: not the 400's.
                add(
                    T0 + 3 * MS,
                    "chatcmpl-Q-abcdef12",
                    Some("chatcmpl-Q"),
                    5,
                    sampling(1),
                ),
                step(
                    T0 + 10 * MS,
                    0,
                    1.0,
                    vec![finishing(output("chatcmpl-Q-abcdef12", &[1]), 1)],
                    None,
                ),
            ],
        );
        assert!(advance(&mut t, T0 + 2 * MS + GRACE_NS - 1).is_empty());
        let done = advance(&mut t, T0 + 2 * MS + GRACE_NS);
        assert_eq!(done.len(), 1);
        let api = done[0].api.as_ref().expect("the call");
        assert_eq!(api.call.status, Some(400));
        assert_eq!(api.call.error.as_deref(), Some("bad request"));
        assert!(done[0].engine.is_empty());
        let alone = finish(&mut t);
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].api, None);
        assert_eq!(alone[0].engine[0].request_id, "chatcmpl-Q-abcdef12");
    }

    #[test]
    fn a_request_without_a_call_is_reported_after_twice_the_grace_period() {
        const ID: &str = "cmpl-L-0-abcdef12";
        let mut t = tracker();
        feed(
            &mut t,
            &[
                add(T0, ID, Some("cmpl-L-0"), 2, sampling(1)),
                step(
                    T0 + 10 * MS,
                    0,
                    1.0,
                    vec![finishing(output(ID, &[1]), 1)],
                    None,
                ),
            ],
        );
        assert!(advance(&mut t, T0 + 10 * MS + GRACE_NS).is_empty());
        assert!(advance(&mut t, T0 + 10 * MS + 2 * GRACE_NS - 1).is_empty());
        let done = advance(&mut t, T0 + 10 * MS + 2 * GRACE_NS);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].api, None);
        assert_eq!(done[0].engine[0].request_id, ID);
        assert_eq!(done[0].engine[0].finish_reason, Some(FinishReason::Length));
    }

    #[test]
    fn finish_reports_everything_and_counts_what_did_not_end() {
        const DONE: &str = "chatcmpl-D-abcdef12";
        let mut t = tracker();
        let response = chat_response("chatcmpl-D", "length");
        feed(
            &mut t,
            &[
                add(T0, DONE, Some("chatcmpl-D"), 5, sampling(1)),
                add(
                    T0 + MS,
                    "cmpl-R-0-abcdef12",
                    Some("cmpl-R-0"),
                    5,
                    sampling(9),
                ),
                step(
                    T0 + 10 * MS,
                    0,
                    1.0,
                    vec![
                        finishing(output(DONE, &[1]), 1),
                        output("cmpl-R-0-abcdef12", &[2]),
                        output("never-added", &[3]),
                    ],
                    None,
                ),
                http(
                    "/v1/chat/completions",
                    CHAT_BODY,
                    Some((200, &response)),
                    T0 - MS,
                    T0 + 12 * MS,
                ),
                // A call that waits on its own.
                http(
                    "/v1/chat/completions",
                    r#"{"model":"tiny"}"#,
                    Some((400, r#"{"error":{"message":"no messages"}}"#)),
                    T0 + 13 * MS,
                    T0 + 14 * MS,
                ),
            ],
        );
        // Well within the grace period.
        assert!(advance(&mut t, T0 + 20 * MS).is_empty());
        let done = finish(&mut t);
        assert_eq!(done.len(), 2);
        assert_eq!(done[0].engine.len(), 1);
        assert_eq!(done[0].engine[0].request_id, DONE);
        assert_eq!(
            done[0]
                .api
                .as_ref()
                .and_then(|a| a.call.response_id.as_deref()),
            Some("chatcmpl-D")
        );
        assert_eq!(done[1].api.as_ref().and_then(|a| a.call.status), Some(400));
        assert!(done[1].engine.is_empty());
        assert_eq!(t.stats.unfinished_at_end, 1);
        assert_eq!(t.stats.requests_without_add, 1);
        // Nothing is reported twice.
        assert!(finish(&mut t).is_empty());
        assert_eq!(t.stats.unfinished_at_end, 1);
    }

    #[test]
    fn undecodable_messages_are_counted() {
        let mut t = tracker();
        let valid_step = enc(&Value::Array(vec![
            Value::from(0),
            Value::Array(vec![]),
            Value::Nil,
            Value::F64(1.0),
        ]));
        let messages = [
            // Garbage after an ADD type byte.
            zmtp(true, T0, vec![vec![0x00], vec![0xc1, 0xff, 0x00]]),
            // Truncated msgpack.
            zmtp(true, T0, vec![vec![0x00], vec![0xdc, 0x00, 0x16, 0xa3]]),
            // Valid msgpack of the wrong shape: request_id an int.
            zmtp(
                true,
                T0,
                vec![
                    vec![0x00],
                    enc(&Value::Array(vec![Value::from(1), Value::Nil])),
                ],
            ),
            // An ABORT that is not a list of strings.
            zmtp(true, T0, vec![vec![0x01], enc(&Value::from(3))]),
            zmtp(
                true,
                T0,
                vec![vec![0x01], enc(&Value::Array(vec![Value::from(1)]))],
            ),
            // Outputs whose array is cut short, or whose list holds a non-array.
            zmtp(false, T0, vec![vec![0x94, 0x00, 0x91]]),
            zmtp(
                false,
                T0,
                vec![enc(&Value::Array(vec![
                    Value::from(0),
                    Value::Array(vec![Value::from(5)]),
                ]))],
            ),
            // Trailing bytes after a valid value.
            zmtp(false, T0, vec![[valid_step.clone(), vec![0x00]].concat()]),
        ];
        let events = feed(&mut t, &messages);
        assert!(events.is_empty());
        assert_eq!(t.stats.undecodable, messages.len() as u64);
        assert_eq!((t.stats.adds, t.stats.steps), (0, 0));

        // Not vLLM messages at all: ignored, not counted.
        let others = [
            zmtp(true, T0, vec![vec![0x00]]),
            zmtp(true, T0, vec![vec![0x09], vec![0xc1]]),
            zmtp(true, T0, vec![b"READY".to_vec()]),
            zmtp(true, T0, vec![vec![0x03], vec![0xc1]]),
            zmtp(false, T0, vec![vec![0x80]]),
            zmtp(false, T0, vec![Vec::new()]),
        ];
        let events = feed(&mut t, &others);
        assert!(events.is_empty());
        assert_eq!(t.stats.undecodable, messages.len() as u64);
        // And the tracker still works.
        let events = feed(&mut t, &[zmtp(false, T0, vec![valid_step])]);
        assert_eq!(step_reports(&events).len(), 1);
        assert!(finish(&mut t).is_empty());
    }

    /// vLLM checks stop strings in the frontend: when one matches, the frontend finishes the
    /// request with reason STOP (counted in `vllm:request_success{finished_reason="stop"}`,
    /// traced as a finished request) and then sends ABORT so that the EngineCore stops it too
    /// (vllm/v1/engine/output_processor.py `reqs_to_abort`). The client got a complete 200
    /// response with `finish_reason: "stop"`.
    #[test]
    fn a_stop_string_finish_is_not_a_client_abort() {
        const ID: &str = "chatcmpl-S-abcdef12";
        let mut t = tracker();
        let response = chat_response("chatcmpl-S", "stop");
        feed(
            &mut t,
            &[
                add(
                    T0,
                    ID,
                    Some("chatcmpl-S"),
                    5,
                    map(vec![
                        ("max_tokens", Value::from(16)),
                        ("stop", Value::Array(vec![s("\n")])),
                    ]),
                ),
                step(
                    T0 + 10 * MS,
                    0,
                    1.0,
                    vec![with_events(output(ID, &[1]), &[(1, 0.9), (2, 0.95)])],
                    None,
                ),
                step(T0 + 20 * MS, 0, 1.1, vec![output(ID, &[2])], None),
                abort(T0 + 21 * MS, &[ID]),
                http(
                    "/v1/chat/completions",
                    CHAT_BODY,
                    Some((200, &response)),
                    T0 - MS,
                    T0 + 22 * MS,
                ),
            ],
        );
        let done = advance(&mut t, T0 + 22 * MS + GRACE_NS);
        assert_eq!(done.len(), 1);
        let e = &done[0].engine[0];
        assert!(!e.aborted_by_frontend);
        assert_eq!(e.finish_reason, Some(FinishReason::Stop));
        // vLLM ends it at the output that completed the string, not at the ABORT after it.
        assert_eq!(e.finished_ns, Some(T0 + 20 * MS));
    }
}
