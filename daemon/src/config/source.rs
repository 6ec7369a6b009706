//! `[[source]]`: the head every source shares (id, kind, priority, drain) as the kind enum, one
//! struct per kind with its settings for the driver and its own `problems()`, and the reading of
//! each table as its kind.

use super::*;

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

    /// The device file the source opens, for kinds that open one (checked by `check`: a USB
    /// device may appear later, so a missing one is a warning).
    pub fn device_file(&self) -> Option<&str> {
        match self {
            SourceConfig::Serial(c) => Some(&c.device),
            SourceConfig::V4l(c) => Some(&c.device),
            _ => None,
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

    /// The settings every kind shares besides its id.
    pub fn head(&self) -> Head {
        let head = |priority, drain, upload, retain_age, retain_bytes| Head {
            priority,
            drain,
            upload,
            retain_age,
            retain_bytes,
        };
        match self {
            SourceConfig::SyntheticCamera(c) => {
                head(c.priority, c.drain, c.upload, c.retain_age, c.retain_bytes)
            }
            SourceConfig::SyntheticAudio(c) => {
                head(c.priority, c.drain, c.upload, c.retain_age, c.retain_bytes)
            }
            SourceConfig::SyntheticSerial(c) => {
                head(c.priority, c.drain, c.upload, c.retain_age, c.retain_bytes)
            }
            SourceConfig::Serial(c) => {
                head(c.priority, c.drain, c.upload, c.retain_age, c.retain_bytes)
            }
            SourceConfig::Alsa(c) => {
                head(c.priority, c.drain, c.upload, c.retain_age, c.retain_bytes)
            }
            SourceConfig::V4l(c) => {
                head(c.priority, c.drain, c.upload, c.retain_age, c.retain_bytes)
            }
        }
    }

    /// The uplink priority (0 first): `priority`, or the modality's default.
    pub fn priority(&self) -> u8 {
        self.head()
            .priority
            .unwrap_or_else(|| default_priority(self.modality()))
    }

    pub fn drain(&self) -> Drain {
        self.head().drain
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

    /// The source this config describes, ready to run (as Vector's `SourceConfig::build`: a kind's
    /// config and how it opens live side by side, so a new kind is one variant here plus its driver).
    pub fn open(
        &self,
        bucket_ms: u32,
        clock: std::sync::Arc<dyn rigd_drivers::FrameClock>,
    ) -> Box<dyn rigd_drivers::Source> {
        use rigd_drivers::synthetic::{SyntheticAudio, SyntheticCamera, SyntheticSerial};
        match self {
            SourceConfig::SyntheticCamera(c) => Box::new(SyntheticCamera::new(
                &c.id,
                c.width,
                c.height,
                c.fps,
                c.frame_bytes.map(|b| b.0 as usize),
                c.format,
                clock,
            )),
            SourceConfig::SyntheticAudio(c) => Box::new(SyntheticAudio::new(
                &c.id,
                c.sample_rate,
                c.channels,
                c.tone_hz,
                bucket_ms,
                clock,
            )),
            SourceConfig::SyntheticSerial(c) => {
                Box::new(SyntheticSerial::new(&c.id, c.rate_hz, clock))
            }
            SourceConfig::Serial(c) => Box::new(rigd_drivers::serial::SerialSource::new(
                &c.id,
                c.settings(bucket_ms),
                clock,
            )),
            SourceConfig::Alsa(c) => Box::new(rigd_drivers::audio::AudioSource::new(
                &c.id,
                c.settings(bucket_ms),
                clock,
            )),
            SourceConfig::V4l(c) => Box::new(rigd_drivers::v4l::CameraSource::new(
                &c.id,
                c.settings(),
                clock,
            )),
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

/// What every `[[source]]` table may say besides its id and kind ([`SourceConfig::head`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub priority: Option<u8>,
    pub drain: Drain,
    pub upload: Upload,
    pub retain_age: Option<Age>,
    pub retain_bytes: Option<ByteSize>,
}

/// `[[source]] upload`: whether frames go to Pulsar as they are captured (`live`), or stay on the
/// rig, within their retention, until a recall asks for them (`on-request`; docs/RECALL.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Upload {
    #[default]
    Live,
    OnRequest,
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
pub(super) fn read_source(
    text: &str,
    index: usize,
    kind: &str,
) -> Result<SourceConfig, toml::de::Error> {
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

pub(super) fn nth_source<T: serde::de::DeserializeOwned>(
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
    /// `live` (default) or `on-request`: kept on the rig and uploaded only when asked for.
    #[serde(default)]
    pub upload: Upload,
    /// On-rig retention of an on-request source: its frames older than this are evicted.
    pub retain_age: Option<Age>,
    /// ... and its oldest frames beyond this many bytes.
    pub retain_bytes: Option<ByteSize>,
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
    /// `live` (default) or `on-request`: kept on the rig and uploaded only when asked for.
    #[serde(default)]
    pub upload: Upload,
    /// On-rig retention of an on-request source: its frames older than this are evicted.
    pub retain_age: Option<Age>,
    /// ... and its oldest frames beyond this many bytes.
    pub retain_bytes: Option<ByteSize>,
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
    /// `live` (default) or `on-request`: kept on the rig and uploaded only when asked for.
    #[serde(default)]
    pub upload: Upload,
    /// On-rig retention of an on-request source: its frames older than this are evicted.
    pub retain_age: Option<Age>,
    /// ... and its oldest frames beyond this many bytes.
    pub retain_bytes: Option<ByteSize>,
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
    /// `live` (default) or `on-request`: kept on the rig and uploaded only when asked for.
    #[serde(default)]
    pub upload: Upload,
    /// On-rig retention of an on-request source: its frames older than this are evicted.
    pub retain_age: Option<Age>,
    /// ... and its oldest frames beyond this many bytes.
    pub retain_bytes: Option<ByteSize>,
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

    pub(super) fn problems(&self, p: &mut Vec<String>, key: &str) {
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
    /// `live` (default) or `on-request`: kept on the rig and uploaded only when asked for.
    #[serde(default)]
    pub upload: Upload,
    /// On-rig retention of an on-request source: its frames older than this are evicted.
    pub retain_age: Option<Age>,
    /// ... and its oldest frames beyond this many bytes.
    pub retain_bytes: Option<ByteSize>,
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

    pub(super) fn problems(&self, p: &mut Vec<String>, key: &str) {
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
    /// `live` (default) or `on-request`: kept on the rig and uploaded only when asked for.
    #[serde(default)]
    pub upload: Upload,
    /// On-rig retention of an on-request source: its frames older than this are evicted.
    pub retain_age: Option<Age>,
    /// ... and its oldest frames beyond this many bytes.
    pub retain_bytes: Option<ByteSize>,
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

    pub(super) fn problems(&self, p: &mut Vec<String>, key: &str) {
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
        rate(p, key, "fps", self.fps, FPS);
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

/// A camera's frames per second: one every 100 s (a slow-link test's 0.05 is inside) to 1000.
const FPS: (f64, f64, &str) = (0.01, 1000.0, "frames per second");
/// A synthetic serial source's sentences per second.
const RATE_HZ: (f64, f64, &str) = (0.01, 10_000.0, "sentences per second");

/// A rate (per second) must be a number in `range` (low, high, unit): `fps = 1e-9` is one frame
/// in 31 years, a typo rather than a setting, and the message says what is allowed.
fn rate(p: &mut Vec<String>, key: &str, name: &str, v: f64, range: (f64, f64, &str)) {
    let (low, high, unit) = range;
    if !(v.is_finite() && (low..=high).contains(&v)) {
        p.push(format!(
            "{key}.{name}: {v} is outside the allowed range {low} to {high} ({unit})"
        ));
    }
}

/// Any rate in range: one that does not give a whole number of samples per bucket (44.1 kHz at
/// 33 ms) makes blocks of two lengths, each inside its bucket
/// (`rigd_drivers::audio::frames_in_bucket`).
pub(super) fn sample_rate_problems(p: &mut Vec<String>, key: &str, rate: u32) {
    if !(8_000..=384_000).contains(&rate) {
        p.push(format!(
            "{key}.sample-rate: {rate} must be between 8000 and 384000"
        ));
    }
}

impl SourceConfig {
    /// What is wrong with this source alone (its head and its kind's settings); `key` names it
    /// (`source[1]`), `max_frame_bytes` is `pulsar.max-frame-bytes`.
    pub(super) fn problems(&self, p: &mut Vec<String>, key: &str, max_frame_bytes: u64) {
        if !is_name(self.id()) {
            p.push(format!("{key}.id: `{}` must match [a-z0-9-]+", self.id()));
        }
        if self.id() == EVENTS_SOURCE {
            p.push(format!(
                "{key}.id: `events` is reserved for technician event markers"
            ));
        }
        if self.id().len() > MAX_SOURCE_ID_BYTES {
            p.push(format!(
                "{key}.id: {} bytes long, at most {MAX_SOURCE_ID_BYTES} (the spool record holds it)",
                self.id().len()
            ));
        }
        if self.priority() > MAX_PRIORITY {
            p.push(format!(
                "{key}.priority: {} must be between 0 (first) and {MAX_PRIORITY}",
                self.priority()
            ));
        }
        let head = self.head();
        if head.upload == Upload::Live {
            // Retention after delivery (a live source keeping what was acked) is not built yet:
            // said, not ignored.
            for (name, set) in [
                ("retain-age", head.retain_age.is_some()),
                ("retain-bytes", head.retain_bytes.is_some()),
            ] {
                if set {
                    p.push(format!(
                        "{key}.{name}: only for upload = \"on-request\" (a live source's frames leave the rig once the broker has them)"
                    ));
                }
            }
        }
        if head
            .retain_age
            .is_some_and(|a| a.0 < std::time::Duration::from_secs(1))
        {
            p.push(format!("{key}.retain-age: must be at least 1s"));
        }
        if head.retain_bytes.is_some_and(|b| b.0 < 1 << 20) {
            p.push(format!("{key}.retain-bytes: must be at least 1MiB"));
        }
        match self {
            SourceConfig::SyntheticCamera(c) => {
                rate(p, key, "fps", c.fps, FPS);
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
                    if b.0 > max_frame_bytes {
                        p.push(format!(
                            "{key}.frame-bytes: {} is above pulsar.max-frame-bytes ({})",
                            b.0, max_frame_bytes
                        ));
                    }
                }
            }
            SourceConfig::SyntheticAudio(c) => {
                sample_rate_problems(p, key, c.sample_rate);
                if !(1..=32).contains(&c.channels) {
                    p.push(format!(
                        "{key}.channels: {} must be between 1 and 32",
                        c.channels
                    ));
                }
                let nyquist = c.sample_rate as f64 / 2.0;
                rate(
                    p,
                    key,
                    "tone-hz",
                    c.tone_hz,
                    (1.0, nyquist, "hertz, below half the sample rate"),
                );
            }
            SourceConfig::Serial(c) => c.problems(p, key),
            SourceConfig::Alsa(c) => c.problems(p, key),
            SourceConfig::V4l(c) => c.problems(p, key),
            SourceConfig::SyntheticSerial(c) => {
                rate(p, key, "rate-hz", c.rate_hz, RATE_HZ);
            }
        }
    }
}
