//! Fuzzes the reading of an SGLang scheduler's log: arbitrary bytes as the writes of one
//! stream (split where the first byte says), each completed line parsed as a statistics report
//! or a retraction. It must return a report or nothing, and never panic.
#![no_main]

use infertrace::{decode::lines::LineSplitter, engines::sglang::log::parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, bytes)) = data.split_first() else {
        return;
    };
    let at = usize::from(split).min(bytes.len());
    let mut lines = LineSplitter::default();
    let (first, second) = bytes.split_at(at);
    for line in lines.feed(first).into_iter().chain(lines.feed(second)) {
        let _ = parse(&line);
    }
});
