//! infertrace: rebuilds per-request spans and metrics of vLLM and SGLang from eBPF captures.
//!
//! Data flows through one module per stage (see DESIGN.md):
//! [`capture`] (kernel records, /proc answers, record/replay) -> [`discover`] (which processes
//! and sockets) -> [`decode`] (bytes to HTTP / ZMTP messages) -> [`export`] (console).
//! [`session`] wires the stages together for `attach`, `record` and `replay`.
pub mod capture;
pub mod decode;
pub mod discover;
pub mod doctor;
pub mod engines;
pub mod export;
pub mod pipeline;
pub mod routing;
pub mod session;
pub mod telemetry;
