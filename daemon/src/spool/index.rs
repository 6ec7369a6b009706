//! The index: record locations in sled pages, the changes not yet committed to it ([`Pending`]),
//! and the sequence notes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::disk::no_room;
use super::{ledger, pages, Spool, SpoolError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Location {
    pub(super) segment: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
    /// Capture time of the frame, so the oldest age is known without reading the record.
    pub(super) capture_ns: i64,
}

impl Location {
    /// The earlier one-entry-per-record index value (still read, see [`pages`]).
    #[cfg(test)]
    pub(super) fn encode(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..].copy_from_slice(&self.capture_ns.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8]) -> Option<Self> {
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
pub(super) struct Pending {
    pub(super) serial: u64,
    /// Per source: seq -> (location, serial of the append).
    pub(super) entries: HashMap<Arc<str>, BTreeMap<u64, (Location, u64)>>,
    /// Per source: (next sequence, serial when noted).
    pub(super) seq_notes: HashMap<Arc<str>, (u64, u64)>,
    /// Per source: the highest seq ever indexed (committed or not), so that an append above it
    /// needs no index lookup.
    pub(super) highest: HashMap<Arc<str>, u64>,
    /// Per source: committed records removed since the last commit (their pages still list them).
    pub(super) removed: HashMap<Arc<str>, BTreeSet<u64>>,
    /// Sources whose oldest capture time is refreshed at the next commit (it moved by a removal).
    pub(super) stale_oldest: HashSet<Arc<str>>,
}

/// Opens the sled index. sled's own file lock can outlive a closed handle for a moment (its
/// threads finish asynchronously), so a busy lock is waited for rather than mistaken for damage:
/// treating it as damage would rebuild the index from segments and resurrect removed records.
pub(super) fn open_index(path: &Path) -> Result<sled::Db, IndexOpen> {
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
pub(super) enum IndexOpen {
    #[error("index busy: {0}")]
    Busy(sled::Error),
    #[error("index damaged: {0}")]
    Damaged(sled::Error),
    /// No space, quota, descriptors or memory to open it: nothing is wrong with the index.
    #[error("index cannot be opened now: {0}")]
    NoRoom(sled::Error),
}

/// The segment ledger as `meta` holds it; `None` in a spool from before the ledger.
pub(super) fn read_ledger(meta: &sled::Tree) -> sled::Result<Option<BTreeMap<u64, u64>>> {
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
pub(super) fn page_at(tree: &sled::Tree, seq: u64) -> sled::Result<Option<(u64, sled::IVec)>> {
    match tree.range(..=seq.to_be_bytes()).next_back() {
        Some(item) => {
            let (k, v) = item?;
            Ok(Some((key_seq(&k), v)))
        }
        None => Ok(None),
    }
}

/// The meta key of a source's sequence note (the next capture sequence it hands out).
pub(super) fn seq_note_key(source: impl std::fmt::Display) -> String {
    format!("seq:{source}")
}

pub(super) fn key_seq(k: &[u8]) -> u64 {
    k.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

impl Spool {
    /// A source's durable sequence note.
    pub(super) fn noted_seq(&self, source: &Arc<str>) -> Result<Option<u64>, SpoolError> {
        Ok(self
            .meta
            .get(seq_note_key(source))
            .map_err(self.ix())?
            .map(|v| u64::from_le_bytes(v.as_ref().try_into().unwrap_or_default())))
    }

    /// The sequence after a source's highest committed record (0: none).
    pub(super) fn stored_seq(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        Ok(self.last_committed(source)?.map_or(0, |s| s + 1))
    }

    pub(super) fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where a source's record is, committed or not.
    pub(super) fn lookup(
        &self,
        source: &Arc<str>,
        seq: u64,
    ) -> Result<Option<Location>, SpoolError> {
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
    pub(super) fn committed(
        &self,
        source: &Arc<str>,
        seq: u64,
    ) -> Result<Option<Location>, SpoolError> {
        let tree = self.tree(source)?;
        let Some((key, v)) = page_at(&tree, seq).map_err(self.ix())? else {
            return Ok(None);
        };
        Ok(pages::find(key, &v, seq))
    }

    /// The highest seq sled has for a source.
    pub(super) fn last_committed(&self, source: &Arc<str>) -> Result<Option<u64>, SpoolError> {
        let last = self.tree(source)?.last().map_err(self.ix())?;
        Ok(last.and_then(|(k, v)| pages::last_seq(key_seq(&k), &v)))
    }

    /// Whether a record may already be stored. Lanes append in increasing `seq`; only a frame
    /// handed back by the uplink at shutdown comes again, so only a seq not above the highest one
    /// indexed is looked up.
    pub(super) fn already_stored(&self, source: &Arc<str>, seq: u64) -> Result<bool, SpoolError> {
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
    pub(super) fn unindex(
        &self,
        source: &Arc<str>,
        seq: u64,
    ) -> Result<Option<Location>, SpoolError> {
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
    pub(super) fn store_entries(
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
    pub(super) fn apply_removals(&self, p: &mut Pending) -> Result<(), SpoolError> {
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

    pub(super) fn tree(&self, source: &Arc<str>) -> Result<sled::Tree, SpoolError> {
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

    /// Moves to sled the index entries and sequence notes of appends below `watermark`.
    pub(super) fn apply_pending(&self, p: &mut Pending, watermark: u64) -> Result<(), SpoolError> {
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
                .insert(seq_note_key(&source), &next.to_le_bytes()[..])
                .map_err(self.ix())?;
            p.seq_notes.remove(&source);
        }
        Ok(())
    }

    /// Up to `max` committed entries of a source with `seq >= from`, in order, leaving out those
    /// removed since the last commit (`p`: the pending state the caller holds locked). A page
    /// that does not decode is set aside (see [`Spool::bad_page`]).
    pub(super) fn committed_from(
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
    pub(super) fn bad_page(
        &self,
        source: &Arc<str>,
        tree: &sled::Tree,
        key: u64,
    ) -> Result<(), SpoolError> {
        tracing::error!(source = %source, page = key, "spool: index page unreadable; dropped, the next start rebuilds the index from the segments");
        tree.remove(key.to_be_bytes()).map_err(self.ix())?;
        self.meta.insert("rebuild", &[1u8][..]).map_err(self.ix())?;
        // Its records are still in their segments (kept: their segments still count them) and
        // still counted as stored; they are listed again by the rebuild.
        self.note_damage(format!(
            "an index page of {source} does not decode; its records stay in the segments and are listed again when the next start rebuilds the index"
        ));
        Ok(())
    }

    /// Refreshes a source's oldest capture time from the index.
    pub(super) fn update_oldest(&self, source: &Arc<str>) -> Result<(), SpoolError> {
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
}
