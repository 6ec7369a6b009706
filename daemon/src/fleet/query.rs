//! A place-and-time query over the fleet's digests: which rigs hold which ranges of which sources
//! there and then. Pure.
//!
//! "There" is the times the rig's track puts it within the radius: each segment of a track run is
//! taken as straight and at constant speed between its points (what thinning guarantees within
//! the digest's tolerance, which is added to the radius so that nothing held is missed), in a
//! local projection around the centre; a run of one point is tested with the haversine.
//! "Then" is `[from, to)`. The answer per source is its held ranges intersected with both.

use serde::Serialize;

use super::digest::{haversine_m, local_m, merge, Digest, Point};
use crate::recall::protocol::Span;

/// What is asked. Every part is optional: none at all lists every rig and all it holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    /// Latitude, longitude (degrees), radius (m).
    pub near: Option<(f64, f64, f64)>,
    pub from: Option<i64>,
    pub to: Option<i64>,
    /// Only these sources (empty: every source).
    pub sources: Vec<String>,
}

/// One source's ranges in a rig's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceHit {
    pub source: String,
    pub ranges: Vec<Span>,
    /// The digest coarsened this source's ranges: a range may hold less than it says.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub coarse: bool,
}

/// One rig that holds something there and then.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    pub rig: String,
    /// When its digest was made (rig clock, ns).
    pub digest_at: i64,
    /// When the rig was there (and then); absent without `near`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub there: Option<Vec<Span>>,
    pub sources: Vec<SourceHit>,
}

/// The intersection of two sorted, disjoint span lists.
pub fn intersect(a: &[Span], b: &[Span]) -> Vec<Span> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let from = a[i].from.max(b[j].from);
        let to = a[i].to.min(b[j].to);
        if from < to {
            out.push(Span { from, to });
        }
        if a[i].to < b[j].to {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The times (ns) between `a` and `b` at which the rig, going straight at constant speed, is
/// within `radius_m` of `centre`; `None` if never.
fn segment_within(a: &Point, b: &Point, centre: (f64, f64), radius_m: f64) -> Option<Span> {
    let (ax, ay) = local_m(centre, a.lat, a.lon);
    let (bx, by) = local_m(centre, b.lat, b.lon);
    let (dx, dy) = (bx - ax, by - ay);
    let qa = dx * dx + dy * dy;
    let qb = 2.0 * (ax * dx + ay * dy);
    let qc = ax * ax + ay * ay - radius_m * radius_m;
    let (s1, s2) = if qa == 0.0 {
        if qc > 0.0 {
            return None;
        }
        (0.0, 1.0)
    } else {
        let disc = qb * qb - 4.0 * qa * qc;
        if disc < 0.0 {
            return None;
        }
        let r = disc.sqrt();
        ((-qb - r) / (2.0 * qa), (-qb + r) / (2.0 * qa))
    };
    let (s1, s2) = (s1.max(0.0), s2.min(1.0));
    if s1 > s2 {
        return None;
    }
    let dt = (b.t - a.t) as f64;
    let from = a.t + (s1 * dt).floor() as i64;
    let to = a.t + (s2 * dt).ceil() as i64 + 1;
    Some(Span { from, to })
}

/// When the track puts the rig within `radius_m` of `(lat, lon)`.
pub fn there(track: &[Vec<Point>], lat: f64, lon: f64, radius_m: f64) -> Vec<Span> {
    let mut out = Vec::new();
    for run in track {
        match run.as_slice() {
            [] => {}
            [p] => {
                if haversine_m(lat, lon, p.lat, p.lon) <= radius_m {
                    out.push(Span {
                        from: p.t,
                        to: p.t + 1,
                    });
                }
            }
            points => out.extend(
                points
                    .windows(2)
                    .filter_map(|w| segment_within(&w[0], &w[1], (lat, lon), radius_m)),
            ),
        }
    }
    merge(out)
}

/// The digest's answer to `q`: `None` when the rig holds nothing there and then.
pub fn answer(d: &Digest, q: &Query) -> Option<Hit> {
    let window = Span {
        from: q.from.unwrap_or(i64::MIN),
        to: q.to.unwrap_or(i64::MAX),
    };
    let there_then = match q.near {
        Some((lat, lon, r)) => {
            let t = there(&d.track, lat, lon, r + d.tolerance_m);
            let t = intersect(&t, &[window]);
            if t.is_empty() {
                return None;
            }
            Some(t)
        }
        None => None,
    };
    let when = there_then.clone().unwrap_or_else(|| vec![window]);
    let sources: Vec<SourceHit> = d
        .sources
        .iter()
        .filter(|s| q.sources.is_empty() || q.sources.contains(&s.source))
        .filter_map(|s| {
            let ranges = intersect(&s.ranges, &when);
            (!ranges.is_empty()).then(|| SourceHit {
                source: s.source.clone(),
                ranges,
                coarse: s.coarse,
            })
        })
        .collect();
    (!sources.is_empty()).then(|| Hit {
        rig: d.rig.clone(),
        digest_at: d.at,
        there: there_then,
        sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::digest::Source;

    const S: i64 = 1_000_000_000;
    const T0: i64 = 1_764_800_000 * S;

    fn span(from: i64, to: i64) -> Span {
        Span { from, to }
    }

    fn digest(rig: &str, track: Vec<Vec<Point>>, sources: &[(&str, Vec<Span>)]) -> Digest {
        Digest {
            rig: rig.into(),
            at: T0,
            sources: sources
                .iter()
                .map(|(s, r)| Source {
                    source: s.to_string(),
                    frames: 1,
                    bytes: 1,
                    ranges: r.clone(),
                    coarse: false,
                })
                .collect(),
            track,
            tolerance_m: 0.0,
        }
    }

    fn p(t: i64, lat: f64, lon: f64) -> Point {
        Point { t, lat, lon }
    }

    #[test]
    fn spans_intersect() {
        let a = [span(0, 10), span(20, 30), span(40, 50)];
        let b = [span(5, 25), span(28, 45)];
        assert_eq!(
            intersect(&a, &b),
            vec![span(5, 10), span(20, 25), span(28, 30), span(40, 45)]
        );
        assert!(intersect(&a, &[]).is_empty());
    }

    /// Driving north through a circle of 1 km at 10 m/s: inside for exactly 200 s, centred on
    /// the closest approach, the edges where the haversine says 1 km.
    #[test]
    fn a_straight_drive_through_the_circle_is_there_while_within_the_radius() {
        let (lat0, lon0) = (48.0, 11.0);
        let dlat = 10.0 / 111_195.0; // 10 m per second
        let a = p(T0, lat0 - 1000.0 * dlat, lon0);
        let b = p(T0 + 2000 * S, lat0 + 1000.0 * dlat, lon0);
        let t = there(&[vec![a, b]], lat0, lon0, 1000.0);
        assert_eq!(t.len(), 1);
        let secs = (t[0].to - t[0].from) as f64 / S as f64;
        assert!((secs - 200.0).abs() < 0.5, "{secs}");
        let mid = (t[0].from + t[0].to) / 2;
        assert!((mid - (T0 + 1000 * S)).abs() < S / 2);
        // At the edge times the haversine is the radius.
        for edge in [t[0].from, t[0].to] {
            let s = (edge - T0) as f64 / (2000 * S) as f64;
            let lat = a.lat + s * (b.lat - a.lat);
            let d = haversine_m(lat0, lon0, lat, lon0);
            assert!((d - 1000.0).abs() < 5.0, "{d}");
        }
        // Passing 1.5 km east: never there.
        assert!(there(&[vec![a, b]], lat0, lon0 + 0.02, 1000.0).is_empty());
    }

    #[test]
    fn a_stop_inside_is_there_for_the_whole_stop_and_a_lone_fix_by_haversine() {
        let stop = vec![p(T0, 48.0, 11.0), p(T0 + 3600 * S, 48.0, 11.0)];
        assert_eq!(
            there(&[stop], 48.001, 11.0, 200.0),
            vec![span(T0, T0 + 3600 * S + 1)]
        );
        let lone = vec![p(T0, 48.0, 11.0)];
        assert_eq!(
            there(std::slice::from_ref(&lone), 48.0, 11.001, 100.0),
            vec![span(T0, T0 + 1)]
        );
        assert!(there(&[lone], 48.0, 11.01, 100.0).is_empty());
    }

    /// Three rigs: one parked at the crossing all hour, one that drove past it in the first
    /// half-hour, one parked elsewhere. Each holds the hour in two pieces of camera and the
    /// whole hour of audio.
    #[test]
    fn exactly_the_rigs_and_ranges_there_and_then() {
        let crossing = (48.137, 11.575);
        let held = |_: &str| {
            vec![
                (
                    "cam",
                    vec![span(T0, T0 + 1200 * S), span(T0 + 1500 * S, T0 + 3600 * S)],
                ),
                ("mic", vec![span(T0, T0 + 3600 * S)]),
            ]
        };
        let parked = digest(
            "parked",
            vec![vec![
                p(T0, crossing.0, crossing.1),
                p(T0 + 3600 * S, crossing.0, crossing.1),
            ]],
            &held("parked"),
        );
        // Drives east through the crossing, 2 km in 200 s, passing it at T0 + 600 s.
        let dlon = 1.0 / (111_195.0 * crossing.0.to_radians().cos()); // a metre
        let passer = digest(
            "passer",
            vec![vec![
                p(T0 + 500 * S, crossing.0, crossing.1 - 1000.0 * dlon),
                p(T0 + 700 * S, crossing.0, crossing.1 + 1000.0 * dlon),
                p(T0 + 3600 * S, crossing.0, crossing.1 + 1000.0 * dlon),
            ]],
            &held("passer"),
        );
        let elsewhere = digest(
            "elsewhere",
            vec![vec![p(T0, 48.2, 11.6), p(T0 + 3600 * S, 48.2, 11.6)]],
            &held("elsewhere"),
        );
        let all = [parked, passer, elsewhere];
        let ask = |q: &Query| -> Vec<Hit> { all.iter().filter_map(|d| answer(d, q)).collect() };

        // 100 m around the crossing, any time: parked all hour, the passer for 20 s.
        let q = Query {
            near: Some((crossing.0, crossing.1, 100.0)),
            ..Default::default()
        };
        let hits = ask(&q);
        assert_eq!(
            hits.iter().map(|h| h.rig.as_str()).collect::<Vec<_>>(),
            vec!["parked", "passer"]
        );
        let pass = &hits[1].sources[0].ranges;
        assert_eq!(pass.len(), 1);
        let (from, to) = (pass[0].from, pass[0].to);
        assert!((from - (T0 + 590 * S)).abs() < S / 10, "{from}");
        assert!((to - (T0 + 610 * S)).abs() < S / 10, "{to}");

        // The same place from minute 15 to 30: the passer was gone; parked holds the camera in
        // two pieces (the gap 1200-1500 s is not held) and the audio whole.
        let q = Query {
            near: Some((crossing.0, crossing.1, 100.0)),
            from: Some(T0 + 900 * S),
            to: Some(T0 + 1800 * S),
            sources: vec![],
        };
        let hits = ask(&q);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].rig, "parked");
        assert_eq!(
            hits[0].sources,
            vec![
                SourceHit {
                    source: "cam".into(),
                    ranges: vec![
                        span(T0 + 900 * S, T0 + 1200 * S),
                        span(T0 + 1500 * S, T0 + 1800 * S)
                    ],
                    coarse: false
                },
                SourceHit {
                    source: "mic".into(),
                    ranges: vec![span(T0 + 900 * S, T0 + 1800 * S)],
                    coarse: false
                },
            ]
        );
        // Only the camera, in its gap: nobody.
        let q = Query {
            near: Some((crossing.0, crossing.1, 100.0)),
            from: Some(T0 + 1250 * S),
            to: Some(T0 + 1450 * S),
            sources: vec!["cam".into()],
        };
        assert!(ask(&q).is_empty());
        // No place: every rig over the window; an unknown source: nobody.
        let q = Query {
            from: Some(T0 + 100 * S),
            to: Some(T0 + 200 * S),
            ..Default::default()
        };
        assert_eq!(ask(&q).len(), 3);
        let q = Query {
            sources: vec!["lidar".into()],
            ..Default::default()
        };
        assert!(ask(&q).is_empty());
    }

    #[test]
    fn the_digest_tolerance_widens_the_radius() {
        let mut d = digest(
            "r",
            vec![vec![p(T0, 48.0, 11.0), p(T0 + S, 48.0, 11.0)]],
            &[("cam", vec![span(T0, T0 + S)])],
        );
        let q = Query {
            near: Some((48.0, 11.0 + 120.0 / 74_400.0, 100.0)),
            ..Default::default()
        };
        assert!(answer(&d, &q).is_none());
        d.tolerance_m = 40.0;
        assert!(answer(&d, &q).is_some());
    }
}
