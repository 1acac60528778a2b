//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! Installs what the tests need (a Python venv with pyzmq for the fixture processes, and
//! cargo-fuzz for the fuzz smoke runs), then: eBPF object freshness, rustfmt, clippy, unit and
//! root integration tests (real kernel, real processes), and each fuzz target for a fixed time.
use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::{ebpf, root, run};

/// Seconds each fuzz target runs in CI.
const FUZZ_SECONDS: u32 = 30;
/// Wall-clock limit of one fuzz target's build and run (coreutils `timeout` duration).
const FUZZ_WALL_LIMIT: &str = "600s";
const FUZZ_TARGETS: &[&str] = &[
    "http",
    "zmtp",
    "records",
    "vllm",
    "pickle",
    "sglang",
    "sglang_log",
];

pub fn test(skip_fuzz: bool) -> anyhow::Result<()> {
    let root = root();
    // SAFETY of geteuid: no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        bail!(
            "the integration tests load eBPF programs: run `sudo cargo xtask test` (CI runs as root)"
        );
    }
    let python = test_venv(&root)?;
    ebpf::check()?;
    run(Command::new("cargo")
        .args(["fmt", "--all", "--check"])
        .current_dir(&root))?;
    run(Command::new("cargo")
        .args(["clippy", "--all-targets", "--", "-D", "warnings"])
        .current_dir(&root))?;
    run(Command::new("cargo")
        .args(["test", "--", "--test-threads=1"])
        .env("INFERTRACE_TEST_PYTHON", &python)
        .current_dir(&root))?;
    if !skip_fuzz {
        fuzz(&root)?;
    }
    println!("all checks passed");
    Ok(())
}

/// target/test-venv, made once: pyzmq for the ZeroMQ fixture processes, grpcio and
/// opentelemetry-proto for the OTLP receiver the export tests send to.
pub fn test_venv(root: &Path) -> anyhow::Result<String> {
    let venv = root.join("target/test-venv");
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args([
            "-c",
            "import zmq, grpc, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2",
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ready {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run(Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "-q",
            "pyzmq",
            "grpcio",
            "opentelemetry-proto",
        ]))?;
    }
    Ok(python.to_string_lossy().into_owned())
}

fn fuzz(root: &Path) -> anyhow::Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success());
    if !have.unwrap_or(false) {
        run(Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]))
            .context("installing cargo-fuzz")?;
    }
    for target in FUZZ_TARGETS {
        // A wall-clock bound around each run (its build included): a fuzzer that stops
        // responding (libFuzzer's out-of-memory report has been seen to hang in its symbolizer)
        // fails the run instead of holding CI until its own limit.
        run(Command::new("timeout")
            .args(["--kill-after=10s", FUZZ_WALL_LIMIT, "cargo"])
            .args([
                "fuzz",
                "run",
                target,
                "--",
                &format!("-max_total_time={FUZZ_SECONDS}"),
                // One allocation this large is a decoder trusting a length it was given.
                "-malloc_limit_mb=512",
            ])
            // cargo-fuzz needs nightly flags (-Z sanitizer); this stable toolchain allows them.
            .env("RUSTC_BOOTSTRAP", "1")
            .current_dir(root))?;
    }
    Ok(())
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
