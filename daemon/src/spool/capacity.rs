//! Capacity: `max-bytes` and `free-reserve`, and what `when-full` drops to keep them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::index::{key_seq, Location};
use super::{pages, Spool, SpoolError};

/// Why a record's entry left the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gone {
    /// The broker's receipt came.
    Acked,
    /// A capacity drop, a technician's clear, or a write that never reached the disk.
    Dropped,
    /// It cannot be read back (checksum, I/O error, not the record the index names).
    Quarantined,
}

/// Ranges of dropped seqs kept per source by [`RecentDrops`]; past it the oldest range goes.
const RECENT_DROP_RANGES: usize = 4096;

/// The seqs this run dropped to make room (or a technician cleared), per source, as ranges
/// (start → end, exclusive). A drop-oldest takes the oldest records, which are the ones the drain
/// has in flight: when the receipt of one comes after all, [`Spool::remove`] finds it here and the
/// frame counts as delivered, not as dropped. A frame whose send fails after its drop stays
/// counted as dropped (nothing holds it any more). Bounded: a receipt for a seq dropped more than
/// `RECENT_DROP_RANGES` ranges ago would leave that frame counted twice, and in-flight frames are
/// at most the newest few ranges.
#[derive(Debug, Default)]
pub(super) struct RecentDrops {
    ranges: HashMap<Arc<str>, BTreeMap<u64, u64>>,
}

impl RecentDrops {
    pub(super) fn note(&mut self, source: &Arc<str>, seq: u64) {
        let m = self.ranges.entry(source.clone()).or_default();
        if let Some((_, end)) = m.range_mut(..=seq).next_back() {
            if *end > seq {
                return;
            }
            if *end == seq {
                *end += 1;
                return;
            }
        }
        m.insert(seq, seq + 1);
        if m.len() > RECENT_DROP_RANGES {
            m.pop_first();
        }
    }

    /// Whether `seq` was dropped (and not taken back since).
    pub(super) fn contains(&self, source: &Arc<str>, seq: u64) -> bool {
        self.ranges
            .get(source)
            .and_then(|m| m.range(..=seq).next_back())
            .is_some_and(|(_, &end)| seq < end)
    }

    /// Whether `seq` was dropped (and no longer is: each drop is taken back once).
    pub(super) fn take(&mut self, source: &Arc<str>, seq: u64) -> bool {
        let Some(m) = self.ranges.get_mut(source) else {
            return false;
        };
        let Some((&start, &end)) = m.range(..=seq).next_back() else {
            return false;
        };
        if seq >= end {
            return false;
        }
        m.remove(&start);
        if start < seq {
            m.insert(start, seq);
        }
        if seq + 1 < end {
            m.insert(seq + 1, end);
        }
        true
    }
}

/// Free space kept for the index whatever `free-reserve` says (even `"0"`).
pub(super) const INDEX_HEADROOM: u64 = 4 << 20;

/// `a -= n`, never below 0: a counter that would go negative has met a bookkeeping bug, and a
/// wrapped u64 in status is worse than a count that is off.
pub(super) fn sub(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

impl Spool {
    /// Reads free space for the reserve; called periodically, not per frame.
    /// Also measures the index's size on disk, which counts in `max-bytes`.
    pub fn refresh_free_space(&self) {
        if let Ok(st) = rustix::fs::statvfs(&self.path) {
            self.free_bytes
                .store(st.f_bavail.saturating_mul(st.f_frsize), Ordering::Relaxed);
        }
        self.index_bytes
            .store(tree_allocated(&self.path.join("index")), Ordering::Relaxed);
    }

    /// `max-bytes` is for segments and index together. The index's share counts at most half
    /// of it: sled gives space back lazily, so an index that does not shrink as records are
    /// dropped could otherwise make drop-oldest empty the whole spool in one go.
    /// `free-reserve`, but never below [`INDEX_HEADROOM`]: the index must always have room to
    /// record drops and removals (a sled that hit ENOSPC fails every later write of the run).
    pub(super) fn full(&self, incoming: u64) -> bool {
        let reserve = self.free_reserve.max(INDEX_HEADROOM);
        let index = self.index_bytes().min(self.max_bytes / 2);
        self.segment_bytes() + index + incoming > self.max_bytes
            || self.free_bytes.load(Ordering::Relaxed) < reserve.saturating_add(incoming)
    }

    /// Drops every record of the oldest sealed segment (drop-oldest); returns how many, or None
    /// when only the segment being written is left. The records are found in the index, not by
    /// reading the segment: a segment that cannot be opened (EMFILE, EIO) is dropped all the same,
    /// and every record the index lists in it is counted as dropped, once. Drops are one at a
    /// time: a lane that waited for another's drop finds the space it made (`incoming`).
    pub(super) fn drop_oldest_segment(&self, incoming: u64) -> Result<Option<u64>, SpoolError> {
        let _one = self.dropping.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh_free_space();
        if !self.full(incoming) {
            return Ok(Some(0));
        }
        let id = {
            let segs = self.segs();
            let active = segs.writer.as_ref().map(|w| w.id);
            match segs.info.keys().copied().find(|id| Some(*id) != active) {
                Some(id) => id,
                None => return Ok(None),
            }
        };
        let mut victims: Vec<(Arc<str>, u64)> = Vec::new();
        {
            // Under the pending lock, so a commit cannot move entries from it to sled meanwhile.
            let p = self.pending();
            for (source, m) in &p.entries {
                victims.extend(
                    m.iter()
                        .filter(|(_, (loc, _))| loc.segment == id)
                        .map(|(seq, _)| (source.clone(), *seq)),
                );
            }
            let sources: Vec<Arc<str>> = self
                .index
                .tree_names()
                .iter()
                .filter_map(|n| n.strip_prefix(b"i:"))
                .map(|s| String::from_utf8_lossy(s).into())
                .collect();
            for source in sources {
                let removed = p.removed.get(&source);
                for item in self.tree(&source)?.iter() {
                    let (k, v) = item.map_err(self.ix())?;
                    let Some(page) = pages::decode(key_seq(&k), &v) else {
                        // The index cannot say what the segment holds: it is not deleted.
                        tracing::error!(source = %source, segment = id, "spool: an index page does not decode; the oldest segment is kept");
                        self.meta.insert("rebuild", &[1u8][..]).map_err(self.ix())?;
                        return Ok(None);
                    };
                    victims.extend(
                        page.into_iter()
                            .filter(|(seq, loc)| {
                                loc.segment == id && !removed.is_some_and(|r| r.contains(seq))
                            })
                            .map(|(seq, _)| (source.clone(), seq)),
                    );
                }
            }
        }
        let mut n = 0;
        for (source, seq) in victims {
            // A receipt may have removed it meanwhile: then it is not a drop.
            if let Some(loc) = self.unindex(&source, seq)? {
                // The segment is deleted below, not released record by record.
                self.count_out(&source, seq, loc, Gone::Dropped, false);
                n += 1;
            }
        }
        // The segment goes now, to make room: its removals are made durable first.
        {
            let mut p = self.pending();
            self.apply_removals(&mut p)?;
            p.stale_oldest.clear();
        }
        self.index.flush().map_err(self.ix())?;
        let deleted = {
            let mut segs = self.segs();
            self.delete_segment(&mut segs, id)
        };
        if deleted {
            self.sync_after_delete(&[id]);
        }
        self.refresh_free_space();
        for (source, _) in self.all_stats() {
            self.update_oldest(&source)?;
        }
        tracing::warn!(
            segment = id,
            records = n,
            "spool full: dropped the oldest segment (when-full = drop-oldest)"
        );
        Ok(Some(n))
    }

    /// At a shutdown whose commit failed: the frames still in the write buffer are lost. They
    /// leave the index and are counted as dropped; returns how many.
    pub(super) fn drop_unwritten(&self) -> u64 {
        let (id, flushed) = {
            let mut segs = self.segs();
            let Some(w) = segs.writer.as_mut() else {
                return 0;
            };
            let _ = w.flush(self.disk.as_ref());
            (w.id, w.flushed)
        };
        let lost: Vec<(Arc<str>, u64, Location)> = {
            let mut p = self.pending();
            let mut lost = Vec::new();
            for (source, m) in p.entries.iter_mut() {
                let gone: Vec<u64> = m
                    .iter()
                    .filter(|(_, (l, _))| l.segment == id && l.offset + l.len as u64 > flushed)
                    .map(|(seq, _)| *seq)
                    .collect();
                for seq in gone {
                    if let Some((loc, _)) = m.remove(&seq) {
                        lost.push((source.clone(), seq, loc));
                    }
                }
            }
            lost
        };
        for (source, seq, loc) in &lost {
            self.count_out(source, *seq, *loc, Gone::Dropped, false);
        }
        lost.len() as u64
    }

    /// The one place a record that left the index is counted out (by the one caller that took
    /// its entry out): `records` and `bytes` down, `popped` up, and the counter of why it went.
    /// `segment`: one record fewer in its segment (false when the caller deletes the segment).
    /// A drop is remembered (see [`RecentDrops`]) so that [`Spool::count_delivered_after_drop`]
    /// can take it back.
    pub(super) fn count_out(
        &self,
        source: &Arc<str>,
        seq: u64,
        loc: Location,
        gone: Gone,
        segment: bool,
    ) {
        let stats = self.stats(source);
        sub(&stats.records, 1);
        sub(&stats.bytes, loc.len as u64);
        stats.popped.fetch_add(1, Ordering::Relaxed);
        match gone {
            Gone::Acked => {}
            Gone::Dropped => {
                self.drop_frame(source, super::drops::Loss::Oldest);
                self.recent_drops().note(source, seq);
            }
            Gone::Quarantined => {
                stats.quarantined.fetch_add(1, Ordering::Relaxed);
            }
        }
        if segment {
            self.release_segment(loc);
        }
    }

    /// The receipt of a frame that is no longer in the index: if this run dropped it (it was in
    /// flight when its segment went), it was delivered after all and leaves the dropped count.
    /// Its records, bytes and `popped` were counted out at the drop.
    pub(super) fn count_delivered_after_drop(&self, source: &Arc<str>, seq: u64) {
        if self.recent_drops().take(source, seq) {
            sub(&self.stats(source).dropped, 1);
        }
    }

    /// Whether drop-oldest dropped `seq` of `source` while the uplink held it (no receipt since).
    pub(super) fn dropped_in_flight(&self, source: &Arc<str>, seq: u64) -> bool {
        self.recent_drops().contains(source, seq)
    }

    fn recent_drops(&self) -> std::sync::MutexGuard<'_, RecentDrops> {
        self.recent_drops.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Bytes allocated to the files under `dir` (0 when it cannot be read).
fn tree_allocated(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => tree_allocated(&e.path()),
            Ok(m) => super::disk::allocated(&m),
            Err(_) => 0,
        })
        .sum()
}
