//! Fuzzes the ZMTP decoder: arbitrary bytes, split into syscalls at arbitrary points, with gaps.
//!
//! Input layout: a header byte picks the maximum frame size (small sizes reach the oversized
//! paths); then repeated `[control][bytes...]` where `control == 0xFF` is a gap and otherwise
//! `control` is the length of the next feed.
#![no_main]

use infertrace::decode::zmtp::{ZmtpEvent, ZmtpStream};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&config, mut rest)) = data.split_first() else {
        return;
    };
    let mut stream = match config % 4 {
        0 => ZmtpStream::with_max_frame_size(u64::from(config)),
        1 => ZmtpStream::with_max_frame_size(4096),
        _ => ZmtpStream::new(),
    };
    let mut ts = 0u64;
    while let Some((&control, tail)) = rest.split_first() {
        if control == 0xFF {
            stream.gap();
            rest = tail;
            continue;
        }
        let (chunk, tail) = tail.split_at(usize::from(control).min(tail.len()));
        ts += 1;
        for event in stream.feed(ts, chunk) {
            if let ZmtpEvent::Message(message) = event {
                assert!(!message.frames.is_empty(), "message without frames");
                assert!(message.first_ns <= message.last_ns, "time runs backwards");
            }
        }
        rest = tail;
    }
    let stats = stream.stats();
    assert!(stats.messages <= stats.frames, "more messages than frames");
});
