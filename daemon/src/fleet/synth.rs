//! Synthetic rigs' digests, made with the rig's own code (the [`Track`] a running rig keeps, fed
//! fix by fix, and [`Digest::build`]): for the size bound's unit test, the coverage test's fleet of
//! 1,000 (`rigd fleet synth-digests`) and docs/PERFORMANCE.md's size per rig-hour. Deterministic
//! for a seed.

use super::digest::{Digest, Point, TOLERANCE_M};
use super::track::Track;
use crate::recall::protocol::{Held, Span};

const S: i64 = 1_000_000_000;
/// Metres per degree of latitude.
const M_PER_DEG: f64 = 111_195.0;

/// splitmix64: small, deterministic, good enough for tracks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

/// One synthetic rig: `secs` of a city drive from `start` (a turn every 20 to 60 s, now and then
/// a stop), fixes at `hz`, from `from` (ns); it holds the whole time of `mic`, of `cam` in 200
/// pieces (more than a digest keeps: coarsened) and of `lidar` in 10. Returns the digest and the
/// number of fixes that went into it.
pub fn rig(
    name: &str,
    seed: u64,
    start: (f64, f64),
    from: i64,
    secs: i64,
    hz: u32,
) -> (Digest, usize) {
    let mut rng = Rng(seed);
    let track = Track::default();
    let (mut lat, mut lon) = start;
    let mut heading = rng.range(0.0, std::f64::consts::TAU);
    let mut speed = rng.range(8.0, 14.0);
    let mut leg_left = rng.range(20.0, 60.0);
    let step = 1.0 / hz as f64;
    let fixes = secs * hz as i64;
    for i in 0..fixes {
        track.push(Point {
            t: from + i * S / hz as i64,
            lat,
            lon,
        });
        leg_left -= step;
        if leg_left <= 0.0 {
            leg_left = rng.range(20.0, 60.0);
            let turn = [-1.0, 1.0][(rng.next() & 1) as usize] * std::f64::consts::FRAC_PI_2;
            heading += turn + rng.range(-0.2, 0.2);
            // One leg in eight is a stop.
            speed = if rng.next() % 8 == 0 {
                0.0
            } else {
                rng.range(8.0, 14.0)
            };
        }
        let d = speed * step;
        lat += d * heading.cos() / M_PER_DEG;
        lon += d * heading.sin() / (M_PER_DEG * lat.to_radians().cos());
    }
    let to = from + secs * S;
    let pieces = |n: i64, rng: &mut Rng| -> Vec<Span> {
        let len = (to - from) / n;
        (0..n)
            .map(|k| {
                let gap = (rng.range(0.5, 5.0) * S as f64) as i64;
                Span {
                    from: from + k * len,
                    to: from + (k + 1) * len - gap.min(len / 2),
                }
            })
            .collect()
    };
    let held = vec![
        Held {
            source: "cam".into(),
            frames: (secs * 30) as u64,
            bytes: (secs * 30 * 60_000) as u64,
            held: pieces(200, &mut rng),
        },
        Held {
            source: "mic".into(),
            frames: (secs * 30) as u64,
            bytes: (secs * 192_000) as u64,
            held: vec![Span { from, to }],
        },
        Held {
            source: "lidar".into(),
            frames: (secs * 10) as u64,
            bytes: (secs * 10 * 400_000) as u64,
            held: pieces(10, &mut rng),
        },
    ];
    let digest = Digest::build(name, to, &held, &track.runs(i64::MIN), TOLERANCE_M);
    (digest, fixes as usize)
}

/// The rig of the size bound's test: `secs` of driving in Munich at `hz`, seed `seed`.
pub fn rig_hour(seed: u64, secs: i64, hz: u32) -> (Digest, usize) {
    rig("synth", seed, (48.137, 11.575), 1_764_800_000 * S, secs, hz)
}

/// What `rigd fleet synth-digests` makes.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub rigs: usize,
    pub seed: u64,
    /// Centre (degrees) and spread (m): each rig starts uniformly within the square.
    pub centre: (f64, f64),
    pub spread_m: f64,
    /// Each rig's time held ends here (ns) and lasts this long (s).
    pub end: i64,
    pub secs: i64,
    pub hz: u32,
    /// Rig ids: `{prefix}{index:04}`.
    pub prefix: String,
}

/// The encoded digests of the fleet, with the fixes each took.
pub fn fleet(f: &Fleet) -> Vec<(String, Vec<u8>, usize)> {
    let mut rng = Rng(f.seed);
    (0..f.rigs)
        .map(|i| {
            let name = format!("{}{i:04}", f.prefix);
            let dy = rng.range(-f.spread_m, f.spread_m) / M_PER_DEG;
            let dx =
                rng.range(-f.spread_m, f.spread_m) / (M_PER_DEG * f.centre.0.to_radians().cos());
            let start = (f.centre.0 + dy, f.centre.1 + dx);
            let (d, fixes) = rig(&name, rng.next(), start, f.end - f.secs * S, f.secs, f.hz);
            (name, d.encode(), fixes)
        })
        .collect()
}

/// `rigd fleet synth-digests`: the flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// How many rigs.
    #[arg(long, default_value_t = 1000)]
    pub rigs: usize,
    /// Hours each rig holds (its track and sources), ending at --end.
    #[arg(long, default_value_t = 1.0)]
    pub hours: f64,
    /// The end of what they hold (RFC 3339 or unix ns; default: now).
    #[arg(long, value_name = "T", value_parser = crate::civil::parse)]
    pub end: Option<i64>,
    /// Where the rigs start: LAT,LON,SPREAD_M (each within SPREAD_M north-south and east-west).
    #[arg(long, value_name = "LAT,LON,SPREAD_M", value_parser = super::cli::parse_near,
          allow_hyphen_values = true, default_value = "52.52,13.405,20000")]
    pub around: super::cli::Near,
    /// Fixes per second of each rig's GPS.
    #[arg(long, default_value_t = 1)]
    pub hz: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Rig ids are PREFIX0000, PREFIX0001, ...
    #[arg(long, default_value = "synth-")]
    pub prefix: String,
}

/// Writes one digest per line (the coverage topic's payload, JSON; key = its `rig`) to `out` and
/// returns the summary line: digests, bytes, bytes per rig-hour.
pub fn write(args: &SynthArgs, out: &mut dyn std::io::Write) -> std::io::Result<String> {
    let secs = ((args.hours * 3600.0).round() as i64).max(1);
    let f = Fleet {
        rigs: args.rigs,
        seed: args.seed,
        centre: (args.around.lat, args.around.lon),
        spread_m: args.around.radius_m,
        end: args.end.unwrap_or_else(rigd_drivers::realtime_ns),
        secs,
        hz: args.hz.max(1),
        prefix: args.prefix.clone(),
    };
    let digests = fleet(&f);
    let (mut total, mut largest, mut fixes) = (0usize, 0usize, 0usize);
    for (_, bytes, n) in &digests {
        out.write_all(bytes)?;
        out.write_all(b"\n")?;
        total += bytes.len();
        largest = largest.max(bytes.len());
        fixes += n;
    }
    let rig_hours = digests.len() as f64 * secs as f64 / 3600.0;
    Ok(format!(
        "{} digests, {} bytes ({} fixes in): {:.0} bytes per rig-hour on average, the largest {} bytes for {:.2} h",
        digests.len(),
        total,
        fixes,
        total as f64 / rig_hours.max(f64::MIN_POSITIVE),
        largest,
        secs as f64 / 3600.0
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_is_deterministic_and_each_digest_reads_back() {
        let f = Fleet {
            rigs: 5,
            seed: 1,
            centre: (52.52, 13.405),
            spread_m: 20_000.0,
            end: 1_764_800_000 * S,
            secs: 600,
            hz: 1,
            prefix: "synth-".into(),
        };
        let a = fleet(&f);
        assert_eq!(a, fleet(&f));
        assert_eq!(a[3].0, "synth-0003");
        for (name, bytes, fixes) in &a {
            let d = Digest::decode(bytes).unwrap();
            assert_eq!(&d.rig, name);
            assert_eq!(*fixes, 600);
            assert!(d.sources[0].coarse && !d.sources[1].coarse);
            let p = d.track[0][0];
            assert!(super::super::digest::haversine_m(52.52, 13.405, p.lat, p.lon) < 30_000.0);
        }
    }
}
