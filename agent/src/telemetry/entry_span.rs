//! The entry span of an API call (`chat {model}`, `text_completion {model}`, ...): what the
//! HTTP exchange says, completed by what the engine side measured. Shared by every engine.
use super::{
    Clock, SpanOptions,
    span::{AttrValue, Attributes, IdGenerator, Span, parse_traceparent},
};
use crate::decode::openai::RequestInput;
use crate::engines::common::join::{ApiExchange, EngineSide};

pub fn entry_span(
    api: &ApiExchange,
    engine: &EngineSide,
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
    let (input, output) = engine.tokens(call);
    push_opt(&mut a, "gen_ai.usage.input_tokens", input);
    push_opt(&mut a, "gen_ai.usage.output_tokens", output);
    let total = call.usage.total.or(input.zip(output).map(|(i, o)| i + o));
    push_opt(&mut a, "gen_ai.usage.total_tokens", total);
    if options.capture_content {
        push_opt(
            &mut a,
            "gen_ai.input.messages",
            call.input.as_ref().and_then(RequestInput::messages),
        );
        push_opt(
            &mut a,
            "gen_ai.output.messages",
            call.output_messages.clone(),
        );
    }
    let end_ns = api
        .response_last_ns
        .or(engine.finished_ns)
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
        links: Vec::new(),
        error,
    }
}

pub fn push_opt<T: Into<AttrValue>>(a: &mut Attributes, key: &'static str, value: Option<T>) {
    if let Some(v) = value {
        a.push((key, v.into()));
    }
}
