//! SGLang: its wire format, pickle or msgpack (`wire`), its scheduler's log (`log`), request
//! tracker, scheduler loop, retractions, dispatch starts, spans, metrics and loss counters;
//! here, the engine kind (what of its processes is captured) and one traced server (an
//! instance).
pub mod dispatch_start;
pub mod log;
pub mod losses;
pub mod metrics;
pub mod output_receipts;
pub mod recognition;
pub mod retractions;
pub mod scheduler_loop;
pub mod spans;
pub mod tracker;
pub mod wire;

use std::any::Any;

use tracker::{SglangStats, SglangTrace, SglangTracker};

use crate::{
    decode::flows::Decoded,
    discover::{engine::Role, recognition::Recognition, sockets::FdKind},
    engines::{
        Engine,
        common::{handoff::HandoffStats, instance::InstanceCore, iteration_work::IterationWork},
        engine::{EngineInstance, EngineKind, Output, default_fd_action},
    },
    export::console::SummaryField,
    telemetry::{
        agent_metrics,
        metrics::{MetricDef, Registry},
    },
};
use infertrace_common::fd_action;

/// stdout and stderr.
const STANDARD_OUTPUTS: [u32; 2] = [1, 2];

/// The SGLang engine kind. Its requests are rebuilt from its main process's and scheduler's
/// sides: the eventfds of main, of the scheduler and of the data-parallel controller are
/// watched (libzmq's mailboxes: when a message was taken or handed over); the detokenizer's
/// sockets (the middle copies of every output) are not copied. The scheduler's stdout and
/// stderr are read line by line: its statistics reports are written nowhere else.
pub struct Sglang;

impl EngineKind for Sglang {
    fn engine(&self) -> Engine {
        Engine::Sglang
    }

    fn recognition(&self) -> &'static Recognition {
        &recognition::RECOGNITION
    }

    fn metrics(&self) -> Vec<&'static MetricDef> {
        [&metrics::ALL[..], &losses::ALL[..]].concat()
    }

    fn console_fields(&self) -> &'static [SummaryField] {
        &metrics::CONSOLE
    }

    fn decoded_kind(&self, role: &Role, kind: FdKind, fd: u32) -> FdKind {
        // The scheduler polls its socket between forward passes: its mailbox reads time the
        // requests it takes, its mailbox writes the outputs it sends; the DP controller
        // passes each request on to a scheduler (its `dpc_dispatch`).
        let watched = matches!(
            role,
            Role::ApiServer | Role::Scheduler | Role::DataParallelController
        );
        match kind {
            FdKind::Eventfd { .. } => FdKind::Eventfd { watched },
            // A terminal, pipe or file; or a socket (systemd hands services a unix socket).
            kind if *role == Role::Scheduler
                && STANDARD_OUTPUTS.contains(&fd)
                && !matches!(kind, FdKind::Tcp { .. }) =>
            {
                FdKind::Log {
                    what: format!("fd {fd} of SGLang's scheduler (its log)"),
                }
            }
            kind if *role == Role::Detokenizer && kind.capture() => FdKind::Other {
                what: "socket of SGLang's detokenizer (main's and the scheduler's sides are \
                       decoded)"
                    .to_string(),
            },
            kind => kind,
        }
    }

    /// The scheduler's mailboxes have their polls reported too (its loop's iterations:
    /// `scheduler_loop`); nobody else's are (an asyncio loop checks its sockets' mailboxes
    /// thousands of times a second).
    fn fd_action(&self, role: &Role, kind: &FdKind) -> u8 {
        match kind {
            FdKind::Eventfd { watched: true } if *role == Role::Scheduler => {
                fd_action::CAPTURE_POLLS
            }
            kind => default_fd_action(kind),
        }
    }

    /// Main and the DP controller serialize each request with `pickle.dumps` before they send
    /// it: its entry is where the dispatch begins (`dispatch_start`).
    fn probes_pickle(&self, role: &Role) -> bool {
        matches!(role, Role::ApiServer | Role::DataParallelController)
    }

    fn instance(&self, core: InstanceCore) -> Box<dyn EngineInstance> {
        tracing::info!(
            "SGLang (pid {}): entry, request, thread and stage spans, retract events, the \
             request metrics, and the scheduler's snapshot counters from its log (when it logs \
             at info level)",
            core.target.pid
        );
        Box::new(SglangInstance {
            tracker: SglangTracker::default(),
            metrics: metrics::SglangMetrics {
                model_name: core.spans.default_model.clone(),
            },
            core,
        })
    }
}

/// One traced SGLang server.
pub struct SglangInstance {
    core: InstanceCore,
    tracker: SglangTracker,
    metrics: metrics::SglangMetrics,
}

impl SglangInstance {
    /// The tracker's counters (for tests).
    pub fn stats(&self) -> SglangStats {
        self.tracker.stats
    }

    /// Finished requests to the metrics and their spans.
    fn emit(&mut self, mut traces: Vec<SglangTrace>, out: &mut Output) {
        for trace in &mut traces {
            annotate(&self.core.work, trace);
            self.metrics.request(out.registry, trace, &self.core.clock);
        }
        let c = &mut self.core;
        for trace in &traces {
            out.traces
                .push(spans::spans(trace, &c.spans, &c.clock, &mut c.ids));
        }
    }

    /// What the summary says of the DP controller, when requests passed through one.
    fn dp_controller_summary(&self) -> String {
        let g = &self.tracker.stats;
        let passed = g.dpc_dispatch_starts + g.dpc_dispatch_starts_unknown;
        if passed == 0 {
            return String::new();
        }
        format!(
            ", {passed} requests passed through the DP controller (its dispatch start seen for \
             {}, not for {}: its serialization not probed or not certain)",
            g.dpc_dispatch_starts, g.dpc_dispatch_starts_unknown
        )
    }
}

/// Put on a finished request's outputs what its scheduler launched since the output before
/// (SGLang's scheduler runs a batch's forward pass in its own process, and sends the batch's
/// outputs after it; its overlap scheduler, the default, launches the next batch before it
/// sends this one's outputs, so a window then holds that batch's launches rather than this
/// one's).
fn annotate(work: &IterationWork, trace: &mut SglangTrace) {
    for engine in &mut trace.engine {
        let Some(pid) = engine.scheduler_pid else {
            continue;
        };
        let windows = || engine.scheduler_output_ns.windows(2);
        engine.gpu_per_output = std::iter::once(None)
            .chain(windows().map(|w| work.launches_between(w[0], w[1], Some(pid))))
            .collect();
        engine.python_per_output = std::iter::once(None)
            .chain(windows().map(|w| work.samples_between(w[0], w[1], |p| p == pid)))
            .collect();
    }
}

impl EngineInstance for SglangInstance {
    fn core(&self) -> &InstanceCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut InstanceCore {
        &mut self.core
    }

    fn handle(&mut self, batch: &[&Decoded], out: &mut Output) {
        for decoded in batch {
            self.tracker.feed(decoded);
        }
        for stats in &self.tracker.take_reports() {
            metrics::report(out.registry, stats);
        }
    }

    fn advance(&mut self, now_ns: u64, out: &mut Output) {
        let traces = self.tracker.advance(now_ns);
        self.emit(traces, out);
    }

    fn finish(&mut self, out: &mut Output) {
        let traces = self.tracker.finish();
        self.emit(traces, out);
    }

    fn counters(&self, registry: &mut Registry) {
        losses::totals(registry, &self.tracker.stats);
        agent_metrics::handoffs(registry, &self.tracker.handoff_stats());
        agent_metrics::in_flight(registry, self.tracker.in_flight());
    }

    fn handoff_stats(&self) -> HandoffStats {
        self.tracker.handoff_stats()
    }

    fn summary(&self) -> String {
        let g = &self.tracker.stats;
        format!(
            "SGLang (pid {}): {} requests sent to the scheduler, {} outputs ({} repeating the \
             scheduler's send, not decoded again), {} undecodable messages, {} health checks left out, {} outputs of requests sent before attach, {} \
             requests unfinished at the end, {} dropped (too many in flight), {} scheduler log \
             lines read ({} statistics reports), {} retractions placed ({} whose request was \
             not certain left out), {} scheduler loop iterations followed, decode steps and \
             batches placed for {} requests ({} left out: not shown whole by the loop), \
             dispatch start seen for {} requests ({} without: main's serialization not probed \
             or not certain)",
            self.core.target.pid,
            g.requests,
            g.outputs,
            g.outputs_repeating_sends,
            g.undecodable,
            g.health_checks,
            g.outputs_without_request,
            g.unfinished_at_end,
            g.evicted,
            g.log_lines,
            g.stats_reports,
            g.retractions_placed,
            g.retractions_unplaced,
            g.loop_iterations,
            g.loop_requests_placed,
            g.loop_requests_not_placed,
            g.dispatch_starts,
            g.dispatch_starts_unknown
        ) + &self.dp_controller_summary()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
