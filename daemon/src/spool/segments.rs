//! Segment files: the one being written ([`Writer`]), the bookkeeping of all of them
//! ([`Segments`]), creating, sealing, reading and deleting them.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};

use rigd_drivers::Frame;

use super::capacity::sub;
use super::disk::{allocated, Disk};
use super::index::Location;
use super::{ledger, Spool, SpoolError};

pub(super) const MAX_SEGMENT: u64 = 64 << 20;

/// The segment being written. Records go whole into `buf` (or, when larger than it, straight
/// into the file at their offset); the file is written with positioned writes at `flushed`, so a
/// failed or short write (ENOSPC, EIO) never leaves a record half in the buffer: whatever did not
/// reach the file stays buffered, in order, and the next flush goes on from there.
pub(super) struct Writer {
    pub(super) id: u64,
    /// Shared with the commit's fdatasync, which runs without the segment lock.
    pub(super) file: Arc<File>,
    pub(super) buf: Vec<u8>,
    /// Bytes of the segment: in the file plus buffered.
    pub(super) len: u64,
    /// Bytes of the segment in the file.
    pub(super) flushed: u64,
}

/// All of `buf` at `offset`, through `disk`'s (possibly short) writes.
pub(super) fn write_all_at(
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
pub(super) const WRITE_BUFFER: usize = 1 << 20;

impl Writer {
    /// Writes the buffer to the file. On an error what was written is kept (`flushed` moves
    /// on), the rest stays buffered.
    pub(super) fn flush(&mut self, disk: &dyn Disk) -> std::io::Result<()> {
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
    pub(super) fn append(
        &mut self,
        disk: &dyn Disk,
        head: &[u8],
        payload: &[u8],
    ) -> std::io::Result<()> {
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
    pub(super) fn read(
        &self,
        disk: &dyn Disk,
        offset: u64,
        len: usize,
    ) -> std::io::Result<Vec<u8>> {
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

/// Mutable state behind one lock: the writer, segment bookkeeping, open read handles.
pub(super) struct Segments {
    pub(super) writer: Option<Writer>,
    /// Per segment: (file size, live records).
    pub(super) info: BTreeMap<u64, (u64, u64)>,
    pub(super) readers: HashMap<u64, Arc<File>>,
    /// Segments left without records, deleted after the next commit has made the removals durable.
    pub(super) emptied: Vec<u64>,
    /// Segment lengths the ledger is to record at the next commit (sealed or new segments; the
    /// one being written is added by the commit itself).
    pub(super) ledger_due: BTreeMap<u64, u64>,
    /// Per segment: the bytes it counts in the spool's size: the blocks allocated to it when it
    /// was found (a sparse file counts what it takes, not its length), plus what this run
    /// appended to it.
    pub(super) charged: BTreeMap<u64, u64>,
}

impl Segments {
    /// Takes in a segment file found on disk: (length, allocated bytes).
    pub(super) fn found(&mut self, id: u64, len: u64, allocated: u64, total: &AtomicU64) {
        self.info.insert(id, (len, 0));
        self.charge(id, allocated, total);
    }

    /// Counts `n` more bytes of segment `id` in the spool's size (`total`).
    pub(super) fn charge(&mut self, id: u64, n: u64, total: &AtomicU64) {
        *self.charged.entry(id).or_default() += n;
        total.fetch_add(n, Ordering::Relaxed);
    }
}

impl Spool {
    /// fsync of `segments/` after deletions. Not fatal: a drained segment that a power cut brings
    /// back holds nothing the index lists and is deleted again at the next start (only an index
    /// rebuild would send its records again, and broker deduplication drops them).
    /// Once the deletions are durable the ledger forgets the segments (a segment file the ledger
    /// does not know is read back at the next start, never deleted unread).
    pub(super) fn sync_after_delete(&self, ids: &[u64]) {
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
    pub(super) fn sync_segments_dir(&self) -> Result<(), SpoolError> {
        self.disk
            .sync_dir(&self.path.join("segments"))
            .map_err(self.io("fsync the segments directory"))
    }

    pub(super) fn segment_path(&self, id: u64) -> PathBuf {
        self.path.join("segments").join(format!("{id:016x}.seg"))
    }

    pub(super) fn segs(&self) -> MutexGuard<'_, Segments> {
        self.segs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The segment files on disk: id -> (length, bytes allocated to it).
    pub(super) fn segment_files(&self) -> Result<BTreeMap<u64, (u64, u64)>, SpoolError> {
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
            let meta = entry.metadata().map_err(self.io("stat segment"))?;
            files.insert(id, (meta.len(), allocated(&meta)));
        }
        Ok(files)
    }

    /// Deletes a segment file (not the one being written); true when a file went. The caller
    /// fsyncs the directory after its deletions ([`Spool::sync_segments_dir`]).
    pub(super) fn delete_segment(&self, segs: &mut Segments, id: u64) -> bool {
        if segs.writer.as_ref().is_some_and(|w| w.id == id) {
            return false;
        }
        segs.info.remove(&id);
        if let Some(charged) = segs.charged.remove(&id) {
            sub(&self.disk_bytes, charged);
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

    /// Writes a record into the segment being written (rolling to a new one when full) and keeps
    /// its index entry pending; all or nothing.
    pub(super) fn write_record(
        &self,
        frame: &Frame,
        head: &[u8],
        len: u64,
    ) -> Result<(), SpoolError> {
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
        segs.charge(id, len, &self.disk_bytes);
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

    pub(super) fn roll(&self, segs: &mut Segments) -> Result<(), SpoolError> {
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

    /// One record of a segment is gone; the segment is deleted after the next commit when none
    /// is left.
    pub(super) fn release_segment(&self, loc: Location) {
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

    pub(super) fn read_at(&self, loc: Location) -> std::io::Result<Vec<u8>> {
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
}
