//! libzmq as a probed library (capture/library_watch.rs): `zmq_msg_send` in traced processes,
//! whose returns time the application's hand-over of each message (engines/common/send_probe.rs).
use std::path::{Path, PathBuf};

use super::{
    kernel::{KernelCapture, ProbedLibrary},
    library_watch::{LibraryWatch, Probed},
};
use crate::discover::{uprobe_sites::ProbeSite, zmq};

/// `off`: leave libzmq alone (`--no-zmq-probe`).
pub struct Libzmq {
    pub off: bool,
}

pub type ZmqWatch = LibraryWatch<Libzmq>;

impl Probed for Libzmq {
    const NAME: &'static str = "libzmq";
    // A send is one hit per message: even single-stepped, a few tens of microseconds per
    // message, which `--no-zmq-probe` avoids.
    const REMEDY: &'static str = "; pass --no-zmq-probe to leave them out";
    const LIBRARY: ProbedLibrary = ProbedLibrary::Libzmq;

    fn off(&self) -> bool {
        self.off
    }

    fn find(pid: u32) -> Option<PathBuf> {
        zmq::libzmq_of(pid)
    }

    fn sites(path: &Path) -> anyhow::Result<Vec<ProbeSite>> {
        Ok(zmq::send_sites_of(path)?)
    }

    fn attach(
        kernel: &mut KernelCapture,
        pid: u32,
        path: &Path,
        sites: &[ProbeSite],
    ) -> anyhow::Result<usize> {
        kernel.probe_zmq(pid, path, sites)
    }
}
