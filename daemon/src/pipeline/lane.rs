//! A source's lane as a value: which of its frames go live, which to the spool, which epoch's
//! producer drains what, and when an older epoch is done. No I/O and no clock: the lane's task
//! ([`super::task`]) tells it what happened (a frame captured, refused, appended, acked; what each
//! producer reports; the spool's durable commit) and performs what it answers, as ntpd's source
//! task performs ntp-proto's `NtpSourceAction`s.
//!
//! What the task must do with the answers, and what the lane then guarantees:
//! - [`Capture::Submit`]: offer the frame to the live epoch's producer; if it gives the frame back,
//!   call [`Lane::refused`] and spool it. [`Capture::Spool`]: append it, then [`Lane::spooled`]
//!   (with the commit epoch in `always` mode, None when the spool dropped it). [`Capture::Drop`]:
//!   neither (the spool counted it).
//! - [`Action::PersistEpoch`]: persist the split before anything is sent under it, then
//!   [`Lane::split`], whose [`Action::Open`] / [`Action::ToBacklog`] are performed in order.
//! - [`Action::Drain`]: read the spool from `from`; for each frame ask [`Lane::offer`], submit on
//!   [`Offer::Hand`] and report [`Lane::handed_over`]; stop on anything else or a refusal; an empty
//!   read is [`Lane::caught_up`].
//! - [`Lane::acked`] true: remove the frame from the spool (nothing else removes a record).
//! - [`Lane::retire`]: close that epoch's producer and append what it gives back.
//!
//! - [`Capture::Skip`]: neither publish nor spool it, count it dropped (its group broke).
//!   [`Capture::SplitFirst`]: perform [`Action::PersistEpoch`] at `start` (this frame), then ask
//!   [`Lane::captured_in_group`] again.
//!
//! Groups of pictures (a video source, issue 48.4): a frame that decodes only after the frames
//! before it in its group (an H.264 P-frame, a "delta") is never published once a frame of its
//! group was lost (not admitted under the floor, dropped by a full spool): the lane skips to the
//! next keyframe ([`Capture::Skip`]). A live-first split of a video source starts its new epoch
//! at a keyframe ([`Capture::SplitFirst`]), so a group is never cut between the backlog's
//! producer and the live one; and a live frame the producer gives back spills it and every frame
//! after it (the rest of its group included) to the spool, in order, as any source's.
//!
//! Then: a source's frames reach each producer in capture order; while a backlog is active no
//! frame of its epoch goes live; in `always` mode nothing is handed over before its commit is
//! durable; a spooled frame leaves the spool only on its own ack; every captured frame ends
//! acked, in the spool, or dropped, once (the property test in `lane/tests.rs`).

use super::backlog::{Backlog, Route};
use super::epochs::{split_due, Epochs, SplitCheck};
use crate::config::{Drain, SpoolMode};

/// What the task knows of an epoch's producer when it asks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Link {
    /// The producer is connected to its broker.
    pub connected: bool,
    /// Frames it holds without an ack.
    pub held: usize,
}

/// Where a captured frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Capture {
    /// Offer it to the producer of the live epoch starting at `start`.
    Submit { start: u64 },
    /// Append it to the spool.
    Spool,
    /// Neither: its number is at or past the durable sequence floor.
    Drop,
    /// Neither: a delta whose group lost a frame (no consumer could decode it); count it dropped.
    Skip,
    /// A keyframe with a live-first split due: persist the split starting at this frame
    /// ([`Action::PersistEpoch`]), then ask again.
    SplitFirst { start: u64 },
}

/// How a captured frame decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Picture {
    /// Alone, and the source is not video (an image, audio, serial).
    Whole,
    /// A video keyframe: it starts a group of pictures.
    Key,
    /// A video frame that decodes only after the frames before it in its group (a P-frame).
    Delta,
}

/// What a drain may do with the next spooled frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Offer {
    /// Submit it.
    Hand,
    /// Not durable yet (`always` mode): stop until a commit is.
    NotDurable,
    /// It belongs to the next epoch: this epoch's part of the spool is drained.
    NextEpoch,
}

/// Work the task performs for the lane, in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Open a producer for the epoch starting at `start`: at backlog rank or live, `fresh` when
    /// nothing was ever sent under its name.
    Open {
        start: u64,
        backlog: bool,
        fresh: bool,
    },
    /// Persist a new epoch starting at `start`, then report [`Lane::split`].
    PersistEpoch { start: u64 },
    /// The epoch's producer now sends a backlog: lower its rank.
    ToBacklog { start: u64 },
    /// Hand the epoch's spooled frames from `from` to its producer.
    Drain { start: u64, from: u64 },
}

/// One epoch's sending: its range of capture sequences and its order.
#[derive(Debug)]
struct Epoch {
    start: u64,
    /// The next epoch's start; None for the live epoch.
    end: Option<u64>,
    /// It has a producer (an uplink is configured and its epochs could be read).
    producer: bool,
    order: Backlog,
    /// Its producer was up at least once.
    seen_up: bool,
    /// Frames were spooled while its producer was down after being up.
    outage: bool,
}

impl Epoch {
    fn new(start: u64, producer: bool, order: Backlog) -> Self {
        Epoch {
            start,
            end: None,
            producer,
            order,
            seen_up: false,
            outage: false,
        }
    }

    fn holds(&self, seq: u64) -> bool {
        seq >= self.start && self.end.is_none_or(|e| seq < e)
    }
}

/// A source's sending epochs: the older ones still draining (oldest first) and the live one.
#[derive(Debug)]
pub struct Lane {
    mode: SpoolMode,
    drain: Drain,
    epochs: Epochs,
    older: Vec<Epoch>,
    live: Epoch,
    /// The next capture sequence (what a split starts at); None until known: the spool could
    /// not say at open and no frame was captured yet (no split meanwhile).
    next_seq: Option<u64>,
    /// Groups of pictures: whether the source sends deltas, whether its group broke.
    groups: Groups,
}

/// A video source's groups as the lane saw them.
#[derive(Debug, Default)]
struct Groups {
    /// A video frame was captured: the source's splits wait for a keyframe.
    video: bool,
    /// A frame of the group being captured was lost: its deltas are skipped up to the next
    /// keyframe.
    broken: bool,
    /// A live-first split is due and waits for the next keyframe.
    split_wanted: bool,
}

/// What the spool held for the source when the lane opened.
pub struct Opening<'a> {
    pub mode: SpoolMode,
    pub drain: Drain,
    /// An uplink is configured.
    pub uplink: bool,
    /// The persisted epoch starts; None when they could not be read (then no producer opens:
    /// publishing under the wrong name could lose frames).
    pub persisted: Option<&'a [u64]>,
    /// The source's next capture sequence; None when the spool could not say (then in
    /// `always` mode nothing spooled goes until this run's first capture or commit tells what
    /// is durable, and no split is made before a frame is numbered).
    pub next_seq: Option<u64>,
}

impl Lane {
    /// Opens the epochs an earlier run left frames in (they drain first, oldest first) and the live
    /// epoch. `first_spooled(from)`: the first seq the spool holds at or after `from`. The actions
    /// open the producers.
    pub fn open(o: Opening, first_spooled: impl Fn(u64) -> Option<u64>) -> (Lane, Vec<Action>) {
        let uplink = o.uplink && o.persisted.is_some();
        let epochs = Epochs::new(o.persisted.unwrap_or(&[]));
        let n = epochs.starts().len();
        let mut actions = Vec::new();
        let mut older = Vec::new();
        for i in 0..n - 1 {
            let (start, end) = epochs.range(i);
            let Some(from) = first_spooled(start).filter(|&s| end.is_none_or(|e| s < e)) else {
                continue;
            };
            if uplink {
                actions.push(Action::Open {
                    start,
                    backlog: true,
                    fresh: false,
                });
            }
            let mut e = Epoch::new(start, uplink, Backlog::new(o.mode, Some(from), o.next_seq));
            e.end = end;
            older.push(e);
        }
        let (live_start, _) = epochs.range(n - 1);
        let spooled_from = first_spooled(live_start);
        if uplink {
            actions.push(Action::Open {
                start: live_start,
                backlog: false,
                fresh: false,
            });
        }
        let mut live = Epoch::new(
            live_start,
            uplink,
            Backlog::new(o.mode, spooled_from, o.next_seq),
        );
        // A backlog from an earlier run is an outage that ended with this start (frames spooled
        // while the producers first connect are not: they drain in order under the live name).
        live.outage = spooled_from.is_some();
        let lane = Lane {
            mode: o.mode,
            drain: o.drain,
            epochs,
            older,
            live,
            next_seq: o.next_seq,
            groups: Groups::default(),
        };
        (lane, actions)
    }

    /// Epochs with frames of an earlier run to drain.
    pub fn backlogs(&self) -> usize {
        self.older.len() + self.live.order.active() as usize
    }

    /// Epochs sending now, the live one included.
    pub fn open_epochs(&self) -> usize {
        self.older.len() + 1
    }

    /// The live epoch's start.
    pub fn live(&self) -> u64 {
        self.live.start
    }

    fn epoch_of(&mut self, seq: u64) -> Option<&mut Epoch> {
        if self.live.holds(seq) {
            return Some(&mut self.live);
        }
        self.older.iter_mut().find(|e| e.holds(seq))
    }

    fn epoch(&mut self, start: u64) -> Option<&mut Epoch> {
        if self.live.start == start {
            return Some(&mut self.live);
        }
        self.older.iter_mut().find(|e| e.start == start)
    }

    /// Frame `seq` was captured. `admitted`: its number is below the durable floor (else
    /// dropped); `paused`: a technician paused publishing. A frame that decodes alone (not
    /// video, or a keyframe); see [`Lane::captured_in_group`].
    pub fn captured(&mut self, seq: u64, admitted: bool, paused: bool) -> Capture {
        self.captured_in_group(seq, Picture::Whole, admitted, paused)
    }

    /// [`Lane::captured`] for a frame of any source, video included.
    pub fn captured_in_group(
        &mut self,
        seq: u64,
        picture: Picture,
        admitted: bool,
        paused: bool,
    ) -> Capture {
        let keyframe = picture != Picture::Delta;
        let g = &mut self.groups;
        g.video |= picture != Picture::Whole;
        if keyframe {
            if g.split_wanted && admitted {
                g.split_wanted = false;
                return Capture::SplitFirst { start: seq };
            }
            g.broken = false;
        } else if g.broken && admitted {
            self.next_seq = Some(self.next_seq.map_or(seq + 1, |n| n.max(seq + 1)));
            return Capture::Skip;
        }
        if !admitted {
            self.groups.broken = true;
        }
        if self.next_seq.is_none() {
            // This run's first frame: every seq below it is an earlier run's, durable.
            for e in self.older.iter_mut().chain(std::iter::once(&mut self.live)) {
                e.order.earlier_run_below(seq);
            }
        }
        self.next_seq = Some(self.next_seq.map_or(seq + 1, |n| n.max(seq + 1)));
        if !admitted {
            return Capture::Drop;
        }
        let e = &self.live;
        match e.order.route(e.producer && !paused) {
            Route::Live if e.producer => Capture::Submit { start: e.start },
            _ => Capture::Spool,
        }
    }

    /// The live producer gave frame `seq` back: it and the frames after it spool until the backlog
    /// drains.
    pub fn refused(&mut self, seq: u64) {
        self.live.order.spill(seq);
    }

    /// Frame `seq` (captured live) went to the spool: `commit` is the spool's commit epoch it was
    /// appended in (`always` mode; None when the spool dropped it). `live`: the live producer
    /// now; down after being up, this is an outage.
    pub fn spooled(&mut self, seq: u64, commit: Option<u64>, paused: bool, live: Link) {
        let e = &mut self.live;
        if e.producer && !live.connected && e.seen_up && !paused {
            e.outage = true;
        }
        e.order.spooled(seq, commit);
    }

    /// Frame `seq` (captured live) was lost: the spool could not store it (full, a write
    /// error). The deltas after it up to the next keyframe are skipped.
    pub fn lost(&mut self, _seq: u64) {
        self.groups.broken = true;
    }

    /// The ack for `seq` came. True: it was handed over from the spool, remove it there.
    pub fn acked(&mut self, seq: u64) -> bool {
        self.epoch_of(seq).is_some_and(|e| e.order.acked(seq))
    }

    /// A turn of the task: the spool's durable commit epoch, whether publishing is paused, and each
    /// epoch's producer (`link(start)`). Answers a split to persist, or the drains to perform.
    pub fn poll(&mut self, durable: u64, paused: bool, link: impl Fn(u64) -> Link) -> Vec<Action> {
        for e in self.older.iter_mut().chain(std::iter::once(&mut self.live)) {
            e.order.durable(durable);
            if e.producer && link(e.start).connected {
                e.seen_up = true;
            }
        }
        let live_up = self.live.producer && !paused && link(self.live.start).connected;
        let due = self.live.producer
            && split_due(SplitCheck {
                drain: self.drain,
                mode: self.mode,
                backlog: self.live.order.active(),
                outage: self.live.outage,
                connected: live_up,
                open: self.open_epochs(),
            });
        // A video source's split starts at its next keyframe ([`Capture::SplitFirst`]): a
        // group is never cut between two producers.
        self.groups.split_wanted = due && self.groups.video;
        // A split starts at the next capture sequence: not before it is known.
        if let (true, false, Some(start)) = (due, self.groups.video, self.next_seq) {
            return vec![Action::PersistEpoch { start }];
        }
        if paused {
            return Vec::new();
        }
        // Oldest first: only the oldest epoch with something to hand over drains, and the live
        // epoch's own backlog (frames that waited for bandwidth) beside it.
        let drains = |e: &Epoch| {
            e.order
                .drain_from()
                .filter(|_| e.producer && link(e.start).connected)
                .map(|from| Action::Drain {
                    start: e.start,
                    from,
                })
        };
        let older = self
            .older
            .iter()
            .find(|e| e.order.drain_from().is_some())
            .and_then(drains);
        older.into_iter().chain(drains(&self.live)).collect()
    }

    /// The split at `start` was persisted (`persisted`) or could not be: new frames go live under a
    /// new epoch while the backlog drains under the producer it was captured for; if it could not,
    /// the backlog drains in order before new frames.
    pub fn split(&mut self, start: u64, persisted: bool) -> Vec<Action> {
        if !persisted || !self.epochs.split(start) {
            self.live.outage = false;
            return Vec::new();
        }
        let backlog = Backlog::new(self.mode, None, Some(start));
        let mut old = std::mem::replace(&mut self.live, Epoch::new(start, true, backlog));
        old.end = Some(start);
        old.outage = false;
        let actions = vec![
            Action::Open {
                start,
                backlog: false,
                fresh: true,
            },
            Action::ToBacklog { start: old.start },
        ];
        self.older.push(old);
        actions
    }

    /// What a drain of epoch `start` may do with spooled frame `seq`.
    pub fn offer(&mut self, start: u64, seq: u64) -> Offer {
        let Some(e) = self.epoch(start) else {
            return Offer::NextEpoch;
        };
        if e.end.is_some_and(|end| seq >= end) {
            e.order.caught_up();
            return Offer::NextEpoch;
        }
        if e.order.may_publish(seq) {
            Offer::Hand
        } else {
            Offer::NotDurable
        }
    }

    /// The drain's producer took spooled frame `seq`.
    pub fn handed_over(&mut self, start: u64, seq: u64) {
        if let Some(e) = self.epoch(start) {
            e.order.handed_over(seq);
        }
    }

    /// The spool holds nothing more of epoch `start` from the drain's cursor on.
    pub fn caught_up(&mut self, start: u64) {
        if let Some(e) = self.epoch(start) {
            e.order.caught_up();
            if !e.order.active() {
                e.outage = false;
            }
        }
    }

    /// An older epoch with nothing left to send or to be acked: removed here, its producer to
    /// close. Call until None.
    pub fn retire(&mut self, link: impl Fn(u64) -> Link) -> Option<u64> {
        let i = self.older.iter().position(|e| {
            !e.order.active() && e.order.settled() && (!e.producer || link(e.start).held == 0)
        })?;
        Some(self.older.remove(i).start)
    }
}

#[cfg(test)]
mod tests;
