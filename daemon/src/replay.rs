//! The offline tools: inspect a spool ([`inspect`]), export it to files ([`files`]) or to one MCAP
//! file ([`mcap`]), or republish it to Pulsar ([`republish`]). They read the spool through
//! [`SpoolSnapshot`], which never writes to it.
//!
//! Corrupt records are skipped and reported, never fatal; an interrupt (Ctrl-C) stops at the next
//! record and still closes every output properly (a WAV header patched, an MCAP footer written).

pub mod files;
pub mod inspect;
pub mod mcap;
pub mod republish;

use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::spool::snapshot::{Corrupt, Entry, ReadError, SpoolSnapshot};
use crate::spool::SpoolError;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("the spool has no source {name:?} (it has: {have})")]
    UnknownSource { name: String, have: String },
    #[error("--from ({from}) must be before --to ({to})")]
    EmptyRange { from: String, to: String },
    #[error("{path}: {op}: {source}")]
    Output {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: mcap: {source}")]
    Mcap {
        path: PathBuf,
        source: ::mcap::McapError,
    },
    #[error("{path} exists; say --force to overwrite it")]
    OutputExists { path: PathBuf },
    #[error(
        "--out {path}: a file is there, and --out names a directory (one file per camera frame, \
         one per audio or serial source): give a new or empty directory, or --mcap FILE for one file"
    )]
    OutputNotDirectory { path: PathBuf },
    #[error(
        "--out {path} is not empty (it holds {holds}): the export would mix with what is there; \
         give a new or empty directory, or --force to write into it (files of the same name are \
         replaced, the others stay)"
    )]
    OutputNotEmpty { path: PathBuf, holds: String },
    #[error("{path}: {why}")]
    Unsupported { path: PathBuf, why: String },
    #[error("pulsar {url}: {why}")]
    Pulsar { url: String, why: String },
    #[error("{path}: the rig is unknown ({why}); say it with --rig (and --topic, --bucket-ms if the rig did not use the defaults)")]
    NoRig { path: PathBuf, why: String },
    #[error(
        "{name}/{seq} is encrypted for the fleet key: exporting needs --decrypt-key FILE (the \
         fleet's private key); stat, verify and --pulsar work without it"
    )]
    Encrypted { name: String, seq: u64 },
}

/// A spooled frame as it was captured: a sealed frame is opened with the fleet's private key
/// (`Ok(Err(why))`: it does not decrypt, skip it), and without a key exporting stops.
pub fn readable(
    frame: crate::payload::Held,
    key: Option<&crate::seal::Decryptor>,
) -> Result<Result<rigd_drivers::Frame, String>, ReplayError> {
    match (frame.sealed, key) {
        (false, _) => Ok(Ok(frame.frame)),
        (true, Some(k)) => Ok(k.open_frame(&frame)),
        (true, None) => Err(ReplayError::Encrypted {
            name: frame.source.to_string(),
            seq: frame.seq,
        }),
    }
}

/// A record that did not read back: damage, skipped and reported (`Ok`), or a segment this user
/// may no longer open, which stops the tool (a permission problem, exit 77, not damage).
pub fn damage(e: ReadError) -> Result<Corrupt, ReplayError> {
    match e {
        ReadError::Corrupt(c) => Ok(c),
        ReadError::Unreadable(e) => Err(ReplayError::Spool(e)),
    }
}

impl ReplayError {
    /// A usage error (exit 2): the arguments name something that is not there.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ReplayError::UnknownSource { .. }
                | ReplayError::EmptyRange { .. }
                | ReplayError::Spool(SpoolError::NotSpool { .. })
                | ReplayError::NoRig { .. }
                | ReplayError::Encrypted { .. }
                | ReplayError::OutputExists { .. }
                | ReplayError::OutputNotDirectory { .. }
                | ReplayError::OutputNotEmpty { .. }
        )
    }

    /// The offline tools' exit status for this error: 2 for a usage error, 77 (EX_NOPERM) for a
    /// spool file this user may not read, 1 otherwise.
    pub fn exit_status(&self) -> u8 {
        match self {
            ReplayError::Spool(SpoolError::Unreadable { .. }) => 77,
            e if e.is_usage() => 2,
            _ => 1,
        }
    }

    fn output(path: impl Into<PathBuf>, op: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| ReplayError::Output { path, op, source }
    }
}

/// The rig to replay as: what the arguments say, else what the spool recorded (rig id, topic
/// template, bucket width), else the defaults for topic and bucket. Without a rig id from either,
/// [`ReplayError::NoRig`] when `need_rig`.
pub fn rig_identity(
    snap: &SpoolSnapshot,
    rig: Option<String>,
    topic: Option<String>,
    bucket_ms: Option<u32>,
    need_rig: bool,
) -> Result<crate::spool::identity::RigIdentity, ReplayError> {
    let stored = snap.identity();
    let known = stored.ok().flatten();
    if let (Err(why), Some(_)) = (stored, &rig) {
        if topic.is_none() || bucket_ms.is_none() {
            tracing::warn!(
                "{why}: the topic template and bucket width are the defaults unless --topic and --bucket-ms say otherwise"
            );
        }
    }
    let rig = match rig.or_else(|| known.map(|k| k.rig.clone())) {
        Some(r) => r,
        None if need_rig => {
            return Err(ReplayError::NoRig {
                path: snap.path().to_path_buf(),
                why: match stored {
                    Err(e) => e.to_string(),
                    Ok(_) => format!("no {} file", crate::spool::identity::FILE),
                },
            })
        }
        None => String::new(),
    };
    Ok(crate::spool::identity::RigIdentity {
        rig,
        topic: topic
            .or_else(|| known.map(|k| k.topic.clone()))
            .unwrap_or_else(|| crate::wire::DEFAULT_TOPIC.to_string()),
        bucket_ms: bucket_ms.or(known.map(|k| k.bucket_ms)).unwrap_or(33),
    })
}

/// Which records to replay: sources (all when empty) and a capture-time range `[from, to)`.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub sources: Vec<String>,
    pub from_ns: Option<i64>,
    pub to_ns: Option<i64>,
}

/// The records of one source to replay, in `seq` order.
#[derive(Debug, Clone)]
pub struct SourcePlan {
    pub source: Arc<str>,
    pub entries: Vec<Entry>,
    /// `--from` fell inside a group of pictures: the range starts earlier, at the capture time
    /// of the group's keyframe (issue 48.4), so the first frame written decodes.
    pub extended_from: Option<i64>,
}

/// Where a source's range `[from, ...)` starts so that it begins at a keyframe: the index of the
/// first entry at or after `from`, moved back to the last entry before it that is not a delta
/// when it is one. Pure. Returns (start index, whether it moved).
pub fn group_start(entries: &[Entry], from: Option<i64>) -> (usize, bool) {
    let Some(from) = from else {
        return (0, false);
    };
    let first = entries.partition_point(|e| e.capture_ns < from);
    if entries.get(first).is_none_or(|e| !e.delta) {
        return (first, false);
    }
    match entries[..first].iter().rposition(|e| !e.delta) {
        Some(k) => (k, true),
        // The group's keyframe is not in the spool (dropped earlier): nothing to extend to.
        None => (first, false),
    }
}

impl Selection {
    /// The selected records, per source in `seq` order; unknown sources are a usage error.
    pub fn plan(&self, snap: &SpoolSnapshot) -> Result<Vec<SourcePlan>, ReplayError> {
        if let (Some(from), Some(to)) = (self.from_ns, self.to_ns) {
            if from >= to {
                return Err(ReplayError::EmptyRange {
                    from: crate::civil::format(from),
                    to: crate::civil::format(to),
                });
            }
        }
        let have: Vec<&Arc<str>> = snap.sources().map(|(s, _)| s).collect();
        for name in &self.sources {
            if !have.iter().any(|h| ***h == **name) {
                return Err(ReplayError::UnknownSource {
                    name: name.clone(),
                    have: if have.is_empty() {
                        "no records at all".into()
                    } else {
                        have.iter()
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                });
            }
        }
        let before_to = |e: &&Entry| self.to_ns.is_none_or(|t| e.capture_ns < t);
        Ok(snap
            .sources()
            .filter(|(s, _)| self.sources.is_empty() || self.sources.iter().any(|n| **n == ***s))
            .map(|(s, entries)| {
                // Entries are in seq order, which is capture order within a source.
                let (start, moved) = group_start(entries, self.from_ns);
                let entries: Vec<Entry> =
                    entries[start..].iter().filter(before_to).copied().collect();
                SourcePlan {
                    source: s.clone(),
                    extended_from: entries.first().filter(|_| moved).map(|e| e.capture_ns),
                    entries,
                }
            })
            .filter(|p| !p.entries.is_empty())
            .collect())
    }
}

/// Every selected record across sources in capture order (ties by source, then seq): the order of
/// a merged output such as one MCAP file.
pub fn capture_order(plan: &[SourcePlan]) -> Vec<(usize, Entry)> {
    let mut all: Vec<(usize, Entry)> = plan
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.entries.iter().map(move |e| (i, *e)))
        .collect();
    all.sort_by_key(|(i, e)| (e.capture_ns, *i, e.seq));
    all
}

pub fn total_bytes(plan: &[SourcePlan]) -> u64 {
    plan.iter()
        .flat_map(|p| p.entries.iter())
        .map(|e| e.len as u64)
        .sum()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SourceSummary {
    pub id: String,
    pub records: u64,
    pub bytes: u64,
}

/// Counts of a republish to Pulsar.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Published {
    /// Persisted by the broker now.
    pub persisted: u64,
    /// Already held by the broker under the same sequence id (deduplicated).
    pub already_persisted: u64,
    /// Refused (too large for the producer).
    pub refused: u64,
    /// Submitted but without a receipt when the replay stopped.
    pub unacknowledged: u64,
}

/// What a replay did; printed at the end (`--json`: this object).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub output: String,
    /// Records written (files, MCAP) or submitted (Pulsar), per source.
    pub sources: Vec<SourceSummary>,
    pub records: u64,
    /// Spool bytes of those records.
    pub bytes: u64,
    /// Records skipped because they do not read back.
    pub corrupt: Vec<Corrupt>,
    /// Records skipped for another reason (a format change inside one WAV, ...).
    pub skipped: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<Published>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcap: Option<mcap::McapReport>,
    pub interrupted: bool,
    pub seconds: f64,
    pub mb_per_s: f64,
}

/// Accumulates a [`Summary`] while records go out.
#[derive(Debug)]
pub struct Tally {
    started: Instant,
    sources: Vec<SourceSummary>,
    corrupt: Vec<Corrupt>,
    skipped: Vec<String>,
}

impl Tally {
    pub fn new(plan: &[SourcePlan]) -> Self {
        Tally {
            started: Instant::now(),
            sources: plan
                .iter()
                .map(|p| SourceSummary {
                    id: p.source.to_string(),
                    ..Default::default()
                })
                .collect(),
            corrupt: Vec::new(),
            skipped: Vec::new(),
        }
    }

    pub fn done(&mut self, source_index: usize, entry: &Entry) {
        if let Some(s) = self.sources.get_mut(source_index) {
            s.records += 1;
            s.bytes += entry.len as u64;
        }
    }

    pub fn corrupt(&mut self, c: Corrupt) {
        self.corrupt.push(c);
    }

    pub fn skipped(&mut self, why: String) {
        self.skipped.push(why);
    }

    pub fn finish(self, output: String, interrupted: bool) -> Summary {
        let seconds = self.started.elapsed().as_secs_f64();
        let records = self.sources.iter().map(|s| s.records).sum();
        let bytes: u64 = self.sources.iter().map(|s| s.bytes).sum();
        Summary {
            output,
            sources: self.sources,
            records,
            bytes,
            corrupt: self.corrupt,
            skipped: self.skipped,
            published: None,
            mcap: None,
            interrupted,
            seconds,
            mb_per_s: if seconds > 0.0 {
                bytes as f64 / 1e6 / seconds
            } else {
                0.0
            },
        }
    }
}

impl Summary {
    /// The human report on stderr.
    pub fn print(&self) {
        use std::io::Write;
        // A closed stderr loses the report, never the command (eprintln! panics on EPIPE).
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "{}: {} records, {:.1} MB in {:.2} s ({:.1} MB/s){}",
            self.output,
            self.records,
            self.bytes as f64 / 1e6,
            self.seconds,
            self.mb_per_s,
            if self.interrupted {
                "; INTERRUPTED, output is partial"
            } else {
                ""
            }
        );
        for s in &self.sources {
            let _ = writeln!(err, "  {}: {} records", s.id, s.records);
        }
        if let Some(p) = &self.published {
            let _ = writeln!(
            err,
                "  broker: {} persisted, {} already held (deduplicated), {} refused, {} unacknowledged",
                p.persisted, p.already_persisted, p.refused, p.unacknowledged
            );
        }
        if let Some(m) = &self.mcap {
            let _ = writeln!(
                err,
                "  mcap: {} messages ({}, {} chunks), {:.1} MB written; {} location fixes, {} NMEA \
                 sentences unparsed (kept as Log lines), {} markers, {} CAN frames ({} decoded)",
                m.messages,
                m.encoding,
                m.compression,
                m.output_bytes as f64 / 1e6,
                m.location_fixes,
                m.nmea_unparsed,
                m.markers,
                m.can_frames,
                m.can_decoded
            );
        }
        if !self.corrupt.is_empty() {
            let _ = writeln!(
                err,
                "  {} corrupt records skipped (rigd spool verify lists them):",
                self.corrupt.len()
            );
            for c in self.corrupt.iter().take(20) {
                let _ = writeln!(err, "    {}", inspect::describe(c));
            }
        }
        for s in self.skipped.iter().take(20) {
            let _ = writeln!(err, "  skipped: {s}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, capture_ns: i64) -> Entry {
        Entry {
            seq,
            capture_ns,
            len: 10,
            segment: 1,
            offset: 0,
            delta: false,
        }
    }

    /// Issue 48.4: a range starting inside a group of pictures starts at the group's keyframe.
    #[test]
    fn a_range_from_mid_group_starts_at_its_keyframe() {
        // Keyframes at 0 and 40 (ns), deltas every 10 ns between.
        let e: Vec<Entry> = (0..8)
            .map(|i| Entry {
                delta: i % 4 != 0,
                ..entry(i, i as i64 * 10)
            })
            .collect();
        assert_eq!(group_start(&e, None), (0, false));
        assert_eq!(group_start(&e, Some(25)), (0, true));
        assert_eq!(group_start(&e, Some(40)), (4, false));
        assert_eq!(group_start(&e, Some(41)), (4, true));
        assert_eq!(group_start(&e, Some(1000)), (8, false));
        // Without video nothing moves; a group whose keyframe is gone is not extended.
        let plain: Vec<Entry> = (0..8).map(|i| entry(i, i as i64 * 10)).collect();
        assert_eq!(group_start(&plain, Some(25)), (3, false));
        assert_eq!(group_start(&e[1..], Some(25)), (2, false));
    }

    #[test]
    fn capture_order_merges_sources_by_time() {
        let plan = vec![
            SourcePlan {
                source: "a".into(),
                entries: vec![entry(0, 10), entry(1, 30)],
                extended_from: None,
            },
            SourcePlan {
                source: "b".into(),
                entries: vec![entry(5, 10), entry(6, 20)],
                extended_from: None,
            },
        ];
        let order: Vec<(usize, u64)> = capture_order(&plan)
            .into_iter()
            .map(|(i, e)| (i, e.seq))
            .collect();
        assert_eq!(order, vec![(0, 0), (1, 5), (1, 6), (0, 1)]);
        assert_eq!(total_bytes(&plan), 40);
    }
}
