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
use super::tracker::{StepKind, VllmTimeline, VllmTrace, engine_side};
use crate::engines::common::{join::ApiExchange, pd_role::PdRole};
use crate::telemetry::{
    Clock, SpanOptions,
    entry_span::{entry_span, push_opt},
    gpu, python_samples,
    span::{AttrValue, Attributes, IdGenerator, Span, SpanEvent, parse_traceparent},
};

/// Seconds to whole nanoseconds.
fn ns(seconds: f64) -> i64 {
    (seconds * 1e9).round() as i64
}

/// The spans of one request trace, parents before children.
pub fn spans(
    trace: &VllmTrace,
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
            let side = engine_side(&trace.engine);
            let entry = entry_span(api, &side, model.as_deref(), options, clock, ids);
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

#[allow(clippy::too_many_arguments)]
fn engine_spans(
    t: &VllmTimeline,
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
        a.push(("gen_ai.pd_role", PdRole::kv_role(t.pd_role).into()));
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
            clock.ns_since_wall_secs(t.arrival_time, first).into(),
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
        links: Vec::new(),
        error: None,
    });
    if options.granularity == 0 {
        return;
    }
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
            links: Vec::new(),
            error: None,
        });
    };
    // wait and prefill need the engine's QUEUED/SCHEDULED events; decode only its step times.
    let events = t.queued.zip(t.scheduled).filter(|_| engine_events);
    if let Some((queued, scheduled)) = events {
        stage("wait", queued, scheduled);
    }
    if let (Some(first), Some(last)) = (t.first_token, t.last_token) {
        if let Some((_, scheduled)) = events
            && t.pd_role != Some(PdRole::Decode)
        {
            stage("prefill", scheduled, first);
        }
        if t.pd_role != Some(PdRole::Prefill) && t.completion_tokens > 1 {
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

fn iteration_events(t: &VllmTimeline, clock: &Clock) -> Vec<SpanEvent> {
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
                if let Some(gpu) = &step.gpu {
                    gpu::iteration_attributes(&mut a, gpu);
                }
                if let Some(samples) = &step.python {
                    python_samples::iteration_attributes(&mut a, samples);
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

    use crate::{
        decode::openai::{ApiCall, Operation, RequestInput, Usage},
        engines::vllm::{
            tracker::RequestStep,
            wire::{FinishReason, Sampling},
        },
    };

    /// CLOCK_REALTIME - CLOCK_MONOTONIC.
    const R: i128 = 1_759_000_000_000_000_000;
    /// Wall clock at arrival: monotonic 1000.5 s.
    const ARRIVAL: f64 = 1_759_001_000.5;
    const ARRIVAL_UNIX_NS: u64 = 1_759_001_000_500_000_000;
    /// Monotonic ns of 1000 s + `ms`.
    const fn mono(ms: u64) -> u64 {
        1_000_000_000_000 + ms * 1_000_000
    }
    // Engine timestamps (monotonic seconds), exact in binary.
    const QUEUED: f64 = 1000.5078125;
    const SCHEDULED: f64 = 1000.5625;
    const FIRST: f64 = 1000.625;
    const LAST: f64 = 1000.75;
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn clock() -> Clock {
        Clock::fixed(R)
    }

    fn step(kind: StepKind, timestamp: f64, token_ids: &[u64]) -> RequestStep {
        RequestStep {
            kind,
            timestamp,
            token_ids: token_ids.to_vec(),
            logprobs: None,
            gpu: None,
            python: None,
        }
    }

    fn timeline() -> VllmTimeline {
        VllmTimeline {
            request_id: "chatcmpl-X-abcdef12".into(),
            external_id: Some("chatcmpl-X".into()),
            sampling: Some(Sampling {
                n: 1,
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                max_tokens: Some(4),
                logprobs: None,
            }),
            prompt_tokens: Some(5),
            cached_tokens: Some(0),
            arrival_time: ARRIVAL,
            trace_headers: Vec::new(),
            pd_role: None,
            add_sent_ns: mono(501),
            queued: Some(QUEUED),
            scheduled: Some(SCHEDULED),
            first_token: Some(FIRST),
            last_token: Some(LAST),
            first_output_ns: Some(mono(630)),
            finished_ns: Some(mono(760)),
            last_output_ns: Some(mono(760)),
            output_ns: vec![mono(630), mono(700), mono(760)],
            completion_tokens: 3,
            preemptions: 0,
            finish_reason: Some(FinishReason::Length),
            aborted_by_frontend: false,
            engine_index: Some(0),
            steps: vec![
                step(StepKind::Wait, QUEUED, &[]),
                step(StepKind::Prefill, FIRST, &[11]),
                step(StepKind::Decode, 1000.6875, &[12]),
                step(StepKind::Decode, LAST, &[13]),
            ],
            steps_dropped: 0,
        }
    }

    fn api() -> ApiExchange {
        ApiExchange {
            call: ApiCall {
                operation: Some(Operation::Chat),
                model: Some("tiny".into()),
                max_tokens: Some(4),
                input: Some(RequestInput {
                    // As a client writes it: exported compact, its keys in order.
                    value: r#"[ {"role": "user", "content": "hi"} ]"#.into(),
                    documents: None,
                }),
                status: Some(200),
                response_id: Some("chatcmpl-X".into()),
                response_model: Some("tiny".into()),
                finish_reasons: vec!["length".into()],
                usage: Usage {
                    input: Some(5),
                    output: Some(3),
                    total: Some(8),
                },
                output_messages: Some(r#"[{"content":"abc","role":"assistant"}]"#.into()),
                ..ApiCall::default()
            },
            request_first_ns: mono(499),
            request_last_ns: mono(500),
            response_first_ns: Some(mono(765)),
            response_last_ns: Some(mono(766)),
            complete: true,
        }
    }

    fn trace() -> VllmTrace {
        VllmTrace {
            api: Some(api()),
            engine: vec![timeline()],
        }
    }

    fn spans_at(trace: &VllmTrace, granularity: u8) -> Vec<Span> {
        let options = SpanOptions {
            granularity,
            ..SpanOptions::default()
        };
        spans(trace, &options, &clock(), &mut IdGenerator::default())
    }

    fn names(spans: &[Span]) -> Vec<&str> {
        spans.iter().map(|s| s.name.as_str()).collect()
    }

    fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span in {:?}", names(spans)))
    }

    fn int(span: &Span, key: &str) -> Option<i64> {
        match span.attribute(key) {
            Some(AttrValue::Int(v)) => Some(*v),
            None => None,
            Some(other) => panic!("{key} is not an int: {other:?}"),
        }
    }

    fn text<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
        match span.attribute(key) {
            Some(AttrValue::Str(v)) => Some(v),
            None => None,
            Some(other) => panic!("{key} is not a string: {other:?}"),
        }
    }

    #[test]
    fn span_tree_and_stage_spans() {
        let clock = clock();
        let spans = spans_at(&trace(), 1);
        assert_eq!(
            names(&spans),
            ["chat tiny", "llm_request", "wait", "prefill", "decode"]
        );
        let (entry, llm) = (&spans[0], &spans[1]);
        assert_eq!(entry.parent_span_id, None);
        assert_eq!(llm.parent_span_id, Some(entry.span_id));
        for stage in &spans[2..] {
            assert_eq!(stage.parent_span_id, Some(llm.span_id), "{}", stage.name);
            assert!(stage.events.is_empty());
            assert_eq!(stage.error, None);
            assert_eq!(
                text(stage, "gen_ai.request.id"),
                Some("chatcmpl-X-abcdef12")
            );
            assert_eq!(text(stage, "gen_ai.request.model_name"), Some("tiny"));
            assert_eq!(int(stage, "gen_ai.engine.index"), Some(0));
            assert_eq!(text(stage, "gen_ai.pd_role"), Some("none"));
        }
        assert!(spans.iter().all(|s| s.trace_id == entry.trace_id));
        let mut ids: Vec<_> = spans.iter().map(|s| s.span_id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), spans.len(), "span ids are unique");
        // Times.
        assert_eq!(entry.start_time_unix_nano, clock.unix_ns(mono(499)));
        assert_eq!(entry.end_time_unix_nano, clock.unix_ns(mono(766)));
        assert_eq!(llm.start_time_unix_nano, ARRIVAL_UNIX_NS);
        assert_eq!(llm.end_time_unix_nano, clock.unix_ns(mono(760)));
        let at = |secs: f64| clock.unix_ns_of_mono_secs(secs);
        let window = |s: &Span| (s.start_time_unix_nano, s.end_time_unix_nano);
        assert_eq!(window(named(&spans, "wait")), (at(QUEUED), at(SCHEDULED)));
        assert_eq!(window(named(&spans, "prefill")), (at(SCHEDULED), at(FIRST)));
        assert_eq!(window(named(&spans, "decode")), (at(FIRST), at(LAST)));
        assert_eq!(at(QUEUED), 1_759_001_000_507_812_500);
        // No kv_transfer, ever.
        assert!(!names(&spans).contains(&"kv_transfer"));
        // Granularity 1 has no iteration events.
        assert!(llm.events.is_empty());
    }

    #[test]
    fn granularity_0_has_no_stage_spans_and_2_has_iteration_events() {
        let spans = spans_at(&trace(), 0);
        assert_eq!(names(&spans), ["chat tiny", "llm_request"]);
        assert!(spans[1].events.is_empty());

        let mut t = trace();
        let e = &mut t.engine[0];
        e.preemptions = 1;
        e.steps.insert(3, step(StepKind::Preempted, 1000.7, &[]));
        e.steps[3 + 1].token_ids = vec![13, 14];
        let spans = spans_at(&t, 2);
        assert_eq!(
            names(&spans),
            ["chat tiny", "llm_request", "wait", "prefill", "decode"]
        );
        let events = &spans[1].events;
        assert_eq!(
            events.iter().map(|e| e.name).collect::<Vec<_>>(),
            ["WAIT", "PREFILL", "DECODE", "PREEMPTED", "DECODE"]
        );
        let clock = clock();
        assert_eq!(events[0].time_unix_nano, clock.unix_ns_of_mono_secs(QUEUED));
        assert_eq!(events[3].time_unix_nano, clock.unix_ns_of_mono_secs(1000.7));
        let attr = |i: usize, key: &str| {
            events[i]
                .attributes
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        for i in 0..events.len() {
            assert_eq!(attr(i, "gen_ai.engine.index"), Some(AttrValue::Int(0)));
        }
        assert_eq!(attr(0, "gen_ai.token.ids"), None);
        assert_eq!(attr(0, "gen_ai.token.count"), None);
        assert_eq!(attr(3, "gen_ai.token.ids"), None);
        assert_eq!(
            attr(1, "gen_ai.token.ids"),
            Some(AttrValue::IntArray(vec![11]))
        );
        assert_eq!(attr(1, "gen_ai.token.count"), Some(AttrValue::Int(1)));
        assert_eq!(
            attr(4, "gen_ai.token.ids"),
            Some(AttrValue::IntArray(vec![13, 14]))
        );
        assert_eq!(attr(4, "gen_ai.token.count"), Some(AttrValue::Int(2)));
        assert_eq!(attr(1, "gen_ai.token.logprobs"), None);
        assert_eq!(int(&spans[1], "infertrace.events_dropped"), None);
        // Dropped iterations are said.
        t.engine[0].steps_dropped = 7;
        let spans = spans_at(&t, 2);
        assert_eq!(int(&spans[1], "infertrace.events_dropped"), Some(7));
        assert_eq!(
            attr(1, "infertrace.cuda.kernel_launches"),
            None,
            "not probed"
        );
    }

    #[test]
    fn an_iteration_says_what_it_launched_and_where_the_engine_was_sampled() {
        use crate::engines::common::{
            iteration_work::{IterationLaunches, IterationSamples},
            well_known::{Phase, SampleKind},
        };
        let mut t = trace();
        t.engine[0].steps[1].python = Some(IterationSamples {
            samples: 3,
            by_kind: [
                (SampleKind::Phase(Phase::ModelExecution), 2),
                (SampleKind::Native, 1),
            ]
            .into(),
        });
        t.engine[0].steps[1].gpu = Some(IterationLaunches {
            synchronizations: 2,
            kernel_launches: 812,
            graph_launches: 1,
            cpu_launch_ns: Some(3_500_000),
            cpu_sync_wait_ns: 9_000_000,
        });
        let spans = spans_at(&t, 2);
        let prefill = &spans[1].events[1];
        assert_eq!(prefill.name, "PREFILL");
        let attr = |key: &str| {
            prefill
                .attributes
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        for (key, value) in [
            ("infertrace.cuda.kernel_launches", 812),
            ("infertrace.cuda.graph_launches", 1),
            ("infertrace.cuda.synchronizations", 2),
            ("infertrace.cuda.cpu_launch_ns", 3_500_000),
            ("infertrace.cuda.cpu_sync_wait_ns", 9_000_000),
            ("infertrace.python.samples", 3),
            ("infertrace.python.samples.model_execution", 2),
            ("infertrace.python.samples.native", 1),
        ] {
            assert_eq!(attr(key), Some(AttrValue::Int(value)), "{key}");
        }
        assert_eq!(attr("infertrace.python.samples.schedule"), None);
        // The other iterations were not seen by the probes nor sampled: no figures, not zeros.
        let decode = &spans[1].events[2];
        assert!(decode.attributes.iter().all(|(k, _)| {
            !k.starts_with("infertrace.cuda") && !k.starts_with("infertrace.python")
        }));
    }

    #[test]
    fn llm_request_attributes_in_integer_nanoseconds() {
        let spans = spans_at(&trace(), 1);
        let llm = named(&spans, "llm_request");
        let ns_of = |from: f64, to: f64| ((to - from) * 1e9).round() as i64;
        for (key, expected, from, to) in [
            (
                "gen_ai.latency.time_in_queue",
                54_687_500,
                QUEUED,
                SCHEDULED,
            ),
            (
                "gen_ai.latency.time_in_model_prefill",
                62_500_000,
                SCHEDULED,
                FIRST,
            ),
            (
                "gen_ai.latency.time_in_model_decode",
                125_000_000,
                FIRST,
                LAST,
            ),
            (
                "gen_ai.latency.time_in_model_inference",
                187_500_000,
                SCHEDULED,
                LAST,
            ),
        ] {
            assert_eq!(int(llm, key), Some(expected), "{key}");
            assert_eq!(expected, ns_of(from, to), "{key}");
        }
        // Frontend clock: from arrival_time (wall) to the capture times of the outputs.
        assert_eq!(
            int(llm, "gen_ai.latency.time_to_first_token"),
            Some(130_000_000)
        );
        assert_eq!(int(llm, "gen_ai.latency.e2e"), Some(260_000_000));
        assert_eq!(int(llm, "gen_ai.latency.time_in_tokenize"), Some(1_000_000));
        assert_eq!(
            int(llm, "gen_ai.latency.time_in_detokenize"),
            Some(5_000_000)
        );
        assert_eq!(int(llm, "gen_ai.usage.prompt_tokens"), Some(5));
        assert_eq!(int(llm, "gen_ai.usage.completion_tokens"), Some(3));
        // Reported when 0 (cache hit ratio).
        assert_eq!(int(llm, "gen_ai.usage.cache_read.input_tokens"), Some(0));
        assert_eq!(int(llm, "gen_ai.request.n"), Some(1));
        assert_eq!(int(llm, "gen_ai.request.max_tokens"), Some(4));
        assert_eq!(
            llm.attribute("gen_ai.request.temperature"),
            Some(&AttrValue::Float(0.0))
        );
        assert_eq!(
            llm.attribute("gen_ai.request.top_p"),
            Some(&AttrValue::Float(1.0))
        );
        assert_eq!(text(llm, "gen_ai.request.id"), Some("chatcmpl-X-abcdef12"));
        assert_eq!(text(llm, "gen_ai.request.model_name"), Some("tiny"));
        assert_eq!(int(llm, "gen_ai.engine.index"), Some(0));
        assert_eq!(text(llm, "gen_ai.pd_role"), Some("none"));
        assert_eq!(
            llm.attribute("infertrace.engine_events"),
            Some(&AttrValue::Bool(true))
        );
        assert_eq!(text(llm, "infertrace.finish_reason"), Some("length"));
        assert_eq!(int(llm, "gen_ai.request.preemption_count"), None);
        assert_eq!(llm.error, None);
        for span in &spans {
            assert_eq!(span.attribute("gen_ai.latency.time_in_kv_transfer"), None);
        }

        // Realistic (inexact) engine timestamps still give whole nanoseconds of the difference.
        let mut t = trace();
        let e = &mut t.engine[0];
        e.queued = Some(12_345.678_901_234);
        e.scheduled = Some(12_345.689_012_345);
        e.first_token = Some(12_345.791_113_579);
        e.last_token = Some(12_346.013_579_246);
        e.preemptions = 2;
        e.cached_tokens = Some(48);
        let spans = spans_at(&t, 1);
        let llm = named(&spans, "llm_request");
        let (q, s, f, l) = (
            12_345.678_901_234,
            12_345.689_012_345,
            12_345.791_113_579,
            12_346.013_579_246,
        );
        assert_eq!(int(llm, "gen_ai.latency.time_in_queue"), Some(ns_of(q, s)));
        assert_eq!(ns_of(q, s), 10_111_111);
        assert_eq!(
            int(llm, "gen_ai.latency.time_in_model_prefill"),
            Some(ns_of(s, f))
        );
        assert_eq!(
            int(llm, "gen_ai.latency.time_in_model_decode"),
            Some(ns_of(f, l))
        );
        assert_eq!(
            int(llm, "gen_ai.latency.time_in_model_inference"),
            Some(ns_of(s, l))
        );
        assert_eq!(int(llm, "gen_ai.request.preemption_count"), Some(2));
        assert_eq!(int(llm, "gen_ai.usage.cache_read.input_tokens"), Some(48));
    }

    #[test]
    fn entry_span_attributes_and_content() {
        let spans = spans_at(&trace(), 1);
        let entry = &spans[0];
        assert_eq!(entry.error, None);
        assert_eq!(text(entry, "gen_ai.span.kind"), Some("LLM"));
        assert_eq!(text(entry, "gen_ai.operation.name"), Some("chat"));
        assert_eq!(text(entry, "gen_ai.request.model"), Some("tiny"));
        assert_eq!(text(entry, "gen_ai.response.id"), Some("chatcmpl-X"));
        assert_eq!(text(entry, "gen_ai.response.model"), Some("tiny"));
        assert_eq!(int(entry, "gen_ai.request.max_tokens"), Some(4));
        assert_eq!(
            entry.attribute("gen_ai.request.is_stream"),
            Some(&AttrValue::Bool(false))
        );
        assert_eq!(text(entry, "session.id"), None);
        assert_eq!(
            entry.attribute("gen_ai.response.finish_reasons"),
            Some(&AttrValue::StrArray(vec!["length".into()]))
        );
        assert_eq!(int(entry, "gen_ai.usage.input_tokens"), Some(5));
        assert_eq!(int(entry, "gen_ai.usage.output_tokens"), Some(3));
        assert_eq!(int(entry, "gen_ai.usage.total_tokens"), Some(8));
        // Content only when asked for.
        assert_eq!(entry.attribute("gen_ai.input.messages"), None);
        assert_eq!(entry.attribute("gen_ai.output.messages"), None);
        let options = SpanOptions {
            capture_content: true,
            ..SpanOptions::default()
        };
        let spans = super::spans(&trace(), &options, &clock(), &mut IdGenerator::default());
        assert_eq!(
            text(&spans[0], "gen_ai.input.messages"),
            Some(r#"[{"content":"hi","role":"user"}]"#)
        );
        assert_eq!(
            text(&spans[0], "gen_ai.output.messages"),
            Some(r#"[{"content":"abc","role":"assistant"}]"#)
        );
        // Never on llm_request.
        assert!(
            spans[1..]
                .iter()
                .all(|s| s.attribute("gen_ai.input.messages").is_none())
        );

        // A stream without usage: the session id, and the engine's counts.
        let mut t = trace();
        let call = &mut t.api.as_mut().expect("api").call;
        call.stream = true;
        call.usage = Usage::default();
        let spans = spans_at(&t, 1);
        assert_eq!(text(&spans[0], "session.id"), Some("chatcmpl-X"));
        assert_eq!(int(&spans[0], "gen_ai.usage.input_tokens"), Some(5));
        assert_eq!(int(&spans[0], "gen_ai.usage.output_tokens"), Some(3));
        assert_eq!(int(&spans[0], "gen_ai.usage.total_tokens"), Some(8));
    }

    #[test]
    fn without_engine_events_queue_and_prefill_are_left_out() {
        let mut t = trace();
        t.engine[0].queued = None;
        t.engine[0].scheduled = None;
        t.engine[0].steps.remove(0);
        for granularity in [1, 2] {
            let spans = spans_at(&t, granularity);
            let llm = named(&spans, "llm_request");
            for key in [
                "gen_ai.latency.time_in_queue",
                "gen_ai.latency.time_in_model_prefill",
                "gen_ai.latency.time_in_model_inference",
            ] {
                assert_eq!(llm.attribute(key), None, "{key}");
            }
            assert_eq!(
                int(llm, "gen_ai.latency.time_in_model_decode"),
                Some(125_000_000)
            );
            assert_eq!(
                int(llm, "gen_ai.latency.time_to_first_token"),
                Some(130_000_000)
            );
            assert_eq!(int(llm, "gen_ai.latency.e2e"), Some(260_000_000));
            assert_eq!(
                llm.attribute("infertrace.engine_events"),
                Some(&AttrValue::Bool(false))
            );
            let n = names(&spans);
            assert!(!n.contains(&"wait") && !n.contains(&"prefill"), "{n:?}");
        }
        // QUEUED without SCHEDULED is no better.
        t.engine[0].queued = Some(QUEUED);
        let spans = spans_at(&t, 1);
        assert_eq!(
            named(&spans, "llm_request").attribute("gen_ai.latency.time_in_queue"),
            None
        );
        assert!(!names(&spans).contains(&"wait"));
    }

    /// docs/accuracy.md: with `--disable-log-stats` infertrace "omits queue, prefill and
    /// inference (and the `wait`/`prefill` spans), keeps decode (step timestamps)".
    #[test]
    fn without_engine_events_the_decode_span_is_kept() {
        let mut t = trace();
        t.engine[0].queued = None;
        t.engine[0].scheduled = None;
        let spans = spans_at(&t, 1);
        let decode = named(&spans, "decode");
        let clock = clock();
        assert_eq!(
            decode.start_time_unix_nano,
            clock.unix_ns_of_mono_secs(FIRST)
        );
        assert_eq!(decode.end_time_unix_nano, clock.unix_ns_of_mono_secs(LAST));
    }

    #[test]
    fn pd_roles_keep_their_own_stage() {
        let stages = |role| {
            let mut t = trace();
            t.engine[0].pd_role = role;
            let spans = spans_at(&t, 1);
            for s in &spans[1..] {
                assert_eq!(
                    text(s, "gen_ai.pd_role"),
                    Some(PdRole::kv_role(role)),
                    "{}",
                    s.name
                );
            }
            names(&spans[2..])
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let producer = stages(Some(PdRole::Prefill));
        assert!(producer.contains(&"prefill".to_owned()), "{producer:?}");
        assert!(!producer.contains(&"decode".to_owned()), "{producer:?}");
        let consumer = stages(Some(PdRole::Decode));
        assert!(consumer.contains(&"decode".to_owned()), "{consumer:?}");
        assert!(!consumer.contains(&"prefill".to_owned()), "{consumer:?}");
        let none = stages(None);
        assert!(none.contains(&"prefill".to_owned()) && none.contains(&"decode".to_owned()));
    }

    #[test]
    fn an_incoming_traceparent_is_continued() {
        let (trace_id, parent) = parse_traceparent(TRACEPARENT).expect("valid");
        let mut t = trace();
        t.api.as_mut().expect("api").call.traceparent = Some(TRACEPARENT.into());
        let spans = spans_at(&t, 1);
        assert_eq!(spans[0].trace_id, trace_id);
        assert_eq!(spans[0].parent_span_id, Some(parent));
        assert_ne!(spans[0].span_id, parent);
        assert!(spans.iter().all(|s| s.trace_id == trace_id));
        assert_eq!(spans[1].parent_span_id, Some(spans[0].span_id));
        // An invalid header starts a new trace.
        t.api.as_mut().expect("api").call.traceparent = Some("00-zz-yy-01".into());
        let spans = spans_at(&t, 1);
        assert_ne!(spans[0].trace_id, trace_id);
        assert_eq!(spans[0].parent_span_id, None);
        // Without a call, llm_request continues the trace the frontend forwarded to the engine.
        let mut alone = trace();
        alone.api = None;
        alone.engine[0].trace_headers = vec![("traceparent".into(), TRACEPARENT.into())];
        let spans = spans_at(&alone, 1);
        assert_eq!(names(&spans), ["llm_request", "wait", "prefill", "decode"]);
        assert_eq!(spans[0].trace_id, trace_id);
        assert_eq!(spans[0].parent_span_id, Some(parent));
        // The model name then comes from the options.
        assert_eq!(text(&spans[0], "gen_ai.request.model_name"), None);
        let options = SpanOptions {
            default_model: Some("served".into()),
            ..SpanOptions::default()
        };
        let spans = super::spans(&alone, &options, &clock(), &mut IdGenerator::default());
        assert_eq!(text(&spans[0], "gen_ai.request.model_name"), Some("served"));
    }

    #[test]
    fn an_invalid_call_has_an_error_entry_span_only() {
        let mut t = trace();
        t.engine.clear();
        let api = t.api.as_mut().expect("api");
        api.call = ApiCall {
            operation: Some(Operation::Chat),
            model: Some("tiny".into()),
            status: Some(400),
            error: Some("bad request".into()),
            ..ApiCall::default()
        };
        let spans = spans_at(&t, 2);
        assert_eq!(names(&spans), ["chat tiny"]);
        assert_eq!(spans[0].error.as_deref(), Some("bad request"));
        assert_eq!(spans[0].end_time_unix_nano, clock().unix_ns(mono(766)));
        assert_eq!(int(&spans[0], "gen_ai.usage.output_tokens"), None);
        // Without an error message: the status.
        t.api.as_mut().expect("api").call.error = None;
        assert_eq!(spans_at(&t, 1)[0].error.as_deref(), Some("HTTP 400"));
    }

    #[test]
    fn a_client_abort_has_a_no_response_error() {
        let mut t = trace();
        let api = t.api.as_mut().expect("api");
        api.call.status = None;
        api.call.response_id = None;
        api.call.response_model = None;
        api.call.finish_reasons.clear();
        api.call.usage = Usage::default();
        api.call.output_messages = None;
        api.response_first_ns = None;
        api.response_last_ns = None;
        api.complete = false;
        let e = &mut t.engine[0];
        e.finish_reason = Some(FinishReason::Abort);
        e.aborted_by_frontend = true;
        e.finished_ns = Some(mono(700));
        e.output_ns.truncate(2);
        e.last_token = Some(1000.6875);
        e.completion_tokens = 2;
        let spans = spans_at(&t, 1);
        assert_eq!(names(&spans)[..2], ["chat tiny", "llm_request"]);
        let entry = &spans[0];
        assert!(
            entry
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("no response")),
            "{:?}",
            entry.error
        );
        // It ends when the request was aborted.
        assert_eq!(entry.end_time_unix_nano, clock().unix_ns(mono(700)));
        let llm = &spans[1];
        assert_eq!(llm.error, None);
        assert_eq!(text(llm, "infertrace.finish_reason"), Some("abort"));
        assert_eq!(int(llm, "gen_ai.latency.e2e"), Some(200_000_000));
        assert_eq!(int(llm, "gen_ai.latency.time_in_detokenize"), None);
        assert_eq!(int(&spans[0], "gen_ai.usage.output_tokens"), Some(2));
        // Cut short after a 200: its own error.
        let mut t = trace();
        t.api.as_mut().expect("api").complete = false;
        assert_eq!(
            spans_at(&t, 1)[0].error.as_deref(),
            Some("response cut short")
        );
    }
}
