//! What `/healthz` and `/readyz` (on the Prometheus endpoint's address) answer, for a
//! DaemonSet's probes:
//! - ready once the eBPF programs are loaded and attached, never "once an engine was found"
//!   (most nodes have none at first, and a node agent without engines is doing its job);
//! - healthy while the capture loop goes round: it wakes at least every drain period, so a
//!   loop that has not gone round for [`STALL`] is stuck.
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// How long the capture loop may go without a round before the agent is unhealthy.
pub const STALL: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// Milliseconds after `started` of the loop's last round, plus one (0: none yet).
    last_round_ms: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            last_round_ms: AtomicU64::new(0),
        }
    }
}

impl Health {
    /// The capture loop went round (its first round: the programs are attached).
    pub fn round(&self) {
        let ms = self.started.elapsed().as_millis() as u64 + 1;
        self.last_round_ms.store(ms, Ordering::Relaxed);
    }

    pub fn ready(&self) -> bool {
        self.last_round_ms.load(Ordering::Relaxed) > 0
    }

    /// Whether the loop went round within [`STALL`] of `now`.
    pub fn healthy(&self) -> bool {
        self.healthy_at(self.started.elapsed())
    }

    fn healthy_at(&self, since_start: Duration) -> bool {
        match self.last_round_ms.load(Ordering::Relaxed) {
            0 => false,
            last => since_start.saturating_sub(Duration::from_millis(last - 1)) < STALL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_after_the_first_round_healthy_while_rounds_come() {
        let health = Health::default();
        assert!(!health.ready() && !health.healthy());
        health.round();
        assert!(health.ready() && health.healthy());
        assert!(!health.healthy_at(health.started.elapsed() + STALL + Duration::from_secs(1)));
    }
}
