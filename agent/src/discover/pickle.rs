//! CPython's pickle accelerator in a Python process, and where its `pickle.dumps` starts: the
//! probe that times the start of SGLang's dispatch of each request (ebpf/src/pickle.rs).
//!
//! `pickle.dumps` is `_pickle.dumps`, implemented by the static C function `_pickle_dumps`:
//! in the `_pickle` extension module (`lib-dynload/_pickle.cpython-*.so`) of a shared build,
//! or in libpython when the module is built in. A static function is named only in the full
//! symbol table, which a stripped build (most distributions' packages) does not keep: there
//! the probe has no site, and the dispatch start stays unknown.
use std::path::{Path, PathBuf};

use super::uprobe_sites::{self, ProbeSite, SitesError, Symbols};

/// What the extension module's file name starts with, and libpython's.
const MODULE_PREFIX: &str = "_pickle.";
const LIBPYTHON_PREFIX: &str = "libpython3";
/// The function probed.
const DUMPS: &str = "_pickle_dumps";

/// The library of process `pid` that holds `pickle.dumps`, as a path this process can open:
/// the `_pickle` module when it is mapped, else libpython when the module is built into it;
/// None when neither is (yet: a process traced from its exec imports pickle later).
pub fn library_of(pid: u32) -> Option<PathBuf> {
    uprobe_sites::library_of(pid, MODULE_PREFIX).or_else(|| {
        uprobe_sites::library_of(pid, LIBPYTHON_PREFIX).filter(|path| builds_in_pickle(path))
    })
}

/// Whether a libpython has the `_pickle` module built in (it names `_pickle_dumps`), read once
/// per file (a process is looked at again until it imports the module).
fn builds_in_pickle(path: &Path) -> bool {
    use std::{
        collections::HashMap,
        os::unix::fs::MetadataExt as _,
        sync::{Mutex, OnceLock},
    };
    static KNOWN: OnceLock<Mutex<HashMap<(u64, u64), bool>>> = OnceLock::new();
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let mut known = KNOWN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *known
        .entry((meta.dev(), meta.ino()))
        .or_insert_with(|| dumps_sites_of(path).is_ok_and(|sites| !sites.is_empty()))
}

/// The probe site of `_pickle_dumps` in a library's bytes.
pub fn dumps_sites(elf: &[u8]) -> Result<Vec<ProbeSite>, object::Error> {
    uprobe_sites::sites(elf, Symbols::All, is_dumps)
}

fn is_dumps(name: &str) -> Option<&'static str> {
    (name == DUMPS).then_some(DUMPS)
}

/// The probe site of `_pickle_dumps` in the library at `path`.
pub fn dumps_sites_of(path: &Path) -> Result<Vec<ProbeSite>, SitesError> {
    uprobe_sites::sites_of(path, Symbols::All, is_dumps, DUMPS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(dumps_sites(b"not an elf").is_err());
        assert!(matches!(
            dumps_sites_of(Path::new("/nonexistent/_pickle.so")),
            Err(SitesError::Read(..))
        ));
    }
}
