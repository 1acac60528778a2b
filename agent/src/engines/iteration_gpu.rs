//! What each engine iteration asked of the GPU: the CUDA steps (engines/gpu.rs) of the engine's
//! processes that ended between the engine's previous iteration and this one.
//!
//! vLLM stamps an iteration's outputs (`EngineCoreOutputs.timestamp`, CLOCK_MONOTONIC, the
//! clock of the kernel's timestamps too) after the model ran and its sampled tokens were copied
//! back, which ends in a host-side synchronisation: that synchronisation, and the launches
//! before it since the previous iteration, fall in the window (previous iteration, this one].
//! Everything here is CPU-side (when threads called the driver, how long they waited in it).
//!
//! With several vLLM engines (data parallel), the GPU steps would have to be told apart by
//! process: until that is done, iterations of a multi-engine deployment get no GPU figures
//! (none rather than another engine's). SGLang's batches are windows between its scheduler's
//! consecutive outputs, and only that scheduler process's steps count.
use std::collections::{BTreeSet, VecDeque};

use super::{
    sglang::SglangTrace,
    vllm::{RequestTrace, StepKind},
};
use crate::decode::cuda::CudaStep;

/// Recent iterations and GPU steps kept for the join (a request's iterations are looked up
/// when it finishes, so this bounds how long a request can be and keep its GPU figures).
const MAX_ITERATIONS: usize = 65_536;
const MAX_STEPS: usize = 65_536;

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

#[derive(Debug, Default)]
pub struct IterationGpu {
    /// Iteration times (ns), in order.
    iterations: VecDeque<u64>,
    engines: BTreeSet<u64>,
    /// CUDA steps of traced processes, by end time.
    steps: VecDeque<StepSummary>,
}

impl IterationGpu {
    /// An engine iteration stamped `timestamp` (engine CLOCK_MONOTONIC seconds).
    pub fn iteration(&mut self, engine_index: u64, timestamp: f64) {
        self.engines.insert(engine_index);
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
        if self.steps.len() == MAX_STEPS {
            self.steps.pop_front();
        }
        // Steps of several threads arrive nearly in order: insert from the back.
        let at = self
            .steps
            .iter()
            .rposition(|s| s.end_ns <= summary.end_ns)
            .map_or(0, |i| i + 1);
        self.steps.insert(at, summary);
    }

    /// The GPU work of the iteration stamped `timestamp`, when it is known: a single engine,
    /// the iteration and the one before it still kept, and GPU steps seen in between.
    pub fn launches(&self, timestamp: f64) -> Option<IterationLaunches> {
        if self.engines.len() != 1 {
            return None;
        }
        let ns = secs_to_ns(timestamp);
        let at = self.iterations.binary_search(&ns).ok()?;
        let previous = *self.iterations.get(at.checked_sub(1)?)?;
        self.launches_between(previous, ns, None)
    }

    /// The GPU work of the steps that ended in (`from_ns`, `to_ns`], of process `tgid` or of
    /// every traced process; None when there was none, or when part of it was dropped.
    pub fn launches_between(
        &self,
        from_ns: u64,
        to_ns: u64,
        tgid: Option<u32>,
    ) -> Option<IterationLaunches> {
        // A full buffer whose oldest step is inside the window has dropped some of it.
        let dropped = self.steps.len() == MAX_STEPS;
        if dropped && self.steps.front().is_some_and(|s| s.end_ns > from_ns) {
            return None;
        }
        let start = self.steps.partition_point(|s| s.end_ns <= from_ns);
        let end = self.steps.partition_point(|s| s.end_ns <= to_ns);
        let window = self
            .steps
            .range(start..end.max(start))
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

    /// Put on a finished vLLM request's prefill and decode iterations what they launched.
    pub fn annotate(&self, trace: &mut RequestTrace) {
        for engine in &mut trace.engine {
            for step in &mut engine.steps {
                if matches!(step.kind, StepKind::Prefill | StepKind::Decode) {
                    step.gpu = self.launches(step.timestamp);
                }
            }
        }
    }

    /// Put on a finished SGLang request's outputs what its scheduler launched since the
    /// output before (SGLang's scheduler runs a batch's forward pass in its own process, and
    /// sends the batch's outputs after it; its overlap scheduler, the default, launches the
    /// next batch before it sends this one's outputs, so a window then holds that batch's
    /// launches rather than this one's).
    pub fn annotate_sglang(&self, trace: &mut SglangTrace) {
        for engine in &mut trace.engine {
            let Some(pid) = engine.scheduler_pid else {
                continue;
            };
            engine.gpu_per_output = std::iter::once(None)
                .chain(
                    engine
                        .scheduler_output_ns
                        .windows(2)
                        .map(|w| self.launches_between(w[0], w[1], Some(pid))),
                )
                .collect();
        }
    }
}

fn secs_to_ns(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use infertrace_common::cuda_fn;

    use super::*;

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
        let mut join = IterationGpu::default();
        join.iteration(0, 1.0);
        // Two synchronisations in the second iteration (a prepare step and the sampling).
        join.gpu_step(&step_ms(1100, 1200, 1300, 1400, 10));
        join.gpu_step(&step_ms(1500, 1600, 1700, 1800, 5));
        join.iteration(0, 2.0);
        join.gpu_step(&step_ms(2100, 2200, 2300, 2400, 7));
        join.iteration(0, 3.0);
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
        join.iteration(0, 4.0);
        assert_eq!(join.launches(4.0), None);
    }

    #[test]
    fn several_engines_get_no_figures_rather_than_each_others() {
        let mut join = IterationGpu::default();
        join.iteration(0, 1.0);
        join.gpu_step(&step_ms(1100, 1200, 1300, 1400, 10));
        join.iteration(1, 1.5);
        join.iteration(0, 2.0);
        assert_eq!(join.launches(2.0), None);
    }

    #[test]
    fn an_sglang_batch_counts_its_scheduler_steps_only() {
        let mut join = IterationGpu::default();
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
}
