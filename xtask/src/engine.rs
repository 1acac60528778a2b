//! `cargo xtask engine vllm start|stop|status`: the real vLLM CPU build with a tiny local model,
//! installed on first use into `VLLM_HOME` (default `/var/tmp/infertrace-vllm`) by the scripts
//! in `xtask/scripts/engines/vllm/`. `cargo xtask demo` uses the same functions.
//!
//! The API server's pid is kept in `$VLLM_HOME/logs/vllm-<port>.pid`, its log next to it.
use std::{
    env, fs,
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::run;

/// Scripts copied into `VLLM_HOME` before each start (the run script calls the other two).
const SCRIPTS: &[&str] = &["install-venv.sh", "make_tiny_model.py", "run-tiny-vllm.sh"];

/// How long `stop` waits after SIGTERM before it sends SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Where the engine's venv, model and logs live (`VLLM_HOME`).
pub fn vllm_home() -> PathBuf {
    env::var_os("VLLM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/infertrace-vllm"))
}

fn pid_file(home: &Path, port: u16) -> PathBuf {
    home.join(format!("logs/vllm-{port}.pid"))
}

fn log_file(home: &Path, port: u16) -> PathBuf {
    home.join(format!("logs/vllm-{port}.log"))
}

/// Install (once) and start the tiny vLLM on `port` with `extra` `vllm serve` arguments;
/// returns the API server's pid. A vLLM already serving on `port` is reused as it is.
pub fn start_vllm(root: &Path, home: &Path, port: u16, extra: &[String]) -> anyhow::Result<u32> {
    fs::create_dir_all(home)?;
    for script in SCRIPTS {
        fs::copy(
            root.join("xtask/scripts/engines/vllm").join(script),
            home.join(script),
        )
        .with_context(|| format!("copying {script} to {}", home.display()))?;
    }
    if healthy(port) {
        println!("== reusing the vLLM already serving on port {port}");
        if !extra.is_empty() {
            println!("== (its arguments stay as they are: stop it first to pass {extra:?})");
        }
        return read_pid(home, port)?.context("vLLM serves but its pid file is missing");
    }
    println!(
        "== starting vLLM on port {port} (first run installs it into {}: ~6 min)",
        home.display()
    );
    run(Command::new("bash")
        .arg(home.join("run-tiny-vllm.sh"))
        .args(extra)
        .env("VLLM_HOME", home)
        .env("PORT", port.to_string())
        .current_dir(home))?;
    read_pid(home, port)?.context("run-tiny-vllm.sh wrote no pid file")
}

/// Stop the vLLM started on `port`: SIGTERM to the API server, up to 30 s for it and its
/// children (EngineCore, Worker) to exit, then SIGKILL to those left; removes the pid file.
pub fn stop_vllm(home: &Path, port: u16) -> anyhow::Result<()> {
    let pid_path = pid_file(home, port);
    let Some(pid) = read_pid(home, port)? else {
        if healthy(port) {
            bail!(
                "something serves on port {port} but {} is missing: not started by xtask?",
                pid_path.display()
            );
        }
        println!("== no vLLM on port {port}");
        return Ok(());
    };
    if !alive(pid) {
        println!("== vLLM (pid {pid}) is not running; removing its pid file");
        fs::remove_file(&pid_path)?;
        return Ok(());
    }
    if !is_vllm(pid) {
        bail!(
            "pid {pid} from {} is not vLLM (cmdline {:?}): not touching it",
            pid_path.display(),
            cmdline(pid)
        );
    }
    // Collected before the signal: once the API server is gone its children are reparented.
    let mut pids = vec![pid];
    pids.extend(descendants(pid));
    println!("== stopping vLLM on port {port}: SIGTERM to pid {pid} (tree {pids:?})");
    signal("TERM", &[pid]);
    let start = Instant::now();
    while start.elapsed() < STOP_GRACE && pids.iter().any(|&p| alive(p)) {
        thread::sleep(Duration::from_millis(200));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    if left.is_empty() {
        println!("== vLLM stopped in {:.1} s", start.elapsed().as_secs_f64());
    } else {
        println!("== still running after {STOP_GRACE:?}: SIGKILL to {left:?}");
        signal("KILL", &left);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) && left.iter().any(|&p| alive(p)) {
            thread::sleep(Duration::from_millis(100));
        }
    }
    fs::remove_file(&pid_path)?;
    Ok(())
}

/// Print whether vLLM serves on `port`, its processes and where its log is.
pub fn status_vllm(home: &Path, port: u16) -> anyhow::Result<()> {
    let serving = healthy(port);
    let pid = read_pid(home, port)?;
    println!(
        "port {port}: {}",
        if serving {
            "serving (/health 200)"
        } else {
            "not serving"
        }
    );
    match pid {
        Some(pid) if alive(pid) => {
            let mut pids = vec![pid];
            pids.extend(descendants(pid));
            for p in pids {
                println!("  pid {p:>7}  {}", comm(p));
            }
            println!("  args: {}", cmdline(pid).join(" "));
        }
        Some(pid) => println!("  pid file says {pid}, which is not running"),
        None => println!("  no pid file ({})", pid_file(home, port).display()),
    }
    println!("  log: {}", log_file(home, port).display());
    Ok(())
}

fn read_pid(home: &Path, port: u16) -> anyhow::Result<Option<u32>> {
    let path = pid_file(home, port);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            text.trim()
                .parse()
                .with_context(|| format!("parsing {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn signal(name: &str, pids: &[u32]) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .args(pids.iter().map(u32::to_string))
        .status();
}

/// `/proc/PID/stat` fields after the command name: state, ppid, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Running: present in /proc and not a zombie.
fn alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s != "Z" && s != "X"))
}

fn descendants(pid: u32) -> Vec<u32> {
    let mut all: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some(ppid) = stat_fields(p).and_then(|f| f.get(1)?.parse().ok()) {
                all.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, ppid) in &all {
            if ppid == parent && !out.contains(&p) {
                out.push(p);
                frontier.push(p);
            }
        }
    }
    out
}

fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn cmdline(pid: u32) -> Vec<String> {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn is_vllm(pid: u32) -> bool {
    comm(pid).to_ascii_lowercase().contains("vllm")
        || cmdline(pid).iter().any(|a| a.contains("vllm"))
}

pub fn healthy(port: u16) -> bool {
    http(port, "GET", "/health", "")
        .map(|r| r.starts_with("HTTP/1.1 200"))
        .unwrap_or(false)
}

/// One HTTP/1.1 request with `Connection: close`; returns the whole response.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}
