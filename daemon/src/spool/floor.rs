//! The sequence floor: per source, a number that no sequence this spool has handed out reaches,
//! kept in `SEQ` at the spool's root, outside the index.
//!
//! The index's sequence notes say where numbering goes on, but the index is a cache: removed,
//! zeroed or rebuilt, it no longer knows the numbers of frames that were published and whose
//! segments were deleted since. Numbering again from what the segments hold would reuse those
//! numbers, and the broker's deduplication would drop every such frame as a duplicate: silent
//! loss. So the spool reserves numbers ahead, durably, in a file of its own (hi-lo): the floor is
//! moved [`STEP`] past the next number before frames get within `STEP / 2` of it, and a frame is
//! numbered only below a durable floor ([`super::Spool::admit_seq`]: a frame past it is dropped,
//! counted).
//! After index damage, numbering resumes at the floor.
//!
//! The file holds two slots of equal size, written in place in turn (the LMDB meta-page way):
//! each slot is a header line `rigd-seq-floor 2 <generation> <crc32c> <length>` and that many
//! bytes of `floor<TAB>source` lines, zero-padded. A reservation overwrites the older slot and
//! fdatasyncs; a power cut mid-write tears that slot only, whose checksum then fails, and the
//! reader takes the other. Overwriting blocks the file already has needs no free space, so the
//! floor moves on a full disk (issue 31.3: after a crash, rigd starts and captures there). The
//! file is created (or grown, or converted from version 1, a single text slot) by the atomic
//! replace of [`super::disk::replace_file_on`]; while that fails, the floor stays where it is.
//! Every write goes through the spool's [`Disk`].

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::disk::{replace_file_on, write_all_at, Disk};
use super::{SpoolError, CRASH_SEQ_MARGIN};

pub const FILE: &str = "SEQ";

/// How far ahead of the next number a reservation reaches: at 1 kHz, a write every ~9 minutes.
pub const STEP: u64 = CRASH_SEQ_MARGIN;

/// After a failed write of `SEQ`, the next attempt waits this long.
const RETRY: Duration = Duration::from_secs(1);

/// The smallest slot, and the unit slots grow by.
const SLOT: usize = 4096;

const HEADER_V1: &str = "rigd-seq-floor 1";
const HEADER_V2: &str = "rigd-seq-floor 2 ";

/// The floors in memory, as last made durable (or read).
#[derive(Default)]
struct Floors {
    reserved: BTreeMap<Arc<str>, u64>,
    /// When the last write failed, while it has not succeeded since.
    failed_at: Option<Instant>,
    /// `SEQ` (version 2) open for in-place writes, and its slot size.
    slots: Option<(File, usize)>,
    /// The generation of the slot written last.
    generation: u64,
}

/// Reads `SEQ` from a spool directory: source -> floor (empty when absent; `Err` when it does not
/// parse).
pub fn read(dir: &Path) -> Result<BTreeMap<String, u64>, String> {
    read_slots(&super::disk::Os, dir).map(|(floors, _, _)| floors)
}

/// The floors, the generation they were written with and the slot size (0: not version 2).
fn read_slots(disk: &dyn Disk, dir: &Path) -> Result<(BTreeMap<String, u64>, u64, usize), String> {
    let path = dir.join(FILE);
    let bytes = match disk.read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((BTreeMap::new(), 0, 0)),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn decode(bytes: &[u8]) -> Result<(BTreeMap<String, u64>, u64, usize), String> {
    if !bytes.starts_with(HEADER_V1.as_bytes()) {
        if bytes.is_empty() || bytes.len() % (2 * SLOT) != 0 {
            return Err(format!("{} bytes: not two slots", bytes.len()));
        }
        let slot = bytes.len() / 2;
        let mut best: Option<(u64, BTreeMap<String, u64>)> = None;
        let mut why = Vec::new();
        for (i, s) in bytes.chunks(slot).enumerate() {
            match decode_slot(s) {
                Ok((g, floors)) => {
                    if best.as_ref().is_none_or(|(b, _)| g > *b) {
                        best = Some((g, floors));
                    }
                }
                Err(e) => why.push(format!("slot {i}: {e}")),
            }
        }
        let (generation, floors) = best.ok_or_else(|| why.join("; "))?;
        return Ok((floors, generation, slot));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    let mut lines = text.lines();
    if lines.next() != Some(HEADER_V1) {
        return Err("not a sequence floor file (header)".into());
    }
    Ok((decode_lines(lines)?, 0, 0))
}

/// One slot: `(generation, floors)`.
fn decode_slot(slot: &[u8]) -> Result<(u64, BTreeMap<String, u64>), String> {
    let end = slot
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no header line")?;
    let header = std::str::from_utf8(&slot[..end]).map_err(|_| "header not text")?;
    let fields: Vec<&str> = header
        .strip_prefix(HEADER_V2)
        .ok_or("no header")?
        .split(' ')
        .collect();
    let [generation, crc, len] = fields[..] else {
        return Err("header fields".into());
    };
    let generation: u64 = generation.parse().map_err(|_| "generation")?;
    let crc = u32::from_str_radix(crc, 16).map_err(|_| "checksum field")?;
    let len: usize = len.parse().map_err(|_| "length")?;
    let body = slot
        .get(end + 1..end + 1 + len)
        .ok_or("length past the slot")?;
    if crc32c::crc32c(body) != crc {
        return Err("checksum (a torn write)".into());
    }
    let text = std::str::from_utf8(body).map_err(|_| "body not text")?;
    Ok((generation, decode_lines(text.lines())?))
}

/// `floor<TAB>source` lines (a source id holds no tab or newline: config refuses them).
fn decode_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in lines.enumerate() {
        let (floor, source) = line
            .split_once('\t')
            .ok_or_else(|| format!("line {}: no tab", n + 1))?;
        let floor = floor
            .parse::<u64>()
            .map_err(|e| format!("line {}: {e}", n + 1))?;
        out.insert(source.to_string(), floor);
    }
    Ok(out)
}

/// A slot's bytes, `slot` long; None when the floors do not fit in it.
fn encode_slot(generation: u64, floors: &BTreeMap<Arc<str>, u64>, slot: usize) -> Option<Vec<u8>> {
    let mut body = String::new();
    for (source, floor) in floors {
        body.push_str(&format!("{floor}\t{source}\n"));
    }
    let crc = crc32c::crc32c(body.as_bytes());
    let mut out = format!("{HEADER_V2}{generation} {crc:08x} {}\n{body}", body.len()).into_bytes();
    if out.len() > slot {
        return None;
    }
    out.resize(slot, 0);
    Some(out)
}

/// `SEQ` as read at open, before [`Floor::install`] takes it.
pub(super) struct Loaded {
    pub(super) floors: BTreeMap<Arc<str>, u64>,
    generation: u64,
    slot: usize,
}

/// The sequence floor of a spool: the floors as last made durable, and `SEQ` open for writes.
pub(super) struct Floor {
    root: PathBuf,
    disk: Arc<dyn Disk>,
    state: Mutex<Floors>,
}

impl Floor {
    pub(super) fn new(root: &Path, disk: Arc<dyn Disk>) -> Self {
        Floor {
            root: root.to_path_buf(),
            disk,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, Floors> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn io(&self, op: &'static str) -> impl Fn(std::io::Error) -> SpoolError + '_ {
        move |source| SpoolError::Io {
            path: self.root.clone(),
            op,
            source,
        }
    }

    /// Makes sure every number below `next + STEP / 2` of `source` is under its durable floor,
    /// moving the floor to `next + STEP` (one write) when it is not. Called with each source's
    /// next number before the frame that takes it can be published. Ok when `next` is below
    /// the durable floor, whether or not a due write succeeded; Err (the write's error) when it
    /// is not: the frame that would take `next` must not be numbered
    /// ([`super::Spool::admit_seq`]).
    /// Whether [`Floor::reserve`] for `next` would write `SEQ` (every `STEP / 2` numbers, or
    /// while an earlier write failed): otherwise it only reads memory.
    pub(super) fn due(&self, source: &Arc<str>, next: u64) -> bool {
        let f = self.state();
        let floor = f.reserved.get(source).copied().unwrap_or(0);
        next.saturating_add(STEP / 2) >= floor
    }

    pub(super) fn reserve(&self, source: &Arc<str>, next: u64) -> Result<(), SpoolError> {
        let mut f = self.state();
        let floor = f.reserved.get(source).copied().unwrap_or(0);
        if next.saturating_add(STEP / 2) < floor {
            return Ok(());
        }
        let gate = |floor: u64, e: Option<std::io::Error>| {
            if next < floor {
                Ok(())
            } else {
                let e = e.unwrap_or_else(|| {
                    std::io::Error::other("an earlier write failed; retried within a second")
                });
                Err(self.io("write the sequence floor (SEQ)")(e))
            }
        };
        if f.failed_at.is_some_and(|t| t.elapsed() < RETRY) {
            return gate(floor, None);
        }
        let mut new = f.reserved.clone();
        new.insert(source.clone(), next.saturating_add(STEP));
        match self.write(&mut f, &new) {
            Ok(()) => {
                if f.failed_at.take().is_some() {
                    tracing::info!(spool = %self.root.display(),
                        "spool: the sequence floor (SEQ) is written again; numbering goes on");
                }
                f.reserved = new;
                Ok(())
            }
            Err(e) => {
                if f.failed_at.is_none() {
                    tracing::error!(spool = %self.root.display(), error = %e, source = %source, floor,
                        "spool: cannot move the sequence floor (SEQ); frames are numbered up to it, past it they are dropped (counted) until it can be written");
                }
                f.failed_at = Some(Instant::now());
                gate(floor, Some(e))
            }
        }
    }

    /// One durable write of the floors: in place into the older slot when `SEQ` is version 2
    /// and they fit, else a new file by atomic replace.
    fn write(&self, f: &mut Floors, floors: &BTreeMap<Arc<str>, u64>) -> std::io::Result<()> {
        let generation = f.generation + 1;
        let at = |slot: usize| (generation % 2) * slot as u64;
        if let Some((file, slot)) = &f.slots {
            if let Some(bytes) = encode_slot(generation, floors, *slot) {
                write_all_at(self.disk.as_ref(), file, &bytes, at(*slot))?;
                self.disk.sync_data(file)?;
                f.generation = generation;
                return Ok(());
            }
        }
        // Room for twice what is there now, so that new sources rarely need a new file.
        let mut slot = SLOT;
        let fits = |slot| encode_slot(generation, floors, slot);
        while fits(slot / 2).is_none() {
            slot *= 2;
        }
        let mut bytes = vec![0; 2 * slot];
        let s = fits(slot).expect("sized to fit");
        let start = at(slot) as usize;
        bytes[start..start + slot].copy_from_slice(&s);
        replace_file_on(self.disk.as_ref(), &self.root, FILE, &bytes).map_err(|e| e.source)?;
        let file = self.disk.open_rw(&self.root.join(FILE))?;
        f.slots = Some((file, slot));
        f.generation = generation;
        Ok(())
    }

    /// The durable floor of a source (0: none recorded).
    pub(super) fn get(&self, source: &Arc<str>) -> u64 {
        self.state().reserved.get(source).copied().unwrap_or(0)
    }

    /// The sources that have a floor.
    pub(super) fn sources(&self) -> Vec<Arc<str>> {
        self.state().reserved.keys().cloned().collect()
    }

    /// At open: the floors in `SEQ` (none when it does not parse: logged, and rewritten at the
    /// next reservation).
    pub(super) fn read(&self) -> Loaded {
        let (floors, generation, slot) = match read_slots(self.disk.as_ref(), &self.root) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(spool = %self.root.display(), error = %e,
                    "spool: the sequence floor does not parse; ignored, rewritten at the next reservation");
                (BTreeMap::new(), 0, 0)
            }
        };
        Loaded {
            floors: floors
                .into_iter()
                .map(|(s, n)| (Arc::from(s.as_str()), n))
                .collect(),
            generation,
            slot,
        }
    }

    /// At open, after [`Floor::read`]: the floors in force. A `SEQ` that is absent or of
    /// version 1 is written as version 2 now, while there may still be room for it (failing
    /// that, at the next reservation).
    pub(super) fn install(&self, loaded: Loaded) {
        let mut f = self.state();
        f.reserved = loaded.floors;
        f.generation = loaded.generation;
        let file = (loaded.slot > 0)
            .then(|| self.disk.open_rw(&self.root.join(FILE)))
            .transpose();
        match file {
            Ok(Some(file)) => f.slots = Some((file, loaded.slot)),
            Ok(None) => {
                let floors = f.reserved.clone();
                if let Err(e) = self.write(&mut f, &floors) {
                    tracing::warn!(spool = %self.root.display(), error = %e,
                        "spool: cannot write the sequence floor (SEQ) yet; tried again at the next reservation");
                }
            }
            Err(e) => {
                tracing::warn!(spool = %self.root.display(), error = %e,
                    "spool: cannot open the sequence floor (SEQ) for writing; it is replaced at the next reservation");
            }
        }
    }
}
