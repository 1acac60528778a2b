//! Polls of libzmq mailboxes: a non-blocking receive that finds no message makes libzmq
//! check the socket's mailbox eventfd with `poll(fd, 1, 0)`, so an application thread that
//! drains its sockets once per loop iteration (SGLang's scheduler) leaves one such poll per
//! socket and iteration, whether or not anything arrived. Only a process's main thread's polls
//! (the loop runs there; libzmq's I/O thread checks its own mailbox twice per message sent,
//! which tells userspace nothing) whose first fd is one whose polls userspace follows
//! (`fd_action::CAPTURE_POLLS`) are reported; an fd not classified yet is reported as new
//! first, like an unknown fd in a read or a write, and its polls until userspace decides.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use infertrace_common::{FdKey, MAILBOX_POLL_MAX_FDS, MailboxPollRecord, fd_action, kind};

use crate::{
    io::{apply_decision, report_new_fd},
    shared::{FD_CLASS, header, set_own_entry, submit, tracked_main_thread},
};

/// Offsets of the syscall arguments in a sys_enter_poll record, and of `ret` in sys_exit_poll.
const ARG0: usize = 16;
const ARG1: usize = 24;
const ARG2: usize = 32;
const RET: usize = 16;

/// A mailbox poll in flight on one thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct Polling {
    /// 0 once its exit has taken it (the entry stays, for the thread's next poll).
    enter_ns: u64,
    fd: u32,
    nfds: u32,
    timeout_ms: i32,
    second_fd: i32,
}

/// One entry per main thread (pid_tgid), written in place at each reported poll (as
/// `io.rs` did with its syscalls in flight: an insert and a delete per poll cost more than
/// the rest). LRU: exited threads' entries are reused.
#[map]
static POLLING: LruHashMap<u64, Polling> = LruHashMap::with_max_entries(16384, 0);

#[tracepoint]
pub fn sys_enter_poll(ctx: TracePointContext) -> u32 {
    let Some(tgid) = tracked_main_thread() else {
        return 0;
    };
    // SAFETY: offsets from the sys_enter_poll format file (all arguments are 8 bytes wide).
    let (fds, nfds, timeout) = unsafe {
        (
            ctx.read_at::<u64>(ARG0).unwrap_or(0),
            ctx.read_at::<u64>(ARG1).unwrap_or(0),
            ctx.read_at::<i64>(ARG2).unwrap_or(0),
        )
    };
    if fds == 0 || nfds == 0 || nfds > MAILBOX_POLL_MAX_FDS {
        return 0;
    }
    // `struct pollfd` (8 bytes) begins with its `int fd`.
    // SAFETY: a user pointer read with the checking helper.
    let Ok(fd) = (unsafe { bpf_probe_read_user(fds as *const i32) }) else {
        return 0;
    };
    let second_fd = if nfds == 2 {
        // SAFETY: as above, the second `struct pollfd`.
        unsafe { bpf_probe_read_user((fds + 8) as *const i32) }.unwrap_or(-1)
    } else {
        -1
    };
    if fd < 0 {
        return 0;
    }
    let fd = fd as u32;
    let key = FdKey { tgid, fd };
    // Reported until userspace has decided, as a read or write would be (the first polls of
    // a scheduler's mailboxes are those of the first iteration after attach), then only for
    // the mailboxes whose polls userspace follows.
    match FD_CLASS.get_ptr_mut(&key) {
        None => {
            report_new_fd(tgid, fd, key);
        }
        // SAFETY: pointer into a live map value.
        Some(state) => {
            let action = unsafe { apply_decision(&mut *state, &key) };
            if action != fd_action::CAPTURE_POLLS && action != fd_action::PENDING {
                return 0;
            }
        }
    }
    let polling = Polling {
        // SAFETY: helper without preconditions.
        enter_ns: unsafe { bpf_ktime_get_ns() },
        fd,
        nfds: nfds as u32,
        timeout_ms: timeout as i32,
        second_fd,
    };
    set_own_entry(&POLLING, &bpf_get_current_pid_tgid(), polling);
    0
}

#[tracepoint]
pub fn sys_exit_poll(ctx: TracePointContext) -> u32 {
    if tracked_main_thread().is_none() {
        return 0;
    }
    let id = bpf_get_current_pid_tgid();
    let Some(slot) = POLLING.get_ptr_mut(&id) else {
        return 0;
    };
    // SAFETY: the current thread's own entry, copied out and then marked taken.
    let call = unsafe {
        let call = *slot;
        (*slot).enter_ns = 0;
        call
    };
    if call.enter_ns == 0 {
        return 0;
    }
    // SAFETY: offset from the sys_exit_poll format file.
    let ret: i64 = unsafe { ctx.read_at(RET) }.unwrap_or(0);
    let record = MailboxPollRecord {
        header: header(kind::MAILBOX_POLL, (id >> 32) as u32),
        enter_ns: call.enter_ns,
        ret,
        fd: call.fd,
        nfds: call.nfds,
        timeout_ms: call.timeout_ms,
        second_fd: call.second_fd,
    };
    submit(&record);
    0
}
