//! Retry pacing shared by everything that retries: a capture source reopening its device, a
//! producer reconnecting to the broker, the PTP port reopening. Pure: the caller sleeps.

use std::time::Duration;

/// Exponential backoff with full jitter, capped; reset after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
    rng: u64,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration, seed: u64) -> Self {
        Self {
            base,
            max,
            attempt: 0,
            rng: seed | 1,
        }
    }

    /// The delay before the next attempt: uniform in [ceiling/2, ceiling], ceiling doubling per
    /// attempt up to `max`. Half the ceiling is kept so retries never hammer a recovering broker.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << self.attempt.min(16))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let frac = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        ceiling.mul_f64(0.5 + 0.5 * frac)
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5), 42);
        let d: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(50) && d[0] <= Duration::from_millis(100));
        assert!(d[9] >= Duration::from_millis(2500) && d[9] <= Duration::from_secs(5));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
