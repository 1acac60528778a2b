//! The engines: one folder per engine kind (its wire format, request tracking, spans and
//! metrics), and the machinery they share (`common`). Pure: no I/O, time comes from the
//! captures.
pub mod common;
pub mod sglang;
pub mod vllm;
