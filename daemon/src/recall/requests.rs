//! The control topic: the rig reads its requests with a durable subscription `rigd-{rig}` (what is
//! sent while it is offline waits on the broker), answers each on `{control-topic}-status` keyed
//! by the request id, and acknowledges a request only once it is durably recorded on the rig
//! ([`super::store`]). Every message gets an answer, after bounded work: a malformed or refused
//! request is `rejected` with the reason and counted, and the daemon goes on.
//!
//! Both go through the rig's own connections ([`crate::uplink::control`]: the pool's one connection
//! per broker, its keepalive, token and TLS identity); a consumer or producer that fails is rebuilt
//! after a backoff of at most [`MAX_BACKOFF`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

use super::protocol::{self, Answer, Held, Request, Span, State};
use super::Recall;
use crate::spool::SpoolError;
use crate::uplink::{
    self,
    control::{Publisher, Subscription},
};

/// Longest pause between attempts to reach the control topic.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// An answer not confirmed by the broker this long: the connection is rebuilt.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Coverage is computed at most this often (a flood of coverage requests reuses it).
const COVERAGE_EVERY: Duration = Duration::from_secs(1);
/// A run of held frames ends at a gap in capture time longer than this.
const RUN_GAP_NS: i64 = 2_000_000_000;

/// Where to read and answer.
#[derive(Debug, Clone)]
pub struct Link {
    pub control_topic: String,
}

impl Link {
    pub fn status_topic(&self) -> String {
        format!("{}-status", self.control_topic)
    }
}

/// Reads requests and writes answers until shutdown.
pub async fn run(
    recall: Arc<Recall>,
    link: Link,
    mut answers: mpsc::Receiver<Answer>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    let mut coverage = Coverage::default();
    // An answer taken from the queue whose send failed: sent first on the next connection.
    let mut unsent: Option<Answer> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = Instant::now();
        let session = Session::open(&recall, &link);
        let result = tokio::select! {
            s = session => match s {
                Ok(mut s) => {
                    recall.stats.connected.store(true, Ordering::Relaxed);
                    tracing::info!(topic = %link.control_topic, "recall: reading requests");
                    let r = s.serve(&recall, &mut answers, &mut unsent, &mut coverage, &mut shutdown).await;
                    recall.stats.connected.store(false, Ordering::Relaxed);
                    s.close().await;
                    r
                }
                Err(e) => Err(e),
            },
            _ = shutdown.changed() => return,
        };
        match result {
            Ok(()) => return,
            Err(why) => {
                recall.stats.error(why.clone());
                tracing::warn!(topic = %link.control_topic, error = %why, retry_in_ms = backoff.as_millis() as u64,
                    "recall: control topic unavailable");
            }
        }
        // A session that held a while starts the backoff over.
        if started.elapsed() > Duration::from_secs(30) {
            backoff = Duration::from_millis(200);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

struct Session {
    requests: Subscription,
    answers: Publisher,
}

impl Session {
    async fn open(recall: &Recall, link: &Link) -> Result<Session, String> {
        // The rig's producer settings (its pool, token, TLS), for the control topics.
        let base = (recall.producer)("control");
        let name = format!("rigd-{}", recall.rig);
        let requests = uplink::control::subscribe(&base, &link.control_topic, &name)
            .await
            .map_err(|e| format!("cannot subscribe to {}: {e}", link.control_topic))?;
        let answers = uplink::control::publisher(
            &base,
            &link.status_topic(),
            &format!("rigd-{}-control", recall.rig),
            ANSWER_TIMEOUT,
        )
        .await
        .map_err(|e| format!("cannot publish to {}: {e}", link.status_topic()))?;
        Ok(Session { requests, answers })
    }

    async fn close(self) {
        drop(self.requests);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.answers.close()).await;
    }

    /// Until shutdown (Ok) or a failure of the connection (Err, to rebuild it).
    async fn serve(
        &mut self,
        recall: &Arc<Recall>,
        answers: &mut mpsc::Receiver<Answer>,
        unsent: &mut Option<Answer>,
        coverage: &mut Coverage,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), String> {
        if let Some(a) = unsent.take() {
            self.send(&a).await.inspect_err(|_| *unsent = Some(a))?;
        }
        loop {
            tokio::select! {
                m = self.requests.next() => {
                    let delivery = m.map_err(|e| format!("reading requests: {e}"))?;
                    let replies = match delivery.messages {
                        Ok(messages) => {
                            let mut replies = Vec::new();
                            for m in messages {
                                replies.extend(handle(recall, &m, coverage).await
                                    .map_err(|e| format!("recording a request: {e}"))?);
                            }
                            replies
                        }
                        // Nothing to answer: no id can be read out of it.
                        Err(why) => {
                            recall.stats.reject("unreadable");
                            tracing::warn!(reason = %why, "recall: a control message cannot be read; dropped");
                            Vec::new()
                        }
                    };
                    // Recorded: the broker may forget it now. Then the answers.
                    self.requests.ack(&delivery.id);
                    for a in replies {
                        self.send(&a).await?;
                    }
                }
                a = answers.recv() => {
                    let Some(a) = a else { return Ok(()) };
                    if let Err(e) = self.send(&a).await {
                        *unsent = Some(a);
                        return Err(e);
                    }
                }
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }

    async fn send(&mut self, a: &Answer) -> Result<(), String> {
        let payload = serde_json::to_vec(a).expect("an answer serializes");
        let state = format!("{:?}", a.state).to_lowercase();
        self.answers
            .send(&a.id, &[("state", state)], &payload)
            .await
            .map_err(|e| format!("answering {}: {e}", a.id))
    }
}

/// One control message: recorded (an accepted upload, durably) and answered.
async fn handle(
    recall: &Arc<Recall>,
    bytes: &[u8],
    coverage: &mut Coverage,
) -> Result<Vec<Answer>, SpoolError> {
    // A campaign's message (op `campaign`, `campaigns`): theirs to answer (crate::campaign).
    if let Some(answers) = recall.extension().and_then(|e| e.control(bytes)) {
        return answers;
    }
    let pending = recall.stats.pending.load(Ordering::Relaxed) as usize;
    let request = match protocol::parse(bytes, recall.sources.as_slice(), pending) {
        Ok(r) => r,
        Err(r) => {
            recall.stats.reject(r.kind);
            tracing::info!(id = r.id.as_deref().unwrap_or(""), reason = %r.reason, "recall: request rejected");
            return Ok(vec![Answer::rejected(&r, &recall.rig, (recall.now_ns)())]);
        }
    };
    Ok(match request {
        Request::Upload(u) => {
            recall.stats.uploads.fetch_add(1, Ordering::Relaxed);
            // The same id again: the same answer (idempotent), nothing sent twice.
            if let Some(done) = recall.store.finished(&u.id)? {
                return Ok(vec![done]);
            }
            let known = recall.store.pending()?.iter().any(|p| p.upload.id == u.id);
            if !known {
                let id = u.id.clone();
                recall.store.add(u)?;
                recall.stats.pending.fetch_add(1, Ordering::Relaxed);
                recall.wake.notify_one();
                tracing::info!(request = %id, "recall: request accepted");
                return Ok(vec![recall.answer(State::Accepted, &id)]);
            }
            vec![recall.answer(State::Accepted, &u.id)]
        }
        Request::Cancel { id } => {
            recall.stats.cancels.fetch_add(1, Ordering::Relaxed);
            let mut turn = recall.turn();
            if turn.active.as_deref() == Some(id.as_str()) {
                // The uploader stops at its next step and answers `cancelled`.
                turn.cancel = true;
                return Ok(Vec::new());
            }
            let waiting = recall
                .store
                .pending()?
                .into_iter()
                .find(|p| p.upload.id == id);
            match waiting {
                Some(p) => vec![recall.cancel_waiting(p)?],
                None => match recall.store.finished(&id)? {
                    // Finished before the cancel came: its final answer.
                    Some(done) => vec![done],
                    None => {
                        recall.stats.reject("unknown-request");
                        let mut a = recall.answer(State::Rejected, &id);
                        a.reason = Some(format!("no request {id:?} to cancel"));
                        vec![a]
                    }
                },
            }
        }
        Request::Coverage { id } => {
            recall.stats.coverages.fetch_add(1, Ordering::Relaxed);
            let mut a = recall.answer(State::Coverage, &id);
            a.sources = coverage.get(recall).await?;
            vec![a]
        }
    })
}

/// What each on-request source holds, computed at most every [`COVERAGE_EVERY`].
#[derive(Default)]
struct Coverage {
    at: Option<Instant>,
    held: Vec<Held>,
}

impl Coverage {
    async fn get(&mut self, recall: &Arc<Recall>) -> Result<Vec<Held>, SpoolError> {
        if self.at.is_some_and(|t| t.elapsed() < COVERAGE_EVERY) {
            return Ok(self.held.clone());
        }
        let r = recall.clone();
        self.held = tokio::task::spawn_blocking(move || held(&r))
            .await
            .expect("coverage task")?;
        self.at = Some(Instant::now());
        Ok(self.held.clone())
    }
}

/// Each on-request source's frames and the runs of capture time they cover (index only): the
/// `coverage` answer; [`HeldScan`] keeps the same answer up to date for the fleet's digest.
pub(crate) fn held(recall: &Recall) -> Result<Vec<Held>, SpoolError> {
    let mut out = Vec::new();
    for (source, on_request) in &recall.sources {
        if !on_request {
            continue;
        }
        let mut r = Runs::default();
        r.read(recall, &source.as_str().into())?;
        out.push(r.held(source));
    }
    Ok(out)
}

/// One source's runs of held frames as [`held`] reads them, with their seqs (first, last), so
/// that what the spool appends later extends them.
#[derive(Debug, Default)]
struct Runs {
    runs: Vec<(Span, u64, u64)>,
    bytes: u64,
    /// The next seq to read.
    next: u64,
}

impl Runs {
    /// Reads the index from `next` on.
    fn read(&mut self, recall: &Recall, id: &Arc<str>) -> Result<(), SpoolError> {
        loop {
            let batch = recall.spool.entries(id, self.next, 4096)?;
            let Some(end) = batch.last() else {
                return Ok(());
            };
            self.next = end.seq + 1;
            for e in &batch {
                self.bytes += e.len as u64;
                match self.runs.last_mut() {
                    // The run's last frame is at `to - 1`.
                    Some((run, _, last))
                        if e.seq == *last + 1
                            && e.capture_ns >= run.to - 1
                            && e.capture_ns - (run.to - 1) <= RUN_GAP_NS =>
                    {
                        run.to = e.capture_ns + 1;
                        *last = e.seq;
                    }
                    _ => self.runs.push((
                        Span {
                            from: e.capture_ns,
                            to: e.capture_ns + 1,
                        },
                        e.seq,
                        e.seq,
                    )),
                }
            }
        }
    }

    fn frames(&self) -> u64 {
        self.runs
            .iter()
            .map(|(_, first, last)| last - first + 1)
            .sum()
    }

    /// Forgets the frames before `first` (the source's oldest frame now): evicted or dropped,
    /// they went from the front.
    fn forget_before(&mut self, first: Option<(u64, i64)>) {
        let Some((seq, capture_ns)) = first else {
            self.runs.clear();
            return;
        };
        self.runs.retain(|(_, _, last)| *last >= seq);
        if let Some((run, from, _)) = self.runs.first_mut().filter(|(_, from, _)| *from < seq) {
            (run.from, *from) = (capture_ns, seq);
        }
    }

    fn held(&self, source: &str) -> Held {
        Held {
            source: source.to_string(),
            frames: self.frames(),
            bytes: self.bytes,
            held: self.runs.iter().map(|(span, _, _)| *span).collect(),
        }
    }
}

/// [`held`] kept up to date without reading the whole index again: each call reads what the
/// spool appended since the last, and when frames left (the source's `popped` counter moved)
/// forgets those before its oldest frame. Checked against the spool's own count of the source's
/// frames (`records`): read again from the start when they differ (frames left from the middle,
/// or a count caught between its index and its counters).
#[derive(Debug, Default)]
pub(crate) struct HeldScan {
    sources: std::collections::HashMap<String, (Runs, u64)>,
    /// Whole reads of a source's index (the first, and each one the check asked for).
    pub(crate) full_reads: u64,
}

impl HeldScan {
    pub(crate) fn held(&mut self, recall: &Recall) -> Result<Vec<Held>, SpoolError> {
        let mut out = Vec::new();
        for (source, on_request) in &recall.sources {
            if !on_request {
                continue;
            }
            let id: Arc<str> = source.as_str().into();
            let stats = recall.spool.stats(&id);
            let popped = stats.popped.load(Ordering::Relaxed);
            if !self.sources.contains_key(source) {
                self.full_reads += 1;
            }
            let (runs, seen) = self
                .sources
                .entry(source.clone())
                .or_insert_with(|| (Runs::default(), popped));
            let went = *seen != popped;
            if went {
                *seen = popped;
                let first = recall.spool.entries(&id, 0, 1)?;
                runs.forget_before(first.first().map(|e| (e.seq, e.capture_ns)));
            }
            runs.read(recall, &id)?;
            if runs.frames() != stats.records.load(Ordering::Relaxed) {
                self.full_reads += 1;
                *runs = Runs::default();
                runs.read(recall, &id)?;
            } else if went {
                // The bytes of what went are the spool's to say.
                runs.bytes = stats.bytes.load(Ordering::Relaxed);
            }
            out.push(runs.held(source));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, SpoolConfig};
    use crate::spool::Spool;
    use rigd_drivers::{ClockState, Frame, Media};

    const S: i64 = 1_000_000_000;

    fn recall(dir: &std::path::Path) -> Arc<Recall> {
        let cfg = SpoolConfig {
            path: dir.join("spool"),
            free_reserve: ByteSize(0),
            ..Default::default()
        };
        let spool = Spool::open(&cfg).unwrap();
        let sources = vec![("cam".to_string(), true), ("gps".to_string(), false)];
        let producer = Box::new(|_: &str| -> uplink::ProducerConfig { unreachable!() });
        Recall::new("van".into(), sources, spool, producer, Box::new(|| 0))
            .unwrap()
            .0
    }

    fn append(r: &Recall, seqs: std::ops::Range<u64>, t0: i64, every: i64) {
        for seq in seqs {
            let frame = Frame {
                source: "cam".into(),
                seq,
                capture_ns: t0 + seq as i64 * every,
                clock: ClockState::Unsynced,
                media: Media::Serial { text: false },
                payload: vec![7u8; 100 + (seq % 3) as usize].into(),
            };
            r.spool.append(&crate::payload::Held::plain(frame)).unwrap();
        }
    }

    /// What `coverage` answers, kept up to date by reading only what came since: appends, a gap,
    /// eviction from the front (inside a run and of a whole run), and frames that left from the
    /// middle (read again).
    #[test]
    fn the_held_scan_answers_as_a_whole_read_and_reads_only_what_came() {
        let dir = tempfile::tempdir().unwrap();
        let r = recall(dir.path());
        let mut scan = HeldScan::default();
        assert_eq!(scan.held(&r).unwrap(), held(&r).unwrap());
        append(&r, 0..300, 0, S / 30);
        assert_eq!(scan.held(&r).unwrap(), held(&r).unwrap());
        // A gap of 10 s: a second run.
        append(&r, 300..600, 10 * S, S / 30);
        let h = scan.held(&r).unwrap();
        assert_eq!(h, held(&r).unwrap());
        assert_eq!(h[0].held.len(), 2);
        // Evicted inside the first run, then the whole of it.
        let cam: Arc<str> = "cam".into();
        r.spool.evict(&cam, Some(5 * S), None, None).unwrap();
        assert_eq!(scan.held(&r).unwrap(), held(&r).unwrap());
        append(&r, 600..700, 10 * S, S / 30);
        r.spool.evict(&cam, Some(15 * S), None, None).unwrap();
        let h = scan.held(&r).unwrap();
        assert_eq!(h, held(&r).unwrap());
        assert_eq!(h[0].held.len(), 1);
        assert_eq!(scan.full_reads, 1, "only the first read was whole");
        // A frame gone from the middle: the count disagrees, read again.
        r.spool.remove(&cam, 650).unwrap();
        let h = scan.held(&r).unwrap();
        assert_eq!(h, held(&r).unwrap());
        assert_eq!(h[0].held.len(), 2);
        assert_eq!(scan.full_reads, 2);
    }

    /// An hour of a 30 fps camera held: a whole read against the scan's read of what came since.
    /// `cargo test --release -p rigd held_scan_cost -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn held_scan_cost() {
        let dir = tempfile::tempdir().unwrap();
        let r = recall(dir.path());
        append(&r, 0..108_000, 0, S / 30);
        r.spool.commit().unwrap();
        let mut scan = HeldScan::default();
        scan.held(&r).unwrap();
        append(&r, 108_000..108_150, 0, S / 30);
        let t = Instant::now();
        let whole = held(&r).unwrap();
        let whole_t = t.elapsed();
        let t = Instant::now();
        let kept = scan.held(&r).unwrap();
        let kept_t = t.elapsed();
        assert_eq!(whole, kept);
        eprintln!("108,150 frames: whole read {whole_t:?}, the scan's 150 new {kept_t:?}");
    }
}
