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

/// The config `rigd run` uses when none is given: synthetic sources, no broker, spool in ./rigd-spool.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../examples/synthetic.toml");

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
}

fn default_bucket_ms() -> u32 {
    33
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    #[default]
    Udp4,
    L2,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockTarget {
    #[default]
    Virtual,
    System,
    Phc,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DelayMechanism {
    /// End-to-end: delay requests to the master (works through switches and bridges).
    #[default]
    E2e,
    /// Peer-to-peer: peer delay requests to the link neighbour (needs P2P-capable switches).
    P2p,
}

/// `[clock]`: the PTP slave port and the clock it disciplines. Intervals are log2 seconds, as in
/// PTP (`-3` = 8 per second); they must match the grandmaster's.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClockConfig {
    /// Network interface for PTP; absent: no PTP, the clock stays `unsynced`.
    pub interface: Option<String>,
    #[serde(default)]
    pub transport: Transport,
    #[serde(default)]
    pub domain: u8,
    #[serde(default)]
    pub target: ClockTarget,
    #[serde(default)]
    pub delay_mechanism: DelayMechanism,
    /// The master's sync interval (log2 s).
    #[serde(default)]
    pub log_sync_interval: i8,
    /// The master's announce interval (log2 s).
    #[serde(default = "default_log_announce_interval")]
    pub log_announce_interval: i8,
    /// How often this port sends delay requests (log2 s).
    #[serde(default)]
    pub log_min_delay_req_interval: i8,
    /// Announce intervals without an announce before the master counts as lost.
    #[serde(default = "default_announce_receipt_timeout")]
    pub announce_receipt_timeout: u8,
    /// Offsets larger than this are corrected by a step, smaller ones by slewing.
    #[serde(default = "default_step_threshold_ns")]
    pub step_threshold_ns: u64,
    /// |offset| at or below this for `lock-samples` samples in a row: locked.
    #[serde(default = "default_lock_threshold_ns")]
    pub lock_threshold_ns: u64,
    /// |offset| above this for `lock-samples` samples in a row: no longer locked.
    #[serde(default = "default_unlock_threshold_ns")]
    pub unlock_threshold_ns: u64,
    #[serde(default = "default_lock_samples")]
    pub lock_samples: u32,
    /// Holdover (master lost, last frequency kept) lasts this long, then the clock is unsynced.
    #[serde(default = "default_holdover_timeout_s")]
    pub holdover_timeout_s: u64,
    /// Frequency error assumed during holdover, for the reported drift estimate.
    #[serde(default = "default_holdover_drift_ppb")]
    pub holdover_drift_ppb: f64,
    /// Testing knob: the virtual clock starts this far off CLOCK_REALTIME.
    #[serde(default)]
    pub simulate_offset_ns: i64,
    /// Testing knob: the virtual clock's oscillator runs this many ppm fast.
    #[serde(default)]
    pub simulate_ppm: f64,
}

fn default_log_announce_interval() -> i8 {
    1
}
fn default_announce_receipt_timeout() -> u8 {
    3
}
fn default_step_threshold_ns() -> u64 {
    1_000_000
}
fn default_lock_threshold_ns() -> u64 {
    1_000
}
fn default_unlock_threshold_ns() -> u64 {
    10_000
}
fn default_lock_samples() -> u32 {
    16
}
fn default_holdover_timeout_s() -> u64 {
    600
}
fn default_holdover_drift_ppb() -> f64 {
    100.0
}

impl Default for ClockConfig {
    fn default() -> Self {
        Self {
            interface: None,
            transport: Transport::Udp4,
            domain: 0,
            target: ClockTarget::Virtual,
            delay_mechanism: DelayMechanism::E2e,
            log_sync_interval: 0,
            log_announce_interval: default_log_announce_interval(),
            log_min_delay_req_interval: 0,
            announce_receipt_timeout: default_announce_receipt_timeout(),
            step_threshold_ns: default_step_threshold_ns(),
            lock_threshold_ns: default_lock_threshold_ns(),
            unlock_threshold_ns: default_unlock_threshold_ns(),
            lock_samples: default_lock_samples(),
            holdover_timeout_s: default_holdover_timeout_s(),
            holdover_drift_ppb: default_holdover_drift_ppb(),
            simulate_offset_ns: 0,
            simulate_ppm: 0.0,
        }
    }
}

impl ClockConfig {
    fn problems(&self, p: &mut Vec<String>) {
        if self.interface.as_deref() == Some("") {
            p.push("clock.interface: must not be empty (leave it out for no PTP)".to_string());
        }
        if self.interface.as_ref().is_some_and(|i| i.len() > 15) {
            p.push(
                "clock.interface: longer than 15 characters, not a Linux interface name"
                    .to_string(),
            );
        }
        if self.target == ClockTarget::Phc {
            p.push(
                "clock.target: `phc` is not implemented (it needs hardware timestamping); use `virtual` or `system`"
                    .to_string(),
            );
        }
        if self.target == ClockTarget::System
            && (self.simulate_offset_ns != 0 || self.simulate_ppm != 0.0)
        {
            p.push(
                "clock.simulate-offset-ns / simulate-ppm: testing knobs of the virtual clock, not allowed with target = \"system\""
                    .to_string(),
            );
        }
        for (key, v) in [
            ("log-sync-interval", self.log_sync_interval),
            ("log-announce-interval", self.log_announce_interval),
            (
                "log-min-delay-req-interval",
                self.log_min_delay_req_interval,
            ),
        ] {
            if !(-7..=4).contains(&v) {
                p.push(format!(
                    "clock.{key}: {v} must be between -7 and 4 (log2 seconds)"
                ));
            }
        }
        if self.announce_receipt_timeout < 2 {
            p.push("clock.announce-receipt-timeout: must be at least 2".to_string());
        }
        if self.step_threshold_ns < 1_000 {
            p.push("clock.step-threshold-ns: must be at least 1000".to_string());
        }
        if self.lock_threshold_ns == 0 {
            p.push("clock.lock-threshold-ns: must be at least 1".to_string());
        }
        if self.unlock_threshold_ns < self.lock_threshold_ns {
            p.push("clock.unlock-threshold-ns: must not be below lock-threshold-ns".to_string());
        }
        if !(1..=1000).contains(&self.lock_samples) {
            p.push("clock.lock-samples: must be between 1 and 1000".to_string());
        }
        if !(self.holdover_drift_ppb.is_finite() && self.holdover_drift_ppb >= 0.0) {
            p.push("clock.holdover-drift-ppb: must be a number >= 0".to_string());
        }
        if !(self.simulate_ppm.is_finite() && self.simulate_ppm.abs() <= 200.0) {
            p.push("clock.simulate-ppm: must be between -200 and 200".to_string());
        }
        if self.simulate_offset_ns.unsigned_abs() > 3_600_000_000_000 {
            p.push("clock.simulate-offset-ns: must be within one hour".to_string());
        }
    }
}

/// One capture source; `kind` selects the driver (and the struct its table is read as).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SourceConfig {
    SyntheticCamera(SyntheticCameraConfig),
    SyntheticAudio(SyntheticAudioConfig),
    SyntheticSerial(SyntheticSerialConfig),
    Serial(SerialSourceConfig),
    Alsa(AlsaSourceConfig),
    V4l(V4lSourceConfig),
}

impl SourceConfig {
    pub fn id(&self) -> &str {
        match self {
            SourceConfig::SyntheticCamera(c) => &c.id,
            SourceConfig::SyntheticAudio(c) => &c.id,
            SourceConfig::SyntheticSerial(c) => &c.id,
            SourceConfig::Serial(c) => &c.id,
            SourceConfig::Alsa(c) => &c.id,
            SourceConfig::V4l(c) => &c.id,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::SyntheticCamera(_) => "synthetic-camera",
            SourceConfig::SyntheticAudio(_) => "synthetic-audio",
            SourceConfig::SyntheticSerial(_) => "synthetic-serial",
            SourceConfig::Serial(_) => "serial",
            SourceConfig::Alsa(_) => "alsa",
            SourceConfig::V4l(_) => "v4l",
        }
    }

    /// The uplink priority (0 first): `priority`, or the modality's default.
    pub fn priority(&self) -> u8 {
        let written = match self {
            SourceConfig::SyntheticCamera(c) => c.priority,
            SourceConfig::SyntheticAudio(c) => c.priority,
            SourceConfig::SyntheticSerial(c) => c.priority,
            SourceConfig::Serial(c) => c.priority,
            SourceConfig::Alsa(c) => c.priority,
            SourceConfig::V4l(c) => c.priority,
        };
        written.unwrap_or_else(|| default_priority(self.modality()))
    }

    pub fn drain(&self) -> Drain {
        match self {
            SourceConfig::SyntheticCamera(c) => c.drain,
            SourceConfig::SyntheticAudio(c) => c.drain,
            SourceConfig::SyntheticSerial(c) => c.drain,
            SourceConfig::Serial(c) => c.drain,
            SourceConfig::Alsa(c) => c.drain,
            SourceConfig::V4l(c) => c.drain,
        }
    }

    /// What the source's frames are (the `modality` property and the status page's card).
    pub fn modality(&self) -> Modality {
        match self {
            SourceConfig::SyntheticCamera(_) | SourceConfig::V4l(_) => Modality::Camera,
            SourceConfig::SyntheticAudio(_) | SourceConfig::Alsa(_) => Modality::Audio,
            SourceConfig::SyntheticSerial(_) | SourceConfig::Serial(_) => Modality::Serial,
        }
    }

    /// The time between two frames when frames come at a rate (cameras: `fps`, synthetic serial:
    /// `rate-hz`, audio: one block per bucket); `None` for serial devices, which send when they
    /// have something to say.
    pub fn frame_interval(&self, bucket_ms: u32) -> Option<std::time::Duration> {
        let per_second = |hz: f64| {
            (hz.is_finite() && hz > 0.0).then(|| std::time::Duration::from_secs_f64(1.0 / hz))
        };
        match self {
            SourceConfig::SyntheticCamera(c) => per_second(c.fps),
            SourceConfig::V4l(c) => per_second(c.fps),
            SourceConfig::SyntheticSerial(c) => per_second(c.rate_hz),
            SourceConfig::SyntheticAudio(_) | SourceConfig::Alsa(_) => {
                Some(std::time::Duration::from_millis(bucket_ms as u64))
            }
            SourceConfig::Serial(_) => None,
        }
    }
}

pub use rigd_drivers::Modality;

/// The lowest uplink priority (0 is the highest).
pub const MAX_PRIORITY: u8 = 9;

/// A source's uplink priority when its table says none: serial 0, audio 1, camera 2 (small and
/// urgent first).
pub fn default_priority(m: Modality) -> u8 {
    match m {
        Modality::Serial => 0,
        Modality::Audio => 1,
        Modality::Camera => 2,
    }
}

/// `[[source]] drain`: after an outage, whether new frames go out live while the backlog drains
/// with what the budget leaves (`live-first`), or wait behind it (`in-order`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Drain {
    #[default]
    LiveFirst,
    InOrder,
}

/// The `kind`s a `[[source]]` may have.
pub const SOURCE_KINDS: [&str; 6] = [
    "synthetic-camera",
    "synthetic-audio",
    "synthetic-serial",
    "serial",
    "alsa",
    "v4l",
];

/// Reads `[[source]]` number `index` of `text` as the struct of `kind` (one of [`SOURCE_KINDS`]).
/// The whole document is deserialized again with everything but that table skipped, so errors
/// carry toml's own span and key.
fn read_source(text: &str, index: usize, kind: &str) -> Result<SourceConfig, toml::de::Error> {
    Ok(match kind {
        "synthetic-camera" => SourceConfig::SyntheticCamera(nth_source(text, index)?),
        "synthetic-audio" => SourceConfig::SyntheticAudio(nth_source(text, index)?),
        "synthetic-serial" => SourceConfig::SyntheticSerial(nth_source(text, index)?),
        "serial" => SourceConfig::Serial(nth_source(text, index)?),
        "alsa" => SourceConfig::Alsa(nth_source(text, index)?),
        "v4l" => SourceConfig::V4l(nth_source(text, index)?),
        other => unreachable!("kind {other} was checked against SOURCE_KINDS"),
    })
}

fn nth_source<T: serde::de::DeserializeOwned>(
    text: &str,
    index: usize,
) -> Result<T, toml::de::Error> {
    use serde::de::{Error, MapAccess, SeqAccess, Visitor};
    use std::marker::PhantomData;
    struct Document<T>(usize, PhantomData<T>);
    struct Nth<T>(usize, PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Document<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a config document")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<String>()? {
                if key == "source" {
                    found = Some(map.next_value_seed(Nth(self.0, PhantomData))?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            found.ok_or_else(|| A::Error::custom("no [[source]] tables"))
        }
    }
    impl<'de, T: Deserialize<'de>> serde::de::DeserializeSeed<'de> for Nth<T> {
        type Value = T;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Nth<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("[[source]] tables")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
            let mut found = None;
            let mut i = 0;
            loop {
                if i == self.0 {
                    found = seq.next_element::<T>()?;
                    if found.is_none() {
                        break;
                    }
                } else if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                i += 1;
            }
            found.ok_or_else(|| A::Error::custom("fewer [[source]] tables than expected"))
        }
    }
    serde::Deserializer::deserialize_map(
        toml::Deserializer::new(text),
        Document(index, PhantomData),
    )
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SyntheticCameraConfig {
    pub id: String,
    /// Read before the table is (it chose this struct).
    #[serde(default, rename = "kind", skip_serializing)]
    _kind: IgnoredAny,
    /// Uplink priority, 0 (first) to 9; absent: by modality ([`default_priority`]).
    pub priority: Option<u8>,
    /// How a backlog drains after an outage.
    #[serde(default)]
    pub drain: Drain,
    #[serde(default = "default_width")]
    pub width: u32,
    #[serde(default = "default_height")]
    pub height: u32,
    #[serde(default = "default_fps")]
    pub fps: f64,
    /// Pads each JPEG to this many bytes (large-frame tests).
    pub frame_bytes: Option<ByteSize>,
    /// `mjpeg`: JPEGs handed over; `yuyv`: raw frames encoded as a raw V4L2 camera's are.
    #[serde(default)]
    pub format: rigd_drivers::synthetic::CameraFormat,
}

fn default_width() -> u32 {
    640
}
fn default_height() -> u32 {
    480
}
fn default_fps() -> f64 {
    30.0
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SyntheticAudioConfig {
    pub id: String,
    /// Read before the table is (it chose this struct).
    #[serde(default, rename = "kind", skip_serializing)]
    _kind: IgnoredAny,
    /// Uplink priority, 0 (first) to 9; absent: by modality ([`default_priority`]).
    pub priority: Option<u8>,
    /// How a backlog drains after an outage.
    #[serde(default)]
    pub drain: Drain,
    #[serde(default = "default_sample_rate")]
    pub sample_rate: u32,
    #[serde(default = "default_channels")]
    pub channels: u16,
    #[serde(default = "default_tone_hz")]
    pub tone_hz: f64,
}

fn default_sample_rate() -> u32 {
    48_000
}
fn default_channels() -> u16 {
    2
}
fn default_tone_hz() -> f64 {
    440.0
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SyntheticSerialConfig {
    pub id: String,
    /// Read before the table is (it chose this struct).
    #[serde(default, rename = "kind", skip_serializing)]
    _kind: IgnoredAny,
    /// Uplink priority, 0 (first) to 9; absent: by modality ([`default_priority`]).
    pub priority: Option<u8>,
    /// How a backlog drains after an outage.
    #[serde(default)]
    pub drain: Drain,
    #[serde(default = "default_rate_hz")]
    pub rate_hz: f64,
}

fn default_rate_hz() -> f64 {
    10.0
}

/// `kind = "serial"`: a serial sensor on a tty (rigd-drivers `serial` feature).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SerialSourceConfig {
    pub id: String,
    /// Read before the table is (it chose this struct).
    #[serde(default, rename = "kind", skip_serializing)]
    _kind: IgnoredAny,
    /// Uplink priority, 0 (first) to 9; absent: by modality ([`default_priority`]).
    pub priority: Option<u8>,
    /// How a backlog drains after an outage.
    #[serde(default)]
    pub drain: Drain,
    /// Device path, e.g. `/dev/ttyUSB0` or a udev symlink; required.
    pub device: String,
    #[serde(default = "default_baud")]
    pub baud: u32,
    /// `none` | `odd` | `even`.
    #[serde(default)]
    pub parity: rigd_drivers::serial::Parity,
    /// `none` | `software` (XON/XOFF) | `hardware` (RTS/CTS).
    #[serde(default)]
    pub flow_control: rigd_drivers::serial::FlowControl,
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    /// `line` | `nmea` | `raw`.
    #[serde(default)]
    pub framing: rigd_drivers::serial::Framing,
    /// Record delimiter of `line` framing (a `\r` before a `\n` delimiter is stripped too).
    #[serde(default = "default_delimiter")]
    pub delimiter: String,
    /// Longer lines and sentences are dropped (counted); raw records are cut at this size.
    #[serde(default = "default_max_record_bytes")]
    pub max_record_bytes: ByteSize,
}

fn default_baud() -> u32 {
    9600
}
fn default_data_bits() -> u8 {
    8
}
fn default_stop_bits() -> u8 {
    1
}
fn default_delimiter() -> String {
    "\n".to_string()
}
fn default_max_record_bytes() -> ByteSize {
    ByteSize(4096)
}

impl SerialSourceConfig {
    pub fn settings(&self, bucket_ms: u32) -> rigd_drivers::serial::SerialSettings {
        rigd_drivers::serial::SerialSettings {
            device: self.device.clone(),
            baud: self.baud,
            parity: self.parity,
            flow_control: self.flow_control,
            data_bits: self.data_bits,
            stop_bits: self.stop_bits,
            framing: self.framing,
            delimiter: self.delimiter.as_bytes().to_vec(),
            max_record_bytes: self.max_record_bytes.0 as usize,
            bucket_ms,
        }
    }

    fn problems(&self, p: &mut Vec<String>, key: &str) {
        if self.device.is_empty() {
            p.push(format!("{key}.device: must not be empty"));
        }
        no_nul(p, &format!("{key}.device"), &self.device);
        if !(50..=4_000_000).contains(&self.baud) {
            p.push(format!(
                "{key}.baud: {} must be between 50 and 4000000",
                self.baud
            ));
        }
        if !(5..=8).contains(&self.data_bits) {
            p.push(format!(
                "{key}.data-bits: {} must be 5, 6, 7 or 8",
                self.data_bits
            ));
        }
        if !(1..=2).contains(&self.stop_bits) {
            p.push(format!(
                "{key}.stop-bits: {} must be 1 or 2",
                self.stop_bits
            ));
        }
        if self.delimiter.is_empty() || self.delimiter.len() > 8 {
            p.push(format!("{key}.delimiter: must be 1 to 8 bytes"));
        }
        if self.max_record_bytes.0 == 0 || self.max_record_bytes.0 > 1 << 20 {
            p.push(format!(
                "{key}.max-record-bytes: {} must be between 1 and 1MiB",
                self.max_record_bytes.0
            ));
        }
    }
}

/// `kind = "alsa"`: an ALSA capture device (rigd-drivers `audio` feature).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AlsaSourceConfig {
    pub id: String,
    /// Read before the table is (it chose this struct).
    #[serde(default, rename = "kind", skip_serializing)]
    _kind: IgnoredAny,
    /// Uplink priority, 0 (first) to 9; absent: by modality ([`default_priority`]).
    pub priority: Option<u8>,
    /// How a backlog drains after an outage.
    #[serde(default)]
    pub drain: Drain,
    /// ALSA PCM name (`default`, `hw:CARD=USB,DEV=0`, `plughw:1,0`, a pcm from asoundrc) or the
    /// card's description as `arecord -L` shows it.
    #[serde(default = "default_alsa_device")]
    pub device: String,
    #[serde(default = "default_sample_rate")]
    pub sample_rate: u32,
    #[serde(default = "default_channels")]
    pub channels: u16,
    /// Format the device is opened with: `i16` | `i32` | `f32`; frames are always S16LE.
    #[serde(default)]
    pub sample_format: rigd_drivers::audio::SampleFormat,
    /// ALSA period in frames; absent: the device's default.
    pub period_frames: Option<u32>,
    /// A jump between the sample count and the stream's timestamps larger than this re-aligns
    /// blocks to buckets (the lost blocks counted as drops); smaller drift is followed smoothly.
    #[serde(default = "default_max_skew_ms")]
    pub max_skew_ms: u32,
}

fn default_alsa_device() -> String {
    "default".to_string()
}
fn default_max_skew_ms() -> u32 {
    50
}

impl AlsaSourceConfig {
    pub fn settings(&self, bucket_ms: u32) -> rigd_drivers::audio::AudioSettings {
        rigd_drivers::audio::AudioSettings {
            device: self.device.clone(),
            sample_rate: self.sample_rate,
            channels: self.channels,
            sample_format: self.sample_format,
            period_frames: self.period_frames,
            max_skew_ms: self.max_skew_ms,
            bucket_ms,
        }
    }

    fn problems(&self, p: &mut Vec<String>, key: &str) {
        if self.device.is_empty() {
            p.push(format!("{key}.device: must not be empty"));
        }
        no_nul(p, &format!("{key}.device"), &self.device);
        sample_rate_problems(p, key, self.sample_rate);
        if !(1..=32).contains(&self.channels) {
            p.push(format!(
                "{key}.channels: {} must be between 1 and 32",
                self.channels
            ));
        }
        if let Some(n) = self.period_frames {
            if !(16..=self.sample_rate.max(16)).contains(&n) {
                p.push(format!(
                    "{key}.period-frames: {n} must be between 16 and one second of frames"
                ));
            }
        }
        if !(1..=60_000).contains(&self.max_skew_ms) {
            p.push(format!(
                "{key}.max-skew-ms: {} must be between 1 and 60000",
                self.max_skew_ms
            ));
        }
    }
}

/// `kind = "v4l"`: a V4L2 camera (rigd-drivers `v4l` feature).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct V4lSourceConfig {
    pub id: String,
    /// Read before the table is (it chose this struct).
    #[serde(default, rename = "kind", skip_serializing)]
    _kind: IgnoredAny,
    /// Uplink priority, 0 (first) to 9; absent: by modality ([`default_priority`]).
    pub priority: Option<u8>,
    /// How a backlog drains after an outage.
    #[serde(default)]
    pub drain: Drain,
    /// A device path (`/dev/video0`, a udev symlink) or the card name as `v4l2-ctl --list-devices`
    /// shows it (looked up among /dev/video* at every open).
    #[serde(default = "default_v4l_device")]
    pub device: String,
    /// Requested size and rate; the driver may snap them, and frames carry its answer.
    #[serde(default = "default_width")]
    pub width: u32,
    #[serde(default = "default_height")]
    pub height: u32,
    #[serde(default = "default_fps")]
    pub fps: f64,
    /// Pixel formats in order of preference: `MJPG` (passed through), `YUYV`, `NV12` (encoded).
    #[serde(default = "default_v4l_formats")]
    pub formats: Vec<rigd_drivers::v4l::PixelFormat>,
    /// mmap buffers to request from the driver.
    #[serde(default = "default_v4l_buffers")]
    pub buffers: u32,
    /// JPEG quality for YUYV and NV12 frames.
    #[serde(default = "default_jpeg_quality")]
    pub jpeg_quality: u8,
}

fn default_v4l_device() -> String {
    "/dev/video0".to_string()
}
fn default_v4l_formats() -> Vec<rigd_drivers::v4l::PixelFormat> {
    use rigd_drivers::v4l::PixelFormat;
    vec![PixelFormat::Mjpg, PixelFormat::Yuyv, PixelFormat::Nv12]
}
fn default_v4l_buffers() -> u32 {
    4
}
fn default_jpeg_quality() -> u8 {
    80
}

impl V4lSourceConfig {
    pub fn settings(&self) -> rigd_drivers::v4l::CameraSettings {
        rigd_drivers::v4l::CameraSettings {
            device: self.device.clone(),
            width: self.width,
            height: self.height,
            fps: self.fps,
            formats: self.formats.clone(),
            buffers: self.buffers,
            jpeg_quality: self.jpeg_quality,
        }
    }

    fn problems(&self, p: &mut Vec<String>, key: &str) {
        if self.device.is_empty() {
            p.push(format!("{key}.device: must not be empty"));
        }
        no_nul(p, &format!("{key}.device"), &self.device);
        for (name, v) in [("width", self.width), ("height", self.height)] {
            if v == 0 || v > 16_384 {
                p.push(format!("{key}.{name}: {v} must be between 1 and 16384"));
            } else if v % 2 != 0 {
                // YUYV and NV12 pack two pixels' chroma together.
                p.push(format!("{key}.{name}: {v} must be even"));
            }
        }
        positive(p, key, "fps", self.fps);
        if self.fps > 1000.0 {
            p.push(format!("{key}.fps: {} is above 1000", self.fps));
        }
        if self.formats.is_empty() {
            p.push(format!("{key}.formats: must name at least one format"));
        }
        let mut seen = std::collections::HashSet::new();
        for f in &self.formats {
            if !seen.insert(f) {
                p.push(format!("{key}.formats: {} is listed twice", f.as_str()));
            }
        }
        if !(2..=32).contains(&self.buffers) {
            p.push(format!(
                "{key}.buffers: {} must be between 2 and 32",
                self.buffers
            ));
        }
        if !(1..=100).contains(&self.jpeg_quality) {
            p.push(format!(
                "{key}.jpeg-quality: {} must be between 1 and 100",
                self.jpeg_quality
            ));
        }
    }
}

/// Any rate in range: one that does not give a whole number of samples per bucket (44.1 kHz at
/// 33 ms) makes blocks of two lengths, each inside its bucket
/// (`rigd_drivers::audio::frames_in_bucket`).
fn sample_rate_problems(p: &mut Vec<String>, key: &str, rate: u32) {
    if !(8_000..=384_000).contains(&rate) {
        p.push(format!(
            "{key}.sample-rate: {rate} must be between 8000 and 384000"
        ));
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PulsarConfig {
    /// `pulsar://host:port` or `pulsar+ssl://host:port`; absent: no uplink, everything spools.
    pub url: Option<String>,
    /// Topic template; placeholders `{rig}` and `{source}`.
    #[serde(default = "default_topic")]
    pub topic: String,
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) that sign the broker's certificate for `pulsar+ssl://`; absent: the
    /// Mozilla root set.
    pub tls_ca_file: Option<PathBuf>,
    /// Device identity for mutual TLS: the rig's client certificate chain (PEM) and its private
    /// key (PEM, PKCS#8, PKCS#1 or SEC1); the broker's TLS authentication provider maps it to a role.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// End-to-end encryption: the fleet's RSA public key (PEM). Every payload is encrypted in
    /// Pulsar's format for it, and the spool holds only ciphertext.
    pub encryption_key_file: Option<PathBuf>,
    /// The name consumers' CryptoKeyReader looks the private key up by.
    pub encryption_key_name: Option<String>,
    /// A new data key this often (the official clients: every 4 hours).
    #[serde(default = "default_encryption_key_rotation_s")]
    pub encryption_key_rotation_s: u64,
    #[serde(default)]
    pub compression: Compression,
    /// Messages awaiting a receipt, per source.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Bytes awaiting a receipt, per source.
    #[serde(default = "default_max_in_flight_bytes")]
    pub max_in_flight_bytes: ByteSize,
    /// Frames above this are refused (counted), whatever the broker accepts with chunking.
    #[serde(default = "default_max_frame_bytes")]
    pub max_frame_bytes: ByteSize,
    /// How long a send may wait for its receipt before the connection is considered dead.
    #[serde(default = "default_send_timeout_ms")]
    pub send_timeout_ms: u64,
    /// Small frames of one bucket key go out together in a batch message of at most this many
    /// frames (1: no batching).
    #[serde(default = "default_batch_max_messages")]
    pub batch_max_messages: usize,
    /// ... and at most this many bytes (payload and properties).
    #[serde(default = "default_batch_max_bytes")]
    pub batch_max_bytes: ByteSize,
    /// ... held at most this long waiting for more frames of the same key.
    #[serde(default = "default_batch_delay_ms")]
    pub batch_delay_ms: u64,
    /// One budget for all that rigd sends to the broker (every source, framing included);
    /// absent: unlimited.
    pub max_bandwidth: Option<Bandwidth>,
}

/// Batching defaults (the Java client's): 1000 messages, 128 KiB, 1 ms.
fn default_batch_max_messages() -> usize {
    1000
}
fn default_batch_max_bytes() -> ByteSize {
    ByteSize(128 << 10)
}
fn default_batch_delay_ms() -> u64 {
    1
}

fn default_encryption_key_rotation_s() -> u64 {
    4 * 3600
}

fn default_topic() -> String {
    crate::wire::DEFAULT_TOPIC.to_string()
}
fn default_max_in_flight() -> usize {
    500
}
fn default_max_in_flight_bytes() -> ByteSize {
    ByteSize(64 << 20)
}
fn default_max_frame_bytes() -> ByteSize {
    ByteSize(50 << 20)
}
fn default_send_timeout_ms() -> u64 {
    30_000
}

impl Default for PulsarConfig {
    fn default() -> Self {
        Self {
            url: None,
            topic: default_topic(),
            token_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            encryption_key_file: None,
            encryption_key_name: None,
            encryption_key_rotation_s: default_encryption_key_rotation_s(),
            compression: Compression::None,
            max_in_flight: default_max_in_flight(),
            max_in_flight_bytes: default_max_in_flight_bytes(),
            max_frame_bytes: default_max_frame_bytes(),
            send_timeout_ms: default_send_timeout_ms(),
            batch_max_messages: default_batch_max_messages(),
            batch_max_bytes: default_batch_max_bytes(),
            batch_delay_ms: default_batch_delay_ms(),
            max_bandwidth: None,
        }
    }
}

impl PulsarConfig {
    /// The topic of one source.
    pub fn topic_for(&self, rig: &str, source: &str) -> String {
        crate::wire::topic(&self.topic, rig, source)
    }
}

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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct WebConfig {
    #[serde(default = "default_bind")]
    pub bind: String,
    /// Control actions are disabled without it.
    pub token_file: Option<PathBuf>,
    /// Certificate chain (PEM) for HTTPS; with `tls-key-file` the UI and API are served over
    /// TLS only (plain HTTP is refused), so the control token never crosses the rig's network in
    /// clear.
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: Option<PathBuf>,
    /// Networks whose clients get an answer at all, reads included (`10.0.0.0/8`, `fe80::/10`,
    /// a bare address); absent: loopback, RFC 1918, link-local and IPv6 ULA, the networks next
    /// to the rig (`rigd_web::access`). `["0.0.0.0/0", "::/0"]` answers everyone.
    pub allow_from: Option<Vec<String>>,
}

fn default_bind() -> String {
    "127.0.0.1:8088".to_string()
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            bind: default_bind(),
            token_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            allow_from: None,
        }
    }
}

impl WebConfig {
    /// The networks allowed to connect (see `allow_from`); entries that do not parse are
    /// [`Config::problems`].
    pub fn allow_list(&self) -> rigd_web::access::AllowList {
        match &self.allow_from {
            None => rigd_web::access::AllowList::private(),
            Some(nets) => rigd_web::access::AllowList::new(
                nets.iter().filter_map(|n| n.parse().ok()).collect(),
            ),
        }
    }
}

/// A bit rate written as tc writes one: "1800kbit", "2mbit", "64000bit" (SI: k = 1000). Held in
/// bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bandwidth(pub u64);

impl Bandwidth {
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite())
            .ok_or_else(|| format!("`{s}` is not a rate like 1800kbit"))?;
        let mult = match unit.trim().to_ascii_lowercase().as_str() {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            other => {
                return Err(format!(
                    "unknown rate unit `{other}` in `{s}` (use bit, kbit, mbit, gbit)"
                ))
            }
        };
        let bits = n * mult;
        if bits >= u64::MAX as f64 {
            return Err(format!("`{s}` is too large"));
        }
        Ok(Bandwidth(bits.round() as u64))
    }

    pub fn bytes_per_second(self) -> u64 {
        self.0 / 8
    }
}

impl Serialize for Bandwidth {
    /// As written: `"1800000bit"` (what [`Bandwidth::parse`] reads back).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}bit", self.0))
    }
}

impl<'de> Deserialize<'de> for Bandwidth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Bandwidth::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A byte count written as an integer or a string with a unit ("8GiB", "512 MiB", "64k").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("`{s}` is not a size like 512MiB"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "tib" => 1 << 40,
            other => {
                return Err(format!(
                    "unknown size unit `{other}` (use B, KiB, MiB, GiB, TiB)"
                ))
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("`{s}` is too large"))
    }
}

impl ByteSize {
    /// `2.1 GiB`, `512 B`: for people (not parsed back).
    pub fn human(self) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            format!("{} B", self.0)
        } else {
            format!("{v:.1} {}", UNITS[u])
        }
    }
}

impl Serialize for ByteSize {
    /// In bytes, an integer (what the config reads back).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Size;
        impl serde::de::Visitor<'_> for Size {
            type Value = ByteSize;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number of bytes or a size like \"512MiB\"")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<ByteSize, E> {
                u64::try_from(n)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("size must not be negative, got {n}")))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ByteSize, E> {
                ByteSize::parse(s).map_err(E::custom)
            }
        }
        d.deserialize_any(Size)
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, |_| Vec::new())
    }

    /// As [`Config::load`], reporting the problems `more` finds in a config that parses (the
    /// host's, [`crate::preflight`]) with its own.
    pub fn load_with(
        path: &Path,
        more: impl FnOnce(&Config) -> Vec<String>,
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
        more: impl FnOnce(&Config) -> Vec<String>,
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
        if problems.is_empty() && !host.is_empty() {
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
        self.clock.problems(&mut p);
        if let Some(i) = &self.clock.interface {
            no_nul(&mut p, "clock.interface", i);
        }
        let mut seen = std::collections::HashSet::new();
        for (i, s) in self.sources.iter().enumerate() {
            let key = format!("source[{i}]");
            if !is_name(s.id()) {
                p.push(format!("{key}.id: `{}` must match [a-z0-9-]+", s.id()));
            }
            if !seen.insert(s.id()) {
                p.push(format!("{key}.id: `{}` is used by another source", s.id()));
            }
            if s.id() == EVENTS_SOURCE {
                p.push(format!(
                    "{key}.id: `events` is reserved for technician event markers"
                ));
            }
            if s.id().len() > MAX_SOURCE_ID_BYTES {
                p.push(format!(
                    "{key}.id: {} bytes long, at most {MAX_SOURCE_ID_BYTES} (the spool record holds it)",
                    s.id().len()
                ));
            }
            if s.priority() > MAX_PRIORITY {
                p.push(format!(
                    "{key}.priority: {} must be between 0 (first) and {MAX_PRIORITY}",
                    s.priority()
                ));
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
            match s {
                SourceConfig::SyntheticCamera(c) => {
                    positive(&mut p, &key, "fps", c.fps);
                    if c.fps > 1000.0 {
                        p.push(format!("{key}.fps: {} is above 1000", c.fps));
                    }
                    for (name, v) in [("width", c.width), ("height", c.height)] {
                        if v == 0 || v > 16_384 {
                            p.push(format!("{key}.{name}: {v} must be between 1 and 16384"));
                        }
                    }
                    if c.format == rigd_drivers::synthetic::CameraFormat::Yuyv && c.width % 2 != 0 {
                        // YUYV packs two pixels' chroma together.
                        p.push(format!(
                            "{key}.width: {} must be even with format = \"yuyv\"",
                            c.width
                        ));
                    }
                    if let Some(b) = c.frame_bytes {
                        if b.0 > self.pulsar.max_frame_bytes.0 {
                            p.push(format!(
                                "{key}.frame-bytes: {} is above pulsar.max-frame-bytes ({})",
                                b.0, self.pulsar.max_frame_bytes.0
                            ));
                        }
                    }
                }
                SourceConfig::SyntheticAudio(c) => {
                    sample_rate_problems(&mut p, &key, c.sample_rate);
                    if !(1..=32).contains(&c.channels) {
                        p.push(format!(
                            "{key}.channels: {} must be between 1 and 32",
                            c.channels
                        ));
                    }
                    positive(&mut p, &key, "tone-hz", c.tone_hz);
                }
                SourceConfig::Serial(c) => c.problems(&mut p, &key),
                SourceConfig::Alsa(c) => c.problems(&mut p, &key),
                SourceConfig::V4l(c) => c.problems(&mut p, &key),
                SourceConfig::SyntheticSerial(c) => {
                    positive(&mut p, &key, "rate-hz", c.rate_hz);
                    if c.rate_hz > 10_000.0 {
                        p.push(format!("{key}.rate-hz: {} is above 10000", c.rate_hz));
                    }
                }
            }
        }
        if let Some(url) = &self.pulsar.url {
            match crate::service::service_url(url) {
                Err(why) => p.push(format!("pulsar.url: {why}")),
                // TLS settings with a clear link: the operator believes the link is encrypted
                // (and authenticated by certificate) while it is not.
                Ok(false) => {
                    let tls = [
                        ("pulsar.tls-cert-file", self.pulsar.tls_cert_file.is_some()),
                        ("pulsar.tls-key-file", self.pulsar.tls_key_file.is_some()),
                        ("pulsar.tls-ca-file", self.pulsar.tls_ca_file.is_some()),
                    ];
                    if let Some((key, _)) = tls.iter().find(|(_, set)| *set) {
                        p.push(format!(
                            "{key}: set with a clear pulsar:// URL, so the link would be neither encrypted nor authenticated by certificate; use pulsar+ssl://"
                        ));
                    }
                }
                Ok(true) => {}
            }
        }
        let mut rest = self.pulsar.topic.as_str();
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            match after.find('}') {
                Some(close) => {
                    let name = &after[..close];
                    if name != "rig" && name != "source" {
                        p.push(format!(
                            "pulsar.topic: unknown placeholder `{{{name}}}` (known: {{rig}}, {{source}})"
                        ));
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    p.push("pulsar.topic: `{` without a closing `}`".to_string());
                    break;
                }
            }
        }
        if !self.pulsar.topic.contains("{source}") {
            p.push("pulsar.topic: must contain {source} (one topic per source)".to_string());
        }
        if self.pulsar.max_in_flight == 0 {
            p.push("pulsar.max-in-flight: must be at least 1".to_string());
        }
        if self.pulsar.max_in_flight_bytes.0 < MIN_IN_FLIGHT_BYTES {
            p.push(format!(
                "pulsar.max-in-flight-bytes: {} is below {} (nothing would be sent)",
                self.pulsar.max_in_flight_bytes.0,
                ByteSize(MIN_IN_FLIGHT_BYTES).human()
            ));
        }
        if self.pulsar.send_timeout_ms < 1000 {
            p.push(format!(
                "pulsar.send-timeout-ms: {} is below 1000: it is how long a connection may make no \
                 progress before it counts as dead (the uplink waits at least 10 s)",
                self.pulsar.send_timeout_ms
            ));
        } else if self.pulsar.send_timeout_ms > 3_600_000 {
            p.push(format!(
                "pulsar.send-timeout-ms: {} is above one hour (3600000)",
                self.pulsar.send_timeout_ms
            ));
        }
        for (key, file) in [
            ("pulsar.token-file", &self.pulsar.token_file),
            ("pulsar.tls-ca-file", &self.pulsar.tls_ca_file),
            ("pulsar.tls-cert-file", &self.pulsar.tls_cert_file),
            ("pulsar.tls-key-file", &self.pulsar.tls_key_file),
            (
                "pulsar.encryption-key-file",
                &self.pulsar.encryption_key_file,
            ),
            ("web.token-file", &self.web.token_file),
            ("web.tls-cert-file", &self.web.tls_cert_file),
            ("web.tls-key-file", &self.web.tls_key_file),
        ] {
            if let Some(f) = file {
                no_nul(&mut p, key, &f.to_string_lossy());
                if f.as_os_str().is_empty() {
                    p.push(format!("{key}: must not be empty (leave it out for none)"));
                }
            }
        }
        both(
            &mut p,
            ("web.tls-cert-file", self.web.tls_cert_file.is_some()),
            ("web.tls-key-file", self.web.tls_key_file.is_some()),
            "HTTPS needs both",
        );
        both(
            &mut p,
            ("pulsar.tls-cert-file", self.pulsar.tls_cert_file.is_some()),
            ("pulsar.tls-key-file", self.pulsar.tls_key_file.is_some()),
            "a client certificate needs its key",
        );
        both(
            &mut p,
            (
                "pulsar.encryption-key-file",
                self.pulsar.encryption_key_file.is_some(),
            ),
            (
                "pulsar.encryption-key-name",
                self.pulsar.encryption_key_name.is_some(),
            ),
            "consumers find the private key by the name",
        );
        if let Some(name) = &self.pulsar.encryption_key_name {
            if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
                p.push(
                    "pulsar.encryption-key-name: 1 to 255 bytes, no control characters".to_string(),
                );
            }
        }
        if !(60..=30 * 86_400).contains(&self.pulsar.encryption_key_rotation_s) {
            p.push(format!(
                "pulsar.encryption-key-rotation-s: {} must be between 60 (a minute) and 2592000 (30 days)",
                self.pulsar.encryption_key_rotation_s
            ));
        }
        if self.pulsar.batch_max_messages == 0 {
            p.push(
                "pulsar.batch-max-messages: must be at least 1 (1 turns batching off)".to_string(),
            );
        }
        if self.pulsar.batch_max_bytes.0 < 1 << 10 {
            p.push(format!(
                "pulsar.batch-max-bytes: {} is below 1KiB (batch-max-messages = 1 turns batching off)",
                self.pulsar.batch_max_bytes.0
            ));
        }
        if self.pulsar.batch_max_bytes.0 > 4 << 20 {
            p.push(
                "pulsar.batch-max-bytes: must be at most 4MiB (below the broker's message size)"
                    .to_string(),
            );
        }
        if self.pulsar.batch_delay_ms > 1000 {
            p.push("pulsar.batch-delay-ms: must be at most 1000".to_string());
        }
        if let Some(b) = self.pulsar.max_bandwidth {
            if !(MIN_BANDWIDTH..=MAX_BANDWIDTH).contains(&b.0) {
                p.push(format!(
                    "pulsar.max-bandwidth: {} bit/s must be between 64kbit and 100gbit (below, a 16 KiB grant and a chunk ahead of a keepalive answer can outlast the broker's keepalive)",
                    b.0
                ));
            }
            if self.pulsar.url.is_none() {
                p.push(
                    "pulsar.max-bandwidth: set without pulsar.url (nothing is sent)".to_string(),
                );
            }
        }
        if self.pulsar.max_frame_bytes.0 == 0 || self.pulsar.max_frame_bytes.0 > 1 << 30 {
            p.push("pulsar.max-frame-bytes: must be between 1 and 1GiB".to_string());
        }
        if self.spool.max_bytes.0 < 1 << 20 {
            p.push(format!(
                "spool.max-bytes: {} is below 1MiB",
                self.spool.max_bytes.0
            ));
        }
        if self.spool.fsync_ms == 0 || self.spool.fsync_ms > 60_000 {
            p.push(format!(
                "spool.fsync-ms: {} must be between 1 and 60000",
                self.spool.fsync_ms
            ));
        }
        if self.spool.free_reserve.0 < MIN_FREE_RESERVE {
            p.push(format!(
                "spool.free-reserve: {} is below {} (the spool would fill its filesystem)",
                self.spool.free_reserve.0,
                ByteSize(MIN_FREE_RESERVE).human()
            ));
        }
        if self.spool.path.as_os_str().is_empty() {
            p.push("spool.path: must not be empty".to_string());
        }
        no_nul(&mut p, "spool.path", &self.spool.path.to_string_lossy());
        if self.web.bind.parse::<SocketAddr>().is_err() {
            p.push(format!(
                "web.bind: `{}` is not an address like 127.0.0.1:8088",
                self.web.bind
            ));
        }
        for net in self.web.allow_from.iter().flatten() {
            if let Err(e) = net.parse::<rigd_web::access::Cidr>() {
                p.push(format!("web.allow-from: {e}"));
            }
        }
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

/// Where each key of a config file is written: `table.key` or `table[index].key` (as problems name
/// them) and its line. Read from the text line by line; a key this misses (a dotted key, one in an
/// inline table) is still named in messages, only without its line.
#[derive(Debug, Clone, Default)]
struct Written {
    origin: String,
    /// Keys and table headers in file order.
    keys: Vec<WrittenKey>,
}

#[derive(Debug, Clone)]
struct WrittenKey {
    /// From 1.
    line: usize,
    path: String,
    /// The table of a key; a header's own path.
    table: String,
}

impl Written {
    fn scan(text: &str, origin: &str) -> Self {
        let mut keys = Vec::new();
        let mut table = String::new();
        let mut index: std::collections::HashMap<String, usize> = Default::default();
        for (n, l) in text.lines().enumerate() {
            let t = l.trim();
            let line = n + 1;
            if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
                let i = index.entry(name.trim().to_string()).or_insert(0);
                table = format!("{}[{}]", name.trim(), *i);
                *i += 1;
            } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
                table = name.trim().to_string();
            } else if let Some((k, _)) = t.split_once('=').filter(|_| !t.starts_with('#')) {
                let k = k.trim().trim_matches(['"', '\'']);
                let path = match table.is_empty() {
                    true => k.to_string(),
                    false => format!("{table}.{k}"),
                };
                keys.push(WrittenKey {
                    line,
                    path,
                    table: table.clone(),
                });
                continue;
            } else {
                continue;
            }
            keys.push(WrittenKey {
                line,
                path: table.clone(),
                table: table.clone(),
            });
        }
        Self {
            origin: origin.to_string(),
            keys,
        }
    }

    /// The line `path` (`spool.max-bytes`, `source[1]`) is written on.
    fn line_of(&self, path: &str) -> Option<usize> {
        self.keys.iter().find(|k| k.path == path).map(|k| k.line)
    }

    /// The path written on line `n`: its key, else the table the line is in.
    fn path_at(&self, n: usize) -> Option<&str> {
        let k = self.keys.iter().take_while(|k| k.line <= n).last()?;
        Some(if k.line == n {
            k.path.as_str()
        } else {
            k.table.as_str()
        })
        .filter(|p| !p.is_empty())
    }

    /// `origin:line: key: problem` for each `key: problem` (`origin: ...` when neither the key nor
    /// its table is written, e.g. a default that clashes with another key).
    fn lines(&self, problems: Vec<String>) -> Vec<String> {
        problems
            .into_iter()
            .map(|p| {
                let path = p.split(": ").next().unwrap_or("");
                let mut at = path.split([' ', ',']).next().unwrap_or("");
                let mut line = self.line_of(at);
                // A key left at its default is not written; its table may be.
                while line.is_none() {
                    let Some((table, _)) = at.rsplit_once('.') else {
                        break;
                    };
                    at = table;
                    line = self.line_of(at);
                }
                self.at(line, &p)
            })
            .collect()
    }

    fn at(&self, line: Option<usize>, what: &str) -> String {
        match line {
            Some(n) => format!("{}:{n}: {what}", self.origin),
            None => format!("{}: {what}", self.origin),
        }
    }

    /// One line for a TOML/serde error: file, line, the table and key there, and the message
    /// (with the likely key for a misspelt one).
    fn toml_error(&self, e: &toml::de::Error, text: &str) -> String {
        let msg = did_you_mean(&e.message().trim().replace('\n', " "));
        let Some(span) = e.span() else {
            return self.at(None, &msg);
        };
        let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
        match self.path_at(line) {
            Some(path) => self.at(Some(line), &format!("{path}: {msg}")),
            None => self.at(Some(line), &msg),
        }
    }
}

/// Deserializes the file, reporting every unknown key and wrongly typed value in one run (see
/// [`every_error`]); a syntax error alone is reported as it is.
fn read_file(text: &str, written: &Written) -> Result<File, Vec<String>> {
    if let Err(e) = text.parse::<toml::Table>() {
        return Err(vec![written.toml_error(&e, text)]);
    }
    every_error(text, written, toml::from_str::<File>)
}

/// Runs `parse` on `text`, and after each error (serde stops at the first) again on a working
/// copy with the offending line blanked (line numbers stay), so that every unknown key and
/// wrongly typed value is reported in one run. An error on a table header, or a blanking that
/// breaks the TOML, ends the search.
fn every_error<T>(
    text: &str,
    written: &Written,
    parse: impl Fn(&str) -> Result<T, toml::de::Error>,
) -> Result<T, Vec<String>> {
    let mut work = text.to_string();
    let mut errors: Vec<String> = Vec::new();
    for _ in 0..64 {
        let e = match parse(&work) {
            Ok(value) if errors.is_empty() => return Ok(value),
            Ok(_) => break,
            Err(e) => e,
        };
        let line = written.toml_error(&e, &work);
        if errors.last() == Some(&line) {
            break;
        }
        errors.push(line);
        let Some(span) = e.span() else { break };
        let at = span.start.min(work.len());
        let start = work[..at].rfind('\n').map_or(0, |i| i + 1);
        let end = work[start..].find('\n').map_or(work.len(), |i| start + i);
        let written_line = work[start..end].trim_start();
        if written_line.is_empty() || written_line.starts_with('[') {
            break;
        }
        work.replace_range(start..end, "");
        if work.parse::<toml::Table>().is_err() {
            break;
        }
    }
    Err(errors)
}

/// serde's "unknown field `max-byts`, expected one of `path`, `max-bytes`, ..." (and the same for
/// variants), with "did you mean `max-bytes`?" when one expected name is within two edits.
fn did_you_mean(msg: &str) -> String {
    let quoted = |s: &str| -> Vec<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let Some(rest) = msg
        .strip_prefix("unknown field ")
        .or_else(|| msg.strip_prefix("unknown variant "))
    else {
        return msg.to_string();
    };
    let Some((got, expected)) = rest.split_once(", expected") else {
        return msg.to_string();
    };
    let Some(got) = quoted(got).into_iter().next() else {
        return msg.to_string();
    };
    let best = quoted(expected)
        .into_iter()
        .map(|name| (edit_distance(&got, &name), name))
        .filter(|(d, _)| *d <= 2)
        .min();
    match best {
        Some((_, name)) => format!("{msg}; did you mean `{name}`?"),
        None => msg.to_string(),
    }
}

/// Levenshtein distance (insertions, deletions, substitutions), on chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        match Config::parse(text, "t.toml") {
            Ok(_) => vec![],
            Err(ConfigError::Invalid { problems } | ConfigError::Host { problems }) => problems,
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn identity_and_encryption_keys_come_in_pairs() {
        let p = problems(
            "[rig]\nid = \"a\"\n[pulsar]\ntls-cert-file = \"/c.pem\"\nencryption-key-name = \"k\"\n\
             encryption-key-rotation-s = 10\n",
        );
        let joined = p.join("\n");
        assert!(
            joined.contains("pulsar.tls-cert-file: set without pulsar.tls-key-file"),
            "{joined}"
        );
        assert!(
            joined.contains("pulsar.encryption-key-name: set without pulsar.encryption-key-file"),
            "{joined}"
        );
        assert!(
            joined.contains("pulsar.encryption-key-rotation-s: 10"),
            "{joined}"
        );
        let ok = "[rig]\nid = \"a\"\n[pulsar]\nencryption-key-file = \"/f.pem\"\nencryption-key-name = \"fleet-2026\"\n";
        let c = Config::parse(ok, "t").unwrap();
        assert_eq!(
            c.pulsar.encryption_key_rotation_s,
            4 * 3600,
            "the clients' 4 hours"
        );
    }

    #[test]
    fn shipped_configs_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut n = 0;
        for sub in ["examples", "systemd"] {
            for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "toml") {
                    Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    n += 1;
                }
            }
        }
        assert!(n >= 3, "expected the shipped configs, found {n}");
        Config::parse(EMBEDDED_DEFAULT, "embedded").unwrap();
    }

    #[test]
    fn unknown_key_is_named() {
        let p = problems("[rig]\nid = \"a\"\n[spool]\nmax-byte = 5\n");
        assert_eq!(p.len(), 1);
        assert!(
            p[0].contains("max-byte") && p[0].contains("t.toml:"),
            "{p:?}"
        );
    }

    #[test]
    fn unknown_key_in_source_is_named() {
        let p = problems(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"c\"\nkind = \"synthetic-camera\"\nfsp = 3\n",
        );
        assert!(p[0].contains("fsp") && p[0].contains("source[0]"), "{p:?}");
    }

    #[test]
    fn wrong_type_names_the_key() {
        let p = problems("[rig]\nid = \"a\"\n[web]\nbind = 8088\n");
        assert!(p[0].contains("web.bind") && p[0].contains(":4:"), "{p:?}");
    }

    #[test]
    fn negative_rate_names_the_key() {
        let p = problems("[rig]\nid = \"a\"\n[[source]]\nid = \"s\"\nkind = \"synthetic-serial\"\nrate-hz = -5\n");
        assert_eq!(
            p,
            vec!["t.toml:6: source[0].rate-hz: -5 must be a positive number"]
        );
    }

    #[test]
    fn missing_required_key_is_named() {
        let p = problems("[rig]\nbucket-ms = 33\n");
        assert!(
            p[0].contains("missing field `id`") && p[0].contains("rig"),
            "{p:?}"
        );
    }

    #[test]
    fn unknown_topic_placeholder_is_named() {
        let p = problems(
            "[rig]\nid = \"a\"\n[pulsar]\ntopic = \"persistent://t/n/{rig}-{sensor}-{source}\"\n",
        );
        assert_eq!(p.len(), 1);
        assert!(
            p[0].contains("pulsar.topic") && p[0].contains("{sensor}"),
            "{p:?}"
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let p = problems(
            "[rig]\nid = \"Van 7\"\n[[source]]\nid = \"x\"\nkind = \"synthetic-camera\"\nfps = 0\n\
             [[source]]\nid = \"x\"\nkind = \"synthetic-serial\"\n[web]\nbind = \"nowhere\"\n",
        );
        assert_eq!(p.len(), 4, "{p:?}");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(ByteSize::parse("8GiB").unwrap().0, 8 << 30);
        assert_eq!(ByteSize::parse("512 MiB").unwrap().0, 512 << 20);
        assert_eq!(ByteSize::parse("100").unwrap().0, 100);
        assert!(ByteSize::parse("8 parsecs").is_err());
        assert!(ByteSize::parse("-1").is_err());
    }

    #[test]
    fn serial_and_alsa_sources_have_defaults() {
        let c = Config::parse(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"gps\"\nkind = \"serial\"\ndevice = \"/dev/ttyUSB0\"\n\
             framing = \"nmea\"\n[[source]]\nid = \"mic\"\nkind = \"alsa\"\n",
            "t",
        )
        .unwrap();
        let SourceConfig::Serial(s) = &c.sources[0] else {
            panic!("{:?}", c.sources[0])
        };
        let s = s.settings(33);
        assert_eq!((s.baud, s.data_bits, s.stop_bits), (9600, 8, 1));
        assert_eq!(s.framing, rigd_drivers::serial::Framing::Nmea);
        assert_eq!(
            (s.delimiter.as_slice(), s.max_record_bytes),
            (&b"\n"[..], 4096)
        );
        let SourceConfig::Alsa(a) = &c.sources[1] else {
            panic!("{:?}", c.sources[1])
        };
        let a = a.settings(33);
        assert_eq!(
            (a.device.as_str(), a.sample_rate, a.channels),
            ("default", 48_000, 2)
        );
        assert_eq!(a.sample_format, rigd_drivers::audio::SampleFormat::I16);
        assert_eq!(c.sources[1].kind(), "alsa");
    }

    #[test]
    fn serial_and_alsa_problems_name_the_key() {
        let p = problems(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"gps\"\nkind = \"serial\"\ndevice = \"\"\nbaud = 0\n\
             stop-bits = 3\nmax-record-bytes = \"2MiB\"\n[[source]]\nid = \"mic\"\nkind = \"alsa\"\n\
             sample-rate = 4000\nchannels = 0\n",
        );
        assert_eq!(p.len(), 6, "{p:?}");
        for key in [
            "source[0].device",
            "source[0].baud",
            "source[0].stop-bits",
            "source[0].max-record-bytes",
            "source[1].sample-rate",
            "source[1].channels",
        ] {
            assert!(p.iter().any(|l| l.contains(key)), "{key} missing: {p:?}");
        }
        let p = problems(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"gps\"\nkind = \"serial\"\ndevice = \"/dev/ttyS0\"\nframing = \"json\"\n",
        );
        assert!(p[0].contains("source[0]") && p[0].contains("json"), "{p:?}");
        let p = problems("[rig]\nid = \"a\"\n[[source]]\nid = \"gps\"\nkind = \"serial\"\n");
        assert!(p[0].contains("device"), "{p:?}");
    }

    #[test]
    fn v4l_source_has_defaults_and_problems_name_the_key() {
        use rigd_drivers::v4l::PixelFormat;
        let c = Config::parse(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"front\"\nkind = \"v4l\"\n[[source]]\nid = \"rear\"\n\
             kind = \"v4l\"\ndevice = \"USB Camera\"\nformats = [\"YUYV\"]\nbuffers = 8\n",
            "t",
        )
        .unwrap();
        let SourceConfig::V4l(front) = &c.sources[0] else {
            panic!("{:?}", c.sources[0])
        };
        let s = front.settings();
        assert_eq!(
            (s.device.as_str(), s.width, s.height, s.fps),
            ("/dev/video0", 640, 480, 30.0)
        );
        assert_eq!(
            s.formats,
            [PixelFormat::Mjpg, PixelFormat::Yuyv, PixelFormat::Nv12]
        );
        assert_eq!((s.buffers, s.jpeg_quality), (4, 80));
        assert_eq!(c.sources[0].kind(), "v4l");
        let SourceConfig::V4l(rear) = &c.sources[1] else {
            panic!("{:?}", c.sources[1])
        };
        assert_eq!(rear.settings().device, "USB Camera");
        assert_eq!(rear.settings().formats, [PixelFormat::Yuyv]);

        let p = problems(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"cam\"\nkind = \"v4l\"\ndevice = \"\"\nwidth = 641\n\
             height = 0\nfps = 0\nformats = [\"YUYV\", \"YUYV\"]\nbuffers = 1\njpeg-quality = 0\n",
        );
        assert_eq!(p.len(), 7, "{p:?}");
        for key in [
            "source[0].device",
            "source[0].width",
            "source[0].height",
            "source[0].fps",
            "source[0].formats",
            "source[0].buffers",
            "source[0].jpeg-quality",
        ] {
            assert!(p.iter().any(|l| l.contains(key)), "{key} missing: {p:?}");
        }
        let p =
            problems("[rig]\nid = \"a\"\n[[source]]\nid = \"cam\"\nkind = \"v4l\"\nformats = []\n");
        assert!(p[0].contains("source[0].formats"), "{p:?}");
        let p = problems(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"cam\"\nkind = \"v4l\"\nformats = [\"H264\"]\n",
        );
        assert!(p[0].contains("source[0]") && p[0].contains("H264"), "{p:?}");
        let p = problems(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"cam\"\nkind = \"v4l\"\nbuffer-count = 4\n",
        );
        assert!(p[0].contains("buffer-count"), "{p:?}");
    }

    /// Each malformed config of issue 16 (and more): exactly these `file:line: key` prefixes.
    #[test]
    fn every_message_names_the_table_index_key_and_line() {
        let rig = "[rig]\nid = \"a\"\n";
        let cam = "[[source]]\nid = \"c\"\nkind = \"synthetic-camera\"\n";
        let long = "x".repeat(256);
        let cases: Vec<(String, Vec<&str>)> = vec![
            // A wrong type inside the second source names it, its key and line 9.
            (format!("{rig}{cam}[[source]]\nid = \"d\"\nkind = \"synthetic-camera\"\nwidth = \"wide\"\n"), vec!["t.toml:9: source[1].width:"]),
            (format!("{rig}{cam}fps = \"fast\"\n"), vec!["t.toml:6: source[0].fps:"]),
            (cam.to_string(), vec!["t.toml: rig: missing table [rig]"]),
            (format!("{rig}[spool]\nmax-bytes = 1.5\n"), vec!["t.toml:4: spool.max-bytes: invalid type: floating point"]),
            (format!("{rig}[spool]\nmax-bytes = \"8 parsecs\"\n"), vec!["t.toml:4: spool.max-bytes:"]),
            (format!("{rig}[pulsar]\nmax-in-flight-bytes = -1\n"), vec!["t.toml:4: pulsar.max-in-flight-bytes:"]),
            (format!("{rig}[[source]]\nid = \"x\"\nkind = \"lidar\"\n"), vec!["t.toml:5: source[0].kind: unknown kind `lidar`"]),
            (format!("{rig}[[source]]\nid = \"x\"\n"), vec!["t.toml:3: source[0]: missing field `kind`"]),
            (format!("{rig}{cam}{cam}[[source]]\nkind = \"serial\"\n"), vec!["t.toml:9: source[2]: missing field `id`"]),
            (format!("{rig}[[source]]\nid = \"g\"\nkind = \"serial\"\ndevice = \"/dev/ttyS0\"\nparity = \"weird\"\n"), vec!["t.toml:7: source[0].parity:"]),
            (format!("{rig}{cam}fsp = 3\n"), vec!["t.toml:6: source[0].fsp: unknown field"]),
            (format!("{rig}{cam}format = \"h264\"\n"), vec!["t.toml:6: source[0].format: unknown variant `h264`, expected `mjpeg` or `yuyv`"]),
            (format!("{rig}{cam}format = \"yuyv\"\nwidth = 641\n"), vec!["t.toml:7: source[0].width: 641 must be even with format = \"yuyv\""]),
            // Problems in two sources are both reported.
            (format!("{rig}{cam}fps = \"fast\"\n{cam}height = -1\n"), vec!["t.toml:6: source[0].fps:", "t.toml:10: source[1].height:"]),
            (format!("{rig}[[source]]\nid = \"m\"\nkind = \"alsa\"\nchannels = 2.5\n"), vec!["t.toml:6: source[0].channels:"]),
            (format!("{rig}[[source]]\nid = \"v\"\nkind = \"v4l\"\nformats = \"MJPG\"\n"), vec!["t.toml:6: source[0].formats:"]),
            (format!("{rig}[clock]\ndomain = 300\n"), vec!["t.toml:4: clock.domain:"]),
            (format!("{rig}[clock]\ntransport = \"udp6\"\n"), vec!["t.toml:4: clock.transport:"]),
            (format!("{rig}[spool]\nmode = \"sometimes\"\n"), vec!["t.toml:4: spool.mode:"]),
            (format!("{rig}[pulsar]\ncompression = \"gzip\"\n"), vec!["t.toml:4: pulsar.compression:"]),
            (format!("source = 5\n{rig}"), vec!["t.toml:1: source:"]),
            (format!("{rig}source = 5\n"), vec!["t.toml:3: rig.source: unknown field"]),
            (format!("{rig}[sppol]\npath = \"x\"\n"), vec!["t.toml:3: sppol: unknown field"]),
            ("[rig]\nid = \"Van 7\"\n".to_string(), vec!["t.toml:2: rig.id:"]),
            // Accepted before, broken at run time.
            ("[rig]\nid = \"a\"\nbucket-ms = 4294967295\n".to_string(), vec!["t.toml:3: rig.bucket-ms:"]),
            ("[rig]\nid = \"a\"\nbucket-ms = 0\n".to_string(), vec!["t.toml:3: rig.bucket-ms:"]),
            ("[rig]\nid = \"a\"\nbucket-ms = 1000000\n[[source]]\nid = \"m\"\nkind = \"synthetic-audio\"\n".to_string(),
             vec!["t.toml:3: rig.bucket-ms: 1000000 must be", "t.toml:3: rig.bucket-ms: 1000000 ms makes blocks of 183.1 MiB"]),
            ("[rig]\nid = \"a\"\nbucket-ms = 30000\n[[source]]\nid = \"m\"\nkind = \"alsa\"\n".to_string(), vec!["t.toml:3: rig.bucket-ms: 30000 ms makes blocks"]),
            (format!("{rig}[spool]\nfree-reserve = \"0\"\n"), vec!["t.toml:4: spool.free-reserve:"]),
            (format!("{rig}[pulsar]\nmax-in-flight-bytes = 0\n"), vec!["t.toml:4: pulsar.max-in-flight-bytes:"]),
            (format!("{rig}[pulsar]\nsend-timeout-ms = 0\n"), vec!["t.toml:4: pulsar.send-timeout-ms: 0 is below 1000"]),
            (format!("{rig}[pulsar]\nsend-timeout-ms = 999\n"), vec!["t.toml:4: pulsar.send-timeout-ms:"]),
            (format!("{rig}[pulsar]\nbatch-max-bytes = 0\n"), vec!["t.toml:4: pulsar.batch-max-bytes:"]),
            (format!("{rig}[spool]\npath = \"/var/lib/rigd\\u0000/spool\"\n"), vec!["t.toml:4: spool.path: contains a NUL byte"]),
            (format!("{rig}[pulsar]\ntoken-file = \"/etc/a\\u0000b\"\n"), vec!["t.toml:4: pulsar.token-file: contains a NUL byte"]),
            (format!("{rig}[web]\ntoken-file = \"\"\n"), vec!["t.toml:4: web.token-file: must not be empty"]),
            (format!("{rig}[[source]]\nid = \"g\"\nkind = \"serial\"\ndevice = \"/dev/tty\\u0000S0\"\n"), vec!["t.toml:6: source[0].device: contains a NUL byte"]),
            (format!("{rig}[[source]]\nid = \"{long}\"\nkind = \"synthetic-serial\"\n"), vec!["t.toml:4: source[0].id: 256 bytes long"]),
            // A default that clashes with a written key: the written one's line.
            (format!("{rig}{cam}frame-bytes = \"60MiB\"\n"), vec!["t.toml:6: source[0].frame-bytes:"]),
            // A key left at its default names its table's line, or only the file.
            (format!("{rig}[pulsar]\nmax-frame-bytes = \"512KiB\"\n[[source]]\nid = \"m\"\nkind = \"synthetic-audio\"\nsample-rate = 384000\nchannels = 32\n"),
             vec!["t.toml:1: rig.bucket-ms: 33 ms makes blocks"]),
        ];
        for (text, want) in cases {
            let got = problems(&text);
            assert_eq!(got.len(), want.len(), "{text}\n{got:#?}");
            for (g, w) in got.iter().zip(&want) {
                assert!(g.starts_with(w), "{text}\nwant {w}\ngot  {g}");
            }
        }
    }

    #[test]
    fn topic_template_expands() {
        let c = PulsarConfig::default();
        assert_eq!(
            c.topic_for("van-07", "front"),
            "persistent://public/default/van-07-front"
        );
    }

    #[test]
    fn clock_keys_have_defaults_and_are_validated() {
        let c = Config::parse("[rig]\nid = \"a\"\n[clock]\ninterface = \"eth0\"\n", "t").unwrap();
        assert_eq!(c.clock.log_announce_interval, 1);
        assert_eq!(c.clock.lock_threshold_ns, 1_000);
        assert_eq!(c.clock.delay_mechanism, DelayMechanism::E2e);
        let p = problems(
            "[rig]\nid = \"a\"\n[clock]\ninterface = \"eth0\"\nlog-sync-interval = -9\n\
             lock-threshold-ns = 5000\nunlock-threshold-ns = 10\nsimulate-ppm = 500.0\n",
        );
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("clock.log-sync-interval"), "{p:?}");
        let p = problems("[rig]\nid = \"a\"\n[clock]\ndelay-mechanism = \"e2e\"\nlog-sync = 1\n");
        assert!(p[0].contains("log-sync"), "{p:?}");
    }

    #[test]
    fn clock_targets_system_is_accepted_phc_and_knobs_on_a_real_clock_are_not() {
        let base = "[rig]\nid = \"a\"\n[clock]\ninterface = \"eth0\"\n";
        assert_eq!(
            problems(&format!("{base}target = \"system\"\n")),
            Vec::<String>::new()
        );
        let p = problems(&format!("{base}target = \"phc\"\n"));
        assert!(
            p.len() == 1 && p[0].contains("clock.target: `phc`"),
            "{p:?}"
        );
        let p = problems(&format!("{base}target = \"system\"\nsimulate-ppm = 50.0\n"));
        assert!(p.len() == 1 && p[0].contains("simulate-ppm"), "{p:?}");
    }

    #[test]
    fn bandwidth_priority_and_drain_have_defaults_and_are_validated() {
        let base = "[rig]\nid = \"a\"\n[pulsar]\nurl = \"pulsar://h:6650\"\n";
        let c = Config::parse(
            &format!(
                "{base}max-bandwidth = \"1800kbit\"\n[[source]]\nid = \"g\"\nkind = \"synthetic-serial\"\n\
                 [[source]]\nid = \"m\"\nkind = \"synthetic-audio\"\n[[source]]\nid = \"c\"\n\
                 kind = \"synthetic-camera\"\npriority = 0\ndrain = \"in-order\"\n"
            ),
            "t",
        )
        .unwrap();
        assert_eq!(c.pulsar.max_bandwidth, Some(Bandwidth(1_800_000)));
        assert_eq!(c.pulsar.max_bandwidth.unwrap().bytes_per_second(), 225_000);
        let prio: Vec<_> = c
            .sources
            .iter()
            .map(|s| (s.priority(), s.drain()))
            .collect();
        assert_eq!(
            prio,
            [
                (0, Drain::LiveFirst),
                (1, Drain::LiveFirst),
                (0, Drain::InOrder)
            ]
        );
        assert_eq!(Bandwidth::parse("2mbit"), Ok(Bandwidth(2_000_000)));
        assert_eq!(Bandwidth::parse("1.5mbit"), Ok(Bandwidth(1_500_000)));
        assert!(Bandwidth::parse("2MB").is_err());
        let p = problems(&format!("{base}max-bandwidth = \"1800kb\"\n"));
        assert!(
            p.len() == 1 && p[0].starts_with("t.toml:5: pulsar.max-bandwidth: unknown rate unit"),
            "{p:?}"
        );
        let p = problems(&format!("{base}max-bandwidth = \"10bit\"\n"));
        assert_eq!(
            p,
            ["t.toml:5: pulsar.max-bandwidth: 10 bit/s must be between 64kbit and 100gbit (below, a 16 KiB grant and a chunk ahead of a keepalive answer can outlast the broker's keepalive)"]
        );
        let src = "[[source]]\nid = \"g\"\nkind = \"synthetic-serial\"\n";
        let p = problems(&format!("{base}{src}priority = 10\n"));
        assert_eq!(
            p,
            ["t.toml:8: source[0].priority: 10 must be between 0 (first) and 9"]
        );
        let p = problems(&format!("{base}{src}priority = -1\n"));
        assert!(
            p.len() == 1 && p[0].starts_with("t.toml:8: source[0].priority"),
            "{p:?}"
        );
        let p = problems(&format!("{base}{src}drain = \"newest\"\n"));
        assert!(
            p.len() == 1
                && p[0].starts_with("t.toml:8: source[0].drain")
                && p[0].contains("live-first"),
            "{p:?}"
        );
    }

    #[test]
    fn a_misspelt_key_or_variant_gets_a_suggestion() {
        let p = problems("[rig]\nid = \"a\"\n[spool]\nmax-byts = 5\n");
        assert!(p[0].contains("did you mean `max-bytes`?"), "{p:?}");
        let p = problems("[rig]\nid = \"a\"\n[spool]\nmode = \"alway\"\n");
        assert!(p[0].contains("did you mean `always`?"), "{p:?}");
        let p = problems("[rig]\nid = \"a\"\n[spool]\nzzzzzzzz = 5\n");
        assert!(!p[0].contains("did you mean"), "{p:?}");
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn every_unknown_key_and_type_error_is_reported_in_one_run() {
        let p = problems(
            "[rig]\nid = \"a\"\n[spool]\nmax-byts = 5\nfsync-ms = \"often\"\n[web]\nbnd = \"x\"\n",
        );
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p[0].starts_with("t.toml:4: spool.max-byts")
                && p[0].contains("did you mean `max-bytes`?"),
            "{p:?}"
        );
        assert!(p[1].starts_with("t.toml:5: spool.fsync-ms"), "{p:?}");
        assert!(p[2].starts_with("t.toml:7: web.bnd"), "{p:?}");
        // Inside one [[source]] table as well.
        let p = problems(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"c\"\nkind = \"synthetic-camera\"\nfsp = 3\nwidth = \"wide\"\n",
        );
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("t.toml:6: source[0].fsp"), "{p:?}");
        assert!(p[1].starts_with("t.toml:7: source[0].width"), "{p:?}");
    }
}
