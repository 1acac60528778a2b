//! The OpenAI-compatible API calls of an HTTP exchange: what the client asked for (request
//! JSON) and what it got (response JSON, or the chunks of an SSE stream).
//!
//! Only fields that are present are reported: an absent `temperature` stays absent here (the
//! engine's own value is reported on `llm_request`, from the engine's message).
use std::{borrow::Cow, collections::BTreeMap};

use serde::Deserialize;
use serde_json::{Value, value::RawValue};

use super::http::HttpExchange;

/// The API operation, from the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Chat,
    TextCompletion,
    Embeddings,
    Rerank,
}

impl Operation {
    /// Paths served by vLLM's OpenAI-compatible server (query strings ignored).
    pub fn from_path(path: &str) -> Option<Self> {
        let path = path.split('?').next().unwrap_or(path);
        Some(match path {
            "/v1/chat/completions" => Self::Chat,
            "/v1/completions" => Self::TextCompletion,
            "/v1/embeddings" | "/pooling" => Self::Embeddings,
            "/rerank" | "/v1/rerank" | "/v2/rerank" | "/score" | "/v1/score" => Self::Rerank,
            _ => return None,
        })
    }

    /// `gen_ai.operation.name`, also the first word of the entry span's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::TextCompletion => "text_completion",
            Self::Embeddings => "embeddings",
            Self::Rerank => "rerank",
        }
    }

    /// `gen_ai.span.kind`.
    pub fn span_kind(&self) -> &'static str {
        match self {
            Self::Chat | Self::TextCompletion => "LLM",
            Self::Embeddings => "EMBEDDING",
            Self::Rerank => "RERANKER",
        }
    }
}

/// Token usage as the API reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub total: Option<u64>,
}

/// What is read of one chunk of a streamed response. Typed and borrowed: a stream's chunks
/// (one per token) are most of the JSON the agent parses, and building a `Value` of each, every
/// key and string allocated, was most of that cost. The rare parts (usage, errors, tool calls)
/// stay `Value`s.
#[derive(Deserialize)]
struct StreamChunk<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    usage: Option<Value>,
    error: Option<Value>,
    #[serde(borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<ChunkDelta<'a>>,
    /// A text completion's generated text.
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkDelta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    tool_calls: Option<Value>,
}

/// What is read of a request's JSON body. The input (a prompt, messages) is most of the body
/// and is only exported when content is captured: it is kept as the client wrote it, not
/// parsed into a `Value` and written out again for every request. Scalars stay `Value`s, so
/// that one of an unexpected type leaves that attribute absent, not the body unread.
#[derive(Deserialize)]
struct RequestBody<'a> {
    model: Option<Value>,
    user: Option<Value>,
    n: Option<Value>,
    temperature: Option<Value>,
    top_p: Option<Value>,
    top_k: Option<Value>,
    max_completion_tokens: Option<Value>,
    max_tokens: Option<Value>,
    stream: Option<Value>,
    tools: Option<Value>,
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    query: Option<&'a RawValue>,
    #[serde(borrow)]
    documents: Option<&'a RawValue>,
}

/// A JSON object's text with each key once, its last value kept (None: no JSON object).
fn last_of_each_key(body: &[u8]) -> Option<String> {
    match serde_json::from_slice::<Value>(body).ok()? {
        object @ Value::Object(_) => Some(object.to_string()),
        _ => None,
    }
}

/// A request's input as the client wrote it (JSON text): `messages`, `prompt`, `input` or
/// `query`, and a rerank's `documents`.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestInput {
    pub value: String,
    pub documents: Option<String>,
}

impl RequestInput {
    /// `gen_ai.input.messages`: the input as compact JSON (with the documents, a rerank's
    /// `{"documents": .., "query": ..}`).
    pub fn messages(&self) -> Option<String> {
        let value: Value = serde_json::from_str(&self.value).ok()?;
        let documents = self.documents.as_deref().map(serde_json::from_str::<Value>);
        Some(match documents {
            Some(docs) => serde_json::json!({"query": value, "documents": docs.ok()?}).to_string(),
            None => value.to_string(),
        })
    }
}

/// One API call, as seen on the wire.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiCall {
    pub operation: Option<Operation>,
    pub model: Option<String>,
    pub n: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub max_tokens: Option<u64>,
    pub stream: bool,
    pub user: Option<String>,
    /// The request's input (`messages`, `prompt`, `input`, `query`+`documents`).
    pub input: Option<RequestInput>,
    /// The W3C `traceparent` header.
    pub traceparent: Option<String>,
    /// HTTP status (None: no response seen, e.g. the client went away).
    pub status: Option<u16>,
    pub response_id: Option<String>,
    pub response_model: Option<String>,
    pub finish_reasons: Vec<String>,
    pub usage: Usage,
    /// Generated text per choice, as JSON text (`[{"role":..,"content":..}]`).
    pub output_messages: Option<String>,
    /// `error.message` of an error response.
    pub error: Option<String>,
    /// Times (CLOCK_MONOTONIC ns) of the SSE events that carried generated content.
    pub content_event_ns: Vec<u64>,
    /// The request declared tools (a non-empty `tools`).
    pub has_tools: bool,
    /// Tool calls in the response, by (choice index, call index): streamed ones put together
    /// from their deltas.
    pub tool_calls: BTreeMap<(u64, u64), ToolCall>,
}

/// One tool call of a response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as the model wrote them (JSON text, concatenated from the stream).
    pub arguments: String,
}

impl ToolCall {
    /// Add what one (delta or whole) `tool_calls` entry says.
    fn extend(&mut self, call: &Value) {
        let function = call.get("function");
        let text = |key: &str| function.and_then(|f| f.get(key)).and_then(Value::as_str);
        if let Some(name) = text("name") {
            self.name.push_str(name);
        }
        if let Some(arguments) = text("arguments") {
            self.arguments.push_str(arguments);
        }
    }
}

impl ApiCall {
    /// The call made in an exchange, or None when the path is not an API operation.
    pub fn from_exchange(exchange: &HttpExchange) -> Option<Self> {
        let request = exchange.request.as_ref()?;
        let operation = Operation::from_path(&request.path)?;
        let mut call = ApiCall {
            operation: Some(operation),
            traceparent: request
                .header("traceparent")
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(|v| v.trim().to_owned()),
            ..ApiCall::default()
        };
        match serde_json::from_slice::<RequestBody>(&request.body) {
            Ok(body) => call.read_request(body),
            // A key given twice is refused by a typed read, where Python's json (the
            // engine's) keeps the last: read it as the engine did.
            Err(_) => {
                if let Some(text) = last_of_each_key(&request.body)
                    && let Ok(body) = serde_json::from_str::<RequestBody>(&text)
                {
                    call.read_request(body);
                }
            }
        }
        if let Some(response) = &exchange.response {
            call.status = Some(response.status);
            if response.is_event_stream() {
                let mut texts = BTreeMap::new();
                let mut text_elided = false;
                for event in &response.sse_events {
                    if let Some(content) = event.elided {
                        // The kernel elides writes of generated text only (ebpf/src/sse.rs):
                        // when it came and whether it said anything are known, not what.
                        text_elided = true;
                        if content > 0 {
                            call.content_event_ns.push(event.ts_ns);
                        }
                        continue;
                    }
                    if let Ok(chunk) = serde_json::from_str::<StreamChunk>(&event.data)
                        && call.read_chunk(chunk, &mut texts)
                    {
                        call.content_event_ns.push(event.ts_ns);
                    }
                }
                if !texts.is_empty() && !text_elided {
                    let outputs = texts
                        .into_values()
                        .map(|text| serde_json::json!({"role": "assistant", "content": text}))
                        .collect();
                    call.output_messages = Some(Value::Array(outputs).to_string());
                }
            } else if let Ok(body) = serde_json::from_slice::<Value>(&response.body) {
                call.read_response(&body);
            }
        }
        Some(call)
    }

    fn read_request(&mut self, body: RequestBody) {
        let text = |v: Option<Value>| match v {
            Some(Value::String(text)) => Some(text),
            _ => None,
        };
        self.model = text(body.model);
        self.user = text(body.user);
        self.n = body.n.as_ref().and_then(Value::as_u64);
        self.temperature = body.temperature.as_ref().and_then(Value::as_f64);
        self.top_p = body.top_p.as_ref().and_then(Value::as_f64);
        self.top_k = body.top_k.as_ref().and_then(Value::as_i64);
        self.max_tokens = body
            .max_completion_tokens
            .or(body.max_tokens)
            .as_ref()
            .and_then(Value::as_u64);
        self.stream = body
            .stream
            .as_ref()
            .and_then(Value::as_bool)
            .unwrap_or(false);
        self.has_tools = body
            .tools
            .as_ref()
            .and_then(Value::as_array)
            .is_some_and(|tools| !tools.is_empty());
        self.input = [body.messages, body.prompt, body.input, body.query]
            .into_iter()
            .flatten()
            .next()
            .map(|value| RequestInput {
                value: value.get().to_owned(),
                documents: body.documents.map(|docs| docs.get().to_owned()),
            });
    }

    fn read_usage(&mut self, usage: &Value) {
        let get = |key: &str| usage.get(key).and_then(Value::as_u64);
        self.usage = Usage {
            input: get("prompt_tokens"),
            output: get("completion_tokens"),
            total: get("total_tokens"),
        };
    }

    fn read_response(&mut self, body: &Value) {
        let str_of = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_owned);
        self.response_id = str_of("id");
        self.response_model = str_of("model");
        if let Some(usage) = body.get("usage") {
            self.read_usage(usage);
        }
        if let Some(error) = body.get("error") {
            self.error = error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| Some(error.to_string()));
        }
        let Some(choices) = body.get("choices").and_then(Value::as_array) else {
            return;
        };
        let mut outputs = Vec::new();
        for (position, choice) in choices.iter().enumerate() {
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reasons.push(reason.to_owned());
            }
            let index = choice
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64);
            let calls = choice.get("message").and_then(|m| m.get("tool_calls"));
            self.read_tool_calls(index, calls);
            if let Some(message) = choice.get("message") {
                outputs.push(message.clone());
            } else if let Some(text) = choice.get("text") {
                outputs.push(serde_json::json!({"role": "assistant", "content": text}));
            }
        }
        self.output_messages = Some(Value::Array(outputs).to_string());
    }

    /// One SSE chunk; true when it carried generated content, which is appended to `texts`
    /// (per choice index).
    fn read_chunk(&mut self, chunk: StreamChunk, texts: &mut BTreeMap<u64, String>) -> bool {
        if self.response_id.is_none() {
            self.response_id = chunk.id.map(Cow::into_owned);
            self.response_model = chunk.model.map(Cow::into_owned);
        }
        if let Some(usage) = &chunk.usage {
            self.read_usage(usage);
        }
        if let Some(error) = &chunk.error {
            self.error = error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        let mut content = false;
        for choice in chunk.choices.into_iter().flatten() {
            if let Some(reason) = choice.finish_reason {
                self.finish_reasons.push(reason.into_owned());
            }
            let index = choice.index.unwrap_or(0);
            let (delta_text, calls) = match choice.delta {
                Some(delta) => (delta.content, delta.tool_calls),
                None => (None, None),
            };
            self.read_tool_calls(index, calls.as_ref());
            if let Some(text) = delta_text.or(choice.text).filter(|t| !t.is_empty()) {
                content = true;
                texts.entry(index).or_default().push_str(&text);
            }
        }
        content
    }

    /// A choice's `tool_calls` (whole, or a stream's deltas: each names its call by `index`).
    fn read_tool_calls(&mut self, choice: u64, calls: Option<&Value>) {
        for (position, call) in calls
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64);
            self.tool_calls
                .entry((choice, index))
                .or_default()
                .extend(call);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{
        http::{HttpRequest, HttpResponse},
        sse::SseEvent,
    };

    fn exchange(path: &str, body: &str, status: u16, response: &str) -> HttpExchange {
        HttpExchange {
            request: Some(HttpRequest {
                method: "POST".into(),
                path: path.into(),
                version: 1,
                headers: vec![("traceparent".into(), b"00-aa-bb-01".to_vec())],
                body: body.as_bytes().to_vec(),
                first_ns: 1,
                last_ns: 2,
                body_truncated: false,
            }),
            response: Some(HttpResponse {
                status,
                reason: "OK".into(),
                version: 1,
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: response.as_bytes().to_vec(),
                first_ns: 3,
                last_ns: 4,
                sse_events: vec![],
                body_truncated: false,
                sse_truncated: false,
                body_elided: 0,
            }),
            complete: true,
        }
    }

    #[test]
    fn chat_completion() {
        let e = exchange(
            "/v1/chat/completions",
            r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}],"n":2,
                "temperature":0.5,"max_completion_tokens":7,"user":"u1"}"#,
            200,
            r#"{"id":"chatcmpl-1","model":"tiny","choices":[
                {"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"},
                {"index":1,"message":{"role":"assistant","content":"b"},"finish_reason":"stop"}],
                "usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}"#,
        );
        let call = ApiCall::from_exchange(&e).unwrap();
        assert_eq!(call.operation, Some(Operation::Chat));
        assert_eq!(call.model.as_deref(), Some("tiny"));
        assert_eq!(
            (call.n, call.temperature, call.top_p),
            (Some(2), Some(0.5), None)
        );
        assert_eq!(call.max_tokens, Some(7));
        assert_eq!(call.user.as_deref(), Some("u1"));
        assert_eq!(call.traceparent.as_deref(), Some("00-aa-bb-01"));
        assert_eq!(call.response_id.as_deref(), Some("chatcmpl-1"));
        assert_eq!(call.finish_reasons, ["length", "stop"]);
        assert_eq!(
            call.usage,
            Usage {
                input: Some(5),
                output: Some(9),
                total: Some(14)
            }
        );
        assert_eq!(
            call.output_messages.as_deref(),
            Some(r#"[{"content":"a","role":"assistant"},{"content":"b","role":"assistant"}]"#)
        );
        assert_eq!(
            call.input.and_then(|input| input.messages()).as_deref(),
            Some(r#"[{"content":"hi","role":"user"}]"#)
        );
    }

    #[test]
    fn elided_events_are_content_at_their_time_and_leave_the_text_unknown() {
        let mut e = exchange(
            "/v1/chat/completions",
            r#"{"model":"tiny","messages":[],"stream":true}"#,
            200,
            "",
        );
        let resp = e.response.as_mut().unwrap();
        resp.headers = vec![("content-type".into(), b"text/event-stream".to_vec())];
        let event = |ts_ns, data: &str, elided: Option<u32>| SseEvent {
            ts_ns,
            event: None,
            data: data.into(),
            id: None,
            elided,
        };
        resp.sse_events = vec![
            event(
                10,
                r#"{"id":"c","model":"tiny","choices":[{"index":0,"delta":{"content":"a"}}]}"#,
                None,
            ),
            event(11, "", Some(3)),
            event(12, "", Some(0)),
            event(13, "", Some(5)),
            event(
                14,
                r#"{"id":"c","choices":[{"index":0,"delta":{"content":"z"},"finish_reason":"stop"}]}"#,
                None,
            ),
            event(15, "[DONE]", None),
        ];
        let call = ApiCall::from_exchange(&e).unwrap();
        // The elided event without text is not content.
        assert_eq!(call.content_event_ns, [10, 11, 13, 14]);
        assert_eq!(call.finish_reasons, ["stop"]);
        assert_eq!(call.response_id.as_deref(), Some("c"));
        assert_eq!(call.output_messages, None);
    }

    #[test]
    fn streamed_completion_with_usage() {
        let mut e = exchange(
            "/v1/completions",
            r#"{"model":"tiny","prompt":"x","stream":true,"stream_options":{"include_usage":true}}"#,
            200,
            "",
        );
        let resp = e.response.as_mut().unwrap();
        resp.headers = vec![("content-type".into(), b"text/event-stream".to_vec())];
        let chunks = [
            r#"{"id":"cmpl-9","model":"tiny","usage":null,"choices":[{"index":0,"text":"h\u0065","logprobs":{"tokens":["he"]},"finish_reason":null}]}"#,
            r#"{"id":"cmpl-9","model":"tiny","choices":[{"index":0,"text":"llo","finish_reason":"length"}]}"#,
            r#"{"id":"cmpl-9","model":"tiny","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
            r#"{"error":{"message":"boom","code":500}}"#,
            "[DONE]",
        ];
        resp.sse_events = chunks
            .iter()
            .enumerate()
            .map(|(i, data)| SseEvent {
                ts_ns: 10 + i as u64,
                event: None,
                data: (*data).into(),
                id: None,
                elided: None,
            })
            .collect();
        let call = ApiCall::from_exchange(&e).unwrap();
        assert!(call.stream);
        assert_eq!(call.response_id.as_deref(), Some("cmpl-9"));
        assert_eq!(call.finish_reasons, ["length"]);
        assert_eq!(call.usage.output, Some(2));
        assert_eq!(call.content_event_ns, [10, 11]);
        assert_eq!(
            call.output_messages.as_deref(),
            Some(r#"[{"content":"hello","role":"assistant"}]"#)
        );
        assert_eq!(call.error.as_deref(), Some("boom"));
    }

    #[test]
    fn tool_calls_whole_and_streamed() {
        let body =
            r#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}"#;
        let e = exchange(
            "/v1/chat/completions",
            body,
            200,
            r#"{"id":"c","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",
                "tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
                              {"id":"t2","type":"function","function":{"name":"now","arguments":"{}"}}]}}]}"#,
        );
        let call = ApiCall::from_exchange(&e).unwrap();
        assert!(call.has_tools);
        let named: Vec<(u64, u64, &str, &str)> = call
            .tool_calls
            .iter()
            .map(|((i, j), t)| (*i, *j, t.name.as_str(), t.arguments.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                (0, 0, "get_weather", r#"{"city":"Paris"}"#),
                (0, 1, "now", "{}")
            ]
        );

        let mut e = exchange(
            "/v1/chat/completions",
            r#"{"stream":true,"messages":[]}"#,
            200,
            "",
        );
        let resp = e.response.as_mut().unwrap();
        resp.headers = vec![("content-type".into(), b"text/event-stream".to_vec())];
        let chunks = [
            r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        ];
        resp.sse_events = chunks
            .iter()
            .map(|data| SseEvent {
                ts_ns: 1,
                event: None,
                data: (*data).into(),
                id: None,
                elided: None,
            })
            .collect();
        let call = ApiCall::from_exchange(&e).unwrap();
        assert!(!call.has_tools);
        assert_eq!(
            call.tool_calls.get(&(0, 0)),
            Some(&ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            })
        );
        assert_eq!(call.tool_calls.len(), 1);
        assert!(call.content_event_ns.is_empty());
    }

    #[test]
    fn a_requests_input_is_exported_compact_and_odd_fields_are_left_out() {
        let e = exchange(
            "/v1/rerank",
            r#"{"model": 7, "temperature": "hot", "top_k": 5, "query": "q ?",
                "documents": [ "a",  "b" ], "prompt": null}"#,
            200,
            "{}",
        );
        let call = ApiCall::from_exchange(&e).unwrap();
        assert_eq!(call.model, None, "a model that is no string is absent");
        assert_eq!(call.temperature, None);
        assert_eq!(call.top_k, Some(5), "the other fields are read");
        let input = call.input.expect("the query");
        assert_eq!(input.value, r#""q ?""#, "kept as written");
        assert_eq!(
            input.messages().as_deref(),
            Some(r#"{"documents":["a","b"],"query":"q ?"}"#)
        );
        let e = exchange(
            "/v1/completions",
            r#"{"prompt": [1, 2], "input": "x"}"#,
            200,
            "{}",
        );
        let input = ApiCall::from_exchange(&e).unwrap().input.unwrap();
        assert_eq!(
            input.messages().as_deref(),
            Some("[1,2]"),
            "the first key of the list"
        );
        let e = exchange("/v1/completions", r#"["not", "an", "object"]"#, 200, "{}");
        assert_eq!(ApiCall::from_exchange(&e).unwrap().input, None);
        // A key given twice: the last one counts, as in the engine's Python.
        let e = exchange(
            "/v1/completions",
            r#"{"model": "a", "prompt": "x", "model": "b", "max_tokens": 3}"#,
            200,
            "{}",
        );
        let call = ApiCall::from_exchange(&e).unwrap();
        assert_eq!(call.model.as_deref(), Some("b"));
        assert_eq!(call.max_tokens, Some(3));
        assert_eq!(call.input.unwrap().value, r#""x""#);
    }

    #[test]
    fn error_response_and_unknown_paths() {
        let e = exchange(
            "/v1/completions",
            "{not json",
            400,
            r#"{"error":{"message":"bad request","type":"BadRequestError","code":400}}"#,
        );
        let call = ApiCall::from_exchange(&e).unwrap();
        assert_eq!(call.status, Some(400));
        assert_eq!(call.error.as_deref(), Some("bad request"));
        assert_eq!(call.model, None);
        assert!(ApiCall::from_exchange(&exchange("/health", "", 200, "")).is_none());
        assert_eq!(
            Operation::from_path("/v1/score?x=1"),
            Some(Operation::Rerank)
        );
    }
}
