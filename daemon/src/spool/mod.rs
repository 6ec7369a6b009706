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
//! - `SEQ`: the sequence floor ([`floor`]); `epochs/{source}`: the sending epochs ([`epochs`]).
//! - `quarantine/`: records that failed their checksum, one file each, kept for inspection.
//! - `LOCK`: held (flock) by the process that has the spool open.
//!
//! The offline tools read a spool through [`snapshot`], which never writes to it.
//!
//! Who owns what (each type its own state, behind its own lock): [`segments::Segments`] the
//! segment files, the one being written and the emptied ones; [`index::Index`] the sled database,
//! its pages and the changes not yet committed to them, the sequence notes and the ledger;
//! [`counts::Counts`] the per-source counters and the recent drops; [`capacity::Capacity`]
//! `max-bytes`, `free-reserve` and the last measurements; [`floor::Floor`] the sequence floor;
//! [`epochs::Epochs`] the epoch lists; [`quarantine::Quarantine`] `quarantine/`. Every file the
//! spool writes goes through [`disk::Disk`] (the seam tests fail on purpose). [`recovery`] makes
//! the index cover the segments at open. This file holds the public API and the rules that span
//! the parts: an append (floor, segment write, index, counts), the order of a group commit, a
//! removal, what `when-full` drops, a clean shutdown.
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
//!   (the [`index`]'s pending changes) until a commit has written the record's data (fdatasync);
//!   only then do they go to sled, which may write them to disk at any moment after. So an index
//!   entry or sequence note that survives a crash or power cut never points past data that did
//!   not: a crash loses the frames of the last commit interval whole, never leaving a hole in a
//!   source's sequence.
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
mod counts;
mod disk;
mod drops;
pub mod epochs;
pub mod floor;
mod gop;
mod held;
pub mod identity;
mod index;
mod ledger;
mod pages;
mod quarantine;
pub mod record;
mod recovery;
mod segments;
pub mod snapshot;

use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::{SpoolConfig, SpoolMode, WhenFull};
use crate::payload::Held;

pub use commit::commit_loop;

use capacity::Capacity;
use counts::{Counts, Gone};
pub(crate) use disk::Disk;
use disk::{libc_errno, transient, Os};
use drops::{Dropped, Loss};
use epochs::Epochs;
use floor::Floor;
pub use held::Entry;
use index::Index;
use pages::Location;
use quarantine::Quarantine;
use recovery::{Recovery, SavedCounts};
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
    /// Records evicted by the source's retention (`retain-age`, `retain-bytes`).
    pub evicted: AtomicU64,
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

/// What a drop-oldest did for an append ([`Spool::drop_oldest_segment`]).
enum Room {
    /// Dropped this many records (0: the room was there, made by another lane's drop).
    Made(u64),
    /// Dropped nothing: the frame goes instead, lost for this reason.
    Not(Loss),
}

/// The spool: its parts, each owning its state, and the rules that span them.
pub struct Spool {
    path: PathBuf,
    _lock: File,
    mode: SpoolMode,
    unclean_start: bool,
    disk: Arc<dyn Disk>,
    segments: Segments,
    index: Index,
    counts: Counts,
    capacity: Capacity,
    floor: Floor,
    epochs: Epochs,
    quarantine: Quarantine,
    /// An fdatasync failed in this run: its data may be lost, so the run does not end clean.
    sync_failed: AtomicBool,
    /// The group commit an append made now belongs to (not a sending epoch, `pipeline::epochs`).
    commit_no: AtomicU64,
    /// The lowest group commit a lane waits for ([`Spool::current_commit`]).
    wanted: AtomicU64,
    durable: tokio::sync::watch::Sender<u64>,
}

/// fsync of `segments/` after deletions. Not fatal: a drained segment that a power cut brings
/// back holds nothing the index lists and is deleted again at the next start (only an index
/// rebuild would send its records again, and broker deduplication drops them).
/// Once the deletions are durable the ledger forgets the segments (a segment file the ledger
/// does not know is read back at the next start, never deleted unread).
fn sync_after_delete(segments: &Segments, index: &Index, ids: &[u64]) {
    if ids.is_empty() {
        return;
    }
    if let Err(e) = segments.sync_dir() {
        tracing::warn!(error = %e, "spool: deleted segments may come back after a power cut");
        return;
    }
    if let Err(e) = index.forget_segments(ids) {
        tracing::warn!(error = %e, "spool: cannot update the segment ledger");
    }
}

/// The spool holds the camera, the microphone and GPS positions: only its owner may enter it,
/// whatever the umask made of it (0700; its files are created 0600 by [`disk`]). A directory the
/// user cannot change is left as it is (an offline tool reading another user's spool).
fn private_dir(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return;
    }
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o700)) {
        Ok(()) => {
            tracing::info!(spool = %path.display(), was = format!("{mode:o}"), "spool: made private (0700): other users could read the frames")
        }
        Err(e) => {
            tracing::debug!(spool = %path.display(), error = %e, "spool: left its mode as it is")
        }
    }
}

impl Spool {
    /// Opens (or creates) the spool; damaged contents are set aside, never fatal.
    pub fn open(cfg: &SpoolConfig) -> Result<Arc<Self>, SpoolError> {
        Self::open_on(cfg, Arc::new(Os))
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
        if let Err(e) = identity::write(spool.disk.as_ref(), &spool.path, rig) {
            tracing::warn!(spool = %spool.path.display(), error = %e, "spool: cannot record the rig identity (the offline tools will need --rig)");
        }
        Ok(spool)
    }

    /// [`Spool::open`] with every file call going to `disk` (fault injection).
    #[cfg(test)]
    pub(crate) fn open_with(
        cfg: &SpoolConfig,
        disk: Box<dyn Disk>,
    ) -> Result<Arc<Self>, SpoolError> {
        Self::open_on(cfg, Arc::from(disk))
    }

    fn open_on(cfg: &SpoolConfig, disk: Arc<dyn Disk>) -> Result<Arc<Self>, SpoolError> {
        let path = cfg.path.clone();
        let io = |op: &'static str| {
            let path = path.clone();
            move |source| SpoolError::Io { path, op, source }
        };
        for d in ["segments", "quarantine"] {
            disk.create_dir(&path.join(d))
                .map_err(io("create directory"))?;
        }
        private_dir(&path);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join("LOCK"))
            .map_err(io("open LOCK"))?;
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(SpoolError::Locked { path });
        }
        let index = Index::open(&path)?;
        let last = index.start_run()?;
        // The mode of the run that crashed decides whether a jump is owed; a spool from before
        // `meta/mode` was written is taken as `on-outage` (the default), the safe side.
        let crashed_always = last
            .mode
            .as_ref()
            .is_some_and(|v| v.as_ref() == mode_key(SpoolMode::Always));
        let jump_owed = last.unclean && !crashed_always;
        // After a clean shutdown the counts it stored spare walking the index.
        let saved = last.counts.as_ref().and_then(|v| SavedCounts::decode(v));
        let (durable, _) = tokio::sync::watch::channel(0);
        let spool = Spool {
            _lock: lock,
            mode: cfg.mode,
            unclean_start: last.unclean,
            segments: Segments::new(
                &path,
                disk.clone(),
                MAX_SEGMENT.min(cfg.max_bytes.0 / 8).max(1 << 20),
            ),
            index,
            counts: Counts::default(),
            capacity: Capacity::new(cfg),
            floor: Floor::new(&path, disk.clone()),
            epochs: Epochs::new(&path, disk.clone()),
            quarantine: Quarantine::open(&path, disk.clone()),
            disk,
            sync_failed: AtomicBool::new(false),
            commit_no: AtomicU64::new(0),
            wanted: AtomicU64::new(0),
            durable,
            path,
        };
        if spool.index.temporary() {
            // What survives this run is the index on disk, which cannot hear of a deletion.
            spool.segments.keep_files();
        }
        let recovery = Recovery {
            root: &spool.path,
            index: &spool.index,
            segments: &spool.segments,
            counts: &spool.counts,
            quarantine: &spool.quarantine,
        };
        if last.rebuild {
            spool.index.rebuild_started()?;
            recovery.rebuild_index("the last run found an unreadable index page")?;
        } else {
            recovery.load(&last.known, saved)?;
        }
        for (source, _) in spool.counts.all() {
            spool.update_oldest(&source)?;
        }
        // A blank or rebuilt index knows nothing of what was published and removed: numbering
        // resumes at the floor kept outside it, and the jump is owed whatever the mode.
        spool.load_floors(last.known.blank || spool.index.damage().is_some())?;
        if jump_owed || spool.index.damage().is_some() {
            recovery::jump_sequences(&spool.path, &spool.index, &spool.floor)?;
        }
        // Only now: a crash before this line leaves the debt of the crashed run in place.
        spool.index.set_mode(mode_key(cfg.mode))?;
        spool.refresh_free_space();
        Ok(Arc::new(spool))
    }

    /// At open: the floors from `SEQ`. `index_lost`: the index was blank or rebuilt, so its
    /// notes may be behind what was handed out; every source resumes at least at its floor.
    fn load_floors(&self, index_lost: bool) -> Result<(), SpoolError> {
        let loaded = self.floor.read();
        let mut raised = 0;
        for (source, floor) in &loaded.floors {
            if index_lost && self.index.noted_seq(source)?.is_none_or(|n| n < *floor) {
                self.index.set_seq_note(source, *floor)?;
                raised += 1;
            }
        }
        if raised > 0 {
            self.index.flush()?;
            tracing::warn!(spool = %self.path.display(), sources = raised,
                "spool: the index did not know where numbering had got to; sequence numbers resume at the floor in SEQ");
        }
        self.floor.install(loaded);
        Ok(())
    }

    fn io(&self, op: &'static str) -> impl Fn(std::io::Error) -> SpoolError + '_ {
        move |source| SpoolError::Io {
            path: self.path.clone(),
            op,
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

    /// Why the index had to be rebuilt from the segments at open, or was found damaged since.
    pub fn index_damage(&self) -> Option<String> {
        self.index.damage()
    }

    pub fn stats(&self, source: &Arc<str>) -> Arc<SourceSpoolStats> {
        self.counts.stats(source)
    }

    pub fn all_stats(&self) -> Vec<(Arc<str>, Arc<SourceSpoolStats>)> {
        self.counts.all()
    }

    /// Bytes the spool takes on disk: segments and index (what `max-bytes` limits).
    pub fn total_bytes(&self) -> u64 {
        self.segment_bytes() + self.index_bytes()
    }

    /// Bytes allocated to the segment files.
    pub fn segment_bytes(&self) -> u64 {
        self.segments.bytes()
    }

    /// Bytes allocated to the sled index, as last measured (once a second, and at each drop).
    pub fn index_bytes(&self) -> u64 {
        self.capacity.index_bytes()
    }

    pub fn quarantined(&self) -> u64 {
        self.quarantine.count()
    }

    /// Reads free space for the reserve; called periodically, not per frame.
    /// Also measures the index's size on disk, which counts in `max-bytes`.
    pub fn refresh_free_space(&self) {
        self.capacity.refresh();
    }

    /// [`epochs::read_epochs`] of this spool.
    pub fn epochs(&self, source: &str) -> Result<Vec<u64>, SpoolError> {
        self.epochs.list(source)
    }

    /// Records that `source`'s frames from `start` on go out under a new epoch's producer name
    /// ([`epochs`]): on disk when it returns, and not named by the list when it fails. `start`
    /// must be above every earlier start.
    pub fn add_epoch(&self, source: &str, start: u64) -> Result<(), SpoolError> {
        self.epochs.add(source, start)
    }

    /// The sequence number for a source's next frame.
    pub fn next_seq(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        let (noted, stored, pending) = self.index.numbering(source)?;
        if noted.is_none() {
            // First use: a durable note makes the source known to the next start even if this run
            // crashes before its first commit (it may publish meanwhile). The note holds only what
            // is durable already, so it is never ahead of the data. Without it (a full disk),
            // the floor in `SEQ` covers the source in the next start's jump.
            if let Err(e) = self.index.note_new_source(source, stored) {
                tracing::warn!(spool = %self.path.display(), source = %source, error = %e,
                    "spool: cannot note a new source in the index; the sequence floor stands for it");
            }
        }
        // A jump owed by a crashed run was paid at open, into the notes.
        let next = noted.unwrap_or(0).max(stored).max(pending);
        // Before anything is numbered from it: the floor is durably ahead (if it cannot be
        // moved, frames past it are refused by `admit_seq`).
        let _ = self.floor.reserve(source, next);
        Ok(next)
    }

    /// Records the next sequence number of a source: durable with the commit that makes the
    /// source's earlier appends durable, never before them. Called with each frame, before the
    /// next one can be published: keeps the durable floor ahead ([`floor`]).
    pub fn note_seq(&self, source: &Arc<str>, next: u64) -> Result<(), SpoolError> {
        self.index.note_seq(source, next);
        // A floor that cannot be moved is logged there and enforced by `admit_seq`.
        let _ = self.floor.reserve(source, next);
        Ok(())
    }

    /// Whether [`Spool::note_seq`] or [`Spool::admit_seq`] with `seq` touches the disk (the
    /// sequence floor moves every few hundred thousand numbers); otherwise both are memory only,
    /// and a caller on the async runtime need not hand its thread over for them.
    pub fn floor_due(&self, source: &Arc<str>, seq: u64) -> bool {
        self.floor.due(source, seq)
    }

    /// Whether a frame of `source` may take the number `seq`: it is below the durable floor
    /// (moved first when due). A frame that may not is dropped by the caller; it is counted here.
    pub fn admit_seq(&self, source: &Arc<str>, seq: u64) -> bool {
        if self.floor.reserve(source, seq).is_ok() {
            return true;
        }
        self.counts.lost(source, Loss::Floor);
        false
    }

    /// The group commit an append made now becomes durable with: its caller waits until the
    /// durable commit is past it, so the next commit is due ([`Spool::commit_due`]) whatever else
    /// it finds to do.
    pub fn current_commit(&self) -> u64 {
        let k = self.commit_no.load(Ordering::Acquire);
        self.wanted.fetch_max(k + 1, Ordering::AcqRel);
        k
    }

    /// Whether a group commit now would make anything durable: appended or removed records, a
    /// commit a lane waits for, segment bytes not yet synced, or sequence notes older than
    /// `notes_every`. Memory only. An idle rig (publishing live, nothing spooled) skips its ticks:
    /// no fdatasync, no sled flush and no lane woken 20 times a second; its sequence notes go to
    /// sled every `notes_every` (a crash jumps past what was handed out since, [`floor`]).
    pub fn commit_due(&self, notes_every: std::time::Duration) -> bool {
        self.wanted.load(Ordering::Acquire) > *self.durable.borrow()
            || !self.segments.idle()
            || !self.index.idle(notes_every)
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
            let mut segs = self.segments.lock();
            let segments::Flushed { sync, due } = segs.flush()?;
            // Appends take the segment lock before their serial: every serial below this one has
            // its bytes in the file now (earlier segments were synced when they were sealed).
            (sync, self.index.serial(), due)
        };
        // Appends go on meanwhile; only the sync waits for the disk.
        if let Some((f, at)) = sync {
            if let Err(e) = self.segments.sync_data(&f) {
                self.note_sync_failure(&e);
                return Err(self.io("fdatasync segment")(e));
            }
            self.segments.synced(at);
        }
        // The segments emptied so far: a removal is listed in the index's pending changes before
        // its record's segment is released, so the removals applied and flushed below include the
        // last one of each of these. A segment emptied from here on waits for the next commit:
        // deleting it now could leave a durable index entry pointing at a missing file.
        let emptied = self.segments.take_emptied();
        let stale = match self.index.commit(watermark, &due) {
            Ok(stale) => stale,
            Err(e) => {
                self.segments.restore_emptied(emptied);
                return Err(e);
            }
        };
        #[cfg(test)]
        tests::after_index_flush();
        self.durable.send_replace(e);
        // The removals are durable: segments they emptied can go.
        let mut segs = self.segments.lock();
        segs.recorded(&due);
        let deleted: Vec<u64> = emptied
            .into_iter()
            .filter(|id| segs.delete_if_empty(*id))
            .collect();
        drop(segs);
        sync_after_delete(&self.segments, &self.index, &deleted);
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
        if let Err(f) = self.index.write_seq_notes_now() {
            tracing::error!(spool = %self.path.display(), error = %f, "spool: cannot flush the index");
        }
        tracing::error!(spool = %self.path.display(), error = %e,
            "spool: fdatasync failed; frames since the last commit may be lost, and this run will not count as a clean shutdown");
    }

    /// Stores a frame, applying the capacity policy. A frame not stored (an error included) is
    /// counted and logged as dropped here.
    pub fn append(&self, frame: &Held) -> Result<Appended, SpoolError> {
        let r = self.store(frame);
        if let Err(e) = &r {
            self.counts
                .lost(&frame.source, Loss::WriteFailed(e.to_string()));
        }
        r
    }

    fn store(&self, frame: &Held) -> Result<Appended, SpoolError> {
        if self.index.already_stored(&frame.source, frame.seq)? {
            // Already stored (a spooled frame the uplink handed back at shutdown).
            return Ok(Appended::Stored);
        }
        if self.counts.dropped_in_flight(&frame.source, frame.seq) {
            // A spooled frame drop-oldest dropped while the uplink held it, handed back without
            // a receipt (shutdown): it stays dropped, counted once, not stored again to be
            // published next run while counted as lost.
            return Ok(Appended::DroppedEarlier);
        }
        let head = record::header(frame);
        let len = (head.len() + frame.payload.len()) as u64;
        let mut dropped = 0;
        while self.full(len) {
            if self.capacity.when_full() == WhenFull::DropNewest {
                self.counts.lost(&frame.source, Loss::Newest);
                return Ok(Appended::DroppedNewest);
            }
            match self.drop_oldest_segment(len)? {
                Room::Made(n) => dropped += n,
                Room::Not(why) => {
                    self.counts.lost(&frame.source, why);
                    return Ok(Appended::DroppedNoRoom);
                }
            }
        }
        if let Err(e) = self.write_record(frame, &head, len) {
            // The filesystem is full before the reserve says so (free space is read once a
            // second): under drop-oldest, make room and try once more.
            let enospc = matches!(&e, SpoolError::Io { source, .. } if source.raw_os_error() == Some(libc_errno::ENOSPC));
            if !(enospc && self.capacity.when_full() == WhenFull::DropOldest) {
                return Err(e);
            }
            // The failed write was the buffer's flush as well as this record.
            match self.drop_oldest_segment(len + WRITE_BUFFER as u64)? {
                Room::Made(n) if n > 0 => dropped += n,
                _ => return Err(e),
            }
            self.write_record(frame, &head, len)?;
        }
        Ok(if dropped > 0 {
            Appended::StoredDroppingOldest(dropped)
        } else {
            Appended::Stored
        })
    }

    /// Writes a record into the segment being written, keeps its index entry pending and counts
    /// it stored; all or nothing.
    fn write_record(&self, frame: &Held, head: &[u8], len: u64) -> Result<(), SpoolError> {
        let mut segs = self.segments.lock();
        let loc = segs.append(frame, head, len, |e| self.note_sync_failure(e))?;
        // Under the segment lock, so a commit's watermark covers exactly the written appends.
        self.index.add(&frame.source, frame.seq, loc);
        // Counted under it too: its segment is sealed only by a later append (which takes this
        // lock), so no drop-oldest can count the record out before it is counted in. Counted
        // after its drop, the count-out found nothing to take and the record stayed counted.
        self.counts.stored(&frame.source, frame.capture_ns, len);
        Ok(())
    }

    /// Whether `incoming` more bytes overfill the spool ([`Capacity::full`]).
    fn full(&self, incoming: u64) -> bool {
        self.capacity.full(self.segments.bytes(), incoming)
    }

    /// Drops every record of the oldest sealed segment (drop-oldest) and returns how many, when
    /// that is a step towards room for `incoming` bytes; otherwise drops nothing and says why.
    /// Held records are deleted only for room that is then used: not when only the segment being
    /// written is left, not when dropping every sealed segment would still leave no room (a
    /// filesystem filled by other files, below `free-reserve` even without the spool), not
    /// while the index on disk cannot be opened (this run's temporary index cannot record the
    /// deletion). The records are found in the index, not by reading the segment: a segment that
    /// cannot be opened (EMFILE, EIO) is dropped all the same, and every record the index lists
    /// in it is counted as dropped, once. Drops are one at a time: a lane that waited for
    /// another's drop finds the space it made (`incoming`).
    fn drop_oldest_segment(&self, incoming: u64) -> Result<Room, SpoolError> {
        let _one = self.capacity.one_drop_at_a_time();
        self.refresh_free_space();
        if !self.full(incoming) {
            return Ok(Room::Made(0));
        }
        if self.index.temporary() {
            return Ok(Room::Not(Loss::IndexAway));
        }
        if self.capacity.barren() {
            return Ok(Room::Not(Loss::NotEnough));
        }
        let (oldest, sealed) = {
            let segs = self.segments.lock();
            (segs.oldest_sealed(), segs.sealed_bytes())
        };
        let Some(id) = oldest else {
            return Ok(Room::Not(Loss::NoRoom));
        };
        if self
            .capacity
            .full_after_freeing(self.segments.bytes(), incoming, sealed)
        {
            return Ok(Room::Not(Loss::NotEnough));
        }
        let Some(victims) = self.index.in_segment(id)? else {
            return Ok(Room::Not(Loss::NoRoom));
        };
        let mut n = 0;
        let mut lost: std::collections::HashMap<Arc<str>, i64> = Default::default();
        for (source, seq) in victims {
            // A receipt may have removed it meanwhile: then it is not a drop.
            if let Some(loc) = self.index.unindex(&source, seq)? {
                // The segment is deleted below, not released record by record.
                self.counts
                    .count_out(&source, seq, loc.len as u64, Gone::Dropped(Dropped::Oldest));
                let t = lost.entry(source.clone()).or_insert(i64::MIN);
                *t = (*t).max(loc.capture_ns);
                n += 1;
            }
        }
        // A group of pictures whose start went with the segment goes whole: the deltas left at
        // the head of its source would decode for nobody ([`gop`]).
        let mut broken = 0;
        for (source, t) in lost.iter_mut() {
            let (k, last) = self.drop_broken_head(source, Gone::Dropped(Dropped::Oldest))?;
            broken += k;
            *t = (*t).max(last);
        }
        for (source, t) in lost {
            self.note_lost(&source, t)?;
        }
        n += broken;
        // The segment goes now, to make room: its removals are made durable first.
        self.index.apply_removals_now()?;
        let free_before = self.capacity.free_bytes();
        if self.segments.lock().delete(id) {
            sync_after_delete(&self.segments, &self.index, &[id]);
        }
        self.refresh_free_space();
        let free_after = self.capacity.free_bytes();
        if free_after <= free_before
            && self
                .capacity
                .short_of_free_space(self.segments.bytes(), incoming)
        {
            // Its blocks did not come back: deleting more would buy nothing either.
            self.capacity.deletion_gave_nothing(free_after);
            tracing::warn!(segment = id, free_bytes = free_after,
                "spool: deleting the oldest segment gave no space back (a snapshot, a process holding it open, or another writer took it); drop-oldest deletes nothing more until free space grows");
        }
        for (source, _) in self.counts.all() {
            self.update_oldest(&source)?;
        }
        tracing::warn!(
            segment = id,
            records = n,
            rest_of_groups = broken,
            "spool full: dropped the oldest segment (when-full = drop-oldest)"
        );
        Ok(Room::Made(n))
    }

    /// After a drop of a source's oldest records: the deltas now at its head (the rest of a group
    /// of pictures whose keyframe went) leave the index too, counted as `gone`. Reads only the
    /// index. Returns how many and the latest capture time among them (`i64::MIN`: none).
    fn drop_broken_head(&self, source: &Arc<str>, gone: Gone) -> Result<(u64, i64), SpoolError> {
        let (mut n, mut last) = (0, i64::MIN);
        loop {
            let batch = self.entries_from(source, 0, 256)?;
            let deltas: Vec<bool> = batch.values().map(|l| l.delta).collect();
            let cut = gop::extend(&deltas, 0, true);
            if cut == 0 {
                break;
            }
            for (seq, loc) in batch.into_iter().take(cut) {
                if self.index.unindex(source, seq)?.is_some() {
                    self.count_out(source, seq, loc, gone);
                    last = last.max(loc.capture_ns);
                    n += 1;
                }
            }
            if cut < deltas.len() {
                break;
            }
        }
        Ok((n, last))
    }

    /// A record that left the index is counted out ([`Counts::count_out`]) and, unless the
    /// caller deletes its segment, its segment holds one record fewer.
    fn count_out(&self, source: &Arc<str>, seq: u64, loc: Location, gone: Gone) {
        self.counts.count_out(source, seq, loc.len as u64, gone);
        self.segments.release(loc.segment);
    }

    /// Refreshes a source's oldest capture time from the index.
    fn update_oldest(&self, source: &Arc<str>) -> Result<(), SpoolError> {
        let oldest = self.index.oldest(source)?;
        self.counts.set_oldest(source, oldest.map(|l| l.capture_ns));
        Ok(())
    }

    /// Up to `max` records of a source with `seq >= from`, in order. Records that cannot be read
    /// or fail their checksum are quarantined, counted and skipped.
    pub fn read_from(
        &self,
        source: &Arc<str>,
        from: u64,
        max: usize,
    ) -> Result<Vec<Held>, SpoolError> {
        let wanted = self.entries_from(source, from, max)?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (seq, loc) in wanted {
            let raw = self.segments.read(loc).map(Bytes::from);
            let result = match &raw {
                // Out of file descriptors or memory, or a segment made unreadable to this user
                // since it was written (a chmod, a wrong owner after a restore): the record is
                // fine, reading it is not now. Never quarantined: an operator mends the mode and
                // the lane reads it again.
                Err(e) if transient(e) || denied(e) => {
                    return Err(SpoolError::Io {
                        path: self.segments.path(loc.segment),
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
                    if self.index.unindex(source, seq)?.is_some() {
                        let name = format!("{source}-{seq}");
                        self.quarantine
                            .set_aside(&name, loc.segment, loc.offset, &raw, &why);
                        self.count_out(source, seq, loc, Gone::Quarantined);
                    }
                }
            }
            if out.len() >= max || bytes >= 32 << 20 {
                break;
            }
        }
        Ok(out)
    }

    /// Up to `max` index entries of a source with `seq >= from`, in order, committed or not.
    fn entries_from(
        &self,
        source: &Arc<str>,
        from: u64,
        max: usize,
    ) -> Result<BTreeMap<u64, Location>, SpoolError> {
        let (uncommitted, committed) = self.index.entries_from(source, from, max)?;
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
        Ok(wanted)
    }

    /// A source's retention: evicts its oldest records while they were captured before
    /// `captured_before` (ns) or the source holds more than `max_bytes`, but none from one
    /// captured at or after `keep_from` on (a recall still wants it); each is counted
    /// (`evicted`). Groups of pictures go whole ([`gop`]): an eviction that ends inside a group
    /// takes the rest of it; one stopped by a wanted frame stops at the start of that frame's group
    /// (when its keyframe is in the same batch of 256 records, else at the frame). Reads only the
    /// index. Returns how many went.
    pub fn evict(
        &self,
        source: &Arc<str>,
        captured_before: Option<i64>,
        max_bytes: Option<u64>,
        keep_from: Option<i64>,
    ) -> Result<u64, SpoolError> {
        let stats = self.stats(source);
        let mut n = 0;
        let mut lost = i64::MIN;
        loop {
            let batch = self.entries_from(source, 0, 256)?;
            if batch.is_empty() {
                break;
            }
            // The plan first (the bytes as they will be), then the removals.
            let mut bytes = stats.bytes.load(Ordering::Relaxed);
            let mut stop = None;
            for (i, loc) in batch.values().enumerate() {
                let old = captured_before.is_some_and(|t| loc.capture_ns < t);
                let over = max_bytes.is_some_and(|m| bytes > m);
                let wanted = keep_from.is_some_and(|t| loc.capture_ns >= t);
                if (!old && !over) || wanted {
                    stop = Some((i, wanted));
                    break;
                }
                bytes = bytes.saturating_sub(loc.len as u64);
            }
            let deltas: Vec<bool> = batch.values().map(|l| l.delta).collect();
            let cut = match stop {
                Some((i, true)) => gop::keep_whole(&deltas, i).unwrap_or(i),
                Some((i, false)) => gop::extend(&deltas, i, n > 0 || i > 0),
                None => deltas.len(),
            };
            let mut any = false;
            for (seq, loc) in batch.into_iter().take(cut) {
                if self.index.unindex(source, seq)?.is_some() {
                    self.count_out(source, seq, loc, Gone::Evicted);
                    lost = lost.max(loc.capture_ns);
                    n += 1;
                    any = true;
                }
            }
            if !any || cut < deltas.len() {
                break;
            }
        }
        if n > 0 {
            self.note_lost(source, lost)?;
            self.update_oldest(source)?;
        }
        Ok(n)
    }

    /// A frame of `source` the lane skipped because its group of pictures lost a frame before
    /// it: counted and logged as dropped ([`drops`]), never stored.
    pub fn skipped(&self, source: &Arc<str>) {
        self.counts.lost(source, Loss::GroupBroken);
    }

    /// Removes a record after its receipt. Missing records (dropped meanwhile) are fine: a
    /// frame dropped while it was in flight was delivered after all, and leaves the dropped count.
    /// The source's oldest capture time follows at the next commit.
    pub fn remove(&self, source: &Arc<str>, seq: u64) -> Result<(), SpoolError> {
        if let Some(loc) = self.index.unindex(source, seq)? {
            self.count_out(source, seq, loc, Gone::Acked);
            let stats = self.stats(source);
            if stats.records.load(Ordering::Relaxed) == 0 {
                stats.oldest_ns.store(0, Ordering::Relaxed);
            }
        } else {
            self.counts.delivered_after_drop(source, seq);
        }
        Ok(())
    }

    /// Drops every record of a source (technician action); returns how many.
    pub fn clear_source(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        let gone = self.index.clear(source)?;
        for (seq, loc) in &gone {
            self.count_out(source, *seq, *loc, Gone::Dropped(Dropped::Cleared));
        }
        self.counts.set_oldest(source, None);
        Ok(gone.len() as u64)
    }

    /// At a shutdown whose commit failed: the frames still in the write buffer are lost. They
    /// leave the index and are counted as dropped; returns how many.
    fn drop_unwritten(&self) -> u64 {
        let Some((id, flushed)) = self.segments.lock().write_out() else {
            return 0;
        };
        let lost = self.index.take_unwritten(id, flushed);
        for (source, seq, loc) in &lost {
            // Their segment stays (it is the one being written).
            self.counts.count_out(
                source,
                *seq,
                loc.len as u64,
                Gone::Dropped(Dropped::Unwritten),
            );
        }
        lost.len() as u64
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
        let saved = SavedCounts {
            segments: self.segments.lock().live(),
            sources: self
                .counts
                .all()
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
        self.index.mark_clean(saved.encode())
    }
}

#[cfg(test)]
mod tests;
