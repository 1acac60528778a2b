//! Project tasks: `cargo xtask <task>` (alias in .cargo/config.toml).
//!
//! - `setup`: install the Rust eBPF toolchain (Debian rustc-web + prebuilt bpf libcore +
//!   bpf-linker), idempotently.
//! - `build-ebpf`: compile `ebpf/` and refresh the committed object in `ebpf/prebuilt/`.
//! - `check-ebpf`: fail when the committed object is stale against the eBPF sources.
//! - `test`: every check CI runs.
//! - `demo`: the main job, on the real vLLM.
//! - `engine vllm|sglang start|stop|status`: the real vLLM or SGLang with a tiny model, by hand.
//! - `bench-capture`: the capture benchmark of BENCHMARKS.md.
//! - `bench-cuda`, `bench-python`, `bench-zmq`: what the CUDA probes, Python sampling and the
//!   libzmq send probe cost, BENCHMARKS.md.
//! - `bench-overhead` (both engines), `bench-vllm`, `bench-sglang`: the agent's overhead on
//!   the real engines (their own serving benchmarks), BENCHMARKS.md.
mod bench;
mod bench_cuda;
mod bench_engine;
mod bench_python;
mod bench_zmq;
mod demo;
mod ebpf;
mod engine;
mod test;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use clap::{Args, Parser, Subcommand};

use crate::engine::Engine;

#[derive(Parser)]
#[command(about = "infertrace project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the eBPF toolchain (apt + cargo install bpf-linker), idempotent.
    Setup,
    /// Rebuild the eBPF object and update ebpf/prebuilt/ (needs `cargo xtask setup` once).
    BuildEbpf,
    /// Fail if ebpf/prebuilt/ was not rebuilt after the eBPF sources changed.
    CheckEbpf,
    /// The main job: start the real vLLM (installed on first use), attach, send requests.
    Demo {
        /// Port of the vLLM API server.
        #[arg(long, default_value_t = 8321)]
        port: u16,
        /// Leave vLLM running afterwards.
        #[arg(long)]
        keep_engine: bool,
    },
    /// Start, stop or inspect a local inference engine (installed on first use).
    Engine {
        #[command(subcommand)]
        engine: EngineKind,
    },
    /// Capture benchmark: added cost per syscall, pipeline throughput, overload (needs root).
    BenchCapture,
    /// CUDA launch probes: added cost per probed launch and records per step, with the driver
    /// stand-in (needs root).
    BenchCuda,
    /// Python stack sampling: slowdown of a CPU-bound Python loop, agent CPU per sample
    /// (needs root).
    BenchPython,
    /// The probe on libzmq's zmq_msg_send: added cost per send of a pyzmq loop (needs root).
    BenchZmq,
    /// The agent's cost on both real engines, one after the other: throughput, TTFT and API
    /// server CPU ratios (alternating pairs), agent CPU per request, peak RSS, records per
    /// request (needs root).
    BenchOverhead {
        /// Only this engine (default: vLLM, then SGLang).
        #[arg(long, value_parser = ["vllm", "sglang"])]
        engine: Option<String>,
        #[command(flatten)]
        options: BenchArgs,
    },
    /// Overhead on the real vLLM: `vllm bench serve` with and without the agent (needs root).
    BenchVllm {
        #[command(flatten)]
        options: BenchArgs,
    },
    /// Overhead on the real SGLang: `sglang.bench_serving` with and without the agent (needs
    /// root).
    BenchSglang {
        #[command(flatten)]
        options: BenchArgs,
    },
    /// The process traced by bench-capture (internal).
    #[command(hide = true)]
    BenchLoad { count: u64, size: usize },
    /// Run every check CI runs (needs root): eBPF freshness, fmt, clippy, tests, fuzz smoke.
    Test {
        /// Skip the fuzz runs (quicker local iterations).
        #[arg(long)]
        skip_fuzz: bool,
    },
}

/// How long an engine benchmark runs.
#[derive(Args)]
struct BenchArgs {
    /// Alternating runs per configuration.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Prompts per run (256: ~7 s runs on a 2-core VM; shorter ones are noise-dominated).
    #[arg(long, default_value_t = 256)]
    num_prompts: u32,
}

impl BenchArgs {
    fn options(&self) -> bench_engine::BenchOptions {
        bench_engine::BenchOptions {
            runs: self.runs,
            num_prompts: self.num_prompts,
        }
    }
}

#[derive(Subcommand)]
enum EngineKind {
    /// The vLLM CPU build with a tiny local model, in VLLM_HOME (default /var/tmp/infertrace-vllm);
    /// default port 8321.
    Vllm {
        #[command(subcommand)]
        action: EngineAction,
    },
    /// The real SGLang on CPU with a tiny local model, in SGLANG_HOME (default
    /// /var/tmp/infertrace-sglang); default port 30000.
    Sglang {
        #[command(subcommand)]
        action: EngineAction,
    },
}

#[derive(Subcommand)]
enum EngineAction {
    /// Start the engine in the background (install on first use); prints the API server pid.
    Start {
        /// Port of the API server (default: vLLM 8321, SGLang 30000).
        #[arg(long)]
        port: Option<u16>,
        /// Extra engine arguments (`vllm serve` / `sglang.launch_server`), after `--`.
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// SIGTERM the API server, wait up to 30 s for its process tree, then SIGKILL.
    Stop {
        #[arg(long)]
        port: Option<u16>,
    },
    /// Whether it serves, its processes, arguments and log.
    Status {
        #[arg(long)]
        port: Option<u16>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup => ebpf::setup(),
        Task::BuildEbpf => ebpf::build(),
        Task::CheckEbpf => ebpf::check(),
        Task::Test { skip_fuzz } => test::test(skip_fuzz),
        Task::BenchCapture => bench::bench_capture(),
        Task::BenchCuda => bench_cuda::bench_cuda(),
        Task::BenchPython => bench_python::bench_python(),
        Task::BenchZmq => bench_zmq::bench_zmq(),
        Task::BenchOverhead { engine, options } => {
            let engines = match engine.as_deref() {
                Some("vllm") => vec![Engine::Vllm],
                Some(_) => vec![Engine::Sglang],
                None => vec![Engine::Vllm, Engine::Sglang],
            };
            bench_engine::bench_overhead(&engines, &options.options())
        }
        Task::BenchVllm { options } => {
            bench_engine::bench(Engine::Vllm, &options.options()).map(drop)
        }
        Task::BenchSglang { options } => {
            bench_engine::bench(Engine::Sglang, &options.options()).map(drop)
        }
        Task::BenchLoad { count, size } => bench::bench_load(count, size),
        Task::Demo { port, keep_engine } => demo::demo(&demo::DemoOptions { port, keep_engine }),
        Task::Engine { engine } => {
            let (engine, action) = match engine {
                EngineKind::Vllm { action } => (Engine::Vllm, action),
                EngineKind::Sglang { action } => (Engine::Sglang, action),
            };
            let home = engine.home();
            let port = |port: Option<u16>| port.unwrap_or(engine.default_port());
            match action {
                EngineAction::Start { port: p, extra } => {
                    let port = port(p);
                    let pid = engine.start(&root(), &home, port, &extra)?;
                    println!("{} API server pid {pid} on port {port}", engine.title());
                    Ok(())
                }
                EngineAction::Stop { port: p } => engine.stop(&home, port(p)),
                EngineAction::Status { port: p } => engine.status(&home, port(p)),
            }
        }
    }
}

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("spawn {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
