//! Which traced processes have loaded a library that infertrace probes, and probing them when
//! they do.
//!
//! Engines load libraries late (vLLM's EngineCore and workers load the CUDA driver when torch
//! first touches the GPU, seconds after they started; a process spawned after attach imports
//! pyzmq when it gets to it). A traced process without the library is looked at when it
//! starts being watched, and again when the kernel reports that it mapped a file executable
//! (`ebpf/src/mmap.rs`: a library being loaded), at most every [`LOADING_LOOK`] while it loads
//! many; otherwise only after [`FALLBACK_LOOK`], in case a report was lost, each such look
//! waiting twice as long as the one before (up to [`LONGEST_FALLBACK_LOOK`]). Reading a torch
//! process's maps costs milliseconds: re-reading them on a timer was a tenth of the agent's
//! CPU in the first minute after attach, and looks every minute were 6 % of its CPU in a
//! 90-second SGLang load (BENCHMARKS.md). Each library file is read once: its probe sites, and
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

/// Shortest wait between two looks at a process that is loading libraries.
const LOADING_LOOK: Duration = Duration::from_millis(250);
/// Wait before looking at a process again when it reported no library load; it doubles
/// after each such look that found nothing, up to [`LONGEST_FALLBACK_LOOK`]. Only a lost
/// report (a full ring buffer, counted) makes one find anything.
const FALLBACK_LOOK: Duration = Duration::from_secs(64);
const LONGEST_FALLBACK_LOOK: Duration = Duration::from_secs(1024);

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
    last_look: Option<Instant>,
    /// The kernel reported a library load since the last look.
    loaded: bool,
    /// The process's address-space size at the last look. Loading a library maps it, which
    /// changes the size: a fallback look reads the maps only when the size changed (reading
    /// them formats every mapping's path).
    size_at_last_look: Option<u64>,
    /// The wait before the next fallback look.
    fallback: Duration,
}

impl Waiting {
    /// Watched from `now`: due at once.
    fn new(now: Instant) -> Self {
        Self {
            next_look: now,
            last_look: None,
            loaded: false,
            size_at_last_look: None,
            fallback: FALLBACK_LOOK,
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.next_look <= now
    }

    /// The kernel reported a library load: look soon, but not sooner than [`LOADING_LOOK`]
    /// after the last look (a process loading many libraries reports each).
    fn library_loaded(&mut self, now: Instant) {
        self.loaded = true;
        let soonest = self.last_look.map_or(now, |at| at + LOADING_LOOK);
        self.next_look = self.next_look.min(soonest);
    }

    /// Whether a look must read the maps, given the address-space size now: after a reported
    /// load always, on a fallback look only when the size changed.
    fn must_read_maps(&self, size: Option<u64>) -> bool {
        self.loaded || size.is_none() || size != self.size_at_last_look
    }

    /// A look that did not find the library. After a reported load the fallback starts
    /// over; after a fallback look it doubles.
    fn not_found(&mut self, now: Instant, size: Option<u64>) {
        self.fallback = if self.loaded || self.last_look.is_none() {
            FALLBACK_LOOK
        } else {
            (self.fallback * 2).min(LONGEST_FALLBACK_LOOK)
        };
        self.size_at_last_look = size;
        self.last_look = Some(now);
        self.loaded = false;
        self.next_look = now + self.fallback;
    }
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
            self.waiting.insert(pid, Waiting::new(Instant::now()));
        }
    }

    /// Process `pid` mapped a file executable: look at it soon, if it is still waiting.
    pub fn loaded(&mut self, pid: u32) {
        if let Some(waiting) = self.waiting.get_mut(&pid) {
            waiting.library_loaded(Instant::now());
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
            .filter(|(_, w)| w.due(now))
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
            let found = if waiting.must_read_maps(size) {
                L::find(pid)
            } else {
                None
            };
            let Some(path) = found else {
                waiting.not_found(now, size);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_looked_at_when_watched_then_after_each_reported_load_or_the_fallback() {
        let start = Instant::now();
        let mut w = Waiting::new(start);
        assert!(w.due(start));
        assert!(w.must_read_maps(Some(100)));
        w.not_found(start, Some(100));
        // Nothing reported: not before the fallback, and then only if the size changed.
        assert!(!w.due(start + FALLBACK_LOOK - Duration::from_millis(1)));
        assert!(w.due(start + FALLBACK_LOOK));
        assert!(!w.must_read_maps(Some(100)));
        assert!(w.must_read_maps(Some(200)));
        assert!(w.must_read_maps(None));
        // A load reported right after a look waits out LOADING_LOOK; more loads do not hurry
        // it; the look then reads the maps even if the size is back where it was.
        let reported = start + Duration::from_millis(10);
        w.library_loaded(reported);
        w.library_loaded(reported + Duration::from_millis(5));
        assert!(!w.due(start + LOADING_LOOK - Duration::from_millis(1)));
        assert!(w.due(start + LOADING_LOOK));
        assert!(w.must_read_maps(Some(100)));
        let second = start + LOADING_LOOK;
        w.not_found(second, Some(100));
        assert!(!w.must_read_maps(Some(100)));
        // A load reported long after the last look is looked at at once.
        let later = second + Duration::from_secs(5);
        w.library_loaded(later);
        assert!(w.due(later));
    }

    #[test]
    fn fallback_looks_that_find_nothing_wait_twice_as_long_each_until_a_load_is_reported() {
        let mut at = Instant::now();
        let mut w = Waiting::new(at);
        w.not_found(at, Some(100));
        let mut waits = Vec::new();
        for _ in 0..7 {
            let next = (1..=2048)
                .map(|s| at + Duration::from_secs(s))
                .find(|&t| w.due(t))
                .unwrap();
            waits.push((next - at).as_secs());
            at = next;
            w.not_found(at, Some(100));
        }
        assert_eq!(waits, [64, 128, 256, 512, 1024, 1024, 1024]);
        // A reported load (looked at once: the last look is long past) starts it over.
        let looked = at + Duration::from_secs(1);
        w.library_loaded(looked);
        assert!(w.due(looked));
        w.not_found(looked, Some(100));
        assert!(w.due(looked + FALLBACK_LOOK));
        assert!(!w.due(looked + FALLBACK_LOOK - Duration::from_millis(1)));
    }
}
