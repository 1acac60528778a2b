//! Library loads: a tracked process mapping part of a file executable.
//!
//! The agent probes libraries that engines load late (the CUDA driver when torch first
//! touches the GPU, libzmq when pyzmq is imported): it looks for them in a process's maps when
//! this says one was loaded, instead of re-reading the maps on a timer (milliseconds per look
//! for a torch process). The dynamic loader maps each library's code with PROT_EXEC from its
//! file; anonymous executable memory (a JIT) is left out.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use infertrace_common::kind;

use crate::shared::{header, submit, syscall_arg, tracked_tgid};

/// Offset of `ret` in the sys_exit_* record.
const RET: usize = 16;
/// include/uapi/asm-generic/mman-common.h
const PROT_EXEC: u64 = 0x4;
const MAP_ANONYMOUS: u64 = 0x20;

/// `mmap(addr, len, prot, flags, fd, offset)` returned. Every process's mmaps come here; the
/// tracked-process lookup goes first: loading the arguments from `pt_regs` first was slower
/// for the untracked (280-320 ns a call against 177-180 ns, an anonymous-mmap loop).
#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    let Some((tgid, _)) = tracked_tgid() else {
        return 0;
    };
    // SAFETY: offset from the sys_exit_mmap format file.
    let ret: i64 = unsafe { ctx.read_at(RET) }.unwrap_or(-1);
    // A failed call returns -errno (-4095..-1).
    if (-4095..0).contains(&ret) {
        return 0;
    }
    let (prot, flags, fd) = (syscall_arg(2), syscall_arg(3), syscall_arg(4) as i32);
    if prot & PROT_EXEC != 0 && flags & MAP_ANONYMOUS == 0 && fd >= 0 {
        submit(&header(kind::LIBRARY_MAPPED, tgid));
    }
    0
}
