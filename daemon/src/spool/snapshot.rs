//! A read-only view of a spool directory for the offline tools (`rigd spool`, `rigd replay`).
//!
//! Invariants:
//! - Nothing under the spool directory is written, created or removed: the sled index is opened
//!   on a private copy (sled writes while it opens), and corrupt records are reported, not
//!   quarantined.
//! - A spool held by a live process is refused ([`SpoolError::Locked`]); while the view is open it
//!   holds a shared lock, so a daemon cannot start on the spool underneath it.
//! - A segment this user may not read is a permission problem ([`SpoolError::Unreadable`]), found
//!   when the view opens: it is never reported as a corrupt record.
//! - The records listed are the index's live ones, per source in `seq` order (capture order).
//!   Only when the index cannot be opened, or when asked, are the segments scanned instead; a
//!   scan also finds records the daemon had already published and removed from the index.

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::payload::Held;

use super::index::key_seq;
use super::record::{self, scan as scan_segment, Scanned};
use super::{ledger, pages, SpoolError};

/// One live record as the index (or a scan) lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub capture_ns: i64,
    /// Bytes on disk (the whole record, header included).
    pub len: u32,
    pub segment: u64,
    pub offset: u64,
    /// A frame that decodes only after the earlier ones of its group (an H.264 P-frame).
    pub delta: bool,
}

/// How the record list was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// From the sled index: exactly the records the daemon still holds.
    Index,
    /// From reading every segment (the index could not be opened, or a scan was asked for).
    SegmentScan { reason: String },
}

/// A record that cannot be read back, with where it sits and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Corrupt {
    /// Source and seq as the index names them (`None` for bytes a scan could not attribute).
    pub source: Option<String>,
    pub seq: Option<u64>,
    pub segment: u64,
    pub offset: u64,
    pub reason: String,
}

/// Why a record was not read back.
#[derive(Debug)]
pub enum ReadError {
    /// Its bytes are damaged, cut short or gone.
    Corrupt(Corrupt),
    /// This user may not open its segment (the file's mode or owner changed after the view
    /// opened, when every segment was checked): a permission problem, not damage
    /// ([`SpoolError::Unreadable`]).
    Unreadable(SpoolError),
}

pub struct SpoolSnapshot {
    path: PathBuf,
    _lock: Option<File>,
    sources: BTreeMap<Arc<str>, Vec<Entry>>,
    listing: Listing,
    quarantined: u64,
    /// Damage found while listing (index entries without a segment, unparsable segment bytes).
    listing_corrupt: Vec<Corrupt>,
    /// Why the index could not be used as it is (the daemon rebuilds it at its next start).
    index_damage: Option<String>,
    /// Records the index does not list yet (the last run ended before committing them), read
    /// from the segments as the daemon's next start will.
    read_back: u64,
    /// The rig the spool belongs to, as the daemon recorded it (`RIG`).
    identity: Result<Option<super::identity::RigIdentity>, String>,
    files: Mutex<HashMap<u64, Arc<File>>>,
}

impl std::fmt::Debug for SpoolSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpoolSnapshot")
            .field("path", &self.path)
            .field("listing", &self.listing)
            .finish_non_exhaustive()
    }
}

impl SpoolSnapshot {
    /// Opens `dir` read-only. `scan` lists records by reading the segments instead of the index.
    pub fn open(dir: &Path, scan: bool) -> Result<Self, SpoolError> {
        let path = dir.to_path_buf();
        if !path.join("segments").is_dir() {
            return Err(SpoolError::NotSpool { path });
        }
        let lock = match File::open(path.join("LOCK")) {
            Ok(f) => {
                if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared).is_err()
                {
                    return Err(SpoolError::Locked { path });
                }
                Some(f)
            }
            // A copy made without LOCK, or a spool never opened: nobody can hold it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) if super::denied(&source) => {
                return Err(SpoolError::Unreadable {
                    path: path.join("LOCK"),
                    source,
                })
            }
            Err(source) => {
                return Err(SpoolError::Io {
                    path,
                    op: "open LOCK",
                    source,
                })
            }
        };
        let quarantined = std::fs::read_dir(path.join("quarantine"))
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        let identity = super::identity::read(&path);
        let mut snap = SpoolSnapshot {
            path,
            _lock: lock,
            sources: BTreeMap::new(),
            listing: Listing::Index,
            quarantined,
            listing_corrupt: Vec::new(),
            index_damage: None,
            read_back: 0,
            identity,
            files: Mutex::new(HashMap::new()),
        };
        let sizes = snap.segment_sizes()?;
        let segments: Vec<u64> = sizes.keys().copied().collect();
        // A segment this user may not read would read as damage record by record ("cannot open
        // segment: Permission denied", counted corrupt): say what it is, once, before listing.
        for &id in &segments {
            let file = snap.segment_path(id);
            if let Err(source) = File::open(&file) {
                if super::denied(&source) {
                    return Err(SpoolError::Unreadable { path: file, source });
                }
            }
        }
        let from_index = if scan {
            Err(Unlisted::Damaged("asked for (--scan)".to_string()))
        } else {
            snap.list_from_index(&sizes)
        };
        if let Err(unlisted) = from_index {
            let reason = match unlisted {
                // Not damage: the index is not this user's to read (a copy from another
                // machine or user); the segments answer instead.
                Unlisted::Unreadable(why) => format!("the index cannot be read ({why})"),
                Unlisted::Damaged(why) => {
                    if !scan {
                        snap.index_damage = Some(why.clone());
                    }
                    why
                }
            };
            snap.read_back = 0;
            snap.sources.clear();
            snap.listing_corrupt.clear();
            snap.list_from_segments(&segments)?;
            snap.listing = Listing::SegmentScan { reason };
        }
        Ok(snap)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn listing(&self) -> &Listing {
        &self.listing
    }

    /// Files in `quarantine/`: records the daemon already set aside.
    pub fn quarantined(&self) -> u64 {
        self.quarantined
    }

    /// Damage found while listing the records (not by reading them).
    pub fn listing_corrupt(&self) -> &[Corrupt] {
        &self.listing_corrupt
    }

    /// The rig the spool belongs to (`Ok(None)`: a spool from before it was recorded; `Err`:
    /// the file does not parse).
    pub fn identity(&self) -> Result<Option<&super::identity::RigIdentity>, &str> {
        match &self.identity {
            Ok(id) => Ok(id.as_ref()),
            Err(e) => Err(e),
        }
    }

    /// Why the index could not be used (missing, unreadable, or not covering the segments): the
    /// records were listed from the segments instead, as the daemon's next start rebuilds them.
    pub fn index_damage(&self) -> Option<&str> {
        self.index_damage.as_deref()
    }

    /// Records the index did not list yet (a crash before their commit) that were read from the
    /// segments, as the daemon's next start reads them back.
    pub fn read_back(&self) -> u64 {
        self.read_back
    }

    /// Every source with its live records in `seq` order.
    pub fn sources(&self) -> impl Iterator<Item = (&Arc<str>, &[Entry])> {
        self.sources.iter().map(|(s, e)| (s, e.as_slice()))
    }

    /// The live records of one source in `seq` order (empty for an unknown source).
    pub fn entries(&self, source: &str) -> &[Entry] {
        self.sources.get(source).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Reads and checks one record: checksum, and that it is the record the listing names.
    pub fn read(&self, source: &str, entry: &Entry) -> Result<Held, ReadError> {
        let corrupt = |reason: String| ReadError::Corrupt(corrupt(source, entry, reason));
        let file = self
            .segment_file(entry.segment)
            .map_err(|e| self.unopened(source, entry, e))?;
        let mut buf = vec![0u8; entry.len as usize];
        file.read_exact_at(&mut buf, entry.offset).map_err(|e| {
            corrupt(format!(
                "cannot read {} bytes at {}: {e}",
                entry.len, entry.offset
            ))
        })?;
        match record::decode(Bytes::from(buf)) {
            Err(e) => Err(corrupt(e.to_string())),
            Ok(f) if f.seq != entry.seq || &*f.source != source => Err(corrupt(format!(
                "record is {}/{} where the listing expects {source}/{}",
                f.source, f.seq, entry.seq
            ))),
            Ok(f) => Ok(f),
        }
    }

    /// A segment that did not open: a permission problem, or damage (it is gone).
    fn unopened(&self, source: &str, entry: &Entry, e: std::io::Error) -> ReadError {
        if super::denied(&e) {
            ReadError::Unreadable(SpoolError::Unreadable {
                path: self.segment_path(entry.segment),
                source: e,
            })
        } else {
            ReadError::Corrupt(corrupt(source, entry, format!("cannot open segment: {e}")))
        }
    }

    fn segment_path(&self, id: u64) -> PathBuf {
        self.path.join("segments").join(format!("{id:016x}.seg"))
    }

    fn segment_file(&self, id: u64) -> std::io::Result<Arc<File>> {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = files.get(&id) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(self.segment_path(id))?);
        files.insert(id, f.clone());
        Ok(f)
    }

    fn segment_sizes(&self) -> Result<BTreeMap<u64, u64>, SpoolError> {
        let io = |source: std::io::Error| {
            if super::denied(&source) {
                SpoolError::Unreadable {
                    path: self.path.join("segments"),
                    source,
                }
            } else {
                SpoolError::Io {
                    path: self.path.clone(),
                    op: "list segments",
                    source,
                }
            }
        };
        let mut ids = BTreeMap::new();
        for entry in std::fs::read_dir(self.path.join("segments")).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            if let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                ids.insert(id, entry.metadata().map_err(io)?.len());
            }
        }
        Ok(ids)
    }

    /// Lists from a private copy of the sled index; `Err` when it cannot be used.
    fn list_from_index(&mut self, sizes: &BTreeMap<u64, u64>) -> Result<(), Unlisted> {
        let index = self.path.join("index");
        if !index.is_dir() {
            return Err(Unlisted::Damaged(
                "the spool has no index/ directory".into(),
            ));
        }
        let copy = tempfile::Builder::new()
            .prefix("rigd-spool-index-")
            .tempdir()
            .map_err(|e| {
                Unlisted::Unreadable(format!("cannot create a temporary directory: {e}"))
            })?;
        copy_dir(&index, copy.path()).map_err(|e| {
            let why = format!("cannot copy the index to {}: {e}", copy.path().display());
            if e.kind() == std::io::ErrorKind::PermissionDenied || super::disk::no_room(&e) {
                Unlisted::Unreadable(why)
            } else {
                Unlisted::Damaged(why)
            }
        })?;
        self.list_from_copy(copy.path(), sizes)
            .map_err(Unlisted::Damaged)
    }

    fn list_from_copy(&mut self, copy: &Path, sizes: &BTreeMap<u64, u64>) -> Result<(), String> {
        let segments: Vec<u64> = sizes.keys().copied().collect();
        let db = open_copy(copy)?;
        let meta = db
            .open_tree("meta")
            .map_err(|e| format!("index meta: {e}"))?;
        let known = ledger::Known {
            blank: meta.is_empty(),
            ledger: super::index::read_ledger(&meta).map_err(|e| format!("index meta: {e}"))?,
        };
        let plan = ledger::plan(&known, sizes);
        if let Some(damage) = plan.damage {
            return Err(damage);
        }
        for name in db.tree_names() {
            let Some(source) = name.strip_prefix(b"i:") else {
                continue;
            };
            let source: Arc<str> = String::from_utf8_lossy(source).into();
            let tree = db
                .open_tree(&name)
                .map_err(|e| format!("index tree {source}: {e}"))?;
            let mut entries = Vec::new();
            for item in tree.iter() {
                let (k, v) = item.map_err(|e| format!("index tree {source}: {e}"))?;
                let key = key_seq(&k);
                let Some(page) = pages::decode(key, &v) else {
                    self.listing_corrupt.push(Corrupt {
                        source: Some(source.to_string()),
                        seq: Some(key),
                        segment: 0,
                        offset: 0,
                        reason: format!("bad index page ({} records)", pages::count(&v)),
                    });
                    continue;
                };
                for (seq, loc) in page {
                    if segments.binary_search(&loc.segment).is_ok() {
                        entries.push(Entry {
                            seq,
                            capture_ns: loc.capture_ns,
                            len: loc.len,
                            segment: loc.segment,
                            offset: loc.offset,
                            delta: loc.delta,
                        });
                    } else {
                        self.listing_corrupt.push(Corrupt {
                            source: Some(source.to_string()),
                            seq: Some(seq),
                            segment: loc.segment,
                            offset: loc.offset,
                            reason: "its segment file is gone".into(),
                        });
                    }
                }
            }
            if !entries.is_empty() {
                self.sources.insert(source, entries);
            }
        }
        // (A sequence note below the stored records is a crash state, not damage: see recovery::load.)
        drop(db);
        // What the daemon's next start reads back: bytes the ledger does not cover, and in a spool
        // from before the ledger the segments the index lists nothing in.
        let mut scan: Vec<(u64, u64)> = plan.uncovered.into_iter().collect();
        if known.ledger.is_none() {
            let listed: std::collections::BTreeSet<u64> = self
                .sources
                .values()
                .flat_map(|v| v.iter().map(|e| e.segment))
                .collect();
            scan.extend(
                sizes
                    .iter()
                    .filter(|(id, size)| **size > 0 && !listed.contains(id))
                    .map(|(id, _)| (*id, 0)),
            );
        }
        for (id, from) in scan {
            let found = self
                .scan_file(id, from)
                .map_err(|e| format!("cannot read segment {id:016x}: {e}"))?;
            for (source, entry) in found {
                let list = self.sources.entry(source).or_default();
                if !list.iter().any(|e| e.seq == entry.seq) {
                    list.push(entry);
                    self.read_back += 1;
                }
            }
        }
        for list in self.sources.values_mut() {
            list.sort_by_key(|e| e.seq);
        }
        Ok(())
    }

    /// The valid records of one segment from byte `from` on (damage is reported, not fatal).
    fn scan_file(&mut self, id: u64, from: u64) -> std::io::Result<Vec<(Arc<str>, Entry)>> {
        let data = std::fs::read(self.segment_path(id))?;
        let base = (from as usize).min(data.len());
        let mut out = Vec::new();
        for item in scan_segment(&data[base..]) {
            match item {
                Scanned::Record { offset, len } => {
                    let at = base + offset;
                    match record::decode(Bytes::copy_from_slice(&data[at..at + len])) {
                        Ok(f) => out.push((
                            f.source.clone(),
                            Entry {
                                seq: f.seq,
                                capture_ns: f.capture_ns,
                                len: len as u32,
                                segment: id,
                                offset: at as u64,
                                delta: !f.media.is_keyframe(),
                            },
                        )),
                        Err(e) => self.listing_corrupt.push(Corrupt {
                            source: None,
                            seq: None,
                            segment: id,
                            offset: at as u64,
                            reason: e.to_string(),
                        }),
                    }
                }
                Scanned::Damaged { offset, len } => self.listing_corrupt.push(Corrupt {
                    source: None,
                    seq: None,
                    segment: id,
                    offset: (base + offset) as u64,
                    reason: format!("{len} bytes without a valid record header"),
                }),
            }
        }
        Ok(out)
    }

    /// Lists every checksummed record of every segment; a later copy of a (source, seq) wins, as
    /// in the daemon's index rebuild. Damaged bytes are skipped up to the next record header.
    fn list_from_segments(&mut self, segments: &[u64]) -> Result<(), SpoolError> {
        let mut found: BTreeMap<Arc<str>, BTreeMap<u64, Entry>> = BTreeMap::new();
        for &id in segments {
            let file = self.segment_path(id);
            let data = std::fs::read(&file).map_err(|source| {
                if super::denied(&source) {
                    SpoolError::Unreadable { path: file, source }
                } else {
                    SpoolError::Io {
                        path: self.path.clone(),
                        op: "read segment",
                        source,
                    }
                }
            })?;
            for item in scan_segment(&data) {
                match item {
                    Scanned::Record { offset, len } => {
                        let bytes = Bytes::copy_from_slice(&data[offset..offset + len]);
                        match record::decode(bytes) {
                            Ok(f) => {
                                found.entry(f.source.clone()).or_default().insert(
                                    f.seq,
                                    Entry {
                                        seq: f.seq,
                                        capture_ns: f.capture_ns,
                                        len: len as u32,
                                        segment: id,
                                        offset: offset as u64,
                                        delta: !f.media.is_keyframe(),
                                    },
                                );
                            }
                            Err(e) => self.listing_corrupt.push(Corrupt {
                                source: None,
                                seq: None,
                                segment: id,
                                offset: offset as u64,
                                reason: e.to_string(),
                            }),
                        }
                    }
                    Scanned::Damaged { offset, len } => self.listing_corrupt.push(Corrupt {
                        source: None,
                        seq: None,
                        segment: id,
                        offset: offset as u64,
                        reason: format!("{len} bytes without a valid record header"),
                    }),
                }
            }
        }
        self.sources = found
            .into_iter()
            .map(|(s, m)| (s, m.into_values().collect()))
            .collect();
        Ok(())
    }
}

fn corrupt(source: &str, entry: &Entry, reason: String) -> Corrupt {
    Corrupt {
        source: Some(source.to_string()),
        seq: Some(entry.seq),
        segment: entry.segment,
        offset: entry.offset,
        reason,
    }
}

/// Opens the private copy of the index. sled panics on some damaged files instead of returning
/// an error: a panic is damage too.
fn open_copy(path: &Path) -> Result<sled::Db, String> {
    let p = path.to_path_buf();
    match std::panic::catch_unwind(move || sled::Config::new().path(p).open()) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(format!("index unreadable: {e}")),
        Err(_) => Err("index unreadable: sled panicked while opening it".into()),
    }
}

/// Why the index could not list the spool.
enum Unlisted {
    /// It does not describe the segments, or does not open: damage, reported as such.
    Damaged(String),
    /// It could not be read or copied (permissions, no room for the private copy).
    Unreadable(String),
}

/// Copies the index to a private directory sled may write in: the copy is the user's own,
/// whatever the modes of the original (a read-only copy of a spool keeps 0444 files, which sled
/// cannot open).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SpoolConfig;
    use crate::spool::Spool;
    use rigd_drivers::{ClockState, Frame, Media};

    fn frame(source: &str, seq: u64, payload: &[u8]) -> Held {
        Held::plain(Frame {
            source: source.into(),
            seq,
            capture_ns: 1_000_000 * seq as i64 + 7,
            clock: ClockState::Unsynced,
            media: Media::Serial { text: true },
            payload: Bytes::copy_from_slice(payload),
        })
    }

    fn spool_with(dir: &Path, frames: &[Held]) {
        let cfg = SpoolConfig {
            path: dir.to_path_buf(),
            ..SpoolConfig::default()
        };
        let spool = Spool::open(&cfg).unwrap();
        for f in frames {
            spool.append(f).unwrap();
        }
        spool.close().unwrap();
    }

    fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn lists_and_reads_the_live_records_without_writing_anything() {
        let dir = tempfile::tempdir().unwrap();
        let frames: Vec<Held> = (0..20)
            .map(|i| frame(if i % 2 == 0 { "a" } else { "b" }, i, b"$GPRMC,x*00"))
            .collect();
        spool_with(dir.path(), &frames);
        {
            let spool = Spool::open(&SpoolConfig {
                path: dir.path().to_path_buf(),
                ..SpoolConfig::default()
            })
            .unwrap();
            spool.remove(&"a".into(), 0).unwrap();
            spool.close().unwrap();
        }
        let before = tree(dir.path());
        let snap = SpoolSnapshot::open(dir.path(), false).unwrap();
        assert_eq!(snap.listing(), &Listing::Index);
        let a: Vec<u64> = snap.entries("a").iter().map(|e| e.seq).collect();
        assert_eq!(a, vec![2, 4, 6, 8, 10, 12, 14, 16, 18]);
        assert_eq!(snap.entries("b").len(), 10);
        for (source, entries) in snap.sources() {
            for e in entries {
                let f = snap.read(source, e).unwrap();
                assert_eq!(f.capture_ns, e.capture_ns);
            }
        }
        drop(snap);
        assert_eq!(tree(dir.path()), before, "the spool directory changed");
    }

    #[test]
    fn a_scan_finds_removed_records_too_and_reports_damage() {
        let dir = tempfile::tempdir().unwrap();
        let frames: Vec<Held> = (0..5).map(|i| frame("a", i, b"0123456789")).collect();
        spool_with(dir.path(), &frames);
        let snap = SpoolSnapshot::open(dir.path(), true).unwrap();
        assert!(matches!(snap.listing(), Listing::SegmentScan { .. }));
        assert_eq!(snap.entries("a").len(), 5);
        let seg = snap.entries("a")[2];
        drop(snap);
        // Damage the third record's header: the scan skips to the fourth.
        let path = dir
            .path()
            .join("segments")
            .join(format!("{:016x}.seg", seg.segment));
        let mut data = std::fs::read(&path).unwrap();
        data[seg.offset as usize] ^= 0xff;
        std::fs::write(&path, &data).unwrap();
        let snap = SpoolSnapshot::open(dir.path(), true).unwrap();
        let seqs: Vec<u64> = snap.entries("a").iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![0, 1, 3, 4]);
        assert_eq!(snap.listing_corrupt().len(), 1);
        // The index still lists it; reading it reports the damage.
        let snap = SpoolSnapshot::open(dir.path(), false).unwrap();
        let e = snap.entries("a")[2];
        let Err(ReadError::Corrupt(err)) = snap.read("a", &e) else {
            panic!("a damaged record reads as corrupt");
        };
        assert_eq!(err.seq, Some(2));
        assert!(err.reason.contains("magic"), "{}", err.reason);
    }

    #[test]
    fn a_segment_made_unreadable_after_open_is_a_permission_problem_not_damage() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        spool_with(dir.path(), &[frame("a", 0, b"x"), frame("a", 1, b"y")]);
        let snap = SpoolSnapshot::open(dir.path(), false).unwrap();
        let e = snap.entries("a")[0];
        let path = snap.segment_path(e.segment);
        // As the read sees it (root reads a 0000 file anyway, so the error is also made here).
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let Err(ReadError::Unreadable(SpoolError::Unreadable { path: p, .. })) =
            Err::<(), _>(snap.unopened("a", &e, denied))
        else {
            panic!("EACCES is a permission problem");
        };
        assert_eq!(p, path);
        let gone = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(matches!(
            snap.unopened("a", &e, gone),
            ReadError::Corrupt(Corrupt { seq: Some(0), .. })
        ));
        // A mode changed after the view opened, for a user the mode binds.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
        if std::fs::File::open(&path).is_err() {
            assert!(matches!(
                snap.read("a", &e),
                Err(ReadError::Unreadable(SpoolError::Unreadable { .. }))
            ));
        }
    }

    #[test]
    fn refuses_a_spool_held_by_a_live_process() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&SpoolConfig {
            path: dir.path().to_path_buf(),
            ..SpoolConfig::default()
        })
        .unwrap();
        let err = SpoolSnapshot::open(dir.path(), false).unwrap_err();
        assert!(matches!(err, SpoolError::Locked { .. }));
        assert!(err.to_string().contains("copy"), "{err}");
        drop(spool);
        SpoolSnapshot::open(dir.path(), false).unwrap();
        let err = SpoolSnapshot::open(&dir.path().join("nope"), false).unwrap_err();
        assert!(matches!(err, SpoolError::NotSpool { .. }));
    }

    #[test]
    fn scan_resynchronises_after_garbage() {
        let good = record::encode(&frame("a", 1, b"x"));
        let mut data = b"garbage".to_vec();
        data.extend_from_slice(&good);
        data.extend_from_slice(&good[..5]);
        let items = scan_segment(&data);
        assert_eq!(
            items,
            vec![
                Scanned::Damaged { offset: 0, len: 7 },
                Scanned::Record {
                    offset: 7,
                    len: good.len()
                },
                Scanned::Damaged {
                    offset: 7 + good.len(),
                    len: 5
                },
            ]
        );
    }
}
