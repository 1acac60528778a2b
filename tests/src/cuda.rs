//! The CUDA driver STAND-IN and the step program (tests/fixtures/cuda), built with the system
//! C compiler for tests on machines without a GPU.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The stand-in driver library (`libcuda.so.1`) and the step program, built into `dir`.
pub struct CudaFixtures {
    pub driver: PathBuf,
    pub step_program: PathBuf,
}

pub fn build(dir: &Path) -> CudaFixtures {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/cuda/build.sh");
    let status = Command::new("sh")
        .arg(&script)
        .arg(dir)
        .status()
        .expect("running fixtures/cuda/build.sh (needs cc, the C compiler)");
    assert!(
        status.success(),
        "building the CUDA stand-in and step program"
    );
    CudaFixtures {
        driver: dir.join("libcuda.so.1"),
        step_program: dir.join("step_program"),
    }
}
