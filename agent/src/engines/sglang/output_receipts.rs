//! Main's receipt of a step's outputs, matched to the scheduler's send of them.
//!
//! SGLang's detokenizer turns each `BatchTokenIDOutput` it receives into one `BatchStrOutput`
//! for main, and passes the requests, their finish reasons and token counts on as the
//! scheduler sent them (detokenizer_manager.py): main's receipt of a step repeats the
//! scheduler's send (checked on 4,321 steps of a live load, BENCHMARKS.md). So a receipt's
//! leading fields (request ids, HTTP workers, finish reasons), read from its first bytes
//! without decoding it, are looked up among the sends main has not received yet, and the
//! matching send's outputs stand for the receipt: each step is decoded once, not twice.
//!
//! What main takes from a receipt is its instant, the finish reasons, and the cumulative token
//! counts, of which the latest win. Equal leading bytes with a finish reason in them can only
//! be that request's finishing step, so a request's last output and final counts are always
//! its own; two steps without a finish (the same requests, one step apart) look alike, and
//! should a receipt go unseen, a later one may take the earlier step's counts, which the
//! finishing step then replaces. A receipt that matches no send (its send lost or decoded too
//! late, a detokenizer that splits batches between tokenizer workers) is decoded in full.
use std::collections::VecDeque;

use super::wire::RidOutput;

/// Sends kept while their receipts are awaited: main lags the scheduler by a few steps; sends
/// whose receipt is never seen (main not traced) leave, the oldest first, past this.
const MAX_PENDING: usize = 256;

/// The scheduler's output batches on their way to main.
#[derive(Default)]
pub struct OutputReceipts {
    /// Each send's leading bytes and outputs, in send order.
    pending: VecDeque<(Vec<u8>, Vec<RidOutput>)>,
}

impl OutputReceipts {
    /// A scheduler sent `items`, whose message began with `leading`.
    pub fn sent(&mut self, leading: Vec<u8>, items: Vec<RidOutput>) {
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back((leading, items));
    }

    /// The outputs of the earliest send whose leading bytes main's receipt repeats, taken.
    pub fn received(&mut self, leading: &[u8]) -> Option<Vec<RidOutput>> {
        let at = self.pending.iter().position(|(l, _)| l == leading)?;
        self.pending.remove(at).map(|(_, items)| items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(rid: &str) -> Vec<RidOutput> {
        vec![RidOutput {
            rid: rid.into(),
            ..Default::default()
        }]
    }

    #[test]
    fn a_receipt_takes_the_earliest_send_it_repeats() {
        let mut receipts = OutputReceipts::default();
        receipts.sent(b"a".to_vec(), items("a1"));
        receipts.sent(b"b".to_vec(), items("b"));
        receipts.sent(b"a".to_vec(), items("a2"));
        assert_eq!(receipts.received(b"a"), Some(items("a1")));
        assert_eq!(receipts.received(b"c"), None);
        assert_eq!(receipts.received(b"a"), Some(items("a2")));
        assert_eq!(receipts.received(b"b"), Some(items("b")));
        assert_eq!(receipts.received(b"b"), None, "each send is taken once");
    }

    #[test]
    fn sends_never_received_leave_the_oldest_first() {
        let mut receipts = OutputReceipts::default();
        for i in 0..=MAX_PENDING {
            receipts.sent(i.to_string().into_bytes(), items(&i.to_string()));
        }
        assert_eq!(receipts.pending.len(), MAX_PENDING);
        assert_eq!(receipts.received(b"0"), None);
        assert_eq!(receipts.received(b"1"), Some(items("1")));
    }
}
