//! Python stack sampling: a CPU-clock perf event per CPU runs this program at a low rate; when
//! the interrupted thread belongs to a tracked Python process, it walks that thread's CPython
//! frames and sends one compact sample.
//!
//! The interpreter's layout comes from userspace per process (`PY_PROCS`: where `_PyRuntime`
//! is and the offsets of its version). The thread's state is found by walking the interpreter's
//! thread list for the one whose `native_thread_id` is the interrupted thread (CPython 3.10,
//! which has none: whose `thread_id` is the thread's TLS base, read from the current task at
//! the offset userspace found in the kernel's BTF), and cached per thread, checked on every
//! use. Frames are code object addresses, innermost first; a stack is
//! stored once in `PY_STACKS` under a hash of its frames and the sample carries that hash, so
//! a thread that stays in one place costs a 40-byte record per sample. Userspace names the code
//! objects by reading the process's memory once per code object.
use core::ptr::null_mut;

use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_probe_read_kernel, bpf_probe_read_user, bpf_probe_read_user_buf, generated::bpf_loop,
    },
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use infertrace_common::{
    PY_FRAME_READ_MAX, PY_MAX_DEPTH, PY_MAX_THREADS, PY_NO_OFFSET, PyProcess, PySampleRecord,
    PyStack, kind, py_flags,
};

use crate::shared::{TRACKED, header, submit};

/// Python processes to sample, with their interpreter's layout (written by userspace).
#[map]
pub static PY_PROCS: HashMap<u32, PyProcess> = HashMap::with_max_entries(1024, 0);

/// The thread state of each sampled thread (key: thread id), checked on every use.
#[map]
static PY_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// Interned stacks by hash. Userspace reads each once, when a sample first names it, and
/// leaves it here (so that later samples of it cost no syscall) until the map is three
/// quarters full; then it empties the map, and stacks sampled again are interned again.
#[map]
pub static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(4096, 0);

/// The stack being walked (too large for the 512-byte stack).
#[map]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// Insert only when absent.
const BPF_NOEXIST: u64 = 1;

#[inline(always)]
fn read_u64(at: u64) -> Option<u64> {
    // SAFETY: a user address of the sampled process, read by the helper (fails, never faults).
    unsafe { bpf_probe_read_user(at as *const u64) }.ok()
}

/// Bytes of a frame read at once (see `PyOffsets::frame_span`).
const FRAME_READ: usize = PY_FRAME_READ_MAX as usize;

/// The 8 bytes at `offset` (masked into the buffer, as the verifier wants) of a frame's
/// bytes.
#[inline(always)]
fn frame_word(frame: &[u8; FRAME_READ + 8], offset: u32) -> u64 {
    let at = offset as usize & (FRAME_READ - 1);
    // SAFETY: `at + 8` is within the buffer; an unaligned read of plain bytes.
    unsafe { core::ptr::read_unaligned(frame.as_ptr().add(at).cast::<u64>()) }
}

/// The walk in progress on this CPU. It lives in a map, whose contents the verifier does not
/// track, so that the `bpf_loop` callbacks below converge at once instead of being explored
/// iteration by iteration (a plain loop over threads and frames exceeded the verifier's budget).
#[repr(C)]
#[derive(Clone, Copy)]
struct Walk {
    process: PyProcess,
    /// What the thread state's id field holds for the sampled thread (see `python_sample`).
    id: u64,
    /// The thread state or frame to look at next.
    cursor: u64,
    /// The thread state found.
    found: u64,
    /// FNV-1a of the frames so far.
    hash: u64,
    flags: u32,
    /// The sampled thread's kernel id (the cache's key).
    tid: u32,
    /// The bytes of each frame to read (`PyOffsets::frame_span`).
    span: u32,
    _pad: u32,
    /// The frame being looked at: its fields' span, read in one go (a helper call costs
    /// about as much for 70 bytes as for 8, and each frame took three).
    frame: [u8; FRAME_READ + 8],
}

#[map]
static PY_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// One `bpf_loop` step along the interpreter's thread list; 1 stops the loop.
extern "C" fn thread_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = PY_WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU value, used by this program invocation only.
    let w = unsafe { &mut *w };
    if w.cursor == 0 {
        return 1;
    }
    let o = &w.process.offsets;
    if read_u64(w.cursor + u64::from(o.tstate_native_thread_id)) == Some(w.id) {
        w.found = w.cursor;
        return 1;
    }
    match read_u64(w.cursor + u64::from(o.tstate_next)) {
        Some(next) => {
            w.cursor = next;
            0
        }
        None => 1,
    }
}

/// One `bpf_loop` step up the frame chain, into the scratch stack; 1 stops the loop.
extern "C" fn frame_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let (Some(w), Some(stack)) = (PY_WALK.get_ptr_mut(0), PY_SCRATCH.get_ptr_mut(0)) else {
        return 1;
    };
    // SAFETY: per-CPU values, used by this program invocation only.
    let (w, stack) = unsafe { (&mut *w, &mut *stack) };
    if w.cursor == 0 {
        return 1;
    }
    let n = w.span as usize & (2 * FRAME_READ - 1);
    if n == 0 || n > FRAME_READ {
        w.flags |= py_flags::READ_FAILED;
        return 1;
    }
    // SAFETY: a user address of the sampled process, read by the helper (fails, never faults).
    if unsafe { bpf_probe_read_user_buf(w.cursor as *const u8, &mut w.frame[..n]) }.is_err() {
        w.flags |= py_flags::READ_FAILED;
        return 1;
    }
    let o = &w.process.offsets;
    let code = frame_word(&w.frame, o.frame_code);
    let shim = o.owner_cstack != PY_NO_OFFSET
        && u32::from(w.frame[o.frame_owner as usize & (FRAME_READ - 1)]) == o.owner_cstack;
    if !shim {
        let Some(slot) = stack.frames.get_mut(stack.len as usize) else {
            w.flags |= py_flags::TRUNCATED;
            return 1;
        };
        *slot = code;
        stack.len += 1;
        w.hash = (w.hash ^ code).wrapping_mul(0x0000_0100_0000_01b3);
    }
    w.cursor = frame_word(&w.frame, o.frame_previous);
    0
}

/// The thread state whose id field is the walk's thread's, from the cache or the
/// interpreter's thread list.
///
/// The walk state is handled through raw pointers only: `bpf_loop` changes it behind the
/// compiler's back, which a `&mut` borrow held across the call would let it ignore.
///
/// # Safety
/// `w` points to this CPU's `PY_WALK` value.
#[inline(always)]
unsafe fn thread_state(w: *mut Walk) -> Option<u64> {
    // SAFETY (whole function): `w` is valid; no reference to it outlives a statement.
    let (o, id, key, runtime) = unsafe {
        (
            (*w).process.offsets,
            (*w).id,
            (*w).tid,
            (*w).process.runtime,
        )
    };
    // SAFETY: copied out at once.
    if let Some(&cached) = unsafe { PY_THREADS.get(&key) } {
        if read_u64(cached + u64::from(o.tstate_native_thread_id)) == Some(id) {
            return Some(cached);
        }
        let _ = PY_THREADS.remove(&key);
    }
    let interp = read_u64(runtime + u64::from(o.runtime_interpreters_head))?;
    let head = read_u64(interp + u64::from(o.interp_threads_head))?;
    unsafe {
        (*w).cursor = head;
        (*w).found = 0;
        // bpf_loop with a callback of the required signature and no context.
        bpf_loop(PY_MAX_THREADS, thread_step as *mut c_void, null_mut(), 0);
    }
    let found = unsafe { (*w).found };
    if found == 0 {
        return None;
    }
    let _ = PY_THREADS.insert(&key, &found, 0);
    Some(found)
}

/// Walk the frames of `tstate` into the scratch stack.
///
/// # Safety
/// `w` and `stack` point to this CPU's `PY_WALK` and `PY_SCRATCH` values.
#[inline(always)]
unsafe fn walk(w: *mut Walk, tstate: u64, stack: *mut PyStack) {
    // SAFETY (whole function): both pointers are valid; no reference outlives a statement.
    let o = unsafe { (*w).process.offsets };
    unsafe {
        (*stack).len = 0;
        (*w).hash = 0xcbf2_9ce4_8422_2325;
    }
    let Some(mut frame) = read_u64(tstate + u64::from(o.tstate_frame)) else {
        unsafe { (*w).flags |= py_flags::READ_FAILED };
        return;
    };
    if o.cframe_current_frame != PY_NO_OFFSET && frame != 0 {
        match read_u64(frame + u64::from(o.cframe_current_frame)) {
            Some(f) => frame = f,
            None => {
                unsafe { (*w).flags |= py_flags::READ_FAILED };
                return;
            }
        }
    }
    unsafe {
        (*w).cursor = frame;
        // A few steps past the depth, for the shim frames that are skipped. bpf_loop with a
        // callback of the required signature and no context.
        bpf_loop(
            PY_MAX_DEPTH as u32 + 8,
            frame_step as *mut c_void,
            null_mut(),
            0,
        );
    }
}

#[perf_event]
pub fn python_sample(_ctx: PerfEventContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((id >> 32) as u32, id as u32);
    // SAFETY (both lookups): presence checks and a copy.
    if unsafe { TRACKED.get(&tgid) }.is_none() {
        return 0;
    }
    let Some(process) = (unsafe { PY_PROCS.get(&tgid) }).copied() else {
        return 0;
    };
    let mut record = PySampleRecord {
        header: header(kind::PY_SAMPLE, tgid),
        stack_id: 0,
        depth: 0,
        flags: 0,
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    let (Some(w), Some(stack)) = (PY_WALK.get_ptr_mut(0), PY_SCRATCH.get_ptr_mut(0)) else {
        return 0;
    };
    // SAFETY (all below): per-CPU values, no other user while this program runs on this CPU,
    // accessed through raw pointers only (see `thread_state`).
    // What the thread state's id field holds for this thread.
    let key = if process.fsbase_offset == 0 {
        Some(u64::from(tid))
    } else {
        let task = unsafe { bpf_get_current_task() };
        // SAFETY: a field of the current task, at the offset the kernel's BTF gives; read by
        // the helper (fails, never faults).
        unsafe { bpf_probe_read_kernel((task + u64::from(process.fsbase_offset)) as *const u64) }
            .ok()
    };
    let Some(key) = key else {
        record.flags = py_flags::NO_THREAD_STATE | py_flags::READ_FAILED;
        submit(&record);
        return 0;
    };
    unsafe {
        (*w).process = process;
        (*w).id = key;
        (*w).tid = tid;
        (*w).flags = 0;
        // A layout past the read's limit reads no frame (the agent never sends one).
        (*w).span = process.offsets.frame_span().unwrap_or(0);
    }
    match unsafe { thread_state(w) } {
        None => record.flags = py_flags::NO_THREAD_STATE,
        Some(tstate) => {
            unsafe { walk(w, tstate, stack) };
            let (flags, len, hash) = unsafe { ((*w).flags, (*stack).len, (*w).hash) };
            record.flags = flags;
            record.depth = len;
            if len > 0 {
                // Never 0: 0 means "no stack".
                record.stack_id = hash | 1 << 63;
                // An existing entry is the same stack: keep it.
                let _ = PY_STACKS.insert(&record.stack_id, unsafe { &*stack }, BPF_NOEXIST);
            }
        }
    }
    submit(&record);
    0
}
