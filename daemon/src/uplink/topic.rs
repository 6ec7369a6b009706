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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
    /// A source epoch's recorded routing ([`TopicProducer::keep_routes`]); None: routed by the
    /// partitions of the moment (recall, the offline tools).
    routing: Option<Routing>,
    /// One above the highest capture sequence a partition took.
    taken: AtomicU64,
}

/// Where an epoch's [`Routes`] are recorded, and what was read of them.
struct Routing {
    spool: PathBuf,
    source: String,
    epoch: u64,
    /// Err: the file could not be read; nothing is routed (spooled instead, logged).
    routes: Result<Routes, ()>,
    /// A count that could not be recorded (logged once): not asked again until another.
    failed: Option<u32>,
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
            routing: None,
            taken: AtomicU64::new(0),
        }
    }

    /// Routes a partitioned topic's frames as recorded for `source`'s epoch starting at `epoch`
    /// in the spool directory `spool` ([`Routes`], issue 46.1), and records a new count there
    /// before routing by it. Call it before the first [`TopicProducer::refresh`].
    pub fn keep_routes(&mut self, spool: &Path, source: &str, epoch: u64) {
        let routes = match crate::spool::epochs::read_partitions(spool, source) {
            Ok(all) => Ok(Routes::new(
                all.into_iter()
                    .filter(|c| c.epoch == epoch)
                    .map(|c| (c.from, c.count)),
            )),
            Err(e) => {
                tracing::error!(source, epoch, error = %e,
                    "spool: the partition counts cannot be read; a partitioned topic's frames stay in the spool");
                Err(())
            }
        };
        self.routing = Some(Routing {
            spool: spool.to_path_buf(),
            source: source.to_string(),
            epoch,
            routes,
            failed: None,
        });
    }

    /// Records the broker's partition count `n` for this epoch when it changes the routing.
    fn record_count(&mut self, n: u32) {
        let first = self.cfg.numbering.as_ref().map_or(0, |n| n.first);
        let next = self.taken.load(Ordering::Acquire).max(first);
        let Some(r) = &mut self.routing else { return };
        let Ok(routes) = &mut r.routes else { return };
        let Some((from, count)) = routes.due(n, next) else {
            return;
        };
        if r.failed == Some(count) {
            return;
        }
        let change = crate::spool::epochs::RouteChange {
            epoch: r.epoch,
            from,
            count,
        };
        match tokio::task::block_in_place(|| {
            crate::spool::epochs::add_partitions(&r.spool, &r.source, change)
        }) {
            Ok(()) => {
                tracing::info!(source = %r.source, epoch = r.epoch, from, partitions = count,
                    "partition count recorded: frames from this sequence on go over it");
                routes.record((from, count));
            }
            Err(e) => {
                tracing::error!(source = %r.source, epoch = r.epoch, partitions = count, error = %e,
                    "spool: cannot record the partition count; frames go over the counts recorded before");
                r.failed = Some(count);
            }
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
            let grow = parts.len() < n;
            if grow {
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
            self.record_count(n as u32);
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
                // The group, as the message key is ([`crate::wire::key`]): a GOP on one partition.
                let bucket = Bucket::of(frame.capture_ns, self.cfg.bucket_ms).0;
                let key = rigd_drivers::group_start(bucket, self.cfg.group_buckets).to_string();
                let routes = match &self.routing {
                    None => None,
                    Some(Routing { routes: Ok(r), .. }) => Some(r),
                    Some(_) => return Err(frame),
                };
                let Some(i) = route(routes, self.cfg.hashing, &key, frame.seq, parts.len()) else {
                    return Err(frame);
                };
                // Noted before the partition may ack it, and taken back if it refuses.
                let mut order = lock(order);
                order.submitted(frame.seq, i);
                let seq = frame.seq;
                let r = parts[i as usize].try_submit(frame);
                if r.is_err() {
                    order.refused();
                } else {
                    self.taken
                        .fetch_max(seq.saturating_add(1), Ordering::AcqRel);
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

/// An epoch's partition routing (issue 46.1): which partition count each range of its capture
/// sequences goes over. Pure.
///
/// Sequence ids are the source's capture sequence, so a partition's last persisted id also
/// covers frames its producer never got (they went to the other partitions): a frame can only be
/// judged stored against the partition it was *sent* to. Routed by the count of the moment, a
/// restart after partitions were added judges an earlier run's frames on other partitions: a
/// frame in flight and never stored lands on a partition whose last id is above it (acked
/// `AlreadyPersisted` unsent: lost), a stored one on an empty partition (sent twice). So the count
/// a frame is routed by is a function of its `seq` and what was recorded (`spool::epochs`:
/// `epochs/{source}.partitions`) before any frame was routed by it; a new count applies from a
/// sequence above every frame already sent, by this producer or an earlier run. Each partition's
/// producer still sees an increasing subset of the sequence ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// `(first capture sequence, partition count)`, both ascending.
    changes: Vec<(u64, u32)>,
}

impl Routes {
    pub fn new(changes: impl IntoIterator<Item = (u64, u32)>) -> Self {
        let mut r = Routes::default();
        for c in changes {
            r.record(c);
        }
        r
    }

    /// The partition count frame `seq` goes over; None before one was recorded.
    pub fn count(&self, seq: u64) -> Option<u32> {
        let i = self.changes.partition_point(|&(from, _)| from <= seq);
        i.checked_sub(1).map(|i| self.changes[i].1)
    }

    /// The broker says the topic has `partitions`; every frame this producer takes from now on
    /// is at or above `next`, and no frame at or above `next` was sent before (by this run or an
    /// earlier one). The change to record before routing by it, if any: the first count (from
    /// 0: a spool of an older rigd recorded none, and its frames went over the count of the
    /// moment), or a larger one from `next` on (Pulsar cannot remove partitions).
    pub fn due(&self, partitions: u32, next: u64) -> Option<(u64, u32)> {
        match self.changes.last() {
            None if partitions > 0 => Some((0, partitions)),
            Some(&(from, count)) if partitions > count => Some((next.max(from), partitions)),
            _ => None,
        }
    }

    /// A change is recorded: in force (one at the last change's sequence replaces it).
    pub fn record(&mut self, (from, count): (u64, u32)) {
        match self.changes.last() {
            Some(&(f, _)) if f == from => {
                self.changes.pop();
            }
            Some(&(f, _)) if f > from => return,
            _ => {}
        }
        self.changes.push((from, count));
    }
}

/// The partition of frame `seq` with key `key`: by the count `routes` recorded for its sequence
/// (None: none recorded yet, or more partitions than `open` has producers), or, without
/// `routes` (recall, the offline tools), by the `open` partitions of the moment.
pub fn route(
    routes: Option<&Routes>,
    scheme: super::route::HashingScheme,
    key: &str,
    seq: u64,
    open: usize,
) -> Option<u32> {
    let count = match routes {
        None => open as u32,
        Some(r) => r.count(seq).filter(|&c| c as usize <= open)?,
    };
    Some(super::route::partition(scheme, key, count))
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
    fn a_restart_after_partitions_were_added_judges_each_frame_on_the_partition_it_was_sent_to() {
        // Issue 46.1: run 1 sends frames 0..160 over 3 partitions; the broker stores partition
        // 0's frames up to 159, the other partitions' only below 100 (the rest were in flight when
        // it froze; rigd was killed). The topic then gets a 4th partition and rigd restarts.
        use super::super::plan::{resend, sequence_id, BrokerLast, Resend};
        use super::super::route::HashingScheme;
        let scheme = HashingScheme::Murmur3_32;
        let key = |seq: u64| {
            Bucket::of(1_700_000_000_000_000_000 + seq as i64 * 5_000_000, 20)
                .0
                .to_string()
        };
        let mut run1 = Routes::default();
        let first = run1.due(3, 0).unwrap();
        run1.record(first);
        let mut last = [None::<u64>; 4];
        let mut stored = std::collections::HashSet::new();
        for seq in 0..160 {
            let p = route(Some(&run1), scheme, &key(seq), seq, 3).unwrap() as usize;
            if p == 0 || seq < 100 {
                last[p] = Some(sequence_id(seq, 0, 0));
                stored.insert(seq);
            }
        }
        // Run 2 reads what run 1 recorded; its own numbering starts at 160.
        let mut run2 = Routes::new([first]);
        let change = run2.due(4, 160);
        assert_eq!(
            change,
            Some((160, 4)),
            "the new count from this run's frames on"
        );
        run2.record(change.unwrap());
        let (mut lost, mut twice) = (0, 0);
        for seq in 100..160 {
            let p = route(Some(&run2), scheme, &key(seq), seq, 4).unwrap() as usize;
            let done = resend(seq, 0, 1, last[p].map(BrokerLast::id), false) == Resend::Done;
            lost += usize::from(done && !stored.contains(&seq));
            twice += usize::from(!done && stored.contains(&seq));
        }
        assert_eq!(
            (lost, twice),
            (0, 0),
            "an earlier run's frame is judged on the partition it went to"
        );
        // This run's frames use the 4th partition.
        let p: std::collections::HashSet<u32> = (160..400)
            .map(|s| route(Some(&run2), scheme, &key(s), s, 4).unwrap())
            .collect();
        assert_eq!(p.len(), 4);
    }

    #[test]
    fn a_partition_count_applies_from_above_every_frame_already_sent() {
        let mut r = Routes::default();
        assert_eq!(
            r.count(5),
            None,
            "nothing routed before a count is recorded"
        );
        assert_eq!(r.due(0, 0), None);
        assert_eq!(
            r.due(3, 40),
            Some((0, 3)),
            "the first count covers everything"
        );
        r.record((0, 3));
        assert_eq!(r.due(3, 50), None);
        assert_eq!(r.due(2, 50), None, "partitions are never removed");
        assert_eq!(r.due(4, 50), Some((50, 4)));
        r.record((50, 4));
        assert_eq!(
            (r.count(49), r.count(50), r.count(u64::MAX)),
            (Some(3), Some(4), Some(4))
        );
        // Raised again before any frame went over 4: it replaces that change.
        assert_eq!(r.due(8, 50), Some((50, 8)));
        r.record((50, 8));
        assert_eq!(r, Routes::new([(0, 3), (50, 8)]));
        // A recorded count above the producers open (a topic recreated smaller): not routed.
        use super::super::route::HashingScheme;
        assert_eq!(route(Some(&r), HashingScheme::Murmur3_32, "k", 60, 4), None);
        assert_eq!(
            route(
                Some(&Routes::default()),
                HashingScheme::Murmur3_32,
                "k",
                60,
                4
            ),
            None
        );
        assert!(route(None, HashingScheme::Murmur3_32, "k", 60, 4).is_some());
    }

    #[test]
    fn partitions_are_named_as_pulsar_names_them() {
        assert_eq!(
            partition_topic("persistent://ai/ingest/camera", 3),
            "persistent://ai/ingest/camera-partition-3"
        );
    }
}
