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

    fn err(&self) -> impl Fn(sled::Error) -> SpoolError + '_ {
        |source| SpoolError::Index {
            path: self.spool.path().to_path_buf(),
            source,
        }
    }

    fn flush(&self) -> Result<(), SpoolError> {
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
        let arrival = self
            .tree
            .update_and_fetch("next", |v| {
                let n = v.map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
                Some((n + 1).to_le_bytes().to_vec())
            })
            .map_err(self.err())?
            .map_or(0, |b| {
                u64::from_le_bytes(b.as_ref().try_into().unwrap_or_default())
            });
        let p = Pending {
            arrival,
            upload,
            sent: Counts::default(),
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
        let order = self
            .tree
            .update_and_fetch("fin-next", |v| {
                let n = v.map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
                Some((n + 1).to_le_bytes().to_vec())
            })
            .map_err(self.err())?
            .map_or(0, |b| {
                u64::from_le_bytes(b.as_ref().try_into().unwrap_or_default())
            });
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
