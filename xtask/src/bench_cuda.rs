//! `cargo xtask bench-cuda`: what the CUDA launch probes cost (BENCHMARKS.md).
//!
//! The step program (tests/fixtures/cuda/step_program.c) calls the driver STAND-IN (no GPU:
//! each call only counts itself, so what is measured is the probe's cost alone): N
//! cuLaunchKernel calls, then N/100 steps of 100 launches and a cuStreamSynchronize. It runs
//! without the agent, under `infertrace attach` (in-kernel aggregation, the default), and
//! under `infertrace attach --cuda-every-call` (a record per call), alternating, medians.
//! Printed: the added time per probed launch and per step, and the ring-buffer records per
//! step in both modes (from the agent's summary).
use std::{path::Path, process::Command};

use anyhow::Context as _;

use crate::{
    bench::{fmt, median, number_before, run_traced},
    root, run,
};

/// Alternating runs per configuration.
const RUNS: usize = 5;
/// Launches of the first phase (then LAUNCHES / 100 steps of 100).
const LAUNCHES: u64 = 200_000;

/// One run of the step program.
struct Run {
    launch_ns: f64,
    step_ns: f64,
    steps: f64,
    /// The agent's CUDA records and CPU seconds (traced runs).
    cuda_records: f64,
    agent_cpu_s: f64,
}

pub fn bench_cuda() -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let agent = root.join("target/release/infertrace");
    let out = root.join("target/bench-cuda");
    run(Command::new("sh")
        .arg(root.join("tests/fixtures/cuda/build.sh"))
        .arg(&out))?;
    let driver = out.join("libcuda.so.1");
    let program = out.join("step_program");

    let configs: [(&str, Option<&[&str]>); 3] = [
        ("without agent", None),
        ("aggregated (default)", Some(&[])),
        ("every call", Some(&["--cuda-every-call"])),
    ];
    let mut results: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    for _ in 0..RUNS {
        for (i, (_, agent_args)) in configs.iter().enumerate() {
            let traced = agent_args.map(|args| (agent.as_path(), args));
            results[i].push(step_run(&program, &driver, traced)?);
        }
    }

    println!(
        "## CUDA launch probes (driver stand-in, {LAUNCHES} cuLaunchKernel calls, then {} steps \
         of 100 launches + cuStreamSynchronize; {RUNS} alternating runs, medians)",
        LAUNCHES / 100
    );
    let base_launch = median(&mut results[0].iter().map(|r| r.launch_ns).collect::<Vec<_>>());
    let base_step = median(&mut results[0].iter().map(|r| r.step_ns).collect::<Vec<_>>());
    for ((name, agent_args), runs) in configs.iter().zip(&results) {
        let mut launch: Vec<f64> = runs.iter().map(|r| r.launch_ns).collect();
        let mut step: Vec<f64> = runs.iter().map(|r| r.step_ns).collect();
        let (l, s) = (median(&mut launch), median(&mut step));
        print!(
            "{name}: {l:.0} ns per launch (runs: {}), {s:.0} ns per step (runs: {})",
            fmt(&launch),
            fmt(&step)
        );
        if agent_args.is_some() {
            let r = &runs[0];
            // Every-call mode sends the first phase's launches too; aggregated mode counts
            // them into the first step.
            let first_phase = if agent_args.is_some_and(|a| !a.is_empty()) {
                LAUNCHES as f64
            } else {
                0.0
            };
            let mut cpu: Vec<f64> = runs.iter().map(|r| r.agent_cpu_s).collect();
            print!(
                "; added {:.0} ns per launch, {:.0} ns per step; {:.0} CUDA records, {:.2} per \
                 step; agent CPU {:.2} s per run",
                l - base_launch,
                s - base_step,
                r.cuda_records,
                (r.cuda_records - first_phase) / r.steps,
                median(&mut cpu)
            );
        }
        println!();
    }
    Ok(())
}

/// Run the step program, traced by the agent with `agent_args` when given.
fn step_run(
    program: &Path,
    driver: &Path,
    traced: Option<(&Path, &[&str])>,
) -> anyhow::Result<Run> {
    let mut command = Command::new(program);
    command.arg(driver).args(["bench", &LAUNCHES.to_string()]);
    let (line, log) = run_traced(command, traced, "probes on")?;
    let field = |name: &str| -> anyhow::Result<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .with_context(|| format!("{name} missing from {line:?}"))
    };
    let agent = |suffix: &str| {
        log.as_deref()
            .and_then(|log| number_before(log, suffix))
            .unwrap_or(f64::NAN)
    };
    Ok(Run {
        launch_ns: field("launch_ns")?,
        step_ns: field("step_ns")?,
        steps: field("steps")?,
        cuda_records: agent(" CUDA records"),
        agent_cpu_s: agent(" s of CPU"),
    })
}
