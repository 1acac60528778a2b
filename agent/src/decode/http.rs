//! HTTP/1.1 exchange reassembly from the bytes of read/write syscalls on one TCP connection.
//!
//! The capture gives, per direction, the bytes of each syscall and a CLOCK_MONOTONIC timestamp.
//! [`HttpConnection`] turns them into [`HttpExchange`]s (request + response) with the timestamps
//! of their first and last bytes, and with the SSE events of streaming responses stamped by the
//! syscall that completed them (the basis of time-to-first-token and inter-token latency).
//!
//! Design choices, and why:
//! * **Attach anywhere.** The agent usually attaches to an engine that has served traffic for
//!   hours, so a direction starts "unsynced" and skips bytes until something that looks like a
//!   message start (a request line or a status line), searching inside the buffered bytes rather
//!   than only at syscall starts. The same happens after [`HttpConnection::gap`] and after a
//!   malformed message. Skipped bytes are counted, never decoded.
//! * **Never invent an exchange.** Responses are matched FIFO to requests. When bytes of a
//!   request are lost, a placeholder keeps the FIFO aligned so the response to the lost request is
//!   reported as an orphan (request `None`) instead of being paired with the next request. A
//!   response whose first byte precedes the first byte of the oldest pending request cannot
//!   answer it and is an orphan too. Exchanges cut by a gap or by `close` come back with
//!   `complete = false`.
//! * **Bounded memory.** Heads are limited to [`MAX_HEAD`], kept bodies to [`MAX_BODY`] (framing
//!   is still followed past the limit), pending requests to [`MAX_PENDING`], and retained SSE
//!   events to [`MAX_SSE_BYTES`]. Only incomplete heads, chunk-size lines and trailers are ever
//!   buffered; body bytes are consumed in the feed that brought them.
//! * **No panics.** Every input-derived index goes through `get` or is bounded by a length check.

use std::collections::VecDeque;

use infertrace_common::ElidedWrite;

use crate::decode::sse::{SseEvent, SseParser};

/// Largest request or response head (start line + headers); larger heads are malformed.
pub const MAX_HEAD: usize = 64 << 10;
/// Largest body kept per message; the rest is framed but dropped (`body_truncated`).
pub const MAX_BODY: usize = 8 << 20;
/// Most requests awaiting a response per connection; beyond it the oldest is dropped.
pub const MAX_PENDING: usize = 64;
/// Budget for the SSE events kept per response (data and strings plus a fixed overhead each).
pub const MAX_SSE_BYTES: usize = 16 << 20;
/// Most headers per head; more is treated as malformed (httparse needs a fixed array).
const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (with extensions) accepted.
const MAX_CHUNK_LINE: usize = 4 << 10;
/// Longest request target accepted while searching for a request line to resynchronise on.
const MAX_RESYNC_TARGET: usize = 8 << 10;
/// Accounting overhead per retained SSE event (struct size, roughly).
const SSE_EVENT_OVERHEAD: usize = 80;

/// Request methods that may start a message when resynchronising (with their trailing space).
const METHODS: [&[u8]; 9] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"DELETE ",
    b"HEAD ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
];

/// The bytes begin with a request method and a space (a request line, most likely).
pub fn starts_with_method(data: &[u8]) -> bool {
    METHODS.iter().any(|m| data.starts_with(m))
}

const DIGITS: &[u8] = b"0123456789";
/// `HTTP/1.x SP 3DIGIT`: the start of a status line, one allowed byte set per position.
const STATUS_START: [&[u8]; 12] = [
    b"H", b"T", b"T", b"P", b"/", b"1", b".", b"01", b" ", DIGITS, DIGITS, DIGITS,
];
/// ` HTTP/1.x CRLF`: the end of a request line after its target.
const REQUEST_LINE_END: [&[u8]; 11] = [
    b" ", b"H", b"T", b"T", b"P", b"/", b"1", b".", b"01", b"\r", b"\n",
];

/// Decoder health counters, cumulative over the connection's life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpStats {
    /// Times a direction regained sync after skipping bytes, a gap or a malformed message.
    pub resyncs: u64,
    /// Bytes discarded undecoded (while unsynced, or buffered when a gap was reported).
    pub bytes_skipped: u64,
    /// Heads or bodies that did not parse.
    pub malformed: u64,
    /// Messages whose body exceeded [`MAX_BODY`].
    pub bodies_truncated: u64,
    /// Responses returned without their request.
    pub orphan_responses: u64,
    /// Pending requests dropped because more than [`MAX_PENDING`] awaited a response.
    pub requests_dropped: u64,
    /// SSE events not kept because a response exceeded [`MAX_SSE_BYTES`].
    pub sse_events_dropped: u64,
    /// Events the kernel reported by time only ([`HttpConnection::elided_event`]).
    pub sse_events_elided: u64,
    /// Such reports that did not fall between two events of a streamed response (taken as
    /// lost bytes).
    pub sse_elided_misplaced: u64,
}

/// A request head and (possibly truncated) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    pub path: String,
    /// Minor version: 0 or 1 for HTTP/1.0 and HTTP/1.1.
    pub version: u8,
    pub headers: Vec<(String, Vec<u8>)>,
    /// De-chunked body, at most [`MAX_BODY`] bytes.
    pub body: Vec<u8>,
    /// Timestamp of the syscall holding the first byte of the request line.
    pub first_ns: u64,
    /// Timestamp of the syscall that completed the request (or its latest bytes, if incomplete).
    pub last_ns: u64,
    /// The body is not the whole body: it exceeded [`MAX_BODY`] or bytes of it were lost.
    pub body_truncated: bool,
}

/// A response head, body and SSE events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub reason: String,
    /// Minor version: 0 or 1 for HTTP/1.0 and HTTP/1.1.
    pub version: u8,
    pub headers: Vec<(String, Vec<u8>)>,
    /// De-chunked body, at most [`MAX_BODY`] bytes.
    pub body: Vec<u8>,
    /// Timestamp of the syscall holding the first byte of the status line.
    pub first_ns: u64,
    /// Timestamp of the syscall that completed the response (the `close` for responses framed by
    /// the connection's end), or of its latest bytes if incomplete.
    pub last_ns: u64,
    /// Events of a `text/event-stream` body, each stamped by the syscall that completed it.
    pub sse_events: Vec<SseEvent>,
    /// The body is not the whole body: it exceeded [`MAX_BODY`] or bytes of it were lost.
    pub body_truncated: bool,
    /// Some SSE events were not kept (see [`MAX_SSE_BYTES`]).
    pub sse_truncated: bool,
    /// Body bytes of elided events ([`SseEvent::elided`]), not in `body`.
    pub body_elided: u64,
}

/// One request/response pair, or half of one when the other half was not seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpExchange {
    /// `None` when the response's request was not seen (attached mid-exchange or lost bytes).
    pub request: Option<HttpRequest>,
    /// `None` when the response was lost or never came.
    pub response: Option<HttpResponse>,
    /// The response was fully received according to its framing.
    pub complete: bool,
}

impl HttpRequest {
    /// First header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }
}

impl HttpResponse {
    /// First header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }

    /// Whether the body is a Server-Sent Events stream.
    pub fn is_event_stream(&self) -> bool {
        self.header("content-type").is_some_and(is_event_stream)
    }
}

fn find_header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// `text/event-stream`, optionally followed by parameters (`; charset=utf-8`).
fn is_event_stream(content_type: &[u8]) -> bool {
    let media = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    media.eq_ignore_ascii_case(b"text/event-stream")
}

/// Bytes of one direction not yet consumed, with the timestamp of the syscall of each byte.
#[derive(Debug, Default)]
struct Inbox {
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    base: u64,
    /// `(stream offset of first byte, ts)` of each syscall still (partly) in `buf`, ascending.
    stamps: VecDeque<(u64, u64)>,
}

impl Inbox {
    fn push(&mut self, ts_ns: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.stamps.back().is_none_or(|&(_, ts)| ts != ts_ns) {
            let start = self.base + self.buf.len() as u64;
            self.stamps.push_back((start, ts_ns));
        }
        self.buf.extend_from_slice(data);
    }

    /// Timestamp of the syscall that brought `buf[pos]`.
    fn ts_at(&self, pos: usize) -> u64 {
        let at = self.base + pos as u64;
        let idx = self.stamps.partition_point(|&(start, _)| start <= at);
        idx.checked_sub(1)
            .and_then(|i| self.stamps.get(i))
            .map_or(0, |&(_, ts)| ts)
    }

    fn consume(&mut self, n: usize) {
        let n = n.min(self.buf.len());
        self.buf.drain(..n);
        self.base += n as u64;
        while self
            .stamps
            .get(1)
            .is_some_and(|&(start, _)| start <= self.base)
        {
            self.stamps.pop_front();
        }
        if self.buf.is_empty() {
            self.stamps.clear();
        }
    }

    /// Steps over `n` bytes that were not copied, with nothing buffered.
    fn pass(&mut self, n: u64) {
        debug_assert!(self.buf.is_empty());
        self.base += n;
    }

    /// Drops everything buffered; returns how many bytes that was.
    fn clear(&mut self) -> usize {
        let n = self.buf.len();
        self.consume(n);
        n
    }
}

/// How far one direction trusts its position in the byte stream.
#[derive(Debug, Default)]
struct SyncState {
    /// The current position follows a message that completed normally (not a resync guess).
    verified: bool,
    /// Sync was lost (gap or malformed) since the last message start was found.
    lost: bool,
    /// Bytes skipped since the last message start was found.
    skipped: u64,
    /// Where the end of the next head is (or is not), so bytes are not searched twice.
    head_end: HeadEnd,
}

/// What is known about the blank line ending a head, in stream offsets (which never repeat, so
/// the knowledge stays true across feeds, resync candidates and gaps). It keeps 1-byte feeds of
/// a head, and a run of bogus resync candidates sharing one terminator, linear in the bytes.
#[derive(Debug, Default, Clone, Copy)]
struct HeadEnd {
    /// No head terminator starts before `scanned_to - 3` (from where the last search began).
    scanned_to: u64,
    /// Offset of the first terminator at or after the last search start.
    found: Option<u64>,
}

impl HeadEnd {
    /// Whether a head starting at stream offset `start`, whose bytes so far are `avail`, may be
    /// complete: only then is it worth running the full parser.
    fn may_be_complete(&mut self, start: u64, avail: &[u8]) -> bool {
        if self.found.is_some_and(|f| f >= start) {
            return true;
        }
        // A terminator beyond MAX_HEAD ends an oversized head: no need to look that far.
        let window = &avail[..avail.len().min(MAX_HEAD + 4)];
        let from = self.scanned_to.saturating_sub(3).max(start) - start;
        let from = usize::try_from(from)
            .unwrap_or(usize::MAX)
            .min(window.len());
        match find_head_terminator(&window[from..]) {
            Some(i) => {
                let at = start + (from + i) as u64;
                self.found = Some(at);
                self.scanned_to = at;
                true
            }
            None => {
                self.nothing_before(start + window.len() as u64);
                false
            }
        }
    }

    /// Nothing before stream offset `end` completes the head (the parser said so).
    fn nothing_before(&mut self, end: u64) {
        self.scanned_to = end;
        self.found = None;
    }
}

/// Offset of the first `\n\n` or `\n\r\n` (the blank line after the last header line).
fn find_head_terminator(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find(|&i| {
        buf[i] == b'\n'
            && (buf.get(i + 1) == Some(&b'\n') || buf.get(i + 1..i + 3) == Some(&b"\r\n"[..]))
    })
}

#[derive(Debug, Default)]
enum ReqState {
    /// Searching for a request line.
    #[default]
    Unsynced,
    /// At a message boundary, waiting for a complete head.
    Idle,
    /// Reading the body of the pending request `seq`.
    Body { seq: u64, body: BodyReader },
    /// The connection switched protocols: nothing here is HTTP any more.
    Upgraded,
}

#[derive(Debug, Default)]
enum RespState {
    #[default]
    Unsynced,
    Idle,
    Body(Box<OpenResponse>),
    Upgraded,
}

/// One direction: its unconsumed bytes, parser state and sync bookkeeping.
#[derive(Debug, Default)]
struct Direction<S> {
    inbox: Inbox,
    state: S,
    sync: SyncState,
}

/// A response whose body is still arriving.
#[derive(Debug)]
struct OpenResponse {
    resp: HttpResponse,
    /// `seq` of the request it answers, `None` for an orphan.
    matched: Option<u64>,
    body: BodyReader,
    sse: Option<SseParser>,
    /// SSE bytes retained so far, against [`MAX_SSE_BYTES`].
    sse_bytes: usize,
}

impl OpenResponse {
    /// Keep an elided event ([`HttpConnection::elided_event`]), when this response is an
    /// event stream between two chunks and two events.
    fn take_elided(&mut self, write: &ElidedWrite, stats: &mut HttpStats) -> bool {
        let (BodyReader::Chunked(Chunk::Size), Some(parser)) = (&self.body, self.sse.as_mut())
        else {
            return false;
        };
        let Some(event) = parser.elided(write.ts_ns, write.content) else {
            return false;
        };
        self.resp.last_ns = write.ts_ns;
        self.resp.body_elided += u64::from(write.len);
        keep_event(&mut self.resp, &mut self.sse_bytes, stats, event);
        true
    }
}

/// An entry of the FIFO of requests awaiting a response.
#[derive(Debug)]
enum Slot {
    Seen {
        seq: u64,
        req: HttpRequest,
    },
    /// A request whose bytes were lost: its response must not be paired with the next request.
    Lost,
}

/// Body framing state of one message.
#[derive(Debug, Clone)]
enum BodyReader {
    /// `Content-Length`: bytes still expected.
    Length(u64),
    Chunked(Chunk),
    /// No length: the body ends when the connection closes.
    UntilClose,
}

#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data: bytes left.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last chunk: trailer lines until a blank line (bytes of full lines so far).
    Trailers(usize),
}

enum Progress {
    NeedMore,
    Done,
    Malformed,
}

impl BodyReader {
    /// Consumes body bytes from `input`, passing de-chunked data to `sink`. Returns the bytes
    /// consumed and whether the body is complete.
    fn advance(&mut self, input: &[u8], sink: &mut dyn FnMut(&[u8])) -> (usize, Progress) {
        match self {
            BodyReader::Length(left) => {
                let n = input
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                sink(&input[..n]);
                *left -= n as u64;
                let done = *left == 0;
                (
                    n,
                    if done {
                        Progress::Done
                    } else {
                        Progress::NeedMore
                    },
                )
            }
            BodyReader::UntilClose => {
                sink(input);
                (input.len(), Progress::NeedMore)
            }
            BodyReader::Chunked(state) => advance_chunked(state, input, sink),
        }
    }
}

/// Chunked transfer coding: size lines (extensions ignored), data, CRLF, last chunk, trailers.
fn advance_chunked(
    state: &mut Chunk,
    input: &[u8],
    sink: &mut dyn FnMut(&[u8]),
) -> (usize, Progress) {
    let mut pos = 0;
    loop {
        let rest = input.get(pos..).unwrap_or_default();
        let (used, next) = match *state {
            Chunk::Size => chunk_size(rest),
            Chunk::Data(left) => {
                let n = rest.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                sink(&rest[..n]);
                let left = left - n as u64;
                let next = if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                };
                (n, Ok(next))
            }
            Chunk::DataEnd => match rest {
                [b'\r', b'\n', ..] => (2, Ok(Chunk::Size)),
                [b'\n', ..] => (1, Ok(Chunk::Size)),
                [] | [b'\r'] => (0, Err(Progress::NeedMore)),
                _ => (0, Err(Progress::Malformed)),
            },
            Chunk::Trailers(seen) => trailer_line(rest, seen),
        };
        pos += used;
        match next {
            Ok(next) => *state = next,
            Err(progress) => return (pos, progress),
        }
        if used == 0 {
            return (pos, Progress::NeedMore);
        }
    }
}

/// Parses one chunk-size line. `Err` carries how to stop.
fn chunk_size(rest: &[u8]) -> (usize, Result<Chunk, Progress>) {
    // httparse accepts an empty size line as size 0; a real size starts with a hex digit.
    match rest.first() {
        None => return (0, Err(Progress::NeedMore)),
        Some(b) if !b.is_ascii_hexdigit() => return (0, Err(Progress::Malformed)),
        Some(_) => {}
    }
    match httparse::parse_chunk_size(rest) {
        Ok(httparse::Status::Complete((n, 0))) => (n, Ok(Chunk::Trailers(0))),
        Ok(httparse::Status::Complete((n, size))) => (n, Ok(Chunk::Data(size))),
        Ok(httparse::Status::Partial) if rest.len() <= MAX_CHUNK_LINE => {
            (0, Err(Progress::NeedMore))
        }
        _ => (0, Err(Progress::Malformed)),
    }
}

/// Consumes one trailer line; a blank line ends the message. Trailers are not kept: nothing
/// downstream needs them, and they are bounded by [`MAX_HEAD`] in total.
fn trailer_line(rest: &[u8], seen: usize) -> (usize, Result<Chunk, Progress>) {
    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
        let progress = if seen + rest.len() > MAX_HEAD {
            Progress::Malformed
        } else {
            Progress::NeedMore
        };
        return (0, Err(progress));
    };
    let line = &rest[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return (nl + 1, Err(Progress::Done));
    }
    let seen = seen + nl + 1;
    if seen > MAX_HEAD {
        return (nl + 1, Err(Progress::Malformed));
    }
    (nl + 1, Ok(Chunk::Trailers(seen)))
}

/// Result of matching a pattern against the start of some bytes.
#[derive(Debug, PartialEq, Eq)]
enum Match {
    Yes,
    /// The bytes end before the pattern could be decided.
    Partial,
    No,
}

/// Matches `input` against one allowed byte set per position.
fn match_sets(input: &[u8], sets: &[&[u8]]) -> Match {
    for (i, set) in sets.iter().enumerate() {
        match input.get(i) {
            None => return Match::Partial,
            Some(b) if set.contains(b) => {}
            Some(_) => return Match::No,
        }
    }
    Match::Yes
}

fn match_literal(input: &[u8], literal: &[u8]) -> Match {
    let n = input.len().min(literal.len());
    if input[..n] != literal[..n] {
        Match::No
    } else if n < literal.len() {
        Match::Partial
    } else {
        Match::Yes
    }
}

/// `HTTP/1.x SP 3DIGIT`.
fn match_status_start(input: &[u8]) -> Match {
    match_sets(input, &STATUS_START)
}

/// `METHOD SP target SP HTTP/1.x CRLF`, with a known method and a bounded target.
fn match_request_line(input: &[u8]) -> Match {
    // Fast rejection: most skipped bytes cannot start any method.
    if !matches!(
        input.first(),
        Some(b'G' | b'P' | b'D' | b'H' | b'O' | b'C' | b'T')
    ) {
        return Match::No;
    }
    let mut partial = false;
    for method in METHODS {
        match match_literal(input, method) {
            Match::Yes => return match_target_and_version(&input[method.len()..]),
            Match::Partial => partial = true,
            Match::No => {}
        }
    }
    if partial { Match::Partial } else { Match::No }
}

fn match_target_and_version(input: &[u8]) -> Match {
    for (i, &b) in input.iter().enumerate().take(MAX_RESYNC_TARGET + 1) {
        if b == b' ' {
            if i == 0 {
                return Match::No;
            }
            return match_sets(&input[i..], &REQUEST_LINE_END);
        }
        if b < 0x21 || b == 0x7f {
            return Match::No;
        }
    }
    if input.len() > MAX_RESYNC_TARGET {
        Match::No
    } else {
        Match::Partial
    }
}

enum Scan {
    Found(usize),
    /// A possible start at this offset needs more bytes; everything before it can go.
    Partial(usize),
    NotFound,
}

/// Finds the first offset where `matcher` matches or might match with more bytes. A partial
/// candidate runs to the end of the buffer, so no full match can follow it.
fn scan(buf: &[u8], matcher: fn(&[u8]) -> Match) -> Scan {
    for i in 0..buf.len() {
        match matcher(&buf[i..]) {
            Match::Yes => return Scan::Found(i),
            Match::Partial => return Scan::Partial(i),
            Match::No => {}
        }
    }
    Scan::NotFound
}

/// Whether the head at `inbox.buf[pos..]` is worth parsing yet.
enum HeadCheck {
    /// No bytes, or no terminator and still under [`MAX_HEAD`]: wait for more.
    Wait,
    /// No terminator within [`MAX_HEAD`]: malformed.
    Oversized,
    Ready,
}

fn check_head(head_end: &mut HeadEnd, inbox: &Inbox, pos: usize) -> HeadCheck {
    let avail = inbox.buf.get(pos..).unwrap_or_default();
    if avail.is_empty() {
        HeadCheck::Wait
    } else if head_end.may_be_complete(inbox.base + pos as u64, avail) {
        HeadCheck::Ready
    } else if avail.len() > MAX_HEAD {
        HeadCheck::Oversized
    } else {
        HeadCheck::Wait
    }
}

fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect()
}

/// `Content-Length` per RFC 9112 section 6.3: repeated identical values are accepted, anything
/// else that is not a plain decimal number is malformed. `Ok(None)` when absent.
fn content_length(headers: &[(String, Vec<u8>)]) -> Result<Option<u64>, ()> {
    let mut found: Option<u64> = None;
    let values = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"));
    for (_, value) in values {
        for part in value.split(|&b| b == b',') {
            let n = parse_decimal(part.trim_ascii()).ok_or(())?;
            if found.is_some_and(|f| f != n) {
                return Err(());
            }
            found = Some(n);
        }
    }
    Ok(found)
}

fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// `Some(true)` if `Transfer-Encoding` ends in `chunked`, `Some(false)` if present otherwise.
fn transfer_chunked(headers: &[(String, Vec<u8>)]) -> Option<bool> {
    let last = headers
        .iter()
        .rfind(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))?;
    let coding = last
        .1
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .rfind(|c| !c.is_empty())
        .unwrap_or_default();
    Some(coding.eq_ignore_ascii_case(b"chunked"))
}

/// Request body framing: chunked, Content-Length or none. `Err` for invalid framing.
fn request_framing(headers: &[(String, Vec<u8>)]) -> Result<Option<BodyReader>, ()> {
    match transfer_chunked(headers) {
        Some(true) => return Ok(Some(BodyReader::Chunked(Chunk::Size))),
        // A request cannot be delimited by the connection close (RFC 9112 section 6.3).
        Some(false) => return Err(()),
        None => {}
    }
    Ok(content_length(headers)?
        .filter(|&n| n > 0)
        .map(BodyReader::Length))
}

/// How a response's body is delimited.
enum RespFraming {
    NoBody,
    /// 101 or a successful CONNECT: the connection stops being HTTP after the head.
    Upgrade,
    Body(BodyReader),
}

/// Response framing per RFC 9112 section 6.3. `Err` for an invalid Content-Length.
fn response_framing(
    status: u16,
    request: Option<&HttpRequest>,
    headers: &[(String, Vec<u8>)],
) -> Result<RespFraming, ()> {
    let method = request.map_or("", |r| r.method.as_str());
    if status == 101 || (method == "CONNECT" && (200..300).contains(&status)) {
        return Ok(RespFraming::Upgrade);
    }
    if method == "HEAD" || status < 200 || status == 204 || status == 304 {
        return Ok(RespFraming::NoBody);
    }
    match transfer_chunked(headers) {
        Some(true) => return Ok(RespFraming::Body(BodyReader::Chunked(Chunk::Size))),
        Some(false) => return Ok(RespFraming::Body(BodyReader::UntilClose)),
        None => {}
    }
    Ok(match content_length(headers)? {
        Some(0) => RespFraming::NoBody,
        Some(n) => RespFraming::Body(BodyReader::Length(n)),
        None => RespFraming::Body(BodyReader::UntilClose),
    })
}

/// Appends to a kept body, up to [`MAX_BODY`]; flags and counts the first overflow.
fn append_capped(body: &mut Vec<u8>, truncated: &mut bool, bytes: &[u8], count: &mut u64) {
    let room = MAX_BODY.saturating_sub(body.len());
    let n = room.min(bytes.len());
    body.extend_from_slice(&bytes[..n]);
    if n < bytes.len() && !*truncated {
        *truncated = true;
        *count += 1;
    }
}

/// What one decoding step did: bytes consumed, and whether another step may make progress.
struct Step {
    used: usize,
    more: bool,
}

impl Step {
    fn go(used: usize) -> Self {
        Self { used, more: true }
    }
    fn wait(used: usize) -> Self {
        Self { used, more: false }
    }
}

/// Reassembles the HTTP/1.x exchanges of one TCP connection. See the module docs.
#[derive(Debug, Default)]
pub struct HttpConnection {
    client: Direction<ReqState>,
    server: Direction<RespState>,
    /// Requests awaiting a response, oldest first.
    pending: VecDeque<Slot>,
    next_seq: u64,
    /// Exchanges finished outside `feed` (by `gap`), returned by the next `feed` or `close`.
    ready: Vec<HttpExchange>,
    stats: HttpStats,
}

impl HttpConnection {
    /// A decoder for a connection that may already be mid-exchange: both directions start
    /// unsynced and look for a message start.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes of one syscall. `from_client`: true for the client->server direction. Returns the
    /// exchanges completed so far (including any finished by an earlier `gap`).
    pub fn feed(&mut self, from_client: bool, ts_ns: u64, data: &[u8]) -> Vec<HttpExchange> {
        if from_client {
            self.client.inbox.push(ts_ns, data);
            self.run_client(ts_ns);
        } else {
            self.server.inbox.push(ts_ns, data);
            self.run_server(ts_ns);
        }
        std::mem::take(&mut self.ready)
    }

    /// Bytes were lost on that direction: drop its partial state and resynchronise. An exchange
    /// cut by the loss is finished with `complete = false` and returned by the next `feed` or
    /// `close` (or [`Self::take_ready`]), so a caller written against `gap` returning nothing
    /// still loses nothing.
    pub fn gap(&mut self, from_client: bool) {
        if from_client {
            self.client_gap();
        } else {
            self.server_gap();
        }
    }

    /// One server write that the kernel reported by time and size only: a whole HTTP chunk
    /// holding one event of generated text of the response being streamed (see
    /// `ebpf/src/sse.rs`). Where no event stream is open between two chunks and two events,
    /// the write cannot be that: it is taken as lost bytes ([`Self::gap`]). Returns the
    /// exchanges that finished.
    pub fn elided_event(&mut self, from_client: bool, write: &ElidedWrite) -> Vec<HttpExchange> {
        let placed = !from_client
            && self.server.inbox.buf.is_empty()
            && match &mut self.server.state {
                RespState::Body(open) => open.take_elided(write, &mut self.stats),
                _ => false,
            };
        if placed {
            self.stats.sse_events_elided += 1;
            self.server.inbox.pass(u64::from(write.len));
        } else {
            self.stats.sse_elided_misplaced += 1;
            self.gap(from_client);
        }
        std::mem::take(&mut self.ready)
    }

    /// Whether the server is streaming an event stream in chunks (the responses whose writes
    /// the kernel may report by time only).
    pub fn streaming_events(&self) -> bool {
        matches!(&self.server.state, RespState::Body(open)
            if open.sse.is_some() && matches!(open.body, BodyReader::Chunked(_)))
    }

    /// Exchanges finished by `gap` and not yet returned.
    pub fn take_ready(&mut self) -> Vec<HttpExchange> {
        std::mem::take(&mut self.ready)
    }

    /// Connection closed: returns the exchanges still open. A response delimited by the close is
    /// complete; any other open response, and requests without response, are not. The decoder
    /// is then reset (statistics kept), as if for a new connection.
    pub fn close(&mut self, ts_ns: u64) -> Vec<HttpExchange> {
        if let RespState::Body(mut open) = std::mem::take(&mut self.server.state) {
            let complete = matches!(open.body, BodyReader::UntilClose);
            if complete {
                open.resp.last_ns = ts_ns;
            }
            self.finish_response(*open, complete);
        }
        let mut out = std::mem::take(&mut self.ready);
        out.extend(self.pending.drain(..).filter_map(|slot| match slot {
            Slot::Seen { req, .. } => Some(HttpExchange {
                request: Some(req),
                response: None,
                complete: false,
            }),
            Slot::Lost => None,
        }));
        let stats = std::mem::take(&mut self.stats);
        *self = Self {
            stats,
            ..Self::default()
        };
        out
    }

    /// Decoder health counters (cumulative, kept across `close`).
    pub fn stats(&self) -> &HttpStats {
        &self.stats
    }

    // ---- client -> server ------------------------------------------------------------------

    fn run_client(&mut self, ts: u64) {
        let inbox = std::mem::take(&mut self.client.inbox);
        let mut pos = 0;
        // Safety net against a step that neither consumes nor waits; never reached in practice.
        let mut budget = 2 * inbox.buf.len() + 16;
        while budget > 0 {
            budget -= 1;
            let step = self.client_step(&inbox, pos, ts);
            pos = (pos + step.used).min(inbox.buf.len());
            if !step.more {
                break;
            }
        }
        self.client.inbox = inbox;
        self.client.inbox.consume(pos);
    }

    fn client_step(&mut self, inbox: &Inbox, pos: usize, ts: u64) -> Step {
        let avail = inbox.buf.get(pos..).unwrap_or_default();
        match self.client.state {
            ReqState::Upgraded => Step::wait(avail.len()),
            ReqState::Unsynced => {
                let (step, found) = resync(
                    &mut self.client.sync,
                    &mut self.stats,
                    avail,
                    match_request_line,
                );
                if found {
                    self.client.state = ReqState::Idle;
                }
                step
            }
            ReqState::Idle => self.client_head(inbox, pos, ts),
            ReqState::Body { .. } => self.client_body(avail, ts),
        }
    }

    fn client_head(&mut self, inbox: &Inbox, pos: usize, ts: u64) -> Step {
        match check_head(&mut self.client.sync.head_end, inbox, pos) {
            HeadCheck::Wait => return Step::wait(0),
            HeadCheck::Oversized => return self.client_malformed(),
            HeadCheck::Ready => {}
        }
        let avail = inbox.buf.get(pos..).unwrap_or_default();
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(avail) {
            Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => {
                let req = HttpRequest {
                    method: parsed.method.unwrap_or_default().to_owned(),
                    path: parsed.path.unwrap_or_default().to_owned(),
                    version: parsed.version.unwrap_or_default(),
                    headers: owned_headers(parsed.headers),
                    body: Vec::new(),
                    first_ns: inbox.ts_at(pos),
                    last_ns: ts,
                    body_truncated: false,
                };
                match request_framing(&req.headers) {
                    Ok(framing) => {
                        self.start_request(req, framing);
                        Step::go(n)
                    }
                    Err(()) => self.client_malformed(),
                }
            }
            Ok(httparse::Status::Partial) => self.client_head_partial(inbox, pos),
            _ => self.client_malformed(),
        }
    }

    /// The parser wants more bytes although a blank line was seen (leading empty lines).
    fn client_head_partial(&mut self, inbox: &Inbox, pos: usize) -> Step {
        let len = inbox.buf.len().saturating_sub(pos);
        if len > MAX_HEAD {
            return self.client_malformed();
        }
        self.client
            .sync
            .head_end
            .nothing_before(inbox.base + inbox.buf.len() as u64);
        Step::wait(0)
    }

    /// Queues a request whose head was parsed and starts reading its body, if any.
    fn start_request(&mut self, req: HttpRequest, framing: Option<BodyReader>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.push_pending(Slot::Seen { seq, req });
        match framing {
            Some(body) => self.client.state = ReqState::Body { seq, body },
            None => self.client_message_done(),
        }
    }

    fn client_message_done(&mut self) {
        self.client.state = ReqState::Idle;
        self.client.sync.verified = true;
    }

    fn push_pending(&mut self, slot: Slot) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
            self.stats.requests_dropped += 1;
        }
        self.pending.push_back(slot);
    }

    fn client_body(&mut self, avail: &[u8], ts: u64) -> Step {
        let ReqState::Body { seq, body } = &mut self.client.state else {
            return Step::wait(0);
        };
        let seq = *seq;
        let pending = &mut self.pending;
        let stats = &mut self.stats;
        let (used, progress) = body.advance(avail, &mut |bytes| {
            if let Some(req) = pending_request(pending, seq) {
                req.last_ns = ts;
                append_capped(
                    &mut req.body,
                    &mut req.body_truncated,
                    bytes,
                    &mut stats.bodies_truncated,
                );
            }
        });
        match progress {
            Progress::NeedMore => Step::wait(used),
            Progress::Done => {
                if let Some(req) = pending_request(&mut self.pending, seq) {
                    req.last_ns = ts;
                }
                self.client_message_done();
                Step::go(used)
            }
            Progress::Malformed => {
                if let Some(req) = pending_request(&mut self.pending, seq) {
                    req.body_truncated = true;
                }
                self.stats.malformed += 1;
                self.client.sync.lose();
                self.client.state = ReqState::Unsynced;
                Step::go(used)
            }
        }
    }

    /// A head that does not parse. If it sat where a message had to start, it was a request we
    /// cannot read, and a placeholder keeps its response from pairing with the next request.
    fn client_malformed(&mut self) -> Step {
        self.stats.malformed += 1;
        if self.client.sync.verified {
            self.push_pending(Slot::Lost);
        }
        self.client.sync.lose();
        self.client.state = ReqState::Unsynced;
        self.skip_one(true)
    }

    /// Skips the byte at which a bogus message start was found, so the search moves on.
    fn skip_one(&mut self, client: bool) -> Step {
        self.stats.bytes_skipped += 1;
        let sync = if client {
            &mut self.client.sync
        } else {
            &mut self.server.sync
        };
        sync.skipped += 1;
        Step::go(1)
    }

    fn client_gap(&mut self) {
        let buffered = self.client.inbox.clear();
        self.stats.bytes_skipped += buffered as u64;
        match std::mem::take(&mut self.client.state) {
            ReqState::Upgraded => {
                self.client.state = ReqState::Upgraded;
                return;
            }
            ReqState::Unsynced => {}
            // Bytes lost at a message boundary or inside a head: a whole request is gone.
            ReqState::Idle if self.client.sync.verified || buffered > 0 => {
                self.push_pending(Slot::Lost);
            }
            ReqState::Idle => {}
            ReqState::Body { seq, .. } => {
                if let Some(req) = pending_request(&mut self.pending, seq) {
                    req.body_truncated = true;
                }
            }
        }
        self.client.sync.lose();
    }

    // ---- server -> client ------------------------------------------------------------------

    fn run_server(&mut self, ts: u64) {
        let inbox = std::mem::take(&mut self.server.inbox);
        let mut pos = 0;
        let mut budget = 2 * inbox.buf.len() + 16;
        while budget > 0 {
            budget -= 1;
            let step = self.server_step(&inbox, pos, ts);
            pos = (pos + step.used).min(inbox.buf.len());
            if !step.more {
                break;
            }
        }
        self.server.inbox = inbox;
        self.server.inbox.consume(pos);
    }

    fn server_step(&mut self, inbox: &Inbox, pos: usize, ts: u64) -> Step {
        let avail = inbox.buf.get(pos..).unwrap_or_default();
        match self.server.state {
            RespState::Upgraded => Step::wait(avail.len()),
            RespState::Unsynced => {
                let (step, found) = resync(
                    &mut self.server.sync,
                    &mut self.stats,
                    avail,
                    match_status_start,
                );
                if found {
                    self.server.state = RespState::Idle;
                }
                step
            }
            RespState::Idle => self.server_head(inbox, pos, ts),
            RespState::Body(_) => self.server_body(avail, ts),
        }
    }

    fn server_head(&mut self, inbox: &Inbox, pos: usize, ts: u64) -> Step {
        match check_head(&mut self.server.sync.head_end, inbox, pos) {
            HeadCheck::Wait => return Step::wait(0),
            HeadCheck::Oversized => return self.server_malformed(),
            HeadCheck::Ready => {}
        }
        let avail = inbox.buf.get(pos..).unwrap_or_default();
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(avail) {
            Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => {
                let status = parsed.code.unwrap_or_default();
                // Interim responses (100 Continue, 103 Early Hints) precede the real one.
                if (100..200).contains(&status) && status != 101 {
                    return Step::go(n);
                }
                let resp = HttpResponse {
                    status,
                    reason: parsed.reason.unwrap_or_default().to_owned(),
                    version: parsed.version.unwrap_or_default(),
                    headers: owned_headers(parsed.headers),
                    body: Vec::new(),
                    first_ns: inbox.ts_at(pos),
                    last_ns: ts,
                    sse_events: Vec::new(),
                    body_truncated: false,
                    sse_truncated: false,
                    body_elided: 0,
                };
                self.open_response(resp);
                Step::go(n)
            }
            Ok(httparse::Status::Partial) => self.server_head_partial(inbox, pos),
            _ => self.server_malformed(),
        }
    }

    /// The parser wants more bytes although a blank line was seen (leading empty lines).
    fn server_head_partial(&mut self, inbox: &Inbox, pos: usize) -> Step {
        let len = inbox.buf.len().saturating_sub(pos);
        if len > MAX_HEAD {
            return self.server_malformed();
        }
        self.server
            .sync
            .head_end
            .nothing_before(inbox.base + inbox.buf.len() as u64);
        Step::wait(0)
    }

    /// A response head that does not parse. If it sat where a response had to start, the
    /// oldest request's response is unreadable: that exchange is returned incomplete.
    fn server_malformed(&mut self) -> Step {
        self.stats.malformed += 1;
        if self.server.sync.verified {
            self.abandon_oldest_request();
        }
        self.server.sync.lose();
        self.server.state = RespState::Unsynced;
        self.skip_one(false)
    }

    /// Pairs a parsed response head with the oldest pending request and starts its body.
    fn open_response(&mut self, resp: HttpResponse) {
        let matched = self.match_request(resp.first_ns);
        if matched.is_none() {
            self.stats.orphan_responses += 1;
        }
        let request = matched.and_then(|seq| self.pending_request_ref(seq));
        let framing = response_framing(resp.status, request, &resp.headers);
        let sse = resp.is_event_stream().then(SseParser::new);
        let open = OpenResponse {
            resp,
            matched,
            body: BodyReader::UntilClose,
            sse,
            sse_bytes: 0,
        };
        match framing {
            Ok(RespFraming::NoBody) => {
                self.finish_response(open, true);
                self.server_message_done();
            }
            Ok(RespFraming::Upgrade) => {
                self.finish_response(open, true);
                self.upgrade();
            }
            Ok(RespFraming::Body(body)) => {
                self.server.state = RespState::Body(Box::new(OpenResponse { body, ..open }));
            }
            Err(()) => {
                // A real response whose length we cannot know: report it cut, then resync.
                self.stats.malformed += 1;
                self.finish_response(open, false);
                self.server.sync.lose();
                self.server.state = RespState::Unsynced;
            }
        }
    }

    /// The `seq` of the request a response starting at `first_ns` answers, if it was seen.
    fn match_request(&mut self, first_ns: u64) -> Option<u64> {
        match self.pending.front() {
            Some(Slot::Lost) => {
                self.pending.pop_front();
                None
            }
            // A response cannot start before its request did.
            Some(Slot::Seen { seq, req }) if req.first_ns <= first_ns => Some(*seq),
            _ => None,
        }
    }

    fn pending_request_ref(&self, seq: u64) -> Option<&HttpRequest> {
        self.pending.iter().rev().find_map(|slot| match slot {
            Slot::Seen { seq: s, req } if *s == seq => Some(req),
            _ => None,
        })
    }

    fn server_body(&mut self, avail: &[u8], ts: u64) -> Step {
        let RespState::Body(open) = &mut self.server.state else {
            return Step::wait(0);
        };
        let OpenResponse {
            resp,
            body,
            sse,
            sse_bytes,
            ..
        } = &mut **open;
        let stats = &mut self.stats;
        let (used, progress) = body.advance(avail, &mut |bytes| {
            deliver_response_bytes(resp, sse, sse_bytes, stats, ts, bytes);
        });
        match progress {
            Progress::NeedMore => Step::wait(used),
            Progress::Done => {
                if let RespState::Body(mut open) = std::mem::take(&mut self.server.state) {
                    open.resp.last_ns = ts; // the end may be framing only (last chunk, trailers)
                    self.finish_response(*open, true);
                }
                self.server_message_done();
                Step::go(used)
            }
            Progress::Malformed => {
                self.stats.malformed += 1;
                if let RespState::Body(open) = std::mem::take(&mut self.server.state) {
                    self.finish_response(*open, false);
                }
                self.server.sync.lose();
                self.server.state = RespState::Unsynced;
                Step::go(used)
            }
        }
    }

    fn server_message_done(&mut self) {
        self.server.state = RespState::Idle;
        self.server.sync.verified = true;
    }

    /// Emits the exchange of a finished (or cut) response with the request it answers.
    fn finish_response(&mut self, open: OpenResponse, complete: bool) {
        let request = open.matched.and_then(|seq| self.take_request(seq));
        let mut resp = open.resp;
        if !complete {
            resp.body_truncated = true;
        }
        self.ready.push(HttpExchange {
            request,
            response: Some(resp),
            complete,
        });
    }

    fn take_request(&mut self, seq: u64) -> Option<HttpRequest> {
        let idx = self
            .pending
            .iter()
            .position(|slot| matches!(slot, Slot::Seen { seq: s, .. } if *s == seq))?;
        match self.pending.remove(idx)? {
            Slot::Seen { req, .. } => Some(req),
            Slot::Lost => None,
        }
    }

    /// The oldest request will get no readable response: return it incomplete.
    fn abandon_oldest_request(&mut self) {
        if let Some(Slot::Seen { req, .. }) = self.pending.pop_front() {
            self.ready.push(HttpExchange {
                request: Some(req),
                response: None,
                complete: false,
            });
        }
    }

    /// After 101 Switching Protocols or a successful CONNECT nothing is HTTP any more.
    fn upgrade(&mut self) {
        self.server.state = RespState::Upgraded;
        self.client.state = ReqState::Upgraded;
        self.client.inbox.clear();
    }

    fn server_gap(&mut self) {
        let buffered = self.server.inbox.clear();
        self.stats.bytes_skipped += buffered as u64;
        match std::mem::take(&mut self.server.state) {
            RespState::Upgraded => {
                self.server.state = RespState::Upgraded;
                return;
            }
            RespState::Body(open) => self.finish_response(*open, false),
            RespState::Unsynced | RespState::Idle => {}
        }
        // The lost server bytes may have held the response of any request waiting now (one,
        // several, or none of them): none can be paired with a later response truthfully.
        while !self.pending.is_empty() {
            self.abandon_oldest_request();
        }
        self.server.sync.lose();
    }
}

impl SyncState {
    /// Sync lost: the next message start must be searched for.
    fn lose(&mut self) {
        self.verified = false;
        self.lost = true;
    }
}

/// Skips to the next plausible message start. Returns the step and whether a start was found.
fn resync(
    sync: &mut SyncState,
    stats: &mut HttpStats,
    avail: &[u8],
    matcher: fn(&[u8]) -> Match,
) -> (Step, bool) {
    let (skip, found) = match scan(avail, matcher) {
        Scan::Found(i) => (i, true),
        Scan::Partial(i) => (i, false),
        Scan::NotFound => (avail.len(), false),
    };
    stats.bytes_skipped += skip as u64;
    sync.skipped += skip as u64;
    if !found {
        return (Step::wait(skip), false);
    }
    if sync.lost || sync.skipped > 0 {
        stats.resyncs += 1;
    }
    sync.lost = false;
    sync.skipped = 0;
    sync.verified = false;
    (Step::go(skip), true)
}

fn pending_request(pending: &mut VecDeque<Slot>, seq: u64) -> Option<&mut HttpRequest> {
    pending.iter_mut().rev().find_map(|slot| match slot {
        Slot::Seen { seq: s, req } if *s == seq => Some(req),
        _ => None,
    })
}

/// Keeps response body bytes and feeds an event stream's bytes to its SSE parser, so each event
/// is stamped with the syscall that completed it.
fn deliver_response_bytes(
    resp: &mut HttpResponse,
    sse: &mut Option<SseParser>,
    sse_bytes: &mut usize,
    stats: &mut HttpStats,
    ts: u64,
    bytes: &[u8],
) {
    if bytes.is_empty() {
        return;
    }
    resp.last_ns = ts;
    append_capped(
        &mut resp.body,
        &mut resp.body_truncated,
        bytes,
        &mut stats.bodies_truncated,
    );
    let Some(parser) = sse else {
        return;
    };
    for event in parser.feed(ts, bytes) {
        keep_event(resp, sse_bytes, stats, event);
    }
}

/// Keeps one SSE event of a response, within [`MAX_SSE_BYTES`].
fn keep_event(
    resp: &mut HttpResponse,
    sse_bytes: &mut usize,
    stats: &mut HttpStats,
    event: SseEvent,
) {
    let size = SSE_EVENT_OVERHEAD
        + event.data.len()
        + event.event.as_ref().map_or(0, String::len)
        + event.id.as_ref().map_or(0, String::len);
    if *sse_bytes + size > MAX_SSE_BYTES {
        resp.sse_truncated = true;
        stats.sse_events_dropped += 1;
        return;
    }
    *sse_bytes += size;
    resp.sse_events.push(event);
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: bool = true;
    const SERVER: bool = false;

    fn get(path: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: engine\r\n\r\n")
    }

    fn ok(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    /// One chunk of a chunked body, with an extension to exercise that path.
    fn chunk(data: &str) -> String {
        format!("{:x};ext=\"v\"\r\n{data}\r\n", data.len())
    }

    fn req(x: &HttpExchange) -> &HttpRequest {
        x.request.as_ref().expect("request")
    }

    fn resp(x: &HttpExchange) -> &HttpResponse {
        x.response.as_ref().expect("response")
    }

    #[test]
    fn simple_get_with_content_length() {
        let mut c = HttpConnection::new();
        assert!(c.feed(CLIENT, 10, get("/health").as_bytes()).is_empty());
        let out = c.feed(SERVER, 20, ok("fine").as_bytes());
        assert_eq!(out.len(), 1);
        let x = &out[0];
        assert!(x.complete);
        assert_eq!(req(x).method, "GET");
        assert_eq!(req(x).path, "/health");
        assert_eq!(req(x).version, 1);
        assert_eq!(req(x).header("HOST"), Some(&b"engine"[..]));
        assert_eq!((req(x).first_ns, req(x).last_ns), (10, 10));
        assert_eq!(resp(x).status, 200);
        assert_eq!(resp(x).reason, "OK");
        assert_eq!(resp(x).body, b"fine");
        assert_eq!((resp(x).first_ns, resp(x).last_ns), (20, 20));
        assert!(c.close(30).is_empty());
        assert_eq!(*c.stats(), HttpStats::default());
    }

    #[test]
    fn post_body_split_into_one_byte_feeds() {
        let body = r#"{"model":"m","prompt":"hi","max_tokens":4}"#;
        let wire = format!(
            "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut c = HttpConnection::new();
        for (i, b) in wire.bytes().enumerate() {
            assert!(c.feed(CLIENT, 100 + i as u64, &[b]).is_empty());
        }
        let out = c.feed(SERVER, 5000, ok("{}").as_bytes());
        assert_eq!(out.len(), 1);
        let r = req(&out[0]);
        assert_eq!(r.method, "POST");
        assert_eq!(r.body, body.as_bytes());
        assert_eq!(r.first_ns, 100);
        assert_eq!(r.last_ns, 100 + wire.len() as u64 - 1);
        assert!(!r.body_truncated);
        assert_eq!(c.stats().bytes_skipped, 0);
    }

    #[test]
    fn chunked_response_with_extensions_and_trailers() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/x").as_bytes());
        let wire = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{}{}0;last=1\r\n\
             X-Trailer: a\r\nX-Other: b\r\n\r\n",
            chunk("hello "),
            chunk("world")
        );
        // Split in 3-byte feeds so every framing state sees partial input.
        let mut out = Vec::new();
        for (i, part) in wire.as_bytes().chunks(3).enumerate() {
            out.extend(c.feed(SERVER, 10 + i as u64, part));
        }
        assert_eq!(out.len(), 1);
        assert!(out[0].complete);
        assert_eq!(resp(&out[0]).body, b"hello world");
        assert_eq!(
            resp(&out[0]).last_ns,
            10 + (wire.len() as u64).div_ceil(3) - 1
        );
        // The next exchange on the connection still decodes.
        c.feed(CLIENT, 100, get("/y").as_bytes());
        let out = c.feed(SERVER, 101, ok("y").as_bytes());
        assert_eq!(req(&out[0]).path, "/y");
        assert_eq!(c.stats().malformed, 0);
    }

    #[test]
    fn keep_alive_three_exchanges() {
        let mut c = HttpConnection::new();
        let mut out = Vec::new();
        for i in 0..3u64 {
            c.feed(CLIENT, i * 10, get(&format!("/{i}")).as_bytes());
            out.extend(c.feed(SERVER, i * 10 + 5, ok(&format!("r{i}")).as_bytes()));
        }
        assert_eq!(out.len(), 3);
        for (i, x) in out.iter().enumerate() {
            assert!(x.complete);
            assert_eq!(req(x).path, format!("/{i}"));
            assert_eq!(resp(x).body, format!("r{i}").as_bytes());
            assert_eq!(resp(x).first_ns, i as u64 * 10 + 5);
        }
        assert_eq!(*c.stats(), HttpStats::default());
    }

    #[test]
    fn pipelining_three_requests_then_three_responses() {
        let mut c = HttpConnection::new();
        let reqs = format!("{}{}{}", get("/a"), get("/b"), get("/c"));
        assert!(c.feed(CLIENT, 1, reqs.as_bytes()).is_empty());
        let resps = format!("{}{}{}", ok("A"), ok("BB"), ok("CCC"));
        let out = c.feed(SERVER, 2, resps.as_bytes());
        let pairs: Vec<(&str, &[u8])> = out
            .iter()
            .map(|x| (req(x).path.as_str(), resp(x).body.as_slice()))
            .collect();
        assert_eq!(
            pairs,
            [("/a", &b"A"[..]), ("/b", &b"BB"[..]), ("/c", &b"CCC"[..])]
        );
        assert!(out.iter().all(|x| x.complete));
    }

    #[test]
    fn sse_over_chunked_with_per_event_timestamps() {
        let mut c = HttpConnection::new();
        c.feed(
            CLIENT,
            1,
            b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        );
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\
                    Transfer-Encoding: chunked\r\n\r\n";
        // Events deliberately straddle chunk boundaries.
        let body = format!(
            "{}{}{}0\r\n\r\n",
            chunk("data: {\"t\":\"a\"}"),
            chunk("\n\ndata: {\"t\":\"b\"}\n"),
            chunk("\ndata: [DONE]\n\n")
        );
        let wire = format!("{head}{body}");
        let mut out = Vec::new();
        // One byte per syscall, timestamp = byte offset: each event's timestamp must be the
        // offset of the newline that dispatched it.
        for (i, b) in wire.bytes().enumerate() {
            out.extend(c.feed(SERVER, i as u64, &[b]));
        }
        assert_eq!(out.len(), 1);
        let r = resp(&out[0]);
        assert!(out[0].complete);
        let data: Vec<&str> = r.sse_events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["{\"t\":\"a\"}", "{\"t\":\"b\"}", "[DONE]"]);
        let first_end = wire.find("\n\ndata: {\"t\":\"b\"}").expect("event a") + 1;
        let second_end = wire.find("\ndata: [DONE]").expect("event b");
        let third_end = wire.rfind("[DONE]\n\n").expect("done") + 7;
        let ts: Vec<u64> = r.sse_events.iter().map(|e| e.ts_ns).collect();
        assert_eq!(ts, [first_end as u64, second_end as u64, third_end as u64]);
        assert_eq!(
            r.body,
            b"data: {\"t\":\"a\"}\n\ndata: {\"t\":\"b\"}\n\ndata: [DONE]\n\n"
        );
    }

    #[test]
    fn sse_timestamps_follow_feeds_not_chunks() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/stream").as_bytes());
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                    Transfer-Encoding: chunked\r\n\r\n";
        let first = format!("{}{}", chunk("data: one\n"), chunk("\nda"));
        let second = format!("{}{}0\r\n\r\n", chunk("ta: [DONE]\n"), chunk("\n"));
        assert!(c.feed(SERVER, 10, head.as_bytes()).is_empty());
        assert!(c.feed(SERVER, 20, first.as_bytes()).is_empty());
        let out = c.feed(SERVER, 30, second.as_bytes());
        let ev = &resp(&out[0]).sse_events;
        assert_eq!(ev.len(), 2);
        assert_eq!((ev[0].data.as_str(), ev[0].ts_ns), ("one", 20));
        assert_eq!((ev[1].data.as_str(), ev[1].ts_ns), ("[DONE]", 30));
        assert_eq!(resp(&out[0]).first_ns, 10);
        assert_eq!(resp(&out[0]).last_ns, 30);
    }

    #[test]
    fn response_ending_at_close() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/old").as_bytes());
        assert!(
            c.feed(SERVER, 2, b"HTTP/1.0 200 OK\r\n\r\npart one,")
                .is_empty()
        );
        assert!(c.feed(SERVER, 3, b" part two").is_empty());
        let out = c.close(9);
        assert_eq!(out.len(), 1);
        assert!(out[0].complete);
        assert_eq!(resp(&out[0]).body, b"part one, part two");
        assert_eq!(resp(&out[0]).version, 0);
        assert_eq!(resp(&out[0]).last_ns, 9);
        assert_eq!(req(&out[0]).path, "/old");
    }

    #[test]
    fn close_returns_open_exchanges_incomplete() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, format!("{}{}", get("/a"), get("/b")).as_bytes());
        c.feed(
            SERVER,
            2,
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        );
        let out = c.close(3);
        assert_eq!(out.len(), 2);
        assert!(!out[0].complete && !out[1].complete);
        assert_eq!(resp(&out[0]).body, b"abc");
        assert_eq!(req(&out[0]).path, "/a");
        assert_eq!(req(&out[1]).path, "/b");
        assert!(out[1].response.is_none());
    }

    #[test]
    fn head_204_304_have_no_body() {
        let mut c = HttpConnection::new();
        let reqs = format!(
            "HEAD /h HTTP/1.1\r\n\r\n{}{}{}",
            get("/204"),
            get("/304"),
            get("/after")
        );
        c.feed(CLIENT, 1, reqs.as_bytes());
        let resps = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n\
             HTTP/1.1 204 No Content\r\n\r\n\
             HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n{}",
            ok("z")
        );
        let out = c.feed(SERVER, 2, resps.as_bytes());
        let got: Vec<(&str, u16, usize)> = out
            .iter()
            .map(|x| (req(x).path.as_str(), resp(x).status, resp(x).body.len()))
            .collect();
        assert_eq!(
            got,
            [
                ("/h", 200, 0),
                ("/204", 204, 0),
                ("/304", 304, 0),
                ("/after", 200, 1)
            ]
        );
        assert!(out.iter().all(|x| x.complete));
    }

    #[test]
    fn continue_100_is_skipped() {
        let mut c = HttpConnection::new();
        let head = "POST /upload HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
        assert!(c.feed(CLIENT, 1, head.as_bytes()).is_empty());
        assert!(
            c.feed(SERVER, 2, b"HTTP/1.1 100 Continue\r\n\r\n")
                .is_empty()
        );
        assert!(c.feed(CLIENT, 3, b"hello").is_empty());
        let out = c.feed(SERVER, 4, ok("done").as_bytes());
        assert_eq!(out.len(), 1);
        assert_eq!(req(&out[0]).body, b"hello");
        assert_eq!(req(&out[0]).last_ns, 3);
        assert_eq!(resp(&out[0]).status, 200);
        assert_eq!(resp(&out[0]).first_ns, 4);
    }

    #[test]
    fn attach_mid_stream_skips_to_next_message() {
        let mut c = HttpConnection::new();
        // Tails of an exchange that started before we attached.
        let req_tail = b"pt\":\"tell me a story\"}";
        let resp_tail = b"ce\":\"once upon a time\"}]}";
        assert!(c.feed(CLIENT, 1, req_tail).is_empty());
        assert!(c.feed(SERVER, 2, resp_tail).is_empty());
        // The next request starts mid-syscall after more junk: search inside the buffer.
        let junk = b"\r\n{\"more\": 1}";
        let mut wire = junk.to_vec();
        wire.extend_from_slice(get("/next").as_bytes());
        assert!(c.feed(CLIENT, 3, &wire).is_empty());
        let out = c.feed(SERVER, 4, ok("next").as_bytes());
        assert_eq!(out.len(), 1);
        assert_eq!(req(&out[0]).path, "/next");
        assert_eq!(resp(&out[0]).body, b"next");
        let skipped = (req_tail.len() + resp_tail.len() + junk.len()) as u64;
        assert_eq!(c.stats().bytes_skipped, skipped);
        assert_eq!(c.stats().resyncs, 2, "both directions skipped bytes");
        assert_eq!(c.stats().orphan_responses, 0);
    }

    #[test]
    fn attach_mid_sse_stream_then_next_exchange() {
        let mut c = HttpConnection::new();
        let tail = format!(
            "{}{}0\r\n\r\n",
            chunk("data: x\n\n"),
            chunk("data: [DONE]\n\n")
        );
        assert!(c.feed(SERVER, 1, tail.as_bytes()).is_empty());
        c.feed(CLIENT, 2, get("/v1/models").as_bytes());
        let out = c.feed(SERVER, 3, ok("[]").as_bytes());
        assert_eq!(out.len(), 1);
        assert_eq!(req(&out[0]).path, "/v1/models");
        assert_eq!(c.stats().bytes_skipped, tail.len() as u64);
    }

    #[test]
    fn orphan_response_when_request_not_seen() {
        let mut c = HttpConnection::new();
        // Attached after the request was sent, before the (slow) response.
        let out = c.feed(SERVER, 5, ok("late").as_bytes());
        assert_eq!(out.len(), 1);
        assert!(out[0].request.is_none());
        assert!(out[0].complete);
        assert_eq!(c.stats().orphan_responses, 1);
    }

    #[test]
    fn response_older_than_request_is_orphan() {
        let mut c = HttpConnection::new();
        // A pipelined request we did see, and an earlier response to one we did not.
        c.feed(CLIENT, 10, get("/seen").as_bytes());
        c.feed(CLIENT, 5, b""); // no-op feed
        let out = c.feed(SERVER, 9, ok("old").as_bytes());
        assert!(out[0].request.is_none());
        let out = c.feed(SERVER, 11, ok("new").as_bytes());
        assert_eq!(req(&out[0]).path, "/seen");
    }

    #[test]
    fn gap_in_response_body() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/first").as_bytes());
        c.feed(
            SERVER,
            2,
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",
        );
        c.gap(SERVER);
        // The cut exchange comes back with the next feed, whichever direction it is.
        let mut out = c.feed(CLIENT, 4, get("/second").as_bytes());
        // The rest of the first body (after the lost bytes), then the second response.
        let mut wire = b"tail of first body".to_vec();
        wire.extend_from_slice(ok("2").as_bytes());
        out.extend(c.feed(SERVER, 5, &wire));
        assert_eq!(out.len(), 2);
        assert!(!out[0].complete);
        assert_eq!(req(&out[0]).path, "/first");
        assert_eq!(resp(&out[0]).body, b"0123456789");
        assert!(resp(&out[0]).body_truncated);
        assert!(out[1].complete);
        assert_eq!(req(&out[1]).path, "/second");
        assert_eq!(resp(&out[1]).body, b"2");
        assert_eq!(c.stats().resyncs, 1);
        assert_eq!(c.stats().bytes_skipped, 18);
    }

    #[test]
    fn gap_between_responses_abandons_oldest_request() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/a").as_bytes());
        c.feed(SERVER, 2, ok("a").as_bytes());
        c.feed(CLIENT, 3, get("/b").as_bytes());
        c.gap(SERVER); // the start of /b's response was lost
        let mut out = c.take_ready();
        assert_eq!(out.len(), 1);
        c.feed(CLIENT, 4, get("/c").as_bytes());
        let mut wire = b"rest of b".to_vec();
        wire.extend_from_slice(ok("c").as_bytes());
        out.extend(c.feed(SERVER, 5, &wire));
        assert_eq!(out.len(), 2);
        assert_eq!(req(&out[0]).path, "/b");
        assert!(out[0].response.is_none() && !out[0].complete);
        assert_eq!(req(&out[1]).path, "/c");
        assert_eq!(resp(&out[1]).body, b"c");
    }

    #[test]
    fn gap_in_request_head_keeps_fifo_aligned() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/a").as_bytes());
        c.feed(SERVER, 2, ok("a").as_bytes());
        c.feed(CLIENT, 3, b"POST /lost HTTP/1.1\r\nContent-");
        c.gap(CLIENT);
        c.feed(
            CLIENT,
            4,
            format!("gth: 2\r\n\r\n{{}}{}", get("/c")).as_bytes(),
        );
        let out = c.feed(SERVER, 5, format!("{}{}", ok("lost"), ok("c")).as_bytes());
        assert_eq!(out.len(), 2);
        assert!(
            out[0].request.is_none(),
            "the lost request's response is an orphan"
        );
        assert_eq!(resp(&out[0]).body, b"lost");
        assert_eq!(req(&out[1]).path, "/c");
        assert_eq!(resp(&out[1]).body, b"c");
        assert_eq!(c.stats().orphan_responses, 1);
    }

    #[test]
    fn gap_in_request_body_marks_it_truncated() {
        let mut c = HttpConnection::new();
        c.feed(
            CLIENT,
            1,
            b"POST /p HTTP/1.1\r\nContent-Length: 10\r\n\r\n01234",
        );
        c.gap(CLIENT);
        c.feed(CLIENT, 2, b"89");
        let out = c.feed(SERVER, 3, ok("r").as_bytes());
        assert_eq!(out.len(), 1);
        assert_eq!(req(&out[0]).body, b"01234");
        assert!(req(&out[0]).body_truncated);
        assert_eq!(resp(&out[0]).body, b"r");
    }

    #[test]
    fn garbage_bytes_produce_nothing() {
        let mut c = HttpConnection::new();
        let junk = b"\x00\x01\xffGARBAGE HTTP/1.1 20x GET  / HTTP/1.1\r\n\x16\x03\x01";
        assert!(c.feed(CLIENT, 1, junk).is_empty());
        assert!(c.feed(SERVER, 2, junk).is_empty());
        assert!(c.close(3).is_empty());
        assert_eq!(c.stats().bytes_skipped, 2 * junk.len() as u64);
    }

    #[test]
    fn bogus_start_line_found_by_resync_is_malformed() {
        let mut c = HttpConnection::new();
        // Looks like a status line, but the head is invalid: skipped, then the real one.
        let mut wire = b"HTTP/1.1 200 \x01bad\r\n\r\n".to_vec();
        wire.extend_from_slice(ok("x").as_bytes());
        let out = c.feed(SERVER, 1, &wire);
        assert_eq!(out.len(), 1);
        assert_eq!(resp(&out[0]).body, b"x");
        assert_eq!(c.stats().malformed, 1);
    }

    #[test]
    fn truncated_head_waits_then_close_reports_request() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/a").as_bytes());
        assert!(
            c.feed(SERVER, 2, b"HTTP/1.1 200 OK\r\nContent-Le")
                .is_empty()
        );
        assert!(c.feed(SERVER, 3, b"ngth: 1\r\n").is_empty());
        let out = c.close(4);
        assert_eq!(out.len(), 1);
        assert_eq!(req(&out[0]).path, "/a");
        assert!(out[0].response.is_none() && !out[0].complete);
        assert_eq!(c.stats().malformed, 0);
    }

    #[test]
    fn oversized_head_is_malformed_and_fifo_survives() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/a").as_bytes());
        c.feed(SERVER, 2, ok("a").as_bytes());
        let mut huge = b"GET /big HTTP/1.1\r\n".to_vec();
        while huge.len() <= MAX_HEAD {
            huge.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        // Fed in pieces: the head never ends, so the bound must trigger on a partial head.
        for part in huge.chunks(4096) {
            assert!(c.feed(CLIENT, 3, part).is_empty());
        }
        assert_eq!(c.stats().malformed, 1);
        c.feed(CLIENT, 4, format!("\r\n{}", get("/c")).as_bytes());
        let wire = format!(
            "HTTP/1.1 431 Too Large\r\nContent-Length: 0\r\n\r\n{}",
            ok("c")
        );
        let out = c.feed(SERVER, 5, wire.as_bytes());
        assert_eq!(out.len(), 2);
        assert!(out[0].request.is_none());
        assert_eq!(resp(&out[0]).status, 431);
        assert_eq!(req(&out[1]).path, "/c");
    }

    #[test]
    fn body_over_limit_is_truncated_but_framed() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/big").as_bytes());
        let len = MAX_BODY + (1 << 20);
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
        assert!(c.feed(SERVER, 2, head.as_bytes()).is_empty());
        let block = vec![b'z'; 64 << 10];
        let mut out = Vec::new();
        let mut sent = 0;
        while sent < len {
            let n = block.len().min(len - sent);
            out.extend(c.feed(SERVER, 3, &block[..n]));
            sent += n;
        }
        assert_eq!(out.len(), 1);
        assert!(out[0].complete);
        assert_eq!(resp(&out[0]).body.len(), MAX_BODY);
        assert!(resp(&out[0]).body_truncated);
        assert_eq!(c.stats().bodies_truncated, 1);
        // Framing was followed: the next exchange decodes.
        c.feed(CLIENT, 4, get("/next").as_bytes());
        let out = c.feed(SERVER, 5, ok("n").as_bytes());
        assert_eq!(req(&out[0]).path, "/next");
    }

    #[test]
    fn chunked_request_body() {
        let mut c = HttpConnection::new();
        let wire = format!(
            "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{}{}0\r\n\r\n",
            chunk("ab"),
            chunk("cd")
        );
        c.feed(CLIENT, 1, wire.as_bytes());
        let out = c.feed(SERVER, 2, ok("").as_bytes());
        assert_eq!(req(&out[0]).body, b"abcd");
        assert!(out[0].complete);
    }

    #[test]
    fn upgrade_stops_decoding() {
        let mut c = HttpConnection::new();
        c.feed(
            CLIENT,
            1,
            b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        );
        let mut wire = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec();
        wire.extend_from_slice(ok("not http").as_bytes());
        let out = c.feed(SERVER, 2, &wire);
        assert_eq!(out.len(), 1);
        assert_eq!(resp(&out[0]).status, 101);
        assert!(c.feed(CLIENT, 3, get("/inside-ws").as_bytes()).is_empty());
        assert!(c.feed(SERVER, 4, ok("x").as_bytes()).is_empty());
        assert!(c.close(5).is_empty());
    }

    #[test]
    fn too_many_pending_requests_drops_oldest() {
        let mut c = HttpConnection::new();
        for i in 0..(MAX_PENDING + 2) {
            c.feed(CLIENT, 1, get(&format!("/{i}")).as_bytes());
        }
        assert_eq!(c.stats().requests_dropped, 2);
        let out = c.close(2);
        assert_eq!(out.len(), MAX_PENDING);
        assert_eq!(req(&out[0]).path, "/2");
    }

    #[test]
    fn invalid_content_length_is_malformed() {
        let mut c = HttpConnection::new();
        c.feed(CLIENT, 1, get("/a").as_bytes());
        let out = c.feed(
            SERVER,
            2,
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        );
        assert_eq!(out.len(), 1);
        assert!(!out[0].complete);
        assert_eq!(c.stats().malformed, 1);
    }

    /// xorshift64: a tiny deterministic PRNG so the property test needs no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Fragments that reach the interesting states more often than uniform bytes would.
    const FRAGMENTS: [&[u8]; 16] = [
        b"GET / HTTP/1.1\r\n",
        b"POST /v1/completions HTTP/1.1\r\n",
        b"HEAD /h HTTP/1.0\r\n",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 101 Switching\r\n",
        b"Content-Length: 5\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Content-Type: text/event-stream\r\n",
        b"\r\n",
        b"5;x=y\r\nhello\r\n",
        b"0\r\nT: v\r\n\r\n",
        b"data: {\"t\":1}\n\n",
        b"data: [DONE]\r\n\r\n",
        b"\xff\x00\r",
        b"fffffffffffffff\r\n",
    ];

    #[test]
    fn random_input_never_panics() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..300 {
            let mut c = HttpConnection::new();
            for _ in 0..60 {
                let from_client = rng.next() & 1 == 0;
                let mut data = Vec::new();
                for _ in 0..rng.below(6) {
                    if rng.next() & 1 == 0 {
                        data.extend_from_slice(FRAGMENTS[rng.below(FRAGMENTS.len())]);
                    } else {
                        data.extend((0..rng.below(40)).map(|_| rng.next() as u8));
                    }
                }
                let ts = rng.next() % 1000;
                let out = match rng.below(20) {
                    0 => {
                        c.gap(from_client);
                        Vec::new()
                    }
                    1 => c.close(ts),
                    _ => c.feed(from_client, ts, &data),
                };
                for x in &out {
                    assert!(x.request.is_some() || x.response.is_some());
                    if let Some(r) = &x.response {
                        assert!(r.body.len() <= MAX_BODY);
                    }
                }
                assert!(c.pending.len() <= MAX_PENDING);
            }
            c.close(u64::MAX);
        }
    }
}
