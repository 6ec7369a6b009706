//! The messages of a CAN source's channels, shared by the MCAP export and the live view. Pure.
//!
//! - `/{source}`: every frame as it was received, one `rigd.CanFrame` message each (protobuf,
//!   schema [`can_frame_descriptor_set`]; or JSON, [`can_frame_json_schema`]), stamped with the
//!   frame's own receive time: `timestamp`, `bus` (the source), `id` (without flags), `extended`,
//!   `remote`, `error`, `fd`, `brs`, `esi`, `data`. Foxglove shows them in its Raw Messages panel.
//! - `/{source}/{Message}` (with a DBC): one message per decoded frame of that DBC message, the
//!   signals as numeric fields Foxglove's Plot panel plots (`/vehicle/VehicleSpeed.Speed`),
//!   stamped with the frame's time. Protobuf: a message type built from the DBC at run time
//!   (`rigd.can.{Message}`, a `double` per signal, field numbers from 2 in the DBC's order); a
//!   multiplexed signal that the frame's switch does not select is NaN there (a gap in a plot,
//!   where proto3 would otherwise say 0). JSON: the signals the frame holds, as numbers.

use bytes::Bytes;
use prost::Message as _;
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet, Timestamp};
use rigd_drivers::can_record::{CanFrame, BRS, ESI, FD};
use std::fmt::Write as _;

use super::{field, timestamp, timestamp_field, timestamp_file, TIMESTAMP_FILE};
use crate::can::dbc::{Decoded, Message};

/// The raw frame's message type.
pub const CAN_FRAME: &str = "rigd.CanFrame";

/// One CAN frame as received.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CanFrameMessage {
    #[prost(message, optional, tag = "1")]
    pub timestamp: Option<Timestamp>,
    #[prost(string, tag = "2")]
    pub bus: String,
    #[prost(uint32, tag = "3")]
    pub id: u32,
    #[prost(bool, tag = "4")]
    pub extended: bool,
    #[prost(bool, tag = "5")]
    pub remote: bool,
    #[prost(bool, tag = "6")]
    pub error: bool,
    #[prost(bool, tag = "7")]
    pub fd: bool,
    #[prost(bool, tag = "8")]
    pub brs: bool,
    #[prost(bool, tag = "9")]
    pub esi: bool,
    #[prost(bytes = "bytes", tag = "10")]
    pub data: Bytes,
}

/// The `rigd.CanFrame` of a frame, into `out` (cleared first).
pub fn can_frame(f: &CanFrame, bus: &str, out: &mut Vec<u8>) {
    out.clear();
    let encoded = CanFrameMessage {
        timestamp: timestamp(f.ts_ns),
        bus: bus.to_string(),
        id: f.raw_id(),
        extended: f.is_extended(),
        remote: f.is_remote(),
        error: f.is_error(),
        fd: f.flags & FD != 0,
        brs: f.flags & BRS != 0,
        esi: f.flags & ESI != 0,
        data: Bytes::copy_from_slice(&f.data),
    }
    .encode(out);
    debug_assert!(encoded.is_ok());
}

/// `rigd.CanFrame`'s schema: a `FileDescriptorSet` of `rigd/CanFrame.proto` and the timestamp.
pub fn can_frame_descriptor_set() -> Vec<u8> {
    let b = |n: &str, i| field(n, i, Type::Bool, None);
    let message = DescriptorProto {
        name: Some("CanFrame".into()),
        field: vec![
            timestamp_field(1),
            field("bus", 2, Type::String, None),
            field("id", 3, Type::Uint32, None),
            b("extended", 4),
            b("remote", 5),
            b("error", 6),
            b("fd", 7),
            b("brs", 8),
            b("esi", 9),
            field("data", 10, Type::Bytes, None),
        ],
        ..Default::default()
    };
    file_set("rigd/CanFrame.proto", "rigd", message)
}

fn file_set(file: &str, package: &str, message: DescriptorProto) -> Vec<u8> {
    FileDescriptorSet {
        file: vec![
            timestamp_file(),
            FileDescriptorProto {
                name: Some(file.into()),
                package: Some(package.into()),
                dependency: vec![TIMESTAMP_FILE.into()],
                message_type: vec![message],
                syntax: Some("proto3".into()),
                ..Default::default()
            },
        ],
    }
    .encode_to_vec()
}

const TIME: &str = r#"{"type":"object","title":"time","properties":{"sec":{"type":"integer","minimum":0},"nsec":{"type":"integer","minimum":0,"maximum":999999999}}}"#;

/// `rigd.CanFrame`'s JSON schema (data as base64).
pub fn can_frame_json_schema() -> String {
    format!(
        r#"{{"title":"{CAN_FRAME}","type":"object","properties":{{"timestamp":{TIME},"bus":{{"type":"string"}},"id":{{"type":"integer","minimum":0}},"extended":{{"type":"boolean"}},"remote":{{"type":"boolean"}},"error":{{"type":"boolean"}},"fd":{{"type":"boolean"}},"brs":{{"type":"boolean"}},"esi":{{"type":"boolean"}},"data":{{"type":"string","contentEncoding":"base64"}}}}}}"#
    )
}

fn json_time(ns: i64, out: &mut String) {
    let ns = ns.max(0);
    let _ = write!(
        out,
        r#"{{"timestamp":{{"sec":{},"nsec":{}}}"#,
        ns / 1_000_000_000,
        ns % 1_000_000_000
    );
}

/// The JSON `rigd.CanFrame` of a frame, into `out` (cleared first).
pub fn can_frame_json(f: &CanFrame, bus: &str, out: &mut String) {
    use base64::Engine;
    out.clear();
    json_time(f.ts_ns, out);
    let _ = write!(
        out,
        r#","bus":{},"id":{},"extended":{},"remote":{},"error":{},"fd":{},"brs":{},"esi":{},"data":""#,
        serde_json::to_string(bus).unwrap_or_default(),
        f.raw_id(),
        f.is_extended(),
        f.is_remote(),
        f.is_error(),
        f.flags & FD != 0,
        f.flags & BRS != 0,
        f.flags & ESI != 0,
    );
    base64::engine::general_purpose::STANDARD.encode_string(&f.data, out);
    out.push_str("\"}");
}

/// The message type of a DBC message's decoded signals.
pub fn signals_schema_name(m: &Message) -> String {
    format!("rigd.can.{}", m.name)
}

/// A signal's field name: its DBC name, which is a C identifier as protobuf's are (one named
/// `timestamp` gets a `_` after it, the name being taken).
fn field_name(signal: &str) -> String {
    if signal == "timestamp" {
        "timestamp_".into()
    } else {
        signal.to_string()
    }
}

/// The protobuf schema of a DBC message's signals: `rigd.can.{Message}`, `timestamp` then a
/// `double` per signal, numbered from 2 in the DBC's order.
pub fn signals_descriptor_set(m: &Message) -> Vec<u8> {
    let mut fields = vec![timestamp_field(1)];
    fields.extend(
        m.signals
            .iter()
            .enumerate()
            .map(|(i, s)| field(&field_name(&s.name), i as i32 + 2, Type::Double, None)),
    );
    let message = DescriptorProto {
        name: Some(m.name.clone()),
        field: fields,
        ..Default::default()
    };
    file_set(&format!("rigd/can/{}.proto", m.name), "rigd.can", message)
}

/// The JSON schema of a DBC message's signals (numbers; the unit as each one's description).
pub fn signals_json_schema(m: &Message) -> String {
    let mut props = format!(r#""timestamp":{TIME}"#);
    for s in &m.signals {
        let _ = write!(
            props,
            r#",{}:{{"type":"number","description":{}}}"#,
            serde_json::to_string(&field_name(&s.name)).unwrap_or_default(),
            serde_json::to_string(&s.unit).unwrap_or_default()
        );
    }
    format!(
        r#"{{"title":{},"type":"object","properties":{{{props}}}}}"#,
        serde_json::to_string(&signals_schema_name(m)).unwrap_or_default()
    )
}

/// The protobuf message of a decoded frame of `m` (NaN for its signals not in the frame), into
/// `out` (cleared first).
pub fn signals_protobuf(m: &Message, d: &Decoded<'_>, ts_ns: i64, out: &mut Vec<u8>) {
    out.clear();
    if let Some(t) = timestamp(ts_ns) {
        prost::encoding::message::encode(1, &t, out);
    }
    let mut values = vec![f64::NAN; m.signals.len()];
    for v in &d.signals {
        if let Some(slot) = values.get_mut(v.index) {
            *slot = v.value;
        }
    }
    for (i, v) in values.iter().enumerate() {
        prost::encoding::double::encode(i as u32 + 2, v, out);
    }
}

/// The JSON message of a decoded frame: its time and the signals it holds (a value JSON cannot
/// say, NaN or infinite, is left out), into `out` (cleared first).
pub fn signals_json(d: &Decoded<'_>, ts_ns: i64, out: &mut String) {
    out.clear();
    json_time(ts_ns, out);
    for v in d.signals.iter().filter(|v| v.value.is_finite()) {
        let _ = write!(
            out,
            ",{}:{}",
            serde_json::to_string(&field_name(v.name)).unwrap_or_default(),
            serde_json::to_string(&v.value).unwrap_or_default()
        );
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::can::Dbc;

    const DBC: &str = r#"VERSION ""
BS_:
BU_: A
BO_ 512 Gearbox: 8 A
 SG_ Page M : 0|8@1+ (1,0) [0|255] "" A
 SG_ Gear m1 : 8|4@1+ (1,0) [0|15] "" A
 SG_ Temp m2 : 8|8@1- (0.5,-40) [-104|23.5] "degC" A
"#;

    #[test]
    fn raw_frames_carry_id_flags_and_data() {
        let f = CanFrame {
            ts_ns: 1_700_000_000_000_000_123,
            id: 0x8000_0000 | 0x18FE_F110,
            flags: FD | BRS,
            data: vec![1, 2, 3],
        };
        let mut out = Vec::new();
        can_frame(&f, "vehicle", &mut out);
        let m = CanFrameMessage::decode(&out[..]).unwrap();
        assert_eq!(
            (m.id, m.extended, m.fd, m.brs, m.esi),
            (0x18FE_F110, true, true, true, false)
        );
        assert_eq!(&m.data[..], &[1, 2, 3]);
        assert_eq!(m.timestamp.unwrap().nanos, 123);
        let mut json = String::new();
        can_frame_json(&f, "vehicle", &mut json);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["id"], 0x18FE_F110);
        assert_eq!(v["data"], "AQID");
        assert_eq!(v["fd"], true);
        let schema: serde_json::Value = serde_json::from_str(&can_frame_json_schema()).unwrap();
        assert_eq!(schema["title"], CAN_FRAME);
        let set = FileDescriptorSet::decode(&can_frame_descriptor_set()[..]).unwrap();
        assert_eq!(set.file[1].message_type[0].field.len(), 10);
    }

    #[test]
    fn decoded_signals_are_doubles_nan_where_the_switch_says_no() {
        let dbc = Dbc::parse(DBC, "t.dbc").unwrap();
        let m = dbc.message(512).unwrap();
        let d = dbc.decode(512, &[2, 0x50, 0, 0, 0, 0, 0, 0]).unwrap();
        let mut out = Vec::new();
        signals_protobuf(m, &d, 5, &mut out);
        // timestamp (field 1), then fields 2 (Page), 3 (Gear, NaN), 4 (Temp) as fixed64.
        let doubles: Vec<f64> = out[out.len() - 27..]
            .chunks(9)
            .map(|c| f64::from_le_bytes(c[1..].try_into().unwrap()))
            .collect();
        assert_eq!(doubles[0], 2.0);
        assert!(doubles[1].is_nan());
        assert_eq!(doubles[2], 0.0);
        assert_eq!(out[out.len() - 27], (2 << 3) | 1);
        let mut json = String::new();
        signals_json(&d, 1_000_000_001, &mut json);
        assert_eq!(
            json,
            r#"{"timestamp":{"sec":1,"nsec":1},"Page":2.0,"Temp":0.0}"#
        );
        let set = FileDescriptorSet::decode(&signals_descriptor_set(m)[..]).unwrap();
        let names: Vec<&str> = set.file[1].message_type[0]
            .field
            .iter()
            .map(|f| f.name())
            .collect();
        assert_eq!(names, ["timestamp", "Page", "Gear", "Temp"]);
        let schema: serde_json::Value = serde_json::from_str(&signals_json_schema(m)).unwrap();
        assert_eq!(schema["properties"]["Temp"]["description"], "degC");
    }
}
