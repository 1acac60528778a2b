//! The engine interface. An engine *kind* (vLLM, SGLang: one folder each, listed once in
//! [`super::kind`]) says which of its processes' fds the capture copies and what probes its
//! processes need, and starts *instances*. An instance is one traced server (one attach
//! target): it owns everything of that server's requests (its wire decoding, request
//! tracking, spans, metrics, loss counters and its part of the summary), so that any mix of
//! servers of any kinds lives side by side in one agent, none touching another's state.
//!
//! The pipeline routes each decoded message to the instance whose process tree it came from,
//! gives each instance the CUDA steps and Python samples of its own processes, and calls it
//! with its own metrics scope: nothing outside the engine folders knows an engine.
use std::any::Any;

use crate::{
    decode::flows::Decoded,
    discover::{engine::Role, recognition::Recognition, sockets::FdKind},
    engines::{
        Engine,
        common::{handoff::HandoffStats, instance::InstanceCore},
    },
    export::console::SummaryField,
    telemetry::{
        metrics::{MetricDef, Registry},
        span::Span,
    },
};
use infertrace_common::fd_action;

/// What an engine kind knows before any of its servers is traced.
pub trait EngineKind: Sync {
    fn engine(&self) -> Engine;

    /// How discovery recognises its processes (titles, launch commands, package, model).
    fn recognition(&self) -> &'static Recognition;

    /// Its metrics (the spec's and its loss counters), for exporters that declare their
    /// instruments up front.
    fn metrics(&self) -> Vec<&'static MetricDef>;

    /// The figures of its servers' lines on the console.
    fn console_fields(&self) -> &'static [SummaryField];

    /// What is decoded of fd `fd` of one of its processes in `role`, which /proc says is
    /// `kind`: its kind unchanged (decoded whole), or another saying why it is not copied, or
    /// that it is read otherwise (a log, a watched mailbox).
    fn decoded_kind(&self, role: &Role, kind: FdKind, fd: u32) -> FdKind;

    /// What the kernel does with such an fd (`fd_action`): by default, copy what is decoded.
    fn fd_action(&self, _role: &Role, kind: &FdKind) -> u8 {
        default_fd_action(kind)
    }

    /// Whether its process in `role` has CPython's `pickle.dumps` probed (where the entry
    /// times the start of a request's dispatch).
    fn probes_pickle(&self, _role: &Role) -> bool {
        false
    }

    /// An instance for one server, around what every instance holds.
    fn instance(&self, core: InstanceCore) -> Box<dyn EngineInstance>;
}

/// What the kernel does with an fd of that kind, unless an engine says otherwise: copy what is
/// decoded, ignore the rest.
pub fn default_fd_action(kind: &FdKind) -> u8 {
    if kind.capture() {
        fd_action::CAPTURE
    } else {
        fd_action::IGNORE
    }
}

/// What is decoded of an fd of a process that is not an engine's: everything but its
/// eventfds.
pub fn decoded_kind_of_non_engine(kind: FdKind) -> FdKind {
    match kind {
        FdKind::Eventfd { .. } => FdKind::Eventfd { watched: false },
        kind => kind,
    }
}

/// Where an instance puts what it made: its metrics (the registry already in the instance's
/// scope) and each finished trace's spans, exported in that order.
pub struct Output<'a> {
    pub registry: &'a mut Registry,
    pub traces: &'a mut Vec<Vec<Span>>,
}

/// One traced server.
pub trait EngineInstance {
    /// What every instance holds (the server, its clock, its iterations' work).
    fn core(&self) -> &InstanceCore;
    fn core_mut(&mut self) -> &mut InstanceCore;

    /// Messages of its processes, in time order.
    fn handle(&mut self, batch: &[&Decoded], out: &mut Output);

    /// Capture time has reached `now_ns`: report what waited long enough.
    fn advance(&mut self, now_ns: u64, out: &mut Output);

    /// The end of the session: report everything still held.
    fn finish(&mut self, out: &mut Output);

    /// Its loss counters and hand-over counts, into `registry` (in the instance's scope).
    fn counters(&self, registry: &mut Registry);

    /// How its frontend's instants were found.
    fn handoff_stats(&self) -> HandoffStats;

    /// Its part of the summary printed at the end.
    fn summary(&self) -> String;

    /// For tests that look at one engine's own counters.
    fn as_any(&self) -> &dyn Any;
}
