//! Pure decisions of the producer: Pulsar sequence ids, chunk boundaries, reconnect backoff.

use std::ops::Range;
use std::time::Duration;

/// Low bits of a Pulsar sequence id that count re-sends of one capture sequence under a new id.
///
/// A chunked frame interrupted by a restart may have some chunks persisted: the broker then reports
/// its id as the last one, and resending under the same id would lose chunk 0 to deduplication.
/// Such a frame goes out again under the next generation (same `seq` property, new chunk uuid).
pub const GENERATION_BITS: u32 = 3;
pub const MAX_GENERATION: u64 = (1 << GENERATION_BITS) - 1;

/// The Pulsar sequence id of capture sequence `seq`, sent for the `generation`-th time.
pub fn sequence_id(seq: u64, generation: u64) -> u64 {
    (seq << GENERATION_BITS) | generation.min(MAX_GENERATION)
}

/// The capture sequence a Pulsar sequence id belongs to.
pub fn capture_seq(sequence_id: u64) -> u64 {
    sequence_id >> GENERATION_BITS
}

/// Byte ranges of the chunks of a payload of `len` bytes, each at most `max_chunk`. One range
/// (the whole payload) when it fits.
pub fn chunk_ranges(len: usize, max_chunk: usize) -> Vec<Range<usize>> {
    let max_chunk = max_chunk.max(1);
    (0..len.div_ceil(max_chunk).max(1))
        .map(|i| i * max_chunk..((i + 1) * max_chunk).min(len))
        .collect()
}

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
    fn sequence_ids_keep_capture_order_and_room_for_resends() {
        assert_eq!(sequence_id(0, 0), 0);
        assert!(sequence_id(5, MAX_GENERATION) < sequence_id(6, 0));
        assert_eq!(capture_seq(sequence_id(123_456, 2)), 123_456);
        assert_eq!(sequence_id(1, 99), sequence_id(1, MAX_GENERATION));
        // 64-bit everywhere: capture sequences far beyond 2^32 still map one to one.
        assert_eq!(capture_seq(sequence_id(1 << 40, 1)), 1 << 40);
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn chunks_cover_the_payload_exactly() {
        assert_eq!(chunk_ranges(10, 100), [0..10]);
        assert_eq!(chunk_ranges(0, 100), [0..0]);
        assert_eq!(chunk_ranges(100, 100), [0..100]);
        let r = chunk_ranges(250, 100);
        assert_eq!(r, vec![0..100, 100..200, 200..250]);
        let r = chunk_ranges(20 << 20, (5 << 20) - 4096);
        assert_eq!(r.len(), 5);
        assert_eq!(r.last().unwrap().end, 20 << 20);
        assert!(r.windows(2).all(|w| w[0].end == w[1].start));
    }

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
