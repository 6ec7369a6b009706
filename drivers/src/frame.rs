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
    /// A CAN bus: one record per bus per bucket ([`crate::can_record`]).
    Can,
}

impl Modality {
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Camera => "camera",
            Modality::Audio => "audio",
            Modality::Serial => "serial",
            Modality::Can => "can",
        }
    }
}

/// How a camera frame's image is coded: a property of the frame, so that what may be dropped,
/// cut out or shown alone follows from the frame and not from its modality.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// One JPEG image per frame: every frame stands alone.
    #[default]
    Jpeg,
    /// One H.264 access unit per frame, Annex B; a keyframe (IDR) carries its SPS and PPS and
    /// starts a group, the frames after it need it and every frame since (no B-frames).
    H264,
}

impl Codec {
    /// The `codec` property.
    pub fn as_str(self) -> &'static str {
        match self {
            Codec::Jpeg => "jpeg",
            Codec::H264 => "h264",
        }
    }

    /// The `content-type` property of a frame in this codec.
    pub fn content_type(self) -> &'static str {
        match self {
            Codec::Jpeg => "image/jpeg",
            Codec::H264 => "video/h264",
        }
    }

    /// Every frame decodes alone (dropping or cutting out any one leaves the others whole).
    pub fn intra_only(self) -> bool {
        match self {
            Codec::Jpeg => true,
            Codec::H264 => false,
        }
    }
}

/// The first bucket of the group of `gop` buckets that holds `bucket` (groups start at bucket 0,
/// so every source of a rig cuts the same groups); `gop` 1 (or 0) is the bucket itself.
pub fn group_start(bucket: i64, gop: u32) -> i64 {
    let gop = i64::from(gop.max(1));
    bucket.div_euclid(gop) * gop
}

/// Per-modality description of the payload; decides the content type and the extra properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Media {
    /// An image, or a video frame: `codec` says which; `keyframe` is true for a frame that
    /// decodes alone (every JPEG, an H.264 IDR).
    Camera {
        width: u32,
        height: u32,
        codec: Codec,
        keyframe: bool,
    },
    /// Interleaved signed 16-bit little-endian PCM.
    Audio {
        sample_rate: u32,
        channels: u16,
        frames: u32,
    },
    /// One serial record; `text` when it is a printable line (NMEA, line framing).
    Serial { text: bool },
    /// The frames one CAN bus carried within one bucket, `frames` of them, in the record format
    /// of [`crate::can_record`] (each frame with its own time, id, flags and data).
    Can { frames: u32 },
}

impl Media {
    /// A JPEG image of `width` x `height`.
    pub fn jpeg(width: u32, height: u32) -> Self {
        Media::Camera {
            width,
            height,
            codec: Codec::Jpeg,
            keyframe: true,
        }
    }

    /// Whether the frame decodes alone: not an H.264 frame between keyframes.
    pub fn is_keyframe(&self) -> bool {
        match self {
            Media::Camera { keyframe, .. } => *keyframe,
            Media::Audio { .. } | Media::Serial { .. } | Media::Can { .. } => true,
        }
    }

    pub fn modality(&self) -> Modality {
        match self {
            Media::Camera { .. } => Modality::Camera,
            Media::Audio { .. } => Modality::Audio,
            Media::Serial { .. } => Modality::Serial,
            Media::Can { .. } => Modality::Can,
        }
    }

    /// The `content-type` property.
    pub fn content_type(&self) -> String {
        match self {
            Media::Camera { codec, .. } => codec.content_type().to_string(),
            Media::Audio {
                sample_rate,
                channels,
                ..
            } => {
                format!("audio/L16;rate={sample_rate};channels={channels}")
            }
            Media::Serial { text: true } => "text/plain".to_string(),
            Media::Serial { text: false } => "application/octet-stream".to_string(),
            Media::Can { .. } => crate::can_record::CONTENT_TYPE.to_string(),
        }
    }

    /// The per-modality properties (name, value), in a stable order.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        match self {
            Media::Camera {
                width,
                height,
                codec,
                keyframe,
            } => {
                let mut f = vec![("width", width.to_string()), ("height", height.to_string())];
                // A JPEG frame says nothing new (every one stands alone), as before codecs.
                if !codec.intra_only() {
                    f.push(("codec", codec.as_str().to_string()));
                    f.push(("keyframe", keyframe.to_string()));
                }
                f
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
            Media::Can { frames } => vec![("frames", frames.to_string())],
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
