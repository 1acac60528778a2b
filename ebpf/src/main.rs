//! infertrace's kernel side: follow the traced engines' process tree and library loads, copy
//! the payloads of their socket syscalls into a ring buffer, with the epoll waits of their
//! main threads, count their CUDA driver calls per step (uprobes), time their hand-overs of
//! messages to libzmq and the start of SGLang's serialization of each request (uprobes), and
//! sample their Python stacks (perf event).
//!
//! Only tracepoints and uprobes are used (this kernel has no kprobes and no fentry, see DESIGN.md). Every
//! program first checks that the current process is tracked, so untraced processes pay one
//! hash lookup per syscall.
#![no_std]
#![no_main]
// Atomic fetch-add on a map value (BPF_ATOMIC | BPF_FETCH): the target has no stable atomics.
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod cuda;
mod io;
mod mailbox;
mod mmap;
mod pickle;
mod poll;
mod proc;
mod python;
mod shared;
mod sse;
mod zmq;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
