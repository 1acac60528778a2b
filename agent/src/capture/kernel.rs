//! Loading and attaching the eBPF programs, and talking to their maps.
//!
//! This is the only place that touches the kernel. Everything it hands on is a raw record
//! (exactly the bytes the kernel wrote), so live capture and replay share the same parser.
use std::os::fd::AsRawFd;

use anyhow::{Context as _, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
};
use infertrace_common::{Config, FdDecision, FdKey, FdState, counter, fd_action};

/// The committed, debug-stripped eBPF object (rebuilt by `cargo xtask build-ebpf`).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../../ebpf/prebuilt/infertrace.bpf.o");

/// (category, tracepoint) pairs; program names equal tracepoint names.
pub const TRACEPOINTS: &[(&str, &str)] = &[
    ("sched", "sched_process_fork"),
    ("sched", "sched_process_exec"),
    ("sched", "sched_process_exit"),
    ("syscalls", "sys_enter_close"),
    ("syscalls", "sys_enter_read"),
    ("syscalls", "sys_exit_read"),
    ("syscalls", "sys_enter_write"),
    ("syscalls", "sys_exit_write"),
    ("syscalls", "sys_enter_readv"),
    ("syscalls", "sys_exit_readv"),
    ("syscalls", "sys_enter_writev"),
    ("syscalls", "sys_exit_writev"),
    ("syscalls", "sys_enter_recvfrom"),
    ("syscalls", "sys_exit_recvfrom"),
    ("syscalls", "sys_enter_sendto"),
    ("syscalls", "sys_exit_sendto"),
    ("syscalls", "sys_enter_recvmsg"),
    ("syscalls", "sys_exit_recvmsg"),
    ("syscalls", "sys_enter_sendmsg"),
    ("syscalls", "sys_exit_sendmsg"),
    ("syscalls", "sys_enter_epoll_wait"),
    ("syscalls", "sys_exit_epoll_wait"),
    ("syscalls", "sys_enter_epoll_pwait"),
    ("syscalls", "sys_exit_epoll_pwait"),
    ("syscalls", "sys_enter_epoll_pwait2"),
    ("syscalls", "sys_exit_epoll_pwait2"),
];

/// Settings of the kernel side.
#[derive(Clone, Debug)]
pub struct KernelOptions {
    /// Ring buffer size in bytes (a power of two, multiple of the page size).
    pub ring_bytes: u32,
    /// Per-syscall payload cap in bytes.
    pub cap_bytes: u32,
}

impl Default for KernelOptions {
    fn default() -> Self {
        Self {
            ring_bytes: 32 * 1024 * 1024,
            cap_bytes: infertrace_common::DEFAULT_CAP_BYTES,
        }
    }
}

/// Kernel-side counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelCounters {
    pub ring_full: u64,
    pub truncated_bytes: u64,
    pub truncated_syscalls: u64,
    pub read_failed: u64,
    pub captured_syscalls: u64,
    pub map_full: u64,
}

/// Loaded and attached programs. Detaches when dropped.
pub struct KernelCapture {
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
    tracked: HashMap<MapData, u32, u8>,
    fd_class: HashMap<MapData, FdKey, FdState>,
    fd_decision: HashMap<MapData, FdKey, FdDecision>,
    counters: PerCpuArray<MapData, u64>,
}

impl KernelCapture {
    /// Load the programs, configure them and attach every tracepoint. Nothing is traced until
    /// [`KernelCapture::track`] adds a process.
    pub fn load(options: &KernelOptions) -> anyhow::Result<Self> {
        check_privileges()?;
        crate::discover::system::ensure_tracefs()?;
        if options.cap_bytes == 0 {
            bail!("the per-syscall capture cap must be at least 1 byte");
        }
        let ring_bytes = options.ring_bytes.next_power_of_two().max(4096);
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("EVENTS", ring_bytes)
            .load(OBJECT)
            .context("loading the eBPF object into the kernel")?;
        let mut config: Array<_, Config> =
            Array::try_from(ebpf.take_map("CONFIG").context("CONFIG map missing")?)?;
        config.set(
            0,
            Config {
                cap_bytes: options.cap_bytes,
                wakeup_watermark: ring_bytes / 4,
            },
            0,
        )?;
        for (category, name) in TRACEPOINTS {
            attach(&mut ebpf, category, name)?;
        }
        let ring = RingBuf::try_from(ebpf.take_map("EVENTS").context("EVENTS map missing")?)?;
        let tracked = HashMap::try_from(ebpf.take_map("TRACKED").context("TRACKED missing")?)?;
        let fd_class = HashMap::try_from(ebpf.take_map("FD_CLASS").context("FD_CLASS missing")?)?;
        let fd_decision = HashMap::try_from(
            ebpf.take_map("FD_DECISION")
                .context("FD_DECISION missing")?,
        )?;
        let counters =
            PerCpuArray::try_from(ebpf.take_map("COUNTERS").context("COUNTERS missing")?)?;
        Ok(Self {
            _ebpf: ebpf,
            ring,
            tracked,
            fd_class,
            fd_decision,
            counters,
        })
    }

    /// Start tracing a process (its children are added by the kernel as they fork).
    pub fn track(&mut self, tgid: u32) -> anyhow::Result<()> {
        self.tracked
            .insert(tgid, 1, 0)
            .with_context(|| format!("adding pid {tgid} to the tracked set"))
    }

    /// Stop tracing a task id (a thread mistaken for a process, or an exited process).
    pub fn untrack(&mut self, tgid: u32) {
        let _ = self.tracked.remove(&tgid);
    }

    /// Tell the kernel whether to copy an fd's payloads. The kernel applies the decision on
    /// the fd's next syscall (it owns the fd's state, sequence numbers included).
    pub fn classify(
        &mut self,
        tgid: u32,
        fd: u32,
        generation: u32,
        capture: bool,
    ) -> anyhow::Result<()> {
        let action = if capture {
            fd_action::CAPTURE
        } else {
            fd_action::IGNORE
        };
        let decision = FdDecision {
            action,
            _pad: [0; 3],
            generation,
        };
        self.fd_decision
            .insert(FdKey { tgid, fd }, decision, 0)
            .with_context(|| format!("classifying fd {fd} of pid {tgid}"))
    }

    /// Forget every fd of an exited process.
    pub fn forget_process(&mut self, tgid: u32) {
        remove_process_keys(&mut self.fd_class, tgid);
        remove_process_keys(&mut self.fd_decision, tgid);
    }

    /// Hand up to `max` records from the ring buffer to `sink`, as the kernel wrote them.
    /// Returns how many were handed over.
    pub fn drain(&mut self, max: usize, mut sink: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else { break };
            sink(&item);
            n += 1;
        }
        n
    }

    /// The ring buffer's fd, to wait for wakeups.
    pub fn ring_fd(&self) -> i32 {
        self.ring.as_raw_fd()
    }

    pub fn counters(&self) -> KernelCounters {
        let sum = |index: u32| -> u64 {
            self.counters
                .get(&index, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        KernelCounters {
            ring_full: sum(counter::RING_FULL),
            truncated_bytes: sum(counter::TRUNCATED_BYTES),
            truncated_syscalls: sum(counter::TRUNCATED_SYSCALLS),
            read_failed: sum(counter::READ_FAILED),
            captured_syscalls: sum(counter::CAPTURED_SYSCALLS),
            map_full: sum(counter::MAP_FULL),
        }
    }
}

/// Remove every (tgid, fd) key of one process from a map.
fn remove_process_keys<V: aya::Pod>(map: &mut HashMap<MapData, FdKey, V>, tgid: u32) {
    let keys: Vec<FdKey> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| k.tgid == tgid)
        .collect();
    for key in keys {
        let _ = map.remove(&key);
    }
}

/// Loading tracing programs needs root or CAP_BPF + CAP_PERFMON (and CAP_DAC_OVERRIDE-ish
/// access to tracefs). Say so in plain words instead of surfacing EPERM from a syscall.
/// Load program `name` and attach it to the tracepoint of the same name.
fn attach(ebpf: &mut Ebpf, category: &str, name: &str) -> anyhow::Result<()> {
    let program: &mut TracePoint = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the eBPF object"))?
        .try_into()?;
    program
        .load()
        .with_context(|| format!("verifier rejected {name}"))?;
    program
        .attach(category, name)
        .with_context(|| format!("attaching tracepoint {category}/{name}"))?;
    Ok(())
}

fn check_privileges() -> anyhow::Result<()> {
    let caps = crate::discover::system::effective_capabilities()?;
    if !caps.can_trace() {
        bail!(
            "infertrace needs root, or the capabilities CAP_BPF and CAP_PERFMON (plus \
             CAP_SYS_PTRACE to read other processes' /proc entries); this process has {}. \
             Run it with sudo.",
            caps.describe()
        );
    }
    Ok(())
}
