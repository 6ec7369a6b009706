//! The lock state of the rig clock (unsynced, locking, locked, holdover), derived from what the PTP
//! port reports. statime has no notion of "locked"; this module decides it. Pure: time comes in as
//! an argument (seconds on any monotonic scale), transitions come out for the caller to log.
//!
//! - unsynced -> locking: the first offset sample from a master.
//! - locking -> locked: `lock_samples` consecutive samples with |offset| <= `lock_threshold_ns`.
//! - locked -> locking: `lock_samples` consecutive samples above `unlock_threshold_ns`, or a step.
//! - locked -> holdover: the master is lost (the port leaves the slave state, or no sample for
//!   `sample_timeout_s`). The clock keeps its last frequency; the estimated drift grows with time.
//! - holdover -> locking: samples again (and on to locked as above).
//! - holdover -> unsynced: `holdover_timeout_s` without a master. locking -> unsynced: master lost.

use rigd_drivers::ClockState;

/// When the clock counts as locked, and how long holdover is trusted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LockPolicy {
    pub lock_threshold_ns: i64,
    pub unlock_threshold_ns: i64,
    pub lock_samples: u32,
    pub sample_timeout_s: f64,
    pub holdover_timeout_s: f64,
    /// Assumed frequency error during holdover, for the drift estimate (ns per second).
    pub holdover_drift_ppb: f64,
}

impl Default for LockPolicy {
    fn default() -> Self {
        Self {
            lock_threshold_ns: 1_000,
            unlock_threshold_ns: 10_000,
            lock_samples: 16,
            sample_timeout_s: 5.0,
            holdover_timeout_s: 600.0,
            holdover_drift_ppb: 100.0,
        }
    }
}

/// A state change and why it happened, for the one log line each transition gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: ClockState,
    pub to: ClockState,
    pub reason: &'static str,
}

#[derive(Debug, Clone)]
pub struct LockTracker {
    policy: LockPolicy,
    state: ClockState,
    good: u32,
    bad: u32,
    last_sample_s: Option<f64>,
    last_offset_ns: Option<i64>,
    locked_since_s: Option<f64>,
    first_locked_s: Option<f64>,
    holdover_since_s: Option<f64>,
    /// Offset at the moment holdover began (the drift estimate starts from it).
    holdover_start_offset_ns: i64,
}

impl LockTracker {
    pub fn new(policy: LockPolicy) -> Self {
        Self {
            policy,
            state: ClockState::Unsynced,
            good: 0,
            bad: 0,
            last_sample_s: None,
            last_offset_ns: None,
            locked_since_s: None,
            first_locked_s: None,
            holdover_since_s: None,
            holdover_start_offset_ns: 0,
        }
    }

    pub fn state(&self) -> ClockState {
        self.state
    }

    pub fn policy(&self) -> &LockPolicy {
        &self.policy
    }

    fn go(&mut self, to: ClockState, now_s: f64, reason: &'static str) -> Option<Transition> {
        let from = self.state;
        if from == to {
            return None;
        }
        self.state = to;
        self.good = 0;
        self.bad = 0;
        match to {
            ClockState::Locked => {
                self.locked_since_s = Some(now_s);
                self.first_locked_s.get_or_insert(now_s);
                self.holdover_since_s = None;
            }
            ClockState::Holdover => {
                self.holdover_since_s = Some(now_s);
                self.holdover_start_offset_ns = self.last_offset_ns.unwrap_or(0).abs();
                self.locked_since_s = None;
            }
            ClockState::Locking | ClockState::Unsynced => {
                self.locked_since_s = None;
                self.holdover_since_s = None;
            }
        }
        Some(Transition { from, to, reason })
    }

    /// A new offset estimate from the PTP filter.
    pub fn on_sample(&mut self, now_s: f64, offset_ns: i64) -> Option<Transition> {
        self.last_sample_s = Some(now_s);
        self.last_offset_ns = Some(offset_ns);
        let within = offset_ns.abs() <= self.policy.lock_threshold_ns;
        let outside = offset_ns.abs() > self.policy.unlock_threshold_ns;
        match self.state {
            ClockState::Unsynced | ClockState::Holdover => {
                let t = self.go(ClockState::Locking, now_s, "master offset samples arriving");
                if within {
                    self.good = 1;
                }
                t
            }
            ClockState::Locking => {
                self.good = if within { self.good + 1 } else { 0 };
                if self.good >= self.policy.lock_samples {
                    self.go(
                        ClockState::Locked,
                        now_s,
                        "offset within the lock threshold",
                    )
                } else {
                    None
                }
            }
            ClockState::Locked => {
                self.bad = if outside { self.bad + 1 } else { 0 };
                if self.bad >= self.policy.lock_samples {
                    self.go(
                        ClockState::Locking,
                        now_s,
                        "offset beyond the unlock threshold",
                    )
                } else {
                    None
                }
            }
        }
    }

    /// The clock was stepped: whatever lock there was is gone.
    pub fn on_step(&mut self, now_s: f64) -> Option<Transition> {
        match self.state {
            ClockState::Locked | ClockState::Holdover => {
                self.go(ClockState::Locking, now_s, "clock stepped")
            }
            ClockState::Locking => {
                self.good = 0;
                None
            }
            ClockState::Unsynced => None,
        }
    }

    /// The port no longer has a master (announce timeout, port left the slave state).
    pub fn on_master_lost(&mut self, now_s: f64) -> Option<Transition> {
        match self.state {
            ClockState::Locked => self.go(ClockState::Holdover, now_s, "master lost"),
            ClockState::Locking => self.go(ClockState::Unsynced, now_s, "master lost before lock"),
            _ => None,
        }
    }

    /// Periodic check for time-based transitions.
    pub fn tick(&mut self, now_s: f64) -> Option<Transition> {
        match self.state {
            ClockState::Locked => match self.last_sample_s {
                Some(t) if now_s - t > self.policy.sample_timeout_s => {
                    self.go(ClockState::Holdover, now_s, "no offset samples")
                }
                _ => None,
            },
            ClockState::Holdover => match self.holdover_since_s {
                Some(t) if now_s - t > self.policy.holdover_timeout_s => {
                    self.go(ClockState::Unsynced, now_s, "holdover timed out")
                }
                _ => None,
            },
            ClockState::Locking => match self.last_sample_s {
                Some(t) if now_s - t > self.policy.sample_timeout_s => {
                    self.go(ClockState::Unsynced, now_s, "no offset samples")
                }
                _ => None,
            },
            ClockState::Unsynced => None,
        }
    }

    pub fn last_offset_ns(&self) -> Option<i64> {
        self.last_offset_ns
    }

    /// Seconds in the locked state, when locked.
    pub fn locked_for_s(&self, now_s: f64) -> Option<f64> {
        self.locked_since_s.map(|t| now_s - t)
    }

    /// When the clock first locked (same scale as the inputs).
    pub fn first_locked_s(&self) -> Option<f64> {
        self.first_locked_s
    }

    /// Seconds in holdover, when in holdover.
    pub fn holdover_for_s(&self, now_s: f64) -> Option<f64> {
        self.holdover_since_s.map(|t| now_s - t)
    }

    /// In holdover: the offset at its start plus the assumed frequency error times its length.
    pub fn estimated_drift_ns(&self, now_s: f64) -> Option<i64> {
        self.holdover_for_s(now_s).map(|s| {
            self.holdover_start_offset_ns + (s * self.policy.holdover_drift_ppb).round() as i64
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClockState::*;

    fn tracker() -> LockTracker {
        LockTracker::new(LockPolicy {
            lock_samples: 3,
            ..Default::default()
        })
    }

    fn feed(t: &mut LockTracker, start_s: f64, offsets: &[i64]) -> Vec<Transition> {
        offsets
            .iter()
            .enumerate()
            .filter_map(|(i, o)| t.on_sample(start_s + i as f64 * 0.125, *o))
            .collect()
    }

    #[test]
    fn locks_after_consecutive_good_samples() {
        let mut t = tracker();
        assert_eq!(t.state(), Unsynced);
        let tr = feed(&mut t, 0.0, &[300_000_000, 5_000, 800, 900]);
        assert_eq!(tr.len(), 1);
        assert_eq!(t.state(), Locking);
        let tr = feed(&mut t, 1.0, &[-700]);
        assert_eq!(tr[0].to, Locked);
        assert_eq!(t.first_locked_s(), Some(1.0));
    }

    #[test]
    fn a_bad_sample_restarts_the_count() {
        let mut t = tracker();
        feed(&mut t, 0.0, &[10, 10, 50_000, 10, 10]);
        assert_eq!(t.state(), Locking);
        feed(&mut t, 1.0, &[10]);
        assert_eq!(t.state(), Locked);
    }

    #[test]
    fn single_outliers_do_not_unlock() {
        let mut t = tracker();
        feed(&mut t, 0.0, &[0, 0, 0]);
        assert_eq!(t.state(), Locked);
        feed(&mut t, 1.0, &[50_000, 0, 60_000, 5_000, 70_000, 0]);
        assert_eq!(t.state(), Locked);
        let tr = feed(&mut t, 2.0, &[50_000, 50_000, 50_000]);
        assert_eq!(tr[0].to, Locking);
    }

    #[test]
    fn master_loss_means_holdover_with_growing_drift_then_relock() {
        let mut t = tracker();
        feed(&mut t, 0.0, &[200, -300, 100]);
        let tr = t.on_master_lost(10.0).unwrap();
        assert_eq!((tr.from, tr.to), (Locked, Holdover));
        assert_eq!(t.estimated_drift_ns(10.0), Some(100));
        assert_eq!(t.estimated_drift_ns(20.0), Some(100 + 1_000));
        assert_eq!(t.on_sample(30.0, 2_000).unwrap().to, Locking);
        feed(&mut t, 31.0, &[10, 10, 10]);
        assert_eq!(t.state(), Locked);
        assert_eq!(t.estimated_drift_ns(32.0), None);
    }

    #[test]
    fn silence_is_master_loss_and_holdover_ends() {
        let mut t = tracker();
        feed(&mut t, 0.0, &[0, 0, 0]);
        assert_eq!(t.tick(4.0), None);
        assert_eq!(t.tick(6.0).unwrap().to, Holdover);
        assert_eq!(t.tick(500.0), None);
        assert_eq!(t.tick(607.0).unwrap().to, Unsynced);
    }

    #[test]
    fn losing_the_master_before_lock_is_unsynced() {
        let mut t = tracker();
        feed(&mut t, 0.0, &[5_000_000]);
        assert_eq!(t.on_master_lost(1.0).unwrap().to, Unsynced);
    }

    #[test]
    fn a_step_drops_the_lock() {
        let mut t = tracker();
        feed(&mut t, 0.0, &[0, 0, 0]);
        assert_eq!(t.on_step(1.0).unwrap().to, Locking);
        assert_eq!(t.on_step(1.1), None);
    }

    #[test]
    fn each_transition_is_reported_once() {
        let mut t = tracker();
        let mut all = feed(&mut t, 0.0, &[0; 20]);
        all.extend(t.on_master_lost(5.0));
        all.extend(t.on_master_lost(5.5));
        all.extend(t.tick(6.0));
        let states: Vec<_> = all.iter().map(|t| t.to).collect();
        assert_eq!(states, vec![Locking, Locked, Holdover]);
    }
}
