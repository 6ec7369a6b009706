//! `quarantine/`: damaged bytes set aside, one file per record or damaged span, kept for
//! inspection. The directory is the count (`spool stat` and `verify` count its files, and an open
//! starts from them).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::disk::Disk;

pub(super) struct Quarantine {
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    /// Records quarantined: the files found at open, plus those set aside since.
    count: AtomicU64,
}

impl Quarantine {
    /// The quarantine of the spool at `root` (whose `quarantine/` exists).
    pub(super) fn open(root: &Path, disk: Arc<dyn Disk>) -> Self {
        let dir = root.join("quarantine");
        let count = std::fs::read_dir(&dir)
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        Quarantine {
            dir,
            disk,
            count: AtomicU64::new(count),
        }
    }

    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sets damaged bytes aside and counts them. A span already there (a second rebuild finds the
    /// same damage) is not counted again. A file that cannot be written (a full disk) is counted
    /// all the same, and said in the log: the record is lost either way.
    pub(super) fn set_aside(
        &self,
        source: &str,
        segment: u64,
        offset: u64,
        bytes: &[u8],
        why: &str,
    ) {
        let name = format!("{source}-{segment:016x}-{offset}.bad");
        match self.disk.write_file(&self.dir.join(&name), bytes) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                tracing::warn!(file = %name, reason = why, "spool: damaged bytes found again, already in quarantine/");
                return;
            }
            Err(e) => {
                tracing::error!(file = %name, error = %e, "spool: cannot write a quarantine file; the record is counted as quarantined without it");
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        tracing::error!(source, segment, offset, reason = why, file = %name, "spool: corrupt record quarantined");
    }
}
