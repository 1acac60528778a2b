//! `cargo xtask bench-python`: what Python stack sampling costs (BENCHMARKS.md).
//!
//! A CPU-bound Python loop (tests/fixtures/python/cpu_loop.py, pyenv's CPython 3.11: the
//! machine's python3) runs without the agent, under `infertrace attach` sampling at the default
//! rate, and at ten times it, alternating, medians of the loop's own time. Printed: the
//! slowdown per configuration, and the agent's CPU per sample: the difference in its CPU time
//! between the two rates over the difference in its records (a Python process's records are
//! its samples and a few process records), so that attaching and loading cost nothing here.
use std::process::Command;

use crate::{
    bench::{median, number_before, run_traced},
    root, run,
};

/// Alternating runs per configuration.
const RUNS: usize = 5;
/// Loop iterations (about 6 s on this machine: enough samples at 490 Hz for the agent's
/// per-sample CPU to stand out of its fixed cost).
const ITERATIONS: &str = "150000000";

pub fn bench_python() -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let agent = root.join("target/release/infertrace");
    let script = root.join("tests/fixtures/python/cpu_loop.py");
    let configs: [(&str, Option<&[&str]>); 3] = [
        ("without agent", None),
        (
            "sampling at 49 Hz (default)",
            Some(&["--python-sample-hz", "49"]),
        ),
        ("sampling at 490 Hz", Some(&["--python-sample-hz", "490"])),
    ];
    let mut seconds: Vec<Vec<f64>> = configs.iter().map(|_| Vec::new()).collect();
    // (agent CPU seconds, records) per traced run.
    let mut agent_runs: Vec<Vec<(f64, f64)>> = configs.iter().map(|_| Vec::new()).collect();
    for _ in 0..RUNS {
        for (i, (_, args)) in configs.iter().enumerate() {
            let mut command = Command::new("python3");
            command.arg(&script).arg(ITERATIONS);
            let traced = args.map(|a| (agent.as_path(), a));
            let (line, log) = run_traced(command, traced, "sampling its threads")?;
            seconds[i].push(line.trim().parse()?);
            if let Some(log) = log {
                let cpu = number_before(&log, " s of CPU").unwrap_or(f64::NAN);
                let records = number_before(&log, " records (").unwrap_or(f64::NAN);
                agent_runs[i].push((cpu, records));
            }
        }
    }
    println!(
        "## Python stack sampling (CPU-bound loop of {ITERATIONS} iterations, CPython 3.11, \
         {RUNS} alternating runs, medians)"
    );
    let base = median(&mut seconds[0].clone());
    for (i, (name, args)) in configs.iter().enumerate() {
        let m = median(&mut seconds[i].clone());
        print!(
            "{name}: {m:.3} s (runs: {}), slowdown {:+.2} %",
            seconds[i]
                .iter()
                .map(|s| format!("{s:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            (m / base - 1.0) * 100.0
        );
        if args.is_some() {
            let mut cpu: Vec<f64> = agent_runs[i].iter().map(|r| r.0).collect();
            let mut records: Vec<f64> = agent_runs[i].iter().map(|r| r.1).collect();
            print!(
                "; agent {:.3} s CPU (runs: {}), {:.0} samples",
                median(&mut cpu),
                cpu.iter()
                    .map(|c| format!("{c:.3}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                median(&mut records)
            );
        }
        println!();
    }
    // Per run pair: the extra CPU of the faster rate over its extra samples.
    let mut marginal: Vec<f64> = agent_runs[1]
        .iter()
        .zip(&agent_runs[2])
        .map(|(slow, fast)| (fast.0 - slow.0) / (fast.1 - slow.1) * 1e6)
        .collect();
    println!(
        "agent CPU per sample (extra CPU at 490 Hz over its extra samples, per run pair): \
         median {:.1} µs (runs: {})",
        median(&mut marginal),
        marginal
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
