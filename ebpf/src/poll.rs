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
//! And the first wait after an iteration longer than `LONG_ITERATION_NS`, with when that
//! iteration began: the loop was held (a garbage collection pass), and the messages that
//! reached the process meanwhile were taken over only at its end, which no other syscall shows.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use infertrace_common::{LONG_ITERATION_NS, PollRecord, kind};

use crate::shared::{header, set_own_entry, submit, tracked_main_thread};

/// Offset of `ret` in a sys_exit_* record.
const RET: usize = 16;

/// One main thread's loop, as its waits show it.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopState {
    /// [`IDLE`], [`ARMED`] or the entry time of the followed wait it is in.
    wait: u64,
    /// When its latest wait returned (0: none seen yet).
    last_exit_ns: u64,
    /// When the iteration the followed wait ends began, if that iteration was long; else 0.
    iteration_start_ns: u64,
}

/// Per main thread (key: tgid, which is its tid). Written in place; LRU, so exited processes'
/// entries are reused.
#[map]
static POLL_STATE: LruHashMap<u32, LoopState> = LruHashMap::with_max_entries(16384, 0);

/// No input since the last followed wait.
const IDLE: u64 = 0;
/// Input taken: the next wait is followed.
const ARMED: u64 = 1;

/// The current thread, main thread of tracked process `tgid`, took input: follow its next
/// epoll wait.
pub(crate) fn arm(tgid: u32) {
    match POLL_STATE.get_ptr_mut(&tgid) {
        // SAFETY: only this thread writes its entry.
        Some(state) => unsafe { (*state).wait = ARMED },
        None => set_own_entry(
            &POLL_STATE,
            &tgid,
            LoopState {
                wait: ARMED,
                last_exit_ns: 0,
                iteration_start_ns: 0,
            },
        ),
    }
}

fn on_enter() -> u32 {
    let Some(tgid) = tracked_main_thread() else {
        return 0;
    };
    if let Some(state) = POLL_STATE.get_ptr_mut(&tgid) {
        // SAFETY: helper without preconditions; only this thread writes its entry.
        unsafe {
            let now = bpf_ktime_get_ns();
            let state = &mut *state;
            let began = state.last_exit_ns;
            let long = began != 0 && now.saturating_sub(began) > LONG_ITERATION_NS;
            if state.wait == ARMED || long {
                state.wait = now;
                state.iteration_start_ns = if long { began } else { 0 };
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
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(state) = POLL_STATE.get_ptr_mut(&tgid) else {
        // Its first wait seen: iterations are measured from its return.
        set_own_entry(
            &POLL_STATE,
            &tgid,
            LoopState {
                wait: IDLE,
                last_exit_ns: now,
                iteration_start_ns: 0,
            },
        );
        return 0;
    };
    // SAFETY: only this thread writes its entry; copied out, then reset.
    let (enter_ns, iteration_start_ns) = unsafe {
        let state = &mut *state;
        let followed = (state.wait, state.iteration_start_ns);
        state.last_exit_ns = now;
        if state.wait > ARMED {
            state.wait = IDLE;
        }
        followed
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
        iteration_start_ns,
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
