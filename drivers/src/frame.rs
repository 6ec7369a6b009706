//! The frame model: one captured unit of one source, as it travels to the spool and to Pulsar.

use bytes::Bytes;
use serde::Serialize;
use std::sync::Arc;

use crate::ClockState;

/// What kind of sensor a frame comes from; the `modality` property on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Modality {
    Camera,
    Audio,
    Serial,
}

impl Modality {
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Camera => "camera",
            Modality::Audio => "audio",
            Modality::Serial => "serial",
        }
    }
}

/// Per-modality description of the payload; decides the content type and the extra properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Media {
    /// A JPEG image.
    Camera { width: u32, height: u32 },
    /// Interleaved signed 16-bit little-endian PCM.
    Audio {
        sample_rate: u32,
        channels: u16,
        frames: u32,
    },
    /// One serial record; `text` when it is a printable line (NMEA, line framing).
    Serial { text: bool },
}

impl Media {
    pub fn modality(&self) -> Modality {
        match self {
            Media::Camera { .. } => Modality::Camera,
            Media::Audio { .. } => Modality::Audio,
            Media::Serial { .. } => Modality::Serial,
        }
    }

    /// The `content-type` property.
    pub fn content_type(&self) -> String {
        match self {
            Media::Camera { .. } => "image/jpeg".to_string(),
            Media::Audio {
                sample_rate,
                channels,
                ..
            } => {
                format!("audio/L16;rate={sample_rate};channels={channels}")
            }
            Media::Serial { text: true } => "text/plain".to_string(),
            Media::Serial { text: false } => "application/octet-stream".to_string(),
        }
    }

    /// The per-modality properties (name, value), in a stable order.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        match self {
            Media::Camera { width, height } => {
                vec![("width", width.to_string()), ("height", height.to_string())]
            }
            Media::Audio {
                sample_rate,
                channels,
                frames,
            } => vec![
                ("sample-rate", sample_rate.to_string()),
                ("channels", channels.to_string()),
                ("frames", frames.to_string()),
            ],
            Media::Serial { .. } => Vec::new(),
        }
    }
}

/// One captured frame, stamped and sequenced.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Source id from the config (`[a-z0-9-]+`).
    pub source: Arc<str>,
    /// Per-source capture sequence, strictly increasing across restarts.
    pub seq: u64,
    /// Capture time in nanoseconds on the rig clock.
    pub capture_ns: i64,
    /// State of the rig clock when the frame was stamped.
    pub clock: ClockState,
    pub media: Media,
    pub payload: Bytes,
}

impl Frame {
    pub fn modality(&self) -> Modality {
        self.media.modality()
    }
}
