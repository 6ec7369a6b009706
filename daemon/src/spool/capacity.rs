//! Capacity: `max-bytes` and `free-reserve`, what the spool's size and the filesystem's free space
//! were last measured at, and whether an incoming record fits. What `when-full` then drops is the
//! spool's rule ([`super::Spool`]): it spans the segments, the index and the counts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::config::{SpoolConfig, WhenFull};

/// Free space kept for the index whatever `free-reserve` says (even `"0"`).
pub(super) const INDEX_HEADROOM: u64 = 4 << 20;

/// The limits and the last measurements.
pub(super) struct Capacity {
    /// The spool directory (its filesystem's free space, its `index/`'s size).
    root: PathBuf,
    max_bytes: u64,
    free_reserve: u64,
    when_full: WhenFull,
    /// Bytes allocated to the sled index, as last measured.
    index_bytes: AtomicU64,
    /// Free space of the filesystem, as last measured.
    free_bytes: AtomicU64,
    /// Held by a drop-oldest: one at a time.
    dropping: Mutex<()>,
    /// Free space when a deletion last gave none back (u64::MAX: none such): until the
    /// filesystem has more free than this, drop-oldest deletes nothing more.
    barren_at: AtomicU64,
    /// Tests: the filesystem's free space as this says, not as statvfs does (a disk filled by
    /// other files, without mounting one).
    #[cfg(test)]
    pub(super) free_probe: Mutex<Option<Box<dyn Fn() -> u64 + Send + Sync>>>,
}

impl Capacity {
    pub(super) fn new(cfg: &SpoolConfig) -> Self {
        Capacity {
            root: cfg.path.clone(),
            max_bytes: cfg.max_bytes.0,
            free_reserve: cfg.free_reserve.0,
            when_full: cfg.when_full,
            index_bytes: AtomicU64::new(0),
            free_bytes: AtomicU64::new(u64::MAX),
            dropping: Mutex::new(()),
            barren_at: AtomicU64::new(u64::MAX),
            #[cfg(test)]
            free_probe: Mutex::new(None),
        }
    }

    pub(super) fn when_full(&self) -> WhenFull {
        self.when_full
    }

    /// Reads free space for the reserve; called periodically, not per frame. Also measures the
    /// index's size on disk, which counts in `max-bytes`.
    pub(super) fn refresh(&self) {
        #[cfg(test)]
        if let Some(free) = self.free_probe.lock().unwrap().as_ref().map(|f| f()) {
            self.free_bytes.store(free, Ordering::Relaxed);
            self.index_bytes.store(0, Ordering::Relaxed);
            return;
        }
        if let Ok(st) = rustix::fs::statvfs(&self.root) {
            self.free_bytes
                .store(st.f_bavail.saturating_mul(st.f_frsize), Ordering::Relaxed);
        }
        self.index_bytes
            .store(tree_allocated(&self.root.join("index")), Ordering::Relaxed);
    }

    /// Bytes allocated to the sled index, as last measured (once a second, and at each drop).
    pub(super) fn index_bytes(&self) -> u64 {
        self.index_bytes.load(Ordering::Relaxed)
    }

    /// Whether `incoming` more bytes would overfill the spool, its segments taking
    /// `segment_bytes`. `max-bytes` is for segments and index together. The index's share counts
    /// at most half of it: sled gives space back lazily, so an index that does not shrink as
    /// records are dropped could otherwise make drop-oldest empty the whole spool in one go.
    /// `free-reserve`, but never below [`INDEX_HEADROOM`]: the index must always have room to
    /// record drops and removals (a sled that hit ENOSPC fails every later write of the run).
    pub(super) fn full(&self, segment_bytes: u64, incoming: u64) -> bool {
        self.full_after_freeing(segment_bytes, incoming, 0)
    }

    /// [`Capacity::full`] once `freed` bytes of the segments are deleted (they leave the
    /// spool's size and come back as free space): whether dropping them would still leave no
    /// room for `incoming`.
    pub(super) fn full_after_freeing(&self, segment_bytes: u64, incoming: u64, freed: u64) -> bool {
        let reserve = self.free_reserve.max(INDEX_HEADROOM);
        let index = self.index_bytes().min(self.max_bytes / 2);
        let free = self
            .free_bytes
            .load(Ordering::Relaxed)
            .saturating_add(freed);
        segment_bytes.saturating_sub(freed) + index + incoming > self.max_bytes
            || free < reserve.saturating_add(incoming)
    }

    /// Free space of the filesystem, as last measured.
    pub(super) fn free_bytes(&self) -> u64 {
        self.free_bytes.load(Ordering::Relaxed)
    }

    /// Whether the spool is full for want of free space, not by `max-bytes` (only then does a
    /// deletion that gives no space back say anything).
    pub(super) fn short_of_free_space(&self, segment_bytes: u64, incoming: u64) -> bool {
        let index = self.index_bytes().min(self.max_bytes / 2);
        self.full(segment_bytes, incoming) && segment_bytes + index + incoming <= self.max_bytes
    }

    /// A deletion gave no space back (free space is `free` after it): a snapshot, a process
    /// holding the file open, or another writer taking it. Drop-oldest deletes nothing more
    /// until free space grows past it ([`Capacity::barren`]).
    pub(super) fn deletion_gave_nothing(&self, free: u64) {
        self.barren_at.store(free, Ordering::Relaxed);
    }

    /// Whether the last deletion gave no space back and free space has not grown since (forgets
    /// it once it has).
    pub(super) fn barren(&self) -> bool {
        let at = self.barren_at.load(Ordering::Relaxed);
        if at == u64::MAX {
            return false;
        }
        if self.free_bytes() > at {
            self.barren_at.store(u64::MAX, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Held while a drop-oldest makes room: a lane that waited for another's drop finds the
    /// space it made.
    pub(super) fn one_drop_at_a_time(&self) -> MutexGuard<'_, ()> {
        self.dropping.lock().unwrap_or_else(|p| p.into_inner())
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
