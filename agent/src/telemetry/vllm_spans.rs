//! vLLM spans exactly as the spec lists them: the entry span (`chat {model}`,
//! `text_completion {model}`, `embeddings {model}`, `rerank {model}`), `llm_request` (V1
//! attributes, durations in nanoseconds) under it, the stage spans `wait` / `prefill` /
//! `decode` at granularity >= 1 and the per-iteration events at granularity 2.
//!
//! Durations follow vLLM's own definitions (vllm/v1/metrics/stats.py), on the engine clock:
//! queue is first SCHEDULED minus QUEUED, prefill is the first token's step minus the first
//! SCHEDULED, decode is the last token's step minus the first token's, inference is the last
//! token's step minus the first SCHEDULED. Time to first token and e2e run from `arrival_time`
//! (frontend wall clock) to when the frontend received the first or the final output (capture
//! time). `kv_transfer` spans and `gen_ai.latency.time_in_kv_transfer` are never emitted: the
//! transfer happens inside the KV connector, which sends no message that infertrace sees, and a
//! duration that is not measured is left out.
use super::{
    Clock,
    span::{AttrValue, Attributes, IdGenerator, Span, SpanEvent, parse_traceparent},
};
use crate::{
    decode::{openai::ApiCall, vllm::PdRole},
    engines::{
        join::ApiExchange,
        vllm::{EngineTimeline, RequestTrace, StepKind},
    },
};

/// What the spans contain.
#[derive(Clone, Debug)]
pub struct SpanOptions {
    /// 0: entry + `llm_request`; 1: + stage spans; 2: + per-iteration events.
    pub granularity: u8,
    /// Prompt and output text on entry spans.
    pub capture_content: bool,
    /// Model name when the API call did not say (the engine's served model name).
    pub default_model: Option<String>,
}

impl Default for SpanOptions {
    fn default() -> Self {
        Self {
            granularity: 1,
            capture_content: false,
            default_model: None,
        }
    }
}

/// Seconds to whole nanoseconds.
fn ns(seconds: f64) -> i64 {
    (seconds * 1e9).round() as i64
}

/// The spans of one request trace, parents before children.
pub fn spans(
    trace: &RequestTrace,
    options: &SpanOptions,
    clock: &Clock,
    ids: &mut IdGenerator,
) -> Vec<Span> {
    let model = trace
        .api
        .as_ref()
        .and_then(|a| {
            a.call
                .model
                .clone()
                .or_else(|| a.call.response_model.clone())
        })
        .or_else(|| options.default_model.clone());
    let mut out = Vec::new();
    let parent = match &trace.api {
        Some(api) => {
            let entry = entry_span(api, &trace.engine, model.as_deref(), options, clock, ids);
            let parent = (entry.trace_id, Some(entry.span_id));
            out.push(entry);
            Some(parent)
        }
        None => None,
    };
    for timeline in &trace.engine {
        let (trace_id, parent_span) = parent.unwrap_or_else(|| {
            timeline
                .trace_headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("traceparent"))
                .and_then(|(_, v)| parse_traceparent(v))
                .map(|(t, s)| (t, Some(s)))
                .unwrap_or_else(|| (ids.trace_id(), None))
        });
        engine_spans(
            timeline,
            trace.api.as_ref(),
            trace_id,
            parent_span,
            model.as_deref(),
            options,
            clock,
            ids,
            &mut out,
        );
    }
    out
}

fn entry_span(
    api: &ApiExchange,
    engine: &[EngineTimeline],
    model: Option<&str>,
    options: &SpanOptions,
    clock: &Clock,
    ids: &mut IdGenerator,
) -> Span {
    let call = &api.call;
    let operation = call.operation.map_or("unknown", |o| o.name());
    let (trace_id, parent_span_id) = match call.traceparent.as_deref().and_then(parse_traceparent) {
        Some((trace, span)) => (trace, Some(span)),
        None => (ids.trace_id(), None),
    };
    let mut a: Attributes = Vec::with_capacity(24);
    if let Some(op) = call.operation {
        a.push(("gen_ai.span.kind", op.span_kind().into()));
    }
    a.push(("gen_ai.operation.name", operation.into()));
    push_opt(&mut a, "gen_ai.request.model", call.model.clone());
    push_opt(&mut a, "gen_ai.request.choice.count", call.n);
    push_opt(&mut a, "gen_ai.request.temperature", call.temperature);
    push_opt(&mut a, "gen_ai.request.top_p", call.top_p);
    push_opt(&mut a, "gen_ai.request.top_k", call.top_k);
    push_opt(&mut a, "gen_ai.request.max_tokens", call.max_tokens);
    a.push(("gen_ai.request.is_stream", call.stream.into()));
    push_opt(&mut a, "gen_ai.user.id", call.user.clone());
    if call.stream {
        push_opt(&mut a, "session.id", call.response_id.clone());
    }
    push_opt(&mut a, "gen_ai.response.id", call.response_id.clone());
    push_opt(&mut a, "gen_ai.response.model", call.response_model.clone());
    if !call.finish_reasons.is_empty() {
        a.push((
            "gen_ai.response.finish_reasons",
            AttrValue::StrArray(call.finish_reasons.clone()),
        ));
    }
    let (input, output) = usage(call, engine);
    push_opt(&mut a, "gen_ai.usage.input_tokens", input);
    push_opt(&mut a, "gen_ai.usage.output_tokens", output);
    let total = call.usage.total.or(input.zip(output).map(|(i, o)| i + o));
    push_opt(&mut a, "gen_ai.usage.total_tokens", total);
    if options.capture_content {
        push_opt(&mut a, "gen_ai.input.messages", call.input_messages.clone());
        push_opt(
            &mut a,
            "gen_ai.output.messages",
            call.output_messages.clone(),
        );
    }
    let end_ns = api
        .response_last_ns
        .or_else(|| engine.iter().filter_map(|e| e.finished_ns).max())
        .unwrap_or(api.request_last_ns);
    let error = match call.status {
        None => Some("no response: the client closed the connection first".to_owned()),
        Some(status) if status >= 400 => Some(
            call.error
                .clone()
                .unwrap_or_else(|| format!("HTTP {status}")),
        ),
        Some(_) if !api.complete => Some("response cut short".to_owned()),
        Some(_) => None,
    };
    Span {
        trace_id,
        span_id: ids.span_id(),
        parent_span_id,
        name: match model {
            Some(m) => format!("{operation} {m}"),
            None => operation.to_owned(),
        },
        start_time_unix_nano: clock.unix_ns(api.request_first_ns),
        end_time_unix_nano: clock.unix_ns(end_ns),
        attributes: a,
        events: Vec::new(),
        error,
    }
}

/// Input and output tokens: the API's `usage`, else what the engine counted (a streamed
/// response without `include_usage` carries none). The prompt is counted once for n>1.
fn usage(call: &ApiCall, engine: &[EngineTimeline]) -> (Option<u64>, Option<u64>) {
    let engine_input = engine.iter().find_map(|e| e.prompt_tokens);
    let engine_output =
        (!engine.is_empty()).then(|| engine.iter().map(|e| e.completion_tokens).sum());
    (
        call.usage.input.or(engine_input),
        call.usage.output.or(engine_output),
    )
}

fn push_opt<T: Into<AttrValue>>(a: &mut Attributes, key: &'static str, value: Option<T>) {
    if let Some(v) = value {
        a.push((key, v.into()));
    }
}

#[allow(clippy::too_many_arguments)]
fn engine_spans(
    t: &EngineTimeline,
    api: Option<&ApiExchange>,
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    model: Option<&str>,
    options: &SpanOptions,
    clock: &Clock,
    ids: &mut IdGenerator,
    out: &mut Vec<Span>,
) {
    let arrival = clock.unix_ns_of_wall_secs(t.arrival_time);
    let end = t
        .finished_ns
        .map(|n| clock.unix_ns(n))
        .unwrap_or(arrival)
        .max(arrival);
    let common = |a: &mut Attributes| {
        a.push(("gen_ai.request.id", t.request_id.as_str().into()));
        push_opt(a, "gen_ai.request.model_name", model);
        push_opt(a, "gen_ai.engine.index", t.engine_index);
        a.push(("gen_ai.pd_role", t.pd_role.as_str().into()));
    };
    let mut a: Attributes = Vec::with_capacity(24);
    common(&mut a);
    if let Some(s) = &t.sampling {
        a.push(("gen_ai.request.temperature", s.temperature.into()));
        a.push(("gen_ai.request.top_p", s.top_p.into()));
        push_opt(&mut a, "gen_ai.request.max_tokens", s.max_tokens);
        a.push(("gen_ai.request.n", s.n.into()));
    }
    push_opt(&mut a, "gen_ai.usage.prompt_tokens", t.prompt_tokens);
    a.push(("gen_ai.usage.completion_tokens", t.completion_tokens.into()));
    push_opt(
        &mut a,
        "gen_ai.usage.cache_read.input_tokens",
        t.cached_tokens,
    );
    if t.finished_ns.is_some() {
        a.push(("gen_ai.latency.e2e", (end - arrival).into()));
    }
    let since_arrival = |mono_ns: u64| clock.unix_ns(mono_ns).saturating_sub(arrival);
    let engine_events = t.has_engine_events();
    if engine_events {
        let (queued, scheduled) = (t.queued.unwrap_or(0.0), t.scheduled.unwrap_or(0.0));
        a.push((
            "gen_ai.latency.time_in_queue",
            ns(scheduled - queued).into(),
        ));
        if let (Some(first), Some(last)) = (t.first_token, t.last_token) {
            a.push((
                "gen_ai.latency.time_in_model_prefill",
                ns(first - scheduled).into(),
            ));
            a.push((
                "gen_ai.latency.time_in_model_decode",
                ns(last - first).into(),
            ));
            a.push((
                "gen_ai.latency.time_in_model_inference",
                ns(last - scheduled).into(),
            ));
        }
    } else if let (Some(first), Some(last)) = (t.first_token, t.last_token) {
        // Log stats off: no QUEUED/SCHEDULED events, so only decode has both ends.
        a.push((
            "gen_ai.latency.time_in_model_decode",
            ns(last - first).into(),
        ));
    }
    a.push(("infertrace.engine_events", engine_events.into()));
    if let Some(first) = t.first_output_ns {
        a.push((
            "gen_ai.latency.time_to_first_token",
            since_arrival(first).into(),
        ));
    }
    if let Some(api) = api {
        if t.add_sent_ns >= api.request_last_ns {
            a.push((
                "gen_ai.latency.time_in_tokenize",
                (t.add_sent_ns - api.request_last_ns).into(),
            ));
        }
        let writes = match api.response_first_ns {
            Some(_) if api.call.stream => api.call.content_event_ns.clone(),
            Some(first) => vec![first],
            None => Vec::new(),
        };
        push_opt(
            &mut a,
            "gen_ai.latency.time_in_detokenize",
            detokenize_ns(&t.output_ns, &writes),
        );
    }
    if t.preemptions > 0 {
        a.push((
            "gen_ai.request.preemption_count",
            u64::from(t.preemptions).into(),
        ));
    }
    if let Some(reason) = t.finish_reason {
        a.push(("infertrace.finish_reason", reason.as_str().into()));
    }
    let span_id = ids.span_id();
    let mut events = Vec::new();
    if options.granularity >= 2 {
        events = iteration_events(t, clock);
        if t.steps_dropped > 0 {
            a.push((
                "infertrace.events_dropped",
                u64::from(t.steps_dropped).into(),
            ));
        }
    }
    out.push(Span {
        trace_id,
        span_id,
        parent_span_id: parent,
        name: "llm_request".into(),
        start_time_unix_nano: arrival,
        end_time_unix_nano: end,
        attributes: a,
        events,
        error: None,
    });
    if options.granularity == 0 || !engine_events {
        return;
    }
    let (Some(queued), Some(scheduled)) = (t.queued, t.scheduled) else {
        return;
    };
    let mut stage = |name: &'static str, from: f64, to: f64| {
        let mut a = Vec::with_capacity(4);
        common(&mut a);
        out.push(Span {
            trace_id,
            span_id: ids.span_id(),
            parent_span_id: Some(span_id),
            name: name.into(),
            start_time_unix_nano: clock.unix_ns_of_mono_secs(from),
            end_time_unix_nano: clock.unix_ns_of_mono_secs(to),
            attributes: a,
            events: Vec::new(),
            error: None,
        });
    };
    stage("wait", queued, scheduled);
    if let (Some(first), Some(last)) = (t.first_token, t.last_token) {
        if t.pd_role != PdRole::Consumer {
            stage("prefill", scheduled, first);
        }
        if t.pd_role != PdRole::Producer && t.completion_tokens > 1 {
            stage("decode", first, last);
        }
    }
}

/// Time from each output's arrival at the frontend to the response bytes written for it:
/// every write is paired with the latest output received before it (an output followed by
/// another before any write was still being turned into text when the next arrived).
fn detokenize_ns(outputs: &[u64], writes: &[u64]) -> Option<u64> {
    if outputs.is_empty() || writes.is_empty() {
        return None;
    }
    let (mut total, mut next, mut paired) = (0, 0, None);
    for &w in writes {
        while next < outputs.len() && outputs[next] <= w {
            next += 1;
        }
        if next > 0 && paired != Some(next - 1) {
            total += w - outputs[next - 1];
            paired = Some(next - 1);
        }
    }
    Some(total)
}

fn iteration_events(t: &EngineTimeline, clock: &Clock) -> Vec<SpanEvent> {
    t.steps
        .iter()
        .map(|step| {
            let mut a: Attributes = Vec::with_capacity(4);
            push_opt(&mut a, "gen_ai.engine.index", t.engine_index);
            if matches!(step.kind, StepKind::Prefill | StepKind::Decode) {
                a.push((
                    "gen_ai.token.ids",
                    AttrValue::IntArray(
                        step.token_ids
                            .iter()
                            .map(|&id| i64::try_from(id).unwrap_or(i64::MAX))
                            .collect(),
                    ),
                ));
                a.push(("gen_ai.token.count", (step.token_ids.len() as u64).into()));
                if let Some(lp) = &step.logprobs {
                    a.push((
                        "gen_ai.token.logprobs",
                        AttrValue::FloatArray(lp.iter().map(|&p| f64::from(p)).collect()),
                    ));
                }
            }
            SpanEvent {
                name: match step.kind {
                    StepKind::Wait => "WAIT",
                    StepKind::Prefill => "PREFILL",
                    StepKind::Decode => "DECODE",
                    StepKind::Preempted => "PREEMPTED",
                },
                time_unix_nano: clock.unix_ns_of_mono_secs(step.timestamp),
                attributes: a,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detokenize_pairs_each_write_with_the_latest_output() {
        assert_eq!(detokenize_ns(&[], &[5]), None);
        assert_eq!(detokenize_ns(&[1, 10, 20], &[3, 12, 25]), Some(2 + 2 + 5));
        // Two outputs before one write: only the latest counts; a write with no new output
        // (e.g. the final usage chunk) adds nothing.
        assert_eq!(detokenize_ns(&[1, 2], &[4, 6]), Some(2));
    }
}
