//! The daemon's configuration: TOML, kebab-case, unknown keys rejected, then a validation pass that
//! reports every value that parses but makes no sense, one line per problem naming its table,
//! index, key and line (`rigd.toml:9: source[1].fps: ...`).
//!
//! This module sits at the bottom of the daemon crate: it imports nothing above it (only
//! [`crate::wire`], the wire format's names, and the drivers' setting types). What the host must
//! offer a config (files, the spool's filesystem, a free port) is checked in [`crate::preflight`].

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

mod clock;
mod locate;
mod pulsar;
mod source;
mod spool;
mod units;
mod web;

pub use clock::*;
use locate::*;
pub use pulsar::*;
pub use source::*;
pub use spool::*;
pub use units::*;
pub use web::*;

/// The config `rigd run` uses when none is given: synthetic sources, no broker, spool in ./rigd-spool.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../examples/synthetic.toml");

/// The internal source carrying technician event markers (a reserved source id; see
/// [`crate::events`]).
pub const EVENTS_SOURCE: &str = "events";

/// A spool record stores its source id behind a one-byte length.
pub const MAX_SOURCE_ID_BYTES: usize = 255;

/// Why a config could not be used. Each entry of `Invalid` is one line naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The config itself is wrong: fixing it is the only remedy (`run` exits 2).
    #[error("{}", .problems.join("\n"))]
    Invalid { problems: Vec<String> },
    /// The config is valid but the host does not offer what it names yet: a token file not yet
    /// provisioned, a spool disk not yet mounted, a port still held. Transient: `run` exits 75
    /// (EX_TEMPFAIL) and systemd tries again.
    #[error("{}", .problems.join("\n"))]
    Host { problems: Vec<String> },
}

/// A problem of the host with a valid config, as [`crate::preflight`] finds it
/// (`key: what is wrong`), and whether waiting can fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostProblem {
    /// No host will ever offer it: the config names a place where no spool can be (a kernel
    /// pseudo-filesystem such as `/proc`, a path that is a file or runs through one). Only the
    /// config can change: a [`ConfigError::Invalid`], `run` exits 2.
    Config(String),
    /// The host does not offer it yet (a token file not provisioned, a spool disk not mounted,
    /// a port held): it may by the next try. Alone, a [`ConfigError::Host`]: `run` exits 75.
    NotReady(String),
}

impl HostProblem {
    /// The problem as `key: what is wrong`.
    pub fn text(&self) -> &str {
        match self {
            HostProblem::Config(p) | HostProblem::NotReady(p) => p,
        }
    }
}

impl ConfigError {
    /// `run`'s exit status: 2 for a config to fix (systemd's `RestartPreventExitStatus=2`), 75
    /// for a host not ready yet (restarted).
    pub fn exit_status(&self) -> u8 {
        match self {
            ConfigError::Host { .. } => 75,
            _ => 2,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub rig: RigConfig,
    pub clock: ClockConfig,
    pub sources: Vec<SourceConfig>,
    pub pulsar: PulsarConfig,
    pub spool: SpoolConfig,
    pub web: WebConfig,
    /// Where each key was written, to name the line in messages.
    written: Written,
}

/// The file as written. `[[source]]` tables are read twice: here only for their `kind`, then each
/// as the struct of its kind from the same text ([`read_source`]), so that an error inside one
/// names its index, key and line (serde's internally tagged enums buffer a table and lose all three).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct File {
    rig: Option<RigConfig>,
    #[serde(default)]
    clock: ClockConfig,
    #[serde(default)]
    source: Vec<SourceHead>,
    #[serde(default)]
    pulsar: PulsarConfig,
    #[serde(default)]
    spool: SpoolConfig,
    #[serde(default)]
    web: WebConfig,
}

/// The first pass's view of a `[[source]]`: its kind only (the other keys are read by kind).
#[derive(Deserialize)]
struct SourceHead {
    kind: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RigConfig {
    /// `[a-z0-9-]+`; part of topic and producer names.
    pub id: String,
    /// Width of a time bucket in milliseconds.
    #[serde(default = "default_bucket_ms")]
    pub bucket_ms: u32,
    /// Threads of the daemon's async runtime (capture threads are apart from these).
    #[serde(default = "default_worker_threads")]
    pub worker_threads: usize,
}

fn default_bucket_ms() -> u32 {
    33
}

fn default_worker_threads() -> usize {
    2
}

/// More runtime threads than this is a typo, not a rig.
const MAX_WORKER_THREADS: usize = 64;

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, |_| Vec::new())
    }

    /// As [`Config::load`], reporting the problems `more` finds in a config that parses (the
    /// host's, [`crate::preflight`]) with its own.
    pub fn load_with(
        path: &Path,
        more: impl FnOnce(&Config) -> Vec<HostProblem>,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_with(&text, &path.display().to_string(), more)
    }

    /// Parses and validates config text; `origin` names it in messages.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::parse_with(text, origin, |_| Vec::new())
    }

    /// As [`Config::parse`], with the problems `more` finds (see [`Config::load_with`]).
    pub fn parse_with(
        text: &str,
        origin: &str,
        more: impl FnOnce(&Config) -> Vec<HostProblem>,
    ) -> Result<Self, ConfigError> {
        let invalid = |problems| ConfigError::Invalid { problems };
        let written = Written::scan(text, origin);
        let file: File = read_file(text, &written).map_err(invalid)?;
        let mut problems: Vec<Result<String, String>> = Vec::new();
        let mut sources = Vec::new();
        for (i, head) in file.source.iter().enumerate() {
            match head.kind.as_deref() {
                None => problems.push(Ok(format!(
                    "source[{i}]: missing field `kind` (one of {})",
                    SOURCE_KINDS.join(", ")
                ))),
                Some(kind) if !SOURCE_KINDS.contains(&kind) => problems.push(Ok(format!(
                    "source[{i}].kind: unknown kind `{kind}` (one of {})",
                    SOURCE_KINDS.join(", ")
                ))),
                Some(kind) => match every_error(text, &written, |t| read_source(t, i, kind)) {
                    Ok(s) => sources.push(s),
                    Err(lines) => problems.extend(lines.into_iter().map(Err)),
                },
            }
        }
        if file.rig.is_none() {
            problems.insert(
                0,
                Ok("rig: missing table [rig] (every config needs one, with id = \"...\")".into()),
            );
        }
        // Ok: `key: problem` still to be located; Err: a toml error's line, located already.
        let problems: Vec<String> = problems
            .into_iter()
            .map(|p| p.map_or_else(|done| done, |p| written.lines(vec![p]).remove(0)))
            .collect();
        let (Some(rig), true) = (file.rig, problems.is_empty()) else {
            return Err(invalid(problems));
        };
        let config = Config {
            rig,
            clock: file.clock,
            sources,
            pulsar: file.pulsar,
            spool: file.spool,
            web: file.web,
            written,
        };
        let mut problems = config.problems();
        let host = more(&config);
        let transient = host.iter().all(|p| matches!(p, HostProblem::NotReady(_)));
        let host: Vec<String> = host
            .into_iter()
            .map(|p| match p {
                HostProblem::Config(p) | HostProblem::NotReady(p) => p,
            })
            .collect();
        if problems.is_empty() && transient && !host.is_empty() {
            return Err(ConfigError::Host {
                problems: config.written.lines(host),
            });
        }
        problems.extend(host);
        config.check(problems)?;
        Ok(config)
    }

    /// `Ok` without problems, else the problems (`key: problem`, from [`Config::problems`] or
    /// [`crate::preflight`]) as lines naming the file and the line the key is written on.
    pub fn check(&self, problems: Vec<String>) -> Result<(), ConfigError> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                problems: self.written.lines(problems),
            })
        }
    }

    /// Every value that parses but makes no sense, as `key: problem`.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !is_name(&self.rig.id) {
            p.push(format!("rig.id: `{}` must match [a-z0-9-]+", self.rig.id));
        }
        if !(1..=MAX_BUCKET_MS).contains(&self.rig.bucket_ms) {
            p.push(format!(
                "rig.bucket-ms: {} must be between 1 and {MAX_BUCKET_MS}",
                self.rig.bucket_ms
            ));
        }
        if !(1..=MAX_WORKER_THREADS).contains(&self.rig.worker_threads) {
            p.push(format!(
                "rig.worker-threads: {} must be between 1 and {MAX_WORKER_THREADS}",
                self.rig.worker_threads
            ));
        }
        self.clock.problems(&mut p);
        let mut seen = std::collections::HashSet::new();
        for (i, s) in self.sources.iter().enumerate() {
            let key = format!("source[{i}]");
            s.problems(&mut p, &key, self.pulsar.max_frame_bytes.0);
            if !seen.insert(s.id()) {
                p.push(format!("{key}.id: `{}` is used by another source", s.id()));
            }
            if let Some(block) = self.audio_block_bytes(s) {
                let limit = MAX_AUDIO_BLOCK.min(self.pulsar.max_frame_bytes.0);
                if block > limit {
                    p.push(format!(
                        "rig.bucket-ms: {} ms makes blocks of {} for audio source {key} (`{}`), above {}",
                        self.rig.bucket_ms,
                        ByteSize(block).human(),
                        s.id(),
                        ByteSize(limit).human(),
                    ));
                }
            }
        }
        self.pulsar.problems(&mut p);
        self.spool.problems(&mut p);
        self.web.problems(&mut p);
        p
    }

    /// The config with every default filled in, as TOML that `rigd check` accepts and reads
    /// back to the same values (`rigd check --print-effective`).
    pub fn effective(&self) -> Result<String, String> {
        #[derive(Serialize)]
        struct Effective<'a> {
            rig: &'a RigConfig,
            clock: &'a ClockConfig,
            source: &'a [SourceConfig],
            pulsar: &'a PulsarConfig,
            spool: &'a SpoolConfig,
            web: &'a WebConfig,
        }
        toml::to_string(&Effective {
            rig: &self.rig,
            clock: &self.clock,
            source: &self.sources,
            pulsar: &self.pulsar,
            spool: &self.spool,
            web: &self.web,
        })
        .map_err(|e| e.to_string())
    }

    /// Bytes of one audio block (one bucket of 16-bit samples) of an audio source.
    fn audio_block_bytes(&self, s: &SourceConfig) -> Option<u64> {
        let (rate, channels) = match s {
            SourceConfig::SyntheticAudio(c) => (c.sample_rate, c.channels),
            SourceConfig::Alsa(c) => (c.sample_rate, c.channels),
            _ => return None,
        };
        Some((rate as u64 * self.rig.bucket_ms as u64).div_ceil(1000) * channels as u64 * 2)
    }

    /// The topic of source `id` (the events source's frames are text records: `serial`).
    pub fn topic_of(&self, id: &str) -> String {
        let modality = self
            .sources
            .iter()
            .find(|s| s.id() == id)
            .map_or(rigd_drivers::Modality::Serial, SourceConfig::modality);
        self.pulsar.topic_for(&self.rig.id, id, modality)
    }

    pub fn web_bind(&self) -> SocketAddr {
        self.web
            .bind
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8088)))
    }
}

/// Reads a token file (`pulsar.token-file`, `web.token-file`, `--token-file`): its content without
/// surrounding whitespace; a file that cannot be read or holds nothing is an error, which names it.
pub fn read_token(path: &Path) -> Result<String, String> {
    let t = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = t.trim();
    if t.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(t.to_string())
}

/// A time bucket is an alignment window of a moment, not a recording: at most a minute.
pub const MAX_BUCKET_MS: u32 = 60_000;
/// An audio block (one bucket) larger than this is a mistake in `bucket-ms`.
const MAX_AUDIO_BLOCK: u64 = 4 << 20;
const MIN_IN_FLIGHT_BYTES: u64 = 64 << 10;
const MIN_FREE_RESERVE: u64 = 1 << 20;
/// The smallest budget: a grant (16 KiB) takes 2 s of it, so a keepalive answer behind a few
/// grants and a chunk still goes out well within the broker's 30 s keepalive tick.
const MIN_BANDWIDTH: u64 = 64_000;
const MAX_BANDWIDTH: u64 = 100_000_000_000;

/// A file a key names: no NUL byte, not empty (whether it exists is the preflight's question).
fn file_problems(p: &mut Vec<String>, key: &str, file: Option<&Path>) {
    if let Some(f) = file {
        no_nul(p, key, &f.to_string_lossy());
        if f.as_os_str().is_empty() {
            p.push(format!("{key}: must not be empty (leave it out for none)"));
        }
    }
}

/// A path or device name goes to the kernel as a C string: a NUL byte cuts it.
/// Two settings that only make sense together: naming one without the other is a mistake.
fn both(p: &mut Vec<String>, a: (&str, bool), b: (&str, bool), why: &str) {
    match (a.1, b.1) {
        (true, false) => p.push(format!("{}: set without {} ({why})", a.0, b.0)),
        (false, true) => p.push(format!("{}: set without {} ({why})", b.0, a.0)),
        _ => {}
    }
}

fn no_nul(p: &mut Vec<String>, key: &str, v: &str) {
    if v.contains('\0') {
        p.push(format!("{key}: contains a NUL byte"));
    }
}

fn positive(p: &mut Vec<String>, key: &str, name: &str, v: f64) {
    if !(v.is_finite() && v > 0.0) {
        p.push(format!("{key}.{name}: {v} must be a positive number"));
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests;
