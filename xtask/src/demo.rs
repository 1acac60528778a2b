//! `cargo xtask demo`: the main job on a fresh machine. Installs the real vLLM CPU build and a
//! tiny local model (first run only, ~6 min), starts it, attaches infertrace to its API
//! server, sends a few requests (one with a 1,600-token prompt), and shows what infertrace
//! printed: each HTTP exchange and each ZeroMQ message between the API server and EngineCore.
use std::{
    env, fs,
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{root, run};

const SCRIPTS: &[&str] = &["install-venv.sh", "make_tiny_model.py", "run-tiny-vllm.sh"];

pub struct DemoOptions {
    pub port: u16,
    pub keep_engine: bool,
}

pub fn demo(options: &DemoOptions) -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let home = vllm_home();
    let api_pid = start_vllm(&root, &home, options.port)?;
    println!("== vLLM API server pid {api_pid}; attaching infertrace for 25 s");
    let mut agent = Command::new(root.join("target/release/infertrace"))
        .args(["attach", "--pid", &api_pid.to_string(), "--duration", "25"])
        .spawn()
        .context("starting infertrace")?;
    thread::sleep(Duration::from_secs(3));
    let result = send_requests(options.port);
    wait(&mut agent, Duration::from_secs(60))?;
    if !options.keep_engine {
        println!("== stopping vLLM (pid {api_pid}); --keep-engine leaves it running");
        let _ = Command::new("kill").arg(api_pid.to_string()).status();
    }
    result
}

/// Where the engine's venv, model and logs live (`VLLM_HOME`).
fn vllm_home() -> PathBuf {
    env::var_os("VLLM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/infertrace-vllm"))
}

/// Install (once) and start the tiny vLLM; returns the API server's pid.
fn start_vllm(root: &std::path::Path, home: &std::path::Path, port: u16) -> anyhow::Result<u32> {
    fs::create_dir_all(home)?;
    for script in SCRIPTS {
        fs::copy(
            root.join("xtask/scripts/engines/vllm").join(script),
            home.join(script),
        )
        .with_context(|| format!("copying {script} to {}", home.display()))?;
    }
    let pid_file = home.join(format!("logs/vllm-{port}.pid"));
    if healthy(port) {
        let pid = fs::read_to_string(&pid_file).unwrap_or_default();
        println!("== reusing the vLLM already serving on port {port}");
        return pid
            .trim()
            .parse()
            .context("vLLM serves but its pid file is missing");
    }
    println!(
        "== starting vLLM (first run installs it into {}: ~6 min)",
        home.display()
    );
    run(Command::new("bash")
        .arg(home.join("run-tiny-vllm.sh"))
        .env("VLLM_HOME", home)
        .env("PORT", port.to_string())
        .current_dir(home))?;
    let pid =
        fs::read_to_string(&pid_file).with_context(|| format!("reading {}", pid_file.display()))?;
    pid.trim().parse().context("parsing the vLLM pid")
}

fn healthy(port: u16) -> bool {
    http(port, "GET", "/health", "")
        .map(|r| r.starts_with("HTTP/1.1 200"))
        .unwrap_or(false)
}

fn send_requests(port: u16) -> anyhow::Result<()> {
    let long_prompt: String = (0..140)
        .map(|i| format!("fox{i} jumps over the lazy dog {} times ", i * 7))
        .collect();
    let requests = [
        ("/v1/completions", r#"{"model":"tiny","prompt":"warm up","max_tokens":2}"#.to_string()),
        (
            "/v1/completions",
            format!(r#"{{"model":"tiny","prompt":"{long_prompt}","max_tokens":4}}"#),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"tiny","messages":[{"role":"user","content":"Hello there"}],"max_tokens":8,"stream":true}"#.to_string(),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"tiny","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":8}"#.to_string(),
        ),
    ];
    for (path, body) in requests {
        let response = http(port, "POST", path, &body)?;
        let usage = response
            .find("\"prompt_tokens\":")
            .map(|i| &response[i..])
            .unwrap_or("");
        let usage: String = usage.chars().take_while(|&c| c != ',').collect();
        println!(
            "== client: POST {path} -> {} {usage}",
            response.lines().next().unwrap_or("")
        );
    }
    Ok(())
}

/// One HTTP/1.1 request with `Connection: close`; returns the whole response.
fn http(port: u16, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
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

fn wait(child: &mut Child, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("infertrace exited with {status}");
            }
            return Ok(());
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            bail!("infertrace did not stop within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}
