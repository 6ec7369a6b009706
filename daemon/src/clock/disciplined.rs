//! The disciplined clock shared between the PTP port (one writer) and capture (many readers).
//!
//! Invariants:
//! - Readers never lock or wait on the writer: the current [`Mapping`] is published through a
//!   seqlock made of atomics (readers retry in the rare case they raced a publish).
//! - Frame time is monotonic: [`Mapping::frame`] floors backward steps, and [`FrameClock::now`]
//!   additionally never returns less than it returned before (so even a step of the host's
//!   CLOCK_REALTIME underneath cannot make `now()` go back).
//! - Every step is counted; slews (frequency changes) are continuous and not counted.
//!
//! The PTP side sees the same clock through [`PortClock`], which implements statime's `Clock`.
//! statime's frequency is absolute against a base; [`DisciplinedClock::rebase_frequency`] moves the
//! current correction into that base whenever a new filter takes over (a new master, a master back
//! after holdover), so a fresh filter starts from the frequency already learned instead of zero.

use rigd_drivers::{ClockState, FrameClock, KernelClock, Stamp};
use std::sync::atomic::{fence, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use super::mapping::{combined_rate, Mapping};

/// Where raw time comes from: CLOCK_REALTIME in the daemon, a counter in tests.
pub type RawSource = Box<dyn Fn() -> i64 + Send + Sync>;

/// What the disciplining side writes: the mapping and the frequency components (ppm) whose product is its rate.
#[derive(Debug, Clone, Copy)]
struct Discipline {
    mapping: Mapping,
    /// Simulated oscillator error (test knob); never corrected directly, only compensated.
    simulated_ppm: f64,
    /// Correction carried over from filters that are gone.
    base_ppm: f64,
    /// What the current PTP filter asked for, relative to the base.
    filter_ppm: f64,
}

/// The rig clock: a software clock over CLOCK_REALTIME, disciplined by PTP.
pub struct DisciplinedClock {
    raw: RawSource,
    seq: AtomicU64,
    base_raw: AtomicI64,
    base_ptp: AtomicI64,
    rate_bits: AtomicU64,
    utc_offset_ns: AtomicI64,
    floor_ns: AtomicI64,
    last_now: AtomicI64,
    state: AtomicU8,
    steps: AtomicU64,
    adjustments: AtomicU64,
    /// `target = "system"`: corrections go to this kernel clock (the mapping stays the identity
    /// but for the floor); `None`: the virtual clock, corrections live in the mapping.
    kernel: Option<KernelClock>,
    /// The last kernel call failed (logged once until one succeeds again).
    kernel_failing: std::sync::atomic::AtomicBool,
    writer: Mutex<Discipline>,
}

impl std::fmt::Debug for DisciplinedClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisciplinedClock")
            .field("mapping", &self.load())
            .field("state", &self.state())
            .field("steps", &self.steps())
            .finish()
    }
}

impl DisciplinedClock {
    /// A clock over `raw` that starts `offset_ns` off and runs `simulated_ppm` fast until PTP
    /// corrects it (both 0 outside tests).
    pub fn new(raw: RawSource, offset_ns: i64, simulated_ppm: f64) -> Self {
        let now = raw();
        let m = Mapping::new(now, offset_ns, combined_rate(&[simulated_ppm]));
        let c = Self {
            raw,
            seq: AtomicU64::new(0),
            base_raw: AtomicI64::new(0),
            base_ptp: AtomicI64::new(0),
            rate_bits: AtomicU64::new(0),
            utc_offset_ns: AtomicI64::new(0),
            floor_ns: AtomicI64::new(i64::MIN),
            last_now: AtomicI64::new(i64::MIN),
            state: AtomicU8::new(ClockState::Unsynced.as_u8()),
            steps: AtomicU64::new(0),
            adjustments: AtomicU64::new(0),
            kernel: None,
            kernel_failing: std::sync::atomic::AtomicBool::new(false),
            writer: Mutex::new(Discipline {
                mapping: m,
                simulated_ppm,
                base_ppm: 0.0,
                filter_ppm: 0.0,
            }),
        };
        c.publish(&m);
        c
    }

    /// Over CLOCK_REALTIME.
    /// A clock that steers the kernel clock `k` itself (`target = "system"`), starting from the
    /// frequency offset the kernel has now.
    pub fn kernel(k: KernelClock) -> std::io::Result<Self> {
        let base_ppm = k.frequency_ppm()?;
        let mut c = Self::new(Box::new(move || k.now_ns()), 0, 0.0);
        c.kernel = Some(k);
        c.writer
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .base_ppm = base_ppm;
        Ok(c)
    }

    fn kernel_result(&self, what: &str, r: std::io::Result<()>) {
        match r {
            Ok(()) => {
                if self.kernel_failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(what, "clock: the kernel clock takes corrections again");
                }
            }
            Err(e) => {
                if !self.kernel_failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(what, error = %e, "clock: cannot steer the kernel clock; frames keep its uncorrected time");
                }
            }
        }
    }

    pub fn realtime(offset_ns: i64, simulated_ppm: f64) -> Self {
        Self::new(
            Box::new(rigd_drivers::realtime_ns),
            offset_ns,
            simulated_ppm,
        )
    }

    /// The current raw (CLOCK_REALTIME) time.
    pub fn raw_now(&self) -> i64 {
        (self.raw)()
    }

    fn publish(&self, m: &Mapping) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.base_raw.store(m.base_raw, Ordering::Relaxed);
        self.base_ptp.store(m.base_ptp, Ordering::Relaxed);
        self.rate_bits.store(m.rate.to_bits(), Ordering::Relaxed);
        self.utc_offset_ns.store(m.utc_offset_ns, Ordering::Relaxed);
        self.floor_ns.store(m.floor_ns, Ordering::Relaxed);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The published mapping, read without locking.
    pub fn load(&self) -> Mapping {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let m = Mapping {
                    base_raw: self.base_raw.load(Ordering::Relaxed),
                    base_ptp: self.base_ptp.load(Ordering::Relaxed),
                    rate: f64::from_bits(self.rate_bits.load(Ordering::Relaxed)),
                    utc_offset_ns: self.utc_offset_ns.load(Ordering::Relaxed),
                    floor_ns: self.floor_ns.load(Ordering::Relaxed),
                };
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return m;
                }
            }
            std::hint::spin_loop();
        }
    }

    fn write<R>(&self, f: impl FnOnce(&mut Discipline, i64) -> R) -> R {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let raw = (self.raw)();
        let r = f(&mut w, raw);
        self.publish(&w.mapping);
        r
    }

    /// PTP time now (what the port and the grandmaster compare).
    pub fn ptp_now(&self) -> i64 {
        self.load().ptp((self.raw)())
    }

    /// Maps a raw kernel timestamp (CLOCK_REALTIME) to PTP time, for packet timestamps.
    pub fn ptp_at(&self, raw: i64) -> i64 {
        self.load().ptp(raw)
    }

    pub fn state(&self) -> ClockState {
        ClockState::from_u8(self.state.load(Ordering::Relaxed)).unwrap_or(ClockState::Unsynced)
    }

    pub fn set_state(&self, s: ClockState) {
        self.state.store(s.as_u8(), Ordering::Relaxed);
    }

    /// Steps taken since start.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// Steps and frequency changes since start: the port notices a new filter sample by it.
    pub fn adjustments(&self) -> u64 {
        self.adjustments.load(Ordering::Relaxed)
    }

    /// The frequency correction applied now, in ppm against the raw clock's (simulated) rate.
    pub fn correction_ppm(&self) -> f64 {
        let w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        combined_rate(&[w.base_ppm, w.filter_ppm]) * 1e6
    }

    /// Moves the current filter's correction into the base, so the next filter's "0 ppm" keeps
    /// the frequency learned so far.
    pub fn rebase_frequency(&self) {
        self.write(|w, _| {
            w.base_ppm = combined_rate(&[w.base_ppm, w.filter_ppm]) * 1e6;
            w.filter_ppm = 0.0;
        });
    }

    /// statime's set_frequency: `ppm` is absolute against the base.
    pub fn set_frequency(&self, ppm: f64) -> i64 {
        self.adjustments.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = self.kernel {
            let total = self.write(|w, _| {
                w.filter_ppm = ppm;
                combined_rate(&[w.base_ppm, w.filter_ppm]) * 1e6
            });
            self.kernel_result("frequency", k.set_frequency_ppm(total));
            return k.now_ns();
        }
        self.write(|w, raw| {
            w.filter_ppm = ppm;
            let rate = combined_rate(&[w.simulated_ppm, w.base_ppm, w.filter_ppm]);
            w.mapping.set_rate(raw, rate);
            w.mapping.ptp(raw)
        })
    }

    /// statime's step_clock: counted.
    pub fn step(&self, delta_ns: i64) -> i64 {
        self.adjustments.fetch_add(1, Ordering::Relaxed);
        self.steps.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = self.kernel {
            return self.write(|w, raw| {
                // The kernel clock jumps; frame time holds at its last value over a backward step.
                let before = w.mapping.frame(raw);
                let r = k.step_ns(delta_ns);
                let stepped = r.is_ok();
                self.kernel_result("step", r);
                if stepped && delta_ns < 0 {
                    w.mapping.floor_ns = w.mapping.floor_ns.max(before);
                }
                k.now_ns()
            });
        }
        self.write(|w, raw| {
            w.mapping.step(raw, delta_ns);
            w.mapping.ptp(raw)
        })
    }

    /// Frame time = PTP time minus this (the announced UTC offset, or 0). Returns the old value.
    pub fn set_utc_offset(&self, utc_offset_ns: i64) -> i64 {
        self.write(|w, raw| {
            let old = w.mapping.utc_offset_ns;
            w.mapping.set_utc_offset(raw, utc_offset_ns);
            old
        })
    }
}

impl FrameClock for DisciplinedClock {
    fn now(&self) -> Stamp {
        let ns = self.load().frame((self.raw)());
        let prev = self.last_now.fetch_max(ns, Ordering::Relaxed);
        Stamp {
            ns: ns.max(prev),
            state: self.state(),
        }
    }

    fn map_realtime(&self, realtime_ns: i64) -> Stamp {
        Stamp {
            ns: self.load().frame(realtime_ns),
            state: self.state(),
        }
    }
}

/// The handle the statime port owns: statime's `Clock` over the shared [`DisciplinedClock`].
#[derive(Debug, Clone)]
pub struct PortClock(pub Arc<DisciplinedClock>);

fn to_time(ns: i64) -> statime::time::Time {
    statime::time::Time::from_nanos(ns.max(0) as u64)
}

impl statime::Clock for PortClock {
    type Error = std::convert::Infallible;

    fn now(&self) -> statime::time::Time {
        to_time(self.0.ptp_now())
    }

    fn step_clock(
        &mut self,
        offset: statime::time::Duration,
    ) -> Result<statime::time::Time, Self::Error> {
        let delta = offset
            .nanos_rounded()
            .clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        let at = self.0.step(delta);
        tracing::info!(step_ns = delta, steps = self.0.steps(), "clock stepped");
        Ok(to_time(at))
    }

    fn set_frequency(&mut self, ppm: f64) -> Result<statime::time::Time, Self::Error> {
        Ok(to_time(self.0.set_frequency(ppm)))
    }

    fn set_properties(
        &mut self,
        tp: &statime::config::TimePropertiesDS,
    ) -> Result<(), Self::Error> {
        let utc = match tp.current_utc_offset {
            Some(off) if tp.ptp_timescale => off as i64 * 1_000_000_000,
            _ => 0,
        };
        let old = self.0.set_utc_offset(utc);
        if old != utc {
            tracing::info!(
                utc_offset_s = utc / 1_000_000_000,
                ptp_timescale = tp.ptp_timescale,
                "grandmaster timescale: frame time is PTP time minus this offset"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use statime::Clock as _;
    use std::sync::atomic::AtomicI64;

    const T0: i64 = 1_700_000_000_000_000_000;

    fn fake() -> (Arc<AtomicI64>, Arc<DisciplinedClock>) {
        let t = Arc::new(AtomicI64::new(T0));
        let t2 = t.clone();
        let c = DisciplinedClock::new(
            Box::new(move || t2.load(Ordering::Relaxed)),
            -300_000_000,
            50.0,
        );
        (t, Arc::new(c))
    }

    #[test]
    fn starts_off_and_fast_and_unsynced() {
        let (t, c) = fake();
        assert_eq!(c.now().ns, T0 - 300_000_000);
        assert_eq!(c.now().state, ClockState::Unsynced);
        t.fetch_add(1_000_000_000, Ordering::Relaxed);
        assert_eq!(c.ptp_now(), T0 + 1_000_000_000 - 300_000_000 + 50_000);
    }

    #[test]
    fn statime_frequency_compensates_the_simulated_oscillator() {
        let (t, c) = fake();
        let mut pc = PortClock(c.clone());
        pc.set_frequency(-50.0).unwrap();
        let p0 = c.ptp_now();
        t.fetch_add(10_000_000_000, Ordering::Relaxed);
        // (1 + 50e-6)(1 - 50e-6) - 1 = -2.5e-9: 25 ns over 10 s
        assert!((c.ptp_now() - p0 - 10_000_000_000).abs() <= 26);
        assert!((c.correction_ppm() + 50.0).abs() < 1e-9);
    }

    #[test]
    fn steps_are_counted_and_frames_never_go_back() {
        let (t, c) = fake();
        let mut pc = PortClock(c.clone());
        pc.step_clock(statime::time::Duration::from_millis(300))
            .unwrap();
        assert_eq!(c.steps(), 1);
        let a = c.now().ns;
        pc.step_clock(statime::time::Duration::from_millis(-100))
            .unwrap();
        assert_eq!(c.steps(), 2);
        let b = c.now().ns;
        assert!(b >= a);
        t.fetch_add(200_000_000, Ordering::Relaxed);
        assert!(c.now().ns - a >= 99_000_000);
    }

    #[test]
    fn rebase_keeps_the_learned_frequency_for_the_next_filter() {
        let (t, c) = fake();
        let mut pc = PortClock(c.clone());
        pc.set_frequency(-50.0).unwrap();
        c.rebase_frequency();
        // a fresh statime filter starts by setting 0 ppm: the rate must stay corrected
        pc.set_frequency(0.0).unwrap();
        let p0 = c.ptp_now();
        t.fetch_add(10_000_000_000, Ordering::Relaxed);
        assert!((c.ptp_now() - p0 - 10_000_000_000).abs() <= 26);
        assert!((c.correction_ppm() + 50.0).abs() < 1e-9);
    }

    #[test]
    fn utc_offset_only_with_a_ptp_timescale() {
        let (_t, c) = fake();
        let mut pc = PortClock(c.clone());
        let p = c.ptp_now();
        let arbitrary = statime::config::TimePropertiesDS::new_arbitrary_time(
            false,
            false,
            statime::config::TimeSource::InternalOscillator,
        );
        pc.set_properties(&arbitrary).unwrap();
        assert_eq!(c.now().ns, p);
        let ptp = statime::config::TimePropertiesDS::new_ptp_time(
            Some(37),
            statime::config::LeapIndicator::NoLeap,
            false,
            false,
            statime::config::TimeSource::Gnss,
        );
        pc.set_properties(&ptp).unwrap();
        let later = c.raw_now() + 37_000_000_000;
        assert_eq!(c.map_realtime(later).ns, c.ptp_at(later) - 37_000_000_000);
        assert!(c.map_realtime(later).ns > p);
    }

    #[test]
    fn readers_see_consistent_mappings_while_the_writer_slews() {
        let c = Arc::new(DisciplinedClock::realtime(0, 0.0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (c, stop, reads) = (c.clone(), stop.clone(), reads.clone());
                std::thread::spawn(move || {
                    let mut last = i64::MIN;
                    while !stop.load(Ordering::Relaxed) {
                        let s = c.now().ns;
                        assert!(s >= last, "went back {last} -> {s}");
                        last = s;
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Slew back and forth until the readers (however late they were scheduled) read a lot.
        let mut i = 0u64;
        while i < 20_000 || reads.load(Ordering::Relaxed) < 20_000 {
            c.set_frequency(if i % 2 == 0 { 100.0 } else { -100.0 });
            i += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
    }
}
