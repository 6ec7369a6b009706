//! Segment files: the one being written ([`Writer`]), the bookkeeping of all of them (sizes,
//! live records, the bytes they count in the spool's size, the emptied ones awaiting the commit
//! that lets them go), creating, sealing, reading and deleting them. [`Segments`] owns it all
//! behind one lock; [`Locked`] is that lock held, for the spool's steps that must see the
//! segments and the index at one moment (an append takes its index serial under it).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rigd_drivers::Frame;

use super::counts::sub;
use super::disk::{allocated, write_all_at, Disk};
use super::pages::Location;
use super::SpoolError;

pub(super) const MAX_SEGMENT: u64 = 64 << 20;

/// Bytes of whole records a writer buffers before writing them to the file.
pub(super) const WRITE_BUFFER: usize = 1 << 20;

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
                let _ = disk.set_len(&self.file, at);
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

/// The state behind the lock: the writer, segment bookkeeping, open read handles.
#[derive(Default)]
struct State {
    writer: Option<Writer>,
    /// Per segment: (file size, live records).
    info: BTreeMap<u64, (u64, u64)>,
    readers: HashMap<u64, Arc<File>>,
    /// Segments left without records, deleted after the next commit has made the removals durable.
    emptied: Vec<u64>,
    /// Segment lengths the ledger is to record at the next commit (sealed or new segments; the
    /// one being written is added by the commit itself).
    ledger_due: BTreeMap<u64, u64>,
    /// The segment being written and its length at the last successful fdatasync.
    synced: Option<(u64, u64)>,
    /// Per segment: the bytes it counts in the spool's size: the blocks allocated to it when it
    /// was found (a sparse file counts what it takes, not its length), plus what this run
    /// appended to it.
    charged: BTreeMap<u64, u64>,
}

/// The segment files of a spool.
pub(super) struct Segments {
    /// The spool directory (errors name it).
    root: PathBuf,
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    /// A new segment is started when a record would take the one being written past this.
    size: u64,
    state: Mutex<State>,
    /// Bytes the segments count in the spool's size (the sum of [`State::charged`]).
    bytes: AtomicU64,
    /// No segment file is deleted in this run ([`Segments::keep_files`]).
    keep: AtomicBool,
}

impl Segments {
    /// The segments of the spool at `root` (whose `segments/` exists); none known yet.
    pub(super) fn new(root: &Path, disk: Arc<dyn Disk>, size: u64) -> Self {
        Segments {
            root: root.to_path_buf(),
            dir: root.join("segments"),
            disk,
            size,
            state: Mutex::default(),
            bytes: AtomicU64::new(0),
            keep: AtomicBool::new(false),
        }
    }

    /// From now on no segment file is deleted, emptied or not: the index that survives this run
    /// (the one on disk, which could not be opened) cannot record a deletion, and would name
    /// records whose segment is gone, or, once the id is used again, other records' bytes.
    pub(super) fn keep_files(&self) {
        self.keep.store(true, Ordering::Relaxed);
    }

    pub(super) fn lock(&self) -> Locked<'_> {
        Locked {
            segs: self,
            st: self.state.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    fn io(&self, op: &'static str) -> impl Fn(std::io::Error) -> SpoolError + '_ {
        move |source| SpoolError::Io {
            path: self.root.clone(),
            op,
            source,
        }
    }

    /// Bytes allocated to the segment files (what they count in `max-bytes`).
    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(super) fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:016x}.seg"))
    }

    /// fsync of `segments/` after a file in it was created or removed.
    pub(super) fn sync_dir(&self) -> Result<(), SpoolError> {
        self.disk
            .sync_dir(&self.dir)
            .map_err(self.io("fsync the segments directory"))
    }

    /// fdatasync of the segment file being written (taken by [`Locked::flush`]).
    pub(super) fn sync_data(&self, file: &File) -> std::io::Result<()> {
        self.disk.sync_data(file)
    }

    /// The segment files on disk: id -> (length, bytes allocated to it).
    pub(super) fn files(&self) -> Result<BTreeMap<u64, (u64, u64)>, SpoolError> {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir).map_err(self.io("list segments"))? {
            let entry = entry.map_err(self.io("list segments"))?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            else {
                continue;
            };
            let meta = entry.metadata().map_err(self.io("stat segment"))?;
            files.insert(id, (meta.len(), allocated(&meta)));
        }
        Ok(files)
    }

    /// A whole segment file.
    pub(super) fn read_file(&self, id: u64) -> Result<Vec<u8>, SpoolError> {
        self.disk
            .read(&self.path(id))
            .map_err(self.io("read segment"))
    }

    /// One record of a segment is gone; the segment is deleted after the next commit when none
    /// is left.
    pub(super) fn release(&self, segment: u64) {
        let mut segs = self.lock();
        let st = &mut *segs.st;
        let empty = match st.info.get_mut(&segment) {
            Some(i) => {
                i.1 = i.1.saturating_sub(1);
                i.1 == 0
            }
            None => false,
        };
        let active = st.writer.as_ref().is_some_and(|w| w.id == segment);
        if empty && !active {
            st.emptied.push(segment);
        }
    }

    /// A record's bytes, from the segment being written (file and buffer) or a sealed one.
    pub(super) fn read(&self, loc: Location) -> std::io::Result<Vec<u8>> {
        let file = {
            let mut segs = self.lock();
            let st = &mut *segs.st;
            if let Some(w) = st.writer.as_ref().filter(|w| w.id == loc.segment) {
                return w.read(self.disk.as_ref(), loc.offset, loc.len as usize);
            }
            match st.readers.get(&loc.segment) {
                Some(f) => f.clone(),
                None => {
                    let f = Arc::new(self.disk.open(&self.path(loc.segment))?);
                    st.readers.insert(loc.segment, f.clone());
                    f
                }
            }
        };
        let mut buf = vec![0u8; loc.len as usize];
        self.disk.read_exact_at(&file, &mut buf, loc.offset)?;
        Ok(buf)
    }

    /// After a commit's fdatasync of the segment being written, `(segment, length)` as flushed.
    pub(super) fn synced(&self, at: (u64, u64)) {
        self.lock().st.synced = Some(at);
    }

    /// Nothing for a commit to do here: the segment being written is synced as long as it is,
    /// no length is due in the ledger and no emptied segment waits.
    pub(super) fn idle(&self) -> bool {
        let segs = self.lock();
        let st = &*segs.st;
        let unsynced = st
            .writer
            .as_ref()
            .is_some_and(|w| st.synced != Some((w.id, w.len)));
        !unsynced && st.ledger_due.is_empty() && st.emptied.is_empty()
    }

    /// The segments emptied so far (to be deleted once the removals that emptied them are
    /// durable).
    pub(super) fn take_emptied(&self) -> Vec<u64> {
        std::mem::take(&mut self.lock().st.emptied)
    }

    /// Emptied segments handed back by a commit that failed before they could go.
    pub(super) fn restore_emptied(&self, emptied: Vec<u64>) {
        self.lock().st.emptied.extend(emptied);
    }
}

/// What a commit takes from [`Locked::flush`].
pub(super) struct Flushed {
    /// The file of the segment being written, for the commit's fdatasync (made without the lock),
    /// with its id and length as flushed.
    pub(super) sync: Option<(Arc<File>, (u64, u64))>,
    /// Segment lengths the ledger is to record once the sync succeeded.
    pub(super) due: BTreeMap<u64, u64>,
}

/// The segments' lock, held.
pub(super) struct Locked<'a> {
    segs: &'a Segments,
    st: MutexGuard<'a, State>,
}

impl Locked<'_> {
    /// Writes a record into the segment being written (rolling to a new one when full); all or
    /// nothing. Returns where it went. `sync_failed` hears of a failed fdatasync while sealing.
    pub(super) fn append(
        &mut self,
        frame: &Frame,
        head: &[u8],
        len: u64,
        sync_failed: impl FnOnce(&std::io::Error),
    ) -> Result<Location, SpoolError> {
        let size = self.segs.size;
        let roll = self
            .st
            .writer
            .as_ref()
            .is_none_or(|w| w.len > 0 && w.len + len > size);
        if roll {
            self.roll(sync_failed)?;
        }
        let segs = self.segs;
        let st = &mut *self.st;
        let Some(w) = st.writer.as_mut() else {
            return Err(SpoolError::Io {
                path: segs.root.clone(),
                op: "open segment",
                source: std::io::ErrorKind::Other.into(),
            });
        };
        let loc = Location {
            segment: w.id,
            offset: w.len,
            len: len as u32,
            capture_ns: frame.capture_ns,
            delta: !frame.media.is_keyframe(),
        };
        w.append(segs.disk.as_ref(), head, &frame.payload)
            .map_err(segs.io("write segment"))?;
        let id = w.id;
        if let Some(i) = st.info.get_mut(&id) {
            i.0 += len;
            i.1 += 1;
        }
        self.charge(id, len);
        Ok(loc)
    }

    fn roll(&mut self, sync_failed: impl FnOnce(&std::io::Error)) -> Result<(), SpoolError> {
        let segs = self.segs;
        let st = &mut *self.st;
        if let Some(w) = st.writer.as_mut() {
            // Sealed only once whole and synced: until then it stays the segment being written.
            w.flush(segs.disk.as_ref())
                .map_err(segs.io("write segment"))?;
            if let Err(e) = segs.disk.sync_data(&w.file) {
                sync_failed(&e);
                return Err(segs.io("fdatasync segment")(e));
            }
        }
        if let Some(w) = st.writer.take() {
            if st.info.get(&w.id).is_some_and(|i| i.1 == 0) {
                st.emptied.push(w.id);
            }
            st.ledger_due.insert(w.id, w.len);
        }
        let id = st.info.keys().next_back().map(|k| k + 1).unwrap_or(1);
        let file = segs
            .disk
            .create(&segs.path(id))
            .map_err(segs.io("create segment"))?;
        // The new name is made durable before any index entry can point into the file; a file
        // whose name may not survive is not used (the next append tries again).
        if let Err(e) = segs.sync_dir() {
            drop(file);
            let _ = segs.disk.remove(&segs.path(id));
            return Err(e);
        }
        st.info.insert(id, (0, 0));
        st.ledger_due.insert(id, 0);
        st.writer = Some(Writer {
            id,
            file: Arc::new(file),
            buf: Vec::with_capacity(WRITE_BUFFER),
            len: 0,
            flushed: 0,
        });
        Ok(())
    }

    /// Writes out the buffer of the segment being written, for a commit; earlier segments were
    /// synced when they were sealed.
    pub(super) fn flush(&mut self) -> Result<Flushed, SpoolError> {
        let segs = self.segs;
        let mut due = self.st.ledger_due.clone();
        let sync = match self.st.writer.as_mut() {
            Some(w) => {
                w.flush(segs.disk.as_ref())
                    .map_err(segs.io("write segment"))?;
                due.insert(w.id, w.len);
                Some((w.file.clone(), (w.id, w.len)))
            }
            None => None,
        };
        Ok(Flushed { sync, due })
    }

    /// Writes out what it can of the buffer of the segment being written, whatever fails;
    /// returns the segment and how many of its bytes are in the file (None: no segment).
    pub(super) fn write_out(&mut self) -> Option<(u64, u64)> {
        let w = self.st.writer.as_mut()?;
        let _ = w.flush(self.segs.disk.as_ref());
        Some((w.id, w.flushed))
    }

    /// After a commit: the ledger now records these lengths (`due`, from [`Locked::flush`]).
    pub(super) fn recorded(&mut self, due: &BTreeMap<u64, u64>) {
        // A segment created since (due at length 0) is recorded by any length of it: the one
        // being written only grows.
        for (id, len) in due {
            if self.st.ledger_due.get(id).is_some_and(|d| d <= len) {
                self.st.ledger_due.remove(id);
            }
        }
    }

    /// The oldest segment other than the one being written.
    pub(super) fn oldest_sealed(&self) -> Option<u64> {
        let active = self.st.writer.as_ref().map(|w| w.id);
        self.st.info.keys().copied().find(|id| Some(*id) != active)
    }

    /// Bytes the segments other than the one being written count in the spool's size: what
    /// dropping every one of them would free.
    pub(super) fn sealed_bytes(&self) -> u64 {
        let active = self.st.writer.as_ref().map(|w| w.id);
        self.st
            .charged
            .iter()
            .filter(|(id, _)| Some(**id) != active)
            .map(|(_, n)| n)
            .sum()
    }

    /// Per segment: its live records.
    pub(super) fn live(&self) -> Vec<(u64, u64)> {
        self.st
            .info
            .iter()
            .map(|(id, (_, live))| (*id, *live))
            .collect()
    }

    /// Whether a segment is known (its file was there at open, or made since).
    pub(super) fn has(&self, id: u64) -> bool {
        self.st.info.contains_key(&id)
    }

    /// The ids of the known segments.
    pub(super) fn ids(&self) -> Vec<u64> {
        self.st.info.keys().copied().collect()
    }

    /// Segments without live records but with bytes (a spool from before the ledger reads them
    /// back).
    pub(super) fn unlisted(&self) -> Vec<u64> {
        self.st
            .info
            .iter()
            .filter(|(_, (size, live))| *live == 0 && *size > 0)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Takes in a segment file found on disk: (length, allocated bytes).
    pub(super) fn found(&mut self, id: u64, len: u64, allocated: u64) {
        self.st.info.insert(id, (len, 0));
        self.charge(id, allocated);
    }

    /// Forgets every segment (before a rebuild takes them in again).
    pub(super) fn forget_all(&mut self) {
        self.st.info.clear();
        self.st.charged.clear();
        self.segs.bytes.store(0, Ordering::Relaxed);
    }

    /// `n` more live records in segment `id` (found at open).
    pub(super) fn add_live(&mut self, id: u64, n: u64) {
        if let Some(i) = self.st.info.get_mut(&id) {
            i.1 += n;
        }
    }

    /// Segment `id` holds `live` records (what a clean shutdown counted).
    pub(super) fn set_live(&mut self, id: u64, live: u64) {
        if let Some(i) = self.st.info.get_mut(&id) {
            i.1 = live;
        }
    }

    /// Counts `n` more bytes of segment `id` in the spool's size.
    fn charge(&mut self, id: u64, n: u64) {
        *self.st.charged.entry(id).or_default() += n;
        self.segs.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Deletes a segment file (not the one being written); true when a file went. The caller
    /// fsyncs the directory after its deletions ([`Segments::sync_dir`]).
    pub(super) fn delete(&mut self, id: u64) -> bool {
        let st = &mut *self.st;
        if st.writer.as_ref().is_some_and(|w| w.id == id) || self.segs.keep.load(Ordering::Relaxed)
        {
            return false;
        }
        st.info.remove(&id);
        if let Some(charged) = st.charged.remove(&id) {
            sub(&self.segs.bytes, charged);
        }
        st.readers.remove(&id);
        st.ledger_due.remove(&id);
        match self.segs.disk.remove(&self.segs.path(id)) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(segment = id, error = %e, "spool: cannot delete a drained segment");
                false
            }
        }
    }

    /// Deletes `id` if it holds no live record; true when a file went.
    pub(super) fn delete_if_empty(&mut self, id: u64) -> bool {
        self.st.info.get(&id).is_some_and(|i| i.1 == 0) && self.delete(id)
    }

    /// After a recovery or a rebuild: deletes the segments the index proves empty (never one that
    /// could not be read), and returns them with the (id, size) of every segment the index now
    /// covers, for the ledger.
    pub(super) fn delete_proven_empty(
        &mut self,
        unread: &std::collections::BTreeSet<u64>,
    ) -> (Vec<u64>, Vec<(u64, u64)>) {
        let empty: Vec<u64> = self
            .st
            .info
            .iter()
            .filter(|(id, (_, live))| *live == 0 && !unread.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let deleted = empty.into_iter().filter(|id| self.delete(*id)).collect();
        let covered = self
            .st
            .info
            .iter()
            .filter(|(id, _)| !unread.contains(id))
            .map(|(id, (size, _))| (*id, *size))
            .collect();
        (deleted, covered)
    }
}
