//! vLLM V1 messages between the API server and EngineCore: msgpack, as encoded by msgspec.
//!
//! Input (frontend -> engine) is `[type byte, msgpack(EngineCoreRequest | payload), *aux]`;
//! output (engine -> frontend) is `[msgpack(EngineCoreOutputs), *aux]`, one per engine step.
//! `EngineCoreRequest`, `EngineCoreOutput(s)` are msgspec structs with `array_like=True,
//! omit_defaults=True`: positional arrays whose trailing fields are left out when they hold
//! their default. Field positions move between vLLM releases, so they come from a [`Schema`]
//! table per version range; the dataclasses (SchedulerStats, PrefixCacheStats, PrefillStats)
//! and plain structs (EngineCoreEvent, SamplingParams) are maps keyed by field name.
//!
//! Every field that the tables place is checked for its type: a message that does not fit the
//! expected table is tried against the others (see [`VllmDecoder`]), so a wrong version guess is
//! noticed and counted instead of producing wrong numbers.
use rmpv::Value;

/// Deepest nesting accepted (vLLM's messages are at most ~6 levels deep).
const MAX_DEPTH: usize = 64;

/// msgspec extension code for an inline raw buffer (vllm/v1/serial_utils.py CUSTOM_TYPE_RAW_VIEW).
const EXT_RAW_VIEW: i8 = 3;

/// Field positions of the array-like structs in one range of vLLM versions.
#[derive(Debug, PartialEq)]
pub struct Schema {
    /// The versions it describes, for messages.
    pub name: &'static str,
    /// Versions `[first, end)` as (major, minor) that use this layout.
    first: (u32, u32),
    end: (u32, u32),
    request: RequestLayout,
    output: OutputLayout,
}

#[derive(Debug, PartialEq)]
struct RequestLayout {
    request_id: usize,
    prompt_token_ids: usize,
    sampling_params: usize,
    arrival_time: usize,
    data_parallel_rank: usize,
    trace_headers: usize,
    external_req_id: Option<usize>,
}

#[derive(Debug, PartialEq)]
struct OutputLayout {
    request_id: usize,
    new_token_ids: usize,
    new_logprobs: usize,
    finish_reason: usize,
    stop_reason: usize,
    events: usize,
    kv_transfer_params: usize,
    /// 0.11: an int; later replaced by `prefill_stats`.
    num_cached_tokens: Option<usize>,
    prefill_stats: Option<usize>,
}

/// vLLM 0.11.x (vllm/v1/engine/__init__.py of the 0.11.0 wheel): `eos_token_id` at 5, no
/// `external_req_id`; outputs carry `num_cached_tokens` at 10.
static V0_11: Schema = Schema {
    name: "vLLM 0.11-0.13",
    first: (0, 11),
    end: (0, 14),
    request: RequestLayout {
        request_id: 0,
        prompt_token_ids: 1,
        sampling_params: 3,
        arrival_time: 6,
        data_parallel_rank: 9,
        trace_headers: 14,
        external_req_id: None,
    },
    output: OutputLayout {
        request_id: 0,
        new_token_ids: 1,
        new_logprobs: 2,
        finish_reason: 5,
        stop_reason: 6,
        events: 7,
        kv_transfer_params: 8,
        num_cached_tokens: Some(10),
        prefill_stats: None,
    },
};

/// vLLM 0.14 to 0.33 (checked against the installed 0.32.0 source and real captures):
/// `eos_token_id` gone, `external_req_id` at 16; outputs carry `prefill_stats` at 11.
static V0_14: Schema = Schema {
    name: "vLLM 0.14-0.33",
    first: (0, 14),
    end: (0, 34),
    request: RequestLayout {
        request_id: 0,
        prompt_token_ids: 1,
        sampling_params: 3,
        arrival_time: 5,
        data_parallel_rank: 8,
        trace_headers: 14,
        external_req_id: Some(16),
    },
    output: OutputLayout {
        request_id: 0,
        new_token_ids: 1,
        new_logprobs: 2,
        finish_reason: 5,
        stop_reason: 6,
        events: 7,
        kv_transfer_params: 8,
        num_cached_tokens: None,
        prefill_stats: Some(11),
    },
};

/// All tables, oldest first.
pub static SCHEMAS: [&Schema; 2] = [&V0_11, &V0_14];

/// The table for an installed version such as "0.32.0+cpu", and whether the version is one the
/// table was written for (false: the closest table, to be announced with a warning).
pub fn schema_for_version(version: &str) -> (&'static Schema, bool) {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(u32::MAX));
    let key = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    for schema in SCHEMAS {
        if key >= schema.first && key < schema.end {
            return (schema, true);
        }
    }
    let newest = SCHEMAS[SCHEMAS.len() - 1];
    if key >= newest.end {
        (newest, false)
    } else {
        (SCHEMAS[0], false)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VllmError {
    #[error("not msgpack: {0}")]
    Msgpack(String),
    #[error("unexpected layout: {0}")]
    Layout(&'static str),
}

/// Request type byte, the first frame of every frontend -> engine message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestType {
    Add,
    Abort,
    StartDpWave,
    Utility,
    ExecutorFailed,
    Wakeup,
}

impl RequestType {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0x00 => Self::Add,
            0x01 => Self::Abort,
            0x02 => Self::StartDpWave,
            0x03 => Self::Utility,
            0x04 => Self::ExecutorFailed,
            0x05 => Self::Wakeup,
            _ => return None,
        })
    }
}

/// A frontend -> engine message.
#[derive(Clone, Debug, PartialEq)]
pub enum InputMessage {
    Add(Box<EngineRequest>),
    Abort(Vec<String>),
    /// Control messages that carry nothing about requests.
    Control(RequestType),
}

/// The parts of `SamplingParams` that the spans report. Fields left out on the wire hold the
/// class default (msgspec `omit_defaults`), which is filled in here: it is the value vLLM used.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub n: u64,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
    pub max_tokens: Option<u64>,
    /// Top logprobs requested per token (None: not requested).
    pub logprobs: Option<u64>,
}

impl Default for Sampling {
    /// vllm/sampling_params.py defaults (unchanged from 0.8 to 0.33).
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: Some(16),
            logprobs: None,
        }
    }
}

/// Prefill/decode disaggregation role of a request, from its `kv_transfer_params`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdRole {
    /// Prefill node: `do_remote_decode`.
    Producer,
    /// Decode node: `do_remote_prefill`.
    Consumer,
    None,
}

impl PdRole {
    pub fn as_str(&self) -> &'static str {
        match self {
            PdRole::Producer => "producer",
            PdRole::Consumer => "consumer",
            PdRole::None => "none",
        }
    }
}

/// An `EngineCoreRequest` (ADD).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    pub request_id: String,
    /// The id the API layer knows (0.14+); None before.
    pub external_req_id: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub sampling: Option<Sampling>,
    /// Wall clock (`time.time()`) when the frontend received it, seconds.
    pub arrival_time: f64,
    pub data_parallel_rank: Option<i64>,
    /// W3C trace context the frontend forwarded (`traceparent`, `tracestate`).
    pub trace_headers: Vec<(String, String)>,
    pub pd_role: PdRole,
}

/// Why a request finished (vllm FinishReason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    Error,
    Repetition,
    Unknown(u64),
}

impl FinishReason {
    fn from_code(code: u64) -> Self {
        match code {
            0 => Self::Stop,
            1 => Self::Length,
            2 => Self::Abort,
            3 => Self::Error,
            4 => Self::Repetition,
            other => Self::Unknown(other),
        }
    }

    /// vLLM's string (FINISH_REASON_STRINGS), also its metrics' `finished_reason` label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
            Self::Repetition => "repetition",
            Self::Unknown(_) => "unknown",
        }
    }
}

/// Request-level engine events (EngineCoreEventType).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Queued,
    Scheduled,
    Preempted,
    Unknown(u64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineEvent {
    pub kind: EventKind,
    /// CLOCK_MONOTONIC seconds in the engine process.
    pub timestamp: f64,
}

/// Token counts of a request's prefill (`prefill_stats`, 0.14+; `num_cached_tokens` before).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrefillTokens {
    pub prompt: Option<u64>,
    /// Served without compute: local prefix cache + remote KV transfer.
    pub cached: u64,
    pub external_cached: Option<u64>,
}

/// One request's part of an engine step.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOutput {
    pub request_id: String,
    pub new_token_ids: Vec<u64>,
    /// The sampled tokens' logprobs, when the request asked for logprobs.
    pub logprobs: Option<Vec<f32>>,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<String>,
    pub events: Vec<EngineEvent>,
    pub prefill: Option<PrefillTokens>,
    /// The connector returned `kv_transfer_params` (a PD transfer took part).
    pub has_kv_transfer_params: bool,
}

/// Prefix cache counters of one step (deltas).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrefixCacheStats {
    pub reset: bool,
    pub requests: u64,
    pub queries: u64,
    pub hits: u64,
}

/// Scheduler state after a step (SchedulerStats).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    pub num_running_reqs: u64,
    pub num_waiting_reqs: u64,
    /// KV cache usage in [0, 1] (`gpu_cache_usage` before 0.11).
    pub kv_cache_usage: f64,
    pub prefix_cache: Option<PrefixCacheStats>,
    pub step_counter: Option<u64>,
}

/// One `EngineCoreOutputs`: everything one engine step returned to the frontend.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOutputs {
    pub engine_index: u64,
    pub outputs: Vec<RequestOutput>,
    pub scheduler_stats: Option<SchedulerStats>,
    /// CLOCK_MONOTONIC seconds in the engine when the step's outputs were made.
    pub timestamp: f64,
    /// A reply to a utility call, not a step.
    pub is_utility: bool,
    pub finished_requests: Vec<String>,
}

/// Decodes with the table of the engine's version, and notices when messages fit another.
#[derive(Debug)]
pub struct VllmDecoder {
    schema: &'static Schema,
    /// Messages that fitted another table than the version's (the decoder switched to it).
    pub layout_switches: u64,
}

impl VllmDecoder {
    pub fn new(schema: &'static Schema) -> Self {
        Self {
            schema,
            layout_switches: 0,
        }
    }

    pub fn schema(&self) -> &'static Schema {
        self.schema
    }

    /// A frontend -> engine message (`frames[0]` is the request type byte), or None when the
    /// frames are not one.
    pub fn input(&mut self, frames: &[Vec<u8>]) -> Option<Result<InputMessage, VllmError>> {
        let [kind] = frames.first()?.as_slice() else {
            return None;
        };
        let kind = RequestType::from_byte(*kind)?;
        let body = frames.get(1)?;
        Some(match kind {
            RequestType::Add => self.with_layout(body, |schema, v| {
                add(&schema.request, v).map(|r| InputMessage::Add(Box::new(r)))
            }),
            RequestType::Abort => parse(body).and_then(|v| {
                let ids = v
                    .as_array()
                    .ok_or(VllmError::Layout("ABORT is not a list"))?;
                ids.iter()
                    .map(|id| string(id).ok_or(VllmError::Layout("ABORT id is not a string")))
                    .collect::<Result<_, _>>()
                    .map(InputMessage::Abort)
            }),
            other => Ok(InputMessage::Control(other)),
        })
    }

    /// An engine -> frontend message, or None when `frames[0]` does not start like one
    /// (an array whose first two fields are an int and a list).
    pub fn outputs(&mut self, frames: &[Vec<u8>]) -> Option<Result<EngineOutputs, VllmError>> {
        let first = frames.first()?;
        if !matches!(first.first(), Some(0x91..=0x9f | 0xdc)) {
            return None;
        }
        let aux = &frames[1..];
        Some(self.with_layout(first, |schema, v| outputs(&schema.output, v, aux)))
    }

    /// Decode `bytes` with the current table, else with the first other table that fits (and
    /// keep using that one).
    fn with_layout<T>(
        &mut self,
        bytes: &[u8],
        decode: impl Fn(&'static Schema, &Value) -> Result<T, VllmError>,
    ) -> Result<T, VllmError> {
        let value = parse(bytes)?;
        let first_error = match decode(self.schema, &value) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        for schema in SCHEMAS.iter().filter(|s| **s != self.schema) {
            if let Ok(v) = decode(schema, &value) {
                tracing::warn!(
                    "vLLM messages fit the {} layout, not {}: using it from now on",
                    schema.name,
                    self.schema.name
                );
                self.schema = schema;
                self.layout_switches += 1;
                return Ok(v);
            }
        }
        Err(first_error)
    }
}

fn parse(bytes: &[u8]) -> Result<Value, VllmError> {
    let mut rest = bytes;
    let value = rmpv::decode::read_value_with_max_depth(&mut rest, MAX_DEPTH)
        .map_err(|e| VllmError::Msgpack(e.to_string()))?;
    if !rest.is_empty() {
        return Err(VllmError::Msgpack(format!(
            "{} bytes after the value",
            rest.len()
        )));
    }
    Ok(value)
}

/// Positional field `i`, None when left out (trailing default) or nil.
fn field(fields: &[Value], i: usize) -> Option<&Value> {
    fields.get(i).filter(|v| !v.is_nil())
}

fn string(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

fn float(v: &Value) -> Option<f64> {
    match v {
        Value::F64(f) => Some(*f),
        Value::F32(f) => Some(f64::from(*f)),
        _ => None,
    }
}

/// Typed positional field: absent/nil is `Ok(None)`, a value of another type is a layout error.
fn typed<'a, T>(
    fields: &'a [Value],
    i: usize,
    convert: impl Fn(&'a Value) -> Option<T>,
    what: &'static str,
) -> Result<Option<T>, VllmError> {
    match field(fields, i) {
        None => Ok(None),
        Some(v) => convert(v).map(Some).ok_or(VllmError::Layout(what)),
    }
}

/// Map entry by string key.
fn entry<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .filter(|v| !v.is_nil())
}

fn add(layout: &RequestLayout, value: &Value) -> Result<EngineRequest, VllmError> {
    let f = value
        .as_array()
        .ok_or(VllmError::Layout("EngineCoreRequest is not an array"))?;
    let request_id = typed(f, layout.request_id, string, "request_id is not a string")?
        .ok_or(VllmError::Layout("no request_id"))?;
    let arrival_time = typed(f, layout.arrival_time, float, "arrival_time is not a float")?
        .ok_or(VllmError::Layout("no arrival_time"))?;
    let prompt_tokens = typed(
        f,
        layout.prompt_token_ids,
        |v| v.as_array().map(|a| a.len() as u64),
        "prompt_token_ids is not a list",
    )?;
    let sampling_map = typed(
        f,
        layout.sampling_params,
        Value::as_map,
        "sampling_params is not a map",
    )?;
    let external_req_id = match layout.external_req_id {
        Some(i) => typed(f, i, string, "external_req_id is not a string")?,
        None => None,
    };
    let trace_headers = typed(
        f,
        layout.trace_headers,
        Value::as_map,
        "trace_headers is not a map",
    )?
    .map(|m| {
        m.iter()
            .filter_map(|(k, v)| Some((string(k)?, string(v)?)))
            .collect()
    })
    .unwrap_or_default();
    Ok(EngineRequest {
        request_id,
        external_req_id,
        prompt_tokens,
        sampling: sampling_map.map(|m| sampling(m)),
        arrival_time,
        data_parallel_rank: typed(
            f,
            layout.data_parallel_rank,
            Value::as_i64,
            "data_parallel_rank is not an int",
        )?,
        trace_headers,
        pd_role: sampling_map.map(|m| pd_role(m)).unwrap_or(PdRole::None),
    })
}

fn sampling(map: &[(Value, Value)]) -> Sampling {
    let d = Sampling::default();
    let get = |key| entry(map, key);
    Sampling {
        n: get("n").and_then(Value::as_u64).unwrap_or(d.n),
        temperature: get("temperature").and_then(float).unwrap_or(d.temperature),
        top_p: get("top_p").and_then(float).unwrap_or(d.top_p),
        top_k: get("top_k").and_then(Value::as_i64).unwrap_or(d.top_k),
        // Left out means the default (16); an explicit nil means no limit.
        max_tokens: match map.iter().find(|(k, _)| k.as_str() == Some("max_tokens")) {
            None => d.max_tokens,
            Some((_, v)) => v.as_u64(),
        },
        logprobs: get("logprobs").and_then(Value::as_u64),
    }
}

/// `sampling_params.extra_args.kv_transfer_params`: `do_remote_decode` marks the prefill side
/// (producer), `do_remote_prefill` the decode side (consumer).
fn pd_role(sampling: &[(Value, Value)]) -> PdRole {
    let params = entry(sampling, "extra_args")
        .and_then(Value::as_map)
        .and_then(|m| entry(m, "kv_transfer_params"))
        .and_then(Value::as_map);
    let flag = |key| {
        params
            .and_then(|p| entry(p, key))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    if flag("do_remote_decode") {
        PdRole::Producer
    } else if flag("do_remote_prefill") {
        PdRole::Consumer
    } else {
        PdRole::None
    }
}

fn outputs(
    layout: &OutputLayout,
    value: &Value,
    aux: &[Vec<u8>],
) -> Result<EngineOutputs, VllmError> {
    let f = value
        .as_array()
        .ok_or(VllmError::Layout("EngineCoreOutputs is not an array"))?;
    let engine_index = typed(f, 0, Value::as_u64, "engine_index is not an int")?.unwrap_or(0);
    let outputs = typed(f, 1, Value::as_array, "outputs is not a list")?
        .map(|list| {
            list.iter()
                .map(|o| output(layout, o, aux))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    let scheduler_stats =
        typed(f, 2, Value::as_map, "scheduler_stats is not a map")?.map(|m| scheduler_stats(m));
    let timestamp = typed(f, 3, float, "timestamp is not a float")?.unwrap_or(0.0);
    let is_utility = field(f, 4).is_some();
    let finished_requests = typed(f, 5, Value::as_array, "finished_requests is not a list")?
        .map(|ids| ids.iter().filter_map(string).collect())
        .unwrap_or_default();
    Ok(EngineOutputs {
        engine_index,
        outputs,
        scheduler_stats,
        timestamp,
        is_utility,
        finished_requests,
    })
}

fn output(
    layout: &OutputLayout,
    value: &Value,
    aux: &[Vec<u8>],
) -> Result<RequestOutput, VllmError> {
    let f = value
        .as_array()
        .ok_or(VllmError::Layout("EngineCoreOutput is not an array"))?;
    let request_id = typed(
        f,
        layout.request_id,
        string,
        "output request_id is not a string",
    )?
    .ok_or(VllmError::Layout("output without request_id"))?;
    let new_token_ids = typed(
        f,
        layout.new_token_ids,
        |v| {
            v.as_array()?
                .iter()
                .map(Value::as_u64)
                .collect::<Option<Vec<_>>>()
        },
        "new_token_ids is not a list of ints",
    )?
    .unwrap_or_default();
    let finish_reason = typed(
        f,
        layout.finish_reason,
        Value::as_u64,
        "finish_reason is not an int",
    )?
    .map(FinishReason::from_code);
    let stop_reason = field(f, layout.stop_reason).map(|v| match v {
        Value::String(s) => s.as_str().unwrap_or_default().to_owned(),
        other => other.to_string(),
    });
    let events = typed(f, layout.events, Value::as_array, "events is not a list")?
        .map(|list| list.iter().map(event).collect::<Result<Vec<_>, _>>())
        .transpose()?
        .unwrap_or_default();
    let has_kv_transfer_params = typed(
        f,
        layout.kv_transfer_params,
        Value::as_map,
        "kv_transfer_params is not a map",
    )?
    .is_some();
    let mut prefill = None;
    if let Some(i) = layout.num_cached_tokens {
        prefill = typed(f, i, Value::as_u64, "num_cached_tokens is not an int")?.map(|cached| {
            PrefillTokens {
                cached,
                ..PrefillTokens::default()
            }
        });
    }
    if let Some(i) = layout.prefill_stats {
        prefill = typed(f, i, Value::as_map, "prefill_stats is not a map")?.map(|m| {
            let get = |key| entry(m, key).and_then(Value::as_u64);
            PrefillTokens {
                prompt: get("num_prompt_tokens"),
                cached: get("num_cached_tokens").unwrap_or(0),
                external_cached: get("num_external_cached_tokens"),
            }
        });
    }
    let logprobs = field(f, layout.new_logprobs).and_then(|v| sampled_logprobs(v, aux));
    Ok(RequestOutput {
        request_id,
        new_token_ids,
        logprobs,
        finish_reason,
        stop_reason,
        events,
        prefill,
        has_kv_transfer_params,
    })
}

/// `EngineCoreEvent`: a map `{type, timestamp}` (or, defensively, a `[type, timestamp]` pair).
fn event(value: &Value) -> Result<EngineEvent, VllmError> {
    let (kind, timestamp) = match value {
        Value::Map(m) => (entry(m, "type"), entry(m, "timestamp")),
        Value::Array(a) => (a.first(), a.get(1)),
        _ => return Err(VllmError::Layout("event is neither a map nor a pair")),
    };
    let kind = kind
        .and_then(Value::as_u64)
        .ok_or(VllmError::Layout("event type is not an int"))?;
    let timestamp = timestamp
        .and_then(float)
        .ok_or(VllmError::Layout("event timestamp is not a float"))?;
    Ok(EngineEvent {
        kind: match kind {
            1 => EventKind::Queued,
            2 => EventKind::Scheduled,
            3 => EventKind::Preempted,
            other => EventKind::Unknown(other),
        },
        timestamp,
    })
}

fn scheduler_stats(map: &[(Value, Value)]) -> SchedulerStats {
    let int = |key| entry(map, key).and_then(Value::as_u64);
    SchedulerStats {
        num_running_reqs: int("num_running_reqs").unwrap_or(0),
        num_waiting_reqs: int("num_waiting_reqs").unwrap_or(0),
        kv_cache_usage: entry(map, "kv_cache_usage")
            .or_else(|| entry(map, "gpu_cache_usage"))
            .and_then(float)
            .unwrap_or(0.0),
        prefix_cache: entry(map, "prefix_cache_stats")
            .and_then(Value::as_map)
            .map(|m| {
                let int = |key| entry(m, key).and_then(Value::as_u64).unwrap_or(0);
                PrefixCacheStats {
                    reset: entry(m, "reset").and_then(Value::as_bool).unwrap_or(false),
                    requests: int("requests"),
                    queries: int("queries"),
                    hits: int("hits"),
                }
            }),
        step_counter: int("step_counter"),
    }
}

/// The sampled tokens' logprobs from a `LogprobsLists` (`[token_ids, logprobs, ranks, cu]`,
/// each an ndarray `(dtype, shape, data)`): column 0 of the `logprobs` matrix.
fn sampled_logprobs(value: &Value, aux: &[Vec<u8>]) -> Option<Vec<f32>> {
    let [dtype, shape, data] = value.as_array()?.get(1)?.as_array()?.as_slice() else {
        return None;
    };
    if dtype.as_str()? != "<f4" {
        return None;
    }
    let shape: Vec<usize> = shape
        .as_array()?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<_>>()?;
    let bytes: &[u8] = match data {
        Value::Ext(EXT_RAW_VIEW, bytes) => bytes,
        index => aux.get(index.as_u64()? as usize)?,
    };
    let (&rows, cols) = shape.split_first()?;
    let cols = cols.iter().product::<usize>().max(1);
    if bytes.len() != rows.checked_mul(cols)?.checked_mul(4)? {
        return None;
    }
    Some(
        bytes
            .chunks_exact(cols * 4)
            .map(|row| f32::from_le_bytes([row[0], row[1], row[2], row[3]]))
            .collect(),
    )
}
