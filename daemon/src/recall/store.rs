//! What recall keeps durable on the rig, in a sled tree of the spool's index
//! ([`Spool::recall_tree`]), so that a restart (kill -9 included) resumes where it was:
//!
//! - `q/{arrival}`: each accepted upload not finished, in arrival order, with what it has sent.
//!   Written and flushed before the request is acknowledged on the control topic.
//! - `sent/{source}`: the seqs of the source any request has sent (with a receipt), so an
//!   overlapping or repeated request sends each frame once. Checkpointed while a request runs;
//!   what was sent after the last checkpoint is sent again under the same producer name and
//!   sequence ids after a restart, and the broker drops it (deduplication).
//! - `fin/{id}`: the final answer of each of the last [`KEEP_FINISHED`] requests (the same id asked
//!   again gets it again), `fin#{n}` their order.
//!
//! A request's end (its final answer, the sent sets, leaving the queue) is one sled batch.
//!
//! A request's producer names carry its generation (issue 46.5): an id asked again after its
//! final answer left the last [`KEEP_FINISHED`] is a new request under new names, so neither the
//! broker's deduplication state of the old names (which would drop the new request's frames as
//! duplicates: skipped) nor their marks (a forward read finding the old request's frames) say
//! anything of it.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::protocol::{Answer, Counts, Upload};
use super::seqs::SeqSet;
use crate::spool::{Spool, SpoolError};

/// Final answers kept for ids asked again.
const KEEP_FINISHED: u64 = 1024;

/// An accepted upload and how far it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub arrival: u64,
    pub upload: Upload,
    /// Frames sent with a receipt, by this request.
    pub sent: Counts,
    /// Set at acceptance (the rig's clock, ns, made unique in the store), part of the request's
    /// producer names ([`Pending::producer_name`]); None: accepted by a rigd before generations,
    /// whose names it keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

impl Pending {
    /// The producer name this request sends `source`'s frames under:
    /// `rigd-{rig}-{source}-recall-{id}-g{generation, hex}` (without generation, as before).
    pub fn producer_name(&self, rig: &str, source: &str) -> String {
        let name = crate::wire::recall_producer_name(rig, source, &self.upload.id);
        match self.generation {
            Some(g) => format!("{name}-g{g:x}"),
            None => name,
        }
    }
}

pub struct Store {
    tree: sled::Tree,
    spool: Arc<Spool>,
}

fn q_key(arrival: u64) -> String {
    format!("q/{arrival:020}")
}

impl Store {
    pub fn open(spool: Arc<Spool>) -> Result<Self, SpoolError> {
        Ok(Store {
            tree: spool.recall_tree()?,
            spool,
        })
    }

    /// Recall's tree, for what campaigns keep beside its records (crate::campaign::store).
    pub(crate) fn tree(&self) -> &sled::Tree {
        &self.tree
    }

    pub(crate) fn err(&self) -> impl Fn(sled::Error) -> SpoolError + '_ {
        |source| SpoolError::Index {
            path: self.spool.path().to_path_buf(),
            source,
        }
    }

    /// The counter at `key`, counted up by one (the first is 1).
    fn next(&self, key: &str) -> Result<u64, SpoolError> {
        let read = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        Ok(self
            .tree
            .update_and_fetch(key, |v| {
                Some((v.map_or(0, read) + 1).to_le_bytes().to_vec())
            })
            .map_err(self.err())?
            .map_or(0, |b| read(&b)))
    }

    pub(crate) fn flush(&self) -> Result<(), SpoolError> {
        self.spool.flush_index()
    }

    /// The uploads accepted and not finished, oldest first.
    pub fn pending(&self) -> Result<Vec<Pending>, SpoolError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix("q/") {
            let (_, v) = item.map_err(self.err())?;
            match serde_json::from_slice::<Pending>(&v) {
                Ok(p) => out.push(p),
                // Not ours to lose silently, not ours to crash on.
                Err(e) => {
                    tracing::error!(error = %e, "recall: an unreadable pending request in the spool index is skipped")
                }
            }
        }
        Ok(out)
    }

    /// Records a newly accepted upload, durably (before its message is acknowledged).
    pub fn add(&self, upload: Upload) -> Result<Pending, SpoolError> {
        self.add_at(upload, rigd_drivers::realtime_ns().max(0) as u64)
    }

    /// [`Store::add`] with the rig's clock `now_ns`: the generation is above every one this
    /// store gave before, whatever the clock did.
    fn add_at(&self, upload: Upload, now_ns: u64) -> Result<Pending, SpoolError> {
        let arrival = self.next("next")?;
        let read = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        let generation = self
            .tree
            .update_and_fetch("generation", |v| {
                Some(now_ns.max(v.map_or(0, read) + 1).to_le_bytes().to_vec())
            })
            .map_err(self.err())?
            .map_or(now_ns, |b| read(&b));
        let p = Pending {
            arrival,
            upload,
            sent: Counts::default(),
            generation: Some(generation),
        };
        self.put(&p)?;
        self.flush()?;
        Ok(p)
    }

    fn put(&self, p: &Pending) -> Result<(), SpoolError> {
        let v = serde_json::to_vec(p).expect("a pending request serializes");
        self.tree
            .insert(q_key(p.arrival), v)
            .map(drop)
            .map_err(self.err())
    }

    /// A checkpoint of a running request: its counts and the sources' sent sets, durable.
    pub fn checkpoint(&self, p: &Pending, sent: &[(&str, &SeqSet)]) -> Result<(), SpoolError> {
        let mut batch = sled::Batch::default();
        batch.insert(
            q_key(p.arrival).as_bytes(),
            serde_json::to_vec(p).expect("a pending request serializes"),
        );
        for (source, set) in sent {
            batch.insert(
                format!("sent/{source}").as_bytes(),
                serde_json::to_vec(set).expect("a seq set serializes"),
            );
        }
        self.tree.apply_batch(batch).map_err(self.err())?;
        self.flush()
    }

    /// A request's end: its final answer kept, its sent sets stored, out of the queue; durable.
    pub fn finish(
        &self,
        arrival: Option<u64>,
        answer: &Answer,
        sent: &[(&str, &SeqSet)],
    ) -> Result<(), SpoolError> {
        let order = self.next("fin-next")?;
        let mut batch = sled::Batch::default();
        if let Some(a) = arrival {
            batch.remove(q_key(a).as_bytes());
        }
        for (source, set) in sent {
            batch.insert(
                format!("sent/{source}").as_bytes(),
                serde_json::to_vec(set).expect("a seq set serializes"),
            );
        }
        batch.insert(
            format!("fin/{}", answer.id).as_bytes(),
            serde_json::to_vec(answer).expect("an answer serializes"),
        );
        batch.insert(format!("fin#{order:020}").as_bytes(), answer.id.as_bytes());
        if order >= KEEP_FINISHED {
            let old = format!("fin#{:020}", order - KEEP_FINISHED);
            if let Some(id) = self.tree.get(&old).map_err(self.err())? {
                batch.remove(old.as_bytes());
                let id = String::from_utf8_lossy(&id).to_string();
                if id != answer.id {
                    batch.remove(format!("fin/{id}").as_bytes());
                }
            }
        }
        self.tree.apply_batch(batch).map_err(self.err())?;
        self.flush()
    }

    /// The final answer of a finished request, if it is among the last kept.
    pub fn finished(&self, id: &str) -> Result<Option<Answer>, SpoolError> {
        Ok(self
            .tree
            .get(format!("fin/{id}"))
            .map_err(self.err())?
            .and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// What requests have sent of `source`.
    pub fn sent(&self, source: &str) -> Result<SeqSet, SpoolError> {
        Ok(self
            .tree
            .get(format!("sent/{source}"))
            .map_err(self.err())?
            .and_then(|v| serde_json::from_slice(&v).ok())
            .unwrap_or_default())
    }
}

/// A spool in `dir` for unit tests (no free-space reserve): recall's and campaigns' stores.
#[cfg(test)]
pub(crate) fn spool_config(dir: &std::path::Path) -> crate::config::SpoolConfig {
    crate::config::SpoolConfig {
        path: dir.join("spool"),
        free_reserve: crate::config::ByteSize(0),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recall::protocol::State;

    fn upload(id: &str) -> Upload {
        Upload {
            id: id.into(),
            sources: vec!["cam".into()],
            from: 1,
            to: 2,
            force: false,
        }
    }

    #[test]
    fn requests_checkpoints_and_ends_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = spool_config(dir.path());
        let spool = Spool::open(&cfg).unwrap();
        let store = Store::open(spool.clone()).unwrap();
        let mut a = store.add(upload("a")).unwrap();
        store.add(upload("b")).unwrap();
        a.sent = Counts {
            frames: 3,
            bytes: 30,
        };
        let mut sent = SeqSet::default();
        sent.insert_run(10, 13);
        store.checkpoint(&a, &[("cam", &sent)]).unwrap();
        drop(store);
        spool.close().unwrap();
        drop(spool);

        let spool = Spool::open(&cfg).unwrap();
        let store = Store::open(spool).unwrap();
        let pending = store.pending().unwrap();
        assert_eq!(
            pending
                .iter()
                .map(|p| p.upload.id.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"],
            "in arrival order"
        );
        assert_eq!(pending[0].sent.frames, 3);
        assert_eq!(store.sent("cam").unwrap(), sent);
        let done = Answer::new("a", "van", State::Done, 5);
        sent.insert(13);
        store
            .finish(Some(pending[0].arrival), &done, &[("cam", &sent)])
            .unwrap();
        assert_eq!(store.pending().unwrap().len(), 1);
        assert_eq!(store.finished("a").unwrap(), Some(done));
        assert_eq!(store.sent("cam").unwrap().len(), 4);
        // Only the last KEEP_FINISHED final answers are kept.
        for i in 0..KEEP_FINISHED {
            let a = Answer::new(&format!("x{i}"), "van", State::Done, 5);
            store.finish(None, &a, &[]).unwrap();
        }
        assert_eq!(store.finished("a").unwrap(), None);
        assert!(store.finished("x0").unwrap().is_some());
    }

    #[test]
    fn an_id_asked_again_after_its_answer_was_forgotten_sends_under_new_names() {
        // Issue 46.5: "a" finished and left the last KEEP_FINISHED answers; asked again, it is a
        // new request. Under the old name the broker's deduplication state (the old request's
        // highest id) would drop its frames as duplicates, and a forward read from the old
        // name's mark would take the old frames for its own: the name must differ.
        let dir = tempfile::tempdir().unwrap();
        let cfg = spool_config(dir.path());
        let spool = Spool::open(&cfg).unwrap();
        let store = Store::open(spool.clone()).unwrap();
        let first = store.add_at(upload("a"), 5_000).unwrap();
        store
            .finish(
                Some(first.arrival),
                &Answer::new("a", "van", State::Done, 5),
                &[],
            )
            .unwrap();
        for i in 0..KEEP_FINISHED {
            let a = Answer::new(&format!("x{i}"), "van", State::Done, 5);
            store.finish(None, &a, &[]).unwrap();
        }
        assert_eq!(store.finished("a").unwrap(), None, "forgotten");
        // The same id, even with the rig clock stepped back below the first acceptance.
        let again = store.add_at(upload("a"), 4_000).unwrap();
        assert_eq!(first.generation, Some(5_000));
        assert_eq!(again.generation, Some(5_001));
        assert_ne!(
            first.producer_name("van", "cam"),
            again.producer_name("van", "cam")
        );
        assert_eq!(
            again.producer_name("van", "cam"),
            "rigd-van-cam-recall-a-g1389"
        );
        // A request accepted by a rigd before generations resumes under its old name.
        let old: Pending = serde_json::from_str(
            r#"{"arrival":1,"upload":{"id":"a","sources":["cam"],"from":1,"to":2,"force":false},"sent":{"frames":0,"bytes":0}}"#,
        )
        .unwrap();
        assert_eq!(old.producer_name("van", "cam"), "rigd-van-cam-recall-a");
        // It survives a reopen.
        drop(store);
        spool.close().unwrap();
        drop(spool);
        let store = Store::open(Spool::open(&cfg).unwrap()).unwrap();
        assert_eq!(store.pending().unwrap()[0].generation, Some(5_001));
    }
}
