//! The pace at which a kernel's attach stream is read: every byte a kernel writes (output,
//! displays, protocol lines) costs the engine (dockerd and the container's shim copy it) and
//! this server CPU that no `--cpus` limit charges to the kernel, and every protocol line a
//! parse and perhaps an answer ([`LINE_COST`]). Read at most [`READ_RATE`]
//! sustained after a [`READ_BURST`], a kernel flooding its streams (during a cell or between
//! cells, where its output is dropped) waits on its own full pipe instead; what any cell
//! legitimately writes fits the burst.

use tokio::time::{Duration, Instant};

/// Bytes per second a kernel's streams are read at, sustained.
pub(super) const READ_RATE: u64 = 64 * 1024 * 1024;

/// Bytes read at once before [`READ_RATE`] applies (refilled at that rate).
pub(super) const READ_BURST: u64 = 64 * 1024 * 1024;

/// What each protocol line costs on the pace besides its bytes: the host parses every line
/// and may answer it (a refused tool call is a write to the kernel, which the engine copies),
/// so a flood of tiny frames costs per line, not per byte: 4,096 lines at once, then 4,096 a
/// second. A cell's legitimate lines are far fewer (its tool calls, 50 by default).
pub(super) const LINE_COST: usize = 16 * 1024;

/// A token bucket of bytes: [`Pace::spend`] says how long to wait before reading on.
#[derive(Debug)]
pub(super) struct Pace {
    rate: u64,
    burst: u64,
    /// Bytes that may be read now without waiting; negative: owed.
    tokens: f64,
    at: Instant,
}

impl Pace {
    pub(super) fn new(rate: u64, burst: u64) -> Pace {
        Pace {
            // A rate of 0 would make every wait infinite.
            rate: rate.max(1),
            burst,
            tokens: burst as f64,
            at: Instant::now(),
        }
    }

    /// Takes `bytes` just read; returns how long to wait before the next read (zero while
    /// within the burst).
    pub(super) fn spend(&mut self, bytes: usize) -> Duration {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.rate as f64;
        self.at = now;
        self.tokens = (self.tokens + refill).min(self.burst as f64) - bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_free_and_the_rest_waits_at_the_rate() {
        let mut pace = Pace::new(1000, 5000);
        assert_eq!(pace.spend(3000), Duration::ZERO);
        assert_eq!(pace.spend(2000), Duration::ZERO);
        // 500 bytes over the burst: half a second at 1000 bytes per second.
        assert_eq!(pace.spend(500), Duration::from_millis(500));
        tokio::time::advance(Duration::from_millis(500)).await;
        // Paid off; one more second refills 1000 bytes.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(pace.spend(1000), Duration::ZERO);
        assert_eq!(pace.spend(100), Duration::from_millis(100));
        // Idle refills no more than the burst.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(pace.spend(5100), Duration::from_millis(100));
    }
}
