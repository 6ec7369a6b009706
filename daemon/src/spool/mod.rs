//! The spool: frames that could not be published yet (or every frame, in `always` mode), kept on
//! disk until the broker acknowledges them.
//!
//! On-disk format, under `spool.path`:
//! - `segments/{id:016x}.seg`: append-only files of [`record`]s (self-describing: source, seq,
//!   crc32c). Only the newest segment is written; a segment whose records are all removed is deleted,
//!   so space comes back as the spool drains.
//! - `index/`: a sled database. Tree `i:{source}` holds the source's record locations (segment,
//!   offset, length, capture time) in [`pages`] of up to 256 records, keyed by big-endian `seq`;
//!   tree `meta` holds `seq:{source}` (next capture sequence), `clean` (1 after a clean shutdown),
//!   `mode` (`on-outage` or `always`: the mode of the run that last opened the spool), `counts`
//!   (what a clean shutdown counted), and the segment [`ledger`] (`ledger`, `seg:{id:016x}`: how
//!   far each segment's records are indexed).
//! - `RIG`: the rig the spool belongs to ([`identity`]: rig id, bucket width, topic template).
//! - `quarantine/`: records that failed their checksum, one file each, kept for inspection.
//! - `LOCK`: held (flock) by the process that has the spool open.
//!
//! The offline tools read a spool through [`snapshot`], which never writes to it.
//!
//! Where things live: this file holds the public API (open, append, read, remove, commit, close);
//! [`segments`] the segment files and the one being written; [`index`] the sled pages and the
//! changes not yet committed to them; [`recovery`] making the index cover the segments at open
//! (read back, rebuild, quarantine, the sequence jump); [`capacity`] `max-bytes`, `free-reserve`
//! and the drops `when-full` makes; [`disk`] the file I/O seam that tests fail on purpose.
//!
//! Invariants (the rule: the segments are the truth, the index a cache of them):
//! - A record is removed only after the broker's receipt for it, or by a counted capacity drop.
//! - A segment is deleted only when the index proves every record in it removed: at open only
//!   when the ledger covers it and the index lists nothing in it. Bytes the ledger does not cover
//!   are read back; an index that does not describe the segments (blank, a known segment missing,
//!   a page that does not decode, a sequence note below its records) is rebuilt from them and the
//!   sequences jump past what was found.
//! - A record is counted out (dropped, quarantined, acknowledged) by the one caller that takes its
//!   entry out of the index; counters never go below 0.
//! - A source's records are read back in `seq` order, which is capture order.
//! - An appended record's index entry and its source's sequence note are held in memory
//!   ([`Pending`]) until a commit has written the record's data (fdatasync); only then do they go
//!   to sled, which may write them to disk at any moment after. So an index entry or sequence note
//!   that survives a crash or power cut never points past data that did not: a crash loses the
//!   frames of the last commit interval whole, never leaving a hole in a source's sequence.
//! - A removal (receipt, quarantine) is held in memory too and reaches sled with the next commit; a
//!   segment left without records is deleted only after that commit, so a crash never leaves an
//!   index entry pointing into a deleted segment. A crash can bring back a record whose receipt
//!   came in the last commit interval: it is published again under its sequence id, which the
//!   broker's deduplication drops.
//! - Opening never fails because of damaged contents: an index sled cannot open is moved aside and
//!   rebuilt from the segments; a record that fails its checksum is quarantined and counted.
//! - Sequence numbers never repeat for published frames. In `on-outage` mode a frame may be
//!   published before its sequence note is durable, so a run that did not end cleanly owes a jump:
//!   the next start moves every source's note [`CRASH_SEQ_MARGIN`] ahead and makes that durable
//!   before any frame is numbered from it (a second crash then jumps again from the jumped note).
//!   Whether a jump is owed depends on the mode of the run that crashed (`meta/mode`, written once
//!   the jump is paid), not on this run's. A source's first [`Spool::next_seq`] makes its note
//!   durable at once, so a source whose first commit never happened is still known to the next
//!   start. In `always` mode nothing is published before it is committed, so no jump is owed.
//! - A run is clean only if every fdatasync and the final commit succeeded: `meta/clean` is set
//!   after the final commit, never before it. A failed data sync (whose data the kernel may have
//!   dropped) leaves the run unclean, and in `on-outage` mode the notes still go to sled, so that
//!   the jump's base keeps up with what was published.
//! - The segments directory is fsynced after a segment file is created (before any index entry can
//!   point into it) and after segment files are deleted (so that a rebuild from the segments never
//!   finds a drained segment again).

mod capacity;
mod commit;
mod disk;
mod drops;
pub mod floor;
pub mod identity;
mod index;
mod ledger;
mod pages;
pub mod record;
mod recovery;
mod segments;
pub mod snapshot;
pub mod split;

use bytes::Bytes;
use rigd_drivers::Frame;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{SpoolConfig, SpoolMode, WhenFull};

pub use commit::commit_loop;

use capacity::Gone;
pub(crate) use disk::Disk;
use disk::{libc_errno, transient, Os};
use index::{key_seq, open_index, read_ledger, IndexOpen, Location, Pending};
use recovery::Counts;
use segments::{Segments, MAX_SEGMENT, WRITE_BUFFER};

/// After an unclean shutdown in `on-outage` mode, sequence numbers resume this far above the last
/// committed one: more than any source captures between two group commits.
pub const CRASH_SEQ_MARGIN: u64 = 1 << 20;

/// `meta/mode`: the mode of the run that last had the spool open.
fn mode_key(mode: SpoolMode) -> &'static [u8] {
    match mode {
        SpoolMode::OnOutage => b"on-outage",
        SpoolMode::Always => b"always",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: index: {source}")]
    Index { path: PathBuf, source: sled::Error },
    #[error("spool {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("spool {path} is in use by another process (a running rigd?); stop it, or copy the directory and work on the copy")]
    Locked { path: PathBuf },
    #[error("{path} is not a spool directory (no segments/ in it)")]
    NotSpool { path: PathBuf },
    /// A file of the spool this user may not read (a copy owned by another user, files 0400):
    /// a permission problem, not damage (the offline tools exit 77, EX_NOPERM).
    #[error("{path}: {source}: this user may not read it (a permission problem, not damage): read the spool as its owner (sudo), or make a copy you can read (cp -r, chmod -R u+rX)")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Whether an I/O error is the file's permissions (EACCES, EPERM), not its content.
pub(crate) fn denied(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
}

/// Per-source spool counters (status and metrics). `pushed` and `popped` are the queue depth as two
/// counters; `records` and `bytes` are what is stored now.
#[derive(Debug, Default)]
pub struct SourceSpoolStats {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub pushed: AtomicU64,
    pub popped: AtomicU64,
    pub dropped: AtomicU64,
    pub quarantined: AtomicU64,
    /// Capture time of the oldest stored record (ns), 0 when empty.
    pub oldest_ns: AtomicU64,
}

/// What happened to an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Stored,
    /// Stored after dropping this many older frames (of any source) to make room.
    StoredDroppingOldest(u64),
    /// Not stored: the spool is full and `when-full = drop-newest`.
    DroppedNewest,
    /// Not stored: the spool is full under `when-full = drop-oldest` and only the segment being
    /// written is left, so this frame goes instead.
    DroppedNoRoom,
    /// Not stored: a frame of the spool that drop-oldest dropped (and counted) while the uplink
    /// held it, handed back without a receipt.
    DroppedEarlier,
}

pub struct Spool {
    path: PathBuf,
    _lock: File,
    index: sled::Db,
    meta: sled::Tree,
    trees: Mutex<HashMap<Arc<str>, sled::Tree>>,
    stats: Mutex<HashMap<Arc<str>, Arc<SourceSpoolStats>>>,
    segs: Mutex<Segments>,
    pending: Mutex<Pending>,
    /// Held by a drop-oldest: one at a time.
    dropping: Mutex<()>,
    /// What this run dropped, to take a drop back when its frame's receipt comes after all.
    recent_drops: Mutex<capacity::RecentDrops>,
    drops: drops::Drops,
    /// Bytes the segments count in the spool's size (see [`segments::Segments::charged`]).
    disk_bytes: AtomicU64,
    index_bytes: AtomicU64,
    segment_size: u64,
    max_bytes: u64,
    free_reserve: u64,
    when_full: WhenFull,
    unclean_start: bool,
    mode: SpoolMode,
    disk: Box<dyn Disk>,
    /// An fdatasync failed in this run: its data may be lost, so the run does not end clean.
    sync_failed: std::sync::atomic::AtomicBool,
    quarantined: AtomicU64,
    /// Why the index was rebuilt from the segments at open (it did not cover them), if it was.
    index_damage: Mutex<Option<String>>,
    /// The group commit an append made now belongs to (not a sending epoch, `pipeline::epochs`).
    commit_no: AtomicU64,
    durable: tokio::sync::watch::Sender<u64>,
    free_bytes: AtomicU64,
    floors: Mutex<floor::Floors>,
}

impl Spool {
    /// Opens (or creates) the spool; damaged contents are set aside, never fatal.
    pub fn open(cfg: &SpoolConfig) -> Result<Arc<Self>, SpoolError> {
        Self::open_on(cfg, Box::new(Os))
    }

    /// [`Spool::open`], recording which rig the spool belongs to ([`identity`]) for the offline
    /// tools. A spool that named another rig is taken over (and says so).
    pub fn open_for(
        cfg: &SpoolConfig,
        rig: &identity::RigIdentity,
    ) -> Result<Arc<Self>, SpoolError> {
        let spool = Self::open(cfg)?;
        if let Ok(Some(before)) = identity::read(&spool.path) {
            if &before != rig {
                tracing::warn!(spool = %spool.path.display(), was = %before.rig, now = %rig.rig,
                    "spool: it named another rig identity; records spooled before are published under this one");
            }
        }
        if let Err(e) = identity::write(&spool.path, rig) {
            tracing::warn!(spool = %spool.path.display(), error = %e, "spool: cannot record the rig identity (the offline tools will need --rig)");
        }
        Ok(spool)
    }

    /// [`Spool::open`] with the durability calls going to `disk` (fault injection).
    #[cfg(test)]
    pub(crate) fn open_with(
        cfg: &SpoolConfig,
        disk: Box<dyn Disk>,
    ) -> Result<Arc<Self>, SpoolError> {
        Self::open_on(cfg, disk)
    }

    fn open_on(cfg: &SpoolConfig, disk: Box<dyn Disk>) -> Result<Arc<Self>, SpoolError> {
        let path = cfg.path.clone();
        let io = |op: &'static str| {
            let path = path.clone();
            move |source| SpoolError::Io { path, op, source }
        };
        for d in ["segments", "quarantine"] {
            std::fs::create_dir_all(path.join(d)).map_err(io("create directory"))?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join("LOCK"))
            .map_err(io("open LOCK"))?;
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(SpoolError::Locked { path });
        }
        let index_path = path.join("index");
        let index = match open_index(&index_path) {
            Ok(db) => db,
            Err(IndexOpen::Busy(source)) => return Err(SpoolError::Index { path, source }),
            // A full disk is not a damaged index: it stays where it is, untouched, and this run
            // works on a temporary one rebuilt from the segments (in memory).
            Err(IndexOpen::NoRoom(e)) => {
                tracing::error!(spool = %path.display(), error = %e,
                    "spool index cannot be opened (no space or resources); left as it is, this run uses a temporary index rebuilt from the segments");
                sled::Config::new()
                    .temporary(true)
                    .cache_capacity(16 << 20)
                    .flush_every_ms(None)
                    .open()
                    .map_err(|source| SpoolError::Index {
                        path: path.clone(),
                        source,
                    })?
            }
            Err(IndexOpen::Damaged(e)) => {
                let aside = path.join(format!(
                    "index.corrupt-{}",
                    rigd_drivers::realtime_ns() / 1_000_000_000
                ));
                tracing::error!(spool = %path.display(), error = %e, moved_to = %aside.display(),
                    "spool index unreadable; moved aside, rebuilding it from the segments");
                std::fs::rename(&index_path, &aside).map_err(io("move the damaged index aside"))?;
                open_index(&index_path).map_err(|e| match e {
                    IndexOpen::Busy(source)
                    | IndexOpen::Damaged(source)
                    | IndexOpen::NoRoom(source) => SpoolError::Index {
                        path: path.clone(),
                        source,
                    },
                })?
            }
        };
        let ix = |source| SpoolError::Index {
            path: path.clone(),
            source,
        };
        let meta = index.open_tree("meta").map_err(ix)?;
        let known = ledger::Known {
            blank: meta.is_empty(),
            ledger: read_ledger(&meta).map_err(ix)?,
        };
        let unclean_start = meta
            .get("clean")
            .map_err(ix)?
            .is_some_and(|v| v.as_ref() != [1]);
        // The mode of the run that crashed decides whether a jump is owed; a spool from before
        // `meta/mode` was written is taken as `on-outage` (the default), the safe side.
        let crashed_always = meta
            .get("mode")
            .map_err(ix)?
            .is_some_and(|v| v.as_ref() == mode_key(SpoolMode::Always));
        let jump_owed = unclean_start && !crashed_always;
        // After a clean shutdown the counts it stored spare walking the index; they are removed
        // now, so that a crash of this run never finds stale ones.
        let rebuild_asked = meta.get("rebuild").map_err(ix)?.is_some();
        let counts = (!unclean_start && !rebuild_asked)
            .then(|| meta.get("counts").ok().flatten())
            .flatten()
            .and_then(|v| Counts::decode(&v));
        meta.insert("clean", &[0u8][..]).map_err(ix)?;
        meta.remove("counts").map_err(ix)?;
        index.flush().map_err(ix)?;
        let quarantined = std::fs::read_dir(path.join("quarantine"))
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        let (durable, _) = tokio::sync::watch::channel(0);
        let spool = Spool {
            path: path.clone(),
            _lock: lock,
            index,
            meta,
            trees: Mutex::new(HashMap::new()),
            stats: Mutex::new(HashMap::new()),
            segs: Mutex::new(Segments {
                writer: None,
                info: BTreeMap::new(),
                readers: HashMap::new(),
                emptied: Vec::new(),
                ledger_due: BTreeMap::new(),
                charged: BTreeMap::new(),
            }),
            pending: Mutex::new(Pending::default()),
            dropping: Mutex::new(()),
            recent_drops: Mutex::default(),
            drops: drops::Drops::default(),
            disk_bytes: AtomicU64::new(0),
            index_bytes: AtomicU64::new(0),
            segment_size: MAX_SEGMENT.min(cfg.max_bytes.0 / 8).max(1 << 20),
            max_bytes: cfg.max_bytes.0,
            free_reserve: cfg.free_reserve.0,
            when_full: cfg.when_full,
            unclean_start,
            mode: cfg.mode,
            disk,
            sync_failed: Default::default(),
            quarantined: AtomicU64::new(quarantined),
            index_damage: Mutex::new(None),
            commit_no: AtomicU64::new(0),
            durable,
            free_bytes: AtomicU64::new(u64::MAX),
            floors: Mutex::new(floor::Floors::default()),
        };
        if rebuild_asked {
            spool.meta.remove("rebuild").map_err(spool.ix())?;
            spool.rebuild_index("the last run found an unreadable index page")?;
        } else {
            spool.load(&known, counts)?;
        }
        // A blank or rebuilt index knows nothing of what was published and removed: numbering
        // resumes at the floor kept outside it, and the jump is owed whatever the mode.
        spool.load_floors(known.blank || spool.index_damage().is_some())?;
        if jump_owed || spool.index_damage().is_some() {
            spool.jump_sequences()?;
        }
        // Only now: a crash before this line leaves the debt of the crashed run in place.
        spool
            .meta
            .insert("mode", mode_key(cfg.mode))
            .map_err(spool.ix())?;
        spool.index.flush().map_err(spool.ix())?;
        spool.refresh_free_space();
        Ok(Arc::new(spool))
    }

    fn io(&self, op: &'static str) -> impl Fn(std::io::Error) -> SpoolError + '_ {
        move |source| SpoolError::Io {
            path: self.path.clone(),
            op,
            source,
        }
    }

    fn ix(&self) -> impl Fn(sled::Error) -> SpoolError + '_ {
        move |source| SpoolError::Index {
            path: self.path.clone(),
            source,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the last run did not shut down cleanly.
    pub fn unclean_start(&self) -> bool {
        self.unclean_start
    }

    /// Records damage to the index found at open or while running (shown in status and metrics).
    fn note_damage(&self, why: String) {
        let mut d = self.index_damage.lock().unwrap_or_else(|p| p.into_inner());
        match d.as_mut() {
            Some(d) if d.contains(&why) => {}
            Some(d) => {
                d.push_str("; ");
                d.push_str(&why);
            }
            None => *d = Some(why),
        }
    }

    /// Why the index had to be rebuilt from the segments at open, or was found damaged since.
    pub fn index_damage(&self) -> Option<String> {
        self.index_damage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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

    /// Bytes the spool takes on disk: segments and index (what `max-bytes` limits).
    pub fn total_bytes(&self) -> u64 {
        self.segment_bytes() + self.index_bytes()
    }

    /// Bytes allocated to the segment files.
    pub fn segment_bytes(&self) -> u64 {
        self.disk_bytes.load(Ordering::Relaxed)
    }

    /// Bytes allocated to the sled index, as last measured (once a second, and at each drop).
    pub fn index_bytes(&self) -> u64 {
        self.index_bytes.load(Ordering::Relaxed)
    }

    pub fn quarantined(&self) -> u64 {
        self.quarantined.load(Ordering::Relaxed)
    }

    /// The sequence number for a source's next frame.
    pub fn next_seq(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        let (pending_note, pending_last) = {
            let p = self.pending();
            let note = p.seq_notes.get(source).map(|n| n.0).unwrap_or(0);
            let last = p
                .entries
                .get(source)
                .and_then(|m| m.keys().next_back())
                .map(|s| s + 1)
                .unwrap_or(0);
            (note, last)
        };
        let noted = self.noted_seq(source)?;
        let stored = self.stored_seq(source)?;
        if noted.is_none() {
            // First use: a durable note makes the source known to the next start even if this run
            // crashes before its first commit (it may publish meanwhile). The note holds only what
            // is durable already, so it is never ahead of the data. Without it (a full disk),
            // the floor in `SEQ` covers the source in the next start's jump.
            let noted = self
                .meta
                .insert(index::seq_note_key(source), &stored.to_le_bytes()[..])
                .and_then(|_| self.index.flush());
            if let Err(e) = noted {
                tracing::warn!(spool = %self.path.display(), source = %source, error = %e,
                    "spool: cannot note a new source in the index; the sequence floor stands for it");
            }
        }
        // A jump owed by a crashed run was paid at open, into the notes.
        let next = noted
            .unwrap_or(0)
            .max(stored)
            .max(pending_note)
            .max(pending_last);
        // Before anything is numbered from it: the floor is durably ahead (if it cannot be
        // moved, frames past it are refused by `admit_seq`).
        let _ = self.reserve_seq(source, next);
        Ok(next)
    }

    /// Records the next sequence number of a source: durable with the commit that makes the
    /// source's earlier appends durable, never before them. Called with each frame, before the
    /// next one can be published: keeps the durable floor ahead ([`floor`]).
    pub fn note_seq(&self, source: &Arc<str>, next: u64) -> Result<(), SpoolError> {
        {
            let mut p = self.pending();
            let serial = p.serial;
            p.seq_notes.insert(source.clone(), (next, serial));
        }
        // A floor that cannot be moved is logged there and enforced by `admit_seq`.
        let _ = self.reserve_seq(source, next);
        Ok(())
    }

    /// The group commit an append made now becomes durable with.
    pub fn current_commit(&self) -> u64 {
        self.commit_no.load(Ordering::Acquire)
    }

    /// Watches the last durable group commit: appends made under a commit below it are on disk.
    pub fn durable_commit(&self) -> tokio::sync::watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// One group commit: segment data first (fdatasync), then the index entries of that data go
    /// to sled, then sled is flushed.
    pub fn commit(&self) -> Result<(), SpoolError> {
        let e = self.commit_no.fetch_add(1, Ordering::AcqRel) + 1;
        let (sync, watermark, due) = {
            let mut segs = self.segs();
            let mut due = segs.ledger_due.clone();
            let sync = match segs.writer.as_mut() {
                Some(w) => {
                    w.flush(self.disk.as_ref())
                        .map_err(self.io("write segment"))?;
                    due.insert(w.id, w.len);
                    Some(w.file.clone())
                }
                None => None,
            };
            // Appends take the segment lock before their serial: every serial below this one has
            // its bytes in the file now (earlier segments were synced when they were sealed).
            (sync, self.pending().serial, due)
        };
        // Appends go on meanwhile; only the sync waits for the disk.
        if let Some(f) = sync {
            if let Err(e) = self.disk.sync_data(&f) {
                self.note_sync_failure(&e);
                return Err(self.io("fdatasync segment")(e));
            }
        }
        // The segments emptied so far: a removal is listed in `pending` before its record's
        // segment is released, so the removals applied and flushed below include the last one of
        // each of these. A segment emptied from here on waits for the next commit: deleting it
        // now could leave a durable index entry pointing at a missing file.
        let emptied = std::mem::take(&mut self.segs().emptied);
        let applied = (|| {
            let stale = {
                let mut p = self.pending();
                self.apply_removals(&mut p)?;
                self.apply_pending(&mut p, watermark)?;
                // The ledger follows the entries: these bytes are synced and their entries in sled.
                let mut batch = sled::Batch::default();
                for (id, len) in &due {
                    batch.insert(ledger::key(*id).as_bytes(), &len.to_le_bytes()[..]);
                }
                self.meta.apply_batch(batch).map_err(self.ix())?;
                std::mem::take(&mut p.stale_oldest)
            };
            self.index.flush().map_err(self.ix())?;
            Ok(stale)
        })();
        let stale = match applied {
            Ok(stale) => stale,
            Err(e) => {
                self.segs().emptied.extend(emptied);
                return Err(e);
            }
        };
        #[cfg(test)]
        tests::after_index_flush();
        self.durable.send_replace(e);
        // The removals are durable: segments they emptied can go.
        let mut segs = self.segs();
        for (id, len) in &due {
            if segs.ledger_due.get(id) == Some(len) {
                segs.ledger_due.remove(id);
            }
        }
        let mut deleted = Vec::new();
        for id in emptied {
            if segs.info.get(&id).is_some_and(|i| i.1 == 0) && self.delete_segment(&mut segs, id) {
                deleted.push(id);
            }
        }
        drop(segs);
        self.sync_after_delete(&deleted);
        for source in stale {
            self.update_oldest(&source)?;
        }
        Ok(())
    }

    /// After a failed fdatasync: this run is no longer clean, and in `on-outage` mode (where frames
    /// are published before they are durable) the sequence notes go to sled anyway, so that a
    /// crash jumps from where publishing got to. A note ahead of its data costs a gap, never a
    /// repeat; the entries stay pending until a sync succeeds.
    fn note_sync_failure(&self, e: &std::io::Error) {
        self.sync_failed.store(true, Ordering::Relaxed);
        if self.mode != SpoolMode::OnOutage {
            return;
        }
        let notes: Vec<(Arc<str>, u64)> = {
            let mut p = self.pending();
            p.seq_notes
                .drain()
                .map(|(s, (next, _))| (s, next))
                .collect()
        };
        for (source, next) in notes {
            let _ = self
                .meta
                .insert(index::seq_note_key(source), &next.to_le_bytes()[..]);
        }
        if let Err(f) = self.index.flush() {
            tracing::error!(spool = %self.path.display(), error = %f, "spool: cannot flush the index");
        }
        tracing::error!(spool = %self.path.display(), error = %e,
            "spool: fdatasync failed; frames since the last commit may be lost, and this run will not count as a clean shutdown");
    }

    /// Stores a frame, applying the capacity policy. A frame not stored (an error included) is
    /// counted and logged as dropped here.
    pub fn append(&self, frame: &Frame) -> Result<Appended, SpoolError> {
        let r = self.store(frame);
        if let Err(e) = &r {
            self.drop_frame(&frame.source, drops::Loss::WriteFailed(e.to_string()));
        }
        r
    }

    /// One frame of `source` lost (the one place that counts and logs it).
    fn drop_frame(&self, source: &Arc<str>, loss: drops::Loss) {
        self.drops.emit(source, &self.stats(source), loss);
    }

    fn store(&self, frame: &Frame) -> Result<Appended, SpoolError> {
        if self.already_stored(&frame.source, frame.seq)? {
            // Already stored (a spooled frame the uplink handed back at shutdown).
            return Ok(Appended::Stored);
        }
        if self.dropped_in_flight(&frame.source, frame.seq) {
            // A spooled frame drop-oldest dropped while the uplink held it, handed back without
            // a receipt (shutdown): it stays dropped, counted once, not stored again to be
            // published next run while counted as lost.
            return Ok(Appended::DroppedEarlier);
        }
        let head = record::header(frame);
        let len = (head.len() + frame.payload.len()) as u64;
        let mut dropped = 0;
        while self.full(len) {
            if self.when_full == WhenFull::DropNewest {
                self.drop_frame(&frame.source, drops::Loss::Newest);
                return Ok(Appended::DroppedNewest);
            }
            match self.drop_oldest_segment(len)? {
                Some(n) => dropped += n,
                None => {
                    self.drop_frame(&frame.source, drops::Loss::NoRoom);
                    return Ok(Appended::DroppedNoRoom);
                }
            }
        }
        if let Err(e) = self.write_record(frame, &head, len) {
            // The filesystem is full before the reserve says so (free space is read once a
            // second): under drop-oldest, make room and try once more.
            let enospc = matches!(&e, SpoolError::Io { source, .. } if source.raw_os_error() == Some(libc_errno::ENOSPC));
            if !(enospc && self.when_full == WhenFull::DropOldest) {
                return Err(e);
            }
            // The failed write was the buffer's flush as well as this record.
            match self.drop_oldest_segment(len + WRITE_BUFFER as u64)? {
                Some(n) if n > 0 => dropped += n,
                _ => return Err(e),
            }
            self.write_record(frame, &head, len)?;
        }
        let stats = self.stats(&frame.source);
        if stats.records.load(Ordering::Relaxed) == 0 {
            stats
                .oldest_ns
                .store(frame.capture_ns.max(1) as u64, Ordering::Relaxed);
        }
        stats.records.fetch_add(1, Ordering::Relaxed);
        stats.bytes.fetch_add(len, Ordering::Relaxed);
        stats.pushed.fetch_add(1, Ordering::Relaxed);
        Ok(if dropped > 0 {
            Appended::StoredDroppingOldest(dropped)
        } else {
            Appended::Stored
        })
    }

    /// Up to `max` records of a source with `seq >= from`, in order. Records that cannot be read
    /// or fail their checksum are quarantined, counted and skipped.
    pub fn read_from(
        &self,
        source: &Arc<str>,
        from: u64,
        max: usize,
    ) -> Result<Vec<Frame>, SpoolError> {
        // Both sides under the pending lock, so a commit cannot move an entry between them.
        let (uncommitted, committed) = {
            let p = self.pending();
            let uncommitted: Vec<(u64, Location)> = p
                .entries
                .get(source)
                .map(|m| {
                    m.range(from..)
                        .take(max)
                        .map(|(s, (l, _))| (*s, *l))
                        .collect()
                })
                .unwrap_or_default();
            (uncommitted, self.committed_from(&p, source, from, max)?)
        };
        // Each side was cut at `max`: beyond the lower cut, the other side's entries may not be
        // followed by everything between (a quarantined record makes room for one), so stop there.
        let mut bound = u64::MAX;
        for side in [&uncommitted, &committed] {
            if side.len() >= max {
                bound = bound.min(side.last().map_or(u64::MAX, |e| e.0));
            }
        }
        let mut wanted: BTreeMap<u64, Location> = BTreeMap::new();
        for (seq, loc) in uncommitted.into_iter().chain(committed) {
            if seq <= bound {
                wanted.entry(seq).or_insert(loc);
            }
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (seq, loc) in wanted {
            let raw = self.read_at(loc).map(Bytes::from);
            let result = match &raw {
                // Out of file descriptors or memory: the record is fine, reading it is not now.
                Err(e) if transient(e) => {
                    return Err(SpoolError::Io {
                        path: self.segment_path(loc.segment),
                        op: "read segment",
                        source: std::io::Error::new(e.kind(), e.to_string()),
                    })
                }
                Err(e) => Err(format!(
                    "cannot read {} bytes at {}: {e}",
                    loc.len, loc.offset
                )),
                Ok(b) => match record::decode(b.clone()) {
                    Err(e) => Err(e.to_string()),
                    Ok(f) if f.seq != seq || f.source != *source => Err(format!(
                        "record is {}/{} where the index expects {source}/{seq}",
                        f.source, f.seq
                    )),
                    Ok(f) => Ok(f),
                },
            };
            match result {
                Ok(f) => {
                    bytes += f.payload.len();
                    out.push(f);
                }
                Err(why) => {
                    // The bytes as read (none when the read failed) go to quarantine/.
                    let raw = raw.unwrap_or_default();
                    // Counted once: only by the caller that takes the entry out of the index.
                    if self.unindex(source, seq)?.is_some() {
                        let name = format!("{source}-{seq}");
                        self.quarantine_bytes(&name, loc.segment, loc.offset, &raw, &why);
                        self.count_out(source, seq, loc, Gone::Quarantined, true);
                    }
                }
            }
            if out.len() >= max || bytes >= 32 << 20 {
                break;
            }
        }
        Ok(out)
    }

    /// Removes a record after its receipt. Missing records (dropped meanwhile) are fine: a
    /// frame dropped while it was in flight was delivered after all, and leaves the dropped count.
    /// The source's oldest capture time follows at the next commit.
    pub fn remove(&self, source: &Arc<str>, seq: u64) -> Result<(), SpoolError> {
        if let Some(loc) = self.unindex(source, seq)? {
            self.count_out(source, seq, loc, Gone::Acked, true);
            let stats = self.stats(source);
            if stats.records.load(Ordering::Relaxed) == 0 {
                stats.oldest_ns.store(0, Ordering::Relaxed);
            }
        } else {
            self.count_delivered_after_drop(source, seq);
        }
        Ok(())
    }

    /// Drops every record of a source (technician action); returns how many.
    pub fn clear_source(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        let tree = self.tree(source)?;
        let mut gone = Vec::new();
        {
            // Under the pending lock, so a commit cannot add this source's pages meanwhile.
            let mut p = self.pending();
            let uncommitted = p.entries.remove(source).unwrap_or_default();
            gone.extend(uncommitted.into_iter().map(|(seq, (loc, _))| (seq, loc)));
            // Removed but still listed: already released.
            let removed = p.removed.remove(source).unwrap_or_default();
            while let Some((k, v)) = tree.pop_min().map_err(self.ix())? {
                let page = pages::decode(key_seq(&k), &v).unwrap_or_default();
                gone.extend(page.into_iter().filter(|(seq, _)| !removed.contains(seq)));
            }
        }
        let stats = self.stats(source);
        for (seq, loc) in &gone {
            self.count_out(source, *seq, *loc, Gone::Dropped, true);
        }
        stats.oldest_ns.store(0, Ordering::Relaxed);
        Ok(gone.len() as u64)
    }

    /// The final commit; then, only if it and every data sync of this run succeeded, marks a
    /// clean shutdown and stores the counts a clean start uses.
    ///
    /// A final commit that fails (a full or failing disk) is not an error of the shutdown: the
    /// frames whose bytes never reached the segment file are counted as dropped and logged, the
    /// run stays unclean, and the next start reads back from the segments what did reach them.
    pub fn close(&self) -> Result<(), SpoolError> {
        if let Err(e) = self.commit() {
            let lost = self.drop_unwritten();
            tracing::error!(spool = %self.path.display(), error = %e, lost,
                "spool: the final commit failed; frames that never reached the disk are counted as dropped, the next start reads back the rest from the segments");
            return Ok(());
        }
        if self.sync_failed.load(Ordering::Relaxed) {
            tracing::warn!(spool = %self.path.display(),
                "spool: a data sync failed during this run; the next start treats it as unclean");
            return Ok(());
        }
        let counts = Counts {
            segments: self
                .segs()
                .info
                .iter()
                .map(|(id, (_, live))| (*id, *live))
                .collect(),
            sources: self
                .all_stats()
                .into_iter()
                .map(|(s, st)| {
                    (
                        s.to_string(),
                        st.records.load(Ordering::Relaxed),
                        st.bytes.load(Ordering::Relaxed),
                    )
                })
                .collect(),
        };
        self.meta
            .insert("counts", counts.encode())
            .map_err(self.ix())?;
        self.meta.insert("clean", &[1u8][..]).map_err(self.ix())?;
        self.index.flush().map_err(self.ix())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
