//! The rig a spool belongs to: rig id, bucket width and topic template, in `RIG` at the spool's
//! root (TOML), so that a spool copied off a vehicle can be replayed and republished without
//! being told whose it is (`rigd replay --spool DIR --pulsar URL`).
//!
//! Written by the daemon at open when it differs from what is there: to `RIG.tmp`, fsynced, then
//! renamed over `RIG` and the directory fsynced, so a power cut leaves the old file or the new
//! one (through the spool's [`Disk`]). A failure to write it (a full disk) is logged, never
//! fatal: the records do not depend on it.

use serde::{Deserialize, Serialize};
use std::path::Path;

use super::disk::{replace_file_on, Disk};

pub const FILE: &str = "RIG";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RigIdentity {
    /// `rig.id`: part of topic and producer names.
    pub rig: String,
    /// `rig.bucket-ms`: the time-bucket width the keys were computed with.
    pub bucket_ms: u32,
    /// `pulsar.topic`: the topic template, placeholders `{rig}` and `{source}`.
    pub topic: String,
}

impl RigIdentity {
    pub fn encode(&self) -> String {
        // Three plain strings and a number: serialising cannot fail.
        toml::to_string(self).unwrap_or_default()
    }

    pub fn decode(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }
}

/// The identity stored in a spool directory (`Ok(None)`: none stored, a spool from before it).
/// `Err`, one line: a file that is there and does not parse (damaged: said so, with the first
/// problem toml finds) or does not read.
pub fn read(dir: &Path) -> Result<Option<RigIdentity>, String> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let parsed = std::str::from_utf8(&bytes)
                .map_err(|_| "not UTF-8 text".to_string())
                .and_then(|text| {
                    toml::from_str::<RigIdentity>(text).map_err(|e| e.message().to_string())
                });
            parsed.map(Some).map_err(|why| {
                format!(
                    "{} is damaged ({why}): it is not the rig identity rigd writes there",
                    path.display()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Stores `id` in `dir` through `disk`, unless it is there already.
pub(super) fn write(disk: &dyn Disk, dir: &Path, id: &RigIdentity) -> std::io::Result<()> {
    if read(dir).ok().flatten().as_ref() == Some(id) {
        return Ok(());
    }
    replace_file_on(disk, dir, FILE, id.encode().as_bytes()).map_err(|e| e.source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::disk::Os;

    #[test]
    fn round_trips_and_is_rewritten_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let id = RigIdentity {
            rig: "van-07".into(),
            bucket_ms: 33,
            topic: "persistent://public/default/{rig}-{source}".into(),
        };
        write(&Os, dir.path(), &id).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(id.clone()));
        let other = RigIdentity {
            rig: "van-08".into(),
            ..id
        };
        write(&Os, dir.path(), &other).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(other.clone()));
        std::fs::write(dir.path().join(FILE), "rig = 3").unwrap();
        let err = read(dir.path()).unwrap_err();
        assert!(err.contains("RIG is damaged"), "{err}");
        std::fs::write(dir.path().join(FILE), b"\x00\xff garbage\n\n").unwrap();
        let err = read(dir.path()).unwrap_err();
        assert!(err.contains("is damaged (not UTF-8 text)"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
        // A damaged file is rewritten at the daemon's next open.
        write(&Os, dir.path(), &other).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(other));
    }
}
