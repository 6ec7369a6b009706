//! The uploader: runs the accepted requests one at a time, oldest first, each source of a request
//! in turn, its frames in seq order.
//!
//! Exactly once: a frame an earlier request sent (the `sent` record, [`super::store`]) is not sent
//! again unless the request says `force`. Each request sends under producer names of its own,
//! `rigd-{rig}-{source}-recall-{id}-g{generation}` ([`Pending::producer_name`]), persisted with it
//! before any frame goes out, with the frames' own sequence ids (increasing in seq order): after a
//! kill -9 the request resumes under the same names. What was sent after the last checkpoint is
//! then found on the topic, not sent again (issue 46.5): the producer records the topic's last
//! entry as each name's start mark before its first frame and its receipts' message ids after
//! (`uplink::probe::Receipts`), and a restart reads the topic forward from there, that name's
//! entries only, so this holds with the broker's deduplication on, off or forgotten, on a topic of
//! the source's own or one shared with other rigs (docs/RECALL.md, "Nothing twice"). The marks of
//! a request's names are removed when it ends.
//!
//! A cancel stops taking frames; the frames already handed to the producer are seen through to
//! their receipts for up to [`CANCEL_SETTLE`], so the cancelled answer's `sent` says exactly what
//! is on the topic. Frames still without a receipt then (the link is down) are of unknown fate:
//! the answer's `reason` counts them, they are not in the sent record, and a later request over
//! the range sends them again (at most a duplicate, never a loss).
//!
//! A range that ends in the future (a marker's "after") stays open: frames captured into it are
//! sent as they are spooled, until the rig clock is [`SETTLE`] past its end. A request waits for
//! the link as long as it takes (the spool holds its frames, retention keeps them); it stops on
//! cancel or shutdown only, and a shutdown leaves it pending for the next start.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

use super::protocol::{Answer, Counts, Missing, Span, State};
use super::seqs::SeqSet;
use super::store::Pending;
use super::Recall;
use crate::payload::Held;
use crate::spool::{Entry, SpoolError};
use crate::uplink::{Ack, Outcome, TopicProducer};

/// A range is closed this long (rig clock) after its end: frames captured before the end are in
/// the spool by then.
pub const SETTLE: Duration = Duration::from_secs(2);
/// Progress is made durable and answered this often.
const CHECKPOINT: Duration = Duration::from_secs(1);
/// Index entries read per step.
const SCAN: usize = 4096;
/// A cancel waits this long for the receipts of the frames already handed to the producer.
pub const CANCEL_SETTLE: Duration = Duration::from_secs(10);

/// How one request ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Finished,
    Cancelled,
    Shutdown,
    /// A campaign's window stopped at its day's quota (crate::campaign).
    Quota,
}

/// Runs the requests until shutdown.
pub async fn run(recall: Arc<Recall>, mut shutdown: watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        let next = {
            let mut turn = recall.turn();
            match recall.store.pending() {
                Ok(p) => {
                    // By priority (a campaign's, crate::campaign; an operator's is 0), then age.
                    let ext = recall.extension();
                    let next = p
                        .into_iter()
                        .min_by_key(|p| (ext.map_or(0, |e| e.priority(&p.upload.id)), p.arrival));
                    turn.active = next.as_ref().map(|p| p.upload.id.clone());
                    turn.cancel = false;
                    next
                }
                Err(e) => {
                    recall.stats.error(format!("reading pending requests: {e}"));
                    tracing::error!(error = %e, "recall: cannot read the pending requests; retrying in 10 s");
                    None
                }
            }
        };
        let Some(p) = next else {
            tokio::select! {
                _ = recall.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                _ = shutdown.changed() => {}
            }
            continue;
        };
        let id = p.upload.id.clone();
        tracing::info!(request = %id, sources = ?p.upload.sources, from = p.upload.from, to = p.upload.to, "recall: uploading");
        match Request::new(&recall, p).run(&mut shutdown).await {
            Ok(End::Shutdown) => return,
            Ok(_) => {}
            Err(e) => {
                // The request stays pending: retried after a pause (a full or failing disk).
                recall.stats.error(format!("request {id}: {e}"));
                tracing::error!(request = %id, error = %e, "recall: the spool failed under a request; retrying in 10 s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        recall.turn().active = None;
    }
}

/// What a cancelled answer says of the frames of unknown fate (pure): None when every frame
/// handed to the producer had its receipt, so `sent` is exactly what the topic holds.
fn cancel_reason(unknown: u64) -> Option<String> {
    (unknown > 0).then(|| {
        format!(
            "cancelled with {unknown} frames written without a broker receipt (the link was down): \
             they may be on the topic, are not counted in sent, and a later request over the range \
             sends them again"
        )
    })
}

/// Entries read from the spool at once: a run of consecutive seqs, up to this many bytes (a
/// few 1080p JPEGs or one large frame) or [`RUN`] entries.
const RUN_BYTES: u64 = 8 << 20;
const RUN: usize = 64;

/// Where a range starts so that it begins at a keyframe (issue 48.4): fed a source's index entries
/// in seq order, it keeps the group under way before `from` (its keyframe and the P-frames since)
/// and, when the range's first frame is a P-frame, takes that group into the range. Pure.
#[derive(Debug, Default)]
struct Lead {
    group: Vec<Entry>,
    started: bool,
}

impl Lead {
    /// The entries entry `e` brings into `[from, to)` (none, itself, or the rest of its group from
    /// its keyframe and itself), and the capture time the range was extended back to, if it was.
    fn entry(&mut self, e: Entry, from: i64, to: i64) -> (Vec<Entry>, Option<i64>) {
        if e.capture_ns < from {
            if !self.started {
                if !e.delta {
                    self.group.clear();
                }
                self.group.push(e);
            }
            return (Vec::new(), None);
        }
        if e.capture_ns >= to {
            return (Vec::new(), None);
        }
        let group = std::mem::take(&mut self.group);
        let first = !std::mem::replace(&mut self.started, true);
        // Only a group that starts at its keyframe (not one whose keyframe left the spool).
        if first && e.delta && group.first().is_some_and(|k| !k.delta) {
            let at = group[0].capture_ns;
            let mut out = group;
            out.push(e);
            return (out, Some(at));
        }
        (vec![e], None)
    }
}

/// Takes the queue's next run of consecutive seqs (at least one entry).
fn next_run(queue: &mut VecDeque<Entry>) -> Vec<Entry> {
    let mut run: Vec<Entry> = Vec::new();
    let mut bytes = 0;
    while let Some(e) = queue.front() {
        let follows = run.last().is_none_or(|l| e.seq == l.seq + 1);
        if !run.is_empty() && (!follows || run.len() >= RUN || bytes + e.len as u64 > RUN_BYTES) {
            break;
        }
        bytes += e.len as u64;
        run.push(queue.pop_front().expect("front"));
    }
    run
}

/// One request being uploaded.
struct Request<'a> {
    recall: &'a Arc<Recall>,
    p: Pending,
    /// Per source of the request: what any request has sent of it.
    sent: Vec<SeqSet>,
    total: Counts,
    already: u64,
    unreadable: Vec<u64>,
    /// Per source: the keyframe the range was extended back to (it started inside a group).
    extended: Vec<Option<i64>>,
    checkpointed: Instant,
    /// Frames handed to a producer that had no receipt when a cancel closed it.
    unknown: u64,
    /// `(sent, total)` as the last checkpoint and progress answer said them: nothing is written
    /// or answered again while they stand still (a request waiting for the link).
    said: (Counts, Counts),
}

/// A request's producer, closed however its upload ends: [`Closing::close`] on the paths out of
/// [`Request::source`], and should the future be dropped mid-way, its `Drop` closes it on the
/// runtime (bounded by the producer's grace).
struct Closing(Option<TopicProducer>);

impl Closing {
    fn get(&mut self) -> &mut TopicProducer {
        self.0.as_mut().expect("open until closed")
    }

    async fn close(&mut self) {
        if let Some(p) = self.0.take() {
            drop(p.close().await);
        }
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                drop(rt.spawn(async move { drop(p.close().await) }));
            }
        }
    }
}

/// One source's producer for the request, and what it holds.
struct Sender {
    producer: Closing,
    acks: mpsc::UnboundedReceiver<Ack>,
    /// Submitted, no receipt yet.
    outstanding: HashMap<u64, u64>,
}

impl<'a> Request<'a> {
    fn new(recall: &'a Arc<Recall>, p: Pending) -> Self {
        let n = p.upload.sources.len();
        Request {
            recall,
            p,
            sent: Vec::with_capacity(n),
            total: Counts::default(),
            already: 0,
            unreadable: vec![0; n],
            extended: vec![None; n],
            checkpointed: Instant::now(),
            said: Default::default(),
            unknown: 0,
        }
    }

    async fn run(mut self, shutdown: &mut watch::Receiver<bool>) -> Result<End, SpoolError> {
        for s in &self.p.upload.sources {
            self.sent.push(self.recall.store.sent(s)?);
        }
        for i in 0..self.p.upload.sources.len() {
            match self.source(i, shutdown).await? {
                End::Finished => {}
                other => {
                    self.checkpoint()?;
                    if other == End::Cancelled {
                        let mut a = self.answer(State::Cancelled);
                        a.missing.clear();
                        a.reason = cancel_reason(self.unknown);
                        self.finish(a).await?;
                    }
                    if other == End::Quota {
                        let mut a = self.answer(State::Partial);
                        a.reason = Some("the campaign's quota for the day is spent".to_string());
                        self.finish(a).await?;
                        return Ok(End::Finished);
                    }
                    return Ok(other);
                }
            }
        }
        let mut a = self.answer(State::Done);
        if !a.missing.is_empty() {
            a.state = State::Partial;
        }
        self.finish(a).await?;
        Ok(End::Finished)
    }

    /// Uploads source `i` of the request.
    async fn source(
        &mut self,
        i: usize,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<End, SpoolError> {
        let recall = self.recall.clone();
        let source: Arc<str> = self.p.upload.sources[i].as_str().into();
        let mut cfg = (recall.producer)(&source);
        cfg.producer_name = self.p.producer_name(&recall.rig, &source);
        // Its start and receipts are recorded in the spool: a restart finds what it sent.
        cfg.marks = Some(recall.spool.path().to_path_buf());
        cfg.properties = vec![("recall".to_string(), self.p.upload.id.clone())];
        cfg.rank = crate::uplink::budget::RECALL_RANK;
        cfg.stats = None;
        // Nothing sent under this name yet (no checkpoint counted a receipt): the topic's last
        // entry is recorded as the name's start mark, nothing read. A name with a mark (frames
        // may have gone out since) is read forward from it whatever this says.
        cfg.fresh = self.p.sent.frames == 0;
        let (tx, acks) = mpsc::unbounded_channel();
        let mut tx_out = Sender {
            producer: Closing(Some(TopicProducer::spawn(cfg, tx, shutdown.clone()))),
            acks,
            outstanding: HashMap::new(),
        };
        // The producer is closed on every path out, a spool or store error's too: left open, its
        // session would hold the request's producer name on the shared connection and every retry
        // of the request would be refused (ProducerBusy), forever (issue 46.4).
        let end = self.pump(i, &source, &mut tx_out, shutdown).await;
        if matches!(end, Ok(End::Cancelled | End::Quota)) {
            // What is in flight is seen through to its receipts (bounded), so `sent` is exact.
            let until = Instant::now() + CANCEL_SETTLE;
            while !tx_out.outstanding.is_empty() && Instant::now() < until {
                tokio::select! {
                    a = tx_out.acks.recv() => match a {
                        Some(a) => self.receipt(i, &mut tx_out.outstanding, a),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(until)) => {}
                    _ = shutdown.changed() => break,
                }
            }
        }
        let Sender {
            mut producer,
            mut acks,
            mut outstanding,
        } = tx_out;
        // What is left without a receipt stays in the spool (sent again on resume, deduplicated).
        producer.close().await;
        // Receipts that came while closing count.
        self.receipts(i, &mut acks, &mut outstanding);
        if matches!(end, Ok(End::Cancelled)) {
            self.unknown += outstanding.len() as u64;
        }
        end
    }

    /// Sends source `i`'s frames of the range through `tx_out` until the range is done, a cancel
    /// or shutdown, or the spool fails.
    async fn pump(
        &mut self,
        i: usize,
        source: &Arc<str>,
        tx_out: &mut Sender,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<End, SpoolError> {
        let recall = self.recall.clone();
        let (from, to, force) = (self.p.upload.from, self.p.upload.to, self.p.upload.force);
        let mut queue: VecDeque<Entry> = VecDeque::new();
        let mut ready: VecDeque<Held> = VecDeque::new();
        let mut cursor = 0u64;
        // Queued entries' sizes in the spool (what `total` counts), until they are submitted.
        let mut lens: HashMap<u64, u32> = HashMap::new();
        let mut scanned_all = false;
        let mut lead = Lead::default();
        let end = loop {
            self.receipts(i, &mut tx_out.acks, &mut tx_out.outstanding);
            if *shutdown.borrow() {
                break End::Shutdown;
            }
            if recall.turn().cancel {
                break End::Cancelled;
            }
            if self.checkpointed.elapsed() >= CHECKPOINT && (self.p.sent, self.total) != self.said {
                self.checkpoint()?;
                recall.say_progress(self.answer(State::Progress));
                self.said = (self.p.sent, self.total);
            }
            // Frames a replaced producer gave back (a topic found partitioned) go first.
            for f in tx_out.producer.get().refresh().await.into_iter().rev() {
                ready.push_front(f);
            }
            // The next frame: one handed back, or the next entries of the range, read a run at
            // a time.
            if ready.is_empty() && !queue.is_empty() {
                let run = next_run(&mut queue);
                let (spool, s) = (recall.spool.clone(), source.clone());
                let (first, n) = (run[0].seq, run.len());
                let read = tokio::task::spawn_blocking(move || spool.read_from(&s, first, n))
                    .await
                    .expect("spool read task")?;
                let mut read = read.into_iter().peekable();
                for e in run {
                    while read.next_if(|f| f.seq < e.seq).is_some() {}
                    match read.next_if(|f| f.seq == e.seq) {
                        Some(f) => ready.push_back(f),
                        // Evicted by the spool's own limits or quarantined since the scan.
                        None => self.unreadable[i] += 1,
                    }
                }
            }
            let frame = ready.pop_front();
            if let Some(mut frame) = frame {
                let (seq, len) = (frame.seq, frame.payload.len() as u64);
                // A campaign's window: within its quota (its payload bytes), or it stops here.
                if let Some(e) = recall.extension() {
                    if !e.take(&self.p.upload.id, len) {
                        break End::Quota;
                    }
                }
                loop {
                    match tx_out.producer.get().try_submit(frame) {
                        Ok(()) => {
                            // Counted as the spool holds it, as `total` is.
                            let len = lens.remove(&seq).map_or(len, u64::from);
                            tx_out.outstanding.insert(seq, len);
                            break;
                        }
                        Err(f) => {
                            frame = f;
                            self.receipts(i, &mut tx_out.acks, &mut tx_out.outstanding);
                            if *shutdown.borrow() || recall.turn().cancel {
                                ready.push_front(frame);
                                break;
                            }
                            tokio::select! {
                                _ = tx_out.producer.get().room() => {}
                                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                                _ = shutdown.changed() => {}
                            }
                        }
                    }
                }
                continue;
            }
            // Nothing to send: read more of the index, or wait for receipts, the range's end.
            let closed = (recall.now_ns)() >= to.saturating_add(SETTLE.as_nanos() as i64);
            if !scanned_all || !closed {
                let (spool, s) = (recall.spool.clone(), source.clone());
                let batch = tokio::task::spawn_blocking(move || spool.entries(&s, cursor, SCAN))
                    .await
                    .expect("spool index task")?;
                let full = batch.len() >= SCAN;
                if let Some(last) = batch.last() {
                    cursor = last.seq + 1;
                }
                for e in batch.into_iter().flat_map(|e| {
                    let (taken, extended) = lead.entry(e, from, to);
                    if let Some(at) = extended {
                        self.extended[i] = Some(at);
                    }
                    taken
                }) {
                    self.total.frames += 1;
                    self.total.bytes += e.len as u64;
                    if !force && self.sent[i].contains(e.seq) {
                        self.already += 1;
                    } else {
                        lens.insert(e.seq, e.len);
                        queue.push_back(e);
                    }
                }
                if full {
                    continue;
                }
                // The index read to its end after the range closed: nothing more can come.
                scanned_all = closed;
                if !queue.is_empty() {
                    continue;
                }
            }
            if scanned_all && tx_out.outstanding.is_empty() {
                break End::Finished;
            }
            tokio::select! {
                a = tx_out.acks.recv() => if let Some(a) = a { self.receipt(i, &mut tx_out.outstanding, a) },
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = shutdown.changed() => {}
            }
        };
        Ok(end)
    }

    fn receipts(
        &mut self,
        i: usize,
        acks: &mut mpsc::UnboundedReceiver<Ack>,
        outstanding: &mut HashMap<u64, u64>,
    ) {
        while let Ok(a) = acks.try_recv() {
            self.receipt(i, outstanding, a);
        }
    }

    fn receipt(&mut self, i: usize, outstanding: &mut HashMap<u64, u64>, a: Ack) {
        let len = outstanding.remove(&a.seq).unwrap_or(a.bytes as u64);
        match a.outcome {
            Outcome::Persisted | Outcome::AlreadyPersisted => {
                if !self.sent[i].contains(a.seq) {
                    self.sent[i].insert(a.seq);
                }
                self.p.sent.frames += 1;
                self.p.sent.bytes += len;
                let stats = &self.recall.stats;
                stats.frames_sent.fetch_add(1, Ordering::Relaxed);
                stats.bytes_sent.fetch_add(len, Ordering::Relaxed);
            }
            Outcome::Refused(why) => {
                tracing::warn!(request = %self.p.upload.id, seq = a.seq, why = %why, "recall: the broker refused a frame");
                self.unreadable[i] += 1;
            }
        }
    }

    fn sets(&self) -> Vec<(&str, &SeqSet)> {
        self.p
            .upload
            .sources
            .iter()
            .map(String::as_str)
            .zip(self.sent.iter())
            .collect()
    }

    fn checkpoint(&mut self) -> Result<(), SpoolError> {
        self.checkpointed = Instant::now();
        self.recall.store.checkpoint(&self.p, &self.sets())
    }

    /// The answer as things stand: counts, and what of the range is no longer held.
    fn answer(&self, state: State) -> Answer {
        let u = &self.p.upload;
        let mut a = self.recall.answer(state, &u.id);
        a.sent = Some(self.p.sent);
        a.total = Some(self.total);
        a.already_sent = Some(self.already);
        a.from_keyframe = u
            .sources
            .iter()
            .zip(&self.extended)
            .filter_map(|(source, at)| {
                at.map(|from| super::protocol::FromKeyframe {
                    source: source.clone(),
                    from,
                })
            })
            .collect();
        for (i, source) in u.sources.iter().enumerate() {
            let lost = self.recall.spool.lost_through(source).ok().flatten();
            let evicted: Vec<Span> = lost
                .filter(|&t| t >= u.from)
                .map(|t| Span {
                    from: u.from,
                    to: u.to.min(t.saturating_add(1)),
                })
                .into_iter()
                .collect();
            let unreadable = self.unreadable.get(i).copied().unwrap_or(0);
            if !evicted.is_empty() || unreadable > 0 {
                a.missing.push(Missing {
                    source: source.clone(),
                    evicted,
                    unreadable,
                });
            }
        }
        a
    }

    async fn finish(&mut self, a: Answer) -> Result<(), SpoolError> {
        self.recall
            .store
            .finish(Some(self.p.arrival), &a, &self.sets())?;
        // Its names are never used again: their marks go (best effort).
        for source in &self.p.upload.sources {
            let name = self.p.producer_name(&self.recall.rig, source);
            crate::spool::epochs::remove_marks(self.recall.spool.path(), &name);
        }
        self.recall.stats.pending.fetch_sub(1, Ordering::Relaxed);
        tracing::info!(request = %a.id, state = ?a.state, frames = self.p.sent.frames, bytes = self.p.sent.bytes,
            already_sent = self.already, "recall: request finished");
        self.recall.say(a).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_starting_on_a_p_frame_takes_its_group_from_the_keyframe() {
        let e = |seq: u64, delta: bool| Entry {
            seq,
            capture_ns: seq as i64 * 10,
            len: 1,
            delta,
        };
        let run = |entries: &[(u64, bool)], from: i64, to: i64| {
            let mut lead = Lead::default();
            let mut at = None;
            let mut seqs = Vec::new();
            for &(seq, delta) in entries {
                let (taken, extended) = lead.entry(e(seq, delta), from, to);
                at = at.or(extended);
                seqs.extend(taken.iter().map(|t| t.seq));
            }
            (seqs, at)
        };
        // Groups of 3 from seq 0 (keyframes 0, 3, 6); the range [40, 80) starts on P-frame 4.
        let video: Vec<(u64, bool)> = (0..9).map(|s| (s, s % 3 != 0)).collect();
        assert_eq!(run(&video, 40, 80), (vec![3, 4, 5, 6, 7], Some(30)));
        // Starting on a keyframe: nothing to extend.
        assert_eq!(run(&video, 30, 60), (vec![3, 4, 5], None));
        // The group's keyframe left the spool: the range starts where it is.
        let gone: Vec<(u64, bool)> = video[4..].to_vec();
        assert_eq!(run(&gone, 50, 80), (vec![5, 6, 7], None));
        // Without video every frame is whole: exactly the range.
        let plain: Vec<(u64, bool)> = (0..9).map(|s| (s, false)).collect();
        assert_eq!(run(&plain, 40, 80), (vec![4, 5, 6, 7], None));
    }

    #[test]
    fn a_cancelled_answer_says_exactly_what_is_of_unknown_fate() {
        // Issue 46.5: every frame handed over had its receipt: `sent` is the topic's, no reason.
        assert_eq!(cancel_reason(0), None);
        // The link went down under the cancel: the frames without a receipt are named, not
        // counted as sent (a later request sends them again).
        let r = cancel_reason(3).unwrap();
        assert!(
            r.contains("3 frames") && r.contains("not counted in sent"),
            "{r}"
        );
    }
}
