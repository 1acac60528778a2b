//! Process tree: sched_process_fork / exec / exit.
//!
//! vLLM and SGLang start their engine processes after the API server (fork + exec), so the set
//! of tracked processes grows in the kernel the moment a tracked process forks: no syscall of
//! the child can slip by before userspace hears of it.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use infertrace_common::{ProcRecord, RecordHeader, counter, kind};

use crate::shared::{TRACKED, config, count, submit, tracked_tgid};

/// Offsets in the tracepoints' records (see /sys/kernel/tracing/events/sched/*/format).
const FORK_CHILD_PID: usize = 20;
const EXIT_GROUP_DEAD: usize = 32;

fn emit(kind: u32, tgid: u32, tid: u32, child: u32) {
    let comm = bpf_get_current_comm().unwrap_or_default();
    let record = ProcRecord {
        header: RecordHeader {
            kind,
            tgid,
            tid,
            _pad: 0,
            // SAFETY: helper without preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        child,
        _pad: 0,
        comm,
    };
    submit(&record);
}

/// A tracked process forked (or created a thread: the tracepoint cannot tell, so the new task
/// id is tracked and userspace removes it again when /proc says it is a thread).
#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let Some((tgid, tid)) = tracked_tgid() else {
        return 0;
    };
    // SAFETY: offset from the tracepoint's format file.
    let child: i32 = unsafe { ctx.read_at(FORK_CHILD_PID) }.unwrap_or(0);
    if child <= 0 {
        return 0;
    }
    let child = child as u32;
    // No stream template: the child serves other responses than its parent's, if any.
    if TRACKED.insert(&child, &0, 0).is_err() {
        count(counter::MAP_FULL, 1);
    }
    emit(kind::FORK, tgid, tid, child);
    0
}

/// A tracked process replaced its program: userspace re-reads its identity. In node mode
/// (`announce_execs`) any other process's exec is reported too, so that an engine is tracked
/// from its start, before its first request; an exec is rare next to the I/O traced.
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    if let Some((tgid, tid)) = tracked_tgid() {
        emit(kind::EXEC, tgid, tid, tgid);
    } else if config().announce_execs != 0 {
        let id = bpf_get_current_pid_tgid();
        let tgid = (id >> 32) as u32;
        emit(kind::SPAWN, tgid, id as u32, tgid);
    }
    0
}

/// A task exited; when it was the last of its process, the process is untracked.
#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let Some((tgid, tid)) = tracked_tgid() else {
        return 0;
    };
    // SAFETY: offset from the tracepoint's format file.
    let group_dead: u8 = unsafe { ctx.read_at(EXIT_GROUP_DEAD) }.unwrap_or(0);
    crate::cuda::thread_exit(tgid, tid);
    if group_dead != 0 {
        let _ = TRACKED.remove(&tgid);
        emit(kind::EXIT, tgid, tid, ctx.tgid());
    } else if tid != tgid {
        // A thread's id may have been inserted by the fork program; it must not linger and
        // later match an unrelated process that reuses the number.
        let _ = TRACKED.remove(&tid);
    }
    0
}
