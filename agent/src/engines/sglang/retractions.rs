//! Which request an SGLang retraction rolled back, and when.
//!
//! The scheduler logs each retraction (one line per call, however many requests it rolled
//! back: `engines::sglang::log`), and its outputs carry each request's retraction count, but no
//! message names the requests of a given retraction. A request whose count rose by `k`
//! between two of its outputs was retracted `k` times in between, at most once per call: when
//! exactly `k` of its scheduler's retraction lines lie in that window, those are its
//! retractions. A line rolled back as many requests as it says (`#retracted_reqs`): one whose
//! requests are all placed already is no candidate for another. Otherwise (other requests'
//! retractions in the same window) which ones are this request's is not known, and none is
//! placed (counted instead).
use std::collections::{HashMap, VecDeque};

/// Retraction lines kept per scheduler (the oldest go first).
const MAX_LINES: usize = 4096;

/// One retraction line: when it was written, how many requests it rolled back, and how many
/// of those are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Line {
    ns: u64,
    requests: u32,
    placed: u32,
}

/// Each scheduler's retraction lines.
#[derive(Debug, Default)]
pub struct RetractionLog {
    lines: HashMap<u32, VecDeque<Line>>,
}

impl RetractionLog {
    /// Scheduler `scheduler` logged, at `ns`, a retraction of `requests` requests.
    pub fn logged(&mut self, scheduler: u32, ns: u64, requests: u32) {
        let lines = self.lines.entry(scheduler).or_default();
        if lines.len() >= MAX_LINES {
            lines.pop_front();
        }
        // Lines of one scheduler arrive in order; a late one is put in its place.
        let at = lines.partition_point(|line| line.ns <= ns);
        let line = Line {
            ns,
            requests,
            placed: 0,
        };
        lines.insert(at, line);
    }

    /// The times of `count` retractions of one request by `scheduler` within (`after`,
    /// `until`]: Some when exactly that many lines there still have a request to place (each
    /// of them then has one more placed).
    pub fn place(
        &mut self,
        scheduler: u32,
        after: u64,
        until: u64,
        count: u64,
    ) -> Option<Vec<u64>> {
        let lines = self.lines.get_mut(&scheduler)?;
        let mut open: Vec<&mut Line> = lines
            .iter_mut()
            .filter(|line| line.ns > after && line.ns <= until && line.placed < line.requests)
            .collect();
        if open.len() as u64 != count {
            return None;
        }
        Some(
            open.iter_mut()
                .map(|line| {
                    line.placed += 1;
                    line.ns
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retraction_is_placed_only_when_the_window_leaves_no_doubt() {
        let mut log = RetractionLog::default();
        for ns in [100, 300, 320] {
            log.logged(7, ns, 1);
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
        log.logged(7, 250, 1);
        assert_eq!(log.place(7, 200, 260, 1), Some(vec![250]));
    }

    #[test]
    fn lines_whose_requests_are_all_placed_are_no_candidates() {
        let mut log = RetractionLog::default();
        log.logged(7, 100, 1);
        log.logged(7, 200, 2);
        log.logged(7, 300, 1);
        // A streamed request placed at 200; another at 300.
        assert_eq!(log.place(7, 150, 250, 1), Some(vec![200]));
        assert_eq!(log.place(7, 250, 350, 1), Some(vec![300]));
        // A request seen only at its end, retracted twice: 100 and 200 (which rolled back
        // two), 300 being the other request's alone.
        assert_eq!(log.place(7, 0, 400, 2), Some(vec![100, 200]));
        // Nothing is left to place.
        assert_eq!(log.place(7, 0, 400, 1), None);
    }
}
