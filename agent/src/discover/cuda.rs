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

use object::{Object, ObjectSegment, ObjectSymbol};

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

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not an ELF shared object infertrace can read: {1}")]
    Elf(PathBuf, object::Error),
    #[error("{0} exports none of the CUDA driver functions infertrace probes")]
    NoDriverFunctions(PathBuf),
}

/// The path (as the process sees it) of the CUDA driver library mapped in a process, from the
/// text of its `/proc/PID/maps`.
pub fn driver_in_maps(maps: &str) -> Option<&str> {
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(DRIVER_PREFIX))
        })
}

/// The driver library of process `pid`, as a path this process can open; None when the process
/// has not loaded it (yet: a process may load it after attach, so callers look again).
pub fn driver_of(pid: u32) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let path = driver_in_maps(&maps)?;
    Some(PathBuf::from(format!("/proc/{pid}/root{path}")))
}

/// What a uprobe on a site costs, from its first instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiteCost {
    /// The kernel emulates the instruction: about a microsecond per hit here.
    Emulated(&'static str),
    /// The instruction is copied and single-stepped: tens of microseconds per hit here.
    SingleStepped(String),
}

impl SiteCost {
    pub fn is_expensive(&self) -> bool {
        matches!(self, SiteCost::SingleStepped(_))
    }
}

/// One place to attach a uprobe: a driver function's variant and its file offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    /// The base name in [`PROBED_FUNCTIONS`].
    pub function: &'static str,
    /// The exported name (a variant of it).
    pub symbol: String,
    /// Offset of its first instruction in the file (what a uprobe attaches to).
    pub file_offset: u64,
    pub cost: SiteCost,
}

/// The probe sites of a driver library's bytes: every exported variant of every probed
/// function that is defined in it, once per address (versioned aliases share one).
pub fn probe_sites(elf: &[u8]) -> Result<Vec<ProbeSite>, object::Error> {
    let file = object::File::parse(elf)?;
    let mut sites: Vec<ProbeSite> = Vec::new();
    for symbol in file.dynamic_symbols() {
        let (Ok(name), true) = (symbol.name(), symbol.is_definition()) else {
            continue;
        };
        let Some(function) = probed_function(name) else {
            continue;
        };
        let Some(file_offset) = file_offset(&file, symbol.address()) else {
            continue;
        };
        if sites.iter().any(|s| s.file_offset == file_offset) {
            continue;
        }
        let code = usize::try_from(file_offset)
            .ok()
            .and_then(|at| elf.get(at..))
            .unwrap_or_default();
        sites.push(ProbeSite {
            function,
            symbol: name.to_owned(),
            file_offset,
            cost: first_instruction_cost(code),
        });
    }
    sites.sort_by(|a, b| (a.function, &a.symbol).cmp(&(b.function, &b.symbol)));
    Ok(sites)
}

/// The probe sites of the driver library at `path`.
pub fn probe_sites_of(path: &Path) -> Result<Vec<ProbeSite>, CudaError> {
    let bytes = std::fs::read(path).map_err(|e| CudaError::Read(path.to_owned(), e))?;
    let sites = probe_sites(&bytes).map_err(|e| CudaError::Elf(path.to_owned(), e))?;
    if sites.is_empty() {
        return Err(CudaError::NoDriverFunctions(path.to_owned()));
    }
    Ok(sites)
}

/// The probed function `name` is a variant of.
fn probed_function(name: &str) -> Option<&'static str> {
    PROBED_FUNCTIONS.iter().copied().find(|base| {
        name.strip_prefix(base)
            .is_some_and(|suffix| VARIANT_SUFFIXES.contains(&suffix))
    })
}

/// The file offset of virtual address `address`, through the loadable segment holding it.
pub(crate) fn file_offset(file: &object::File, address: u64) -> Option<u64> {
    file.segments().find_map(|segment| {
        let (offset, size) = segment.file_range();
        let start = segment.address();
        (start..start + size)
            .contains(&address)
            .then(|| address - start + offset)
    })
}

/// Classify a site by its first x86-64 instruction, as the kernel's uprobe code treats it
/// (arch/x86/kernel/uprobes.c: `push` of a register, no-ops and relative jumps and calls are
/// emulated; the rest is single-stepped out of line).
fn first_instruction_cost(code: &[u8]) -> SiteCost {
    match code {
        [0x50..=0x57, ..] => SiteCost::Emulated("push"),
        [0x41, 0x50..=0x57, ..] => SiteCost::Emulated("push"),
        [0x90, ..] => SiteCost::Emulated("nop"),
        [0x0f, 0x1f, ..] => SiteCost::Emulated("nop"),
        [0x66, 0x0f, 0x1f, ..] => SiteCost::Emulated("nop"),
        [0xe9, ..] | [0xeb, ..] => SiteCost::Emulated("jmp"),
        [0xe8, ..] => SiteCost::Emulated("call"),
        [] => SiteCost::SingleStepped("no code at the symbol".into()),
        [first, rest @ ..] => SiteCost::SingleStepped(format!(
            "first bytes {first:02x}{}",
            rest.iter()
                .take(3)
                .map(|b| format!(" {b:02x}"))
                .collect::<String>()
        )),
    }
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
    fn first_instructions_are_classified_as_the_kernel_treats_them() {
        assert_eq!(
            first_instruction_cost(&[0x55, 0x48]),
            SiteCost::Emulated("push")
        );
        assert_eq!(
            first_instruction_cost(&[0x41, 0x57]),
            SiteCost::Emulated("push")
        );
        let nop5 = [0x0f, 0x1f, 0x44, 0x00, 0x00];
        assert_eq!(first_instruction_cost(&nop5), SiteCost::Emulated("nop"));
        assert_eq!(
            first_instruction_cost(&[0xe9, 0, 0, 0, 0]),
            SiteCost::Emulated("jmp")
        );
        // mov %rdi,%rax and endbr64: single-stepped.
        let mov = first_instruction_cost(&[0x48, 0x89, 0xf8]);
        assert!(mov.is_expensive(), "{mov:?}");
        let endbr = first_instruction_cost(&[0xf3, 0x0f, 0x1e, 0xfa]);
        assert_eq!(
            endbr,
            SiteCost::SingleStepped("first bytes f3 0f 1e fa".into())
        );
        assert!(first_instruction_cost(&[]).is_expensive());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(probe_sites(b"not an elf").is_err());
        assert!(probe_sites(&[0x7f, b'E', b'L', b'F', 2, 1, 1]).is_err());
    }
}
