//! When a process's event loop took over a message its ZeroMQ I/O thread had received.
//!
//! vLLM stamps a request's first token and its end (the process-clock latencies: time to
//! first token, e2e) when its asyncio loop handles the engine's output, not when the bytes
//! reach the process. The bytes are received by libzmq's I/O thread (the syscall the agent
//! captures); when the loop had drained the socket and gone to sleep, the I/O thread wakes it
//! by writing the socket's mailbox eventfd, and the loop reads that eventfd when it gets round
//! to it — milliseconds later when it is busy with HTTP traffic. Reading the mailbox is the
//! instant closest to vLLM's own that the kernel sees.
//!
//! The rules follow libzmq's: a message signals the mailbox only when the reader was asleep
//! (it had found the pipe empty), and the reader, once woken, takes every message waiting.
//! - The mailbox of a process's output socket is the eventfd written first after output
//!   messages arrive, learned by votes (the I/O thread writes it within microseconds).
//! - The message a mailbox write follows woke the loop: it and every message after it until
//!   the loop reads the mailbox were taken over at that read.
//! - A message no write followed arrived while the loop was still busy with earlier ones: it was
//!   taken over at some instant after it arrived that no syscall shows, so its arrival stands
//!   (a lower bound) and it is counted as such. Except when the loop was held: a message that
//!   arrived during an iteration of the loop longer than `LONG_ITERATION_NS` (a garbage
//!   collection pass of SGLang's main, measured at 0.44-0.86 s on 2026-12-06) waited for that
//!   iteration to end, which the kernel reports (the wait after it, with when it began); it is
//!   timed at that iteration's end ([`Handoffs::loop_waited`]).
//!
//! - vLLM stamps an output one loop iteration after that read: the read happens in the socket
//!   task (or in pyzmq's reader callback, which wakes that task for the next iteration); the
//!   task decodes the message and puts it on an asyncio queue, and `output_handler`, woken by
//!   the queue, runs in the iteration after. asyncio (uvloop) runs the callbacks made ready in
//!   one iteration in the next one, after waiting in epoll, so `output_handler` runs once the
//!   loop thread's first epoll wait that began after the read has returned. SGLang's frontend
//!   handles its outputs in the socket's task: with pickle (its default) the task awaits
//!   pyzmq's `recv_pyobj`, whose result reaches it through a second future chained to the
//!   receive (one more callback: the next iteration too); with msgpack it awaits `recv` and
//!   handles the output in the iteration of the read. How a message is handled once read is
//!   its [`Handling`]; the agent follows main threads' epoll waits ([`LoopWait`], passed on
//!   by [`Handoffs::loop_waited`]).
//!
//! Sending is the mirror image: the application thread's `send` queues the message and, when
//! the I/O thread was idle, wakes it by writing the I/O thread's mailbox; the I/O thread's
//! write to the socket (the syscall captured) comes after. The application's instant (SGLang's
//! "dispatched", the scheduler's end of a step) is the return of libzmq's `zmq_msg_send`, which
//! a uprobe sees ([`Handover`], matched to the writes by `send_probe`). Without the probe (a
//! process whose libzmq could not be probed, a recording made before it, a socket not learned
//! yet) it is the mailbox write: the eventfd most often written just before sends, learned by
//! votes like the receive side's; each write hands over one message, however long the I/O
//! thread then waited for a CPU. A message sent with neither keeps its send time (counted): the
//! I/O thread was awake already, busy or waiting for a CPU, and the application's send left no
//! syscall.
use crate::FastMap;
use std::collections::VecDeque;

use super::{
    send_probe::{LateMatch, SendProbe},
    votes::elected,
};
use crate::decode::flows::{Handover, LoopWait, Wakeup};

/// A write this long after a message is not that message's signal.
const SIGNAL_WINDOW_NS: u64 = 1_000_000;
/// Once the I/O thread's mailbox is known, how long after the application's write to it the
/// I/O thread may still be sending the message that write handed over: the thread can be kept
/// off the CPU (4.7 ms seen on 2 cores with SGLang's scheduler spinning on one of them).
const SEND_WAKE_WINDOW_NS: u64 = 20_000_000;
/// Votes an eventfd needs before it is taken for the output socket's mailbox. Outputs before
/// that keep their arrival (counted): a wrong mailbox would misplace instants, uncounted.
const VOTES_NEEDED: u32 = 3;
/// Eventfd writes remembered per process, to find the one that woke the I/O thread for a send.
const RECENT_WRITES: usize = 32;
/// Messages no signal followed, kept per process until a wait of its loop's thread places them
/// (the oldest go first, at their arrival, past this many: a loop the agent sees no waits of).
const MAX_UNSIGNALLED: usize = 4096;
/// A thread's long iterations place messages only once it has shown this many short ones per
/// long one: it runs an event loop that waits at every iteration. A thread that waits in epoll
/// now and then (an engine process's busy loop calling into a library) has only long ones.
const SHORT_PER_LONG_ITERATION: u64 = 8;
/// Take-over instants kept for lookup, the oldest going first: at a hundred engine steps a
/// second, over twenty minutes; a request whose first token is older reports its arrival.
const MAX_KEPT: usize = 131_072;

/// How the process instants of finished requests were found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HandoffStats {
    /// Messages whose take-over by the event loop was seen (a mailbox read).
    pub taken_over: u64,
    /// Of those, messages timed at the loop's next iteration after the read (vLLM).
    pub next_iteration: u64,
    /// Messages kept at their arrival time: received while the loop was busy, before the
    /// mailbox was learned, or in a capture without eventfds.
    pub at_arrival: u64,
    /// Of those, messages received during an iteration of the event loop longer than
    /// `LONG_ITERATION_NS` (the loop was held): timed at that iteration's end instead.
    pub after_long_iteration: u64,
    /// Messages sent whose hand-over to the I/O thread was seen (libzmq's send returning, or
    /// its mailbox write).
    pub handed_over: u64,
    /// Of those, messages timed by the probe on libzmq's send (the rest: by the mailbox write).
    pub send_probed: u64,
    /// Messages sent timed at the I/O thread's write (it was already awake, or no eventfds).
    pub at_send: u64,
}

impl std::ops::Add for HandoffStats {
    type Output = Self;

    /// Two servers' counts together (the summary's totals).
    fn add(self, other: Self) -> Self {
        Self {
            taken_over: self.taken_over + other.taken_over,
            next_iteration: self.next_iteration + other.next_iteration,
            at_arrival: self.at_arrival + other.at_arrival,
            after_long_iteration: self.after_long_iteration + other.after_long_iteration,
            handed_over: self.handed_over + other.handed_over,
            send_probed: self.send_probed + other.send_probed,
            at_send: self.at_send + other.at_send,
        }
    }
}

/// When the application handles a message its event loop took over (see the module's notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// In the iteration of the take-over: at the mailbox read.
    AtTakeOver,
    /// In the loop's next iteration: when the main thread's first epoll wait begun after the
    /// take-over returns.
    NextIteration,
}

/// A message received, waiting to learn when the loop took it.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    ns: u64,
    /// Someone may ask about it (it carried request outputs).
    keep: bool,
    handling: Handling,
}

/// One process's ZeroMQ sockets, as far as its wakeups tell.
#[derive(Default)]
struct Process {
    votes: FastMap<u32, u32>,
    mailbox: Option<u32>,
    /// The messages of the latest read with no mailbox write since (one read can bring
    /// several, each completed at its instant); they may be about to signal.
    candidate: Vec<Arrival>,
    /// The candidate already voted (only the first write after a message votes).
    voted: bool,
    /// The mailbox was written and not yet read: these messages wait for the read.
    signalled: Option<Vec<Arrival>>,
    /// The latest mailbox read: a write record older than it was already consumed.
    last_read_ns: u64,
    /// Messages that read took over, by arrival, until the loop thread's next epoll wait
    /// (only when the loop runs on the main thread, whose waits the agent sees).
    awaiting_iteration: Vec<u64>,
    /// Messages no signal followed (those asked about), oldest first, until the loop thread's
    /// next wait tells whether they arrived in a long iteration.
    unsignalled: VecDeque<Arrival>,
    /// The loop thread's waits reported, after a short iteration and after a long one.
    short_iterations: u64,
    long_iterations: u64,
    /// The latest eventfd writes (fd, ns), oldest first.
    recent_writes: VecDeque<(u32, u64)>,
    send_votes: FastMap<u32, u32>,
    /// The I/O thread's mailbox, written by the application thread to have a message sent.
    send_mailbox: Option<u32>,
    /// The application's sends as libzmq's probe saw them.
    send_probe: SendProbe,
    /// The key of the latest message sent per fd (see [`Handoffs::sent`]).
    latest_sent: FastMap<u32, u64>,
}

/// Take-over instants of received messages, per process process.
#[derive(Default)]
pub struct Handoffs {
    processes: FastMap<u32, Process>,
    taken: TakenInstants,
    pub stats: HandoffStats,
}

/// The instants found, by the capture time they replace; the oldest go first past
/// [`MAX_KEPT`].
#[derive(Default)]
struct TakenInstants {
    by_capture: FastMap<u64, u64>,
    order: VecDeque<u64>,
}

impl TakenInstants {
    fn remember(&mut self, captured_ns: u64, instant_ns: u64) {
        if self.by_capture.insert(captured_ns, instant_ns).is_none() {
            self.order.push_back(captured_ns);
        }
        if self.order.len() > MAX_KEPT
            && let Some(oldest) = self.order.pop_front()
        {
            self.by_capture.remove(&oldest);
        }
    }
}

impl Handoffs {
    /// Process `tgid` received an engine output message completed at `ns`, which it handles
    /// as `handling` says. `keep`: its take-over instant will be asked for.
    pub fn received(&mut self, tgid: u32, ns: u64, keep: bool, handling: Handling) {
        let process = self.processes.entry(tgid).or_default();
        let arrival = Arrival { ns, keep, handling };
        if let Some(waiting) = process.signalled.as_mut() {
            waiting.push(arrival);
            return;
        }
        if process.candidate.first().is_some_and(|c| c.ns != ns) {
            let earlier = std::mem::take(&mut process.candidate);
            self.stats.at_arrival += kept(&earlier);
            process.hold_unsignalled(earlier);
        }
        process.candidate.push(arrival);
        process.voted = false;
    }

    /// An application thread of process `h.tgid` handed a message to libzmq. Its record can
    /// come after the I/O thread's write of that message (the call returns after the write
    /// began): that write, already timed by a fallback, is timed again by its hand-over.
    pub fn handed_over(&mut self, h: &Handover) {
        let process = self.processes.entry(h.tgid).or_default();
        let late = process.send_probe.handed_over(h);
        // Its vote may have elected its socket, timing the writes before.
        let elected = process.send_probe.take_elected();
        for late in late.into_iter().chain(elected) {
            self.late_match(late);
        }
    }

    /// A write timed by a fallback is timed again by its hand-over.
    fn late_match(&mut self, late: LateMatch) {
        if late.keep {
            if late.was_at_send {
                self.stats.at_send -= 1;
                self.stats.handed_over += 1;
            }
            self.stats.send_probed += 1;
            self.taken.remember(late.write_ns, late.handed_ns);
        }
    }

    /// Process `tgid`'s I/O thread started writing a message to `fd` at `written_ns`, whose
    /// last frame is `last_frame` bytes long (call it for every message sent: each one moves
    /// its socket's hand-overs on). `keep`: its hand-over instant will be asked for.
    ///
    /// Returns the message's key, the capture time [`Handoffs::taken_at`] answers for:
    /// `written_ns`, but a nanosecond after the previous message on `fd` when one syscall wrote
    /// both. An I/O thread kept off the CPU writes every message queued meanwhile at once, each
    /// with its own hand-over (a CI run: two of a scheduler's outputs handed over 4 ms apart).
    pub fn sent(
        &mut self,
        tgid: u32,
        fd: u32,
        written_ns: u64,
        last_frame: usize,
        keep: bool,
    ) -> u64 {
        let process = self.processes.entry(tgid).or_default();
        let ns = match process.latest_sent.get(&fd) {
            Some(&previous) => written_ns.max(previous + 1),
            None => written_ns,
        };
        process.latest_sent.insert(fd, ns);
        let handed = process.send_probe.written(fd, ns, last_frame, keep);
        // The first writes after attach, made before their socket was known: the write that
        // decided it times them too.
        for late in process.send_probe.take_elected() {
            self.late_match(late);
        }
        if let Some(handed) = handed {
            if keep {
                self.stats.handed_over += 1;
                self.stats.send_probed += 1;
                self.taken.remember(ns, handed);
            }
            return ns;
        }
        let at_send = !self.mailbox_handover(tgid, ns, keep);
        self.stats.at_send += u64::from(keep && at_send);
        if let Some(process) = self.processes.get_mut(&tgid) {
            process.send_probe.timed_at_send(ns, at_send);
        }
        ns
    }

    /// Time a send by the application's write to the I/O thread's mailbox that woke it, when
    /// there is one (true).
    fn mailbox_handover(&mut self, tgid: u32, ns: u64, keep: bool) -> bool {
        let process = self.processes.entry(tgid).or_default();
        let send_mailbox = process.send_mailbox;
        let latest = process
            .recent_writes
            .iter()
            .rposition(|&(_, w)| w <= ns)
            .filter(|&i| {
                let (fd, w) = process.recent_writes[i];
                let window = if send_mailbox == Some(fd) {
                    SEND_WAKE_WINDOW_NS
                } else {
                    SIGNAL_WINDOW_NS
                };
                ns - w <= window
            });
        let Some(i) = latest else {
            return false;
        };
        let (fd, w) = process.recent_writes[i];
        vote(&mut process.send_votes, &mut process.send_mailbox, fd);
        if process.send_mailbox != Some(fd) {
            return false;
        }
        // One write wakes the I/O thread once: later messages it sent were queued later. An
        // older write to the same mailbox is stale: the thread has been awake since.
        process
            .recent_writes
            .retain(|&(other_fd, other_w)| other_fd != fd || other_w > w);
        if keep {
            self.stats.handed_over += 1;
            self.taken.remember(ns, w);
        }
        true
    }

    /// A watched eventfd was read or written.
    pub fn wakeup(&mut self, w: &Wakeup) {
        let process = self.processes.entry(w.tgid).or_default();
        if w.write {
            if process.recent_writes.len() >= RECENT_WRITES {
                process.recent_writes.pop_front();
            }
            process.recent_writes.push_back((w.fd, w.ns));
            if w.ns <= process.last_read_ns {
                return;
            }
            let follows = process
                .candidate
                .first()
                .is_some_and(|c| w.ns >= c.ns && w.ns - c.ns <= SIGNAL_WINDOW_NS);
            if follows && !process.voted {
                process.voted = true;
                vote(&mut process.votes, &mut process.mailbox, w.fd);
            }
            if process.mailbox == Some(w.fd) && process.signalled.is_none() {
                let mut candidate = std::mem::take(&mut process.candidate);
                if !follows {
                    // Too late to be its signal: it was taken by a loop already awake.
                    self.stats.at_arrival += kept(&candidate);
                    process.hold_unsignalled(std::mem::take(&mut candidate));
                }
                process.signalled = Some(candidate);
            }
            return;
        }
        if process.mailbox != Some(w.fd) {
            return;
        }
        process.last_read_ns = w.ns;
        let woken = match process.signalled.take() {
            Some(waiting) => waiting,
            // The write's record is behind the read's in the ring: it signalled the candidate.
            None => {
                let mut candidate = std::mem::take(&mut process.candidate);
                candidate.retain(|c| c.ns <= w.ns);
                candidate
            }
        };
        let kept: Vec<u64> = woken.iter().filter(|a| a.keep).map(|a| a.ns).collect();
        process.awaiting_iteration = if w.tid == w.tgid {
            woken
                .iter()
                .filter(|a| a.keep && a.handling == Handling::NextIteration)
                .map(|a| a.ns)
                .collect()
        } else {
            Vec::new()
        };
        self.stats.taken_over += kept.len() as u64;
        for received_ns in kept {
            self.taken.remember(received_ns, w.ns);
        }
    }

    /// Process `wait.tgid`'s main thread waited in epoll: when the wait began after the latest
    /// mailbox read, the messages that read took over are handled once it returns. The
    /// messages no signal followed that arrived before it are placed: those of a long
    /// iteration (`wait.long_iteration_from_ns`) at its end, the others at their arrival.
    pub fn loop_waited(&mut self, wait: &LoopWait) {
        let Self {
            processes,
            taken,
            stats,
        } = self;
        let Some(process) = processes.get_mut(&wait.tgid) else {
            return;
        };
        // A message a signal did not follow within its window before the loop waited was
        // taken by a loop already awake.
        if process.signalled.is_none()
            && process
                .candidate
                .first()
                .is_some_and(|c| wait.enter_ns.saturating_sub(c.ns) > SIGNAL_WINDOW_NS)
        {
            let stale = std::mem::take(&mut process.candidate);
            stats.at_arrival += kept(&stale);
            process.hold_unsignalled(stale);
        }
        let held_from = match wait.long_iteration_from_ns {
            None => {
                process.short_iterations += 1;
                None
            }
            Some(from) => {
                process.long_iterations += 1;
                let event_loop =
                    process.short_iterations >= SHORT_PER_LONG_ITERATION * process.long_iterations;
                event_loop.then_some(from)
            }
        };
        while let Some(a) = process.unsignalled.front().copied() {
            if a.ns >= wait.enter_ns {
                break;
            }
            process.unsignalled.pop_front();
            if held_from.is_some_and(|from| a.ns > from) {
                stats.after_long_iteration += 1;
                // Taken at the iteration's end; handled there, or in the next iteration.
                let instant = match a.handling {
                    Handling::AtTakeOver => wait.enter_ns,
                    Handling::NextIteration => wait.exit_ns,
                };
                taken.remember(a.ns, instant);
            }
        }
        if wait.enter_ns < process.last_read_ns || process.awaiting_iteration.is_empty() {
            return;
        }
        let moved = std::mem::take(&mut process.awaiting_iteration);
        stats.next_iteration += moved.len() as u64;
        for received_ns in moved {
            taken.remember(received_ns, wait.exit_ns);
        }
    }

    /// When the message received at `received_ns` was taken over by its event loop (the
    /// mailbox read that woke the loop for it), or the message sent at that time was handed
    /// to the I/O thread (the mailbox write that woke it); else that time itself.
    pub fn taken_at(&self, ns: u64) -> u64 {
        self.taken.by_capture.get(&ns).copied().unwrap_or(ns)
    }
}

/// How many of `arrivals` will be asked about.
fn kept(arrivals: &[Arrival]) -> u64 {
    arrivals.iter().filter(|a| a.keep).count() as u64
}

impl Process {
    /// Messages no signal followed (counted already, at their arrival): those asked about wait
    /// for the loop thread's next wait ([`Handoffs::loop_waited`]), which may move them.
    fn hold_unsignalled(&mut self, arrivals: Vec<Arrival>) {
        for arrival in arrivals.into_iter().filter(|a| a.keep) {
            if self.unsignalled.len() >= MAX_UNSIGNALLED {
                self.unsignalled.pop_front();
            }
            self.unsignalled.push_back(arrival);
        }
    }
}

/// One vote for `fd`; the fd with the most votes (at least [`VOTES_NEEDED`]) is the mailbox.
fn vote(votes: &mut FastMap<u32, u32>, mailbox: &mut Option<u32>, fd: u32) {
    if elected(votes, *mailbox, fd, VOTES_NEEDED) {
        *mailbox = Some(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PID: u32 = 100;
    const IO_THREAD: u32 = 101;
    const MAILBOX: u32 = 23;
    const OTHER: u32 = 30;
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    /// The socket a process's I/O thread writes its sends to.
    const SEND_FD: u32 = 40;
    /// The length of the messages' last frame.
    const FRAME: usize = 64;

    fn wakeup(fd: u32, ns: u64, write: bool) -> Wakeup {
        Wakeup {
            tgid: PID,
            tid: if write { IO_THREAD } else { PID },
            fd,
            ns,
            write,
        }
    }

    /// An output at `at`, its signal 20 µs later, the loop's read `lag` after that.
    fn signalled_output(h: &mut Handoffs, at: u64, lag: u64) {
        h.received(PID, at, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, at + 20 * US, true));
        h.wakeup(&wakeup(MAILBOX, at + 20 * US + lag, false));
    }

    /// A handoff table that has learned the mailbox from three quiet outputs.
    fn learned() -> Handoffs {
        let mut h = Handoffs::default();
        for i in 0..3 {
            signalled_output(&mut h, i * 10 * MS, MS);
        }
        h
    }

    #[test]
    fn a_message_is_taken_over_at_the_mailbox_read_once_the_mailbox_is_learned() {
        let h = learned();
        // Two votes do not make a mailbox: those outputs keep their arrival; the third does.
        assert_eq!(h.taken_at(0), 0);
        assert_eq!(h.taken_at(10 * MS), 10 * MS);
        assert_eq!(h.taken_at(20 * MS), 20 * MS + 20 * US + MS);
        let mut h = h;
        signalled_output(&mut h, 30 * MS, 4 * MS);
        assert_eq!(h.taken_at(30 * MS), 30 * MS + 20 * US + 4 * MS);
        assert_eq!(
            h.stats,
            HandoffStats {
                taken_over: 2,
                at_arrival: 2,
                ..HandoffStats::default()
            }
        );
    }

    #[test]
    fn messages_arriving_before_the_read_share_it_and_busy_ones_keep_their_arrival() {
        let mut h = learned();
        let t = 100 * MS;
        // Woken by the first, the loop reads 5 ms later; a second arrives meanwhile.
        h.received(PID, t, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 10 * US, true));
        h.received(PID, t + MS, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 5 * MS, false));
        assert_eq!(h.taken_at(t), t + 5 * MS);
        assert_eq!(h.taken_at(t + MS), t + 5 * MS);
        // The loop is now busy: two outputs arrive without a signal, the next one signals.
        h.received(PID, t + 6 * MS, true, Handling::NextIteration);
        h.received(PID, t + 7 * MS, true, Handling::NextIteration);
        h.received(PID, t + 9 * MS, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 9 * MS + 10 * US, true));
        h.wakeup(&wakeup(MAILBOX, t + 12 * MS, false));
        assert_eq!(h.taken_at(t + 6 * MS), t + 6 * MS);
        assert_eq!(h.taken_at(t + 7 * MS), t + 7 * MS);
        assert_eq!(h.taken_at(t + 9 * MS), t + 12 * MS);
        assert_eq!(h.stats.at_arrival, 2 + 2);
        // Two outputs one read brought (completed at its instant), the write after them: both
        // taken over at the mailbox read, and counted so.
        h.received(PID, t + 20 * MS, true, Handling::NextIteration);
        h.received(PID, t + 20 * MS, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 20 * MS + 10 * US, true));
        h.wakeup(&wakeup(MAILBOX, t + 23 * MS, false));
        assert_eq!(h.taken_at(t + 20 * MS), t + 23 * MS);
        assert_eq!(
            (h.stats.taken_over, h.stats.at_arrival),
            (1 + 2 + 1 + 2, 2 + 2)
        );
    }

    #[test]
    fn other_eventfds_and_late_write_records_do_not_move_an_instant() {
        let mut h = learned();
        let t = 200 * MS;
        // A write to another eventfd right after the output (the loop's own wakeup), then a
        // read of it: neither is the mailbox.
        h.received(PID, t, true, Handling::NextIteration);
        h.wakeup(&wakeup(OTHER, t + 5 * US, true));
        h.wakeup(&wakeup(OTHER, t + 50 * US, false));
        assert_eq!(h.taken_at(t), t);
        // The mailbox read's record comes before the write's: the read still counts.
        h.wakeup(&wakeup(MAILBOX, t + 2 * MS, false));
        h.wakeup(&wakeup(MAILBOX, t + 20 * US, true));
        assert_eq!(h.taken_at(t), t + 2 * MS);
        // That late write opened no signal; the next output's read again comes first.
        h.received(PID, t + 3 * MS, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 9 * MS, false));
        assert_eq!(h.taken_at(t + 3 * MS), t + 9 * MS);
    }

    #[test]
    fn a_message_read_by_the_main_thread_is_handled_when_its_next_loop_wait_returns() {
        let mut h = learned();
        let t = 250 * MS;
        let wait = |enter_ns, exit_ns| LoopWait {
            tgid: PID,
            enter_ns,
            exit_ns,
            long_iteration_from_ns: None,
        };
        h.received(PID, t, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 20 * US, true));
        h.wakeup(&wakeup(MAILBOX, t + MS, false));
        // The wait the read came out of does not move it; the loop then runs 3 ms of other
        // callbacks, and the first wait begun after the read returns at once.
        h.loop_waited(&wait(t + 100 * US, t + 900 * US));
        assert_eq!(h.taken_at(t), t + MS);
        h.loop_waited(&wait(t + 4 * MS, t + 4 * MS + 10 * US));
        assert_eq!(h.taken_at(t), t + 4 * MS + 10 * US);
        // Later waits leave it there.
        h.loop_waited(&wait(t + 5 * MS, t + 6 * MS));
        assert_eq!(h.taken_at(t), t + 4 * MS + 10 * US);
        // A loop on another thread: its read stands (that thread's waits are not followed).
        let u = 260 * MS;
        h.received(PID, u, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, u + 20 * US, true));
        h.wakeup(&Wakeup {
            tid: PID + 7,
            ..wakeup(MAILBOX, u + MS, false)
        });
        h.loop_waited(&wait(u + 2 * MS, u + 3 * MS));
        assert_eq!(h.taken_at(u), u + MS);
        assert_eq!((h.stats.taken_over, h.stats.next_iteration), (1 + 2, 1));
    }

    #[test]
    fn messages_that_arrived_while_the_loop_was_held_are_taken_at_the_held_iterations_end() {
        let mut h = learned();
        let t = 2_000 * MS;
        let wait = |enter_ns, exit_ns, long_iteration_from_ns| LoopWait {
            tgid: PID,
            enter_ns,
            exit_ns,
            long_iteration_from_ns,
        };
        // A loop that waits at every iteration (a thread with only long ones is not one).
        h.loop_waited(&wait(t - 900 * MS, t - 200 * MS, Some(t - 990 * MS)));
        for i in 1..=SHORT_PER_LONG_ITERATION * 3 {
            h.loop_waited(&wait(t - 100 * MS + i * MS, t - 100 * MS + i * MS, None));
        }
        // Outputs no signal follows (the loop is awake), one before a normal wait: it keeps
        // its arrival, and a later long iteration does not move it.
        h.received(PID, t, true, Handling::AtTakeOver);
        h.received(PID, t + MS, true, Handling::AtTakeOver);
        h.loop_waited(&wait(t + 3 * MS, t + 3 * MS, None));
        // The loop is then held 600 ms (a garbage collection pass) from t + 4 ms; outputs reach
        // the process meanwhile, one handled at the read, one in the next iteration.
        h.received(PID, t + 100 * MS, true, Handling::AtTakeOver);
        h.received(PID, t + 200 * MS, true, Handling::NextIteration);
        h.received(PID, t + 550 * MS, true, Handling::AtTakeOver);
        let end = t + 604 * MS;
        h.loop_waited(&wait(end, end + 20 * US, Some(t + 4 * MS)));
        assert_eq!(h.taken_at(t), t);
        assert_eq!(h.taken_at(t + MS), t + MS);
        assert_eq!(h.taken_at(t + 100 * MS), end);
        assert_eq!(h.taken_at(t + 200 * MS), end + 20 * US);
        assert_eq!(h.taken_at(t + 550 * MS), end);
        assert_eq!(
            (h.stats.at_arrival, h.stats.after_long_iteration),
            (2 + 5, 3)
        );
        // A message arriving after that wait began waits for the next one.
        h.received(PID, end + 10 * US, true, Handling::AtTakeOver);
        h.received(PID, end + 5 * MS, true, Handling::AtTakeOver);
        h.loop_waited(&wait(end + 70 * MS, end + 71 * MS, Some(end + 20 * US)));
        assert_eq!(h.taken_at(end + 10 * US), end + 10 * US);
        assert_eq!(h.taken_at(end + 5 * MS), end + 70 * MS);
    }

    #[test]
    fn a_thread_that_waits_only_now_and_then_is_not_a_held_loop() {
        // An engine process's busy loop, whose main thread waits in epoll once in a while:
        // every wait it makes comes after a "long iteration".
        let mut h = learned();
        let t = 400 * MS;
        for i in 0..3 {
            let at = t + i * 300 * MS;
            h.received(PID, at, true, Handling::AtTakeOver);
            h.received(PID, at + MS, true, Handling::AtTakeOver);
            h.loop_waited(&LoopWait {
                tgid: PID,
                enter_ns: at + 200 * MS,
                exit_ns: at + 201 * MS,
                long_iteration_from_ns: Some(at - 100 * MS),
            });
            assert_eq!(h.taken_at(at), at);
        }
        assert_eq!(h.stats.after_long_iteration, 0);
    }

    #[test]
    fn a_message_handled_in_the_iteration_of_its_read_keeps_the_read() {
        let mut h = learned();
        let t = 250 * MS;
        h.received(PID, t, true, Handling::AtTakeOver);
        h.wakeup(&wakeup(MAILBOX, t + 20 * US, true));
        h.wakeup(&wakeup(MAILBOX, t + MS, false));
        h.loop_waited(&LoopWait {
            tgid: PID,
            enter_ns: t + 2 * MS,
            exit_ns: t + 3 * MS,
            long_iteration_from_ns: None,
        });
        assert_eq!(h.taken_at(t), t + MS);
        assert_eq!(h.stats.next_iteration, 0);
    }

    #[test]
    fn a_write_long_after_a_message_is_not_its_signal() {
        let mut h = learned();
        let t = 300 * MS;
        h.received(PID, t, true, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 2 * SIGNAL_WINDOW_NS, true));
        h.wakeup(&wakeup(MAILBOX, t + 3 * SIGNAL_WINDOW_NS, false));
        assert_eq!(h.taken_at(t), t);
        assert_eq!(h.stats.at_arrival, 2 + 1);
    }

    #[test]
    fn processes_are_apart_and_unkept_messages_are_not_stored() {
        let mut h = learned();
        let t = 400 * MS;
        h.received(PID + 1, t, true, Handling::NextIteration);
        signalled_output(&mut h, t + MS, MS);
        assert_eq!(h.taken_at(t), t);
        h.received(PID, t + 10 * MS, false, Handling::NextIteration);
        h.wakeup(&wakeup(MAILBOX, t + 10 * MS + 10 * US, true));
        h.wakeup(&wakeup(MAILBOX, t + 12 * MS, false));
        assert_eq!(h.taken_at(t + 10 * MS), t + 10 * MS);
    }

    #[test]
    fn a_send_is_handed_over_at_the_write_that_woke_the_io_thread() {
        const IO_MAILBOX: u32 = 40;
        let mut h = Handoffs::default();
        let app_signal = |at: u64| Wakeup {
            tgid: PID,
            tid: PID,
            fd: IO_MAILBOX,
            ns: at,
            write: true,
        };
        // Three sends, each woken by the application thread's write 50 us before: the third
        // vote makes that eventfd the I/O thread's mailbox.
        for i in 1..=3 {
            let at = i * 10 * MS;
            h.wakeup(&app_signal(at - 50 * US));
            h.sent(PID, SEND_FD, at, FRAME, true);
            let handed = if i == 3 { at - 50 * US } else { at };
            assert_eq!(h.taken_at(at), handed, "send {i}");
        }
        // Two messages out of one wake-up: the second was queued later, its send time stays.
        h.wakeup(&app_signal(40 * MS));
        h.sent(PID, SEND_FD, 40 * MS + 30 * US, FRAME, true);
        h.sent(PID, SEND_FD, 40 * MS + 60 * US, FRAME, true);
        assert_eq!(h.taken_at(40 * MS + 30 * US), 40 * MS);
        assert_eq!(h.taken_at(40 * MS + 60 * US), 40 * MS + 60 * US);
        // An I/O thread kept off the CPU for a while still sends what that write handed over,
        // and the write before it, never consumed, is stale from then on.
        h.wakeup(&app_signal(42 * MS));
        h.wakeup(&app_signal(44 * MS));
        h.sent(PID, SEND_FD, 49 * MS, FRAME, true);
        assert_eq!(h.taken_at(49 * MS), 44 * MS);
        h.sent(PID, SEND_FD, 49 * MS + 10 * US, FRAME, true);
        assert_eq!(h.taken_at(49 * MS + 10 * US), 49 * MS + 10 * US);
        // A write long before, or another eventfd's, hands nothing over.
        h.wakeup(&app_signal(50 * MS));
        h.sent(PID, SEND_FD, 50 * MS + 2 * SEND_WAKE_WINDOW_NS, FRAME, true);
        h.wakeup(&wakeup(OTHER, 60 * MS, true));
        h.sent(PID, SEND_FD, 60 * MS + 10 * US, FRAME, true);
        assert_eq!(h.taken_at(60 * MS + 10 * US), 60 * MS + 10 * US);
        assert_eq!((h.stats.handed_over, h.stats.at_send), (3, 6));
    }

    #[test]
    fn a_send_the_probe_saw_is_timed_at_its_hand_over_whatever_woke_the_io_thread() {
        const SOCKET: u64 = 0x7f00_0000_1000;
        let mut h = Handoffs::default();
        let handover = |ns| Handover {
            tgid: PID,
            tid: PID,
            socket: SOCKET,
            enter_ns: ns - 3 * US,
            ns,
            size: FRAME as u32,
        };
        // The probe's socket is learned from three sends; before that, the mailbox rules
        // (nothing here) keep the send time, until the election times them too.
        for i in 1..=3 {
            let at = i * 10 * MS;
            h.handed_over(&handover(at - 40 * US));
            h.sent(PID, SEND_FD, at, FRAME, true);
            let handed = if i == 3 { at - 40 * US } else { at };
            assert_eq!(h.taken_at(at), handed, "send {i}");
        }
        for i in 1..=2 {
            assert_eq!(h.taken_at(i * 10 * MS), i * 10 * MS - 40 * US, "send {i}");
        }
        // A request handed over while the I/O thread, woken for the one before, waited 6 ms
        // for a CPU: no mailbox write of its own, its own hand-over all the same.
        h.handed_over(&handover(40 * MS));
        h.handed_over(&handover(42 * MS));
        h.sent(PID, SEND_FD, 46 * MS, FRAME, true);
        h.sent(PID, SEND_FD, 46 * MS + 20 * US, FRAME, true);
        assert_eq!(h.taken_at(46 * MS), 40 * MS);
        assert_eq!(h.taken_at(46 * MS + 20 * US), 42 * MS);
        // Two outputs handed over 4 ms apart that the I/O thread, kept off the CPU, wrote in
        // one syscall: each keeps its own hand-over, the second under a key a nanosecond
        // later (a CI run had the first timed at the second's hand-over).
        h.handed_over(&handover(50 * MS));
        h.handed_over(&handover(54 * MS));
        assert_eq!(h.sent(PID, SEND_FD, 55 * MS, FRAME, true), 55 * MS);
        assert_eq!(h.sent(PID, SEND_FD, 55 * MS, FRAME, true), 55 * MS + 1);
        assert_eq!(h.taken_at(55 * MS), 50 * MS);
        assert_eq!(h.taken_at(55 * MS + 1), 54 * MS);
        // Another fd's message written at that instant keeps it.
        assert_eq!(h.sent(PID, SEND_FD + 1, 55 * MS, FRAME, false), 55 * MS);
        assert_eq!(
            (h.stats.handed_over, h.stats.send_probed, h.stats.at_send),
            (7, 7, 0)
        );
    }
}
