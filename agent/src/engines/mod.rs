//! Per-engine state machines: decoded messages in, finished requests (with every timestamp the
//! spans need) and engine step reports out; and the engine-neutral GPU launch timeline (`gpu`).
//! Pure: no I/O, time comes from the captures.
pub mod dispatch_start;
pub mod gpu;
pub mod handoff;
pub mod in_flight;
pub mod iteration_work;
pub mod join;
pub mod retractions;
pub mod scheduler_loop;
pub mod send_probe;
pub mod sglang;
pub mod vllm;
pub mod well_known;
