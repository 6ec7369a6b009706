//! Opening a spool: making the index cover the segments (reading back what the index does not
//! list, rebuilding it from the segments, quarantining damaged spans), and paying the sequence
//! jump a crashed run owes. Works on the parts of the spool being opened ([`Recovery`]), before
//! anything else can reach them.

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use super::counts::Counts;
use super::floor::Floor;
use super::index::Index;
use super::pages::Location;
use super::quarantine::Quarantine;
use super::segments::{Locked, Segments};
use super::{ledger, record, SpoolError, CRASH_SEQ_MARGIN};

/// Live records per segment and records/bytes per source, stored by a clean shutdown so that the
/// next start need not walk every index entry (startup with a 10 GiB spool: docs/PERFORMANCE.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SavedCounts {
    pub(super) segments: Vec<(u64, u64)>,
    pub(super) sources: Vec<(String, u64, u64)>,
}

impl SavedCounts {
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
        b.is_empty().then_some(SavedCounts { segments, sources })
    }

    /// True when they describe exactly the segments found.
    fn matches(&self, segs: &Locked<'_>) -> bool {
        let ids = segs.ids();
        self.segments.len() == ids.len() && self.segments.iter().all(|(id, _)| segs.has(*id))
    }
}

/// Pays the jump a crashed `on-outage` run owes: every source known to the spool (a sequence
/// note, records in the index, or a floor) gets its note moved [`CRASH_SEQ_MARGIN`] past the
/// highest sequence known, durably, before anything is numbered from it.
pub(super) fn jump_sequences(root: &Path, index: &Index, floor: &Floor) -> Result<(), SpoolError> {
    let mut sources: BTreeSet<Arc<str>> = BTreeSet::new();
    sources.extend(index.noted_sources()?);
    sources.extend(index.sources());
    // A source the index never noted (a full disk at its first use) has its floor.
    sources.extend(floor.sources());
    for source in &sources {
        // Two bounds on what the crashed run handed out: the margin past its last durable
        // note (a guess: less than that between two commits), and the floor (a guarantee
        // while `SEQ` could be written). The higher one.
        let next = index
            .noted_seq(source)?
            .unwrap_or(0)
            .max(index.stored_seq(source)?)
            .saturating_add(CRASH_SEQ_MARGIN)
            .max(floor.get(source));
        index.set_seq_note(source, next)?;
    }
    index.flush()?;
    tracing::info!(spool = %root.display(), sources = sources.len(), jump = CRASH_SEQ_MARGIN,
        "spool: the last run (on-outage) did not end cleanly; sequence numbers jump ahead");
    Ok(())
}

/// The parts of a spool being opened that recovery works on.
pub(super) struct Recovery<'a> {
    pub(super) root: &'a Path,
    pub(super) index: &'a Index,
    pub(super) segments: &'a Segments,
    pub(super) counts: &'a Counts,
    pub(super) quarantine: &'a Quarantine,
}

impl Recovery<'_> {
    /// Reads the segment list and the index, and makes the index cover the segments: bytes the
    /// ledger does not cover are read back from the segments; an index that does not describe
    /// the segments is rebuilt from them. `saved`: what the last clean shutdown stored; when it
    /// matches the segment files and the ledger covers them all, the index is not walked.
    pub(super) fn load(
        &self,
        known: &ledger::Known,
        saved: Option<SavedCounts>,
    ) -> Result<(), SpoolError> {
        let found = self.segments.files()?;
        let files: BTreeMap<u64, u64> = found.iter().map(|(id, (len, _))| (*id, *len)).collect();
        let plan = ledger::plan(known, &files);
        if let Some(why) = &plan.damage {
            return self.rebuild_index(why);
        }
        let mut segs = self.segments.lock();
        for (id, (len, allocated)) in &found {
            segs.found(*id, *len, *allocated);
        }
        let legacy = known.ledger.is_none();
        let counted = match saved {
            Some(c) if !legacy && plan.uncovered.is_empty() && c.matches(&segs) => {
                for (id, live) in &c.segments {
                    segs.set_live(*id, *live);
                }
                for (source, records, bytes) in &c.sources {
                    self.counts
                        .restore(&Arc::from(source.as_str()), *records, *bytes);
                }
                true
            }
            _ => false,
        };
        // Count what the index holds; entries pointing at a missing segment are stale. A page
        // that does not decode means the index cannot be trusted: it is rebuilt from the segments.
        let mut bad_page = false;
        for source in self.index.sources() {
            if counted || bad_page {
                break;
            }
            // Listed in status even when it holds nothing now.
            self.counts.stats(&source);
            let decoded = self.index.retain(&source, |page| {
                let mut kept = Vec::with_capacity(page.len());
                for (seq, loc) in page {
                    if segs.has(loc.segment) {
                        segs.add_live(loc.segment, 1);
                        self.counts.found(&source, 1, loc.len as u64);
                        kept.push((seq, loc));
                    } else {
                        // Nothing to keep but the fact: the note in quarantine/ is what counts it.
                        self.counts.quarantined(&source);
                        let note = format!(
                            "{source}/{seq}: {} bytes at {} of segment {:016x}, which is gone\n",
                            loc.len, loc.offset, loc.segment
                        );
                        self.quarantine.set_aside(
                            &format!("{source}-{seq}-missing"),
                            loc.segment,
                            loc.offset,
                            note.as_bytes(),
                            "its segment is gone",
                        );
                    }
                }
                kept
            })?;
            bad_page = !decoded;
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
            scan.extend(segs.unlisted().into_iter().map(|id| (id, 0)));
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
        let (deleted, covered) = segs.delete_proven_empty(&unread);
        drop(segs);
        self.index.record_ledger(&covered, &plan.stale)?;
        super::sync_after_delete(self.segments, self.index, &deleted);
        let q = self.quarantine.count();
        if q > 0 {
            tracing::warn!(spool = %self.root.display(), quarantined = q, "spool has quarantined records (see the quarantine/ directory)");
        }
        Ok(())
    }

    /// The index does not describe the segments: it is rebuilt from every segment, and sequence
    /// numbers jump past everything found (the caller pays the jump; what was published and
    /// removed cannot be known). Records already acknowledged may come back; their sequence ids
    /// make the broker's deduplication drop them.
    pub(super) fn rebuild_index(&self, why: &str) -> Result<(), SpoolError> {
        tracing::error!(spool = %self.root.display(), reason = why,
            "spool: the index does not cover the segments on disk; rebuilding it from the segments (nothing is deleted that the segments hold)");
        self.index
            .note_damage(format!("rebuilt from the segments at start: {why}"));
        self.index.forget_locations()?;
        self.counts.forget_stored();
        let files = self.segments.files()?;
        let mut segs = self.segments.lock();
        segs.forget_all();
        let mut unread = BTreeSet::new();
        for (id, (len, allocated)) in &files {
            segs.found(*id, *len, *allocated);
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
        let (deleted, covered) = segs.delete_proven_empty(&unread);
        drop(segs);
        self.index.record_ledger(&covered, &[])?;
        if !unread.is_empty() {
            // The index still does not cover them: the next start rebuilds again.
            self.index.ask_rebuild()?;
        }
        super::sync_after_delete(self.segments, self.index, &deleted);
        tracing::warn!(spool = %self.root.display(), records = found, segments = covered.len(),
            quarantined = self.quarantine.count(), "spool: index rebuilt from the segments");
        Ok(())
    }

    /// Indexes the valid records of segment `id` from byte `from` on that the index does not list
    /// yet, counting them as stored. After a damaged span (a bad header, garbage) the scan goes
    /// on from the next valid record header; damaged spans are quarantined, a torn end is only
    /// logged (the tail of an interrupted write). Returns how many records were added.
    fn recover_segment(
        &self,
        segs: &mut Locked<'_>,
        id: u64,
        from: u64,
    ) -> Result<u64, SpoolError> {
        let data = self.segments.read_file(id)?;
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
                                delta: !f.media.is_keyframe(),
                            };
                            found
                                .entry(f.frame.source.clone())
                                .or_default()
                                .entry(f.seq)
                                .or_insert(loc);
                        }
                        Err(e) => self.quarantine.set_aside(
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
                record::Scanned::Damaged { offset, len } => self.quarantine.set_aside(
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
                if self.index.lookup(&source, seq)?.is_none() {
                    fresh.push((seq, loc));
                }
            }
            if fresh.is_empty() {
                continue;
            }
            self.index.store_entries(&source, &fresh)?;
            let bytes: u64 = fresh.iter().map(|(_, l)| l.len as u64).sum();
            self.counts.found(&source, fresh.len() as u64, bytes);
            segs.add_live(id, fresh.len() as u64);
            added += fresh.len() as u64;
        }
        Ok(added)
    }
}
