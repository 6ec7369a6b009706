//! Sending epochs: where a source's capture sequence was split between a backlog and live frames
//! (`drain = "live-first"`), so that every frame is published under one producer name forever.
//!
//! Broker deduplication is per producer name and takes only increasing sequence ids, so frames
//! older than ones already sent cannot follow under the same name. When live frames overtake a
//! backlog, the live frames move to a new producer name instead (the backlog keeps the name it
//! was captured under and drains in order behind what that producer already sent). An epoch is
//! the range of capture sequences from one split to the next; its producer name is derived from
//! its first sequence (`uplink`: `rigd-{rig}-{source}` for the first, `rigd-{rig}-{source}-e{start}` after).
//!
//! On-disk format: `epochs/{source}` under the spool directory, one decimal start sequence per
//! line, ascending, the epoch starting at 0 implied. Written whole to a temporary file, fsynced,
//! renamed over the old one, then the directory fsynced: a crash leaves the old list or the new
//! one, never a torn one. Kept outside the sled index on purpose: an index rebuild must never
//! forget a split, or frames of a later epoch would go out under an earlier name and be dropped
//! as duplicates.
//!
//! Beside it, `epochs/{source}.partitions` ([`read_partitions`], [`add_partitions`]): the
//! partition counts each epoch's frames were routed over on a partitioned topic (issue 46.1,
//! `uplink::topic::Routes`), same write discipline. Source ids are `[a-z0-9-]+`, so the name
//! never meets a source's epochs file.
//!
//! Beside them, `epochs/marks/` ([`read_mark`], [`write_mark`], issue 46.5): per producer name and
//! topic, where that name's frames can be found on the topic again: the message id of the entry of
//! its last receipt (or of the topic's last entry before the name's first frame), one line
//! `{topic} {producer} {ledger} {entry} {sequence id}` (`earliest` for an empty topic's start,
//! `-` for no sequence id), same write discipline, written at most every second while receipts
//! come and at a producer's end (`uplink::probe::Receipts`). A mark is a lower bound: the probe
//! reads forward from it, so a mark older than the last receipt costs reading, never a frame.
//!
//! Invariant: a split is durable before any frame is sent under its new name ([`Epochs::add`]
//! returns only then), and its start is above every sequence already captured, so no frame of
//! the new epoch was ever sent under an earlier epoch's name. Every write goes through the
//! spool's [`Disk`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::disk::{replace_file_on, Disk, Os};
use super::SpoolError;

/// The start sequences of `source`'s epochs after the first (which starts at 0), ascending, as
/// the spool directory `dir` holds them (the offline tools read them through this too). A list
/// that cannot be read is an error: publishing without it could lose frames.
pub fn read_epochs(dir: &Path, source: &str) -> Result<Vec<u64>, SpoolError> {
    read_on(&Os, dir, source)
}

fn read_on(disk: &dyn Disk, dir: &Path, source: &str) -> Result<Vec<u64>, SpoolError> {
    let path = dir.join("epochs").join(source);
    let Some(text) = read_text(disk, &path, "read epochs")? else {
        return Ok(Vec::new());
    };
    let mut starts = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let bad = |what: &str| SpoolError::Io {
            path: path.clone(),
            op: "read epochs",
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
        };
        let n: u64 = line.trim().parse().map_err(|_| bad("not a number"))?;
        if starts.last().is_some_and(|&l| l >= n) {
            return Err(bad("starts not ascending"));
        }
        starts.push(n);
    }
    Ok(starts)
}

/// A list file's text; None when it does not exist (nothing recorded yet).
fn read_text(disk: &dyn Disk, path: &Path, op: &'static str) -> Result<Option<String>, SpoolError> {
    match disk.read(path).and_then(|b| {
        String::from_utf8(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SpoolError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }),
    }
}

/// One entry of a source's partition routing (`epochs/{source}.partitions`, issue 46.1): the
/// frames of the epoch starting at `epoch`, from capture sequence `from` on, go to partition
/// `signSafeMod(hash(key), count)` of a partitioned topic (`uplink::topic::Routes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteChange {
    pub epoch: u64,
    pub from: u64,
    pub count: u32,
}

/// The partition counts `source`'s epochs were routed over, as the spool directory `dir` holds
/// them: one line `{epoch start} {from} {count}` per change, ascending. None when the file does
/// not exist (no partitioned topic was ever produced to, or a spool of an older rigd). Kept beside
/// the epochs file, outside the sled index, for the same reason: forgetting a count would judge an
/// earlier run's frames on partitions they were never sent to. A file that cannot be read is an
/// error, never a guess.
pub fn read_partitions(dir: &Path, source: &str) -> Result<Vec<RouteChange>, SpoolError> {
    let path = dir.join("epochs").join(format!("{source}.partitions"));
    let Some(text) = read_text(&Os, &path, "read partition counts")? else {
        return Ok(Vec::new());
    };
    let bad = |what: &str| SpoolError::Io {
        path: path.clone(),
        op: "read partition counts",
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    };
    let mut out: Vec<RouteChange> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [epoch, from, count] = f[..] else {
            return Err(bad("not three numbers"));
        };
        let c = RouteChange {
            epoch: epoch.parse().map_err(|_| bad("not a number"))?,
            from: from.parse().map_err(|_| bad("not a number"))?,
            count: count.parse().map_err(|_| bad("not a number"))?,
        };
        if out
            .last()
            .is_some_and(|l| (l.epoch, l.from) >= (c.epoch, c.from))
        {
            return Err(bad("changes not ascending"));
        }
        out.push(c);
    }
    Ok(out)
}

/// Records that the frames of `source`'s epoch `epoch` from capture sequence `from` on go over
/// `count` partitions (a change at the same `from` as the epoch's last one replaces it; one below
/// it is refused). On disk
/// when it returns (written whole, fsynced, renamed, the directory fsynced), so it must be called
/// before any frame is routed by it.
pub fn add_partitions(dir: &Path, source: &str, change: RouteChange) -> Result<(), SpoolError> {
    let mut all = read_partitions(dir, source)?;
    let last = all.iter().rposition(|c| c.epoch == change.epoch);
    if let Some(i) = last.filter(|&i| all[i].from == change.from) {
        all.remove(i);
    }
    let last = all.iter().rfind(|c| c.epoch == change.epoch);
    let name = format!("{source}.partitions");
    let dir = dir.join("epochs");
    let path = dir.join(&name);
    let io = |op: &'static str| {
        let path = path.clone();
        move |source| SpoolError::Io { path, op, source }
    };
    if last.is_some_and(|l| l.from > change.from) {
        return Err(io("add partition count")(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a partition count change is below the epoch's last one",
        )));
    }
    all.push(change);
    // Epochs record in any order (an older epoch's producer may learn a count after the live one's).
    all.sort_by_key(|c| (c.epoch, c.from));
    let text: String = all
        .iter()
        .map(|c| format!("{} {} {}\n", c.epoch, c.from, c.count))
        .collect();
    Os.create_dir(&dir).map_err(io("create epochs directory"))?;
    match replace_file_on(&Os, &dir, &name, text.as_bytes()) {
        Ok(()) => Ok(()),
        // Renamed: the file names it and the next start honours it, so this run must as well.
        Err(e) if e.renamed => {
            tracing::warn!(source, error = %e.source,
                "spool: the epochs directory could not be synced after a partition count change; it is in force");
            Ok(())
        }
        Err(e) => Err(io(e.op)(e.source)),
    }
}

/// Where a producer name's frames can be found on a topic again (module doc, issue 46.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The entry (ledger, entry) to read forward from; None: the topic's first entry.
    pub at: Option<(u64, u64)>,
    /// The highest sequence id of the name that entry holds (a receipt's); None: a start mark,
    /// the topic's last entry before the name's first frame.
    pub sequence_id: Option<u64>,
}

/// The mark file of `producer` on `topic` (a topic name holds `:` and `/`: made a file name).
fn mark_path(dir: &Path, topic: &str, producer: &str) -> PathBuf {
    let clean: String = topic
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '.' | '_' => c,
            _ => '_',
        })
        .collect();
    dir.join("epochs")
        .join("marks")
        .join(format!("{producer}@{clean}"))
}

/// `producer`'s mark on `topic` as the spool directory `dir` holds it; None when there is none. A
/// file that names another topic or producer (two names made the same file name) is none.
pub fn read_mark(dir: &Path, topic: &str, producer: &str) -> Result<Option<Mark>, SpoolError> {
    let path = mark_path(dir, topic, producer);
    let Some(text) = read_text(&Os, &path, "read mark")? else {
        return Ok(None);
    };
    let bad = |what: &str| SpoolError::Io {
        path: path.clone(),
        op: "read mark",
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    };
    let f: Vec<&str> = text.split_whitespace().collect();
    let (t, p, rest) = match f[..] {
        [t, p, "earliest", s] => (t, p, (None, s)),
        [t, p, l, e, s] => {
            let n = |x: &str| x.parse::<u64>().map_err(|_| bad("not a number"));
            (t, p, (Some((n(l)?, n(e)?)), s))
        }
        _ => return Err(bad("not a mark")),
    };
    if t != topic || p != producer {
        return Ok(None);
    }
    let sequence_id = match rest.1 {
        "-" => None,
        s => Some(s.parse().map_err(|_| bad("not a number"))?),
    };
    Ok(Some(Mark {
        at: rest.0,
        sequence_id,
    }))
}

/// Records `producer`'s mark on `topic`: on disk when it returns (written whole, fsynced, renamed).
pub fn write_mark(dir: &Path, topic: &str, producer: &str, mark: Mark) -> Result<(), SpoolError> {
    let path = mark_path(dir, topic, producer);
    let parent = path.parent().expect("in epochs/marks").to_path_buf();
    let name = path
        .file_name()
        .expect("a file")
        .to_string_lossy()
        .to_string();
    let io = |op: &'static str| {
        let path = path.clone();
        move |source| SpoolError::Io { path, op, source }
    };
    let at = match mark.at {
        Some((l, e)) => format!("{l} {e}"),
        None => "earliest".into(),
    };
    let seq = mark.sequence_id.map_or("-".into(), |s| s.to_string());
    let text = format!("{topic} {producer} {at} {seq}\n");
    Os.create_dir(&parent)
        .map_err(io("create marks directory"))?;
    match replace_file_on(&Os, &parent, &name, text.as_bytes()) {
        Ok(()) => Ok(()),
        Err(e) if e.renamed => Ok(()),
        Err(e) => Err(io(e.op)(e.source)),
    }
}

/// Removes `producer`'s marks on every topic (a finished recall request's names: never used
/// again). Best effort: a mark left behind costs a few bytes.
pub fn remove_marks(dir: &Path, producer: &str) {
    let Ok(list) = std::fs::read_dir(dir.join("epochs").join("marks")) else {
        return;
    };
    for e in list.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.split_once('@').is_some_and(|(p, _)| p == producer) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The epoch lists of a spool (`epochs/` under `root`).
pub(super) struct Epochs {
    root: PathBuf,
    disk: Arc<dyn Disk>,
}

impl Epochs {
    pub(super) fn new(root: &Path, disk: Arc<dyn Disk>) -> Self {
        Epochs {
            root: root.to_path_buf(),
            disk,
        }
    }

    /// [`read_epochs`] of this spool.
    pub(super) fn list(&self, source: &str) -> Result<Vec<u64>, SpoolError> {
        read_on(self.disk.as_ref(), &self.root, source)
    }

    /// Records that `source`'s frames from `start` on go out under a new epoch's producer name.
    /// On disk when it returns, and not named by the list when it fails (module doc: the
    /// invariant). `start` must be above every earlier start.
    pub(super) fn add(&self, source: &str, start: u64) -> Result<(), SpoolError> {
        let mut starts = self.list(source)?;
        let dir = self.root.join("epochs");
        let path = dir.join(source);
        let io = |op: &'static str| {
            let path = path.clone();
            move |source| SpoolError::Io { path, op, source }
        };
        if starts.last().is_some_and(|&l| l >= start) {
            return Err(io("add epoch")(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("epoch start {start} is not above the last one"),
            )));
        }
        starts.push(start);
        self.disk
            .create_dir(&dir)
            .map_err(io("create epochs directory"))?;
        let mut text = String::new();
        for s in &starts {
            text.push_str(&s.to_string());
            text.push('\n');
        }
        match replace_file_on(self.disk.as_ref(), &dir, source, text.as_bytes()) {
            Ok(()) => {}
            // Renamed: the list names the split, and a later start honours what it names, so this
            // run must honour it too (refusing it now would send frames >= start under the old
            // name, which the next start maps to the new one: duplicates).
            Err(e) if e.renamed => {
                tracing::warn!(source, start, error = %e.source,
                    "spool: the epochs directory could not be synced after a split; the split is in force");
            }
            Err(e) => return Err(io(e.op)(e.source)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::SpoolConfig;

    #[test]
    fn partition_counts_survive_and_only_ascend() {
        use super::{add_partitions, read_partitions, RouteChange};
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let c = |epoch, from, count| RouteChange { epoch, from, count };
        assert_eq!(read_partitions(d, "gps").unwrap(), []);
        add_partitions(d, "gps", c(0, 0, 3)).unwrap();
        add_partitions(d, "gps", c(0, 500, 4)).unwrap();
        add_partitions(d, "gps", c(0, 500, 5)).unwrap();
        add_partitions(d, "gps", c(900, 0, 5)).unwrap();
        assert!(add_partitions(d, "gps", c(0, 400, 6)).is_err());
        add_partitions(d, "gps", c(0, 700, 6)).unwrap();
        assert_eq!(
            read_partitions(d, "gps").unwrap(),
            [c(0, 0, 3), c(0, 500, 5), c(0, 700, 6), c(900, 0, 5)],
            "a change at the same start replaces the last"
        );
        assert_eq!(read_partitions(d, "cam").unwrap(), []);
        std::fs::write(d.join("epochs/gps.partitions"), "0 0\n").unwrap();
        assert!(read_partitions(d, "gps").is_err(), "never a guess");
    }

    #[test]
    fn marks_survive_and_name_their_topic_and_producer() {
        use super::{read_mark, remove_marks, write_mark, Mark};
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let t = "persistent://public/default/cam-partition-1";
        assert_eq!(read_mark(d, t, "rigd-van-cam").unwrap(), None);
        let start = Mark {
            at: None,
            sequence_id: None,
        };
        write_mark(d, t, "rigd-van-cam", start).unwrap();
        assert_eq!(read_mark(d, t, "rigd-van-cam").unwrap(), Some(start));
        let m = Mark {
            at: Some((12, 345)),
            sequence_id: Some(7 << 11),
        };
        write_mark(d, t, "rigd-van-cam", m).unwrap();
        write_mark(d, t, "rigd-van-cam-recall-r1", m).unwrap();
        assert_eq!(read_mark(d, t, "rigd-van-cam").unwrap(), Some(m));
        // Another topic that makes the same file name is not this one's.
        assert_eq!(
            read_mark(
                d,
                "persistent://public/default/cam_partition-1",
                "rigd-van-cam"
            )
            .unwrap(),
            None
        );
        remove_marks(d, "rigd-van-cam-recall-r1");
        assert_eq!(read_mark(d, t, "rigd-van-cam-recall-r1").unwrap(), None);
        assert_eq!(read_mark(d, t, "rigd-van-cam").unwrap(), Some(m));
        let f = std::fs::read_dir(d.join("epochs/marks"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        std::fs::write(f.path(), "x y 1\n").unwrap();
        assert!(read_mark(d, t, "rigd-van-cam").is_err(), "never a guess");
    }

    #[test]
    fn epochs_survive_a_reopen_and_only_ascend() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SpoolConfig {
            path: dir.path().join("spool"),
            ..SpoolConfig::default()
        };
        {
            let s = crate::spool::Spool::open(&cfg).unwrap();
            assert_eq!(s.epochs("cam").unwrap(), Vec::<u64>::new());
            s.add_epoch("cam", 100).unwrap();
            s.add_epoch("cam", 250).unwrap();
            assert!(s.add_epoch("cam", 250).is_err());
            assert!(s.add_epoch("cam", 7).is_err());
            assert_eq!(s.epochs("gps").unwrap(), Vec::<u64>::new());
        }
        let s = crate::spool::Spool::open(&cfg).unwrap();
        assert_eq!(s.epochs("cam").unwrap(), vec![100, 250]);
        std::fs::write(dir.path().join("spool/epochs/cam"), "100\nx\n").unwrap();
        assert!(
            s.epochs("cam").is_err(),
            "a damaged list is an error, not a guess"
        );
    }
}
