//! NMEA 0183 position sentences (GGA, RMC) and the fixes they make: what the MCAP export puts on a
//! serial source's `/{source}/fix` channel. Pure: no I/O, no clock; times are passed in.
//!
//! A record is a sentence when it starts with `$`; its checksum (`*hh`, the XOR of the bytes
//! between `$` and `*`) must match when present. Of the sentence types only GGA (position,
//! altitude, fix quality, HDOP) and RMC (position, validity) are read, with any talker (`GP`, `GN`,
//! `GL`, `GA`, `BD`, ...); every other type is [`Sentence::Other`]. Latitude and longitude are
//! `ddmm.mmmm` / `dddmm.mmmm`: the two digits before the decimal point and what follows are
//! minutes, the digits before them degrees.
//!
//! A receiver usually sends a GGA and an RMC for each fix, with the same UTC time of fix. The
//! [`FixBuilder`] merges the two of one epoch into one [`Fix`]; a source that sends only one of the
//! kinds gets a fix per sentence.

/// Why a record that looks like NMEA (starts with `$`) does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NmeaError {
    #[error("not valid UTF-8")]
    NotText,
    #[error("checksum {found:?} does not match the sentence ({computed:02X})")]
    Checksum { found: String, computed: u8 },
    #[error("no sentence type (address field {0:?})")]
    Address(String),
    #[error("{kind}: field {field} ({name}) is {value:?}")]
    Field {
        kind: &'static str,
        field: usize,
        name: &'static str,
        value: String,
    },
}

/// One parsed sentence.
#[derive(Debug, Clone, PartialEq)]
pub enum Sentence {
    Gga(Gga),
    Rmc(Rmc),
    /// A well-formed sentence of another type (its type, e.g. `GSV`).
    Other(String),
}

/// Global positioning system fix data.
#[derive(Debug, Clone, PartialEq)]
pub struct Gga {
    /// UTC time of fix, milliseconds into the day (`None`: the field is empty).
    pub time_ms: Option<u32>,
    /// Degrees, north and east positive (`None`: the fields are empty).
    pub position: Option<(f64, f64)>,
    /// 0 no fix, 1 GPS, 2 DGPS, 4 RTK fixed, 5 RTK float, 6 dead reckoning, ...
    pub quality: u8,
    pub hdop: Option<f64>,
    /// Metres above mean sea level.
    pub altitude_msl: Option<f64>,
    /// Geoid separation: the WGS 84 ellipsoid height is `altitude_msl + geoid_separation`.
    pub geoid_separation: Option<f64>,
}

/// Recommended minimum specific GNSS data.
#[derive(Debug, Clone, PartialEq)]
pub struct Rmc {
    pub time_ms: Option<u32>,
    /// Status `A` (the position is valid) rather than `V`.
    pub valid: bool,
    pub position: Option<(f64, f64)>,
}

/// Parses one record (trailing CR/LF allowed). `Ok(None)`: not a sentence (no leading `$`).
pub fn parse(record: &[u8]) -> Result<Option<Sentence>, NmeaError> {
    if record.first() != Some(&b'$') {
        return Ok(None);
    }
    let text = std::str::from_utf8(record).map_err(|_| NmeaError::NotText)?;
    let body = text.trim_end_matches(['\r', '\n'])[1..].to_string();
    let body = match body.rsplit_once('*') {
        Some((body, sum)) => {
            let computed = body.bytes().fold(0u8, |a, b| a ^ b);
            if u8::from_str_radix(sum, 16).ok() != Some(computed) || sum.len() != 2 {
                return Err(NmeaError::Checksum {
                    found: sum.to_string(),
                    computed,
                });
            }
            body.to_string()
        }
        None => body,
    };
    let fields: Vec<&str> = body.split(',').collect();
    let address = fields[0];
    // `GPGGA`: a two-letter talker and the type; proprietary `P...` sentences have no talker.
    if address.len() < 3 || !address.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(NmeaError::Address(address.to_string()));
    }
    let kind = &address[address.len() - 3..];
    let sentence = match kind {
        "GGA" if !address.starts_with('P') => Sentence::Gga(gga(&fields)?),
        "RMC" if !address.starts_with('P') => Sentence::Rmc(rmc(&fields)?),
        _ => Sentence::Other(kind.to_string()),
    };
    Ok(Some(sentence))
}

/// Field `i`, empty when the sentence is shorter.
fn field<'a>(fields: &[&'a str], i: usize) -> &'a str {
    fields.get(i).copied().unwrap_or("")
}

fn bad(kind: &'static str, field: usize, name: &'static str, value: &str) -> NmeaError {
    NmeaError::Field {
        kind,
        field,
        name,
        value: value.to_string(),
    }
}

fn number(
    kind: &'static str,
    fields: &[&str],
    i: usize,
    name: &'static str,
) -> Result<Option<f64>, NmeaError> {
    match field(fields, i) {
        "" => Ok(None),
        v => v
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| bad(kind, i, name, v)),
    }
}

/// `hhmmss` with optional fraction, as milliseconds into the day.
fn time_of_day(kind: &'static str, fields: &[&str], i: usize) -> Result<Option<u32>, NmeaError> {
    let v = field(fields, i);
    if v.is_empty() {
        return Ok(None);
    }
    let err = || bad(kind, i, "time", v);
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if whole.len() != 6 || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let n = |r: std::ops::Range<usize>| whole[r].parse::<u32>().map_err(|_| err());
    let (h, m, s) = (n(0..2)?, n(2..4)?, n(4..6)?);
    if h > 23 || m > 59 || s > 60 {
        return Err(err());
    }
    // Milliseconds from the first three fraction digits (padded), the rest ignored.
    let ms = format!("{frac:0<3}")[..3]
        .parse::<u32>()
        .map_err(|_| err())?;
    Ok(Some(((h * 60 + m) * 60 + s) * 1000 + ms))
}

/// `ddmm.mmmm` (latitude, `deg_digits` = 2) or `dddmm.mmmm` (longitude, 3) and its hemisphere.
fn coordinate(
    kind: &'static str,
    fields: &[&str],
    i: usize,
    name: &'static str,
    positive: char,
    negative: char,
    limit: f64,
) -> Result<Option<f64>, NmeaError> {
    let (v, hemi) = (field(fields, i), field(fields, i + 1));
    if v.is_empty() && hemi.is_empty() {
        return Ok(None);
    }
    let err = || bad(kind, i, name, &format!("{v},{hemi}"));
    let int_len = v.find('.').unwrap_or(v.len());
    if int_len < 3 || !v.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(err());
    }
    let degrees: f64 = v[..int_len - 2].parse().map_err(|_| err())?;
    let minutes: f64 = v[int_len - 2..].parse().map_err(|_| err())?;
    if minutes >= 60.0 {
        return Err(err());
    }
    let value = degrees + minutes / 60.0;
    if value > limit {
        return Err(err());
    }
    match hemi.chars().next() {
        Some(c) if c == positive && hemi.len() == 1 => Ok(Some(value)),
        Some(c) if c == negative && hemi.len() == 1 => Ok(Some(-value)),
        _ => Err(err()),
    }
}

fn position(
    kind: &'static str,
    fields: &[&str],
    lat: usize,
) -> Result<Option<(f64, f64)>, NmeaError> {
    let la = coordinate(kind, fields, lat, "latitude", 'N', 'S', 90.0)?;
    let lo = coordinate(kind, fields, lat + 2, "longitude", 'E', 'W', 180.0)?;
    Ok(la.zip(lo))
}

/// `$xxGGA,time,lat,N,lon,E,quality,satellites,hdop,altitude,M,separation,M,age,station`
fn gga(fields: &[&str]) -> Result<Gga, NmeaError> {
    const K: &str = "GGA";
    let quality = match field(fields, 6) {
        "" => 0,
        v => v.parse::<u8>().map_err(|_| bad(K, 6, "quality", v))?,
    };
    Ok(Gga {
        time_ms: time_of_day(K, fields, 1)?,
        position: position(K, fields, 2)?,
        quality,
        hdop: number(K, fields, 8, "hdop")?,
        altitude_msl: number(K, fields, 9, "altitude")?,
        geoid_separation: number(K, fields, 11, "geoid separation")?,
    })
}

/// `$xxRMC,time,status,lat,N,lon,E,speed,course,date,variation,E[,mode[,nav status]]`
fn rmc(fields: &[&str]) -> Result<Rmc, NmeaError> {
    const K: &str = "RMC";
    let valid = match field(fields, 2) {
        "A" => true,
        "V" | "" => false,
        v => return Err(bad(K, 2, "status", v)),
    };
    Ok(Rmc {
        time_ms: time_of_day(K, fields, 1)?,
        valid,
        position: position(K, fields, 3)?,
    })
}

/// How [`Fix::covariance`] was obtained (Foxglove's `PositionCovarianceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CovarianceType {
    Unknown = 0,
    Approximated = 1,
}

/// A position for Foxglove's `LocationFix`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fix {
    pub latitude: f64,
    pub longitude: f64,
    /// Metres above the WGS 84 ellipsoid (MSL + geoid separation; MSL alone when the receiver
    /// gives no separation); NaN when no GGA gave one.
    pub altitude: f64,
    /// ENU, m², row-major.
    pub covariance: [f64; 9],
    pub covariance_type: CovarianceType,
    /// Capture time and seq of the record that completed the fix.
    pub capture_ns: i64,
    pub seq: u64,
}

/// The horizontal error (m) per unit of HDOP for a GGA fix quality: the factors ROS's
/// nmea_navsat_driver uses (GPS 4 m, DGPS 0.1 m, RTK fixed 0.02 m, RTK float 4 m, others 4 m).
fn error_per_hdop(quality: u8) -> f64 {
    match quality {
        2 => 0.1,
        4 => 0.02,
        9 => 3.0,
        _ => 4.0,
    }
}

/// The covariance of a GGA fix: horizontal variance `(hdop * e)^2` on east and north, vertical
/// `(2 * hdop * e)^2`, as an approximation.
pub fn covariance_from_hdop(hdop: f64, quality: u8) -> [f64; 9] {
    let h = (hdop * error_per_hdop(quality)).powi(2);
    let v = (2.0 * hdop * error_per_hdop(quality)).powi(2);
    [h, 0.0, 0.0, 0.0, h, 0.0, 0.0, 0.0, v]
}

/// The parts of one epoch received so far.
#[derive(Debug, Clone)]
struct Epoch {
    time_ms: Option<u32>,
    gga: Option<Gga>,
    rmc: Option<Rmc>,
    capture_ns: i64,
    seq: u64,
}

impl Epoch {
    fn fix(&self) -> Option<Fix> {
        let (capture_ns, seq) = (self.capture_ns, self.seq);
        if let Some(g) = &self.gga {
            let (latitude, longitude) = g.position?;
            let altitude = match (g.altitude_msl, g.geoid_separation) {
                (Some(a), Some(s)) => a + s,
                (Some(a), None) => a,
                _ => f64::NAN,
            };
            let (covariance, covariance_type) = match g.hdop {
                Some(h) => (
                    covariance_from_hdop(h, g.quality),
                    CovarianceType::Approximated,
                ),
                None => ([0.0; 9], CovarianceType::Unknown),
            };
            return Some(Fix {
                latitude,
                longitude,
                altitude,
                covariance,
                covariance_type,
                capture_ns,
                seq,
            });
        }
        let r = self.rmc.as_ref()?;
        let (latitude, longitude) = r.position?;
        Some(Fix {
            latitude,
            longitude,
            altitude: f64::NAN,
            covariance: [0.0; 9],
            covariance_type: CovarianceType::Unknown,
            capture_ns,
            seq,
        })
    }
}

/// Merges the GGA and RMC of one epoch (same UTC time of fix) into one [`Fix`].
///
/// Only sentences that report a position count: a GGA with quality 0 or an RMC with status `V`
/// is ignored. A fix goes out as soon as its epoch has every kind the source has been seen to
/// send, else when a sentence of a later epoch arrives, or at [`FixBuilder::finish`]. A sentence
/// of an epoch already sent (an RMC after the GGA that completed it, before the source was known
/// to send both) adds nothing. A second sentence of a kind the epoch already has starts a new one
/// (a receiver whose time of fix is coarser than its rate).
#[derive(Debug, Default)]
pub struct FixBuilder {
    seen_gga: bool,
    seen_rmc: bool,
    pending: Option<Epoch>,
    /// The time of the epoch sent last and the kinds it had (GGA, RMC).
    last_sent: Option<(u32, bool, bool)>,
}

impl FixBuilder {
    /// Takes one parsed sentence captured at `capture_ns` (record `seq`); returns the fixes that
    /// are complete now (at most two: the previous epoch's and this one's), oldest first.
    pub fn push(&mut self, sentence: &Sentence, capture_ns: i64, seq: u64) -> Vec<Fix> {
        let (time_ms, gga, rmc) = match sentence {
            Sentence::Gga(g) if g.quality > 0 && g.position.is_some() => {
                (g.time_ms, Some(g.clone()), None)
            }
            Sentence::Rmc(r) if r.valid && r.position.is_some() => {
                (r.time_ms, None, Some(r.clone()))
            }
            _ => return Vec::new(),
        };
        let is_gga = gga.is_some();
        self.seen_gga |= is_gga;
        self.seen_rmc |= !is_gga;
        let mut out = Vec::new();
        if let (Some(t), Some((sent, had_gga, had_rmc))) = (time_ms, &mut self.last_sent) {
            let had = if is_gga { had_gga } else { had_rmc };
            if t == *sent && !*had {
                *had = true;
                return out;
            }
        }
        let flush = self.pending.as_ref().is_some_and(|p| {
            let has_kind = if is_gga {
                p.gga.is_some()
            } else {
                p.rmc.is_some()
            };
            time_ms.is_none() || p.time_ms != time_ms || has_kind
        });
        if flush {
            out.extend(self.pending.take().and_then(|p| p.fix()));
        }
        let epoch = self.pending.get_or_insert(Epoch {
            time_ms,
            gga: None,
            rmc: None,
            capture_ns,
            seq,
        });
        epoch.capture_ns = capture_ns;
        epoch.seq = seq;
        if gga.is_some() {
            epoch.gga = gga;
        }
        if rmc.is_some() {
            epoch.rmc = rmc;
        }
        let complete = time_ms.is_none()
            || (epoch.gga.is_some() || !self.seen_gga) && (epoch.rmc.is_some() || !self.seen_rmc);
        if complete {
            self.last_sent = time_ms.map(|t| (t, epoch.gga.is_some(), epoch.rmc.is_some()));
            out.extend(self.pending.take().and_then(|p| p.fix()));
        }
        out
    }

    /// The fix of an epoch still waiting for its other sentence, if any.
    pub fn finish(&mut self) -> Option<Fix> {
        self.pending.take().and_then(|p| p.fix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sentence with its checksum.
    fn sentence(body: &str) -> Vec<u8> {
        let sum = body.bytes().fold(0u8, |a, b| a ^ b);
        format!("${body}*{sum:02X}\r\n").into_bytes()
    }

    fn gga_at(time: &str) -> Vec<u8> {
        sentence(&format!(
            "GPGGA,{time},4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,"
        ))
    }

    fn rmc_at(time: &str) -> Vec<u8> {
        sentence(&format!(
            "GPRMC,{time},A,4807.038,N,01131.000,E,022.4,084.4,230394,003.1,W"
        ))
    }

    fn parsed(record: &[u8]) -> Sentence {
        parse(record).unwrap().unwrap()
    }

    #[test]
    fn gga_gives_position_altitude_quality_and_hdop() {
        let Sentence::Gga(g) = parsed(&gga_at("123519")) else {
            panic!("not a GGA")
        };
        let (lat, lon) = g.position.unwrap();
        assert!((lat - (48.0 + 7.038 / 60.0)).abs() < 1e-12);
        assert!((lon - (11.0 + 31.0 / 60.0)).abs() < 1e-12);
        assert_eq!(g.time_ms, Some((12 * 3600 + 35 * 60 + 19) * 1000));
        assert_eq!(g.quality, 1);
        assert_eq!(g.hdop, Some(0.9));
        assert_eq!(g.altitude_msl, Some(545.4));
        assert_eq!(g.geoid_separation, Some(46.9));
    }

    #[test]
    fn southern_and_western_hemispheres_are_negative() {
        let Sentence::Rmc(r) = parsed(&sentence(
            "GNRMC,081836.75,A,3751.65,S,14507.36,W,000.0,360.0,130998,011.3,E,A",
        )) else {
            panic!("not an RMC")
        };
        let (lat, lon) = r.position.unwrap();
        assert!((lat + (37.0 + 51.65 / 60.0)).abs() < 1e-12);
        assert!((lon + (145.0 + 7.36 / 60.0)).abs() < 1e-12);
        assert!(r.valid);
        assert_eq!(r.time_ms, Some((8 * 3600 + 18 * 60 + 36) * 1000 + 750));
    }

    #[test]
    fn records_that_do_not_parse_say_why() {
        assert_eq!(parse(b"hello\n"), Ok(None));
        assert_eq!(parse(b""), Ok(None));
        let mut bad_sum = gga_at("123519");
        let star = bad_sum.iter().position(|&b| b == b'*').unwrap();
        bad_sum[star + 1] = b'0';
        bad_sum[star + 2] = b'0';
        assert!(matches!(parse(&bad_sum), Err(NmeaError::Checksum { .. })));
        assert!(matches!(
            parse(&sentence(
                "GPGGA,123519,48x7.038,N,01131.000,E,1,08,0.9,545.4,M,,M,,"
            )),
            Err(NmeaError::Field {
                name: "latitude",
                ..
            })
        ));
        assert!(matches!(
            parse(&sentence(
                "GPGGA,123519,4807.038,Q,01131.000,E,1,08,0.9,545.4,M,,M,,"
            )),
            Err(NmeaError::Field { .. })
        ));
        assert!(matches!(
            parse(&sentence(
                "GPGGA,253519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,,M,,"
            )),
            Err(NmeaError::Field { name: "time", .. })
        ));
        assert!(matches!(
            parse(&sentence("GPRMC,123519,X,4807.038,N,01131.000,E,,,,,")),
            Err(NmeaError::Field { name: "status", .. })
        ));
        assert!(matches!(parse(b"$*00"), Err(NmeaError::Address(_))));
        assert_eq!(parse(b"$\xff\xfe"), Err(NmeaError::NotText));
        // Truncated after the checksum was lost: still no panic.
        assert!(parse(b"$GPGGA,1235").is_err());
        assert_eq!(
            parsed(&sentence("GPGSV,3,1,11,03,03,111,00")),
            Sentence::Other("GSV".into())
        );
    }

    #[test]
    fn no_checksum_is_accepted_and_empty_fields_are_no_fix() {
        let Sentence::Gga(g) = parsed(b"$GPGGA,,,,,,0,,,,,,,,\r\n") else {
            panic!("not a GGA")
        };
        assert_eq!(g.position, None);
        assert_eq!(g.quality, 0);
        assert_eq!(g.time_ms, None);
        let mut b = FixBuilder::default();
        assert!(b.push(&Sentence::Gga(g), 1, 1).is_empty());
        assert_eq!(b.finish(), None);
    }

    #[test]
    fn covariance_follows_hdop_and_quality() {
        let c = covariance_from_hdop(0.9, 1);
        assert!((c[0] - 3.6f64.powi(2)).abs() < 1e-9);
        assert_eq!(c[0], c[4]);
        assert!((c[8] - 7.2f64.powi(2)).abs() < 1e-9);
        assert_eq!(c[1], 0.0);
        assert!(covariance_from_hdop(0.9, 4)[0] < c[0]);
    }

    #[test]
    fn gga_and_rmc_of_one_epoch_make_one_fix() {
        let mut b = FixBuilder::default();
        // The first epoch: the GGA goes out alone (RMC not yet seen), its RMC adds nothing.
        let first = b.push(&parsed(&gga_at("120000")), 10, 1);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].covariance_type, CovarianceType::Approximated);
        assert!((first[0].altitude - (545.4 + 46.9)).abs() < 1e-9);
        assert!(b.push(&parsed(&rmc_at("120000")), 20, 2).is_empty());
        // A second GGA of that time is a new fix (and the source still sends both kinds).
        assert!(b.push(&parsed(&gga_at("120000")), 25, 25).is_empty());
        let again = b.push(&parsed(&rmc_at("120000")), 26, 26);
        assert_eq!((again.len(), again[0].seq), (1, 26));
        // From now on both kinds are awaited.
        assert!(b.push(&parsed(&gga_at("120001")), 30, 3).is_empty());
        let second = b.push(&parsed(&rmc_at("120001")), 40, 4);
        assert_eq!(second.len(), 1);
        assert_eq!((second[0].capture_ns, second[0].seq), (40, 4));
        assert!(second[0].altitude.is_finite());
        // The RMC of an epoch is lost: the GGA goes out when the next epoch starts.
        assert!(b.push(&parsed(&gga_at("120002")), 50, 5).is_empty());
        let third = b.push(&parsed(&gga_at("120003")), 60, 6);
        assert_eq!(third.len(), 1);
        assert_eq!(third[0].capture_ns, 50);
        // The last epoch waits for finish.
        let last = b.finish().unwrap();
        assert_eq!(last.capture_ns, 60);
        assert_eq!(b.finish(), None);
    }

    proptest::proptest! {
        /// Whatever a serial port delivers, parsing and merging never panic; with a `$` and a
        /// checksum that matches, mangled fields are errors or sentences, never a crash.
        #[test]
        fn any_record_parses_or_fails_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100),
            fields in proptest::collection::vec("[0-9NSEWAV.,-]{0,12}", 0..14),
            kind in "(GPGGA|GNRMC|GPGSV|P|)",
        ) {
            let mut b = FixBuilder::default();
            let _ = parse(&bytes);
            let body = format!("{kind},{}", fields.join(","));
            for record in [sentence(&body), format!("${body}").into_bytes()] {
                if let Ok(Some(s)) = parse(&record) {
                    for fix in b.push(&s, 1, 1) {
                        proptest::prop_assert!(fix.latitude.abs() <= 90.0);
                        proptest::prop_assert!(fix.longitude.abs() <= 180.0);
                    }
                }
            }
            let _ = b.finish();
        }
    }

    #[test]
    fn rmc_only_sources_get_a_fix_per_valid_sentence() {
        let mut b = FixBuilder::default();
        for (i, t) in ["000001", "000002", "000003"].iter().enumerate() {
            let fixes = b.push(&parsed(&rmc_at(t)), i as i64, i as u64);
            assert_eq!(fixes.len(), 1);
            assert!(fixes[0].altitude.is_nan());
            assert_eq!(fixes[0].covariance_type, CovarianceType::Unknown);
        }
        // Two fixes within one time of fix (a coarse clock): two fixes, not one.
        assert_eq!(b.push(&parsed(&rmc_at("000003")), 7, 7).len(), 1);
        let void = sentence("GPRMC,000004,V,4807.038,N,01131.000,E,,,230394,,");
        assert!(b.push(&parsed(&void), 9, 9).is_empty());
        assert_eq!(b.finish(), None);
    }
}
