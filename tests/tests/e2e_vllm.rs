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

#[test]
fn vllm_spans_and_metrics_match_vllms_own_tracing() {
    let dir = std::env::temp_dir().join(format!("infertrace-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (otlp_http, otlp_grpc) = (free_port(), free_port());
    let truth = dir.join("vllm.otlp.jsonl");
    let ours = dir.join("ours.jsonl");
    let client = dir.join("client.json");
    let mut cleanup = Cleanup {
        children: Vec::new(),
        engine: false,
    };

    // vLLM, with settings that queue (4 seqs), chunk prefills (256 tokens) and preempt (18 KV
    // blocks of 128 tokens), fresh so that nothing is cached from an earlier run.
    xtask_engine(&["stop", "--port", &PORT.to_string()], &[]);
    cleanup.engine = true;
    let script = |name: &str| repo().join("xtask/scripts/engines/vllm").join(name);
    let receiver = Command::new(python())
        .arg(script("otlp_receiver.py"))
        .arg(&truth)
        .args([otlp_http.to_string(), otlp_grpc.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the OTLP receiver");
    cleanup.children.push(receiver);
    xtask_engine(
        &[
            "start",
            "--port",
            &PORT.to_string(),
            "--",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "256",
            "--otlp-traces-endpoint",
            &format!("http://127.0.0.1:{otlp_grpc}"),
        ],
        &[("KV_BLOCKS", "18")],
    );
    let api_pid = std::fs::read_to_string(vllm_home().join(format!("logs/vllm-{PORT}.pid")))
        .expect("vLLM pid file")
        .trim()
        .to_owned();

    let prom_port = free_port();
    let agent = Command::new(infertrace_bin())
        .args([
            "attach",
            "--pid",
            &api_pid,
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
    cleanup.children.push(agent);
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

    let before = get(PORT, "/metrics");
    let workload = Command::new("python3")
        .arg(script("workload.py"))
        .args([
            "--base",
            &format!("http://127.0.0.1:{PORT}"),
            "--model",
            "tiny",
            "--seed",
            "0",
        ])
        .arg("--out")
        .arg(&client)
        .status()
        .expect("running workload.py");
    assert!(workload.success(), "workload.py failed");
    std::thread::sleep(Duration::from_secs(3));
    let after = get(PORT, "/metrics");
    let scraped = get(prom_port, "/metrics");
    for name in [
        "gen_ai_vllm_generation_tokens",
        "genai_llm_usage_tokens",
        "vllm_iter_count",
    ] {
        assert!(
            scraped.contains(&format!("# TYPE {name} counter")),
            "{scraped}"
        );
    }

    // Stop the agent (SIGTERM flushes everything) and give vLLM time to export its spans.
    let mut agent = cleanup.children.pop().expect("agent");
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
