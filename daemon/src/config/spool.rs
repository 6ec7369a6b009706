//! `[spool]`: where frames wait, how much room they may take, and when they are made durable.

use super::*;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpoolMode {
    #[default]
    OnOutage,
    Always,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenFull {
    #[default]
    DropOldest,
    DropNewest,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SpoolConfig {
    #[serde(default = "default_spool_path")]
    pub path: PathBuf,
    #[serde(default)]
    pub mode: SpoolMode,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: ByteSize,
    /// Free space the spool leaves on its filesystem.
    #[serde(default = "default_reserve")]
    pub free_reserve: ByteSize,
    #[serde(default)]
    pub when_full: WhenFull,
    #[serde(default = "default_fsync_ms")]
    pub fsync_ms: u64,
}

fn default_spool_path() -> PathBuf {
    PathBuf::from("/var/lib/rigd/spool")
}
fn default_max_bytes() -> ByteSize {
    ByteSize(8 << 30)
}
fn default_reserve() -> ByteSize {
    ByteSize(256 << 20)
}
fn default_fsync_ms() -> u64 {
    50
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            path: default_spool_path(),
            mode: SpoolMode::OnOutage,
            max_bytes: default_max_bytes(),
            free_reserve: default_reserve(),
            when_full: WhenFull::DropOldest,
            fsync_ms: default_fsync_ms(),
        }
    }
}

impl SpoolConfig {
    /// What is wrong with the `[spool]` table alone.
    pub(super) fn problems(&self, p: &mut Vec<String>) {
        if self.max_bytes.0 < 1 << 20 {
            p.push(format!(
                "spool.max-bytes: {} is below 1MiB",
                self.max_bytes.0
            ));
        }
        if self.fsync_ms == 0 || self.fsync_ms > 60_000 {
            p.push(format!(
                "spool.fsync-ms: {} must be between 1 and 60000",
                self.fsync_ms
            ));
        }
        if self.free_reserve.0 < MIN_FREE_RESERVE {
            p.push(format!(
                "spool.free-reserve: {} is below {} (the spool would fill its filesystem)",
                self.free_reserve.0,
                ByteSize(MIN_FREE_RESERVE).human()
            ));
        }
        if self.path.as_os_str().is_empty() {
            p.push("spool.path: must not be empty".to_string());
        }
        no_nul(p, "spool.path", &self.path.to_string_lossy());
    }
}
