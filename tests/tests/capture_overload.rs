//! Root test: overload the real ring buffer. A small ring and a flood of 64 KiB ZMTP frames
//! that the test does not drain while they are sent: records are lost in the kernel. The loss
//! must be counted, every message reported must be exactly one that was sent (never glued
//! across a hole), and decoding must pick up again after the gaps.
use infertrace::{
    capture::kernel::KernelOptions,
    decode::flows::{Decoded, FlowStats},
};
use std::time::Duration;

use infertrace_tests::{Script, Tracer, fixture};

const COUNT: u64 = 2000;
const SIZE: usize = 64 * 1024;

/// The body the fixture sends as frame `index`.
fn body(index: u64) -> Vec<u8> {
    let mut unit = index.to_be_bytes().to_vec();
    unit.extend((0..256u64).map(|i| ((index + i) % 251) as u8));
    unit.iter().copied().cycle().take(SIZE).collect()
}

#[test]
fn ring_buffer_overflow_is_counted_and_decoding_resynchronises() {
    let mut flood = Script::start(&[
        fixture("flood.py").to_str().unwrap(),
        &COUNT.to_string(),
        &SIZE.to_string(),
    ]);
    let mut tracer = Tracer::attach_with(
        &[flood.pid()],
        &KernelOptions {
            ring_bytes: 1024 * 1024,
            ..KernelOptions::default()
        },
    );
    assert_eq!(flood.read_line(), "ready");
    tracer.pump(); // classify the socket pair while it exists
    // A slow reader: the 1 MiB ring holds ~15 of the 64 KiB messages, and fills up between
    // drains 50 ms apart.
    let line = tracer.pump_every_during(Duration::from_millis(50), || {
        flood.send_line("go");
        flood.read_line()
    });
    assert_eq!(line, "done");
    tracer.pump();
    let counters = tracer.kernel_counters();
    flood.send_line("exit");
    let (decoded, stats): (Vec<Decoded>, FlowStats) = tracer.finish();

    assert!(
        counters.ring_full > 0,
        "the flood must overflow the ring: {counters:?}"
    );
    assert!(stats.gaps > 0, "lost records must become gaps: {stats:?}");
    let mut indices = Vec::new();
    for d in &decoded {
        let Decoded::Zmtp { message, .. } = d else {
            continue;
        };
        if message.frames[0].len() != SIZE {
            continue; // the warm-up frame
        }
        assert_eq!(message.frames.len(), 1);
        let frame = &message.frames[0];
        let index = u64::from_be_bytes(frame[..8].try_into().unwrap());
        assert!(index < COUNT, "index {index} was never sent");
        assert!(*frame == body(index), "message {index} is not byte-exact");
        indices.push(index);
    }
    assert!(
        !indices.is_empty(),
        "nothing decoded at all: {stats:?} {counters:?}"
    );
    // Messages after the first loss were decoded: the decoder resynchronised.
    let max = indices.iter().max().copied().unwrap_or(0);
    assert!(
        max > 100,
        "decoding stopped after the first gap (last index {max})"
    );
    println!(
        "ring_full={} gaps={} decoded={} byte-exact messages (both directions) of {} sent",
        counters.ring_full,
        stats.gaps,
        indices.len(),
        COUNT
    );
}
