//! From captured syscalls to decoded messages: one flow per (process, fd), two ordered byte
//! streams per flow, one decoder per stream chosen from what the fd is.
//!
//! The kernel numbers each direction's syscalls (`seq`) and marks each syscall's last record.
//! Records are put back in order here, and anything missing (a lost record, a whole lost
//! syscall, a payload past the capture cap) becomes a `gap` for the decoder, so a decoder never
//! sees bytes glued across a hole.
use crate::FastMap;
use std::collections::BTreeMap;

use infertrace_common::{ElidedWrite, IoRecord, SseTemplate, direction, io_flags};

use super::{
    cuda::{CudaDecoder, CudaEvent, CudaName},
    http::{HttpConnection, HttpExchange},
    lines::LineSplitter,
    python::{PySample, PythonSamples},
    sse_template::{content_template, kernel_match},
    zmtp::{ZmtpEvent, ZmtpMessage, ZmtpStream},
};
use crate::capture::{CaptureEvent, ProcessInfo, Record};
use crate::discover::{engine::Target, kubernetes::PodIdentity, sockets::FdKind};

/// Ticks an out-of-order syscall may wait for the ones before it before they count as lost.
const REORDER_TICKS: u32 = 2;
/// Syscalls held per direction while waiting for a missing one.
const MAX_PENDING: usize = 4096;
/// Flows tracked at once; the oldest is dropped (and counted) beyond this.
const MAX_FLOWS: usize = 16384;

/// What the decoding stage produces.
#[derive(Clone, Debug)]
pub enum Decoded {
    Http {
        tgid: u32,
        fd: u32,
        exchange: Box<HttpExchange>,
    },
    Zmtp {
        tgid: u32,
        fd: u32,
        outgoing: bool,
        message: ZmtpMessage,
    },
    /// A read or write of a watched eventfd (an API server's libzmq mailbox).
    Wakeup(Wakeup),
    /// A main thread's epoll wait: where its event loop ended one iteration and began the next.
    LoopWait(LoopWait),
    /// A poll of a watched eventfd (a libzmq mailbox checked by a non-blocking receive).
    MailboxPoll(MailboxPoll),
    /// A traced process and its title (command line), for the trackers that name processes.
    Process(ProcessInfo),
    /// A server joined the traced set (node mode): the pipeline starts its engine instance.
    Traced(Box<Target>),
    /// Kubernetes told the pod of server `pid` (node mode).
    Pod { pid: u32, pod: Box<PodIdentity> },
    /// A traced process exited (its last thread did): the pipeline ends the instance whose
    /// server it was, and forgets it otherwise.
    Exited { tgid: u32, ns: u64 },
    /// A thread's CUDA step, or a kernel's name.
    Cuda(CudaEvent),
    /// A Python thread's stack sample.
    PySample(Box<PySample>),
    /// An application thread handed a message to libzmq (the `zmq_msg_send` probe).
    Handover(Handover),
    /// An application thread began serializing a message (the `pickle.dumps` probe).
    Serializing(Serializing),
    /// A line a process wrote to its log (stdout or stderr).
    Log(LogLine),
    /// The wall clock moved against the capture clock.
    Clock(ClockMove),
}

/// From capture time `monotonic_ns` on, CLOCK_REALTIME - CLOCK_MONOTONIC is
/// `realtime_minus_monotonic_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockMove {
    pub monotonic_ns: u64,
    pub realtime_minus_monotonic_ns: i128,
}

/// One line of a process's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub tgid: u32,
    /// When the write that completed the line returned.
    pub ns: u64,
    /// Without its newline.
    pub line: String,
}

/// One 8-byte eventfd read or write: who signalled whom, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wakeup {
    pub tgid: u32,
    pub tid: u32,
    pub fd: u32,
    /// When the syscall returned (a read: the moment the reader had the signal).
    pub ns: u64,
    /// A write (a signal), else a read (a signal consumed).
    pub write: bool,
}

/// One epoll wait of a process's main thread (its event loop, when it runs one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopWait {
    pub tgid: u32,
    pub enter_ns: u64,
    /// When the wait returned: the loop's next iteration began.
    pub exit_ns: u64,
    /// When the iteration this wait ends began, when it was a long one
    /// (`infertrace_common::LONG_ITERATION_NS`: the loop was held).
    pub long_iteration_from_ns: Option<u64>,
}

/// A `poll` whose first fd is a watched eventfd: libzmq checking a socket's mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MailboxPoll {
    pub tgid: u32,
    pub tid: u32,
    /// The first fd polled.
    pub fd: u32,
    /// How many fds were polled, the second one (when two were), and the timeout (ms; 0: a
    /// check, no wait).
    pub nfds: u32,
    pub second_fd: Option<u32>,
    pub timeout_ms: i32,
    pub enter_ns: u64,
    /// When the poll returned.
    pub ns: u64,
    /// Ready fds, or a negative errno.
    pub ret: i64,
}

/// A message handed to libzmq: `zmq_msg_send` returned for its last part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handover {
    pub tgid: u32,
    pub tid: u32,
    /// libzmq's socket object.
    pub socket: u64,
    /// When the call began: the I/O thread may write the message before the call returns.
    pub enter_ns: u64,
    /// When the call returned.
    pub ns: u64,
    /// The size of the part it passed: the length of the message's last frame.
    pub size: u32,
}

/// A thread entered CPython's `pickle.dumps`: it began serializing something, in SGLang's
/// main process a message it is about to send (engines/sglang/dispatch_start.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Serializing {
    pub tgid: u32,
    pub tid: u32,
    pub ns: u64,
}

impl Decoded {
    /// Decoded from captured bytes (not the note of a process or of a loop's wait).
    pub fn is_message(&self) -> bool {
        !matches!(
            self,
            Decoded::Process(_)
                | Decoded::Traced(_)
                | Decoded::Pod { .. }
                | Decoded::Exited { .. }
                | Decoded::LoopWait(_)
                | Decoded::MailboxPoll(_)
                | Decoded::Cuda(_)
                | Decoded::PySample(_)
                | Decoded::Handover(_)
                | Decoded::Serializing(_)
                | Decoded::Clock(_)
        )
    }

    /// The process the message or note is of (None: the wall clock's moves).
    pub fn tgid(&self) -> Option<u32> {
        match self {
            Decoded::Http { tgid, .. } | Decoded::Zmtp { tgid, .. } => Some(*tgid),
            Decoded::Wakeup(w) => Some(w.tgid),
            Decoded::LoopWait(w) => Some(w.tgid),
            Decoded::MailboxPoll(p) => Some(p.tgid),
            Decoded::Process(p) => Some(p.pid),
            Decoded::Traced(target) => Some(target.pid),
            Decoded::Pod { pid, .. } => Some(*pid),
            Decoded::Exited { tgid, .. } => Some(*tgid),
            Decoded::Cuda(CudaEvent::Step(step)) => Some(step.tgid),
            Decoded::Cuda(CudaEvent::Name(
                CudaName::Named { tgid, .. } | CudaName::Alias { tgid, .. },
            )) => Some(*tgid),
            Decoded::Cuda(CudaEvent::Exited { tgid, .. }) => Some(*tgid),
            Decoded::PySample(sample) => Some(sample.tgid),
            Decoded::Handover(h) => Some(h.tgid),
            Decoded::Serializing(s) => Some(s.tgid),
            Decoded::Log(log) => Some(log.tgid),
            Decoded::Clock(_) => None,
        }
    }

    /// When the message began (first byte of the request, or of the ZMTP message).
    pub fn start_ns(&self) -> u64 {
        match self {
            Decoded::Http { exchange, .. } => exchange
                .request
                .as_ref()
                .map(|r| r.first_ns)
                .or_else(|| exchange.response.as_ref().map(|r| r.first_ns))
                .unwrap_or(0),
            Decoded::Zmtp { message, .. } => message.first_ns,
            Decoded::Wakeup(w) => w.ns,
            Decoded::LoopWait(w) => w.exit_ns,
            Decoded::MailboxPoll(p) => p.ns,
            // Its call began before any write of its message: sorted ahead of them.
            Decoded::Handover(h) => h.enter_ns,
            Decoded::Serializing(s) => s.ns,
            // Known before any message: sorted first (a server before its processes).
            Decoded::Process(_) | Decoded::Traced(_) | Decoded::Pod { .. } => 0,
            Decoded::Exited { ns, .. } => *ns,
            Decoded::Cuda(CudaEvent::Step(step)) => step.end_ns,
            // A name is needed by the steps after it: sorted first, like a process.
            Decoded::Cuda(CudaEvent::Name(_)) => 0,
            Decoded::Cuda(CudaEvent::Exited { ns, .. }) => *ns,
            Decoded::PySample(sample) => sample.ns,
            Decoded::Log(log) => log.ns,
            Decoded::Clock(moved) => moved.monotonic_ns,
        }
    }

    /// When the message ended (last byte of the response, or of the request when none came).
    pub fn end_ns(&self) -> u64 {
        match self {
            Decoded::Http { exchange, .. } => exchange
                .response
                .as_ref()
                .map(|r| r.last_ns)
                .or_else(|| exchange.request.as_ref().map(|r| r.last_ns))
                .unwrap_or(0),
            Decoded::Zmtp { message, .. } => message.last_ns,
            Decoded::Wakeup(w) => w.ns,
            Decoded::LoopWait(w) => w.exit_ns,
            Decoded::MailboxPoll(p) => p.ns,
            Decoded::Process(_) | Decoded::Traced(_) | Decoded::Pod { .. } => 0,
            Decoded::Exited { ns, .. } => *ns,
            Decoded::Cuda(CudaEvent::Step(step)) => step.end_ns,
            // A name is needed by the steps after it: sorted first, like a process.
            Decoded::Cuda(CudaEvent::Name(_)) => 0,
            Decoded::Cuda(CudaEvent::Exited { ns, .. }) => *ns,
            Decoded::PySample(sample) => sample.ns,
            Decoded::Handover(h) => h.ns,
            Decoded::Serializing(s) => s.ns,
            Decoded::Log(log) => log.ns,
            Decoded::Clock(moved) => moved.monotonic_ns,
        }
    }
}

/// Counters of everything the stage dropped or repaired.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct FlowStats {
    pub syscalls: u64,
    pub bytes: u64,
    /// Syscalls whose records were incomplete or that never arrived.
    pub gaps: u64,
    /// Records that arrived after their syscall had been given up on.
    pub late_records: u64,
    /// Syscalls the kernel reported by time and size only (streamed content writes), and
    /// their bytes.
    pub elided_syscalls: u64,
    pub elided_bytes: u64,
    /// Bytes of fds later classified as not interesting.
    pub ignored_bytes: u64,
    pub flows_evicted: u64,
}

/// One syscall being put back together from its records.
#[derive(Default)]
struct Syscall {
    ts_ns: u64,
    data: Vec<u8>,
    /// The kernel reported it by time and size only (`data` is then empty).
    elided: Option<ElidedWrite>,
    /// A record was missing, unreadable or truncated: data is a valid prefix only.
    broken: bool,
    done: bool,
    waited: u32,
}

/// One direction of a flow: reorders syscalls by their kernel sequence number.
#[derive(Default)]
struct Stream {
    next_seq: Option<u64>,
    pending: BTreeMap<u64, Syscall>,
}

/// What a stream hands to its decoder.
enum Piece {
    Data {
        ts_ns: u64,
        data: Vec<u8>,
    },
    /// A write the kernel reported by time and size only: one whole event of streamed content.
    Elided(ElidedWrite),
    Gap,
}

impl Stream {
    fn add(&mut self, io: &IoRecord, payload: &[u8], stats: &mut FlowStats) {
        // The kernel numbers a fd's syscalls from 0 when it first reports the fd, which is when
        // its flow is created here: a flow always starts at 0, even on a mid-stream attach.
        let next = *self.next_seq.get_or_insert(0);
        if io.seq < next {
            stats.late_records += 1;
            return;
        }
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&io.seq) {
            stats.late_records += 1;
            return;
        }
        let call = self.pending.entry(io.seq).or_default();
        call.ts_ns = io.header.ts_ns;
        if io.offset as usize != call.data.len() {
            call.broken = true;
        } else {
            call.data.extend_from_slice(payload);
        }
        if io.flags & (io_flags::TRUNCATED | io_flags::READ_FAILED) != 0 {
            call.broken = true;
        }
        if io.flags & io_flags::LAST != 0 {
            call.done = true;
        }
    }

    /// Whether `io` is a whole syscall in one record, next in order, with nothing held back:
    /// then it is taken as next (true), to be handed over at once, without the reorder buffer.
    /// Most records are such; putting each in the buffer and taking it out again cost a tree
    /// node's allocation apiece.
    fn take_whole(&mut self, io: &IoRecord) -> bool {
        let whole = io.offset == 0
            && io.flags & io_flags::LAST != 0
            && io.flags & (io_flags::TRUNCATED | io_flags::READ_FAILED) == 0;
        if !whole || !self.pending.is_empty() || io.seq != *self.next_seq.get_or_insert(0) {
            return false;
        }
        self.next_seq = Some(io.seq + 1);
        true
    }

    /// A syscall that came whole, outside an IO record (an elided write): handed over at once
    /// when it is next in order, else held as any other.
    fn add_whole(&mut self, seq: u64, call: Syscall, out: &mut Vec<Piece>, stats: &mut FlowStats) {
        let next = *self.next_seq.get_or_insert(0);
        if seq < next || (self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&seq)) {
            stats.late_records += 1;
            return;
        }
        if seq == next && self.pending.is_empty() {
            self.next_seq = Some(seq + 1);
            deliver(call, out, stats);
        } else {
            self.pending.insert(seq, call);
            self.ready(out, stats);
        }
    }

    /// Hand over every syscall that is complete and next in order.
    fn ready(&mut self, out: &mut Vec<Piece>, stats: &mut FlowStats) {
        while let Some(next) = self.next_seq {
            match self.pending.first_key_value() {
                Some((&seq, call)) if seq == next && call.done => {
                    let call = self.pending.remove(&seq).unwrap_or_default();
                    self.next_seq = Some(seq + 1);
                    deliver(call, out, stats);
                }
                _ => break,
            }
        }
    }

    /// Called once per drain: every held syscall ages by one tick; the ones that have waited
    /// long enough are given up on in order (holes before them become gaps).
    fn tick(&mut self, out: &mut Vec<Piece>, stats: &mut FlowStats) {
        self.ready(out, stats);
        for call in self.pending.values_mut() {
            call.waited += 1;
        }
        while let Some(next) = self.next_seq {
            let Some((&first, call)) = self.pending.first_key_value() else {
                break;
            };
            if call.waited < REORDER_TICKS {
                break;
            }
            if first != next {
                // Whole syscalls [next, first) never arrived.
                stats.gaps += 1;
                out.push(Piece::Gap);
                self.next_seq = Some(first);
            } else if let Some(mut call) = self.pending.remove(&first) {
                // Its LAST record never arrived.
                call.broken |= !call.done;
                self.next_seq = Some(first + 1);
                deliver(call, out, stats);
            }
            self.ready(out, stats);
        }
    }
}

impl Stream {
    /// Deliver everything held, in order, with a gap for each hole (the flow is ending).
    fn drain_all(&mut self, out: &mut Vec<Piece>, stats: &mut FlowStats) {
        for (seq, mut call) in std::mem::take(&mut self.pending) {
            if self.next_seq.is_some_and(|next| next != seq) {
                stats.gaps += 1;
                out.push(Piece::Gap);
            }
            call.broken |= !call.done;
            self.next_seq = Some(seq + 1);
            deliver(call, out, stats);
        }
    }
}

fn deliver(call: Syscall, out: &mut Vec<Piece>, stats: &mut FlowStats) {
    stats.syscalls += 1;
    stats.bytes += call.data.len() as u64;
    if let Some(write) = call.elided {
        stats.elided_syscalls += 1;
        stats.elided_bytes += u64::from(write.len);
        out.push(Piece::Elided(write));
    } else if !call.data.is_empty() {
        out.push(Piece::Data {
            ts_ns: call.ts_ns,
            data: call.data,
        });
    }
    if call.broken {
        stats.gaps += 1;
        out.push(Piece::Gap);
    }
}

/// The decoder(s) of one flow.
enum Protocol {
    /// `server_side`: the traced process accepted this connection (ingress = client bytes).
    Http {
        conn: Box<HttpConnection>,
        server_side: bool,
    },
    /// One ZMTP stream per direction (index: `direction`).
    Zmtp(Box<[ZmtpStream; 2]>),
    /// The lines a process writes (its reads of the fd, if any, are not looked at).
    Log(LineSplitter),
}

struct Flow {
    kind: FdKind,
    protocol: Option<Protocol>,
    streams: [Stream; 2],
    last_used: u64,
}

impl Flow {
    fn new(kind: FdKind, now: u64) -> Self {
        let protocol = match &kind {
            FdKind::Tcp { server_side, .. } => Some(Protocol::Http {
                conn: Box::default(),
                server_side: *server_side,
            }),
            FdKind::Unix { .. } => Some(Protocol::Zmtp(Box::default())),
            FdKind::Log { .. } => Some(Protocol::Log(LineSplitter::default())),
            FdKind::Eventfd { .. } | FdKind::Other { .. } | FdKind::Vanished => None,
        };
        Self {
            kind,
            protocol,
            streams: Default::default(),
            last_used: now,
        }
    }

    /// Feed ordered pieces of direction `dir` to the decoder; `templates`: offer the server's
    /// streamed content writes as templates.
    fn decode(
        &mut self,
        key: FlowKey,
        dir: u8,
        pieces: Vec<Piece>,
        out: &mut Vec<Decoded>,
        mut templates: Option<&mut Templates>,
    ) {
        if self.kind == FdKind::Vanished
            && self.protocol.is_none()
            && let Some(Piece::Data { data, .. }) = pieces.first()
        {
            self.protocol = sniff(data, dir);
        }
        let Some(protocol) = self.protocol.as_mut() else {
            return;
        };
        for piece in pieces {
            match protocol {
                Protocol::Http { conn, server_side } => {
                    let from_client = (dir == direction::INGRESS) == *server_side;
                    let exchanges = match piece {
                        Piece::Data { ts_ns, data } => {
                            if !from_client
                                && conn.streaming_events()
                                && let Some(templates) = templates.as_deref_mut()
                            {
                                templates.offer(key.0, ts_ns, &data);
                            }
                            conn.feed(from_client, ts_ns, &data)
                        }
                        Piece::Elided(write) => conn.elided_event(from_client, &write),
                        Piece::Gap => {
                            conn.gap(from_client);
                            // The exchange the gap cut short, returned incomplete.
                            conn.take_ready()
                        }
                    };
                    out.extend(exchanges.into_iter().map(|exchange| Decoded::Http {
                        tgid: key.0,
                        fd: key.1,
                        exchange: Box::new(exchange),
                    }));
                }
                Protocol::Zmtp(streams) => {
                    let stream = &mut streams[(dir & 1) as usize];
                    let events = match piece {
                        Piece::Data { ts_ns, data } => stream.feed(ts_ns, &data),
                        // Never streamed content: the kernel elides writes of HTTP servers.
                        Piece::Elided(_) | Piece::Gap => {
                            stream.gap();
                            Vec::new()
                        }
                    };
                    out.extend(events.into_iter().filter_map(|event| match event {
                        ZmtpEvent::Message(message) => Some(Decoded::Zmtp {
                            tgid: key.0,
                            fd: key.1,
                            outgoing: dir == direction::EGRESS,
                            message,
                        }),
                        _ => None,
                    }));
                }
                Protocol::Log(lines) if dir == direction::EGRESS => match piece {
                    Piece::Data { ts_ns, data } => {
                        out.extend(lines.feed(&data).into_iter().map(|line| {
                            Decoded::Log(LogLine {
                                tgid: key.0,
                                ns: ts_ns,
                                line,
                            })
                        }));
                    }
                    Piece::Elided(_) | Piece::Gap => lines.gap(),
                },
                Protocol::Log(_) => {}
            }
        }
    }

    fn close(&mut self, key: FlowKey, ts_ns: u64, out: &mut Vec<Decoded>) {
        if let Some(Protocol::Http { conn, .. }) = self.protocol.as_mut() {
            out.extend(conn.close(ts_ns).into_iter().map(|exchange| Decoded::Http {
                tgid: key.0,
                fd: key.1,
                exchange: Box::new(exchange),
            }));
        }
    }
}

/// The protocol of a flow whose socket could not be looked up, from the first bytes seen in
/// direction `dir`: an HTTP request or status line, or a ZMTP greeting. None: not decoded.
fn sniff(data: &[u8], dir: u8) -> Option<Protocol> {
    let http = |server_side| {
        Some(Protocol::Http {
            conn: Box::default(),
            server_side,
        })
    };
    if super::http::starts_with_method(data) {
        // The side that receives a request is the server.
        http(dir == direction::INGRESS)
    } else if data.starts_with(b"HTTP/1.") {
        http(dir == direction::EGRESS)
    } else if data.len() >= 10 && data[0] == 0xff && data[9] == 0x7f {
        Some(Protocol::Zmtp(Box::default()))
    } else {
        None
    }
}

type FlowKey = (u32, u32);

/// How long a server's template stays before another response's writes may replace it (a
/// server streaming for two models, say, would otherwise change it at each response).
const TEMPLATE_HOLD_NS: u64 = 1_000_000_000;

/// The templates of the traced servers' streamed content writes (see decode/sse_template.rs
/// and ebpf/src/sse.rs), when generated text is not exported.
#[derive(Default)]
struct Templates {
    /// Per process: its template and when it was set (capture time).
    set: FastMap<u32, (SseTemplate, u64)>,
    /// New templates for the kernel.
    changes: Vec<(u32, SseTemplate)>,
}

impl Templates {
    /// A write of a streamed response of process `tgid`, copied whole at `ts_ns`.
    fn offer(&mut self, tgid: u32, ts_ns: u64, write: &[u8]) {
        let held = self.set.get(&tgid);
        if held.is_some_and(|&(_, since)| ts_ns < since.saturating_add(TEMPLATE_HOLD_NS)) {
            return;
        }
        // The first content write of each response is copied: no need to read it again when
        // it is the template already set.
        if held.is_some_and(|(current, _)| kernel_match(current, write).is_some()) {
            return;
        }
        let Some(template) = content_template(write) else {
            return;
        };
        if held.is_some_and(|(current, _)| *current == template) {
            return;
        }
        self.set.insert(tgid, (template, ts_ns));
        self.changes.push((tgid, template));
    }
}

/// All flows of all traced processes.
#[derive(Default)]
pub struct FlowTable {
    flows: FastMap<FlowKey, Flow>,
    cuda: CudaDecoder,
    python: PythonSamples,
    stats: FlowStats,
    clock: u64,
    /// Some: servers' content writes are offered as templates.
    templates: Option<Templates>,
}

impl FlowTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Let the kernel report the servers' streamed content writes by time and size only: a
    /// write copied whole that can be a template becomes one (see
    /// [`Self::take_template_changes`]). For sessions that do not export generated text.
    pub fn eliding_content() -> Self {
        Self {
            templates: Some(Templates::default()),
            ..Self::default()
        }
    }

    /// Templates to set in the kernel, per process, since the last call.
    pub fn take_template_changes(&mut self) -> Vec<(u32, SseTemplate)> {
        self.templates
            .as_mut()
            .map(|t| std::mem::take(&mut t.changes))
            .unwrap_or_default()
    }

    pub fn stats(&self) -> FlowStats {
        self.stats
    }

    /// Handle one capture event; returns the messages it completed. A syscall's payload moves
    /// into its stream (most are handed to their decoder whole, without a copy).
    pub fn handle(&mut self, event: CaptureEvent) -> Vec<Decoded> {
        let mut out = Vec::new();
        if let CaptureEvent::Kernel(Record::Io { io, payload }) = event {
            self.io(&io, payload, &mut out);
            return out;
        }
        if let CaptureEvent::Kernel(Record::SseBatch { header, fd, writes }) = &event {
            self.elided(header.tgid, *fd, writes, &mut out);
            return out;
        }
        match &event {
            CaptureEvent::Fd { tgid, fd, kind } => self.open(*tgid, *fd, kind.clone(), &mut out),
            CaptureEvent::Kernel(Record::Close { header, fd }) => {
                self.end((header.tgid, *fd), header.ts_ns, &mut out);
            }
            CaptureEvent::Kernel(Record::CudaStep(r)) => {
                out.push(Decoded::Cuda(CudaEvent::from_step(r)));
            }
            CaptureEvent::Kernel(Record::CudaName(r)) => {
                out.push(Decoded::Cuda(CudaEvent::from_name(r)));
            }
            CaptureEvent::PythonStack {
                tgid,
                stack_id,
                frames,
            } => self.python.stack(*tgid, *stack_id, frames),
            CaptureEvent::Kernel(Record::PySample(r)) => {
                out.push(Decoded::PySample(Box::new(self.python.sample(r))));
            }
            CaptureEvent::Kernel(Record::CudaCall(r)) => {
                out.extend(self.cuda.call(r).map(Decoded::Cuda));
            }
            CaptureEvent::Kernel(Record::Exit { header }) => {
                if let Some(templates) = self.templates.as_mut() {
                    templates.set.remove(&header.tgid);
                }
                let ended = self.cuda.exit(header.tgid, header.ts_ns);
                out.extend(ended.into_iter().map(Decoded::Cuda));
                let keys: Vec<FlowKey> = self
                    .flows
                    .keys()
                    .filter(|k| k.0 == header.tgid)
                    .copied()
                    .collect();
                for key in keys {
                    self.end(key, header.ts_ns, &mut out);
                }
                out.push(Decoded::Exited {
                    tgid: header.tgid,
                    ns: header.ts_ns,
                });
            }
            CaptureEvent::Kernel(Record::ZmqSend(r)) => out.push(Decoded::Handover(Handover {
                tgid: r.header.tgid,
                tid: r.header.tid,
                socket: r.socket,
                enter_ns: r.enter_ns,
                ns: r.header.ts_ns,
                size: r.size,
            })),
            CaptureEvent::Kernel(Record::PickleDumps { header }) => {
                out.push(Decoded::Serializing(Serializing {
                    tgid: header.tgid,
                    tid: header.tid,
                    ns: header.ts_ns,
                }));
            }
            CaptureEvent::Kernel(Record::MailboxPoll(r)) => {
                let watched = self
                    .flows
                    .get(&(r.header.tgid, r.fd))
                    .is_some_and(|flow| matches!(flow.kind, FdKind::Eventfd { watched: true }));
                if watched {
                    out.push(Decoded::MailboxPoll(MailboxPoll {
                        tgid: r.header.tgid,
                        tid: r.header.tid,
                        fd: r.fd,
                        nfds: r.nfds,
                        second_fd: u32::try_from(r.second_fd).ok(),
                        timeout_ms: r.timeout_ms,
                        enter_ns: r.enter_ns,
                        ns: r.header.ts_ns,
                        ret: r.ret,
                    }));
                }
            }
            CaptureEvent::Kernel(Record::Poll {
                header,
                enter_ns,
                iteration_start_ns,
                ..
            }) => out.push(Decoded::LoopWait(LoopWait {
                tgid: header.tgid,
                enter_ns: *enter_ns,
                exit_ns: header.ts_ns,
                long_iteration_from_ns: Some(*iteration_start_ns).filter(|&ns| ns != 0),
            })),
            CaptureEvent::Clock {
                monotonic_ns,
                realtime_minus_monotonic_ns,
            } => out.push(Decoded::Clock(ClockMove {
                monotonic_ns: *monotonic_ns,
                realtime_minus_monotonic_ns: *realtime_minus_monotonic_ns,
            })),
            CaptureEvent::Tick => self.tick(&mut out),
            CaptureEvent::Process(info) => out.push(Decoded::Process(info.clone())),
            CaptureEvent::Target(target) => out.push(Decoded::Traced(target.clone())),
            CaptureEvent::Pod { pid, pod } => out.push(Decoded::Pod {
                pid: *pid,
                pod: pod.clone(),
            }),
            _ => {}
        }
        out
    }

    /// Close every flow (the agent is stopping): pending exchanges come out marked incomplete.
    pub fn finish(&mut self, ts_ns: u64) -> Vec<Decoded> {
        let mut out = Vec::new();
        let keys: Vec<FlowKey> = self.flows.keys().copied().collect();
        for key in keys {
            self.end(key, ts_ns, &mut out);
        }
        out
    }

    fn open(&mut self, tgid: u32, fd: u32, kind: FdKind, out: &mut Vec<Decoded>) {
        let key = (tgid, fd);
        // The fd number was reused without us seeing the close.
        self.end(key, 0, out);
        if self.flows.len() >= MAX_FLOWS {
            self.evict_oldest(out);
        }
        self.clock += 1;
        self.flows.insert(key, Flow::new(kind, self.clock));
    }

    fn io(&mut self, io: &IoRecord, payload: Vec<u8>, out: &mut Vec<Decoded>) {
        let key = (io.header.tgid, io.fd);
        self.clock += 1;
        let Some(flow) = self.flows.get_mut(&key) else {
            // Captured while PENDING and classified as not interesting, or its Fd event was
            // lost: nothing can decode it.
            self.stats.ignored_bytes += payload.len() as u64;
            return;
        };
        if !flow.kind.capture() {
            self.stats.ignored_bytes += payload.len() as u64;
            return;
        }
        flow.last_used = self.clock;
        if matches!(flow.kind, FdKind::Eventfd { .. }) {
            // A counter, not a byte stream: each syscall stands alone, in capture order.
            self.stats.syscalls += 1;
            self.stats.bytes += payload.len() as u64;
            out.push(Decoded::Wakeup(Wakeup {
                tgid: io.header.tgid,
                tid: io.header.tid,
                fd: io.fd,
                ns: io.header.ts_ns,
                write: io.direction == direction::EGRESS,
            }));
            return;
        }
        let dir = io.direction & 1;
        let stream = &mut flow.streams[dir as usize];
        let mut pieces = Vec::new();
        if stream.take_whole(io) {
            let call = Syscall {
                ts_ns: io.header.ts_ns,
                data: payload,
                done: true,
                ..Syscall::default()
            };
            deliver(call, &mut pieces, &mut self.stats);
        } else {
            stream.add(io, &payload, &mut self.stats);
            stream.ready(&mut pieces, &mut self.stats);
        }
        flow.decode(key, dir, pieces, out, self.templates.as_mut());
    }

    /// Writes of fd `fd` of `tgid` that the kernel reported by time and size only.
    fn elided(&mut self, tgid: u32, fd: u32, writes: &[ElidedWrite], out: &mut Vec<Decoded>) {
        let key = (tgid, fd);
        self.clock += 1;
        let Some(flow) = self.flows.get_mut(&key).filter(|flow| flow.kind.capture()) else {
            self.stats.ignored_bytes += writes.iter().map(|w| u64::from(w.len)).sum::<u64>();
            return;
        };
        flow.last_used = self.clock;
        let dir = direction::EGRESS;
        let mut pieces = Vec::new();
        for write in writes {
            let call = Syscall {
                ts_ns: write.ts_ns,
                elided: Some(*write),
                done: true,
                ..Syscall::default()
            };
            flow.streams[dir as usize].add_whole(write.seq, call, &mut pieces, &mut self.stats);
        }
        flow.decode(key, dir, pieces, out, self.templates.as_mut());
    }

    fn tick(&mut self, out: &mut Vec<Decoded>) {
        for (key, flow) in self.flows.iter_mut() {
            for dir in [direction::INGRESS, direction::EGRESS] {
                // Most streams hold nothing between drains: skip them without allocating.
                if flow.streams[dir as usize].pending.is_empty() {
                    continue;
                }
                let mut pieces = Vec::new();
                flow.streams[dir as usize].tick(&mut pieces, &mut self.stats);
                flow.decode(*key, dir, pieces, out, self.templates.as_mut());
            }
        }
    }

    /// End a flow: deliver whatever it still holds, in order, with gaps where records are
    /// missing, then close its decoders (open exchanges come out incomplete).
    fn end(&mut self, key: FlowKey, ts_ns: u64, out: &mut Vec<Decoded>) {
        let Some(mut flow) = self.flows.remove(&key) else {
            return;
        };
        for dir in [direction::INGRESS, direction::EGRESS] {
            let mut pieces = Vec::new();
            flow.streams[dir as usize].drain_all(&mut pieces, &mut self.stats);
            flow.decode(key, dir, pieces, out, self.templates.as_mut());
        }
        flow.close(key, ts_ns, out);
    }

    fn evict_oldest(&mut self, out: &mut Vec<Decoded>) {
        let oldest = self
            .flows
            .iter()
            .min_by_key(|(_, f)| f.last_used)
            .map(|(k, _)| *k);
        if let Some(key) = oldest {
            self.stats.flows_evicted += 1;
            self.end(key, 0, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_common::{RecordHeader, kind};

    const TGID: u32 = 7;
    const FD: u32 = 3;

    fn io(seq: u64, dir: u8, offset: u32, payload: &[u8], last: bool) -> CaptureEvent {
        let io = IoRecord {
            header: RecordHeader {
                kind: kind::IO,
                tgid: TGID,
                tid: TGID,
                _pad: 0,
                ts_ns: seq,
            },
            seq,
            ret: payload.len() as i64,
            fd: FD,
            offset,
            len: payload.len() as u32,
            flags: if last { io_flags::LAST } else { 0 },
            direction: dir,
            ..IoRecord::default()
        };
        CaptureEvent::Kernel(Record::Io {
            io,
            payload: payload.to_vec(),
        })
    }

    fn table(kind: FdKind) -> FlowTable {
        let mut t = FlowTable::new();
        assert!(
            t.handle(CaptureEvent::Fd {
                tgid: TGID,
                fd: FD,
                kind
            })
            .is_empty()
        );
        t
    }

    fn server() -> FdKind {
        FdKind::Tcp {
            local: "127.0.0.1:80".parse().unwrap(),
            peer: "127.0.0.1:5000".parse().unwrap(),
            server_side: true,
            listening: false,
        }
    }

    fn http_count(out: &[Decoded]) -> usize {
        out.iter()
            .filter(|d| matches!(d, Decoded::Http { .. }))
            .count()
    }

    const REQ: &[u8] = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
    const RESP: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

    /// One SSE event in one HTTP chunk, as uvicorn writes it.
    fn sse_chunk(json: &str) -> Vec<u8> {
        let data = format!("data: {json}\n\n");
        format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
    }

    fn content(text: &str) -> Vec<u8> {
        sse_chunk(&format!(
            r#"{{"id":"c-1","created":1765000000,"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}]}}"#
        ))
    }

    /// An SSE_BATCH record of fd FD: (seq, content length) per elided write.
    fn batch(writes: &[(u64, u32)]) -> CaptureEvent {
        CaptureEvent::Kernel(Record::SseBatch {
            header: RecordHeader {
                kind: kind::SSE_BATCH,
                tgid: TGID,
                ..RecordHeader::default()
            },
            fd: FD,
            writes: writes
                .iter()
                .map(|&(seq, content)| ElidedWrite {
                    seq,
                    ts_ns: seq,
                    len: 100,
                    content,
                })
                .collect(),
        })
    }

    /// A table that elides content, with fd FD a server's connection.
    fn eliding_server() -> FlowTable {
        let mut t = FlowTable::eliding_content();
        t.handle(CaptureEvent::Fd {
            tgid: TGID,
            fd: FD,
            kind: server(),
        });
        t
    }

    #[test]
    fn a_servers_content_write_becomes_its_template_and_elided_writes_are_events_in_order() {
        let mut t = eliding_server();
        let request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                     Transfer-Encoding: chunked\r\n\r\n";
        let role = sse_chunk(
            r#"{"id":"c-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        );
        let finish =
            sse_chunk(r#"{"id":"c-1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#);
        let mut out = t.handle(io(0, direction::INGRESS, 0, request, true));
        out.extend(t.handle(io(0, direction::EGRESS, 0, head, true)));
        out.extend(t.handle(io(1, direction::EGRESS, 0, &role, true)));
        assert!(t.take_template_changes().is_empty());
        out.extend(t.handle(io(2, direction::EGRESS, 0, &content("Hi"), true)));
        let changes = t.take_template_changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].0, TGID);
        // The finish comes before the batch holding the writes before it.
        out.extend(t.handle(batch(&[(3, 2), (4, 0)])));
        out.extend(t.handle(io(6, direction::EGRESS, 0, &finish, true)));
        out.extend(t.handle(batch(&[(5, 4)])));
        out.extend(t.handle(io(7, direction::EGRESS, 0, b"0\r\n\r\n", true)));
        let [Decoded::Http { exchange, .. }] = out.as_slice() else {
            panic!("one exchange expected: {out:?}");
        };
        assert!(exchange.complete);
        let events = &exchange.response.as_ref().unwrap().sse_events;
        let seen: Vec<(u64, Option<u32>)> = events.iter().map(|e| (e.ts_ns, e.elided)).collect();
        assert_eq!(
            seen,
            [
                (1, None),
                (2, None),
                (3, Some(2)),
                (4, Some(0)),
                (5, Some(4)),
                (6, None)
            ]
        );
        assert_eq!(t.stats().elided_syscalls, 3);
        assert_eq!(t.stats().gaps, 0);
    }

    #[test]
    fn an_elided_write_where_no_event_stream_is_open_is_lost_bytes() {
        let mut t = eliding_server();
        let mut out = t.handle(io(0, direction::INGRESS, 0, REQ, true));
        out.extend(t.handle(batch(&[(0, 3)])));
        out.extend(t.handle(io(1, direction::EGRESS, 0, RESP, true)));
        // The request's response cannot be told: it is returned without one, and the
        // response that follows without its request.
        let exchanges: Vec<&HttpExchange> = out
            .iter()
            .filter_map(|d| match d {
                Decoded::Http { exchange, .. } => Some(exchange.as_ref()),
                _ => None,
            })
            .collect();
        let [cut, orphan] = exchanges.as_slice() else {
            panic!("{out:?}");
        };
        assert!(cut.response.is_none() && !cut.complete);
        assert!(orphan.request.is_none() && orphan.response.is_some());
    }

    #[test]
    fn without_elision_no_template_is_offered() {
        let mut t = table(server());
        let request = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                     Transfer-Encoding: chunked\r\n\r\n";
        t.handle(io(0, direction::INGRESS, 0, request, true));
        t.handle(io(0, direction::EGRESS, 0, head, true));
        t.handle(io(1, direction::EGRESS, 0, &content("Hi"), true));
        assert!(t.take_template_changes().is_empty());
    }

    #[test]
    fn a_log_gives_its_written_lines_stamped_by_the_write_that_ended_them() {
        let mut t = table(FdKind::Log {
            what: "stderr".into(),
        });
        let mut out = t.handle(io(0, direction::EGRESS, 0, b"[t] Decode", true));
        out.extend(t.handle(io(1, direction::EGRESS, 0, b" batch\nnext\n", true)));
        // What the process reads from the fd is not its log.
        out.extend(t.handle(io(0, direction::INGRESS, 0, b"typed\n", true)));
        let lines: Vec<(u64, &str)> = out
            .iter()
            .map(|d| match d {
                Decoded::Log(log) => {
                    assert_eq!(log.tgid, TGID);
                    (log.ns, log.line.as_str())
                }
                other => panic!("not a log line: {other:?}"),
            })
            .collect();
        assert_eq!(lines, [(1, "[t] Decode batch"), (1, "next")]);
    }

    #[test]
    fn a_watched_eventfd_gives_one_wakeup_per_syscall_and_an_unwatched_one_nothing() {
        let signal = 1u64.to_ne_bytes();
        let mut t = table(FdKind::Eventfd { watched: true });
        let mut out = t.handle(io(0, direction::EGRESS, 0, &signal, true));
        out.extend(t.handle(io(1, direction::INGRESS, 0, &signal, true)));
        let wakeups: Vec<(bool, u64)> = out
            .iter()
            .map(|d| match d {
                Decoded::Wakeup(w) => {
                    assert_eq!((w.tgid, w.tid, w.fd), (TGID, TGID, FD));
                    (w.write, w.ns)
                }
                other => panic!("not a wakeup: {other:?}"),
            })
            .collect();
        assert_eq!(wakeups, [(true, 0), (false, 1)]);

        let mut t = table(FdKind::Eventfd { watched: false });
        assert!(
            t.handle(io(0, direction::EGRESS, 0, &signal, true))
                .is_empty()
        );
        assert_eq!(t.stats().ignored_bytes, 8);
    }

    #[test]
    fn a_poll_record_is_a_loop_wait_ending_at_its_return_and_not_a_message() {
        let poll = |iteration_start_ns| {
            CaptureEvent::Kernel(Record::Poll {
                header: RecordHeader {
                    kind: kind::POLL,
                    tgid: TGID,
                    tid: TGID,
                    _pad: 0,
                    ts_ns: 900,
                },
                enter_ns: 400,
                ret: 1,
                iteration_start_ns,
            })
        };
        let out = FlowTable::new().handle(poll(0));
        let wait = LoopWait {
            tgid: TGID,
            enter_ns: 400,
            exit_ns: 900,
            long_iteration_from_ns: None,
        };
        assert!(matches!(out.as_slice(), [Decoded::LoopWait(w)] if *w == wait));
        assert_eq!((out[0].start_ns(), out[0].end_ns()), (900, 900));
        assert!(!out[0].is_message());
        // The wait after a long iteration says when that iteration began.
        let out = FlowTable::new().handle(poll(100));
        let long = LoopWait {
            long_iteration_from_ns: Some(100),
            ..wait
        };
        assert!(matches!(out.as_slice(), [Decoded::LoopWait(w)] if *w == long));
    }

    #[test]
    fn chunks_of_one_syscall_and_syscalls_out_of_order_are_put_back_in_order() {
        let mut t = table(server());
        let mut out = t.handle(io(0, direction::INGRESS, 0, REQ, true));
        // The response's two syscalls arrive in reverse order; the first is split in 2 records.
        out.extend(t.handle(io(1, direction::EGRESS, 0, &RESP[40..], true)));
        out.extend(t.handle(io(0, direction::EGRESS, 0, &RESP[..20], false)));
        out.extend(t.handle(io(0, direction::EGRESS, 20, &RESP[20..40], true)));
        assert_eq!(http_count(&out), 1);
        let Decoded::Http { exchange, .. } = &out[0] else {
            unreachable!()
        };
        assert_eq!(exchange.response.as_ref().unwrap().body, b"ok");
        assert_eq!(t.stats().gaps, 0);
    }

    #[test]
    fn a_syscall_that_never_arrives_becomes_a_gap_after_two_ticks() {
        let mut t = table(server());
        t.handle(io(0, direction::INGRESS, 0, REQ, true));
        // Response seq 0 is lost; seq 1 holds a whole new response that cannot be trusted as
        // the first one's: the decoder must not glue them.
        t.handle(io(1, direction::EGRESS, 0, RESP, true));
        assert!(t.handle(CaptureEvent::Tick).is_empty());
        let out = t.handle(CaptureEvent::Tick);
        assert_eq!(t.stats().gaps, 1);
        // The request's exchange is reported incomplete, never with a made-up response body.
        for d in &out {
            if let Decoded::Http { exchange, .. } = d
                && let Some(r) = &exchange.request
            {
                assert_eq!(r.path, "/a");
                assert!(!exchange.complete);
            }
        }
    }

    #[test]
    fn a_syscall_without_its_last_record_is_a_gap_and_late_records_are_counted() {
        let mut t = table(server());
        t.handle(io(0, direction::INGRESS, 0, &REQ[..10], false));
        t.handle(CaptureEvent::Tick);
        t.handle(CaptureEvent::Tick);
        assert_eq!(t.stats().gaps, 1);
        t.handle(io(0, direction::INGRESS, 10, &REQ[10..], true));
        assert_eq!(t.stats().late_records, 1);
        // The stream goes on with the next syscall.
        t.handle(io(1, direction::INGRESS, 0, REQ, true));
        let out = t.handle(io(0, direction::EGRESS, 0, RESP, true));
        assert_eq!(http_count(&out), 1);
    }

    #[test]
    fn vanished_fds_are_decoded_by_content() {
        let mut t = table(FdKind::Vanished);
        t.handle(io(0, direction::INGRESS, 0, REQ, true));
        let out = t.handle(io(0, direction::EGRESS, 0, RESP, true));
        assert_eq!(http_count(&out), 1);

        // Bytes that are neither HTTP nor ZMTP are not decoded.
        let mut t = table(FdKind::Vanished);
        assert!(
            t.handle(io(0, direction::INGRESS, 0, b"\x00\x01binary", true))
                .is_empty()
        );
        assert!(t.finish(0).is_empty());
    }

    #[test]
    fn closing_a_flow_reports_the_open_exchange() {
        let mut t = table(server());
        t.handle(io(0, direction::INGRESS, 0, REQ, true));
        let header = RecordHeader {
            kind: kind::CLOSE,
            tgid: TGID,
            tid: TGID,
            _pad: 0,
            ts_ns: 9,
        };
        let out = t.handle(CaptureEvent::Kernel(Record::Close { header, fd: FD }));
        assert_eq!(http_count(&out), 1);
        let Decoded::Http { exchange, .. } = &out[0] else {
            unreachable!()
        };
        assert!(!exchange.complete && exchange.response.is_none());
    }
}
