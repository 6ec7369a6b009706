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
mod proxy;
mod pulsar;
mod source;
mod spool;
mod units;
mod web;

pub use clock::*;
use locate::*;
pub use proxy::*;
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
    /// The index in the file of each of `sources` (a table that could not be read is left out,
    /// and the others keep their names: `source[2]` stays `source[2]`).
    source_index: Vec<usize>,
    /// The file has no `[[source]]` table at all ([`Config::rig_problems`]).
    sourceless: bool,
    /// Tables that could not be read, their defaults standing in ([`Config::examine`]).
    unread: Vec<&'static str>,
}

/// What `rigd check` finds in a config: the config when every table could be read, and every
/// problem and every warning in one run, each a line naming the file, the line and the key.
#[derive(Debug)]
pub struct Examined {
    pub config: Option<Config>,
    /// `origin:line: key: what is wrong`.
    pub problems: Vec<String>,
    /// `origin:line: warning: key: what to know`.
    pub warnings: Vec<String>,
    /// Every problem is the host's and may go away (exit 75 from `run`).
    transient: bool,
}

impl Examined {
    /// The config when it has no problem, else the error `run` reports.
    pub fn into_result(self) -> Result<Config, ConfigError> {
        match self.config {
            Some(c) if self.problems.is_empty() => Ok(c),
            _ if self.transient => Err(ConfigError::Host {
                problems: self.problems,
            }),
            _ => Err(ConfigError::Invalid {
                problems: self.problems,
            }),
        }
    }
}

/// The file's top-level tables, for unknown ones only: each table is read on its own
/// ([`read_table`], [`read_source`]) so that a mistake in one leaves every other readable and
/// checked in the same run.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tables {
    #[serde(rename = "rig")]
    _rig: Option<IgnoredAny>,
    #[serde(rename = "clock")]
    _clock: Option<IgnoredAny>,
    #[serde(rename = "source")]
    _source: Option<Vec<IgnoredAny>>,
    #[serde(rename = "pulsar")]
    _pulsar: Option<IgnoredAny>,
    #[serde(rename = "spool")]
    _spool: Option<IgnoredAny>,
    #[serde(rename = "web")]
    _web: Option<IgnoredAny>,
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
        Self::examine(text, origin, more, |_| Vec::new()).into_result()
    }

    /// As [`Config::load_with`], with the warnings too (`rigd check`): see [`Config::examine`].
    pub fn examine_file(
        path: &Path,
        more: impl FnOnce(&Config) -> Vec<HostProblem>,
        warn: impl FnOnce(&Config) -> Vec<String>,
    ) -> Result<Examined, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::examine(
            &text,
            &path.display().to_string(),
            more,
            warn,
        ))
    }

    /// Every problem and every warning of config text in one run. Each top-level table and each
    /// `[[source]]` is read on its own, so a mistake in one (a wrong type, an unknown key) leaves
    /// the others read and checked: their values ([`Config::problems`]), the host's
    /// (`more`, [`crate::preflight`]) and the warnings (`warn` and [`Config::warnings`]). What
    /// is said of a table that could not be read is left out (its defaults stood in for it).
    pub fn examine(
        text: &str,
        origin: &str,
        more: impl FnOnce(&Config) -> Vec<HostProblem>,
        warn: impl FnOnce(&Config) -> Vec<String>,
    ) -> Examined {
        let written = Written::scan(text, origin);
        let failed = |problems| Examined {
            config: None,
            problems,
            warnings: Vec::new(),
            transient: false,
        };
        let document = match text.parse::<toml::Table>() {
            Ok(t) => t,
            Err(e) => return failed(vec![written.toml_error(&e, text)]),
        };
        // Ok: `key: problem` still to be located; Err: a toml error's line, located already.
        let mut problems: Vec<Result<String, String>> = Vec::new();
        if let Err(lines) = every_error(text, &written, toml::from_str::<Tables>) {
            problems.extend(lines.into_iter().map(Err));
        }
        // The tables that could not be read: what is said of their stand-in defaults is not said.
        let mut unread: Vec<&str> = Vec::new();
        let rig: Option<RigConfig> = read_each(text, &written, "rig", &mut problems, &mut unread);
        let clock: Option<ClockConfig> =
            read_each(text, &written, "clock", &mut problems, &mut unread);
        let pulsar: Option<PulsarConfig> =
            read_each(text, &written, "pulsar", &mut problems, &mut unread);
        let spool: Option<SpoolConfig> =
            read_each(text, &written, "spool", &mut problems, &mut unread);
        let web: Option<WebConfig> = read_each(text, &written, "web", &mut problems, &mut unread);
        let heads: Vec<Option<&toml::Value>> = match document.get("source") {
            Some(toml::Value::Array(tables)) => tables.iter().map(|t| t.get("kind")).collect(),
            _ => Vec::new(),
        };
        let mut sources = Vec::new();
        let mut source_index = Vec::new();
        for (i, head) in heads.iter().enumerate() {
            match head.map(|k| k.as_str()) {
                None => problems.push(Ok(format!(
                    "source[{i}]: missing field `kind` (one of {})",
                    source_kinds_list()
                ))),
                Some(None) => problems.push(Ok(format!(
                    "source[{i}].kind: must be a string, one of {}",
                    source_kinds_list()
                ))),
                Some(Some(kind)) if !source_kinds().any(|k| k == kind) => {
                    problems.push(Ok(format!(
                        "source[{i}].kind: unknown kind `{kind}` (one of {})",
                        source_kinds_list()
                    )))
                }
                Some(Some(kind)) => {
                    match every_error(text, &written, |t| read_source(t, i, kind)) {
                        Ok(s) => {
                            sources.push(s);
                            source_index.push(i);
                        }
                        Err(lines) => problems.extend(lines.into_iter().map(Err)),
                    }
                }
            }
        }
        if rig.is_none() && !unread.contains(&"rig") {
            problems.insert(
                0,
                Ok("rig: missing table [rig] (every config needs one, with id = \"...\")".into()),
            );
            unread.push("rig");
        }
        let mut lines: Vec<String> = problems
            .into_iter()
            .map(|p| p.map_or_else(|done| done, |p| written.lines(vec![p]).remove(0)))
            .collect();
        let complete = lines.is_empty();
        let config = Config {
            rig: rig.unwrap_or_else(|| RigConfig {
                id: "unread".into(),
                bucket_ms: default_bucket_ms(),
                worker_threads: default_worker_threads(),
            }),
            clock: clock.unwrap_or_default(),
            sources,
            pulsar: pulsar.unwrap_or_default(),
            spool: spool.unwrap_or_default(),
            web: web.unwrap_or_default(),
            written,
            source_index,
            sourceless: heads.is_empty(),
            unread: unread.clone(),
        };
        // `rig.bucket-ms: ...` is the rig table's; `source[1].fps: ...` a source's (those that
        // could not be read are not in `config.sources`).
        let said = |p: &String| {
            let table = p.split(['.', ':', '[', ' ']).next().unwrap_or("");
            !unread.contains(&table)
        };
        let own: Vec<String> = config.problems().into_iter().filter(said).collect();
        let host: Vec<HostProblem> = more(&config)
            .into_iter()
            .filter(|p| said(&p.text().to_string()))
            .collect();
        let transient = complete
            && own.is_empty()
            && !host.is_empty()
            && host.iter().all(|p| matches!(p, HostProblem::NotReady(_)));
        let mut found = own;
        found.extend(host.into_iter().map(|p| match p {
            HostProblem::Config(p) | HostProblem::NotReady(p) => p,
        }));
        lines.extend(config.written.lines(found));
        // In file order (what names no line, the file as a whole, first), as an editor goes.
        let line_no = |l: &String| -> usize {
            l.strip_prefix(origin)
                .and_then(|r| r.strip_prefix(':'))
                .and_then(|r| r.split(':').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        lines.sort_by_key(line_no);
        let mut warnings = config.warnings();
        warnings.extend(warn(&config));
        let warnings = warnings
            .into_iter()
            .filter(said)
            .map(|w| format!("warning: {w}"))
            .collect::<Vec<_>>();
        let mut warnings = config.written.lines(warnings);
        warnings.sort_by_key(line_no);
        Examined {
            config: complete.then_some(config),
            problems: lines,
            warnings,
            transient,
        }
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
            let key = self.source_key(i);
            let limits = Limits {
                max_frame_bytes: self.pulsar.max_frame_bytes.0,
                bucket_ms: self.rig.bucket_ms,
            };
            s.problems(&mut p, &key, limits);
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
        proxy_id_problems(self, &mut p);
        self.group_problems(&mut p);
        self.pulsar.problems(&mut p);
        self.spool.problems(&mut p);
        self.web.problems(&mut p);
        p
    }

    /// The rig's group width in buckets: the `gop` of its video sources, 1 without video. A
    /// group is the key of every message of the rig (a GOP never split across Key_Shared
    /// consumers or partitions, and every modality of a group together), so every video source
    /// must have the same `gop` ([`Config::problems`]).
    pub fn group_buckets(&self) -> u32 {
        self.sources
            .iter()
            .find_map(|s| s.gop(self.rig.bucket_ms))
            .unwrap_or(1)
            .max(1)
    }

    /// Video sources whose `gop` differs from the first one's: one group width per rig.
    fn group_problems(&self, p: &mut Vec<String>) {
        let mut first: Option<(usize, u32)> = None;
        for (i, s) in self.sources.iter().enumerate() {
            let Some(gop) = s.gop(self.rig.bucket_ms) else {
                continue;
            };
            match first {
                None => first = Some((i, gop)),
                Some((j, g)) if g != gop => p.push(format!(
                    "{}.gop: {gop} differs from {}.gop ({g}): a rig's video sources share one group width (the message key of every source)",
                    self.source_key(i),
                    self.source_key(j)
                )),
                Some(_) => {}
            }
        }
    }

    /// What `check` says without refusing the config (`key: what to know`), from the config
    /// alone; the host's are [`crate::preflight::warnings`].
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        self.web.warnings(&mut w);
        if self.pulsar.url.is_none() {
            for (i, s) in self.sources.iter().enumerate() {
                if s.head().upload == Upload::OnRequest {
                    w.push(format!(
                        "{}.upload: \"on-request\" without [pulsar] url: no recall can ever reach this rig, so `{}`'s frames are only kept and evicted (retain-age / retain-bytes), never uploaded",
                        self.source_key(i),
                        s.id()
                    ));
                }
            }
        }
        w
    }

    /// What a config that parses must still have to run a rig: a source (the library's own
    /// configs, in tests, may have none; `run` and `check` refuse a file without one, through
    /// [`crate::preflight`]).
    pub fn rig_problems(&self) -> Vec<String> {
        if self.sourceless {
            vec![format!(
                "source: no [[source]] table: a rig captures nothing without one (add [[source]] with id = \"...\" and kind = one of {})",
                source_kinds_list()
            )]
        } else {
            Vec::new()
        }
    }

    /// Whether table `name` (`web`, `spool`, ...) was read from the file, not stood in for by its
    /// defaults because it could not be read: the host checks skip what the file did not say
    /// (the default web port of a `[web]` with a typo is no port of this rig).
    pub fn was_read(&self, name: &str) -> bool {
        !self.unread.contains(&name)
    }

    /// How messages name `sources[i]`: `source[N]`, N its index in the file.
    pub fn source_key(&self, i: usize) -> String {
        format!("source[{}]", self.source_index.get(i).copied().unwrap_or(i))
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
        let (rate, channels) = match &s.kind {
            SourceKind::SyntheticAudio(c) => (c.sample_rate, c.channels),
            SourceKind::Alsa(c) => (c.sample_rate, c.channels),
            SourceKind::SyntheticCamera(_)
            | SourceKind::SyntheticSerial(_)
            | SourceKind::Serial(_)
            | SourceKind::V4l(_)
            | SourceKind::Proxy(_)
            | SourceKind::Can(_)
            | SourceKind::SyntheticCan(_) => return None,
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

/// Reads table `name` with [`read_table`]; its errors go to `problems` and its name to `unread`.
fn read_each<T: serde::de::DeserializeOwned>(
    text: &str,
    written: &Written,
    name: &'static str,
    problems: &mut Vec<Result<String, String>>,
    unread: &mut Vec<&'static str>,
) -> Option<T> {
    every_error(text, written, |t| read_table(t, name)).unwrap_or_else(|lines| {
        problems.extend(lines.into_iter().map(Err));
        unread.push(name);
        None
    })
}

/// Reads a token file (`pulsar.token-file`, `web.token-file`, `--token-file`): its content without
/// surrounding whitespace; a file that cannot be read or holds nothing is an error, which names it.
/// A token shorter than this is refused: a guess away (the web token guards pause, markers and
/// spool clear; the Pulsar token the fleet's topics).
pub const MIN_TOKEN_CHARS: usize = 16;

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

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests;
