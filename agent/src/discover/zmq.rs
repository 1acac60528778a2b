//! libzmq in an engine process, and where its `zmq_msg_send` starts: the probe that times the
//! application's hand-over of each message (ebpf/src/zmq.rs).
//!
//! pyzmq's wheels carry their own copy (`pyzmq.libs/libzmq-<hash>.so.5`), a distribution's
//! pyzmq links the system's `libzmq.so.5`: either way the process's maps name it. pyzmq sends
//! every message part through `zmq_msg_send` (its Cython backend imports no other send).
use std::path::{Path, PathBuf};

use super::uprobe_sites::{self, ProbeSite, SitesError, Symbols};

/// What libzmq's file name starts with.
const LIBZMQ_PREFIX: &str = "libzmq";
/// The function probed.
const SEND: &str = "zmq_msg_send";

/// libzmq as process `pid` maps it, as a path this process can open; None when it has not
/// loaded it (yet).
pub fn libzmq_of(pid: u32) -> Option<PathBuf> {
    uprobe_sites::library_of(pid, LIBZMQ_PREFIX)
}

/// The probe site of `zmq_msg_send` in libzmq's bytes.
pub fn send_sites(elf: &[u8]) -> Result<Vec<ProbeSite>, object::Error> {
    uprobe_sites::sites(elf, Symbols::Exported, is_send)
}

fn is_send(name: &str) -> Option<&'static str> {
    (name == SEND).then_some(SEND)
}

/// The probe site of `zmq_msg_send` in the library at `path`.
pub fn send_sites_of(path: &Path) -> Result<Vec<ProbeSite>, SitesError> {
    uprobe_sites::sites_of(path, Symbols::Exported, is_send, SEND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(send_sites(b"not an elf").is_err());
        assert!(matches!(
            send_sites_of(Path::new("/nonexistent/libzmq.so.5")),
            Err(SitesError::Read(..))
        ));
    }
}
