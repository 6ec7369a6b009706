//! The index: the sled database ([`Index`] owns it), record locations in its pages, the changes
//! not yet committed to them ([`Pending`]), the sequence notes, the segment ledger and the flags
//! of `meta` (`clean`, `mode`, `counts`, `rebuild`), and the damage found in it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::disk::no_room;
use super::pages::{self, Location};
use super::{ledger, SpoolError};

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
    /// When a commit last wrote sequence notes to sled.
    notes_written: Option<std::time::Instant>,
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
fn page_at(tree: &sled::Tree, seq: u64) -> sled::Result<Option<(u64, sled::IVec)>> {
    match tree.range(..=seq.to_be_bytes()).next_back() {
        Some(item) => {
            let (k, v) = item?;
            Ok(Some((key_seq(&k), v)))
        }
        None => Ok(None),
    }
}

/// The meta key of a source's sequence note (the next capture sequence it hands out).
fn seq_note_key(source: impl std::fmt::Display) -> String {
    format!("seq:{source}")
}

pub(super) fn key_seq(k: &[u8]) -> u64 {
    k.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

/// A record named by its source and seq.
pub(super) type Named = (Arc<str>, u64);

/// What the index says about the last run, read at open ([`Index::start_run`]).
pub(super) struct LastRun {
    /// What the index knows of the segments.
    pub(super) known: ledger::Known,
    /// The last run did not shut down cleanly.
    pub(super) unclean: bool,
    /// The mode of the last run (`meta/mode`; `None`: a spool from before it was written).
    pub(super) mode: Option<sled::IVec>,
    /// The last run found an unreadable index page: the index is to be rebuilt.
    pub(super) rebuild: bool,
    /// What a clean shutdown counted (`meta/counts`), if the last run was clean.
    pub(super) counts: Option<sled::IVec>,
}

/// The sled index of a spool, and the changes not yet committed to it.
pub(super) struct Index {
    /// The spool directory (errors name it).
    root: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    trees: Mutex<HashMap<Arc<str>, sled::Tree>>,
    pending: Mutex<Pending>,
    /// Why the index was rebuilt from the segments at open (it did not cover them), or found
    /// damaged since.
    damage: Mutex<Option<String>>,
    /// The index on disk could not be opened (no space): this one is in memory, gone at exit.
    temporary: bool,
}

impl Index {
    /// Opens `root/index`. A damaged one is moved aside and a new one made (the caller rebuilds
    /// it from the segments); one that cannot be opened for want of space is left as it is and
    /// this run works on a temporary one (in memory).
    pub(super) fn open(root: &Path) -> Result<Self, SpoolError> {
        let path = root.to_path_buf();
        let ix = |source| SpoolError::Index {
            path: path.clone(),
            source,
        };
        let index_path = path.join("index");
        let mut temporary = false;
        let db = match open_index(&index_path) {
            Ok(db) => db,
            Err(IndexOpen::Busy(source)) => return Err(SpoolError::Index { path, source }),
            // A full disk is not a damaged index: it stays where it is, untouched, and this run
            // works on a temporary one rebuilt from the segments (in memory).
            Err(IndexOpen::NoRoom(e)) => {
                tracing::error!(spool = %path.display(), error = %e,
                    "spool index cannot be opened (no space or resources); left as it is, this run uses a temporary index rebuilt from the segments and deletes no segment (held records stay held)");
                temporary = true;
                sled::Config::new()
                    .temporary(true)
                    .cache_capacity(16 << 20)
                    .flush_every_ms(None)
                    .open()
                    .map_err(ix)?
            }
            Err(IndexOpen::Damaged(e)) => {
                let aside = path.join(format!(
                    "index.corrupt-{}",
                    rigd_drivers::realtime_ns() / 1_000_000_000
                ));
                tracing::error!(spool = %path.display(), error = %e, moved_to = %aside.display(),
                    "spool index unreadable; moved aside, rebuilding it from the segments");
                std::fs::rename(&index_path, &aside).map_err(|source| SpoolError::Io {
                    path: path.clone(),
                    op: "move the damaged index aside",
                    source,
                })?;
                open_index(&index_path).map_err(|e| match e {
                    IndexOpen::Busy(source)
                    | IndexOpen::Damaged(source)
                    | IndexOpen::NoRoom(source) => ix(source),
                })?
            }
        };
        let meta = db.open_tree("meta").map_err(ix)?;
        Ok(Index {
            root: path,
            db,
            meta,
            trees: Mutex::default(),
            pending: Mutex::default(),
            damage: Mutex::new(None),
            temporary,
        })
    }

    /// This run works on a temporary index (the one on disk could not be opened): what it
    /// records is gone at exit, the index on disk stays as the last run left it.
    pub(super) fn temporary(&self) -> bool {
        self.temporary
    }

    fn ix(&self) -> impl Fn(sled::Error) -> SpoolError + '_ {
        move |source| SpoolError::Index {
            path: self.root.clone(),
            source,
        }
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads what the last run left, then marks this run as not (yet) clean: `clean` = 0 and the
    /// stored counts removed (a crash of this run never finds stale ones), durably.
    pub(super) fn start_run(&self) -> Result<LastRun, SpoolError> {
        let meta = &self.meta;
        let known = ledger::Known {
            blank: meta.is_empty(),
            ledger: read_ledger(meta).map_err(self.ix())?,
        };
        let unclean = meta
            .get("clean")
            .map_err(self.ix())?
            .is_some_and(|v| v.as_ref() != [1]);
        let mode = meta.get("mode").map_err(self.ix())?;
        let rebuild = meta.get("rebuild").map_err(self.ix())?.is_some();
        let counts = (!unclean && !rebuild)
            .then(|| meta.get("counts").ok().flatten())
            .flatten();
        meta.insert("clean", &[0u8][..]).map_err(self.ix())?;
        meta.remove("counts").map_err(self.ix())?;
        self.flush()?;
        Ok(LastRun {
            known,
            unclean,
            mode,
            rebuild,
            counts,
        })
    }

    /// Records the mode of this run (`meta/mode`), durably.
    pub(super) fn set_mode(&self, mode: &[u8]) -> Result<(), SpoolError> {
        self.meta.insert("mode", mode).map_err(self.ix())?;
        self.flush()
    }

    /// A clean shutdown: stores what it counted, then `clean` = 1, durably.
    pub(super) fn mark_clean(&self, counts: Vec<u8>) -> Result<(), SpoolError> {
        self.meta.insert("counts", counts).map_err(self.ix())?;
        self.meta.insert("clean", &[1u8][..]).map_err(self.ix())?;
        self.flush()
    }

    /// The next start is to rebuild the index from the segments.
    pub(super) fn ask_rebuild(&self) -> Result<(), SpoolError> {
        self.meta
            .insert("rebuild", &[1u8][..])
            .map(drop)
            .map_err(self.ix())
    }

    /// The rebuild asked for is under way.
    pub(super) fn rebuild_started(&self) -> Result<(), SpoolError> {
        self.meta.remove("rebuild").map(drop).map_err(self.ix())
    }

    pub(super) fn flush(&self) -> Result<(), SpoolError> {
        self.db.flush().map(drop).map_err(self.ix())
    }

    /// Records damage to the index found at open or while running (shown in status and metrics).
    pub(super) fn note_damage(&self, why: String) {
        let mut d = self.damage.lock().unwrap_or_else(|p| p.into_inner());
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
    pub(super) fn damage(&self) -> Option<String> {
        self.damage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The sources the index lists records of.
    pub(super) fn sources(&self) -> Vec<Arc<str>> {
        self.db
            .tree_names()
            .iter()
            .filter_map(|n| n.strip_prefix(b"i:"))
            .map(|s| String::from_utf8_lossy(s).into())
            .collect()
    }

    /// The sources with a sequence note.
    pub(super) fn noted_sources(&self) -> Result<Vec<Arc<str>>, SpoolError> {
        let mut out = Vec::new();
        for item in self.meta.scan_prefix(seq_note_key("")) {
            let (k, _) = item.map_err(self.ix())?;
            out.push(String::from_utf8_lossy(&k[4..]).into());
        }
        Ok(out)
    }

    /// A source's durable sequence note.
    pub(super) fn noted_seq(&self, source: &Arc<str>) -> Result<Option<u64>, SpoolError> {
        Ok(self
            .meta
            .get(seq_note_key(source))
            .map_err(self.ix())?
            .map(|v| u64::from_le_bytes(v.as_ref().try_into().unwrap_or_default())))
    }

    /// Sets a source's sequence note in sled (durable with the next flush).
    pub(super) fn set_seq_note(&self, source: &Arc<str>, next: u64) -> Result<(), SpoolError> {
        self.meta
            .insert(seq_note_key(source), &next.to_le_bytes()[..])
            .map(drop)
            .map_err(self.ix())
    }

    /// A new source's first note, `next`, durable now (the sled error when it cannot be).
    pub(super) fn note_new_source(&self, source: &Arc<str>, next: u64) -> sled::Result<()> {
        self.meta
            .insert(seq_note_key(source), &next.to_le_bytes()[..])
            .and_then(|_| self.db.flush())
            .map(drop)
    }

    /// Records the next sequence number of a source, to reach sled with the commit that moves
    /// the appends made so far.
    pub(super) fn note_seq(&self, source: &Arc<str>, next: u64) {
        let mut p = self.pending();
        let serial = p.serial;
        p.seq_notes.insert(source.clone(), (next, serial));
    }

    /// The sequence notes not yet in sled go there now, ahead of their data, and sled is flushed
    /// (after a failed data sync in `on-outage` mode: the jump's base keeps up with publishing).
    pub(super) fn write_seq_notes_now(&self) -> sled::Result<()> {
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
                .insert(seq_note_key(source), &next.to_le_bytes()[..]);
        }
        self.db.flush().map(drop)
    }

    /// What the index has of a source's numbering: the durable note, the sequence after the
    /// highest committed record (0: none), and the highest of the pending note and the sequence
    /// after the highest pending record.
    pub(super) fn numbering(
        &self,
        source: &Arc<str>,
    ) -> Result<(Option<u64>, u64, u64), SpoolError> {
        let pending = {
            let p = self.pending();
            let note = p.seq_notes.get(source).map(|n| n.0).unwrap_or(0);
            let last = p
                .entries
                .get(source)
                .and_then(|m| m.keys().next_back())
                .map(|s| s + 1)
                .unwrap_or(0);
            note.max(last)
        };
        Ok((self.noted_seq(source)?, self.stored_seq(source)?, pending))
    }

    /// The sequence after a source's highest committed record (0: none).
    pub(super) fn stored_seq(&self, source: &Arc<str>) -> Result<u64, SpoolError> {
        Ok(self.last_committed(source)?.map_or(0, |s| s + 1))
    }

    /// An appended record's entry, pending until a commit moves it to sled. The caller holds
    /// the segments' lock, so that a commit's watermark covers exactly the written appends.
    pub(super) fn add(&self, source: &Arc<str>, seq: u64, loc: Location) {
        let mut p = self.pending();
        let serial = p.serial;
        p.serial += 1;
        p.highest
            .entry(source.clone())
            .and_modify(|h| *h = (*h).max(seq))
            .or_insert(seq);
        p.entries
            .entry(source.clone())
            .or_default()
            .insert(seq, (loc, serial));
    }

    /// The serial the next append takes: a commit moves what was appended below it.
    pub(super) fn serial(&self) -> u64 {
        self.pending().serial
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

    /// Up to `max` entries of a source with `seq >= from`: those not yet committed and those in
    /// sled, each side in order and cut at `max`, read at one moment (under the pending lock, so
    /// a commit cannot move an entry between them).
    pub(super) fn entries_from(
        &self,
        source: &Arc<str>,
        from: u64,
        max: usize,
    ) -> Result<(pages::Page, pages::Page), SpoolError> {
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
        Ok((uncommitted, self.committed_from(&p, source, from, max)?))
    }

    /// Takes every entry of a source out of the index (committed or not); returns them.
    pub(super) fn clear(&self, source: &Arc<str>) -> Result<Vec<(u64, Location)>, SpoolError> {
        let tree = self.tree(source)?;
        let mut gone = Vec::new();
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
        Ok(gone)
    }

    /// The records the index lists in segment `id` (committed or not, not removed). None when a
    /// page does not decode: the index cannot say what the segment holds (the next start
    /// rebuilds it).
    pub(super) fn in_segment(&self, id: u64) -> Result<Option<Vec<Named>>, SpoolError> {
        let mut victims: Vec<Named> = Vec::new();
        // Under the pending lock, so a commit cannot move entries from it to sled meanwhile.
        let p = self.pending();
        for (source, m) in &p.entries {
            victims.extend(
                m.iter()
                    .filter(|(_, (loc, _))| loc.segment == id)
                    .map(|(seq, _)| (source.clone(), *seq)),
            );
        }
        for source in self.sources() {
            let removed = p.removed.get(&source);
            for item in self.tree(&source)?.iter() {
                let (k, v) = item.map_err(self.ix())?;
                let Some(page) = pages::decode(key_seq(&k), &v) else {
                    tracing::error!(source = %source, segment = id, "spool: an index page does not decode; the oldest segment is kept");
                    self.ask_rebuild()?;
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
        Ok(Some(victims))
    }

    /// Takes out the entries not yet committed of records in segment `id` past byte `flushed`
    /// (they never reached the file); returns them.
    pub(super) fn take_unwritten(&self, id: u64, flushed: u64) -> Vec<(Arc<str>, u64, Location)> {
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
    }

    /// The removals so far go to sled and are flushed now (before the segment they emptied is
    /// deleted to make room).
    pub(super) fn apply_removals_now(&self) -> Result<(), SpoolError> {
        {
            let mut p = self.pending();
            self.apply_removals(&mut p)?;
            p.stale_oldest.clear();
        }
        self.flush()
    }

    /// A group commit's index part, once the data of appends below `watermark` is synced: the
    /// removals, then the entries and sequence notes of those appends, then the ledger (`due`:
    /// segment -> length now synced and indexed) go to sled, which is flushed. Returns the
    /// sources whose oldest capture time may have moved.
    pub(super) fn commit(
        &self,
        watermark: u64,
        due: &BTreeMap<u64, u64>,
    ) -> Result<HashSet<Arc<str>>, SpoolError> {
        let stale = {
            let mut p = self.pending();
            self.apply_removals(&mut p)?;
            self.apply_pending(&mut p, watermark)?;
            // The ledger follows the entries: these bytes are synced and their entries in sled.
            let mut batch = sled::Batch::default();
            for (id, len) in due {
                batch.insert(ledger::key(*id).as_bytes(), &len.to_le_bytes()[..]);
            }
            self.meta.apply_batch(batch).map_err(self.ix())?;
            std::mem::take(&mut p.stale_oldest)
        };
        self.flush()?;
        Ok(stale)
    }

    /// Writes entries of a source (increasing seq, possibly already stored: the new location
    /// wins) into its pages: merged into the page whose range holds them, else new pages.
    pub(super) fn store_entries(
        &self,
        source: &Arc<str>,
        entries: &[(u64, Location)],
    ) -> Result<(), SpoolError> {
        let tree = self.tree(source)?;
        let tree = &tree;
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

    /// A source's tree of pages.
    pub(super) fn tree(&self, source: &Arc<str>) -> Result<sled::Tree, SpoolError> {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = trees.get(source) {
            return Ok(t.clone());
        }
        let t = self
            .db
            .open_tree(format!("i:{source}"))
            .map_err(self.ix())?;
        trees.insert(source.clone(), t.clone());
        Ok(t)
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
            self.store_entries(&source, &moved)?;
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
        if !notes.is_empty() {
            p.notes_written = Some(std::time::Instant::now());
        }
        for (source, next) in notes {
            self.set_seq_note(&source, next)?;
            p.seq_notes.remove(&source);
        }
        Ok(())
    }

    /// Nothing for a commit to move to sled: no appended or removed record pending, and sequence
    /// notes, if any, younger than `notes_every` since the last were written.
    pub(super) fn idle(&self, notes_every: std::time::Duration) -> bool {
        let p = self.pending();
        p.entries.values().all(BTreeMap::is_empty)
            && p.removed.values().all(BTreeSet::is_empty)
            && p.stale_oldest.is_empty()
            && (p.seq_notes.is_empty()
                || p.notes_written.is_some_and(|t| t.elapsed() < notes_every))
    }

    /// Up to `max` committed entries of a source with `seq >= from`, in order, leaving out those
    /// removed since the last commit (`p`: the pending state the caller holds locked). A page
    /// that does not decode is set aside (see [`Index::bad_page`]).
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
        self.ask_rebuild()?;
        // Its records are still in their segments (kept: their segments still count them) and
        // still counted as stored; they are listed again by the rebuild.
        self.note_damage(format!(
            "an index page of {source} does not decode; its records stay in the segments and are listed again when the next start rebuilds the index"
        ));
        Ok(())
    }

    /// The location of a source's oldest record, committed or not.
    pub(super) fn oldest(&self, source: &Arc<str>) -> Result<Option<Location>, SpoolError> {
        let (pending_first, committed_first) = {
            let p = self.pending();
            let pending_first = p
                .entries
                .get(source)
                .and_then(|m| m.first_key_value().map(|(s, (l, _))| (*s, *l)));
            let committed_first = self.committed_from(&p, source, 0, 1)?.first().copied();
            (pending_first, committed_first)
        };
        Ok(match (pending_first, committed_first) {
            (Some(a), Some(b)) => Some(if a.0 < b.0 { a.1 } else { b.1 }),
            (a, b) => a.or(b).map(|x| x.1),
        })
    }

    /// Walks a source's pages in order for the count at open: `keep` takes each page's entries
    /// and returns those that stay (a page whose entries did not all stay is written back, or
    /// removed when none did). Stops at a page that does not decode and returns false.
    pub(super) fn retain(
        &self,
        source: &Arc<str>,
        mut keep: impl FnMut(pages::Page) -> pages::Page,
    ) -> Result<bool, SpoolError> {
        let tree = self.tree(source)?;
        let mut rewrites = Vec::new();
        let mut decoded = true;
        for item in tree.iter() {
            let (k, v) = item.map_err(self.ix())?;
            let Some(page) = pages::decode(key_seq(&k), &v) else {
                decoded = false;
                break;
            };
            let live = page.len();
            let kept = keep(page);
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
        Ok(decoded)
    }

    /// Writes ledger entries (segment -> covered length), removes those of `gone` segments and
    /// marks the spool as keeping a ledger. Reaches disk with the next sled flush.
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

    /// The ledger forgets deleted segments, durably (once their deletion is durable).
    pub(super) fn forget_segments(&self, ids: &[u64]) -> sled::Result<()> {
        let mut batch = sled::Batch::default();
        for id in ids {
            batch.remove(ledger::key(*id).as_bytes());
        }
        self.meta
            .apply_batch(batch)
            .and_then(|()| self.db.flush().map(drop))
    }

    /// Forgets every record location and the ledger (before a rebuild from the segments).
    pub(super) fn forget_locations(&self) -> Result<(), SpoolError> {
        for name in self.db.tree_names() {
            if name.starts_with(b"i:") {
                self.db.drop_tree(&name).map_err(self.ix())?;
            }
        }
        let mut stale = sled::Batch::default();
        for item in self.meta.scan_prefix("seg:") {
            let (k, _) = item.map_err(self.ix())?;
            stale.remove(k);
        }
        self.meta.apply_batch(stale).map_err(self.ix())?;
        self.trees.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
    }

    /// A value of `meta` (recall's notes, [`super::held`]).
    pub(super) fn meta_get(&self, key: &str) -> Result<Option<sled::IVec>, SpoolError> {
        self.meta.get(key).map_err(self.ix())
    }

    /// Raises the i64 (little-endian) at `key` of `meta` to `value`, never lowers it: one
    /// compare-and-swap loop of sled's, so two callers at once keep the higher.
    pub(super) fn meta_raise(&self, key: &str, value: i64) -> Result<(), SpoolError> {
        self.meta
            .fetch_and_update(key, |old| {
                let old = old
                    .and_then(|v| <[u8; 8]>::try_from(v).ok())
                    .map(i64::from_le_bytes);
                Some(old.map_or(value, |o| o.max(value)).to_le_bytes().to_vec())
            })
            .map(drop)
            .map_err(self.ix())
    }

    /// A tree of the index's database by name (not a source's: those are `i:{source}`).
    pub(super) fn open_tree(&self, name: &str) -> Result<sled::Tree, SpoolError> {
        self.db.open_tree(name).map_err(self.ix())
    }

    /// `meta`, for tests that look at what a crash would find.
    #[cfg(test)]
    pub(super) fn meta(&self) -> &sled::Tree {
        &self.meta
    }
}
