//! `cargo xtask bench-vllm`: what attaching infertrace costs a real vLLM (BENCHMARKS.md).
//!
//! The tiny vLLM (prefix caching off, so that repeated prompts cost the same every time) serves
//! `vllm bench serve` (random dataset, the same seed for both configurations of a pair) several
//! times, alternating between no agent and `infertrace attach` (which goes first alternates too;
//! outputs off, `--output none`, so that capture, decoding and span building are measured). Reported: output tokens/s
//! and TTFT (mean, median) per run, the median ratio traced/untraced, and the agent's CPU time
//! and peak RSS per traced run (from its own summary line).
use std::{
    io::Read,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{bench::number_before, engine::Engine, root, run};

const PORT: u16 = 18472;

pub struct BenchVllmOptions {
    /// Runs per configuration (alternating).
    pub runs: usize,
    pub num_prompts: u32,
}

struct RunResult {
    output_tokens_per_s: f64,
    mean_ttft_ms: f64,
    median_ttft_ms: f64,
}

pub fn bench_vllm(options: &BenchVllmOptions) -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let agent = root.join("target/release/infertrace");
    let home = Engine::Vllm.home();
    Engine::Vllm.stop(&home, PORT)?;
    // Both configurations send the same prompts (same seed): without prefix caching, so that
    // the second run of a pair does not find the first one's prompts cached.
    let pid = Engine::Vllm.start(
        &root,
        &home,
        PORT,
        &["--no-enable-prefix-caching".to_owned()],
    )?;
    let result = measure(&agent, &home, pid, options);
    Engine::Vllm.stop(&home, PORT)?;
    result
}

fn measure(agent: &Path, home: &Path, pid: u32, options: &BenchVllmOptions) -> anyhow::Result<()> {
    // One unmeasured run: the first requests after start-up compile and warm caches.
    bench_serve(home, options.num_prompts, 1)?;
    let (mut without, mut with, mut usage) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..options.runs {
        // Alternate which configuration goes first, so that drift does not favour one.
        let traced_first = i % 2 == 1;
        if !traced_first {
            without.push(bench_serve(home, options.num_prompts, i as u64)?);
        }
        let mut child = Command::new(agent)
            .args(["attach", "--pid", &pid.to_string(), "--output", "none"])
            .env("INFERTRACE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting infertrace")?;
        thread::sleep(Duration::from_secs(2));
        with.push(bench_serve(home, options.num_prompts, i as u64)?);
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let mut summary = String::new();
        child
            .stderr
            .take()
            .context("agent stderr")?
            .read_to_string(&mut summary)?;
        if !child.wait()?.success() {
            bail!("infertrace failed: {summary}");
        }
        if traced_first {
            without.push(bench_serve(home, options.num_prompts, i as u64)?);
        }
        let cpu = number_before(&summary, " s of CPU").unwrap_or(f64::NAN);
        let rss = number_before(&summary, " KiB").unwrap_or(f64::NAN);
        let traced = number_before(&summary, " requests traced").unwrap_or(f64::NAN);
        usage.push((cpu, rss, traced));
        println!(
            "run {}: without {:.1} tok/s ttft mean {:.2} ms | with {:.1} tok/s ttft mean {:.2} \
             ms; agent {cpu:.2} s CPU, peak RSS {rss:.0} KiB, {traced:.0} requests traced",
            i + 1,
            without[i].output_tokens_per_s,
            without[i].mean_ttft_ms,
            with[i].output_tokens_per_s,
            with[i].mean_ttft_ms
        );
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let pick = |runs: &[RunResult], f: fn(&RunResult) -> f64| runs.iter().map(f).collect();
    let ratio = |f: fn(&RunResult) -> f64| -> f64 {
        let mut r: Vec<f64> = with
            .iter()
            .zip(&without)
            .map(|(w, o)| f(w) / f(o))
            .collect();
        med(&mut r)
    };
    println!(
        "\nmedians over {} alternating runs of {} prompts (random 256 in / 64 out, seed = run):",
        options.runs, options.num_prompts
    );
    println!(
        "output tokens/s: without {:.1}, with {:.1}; median ratio with/without {:.4}",
        med(&mut pick(&without, |r| r.output_tokens_per_s)),
        med(&mut pick(&with, |r| r.output_tokens_per_s)),
        ratio(|r| r.output_tokens_per_s)
    );
    println!(
        "TTFT mean: without {:.2} ms, with {:.2} ms; median ratio {:.4}",
        med(&mut pick(&without, |r| r.mean_ttft_ms)),
        med(&mut pick(&with, |r| r.mean_ttft_ms)),
        ratio(|r| r.mean_ttft_ms)
    );
    println!(
        "TTFT median: without {:.2} ms, with {:.2} ms; median ratio {:.4}",
        med(&mut pick(&without, |r| r.median_ttft_ms)),
        med(&mut pick(&with, |r| r.median_ttft_ms)),
        ratio(|r| r.median_ttft_ms)
    );
    let mut cpu: Vec<f64> = usage.iter().map(|u| u.0).collect();
    let mut rss: Vec<f64> = usage.iter().map(|u| u.1).collect();
    println!(
        "agent per traced run: median {:.2} s CPU, peak RSS median {:.0} KiB",
        med(&mut cpu),
        med(&mut rss)
    );
    Ok(())
}

/// One `vllm bench serve` run against the tiny model; its saved JSON result.
fn bench_serve(home: &Path, num_prompts: u32, seed: u64) -> anyhow::Result<RunResult> {
    let dir = std::env::temp_dir().join("infertrace-bench-vllm");
    std::fs::create_dir_all(&dir)?;
    let file = format!("run-{}.json", std::process::id());
    let status = Command::new(home.join("venv/bin/vllm"))
        .args([
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--model",
            "tiny",
            "--tokenizer",
        ])
        .arg(home.join("tiny-llama"))
        .args(["--base-url", &format!("http://127.0.0.1:{PORT}")])
        .args(["--dataset-name", "random", "--random-input-len", "256"])
        .args([
            "--random-output-len",
            "64",
            "--ignore-eos",
            "--disable-tqdm",
        ])
        .args([
            "--num-prompts",
            &num_prompts.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .args(["--save-result", "--result-dir"])
        .arg(&dir)
        .args(["--result-filename", &file])
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdout(Stdio::null())
        .status()
        .context("running vllm bench serve")?;
    if !status.success() {
        bail!("vllm bench serve failed ({status})");
    }
    let text = std::fs::read_to_string(dir.join(&file))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let get = |key: &str| {
        json[key]
            .as_f64()
            .with_context(|| format!("{key} missing from the bench result"))
    };
    Ok(RunResult {
        output_tokens_per_s: get("output_throughput")?,
        mean_ttft_ms: get("mean_ttft_ms")?,
        median_ttft_ms: get("median_ttft_ms")?,
    })
}
