//! When a frontend's event loop took over a message its ZeroMQ I/O thread had received.
//!
//! vLLM stamps a request's first token and its end (the frontend-clock latencies: time to
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
//!   (a lower bound) and it is counted as such.
use std::collections::{HashMap, VecDeque};

use crate::decode::flows::Wakeup;

/// A write this long after a message is not that message's signal.
const SIGNAL_WINDOW_NS: u64 = 1_000_000;
/// Votes an eventfd needs before it is taken for the output socket's mailbox. Outputs before
/// that keep their arrival (counted): a wrong mailbox would misplace instants, uncounted.
const VOTES_NEEDED: u32 = 3;
/// Take-over instants kept for lookup, the oldest going first: at a hundred engine steps a
/// second, over twenty minutes; a request whose first token is older reports its arrival.
const MAX_KEPT: usize = 131_072;

/// How the frontend instants of finished requests were found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HandoffStats {
    /// Messages whose take-over by the event loop was seen (a mailbox read).
    pub taken_over: u64,
    /// Messages kept at their arrival time: received while the loop was busy, before the
    /// mailbox was learned, or in a capture without eventfds.
    pub at_arrival: u64,
}

/// A message received, waiting to learn when the loop took it.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    ns: u64,
    /// Someone may ask about it (it carried request outputs).
    keep: bool,
}

/// One frontend process's output socket, as far as its wakeups tell.
#[derive(Default)]
struct Frontend {
    votes: HashMap<u32, u32>,
    mailbox: Option<u32>,
    /// The latest message with no mailbox write since; it may be about to signal.
    candidate: Option<Arrival>,
    /// The candidate already voted (only the first write after a message votes).
    voted: bool,
    /// The mailbox was written and not yet read: these messages wait for the read.
    signalled: Option<Vec<Arrival>>,
    /// The latest mailbox read: a write record older than it was already consumed.
    last_read_ns: u64,
}

/// Take-over instants of received messages, per frontend process.
#[derive(Default)]
pub struct Handoffs {
    frontends: HashMap<u32, Frontend>,
    taken: HashMap<u64, u64>,
    order: VecDeque<u64>,
    pub stats: HandoffStats,
}

impl Handoffs {
    /// Process `tgid` received an engine output message completed at `ns`. `keep`: its
    /// take-over instant will be asked for.
    pub fn received(&mut self, tgid: u32, ns: u64, keep: bool) {
        let frontend = self.frontends.entry(tgid).or_default();
        let arrival = Arrival { ns, keep };
        if let Some(waiting) = frontend.signalled.as_mut() {
            waiting.push(arrival);
            return;
        }
        if let Some(earlier) = frontend.candidate.replace(arrival) {
            self.stats.at_arrival += u64::from(earlier.keep);
        }
        frontend.voted = false;
    }

    /// A watched eventfd was read or written.
    pub fn wakeup(&mut self, w: &Wakeup) {
        let frontend = self.frontends.entry(w.tgid).or_default();
        if w.write {
            if w.ns <= frontend.last_read_ns {
                return;
            }
            let follows = frontend
                .candidate
                .filter(|c| w.ns >= c.ns && w.ns - c.ns <= SIGNAL_WINDOW_NS);
            if follows.is_some() && !frontend.voted {
                frontend.voted = true;
                frontend.vote(w.fd);
            }
            if frontend.mailbox == Some(w.fd) && frontend.signalled.is_none() {
                let candidate = frontend.candidate.take();
                if follows.is_none() {
                    // Too late to be its signal: it was taken by a loop already awake.
                    self.stats.at_arrival += u64::from(candidate.is_some_and(|c| c.keep));
                }
                frontend.signalled = Some(follows.into_iter().collect());
            }
            return;
        }
        if frontend.mailbox != Some(w.fd) {
            return;
        }
        frontend.last_read_ns = w.ns;
        let woken = match frontend.signalled.take() {
            Some(waiting) => waiting,
            // The write's record is behind the read's in the ring: it signalled the candidate.
            None => frontend
                .candidate
                .take()
                .filter(|c| c.ns <= w.ns)
                .into_iter()
                .collect(),
        };
        for arrival in woken.into_iter().filter(|a| a.keep) {
            self.keep(arrival.ns, w.ns);
        }
    }

    /// When the message received at `received_ns` was taken over by its event loop: the
    /// mailbox read that woke the loop for it, else its arrival.
    pub fn taken_at(&self, received_ns: u64) -> u64 {
        self.taken.get(&received_ns).copied().unwrap_or(received_ns)
    }

    fn keep(&mut self, received_ns: u64, taken_ns: u64) {
        self.stats.taken_over += 1;
        if self.taken.insert(received_ns, taken_ns).is_none() {
            self.order.push_back(received_ns);
        }
        if self.order.len() > MAX_KEPT
            && let Some(oldest) = self.order.pop_front()
        {
            self.taken.remove(&oldest);
        }
    }
}

impl Frontend {
    fn vote(&mut self, fd: u32) {
        let votes = self.votes.entry(fd).or_default();
        *votes += 1;
        let votes = *votes;
        let leader = self.mailbox.and_then(|m| self.votes.get(&m)).copied();
        if votes >= VOTES_NEEDED && leader.is_none_or(|l| votes > l) {
            self.mailbox = Some(fd);
        }
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
        h.received(PID, at, true);
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
                at_arrival: 2
            }
        );
    }

    #[test]
    fn messages_arriving_before_the_read_share_it_and_busy_ones_keep_their_arrival() {
        let mut h = learned();
        let t = 100 * MS;
        // Woken by the first, the loop reads 5 ms later; a second arrives meanwhile.
        h.received(PID, t, true);
        h.wakeup(&wakeup(MAILBOX, t + 10 * US, true));
        h.received(PID, t + MS, true);
        h.wakeup(&wakeup(MAILBOX, t + 5 * MS, false));
        assert_eq!(h.taken_at(t), t + 5 * MS);
        assert_eq!(h.taken_at(t + MS), t + 5 * MS);
        // The loop is now busy: two outputs arrive without a signal, the next one signals.
        h.received(PID, t + 6 * MS, true);
        h.received(PID, t + 7 * MS, true);
        h.received(PID, t + 9 * MS, true);
        h.wakeup(&wakeup(MAILBOX, t + 9 * MS + 10 * US, true));
        h.wakeup(&wakeup(MAILBOX, t + 12 * MS, false));
        assert_eq!(h.taken_at(t + 6 * MS), t + 6 * MS);
        assert_eq!(h.taken_at(t + 7 * MS), t + 7 * MS);
        assert_eq!(h.taken_at(t + 9 * MS), t + 12 * MS);
        assert_eq!(h.stats.at_arrival, 2 + 2);
    }

    #[test]
    fn other_eventfds_and_late_write_records_do_not_move_an_instant() {
        let mut h = learned();
        let t = 200 * MS;
        // A write to another eventfd right after the output (the loop's own wakeup), then a
        // read of it: neither is the mailbox.
        h.received(PID, t, true);
        h.wakeup(&wakeup(OTHER, t + 5 * US, true));
        h.wakeup(&wakeup(OTHER, t + 50 * US, false));
        assert_eq!(h.taken_at(t), t);
        // The mailbox read's record comes before the write's: the read still counts.
        h.wakeup(&wakeup(MAILBOX, t + 2 * MS, false));
        h.wakeup(&wakeup(MAILBOX, t + 20 * US, true));
        assert_eq!(h.taken_at(t), t + 2 * MS);
        // That late write opened no signal; the next output's read again comes first.
        h.received(PID, t + 3 * MS, true);
        h.wakeup(&wakeup(MAILBOX, t + 9 * MS, false));
        assert_eq!(h.taken_at(t + 3 * MS), t + 9 * MS);
    }

    #[test]
    fn a_write_long_after_a_message_is_not_its_signal() {
        let mut h = learned();
        let t = 300 * MS;
        h.received(PID, t, true);
        h.wakeup(&wakeup(MAILBOX, t + 2 * SIGNAL_WINDOW_NS, true));
        h.wakeup(&wakeup(MAILBOX, t + 3 * SIGNAL_WINDOW_NS, false));
        assert_eq!(h.taken_at(t), t);
        assert_eq!(h.stats.at_arrival, 2 + 1);
    }

    #[test]
    fn processes_are_apart_and_unkept_messages_are_not_stored() {
        let mut h = learned();
        let t = 400 * MS;
        h.received(PID + 1, t, true);
        signalled_output(&mut h, t + MS, MS);
        assert_eq!(h.taken_at(t), t);
        h.received(PID, t + 10 * MS, false);
        h.wakeup(&wakeup(MAILBOX, t + 10 * MS + 10 * US, true));
        h.wakeup(&wakeup(MAILBOX, t + 12 * MS, false));
        assert_eq!(h.taken_at(t + 10 * MS), t + 10 * MS);
    }
}
