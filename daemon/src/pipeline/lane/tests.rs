//! The lane against a model of its world: a spool (a set of seqs, commit epochs), producers
//! (a window of seqs, connected or not) and a broker (the seqs acked). The task's part is
//! performed here as `task.rs` performs it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;

use super::*;

#[derive(Debug, Default)]
struct Prod {
    connected: bool,
    window: VecDeque<u64>,
    /// The last seq it took: a producer takes a source's frames in capture order.
    last: Option<u64>,
}

const WINDOW: usize = 4;

impl Prod {
    fn take(&mut self, seq: u64) -> bool {
        let ok = self.connected && self.window.len() < WINDOW;
        if ok {
            assert!(
                self.last.is_none_or(|l| seq > l),
                "{seq} after {:?}: out of capture order",
                self.last
            );
            self.last = Some(seq);
            self.window.push_back(seq);
        }
        ok
    }
}

struct World {
    lane: Lane,
    mode: SpoolMode,
    drain: Drain,
    spool: BTreeSet<u64>,
    /// The commit epoch appends go into; everything before `durable` is durable.
    epoch: u64,
    durable: u64,
    producers: BTreeMap<u64, Prod>,
    /// Persisted epoch starts (after 0).
    persisted: Vec<u64>,
    acked: BTreeMap<u64, u32>,
    dropped: BTreeSet<u64>,
    next: u64,
    paused: bool,
    /// The spool refuses appends (full under drop-newest, or a write error).
    full: bool,
    /// Splits cannot be persisted.
    split_fails: bool,
    splits: usize,
    /// Frames per group of pictures (a keyframe every `gop` seqs); 1: no video.
    gop: u64,
    /// Frames the lane lost at capture (not admitted, refused by a full spool): their groups broke.
    broke: BTreeSet<u64>,
    /// Every seq a producer took (live or drained), in the order taken.
    taken: Vec<u64>,
    /// The keyframes captured: every `gop` frames, and the first of a run (an encoder starts
    /// with one).
    keyframes: BTreeSet<u64>,
    /// The next frame captured starts a run.
    run_starts: bool,
}

impl World {
    fn new(mode: SpoolMode, drain: Drain) -> Self {
        let mut w = World {
            lane: Lane::open(
                Opening {
                    mode,
                    drain,
                    uplink: true,
                    persisted: Some(&[]),
                    next_seq: Some(0),
                },
                |_| None,
            )
            .0,
            mode,
            drain,
            spool: BTreeSet::new(),
            epoch: 1,
            durable: 1,
            producers: BTreeMap::new(),
            persisted: Vec::new(),
            acked: BTreeMap::new(),
            dropped: BTreeSet::new(),
            next: 0,
            paused: false,
            full: false,
            split_fails: false,
            splits: 0,
            gop: 1,
            broke: BTreeSet::new(),
            taken: Vec::new(),
            keyframes: BTreeSet::new(),
            run_starts: true,
        };
        w.restart();
        w
    }

    fn link(producers: &BTreeMap<u64, Prod>, start: u64) -> Link {
        producers
            .get(&start)
            .map(|p| Link {
                connected: p.connected,
                held: p.window.len(),
            })
            .unwrap_or_default()
    }

    /// A stop and a start: what the producers hold goes to the spool; the lane opens on it.
    fn restart(&mut self) {
        for (_, p) in std::mem::take(&mut self.producers) {
            for seq in p.window {
                self.append(seq);
            }
        }
        let spool = &self.spool;
        let (lane, actions) = Lane::open(
            Opening {
                mode: self.mode,
                drain: self.drain,
                uplink: true,
                persisted: Some(&self.persisted),
                next_seq: Some(self.next),
            },
            |from| spool.range(from..).next().copied(),
        );
        self.lane = lane;
        self.run_starts = true;
        // A restart after a commit: what it held is durable.
        self.epoch += 1;
        self.durable = self.epoch;
        for a in actions {
            self.perform(a);
        }
    }

    /// Appends `seq`: stored (true) or dropped.
    fn append(&mut self, seq: u64) -> bool {
        if self.spool.contains(&seq) {
            return true;
        }
        if self.full {
            self.dropped.insert(seq);
            return false;
        }
        self.spool.insert(seq);
        true
    }

    fn capture(&mut self, admitted: bool) {
        let seq = self.next;
        self.next += 1;
        let keyframe = std::mem::take(&mut self.run_starts)
            || self.keyframes.last().is_none_or(|&k| seq - k >= self.gop);
        if keyframe {
            self.keyframes.insert(seq);
        }
        let picture = match (self.gop, keyframe) {
            (1, _) => Picture::Whole,
            (_, true) => Picture::Key,
            (_, false) => Picture::Delta,
        };
        let mut capture = self
            .lane
            .captured_in_group(seq, picture, admitted, self.paused);
        if let Capture::SplitFirst { start } = capture {
            assert!(
                keyframe && self.gop > 1,
                "{seq}: a split waits for a keyframe"
            );
            self.perform(Action::PersistEpoch { start });
            capture = self
                .lane
                .captured_in_group(seq, picture, admitted, self.paused);
        }
        let spill = match capture {
            Capture::SplitFirst { .. } => panic!("{seq}: asked to split twice"),
            Capture::Drop => {
                self.dropped.insert(seq);
                self.broke.insert(seq);
                false
            }
            Capture::Skip => {
                assert!(!keyframe, "{seq}: a keyframe skipped");
                self.dropped.insert(seq);
                false
            }
            Capture::Submit { start } => {
                let p = self
                    .producers
                    .get_mut(&start)
                    .expect("submits to an open epoch");
                if p.take(seq) {
                    self.taken.push(seq);
                    false
                } else {
                    self.lane.refused(seq);
                    true
                }
            }
            Capture::Spool => true,
        };
        if spill {
            let stored = self.append(seq);
            if !stored {
                self.broke.insert(seq);
                self.lane.lost(seq);
            }
            let live = Self::link(&self.producers, self.lane.live());
            self.lane
                .spooled(seq, stored.then_some(self.epoch), self.paused, live);
        }
    }

    fn ack(&mut self, start: u64) {
        let Some(seq) = self
            .producers
            .get_mut(&start)
            .filter(|p| p.connected)
            .and_then(|p| p.window.pop_front())
        else {
            return;
        };
        *self.acked.entry(seq).or_default() += 1;
        if self.lane.acked(seq) {
            assert!(
                self.spool.remove(&seq),
                "{seq} removed but not in the spool"
            );
        }
    }

    fn perform(&mut self, a: Action) {
        match a {
            Action::Open { start, .. } => {
                assert!(self.producers.insert(start, Prod::default()).is_none());
            }
            Action::PersistEpoch { start } => {
                let ok = !self.split_fails;
                if ok {
                    self.persisted.push(start);
                    self.splits += 1;
                }
                for a in self.lane.split(start, ok) {
                    self.perform(a);
                }
            }
            Action::ToBacklog { start } => assert!(self.producers.contains_key(&start)),
            Action::Drain { start, from } => {
                let seqs: Vec<u64> = self.spool.range(from..).copied().collect();
                if seqs.is_empty() {
                    self.lane.caught_up(start);
                }
                for seq in seqs {
                    if self.lane.offer(start, seq) != Offer::Hand {
                        break;
                    }
                    if !self.producers.get_mut(&start).unwrap().take(seq) {
                        break;
                    }
                    self.taken.push(seq);
                    self.lane.handed_over(start, seq);
                }
            }
        }
    }

    /// A turn of the task after an event.
    fn turn(&mut self) {
        for _ in 0..2 {
            let producers = &self.producers;
            let actions = self
                .lane
                .poll(self.durable, self.paused, |s| Self::link(producers, s));
            let split = actions
                .iter()
                .any(|a| matches!(a, Action::PersistEpoch { .. }));
            for a in actions {
                self.perform(a);
            }
            if !split {
                break;
            }
        }
        loop {
            let producers = &self.producers;
            let Some(start) = self.lane.retire(|s| Self::link(producers, s)) else {
                break;
            };
            let p = self.producers.remove(&start).unwrap();
            for seq in p.window {
                self.append(seq);
            }
        }
    }

    fn commit(&mut self) {
        self.epoch += 1;
        self.durable = self.epoch;
    }

    /// Every seq captured so far is in exactly one place: acked once, dropped, or held (in the
    /// spool and/or a producer's window: a drained frame is in both until its ack).
    fn check(&self) {
        // No delta goes out after a frame of its group was lost at capture.
        for &seq in &self.taken {
            let group = self
                .keyframes
                .range(..=seq)
                .next_back()
                .copied()
                .unwrap_or(0);
            if let Some(lost) = self.broke.range(group..seq).next() {
                panic!("{seq} published though {lost} of its group (from {group}) was lost");
            }
        }
        // A split of a video source starts at a keyframe.
        for &start in &self.persisted {
            assert!(
                // A split made at a start, before the run's first frame (always a keyframe).
                self.gop == 1
                    || self.keyframes.contains(&start)
                    || (start == self.next && self.run_starts),
                "a split at {start} cuts a group"
            );
        }
        let mut held = self.spool.clone();
        for p in self.producers.values() {
            held.extend(p.window.iter().copied());
        }
        for seq in 0..self.next {
            let acked = self.acked.get(&seq).copied().unwrap_or(0);
            assert!(acked <= 1, "{seq} published {acked} times");
            let places =
                (acked == 1) as u8 + self.dropped.contains(&seq) as u8 + held.contains(&seq) as u8;
            assert_eq!(
                places,
                1,
                "{seq}: acked {acked}, dropped {}, held {}",
                self.dropped.contains(&seq),
                held.contains(&seq)
            );
        }
    }

    /// Link up, nothing paused, commits and acks until nothing moves: everything ends acked or
    /// dropped, the spool empty.
    fn settle(&mut self) {
        self.paused = false;
        self.full = false;
        for p in self.producers.values_mut() {
            p.connected = true;
        }
        for _ in 0..10_000 {
            self.commit();
            self.turn();
            let starts: Vec<u64> = self.producers.keys().copied().collect();
            for s in starts {
                if let Some(p) = self.producers.get_mut(&s) {
                    p.connected = true;
                }
                while self.producers.get(&s).is_some_and(|p| !p.window.is_empty()) {
                    self.ack(s);
                }
            }
            self.turn();
            self.check();
            if self.spool.is_empty() && self.producers.values().all(|p| p.window.is_empty()) {
                break;
            }
        }
        assert!(self.spool.is_empty(), "left in the spool: {:?}", self.spool);
        for seq in 0..self.next {
            assert!(
                self.acked.get(&seq) == Some(&1) || self.dropped.contains(&seq),
                "{seq} neither acked nor dropped"
            );
        }
    }

    fn set_link(&mut self, start: Option<u64>, up: bool) {
        let start = start.unwrap_or(self.lane.live());
        if let Some(p) = self.producers.get_mut(&start) {
            p.connected = up;
        }
    }
}

fn world(mode: SpoolMode) -> World {
    World::new(mode, Drain::LiveFirst)
}

#[test]
fn an_outage_then_the_link_back_splits() {
    let mut w = world(SpoolMode::OnOutage);
    w.set_link(None, true);
    w.turn();
    w.capture(true);
    w.ack(0);
    // The link drops: frames spool (an outage, the producer was up before).
    w.set_link(None, false);
    for _ in 0..5 {
        w.capture(true);
        w.turn();
    }
    assert_eq!(w.spool.len(), 5);
    assert_eq!(w.splits, 0);
    w.set_link(None, true);
    w.turn();
    assert_eq!(
        w.splits, 1,
        "live frames overtake the backlog under a new epoch"
    );
    assert_eq!(w.persisted, [6]);
    assert_eq!(w.lane.live(), 6);
    // New frames go live under the new epoch (once its producer is up) while epoch 0 drains
    // its backlog.
    w.set_link(None, true);
    w.turn();
    w.capture(true);
    assert_eq!(w.producers[&6].window, [6]);
    assert!(!w.producers[&0].window.is_empty());
    w.settle();
    w.check();
}

#[test]
fn waiting_for_bandwidth_never_splits() {
    let mut w = world(SpoolMode::OnOutage);
    w.set_link(None, true);
    w.turn();
    // The window is full while the link is up: frames wait in the spool, no outage.
    for _ in 0..(WINDOW + 6) {
        w.capture(true);
        w.turn();
    }
    assert!(!w.spool.is_empty());
    for _ in 0..20 {
        w.ack(0);
        w.turn();
        w.capture(true);
        w.turn();
    }
    assert_eq!(w.splits, 0);
    assert!(w.persisted.is_empty());
    w.settle();
    assert_eq!(w.splits, 0);
}

#[test]
fn a_producer_still_connecting_is_no_outage() {
    let mut w = world(SpoolMode::OnOutage);
    // Never up yet: frames spool, and when it connects they drain in order, no split.
    for _ in 0..3 {
        w.capture(true);
        w.turn();
    }
    w.set_link(None, true);
    w.turn();
    assert_eq!(w.splits, 0);
    assert_eq!(w.producers[&0].window, [0, 1, 2]);
}

#[test]
fn always_mode_hands_over_only_what_a_commit_made_durable() {
    let mut w = world(SpoolMode::Always);
    w.set_link(None, true);
    w.turn();
    w.capture(true);
    w.capture(true);
    w.turn();
    assert!(
        w.producers[&0].window.is_empty(),
        "nothing before its commit is durable"
    );
    w.commit();
    w.turn();
    assert_eq!(w.producers[&0].window, [0, 1]);
    w.capture(true);
    w.turn();
    assert_eq!(w.producers[&0].window, [0, 1]);
    // An outage in always mode never splits: the spool is the only path, in order.
    w.set_link(None, false);
    w.capture(true);
    w.set_link(None, true);
    w.commit();
    w.turn();
    assert_eq!(w.splits, 0);
    assert_eq!(w.producers[&0].window, [0, 1, 2, 3]);
    w.settle();
}

#[test]
fn an_ack_lost_with_a_closed_producer_keeps_the_frame_in_the_spool() {
    let mut w = world(SpoolMode::OnOutage);
    for _ in 0..3 {
        w.capture(true);
    }
    w.set_link(None, true);
    w.turn();
    assert_eq!(w.producers[&0].window, [0, 1, 2]);
    // The receipts of 0 and 1 were lost with a connection; 2's arrives: 2 leaves the spool, 0
    // and 1 stay (they go again, and the broker's deduplication drops what it has).
    let p = w.producers.get_mut(&0).unwrap();
    p.window.pop_front();
    p.window.pop_front();
    w.ack(0);
    assert_eq!(w.spool, BTreeSet::from([0, 1]));
    assert!(
        !w.lane.acked(0) && !w.lane.acked(1),
        "their acks no longer remove them"
    );
}

#[test]
fn a_split_that_cannot_be_persisted_drains_in_order() {
    let mut w = world(SpoolMode::OnOutage);
    w.split_fails = true;
    w.set_link(None, true);
    w.turn();
    w.capture(true);
    w.set_link(None, false);
    w.capture(true);
    w.set_link(None, true);
    w.turn();
    assert_eq!(w.splits, 0);
    assert_eq!(w.lane.live(), 0);
    w.settle();
}

#[test]
fn a_number_past_the_floor_is_dropped_and_nothing_else() {
    let mut w = world(SpoolMode::OnOutage);
    w.set_link(None, true);
    w.turn();
    w.capture(false);
    w.capture(true);
    assert!(w.dropped.contains(&0));
    assert_eq!(w.producers[&0].window, [1]);
    w.check();
}

#[test]
fn a_lane_opened_without_the_next_seq_hands_over_nothing_before_its_commit() {
    // Issue 46: when the spool could not say the next seq, the task opened the lane with
    // `u64::MAX`: in `always` mode every spooled frame, this run's too, could be handed over
    // before its commit was durable; in `on-outage` mode a split was persisted at u64::MAX.
    let up = |_| Link {
        connected: true,
        held: 0,
    };
    let earlier: BTreeSet<u64> = (5..9).collect();
    let open = |mode| {
        Lane::open(
            Opening {
                mode,
                drain: Drain::LiveFirst,
                uplink: true,
                persisted: Some(&[]),
                next_seq: None,
            },
            |from| earlier.range(from..).next().copied(),
        )
        .0
    };
    let mut lane = open(SpoolMode::Always);
    assert_eq!(lane.captured(9, true, false), Capture::Spool);
    lane.spooled(9, Some(3), false, up(0));
    // Commit 3 is not durable yet: the earlier run's frames (durable) go, frame 9 waits.
    assert_eq!(
        lane.poll(3, false, up),
        vec![Action::Drain { start: 0, from: 5 }]
    );
    for seq in 5..9 {
        assert_eq!(lane.offer(0, seq), Offer::Hand, "{seq}");
        lane.handed_over(0, seq);
    }
    assert_eq!(lane.offer(0, 9), Offer::NotDurable, "before its commit");
    assert_eq!(lane.poll(3, false, up), vec![]);
    assert_eq!(
        lane.poll(4, false, up),
        vec![Action::Drain { start: 0, from: 9 }]
    );
    assert_eq!(lane.offer(0, 9), Offer::Hand);

    // on-outage: the earlier run's backlog drains; a split waits for a known number.
    let mut lane = open(SpoolMode::OnOutage);
    assert_eq!(
        lane.poll(0, false, up),
        vec![Action::Drain { start: 0, from: 5 }]
    );
    assert_eq!(lane.captured(9, true, false), Capture::Spool);
    lane.spooled(9, None, false, up(0));
    assert_eq!(
        lane.poll(0, false, up),
        vec![Action::PersistEpoch { start: 10 }]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever happens (link drops, pauses, a full spool, failed splits, acks, commits,
    /// restarts), every captured seq ends acked once, in the spool, or dropped once; after the
    /// link is back for good, acked or dropped.
    #[test]
    fn every_captured_seq_ends_acked_stored_or_dropped_once(
        ops in proptest::collection::vec(0u8..16, 1..300),
        always in any::<bool>(),
        in_order in any::<bool>(),
        gop in prop_oneof![Just(1u64), 2u64..8],
    ) {
        let mode = if always { SpoolMode::Always } else { SpoolMode::OnOutage };
        let drain = if in_order { Drain::InOrder } else { Drain::LiveFirst };
        let mut w = World::new(mode, drain);
        w.gop = gop;
        for op in ops {
            match op {
                0..=4 => w.capture(true),
                5 => w.capture(false),
                6 | 7 => {
                    let starts: Vec<u64> = w.producers.keys().copied().collect();
                    for s in starts {
                        w.ack(s);
                    }
                }
                8 => w.set_link(None, true),
                9 => w.set_link(None, false),
                10 => {
                    let older = w.producers.keys().next().copied();
                    let up = w.next % 2 == 0;
                    w.set_link(older, up);
                }
                11 => w.commit(),
                12 => w.paused = !w.paused,
                13 => w.full = !w.full,
                14 => w.split_fails = !w.split_fails,
                _ => w.restart(),
            }
            w.turn();
            w.check();
        }
        w.settle();
    }
}

/// Issue 48.4: a frame lost at capture (a full spool) breaks its group: the lane skips the rest
/// of it up to the next keyframe and counts them, publishes that keyframe again.
#[test]
fn a_lost_frame_skips_the_rest_of_its_group() {
    let up = |_| Link {
        connected: true,
        held: 0,
    };
    let (mut lane, _) = Lane::open(
        Opening {
            mode: SpoolMode::OnOutage,
            drain: Drain::LiveFirst,
            uplink: true,
            persisted: Some(&[]),
            next_seq: Some(0),
        },
        |_| None,
    );
    lane.poll(0, false, up);
    // K p p | K p p with gop 3; frame 1 is refused and the spool drops it.
    assert_eq!(
        lane.captured_in_group(0, Picture::Key, true, false),
        Capture::Submit { start: 0 }
    );
    assert_eq!(
        lane.captured_in_group(1, Picture::Delta, true, false),
        Capture::Submit { start: 0 }
    );
    lane.refused(1);
    lane.lost(1);
    lane.spooled(1, None, false, up(0));
    assert_eq!(
        lane.captured_in_group(2, Picture::Delta, true, false),
        Capture::Skip
    );
    // The next keyframe mends it: it and its deltas go (to the spool: the backlog is active).
    assert_eq!(
        lane.captured_in_group(3, Picture::Key, true, false),
        Capture::Spool
    );
    assert_eq!(
        lane.captured_in_group(4, Picture::Delta, true, false),
        Capture::Spool
    );
    // A frame not admitted (the floor) breaks its group too.
    assert_eq!(
        lane.captured_in_group(5, Picture::Delta, false, false),
        Capture::Drop
    );
    assert_eq!(
        lane.captured_in_group(6, Picture::Delta, true, false),
        Capture::Skip
    );
    assert_eq!(
        lane.captured_in_group(7, Picture::Key, true, false),
        Capture::Spool
    );
    // Frames that decode alone never skip.
    lane.lost(7);
    assert_eq!(lane.captured(8, true, false), Capture::Spool);
}

/// Issue 48.4: a live-first split of a video source waits for a keyframe and starts there.
#[test]
fn a_video_split_starts_at_a_keyframe() {
    let mut w = world(SpoolMode::OnOutage);
    w.gop = 4;
    w.set_link(None, true);
    w.turn();
    for _ in 0..3 {
        w.capture(true);
        w.turn();
    }
    // An outage mid-group: frames spool.
    w.set_link(None, false);
    for _ in 0..6 {
        w.capture(true);
        w.turn();
    }
    // The link back with frame 9 next (a delta): no split until the keyframe at 12.
    w.set_link(None, true);
    w.turn();
    assert!(w.persisted.is_empty(), "{:?}", w.persisted);
    for _ in 0..3 {
        w.capture(true);
        w.turn();
        assert!(w.persisted.is_empty(), "{:?}", w.persisted);
    }
    w.capture(true);
    assert_eq!(w.persisted, vec![12]);
    w.turn();
    w.check();
    w.settle();
}
