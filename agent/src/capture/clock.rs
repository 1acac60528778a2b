//! Watching the wall clock against the capture clock: NTP, chrony or a VM's guest agent step
//! or slew CLOCK_REALTIME, never CLOCK_MONOTONIC (the kernel records' clock). Each move of
//! their difference is reported (`CaptureEvent::Clock`, also kept in recordings) so that the
//! telemetry stage converts each instant with the offset that held then (telemetry::clock).

/// A move smaller than this is not reported (reading the two clocks is exact to well under
/// a microsecond; the engines' own stamps are microseconds apart from ours).
const MIN_MOVE_NS: i128 = 50_000;
/// Two monotonic reads around the wall-clock read further apart than this were interrupted
/// (preempted): read again.
const MAX_READ_SPREAD_NS: i128 = 20_000;

fn read(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// CLOCK_REALTIME - CLOCK_MONOTONIC now, in ns, and the monotonic time it was read at. The
/// wall clock is read between two monotonic reads, and again when those are far apart (the
/// thread was preempted between them).
pub fn realtime_minus_monotonic() -> (u64, i128) {
    let mut best = None;
    for _ in 0..4 {
        let before = read(libc::CLOCK_MONOTONIC);
        let wall = read(libc::CLOCK_REALTIME);
        let after = read(libc::CLOCK_MONOTONIC);
        let middle = before + (after - before) / 2;
        best = Some((u64::try_from(middle).unwrap_or(0), wall - middle));
        if after - before <= MAX_READ_SPREAD_NS {
            break;
        }
    }
    best.unwrap_or_default()
}

/// Reports the offset when it moved since the last report.
#[derive(Debug)]
pub struct ClockWatch {
    reported: i128,
}

impl ClockWatch {
    /// Watching from the offset the session started with.
    pub fn new(offset: i128) -> Self {
        Self { reported: offset }
    }

    /// Look now: Some((monotonic ns, new offset)) when the wall clock moved.
    pub fn look(&mut self) -> Option<(u64, i128)> {
        self.moved(realtime_minus_monotonic())
    }

    fn moved(&mut self, (at, offset): (u64, i128)) -> Option<(u64, i128)> {
        if (offset - self.reported).abs() < MIN_MOVE_NS {
            return None;
        }
        self.reported = offset;
        Some((at, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_moves_are_reported() {
        let mut watch = ClockWatch::new(1_000_000);
        assert_eq!(watch.moved((5, 1_000_400)), None);
        assert_eq!(watch.moved((6, 1_500_000)), Some((6, 1_500_000)));
        assert_eq!(watch.moved((7, 1_500_000)), None);
        // Back too (a step backwards).
        assert_eq!(watch.moved((8, 900_000)), Some((8, 900_000)));
    }

    #[test]
    fn the_offset_read_here_is_the_systems() {
        let (at, offset) = realtime_minus_monotonic();
        let wall = read(libc::CLOCK_REALTIME);
        let mono = read(libc::CLOCK_MONOTONIC);
        assert!(
            ((wall - mono) - offset).abs() < 1_000_000,
            "{offset} vs {}",
            wall - mono
        );
        assert!(i128::from(at) <= mono);
    }
}
