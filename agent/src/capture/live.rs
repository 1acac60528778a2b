//! Live capture: the kernel side plus the /proc look-ups that only make sense while the
//! processes exist (is a new task a thread? what is this fd?). Their answers become events
//! too, so a recording holds everything replay needs.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::bail;
use infertrace_common::SseTemplate;

use super::{
    CaptureEvent, ProcessInfo, Record,
    clock::{self, ClockWatch},
    cuda_watch::{CudaDriver, CudaWatch},
    kernel::{KernelCapture, KernelOptions},
    pickle_watch::{CpythonPickle, PickleWatch},
    python_watch::PythonWatch,
    records,
    zmq_watch::{Libzmq, ZmqWatch},
};
use crate::{
    discover::{
        engine::{self, Role},
        procfs,
        sockets::{FdKind, SocketLookup},
    },
    engines::{
        self, Engine,
        engine::{decoded_kind_of_non_engine, default_fd_action},
    },
};

/// Records read from the ring buffer before their /proc look-ups are done.
const BATCH: usize = 1024;
/// How often the kernel's counters are read: one map lookup per counter per CPU, 8 % of the
/// agent's CPU under an SGLang benchmark when read at every batch (BENCHMARKS.md).
const COUNTERS_EVERY: Duration = Duration::from_millis(100);

/// Counts of what the live layer itself could not handle.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveStats {
    pub bad_records: u64,
    pub vanished_fds: u64,
}

pub struct LiveCapture {
    kernel: KernelCapture,
    /// Traced processes' CUDA drivers: found, probed, or looked for again.
    pub cuda: CudaWatch,
    /// Traced processes' libzmq: its sends probed.
    pub zmq: ZmqWatch,
    /// SGLang main processes' and DP controllers' `pickle.dumps`: when each request's
    /// dispatch began.
    pub pickle: PickleWatch,
    /// Traced Python processes: sampled, their stacks named.
    pub python: PythonWatch,
    roles: Roles,
    sockets: SocketLookup,
    clock: ClockWatch,
    counters_read: Option<Instant>,
    /// The records of the batch being read (kept for its capacity).
    parsed: Vec<Record>,
    pub stats: LiveStats,
}

impl LiveCapture {
    /// Load the programs and start tracing `pids` and all their current descendants.
    /// Returns the capture and a Process event per traced process.
    pub fn attach(
        pids: &[u32],
        options: &KernelOptions,
    ) -> anyhow::Result<(Self, Vec<CaptureEvent>)> {
        let own = std::process::id();
        for &pid in pids {
            if pid == own {
                bail!("pid {pid} is infertrace itself; give the pid of an engine process");
            }
            if !procfs::exists(pid) {
                bail!("pid {pid} not found: no such process (check `infertrace discover`)");
            }
        }
        let mut kernel = KernelCapture::load(options)?;
        let python = PythonWatch::start(options.python, &mut kernel);
        let mut live = Self {
            cuda: CudaWatch::new(CudaDriver(options.cuda)),
            zmq: ZmqWatch::new(Libzmq {
                off: options.no_zmq_probe,
            }),
            pickle: PickleWatch::new(CpythonPickle {
                off: options.no_pickle_probe,
            }),
            python,
            kernel,
            roles: Roles::default(),
            sockets: SocketLookup::default(),
            clock: ClockWatch::new(clock::realtime_minus_monotonic().1),
            counters_read: None,
            parsed: Vec::new(),
            stats: LiveStats::default(),
        };
        let mut events = Vec::new();
        for &pid in pids {
            events.extend(live.follow(pid)?);
            // A process that exited while we attached: say so plainly instead of tracing nothing.
            if !procfs::exists(pid) {
                bail!("pid {pid} exited while infertrace was attaching");
            }
        }
        Ok((live, events))
    }

    /// Start tracing `pid` and its current descendants (node mode calls this as servers
    /// start). The process itself is tracked first, so that a child it forks meanwhile is
    /// tracked by the kernel. Returns a Process event per traced process.
    pub fn follow(&mut self, pid: u32) -> anyhow::Result<Vec<CaptureEvent>> {
        self.kernel.track(pid)?;
        let mut events = Vec::new();
        for member in procfs::process_tree(pid) {
            self.kernel.track(member)?;
            self.cuda.watch(member);
            self.zmq.watch(member);
            self.pickle.watch(member);
            self.python.watch(member, &mut self.kernel);
            if let Some(info) = process_info(member) {
                events.push(CaptureEvent::Process(info));
            }
        }
        Ok(events)
    }

    /// Read one batch of records from the ring buffer into `out`, each preceded by the /proc
    /// answers it triggered (a new fd is classified while it still exists, even under a flood),
    /// then the kernel counters (at most every [`COUNTERS_EVERY`]) and a Tick. Returns true when the batch was full: more records
    /// are probably waiting.
    ///
    /// A Tick per batch, not per empty ring: under sustained load the ring never empties, and
    /// the decoders must still give up on lost records after a bounded wait.
    pub fn poll(&mut self, out: &mut Vec<CaptureEvent>) -> bool {
        self.cuda.look(&mut self.kernel);
        self.zmq.look(&mut self.kernel);
        self.pickle.look(&mut self.kernel);
        // Reused: growing a fresh vector by doubling, a batch at a time, was 5 % of the
        // agent's CPU on a vLLM load.
        let mut parsed = std::mem::take(&mut self.parsed);
        let mut bad = 0;
        let n = self
            .kernel
            .drain(BATCH, |bytes| match records::parse(bytes) {
                Ok(record) => parsed.push(record),
                Err(e) => {
                    bad += 1;
                    tracing::warn!("kernel record not understood: {e}");
                }
            });
        self.stats.bad_records += bad;
        for record in parsed.drain(..) {
            self.react(&record, out);
            out.push(CaptureEvent::Kernel(record));
        }
        self.parsed = parsed;
        if self
            .counters_read
            .is_none_or(|at| at.elapsed() >= COUNTERS_EVERY)
        {
            out.push(self.counters());
        }
        if let Some((monotonic_ns, realtime_minus_monotonic_ns)) = self.clock.look() {
            out.push(CaptureEvent::Clock {
                monotonic_ns,
                realtime_minus_monotonic_ns,
            });
        }
        out.push(CaptureEvent::Tick);
        n == BATCH
    }

    /// Side effects a record asks for: classify a new fd, drop threads, forget exited processes.
    fn react(&mut self, record: &Record, out: &mut Vec<CaptureEvent>) {
        match record {
            Record::NewFd {
                header,
                fd,
                generation,
            } => {
                let tgid = header.tgid;
                match self.sockets.classify(tgid, *fd) {
                    Some(kind) => {
                        // Asked per fd, not once per process: a forked child shares its
                        // parent's title until it sets its own.
                        let kind = decoded_kind(kind, *fd, self.roles.of(tgid));
                        // What /proc shows may already be a later incarnation of the fd
                        // number: the generation makes the kernel drop the decision then.
                        let decision = fd_decision(&kind, self.roles.of(tgid));
                        if let Err(e) = self.kernel.classify(tgid, *fd, *generation, decision) {
                            tracing::warn!("{e:#}");
                        }
                        out.push(CaptureEvent::Fd {
                            tgid,
                            fd: *fd,
                            kind,
                        });
                    }
                    // Closed before we looked (the kernel forgets it on close, so there is
                    // no decision to make): what was captured is decoded by its content.
                    None => {
                        self.stats.vanished_fds += 1;
                        out.push(CaptureEvent::Fd {
                            tgid,
                            fd: *fd,
                            kind: FdKind::Vanished,
                        });
                    }
                }
            }
            Record::Fork { child, .. } => {
                // The fork tracepoint also fires for new threads; only processes stay tracked.
                match procfs::tgid_of(*child) {
                    Some(tgid) if tgid == *child => {
                        self.cuda.watch(*child);
                        self.zmq.watch(*child);
                        self.pickle.watch(*child);
                        self.python.watch(*child, &mut self.kernel);
                        if let Some(info) = process_info(*child) {
                            out.push(CaptureEvent::Process(info));
                        }
                    }
                    _ => self.kernel.untrack(*child),
                }
            }
            Record::Exec { header, .. } => {
                self.roles.forget(header.tgid);
                self.cuda.forget(header.tgid, &mut self.kernel);
                self.cuda.watch(header.tgid);
                self.zmq.forget(header.tgid, &mut self.kernel);
                self.zmq.watch(header.tgid);
                self.pickle.forget(header.tgid, &mut self.kernel);
                self.pickle.watch(header.tgid);
                self.python.forget(header.tgid, &mut self.kernel);
                self.python.watch(header.tgid, &mut self.kernel);
                if let Some(info) = process_info(header.tgid) {
                    out.push(CaptureEvent::Process(info));
                }
            }
            Record::Exit { header } => {
                self.roles.forget(header.tgid);
                self.cuda.forget(header.tgid, &mut self.kernel);
                self.zmq.forget(header.tgid, &mut self.kernel);
                self.pickle.forget(header.tgid, &mut self.kernel);
                self.python.forget(header.tgid, &mut self.kernel);
                self.sockets.forget(header.tgid);
                self.kernel.forget_process(header.tgid);
            }
            Record::LibraryMapped { header } => {
                self.cuda.loaded(header.tgid);
                self.zmq.loaded(header.tgid);
                self.pickle.loaded(header.tgid);
            }
            // Node mode's business (is it an engine starting?), not the capture's.
            Record::Spawn { .. }
            | Record::Close { .. }
            | Record::Io { .. }
            | Record::Poll { .. }
            | Record::CudaStep(_)
            | Record::CudaCall(_)
            | Record::CudaName(_)
            | Record::ZmqSend(_)
            | Record::MailboxPoll(_)
            | Record::PickleDumps { .. }
            | Record::SseBatch { .. } => {}
            Record::PySample(sample) => self.python.sample(sample, &mut self.kernel, out),
        }
    }

    /// Let the kernel report process `tgid`'s streamed content writes that match `template`
    /// by time and size only. Failing leaves them copied.
    pub fn set_sse_template(&mut self, tgid: u32, template: &SseTemplate) {
        if let Err(e) = self.kernel.set_sse_template(tgid, template) {
            tracing::warn!("{e:#}: its streamed content is copied whole");
        }
    }

    /// The kernel's counters now (the session's last word on them, at the end).
    pub fn counters(&mut self) -> CaptureEvent {
        self.counters_read = Some(Instant::now());
        CaptureEvent::Counters(self.kernel.counters())
    }

    /// The ring buffer's fd, readable when the kernel forces a wakeup (buffer filling up).
    pub fn ring_fd(&self) -> i32 {
        self.kernel.ring_fd()
    }
}

/// What is decoded of an fd of a process: what its engine says (`engines/<engine>/mod.rs`:
/// only the sides its tracker uses are copied, and its mailboxes and logs are read); a process
/// that is not an engine's is decoded whole, its eventfds aside.
fn decoded_kind(kind: FdKind, fd: u32, process: Option<&(Engine, Role)>) -> FdKind {
    match process {
        Some((engine, role)) => engines::kind(engine).decoded_kind(role, kind, fd),
        None => decoded_kind_of_non_engine(kind),
    }
}

/// What the kernel does with an fd of that kind: what the process's engine says.
fn fd_decision(kind: &FdKind, process: Option<&(Engine, Role)>) -> u8 {
    match process {
        Some((engine, role)) => engines::kind(engine).fd_action(role, kind),
        None => default_fd_action(kind),
    }
}

/// How long a process's role is trusted: a forked child keeps its parent's title until it
/// sets its own, so the answer is asked again after this.
const ROLE_TTL: Duration = Duration::from_secs(1);

/// Engine roles of traced processes, asked of /proc at most once per [`ROLE_TTL`].
#[derive(Default)]
struct Roles {
    known: HashMap<u32, (Option<(Engine, Role)>, Instant)>,
}

impl Roles {
    fn of(&mut self, tgid: u32) -> Option<&(Engine, Role)> {
        let now = Instant::now();
        let entry = self
            .known
            .entry(tgid)
            .and_modify(|e| {
                if now.duration_since(e.1) > ROLE_TTL {
                    *e = (engine::engine_role(tgid), now);
                }
            })
            .or_insert_with(|| (engine::engine_role(tgid), now));
        entry.0.as_ref()
    }

    fn forget(&mut self, tgid: u32) {
        self.known.remove(&tgid);
    }
}

pub fn process_info(pid: u32) -> Option<ProcessInfo> {
    Some(ProcessInfo {
        pid,
        ppid: procfs::ppid(pid),
        comm: procfs::comm(pid)?,
        cmdline: procfs::cmdline(pid).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_common::fd_action;

    #[test]
    fn only_the_sides_the_trackers_use_are_decoded_and_only_their_eventfds_watched() {
        let unix = || FdKind::Unix { path: None };
        let eventfd = || FdKind::Eventfd { watched: false };
        let api = (Engine::Vllm, Role::ApiServer);
        let core = (Engine::Vllm, Role::EngineCore);
        let scheduler = (Engine::Sglang, Role::Scheduler);
        assert_eq!(decoded_kind(unix(), 7, Some(&api)), unix());
        assert!(decoded_kind(eventfd(), 7, Some(&api)).capture());
        let skipped = decoded_kind(unix(), 7, Some(&core));
        assert!(!skipped.capture(), "{skipped:?}");
        assert!(!decoded_kind(eventfd(), 7, Some(&core)).capture());
        // SGLang's main process and scheduler, and processes of no known engine: every socket.
        assert_eq!(decoded_kind(unix(), 7, Some(&scheduler)), unix());
        assert!(decoded_kind(eventfd(), 7, Some(&scheduler)).capture());
        let detokenizer = (Engine::Sglang, Role::Detokenizer);
        assert!(!decoded_kind(eventfd(), 7, Some(&detokenizer)).capture());
        assert!(!decoded_kind(unix(), 7, Some(&detokenizer)).capture());
        let dp_controller = (Engine::Sglang, Role::DataParallelController);
        assert!(decoded_kind(eventfd(), 7, Some(&dp_controller)).capture());
        assert_eq!(decoded_kind(unix(), 7, Some(&dp_controller)), unix());
        assert_eq!(decoded_kind(unix(), 7, None), unix());
        assert!(!decoded_kind(eventfd(), 7, None).capture());
    }

    #[test]
    fn only_an_sglang_schedulers_mailboxes_have_their_polls_reported() {
        let watched = FdKind::Eventfd { watched: true };
        let scheduler = (Engine::Sglang, Role::Scheduler);
        let api = (Engine::Vllm, Role::ApiServer);
        assert_eq!(
            fd_decision(&watched, Some(&scheduler)),
            fd_action::CAPTURE_POLLS
        );
        assert_eq!(fd_decision(&watched, Some(&api)), fd_action::CAPTURE);
        // The DP controller spins on its socket: its polls would be a flood.
        let dp_controller = (Engine::Sglang, Role::DataParallelController);
        assert_eq!(
            fd_decision(&watched, Some(&dp_controller)),
            fd_action::CAPTURE
        );
        let unix = FdKind::Unix { path: None };
        assert_eq!(fd_decision(&unix, Some(&scheduler)), fd_action::CAPTURE);
        let other = FdKind::Other {
            what: "pipe".into(),
        };
        assert_eq!(fd_decision(&other, Some(&scheduler)), fd_action::IGNORE);
    }

    #[test]
    fn an_sglang_schedulers_stdout_and_stderr_are_read_as_its_log() {
        let file = || FdKind::Other {
            what: "/var/log/sglang.log".into(),
        };
        let scheduler = (Engine::Sglang, Role::Scheduler);
        for fd in [1, 2] {
            let kind = decoded_kind(file(), fd, Some(&scheduler));
            assert!(matches!(kind, FdKind::Log { .. }), "{kind:?}");
            assert!(kind.capture());
            // journald's socket too, and nothing of the other processes.
            let journal = decoded_kind(FdKind::Unix { path: None }, fd, Some(&scheduler));
            assert!(matches!(journal, FdKind::Log { .. }), "{journal:?}");
            let main = (Engine::Sglang, Role::ApiServer);
            assert!(!decoded_kind(file(), fd, Some(&main)).capture());
        }
        assert!(!decoded_kind(file(), 3, Some(&scheduler)).capture());
    }
}
