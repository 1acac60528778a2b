//! The CUDA driver as a probed library (capture/library_watch.rs): `libcuda.so.1` in traced
//! processes, its launch, synchronisation and lookup entry points, and what probing them costs.
use std::path::{Path, PathBuf};

use super::{
    kernel::{KernelCapture, ProbedLibrary},
    library_watch::{LibraryWatch, Probed},
};
use crate::discover::{cuda, uprobe_sites::ProbeSite};

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

pub struct CudaDriver(pub CudaOptions);

pub type CudaWatch = LibraryWatch<CudaDriver>;

impl Probed for CudaDriver {
    const NAME: &'static str = "CUDA";
    const REMEDY: &'static str = "; pass --cuda-skip-single-stepped to leave them out";
    const LIBRARY: ProbedLibrary = ProbedLibrary::CudaDriver;

    fn off(&self) -> bool {
        self.0.off
    }

    fn find(pid: u32) -> Option<PathBuf> {
        cuda::driver_of(pid)
    }

    fn sites(path: &Path) -> anyhow::Result<Vec<ProbeSite>> {
        Ok(cuda::probe_sites_of(path)?)
    }

    fn skips_expensive(&self) -> bool {
        self.0.skip_single_stepped
    }

    fn attach(
        kernel: &mut KernelCapture,
        pid: u32,
        driver: &Path,
        sites: &[ProbeSite],
    ) -> anyhow::Result<usize> {
        kernel.probe_cuda(pid, driver, sites)
    }

    fn first_probed(&self) {
        match crate::discover::gpu::describe() {
            Ok(gpus) => tracing::info!("CUDA: {gpus}"),
            Err(why) => tracing::info!("CUDA: {why}: no GPU metadata"),
        }
    }
}
