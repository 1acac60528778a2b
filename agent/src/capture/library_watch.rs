//! Which traced processes have loaded a library that infertrace probes, and probing them when
//! they do.
//!
//! Engines load libraries late (vLLM's EngineCore and workers load the CUDA driver when torch
//! first touches the GPU, seconds after they started; a process spawned after attach imports
//! pyzmq when it gets to it), so a traced process without the library is looked at again, with
//! a growing interval, until it has it. Each library file is read once: its probe sites, and
//! what a uprobe on each costs, are kept per file.
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::kernel::{KernelCapture, ProbedLibrary};
use crate::discover::{
    procfs,
    uprobe_sites::{ProbeSite, SiteCost},
};

/// First and longest wait before looking at a process's maps again.
const FIRST_LOOK: Duration = Duration::from_millis(250);
const LONGEST_LOOK: Duration = Duration::from_secs(64);

/// One library the agent probes: how to find it, its sites, and which of them to attach.
pub trait Probed {
    /// Names it in logs.
    const NAME: &'static str;
    /// What to pass to leave its expensive (single-stepped) sites out, for the cost report.
    const REMEDY: &'static str;
    const LIBRARY: ProbedLibrary;
    /// Whether to leave it alone.
    fn off(&self) -> bool;
    /// Whether process `pid` can need the probes at all; when not, it is not looked at again
    /// (reading a big process's maps costs milliseconds).
    fn wanted(_pid: u32) -> bool {
        true
    }
    /// The library as process `pid` maps it, when it does.
    fn find(pid: u32) -> Option<PathBuf>;
    /// Its probe sites (read once per file).
    fn sites(path: &Path) -> anyhow::Result<Vec<ProbeSite>>;
    /// Whether to leave out the sites the kernel must single-step.
    fn skips_expensive(&self) -> bool {
        false
    }
    /// Of a file's sites, those to attach; says once per file what they will cost.
    fn choose(&self, path: &Path, sites: &[ProbeSite]) -> Vec<ProbeSite> {
        let skipping = self.skips_expensive();
        report_costs(Self::NAME, path, sites, skipping, Self::REMEDY);
        sites
            .iter()
            .filter(|s| !(skipping && s.cost.is_expensive()))
            .cloned()
            .collect()
    }
    /// Attach to `sites` of `path` for `pid`; how many probes.
    fn attach(
        kernel: &mut KernelCapture,
        pid: u32,
        path: &Path,
        sites: &[ProbeSite],
    ) -> anyhow::Result<usize>;
    /// Called once, when the first process gets its probes.
    fn first_probed(&self) {}
}

/// A traced process whose library is not probed yet.
struct Waiting {
    next_look: Instant,
    interval: Duration,
    /// The process's address-space size at the last look. Loading a library maps it, which
    /// changes the size: while the size stays the same the maps need not be read again
    /// (reading them formats every mapping's path, milliseconds for a torch process).
    size_at_last_look: Option<u64>,
}

pub struct LibraryWatch<L> {
    library: L,
    waiting: HashMap<u32, Waiting>,
    /// Sites to attach per library file (device, inode).
    sites: HashMap<(u64, u64), Vec<ProbeSite>>,
    /// Processes with probes attached.
    pub probed: u64,
    /// Probe attachments that failed (logged), and the last one's message.
    pub failures: u64,
    pub last_failure: Option<String>,
}

impl<L: Probed> LibraryWatch<L> {
    pub fn new(library: L) -> Self {
        Self {
            library,
            waiting: HashMap::new(),
            sites: HashMap::new(),
            probed: 0,
            failures: 0,
            last_failure: None,
        }
    }

    /// A traced process (new, or one that replaced its program): look for its library.
    pub fn watch(&mut self, pid: u32) {
        if !self.library.off() {
            self.waiting.insert(
                pid,
                Waiting {
                    next_look: Instant::now(),
                    interval: FIRST_LOOK,
                    size_at_last_look: None,
                },
            );
        }
    }

    /// A process exited or replaced its program: its probes go.
    pub fn forget(&mut self, pid: u32, kernel: &mut KernelCapture) {
        self.waiting.remove(&pid);
        kernel.unprobe(pid, L::LIBRARY);
    }

    /// Look at the processes that are due; probe those that now have the library.
    pub fn look(&mut self, kernel: &mut KernelCapture) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.next_look <= now)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in due {
            if !L::wanted(pid) {
                self.waiting.remove(&pid);
                continue;
            }
            let Some(waiting) = self.waiting.get_mut(&pid) else {
                continue;
            };
            let size = procfs::address_space_size(pid);
            let unchanged = size.is_some() && size == waiting.size_at_last_look;
            let found = if unchanged { None } else { L::find(pid) };
            let Some(path) = found else {
                waiting.size_at_last_look = size;
                waiting.next_look = now + waiting.interval;
                waiting.interval = (waiting.interval * 2).min(LONGEST_LOOK);
                continue;
            };
            self.waiting.remove(&pid);
            match self.probe(pid, &path, kernel) {
                Ok(n) => {
                    if self.probed == 0 {
                        self.library.first_probed();
                    }
                    self.probed += 1;
                    tracing::info!(
                        "{}: {n} probes on {} for pid {pid}",
                        L::NAME,
                        path.display()
                    );
                }
                Err(e) => {
                    self.failures += 1;
                    let message = format!("{}: pid {pid}: {e:#}; not probed", L::NAME);
                    tracing::warn!("{message}");
                    self.last_failure = Some(message);
                }
            }
        }
    }

    fn probe(
        &mut self,
        pid: u32,
        path: &Path,
        kernel: &mut KernelCapture,
    ) -> anyhow::Result<usize> {
        let meta = std::fs::metadata(path)?;
        let key = (meta.dev(), meta.ino());
        if !self.sites.contains_key(&key) {
            let sites = L::sites(path)?;
            let chosen = self.library.choose(path, &sites);
            self.sites.insert(key, chosen);
        }
        L::attach(kernel, pid, path, &self.sites[&key])
    }
}

/// Say what the probes of a library will cost, once per file.
fn report_costs(what: &str, path: &Path, sites: &[ProbeSite], skipping: bool, remedy: &str) {
    let expensive: Vec<String> = sites
        .iter()
        .filter_map(|s| match &s.cost {
            SiteCost::SingleStepped(why) => Some(format!("{} ({why})", s.symbol)),
            SiteCost::Emulated(_) => None,
        })
        .collect();
    if expensive.is_empty() {
        tracing::info!(
            "{what}: {}: {} probe sites, all emulated by the kernel (about a microsecond per call)",
            path.display(),
            sites.len()
        );
    } else if skipping {
        tracing::warn!(
            "{what}: {}: leaving out {} sites that would be single-stepped: {}",
            path.display(),
            expensive.len(),
            expensive.join(", ")
        );
    } else {
        tracing::warn!(
            "{what}: {}: {} of {} probe sites must be single-stepped, tens of microseconds per \
             call each: {}{remedy}",
            path.display(),
            expensive.len(),
            sites.len(),
            expensive.join(", ")
        );
    }
}
