//! `cargo xtask bench-overhead` (both engines), `bench-vllm` / `bench-sglang` (one): what
//! attaching infertrace costs a real engine (BENCHMARKS.md).
//!
//! The tiny engine (prefix caching off, so that repeated prompts cost the same every time)
//! serves its own serving benchmark (`vllm bench serve`, `python -m sglang.bench_serving`:
//! random prompts of 256 tokens, 64 streamed output tokens, the same seed for both
//! configurations of a pair) several times, alternating between no agent and `infertrace
//! attach` with default settings (which goes first alternates too; `--output none`, so that
//! capture, decoding and span building are measured, not printing). Reported per engine: the
//! median and spread of the per-pair ratios (traced / untraced) of output throughput, mean
//! TTFT and the API server's own CPU during the load (where the kernel programs' cost lands),
//! and of the traced runs: the agent's CPU per request during the load (attach excluded),
//! its peak RSS and the records per request (from its summary line).
//!
//! The load is the benchmark's own duration. The measured window also holds the client's
//! start and end (Python imports and tokenizer loading: some 13 s for SGLang's client, whose
//! 256 requests take 14-15 s here), when the attached agent runs at its idle rate
//! (timers, Python sampling), measured for a few seconds before each traced run: that rate
//! over the part of the window outside the benchmark is not counted (`load_cpu_seconds`).
use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    bench::number_before,
    engine::{Engine, stat_fields},
    root, run,
};

pub struct BenchOptions {
    /// Runs per configuration (alternating).
    pub runs: usize,
    pub num_prompts: u32,
}

struct RunResult {
    /// The benchmark's own duration (its first request to its last response), seconds.
    duration_s: f64,
    /// The measured window (the client's start to its exit), seconds.
    window_s: f64,
    output_tokens_per_s: f64,
    mean_ttft_ms: f64,
    median_ttft_ms: f64,
    /// The API server's CPU seconds during the run.
    server_cpu_s: f64,
}

/// What the agent used during one traced run.
struct AgentUsage {
    /// CPU seconds during the load (`load_cpu_seconds`).
    load_cpu_s: f64,
    /// CPU seconds over the whole window (the client's start to its exit).
    window_cpu_s: f64,
    /// CPU seconds a second while attached to the idle engine.
    idle_cpu_per_s: f64,
    peak_rss_kib: f64,
    records: f64,
    requests: f64,
}

/// The engine under test, on its benchmark port.
struct Bench {
    engine: Engine,
    home: PathBuf,
    port: u16,
    /// The API server's pid.
    pid: u32,
}

/// One engine's figures, for the closing table.
pub struct Figures {
    engine: Engine,
    throughput: Spread,
    mean_ttft: Spread,
    server_cpu: Spread,
    agent_ms_per_request: Spread,
    /// Over the whole window, as rounds before the eighteenth measured it.
    agent_window_ms_per_request: Spread,
    peak_rss_mib: f64,
    records_per_request: f64,
}

/// Median, least and greatest of a series.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Spread {
            median: values.get(values.len() / 2).copied().unwrap_or(f64::NAN),
            min: values.first().copied().unwrap_or(f64::NAN),
            max: values.last().copied().unwrap_or(f64::NAN),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} [{:.3}-{:.3}]", self.median, self.min, self.max)
    }
}

/// `cargo xtask bench-overhead`: every engine in turn, then one line per engine.
pub fn bench_overhead(engines: &[Engine], options: &BenchOptions) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for &engine in engines {
        all.push(bench(engine, options)?);
    }
    println!(
        "\nper engine ({} alternating pairs of {} streamed requests, 256 tokens in / 64 out; \
         ratios traced/untraced: median [min-max] of the pairs):",
        options.runs, options.num_prompts
    );
    for f in &all {
        println!(
            "{}: throughput {}, mean TTFT {}, API server CPU {}; agent {} ms CPU per request \
             during the load ({} over the window), peak RSS {:.1} MiB, {:.1} records per request",
            f.engine.title(),
            f.throughput,
            f.mean_ttft,
            f.server_cpu,
            f.agent_ms_per_request,
            f.agent_window_ms_per_request,
            f.peak_rss_mib,
            f.records_per_request
        );
    }
    Ok(())
}

pub fn bench(engine: Engine, options: &BenchOptions) -> anyhow::Result<Figures> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let agent = root.join("target/release/infertrace");
    let home = engine.home();
    let port = match engine {
        Engine::Vllm => 18472,
        Engine::Sglang => 18474,
    };
    engine.stop(&home, port)?;
    // Both configurations send the same prompts (same seed): without prefix caching, so that
    // the second run of a pair does not find the first one's prompts cached.
    let no_prefix_cache = match engine {
        Engine::Vllm => "--no-enable-prefix-caching",
        Engine::Sglang => "--disable-radix-cache",
    };
    let pid = engine.start(&root, &home, port, &[no_prefix_cache.to_owned()])?;
    let bench = Bench {
        engine,
        home,
        port,
        pid,
    };
    let result = measure(&agent, &bench, options);
    engine.stop(&bench.home, bench.port)?;
    result
}

fn measure(agent: &Path, bench: &Bench, options: &BenchOptions) -> anyhow::Result<Figures> {
    // One unmeasured run: the first requests after start-up compile and warm caches.
    bench.serve(options.num_prompts, 1)?;
    let (mut without, mut with, mut usage) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..options.runs {
        // Alternate which configuration goes first, so that drift does not favour one.
        let traced_first = i % 2 == 1;
        if !traced_first {
            without.push(bench.serve(options.num_prompts, i as u64)?);
        }
        let (result, used) = bench.serve_traced(agent, options.num_prompts, i as u64)?;
        with.push(result);
        if traced_first {
            without.push(bench.serve(options.num_prompts, i as u64)?);
        }
        println!(
            "run {}: without {:.1} tok/s ttft mean {:.2} ms server {:.2} s CPU | with {:.1} \
             tok/s ttft mean {:.2} ms server {:.2} s CPU; benchmark {:.1} s of a {:.1} s window; \
             agent {:.3} s CPU in the window, idle {:.0} us/s, {:.3} s during the load, \
             peak RSS {:.0} KiB, {:.0} records, {:.0} requests traced",
            i + 1,
            without[i].output_tokens_per_s,
            without[i].mean_ttft_ms,
            without[i].server_cpu_s,
            with[i].output_tokens_per_s,
            with[i].mean_ttft_ms,
            with[i].server_cpu_s,
            with[i].duration_s,
            with[i].window_s,
            used.window_cpu_s,
            used.idle_cpu_per_s * 1e6,
            used.load_cpu_s,
            used.peak_rss_kib,
            used.records,
            used.requests
        );
        usage.push(used);
    }
    let ratio = |f: fn(&RunResult) -> f64| {
        Spread::of(
            with.iter()
                .zip(&without)
                .map(|(w, o)| f(w) / f(o))
                .collect(),
        )
    };
    let figures = Figures {
        engine: bench.engine,
        throughput: ratio(|r| r.output_tokens_per_s),
        mean_ttft: ratio(|r| r.mean_ttft_ms),
        server_cpu: ratio(|r| r.server_cpu_s),
        agent_ms_per_request: Spread::of(
            usage
                .iter()
                .map(|u| 1000.0 * u.load_cpu_s / u.requests)
                .collect(),
        ),
        agent_window_ms_per_request: Spread::of(
            usage
                .iter()
                .map(|u| 1000.0 * u.window_cpu_s / u.requests)
                .collect(),
        ),
        peak_rss_mib: usage.iter().map(|u| u.peak_rss_kib).fold(0.0, f64::max) / 1024.0,
        records_per_request: Spread::of(usage.iter().map(|u| u.records / u.requests).collect())
            .median,
    };
    let median_of = |runs: &[RunResult], f: fn(&RunResult) -> f64| {
        Spread::of(runs.iter().map(f).collect()).median
    };
    println!(
        "\n{}: medians over {} alternating runs of {} prompts (random 256 in / 64 out, seed = run):",
        bench.engine.title(),
        options.runs,
        options.num_prompts
    );
    println!(
        "output tokens/s: without {:.1}, with {:.1}; ratio with/without {}",
        median_of(&without, |r| r.output_tokens_per_s),
        median_of(&with, |r| r.output_tokens_per_s),
        figures.throughput
    );
    println!(
        "TTFT mean: without {:.2} ms, with {:.2} ms; ratio {}",
        median_of(&without, |r| r.mean_ttft_ms),
        median_of(&with, |r| r.mean_ttft_ms),
        figures.mean_ttft
    );
    println!(
        "TTFT median: without {:.2} ms, with {:.2} ms; ratio {}",
        median_of(&without, |r| r.median_ttft_ms),
        median_of(&with, |r| r.median_ttft_ms),
        ratio(|r| r.median_ttft_ms)
    );
    println!(
        "API server CPU: without {:.2} s, with {:.2} s; ratio {}",
        median_of(&without, |r| r.server_cpu_s),
        median_of(&with, |r| r.server_cpu_s),
        figures.server_cpu
    );
    println!(
        "agent per traced run: {} ms CPU per request during the load ({} over the window), \
         peak RSS {:.1} MiB, {:.1} records per request",
        figures.agent_ms_per_request,
        figures.agent_window_ms_per_request,
        figures.peak_rss_mib,
        figures.records_per_request
    );
    Ok(figures)
}

/// How long the attached agent's idle rate is measured before a traced run.
const IDLE_MEASURE: Duration = Duration::from_secs(5);

/// The agent's CPU seconds during the benchmark itself: its CPU over the window less its idle
/// rate over the part of the window outside the benchmark (the client's start and exit).
fn load_cpu_seconds(window_cpu_s: f64, idle_cpu_per_s: f64, window_s: f64, duration_s: f64) -> f64 {
    let outside_s = (window_s - duration_s).max(0.0);
    (window_cpu_s - idle_cpu_per_s * outside_s).max(0.0)
}

/// CPU seconds (user + system) a process has used, from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let fields = stat_fields(pid).with_context(|| format!("reading /proc/{pid}/stat"))?;
    // utime and stime are fields 14 and 15 (indices 11 and 12 from the state on).
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc/PID/stat")?
            .parse::<f64>()?)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// CPU seconds a process's live threads have run, from their schedstat (nanoseconds): the
/// agent's threads live as long as it does, and its CPU during one load (0.06-0.09 s on a
/// 2-core VM) is too little for /proc/PID/stat's 10 ms ticks.
fn threads_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let tasks = format!("/proc/{pid}/task");
    let mut ns = 0u64;
    for task in std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
        let path = task?.path().join("schedstat");
        // A thread that exited meanwhile has no schedstat left to read.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        ns += text
            .split_whitespace()
            .next()
            .and_then(|run| run.parse::<u64>().ok())
            .with_context(|| format!("{} is not a schedstat line", path.display()))?;
    }
    Ok(ns as f64 / 1e9)
}

/// Wait until the agent has attached: its CPU time stops rising (loading and attaching the
/// programs takes most of a second of CPU; an idle engine gives it next to nothing to do).
fn wait_attached(agent: &mut Child) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut last = cpu_seconds(agent.id())?;
    thread::sleep(Duration::from_millis(1500));
    while start.elapsed() < Duration::from_secs(30) {
        if let Some(status) = agent.try_wait()? {
            bail!("infertrace exited at attach ({status})");
        }
        thread::sleep(Duration::from_millis(500));
        let now = cpu_seconds(agent.id())?;
        if now - last < 0.01 {
            return Ok(());
        }
        last = now;
    }
    bail!("infertrace was still busy 30 s after it started")
}

impl Bench {
    /// One run under `infertrace attach` (default settings, no output): the run's result and
    /// what the agent used.
    fn serve_traced(
        &self,
        agent: &Path,
        num_prompts: u32,
        seed: u64,
    ) -> anyhow::Result<(RunResult, AgentUsage)> {
        let mut child = Command::new(agent)
            .args(["attach", "--pid", &self.pid.to_string(), "--output", "none"])
            .env("INFERTRACE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting infertrace")?;
        wait_attached(&mut child)?;
        let idle_start = threads_cpu_seconds(child.id())?;
        thread::sleep(IDLE_MEASURE);
        let before = threads_cpu_seconds(child.id())?;
        let idle_cpu_per_s = (before - idle_start) / IDLE_MEASURE.as_secs_f64();
        let result = self.serve(num_prompts, seed)?;
        let window_cpu_s = threads_cpu_seconds(child.id())? - before;
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
        let summary = summary
            .lines()
            .find(|l| l.contains("infertrace: detached."))
            .with_context(|| format!("no summary line from infertrace: {summary}"))?;
        let number = |suffix: &str| number_before(summary, suffix).unwrap_or(f64::NAN);
        let usage = AgentUsage {
            load_cpu_s: load_cpu_seconds(
                window_cpu_s,
                idle_cpu_per_s,
                result.window_s,
                result.duration_s,
            ),
            window_cpu_s,
            idle_cpu_per_s,
            peak_rss_kib: number(" KiB"),
            records: number(" records"),
            requests: number(" requests traced"),
        };
        Ok((result, usage))
    }

    /// One run of the engine's serving benchmark against the tiny model: its result.
    fn serve(&self, num_prompts: u32, seed: u64) -> anyhow::Result<RunResult> {
        let cpu_before = cpu_seconds(self.pid)?;
        let started = Instant::now();
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
        let server_cpu_s = cpu_seconds(self.pid)? - cpu_before;
        Ok(RunResult {
            duration_s: get("duration")?,
            window_s: started.elapsed().as_secs_f64(),
            server_cpu_s,
            output_tokens_per_s: get("output_throughput")?,
            mean_ttft_ms: get("mean_ttft_ms")?,
            median_ttft_ms: get("median_ttft_ms")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's own CPU time.
    fn thread_cpu() -> Duration {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }

    #[test]
    fn the_threads_cpu_counts_what_a_thread_ran() {
        let pid = std::process::id();
        let before = threads_cpu_seconds(pid).expect("schedstat");
        let start = thread_cpu();
        while thread_cpu() - start < Duration::from_millis(50) {
            std::hint::black_box(start);
        }
        let after = threads_cpu_seconds(pid).expect("schedstat");
        assert!(after - before >= 0.05, "{before} s -> {after} s");
    }

    #[test]
    fn the_idle_rate_outside_the_benchmark_is_not_counted() {
        // 0.12 s over an 80 s window at 0.2 ms/s idle, the benchmark 30 s of it: 0.01 s was
        // the idle rate over the 50 s outside.
        let during = load_cpu_seconds(0.12, 0.0002, 80.0, 30.0);
        assert!((during - 0.11).abs() < 1e-9, "{during}");
        // A benchmark reported longer than the window (clocks apart): nothing taken off.
        assert_eq!(load_cpu_seconds(0.12, 0.0002, 30.0, 31.0), 0.12);
        // An idle rate above what the window used: never below nothing.
        assert_eq!(load_cpu_seconds(0.001, 0.01, 80.0, 30.0), 0.0);
    }
}
