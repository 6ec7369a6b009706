//! The arithmetic of the disciplined clock: how a raw CLOCK_REALTIME reading becomes PTP time and
//! frame time. No I/O and no atomics here; [`super::disciplined`] publishes a [`Mapping`] to readers.
//!
//! The clock is one line segment `ptp(raw) = base_ptp + (raw - base_raw) * (1 + rate)`, re-anchored at
//! the current instant before every change, so a frequency change never makes time jump. `rate` is
//! the whole fractional frequency correction: the simulated oscillator error (a test knob), the
//! frequency kept from earlier masters, and what the PTP filter asks for now, multiplied together.
//!
//! Frames see `ptp(raw) - utc_offset`, floored at the last frame time handed out before a backward
//! step, so frame timestamps never go backwards even when the clock is stepped back; PTP itself sees
//! the unfloored line (the filter needs the truth).

/// Nanoseconds per second, as f64.
const NS: f64 = 1e9;

/// Fractional rate error of `(1 + a ppm)(1 + b ppm)(1 + c ppm) - 1`, as a plain fraction.
pub fn combined_rate(ppms: &[f64]) -> f64 {
    ppms.iter().fold(1.0, |acc, p| acc * (1.0 + p * 1e-6)) - 1.0
}

/// One segment of the disciplined clock, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mapping {
    /// Raw (CLOCK_REALTIME) time of the anchor.
    pub base_raw: i64,
    /// PTP time at the anchor.
    pub base_ptp: i64,
    /// Fractional frequency correction (1e-6 = 1 ppm fast); always > -0.5.
    pub rate: f64,
    /// Subtracted from PTP time to give frame time (the UTC offset when the grandmaster
    /// announces a valid one, else 0).
    pub utc_offset_ns: i64,
    /// Frame time never reads below this (set by backward steps).
    pub floor_ns: i64,
}

impl Mapping {
    /// A clock that reads `raw + offset_ns` now and runs `rate` fast.
    pub fn new(raw_now: i64, offset_ns: i64, rate: f64) -> Self {
        Self {
            base_raw: raw_now,
            base_ptp: raw_now + offset_ns,
            rate: rate.max(-0.5),
            utc_offset_ns: 0,
            floor_ns: i64::MIN,
        }
    }

    /// PTP time at raw time `raw` (the line, no floor).
    pub fn ptp(&self, raw: i64) -> i64 {
        let dt = raw - self.base_raw;
        self.base_ptp + dt + (dt as f64 * self.rate).round() as i64
    }

    /// Frame time at raw time `raw`: PTP time minus the UTC offset, never below the floor.
    pub fn frame(&self, raw: i64) -> i64 {
        (self.ptp(raw) - self.utc_offset_ns).max(self.floor_ns)
    }

    /// Re-anchors at `raw_now` and changes the rate from there on; time is continuous at `raw_now`.
    pub fn set_rate(&mut self, raw_now: i64, rate: f64) {
        self.base_ptp = self.ptp(raw_now);
        self.base_raw = raw_now;
        self.rate = rate.max(-0.5);
    }

    /// Moves the clock by `delta_ns` at `raw_now`. A backward step raises the floor to the frame
    /// time just before it, so frame time holds still until the clock catches up.
    pub fn step(&mut self, raw_now: i64, delta_ns: i64) {
        let before = self.frame(raw_now);
        self.base_ptp = self.ptp(raw_now) + delta_ns;
        self.base_raw = raw_now;
        if delta_ns < 0 {
            self.floor_ns = self.floor_ns.max(before);
        }
    }

    /// Changes the UTC offset applied to frame time; a frame-time decrease is floored like a step.
    pub fn set_utc_offset(&mut self, raw_now: i64, utc_offset_ns: i64) {
        let before = self.frame(raw_now);
        self.utc_offset_ns = utc_offset_ns;
        if self.frame(raw_now) < before {
            self.floor_ns = self.floor_ns.max(before);
        }
    }

    /// Raw time at which PTP time reads `ptp` (inverse of [`Mapping::ptp`], to within a nanosecond).
    pub fn raw_at(&self, ptp: i64) -> i64 {
        let d = ptp - self.base_ptp;
        self.base_raw + (d as f64 / (1.0 + self.rate)).round() as i64
    }

    /// Seconds of frame time that a backward step still holds (0 when no floor is active).
    pub fn floor_remaining_s(&self, raw_now: i64) -> f64 {
        let line = self.ptp(raw_now) - self.utc_offset_ns;
        ((self.floor_ns.saturating_sub(line)).max(0)) as f64 / NS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: i64 = 1_700_000_000_000_000_000;

    #[test]
    fn free_running_clock_has_offset_and_rate() {
        let m = Mapping::new(T0, -300_000_000, 50e-6);
        assert_eq!(m.ptp(T0), T0 - 300_000_000);
        // one second later the +50 ppm oscillator is 50 us further ahead
        assert_eq!(
            m.ptp(T0 + 1_000_000_000),
            T0 + 1_000_000_000 - 300_000_000 + 50_000
        );
    }

    #[test]
    fn set_rate_is_continuous_and_changes_slope() {
        let mut m = Mapping::new(T0, 0, 50e-6);
        let t = T0 + 2_000_000_000;
        let before = m.ptp(t);
        m.set_rate(t, 0.0);
        assert_eq!(m.ptp(t), before);
        assert_eq!(m.ptp(t + 1_000_000_000), before + 1_000_000_000);
    }

    #[test]
    fn combined_rate_multiplies() {
        let r = combined_rate(&[50.0, -50.0]);
        assert!((r - (-2.5e-9)).abs() < 1e-15, "{r}");
        assert_eq!(combined_rate(&[]), 0.0);
    }

    #[test]
    fn forward_step_moves_both_views() {
        let mut m = Mapping::new(T0, 0, 0.0);
        m.step(T0 + 10, 300_000_000);
        assert_eq!(m.ptp(T0 + 10), T0 + 10 + 300_000_000);
        assert_eq!(m.frame(T0 + 10), T0 + 10 + 300_000_000);
    }

    #[test]
    fn backward_step_holds_frame_time_until_the_line_catches_up() {
        let mut m = Mapping::new(T0, 300_000_000, 0.0);
        let t = T0 + 1_000;
        let last_frame = m.frame(t);
        m.step(t, -300_000_000);
        // PTP sees the step at once ...
        assert_eq!(m.ptp(t), t);
        // ... frames do not go back: they hold at the last value for 300 ms
        assert_eq!(m.frame(t), last_frame);
        assert_eq!(m.frame(t + 100_000_000), last_frame);
        assert!(m.floor_remaining_s(t) > 0.29);
        assert_eq!(m.frame(t + 400_000_000), t + 400_000_000);
        assert_eq!(m.floor_remaining_s(t + 400_000_000), 0.0);
    }

    #[test]
    fn utc_offset_applies_to_frames_only() {
        let mut m = Mapping::new(T0, 0, 0.0);
        m.set_utc_offset(T0, 37_000_000_000);
        assert_eq!(m.ptp(T0 + 37_000_000_001), T0 + 37_000_000_001);
        assert_eq!(m.frame(T0 + 37_000_000_001), T0 + 1);
    }

    #[test]
    fn raw_at_inverts_ptp() {
        let m = Mapping::new(T0, 12345, 37e-6);
        for dt in [0i64, 1, 999_999_999, 3_600_000_000_000] {
            let p = m.ptp(T0 + dt);
            assert!((m.raw_at(p) - (T0 + dt)).abs() <= 1);
        }
    }

    proptest! {
        /// Whatever the filter does (slews within +-500 ppm, steps either way), frame time read at
        /// increasing raw times never decreases.
        #[test]
        fn frame_time_is_monotonic(ops in proptest::collection::vec((0i64..50_000_000, -500.0f64..500.0, -400_000_000i64..400_000_000, any::<bool>()), 1..60)) {
            let mut m = Mapping::new(T0, 0, 0.0);
            let mut raw = T0;
            let mut last = m.frame(raw);
            for (advance, ppm, step, is_step) in ops {
                raw += advance;
                let f = m.frame(raw);
                prop_assert!(f >= last);
                last = f;
                if is_step { m.step(raw, step) } else { m.set_rate(raw, ppm * 1e-6) }
                let f = m.frame(raw);
                prop_assert!(f >= last);
                last = f;
            }
        }
    }
}
