//! infertrace: rebuilds per-request spans and metrics of vLLM and SGLang from eBPF captures.
//!
//! Data flows through one module per stage, in this order: [`capture`] (kernel records, /proc
//! answers, record/replay) -> [`decode`] (one flow per (process, fd): HTTP, SSE, ZMTP, CUDA
//! steps, Python samples, log lines) -> [`pipeline`] and [`routing`] (each message to the engine
//! instance whose process tree it came from) -> [`engines`] (one folder per engine: wire format,
//! request tracking, spans, metrics, losses) -> [`telemetry`] (span model, clock, metrics
//! registry) -> [`export`] (console, JSONL, OTLP, Prometheus).
//!
//! [`session`] wires the stages together for `attach`, `record` and `replay`; [`discover`] finds
//! the engine processes, their roles and what to probe; [`doctor`] checks the host.
//! `docs/architecture.md` follows a byte through every stage.
pub mod capture;
pub mod config;
pub mod decode;
pub mod discover;
pub mod doctor;
pub mod engines;
pub mod export;
pub mod pipeline;
pub mod routing;
pub mod session;
pub mod telemetry;

/// The hash maps of the per-record path: foldhash, not the standard library's SipHash (keys
/// are pids, fds, rids and metric series, not chosen by an attacker to collide; hashing them
/// with SipHash was some 3 % of an SGLang replay). Nothing reads them in their order.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// The set of [`FastMap`]'s hashing.
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
