//! `cargo xtask bench-capture`: what capture costs and how much it can carry (BENCHMARKS.md).
//!
//! 1. Added cost per captured syscall: a load process sends N ZMTP messages over a unix
//!    socket pair (one `write` and one `read` per message); its time per message is measured
//!    without the agent and with `infertrace attach` tracing it, alternating runs, medians.
//! 2. Pipeline throughput: the same load is recorded (`infertrace record`), then
//!    `infertrace replay` decodes the file on one core: records/s and MiB/s.
//! 3. Overload: a small ring buffer and a flood of 64 KiB messages: lost records must be
//!    counted and decoding must carry on after each gap.
//!
//! The load process is this binary itself (`cargo xtask bench-load`), so nothing but the
//! syscalls under test runs in the traced process.
use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{root, run};

/// Alternating runs per configuration.
const RUNS: usize = 5;

pub fn bench_capture() -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace", "-p", "xtask"])
        .current_dir(&root))?;
    let agent = root.join("target/release/infertrace");
    let xtask = root.join("target/release/xtask");

    println!(
        "## Added cost per captured syscall (200000 messages of 100 B: 1 write + 1 read each)"
    );
    let mut without = Vec::new();
    let mut with = Vec::new();
    let mut deferred = Vec::new();
    let mut agent_cpu = Vec::new();
    let mut rss = 0f64;
    // Deferred draining: a ring large enough for the whole run, drained every 5 s, so that the
    // agent's own work does not compete with the load for this machine's 2 cores: what is
    // left is the in-kernel cost.
    let defer = ["--ring-mib", "256", "--poll-ms", "5000"];
    for _ in 0..RUNS {
        without.push(load_run(&xtask, &agent, false, 200_000, 100, &[])?.ns_per_msg);
        let traced = load_run(&xtask, &agent, true, 200_000, 100, &[])?;
        with.push(traced.ns_per_msg);
        // Two captured syscalls per message.
        agent_cpu.push(traced.agent_cpu_s * 1e9 / 400_000.0);
        rss = rss.max(traced.max_rss_kib);
    }
    let (a, b) = (median(&mut without), median(&mut with));
    println!(
        "without agent: median {a:.0} ns/message  (runs: {})",
        fmt(&without)
    );
    println!(
        "with agent:    median {b:.0} ns/message  (runs: {})",
        fmt(&with)
    );
    println!(
        "added: {:.0} ns per message = {:.0} ns per captured syscall",
        b - a,
        (b - a) / 2.0
    );
    for _ in 0..RUNS {
        deferred.push(load_run(&xtask, &agent, true, 200_000, 100, &defer)?.ns_per_msg);
    }
    let c = median(&mut deferred);
    println!(
        "with agent, draining deferred: median {c:.0} ns/message  (runs: {})",
        fmt(&deferred)
    );
    println!(
        "in-kernel cost: {:.0} ns per message = {:.0} ns per captured syscall",
        c - a,
        (c - a) / 2.0
    );
    println!(
        "agent CPU: median {:.0} ns per captured syscall (runs: {}); agent peak RSS {rss:.0} KiB",
        median(&mut agent_cpu),
        fmt(&agent_cpu)
    );

    println!("\n## Pipeline throughput (replay of a recording, one core)");
    let file = std::env::temp_dir().join("infertrace-bench.rec");
    let load = load_run(
        &xtask,
        &agent,
        true,
        100_000,
        4096,
        &["record", "-o", file.to_str().unwrap_or("")],
    )?;
    let size = std::fs::metadata(&file)?.len();
    let start = Instant::now();
    let out = Command::new(&agent)
        .arg("replay")
        .arg(&file)
        .stdout(Stdio::null())
        .output()?;
    let secs = start.elapsed().as_secs_f64();
    let summary = String::from_utf8_lossy(&out.stderr).to_string();
    let records = number_before(&summary, " records (").unwrap_or(0.0);
    let payload = number_before(&summary, " B of payload").unwrap_or(0.0);
    let messages = number_before(&summary, " messages").unwrap_or(0.0);
    println!(
        "the load sent {} messages of 4 KiB; the recording ({:.1} MiB) holds {records:.0} \
         records; replay decoded {messages:.0} messages in {secs:.2} s: {:.0} records/s, \
         {:.1} MiB/s of payload",
        load.messages,
        size as f64 / 1048576.0,
        records / secs,
        payload / 1048576.0 / secs
    );
    println!("recording agent: {}", load.agent_summary.trim());
    let _ = std::fs::remove_file(&file);

    println!("\n## Overload: 1 MiB ring buffer, 20000 messages of 64 KiB as fast as possible");
    let flood = load_run(
        &xtask,
        &agent,
        true,
        20_000,
        64 * 1024,
        &["--ring-mib", "1", "--poll-ms", "50"],
    )?;
    println!("{}", flood.agent_summary.trim());
    Ok(())
}

struct LoadResult {
    ns_per_msg: f64,
    messages: u64,
    agent_summary: String,
    /// CPU seconds (user + system) the agent used, and its peak RSS (KiB).
    agent_cpu_s: f64,
    max_rss_kib: f64,
}

/// Run the load process, optionally under the agent (`agent_args` replaces `attach`).
fn load_run(
    xtask: &Path,
    agent: &Path,
    traced: bool,
    messages: u64,
    size: usize,
    agent_args: &[&str],
) -> anyhow::Result<LoadResult> {
    let mut load = Command::new(xtask)
        .args(["bench-load", &messages.to_string(), &size.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let pid = load.id().to_string();
    let mut agent_child = None;
    if traced {
        let mut args: Vec<&str> = if agent_args.first() == Some(&"record") {
            agent_args.to_vec()
        } else {
            let mut a = vec!["attach"];
            a.extend_from_slice(agent_args);
            a
        };
        args.extend_from_slice(&["--pid", &pid]);
        let child = Command::new(agent)
            .args(&args)
            .env("INFERTRACE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        agent_child = Some(child);
        // Attached when the programs are loaded: give it a moment.
        thread::sleep(Duration::from_millis(1500));
    }
    let mut stdin = load.stdin.take().context("load stdin")?;
    writeln!(stdin, "go")?;
    let mut line = String::new();
    BufReader::new(load.stdout.take().context("load stdout")?).read_line(&mut line)?;
    let ns_per_msg: f64 = line
        .trim()
        .parse()
        .with_context(|| format!("load printed {line:?}"))?;
    drop(stdin);
    load.wait()?;
    let mut agent_summary = String::new();
    if let Some(mut child) = agent_child {
        // The agent stops by itself once the traced process has exited.
        child
            .stderr
            .take()
            .context("agent stderr")?
            .read_to_string(&mut agent_summary)?;
        let status = child.wait()?;
        if !status.success() {
            bail!("agent failed: {agent_summary}");
        }
    }
    // The agent reports its own CPU time and peak RSS when it detaches.
    Ok(LoadResult {
        ns_per_msg,
        messages,
        agent_cpu_s: number_before(&agent_summary, " s of CPU").unwrap_or(f64::NAN),
        max_rss_kib: number_before(&agent_summary, " KiB").unwrap_or(f64::NAN),
        agent_summary,
    })
}

/// The traced load: waits for "go" on stdin, then sends `count` ZMTP frames of `size` bytes
/// over a unix socket pair (one write each) while a thread reads them; prints ns per message.
pub fn bench_load(count: u64, size: usize) -> anyhow::Result<()> {
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let (mut tx, mut rx) = UnixStream::pair()?;
    let mut frame = Vec::with_capacity(size + 9);
    if size > 255 {
        frame.push(0x02);
        frame.extend_from_slice(&(size as u64).to_be_bytes());
    } else {
        frame.push(0x00);
        frame.push(size as u8);
    }
    frame.extend((0..size).map(|i| (i % 251) as u8));
    let total = frame.len() as u64 * count;
    let reader = thread::spawn(move || {
        let mut buf = vec![0u8; frame_len(size)];
        let mut got = 0u64;
        while got < total {
            match rx.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
    });
    let start = Instant::now();
    for _ in 0..count {
        tx.write_all(&frame)?;
    }
    drop(tx);
    let _ = reader.join();
    println!("{:.1}", start.elapsed().as_nanos() as f64 / count as f64);
    Ok(())
}

fn frame_len(size: usize) -> usize {
    size + if size > 255 { 9 } else { 2 }
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

pub fn fmt(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The number just before `suffix` in `text` ("decoded 12 messages" -> 12).
pub fn number_before(text: &str, suffix: &str) -> Option<f64> {
    let end = text.find(suffix)?;
    text[..end].rsplit([' ', '(']).next()?.parse().ok()
}

/// One configuration of a load-program benchmark: untraced, or under `infertrace attach` with
/// extra arguments once its log says `armed`.
pub struct Config<'a> {
    pub name: &'a str,
    pub agent: Option<(&'a [&'a str], &'a str)>,
}

impl<'a> Config<'a> {
    pub fn untraced(name: &'a str) -> Self {
        Self { name, agent: None }
    }

    pub fn traced(name: &'a str, args: &'a [&'a str], armed: &'a str) -> Self {
        Self {
            name,
            agent: Some((args, armed)),
        }
    }
}

/// What the runs of one configuration measured: the program's seconds per run, and per traced
/// run the agent's CPU seconds and records.
#[derive(Default)]
pub struct Runs {
    pub seconds: Vec<f64>,
    pub agent: Vec<(f64, f64)>,
}

/// Run `python script arg` `runs` times under each configuration, alternating.
pub fn alternate(
    agent: &Path,
    python: &str,
    script: &Path,
    arg: &str,
    configs: &[Config],
    runs: usize,
) -> anyhow::Result<Vec<Runs>> {
    let mut out: Vec<Runs> = configs.iter().map(|_| Runs::default()).collect();
    for _ in 0..runs {
        for (i, config) in configs.iter().enumerate() {
            let mut command = Command::new(python);
            command.arg(script).arg(arg);
            let traced = config.agent.map(|(args, _)| (agent, args));
            let armed = config.agent.map_or("", |(_, armed)| armed);
            let (line, log) = run_traced(command, traced, armed)?;
            out[i].seconds.push(line.trim().parse()?);
            if let Some(log) = log {
                let cpu = number_before(&log, " s of CPU").unwrap_or(f64::NAN);
                let records = number_before(&log, " records (").unwrap_or(f64::NAN);
                out[i].agent.push((cpu, records));
            }
        }
    }
    Ok(out)
}

/// Print each configuration's median time, its slowdown against the first, and for traced
/// ones the agent's median CPU and records (`records` names them).
pub fn print_runs(configs: &[Config], runs: &[Runs], records: &str) {
    let list = |values: &[f64]| {
        values
            .iter()
            .map(|v| format!("{v:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let base = median(&mut runs[0].seconds.clone());
    for (config, r) in configs.iter().zip(runs) {
        let m = median(&mut r.seconds.clone());
        print!(
            "{}: {m:.3} s (runs: {}), slowdown {:+.2} %",
            config.name,
            list(&r.seconds),
            (m / base - 1.0) * 100.0
        );
        if !r.agent.is_empty() {
            let mut cpu: Vec<f64> = r.agent.iter().map(|a| a.0).collect();
            let mut counts: Vec<f64> = r.agent.iter().map(|a| a.1).collect();
            let runs = list(&cpu);
            print!(
                "; agent {:.3} s CPU (runs: {runs}), {:.0} {records}",
                median(&mut cpu),
                median(&mut counts)
            );
        }
        println!();
    }
}

/// Run a load program that prints "ready", waits for "go" on stdin and prints one result
/// line; with `traced` = (agent, extra args), under `infertrace attach --pid` once the agent's
/// log says `armed` (its probes or sampler are on the program). Returns the result line and the
/// agent's log (its summary has its CPU time and record counts).
pub fn run_traced(
    mut command: Command,
    traced: Option<(&Path, &[&str])>,
    armed: &str,
) -> anyhow::Result<(String, Option<String>)> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the load program")?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("the load program printed {line:?}");
    }
    let pid = child.id().to_string();
    let mut agent = None;
    if let Some((agent_path, args)) = traced {
        let mut process = Command::new(agent_path)
            .args(["attach", "--pid", &pid, "--output", "none"])
            .args(args)
            .env("INFERTRACE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        // Collect the agent's log; say when it is armed.
        let stderr = process.stderr.take().context("agent stderr")?;
        let (armed_tx, armed_rx) = std::sync::mpsc::channel();
        let marker = armed.to_owned();
        let log = thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(&marker) {
                    let _ = armed_tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        if armed_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = process.kill();
            bail!(
                "the agent never said {armed:?}:\n{}",
                log.join().unwrap_or_default()
            );
        }
        agent = Some((process, log));
    }
    let mut stdin = child.stdin.take().context("stdin")?;
    writeln!(stdin, "go")?;
    line.clear();
    stdout.read_line(&mut line)?;
    drop(stdin);
    child.wait()?;
    let Some((mut process, log)) = agent else {
        return Ok((line, None));
    };
    // The agent stops by itself once the traced process has exited.
    let status = process.wait()?;
    let log = log.join().unwrap_or_default();
    if !status.success() {
        bail!("agent failed: {log}");
    }
    Ok((line, Some(log)))
}
