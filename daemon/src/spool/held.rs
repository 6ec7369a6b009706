//! What recall (`crate::recall`) asks of the spool: the frames a source holds in a range of
//! capture time, read from the index alone; the capture time up to which frames
//! were lost (evicted by retention or dropped by a full spool), so that a request for them is
//! answered `partial`, never silently short; and a sled tree of its own for its records.

use std::sync::Arc;

use super::{Spool, SpoolError};

/// One frame the index lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub capture_ns: i64,
    pub len: u32,
    /// A frame that decodes only after the earlier ones of its group (an H.264 P-frame).
    pub delta: bool,
}

/// `meta` key of a source's lost-through capture time.
fn lost_key(source: &str) -> String {
    format!("lost/{source}")
}

impl Spool {
    /// Up to `max` index entries of `source` with `seq >= from`, in seq order (no segment read).
    pub fn entries(
        &self,
        source: &Arc<str>,
        from: u64,
        max: usize,
    ) -> Result<Vec<Entry>, SpoolError> {
        Ok(self
            .entries_from(source, from, max)?
            .into_iter()
            .map(|(seq, loc)| Entry {
                seq,
                capture_ns: loc.capture_ns,
                len: loc.len,
                delta: loc.delta,
            })
            .collect())
    }

    /// Frames of `source` captured at or before this (ns) may have been lost (evicted or
    /// dropped); None: none ever was. Durable with the index.
    pub fn lost_through(&self, source: &str) -> Result<Option<i64>, SpoolError> {
        Ok(self
            .index
            .meta_get(&lost_key(source))?
            .map(|v| i64::from_le_bytes(v.as_ref().try_into().unwrap_or_default())))
    }

    /// Notes that a frame of `source` captured at `capture_ns` left the spool unsent. The note
    /// only moves forward, in one atomic step of the index: a retention and a drop-oldest
    /// noting at once never put back an older time (a recall of the frames between would then
    /// not be answered `partial`).
    pub(super) fn note_lost(&self, source: &str, capture_ns: i64) -> Result<(), SpoolError> {
        self.index.meta_raise(&lost_key(source), capture_ns)
    }

    /// A sled tree of recall's own in the spool's index (durable with [`Spool::flush_index`]).
    pub fn recall_tree(&self) -> Result<sled::Tree, SpoolError> {
        self.index.open_tree("recall")
    }

    /// Makes everything written to the index so far durable.
    pub fn flush_index(&self) -> Result<(), SpoolError> {
        self.index.flush()
    }
}
