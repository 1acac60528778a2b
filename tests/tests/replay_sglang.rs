//! Recordings of the real SGLang 0.5.23 CPU server (tiny model, pickle and msgpack IPC; see
//! tests/fixtures/sglang-0.5.23-workload.md) replayed: every ZeroMQ message between the
//! TokenizerManager, the scheduler and the detokenizer decodes into the classes SGLang sends,
//! with consistent contents, and the spans agree with SGLang's own tracing of the same run.
use std::collections::{BTreeMap, BTreeSet};

use infertrace::{
    decode::{flows::Decoded, pickle::loads, pyread::PyRead},
    discover::engine::Target,
    engines::{
        Engine,
        sglang::{
            SglangInstance,
            tracker::SglangStats,
            wire::{OutputStage, RidOutput, SglangDecoder, SglangMessage, SglangRequest},
        },
    },
    export::jsonl::Jsonl,
    pipeline::{Pipeline, PipelineOptions},
    session,
    telemetry::{Clock, SpanOptions, metrics::Registry},
};
use infertrace_tests::{fixture, sglang_truth};

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

/// Main's receipt of each step repeats the scheduler's send of it (engines/sglang/
/// output_receipts.rs): the leading fields read from the receipt's first bytes are the send's,
/// in send order, and the receipt decoded in full carries the same outputs.
#[test]
fn each_receipt_at_main_repeats_a_scheduler_send_in_order() {
    let decoder = SglangDecoder::default();
    for mode in ["pickle", "msgpack"] {
        let mut sends = std::collections::VecDeque::new();
        let mut receipts = 0;
        session::replay(&fixture(&format!("sglang-0.5.23-{mode}.rec")), |_, d| {
            let Decoded::Zmtp {
                outgoing, message, ..
            } = d
            else {
                return;
            };
            let head = decoder.output_head(&message.frames);
            let Some(Ok(SglangMessage::Outputs(o))) = decoder.decode(&message.frames) else {
                assert!(
                    head.is_none(),
                    "{mode}: a head read from a message of another kind"
                );
                return;
            };
            let (stage, leading) = head.expect("every output batch's head is read");
            assert_eq!(stage, o.stage, "{mode}");
            match (o.stage, outgoing) {
                (OutputStage::TokenIds, true) => {
                    assert_eq!(o.leading.as_deref(), Some(leading), "{mode}");
                    sends.push_back(o);
                }
                (OutputStage::Strings, false) => {
                    let send = sends.pop_front().expect("a receipt before its send");
                    assert_eq!(send.leading.as_deref(), Some(leading), "{mode}");
                    // The detokenizer re-bases the scheduler's time stats, which main does not
                    // read from a receipt.
                    let untimed = |items: Vec<RidOutput>| -> Vec<RidOutput> {
                        let untimed = |item| RidOutput {
                            times: None,
                            ..item
                        };
                        items.into_iter().map(untimed).collect()
                    };
                    assert_eq!(
                        untimed(send.items),
                        untimed(o.items),
                        "{mode}: the receipt's outputs"
                    );
                    assert_eq!(o.leading, None, "{mode}: a receipt keeps no leading bytes");
                    receipts += 1;
                }
                _ => {}
            }
        })
        .expect("replay");
        assert!(receipts > 100, "{mode}: {receipts} receipts");
        assert!(
            sends.is_empty(),
            "{mode}: {} sends never received",
            sends.len()
        );
    }
}

/// infertrace's JSONL for one recording, replayed as SGLang at a trace level, and the SGLang
/// tracker's counters.
fn replay_to_jsonl(name: &str, out: &std::path::Path, sglang_trace_level: u8) -> SglangStats {
    let file = std::fs::File::create(out).expect("temp file");
    let (_, _, pipeline) = session::replay_pipeline(
        &fixture(name),
        |header| {
            Ok(Pipeline::new(
                PipelineOptions {
                    spans: SpanOptions {
                        sglang_trace_level,
                        ..SpanOptions::default()
                    },
                    metrics_interval_ns: 10_000_000_000,
                    targets: vec![Target {
                        pid: header.pids[0],
                        engine: Some(Engine::Sglang),
                        version: None,
                        served_model: Some("tiny".into()),
                        ..Target::default()
                    }],
                    host: header.host.clone(),
                    profile_output: None,
                },
                Clock::fixed(header.realtime_minus_monotonic_ns),
                std::sync::Arc::new(std::sync::Mutex::new(Registry::default())),
                vec![Box::new(Jsonl::new(std::io::BufWriter::new(file)))],
            ))
        },
        |_, _| {},
    )
    .expect("replay");
    pipeline
        .expect("decoded messages")
        .instances()
        .next()
        .and_then(|i| i.as_any().downcast_ref::<SglangInstance>())
        .expect("an SGLang instance")
        .stats()
}

/// The request spans and their stage spans, compared with SGLang's own tracing of the same
/// run (tests/src/sglang_truth.rs says what must hold).
#[test]
fn sglang_request_and_stage_spans_agree_with_sglangs_own() {
    for mode in ["pickle", "msgpack"] {
        let out = std::env::temp_dir().join(format!(
            "infertrace-sglang-{mode}-{}.jsonl",
            std::process::id()
        ));
        let stats = replay_to_jsonl(&format!("sglang-0.5.23-{mode}.rec"), &out, 3);
        // Every receipt at main was taken from the scheduler's send it repeats.
        assert_eq!(stats.outputs_repeating_sends, stats.outputs, "{mode}");
        assert!(stats.outputs > 100, "{mode}: {} outputs", stats.outputs);
        let read = |suffix: &str| {
            std::fs::read_to_string(fixture(&format!("sglang-0.5.23-{mode}.{suffix}")))
                .expect("fixture")
        };
        let mut report = sglang_truth::compare(
            &out,
            &fixture(&format!("sglang-0.5.23-{mode}.otlp.jsonl")),
            sglang_truth::ONE_SCHEDULER,
        );
        report.add(sglang_truth::compare_metrics(
            &out,
            &read("metrics-before.txt"),
            &read("metrics-after.txt"),
        ));
        let _ = std::fs::remove_file(&out);
        println!("{mode}:\n{}", report.text);
        assert!(
            report.failures.is_empty(),
            "{mode}: {:#?}\n{}",
            report.failures,
            report.text
        );
    }
}

/// Lower trace levels leave out the stages above them, and the next stage links to the last
/// one kept; level 0 leaves only the entry spans.
#[test]
fn trace_levels_leave_out_higher_stages_and_relink() {
    let out = std::env::temp_dir().join(format!(
        "infertrace-sglang-levels-{}.jsonl",
        std::process::id()
    ));
    let spans_at = |level: u8| -> Vec<serde_json::Value> {
        replay_to_jsonl("sglang-0.5.23-pickle.rec", &out, level);
        let spans = infertrace_tests::vllm_truth::json_lines(&out)
            .into_iter()
            .filter(|v| v["type"] == "span")
            .collect();
        let _ = std::fs::remove_file(&out);
        spans
    };
    let count = |spans: &[serde_json::Value], name: &str| {
        spans.iter().filter(|s| s["name"] == name).count()
    };
    let full = spans_at(3);
    assert!(count(&full, "request_process") > 20 && count(&full, "decode_loop") > 100);
    let level1 = spans_at(1);
    assert_eq!(count(&level1, "request_process"), 0);
    assert_eq!(count(&level1, "decode_loop"), 0);
    assert_eq!(
        count(&level1, "prefill_waiting"),
        count(&full, "prefill_waiting")
    );
    // prefill_waiting now follows tokenize directly.
    let name_of = |id: &serde_json::Value| {
        level1
            .iter()
            .find(|s| &s["span_id"] == id)
            .and_then(|s| s["name"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    for waiting in level1.iter().filter(|s| s["name"] == "prefill_waiting") {
        assert_eq!(name_of(&waiting["links"][0]), "tokenize");
    }
    let level0 = spans_at(0);
    assert!(!level0.is_empty());
    assert!(
        level0.iter().all(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            name.starts_with("chat ")
                || name.starts_with("text_completion ")
                || name.starts_with("generate")
        }),
        "{:?}",
        level0.iter().map(|s| s["name"].clone()).collect::<Vec<_>>()
    );
}
