//! `[clock]`: the PTP port and the servo, and what makes sense of them.

use super::*;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    #[default]
    Udp4,
    L2,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockTarget {
    #[default]
    Virtual,
    System,
    Phc,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DelayMechanism {
    /// End-to-end: delay requests to the master (works through switches and bridges).
    #[default]
    E2e,
    /// Peer-to-peer: peer delay requests to the link neighbour (needs P2P-capable switches).
    P2p,
}

/// `[clock]`: the PTP slave port and the clock it disciplines. Intervals are log2 seconds, as in
/// PTP (`-3` = 8 per second); they must match the grandmaster's.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClockConfig {
    /// Network interface for PTP; absent: no PTP, the clock stays `unsynced`.
    pub interface: Option<String>,
    #[serde(default)]
    pub transport: Transport,
    #[serde(default)]
    pub domain: u8,
    #[serde(default)]
    pub target: ClockTarget,
    #[serde(default)]
    pub delay_mechanism: DelayMechanism,
    /// The master's sync interval (log2 s).
    #[serde(default)]
    pub log_sync_interval: i8,
    /// The master's announce interval (log2 s).
    #[serde(default = "default_log_announce_interval")]
    pub log_announce_interval: i8,
    /// How often this port sends delay requests (log2 s).
    #[serde(default)]
    pub log_min_delay_req_interval: i8,
    /// Announce intervals without an announce before the master counts as lost.
    #[serde(default = "default_announce_receipt_timeout")]
    pub announce_receipt_timeout: u8,
    /// Offsets larger than this are corrected by a step, smaller ones by slewing.
    #[serde(default = "default_step_threshold_ns")]
    pub step_threshold_ns: u64,
    /// |offset| at or below this for `lock-samples` samples in a row: locked.
    #[serde(default = "default_lock_threshold_ns")]
    pub lock_threshold_ns: u64,
    /// |offset| above this for `lock-samples` samples in a row: no longer locked.
    #[serde(default = "default_unlock_threshold_ns")]
    pub unlock_threshold_ns: u64,
    #[serde(default = "default_lock_samples")]
    pub lock_samples: u32,
    /// Holdover (master lost, last frequency kept) lasts this long, then the clock is unsynced.
    #[serde(default = "default_holdover_timeout_s")]
    pub holdover_timeout_s: u64,
    /// Frequency error assumed during holdover, for the reported drift estimate.
    #[serde(default = "default_holdover_drift_ppb")]
    pub holdover_drift_ppb: f64,
    /// Testing knob: the virtual clock starts this far off CLOCK_REALTIME.
    #[serde(default)]
    pub simulate_offset_ns: i64,
    /// Testing knob: the virtual clock's oscillator runs this many ppm fast.
    #[serde(default)]
    pub simulate_ppm: f64,
}

fn default_log_announce_interval() -> i8 {
    1
}
fn default_announce_receipt_timeout() -> u8 {
    3
}
fn default_step_threshold_ns() -> u64 {
    1_000_000
}
fn default_lock_threshold_ns() -> u64 {
    1_000
}
fn default_unlock_threshold_ns() -> u64 {
    10_000
}
fn default_lock_samples() -> u32 {
    16
}
fn default_holdover_timeout_s() -> u64 {
    600
}
fn default_holdover_drift_ppb() -> f64 {
    100.0
}

impl Default for ClockConfig {
    fn default() -> Self {
        Self {
            interface: None,
            transport: Transport::Udp4,
            domain: 0,
            target: ClockTarget::Virtual,
            delay_mechanism: DelayMechanism::E2e,
            log_sync_interval: 0,
            log_announce_interval: default_log_announce_interval(),
            log_min_delay_req_interval: 0,
            announce_receipt_timeout: default_announce_receipt_timeout(),
            step_threshold_ns: default_step_threshold_ns(),
            lock_threshold_ns: default_lock_threshold_ns(),
            unlock_threshold_ns: default_unlock_threshold_ns(),
            lock_samples: default_lock_samples(),
            holdover_timeout_s: default_holdover_timeout_s(),
            holdover_drift_ppb: default_holdover_drift_ppb(),
            simulate_offset_ns: 0,
            simulate_ppm: 0.0,
        }
    }
}

impl ClockConfig {
    pub(super) fn problems(&self, p: &mut Vec<String>) {
        if let Some(i) = &self.interface {
            no_nul(p, "clock.interface", i);
        }
        if self.interface.as_deref() == Some("") {
            p.push("clock.interface: must not be empty (leave it out for no PTP)".to_string());
        }
        if self.interface.as_ref().is_some_and(|i| i.len() > 15) {
            p.push(
                "clock.interface: longer than 15 characters, not a Linux interface name"
                    .to_string(),
            );
        }
        if self.target == ClockTarget::Phc {
            p.push(
                "clock.target: `phc` is not implemented (it needs hardware timestamping); use `virtual` or `system`"
                    .to_string(),
            );
        }
        if self.target == ClockTarget::System
            && (self.simulate_offset_ns != 0 || self.simulate_ppm != 0.0)
        {
            p.push(
                "clock.simulate-offset-ns / simulate-ppm: testing knobs of the virtual clock, not allowed with target = \"system\""
                    .to_string(),
            );
        }
        for (key, v) in [
            ("log-sync-interval", self.log_sync_interval),
            ("log-announce-interval", self.log_announce_interval),
            (
                "log-min-delay-req-interval",
                self.log_min_delay_req_interval,
            ),
        ] {
            if !(-7..=4).contains(&v) {
                p.push(format!(
                    "clock.{key}: {v} must be between -7 and 4 (log2 seconds)"
                ));
            }
        }
        if self.announce_receipt_timeout < 2 {
            p.push("clock.announce-receipt-timeout: must be at least 2".to_string());
        }
        if self.step_threshold_ns < 1_000 {
            p.push("clock.step-threshold-ns: must be at least 1000".to_string());
        }
        if self.lock_threshold_ns == 0 {
            p.push("clock.lock-threshold-ns: must be at least 1".to_string());
        }
        if self.unlock_threshold_ns < self.lock_threshold_ns {
            p.push("clock.unlock-threshold-ns: must not be below lock-threshold-ns".to_string());
        }
        if !(1..=1000).contains(&self.lock_samples) {
            p.push("clock.lock-samples: must be between 1 and 1000".to_string());
        }
        if !(self.holdover_drift_ppb.is_finite() && self.holdover_drift_ppb >= 0.0) {
            p.push("clock.holdover-drift-ppb: must be a number >= 0".to_string());
        }
        if !(self.simulate_ppm.is_finite() && self.simulate_ppm.abs() <= 200.0) {
            p.push("clock.simulate-ppm: must be between -200 and 200".to_string());
        }
        if self.simulate_offset_ns.unsigned_abs() > 3_600_000_000_000 {
            p.push("clock.simulate-offset-ns: must be within one hour".to_string());
        }
    }
}
