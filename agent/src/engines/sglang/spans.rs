//! SGLang spans as the spec lists them: the entry span of an OpenAI call, and under it the
//! native hierarchy SGLang's own tracing produces, one per engine request (rid):
//!
//! ```text
//! chat {model}
//! └─ " Req <rid[:8]>"                           request span (role empty: not PD)
//!    ├─ "Tokenizer(host:… | pid:…)"            main process
//!    │  ├─ tokenize
//!    │  └─ api_server_dispatch                 (when main's serialization was seen)
//!    ├─ "DP Controller(host:… | pid:…)"        with data parallelism (`--dp-size`)
//!    │  └─ dpc_dispatch                        (when its serialization was seen)
//!    └─ "Scheduler [TP 0]  [PP 0] (host:… | pid:…)"   scheduler process
//!       ├─ request_process, prefill_waiting, prefill_forward   (scheduler time stats)
//!       │                                       └─ chunked_prefill × chunks
//!       ├─ decode_waiting                       (first decode batch after the prefill)
//!       └─ decode_forward
//!          └─ decode_loop × steps
//! ```
//!
//! Which instant each edge is (docs/accuracy.md has the measured differences):
//! - created (request and Tokenizer start): SGLang's own `trace_ctx.start_time_ns` when its
//!   tracing is on (its monotonic value, with the offset main sends, converted like the
//!   captured instants), else the last byte of the HTTP request body, else the request's send.
//! - dispatch start (`tokenize` end, `api_server_dispatch` start): main's entry into
//!   `pickle.dumps` for the request (`engines::sglang::dispatch_start`). Without it (no probe, or a
//!   recording made before it) the one `tokenize` span covers both and says so
//!   (`infertrace.includes_dispatch`); no `api_server_dispatch` is invented.
//! - dispatched (Tokenizer end): main's ZeroMQ send of the request.
//! - DP controller: from its take-over of the request (the read of its socket's mailbox) to its
//!   hand-over to a scheduler's socket; `dpc_dispatch` from its entry into `pickle.dumps` for
//!   the request, else left out (the thread span stays).
//! - the scheduler's instants (`wait_queue_entry`, `forward_entry`, `prefill_finished`) are
//!   its own, sent with `--enable-metrics`; without them those three stages are left out.
//! - scheduler start: its receipt of the request; scheduler end (`decode_forward` end): its
//!   send of the request's final output, just after SGLang stamps completion.
//! - decode_loop: one per decode step, ending at the scheduler's send of that step's output
//!   (streamed requests), else where the scheduler's loop processed that step's result
//!   (`engines::sglang::scheduler_loop`: its mailbox polls and statistics lines).
//! - decode_waiting: from the prefill's end to the loop's scheduling of the request's first
//!   decode batch, when that came later (the loop shows it).
//! - first token and finish: main's event loop taking the output over (`handoff`); for a
//!   non-streamed request with scheduler time stats, the scheduler's prefill end, as SGLang.
//!
//! Request-span latencies are float seconds (the spec's unit for SGLang). The scheduler's
//! ranks come from its process title. Each stage links to the one before it, as SGLang's do;
//! span events: `retract` (placed as engines/sglang/retractions.rs says) and `schedule` (each batch the
//! loop shows the request in: infertrace's own batch id, the forward mode, and the batch size
//! where the scheduler's statistics line for that batch printed it).
use std::sync::LazyLock;

use super::tracker::{Ranks, SglangTimeline, SglangTrace};
use crate::decode::openai::{ApiCall, Operation};
use crate::engines::common::{
    join::{ApiExchange, EngineSide},
    pd_role::PdRole,
};
use crate::telemetry::{
    Clock, SpanOptions,
    entry_span::{entry_span, push_opt},
    gpu, python_samples,
    span::{AttrValue, Attributes, IdGenerator, Span, SpanEvent},
};

/// The spans of one SGLang request trace, parents before children.
pub fn spans(
    trace: &SglangTrace,
    options: &SpanOptions,
    clock: &Clock,
    ids: &mut IdGenerator,
) -> Vec<Span> {
    let mut out = Vec::new();
    let model = trace
        .api
        .as_ref()
        .and_then(|a| a.call.model.clone().or(a.call.response_model.clone()))
        .or_else(|| options.default_model.clone());
    let parent = trace.api.as_ref().map(|api| {
        let side = engine_side(&trace.engine);
        let mut entry = entry_span(api, &side, model.as_deref(), options, clock, ids);
        sglang_entry_attributes(&mut entry.attributes, api, &trace.engine, clock);
        let parent = (entry.trace_id, entry.span_id);
        out.push(entry);
        parent
    });
    // Trace level 0: SGLang's native instrumentation is off; the entry span stays.
    let native = if options.sglang_trace_level == 0 {
        &[][..]
    } else {
        &trace.engine[..]
    };
    for t in native {
        let (trace_id, parent_span) = match parent {
            Some((trace, span)) => (trace, Some(span)),
            None => (ids.trace_id(), None),
        };
        request_spans(
            t,
            trace.api.as_ref(),
            trace_id,
            parent_span,
            options,
            clock,
            ids,
            &mut out,
        );
    }
    out
}

/// What a call's engine requests add to its entry span: the prompt once, the tokens of all.
pub fn engine_side(engine: &[SglangTimeline]) -> EngineSide {
    EngineSide {
        input_tokens: engine.iter().find_map(|e| e.prompt_tokens),
        output_tokens: engine
            .iter()
            .map(|e| e.completion_tokens)
            .sum::<Option<u64>>(),
        finished_ns: engine.iter().filter_map(|e| e.finished_ns).max(),
    }
}

/// The SGLang entry span's own attributes: e2e in seconds, cached prompt tokens, and for a
/// streamed call the spec's estimate of the tokens streamed (outputs carrying content times
/// the stream interval).
fn sglang_entry_attributes(
    a: &mut Attributes,
    api: &ApiExchange,
    engine: &[SglangTimeline],
    clock: &Clock,
) {
    if let Some(end) = api.response_last_ns {
        let e2e = clock
            .unix_ns(end)
            .saturating_sub(clock.unix_ns(api.request_first_ns));
        a.push(("gen_ai.latency.e2e", (e2e as f64 / 1e9).into()));
    }
    push_opt(
        a,
        "gen_ai.usage.cache_read.input_tokens",
        engine.iter().find_map(|e| e.cached_tokens),
    );
    if api.call.stream {
        let increments = api.call.content_event_ns.len() as u64;
        push_opt(
            a,
            "gen_ai.response.tokens_streamed",
            engine
                .iter()
                .find_map(|e| e.stream_interval)
                .map(|interval| increments * interval),
        );
        if api.call.operation == Some(Operation::Chat) {
            tool_call_attributes(a, &api.call);
        }
    }
}

/// Tool calls listed per choice and call on an entry span; more are counted, not listed.
const LISTED_CHOICES: u64 = 8;
const LISTED_CALLS: u64 = 16;

/// `gen_ai.completions.{i}.tool_calls.{j}.name` and `.arguments` for the listed (i, j).
static TOOL_CALL_KEYS: LazyLock<Vec<[String; 2]>> = LazyLock::new(|| {
    (0..LISTED_CHOICES)
        .flat_map(|i| {
            (0..LISTED_CALLS).map(move |j| {
                [
                    format!("gen_ai.completions.{i}.tool_calls.{j}.name"),
                    format!("gen_ai.completions.{i}.tool_calls.{j}.arguments"),
                ]
            })
        })
        .collect()
});

/// The spec's tool-calling attributes of a streamed chat call.
fn tool_call_attributes(a: &mut Attributes, call: &ApiCall) {
    a.push(("gen_ai.request.has_tool_calls", call.has_tools.into()));
    a.push((
        "gen_ai.request.tool_call_detected",
        (!call.tool_calls.is_empty()).into(),
    ));
    a.push((
        "gen_ai.request.tool_calls_count",
        (call.tool_calls.len() as u64).into(),
    ));
    for (&(i, j), tool) in &call.tool_calls {
        if i >= LISTED_CHOICES || j >= LISTED_CALLS {
            continue;
        }
        let [name, arguments] = &TOOL_CALL_KEYS[(i * LISTED_CALLS + j) as usize];
        a.push((name.as_str(), tool.name.as_str().into()));
        a.push((arguments.as_str(), tool.arguments.as_str().into()));
    }
}

/// The instants of one request as SGLang defines them, in Unix ns.
pub struct Instants {
    pub created: u64,
    /// Main began serializing the request (between `created` and `dispatched`).
    pub dispatch_start: Option<u64>,
    pub dispatched: u64,
    pub first_token: Option<u64>,
    pub finished: Option<u64>,
}

pub fn instants(t: &SglangTimeline, api: Option<&ApiExchange>, clock: &Clock) -> Instants {
    let dispatched = clock.unix_ns(t.sent_ns);
    // SGLang's own start, turned into wall time like every other instant: from its monotonic
    // value, so that a wall clock stepped since main last calibrated its offset does not enter
    // the latencies (SGLang's own are monotonic differences); its wall stamp without the offset.
    let created = t
        .trace
        .as_ref()
        .and_then(|c| {
            c.monotonic_start_ns()
                .map(|ns| clock.unix_ns(ns))
                .or(c.start_time_ns)
        })
        .or_else(|| api.map(|a| clock.unix_ns(a.request_last_ns)))
        .unwrap_or(dispatched);
    let first_output = t.first_output_ns.map(|n| clock.unix_ns(n));
    // SGLang takes a non-streamed request's first token from the scheduler when that instant
    // lies between the request's creation and its first output (tokenizer_manager.py,
    // `_get_scheduler_first_token_time`). "Streamed" is the call's flag: an n>1 prefix
    // warm-up goes to the scheduler unstreamed but is judged by its streamed call.
    let streamed = t.stream || api.is_some_and(|a| a.call.stream);
    let prefill_end = t
        .times
        .and_then(|s| s.prefill_finished)
        .filter(|_| !streamed)
        .map(|s| clock.unix_ns_of_mono_secs(s))
        .filter(|&ts| created < ts && first_output.is_some_and(|f| ts <= f));
    let dispatch_start = t
        .dispatch_start_ns
        .map(|n| clock.unix_ns(n))
        .filter(|&ns| created <= ns && ns <= dispatched);
    Instants {
        created,
        dispatch_start,
        dispatched,
        first_token: prefill_end.or(first_output),
        finished: t.finished_ns.map(|n| clock.unix_ns(n)),
    }
}

fn seconds(from: u64, to: u64) -> AttrValue {
    (to.saturating_sub(from) as f64 / 1e9).into()
}

/// `rid.split("_")[-1]`, as SGLang names and tags its request span.
fn short_rid(rid: &str) -> &str {
    rid.rsplit('_').next().unwrap_or(rid)
}

#[allow(clippy::too_many_arguments)]
fn request_spans(
    t: &SglangTimeline,
    api: Option<&ApiExchange>,
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    options: &SpanOptions,
    clock: &Clock,
    ids: &mut IdGenerator,
    out: &mut Vec<Span>,
) {
    let at = instants(t, api, clock);
    let end = at.finished.unwrap_or(at.dispatched).max(at.created);
    let rid = short_rid(&t.rid);
    let mut a: Attributes = Vec::with_capacity(20);
    a.push(("rid", rid.into()));
    a.push(("module", "sglang::request".into()));
    // As SGLang writes it (`hex(room)`), and only when it is set.
    if let Some(room) = t.bootstrap_room.filter(|&room| room != 0) {
        a.push(("bootstrap_room", format!("{room:#x}").into()));
    }
    a.push(("gen_ai.request.id", t.rid.as_str().into()));
    let call = api.map(|a| &a.call);
    push_opt(
        &mut a,
        "gen_ai.request.temperature",
        call.and_then(|c| c.temperature).filter(|v| *v != 0.0),
    );
    push_opt(
        &mut a,
        "gen_ai.request.top_p",
        call.and_then(|c| c.top_p).or(t.sampling.top_p),
    );
    push_opt(&mut a, "gen_ai.request.top_k", call.and_then(|c| c.top_k));
    push_opt(
        &mut a,
        "gen_ai.request.n",
        call.and_then(|c| c.n).or(t.sampling.n),
    );
    push_opt(
        &mut a,
        "gen_ai.request.max_tokens",
        call.and_then(|c| c.max_tokens)
            .or(t.sampling.max_new_tokens),
    );
    push_opt(
        &mut a,
        "gen_ai.response.model",
        options.default_model.clone(),
    );
    if let Some(finish) = &t.finish {
        a.push((
            "gen_ai.response.finish_reasons",
            format!("[\"{}\"]", finish.kind).into(),
        ));
    }
    push_opt(&mut a, "gen_ai.usage.prompt_tokens", t.prompt_tokens);
    push_opt(
        &mut a,
        "gen_ai.usage.completion_tokens",
        t.completion_tokens,
    );
    push_opt(&mut a, "gen_ai.usage.cached_tokens", t.cached_tokens);
    if let Some(first) = at.first_token {
        a.push((
            "gen_ai.latency.time_to_first_token",
            seconds(at.created, first),
        ));
        a.push((
            "gen_ai.latency.time_in_model_prefill",
            seconds(at.dispatched, first),
        ));
        if let Some(done) = at.finished {
            a.push(("gen_ai.latency.time_in_model_decode", seconds(first, done)));
        }
    }
    if let Some(done) = at.finished {
        a.push(("gen_ai.latency.e2e", seconds(at.created, done)));
        a.push((
            "gen_ai.latency.time_in_model_inference",
            seconds(at.dispatched, done),
        ));
    }
    let request = Span {
        trace_id,
        span_id: ids.span_id(),
        parent_span_id: parent,
        name: format!(
            "{} Req {}",
            t.pd_role.map_or("", PdRole::name),
            rid.get(..8).unwrap_or(rid)
        ),
        start_time_unix_nano: at.created,
        end_time_unix_nano: end,
        attributes: a,
        events: Vec::new(),
        links: Vec::new(),
        error: None,
    };
    let request_id = request.span_id;
    out.push(request);
    let mut b = Children {
        trace_id,
        ids,
        out,
        max_level: options.sglang_trace_level,
        previous_stage: None,
    };
    let host = options.host_id.as_deref();
    // SGLang's HTTP server: `DecodeTokenizer`, the other processes `Decode Scheduler`, ...
    let role = t.pd_role.map_or(String::new(), |r| r.label().to_owned());
    let tokenizer_label = format!("{role}Tokenizer");
    let tokenizer = b.thread(
        thread_name(&tokenizer_label, host, t.frontend_pid),
        (at.created, at.dispatched),
        request_id,
        thread_attributes(&tokenizer_label, host, t.frontend_pid),
        None,
    );
    let role = if role.is_empty() { role } else { role + " " };
    // SGLang never ends the tokenize stage of an n>1 call's samples and prefix warm-up (each
    // gets fresh time stats that `set_tokenize_finish_time` never sees): their dispatch stage
    // opens inside it, as its child, and the tokenize runs to the dispatch's end.
    let sampled = t.sampling.n.is_some_and(|n| n > 1);
    match at.dispatch_start {
        Some(start) if !sampled => {
            b.stage("tokenize", at.created, start, tokenizer, Vec::new());
            b.stage(
                "api_server_dispatch",
                start,
                at.dispatched,
                tokenizer,
                Vec::new(),
            );
        }
        _ => {
            let tokenize = b.stage(
                "tokenize",
                at.created,
                at.dispatched,
                tokenizer,
                vec![("infertrace.includes_dispatch", true.into())],
            );
            if let (Some(tokenize), Some(start)) = (tokenize, at.dispatch_start) {
                b.nested(
                    "api_server_dispatch",
                    start,
                    at.dispatched,
                    tokenize,
                    Vec::new(),
                );
            }
        }
    }
    if let Some(d) = &t.dp_controller
        && let (Some(received), Some(sent)) = (d.received_ns, d.sent_ns)
    {
        let sent = clock.unix_ns(sent);
        let label = format!("{role}{DP_CONTROLLER}");
        let controller = b.thread(
            thread_name(&label, host, d.pid),
            (clock.unix_ns(received), sent),
            request_id,
            thread_attributes(&label, host, d.pid),
            None,
        );
        if let Some(start) = d.dispatch_start_ns {
            let start = clock.unix_ns(start);
            b.stage("dpc_dispatch", start, sent, controller, Vec::new());
        }
    }
    let (Some(pid), Some(recv)) = (t.scheduler_pid, t.scheduler_recv_ns) else {
        return;
    };
    let recv = clock.unix_ns(recv);
    let completion = t.scheduler_output_ns.last().map(|n| clock.unix_ns(*n));
    let ranks = t.scheduler_ranks;
    let label = format!("{role}Scheduler");
    let mut attributes = thread_attributes(&label, host, pid);
    if let Some(r) = ranks {
        attributes.push(("tp_rank", i64::from(r.tp).into()));
        attributes.push(("pp_rank", i64::from(r.pp).into()));
        push_opt(&mut attributes, "dp_rank", r.dp.map(i64::from));
    }
    let error = ended_by_scheduler(t);
    if let Some(reason) = &error {
        attributes.push(("reason", reason.clone().into()));
    }
    let thread_index = b.out.len();
    let scheduler = b.thread(
        thread_name(&scheduler_label(&label, ranks), host, pid),
        (recv, completion.unwrap_or(recv)),
        request_id,
        attributes,
        error,
    );
    scheduler_stages(&mut b, t, clock, (scheduler, recv), completion);
    if b.max_level >= RETRACT_LEVEL {
        for &at in &t.retracted_ns {
            b.event_in_covering_stage(thread_index, "retract", clock.unix_ns(at), Vec::new());
        }
    }
    if b.max_level >= SCHEDULE_LEVEL {
        for batch in t.loop_view.iter().flat_map(|v| &v.scheduled) {
            let mut attributes: Attributes = vec![("bid", batch.bid.clone().into())];
            push_opt(
                &mut attributes,
                "batch_size",
                batch.batch_size.and_then(|n| i64::try_from(n).ok()),
            );
            attributes.push(("forward_mode", batch.forward_mode.into()));
            let at = clock.unix_ns(batch.ns);
            b.event_in_covering_stage(thread_index, "schedule", at, attributes);
        }
    }
}

/// SGLang's label of its data-parallel controller's thread (not PD).
const DP_CONTROLLER: &str = "DP Controller";

/// The spec's levels of the `retract` and `schedule` events.
const RETRACT_LEVEL: u8 = 1;
const SCHEDULE_LEVEL: u8 = 3;

/// The scheduler's stage spans of a request, under its thread span `scheduler` (which starts
/// at `recv`; `completion`: the request's last output).
fn scheduler_stages(
    b: &mut Children,
    t: &SglangTimeline,
    clock: &Clock,
    (scheduler, recv): ([u8; 8], u64),
    completion: Option<u64>,
) {
    let mono = |s: f64| clock.unix_ns_of_mono_secs(s);
    let times = t.times.unwrap_or_default();
    let (queued, forward, prefilled) = (
        times.wait_queue_entry.map(mono),
        times.forward_entry.map(mono),
        times.prefill_finished.map(mono),
    );
    // `request_process` is a unified server's. A PD server's scheduler has its own stages
    // before the queue (prefill: prefill_prepare, prefill_bootstrap; decode: decode_prepare,
    // decode_bootstrap, decode_transferred), whose instants are not on the wire: left out. A
    // decode server's wait in the queue is its `decode_waiting`, and it has no prefill.
    let stages: &[(&str, Option<u64>, Option<u64>)] = match t.pd_role {
        None => &[
            ("request_process", Some(recv), queued),
            ("prefill_waiting", queued, forward),
            ("prefill_forward", forward, prefilled),
        ],
        Some(PdRole::Prefill) => &[
            ("prefill_waiting", queued, forward),
            ("prefill_forward", forward, prefilled),
        ],
        Some(PdRole::Decode) => &[("decode_waiting", queued, forward)],
    };
    let mut prefill = None;
    for &(name, start, end) in stages {
        if let (Some(start), Some(end)) = (start, end) {
            let stage = b.stage(name, start, end, scheduler, Vec::new());
            if name == "prefill_forward" {
                prefill = stage.map(|id| (id, start, end));
            }
        }
    }
    // One span per prefill chunk, from the forward entry to the prefill's end.
    if let (Some((id, start, end)), Some(view)) = (prefill, &t.loop_view)
        && !view.chunk_ends.is_empty()
    {
        let ends = view.chunk_ends.iter().map(|&ns| clock.unix_ns(ns));
        let chunks = ends.chain([end]).map(|to| (to, Vec::new()));
        b.chain("chunked_prefill", start, chunks, id);
    }
    // Decode: from the prefill's end (or the first output of a streamed request), or from its
    // first decode batch when that came later (decode_waiting), to the final output; one
    // loop per further output of a streamed request, else per step the scheduler's loop shows.
    let steps: Vec<u64> = t
        .scheduler_output_ns
        .iter()
        .map(|n| clock.unix_ns(*n))
        .collect();
    // A decode server's decode starts at its forward entry (SGLang's `fake_output`, the prefill
    // node's token put out, then the decode loops from that output on).
    let decode_node = t.pd_role == Some(PdRole::Decode);
    let first_output = t.stream.then(|| steps.first().copied()).flatten();
    let prefill_end = if decode_node {
        forward
    } else {
        prefilled.or(first_output)
    };
    let (Some(prefill_end), Some(end)) = (prefill_end, completion) else {
        return;
    };
    if t.completion_tokens.unwrap_or(0) < 2 {
        return;
    }
    let view = t.loop_view.as_ref();
    let start = match view.and_then(|v| v.decode_waiting_end) {
        Some(waited) => {
            let waited = clock.unix_ns(waited);
            b.stage("decode_waiting", prefill_end, waited, scheduler, Vec::new());
            waited
        }
        None => prefill_end,
    };
    let Some(decode) = b.stage("decode_forward", start, end, scheduler, Vec::new()) else {
        return;
    };
    // A decode server's streamed request: its prebuilt batch's output, handed over right
    // after SGLang stamps that batch's end (the loop's instant is the forward entry before).
    let first_loop_start = match (
        first_output.filter(|_| decode_node),
        view.and_then(|v| v.first_loop_start),
    ) {
        (Some(put_out), _) => put_out,
        (None, Some(ns)) => clock.unix_ns(ns),
        (None, None) => start,
    };
    // Each loop ends at the output it sent (streamed), else where the loop processed its step.
    let ends: Vec<u64> = match (t.stream, view) {
        (true, _) => steps.iter().skip(1).copied().collect(),
        (false, Some(view)) => view
            .decode_ends
            .iter()
            .map(|&ns| clock.unix_ns(ns))
            .collect(),
        (false, None) => Vec::new(),
    };
    let loops = ends.into_iter().enumerate().map(|(ct, to)| {
        let mut attributes: Attributes = vec![("decode_ct", (ct as i64).into())];
        // What ran between two outputs is known per output, so per loop only when streamed.
        if t.stream {
            if let Some(Some(launched)) = t.gpu_per_output.get(ct + 1) {
                gpu::iteration_attributes(&mut attributes, launched);
            }
            if let Some(Some(samples)) = t.python_per_output.get(ct + 1) {
                python_samples::iteration_attributes(&mut attributes, samples);
            }
        }
        (to, attributes)
    });
    b.chain("decode_loop", first_loop_start, loops, decode);
}

/// The spec's level of each native stage span (SGLang's `RequestStage` table): a stage above
/// the configured trace level is not produced.
fn stage_level(name: &str) -> u8 {
    match name {
        "request_process" | "api_server_dispatch" | "dpc_dispatch" => 2,
        "decode_loop" | "chunked_prefill" => 3,
        _ => 1,
    }
}

/// Builds the thread and stage spans under one request span.
struct Children<'a> {
    trace_id: [u8; 16],
    ids: &'a mut IdGenerator,
    out: &'a mut Vec<Span>,
    max_level: u8,
    /// The latest stage produced: the next one links to it (across threads too, as SGLang's
    /// request_process links to the Tokenizer's last stage).
    previous_stage: Option<[u8; 8]>,
}

impl Children<'_> {
    fn push(
        &mut self,
        name: String,
        (start, end): (u64, u64),
        parent: [u8; 8],
        attributes: Attributes,
        link: Option<[u8; 8]>,
    ) -> [u8; 8] {
        let span = Span {
            trace_id: self.trace_id,
            span_id: self.ids.span_id(),
            parent_span_id: Some(parent),
            name,
            start_time_unix_nano: start,
            end_time_unix_nano: end.max(start),
            attributes,
            events: Vec::new(),
            links: link.into_iter().collect(),
            error: None,
        };
        let id = span.span_id;
        self.out.push(span);
        id
    }

    /// An event at `at` on the innermost stage span that covers it among those pushed after
    /// the thread span at `thread_index`, else on that thread span (the spec's rule).
    fn event_in_covering_stage(
        &mut self,
        thread_index: usize,
        name: &'static str,
        at: u64,
        attributes: Attributes,
    ) {
        let Some(stages) = self.out.get(thread_index + 1..) else {
            return;
        };
        let covering = stages
            .iter()
            .enumerate()
            .filter(|(_, s)| s.start_time_unix_nano <= at && at <= s.end_time_unix_nano)
            .max_by_key(|(_, s)| s.start_time_unix_nano)
            .map_or(thread_index, |(i, _)| thread_index + 1 + i);
        if let Some(span) = self.out.get_mut(covering) {
            span.events.push(SpanEvent {
                name,
                time_unix_nano: at,
                attributes,
            });
        }
    }

    /// A thread span; `error`: its ERROR status message.
    fn thread(
        &mut self,
        name: String,
        (start, end): (u64, u64),
        parent: [u8; 8],
        attributes: Attributes,
        error: Option<String>,
    ) -> [u8; 8] {
        let id = self.push(name, (start, end), parent, attributes, None);
        if let Some(span) = self.out.last_mut() {
            span.error = error;
        }
        id
    }

    /// Consecutive stages `name` under `parent`: the first from `from`, each to its end and the
    /// next from there.
    fn chain(
        &mut self,
        name: &'static str,
        mut from: u64,
        ends: impl IntoIterator<Item = (u64, Attributes)>,
        parent: [u8; 8],
    ) {
        for (to, attributes) in ends {
            self.stage(name, from, to, parent, attributes);
            from = to;
        }
    }

    /// A stage span under another stage, unless its level is above the trace level: it links
    /// nothing and is not linked to.
    fn nested(
        &mut self,
        name: &'static str,
        start: u64,
        end: u64,
        parent: [u8; 8],
        attributes: Attributes,
    ) -> Option<[u8; 8]> {
        (stage_level(name) <= self.max_level)
            .then(|| self.push(name.into(), (start, end), parent, attributes, None))
    }

    /// A stage span, unless its level is above the trace level. Decode loops and prefill
    /// chunks (children of decode_forward and prefill_forward) are nested stages.
    fn stage(
        &mut self,
        name: &'static str,
        start: u64,
        end: u64,
        parent: [u8; 8],
        attributes: Attributes,
    ) -> Option<[u8; 8]> {
        if matches!(name, "decode_loop" | "chunked_prefill") {
            return self.nested(name, start, end, parent, attributes);
        }
        if stage_level(name) > self.max_level {
            return None;
        }
        let link = self.previous_stage;
        let id = self.push(name.into(), (start, end), parent, attributes, link);
        self.previous_stage = Some(id);
        Some(id)
    }
}

/// Why the scheduler itself ended the request, when it did: SGLang marks the scheduler's
/// thread span ERROR with that reason (`trace_ctx.abort` in scheduler.py: a full queue, a
/// request it rejects, a time limit), but not for a request the frontend asked it to abort
/// (the client went away).
fn ended_by_scheduler(t: &SglangTimeline) -> Option<String> {
    let finish = t.finish.as_ref()?;
    (finish.kind == "abort" && !t.aborted_by_frontend)
        .then(|| finish.message.clone().unwrap_or_else(|| "Aborted".into()))
}

/// SGLang's name of a scheduler thread: its label (`Scheduler`, `Decode Scheduler`), then
/// `[TP t]  [PP p] ` (and ` [DP d] `), each rank padded with spaces as trace.py writes it; no
/// ranks when the title was not seen.
fn scheduler_label(label: &str, ranks: Option<Ranks>) -> String {
    let Some(r) = ranks else {
        return label.into();
    };
    let mut label = format!("{label} [TP {}]  [PP {}] ", r.tp, r.pp);
    if let Some(dp) = r.dp {
        label.push_str(&format!(" [DP {dp}] "));
    }
    label
}

/// `{label}(host:{id[:8]} | pid:{pid})`, SGLang's thread span name.
fn thread_name(label: &str, host: Option<&str>, pid: u32) -> String {
    let host = host.map_or("unknown", |h| h.get(..8).unwrap_or(h));
    format!("{label}(host:{host} | pid:{pid})")
}

fn thread_attributes(label: &str, host: Option<&str>, pid: u32) -> Attributes {
    let mut a: Attributes = Vec::with_capacity(3);
    push_opt(&mut a, "host_id", host);
    a.push(("pid", i64::from(pid).into()));
    a.push(("thread_label", label.into()));
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::openai::ToolCall;

    #[test]
    fn tool_calls_are_counted_and_listed_by_choice_and_call() {
        let mut call = ApiCall {
            has_tools: true,
            ..ApiCall::default()
        };
        let tool = |name: &str| ToolCall {
            name: name.into(),
            arguments: "{}".into(),
        };
        call.tool_calls.insert((0, 0), tool("a"));
        call.tool_calls.insert((1, 2), tool("b"));
        call.tool_calls.insert((LISTED_CHOICES, 0), tool("c"));
        let mut a = Attributes::new();
        tool_call_attributes(&mut a, &call);
        let get = |key: &str| a.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone());
        assert_eq!(get("gen_ai.request.has_tool_calls"), Some(true.into()));
        assert_eq!(get("gen_ai.request.tool_call_detected"), Some(true.into()));
        assert_eq!(get("gen_ai.request.tool_calls_count"), Some(3u64.into()));
        assert_eq!(
            get("gen_ai.completions.0.tool_calls.0.name"),
            Some("a".into())
        );
        assert_eq!(
            get("gen_ai.completions.1.tool_calls.2.name"),
            Some("b".into())
        );
        assert_eq!(
            get("gen_ai.completions.1.tool_calls.2.arguments"),
            Some("{}".into())
        );
        // The ninth choice's call is counted, not listed.
        assert_eq!(a.len(), 3 + 2 * 2);
        let mut none = Attributes::new();
        tool_call_attributes(&mut none, &ApiCall::default());
        assert_eq!(none.len(), 3);
    }

    #[test]
    fn only_a_request_the_scheduler_ended_itself_is_an_error() {
        use crate::engines::sglang::wire::SglangFinish;
        let finish = |kind: &str, message: Option<&str>| SglangFinish {
            kind: kind.into(),
            message: message.map(str::to_owned),
            status_code: Some(503),
        };
        let mut t = SglangTimeline {
            finish: Some(finish("abort", Some("The request queue is full."))),
            ..SglangTimeline::default()
        };
        assert_eq!(
            ended_by_scheduler(&t).as_deref(),
            Some("The request queue is full.")
        );
        t.finish = Some(finish("abort", None));
        assert_eq!(ended_by_scheduler(&t).as_deref(), Some("Aborted"));
        // The client went away and the frontend asked for the abort: no error, as SGLang.
        t.aborted_by_frontend = true;
        assert_eq!(ended_by_scheduler(&t), None);
        t.aborted_by_frontend = false;
        t.finish = Some(finish("length", None));
        assert_eq!(ended_by_scheduler(&t), None);
    }

    /// The spans of a request trace of `t` alone, at SGLang trace level `level`.
    fn spans_at_level(t: SglangTimeline, level: u8) -> Vec<Span> {
        let trace = crate::engines::common::join::Outcome {
            api: None,
            engine: vec![t],
        };
        let options = SpanOptions {
            sglang_trace_level: level,
            ..SpanOptions::default()
        };
        spans(
            &trace,
            &options,
            &Clock::fixed(0),
            &mut IdGenerator::default(),
        )
    }

    /// A streamed request of three outputs (at 110, 120 and 130 ms), received at 101 ms.
    fn streamed_three_outputs() -> SglangTimeline {
        const MS: u64 = 1_000_000;
        SglangTimeline {
            rid: "0123456789abcdef".into(),
            stream: true,
            completion_tokens: Some(3),
            frontend_pid: 10,
            scheduler_pid: Some(11),
            sent_ns: 100 * MS,
            scheduler_recv_ns: Some(101 * MS),
            scheduler_output_ns: vec![110 * MS, 120 * MS, 130 * MS],
            first_output_ns: Some(111 * MS),
            last_output_ns: Some(131 * MS),
            finished_ns: Some(131 * MS),
            ..SglangTimeline::default()
        }
    }

    #[test]
    fn sglangs_start_is_its_monotonic_value_turned_into_wall_time_like_the_captured_instants() {
        use crate::engines::sglang::wire::TraceContext;
        const MS: u64 = 1_000_000;
        // The wall clock is now 1 s ahead of CLOCK_MONOTONIC; main made its stamp (at 90 ms
        // monotonic) with the 0.5 s it had calibrated before the clock was stepped.
        let clock = Clock::fixed(i128::from(1_000 * MS));
        let with = |trace: TraceContext| SglangTimeline {
            trace: Some(trace),
            ..streamed_three_outputs()
        };
        let at = instants(
            &with(TraceContext {
                start_time_ns: Some(590 * MS),
                realtime_minus_monotonic_s: Some(0.5),
                ..TraceContext::default()
            }),
            None,
            &clock,
        );
        // e2e 41 ms, as SGLang's own perf_counter difference, not 541 ms.
        assert_eq!((at.created, at.finished), (1_090 * MS, Some(1_131 * MS)));
        // Without the offset (an SGLang that does not send it), the wall stamp stands.
        let wall_only = TraceContext {
            start_time_ns: Some(590 * MS),
            ..TraceContext::default()
        };
        assert_eq!(instants(&with(wall_only), None, &clock).created, 590 * MS);
    }

    #[test]
    fn a_decode_loop_the_cuda_probes_saw_says_what_its_batch_launched() {
        use crate::engines::common::{iteration_work::IterationLaunches, join::Outcome};
        const MS: u64 = 1_000_000;
        let launched = IterationLaunches {
            synchronizations: 1,
            kernel_launches: 0,
            graph_launches: 1,
            cpu_launch_ns: Some(0),
            cpu_sync_wait_ns: 4 * MS,
        };
        let t = SglangTimeline {
            gpu_per_output: vec![None, Some(launched), None],
            ..streamed_three_outputs()
        };
        let trace = Outcome {
            api: None,
            engine: vec![t],
        };
        let spans = spans(
            &trace,
            &SpanOptions::default(),
            &Clock::fixed(0),
            &mut IdGenerator::default(),
        );
        let loops: Vec<&Span> = spans.iter().filter(|s| s.name == "decode_loop").collect();
        assert_eq!(
            loops.len(),
            2,
            "{:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        let get = |span: &Span, key: &str| {
            span.attributes
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get(loops[0], "infertrace.cuda.graph_launches"),
            Some(1u64.into())
        );
        assert_eq!(
            get(loops[0], "infertrace.cuda.cpu_sync_wait_ns"),
            Some((4 * MS).into())
        );
        assert_eq!(get(loops[1], "infertrace.cuda.graph_launches"), None);
        assert_eq!(get(loops[1], "decode_ct"), Some(1i64.into()));
    }

    #[test]
    fn the_dispatch_start_splits_tokenize_from_api_server_dispatch_as_sglang_does() {
        use crate::engines::sglang::wire::SglangSampling;
        const MS: u64 = 1_000_000;
        let build = spans_at_level;
        let named = |spans: &[Span], name: &str| {
            spans.iter().find(|s| s.name == name).map(|s| {
                (
                    s.start_time_unix_nano,
                    s.end_time_unix_nano,
                    s.attributes.len(),
                )
            })
        };
        let split = SglangTimeline {
            trace: None,
            dispatch_start_ns: Some(99 * MS),
            ..streamed_three_outputs()
        };
        // Created at the send when no HTTP call was seen: the start must lie in between.
        let created_early = |t: SglangTimeline| SglangTimeline {
            trace: Some(crate::engines::sglang::wire::TraceContext {
                start_time_ns: Some(90 * MS),
                ..Default::default()
            }),
            ..t
        };
        let spans = build(created_early(split.clone()), 3);
        assert_eq!(named(&spans, "tokenize"), Some((90 * MS, 99 * MS, 0)));
        assert_eq!(
            named(&spans, "api_server_dispatch"),
            Some((99 * MS, 100 * MS, 0))
        );
        // The scheduler's first stage links to it.
        let dispatch = spans.iter().find(|s| s.name == "api_server_dispatch");
        let linked: Vec<&str> = spans
            .iter()
            .filter(|s| dispatch.is_some_and(|d| s.links == [d.span_id]))
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(linked, ["decode_forward"]);
        // Level 1: tokenize still ends where the dispatch began; no api_server_dispatch.
        let spans = build(created_early(split.clone()), 1);
        assert_eq!(named(&spans, "tokenize"), Some((90 * MS, 99 * MS, 0)));
        assert_eq!(named(&spans, "api_server_dispatch"), None);
        let sample = SglangTimeline {
            sampling: SglangSampling {
                n: Some(2),
                ..SglangSampling::default()
            },
            ..split.clone()
        };
        // An n>1 sample: SGLang never ends its tokenize, which runs to the dispatch's end with
        // the dispatch inside it, and the scheduler's first stage links to the tokenize.
        let spans = build(created_early(sample), 3);
        assert_eq!(named(&spans, "tokenize"), Some((90 * MS, 100 * MS, 1)));
        assert_eq!(
            named(&spans, "api_server_dispatch"),
            Some((99 * MS, 100 * MS, 0))
        );
        let tokenize = spans.iter().find(|s| s.name == "tokenize");
        let dispatch = spans.iter().find(|s| s.name == "api_server_dispatch");
        assert_eq!(
            dispatch.and_then(|d| d.parent_span_id),
            tokenize.map(|t| t.span_id)
        );
        assert!(dispatch.is_some_and(|d| d.links.is_empty()));
        let linked: Vec<&str> = spans
            .iter()
            .filter(|s| tokenize.is_some_and(|t| s.links == [t.span_id]))
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(linked, ["decode_forward"]);
        // No dispatch start seen: one tokenize that says it covers the dispatch.
        let unknown = SglangTimeline {
            dispatch_start_ns: None,
            ..split
        };
        let spans = build(created_early(unknown), 3);
        assert_eq!(named(&spans, "tokenize"), Some((90 * MS, 100 * MS, 1)));
        assert_eq!(named(&spans, "api_server_dispatch"), None);
    }

    #[test]
    fn a_request_through_the_dp_controller_has_its_thread_and_dpc_dispatch_between_main_and_the_scheduler()
     {
        use crate::engines::sglang::tracker::{DpControllerHop, Ranks};
        const US: u64 = 1_000;
        const MS: u64 = 1_000 * US;
        let hop = DpControllerHop {
            pid: 12,
            received_ns: Some(100 * MS + 100 * US),
            sent_ns: Some(100 * MS + 500 * US),
            dispatch_start_ns: Some(100 * MS + 300 * US),
        };
        let t = SglangTimeline {
            // Created at 90 ms (SGLang's own stamp), dispatched from 99 ms.
            trace: Some(crate::engines::sglang::wire::TraceContext {
                start_time_ns: Some(90 * MS),
                ..Default::default()
            }),
            dispatch_start_ns: Some(99 * MS),
            dp_controller: Some(hop),
            scheduler_ranks: Some(Ranks {
                tp: 0,
                pp: 0,
                dp: Some(1),
            }),
            ..streamed_three_outputs()
        };
        let spans = spans_at_level(t.clone(), 3);
        let find = |name: &str| spans.iter().find(|s| s.name.starts_with(name));
        let controller = find("DP Controller(").expect("the controller's thread span");
        assert_eq!(controller.name, "DP Controller(host:unknown | pid:12)");
        assert_eq!(
            (
                controller.start_time_unix_nano,
                controller.end_time_unix_nano
            ),
            (100 * MS + 100 * US, 100 * MS + 500 * US)
        );
        let request = find(" Req ").expect("request span");
        assert_eq!(controller.parent_span_id, Some(request.span_id));
        let dispatch = find("dpc_dispatch").expect("dpc_dispatch");
        assert_eq!(dispatch.parent_span_id, Some(controller.span_id));
        assert_eq!(
            (dispatch.start_time_unix_nano, dispatch.end_time_unix_nano),
            (100 * MS + 300 * US, 100 * MS + 500 * US)
        );
        // Linked as SGLang links them: main's dispatch, the controller's, the scheduler's.
        let main_dispatch = find("api_server_dispatch").expect("api_server_dispatch");
        assert_eq!(dispatch.links, [main_dispatch.span_id]);
        let next: Vec<&str> = spans
            .iter()
            .filter(|s| s.links == [dispatch.span_id])
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(next, ["decode_forward"]);
        let scheduler = find("Scheduler").expect("scheduler thread span");
        assert!(
            scheduler
                .name
                .starts_with("Scheduler [TP 0]  [PP 0]  [DP 1] (host:"),
            "{}",
            scheduler.name
        );
        // Level 1: the thread span without its level-2 stage; no dispatch start: likewise.
        let spans = spans_at_level(t.clone(), 1);
        assert!(spans.iter().any(|s| s.name.starts_with("DP Controller(")));
        assert!(!spans.iter().any(|s| s.name == "dpc_dispatch"));
        let unknown = SglangTimeline {
            dp_controller: Some(DpControllerHop {
                dispatch_start_ns: None,
                ..hop
            }),
            ..t
        };
        let spans = spans_at_level(unknown, 3);
        assert!(spans.iter().any(|s| s.name.starts_with("DP Controller(")));
        assert!(!spans.iter().any(|s| s.name == "dpc_dispatch"));
    }

    #[test]
    fn a_pd_decode_servers_request_is_named_and_staged_as_sglang_does() {
        use crate::engines::sglang::wire::SchedulerTimes;
        use crate::engines::{common::pd_role::PdRole, sglang::tracker::Ranks};
        const MS: u64 = 1_000_000;
        let secs = |ms: u64| Some(ms as f64 / 1e3);
        let t = SglangTimeline {
            pd_role: Some(PdRole::Decode),
            bootstrap_room: Some(1001),
            scheduler_ranks: Some(Ranks::default()),
            // Queued at 104 ms (the transfer done), forward entry at 106 ms; no prefill.
            times: Some(SchedulerTimes {
                wait_queue_entry: secs(104),
                forward_entry: secs(106),
                ..SchedulerTimes::default()
            }),
            ..streamed_three_outputs()
        };
        let spans = spans_at_level(t, 3);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "decode Req 01234567",
                "DecodeTokenizer(host:unknown | pid:10)",
                "tokenize",
                "Decode Scheduler [TP 0]  [PP 0] (host:unknown | pid:11)",
                "decode_waiting",
                "decode_forward",
                "decode_loop",
                "decode_loop",
            ]
        );
        let get = |name: &str| spans.iter().find(|s| s.name == name).expect(name);
        let attribute = |span: &Span, key: &str| {
            span.attributes
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            attribute(get("decode Req 01234567"), "bootstrap_room"),
            Some("0x3e9".into())
        );
        assert_eq!(
            attribute(
                get("Decode Scheduler [TP 0]  [PP 0] (host:unknown | pid:11)"),
                "thread_label"
            ),
            Some("Decode Scheduler".into())
        );
        let edges = |name: &str| {
            let s = get(name);
            (s.start_time_unix_nano, s.end_time_unix_nano)
        };
        assert_eq!(edges("decode_waiting"), (104 * MS, 106 * MS));
        // Decode from the forward entry; its loops from the first output on (the prefill
        // node's token, put out by SGLang's fake_output).
        assert_eq!(edges("decode_forward"), (106 * MS, 130 * MS));
        let loops: Vec<(u64, u64)> = spans
            .iter()
            .filter(|s| s.name == "decode_loop")
            .map(|s| (s.start_time_unix_nano, s.end_time_unix_nano))
            .collect();
        assert_eq!(loops, [(110 * MS, 120 * MS), (120 * MS, 130 * MS)]);
    }

    #[test]
    fn a_request_without_a_bootstrap_room_has_none() {
        let t = SglangTimeline {
            bootstrap_room: Some(0),
            ..streamed_three_outputs()
        };
        let spans = spans_at_level(t, 3);
        assert_eq!(spans[0].name, " Req 01234567");
        assert!(
            !spans[0]
                .attributes
                .iter()
                .any(|(k, _)| *k == "bootstrap_room")
        );
    }

    #[test]
    fn a_retraction_goes_on_the_stage_that_covers_it_else_on_the_thread() {
        const MS: u64 = 1_000_000;
        let t = SglangTimeline {
            // In the second decode loop (and its decode_forward), and before any stage.
            retracted_ns: vec![125 * MS, 105 * MS],
            ..streamed_three_outputs()
        };
        let build = |level| spans_at_level(t.clone(), level);
        let spans = build(3);
        let with_retract: Vec<(&str, u64)> = spans
            .iter()
            .flat_map(|s| {
                s.events
                    .iter()
                    .filter(|e| e.name == "retract")
                    .map(move |e| (s.name.as_str(), e.time_unix_nano))
            })
            .collect();
        assert_eq!(with_retract.len(), 2, "{with_retract:?}");
        assert!(
            with_retract.contains(&("decode_loop", 125 * MS)),
            "{with_retract:?}"
        );
        let on_thread = with_retract.iter().find(|(_, at)| *at == 105 * MS);
        assert!(
            on_thread.is_some_and(|(name, _)| name.starts_with("Scheduler")),
            "{with_retract:?}"
        );
        // Level 0: no native spans, no events.
        assert!(build(0).iter().all(|s| s.events.is_empty()));
    }
}
