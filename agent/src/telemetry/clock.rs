//! From capture times (CLOCK_MONOTONIC, which vLLM's `time.monotonic()` and SGLang's
//! `perf_counter()` also read) and wall-clock seconds to Unix nanoseconds.
//!
//! The wall clock is not the monotonic clock plus a constant: NTP or a VM's guest agent steps
//! it, and the engines stamp some instants with it (`time.time()`: vLLM's `arrival_time`, the
//! first token and the end). A span's instant is the wall-clock time it happened at, so each
//! capture time is converted with the offset that held then: the capture stage reports every
//! move of CLOCK_REALTIME - CLOCK_MONOTONIC (`capture::clock`), and durations between an
//! engine's wall-clock stamp and a captured instant come out as the engine would measure them.
//! (A single offset from attach time once made every such duration of a live run short by
//! the wall clock's drift since attach: 100 ms after 20 s on a VM whose clock was being set.)

/// Offsets kept; past this the oldest goes (its instants take the next oldest one).
const MAX_OFFSETS: usize = 4096;

#[derive(Clone, Debug)]
pub struct Clock {
    /// (capture time from which it holds, CLOCK_REALTIME - CLOCK_MONOTONIC in ns), in
    /// capture-time order; never empty.
    offsets: Vec<(u64, i128)>,
}

impl Clock {
    /// A clock whose offset never moves (a recording made before moves were recorded, tests).
    pub fn fixed(realtime_minus_monotonic_ns: i128) -> Self {
        Self {
            offsets: vec![(0, realtime_minus_monotonic_ns)],
        }
    }

    /// From capture time `from_ns` on, the wall clock is `realtime_minus_monotonic_ns` ahead.
    pub fn wall_clock_moved(&mut self, from_ns: u64, realtime_minus_monotonic_ns: i128) {
        if self.offsets.len() >= MAX_OFFSETS {
            self.offsets.remove(0);
        }
        let at = self.offsets.partition_point(|(from, _)| *from <= from_ns);
        self.offsets
            .insert(at, (from_ns, realtime_minus_monotonic_ns));
    }

    /// The offset that held at capture time `monotonic_ns`.
    pub fn offset_at(&self, monotonic_ns: u64) -> i128 {
        let after = self
            .offsets
            .partition_point(|(from, _)| *from <= monotonic_ns);
        self.offsets[after.saturating_sub(1)].1
    }

    /// The offset now (the latest reported).
    pub fn latest(&self) -> i128 {
        self.offsets.last().map_or(0, |(_, offset)| *offset)
    }

    pub fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        to_u64(i128::from(monotonic_ns) + self.offset_at(monotonic_ns))
    }

    /// A CLOCK_MONOTONIC time in seconds (an engine timestamp).
    pub fn unix_ns_of_mono_secs(&self, seconds: f64) -> u64 {
        let monotonic = (seconds * 1e9).round() as i128;
        let at = u64::try_from(monotonic.max(0)).unwrap_or(u64::MAX);
        to_u64(monotonic + self.offset_at(at))
    }

    /// Nanoseconds from a wall-clock instant in seconds (vLLM's `arrival_time`) to a capture
    /// time; 0 when the capture time is earlier.
    pub fn ns_since_wall_secs(&self, wall_secs: f64, monotonic_ns: u64) -> u64 {
        self.unix_ns(monotonic_ns)
            .saturating_sub(self.unix_ns_of_wall_secs(wall_secs))
    }

    /// A wall-clock time in seconds (`time.time()`).
    pub fn unix_ns_of_wall_secs(&self, seconds: f64) -> u64 {
        to_u64((seconds * 1e9).round() as i128)
    }
}

fn to_u64(ns: i128) -> u64 {
    u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_instant_takes_the_offset_that_held_then() {
        let mut clock = Clock::fixed(1_000);
        assert_eq!(clock.unix_ns(50), 1_050);
        // The wall clock was stepped 500 ns ahead at capture time 100.
        clock.wall_clock_moved(100, 1_500);
        assert_eq!((clock.unix_ns(99), clock.unix_ns(100)), (1_099, 1_600));
        assert_eq!(clock.latest(), 1_500);
        // A move reported late still lands in order.
        clock.wall_clock_moved(80, 1_200);
        assert_eq!(clock.unix_ns(90), 1_290);
        assert_eq!(clock.unix_ns(200), 1_700);
        // A duration from a wall-clock stamp taken after the step, as the engine measures it.
        assert_eq!(clock.ns_since_wall_secs(1_700e-9, 300), 100);
        assert_eq!(clock.unix_ns_of_mono_secs(150e-9), 1_650);
    }

    #[test]
    fn the_oldest_offsets_go_past_the_bound() {
        let mut clock = Clock::fixed(0);
        for i in 1..=MAX_OFFSETS as u64 + 10 {
            clock.wall_clock_moved(i * 10, i128::from(i));
        }
        assert_eq!(clock.offsets.len(), MAX_OFFSETS);
        // Instants older than every offset kept take the oldest.
        assert_eq!(clock.offset_at(0), 11);
        assert_eq!(clock.latest(), MAX_OFFSETS as i128 + 10);
    }
}
