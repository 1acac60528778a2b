//! Incremental `text/event-stream` (Server-Sent Events) parser.
//!
//! vLLM and SGLang stream tokens of OpenAI-compatible completions as SSE events, one event per
//! decode step (or a few tokens). The time at which each event became complete on the wire is
//! what later code turns into time-to-first-token and inter-token latency, so the parser is fed
//! the de-chunked body bytes of one syscall at a time and stamps each event with the timestamp of
//! the syscall whose bytes completed it (the blank line that dispatches the event).
//!
//! The parsing rules follow the WHATWG HTML "event stream interpretation" section:
//! lines end in `\n`, `\r\n` or `\r` (a `\r\n` split across two feeds is still one line end),
//! a leading UTF-8 BOM is ignored, lines starting with `:` are comments, the fields are
//! `event`, `data`, `id` and `retry`, multi-line `data` is joined with `\n`, and a blank line
//! dispatches the event unless its data buffer is empty. An event left unfinished at the end of
//! the stream is never dispatched, so nothing here needs a "close" call.
//!
//! Memory is bounded because a traced stream may be garbage or hostile: a line longer than
//! [`MAX_LINE`] and data lines that would grow one event beyond [`MAX_EVENT_DATA`] are dropped and
//! counted in [`SseParser::truncated_lines`].

/// Longest line kept; longer lines are dropped (counted), the rest of the stream still parses.
pub const MAX_LINE: usize = 1 << 20;
/// Largest data buffer of one event; data lines beyond it are dropped (counted).
pub const MAX_EVENT_DATA: usize = 4 << 20;

/// UTF-8 byte order mark, ignored once at the start of the stream per the spec.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// CLOCK_MONOTONIC ns of the syscall whose bytes completed (dispatched) the event.
    pub ts_ns: u64,
    /// The `event:` field, `None` when absent or empty (the spec's default type "message").
    pub event: Option<String>,
    /// The `data:` lines joined with `\n` (no trailing newline).
    pub data: String,
    /// The last event ID at dispatch time, `None` when empty. As in the spec, an `id:` field
    /// persists for later events until another `id:` field changes it.
    pub id: Option<String>,
    /// Some: the kernel reported the event by time and size only, a write that matched its
    /// server's template (ebpf/src/sse.rs): one `data:` line of a chunk of generated text,
    /// whose text (as JSON string text) was this many bytes long (0: none). `data` is empty:
    /// the text was not copied.
    pub elided: Option<u32>,
}

/// Incremental parser state for one event stream (one HTTP response body).
#[derive(Debug, Clone, Default)]
pub struct SseParser {
    /// Bytes of the line being read (without its terminator).
    line: Vec<u8>,
    /// The current line exceeded [`MAX_LINE`]: drop it when it ends.
    line_overflow: bool,
    /// The previous byte was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
    /// At least one line was completed, so a BOM can no longer appear.
    started: bool,
    /// Data buffer: each `data:` value followed by `\n`.
    data: String,
    /// Event type buffer; empty means "message".
    event: String,
    /// Last event ID buffer; persists across events.
    last_id: String,
    /// Last valid `retry:` value (ms); kept for completeness.
    retry: Option<u64>,
    /// Lines dropped because of the size bounds.
    truncated: u64,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the bytes of one syscall, returning the events they completed, each stamped with
    /// `ts_ns`.
    pub fn feed(&mut self, ts_ns: u64, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.push_line_bytes(&rest[..end]);
                    self.after_cr = rest[end] == b'\r';
                    rest = &rest[end + 1..];
                    if let Some(event) = self.end_line(ts_ns) {
                        events.push(event);
                    }
                }
                None => {
                    self.push_line_bytes(rest);
                    rest = &[];
                }
            }
        }
        events
    }

    /// An event whose bytes the kernel did not copy (see [`SseEvent::elided`]), stamped
    /// `ts_ns`, with `content` bytes of text. None when the stream is not between two events here: such bytes cannot be
    /// one whole event, and the caller treats them as lost.
    pub fn elided(&mut self, ts_ns: u64, content: u32) -> Option<SseEvent> {
        let between_events = self.line.is_empty()
            && !self.line_overflow
            && self.data.is_empty()
            && self.event.is_empty();
        if !between_events {
            return None;
        }
        // It may be the stream's first event (it starts with `data:`, not a BOM); its last
        // byte was the blank line's `\n`.
        self.started = true;
        self.after_cr = false;
        Some(SseEvent {
            ts_ns,
            event: None,
            data: String::new(),
            id: (!self.last_id.is_empty()).then(|| self.last_id.clone()),
            elided: Some(content),
        })
    }

    /// Number of lines dropped because they exceeded [`MAX_LINE`] or [`MAX_EVENT_DATA`].
    pub fn truncated_lines(&self) -> u64 {
        self.truncated
    }

    /// The last valid `retry:` value in milliseconds, if any.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// Appends bytes to the current line, respecting [`MAX_LINE`].
    fn push_line_bytes(&mut self, bytes: &[u8]) {
        if self.line_overflow {
            return;
        }
        if self.line.len() + bytes.len() > MAX_LINE {
            self.line_overflow = true;
            self.line.clear();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    /// Handles a complete line; returns the event a blank line dispatched.
    fn end_line(&mut self, ts_ns: u64) -> Option<SseEvent> {
        let line = std::mem::take(&mut self.line);
        let first = !self.started;
        self.started = true;
        if std::mem::take(&mut self.line_overflow) {
            self.truncated += 1;
            return None;
        }
        let line = if first {
            line.strip_prefix(BOM).unwrap_or(&line)
        } else {
            &line[..]
        };
        if line.is_empty() {
            return self.dispatch(ts_ns);
        }
        self.process_field(line);
        None
    }

    /// Applies one non-blank line (field or comment).
    fn process_field(&mut self, line: &[u8]) {
        if line[0] == b':' {
            return; // comment, e.g. keep-alive pings
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match name {
            b"event" => self.event = value.into_owned(),
            b"data" => self.append_data(&value),
            b"id" if !value.contains('\0') => self.last_id = value.into_owned(),
            b"retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {} // unknown fields are ignored per the spec
        }
    }

    /// Appends one `data:` value and its newline, respecting [`MAX_EVENT_DATA`].
    fn append_data(&mut self, value: &str) {
        if self.data.len() + value.len() + 1 > MAX_EVENT_DATA {
            self.truncated += 1;
            return;
        }
        self.data.push_str(value);
        self.data.push('\n');
    }

    /// Blank line: dispatch the buffered event if it has data, then reset the buffers.
    fn dispatch(&mut self, ts_ns: u64) -> Option<SseEvent> {
        let mut data = std::mem::take(&mut self.data);
        let event = std::mem::take(&mut self.event);
        if data.is_empty() {
            return None;
        }
        if data.ends_with('\n') {
            data.pop();
        }
        Some(SseEvent {
            ts_ns,
            event: (!event.is_empty()).then_some(event),
            data,
            id: (!self.last_id.is_empty()).then(|| self.last_id.clone()),
            elided: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(p: &mut SseParser, parts: &[(u64, &[u8])]) -> Vec<SseEvent> {
        parts.iter().flat_map(|(ts, b)| p.feed(*ts, b)).collect()
    }

    #[test]
    fn simple_events_and_done() {
        let mut p = SseParser::new();
        let ev = p.feed(5, b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].data, "{\"a\":1}");
        assert_eq!(ev[0].ts_ns, 5);
        assert_eq!(ev[1].data, "[DONE]");
        assert_eq!(ev[1].event, None);
        assert_eq!(ev[1].id, None);
    }

    #[test]
    fn line_endings_cr_crlf_lf_and_split_crlf() {
        let mut p = SseParser::new();
        let ev = feed_all(
            &mut p,
            &[
                (1, b"data: a\r"),
                (2, b"\ndata: b\r\r"),
                (3, b"data: c\n"),
                (4, b"\r\n"),
            ],
        );
        assert_eq!(ev.len(), 2);
        assert_eq!((ev[0].data.as_str(), ev[0].ts_ns), ("a\nb", 2));
        assert_eq!((ev[1].data.as_str(), ev[1].ts_ns), ("c", 4));
    }

    #[test]
    fn fields_comments_multiline_and_persisting_id() {
        let mut p = SseParser::new();
        let ev = p.feed(
            9,
            b": ping\nevent: delta\nid: 7\nretry: 300\ndata:x\ndata\ndata:  y\n\ndata: z\n\n",
        );
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].event.as_deref(), Some("delta"));
        assert_eq!(ev[0].data, "x\n\n y");
        assert_eq!(ev[0].id.as_deref(), Some("7"));
        assert_eq!(ev[1].event, None, "event type resets after dispatch");
        assert_eq!(ev[1].id.as_deref(), Some("7"), "last event id persists");
        assert_eq!(p.retry(), Some(300));
    }

    #[test]
    fn empty_data_buffer_does_not_dispatch() {
        let mut p = SseParser::new();
        assert!(p.feed(1, b"event: x\n\n: c\n\n").is_empty());
        let ev = p.feed(2, b"data:\n\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "");
        assert_eq!(ev[0].event, None);
    }

    #[test]
    fn bom_split_across_feeds_is_ignored() {
        let mut p = SseParser::new();
        let ev = feed_all(&mut p, &[(1, b"\xEF\xBB"), (2, b"\xBFdata: a\n\n")]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "a");
    }

    #[test]
    fn unfinished_event_not_dispatched() {
        let mut p = SseParser::new();
        assert!(p.feed(1, b"data: partial\n").is_empty());
    }

    #[test]
    fn overlong_line_dropped_and_counted() {
        let mut p = SseParser::new();
        let mut big = b"data: ".to_vec();
        big.resize(MAX_LINE + 10, b'a');
        assert!(p.feed(1, &big).is_empty());
        let ev = p.feed(2, b"\ndata: ok\n\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "ok");
        assert_eq!(p.truncated_lines(), 1);
    }

    #[test]
    fn an_elided_event_fits_only_between_events() {
        let mut p = SseParser::new();
        // The stream's first event may be one.
        let first = p.elided(1, 3).expect("between events");
        assert_eq!(
            (first.ts_ns, first.elided, first.data.as_str()),
            (1, Some(3), "")
        );
        assert!(p.feed(2, b"id: 7\ndata: half").is_empty());
        assert!(p.elided(3, 1).is_none());
        assert_eq!(p.feed(4, b"\n\n").len(), 1);
        let next = p.elided(5, 0).expect("between events");
        assert_eq!((next.elided, next.id.as_deref()), (Some(0), Some("7")));
    }

    #[test]
    fn byte_at_a_time_matches_whole() {
        let input = b"event: e\r\ndata: 1\r\ndata: 2\r\n\r\ndata: [DONE]\r\n\r\n";
        let whole = SseParser::new().feed(0, input);
        let mut p = SseParser::new();
        let split: Vec<SseEvent> = input
            .iter()
            .flat_map(|b| p.feed(0, std::slice::from_ref(b)))
            .collect();
        assert_eq!(whole, split);
        assert_eq!(whole.len(), 2);
    }
}
