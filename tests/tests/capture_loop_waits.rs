//! Root test: the epoll waits of a traced process's main thread (its asyncio loop) that follow
//! its input come out as loop waits with their real durations, and the one after an iteration
//! that held the loop with when that iteration began; its waits after no input, and another
//! thread's waits, do not.
use infertrace::decode::flows::{Decoded, LoopWait};
use infertrace_tests::{Script, Tracer, fixture};

const MS: u64 = 1_000_000;

fn loop_waits(decoded: &[Decoded], pid: u32) -> Vec<LoopWait> {
    decoded
        .iter()
        .filter_map(|d| match d {
            Decoded::LoopWait(w) if w.tgid == pid => Some(*w),
            _ => None,
        })
        .collect()
}

#[test]
fn the_main_threads_epoll_waits_after_input_are_loop_waits_and_no_others() {
    let mut script = Script::start(&[fixture("event_loop.py").to_str().unwrap()]);
    assert_eq!(script.read_line(), "ready");
    let mut tracer = Tracer::attach(&[script.pid()]);
    let line = tracer.pump_during(|| {
        script.send_line("go");
        script.read_line()
    });
    assert_eq!(line, "done");
    tracer.pump();
    let (decoded, _) = tracer.finish();
    let waits = loop_waits(&decoded, script.pid());
    assert!(waits.iter().all(|w| w.exit_ns >= w.enter_ns));
    let lasting = |from: u64, to: u64| {
        waits
            .iter()
            .filter(|w| (from..to).contains(&(w.exit_ns - w.enter_ns)))
            .count()
    };
    // Each 50 ms sleep after a read of the socket is a wait of about 50 ms.
    assert_eq!(lasting(40 * MS, 500 * MS), 5, "{waits:?}");
    // The 20 ms sleeps after them followed no input: not reported.
    assert_eq!(lasting(10 * MS, 35 * MS), 0, "{waits:?}");
    // The wait after the callback that held the loop 120 ms says when its iteration began.
    let held: Vec<u64> = waits
        .iter()
        .filter_map(|w| Some(w.enter_ns - w.long_iteration_from_ns?))
        .collect();
    assert!(
        matches!(held.as_slice(), [ns] if (110 * MS..500 * MS).contains(ns)),
        "{waits:?}"
    );
    // Nor the other thread's 200 waits of 1 ms, nor the loop's other waits (the start-up's
    // reads of stdin and of the program's files come before a few).
    assert!(waits.len() <= 9, "{} waits: {waits:?}", waits.len());
}
