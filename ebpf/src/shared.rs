//! Maps and helpers shared by the process-tree and the I/O programs.
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use infertrace_common::{Config, Counters, FdDecision, FdKey, FdState, RecordHeader, counter};

/// All records to userspace. Userspace sets the real size at load time.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Tracked processes: tgid -> its slot in `SSE_TEMPLATES` plus one, 0 while it has no
/// template. Seeded by userspace; grows on fork of a tracked process. The value spares a
/// traced write a second hash lookup (the template's), an array index instead.
#[map]
pub static TRACKED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// What to do with each (tgid, fd) of a tracked process, plus per-direction sequence numbers.
#[map]
pub static FD_CLASS: HashMap<FdKey, FdState> = HashMap::with_max_entries(65536, 0);

/// Userspace's decisions for PENDING fds (tgid, fd) -> `fd_action`. The kernel moves a
/// decision into `FD_CLASS` itself, so that userspace never overwrites the sequence numbers.
#[map]
pub static FD_DECISION: HashMap<FdKey, FdDecision> = HashMap::with_max_entries(16384, 0);

/// Per-CPU counters of lost and truncated data, all in one entry (indices:
/// `infertrace_common::counter`).
#[map]
pub static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// Runtime configuration, index 0, written by userspace before attaching.
#[map]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Set `key`'s entry to `value`, in place when it exists: a rewrite costs a lookup, where an
/// insert takes a bucket lock and a free element (and gives the replaced one back). For the
/// maps whose entry is the current thread's own (no other program run writes it meanwhile).
#[inline(always)]
pub fn set_own_entry<K, V>(map: &LruHashMap<K, V>, key: &K, value: V) {
    match map.get_ptr_mut(key) {
        // SAFETY: the current thread's own entry: nothing else writes it meanwhile.
        Some(slot) => unsafe { *slot = value },
        None => {
            if map.insert(key, &value, 0).is_err() {
                count(counter::MAP_FULL, 1);
            }
        }
    }
}

/// Current process's tgid and thread id if it is tracked.
#[inline(always)]
pub fn tracked_tgid() -> Option<(u32, u32)> {
    tracked_process().map(|(tgid, tid, _)| (tgid, tid))
}

/// Current process's tgid, thread id and `TRACKED` value if it is tracked.
#[inline(always)]
pub fn tracked_process() -> Option<(u32, u32, u32)> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    // SAFETY: the value is copied out at once.
    unsafe { TRACKED.get(&tgid) }.map(|&value| (tgid, id as u32, value))
}

/// The tracked process's tgid when the current task is its main thread. Other threads leave
/// before the map lookup: the programs that ask run at every wait of every thread on the host
/// (libzmq's I/O threads wait once or twice per message).
#[inline(always)]
pub fn tracked_main_thread() -> Option<u32> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    if tgid != id as u32 {
        return None;
    }
    // SAFETY: the value is only checked for presence.
    unsafe { TRACKED.get(&tgid) }.map(|_| tgid)
}

#[inline(always)]
pub fn count(index: u32, by: u64) {
    if let Some(counters) = COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU while the program runs.
        if let Some(c) = unsafe { (*counters).values.get_mut(index as usize) } {
            *c += by;
        }
    }
}

#[inline(always)]
pub fn config() -> Config {
    CONFIG.get(0).copied().unwrap_or_default()
}

/// Ring buffer flags for the next record: wake the reader only when the buffer is filling up,
/// so a busy engine costs no wakeup per event (userspace also drains on a timer).
#[inline(always)]
pub fn wakeup_flags(watermark: u32) -> u64 {
    if watermark != 0 && EVENTS.query(BPF_RB_AVAIL_DATA as u64) > watermark as u64 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Send one fixed-size record to userspace; a full ring buffer counts it lost (false).
#[inline(always)]
pub fn submit<T>(record: &T) -> bool {
    submit_with(record, wakeup_flags(config().wakeup_watermark))
}

/// Send a record userspace must act on at once, waking it: a new socket is classified from
/// /proc, which it can only do while the socket exists (userspace otherwise drains once a
/// second).
#[inline(always)]
pub fn submit_now<T>(record: &T) -> bool {
    submit_with(record, BPF_RB_FORCE_WAKEUP as u64)
}

/// Send one record (fixed-size, or the bytes of a variable-length one) with these ring
/// buffer flags; a full ring buffer counts it lost (false).
#[inline(always)]
pub fn submit_with<T: ?Sized>(record: &T, flags: u64) -> bool {
    if EVENTS.output::<T>(record, flags).is_err() {
        count(counter::RING_FULL, 1);
        return false;
    }
    true
}

/// The header of a record the current task produces now.
#[inline(always)]
pub fn header(kind: u32, tgid: u32) -> RecordHeader {
    RecordHeader {
        kind,
        tgid,
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        // SAFETY: helper without preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
    }
}

/// Where x86-64's `struct pt_regs` (its uapi layout) keeps a syscall's arguments, in 8-byte
/// words: `di`, `si`, `dx`, `r10`, `r8`, `r9`. They are intact at the exit (the return value
/// goes to `ax`); the verifier checks each load against the running kernel's `pt_regs` BTF.
const ARG_REGISTERS: [usize; 6] = [14, 13, 12, 7, 9, 8];

/// The current syscall's argument `n` (0-based, below 6), from the registers it entered
/// with: a plain load from the task's `pt_regs` (a BTF pointer: the kernel makes it
/// fault-safe). An exit program thus needs no enter program keeping them per thread.
#[inline(always)]
pub fn syscall_arg(n: usize) -> u64 {
    // SAFETY: helpers without preconditions; the task is the current one, and the verifier
    // checks the load through the BTF pointer they return.
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u64;
        *regs.add(ARG_REGISTERS[n])
    }
}
