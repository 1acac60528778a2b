//! CUDA driver discovery on a real ELF object loaded by a real process, without a GPU: the
//! driver STAND-IN (tests/fixtures/cuda/cuda_driver_stand_in.c, the real entry point names and
//! signatures, no driver behind them) is built here with the system C compiler as
//! `libcuda.so.1`, loaded into this test process with `dlopen`, found through this process's
//! maps and read through its `/proc/PID/root`, as the agent does for a target; every probed
//! entry point it exports becomes a site whose file offset holds the same bytes as the
//! function the dynamic linker resolved. No root needed.
use std::{ffi::CString, path::Path};

use infertrace::discover::cuda::{driver_of, probe_sites_of};
use infertrace_tests::{cuda, live::temp_dir};

#[test]
fn the_driver_stand_in_is_found_and_its_probe_sites_resolved() {
    let dir = temp_dir("cuda-discovery");
    let library = cuda::build(&dir).driver;
    let path = CString::new(library.to_str().expect("utf-8 path")).expect("no NUL");
    // SAFETY: dlopen of a library built above from our own source, whose constructors do nothing.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", library.display());

    // Found in this process's maps, and read through its /proc/PID/root as the agent would.
    let pid = std::process::id();
    let found = driver_of(pid).expect("libcuda.so.1 in this process's maps");
    let canonical = library.canonicalize().expect("canonical path");
    let expected = format!("/proc/{pid}/root{}", canonical.display());
    assert_eq!(found, Path::new(&expected));

    let sites = probe_sites_of(&found).expect("probe sites");
    let mut symbols: Vec<&str> = sites.iter().map(|s| s.symbol.as_str()).collect();
    symbols.sort_unstable();
    assert_eq!(
        symbols,
        [
            "cuCtxSynchronize",
            "cuEventRecord",
            "cuEventSynchronize",
            "cuFuncGetName",
            "cuGraphLaunch",
            "cuGraphLaunch_ptsz",
            "cuKernelGetFunction",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuLaunchKernel_ptsz",
            "cuLibraryGetKernel",
            "cuMemcpyAsync",
            "cuMemcpyDtoHAsync_v2",
            "cuModuleGetFunction",
            "cuStreamSynchronize",
        ],
        "every probed export is a site, cuInit is not"
    );

    let file = std::fs::read(&library).expect("library bytes");
    for site in &sites {
        let name = CString::new(site.symbol.as_str()).expect("no NUL");
        // SAFETY: dlsym on the live handle above, for a name it exports.
        let resolved = unsafe { libc::dlsym(handle, name.as_ptr()) };
        assert!(!resolved.is_null(), "dlsym {}", site.symbol);
        // SAFETY: the first 8 bytes of a function of the mapped library, readable code.
        let in_memory = unsafe { std::slice::from_raw_parts(resolved as *const u8, 8) };
        let at = site.file_offset as usize;
        assert_eq!(&file[at..at + 8], in_memory, "{} at {at:#x}", site.symbol);
        assert!(
            !site.cost.is_expensive(),
            "{}: {:?}",
            site.symbol,
            site.cost
        );
    }
}
