//! Socket payload capture on syscall exit tracepoints.
//!
//! One program per captured syscall, at its exit: the return value says how many bytes moved,
//! and the arguments (fd, buffer, length) are loaded from the registers the syscall entered
//! with (the task's `pt_regs`, a BTF pointer the verifier checks each load against). An enter
//! program that kept them per thread until the exit cost the traced thread a second
//! tracepoint and a map write per syscall.
//!
//! For a tracked process, look up the fd's class. An unknown fd produces one NEW_FD record
//! (the map entry is set to PENDING so it is reported once) and userspace classifies it from
//! /proc. A CAPTURE or PENDING fd's bytes are copied, in CHUNK_SIZE records, up to the
//! configured per-syscall cap; userspace drops what it captured from a PENDING fd that it then
//! classifies IGNORE. A PENDING fd that the kernel sees is a regular file or a directory has
//! its reads left out.
use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::bpf_loop,
    },
    macros::{map, tracepoint},
    maps::PerCpuArray,
    programs::TracePointContext,
};
use infertrace_common::{
    CHUNK_SIZE, FdKey, FdState, IoRecord, MAX_CHUNKS, MAX_IOVECS, NewFdRecord, counter, direction,
    fd_action, io_flags, kind, syscall,
};

use crate::{
    shared::{
        FD_CLASS, FD_DECISION, config, count, header, submit, submit_now, submit_with, syscall_arg,
        tracked_process, tracked_tgid, wakeup_flags,
    },
    sse,
};

/// Offset of the first argument in a sys_enter_* record, and of `ret` in sys_exit_*.
const ARG0: usize = 16;
const RET: usize = 16;

/// How the syscall's buffer argument is shaped.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Shape {
    /// (buf, len)
    Flat = 0,
    /// (iovec *, iovcnt)
    Iovec = 1,
    /// (msghdr *)
    Msghdr = 2,
}

/// A captured syscall, as its exit sees it.
#[derive(Clone, Copy)]
struct Call {
    /// Buffer, iovec array or msghdr pointer.
    ptr: u64,
    /// Buffer length or iovec count.
    len: u64,
    fd: u32,
    syscall: u16,
    direction: u8,
    shape: Shape,
}

/// One ring-buffer record under construction: header then payload, contiguous, so that it is
/// sent with a single `bpf_ringbuf_output` of a variable length.
#[repr(C)]
struct Chunk {
    record: IoRecord,
    data: [u8; CHUNK_SIZE],
}

/// Per-CPU state of the payload copy in progress.
#[map]
static COPY: PerCpuArray<CopyState> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU scratch space: a 16 KiB chunk does not fit on the 512-byte BPF stack.
#[map]
static SCRATCH: PerCpuArray<Chunk> = PerCpuArray::with_max_entries(1, 0);

const HEADER_LEN: usize = core::mem::size_of::<IoRecord>();

/// `struct iovec` / the prefix of `struct user_msghdr` we need.
#[repr(C)]
#[derive(Clone, Copy)]
struct Iovec {
    base: u64,
    len: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MsghdrPrefix {
    name: u64,
    namelen: u64,
    iov: u64,
    iovlen: u64,
}

fn on_exit(ctx: &TracePointContext, syscall: u16, direction: u8, shape: Shape) -> u32 {
    let Some((tgid, tid, template)) = tracked_process() else {
        return 0;
    };
    // SAFETY: offset from the sys_exit_* format files.
    let ret: i64 = unsafe { ctx.read_at(RET) }.unwrap_or(0);
    if ret <= 0 {
        return 0;
    }
    let (fd, ptr, len) = (syscall_arg(0), syscall_arg(1), syscall_arg(2));
    if fd > i32::MAX as u64 {
        return 0;
    }
    let call = Call {
        ptr,
        len,
        fd: fd as u32,
        syscall,
        direction,
        shape,
    };
    let key = FdKey { tgid, fd: call.fd };
    // Copy until userspace has decided: the first request on a freshly accepted connection
    // arrives in the very first read, before any classification can happen. A file's reads
    // are the exception (FdState.file).
    let state = match FD_CLASS.get_ptr_mut(&key) {
        Some(state) => state,
        None => {
            report_new_fd(tgid, call.fd, key);
            match FD_CLASS.get_ptr_mut(&key) {
                Some(state) => state,
                None => return 0,
            }
        }
    };
    // SAFETY: pointer into a live map value; its SSE fields belong to the fd's writer thread.
    let state = unsafe { &mut *state };
    let action = apply_decision(state, &key);
    if action == fd_action::IGNORE
        || (action == fd_action::PENDING && state.file != 0 && direction == direction::INGRESS)
    {
        return 0;
    }
    // The sequence counter is bumped atomically because several threads may use one socket.
    // SeqCst, not Relaxed: LLVM's BPF backend emits a non-fetching `lock xadd` for a relaxed
    // add and then "returns" the addend.
    let slot = core::ptr::addr_of_mut!(state.seq[(direction & 1) as usize]);
    // SAFETY: pointer into a live map value.
    let seq = unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::SeqCst }>(
            slot, 1,
        )
    };
    count(counter::CAPTURED_SYSCALLS, 1);
    if direction == direction::INGRESS && tid == tgid {
        crate::poll::arm(tgid);
    }
    if direction == direction::EGRESS {
        // A flat write's payload may be a streamed response's content (see sse.rs).
        let may_elide = shape == Shape::Flat;
        if may_elide && sse::try_elide(&key, state, template, call.ptr, ret as u64, seq) {
            return 0;
        }
        if !may_elide {
            state.sse_matched = 0;
        }
    }
    sse::flush(&key, state, true);
    copy_payload(&call, tgid, ret as u64, seq);
    0
}

/// The fd's action, after taking userspace's decision for a PENDING fd if one is waiting.
/// A decision about an earlier incarnation of the fd number (made after it was closed and
/// the number reused) is dropped, not applied to this one.
pub(crate) fn apply_decision(state: &mut FdState, key: &FdKey) -> u8 {
    if state.action == fd_action::PENDING {
        // SAFETY: the value is copied out immediately.
        if let Some(&decision) = unsafe { FD_DECISION.get(key) } {
            if decision.generation == state.generation {
                state.action = decision.action;
            }
            let _ = FD_DECISION.remove(key);
        }
    }
    state.action
}

/// Mark the fd PENDING (so it is reported once) and tell userspace about it. Returns
/// whether it is a regular file or a directory.
pub(crate) fn report_new_fd(tgid: u32, fd: u32, key: FdKey) -> bool {
    // The clock's low bits tell incarnations of one fd number apart (never 0: the value of
    // records without one).
    // SAFETY: helper without preconditions.
    let generation = (unsafe { bpf_ktime_get_ns() } as u32) | 1;
    let file = is_file(fd);
    let pending = FdState {
        action: fd_action::PENDING,
        file: u8::from(file),
        generation,
        ..FdState::default()
    };
    // BPF_NOEXIST: another thread may have reported it a moment ago.
    if FD_CLASS.insert(&key, &pending, 1).is_err() {
        return file;
    }
    let record = NewFdRecord {
        header: header(kind::NEW_FD, tgid),
        fd,
        generation,
    };
    // A file waits for the next drain (nothing of it is lost meanwhile: its reads are not
    // copied); anything else is looked up at once, before it can close.
    let sent = if file {
        submit(&record)
    } else {
        submit_now(&record)
    };
    if !sent {
        // Let the next syscall on this fd report it again.
        let _ = FD_CLASS.remove(&key);
    }
    file
}

/// `S_IFMT` and the types of `inode.i_mode` that are files (include/uapi/linux/stat.h).
const S_IFMT: u16 = 0o170000;
const S_IFREG: u16 = 0o100000;
const S_IFDIR: u16 = 0o040000;

/// Whether the current task's fd `fd` is a regular file or a directory. False when the
/// offsets are unknown or a read fails (the fd is then copied as any other).
fn is_file(fd: u32) -> bool {
    file_mode(fd).is_some_and(|mode| matches!(mode & S_IFMT, S_IFREG | S_IFDIR))
}

/// The inode mode behind the current task's fd `fd`: task -> files -> fdt -> fd[fd] ->
/// f_inode -> i_mode, at the offsets userspace found in the kernel's BTF.
fn file_mode(fd: u32) -> Option<u16> {
    let at = config().file_offsets;
    if !at.known() {
        return None;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let files: u64 = read_kernel(task + u64::from(at.task_files))?;
    let fdt: u64 = read_kernel(files + u64::from(at.files_fdt))?;
    let max_fds: u32 = read_kernel(fdt + u64::from(at.fdt_max_fds))?;
    if fd >= max_fds {
        return None;
    }
    let table: u64 = read_kernel(fdt + u64::from(at.fdt_fd))?;
    let file: u64 = read_kernel(table + u64::from(fd) * 8)?;
    if file == 0 {
        return None;
    }
    let inode: u64 = read_kernel(file + u64::from(at.file_inode))?;
    read_kernel(inode + u64::from(at.inode_mode))
}

/// A kernel value at `at`.
#[inline(always)]
fn read_kernel<T>(at: u64) -> Option<T> {
    // SAFETY: read by the fault-tolerant helper (fails, never faults).
    unsafe { bpf_probe_read_kernel(at as *const T) }.ok()
}

/// Where the next payload bytes come from while walking a flat buffer or an iovec array.
#[repr(C)]
#[derive(Clone, Copy)]
struct Cursor {
    base: u64,
    left: u64,
    iov: u64,
    iov_index: u64,
    iov_count: u64,
}

impl Cursor {
    fn new(call: &Call) -> Self {
        let (flat, iov, iov_count) = match call.shape {
            Shape::Flat => (true, 0, 0),
            Shape::Iovec => (false, call.ptr, call.len),
            Shape::Msghdr => {
                // SAFETY: user pointer read with the fault-tolerant helper.
                match unsafe { bpf_probe_read_user(call.ptr as *const MsghdrPrefix) } {
                    Ok(m) => (false, m.iov, m.iovlen),
                    Err(_) => (false, 0, 0),
                }
            }
        };
        Cursor {
            base: if flat { call.ptr } else { 0 },
            left: if flat { call.len } else { 0 },
            iov,
            iov_index: 0,
            iov_count: if iov_count > MAX_IOVECS as u64 {
                MAX_IOVECS as u64
            } else {
                iov_count
            },
        }
    }

    /// Move to the next iovec. False when none is left or it cannot be read.
    fn next_iovec(&mut self) -> bool {
        if self.iov_index >= self.iov_count {
            return false;
        }
        let at = self.iov + self.iov_index * core::mem::size_of::<Iovec>() as u64;
        self.iov_index += 1;
        // SAFETY: user pointer read with the fault-tolerant helper.
        match unsafe { bpf_probe_read_user(at as *const Iovec) } {
            Ok(v) => {
                self.base = v.base;
                self.left = v.len;
                true
            }
            Err(_) => false,
        }
    }
}

/// State of one payload copy.
#[repr(C)]
#[derive(Clone, Copy)]
struct CopyState {
    cursor: Cursor,
    copied: u64,
    want: u64,
    watermark: u32,
    /// The ring buffer was full: the rest of the syscall is dropped.
    ring_full: u32,
}

/// Copy the syscall's payload (at most the configured cap) into IO records.
fn copy_payload(call: &Call, tgid: u32, ret: u64, seq: u64) {
    let cfg = config();
    let cap = (cfg.cap_bytes as u64).min(CHUNK_SIZE as u64 * MAX_CHUNKS as u64);
    let want = if ret < cap { ret } else { cap };
    let flags = if ret > cap { io_flags::TRUNCATED } else { 0 };
    let Some(chunk) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU scratch value, used by this program invocation only.
    let chunk = unsafe { &mut *chunk };
    chunk.record = IoRecord {
        header: header(kind::IO, tgid),
        reserved: 0,
        seq,
        ret: ret as i64,
        fd: call.fd,
        offset: 0,
        len: 0,
        syscall: call.syscall,
        flags,
        direction: call.direction,
        _pad: [0; 7],
    };
    // Fast path, the common case: one flat buffer that fits one record.
    if call.shape == Shape::Flat && want <= CHUNK_SIZE as u64 {
        if emit_chunk(chunk, call.ptr, 0, want, true, cfg.wakeup_watermark) && want < ret {
            count(counter::TRUNCATED_SYSCALLS, 1);
            count(counter::TRUNCATED_BYTES, ret - want);
        }
        return;
    }
    let Some(state_ptr) = COPY.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU value, used by this program invocation only.
    unsafe {
        *state_ptr = CopyState {
            cursor: Cursor::new(call),
            copied: 0,
            want,
            watermark: cfg.wakeup_watermark,
            ring_full: 0,
        }
    };
    // One iteration per chunk, plus one per iovec switch, under bpf_loop. The state lives in
    // a map, whose contents the verifier does not track, so the callback's states converge
    // at once instead of being explored iteration after iteration.
    // SAFETY: bpf_loop with a callback of the required signature and no context.
    unsafe {
        bpf_loop(
            MAX_CHUNKS + MAX_IOVECS,
            copy_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    // SAFETY: as above.
    let state = unsafe { *state_ptr };
    if state.ring_full != 0 {
        return;
    }
    if state.copied < ret {
        count(counter::TRUNCATED_SYSCALLS, 1);
        count(counter::TRUNCATED_BYTES, ret - state.copied);
    }
    if state.copied < want {
        // Ran out of iovecs or iterations: close the syscall with an empty LAST record.
        chunk.record.flags |= io_flags::TRUNCATED;
        let _ = emit_chunk(chunk, 0, state.copied, 0, true, cfg.wakeup_watermark);
    }
}

/// One `bpf_loop` iteration: emit the next chunk, or step to the next iovec. 1 stops the loop.
extern "C" fn copy_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(state) = COPY.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU value, used by this program invocation only.
    let state = unsafe { &mut *state };
    if state.copied >= state.want {
        return 1;
    }
    if state.cursor.left == 0 {
        return if state.cursor.next_iovec() { 0 } else { 1 };
    }
    let mut n = state.want - state.copied;
    if n > state.cursor.left {
        n = state.cursor.left;
    }
    if n > CHUNK_SIZE as u64 {
        n = CHUNK_SIZE as u64;
    }
    let Some(chunk) = SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU scratch value, used by this program invocation only.
    let chunk = unsafe { &mut *chunk };
    let last = state.copied + n >= state.want;
    if !emit_chunk(
        chunk,
        state.cursor.base,
        state.copied,
        n,
        last,
        state.watermark,
    ) {
        state.ring_full = 1;
        return 1;
    }
    state.cursor.base += n;
    state.cursor.left -= n;
    state.copied += n;
    0
}

/// Read `n` user bytes at `src` into the scratch chunk and output it. False when the
/// ring buffer is full (the rest of the syscall is dropped: userspace sees no LAST record).
fn emit_chunk(
    chunk: &mut Chunk,
    src: u64,
    offset: u64,
    n: u64,
    last: bool,
    watermark: u32,
) -> bool {
    // Bound for the verifier: n <= CHUNK_SIZE.
    let n = (n as usize) & (2 * CHUNK_SIZE - 1);
    let n = if n > CHUNK_SIZE { CHUNK_SIZE } else { n };
    chunk.record.offset = offset as u32;
    chunk.record.len = n as u32;
    if last {
        chunk.record.flags |= io_flags::LAST;
    }
    if n > 0 {
        let dst = &mut chunk.data[..n];
        // SAFETY: user pointer read with the fault-tolerant helper, into scratch memory.
        if unsafe { aya_ebpf::helpers::bpf_probe_read_user_buf(src as *const u8, dst) }.is_err() {
            count(counter::READ_FAILED, 1);
            chunk.record.len = 0;
            chunk.record.flags |= io_flags::READ_FAILED;
        }
    }
    let total = HEADER_LEN + chunk.record.len as usize;
    let total = if total > HEADER_LEN + CHUNK_SIZE {
        HEADER_LEN + CHUNK_SIZE
    } else {
        total
    };
    // SAFETY: `Chunk` is repr(C) and `total` never exceeds its size.
    let bytes = unsafe { core::slice::from_raw_parts((chunk as *const Chunk).cast::<u8>(), total) };
    submit_with(bytes, wakeup_flags(watermark))
}

/// A tracked process closed an fd: forget its class (the number will be reused) and tell
/// userspace when it was a captured socket, so the flow's decoders are flushed.
#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let Some((tgid, _)) = tracked_tgid() else {
        return 0;
    };
    // SAFETY: offset from the format file.
    let fd: u64 = unsafe { ctx.read_at(ARG0) }.unwrap_or(u64::MAX);
    if fd > i32::MAX as u64 {
        return 0;
    }
    let key = FdKey {
        tgid,
        fd: fd as u32,
    };
    let was_captured = match FD_CLASS.get_ptr_mut(&key) {
        Some(state) => {
            // SAFETY: pointer into a live map value, removed below.
            let state = unsafe { &mut *state };
            // Elided writes go out before the close that ends their stream.
            sse::flush(&key, state, false);
            matches!(
                state.action,
                fd_action::CAPTURE | fd_action::CAPTURE_POLLS | fd_action::PENDING
            )
        }
        None => false,
    };
    if was_captured {
        sse::forget(&key);
    }
    let _ = FD_CLASS.remove(&key);
    let _ = FD_DECISION.remove(&key);
    if was_captured {
        let record = NewFdRecord {
            header: header(kind::CLOSE, tgid),
            fd: fd as u32,
            generation: 0,
        };
        submit(&record);
    }
    0
}

/// One exit program per captured syscall.
macro_rules! capture_syscall {
    ($exit:ident, $id:expr, $dir:expr, $shape:expr) => {
        #[tracepoint]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            on_exit(&ctx, $id, $dir, $shape)
        }
    };
}

capture_syscall!(
    sys_exit_read,
    syscall::READ,
    direction::INGRESS,
    Shape::Flat
);
capture_syscall!(
    sys_exit_write,
    syscall::WRITE,
    direction::EGRESS,
    Shape::Flat
);
capture_syscall!(
    sys_exit_readv,
    syscall::READV,
    direction::INGRESS,
    Shape::Iovec
);
capture_syscall!(
    sys_exit_writev,
    syscall::WRITEV,
    direction::EGRESS,
    Shape::Iovec
);
capture_syscall!(
    sys_exit_recvfrom,
    syscall::RECVFROM,
    direction::INGRESS,
    Shape::Flat
);
capture_syscall!(
    sys_exit_sendto,
    syscall::SENDTO,
    direction::EGRESS,
    Shape::Flat
);
capture_syscall!(
    sys_exit_recvmsg,
    syscall::RECVMSG,
    direction::INGRESS,
    Shape::Msghdr
);
capture_syscall!(
    sys_exit_sendmsg,
    syscall::SENDMSG,
    direction::EGRESS,
    Shape::Msghdr
);
