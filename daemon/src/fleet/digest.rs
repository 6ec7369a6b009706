//! A rig's coverage digest: per on-request source the capture-time ranges it holds (merged, at most
//! [`MAX_RANGES`], coarsened beyond), its frames and bytes, and a thinned GPS track of where the rig
//! was, with times. Pure: built from recall's held runs ([`crate::recall::protocol::Held`]) and
//! the track's fixes; encoded as compact JSON (times in ms and coordinates in 1e-5 degrees, both
//! delta-encoded) for the fleet's coverage topic (docs/FLEET.md, "The digest").

use serde::{Deserialize, Serialize};

use crate::recall::protocol::{Held, Span};

/// The wire format's version (`v`).
pub const VERSION: u32 = 1;
/// Ranges kept per source; beyond, the closest ranges are merged (the digest says `coarse`).
pub const MAX_RANGES: usize = 64;
/// Track points kept per hour of track (each ~16 bytes encoded): beyond, the track is thinned
/// again with a doubled tolerance until it fits.
pub const MAX_POINTS_PER_HOUR: usize = 1500;
/// The track's tolerance (m): the rig's true position at any time of a run is at most this far
/// from the thinned track's, interpolated in time (synchronized distance).
pub const TOLERANCE_M: f64 = 10.0;
/// Fixes further apart in time than this break the track into runs (no fix: position unknown).
pub const TRACK_GAP_NS: i64 = 120_000_000_000;
/// Coordinates are sent in units of 1e-5 degree (at most 0.6 m off on either axis).
const COORD_UNIT: f64 = 1e5;
const NS_PER_MS: i64 = 1_000_000;
/// The mean Earth radius (m) of the haversine and the local projections.
pub const EARTH_RADIUS_M: f64 = 6_371_008.8;

/// One position at a capture time (ns, the rig clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub t: i64,
    pub lat: f64,
    pub lon: f64,
}

/// What one source holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub source: String,
    pub frames: u64,
    pub bytes: u64,
    /// Sorted, disjoint, `[from, to)` ns.
    pub ranges: Vec<Span>,
    /// Ranges were merged across gaps to stay within [`MAX_RANGES`]: a range may hold less.
    pub coarse: bool,
}

/// A rig's digest.
#[derive(Debug, Clone, PartialEq)]
pub struct Digest {
    pub rig: String,
    /// When it was made (rig clock, ns).
    pub at: i64,
    pub sources: Vec<Source>,
    /// Runs of track points (each in time order); between runs the position is unknown.
    pub track: Vec<Vec<Point>>,
    /// How far (m) the rig may have been from the track, interpolated in time: the thinning's
    /// tolerances added up (plus the encoding's rounding, under a metre).
    pub tolerance_m: f64,
}

/// Great-circle distance (m) between two positions (degrees).
pub fn haversine_m(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dp = p2 - p1;
    let dl = (lon2 - lon1).to_radians();
    let a = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_M * a.sqrt().min(1.0).asin()
}

/// `p` in metres east and north of `origin` (equirectangular: good to a fraction of a percent
/// within tens of km).
pub fn local_m(origin: (f64, f64), lat: f64, lon: f64) -> (f64, f64) {
    let k = EARTH_RADIUS_M * std::f64::consts::PI / 180.0;
    let x = (lon - origin.1) * k * origin.0.to_radians().cos();
    let y = (lat - origin.0) * k;
    (x, y)
}

/// Sorted, merged (overlapping or touching ranges joined).
pub fn merge(mut spans: Vec<Span>) -> Vec<Span> {
    spans.retain(|s| s.from < s.to);
    spans.sort_by_key(|s| (s.from, s.to));
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(l) if s.from <= l.to => l.to = l.to.max(s.to),
            _ => out.push(s),
        }
    }
    out
}

/// At most `max` ranges: the ranges separated by the smallest gaps are joined until they fit
/// (so that what is said to be held covers everything held; true when it had to join).
pub fn coarsen(spans: Vec<Span>, max: usize) -> (Vec<Span>, bool) {
    let mut spans = merge(spans);
    if spans.len() <= max || max == 0 {
        return (spans, false);
    }
    // The gaps to close: the (len - max) smallest, ties by position.
    let mut gaps: Vec<(i64, usize)> = spans
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].from - w[0].to, i))
        .collect();
    gaps.sort_unstable();
    let mut close = vec![false; spans.len()];
    for &(_, i) in gaps.iter().take(spans.len() - max) {
        close[i] = true;
    }
    let mut out: Vec<Span> = Vec::with_capacity(max);
    let mut join = false;
    for (i, s) in spans.drain(..).enumerate() {
        match out.last_mut() {
            Some(l) if join => l.to = s.to,
            _ => out.push(s),
        }
        join = close[i];
    }
    (out, true)
}

/// The distance (m) of `p` from where the rig was at `p.t` on the straight, constant-speed way
/// from `a` to `b` (the synchronized Euclidean distance).
fn synchronized_m(a: &Point, b: &Point, p: &Point) -> f64 {
    let s = if b.t == a.t {
        0.0
    } else {
        (p.t - a.t) as f64 / (b.t - a.t) as f64
    };
    let origin = (a.lat, a.lon);
    let (bx, by) = local_m(origin, b.lat, b.lon);
    let (px, py) = local_m(origin, p.lat, p.lon);
    ((px - s * bx).powi(2) + (py - s * by).powi(2)).sqrt()
}

/// Douglas-Peucker on the synchronized distance: the points kept interpolate every dropped one
/// within `tolerance_m` at its own time. Keeps the first and last.
pub fn thin(points: &[Point], tolerance_m: f64) -> Vec<Point> {
    if points.len() <= 2 {
        return points.to_vec();
    }
    let mut keep = vec![false; points.len()];
    keep[0] = true;
    keep[points.len() - 1] = true;
    let mut stack = vec![(0, points.len() - 1)];
    while let Some((i, j)) = stack.pop() {
        let (mut worst, mut at) = (0.0, 0);
        for k in i + 1..j {
            let d = synchronized_m(&points[i], &points[j], &points[k]);
            if d > worst {
                (worst, at) = (d, k);
            }
        }
        if worst > tolerance_m {
            keep[at] = true;
            stack.push((i, at));
            stack.push((at, j));
        }
    }
    points
        .iter()
        .zip(keep)
        .filter_map(|(p, k)| k.then_some(*p))
        .collect()
}

/// Splits time-ordered fixes into runs at gaps longer than [`TRACK_GAP_NS`].
pub fn runs(points: &[Point]) -> Vec<Vec<Point>> {
    let mut out: Vec<Vec<Point>> = Vec::new();
    for p in points {
        match out.last_mut() {
            Some(run) if run.last().is_some_and(|l| p.t - l.t <= TRACK_GAP_NS) => run.push(*p),
            _ => out.push(vec![*p]),
        }
    }
    out
}

/// Where the digest's track begins: [`TRACK_GAP_NS`] before the earliest held frame (None:
/// nothing held, no track).
pub fn track_since(held: &[Held]) -> Option<i64> {
    held.iter()
        .filter_map(|h| h.held.first().map(|s| s.from))
        .min()
        .map(|t| t.saturating_sub(TRACK_GAP_NS))
}

impl Digest {
    /// The digest of what recall says the rig holds and of its track (runs of points, already
    /// thinned within [`TOLERANCE_M`] or not at all): ranges merged and coarsened, the track cut
    /// to the held time (from [`TRACK_GAP_NS`] before the earliest held frame on) and thinned
    /// further while it has more than [`MAX_POINTS_PER_HOUR`] per hour of track.
    pub fn build(
        rig: &str,
        at: i64,
        held: &[Held],
        track: &[Vec<Point>],
        tolerance_m: f64,
    ) -> Self {
        let sources: Vec<Source> = held
            .iter()
            .map(|h| {
                let (ranges, coarse) = coarsen(h.held.clone(), MAX_RANGES);
                Source {
                    source: h.source.clone(),
                    frames: h.frames,
                    bytes: h.bytes,
                    ranges,
                    coarse,
                }
            })
            .collect();
        let since = track_since(held).unwrap_or(i64::MAX);
        let mut runs: Vec<Vec<Point>> = track
            .iter()
            .map(|r| {
                r.iter()
                    .filter(|p| p.t >= since)
                    .copied()
                    .collect::<Vec<_>>()
            })
            .filter(|r: &Vec<Point>| !r.is_empty())
            .collect();
        let span_ns: i64 = runs
            .iter()
            .map(|r| r.last().map_or(0, |l| l.t) - r[0].t)
            .sum();
        let budget = MAX_POINTS_PER_HOUR
            .saturating_mul((span_ns / 3_600_000_000_000 + 1) as usize)
            .max(runs.len() * 2);
        // Each pass thins the last one's points: the bounds add up.
        let (mut pass, mut tolerance) = (tolerance_m.max(1.0), tolerance_m);
        while runs.iter().map(Vec::len).sum::<usize>() > budget {
            pass *= 2.0;
            runs = runs.iter().map(|r| thin(r, pass)).collect();
            tolerance += pass;
        }
        Digest {
            rig: rig.to_string(),
            at,
            sources,
            track: runs,
            tolerance_m: tolerance,
        }
    }

    /// The encoded digest (what the coverage topic carries).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&Wire::from(self)).expect("a digest serializes")
    }

    /// A digest read back; `Err` says why it is not one.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let w: Wire = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if w.v != VERSION {
            return Err(format!(
                "digest version {} (this rigd reads {VERSION})",
                w.v
            ));
        }
        w.into_digest()
    }
}

/// The encoding: times in ms from `t0` and coordinates in 1e-5 degree, each a delta from the one
/// before (ranges: start from the previous end, then length; track: per run `[dt, dlat, dlon]`
/// repeated, continuing from the previous run's last point).
#[derive(Debug, Serialize, Deserialize)]
struct Wire {
    v: u32,
    rig: String,
    /// ns.
    at: i64,
    /// ms, the origin of every delta.
    t0: i64,
    src: Vec<WireSource>,
    /// Metres.
    tol: f64,
    trk: Vec<Vec<i64>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireSource {
    id: String,
    frames: u64,
    bytes: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    coarse: bool,
    r: Vec<i64>,
}

/// ns to ms, down; `ceil_ms` up (a range is never narrowed by the encoding).
fn floor_ms(ns: i64) -> i64 {
    ns.div_euclid(NS_PER_MS)
}
fn ceil_ms(ns: i64) -> i64 {
    -(-ns).div_euclid(NS_PER_MS)
}

impl From<&Digest> for Wire {
    fn from(d: &Digest) -> Self {
        let t0 = d
            .sources
            .iter()
            .filter_map(|s| s.ranges.first().map(|r| r.from))
            .chain(d.track.iter().filter_map(|r| r.first().map(|p| p.t)))
            .min()
            .map_or(floor_ms(d.at), floor_ms);
        let src = d
            .sources
            .iter()
            .map(|s| {
                let mut r = Vec::with_capacity(s.ranges.len() * 2);
                let mut last = t0;
                for span in &s.ranges {
                    let (from, to) = (floor_ms(span.from), ceil_ms(span.to));
                    r.push(from - last);
                    r.push(to - from);
                    last = to;
                }
                WireSource {
                    id: s.source.clone(),
                    frames: s.frames,
                    bytes: s.bytes,
                    coarse: s.coarse,
                    r,
                }
            })
            .collect();
        let (mut t, mut la, mut lo) = (t0, 0i64, 0i64);
        let trk = d
            .track
            .iter()
            .map(|run| {
                let mut out = Vec::with_capacity(run.len() * 3);
                for p in run {
                    let (pt, pla, plo) = (
                        floor_ms(p.t),
                        (p.lat * COORD_UNIT).round() as i64,
                        (p.lon * COORD_UNIT).round() as i64,
                    );
                    out.extend([pt - t, pla - la, plo - lo]);
                    (t, la, lo) = (pt, pla, plo);
                }
                out
            })
            .collect();
        Wire {
            v: VERSION,
            rig: d.rig.clone(),
            at: d.at,
            t0,
            src,
            tol: d.tolerance_m,
            trk,
        }
    }
}

impl Wire {
    fn into_digest(self) -> Result<Digest, String> {
        let ms = |v: i64| {
            v.checked_mul(NS_PER_MS)
                .ok_or_else(|| format!("a time out of range ({v} ms)"))
        };
        let mut sources = Vec::with_capacity(self.src.len());
        for s in self.src {
            if s.r.len() % 2 != 0 {
                return Err(format!("source {}: an odd number of range fields", s.id));
            }
            let mut last = self.t0;
            let mut ranges = Vec::with_capacity(s.r.len() / 2);
            for pair in s.r.chunks(2) {
                let from = last.saturating_add(pair[0]);
                let to = from.saturating_add(pair[1]);
                ranges.push(Span {
                    from: ms(from)?,
                    to: ms(to)?,
                });
                last = to;
            }
            sources.push(Source {
                source: s.id,
                frames: s.frames,
                bytes: s.bytes,
                ranges,
                coarse: s.coarse,
            });
        }
        let (mut t, mut la, mut lo) = (self.t0, 0i64, 0i64);
        let mut track = Vec::with_capacity(self.trk.len());
        for run in self.trk {
            if run.len() % 3 != 0 {
                return Err("a track run's fields are not in threes".to_string());
            }
            let mut points = Vec::with_capacity(run.len() / 3);
            for p in run.chunks(3) {
                t = t.saturating_add(p[0]);
                la = la.saturating_add(p[1]);
                lo = lo.saturating_add(p[2]);
                points.push(Point {
                    t: ms(t)?,
                    lat: la as f64 / COORD_UNIT,
                    lon: lo as f64 / COORD_UNIT,
                });
            }
            track.push(points);
        }
        Ok(Digest {
            rig: self.rig,
            at: self.at,
            sources,
            track,
            tolerance_m: self.tol,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;
    const T0: i64 = 1_764_800_000 * S;

    fn span(from: i64, to: i64) -> Span {
        Span { from, to }
    }

    #[test]
    fn ranges_merge_when_they_overlap_or_touch() {
        let m = merge(vec![
            span(50, 60),
            span(10, 20),
            span(20, 30),
            span(25, 27),
            span(40, 40),
            span(59, 70),
        ]);
        assert_eq!(m, vec![span(10, 30), span(50, 70)]);
    }

    #[test]
    fn too_many_ranges_are_coarsened_across_the_smallest_gaps_and_cover_everything() {
        // 100 one-second ranges; gaps grow with i, except three big ones.
        let spans: Vec<Span> = (0..100)
            .map(|i| span(T0 + i * 10 * S + i, T0 + i * 10 * S + S))
            .collect();
        let (c, coarse) = coarsen(spans.clone(), 64);
        assert!(coarse);
        assert_eq!(c.len(), 64);
        for s in &spans {
            assert!(
                c.iter().any(|r| r.from <= s.from && s.to <= r.to),
                "{s:?} lost"
            );
        }
        // Fewer than the bound: unchanged, not coarse.
        let (same, coarse) = coarsen(spans[..10].to_vec(), 64);
        assert_eq!((same, coarse), (spans[..10].to_vec(), false));
        // The widest gaps survive: with 2 ranges allowed out of [0,1) [2,3) [10,11), 2-3 joins 0-1.
        let (two, _) = coarsen(vec![span(0, 1), span(2, 3), span(10, 11)], 2);
        assert_eq!(two, vec![span(0, 3), span(10, 11)]);
    }

    fn straight(n: i64, from: (f64, f64), step: (f64, f64), every: i64) -> Vec<Point> {
        (0..n)
            .map(|i| Point {
                t: T0 + i * every,
                lat: from.0 + step.0 * i as f64,
                lon: from.1 + step.1 * i as f64,
            })
            .collect()
    }

    #[test]
    fn a_straight_constant_speed_track_thins_to_its_ends_and_a_turn_is_kept() {
        let line = straight(600, (48.1, 11.5), (0.0001, 0.0), S);
        assert_eq!(thin(&line, TOLERANCE_M), vec![line[0], line[599]]);
        // Going east for 300 s, then north: the corner stays.
        let mut l = straight(300, (48.1, 11.5), (0.0, 0.0001), S);
        let corner = *l.last().unwrap();
        l.extend(
            straight(300, (corner.lat, corner.lon), (0.0001, 0.0), S)
                .iter()
                .skip(1)
                .map(|p| Point {
                    t: p.t + 299 * S,
                    ..*p
                }),
        );
        let t = thin(&l, TOLERANCE_M);
        assert_eq!(t.len(), 3, "{t:?}");
        assert_eq!(t[1], corner);
        // A stop (same place, time going on) is kept too: the synchronized distance sees it.
        let mut stop = straight(100, (48.1, 11.5), (0.0001, 0.0), S);
        let end = *stop.last().unwrap();
        stop.extend((1..100).map(|i| Point {
            t: end.t + i * S,
            ..end
        }));
        assert_eq!(thin(&stop, TOLERANCE_M).len(), 3);
    }

    #[test]
    fn every_dropped_fix_is_within_the_tolerance_of_the_thinned_track() {
        // A wobbly path: every fix must be interpolated within 10 m at its own time.
        let pts: Vec<Point> = (0..2000)
            .map(|i| {
                let f = i as f64;
                Point {
                    t: T0 + i * S,
                    lat: 48.1 + f * 0.00005 + (f / 40.0).sin() * 0.001,
                    lon: 11.5 + f * 0.00007 + (f / 25.0).cos() * 0.0008,
                }
            })
            .collect();
        let t = thin(&pts, TOLERANCE_M);
        assert!(t.len() < pts.len() / 3, "{}", t.len());
        for p in &pts {
            let i = t.partition_point(|q| q.t <= p.t).clamp(1, t.len() - 1);
            let d = synchronized_m(&t[i - 1], &t[i], p);
            assert!(d <= TOLERANCE_M + 1e-6, "{p:?}: {d} m");
        }
    }

    #[test]
    fn a_gap_in_the_fixes_breaks_the_track() {
        let mut pts = straight(10, (48.1, 11.5), (0.0001, 0.0), S);
        pts.extend(
            straight(10, (48.2, 11.5), (0.0001, 0.0), S)
                .iter()
                .map(|p| Point {
                    t: p.t + 10 * S + TRACK_GAP_NS,
                    ..*p
                }),
        );
        let r = runs(&pts);
        assert_eq!(r.iter().map(Vec::len).collect::<Vec<_>>(), vec![10, 10]);
    }

    fn held(source: &str, spans: Vec<Span>) -> Held {
        Held {
            source: source.into(),
            frames: 100,
            bytes: 1000,
            held: spans,
        }
    }

    #[test]
    fn it_encodes_and_decodes_without_narrowing_a_range() {
        let track = runs(&straight(50, (48.1, 11.5), (0.001, -0.002), 10 * S));
        let d = Digest::build(
            "van-07",
            T0 + 600 * S,
            &[held("cam", vec![span(T0 + 1, T0 + 2 * S + 1)])],
            &track,
            TOLERANCE_M,
        );
        let back = Digest::decode(&d.encode()).unwrap();
        assert_eq!(back.rig, "van-07");
        assert_eq!(back.at, d.at);
        let r = back.sources[0].ranges[0];
        assert!(r.from <= T0 + 1 && r.to > T0 + 2 * S, "{r:?}");
        assert!(r.to - r.from <= 2 * S + 2_000_000, "{r:?}");
        for (a, b) in d.track[0].iter().zip(&back.track[0]) {
            assert!(haversine_m(a.lat, a.lon, b.lat, b.lon) < 1.0);
            assert!((a.t - b.t).abs() < 1_000_000);
        }
        assert!(Digest::decode(b"{\"v\": 9}").is_err());
        assert!(Digest::decode(b"not json").is_err());
    }

    #[test]
    fn the_track_before_what_is_held_is_left_out() {
        let track = runs(&straight(3600, (48.1, 11.5), (0.0, 0.0001), S));
        let from = T0 + 1800 * S;
        let d = Digest::build(
            "r",
            T0,
            &[held("cam", vec![span(from, T0 + 3600 * S)])],
            &track,
            TOLERANCE_M,
        );
        assert!(d.track[0][0].t >= from - TRACK_GAP_NS);
        // Nothing held: no track at all.
        let none = Digest::build("r", T0, &[held("cam", vec![])], &track, TOLERANCE_M);
        assert!(none.track.is_empty());
    }

    /// A rig-hour driving through a city (a turn every 20 to 60 s, fixes at 10 Hz) with three
    /// sources holding the hour in 200 pieces: the digest stays within 50 KB.
    #[test]
    fn a_busy_rig_hour_fits_in_50_kb() {
        let (d, raw) = crate::fleet::synth::rig_hour(7, 3600, 10);
        let bytes = d.encode().len();
        assert!(bytes <= 50 * 1024, "{bytes} bytes");
        assert!(d.sources.iter().all(|s| s.ranges.len() <= MAX_RANGES));
        assert!(raw > 30_000, "{raw} fixes");
        // Ten hours held: the same bound per hour.
        let (d, _) = crate::fleet::synth::rig_hour(7, 36_000, 1);
        let bytes = d.encode().len();
        assert!(bytes <= 10 * 50 * 1024, "{bytes} bytes for 10 h");
    }

    /// The worst track: a road that winds all hour (100 m either side every 150 m, at 15 m/s,
    /// fixes at 10 Hz: thousands of turns, none thinned away at 10 m), with 64 ranges in each of
    /// three sources: the point budget holds it within 50 KB.
    #[test]
    fn a_winding_hour_is_thinned_to_the_budget_and_fits_in_50_kb() {
        let pts: Vec<Point> = (0..36_000)
            .map(|i| {
                let y = 1.5 * i as f64;
                let x = 100.0 * (y / 150.0 * std::f64::consts::TAU).sin();
                Point {
                    t: T0 + i * S / 10,
                    lat: 48.1 + y / 111_195.0,
                    lon: 11.5 + x / 74_300.0,
                }
            })
            .collect();
        let ranges: Vec<Span> = (0..64)
            .map(|i| span(T0 + i * 56 * S, T0 + i * 56 * S + 50 * S))
            .collect();
        let held: Vec<Held> = ["cam", "mic", "lidar"]
            .iter()
            .map(|s| held(s, ranges.clone()))
            .collect();
        let d = Digest::build("winding", T0 + 3600 * S, &held, &runs(&pts), TOLERANCE_M);
        let bytes = d.encode().len();
        let points: usize = d.track.iter().map(Vec::len).sum();
        eprintln!(
            "winding rig-hour: {points} points, {bytes} bytes, tolerance {} m",
            d.tolerance_m
        );
        assert!(points <= MAX_POINTS_PER_HOUR, "{points}");
        assert!(bytes <= 50 * 1024, "{bytes} bytes");
    }

    #[test]
    fn haversine_is_right_on_known_distances() {
        // One degree of latitude ~ 111.2 km; Munich - Berlin ~ 504 km.
        assert!((haversine_m(48.0, 11.0, 49.0, 11.0) - 111_195.0).abs() < 10.0);
        let mb = haversine_m(48.1374, 11.5755, 52.5200, 13.4050);
        assert!((mb - 504_000.0).abs() < 2_000.0, "{mb}");
        // The local projection agrees within 0.5 % at 20 km.
        let (x, y) = local_m((48.1, 11.5), 48.2, 11.7);
        let h = haversine_m(48.1, 11.5, 48.2, 11.7);
        assert!(((x * x + y * y).sqrt() - h).abs() / h < 0.005);
    }
}
