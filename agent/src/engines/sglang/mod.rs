//! SGLang: its wire format (pickle or msgpack), its scheduler's log, request tracker, scheduler
//! loop, retractions, dispatch starts, spans and metrics.
pub mod dispatch_start;
pub mod log;
pub mod metrics;
pub mod retractions;
pub mod scheduler_loop;
pub mod spans;
pub mod tracker;
pub mod wire;
