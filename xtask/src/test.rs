//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! Installs what the tests need (a Python venv with pyzmq for the fixture processes, and
//! cargo-fuzz for the fuzz smoke runs), then: eBPF object freshness, rustfmt, clippy (every
//! tier's code), the deployment files (deploy/check.py: Kubernetes schemas, the chart, the
//! shipped configuration), the test tiers one after the other, each printing its wall time
//! (plain: unit and replay tests; root: the real kernel paths; engines: the real vLLM and
//! SGLang), and each fuzz target for a fixed time.
use std::{path::Path, process::Command, time::Instant};

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
    "sse_template",
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
        .args(["clippy", "--all-targets", "--features", ALL_TIERS])
        .args(["--", "-D", "warnings"])
        .current_dir(&root))?;
    deploy_check(&root)?;
    for (tier, features) in TIERS {
        let started = Instant::now();
        let mut cargo = Command::new("cargo");
        cargo.arg("test");
        if let Some(feature) = features {
            // The tier's own tests only: those its feature builds.
            cargo.args(["-p", "infertrace-tests", "--features", feature]);
            for test in tier_tests(&root, feature)? {
                cargo.args(["--test", &test]);
            }
        }
        run(cargo
            .args(["--", "--test-threads=1"])
            .env("INFERTRACE_TEST_PYTHON", &python)
            .current_dir(&root))?;
        println!(
            "tier {tier}: passed in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    if !skip_fuzz {
        fuzz(&root)?;
    }
    println!("all checks passed");
    Ok(())
}

/// The test tiers in the order they run, and the feature of `tests/Cargo.toml` that builds
/// each (none: plain `cargo test`, the unit and replay tests).
const TIERS: [(&str, Option<&str>); 3] = [
    ("plain (unit and replay tests)", None),
    ("root (real kernel paths)", Some("root")),
    ("engines (real vLLM and SGLang)", Some("engines")),
];
const ALL_TIERS: &str = "infertrace-tests/root,infertrace-tests/engines";

/// The integration tests `tests/Cargo.toml` builds only with `feature`.
fn tier_tests(root: &Path, feature: &str) -> anyhow::Result<Vec<String>> {
    let manifest = std::fs::read_to_string(root.join("tests/Cargo.toml"))?;
    let tests = tests_requiring(&manifest, feature);
    if tests.is_empty() {
        bail!("tests/Cargo.toml lists no test for the {feature} tier");
    }
    Ok(tests)
}

/// The `[[test]]` names of a manifest whose `required-features` are `[feature]`.
fn tests_requiring(manifest: &str, feature: &str) -> Vec<String> {
    let wanted = format!("required-features = [\"{feature}\"]");
    manifest
        .split("[[test]]")
        .skip(1)
        .filter(|section| section.lines().any(|l| l.trim() == wanted))
        .filter_map(|section| {
            let name = section
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))?;
            Some(name.trim_matches('"').to_owned())
        })
        .collect()
}

/// target/test-venv, made once: pyzmq for the ZeroMQ fixture processes, grpcio and
/// opentelemetry-proto for the OTLP receiver the export tests send to.
pub fn test_venv(root: &Path) -> anyhow::Result<String> {
    let python = python_venv(
        root,
        "test-venv",
        "import zmq, grpc, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2",
        &["pyzmq", "grpcio", "opentelemetry-proto"],
    )?;
    Ok(python.to_string_lossy().into_owned())
}

/// target/NAME, a Python venv with `packages`, made once (when `probe` does not run in it);
/// its interpreter.
fn python_venv(
    root: &Path,
    name: &str,
    probe: &str,
    packages: &[&str],
) -> anyhow::Result<std::path::PathBuf> {
    let venv = root.join("target").join(name);
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", probe])
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run(Command::new(&python)
            .args(["-m", "pip", "install", "-q"])
            .args(packages))?;
    }
    Ok(python)
}

/// deploy/check.py in target/deploy-venv (pyyaml, kubernetes-validate, helm-python-sdk), with
/// the agent's own `config check` of the shipped configuration.
fn deploy_check(root: &Path) -> anyhow::Result<()> {
    let python = python_venv(
        root,
        "deploy-venv",
        "import yaml, kubernetes_validate, helm_python",
        &["pyyaml", "kubernetes-validate", "helm-python-sdk"],
    )?;
    run(Command::new("cargo")
        .args(["build", "-p", "infertrace"])
        .current_dir(root))?;
    run(Command::new(&python)
        .arg(root.join("deploy/check.py"))
        .arg("--infertrace")
        .arg(root.join("target/debug/infertrace")))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_integration_test_is_in_a_tier() {
        let root = crate::root();
        let manifest = std::fs::read_to_string(root.join("tests/Cargo.toml")).unwrap();
        let gated: Vec<String> = ["root", "engines"]
            .iter()
            .flat_map(|f| tests_requiring(&manifest, f))
            .collect();
        let plain = ["replay_vllm", "replay_sglang", "cuda_discovery"];
        for entry in std::fs::read_dir(root.join("tests/tests")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            assert!(
                gated.contains(&name) || plain.contains(&name.as_str()),
                "tests/tests/{name}.rs: in no tier (add it to tests/Cargo.toml or here)"
            );
        }
        assert!(gated.contains(&"e2e_multi".to_owned()));
    }
}
