//! Recall (docs/RECALL.md): sources whose frames stay on the rig (`upload = "on-request"`) within
//! a retention of their own, and exactly the time range someone asks for uploaded on request.
//!
//! - [`retention`]: evicts an on-request source's oldest frames beyond `retain-age`/`retain-bytes`
//!   (never those of a request not yet uploaded).
//! - [`protocol`]: the requests read from the control topic and the answers, pure.
//! - [`requests`]: the task that reads the control topic (a durable subscription `rigd-{rig}`),
//!   records each accepted request durably before acknowledging it, and writes the answers.
//! - [`upload`]: the task that uploads the accepted requests one at a time, each frame once.
//! - [`store`]: what survives a restart (pending requests, what was sent, final answers).
//! - [`client`]: `rigd recall`, the operator's side.

pub mod client;
pub mod protocol;
pub mod requests;
mod retention;
pub mod seqs;
pub mod store;
pub mod upload;

pub use retention::{spawn_retention, Retention};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::{mpsc, Notify};

use crate::spool::Spool;
use crate::uplink::ProducerConfig;
use protocol::Answer;
use store::Store;

/// Answers waiting for the status topic at most; an uploader's progress answer is skipped when
/// they are full (the next one says more), every other answer waits for room.
const ANSWER_QUEUE: usize = 1024;

/// What the recall tasks share (and the web UI's marker asks through).
pub struct Recall {
    pub rig: String,
    /// Every source: `(id, on_request)`.
    pub sources: Vec<(String, bool)>,
    pub(crate) spool: Arc<Spool>,
    pub(crate) store: Store,
    /// Source id -> the producer of its topic, with the daemon's token, TLS, encryption, budget
    /// and connection pool (the caller names it and sets the rank).
    pub(crate) producer: Box<dyn Fn(&str) -> ProducerConfig + Send + Sync>,
    /// The rig clock, ns (the capture clock requests are in).
    pub(crate) now_ns: Box<dyn Fn() -> i64 + Send + Sync>,
    answers: mpsc::Sender<Answer>,
    /// Which request the uploader runs, and whether it is to stop (a cancel): one lock, so that a
    /// cancel and the uploader's next pick never both act on a request.
    pub(crate) turn: Mutex<Turn>,
    pub(crate) wake: Notify,
    pub stats: RecallStats,
    /// Campaigns (crate::campaign), once they run: their control messages, quota and priority.
    extension: OnceLock<Arc<dyn Extension>>,
}

/// What campaigns add to recall (crate::campaign implements it; recall does not know them).
pub trait Extension: Send + Sync {
    /// Answers a control message that is theirs; None: not theirs (recall reads it).
    fn control(&self, bytes: &[u8]) -> Option<Result<Vec<Answer>, crate::spool::SpoolError>>;
    /// Whether a frame of `bytes` (payload) of upload `id` may go now; counted if so. An upload
    /// that is not a campaign's always may.
    fn take(&self, id: &str, bytes: u64) -> bool;
    /// Upload `id`'s priority, 0 (first) to 9; an operator's request is 0.
    fn priority(&self, id: &str) -> u8;
    /// Their state for the status page and `/metrics`.
    fn status(&self) -> rigd_web::CampaignsStatus;
}

#[derive(Debug, Default)]
pub struct Turn {
    pub active: Option<String>,
    pub cancel: bool,
}

/// Counters for status and `/metrics`.
#[derive(Debug, Default)]
pub struct RecallStats {
    pub uploads: AtomicU64,
    pub cancels: AtomicU64,
    pub coverages: AtomicU64,
    /// Rejected requests by reason kind ([`protocol::Rejected::kind`]).
    pub rejected: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    pub frames_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub pending: AtomicU64,
    pub connected: std::sync::atomic::AtomicBool,
    pub answers_failed: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

impl RecallStats {
    pub(crate) fn reject(&self, kind: &'static str) {
        *self
            .rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    pub(crate) fn error(&self, why: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }
}

impl Recall {
    /// The shared state and the receiving end of its answers (for [`requests::run`]).
    pub fn new(
        rig: String,
        sources: Vec<(String, bool)>,
        spool: Arc<Spool>,
        producer: Box<dyn Fn(&str) -> ProducerConfig + Send + Sync>,
        now_ns: Box<dyn Fn() -> i64 + Send + Sync>,
    ) -> Result<(Arc<Self>, mpsc::Receiver<Answer>), crate::spool::SpoolError> {
        let (tx, rx) = mpsc::channel(ANSWER_QUEUE);
        let store = Store::open(spool.clone())?;
        let pending = store.pending()?.len() as u64;
        let r = Recall {
            rig,
            sources,
            spool,
            store,
            producer,
            now_ns,
            answers: tx,
            turn: Mutex::default(),
            wake: Notify::new(),
            stats: RecallStats::default(),
            extension: OnceLock::new(),
        };
        r.stats.pending.store(pending, Ordering::Relaxed);
        Ok((Arc::new(r), rx))
    }

    /// Adds campaigns (once).
    pub fn extend(&self, e: Arc<dyn Extension>) {
        let _ = self.extension.set(e);
    }

    pub(crate) fn extension(&self) -> Option<&Arc<dyn Extension>> {
        self.extension.get()
    }

    /// Whether a request is still pending or finished under `id` (a campaign's window ids).
    pub fn known(&self, id: &str) -> Result<bool, crate::spool::SpoolError> {
        Ok(self.store.finished(id)?.is_some()
            || self.store.pending()?.iter().any(|p| p.upload.id == id))
    }

    /// Answers waiting request `p` `cancelled` and removes it (the caller holds [`Recall::turn`],
    /// so the uploader cannot take it meanwhile).
    pub(crate) fn cancel_waiting(
        &self,
        p: store::Pending,
    ) -> Result<Answer, crate::spool::SpoolError> {
        let mut a = self.answer(protocol::State::Cancelled, &p.upload.id);
        a.sent = Some(p.sent);
        self.store.finish(Some(p.arrival), &a, &[])?;
        self.stats.pending.fetch_sub(1, Ordering::Relaxed);
        Ok(a)
    }

    /// Cancels every request whose id `pick` chooses (a stopped campaign's windows): the one
    /// uploading stops at its next step and answers `cancelled` itself; the waiting ones are
    /// answered here. Returns those answers.
    pub(crate) fn cancel_all(
        &self,
        pick: impl Fn(&str) -> bool,
    ) -> Result<Vec<Answer>, crate::spool::SpoolError> {
        let mut turn = self.turn();
        let active = turn.active.clone();
        if active.as_deref().is_some_and(&pick) {
            turn.cancel = true;
        }
        let mut answers = Vec::new();
        for p in self.store.pending()? {
            if pick(&p.upload.id) && active.as_deref() != Some(p.upload.id.as_str()) {
                answers.push(self.cancel_waiting(p)?);
            }
        }
        Ok(answers)
    }

    pub(crate) fn turn(&self) -> std::sync::MutexGuard<'_, Turn> {
        self.turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn answer(&self, state: protocol::State, id: &str) -> Answer {
        Answer::new(id, &self.rig, state, (self.now_ns)())
    }

    /// Queues an answer for the status topic, waiting for room.
    pub(crate) async fn say(&self, a: Answer) {
        let _ = self.answers.send(a).await;
    }

    /// Queues a progress answer unless the queue is full.
    pub(crate) fn say_progress(&self, a: Answer) {
        let _ = self.answers.try_send(a);
    }

    /// Accepts an upload asked for on the rig itself (a technician's marker): recorded as a
    /// request from the control topic is; its answers go to the status topic as well.
    pub fn ask(&self, upload: protocol::Upload) -> Result<(), String> {
        let pending = self.store.pending().map_err(|e| e.to_string())?.len();
        if pending >= protocol::MAX_PENDING {
            return Err(format!(
                "{} recall requests are pending",
                protocol::MAX_PENDING
            ));
        }
        let id = upload.id.clone();
        self.store.add(upload).map_err(|e| e.to_string())?;
        self.stats.uploads.fetch_add(1, Ordering::Relaxed);
        self.stats.pending.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
        // As for a request from the control topic (skipped only if the answer queue is full).
        let _ = self
            .answers
            .try_send(self.answer(protocol::State::Accepted, &id));
        Ok(())
    }

    /// The earliest capture time (ns) of a range a pending request still wants, per source:
    /// retention evicts nothing from there on.
    pub fn pinned(&self, source: &str) -> Option<i64> {
        self.store
            .pending()
            .ok()?
            .iter()
            .filter(|p| p.upload.sources.iter().any(|s| s == source))
            .map(|p| p.upload.from)
            .min()
    }
}
