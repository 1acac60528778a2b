//! `cargo xtask engine vllm|sglang start|stop|status`: the real vLLM CPU build or the real SGLang
//! on CPU, each with a tiny local model, installed on first use into its home (`VLLM_HOME`, default
//! `/var/tmp/infertrace-vllm`; `SGLANG_HOME`, default `/var/tmp/infertrace-sglang`) by the scripts
//! in `xtask/scripts/engines/<engine>/`. `cargo xtask demo` uses the same functions.
//!
//! The API server's (SGLang: the main process's) pid is kept in `<home>/logs/<engine>-<port>.pid`,
//! its log next to it.
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

/// How long `stop` waits after SIGTERM before it sends SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// An inference engine the project installs and runs locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    /// Its name for people ("vLLM", "SGLang").
    pub fn title(self) -> &'static str {
        match self {
            Engine::Vllm => "vLLM",
            Engine::Sglang => "SGLang",
        }
    }

    /// Lower-case name: script folder, pid and log file names, process-name check.
    fn slug(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }

    /// The port `cargo xtask engine <engine>` uses by default.
    pub fn default_port(self) -> u16 {
        match self {
            Engine::Vllm => 8321,
            Engine::Sglang => 30000,
        }
    }

    /// The environment variable naming its home, and the default home.
    fn home_var(self) -> (&'static str, &'static str) {
        match self {
            Engine::Vllm => ("VLLM_HOME", "/var/tmp/infertrace-vllm"),
            Engine::Sglang => ("SGLANG_HOME", "/var/tmp/infertrace-sglang"),
        }
    }

    /// Files copied from `xtask/scripts/engines/<slug>/` into the home before each start; the
    /// first is the run script (it calls the others).
    fn scripts(self) -> &'static [&'static str] {
        match self {
            Engine::Vllm => &["run-tiny-vllm.sh", "install-venv.sh", "make_tiny_model.py"],
            Engine::Sglang => &[
                "run-tiny-sglang.sh",
                "install-venv.sh",
                "make_tiny_model.py",
                "shim/sgl_kernel/__init__.py",
            ],
        }
    }

    /// What the first start costs (installing it).
    fn install_note(self) -> &'static str {
        match self {
            Engine::Vllm => "~6 min, 6.3 GB",
            Engine::Sglang => "~9 min, 11 GB",
        }
    }

    /// Where the engine's venv, model and logs live.
    pub fn home(self) -> PathBuf {
        let (var, default) = self.home_var();
        env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(default))
    }

    fn pid_file(self, home: &Path, port: u16) -> PathBuf {
        home.join(format!("logs/{}-{port}.pid", self.slug()))
    }

    fn log_file(self, home: &Path, port: u16) -> PathBuf {
        home.join(format!("logs/{}-{port}.log", self.slug()))
    }

    /// Install (once) and start the tiny engine on `port` with `extra` engine arguments; returns
    /// the API server's pid. An engine already serving on `port` is reused as it is.
    pub fn start(
        self,
        root: &Path,
        home: &Path,
        port: u16,
        extra: &[String],
    ) -> anyhow::Result<u32> {
        let name = self.title();
        fs::create_dir_all(home)?;
        let scripts = root.join("xtask/scripts/engines").join(self.slug());
        for script in self.scripts() {
            let to = home.join(script);
            if let Some(dir) = to.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::copy(scripts.join(script), &to)
                .with_context(|| format!("copying {script} to {}", home.display()))?;
        }
        if healthy(port) {
            println!("== reusing the {name} already serving on port {port}");
            if !extra.is_empty() {
                println!("== (its arguments stay as they are: stop it first to pass {extra:?})");
            }
            return self
                .read_pid(home, port)?
                .with_context(|| format!("{name} serves but its pid file is missing"));
        }
        println!(
            "== starting {name} on port {port} (first run installs it into {}: {})",
            home.display(),
            self.install_note()
        );
        let (var, _) = self.home_var();
        run(Command::new("bash")
            .arg(home.join(self.scripts()[0]))
            .args(extra)
            .env(var, home)
            .env("PORT", port.to_string())
            .current_dir(home))?;
        self.read_pid(home, port)?
            .with_context(|| format!("{} wrote no pid file", self.scripts()[0]))
    }

    /// Stop the engine started on `port`: SIGTERM to the API server, up to 30 s for it and its
    /// children (vLLM: EngineCore, Worker; SGLang: scheduler, detokenizer) to exit, then SIGKILL
    /// to those left; removes the pid file.
    pub fn stop(self, home: &Path, port: u16) -> anyhow::Result<()> {
        let name = self.title();
        let pid_path = self.pid_file(home, port);
        let Some(pid) = self.read_pid(home, port)? else {
            if healthy(port) {
                bail!(
                    "something serves on port {port} but {} is missing: not started by xtask?",
                    pid_path.display()
                );
            }
            println!("== no {name} on port {port}");
            return Ok(());
        };
        if !alive(pid) {
            println!("== {name} (pid {pid}) is not running; removing its pid file");
            fs::remove_file(&pid_path)?;
            return Ok(());
        }
        if !self.is_engine(pid) {
            bail!(
                "pid {pid} from {} is not {name} (cmdline {:?}): not touching it",
                pid_path.display(),
                cmdline(pid)
            );
        }
        // Collected before the signal: once the API server is gone its children are reparented.
        let mut pids = vec![pid];
        pids.extend(descendants(pid));
        println!("== stopping {name} on port {port}: SIGTERM to pid {pid} (tree {pids:?})");
        signal("TERM", &[pid]);
        let start = Instant::now();
        while start.elapsed() < STOP_GRACE && pids.iter().any(|&p| alive(p)) {
            thread::sleep(Duration::from_millis(200));
        }
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            println!(
                "== {name} stopped in {:.1} s",
                start.elapsed().as_secs_f64()
            );
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

    /// Print whether the engine serves on `port`, its processes and where its log is.
    pub fn status(self, home: &Path, port: u16) -> anyhow::Result<()> {
        let serving = healthy(port);
        let pid = self.read_pid(home, port)?;
        println!(
            "{} port {port}: {}",
            self.title(),
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
            None => println!("  no pid file ({})", self.pid_file(home, port).display()),
        }
        println!("  log: {}", self.log_file(home, port).display());
        Ok(())
    }

    fn read_pid(self, home: &Path, port: u16) -> anyhow::Result<Option<u32>> {
        let path = self.pid_file(home, port);
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

    /// The process looks like this engine (its name or command line says so).
    fn is_engine(self, pid: u32) -> bool {
        let slug = self.slug();
        comm(pid).to_ascii_lowercase().contains(slug)
            || cmdline(pid).iter().any(|a| a.contains(slug))
    }
}

fn signal(name: &str, pids: &[u32]) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .args(pids.iter().map(u32::to_string))
        .status();
}

/// `/proc/PID/stat` fields after the command name: state, ppid, ...
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
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
