//! Loading and attaching the eBPF programs, and talking to their maps.
//!
//! This is the only place that touches the kernel. Everything it hands on is a raw record
//! (exactly the bytes the kernel wrote), so live capture and replay share the same parser.
use std::{
    collections::{HashMap as StdHashMap, HashSet},
    num::NonZeroU32,
    os::fd::AsRawFd,
    path::Path,
};

use anyhow::{Context as _, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        PerfEvent, TracePoint, UProbe,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use infertrace_common::{
    Config, Counters, FdDecision, FdKey, FdState, FileOffsets, PyProcess, PyStack,
    SSE_TEMPLATE_SLOTS, SseTemplate, counter, cuda_fn,
};

use super::{cuda_watch::CudaOptions, python_watch::PythonOptions, template_slots::TemplateSlots};
use crate::discover::{btf, uprobe_sites::ProbeSite};

/// `bpf_map_update_elem`'s flag: update an entry that exists, never add one
/// (include/uapi/linux/bpf.h).
const BPF_EXIST: u64 = 2;

/// The uprobe programs of every CUDA driver site: the entry, and the return where it matters.
const CUDA_ENTER: &str = "cuda_enter";
const CUDA_RETURN: &str = "cuda_return";
/// The uprobe programs of libzmq's `zmq_msg_send`.
const ZMQ_ENTER: &str = "zmq_send_enter";
const ZMQ_RETURN: &str = "zmq_send_return";
/// The uprobe program of CPython's `pickle.dumps`.
const PICKLE_DUMPS: &str = "pickle_dumps_enter";

/// A library whose functions the agent probes in traced processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbedLibrary {
    CudaDriver,
    Libzmq,
    CpythonPickle,
}

/// The committed, debug-stripped eBPF object (rebuilt by `cargo xtask build-ebpf`).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../../ebpf/prebuilt/infertrace.bpf.o");

/// (category, tracepoint) pairs; program names equal tracepoint names.
pub const TRACEPOINTS: &[(&str, &str)] = &[
    ("sched", "sched_process_fork"),
    ("sched", "sched_process_exec"),
    ("sched", "sched_process_exit"),
    ("syscalls", "sys_enter_close"),
    ("syscalls", "sys_exit_mmap"),
    ("syscalls", "sys_exit_read"),
    ("syscalls", "sys_exit_write"),
    ("syscalls", "sys_exit_readv"),
    ("syscalls", "sys_exit_writev"),
    ("syscalls", "sys_exit_recvfrom"),
    ("syscalls", "sys_exit_sendto"),
    ("syscalls", "sys_exit_recvmsg"),
    ("syscalls", "sys_exit_sendmsg"),
    ("syscalls", "sys_enter_epoll_wait"),
    ("syscalls", "sys_exit_epoll_wait"),
    ("syscalls", "sys_enter_epoll_pwait"),
    ("syscalls", "sys_exit_epoll_pwait"),
    ("syscalls", "sys_enter_epoll_pwait2"),
    ("syscalls", "sys_exit_epoll_pwait2"),
    ("syscalls", "sys_enter_poll"),
    ("syscalls", "sys_exit_poll"),
];

/// Settings of the kernel side.
#[derive(Clone, Debug)]
pub struct KernelOptions {
    /// Ring buffer size in bytes (a power of two, multiple of the page size).
    pub ring_bytes: u32,
    /// Per-syscall payload cap in bytes.
    pub cap_bytes: u32,
    /// What to do with the CUDA driver of traced processes.
    pub cuda: CudaOptions,
    /// Python stack sampling of traced processes.
    pub python: PythonOptions,
    /// Leave traced processes' libzmq unprobed (their sends are then timed by the I/O
    /// thread's mailbox write, or its write to the socket).
    pub no_zmq_probe: bool,
    /// Leave SGLang main processes' and DP controllers' `pickle.dumps` unprobed (no
    /// `api_server_dispatch`: the `tokenize` span then covers it; no `dpc_dispatch`).
    pub no_pickle_probe: bool,
    /// Report every exec on the host, not only the traced processes' (node mode: engines are
    /// traced from their start).
    pub announce_execs: bool,
}

impl Default for KernelOptions {
    fn default() -> Self {
        Self {
            ring_bytes: 32 * 1024 * 1024,
            cap_bytes: infertrace_common::DEFAULT_CAP_BYTES,
            cuda: CudaOptions::default(),
            python: PythonOptions::default(),
            no_zmq_probe: false,
            no_pickle_probe: false,
            announce_execs: false,
        }
    }
}

/// Kernel-side counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
// Recordings made before a counter existed read it as 0.
#[serde(default)]
pub struct KernelCounters {
    pub ring_full: u64,
    pub truncated_bytes: u64,
    pub truncated_syscalls: u64,
    pub read_failed: u64,
    pub captured_syscalls: u64,
    pub map_full: u64,
    pub cuda_read_failed: u64,
    /// Streamed content writes reported by time and size only (ebpf/src/sse.rs).
    pub sse_elided: u64,
}

/// Loaded and attached programs. Detaches when dropped.
pub struct KernelCapture {
    ebpf: Ebpf,
    /// The uprobe programs loaded so far (each on first use).
    uprobes_loaded: HashSet<&'static str>,
    /// Each process's probe links per library (program, link), to detach on exit.
    uprobe_links: StdHashMap<(u32, ProbedLibrary), Vec<(&'static str, UProbeLinkId)>>,
    /// Kept open: programs loaded later (the uprobes) refer to the map by its fd.
    _config: Array<MapData, Config>,
    /// Python processes the sampler walks, and the stacks it interned (read on first use).
    python: Option<PythonMaps>,
    ring: RingBuf<MapData>,
    /// tgid -> its slot in `sse_templates` plus one (0: none).
    tracked: HashMap<MapData, u32, u32>,
    fd_class: HashMap<MapData, FdKey, FdState>,
    fd_decision: HashMap<MapData, FdKey, FdDecision>,
    sse_templates: Array<MapData, SseTemplate>,
    template_slots: TemplateSlots,
    counters: PerCpuArray<MapData, Counters>,
}

/// Where the kernel keeps an fd's file type, so that it can leave a pending file's reads
/// out; unknown (every pending fd copied, as before) when the BTF does not say.
fn file_offsets() -> FileOffsets {
    btf::file_offsets().unwrap_or_else(|e| {
        tracing::info!("{e}: files are copied until classified, as sockets are");
        FileOffsets::default()
    })
}

impl KernelCapture {
    /// Load the programs, configure them and attach every tracepoint. Nothing is traced until
    /// [`KernelCapture::track`] adds a process.
    pub fn load(options: &KernelOptions) -> anyhow::Result<Self> {
        check_privileges()?;
        crate::discover::system::ensure_tracefs()?;
        if !std::path::Path::new(btf::KERNEL_BTF).exists() {
            bail!(
                "this kernel has no BTF ({}): infertrace's capture reads each syscall's \
                 arguments through it; it needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
                btf::KERNEL_BTF
            );
        }
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
                cuda_every_call: u32::from(options.cuda.every_call),
                announce_execs: u32::from(options.announce_execs),
                file_offsets: file_offsets(),
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
        let sse_templates = Array::try_from(
            ebpf.take_map("SSE_TEMPLATES")
                .context("SSE_TEMPLATES missing")?,
        )?;
        let counters =
            PerCpuArray::try_from(ebpf.take_map("COUNTERS").context("COUNTERS missing")?)?;
        Ok(Self {
            sse_templates,
            template_slots: TemplateSlots::new(SSE_TEMPLATE_SLOTS),
            ebpf,
            uprobes_loaded: HashSet::new(),
            uprobe_links: StdHashMap::new(),
            _config: config,
            python: None,
            ring,
            tracked,
            fd_class,
            fd_decision,
            counters,
        })
    }

    /// Start tracing a process (its children are added by the kernel as they fork). One
    /// tracked already keeps its entry (and its stream template).
    pub fn track(&mut self, tgid: u32) -> anyhow::Result<()> {
        if self.tracked.get(&tgid, 0).is_ok() {
            return Ok(());
        }
        self.tracked
            .insert(tgid, 0, 0)
            .with_context(|| format!("adding pid {tgid} to the tracked set"))
    }

    /// Stop tracing a task id (a thread mistaken for a process, or an exited process).
    pub fn untrack(&mut self, tgid: u32) {
        let _ = self.tracked.remove(&tgid);
    }

    /// Tell the kernel what to do with an fd (one of `fd_action`: copy its payloads, and
    /// report its polls too, or ignore it). The kernel applies the decision on the fd's next
    /// syscall (it owns the fd's state, sequence numbers included).
    pub fn classify(
        &mut self,
        tgid: u32,
        fd: u32,
        generation: u32,
        action: u8,
    ) -> anyhow::Result<()> {
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
        self.template_slots.release(tgid);
    }

    /// Let the kernel report the writes of process `tgid` that match `template` by time and
    /// size only (ebpf/src/sse.rs): the template goes to a free slot, then the process's
    /// entry is pointed at it. With no slot free, or the process gone, its writes stay copied.
    pub fn set_sse_template(&mut self, tgid: u32, template: &SseTemplate) -> anyhow::Result<()> {
        let slot = self.template_slots.free_slot().with_context(|| {
            format!(
                "no room for the stream template of pid {tgid} ({SSE_TEMPLATE_SLOTS} processes \
                 hold one)"
            )
        })?;
        self.sse_templates
            .set(slot, *template, 0)
            .with_context(|| format!("setting the stream template of pid {tgid}"))?;
        // BPF_EXIST: a process that has exited meanwhile is not tracked again.
        self.tracked
            .insert(tgid, slot + 1, BPF_EXIST)
            .with_context(|| format!("pointing pid {tgid} at its stream template"))?;
        self.template_slots.hold(tgid, slot);
        Ok(())
    }

    /// Attach the CUDA probes to `sites` of the driver library at `driver` (a path this process
    /// can open), for process `pid` only. Returns how many probes were attached; on an error,
    /// those attached before it stay (and are detached with the process).
    pub fn probe_cuda(
        &mut self,
        pid: u32,
        driver: &Path,
        sites: &[ProbeSite],
    ) -> anyhow::Result<usize> {
        let mut probes = Vec::new();
        for site in sites {
            let id = cuda_fn::id(site.function)
                .with_context(|| format!("{} is not a probed function", site.function))?;
            let programs: &[&'static str] = if cuda_fn::needs_return(id) {
                &[CUDA_ENTER, CUDA_RETURN]
            } else {
                &[CUDA_ENTER]
            };
            probes.extend(
                programs
                    .iter()
                    .map(|&program| (program, site, Some(u64::from(id)))),
            );
        }
        self.attach_uprobes(pid, ProbedLibrary::CudaDriver, driver, &probes)
    }

    /// Attach the hand-over probe (entry and return) to libzmq's `zmq_msg_send` at `site` of
    /// the library at `libzmq`, for process `pid` only.
    pub fn probe_zmq(
        &mut self,
        pid: u32,
        libzmq: &Path,
        sites: &[ProbeSite],
    ) -> anyhow::Result<usize> {
        let probes: Vec<_> = sites
            .iter()
            .flat_map(|site| [(ZMQ_ENTER, site, None), (ZMQ_RETURN, site, None)])
            .collect();
        self.attach_uprobes(pid, ProbedLibrary::Libzmq, libzmq, &probes)
    }

    /// Attach the serialization probe (entry only) to CPython's `pickle.dumps` at `sites` of
    /// the library at `path`, for process `pid` only.
    pub fn probe_pickle(
        &mut self,
        pid: u32,
        path: &Path,
        sites: &[ProbeSite],
    ) -> anyhow::Result<usize> {
        let probes: Vec<_> = sites
            .iter()
            .map(|site| (PICKLE_DUMPS, site, None))
            .collect();
        self.attach_uprobes(pid, ProbedLibrary::CpythonPickle, path, &probes)
    }

    /// Attach uprobes (program, site, cookie) to the library at `path` for process `pid`
    /// only, loading each program on first use; the links are kept to detach them with the
    /// process.
    fn attach_uprobes(
        &mut self,
        pid: u32,
        library: ProbedLibrary,
        path: &Path,
        probes: &[(&'static str, &ProbeSite, Option<u64>)],
    ) -> anyhow::Result<usize> {
        let scope = UProbeScope::OneProcess(
            NonZeroU32::new(pid).context("pid 0 has no libraries to probe")?,
        );
        let mut attached = 0;
        for &(name, site, cookie) in probes {
            if !self.uprobes_loaded.contains(name) {
                self.uprobe(name)?
                    .load()
                    .with_context(|| format!("verifier rejected {name}"))?;
                self.uprobes_loaded.insert(name);
            }
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(site.file_offset),
                cookie,
            };
            let link = self
                .uprobe(name)?
                .attach(point, path, scope)
                .with_context(|| {
                    format!(
                        "attaching {name} to {} at {:#x} of {} for pid {pid}",
                        site.symbol,
                        site.file_offset,
                        path.display()
                    )
                })?;
            self.uprobe_links
                .entry((pid, library))
                .or_default()
                .push((name, link));
            attached += 1;
        }
        Ok(attached)
    }

    /// Detach the probes on one library of a process (it exited or replaced its program).
    pub fn unprobe(&mut self, pid: u32, library: ProbedLibrary) {
        for (name, link) in self
            .uprobe_links
            .remove(&(pid, library))
            .unwrap_or_default()
        {
            if let Ok(program) = self.uprobe(name) {
                let _ = program.detach(link);
            }
        }
    }

    fn uprobe(&mut self, name: &str) -> anyhow::Result<&mut UProbe> {
        Ok(self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the eBPF object"))?
            .try_into()?)
    }

    /// Start sampling Python stacks: a CPU-clock perf event at `hz` on every online CPU, whose
    /// program walks the frames of threads of the processes given to
    /// [`KernelCapture::sample_python_process`].
    pub fn sample_python(&mut self, hz: u64) -> anyhow::Result<()> {
        if self.python.is_some() {
            return Ok(());
        }
        let procs = HashMap::try_from(self.ebpf.take_map("PY_PROCS").context("PY_PROCS missing")?)?;
        let stacks = HashMap::try_from(
            self.ebpf
                .take_map("PY_STACKS")
                .context("PY_STACKS missing")?,
        )?;
        // Kept before loading: the program refers to the maps by their fds.
        self.python = Some(PythonMaps { procs, stacks });
        let program: &mut PerfEvent = self
            .ebpf
            .program_mut("python_sample")
            .context("program python_sample missing from the eBPF object")?
            .try_into()?;
        program.load().context("verifier rejected python_sample")?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        for cpu in cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(hz),
                    false,
                )
                .with_context(|| format!("attaching the Python sampler to CPU {cpu}"))?;
        }
        Ok(())
    }

    /// Walk the Python frames of process `pid` with this layout.
    pub fn sample_python_process(&mut self, pid: u32, process: PyProcess) -> anyhow::Result<()> {
        let maps = self
            .python
            .as_mut()
            .context("the Python sampler is not on")?;
        maps.procs
            .insert(pid, process, 0)
            .with_context(|| format!("adding pid {pid} to the Python sampler"))
    }

    /// Stop walking a process's frames (it exited or replaced its program).
    pub fn forget_python_process(&mut self, pid: u32) {
        if let Some(maps) = self.python.as_mut() {
            let _ = maps.procs.remove(&pid);
        }
    }

    /// An interned stack, read from the kernel's map (where it stays: the kernel adds a stack
    /// only when it is not there, so a stack read once costs no syscall again).
    pub fn python_stack(&mut self, id: u64) -> Option<PyStack> {
        let maps = self.python.as_mut()?;
        maps.stacks.get(&id, 0).ok()
    }

    /// Remove interned stacks from the kernel's map, to make room for new ones.
    pub fn forget_python_stacks(&mut self, ids: impl IntoIterator<Item = u64>) {
        if let Some(maps) = self.python.as_mut() {
            for id in ids {
                let _ = maps.stacks.remove(&id);
            }
        }
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
        let per_cpu = self.counters.get(&0, 0).ok();
        let sum = |index: u32| -> u64 {
            per_cpu
                .iter()
                .flat_map(|cpus| cpus.iter())
                .map(|c| c.values[index as usize])
                .sum()
        };
        KernelCounters {
            ring_full: sum(counter::RING_FULL),
            truncated_bytes: sum(counter::TRUNCATED_BYTES),
            truncated_syscalls: sum(counter::TRUNCATED_SYSCALLS),
            read_failed: sum(counter::READ_FAILED),
            captured_syscalls: sum(counter::CAPTURED_SYSCALLS),
            map_full: sum(counter::MAP_FULL),
            cuda_read_failed: sum(counter::CUDA_READ_FAILED),
            sse_elided: sum(counter::SSE_ELIDED),
        }
    }
}

/// The Python sampler's maps.
struct PythonMaps {
    procs: HashMap<MapData, u32, PyProcess>,
    stacks: HashMap<MapData, u64, PyStack>,
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
    for line in caps.missing() {
        tracing::warn!("{line}");
    }
    Ok(())
}
