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
    /// One thread's CUDA driver calls up to and including the synchronisation that ended
    /// them, aggregated in the kernel ([`CudaStepRecord`]).
    pub const CUDA_STEP: u32 = 8;
    /// One probed CUDA driver call, when aggregation is off ([`CudaCallRecord`]).
    pub const CUDA_CALL: u32 = 9;
    /// A driver lookup that gave a function or kernel handle its name ([`CudaNameRecord`]).
    pub const CUDA_NAME: u32 = 10;
    /// A CPU-clock sample of a tracked thread of a Python process ([`PySampleRecord`]).
    pub const PY_SAMPLE: u32 = 11;
    /// An application thread handed a whole message to libzmq ([`ZmqSendRecord`]).
    pub const ZMQ_SEND: u32 = 12;
    /// A tracked process polled a captured eventfd (a libzmq mailbox) ([`MailboxPollRecord`]).
    pub const MAILBOX_POLL: u32 = 13;
    /// An application thread began serializing a message with CPython's `pickle.dumps`
    /// (header only; `header.ts_ns` is the call's entry).
    pub const PICKLE_DUMPS: u32 = 14;
    /// A process that is not tracked called execve, while `Config::announce_execs` is set
    /// ([`ProcRecord`]): the node agent decides whether it starts an engine.
    pub const SPAWN: u32 = 15;
}

/// The probed CUDA driver entry points (every `_v2`/`_ptsz` variant maps to its base), as
/// passed to the uprobes in their attach cookie.
pub mod cuda_fn {
    pub const LAUNCH_KERNEL: u32 = 1;
    pub const LAUNCH_KERNEL_EX: u32 = 2;
    pub const GRAPH_LAUNCH: u32 = 3;
    pub const STREAM_SYNCHRONIZE: u32 = 4;
    pub const EVENT_SYNCHRONIZE: u32 = 5;
    pub const EVENT_RECORD: u32 = 6;
    pub const MEMCPY_DTOH_ASYNC: u32 = 7;
    pub const MEMCPY_ASYNC: u32 = 8;
    pub const MODULE_GET_FUNCTION: u32 = 9;
    pub const LIBRARY_GET_KERNEL: u32 = 10;
    pub const KERNEL_GET_FUNCTION: u32 = 11;
    pub const FUNC_GET_NAME: u32 = 12;
    pub const CTX_SYNCHRONIZE: u32 = 13;
    /// Not a driver call: the thread exited with calls no synchronisation had ended.
    pub const THREAD_EXIT: u32 = 255;

    /// The base name of a driver entry point.
    pub fn name(id: u32) -> &'static str {
        match id {
            LAUNCH_KERNEL => "cuLaunchKernel",
            LAUNCH_KERNEL_EX => "cuLaunchKernelEx",
            GRAPH_LAUNCH => "cuGraphLaunch",
            STREAM_SYNCHRONIZE => "cuStreamSynchronize",
            EVENT_SYNCHRONIZE => "cuEventSynchronize",
            EVENT_RECORD => "cuEventRecord",
            MEMCPY_DTOH_ASYNC => "cuMemcpyDtoHAsync",
            MEMCPY_ASYNC => "cuMemcpyAsync",
            MODULE_GET_FUNCTION => "cuModuleGetFunction",
            LIBRARY_GET_KERNEL => "cuLibraryGetKernel",
            KERNEL_GET_FUNCTION => "cuKernelGetFunction",
            FUNC_GET_NAME => "cuFuncGetName",
            CTX_SYNCHRONIZE => "cuCtxSynchronize",
            THREAD_EXIT => "thread exit",
            _ => "unknown",
        }
    }

    /// The id of a probed function's base name.
    pub fn id(name: &str) -> Option<u32> {
        (LAUNCH_KERNEL..=CTX_SYNCHRONIZE).find(|&id| self::name(id) == name)
    }

    /// Whether the function ends a step (the host waits for the GPU there).
    pub fn is_sync(id: u32) -> bool {
        matches!(id, STREAM_SYNCHRONIZE | EVENT_SYNCHRONIZE | CTX_SYNCHRONIZE)
    }

    /// Whether the probe also needs the function's return (to time a wait or read an output).
    pub fn needs_return(id: u32) -> bool {
        is_sync(id)
            || matches!(
                id,
                MODULE_GET_FUNCTION | LIBRARY_GET_KERNEL | KERNEL_GET_FUNCTION | FUNC_GET_NAME
            )
    }
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
    /// Copy its payloads and report its polls: a libzmq mailbox of a loop the agent follows
    /// iteration by iteration (an SGLang scheduler's).
    pub const CAPTURE_POLLS: u8 = 3;
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
    /// Reads of a driver call's output (handle or name) that failed: the name is not known.
    pub const CUDA_READ_FAILED: u32 = 6;
    /// Number of counters.
    pub const COUNT: u32 = 7;
}

/// The value of the per-CPU `COUNTERS` map's only entry: every counter, indexed by
/// [`counter`], so that userspace reads them all with one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub values: [u64; counter::COUNT as usize],
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
    /// Non-zero: the fd is a regular file or a directory (seen by the kernel when it
    /// reported the fd). Its reads are not copied while userspace decides: no decoder reads
    /// files, and a process loading a model or its modules reads gigabytes of them.
    pub file: u8,
    pub _pad: [u8; 2],
    /// Which incarnation of the fd number this is (never 0): userspace's decision for a
    /// PENDING fd carries it, so that a decision made after the fd was closed and its number
    /// reused is not applied to the new file or connection.
    pub generation: u32,
    /// Next sequence number per direction (index: [`direction`]).
    pub seq: [u64; 2],
}

/// Distinct kernels a [`CudaStepRecord`] counts one by one; launches of further kernels in
/// the same step are counted together in `other_launches`.
pub const CUDA_STEP_KERNELS: usize = 16;
/// Bytes of a kernel name a [`CudaNameRecord`] carries (longer names are cut, and say so).
pub const CUDA_NAME_BYTES: usize = 128;

/// Launches of one function handle within a step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLaunches {
    /// The `CUfunction` (or `CUkernel`) handle launched; 0 marks an unused slot.
    pub function: u64,
    pub launches: u32,
    pub _pad: u32,
}

/// CUDA_STEP: what one thread asked of the driver since its previous synchronisation, and the
/// synchronisation that ended it. `header.ts_ns` is when that synchronisation returned.
/// All times are CPU-side: when the thread called the driver, never when the GPU ran.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaStepRecord {
    pub header: RecordHeader,
    /// When the ending synchronisation was called (0 for a thread that exited).
    pub sync_enter_ns: u64,
    /// First and last kernel or graph launch of the step (0 when there was none).
    pub first_launch_ns: u64,
    pub last_launch_ns: u64,
    /// Bytes asked for by the step's asynchronous copies.
    pub copy_bytes: u64,
    /// cuLaunchKernel / cuLaunchKernelEx calls.
    pub launches: u32,
    /// cuGraphLaunch calls.
    pub graph_launches: u32,
    /// cuMemcpyDtoHAsync / cuMemcpyAsync calls.
    pub copies: u32,
    /// cuEventRecord calls.
    pub event_records: u32,
    /// The [`cuda_fn`] that ended the step.
    pub sync_function: u32,
    /// The synchronisation's CUresult.
    pub sync_result: i32,
    /// Launches of kernels beyond the first [`CUDA_STEP_KERNELS`] distinct ones.
    pub other_launches: u32,
    pub _pad: u32,
    /// Launches per kernel, in order of first launch.
    pub kernels: [KernelLaunches; CUDA_STEP_KERNELS],
}

/// CUDA_CALL (aggregation off): one probed driver call. `header.ts_ns` is its entry, or for a
/// synchronisation its return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCallRecord {
    pub header: RecordHeader,
    /// A synchronisation's entry time (else equal to `header.ts_ns`).
    pub enter_ns: u64,
    /// The function (launch), graph (graph launch), event or stream handle (for
    /// cuCtxSynchronize, which takes no argument, whatever its first register held).
    pub handle: u64,
    /// A copy's byte count.
    pub bytes: u64,
    /// One of [`cuda_fn`].
    pub function: u32,
    /// A synchronisation's CUresult (0 for the others).
    pub result: i32,
}

/// CUDA_NAME: a lookup's result. For cuKernelGetFunction, `handle` is the function and
/// `kernel` the kernel it came from (no name: it names whatever the kernel was named).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaNameRecord {
    pub header: RecordHeader,
    pub handle: u64,
    pub kernel: u64,
    /// One of [`cuda_fn`] (a lookup).
    pub function: u32,
    /// Bytes of `name` read, without the terminating NUL.
    pub len: u32,
    pub name: [u8; CUDA_NAME_BYTES],
}

impl Default for CudaNameRecord {
    fn default() -> Self {
        Self {
            header: RecordHeader::default(),
            handle: 0,
            kernel: 0,
            function: 0,
            len: 0,
            name: [0; CUDA_NAME_BYTES],
        }
    }
}

/// Frames a Python stack sample holds (deeper stacks keep their innermost frames and say
/// they were cut).
pub const PY_MAX_DEPTH: usize = 128;
/// Python thread states walked to find the sampled thread's.
pub const PY_MAX_THREADS: u32 = 64;
/// An offset that does not apply to an interpreter version.
pub const PY_NO_OFFSET: u32 = u32::MAX;

/// Where the sampler finds a thread's frames in one CPython version (byte offsets, from the
/// version's headers or its `_Py_DebugOffsets`; see the agent's discover/python.rs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyOffsets {
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters_head: u32,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads_head: u32,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// `PyThreadState.native_thread_id` (the kernel's thread id), or 3.10's `thread_id` (the
    /// TLS base: see [`PyProcess::fsbase_offset`]).
    pub tstate_native_thread_id: u32,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`, or [`PY_NO_OFFSET`] when `tstate_frame` is the frame.
    pub cframe_current_frame: u32,
    /// `_PyInterpreterFrame.f_code` (3.11, 3.12) or `.f_executable` (3.13).
    pub frame_code: u32,
    /// `_PyInterpreterFrame.previous`.
    pub frame_previous: u32,
    /// `_PyInterpreterFrame.owner` (one byte).
    pub frame_owner: u32,
    /// The `owner` value of the interpreter's C-stack shim frames (skipped), or
    /// [`PY_NO_OFFSET`].
    pub owner_cstack: u32,
}

/// Value of the `PY_PROCS` map: a Python process the sampler walks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    pub offsets: PyOffsets,
    /// 0: a thread state's `tstate_native_thread_id` field holds the kernel's thread id
    /// (3.11+). Else the offset of `thread.fsbase` in the kernel's `task_struct`: the field
    /// holds the thread's TLS base (3.10's `thread_id`, `pthread_self()`), which the sampler
    /// reads from the current task there.
    pub fsbase_offset: u32,
}

/// An interned stack: code object addresses, innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyStack {
    pub len: u32,
    pub _pad: u32,
    pub frames: [u64; PY_MAX_DEPTH],
}

impl Default for PyStack {
    fn default() -> Self {
        Self {
            len: 0,
            _pad: 0,
            frames: [0; PY_MAX_DEPTH],
        }
    }
}

/// ZMQ_SEND: `zmq_msg_send` returned success for a message's last part (no `ZMQ_SNDMORE`) in
/// a traced process: the message is libzmq's from then on, its I/O thread writes it to the
/// socket when it gets to it. `header.ts_ns` is the return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZmqSendRecord {
    pub header: RecordHeader,
    /// libzmq's socket object (the `void *socket` argument): which socket sent.
    pub socket: u64,
    /// When the call began (CLOCK_MONOTONIC).
    pub enter_ns: u64,
    /// What the call returned: the size of the part, the message's last frame on the wire.
    pub size: u32,
    pub _pad: u32,
}

/// MAILBOX_POLL: a `poll` of at most [`MAILBOX_POLL_MAX_FDS`] fds by a tracked process's main
/// thread whose first is a captured eventfd: libzmq checks a socket's mailbox this way each time a
/// non-blocking receive finds no message, so an SGLang scheduler's loop polls its sockets'
/// mailboxes once per iteration (and both at once, with a timeout, when it sleeps idle).
/// `header.ts_ns` is the syscall's exit time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MailboxPollRecord {
    pub header: RecordHeader,
    /// Syscall entry time (CLOCK_MONOTONIC).
    pub enter_ns: u64,
    /// Syscall return value: ready fds, or a negative errno.
    pub ret: i64,
    /// The first polled fd.
    pub fd: u32,
    /// How many fds were polled.
    pub nfds: u32,
    /// The timeout argument, in milliseconds (-1: none).
    pub timeout_ms: i32,
    /// The second polled fd when two were, else -1.
    pub second_fd: i32,
}

/// Polls of more fds than this are no mailbox check (libzmq polls one; SGLang's idle sleep
/// two).
pub const MAILBOX_POLL_MAX_FDS: u64 = 2;

/// `ZMQ_SNDMORE` (zmq.h): more parts of the message follow.
pub const ZMQ_SNDMORE: u32 = 2;

/// Flags of a [`PySampleRecord`].
pub mod py_flags {
    /// The thread has no Python thread state (a native thread: libzmq's, a pool's).
    pub const NO_THREAD_STATE: u32 = 1;
    /// The stack was deeper than `PY_MAX_DEPTH`: the outermost frames are missing.
    pub const TRUNCATED: u32 = 2;
    /// Reading the interpreter's memory failed part way: the stack is what was read before.
    pub const READ_FAILED: u32 = 4;
}

/// PY_SAMPLE: a tracked Python process's thread was on a CPU when the sampling clock fired.
/// `stack_id` keys the `PY_STACKS` map (0: no stack, see `flags`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PySampleRecord {
    pub header: RecordHeader,
    pub stack_id: u64,
    pub depth: u32,
    /// [`py_flags`].
    pub flags: u32,
    /// The thread's name (`comm`).
    pub comm: [u8; 16],
}

/// Runtime configuration written by userspace into the `CONFIG` array (index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Per-syscall payload cap in bytes (at most `CHUNK_SIZE * MAX_CHUNKS`).
    pub cap_bytes: u32,
    /// Ring buffer fill level (bytes) above which a record wakes the reader.
    pub wakeup_watermark: u32,
    /// Non-zero: one CUDA_CALL record per probed driver call instead of one CUDA_STEP per
    /// synchronisation (for checking the aggregation, and for measuring what it saves).
    pub cuda_every_call: u32,
    /// Non-zero: every execve on the host is reported (`kind::SPAWN` for untracked
    /// processes), so that the node agent sees each engine as it starts.
    pub announce_execs: u32,
    /// Where the kernel keeps an fd's file type, from its BTF (all 0: unknown, every
    /// pending fd is copied).
    pub file_offsets: FileOffsets,
}

/// Offsets of the fields between a task and the mode of the inode behind one of its fds:
/// `task_struct.files`, `files_struct.fdt`, `fdtable.max_fds`, `fdtable.fd`,
/// `file.f_inode`, `inode.i_mode`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOffsets {
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_inode: u32,
    pub inode_mode: u32,
}

impl FileOffsets {
    /// The offsets were found (`max_fds` and `i_mode` are their structs' first members, at
    /// 0; the others never are).
    pub fn known(&self) -> bool {
        self.task_files != 0 && self.files_fdt != 0 && self.fdt_fd != 0 && self.file_inode != 0
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cap_bytes: DEFAULT_CAP_BYTES,
            wakeup_watermark: 0,
            cuda_every_call: 0,
            announce_execs: 0,
            file_offsets: FileOffsets::default(),
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain repr(C) structs of integers with explicit padding.
    unsafe impl aya::Pod for super::Counters {}
    unsafe impl aya::Pod for super::FdKey {}
    unsafe impl aya::Pod for super::FdState {}
    unsafe impl aya::Pod for super::FdDecision {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::PyProcess {}
    unsafe impl aya::Pod for super::PyStack {}
}
