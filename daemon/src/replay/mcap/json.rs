//! The JSON encoding of `rigd replay --mcap --encoding json`: Foxglove's JSON schemas
//! (`jsonschema`), bytes as base64 strings the way those schemas carry them, and in each message
//! the frame's `seq`, `bucket` and `clock`. Pure.

use base64::Engine;
use rigd_drivers::{Frame, Media};

use crate::foxglove::{COMPRESSED_IMAGE, COMPRESSED_VIDEO, RAW_AUDIO};
use crate::wire::Bucket;

const TIME: &str = r#"{"type":"object","title":"time","properties":{"sec":{"type":"integer","minimum":0},"nsec":{"type":"integer","minimum":0,"maximum":999999999}}}"#;

pub fn schema(name: &str) -> String {
    if name == crate::foxglove::can::CAN_FRAME {
        return crate::foxglove::can::can_frame_json_schema();
    }
    let props = match name {
        COMPRESSED_IMAGE | COMPRESSED_VIDEO => {
            r#""frame_id":{"type":"string"},"data":{"type":"string","contentEncoding":"base64"},"format":{"type":"string"}"#
        }
        RAW_AUDIO => {
            r#""data":{"type":"string","contentEncoding":"base64"},"format":{"type":"string"},"sample_rate":{"type":"integer","minimum":0},"number_of_channels":{"type":"integer","minimum":0}"#
        }
        _ => {
            r#""level":{"type":"integer","enum":[0,1,2,3,4,5]},"message":{"type":"string"},"name":{"type":"string"},"file":{"type":"string"},"line":{"type":"integer","minimum":0}"#
        }
    };
    format!(
        r#"{{"title":"{name}","type":"object","properties":{{"timestamp":{TIME},{props},"clock":{{"type":"string"}},"seq":{{"type":"integer"}},"bucket":{{"type":"integer"}}}}}}"#
    )
}

/// The JSON message of a frame, appended to `out` (cleared first). Pure.
pub fn message(f: &Frame, bucket_ms: u32, out: &mut String) {
    use std::fmt::Write;
    out.clear();
    let ns = f.capture_ns.max(0);
    let _ = write!(
        out,
        r#"{{"timestamp":{{"sec":{},"nsec":{}}},"clock":"{}","seq":{},"bucket":{},"#,
        ns / 1_000_000_000,
        ns % 1_000_000_000,
        f.clock.as_str(),
        f.seq,
        Bucket::of(f.capture_ns, bucket_ms).0
    );
    let b64 = &base64::engine::general_purpose::STANDARD;
    let source = serde_json::to_string(&*f.source).unwrap_or_default();
    match &f.media {
        Media::Camera { codec, .. } => {
            let format = codec.as_str();
            let _ = write!(out, r#""frame_id":{source},"format":"{format}","data":""#);
            b64.encode_string(&f.payload, out);
            out.push_str("\"}");
        }
        Media::Audio {
            sample_rate,
            channels,
            ..
        } => {
            let _ = write!(
                out,
                r#""format":"pcm-s16","sample_rate":{sample_rate},"number_of_channels":{channels},"data":""#
            );
            b64.encode_string(&f.payload, out);
            out.push_str("\"}");
        }
        Media::Serial { .. } | Media::Can { .. } => {
            let text = matches!(f.media, Media::Serial { text: true });
            let msg = match std::str::from_utf8(&f.payload) {
                Ok(s) if text => s.trim_end_matches(['\r', '\n']).to_string(),
                _ => format!("base64:{}", b64.encode(&f.payload)),
            };
            let _ = write!(
                out,
                r#""level":2,"name":{source},"file":"","line":0,"message":{}}}"#,
                serde_json::to_string(&msg).unwrap_or_default()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foxglove::LOG;
    use bytes::Bytes;
    use rigd_drivers::ClockState;

    fn frame(media: Media, payload: &'static [u8]) -> Frame {
        Frame {
            source: "s".into(),
            seq: 9,
            capture_ns: 1_700_000_000_123_456_789,
            clock: ClockState::Locked,
            media,
            payload: Bytes::from_static(payload),
        }
    }

    #[test]
    fn messages_are_json_with_the_foxglove_fields() {
        let mut out = String::new();
        message(&frame(Media::jpeg(2, 2), b"\xff\xd8"), 33, &mut out);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["timestamp"]["sec"], 1_700_000_000);
        assert_eq!(v["timestamp"]["nsec"], 123_456_789);
        assert_eq!(v["format"], "jpeg");
        assert_eq!(v["data"], "/9g=");
        assert_eq!(v["frame_id"], "s");
        message(
            &frame(Media::Serial { text: true }, b"$GP\"x\r\n"),
            33,
            &mut out,
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["message"], "$GP\"x");
        assert_eq!(v["level"], 2);
        message(
            &frame(
                Media::Audio {
                    sample_rate: 8000,
                    channels: 1,
                    frames: 1,
                },
                b"\x01\x00",
            ),
            33,
            &mut out,
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["sample_rate"], 8000);
        assert_eq!(v["number_of_channels"], 1);
        for name in [COMPRESSED_IMAGE, COMPRESSED_VIDEO, RAW_AUDIO, LOG] {
            let s: serde_json::Value = serde_json::from_str(&schema(name)).unwrap();
            assert_eq!(s["title"], name);
        }
    }
}
