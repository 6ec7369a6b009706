//! The spool: frames that could not be published yet (or every frame, in `always` mode), kept on
//! disk in a sled store until the broker acknowledges them.
//!
//! On-disk format: one sled database at `spool.path`. Tree `f:{source}` maps the big-endian `seq`
//! to a record ([`record`] format, crc32c-checked). Tree `meta` holds `seq:{source}` (the next
//! capture sequence, u64 LE) and `clean` (1 after a clean shutdown). Tree `quarantine` keeps records
//! that failed their checksum, under `{source}/{seq}`.
//!
//! Invariants:
//! - A record is removed only after the broker's receipt for it (or a counted capacity drop).
//! - Records of one source are read back in `seq` order, which is capture order.
//! - A frame is durable once a group commit (`fsync-ms`) that started after its append completes;
//!   [`Spool::durable_epoch`] tells the caller which appends are durable.
//! - Opening never fails because of damaged contents: a store sled cannot open is moved aside to
//!   `{path}.corrupt-{unix time}` and a fresh one is started; a record that fails its checksum is
//!   moved to `quarantine` and counted. Both are reported in status.
//! - Sequence numbers never repeat: after an unclean shutdown the next sequence jumps by
//!   [`CRASH_SEQ_MARGIN`], past anything published in the last commit window.

pub mod record;

use bytes::Bytes;
use rigd_drivers::Frame;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{SpoolConfig, WhenFull};

/// After an unclean shutdown, sequence numbers resume this far above the last committed one: more
/// than any source captures between two group commits.
pub const CRASH_SEQ_MARGIN: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: {source}")]
    Store { path: PathBuf, source: sled::Error },
    #[error("spool {path}: {message}")]
    Io { path: PathBuf, message: String },
}

/// Per-source spool counters (status and metrics).
#[derive(Debug, Default)]
pub struct SourceSpoolStats {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub pushed: AtomicU64,
    pub popped: AtomicU64,
    pub dropped: AtomicU64,
    pub quarantined: AtomicU64,
    pub oldest_ns: AtomicU64,
}

/// What happened to an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Stored,
    /// Stored after dropping this many of the source's oldest records to make room.
    StoredDroppingOldest(u64),
    /// Not stored: the spool is full and `when-full = drop-newest`.
    DroppedNewest,
}

pub struct Spool {
    path: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    quarantine: sled::Tree,
    trees: Mutex<HashMap<Arc<str>, sled::Tree>>,
    stats: Mutex<HashMap<Arc<str>, Arc<SourceSpoolStats>>>,
    total_bytes: AtomicU64,
    max_bytes: u64,
    free_reserve: u64,
    when_full: WhenFull,
    unclean_start: bool,
    /// Stores moved aside at open because sled could not read them.
    pub moved_aside: Vec<PathBuf>,
    epoch: AtomicU64,
    durable: tokio::sync::watch::Sender<u64>,
    free_bytes: AtomicU64,
}

impl Spool {
    /// Opens (or creates) the spool; damaged stores and records are set aside, never fatal.
    pub fn open(cfg: &SpoolConfig) -> Result<Arc<Self>, SpoolError> {
        let path = cfg.path.clone();
        std::fs::create_dir_all(&path).map_err(|e| SpoolError::Io {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let mut moved_aside = Vec::new();
        let db = match open_db(&path) {
            Ok(db) => db,
            Err(e) => {
                let aside = PathBuf::from(format!(
                    "{}.corrupt-{}",
                    path.display(),
                    rigd_drivers::realtime_ns() / 1_000_000_000
                ));
                tracing::error!(spool = %path.display(), error = %e, moved_to = %aside.display(),
                    "spool store unreadable; moved aside, starting a fresh one");
                std::fs::rename(&path, &aside).map_err(|e| SpoolError::Io {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                std::fs::create_dir_all(&path).map_err(|e| SpoolError::Io {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                moved_aside.push(aside);
                open_db(&path).map_err(|source| SpoolError::Store {
                    path: path.clone(),
                    source,
                })?
            }
        };
        let store = |source| SpoolError::Store {
            path: path.clone(),
            source,
        };
        let meta = db.open_tree("meta").map_err(store)?;
        let quarantine = db.open_tree("quarantine").map_err(store)?;
        let unclean_start = meta
            .get("clean")
            .map_err(store)?
            .is_some_and(|v| v.as_ref() != [1]);
        meta.insert("clean", &[0u8][..]).map_err(store)?;
        db.flush().map_err(store)?;
        let (durable, _) = tokio::sync::watch::channel(0);
        let spool = Spool {
            path: path.clone(),
            db,
            meta,
            quarantine,
            trees: Mutex::new(HashMap::new()),
            stats: Mutex::new(HashMap::new()),
            total_bytes: AtomicU64::new(0),
            max_bytes: cfg.max_bytes.0,
            free_reserve: cfg.free_reserve.0,
            when_full: cfg.when_full,
            unclean_start,
            moved_aside,
            epoch: AtomicU64::new(0),
            durable,
            free_bytes: AtomicU64::new(u64::MAX),
        };
        spool.scan()?;
        spool.refresh_free_space();
        Ok(Arc::new(spool))
    }

    /// Counts what is stored and quarantines records that fail their checksum.
    fn scan(&self) -> Result<(), SpoolError> {
        let store = |source| SpoolError::Store {
            path: self.path.clone(),
            source,
        };
        for name in self.db.tree_names() {
            let Some(source) = name.strip_prefix(b"f:") else {
                continue;
            };
            let source: Arc<str> = String::from_utf8_lossy(source).into();
            let tree = self.tree(&source)?;
            let stats = self.stats(&source);
            let mut bad = Vec::new();
            for item in tree.iter() {
                let (k, v) = match item {
                    Ok(kv) => kv,
                    Err(e) => {
                        tracing::error!(source = %source, error = %e, "spool: unreadable entry; skipping the rest of this source");
                        break;
                    }
                };
                let seq = key_seq(&k);
                match record::decode(&source, seq, Bytes::copy_from_slice(&v)) {
                    Ok(f) => {
                        if stats.records.load(Ordering::Relaxed) == 0 {
                            stats
                                .oldest_ns
                                .store(f.capture_ns.max(0) as u64, Ordering::Relaxed);
                        }
                        stats.records.fetch_add(1, Ordering::Relaxed);
                        stats.bytes.fetch_add(v.len() as u64, Ordering::Relaxed);
                        self.total_bytes
                            .fetch_add(v.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => bad.push((k, v, e)),
                }
            }
            for (k, v, e) in bad {
                self.quarantine_record(&source, &tree, &k, &v, &e)
                    .map_err(store)?;
            }
        }
        let q = self.quarantine.len() as u64;
        if q > 0 {
            tracing::warn!(spool = %self.path.display(), quarantined = q, "spool holds quarantined records");
        }
        Ok(())
    }

    fn quarantine_record(
        &self,
        source: &Arc<str>,
        tree: &sled::Tree,
        k: &[u8],
        v: &[u8],
        e: &record::RecordError,
    ) -> sled::Result<()> {
        let seq = key_seq(k);
        tracing::error!(source = %source, seq, error = %e, "spool: corrupt record quarantined");
        let mut qk = source.as_bytes().to_vec();
        qk.push(b'/');
        qk.extend_from_slice(&seq.to_be_bytes());
        self.quarantine.insert(qk, v)?;
        tree.remove(k)?;
        self.stats(source)
            .quarantined
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the last run did not shut down cleanly.
    pub fn unclean_start(&self) -> bool {
        self.unclean_start
    }

    fn tree(&self, source: &Arc<str>) -> Result<sled::Tree, SpoolError> {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = trees.get(source) {
            return Ok(t.clone());
        }
        let t = self
            .db
            .open_tree(format!("f:{source}"))
            .map_err(|source| SpoolError::Store {
                path: self.path.clone(),
                source,
            })?;
        trees.insert(source.clone(), t.clone());
        Ok(t)
    }

    pub fn stats(&self, source: &Arc<str>) -> Arc<SourceSpoolStats> {
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.entry(source.clone()).or_default().clone()
    }

    pub fn all_stats(&self) -> Vec<(Arc<str>, Arc<SourceSpoolStats>)> {
        let stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = stats.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Relaxed)
    }

    pub fn quarantined(&self) -> u64 {
        self.quarantine.len() as u64
    }

    /// The first sequence number for a source's next frame.
    pub fn next_seq(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        let store = |source| SpoolError::Store {
            path: self.path.clone(),
            source,
        };
        let noted = self
            .meta
            .get(format!("seq:{source}"))
            .map_err(store)?
            .map(|v| u64::from_le_bytes(v.as_ref().try_into().unwrap_or_default()))
            .unwrap_or(0);
        let stored = self
            .tree(source)?
            .last()
            .map_err(store)?
            .map(|(k, _)| key_seq(&k) + 1)
            .unwrap_or(0);
        let next = noted.max(stored);
        Ok(if self.unclean_start && next > 0 {
            next + CRASH_SEQ_MARGIN
        } else {
            next
        })
    }

    /// Records that `seq` was assigned (persisted with the next group commit).
    pub fn note_seq(&self, source: &Arc<str>, next: u64) -> Result<(), SpoolError> {
        self.meta
            .insert(format!("seq:{source}"), &next.to_le_bytes()[..])
            .map_err(|source| SpoolError::Store {
                path: self.path.clone(),
                source,
            })?;
        Ok(())
    }

    /// The group-commit epoch an append made now will be durable in.
    pub fn current_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Watches the last durable epoch: appends made at an epoch below it are on disk.
    pub fn durable_epoch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// One group commit: everything appended before the call is on disk when it returns.
    pub fn commit(&self) -> Result<(), SpoolError> {
        let e = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.db.flush().map_err(|source| SpoolError::Store {
            path: self.path.clone(),
            source,
        })?;
        self.durable.send_replace(e);
        Ok(())
    }

    /// Reads statvfs for the free-space reserve; called periodically, not per frame.
    pub fn refresh_free_space(&self) {
        if let Some(free) = free_space(&self.path) {
            self.free_bytes.store(free, Ordering::Relaxed);
        }
    }

    fn full(&self, incoming: u64) -> bool {
        self.total_bytes() + incoming > self.max_bytes
            || self.free_bytes.load(Ordering::Relaxed) < self.free_reserve.saturating_add(incoming)
    }

    /// Stores a frame, applying the capacity policy.
    pub fn append(&self, frame: &Frame) -> Result<Appended, SpoolError> {
        let store = |source| SpoolError::Store {
            path: self.path.clone(),
            source,
        };
        let rec = record::encode(frame);
        let len = rec.len() as u64;
        let tree = self.tree(&frame.source)?;
        let stats = self.stats(&frame.source);
        let mut dropped = 0;
        if self.full(len) {
            match self.when_full {
                WhenFull::DropNewest => {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                    return Ok(Appended::DroppedNewest);
                }
                WhenFull::DropOldest => {
                    while self.full(len) {
                        let Some((k, v)) = tree.pop_min().map_err(store)? else {
                            break;
                        };
                        self.account_removed(&stats, v.len() as u64);
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        let _ = k;
                        dropped += 1;
                    }
                    if self.full(len) {
                        // Nothing of this source left to drop: the others hold the space.
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        return Ok(Appended::DroppedNewest);
                    }
                }
            }
        }
        let old = tree.insert(frame.seq.to_be_bytes(), rec).map_err(store)?;
        if let Some(old) = old {
            // Re-spooling a frame that is already stored (returned by the uplink at shutdown).
            self.account_removed(&stats, old.len() as u64);
        }
        if stats.records.load(Ordering::Relaxed) == 0 {
            stats
                .oldest_ns
                .store(frame.capture_ns.max(0) as u64, Ordering::Relaxed);
        }
        stats.records.fetch_add(1, Ordering::Relaxed);
        stats.bytes.fetch_add(len, Ordering::Relaxed);
        stats.pushed.fetch_add(1, Ordering::Relaxed);
        self.total_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(if dropped > 0 {
            Appended::StoredDroppingOldest(dropped)
        } else {
            Appended::Stored
        })
    }

    fn account_removed(&self, stats: &SourceSpoolStats, len: u64) {
        stats.records.fetch_sub(1, Ordering::Relaxed);
        stats.bytes.fetch_sub(len, Ordering::Relaxed);
        stats.popped.fetch_add(1, Ordering::Relaxed);
        self.total_bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// Up to `max` records of a source with `seq >= from`, in order. Corrupt ones are quarantined
    /// and skipped.
    pub fn read_from(
        &self,
        source: &Arc<str>,
        from: u64,
        max: usize,
    ) -> Result<Vec<Frame>, SpoolError> {
        let store = |source| SpoolError::Store {
            path: self.path.clone(),
            source,
        };
        let tree = self.tree(source)?;
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for item in tree.range(from.to_be_bytes()..) {
            let (k, v) = item.map_err(store)?;
            match record::decode(source, key_seq(&k), Bytes::copy_from_slice(&v)) {
                Ok(f) => out.push(f),
                Err(e) => bad.push((k, v, e)),
            }
            if out.len() >= max {
                break;
            }
        }
        for (k, v, e) in bad {
            let len = v.len() as u64;
            self.quarantine_record(source, &tree, &k, &v, &e)
                .map_err(store)?;
            let stats = self.stats(source);
            stats.records.fetch_sub(1, Ordering::Relaxed);
            stats.bytes.fetch_sub(len, Ordering::Relaxed);
            self.total_bytes.fetch_sub(len, Ordering::Relaxed);
        }
        Ok(out)
    }

    /// Removes a record after its receipt. Missing records (dropped meanwhile) are fine.
    pub fn remove(&self, source: &Arc<str>, seq: u64) -> Result<(), SpoolError> {
        let tree = self.tree(source)?;
        let stats = self.stats(source);
        if let Some(v) = tree
            .remove(seq.to_be_bytes())
            .map_err(|source| SpoolError::Store {
                path: self.path.clone(),
                source,
            })?
        {
            self.account_removed(&stats, v.len() as u64);
            let next_oldest = tree.first().ok().flatten().and_then(|(_, v)| {
                v.get(8..16)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()).max(0) as u64)
            });
            stats
                .oldest_ns
                .store(next_oldest.unwrap_or(0), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Drops every record of a source (technician action); returns how many.
    pub fn clear_source(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        let tree = self.tree(source)?;
        let stats = self.stats(source);
        let mut n = 0;
        while let Some((_, v)) = tree.pop_min().map_err(|source| SpoolError::Store {
            path: self.path.clone(),
            source,
        })? {
            self.account_removed(&stats, v.len() as u64);
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            n += 1;
        }
        Ok(n)
    }

    /// Marks a clean shutdown and commits.
    pub fn close(&self) -> Result<(), SpoolError> {
        self.meta
            .insert("clean", &[1u8][..])
            .map_err(|source| SpoolError::Store {
                path: self.path.clone(),
                source,
            })?;
        self.commit()
    }
}

fn open_db(path: &Path) -> sled::Result<sled::Db> {
    // sled panics on some damaged files instead of returning an error: treat a panic as damage.
    let p = path.to_path_buf();
    match std::panic::catch_unwind(move || {
        sled::Config::new().path(p).cache_capacity(32 << 20).open()
    }) {
        Ok(r) => r,
        Err(_) => Err(sled::Error::Unsupported(
            "sled panicked while opening the store".into(),
        )),
    }
}

fn key_seq(k: &[u8]) -> u64 {
    k.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

fn free_space(path: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}
