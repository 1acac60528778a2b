//! The event ABI between the eBPF programs (`ebpf/`) and the agent (`agent/`).
//!
//! Every ring-buffer record starts with a [`RecordHeader`]; its `kind` says which struct
//! follows. All structs are `repr(C)` with explicit padding so both sides agree on layout,
//! and the agent parses them from raw bytes (never by pointer cast of unaligned data).
#![no_std]

/// Kinds of ring-buffer records.
pub mod kind {
    /// A tracked process forked ([`ProcRecord`]); `child` may be a thread (userspace checks).
    pub const FORK: u32 = 1;
    /// A tracked process called execve ([`ProcRecord`]).
    pub const EXEC: u32 = 2;
    /// A tracked task exited ([`ProcRecord`]).
    pub const EXIT: u32 = 3;
    /// A tracked process used an fd the agent has not classified yet ([`NewFdRecord`]).
    pub const NEW_FD: u32 = 4;
    /// Socket payload bytes of one syscall, or one chunk of them ([`IoRecord`] + payload).
    pub const IO: u32 = 5;
    /// A tracked process closed an fd it had classified ([`NewFdRecord`] layout, `fd` closed).
    pub const CLOSE: u32 = 6;
    /// A tracked process's main thread returned from an epoll wait ([`PollRecord`]).
    pub const POLL: u32 = 7;
}

/// Direction of socket data as seen by the traced process.
pub mod direction {
    /// The process received the bytes (read, readv, recvfrom, recvmsg).
    pub const INGRESS: u8 = 0;
    /// The process sent the bytes (write, writev, sendto, sendmsg).
    pub const EGRESS: u8 = 1;
}

/// What the kernel side does with a (tgid, fd) pair, the value of the `FD_CLASS` map.
pub mod fd_action {
    /// Userspace was told about it and has not decided yet: do not report it again.
    pub const PENDING: u8 = 0;
    /// Copy its payloads.
    pub const CAPTURE: u8 = 1;
    /// Not interesting (pipe, eventfd, file, unrelated socket).
    pub const IGNORE: u8 = 2;
}

/// Flags of an [`IoRecord`].
pub mod io_flags {
    /// The syscall moved more bytes than the per-syscall cap: bytes past the cap were not copied.
    pub const TRUNCATED: u16 = 1;
    /// Reading user memory failed for this chunk: the payload is missing (`len` is 0).
    pub const READ_FAILED: u16 = 2;
    /// The last record of its syscall. A syscall whose LAST record never arrives lost records.
    pub const LAST: u16 = 4;
}

/// Indices of the per-CPU counter array `COUNTERS`.
pub mod counter {
    /// Records that did not fit in the ring buffer (lost).
    pub const RING_FULL: u32 = 0;
    /// Payload bytes not copied because a syscall exceeded the per-syscall cap.
    pub const TRUNCATED_BYTES: u32 = 1;
    /// Syscalls whose payload was truncated.
    pub const TRUNCATED_SYSCALLS: u32 = 2;
    /// Chunks whose user memory could not be read.
    pub const READ_FAILED: u32 = 3;
    /// Captured syscalls (payload-bearing, ret > 0).
    pub const CAPTURED_SYSCALLS: u32 = 4;
    /// Tracked-process or fd-class map updates that failed because a map was full.
    pub const MAP_FULL: u32 = 5;
    /// Number of counters.
    pub const COUNT: u32 = 6;
}

/// Payload bytes per ring-buffer record; larger syscalls are split into continuation records.
pub const CHUNK_SIZE: usize = 16 * 1024;
/// Most chunks one syscall can produce (caps a syscall at 4 MiB whatever the configuration).
pub const MAX_CHUNKS: u32 = 256;
/// Most iovec entries walked for readv/writev/sendmsg/recvmsg.
pub const MAX_IOVECS: u32 = 16;
/// Default per-syscall payload cap (bytes).
pub const DEFAULT_CAP_BYTES: u32 = 1024 * 1024;

/// Common prefix of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordHeader {
    /// One of [`kind`].
    pub kind: u32,
    /// Thread group id (process id) of the task that produced the record.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the record was produced.
    pub ts_ns: u64,
}

/// FORK / EXEC / EXIT.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcRecord {
    pub header: RecordHeader,
    /// FORK: the new task's id. EXEC/EXIT: the task itself.
    pub child: u32,
    pub _pad: u32,
    /// `comm` of the task (FORK: the child's; EXEC: after exec).
    pub comm: [u8; 16],
}

/// NEW_FD / CLOSE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NewFdRecord {
    pub header: RecordHeader,
    pub fd: u32,
    /// NEW_FD: the incarnation of this fd number (see [`FdState::generation`]); 0 in CLOSE
    /// records and in recordings made before it existed.
    pub generation: u32,
}

/// POLL: one `epoll_wait`/`epoll_pwait`/`epoll_pwait2` of a tracked process's main thread
/// (an asyncio loop's iteration boundary); `header.ts_ns` is the syscall's exit time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollRecord {
    pub header: RecordHeader,
    /// Syscall entry time (CLOCK_MONOTONIC).
    pub enter_ns: u64,
    /// Syscall return value: ready events, or a negative errno.
    pub ret: i64,
}

/// Header of an IO record; `len` payload bytes follow it in the same record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoRecord {
    /// `header.ts_ns` is the syscall's exit time.
    pub header: RecordHeader,
    /// Syscall entry time (CLOCK_MONOTONIC).
    pub enter_ns: u64,
    /// Per-(tgid, fd, direction) sequence number of the syscall, counted in the kernel, so that
    /// userspace orders records and sees when whole syscalls were lost.
    pub seq: u64,
    /// Syscall return value: bytes moved (always > 0 for an IO record).
    pub ret: i64,
    pub fd: u32,
    /// Offset of this chunk's first byte within the syscall's payload.
    pub offset: u32,
    /// Payload bytes in this record.
    pub len: u32,
    /// The syscall (see [`syscall`]).
    pub syscall: u16,
    /// [`io_flags`].
    pub flags: u16,
    /// One of [`direction`].
    pub direction: u8,
    pub _pad: [u8; 7],
}

/// The syscalls captured, as recorded in [`IoRecord::syscall`].
pub mod syscall {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const READV: u16 = 2;
    pub const WRITEV: u16 = 3;
    pub const RECVFROM: u16 = 4;
    pub const SENDTO: u16 = 5;
    pub const RECVMSG: u16 = 6;
    pub const SENDMSG: u16 = 7;

    /// The syscall's name, for messages.
    pub fn name(id: u16) -> &'static str {
        match id {
            READ => "read",
            WRITE => "write",
            READV => "readv",
            WRITEV => "writev",
            RECVFROM => "recvfrom",
            SENDTO => "sendto",
            RECVMSG => "recvmsg",
            SENDMSG => "sendmsg",
            _ => "unknown",
        }
    }
}

/// Key of the `FD_CLASS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FdKey {
    pub tgid: u32,
    pub fd: u32,
}

/// Value of the `FD_DECISION` map: an [`fd_action`] for one incarnation of an fd.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdDecision {
    pub action: u8,
    pub _pad: [u8; 3],
    pub generation: u32,
}

/// Value of the `FD_CLASS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdState {
    /// One of [`fd_action`].
    pub action: u8,
    pub _pad: [u8; 3],
    /// Which incarnation of the fd number this is (never 0): userspace's decision for a
    /// PENDING fd carries it, so that a decision made after the fd was closed and its number
    /// reused is not applied to the new file or connection.
    pub generation: u32,
    /// Next sequence number per direction (index: [`direction`]).
    pub seq: [u64; 2],
}

/// Runtime configuration written by userspace into the `CONFIG` array (index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Per-syscall payload cap in bytes (at most `CHUNK_SIZE * MAX_CHUNKS`).
    pub cap_bytes: u32,
    /// Ring buffer fill level (bytes) above which a record wakes the reader.
    pub wakeup_watermark: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cap_bytes: DEFAULT_CAP_BYTES,
            wakeup_watermark: 0,
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain repr(C) structs of integers with explicit padding.
    unsafe impl aya::Pod for super::FdKey {}
    unsafe impl aya::Pod for super::FdState {}
    unsafe impl aya::Pod for super::FdDecision {}
    unsafe impl aya::Pod for super::Config {}
}
