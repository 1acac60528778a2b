//! Event-loop iteration boundaries: the epoll waits of tracked processes' main threads.
//!
//! An asyncio (uvloop) loop waits in epoll once per iteration, and callbacks made ready in one
//! iteration run in the next. vLLM's API server stamps an engine output an iteration after its
//! loop took it off the socket, so userspace needs the loop thread's waits to find that
//! instant (agent `engines/common/handoff.rs`). Only main threads are followed: that is where
//! asyncio runs, and other threads (libzmq's I/O threads) wait far more often.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use infertrace_common::{PollRecord, counter, kind};

use crate::shared::{count, header, submit, tracked_tgid};

/// Offset of `ret` in a sys_exit_* record.
const RET: usize = 16;

/// Entry time of the epoll wait each main thread is in (key: tgid, which is its tid).
#[map]
static POLL_ENTER: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// The tracked process's tgid when the current task is its main thread.
#[inline(always)]
fn tracked_main_thread() -> Option<u32> {
    tracked_tgid()
        .filter(|(tgid, tid)| tgid == tid)
        .map(|(tgid, _)| tgid)
}

fn on_enter() -> u32 {
    let Some(tgid) = tracked_main_thread() else {
        return 0;
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if POLL_ENTER.insert(&tgid, &now, 0).is_err() {
        count(counter::MAP_FULL, 1);
    }
    0
}

fn on_exit(ctx: &TracePointContext) -> u32 {
    // Other threads share the key (the tgid): only the main thread may take the entry.
    let Some(tgid) = tracked_main_thread() else {
        return 0;
    };
    // SAFETY: the value is copied out immediately. A thread that became tracked while it
    // waited has no entry and is skipped.
    let Some(&enter_ns) = (unsafe { POLL_ENTER.get(&tgid) }) else {
        return 0;
    };
    let _ = POLL_ENTER.remove(&tgid);
    // SAFETY: offset from the sys_exit_* format files.
    let ret: i64 = unsafe { ctx.read_at(RET) }.unwrap_or(0);
    let record = PollRecord {
        header: header(kind::POLL, tgid),
        enter_ns,
        ret,
    };
    submit(&record);
    0
}

/// One enter and one exit program per epoll wait syscall.
macro_rules! follow_poll {
    ($enter:ident, $exit:ident) => {
        #[tracepoint]
        pub fn $enter(_ctx: TracePointContext) -> u32 {
            on_enter()
        }

        #[tracepoint]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            on_exit(&ctx)
        }
    };
}

follow_poll!(sys_enter_epoll_wait, sys_exit_epoll_wait);
follow_poll!(sys_enter_epoll_pwait, sys_exit_epoll_pwait);
follow_poll!(sys_enter_epoll_pwait2, sys_exit_epoll_pwait2);
