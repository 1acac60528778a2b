//! A recording of the real vLLM 0.32.0 CPU engine (tiny model) replayed through the decoders:
//! no root, no engine. Recorded with `infertrace record --pid <API server>` while the demo's
//! requests ran twice (a 1,831-token completion, a streaming chat and a non-streaming chat),
//! attached to an engine that had already served traffic.
use infertrace::{
    capture::recording::Header,
    decode::{flows::Decoded, http::HttpExchange, zmtp::ZmtpMessage},
    session,
};
use infertrace_tests::{fixture, zmtp_messages};

fn replay() -> (Header, Vec<Decoded>, session::Summary) {
    let mut decoded = Vec::new();
    let (header, summary) = session::replay(&fixture("vllm-0.32.0-tiny.rec"), |_, d| {
        decoded.push(d.clone())
    })
    .expect("replay");
    (header, decoded, summary)
}

fn exchanges(decoded: &[Decoded]) -> Vec<&HttpExchange> {
    decoded
        .iter()
        .filter_map(|d| match d {
            Decoded::Http { exchange, .. } => Some(exchange.as_ref()),
            _ => None,
        })
        .collect()
}

/// vLLM ADD requests: `[b"\x00", msgpack EngineCoreRequest (array of 22)]`.
fn adds(decoded: &[Decoded], outgoing: bool) -> Vec<(u32, &ZmtpMessage)> {
    zmtp_messages(decoded, outgoing)
        .into_iter()
        .filter(|(_, m)| {
            m.frames.len() == 2
                && m.frames[0] == [0x00]
                && m.frames[1].starts_with(&[0xdc, 0x00, 0x16])
        })
        .collect()
}

/// Number of prompt token ids in an EngineCoreRequest: field 0 is the request id (str),
/// field 1 the token id array.
fn prompt_token_count(msgpack: &[u8]) -> usize {
    let mut at = 3; // array16 header of the request
    at += match msgpack[at] {
        b @ 0xa0..=0xbf => 1 + (b & 0x1f) as usize,
        0xd9 => 2 + msgpack[at + 1] as usize,
        0xda => 3 + u16::from_be_bytes([msgpack[at + 1], msgpack[at + 2]]) as usize,
        other => panic!("request id is not a str (0x{other:02x})"),
    };
    match msgpack[at] {
        b @ 0x90..=0x9f => (b & 0x0f) as usize,
        0xdc => u16::from_be_bytes([msgpack[at + 1], msgpack[at + 2]]) as usize,
        other => panic!("prompt_token_ids is not an array (0x{other:02x})"),
    }
}

#[test]
fn http_exchanges_of_the_recorded_vllm_session() {
    let (header, decoded, summary) = replay();
    assert_eq!(header.pids.len(), 1);
    let http = exchanges(&decoded);
    let lines: Vec<String> = http
        .iter()
        .map(|e| {
            let req = e.request.as_ref().expect("request seen");
            let resp = e.response.as_ref().expect("response seen");
            format!("{} {} {}", req.method, req.path, resp.status)
        })
        .collect();
    let round = [
        "POST /v1/completions 200",
        "POST /v1/chat/completions 200",
        "POST /v1/chat/completions 200",
    ];
    assert_eq!(lines, [round, round].concat());
    assert!(http.iter().all(|e| e.complete));
    let sse: Vec<usize> = http
        .iter()
        .map(|e| e.response.as_ref().map_or(0, |r| r.sse_events.len()))
        .filter(|&n| n > 0)
        .collect();
    assert_eq!(
        sse,
        [10, 10],
        "two streaming chats of 8 tokens: role, 8 deltas, [DONE]"
    );
    assert_eq!(summary.flows.gaps, 0);
    assert_eq!(summary.kernel.ring_full, 0);
}

#[test]
fn long_prompt_add_request_is_decoded_whole_on_both_sides() {
    let (_, decoded, _) = replay();
    let sent = adds(&decoded, true);
    let received = adds(&decoded, false);
    assert!(!sent.is_empty());
    // Sent by the API server and received by EngineCore, byte for byte.
    assert_eq!(sent.len(), received.len());
    for ((api, s), (engine, r)) in sent.iter().zip(&received) {
        assert_ne!(api, engine, "two different processes");
        assert_eq!(s.frames, r.frames);
    }
    // The 1,831-token prompt: vLLM's own usage.prompt_tokens in the HTTP response matches the
    // token ids counted in the decoded ZeroMQ message.
    let usage: Vec<usize> = exchanges(&decoded)
        .iter()
        .filter_map(|e| {
            let body = String::from_utf8_lossy(&e.response.as_ref()?.body).into_owned();
            let at = body.find("\"prompt_tokens\":")? + "\"prompt_tokens\":".len();
            body[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(usage.contains(&1831), "{usage:?}");
    let counts: Vec<usize> = sent
        .iter()
        .map(|(_, m)| prompt_token_count(&m.frames[1]))
        .collect();
    assert!(
        counts.contains(&1831),
        "token counts of the decoded ADDs: {counts:?}"
    );
    let long = sent
        .iter()
        .find(|(_, m)| prompt_token_count(&m.frames[1]) == 1831)
        .unwrap();
    assert!(long.1.frames[1].len() > 4000);
}

/// The workload fixture (tests/fixtures/vllm-0.32.0-workload.md): streaming and non-streaming
/// chat and completions, n=2, a burst beyond --max-num-seqs (queueing, 3 preemptions), chunked
/// prefill, client aborts and invalid requests, recorded with vLLM's own tracing on. Replayed
/// through the whole pipeline, the spans and counters must agree with vLLM's.
#[test]
fn workload_spans_and_metrics_agree_with_vllms_own() {
    use std::{
        io::BufWriter,
        sync::{Arc, Mutex},
    };

    use infertrace::{
        discover::engine::Target,
        engines::vllm::VllmInstance,
        export::jsonl::Jsonl,
        pipeline::{Pipeline, PipelineOptions},
        telemetry::{Clock, SpanOptions, metrics::Registry},
    };
    use infertrace_tests::vllm_truth;

    let out =
        std::env::temp_dir().join(format!("infertrace-workload-{}.jsonl", std::process::id()));
    let file = std::fs::File::create(&out).expect("temp file");
    let (_, summary, pipeline) = session::replay_pipeline(
        &fixture("vllm-0.32.0-workload.rec"),
        |header| {
            Ok(Pipeline::new(
                PipelineOptions {
                    spans: SpanOptions {
                        granularity: 2,
                        capture_content: true,
                        ..SpanOptions::default()
                    },
                    metrics_interval_ns: 10_000_000_000,
                    targets: vec![Target {
                        pid: header.pids[0],
                        engine: None,
                        version: Some("0.32.0+cpu".into()),
                        served_model: None,
                        ..Target::default()
                    }],
                    host: header.host.clone(),
                    profile_output: None,
                },
                Clock::fixed(header.realtime_minus_monotonic_ns),
                Arc::new(Mutex::new(Registry::default())),
                vec![Box::new(Jsonl::new(BufWriter::new(file)))],
            ))
        },
        |_, _| {},
    )
    .expect("replay");
    let pipeline = pipeline.expect("decoded messages");
    let stats = pipeline
        .instances()
        .next()
        .and_then(|i| i.as_any().downcast_ref::<VllmInstance>())
        .expect("a vLLM instance")
        .stats();
    assert_eq!(
        (stats.undecodable, stats.requests_without_add),
        (0, 0),
        "{summary}"
    );
    let read = |name: &str| std::fs::read_to_string(fixture(name)).expect("fixture");
    let report = vllm_truth::compare(
        &out,
        &fixture("vllm-0.32.0-workload.otlp.jsonl"),
        &fixture("vllm-0.32.0-workload.client.json"),
        &read("vllm-0.32.0-workload.metrics-before.txt"),
        &read("vllm-0.32.0-workload.metrics-after.txt"),
    );
    let _ = std::fs::remove_file(&out);
    println!("{}", report.text);
    assert!(
        report.failures.is_empty(),
        "{:#?}\n{}",
        report.failures,
        report.text
    );
}
