//! The clock that stamps frames. The PTP-disciplined clock of the daemon implements [`FrameClock`];
//! [`SystemClock`] is the stand-in while no PTP is configured.

use serde::Serialize;
use std::time::{SystemTime, UNIX_EPOCH};

/// Synchronisation state of the rig clock, recorded in every frame (`clock` property).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClockState {
    Unsynced,
    Locking,
    Locked,
    Holdover,
}

impl ClockState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClockState::Unsynced => "unsynced",
            ClockState::Locking => "locking",
            ClockState::Locked => "locked",
            ClockState::Holdover => "holdover",
        }
    }

    pub fn as_u8(self) -> u8 {
        match self {
            ClockState::Unsynced => 0,
            ClockState::Locking => 1,
            ClockState::Locked => 2,
            ClockState::Holdover => 3,
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => ClockState::Unsynced,
            1 => ClockState::Locking,
            2 => ClockState::Locked,
            3 => ClockState::Holdover,
            _ => return None,
        })
    }
}

/// A time on the rig clock with the clock's state at that moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub ns: i64,
    pub state: ClockState,
}

/// The rig clock as capture sees it. Reads must be cheap and never block (called per frame).
pub trait FrameClock: Send + Sync + 'static {
    /// Now on the rig clock.
    fn now(&self) -> Stamp;
    /// Maps a kernel CLOCK_REALTIME timestamp (ns) to the rig clock.
    fn map_realtime(&self, realtime_ns: i64) -> Stamp;
    /// Maps a kernel CLOCK_MONOTONIC timestamp (ns), as V4L2 and ALSA give, to the rig clock.
    fn map_monotonic(&self, monotonic_ns: i64) -> Stamp {
        let offset = realtime_ns() - monotonic_ns_now();
        self.map_realtime(monotonic_ns + offset)
    }
}

/// CLOCK_REALTIME, never disciplined: state is always `unsynced`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl FrameClock for SystemClock {
    fn now(&self) -> Stamp {
        self.map_realtime(realtime_ns())
    }

    fn map_realtime(&self, realtime_ns: i64) -> Stamp {
        Stamp {
            ns: realtime_ns,
            state: ClockState::Unsynced,
        }
    }
}

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns_now() -> i64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}
