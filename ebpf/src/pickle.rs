//! CPython's `pickle.dumps` in SGLang's main process: a uprobe on its entry.
//!
//! SGLang's main process serializes a request right after it stamps the start of its
//! `api_server_dispatch` stage, and serializes nothing it does not send: the entry marks the
//! start of the dispatch that no syscall shows (agent/src/engines/sglang/dispatch_start.rs). The
//! probe is attached for that process only; one record per call.
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::uprobe, programs::ProbeContext};
use infertrace_common::kind;

use crate::shared::{header, submit};

/// `_pickle_dumps(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)`.
#[uprobe]
pub fn pickle_dumps_enter(_ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    submit(&header(kind::PICKLE_DUMPS, tgid));
    0
}
