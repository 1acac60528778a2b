//! A recording of the real SGLang 0.5.23 CPU server (tiny model, default pickle IPC; see
//! tests/fixtures/sglang-0.5.23-workload.md) replayed through the decoders: every ZeroMQ
//! message between the TokenizerManager, the scheduler and the detokenizer must decode with
//! the restricted pickle decoder into the classes SGLang sends, with consistent contents.
use std::collections::{BTreeMap, BTreeSet};

use infertrace::{
    decode::{
        flows::Decoded,
        pickle::loads,
        sglang::{OutputStage, RidOutput, SglangDecoder, SglangMessage, SglangRequest},
    },
    discover::engine::Engine,
    export::Exporter,
    pipeline::{Pipeline, PipelineOptions},
    session,
    telemetry::{
        Clock, SpanOptions,
        metrics::{Registry, Sample},
        span::{AttrValue, Span},
    },
};
use infertrace_tests::fixture;

#[test]
fn every_pickled_sglang_message_decodes() {
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    let mut prompt_lengths: BTreeMap<String, usize> = BTreeMap::new();
    let mut reported: BTreeMap<String, i64> = BTreeMap::new();
    let mut failures = Vec::new();
    session::replay(&fixture("sglang-0.5.23-pickle.rec"), |_, d| {
        // Each message is seen leaving one process and entering another: decode the sends.
        let Decoded::Zmtp {
            outgoing: true,
            message,
            ..
        } = d
        else {
            return;
        };
        let value = match loads(&message.frames[0], &message.frames[1..]) {
            Ok(v) => v,
            Err(e) => return failures.push(e.to_string()),
        };
        let Some((module, class, fields)) = value.instance() else {
            return failures.push(format!("not an instance: {value:?}"));
        };
        *classes.entry(format!("{module}.{class}")).or_default() += 1;
        match class {
            "TokenizedGenerateReqInput" => {
                let rid = fields
                    .get("rid")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                let ids = fields.get("input_ids").and_then(|v| v.int_array());
                prompt_lengths.insert(rid.to_owned(), ids.map_or(0, |i| i.len()));
            }
            "BatchTokenIDOutput" => {
                let rids = fields
                    .get("rids")
                    .and_then(|v| v.as_seq())
                    .unwrap_or_default();
                let prompts = fields
                    .get("prompt_tokens")
                    .and_then(|v| v.int_array())
                    .unwrap_or_default();
                assert_eq!(rids.len(), prompts.len());
                for (rid, n) in rids.iter().zip(prompts) {
                    reported.insert(rid.as_str().unwrap_or_default().to_owned(), n);
                }
            }
            _ => {}
        }
    })
    .expect("replay");
    assert!(failures.is_empty(), "{failures:#?}");
    let names: BTreeSet<&str> = classes.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "sglang.srt.managers.io_struct.AbortReq",
            "sglang.srt.managers.io_struct.BatchStrOutput",
            "sglang.srt.managers.io_struct.BatchTokenIDOutput",
            "sglang.srt.managers.io_struct.TokenizedGenerateReqInput",
        ]),
        "{classes:?}"
    );
    assert!(classes["sglang.srt.managers.io_struct.BatchTokenIDOutput"] > 100);
    // The prompt the TokenizerManager sent is the prompt the scheduler reports.
    let mut compared = 0;
    for (rid, len) in &prompt_lengths {
        if let Some(&n) = reported.get(rid) {
            assert_eq!(*len as i64, n, "prompt tokens of {rid}");
            compared += 1;
        }
    }
    assert!(compared >= 20, "only {compared} requests compared");
}

/// With `SGLANG_USE_PICKLE_IPC=0` the same messages travel as msgpack arrays whose first
/// element is the class name (msgspec `array_like` structs tagged with their name).
#[test]
fn every_msgpack_sglang_message_is_a_tagged_array() {
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    session::replay(&fixture("sglang-0.5.23-msgpack.rec"), |_, d| {
        let Decoded::Zmtp {
            outgoing: true,
            message,
            ..
        } = d
        else {
            return;
        };
        let mut bytes = message.frames[0].as_slice();
        match rmpv::decode::read_value_with_max_depth(&mut bytes, 64) {
            Ok(rmpv::Value::Array(fields)) if bytes.is_empty() => {
                match fields.first().and_then(rmpv::Value::as_str) {
                    Some(class) => *classes.entry(class.to_owned()).or_default() += 1,
                    None => failures.push(format!("untagged array of {}", fields.len())),
                }
            }
            other => failures.push(format!("{:?}", other.map(|v| v.to_string()))),
        }
    })
    .expect("replay");
    assert!(failures.is_empty(), "{failures:#?}");
    let names: BTreeSet<&str> = classes.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "AbortReq",
            "BatchStrOutput",
            "BatchTokenIDOutput",
            "TokenizedGenerateReqInput"
        ]),
        "{classes:?}"
    );
}

/// What the typed decoder made of one recording's messages (each counted once: as sent).
#[derive(Debug, Default)]
struct Typed {
    requests: Vec<SglangRequest>,
    aborts: usize,
    token_outputs: usize,
    str_outputs: usize,
    /// Finishing outputs reaching the main process, per rid.
    finished: BTreeMap<String, RidOutput>,
    errors: Vec<String>,
}

fn typed(name: &str) -> Typed {
    let decoder = SglangDecoder::default();
    let mut t = Typed::default();
    session::replay(&fixture(name), |_, d| {
        let Decoded::Zmtp {
            outgoing: true,
            message,
            ..
        } = d
        else {
            return;
        };
        match decoder.decode(&message.frames) {
            Some(Ok(SglangMessage::Request(r))) => t.requests.push(*r),
            Some(Ok(SglangMessage::Abort(_))) => t.aborts += 1,
            Some(Ok(SglangMessage::Outputs(o))) => match o.stage {
                OutputStage::TokenIds => t.token_outputs += 1,
                OutputStage::Strings => {
                    t.str_outputs += 1;
                    for item in o.items.into_iter().filter(|i| i.finish.is_some()) {
                        t.finished.insert(item.rid.clone(), item);
                    }
                }
            },
            Some(Ok(SglangMessage::Other(class))) => t.errors.push(format!("other: {class}")),
            Some(Err(e)) => t.errors.push(e.to_string()),
            None => t.errors.push("not SGLang".into()),
        }
    })
    .expect("replay");
    t
}

#[test]
fn both_encodings_decode_to_the_same_requests_and_outputs() {
    let (pickle, msgpack) = (
        typed("sglang-0.5.23-pickle.rec"),
        typed("sglang-0.5.23-msgpack.rec"),
    );
    for (mode, t) in [("pickle", &pickle), ("msgpack", &msgpack)] {
        assert!(t.errors.is_empty(), "{mode}: {:#?}", t.errors);
        // 28 engine requests and 5 aborts (tests/fixtures/sglang-0.5.23-workload.md).
        assert_eq!((t.requests.len(), t.aborts), (28, 5), "{mode}");
        assert_eq!(
            t.token_outputs, t.str_outputs,
            "{mode}: one string output per token output"
        );
        assert_eq!(t.finished.len(), 28, "{mode}: every request finished once");
        for r in &t.requests {
            let done = &t.finished[&r.rid];
            assert_eq!(done.prompt_tokens, r.prompt_tokens, "{mode} {}", r.rid);
            // SGLang's tracing was on: its root span's context travels with the request.
            let trace = r.trace.as_ref().expect("trace_ctx");
            assert!(
                trace
                    .traceparent
                    .as_deref()
                    .is_some_and(|t| t.starts_with("00-"))
            );
            assert!(trace.start_time_ns.is_some());
            // --enable-metrics: the scheduler's instants, in order.
            let times = done.times.expect("scheduler time stats");
            let (queued, forward) = (times.wait_queue_entry.unwrap(), times.forward_entry);
            if let Some(forward) = forward {
                assert!(forward >= queued, "{mode} {}: {times:?}", r.rid);
            }
            let finish = done.finish.as_ref().unwrap();
            match finish.kind.as_str() {
                "length" => assert_eq!(
                    done.completion_tokens, r.sampling.max_new_tokens,
                    "{mode} {}",
                    r.rid
                ),
                "abort" => {}
                other => panic!("{mode} {}: finish {other}", r.rid),
            }
        }
    }
    // The same workload: the same prompts and limits, whatever the encoding.
    let shape = |t: &Typed| {
        let mut v: Vec<_> = t
            .requests
            .iter()
            .map(|r| (r.prompt_tokens, r.sampling.max_new_tokens, r.stream))
            .collect();
        v.sort();
        v
    };
    assert_eq!(shape(&pickle), shape(&msgpack));
}

/// Collects the spans the pipeline exports.
struct Collect(std::sync::Arc<std::sync::Mutex<Vec<Span>>>);

impl Exporter for Collect {
    fn spans(&mut self, spans: &[Span]) {
        self.0.lock().unwrap().extend_from_slice(spans);
    }
    fn metrics(&mut self, _: &[Sample], _: u64) {}
}

/// infertrace's spans for one recording, replayed as SGLang.
fn our_spans(name: &str) -> Vec<Span> {
    let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let collect = Collect(spans.clone());
    session::replay_pipeline(
        &fixture(name),
        |header| {
            Ok(Pipeline::new(
                PipelineOptions {
                    spans: SpanOptions {
                        default_model: Some("tiny".into()),
                        ..SpanOptions::default()
                    },
                    metrics_interval_ns: 10_000_000_000,
                    vllm_version: None,
                    engine: Some(Engine::Sglang),
                },
                Clock {
                    realtime_minus_monotonic_ns: header.realtime_minus_monotonic_ns,
                },
                std::sync::Arc::new(std::sync::Mutex::new(Registry::default())),
                vec![Box::new(collect)],
            ))
        },
        |_, _| {},
    )
    .expect("replay");
    spans.lock().unwrap().clone()
}

/// SGLang's own spans (OTLP JSON lines): (name, span id, parent id, start, end, attributes).
struct Theirs {
    name: String,
    id: String,
    parent: String,
    start: u64,
    end: u64,
    attributes: serde_json::Value,
}

fn their_spans(name: &str) -> Vec<Theirs> {
    infertrace_tests::vllm_truth::json_lines(&fixture(name))
        .into_iter()
        .map(|v| {
            let ns = |k: &str| v[k].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
            Theirs {
                name: v["name"].as_str().unwrap_or_default().to_owned(),
                id: v["spanId"].as_str().unwrap_or_default().to_owned(),
                parent: v["parentSpanId"].as_str().unwrap_or_default().to_owned(),
                start: ns("startTimeUnixNano"),
                end: ns("endTimeUnixNano"),
                attributes: v["attributes"].clone(),
            }
        })
        .collect()
}

fn attr_f64(v: &serde_json::Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str()?.parse().ok())
}

fn ours_f64(span: &Span, key: &str) -> Option<f64> {
    match span.attribute(key)? {
        AttrValue::Float(f) => Some(*f),
        AttrValue::Int(i) => Some(*i as f64),
        AttrValue::Str(s) => s.parse().ok(),
        _ => None,
    }
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[i]
}

/// The request spans and their stage spans, compared with SGLang's own tracing of the same
/// run. Exact: the set of requests, token counts, finish reasons, the scheduler stages that
/// SGLang times itself (prefill_waiting, prefill_forward). Reported (and bounded): the
/// frontend-clock latencies, which these recordings (made before eventfds were captured)
/// time at the outputs' arrival in the main process.
#[test]
fn sglang_request_and_stage_spans_agree_with_sglangs_own() {
    for mode in ["pickle", "msgpack"] {
        let ours = our_spans(&format!("sglang-0.5.23-{mode}.rec"));
        let theirs = their_spans(&format!("sglang-0.5.23-{mode}.otlp.jsonl"));
        let requests: Vec<&Span> = ours
            .iter()
            .filter(|s| s.name.starts_with(" Req "))
            .collect();
        assert_eq!(
            requests.len(),
            28,
            "{mode}: one request span per engine request"
        );
        let mut diffs: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut staged = 0;
        for ours_req in &requests {
            let Some(AttrValue::Str(rid)) = ours_req.attribute("gen_ai.request.id") else {
                panic!("{mode}: request span without id");
            };
            let theirs_req = theirs
                .iter()
                .find(|t| t.name.starts_with(" Req ") && t.attributes["gen_ai.request.id"] == *rid)
                .unwrap_or_else(|| panic!("{mode}: SGLang has no request span for {rid}"));
            assert_eq!(ours_req.name, theirs_req.name, "{mode} {rid}");
            for key in [
                "gen_ai.usage.prompt_tokens",
                "gen_ai.usage.completion_tokens",
                "gen_ai.usage.cached_tokens",
            ] {
                assert_eq!(
                    ours_f64(ours_req, key),
                    attr_f64(&theirs_req.attributes[key]),
                    "{mode} {rid} {key}"
                );
            }
            assert_eq!(
                ours_req.attribute("gen_ai.response.finish_reasons"),
                theirs_req.attributes["gen_ai.response.finish_reasons"]
                    .as_str()
                    .map(|s| AttrValue::Str(s.into()))
                    .as_ref(),
                "{mode} {rid}"
            );
            for key in [
                "gen_ai.latency.time_to_first_token",
                "gen_ai.latency.e2e",
                "gen_ai.latency.time_in_model_prefill",
                "gen_ai.latency.time_in_model_decode",
                "gen_ai.latency.time_in_model_inference",
            ] {
                if let (Some(a), Some(b)) = (
                    ours_f64(ours_req, key),
                    attr_f64(&theirs_req.attributes[key]),
                ) {
                    diffs.entry(key).or_default().push((a - b).abs());
                }
            }
            // Stage spans: each of ours is one of SGLang's, and the scheduler's own instants
            // bound the same intervals.
            let children_of =
                |id: &str| -> Vec<&Theirs> { theirs.iter().filter(|t| t.parent == id).collect() };
            let their_threads = children_of(&theirs_req.id);
            // n>1: SGLang files the warm-up's scheduler stages under the parent request's
            // span, which never reaches the scheduler (docs/accuracy.md); not compared.
            if !their_threads
                .iter()
                .any(|t| t.name.starts_with("Scheduler"))
            {
                continue;
            }
            staged += 1;
            let their_stages: Vec<&Theirs> = their_threads
                .into_iter()
                .flat_map(|thread| children_of(&thread.id))
                .collect();
            let our_threads: Vec<[u8; 8]> = ours
                .iter()
                .filter(|s| s.parent_span_id == Some(ours_req.span_id))
                .map(|s| s.span_id)
                .collect();
            let our_stages = ours
                .iter()
                .filter(|s| s.parent_span_id.is_some_and(|p| our_threads.contains(&p)));
            for stage in our_stages {
                let theirs_stage = their_stages
                    .iter()
                    .find(|t| t.name == stage.name)
                    .unwrap_or_else(|| panic!("{mode} {rid}: SGLang has no {}", stage.name));
                let d = |a: u64, b: u64| (a as f64 - b as f64).abs() / 1e9;
                let key: &'static str = match stage.name.as_str() {
                    "tokenize" => "tokenize (+dispatch) end",
                    "request_process" => "request_process start",
                    "prefill_waiting" => "prefill_waiting",
                    "prefill_forward" => "prefill_forward",
                    "decode_forward" => "decode_forward end",
                    _ => "other",
                };
                let diff = match stage.name.as_str() {
                    "tokenize" => d(stage.end_time_unix_nano, theirs_stage.end),
                    "request_process" => d(stage.start_time_unix_nano, theirs_stage.start),
                    "decode_forward" => d(stage.end_time_unix_nano, theirs_stage.end),
                    _ => d(stage.start_time_unix_nano, theirs_stage.start)
                        .max(d(stage.end_time_unix_nano, theirs_stage.end)),
                };
                diffs.entry(key).or_default().push(diff);
            }
        }
        for (key, values) in &mut diffs {
            let (p50, p99, max) = (
                percentile(values, 50.0),
                percentile(values, 99.0),
                percentile(values, 100.0),
            );
            println!(
                "{mode} {key} ({} spans): |infertrace - SGLang| p50 {:.4} ms, p99 {:.4} ms, max {:.4} ms",
                values.len(),
                p50 * 1e3,
                p99 * 1e3,
                max * 1e3
            );
        }
        assert!(
            staged >= 20,
            "{mode}: stages of only {staged} requests compared"
        );
        // SGLang's own instants, carried on the wire: the same to float precision.
        for key in ["prefill_waiting", "prefill_forward"] {
            let max = diffs.get_mut(key).map_or(0.0, |v| percentile(v, 100.0));
            assert!(max < 2e-6, "{mode} {key}: max difference {max} s");
        }
    }
}
