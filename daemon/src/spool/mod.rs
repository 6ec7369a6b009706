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

pub mod identity;
mod ledger;
mod pages;
pub mod record;
pub mod snapshot;
mod split;

use bytes::Bytes;
use rigd_drivers::Frame;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::{SpoolConfig, SpoolMode, WhenFull};

/// After an unclean shutdown in `on-outage` mode, sequence numbers resume this far above the last
/// committed one: more than any source captures between two group commits.
pub const CRASH_SEQ_MARGIN: u64 = 1 << 20;

const MAX_SEGMENT: u64 = 64 << 20;

/// Free space kept for the index whatever `free-reserve` says (even `"0"`).
const INDEX_HEADROOM: u64 = 4 << 20;

/// The spool's file I/O on segments and quarantine, behind a trait so that tests can fail any
/// call (EIO, ENOSPC, EMFILE), make writes short or torn, or watch the order of the syncs. The
/// index is sled's own business and not behind it.
pub(crate) trait Disk: Send + Sync {
    /// fdatasync of a segment file.
    fn sync_data(&self, file: &File) -> std::io::Result<()>;
    /// fsync of a directory, after an entry in it was created or removed.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
    /// Creates a new segment file for reading and writing (fails if it exists).
    fn create(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(path)
    }
    /// Opens a segment for reading.
    fn open(&self, path: &Path) -> std::io::Result<File> {
        File::open(path)
    }
    /// A whole segment.
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    /// One positioned write; may write less than `buf`.
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<usize> {
        file.write_at(buf, offset)
    }
    /// Fills `buf` from `offset`.
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        file.read_exact_at(buf, offset)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_file(path)
    }
    /// A quarantine file.
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::write(path, bytes)
    }
}

/// The real disk.
struct Os;

impl Disk for Os {
    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        file.sync_data()
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

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
}

impl Appended {
    /// The log line for a frame loss of this kind (none for a stored frame).
    pub fn loss(&self) -> Option<&'static str> {
        match self {
            Appended::Stored => None,
            Appended::StoredDroppingOldest(_) => {
                Some("spool full: dropped the oldest frames (when-full = drop-oldest)")
            }
            Appended::DroppedNewest => {
                Some("spool full: dropped the newest frame (when-full = drop-newest)")
            }
            Appended::DroppedNoRoom => Some(
                "spool full: nothing older left to drop, this frame dropped (when-full = drop-oldest)",
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Location {
    segment: u64,
    offset: u64,
    len: u32,
    /// Capture time of the frame, so the oldest age is known without reading the record.
    capture_ns: i64,
}

impl Location {
    /// The earlier one-entry-per-record index value (still read, see [`pages`]).
    #[cfg(test)]
    fn encode(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..].copy_from_slice(&self.capture_ns.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 28 {
            return None;
        }
        Some(Location {
            segment: u64::from_le_bytes(b[..8].try_into().ok()?),
            offset: u64::from_le_bytes(b[8..16].try_into().ok()?),
            len: u32::from_le_bytes(b[16..20].try_into().ok()?),
            capture_ns: i64::from_le_bytes(b[20..].try_into().ok()?),
        })
    }
}

/// Index changes not yet in sled (see the module's invariants). Every append takes the next
/// `serial`; a commit moves to sled what was appended before the data flush it made.
#[derive(Default)]
struct Pending {
    serial: u64,
    /// Per source: seq -> (location, serial of the append).
    entries: HashMap<Arc<str>, BTreeMap<u64, (Location, u64)>>,
    /// Per source: (next sequence, serial when noted).
    seq_notes: HashMap<Arc<str>, (u64, u64)>,
    /// Per source: the highest seq ever indexed (committed or not), so that an append above it
    /// needs no index lookup.
    highest: HashMap<Arc<str>, u64>,
    /// Per source: committed records removed since the last commit (their pages still list them).
    removed: HashMap<Arc<str>, BTreeSet<u64>>,
    /// Sources whose oldest capture time is refreshed at the next commit (it moved by a removal).
    stale_oldest: HashSet<Arc<str>>,
}

/// The segment being written. Records go whole into `buf` (or, when larger than it, straight
/// into the file at their offset); the file is written with positioned writes at `flushed`, so a
/// failed or short write (ENOSPC, EIO) never leaves a record half in the buffer: whatever did not
/// reach the file stays buffered, in order, and the next flush goes on from there.
struct Writer {
    id: u64,
    /// Shared with the commit's fdatasync, which runs without the segment lock.
    file: Arc<File>,
    buf: Vec<u8>,
    /// Bytes of the segment: in the file plus buffered.
    len: u64,
    /// Bytes of the segment in the file.
    flushed: u64,
}

/// All of `buf` at `offset`, through `disk`'s (possibly short) writes.
fn write_all_at(
    disk: &dyn Disk,
    file: &File,
    mut buf: &[u8],
    mut offset: u64,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match disk.write_at(file, buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Bytes of whole records a writer buffers before writing them to the file.
const WRITE_BUFFER: usize = 1 << 20;

impl Writer {
    /// Writes the buffer to the file. On an error what was written is kept (`flushed` moves
    /// on), the rest stays buffered.
    fn flush(&mut self, disk: &dyn Disk) -> std::io::Result<()> {
        while !self.buf.is_empty() {
            match disk.write_at(&self.file, &self.buf, self.flushed) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.buf.drain(..n);
                    self.flushed += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Appends one record (`head` then `payload`), whole or not at all.
    fn append(&mut self, disk: &dyn Disk, head: &[u8], payload: &[u8]) -> std::io::Result<()> {
        let len = head.len() + payload.len();
        if self.buf.len() + len > WRITE_BUFFER {
            self.flush(disk)?;
        }
        if len > WRITE_BUFFER {
            let at = self.flushed;
            let written = write_all_at(disk, &self.file, head, at)
                .and_then(|()| write_all_at(disk, &self.file, payload, at + head.len() as u64));
            if let Err(e) = written {
                // A torn record past `flushed` is overwritten by the next one; cut it off if we can.
                let _ = self.file.set_len(at);
                return Err(e);
            }
            self.flushed += len as u64;
        } else {
            self.buf.extend_from_slice(head);
            self.buf.extend_from_slice(payload);
        }
        self.len += len as u64;
        Ok(())
    }

    /// The bytes `[offset, offset + len)` of this segment, from the file and the buffer.
    fn read(&self, disk: &dyn Disk, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        let end = offset + len as u64;
        let in_file = end.min(self.flushed).saturating_sub(offset) as usize;
        if in_file > 0 {
            disk.read_exact_at(&self.file, &mut out[..in_file], offset)?;
        }
        if in_file < len {
            let from = (offset + in_file as u64 - self.flushed) as usize;
            let rest = self
                .buf
                .get(from..from + (len - in_file))
                .ok_or(std::io::ErrorKind::UnexpectedEof)?;
            out[in_file..].copy_from_slice(rest);
        }
        Ok(out)
    }
}

/// An I/O error that says nothing about the data: out of file descriptors or memory, interrupted.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc_errno::EMFILE
                | libc_errno::ENFILE
                | libc_errno::ENOMEM
                | libc_errno::EINTR
                | libc_errno::EAGAIN
        )
    )
}

/// The filesystem or the process is out of room (space, quota, descriptors, memory).
fn no_room(e: &std::io::Error) -> bool {
    transient(e)
        || matches!(
            e.raw_os_error(),
            Some(libc_errno::ENOSPC | libc_errno::EDQUOT)
        )
}

mod libc_errno {
    pub const EDQUOT: i32 = 122;
    pub const EINTR: i32 = 4;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const ENOSPC: i32 = 28;
}

/// `a -= n`, never below 0: a counter that would go negative has met a bookkeeping bug, and a
/// wrapped u64 in status is worse than a count that is off.
fn sub(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

/// Mutable state behind one lock: the writer, segment bookkeeping, open read handles.
struct Segments {
    writer: Option<Writer>,
    /// Per segment: (file size, live records).
    info: BTreeMap<u64, (u64, u64)>,
    readers: HashMap<u64, Arc<File>>,
    /// Segments left without records, deleted after the next commit has made the removals durable.
    emptied: Vec<u64>,
    /// Segment lengths the ledger is to record at the next commit (sealed or new segments; the
    /// one being written is added by the commit itself).
    ledger_due: BTreeMap<u64, u64>,
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
    disk_bytes: AtomicU64,
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
    epoch: AtomicU64,
    durable: tokio::sync::watch::Sender<u64>,
    free_bytes: AtomicU64,
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
            }),
            pending: Mutex::new(Pending::default()),
            dropping: Mutex::new(()),
            disk_bytes: AtomicU64::new(0),
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
            epoch: AtomicU64::new(0),
            durable,
            free_bytes: AtomicU64::new(u64::MAX),
        };
        if rebuild_asked {
            spool.meta.remove("rebuild").map_err(spool.ix())?;
            spool.rebuild_index("the last run found an unreadable index page")?;
        } else {
            spool.load(&known, counts)?;
        }
        // A rebuilt index knows nothing of what was published and removed: the jump is owed
        // whatever the mode.
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

    /// Pays the jump a crashed `on-outage` run owes: every source known to the spool (a sequence
    /// note, or records in the index) gets its note moved [`CRASH_SEQ_MARGIN`] past the highest
    /// sequence known, durably, before anything is numbered from it.
    fn jump_sequences(&self) -> Result<(), SpoolError> {
        let mut sources: BTreeSet<Arc<str>> = BTreeSet::new();
        for item in self.meta.scan_prefix("seq:") {
            let (k, _) = item.map_err(self.ix())?;
            sources.insert(String::from_utf8_lossy(&k[4..]).into());
        }
        for name in self.index.tree_names() {
            if let Some(source) = name.strip_prefix(b"i:") {
                sources.insert(String::from_utf8_lossy(source).into());
            }
        }
        for source in &sources {
            let next = self
                .noted_seq(source)?
                .unwrap_or(0)
                .max(self.stored_seq(source)?);
            self.meta
                .insert(
                    format!("seq:{source}"),
                    &(next + CRASH_SEQ_MARGIN).to_le_bytes()[..],
                )
                .map_err(self.ix())?;
        }
        self.index.flush().map_err(self.ix())?;
        tracing::info!(spool = %self.path.display(), sources = sources.len(), jump = CRASH_SEQ_MARGIN,
            "spool: the last run (on-outage) did not end cleanly; sequence numbers jump ahead");
        Ok(())
    }

    /// A source's durable sequence note.
    fn noted_seq(&self, source: &Arc<str>) -> Result<Option<u64>, SpoolError> {
        Ok(self
            .meta
            .get(format!("seq:{source}"))
            .map_err(self.ix())?
            .map(|v| u64::from_le_bytes(v.as_ref().try_into().unwrap_or_default())))
    }

    /// The sequence after a source's highest committed record (0: none).
    fn stored_seq(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        Ok(self.last_committed(source)?.map_or(0, |s| s + 1))
    }

    /// fsync of `segments/` after deletions. Not fatal: a drained segment that a power cut brings
    /// back holds nothing the index lists and is deleted again at the next start (only an index
    /// rebuild would send its records again, and broker deduplication drops them).
    /// Once the deletions are durable the ledger forgets the segments (a segment file the ledger
    /// does not know is read back at the next start, never deleted unread).
    fn sync_after_delete(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        if let Err(e) = self.sync_segments_dir() {
            tracing::warn!(error = %e, "spool: deleted segments may come back after a power cut");
            return;
        }
        let mut batch = sled::Batch::default();
        for id in ids {
            batch.remove(ledger::key(*id).as_bytes());
        }
        if let Err(e) = self
            .meta
            .apply_batch(batch)
            .and_then(|()| self.index.flush().map(drop))
        {
            tracing::warn!(error = %e, "spool: cannot update the segment ledger");
        }
    }

    /// fsync of `segments/` after a file in it was created or removed.
    fn sync_segments_dir(&self) -> Result<(), SpoolError> {
        self.disk
            .sync_dir(&self.path.join("segments"))
            .map_err(self.io("fsync the segments directory"))
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

    fn segment_path(&self, id: u64) -> PathBuf {
        self.path.join("segments").join(format!("{id:016x}.seg"))
    }

    fn segs(&self) -> MutexGuard<'_, Segments> {
        self.segs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where a source's record is, committed or not.
    fn lookup(&self, source: &Arc<str>, seq: u64) -> Result<Option<Location>, SpoolError> {
        let pending = self.pending();
        if let Some((loc, _)) = pending.entries.get(source).and_then(|m| m.get(&seq)) {
            return Ok(Some(*loc));
        }
        if pending
            .removed
            .get(source)
            .is_some_and(|r| r.contains(&seq))
        {
            return Ok(None);
        }
        self.committed(source, seq)
    }

    /// A record's location as sled has it (removals not yet committed still listed).
    fn committed(&self, source: &Arc<str>, seq: u64) -> Result<Option<Location>, SpoolError> {
        let tree = self.tree(source)?;
        let Some((key, v)) = page_at(&tree, seq).map_err(self.ix())? else {
            return Ok(None);
        };
        Ok(pages::find(key, &v, seq))
    }

    /// The highest seq sled has for a source.
    fn last_committed(&self, source: &Arc<str>) -> Result<Option<u64>, SpoolError> {
        let last = self.tree(source)?.last().map_err(self.ix())?;
        Ok(last.and_then(|(k, v)| pages::last_seq(key_seq(&k), &v)))
    }

    /// Whether a record may already be stored. Lanes append in increasing `seq`; only a frame
    /// handed back by the uplink at shutdown comes again, so only a seq not above the highest one
    /// indexed is looked up.
    fn already_stored(&self, source: &Arc<str>, seq: u64) -> Result<bool, SpoolError> {
        let known = self.pending().highest.get(source).copied();
        let highest = match known {
            Some(h) => Some(h),
            None => {
                let last = self.last_committed(source)?;
                if let Some(l) = last {
                    self.pending().highest.insert(source.clone(), l);
                }
                last
            }
        };
        if highest.is_none_or(|h| seq > h) {
            return Ok(false);
        }
        Ok(self.lookup(source, seq)?.is_some())
    }

    /// Removes a record's index entry, committed or not; returns where it was. A committed entry
    /// leaves sled with the next commit.
    fn unindex(&self, source: &Arc<str>, seq: u64) -> Result<Option<Location>, SpoolError> {
        // Held across the sled read so a commit cannot move the entry in between.
        let mut pending = self.pending();
        if let Some((loc, _)) = pending.entries.get_mut(source).and_then(|m| m.remove(&seq)) {
            pending.stale_oldest.insert(source.clone());
            return Ok(Some(loc));
        }
        if pending
            .removed
            .get(source)
            .is_some_and(|r| r.contains(&seq))
        {
            return Ok(None);
        }
        let loc = self.committed(source, seq)?;
        if loc.is_some() {
            pending
                .removed
                .entry(source.clone())
                .or_default()
                .insert(seq);
            pending.stale_oldest.insert(source.clone());
        }
        Ok(loc)
    }

    /// Writes entries of a source (increasing seq, possibly already stored: the new location
    /// wins) into its pages: merged into the page whose range holds them, else new pages.
    fn store_entries(
        &self,
        source: &Arc<str>,
        tree: &sled::Tree,
        entries: &[(u64, Location)],
    ) -> Result<(), SpoolError> {
        let failed = std::cell::RefCell::new(None);
        let placed = pages::place(
            entries,
            |seq| match page_at(tree, seq) {
                Ok(Some((key, v))) => pages::last_seq(key, &v)
                    .filter(|last| *last >= seq)
                    .map(|_| key),
                Ok(None) => None,
                Err(e) => {
                    failed.borrow_mut().get_or_insert(e);
                    None
                }
            },
            |seq| match tree.range((seq + 1).to_be_bytes()..).next() {
                Some(Ok((k, _))) => Some(key_seq(&k)),
                Some(Err(e)) => {
                    failed.borrow_mut().get_or_insert(e);
                    None
                }
                None => None,
            },
        );
        if let Some(e) = failed.into_inner() {
            return Err(self.ix()(e));
        }
        let mut batch = sled::Batch::default();
        for (key, new) in placed {
            match key {
                None => batch.insert(&new[0].0.to_be_bytes(), pages::encode(&new)),
                Some(key) => {
                    let old = tree.get(key.to_be_bytes()).map_err(self.ix())?;
                    let decoded = old.as_ref().map(|v| pages::decode(key, v));
                    if let Some(None) = decoded {
                        self.bad_page(source, tree, key)?;
                    }
                    let mut page: BTreeMap<u64, Location> =
                        decoded.flatten().unwrap_or_default().into_iter().collect();
                    page.extend(new);
                    let page: Vec<_> = page.into_iter().collect();
                    batch.insert(&key.to_be_bytes(), pages::encode(&page));
                }
            }
        }
        tree.apply_batch(batch).map_err(self.ix())
    }

    /// Rewrites the pages that list records removed since the last commit.
    /// A source's removals leave `p` only once its pages are rewritten: after a failure (sled
    /// out of space) they are still held, so the records stay out of reads and are not counted
    /// out a second time.
    fn apply_removals(&self, p: &mut Pending) -> Result<(), SpoolError> {
        let sources: Vec<Arc<str>> = p.removed.keys().cloned().collect();
        for source in sources {
            let Some(removed) = p.removed.get(&source) else {
                continue;
            };
            let tree = self.tree(&source)?;
            let removed: Vec<u64> = removed.iter().copied().collect();
            let mut batch = sled::Batch::default();
            let mut i = 0;
            while i < removed.len() {
                let seq = removed[i];
                let Some((key, v)) = page_at(&tree, seq).map_err(self.ix())? else {
                    i += 1;
                    continue;
                };
                let page = pages::decode(key, &v).unwrap_or_default();
                let Some(&(last, _)) = page.last().filter(|(last, _)| *last >= seq) else {
                    i += 1;
                    continue;
                };
                let n = removed[i..].partition_point(|s| *s <= last);
                let gone = &removed[i..i + n];
                let kept: Vec<_> = page
                    .into_iter()
                    .filter(|(s, _)| gone.binary_search(s).is_err())
                    .collect();
                if kept.is_empty() {
                    batch.remove(&key.to_be_bytes());
                } else {
                    batch.insert(&key.to_be_bytes(), pages::encode(&kept));
                }
                i += n;
            }
            tree.apply_batch(batch).map_err(self.ix())?;
            p.removed.remove(&source);
        }
        Ok(())
    }

    /// The segment files on disk: id -> size.
    fn segment_files(&self) -> Result<BTreeMap<u64, u64>, SpoolError> {
        let mut files = BTreeMap::new();
        for entry in
            std::fs::read_dir(self.path.join("segments")).map_err(self.io("list segments"))?
        {
            let entry = entry.map_err(self.io("list segments"))?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            else {
                continue;
            };
            let size = entry.metadata().map_err(self.io("stat segment"))?.len();
            files.insert(id, size);
        }
        Ok(files)
    }

    /// Reads the segment list and the index, and makes the index cover the segments: bytes the
    /// ledger does not cover are read back from the segments; an index that does not describe
    /// the segments is rebuilt from them. `counts`: what the last clean shutdown stored; when they
    /// match the segment files and the ledger covers them all, the index is not walked.
    fn load(&self, known: &ledger::Known, counts: Option<Counts>) -> Result<(), SpoolError> {
        let files = self.segment_files()?;
        let plan = ledger::plan(known, &files);
        if let Some(why) = &plan.damage {
            return self.rebuild_index(why);
        }
        let mut segs = self.segs();
        for (id, size) in &files {
            segs.info.insert(*id, (*size, 0));
            self.disk_bytes.fetch_add(*size, Ordering::Relaxed);
        }
        let legacy = known.ledger.is_none();
        let counted = match counts {
            Some(c) if !legacy && plan.uncovered.is_empty() && c.matches(&segs.info) => {
                for (id, live) in &c.segments {
                    if let Some(i) = segs.info.get_mut(id) {
                        i.1 = *live;
                    }
                }
                for (source, records, bytes) in &c.sources {
                    let stats = self.stats(&Arc::from(source.as_str()));
                    stats.records.store(*records, Ordering::Relaxed);
                    stats.bytes.store(*bytes, Ordering::Relaxed);
                }
                true
            }
            _ => false,
        };
        // Count what the index holds; entries pointing at a missing segment are stale. A page
        // that does not decode means the index cannot be trusted: it is rebuilt from the segments.
        let mut bad_page = false;
        for name in self.index.tree_names() {
            if counted || bad_page {
                break;
            }
            let Some(source) = name.strip_prefix(b"i:") else {
                continue;
            };
            let source: Arc<str> = String::from_utf8_lossy(source).into();
            let tree = self.tree(&source)?;
            let stats = self.stats(&source);
            let mut rewrites = Vec::new();
            for item in tree.iter() {
                let (k, v) = item.map_err(self.ix())?;
                let key = key_seq(&k);
                let Some(page) = pages::decode(key, &v) else {
                    bad_page = true;
                    break;
                };
                let live = page.len();
                let mut kept = Vec::with_capacity(live);
                for (seq, loc) in page {
                    if let Some(i) = segs.info.get_mut(&loc.segment) {
                        i.1 += 1;
                        stats.records.fetch_add(1, Ordering::Relaxed);
                        stats.bytes.fetch_add(loc.len as u64, Ordering::Relaxed);
                        kept.push((seq, loc));
                    } else {
                        tracing::error!(source = %source, seq, "spool: record lost (its segment is gone); counted as quarantined");
                        stats.quarantined.fetch_add(1, Ordering::Relaxed);
                        self.quarantined.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if kept.len() != live {
                    rewrites.push((k, kept));
                }
            }
            for (k, kept) in rewrites {
                if kept.is_empty() {
                    tree.remove(k).map_err(self.ix())?;
                } else {
                    tree.insert(k, pages::encode(&kept)).map_err(self.ix())?;
                }
            }
        }
        if bad_page {
            drop(segs);
            return self.rebuild_index("an index page does not decode");
        }
        // A sequence note below the records the index holds is not damage: sled persists its
        // operations in order in the background, so a crash can keep a record's index entry and
        // lose the note written just after it (seen in the vehicle VM after a watchdog kill in
        // `always` mode). Such records were never published; numbering goes on after them
        // (`next_seq` takes the highest of note and records), and no jump is owed for them.
        // Bytes the index has not taken in (the last run crashed before committing them) are read
        // back; so, in a spool from before the ledger, is every segment the index lists nothing in.
        let mut unread = BTreeSet::new();
        let mut scan: Vec<(u64, u64)> = plan.uncovered.iter().map(|(i, f)| (*i, *f)).collect();
        if legacy {
            scan.extend(
                segs.info
                    .iter()
                    .filter(|(_, (size, live))| *live == 0 && *size > 0)
                    .map(|(id, _)| (*id, 0)),
            );
        }
        for (id, from) in scan {
            match self.recover_segment(&mut segs, id, from) {
                Ok(found) => {
                    if found > 0 {
                        tracing::warn!(segment = id, from, records = found,
                            "spool: records the index did not list yet (the last run ended before committing them) read back from the segment");
                    }
                }
                Err(e) => {
                    tracing::error!(segment = id, error = %e, "spool: cannot read a segment the index does not cover; kept as it is, read again at the next start");
                    unread.insert(id);
                }
            }
        }
        // Segments the index proves empty are deleted; a new segment is started for writing.
        let (deleted, covered) = self.delete_proven_empty(&mut segs, &unread);
        drop(segs);
        self.record_ledger(&covered, &plan.stale)?;
        self.sync_after_delete(&deleted);
        for (source, _) in self.all_stats() {
            self.update_oldest(&source)?;
        }
        let q = self.quarantined();
        if q > 0 {
            tracing::warn!(spool = %self.path.display(), quarantined = q, "spool has quarantined records (see the quarantine/ directory)");
        }
        Ok(())
    }

    /// Writes ledger entries (segment -> covered length), removes those of `gone` segments and
    /// marks the spool as keeping a ledger. Reaches disk with the next sled flush.
    /// After a recovery or a rebuild: deletes the segments the index proves empty (never one that
    /// could not be read), and returns them with the (id, size) of every segment the index now
    /// covers, for the ledger.
    fn delete_proven_empty(
        &self,
        segs: &mut Segments,
        unread: &BTreeSet<u64>,
    ) -> (Vec<u64>, Vec<(u64, u64)>) {
        let empty: Vec<u64> = segs
            .info
            .iter()
            .filter(|(id, (_, live))| *live == 0 && !unread.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let deleted = empty
            .into_iter()
            .filter(|id| self.delete_segment(segs, *id))
            .collect();
        let covered = segs
            .info
            .iter()
            .filter(|(id, _)| !unread.contains(id))
            .map(|(id, (size, _))| (*id, *size))
            .collect();
        (deleted, covered)
    }

    fn record_ledger(&self, covered: &[(u64, u64)], gone: &[u64]) -> Result<(), SpoolError> {
        let mut batch = sled::Batch::default();
        for (id, len) in covered {
            batch.insert(ledger::key(*id).as_bytes(), &len.to_le_bytes()[..]);
        }
        for id in gone {
            batch.remove(ledger::key(*id).as_bytes());
        }
        batch.insert(ledger::MARK.as_bytes(), &[1u8][..]);
        self.meta.apply_batch(batch).map_err(self.ix())
    }

    /// The index does not describe the segments: it is rebuilt from every segment, and sequence
    /// numbers jump past everything found (the caller pays the jump; what was published and
    /// removed cannot be known). Records already acknowledged may come back; their sequence ids
    /// make the broker's deduplication drop them.
    fn rebuild_index(&self, why: &str) -> Result<(), SpoolError> {
        tracing::error!(spool = %self.path.display(), reason = why,
            "spool: the index does not cover the segments on disk; rebuilding it from the segments (nothing is deleted that the segments hold)");
        *self.index_damage.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
        for name in self.index.tree_names() {
            if name.starts_with(b"i:") {
                self.index.drop_tree(&name).map_err(self.ix())?;
            }
        }
        let mut stale = sled::Batch::default();
        for item in self.meta.scan_prefix("seg:") {
            let (k, _) = item.map_err(self.ix())?;
            stale.remove(k);
        }
        self.meta.apply_batch(stale).map_err(self.ix())?;
        self.trees.lock().unwrap_or_else(|p| p.into_inner()).clear();
        for (_, stats) in self.all_stats() {
            stats.records.store(0, Ordering::Relaxed);
            stats.bytes.store(0, Ordering::Relaxed);
        }
        let files = self.segment_files()?;
        let mut segs = self.segs();
        segs.info.clear();
        self.disk_bytes.store(0, Ordering::Relaxed);
        let mut unread = BTreeSet::new();
        for (id, size) in &files {
            segs.info.insert(*id, (*size, 0));
            self.disk_bytes.fetch_add(*size, Ordering::Relaxed);
        }
        let mut found = 0;
        for id in files.keys() {
            match self.recover_segment(&mut segs, *id, 0) {
                Ok(n) => found += n,
                Err(e) => {
                    tracing::error!(segment = id, error = %e, "spool: cannot read a segment during the rebuild; kept as it is, read again at the next start");
                    unread.insert(*id);
                }
            }
        }
        let (deleted, covered) = self.delete_proven_empty(&mut segs, &unread);
        drop(segs);
        self.record_ledger(&covered, &[])?;
        if !unread.is_empty() {
            // The index still does not cover them: the next start rebuilds again.
            self.meta.insert("rebuild", &[1u8][..]).map_err(self.ix())?;
        }
        self.sync_after_delete(&deleted);
        for (source, _) in self.all_stats() {
            self.update_oldest(&source)?;
        }
        tracing::warn!(spool = %self.path.display(), records = found, segments = covered.len(),
            quarantined = self.quarantined(), "spool: index rebuilt from the segments");
        Ok(())
    }

    /// Indexes the valid records of segment `id` from byte `from` on that the index does not list
    /// yet, counting them as stored. After a damaged span (a bad header, garbage) the scan goes
    /// on from the next valid record header; damaged spans are quarantined, a torn end is only
    /// logged (the tail of an interrupted write). Returns how many records were added.
    fn recover_segment(&self, segs: &mut Segments, id: u64, from: u64) -> Result<u64, SpoolError> {
        let data = self
            .disk
            .read(&self.segment_path(id))
            .map_err(self.io("read segment"))?;
        let base = (from as usize).min(data.len());
        let data = &data[base..];
        let mut found: BTreeMap<Arc<str>, BTreeMap<u64, Location>> = BTreeMap::new();
        let items = record::scan(data);
        let last = items.len().saturating_sub(1);
        for (i, item) in items.into_iter().enumerate() {
            match item {
                record::Scanned::Record { offset, len } => {
                    match record::decode(Bytes::copy_from_slice(&data[offset..offset + len])) {
                        Ok(f) => {
                            let loc = Location {
                                segment: id,
                                offset: (base + offset) as u64,
                                len: len as u32,
                                capture_ns: f.capture_ns,
                            };
                            found
                                .entry(f.source)
                                .or_default()
                                .entry(f.seq)
                                .or_insert(loc);
                        }
                        Err(e) => self.quarantine_bytes(
                            "rebuild",
                            id,
                            (base + offset) as u64,
                            &data[offset..offset + len],
                            &e.to_string(),
                        ),
                    }
                }
                record::Scanned::Damaged { offset, len } if i == last => {
                    tracing::warn!(
                        segment = id,
                        offset = base + offset,
                        torn_bytes = len,
                        "spool: torn tail of a segment ignored"
                    );
                }
                record::Scanned::Damaged { offset, len } => self.quarantine_bytes(
                    "rebuild",
                    id,
                    (base + offset) as u64,
                    &data[offset..offset + len],
                    &format!("{len} bytes without a valid record header"),
                ),
            }
        }
        let mut added = 0;
        for (source, entries) in found {
            let mut fresh = Vec::with_capacity(entries.len());
            for (seq, loc) in entries {
                if self.lookup(&source, seq)?.is_none() {
                    fresh.push((seq, loc));
                }
            }
            if fresh.is_empty() {
                continue;
            }
            self.store_entries(&source, &self.tree(&source)?, &fresh)?;
            let stats = self.stats(&source);
            let bytes: u64 = fresh.iter().map(|(_, l)| l.len as u64).sum();
            stats
                .records
                .fetch_add(fresh.len() as u64, Ordering::Relaxed);
            stats.bytes.fetch_add(bytes, Ordering::Relaxed);
            if let Some(i) = segs.info.get_mut(&id) {
                i.1 += fresh.len() as u64;
            }
            added += fresh.len() as u64;
        }
        Ok(added)
    }

    fn quarantine_bytes(&self, source: &str, segment: u64, offset: u64, bytes: &[u8], why: &str) {
        let name = format!("{source}-{segment:016x}-{offset}.bad");
        if let Err(e) = self
            .disk
            .write_file(&self.path.join("quarantine").join(&name), bytes)
        {
            tracing::error!(file = %name, error = %e, "spool: cannot write a quarantine file");
        }
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        tracing::error!(source, segment, offset, reason = why, file = %name, "spool: corrupt record quarantined");
    }

    /// Deletes a segment file (not the one being written); true when a file went. The caller
    /// fsyncs the directory after its deletions ([`Spool::sync_segments_dir`]).
    fn delete_segment(&self, segs: &mut Segments, id: u64) -> bool {
        if segs.writer.as_ref().is_some_and(|w| w.id == id) {
            return false;
        }
        if let Some((size, _)) = segs.info.remove(&id) {
            sub(&self.disk_bytes, size);
        }
        segs.readers.remove(&id);
        segs.ledger_due.remove(&id);
        match self.disk.remove(&self.segment_path(id)) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(segment = id, error = %e, "spool: cannot delete a drained segment");
                false
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the last run did not shut down cleanly.
    pub fn unclean_start(&self) -> bool {
        self.unclean_start
    }

    /// Why the index had to be rebuilt from the segments at open, if it had to.
    pub fn index_damage(&self) -> Option<String> {
        self.index_damage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn tree(&self, source: &Arc<str>) -> Result<sled::Tree, SpoolError> {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = trees.get(source) {
            return Ok(t.clone());
        }
        let t = self
            .index
            .open_tree(format!("i:{source}"))
            .map_err(self.ix())?;
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

    /// Bytes the spool's segment files take on disk.
    pub fn total_bytes(&self) -> u64 {
        self.disk_bytes.load(Ordering::Relaxed)
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
            // is durable already, so it is never ahead of the data.
            self.meta
                .insert(format!("seq:{source}"), &stored.to_le_bytes()[..])
                .map_err(self.ix())?;
            self.index.flush().map_err(self.ix())?;
        }
        // A jump owed by a crashed run was paid at open, into the notes.
        Ok(noted
            .unwrap_or(0)
            .max(stored)
            .max(pending_note)
            .max(pending_last))
    }

    /// Records the next sequence number of a source: durable with the commit that makes the
    /// source's earlier appends durable, never before them.
    pub fn note_seq(&self, source: &Arc<str>, next: u64) -> Result<(), SpoolError> {
        let mut p = self.pending();
        let serial = p.serial;
        p.seq_notes.insert(source.clone(), (next, serial));
        Ok(())
    }

    /// The commit epoch an append made now becomes durable in.
    pub fn current_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Watches the last durable epoch: appends made at an epoch below it are on disk.
    pub fn durable_epoch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// One group commit: segment data first (fdatasync), then the index entries of that data go
    /// to sled, then sled is flushed.
    pub fn commit(&self) -> Result<(), SpoolError> {
        let e = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
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
        self.durable.send_replace(e);
        // The removals are durable: segments they emptied can go.
        let mut segs = self.segs();
        for (id, len) in &due {
            if segs.ledger_due.get(id) == Some(len) {
                segs.ledger_due.remove(id);
            }
        }
        let mut deleted = Vec::new();
        for id in std::mem::take(&mut segs.emptied) {
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
                .insert(format!("seq:{source}"), &next.to_le_bytes()[..]);
        }
        if let Err(f) = self.index.flush() {
            tracing::error!(spool = %self.path.display(), error = %f, "spool: cannot flush the index");
        }
        tracing::error!(spool = %self.path.display(), error = %e,
            "spool: fdatasync failed; frames since the last commit may be lost, and this run will not count as a clean shutdown");
    }

    /// Moves to sled the index entries and sequence notes of appends below `watermark`.
    fn apply_pending(&self, p: &mut Pending, watermark: u64) -> Result<(), SpoolError> {
        let sources: Vec<Arc<str>> = p.entries.keys().cloned().collect();
        for source in sources {
            let Some(m) = p.entries.get_mut(&source) else {
                continue;
            };
            let moved: Vec<(u64, Location)> = m
                .iter()
                .filter(|(_, (_, serial))| *serial < watermark)
                .map(|(seq, (loc, _))| (*seq, *loc))
                .collect();
            if moved.is_empty() {
                continue;
            }
            self.store_entries(&source, &self.tree(&source)?, &moved)?;
            for (seq, _) in moved {
                m.remove(&seq);
            }
            if m.is_empty() {
                p.entries.remove(&source);
            }
        }
        let notes: Vec<(Arc<str>, u64)> = p
            .seq_notes
            .iter()
            .filter(|(_, (_, serial))| *serial <= watermark)
            .map(|(s, (next, _))| (s.clone(), *next))
            .collect();
        for (source, next) in notes {
            self.meta
                .insert(format!("seq:{source}"), &next.to_le_bytes()[..])
                .map_err(self.ix())?;
            p.seq_notes.remove(&source);
        }
        Ok(())
    }

    /// Reads free space for the reserve; called periodically, not per frame.
    pub fn refresh_free_space(&self) {
        if let Ok(st) = rustix::fs::statvfs(&self.path) {
            self.free_bytes
                .store(st.f_bavail.saturating_mul(st.f_frsize), Ordering::Relaxed);
        }
    }

    /// `free-reserve`, but never below [`INDEX_HEADROOM`]: the index must always have room to
    /// record drops and removals (a sled that hit ENOSPC fails every later write of the run).
    fn full(&self, incoming: u64) -> bool {
        let reserve = self.free_reserve.max(INDEX_HEADROOM);
        self.total_bytes() + incoming > self.max_bytes
            || self.free_bytes.load(Ordering::Relaxed) < reserve.saturating_add(incoming)
    }

    /// Stores a frame, applying the capacity policy.
    pub fn append(&self, frame: &Frame) -> Result<Appended, SpoolError> {
        if self.already_stored(&frame.source, frame.seq)? {
            // Already stored (a spooled frame the uplink handed back at shutdown).
            return Ok(Appended::Stored);
        }
        let head = record::header(frame);
        let len = (head.len() + frame.payload.len()) as u64;
        let mut dropped = 0;
        while self.full(len) {
            if self.when_full == WhenFull::DropNewest {
                self.stats(&frame.source)
                    .dropped
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(Appended::DroppedNewest);
            }
            match self.drop_oldest_segment(len)? {
                Some(n) => dropped += n,
                None => {
                    self.stats(&frame.source)
                        .dropped
                        .fetch_add(1, Ordering::Relaxed);
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
        self.disk_bytes.fetch_add(len, Ordering::Relaxed);
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

    /// Writes a record into the segment being written (rolling to a new one when full) and keeps
    /// its index entry pending; all or nothing.
    fn write_record(&self, frame: &Frame, head: &[u8], len: u64) -> Result<(), SpoolError> {
        let mut segs = self.segs();
        let roll = segs
            .writer
            .as_ref()
            .is_none_or(|w| w.len > 0 && w.len + len > self.segment_size);
        if roll {
            self.roll(&mut segs)?;
        }
        let Some(w) = segs.writer.as_mut() else {
            return Err(SpoolError::Io {
                path: self.path.clone(),
                op: "open segment",
                source: std::io::ErrorKind::Other.into(),
            });
        };
        let loc = Location {
            segment: w.id,
            offset: w.len,
            len: len as u32,
            capture_ns: frame.capture_ns,
        };
        w.append(self.disk.as_ref(), head, &frame.payload)
            .map_err(self.io("write segment"))?;
        let id = w.id;
        if let Some(i) = segs.info.get_mut(&id) {
            i.0 += len;
            i.1 += 1;
        }
        // Under the segment lock, so a commit's watermark covers exactly the written appends.
        let mut p = self.pending();
        let serial = p.serial;
        p.serial += 1;
        p.highest
            .entry(frame.source.clone())
            .and_modify(|h| *h = (*h).max(frame.seq))
            .or_insert(frame.seq);
        p.entries
            .entry(frame.source.clone())
            .or_default()
            .insert(frame.seq, (loc, serial));
        Ok(())
    }

    fn roll(&self, segs: &mut Segments) -> Result<(), SpoolError> {
        if let Some(w) = segs.writer.as_mut() {
            // Sealed only once whole and synced: until then it stays the segment being written.
            w.flush(self.disk.as_ref())
                .map_err(self.io("write segment"))?;
            if let Err(e) = self.disk.sync_data(&w.file) {
                self.note_sync_failure(&e);
                return Err(self.io("fdatasync segment")(e));
            }
        }
        if let Some(w) = segs.writer.take() {
            if segs.info.get(&w.id).is_some_and(|i| i.1 == 0) {
                segs.emptied.push(w.id);
            }
            segs.ledger_due.insert(w.id, w.len);
        }
        let id = segs.info.keys().next_back().map(|k| k + 1).unwrap_or(1);
        let file = self
            .disk
            .create(&self.segment_path(id))
            .map_err(self.io("create segment"))?;
        // The new name is made durable before any index entry can point into the file; a file
        // whose name may not survive is not used (the next append tries again).
        if let Err(e) = self.sync_segments_dir() {
            drop(file);
            let _ = self.disk.remove(&self.segment_path(id));
            return Err(e);
        }
        segs.info.insert(id, (0, 0));
        segs.ledger_due.insert(id, 0);
        segs.writer = Some(Writer {
            id,
            file: Arc::new(file),
            buf: Vec::with_capacity(WRITE_BUFFER),
            len: 0,
            flushed: 0,
        });
        Ok(())
    }

    /// A removed record's bookkeeping: counters, and the segment's deletion when it is empty.
    fn release(&self, stats: &SourceSpoolStats, loc: Location) {
        sub(&stats.records, 1);
        sub(&stats.bytes, loc.len as u64);
        stats.popped.fetch_add(1, Ordering::Relaxed);
        self.release_segment(loc);
    }

    /// One record of a segment is gone; the segment is deleted after the next commit when none
    /// is left.
    fn release_segment(&self, loc: Location) {
        let mut segs = self.segs();
        let empty = match segs.info.get_mut(&loc.segment) {
            Some(i) => {
                i.1 = i.1.saturating_sub(1);
                i.1 == 0
            }
            None => false,
        };
        let active = segs.writer.as_ref().is_some_and(|w| w.id == loc.segment);
        if empty && !active {
            segs.emptied.push(loc.segment);
        }
    }

    /// Drops every record of the oldest sealed segment (drop-oldest); returns how many, or None
    /// when only the segment being written is left. The records are found in the index, not by
    /// reading the segment: a segment that cannot be opened (EMFILE, EIO) is dropped all the same,
    /// and every record the index lists in it is counted as dropped, once. Drops are one at a
    /// time: a lane that waited for another's drop finds the space it made (`incoming`).
    fn drop_oldest_segment(&self, incoming: u64) -> Result<Option<u64>, SpoolError> {
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
                let stats = self.stats(&source);
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                sub(&stats.records, 1);
                sub(&stats.bytes, loc.len as u64);
                stats.popped.fetch_add(1, Ordering::Relaxed);
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
    fn drop_unwritten(&self) -> u64 {
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
        for (source, _, loc) in &lost {
            let stats = self.stats(source);
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            sub(&stats.records, 1);
            sub(&stats.bytes, loc.len as u64);
            stats.popped.fetch_add(1, Ordering::Relaxed);
        }
        lost.len() as u64
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
                        let stats = self.stats(source);
                        stats.quarantined.fetch_add(1, Ordering::Relaxed);
                        sub(&stats.records, 1);
                        sub(&stats.bytes, loc.len as u64);
                        self.release_segment(loc);
                    }
                }
            }
            if out.len() >= max || bytes >= 32 << 20 {
                break;
            }
        }
        Ok(out)
    }

    /// Up to `max` committed entries of a source with `seq >= from`, in order, leaving out those
    /// removed since the last commit (`p`: the pending state the caller holds locked). A page
    /// that does not decode is set aside (see [`Spool::bad_page`]).
    fn committed_from(
        &self,
        p: &Pending,
        source: &Arc<str>,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, Location)>, SpoolError> {
        let removed = p.removed.get(source);
        let gone = |seq: u64| removed.is_some_and(|r| r.contains(&seq));
        let tree = self.tree(source)?;
        let mut out = Vec::new();
        let first = page_at(&tree, from).map_err(self.ix())?;
        let rest = tree.range((from.saturating_add(1)).to_be_bytes()..);
        let mut pages = first
            .into_iter()
            .map(Ok)
            .chain(rest.map(|r| r.map(|(k, v)| (key_seq(&k), v))));
        while out.len() < max {
            let Some(item) = pages.next() else { break };
            let (key, v) = item.map_err(self.ix())?;
            match pages::decode(key, &v) {
                Some(page) => {
                    for (seq, loc) in page {
                        if seq >= from && !gone(seq) && out.len() < max {
                            out.push((seq, loc));
                        }
                    }
                }
                None => self.bad_page(source, &tree, key)?,
            }
        }
        Ok(out)
    }

    /// An index page that does not decode (sled checksums its log, so only a bug or a bad disk
    /// gets here): it is dropped so that reading goes on past it, counted as quarantined, and the
    /// next start rebuilds the index from the segments, where its records still are.
    fn bad_page(&self, source: &Arc<str>, tree: &sled::Tree, key: u64) -> Result<(), SpoolError> {
        tracing::error!(source = %source, page = key, "spool: index page unreadable; dropped, the next start rebuilds the index from the segments");
        tree.remove(key.to_be_bytes()).map_err(self.ix())?;
        self.meta.insert("rebuild", &[1u8][..]).map_err(self.ix())?;
        self.stats(source)
            .quarantined
            .fetch_add(1, Ordering::Relaxed);
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Refreshes a source's oldest capture time from the index.
    fn update_oldest(&self, source: &Arc<str>) -> Result<(), SpoolError> {
        let (pending_first, committed_first) = {
            let p = self.pending();
            let pending_first = p
                .entries
                .get(source)
                .and_then(|m| m.first_key_value().map(|(s, (l, _))| (*s, *l)));
            let committed_first = self.committed_from(&p, source, 0, 1)?.first().copied();
            (pending_first, committed_first)
        };
        let oldest = match (pending_first, committed_first) {
            (Some(a), Some(b)) => Some(if a.0 < b.0 { a.1 } else { b.1 }),
            (a, b) => a.or(b).map(|x| x.1),
        }
        .map(|l| l.capture_ns.max(1) as u64);
        self.stats(source)
            .oldest_ns
            .store(oldest.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    fn read_at(&self, loc: Location) -> std::io::Result<Vec<u8>> {
        let file = {
            let mut segs = self.segs();
            if let Some(w) = segs.writer.as_ref().filter(|w| w.id == loc.segment) {
                return w.read(self.disk.as_ref(), loc.offset, loc.len as usize);
            }
            match segs.readers.get(&loc.segment) {
                Some(f) => f.clone(),
                None => {
                    let f = Arc::new(self.disk.open(&self.segment_path(loc.segment))?);
                    segs.readers.insert(loc.segment, f.clone());
                    f
                }
            }
        };
        let mut buf = vec![0u8; loc.len as usize];
        self.disk.read_exact_at(&file, &mut buf, loc.offset)?;
        Ok(buf)
    }

    /// Removes a record after its receipt. Missing records (dropped meanwhile) are fine.
    /// The source's oldest capture time follows at the next commit.
    pub fn remove(&self, source: &Arc<str>, seq: u64) -> Result<(), SpoolError> {
        if let Some(loc) = self.unindex(source, seq)? {
            let stats = self.stats(source);
            self.release(&stats, loc);
            if stats.records.load(Ordering::Relaxed) == 0 {
                stats.oldest_ns.store(0, Ordering::Relaxed);
            }
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
            gone.extend(uncommitted.into_values().map(|(loc, _)| loc));
            // Removed but still listed: already released.
            let removed = p.removed.remove(source).unwrap_or_default();
            while let Some((k, v)) = tree.pop_min().map_err(self.ix())? {
                let page = pages::decode(key_seq(&k), &v).unwrap_or_default();
                gone.extend(
                    page.into_iter()
                        .filter(|(seq, _)| !removed.contains(seq))
                        .map(|(_, loc)| loc),
                );
            }
        }
        let stats = self.stats(source);
        for loc in &gone {
            self.release(&stats, *loc);
            stats.dropped.fetch_add(1, Ordering::Relaxed);
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

/// Live records per segment and records/bytes per source, stored by a clean shutdown so that the
/// next start need not walk every index entry (startup with a 10 GiB spool: docs/PERFORMANCE.md).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Counts {
    segments: Vec<(u64, u64)>,
    sources: Vec<(String, u64, u64)>,
}

impl Counts {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((self.segments.len() as u64).to_le_bytes());
        for (id, live) in &self.segments {
            b.extend(id.to_le_bytes());
            b.extend(live.to_le_bytes());
        }
        b.extend((self.sources.len() as u64).to_le_bytes());
        for (name, records, bytes) in &self.sources {
            b.extend((name.len() as u64).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(records.to_le_bytes());
            b.extend(bytes.to_le_bytes());
        }
        b
    }

    fn decode(mut b: &[u8]) -> Option<Self> {
        fn u64_of(b: &mut &[u8]) -> Option<u64> {
            let (h, t) = b.split_at_checked(8)?;
            *b = t;
            Some(u64::from_le_bytes(h.try_into().ok()?))
        }
        let n = u64_of(&mut b)?;
        let mut segments = Vec::new();
        for _ in 0..n.min(1 << 20) {
            segments.push((u64_of(&mut b)?, u64_of(&mut b)?));
        }
        let n = u64_of(&mut b)?;
        let mut sources = Vec::new();
        for _ in 0..n.min(1 << 16) {
            let len = u64_of(&mut b)? as usize;
            let (name, t) = b.split_at_checked(len)?;
            b = t;
            let name = String::from_utf8(name.to_vec()).ok()?;
            sources.push((name, u64_of(&mut b)?, u64_of(&mut b)?));
        }
        b.is_empty().then_some(Counts { segments, sources })
    }

    /// True when they describe exactly the segment files found.
    fn matches(&self, info: &BTreeMap<u64, (u64, u64)>) -> bool {
        self.segments.len() == info.len()
            && self.segments.iter().all(|(id, _)| info.contains_key(id))
    }
}

/// Opens the sled index. sled's own file lock can outlive a closed handle for a moment (its
/// threads finish asynchronously), so a busy lock is waited for rather than mistaken for damage:
/// treating it as damage would rebuild the index from segments and resurrect removed records.
fn open_index(path: &Path) -> Result<sled::Db, IndexOpen> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let p = path.to_path_buf();
        // sled panics on some damaged files instead of returning an error: a panic is damage.
        let opened = std::panic::catch_unwind(move || {
            sled::Config::new()
                .path(p)
                .cache_capacity(16 << 20)
                .flush_every_ms(None)
                .open()
        });
        match opened {
            Ok(Ok(db)) => return Ok(db),
            Ok(Err(e)) if e.to_string().contains("could not acquire lock") => {
                if std::time::Instant::now() > deadline {
                    return Err(IndexOpen::Busy(e));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Ok(Err(sled::Error::Io(e))) if no_room(&e) => {
                return Err(IndexOpen::NoRoom(sled::Error::Io(e)))
            }
            Ok(Err(e)) => return Err(IndexOpen::Damaged(e)),
            Err(_) => {
                return Err(IndexOpen::Damaged(sled::Error::Unsupported(
                    "sled panicked while opening the index".into(),
                )))
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum IndexOpen {
    #[error("index busy: {0}")]
    Busy(sled::Error),
    #[error("index damaged: {0}")]
    Damaged(sled::Error),
    /// No space, quota, descriptors or memory to open it: nothing is wrong with the index.
    #[error("index cannot be opened now: {0}")]
    NoRoom(sled::Error),
}

/// The segment ledger as `meta` holds it; `None` in a spool from before the ledger.
fn read_ledger(meta: &sled::Tree) -> sled::Result<Option<BTreeMap<u64, u64>>> {
    if meta.get(ledger::MARK)?.is_none() {
        return Ok(None);
    }
    let mut out = BTreeMap::new();
    for item in meta.scan_prefix("seg:") {
        let (k, v) = item?;
        if let (Some(id), Some(len)) = (ledger::id_of(&k), ledger::decode_len(&v)) {
            out.insert(id, len);
        }
    }
    Ok(Some(out))
}

/// The page that may hold `seq`: the one with the greatest key not above it.
fn page_at(tree: &sled::Tree, seq: u64) -> sled::Result<Option<(u64, sled::IVec)>> {
    match tree.range(..=seq.to_be_bytes()).next_back() {
        Some(item) => {
            let (k, v) = item?;
            Ok(Some((key_seq(&k), v)))
        }
        None => Ok(None),
    }
}

fn key_seq(k: &[u8]) -> u64 {
    k.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

#[cfg(test)]
mod tests;
