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
    bench::{Config, alternate, median, print_runs},
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
    let armed = "sampling its threads";
    let configs = [
        Config::untraced("without agent"),
        Config::traced(
            "sampling at 49 Hz (default)",
            &["--python-sample-hz", "49"],
            armed,
        ),
        Config::traced("sampling at 490 Hz", &["--python-sample-hz", "490"], armed),
    ];
    let runs = alternate(&agent, "python3", &script, ITERATIONS, &configs, RUNS)?;
    println!(
        "## Python stack sampling (CPU-bound loop of {ITERATIONS} iterations, CPython 3.11, \
         {RUNS} alternating runs, medians)"
    );
    print_runs(&configs, &runs, "samples");
    // Per run pair: the extra CPU of the faster rate over its extra samples.
    let mut marginal: Vec<f64> = runs[1]
        .agent
        .iter()
        .zip(&runs[2].agent)
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
