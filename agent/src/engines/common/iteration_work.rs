//! What each engine iteration did besides what its messages say: the CUDA steps
//! (engines/common/gpu.rs) of the engine's processes that ended between the engine's previous
//! iteration and this one, and the Python stack samples of the engine's threads in that window
//! by engine phase (engines/common/well_known.rs).
//!
//! vLLM stamps an iteration's outputs (`EngineCoreOutputs.timestamp`, CLOCK_MONOTONIC, the
//! clock of the kernel's timestamps too) after the model ran and its sampled tokens were copied
//! back, which ends in a host-side synchronisation: that synchronisation, and the launches
//! before it since the previous iteration, fall in the window (previous iteration, this one].
//! Everything here is CPU-side (when threads called the driver, how long they waited in it,
//! where their Python code was when sampled). The API server's samples are not the engine's:
//! the processes that received the iteration's outputs are left out.
//!
//! Each traced server (engine instance) has its own, fed with its own processes' steps and
//! samples only. With several vLLM engines in one server (data parallel), the windows would
//! have to be told apart by process: until that is done, iterations of a multi-engine
//! deployment get no GPU or sample figures (none rather than another engine's). SGLang's
//! batches are windows between its scheduler's consecutive outputs, and only that scheduler
//! process's steps and samples count. Each engine puts the figures on its own iterations
//! (`engines/<engine>/mod.rs`).
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::well_known::SampleKind;
use crate::decode::cuda::CudaStep;

/// Recent iterations, GPU steps and Python samples kept for the join (a request's iterations
/// are looked up when it finishes, so this bounds how long a request can be and keep its
/// figures).
const MAX_ITERATIONS: usize = 65_536;
const MAX_STEPS: usize = 65_536;
const MAX_SAMPLES: usize = 65_536;

/// The GPU work of one iteration, CPU-side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterationLaunches {
    /// Host-side synchronisations that ended a CUDA step in the window.
    pub synchronizations: u32,
    pub kernel_launches: u64,
    pub graph_launches: u64,
    /// From the window's first launch call to its last.
    pub cpu_launch_ns: Option<u64>,
    /// Time threads waited in those synchronisations.
    pub cpu_sync_wait_ns: u64,
}

/// One CUDA step, as much of it as the join needs.
#[derive(Clone, Copy, Debug)]
struct StepSummary {
    tgid: u32,
    end_ns: u64,
    first_launch_ns: Option<u64>,
    last_launch_ns: Option<u64>,
    launches: u32,
    graph_launches: u32,
    sync_wait_ns: Option<u64>,
}

/// The Python samples of the engine's threads in one iteration: how many, by what they were
/// doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IterationSamples {
    pub samples: u32,
    pub by_kind: BTreeMap<SampleKind, u32>,
}

/// Items by time, the oldest going first past a bound.
#[derive(Debug)]
struct Recent<T> {
    items: VecDeque<(u64, T)>,
    bound: usize,
}

impl<T> Recent<T> {
    fn new(bound: usize) -> Self {
        Self {
            items: VecDeque::new(),
            bound,
        }
    }

    /// Items of several threads arrive nearly in order: insert from the back.
    fn insert(&mut self, ns: u64, item: T) {
        if self.items.len() == self.bound {
            self.items.pop_front();
        }
        let at = self
            .items
            .iter()
            .rposition(|(at, _)| *at <= ns)
            .map_or(0, |i| i + 1);
        self.items.insert(at, (ns, item));
    }

    /// The items timed in (`from_ns`, `to_ns`]; None when part of that window was dropped (a
    /// full buffer whose oldest item is inside it).
    fn between(&self, from_ns: u64, to_ns: u64) -> Option<impl Iterator<Item = &T>> {
        let full = self.items.len() == self.bound;
        if full && self.items.front().is_some_and(|(at, _)| *at > from_ns) {
            return None;
        }
        let start = self.items.partition_point(|(at, _)| *at <= from_ns);
        let end = self.items.partition_point(|(at, _)| *at <= to_ns);
        Some(
            self.items
                .range(start..end.max(start))
                .map(|(_, item)| item),
        )
    }
}

#[derive(Debug)]
pub struct IterationWork {
    /// Iteration times (ns), in order.
    iterations: VecDeque<u64>,
    engines: BTreeSet<u64>,
    /// Processes that received iterations' outputs (vLLM's API servers).
    frontends: BTreeSet<u32>,
    /// CUDA steps of traced processes, by end time.
    steps: Recent<StepSummary>,
    /// Python samples of traced threads: (process, what it was doing), by time.
    samples: Recent<(u32, SampleKind)>,
}

impl Default for IterationWork {
    fn default() -> Self {
        Self {
            iterations: VecDeque::new(),
            engines: BTreeSet::new(),
            frontends: BTreeSet::new(),
            steps: Recent::new(MAX_STEPS),
            samples: Recent::new(MAX_SAMPLES),
        }
    }
}

impl IterationWork {
    /// An engine iteration stamped `timestamp` (engine CLOCK_MONOTONIC seconds), whose outputs
    /// process `frontend` received.
    pub fn iteration(&mut self, engine_index: u64, timestamp: f64, frontend: u32) {
        self.engines.insert(engine_index);
        self.frontends.insert(frontend);
        let ns = secs_to_ns(timestamp);
        if self.iterations.back().is_some_and(|&last| last >= ns) {
            return;
        }
        if self.iterations.len() == MAX_ITERATIONS {
            self.iterations.pop_front();
        }
        self.iterations.push_back(ns);
    }

    /// A CUDA step of a traced thread (a synchronisation ended it; steps ended by a thread's
    /// exit are not an iteration's work).
    pub fn gpu_step(&mut self, step: &CudaStep) {
        if step.sync_enter_ns.is_none() {
            return;
        }
        let summary = StepSummary {
            tgid: step.tgid,
            end_ns: step.end_ns,
            first_launch_ns: step.first_launch_ns,
            last_launch_ns: step.last_launch_ns,
            launches: step.launches,
            graph_launches: step.graph_launches,
            sync_wait_ns: step.sync_wait_ns(),
        };
        self.steps.insert(summary.end_ns, summary);
    }

    /// A Python stack sample of process `tgid` at `ns`.
    pub fn python_sample(&mut self, ns: u64, tgid: u32, kind: SampleKind) {
        self.samples.insert(ns, (tgid, kind));
    }

    /// The GPU work of the iteration stamped `timestamp`, when it is known: a single engine,
    /// the iteration and the one before it still kept, and GPU steps seen in between.
    pub fn launches(&self, timestamp: f64) -> Option<IterationLaunches> {
        let (from, to) = self.window(timestamp)?;
        self.launches_between(from, to, None)
    }

    /// The Python samples of the engine's processes in the iteration stamped `timestamp`, on
    /// the same terms as [`Self::launches`].
    pub fn samples(&self, timestamp: f64) -> Option<IterationSamples> {
        let (from, to) = self.window(timestamp)?;
        let engine = |pid: u32| !self.frontends.contains(&pid);
        self.samples_between(from, to, engine)
    }

    /// The iteration stamped `timestamp` as a window (previous iteration, this one] in ns,
    /// when there is a single engine and both are kept.
    fn window(&self, timestamp: f64) -> Option<(u64, u64)> {
        if self.engines.len() != 1 {
            return None;
        }
        let ns = secs_to_ns(timestamp);
        let at = self.iterations.binary_search(&ns).ok()?;
        let previous = *self.iterations.get(at.checked_sub(1)?)?;
        Some((previous, ns))
    }

    /// The samples in (`from_ns`, `to_ns`] of the processes `counted` accepts; None when
    /// there was none, or when part of the window was dropped.
    pub fn samples_between(
        &self,
        from_ns: u64,
        to_ns: u64,
        counted: impl Fn(u32) -> bool,
    ) -> Option<IterationSamples> {
        let mut out = IterationSamples::default();
        let window = self.samples.between(from_ns, to_ns)?;
        for (_, kind) in window.filter(|(pid, _)| counted(*pid)) {
            out.samples += 1;
            *out.by_kind.entry(*kind).or_default() += 1;
        }
        (out.samples > 0).then_some(out)
    }

    /// The GPU work of the steps that ended in (`from_ns`, `to_ns`], of process `tgid` or of
    /// every traced process; None when there was none, or when part of it was dropped.
    pub fn launches_between(
        &self,
        from_ns: u64,
        to_ns: u64,
        tgid: Option<u32>,
    ) -> Option<IterationLaunches> {
        let window = self
            .steps
            .between(from_ns, to_ns)?
            .filter(|s| tgid.is_none_or(|pid| s.tgid == pid));
        let mut out = IterationLaunches::default();
        let (mut first, mut last) = (None::<u64>, None::<u64>);
        for s in window {
            out.synchronizations += 1;
            out.kernel_launches += u64::from(s.launches);
            out.graph_launches += u64::from(s.graph_launches);
            out.cpu_sync_wait_ns += s.sync_wait_ns.unwrap_or(0);
            if let Some(f) = s.first_launch_ns {
                first = Some(first.map_or(f, |earliest| earliest.min(f)));
            }
            last = last.max(s.last_launch_ns);
        }
        if out.synchronizations == 0 {
            return None;
        }
        out.cpu_launch_ns = first.zip(last).map(|(f, l)| l.saturating_sub(f));
        Some(out)
    }
}

fn secs_to_ns(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use infertrace_common::cuda_fn;

    use super::*;
    use crate::engines::common::well_known::Phase;

    /// The API server's process, which receives the iterations' outputs.
    const FRONTEND: u32 = 7;

    fn step(first: u64, last: u64, enter: u64, end: u64, launches: u32) -> CudaStep {
        CudaStep {
            tgid: 1,
            tid: 2,
            sync_function: cuda_fn::STREAM_SYNCHRONIZE,
            sync_enter_ns: Some(enter),
            end_ns: end,
            first_launch_ns: Some(first),
            last_launch_ns: Some(last),
            launches,
            graph_launches: 1,
            ..CudaStep::default()
        }
    }

    /// A step with its times in milliseconds.
    fn step_ms(first: u64, last: u64, enter: u64, end: u64, launches: u32) -> CudaStep {
        const MS: u64 = 1_000_000;
        step(first * MS, last * MS, enter * MS, end * MS, launches)
    }

    #[test]
    fn an_iteration_gets_the_steps_since_the_previous_one() {
        let mut join = IterationWork::default();
        join.iteration(0, 1.0, FRONTEND);
        // Two synchronisations in the second iteration (a prepare step and the sampling).
        join.gpu_step(&step_ms(1100, 1200, 1300, 1400, 10));
        join.gpu_step(&step_ms(1500, 1600, 1700, 1800, 5));
        join.iteration(0, 2.0, FRONTEND);
        join.gpu_step(&step_ms(2100, 2200, 2300, 2400, 7));
        join.iteration(0, 3.0, FRONTEND);
        assert_eq!(
            join.launches(2.0),
            Some(IterationLaunches {
                synchronizations: 2,
                kernel_launches: 15,
                graph_launches: 2,
                cpu_launch_ns: Some(500_000_000),
                cpu_sync_wait_ns: 200_000_000,
            })
        );
        assert_eq!(join.launches(3.0).map(|l| l.kernel_launches), Some(7));
        // The first iteration kept has no window; an unknown one none either.
        assert_eq!(join.launches(1.0), None);
        assert_eq!(join.launches(2.5), None);
        // A thread's exit is not a synchronisation.
        let mut exit = step_ms(3100, 3100, 0, 3200, 1);
        exit.sync_enter_ns = None;
        join.gpu_step(&exit);
        join.iteration(0, 4.0, FRONTEND);
        assert_eq!(join.launches(4.0), None);
    }

    #[test]
    fn several_engines_get_no_figures_rather_than_each_others() {
        let mut join = IterationWork::default();
        join.iteration(0, 1.0, FRONTEND);
        join.gpu_step(&step_ms(1100, 1200, 1300, 1400, 10));
        join.iteration(1, 1.5, FRONTEND);
        join.iteration(0, 2.0, FRONTEND);
        assert_eq!(join.launches(2.0), None);
    }

    #[test]
    fn an_sglang_batch_counts_its_scheduler_steps_only() {
        let mut join = IterationWork::default();
        let mut other = step(1_100, 1_200, 1_300, 1_400, 9);
        other.tgid = 99;
        join.gpu_step(&other);
        join.gpu_step(&step(1_100, 1_200, 1_300, 1_500, 4));
        let launched = join.launches_between(1_000, 2_000, Some(1));
        assert_eq!(launched.map(|l| l.kernel_launches), Some(4));
        assert_eq!(
            join.launches_between(1_000, 2_000, None)
                .map(|l| l.kernel_launches),
            Some(13)
        );
        assert_eq!(join.launches_between(1_500, 2_000, Some(1)), None);
    }

    #[test]
    fn an_iteration_gets_the_engine_samples_since_the_previous_one() {
        const MS: u64 = 1_000_000;
        let (engine_core, worker) = (20, 21);
        let schedule = SampleKind::Phase(Phase::Schedule);
        let model = SampleKind::Phase(Phase::ModelExecution);
        let mut join = IterationWork::default();
        join.iteration(0, 1.0, FRONTEND);
        join.python_sample(1005 * MS, engine_core, schedule);
        join.python_sample(1010 * MS, worker, model);
        join.python_sample(1012 * MS, worker, model);
        // The API server's samples (tokenizing other requests) are not the iteration's.
        join.python_sample(1015 * MS, FRONTEND, SampleKind::Phase(Phase::Tokenization));
        join.python_sample(1020 * MS, engine_core, SampleKind::Other);
        join.iteration(0, 1.02, FRONTEND);
        join.python_sample(1030 * MS, worker, model);
        join.iteration(0, 1.04, FRONTEND);
        join.iteration(0, 1.06, FRONTEND);
        let first = join.samples(1.02).expect("samples in the first window");
        assert_eq!(first.samples, 4);
        assert_eq!(
            first.by_kind.into_iter().collect::<Vec<_>>(),
            [(schedule, 1), (model, 2), (SampleKind::Other, 1)]
        );
        assert_eq!(join.samples(1.04).map(|s| s.samples), Some(1));
        // An iteration nobody was sampled in has no figures (not zeros).
        assert_eq!(join.samples(1.06), None);
        assert_eq!(join.samples(1.0), None);
        // An SGLang batch: its scheduler's samples only.
        assert_eq!(
            join.samples_between(1000 * MS, 1020 * MS, |p| p == worker)
                .map(|s| s.samples),
            Some(2)
        );
    }
}
