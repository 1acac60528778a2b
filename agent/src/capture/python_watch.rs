//! Traced Python processes: their interpreter's layout handed to the kernel's sampler, and the
//! stacks it interned named from the process's memory.
//!
//! The kernel sends a sample per CPU-clock tick with the hash of its stack; the first time a
//! (process, stack) is seen here, the stack's code objects are read from the process (once per
//! code object, cached) and a [`CaptureEvent::PythonStack`] carries the names ahead of the
//! sample, so that recordings and every later stage need no access to the process.
use std::collections::{HashMap, HashSet};

use infertrace_common::{PyProcess, PySampleRecord};

use super::{CaptureEvent, kernel::KernelCapture};
use crate::discover::{
    btf, procfs,
    python::{self, BinaryCache, CodeName, Memory, PythonError, PythonProcess},
};

/// Bounds of the caches (per agent); past them a cache starts over.
const MAX_CODE_NAMES: usize = 65_536;
const MAX_ANNOUNCED: usize = 65_536;
/// Stacks read out of the kernel's map (`PY_STACKS`, 4,096 entries) before it is emptied: a
/// stack stays there once interned, so that samples of it cost no syscall, until the map is
/// three quarters full (the rest is room for stacks interned since the last drain).
const MAX_KERNEL_STACKS: usize = 3072;

/// Sampling rates (primes, so that the clock does not beat with periodic work). By default
/// the rate follows what the samples are used for: counted by thread and phase (the
/// `infertrace_python_samples_total` metric) a low rate serves, as the shares add up over a
/// dashboard's minutes; each iteration's samples (granularity 2) and the stacks themselves
/// (the `profile` command, `--profile-output`, and recordings, which may be replayed into
/// either) get the higher one. At 49 Hz the sampler was a third of the agent's CPU on a vLLM
/// load, at 19 Hz 40 % of that (BENCHMARKS.md, "Twelfth round").
pub const BASE_HZ: u64 = 19;
pub const DETAIL_HZ: u64 = 49;

/// The default rate for sessions of this span `granularity` that do or do not keep the
/// stacks (a profile written, or a recording) (see [`BASE_HZ`]).
pub fn default_hz(granularity: u8, stacks_kept: bool) -> u64 {
    if granularity >= 2 || stacks_kept {
        DETAIL_HZ
    } else {
        BASE_HZ
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonOptions {
    /// Leave Python processes alone.
    pub off: bool,
    /// Samples per second per CPU (a thread on a CPU all the time gets this many).
    pub hz: u64,
}

impl Default for PythonOptions {
    fn default() -> Self {
        Self {
            off: false,
            hz: DETAIL_HZ,
        }
    }
}

/// What the watcher did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonStats {
    /// Processes whose frames are walked.
    pub processes: u64,
    /// Processes with an interpreter infertrace cannot walk (version, layout).
    pub unsupported: u64,
    /// Stacks whose frames were gone from the kernel's map (taken already, or the map full).
    pub unresolved_stacks: u64,
    /// Code objects whose name could not be read.
    pub unnamed_frames: u64,
}

pub struct PythonWatch {
    options: PythonOptions,
    /// False until the sampler is attached (and when it could not be).
    sampling: bool,
    processes: HashMap<u32, (PythonProcess, Memory)>,
    /// What each traced process's binaries said of their interpreter.
    binaries: BinaryCache,
    /// (process, stack id) already named in the event stream.
    announced: HashSet<(u32, u64)>,
    /// Stack ids read from the kernel's map, so still in it.
    in_kernel: HashSet<u64>,
    names: HashMap<(u32, u64), CodeName>,
    /// Where the kernel keeps a task's TLS base, once a 3.10 interpreter asked (from BTF).
    fsbase_offset: Option<Result<u32, String>>,
    pub stats: PythonStats,
}

impl PythonWatch {
    /// Attach the sampler (unless off). A failure is logged and leaves Python unsampled.
    pub fn start(options: PythonOptions, kernel: &mut KernelCapture) -> Self {
        let sampling = !options.off
            && match kernel.sample_python(options.hz) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("Python stack sampling is off: {e:#}");
                    false
                }
            };
        Self {
            options,
            sampling,
            processes: HashMap::new(),
            binaries: BinaryCache::default(),
            announced: HashSet::new(),
            in_kernel: HashSet::new(),
            names: HashMap::new(),
            fsbase_offset: None,
            stats: PythonStats::default(),
        }
    }

    /// A traced process (new, or one that replaced its program): walk it if it is Python.
    pub fn watch(&mut self, pid: u32, kernel: &mut KernelCapture) {
        if !self.sampling {
            return;
        }
        let process = match python::discover(pid, &mut self.binaries) {
            Ok(p) => p,
            Err(PythonError::NotPython(_)) => return,
            // Gone already (a short-lived child): normal life, nothing to sample.
            Err(e) if !procfs::exists(pid) => {
                tracing::debug!("Python sampling: {e} (the process has exited)");
                return;
            }
            Err(e) => {
                self.stats.unsupported += 1;
                tracing::warn!("Python sampling: {e}; its stacks are not sampled");
                return;
            }
        };
        let memory = match Memory::open(pid) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("Python sampling: pid {pid}: opening its memory: {e}");
                return;
            }
        };
        let fsbase_offset = if process.tls_thread_ids {
            let found = self
                .fsbase_offset
                .get_or_insert_with(|| btf::task_fsbase_offset().map_err(|e| e.to_string()));
            match found {
                Ok(offset) => *offset,
                Err(why) => {
                    self.stats.unsupported += 1;
                    tracing::warn!(
                        "Python sampling: pid {pid}: CPython {}.{} names its threads by their TLS \
                         base, which the sampler finds through the kernel's BTF: {why}; its \
                         stacks are not sampled",
                        process.version.0,
                        process.version.1
                    );
                    return;
                }
            }
        } else {
            0
        };
        let layout = PyProcess {
            runtime: process.runtime,
            offsets: process.frames,
            fsbase_offset,
        };
        match kernel.sample_python_process(pid, layout) {
            Ok(()) => {
                tracing::info!(
                    "Python {}.{} in pid {pid}: sampling its threads at {} Hz",
                    process.version.0,
                    process.version.1,
                    self.options.hz
                );
                self.stats.processes += 1;
                self.processes.insert(pid, (process, memory));
            }
            Err(e) => tracing::warn!("Python sampling: {e:#}"),
        }
    }

    /// A process exited or replaced its program.
    pub fn forget(&mut self, pid: u32, kernel: &mut KernelCapture) {
        if self.processes.remove(&pid).is_some() {
            kernel.forget_python_process(pid);
            self.announced.retain(|(p, _)| *p != pid);
            self.names.retain(|(p, _), _| *p != pid);
        }
    }

    /// A sample: name its stack if it is new (the event goes out before the sample).
    pub fn sample(
        &mut self,
        record: &PySampleRecord,
        kernel: &mut KernelCapture,
        out: &mut Vec<CaptureEvent>,
    ) {
        let (tgid, id) = (record.header.tgid, record.stack_id);
        tracing::trace!(
            "Python sample of {tgid}/{}: stack {id:#x}, depth {}, flags {:#x}",
            record.header.tid,
            record.depth,
            record.flags
        );
        if id == 0 {
            return;
        }
        if self.announced.contains(&(tgid, id)) {
            return;
        }
        if self.in_kernel.len() >= MAX_KERNEL_STACKS {
            // Empty the kernel's map; stacks sampled again are interned and announced again.
            kernel.forget_python_stacks(self.in_kernel.drain());
            self.announced.clear();
        }
        let stack = kernel.python_stack(id);
        self.in_kernel.insert(id);
        let Some(stack) = stack else {
            self.stats.unresolved_stacks += 1;
            return;
        };
        let Some((process, memory)) = self.processes.get(&tgid) else {
            return;
        };
        if self.names.len() >= MAX_CODE_NAMES {
            self.names.clear();
        }
        let len = (stack.len as usize).min(stack.frames.len());
        let mut frames = Vec::with_capacity(len);
        for &code in &stack.frames[..len] {
            let name = match self.names.get(&(tgid, code)) {
                Some(name) => name.clone(),
                None => {
                    let name = memory.code_object(code, &process.code).unwrap_or_else(|| {
                        self.stats.unnamed_frames += 1;
                        CodeName {
                            name: format!("<code {code:#x}>"),
                            file: String::new(),
                            line: 0,
                        }
                    });
                    self.names.insert((tgid, code), name.clone());
                    name
                }
            };
            frames.push(name);
        }
        if self.announced.len() >= MAX_ANNOUNCED {
            self.announced.clear();
        }
        self.announced.insert((tgid, id));
        out.push(CaptureEvent::PythonStack {
            tgid,
            stack_id: id,
            frames,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_follows_what_the_samples_are_for() {
        assert_eq!(default_hz(1, false), BASE_HZ);
        assert_eq!(default_hz(0, false), BASE_HZ);
        assert_eq!(default_hz(2, false), DETAIL_HZ);
        assert_eq!(default_hz(1, true), DETAIL_HZ);
    }
}
