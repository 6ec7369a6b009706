//! The spool's counters: per source what is stored (records, bytes, oldest capture time), what
//! went in and out (pushed, popped), and what was lost (dropped, quarantined); and the seqs this
//! run dropped, so that a drop whose receipt comes after all is taken back. Every lost frame is
//! reported through [`Drops`] (one event that counts and logs).
//!
//! Invariants: a record is counted out once, by the one caller that took its entry out of the
//! index ([`Counts::count_out`]); counters never go below 0.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::drops::{Dropped, Drops, Loss};
use super::SourceSpoolStats;

/// Why a record's entry left the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gone {
    /// The broker's receipt came.
    Acked,
    /// A capacity drop, a technician's clear, or a write that never reached the disk (logged
    /// as what it was).
    Dropped(Dropped),
    /// It cannot be read back (checksum, I/O error, not the record the index names).
    Quarantined,
    /// Its source's retention let it go (`retain-age`, `retain-bytes` of an on-request source).
    Evicted,
}

/// Ranges of dropped seqs kept per source by [`RecentDrops`]; past it the oldest range goes.
const RECENT_DROP_RANGES: usize = 4096;

/// The seqs this run dropped to make room (or a technician cleared), per source, as ranges
/// (start → end, exclusive). A drop-oldest takes the oldest records, which are the ones the drain
/// has in flight: when the receipt of one comes after all, [`super::Spool::remove`] finds it
/// here and the frame counts as delivered, not as dropped. A frame whose send fails after its drop stays
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

/// `a -= n`, never below 0: a counter that would go negative has met a bookkeeping bug, and a
/// wrapped u64 in status is worse than a count that is off.
pub(super) fn sub(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

/// The counters of every source, the recent drops and the drop event.
#[derive(Default)]
pub(super) struct Counts {
    stats: Mutex<HashMap<Arc<str>, Arc<SourceSpoolStats>>>,
    /// What this run dropped, to take a drop back when its frame's receipt comes after all.
    recent_drops: Mutex<RecentDrops>,
    drops: Drops,
}

impl Counts {
    pub(super) fn stats(&self, source: &Arc<str>) -> Arc<SourceSpoolStats> {
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.entry(source.clone()).or_default().clone()
    }

    /// Every source's counters, by source.
    pub(super) fn all(&self) -> Vec<(Arc<str>, Arc<SourceSpoolStats>)> {
        let stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = stats.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// One frame of `source` lost (the one place that counts and logs it).
    pub(super) fn lost(&self, source: &Arc<str>, loss: Loss) {
        self.drops.emit(source, &self.stats(source), loss);
    }

    /// A record of `len` bytes captured at `capture_ns` is stored.
    pub(super) fn stored(&self, source: &Arc<str>, capture_ns: i64, len: u64) {
        let stats = self.stats(source);
        if stats.records.load(Ordering::Relaxed) == 0 {
            stats
                .oldest_ns
                .store(capture_ns.max(1) as u64, Ordering::Relaxed);
        }
        stats.records.fetch_add(1, Ordering::Relaxed);
        stats.bytes.fetch_add(len, Ordering::Relaxed);
        stats.pushed.fetch_add(1, Ordering::Relaxed);
    }

    /// Records found on disk at open (read back or listed by the index): stored, not pushed.
    pub(super) fn found(&self, source: &Arc<str>, records: u64, bytes: u64) {
        let stats = self.stats(source);
        stats.records.fetch_add(records, Ordering::Relaxed);
        stats.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What a clean shutdown stored for a source, taken as it is.
    pub(super) fn restore(&self, source: &Arc<str>, records: u64, bytes: u64) {
        let stats = self.stats(source);
        stats.records.store(records, Ordering::Relaxed);
        stats.bytes.store(bytes, Ordering::Relaxed);
    }

    /// Nothing stored (before an index rebuild counts the segments again).
    pub(super) fn forget_stored(&self) {
        for (_, stats) in self.all() {
            stats.records.store(0, Ordering::Relaxed);
            stats.bytes.store(0, Ordering::Relaxed);
        }
    }

    /// The capture time of a source's oldest stored record (None: nothing stored).
    pub(super) fn set_oldest(&self, source: &Arc<str>, capture_ns: Option<i64>) {
        let oldest = capture_ns.map(|ns| ns.max(1) as u64);
        self.stats(source)
            .oldest_ns
            .store(oldest.unwrap_or(0), Ordering::Relaxed);
    }

    /// An entry whose segment is gone, noted in `quarantine/`.
    pub(super) fn quarantined(&self, source: &Arc<str>) {
        self.stats(source)
            .quarantined
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The one place a record that left the index is counted out (by the one caller that took
    /// its entry out): `records` and `bytes` down, `popped` up, and the counter of why it went.
    /// A drop is remembered (see [`RecentDrops`]) so that [`Counts::delivered_after_drop`] can
    /// take it back.
    pub(super) fn count_out(&self, source: &Arc<str>, seq: u64, len: u64, gone: Gone) {
        let stats = self.stats(source);
        sub(&stats.records, 1);
        sub(&stats.bytes, len);
        stats.popped.fetch_add(1, Ordering::Relaxed);
        match gone {
            Gone::Acked => {}
            Gone::Dropped(why) => {
                self.lost(source, why.into());
                self.recent_drops().note(source, seq);
            }
            Gone::Quarantined => {
                stats.quarantined.fetch_add(1, Ordering::Relaxed);
            }
            Gone::Evicted => {
                stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The receipt of a frame that is no longer in the index: if this run dropped it (it was in
    /// flight when its segment went), it was delivered after all and leaves the dropped count.
    /// Its records, bytes and `popped` were counted out at the drop.
    pub(super) fn delivered_after_drop(&self, source: &Arc<str>, seq: u64) {
        if self.recent_drops().take(source, seq) {
            sub(&self.stats(source).dropped, 1);
        }
    }

    /// Whether drop-oldest dropped `seq` of `source` while the uplink held it (no receipt since).
    pub(super) fn dropped_in_flight(&self, source: &Arc<str>, seq: u64) -> bool {
        self.recent_drops().contains(source, seq)
    }

    fn recent_drops(&self) -> MutexGuard<'_, RecentDrops> {
        self.recent_drops.lock().unwrap_or_else(|p| p.into_inner())
    }
}
