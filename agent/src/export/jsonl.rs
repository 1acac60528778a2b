//! JSON Lines: one line per span (`"type":"span"`), one per metrics snapshot
//! (`"type":"metrics"`) and one per CUDA step of a traced thread (`"type":"cuda_step"`), for
//! files and pipes (`--output jsonl:PATH`, `-` for stdout).
use std::{io::Write, sync::Arc};

use serde::Serialize;

use super::Exporter;
use crate::telemetry::{
    gpu::GpuStepReport,
    metrics::{Resource, Sample},
    span::Span,
};

pub struct Jsonl<W: Write> {
    out: W,
    /// Lines that could not be written.
    pub write_errors: u64,
}

#[derive(Serialize)]
struct SpanLine<'a> {
    r#type: &'static str,
    /// The engine instance the span is of.
    #[serde(skip_serializing_if = "Resource::is_empty")]
    resource: &'a Resource,
    #[serde(flatten)]
    span: &'a Span,
}

#[derive(Serialize)]
struct GpuStepLine<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    step: &'a GpuStepReport,
}

#[derive(Serialize)]
struct MetricsLine<'a> {
    r#type: &'static str,
    time_unix_nano: u64,
    samples: &'a [Sample],
}

impl<W: Write> Jsonl<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            write_errors: 0,
        }
    }

    fn line(&mut self, value: &impl Serialize) {
        let result = serde_json::to_writer(&mut self.out, value)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = result {
            self.write_errors += 1;
            if self.write_errors == 1 {
                tracing::warn!("jsonl output: {e} (further errors are counted, not logged)");
            }
        }
    }
}

impl<W: Write> Exporter for Jsonl<W> {
    fn spans(&mut self, resource: &Arc<Resource>, spans: &[Span]) {
        for span in spans {
            self.line(&SpanLine {
                r#type: "span",
                resource,
                span,
            });
        }
        let _ = self.out.flush();
    }

    fn metrics(&mut self, samples: &[Sample], unix_ns: u64) {
        self.line(&MetricsLine {
            r#type: "metrics",
            time_unix_nano: unix_ns,
            samples,
        });
        let _ = self.out.flush();
    }

    fn gpu_step(&mut self, step: &GpuStepReport) {
        self.line(&GpuStepLine {
            r#type: "cuda_step",
            step,
        });
    }

    fn shutdown(&mut self) {
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::span::AttrValue;

    #[test]
    fn span_line() {
        let span = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: None,
            name: "llm_request".into(),
            start_time_unix_nano: 5,
            end_time_unix_nano: 7,
            attributes: vec![("gen_ai.usage.prompt_tokens", AttrValue::Int(3))],
            events: vec![],
            links: Vec::new(),
            error: None,
        };
        let mut out = Jsonl::new(Vec::new());
        out.spans(&Arc::default(), &[span]);
        let text = String::from_utf8(out.out).unwrap();
        assert_eq!(
            text,
            "{\"type\":\"span\",\"trace_id\":\"01010101010101010101010101010101\",\
             \"span_id\":\"0202020202020202\",\"parent_span_id\":null,\"name\":\"llm_request\",\
             \"start_time_unix_nano\":5,\"end_time_unix_nano\":7,\
             \"attributes\":{\"gen_ai.usage.prompt_tokens\":3},\"events\":[],\"error\":null}\n"
        );
    }
}
