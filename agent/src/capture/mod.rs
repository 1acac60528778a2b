//! Stage 1: everything the agent learns from the kernel and from /proc, as a stream of
//! [`CaptureEvent`]s. Live capture produces it ([`live`]), a recording stores it
//! ([`recording`]), and replay reads it back, so all later stages run the same either way.
pub mod clock;
pub mod cuda_watch;
pub mod kernel;
pub mod library_watch;
pub mod live;
pub mod pickle_watch;
pub mod python_watch;
pub mod recording;
pub mod records;
pub mod template_slots;
pub mod zmq_watch;

use serde::{Deserialize, Serialize};

pub use kernel::KernelCounters;
pub use records::Record;

use crate::discover::{engine::Target, kubernetes::PodIdentity, python::CodeName, sockets::FdKind};

/// A process the agent traces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Vec<String>,
}

/// One input of the decoding stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureEvent {
    /// A kernel record (kept with its raw bytes for recordings).
    Kernel(Record),
    /// A process joined the traced set (attached, forked, or exec'd).
    Process(ProcessInfo),
    /// A server joined the traced set while the session ran (node mode): its engine instance
    /// starts here. Comes before the Process events of its processes.
    Target(Box<Target>),
    /// Kubernetes told which pod a traced server's container belongs to (node mode).
    Pod { pid: u32, pod: Box<PodIdentity> },
    /// What a (process, fd) is, decided from /proc when the kernel first reported the fd.
    Fd { tgid: u32, fd: u32, kind: FdKind },
    /// The kernel's loss counters, read after a drain.
    Counters(KernelCounters),
    /// The names of a Python stack the sampler interned (innermost frame first), before the
    /// first sample that refers to it.
    PythonStack {
        tgid: u32,
        stack_id: u64,
        frames: Vec<CodeName>,
    },
    /// The wall clock moved against the capture clock: from capture time `monotonic_ns` on,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC is `realtime_minus_monotonic_ns`.
    Clock {
        monotonic_ns: u64,
        realtime_minus_monotonic_ns: i128,
    },
    /// End of one batch read from the ring buffer. A record still missing after two ticks is
    /// lost: records of one syscall are written within microseconds of each other.
    Tick,
}
