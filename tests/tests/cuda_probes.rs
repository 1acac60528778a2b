//! CUDA launch probes on the real kernel, without a GPU: the real eBPF uprobes attached to the
//! driver STAND-IN (tests/fixtures/cuda/cuda_driver_stand_in.c: the driver's entry point names
//! and signatures, no driver behind them), called by the step program
//! (tests/fixtures/cuda/step_program.c), which loads the library only after infertrace
//! attached and then mimics an engine's steps on a second thread: launch bursts through three
//! launch entry points, a graph launch, an event record, a device-to-host copy, and a stream or
//! event synchronisation. This checks discovery of a library loaded after attach, symbol
//! resolution, attach, argument decoding (handles, byte counts, names read from the caller's
//! memory), the in-kernel aggregation against one record per call, and the named timeline.
//! The real driver is checked by tests/gpu/check.sh on a machine with a GPU. Run as root.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use infertrace::{
    capture::{cuda_watch::CudaOptions, kernel::KernelOptions},
    decode::flows::Decoded,
    engines::common::gpu::{GpuStep, GpuTimeline},
};
use infertrace_common::cuda_fn;
use infertrace_tests::{Script, Tracer, cuda, live::temp_dir};

/// Steps the program's worker thread runs (then one of 20 distinct kernels).
const STEPS: usize = 20;

/// Build the fixtures into `dir` and start the step program, waiting for its driver load.
fn start_step_program(dir: &std::path::Path) -> Script {
    let fixtures = cuda::build(dir);
    let mut command = Command::new(&fixtures.step_program);
    command
        .arg(&fixtures.driver)
        .args(["steps", &STEPS.to_string()]);
    let mut program = Script::spawn(command);
    assert_eq!(program.read_line(), "ready");
    program
}

/// Run the step program under the tracer; the named steps, in order, and the records the
/// kernel side sent for them.
fn traced_steps(every_call: bool) -> (Vec<GpuStep>, u32, usize) {
    let dir = temp_dir(if every_call {
        "cuda-probes-calls"
    } else {
        "cuda-probes-steps"
    });
    let mut program = start_step_program(&dir);
    let pid = program.pid();
    let options = KernelOptions {
        cuda: CudaOptions {
            every_call,
            ..CudaOptions::default()
        },
        ..KernelOptions::default()
    };
    let mut tracer = Tracer::attach_with(&[pid], &options);
    tracer.pump();
    assert_eq!(tracer.cuda().probed, 0, "no driver loaded yet");

    // The library appears after attach: the watcher finds it on a later look.
    program.send_line("load");
    assert_eq!(program.read_line(), "loaded");
    let deadline = Instant::now() + Duration::from_secs(20);
    while tracer.cuda().probed == 0 {
        let watch = tracer.cuda();
        assert_eq!(watch.failures, 0, "{:?}", watch.last_failure);
        assert!(Instant::now() < deadline, "the driver was never probed");
        tracer.pump();
        std::thread::sleep(Duration::from_millis(20));
    }

    program.send_line("run");
    assert_eq!(program.read_line(), "done");
    program.send_line("exit");
    let status = program.child.wait().expect("step program exit");
    assert!(status.success(), "{status}");
    let expected_steps = STEPS + 2;
    let steps_seen = |decoded: &[Decoded]| {
        decoded
            .iter()
            .filter(|d| {
                matches!(
                    d,
                    Decoded::Cuda(infertrace::decode::cuda::CudaEvent::Step(_))
                )
            })
            .count()
    };
    tracer.pump_until(Duration::from_secs(10), |d| steps_seen(d) >= expected_steps);
    let records = tracer
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                infertrace::capture::CaptureEvent::Kernel(
                    infertrace::capture::Record::CudaStep(_)
                        | infertrace::capture::Record::CudaCall(_)
                        | infertrace::capture::Record::CudaName(_)
                )
            )
        })
        .count();
    let counters = tracer.kernel_counters();
    assert_eq!(counters.cuda_read_failed, 0, "{counters:?}");
    assert_eq!(counters.map_full, 0, "{counters:?}");
    let (decoded, _) = tracer.finish();
    let mut timeline = GpuTimeline::default();
    let steps: Vec<GpuStep> = decoded
        .iter()
        .filter_map(|d| match d {
            Decoded::Cuda(event) => timeline.feed(event),
            _ => None,
        })
        .collect();
    (steps, pid, records)
}

/// What the comparison between the two modes looks at: everything but the times.
fn shape(step: &GpuStep) -> String {
    let s = &step.step;
    let kernels: Vec<String> = step
        .kernels
        .iter()
        .map(|k| format!("{}x{}", k.label(), k.launches))
        .collect();
    format!(
        "tid={} by={} launches={} graphs={} copies={}/{}B events={} unlisted={} wait={} [{}]",
        s.tid,
        cuda_fn::name(s.sync_function),
        s.launches,
        s.graph_launches,
        s.copies,
        s.copy_bytes,
        s.event_records,
        s.other_launches,
        s.sync_wait_ns().is_some(),
        kernels.join(" ")
    )
}

fn check(steps: &[GpuStep], pid: u32) {
    let listing: Vec<String> = steps.iter().map(shape).collect();
    assert_eq!(steps.len(), STEPS + 2, "{listing:#?}");
    let worker = steps[0].step.tid;
    assert_ne!(worker, pid, "the steps ran on the program's second thread");
    for (i, gpu) in steps[..STEPS].iter().enumerate() {
        let s = &gpu.step;
        let sync = if i % 2 == 0 {
            cuda_fn::STREAM_SYNCHRONIZE
        } else {
            cuda_fn::EVENT_SYNCHRONIZE
        };
        assert_eq!(s.tgid, pid);
        assert_eq!(s.tid, worker);
        assert_eq!(s.sync_function, sync, "step {i}: {}", listing[i]);
        assert_eq!(s.sync_result, 0);
        assert_eq!(
            (
                s.launches,
                s.graph_launches,
                s.copies,
                s.copy_bytes,
                s.event_records
            ),
            (6, 1, 1, 32, 1),
            "step {i}: {}",
            listing[i]
        );
        let kernels: Vec<(String, u32)> = gpu
            .kernels
            .iter()
            .map(|k| (k.label(), k.launches))
            .collect();
        assert_eq!(
            kernels,
            [
                ("gemm_kernel".to_string(), 3),
                ("rms_norm_kernel".to_string(), 2),
                ("flash_attn_kernel".to_string(), 1),
            ],
            "step {i}: names come from cuModuleGetFunction, and through cuKernelGetFunction \
             from cuLibraryGetKernel"
        );
        let (first, last) = (s.first_launch_ns.unwrap(), s.last_launch_ns.unwrap());
        let enter = s.sync_enter_ns.unwrap();
        assert!(first <= last && last <= enter && enter <= s.end_ns, "{s:?}");
        if i > 0 {
            assert!(steps[i - 1].step.end_ns <= first, "steps follow each other");
        }
    }
    // More distinct kernels than the table holds: the rest are counted, not lost.
    let wide = &steps[STEPS];
    assert_eq!(wide.step.launches, 20, "{}", listing[STEPS]);
    assert_eq!(wide.step.sync_function, cuda_fn::CTX_SYNCHRONIZE);
    assert_eq!(wide.kernels.len(), infertrace_common::CUDA_STEP_KERNELS);
    assert_eq!(wide.step.other_launches, 4);
    assert!(wide.kernels.iter().all(|k| k.name.is_none()), "never named");
    // The main thread's last launch, which no synchronisation ended: it leaves with the thread.
    let last = &steps[STEPS + 1];
    assert_eq!(
        (last.step.tid, last.step.sync_function, last.step.launches),
        (pid, cuda_fn::THREAD_EXIT, 1),
        "{}",
        listing[STEPS + 1]
    );
    assert_eq!(last.step.sync_wait_ns(), None);
    assert_eq!(last.kernels[0].label(), "gemm_kernel");
}

#[test]
fn launches_are_counted_per_step_in_the_kernel_and_named() {
    let (aggregated, pid, records) = traced_steps(false);
    check(&aggregated, pid);
    // One record per step, plus one per lookup (5).
    assert_eq!(records, STEPS + 2 + 5, "records the kernel side sent");

    let (per_call, pid_calls, call_records) = traced_steps(true);
    check(&per_call, pid_calls);
    let a: Vec<String> = aggregated.iter().map(shape).collect();
    let b: Vec<String> = per_call.iter().map(shape).collect();
    // Thread ids differ between the runs; everything else is the same timeline.
    let strip = |v: &[String], worker: u32, main: u32| -> Vec<String> {
        v.iter()
            .map(|s| {
                s.replace(&format!("tid={worker} "), "tid=W ")
                    .replace(&format!("tid={main} "), "tid=M ")
            })
            .collect()
    };
    assert_eq!(
        strip(&a, aggregated[0].step.tid, pid),
        strip(&b, per_call[0].step.tid, pid_calls),
        "the same steps whether the kernel aggregates or sends every call"
    );
    // Every call: 10 per step, 21 in the wide one, 1 at exit, and the 5 lookups.
    assert_eq!(call_records, STEPS * 10 + 21 + 1 + 5);
}

/// What a user of `infertrace attach` sees: one `cuda_step` JSON line per step, and the CUDA
/// metrics in the last snapshot.
#[test]
fn attach_writes_the_steps_and_the_cuda_metrics() {
    let dir = temp_dir("cuda-probes-cli");
    let mut program = start_step_program(&dir);
    let pid = program.pid().to_string();
    let out = dir.join("out.jsonl");
    let log = std::fs::File::create(dir.join("agent.log")).expect("log file");
    let mut agent = Command::new(infertrace_tests::infertrace_bin())
        .args(["attach", "--pid", &pid, "--output"])
        .arg(format!("jsonl:{}", out.display()))
        .env("INFERTRACE_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(log)
        .spawn()
        .expect("start infertrace");
    let agent_log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !agent_log().contains("attached:") {
        assert!(
            Instant::now() < deadline,
            "never attached:\n{}",
            agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    program.send_line("load");
    assert_eq!(program.read_line(), "loaded");
    while !agent_log().contains("probes on") {
        assert!(Instant::now() < deadline, "never probed:\n{}", agent_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    program.send_line("run");
    assert_eq!(program.read_line(), "done");
    program.send_line("exit");
    assert!(program.child.wait().expect("exit").success());
    // The agent stops by itself when the traced process has exited.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = agent.try_wait().expect("agent status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = agent.kill();
            panic!("the agent did not stop:\n{}", agent_log());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{}", agent_log());

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .expect("jsonl output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let steps: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["type"] == "cuda_step").collect();
    assert_eq!(steps.len(), STEPS + 2, "{}", agent_log());
    let first = steps[0];
    assert_eq!(first["pid"].as_u64(), Some(u64::from(program.pid())));
    assert_eq!(first["ended_by"], "cuStreamSynchronize");
    assert_eq!(first["kernel_launches"], 6);
    assert_eq!(first["graph_launches"], 1);
    assert_eq!(first["copy_bytes"], 32);
    assert_eq!(first["kernels"][0]["name"], "gemm_kernel");
    assert_eq!(first["kernels"][0]["launches"], 3);
    assert!(first["cpu_sync_wait_ns"].as_u64().is_some());
    assert!(first["cpu_launch_span_ns"].as_u64().is_some());
    assert_eq!(steps[1]["ended_by"], "cuEventSynchronize");
    assert_eq!(steps[STEPS]["unlisted_launches"], 4);
    assert_eq!(steps[STEPS]["ended_by"], "cuCtxSynchronize");
    assert_eq!(steps[STEPS + 1]["ended_by"], "thread exit");

    let metrics = lines
        .iter()
        .rev()
        .find(|l| l["type"] == "metrics")
        .expect("a metrics snapshot");
    let value = |name: &str, kernel: Option<&str>| -> f64 {
        metrics["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .filter(|s| s["name"] == name)
            .filter(|s| kernel.is_none_or(|k| s["dimensions"]["kernel"] == k))
            .map(|s| s["value"].as_f64().expect("a number"))
            .sum()
    };
    let launches = "infertrace_cuda_kernel_launches_total";
    assert_eq!(value(launches, Some("gemm_kernel")), (STEPS * 3 + 1) as f64);
    assert_eq!(value(launches, Some("flash_attn_kernel")), STEPS as f64);
    assert_eq!(value(launches, Some("(unlisted)")), 4.0);
    assert_eq!(value(launches, None), (STEPS * 6 + 20 + 1) as f64);
    assert_eq!(
        value("infertrace_cuda_graph_launches_total", None),
        STEPS as f64
    );
    assert_eq!(
        value("infertrace_cuda_steps_total", None),
        (STEPS + 2) as f64
    );
    assert!(value("infertrace_cuda_cpu_sync_wait_seconds_total", None) > 0.0);
}
