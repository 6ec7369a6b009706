//! `rigd spool stat` and `rigd spool verify`: what a spool holds, and whether every record of it
//! reads back intact.

use serde::Serialize;
use std::io::Write;
use std::path::Path;

use super::ReplayError;
use crate::civil as time;
use crate::progress::{Interrupt, Progress};
use crate::spool::snapshot::{Corrupt, Listing, SpoolSnapshot};

#[derive(Debug, Clone, Serialize)]
pub struct SourceStat {
    pub id: String,
    pub records: u64,
    pub bytes: u64,
    pub first_capture_ns: Option<i64>,
    pub last_capture_ns: Option<i64>,
}

/// The `--json` object of `stat` (and the head of `verify`'s).
#[derive(Debug, Clone, Serialize)]
pub struct Stat {
    pub spool: String,
    /// The rig the spool belongs to (`rig`, `bucket-ms`, `topic`), as the daemon recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rig: Option<crate::spool::identity::RigIdentity>,
    /// Why the `RIG` file that is there could not be used (damaged, unreadable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rig_damage: Option<String>,
    /// `index`, or `segment-scan` when the records were found by reading the segments.
    pub listing: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listing_note: Option<String>,
    pub sources: Vec<SourceStat>,
    /// Records the daemon already set aside in `quarantine/`.
    pub quarantined: u64,
    /// Why the index could not be used as it is (missing, unreadable, not covering the segments):
    /// the records were listed from the segments, as the daemon's next start rebuilds them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_damage: Option<String>,
    /// Records the index did not list yet (a crash before their commit), read from the segments.
    pub read_back: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verify {
    #[serde(flatten)]
    pub stat: Stat,
    pub records_checked: u64,
    pub bytes_checked: u64,
    /// Records that failed to read back (checksum, truncation, missing segment).
    pub corrupt: Vec<Corrupt>,
    pub interrupted: bool,
    pub ok: bool,
}

pub fn stat(snap: &SpoolSnapshot) -> Stat {
    let (listing, listing_note) = match snap.listing() {
        Listing::Index => ("index", None),
        Listing::SegmentScan { reason } => ("segment-scan", Some(reason.clone())),
    };
    Stat {
        spool: snap.path().display().to_string(),
        rig: snap.identity().ok().flatten().cloned(),
        rig_damage: snap.identity().err().map(str::to_string),
        listing,
        listing_note,
        sources: snap
            .sources()
            .map(|(id, entries)| SourceStat {
                id: id.to_string(),
                records: entries.len() as u64,
                bytes: entries.iter().map(|e| e.len as u64).sum(),
                first_capture_ns: entries.iter().map(|e| e.capture_ns).min(),
                last_capture_ns: entries.iter().map(|e| e.capture_ns).max(),
            })
            .collect(),
        quarantined: snap.quarantined(),
        index_damage: snap.index_damage().map(str::to_string),
        read_back: snap.read_back(),
    }
}

/// Reads every listed record and checks it. A segment this user may no longer open is the
/// error (a permission problem, not damage).
pub fn verify(snap: &SpoolSnapshot, interrupt: &Interrupt) -> Result<Verify, ReplayError> {
    let stat = stat(snap);
    let total: u64 = stat.sources.iter().map(|s| s.bytes).sum();
    let progress = Progress::new(total, "verify");
    let mut corrupt: Vec<Corrupt> = snap.listing_corrupt().to_vec();
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut interrupted = false;
    'all: for (source, entries) in snap.sources() {
        for e in entries {
            if interrupt.is_set() {
                interrupted = true;
                break 'all;
            }
            if let Err(err) = snap.read(source, e) {
                let c = super::damage(err).inspect_err(|_| progress.finish())?;
                progress.println(&format!("corrupt: {}", describe(&c)));
                corrupt.push(c);
            }
            records += 1;
            bytes += e.len as u64;
            progress.inc(e.len as u64);
        }
    }
    progress.finish();
    // A damaged index is damage even when every record reads back: it was worked around.
    let ok = corrupt.is_empty() && !interrupted && stat.index_damage.is_none();
    Ok(Verify {
        stat,
        records_checked: records,
        bytes_checked: bytes,
        corrupt,
        interrupted,
        ok,
    })
}

pub fn describe(c: &Corrupt) -> String {
    let what = match (&c.source, c.seq) {
        (Some(s), Some(q)) => format!("{s}/{q}"),
        _ => "unattributed bytes".to_string(),
    };
    format!(
        "{what} (segment {:016x}, offset {}): {}",
        c.segment, c.offset, c.reason
    )
}

fn human_bytes(b: u64) -> String {
    crate::config::ByteSize(b).human()
}

/// The human table of `stat`.
pub fn print_stat(out: &mut impl Write, s: &Stat) -> std::io::Result<()> {
    let records: u64 = s.sources.iter().map(|x| x.records).sum();
    let bytes: u64 = s.sources.iter().map(|x| x.bytes).sum();
    writeln!(
        out,
        "spool {}: {} sources, {records} records, {}, {} quarantined",
        s.spool,
        s.sources.len(),
        human_bytes(bytes),
        s.quarantined
    )?;
    match (&s.rig, &s.rig_damage) {
        (Some(r), _) => writeln!(
            out,
            "rig {} (bucket {} ms, topic {})",
            r.rig, r.bucket_ms, r.topic
        )?,
        (None, Some(why)) => writeln!(
            out,
            "rig: unknown: {why}; the records do not depend on it. To republish, say the rig with \
             --rig (and --topic, --bucket-ms if not the defaults); rigd writes the file again at \
             its next start on this spool"
        )?,
        (None, None) => writeln!(
            out,
            "rig: not recorded in the spool (no RIG file: a spool from before rigd recorded it)"
        )?,
    }
    if let Some(damage) = &s.index_damage {
        writeln!(
            out,
            "index damaged: {damage}; records listed from the segments (rigd rebuilds the index at its next start)"
        )?;
    } else if let Some(note) = &s.listing_note {
        writeln!(out, "records listed by a segment scan: {note}")?;
    }
    if s.read_back > 0 {
        writeln!(
            out,
            "{} records after the index's last commit (the last run ended before committing them), read from the segments",
            s.read_back
        )?;
    }
    let w = s
        .sources
        .iter()
        .map(|x| x.id.len())
        .max()
        .unwrap_or(6)
        .max(6);
    writeln!(
        out,
        "{:<w$}  {:>9}  {:>10}  {:<30}  {:<30}",
        "source", "records", "bytes", "first capture", "last capture"
    )?;
    for x in &s.sources {
        let t = |v: Option<i64>| v.map(time::format).unwrap_or_else(|| "-".into());
        writeln!(
            out,
            "{:<w$}  {:>9}  {:>10}  {:<30}  {:<30}",
            x.id,
            x.records,
            human_bytes(x.bytes),
            t(x.first_capture_ns),
            t(x.last_capture_ns)
        )?;
    }
    Ok(())
}

pub fn print_verify(out: &mut impl Write, v: &Verify) -> std::io::Result<()> {
    print_stat(out, &v.stat)?;
    writeln!(
        out,
        "verify: {} records ({}) read back, {} corrupt{}",
        v.records_checked,
        human_bytes(v.bytes_checked),
        v.corrupt.len(),
        if v.interrupted { ", interrupted" } else { "" }
    )?;
    for c in &v.corrupt {
        writeln!(out, "  corrupt: {}", describe(c))?;
    }
    if v.stat.index_damage.is_some() {
        writeln!(
            out,
            "verify: FAILED: the index is damaged (see above; exit 1); rigd rebuilds it from the segments at its next start on this spool"
        )?;
    }
    Ok(())
}

/// Opens a spool for an offline tool, turning the refusals into [`ReplayError`]s.
pub fn open(dir: &Path, scan: bool) -> Result<SpoolSnapshot, ReplayError> {
    SpoolSnapshot::open(dir, scan).map_err(ReplayError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_like_a_human_wrote_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
