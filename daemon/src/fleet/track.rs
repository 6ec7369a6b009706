//! Where the rig was: the fixes of its NMEA sources ([`crate::nmea`]), taken from their frames on
//! the way into the lane ([`observer`]), thinned as they come ([`Track`], within
//! [`super::digest::TOLERANCE_M`]) and kept for as long as the rig holds anything, in a small file
//! beside the spool so that a restart keeps the places of what was captured before it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::digest::{thin, Point, TOLERANCE_M, TRACK_GAP_NS};
use crate::nmea::{self, FixBuilder};

/// The track kept by the running rig.
#[derive(Debug, Default)]
pub struct Track {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Thinned runs; the last one may still grow.
    runs: Vec<Vec<Point>>,
    /// Fixes after the last run's last point, not thinned yet (the last run's continuation).
    raw: Vec<Point>,
}

impl Inner {
    /// Thins the raw fixes onto the last run (from its last point, so that the pieces join).
    fn settle(&mut self) {
        if self.raw.is_empty() {
            return;
        }
        let raw = std::mem::take(&mut self.raw);
        match self.runs.last_mut() {
            Some(run) if !run.is_empty() => {
                let mut piece = Vec::with_capacity(raw.len() + 1);
                piece.push(*run.last().expect("not empty"));
                piece.extend(raw);
                run.extend(thin(&piece, TOLERANCE_M).into_iter().skip(1));
            }
            _ => self.runs.push(thin(&raw, TOLERANCE_M)),
        }
    }
}

impl Track {
    /// A fix (its capture time, ns). One older than the last is dropped (two receivers' fixes
    /// interleave in time order only); a gap over [`TRACK_GAP_NS`] starts a new run.
    pub fn push(&self, p: Point) {
        let mut t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let last = t
            .raw
            .last()
            .or_else(|| t.runs.last().and_then(|r| r.last()));
        match last {
            Some(l) if p.t <= l.t => {}
            Some(l) if p.t - l.t > TRACK_GAP_NS => {
                t.settle();
                t.runs.push(vec![p]);
            }
            Some(_) => t.raw.push(p),
            None => t.runs.push(vec![p]),
        }
    }

    /// How many runs the track has (a new one: the GPS came back after a gap, or came at all).
    pub fn run_count(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .runs
            .len()
    }

    /// The runs so far (the raw fixes thinned first); points before `since` (ns) forgotten.
    pub fn runs(&self, since: i64) -> Vec<Vec<Point>> {
        let mut t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        t.settle();
        for run in &mut t.runs {
            // The last point before `since` stays: the segment from it reaches into the time held.
            let cut = run.partition_point(|p| p.t < since).saturating_sub(1);
            run.drain(..cut);
        }
        t.runs.retain(|r| r.last().is_some_and(|l| l.t >= since));
        t.runs.clone()
    }

    /// The track as saved by [`Track::save`]; empty when there is no file or it does not read.
    pub fn load(path: &Path) -> Self {
        let runs: Vec<Vec<(i64, f64, f64)>> = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let runs = runs
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|(t, lat, lon)| Point { t, lat, lon })
                    .collect()
            })
            .collect();
        Track {
            inner: Mutex::new(Inner {
                runs,
                raw: Vec::new(),
            }),
        }
    }

    /// Writes `runs` to `path` (a temporary file, synced, renamed over it: a power cut leaves the
    /// old track or the new one).
    pub fn save(path: &Path, runs: &[Vec<Point>]) -> std::io::Result<()> {
        use std::io::Write;
        let plain: Vec<Vec<(i64, f64, f64)>> = runs
            .iter()
            .map(|r| r.iter().map(|p| (p.t, p.lat, p.lon)).collect())
            .collect();
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(&plain).expect("serializes"))?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    }
}

/// Where the track is kept: beside the spool's files.
pub fn file(spool: &Path) -> PathBuf {
    spool.join("fleet-track.json")
}

/// What the lane of an NMEA source calls with each frame ([`crate::pipeline::Observer`]): its
/// fixes go onto `track`.
pub fn observer(track: Arc<Track>) -> crate::pipeline::Observer {
    let fixes = Mutex::new(FixBuilder::default());
    Box::new(move |frame: &rigd_drivers::Frame| {
        let Ok(Some(sentence)) = nmea::parse(&frame.payload) else {
            return;
        };
        let mut fixes = fixes.lock().unwrap_or_else(|e| e.into_inner());
        for f in fixes.push(&sentence, frame.capture_ns, frame.seq) {
            track.push(Point {
                t: f.capture_ns,
                lat: f.latitude,
                lon: f.longitude,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn fixes_are_thinned_as_they_come_and_a_gap_starts_a_run() {
        let t = Track::default();
        for i in 0..600 {
            t.push(Point {
                t: i * S,
                lat: 48.0 + i as f64 * 1e-4,
                lon: 11.0,
            });
        }
        // Older than the last: dropped.
        t.push(Point {
            t: 5 * S,
            lat: 0.0,
            lon: 0.0,
        });
        let runs = t.runs(0);
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].len(), 2, "{:?}", runs[0]);
        t.push(Point {
            t: 599 * S + TRACK_GAP_NS + 1,
            lat: 49.0,
            lon: 11.0,
        });
        let runs = t.runs(0);
        assert_eq!(runs.len(), 2);
        // Forgetting the first run's time keeps its last point before `since`.
        let runs = t.runs(300 * S);
        assert_eq!(runs[0].len(), 2);
        assert_eq!(t.runs(599 * S + TRACK_GAP_NS).len(), 1);
    }

    #[test]
    fn the_track_survives_a_restart_in_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let t = Track::default();
        for i in 0..10 {
            t.push(Point {
                t: i * S,
                lat: 48.0,
                lon: 11.0 + i as f64 * 1e-3 * (i % 3) as f64,
            });
        }
        let runs = t.runs(0);
        Track::save(&file(dir.path()), &runs).unwrap();
        assert_eq!(Track::load(&file(dir.path())).runs(0), runs);
        assert!(Track::load(&dir.path().join("none")).runs(0).is_empty());
    }

    #[test]
    fn the_observer_takes_the_fixes_of_each_frame() {
        let track = Arc::new(Track::default());
        let observe = observer(track.clone());
        let sum = |b: &str| format!("${b}*{:02X}\r\n", b.bytes().fold(0u8, |a, x| a ^ x));
        for (i, lat) in ["4807.000", "4808.000"].iter().enumerate() {
            let rec = sum(&format!(
                "GPRMC,12000{i}.00,A,{lat},N,01131.000,E,0,0,061226,,"
            ));
            observe(&rigd_drivers::Frame {
                source: "gps".into(),
                seq: i as u64,
                capture_ns: (i as i64 + 1) * S,
                clock: rigd_drivers::ClockState::Unsynced,
                media: rigd_drivers::Media::Serial { text: true },
                payload: rec.into_bytes().into(),
            });
        }
        // Garbage on the line is no fix and no panic.
        observe(&rigd_drivers::Frame {
            source: "gps".into(),
            seq: 2,
            capture_ns: 3 * S,
            clock: rigd_drivers::ClockState::Unsynced,
            media: rigd_drivers::Media::Serial { text: true },
            payload: bytes::Bytes::from_static(b"\xff\x00$GPRMC,garbage"),
        });
        let runs = track.runs(0);
        assert_eq!(runs[0].len(), 2, "{runs:?}");
        assert!((runs[0][1].lat - (48.0 + 8.0 / 60.0)).abs() < 1e-9);
    }
}
