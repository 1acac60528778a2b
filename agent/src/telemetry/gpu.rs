//! GPU steps -> a report per step (for the JSONL output) and infertrace's CUDA metrics.
//!
//! Everything here is measured on the CPU side: when a thread called the driver to launch, and
//! how long it waited in a synchronisation. None of it is GPU execution time, and every name
//! says so (`cpu_`), so that nobody reads a launch span as a kernel's run time.
use infertrace_common::cuda_fn;
use serde::Serialize;

use super::{
    Clock,
    entry_span::push_opt,
    metrics::{MetricDef, Registry},
    span::Attributes,
};
use crate::engines::common::{
    gpu::{GpuStep, KernelLaunches},
    iteration_work::IterationLaunches,
};

/// One step as exported.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuStepReport {
    pub pid: u32,
    pub tid: u32,
    /// The driver call that ended the step, or `thread exit`.
    pub ended_by: &'static str,
    /// When it ended (the synchronisation returned), Unix ns.
    pub end_unix_nano: u64,
    /// How long the thread waited in that synchronisation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_sync_wait_ns: Option<u64>,
    /// The synchronisation's CUresult, when not CUDA_SUCCESS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_error: Option<i32>,
    /// First kernel or graph launch call of the step, Unix ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_first_launch_unix_nano: Option<u64>,
    /// From the first launch call to the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_launch_span_ns: Option<u64>,
    pub kernel_launches: u32,
    pub graph_launches: u32,
    pub copies: u32,
    pub copy_bytes: u64,
    pub event_records: u32,
    /// Launches per kernel, most first.
    pub kernels: Vec<KernelLaunches>,
    /// Launches of kernels past the per-step table (not listed in `kernels`).
    #[serde(skip_serializing_if = "is_zero")]
    pub unlisted_launches: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub fn report(gpu: &GpuStep, clock: &Clock) -> GpuStepReport {
    let step = &gpu.step;
    GpuStepReport {
        pid: step.tgid,
        tid: step.tid,
        ended_by: cuda_fn::name(step.sync_function),
        end_unix_nano: clock.unix_ns(step.end_ns),
        cpu_sync_wait_ns: step.sync_wait_ns(),
        sync_error: (step.sync_result != 0).then_some(step.sync_result),
        cpu_first_launch_unix_nano: step.first_launch_ns.map(|ns| clock.unix_ns(ns)),
        cpu_launch_span_ns: step.launch_span_ns(),
        kernel_launches: step.launches,
        graph_launches: step.graph_launches,
        copies: step.copies,
        copy_bytes: step.copy_bytes,
        event_records: step.event_records,
        kernels: gpu.kernels.clone(),
        unlisted_launches: step.other_launches,
    }
}

/// infertrace's own attributes (not the spec's) on an engine iteration's event or span: what
/// it asked of the GPU, measured on the CPU side by the CUDA probes.
pub fn iteration_attributes(a: &mut Attributes, gpu: &IterationLaunches) {
    a.push((
        "infertrace.cuda.kernel_launches",
        gpu.kernel_launches.into(),
    ));
    a.push(("infertrace.cuda.graph_launches", gpu.graph_launches.into()));
    a.push((
        "infertrace.cuda.synchronizations",
        u64::from(gpu.synchronizations).into(),
    ));
    push_opt(a, "infertrace.cuda.cpu_launch_ns", gpu.cpu_launch_ns);
    a.push((
        "infertrace.cuda.cpu_sync_wait_ns",
        gpu.cpu_sync_wait_ns.into(),
    ));
}

pub const STEPS: MetricDef = MetricDef::counter(
    "infertrace_cuda_steps_total",
    "Count",
    "CUDA steps: a thread's driver calls ended by a host-side synchronisation (dimension \
     `synchronization`: the call that ended it).",
);
pub const KERNEL_LAUNCHES: MetricDef = MetricDef::counter(
    "infertrace_cuda_kernel_launches_total",
    "Count",
    "cuLaunchKernel/cuLaunchKernelEx calls, per kernel (its name, its handle when no lookup \
     named it, or `(unlisted)` past the per-step table).",
);
pub const GRAPH_LAUNCHES: MetricDef = MetricDef::counter(
    "infertrace_cuda_graph_launches_total",
    "Count",
    "cuGraphLaunch calls (CUDA graph replays).",
);
pub const COPIES: MetricDef = MetricDef::counter(
    "infertrace_cuda_async_copies_total",
    "Count",
    "cuMemcpyDtoHAsync/cuMemcpyAsync calls.",
);
pub const COPY_BYTES: MetricDef = MetricDef::counter(
    "infertrace_cuda_async_copy_bytes_total",
    "Bytes",
    "Bytes asked for by cuMemcpyDtoHAsync/cuMemcpyAsync calls.",
);
pub const CPU_LAUNCH_SECONDS: MetricDef = MetricDef::counter(
    "infertrace_cuda_cpu_launch_seconds_total",
    "Seconds",
    "Per step, CPU time from the first launch call to the last (host-side enqueueing, not GPU \
     execution), summed.",
);
pub const CPU_SYNC_WAIT_SECONDS: MetricDef = MetricDef::counter(
    "infertrace_cuda_cpu_sync_wait_seconds_total",
    "Seconds",
    "Time threads waited in the synchronisation that ended a step (host side), summed.",
);

/// Every CUDA metric, for exporters that declare instruments up front.
pub static ALL: [&MetricDef; 7] = [
    &STEPS,
    &KERNEL_LAUNCHES,
    &GRAPH_LAUNCHES,
    &COPIES,
    &COPY_BYTES,
    &CPU_LAUNCH_SECONDS,
    &CPU_SYNC_WAIT_SECONDS,
];

/// Count one step.
pub fn step(r: &mut Registry, gpu: &GpuStep) {
    let step = &gpu.step;
    let pid = || vec![("pid", step.tgid.to_string())];
    let ended_by = cuda_fn::name(step.sync_function).to_string();
    r.add(
        &STEPS,
        vec![
            ("pid", step.tgid.to_string()),
            ("synchronization", ended_by.clone()),
        ],
        1.0,
    );
    for kernel in &gpu.kernels {
        let dims = vec![("pid", step.tgid.to_string()), ("kernel", kernel.label())];
        r.add(&KERNEL_LAUNCHES, dims, f64::from(kernel.launches));
    }
    if step.other_launches > 0 {
        let dims = vec![
            ("pid", step.tgid.to_string()),
            ("kernel", "(unlisted)".into()),
        ];
        r.add(&KERNEL_LAUNCHES, dims, f64::from(step.other_launches));
    }
    r.add(&GRAPH_LAUNCHES, pid(), f64::from(step.graph_launches));
    r.add(&COPIES, pid(), f64::from(step.copies));
    r.add(&COPY_BYTES, pid(), step.copy_bytes as f64);
    if let Some(ns) = step.launch_span_ns() {
        r.add(&CPU_LAUNCH_SECONDS, pid(), ns as f64 / 1e9);
    }
    if let Some(ns) = step.sync_wait_ns() {
        let dims = vec![
            ("pid", step.tgid.to_string()),
            ("synchronization", ended_by),
        ];
        r.add(&CPU_SYNC_WAIT_SECONDS, dims, ns as f64 / 1e9);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::cuda::CudaStep;

    fn gpu_step() -> GpuStep {
        GpuStep {
            step: CudaStep {
                tgid: 5,
                tid: 6,
                sync_function: cuda_fn::EVENT_SYNCHRONIZE,
                sync_enter_ns: Some(2_000),
                end_ns: 5_000,
                first_launch_ns: Some(1_000),
                last_launch_ns: Some(1_500),
                launches: 4,
                graph_launches: 1,
                copies: 1,
                copy_bytes: 8,
                kernels: vec![(0x10, 3)],
                other_launches: 1,
                ..CudaStep::default()
            },
            kernels: vec![KernelLaunches {
                name: Some("gemm".into()),
                handle: 0x10,
                launches: 3,
            }],
        }
    }

    #[test]
    fn a_step_is_reported_with_cpu_side_times_only() {
        let clock = Clock::fixed(1_000_000);
        let report = report(&gpu_step(), &clock);
        assert_eq!(report.ended_by, "cuEventSynchronize");
        assert_eq!(report.end_unix_nano, 1_005_000);
        assert_eq!(report.cpu_sync_wait_ns, Some(3_000));
        assert_eq!(report.cpu_launch_span_ns, Some(500));
        assert_eq!(report.cpu_first_launch_unix_nano, Some(1_001_000));
        assert_eq!(report.sync_error, None);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["kernels"][0]["name"], "gemm");
        assert_eq!(json["unlisted_launches"], 1);
    }

    #[test]
    fn metrics_count_launches_per_kernel_and_wait_per_synchronisation() {
        let mut r = Registry::default();
        step(&mut r, &gpu_step());
        step(&mut r, &gpu_step());
        let launches = |kernel| {
            r.value(
                "infertrace_cuda_kernel_launches_total",
                &[("pid", "5"), ("kernel", kernel)],
            )
        };
        assert_eq!(launches("gemm"), Some(6.0));
        assert_eq!(launches("(unlisted)"), Some(2.0));
        assert_eq!(r.total("infertrace_cuda_graph_launches_total"), 2.0);
        let wait = r
            .value(
                "infertrace_cuda_cpu_sync_wait_seconds_total",
                &[("pid", "5"), ("synchronization", "cuEventSynchronize")],
            )
            .unwrap();
        assert!((wait - 6e-6).abs() < 1e-12, "{wait}");
        assert!((r.total("infertrace_cuda_cpu_launch_seconds_total") - 1e-6).abs() < 1e-12);
    }
}
