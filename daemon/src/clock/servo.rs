//! The clock servo: turns the PTP port's timing measurements into clock steps and frequency
//! changes. Pure: [`Servo`] takes samples and returns [`Action`]s; [`PiFilter`] is the thin
//! statime `Filter` that carries them out on the port's clock.
//!
//! Why not statime's Kalman filter: at 1 Hz sync from a 50 ppm start it needed 30-55 s to lock
//! and on L2 still swung by hundreds of microseconds 30 s later (docs/CLOCK.md). This servo
//! follows the shape of linuxptp's PI servo (pi.c) instead:
//! - **Step first, on the sync alone.** A raw sync offset (`t2 - t1`, which is offset + path
//!   delay) beyond `step_threshold_ns` steps the clock at once; no delay is needed to remove
//!   300 ms, and a delay measured across the step would be garbage.
//! - **Then estimate the frequency from the raw offsets of one sync interval** (their slope is the
//!   frequency error; the path delay drops out), set it, and only then close the loop. A PI loop
//!   left to find 50 ppm by itself rings for tens of samples; the estimate starts it within about
//!   a ppm.
//! - **Two offset observations per exchange.** E2E gives two independent ones: from the Sync
//!   (`raw_sync - delay`) and from the Delay_Req (`raw_delay + delay`), with `delay` the median of
//!   the last [`DELAY_WINDOW`] path delays. Both feed the loop, so at 1 Hz it gets two samples a
//!   second.
//! - **PI with gains that fall from acquisition to tracking** ([`Gains`]): strong right after the
//!   estimate to pull the remaining tens of microseconds in within a few samples, then weaker so
//!   the clock does not follow the timestamp noise.
//! - **Outliers are clamped, a real jump is not ignored.** A sample far beyond the recent noise
//!   (a CPU stall delaying one timestamp) moves the loop by at most [`OUTLIER_FACTOR`] times the
//!   noise; beyond the step threshold twice in a row, the clock steps again.

use std::collections::VecDeque;

use statime::filters::{Filter, FilterEstimate, FilterUpdate};
use statime::port::Measurement;
use statime::time::{Duration, Time};

/// Path delays kept for the median.
pub const DELAY_WINDOW: usize = 15;
/// A sample counts as an outlier beyond this many times the recent absolute offset.
pub const OUTLIER_FACTOR: f64 = 4.0;
/// Frequency corrections are kept within this (ppm).
pub const MAX_PPM: f64 = 1000.0;

/// The servo's configuration, from `[clock]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServoConfig {
    /// Offsets beyond this are stepped, not slewed.
    pub step_threshold_ns: f64,
    /// The master's sync interval (s).
    pub sync_interval_s: f64,
    /// The delay request interval (s), for the expected time between samples.
    pub delay_interval_s: f64,
}

/// What the servo asks of the clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Move the clock by this much (ns, added to the clock).
    Step(i64),
    /// Run at this frequency (ppm against the clock's base, as statime's `set_frequency`).
    Frequency(f64),
}

/// One timing measurement, in the slave clock's nanoseconds and seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sample {
    /// Sync: receive time minus the master's send time (offset plus path delay).
    Sync { at_s: f64, raw_ns: f64 },
    /// Delay_Req: our send time minus the master's receive time (offset minus path delay).
    DelayReq { at_s: f64, raw_ns: f64 },
    /// A peer delay (P2P), measured separately from the offsets.
    PeerDelay { delay_ns: f64 },
}

/// Proportional and integral gains per sample, falling from `acquire` to `track` as the loop
/// settles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gains {
    pub kp_acquire: f64,
    pub ki_acquire: f64,
    pub kp_track: f64,
    pub ki_track: f64,
    /// Seconds over which the gains move from acquisition to tracking.
    pub settle_s: f64,
}

impl Default for Gains {
    fn default() -> Self {
        Self {
            kp_acquire: 0.7,
            ki_acquire: 0.3,
            kp_track: 0.3,
            ki_track: 0.03,
            settle_s: 6.0,
        }
    }
}

impl Gains {
    /// (kp, ki) for the `n`th sample since the loop closed, samples `interval_s` apart. The
    /// gains are per half second (the sample interval at 1 Hz sync and delay requests); faster
    /// samples get smaller shares, kp by `(interval / 0.5 s)^0.7` and ki by the square of that,
    /// as linuxptp scales its software-timestamping PI gains (exponents -0.3 and 0.4 on
    /// per-second gains): at 8 Hz a sample moves the clock by a sixth of what it does at 1 Hz,
    /// so the loop averages over about the same time instead of following every timestamp's
    /// noise.
    fn at(&self, n: u32, interval_s: f64) -> (f64, f64) {
        let f = (n as f64 * interval_s / self.settle_s.max(1e-3)).min(1.0);
        let r = (interval_s / 0.5).clamp(1e-3, 1.0);
        let (p, i) = (r.powf(0.7), r.powf(1.4));
        // geometric: the gains fall at the same pace whatever their ratio
        let g = |a: f64, t: f64| a * (t / a).powf(f);
        (
            g(self.kp_acquire * p, self.kp_track * p),
            g(self.ki_acquire * i, self.ki_track * i),
        )
    }
}

/// Where the servo is.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Collecting raw offsets since the last step (or the start) for the frequency estimate.
    Estimating {
        syncs: Vec<(f64, f64)>,
        delay_reqs: Vec<(f64, f64)>,
    },
    /// The PI loop runs; `n` samples so far.
    Running { n: u32 },
}

/// The servo's state; see the module doc for the method.
#[derive(Debug, Clone)]
pub struct Servo {
    cfg: ServoConfig,
    gains: Gains,
    phase: Phase,
    /// The last Sync's raw offset and time, in the clock's current epoch (cleared by a step).
    last_sync: Option<(f64, f64)>,
    /// Recent path delays: (delay, seconds between the Sync and the Delay_Req it was paired with).
    delays: VecDeque<(f64, f64)>,
    /// The frequency asked for (ppm against the base).
    freq_ppm: f64,
    /// The integral term (ppb, the learned frequency error with its sign: positive = fast).
    integral_ppb: f64,
    /// The last offset measured (ns), 0 when there is none since the last step.
    offset_ns: f64,
    /// The offsets of the last second or so since the loop closed (for [`Servo::estimate_ns`]).
    recent: VecDeque<f64>,
    /// Recent absolute offset (exponential average), the outlier scale.
    noise_ns: f64,
    /// Consecutive samples beyond the step threshold while running.
    beyond: u32,
    /// A proportional correction is in force and should end after this long (s).
    kick_s: Option<f64>,
}

impl Servo {
    pub fn new(cfg: ServoConfig, gains: Gains) -> Self {
        Self {
            cfg,
            gains,
            phase: Phase::Estimating {
                syncs: Vec::new(),
                delay_reqs: Vec::new(),
            },
            last_sync: None,
            delays: VecDeque::with_capacity(DELAY_WINDOW),
            freq_ppm: 0.0,
            integral_ppb: 0.0,
            offset_ns: 0.0,
            recent: VecDeque::new(),
            noise_ns: 0.0,
            beyond: 0,
            kick_s: None,
        }
    }

    /// How long the proportional correction of the last sample should run (taken once): the
    /// caller ends it with [`Servo::end_kick`] after that long, so it removes its share of the
    /// offset whenever the next sample comes, and never outlives the master (holdover runs on
    /// the learned frequency alone).
    pub fn take_kick(&mut self) -> Option<f64> {
        self.kick_s.take()
    }

    /// Back to the learned frequency, without the proportional correction.
    pub fn end_kick(&mut self) -> Option<Action> {
        let learned = (-self.integral_ppb * 1e-3).clamp(-MAX_PPM, MAX_PPM);
        (self.running() && learned != self.freq_ppm).then(|| self.set_frequency(learned))
    }

    /// Median of the recent path delays.
    pub fn delay_ns(&self) -> Option<f64> {
        if self.delays.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.delays.iter().map(|d| d.0).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// The last offset measured from the master (ns); 0 when none since the last step.
    pub fn offset_ns(&self) -> f64 {
        self.offset_ns
    }

    /// The offset estimate reported to the port (and so to the lock tracker): the mean of the
    /// offsets measured over about the last second (at least two: a Sync and a Delay_Req, whose
    /// errors from an asymmetric delay cancel), so one noisy timestamp does not decide the lock;
    /// 0 when there is none since the last step.
    pub fn estimate_ns(&self) -> f64 {
        if self.recent.is_empty() {
            return self.offset_ns;
        }
        self.recent.iter().sum::<f64>() / self.recent.len() as f64
    }

    fn remember(&mut self, o: f64) {
        let n = (1.0 / self.expected_interval_s()).round().max(2.0) as usize;
        while self.recent.len() >= n {
            self.recent.pop_front();
        }
        self.recent.push_back(o);
    }

    /// The frequency asked for (ppm against the base).
    pub fn frequency_ppm(&self) -> f64 {
        self.freq_ppm
    }

    /// Whether the loop is closed (the frequency estimate is done).
    pub fn running(&self) -> bool {
        matches!(self.phase, Phase::Running { .. })
    }

    fn expected_interval_s(&self) -> f64 {
        // Syncs and delay requests both give samples: the mean spacing of the merged stream.
        let rate =
            1.0 / self.cfg.sync_interval_s.max(1e-3) + 1.0 / self.cfg.delay_interval_s.max(1e-3);
        1.0 / rate
    }

    fn push_delay(&mut self, d: f64, dt_s: f64) {
        if self.delays.len() == DELAY_WINDOW {
            self.delays.pop_front();
        }
        self.delays.push_back((d, dt_s));
    }

    /// Steps by `delta_ns`; the loop keeps its frequency. The last Sync moves with the clock so
    /// the next Delay_Req still pairs with it.
    fn step(&mut self, delta_ns: f64) -> Action {
        self.beyond = 0;
        self.offset_ns = 0.0;
        self.recent.clear();
        if let Some((t, raw)) = self.last_sync {
            self.last_sync = Some((t, raw + delta_ns));
        }
        Action::Step(delta_ns.round() as i64)
    }

    fn set_frequency(&mut self, ppm: f64) -> Action {
        self.freq_ppm = ppm.clamp(-MAX_PPM, MAX_PPM);
        Action::Frequency(self.freq_ppm)
    }

    /// One measurement in; what to do with the clock out.
    pub fn sample(&mut self, s: Sample) -> Vec<Action> {
        match s {
            Sample::PeerDelay { delay_ns } => {
                self.push_delay(delay_ns, 0.0);
                Vec::new()
            }
            Sample::Sync { at_s, raw_ns } => {
                self.last_sync = Some((at_s, raw_ns));
                if let Phase::Estimating { syncs, .. } = &mut self.phase {
                    syncs.push((at_s, raw_ns));
                }
                self.after_sample(|d| raw_ns - d)
            }
            Sample::DelayReq { at_s, raw_ns } => {
                if self.running() && raw_ns.abs() > self.cfg.step_threshold_ns {
                    // Sent before the last step and answered after it (or the clock jumped, which
                    // the Syncs show): no use as a delay, nor as an offset.
                    return Vec::new();
                }
                if let Phase::Estimating { delay_reqs, .. } = &mut self.phase {
                    delay_reqs.push((at_s, raw_ns));
                }
                let Some((sync_at, sync_raw)) = self.last_sync else {
                    return Vec::new();
                };
                self.push_delay((sync_raw - raw_ns) / 2.0, at_s - sync_at);
                self.after_sample(|d| raw_ns + d)
            }
        }
    }

    /// After a Sync or Delay_Req: `offset` turns a path delay into this sample's offset.
    fn after_sample(&mut self, offset: impl Fn(f64) -> f64) -> Vec<Action> {
        if self.delay_ns().is_none() {
            return Vec::new();
        }
        match &self.phase {
            Phase::Estimating { syncs, delay_reqs } => {
                let Some(drift_ppb) = self.estimate(syncs, delay_reqs) else {
                    self.offset_ns = self.delay_ns().map(&offset).unwrap_or(0.0);
                    return Vec::new();
                };
                // The delays measured so far paired a Sync with a later Delay_Req while the clock
                // ran off by the drift: take that out of them.
                for d in self.delays.iter_mut() {
                    d.0 += drift_ppb * d.1 / 2.0;
                    d.1 = 0.0;
                }
                let now = self.delay_ns().map(&offset).unwrap_or(0.0);
                // The slope was measured at the frequency in force: the error is on top of it.
                self.integral_ppb = -self.freq_ppm * 1e3 + drift_ppb;
                self.phase = Phase::Running { n: 0 };
                self.noise_ns = 1_000.0;
                let mut out = vec![self.set_frequency(-self.integral_ppb * 1e-3)];
                if now.abs() > self.cfg.step_threshold_ns {
                    // Frequency and phase together, as ptp4l's first jump: nothing left to slew.
                    out.push(self.step(-now));
                } else {
                    self.offset_ns = now;
                }
                out
            }
            Phase::Running { n } => {
                let n = *n;
                let o = self.delay_ns().map(&offset).unwrap_or(0.0);
                if o.abs() > self.cfg.step_threshold_ns {
                    self.beyond += 1;
                    if self.beyond >= 2 {
                        return vec![self.step(-o)];
                    }
                    return Vec::new();
                }
                self.beyond = 0;
                self.offset_ns = o;
                self.remember(o);
                let limit = OUTLIER_FACTOR * self.noise_ns.max(500.0);
                let used = o.clamp(-limit, limit);
                self.noise_ns += 0.1 * (o.abs().min(limit) - self.noise_ns);
                let t = self.expected_interval_s();
                let (kp, ki) = self.gains.at(n, t);
                // ppb for one sample interval: offset positive = this clock ahead, run slower.
                self.integral_ppb += ki * used / t;
                let out_ppb = self.integral_ppb + kp * used / t;
                self.phase = Phase::Running {
                    n: n.saturating_add(1),
                };
                self.kick_s = Some(t);
                vec![self.set_frequency(-out_ppb * 1e-3)]
            }
        }
    }

    /// Frequency error (ppb, positive = this clock fast) from the raw offsets' slope, once a
    /// series spans most of a sync interval.
    fn estimate(&self, syncs: &[(f64, f64)], delay_reqs: &[(f64, f64)]) -> Option<f64> {
        // One second at least: a slope over 125 ms of microsecond noise is off by ppm.
        let min_span = (0.75 * self.cfg.sync_interval_s).max(1.0);
        let slope = |v: &[(f64, f64)]| -> Option<(f64, f64)> {
            let span = v.last()?.0 - v.first()?.0;
            if v.len() < 2 || span < min_span {
                return None;
            }
            let n = v.len() as f64;
            let mt = v.iter().map(|p| p.0).sum::<f64>() / n;
            let mo = v.iter().map(|p| p.1).sum::<f64>() / n;
            let sxx: f64 = v.iter().map(|p| (p.0 - mt).powi(2)).sum();
            let sxy: f64 = v.iter().map(|p| (p.0 - mt) * (p.1 - mo)).sum();
            Some((sxy / sxx, sxx))
        };
        match (slope(syncs), slope(delay_reqs)) {
            (Some((a, wa)), Some((b, wb))) => Some((a * wa + b * wb) / (wa + wb)),
            (Some((a, _)), None) => Some(a),
            _ => None,
        }
    }
}

/// statime's side of the servo: measurements in, the servo's actions carried out on the clock.
#[derive(Debug)]
pub struct PiFilter {
    servo: Servo,
    /// Time of the first measurement: sample times are seconds since it (f64 keeps sub-ns there).
    origin: Option<Time>,
}

impl PiFilter {
    fn seconds(&mut self, t: Time) -> f64 {
        let origin = *self.origin.get_or_insert(t);
        (t - origin).seconds()
    }

    fn carry_out<C: statime::Clock>(clock: &mut C, actions: impl IntoIterator<Item = Action>) {
        for a in actions {
            // The clock's errors are its own to report (PortClock cannot fail; a kernel clock
            // logs its failures); the servo goes on either way.
            match a {
                Action::Step(ns) => {
                    let _ = clock.step_clock(Duration::from_nanos(ns));
                }
                Action::Frequency(ppm) => {
                    let _ = clock.set_frequency(ppm);
                }
            }
        }
    }

    fn update_out(&mut self) -> FilterUpdate {
        FilterUpdate {
            next_update: self
                .servo
                .take_kick()
                .map(core::time::Duration::from_secs_f64),
            mean_delay: self
                .servo
                .delay_ns()
                .map(|d| Duration::from_nanos(d.round() as i64)),
        }
    }
}

impl Filter for PiFilter {
    type Config = ServoConfig;

    fn new(config: ServoConfig) -> Self {
        Self {
            servo: Servo::new(config, Gains::default()),
            origin: None,
        }
    }

    fn measurement<C: statime::Clock>(&mut self, m: Measurement, clock: &mut C) -> FilterUpdate {
        let at_s = self.seconds(m.event_time);
        let mut samples = Vec::with_capacity(2);
        if let Some(d) = m.peer_delay {
            samples.push(Sample::PeerDelay {
                delay_ns: d.nanos_lossy(),
            });
        }
        if let Some(raw) = m.raw_sync_offset {
            samples.push(Sample::Sync {
                at_s,
                raw_ns: raw.nanos_lossy(),
            });
        }
        if let Some(raw) = m.raw_delay_offset {
            samples.push(Sample::DelayReq {
                at_s,
                raw_ns: raw.nanos_lossy(),
            });
        }
        for s in samples {
            let actions = self.servo.sample(s);
            tracing::trace!(?s, ?actions, offset_ns = self.servo.offset_ns(),
                delay_ns = ?self.servo.delay_ns(), "servo sample");
            Self::carry_out(clock, actions);
        }
        self.update_out()
    }

    fn update<C: statime::Clock>(&mut self, clock: &mut C) -> FilterUpdate {
        // The proportional correction has run its course.
        Self::carry_out(clock, self.servo.end_kick());
        self.update_out()
    }

    fn demobilize<C: statime::Clock>(mut self, clock: &mut C) {
        // The master is gone: keep the learned frequency without the last correction (the daemon
        // moves it into the base).
        Self::carry_out(clock, self.servo.end_kick());
    }

    fn current_estimates(&self) -> FilterEstimate {
        FilterEstimate {
            offset_from_master: Duration::from_nanos(self.servo.estimate_ns().round() as i64),
            mean_delay: Duration::from_nanos(self.servo.delay_ns().unwrap_or(0.0).round() as i64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slave clock with an oscillator error, the master on true time, a path with a fixed
    /// delay and deterministic noise: the servo against known truth.
    struct Sim {
        servo: Servo,
        /// Slave clock = phase_ns + rate * (true - anchor) ..., kept as (anchor true, anchor slave).
        anchor_true: f64,
        anchor_slave: f64,
        osc_ppm: f64,
        adj_ppm: f64,
        steps: u32,
        delay_ns: f64,
        noise_ns: f64,
        rng: u64,
        kick_end: Option<f64>,
    }

    impl Sim {
        fn new(offset_ns: f64, osc_ppm: f64, noise_ns: f64, sync_interval_s: f64) -> Self {
            Self {
                servo: Servo::new(
                    ServoConfig {
                        step_threshold_ns: 1e6,
                        sync_interval_s,
                        delay_interval_s: sync_interval_s,
                    },
                    Gains::default(),
                ),
                anchor_true: 0.0,
                anchor_slave: offset_ns,
                osc_ppm,
                adj_ppm: 0.0,
                steps: 0,
                delay_ns: 30_000.0,
                noise_ns,
                rng: 0x9e37_79b9_7f4a_7c15,
                kick_end: None,
            }
        }

        /// A sample at true time `at` (ns): first the end of a correction that ran its course
        /// (statime's filter update timer), then the sample and what it asks for.
        fn feed(&mut self, at: f64, s: Sample) {
            if let Some(end) = self.kick_end.filter(|e| *e <= at) {
                self.kick_end = None;
                let a: Vec<Action> = self.servo.end_kick().into_iter().collect();
                self.apply(end, a);
            }
            let a = self.servo.sample(s);
            self.apply(at, a);
            if let Some(k) = self.servo.take_kick() {
                self.kick_end = Some(at + k * 1e9);
            }
        }

        fn rate(&self) -> f64 {
            (1.0 + self.osc_ppm * 1e-6) * (1.0 + self.adj_ppm * 1e-6)
        }

        fn slave(&self, true_ns: f64) -> f64 {
            self.anchor_slave + (true_ns - self.anchor_true) * self.rate()
        }

        fn error(&self, true_ns: f64) -> f64 {
            self.slave(true_ns) - true_ns
        }

        /// Uniform in [-noise, noise] (xorshift).
        fn noise(&mut self) -> f64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            ((self.rng >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * self.noise_ns
        }

        fn apply(&mut self, at_true: f64, actions: Vec<Action>) {
            for a in actions {
                self.anchor_slave = self.slave(at_true);
                self.anchor_true = at_true;
                match a {
                    Action::Step(ns) => {
                        self.anchor_slave += ns as f64;
                        self.steps += 1;
                    }
                    Action::Frequency(ppm) => self.adj_ppm = ppm,
                }
            }
        }

        /// One exchange starting at true time `t` (ns): a Sync, then a Delay_Req `dr_after` later.
        fn exchange(&mut self, t: f64, dr_after: f64) {
            let arrive = t + self.delay_ns + self.noise();
            let t2 = self.slave(arrive);
            let s = Sample::Sync {
                at_s: t2 * 1e-9,
                raw_ns: t2 - t,
            };
            self.feed(arrive, s);
            let send = t + dr_after;
            let t3 = self.slave(send);
            let t4 = send + self.delay_ns + self.noise();
            let s = Sample::DelayReq {
                at_s: t3 * 1e-9,
                raw_ns: t3 - t4,
            };
            self.feed(send, s);
        }

        /// Runs `seconds` of exchanges from true time `from_s`; returns the true errors seen
        /// just before each exchange.
        fn run(&mut self, from_s: f64, seconds: f64, interval_s: f64) -> Vec<f64> {
            let mut errs = Vec::new();
            let n = (seconds / interval_s) as usize;
            for i in 0..n {
                let t = (from_s + i as f64 * interval_s) * 1e9;
                errs.push(self.error(t));
                // delay requests at a wandering phase, as statime randomises their interval
                let phase = 0.1 + 0.8 * ((i * 7919) % 97) as f64 / 97.0;
                self.exchange(t, phase * interval_s * 1e9);
            }
            errs
        }
    }

    fn rms(v: &[f64]) -> f64 {
        (v.iter().map(|e| e * e).sum::<f64>() / v.len() as f64).sqrt()
    }

    #[test]
    fn from_300_ms_and_50_ppm_one_step_then_within_a_microsecond_in_6_s_at_1_hz() {
        let mut sim = Sim::new(300e6, 50.0, 0.0, 1.0);
        sim.run(0.0, 6.0, 1.0);
        assert_eq!(sim.steps, 1);
        let errs = sim.run(6.0, 20.0, 1.0);
        assert!(errs.iter().all(|e| e.abs() < 1_000.0), "{errs:?}");
        assert!(
            (sim.adj_ppm + 50.0).abs() < 0.01,
            "frequency {} ppm",
            sim.adj_ppm
        );
        assert!(sim.servo.running());
    }

    #[test]
    fn timestamp_noise_is_not_followed_one_for_one() {
        // +-2 us of uniform noise per timestamp (1.15 us RMS): the clock must stay well inside.
        let mut sim = Sim::new(300e6, 50.0, 2_000.0, 1.0);
        sim.run(0.0, 15.0, 1.0);
        let errs = sim.run(15.0, 60.0, 1.0);
        assert_eq!(sim.steps, 1);
        assert!(rms(&errs) < 1_000.0, "rms {} ns", rms(&errs));
    }

    #[test]
    fn ten_microseconds_of_noise_at_8_hz_neither_rings_nor_hides_the_lock() {
        // Timestamps through a busy bridge: +-10 us each. The clock must average, not follow,
        // and the reported estimate must settle within the 1 us lock threshold.
        let mut sim = Sim::new(300e6, 50.0, 10_000.0, 0.125);
        sim.run(0.0, 15.0, 0.125);
        let mut estimates = Vec::new();
        let mut errs = Vec::new();
        for i in 0..160 {
            errs.extend(sim.run(15.0 + i as f64 * 0.125, 0.125, 0.125));
            estimates.push(sim.servo.estimate_ns());
        }
        assert_eq!(sim.steps, 1);
        assert!(rms(&errs) < 2_500.0, "true error rms {} ns", rms(&errs));
        let within = estimates.iter().filter(|e| e.abs() <= 1_000.0).count();
        assert!(
            within * 2 > estimates.len(),
            "{within}/{} estimates within 1 us",
            estimates.len()
        );
    }

    #[test]
    fn eight_hz_converges_as_well() {
        let mut sim = Sim::new(-300e6, -50.0, 500.0, 0.125);
        sim.run(0.0, 3.0, 0.125);
        let errs = sim.run(3.0, 10.0, 0.125);
        assert_eq!(sim.steps, 1);
        assert!(errs.iter().all(|e| e.abs() < 1_000.0), "{errs:?}");
    }

    #[test]
    fn a_single_outlier_neither_steps_nor_throws_the_clock_off() {
        let mut sim = Sim::new(0.0, 20.0, 0.0, 1.0);
        sim.run(0.0, 20.0, 1.0);
        assert_eq!(sim.steps, 0);
        // one Sync delayed by 3 ms (a CPU stall before the timestamp was taken)
        let t = 20e9;
        let arrive = t + sim.delay_ns + 3e6;
        let t2 = sim.slave(arrive);
        sim.feed(
            arrive,
            Sample::Sync {
                at_s: t2 * 1e-9,
                raw_ns: t2 - t,
            },
        );
        let errs = sim.run(21.0, 5.0, 1.0);
        assert_eq!(sim.steps, 0);
        assert!(errs.iter().all(|e| e.abs() < 5_000.0), "{errs:?}");
    }

    #[test]
    fn holdover_runs_on_the_learned_frequency_not_the_last_correction() {
        let mut sim = Sim::new(0.0, 20.0, 1_000.0, 0.125);
        sim.run(0.0, 20.0, 0.125);
        // the master goes silent right after a sample: the correction ends on its timer
        let t = 20e9;
        let arrive = t + sim.delay_ns + 1_500.0;
        let t2 = sim.slave(arrive);
        sim.feed(
            arrive,
            Sample::Sync {
                at_s: t2 * 1e-9,
                raw_ns: t2 - t,
            },
        );
        let e0 = sim.error(t);
        let end = sim.kick_end.expect("a correction with an end");
        let a: Vec<Action> = sim.servo.end_kick().into_iter().collect();
        sim.apply(end, a);
        let drift = (sim.error(t + 10e9) - e0).abs();
        assert!(drift < 2_000.0, "drifted {drift} ns in 10 s of holdover");
    }

    #[test]
    fn a_real_jump_is_stepped_once_it_persists() {
        let mut sim = Sim::new(0.0, 0.0, 0.0, 1.0);
        sim.run(0.0, 10.0, 1.0);
        assert_eq!(sim.steps, 0);
        sim.anchor_slave += 5e6; // something moved the clock by 5 ms
        let errs = sim.run(10.0, 20.0, 1.0);
        assert_eq!(sim.steps, 1);
        assert!(errs[10..].iter().all(|e| e.abs() < 1_000.0), "{errs:?}");
    }

    #[test]
    fn delay_is_the_median_and_a_request_across_a_step_is_ignored() {
        let cfg = ServoConfig {
            step_threshold_ns: 1e6,
            sync_interval_s: 1.0,
            delay_interval_s: 1.0,
        };
        let mut s = Servo::new(cfg, Gains::default());
        // 300 ms ahead, not drifting, 30 us of path delay: one step, together with the estimate
        assert!(s
            .sample(Sample::Sync {
                at_s: 0.0,
                raw_ns: 3e8 + 3e4
            })
            .is_empty());
        assert!(s
            .sample(Sample::DelayReq {
                at_s: 0.5,
                raw_ns: 3e8 - 3e4
            })
            .is_empty());
        assert_eq!(s.delay_ns(), Some(30_000.0));
        let a = s.sample(Sample::Sync {
            at_s: 1.0,
            raw_ns: 3e8 + 3e4,
        });
        assert_eq!(a, vec![Action::Frequency(0.0), Action::Step(-300_000_000)]);
        // sent before the step, answered after it: ignored
        assert!(s
            .sample(Sample::DelayReq {
                at_s: 1.5,
                raw_ns: 3e8 - 3e4
            })
            .is_empty());
        assert_eq!(s.delay_ns(), Some(30_000.0));
        for (i, d) in [31_000.0, 90_000.0, 29_000.0].iter().enumerate() {
            let t = 2.0 + i as f64;
            s.sample(Sample::Sync {
                at_s: t,
                raw_ns: *d,
            });
            s.sample(Sample::DelayReq {
                at_s: t + 0.5,
                raw_ns: -*d,
            });
        }
        // 30, 31, 90, 29 us: the 90 us outlier moves the median by half a microsecond only
        assert_eq!(s.delay_ns(), Some(30_500.0));
    }
}
