//! One agent, several servers: a single `infertrace attach --pid A --pid B` on a real vLLM and
//! a real SGLang at once, and on two real vLLM servers at once (two instances of one kind,
//! serving the same model name). Each server runs with its own tracing to its own receiver;
//! the agent's output is split by the engine instance each line carries
//! (`service.instance.id`), and each server's part is compared with that server's own tracing
//! and `/metrics` exactly as the single-engine tests compare them (tests/src/vllm_truth.rs,
//! tests/src/sglang_truth.rs), with the same bounds. The workloads take turns, round by round,
//! so that the agent follows both servers through the whole run.
//!
//! Needs root (eBPF) and both engines (installed on first use, like the single-engine tests).
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use infertrace_tests::{
    live::{
        self, Agent, Cleanup, OtlpReceiver, attach_to, count_spans, free_port, get, only_instance,
        otlp_receiver, stop, temp_dir, wait_until_idle, wait_until_settled,
    },
    sglang_truth, vllm_truth,
};

const VLLM_PORT: u16 = 18475;
const SECOND_VLLM_PORT: u16 = 18477;
const SGLANG_PORT: u16 = 18479;
/// Rounds of each server's workload, as in the single-engine tests: the p99 checks read over
/// 100 values for vLLM, over 200 for SGLang.
const VLLM_ROUNDS: u32 = 4;
const SGLANG_ROUNDS: u32 = 10;
/// How long an engine may take to export its last spans (its span processors send every
/// 500 ms, SGLang, and 5 s, vLLM).
const EXPORT_WAIT: Duration = Duration::from_secs(30);

/// One server of the run: its port, its own tracing's receiver and what its client sent.
struct Server {
    port: u16,
    /// The gauges of its /metrics that say a request is still in the engine.
    busy: [&'static str; 2],
    pid: String,
    receiver: OtlpReceiver,
    truth: PathBuf,
    client_parts: Vec<PathBuf>,
    before: String,
}

/// A vLLM set up as in e2e_vllm, with its own tracing on.
fn start_vllm(cleanup: &mut Cleanup, dir: &Path, port: u16) -> Server {
    let truth = dir.join(format!("vllm-{port}.otlp.jsonl"));
    let receiver = otlp_receiver(cleanup, &truth);
    let pid = live::start_compared_vllm(cleanup, port, &receiver);
    Server {
        port,
        busy: live::VLLM_BUSY,
        pid,
        receiver,
        truth,
        client_parts: Vec::new(),
        before: String::new(),
    }
}

/// An SGLang with its own tracing (level 3) and metrics on, chunking prefills over 256 tokens,
/// as in e2e_sglang's pickle run.
fn start_sglang(cleanup: &mut Cleanup, dir: &Path) -> Server {
    let truth = dir.join("sglang.otlp.jsonl");
    let receiver = otlp_receiver(cleanup, &truth);
    let mut args = live::SGLANG_COMPARED_ARGS.to_vec();
    args.extend_from_slice(&["--chunked-prefill-size", "256"]);
    let pid = live::start_traced_sglang(cleanup, SGLANG_PORT, &receiver, &args, &[]);
    Server {
        port: SGLANG_PORT,
        busy: live::SGLANG_BUSY,
        pid,
        receiver,
        truth,
        client_parts: Vec::new(),
        before: String::new(),
    }
}

/// `infertrace attach` on every server, each server's /metrics read once it is attached.
fn attach_all(servers: &mut [&mut Server], ours: &Path) -> Agent {
    let pids: Vec<&str> = servers.iter().map(|s| s.pid.as_str()).collect();
    let agent = attach_to(&pids, ours, free_port(), &[]);
    for server in servers.iter_mut() {
        server.before = get(server.port, "/metrics");
    }
    agent
}

/// Stop the agent once every server has nothing running or queued (the client's aborted
/// requests run on in the engine until it notices), and check that every span line is of one
/// of them; the agent's stderr.
fn stop_when_idle(agent: Agent, ours: &Path, servers: &[&Server]) -> String {
    for server in servers {
        wait_until_idle(server.port, &server.busy);
    }
    wait_until_settled(&agent);
    let stderr = stop(agent);
    every_line_has_its_server(ours, servers, &stderr);
    stderr
}

/// One round of vLLM's workload (e2e_vllm's).
fn vllm_round(server: &mut Server, dir: &Path, round: u32) {
    let part = dir.join(format!("client-{}-{round}.json", server.port));
    live::workload(server.port, &part, &["--seed", &round.to_string()]);
    server.client_parts.push(part);
}

/// One round of SGLang's workload (e2e_sglang's).
fn sglang_round(server: &mut Server, dir: &Path, round: u32) {
    let part = dir.join(format!("client-{}-{round}.json", server.port));
    live::workload(
        server.port,
        &part,
        &[
            "--quick",
            "--long-tokens",
            "450",
            "--seed",
            &round.to_string(),
        ],
    );
    server.client_parts.push(part);
}

/// The agent's lines of `server`, compared with vLLM's own tracing and /metrics.
fn check_vllm(server: &Server, ours: &Path, dir: &Path, stderr: &str) {
    let mine = dir.join(format!("ours-{}.jsonl", server.pid));
    only_instance(ours, &server.pid, &mine);
    let client = dir.join(format!("client-{}.json", server.port));
    live::merge_client_records(&server.client_parts, &client);
    let after = get(server.port, "/metrics");
    let ours_spans = live::count_llm_requests_vllm_exports(&mine);
    server
        .receiver
        .wait_for_spans("llm_request", ours_spans, EXPORT_WAIT);
    server.receiver.write_out();
    let report = vllm_truth::compare(&mine, &server.truth, &client, &server.before, &after);
    report.print_and_check(&format!("vLLM on port {}:\n", server.port), stderr);
}

/// The agent's lines of `server`, compared with SGLang's own tracing and /metrics.
fn check_sglang(server: &Server, ours: &Path, dir: &Path, stderr: &str) {
    let mine = dir.join(format!("ours-{}.jsonl", server.pid));
    only_instance(ours, &server.pid, &mine);
    let after = get(server.port, "/metrics");
    let ours_spans = count_spans(&mine, " Req ");
    server
        .receiver
        .wait_for_spans(" Req ", ours_spans, EXPORT_WAIT);
    server.receiver.write_out();
    let bounds = sglang_truth::ONE_SCHEDULER.with_clock_of(stderr);
    let report = sglang_truth::compare_run(&mine, &server.truth, bounds, &server.before, &after);
    report.print_and_check("SGLang:\n", stderr);
}

/// Every span line of the run carries one of the servers' identity, and no message was left
/// without a server.
fn every_line_has_its_server(ours: &Path, servers: &[&Server], stderr: &str) {
    let text = std::fs::read_to_string(ours).expect("the agent's JSONL");
    let mut per_server = vec![0usize; servers.len()];
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        if value["type"] != "span" {
            continue;
        }
        let id = value["resource"]["service.instance.id"]
            .as_str()
            .unwrap_or_else(|| panic!("a span without its server: {line}"));
        let pid = id.rsplit(':').next();
        let i = servers
            .iter()
            .position(|s| Some(s.pid.as_str()) == pid)
            .unwrap_or_else(|| panic!("a span of no traced server: {id}"));
        per_server[i] += 1;
    }
    println!("spans per server: {per_server:?}");
    assert!(per_server.iter().all(|&n| n > 0), "{per_server:?}");
    assert!(
        !stderr.contains("outside every traced server"),
        "messages left without a server:\n{stderr}"
    );
}

#[test]
fn one_agent_traces_a_vllm_and_an_sglang_server_at_once() {
    let dir = temp_dir("e2e-multi-kinds");
    let ours = dir.join("ours.jsonl");
    let mut cleanup = Cleanup::default();
    let mut vllm = start_vllm(&mut cleanup, &dir, VLLM_PORT);
    let mut sglang = start_sglang(&mut cleanup, &dir);
    let agent = attach_all(&mut [&mut vllm, &mut sglang], &ours);
    for round in 0..SGLANG_ROUNDS {
        if round < VLLM_ROUNDS {
            vllm_round(&mut vllm, &dir, round);
        }
        sglang_round(&mut sglang, &dir, round);
    }
    let stderr = stop_when_idle(agent, &ours, &[&vllm, &sglang]);
    check_vllm(&vllm, &ours, &dir, &stderr);
    check_sglang(&sglang, &ours, &dir, &stderr);
    drop(cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_agent_traces_two_vllm_servers_apart() {
    let dir = temp_dir("e2e-multi-vllm");
    let ours = dir.join("ours.jsonl");
    let mut cleanup = Cleanup::default();
    let mut first = start_vllm(&mut cleanup, &dir, VLLM_PORT);
    let mut second = start_vllm(&mut cleanup, &dir, SECOND_VLLM_PORT);
    let agent = attach_all(&mut [&mut first, &mut second], &ours);
    for round in 0..VLLM_ROUNDS {
        vllm_round(&mut first, &dir, round);
        vllm_round(&mut second, &dir, round);
    }
    let stderr = stop_when_idle(agent, &ours, &[&first, &second]);
    // Same model, same engine index: the two servers' series stay apart by their identity.
    let snapshots = vllm_truth::json_lines(&ours);
    let last = vllm_truth::last_metrics(&snapshots);
    let success: Vec<&serde_json::Value> = last["samples"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["name"] == "gen_ai_vllm_request_success")
        .collect();
    let ids: std::collections::BTreeSet<&str> = success
        .iter()
        .filter_map(|s| s["resource"]["service.instance.id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{success:#?}");
    check_vllm(&first, &ours, &dir, &stderr);
    check_vllm(&second, &ours, &dir, &stderr);
    drop(cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}
