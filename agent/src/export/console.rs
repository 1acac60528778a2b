//! Human-readable lines for decoded messages: one per HTTP exchange, one per ZMTP message.
//!
//! Each line is written into one pre-sized String: on a busy engine this runs for every
//! message, and per-value `format!` calls made it the agent's most expensive step.
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
        let mut line = String::with_capacity(160);
        self.time(&mut line, decoded.start_ns());
        match decoded {
            Decoded::Http { tgid, fd, exchange } => {
                let _ = write!(line, " http pid={tgid} fd={fd} ");
                http(&mut line, exchange);
            }
            Decoded::Zmtp {
                tgid,
                fd,
                outgoing,
                message,
            } => {
                let direction = if *outgoing { "send" } else { "recv" };
                let _ = write!(line, " zmtp pid={tgid} fd={fd} {direction} ");
                zmtp(&mut line, message);
            }
        }
        line
    }

    /// HH:MM:SS.micros of the wall clock.
    fn time(&self, line: &mut String, monotonic_ns: u64) {
        let wall = monotonic_ns as i128 + self.realtime_offset_ns;
        // Narrowed before formatting: formatting an i128 costs thousands of instructions.
        let secs_of_day = (wall / 1_000_000_000).rem_euclid(86_400) as u32;
        let micros = (wall / 1_000).rem_euclid(1_000_000) as u32;
        let _ = write!(
            line,
            "{:02}:{:02}:{:02}.{micros:06}",
            secs_of_day / 3600,
            secs_of_day / 60 % 60,
            secs_of_day % 60
        );
    }
}

fn http(line: &mut String, exchange: &HttpExchange) {
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
}

fn zmtp(line: &mut String, message: &ZmtpMessage) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let total: usize = message.frames.iter().map(Vec::len).sum();
    let _ = write!(line, "{} frame(s), {total} B:", message.frames.len());
    for frame in message.frames.iter().take(MAX_FRAMES_SHOWN) {
        let _ = write!(line, " [{} B ", frame.len());
        for &b in frame.iter().take(HEAD_BYTES) {
            line.push(HEX[usize::from(b >> 4)] as char);
            line.push(HEX[usize::from(b & 0xf)] as char);
        }
        line.push_str(if frame.len() > HEAD_BYTES { "..]" } else { "]" });
    }
    if message.frames.len() > MAX_FRAMES_SHOWN {
        line.push_str(" ...");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zmtp_line() {
        let message = ZmtpMessage {
            first_ns: 1_000_000_000,
            last_ns: 1_000_000_000,
            frames: vec![vec![0x00], (0u8..20).collect()],
        };
        let d = Decoded::Zmtp {
            tgid: 5,
            fd: 9,
            outgoing: true,
            message,
        };
        assert_eq!(
            Console::new(3_600_000_000_000).line(&d),
            "01:00:01.000000 zmtp pid=5 fd=9 send 2 frame(s), 21 B: [1 B 00] \
             [20 B 000102030405060708090a0b..]"
        );
    }
}
