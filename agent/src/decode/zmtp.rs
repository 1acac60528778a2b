//! ZMTP 3.x (ZeroMQ) stream decoder: turns the bytes of one direction of a libzmq connection
//! into the greeting, commands and multipart messages (RFC 23/ZMTP, 37/ZMTP, NULL mechanism).
//!
//! The agent normally attaches to an engine that has been running for hours, so the greeting is
//! rarely seen and the first captured byte is usually in the middle of a frame. A stream that did
//! not start with a greeting, or that lost bytes (`gap`), is *unsynced*: the decoder then looks for
//! a frame boundary by itself, from two sources of evidence:
//!
//! * syscall starts: libzmq usually starts a `send` at a frame boundary, and a `recv` after a large
//!   body. Each one gets a `Tracker` that follows the frame chain from there without buffering
//!   bodies, so chains through frames larger than the scan window are confirmed too;
//! * any offset of a bounded window of recent bytes (`SCAN_WINDOW`): every offset is checked at
//!   once by one backwards pass (`Scanner::build_links`).
//!
//! A chain is believed when every frame is one libzmq could send (flags, long form only above 255
//! bytes, size limits, known command names, no command inside a message), it explains the bytes
//! up to the end of what is buffered, and it holds enough non-empty frames. Since a chance chain
//! inside a body can only lead onto the real one, the decoder resumes at the point where all
//! believed chains agree, then:
//!
//! * drops the first frame and everything up to and including the next frame without MORE, so a
//!   message that may lack its first frames is never delivered;
//! * holds what it decodes (probation) until a few more frames from new bytes have parsed, and
//!   discards it if sync is lost meanwhile.
//!
//! Once synced it is a streaming parser that copies each body byte once, so a 1 MiB frame that
//! arrives in 16 KiB pieces costs O(1 MiB), and a message is delivered only when complete.

use std::cmp::Reverse;
use std::collections::HashMap;

/// Largest frame, and largest message, accepted by default. vLLM messages carrying tensors can be
/// large, but a bigger size almost always means we are reading a body byte as a header.
pub const DEFAULT_MAX_FRAME_SIZE: u64 = 64 << 20;

/// Bytes kept while unsynced. Bounds the memory and the work of a resync scan per feed; older
/// bytes are discarded (and counted in `bytes_skipped`).
const SCAN_WINDOW: usize = 64 << 10;
/// Commands are small (READY carries a few properties); a bigger one means we are misaligned.
const MAX_COMMAND_SIZE: u64 = 64 << 10;
/// Initial capacity of a frame body, so a bogus huge size cannot allocate up front.
const INITIAL_FRAME_CAPACITY: u64 = 64 << 10;
/// Syscall starts whose chains are followed at the same time while unsynced.
const MAX_TRACKERS: usize = 8;
/// The window scan runs again only once the new bytes reach 1/this of the buffer, so each byte
/// costs at most this many scan steps however small the feeds are.
const SCAN_AMORTIZATION: usize = 8;
/// Resync attempts per feed; each one rescans the window, so this bounds the work on hostile input.
const MAX_RESYNCS_PER_FEED: usize = 8;
/// Solid frames (see [`FrameHeader::is_solid`]) a chain from a syscall start needs before it is
/// believed.
const MIN_FRAMES_AT_SYSCALL_START: u8 = 2;
/// Solid frames that must parse from bytes that arrive after a resync before what it found is
/// delivered. A chance chain inside a body (msgpack is full of small bytes that read as short
/// frames) seldom survives new data, so events are held until then and dropped if sync is lost.
const PROBATION_FRAMES: u8 = 3;
/// Solid frames a chain from an arbitrary offset needs: there are many more candidates, so a
/// longer chain keeps the odds of a chance match in random bytes negligible.
const MIN_FRAMES_ANYWHERE: u8 = 3;

const GREETING_LEN: usize = 64;
const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;
const SHORT_HEADER_LEN: usize = 2;
const LONG_HEADER_LEN: usize = 9;
/// Commands of the NULL mechanism (ZMTP 3.0 and 3.1).
const KNOWN_COMMANDS: [&[u8]; 6] = [
    b"READY",
    b"ERROR",
    b"SUBSCRIBE",
    b"CANCEL",
    b"PING",
    b"PONG",
];
/// "No offset" in the scan tables (the window is far smaller than `u32::MAX`).
const NONE: u32 = u32::MAX;

/// Counters of one stream, for the agent's self-metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZmtpStats {
    /// Messages delivered.
    pub messages: u64,
    /// Frames (data and command) parsed while synced, delivered or not.
    pub frames: u64,
    /// Times a frame boundary was found again after starting mid-stream, a gap or a bad frame.
    pub resyncs: u64,
    /// Bytes discarded while unsynced.
    pub bytes_skipped: u64,
    /// Invalid frames met while synced (each one loses sync).
    pub malformed: u64,
    /// Frames (lose sync) or messages (skipped, sync kept) larger than the maximum size.
    pub oversized_dropped: u64,
    /// Messages dropped because they were, or might have been, incomplete.
    pub partial_dropped: u64,
}

/// What the decoder recognised in the byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZmtpEvent {
    /// The 64-byte greeting that opens a connection.
    Greeting {
        major: u8,
        minor: u8,
        mechanism: String,
        as_server: bool,
    },
    /// A command frame (READY, ERROR, SUBSCRIBE, CANCEL, PING, PONG).
    Command {
        name: String,
        /// Properties of a READY command (e.g. `Socket-Type`, `Identity`); empty otherwise.
        properties: Vec<(String, Vec<u8>)>,
        /// Command data after the name.
        body: Vec<u8>,
    },
    /// A complete multipart message.
    Message(ZmtpMessage),
}

/// A complete message: all its frames, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZmtpMessage {
    /// Timestamp of the feed holding the first byte of the message.
    pub first_ns: u64,
    /// Timestamp of the feed completing the message.
    pub last_ns: u64,
    /// Frame bodies; never empty.
    pub frames: Vec<Vec<u8>>,
}

/// Decoder for one direction of one ZMTP connection.
#[derive(Debug)]
pub struct ZmtpStream {
    max_frame: u64,
    phase: Phase,
    /// Greeting bytes seen so far (at stream start only).
    greeting: Vec<u8>,
    greeting_ts: u64,
    /// Header bytes of the next frame when a header is split across feeds.
    hdr: [u8; LONG_HEADER_LEN],
    hdr_have: usize,
    /// Timestamp of the feed holding the first header byte of the current frame.
    hdr_ts: u64,
    /// Body of the frame being read (when kept).
    frame: Vec<u8>,
    /// Frames of the message being assembled.
    msg: Vec<Vec<u8>>,
    msg_bytes: u64,
    msg_first_ns: u64,
    /// The last data frame had MORE: the next frame continues a message.
    more_pending: bool,
    skip: Skip,
    /// Solid frames from new bytes still needed before events are delivered (see
    /// [`PROBATION_FRAMES`]).
    probation: u8,
    /// Events completed during probation.
    held: Vec<ZmtpEvent>,
    /// Replaying buffered bytes: their frames were part of the evidence, so they do not count
    /// towards probation.
    replaying: bool,
    scan: Scanner,
    stats: ZmtpStats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing seen yet: a greeting or mid-stream bytes.
    Start,
    /// Reading the greeting.
    Greeting,
    /// At (or inside) a frame header.
    Header,
    /// Inside a frame body; `keep` is false when the body is dropped rather than stored.
    Body {
        header: FrameHeader,
        remaining: u64,
        keep: bool,
    },
    /// Looking for a frame boundary.
    Unsynced,
}

/// Which data frames are dropped instead of delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// Deliver.
    None,
    /// Just resynced: the first frame is never trusted to be a real boundary, since a chance
    /// frame in a body can lead onto the real chain in the middle of a multipart message.
    FirstFrame,
    /// Drop frames up to and including the next one without MORE (a possibly partial message).
    ToMessageEnd,
    /// Drop the rest of a message that grew past the maximum size.
    Oversized,
}

impl Skip {
    /// The state after a data frame (with or without MORE) went by.
    fn after_data_frame(self, more: bool) -> Skip {
        match self {
            Skip::None => Skip::None,
            Skip::FirstFrame => Skip::ToMessageEnd,
            Skip::ToMessageEnd | Skip::Oversized if more => self,
            Skip::ToMessageEnd | Skip::Oversized => Skip::None,
        }
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameHeader {
    flags: u8,
    /// Header length: 2 (short) or 9 (long).
    len: usize,
    /// Body size.
    size: u64,
}

impl FrameHeader {
    fn is_command(self) -> bool {
        self.flags & FLAG_COMMAND != 0
    }

    fn has_more(self) -> bool {
        self.flags & FLAG_MORE != 0
    }

    /// Whether the frame counts as evidence that a chain is real. Empty data frames do not: a run
    /// of zero bytes parses as a chain of them.
    fn is_solid(self) -> bool {
        self.is_command() || self.size > 0
    }
}

/// Why sync was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    Malformed,
    Oversized,
}

/// Outcome of parsing from the front of a feed while synced.
enum Step {
    /// This many bytes were used.
    Consumed(usize),
    /// Not ZMTP here: rescan `salvage`, then the input from `resume` on.
    Lost {
        reason: Loss,
        salvage: Vec<u8>,
        resume: usize,
    },
}

impl Default for ZmtpStream {
    fn default() -> Self {
        Self::new()
    }
}

impl ZmtpStream {
    /// A stream with the default maximum frame size ([`DEFAULT_MAX_FRAME_SIZE`]).
    pub fn new() -> Self {
        Self::with_max_frame_size(DEFAULT_MAX_FRAME_SIZE)
    }

    /// A stream that rejects frames, and drops messages, larger than `max_frame` bytes.
    pub fn with_max_frame_size(max_frame: u64) -> Self {
        Self {
            max_frame,
            phase: Phase::Start,
            greeting: Vec::new(),
            greeting_ts: 0,
            hdr: [0; LONG_HEADER_LEN],
            hdr_have: 0,
            hdr_ts: 0,
            frame: Vec::new(),
            msg: Vec::new(),
            msg_bytes: 0,
            msg_first_ns: 0,
            more_pending: false,
            skip: Skip::None,
            probation: 0,
            held: Vec::new(),
            replaying: false,
            scan: Scanner::default(),
            stats: ZmtpStats::default(),
        }
    }

    /// Bytes of one syscall, in order. Returns what they completed.
    pub fn feed(&mut self, ts_ns: u64, data: &[u8]) -> Vec<ZmtpEvent> {
        let mut out = Vec::new();
        if data.is_empty() {
            return out;
        }
        match self.phase {
            Phase::Start | Phase::Greeting => self.feed_greeting(ts_ns, data, &mut out),
            Phase::Unsynced => self.push_scan(ts_ns, data, true),
            Phase::Header | Phase::Body { .. } => self.consume(ts_ns, data, &mut out),
        }
        self.resync(&mut out);
        out
    }

    /// Bytes were lost before the next feed: drop the partial message and resynchronise.
    pub fn gap(&mut self) {
        match self.phase {
            Phase::Header | Phase::Body { .. } => self.drop_partial(),
            Phase::Greeting => {
                self.stats.bytes_skipped += self.greeting.len() as u64;
                self.greeting = Vec::new();
            }
            Phase::Start | Phase::Unsynced => {}
        }
        self.stats.bytes_skipped += self.scan.clear();
        self.phase = Phase::Unsynced;
    }

    /// Counters since the stream was created.
    pub fn stats(&self) -> &ZmtpStats {
        &self.stats
    }

    /// Whether frame boundaries are known (in the greeting or in frames).
    pub fn is_synced(&self) -> bool {
        matches!(
            self.phase,
            Phase::Greeting | Phase::Header | Phase::Body { .. }
        )
    }

    /// Greeting detection at stream start, in whatever pieces libzmq sent it (it sends the
    /// signature, the major version and the rest separately). Anything else goes to the scanner.
    fn feed_greeting(&mut self, ts: u64, data: &[u8], out: &mut Vec<ZmtpEvent>) {
        if self.phase == Phase::Start {
            if data.first() != Some(&0xFF) && whole_messages(data, self.max_frame) {
                // Attached to an idle connection: its next send starts at a message boundary.
                self.phase = Phase::Header;
                self.consume(ts, data, out);
                return;
            }
            if data.first() != Some(&0xFF) {
                self.phase = Phase::Unsynced;
                self.push_scan(ts, data, true);
                return;
            }
            self.phase = Phase::Greeting;
            self.greeting_ts = ts;
        }
        let mut used = 0;
        for &byte in data {
            if self.greeting.len() == GREETING_LEN {
                break;
            }
            if !greeting_byte_ok(self.greeting.len(), byte) {
                return self.abandon_greeting(ts, &data[used..]);
            }
            self.greeting.push(byte);
            used += 1;
        }
        if self.greeting.len() < GREETING_LEN {
            return;
        }
        match parse_greeting(&self.greeting) {
            Some(event) => {
                out.push(event);
                self.greeting = Vec::new();
                self.phase = Phase::Header;
                self.consume(ts, &data[used..], out);
            }
            None => self.abandon_greeting(ts, &data[used..]),
        }
    }

    /// What looked like a greeting was not: scan it as ordinary bytes.
    fn abandon_greeting(&mut self, ts: u64, rest: &[u8]) {
        self.phase = Phase::Unsynced;
        let seen = std::mem::take(&mut self.greeting);
        self.push_scan(self.greeting_ts, &seen, true);
        self.push_scan(ts, rest, false);
    }

    /// Parses frames from `data` while synced. On an invalid frame, sync is lost and the rest of
    /// `data` (from just after the bad header) is handed to the scanner.
    fn consume(&mut self, ts: u64, data: &[u8], out: &mut Vec<ZmtpEvent>) {
        let mut at = 0;
        while at < data.len() {
            let rest = &data[at..];
            let step = match self.phase {
                Phase::Header => self.header_step(ts, rest, out),
                Phase::Body { .. } => self.body_step(ts, rest, out),
                Phase::Start | Phase::Greeting | Phase::Unsynced => {
                    return self.push_scan(ts, rest, false);
                }
            };
            match step {
                Step::Consumed(0) => return,
                Step::Consumed(n) => at += n,
                Step::Lost {
                    reason,
                    salvage,
                    resume,
                } => {
                    self.lose_sync(reason);
                    self.push_scan(ts, &salvage, false);
                    self.push_scan(ts, rest.get(resume..).unwrap_or_default(), false);
                    return;
                }
            }
        }
    }

    /// Reads (part of) a frame header from the front of `data`.
    fn header_step(&mut self, ts: u64, data: &[u8], out: &mut Vec<ZmtpEvent>) -> Step {
        if self.hdr_have == 0 {
            // Fast path: the whole header is usually in this feed.
            self.hdr_ts = ts;
            return match self.check_header(data) {
                Ok(Some(header)) => self.begin_frame(ts, header, header.len, out),
                Ok(None) => {
                    let n = data.len().min(LONG_HEADER_LEN);
                    self.hdr[..n].copy_from_slice(&data[..n]);
                    self.hdr_have = n;
                    Step::Consumed(n)
                }
                Err(reason) => Step::Lost {
                    reason,
                    salvage: Vec::new(),
                    resume: 1,
                },
            };
        }
        let have = self.hdr_have;
        let take = (LONG_HEADER_LEN - have).min(data.len());
        self.hdr[have..have + take].copy_from_slice(&data[..take]);
        match self.check_header(&self.hdr[..have + take]) {
            Ok(Some(header)) => {
                self.hdr_have = 0;
                self.begin_frame(ts, header, header.len - have, out)
            }
            Ok(None) => {
                self.hdr_have = have + take;
                Step::Consumed(take)
            }
            Err(reason) => {
                let salvage = self.hdr[1..have + take].to_vec();
                self.hdr_have = 0;
                Step::Lost {
                    reason,
                    salvage,
                    resume: take,
                }
            }
        }
    }

    /// Header validation while synced: the static rules plus "no command inside a message".
    fn check_header(&self, bytes: &[u8]) -> Result<Option<FrameHeader>, Loss> {
        match parse_header(bytes, self.max_frame)? {
            Some(header) if header.is_command() && self.more_pending => Err(Loss::Malformed),
            other => Ok(other),
        }
    }

    /// A header was read (`used` bytes of this feed): set up the body.
    fn begin_frame(
        &mut self,
        ts: u64,
        header: FrameHeader,
        used: usize,
        out: &mut Vec<ZmtpEvent>,
    ) -> Step {
        let keep = header.is_command() || self.begin_data_frame(header);
        if keep {
            self.frame = Vec::with_capacity(header.size.min(INITIAL_FRAME_CAPACITY) as usize);
        }
        self.phase = Phase::Body {
            header,
            remaining: header.size,
            keep,
        };
        if header.size > 0 {
            return Step::Consumed(used);
        }
        self.complete_frame(ts, header, used, out)
    }

    /// Decides whether a data frame's body is stored; false when it will be dropped.
    fn begin_data_frame(&mut self, header: FrameHeader) -> bool {
        if self.skip != Skip::None {
            return false;
        }
        if self.msg.is_empty() {
            self.msg_first_ns = self.hdr_ts;
        }
        if self.msg_bytes.saturating_add(header.size) > self.max_frame {
            self.stats.oversized_dropped += 1;
            self.msg.clear();
            self.msg_bytes = 0;
            self.skip = Skip::Oversized;
            return false;
        }
        true
    }

    /// Reads body bytes from the front of `data`.
    fn body_step(&mut self, ts: u64, data: &[u8], out: &mut Vec<ZmtpEvent>) -> Step {
        let Phase::Body {
            header,
            remaining,
            keep,
        } = self.phase
        else {
            return Step::Consumed(0);
        };
        let n = usize::try_from(remaining).map_or(data.len(), |r| r.min(data.len()));
        if keep {
            self.frame.extend_from_slice(&data[..n]);
        }
        let remaining = remaining - n as u64;
        if remaining > 0 {
            self.phase = Phase::Body {
                header,
                remaining,
                keep,
            };
            return Step::Consumed(n);
        }
        self.complete_frame(ts, header, n, out)
    }

    /// A frame is complete (the last `used` bytes of this feed finished it).
    fn complete_frame(
        &mut self,
        ts: u64,
        header: FrameHeader,
        used: usize,
        out: &mut Vec<ZmtpEvent>,
    ) -> Step {
        self.phase = Phase::Header;
        if header.is_solid() && !self.replaying {
            self.serve_probation(out);
        }
        let body = std::mem::take(&mut self.frame);
        if header.is_command() {
            return match self.finish_command(body, out) {
                Ok(()) => Step::Consumed(used),
                Err(salvage) => Step::Lost {
                    reason: Loss::Malformed,
                    salvage,
                    resume: used,
                },
            };
        }
        self.stats.frames += 1;
        self.finish_data(ts, header.has_more(), body, out);
        Step::Consumed(used)
    }

    /// Emits a command, or hands its body back when its name is unknown.
    fn finish_command(&mut self, body: Vec<u8>, out: &mut Vec<ZmtpEvent>) -> Result<(), Vec<u8>> {
        let Some((name, data)) = split_command(&body) else {
            return Err(body);
        };
        self.stats.frames += 1;
        // Commands only occur between messages, so the next data frame starts one.
        self.skip = Skip::None;
        let properties = if name == b"READY" {
            parse_properties(data)
        } else {
            Vec::new()
        };
        let event = ZmtpEvent::Command {
            name: String::from_utf8_lossy(name).into_owned(),
            properties,
            body: data.to_vec(),
        };
        self.deliver(event, out);
        Ok(())
    }

    /// Adds a data frame to the current message (or drops it), delivering the message at its end.
    fn finish_data(&mut self, ts: u64, more: bool, body: Vec<u8>, out: &mut Vec<ZmtpEvent>) {
        self.more_pending = more;
        match self.skip {
            Skip::None => {
                self.msg_bytes += body.len() as u64;
                self.msg.push(body);
                if !more {
                    self.emit_message(ts, out);
                }
            }
            Skip::FirstFrame | Skip::ToMessageEnd if !more => self.stats.partial_dropped += 1,
            Skip::FirstFrame | Skip::ToMessageEnd | Skip::Oversized => {}
        }
        self.skip = self.skip.after_data_frame(more);
    }

    fn emit_message(&mut self, ts: u64, out: &mut Vec<ZmtpEvent>) {
        self.msg_bytes = 0;
        let message = ZmtpMessage {
            first_ns: self.msg_first_ns,
            last_ns: ts,
            frames: std::mem::take(&mut self.msg),
        };
        self.deliver(ZmtpEvent::Message(message), out);
    }

    /// Delivers an event, or holds it while on probation.
    fn deliver(&mut self, event: ZmtpEvent, out: &mut Vec<ZmtpEvent>) {
        if self.probation > 0 {
            self.held.push(event);
            return;
        }
        if matches!(event, ZmtpEvent::Message(_)) {
            self.stats.messages += 1;
        }
        out.push(event);
    }

    /// A solid frame from new bytes parsed: one step closer to trusting the resync.
    fn serve_probation(&mut self, out: &mut Vec<ZmtpEvent>) {
        if self.probation == 0 {
            return;
        }
        self.probation -= 1;
        if self.probation == 0 {
            for event in std::mem::take(&mut self.held) {
                self.deliver(event, out);
            }
        }
    }

    fn lose_sync(&mut self, reason: Loss) {
        match reason {
            Loss::Malformed => self.stats.malformed += 1,
            Loss::Oversized => self.stats.oversized_dropped += 1,
        }
        self.drop_partial();
        self.phase = Phase::Unsynced;
    }

    /// Forgets the message being assembled, counting it if it had started.
    fn drop_partial(&mut self) {
        let data_frame_open =
            matches!(self.phase, Phase::Body { header, keep: true, .. } if !header.is_command());
        if self.skip == Skip::None && (!self.msg.is_empty() || data_frame_open) {
            self.stats.partial_dropped += 1;
        }
        let held = self
            .held
            .iter()
            .filter(|e| matches!(e, ZmtpEvent::Message(_)));
        self.stats.partial_dropped += held.count() as u64;
        self.held = Vec::new();
        self.probation = 0;
        self.msg = Vec::new();
        self.msg_bytes = 0;
        self.frame = Vec::new();
        self.hdr_have = 0;
        self.more_pending = false;
        self.skip = Skip::None;
    }

    fn push_scan(&mut self, ts: u64, data: &[u8], syscall_start: bool) {
        self.stats.bytes_skipped += self.scan.push(ts, data, syscall_start, self.max_frame);
    }

    /// While unsynced, looks for a frame boundary and resumes parsing there. Replaying the
    /// buffered bytes can lose sync again (then the rest is buffered again), hence the loop; each
    /// round consumes bytes, and the bound caps the scan work per feed.
    fn resync(&mut self, out: &mut Vec<ZmtpEvent>) {
        for _ in 0..MAX_RESYNCS_PER_FEED {
            if self.phase != Phase::Unsynced {
                return;
            }
            match self.scan.find_sync_point(self.max_frame) {
                Some(SyncPoint::Buffered(at)) => self.replay_from(at, out),
                Some(SyncPoint::Jump(tracker)) => self.jump_to(&tracker),
                None => return,
            }
        }
    }

    /// Resumes at offset `at` of the scan buffer and parses the buffered bytes from there, with
    /// the timestamps of the feeds they came from.
    fn replay_from(&mut self, at: usize, out: &mut Vec<ZmtpEvent>) {
        let (buf, segments) = self.scan.take();
        self.stats.resyncs += 1;
        self.stats.bytes_skipped += at as u64;
        self.phase = Phase::Header;
        self.skip = Skip::FirstFrame;
        self.probation = PROBATION_FRAMES;
        self.replaying = true;
        for (i, segment) in segments.iter().enumerate() {
            let end = segments.get(i + 1).map_or(buf.len(), |next| next.at);
            let start = segment.at.max(at);
            let Some(bytes) = buf.get(start..end).filter(|b| !b.is_empty()) else {
                continue;
            };
            if self.phase == Phase::Unsynced {
                let syscall_start = segment.syscall_start && start == segment.at;
                self.push_scan(segment.ts, bytes, syscall_start);
            } else {
                self.consume(segment.ts, bytes, out);
            }
        }
        self.replaying = false;
    }

    /// Resumes where a tracker is now, when the start of its chain is no longer buffered. The
    /// message in progress there lacks its earlier bytes, so it is dropped.
    fn jump_to(&mut self, tracker: &Tracker) {
        self.stats.resyncs += 1;
        self.stats.bytes_skipped += self.scan.clear();
        let in_message = tracker.more || tracker.body.is_some();
        self.skip = match tracker.skip {
            Skip::None if in_message => Skip::ToMessageEnd,
            other => other,
        };
        self.more_pending = tracker.more;
        self.probation = PROBATION_FRAMES;
        self.hdr = tracker.hdr;
        self.hdr_have = tracker.hdr_have;
        self.hdr_ts = self.scan.last_ts;
        self.phase = match tracker.body {
            Some((header, remaining)) => Phase::Body {
                header,
                remaining,
                keep: false,
            },
            None => Phase::Header,
        };
    }
}

/// Where to resume after a resync.
#[derive(Debug)]
enum SyncPoint {
    /// At this offset of the scan buffer.
    Buffered(usize),
    /// At the current end of the stream, in the state this tracker reached.
    Jump(Tracker),
}

/// A piece of the scan buffer that came from one feed.
#[derive(Debug, Clone, Copy)]
struct Segment {
    /// Offset in the buffer.
    at: usize,
    ts: u64,
    /// The piece starts where a syscall started.
    syscall_start: bool,
}

/// Bytes and candidate chains kept while unsynced.
#[derive(Debug, Default)]
struct Scanner {
    /// The last (at most [`SCAN_WINDOW`]) bytes seen.
    buf: Vec<u8>,
    segments: Vec<Segment>,
    /// Stream offset just past `buf` (bytes pushed since the scanner was last emptied).
    end: u64,
    /// Timestamp of the last push.
    last_ts: u64,
    trackers: Vec<Tracker>,
    /// Scratch table of [`Scanner::build_links`], one entry per buffered byte.
    links: Vec<Link>,
    /// `links` describes the current buffer.
    links_fresh: bool,
    /// Bytes pushed since the last window scan.
    unscanned: usize,
}

impl Scanner {
    /// Buffers `data`, following it with the trackers. Returns the bytes discarded to keep the
    /// buffer within the window.
    fn push(&mut self, ts: u64, data: &[u8], syscall_start: bool, max_frame: u64) -> u64 {
        if data.is_empty() {
            return 0;
        }
        if syscall_start {
            self.add_tracker(Tracker::new(self.end));
        }
        self.trackers.retain_mut(|t| t.advance(data, max_frame));
        self.end += data.len() as u64;
        self.last_ts = ts;
        self.links_fresh = false;
        self.unscanned = self.unscanned.saturating_add(data.len());
        let mut dropped = 0;
        let (data, syscall_start) = match data.len().checked_sub(SCAN_WINDOW) {
            Some(cut) => {
                dropped += (self.buf.len() + cut) as u64;
                self.buf.clear();
                self.segments.clear();
                (&data[cut..], syscall_start && cut == 0)
            }
            None => (data, syscall_start),
        };
        let overflow = (self.buf.len() + data.len()).saturating_sub(SCAN_WINDOW);
        if overflow > 0 {
            self.trim_front(overflow);
            dropped += overflow as u64;
        }
        self.segments.push(Segment {
            at: self.buf.len(),
            ts,
            syscall_start,
        });
        self.buf.extend_from_slice(data);
        dropped
    }

    /// Adds a tracker, evicting one when full: first the oldest without a solid frame (a run of
    /// zero bytes keeps such chains alive forever), else the oldest.
    fn add_tracker(&mut self, tracker: Tracker) {
        if self.trackers.len() >= MAX_TRACKERS {
            let victim = self.trackers.iter().position(|t| t.solid == 0).unwrap_or(0);
            self.trackers.remove(victim);
        }
        self.trackers.push(tracker);
    }

    /// Drops the oldest `n` buffered bytes (fewer than are buffered).
    fn trim_front(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
        let keep = self
            .segments
            .partition_point(|s| s.at <= n)
            .saturating_sub(1);
        self.segments.drain(..keep);
        for segment in &mut self.segments {
            if segment.at < n {
                segment.at = n;
                segment.syscall_start = false;
            }
            segment.at -= n;
        }
    }

    /// Empties the scanner; returns the bytes discarded.
    fn clear(&mut self) -> u64 {
        let dropped = self.buf.len() as u64;
        let _ = self.take();
        dropped
    }

    /// Takes the buffered bytes and their segments, resetting the scanner (and freeing its
    /// scratch memory, which a synced stream does not need).
    fn take(&mut self) -> (Vec<u8>, Vec<Segment>) {
        self.trackers.clear();
        self.links = Vec::new();
        self.links_fresh = false;
        self.unscanned = 0;
        self.end = 0;
        (
            std::mem::take(&mut self.buf),
            std::mem::take(&mut self.segments),
        )
    }

    /// Finds where to resume, if the evidence is strong enough yet: first from the confirmed
    /// syscall-start chains, else from any offset of the window.
    fn find_sync_point(&mut self, max_frame: u64) -> Option<SyncPoint> {
        let confirmed = self.buffered_confirmed_starts();
        if !confirmed.is_empty() {
            self.build_links(max_frame);
            if let Some(at) = self.converged(&confirmed) {
                return Some(SyncPoint::Buffered(at));
            }
            self.drop_refuted_trackers();
        }
        if let Some(tracker) = self.jump_candidate() {
            return Some(SyncPoint::Jump(tracker));
        }
        if self.unscanned.saturating_mul(SCAN_AMORTIZATION) < self.buf.len() {
            return None;
        }
        self.unscanned = 0;
        self.build_links(max_frame);
        let anywhere: Vec<usize> = (0..self.links.len())
            .filter(|&off| self.links[off].accepted(MIN_FRAMES_ANYWHERE))
            .collect();
        self.converged(&anywhere).map(SyncPoint::Buffered)
    }

    /// Buffer offsets where confirmed trackers started.
    fn buffered_confirmed_starts(&self) -> Vec<usize> {
        let buf_start = self.end - self.buf.len() as u64;
        self.trackers
            .iter()
            .filter(|t| t.confirmed() && t.start >= buf_start)
            .filter_map(|t| usize::try_from(t.start - buf_start).ok())
            .collect()
    }

    /// Drops trackers whose chain the window scan rejects (a command name the tracker could only
    /// partly check), so they do not trigger a scan on every feed.
    fn drop_refuted_trackers(&mut self) {
        let buf_start = self.end - self.buf.len() as u64;
        let links = &self.links;
        self.trackers.retain(|t| {
            let Some(at) = t.start.checked_sub(buf_start) else {
                return true;
            };
            usize::try_from(at)
                .ok()
                .and_then(|at| links.get(at))
                .is_some_and(|l| l.terminal != NONE)
        });
    }

    /// The earliest confirmed chain whose start is no longer buffered, to be taken over where it
    /// stands now.
    fn jump_candidate(&self) -> Option<Tracker> {
        self.trackers
            .iter()
            .filter(|t| t.confirmed() && t.can_take_over())
            .min_by_key(|t| t.start)
            .cloned()
    }

    /// Fills `links` with the frame chain starting at every buffered offset, in one backwards
    /// pass: the chain from an offset is its first frame followed by the chain from that frame's
    /// end, already computed.
    fn build_links(&mut self, max_frame: u64) {
        if self.links_fresh {
            return;
        }
        self.links_fresh = true;
        let len = self.buf.len();
        self.links.clear();
        self.links.resize(len, Link::INVALID);
        for off in (0..len).rev() {
            let link = link_at(&self.buf, off, max_frame, &self.links);
            self.links[off] = link;
        }
    }

    /// Among candidate offsets whose chains explain the buffer, the point where they agree.
    ///
    /// Real frames form one chain; a chance "frame" inside a body (or a syscall that started
    /// inside a frame) can only lead onto it, since frames cannot overlap. So candidates are
    /// grouped by where their chain ends, the largest group is taken to be the real chain, and
    /// parsing resumes at the last point where its members have merged: every candidate's chain
    /// passes through it, so a chance prefix before it does not matter.
    fn converged(&self, candidates: &[usize]) -> Option<usize> {
        let mut groups: HashMap<u32, (usize, usize)> = HashMap::new();
        for &off in candidates {
            let terminal = self.links.get(off)?.terminal;
            if terminal != NONE {
                let group = groups.entry(terminal).or_insert((0, off));
                group.0 += 1;
                group.1 = group.1.min(off);
            }
        }
        let (&terminal, &(_, first)) = groups
            .iter()
            .max_by_key(|(_, (members, first))| (*members, Reverse(*first)))?;
        let merge = self.merge_points(first);
        candidates
            .iter()
            .filter(|&&off| off >= first && self.links[off].terminal == terminal)
            .filter_map(|&off| merge.get(off - first).copied())
            .filter(|&m| m != NONE)
            .max()
            .map(|m| m as usize)
    }

    /// For each offset from `first`, where its chain first meets the chain from `first` (the
    /// trunk), or [`NONE`].
    fn merge_points(&self, first: usize) -> Vec<u32> {
        let len = self.buf.len();
        let mut on_trunk = vec![false; len + 1 - first];
        let mut off = first;
        loop {
            on_trunk[off - first] = true;
            let next = self.links[off].next;
            if next == NONE || next as usize <= off {
                break;
            }
            if next as usize >= len {
                on_trunk[len - first] = true;
                break;
            }
            off = next as usize;
        }
        let mut merge = vec![NONE; len + 1 - first];
        for off in (first..=len).rev() {
            let i = off - first;
            merge[i] = if on_trunk[i] {
                off as u32
            } else if off == len {
                NONE
            } else {
                let next = self.links[off].next;
                match (next as usize).checked_sub(first) {
                    Some(j) if next != NONE && next as usize > off => {
                        merge.get(j).copied().unwrap_or(NONE)
                    }
                    _ => NONE,
                }
            };
        }
        merge
    }
}

/// The frame chain from one buffered offset, summarised.
#[derive(Debug, Clone, Copy)]
struct Link {
    /// Offset of the next frame; [`NONE`] when this frame is cut off by the end of the buffer.
    next: u32,
    /// Where the chain ends: the buffer length (the chain ends exactly there) or the offset of
    /// the incomplete frame that reaches past it. [`NONE`] when the chain hits an invalid frame.
    terminal: u32,
    /// Complete solid frames in the chain (saturating).
    solid: u8,
    /// The first frame is a command.
    command: bool,
}

impl Link {
    const INVALID: Link = Link {
        next: NONE,
        terminal: NONE,
        solid: 0,
        command: false,
    };

    fn accepted(self, min_frames: u8) -> bool {
        self.terminal != NONE && self.solid >= min_frames
    }
}

/// The chain from `off`, given the chains from every later offset.
fn link_at(buf: &[u8], off: usize, max_frame: u64, links: &[Link]) -> Link {
    let len = buf.len();
    let header = match parse_header(&buf[off..], max_frame) {
        Err(_) => return Link::INVALID,
        Ok(None) => {
            // A header cut off by the end of the buffer: the chain may go on.
            return Link {
                command: buf[off] & FLAG_COMMAND != 0,
                terminal: off as u32,
                ..Link::INVALID
            };
        }
        Ok(Some(header)) => header,
    };
    let body_start = off + header.len;
    let frame_end = body_start as u64 + header.size;
    let body = &buf[body_start.min(len)..frame_end.min(len as u64) as usize];
    if header.is_command() && !command_prefix_ok(body, header.size) {
        return Link::INVALID;
    }
    if frame_end > len as u64 {
        return Link {
            command: header.is_command(),
            terminal: off as u32,
            ..Link::INVALID
        };
    }
    let frame_end = frame_end as usize;
    let solid = u8::from(header.is_solid());
    let Some(&after) = links.get(frame_end) else {
        return Link {
            next: len as u32,
            terminal: len as u32,
            solid,
            command: header.is_command(),
        };
    };
    if after.terminal == NONE || (header.has_more() && after.command) {
        return Link::INVALID;
    }
    Link {
        next: frame_end as u32,
        terminal: after.terminal,
        solid: after.solid.saturating_add(solid),
        command: header.is_command(),
    }
}

/// Follows the frame chain from one syscall start as bytes arrive, without buffering bodies.
#[derive(Debug, Clone)]
struct Tracker {
    /// Stream offset of the syscall start.
    start: u64,
    hdr: [u8; LONG_HEADER_LEN],
    hdr_have: usize,
    /// Frame being passed and body bytes left.
    body: Option<(FrameHeader, u64)>,
    /// Complete solid frames (saturating).
    solid: u8,
    /// The last data frame had MORE.
    more: bool,
    /// What the stream's skip state would be, had it resumed at `start`.
    skip: Skip,
}

impl Tracker {
    fn new(start: u64) -> Self {
        Self {
            start,
            hdr: [0; LONG_HEADER_LEN],
            hdr_have: 0,
            body: None,
            solid: 0,
            more: false,
            skip: Skip::FirstFrame,
        }
    }

    /// Enough frames were valid to believe the chain.
    fn confirmed(&self) -> bool {
        self.solid >= MIN_FRAMES_AT_SYSCALL_START
    }

    /// The stream can resume at the tracker's position: not inside a command, whose name the
    /// stream could not check without its first bytes.
    fn can_take_over(&self) -> bool {
        !matches!(self.body, Some((header, _)) if header.is_command())
    }

    /// Follows the chain through `data`; false once it meets something that is not ZMTP.
    fn advance(&mut self, mut data: &[u8], max_frame: u64) -> bool {
        while !data.is_empty() {
            let used = match self.body {
                Some((header, left)) => self.advance_body(header, left, data.len()),
                None => match self.advance_header(data, max_frame) {
                    Some(used) => used,
                    None => return false,
                },
            };
            data = data.get(used..).unwrap_or_default();
        }
        true
    }

    fn advance_body(&mut self, header: FrameHeader, left: u64, available: usize) -> usize {
        let n = usize::try_from(left).map_or(available, |l| l.min(available));
        let left = left - n as u64;
        if left == 0 {
            self.body = None;
            self.complete_frame(header);
        } else {
            self.body = Some((header, left));
        }
        n
    }

    /// Reads (part of) a header; `None` when it is invalid.
    fn advance_header(&mut self, data: &[u8], max_frame: u64) -> Option<usize> {
        let have = self.hdr_have;
        let take = (LONG_HEADER_LEN - have).min(data.len());
        self.hdr[have..have + take].copy_from_slice(&data[..take]);
        let Some(header) = parse_header(&self.hdr[..have + take], max_frame).ok()? else {
            self.hdr_have = have + take;
            return Some(take);
        };
        self.hdr_have = 0;
        let used = header.len - have;
        if header.is_command() {
            let body = data.get(used..).unwrap_or_default();
            let seen =
                &body[..usize::try_from(header.size).map_or(body.len(), |s| s.min(body.len()))];
            if self.more || !command_prefix_ok(seen, header.size) {
                return None;
            }
        }
        if header.size == 0 {
            self.complete_frame(header);
        } else {
            self.body = Some((header, header.size));
        }
        Some(used)
    }

    fn complete_frame(&mut self, header: FrameHeader) {
        self.solid = self.solid.saturating_add(u8::from(header.is_solid()));
        if header.is_command() {
            self.skip = Skip::None;
        } else {
            self.more = header.has_more();
            self.skip = self.skip.after_data_frame(self.more);
        }
    }
}

/// Decodes a frame header at the front of `bytes`. `Ok(None)`: more bytes are needed (the bytes
/// so far are valid). Rejects what libzmq never sends: unknown flag bits, a command with MORE, the
/// long form for a size that fits in one byte, and sizes above the limits.
fn parse_header(bytes: &[u8], max_frame: u64) -> Result<Option<FrameHeader>, Loss> {
    let Some(&flags) = bytes.first() else {
        return Ok(None);
    };
    let command = flags & FLAG_COMMAND != 0;
    if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 || (command && flags & FLAG_MORE != 0) {
        return Err(Loss::Malformed);
    }
    let (len, size) = if flags & FLAG_LONG == 0 {
        let Some(&size) = bytes.get(1) else {
            return Ok(None);
        };
        (SHORT_HEADER_LEN, u64::from(size))
    } else {
        let Some(raw) = bytes.get(1..LONG_HEADER_LEN) else {
            return Ok(None);
        };
        let mut be = [0; 8];
        be.copy_from_slice(raw);
        let size = u64::from_be_bytes(be);
        if size <= 255 {
            return Err(Loss::Malformed);
        }
        (LONG_HEADER_LEN, size)
    };
    if command && !(2..=MAX_COMMAND_SIZE.min(max_frame)).contains(&size) {
        return Err(Loss::Malformed);
    }
    if size > max_frame {
        return Err(Loss::Oversized);
    }
    Ok(Some(FrameHeader { flags, len, size }))
}

/// Whether `data`, the first syscall seen on a stream, is a run of whole messages: frames that
/// parse back to back from its first byte (known commands only between messages), at least one
/// of them a non-empty data frame, ending exactly at its last byte with a frame that ends a
/// message. libzmq writes whole encoded frames per syscall, so on a connection that was idle
/// when infertrace attached, this is the normal case and the first message need not be dropped
/// (a syscall that starts mid-message fits these rules only by a rare coincidence of its first
/// bytes with the exact remaining length).
fn whole_messages(data: &[u8], max_frame: u64) -> bool {
    let (mut at, mut in_message, mut solid_data) = (0, false, false);
    while at < data.len() {
        let Ok(Some(header)) = parse_header(&data[at..], max_frame) else {
            return false;
        };
        let body = at + header.len;
        let Some(end) = usize::try_from(header.size)
            .ok()
            .and_then(|size| body.checked_add(size))
            .filter(|&end| end <= data.len())
        else {
            return false;
        };
        if header.is_command() {
            if in_message || split_command(&data[body..end]).is_none() {
                return false;
            }
        } else {
            solid_data |= header.size > 0;
            in_message = header.has_more();
        }
        at = end;
    }
    solid_data && !in_message
}

/// Whether `body`, the first bytes (possibly all) of a command of `size` bytes, can be the start
/// of a known command.
fn command_prefix_ok(body: &[u8], size: u64) -> bool {
    let Some((&name_len, name)) = body.split_first() else {
        return true;
    };
    let name_len = usize::from(name_len);
    if name_len as u64 + 1 > size {
        return false;
    }
    let seen = &name[..name.len().min(name_len)];
    KNOWN_COMMANDS
        .iter()
        .any(|known| known.len() == name_len && known.starts_with(seen))
}

/// Splits a complete command body into its (known) name and data.
fn split_command(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&name_len, rest) = body.split_first()?;
    let (name, data) = rest.split_at_checked(usize::from(name_len))?;
    KNOWN_COMMANDS.contains(&name).then_some((name, data))
}

/// READY properties: name (1-byte length), value (4-byte big-endian length). Stops at the first
/// truncated property.
fn parse_properties(mut data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut properties = Vec::new();
    while let Some((&name_len, rest)) = data.split_first() {
        let Some((name, rest)) = rest.split_at_checked(usize::from(name_len)) else {
            break;
        };
        let Some((value_len, rest)) = rest.split_first_chunk::<4>() else {
            break;
        };
        let Ok(value_len) = usize::try_from(u32::from_be_bytes(*value_len)) else {
            break;
        };
        let Some((value, rest)) = rest.split_at_checked(value_len) else {
            break;
        };
        properties.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
        data = rest;
    }
    properties
}

/// Whether `byte` can be byte `index` of a ZMTP 3 greeting. The 8 padding bytes are free (libzmq
/// writes the ZMTP 1.0 identity length there, 1 for an empty identity).
fn greeting_byte_ok(index: usize, byte: u8) -> bool {
    match index {
        0 => byte == 0xFF,
        9 => byte == 0x7F,
        10 => byte == 3,
        12..=31 => byte == 0 || byte.is_ascii_graphic(),
        32 => byte <= 1,
        _ => true,
    }
}

/// The greeting event, if the 64 bytes hold a well-formed mechanism name.
fn parse_greeting(greeting: &[u8]) -> Option<ZmtpEvent> {
    let mechanism = greeting.get(12..32)?;
    let name_len = mechanism
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(mechanism.len());
    if name_len == 0 || mechanism[name_len..].iter().any(|&b| b != 0) {
        return None;
    }
    Some(ZmtpEvent::Greeting {
        major: *greeting.get(10)?,
        minor: *greeting.get(11)?,
        mechanism: String::from_utf8_lossy(&mechanism[..name_len]).into_owned(),
        as_server: *greeting.get(32)? == 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64: deterministic test data without dependencies.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }

        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }

        /// `min + below(spread)` random bytes.
        fn some_bytes(&mut self, min: usize, spread: usize) -> Vec<u8> {
            let n = min + self.below(spread);
            self.bytes(n)
        }
    }

    /// One data frame, short or long form as libzmq picks it.
    fn frame(more: bool, body: &[u8]) -> Vec<u8> {
        let flags = u8::from(more);
        let mut out = if body.len() > 255 {
            let mut h = vec![flags | FLAG_LONG];
            h.extend_from_slice(&(body.len() as u64).to_be_bytes());
            h
        } else {
            vec![flags, body.len() as u8]
        };
        out.extend_from_slice(body);
        out
    }

    fn encode(frames: &[Vec<u8>]) -> Vec<u8> {
        let last = frames.len().saturating_sub(1);
        frames
            .iter()
            .enumerate()
            .flat_map(|(i, f)| frame(i < last, f))
            .collect()
    }

    fn command(name: &[u8], data: &[u8]) -> Vec<u8> {
        let mut body = vec![name.len() as u8];
        body.extend_from_slice(name);
        body.extend_from_slice(data);
        let mut out = frame(false, &body);
        out[0] |= FLAG_COMMAND;
        out
    }

    fn ready(properties: &[(&str, &[u8])]) -> Vec<u8> {
        let mut data = Vec::new();
        for (name, value) in properties {
            data.push(name.len() as u8);
            data.extend_from_slice(name.as_bytes());
            data.extend_from_slice(&(value.len() as u32).to_be_bytes());
            data.extend_from_slice(value);
        }
        command(b"READY", &data)
    }

    /// A greeting as libzmq 4.x writes it (identity length + 1 in the padding).
    fn greeting() -> Vec<u8> {
        let mut g = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 1];
        g.extend_from_slice(b"NULL");
        g.resize(32, 0);
        g.push(0);
        g.resize(GREETING_LEN, 0);
        g
    }

    fn messages(events: &[ZmtpEvent]) -> Vec<&ZmtpMessage> {
        events
            .iter()
            .filter_map(|e| match e {
                ZmtpEvent::Message(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    fn frames_of(events: &[ZmtpEvent]) -> Vec<Vec<Vec<u8>>> {
        messages(events)
            .into_iter()
            .map(|m| m.frames.clone())
            .collect()
    }

    /// Feeds `data` in pieces of `piece` bytes, timestamps `ts`, `ts + 1`, ...
    fn feed_pieces(s: &mut ZmtpStream, ts: u64, data: &[u8], piece: usize) -> Vec<ZmtpEvent> {
        data.chunks(piece)
            .enumerate()
            .flat_map(|(i, c)| s.feed(ts + i as u64, c))
            .collect()
    }

    /// A synced stream: greeting and READY already fed.
    fn synced() -> ZmtpStream {
        let mut s = ZmtpStream::new();
        s.feed(1, &greeting());
        s.feed(2, &ready(&[("Socket-Type", b"DEALER")]));
        assert!(s.is_synced());
        s
    }

    /// vLLM-style request: request type frame then a msgpack-ish body.
    fn request(rng: &mut Rng, body_len: usize) -> Vec<Vec<u8>> {
        vec![vec![0x00], rng.bytes(body_len)]
    }

    /// `got` is a contiguous run of `sent` ending with its last message.
    fn assert_suffix(got: &[Vec<Vec<u8>>], sent: &[Vec<Vec<u8>>], max_lost: usize) {
        assert!(got.len() <= sent.len(), "more messages than sent");
        let lost = sent.len() - got.len();
        assert!(lost <= max_lost, "lost {lost} messages (max {max_lost})");
        assert!(got == &sent[lost..], "delivered messages are not a suffix");
    }

    #[test]
    fn greeting_in_three_parts_then_ready_and_messages() {
        let mut s = ZmtpStream::new();
        let g = greeting();
        assert!(s.feed(1, &g[..10]).is_empty());
        assert!(s.feed(2, &g[10..11]).is_empty());
        let events = s.feed(3, &g[11..]);
        assert_eq!(
            events,
            vec![ZmtpEvent::Greeting {
                major: 3,
                minor: 1,
                mechanism: "NULL".into(),
                as_server: false
            }]
        );
        let events = s.feed(4, &ready(&[("Socket-Type", b"ROUTER"), ("Identity", b"")]));
        assert_eq!(
            events,
            vec![ZmtpEvent::Command {
                name: "READY".into(),
                properties: vec![
                    ("Socket-Type".into(), b"ROUTER".to_vec()),
                    ("Identity".into(), Vec::new())
                ],
                body: ready(&[("Socket-Type", b"ROUTER"), ("Identity", b"")])[8..].to_vec(),
            }]
        );
        let events = s.feed(5, &encode(&[b"\x00".to_vec(), b"hello".to_vec()]));
        assert_eq!(
            events,
            vec![ZmtpEvent::Message(ZmtpMessage {
                first_ns: 5,
                last_ns: 5,
                frames: vec![b"\x00".to_vec(), b"hello".to_vec()],
            })]
        );
        assert_eq!(s.stats().messages, 1);
        assert_eq!(s.stats().frames, 3);
        assert_eq!(s.stats().resyncs, 0);
    }

    #[test]
    fn multipart_message_of_three_frames() {
        let mut s = synced();
        let sent = vec![b"id".to_vec(), Vec::new(), b"payload".to_vec()];
        let wire = encode(&sent);
        // The last frame alone completes the message.
        assert!(s.feed(10, &wire[..wire.len() - 9]).is_empty());
        let events = s.feed(11, &wire[wire.len() - 9..]);
        let got = messages(&events);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].frames, sent);
        assert_eq!((got[0].first_ns, got[0].last_ns), (10, 11));
    }

    #[test]
    fn short_and_long_frames_byte_exact_in_16k_pieces() {
        let mut rng = Rng(7);
        for size in [0, 1, 255, 256, 300 << 10, 1 << 20] {
            let mut s = synced();
            let sent = vec![b"\x01".to_vec(), rng.bytes(size)];
            let wire = encode(&sent);
            let events = feed_pieces(&mut s, 100, &wire, 16 << 10);
            let got = messages(&events);
            assert_eq!(got.len(), 1, "size {size}");
            assert!(got[0].frames == sent, "size {size} not byte-exact");
            let pieces = wire.len().div_ceil(16 << 10) as u64;
            assert_eq!((got[0].first_ns, got[0].last_ns), (100, 100 + pieces - 1));
        }
    }

    #[test]
    fn headers_split_anywhere() {
        let mut rng = Rng(3);
        let sent = vec![rng.bytes(300), rng.bytes(5), rng.bytes(70_000)];
        let wire = encode(&sent);
        let mut s = synced();
        let events = feed_pieces(&mut s, 1, &wire, 1);
        assert_eq!(frames_of(&events), vec![sent]);
    }

    #[test]
    fn many_small_messages_batched_in_one_feed() {
        let mut rng = Rng(11);
        let sent: Vec<_> = (0..1000).map(|i| request(&mut rng, i % 40)).collect();
        let wire: Vec<u8> = sent.iter().flat_map(|m| encode(m)).collect();
        let mut s = synced();
        let events = s.feed(42, &wire);
        assert_eq!(frames_of(&events), sent);
        assert!(
            messages(&events)
                .iter()
                .all(|m| m.first_ns == 42 && m.last_ns == 42)
        );
    }

    #[test]
    fn midstream_start_inside_large_frame_delivers_only_whole_messages() {
        let mut rng = Rng(5);
        let big = encode(&request(&mut rng, 300 << 10));
        let sent: Vec<_> = (0..6).map(|_| request(&mut rng, 1500)).collect();
        let mut s = ZmtpStream::new();
        let mut events = feed_pieces(&mut s, 1, &big[big.len() / 2..], 16 << 10);
        for (i, m) in sent.iter().enumerate() {
            events.extend(s.feed(1000 + i as u64, &encode(m)));
        }
        assert!(s.is_synced());
        // The first whole message is dropped too: after a resync the first frame is not trusted.
        assert_suffix(&frames_of(&events), &sent, 1);
        assert!(s.stats().bytes_skipped >= (big.len() / 2) as u64 - 16);
    }

    #[test]
    fn midstream_start_at_boundary_inside_multipart_drops_first_message() {
        let partial = vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()];
        let wire = encode(&partial);
        let sent: Vec<_> = (0..4u8).map(|i| vec![vec![i], vec![i; 20]]).collect();
        let next = encode(&sent[0]);
        let mut s = ZmtpStream::new();
        // Start at the second frame of a three-frame message; the syscall ends inside the next
        // message, so it is not a run of whole messages.
        let mut events = s.feed(1, &[&wire[3..], &next[..5]].concat());
        events.extend(s.feed(2, &next[5..]));
        for m in &sent[1..] {
            events.extend(s.feed(2, &encode(m)));
        }
        assert_eq!(frames_of(&events), sent);
        assert_eq!(s.stats().partial_dropped, 1);
        assert_eq!(s.stats().resyncs, 1);
    }

    #[test]
    fn first_syscall_of_whole_messages_is_trusted() {
        // Attached to an idle connection: the first send starts at a message boundary.
        let sent: Vec<_> = (0..3u8).map(|i| vec![vec![i], vec![i; 20]]).collect();
        let mut s = ZmtpStream::new();
        let events = s.feed(1, &[encode(&sent[0]), encode(&sent[1])].concat());
        assert_eq!(frames_of(&events), &sent[..2]);
        assert_eq!(frames_of(&s.feed(2, &encode(&sent[2]))), &sent[2..]);
        assert_eq!(s.stats().resyncs, 0);
        // Not trusted: a first syscall that ends inside a message, or holds an unknown command.
        for first in [
            encode(&sent[0])[..10].to_vec(),
            [&encode(&sent[0])[..], &[0x04, 0x03, 0x02, b'X', b'Y']].concat(),
        ] {
            let mut s = ZmtpStream::new();
            assert!(s.feed(1, &first).is_empty());
            assert!(!s.is_synced());
        }
    }

    #[test]
    fn resync_holds_messages_until_new_frames_confirm_it() {
        let partial = encode(&[b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        let sent: Vec<_> = (1..4u8).map(|i| vec![vec![i], vec![i; 20]]).collect();
        let second = encode(&sent[1]);
        // Starts inside a message and ends inside another: resynchronised, not trusted whole.
        let first = [&partial[3..], &encode(&sent[0])[..], &second[..3]].concat();
        let mut s = ZmtpStream::new();
        // Synced on this feed; its frames were the evidence, so they do not end the probation.
        assert!(s.feed(1, &first).is_empty());
        assert!(s.is_synced());
        assert!(s.feed(2, &second[3..]).is_empty());
        let events = s.feed(3, &encode(&sent[2]));
        assert_eq!(frames_of(&events), sent);
        let times: Vec<_> = messages(&events).iter().map(|m| m.first_ns).collect();
        assert_eq!(times, vec![1, 1, 3]);

        // Sync lost during the probation: what was held is dropped, not delivered.
        let mut s = ZmtpStream::new();
        s.feed(1, &first);
        s.gap();
        assert_eq!(s.stats().messages, 0);
        // The skipped first frames, the held message and the one cut by the gap.
        assert_eq!(s.stats().partial_dropped, 3);
    }

    #[test]
    fn gap_in_message_then_recovery() {
        let mut rng = Rng(9);
        let first = encode(&request(&mut rng, 5000));
        let sent: Vec<_> = (0..5).map(|_| request(&mut rng, 700)).collect();
        let mut s = synced();
        assert!(s.feed(1, &first[..2000]).is_empty());
        s.gap();
        assert!(!s.is_synced());
        let mut events = s.feed(2, &first[3000..]);
        for m in &sent {
            events.extend(s.feed(3, &encode(m)));
        }
        assert_suffix(&frames_of(&events), &sent, 1);
        assert!(s.stats().partial_dropped >= 1);
        assert!(s.is_synced());
    }

    #[test]
    fn random_garbage_fabricates_no_messages() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let garbage = rng.bytes(1 << 20);
        let mut s = ZmtpStream::new();
        let events = feed_pieces(&mut s, 1, &garbage, 4096);
        assert!(messages(&events).is_empty(), "{:?}", s.stats());
        assert_eq!(s.stats().messages, 0);
    }

    #[test]
    fn invalid_flags_lose_sync_then_recover() {
        let mut s = synced();
        let ok = encode(&[b"x".to_vec(), b"y".to_vec()]);
        assert_eq!(messages(&s.feed(1, &ok)).len(), 1);
        let mut bad = vec![0x08, 3, 1, 2, 3];
        bad.extend_from_slice(&ok[..3]); // part of a message, then the bad frame
        s.feed(2, &bad);
        assert!(!s.is_synced());
        assert_eq!(s.stats().malformed, 1);
        let sent: Vec<_> = (0..4u8).map(|i| vec![vec![i], vec![i; 9]]).collect();
        let mut events = Vec::new();
        for m in &sent {
            events.extend(s.feed(3, &encode(m)));
        }
        assert_suffix(&frames_of(&events), &sent, 1);
    }

    #[test]
    fn command_with_more_and_unknown_command_are_malformed() {
        let mut s = synced();
        s.feed(1, &[0x05, 6, 4, b'P', b'I', b'N', b'G', 0]);
        assert_eq!(s.stats().malformed, 1);
        let mut s = synced();
        s.feed(1, &command(b"HELLO", b""));
        assert_eq!(s.stats().malformed, 1);
        // A command inside a multipart message.
        let mut s = synced();
        let mut wire = frame(true, b"a");
        wire.extend(command(b"PING", b"\x00\x00"));
        s.feed(1, &wire);
        assert_eq!(s.stats().malformed, 1);
    }

    #[test]
    fn long_frame_with_small_size_is_malformed() {
        let mut s = synced();
        let mut wire = vec![FLAG_LONG];
        wire.extend_from_slice(&10u64.to_be_bytes());
        wire.extend_from_slice(&[7; 10]);
        assert!(messages(&s.feed(1, &wire)).is_empty());
        assert_eq!(s.stats().malformed, 1);
        assert!(!s.is_synced());
    }

    #[test]
    fn oversized_frame_loses_sync_and_oversized_message_is_skipped() {
        let mut s = ZmtpStream::with_max_frame_size(1000);
        s.feed(1, &greeting());
        s.feed(2, &encode(&[Rng(1).bytes(2000)]));
        assert_eq!(s.stats().oversized_dropped, 1);
        assert!(!s.is_synced());

        let mut s = ZmtpStream::with_max_frame_size(1000);
        s.feed(1, &greeting());
        let too_big = encode(&[vec![1; 600], vec![2; 600]]);
        let fine = encode(&[vec![3; 600]]);
        let events = s.feed(2, &[too_big, fine].concat());
        assert_eq!(frames_of(&events), vec![vec![vec![3; 600]]]);
        assert_eq!(s.stats().oversized_dropped, 1);
        assert!(s.is_synced());
    }

    #[test]
    fn ping_pong_commands() {
        let mut s = synced();
        let ping = command(b"PING", b"\x00\x64ctx");
        let pong = command(b"PONG", b"ctx");
        let events = s.feed(1, &[ping, pong].concat());
        assert_eq!(
            events,
            vec![
                ZmtpEvent::Command {
                    name: "PING".into(),
                    properties: Vec::new(),
                    body: b"\x00\x64ctx".to_vec()
                },
                ZmtpEvent::Command {
                    name: "PONG".into(),
                    properties: Vec::new(),
                    body: b"ctx".to_vec()
                },
            ]
        );
    }

    #[test]
    fn resync_through_frames_larger_than_the_scan_window() {
        // Every message carries a 200 KiB buffer, so no window holds two complete frames: the
        // syscall-start tracker confirms the chain and the stream takes over where it stands.
        let mut rng = Rng(21);
        let sent: Vec<_> = (0..6).map(|_| request(&mut rng, 200 << 10)).collect();
        let mut s = ZmtpStream::new();
        let first = encode(&sent[0]);
        let mut events = feed_pieces(&mut s, 1, &first[first.len() / 3..], 16 << 10);
        for m in &sent[1..] {
            events.extend(feed_pieces(&mut s, 100, &encode(m), 16 << 10));
        }
        assert!(s.is_synced());
        assert_suffix(&frames_of(&events), &sent[1..], 2);
    }

    #[test]
    fn random_bytes_random_splits_never_panic() {
        let mut rng = Rng(1234);
        for round in 0..200 {
            let max = if round % 3 == 0 {
                300
            } else {
                DEFAULT_MAX_FRAME_SIZE
            };
            let mut s = ZmtpStream::with_max_frame_size(max);
            // Mix valid frames, greeting pieces and noise so every state is reached.
            let mut data = Vec::new();
            if round % 4 == 0 {
                data.extend(greeting());
            }
            for _ in 0..rng.below(40) {
                match rng.below(5) {
                    0 => data.extend(rng.some_bytes(0, 600)),
                    1 => data.extend(command(b"PING", &rng.some_bytes(0, 4))),
                    2 => data.extend(ready(&[("Socket-Type", b"PUSH")])),
                    _ => {
                        let n = 1 + rng.below(3);
                        let frames: Vec<_> = (0..n).map(|_| rng.some_bytes(0, 400)).collect();
                        data.extend(encode(&frames));
                    }
                }
            }
            let mut at = 0;
            while at < data.len() {
                let n = (1 + rng.below(700)).min(data.len() - at);
                for event in s.feed(at as u64, &data[at..at + n]) {
                    if let ZmtpEvent::Message(m) = event {
                        assert!(!m.frames.is_empty());
                        assert!(m.first_ns <= m.last_ns);
                    }
                }
                if rng.below(20) == 0 {
                    s.gap();
                }
                at += n;
            }
        }
    }

    fn random_messages(rng: &mut Rng, n: usize) -> Vec<Vec<Vec<u8>>> {
        (0..n)
            .map(|_| {
                let frames = 1 + rng.below(4);
                (0..frames)
                    .map(|_| match rng.below(10) {
                        0 => Vec::new(),
                        1 => rng.some_bytes(256, 3000),
                        _ => rng.some_bytes(0, 256),
                    })
                    .collect()
            })
            .collect()
    }

    /// Feeds `wire` split at random points; returns the delivered messages.
    fn feed_random_splits(s: &mut ZmtpStream, rng: &mut Rng, wire: &[u8]) -> Vec<Vec<Vec<u8>>> {
        let mut got = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let n = (1 + rng.below(5000)).min(wire.len() - at);
            got.extend(frames_of(&s.feed(at as u64, &wire[at..at + n])));
            at += n;
        }
        got
    }

    #[test]
    fn encoded_messages_split_at_random_points_round_trip() {
        let mut rng = Rng(99);
        for _ in 0..30 {
            let count = 1 + rng.below(60);
            let sent = random_messages(&mut rng, count);
            let mut wire = greeting();
            wire.extend(ready(&[("Socket-Type", b"DEALER")]));
            wire.extend(sent.iter().flat_map(|m| encode(m)));
            let mut s = ZmtpStream::new();
            assert_eq!(feed_random_splits(&mut s, &mut rng, &wire), sent);
            assert_eq!(s.stats().messages, sent.len() as u64);
        }
    }

    #[test]
    fn midstream_at_random_offsets_delivers_a_suffix() {
        let mut rng = Rng(2024);
        for _ in 0..30 {
            let sent = random_messages(&mut rng, 120);
            let wire: Vec<u8> = sent.iter().flat_map(|m| encode(m)).collect();
            let from = rng.below(wire.len() / 2);
            let mut s = ZmtpStream::new();
            let got = feed_random_splits(&mut s, &mut rng, &wire[from..]);
            assert!(!got.is_empty());
            // Whatever was lost at the start, what is delivered is whole and in order.
            assert_suffix(&got, &sent, sent.len());
        }
    }

    /// A msgpack-like array of token ids: full of small bytes that read as short frames.
    fn token_array(rng: &mut Rng, n: usize) -> Vec<u8> {
        let mut body = vec![0xdc, (n >> 8) as u8, n as u8];
        for _ in 0..n {
            let limit = if rng.below(3) == 0 { 128 } else { 150_000 };
            let t = rng.below(limit) as u32;
            match t {
                0..128 => body.push(t as u8),
                128..65536 => body.extend([0xcd, (t >> 8) as u8, t as u8]),
                _ => body.extend([0xce, 0, (t >> 16) as u8, (t >> 8) as u8, t as u8]),
            }
        }
        body
    }

    #[test]
    fn msgpack_like_bodies_midstream_deliver_a_suffix() {
        // Chance chains inside such bodies are common; the convergence rule and the probation
        // must keep them from producing messages.
        for seed in 1..=40 {
            let mut rng = Rng(seed);
            let sent: Vec<_> = (0..40)
                .map(|_| {
                    let n = rng.below(2000);
                    vec![vec![0], token_array(&mut rng, n)]
                })
                .collect();
            let wire: Vec<u8> = sent.iter().flat_map(|m| encode(m)).collect();
            let from = rng.below(wire.len() / 2);
            let mut s = ZmtpStream::new();
            let got = feed_random_splits(&mut s, &mut rng, &wire[from..]);
            assert!(!got.is_empty(), "seed {seed}");
            assert_suffix(&got, &sent, sent.len());
        }
    }

    #[test]
    fn gap_while_unsynced_and_at_start_is_harmless() {
        let mut s = ZmtpStream::new();
        s.gap();
        s.feed(1, &[1, 2, 3]);
        s.gap();
        s.feed(2, &[0xFF, 0, 0]);
        s.gap();
        assert_eq!(s.stats().messages, 0);
        assert_eq!(s.stats().bytes_skipped, 6);
        assert!(!s.is_synced());
    }
}
