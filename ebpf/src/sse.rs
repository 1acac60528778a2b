//! Streamed content writes reported by time and size only.
//!
//! An engine's API server streams a completion as one HTTP chunk per token or few tokens, each
//! one SSE event (`data: {...}`) that differs from the previous one in its content only. Of
//! those writes the agent needs when each happened (time to first token, inter-token times,
//! tokens streamed), not their bytes, unless it is to export the text. Once userspace has
//! decoded one such write of a server it puts the server's template in a slot of
//! `SSE_TEMPLATES` (`infertrace_common::SseTemplate`: the bytes around the content, a
//! response's id and creation time left open) and the slot in the process's `TRACKED` entry.
//! A later write of that process that matches it is not copied:
//! its sequence number, time and size go into the fd's batch in `SSE_BATCHES`, sent as one
//! SSE_BATCH record when full, and before any other record of the fd (so userspace still sees
//! the fd's syscalls in order) or its close. Every other write,
//! such as the one that carries a finish reason or usage, is copied whole as before.
//!
//! A response's writes come from one thread (the server's event loop), which is what makes
//! the batch entry its own while it is filled.
use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user_buf},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use infertrace_common::{
    ElidedWrite, FdKey, FdState, SSE_BATCH_LEN, SSE_TEMPLATE_SLOTS, SSE_WRITE_MAX, SseBatchRecord,
    SseTemplate, SseWriteBuf, counter, kind,
};

use crate::shared::{config, count, header, submit_with, wakeup_flags};

/// Userspace's templates, each process's at the slot its `TRACKED` value names. A slot is
/// written before a process is pointed at it, and written again only once userspace has used
/// every other free slot since (`agent/src/capture/template_slots.rs`): long after any program
/// run that read it has ended.
#[map]
static SSE_TEMPLATES: Array<SseTemplate> = Array::with_max_entries(SSE_TEMPLATE_SLOTS, 0);

/// Elided writes not yet sent, per fd; an entry lives while its stream has some.
#[map]
static SSE_BATCHES: HashMap<FdKey, SseBatchRecord> = HashMap::with_max_entries(2048, 0);

/// A zeroed batch to create an entry from (too large for the BPF stack).
#[map]
static SSE_BLANK: PerCpuArray<SseBatchRecord> = PerCpuArray::with_max_entries(1, 0);

/// The write being matched.
#[map]
static WRITE_BUF: PerCpuArray<SseWriteBuf> = PerCpuArray::with_max_entries(1, 0);

/// One value passed through memory (see `SseTemplate::id_end`).
#[map]
static PASS: PerCpuArray<usize> = PerCpuArray::with_max_entries(1, 0);

/// `value`, as the verifier sees a number read from a map: any number. Code after it is
/// verified once, not once per value a loop before it can end with.
#[inline(always)]
fn forget_value(value: usize) -> usize {
    match PASS.get_ptr_mut(0) {
        // SAFETY: per-CPU value, used by this program invocation only.
        Some(slot) => unsafe {
            core::ptr::write_volatile(slot, value);
            core::ptr::read_volatile(slot)
        },
        None => value,
    }
}

/// Bytes of a batch record before its entries.
const BATCH_HEAD: usize = core::mem::offset_of!(SseBatchRecord, entries);

/// If a template is set for the process (`template`: its `TRACKED` value) and the write at
/// `ptr` of `len` bytes matches it, as the fd's previous write did, add the write to the fd's
/// batch and return true (nothing else is to be copied of it). A response's first matching
/// write is copied whole: it is the one that tells userspace the response's id (a
/// completion's writes all carry content).
pub fn try_elide(
    key: &FdKey,
    state: &mut FdState,
    template: u32,
    ptr: u64,
    len: u64,
    seq: u64,
) -> bool {
    let matched = state.sse_matched != 0;
    state.sse_matched = 0;
    let Some(content) = match_template(template, ptr, len) else {
        return false;
    };
    state.sse_matched = 1;
    if !matched || !append(key, state, seq, len as u32, content as u32) {
        return false;
    }
    count(counter::SSE_ELIDED, 1);
    true
}

/// The content length of the write at `ptr` of `len` bytes when it matches the template at
/// slot `template` - 1 (none: 0).
fn match_template(template: u32, ptr: u64, len: u64) -> Option<usize> {
    if template == 0 || len as usize > SSE_WRITE_MAX {
        return None;
    }
    // Read in place while this program runs: userspace does not rewrite a slot that a
    // process was pointed at until long after (see SSE_TEMPLATES).
    let template = SSE_TEMPLATES.get(template - 1)?;
    let buf = WRITE_BUF.get_ptr_mut(0)?;
    // SAFETY: per-CPU scratch value, used by this program invocation only.
    let buf = unsafe { &mut *buf };
    let n = (len as usize) & (2 * SSE_WRITE_MAX - 1);
    if n == 0 || n > SSE_WRITE_MAX {
        return None;
    }
    // SAFETY: user pointer read with the fault-tolerant helper, into scratch memory.
    unsafe { bpf_probe_read_user_buf(ptr as *const u8, &mut buf[..n]) }.ok()?;
    let at = template.id_end(buf, n)?;
    template.matches_after_id(buf, n, forget_value(at))
}

/// Send the fd's pending elided writes (before another record of the fd, or at its close);
/// `forget`: drop its batch entry too (its stream has moved on).
pub fn flush(key: &FdKey, state: &mut FdState, forget: bool) {
    if state.sse_pending == 0 {
        return;
    }
    state.sse_pending = 0;
    if let Some(batch) = SSE_BATCHES.get_ptr_mut(key) {
        // SAFETY: the fd's own entry, written by its writer thread only.
        send(unsafe { &mut *batch }, key);
    }
    if forget {
        let _ = SSE_BATCHES.remove(key);
    }
}

/// Forget the fd's batch (it is being closed, after `flush`).
pub fn forget(key: &FdKey) {
    let _ = SSE_BATCHES.remove(key);
}

/// Add one elided write to the fd's batch, sending the batch when full. False when no batch
/// entry can be made (the write is then copied as any other).
fn append(key: &FdKey, state: &mut FdState, seq: u64, len: u32, content: u32) -> bool {
    let batch = match SSE_BATCHES.get_ptr_mut(key) {
        Some(batch) => batch,
        None => {
            let Some(blank) = SSE_BLANK.get_ptr(0) else {
                return false;
            };
            // SAFETY: a per-CPU value nothing writes (all zeroes).
            if SSE_BATCHES.insert(key, unsafe { &*blank }, 0).is_err() {
                count(counter::MAP_FULL, 1);
                return false;
            }
            match SSE_BATCHES.get_ptr_mut(key) {
                Some(batch) => batch,
                None => return false,
            }
        }
    };
    // SAFETY: the fd's own entry, written by its writer thread only.
    let batch = unsafe { &mut *batch };
    let at = batch.count as usize;
    if at >= SSE_BATCH_LEN {
        send(batch, key);
    }
    let at = batch.count as usize & (SSE_BATCH_LEN - 1);
    batch.entries[at] = ElidedWrite {
        seq,
        // SAFETY: helper without preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        len,
        content,
    };
    batch.count = at as u32 + 1;
    state.sse_pending = 1;
    if batch.count as usize == SSE_BATCH_LEN {
        send(batch, key);
        state.sse_pending = 0;
    }
    true
}

/// Send the batch's entries as one record and empty it. A full ring buffer loses them
/// (counted): userspace sees their sequence numbers missing.
fn send(batch: &mut SseBatchRecord, key: &FdKey) {
    let entries = batch.count as usize & (2 * SSE_BATCH_LEN - 1);
    batch.count = 0;
    if entries == 0 || entries > SSE_BATCH_LEN {
        return;
    }
    batch.header = header(kind::SSE_BATCH, key.tgid);
    batch.fd = key.fd;
    batch.count = entries as u32;
    let total = BATCH_HEAD + entries * core::mem::size_of::<ElidedWrite>();
    // SAFETY: `SseBatchRecord` is repr(C) and `total` never exceeds its size.
    let bytes = unsafe {
        core::slice::from_raw_parts((batch as *const SseBatchRecord).cast::<u8>(), total)
    };
    submit_with(bytes, wakeup_flags(config().wakeup_watermark));
    batch.count = 0;
}
