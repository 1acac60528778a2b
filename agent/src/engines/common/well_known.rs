//! What the engines' Python code is doing, from the names it is known by: the engine phase
//! of a stack sample, and the role of a thread.
//!
//! Phases: the innermost frame that the table names decides (a forward pass inside
//! `execute_model` is model execution; the statistics an output update computes are output
//! processing). Samples with no table frame are `other`; samples with no Python frame at all
//! are `native`.
//!
//! The tables name functions by their qualified name (`Class.method`), as the engines define
//! them; each row says where, checked against the installed sources of vLLM 0.32.0
//! (`vllm/...`) and SGLang 0.5.23 (`sglang/srt/...`). A version that renames one of them shows
//! its samples under `other` (and its thread unnamed) rather than under a wrong phase.
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

/// What a stack sample was doing: an engine phase, `other` Python code (no table function on
/// its stack), `native` code (no Python frame), or `unknown` (the stack's names were lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SampleKind {
    Phase(Phase),
    Other,
    Native,
    Unknown,
}

impl SampleKind {
    /// The kind of a sample: a stack whose names never arrived is unknown, not native.
    pub fn of_sample(sample: &PySample) -> Self {
        if sample.unknown_stack {
            SampleKind::Unknown
        } else {
            Self::of(&sample.stack)
        }
    }

    /// The kind of a sample whose stack (innermost frame first) is `stack`.
    pub fn of(stack: &[CodeName]) -> Self {
        if stack.is_empty() {
            SampleKind::Native
        } else {
            phase_of(stack).map_or(SampleKind::Other, SampleKind::Phase)
        }
    }

    /// As the metrics label it: the phase's name, `other`, `native`.
    pub fn label(self) -> &'static str {
        match self {
            SampleKind::Phase(phase) => phase.name(),
            SampleKind::Other => "other",
            SampleKind::Native => "native",
            SampleKind::Unknown => "unknown",
        }
    }

    /// The span attribute counting an iteration's samples of this kind.
    pub fn attribute(self) -> &'static str {
        match self {
            SampleKind::Phase(Phase::Schedule) => "infertrace.python.samples.schedule",
            SampleKind::Phase(Phase::ModelExecution) => "infertrace.python.samples.model_execution",
            SampleKind::Phase(Phase::OutputProcessing) => {
                "infertrace.python.samples.output_processing"
            }
            SampleKind::Phase(Phase::Tokenization) => "infertrace.python.samples.tokenization",
            SampleKind::Phase(Phase::Detokenization) => "infertrace.python.samples.detokenization",
            SampleKind::Other => "infertrace.python.samples.other",
            SampleKind::Native => "infertrace.python.samples.native",
            SampleKind::Unknown => "infertrace.python.samples.unknown",
        }
    }
}

/// A well-known function: where it is defined (the end of its file's path) and its qualified
/// name. CPython 3.11+ names a frame by its qualified name (`co_qualname`); 3.10 by the bare
/// function name (`co_name`), which is matched together with the file.
struct Known {
    file: &'static str,
    name: &'static str,
}

impl Known {
    fn matches(&self, frame: &CodeName) -> bool {
        if frame.name == self.name {
            return true;
        }
        // The bare name: what follows the qualified name's last dot (tested first, as it
        // fails at once for nearly every frame: each sample's frames go through the tables).
        let Some(class) = self.name.strip_suffix(frame.name.as_str()) else {
            return false;
        };
        class.ends_with('.') && !frame.name.contains('.') && frame.file.ends_with(self.file)
    }
}

const fn known(file: &'static str, name: &'static str) -> Known {
    Known { file, name }
}

/// Engine functions and the phase they stand for (vLLM 0.32, SGLang 0.5.23).
const WELL_KNOWN: &[(Known, Phase)] = &[
    // vLLM V1
    (
        known("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule"),
        Phase::Schedule,
    ),
    (
        known(
            "vllm/v1/core/sched/scheduler.py",
            "Scheduler.update_from_output",
        ),
        Phase::OutputProcessing,
    ),
    // The CPU runner's base; the EngineCore's wait for its workers is the model's time too.
    (
        known(
            "vllm/v1/worker/gpu_model_runner.py",
            "GPUModelRunner.execute_model",
        ),
        Phase::ModelExecution,
    ),
    (
        known(
            "vllm/v1/worker/gpu_model_runner.py",
            "GPUModelRunner.sample_tokens",
        ),
        Phase::ModelExecution,
    ),
    (
        known("vllm/v1/worker/gpu_worker.py", "Worker.execute_model"),
        Phase::ModelExecution,
    ),
    (
        known(
            "vllm/v1/executor/multiproc_executor.py",
            "MultiprocExecutor.execute_model",
        ),
        Phase::ModelExecution,
    ),
    (
        known(
            "vllm/v1/executor/uniproc_executor.py",
            "UniProcExecutor.execute_model",
        ),
        Phase::ModelExecution,
    ),
    (
        known(
            "vllm/v1/engine/output_processor.py",
            "OutputProcessor.process_outputs",
        ),
        Phase::OutputProcessing,
    ),
    // The output thread's serialisation.
    (
        known(
            "vllm/v1/engine/core.py",
            "EngineCoreProc.process_output_sockets",
        ),
        Phase::OutputProcessing,
    ),
    (
        known(
            "vllm/v1/engine/detokenizer.py",
            "IncrementalDetokenizer.update",
        ),
        Phase::Detokenization,
    ),
    (
        known(
            "vllm/v1/engine/detokenizer.py",
            "BaseIncrementalDetokenizer.update",
        ),
        Phase::Detokenization,
    ),
    (
        known(
            "vllm/v1/engine/detokenizer.py",
            "FastIncrementalDetokenizer.decode_next",
        ),
        Phase::Detokenization,
    ),
    (
        known(
            "vllm/v1/engine/detokenizer.py",
            "SlowIncrementalDetokenizer.decode_next",
        ),
        Phase::Detokenization,
    ),
    (
        known("vllm/renderers/base.py", "BaseRenderer._tokenize_prompt"),
        Phase::Tokenization,
    ),
    (
        known(
            "vllm/renderers/base.py",
            "BaseRenderer._tokenize_singleton_prompt",
        ),
        Phase::Tokenization,
    ),
    (
        known(
            "vllm/renderers/base.py",
            "BaseRenderer._tokenize_singleton_prompt_async",
        ),
        Phase::Tokenization,
    ),
    (
        known(
            "vllm/v1/engine/input_processor.py",
            "InputProcessor.process_inputs",
        ),
        Phase::Tokenization,
    ),
    // SGLang
    (
        known(
            "sglang/srt/managers/scheduler.py",
            "Scheduler.get_next_batch_to_run",
        ),
        Phase::Schedule,
    ),
    (
        known("sglang/srt/managers/scheduler.py", "Scheduler.run_batch"),
        Phase::ModelExecution,
    ),
    (
        known(
            "sglang/srt/managers/tp_worker.py",
            "TpModelWorker.forward_batch_generation",
        ),
        Phase::ModelExecution,
    ),
    (
        known(
            "sglang/srt/managers/scheduler.py",
            "Scheduler.process_batch_result",
        ),
        Phase::OutputProcessing,
    ),
    (
        known(
            "sglang/srt/managers/tokenizer_manager.py",
            "TokenizerManager._tokenize_one_request",
        ),
        Phase::Tokenization,
    ),
    (
        known(
            "sglang/srt/managers/tokenizer_manager.py",
            "TokenizerManager._batch_tokenize_and_process",
        ),
        Phase::Tokenization,
    ),
    (
        known(
            "sglang/srt/managers/detokenizer_manager.py",
            "DetokenizerManager.handle_batch_token_id_out",
        ),
        Phase::Detokenization,
    ),
];

/// Thread roles by a function on the thread's stack (any frame: the loop a thread runs is its
/// outermost engine frame).
const ROLE_BY_FUNCTION: &[(Known, &str)] = &[
    (
        known("vllm/v1/engine/core.py", "EngineCoreProc.run_busy_loop"),
        "vLLM EngineCore busy loop",
    ),
    (
        known("vllm/v1/engine/core.py", "DPEngineCoreProc.run_busy_loop"),
        "vLLM EngineCore busy loop",
    ),
    (
        known(
            "vllm/v1/engine/core.py",
            "EngineCoreProc.process_input_sockets",
        ),
        "vLLM EngineCore input thread",
    ),
    (
        known(
            "vllm/v1/engine/core.py",
            "EngineCoreProc.process_output_sockets",
        ),
        "vLLM EngineCore output thread",
    ),
    (
        known(
            "vllm/v1/executor/multiproc_executor.py",
            "WorkerProc.worker_busy_loop",
        ),
        "vLLM worker busy loop",
    ),
    (
        known(
            "sglang/srt/managers/scheduler.py",
            "Scheduler.run_event_loop",
        ),
        "SGLang scheduler loop",
    ),
    (
        known(
            "sglang/srt/managers/detokenizer_manager.py",
            "DetokenizerManager.event_loop",
        ),
        "SGLang detokenizer loop",
    ),
];

/// Thread roles by the file of a frame on the stack, the outermost deciding: the event loop a
/// thread runs. vLLM's API server starts uvloop with `uvloop.run` (uvloop/__init__.py, which
/// calls asyncio's runner); SGLang's through uvicorn and `asyncio.Runner` (asyncio/runners.py)
/// with uvloop's policy installed, which no Python frame shows.
const ROLE_BY_FILE: &[(&str, &str)] = &[
    ("uvloop/__init__.py", "uvloop event loop"),
    ("asyncio/runners.py", "asyncio event loop"),
    ("asyncio/base_events.py", "asyncio event loop"),
];

/// Thread roles by the thread's name (native threads: no Python frames to go by). libzmq names
/// its background threads `ZMQbg/IO/<n>` and `ZMQbg/Reaper`; gRPC core (the engines' OTLP
/// exporters) `event_engine`; PyTorch's gloo backend `gloo_tcp_loop`.
const ROLE_BY_NAME_PREFIX: &[(&str, &str)] = &[
    ("ZMQbg/IO/", "ZMQ I/O thread"),
    ("ZMQbg/Reaper", "ZMQ reaper thread"),
    ("event_engine", "gRPC event engine"),
    ("gloo_tcp_loop", "PyTorch gloo I/O"),
];

/// The phase of a stack (innermost frame first).
pub fn phase_of(stack: &[CodeName]) -> Option<Phase> {
    stack.iter().find_map(|frame| {
        WELL_KNOWN
            .iter()
            .find(|(function, _)| function.matches(frame))
            .map(|(_, phase)| *phase)
    })
}

/// The role of a thread whose sample showed `stack` (innermost frame first), when the tables
/// know it: its engine loop first, then its event loop (see [`name_role`] for the rest). It
/// depends on the stack alone, so it is worked out once per distinct stack.
pub fn stack_role(stack: &[CodeName]) -> Option<&'static str> {
    let by_function = || {
        stack.iter().rev().find_map(|frame| {
            ROLE_BY_FUNCTION
                .iter()
                .find(|(function, _)| function.matches(frame))
                .map(|(_, role)| *role)
        })
    };
    let by_file = || {
        stack.iter().rev().find_map(|frame| {
            ROLE_BY_FILE
                .iter()
                .find(|(file, _)| frame.file.ends_with(file))
                .map(|(_, role)| *role)
        })
    };
    by_function().or_else(by_file)
}

/// The role of a thread named `name` whose stacks told none.
pub fn name_role(name: &str) -> Option<&'static str> {
    ROLE_BY_NAME_PREFIX
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, role)| *role)
}

/// A stack of functions by name alone (innermost first), for tests.
#[cfg(test)]
pub(crate) fn stack(names: &[&str]) -> Vec<CodeName> {
    names
        .iter()
        .map(|n| CodeName {
            name: (*n).into(),
            file: String::new(),
            line: 1,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_role(name: &str, stack: &[CodeName]) -> Option<&'static str> {
        stack_role(stack).or_else(|| name_role(name))
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
        assert_eq!(SampleKind::of(&forward).label(), "model execution");
        assert_eq!(
            SampleKind::of(&stack(&["EngineCore.step"])),
            SampleKind::Other
        );
        assert_eq!(SampleKind::of(&[]).label(), "native");
        assert_eq!(Phase::ModelExecution.name(), "model execution");
    }

    #[test]
    fn threads_are_named_by_their_loop_then_by_their_name() {
        let framed = |frames: &[(&str, &str)]| -> Vec<CodeName> {
            frames
                .iter()
                .map(|(name, file)| CodeName {
                    name: (*name).into(),
                    file: (*file).into(),
                    line: 1,
                })
                .collect()
        };
        let busy_loop = framed(&[
            ("Scheduler.schedule", "vllm/v1/core/sched/scheduler.py"),
            ("EngineCoreProc.run_busy_loop", "vllm/v1/engine/core.py"),
            ("run_engine_core", "vllm/v1/engine/core.py"),
        ]);
        assert_eq!(
            thread_role("VLLM::EngineCor", &busy_loop),
            Some("vLLM EngineCore busy loop")
        );
        let api_server = framed(&[
            (
                "OpenAIServingChat.create_chat_completion",
                "serving_chat.py",
            ),
            (
                "run",
                "/venv/lib/python3.11/site-packages/uvloop/__init__.py",
            ),
            ("main", "vllm/entrypoints/cli/main.py"),
        ]);
        assert_eq!(thread_role("vllm", &api_server), Some("uvloop event loop"));
        let sglang_main = framed(&[
            (
                "TokenizerManager.handle_loop",
                "sglang/srt/managers/tokenizer_manager.py",
            ),
            ("Runner.run", "/usr/lib/python3.11/asyncio/runners.py"),
            ("Server.run", "uvicorn/server.py"),
        ]);
        assert_eq!(
            thread_role("python", &sglang_main),
            Some("asyncio event loop")
        );
        assert_eq!(thread_role("ZMQbg/IO/0", &[]), Some("ZMQ I/O thread"));
        // CPython 3.10 names frames by their bare function name: matched with the file.
        let on_3_10 = framed(&[
            (
                "schedule",
                "/venv/lib/python3.10/site-packages/vllm/v1/core/sched/scheduler.py",
            ),
            (
                "run_busy_loop",
                "/venv/lib/python3.10/site-packages/vllm/v1/engine/core.py",
            ),
        ]);
        assert_eq!(
            thread_role("VLLM::EngineCor", &on_3_10),
            Some("vLLM EngineCore busy loop")
        );
        assert_eq!(phase_of(&on_3_10), Some(Phase::Schedule));
        // The same bare name in another file is not the engine's.
        let elsewhere = framed(&[
            ("schedule", "/app/jobs.py"),
            ("run_busy_loop", "/app/loop.py"),
        ]);
        assert_eq!(phase_of(&elsewhere), None);
        // A name that only ends like the bare name is not it.
        let partial = framed(&[("dule", "vllm/v1/core/sched/scheduler.py")]);
        assert_eq!(phase_of(&partial), None);
        assert_eq!(thread_role("python3", &elsewhere), None);
        assert_eq!(thread_role("python3", &stack(&["f", "g"])), None);
    }
}
