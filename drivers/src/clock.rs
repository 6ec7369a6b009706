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

/// A kernel clock that rigd steers itself (`[clock].target = "system"`: CLOCK_REALTIME), through
/// `clock_adjtime(2)`, the interface linuxptp's clockadj uses: a frequency offset and steps.
/// Needs CAP_SYS_TIME; an error says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelClock {
    id: libc::clockid_t,
}

/// The kernel's frequency limit (MAXFREQ): 500 ppm.
const MAX_FREQ_PPM: f64 = 500.0;
/// `timex.freq` is in ppm with a 16-bit fraction.
const FREQ_SCALE: f64 = 65536.0;

impl KernelClock {
    pub fn realtime() -> Self {
        Self {
            id: libc::CLOCK_REALTIME,
        }
    }

    pub fn now_ns(&self) -> i64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::clock_gettime(self.id, &mut ts) };
        if rc != 0 {
            return realtime_ns();
        }
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    }

    fn adjtime(&self, tx: &mut libc::timex) -> std::io::Result<()> {
        // SAFETY: `tx` is a valid, writable timex for the call's duration; the kernel reads the
        // fields `modes` selects and writes the clock's current values back.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::clock_adjtime(self.id, tx) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) => std::io::Error::new(
                    e.kind(),
                    format!("{e}: steering the system clock needs CAP_SYS_TIME"),
                ),
                _ => e,
            });
        }
        Ok(())
    }

    fn timex() -> libc::timex {
        // SAFETY: timex is plain old data (integers); all-zero is a valid value (modes = 0 reads).
        #[allow(unsafe_code)]
        unsafe {
            std::mem::zeroed()
        }
    }

    /// The frequency offset the kernel applies now, ppm (positive: the clock runs fast).
    pub fn frequency_ppm(&self) -> std::io::Result<f64> {
        let mut tx = Self::timex();
        self.adjtime(&mut tx)?;
        Ok(tx.freq as f64 / FREQ_SCALE)
    }

    /// Sets the frequency offset (clamped to the kernel's +-500 ppm).
    pub fn set_frequency_ppm(&self, ppm: f64) -> std::io::Result<()> {
        let mut tx = Self::timex();
        tx.modes = libc::ADJ_FREQUENCY;
        tx.freq = scaled_ppm(ppm);
        self.adjtime(&mut tx)
    }

    /// Moves the clock by `delta_ns` at once.
    pub fn step_ns(&self, delta_ns: i64) -> std::io::Result<()> {
        let mut tx = Self::timex();
        tx.modes = libc::ADJ_SETOFFSET | libc::ADJ_NANO;
        let (sec, nsec) = split_ns(delta_ns);
        tx.time.tv_sec = sec;
        // With ADJ_NANO the microseconds field holds nanoseconds, in [0, 1e9).
        tx.time.tv_usec = nsec;
        self.adjtime(&mut tx)
    }
}

fn scaled_ppm(ppm: f64) -> libc::c_long {
    (ppm.clamp(-MAX_FREQ_PPM, MAX_FREQ_PPM) * FREQ_SCALE).round() as libc::c_long
}

/// Seconds and a non-negative nanosecond part, as `ADJ_SETOFFSET` wants a negative offset.
fn split_ns(ns: i64) -> (libc::time_t, libc::suseconds_t) {
    (
        ns.div_euclid(1_000_000_000) as libc::time_t,
        ns.rem_euclid(1_000_000_000) as libc::suseconds_t,
    )
}

#[cfg(test)]
mod kernel_tests {
    use super::*;

    #[test]
    fn a_step_back_is_whole_seconds_down_and_nanoseconds_up() {
        assert_eq!(split_ns(1_500_000_000), (1, 500_000_000));
        assert_eq!(split_ns(-1), (-1, 999_999_999));
        assert_eq!(split_ns(-300_000_000), (-1, 700_000_000));
        assert_eq!(split_ns(0), (0, 0));
    }

    #[test]
    fn frequency_is_scaled_ppm_within_the_kernels_limit() {
        assert_eq!(scaled_ppm(1.0), 65536);
        assert_eq!(scaled_ppm(-50.0), -3_276_800);
        assert_eq!(scaled_ppm(9000.0), 32_768_000);
    }

    #[test]
    fn the_system_clock_reads_like_the_standard_library_and_its_frequency_is_readable() {
        let k = KernelClock::realtime();
        assert!((k.now_ns() - realtime_ns()).abs() < 1_000_000_000);
        // modes = 0 only reads: allowed without CAP_SYS_TIME, changes nothing.
        assert!(k.frequency_ppm().unwrap().abs() <= MAX_FREQ_PPM);
    }
}
