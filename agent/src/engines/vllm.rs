//! vLLM V1: rebuilds each request's life from the API server's side of the ZeroMQ traffic
//! (ADD and ABORT it sends, EngineCoreOutputs it receives) and joins it to the HTTP call that
//! caused it.
//!
//! Only the frontend's copies are used (ADD *sent*, outputs *received*): the EngineCore's
//! copies of the same messages are seen too but would count everything twice. Engine times
//! (events, step timestamps) are the engine's `time.monotonic()`, the same clock as the capture
//! timestamps; `arrival_time` is the frontend's wall clock.
use std::collections::{HashMap, VecDeque};

use super::join::{ApiExchange, EngineRequestInfo, Joiner, Outcome};
use crate::decode::{
    flows::Decoded,
    vllm::{
        EngineOutputs, EngineRequest, EventKind, FinishReason, InputMessage, PdRole, RequestOutput,
        Sampling, SchedulerStats, VllmDecoder,
    },
};

/// Requests followed at once; beyond it the oldest is dropped and counted.
const MAX_IN_FLIGHT: usize = 65_536;
/// Requests whose outputs arrived before their ADD, held at once (see [`Orphan`]).
const MAX_ORPHANS: usize = 4096;
/// How long (capture time) outputs wait for their ADD.
const ORPHAN_WAIT_NS: u64 = 1_000_000_000;
/// Per-iteration records kept per request (granularity 2); later ones are counted, not kept.
pub const MAX_STEPS_PER_REQUEST: usize = 4096;

/// What one engine iteration did to a request (span events at granularity 2).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestStep {
    pub kind: StepKind,
    /// Engine CLOCK_MONOTONIC seconds.
    pub timestamp: f64,
    pub token_ids: Vec<u64>,
    pub logprobs: Option<Vec<f32>>,
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
pub struct EngineTimeline {
    pub request_id: String,
    pub external_id: Option<String>,
    pub sampling: Option<Sampling>,
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens served from a cache (prefix cache + remote KV), when the engine said.
    pub cached_tokens: Option<u64>,
    /// Frontend wall clock at arrival, seconds.
    pub arrival_time: f64,
    pub trace_headers: Vec<(String, String)>,
    pub pd_role: PdRole,
    /// Capture time (CLOCK_MONOTONIC ns) the frontend sent the ADD.
    pub add_sent_ns: u64,
    /// Engine event times, CLOCK_MONOTONIC seconds: first QUEUED, first SCHEDULED.
    pub queued: Option<f64>,
    pub scheduled: Option<f64>,
    /// Engine step timestamps of the first and last outputs with tokens.
    pub first_token: Option<f64>,
    pub last_token: Option<f64>,
    /// Capture times the frontend received the first and the final output.
    pub first_output_ns: Option<u64>,
    pub finished_ns: Option<u64>,
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

impl EngineTimeline {
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
            output_ns: Vec::new(),
            completion_tokens: 0,
            preemptions: 0,
            finish_reason: None,
            aborted_by_frontend: false,
            engine_index: None,
            steps: Vec::new(),
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
    fn apply(&mut self, out: &RequestOutput, step_ts: f64, engine: u64, recv_ns: u64) -> u64 {
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
            token_ids: out.new_token_ids.clone(),
            logprobs: out.logprobs.clone(),
        });
        if let Some(reason) = out.finish_reason {
            self.finish_reason = Some(reason);
            self.finished_ns = Some(recv_ns);
        }
        prompt_counted
    }
}

impl EngineRequestInfo for EngineTimeline {
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
    /// The step reported its scheduler state (log stats on).
    pub scheduler: Option<SchedulerStats>,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
}

/// A finished request: the API call (when seen) and the engine requests it made.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestTrace {
    pub api: Option<ApiExchange>,
    pub engine: Vec<EngineTimeline>,
}

/// Output of the tracker, in the order things completed.
#[derive(Clone, Debug, PartialEq)]
pub enum VllmEvent {
    Step(StepReport),
    Request(Box<RequestTrace>),
}

/// Counters of what the tracker could not use.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct TrackerStats {
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
    in_flight: HashMap<String, EngineTimeline>,
    /// ADD order, to evict the oldest.
    order: VecDeque<String>,
    joiner: Joiner<EngineTimeline>,
    /// Requests the frontend aborted, with when: vLLM drops their later outputs uncounted,
    /// and so do we.
    aborted: HashMap<String, u64>,
    orphans: HashMap<String, Orphan>,
    /// Latest capture time seen.
    now_ns: u64,
    pub stats: TrackerStats,
}

impl VllmTracker {
    pub fn new(decoder: VllmDecoder) -> Self {
        Self {
            decoder,
            in_flight: HashMap::new(),
            order: VecDeque::new(),
            joiner: Joiner::default(),
            aborted: HashMap::new(),
            orphans: HashMap::new(),
            now_ns: 0,
            stats: TrackerStats::default(),
        }
    }

    pub fn decoder(&self) -> &VllmDecoder {
        &self.decoder
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
                    self.start(EngineTimeline::new(&request, message.first_ns), out);
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
                outgoing: false,
                message,
                ..
            } => match self.decoder.outputs(&message.frames) {
                Some(Ok(step)) if !step.is_utility => {
                    let report = self.step(&step, message.last_ns);
                    out.push(VllmEvent::Step(report));
                }
                Some(Ok(_)) | None => {}
                Some(Err(e)) => self.undecodable(&e),
            },
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
            out.push(VllmEvent::Request(Box::new(trace(outcome))));
        }
    }

    fn undecodable(&mut self, error: &crate::decode::vllm::VllmError) {
        self.stats.undecodable += 1;
        tracing::debug!("undecodable vLLM message: {error}");
    }

    fn aborted_by_frontend(&mut self, mut t: EngineTimeline, at_ns: u64) {
        t.aborted_by_frontend = true;
        t.finish_reason = Some(FinishReason::Abort);
        t.finished_ns = Some(at_ns);
        self.joiner.add_engine(t);
    }

    fn start(&mut self, mut timeline: EngineTimeline, out: &mut Vec<VllmEvent>) {
        let id = timeline.request_id.clone();
        if let Some(orphan) = self.orphans.remove(&id) {
            let mut report = StepReport::default();
            for (output, step_ts, engine, recv_ns) in &orphan.outputs {
                report.engine_index = *engine;
                report.prompt_tokens += timeline.apply(output, *step_ts, *engine, *recv_ns);
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
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            while let Some(oldest) = self.order.pop_front() {
                if self.in_flight.remove(&oldest).is_some() {
                    self.stats.evicted += 1;
                    break;
                }
            }
        }
        self.order.push_back(timeline.request_id.clone());
        self.in_flight.insert(timeline.request_id.clone(), timeline);
        if self.order.len() > 2 * MAX_IN_FLIGHT {
            let live = &self.in_flight;
            self.order.retain(|id| live.contains_key(id));
        }
    }

    fn step(&mut self, step: &EngineOutputs, recv_ns: u64) -> StepReport {
        self.stats.steps += 1;
        let mut report = StepReport {
            iteration: !step.outputs.is_empty(),
            engine_index: step.engine_index,
            scheduler: step.scheduler_stats,
            ..StepReport::default()
        };
        for out in &step.outputs {
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
                self.orphan(out, step, recv_ns);
                continue;
            };
            report.prompt_tokens += timeline.apply(out, step.timestamp, step.engine_index, recv_ns);
            if timeline.is_finished()
                && let Some(t) = self.in_flight.remove(&out.request_id)
            {
                self.joiner.add_engine(t);
            }
        }
        report
    }

    fn orphan(&mut self, out: &RequestOutput, step: &EngineOutputs, recv_ns: u64) {
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
            orphan
                .outputs
                .push((out.clone(), step.timestamp, step.engine_index, recv_ns));
        }
    }

    /// End of the session: report everything finished; unfinished requests are counted.
    pub fn finish(&mut self, out: &mut Vec<VllmEvent>) {
        self.stats.unfinished_at_end += self.in_flight.len() as u64;
        self.stats.requests_without_add += self.orphans.len() as u64;
        self.orphans.clear();
        self.in_flight.clear();
        self.order.clear();
        for outcome in self.joiner.finish() {
            out.push(VllmEvent::Request(Box::new(trace(outcome))));
        }
    }
}

fn trace(outcome: Outcome<EngineTimeline>) -> RequestTrace {
    RequestTrace {
        api: outcome.api,
        engine: outcome.engine,
    }
}
