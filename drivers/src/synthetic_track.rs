//! What the synthetic sources do over time when asked to vary (issue 51, campaigns): the serial
//! GPS's closed loop (config `loop-s`, `loop-radius-m`), which enters and leaves any geofence that
//! covers part of it once a lap, and the audio's tone bursts (config `burst-every-s`, `burst-s`),
//! loud intervals at known times. Both follow the rig clock's absolute time, so a consumer that
//! reads the frames can say where and when without asking the rig. Pure.

use std::f64::consts::PI;

/// The loop's centre: where the straight-line track starts (48°07.038' N, 11°31.000' E).
pub const LOOP_CENTRE: (f64, f64) = (48.0 + 7.038 / 60.0, 11.0 + 31.0 / 60.0);
/// Metres per degree of latitude (and of longitude at the equator), spherical Earth.
const M_PER_DEG: f64 = 111_320.0;
/// Metres per second in a knot.
const KNOT: f64 = 1852.0 / 3600.0;

/// A circle around [`LOOP_CENTRE`], counter-clockwise, one lap every `period_s`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Loop {
    pub period_s: f64,
    pub radius_m: f64,
}

/// Where the loop is at a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fix {
    /// Degrees, north and east positive.
    pub lat: f64,
    pub lon: f64,
    /// Ground speed, m/s, and course over ground, degrees from north.
    pub speed_mps: f64,
    pub course_deg: f64,
}

impl Loop {
    /// The position at rig time `ns`: angle `2π (ns mod period) / period` from east.
    pub fn at(&self, ns: i64) -> Fix {
        let period = (self.period_s * 1e9) as i64;
        let theta = 2.0 * PI * ns.rem_euclid(period.max(1)) as f64 / period.max(1) as f64;
        let (c_lat, c_lon) = LOOP_CENTRE;
        let lat = c_lat + self.radius_m * theta.sin() / M_PER_DEG;
        let lon = c_lon + self.radius_m * theta.cos() / (M_PER_DEG * c_lat.to_radians().cos());
        // Counter-clockwise: heading is the angle plus a quarter turn, measured from north.
        let course_deg = (90.0 - (theta.to_degrees() + 90.0)).rem_euclid(360.0);
        Fix {
            lat,
            lon,
            speed_mps: 2.0 * PI * self.radius_m / self.period_s,
            course_deg,
        }
    }

    /// The `$GPRMC` body (between `$` and `*`) of the loop at `ns`, time and date `hhmmss.ss` and
    /// `ddmmyy` as given, position to 1e-4 minute (about 0.2 m).
    pub fn rmc_body(&self, ns: i64, time: &str, date: &str) -> String {
        let f = self.at(ns);
        let (lat_deg, lon_deg) = (f.lat.trunc(), f.lon.trunc());
        format!(
            "GPRMC,{time},A,{:02}{:07.4},N,{:03}{:07.4},E,{:05.1},{:05.1},{date},003.1,W",
            lat_deg as u32,
            (f.lat - lat_deg) * 60.0,
            lon_deg as u32,
            (f.lon - lon_deg) * 60.0,
            f.speed_mps / KNOT,
            f.course_deg,
        )
    }
}

/// Tone bursts: for `length_s` of every `every_s` (from rig time 0), the tone at [`LOUD`] times its
/// usual amplitude; in between at [`QUIET`] times it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    pub every_s: f64,
    pub length_s: f64,
}

/// Gain in a burst: the synthetic tone's 8192 peak becomes 31,948 (-3.2 dBFS RMS).
pub const LOUD: f64 = 3.9;
/// Gain between bursts: 1,024 peak (-33.1 dBFS RMS).
pub const QUIET: f64 = 0.125;

impl Burst {
    /// The gain of absolute sample `k` at `rate` samples a second.
    pub fn gain(&self, k: i64, rate: u32) -> f64 {
        let every = (self.every_s * f64::from(rate)).round().max(1.0) as i64;
        let length = (self.length_s * f64::from(rate)).round() as i64;
        if k.rem_euclid(every) < length {
            LOUD
        } else {
            QUIET
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_goes_round_its_centre_at_its_radius_once_a_period() {
        let l = Loop {
            period_s: 20.0,
            radius_m: 100.0,
        };
        let (c_lat, c_lon) = LOOP_CENTRE;
        let east = l.at(0);
        assert!((east.lat - c_lat).abs() < 1e-9);
        assert!(((east.lon - c_lon) * M_PER_DEG * c_lat.to_radians().cos() - 100.0).abs() < 1e-6);
        let north = l.at(5_000_000_000);
        assert!(((north.lat - c_lat) * M_PER_DEG - 100.0).abs() < 1e-6);
        assert_eq!(l.at(20_000_000_000), east, "a lap later, the same place");
        assert!((east.speed_mps - 2.0 * PI * 5.0).abs() < 1e-9);
        assert!(
            (east.course_deg - 0.0).abs() < 1e-9,
            "heading north at east"
        );
        let body = l.rmc_body(0, "000000.00", "010170");
        assert!(
            body.starts_with("GPRMC,000000.00,A,4807.0380,N,01131."),
            "{body}"
        );
    }

    #[test]
    fn bursts_are_loud_for_their_length_every_period() {
        let b = Burst {
            every_s: 10.0,
            length_s: 2.0,
        };
        assert_eq!(b.gain(0, 48_000), LOUD);
        assert_eq!(b.gain(95_999, 48_000), LOUD);
        assert_eq!(b.gain(96_000, 48_000), QUIET);
        assert_eq!(b.gain(480_000, 48_000), LOUD);
        const { assert!(8192.0 * LOUD < 32767.0) };
    }
}
