//! Which engine phase a Python stack sample is in, from a table of well-known functions.
//!
//! The innermost frame that the table names decides (a forward pass inside `execute_model` is
//! model execution; the statistics an output update computes are output processing). Samples
//! with no table frame are `other`; samples with no Python frame at all are `native`.
//!
//! The table names functions by their qualified name (`Class.method`), as the engines define
//! them; each row says where, checked against the installed sources of vLLM 0.32.0
//! (`vllm/...`) and SGLang 0.5.23 (`sglang/srt/...`). A version that renames one of them shows
//! its samples under `other` rather than under a wrong phase.
use super::metrics::{Kind, MetricDef, Registry};
use crate::{decode::python::PySample, discover::python::CodeName};

/// Engine phases, as users of the engines talk about an iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Schedule,
    ModelExecution,
    OutputProcessing,
    Tokenization,
    Detokenization,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Schedule => "schedule",
            Phase::ModelExecution => "model execution",
            Phase::OutputProcessing => "output processing",
            Phase::Tokenization => "tokenization",
            Phase::Detokenization => "detokenization",
        }
    }
}

/// (qualified name, phase); the source file of each is in the comment before it.
const WELL_KNOWN: &[(&str, Phase)] = &[
    // vLLM V1: v1/core/sched/scheduler.py
    ("Scheduler.schedule", Phase::Schedule),
    ("Scheduler.update_from_output", Phase::OutputProcessing),
    // v1/worker/gpu_model_runner.py (also the CPU runner's base), v1/worker/gpu_worker.py,
    // v1/executor/multiproc_executor.py and uniproc_executor.py (the EngineCore's wait for
    // its workers is the model's time too)
    ("GPUModelRunner.execute_model", Phase::ModelExecution),
    ("GPUModelRunner.sample_tokens", Phase::ModelExecution),
    ("Worker.execute_model", Phase::ModelExecution),
    ("MultiprocExecutor.execute_model", Phase::ModelExecution),
    ("UniProcExecutor.execute_model", Phase::ModelExecution),
    // v1/engine/output_processor.py, v1/engine/core.py (the output thread's serialisation)
    ("OutputProcessor.process_outputs", Phase::OutputProcessing),
    (
        "EngineCoreProc.process_output_sockets",
        Phase::OutputProcessing,
    ),
    // v1/engine/detokenizer.py
    ("IncrementalDetokenizer.update", Phase::Detokenization),
    ("BaseIncrementalDetokenizer.update", Phase::Detokenization),
    (
        "FastIncrementalDetokenizer.decode_next",
        Phase::Detokenization,
    ),
    (
        "SlowIncrementalDetokenizer.decode_next",
        Phase::Detokenization,
    ),
    // renderers/base.py, v1/engine/input_processor.py
    ("BaseRenderer._tokenize_prompt", Phase::Tokenization),
    (
        "BaseRenderer._tokenize_singleton_prompt",
        Phase::Tokenization,
    ),
    (
        "BaseRenderer._tokenize_singleton_prompt_async",
        Phase::Tokenization,
    ),
    ("InputProcessor.process_inputs", Phase::Tokenization),
    // SGLang: managers/scheduler.py, managers/tp_worker.py
    ("Scheduler.get_next_batch_to_run", Phase::Schedule),
    ("Scheduler.run_batch", Phase::ModelExecution),
    (
        "TpModelWorker.forward_batch_generation",
        Phase::ModelExecution,
    ),
    ("Scheduler.process_batch_result", Phase::OutputProcessing),
    // managers/tokenizer_manager.py, managers/detokenizer_manager.py
    (
        "TokenizerManager._tokenize_one_request",
        Phase::Tokenization,
    ),
    (
        "TokenizerManager._batch_tokenize_and_process",
        Phase::Tokenization,
    ),
    (
        "DetokenizerManager.handle_batch_token_id_out",
        Phase::Detokenization,
    ),
];

pub const PYTHON_SAMPLES: MetricDef = MetricDef {
    name: "infertrace_python_samples_total",
    kind: Kind::Counter,
    unit: "Count",
    description: "Python stack samples of traced threads (CPU time at the sampling rate), by \
                  process, thread name and engine phase (`other`: no well-known function on \
                  the stack; `native`: no Python frames).",
};

/// Count one sample under its process, thread name and phase (`phase_of` its stack).
pub fn count(r: &mut Registry, sample: &PySample, phase: Option<Phase>) {
    let phase = if sample.stack.is_empty() {
        "native"
    } else {
        phase.map_or("other", Phase::name)
    };
    let dims = vec![
        ("pid", sample.tgid.to_string()),
        ("thread", sample.thread.clone()),
        ("phase", phase.to_string()),
    ];
    r.add(&PYTHON_SAMPLES, dims, 1.0);
}

/// The phase of a stack (innermost frame first).
pub fn phase_of(stack: &[CodeName]) -> Option<Phase> {
    stack.iter().find_map(|frame| {
        WELL_KNOWN
            .iter()
            .find(|(name, _)| *name == frame.name)
            .map(|(_, phase)| *phase)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(names: &[&str]) -> Vec<CodeName> {
        names
            .iter()
            .map(|n| CodeName {
                name: (*n).into(),
                file: String::new(),
                line: 1,
            })
            .collect()
    }

    #[test]
    fn the_innermost_known_frame_decides() {
        let forward = stack(&[
            "LlamaModel.forward",
            "GPUModelRunner.execute_model",
            "EngineCore.step",
        ]);
        assert_eq!(phase_of(&forward), Some(Phase::ModelExecution));
        let stats = stack(&[
            "IterationStats.update_from_output",
            "Scheduler.update_from_output",
            "EngineCore.step",
        ]);
        assert_eq!(phase_of(&stats), Some(Phase::OutputProcessing));
        assert_eq!(phase_of(&stack(&["EngineCore.step"])), None);
        assert_eq!(phase_of(&[]), None);
        assert_eq!(Phase::ModelExecution.name(), "model execution");
    }

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
            count(&mut r, &s, phase_of(&s.stack));
        }
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
        assert_eq!(get("native"), Some(1.0));
    }
}
