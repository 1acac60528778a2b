//! libzmq's hand-over of a message: uprobes on `zmq_msg_send` in traced processes.
//!
//! An application thread's send only queues the message for libzmq's I/O thread, which writes
//! it to the socket later (the syscall the capture sees), as late as a CPU frees up for it.
//! The instant the engines mean by "sent" (SGLang's dispatch stamp, its scheduler's end of a
//! step) is the send's return: one record per message, at the return of the call that passed
//! its last part.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext},
};
use infertrace_common::{ZMQ_SNDMORE, ZmqSendRecord, counter, kind};

use crate::shared::{count, header, submit};

/// A send between its entry and return on one thread (key: thread id).
#[repr(C)]
#[derive(Clone, Copy)]
struct Pending {
    socket: u64,
    enter_ns: u64,
}

#[map]
static ZMQ_PENDING: HashMap<u32, Pending> = HashMap::with_max_entries(8192, 0);

/// `int zmq_msg_send(zmq_msg_t *msg, void *socket, int flags)`.
#[uprobe]
pub fn zmq_send_enter(ctx: ProbeContext) -> u32 {
    let flags: u32 = ctx.arg(2).unwrap_or(0);
    if flags & ZMQ_SNDMORE != 0 {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let pending = Pending {
        socket: ctx.arg(1).unwrap_or(0),
        // SAFETY: helper without preconditions.
        enter_ns: unsafe { bpf_ktime_get_ns() },
    };
    if ZMQ_PENDING.insert(&tid, &pending, 0).is_err() {
        count(counter::MAP_FULL, 1);
    }
    0
}

#[uretprobe]
pub fn zmq_send_return(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((id >> 32) as u32, id as u32);
    // SAFETY: copied out at once.
    let Some(pending) = (unsafe { ZMQ_PENDING.get(&tid) }).copied() else {
        return 0;
    };
    let _ = ZMQ_PENDING.remove(&tid);
    // The part's size, or -1 (EAGAIN when the socket is full: it is sent again later).
    let result: i32 = ctx.ret();
    if result >= 0 {
        submit(&ZmqSendRecord {
            header: header(kind::ZMQ_SEND, tgid),
            socket: pending.socket,
            enter_ns: pending.enter_ns,
            size: result as u32,
            _pad: 0,
        });
    }
    0
}
