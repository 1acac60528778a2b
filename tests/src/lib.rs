//! Helpers for infertrace's root integration tests: start real processes, trace them with the
//! real eBPF programs, collect what the decoders produced.
pub mod cuda;
pub mod live;
pub mod sglang_truth;
pub mod vllm_truth;

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use infertrace::{
    capture::{CaptureEvent, kernel::KernelOptions, live::LiveCapture},
    decode::{
        flows::{Decoded, FlowStats, FlowTable},
        zmtp::ZmtpMessage,
    },
};

/// ZMTP messages decoded in one direction, in order, with the process that sent or received
/// them.
pub fn zmtp_messages(decoded: &[Decoded], outgoing: bool) -> Vec<(u32, &ZmtpMessage)> {
    decoded
        .iter()
        .filter_map(|d| match d {
            Decoded::Zmtp {
                tgid,
                outgoing: o,
                message,
                ..
            } if *o == outgoing => Some((*tgid, message)),
            _ => None,
        })
        .collect()
}

/// The optimized `infertrace` binary of this target directory (`<target>/release/infertrace`),
/// whatever profile the tests themselves were built with. The live tests measure how close the
/// agent's instants come to the engines' own, on a 2-core machine where every millisecond of
/// the agent's CPU is taken from the engine's threads: they measure the build users run, not a
/// debug build that needs three times the CPU (2.1 s against 0.67 s in the same PD decode run;
/// 4 s in a pickle run whose p99s it pushed past their bounds). `cargo test` builds only the
/// library of the
/// `infertrace` package, so the binary is built (or brought up to date) once per test process
/// with `cargo build --release -p infertrace`.
/// Poll `done` every 50 ms until it holds or `timeout` has passed; whether it held.
pub fn wait_for(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn infertrace_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("path of the test binary");
        let target_dir = exe
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .expect("the test binary lives in <target>/<profile>/deps")
            .to_path_buf();
        let bin = target_dir.join("release").join("infertrace");
        let build = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--release", "-p", "infertrace"])
            .args(["--bin", "infertrace"])
            .arg("--target-dir")
            .arg(&target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("running cargo build --release -p infertrace");
        assert!(
            build.status.success() && bin.is_file(),
            "could not build {} ({}): run `cargo build --release -p infertrace` first\n{}",
            bin.display(),
            build.status,
            String::from_utf8_lossy(&build.stderr)
        );
        bin
    })
}

/// Path of a file in tests/fixtures.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The Python interpreter used for fixture processes (`INFERTRACE_TEST_PYTHON` or python3).
pub fn python() -> String {
    std::env::var("INFERTRACE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A child process driven line by line over stdin/stdout; killed when dropped.
pub struct Script {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Script {
    /// A Python fixture script.
    pub fn start(args: &[&str]) -> Self {
        let mut python = Command::new(python());
        python.args(args);
        Self::spawn(python)
    }

    /// Any program that talks line by line.
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fixture program");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Next line the script printed (panics if it exits first).
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .expect("read fixture stdout");
        assert!(n > 0, "fixture exited early");
        line.trim_end().to_string()
    }

    pub fn send_line(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write fixture stdin");
        self.stdin.flush().expect("flush");
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The real capture pipeline, pumped by the test.
pub struct Tracer {
    live: LiveCapture,
    flows: FlowTable,
    pub decoded: Vec<Decoded>,
    pub events: Vec<CaptureEvent>,
}

impl Tracer {
    pub fn attach(pids: &[u32]) -> Self {
        Self::attach_with(pids, &KernelOptions::default())
    }

    pub fn attach_with(pids: &[u32], options: &KernelOptions) -> Self {
        let (live, initial) = LiveCapture::attach(pids, options).expect("attach (run as root)");
        let mut tracer = Self {
            live,
            // As the agent runs by default: streamed content is elided.
            flows: FlowTable::eliding_content(),
            decoded: Vec::new(),
            events: Vec::new(),
        };
        tracer.consume(initial);
        tracer
    }

    fn consume(&mut self, events: Vec<CaptureEvent>) {
        for event in events {
            self.decoded.extend(self.flows.handle(event.clone()));
            self.events.push(event);
        }
        for (tgid, template) in self.flows.take_template_changes() {
            self.live.set_sse_template(tgid, &template);
        }
    }

    /// Drain the ring buffer until it is empty.
    pub fn pump(&mut self) {
        loop {
            let mut events = Vec::new();
            let more = self.live.poll(&mut events);
            self.consume(events);
            if !more {
                break;
            }
        }
    }

    /// Run `action` on another thread while draining the ring buffer here, as the agent does
    /// live: /proc is consulted while the processes and fds still exist.
    pub fn pump_during<T: Send>(&mut self, action: impl FnOnce() -> T + Send) -> T {
        self.pump_every_during(Duration::from_millis(5), action)
    }

    /// Like [`Tracer::pump_during`], draining only every `period` (a slow reader).
    pub fn pump_every_during<T: Send>(
        &mut self,
        period: Duration,
        action: impl FnOnce() -> T + Send,
    ) -> T {
        std::thread::scope(|scope| {
            let handle = scope.spawn(action);
            while !handle.is_finished() {
                self.pump();
                std::thread::sleep(period);
            }
            handle.join().expect("test action panicked")
        })
    }

    /// Pump until `done` holds for the decoded messages, or the timeout passes.
    pub fn pump_until(&mut self, timeout: Duration, done: impl Fn(&[Decoded]) -> bool) -> bool {
        let start = Instant::now();
        loop {
            self.pump();
            if done(&self.decoded) {
                return true;
            }
            if start.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What was captured, for assertion messages: fds classified and IO bytes per flow.
    pub fn describe(&self) -> String {
        use std::collections::BTreeMap;
        let mut io: BTreeMap<(u32, u32, u8), (u64, u64)> = BTreeMap::new();
        let mut lines = Vec::new();
        for event in &self.events {
            match event {
                CaptureEvent::Fd { tgid, fd, kind } => {
                    lines.push(format!("fd {tgid}/{fd}: {kind:?}"))
                }
                CaptureEvent::Process(p) => lines.push(format!("process {} {}", p.pid, p.comm)),
                CaptureEvent::Kernel(infertrace::capture::Record::Io { io: r, payload }) => {
                    let e = io.entry((r.header.tgid, r.fd, r.direction)).or_default();
                    e.0 += 1;
                    e.1 += payload.len() as u64;
                    if e.0 <= 12 {
                        lines.push(format!(
                            "  rec {}/{} dir={} seq={} off={} len={} ret={} flags={:#x}",
                            r.header.tgid,
                            r.fd,
                            r.direction,
                            r.seq,
                            r.offset,
                            r.len,
                            r.ret,
                            r.flags
                        ));
                    }
                }
                CaptureEvent::Kernel(record) => lines.push(format!("{record:?}")),
                _ => {}
            }
        }
        for ((tgid, fd, dir), (n, bytes)) in io {
            lines.push(format!("io {tgid}/{fd} dir={dir}: {n} records, {bytes} B"));
        }
        lines.push(format!(
            "{} decoded, stats {:?}",
            self.decoded.len(),
            self.flows.stats()
        ));
        lines.join("\n")
    }

    /// The CUDA driver watcher: processes probed, attach failures and the last one's message.
    pub fn cuda(&self) -> &infertrace::capture::cuda_watch::CudaWatch {
        &self.live.cuda
    }

    /// The kernel's loss counters as of the last drain.
    pub fn kernel_counters(&self) -> infertrace::capture::KernelCounters {
        self.events
            .iter()
            .rev()
            .find_map(|e| match e {
                CaptureEvent::Counters(c) => Some(*c),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// The kernel's counters now.
    pub fn kernel_counters_now(&mut self) -> infertrace::capture::KernelCounters {
        match self.live.counters() {
            CaptureEvent::Counters(counters) => counters,
            other => panic!("not counters: {other:?}"),
        }
    }

    /// Pump a few more times (for anything still in flight) and close every flow.
    pub fn finish(mut self) -> (Vec<Decoded>, FlowStats) {
        for _ in 0..5 {
            self.pump();
            std::thread::sleep(Duration::from_millis(10));
        }
        let end = self.flows.finish(u64::MAX);
        self.decoded.extend(end);
        (self.decoded, self.flows.stats())
    }
}
