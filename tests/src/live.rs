//! What the end-to-end tests share: the real engines started through `cargo xtask engine`,
//! `infertrace attach` on them, the workload scripts, and cleanup that runs however a test
//! ends.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use crate::{infertrace_bin, wait_for};

/// The engines the tests start, each through `cargo xtask engine <name>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Vllm,
    Sglang,
}

impl EngineKind {
    fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }

    /// Where it is installed: `VLLM_HOME` / `SGLANG_HOME`, else the xtask default.
    pub fn home(self) -> PathBuf {
        let (var, default) = match self {
            EngineKind::Vllm => ("VLLM_HOME", "/var/tmp/infertrace-vllm"),
            EngineKind::Sglang => ("SGLANG_HOME", "/var/tmp/infertrace-sglang"),
        };
        std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(default))
    }

    fn home_var(self) -> &'static str {
        match self {
            EngineKind::Vllm => "VLLM_HOME",
            EngineKind::Sglang => "SGLANG_HOME",
        }
    }

    fn xtask(
        self,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> std::io::Result<std::process::ExitStatus> {
        Command::new(env!("CARGO"))
            .args(["xtask", "engine", self.name()])
            .args(args)
            .envs(envs.iter().copied())
            .env(self.home_var(), self.home())
            .current_dir(repo())
            .status()
    }
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A script of xtask/scripts/engines/<dir>/.
pub fn script(dir: &str, name: &str) -> PathBuf {
    repo().join("xtask/scripts/engines").join(dir).join(name)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn request(port: u16, head: &str, timeout: Duration) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(timeout)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// GET; the response body.
pub fn get(port: u16, path: &str) -> String {
    request(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
        Duration::from_secs(30),
    )
}

/// POST a JSON body; the response body.
pub fn post(port: u16, path: &str, body: &str) -> String {
    request(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
        Duration::from_secs(60),
    )
}

/// The gauges of vLLM's /metrics that say a request is still in the engine.
pub const VLLM_BUSY: [&str; 2] = ["vllm:num_requests_running", "vllm:num_requests_waiting"];
/// SGLang's.
pub const SGLANG_BUSY: [&str; 2] = ["sglang:num_running_reqs", "sglang:num_queue_reqs"];

/// Stops what it holds when the test ends, however it ends.
#[derive(Default)]
pub struct Cleanup {
    pub children: Vec<Child>,
    /// The engines this test started, each on its port.
    engines: Vec<(EngineKind, u16)>,
    /// Held while this test owns an engine: the tests of one binary share its fixed port and
    /// the machine's cores, so they take turns even under cargo's default parallel threads.
    /// Released after `drop` has stopped the engine (fields drop after the body).
    turn: Option<MutexGuard<'static, ()>>,
}

static ENGINE_TURN: Mutex<()> = Mutex::new(());

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for (kind, port) in &self.engines {
            let _ = kind.xtask(&["stop", "--port", &port.to_string()], &[]);
        }
    }
}

impl Cleanup {
    /// Stop the engine on `port`, if one runs (this test's turn with the engines begins).
    pub fn stop_engine(&mut self, kind: EngineKind, port: u16) {
        if self.turn.is_none() {
            // A test that panicked while holding the turn poisons it; the next one still runs.
            self.turn = Some(ENGINE_TURN.lock().unwrap_or_else(|e| e.into_inner()));
        }
        let stopped = kind.xtask(&["stop", "--port", &port.to_string()], &[]);
        assert!(stopped.is_ok_and(|s| s.success()), "stopping {kind:?}");
    }

    /// A fresh engine on `port` (stopped first, so that nothing is cached from an earlier
    /// run), started with `args` after `--` and `envs`; returns its main process's pid.
    pub fn fresh_engine(
        &mut self,
        kind: EngineKind,
        port: u16,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> String {
        self.stop_engine(kind, port);
        let port_arg = port.to_string();
        self.engines.push((kind, port));
        let mut all = vec!["start", "--port", &port_arg, "--"];
        all.extend_from_slice(args);
        let started = kind.xtask(&all, envs);
        assert!(
            started.is_ok_and(|s| s.success()),
            "starting {kind:?} {args:?}"
        );
        let pid_file = kind.home().join(format!("logs/{}-{port}.pid", kind.name()));
        std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
            .trim()
            .to_owned()
    }
}

/// A running `infertrace attach`. Its stderr is read as it comes (a full pipe would stall the
/// agent) and kept for [`stop`].
pub struct Agent {
    child: Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Where it serves Prometheus.
    pub prom_port: u16,
}

impl Drop for Agent {
    /// A test that failed before [`stop`] leaves no agent attached.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Its stderr so far.
    pub fn log(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// `infertrace attach` writing JSONL to `ours`, its Python profile's folded stacks next to it
/// ([`profile_of`]), and serving Prometheus on `prom_port`; returns once it is attached.
pub fn attach(pid: &str, ours: &Path, prom_port: u16) -> Agent {
    attach_with(pid, ours, prom_port, &[])
}

/// [`attach`] with `extra` arguments.
pub fn attach_with(pid: &str, ours: &Path, prom_port: u16, extra: &[&str]) -> Agent {
    attach_to(&[pid], ours, prom_port, extra)
}

/// [`attach_with`] to several servers at once (one `--pid` each).
///
/// With `INFERTRACE_TEST_RECORD` set, `infertrace record` instead, which also writes the raw
/// events next to `ours` ([`recording_of`]): a failing run can then be replayed and studied.
pub fn attach_to(pids: &[&str], ours: &Path, prom_port: u16, extra: &[&str]) -> Agent {
    let recording = recording_of(ours).display().to_string();
    let mut command = match std::env::var_os("INFERTRACE_TEST_RECORD") {
        Some(_) => vec!["record", "--recording", &recording],
        None => vec!["attach"],
    };
    command.extend(pids.iter().flat_map(|pid| ["--pid", pid]));
    start_agent(&command, ours, prom_port, extra, &[])
}

/// Where [`attach_to`] keeps the recording of a run when asked to.
pub fn recording_of(ours: &Path) -> PathBuf {
    ours.with_extension("recording")
}

/// `infertrace run` (the node agent) with `extra` arguments and `envs`, and the outputs of
/// [`attach`].
pub fn run_agent(ours: &Path, prom_port: u16, extra: &[&str], envs: &[(&str, &str)]) -> Agent {
    start_agent(&["run"], ours, prom_port, extra, envs)
}

/// `infertrace COMMAND...` with the outputs of [`attach`]; returns once it is attached.
fn start_agent(
    command: &[&str],
    ours: &Path,
    prom_port: u16,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Agent {
    // Why a request's SGLang loop view was left out, should a test fail on it.
    let log = std::env::var("INFERTRACE_LOG")
        .unwrap_or_else(|_| "info,infertrace::engines::sglang::scheduler_loop=debug".into());
    let mut child = Command::new(infertrace_bin())
        .env("INFERTRACE_LOG", log)
        .envs(envs.iter().copied())
        .args(command)
        .args(["--metrics-interval", "1", "--output"])
        .arg(format!("jsonl:{}", ours.display()))
        .arg("--profile-output")
        .arg(profile_of(ours))
        .args(["--prometheus", &format!("127.0.0.1:{prom_port}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting infertrace attach");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("the agent's stderr");
    let kept = stderr.clone();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            let text = String::from_utf8_lossy(&chunk[..n]);
            kept.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&text);
        }
    });
    let mut agent = Agent {
        child,
        stderr,
        reader: Some(reader),
        prom_port,
    };
    // session.rs logs this once every program is attached and every process scanned.
    let attached = wait_for(Duration::from_secs(60), || {
        agent.log().contains("attached: tracing")
            || agent.child.try_wait().is_ok_and(|s| s.is_some())
    });
    let log = agent.log();
    assert!(
        attached && log.contains("attached: tracing"),
        "infertrace did not attach within 60 s:\n{log}"
    );
    agent
}

/// Wait (at most a minute) until the agent has counted as many finished requests as the
/// engine on `engine_port`: the agent's `ours` counter on its Prometheus endpoint equals the
/// engine's `theirs` (above zero) on its `/metrics`. Should it never, the comparison that follows says
/// what differs.
pub fn wait_until_traced(agent: &Agent, engine_port: u16, ours: &str, theirs: &str) {
    let total = |port, name| crate::vllm_truth::prom(&get(port, "/metrics"), name, &[]);
    let caught_up = wait_for(Duration::from_secs(60), || {
        let theirs = total(engine_port, theirs);
        theirs > 0.0 && total(agent.prom_port, ours) == theirs
    });
    if !caught_up {
        eprintln!("the agent's {ours} never reached the engine's {theirs} in 60 s");
    }
}

/// Wait (at most a minute) until the agent has reported every request it saw: its
/// `infertrace_traces_total` (written every metrics interval, 1 s here) above zero and the
/// same over a second and a half. For an idle engine; a busy one never settles.
pub fn wait_until_settled(agent: &Agent) {
    let traces = || {
        crate::vllm_truth::prom(
            &get(agent.prom_port, "/metrics"),
            "infertrace_traces_total",
            &[],
        )
    };
    let mut last = traces();
    let settled = wait_for(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(1500));
        let now = traces();
        let same = now > 0.0 && now == last;
        last = now;
        same
    });
    if !settled {
        eprintln!("the agent's trace count still moved after 60 s");
    }
}

/// The spans in the JSONL `ours` whose name contains `text`.
pub fn count_spans(ours: &Path, text: &str) -> usize {
    crate::vllm_truth::json_lines(ours)
        .iter()
        .filter(|v| v["name"].as_str().is_some_and(|n| n.contains(text)))
        .count()
}

/// The `llm_request` spans of `ours` that vLLM's own tracing exports too: all but those of
/// requests the client aborted, which vLLM ends without a span (waiting for those held every
/// run for the whole export wait).
pub fn count_llm_requests_vllm_exports(ours: &Path) -> usize {
    crate::vllm_truth::json_lines(ours)
        .iter()
        .filter(|v| v["name"] == "llm_request")
        .filter(|v| v["attributes"]["infertrace.finish_reason"] != "abort")
        .count()
}

/// Where [`attach`] writes the folded Python stacks of a run whose JSONL goes to `ours`.
pub fn profile_of(ours: &Path) -> PathBuf {
    ours.with_extension("folded")
}

/// Stacks of the Python profile of a run (see [`attach`]) that pass through `function` (a
/// qualified name) on a thread named `thread` (its comm; None: any thread).
pub fn sampled_stacks(ours: &Path, thread: Option<&str>, function: &str) -> usize {
    let folded = std::fs::read_to_string(profile_of(ours)).expect("the folded profile");
    folded
        .lines()
        .filter(|l| thread.is_none_or(|t| l.contains(&format!(";{t} ("))))
        .filter(|l| l.contains(&format!("{function} (")))
        .count()
}

/// The Python samples that infertrace put on engine iterations (vLLM's iteration events,
/// SGLang's decode_loop spans): how many iterations carry some, and the total of each
/// `infertrace.python.samples*` attribute.
pub fn iteration_samples(ours: &Path) -> (usize, std::collections::BTreeMap<String, u64>) {
    let mut totals = std::collections::BTreeMap::new();
    let mut iterations = 0;
    let text = std::fs::read_to_string(ours).expect("infertrace's JSONL output");
    for line in text.lines() {
        let Ok(span) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let events = span["events"].as_array().into_iter().flatten();
        let attribute_sets = std::iter::once(&span["attributes"])
            .chain(events.map(|e| &e["attributes"]))
            .filter_map(serde_json::Value::as_object);
        for attributes in attribute_sets {
            let mut sampled = false;
            for (key, value) in attributes {
                if key.starts_with("infertrace.python.samples") {
                    sampled = true;
                    *totals.entry(key.clone()).or_default() += value.as_u64().unwrap_or(0);
                }
            }
            iterations += usize::from(sampled);
        }
    }
    (iterations, totals)
}

/// The labels (`name [role]`) of the threads in the run's Python profile that carry a role.
pub fn thread_roles(ours: &Path) -> std::collections::BTreeSet<String> {
    let folded = std::fs::read_to_string(profile_of(ours)).expect("the folded profile");
    folded
        .lines()
        .filter_map(|l| l.split(';').nth(1))
        .filter(|label| label.contains(" ["))
        .map(|label| label.rsplit_once(" (").map_or(label, |(l, _)| l).to_owned())
        .collect()
}

/// SIGTERM (which flushes everything); returns the agent's stderr.
pub fn stop(mut agent: Agent) -> String {
    let term = Command::new("kill")
        .args(["-TERM", &agent.child.id().to_string()])
        .status();
    assert!(term.is_ok_and(|s| s.success()), "kill -TERM infertrace");
    let status = agent.child.wait().unwrap();
    if let Some(reader) = agent.reader.take() {
        let _ = reader.join();
    }
    let stderr = agent.log();
    assert!(status.success(), "{stderr}");
    stderr
}

/// `workload.py` against `port` (model `tiny`, seed 0) with `extra` arguments, its record
/// written to `client`.
pub fn workload(port: u16, client: &Path, extra: &[&str]) {
    let status = Command::new("python3")
        .arg(script("vllm", "workload.py"))
        .args([
            "--base",
            &format!("http://127.0.0.1:{port}"),
            "--model",
            "tiny",
        ])
        .args(["--seed", "0"])
        .args(extra)
        .arg("--out")
        .arg(client)
        .status()
        .expect("running workload.py");
    assert!(status.success(), "workload.py failed");
}

/// One client record (workload.py's `--out`) listing the requests of several runs.
pub fn merge_client_records(parts: &[PathBuf], out: &Path) {
    let mut requests = Vec::new();
    for part in parts {
        let text = std::fs::read_to_string(part).expect("reading a client record");
        let mut record: serde_json::Value = serde_json::from_str(&text).expect("client JSON");
        if let Some(r) = record["requests"].as_array_mut() {
            requests.append(r);
        }
    }
    let merged = serde_json::json!({ "requests": requests });
    std::fs::write(out, merged.to_string()).expect("writing the client record");
}

/// A per-process scratch directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infertrace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The OTLP receiver (`otlp_receiver.py --defer`): keeps what the engine exports during the
/// run and writes it to its file when [`OtlpReceiver::write_out`] asks.
pub struct OtlpReceiver {
    pub grpc_port: u16,
    http_port: u16,
}

impl OtlpReceiver {
    /// Wait (at most `timeout`) until the engine has exported at least `at_least` spans whose
    /// name contains `text` (its exporter sends in batches, every 0.5 s to 5 s); whether it has.
    pub fn wait_for_spans(&self, text: &str, at_least: usize, timeout: Duration) -> bool {
        let path = format!("/count?contains={}", text.replace(' ', "%20"));
        let got = wait_for(timeout, || {
            get(self.http_port, &path)
                .trim()
                .parse::<usize>()
                .is_ok_and(|n| n >= at_least)
        });
        if !got {
            eprintln!("the engine exported fewer than {at_least} '{text}' spans in {timeout:?}");
        }
        got
    }

    /// Write everything received so far (one JSON line per span) and wait until it is written.
    pub fn write_out(&self) {
        let answer = post(self.http_port, "/flush", "");
        assert!(answer.contains("written"), "OTLP receiver flush: {answer}");
    }
}

/// Start the OTLP receiver writing to `out` (see [`OtlpReceiver`]).
pub fn otlp_receiver(cleanup: &mut Cleanup, out: &Path) -> OtlpReceiver {
    let (http, grpc) = (free_port(), free_port());
    let receiver = Command::new(crate::python())
        .arg(script("vllm", "otlp_receiver.py"))
        .arg(out)
        .args([http.to_string(), grpc.to_string()])
        .arg("--defer")
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the OTLP receiver");
    cleanup.children.push(receiver);
    OtlpReceiver {
        grpc_port: grpc,
        http_port: http,
    }
}

/// The lines of an agent's JSONL `ours` that are of the server whose pid is `pid` (its spans,
/// and in each metrics snapshot its own series and the agent's), written to `out`: what the
/// agent would have written had it traced that server alone.
pub fn only_instance(ours: &Path, pid: &str, out: &Path) {
    let of_pid = |resource: &serde_json::Value| {
        resource["service.instance.id"]
            .as_str()
            .is_none_or(|id| id.rsplit(':').next() == Some(pid))
    };
    let mut kept = String::new();
    for line in std::fs::read_to_string(ours)
        .expect("reading the agent's JSONL")
        .lines()
    {
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        match value["type"].as_str() {
            Some("span") if !of_pid(&value["resource"]) => continue,
            Some("metrics") => {
                if let Some(samples) = value["samples"].as_array_mut() {
                    samples.retain(|s| of_pid(&s["resource"]));
                }
            }
            _ => {}
        }
        kept.push_str(&value.to_string());
        kept.push('\n');
    }
    std::fs::write(out, kept).expect("writing one server's lines");
}

/// Wait until the server on `port` has nothing running or queued (each of `gauges` reads 0 on
/// its /metrics), so that every request the client started has ended in the engine before
/// the agent stops; panics after two minutes.
pub fn wait_until_idle(port: u16, gauges: &[&str]) {
    let busy = || -> Vec<String> {
        get(port, "/metrics")
            .lines()
            .filter(|l| gauges.iter().any(|g| l.starts_with(&format!("{g}{{"))))
            .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) != Some(0.0))
            .map(str::to_owned)
            .collect()
    };
    let idle = wait_for(Duration::from_secs(120), || busy().is_empty());
    assert!(idle, "port {port} still busy after 120 s: {:?}", busy());
}

/// A vLLM on `port` set up for the comparison runs: it queues (4 seqs), chunks prefills (256
/// tokens) and preempts (18 KV blocks of 128 tokens), and sends its own spans to `receiver`.
/// Returns the API server's pid.
pub fn start_compared_vllm(cleanup: &mut Cleanup, port: u16, receiver: &OtlpReceiver) -> String {
    let otlp = format!("http://127.0.0.1:{}", receiver.grpc_port);
    cleanup.fresh_engine(
        EngineKind::Vllm,
        port,
        &[
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "256",
            "--otlp-traces-endpoint",
            &otlp,
        ],
        &[("KV_BLOCKS", "18")],
    )
}

/// SGLang's arguments for the comparison runs: its metrics on, and a statistics report every
/// 5 decode batches (SGLang's default: 40), for more of them.
pub const SGLANG_COMPARED_ARGS: [&str; 3] = ["--enable-metrics", "--decode-log-interval", "5"];

/// An SGLang on `port` with `args` and `envs`, its own tracing on (level 3) and sent to
/// `receiver`. Returns its main process's pid.
pub fn start_traced_sglang(
    cleanup: &mut Cleanup,
    port: u16,
    receiver: &OtlpReceiver,
    args: &[&str],
    envs: &[(&str, &str)],
) -> String {
    let otlp = format!("127.0.0.1:{}", receiver.grpc_port);
    let mut all_envs = vec![
        ("TRACE", "1"),
        ("OTLP", otlp.as_str()),
        ("SGLANG_TRACE_LEVEL", "3"),
    ];
    all_envs.extend_from_slice(envs);
    cleanup.fresh_engine(EngineKind::Sglang, port, args, &all_envs)
}
