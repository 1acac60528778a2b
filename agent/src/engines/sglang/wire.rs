//! SGLang's messages between the TokenizerManager (main process), the scheduler and the
//! detokenizer (docs/sglang-wire.md): `TokenizedGenerateReqInput`, `AbortReq`,
//! `BatchTokenIDOutput` and `BatchStrOutput`, in either of SGLang's encodings.
//!
//! - Pickle (the default): `msgspec._utils.rebuild(cls, {field: value})`, decoded by our
//!   restricted pickle machine (nothing is imported or called): self-describing, field names
//!   on the wire, so any SGLang version decodes.
//! - msgpack (`SGLANG_USE_PICKLE_IPC=0`): `[class name, field1, field2, ...]` with every field
//!   in declaration order, so the names come from a field table per version ([`FIELDS_0_5`]); a
//!   message whose field count does not fit fails (counted) rather than being misread. Token id
//!   arrays travel as extension 1 (`array.array`), `time_stats` as `["PickleWrapper", pickle]`.
//!
//! A pickle is read in place ([`pickle::parse`]), a msgpack message turned into a field dict
//! ([`PyValue`]), and the typed messages are read from either by name, by the same code
//! ([`PyRead`]).
use std::{cell::RefCell, hash::BuildHasher};

use rmpv::Value;

use crate::decode::{
    msgpack,
    pickle::{self, PickleError, PyValue},
    pickle_head,
    pyread::PyRead,
};

/// Deepest msgpack nesting accepted.
const MAX_DEPTH: usize = 64;
/// msgspec extension code SGLang uses for `array.array` (srt/utils/msgpack_utils.py).
const EXT_ARRAY: i8 = 1;
/// The module of SGLang's IPC classes, in pickles.
const IO_STRUCT_MODULE: &str = "sglang.srt.managers.io_struct";

#[derive(Debug, thiserror::Error)]
pub enum SglangError {
    #[error("pickle: {0}")]
    Pickle(#[from] PickleError),
    #[error("msgpack: {0}")]
    Msgpack(String),
    #[error("{class}: {got} fields, the {table} table has {want}")]
    FieldCount {
        class: String,
        got: usize,
        want: usize,
        table: &'static str,
    },
    #[error("{0}: field {1} missing or of another type")]
    Field(&'static str, &'static str),
}

/// One decoded SGLang message.
#[derive(Clone, Debug, PartialEq)]
pub enum SglangMessage {
    /// `TokenizedGenerateReqInput`: the TokenizerManager hands a request to the scheduler.
    Request(Box<SglangRequest>),
    /// `AbortReq`: main -> scheduler (a client went away), or scheduler -> main (a request
    /// ended outside the output stream, e.g. aborted while queued).
    Abort(SglangAbort),
    /// `BatchTokenIDOutput` (scheduler -> detokenizer) or `BatchStrOutput` (detokenizer ->
    /// main): one entry per request of a scheduler step that had something to send.
    Outputs(SglangOutputs),
    /// Another io_struct class (control requests and their replies), by name.
    Other(String),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SglangSampling {
    pub max_new_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub n: Option<u64>,
    /// The request's own streaming interval (tokens per streamed output), when it set one.
    pub stream_interval: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SglangRequest {
    pub rid: String,
    pub prompt_tokens: Option<u64>,
    /// A hash of the prompt's token ids: tells which requests share one prompt.
    pub prompt_key: Option<u64>,
    pub stream: bool,
    pub sampling: SglangSampling,
    /// PD disaggregation's correlation id.
    pub bootstrap_room: Option<u64>,
    /// `time_stats.trace_ctx` when SGLang's own tracing is on.
    pub trace: Option<TraceContext>,
}

/// What SGLang's tracing puts in a request's `time_stats.trace_ctx`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceContext {
    /// W3C traceparent of SGLang's root (request) span.
    pub traceparent: Option<String>,
    /// Wall clock (ns) when SGLang's request span started.
    pub start_time_ns: Option<u64>,
    /// The `time.time() - time.perf_counter()` (s) main made that wall time with: its
    /// `diff_realtime_monotonic`, sent with the request, calibrated when SGLang last did.
    pub realtime_minus_monotonic_s: Option<f64>,
}

impl TraceContext {
    /// When SGLang's request span started on CLOCK_MONOTONIC (its `perf_counter`): the wall
    /// time less the offset main made it with. None without both.
    pub fn monotonic_start_ns(&self) -> Option<u64> {
        let wall = i128::from(self.start_time_ns?);
        let offset = (self.realtime_minus_monotonic_s? * 1e9).round() as i128;
        u64::try_from(wall - offset).ok()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SglangAbort {
    pub rid: String,
    pub abort_all: bool,
    pub finish: Option<SglangFinish>,
}

/// A request's `finished_reason` dict.
#[derive(Clone, Debug, PartialEq)]
pub struct SglangFinish {
    /// `length`, `stop` or `abort`.
    pub kind: String,
    pub message: Option<String>,
    pub status_code: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputStage {
    /// `BatchTokenIDOutput`, leaving the scheduler.
    TokenIds,
    /// `BatchStrOutput`, reaching the main process.
    Strings,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SglangOutputs {
    pub stage: OutputStage,
    pub items: Vec<RidOutput>,
    /// A scheduler's send: the bytes of its [`LEADING_FIELDS`] (`output_receipts`), where
    /// [`SglangDecoder::output_head`] reads them.
    pub leading: Option<Vec<u8>>,
}

/// The fields an output batch begins with, in `BatchTokenIDOutput` and `BatchStrOutput`
/// alike: the detokenizer passes them on to main as the scheduler sent them.
const LEADING_FIELDS: [&str; 3] = ["rids", "http_worker_ipcs", "finished_reasons"];

/// One request's part of a batch output. Counts are cumulative for the request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RidOutput {
    pub rid: String,
    pub finish: Option<SglangFinish>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub retractions: Option<u64>,
    pub times: Option<SchedulerTimes>,
}

/// `SchedulerReqTimeStats` (sent only with `--enable-metrics`): the scheduler's
/// `time.perf_counter()`, CLOCK_MONOTONIC seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SchedulerTimes {
    pub wait_queue_entry: Option<f64>,
    pub forward_entry: Option<f64>,
    pub prefill_finished: Option<f64>,
    pub queue_duration_s: Option<f64>,
}

/// Field tables of the msgpack encoding for one SGLang version range.
pub struct FieldTable {
    pub name: &'static str,
    classes: &'static [(&'static str, &'static [&'static str])],
    sampling: &'static [&'static str],
}

impl FieldTable {
    fn fields(&self, class: &str) -> Option<&'static [&'static str]> {
        self.classes
            .iter()
            .find(|(name, _)| *name == class)
            .map(|(_, fields)| *fields)
    }
}

/// SGLang 0.5.x (checked against the 0.5.23 wheel and its recordings).
pub static FIELDS_0_5: FieldTable = FieldTable {
    name: "0.5",
    classes: &[
        (
            "TokenizedGenerateReqInput",
            &[
                "rid",
                "http_worker_ipc",
                "input_text",
                "input_ids",
                "input_embeds",
                "mm_inputs",
                "token_type_ids",
                "sampling_params",
                "return_logprob",
                "logprob_start_len",
                "top_logprobs_num",
                "token_ids_logprob",
                "stream",
                "return_sampling_mask",
                "return_flat_raw_top_logprobs",
                "return_hidden_states",
                "return_routed_experts",
                "routed_experts_start_len",
                "return_indexer_topk",
                "session_id",
                "session_params",
                "lora_id",
                "custom_logit_processor",
                "positional_embed_overrides",
                "bootstrap_host",
                "bootstrap_port",
                "bootstrap_room",
                "bootstrap_pair_key",
                "decode_tp_size",
                "routed_dp_rank",
                "disagg_prefill_dp_rank",
                "routing_key",
                "require_reasoning",
                "priority",
                "extra_key",
                "no_logs",
                "return_bytes",
                "return_entropy",
                "need_wait_for_mm_inputs",
                "num_items_assigned",
                "encoder_urls",
                "multi_item_delimiter_indices",
                "token_indices_to_pool",
                "time_stats",
                "cache_salt",
                "kv_hints",
                "pp_prefetch_ticketed",
                "sampling_logprobs_mode",
                "lora_name",
            ],
        ),
        (
            "BatchTokenIDOutput",
            &[
                "rids",
                "http_worker_ipcs",
                "finished_reasons",
                "decoded_texts",
                "decode_ids",
                "read_offsets",
                "output_ids",
                "skip_special_tokens",
                "spaces_between_special_tokens",
                "no_stop_trim",
                "prompt_tokens",
                "reasoning_tokens",
                "completion_tokens",
                "cached_tokens",
                "input_token_logprobs_val",
                "input_token_logprobs_idx",
                "output_token_logprobs_val",
                "output_token_logprobs_idx",
                "input_top_logprobs_val",
                "input_top_logprobs_idx",
                "output_top_logprobs_val",
                "output_top_logprobs_idx",
                "input_token_ids_logprobs_val",
                "input_token_ids_logprobs_idx",
                "output_token_ids_logprobs_val",
                "output_token_ids_logprobs_idx",
                "output_token_entropy_val",
                "output_token_sampling_mask",
                "output_hidden_states",
                "routed_experts",
                "indexer_topk",
                "placeholder_tokens_idx",
                "placeholder_tokens_val",
                "retraction_counts",
                "beam_search_output",
                "weight_versions",
                "token_steps",
                "customized_info",
                "cached_tokens_details",
                "dp_ranks",
                "time_stats",
                "image_tokens",
                "audio_tokens",
                "video_tokens",
                "spec_verify_ct",
                "spec_num_correct_drafts",
                "spec_num_block_accept_tokens",
                "spec_num_cap_tokens",
                "spec_correct_drafts_histogram",
                "spec_cap_lens_histogram",
                "input_top_logprobs_val_flat",
                "input_top_logprobs_idx_flat",
                "input_top_logprobs_flat_null_prefix",
            ],
        ),
        (
            "BatchStrOutput",
            &[
                "rids",
                "http_worker_ipcs",
                "finished_reasons",
                "output_strs",
                "output_ids",
                "prompt_tokens",
                "completion_tokens",
                "reasoning_tokens",
                "cached_tokens",
                "input_token_logprobs_val",
                "input_token_logprobs_idx",
                "output_token_logprobs_val",
                "output_token_logprobs_idx",
                "input_top_logprobs_val",
                "input_top_logprobs_idx",
                "output_top_logprobs_val",
                "output_top_logprobs_idx",
                "input_token_ids_logprobs_val",
                "input_token_ids_logprobs_idx",
                "output_token_ids_logprobs_val",
                "output_token_ids_logprobs_idx",
                "output_token_entropy_val",
                "output_token_sampling_mask",
                "output_hidden_states",
                "routed_experts",
                "indexer_topk",
                "placeholder_tokens_idx",
                "placeholder_tokens_val",
                "retraction_counts",
                "beam_search_output",
                "weight_versions",
                "token_steps",
                "customized_info",
                "cached_tokens_details",
                "dp_ranks",
                "time_stats",
                "image_tokens",
                "audio_tokens",
                "video_tokens",
                "spec_verify_ct",
                "spec_num_correct_drafts",
                "spec_num_block_accept_tokens",
                "spec_num_cap_tokens",
                "spec_correct_drafts_histogram",
                "spec_cap_lens_histogram",
                "input_top_logprobs_val_flat",
                "input_top_logprobs_idx_flat",
                "input_top_logprobs_flat_null_prefix",
            ],
        ),
        (
            "AbortReq",
            &[
                "rid",
                "http_worker_ipc",
                "abort_all",
                "finished_reason",
                "abort_message",
                "weight_versions",
            ],
        ),
    ],
    sampling: &[
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "beam_width",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
        "custom_params",
        "watermark",
        "stop_strs",
        "stop_regex_strs",
        "stop_str_max_len",
        "stop_regex_max_len",
        "is_normalized",
        "ebnf_full_assistant",
    ],
};

/// Whether a message is in SGLang's pickle encoding (else msgpack): its first frame begins
/// with pickle's PROTO opcode and a protocol SGLang may use (a msgpack fixmap also starts 0x8_).
pub fn is_pickled(frames: &[Vec<u8>]) -> bool {
    frames
        .first()
        .is_some_and(|first| matches!(first.as_slice(), [0x80, 2..=5, ..]))
}

/// Decodes SGLang messages of either encoding.
pub struct SglangDecoder {
    table: &'static FieldTable,
    /// The pickle machine's buffers, from one message to the next.
    scratch: RefCell<pickle::Scratch>,
}

impl Default for SglangDecoder {
    fn default() -> Self {
        Self {
            table: &FIELDS_0_5,
            scratch: RefCell::default(),
        }
    }
}

impl SglangDecoder {
    /// Decode one ZeroMQ message. None: not an SGLang IPC message (another protocol on a
    /// traced socket); an error: it was one, and did not decode. A scheduler's output batch
    /// keeps the bytes of its leading fields.
    pub fn decode(&self, frames: &[Vec<u8>]) -> Option<Result<SglangMessage, SglangError>> {
        let first = frames.first()?;
        let mut decoded = if is_pickled(frames) {
            self.pickled(first, &frames[1..])
        } else if first.is_empty() {
            return None;
        } else {
            let fields = self.msgpack_fields(first)?;
            fields.and_then(|(class, fields)| typed(&class, &fields, self.table))
        };
        if let Ok(SglangMessage::Outputs(o)) = &mut decoded
            && o.stage == OutputStage::TokenIds
        {
            o.leading = self
                .output_head(frames)
                .map(|(_, leading)| leading.to_vec());
        }
        Some(decoded)
    }

    /// An output batch's stage and the bytes of its [`LEADING_FIELDS`], read without decoding
    /// the message; None for any other message, or a layout this does not read.
    pub fn output_head<'f>(&self, frames: &'f [Vec<u8>]) -> Option<(OutputStage, &'f [u8])> {
        let first = frames.first()?;
        let stage = |class: &str| match class {
            "BatchTokenIDOutput" => Some(OutputStage::TokenIds),
            "BatchStrOutput" => Some(OutputStage::Strings),
            _ => None,
        };
        // The class's fields in order (the pickle's keys, msgpack's positions), which must
        // begin with the leading ones.
        let fields = |class: &str| {
            let fields = self.table.fields(class)?;
            (fields.get(..LEADING_FIELDS.len())? == LEADING_FIELDS).then_some(fields)
        };
        if is_pickled(frames) {
            let mut head = pickle_head::struct_head(first)?;
            let stage = stage(head.class).filter(|_| head.module == IO_STRUCT_MODULE)?;
            let next = fields(head.class)?.get(LEADING_FIELDS.len())?;
            // The last value ends where the next field's key is found.
            let walked = LEADING_FIELDS.iter().all(|name| head.field(name)) && head.at_field(next);
            return walked.then(|| (stage, head.walked()));
        }
        // msgpack: `[class, fields...]`, the fields by position.
        let mut rest = first.as_slice();
        rmp::decode::read_array_len(&mut rest).ok()?;
        let (class, mut rest) = rmp::decode::read_str_from_slice(rest).ok()?;
        let stage = stage(class)?;
        fields(class)?;
        let start = rest;
        for _ in LEADING_FIELDS {
            msgpack::read_value(&mut rest, MAX_DEPTH).ok()?;
        }
        Some((stage, &start[..start.len() - rest.len()]))
    }

    /// The request id of a `TokenizedGenerateReqInput`, read from its first field without
    /// decoding the message: all a scheduler's or a DP controller's receipt of a request is
    /// read for (main's send of it is decoded in full). None for any other message, or a
    /// layout this does not read (the message is then decoded).
    pub fn request_rid<'f>(&self, frames: &'f [Vec<u8>]) -> Option<&'f str> {
        const CLASS: &str = "TokenizedGenerateReqInput";
        let first = frames.first()?;
        let fields = self.table.fields(CLASS)?;
        let ["rid", next, ..] = fields else {
            return None;
        };
        if is_pickled(frames) {
            let mut head = pickle_head::struct_head(first)?;
            if (head.module, head.class) != (IO_STRUCT_MODULE, CLASS) {
                return None;
            }
            let rid = head.text("rid")?;
            return head.at_field(next).then_some(rid);
        }
        // msgpack: `[class, rid, ...]`, with as many fields as the table lays out.
        let mut rest = first.as_slice();
        let len = rmp::decode::read_array_len(&mut rest).ok()?;
        let (class, rest) = rmp::decode::read_str_from_slice(rest).ok()?;
        if class != CLASS || len as usize != fields.len() + 1 {
            return None;
        }
        rmp::decode::read_str_from_slice(rest)
            .ok()
            .map(|(rid, _)| rid)
    }

    /// A pickled io_struct instance, read in place.
    fn pickled(&self, data: &[u8], buffers: &[Vec<u8>]) -> Result<SglangMessage, SglangError> {
        let mut scratch = self.scratch.take();
        let message = pickle::parse_with(&mut scratch, data, buffers)
            .map_err(SglangError::from)
            .and_then(|pickle| {
                let message = match pickle.root().instance() {
                    Some((module, class, fields)) if module == IO_STRUCT_MODULE => {
                        typed(class, fields, self.table)
                    }
                    _ => Err(SglangError::Field("message", "io_struct instance")),
                };
                pickle.recycle(&mut scratch);
                message
            });
        self.scratch.replace(scratch);
        message
    }

    /// A msgpack `[class, fields...]` array as (class, field dict); None when it is not one.
    fn msgpack_fields(&self, bytes: &[u8]) -> Option<Result<(String, PyValue), SglangError>> {
        let mut cursor = bytes;
        let Ok(Value::Array(items)) = msgpack::read_value(&mut cursor, MAX_DEPTH) else {
            return None;
        };
        if !cursor.is_empty() {
            return None;
        }
        let (class, values) = items.split_first()?;
        let class = class.as_str()?.to_owned();
        let Some(names) = self.table.fields(&class) else {
            // A class this table does not lay out: known by name, not decoded.
            return Some(Ok((class, PyValue::Dict(Vec::new()))));
        };
        if names.len() != values.len() {
            return Some(Err(SglangError::FieldCount {
                class,
                got: values.len(),
                want: names.len(),
                table: self.table.name,
            }));
        }
        let fields = names
            .iter()
            .zip(values)
            .map(|(name, value)| Ok((PyValue::Str((*name).to_owned()), from_msgpack(value)?)))
            .collect::<Result<Vec<_>, SglangError>>();
        Some(fields.map(|f| (class, PyValue::Dict(f))))
    }
}

/// A msgpack value as the Python value msgspec would have built, with SGLang's extensions.
fn from_msgpack(value: &Value) -> Result<PyValue, SglangError> {
    Ok(match value {
        Value::Nil => PyValue::None,
        Value::Boolean(b) => PyValue::Bool(*b),
        Value::Integer(i) => match i.as_i64() {
            Some(i) => PyValue::Int(i),
            None => PyValue::Float(i.as_f64().unwrap_or(f64::NAN)),
        },
        Value::F32(f) => PyValue::Float(f64::from(*f)),
        Value::F64(f) => PyValue::Float(*f),
        Value::String(s) => PyValue::Str(s.as_str().unwrap_or_default().to_owned()),
        Value::Binary(b) => PyValue::Bytes(b.clone()),
        Value::Array(items) => match items.as_slice() {
            // msgspec's tagged PickleWrapper: a pickle (protocol 4) inside.
            [Value::String(tag), Value::Binary(blob)] if tag.as_str() == Some("PickleWrapper") => {
                pickle::loads(blob, &[])?
            }
            _ => PyValue::List(items.iter().map(from_msgpack).collect::<Result<_, _>>()?),
        },
        Value::Map(entries) => PyValue::Dict(
            entries
                .iter()
                .map(|(k, v)| Ok((from_msgpack(k)?, from_msgpack(v)?)))
                .collect::<Result<_, SglangError>>()?,
        ),
        Value::Ext(EXT_ARRAY, data) => PyValue::List(
            array_items(data)
                .ok_or(SglangError::Msgpack("bad array.array extension".into()))?
                .into_iter()
                .map(PyValue::Int)
                .collect(),
        ),
        Value::Ext(_, data) => PyValue::Bytes(data.clone()),
    })
}

/// Items of an `array.array` extension: u32 BE metadata length, msgpack typecode, raw items
/// (little-endian, the sender's machine format).
fn array_items(data: &[u8]) -> Option<Vec<i64>> {
    let meta_len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    let mut meta = data.get(4..4 + meta_len)?;
    let typecode = msgpack::read_value(&mut meta, 4).ok()?;
    let raw = data.get(4 + meta_len..)?;
    let width = match typecode.as_str()? {
        "q" | "Q" | "l" | "L" => 8,
        "i" | "I" => 4,
        "h" | "H" => 2,
        "b" | "B" => 1,
        _ => return None,
    };
    if raw.len() % width != 0 {
        return None;
    }
    Some(
        raw.chunks_exact(width)
            .map(|c| {
                let mut b = [0u8; 8];
                b[..width].copy_from_slice(c);
                i64::from_le_bytes(b)
            })
            .collect(),
    )
}

fn typed<'v>(
    class: &str,
    f: impl PyRead<'v>,
    table: &FieldTable,
) -> Result<SglangMessage, SglangError> {
    Ok(match class {
        "TokenizedGenerateReqInput" => SglangMessage::Request(Box::new(request(f, table)?)),
        "AbortReq" => SglangMessage::Abort(SglangAbort {
            rid: str_field(f, "rid").ok_or(SglangError::Field("AbortReq", "rid"))?,
            abort_all: f.get("abort_all").and_then(PyRead::as_i64) == Some(1),
            finish: f.get("finished_reason").and_then(finish),
        }),
        "BatchTokenIDOutput" => SglangMessage::Outputs(outputs(f, OutputStage::TokenIds)?),
        "BatchStrOutput" => SglangMessage::Outputs(outputs(f, OutputStage::Strings)?),
        other => SglangMessage::Other(other.to_owned()),
    })
}

fn str_field<'v>(f: impl PyRead<'v>, name: &str) -> Option<String> {
    f.get(name)?.as_str().map(str::to_owned)
}

fn count<'v>(v: impl PyRead<'v>) -> Option<u64> {
    v.as_i64().and_then(|i| u64::try_from(i).ok())
}

fn request<'v>(f: impl PyRead<'v>, table: &FieldTable) -> Result<SglangRequest, SglangError> {
    const CLASS: &str = "TokenizedGenerateReqInput";
    let rid = str_field(f, "rid").ok_or(SglangError::Field(CLASS, "rid"))?;
    let input_ids = f.get("input_ids").and_then(PyRead::int_array);
    let prompt_tokens = input_ids.as_ref().map(|ids| ids.len() as u64);
    // A fixed seed: the same prompt has the same key in every run (replays reproduce).
    let prompt_key = input_ids.map(|ids| foldhash::fast::FixedState::default().hash_one(ids));
    let sampling = f
        .get("sampling_params")
        .map(|s| sampling(s, table))
        .unwrap_or_default();
    Ok(SglangRequest {
        rid,
        prompt_tokens,
        prompt_key,
        stream: f.get("stream").and_then(PyRead::as_i64) == Some(1),
        sampling,
        bootstrap_room: f.get("bootstrap_room").and_then(count),
        trace: f.get("time_stats").and_then(trace_context),
    })
}

/// SamplingParams: a rebuilt instance (pickle) or a plain field array (msgpack).
fn sampling<'v, V: PyRead<'v>>(v: V, table: &FieldTable) -> SglangSampling {
    let named = v.instance().map(|(_, _, fields)| fields);
    let positional = v
        .items()
        .filter(|items| items.len() == table.sampling.len());
    let field = |name: &str| match (named, &positional) {
        (Some(fields), _) => fields.get(name),
        (None, Some(items)) => table
            .sampling
            .iter()
            .position(|k| *k == name)
            .map(|i| items[i]),
        (None, None) => None,
    };
    SglangSampling {
        max_new_tokens: field("max_new_tokens").and_then(count),
        temperature: field("temperature").and_then(PyRead::as_f64),
        top_p: field("top_p").and_then(PyRead::as_f64),
        top_k: field("top_k").and_then(PyRead::as_i64),
        n: field("n").and_then(count),
        stream_interval: field("stream_interval").and_then(count),
    }
}

/// `APIServerReqTimeStats.trace_ctx` of a request, when SGLang's tracing is on.
fn trace_context<'v>(time_stats: impl PyRead<'v>) -> Option<TraceContext> {
    let (_, _, state) = time_stats.instance()?;
    let ctx = state.get("trace_ctx")?;
    if ctx.get("tracing_enable").and_then(PyRead::as_i64) != Some(1) {
        return None;
    }
    Some(TraceContext {
        traceparent: ctx
            .get("root_span_context")
            .and_then(|c| str_field(c, "traceparent")),
        start_time_ns: ctx.get("start_time_ns").and_then(count),
        realtime_minus_monotonic_s: state
            .get("diff_realtime_monotonic")
            .and_then(PyRead::as_f64),
    })
}

fn finish<'v>(v: impl PyRead<'v>) -> Option<SglangFinish> {
    Some(SglangFinish {
        kind: str_field(v, "type")?,
        message: str_field(v, "message"),
        status_code: v.get("status_code").and_then(PyRead::as_i64),
    })
}

fn outputs<'v>(f: impl PyRead<'v>, stage: OutputStage) -> Result<SglangOutputs, SglangError> {
    let class = match stage {
        OutputStage::TokenIds => "BatchTokenIDOutput",
        OutputStage::Strings => "BatchStrOutput",
    };
    let rids = f
        .get("rids")
        .and_then(PyRead::items)
        .ok_or(SglangError::Field(class, "rids"))?;
    // Per-request columns, parallel to `rids`; a column that is None or short is absent.
    let column = |name: &str| {
        let items = f.get(name);
        move |i: usize| items.and_then(|column| column.item(i))
    };
    let ints = |name: &str| -> Vec<Option<u64>> {
        let values = f.get(name).and_then(PyRead::int_array).unwrap_or_default();
        (0..rids.len())
            .map(|i| values.get(i).and_then(|&v| u64::try_from(v).ok()))
            .collect()
    };
    let (finished, times) = (column("finished_reasons"), column("time_stats"));
    let (prompt, completion, cached, retractions) = (
        ints("prompt_tokens"),
        ints("completion_tokens"),
        ints("cached_tokens"),
        ints("retraction_counts"),
    );
    let mut items = Vec::with_capacity(rids.len());
    for (i, rid) in rids.iter().enumerate() {
        let rid = rid.as_str().ok_or(SglangError::Field(class, "rids"))?;
        items.push(RidOutput {
            rid: rid.to_owned(),
            finish: finished(i).and_then(finish),
            prompt_tokens: prompt[i],
            completion_tokens: completion[i],
            cached_tokens: cached[i],
            retractions: retractions[i],
            times: times(i).and_then(scheduler_times),
        });
    }
    Ok(SglangOutputs {
        stage,
        items,
        leading: None,
    })
}

/// A `SchedulerReqTimeStats` with its state (empty without `--enable-metrics`: None).
fn scheduler_times<'v>(v: impl PyRead<'v>) -> Option<SchedulerTimes> {
    let (_, _, state) = v.instance()?;
    // Unset instants are 0.0 in SGLang's dataclass.
    let at = |k: &str| state.get(k).and_then(PyRead::as_f64).filter(|t| *t > 0.0);
    let times = SchedulerTimes {
        wait_queue_entry: at("wait_queue_entry_time"),
        forward_entry: at("forward_entry_time"),
        prefill_finished: at("prefill_finished_time"),
        queue_duration_s: at("queue_duration_s"),
    };
    (times != SchedulerTimes::default()).then_some(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    /// An `array.array('q')` extension as SGLang's msgpack encoder writes it.
    fn int64_array(items: &[i64]) -> Value {
        let meta = enc(&s("q"));
        let mut data = (meta.len() as u32).to_be_bytes().to_vec();
        data.extend(meta);
        for i in items {
            data.extend(i.to_le_bytes());
        }
        Value::Ext(EXT_ARRAY, data)
    }

    fn decode(value: &Value) -> Option<Result<SglangMessage, SglangError>> {
        SglangDecoder::default().decode(&[enc(value)])
    }

    #[test]
    fn a_msgpack_abort_maps_its_fields_by_position() {
        let finish = Value::Map(vec![
            (s("type"), s("abort")),
            (s("message"), s("Aborted")),
            (s("status_code"), Value::Nil),
        ]);
        let abort = Value::Array(vec![
            s("AbortReq"),
            s("rid-1"),
            Value::Nil,
            Value::Boolean(false),
            finish,
            Value::Nil,
            Value::Nil,
        ]);
        let Some(Ok(SglangMessage::Abort(a))) = decode(&abort) else {
            panic!("{:?}", decode(&abort));
        };
        assert_eq!(a.rid, "rid-1");
        assert!(!a.abort_all);
        let finish = a.finish.unwrap();
        assert_eq!(
            (finish.kind.as_str(), finish.message.as_deref()),
            ("abort", Some("Aborted"))
        );
    }

    #[test]
    fn a_field_count_the_table_does_not_know_fails_the_message() {
        let short = Value::Array(vec![s("AbortReq"), s("rid-1"), Value::Nil]);
        let Some(Err(e)) = decode(&short) else {
            panic!("decoded a 2-field AbortReq");
        };
        assert_eq!(e.to_string(), "AbortReq: 2 fields, the 0.5 table has 6");
        // Not SGLang at all: an untagged array, a map, garbage.
        assert!(decode(&Value::Array(vec![Value::from(1)])).is_none());
        assert!(decode(&Value::Map(vec![])).is_none());
        assert!(decode(&Value::Map(vec![(s("rid"), s("x"))])).is_none());
        assert!(
            SglangDecoder::default()
                .decode(&[vec![0xc1, 0xff]])
                .is_none()
        );
        // Another tagged class: known by name.
        let other = Value::Array(vec![s("FlushCacheReqInput"), s("x")]);
        assert_eq!(
            decode(&other).unwrap().unwrap(),
            SglangMessage::Other("FlushCacheReqInput".into())
        );
    }

    #[test]
    fn a_msgpack_batch_output_reads_its_columns() {
        let names = FIELDS_0_5.fields("BatchStrOutput").unwrap();
        let mut values = vec![Value::Nil; names.len()];
        let mut set = |name: &str, v: Value| {
            let i = names.iter().position(|n| *n == name).unwrap();
            values[i] = v;
        };
        set("rids", Value::Array(vec![s("a"), s("b")]));
        set(
            "finished_reasons",
            Value::Array(vec![
                Value::Nil,
                Value::Map(vec![
                    (s("type"), s("length")),
                    (s("length"), Value::from(3)),
                ]),
            ]),
        );
        set(
            "output_ids",
            Value::Array(vec![int64_array(&[5]), int64_array(&[6, 7])]),
        );
        set(
            "prompt_tokens",
            Value::Array(vec![Value::from(10), Value::from(20)]),
        );
        set(
            "completion_tokens",
            Value::Array(vec![Value::from(1), Value::from(3)]),
        );
        set(
            "cached_tokens",
            Value::Array(vec![Value::from(0), Value::from(8)]),
        );
        let mut message = vec![s("BatchStrOutput")];
        message.extend(values);
        let Some(Ok(SglangMessage::Outputs(out))) = decode(&Value::Array(message)) else {
            panic!("not decoded");
        };
        assert_eq!(out.stage, OutputStage::Strings);
        let [a, b] = out.items.as_slice() else {
            panic!("{:?}", out.items);
        };
        assert_eq!((a.rid.as_str(), a.finish.is_none()), ("a", true));
        assert_eq!(b.finish.as_ref().unwrap().kind, "length");
        assert_eq!(
            (
                b.prompt_tokens,
                b.completion_tokens,
                b.cached_tokens,
                b.retractions
            ),
            (Some(20), Some(3), Some(8), None)
        );
        assert!(b.times.is_none());
    }

    #[test]
    fn an_output_batchs_leading_fields_are_read_without_decoding_it() {
        let decoder = SglangDecoder::default();
        let leading = [
            Value::Array(vec![s("a"), s("b")]),
            Value::Nil,
            Value::Array(vec![Value::Nil, Value::Map(vec![(s("type"), s("stop"))])]),
        ];
        let message = |class: &str, leading: &[Value]| {
            let mut values = vec![s(class)];
            values.extend(leading.iter().cloned());
            values.resize(1 + FIELDS_0_5.fields(class).unwrap().len(), Value::Nil);
            enc(&Value::Array(values))
        };
        let want: Vec<u8> = leading.iter().flat_map(enc).collect();
        for (class, stage, kept) in [
            (
                "BatchTokenIDOutput",
                OutputStage::TokenIds,
                Some(want.clone()),
            ),
            ("BatchStrOutput", OutputStage::Strings, None),
        ] {
            let frames = [message(class, &leading)];
            assert_eq!(
                decoder.output_head(&frames),
                Some((stage, want.as_slice())),
                "{class}"
            );
            let Some(Ok(SglangMessage::Outputs(o))) = decoder.decode(&frames) else {
                panic!("{class}: not decoded");
            };
            assert_eq!(o.leading, kept, "{class}: only a send keeps them");
        }
        // Other classes, and batches cut short, have none.
        assert_eq!(decoder.output_head(&[message("AbortReq", &[])]), None);
        let mut short = message("BatchStrOutput", &leading);
        short.truncate(short.len() - FIELDS_0_5.fields("BatchStrOutput").unwrap().len() + 2);
        assert_eq!(decoder.output_head(&[short]), None);
    }

    /// A msgspec Struct of io_struct pickled as protocol 5 writes it, each value given as its
    /// opcodes.
    fn struct_pickle(class: &str, fields: &[(&str, &[u8])]) -> Vec<u8> {
        let text = |p: &mut Vec<u8>, text: &str| {
            p.push(0x8c);
            p.push(text.len() as u8);
            p.extend(text.as_bytes());
            p.push(0x94);
        };
        let mut p = vec![0x80, 5, 0x95];
        p.extend(0u64.to_le_bytes());
        text(&mut p, "msgspec._utils");
        text(&mut p, "rebuild");
        p.extend([0x93, 0x94]);
        text(&mut p, IO_STRUCT_MODULE);
        text(&mut p, class);
        p.extend([0x93, 0x94, b'}', 0x94, b'(']);
        for (name, value) in fields {
            text(&mut p, name);
            p.extend(*value);
        }
        p.extend([b'u', 0x86, 0x94, b'R', 0x94, b'.']);
        p
    }

    #[test]
    fn a_requests_id_is_read_without_decoding_it() {
        let decoder = SglangDecoder::default();
        const CLASS: &str = "TokenizedGenerateReqInput";
        let rid = b"\x8c\x03abc\x94";
        let pickled = |class: &str, rid: &[u8], next: &str| {
            vec![struct_pickle(
                class,
                &[("rid", rid), (next, b"N"), ("input_ids", b"]\x94")],
            )]
        };
        let frames = pickled(CLASS, rid, "http_worker_ipc");
        assert_eq!(decoder.request_rid(&frames), Some("abc"));
        let Some(Ok(SglangMessage::Request(r))) = decoder.decode(&frames) else {
            panic!("not decoded");
        };
        assert_eq!(r.rid, "abc", "the same id as the decoder reads");
        // Another class, a rid that is no string, a layout that is not the table's.
        assert_eq!(
            decoder.request_rid(&pickled("AbortReq", rid, "http_worker_ipc")),
            None
        );
        assert_eq!(
            decoder.request_rid(&pickled(CLASS, b"N", "http_worker_ipc")),
            None
        );
        assert_eq!(
            decoder.request_rid(&pickled(CLASS, rid, "input_text")),
            None
        );
        // msgpack: by position, with the table's field count.
        let fields = FIELDS_0_5.fields(CLASS).unwrap().len();
        let message = |class: &str, rid: Value, fields: usize| {
            let mut values = vec![s(class), rid];
            values.resize(1 + fields, Value::Nil);
            vec![enc(&Value::Array(values))]
        };
        assert_eq!(
            decoder.request_rid(&message(CLASS, s("abc"), fields)),
            Some("abc")
        );
        assert_eq!(
            decoder.request_rid(&message(CLASS, s("abc"), fields - 1)),
            None
        );
        assert_eq!(
            decoder.request_rid(&message(CLASS, Value::Nil, fields)),
            None
        );
        assert_eq!(decoder.request_rid(&message("AbortReq", s("abc"), 5)), None);
    }

    #[test]
    fn array_extensions_of_every_width_and_bad_ones() {
        let Value::Ext(_, data) = int64_array(&[1, -2, 300]) else {
            unreachable!()
        };
        assert_eq!(array_items(&data), Some(vec![1, -2, 300]));
        assert_eq!(array_items(&data[..data.len() - 1]), None, "a partial item");
        assert_eq!(
            array_items(&[0, 0, 0, 9, 0xa1]),
            None,
            "metadata past the end"
        );
        let meta = enc(&s("x"));
        let mut bad = (meta.len() as u32).to_be_bytes().to_vec();
        bad.extend(meta);
        assert_eq!(array_items(&bad), None, "unknown typecode");
    }
}
