//! A tracing session: capture (live or replayed) -> decode -> output, until told to stop.
use std::{
    fs::File,
    io::{BufReader, BufWriter},
    os::fd::{AsRawFd, RawFd},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::SignalKind,
};

use crate::{
    capture::{
        CaptureEvent, KernelCounters, Record,
        kernel::KernelOptions,
        live::LiveCapture,
        python_watch::PythonStats,
        recording::{Header, Reader, Writer},
    },
    decode::flows::{Decoded, FlowStats, FlowTable},
    discover::{engine::Target, node::Node, procfs, system},
    pipeline::Pipeline,
};

/// How often a live session checks whether the attached processes still run (one `poll` of
/// their pidfds: `procfs::ExitWatch`).
const EXIT_CHECK: Duration = Duration::from_millis(500);
/// How often node mode scans /proc for servers whose exec it did not see as a server's (a
/// program that becomes one later, e.g. a script that imports the engine).
const RESCAN: Duration = Duration::from_secs(30);

/// How a live session runs.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    pub kernel: KernelOptions,
    /// Drain period: records wait at most this long in the ring buffer.
    pub poll_interval: Duration,
    /// Stop after this long (None: until Ctrl-C / SIGTERM or the processes exit).
    pub duration: Option<Duration>,
    /// The servers to trace (their pids and what discovery found of them, kept in
    /// recordings).
    pub targets: Vec<Target>,
    /// Let the kernel report the servers' streamed content writes by time and size only
    /// (when generated text is not exported: their text is then not needed).
    pub elide_content: bool,
}

/// What a session saw, printed when it ends.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Kernel records handled, and their payload bytes.
    pub records: u64,
    pub payload_bytes: u64,
    /// Of the records, those of the CUDA probes (steps, calls, names).
    pub cuda_records: u64,
    pub kernel: KernelCounters,
    pub flows: FlowStats,
    pub messages: u64,
    pub bad_records: u64,
    /// Fds closed before /proc could say what they were (decoded by content).
    pub vanished_fds: u64,
    /// What the Python sampler could and could not do (live sessions).
    pub python: PythonStats,
    /// Times the wall clock moved against the capture clock (stepped or slewed).
    pub clock_moves: u64,
    /// The largest of those moves, in ns.
    pub largest_clock_move_ns: u64,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC as the latest move (or the session's start) left it.
    clock_offset: Option<i128>,
}

impl Summary {
    /// A session whose wall clock was `offset` ahead of the capture clock when it began.
    fn starting_at(offset: i128) -> Self {
        Self {
            clock_offset: Some(offset),
            ..Self::default()
        }
    }

    /// Count one event on its way into the decoding stage.
    fn count(&mut self, event: &CaptureEvent) {
        match event {
            CaptureEvent::Counters(c) => self.kernel = *c,
            CaptureEvent::Clock {
                realtime_minus_monotonic_ns: offset,
                ..
            } => {
                self.clock_moves += 1;
                if let Some(previous) = self.clock_offset {
                    let moved =
                        u64::try_from((offset - previous).unsigned_abs()).unwrap_or(u64::MAX);
                    self.largest_clock_move_ns = self.largest_clock_move_ns.max(moved);
                }
                self.clock_offset = Some(*offset);
            }
            CaptureEvent::Kernel(record) => {
                self.records += 1;
                match record {
                    Record::Io { payload, .. } => self.payload_bytes += payload.len() as u64,
                    Record::CudaStep(_) | Record::CudaCall(_) | Record::CudaName(_) => {
                        self.cuda_records += 1
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = &self.kernel;
        let s = &self.flows;
        write!(
            f,
            "{} records ({} B of payload, {} CUDA records); decoded {} messages from {} syscalls ({} B; \
             {} streamed content writes of {} B reported by time and size only); lost: {} \
             ring-full records, {} truncated syscalls ({} B past the cap), {} unreadable chunks, \
             {} map-full; {} stream gaps, {} late records, {} bad records; {} fds closed \
             before classification (decoded by content); {} B of fds found uninteresting",
            self.records,
            self.payload_bytes,
            self.cuda_records,
            self.messages,
            s.syscalls,
            s.bytes,
            s.elided_syscalls,
            s.elided_bytes,
            k.ring_full,
            k.truncated_syscalls,
            k.truncated_bytes,
            k.read_failed,
            k.map_full,
            s.gaps,
            s.late_records,
            self.bad_records,
            self.vanished_fds,
            s.ignored_bytes
        )?;
        if self.clock_moves > 0 {
            write!(
                f,
                "; the wall clock moved {} times, by at most {:.1} µs (instants converted with the \
                 offset of their time)",
                self.clock_moves,
                self.largest_clock_move_ns as f64 / 1e3
            )?;
        }
        let p = &self.python;
        if p.processes + p.unsupported > 0 {
            write!(
                f,
                "; Python: {} processes sampled, {} not supported, {} stacks unresolved, {} \
                 frames unnamed",
                p.processes, p.unsupported, p.unresolved_stacks, p.unnamed_frames
            )?;
        }
        Ok(())
    }
}

/// CLOCK_REALTIME - CLOCK_MONOTONIC now, in ns.
pub fn realtime_minus_monotonic_ns() -> i128 {
    crate::capture::clock::realtime_minus_monotonic().1
}

/// CLOCK_MONOTONIC now, ns (the kernel's timestamps use this clock).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct RingFd(RawFd);
impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Run a live session: decoded messages go to `sink`, one time-ordered batch per call (so
/// that an output can write a batch at once; an empty batch on wake-ups that decoded nothing,
/// so that the sink can act on time passing), with the session's counters so far; with
/// `record`, every event is
/// also written to that file. In `node` mode, servers that start are traced too, each from
/// its exec, and their pods named as Kubernetes tells them. Returns when the duration elapses,
/// on SIGINT/SIGTERM, or (not in node mode) when all attached processes have exited; pending
/// data is flushed first.
pub async fn run_live(
    options: &LiveOptions,
    record: Option<&Path>,
    mut node: Option<Node>,
    mut sink: impl FnMut(&[Decoded], &Summary),
) -> anyhow::Result<Summary> {
    let pids: Vec<u32> = options.targets.iter().map(|t| t.pid).collect();
    let (mut live, initial) = LiveCapture::attach(&pids, &options.kernel)?;
    let traced: Vec<String> = initial
        .iter()
        .filter_map(|e| match e {
            CaptureEvent::Process(p) => Some(format!("{} ({})", p.pid, p.comm)),
            _ => None,
        })
        .collect();
    tracing::info!(
        "attached: tracing {} processes: {}",
        traced.len(),
        traced.join(", ")
    );
    // The offset the session starts from: the recording's header and the summary's moves.
    let start_offset = realtime_minus_monotonic_ns();
    let mut recorder = match record {
        Some(path) => {
            let header = Header {
                host: system::hostname(),
                kernel: system::kernel_release(),
                agent_version: env!("CARGO_PKG_VERSION").into(),
                realtime_minus_monotonic_ns: start_offset,
                pids: pids.clone(),
                processes: initial
                    .iter()
                    .filter_map(|e| match e {
                        CaptureEvent::Process(p) => Some(p.clone()),
                        _ => None,
                    })
                    .collect(),
                targets: options.targets.clone(),
                engine_version: None,
                served_model: None,
                engine: None,
            };
            let file =
                File::create(path).with_context(|| format!("creating {}", path.display()))?;
            Some(Writer::new(BufWriter::new(file), &header)?)
        }
        None => None,
    };
    let mut flows = if options.elide_content {
        FlowTable::eliding_content()
    } else {
        FlowTable::new()
    };
    let mut summary = Summary::starting_at(start_offset);
    // SAFETY: the ring buffer fd belongs to `live`, which outlives `ring` (dropped first below).
    let ring =
        unsafe { AsyncFd::register_with_interest(RingFd(live.ring_fd()), Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("watching the ring buffer fd: {e}"))?;
    let mut ticker = tokio::time::interval(options.poll_interval);
    // One listener per signal for the whole session: a future re-created in each select!
    // round would lose a signal that arrives in a round another branch wins.
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt())?;
    let deadline = tokio::time::sleep(
        options
            .duration
            .unwrap_or(Duration::from_secs(u64::MAX / 4)),
    );
    tokio::pin!(deadline);
    let mut events = initial;
    // The decoded messages of one batch (kept for its capacity).
    let mut batch = Vec::new();
    // Attach mode ends when its processes have exited; node mode runs on.
    let exits = node.is_none().then(|| procfs::ExitWatch::new(&pids));
    let mut checked_exit = Instant::now();
    let mut scanned = Instant::now();
    loop {
        let mut stop = false;
        tokio::select! {
            _ = ticker.tick() => {}
            guard = ring.readable() => { if let Ok(mut g) = guard { g.clear_ready(); } }
            _ = sigint.recv() => stop = true,
            _ = sigterm.recv() => stop = true,
            _ = &mut deadline => stop = true,
        }
        // Drain batch by batch until the ring buffer is empty.
        loop {
            let more = live.poll(&mut events);
            batch.clear();
            let mut started = Vec::new();
            for event in events.drain(..) {
                if let Some(w) = recorder.as_mut() {
                    w.write(&event).context("writing the recording")?;
                }
                summary.count(&event);
                if let Some(node) = node.as_mut() {
                    started.extend(servers_started(node, &event));
                }
                batch.extend(flows.handle(event));
            }
            for (tgid, template) in flows.take_template_changes() {
                live.set_sse_template(tgid, &template);
            }
            // Their records come from the next poll on, after the events that announce them.
            for target in started {
                events.extend(follow(&mut live, node.as_ref(), target));
            }
            // Flows complete in drain order; show each batch's messages in time order. Each
            // key is read once: reading one reaches into the message (3 % of the agent's CPU
            // in an SGLang load when the sort read them at every comparison).
            batch.sort_by_cached_key(Decoded::start_ns);
            summary.messages += batch.iter().filter(|d| d.is_message()).count() as u64;
            summary.flows = flows.stats();
            summary.bad_records = live.stats.bad_records;
            sink(&batch, &summary);
            if !more {
                break;
            }
        }
        if let Some(node) = node.as_mut() {
            events.extend(pods_known(node));
            let mut started = node.due();
            if scanned.elapsed() >= RESCAN {
                scanned = Instant::now();
                started.extend(node.scan());
            }
            for target in started {
                events.extend(follow(&mut live, Some(node), target));
            }
        }
        if let Some(exits) = &exits
            && !stop
            && checked_exit.elapsed() >= EXIT_CHECK
        {
            checked_exit = Instant::now();
            if exits.all_exited() {
                tracing::info!("all attached processes have exited");
                stop = true;
            }
        }
        if stop {
            break;
        }
    }
    drop(ring);
    let last_counters = live.counters();
    if let Some(w) = recorder.as_mut() {
        w.write(&last_counters).context("writing the recording")?;
    }
    summary.count(&last_counters);
    let mut rest = flows.finish(monotonic_ns());
    rest.sort_by_cached_key(Decoded::start_ns);
    summary.messages += rest.iter().filter(|d| d.is_message()).count() as u64;
    summary.flows = flows.stats();
    sink(&rest, &summary);
    if let Some(mut w) = recorder {
        w.flush()?;
    }
    summary.flows = flows.stats();
    summary.bad_records = live.stats.bad_records;
    summary.vanished_fds = live.stats.vanished_fds;
    summary.python = live.python.stats;
    Ok(summary)
}

/// Node mode: the server an event says started (an untraced process's exec that is a
/// server's), and the end of a traced one.
fn servers_started(node: &mut Node, event: &CaptureEvent) -> Option<Target> {
    match event {
        CaptureEvent::Kernel(Record::Spawn { header, .. }) => node.consider(header.tgid),
        CaptureEvent::Kernel(Record::Exit { header }) => {
            if node.exited(header.tgid) {
                tracing::info!("server pid {} exited", header.tgid);
            }
            None
        }
        _ => None,
    }
}

/// The Pod events of the pods Kubernetes told, of the traced servers they hold.
fn pods_known(node: &Node) -> Vec<CaptureEvent> {
    node.pods_known()
        .into_iter()
        .map(|(pid, pod)| {
            tracing::info!(
                "server pid {pid} is container {} of pod {}/{}",
                pod.container_name,
                pod.namespace,
                pod.pod_name
            );
            CaptureEvent::Pod {
                pid,
                pod: Box::new(pod),
            }
        })
        .collect()
}

/// Trace a server that started: the event that starts its engine instance (with its pod,
/// when known), then its processes'. A server that exits before it is tracked is left out.
fn follow(live: &mut LiveCapture, node: Option<&Node>, mut target: Target) -> Vec<CaptureEvent> {
    target.pod = node.and_then(|n| n.pod_of(&target));
    match live.follow(target.pid) {
        Ok(processes) if !processes.is_empty() => {
            tracing::info!("tracing {}", describe(&target));
            std::iter::once(CaptureEvent::Target(Box::new(target)))
                .chain(processes)
                .collect()
        }
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::warn!("server pid {}: {e:#}", target.pid);
            Vec::new()
        }
    }
}

/// `vLLM 0.32.0 server pid 42 (model Qwen/Qwen3-0.6B, container 3f1c6b0e8d2a)`.
pub fn describe(target: &Target) -> String {
    let engine = target
        .engine
        .map_or("OpenAI-compatible", |e| e.recognition().name);
    let mut text = engine.to_owned();
    if let Some(v) = &target.version {
        text += &format!(" {v}");
    }
    text += &format!(" server pid {}", target.pid);
    let mut about = Vec::new();
    if let Some(model) = &target.served_model {
        about.push(format!("model {model}"));
    }
    match (&target.pod, &target.identity.container_id) {
        (Some(pod), _) => about.push(format!("pod {}/{}", pod.namespace, pod.pod_name)),
        (None, Some(id)) => about.push(format!("container {}", &id[..12.min(id.len())])),
        (None, None) => {}
    }
    if !about.is_empty() {
        text += &format!(" ({})", about.join(", "));
    }
    text
}

/// Replay a recording through the same decoding stage. Needs no privileges. `sink` also
/// gets the recording's header (for its clock offset).
pub fn replay(
    path: &Path,
    mut sink: impl FnMut(&Header, &Decoded),
) -> anyhow::Result<(Header, Summary)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (mut reader, header) = Reader::open(BufReader::new(file))
        .with_context(|| format!("reading {}", path.display()))?;
    let mut flows = FlowTable::new();
    let mut summary = Summary::starting_at(header.realtime_minus_monotonic_ns);
    let mut last_ts = 0;
    let result = loop {
        match reader.next_event() {
            Ok(Some(event)) => {
                summary.count(&event);
                if let CaptureEvent::Kernel(r) = &event {
                    last_ts = last_ts.max(r.header().ts_ns);
                }
                for decoded in flows.handle(event) {
                    summary.messages += u64::from(decoded.is_message());
                    sink(&header, &decoded);
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    for decoded in flows.finish(last_ts) {
        summary.messages += u64::from(decoded.is_message());
        sink(&header, &decoded);
    }
    summary.flows = flows.stats();
    summary.bad_records = reader.bad_frames;
    if let Err(e) = result {
        tracing::warn!("{}: {e}; decoded what came before it", path.display());
    }
    Ok((header, summary))
}

/// Replay a recording through the decoders and a pipeline made from the recording's header
/// (its clock offset, engine version and model), as `attach` would have run it. `each` also
/// sees every decoded message. The pipeline is returned finished (None: nothing decoded).
pub fn replay_pipeline(
    path: &Path,
    make: impl FnOnce(&Header) -> anyhow::Result<Pipeline>,
    mut each: impl FnMut(&Header, &Decoded),
) -> anyhow::Result<(Header, Summary, Option<Pipeline>)> {
    let mut make = Some(make);
    let mut pipeline: Option<Pipeline> = None;
    let mut error = None;
    let mut last_ns = 0;
    let (header, summary) = replay(path, |header, decoded| {
        if let Some(make) = make.take() {
            match make(header) {
                Ok(p) => pipeline = Some(p),
                Err(e) => error = Some(e),
            }
        }
        each(header, decoded);
        if let Some(p) = pipeline.as_mut() {
            p.handle(std::slice::from_ref(decoded));
            last_ns = last_ns.max(decoded.end_ns());
            p.tick(last_ns);
        }
    })?;
    if let Some(e) = error {
        return Err(e);
    }
    if let Some(p) = pipeline.as_mut() {
        p.finish(last_ns);
    }
    Ok((header, summary, pipeline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_how_far_the_wall_clock_moved_at_most() {
        let mut summary = Summary::starting_at(1_000_000);
        let moved = |offset| CaptureEvent::Clock {
            monotonic_ns: 5,
            realtime_minus_monotonic_ns: offset,
        };
        summary.count(&moved(1_067_000));
        summary.count(&moved(967_000));
        summary.count(&moved(1_000_000));
        assert_eq!(summary.clock_moves, 3);
        // The second move, back by 100 µs, is the largest.
        assert_eq!(summary.largest_clock_move_ns, 100_000);
        assert!(
            summary
                .to_string()
                .contains("the wall clock moved 3 times, by at most 100.0 µs"),
            "{summary}"
        );
    }
}
