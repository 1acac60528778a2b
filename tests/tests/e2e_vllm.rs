//! End to end on the real vLLM (CPU build, tiny model; `cargo xtask engine vllm` installs it
//! on first use): vLLM runs with its own OTLP tracing on, `infertrace attach` traces its API
//! server (JSONL output and the Prometheus endpoint), four rounds of the workload of
//! xtask/scripts/engines/vllm/workload.py runs (streaming and non-streaming chat and
//! completions, n=2, a burst beyond --max-num-seqs with preemptions, chunked prefill, client
//! aborts, invalid requests), and infertrace's spans and counters are compared with vLLM's own
//! spans and /metrics from the same run (tests/src/vllm_truth.rs).
//!
//! Needs root (eBPF) and the network to PyPI the first time. `VLLM_HOME` picks the install.
use std::{path::Path, time::Duration};

use infertrace::engines::common::join::ids_match;
use infertrace_tests::{
    live::{
        self, Cleanup, EngineKind, attach, free_port, get, otlp_receiver, post, profile_of,
        sampled_stacks, stop, temp_dir, thread_roles,
    },
    vllm_truth,
};

const PORT: u16 = 18471;
/// Workload rounds in the comparison with vLLM's tracing: 4 x 25 engine requests, so that the
/// p99 checks read 100 values. Below that the nearest-rank p99 is the largest value, and one
/// request whose loop the 2-core machine held off the CPU (or ran other requests' callbacks
/// before vLLM's stamp) decides it.
const ROUNDS: u32 = 4;
/// Requests each round releases at once (workload.py --crowd): six times the engine's
/// `--max-num-seqs` 4, so that the API server is busy with arrivals while the first outputs
/// come back and most of them queue.
const CROWD: &str = "24";

/// A fresh vLLM on `PORT`; returns the API server's pid.
fn fresh_vllm(cleanup: &mut Cleanup, serve_args: &[&str], envs: &[(&str, &str)]) -> String {
    cleanup.fresh_engine(EngineKind::Vllm, PORT, serve_args, envs)
}

fn workload(client: &Path, extra: &[&str]) {
    live::workload(PORT, client, extra);
}

#[test]
fn vllm_spans_and_metrics_match_vllms_own_tracing() {
    let dir = temp_dir("e2e");
    let truth = dir.join("vllm.otlp.jsonl");
    let ours = dir.join("ours.jsonl");
    let client = dir.join("client.json");
    let mut cleanup = Cleanup::default();
    let receiver = otlp_receiver(&mut cleanup, &truth);
    let api_pid = live::start_compared_vllm(&mut cleanup, PORT, &receiver);
    let prom_port = free_port();
    let agent = attach(&api_pid, &ours, prom_port);
    let before = get(PORT, "/metrics");
    let rounds: Vec<_> = (0..ROUNDS)
        .map(|round| {
            let part = dir.join(format!("client-{round}.json"));
            workload(&part, &["--crowd", CROWD, "--seed", &round.to_string()]);
            part
        })
        .collect();
    live::merge_client_records(&rounds, &client);
    // The client's aborted requests run on in the engine until it notices.
    live::wait_until_idle(PORT, &live::VLLM_BUSY);
    live::wait_until_traced(
        &agent,
        PORT,
        "gen_ai_vllm_request_success",
        "vllm:request_success_total",
    );
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
    // vLLM's batch span processor exports every 5 s.
    let spans = live::count_llm_requests_vllm_exports(&ours);
    receiver.wait_for_spans("llm_request", spans, Duration::from_secs(30));

    receiver.write_out();
    let report = vllm_truth::compare(&ours, &truth, &client, &before, &after);
    report.print_and_check("", &stderr);
    engine_python_stacks_were_sampled(&ours);
    drop(cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Python profile of the same run shows the engine's structure: the EngineCore process's
/// busy loop on its main thread (named `VLLM::EngineCore` by vLLM, cut to 15 bytes, and known
/// by that loop), the model's forward pass (in the worker process), and the API server's
/// uvloop event loop on its main thread.
fn engine_python_stacks_were_sampled(ours: &Path) {
    let busy_loop = sampled_stacks(
        ours,
        Some("VLLM::EngineCor [vLLM EngineCore busy loop]"),
        "EngineCoreProc.run_busy_loop",
    );
    let forward = sampled_stacks(ours, None, "LlamaForCausalLM.forward");
    let roles = thread_roles(ours);
    println!(
        "Python profile: {busy_loop} stacks in the EngineCore busy loop, {forward} in the model's \
         forward; threads known by their role: {roles:?}"
    );
    assert!(
        busy_loop > 0 && forward > 0 && roles.iter().any(|r| r.ends_with("[uvloop event loop]")),
        "{}",
        std::fs::read_to_string(profile_of(ours)).unwrap_or_default()
    );
}

/// At granularity 2 every PREFILL and DECODE event says how often the sampler found the
/// engine's threads running in that iteration, and in which phase: over a run, the worker's
/// forward passes show as model execution.
#[test]
fn vllm_iteration_events_carry_the_engines_python_samples() {
    let dir = temp_dir("e2e-iterations");
    let ours = dir.join("ours.jsonl");
    let client = dir.join("client.json");
    let mut cleanup = Cleanup::default();
    let api_pid = fresh_vllm(&mut cleanup, &[], &[]);
    let agent = live::attach_with(&api_pid, &ours, free_port(), &["--granularity", "2"]);
    workload(&client, &["--quick"]);
    live::wait_until_settled(&agent);
    let stderr = stop(agent);
    let (iterations, samples) = live::iteration_samples(&ours);
    println!("iteration events with samples: {iterations}, {samples:?}");
    let total = |key: &str| samples.get(key).copied().unwrap_or(0);
    assert!(
        iterations > 0 && total("infertrace.python.samples.model_execution") > 0,
        "{iterations} iterations with samples, {samples:?}\n{stderr}"
    );
    // Each iteration's kinds add up to its count.
    let kinds: u64 = samples
        .iter()
        .filter(|(k, _)| k.starts_with("infertrace.python.samples."))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(kinds, total("infertrace.python.samples"), "{samples:?}");
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
    let mut cleanup = Cleanup::default();
    let api_pid = fresh_vllm(&mut cleanup, &["--disable-log-stats"], &[]);
    let agent = attach(&api_pid, &ours, free_port());
    workload(&client, &["--quick"]);
    live::wait_until_settled(&agent);
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
    let mut cleanup = Cleanup::default();
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
    live::wait_until_settled(&agent);
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
