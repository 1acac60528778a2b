//! Event-loop iteration boundaries: the epoll waits of tracked processes' main threads.
//!
//! An asyncio (uvloop) loop waits in epoll once per iteration, and callbacks made ready in one
//! iteration run in the next. vLLM's API server stamps an engine output an iteration after its
//! loop took it off the socket, so userspace needs the loop thread's waits to find that
//! instant (agent `engines/common/handoff.rs`). Only main threads are followed: that is where
//! asyncio runs, and other threads (libzmq's I/O threads) wait far more often. And only the
//! first wait after the main thread took input (a captured read: the mailbox read that hands
//! it a message, a client's request): the one that instant needs. A streaming API server's
//! loop waits hundreds of times per request, almost always with nothing taken in between.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use infertrace_common::{PollRecord, kind};

use crate::shared::{header, set_own_entry, submit, tracked_main_thread};

/// Offset of `ret` in a sys_exit_* record.
const RET: usize = 16;

/// Per main thread (key: tgid, which is its tid): [`IDLE`], [`ARMED`] or the entry time of the
/// followed wait it is in. Written in place; LRU, so exited processes' entries are reused.
#[map]
static POLL_STATE: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// No input since the last followed wait.
const IDLE: u64 = 0;
/// Input taken: the next wait is followed.
const ARMED: u64 = 1;

/// The current thread, main thread of tracked process `tgid`, took input: follow its next
/// epoll wait.
pub(crate) fn arm(tgid: u32) {
    set_own_entry(&POLL_STATE, &tgid, ARMED);
}

fn on_enter() -> u32 {
    let Some(tgid) = tracked_main_thread() else {
        return 0;
    };
    if let Some(state) = POLL_STATE.get_ptr_mut(&tgid) {
        // SAFETY: only this thread writes its entry.
        unsafe {
            if *state == ARMED {
                *state = bpf_ktime_get_ns();
            }
        }
    }
    0
}

fn on_exit(ctx: &TracePointContext) -> u32 {
    // Other threads share the key (the tgid): only the main thread may take the entry.
    let Some(tgid) = tracked_main_thread() else {
        return 0;
    };
    let Some(state) = POLL_STATE.get_ptr_mut(&tgid) else {
        return 0;
    };
    // SAFETY: only this thread writes its entry; copied out, then reset.
    let enter_ns = unsafe {
        let enter_ns = *state;
        if enter_ns > ARMED {
            *state = IDLE;
        }
        enter_ns
    };
    if enter_ns <= ARMED {
        return 0;
    }
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
