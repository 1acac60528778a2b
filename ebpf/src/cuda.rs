//! CUDA driver calls: uprobes on the driver library's entry points (`libcuda.so.1`).
//!
//! Userspace attaches one entry program (and, where the call's end matters, one return program)
//! to every probed site of a traced process, with the function's [`cuda_fn`] id as the attach
//! cookie, so that two programs serve every entry point.
//!
//! A step of an engine launches hundreds to thousands of kernels and then waits for the GPU
//! once. So, by default, the calls are counted in the kernel per thread (launches per kernel
//! handle, graph launches, copies, event records, first and last launch time) and one
//! CUDA_STEP record leaves when a synchronisation returns. With `cuda_every_call` set, every
//! call is a CUDA_CALL record instead (to check the aggregation and to measure what it saves).
//! Name lookups always produce a CUDA_NAME record on return, read from the caller's output.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes, generated::bpf_get_attach_cookie,
    },
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use infertrace_common::{CudaCallRecord, CudaNameRecord, CudaStepRecord, counter, cuda_fn, kind};

use crate::shared::{config, count, header, submit};

/// The step each thread is in (key: thread id).
#[map]
static CUDA_STEPS: HashMap<u32, CudaStepRecord> = HashMap::with_max_entries(8192, 0);

/// A call between its entry and return on one thread (key: thread id).
#[repr(C)]
#[derive(Clone, Copy)]
struct Pending {
    enter_ns: u64,
    /// The caller's output pointer (handle or name), or the handle passed in.
    out: u64,
    /// The name pointer, or the kernel handle (cuKernelGetFunction).
    arg: u64,
    function: u32,
    _pad: u32,
}

#[map]
static CUDA_PENDING: HashMap<u32, Pending> = HashMap::with_max_entries(8192, 0);

/// An all-zero step, never written: the template of a thread's new step (too large for the
/// 512-byte stack).
#[map]
static CUDA_ZERO_STEP: PerCpuArray<CudaStepRecord> = PerCpuArray::with_max_entries(1, 0);

/// Scratch for a name record (its buffer does not fit on the stack next to the rest).
#[map]
static CUDA_NAME_SCRATCH: PerCpuArray<CudaNameRecord> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn cookie(ctx: *mut core::ffi::c_void) -> u32 {
    // SAFETY: the context pointer of a uprobe program; 0 when attached without a cookie.
    unsafe { bpf_get_attach_cookie(ctx) as u32 }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn current() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

/// The calling thread's step, started if it has none.
#[inline(always)]
fn step_of(tid: u32) -> Option<*mut CudaStepRecord> {
    if let Some(step) = CUDA_STEPS.get_ptr_mut(&tid) {
        return Some(step);
    }
    let zero = CUDA_ZERO_STEP.get_ptr(0)?;
    // SAFETY: a valid pointer into map memory, read by the helper as the value to insert.
    if CUDA_STEPS.insert(&tid, unsafe { &*zero }, 0).is_err() {
        count(counter::MAP_FULL, 1);
        return None;
    }
    CUDA_STEPS.get_ptr_mut(&tid)
}

/// Count a launch of `function` in the step's per-kernel table.
#[inline(always)]
fn count_kernel(step: &mut CudaStepRecord, function: u64) {
    for slot in step.kernels.iter_mut() {
        if slot.function == function && slot.launches != 0 {
            slot.launches += 1;
            return;
        }
        if slot.launches == 0 {
            slot.function = function;
            slot.launches = 1;
            return;
        }
    }
    step.other_launches += 1;
}

/// One call that does not end a step, counted in the thread's step.
#[inline(always)]
fn aggregate(function: u32, handle: u64, bytes: u64, at: u64, tid: u32) {
    let Some(step) = step_of(tid) else {
        return;
    };
    // SAFETY: map memory of this thread's entry; only this thread writes it.
    let step = unsafe { &mut *step };
    match function {
        cuda_fn::LAUNCH_KERNEL | cuda_fn::LAUNCH_KERNEL_EX | cuda_fn::GRAPH_LAUNCH => {
            if step.first_launch_ns == 0 {
                step.first_launch_ns = at;
            }
            step.last_launch_ns = at;
            if function == cuda_fn::GRAPH_LAUNCH {
                step.graph_launches += 1;
            } else {
                step.launches += 1;
                count_kernel(step, handle);
            }
        }
        cuda_fn::MEMCPY_DTOH_ASYNC | cuda_fn::MEMCPY_ASYNC => {
            step.copies += 1;
            step.copy_bytes += bytes;
        }
        cuda_fn::EVENT_RECORD => step.event_records += 1,
        _ => {}
    }
}

/// Send the thread's step, ended by `function` (entered at `enter_ns`, result `result`), and
/// start a new one.
#[inline(always)]
fn end_step(tgid: u32, tid: u32, function: u32, enter_ns: u64, result: i32) {
    let Some(step) = step_of(tid) else {
        return;
    };
    // SAFETY: as in `aggregate`.
    let step = unsafe { &mut *step };
    step.header = header(kind::CUDA_STEP, tgid);
    step.sync_enter_ns = enter_ns;
    step.sync_function = function;
    step.sync_result = result;
    submit(step);
    let _ = CUDA_STEPS.remove(&tid);
}

/// One CUDA_CALL record (aggregation off).
#[inline(always)]
fn call_record(tgid: u32, function: u32, enter_ns: u64, handle: u64, bytes: u64, result: i32) {
    let record = CudaCallRecord {
        header: header(kind::CUDA_CALL, tgid),
        enter_ns,
        handle,
        bytes,
        function,
        result,
    };
    submit(&record);
}

/// Entry of every probed driver function; the cookie says which.
#[uprobe]
pub fn cuda_enter(ctx: ProbeContext) -> u32 {
    let function = cookie(ctx.as_ptr());
    let (tgid, tid) = current();
    let at = now();
    // Each register read once, at a constant offset: the verifier refuses a context access
    // at a computed one.
    let args: [u64; 3] = [
        ctx.arg(0).unwrap_or(0),
        ctx.arg(1).unwrap_or(0),
        ctx.arg(2).unwrap_or(0),
    ];
    let arg = |n: usize| args[n];
    if cuda_fn::needs_return(function) {
        let (out, second) = match function {
            // (CUfunction *hfunc, CUmodule, const char *name), same shape for kernels
            cuda_fn::MODULE_GET_FUNCTION | cuda_fn::LIBRARY_GET_KERNEL => (arg(0), arg(2)),
            // (CUfunction *pFunc, CUkernel) and (const char **name, CUfunction)
            cuda_fn::KERNEL_GET_FUNCTION | cuda_fn::FUNC_GET_NAME => (arg(0), arg(1)),
            // synchronisations: the stream or event waited for
            _ => (arg(0), 0),
        };
        let pending = Pending {
            enter_ns: at,
            out,
            arg: second,
            function,
            _pad: 0,
        };
        if CUDA_PENDING.insert(&tid, &pending, 0).is_err() {
            count(counter::MAP_FULL, 1);
        }
        return 0;
    }
    // (handle, bytes) of the call: cuLaunchKernel(f, ...), cuLaunchKernelEx(config, f, ...),
    // cuGraphLaunch(exec, stream), cuEventRecord(event, stream), copies (dst, src, bytes, ...)
    let (handle, bytes) = match function {
        cuda_fn::LAUNCH_KERNEL_EX => (arg(1), 0),
        cuda_fn::MEMCPY_DTOH_ASYNC | cuda_fn::MEMCPY_ASYNC => (arg(0), arg(2)),
        _ => (arg(0), 0),
    };
    if config().cuda_every_call != 0 {
        call_record(tgid, function, at, handle, bytes, 0);
    } else {
        aggregate(function, handle, bytes, at, tid);
    }
    0
}

/// Return of the functions whose end matters: synchronisations and name lookups.
#[uretprobe]
pub fn cuda_return(ctx: RetProbeContext) -> u32 {
    let (tgid, tid) = current();
    // SAFETY: copied out at once.
    let Some(pending) = (unsafe { CUDA_PENDING.get(&tid) }).copied() else {
        return 0;
    };
    let _ = CUDA_PENDING.remove(&tid);
    let result: i32 = ctx.ret();
    let function = pending.function;
    if cuda_fn::is_sync(function) {
        if config().cuda_every_call != 0 {
            call_record(tgid, function, pending.enter_ns, pending.out, 0, result);
        } else {
            end_step(tgid, tid, function, pending.enter_ns, result);
        }
    } else if result == 0 {
        name_record(tgid, &pending);
    }
    0
}

/// The CUDA_NAME record of a lookup that succeeded.
#[inline(always)]
fn name_record(tgid: u32, pending: &Pending) {
    let Some(record) = CUDA_NAME_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU scratch, no other user while this program runs on this CPU.
    let record = unsafe { &mut *record };
    record.header = header(kind::CUDA_NAME, tgid);
    record.function = pending.function;
    record.kernel = 0;
    record.len = 0;
    // SAFETY (all reads below): user pointers the driver just wrote through; a failed read is
    // counted and the record not sent.
    let read_u64 = |at: u64| unsafe { bpf_probe_read_user(at as *const u64) };
    let name_ptr = match pending.function {
        cuda_fn::KERNEL_GET_FUNCTION => {
            let Ok(function) = read_u64(pending.out) else {
                count(counter::CUDA_READ_FAILED, 1);
                return;
            };
            record.handle = function;
            record.kernel = pending.arg;
            submit(record);
            return;
        }
        cuda_fn::FUNC_GET_NAME => {
            record.handle = pending.arg;
            read_u64(pending.out)
        }
        _ => read_u64(pending.out).map(|handle| {
            record.handle = handle;
            pending.arg
        }),
    };
    let Ok(name_ptr) = name_ptr else {
        count(counter::CUDA_READ_FAILED, 1);
        return;
    };
    // SAFETY: as above.
    match unsafe { bpf_probe_read_user_str_bytes(name_ptr as *const u8, &mut record.name) } {
        Ok(name) => {
            record.len = name.len() as u32;
            submit(record);
        }
        Err(_) => count(counter::CUDA_READ_FAILED, 1),
    }
}

/// A traced thread exits: launches that no synchronisation ended still leave, marked so.
#[inline(always)]
pub fn thread_exit(tgid: u32, tid: u32) {
    // SAFETY: checked for presence only; the step is sent from map memory.
    if unsafe { CUDA_STEPS.get(&tid) }.is_some() {
        end_step(tgid, tid, cuda_fn::THREAD_EXIT, 0, 0);
    }
    let _ = CUDA_PENDING.remove(&tid);
}
