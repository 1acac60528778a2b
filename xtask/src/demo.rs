//! `cargo xtask demo`: the main job on a fresh machine. Installs the real vLLM CPU build and a
//! tiny local model (first run only, ~6 min), starts it, attaches infertrace to its API
//! server, sends a few requests (one with a 1,600-token prompt), and shows what infertrace
//! printed: each HTTP exchange and each ZeroMQ message between the API server and EngineCore.
use std::{
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    engine::{Engine, http},
    root, run,
};

pub struct DemoOptions {
    pub port: u16,
    pub keep_engine: bool,
}

pub fn demo(options: &DemoOptions) -> anyhow::Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "-p", "infertrace"])
        .current_dir(&root))?;
    let home = Engine::Vllm.home();
    let api_pid = Engine::Vllm.start(&root, &home, options.port, &[])?;
    println!("== vLLM API server pid {api_pid}; attaching infertrace for 25 s");
    let mut agent = Command::new(root.join("target/release/infertrace"))
        .args(["attach", "--pid", &api_pid.to_string(), "--duration", "25"])
        .spawn()
        .context("starting infertrace")?;
    thread::sleep(Duration::from_secs(3));
    let result = send_requests(options.port);
    wait(&mut agent, Duration::from_secs(60))?;
    if options.keep_engine {
        println!(
            "== vLLM keeps running; `cargo xtask engine vllm stop --port {}` stops it",
            options.port
        );
    } else {
        println!("== stopping vLLM (--keep-engine leaves it running)");
        Engine::Vllm.stop(&home, options.port)?;
    }
    result
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
