//! Root test: the epoll waits of a traced process's main thread (its asyncio loop) come out as
//! loop waits with their real durations; another thread's waits do not.
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
fn the_main_threads_epoll_waits_are_loop_waits_and_other_threads_are_not_followed() {
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
    // The loop's five 50 ms sleeps are five waits of about 50 ms (a timer that fires a little
    // early makes a second, short wait, so not exactly five waits in all).
    let sleeps = waits
        .iter()
        .filter(|w| (40 * MS..500 * MS).contains(&(w.exit_ns - w.enter_ns)))
        .count();
    assert_eq!(sleeps, 5, "{waits:?}");
    // The other thread's 200 waits of 1 ms are not among them.
    assert!(waits.len() < 50, "{} waits", waits.len());
}
