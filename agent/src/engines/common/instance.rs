//! What every engine instance holds besides its engine's own tracker: the server it traces,
//! its span options (the server's model as the default), its clock, its span ids, and the
//! CUDA steps and Python samples of its processes. The pipeline reaches these through
//! `EngineInstance::core`, whatever the engine.
use crate::{
    discover::engine::Target,
    engines::common::iteration_work::IterationWork,
    telemetry::{Clock, SpanOptions, span::IdGenerator},
};

pub struct InstanceCore {
    pub target: Target,
    pub spans: SpanOptions,
    /// The session's clock, moved as the wall clock moves.
    pub clock: Clock,
    pub ids: IdGenerator,
    /// Its processes' CUDA steps and Python samples, by iteration.
    pub work: IterationWork,
}

impl InstanceCore {
    /// For `target`: `spans` with the target's served model as the default model.
    pub fn new(target: &Target, spans: &SpanOptions, clock: Clock) -> Self {
        Self {
            target: target.clone(),
            spans: SpanOptions {
                default_model: target.served_model.clone(),
                ..spans.clone()
            },
            clock,
            ids: IdGenerator::default(),
            work: IterationWork::default(),
        }
    }
}
