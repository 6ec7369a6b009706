//! The sequence floor: per source, a number that no sequence this spool has handed out reaches,
//! kept in `SEQ` at the spool's root, outside the index.
//!
//! The index's sequence notes say where numbering goes on, but the index is a cache: removed,
//! zeroed or rebuilt, it no longer knows the numbers of frames that were published and whose
//! segments were deleted since. Numbering again from what the segments hold would reuse those
//! numbers, and the broker's deduplication would drop every such frame as a duplicate: silent
//! loss. So the spool reserves numbers ahead, durably, in a file of its own (hi-lo): the floor is
//! moved [`STEP`] past the next number before frames get within `STEP / 2` of it, and a frame is
//! numbered only below a durable floor. After index damage, numbering resumes at the floor.
//!
//! The file is written to `SEQ.tmp`, fsynced, renamed over `SEQ` and the directory fsynced, so a
//! power cut leaves the old floors or the new ones, both valid. A `SEQ` that does not parse is
//! ignored (logged) and rewritten at the next reservation.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Spool, SpoolError, CRASH_SEQ_MARGIN};

pub const FILE: &str = "SEQ";

/// How far ahead of the next number a reservation reaches: at 1 kHz, a write every ~9 minutes.
pub const STEP: u64 = CRASH_SEQ_MARGIN;

/// After a failed write of `SEQ` (a full disk), the next attempt waits this long.
const RETRY: Duration = Duration::from_secs(1);

/// The floors in memory, as last written (or read).
#[derive(Default)]
pub(super) struct Floors {
    pub(super) reserved: BTreeMap<Arc<str>, u64>,
    pub(super) failed_at: Option<Instant>,
}

/// Reads `SEQ` from a spool directory: source -> floor (empty when absent; `Err` when it does not
/// parse).
pub fn read(dir: &Path) -> Result<BTreeMap<String, u64>, String> {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    decode(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `SEQ`'s format: a header line, then one `floor<TAB>source` line per source (a source id
/// holds no tab or newline: config refuses them).
fn encode(floors: &BTreeMap<Arc<str>, u64>) -> String {
    let mut out = String::from("rigd-seq-floor 1\n");
    for (source, floor) in floors {
        out.push_str(&format!("{floor}\t{source}\n"));
    }
    out
}

fn decode(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut lines = text.lines();
    if lines.next() != Some("rigd-seq-floor 1") {
        return Err("not a sequence floor file (header)".into());
    }
    let mut out = BTreeMap::new();
    for (n, line) in lines.enumerate() {
        let (floor, source) = line
            .split_once('\t')
            .ok_or_else(|| format!("line {}: no tab", n + 2))?;
        let floor = floor
            .parse::<u64>()
            .map_err(|e| format!("line {}: {e}", n + 2))?;
        out.insert(source.to_string(), floor);
    }
    Ok(out)
}

impl Spool {
    /// Makes sure every number below `next + STEP / 2` of `source` is under its durable floor,
    /// moving the floor to `next + STEP` (one file write) when it is not. Called with each
    /// source's next number before the frame that takes it can be published.
    pub(super) fn reserve_seq(&self, source: &Arc<str>, next: u64) -> Result<(), SpoolError> {
        let mut f = self.floors.lock().unwrap_or_else(|p| p.into_inner());
        let floor = f.reserved.get(source).copied().unwrap_or(0);
        if next.saturating_add(STEP / 2) < floor {
            return Ok(());
        }
        if f.failed_at.is_some_and(|t| t.elapsed() < RETRY) {
            return Ok(());
        }
        let mut new = f.reserved.clone();
        new.insert(source.clone(), next.saturating_add(STEP));
        match super::disk::replace_file(&self.path, FILE, encode(&new).as_bytes()) {
            Ok(()) => {
                f.reserved = new;
                f.failed_at = None;
                Ok(())
            }
            Err(e) => {
                f.failed_at = Some(Instant::now());
                Err(self.io("write the sequence floor (SEQ)")(e))
            }
        }
    }

    /// The durable floor of a source (0: none recorded).
    pub(super) fn floor(&self, source: &Arc<str>) -> u64 {
        let f = self.floors.lock().unwrap_or_else(|p| p.into_inner());
        f.reserved.get(source).copied().unwrap_or(0)
    }

    /// At open: the floors from `SEQ`. `index_lost`: the index was blank or rebuilt, so its
    /// notes may be behind what was handed out; every source resumes at least at its floor.
    pub(super) fn load_floors(&self, index_lost: bool) -> Result<(), SpoolError> {
        let floors = match read(&self.path) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(spool = %self.path.display(), error = %e,
                    "spool: the sequence floor does not parse; ignored, rewritten at the next reservation");
                BTreeMap::new()
            }
        };
        let mut raised = 0;
        for (source, floor) in &floors {
            let source: Arc<str> = source.as_str().into();
            if index_lost && self.noted_seq(&source)?.is_none_or(|n| n < *floor) {
                self.meta
                    .insert(format!("seq:{source}"), &floor.to_le_bytes()[..])
                    .map_err(self.ix())?;
                raised += 1;
            }
        }
        if raised > 0 {
            self.index.flush().map_err(self.ix())?;
            tracing::warn!(spool = %self.path.display(), sources = raised,
                "spool: the index did not know where numbering had got to; sequence numbers resume at the floor in SEQ");
        }
        let mut f = self.floors.lock().unwrap_or_else(|p| p.into_inner());
        f.reserved = floors
            .into_iter()
            .map(|(s, n)| (Arc::from(s.as_str()), n))
            .collect();
        Ok(())
    }
}
