//! Decoded messages -> the engine instance of the process they came from -> spans and metrics
//! -> exporters. The pipeline knows no engine: each traced server is an instance of its engine
//! kind (`engines::engine`), with its own tracker, clock, counters and metrics scope.
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use crate::{
    capture::KernelCounters,
    decode::flows::{Decoded, FlowStats},
    discover::{engine::Target, kubernetes::PodIdentity},
    engines::{
        self,
        common::{
            gpu::GpuTimeline, handoff::HandoffStats, instance::InstanceCore, well_known::SampleKind,
        },
        engine::{EngineInstance, Output},
    },
    export::Exporter,
    routing::Owners,
    telemetry::{
        Clock, SpanOptions, agent_metrics, gpu,
        metrics::{Registry, Resource, Scope},
        profile::Profile,
        python_samples, resource,
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
    /// The server, as discovery (and Kubernetes) know it.
    target: Target,
    instance: Box<dyn EngineInstance>,
    scope: Scope,
    resource: Arc<Resource>,
}

/// Ended instances kept for the summary (node mode may see servers restart for weeks).
const ENDED_KEPT: usize = 16;

pub struct Pipeline {
    /// The instances of servers that run, by the number routing knows them by (never
    /// reused).
    instances: BTreeMap<usize, Slot>,
    next_instance: usize,
    /// Instances whose server exited, most recent last (at most [`ENDED_KEPT`]), and what
    /// the older ones said of their frontends.
    ended: VecDeque<Box<dyn EngineInstance>>,
    ended_handoffs: HandoffStats,
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
    /// Kernel records read and not understood, as the capture stage last said.
    records: (u64, u64),
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
            instances: BTreeMap::new(),
            next_instance: 0,
            ended: VecDeque::new(),
            ended_handoffs: HandoffStats::default(),
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
            records: (0, 0),
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
        let identity = resource::of_server(&self.host, target);
        let scope = self
            .registry
            .lock()
            .expect("registry lock")
            .add_scope(identity.clone());
        let number = self.next_instance;
        self.next_instance += 1;
        self.owners.add_root(target.pid, number);
        self.instances.insert(
            number,
            Slot {
                target: target.clone(),
                instance: kind.instance(InstanceCore::new(
                    target,
                    &self.span_options,
                    self.clock.clone(),
                )),
                scope,
                resource: Arc::new(identity),
            },
        );
    }

    /// The server of instance `i` exited: what it had in flight is reported (as unfinished),
    /// and nothing of it stays but its summary.
    fn end(&mut self, i: usize) {
        self.run(i, |instance, out| instance.finish(out));
        let Some(slot) = self.instances.remove(&i) else {
            return;
        };
        self.owners.remove_instance(i);
        self.registry
            .lock()
            .expect("registry lock")
            .remove_scope(slot.scope);
        self.ended.push_back(slot.instance);
        if self.ended.len() > ENDED_KEPT
            && let Some(oldest) = self.ended.pop_front()
        {
            self.ended_handoffs = self.ended_handoffs + oldest.handoff_stats();
        }
    }

    /// The engine instances: those running, in the order they were added, then those that
    /// ended (the most recent [`ENDED_KEPT`]).
    pub fn instances(&self) -> impl Iterator<Item = &dyn EngineInstance> {
        self.instances
            .values()
            .map(|slot| slot.instance.as_ref())
            .chain(self.ended.iter().map(|i| i.as_ref()))
    }

    /// The capture stage's totals so far (for the agent's own metrics): the kernel's and the
    /// decoders' counters, kernel records read and those not understood.
    pub fn observe_capture(
        &mut self,
        kernel: &KernelCounters,
        flows: &FlowStats,
        records: (u64, u64),
    ) {
        agent_metrics::capture(
            &mut self.registry.lock().expect("registry lock"),
            kernel,
            flows,
        );
        self.records = records;
    }

    /// How the frontend instants were found, over every instance.
    pub fn handoff_stats(&self) -> HandoffStats {
        self.instances()
            .map(|i| i.handoff_stats())
            .fold(self.ended_handoffs, |sum, h| sum + h)
    }

    /// Take a batch of decoded messages (in time order).
    pub fn handle(&mut self, batch: &[Decoded]) {
        for decoded in batch {
            if let Decoded::Clock(moved) = decoded {
                self.clock
                    .wall_clock_moved(moved.monotonic_ns, moved.realtime_minus_monotonic_ns);
                for slot in self.instances.values_mut() {
                    slot.instance
                        .core_mut()
                        .clock
                        .wall_clock_moved(moved.monotonic_ns, moved.realtime_minus_monotonic_ns);
                }
            }
        }
        self.gpu_and_python(batch);
        // Messages go to their instance in runs: a server's start or its process's exit in
        // the batch first delivers what came before it.
        let mut routed: BTreeMap<usize, Vec<&Decoded>> = BTreeMap::new();
        for decoded in batch {
            match decoded {
                Decoded::Cuda(_) | Decoded::PySample(_) | Decoded::Clock(_) => continue,
                Decoded::Traced(target) => {
                    self.deliver(&mut routed);
                    self.add(target);
                    continue;
                }
                Decoded::Pod { pid, pod } => {
                    self.pod_known(*pid, pod);
                    continue;
                }
                Decoded::Exited { tgid, .. } => {
                    self.deliver(&mut routed);
                    match self.owners.root(*tgid) {
                        Some(i) => self.end(i),
                        None => self.owners.forget(*tgid),
                    }
                    continue;
                }
                Decoded::Process(process) => self.owners.announce(process),
                _ => {}
            }
            match self.owner(decoded) {
                Some(i) => routed.entry(i).or_default().push(decoded),
                None => self.stats.unrouted += 1,
            }
        }
        self.deliver(&mut routed);
    }

    /// Kubernetes told the pod of server `pid`: its instance's resource says so from now on.
    fn pod_known(&mut self, pid: u32, pod: &PodIdentity) {
        let Some(slot) = self
            .owners
            .root(pid)
            .and_then(|i| self.instances.get_mut(&i))
        else {
            return;
        };
        slot.target.pod = Some(pod.clone());
        let identity = resource::of_server(&self.host, &slot.target);
        slot.resource = Arc::new(identity.clone());
        self.registry
            .lock()
            .expect("registry lock")
            .set_resource(slot.scope, identity);
    }

    /// Hand each instance the messages routed to it so far.
    fn deliver(&mut self, routed: &mut BTreeMap<usize, Vec<&Decoded>>) {
        for (i, messages) in std::mem::take(routed) {
            self.run(i, |instance, out| instance.handle(&messages, out));
        }
    }

    /// The instance a message goes to: its process's owner. With a single instance, a
    /// process never announced (it exited before /proc could name it) is taken to be its.
    fn owner(&self, decoded: &Decoded) -> Option<usize> {
        let owner = decoded.tgid().and_then(|tgid| self.owners.of(tgid));
        owner.or_else(|| match self.instances.keys().collect::<Vec<_>>()[..] {
            [only] => Some(*only),
            _ => None,
        })
    }

    /// Run `f` on instance `i` with its metrics scope, then export the traces it finished.
    fn run(&mut self, i: usize, f: impl FnOnce(&mut dyn EngineInstance, &mut Output)) {
        let mut traces = Vec::new();
        let Some(slot) = self.instances.get_mut(&i) else {
            return;
        };
        {
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
                exporter.spans(&slot.resource, spans);
            }
        }
    }

    /// Capture time has reached `now_ns`: report what waited long enough, and the metrics
    /// when an interval has passed.
    pub fn tick(&mut self, now_ns: u64) {
        for i in self.instances.keys().copied().collect::<Vec<_>>() {
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
        for i in self.instances.keys().copied().collect::<Vec<_>>() {
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
            for slot in self.instances.values() {
                registry.in_scope(slot.scope, |r| slot.instance.counters(r));
            }
            agent_metrics::traces(&mut registry, self.stats.traces);
            agent_metrics::process(&mut registry, self.records.0, self.records.1);
            let mut by_engine: BTreeMap<&'static str, usize> = BTreeMap::new();
            for slot in self.instances.values() {
                if let Some(engine) = slot.target.engine {
                    *by_engine.entry(engine.recognition().package).or_default() += 1;
                }
            }
            for engine in engines::Engine::ALL {
                by_engine.entry(engine.recognition().package).or_default();
            }
            agent_metrics::engines(&mut registry, &by_engine.into_iter().collect::<Vec<_>>());
            for totals in self.exporters.iter().filter_map(|e| e.totals()) {
                agent_metrics::export(&mut registry, &totals);
            }
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
        // The batch's samples by process, thread and phase, counted once each: a registry
        // update per sample (three strings made, a lookup) was 2 % of the agent on vLLM.
        let mut samples: HashMap<(u32, &str, SampleKind), u32> = HashMap::new();
        for decoded in batch {
            let event = match decoded {
                Decoded::Cuda(event) => event,
                Decoded::PySample(sample) => {
                    let kind = self.profile.add(sample);
                    *samples
                        .entry((sample.tgid, sample.thread.as_str(), kind))
                        .or_default() += 1;
                    if let Some(slot) = self.owner(decoded).and_then(|i| self.instances.get_mut(&i))
                    {
                        slot.instance
                            .core_mut()
                            .work
                            .python_sample(sample.ns, sample.tgid, kind);
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(step) = self.gpu.feed(event) else {
                continue;
            };
            if let Some(slot) = self.owner(decoded).and_then(|i| self.instances.get_mut(&i)) {
                slot.instance.core_mut().work.gpu_step(&step.step);
            }
            gpu::step(&mut self.registry.lock().expect("registry lock"), &step);
            let report = gpu::report(&step, &self.clock);
            for exporter in &mut self.exporters {
                exporter.gpu_step(&report);
            }
        }
        if !samples.is_empty() {
            let mut registry = self.registry.lock().expect("registry lock");
            for ((tgid, thread, kind), n) in samples {
                python_samples::count(&mut registry, tgid, thread, kind, n);
            }
        }
    }
}
