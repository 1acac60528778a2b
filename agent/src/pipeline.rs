//! Decoded messages -> the engine instance of the process they came from -> spans and metrics
//! -> exporters. The pipeline knows no engine: each traced server is an instance of its engine
//! kind (`engines::engine`), with its own tracker, clock, counters and metrics scope.
use std::sync::{Arc, Mutex};

use crate::{
    capture::KernelCounters,
    decode::flows::{Decoded, FlowStats},
    discover::engine::Target,
    engines::{
        self,
        common::{gpu::GpuTimeline, handoff::HandoffStats, instance::InstanceCore},
        engine::{EngineInstance, Output},
    },
    export::Exporter,
    routing::Owners,
    telemetry::{
        Clock, SpanOptions, agent_metrics, gpu,
        metrics::{Registry, Resource, SERVICE_INSTANCE_ID, Scope},
        profile::Profile,
        python_samples,
    },
};

#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// What the spans contain (each instance's default model is its target's).
    pub spans: SpanOptions,
    /// Metrics snapshots go to the exporters this often (capture time), ns.
    pub metrics_interval_ns: u64,
    /// The servers traced, one engine instance each.
    pub targets: Vec<Target>,
    /// The host the servers run on, part of each instance's identity.
    pub host: String,
    /// Where to write the Python profile's folded stacks (each metrics interval, and at the
    /// end).
    pub profile_output: Option<std::path::PathBuf>,
}

/// What the pipeline produced.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PipelineStats {
    pub traces: u64,
    pub spans: u64,
    /// Messages of processes that belong to no traced server (announced by no target's
    /// tree): not used.
    pub unrouted: u64,
}

/// One engine instance, its metrics scope and its identity.
struct Slot {
    instance: Box<dyn EngineInstance>,
    scope: Scope,
    resource: Resource,
}

pub struct Pipeline {
    instances: Vec<Slot>,
    owners: Owners,
    /// Traced threads' CUDA steps, whatever the engine.
    gpu: GpuTimeline,
    /// Python stack samples per thread.
    profile: Profile,
    profile_output: Option<std::path::PathBuf>,
    span_options: SpanOptions,
    host: String,
    clock: Clock,
    registry: Arc<Mutex<Registry>>,
    exporters: Vec<Box<dyn Exporter>>,
    metrics_interval_ns: u64,
    next_metrics_ns: Option<u64>,
    pub stats: PipelineStats,
}

impl Pipeline {
    pub fn new(
        options: PipelineOptions,
        clock: Clock,
        registry: Arc<Mutex<Registry>>,
        exporters: Vec<Box<dyn Exporter>>,
    ) -> Self {
        let mut pipeline = Self {
            instances: Vec::new(),
            owners: Owners::default(),
            gpu: GpuTimeline::default(),
            profile: Profile::default(),
            profile_output: options.profile_output,
            span_options: options.spans,
            host: options.host,
            clock,
            registry,
            exporters,
            metrics_interval_ns: options.metrics_interval_ns.max(1),
            next_metrics_ns: None,
            stats: PipelineStats::default(),
        };
        for target in &options.targets {
            pipeline.add(target);
        }
        pipeline
    }

    /// Trace one more server: an instance of its engine kind, whose metrics carry its
    /// identity.
    pub fn add(&mut self, target: &Target) {
        let kind = engines::kind_or_default(target.engine.as_ref());
        let identity = identity(&self.host, target);
        let scope = self
            .registry
            .lock()
            .expect("registry lock")
            .add_scope(identity.clone());
        self.owners.add_root(target.pid, self.instances.len());
        self.instances.push(Slot {
            instance: kind.instance(InstanceCore::new(
                target,
                &self.span_options,
                self.clock.clone(),
            )),
            scope,
            resource: identity,
        });
    }

    /// The engine instances, in the order their targets were given.
    pub fn instances(&self) -> impl Iterator<Item = &dyn EngineInstance> {
        self.instances.iter().map(|slot| slot.instance.as_ref())
    }

    /// The capture stage's totals so far (for the agent's own metrics).
    pub fn observe_capture(&mut self, kernel: &KernelCounters, flows: &FlowStats) {
        agent_metrics::capture(
            &mut self.registry.lock().expect("registry lock"),
            kernel,
            flows,
        );
    }

    /// How the frontend instants were found, over every instance.
    pub fn handoff_stats(&self) -> HandoffStats {
        self.instances()
            .map(|i| i.handoff_stats())
            .fold(HandoffStats::default(), |sum, h| sum + h)
    }

    /// Take a batch of decoded messages (in time order).
    pub fn handle(&mut self, batch: &[Decoded]) {
        for decoded in batch {
            if let Decoded::Clock(moved) = decoded {
                self.clock
                    .wall_clock_moved(moved.monotonic_ns, moved.realtime_minus_monotonic_ns);
                for slot in &mut self.instances {
                    slot.instance
                        .core_mut()
                        .clock
                        .wall_clock_moved(moved.monotonic_ns, moved.realtime_minus_monotonic_ns);
                }
            }
        }
        self.gpu_and_python(batch);
        let mut routed: Vec<Vec<&Decoded>> = vec![Vec::new(); self.instances.len()];
        for decoded in batch {
            if matches!(
                decoded,
                Decoded::Cuda(_) | Decoded::PySample(_) | Decoded::Clock(_)
            ) {
                continue;
            }
            if let Decoded::Process(process) = decoded {
                self.owners.announce(process);
            }
            match self.owner(decoded) {
                Some(i) => routed[i].push(decoded),
                None => self.stats.unrouted += 1,
            }
        }
        for (i, messages) in routed.iter().enumerate() {
            if !messages.is_empty() {
                self.run(i, |instance, out| instance.handle(messages, out));
            }
        }
    }

    /// The instance a message goes to: its process's owner. With a single instance, a
    /// process never announced (it exited before /proc could name it) is taken to be its.
    fn owner(&self, decoded: &Decoded) -> Option<usize> {
        let owner = decoded.tgid().and_then(|tgid| self.owners.of(tgid));
        owner.or((self.instances.len() == 1).then_some(0))
    }

    /// Run `f` on instance `i` with its metrics scope, then export the traces it finished.
    fn run(&mut self, i: usize, f: impl FnOnce(&mut dyn EngineInstance, &mut Output)) {
        let mut traces = Vec::new();
        {
            let slot = &mut self.instances[i];
            let mut registry = self.registry.lock().expect("registry lock");
            registry.in_scope(slot.scope, |registry| {
                f(
                    slot.instance.as_mut(),
                    &mut Output {
                        registry,
                        traces: &mut traces,
                    },
                )
            });
        }
        for spans in &traces {
            self.stats.traces += 1;
            self.stats.spans += spans.len() as u64;
            for exporter in &mut self.exporters {
                exporter.spans(&self.instances[i].resource, spans);
            }
        }
    }

    /// Capture time has reached `now_ns`: report what waited long enough, and the metrics
    /// when an interval has passed.
    pub fn tick(&mut self, now_ns: u64) {
        for i in 0..self.instances.len() {
            self.run(i, |instance, out| instance.advance(now_ns, out));
        }
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
        for i in 0..self.instances.len() {
            self.run(i, |instance, out| instance.finish(out));
        }
        self.export_metrics(now_ns);
        for exporter in &mut self.exporters {
            exporter.shutdown();
        }
        self.write_profile();
    }

    fn export_metrics(&mut self, now_ns: u64) {
        let samples = {
            let mut registry = self.registry.lock().expect("registry lock");
            for slot in &self.instances {
                registry.in_scope(slot.scope, |r| slot.instance.counters(r));
            }
            agent_metrics::traces(&mut registry, self.stats.traces);
            registry.snapshot()
        };
        let unix_ns = self.clock.unix_ns(now_ns);
        for exporter in &mut self.exporters {
            exporter.metrics(&samples, unix_ns);
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
    /// Python samples to the profile and the metrics; both to the iterations of the instance
    /// whose process they are of.
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
                    if let Some(i) = self.owner(decoded) {
                        self.instances[i].instance.core_mut().work.python_sample(
                            sample.ns,
                            sample.tgid,
                            kind,
                        );
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(step) = self.gpu.feed(event) else {
                continue;
            };
            if let Some(i) = self.owner(decoded) {
                self.instances[i]
                    .instance
                    .core_mut()
                    .work
                    .gpu_step(&step.step);
            }
            gpu::step(&mut self.registry.lock().expect("registry lock"), &step);
            let report = gpu::report(&step, &self.clock);
            for exporter in &mut self.exporters {
                exporter.gpu_step(&report);
            }
        }
    }
}

/// What an instance's metrics carry so that two servers never share a series: the
/// OpenTelemetry `service.instance.id` (host and pid, unique while the server runs).
fn identity(host: &str, target: &Target) -> Resource {
    [(SERVICE_INSTANCE_ID, format!("{host}:{}", target.pid))].into()
}
