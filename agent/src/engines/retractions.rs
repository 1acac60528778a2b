//! Which request an SGLang retraction rolled back, and when.
//!
//! The scheduler logs each retraction (one line per call, however many requests it rolled
//! back: `decode::sglang_log`), and its outputs carry each request's retraction count, but no
//! message names the requests of a given retraction. A request whose count rose by `k`
//! between two of its outputs was retracted `k` times in between, at most once per call: when
//! exactly `k` of its scheduler's retraction lines lie in that window, those are its
//! retractions; otherwise (other requests' retractions in the same window) which ones are its
//! own is not known, and none is placed (counted instead).
use std::collections::{HashMap, VecDeque};

/// Retraction lines kept per scheduler (the oldest go first).
const MAX_LINES: usize = 4096;

/// The write times of each scheduler's retraction lines.
#[derive(Debug, Default)]
pub struct RetractionLog {
    lines: HashMap<u32, VecDeque<u64>>,
}

impl RetractionLog {
    /// Scheduler `scheduler` logged a retraction at `ns`.
    pub fn logged(&mut self, scheduler: u32, ns: u64) {
        let lines = self.lines.entry(scheduler).or_default();
        if lines.len() >= MAX_LINES {
            lines.pop_front();
        }
        // Lines of one scheduler arrive in order; a late one is put in its place.
        let at = lines.partition_point(|&t| t <= ns);
        lines.insert(at, ns);
    }

    /// The times of `count` retractions of one request by `scheduler` within (`after`,
    /// `until`]: Some when exactly that many lines lie there.
    pub fn place(&self, scheduler: u32, after: u64, until: u64, count: u64) -> Option<Vec<u64>> {
        let lines = self.lines.get(&scheduler)?;
        let within: Vec<u64> = lines
            .iter()
            .copied()
            .filter(|&t| t > after && t <= until)
            .collect();
        (within.len() as u64 == count).then_some(within)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retraction_is_placed_only_when_the_window_leaves_no_doubt() {
        let mut log = RetractionLog::default();
        for ns in [100, 300, 320] {
            log.logged(7, ns);
        }
        // One line in the window: that one.
        assert_eq!(log.place(7, 50, 200, 1), Some(vec![100]));
        // Two lines, one retraction of this request: which is not known.
        assert_eq!(log.place(7, 200, 400, 1), None);
        // Two retractions, two lines.
        assert_eq!(log.place(7, 200, 400, 2), Some(vec![300, 320]));
        // Another scheduler's lines are not this request's; none at all: nothing.
        assert_eq!(log.place(8, 0, 400, 1), None);
        assert_eq!(log.place(7, 320, 400, 1), None);
        // A line decoded late is put in its place.
        log.logged(7, 250);
        assert_eq!(log.place(7, 200, 260, 1), Some(vec![250]));
    }
}
