//! What campaigns keep durable on the rig: each campaign with its ledger (counts, the day's quota
//! bytes, where its last window ended) and phase, at `campaign/{id}` in recall's sled tree of the
//! spool's index. A push is written and flushed before its message is acknowledged on the control
//! topic, so a campaign survives kill -9; ledgers are checkpointed at each trigger and at most
//! once a second while bytes go out.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::eval::Ledger;
use super::spec::Campaign;
use crate::spool::{Spool, SpoolError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Active,
    Expired,
    Stopped,
}

/// One campaign as persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub campaign: Campaign,
    pub ledger: Ledger,
    pub phase: Phase,
}

pub struct Store {
    /// Recall's store: campaigns live in its tree, under their own prefix.
    recall: crate::recall::store::Store,
}

const PREFIX: &str = "campaign/";

impl Store {
    pub fn open(spool: Arc<Spool>) -> Result<Self, SpoolError> {
        Ok(Store {
            recall: crate::recall::store::Store::open(spool)?,
        })
    }

    fn tree(&self) -> &sled::Tree {
        self.recall.tree()
    }

    fn err(&self) -> impl Fn(sled::Error) -> SpoolError + '_ {
        self.recall.err()
    }

    /// Every campaign persisted, by id.
    pub fn all(&self) -> Result<Vec<Record>, SpoolError> {
        let mut out = Vec::new();
        for item in self.tree().scan_prefix(PREFIX) {
            let (_, v) = item.map_err(self.err())?;
            match serde_json::from_slice::<Record>(&v) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::error!(error = %e, "campaign: an unreadable campaign in the spool index is skipped")
                }
            }
        }
        Ok(out)
    }

    /// Writes records (one sled batch), durably when `flush`.
    pub fn put(&self, records: &[&Record], flush: bool) -> Result<(), SpoolError> {
        let mut batch = sled::Batch::default();
        for r in records {
            batch.insert(
                format!("{PREFIX}{}", r.campaign.id).as_bytes(),
                serde_json::to_vec(r).expect("a campaign serializes"),
            );
        }
        self.tree().apply_batch(batch).map_err(self.err())?;
        if flush {
            self.recall.flush()?;
        }
        Ok(())
    }

    /// Forgets a campaign, durably.
    pub fn remove(&self, id: &str) -> Result<(), SpoolError> {
        self.tree()
            .remove(format!("{PREFIX}{id}"))
            .map_err(self.err())?;
        self.recall.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::spec::Condition;

    #[test]
    fn campaigns_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::recall::store::spool_config(dir.path());
        let spool = Spool::open(&cfg).unwrap();
        let store = Store::open(spool.clone()).unwrap();
        let r = Record {
            campaign: Campaign {
                id: "gate".into(),
                when: Condition::Marker { note: None },
                sources: vec!["cam".into()],
                before_ns: 1,
                after_ns: 2,
                gap_ns: 3,
                priority: 4,
                quota_bytes: 5,
                expires_ns: None,
            },
            ledger: Ledger {
                windows: 7,
                bytes_today: 99,
                ..Default::default()
            },
            phase: Phase::Active,
        };
        store.put(&[&r], true).unwrap();
        drop(store);
        spool.close().unwrap();
        drop(spool);
        let spool = Spool::open(&cfg).unwrap();
        let store = Store::open(spool).unwrap();
        assert_eq!(store.all().unwrap(), vec![r]);
        store.remove("gate").unwrap();
        assert!(store.all().unwrap().is_empty());
    }
}
