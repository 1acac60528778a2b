//! The Python samples metric: samples of traced threads by process, thread name and engine
//! phase (engines/common/well_known.rs).
use super::{
    metrics::{MetricDef, Registry},
    span::Attributes,
};
use crate::engines::common::{iteration_work::IterationSamples, well_known::SampleKind};

pub const PYTHON_SAMPLES: MetricDef = MetricDef::counter(
    "infertrace_python_samples_total",
    "Count",
    "Python stack samples of traced threads (CPU time at the sampling rate), by \
                  process, thread name and engine phase (`other`: no well-known function on \
                  the stack; `native`: no Python frames; `unknown`: the stack's names were lost).",
);

/// Count `samples` samples of process `tgid`'s thread named `thread` in phase `kind`.
pub fn count(r: &mut Registry, tgid: u32, thread: &str, kind: SampleKind, samples: u32) {
    let dims = vec![
        ("pid", tgid.to_string()),
        ("thread", thread.to_owned()),
        ("phase", kind.label().to_string()),
    ];
    r.add(&PYTHON_SAMPLES, dims, f64::from(samples));
}

/// infertrace's own attributes (not the spec's) on an engine iteration's event or span: how
/// many times the sampler found the engine's threads running in it, and in which phase (each
/// sample stands for 1/`--python-sample-hz` seconds of CPU; at the default 49 Hz a 20 ms
/// iteration gets one sample or none: the counts add up over many iterations).
pub fn iteration_attributes(a: &mut Attributes, samples: &IterationSamples) {
    a.push((
        "infertrace.python.samples",
        u64::from(samples.samples).into(),
    ));
    for (kind, n) in &samples.by_kind {
        a.push((kind.attribute(), u64::from(*n).into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode::python::PySample, engines::common::well_known::stack};

    #[test]
    fn samples_are_counted_by_thread_and_phase() {
        let sample = |frames: &[&str]| PySample {
            tgid: 5,
            tid: 6,
            thread: "VLLM::EngineCor".into(),
            ns: 0,
            stack: std::sync::Arc::new(stack(frames)),
            native: frames.is_empty(),
            cut: false,
            unknown_stack: false,
        };
        let mut r = Registry::default();
        for frames in [
            &["LlamaModel.forward", "GPUModelRunner.execute_model"][..],
            &["EngineCore.step"],
            &[],
        ] {
            let s = sample(frames);
            count(&mut r, s.tgid, &s.thread, SampleKind::of(&s.stack), 1);
        }
        count(&mut r, 5, "VLLM::EngineCor", SampleKind::Native, 2);
        let get = |phase| {
            r.value(
                "infertrace_python_samples_total",
                &[
                    ("pid", "5"),
                    ("thread", "VLLM::EngineCor"),
                    ("phase", phase),
                ],
            )
        };
        assert_eq!(get("model execution"), Some(1.0));
        assert_eq!(get("other"), Some(1.0));
        assert_eq!(get("native"), Some(3.0));
    }
}
