//! Where spans and metrics go: the console (default), JSONL files, OTLP, Prometheus.
//!
//! Exporters never stop the pipeline: a failed write is logged and counted by the exporter.
use std::sync::Arc;

use crate::telemetry::{
    agent_metrics::ExportTotals,
    gpu::GpuStepReport,
    metrics::{Resource, Sample},
    span::Span,
};

pub mod console;
pub mod health;
pub mod jsonl;
pub mod otlp;
pub mod prometheus;

pub trait Exporter {
    /// The spans of one request trace (parents first), of the engine instance `resource`
    /// names.
    fn spans(&mut self, resource: &Arc<Resource>, spans: &[Span]);
    /// A snapshot of every metric series, taken at `unix_ns`.
    fn metrics(&mut self, samples: &[Sample], unix_ns: u64);
    /// One CUDA step of a traced thread (only outputs that list every step keep it).
    fn gpu_step(&mut self, _step: &GpuStepReport) {}
    /// Flush what is buffered; called at the end of the session.
    fn shutdown(&mut self) {}
    /// What an exporter that sends over the network did so far (for the agent's metrics).
    fn totals(&self) -> Option<ExportTotals> {
        None
    }
}
