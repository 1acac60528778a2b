//! vLLM (V1 engine): its ZeroMQ wire format, request tracker, spans and metrics.
pub mod metrics;
pub mod spans;
pub mod tracker;
pub mod wire;
