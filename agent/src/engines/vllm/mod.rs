//! vLLM (V1 engine): its ZeroMQ wire format (`wire`), request tracker (`tracker`), spans,
//! metrics and loss counters; here, the engine kind (what of its processes is captured) and one
//! traced server (an instance).
pub mod losses;
pub mod metrics;
pub mod recognition;
pub mod spans;
pub mod tracker;
pub mod wire;

use std::any::Any;

use tracker::{StepKind, VllmEvent, VllmTrace, VllmTracker};
use wire::{SCHEMAS, VllmDecoder, schema_for_version};

use crate::{
    decode::flows::Decoded,
    discover::{engine::Role, recognition::Recognition, sockets::FdKind},
    engines::{
        Engine,
        common::{handoff::HandoffStats, instance::InstanceCore, iteration_work::IterationWork},
        engine::{EngineInstance, EngineKind, Output},
    },
    export::console::SummaryField,
    telemetry::{
        agent_metrics,
        metrics::{MetricDef, Registry},
    },
};

/// The vLLM engine kind. Its requests are rebuilt from the API server's side alone: the
/// sockets of its other processes (the EngineCore's copies of the same messages, the workers'
/// wake-ups) are not copied at all (decoding them only to drop them was half the agent's CPU),
/// and only the API server's eventfds (its libzmq mailboxes) are watched.
pub struct Vllm;

impl EngineKind for Vllm {
    fn engine(&self) -> Engine {
        Engine::Vllm
    }

    fn recognition(&self) -> &'static Recognition {
        &recognition::RECOGNITION
    }

    fn metrics(&self) -> Vec<&'static MetricDef> {
        [&metrics::ALL[..], &losses::ALL[..]].concat()
    }

    fn console_fields(&self) -> &'static [SummaryField] {
        &metrics::CONSOLE
    }

    fn decoded_kind(&self, role: &Role, kind: FdKind, _fd: u32) -> FdKind {
        let api_server = *role == Role::ApiServer;
        match kind {
            FdKind::Eventfd { .. } => FdKind::Eventfd {
                watched: api_server,
            },
            kind if kind.capture() && !api_server => FdKind::Other {
                what: format!("socket of vLLM's {role} (only the API server's side is decoded)"),
            },
            kind => kind,
        }
    }

    fn instance(&self, core: InstanceCore) -> Box<dyn EngineInstance> {
        Box::new(VllmInstance {
            tracker: VllmTracker::new(decoder_for(core.target.version.as_deref())),
            metrics: metrics::VllmMetrics {
                model_name: core.spans.default_model.clone(),
            },
            core,
            events: Vec::new(),
        })
    }
}

/// The wire layout decoder for an engine version, saying so when the version is unknown.
fn decoder_for(version: Option<&str>) -> VllmDecoder {
    let newest = SCHEMAS[SCHEMAS.len() - 1];
    let schema = match version {
        Some(v) => {
            let (schema, known) = schema_for_version(v);
            if known {
                tracing::info!("vLLM {v}: decoding with the {} layout", schema.name);
            } else {
                tracing::warn!(
                    "vLLM {v} is not a version infertrace knows; decoding with the closest \
                     layout ({}), checked message by message",
                    schema.name
                );
            }
            schema
        }
        None => {
            tracing::warn!(
                "vLLM version unknown; decoding with the {} layout, checked message by message",
                newest.name
            );
            newest
        }
    };
    VllmDecoder::new(schema)
}

/// One traced vLLM server (also any OpenAI-compatible server that is not an engine: its API
/// calls make entry spans).
pub struct VllmInstance {
    core: InstanceCore,
    tracker: VllmTracker,
    metrics: metrics::VllmMetrics,
    /// Reused between calls.
    events: Vec<VllmEvent>,
}

impl VllmInstance {
    /// The tracker's counters (for tests).
    pub fn stats(&self) -> tracker::VllmStats {
        self.tracker.stats
    }

    /// Steps to the metrics and the iteration windows, finished requests to the metrics and
    /// their spans.
    fn emit(&mut self, out: &mut Output) {
        let mut traces = Vec::new();
        for event in self.events.drain(..) {
            match event {
                VllmEvent::Step(step) => {
                    if step.iteration {
                        self.core
                            .work
                            .iteration(step.engine_index, step.timestamp, step.frontend);
                    }
                    self.metrics.step(out.registry, &step);
                }
                VllmEvent::Request(mut trace) => {
                    // Only the per-iteration events carry the figures.
                    if self.core.spans.granularity >= 2 {
                        annotate(&self.core.work, &mut trace);
                    }
                    self.metrics.request(out.registry, &trace, &self.core.clock);
                    traces.push(trace);
                }
            }
        }
        let c = &mut self.core;
        for trace in &traces {
            out.traces
                .push(spans::spans(trace, &c.spans, &c.clock, &mut c.ids));
        }
    }
}

/// Put on a finished request's prefill and decode iterations what they launched and where the
/// engine's Python code was.
fn annotate(work: &IterationWork, trace: &mut VllmTrace) {
    for engine in &mut trace.engine {
        for step in &mut engine.steps {
            if matches!(step.kind, StepKind::Prefill | StepKind::Decode) {
                step.gpu = work.launches(step.timestamp);
                step.python = work.samples(step.timestamp);
            }
        }
    }
}

impl EngineInstance for VllmInstance {
    fn core(&self) -> &InstanceCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut InstanceCore {
        &mut self.core
    }

    fn handle(&mut self, batch: &[&Decoded], out: &mut Output) {
        for decoded in batch {
            self.tracker.feed(decoded, &mut self.events);
        }
        self.emit(out);
    }

    fn advance(&mut self, now_ns: u64, out: &mut Output) {
        self.tracker.advance(now_ns, &mut self.events);
        self.emit(out);
    }

    fn finish(&mut self, out: &mut Output) {
        self.tracker.finish(&mut self.events);
        self.emit(out);
    }

    fn counters(&self, registry: &mut Registry) {
        losses::totals(
            registry,
            &self.tracker.stats,
            self.tracker.decoder().layout_switches,
        );
        agent_metrics::handoffs(registry, &self.tracker.handoff_stats());
        agent_metrics::in_flight(registry, self.tracker.in_flight());
    }

    fn handoff_stats(&self) -> HandoffStats {
        self.tracker.handoff_stats()
    }

    fn summary(&self) -> String {
        let t = &self.tracker.stats;
        format!(
            "vLLM (pid {}): {} requests sent to the engine, {} engine steps, {} undecodable \
             messages, {} requests sent before attach (or whose ADD was lost), {} requests \
             unfinished at the end, {} dropped (too many in flight), {} layout switches",
            self.core.target.pid,
            t.adds,
            t.steps,
            t.undecodable,
            t.requests_without_add,
            t.unfinished_at_end,
            t.evicted,
            self.tracker.decoder().layout_switches
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
