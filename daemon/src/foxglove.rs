//! Foxglove's protobuf message schemas that rigd writes (`foxglove.CompressedImage`,
//! `foxglove.CompressedVideo` for H.264 frames, `foxglove.RawAudio`, `foxglove.LocationFix`, `foxglove.Log`): the messages, a frame's message
//! ([`protobuf_message`], [`location_fix`]), and for each type a `FileDescriptorSet`, the schema
//! of an MCAP channel and of a live-view channel (encoding `protobuf`). Shared by the MCAP export
//! (`replay::mcap`) and the live view (`live`). Pure: no I/O.
//!
//! The descriptors are built here from the field lists Foxglove publishes (names, numbers and
//! types as in its `.proto` files, package `foxglove`, proto3, `google.protobuf.Timestamp` for
//! times), so no generated code and no `protoc` is needed. `LocationFix` carries the fields
//! through `position_covariance_type`; the later optional ones (color, heading, velocity,
//! metadata) are left out, which protobuf readers treat as absent.
//!
//! [`can`]: a CAN source's channels (`rigd.CanFrame`, and the DBC's messages built at run time).

pub mod can;

use bytes::Bytes;
use prost::Message as _;
use rigd_drivers::{Codec, Frame, Media};

use crate::nmea::Fix;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FileDescriptorProto, FileDescriptorSet, Timestamp,
};

pub const COMPRESSED_IMAGE: &str = "foxglove.CompressedImage";
pub const COMPRESSED_VIDEO: &str = "foxglove.CompressedVideo";
pub const RAW_AUDIO: &str = "foxglove.RawAudio";
pub const LOCATION_FIX: &str = "foxglove.LocationFix";
pub const LOG: &str = "foxglove.Log";

/// A time in nanoseconds as a protobuf `Timestamp` (negative times clamp to 0).
pub fn timestamp(ns: i64) -> Option<Timestamp> {
    let ns = ns.max(0);
    Some(Timestamp {
        seconds: ns / 1_000_000_000,
        nanos: (ns % 1_000_000_000) as i32,
    })
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CompressedImage {
    #[prost(message, optional, tag = "1")]
    pub timestamp: Option<Timestamp>,
    #[prost(string, tag = "4")]
    pub frame_id: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub data: Bytes,
    #[prost(string, tag = "3")]
    pub format: String,
}

/// One H.264 access unit (Annex B, SPS/PPS with every keyframe, no B-frames), as Foxglove's
/// `CompressedVideo` requires.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompressedVideo {
    #[prost(message, optional, tag = "1")]
    pub timestamp: Option<Timestamp>,
    #[prost(string, tag = "2")]
    pub frame_id: String,
    #[prost(bytes = "bytes", tag = "3")]
    pub data: Bytes,
    #[prost(string, tag = "4")]
    pub format: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RawAudio {
    #[prost(message, optional, tag = "1")]
    pub timestamp: Option<Timestamp>,
    #[prost(bytes = "bytes", tag = "2")]
    pub data: Bytes,
    #[prost(string, tag = "3")]
    pub format: String,
    #[prost(fixed32, tag = "4")]
    pub sample_rate: u32,
    #[prost(fixed32, tag = "5")]
    pub number_of_channels: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LocationFix {
    #[prost(message, optional, tag = "6")]
    pub timestamp: Option<Timestamp>,
    #[prost(string, tag = "7")]
    pub frame_id: String,
    #[prost(double, tag = "1")]
    pub latitude: f64,
    #[prost(double, tag = "2")]
    pub longitude: f64,
    #[prost(double, tag = "3")]
    pub altitude: f64,
    #[prost(double, repeated, tag = "4")]
    pub position_covariance: Vec<f64>,
    /// UNKNOWN 0, APPROXIMATED 1, DIAGONAL_KNOWN 2, KNOWN 3.
    #[prost(int32, tag = "5")]
    pub position_covariance_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Log {
    #[prost(message, optional, tag = "1")]
    pub timestamp: Option<Timestamp>,
    /// UNKNOWN 0, DEBUG 1, INFO 2, WARNING 3, ERROR 4, FATAL 5.
    #[prost(int32, tag = "2")]
    pub level: i32,
    #[prost(string, tag = "3")]
    pub message: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub file: String,
    #[prost(fixed32, tag = "6")]
    pub line: u32,
}

pub const LOG_INFO: i32 = 2;
pub const LOG_WARNING: i32 = 3;
pub const LOG_ERROR: i32 = 4;

/// A `foxglove.Log` line that is not a frame (the live view's alerts), into `out` (cleared first).
/// Pure.
pub fn log_line(capture_ns: i64, level: i32, name: &str, message: &str, out: &mut Vec<u8>) {
    out.clear();
    let encoded = Log {
        timestamp: timestamp(capture_ns),
        level,
        message: message.to_string(),
        name: name.to_string(),
        file: String::new(),
        line: 0,
    }
    .encode(out);
    debug_assert!(encoded.is_ok());
}

/// The Foxglove message type of a frame.
pub fn schema_name(media: &Media) -> &'static str {
    match media {
        Media::Camera {
            codec: Codec::H264, ..
        } => COMPRESSED_VIDEO,
        Media::Camera {
            codec: Codec::Jpeg, ..
        } => COMPRESSED_IMAGE,
        Media::Audio { .. } => RAW_AUDIO,
        Media::Serial { .. } => LOG,
        // A CAN record's frames, one message each (`can`).
        Media::Can { .. } => can::CAN_FRAME,
    }
}

/// The text of a serial record for a Log line: the line without its end, or `base64:...`.
pub fn log_text(f: &Frame) -> String {
    use base64::Engine;
    match std::str::from_utf8(&f.payload) {
        Ok(s) if matches!(f.media, Media::Serial { text: true }) => {
            s.trim_end_matches(['\r', '\n']).to_string()
        }
        _ => format!(
            "base64:{}",
            base64::engine::general_purpose::STANDARD.encode(&f.payload)
        ),
    }
}

/// The protobuf message of a frame, into `out` (cleared first). Pure.
pub fn protobuf_message(f: &Frame, log_level: i32, out: &mut Vec<u8>) {
    out.clear();
    let timestamp = timestamp(f.capture_ns);
    let encoded = match &f.media {
        Media::Camera {
            codec: Codec::H264, ..
        } => CompressedVideo {
            timestamp,
            frame_id: f.source.to_string(),
            data: f.payload.clone(),
            format: "h264".into(),
        }
        .encode(out),
        Media::Camera {
            codec: Codec::Jpeg, ..
        } => CompressedImage {
            timestamp,
            frame_id: f.source.to_string(),
            data: f.payload.clone(),
            format: "jpeg".into(),
        }
        .encode(out),
        Media::Audio {
            sample_rate,
            channels,
            ..
        } => RawAudio {
            timestamp,
            data: f.payload.clone(),
            format: "pcm-s16".into(),
            sample_rate: *sample_rate,
            number_of_channels: u32::from(*channels),
        }
        .encode(out),
        Media::Serial { .. } | Media::Can { .. } => Log {
            timestamp,
            level: log_level,
            message: log_text(f),
            name: f.source.to_string(),
            file: String::new(),
            line: 0,
        }
        .encode(out),
    };
    // A Vec grows as needed: encoding into it cannot run out of room.
    debug_assert!(encoded.is_ok());
}

/// The `foxglove.LocationFix` of a fix, into `out` (cleared first). Pure.
pub fn location_fix(fix: &Fix, frame_id: &str, out: &mut Vec<u8>) {
    out.clear();
    let encoded = LocationFix {
        timestamp: timestamp(fix.capture_ns),
        frame_id: frame_id.to_string(),
        latitude: fix.latitude,
        longitude: fix.longitude,
        altitude: fix.altitude,
        position_covariance: fix.covariance.to_vec(),
        position_covariance_type: fix.covariance_type as i32,
    }
    .encode(out);
    debug_assert!(encoded.is_ok());
}

pub(crate) const TIMESTAMP_FILE: &str = "google/protobuf/timestamp.proto";

pub(crate) fn field(
    name: &str,
    number: i32,
    ty: Type,
    type_name: Option<&str>,
) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        json_name: Some(json_name(name)),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(ty as i32),
        type_name: type_name.map(Into::into),
        ..Default::default()
    }
}

/// protoc's JSON name: lowerCamelCase of the field name.
fn json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) fn timestamp_field(number: i32) -> FieldDescriptorProto {
    field(
        "timestamp",
        number,
        Type::Message,
        Some(".google.protobuf.Timestamp"),
    )
}

fn enumeration(name: &str, values: &[&str]) -> EnumDescriptorProto {
    EnumDescriptorProto {
        name: Some(name.into()),
        value: values
            .iter()
            .enumerate()
            .map(|(i, v)| EnumValueDescriptorProto {
                name: Some((*v).into()),
                number: Some(i as i32),
                options: None,
            })
            .collect(),
        ..Default::default()
    }
}

pub(crate) fn timestamp_file() -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some(TIMESTAMP_FILE.into()),
        package: Some("google.protobuf".into()),
        message_type: vec![DescriptorProto {
            name: Some("Timestamp".into()),
            field: vec![
                field("seconds", 1, Type::Int64, None),
                field("nanos", 2, Type::Int32, None),
            ],
            ..Default::default()
        }],
        syntax: Some("proto3".into()),
        ..Default::default()
    }
}

/// The descriptor of one Foxglove message type, `None` for a name this module does not know.
fn message_descriptor(name: &str) -> Option<DescriptorProto> {
    let bytes = |n: &str, i| field(n, i, Type::Bytes, None);
    let string = |n: &str, i| field(n, i, Type::String, None);
    let fixed32 = |n: &str, i| field(n, i, Type::Fixed32, None);
    let double = |n: &str, i| field(n, i, Type::Double, None);
    let (short, fields, enums) = match name {
        COMPRESSED_IMAGE => (
            "CompressedImage",
            vec![
                timestamp_field(1),
                string("frame_id", 4),
                bytes("data", 2),
                string("format", 3),
            ],
            vec![],
        ),
        COMPRESSED_VIDEO => (
            "CompressedVideo",
            vec![
                timestamp_field(1),
                string("frame_id", 2),
                bytes("data", 3),
                string("format", 4),
            ],
            vec![],
        ),
        RAW_AUDIO => (
            "RawAudio",
            vec![
                timestamp_field(1),
                bytes("data", 2),
                string("format", 3),
                fixed32("sample_rate", 4),
                fixed32("number_of_channels", 5),
            ],
            vec![],
        ),
        LOCATION_FIX => (
            "LocationFix",
            vec![
                timestamp_field(6),
                string("frame_id", 7),
                double("latitude", 1),
                double("longitude", 2),
                double("altitude", 3),
                FieldDescriptorProto {
                    label: Some(Label::Repeated as i32),
                    ..double("position_covariance", 4)
                },
                field(
                    "position_covariance_type",
                    5,
                    Type::Enum,
                    Some(".foxglove.LocationFix.PositionCovarianceType"),
                ),
            ],
            vec![enumeration(
                "PositionCovarianceType",
                &["UNKNOWN", "APPROXIMATED", "DIAGONAL_KNOWN", "KNOWN"],
            )],
        ),
        LOG => (
            "Log",
            vec![
                timestamp_field(1),
                field("level", 2, Type::Enum, Some(".foxglove.Log.Level")),
                string("message", 3),
                string("name", 4),
                string("file", 5),
                fixed32("line", 6),
            ],
            vec![enumeration(
                "Level",
                &["UNKNOWN", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"],
            )],
        ),
        _ => return None,
    };
    Some(DescriptorProto {
        name: Some(short.into()),
        field: fields,
        enum_type: enums,
        ..Default::default()
    })
}

/// The schema data of a Foxglove message type: a serialized `FileDescriptorSet` holding
/// `foxglove/{Type}.proto` and the `google/protobuf/timestamp.proto` it imports. `None` for a
/// name this module does not know.
pub fn file_descriptor_set(name: &str) -> Option<Vec<u8>> {
    if name == can::CAN_FRAME {
        return Some(can::can_frame_descriptor_set());
    }
    let message = message_descriptor(name)?;
    let file = FileDescriptorProto {
        name: Some(format!("foxglove/{}.proto", message.name())),
        package: Some("foxglove".into()),
        dependency: vec![TIMESTAMP_FILE.into()],
        message_type: vec![message],
        syntax: Some("proto3".into()),
        ..Default::default()
    };
    Some(
        FileDescriptorSet {
            file: vec![timestamp_file(), file],
        }
        .encode_to_vec(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Each descriptor names its fields as the message structs encode them.
    #[test]
    fn descriptors_match_the_message_structs() {
        for name in [
            COMPRESSED_IMAGE,
            COMPRESSED_VIDEO,
            RAW_AUDIO,
            LOCATION_FIX,
            LOG,
        ] {
            let set = FileDescriptorSet::decode(&file_descriptor_set(name).unwrap()[..]).unwrap();
            assert_eq!(set.file.len(), 2);
            assert_eq!(set.file[1].dependency, vec![TIMESTAMP_FILE.to_string()]);
            let m = &set.file[1].message_type[0];
            assert_eq!(format!("foxglove.{}", m.name()), name);
            let numbers: Vec<i32> = m.field.iter().map(|f| f.number()).collect();
            let mut unique = numbers.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), numbers.len(), "{name}: field numbers repeat");
        }
        assert_eq!(file_descriptor_set("foxglove.Nothing"), None);
        assert_eq!(json_name("number_of_channels"), "numberOfChannels");
    }

    #[test]
    fn messages_encode_with_foxglove_field_numbers() {
        let image = CompressedImage {
            timestamp: timestamp(1_700_000_000_123_456_789),
            frame_id: "front".into(),
            data: Bytes::from_static(b"\xff\xd8"),
            format: "jpeg".into(),
        };
        let bytes = image.encode_to_vec();
        // Field 1 (timestamp, length-delimited), field 2 (data) = 0x12, len 2, then the bytes.
        assert_eq!(bytes[0], 0x0a);
        assert!(bytes.windows(4).any(|w| w == b"\x12\x02\xff\xd8"));
        let back = CompressedImage::decode(&bytes[..]).unwrap();
        assert_eq!(back, image);
        assert_eq!(back.timestamp.unwrap().nanos, 123_456_789);
        let audio = RawAudio {
            sample_rate: 48_000,
            ..Default::default()
        };
        // fixed32 field 4: tag 0x25 then four little-endian bytes.
        assert_eq!(audio.encode_to_vec(), [0x25, 0x80, 0xbb, 0x00, 0x00]);
        assert_eq!(timestamp(-5).unwrap().seconds, 0);
    }
}
