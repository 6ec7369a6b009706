//! The rig clock under PTP: a software clock over CLOCK_REALTIME that a slave-only `statime` port
//! disciplines, and that stamps every captured frame.
//!
//! - [`mapping`]: the clock's arithmetic (offset, rate, steps, the floor that keeps frame time
//!   monotonic). Pure.
//! - [`lock`]: when the clock is unsynced, locking, locked or in holdover. Pure.
//! - [`servo`]: PTP measurements to steps and frequency changes (a PI servo with a frequency
//!   estimate before the loop closes). Pure but for statime's `Filter` glue.
//! - [`disciplined`]: the shared clock: lock-free reads for capture, statime's `Clock` for the port.
//! - `port`: the PTP port task (sockets, timers, BMCA) on its own thread.
//!
//! With `target = "virtual"` (the default) the host's own clock is never adjusted; with
//! `target = "system"` the port steers CLOCK_REALTIME itself (clock_adjtime, CAP_SYS_TIME).

pub mod disciplined;
pub mod lock;
pub mod mapping;
mod port;
pub mod servo;

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

pub use disciplined::DisciplinedClock;
use lock::{LockPolicy, LockTracker};

use crate::config::{ClockConfig, ClockTarget};

/// What the status API shows about PTP, written by the port task.
#[derive(Debug, Clone, Default)]
pub struct ClockReport {
    /// This port's clock identity.
    pub identity: Option<String>,
    /// statime's port state: listening, slave, faulty, ...
    pub port_state: String,
    /// Grandmaster identity (ptp4l's notation).
    pub master: Option<String>,
    /// How often BMCA moved to another grandmaster.
    pub master_changes: u64,
    /// The filter's offset from the master, at the last sample.
    pub offset_ns: Option<i64>,
    /// Mean path delay to the master.
    pub path_delay_ns: Option<i64>,
    /// Frequency correction applied, ppm.
    pub frequency_ppm: Option<f64>,
    pub samples: u64,
    /// Seconds from the port starting to the first lock.
    pub time_to_lock_s: Option<f64>,
    pub locked_for_s: Option<f64>,
    pub holdover_s: Option<f64>,
    pub estimated_drift_ns: Option<i64>,
    /// CPU time used by the PTP thread.
    pub task_cpu_ns: u64,
    /// Last failure of the port (socket, interface), cleared when it runs again.
    pub error: Option<String>,
}

impl ClockReport {
    fn fill_times(&mut self, tracker: &LockTracker, now_s: f64) {
        self.time_to_lock_s = tracker.first_locked_s();
        self.locked_for_s = tracker.locked_for_s(now_s);
        self.holdover_s = tracker.holdover_for_s(now_s);
        self.estimated_drift_ns = tracker.estimated_drift_ns(now_s);
    }
}

/// The PTP-disciplined clock and what the port reports about it.
#[derive(Debug)]
pub struct Ptp {
    pub clock: Arc<DisciplinedClock>,
    report: Mutex<ClockReport>,
}

impl Ptp {
    pub fn new(clock: Arc<DisciplinedClock>) -> Self {
        Self {
            clock,
            report: Mutex::new(ClockReport {
                port_state: "initializing".into(),
                ..Default::default()
            }),
        }
    }

    /// A copy of the current report (the status API's view).
    pub fn report(&self) -> ClockReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn update(&self, f: impl FnOnce(&mut ClockReport)) {
        f(&mut self.report.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// An 8-byte clock identity the way ptp4l and pmc print it: `001122.fffe.334455`.
pub fn format_identity(id: &[u8; 8]) -> String {
    format!(
        "{:02x}{:02x}{:02x}.{:02x}{:02x}.{:02x}{:02x}{:02x}",
        id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]
    )
}

fn lock_policy(cfg: &ClockConfig) -> LockPolicy {
    let announce_s = 2f64.powi(cfg.log_announce_interval as i32);
    LockPolicy {
        lock_threshold_ns: cfg.lock_threshold_ns as i64,
        unlock_threshold_ns: cfg.unlock_threshold_ns as i64,
        lock_samples: cfg.lock_samples,
        // Silence longer than the announce timeout means the master is gone, whatever the port says.
        sample_timeout_s: (announce_s * cfg.announce_receipt_timeout as f64).max(2.0)
            + 2f64.powi(cfg.log_sync_interval.max(cfg.log_min_delay_req_interval) as i32),
        holdover_timeout_s: cfg.holdover_timeout_s as f64,
        holdover_drift_ppb: cfg.holdover_drift_ppb,
    }
}

/// Starts the PTP port on its own thread for `[clock].interface`; it stops when `shutdown` turns
/// true. Returns the clock (for capture and status) and the thread to join.
pub fn start(
    cfg: &ClockConfig,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<(Arc<Ptp>, std::thread::JoinHandle<()>)> {
    let clock = Arc::new(match cfg.target {
        ClockTarget::System => {
            let c = DisciplinedClock::kernel(rigd_drivers::KernelClock::realtime())?;
            tracing::warn!(
                "clock: target = system: rigd steps and slews this host's CLOCK_REALTIME \
                 (stop any other time daemon: chrony, ntpd, systemd-timesyncd, phc2sys)"
            );
            c
        }
        ClockTarget::Virtual | ClockTarget::Phc => {
            DisciplinedClock::realtime(cfg.simulate_offset_ns, cfg.simulate_ppm)
        }
    });
    if cfg.simulate_offset_ns != 0 || cfg.simulate_ppm != 0.0 {
        tracing::warn!(
            offset_ns = cfg.simulate_offset_ns,
            ppm = cfg.simulate_ppm,
            "clock: simulated offset/oscillator error in effect (testing knobs)"
        );
    }
    let ptp = Arc::new(Ptp::new(clock));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (cfg, p) = (cfg.clone(), ptp.clone());
    let handle = std::thread::Builder::new()
        .name("rigd-ptp".into())
        .spawn(move || rt.block_on(port::supervise(cfg, p, shutdown)))?;
    Ok((ptp, handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_prints_like_ptp4l() {
        assert_eq!(
            format_identity(&[0x10, 0, 0, 0xff, 0xfe, 0x0b, 0x0b, 0x0a]),
            "100000.fffe.0b0b0a"
        );
    }

    #[test]
    fn sample_timeout_follows_the_announce_timeout() {
        let cfg = ClockConfig {
            log_announce_interval: 0,
            log_sync_interval: -3,
            log_min_delay_req_interval: -3,
            ..Default::default()
        };
        let p = lock_policy(&cfg);
        assert!((p.sample_timeout_s - 3.125).abs() < 1e-9, "{p:?}");
    }
}
