//! The lane's task: performs what [`Lane`] decides for one source (its spool records, its
//! producers, its counters) and tells it what happened. One task per source owns that source's
//! order end to end: it is the only writer of the source's spool records and the only submitter
//! to its producers, so its order needs no locks.

use rigd_drivers::Frame;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

use super::lane::{Action, Capture, Lane, Link, Offer, Opening, Picture};
use super::{LaneStats, Uplink};
use crate::config::{Drain, SpoolMode};
use crate::payload::Held;
use crate::spool::{Appended, Spool};
use crate::uplink::{Ack, Outcome, TopicProducer};

/// Looks at a lane's frames on their way in ([`LaneTask::observers`]).
pub type Observer = Box<dyn Fn(&Frame) + Send + Sync>;

/// Frames read from the spool per drain step.
const DRAIN_BATCH: usize = 16;

pub struct LaneTask {
    pub source: Arc<str>,
    pub mode: SpoolMode,
    pub drain: Drain,
    pub frames: mpsc::Receiver<Frame>,
    pub uplink: Option<Uplink>,
    pub spool: Arc<Spool>,
    /// With end-to-end encryption every frame is sealed before it is spooled (compressed, cut
    /// into pieces, encrypted for the fleet key): the spool holds only ciphertext.
    pub seal: Option<crate::seal::Sealing>,
    pub stats: Arc<LaneStats>,
    /// Called with each frame as it arrives, before it is spooled or sent (the fleet's track,
    /// the campaigns' conditions): each is cheap and never waits.
    pub observers: Vec<Observer>,
    /// Raised by a technician (web UI): submit nothing new, spool as during an outage.
    pub paused: Arc<AtomicBool>,
    /// The daemon stops: take what is queued and end even if capture has not closed the channel.
    pub shutdown: watch::Receiver<bool>,
}

/// The producers of the lane's epochs, by epoch start.
struct Producers {
    open: Vec<(u64, TopicProducer)>,
    acks: mpsc::UnboundedSender<Ack>,
}

impl Producers {
    fn get(&self, start: u64) -> Option<&TopicProducer> {
        self.open.iter().find(|(s, _)| *s == start).map(|(_, p)| p)
    }

    fn link(&self, start: u64) -> Link {
        self.get(start)
            .map(|p| Link {
                connected: p.is_connected(),
                held: p.held(),
            })
            .unwrap_or_default()
    }

    fn take(&mut self, start: u64) -> Option<TopicProducer> {
        let i = self.open.iter().position(|(s, _)| *s == start)?;
        Some(self.open.remove(i).1)
    }
}

impl LaneTask {
    /// Runs until the frame channel closes (capture stopped) or the daemon stops, then hands
    /// unacknowledged frames to the spool and returns.
    pub async fn run(mut self) {
        let (ack_tx, mut acks) = mpsc::unbounded_channel();
        let mut producers = Producers {
            open: Vec::new(),
            acks: ack_tx,
        };
        let mut lane = self.open(&mut producers);
        let mut durable = self.spool.durable_commit();
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.stats.heartbeat.beat();
            let rooms: Vec<_> = producers
                .open
                .iter()
                .map(|(_, p)| Box::pin(p.room()))
                .collect();
            let room = async move {
                if rooms.is_empty() {
                    std::future::pending::<()>().await;
                }
                futures::future::select_all(rooms).await;
            };
            tokio::select! {
                frame = self.frames.recv() => {
                    let Some(frame) = frame else { break };
                    self.on_frame(frame, &mut lane, &mut producers);
                }
                _ = self.shutdown.changed() => {
                    // A capture thread that did not stop still holds the channel open.
                    while let Ok(frame) = self.frames.try_recv() {
                        self.on_frame(frame, &mut lane, &mut producers);
                    }
                    break;
                }
                ack = acks.recv() => {
                    if let Some(ack) = ack { self.on_ack(ack, &mut lane); }
                }
                _ = room => {}
                _ = durable.changed() => {}
                _ = beat.tick() => {}
            }
            while let Ok(ack) = acks.try_recv() {
                self.on_ack(ack, &mut lane);
            }
            // A topic found partitioned: one producer per partition from now on.
            for (_, p) in producers.open.iter_mut() {
                let left = p.refresh().await;
                self.spool_all(&left);
            }
            let d = *durable.borrow();
            // A split is persisted, then the drains of the epochs as they are after it.
            for _ in 0..2 {
                let paused = self.paused.load(Ordering::Relaxed);
                let actions = lane.poll(d, paused, |s| producers.link(s));
                if actions.is_empty() {
                    break;
                }
                let mut split = false;
                for a in actions {
                    split |= matches!(a, Action::PersistEpoch { .. });
                    self.perform(a, &mut lane, &mut producers);
                }
                if !split {
                    break;
                }
            }
            while let Some(start) = lane.retire(|s| producers.link(s)) {
                if let Some(p) = producers.take(start) {
                    self.spool_all(&p.close().await);
                }
                tracing::info!(source = %self.source, epoch_start = start, "backlog of an earlier epoch drained");
            }
        }
        // Capture has stopped: everything the producers still hold goes back to the spool.
        let left: Vec<_> = producers.open.drain(..).map(|(_, p)| p.close()).collect();
        let left = futures::future::join_all(left).await;
        while let Ok(ack) = acks.try_recv() {
            self.on_ack(ack, &mut lane);
        }
        let n: usize = left.iter().map(Vec::len).sum();
        for f in left {
            self.spool_all(&f);
        }
        if n > 0 {
            tracing::info!(source = %self.source, frames = n, "unacknowledged frames spooled at shutdown");
        }
    }

    /// Opens the lane on what the spool holds, and its producers.
    fn open(&self, producers: &mut Producers) -> Lane {
        // Unknown when the spool cannot say: the lane then waits for this run's first frame
        // (`always`: never hands over a frame before its commit; no split before a number).
        let next_seq = match disk(|| self.spool.next_seq(&self.source)) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::error!(source = %self.source, error = %e,
                    "spool: cannot read the source's next sequence number; spooled frames wait for the first frame captured");
                None
            }
        };
        let persisted = match disk(|| self.spool.epochs(&self.source)) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(source = %self.source, error = %e,
                    "spool: cannot read the source's epochs; its frames stay in the spool (publishing them under the wrong producer name could lose them)");
                None
            }
        };
        let (lane, actions) = Lane::open(
            Opening {
                mode: self.mode,
                drain: self.drain,
                uplink: self.uplink.is_some(),
                persisted: persisted.as_deref(),
                next_seq,
            },
            |from| {
                disk(|| self.spool.read_from(&self.source, from, 1))
                    .ok()
                    .and_then(|f| f.first().map(|f| f.seq))
            },
        );
        if lane.backlogs() > 0 {
            tracing::info!(source = %self.source, records = self.spool.stats(&self.source).records.load(Ordering::Relaxed),
                epochs = lane.backlogs(), "spooled frames from an earlier run will drain first");
        }
        for a in actions {
            self.open_producer(a, producers);
        }
        lane
    }

    fn open_producer(&self, a: Action, producers: &mut Producers) {
        if let (
            Action::Open {
                start,
                backlog,
                fresh,
            },
            Some(uplink),
        ) = (a, &self.uplink)
        {
            let mut p = uplink.spawn(&self.source, start, backlog, fresh, &producers.acks);
            // A partitioned topic's frames keep the partition count they were sent under.
            p.keep_routes(self.spool.path(), &self.source, start);
            producers.open.push((start, p));
        }
    }

    fn perform(&self, a: Action, lane: &mut Lane, producers: &mut Producers) {
        match a {
            Action::Open { .. } => self.open_producer(a, producers),
            Action::PersistEpoch { start } => {
                let persisted = match disk(|| self.spool.add_epoch(&self.source, start)) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::error!(source = %self.source, error = %e,
                            "spool: cannot record a live-first split; the backlog drains in order before new frames");
                        false
                    }
                };
                let old = lane.live();
                for a in lane.split(start, persisted) {
                    self.perform(a, lane, producers);
                }
                if persisted {
                    tracing::info!(source = %self.source, live_from = start, backlog_from = old,
                        epochs = lane.open_epochs(),
                        "link back: new frames go out live under a new producer name while the backlog drains");
                    self.stats.splits.fetch_add(1, Ordering::Relaxed);
                }
            }
            Action::ToBacklog { start } => {
                if let (Some(p), Some(uplink)) = (producers.get(start), &self.uplink) {
                    p.to_backlog(crate::uplink::budget::rank(uplink.priority, true));
                }
            }
            Action::Drain { start, from } => {
                if let Some(p) = producers.get(start) {
                    self.drain(start, from, lane, p);
                }
            }
        }
    }

    fn on_frame(&self, frame: Frame, lane: &mut Lane, producers: &mut Producers) {
        let next = frame.seq + 1;
        self.stats.preview.offer(&frame);
        self.stats.live.offer(&frame);
        for observe in &self.observers {
            observe(&frame);
        }
        let frame = Held::plain(frame);
        let paused = self.paused.load(Ordering::Relaxed);
        // A number at or past the durable floor could have been handed out before a crash: such
        // a frame is neither published nor stored (counted by the spool).
        let admitted = self.seq_call(frame.seq, || self.spool.admit_seq(&self.source, frame.seq));
        let picture = match &frame.media {
            rigd_drivers::Media::Camera {
                codec, keyframe, ..
            } if !codec.intra_only() => {
                if *keyframe {
                    Picture::Key
                } else {
                    Picture::Delta
                }
            }
            _ => Picture::Whole,
        };
        let mut capture = lane.captured_in_group(frame.seq, picture, admitted, paused);
        if let Capture::SplitFirst { start } = capture {
            // A video source's live-first split, at this keyframe.
            self.perform(Action::PersistEpoch { start }, lane, producers);
            capture = lane.captured_in_group(frame.seq, picture, admitted, paused);
        }
        let spill = match capture {
            Capture::Drop => return,
            Capture::Skip => {
                self.spool.skipped(&self.source);
                None
            }
            Capture::SplitFirst { .. } => Some(frame),
            // The lane submits only to an epoch it opened a producer for; were one missing, the
            // frame is refused like any other and waits in the spool (no panic in a lane).
            Capture::Submit { start } => match producers.get(start) {
                Some(p) => match p.try_submit(frame) {
                    Ok(()) => None,
                    Err(frame) => {
                        if p.is_connected() {
                            // The link is up and moving: the window is full (under a budget,
                            // the budget is spent). The frame waits in the spool.
                            self.stats
                                .waiting_for_bandwidth
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        lane.refused(frame.seq);
                        Some(frame)
                    }
                },
                None => {
                    lane.refused(frame.seq);
                    Some(frame)
                }
            },
            Capture::Spool => Some(frame),
        };
        if let Some(frame) = spill {
            // The epoch is read after the append: a commit in between only makes the lane wait
            // one more commit, never publish a record before it is durable.
            let stored = self.append(&frame);
            if !stored {
                lane.lost(frame.seq);
            }
            let commit = stored.then(|| self.spool.current_commit());
            lane.spooled(frame.seq, commit, paused, producers.link(lane.live()));
        }
        // After the append: a commit that persists this note also persists the record, so after a
        // crash in `always` mode the next sequence follows the last durable frame (no gap, and the
        // lost frames' numbers were never published).
        if let Err(e) = self.seq_call(next, || self.spool.note_seq(&self.source, next)) {
            tracing::error!(source = %self.source, error = %e, "spool: cannot record the sequence number");
        }
    }

    /// A numbering call of the spool ([`Spool::admit_seq`], [`Spool::note_seq`]): through [`disk`]
    /// only when it writes the sequence floor. Per frame it is memory only, and handing the
    /// runtime's thread over (`block_in_place`) for it cost more than the rest of the lane (a
    /// blocking-pool hand-off per frame, 5 % of rigd's samples in the rig profile).
    fn seq_call<T>(&self, seq: u64, call: impl FnOnce() -> T) -> T {
        if self.spool.floor_due(&self.source, seq.saturating_add(1)) {
            disk(call)
        } else {
            call()
        }
    }

    /// Appends to the spool; false when the frame was dropped (counted and logged by the spool).
    fn append(&self, frame: &Held) -> bool {
        let sealed;
        let frame = match &self.seal {
            Some(sealing) if !frame.sealed => {
                sealed = sealing.seal(frame.clone());
                &sealed
            }
            _ => frame,
        };
        matches!(
            disk(|| self.spool.append(frame)),
            Ok(Appended::Stored | Appended::StoredDroppingOldest(_))
        )
    }

    /// Frames a closed producer gave back: to the spool.
    fn spool_all(&self, frames: &[Held]) {
        for f in frames {
            self.append(f);
        }
    }

    fn on_ack(&self, ack: Ack, lane: &mut Lane) {
        let from_spool = lane.acked(ack.seq);
        match &ack.outcome {
            Outcome::Persisted => {
                self.stats.latency.record(ack.latency);
                if !from_spool {
                    let ns = (rigd_drivers::realtime_ns() - ack.capture_ns).max(0) as u64;
                    self.stats.capture_latency.record(Duration::from_nanos(ns));
                }
            }
            Outcome::AlreadyPersisted => {
                self.stats.already_persisted.fetch_add(1, Ordering::Relaxed);
                self.stats.latency.record(ack.latency);
            }
            // Counted and logged by the producer, where the refusal is decided.
            Outcome::Refused(_) => {}
        }
        if from_spool {
            if let Err(e) = disk(|| self.spool.remove(&self.source, ack.seq)) {
                tracing::error!(source = %self.source, seq = ack.seq, error = %e, "spool: cannot remove a published frame");
            }
        }
    }

    /// Hands epoch `start`'s spooled frames from `from` to its producer while it takes them.
    fn drain(&self, start: u64, mut from: u64, lane: &mut Lane, p: &TopicProducer) {
        loop {
            let batch = match disk(|| self.spool.read_from(&self.source, from, DRAIN_BATCH)) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(source = %self.source, error = %e, "spool read failed; retrying later");
                    return;
                }
            };
            if batch.is_empty() {
                lane.caught_up(start);
                return;
            }
            for f in batch {
                let seq = f.seq;
                if lane.offer(start, seq) != Offer::Hand || p.try_submit(f).is_err() {
                    return;
                }
                lane.handed_over(start, seq);
                from = seq + 1;
            }
        }
    }
}

/// Runs a blocking spool call without stalling the runtime's other tasks (the web UI, the other
/// lanes): a slow or frozen disk holds this lane only.
fn disk<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}
