//! The messages a process's libzmq I/O thread wrote, matched to their hand-overs: the returns
//! of the application's `zmq_msg_send` calls that the probe saw (ebpf/src/zmq.rs).
//!
//! A socket's messages leave in the order they were handed over (PUSH, DEALER to one peer: one
//! pipe each), so the message its fd carries next is the oldest hand-over on that socket not
//! yet matched whose size (what `zmq_msg_send` returned: the last part's) equals the message's
//! last frame; older ones of other sizes were messages the capture never saw written, and go,
//! so that one lost message does not shift every later match. Which socket writes to which fd
//! is learned by votes: at a write, the socket of the latest hand-over of that size before it
//! votes for the write's fd (the I/O thread most often writes a message right after its
//! hand-over); [`VOTES_NEEDED`] agreeing votes decide. Until then, and
//! for a socket with nothing pending, the message gets no hand-over from here (the caller
//! falls back to the I/O thread's mailbox write, or the write itself); the writes that voted
//! for the socket elected are timed by their hand-overs once it is
//! ([`SendProbe::take_elected`]): the first messages after attach (SGLang's first requests,
//! whose dispatch the I/O thread can write milliseconds after main handed it over).
use std::collections::{HashMap, VecDeque};

use super::votes::elected;
use crate::decode::flows::Handover;

/// Votes an (fd, socket) pair needs before the socket is taken for the fd's writer.
const VOTES_NEEDED: u32 = 3;
/// A hand-over this much older than a write on its socket is not that write's message: its
/// message was never written where the capture sees (dropped by libzmq, an unclassified fd).
const STALE_NS: u64 = 100_000_000;
/// Hand-overs kept per process.
const MAX_PENDING: usize = 1024;
/// How long a write no hand-over fitted waits for a late one (its call returned, and its
/// record was made, after the write began), and how many wait at once.
const LATE_NS: u64 = 20_000_000;
const MAX_UNMATCHED: usize = 64;

/// A write that a hand-over recorded after it turned out to be for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LateMatch {
    pub write_ns: u64,
    pub handed_ns: u64,
    /// What the write was: asked about, and timed at the write itself (else at a mailbox write).
    pub keep: bool,
    pub was_at_send: bool,
}

/// A write on a known socket that no hand-over fitted yet.
#[derive(Clone, Copy, Debug)]
struct Unmatched {
    fd: u32,
    ns: u64,
    size: usize,
    keep: bool,
    at_send: bool,
}

/// A hand-over not matched to a write yet.
#[derive(Clone, Copy, Debug)]
struct Pending {
    enter_ns: u64,
    return_ns: u64,
    socket: u64,
    size: u32,
}

/// A write on an fd whose socket was not known yet, and the hand-over that voted for it: the
/// write is timed by that hand-over once its socket is elected for the fd.
#[derive(Clone, Copy, Debug)]
struct Voted {
    fd: u32,
    socket: u64,
    write_ns: u64,
    handed_ns: u64,
    keep: bool,
    at_send: bool,
}

#[derive(Debug, Default)]
pub struct SendProbe {
    /// Hand-overs not matched yet, oldest first.
    pending: VecDeque<Pending>,
    votes: HashMap<(u32, u64), u32>,
    socket_of_fd: HashMap<u32, u64>,
    /// Writes no hand-over fitted yet, oldest first: on a known socket, or on an fd whose
    /// socket is not known yet (the late hand-over then votes for it).
    unmatched: VecDeque<Unmatched>,
    /// Writes before their fd's socket was known, with the hand-over that voted (the first
    /// messages after attach), oldest first.
    voted: VecDeque<Voted>,
    /// Those the election of their socket timed, for the caller to take.
    elected: Vec<LateMatch>,
}

impl SendProbe {
    /// The application handed a message to libzmq: kept for the write it will fit, or, when
    /// that write came first, the match.
    pub fn handed_over(&mut self, h: &Handover) -> Option<LateMatch> {
        let socket_fd = self
            .socket_of_fd
            .iter()
            .find(|(_, socket)| **socket == h.socket)
            .map(|(fd, _)| *fd);
        // Its write began inside the call: on the socket's fd, or, while the socket is not
        // known, on an fd not known either.
        let late = self.unmatched.iter().position(|u| {
            let same_fd = match socket_fd {
                Some(fd) => u.fd == fd,
                None => !self.socket_of_fd.contains_key(&u.fd),
            };
            same_fd && u.ns >= h.enter_ns && u.size == h.size as usize
        });
        if let Some(i) = late {
            let u = self.unmatched.remove(i)?;
            if socket_fd.is_none() {
                // Like a hand-over recorded before its write: it votes, and times the write
                // if its socket is elected for the fd.
                self.remember_voted(u.fd, h.socket, u.ns, h.ns, u.keep, u.at_send);
                self.vote(u.fd, h.socket);
                return None;
            }
            return Some(LateMatch {
                write_ns: u.ns,
                handed_ns: h.ns,
                keep: u.keep,
                was_at_send: u.at_send,
            });
        }
        let hand_over = Pending {
            enter_ns: h.enter_ns,
            return_ns: h.ns,
            socket: h.socket,
            size: h.size,
        };
        push_bounded(&mut self.pending, MAX_PENDING, hand_over);
        None
    }

    /// The caller timed the unmatched write at `ns` at the write itself (`at_send`), else by a
    /// mailbox write: a late hand-over corrects its counts.
    pub fn timed_at_send(&mut self, ns: u64, at_send: bool) {
        if let Some(u) = self.unmatched.iter_mut().rev().find(|u| u.ns == ns) {
            u.at_send = at_send;
        }
        if let Some(v) = self.voted.iter_mut().rev().find(|v| v.write_ns == ns) {
            v.at_send = at_send;
        }
    }

    /// The writes made before their socket was known that its election has since timed.
    pub fn take_elected(&mut self) -> Vec<LateMatch> {
        std::mem::take(&mut self.elected)
    }

    /// The I/O thread began writing a message to `fd` at `ns`, whose last frame is `size`
    /// bytes: when that message was handed over, if the probe saw it and the fd's socket is
    /// known.
    pub fn written(&mut self, fd: u32, ns: u64, size: usize, keep: bool) -> Option<u64> {
        while self
            .unmatched
            .front()
            .is_some_and(|u| u.ns.saturating_add(LATE_NS) < ns)
        {
            self.unmatched.pop_front();
        }
        while self
            .pending
            .front()
            .is_some_and(|p| p.enter_ns.saturating_add(STALE_NS) < ns)
        {
            self.pending.pop_front();
        }
        // The I/O thread, woken on another CPU, may write the message before the application's
        // call has returned: a hand-over fits a write that began after the call did.
        let fits = |p: &Pending| p.enter_ns <= ns && p.size as usize == size;
        let latest = self.pending.iter().rposition(fits);
        if let Some(i) = latest {
            self.vote(fd, self.pending[i].socket);
        }
        let Some(&socket) = self.socket_of_fd.get(&fd) else {
            // Not known yet: the latest hand-over is the likeliest to be this write's; it goes,
            // so that the socket's queue is in step with its writes once the socket is known,
            // and times the write if its socket is the one elected. With none (its record may
            // come after the write), the write waits for one.
            match latest.and_then(|i| self.pending.remove(i)) {
                Some(p) => self.remember_voted(fd, p.socket, ns, p.return_ns, keep, false),
                None => self.wait_for_hand_over(fd, ns, size, keep),
            }
            return None;
        };
        let Some(at) = self
            .pending
            .iter()
            .position(|p| p.socket == socket && fits(p))
        else {
            self.wait_for_hand_over(fd, ns, size, keep);
            return None;
        };
        // Its return is the instant (the send's, as the engines stamp it after the call).
        let handed = self.pending[at].return_ns;
        // The socket's hand-overs before it were never seen written: they go with it.
        let mut index = 0;
        self.pending.retain(|p| {
            index += 1;
            !(p.socket == socket && index <= at + 1)
        });
        Some(handed)
    }

    fn wait_for_hand_over(&mut self, fd: u32, ns: u64, size: usize, keep: bool) {
        let write = Unmatched {
            fd,
            ns,
            size,
            keep,
            at_send: false,
        };
        push_bounded(&mut self.unmatched, MAX_UNMATCHED, write);
    }

    fn remember_voted(
        &mut self,
        fd: u32,
        socket: u64,
        write_ns: u64,
        handed_ns: u64,
        keep: bool,
        at_send: bool,
    ) {
        let write = Voted {
            fd,
            socket,
            write_ns,
            handed_ns,
            keep,
            at_send,
        };
        push_bounded(&mut self.voted, MAX_UNMATCHED, write);
    }

    fn vote(&mut self, fd: u32, socket: u64) {
        let winner = self.socket_of_fd.get(&fd).map(|&s| (fd, s));
        if elected(&mut self.votes, winner, (fd, socket), VOTES_NEEDED) {
            self.socket_of_fd.insert(fd, socket);
            let (of_fd, others): (Vec<Voted>, Vec<Voted>) =
                self.voted.drain(..).partition(|v| v.fd == fd);
            self.voted = others.into();
            self.elected
                .extend(
                    of_fd
                        .into_iter()
                        .filter(|v| v.socket == socket)
                        .map(|v| LateMatch {
                            write_ns: v.write_ns,
                            handed_ns: v.handed_ns,
                            keep: v.keep,
                            was_at_send: v.at_send,
                        }),
                );
        }
    }
}

/// Appends `item`, the oldest going first when `queue` holds `limit` already.
fn push_bounded<T>(queue: &mut VecDeque<T>, limit: usize, item: T) {
    if queue.len() == limit {
        queue.pop_front();
    }
    queue.push_back(item);
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const TO_SCHEDULER: u64 = 0x7f00_0000_1000;
    const CONTROL: u64 = 0x7f00_0000_2000;

    const SIZE: usize = 300;

    fn handover(ns: u64, socket: u64) -> Handover {
        sized(ns, socket, SIZE)
    }

    fn sized(ns: u64, socket: u64, size: usize) -> Handover {
        Handover {
            tgid: 1,
            tid: 1,
            socket,
            enter_ns: ns.saturating_sub(2 * US),
            ns,
            size: size as u32,
        }
    }

    #[test]
    fn a_write_gets_its_sockets_oldest_hand_over_once_the_socket_is_known() {
        let mut p = SendProbe::default();
        // Three quiet sends teach fd 9 its socket; the first two are not matched yet.
        for i in 0..3 {
            let at = i * 10 * MS;
            p.handed_over(&handover(at, TO_SCHEDULER));
            let matched = p.written(9, at + 30 * US, SIZE, true);
            assert_eq!(matched, (i == 2).then_some(at), "send {i}");
            if i < 2 {
                assert!(p.take_elected().is_empty());
            }
        }
        // The election times the first two by the hand-overs that voted, once.
        let elected: Vec<(u64, u64)> = p
            .take_elected()
            .iter()
            .map(|m| (m.write_ns, m.handed_ns))
            .collect();
        assert_eq!(elected, vec![(30 * US, 0), (10 * MS + 30 * US, 10 * MS)]);
        assert!(p.take_elected().is_empty());
        // A burst while the I/O thread waits for a CPU: each write gets its own hand-over, in
        // order, however late the writes come.
        p.handed_over(&handover(100 * MS, TO_SCHEDULER));
        p.handed_over(&handover(101 * MS, CONTROL));
        p.handed_over(&handover(103 * MS, TO_SCHEDULER));
        assert_eq!(p.written(9, 109 * MS, SIZE, true), Some(100 * MS));
        assert_eq!(p.written(9, 109 * MS + 5 * US, SIZE, true), Some(103 * MS));
        // Nothing pending on the socket: no hand-over, not another socket's.
        assert_eq!(p.written(9, 120 * MS, SIZE, true), None);
        // A hand-over long past, never written, is not a later write's.
        p.handed_over(&handover(200 * MS, TO_SCHEDULER));
        assert_eq!(p.written(9, 400 * MS, SIZE, true), None);
    }

    #[test]
    fn a_hand_over_never_seen_written_does_not_shift_the_later_ones() {
        let mut p = SendProbe::default();
        for i in 0..3 {
            p.handed_over(&handover(i * MS, TO_SCHEDULER));
            p.written(9, i * MS + 10 * US, SIZE, true);
        }
        // A message of 100 bytes whose write the capture missed, then one of 200 written.
        p.handed_over(&sized(10 * MS, TO_SCHEDULER, 100));
        p.handed_over(&sized(11 * MS, TO_SCHEDULER, 200));
        assert_eq!(p.written(9, 12 * MS, 200, true), Some(11 * MS));
        // The next 100-byte message gets its own hand-over, not the lost one's.
        p.handed_over(&sized(20 * MS, TO_SCHEDULER, 100));
        assert_eq!(p.written(9, 21 * MS, 100, true), Some(20 * MS));
    }

    #[test]
    fn a_write_before_the_send_returned_is_its_messages() {
        let mut p = SendProbe::default();
        for i in 1..=3 {
            p.handed_over(&handover(i * MS, TO_SCHEDULER));
            p.written(9, i * MS + 10 * US, SIZE, true);
        }
        // Written 1 µs before the call returned, 1 µs after it began.
        p.handed_over(&handover(10 * MS, TO_SCHEDULER));
        assert_eq!(p.written(9, 10 * MS - US, SIZE, true), Some(10 * MS));
    }

    #[test]
    fn a_hand_over_recorded_after_its_write_still_times_it() {
        let mut p = SendProbe::default();
        for i in 1..=3 {
            p.handed_over(&handover(i * MS, TO_SCHEDULER));
            p.written(9, i * MS + 10 * US, SIZE, true);
        }
        // The write began (10 ms) inside the call (9.998-10.002 ms); the record came after.
        assert_eq!(p.written(9, 10 * MS, SIZE, true), None);
        p.timed_at_send(10 * MS, true);
        let late = p.handed_over(&sized(10 * MS + 2 * US, TO_SCHEDULER, SIZE));
        assert_eq!(
            late,
            Some(LateMatch {
                write_ns: 10 * MS,
                handed_ns: 10 * MS + 2 * US,
                keep: true,
                was_at_send: true,
            })
        );
        // It is not left pending for the next write.
        p.handed_over(&handover(20 * MS, TO_SCHEDULER));
        assert_eq!(p.written(9, 20 * MS + 10 * US, SIZE, true), Some(20 * MS));
    }

    #[test]
    fn a_hand_over_recorded_after_its_write_before_the_socket_is_known_still_votes() {
        let mut p = SendProbe::default();
        // The first send after attach: its write began inside the call, whose record came after.
        assert_eq!(p.written(9, MS, SIZE, true), None);
        p.timed_at_send(MS, false);
        assert_eq!(p.handed_over(&sized(MS + 2 * US, TO_SCHEDULER, SIZE)), None);
        // Two quiet sends elect the socket: the first write is timed by its own hand-over.
        for i in 1..=2 {
            let at = i * 10 * MS;
            p.handed_over(&handover(at, TO_SCHEDULER));
            p.written(9, at + 30 * US, SIZE, true);
        }
        let elected: Vec<(u64, u64)> = p
            .take_elected()
            .iter()
            .map(|m| (m.write_ns, m.handed_ns))
            .collect();
        assert_eq!(
            elected,
            vec![(MS, MS + 2 * US), (10 * MS + 30 * US, 10 * MS)]
        );
    }

    #[test]
    fn an_unknown_fd_gets_nothing() {
        let mut p = SendProbe::default();
        p.handed_over(&handover(MS, TO_SCHEDULER));
        assert_eq!(p.written(5, 2 * MS, SIZE, true), None);
    }
}
