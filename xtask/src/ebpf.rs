//! Building the eBPF object and keeping the committed copy honest.
//!
//! The object is committed (debug info stripped) so that `cargo build` needs no eBPF
//! toolchain. Next to it, `infertrace.bpf.o.srchash` records a hash of the sources it was
//! built from; `check-ebpf` recomputes that hash, so CI fails when someone edits `ebpf/` or
//! `common/` without running `cargo xtask build-ebpf`.
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{root, run};

/// rustup toolchain made by the setup script (Debian rustc with a prebuilt bpf libcore).
const TOOLCHAIN: &str = "bpf-debian";
const OBJECT: &str = "infertrace.bpf.o";

fn toolchain_prefix() -> PathBuf {
    env::var_os("BPF_PREFIX")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env::var_os("HOME").unwrap_or_default()).join(".local/bpf-toolchain")
        })
}

pub fn setup() -> anyhow::Result<()> {
    let script = root().join("xtask/scripts/setup-ebpf-toolchain.sh");
    run(Command::new("bash").arg(&script))
}

pub fn build() -> anyhow::Result<()> {
    let root = root();
    let prefix = toolchain_prefix();
    if !prefix.join("bin/bpf-linker").exists() {
        bail!(
            "bpf-linker not found under {}: run `cargo xtask setup` first",
            prefix.display()
        );
    }
    let path = format!(
        "{}:{}",
        prefix.join("bin").display(),
        env::var("PATH").unwrap_or_default()
    );
    let target_dir = root.join("target/ebpf");
    run(Command::new("rustup")
        .args([
            "run",
            TOOLCHAIN,
            "cargo",
            "build",
            "-p",
            "infertrace-ebpf",
            "--bins",
        ])
        .args([
            "--release",
            "--target",
            "bpfel-unknown-none",
            "--target-dir",
        ])
        .arg(&target_dir)
        .current_dir(&root)
        .env("PATH", path)
        // v3: atomic fetch-add on map values. --btf: bpf_loop callbacks need BTF func info.
        // debuginfo for every crate: aya-ebpf's memcpy & co. are exported, and without debug
        // info bpf-linker gives them BTF FUNCs with invalid type ids, which makes the kernel
        // reject the object's whole BTF.
        .env(
            "RUSTFLAGS",
            "-C target-cpu=v3 -C debuginfo=2 -C link-arg=--btf",
        )
        // aya-ebpf and our crate use unstable features; Debian's rustc is a stable build.
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER"))?;
    let built = target_dir.join("bpfel-unknown-none/release/infertrace");
    let prebuilt_dir = root.join("ebpf/prebuilt");
    fs::create_dir_all(&prebuilt_dir)?;
    let dest = prebuilt_dir.join(OBJECT);
    run(Command::new("/usr/lib/llvm-22/bin/llvm-objcopy")
        .arg("--strip-debug")
        .arg(&built)
        .arg(&dest))?;
    fs::write(
        prebuilt_dir.join(format!("{OBJECT}.srchash")),
        format!("{:016x}\n", source_hash(&root)?),
    )?;
    println!(
        "updated {} ({} bytes)",
        dest.display(),
        fs::metadata(&dest)?.len()
    );
    Ok(())
}

pub fn check() -> anyhow::Result<()> {
    let root = root();
    let recorded_path = root.join(format!("ebpf/prebuilt/{OBJECT}.srchash"));
    let recorded = fs::read_to_string(&recorded_path)
        .with_context(|| format!("read {}", recorded_path.display()))?;
    let current = format!("{:016x}", source_hash(&root)?);
    if recorded.trim() != current {
        bail!(
            "ebpf/prebuilt/{OBJECT} is stale: the eBPF sources hash to {current}, the object was \
             built from {}. Run `cargo xtask build-ebpf` and commit the result.",
            recorded.trim()
        );
    }
    println!("ebpf/prebuilt/{OBJECT} matches its sources ({current})");
    Ok(())
}

/// FNV-1a over every source file the eBPF object is built from (relative path + contents).
fn source_hash(root: &Path) -> anyhow::Result<u64> {
    let mut files = Vec::new();
    for krate in ["ebpf", "common"] {
        files.push(root.join(krate).join("Cargo.toml"));
        collect(&root.join(krate).join("src"), &mut files)?;
    }
    files.sort();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in files {
        let rel = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        for byte in rel.bytes().chain(fs::read(&file)?) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(hash)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}
