//! A producer for a topic, partitioned or not, as the Java client's `PartitionedProducerImpl`:
//! a non-partitioned topic has one [`Producer`]; a partitioned one has one per partition (each
//! partition is a topic of its own, `{topic}-partition-{i}`, under the same producer name, so the
//! broker deduplicates per partition), and each frame goes to the partition its key picks
//! (`route::partition`, the Java client's key-based routing).
//!
//! Whether a topic is partitioned is learned from the broker when the first producer connects
//! (the lookup asks `PARTITIONED_METADATA`): the topic's producer starts as one, and the caller's
//! [`TopicProducer::refresh`] turns it into one per partition once the broker has said so. The
//! partition count is then asked again every [`PARTITIONS_CHECK`] (the Java client's
//! `autoUpdatePartitionsInterval`): partitions added while rigd runs get producers; keys then map
//! over the new count, as they do for Java producers.
//!
//! What the caller sees is one producer: a frame is taken or given back (its partition's window is
//! full or that partition is not connected, and the lane spools it, so a source's frames still
//! reach each partition in capture order); the link is up when every partition's is; acks arrive
//! in submission order, as from one producer ([`AckOrder`]: each partition's acks come in its own
//! order, and one partition's may overtake another's).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

use super::producer::{Producer, ProducerConfig, ProducerStats};
use super::window::Ack;
use crate::payload::Held;
use crate::wire::Bucket;

/// How often a partitioned topic's partition count is asked again.
pub const PARTITIONS_CHECK: Duration = Duration::from_secs(60);
/// One such question, connection included.
const PARTITIONS_TIMEOUT: Duration = Duration::from_secs(10);

/// The caller's handle: the producers of one topic's partitions (or the topic's one producer).
pub struct TopicProducer {
    cfg: ProducerConfig,
    acks: mpsc::UnboundedSender<Ack>,
    shutdown: watch::Receiver<bool>,
    parts: Parts,
    /// Reports the topic's link state and window into the shared stats (the live epoch's
    /// producer; a backlog's does not, see [`Producer::to_backlog`]).
    live: AtomicBool,
    /// The budget rank of every partition's producer (changed by [`TopicProducer::to_backlog`]).
    rank: AtomicUsize,
}

enum Parts {
    /// Not partitioned (or not known yet): one producer on the topic itself.
    Whole(Producer),
    Partitioned {
        /// Partition i's producer at index i.
        parts: Vec<Producer>,
        /// The partitions' acks, put back in submission order by `forward`.
        order: Arc<Mutex<AckOrder>>,
        /// Where the partitions' producers send their acks (dropped at close, which ends
        /// `forward` once the producers have sent their last).
        acks_in: mpsc::UnboundedSender<Ack>,
        forward: tokio::task::JoinHandle<()>,
        /// The partition count last answered by the broker (never lowered: Pulsar cannot remove
        /// partitions).
        count: Arc<AtomicU32>,
        watch: tokio::task::JoinHandle<()>,
    },
}

impl TopicProducer {
    /// Starts the topic's producer; acks arrive on `acks` (see the module doc for their order).
    pub fn spawn(
        mut cfg: ProducerConfig,
        acks: mpsc::UnboundedSender<Ack>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        // The partitions share the source's stats (published, errors) with the whole.
        cfg.stats.get_or_insert_with(Default::default);
        let whole = Producer::spawn(cfg.clone(), acks.clone(), shutdown.clone());
        let live = cfg.rank < super::budget::RECALL_RANK;
        TopicProducer {
            rank: AtomicUsize::new(cfg.rank),
            cfg,
            acks,
            shutdown,
            parts: Parts::Whole(whole),
            live: AtomicBool::new(live),
        }
    }

    /// Follows what the broker said of the topic: one producer per partition once it is known to
    /// be partitioned, more when partitions were added. Returns the frames a replaced producer
    /// gave back (none in practice: a producer learns the topic is partitioned before it takes a
    /// frame). Call it on every turn of the caller's loop.
    pub async fn refresh(&mut self) -> Vec<Held> {
        let mut left = Vec::new();
        if let Parts::Whole(p) = &self.parts {
            let n = p.partitioned();
            if n > 0 && p.held() == 0 {
                let count = Arc::new(AtomicU32::new(n));
                let watch = tokio::spawn(watch_partitions(
                    self.cfg.clone(),
                    count.clone(),
                    self.shutdown.clone(),
                ));
                let order = Arc::new(Mutex::new(AckOrder::default()));
                let (acks_in, from_parts) = mpsc::unbounded_channel();
                let forward = tokio::spawn(forward(from_parts, order.clone(), self.acks.clone()));
                let old = std::mem::replace(
                    &mut self.parts,
                    Parts::Partitioned {
                        parts: Vec::new(),
                        order,
                        acks_in,
                        forward,
                        count,
                        watch,
                    },
                );
                if let Parts::Whole(p) = old {
                    left = p.close().await;
                }
            }
        }
        if let Parts::Partitioned {
            parts,
            count,
            acks_in,
            ..
        } = &mut self.parts
        {
            let n = count.load(Ordering::Acquire) as usize;
            if parts.len() < n {
                tracing::info!(topic = %self.cfg.topic, producer = %self.cfg.producer_name,
                    from = parts.len(), partitions = n, "producing to the topic's partitions");
            }
            while parts.len() < n {
                let mut cfg = self.cfg.clone();
                cfg.topic = partition_topic(&self.cfg.topic, parts.len());
                cfg.partition = true;
                cfg.rank = self.rank.load(Ordering::Relaxed);
                parts.push(Producer::spawn(cfg, acks_in.clone(), self.shutdown.clone()));
            }
            if self.live.load(Ordering::Relaxed) {
                let stats = self.stats();
                stats
                    .connected
                    .store(self.is_connected(), Ordering::Release);
                stats.in_flight.store(self.held(), Ordering::Relaxed);
            }
        }
        left
    }

    /// Hands a frame to its partition's producer if that one takes it (connected, room in its
    /// window); otherwise gives it back (the caller spools it).
    pub fn try_submit(&self, frame: Held) -> Result<(), Held> {
        match &self.parts {
            Parts::Whole(p) => p.try_submit(frame),
            Parts::Partitioned { parts, .. } if parts.is_empty() => Err(frame),
            Parts::Partitioned { parts, order, .. } => {
                let key = Bucket::of(frame.capture_ns, self.cfg.bucket_ms)
                    .0
                    .to_string();
                let i = super::route::partition(self.cfg.hashing, &key, parts.len() as u32);
                // Noted before the partition may ack it, and taken back if it refuses.
                let mut order = lock(order);
                order.submitted(frame.seq, i);
                let r = parts[i as usize].try_submit(frame);
                if r.is_err() {
                    order.refused();
                }
                r
            }
        }
    }

    /// Resolves when a partition may have room again, acks arrived or a connection changed.
    pub async fn room(&self) {
        match &self.parts {
            Parts::Whole(p) => p.room().await,
            Parts::Partitioned { parts, .. } if parts.is_empty() => {
                // Nothing to wait on until `refresh` opens them (the caller's next turn).
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Parts::Partitioned { parts, .. } => {
                futures::future::select_all(parts.iter().map(|p| Box::pin(p.room()))).await;
            }
        }
    }

    /// See [`Producer::to_backlog`].
    pub fn to_backlog(&self, rank: usize) {
        self.live.store(false, Ordering::Relaxed);
        self.rank.store(rank, Ordering::Relaxed);
        for p in self.producers() {
            p.to_backlog(rank);
        }
    }

    /// Frames in the windows (not yet acked).
    pub fn held(&self) -> usize {
        self.producers().map(Producer::held).sum()
    }

    /// Every partition's producer is connected and its link moves.
    pub fn is_connected(&self) -> bool {
        match &self.parts {
            Parts::Whole(p) => p.is_connected(),
            Parts::Partitioned { parts, .. } => {
                !parts.is_empty() && parts.iter().all(Producer::is_connected)
            }
        }
    }

    pub fn stats(&self) -> &Arc<ProducerStats> {
        self.cfg.stats.as_ref().expect("set at spawn")
    }

    /// Stops every producer (each bounded, see [`Producer::close`]) and returns every frame
    /// without an ack, in capture order.
    pub async fn close(self) -> Vec<Held> {
        let (producers, forwarder) = match self.parts {
            Parts::Whole(p) => (vec![p], None),
            Parts::Partitioned {
                parts,
                watch,
                forward,
                acks_in,
                ..
            } => {
                watch.abort();
                drop(acks_in);
                (parts, Some(forward))
            }
        };
        let mut left: Vec<Held> =
            futures::future::join_all(producers.into_iter().map(Producer::close))
                .await
                .into_iter()
                .flatten()
                .collect();
        left.sort_by_key(|f| f.seq);
        // The producers are gone, and with them the senders of their acks: `forward` hands on
        // the last ones and ends.
        if let Some(f) = forwarder {
            if tokio::time::timeout(Duration::from_secs(1), f)
                .await
                .is_err()
            {
                tracing::warn!(topic = %self.cfg.topic, "partition acks not handed on in time");
            }
        }
        if self.live.load(Ordering::Relaxed) {
            if let Some(stats) = &self.cfg.stats {
                stats.connected.store(false, Ordering::Release);
                stats.in_flight.store(0, Ordering::Relaxed);
            }
        }
        left
    }

    fn producers(&self) -> impl Iterator<Item = &Producer> {
        match &self.parts {
            Parts::Whole(p) => std::slice::from_ref(p).iter(),
            Parts::Partitioned { parts, .. } => parts.iter(),
        }
    }
}

/// The partitions' acks put back in submission order: the lane matches acks to frames as from one
/// producer (an ack covers the frames it handed over before, see `pipeline::backlog`). Pure.
#[derive(Debug, Default)]
pub struct AckOrder {
    /// Frames taken by a partition, in submission order, with their ack once it came.
    pending: VecDeque<Pending>,
}

#[derive(Debug)]
struct Pending {
    seq: u64,
    partition: u32,
    ack: Option<Ack>,
    /// Its partition acked a later frame first: this one's ack was lost with a connection (the
    /// frame stays where it is, as with one producer).
    lost: bool,
}

impl AckOrder {
    /// Frame `seq` is offered to `partition`.
    pub fn submitted(&mut self, seq: u64, partition: u32) {
        self.pending.push_back(Pending {
            seq,
            partition,
            ack: None,
            lost: false,
        });
    }

    /// ... and was refused: forgotten.
    pub fn refused(&mut self) {
        self.pending.pop_back();
    }

    /// A partition's ack; returns the acks now due, in submission order.
    pub fn acked(&mut self, ack: Ack) -> Vec<Ack> {
        let Some(i) = self.pending.iter().position(|p| p.seq == ack.seq) else {
            // Not one of ours (cannot happen): handed on rather than held.
            return vec![ack];
        };
        let partition = self.pending[i].partition;
        for p in self.pending.range_mut(..i) {
            if p.partition == partition && p.ack.is_none() {
                p.lost = true;
            }
        }
        self.pending[i].ack = Some(ack);
        self.due(false)
    }

    /// The acks at the front (all that came, when `all`: the partitions are closed, and what has
    /// no ack went back to the caller with `close`).
    pub fn due(&mut self, all: bool) -> Vec<Ack> {
        let mut out = Vec::new();
        while let Some(front) = self.pending.front() {
            if front.ack.is_none() && !front.lost && !all {
                break;
            }
            if let Some(ack) = self.pending.pop_front().and_then(|p| p.ack) {
                out.push(ack);
            }
        }
        out
    }
}

/// Hands the partitions' acks on in submission order until every partition's producer is gone.
async fn forward(
    mut from_parts: mpsc::UnboundedReceiver<Ack>,
    order: Arc<Mutex<AckOrder>>,
    to: mpsc::UnboundedSender<Ack>,
) {
    while let Some(ack) = from_parts.recv().await {
        for a in lock(&order).acked(ack) {
            let _ = to.send(a);
        }
    }
    for a in lock(&order).due(true) {
        let _ = to.send(a);
    }
}

fn lock(order: &Mutex<AckOrder>) -> MutexGuard<'_, AckOrder> {
    order.lock().unwrap_or_else(|p| p.into_inner())
}

/// Partition `i` of `topic`, as Pulsar names it.
pub fn partition_topic(topic: &str, i: usize) -> String {
    format!("{topic}-partition-{i}")
}

/// Asks the broker for the topic's partition count every [`PARTITIONS_CHECK`] (on the rig's
/// pooled connection) and raises `count` when it grew. A failed question is logged at debug and asked again at the next turn: the
/// partitions' own producers report the link.
async fn watch_partitions(
    cfg: ProducerConfig,
    count: Arc<AtomicU32>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(PARTITIONS_CHECK) => {}
            r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
        }
        let mut setup = cfg.setup();
        match tokio::time::timeout(PARTITIONS_TIMEOUT, setup.partitions()).await {
            Ok(Ok(n)) => {
                let was = count.fetch_max(n, Ordering::AcqRel);
                if n > was {
                    tracing::info!(topic = %cfg.topic, from = was, partitions = n, "partitions added to the topic");
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(topic = %cfg.topic, error = %e, "partition count not read")
            }
            Err(_) => tracing::debug!(topic = %cfg.topic, "partition count not read in time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(seq: u64) -> Ack {
        Ack {
            seq,
            outcome: super::super::Outcome::Persisted,
            latency: Duration::ZERO,
            capture_ns: 0,
            bytes: 1,
        }
    }

    fn seqs(acks: Vec<Ack>) -> Vec<u64> {
        acks.into_iter().map(|a| a.seq).collect()
    }

    #[test]
    fn acks_of_partitions_are_handed_on_in_submission_order() {
        let mut o = AckOrder::default();
        for (seq, partition) in [(0, 0), (1, 1), (2, 0), (3, 1)] {
            o.submitted(seq, partition);
        }
        o.submitted(4, 1);
        o.refused();
        assert!(seqs(o.acked(ack(1))).is_empty(), "1 waits for 0");
        assert!(seqs(o.acked(ack(3))).is_empty());
        assert_eq!(seqs(o.acked(ack(0))), [0, 1]);
        assert_eq!(seqs(o.acked(ack(2))), [2, 3]);
        assert!(o.pending.is_empty(), "the refused 4 was forgotten");
    }

    #[test]
    fn an_ack_lost_in_a_partition_does_not_hold_the_others() {
        let mut o = AckOrder::default();
        for (seq, partition) in [(0, 0), (1, 1), (2, 0), (3, 1)] {
            o.submitted(seq, partition);
        }
        // Partition 0's receipt of 0 was lost with its connection; 2's came.
        assert!(seqs(o.acked(ack(2))).is_empty(), "1 has no ack yet");
        assert_eq!(seqs(o.acked(ack(1))), [1, 2], "0 is passed over, as lost");
        // At close, what has an ack goes on, the rest went back to the caller.
        o.submitted(4, 0);
        o.submitted(5, 1);
        assert!(
            seqs(o.acked(ack(5))).is_empty(),
            "4 has no ack yet; 3 is lost"
        );
        assert_eq!(seqs(o.due(true)), [5]);
    }

    #[test]
    fn partitions_are_named_as_pulsar_names_them() {
        assert_eq!(
            partition_topic("persistent://ai/ingest/camera", 3),
            "persistent://ai/ingest/camera-partition-3"
        );
    }
}
