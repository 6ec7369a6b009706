//! The per-source lane between capture and Pulsar: publish live while the uplink keeps up, spill to
//! the spool when it cannot, and drain the spool in capture order.
//!
//! One lane task per source owns that source's order end to end: it is the only writer of the
//! source's spool records and the only submitter to its producers, so its order needs no locks.
//! With `drain = "in-order"` spooled frames go before newer frames. With `live-first` (the
//! default), once an outage is over new frames go out live under a new sending epoch (a producer
//! name of their own, see [`epochs`]) while the backlog drains oldest first under the producer
//! it was captured for, with what the budget leaves. In `always` mode every frame is appended
//! first and published, in order, once its group commit is durable.

use rigd_drivers::Frame;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

mod backlog;
pub mod epochs;

pub use backlog::{Backlog, Route};

use crate::config::{Drain, SpoolMode};
use crate::spool::{Appended, Spool};
use crate::uplink::{Ack, Outcome, Producer, ProducerConfig, ProducerStats};
use epochs::{split_due, Epochs, SplitCheck};

/// Frames read from the spool per drain step.
const DRAIN_BATCH: usize = 16;

/// Lane counters for status and metrics.
#[derive(Debug, Default)]
pub struct LaneStats {
    pub published: AtomicU64,
    pub already_persisted: AtomicU64,
    pub spool_dropped_logged: AtomicU64,
    /// Frames spooled while the uplink was up: its window was full (the budget spent).
    pub waiting_for_bandwidth: AtomicU64,
    /// Live-first splits: new frames moved to a new epoch while a backlog drains.
    pub splits: AtomicU64,
    /// Submission-to-receipt latency of published frames (web UI and `/metrics`).
    pub latency: crate::metrics::LatencyHistogram,
    /// Capture-to-receipt latency of frames published live (not from the spool), per source.
    pub capture_latency: crate::metrics::LatencyHistogram,
    /// The latest frames for the web UI (a reference to a payload a few times a second).
    pub preview: crate::metrics::Preview,
    /// Beats on every turn of the lane loop, and at least once a second while idle (watchdog).
    pub heartbeat: crate::lifecycle::Heartbeat,
}

/// How a lane opens producers: one per sending epoch ([`epochs`]), all sharing the source's
/// stats and the budget.
pub struct Uplink {
    /// Epoch 0's settings; the others differ in name, rank and `fresh`.
    pub config: ProducerConfig,
    pub priority: u8,
    pub shutdown: watch::Receiver<bool>,
}

impl Uplink {
    fn spawn(
        &self,
        source: &str,
        start: u64,
        backlog: bool,
        fresh: bool,
        acks: &mpsc::UnboundedSender<Ack>,
    ) -> Producer {
        let mut cfg = self.config.clone();
        cfg.producer_name = crate::wire::epoch_producer_name(&cfg.rig, source, start);
        cfg.rank = crate::uplink::budget::rank(self.priority, backlog);
        cfg.fresh = fresh;
        Producer::spawn(cfg, acks.clone(), self.shutdown.clone())
    }
}

/// One epoch's sending: its range of capture sequences, its producer, its order.
struct Epoch {
    start: u64,
    /// The next epoch's start; None for the live epoch.
    end: Option<u64>,
    producer: Option<Producer>,
    order: Backlog,
    /// Its producer was up at least once.
    seen_up: bool,
    /// Frames were spooled while its producer was down after being up.
    outage: bool,
}

impl Epoch {
    fn new(start: u64, producer: Option<Producer>, order: Backlog) -> Self {
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

pub struct Lane {
    pub source: Arc<str>,
    pub mode: SpoolMode,
    pub drain: Drain,
    pub frames: mpsc::Receiver<Frame>,
    pub uplink: Option<Uplink>,
    pub spool: Arc<Spool>,
    /// With end-to-end encryption every frame is sealed before it is spooled (compressed with
    /// `compression`, encrypted for the fleet key): the spool holds only ciphertext.
    pub seal: Option<(Arc<crate::seal::Encryptor>, crate::config::Compression)>,
    pub stats: Arc<LaneStats>,
    /// Raised by a technician (web UI): submit nothing new, spool as during an outage.
    pub paused: Arc<AtomicBool>,
    /// The daemon stops: take what is queued and end even if capture has not closed the channel.
    pub shutdown: watch::Receiver<bool>,
}

/// The lane's epochs: the older ones still draining (oldest first) and the live one.
struct Sending {
    epochs: Epochs,
    older: Vec<Epoch>,
    live: Epoch,
    acks: mpsc::UnboundedSender<Ack>,
    /// The next capture sequence (what a split starts at).
    next_seq: u64,
}

impl Sending {
    fn epoch_of(&mut self, seq: u64) -> Option<&mut Epoch> {
        if self.live.holds(seq) {
            return Some(&mut self.live);
        }
        self.older.iter_mut().find(|e| e.holds(seq))
    }

    fn producers(&self) -> impl Iterator<Item = &Producer> {
        self.older
            .iter()
            .chain(std::iter::once(&self.live))
            .filter_map(|e| e.producer.as_ref())
    }
}

impl Lane {
    /// Opens the epochs an earlier run left frames in (they drain first, oldest first), and the
    /// live epoch; with `live-first` and a backlog, new frames get an epoch of their own at once.
    fn open(&self, acks: mpsc::UnboundedSender<Ack>) -> Sending {
        let next_seq = disk(|| self.spool.next_seq(&self.source)).unwrap_or(u64::MAX);
        let first_spooled = |from: u64| {
            disk(|| self.spool.read_from(&self.source, from, 1))
                .ok()
                .and_then(|f| f.first().map(|f| f.seq))
        };
        let persisted = match disk(|| self.spool.epochs(&self.source)) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(source = %self.source, error = %e,
                    "spool: cannot read the source's epochs; its frames stay in the spool (publishing them under the wrong producer name could lose them)");
                None
            }
        };
        let uplink = self.uplink.as_ref().filter(|_| persisted.is_some());
        let epochs = Epochs::new(persisted.as_deref().unwrap_or(&[]));
        let n = epochs.starts().len();
        let mut older = Vec::new();
        for i in 0..n - 1 {
            let (start, end) = epochs.range(i);
            let Some(from) = first_spooled(start).filter(|&s| end.is_none_or(|e| s < e)) else {
                continue;
            };
            let producer = uplink.map(|u| u.spawn(&self.source, start, true, false, &acks));
            let mut e = Epoch::new(
                start,
                producer,
                Backlog::new(self.mode, Some(from), next_seq),
            );
            e.end = end;
            older.push(e);
        }
        let (live_start, _) = epochs.range(n - 1);
        let spooled_from = first_spooled(live_start);
        let producer = uplink.map(|u| u.spawn(&self.source, live_start, false, false, &acks));
        let live = Epoch::new(
            live_start,
            producer,
            Backlog::new(self.mode, spooled_from, next_seq),
        );
        if spooled_from.is_some() || !older.is_empty() {
            tracing::info!(source = %self.source, records = self.spool.stats(&self.source).records.load(Ordering::Relaxed),
                epochs = older.len() + spooled_from.is_some() as usize,
                "spooled frames from an earlier run will drain first");
        }
        let mut s = Sending {
            epochs,
            older,
            live,
            acks,
            next_seq,
        };
        // A backlog from an earlier run is an outage that ended with this start (frames spooled
        // while the producers first connect are not: they drain in order under the live name).
        s.live.outage = spooled_from.is_some();
        s
    }

    /// Runs until the frame channel closes (capture stopped) or the daemon stops, then hands
    /// unacknowledged frames to the spool and returns.
    pub async fn run(mut self) {
        let (ack_tx, mut acks) = mpsc::unbounded_channel();
        let mut s = self.open(ack_tx);
        let mut last_drop_log = None;
        let mut durable = self.spool.durable_epoch();
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.stats.heartbeat.beat();
            let rooms: Vec<_> = s.producers().map(|p| Box::pin(p.room())).collect();
            let room = async move {
                if rooms.is_empty() {
                    std::future::pending::<()>().await;
                }
                futures::future::select_all(rooms).await;
            };
            tokio::select! {
                frame = self.frames.recv() => {
                    let Some(frame) = frame else { break };
                    self.on_frame(frame, &mut s, &mut last_drop_log);
                }
                _ = self.shutdown.changed() => {
                    // A capture thread that did not stop still holds the channel open.
                    while let Ok(frame) = self.frames.try_recv() {
                        self.on_frame(frame, &mut s, &mut last_drop_log);
                    }
                    break;
                }
                ack = acks.recv() => {
                    if let Some(ack) = ack { self.on_ack(ack, &mut s); }
                }
                _ = room => {}
                _ = durable.changed() => {}
                _ = beat.tick() => {}
            }
            while let Ok(ack) = acks.try_recv() {
                self.on_ack(ack, &mut s);
            }
            let d = *durable.borrow();
            let paused = self.paused.load(Ordering::Relaxed);
            for e in s.older.iter_mut().chain(std::iter::once(&mut s.live)) {
                e.order.durable(d);
                if e.producer.as_ref().is_some_and(|p| p.is_connected()) {
                    e.seen_up = true;
                }
            }
            self.maybe_split(&mut s, paused);
            if !paused {
                // Oldest first: only the oldest epoch with something to hand over drains, and
                // the live epoch's own backlog (frames that waited for bandwidth) beside it.
                if let Some(e) = s.older.iter_mut().find(|e| e.order.drain_from().is_some()) {
                    self.drain(e);
                }
                if s.live.order.drain_from().is_some() {
                    self.drain(&mut s.live);
                    if !s.live.order.active() {
                        s.live.outage = false;
                    }
                }
            }
            self.retire(&mut s, &mut last_drop_log).await;
        }
        // Capture has stopped: everything the producers still hold goes back to the spool.
        let mut left = Vec::new();
        for e in s.older.iter_mut().chain(std::iter::once(&mut s.live)) {
            if let Some(p) = e.producer.take() {
                left.push(p.close());
            }
        }
        let left = futures::future::join_all(left).await;
        while let Ok(ack) = acks.try_recv() {
            self.on_ack(ack, &mut s);
        }
        let n: usize = left.iter().map(Vec::len).sum();
        for f in left.into_iter().flatten() {
            self.append(&f, &mut last_drop_log);
        }
        if n > 0 {
            tracing::info!(source = %self.source, frames = n, "unacknowledged frames spooled at shutdown");
        }
    }

    /// Live-first: after an outage, once the live producer is back, new frames get a new epoch
    /// (persisted first) and the backlog drains under the producer it was captured for.
    fn maybe_split(&self, s: &mut Sending, paused: bool) {
        let Some(uplink) = &self.uplink else { return };
        let due = split_due(SplitCheck {
            drain: self.drain,
            mode: self.mode,
            backlog: s.live.order.active(),
            outage: s.live.outage,
            connected: !paused && s.live.producer.as_ref().is_some_and(|p| p.is_connected()),
            open: s.older.len() + 1,
        });
        if !due {
            return;
        }
        let start = s.next_seq;
        if let Err(e) = disk(|| self.spool.add_epoch(&self.source, start)) {
            tracing::error!(source = %self.source, error = %e,
                "spool: cannot record a live-first split; the backlog drains in order before new frames");
            s.live.outage = false;
            return;
        }
        s.epochs.split(start);
        let producer = uplink.spawn(&self.source, start, false, true, &s.acks);
        let backlog = Backlog::new(self.mode, None, start);
        let mut old = std::mem::replace(&mut s.live, Epoch::new(start, Some(producer), backlog));
        old.end = Some(start);
        old.outage = false;
        if let Some(p) = &old.producer {
            p.to_backlog(crate::uplink::budget::rank(uplink.priority, true));
        }
        tracing::info!(source = %self.source, live_from = start, backlog_from = ?old.order.drain_from(),
            epochs = s.older.len() + 2,
            "link back: new frames go out live under a new producer name while the backlog drains");
        self.stats.splits.fetch_add(1, Ordering::Relaxed);
        s.older.push(old);
    }

    /// Closes the producers of older epochs that have nothing left to send or to be acked.
    async fn retire(&self, s: &mut Sending, last_drop_log: &mut Option<Instant>) {
        while let Some(i) = s.older.iter().position(|e| {
            !e.order.active()
                && e.order.settled()
                && e.producer.as_ref().is_none_or(|p| p.held() == 0)
        }) {
            let e = s.older.remove(i);
            if let Some(p) = e.producer {
                let left = p.close().await;
                for f in &left {
                    self.append(f, last_drop_log);
                }
            }
            tracing::info!(source = %self.source, epoch_start = e.start, "backlog of an earlier epoch drained");
        }
    }

    fn on_frame(&self, frame: Frame, s: &mut Sending, last_drop_log: &mut Option<Instant>) {
        let next = frame.seq + 1;
        s.next_seq = s.next_seq.max(next);
        self.stats.preview.offer(&frame);
        // A number at or past the durable floor could have been handed out before a crash:
        // such a frame is neither published nor stored (counted by the spool).
        if !self.spool.admit_seq(&self.source, frame.seq) {
            self.log_drop(
                last_drop_log,
                1,
                "spool: the sequence floor (SEQ) cannot be moved past this frame's number; frame dropped",
            );
            return;
        }
        let paused = self.paused.load(Ordering::Relaxed);
        let e = &mut s.live;
        let open = e.producer.is_some() && !paused;
        let down = e.producer.as_ref().is_some_and(|p| !p.is_connected()) && e.seen_up;
        let spill = match (e.order.route(open), &e.producer) {
            (Route::Live, Some(p)) => match p.try_submit(frame) {
                Ok(()) => None,
                Err(frame) => {
                    if p.is_connected() {
                        // The link is up and moving: the window is full (under a budget, the
                        // budget is spent). The frame waits in the spool.
                        self.stats
                            .waiting_for_bandwidth
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    e.order.spill(frame.seq);
                    Some(frame)
                }
            },
            _ => Some(frame),
        };
        if let Some(frame) = spill {
            if down && !paused {
                e.outage = true;
            }
            // The epoch is read after the append: a commit in between only makes the lane wait
            // one more commit, never publish a record before it is durable.
            let stored = self.append(&frame, last_drop_log);
            let epoch = stored.then(|| self.spool.current_epoch());
            e.order.spooled(frame.seq, epoch);
        }
        // After the append: a commit that persists this note also persists the record, so after a
        // crash in `always` mode the next sequence follows the last durable frame (no gap, and the
        // lost frames' numbers were never published).
        if let Err(e) = disk(|| self.spool.note_seq(&self.source, next)) {
            tracing::error!(source = %self.source, error = %e, "spool: cannot record the sequence number");
        }
    }

    /// Appends to the spool; false when the frame was dropped by the capacity policy.
    fn append(&self, frame: &Frame, last_drop_log: &mut Option<Instant>) -> bool {
        let sealed;
        let frame = match &self.seal {
            Some((encryptor, compression)) if !frame.sealed => {
                sealed = encryptor.seal_frame(*compression, frame.clone());
                &sealed
            }
            _ => frame,
        };
        match disk(|| self.spool.append(frame)) {
            Ok(Appended::Stored) => true,
            Ok(Appended::DroppedEarlier) => false,
            Ok(Appended::StoredDroppingOldest(n)) => {
                self.log_drop(
                    last_drop_log,
                    n,
                    "spool full: dropped the oldest frames (when-full = drop-oldest)",
                );
                true
            }
            Ok(a @ (Appended::DroppedNewest | Appended::DroppedNoRoom)) => {
                self.log_drop(last_drop_log, 1, a.loss().unwrap_or_default());
                false
            }
            Err(e) => {
                self.spool
                    .stats(&self.source)
                    .dropped
                    .fetch_add(1, Ordering::Relaxed);
                self.log_drop(last_drop_log, 1, &format!("spool write failed: {e}"));
                false
            }
        }
    }

    /// Logs frame loss at most once every 10 s per source, with the count since the last line.
    fn log_drop(&self, last: &mut Option<Instant>, n: u64, what: &str) {
        let pending = self
            .stats
            .spool_dropped_logged
            .fetch_add(n, Ordering::Relaxed)
            + n;
        if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            tracing::error!(source = %self.source, dropped = pending, "{what}");
            self.stats.spool_dropped_logged.store(0, Ordering::Relaxed);
            *last = Some(Instant::now());
        }
    }

    fn on_ack(&self, ack: Ack, s: &mut Sending) {
        let from_spool = s.epoch_of(ack.seq).is_some_and(|e| e.order.acked(ack.seq));
        match &ack.outcome {
            Outcome::Persisted => {
                self.stats.published.fetch_add(1, Ordering::Relaxed);
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

    /// Hands an epoch's spooled frames to its producer while it takes them (connected); leaves
    /// backlog mode when the spool holds nothing unsent of the epoch.
    fn drain(&self, e: &mut Epoch) {
        let Some(p) = e.producer.as_ref().filter(|p| p.is_connected()) else {
            return;
        };
        let st = &mut e.order;
        while let Some(from) = st.drain_from() {
            let batch = match disk(|| self.spool.read_from(&self.source, from, DRAIN_BATCH)) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(source = %self.source, error = %e, "spool read failed; retrying later");
                    return;
                }
            };
            if batch.is_empty() {
                st.caught_up();
                return;
            }
            for f in batch {
                let seq = f.seq;
                if e.end.is_some_and(|end| seq >= end) {
                    st.caught_up();
                    return; // the next epoch's
                }
                if !st.may_publish(seq) {
                    return; // not durable yet
                }
                if p.try_submit(f).is_err() {
                    return;
                }
                st.handed_over(seq);
            }
        }
    }
}

/// Runs a blocking spool call without stalling the runtime's other tasks (the web UI, the other
/// lanes): a slow or frozen disk holds this lane only.
fn disk<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Group commit: flushes the spool every `fsync-ms` until `shutdown`, refreshing free space once a
/// second.
pub async fn commit_loop(spool: Arc<Spool>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_free = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let s = spool.clone();
        let refresh = last_free.elapsed() > Duration::from_secs(1);
        if refresh {
            last_free = Instant::now();
        }
        let r = tokio::task::spawn_blocking(move || {
            if refresh {
                s.refresh_free_space();
            }
            s.commit()
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::error!(error = %e, "spool commit failed");
        }
    }
}

/// Read-only view of a producer's state for status.
pub type UplinkStats = Arc<ProducerStats>;
