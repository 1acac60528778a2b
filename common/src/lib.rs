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
    /// Writes of streamed content that the kernel matched against their response's
    /// [`SseTemplate`] and did not copy: their times and sizes ([`SseBatchRecord`]).
    pub const SSE_BATCH: u32 = 16;
    /// A tracked process mapped part of a file executable: a library being loaded (header
    /// only). The agent looks for the libraries it probes then.
    pub const LIBRARY_MAPPED: u32 = 17;
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
    /// Writes matched against their response's [`SseTemplate`](super::SseTemplate) and
    /// reported by time and size only.
    pub const SSE_ELIDED: u32 = 7;
    /// Number of counters.
    pub const COUNT: u32 = 8;
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
    /// When the loop iteration this wait ends began (the thread's previous wait returned),
    /// when that iteration ran longer than [`LONG_ITERATION_NS`]; else 0. Recordings made
    /// before it have records without this field (read as 0).
    pub iteration_start_ns: u64,
}

/// An event-loop iteration this long (no epoll wait on the loop's thread in between) is
/// reported whatever the thread did in it: the loop was held (a garbage collection pass, a
/// CPU-bound callback), and messages that reached the process meanwhile waited for it.
pub const LONG_ITERATION_NS: u64 = 50_000_000;

/// Header of an IO record; `len` payload bytes follow it in the same record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoRecord {
    /// `header.ts_ns` is the syscall's exit time.
    pub header: RecordHeader,
    /// Always 0: it was the syscall's entry time, which nothing read, and the capture now
    /// runs at the exit only. Kept so that recordings keep their layout.
    pub reserved: u64,
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
    /// Non-zero: the fd has elided writes in `SSE_BATCHES` not yet sent (the kernel sends
    /// them before any other record of the fd, so that userspace sees its syscalls in order).
    pub sse_pending: u8,
    /// Non-zero: the fd's last write matched its process's `SseTemplate` (the next one that
    /// does may be elided: a response's first content write is copied, it names the response).
    pub sse_matched: u8,
    /// Which incarnation of the fd number this is (never 0): userspace's decision for a
    /// PENDING fd carries it, so that a decision made after the fd was closed and its number
    /// reused is not applied to the new file or connection.
    pub generation: u32,
    /// Next sequence number per direction (index: [`direction`]).
    pub seq: [u64; 2],
}

/// Most bytes before a response's id in an [`SseTemplate`] (`data: {"id":"`).
pub const SSE_LEAD_MAX: usize = 32;
/// Longest response id of a matched write.
pub const SSE_ID_MAX: usize = 96;
/// Most prefix bytes (from the id's closing quote to the content) of an [`SseTemplate`].
pub const SSE_PREFIX_MAX: usize = 384;
/// Most suffix bytes of an [`SseTemplate`].
pub const SSE_SUFFIX_MAX: usize = 192;
/// Longest write matched against a template.
pub const SSE_WRITE_MAX: usize = 1024;
/// Longest content (the bytes between prefix and suffix: a JSON string's text) of a matched
/// write.
pub const SSE_CONTENT_MAX: usize = 128;
/// Elided writes per [`SseBatchRecord`].
pub const SSE_BATCH_LEN: usize = 32;
/// Slots of `SSE_TEMPLATES`: processes with a stream template at once (a node's API servers).
pub const SSE_TEMPLATE_SLOTS: u32 = 1024;

/// What the writes of streamed content of a server's responses look like, for the kernel to
/// recognise the writes that carry nothing but a piece of generated text (a slot of
/// `SSE_TEMPLATES`, per process, set by userspace from a write it decoded). A write matches
/// when it is exactly one HTTP chunk (`size CRLF data CRLF`) whose data is: the lead, a
/// response id (1 to [`SSE_ID_MAX`] bytes, no `"` or `\`), the prefix (which starts with the
/// id's closing quote; its wildcard bytes, a creation time's digits, match any byte), the
/// content (0 to [`SSE_CONTENT_MAX`] bytes of a JSON string, where every `"` is escaped: no
/// field of the JSON can hide there), and the suffix, which ends with the chunk's closing
/// CRLF.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SseTemplate {
    /// The lead in native-endian 8-byte words, the last partial one zero-padded.
    pub lead: [u64; SSE_LEAD_MAX / 8],
    /// The prefix in words, wildcard bytes zeroed; the last partial word zero-padded.
    pub prefix: [u64; SSE_PREFIX_MAX / 8],
    /// 0xff for each byte of `prefix` compared, 0 for a wildcard or padding byte.
    pub prefix_mask: [u64; SSE_PREFIX_MAX / 8],
    pub suffix: [u64; SSE_SUFFIX_MAX / 8],
    /// The last 8 bytes of each part (each is at least 8 bytes long), so that a partial last
    /// word is compared as a whole word ending where the part ends.
    pub lead_tail: u64,
    pub prefix_tail: u64,
    pub prefix_tail_mask: u64,
    pub suffix_tail: u64,
    pub lead_len: u32,
    pub prefix_len: u32,
    pub suffix_len: u32,
    pub _pad: u32,
}

impl SseTemplate {
    /// The template of these parts, the prefix's bytes in `wildcards` (ranges of indices)
    /// matching anything; None when a part is shorter than 8 bytes or longer than its
    /// maximum.
    pub fn new(
        lead: &[u8],
        prefix: &[u8],
        wildcards: &[core::ops::Range<usize>],
        suffix: &[u8],
    ) -> Option<Self> {
        let fits = |part: &[u8], max: usize| (8..=max).contains(&part.len());
        if !fits(lead, SSE_LEAD_MAX)
            || !fits(prefix, SSE_PREFIX_MAX)
            || !fits(suffix, SSE_SUFFIX_MAX)
        {
            return None;
        }
        let mut mask = [0u8; SSE_PREFIX_MAX];
        mask[..prefix.len()].fill(0xff);
        for range in wildcards {
            if let Some(bytes) = mask.get_mut(range.clone()) {
                bytes.fill(0);
            }
        }
        let mask = &mask[..prefix.len()];
        let mut masked = [0u8; SSE_PREFIX_MAX];
        for (i, (&byte, &keep)) in prefix.iter().zip(mask).enumerate() {
            masked[i] = byte & keep;
        }
        let masked = &masked[..prefix.len()];
        let mut template = SseTemplate {
            lead: [0; SSE_LEAD_MAX / 8],
            prefix: [0; SSE_PREFIX_MAX / 8],
            prefix_mask: [0; SSE_PREFIX_MAX / 8],
            suffix: [0; SSE_SUFFIX_MAX / 8],
            lead_tail: tail_word(lead),
            prefix_tail: tail_word(masked),
            prefix_tail_mask: tail_word(mask),
            suffix_tail: tail_word(suffix),
            lead_len: lead.len() as u32,
            prefix_len: prefix.len() as u32,
            suffix_len: suffix.len() as u32,
            _pad: 0,
        };
        fill_words(&mut template.lead, lead);
        fill_words(&mut template.prefix, masked);
        fill_words(&mut template.prefix_mask, mask);
        fill_words(&mut template.suffix, suffix);
        Some(template)
    }
}

/// A write being matched against a template, with room for the masked 8-byte reads.
pub type SseWriteBuf = [u8; 2 * SSE_WRITE_MAX + 8];

/// Index mask of an [`SseWriteBuf`]: any masked index leaves room for an 8-byte read (the
/// verifier checks every read against the buffer's bounds).
const SSE_INDEX_MASK: usize = 2 * SSE_WRITE_MAX - 1;

impl SseTemplate {
    /// The length of the content, when the first `n` bytes of `buf` are one HTTP chunk that
    /// this template describes.
    pub fn matches(&self, buf: &SseWriteBuf, n: usize) -> Option<usize> {
        self.id_end(buf, n)
            .and_then(|at| self.matches_after_id(buf, n, at))
    }

    /// Where the response id of the chunk in the first `n` bytes of `buf` ends (its closing
    /// quote), when the chunk's framing and lead are this template's. The kernel runs this
    /// and [`Self::matches_after_id`] on each candidate write, passing the index between them
    /// through memory: each id length would otherwise be a path of its own for the verifier.
    #[inline(always)]
    pub fn id_end(&self, buf: &SseWriteBuf, n: usize) -> Option<usize> {
        let start = chunk_data(buf, n)?;
        let lead = self.lead_len as usize;
        if !(8..=SSE_LEAD_MAX).contains(&lead)
            || start + lead >= n
            || !words_match(buf, start, lead, &self.lead, None, self.lead_tail, u64::MAX)
        {
            return None;
        }
        let id = start + lead;
        for k in 0..SSE_ID_MAX {
            match buf[(id + k) & SSE_INDEX_MASK] {
                b'"' if k > 0 => return Some(id + k),
                b'"' | b'\\' => return None,
                _ => {}
            }
        }
        None
    }

    /// The length of the content, when the bytes of the chunk in the first `n` bytes of `buf`
    /// from `at` (the end of its id, see [`Self::id_end`]) are the prefix, content and suffix
    /// of this template.
    #[inline(always)]
    pub fn matches_after_id(&self, buf: &SseWriteBuf, n: usize, at: usize) -> Option<usize> {
        let prefix = self.prefix_len as usize;
        let suffix = self.suffix_len as usize;
        if n > SSE_WRITE_MAX
            || at > SSE_WRITE_MAX
            || !(8..=SSE_PREFIX_MAX).contains(&prefix)
            || !(8..=SSE_SUFFIX_MAX).contains(&suffix)
            || at + prefix + suffix > n
            || n - at - prefix - suffix > SSE_CONTENT_MAX
        {
            return None;
        }
        let prefix_mask = Some(&self.prefix_mask);
        let (tail, tail_mask) = (self.prefix_tail, self.prefix_tail_mask);
        if !words_match(buf, at, prefix, &self.prefix, prefix_mask, tail, tail_mask)
            || !words_match(
                buf,
                n - suffix,
                suffix,
                &self.suffix,
                None,
                self.suffix_tail,
                u64::MAX,
            )
        {
            return None;
        }
        // The content is one JSON string's text: a quote that no backslash escapes would end
        // it there.
        let content = at + prefix..n - suffix;
        let mut escaped = false;
        for k in 0..SSE_CONTENT_MAX {
            let at = content.start + k;
            if at >= content.end {
                break;
            }
            match buf[at & SSE_INDEX_MASK] {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => return None,
                _ => {}
            }
        }
        (!escaped).then_some(content.len())
    }
}

/// Where the data of the HTTP chunk in the first `n` bytes of `buf` starts, when those bytes
/// are exactly one chunk: hex size, CRLF, data, CRLF (uvicorn writes no extensions).
#[inline(always)]
fn chunk_data(buf: &SseWriteBuf, n: usize) -> Option<usize> {
    let mut size = 0usize;
    let mut head = 0usize;
    for (i, &b) in buf.iter().take(6).enumerate() {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            b'\r' if i > 0 => {
                head = i;
                break;
            }
            _ => return None,
        };
        size = size * 16 + digit as usize;
    }
    let framed = head > 0
        && buf[(head + 1) & SSE_INDEX_MASK] == b'\n'
        && n <= SSE_WRITE_MAX
        && head + 2 + size + 2 == n;
    framed.then_some(head + 2)
}

/// Whether the `len` bytes of `buf` at `at` are `words` (masked by `mask`), the last 8 of them
/// `tail` (masked by `tail_mask`). `len` is 8 to `8 * words.len()`.
#[inline(always)]
fn words_match<const N: usize>(
    buf: &SseWriteBuf,
    at: usize,
    len: usize,
    words: &[u64; N],
    mask: Option<&[u64; N]>,
    tail: u64,
    tail_mask: u64,
) -> bool {
    for j in 0..N {
        if (j + 1) * 8 > len {
            break;
        }
        let keep = mask.map_or(u64::MAX, |mask| mask[j]);
        if word(buf, at + j * 8) & keep != words[j] {
            return false;
        }
    }
    word(buf, at + len - 8) & tail_mask == tail
}

/// The native-endian word at `at` (masked) of a write buffer.
#[inline(always)]
fn word(buf: &SseWriteBuf, at: usize) -> u64 {
    let at = at & SSE_INDEX_MASK;
    // SAFETY: at <= SSE_INDEX_MASK, so at + 8 <= the buffer's length; the read is unaligned.
    unsafe { core::ptr::read_unaligned(buf.as_ptr().add(at).cast::<u64>()) }
}

/// The last 8 bytes of `bytes` (at least 8 long) as a native-endian word.
fn tail_word(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[bytes.len() - 8..]);
    u64::from_ne_bytes(word)
}

/// `bytes` as native-endian words, the last one zero-padded.
fn fill_words(words: &mut [u64], bytes: &[u8]) {
    for (word, part) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut raw = [0u8; 8];
        raw[..part.len()].copy_from_slice(part);
        *word = u64::from_ne_bytes(raw);
    }
}

/// One write the kernel did not copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ElidedWrite {
    /// The write's sequence number ([`IoRecord::seq`]).
    pub seq: u64,
    /// Its exit time (as [`IoRecord`]'s `header.ts_ns`).
    pub ts_ns: u64,
    /// Bytes written.
    pub len: u32,
    /// Bytes of its content (the generated text as JSON string text; 0: none).
    pub content: u32,
}

/// SSE_BATCH: elided writes of one fd, in order; only the first `count` entries are sent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SseBatchRecord {
    pub header: RecordHeader,
    pub fd: u32,
    pub count: u32,
    pub entries: [ElidedWrite; SSE_BATCH_LEN],
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
/// Most bytes of a frame the sampler reads: the span of the fields it needs, in one read per
/// frame (see [`PyOffsets::frame_span`]).
pub const PY_FRAME_READ_MAX: u32 = 128;

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

impl PyOffsets {
    /// The bytes from a frame's start that hold every field the sampler reads of it (code,
    /// previous, and owner where it is compared), all within the frame's own object: one read
    /// of them costs what one field's read did. None past [`PY_FRAME_READ_MAX`].
    #[inline(always)]
    pub fn frame_span(&self) -> Option<u32> {
        let mut span = self.frame_code.max(self.frame_previous).checked_add(8)?;
        if self.owner_cstack != PY_NO_OFFSET {
            span = span.max(self.frame_owner.checked_add(1)?);
        }
        (span <= PY_FRAME_READ_MAX).then_some(span)
    }
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
    unsafe impl aya::Pod for super::SseTemplate {}
}
