//! `cargo xtask bench-zmq`: what the probe on libzmq's `zmq_msg_send` costs (BENCHMARKS.md).
//!
//! A pyzmq send loop (tests/fixtures/zmq_send_loop.py under the tests' venv, PUSH -> PULL over
//! ipc:// in one process)
//! runs without the agent, under `infertrace attach --no-zmq-probe` (its socket writes
//! captured as usual), and under `infertrace attach` with the probe, alternating, medians of
//! the loop's own time. Printed: the slowdown per configuration, and the probe's cost per
//! message: the difference between the two traced configurations over the messages sent.
use std::process::Command;

use crate::{
    bench::{Config, alternate, median, print_runs},
    root, run,
};

/// Alternating runs per configuration.
const RUNS: usize = 5;
/// Messages per run.
const MESSAGES: &str = "100000";

pub fn bench_zmq() -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let agent = root.join("target/release/infertrace");
    let script = root.join("tests/fixtures/zmq_send_loop.py");
    // pyzmq is in the tests' venv.
    let python = crate::test::test_venv(&root)?;
    let quiet = ["--no-python-sampling", "--no-cuda"];
    let without_probe = [quiet[0], quiet[1], "--no-zmq-probe"];
    let configs = [
        Config::untraced("without agent"),
        Config::traced(
            "agent, no libzmq probe",
            &without_probe,
            "attached: tracing",
        ),
        Config::traced("agent with the libzmq probe", &quiet, "libzmq: 2 probes"),
    ];
    let runs = alternate(&agent, &python, &script, MESSAGES, &configs, RUNS)?;
    println!(
        "## libzmq hand-over probe ({MESSAGES} pyzmq sends of 64 B, {RUNS} alternating runs, \
         medians)"
    );
    print_runs(&configs, &runs, "records");
    let messages: f64 = MESSAGES.parse()?;
    let mut per_message: Vec<f64> = runs[1]
        .seconds
        .iter()
        .zip(&runs[2].seconds)
        .map(|(without, with)| (with - without) / messages * 1e9)
        .collect();
    println!(
        "added per send by the probe (per run pair): median {:.0} ns (runs: {})",
        median(&mut per_message),
        per_message
            .iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
