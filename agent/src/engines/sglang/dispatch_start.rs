//! When an SGLang process began dispatching a request: the start of the `api_server_dispatch`
//! stage of its main process and of the `dpc_dispatch` stage of its data-parallel controller,
//! which no syscall marks.
//!
//! SGLang stamps the stage's start, then serializes the request and hands it to libzmq without
//! yielding to anything else: main after tokenizing (`TokenizerManager._send_one_request`), the
//! DP controller right after taking the request (`dispatching_with_trace`). Both serialize with
//! CPython's `pickle.dumps` only for a message they send: the whole message with pickle IPC
//! (pyzmq's `send_pyobj`), the request's `time_stats` field with msgpack IPC
//! (`wrap_pickle_fields` in main, `wrap_as_pickle` in the DP controller). So the serializations
//! a thread began after its previous hand-over to libzmq belong to its next one, and for a
//! request the first of them began its dispatch: a few tens of microseconds of Python after
//! SGLang's stamp (docs/accuracy.md). A request message is serialized once in either mode and
//! either process; with more serializations before its hand-over (a message whose hand-over
//! the probe missed) which one began it is not certain, and none is given.
use std::collections::{HashMap, VecDeque};

use crate::decode::flows::{Handover, Serializing};

/// Hand-overs remembered with their serializations, the oldest going first: one per message
/// main sends, far more than the requests in flight.
const MAX_KEPT: usize = 131_072;
/// Threads with serializations waiting for their hand-over: main's loop thread, and any
/// other thread of a probed process that pickles something it never sends.
const MAX_THREADS: usize = 1024;

/// The serializations a thread began before one hand-over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Serialized {
    first_ns: u64,
    count: u32,
}

#[derive(Debug, Default)]
pub struct DispatchStarts {
    /// Per thread (tgid, tid): serializations since its latest hand-over.
    open: HashMap<(u32, u32), Serialized>,
    /// Per hand-over (tgid, its return): the serializations before it.
    handed: HashMap<(u32, u64), Serialized>,
    order: VecDeque<(u32, u64)>,
}

impl DispatchStarts {
    /// A thread entered `pickle.dumps`.
    pub fn serializing(&mut self, s: &Serializing) {
        let key = (s.tgid, s.tid);
        if let Some(open) = self.open.get_mut(&key) {
            open.count += 1;
            return;
        }
        if self.open.len() >= MAX_THREADS {
            return;
        }
        self.open.insert(
            key,
            Serialized {
                first_ns: s.ns,
                count: 1,
            },
        );
    }

    /// A thread handed a message to libzmq: the serializations it began since its previous
    /// hand-over were this message's.
    pub fn handed_over(&mut self, h: &Handover) {
        let Some(serialized) = self.open.remove(&(h.tgid, h.tid)) else {
            return;
        };
        if serialized.first_ns > h.enter_ns {
            return;
        }
        let key = (h.tgid, h.ns);
        if self.handed.insert(key, serialized).is_none() {
            self.order.push_back(key);
        }
        if self.order.len() > MAX_KEPT
            && let Some(oldest) = self.order.pop_front()
        {
            self.handed.remove(&oldest);
        }
    }

    /// When process `tgid` began serializing the message it handed over at `handed_ns`, when
    /// it serialized it once; None when the probe saw no serialization, or several.
    pub fn started(&self, tgid: u32, handed_ns: u64) -> Option<u64> {
        self.handed
            .get(&(tgid, handed_ns))
            .filter(|s| s.count == 1)
            .map(|s| s.first_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: u32 = 100;

    fn dumps(tid: u32, ns: u64) -> Serializing {
        Serializing {
            tgid: MAIN,
            tid,
            ns,
        }
    }

    fn handover(tid: u32, enter_ns: u64, ns: u64) -> Handover {
        Handover {
            tgid: MAIN,
            tid,
            socket: 0x7f00,
            enter_ns,
            ns,
            size: 300,
        }
    }

    #[test]
    fn a_message_serialized_once_began_at_its_serialization() {
        let mut d = DispatchStarts::default();
        d.serializing(&dumps(MAIN, 1_000));
        d.handed_over(&handover(MAIN, 1_200, 1_300));
        assert_eq!(d.started(MAIN, 1_300), Some(1_000));
        // The next message's serialization is its own.
        d.serializing(&dumps(MAIN, 5_000));
        d.handed_over(&handover(MAIN, 5_100, 5_150));
        assert_eq!(d.started(MAIN, 5_150), Some(5_000));
        assert_eq!(d.started(MAIN, 1_300), Some(1_000));
    }

    #[test]
    fn a_message_sent_without_serializing_has_no_start() {
        let mut d = DispatchStarts::default();
        // An abort with msgpack IPC: no pickle.
        d.handed_over(&handover(MAIN, 1_000, 1_100));
        assert_eq!(d.started(MAIN, 1_100), None);
        assert_eq!(d.started(MAIN, 9_999), None);
    }

    #[test]
    fn several_serializations_before_one_hand_over_give_no_start() {
        let mut d = DispatchStarts::default();
        // The probe missed the first message's hand-over.
        d.serializing(&dumps(MAIN, 1_000));
        d.serializing(&dumps(MAIN, 3_000));
        d.handed_over(&handover(MAIN, 3_100, 3_200));
        assert_eq!(d.started(MAIN, 3_200), None);
        // The count starts again after it.
        d.serializing(&dumps(MAIN, 4_000));
        d.handed_over(&handover(MAIN, 4_100, 4_200));
        assert_eq!(d.started(MAIN, 4_200), Some(4_000));
    }

    #[test]
    fn threads_are_apart() {
        let mut d = DispatchStarts::default();
        d.serializing(&dumps(MAIN, 1_000));
        d.serializing(&dumps(MAIN + 1, 1_500));
        // Another thread's hand-over takes only its own serialization.
        d.handed_over(&handover(MAIN + 1, 1_600, 1_700));
        d.handed_over(&handover(MAIN, 2_000, 2_100));
        assert_eq!(d.started(MAIN, 1_700), Some(1_500));
        assert_eq!(d.started(MAIN, 2_100), Some(1_000));
        // Another process's hand-over at the same instant is not this one's.
        assert_eq!(d.started(MAIN + 7, 2_100), None);
    }

    #[test]
    fn a_serialization_after_the_send_began_is_not_its_start() {
        let mut d = DispatchStarts::default();
        d.serializing(&dumps(MAIN, 2_000));
        d.handed_over(&handover(MAIN, 1_000, 2_500));
        assert_eq!(d.started(MAIN, 2_500), None);
    }

    #[test]
    fn old_hand_overs_are_forgotten() {
        let mut d = DispatchStarts::default();
        for i in 0..=MAX_KEPT as u64 {
            d.serializing(&dumps(MAIN, 10 * i));
            d.handed_over(&handover(MAIN, 10 * i + 1, 10 * i + 2));
        }
        assert_eq!(d.started(MAIN, 2), None);
        assert_eq!(d.started(MAIN, 12), Some(10));
        assert_eq!(d.handed.len(), MAX_KEPT);
    }
}
