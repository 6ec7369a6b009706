//! Campaigns (docs/CAMPAIGNS.md, issue 51): conditions pushed from the fleet on the rig's control
//! topic, evaluated on the rig as frames arrive; each trigger becomes a recall upload of a window
//! around it (each frame once, retention pinned until sent), within a byte quota per day.
//!
//! - [`spec`]: the campaign message and its validation, pure.
//! - [`eval`]: the conditions evaluated on inputs, and the ledger that turns triggers into windows
//!   and counts the quota, pure.
//! - [`store`]: what survives a restart.
//! - [`run`]: the task that feeds frames and ticks to the conditions and queues the windows with
//!   recall; the lanes' observer that hands it a source's frames.
//! - [`client`]: `rigd campaign`, the operator's side.
//!
//! Built on recall ([`crate::recall`]): its control topic reader routes `op = "campaign"` and
//! `"campaigns"` here ([`crate::recall::Extension`]), its answers go to the same status topic, and
//! a window is a recall upload `{campaign}-w{n}`, whose frames the uploader hands over only while
//! [`Campaigns::take`] says the quota allows.

pub mod client;
pub mod eval;
pub mod run;
pub mod spec;
pub mod store;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::recall::protocol::{Answer, State};
use crate::recall::Recall;
use crate::spool::SpoolError;
use eval::{Evaluator, Ledger};
use spec::{Campaign, Message, SourceInfo};
use store::{Phase, Record, Store};

/// Stopped and expired campaigns kept for `list` (the oldest beyond are forgotten).
const KEEP_INACTIVE: usize = 64;

/// A campaign in memory: what is persisted, and its condition's state (not persisted: a restart
/// evaluates from the next input on).
pub struct Entry {
    pub record: Record,
    pub eval: Evaluator,
    /// Its ledger moved since the last checkpoint.
    pub dirty: bool,
    /// The day's quota was said spent (answered once).
    pub quota_said: bool,
}

/// Every campaign, by id.
#[derive(Default)]
pub struct Book {
    pub entries: BTreeMap<String, Entry>,
}

/// Campaigns' shared state: the control reader's hook, the uploader's quota, the task's book.
pub struct Campaigns {
    pub rig: String,
    pub sources: Vec<SourceInfo>,
    pub(crate) recall: Arc<Recall>,
    store: Store,
    now_ns: Box<dyn Fn() -> i64 + Send + Sync>,
    book: Mutex<Book>,
    rejected: Mutex<BTreeMap<&'static str, u64>>,
    /// Frames the evaluation's queue had no room for.
    pub feed_dropped: Arc<AtomicU64>,
    /// Whether the lanes' observers feed the evaluation: while a campaign is active
    /// ([`Campaigns::refeed`]).
    feeding: Arc<AtomicBool>,
}

impl Campaigns {
    /// The campaigns persisted in the spool, ready to evaluate.
    pub fn open(
        recall: Arc<Recall>,
        sources: Vec<SourceInfo>,
        now_ns: Box<dyn Fn() -> i64 + Send + Sync>,
        feed_dropped: Arc<AtomicU64>,
        feeding: Arc<AtomicBool>,
    ) -> Result<Arc<Self>, SpoolError> {
        let store = Store::open(recall.spool.clone())?;
        let mut book = Book::default();
        for record in store.all()? {
            let eval = Evaluator::new(&record.campaign.when);
            book.entries.insert(
                record.campaign.id.clone(),
                Entry {
                    record,
                    eval,
                    dirty: false,
                    quota_said: false,
                },
            );
        }
        let campaigns = Campaigns {
            rig: recall.rig.clone(),
            sources,
            recall,
            store,
            now_ns,
            book: Mutex::new(book),
            rejected: Mutex::default(),
            feed_dropped,
            feeding,
        };
        campaigns.refeed(&campaigns.book());
        Ok(Arc::new(campaigns))
    }

    /// The lanes' observers feed the evaluation while a campaign is active: with none, a frame
    /// reaches no condition, so capture pays nothing for it. Called when a campaign's phase
    /// changes.
    pub(crate) fn refeed(&self, book: &Book) {
        let active = book
            .entries
            .values()
            .any(|e| e.record.phase == Phase::Active);
        self.feeding.store(active, Ordering::Relaxed);
    }

    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now(&self) -> i64 {
        (self.now_ns)()
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// An answer about campaign `id` (its state when it is known).
    pub(crate) fn answer(&self, state: State, id: &str, entry: Option<&Entry>) -> Answer {
        let mut a = Answer::new(id, &self.rig, state, self.now());
        a.campaign = entry.map(|e| serde_json::to_value(status(e)).expect("a state serializes"));
        a
    }

    fn reject(&self, r: spec::Rejected) -> Answer {
        *self
            .rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(r.kind)
            .or_default() += 1;
        tracing::info!(id = r.id.as_deref().unwrap_or(""), reason = %r.reason, "campaign: rejected");
        let mut a = Answer::new(
            r.id.as_deref().unwrap_or(""),
            &self.rig,
            State::Rejected,
            self.now(),
        );
        a.reason = Some(r.reason);
        a.campaign = Some(serde_json::json!({ "rejected": r.kind }));
        a
    }

    /// One campaign message: validated, recorded durably, answered.
    fn message(&self, bytes: &[u8]) -> Result<Vec<Answer>, SpoolError> {
        let now = self.now();
        let m = match spec::parse(bytes, &self.sources, now) {
            Ok(m) => m,
            Err(r) => return Ok(vec![self.reject(r)]),
        };
        let mut book = self.book();
        let mut stopped = None;
        let answer = match m {
            Message::Push(c) => {
                let id = c.id.clone();
                if let Some(e) = book.entries.get(&id) {
                    if e.record.phase == Phase::Active && e.record.campaign == c {
                        return Ok(vec![self.answer(State::Accepted, &id, Some(e))]);
                    }
                }
                let active = book
                    .entries
                    .values()
                    .filter(|e| e.record.phase == Phase::Active && e.record.campaign.id != id)
                    .count();
                if active >= spec::MAX_ACTIVE {
                    drop(book);
                    return Ok(vec![self.reject(spec::Rejected {
                        id: Some(id),
                        kind: "too-many-campaigns",
                        reason: format!(
                            "{} campaigns are active; stop one first",
                            spec::MAX_ACTIVE
                        ),
                    })]);
                }
                // A campaign pushed again with other terms keeps its ledger (its day's quota).
                let ledger = book
                    .entries
                    .get(&id)
                    .map(|e| e.record.ledger.clone())
                    .unwrap_or_default();
                let entry = Entry {
                    eval: Evaluator::new(&c.when),
                    record: Record {
                        campaign: c,
                        ledger,
                        phase: Phase::Active,
                    },
                    dirty: false,
                    quota_said: false,
                };
                self.store.put(&[&entry.record], true)?;
                tracing::info!(campaign = %id, "campaign: accepted");
                let a = self.answer(State::Accepted, &id, Some(&entry));
                book.entries.insert(id, entry);
                self.refeed(&book);
                a
            }
            Message::Stop { id, cancel } => match book.entries.get_mut(&id) {
                Some(e) => {
                    if e.record.phase == Phase::Active {
                        e.record.phase = Phase::Stopped;
                        self.store.put(&[&e.record], true)?;
                        tracing::info!(campaign = %id, "campaign: stopped");
                    }
                    let a = self.answer(State::Stopped, &id, Some(e));
                    self.forget_inactive(&mut book)?;
                    self.refeed(&book);
                    stopped = cancel.then_some(id);
                    a
                }
                None => self.reject(spec::Rejected {
                    kind: "unknown-campaign",
                    reason: format!("no campaign {id:?} to stop"),
                    id: Some(id),
                }),
            },
            Message::List { id } => {
                let mut a = Answer::new(&id, &self.rig, State::Campaigns, now);
                let list: Vec<_> = book.entries.values().map(status).collect();
                a.campaign = Some(serde_json::json!({ "campaigns": list }));
                a
            }
        };
        // A stop with `cancel` cancels the campaign's windows still waiting or uploading: after
        // the book's lock, since the uploader asks a campaign's priority while it holds recall's
        // turn.
        drop(book);
        let mut answers = vec![answer];
        if let Some(id) = stopped {
            let cancelled = self
                .recall
                .cancel_all(|upload| campaign_of(upload) == Some(id.as_str()))?;
            if !cancelled.is_empty() {
                tracing::info!(campaign = %id, windows = cancelled.len(), "campaign: waiting windows cancelled");
            }
            answers.extend(cancelled);
        }
        Ok(answers)
    }

    /// Keeps at most [`KEEP_INACTIVE`] stopped or expired campaigns.
    pub(crate) fn forget_inactive(&self, book: &mut Book) -> Result<(), SpoolError> {
        let inactive: Vec<String> = book
            .entries
            .iter()
            .filter(|(_, e)| e.record.phase != Phase::Active)
            .map(|(id, _)| id.clone())
            .collect();
        for id in inactive
            .iter()
            .take(inactive.len().saturating_sub(KEEP_INACTIVE))
        {
            book.entries.remove(id);
            self.store.remove(id)?;
        }
        Ok(())
    }

    /// For the status page and `/metrics`.
    pub fn status(&self) -> rigd_web::CampaignsStatus {
        let book = self.book();
        let rejected: BTreeMap<String, u64> = self
            .rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect();
        rigd_web::CampaignsStatus {
            active: book
                .entries
                .values()
                .filter(|e| e.record.phase == Phase::Active)
                .count() as u64,
            rejected: rejected.values().sum(),
            rejected_by_reason: rejected,
            feed_dropped: self.feed_dropped.load(Ordering::Relaxed),
            campaigns: book.entries.values().map(status).collect(),
        }
    }
}

/// The campaign a window's upload id `{campaign}-w{n}` belongs to.
pub fn campaign_of(upload: &str) -> Option<&str> {
    let (c, n) = upload.rsplit_once("-w")?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(c)
}

/// A campaign's state as the page, the metrics and the answers say it.
pub fn status(e: &Entry) -> rigd_web::CampaignStatus {
    let (c, l): (&Campaign, &Ledger) = (&e.record.campaign, &e.record.ledger);
    let state = match e.record.phase {
        Phase::Active if l.quota_reached => "quota-reached",
        Phase::Active => "active",
        Phase::Expired => "expired",
        Phase::Stopped => "stopped",
    };
    rigd_web::CampaignStatus {
        id: c.id.clone(),
        state: state.to_string(),
        priority: c.priority,
        sources: c.sources.clone(),
        triggers: l.triggers,
        windows: l.windows,
        skipped_gap: l.skipped_gap,
        skipped_quota: l.skipped_quota,
        merged: l.merged,
        last_trigger_ns: l.last_trigger_ns,
        bytes_today: l.bytes_today,
        bytes_total: l.bytes_total,
        quota_bytes: c.quota_bytes,
        quota_reached: l.quota_reached,
        expires_ns: c.expires_ns,
    }
}

impl crate::recall::Extension for Campaigns {
    fn control(&self, bytes: &[u8]) -> Option<Result<Vec<Answer>, SpoolError>> {
        spec::is_campaign(bytes).then(|| self.message(bytes))
    }

    fn take(&self, id: &str, bytes: u64) -> bool {
        let Some(c) = campaign_of(id) else {
            return true;
        };
        let now = self.now();
        let mut book = self.book();
        let Some(e) = book.entries.get_mut(c) else {
            return true;
        };
        let ok = e.record.ledger.take(&e.record.campaign, now, bytes);
        e.dirty = true;
        ok
    }

    fn priority(&self, id: &str) -> u8 {
        campaign_of(id)
            .and_then(|c| {
                self.book()
                    .entries
                    .get(c)
                    .map(|e| e.record.campaign.priority)
            })
            .unwrap_or(0)
    }

    fn status(&self) -> rigd_web::CampaignsStatus {
        Campaigns::status(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_id_names_its_campaign() {
        assert_eq!(campaign_of("gate-7-w12"), Some("gate-7"));
        assert_eq!(campaign_of("gate-w"), None);
        assert_eq!(campaign_of("0b9e-4c1d-wx"), None);
        assert_eq!(campaign_of("marker-12"), None);
    }

    /// A stop with `cancel` cancels the campaign's windows: the waiting one answered `cancelled`
    /// at once, the one uploading told to stop; another campaign's window and an operator's
    /// request untouched. Without `cancel` they stay.
    #[test]
    fn a_stop_cancels_the_campaigns_waiting_and_uploading_windows() {
        let dir = tempfile::tempdir().unwrap();
        let spool =
            crate::spool::Spool::open(&crate::recall::store::spool_config(dir.path())).unwrap();
        let now = 1_000_000_000_000i64;
        let producer =
            Box::new(|_: &str| -> crate::uplink::ProducerConfig { unreachable!("no upload") });
        let (recall, _answers) = Recall::new(
            "van".into(),
            vec![("cam".to_string(), true)],
            spool,
            producer,
            Box::new(move || now),
        )
        .unwrap();
        let sources = vec![SourceInfo {
            id: "cam".into(),
            on_request: true,
            kind: spec::SourceKind::Other,
            retain_ns: None,
        }];
        let campaigns = Campaigns::open(
            recall.clone(),
            sources,
            Box::new(move || now),
            Arc::default(),
            Arc::default(),
        )
        .unwrap();
        for id in ["c", "d"] {
            let push = format!(
                r#"{{"op":"campaign","v":1,"id":"{id}","when":{{"marker":{{}}}},"sources":["cam"],"quota_bytes":1000}}"#
            );
            let a = campaigns.message(push.as_bytes()).unwrap();
            assert_eq!(a[0].state, State::Accepted, "{a:?}");
        }
        for id in ["c-w0", "c-w1", "d-w0", "op-1"] {
            let upload = crate::recall::protocol::Upload {
                id: id.into(),
                sources: vec!["cam".into()],
                from: now - 1_000_000_000,
                to: now,
                force: false,
            };
            recall.ask(upload).unwrap();
        }
        recall.turn().active = Some("c-w0".into());
        let a = campaigns
            .message(br#"{"op":"campaign","v":1,"id":"d","stop":true}"#)
            .unwrap();
        assert_eq!(a.len(), 1, "a stop alone leaves the windows: {a:?}");
        let a = campaigns
            .message(br#"{"op":"campaign","v":1,"id":"c","stop":true,"cancel":true}"#)
            .unwrap();
        let said: Vec<_> = a.iter().map(|a| (a.id.as_str(), a.state)).collect();
        assert_eq!(said, [("c", State::Stopped), ("c-w1", State::Cancelled)]);
        assert!(recall.turn().cancel, "the uploading window is told to stop");
        let mut left: Vec<_> = recall
            .store
            .pending()
            .unwrap()
            .into_iter()
            .map(|p| p.upload.id)
            .collect();
        left.sort();
        // c-w0 stays until the uploader ends it (and answers it `cancelled`).
        assert_eq!(left, ["c-w0", "d-w0", "op-1"]);
        assert!(
            recall.known("c-w1").unwrap(),
            "finished, so its id is never reused"
        );
    }
}
