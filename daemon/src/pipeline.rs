//! The per-source lane between capture and Pulsar: publish live while the uplink keeps up, spill to
//! the spool when it cannot, and drain the spool in capture order before newer frames go live.
//!
//! One lane task per source owns that source's order end to end: it is the only writer of the
//! source's spool records and the only submitter to its producer, so "spooled frames before newer
//! frames" needs no locks. In `always` mode every frame is appended first and published once its
//! group commit is durable.

use rigd_drivers::Frame;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

mod backlog;

pub use backlog::{Backlog, Route};

use crate::config::SpoolMode;
use crate::spool::{Appended, Spool};
use crate::uplink::{Ack, Outcome, Producer, ProducerStats};

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
    /// Submission-to-receipt latency of published frames (web UI and `/metrics`).
    pub latency: crate::metrics::LatencyHistogram,
    /// Capture-to-receipt latency of frames published live (not from the spool), per source.
    pub capture_latency: crate::metrics::LatencyHistogram,
    /// The latest frames for the web UI (a reference to a payload a few times a second).
    pub preview: crate::metrics::Preview,
    /// Beats on every turn of the lane loop, and at least once a second while idle (watchdog).
    pub heartbeat: crate::lifecycle::Heartbeat,
}

pub struct Lane {
    pub source: Arc<str>,
    pub mode: SpoolMode,
    pub frames: mpsc::Receiver<Frame>,
    pub producer: Option<(Producer, mpsc::UnboundedReceiver<Ack>)>,
    pub spool: Arc<Spool>,
    pub stats: Arc<LaneStats>,
    /// Raised by a technician (web UI): submit nothing new, spool as during an outage.
    pub paused: Arc<AtomicBool>,
    /// The daemon stops: take what is queued and end even if capture has not closed the channel.
    pub shutdown: watch::Receiver<bool>,
}

impl Lane {
    /// Runs until the frame channel closes (capture stopped) or the daemon stops, then hands
    /// unacknowledged frames to the spool and returns.
    pub async fn run(mut self) {
        // Whatever a previous run left in the spool goes first.
        let spooled_from = disk(|| self.spool.read_from(&self.source, 0, 1))
            .ok()
            .and_then(|f| f.first().map(|f| f.seq));
        let next_seq = disk(|| self.spool.next_seq(&self.source)).unwrap_or(u64::MAX);
        let mut st = Backlog::new(self.mode, spooled_from, next_seq);
        if spooled_from.is_some() {
            tracing::info!(source = %self.source, records = self.spool.stats(&self.source).records.load(Ordering::Relaxed),
                "spooled frames from an earlier run will drain first");
        }
        let mut last_drop_log = None;
        let mut durable = self.spool.durable_epoch();
        let (producer, mut acks) = match self.producer.take() {
            Some((p, a)) => (Some(p), Some(a)),
            None => (None, None),
        };
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.stats.heartbeat.beat();
            let room = async {
                match &producer {
                    Some(p) => p.room().await,
                    None => std::future::pending().await,
                }
            };
            let ack = async {
                match &mut acks {
                    Some(a) => a.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                frame = self.frames.recv() => {
                    let Some(frame) = frame else { break };
                    self.on_frame(frame, producer.as_ref(), &mut st, &mut last_drop_log);
                }
                _ = self.shutdown.changed() => {
                    // A capture thread that did not stop still holds the channel open.
                    while let Ok(frame) = self.frames.try_recv() {
                        self.on_frame(frame, producer.as_ref(), &mut st, &mut last_drop_log);
                    }
                    break;
                }
                ack = ack => {
                    if let Some(ack) = ack { self.on_ack(ack, &mut st); }
                }
                _ = room => {}
                _ = durable.changed() => {}
                _ = beat.tick() => {}
            }
            if let Some(a) = &mut acks {
                while let Ok(ack) = a.try_recv() {
                    self.on_ack(ack, &mut st);
                }
            }
            st.durable(*durable.borrow());
            if st.drain_from().is_some() {
                // Paused by a technician: the backlog waits, as while the broker is away.
                if let Some(p) = producer
                    .as_ref()
                    .filter(|p| p.is_connected() && !self.paused.load(Ordering::Relaxed))
                {
                    self.drain(p, &mut st);
                }
            }
        }
        // Capture has stopped: everything the producer still holds goes back to the spool.
        if let Some(p) = producer {
            let left = p.close().await;
            if let Some(acks) = &mut acks {
                while let Ok(ack) = acks.try_recv() {
                    self.on_ack(ack, &mut st);
                }
            }
            let n = left.len();
            for f in left {
                self.append(&f, &mut last_drop_log);
            }
            if n > 0 {
                tracing::info!(source = %self.source, frames = n, "unacknowledged frames spooled at shutdown");
            }
        }
    }

    fn on_frame(
        &self,
        frame: Frame,
        producer: Option<&Producer>,
        st: &mut Backlog,
        last_drop_log: &mut Option<Instant>,
    ) {
        let next = frame.seq + 1;
        self.stats.preview.offer(&frame);
        let open = producer.is_some() && !self.paused.load(Ordering::Relaxed);
        let spill = match (st.route(open), producer) {
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
                    st.spill(frame.seq);
                    Some(frame)
                }
            },
            _ => Some(frame),
        };
        if let Some(frame) = spill {
            // The epoch is read after the append: a commit in between only makes the lane wait
            // one more commit, never publish a record before it is durable.
            let stored = self.append(&frame, last_drop_log);
            let epoch = stored.then(|| self.spool.current_epoch());
            st.spooled(frame.seq, epoch);
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
        match disk(|| self.spool.append(frame)) {
            Ok(Appended::Stored) => true,
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

    fn on_ack(&self, ack: Ack, st: &mut Backlog) {
        let from_spool = st.acked(ack.seq);
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

    /// Hands spooled frames to the producer while it takes them; leaves backlog mode when the
    /// spool of this source has nothing unsent.
    fn drain(&self, p: &Producer, st: &mut Backlog) {
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
