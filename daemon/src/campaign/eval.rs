//! A campaign's condition evaluated as the rig's inputs arrive, and what each trigger becomes, pure:
//! time, fixes, levels and markers are inputs, triggers and windows are outputs.
//!
//! Every leaf condition has a *level* (true while it holds: inside a fence, above a speed, loud for
//! long enough, a source silent) or gives a *pulse* (true at one input only: entering or leaving a
//! fence, a marker, the clock leaving `locked`). `all`/`any` combine them; the campaign triggers
//! when the combination turns true (a pulse turns it true at its input). The trigger's time is the
//! input's: the fix's or the marker's capture time, the end of the audio block that completed the
//! loud run, the tick's for the clock and a stall.
//!
//! [`Ledger`] turns triggers into windows `[t - before, t + after)`: none within `gap` of the last
//! trigger, none past the expiry or while the day's quota is spent, each starting where the last
//! ended if they overlap (merged: a frame is in one window at most). It also counts the quota's
//! bytes per UTC day of the rig clock.

use serde::{Deserialize, Serialize};

use super::spec::{Campaign, Condition, Fence};

const DAY_NS: i64 = 86_400 * 1_000_000_000;

/// What the rig saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Input<'a> {
    /// A GPS fix of a serial source (degrees), captured at `t`.
    Fix {
        source: &'a str,
        t: i64,
        lat: f64,
        lon: f64,
    },
    /// An audio block captured at `t`, `dur_ns` long, at `dbfs` (RMS).
    Audio {
        source: &'a str,
        t: i64,
        dur_ns: i64,
        dbfs: f64,
    },
    /// A technician's marker.
    Marker { t: i64, note: &'a str },
    /// The rig clock's time and lock, and each source's time since its last frame.
    Tick {
        t: i64,
        locked: bool,
        silent: &'a [(String, i64)],
    },
}

/// One leaf's condition and its state.
#[derive(Debug, Clone)]
struct Leaf {
    cond: Condition,
    level: bool,
    pulse: bool,
    /// Speed: the previous fix `(t, lat, lon)`.
    last_fix: Option<(i64, f64, f64)>,
    /// Geofence: whether the previous fix was inside.
    inside: Option<bool>,
    /// Audio: when the present loud run started.
    loud_since: Option<i64>,
    /// Clock: whether it was locked at the previous tick.
    locked: Option<bool>,
}

#[derive(Debug, Clone)]
enum Node {
    Leaf(Box<Leaf>),
    All(Vec<Node>),
    Any(Vec<Node>),
}

/// A campaign's condition with its state.
#[derive(Debug, Clone)]
pub struct Evaluator {
    root: Node,
    was: bool,
}

fn node(c: &Condition) -> Node {
    match c {
        Condition::All(cs) => Node::All(cs.iter().map(node).collect()),
        Condition::Any(cs) => Node::Any(cs.iter().map(node).collect()),
        leaf => Node::Leaf(Box::new(Leaf {
            cond: leaf.clone(),
            level: false,
            pulse: false,
            last_fix: None,
            inside: None,
            loud_since: None,
            locked: None,
        })),
    }
}

impl Node {
    fn value(&self) -> bool {
        match self {
            Node::Leaf(l) => l.level || l.pulse,
            Node::All(ns) => ns.iter().all(Node::value),
            Node::Any(ns) => ns.iter().any(Node::value),
        }
    }

    fn each(&mut self, f: &mut impl FnMut(&mut Leaf)) {
        match self {
            Node::Leaf(l) => f(l),
            Node::All(ns) | Node::Any(ns) => ns.iter_mut().for_each(|n| n.each(f)),
        }
    }
}

/// Metres between two fixes (haversine, spherical Earth of radius 6,371 km).
pub fn distance_m(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (la1, la2) = (a.0.to_radians(), b.0.to_radians());
    let (dla, dlo) = ((b.0 - a.0).to_radians(), (b.1 - a.1).to_radians());
    let h = (dla / 2.0).sin().powi(2) + la1.cos() * la2.cos() * (dlo / 2.0).sin().powi(2);
    2.0 * 6_371_000.0 * h.sqrt().asin()
}

/// Whether `(lat, lon)` lies inside `polygon` (`[lat, lon]` vertices; even-odd rule, a point on
/// an edge counted by which side of it rounding puts it).
pub fn inside(polygon: &[[f64; 2]], lat: f64, lon: f64) -> bool {
    let mut inside = false;
    let mut j = polygon.len() - 1;
    for i in 0..polygon.len() {
        let ([yi, xi], [yj, xj]) = (polygon[i], polygon[j]);
        if (yi > lat) != (yj > lat) && lon < (xj - xi) * (lat - yi) / (yj - yi) + xi {
            inside = !inside;
        }
        j = i;
    }
    inside
}

impl Leaf {
    /// Takes one input; returns whether it concerned this leaf.
    fn input(&mut self, input: &Input) -> bool {
        match (&self.cond, *input) {
            (
                Condition::Speed {
                    source,
                    above_kmh,
                    below_kmh,
                },
                Input::Fix {
                    source: s,
                    t,
                    lat,
                    lon,
                },
            ) if source == s => {
                if let Some((t0, lat0, lon0)) = self.last_fix {
                    // A GGA and an RMC of one fix come together: speed over at least 50 ms.
                    if t - t0 < 50_000_000 {
                        return false;
                    }
                    let kmh = distance_m((lat0, lon0), (lat, lon)) / ((t - t0) as f64 / 1e9) * 3.6;
                    self.level = match (above_kmh, below_kmh) {
                        (Some(a), _) => kmh > *a,
                        (_, Some(b)) => kmh < *b,
                        _ => false,
                    };
                }
                self.last_fix = Some((t, lat, lon));
                true
            }
            (
                Condition::Geofence {
                    source,
                    polygon,
                    on,
                },
                Input::Fix {
                    source: s,
                    lat,
                    lon,
                    ..
                },
            ) if source == s => {
                let now = inside(polygon, lat, lon);
                let before = self.inside.replace(now);
                match on {
                    Fence::Inside => self.level = now,
                    Fence::Enter => self.pulse = now && before == Some(false),
                    Fence::Leave => self.pulse = !now && before == Some(true),
                }
                true
            }
            (
                Condition::Audio {
                    source,
                    above_dbfs,
                    for_s,
                },
                Input::Audio {
                    source: s,
                    t,
                    dur_ns,
                    dbfs,
                },
            ) if source == s => {
                if dbfs > *above_dbfs {
                    let since = *self.loud_since.get_or_insert(t);
                    self.level = t + dur_ns - since >= (for_s * 1e9) as i64;
                } else {
                    self.loud_since = None;
                    self.level = false;
                }
                true
            }
            (Condition::Marker { note }, Input::Marker { note: n, .. }) => {
                self.pulse = note.as_deref().is_none_or(|want| n.contains(want));
                true
            }
            (Condition::ClockUnlocked {}, Input::Tick { locked, .. }) => {
                let before = self.locked.replace(locked);
                self.pulse = before == Some(true) && !locked;
                true
            }
            (Condition::Stall { source, for_s }, Input::Tick { silent, .. }) => {
                self.level = silent
                    .iter()
                    .find(|(s, _)| s == source)
                    .is_some_and(|(_, ns)| *ns >= (for_s * 1e9) as i64);
                true
            }
            _ => false,
        }
    }
}

impl Evaluator {
    pub fn new(when: &Condition) -> Self {
        Evaluator {
            root: node(when),
            was: false,
        }
    }

    /// Takes one input: the trigger's time when the condition turns true with it.
    pub fn input(&mut self, input: &Input) -> Option<i64> {
        let mut touched = false;
        self.root.each(&mut |l| touched |= l.input(input));
        if !touched {
            return None;
        }
        let now = self.root.value();
        let fired = now && !self.was;
        // Pulses last for their input only.
        self.root.each(&mut |l| l.pulse = false);
        self.was = self.root.value();
        fired.then(|| match *input {
            Input::Audio { t, dur_ns, .. } => t + dur_ns,
            Input::Fix { t, .. } | Input::Marker { t, .. } | Input::Tick { t, .. } => t,
        })
    }
}

/// A window to upload, `[from, to)` ns on the rig clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub from: i64,
    pub to: i64,
}

/// What a trigger became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Window(Window),
    /// Within `gap` of the last trigger.
    Gap,
    /// The day's quota is spent.
    Quota,
    /// Past the campaign's expiry.
    Expired,
    /// Its whole window is in the last one already (merged).
    Covered,
}

/// A campaign's counts and what it has uploaded, persisted with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    pub triggers: u64,
    pub windows: u64,
    pub skipped_gap: u64,
    pub skipped_quota: u64,
    pub merged: u64,
    pub last_trigger_ns: Option<i64>,
    /// The end of the last window: the next starts here at the earliest.
    pub covered_to: i64,
    /// The UTC day (rig clock, days since 1970) the quota counts.
    pub day: i64,
    /// Payload bytes handed to the broker this day, and since the campaign began.
    pub bytes_today: u64,
    pub bytes_total: u64,
    /// The day's quota is spent: no more windows or frames this day.
    pub quota_reached: bool,
}

impl Ledger {
    fn roll(&mut self, now: i64) {
        let day = now.div_euclid(DAY_NS);
        if day != self.day {
            self.day = day;
            self.bytes_today = 0;
            self.quota_reached = false;
        }
    }

    /// What a trigger at `t` becomes.
    pub fn trigger(&mut self, c: &Campaign, t: i64) -> Decision {
        if c.expires_ns.is_some_and(|e| t >= e) {
            return Decision::Expired;
        }
        self.triggers += 1;
        if self
            .last_trigger_ns
            .is_some_and(|last| t.saturating_sub(last) < c.gap_ns)
        {
            self.skipped_gap += 1;
            return Decision::Gap;
        }
        self.last_trigger_ns = Some(t);
        self.roll(t);
        if self.quota_reached {
            self.skipped_quota += 1;
            return Decision::Quota;
        }
        let to = t.saturating_add(c.after_ns);
        let from = t.saturating_sub(c.before_ns).max(self.covered_to);
        if from >= to {
            self.merged += 1;
            return Decision::Covered;
        }
        if from > t.saturating_sub(c.before_ns) {
            self.merged += 1;
        }
        self.covered_to = to;
        self.windows += 1;
        Decision::Window(Window { from, to })
    }

    /// Whether a frame of `bytes` may go at rig time `now` within the day's quota; counted if so.
    /// The first that does not fit spends the day's quota: nothing more goes that day.
    pub fn take(&mut self, c: &Campaign, now: i64, bytes: u64) -> bool {
        self.roll(now);
        if self.quota_reached || self.bytes_today.saturating_add(bytes) > c.quota_bytes {
            self.quota_reached = true;
            return false;
        }
        self.bytes_today += bytes;
        self.bytes_total += bytes;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn campaign(when: Condition) -> Campaign {
        Campaign {
            id: "c".into(),
            when,
            sources: vec!["cam".into()],
            before_ns: 2 * S,
            after_ns: 3 * S,
            gap_ns: 10 * S,
            priority: 5,
            quota_bytes: 1000,
            expires_ns: Some(1000 * S),
        }
    }

    fn square() -> Vec<[f64; 2]> {
        vec![[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]]
    }

    fn fence(on: Fence) -> Condition {
        Condition::Geofence {
            source: "gps".into(),
            polygon: square(),
            on,
        }
    }

    fn fix(t: i64, lat: f64, lon: f64) -> Input<'static> {
        Input::Fix {
            source: "gps",
            t,
            lat,
            lon,
        }
    }

    /// The triggers of `inputs`.
    fn run(c: &Condition, inputs: &[Input]) -> Vec<i64> {
        let mut e = Evaluator::new(c);
        inputs.iter().filter_map(|i| e.input(i)).collect()
    }

    #[test]
    fn a_geofence_triggers_on_entering_and_leaving_not_on_a_first_fix_inside() {
        let track = [
            fix(1, 0.5, 0.5), // inside from the start: not an entry
            fix(2, 2.0, 0.5),
            fix(3, 0.5, 0.5), // enters
            fix(4, 0.6, 0.5),
            fix(5, 0.5, 1.5), // leaves
            fix(6, 0.5, 0.9), // enters again
        ];
        assert_eq!(run(&fence(Fence::Enter), &track), [3, 6]);
        assert_eq!(run(&fence(Fence::Leave), &track), [2, 5]);
        assert_eq!(run(&fence(Fence::Inside), &track), [1, 3, 6]);
        // Another source's fixes say nothing.
        let other = Input::Fix {
            source: "gps2",
            t: 9,
            lat: 0.5,
            lon: 0.5,
        };
        assert_eq!(run(&fence(Fence::Inside), &[other]), Vec::<i64>::new());
        // A concave polygon: the notch is outside.
        let u = [
            [0.0, 0.0],
            [0.0, 3.0],
            [3.0, 3.0],
            [3.0, 2.0],
            [1.0, 2.0],
            [1.0, 1.0],
            [3.0, 1.0],
            [3.0, 0.0],
        ];
        assert!(inside(&u, 0.5, 1.5) && !inside(&u, 2.0, 1.5) && inside(&u, 2.0, 2.5));
    }

    #[test]
    fn speed_is_measured_between_fixes_and_triggers_when_it_crosses() {
        let above = Condition::Speed {
            source: "gps".into(),
            above_kmh: Some(50.0),
            below_kmh: None,
        };
        // 0.0001 degree of latitude is 11.1 m: in 1 s, 40 km/h; in 0.5 s, 80 km/h.
        let track = [
            fix(0, 0.0, 0.0),
            fix(S, 0.0001, 0.0),
            fix(S + S / 2, 0.0002, 0.0),      // 80 km/h: triggers
            fix(S + S / 2 + 10, 0.0002, 0.0), // 10 ns later: the same fix again, ignored
            fix(2 * S, 0.0003, 0.0),          // still fast
            fix(4 * S, 0.0004, 0.0),          // 20 km/h
            fix(4 * S + S / 2, 0.0005, 0.0),  // fast again
        ];
        assert_eq!(run(&above, &track), [S + S / 2, 4 * S + S / 2]);
        let below = Condition::Speed {
            source: "gps".into(),
            above_kmh: None,
            below_kmh: Some(30.0),
        };
        assert_eq!(run(&below, &track), [4 * S]);
    }

    #[test]
    fn audio_triggers_once_loud_for_the_duration_without_a_break() {
        let loud = Condition::Audio {
            source: "mic".into(),
            above_dbfs: -10.0,
            for_s: 0.1,
        };
        let block = |i: i64, dbfs: f64| Input::Audio {
            source: "mic",
            t: i * 33_000_000,
            dur_ns: 33_000_000,
            dbfs,
        };
        // Loud for 2 blocks (66 ms: not enough), a quiet one, then loud for 4: the run began at
        // 132 ms, block 6 ends at 231 ms (99 ms: not yet), block 7 at 264 ms.
        let levels = [-30.0, -3.0, -3.0, -30.0, -3.0, -3.0, -3.0, -3.0, -30.0];
        let inputs: Vec<Input> = levels
            .iter()
            .enumerate()
            .map(|(i, &d)| block(i as i64, d))
            .collect();
        assert_eq!(run(&loud, &inputs), [8 * 33_000_000]);
    }

    #[test]
    fn all_and_any_combine_levels_and_pulses() {
        let marker = Condition::Marker {
            note: Some("brake".into()),
        };
        let both = Condition::All(vec![fence(Fence::Inside), marker.clone()]);
        let m = |t, note| Input::Marker { t, note };
        let inputs = [
            m(1, "brake"),      // outside: no
            fix(2, 0.5, 0.5),   // inside
            m(3, "pothole"),    // not the note
            m(4, "hard brake"), // yes
            m(5, "brake"),      // again: a pulse each time
            fix(6, 2.0, 0.5),
            m(7, "brake"), // outside again
        ];
        assert_eq!(run(&both, &inputs), [4, 5]);
        let either = Condition::Any(vec![fence(Fence::Enter), marker]);
        assert_eq!(run(&either, &inputs), [1, 4, 5, 7]);
    }

    #[test]
    fn the_clock_leaving_locked_and_a_stall_trigger_on_ticks() {
        let tick = |t, locked, silent: &'static [(String, i64)]| Input::Tick { t, locked, silent };
        let none: &'static [(String, i64)] = &[];
        let unlocked = Condition::ClockUnlocked {};
        let inputs = [
            tick(1, false, none),
            tick(2, true, none),
            tick(3, false, none),
            tick(4, false, none),
        ];
        assert_eq!(
            run(&unlocked, &inputs),
            [3],
            "never locked is not leaving it"
        );
        let stall = Condition::Stall {
            source: "cam".into(),
            for_s: 2.0,
        };
        let quiet: &'static [(String, i64)] = Box::leak(Box::new([("cam".to_string(), S)]));
        let stalled: &'static [(String, i64)] = Box::leak(Box::new([("cam".to_string(), 3 * S)]));
        let inputs = [
            tick(1, true, quiet),
            tick(2, true, stalled),
            tick(3, true, stalled),
            tick(4, true, quiet),
            tick(5, true, stalled),
        ];
        assert_eq!(run(&stall, &inputs), [2, 5]);
    }

    #[test]
    fn windows_keep_the_gap_merge_overlaps_and_stop_at_the_expiry() {
        let c = campaign(Condition::ClockUnlocked {});
        let mut l = Ledger::default();
        assert_eq!(
            l.trigger(&c, 100 * S),
            Decision::Window(Window {
                from: 98 * S,
                to: 103 * S
            })
        );
        assert_eq!(l.trigger(&c, 105 * S), Decision::Gap, "within 10 s");
        // A campaign without a gap: the next window starts where the last ended.
        let c0 = Campaign {
            gap_ns: 0,
            ..c.clone()
        };
        assert_eq!(
            l.trigger(&c0, 104 * S),
            Decision::Window(Window {
                from: 103 * S,
                to: 107 * S
            })
        );
        assert_eq!(l.trigger(&c0, 104 * S), Decision::Covered);
        assert_eq!(l.trigger(&c, 1000 * S), Decision::Expired);
        assert_eq!(
            (l.triggers, l.windows, l.skipped_gap, l.merged),
            (4, 2, 1, 2)
        );
    }

    #[test]
    fn the_quota_counts_what_goes_and_stops_at_the_first_frame_that_does_not_fit_until_the_next_day(
    ) {
        let c = Campaign {
            expires_ns: None,
            ..campaign(Condition::ClockUnlocked {})
        };
        let mut l = Ledger::default();
        let day = 20_000 * DAY_NS;
        assert!(l.take(&c, day, 600));
        assert!(l.take(&c, day + 1, 395));
        assert!(!l.take(&c, day + 2, 10), "995 + 10 is over 1000");
        assert!(l.quota_reached);
        assert!(
            !l.take(&c, day + 3, 1),
            "spent: not even a byte more that day"
        );
        assert_eq!(l.bytes_today, 995, "within 1 % of the quota");
        assert_eq!(l.trigger(&c, day + 5), Decision::Quota);
        // The next UTC day starts over.
        assert!(l.take(&c, day + DAY_NS, 10));
        assert_eq!(
            (l.bytes_today, l.bytes_total, l.quota_reached),
            (10, 1005, false)
        );
    }
}
