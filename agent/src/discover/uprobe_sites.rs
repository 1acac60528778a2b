//! Where to attach uprobes in a library that a traced process maps: the library's file (from
//! the process's maps, read through `/proc/PID/root` so that a path inside a container
//! resolves), the file offsets of the functions probed (exported ones, or static ones from
//! the full symbol table of a library that kept it), and what a uprobe on each will cost.
//!
//! A uprobe's cost depends on the first instruction of its site: the kernel emulates a `push`,
//! a no-op or a relative jump or call (about a microsecond per hit on this machine kind), and
//! single-steps anything else out of line (tens of microseconds per hit, DESIGN.md). Sites are
//! decoded and classified before anything is attached, so that the cost can be reported and a
//! site skipped.
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

/// The path (as the process sees it) of the first library mapped whose file name starts with
/// `prefix`, from the text of its `/proc/PID/maps`.
pub fn mapped_library<'a>(maps: &'a str, prefix: &str) -> Option<&'a str> {
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
}

/// The library of process `pid` whose file name starts with `prefix`, as a path this process
/// can open; None when the process has not loaded it (yet: callers look again).
pub fn library_of(pid: u32, prefix: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let path = mapped_library(&maps, prefix)?;
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

/// Which of a library's symbol tables names the functions probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Symbols {
    /// The dynamic symbols: exported functions, there in every build.
    Exported,
    /// The full table (`.symtab`), static functions included: only in a file not stripped.
    All,
}

/// One place to attach a uprobe: an exported function (a variant of it) and its file offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    /// The function probed (for a library that exports variants, their base name).
    pub function: &'static str,
    /// The exported name (a variant of it).
    pub symbol: String,
    /// Offset of its first instruction in the file (what a uprobe attaches to).
    pub file_offset: u64,
    pub cost: SiteCost,
}

#[derive(Debug, thiserror::Error)]
pub enum SitesError {
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not an ELF shared object infertrace can read: {1}")]
    Elf(PathBuf, object::Error),
    #[error("{0} does not export {1}")]
    Missing(PathBuf, &'static str),
    #[error("{0} has no symbol {1} (a stripped build)")]
    MissingLocal(PathBuf, &'static str),
}

/// The probe sites of the library at `path` ([`sites`] of its bytes); an error when it has
/// none (`missing` says what it lacks).
pub fn sites_of(
    path: &Path,
    symbols: Symbols,
    probed: impl Fn(&str) -> Option<&'static str>,
    missing: &'static str,
) -> Result<Vec<ProbeSite>, SitesError> {
    let bytes = std::fs::read(path).map_err(|e| SitesError::Read(path.to_owned(), e))?;
    let sites = sites(&bytes, symbols, probed).map_err(|e| SitesError::Elf(path.to_owned(), e))?;
    if sites.is_empty() {
        return Err(match symbols {
            Symbols::Exported => SitesError::Missing(path.to_owned(), missing),
            Symbols::All => SitesError::MissingLocal(path.to_owned(), missing),
        });
    }
    Ok(sites)
}

/// The probe sites of a library's bytes: every function defined in it, named in the
/// `symbols` table, that `probed` maps to a probed function's name, once per address
/// (versioned aliases share one).
pub fn sites(
    elf: &[u8],
    symbols: Symbols,
    probed: impl Fn(&str) -> Option<&'static str>,
) -> Result<Vec<ProbeSite>, object::Error> {
    let file = object::File::parse(elf)?;
    let table = match symbols {
        Symbols::Exported => file.dynamic_symbols(),
        Symbols::All => file.symbols(),
    };
    let mut sites: Vec<ProbeSite> = Vec::new();
    for symbol in table {
        let (Ok(name), true) = (symbol.name(), symbol.is_definition()) else {
            continue;
        };
        let Some(function) = probed(name) else {
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
    fn a_library_is_found_in_maps_by_file_name() {
        let maps = "\
7f0000000000-7f0000001000 r-xp 00000000 fd:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 r-xp 00010000 fd:01 456 /venv/site-packages/pyzmq.libs/libzmq-2f02442c.so.5.2.5
";
        assert_eq!(
            mapped_library(maps, "libzmq"),
            Some("/venv/site-packages/pyzmq.libs/libzmq-2f02442c.so.5.2.5")
        );
        assert_eq!(mapped_library(maps, "libcuda.so"), None);
        assert_eq!(mapped_library("", "libzmq"), None);
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
}
