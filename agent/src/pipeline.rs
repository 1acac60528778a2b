//! Decoded messages -> engine tracker -> spans and metrics -> exporters.
use std::sync::{Arc, Mutex};

use crate::{
    capture::KernelCounters,
    decode::flows::{Decoded, FlowStats},
    discover::engine::Engine,
    engines::{
        common::{gpu::GpuTimeline, handoff::HandoffStats, iteration_work::IterationWork},
        sglang::{
            metrics::{self as sglang_metrics, SglangMetrics},
            spans as sglang_spans,
            tracker::{SglangStats, SglangTrace, SglangTracker},
        },
        vllm::{
            metrics::VllmMetrics,
            spans as vllm_spans,
            tracker::{VllmEvent, VllmStats, VllmTracker},
            wire::{SCHEMAS, VllmDecoder, schema_for_version},
        },
    },
    export::Exporter,
    telemetry::{
        Clock, SpanOptions, agent_metrics, gpu,
        metrics::Registry,
        profile::Profile,
        python_samples,
        span::{IdGenerator, Span},
    },
};

#[derive(Clone, Debug)]
pub struct PipelineOptions {
    pub spans: SpanOptions,
    /// Metrics snapshots go to the exporters this often (capture time), ns.
    pub metrics_interval_ns: u64,
    /// The engine's installed version (from discovery), which picks the wire layout.
    pub vllm_version: Option<String>,
    /// The traced engine, when discovery knows it. Only vLLM is reconstructed today: for
    /// SGLang the pipeline produces no spans (and says so) rather than misread its messages.
    pub engine: Option<Engine>,
    /// Where to write the Python profile's folded stacks (each metrics interval, and at the
    /// end).
    pub profile_output: Option<std::path::PathBuf>,
}

/// What the pipeline produced.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PipelineStats {
    pub traces: u64,
    pub spans: u64,
}

pub struct Pipeline {
    tracker: VllmTracker,
    /// False when the traced engine is not vLLM.
    reconstruct: bool,
    /// The SGLang tracker, when the traced engine is SGLang (it then takes every message).
    sglang: Option<SglangTracker>,
    sglang_metrics: SglangMetrics,
    /// Traced threads' CUDA steps, whatever the engine.
    gpu: GpuTimeline,
    /// The CUDA steps of each vLLM iteration.
    iteration_work: IterationWork,
    /// Python stack samples per thread.
    profile: Profile,
    profile_output: Option<std::path::PathBuf>,
    span_options: SpanOptions,
    clock: Clock,
    ids: IdGenerator,
    metrics: VllmMetrics,
    registry: Arc<Mutex<Registry>>,
    exporters: Vec<Box<dyn Exporter>>,
    metrics_interval_ns: u64,
    next_metrics_ns: Option<u64>,
    events: Vec<VllmEvent>,
    pub stats: PipelineStats,
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

impl Pipeline {
    pub fn new(
        options: PipelineOptions,
        clock: Clock,
        registry: Arc<Mutex<Registry>>,
        exporters: Vec<Box<dyn Exporter>>,
    ) -> Self {
        let reconstruct = options.engine.as_ref().is_none_or(|e| *e == Engine::Vllm);
        let sglang = (options.engine == Some(Engine::Sglang)).then(|| {
            tracing::info!(
                "SGLang: entry, request, thread and stage spans, retract events, the request \
                 metrics, and the scheduler's snapshot counters from its log (when it logs at \
                 info level)"
            );
            SglangTracker::default()
        });
        let version = reconstruct
            .then_some(options.vllm_version.as_deref())
            .flatten();
        Self {
            tracker: VllmTracker::new(if reconstruct {
                decoder_for(version)
            } else {
                VllmDecoder::new(SCHEMAS[SCHEMAS.len() - 1])
            }),
            reconstruct,
            sglang,
            sglang_metrics: SglangMetrics {
                model_name: options.spans.default_model.clone(),
            },
            gpu: GpuTimeline::default(),
            iteration_work: IterationWork::default(),
            profile: Profile::default(),
            profile_output: options.profile_output,
            metrics: VllmMetrics {
                model_name: options.spans.default_model.clone(),
            },
            span_options: options.spans,
            clock,
            ids: IdGenerator::default(),
            registry,
            exporters,
            metrics_interval_ns: options.metrics_interval_ns.max(1),
            next_metrics_ns: None,
            events: Vec::new(),
            stats: PipelineStats::default(),
        }
    }

    /// The capture stage's totals so far (for the agent's own metrics).
    pub fn observe_capture(&mut self, kernel: &KernelCounters, flows: &FlowStats) {
        agent_metrics::capture(
            &mut self.registry.lock().expect("registry lock"),
            kernel,
            flows,
        );
    }

    pub fn tracker_stats(&self) -> VllmStats {
        self.tracker.stats
    }

    /// How the frontend instants (first token, end) were found.
    pub fn handoff_stats(&self) -> HandoffStats {
        match &self.sglang {
            Some(sglang) => sglang.handoff_stats(),
            None => self.tracker.handoff_stats(),
        }
    }

    /// The SGLang tracker's counters, when the engine is SGLang.
    pub fn sglang_stats(&self) -> Option<SglangStats> {
        self.sglang.as_ref().map(|s| s.stats)
    }

    /// Layout switches of the vLLM decoder (messages that fitted another version's table).
    pub fn layout_switches(&self) -> u64 {
        self.tracker.decoder().layout_switches
    }

    /// Take a batch of decoded messages (in time order).
    pub fn handle(&mut self, batch: &[Decoded]) {
        for decoded in batch {
            if let Decoded::Clock(moved) = decoded {
                self.clock
                    .wall_clock_moved(moved.monotonic_ns, moved.realtime_minus_monotonic_ns);
            }
        }
        self.gpu_and_python(batch);
        if let Some(sglang) = self.sglang.as_mut() {
            for decoded in batch {
                sglang.feed(decoded);
            }
            let reports = sglang.take_reports();
            if !reports.is_empty() {
                let mut registry = self.registry.lock().expect("registry lock");
                for stats in &reports {
                    sglang_metrics::report(&mut registry, stats);
                }
            }
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        for decoded in batch {
            // The API calls are engine-neutral (entry spans for any OpenAI-compatible
            // server); the ZeroMQ messages are vLLM's own.
            if self.reconstruct || matches!(decoded, Decoded::Http { .. }) {
                self.tracker.feed(decoded, &mut events);
            }
        }
        self.emit(&mut events);
        self.events = events;
    }

    /// Capture time has reached `now_ns`: report what waited long enough, and the metrics
    /// when an interval has passed.
    pub fn tick(&mut self, now_ns: u64) {
        if let Some(sglang) = self.sglang.as_mut() {
            let mut traces = sglang.advance(now_ns);
            self.emit_sglang(&mut traces);
        }
        let mut events = std::mem::take(&mut self.events);
        self.tracker.advance(now_ns, &mut events);
        self.emit(&mut events);
        self.events = events;
        let due = *self
            .next_metrics_ns
            .get_or_insert(now_ns.saturating_add(self.metrics_interval_ns));
        if now_ns >= due {
            self.next_metrics_ns = Some(now_ns.saturating_add(self.metrics_interval_ns));
            self.export_metrics(now_ns);
            self.write_profile();
        }
    }

    /// End of the session: report everything, a last metrics snapshot, flush the exporters.
    pub fn finish(&mut self, now_ns: u64) {
        if let Some(sglang) = self.sglang.as_mut() {
            let mut traces = sglang.finish();
            self.emit_sglang(&mut traces);
        }
        let mut events = std::mem::take(&mut self.events);
        self.tracker.finish(&mut events);
        self.emit(&mut events);
        self.export_metrics(now_ns);
        for exporter in &mut self.exporters {
            exporter.shutdown();
        }
        self.write_profile();
    }

    fn export_metrics(&mut self, now_ns: u64) {
        // The engine's own hand-off counts (SGLang's tracker has its own, not vLLM's).
        let handoffs = self.handoff_stats();
        let samples = {
            let mut registry = self.registry.lock().expect("registry lock");
            match &self.sglang {
                Some(sglang) => agent_metrics::sglang(&mut registry, &sglang.stats),
                None => {
                    agent_metrics::vllm(&mut registry, &self.tracker.stats, self.layout_switches())
                }
            }
            agent_metrics::pipeline(&mut registry, &handoffs, self.stats.traces);
            registry.snapshot()
        };
        let unix_ns = self.clock.unix_ns(now_ns);
        for exporter in &mut self.exporters {
            exporter.metrics(&samples, unix_ns);
        }
    }

    fn emit(&mut self, events: &mut Vec<VllmEvent>) {
        if events.is_empty() {
            return;
        }
        let mut registry = self.registry.lock().expect("registry lock");
        let mut traces = Vec::new();
        for event in events.drain(..) {
            match event {
                VllmEvent::Step(step) => {
                    if step.iteration {
                        self.iteration_work.iteration(
                            step.engine_index,
                            step.timestamp,
                            step.frontend,
                        );
                    }
                    self.metrics.step(&mut registry, &step);
                }
                VllmEvent::Request(mut trace) => {
                    self.iteration_work.annotate(&mut trace);
                    self.metrics.request(&mut registry, &trace, &self.clock);
                    traces.push(trace);
                }
            }
        }
        drop(registry);
        for trace in &traces {
            let spans = vllm_spans::spans(trace, &self.span_options, &self.clock, &mut self.ids);
            self.export_spans(&spans);
        }
    }

    fn emit_sglang(&mut self, traces: &mut [SglangTrace]) {
        for trace in traces.iter_mut() {
            self.iteration_work.annotate_sglang(trace);
        }
        let mut registry = self.registry.lock().expect("registry lock");
        for trace in traces.iter() {
            self.sglang_metrics
                .request(&mut registry, trace, &self.clock);
        }
        drop(registry);
        for trace in traces.iter() {
            let spans = sglang_spans::spans(trace, &self.span_options, &self.clock, &mut self.ids);
            self.export_spans(&spans);
        }
    }

    /// The Python stack samples so far.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Write the profile's folded stacks where `--profile-output` says (whole, replacing the
    /// file at once).
    fn write_profile(&self) {
        let Some(path) = &self.profile_output else {
            return;
        };
        let partial = path.with_extension("partial");
        let result = std::fs::write(&partial, self.profile.folded())
            .and_then(|()| std::fs::rename(&partial, path));
        if let Err(e) = result {
            tracing::warn!("writing the profile to {}: {e}", path.display());
        }
    }

    /// The batch's CUDA steps, named, to the metrics and the outputs that list steps; its
    /// Python samples to the profile and the metrics; both to the iterations they fall in.
    fn gpu_and_python(&mut self, batch: &[Decoded]) {
        for decoded in batch {
            let event = match decoded {
                Decoded::Cuda(event) => event,
                Decoded::PySample(sample) => {
                    let kind = self.profile.add(sample);
                    python_samples::count(
                        &mut self.registry.lock().expect("registry lock"),
                        sample,
                        kind,
                    );
                    self.iteration_work
                        .python_sample(sample.ns, sample.tgid, kind);
                    continue;
                }
                _ => continue,
            };
            let Some(step) = self.gpu.feed(event) else {
                continue;
            };
            self.iteration_work.gpu_step(&step.step);
            gpu::step(&mut self.registry.lock().expect("registry lock"), &step);
            let report = gpu::report(&step, &self.clock);
            for exporter in &mut self.exporters {
                exporter.gpu_step(&report);
            }
        }
    }

    fn export_spans(&mut self, spans: &[Span]) {
        self.stats.traces += 1;
        self.stats.spans += spans.len() as u64;
        for exporter in &mut self.exporters {
            exporter.spans(spans);
        }
    }
}
