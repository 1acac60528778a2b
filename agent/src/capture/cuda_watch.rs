//! Which traced processes have the CUDA driver loaded, and probing them when they do.
//!
//! An engine's GPU processes load `libcuda.so.1` late (vLLM's EngineCore and workers when
//! torch first touches the GPU, seconds after they started), so a traced process without the
//! driver is looked at again, with a growing interval, until it has it. Each driver file is
//! read once: its probe sites, and what a uprobe on each costs, are kept per file.
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::Path,
    time::{Duration, Instant},
};

use super::kernel::KernelCapture;
use crate::discover::cuda::{self, ProbeSite};

/// First and longest wait before looking at a process's maps again.
const FIRST_LOOK: Duration = Duration::from_millis(250);
const LONGEST_LOOK: Duration = Duration::from_secs(8);

/// What to do with the CUDA driver of traced processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaOptions {
    /// Leave the driver alone.
    pub off: bool,
    /// Leave out sites a uprobe would have to single-step (tens of µs per call each).
    pub skip_single_stepped: bool,
    /// One record per driver call instead of one per step (to check and measure the
    /// aggregation).
    pub every_call: bool,
}

/// A traced process whose driver is not probed yet.
struct Waiting {
    next_look: Instant,
    interval: Duration,
}

pub struct CudaWatch {
    options: CudaOptions,
    waiting: HashMap<u32, Waiting>,
    /// Probe sites per driver file (device, inode).
    sites: HashMap<(u64, u64), Vec<ProbeSite>>,
    /// Processes with probes attached.
    pub probed: u64,
    /// Probe attachments that failed (logged), and the last one's message.
    pub failures: u64,
    pub last_failure: Option<String>,
}

impl CudaWatch {
    pub fn new(options: CudaOptions) -> Self {
        Self {
            options,
            waiting: HashMap::new(),
            sites: HashMap::new(),
            probed: 0,
            failures: 0,
            last_failure: None,
        }
    }

    /// A traced process (new, or one that replaced its program): look for its driver.
    pub fn watch(&mut self, pid: u32) {
        if !self.options.off {
            self.waiting.insert(
                pid,
                Waiting {
                    next_look: Instant::now(),
                    interval: FIRST_LOOK,
                },
            );
        }
    }

    /// A process exited or replaced its program: its probes go.
    pub fn forget(&mut self, pid: u32, kernel: &mut KernelCapture) {
        self.waiting.remove(&pid);
        kernel.unprobe_cuda(pid);
    }

    /// Look at the processes that are due; probe those that now have the driver.
    pub fn look(&mut self, kernel: &mut KernelCapture) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.next_look <= now)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in due {
            let Some(driver) = cuda::driver_of(pid) else {
                if let Some(w) = self.waiting.get_mut(&pid) {
                    w.next_look = now + w.interval;
                    w.interval = (w.interval * 2).min(LONGEST_LOOK);
                }
                continue;
            };
            self.waiting.remove(&pid);
            match self.probe(pid, &driver, kernel) {
                Ok(n) => {
                    if self.probed == 0 {
                        match crate::discover::gpu::describe() {
                            Ok(gpus) => tracing::info!("CUDA: {gpus}"),
                            Err(why) => tracing::info!("CUDA: {why}: no GPU metadata"),
                        }
                    }
                    self.probed += 1;
                    tracing::info!("CUDA: {n} probes on {} for pid {pid}", driver.display());
                }
                Err(e) => {
                    self.failures += 1;
                    let message =
                        format!("CUDA: pid {pid}: {e:#}; its GPU launches are not traced");
                    tracing::warn!("{message}");
                    self.last_failure = Some(message);
                }
            }
        }
    }

    fn probe(
        &mut self,
        pid: u32,
        driver: &Path,
        kernel: &mut KernelCapture,
    ) -> anyhow::Result<usize> {
        let meta = std::fs::metadata(driver)?;
        let key = (meta.dev(), meta.ino());
        if !self.sites.contains_key(&key) {
            let sites = cuda::probe_sites_of(driver)?;
            report_costs(driver, &sites, self.options.skip_single_stepped);
            self.sites.insert(key, sites);
        }
        let chosen: Vec<ProbeSite> = self.sites[&key]
            .iter()
            .filter(|s| !(self.options.skip_single_stepped && s.cost.is_expensive()))
            .cloned()
            .collect();
        kernel.probe_cuda(pid, driver, &chosen)
    }
}

/// Say what the probes of a driver will cost, once per driver file.
fn report_costs(driver: &Path, sites: &[ProbeSite], skipping: bool) {
    let expensive: Vec<String> = sites
        .iter()
        .filter_map(|s| match &s.cost {
            cuda::SiteCost::SingleStepped(why) => Some(format!("{} ({why})", s.symbol)),
            cuda::SiteCost::Emulated(_) => None,
        })
        .collect();
    if expensive.is_empty() {
        tracing::info!(
            "CUDA: {}: {} probe sites, all emulated by the kernel (about a microsecond per call)",
            driver.display(),
            sites.len()
        );
    } else if skipping {
        tracing::warn!(
            "CUDA: {}: leaving out {} sites that would be single-stepped: {}",
            driver.display(),
            expensive.len(),
            expensive.join(", ")
        );
    } else {
        tracing::warn!(
            "CUDA: {}: {} of {} probe sites must be single-stepped, tens of microseconds per \
             call each: {}; pass --cuda-skip-single-stepped to leave them out",
            driver.display(),
            expensive.len(),
            sites.len(),
            expensive.join(", ")
        );
    }
}
