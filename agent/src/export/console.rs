//! Human-readable lines for decoded messages: one per HTTP exchange, one per ZMTP message.
use std::fmt::Write as _;

use crate::decode::{flows::Decoded, http::HttpExchange, zmtp::ZmtpMessage};

/// Bytes of each frame shown in hex.
const HEAD_BYTES: usize = 12;
/// Frames listed per ZMTP message before "...".
const MAX_FRAMES_SHOWN: usize = 4;

/// Renders lines with wall-clock times from the kernel's monotonic timestamps.
pub struct Console {
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, ns.
    realtime_offset_ns: i128,
}

impl Console {
    pub fn new(realtime_offset_ns: i128) -> Self {
        Self { realtime_offset_ns }
    }

    pub fn line(&self, decoded: &Decoded) -> String {
        match decoded {
            Decoded::Http { tgid, fd, exchange } => {
                format!(
                    "{} http pid={tgid} fd={fd} {}",
                    self.time(decoded.start_ns()),
                    http(exchange)
                )
            }
            Decoded::Zmtp {
                tgid,
                fd,
                outgoing,
                message,
            } => format!(
                "{} zmtp pid={tgid} fd={fd} {} {}",
                self.time(message.first_ns),
                if *outgoing { "send" } else { "recv" },
                zmtp(message)
            ),
        }
    }

    fn time(&self, monotonic_ns: u64) -> String {
        let wall = monotonic_ns as i128 + self.realtime_offset_ns;
        let secs_of_day = (wall / 1_000_000_000).rem_euclid(86_400);
        let micros = (wall / 1_000).rem_euclid(1_000_000);
        format!(
            "{:02}:{:02}:{:02}.{micros:06}",
            secs_of_day / 3600,
            secs_of_day / 60 % 60,
            secs_of_day % 60
        )
    }
}

fn http(exchange: &HttpExchange) -> String {
    let mut line = String::new();
    match &exchange.request {
        Some(req) => {
            let _ = write!(line, "{} {} ({} B)", req.method, req.path, req.body.len());
        }
        None => line.push_str("<request not seen>"),
    }
    match &exchange.response {
        Some(resp) => {
            let _ = write!(
                line,
                " -> {} {} ({} B",
                resp.status,
                resp.reason,
                resp.body.len()
            );
            if !resp.sse_events.is_empty() {
                let _ = write!(line, ", {} SSE events", resp.sse_events.len());
            }
            line.push(')');
            if let Some(req) = &exchange.request {
                let ms = resp.last_ns.saturating_sub(req.first_ns) as f64 / 1e6;
                let _ = write!(line, " {ms:.3} ms");
            }
        }
        None => line.push_str(" -> <no response>"),
    }
    if !exchange.complete {
        line.push_str(" [incomplete]");
    }
    line
}

fn zmtp(message: &ZmtpMessage) -> String {
    let total: usize = message.frames.iter().map(Vec::len).sum();
    let mut line = format!("{} frame(s), {total} B:", message.frames.len());
    for frame in message.frames.iter().take(MAX_FRAMES_SHOWN) {
        let head: String = frame
            .iter()
            .take(HEAD_BYTES)
            .map(|b| format!("{b:02x}"))
            .collect();
        let more = if frame.len() > HEAD_BYTES { ".." } else { "" };
        let _ = write!(line, " [{} B {head}{more}]", frame.len());
    }
    if message.frames.len() > MAX_FRAMES_SHOWN {
        line.push_str(" ...");
    }
    line
}
