//! `cargo xtask bench-vllm` / `bench-sglang`: what attaching infertrace costs a real engine
//! (BENCHMARKS.md).
//!
//! The tiny engine (prefix caching off, so that repeated prompts cost the same every time)
//! serves its own serving benchmark (`vllm bench serve`, `python -m sglang.bench_serving`:
//! random prompts of 256 tokens, 64 output tokens, the same seed for both configurations of a
//! pair) several times, alternating between no agent and `infertrace attach` (which goes first
//! alternates too; outputs off, `--output none`, so that capture, decoding and span building
//! are measured). Reported: output tokens/s and TTFT (mean, median) per run, the median ratio
//! traced/untraced, and the agent's CPU time and peak RSS per traced run (from its own
//! summary line).
use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{bench::number_before, engine::Engine, root, run};

pub struct BenchOptions {
    /// Runs per configuration (alternating).
    pub runs: usize,
    pub num_prompts: u32,
}

struct RunResult {
    output_tokens_per_s: f64,
    mean_ttft_ms: f64,
    median_ttft_ms: f64,
}

/// The engine under test, on its benchmark port.
struct Bench {
    engine: Engine,
    home: PathBuf,
    port: u16,
}

pub fn bench(engine: Engine, options: &BenchOptions) -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let agent = root.join("target/release/infertrace");
    let bench = Bench {
        engine,
        home: engine.home(),
        port: match engine {
            Engine::Vllm => 18472,
            Engine::Sglang => 18474,
        },
    };
    engine.stop(&bench.home, bench.port)?;
    // Both configurations send the same prompts (same seed): without prefix caching, so that
    // the second run of a pair does not find the first one's prompts cached.
    let no_prefix_cache = match engine {
        Engine::Vllm => "--no-enable-prefix-caching",
        Engine::Sglang => "--disable-radix-cache",
    };
    let pid = engine.start(
        &root,
        &bench.home,
        bench.port,
        &[no_prefix_cache.to_owned()],
    )?;
    let result = measure(&agent, &bench, pid, options);
    engine.stop(&bench.home, bench.port)?;
    result
}

fn measure(agent: &Path, bench: &Bench, pid: u32, options: &BenchOptions) -> anyhow::Result<()> {
    // One unmeasured run: the first requests after start-up compile and warm caches.
    bench.serve(options.num_prompts, 1)?;
    let (mut without, mut with, mut usage) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..options.runs {
        // Alternate which configuration goes first, so that drift does not favour one.
        let traced_first = i % 2 == 1;
        if !traced_first {
            without.push(bench.serve(options.num_prompts, i as u64)?);
        }
        let mut child = Command::new(agent)
            .args(["attach", "--pid", &pid.to_string(), "--output", "none"])
            .env("INFERTRACE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting infertrace")?;
        thread::sleep(Duration::from_secs(2));
        with.push(bench.serve(options.num_prompts, i as u64)?);
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
            without.push(bench.serve(options.num_prompts, i as u64)?);
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

impl Bench {
    /// One run of the engine's serving benchmark against the tiny model: its result.
    fn serve(&self, num_prompts: u32, seed: u64) -> anyhow::Result<RunResult> {
        let dir = std::env::temp_dir().join("infertrace-bench");
        std::fs::create_dir_all(&dir)?;
        let file = dir.join(format!("run-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&file);
        let base_url = format!("http://127.0.0.1:{}", self.port);
        let (prompts, seed) = (num_prompts.to_string(), seed.to_string());
        let mut command = match self.engine {
            Engine::Vllm => {
                let mut c = Command::new(self.home.join("venv/bin/vllm"));
                c.args(["bench", "serve", "--backend", "vllm", "--ignore-eos"])
                    .args(["--save-result", "--result-dir"])
                    .arg(&dir)
                    .arg("--result-filename")
                    .arg(file.file_name().context("result file name")?);
                c
            }
            Engine::Sglang => {
                // Fixed lengths like vLLM's (range ratio 1); its random prompts are token ids,
                // not ShareGPT samples (no download).
                let mut c = Command::new(self.home.join("venv/bin/python"));
                c.args(["-m", "sglang.bench_serving", "--backend", "sglang-oai"])
                    .args(["--random-range-ratio", "1", "--output-file"])
                    .arg(&file);
                c
            }
        };
        let dataset = match self.engine {
            Engine::Vllm => "random",
            Engine::Sglang => "random-ids",
        };
        let status = command
            .args(["--model", "tiny", "--tokenizer"])
            .arg(self.home.join("tiny-llama"))
            .args(["--base-url", &base_url, "--dataset-name", dataset])
            .args(["--random-input-len", "256", "--random-output-len", "64"])
            .args(["--num-prompts", &prompts, "--seed", &seed, "--disable-tqdm"])
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("running {}'s serving benchmark", self.engine.title()))?;
        if !status.success() {
            bail!(
                "{}'s serving benchmark failed ({status})",
                self.engine.title()
            );
        }
        // vLLM writes one JSON object, SGLang appends a JSON line per run, with Python's
        // non-JSON `Infinity` for an unlimited request rate.
        let text = std::fs::read_to_string(&file)?
            .replace(": Infinity", ": null")
            .replace(": NaN", ": null");
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let json: serde_json::Value = serde_json::from_str(last)
            .or_else(|_| serde_json::from_str(&text))
            .context("reading the benchmark's result")?;
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
}
