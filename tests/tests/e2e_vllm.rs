//! End to end on the real vLLM (CPU build, tiny model; `cargo xtask engine vllm` installs it
//! on first use): vLLM runs with its own OTLP tracing on, `infertrace attach` traces its API
//! server (JSONL output and the Prometheus endpoint), the workload of
//! xtask/scripts/engines/vllm/workload.py runs (streaming and non-streaming chat and
//! completions, n=2, a burst beyond --max-num-seqs with preemptions, chunked prefill, client
//! aborts, invalid requests), and infertrace's spans and counters are compared with vLLM's own
//! spans and /metrics from the same run (tests/src/vllm_truth.rs).
//!
//! Needs root (eBPF) and the network to PyPI the first time. `VLLM_HOME` picks the install.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use infertrace::engines::join::ids_match;
use infertrace_tests::{infertrace_bin, python, vllm_truth};

const PORT: u16 = 18471;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn vllm_home() -> PathBuf {
    std::env::var_os("VLLM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/infertrace-vllm"))
}

fn xtask_engine(args: &[&str], envs: &[(&str, &str)]) {
    let status = Command::new(env!("CARGO"))
        .args(["xtask", "engine", "vllm"])
        .args(args)
        .envs(envs.iter().copied())
        .env("VLLM_HOME", vllm_home())
        .current_dir(repo())
        .status()
        .expect("running cargo xtask engine vllm");
    assert!(status.success(), "cargo xtask engine vllm {args:?} failed");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// POST a JSON body; the response body.
fn post(port: u16, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// Stops what it holds when the test ends, however it ends.
struct Cleanup {
    children: Vec<Child>,
    engine: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.engine {
            let _ = Command::new(env!("CARGO"))
                .args([
                    "xtask",
                    "engine",
                    "vllm",
                    "stop",
                    "--port",
                    &PORT.to_string(),
                ])
                .env("VLLM_HOME", vllm_home())
                .current_dir(repo())
                .status();
        }
    }
}

fn script(name: &str) -> PathBuf {
    repo().join("xtask/scripts/engines/vllm").join(name)
}

/// A fresh vLLM on `PORT` (stopped first, so that nothing is cached from an earlier run);
/// returns the API server's pid.
fn fresh_vllm(cleanup: &mut Cleanup, serve_args: &[&str], envs: &[(&str, &str)]) -> String {
    xtask_engine(&["stop", "--port", &PORT.to_string()], &[]);
    cleanup.engine = true;
    let port = PORT.to_string();
    let mut args = vec!["start", "--port", &port, "--"];
    args.extend_from_slice(serve_args);
    xtask_engine(&args, envs);
    std::fs::read_to_string(vllm_home().join(format!("logs/vllm-{PORT}.pid")))
        .expect("vLLM pid file")
        .trim()
        .to_owned()
}

/// `infertrace attach` writing JSONL to `ours` and serving Prometheus on `prom_port`; returns
/// once it is attached.
fn attach(api_pid: &str, ours: &Path, prom_port: u16) -> Child {
    let agent = Command::new(infertrace_bin())
        .args([
            "attach",
            "--pid",
            api_pid,
            "--metrics-interval",
            "1",
            "--output",
        ])
        .arg(format!("jsonl:{}", ours.display()))
        .args(["--prometheus", &format!("127.0.0.1:{prom_port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting infertrace attach");
    // Attached once the Prometheus endpoint answers (it starts after the programs are loaded).
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", prom_port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "infertrace did not attach in 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    agent
}

/// SIGTERM (which flushes everything); returns the agent's stderr.
fn stop(mut agent: Child) -> String {
    let term = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status();
    assert!(term.is_ok_and(|s| s.success()), "kill -TERM infertrace");
    let mut stderr = String::new();
    agent
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(agent.wait().unwrap().success(), "{stderr}");
    stderr
}

fn workload(client: &Path, extra: &[&str]) {
    let status = Command::new("python3")
        .arg(script("workload.py"))
        .args([
            "--base",
            &format!("http://127.0.0.1:{PORT}"),
            "--model",
            "tiny",
        ])
        .args(["--seed", "0"])
        .args(extra)
        .arg("--out")
        .arg(client)
        .status()
        .expect("running workload.py");
    assert!(status.success(), "workload.py failed");
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infertrace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn vllm_spans_and_metrics_match_vllms_own_tracing() {
    let dir = temp_dir("e2e");
    let (otlp_http, otlp_grpc) = (free_port(), free_port());
    let truth = dir.join("vllm.otlp.jsonl");
    let ours = dir.join("ours.jsonl");
    let client = dir.join("client.json");
    let mut cleanup = Cleanup {
        children: Vec::new(),
        engine: false,
    };
    let receiver = Command::new(python())
        .arg(script("otlp_receiver.py"))
        .arg(&truth)
        .args([otlp_http.to_string(), otlp_grpc.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the OTLP receiver");
    cleanup.children.push(receiver);
    // Settings that queue (4 seqs), chunk prefills (256 tokens) and preempt (18 KV blocks of
    // 128 tokens).
    let otlp = format!("http://127.0.0.1:{otlp_grpc}");
    let api_pid = fresh_vllm(
        &mut cleanup,
        &[
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "256",
            "--otlp-traces-endpoint",
            &otlp,
        ],
        &[("KV_BLOCKS", "18")],
    );
    let prom_port = free_port();
    let agent = attach(&api_pid, &ours, prom_port);
    let before = get(PORT, "/metrics");
    workload(&client, &[]);
    std::thread::sleep(Duration::from_secs(3));
    let after = get(PORT, "/metrics");
    let scraped = get(prom_port, "/metrics");
    for name in [
        "gen_ai_vllm_generation_tokens",
        "genai_llm_usage_tokens",
        "vllm_iter_count",
        "infertrace_captured_syscalls_total",
        "infertrace_lost_records_total",
    ] {
        assert!(
            scraped.contains(&format!("# TYPE {name} counter")),
            "{scraped}"
        );
    }
    let stderr = stop(agent);
    // Give vLLM time to export its last spans (batch processor, 5 s).
    std::thread::sleep(Duration::from_secs(6));

    let report = vllm_truth::compare(&ours, &truth, &client, &before, &after);
    println!(
        "{}\n{}",
        report.text,
        stderr.lines().last().unwrap_or_default()
    );
    assert!(
        report.failures.is_empty(),
        "{:#?}\n{}\n{stderr}",
        report.failures,
        report.text
    );
    drop(cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--disable-log-stats` vLLM sends no QUEUED/SCHEDULED events and no scheduler stats:
/// every `llm_request` says so (`infertrace.engine_events=false`), leaves out queue, prefill and
/// inference, and still carries what was measured (tokens, decode from the engine's step
/// times, time to first token and e2e from the capture).
#[test]
fn vllm_without_log_stats_marks_what_it_could_not_measure() {
    let dir = temp_dir("e2e-nostats");
    let ours = dir.join("ours.jsonl");
    let client = dir.join("client.json");
    let mut cleanup = Cleanup {
        children: Vec::new(),
        engine: false,
    };
    let api_pid = fresh_vllm(&mut cleanup, &["--disable-log-stats"], &[]);
    let agent = attach(&api_pid, &ours, free_port());
    workload(&client, &["--quick"]);
    std::thread::sleep(Duration::from_secs(2));
    let stderr = stop(agent);
    let spans: Vec<serde_json::Value> = vllm_truth::json_lines(&ours)
        .into_iter()
        .filter(|v| v["name"] == "llm_request")
        .collect();
    assert!(
        spans.len() >= 10,
        "{} llm_request spans\n{stderr}",
        spans.len()
    );
    for s in &spans {
        let a = &s["attributes"];
        assert_eq!(a["infertrace.engine_events"], false, "{s}");
        for absent in [
            "gen_ai.latency.time_in_queue",
            "gen_ai.latency.time_in_model_prefill",
            "gen_ai.latency.time_in_model_inference",
        ] {
            assert!(a.get(absent).is_none(), "{absent} in {s}");
        }
        if a["infertrace.finish_reason"] != "abort" {
            for present in [
                "gen_ai.latency.time_to_first_token",
                "gen_ai.latency.e2e",
                "gen_ai.latency.time_in_model_decode",
                "gen_ai.usage.prompt_tokens",
            ] {
                assert!(a.get(present).is_some(), "{present} missing in {s}");
            }
        }
    }
    // Token counts still equal what the client was told, request by request.
    let client: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&client).unwrap()).unwrap();
    let mut checked = 0;
    for r in client["requests"].as_array().unwrap() {
        let (Some(told), Some(ids)) = (
            r["usage"]["completion_tokens"].as_u64(),
            r["ids"].as_array(),
        ) else {
            continue;
        };
        let ours: u64 = spans
            .iter()
            .filter(|s| {
                let id = s["attributes"]["gen_ai.request.id"]
                    .as_str()
                    .unwrap_or_default();
                ids.iter()
                    .any(|c| ids_match(c.as_str().unwrap_or_default(), id))
            })
            .filter_map(|s| s["attributes"]["gen_ai.usage.completion_tokens"].as_u64())
            .sum();
        assert_eq!(ours, told, "completion tokens of {r}");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} requests had usage");
    drop(cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pooling vLLM (the tiny model converted to an embedding model): `/v1/embeddings` and
/// `/score` calls get `embeddings {model}` / `rerank {model}` entry spans with one
/// `llm_request` per input (or pair), and the API's token usage.
#[test]
fn vllm_embeddings_and_rerank() {
    let dir = temp_dir("e2e-pooling");
    let ours = dir.join("ours.jsonl");
    let mut cleanup = Cleanup {
        children: Vec::new(),
        engine: false,
    };
    let api_pid = fresh_vllm(
        &mut cleanup,
        &["--runner", "pooling", "--convert", "embed"],
        &[],
    );
    let agent = attach(&api_pid, &ours, free_port());
    let calls = [
        (
            "/v1/embeddings",
            r#"{"model":"tiny","input":["hello world","the quick brown fox"]}"#,
            2,
        ),
        (
            "/v1/embeddings",
            r#"{"model":"tiny","input":"one more"}"#,
            1,
        ),
        (
            "/score",
            r#"{"model":"tiny","text_1":"a","text_2":["b","c"]}"#,
            2,
        ),
    ];
    let mut answers = Vec::new();
    for (path, body, _) in calls {
        let answer: serde_json::Value =
            serde_json::from_str(&post(PORT, path, body)).unwrap_or_else(|e| panic!("{path}: {e}"));
        answers.push(answer);
    }
    std::thread::sleep(Duration::from_secs(2));
    let stderr = stop(agent);
    let spans: Vec<serde_json::Value> = vllm_truth::json_lines(&ours)
        .into_iter()
        .filter(|v| v["type"] == "span")
        .collect();
    for ((path, _, inputs), answer) in calls.iter().zip(&answers) {
        let id = answer["id"].as_str().expect("response id");
        let entry = spans
            .iter()
            .find(|s| s["attributes"]["gen_ai.response.id"] == id)
            .unwrap_or_else(|| panic!("no entry span for {path} {id}\n{stderr}"));
        let (name, kind, op) = if path.contains("embeddings") {
            ("embeddings tiny", "EMBEDDING", "embeddings")
        } else {
            ("rerank tiny", "RERANKER", "rerank")
        };
        assert_eq!(entry["name"], name);
        assert_eq!(entry["attributes"]["gen_ai.span.kind"], kind);
        assert_eq!(entry["attributes"]["gen_ai.operation.name"], op);
        assert_eq!(
            entry["attributes"]["gen_ai.usage.input_tokens"], answer["usage"]["prompt_tokens"],
            "{path}"
        );
        let children: Vec<&serde_json::Value> = spans
            .iter()
            .filter(|s| s["name"] == "llm_request" && s["parent_span_id"] == entry["span_id"])
            .collect();
        assert!(
            children.len() >= *inputs,
            "{path}: {} llm_request",
            children.len()
        );
        assert!(
            children
                .iter()
                .all(|c| c["attributes"]["gen_ai.usage.prompt_tokens"].as_u64() > Some(0))
        );
    }
    drop(cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}
