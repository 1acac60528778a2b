//! The CUDA driver library of an engine process, and where in it each driver entry point that
//! infertrace probes starts, with what a uprobe there will cost.
//!
//! torch links libcudart dynamically, and cuBLAS and Triton call the driver directly, so the
//! probes go on the driver, `libcuda.so.1` (DESIGN.md). A process may map its own copy (a
//! container's driver mount, a test's stand-in), so the library comes from that process's maps,
//! and is read through `/proc/PID/root` so that a path inside a container resolves.
//!
//! Entry points come in variants: `_v2`/`_v3` (newer ABI under a new name) and `_ptsz`/`_ptds`
//! (per-thread default stream), and `cuGetProcAddress` hands out any of them, so every variant
//! the library exports is a site. A uprobe's cost depends on the first instruction of its site:
//! the kernel emulates a `push`, a no-op or a relative jump or call (about a microsecond per hit
//! on this machine kind), and single-steps anything else out of line (tens of microseconds per
//! hit, DESIGN.md), which a launch-heavy step would feel. Sites are decoded and classified
//! before anything is attached, so that the cost can be reported and a site skipped.
use std::path::{Path, PathBuf};

pub use super::uprobe_sites::ProbeSite;
use super::uprobe_sites::{self, SitesError, Symbols};

/// What the driver library's file name starts with (`libcuda.so.1`, `libcuda.so.550.54.15`).
const DRIVER_PREFIX: &str = "libcuda.so";

/// The driver entry points probed: launches, graph launches, the synchronisations that end a
/// step, the copies that bring sampled tokens back, and the lookups that name kernels.
pub const PROBED_FUNCTIONS: &[&str] = &[
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuGraphLaunch",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuCtxSynchronize",
    "cuEventRecord",
    "cuMemcpyDtoHAsync",
    "cuMemcpyAsync",
    "cuModuleGetFunction",
    "cuLibraryGetKernel",
    "cuKernelGetFunction",
    "cuFuncGetName",
];

/// Suffixes a driver entry point's variants carry after its base name.
const VARIANT_SUFFIXES: &[&str] = &["", "_v2", "_v3", "_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds"];

/// The path (as the process sees it) of the CUDA driver library mapped in a process, from the
/// text of its `/proc/PID/maps`.
pub fn driver_in_maps(maps: &str) -> Option<&str> {
    uprobe_sites::mapped_library(maps, DRIVER_PREFIX)
}

/// The driver library of process `pid`, as a path this process can open; None when the process
/// has not loaded it (yet: a process may load it after attach, so callers look again).
pub fn driver_of(pid: u32) -> Option<PathBuf> {
    uprobe_sites::library_of(pid, DRIVER_PREFIX)
}

/// The probe sites of a driver library's bytes: every exported variant of every probed
/// function that is defined in it, once per address (versioned aliases share one).
pub fn probe_sites(elf: &[u8]) -> Result<Vec<ProbeSite>, object::Error> {
    uprobe_sites::sites(elf, Symbols::Exported, probed_function)
}

/// The probe sites of the driver library at `path`.
pub fn probe_sites_of(path: &Path) -> Result<Vec<ProbeSite>, SitesError> {
    uprobe_sites::sites_of(
        path,
        Symbols::Exported,
        probed_function,
        "any of the CUDA driver functions infertrace probes",
    )
}

/// The probed function `name` is a variant of.
fn probed_function(name: &str) -> Option<&'static str> {
    PROBED_FUNCTIONS.iter().copied().find(|base| {
        name.strip_prefix(base)
            .is_some_and(|suffix| VARIANT_SUFFIXES.contains(&suffix))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_is_found_in_maps_by_file_name() {
        let maps = "\
7f0000000000-7f0000001000 r-xp 00000000 fd:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 r-xp 00010000 fd:01 456 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
7f0000006000-7f0000007000 r-xp 00000000 fd:01 789 /opt/libcudart.so.12
";
        assert_eq!(
            driver_in_maps(maps),
            Some("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
        );
        assert_eq!(
            driver_in_maps("7f-8f r-xp 0 fd:01 1 /lib/libcudart.so.12\n"),
            None
        );
        assert_eq!(driver_in_maps(""), None);
    }

    #[test]
    fn variants_map_to_their_function() {
        assert_eq!(probed_function("cuLaunchKernel"), Some("cuLaunchKernel"));
        assert_eq!(
            probed_function("cuLaunchKernel_ptsz"),
            Some("cuLaunchKernel")
        );
        assert_eq!(
            probed_function("cuLaunchKernelEx_ptsz"),
            Some("cuLaunchKernelEx")
        );
        assert_eq!(
            probed_function("cuMemcpyDtoHAsync_v2"),
            Some("cuMemcpyDtoHAsync")
        );
        assert_eq!(probed_function("cuGraphLaunch_ptsz"), Some("cuGraphLaunch"));
        assert_eq!(probed_function("cuLaunchKernelFoo"), None);
        assert_eq!(probed_function("cuMemAlloc_v2"), None);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(probe_sites(b"not an elf").is_err());
        assert!(probe_sites(&[0x7f, b'E', b'L', b'F', 2, 1, 1]).is_err());
    }
}
