//! Opening a spool whose index does not cover its segments: reading back what the index does not
//! list, rebuilding it from the segments, quarantining damaged spans, paying the sequence jump.

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::index::{key_seq, Location};
use super::segments::Segments;
use super::{ledger, pages, record, Spool, SpoolError, CRASH_SEQ_MARGIN};

/// Live records per segment and records/bytes per source, stored by a clean shutdown so that the
/// next start need not walk every index entry (startup with a 10 GiB spool: docs/PERFORMANCE.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) segments: Vec<(u64, u64)>,
    pub(super) sources: Vec<(String, u64, u64)>,
}

impl Counts {
    pub(super) fn encode(&self) -> Vec<u8> {
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

    pub(super) fn decode(mut b: &[u8]) -> Option<Self> {
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
    pub(super) fn matches(&self, info: &BTreeMap<u64, (u64, u64)>) -> bool {
        self.segments.len() == info.len()
            && self.segments.iter().all(|(id, _)| info.contains_key(id))
    }
}

impl Spool {
    /// Pays the jump a crashed `on-outage` run owes: every source known to the spool (a sequence
    /// note, or records in the index) gets its note moved [`CRASH_SEQ_MARGIN`] past the highest
    /// sequence known, durably, before anything is numbered from it.
    pub(super) fn jump_sequences(&self) -> Result<(), SpoolError> {
        let mut sources: BTreeSet<Arc<str>> = BTreeSet::new();
        for item in self.meta.scan_prefix(super::index::seq_note_key("")) {
            let (k, _) = item.map_err(self.ix())?;
            sources.insert(String::from_utf8_lossy(&k[4..]).into());
        }
        for name in self.index.tree_names() {
            if let Some(source) = name.strip_prefix(b"i:") {
                sources.insert(String::from_utf8_lossy(source).into());
            }
        }
        // A source the index never noted (a full disk at its first use) has its floor.
        let floors = self.floors.lock().unwrap_or_else(|p| p.into_inner());
        sources.extend(floors.reserved.keys().cloned());
        drop(floors);
        for source in &sources {
            // Two bounds on what the crashed run handed out: the margin past its last durable
            // note (a guess: less than that between two commits), and the floor (a guarantee
            // while `SEQ` could be written). The higher one.
            let next = self
                .noted_seq(source)?
                .unwrap_or(0)
                .max(self.stored_seq(source)?)
                .saturating_add(CRASH_SEQ_MARGIN)
                .max(self.floor(source));
            self.meta
                .insert(super::index::seq_note_key(source), &next.to_le_bytes()[..])
                .map_err(self.ix())?;
        }
        self.index.flush().map_err(self.ix())?;
        tracing::info!(spool = %self.path.display(), sources = sources.len(), jump = CRASH_SEQ_MARGIN,
            "spool: the last run (on-outage) did not end cleanly; sequence numbers jump ahead");
        Ok(())
    }

    /// Reads the segment list and the index, and makes the index cover the segments: bytes the
    /// ledger does not cover are read back from the segments; an index that does not describe
    /// the segments is rebuilt from them. `counts`: what the last clean shutdown stored; when they
    /// match the segment files and the ledger covers them all, the index is not walked.
    pub(super) fn load(
        &self,
        known: &ledger::Known,
        counts: Option<Counts>,
    ) -> Result<(), SpoolError> {
        let found = self.segment_files()?;
        let files: BTreeMap<u64, u64> = found.iter().map(|(id, (len, _))| (*id, *len)).collect();
        let plan = ledger::plan(known, &files);
        if let Some(why) = &plan.damage {
            return self.rebuild_index(why);
        }
        let mut segs = self.segs();
        for (id, (len, allocated)) in &found {
            segs.found(*id, *len, *allocated, &self.disk_bytes);
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
                        // Nothing to keep but the fact: the note in quarantine/ is what counts it.
                        stats.quarantined.fetch_add(1, Ordering::Relaxed);
                        let note = format!(
                            "{source}/{seq}: {} bytes at {} of segment {:016x}, which is gone\n",
                            loc.len, loc.offset, loc.segment
                        );
                        self.quarantine_bytes(
                            &format!("{source}-{seq}-missing"),
                            loc.segment,
                            loc.offset,
                            note.as_bytes(),
                            "its segment is gone",
                        );
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
    pub(super) fn delete_proven_empty(
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

    pub(super) fn record_ledger(
        &self,
        covered: &[(u64, u64)],
        gone: &[u64],
    ) -> Result<(), SpoolError> {
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
    pub(super) fn rebuild_index(&self, why: &str) -> Result<(), SpoolError> {
        tracing::error!(spool = %self.path.display(), reason = why,
            "spool: the index does not cover the segments on disk; rebuilding it from the segments (nothing is deleted that the segments hold)");
        self.note_damage(format!("rebuilt from the segments at start: {why}"));
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
        segs.charged.clear();
        self.disk_bytes.store(0, Ordering::Relaxed);
        let mut unread = BTreeSet::new();
        for (id, (len, allocated)) in &files {
            segs.found(*id, *len, *allocated, &self.disk_bytes);
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
    pub(super) fn recover_segment(
        &self,
        segs: &mut Segments,
        id: u64,
        from: u64,
    ) -> Result<u64, SpoolError> {
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

    /// Sets damaged bytes aside in `quarantine/`, one file per record or damaged span, and counts
    /// them. The directory is the count (`spool stat` and `verify` count its files, and an open
    /// starts from them): a span already there (a second rebuild finds the same damage) is not
    /// counted again. A file that cannot be written (a full disk) is counted all the same, and
    /// said in the log: the record is lost either way.
    pub(super) fn quarantine_bytes(
        &self,
        source: &str,
        segment: u64,
        offset: u64,
        bytes: &[u8],
        why: &str,
    ) {
        let name = format!("{source}-{segment:016x}-{offset}.bad");
        match self
            .disk
            .write_file(&self.path.join("quarantine").join(&name), bytes)
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                tracing::warn!(file = %name, reason = why, "spool: damaged bytes found again, already in quarantine/");
                return;
            }
            Err(e) => {
                tracing::error!(file = %name, error = %e, "spool: cannot write a quarantine file; the record is counted as quarantined without it");
            }
        }
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        tracing::error!(source, segment, offset, reason = why, file = %name, "spool: corrupt record quarantined");
    }
}
