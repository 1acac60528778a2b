//! CPython's pickle accelerator as a probed library (capture/library_watch.rs): `pickle.dumps`
//! in SGLang's main processes and data-parallel controllers only, whose entries time the start
//! of each request's dispatch (engines/sglang/dispatch_start.rs): `api_server_dispatch` and
//! `dpc_dispatch`.
use std::path::{Path, PathBuf};

use super::{
    kernel::{KernelCapture, ProbedLibrary},
    library_watch::{LibraryWatch, Probed},
};
use crate::{
    discover::{engine, pickle, uprobe_sites::ProbeSite},
    engines,
};

/// `off`: leave `pickle.dumps` alone (`--no-pickle-probe`).
pub struct CpythonPickle {
    pub off: bool,
}

pub type PickleWatch = LibraryWatch<CpythonPickle>;

impl Probed for CpythonPickle {
    const NAME: &'static str = "pickle.dumps";
    // One hit per message main sends (and per request with msgpack IPC).
    const REMEDY: &'static str = "; pass --no-pickle-probe to leave it out";
    const LIBRARY: ProbedLibrary = ProbedLibrary::CpythonPickle;

    fn off(&self) -> bool {
        self.off
    }

    /// Only the processes whose engine says so (SGLang's main process and DP controller):
    /// elsewhere `pickle.dumps` marks nothing the agent uses. A process that becomes main does
    /// so by exec (`sglang.launch_server`), and is looked at again then; the processes main
    /// forks or spawns are its children by their ancestry from the start, and the DP
    /// controller retitles itself first thing.
    fn wanted(pid: u32) -> bool {
        engine::engine_role(pid)
            .is_some_and(|(engine, role)| engines::kind(&engine).probes_pickle(&role))
    }

    fn find(pid: u32) -> Option<PathBuf> {
        pickle::library_of(pid)
    }

    fn sites(path: &Path) -> anyhow::Result<Vec<ProbeSite>> {
        Ok(pickle::dumps_sites_of(path)?)
    }

    fn attach(
        kernel: &mut KernelCapture,
        pid: u32,
        path: &Path,
        sites: &[ProbeSite],
    ) -> anyhow::Result<usize> {
        kernel.probe_pickle(pid, path, sites)
    }
}
