//! `rigd replay --mcap FILE`: a spool as one MCAP file that Foxglove and the reference readers open.
//!
//! One channel per source, topic `/{source}`, JSON messages (`jsonschema` schemas; bytes as
//! base64 the way Foxglove's JSON schemas carry them):
//! - camera: `foxglove.CompressedImage` (`format` = `jpeg`),
//! - audio: `foxglove.RawAudio` (`format` = `pcm-s16`, interleaved little-endian),
//! - serial: `foxglove.Log` (level INFO, `name` = source; binary records as `base64:...`).
//!
//! Messages are written in capture order; log time = publish time = capture time (ns), and the
//! message sequence is the frame's `seq` (low 32 bits). Channel metadata carries the source, its
//! modality and the frame format, so nothing of the spool record is lost but the clock state,
//! which goes into each message as `clock`.

use base64::Engine;
use rigd_drivers::{Frame, Media};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use super::progress::{Interrupt, Progress};
use super::{capture_order, total_bytes, ReplayError, SourcePlan, Summary, Tally};
use crate::spool::snapshot::SpoolSnapshot;
use crate::wire::Bucket;

pub const COMPRESSED_IMAGE: &str = "foxglove.CompressedImage";
pub const RAW_AUDIO: &str = "foxglove.RawAudio";
pub const LOG: &str = "foxglove.Log";

const TIME: &str = r#"{"type":"object","title":"time","properties":{"sec":{"type":"integer","minimum":0},"nsec":{"type":"integer","minimum":0,"maximum":999999999}}}"#;

fn schema(name: &str) -> String {
    let props = match name {
        COMPRESSED_IMAGE => {
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

fn schema_name(media: &Media) -> &'static str {
    match media {
        Media::Camera { .. } => COMPRESSED_IMAGE,
        Media::Audio { .. } => RAW_AUDIO,
        Media::Serial { .. } => LOG,
    }
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
        Media::Camera { .. } => {
            let _ = write!(out, r#""frame_id":{source},"format":"jpeg","data":""#);
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
        Media::Serial { text } => {
            let msg = match std::str::from_utf8(&f.payload) {
                Ok(s) if *text => s.trim_end_matches(['\r', '\n']).to_string(),
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

fn channel_metadata(f: &Frame, bucket_ms: u32) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("source".into(), f.source.to_string());
    m.insert("modality".into(), f.modality().as_str().into());
    m.insert("content-type".into(), f.media.content_type());
    m.insert("bucket-ms".into(), bucket_ms.to_string());
    for (k, v) in f.media.fields() {
        if k != "frames" {
            m.insert(k.into(), v);
        }
    }
    m
}

/// Writes the planned records to one MCAP file at `path`.
pub fn export(
    snap: &SpoolSnapshot,
    plan: &[SourcePlan],
    path: &Path,
    bucket_ms: u32,
    key: Option<&crate::seal::Decryptor>,
    interrupt: &Interrupt,
) -> Result<Summary, ReplayError> {
    let mcap_err = |source| ReplayError::Mcap {
        path: path.to_path_buf(),
        source,
    };
    let file = File::create(path).map_err(ReplayError::output(path, "create"))?;
    let mut writer = ::mcap::WriteOptions::new()
        .compression(None)
        .profile("")
        .library(concat!("rigd ", env!("CARGO_PKG_VERSION")))
        .create(BufWriter::with_capacity(4 << 20, file))
        .map_err(mcap_err)?;
    let progress = Progress::new(total_bytes(plan), "mcap");
    let mut tally = Tally::new(plan);
    let mut schemas: BTreeMap<&'static str, u16> = BTreeMap::new();
    // Per source: the channel, and the schema it was made for (frames of another one are skipped).
    let mut channels: Vec<Option<(u16, &'static str)>> = vec![None; plan.len()];
    let mut buf = String::new();
    let mut interrupted = false;
    for (i, e) in capture_order(plan) {
        if interrupt.is_set() {
            interrupted = true;
            break;
        }
        progress.inc(e.len as u64);
        let p = &plan[i];
        let frame = match snap.read(&p.source, &e) {
            Ok(f) => f,
            Err(c) => {
                progress.println(&format!("skipped corrupt {}", super::inspect::describe(&c)));
                tally.corrupt(c);
                continue;
            }
        };
        let frame = match super::readable(frame, key)? {
            Ok(f) => f,
            Err(why) => {
                tally.skipped(format!("{}/{}: {why}", p.source, e.seq));
                continue;
            }
        };
        let name = schema_name(&frame.media);
        let (channel, want) = match channels[i] {
            Some(c) => c,
            None => {
                let schema_id = match schemas.get(name) {
                    Some(id) => *id,
                    None => {
                        let id = writer
                            .add_schema(name, "jsonschema", schema(name).as_bytes())
                            .map_err(mcap_err)?;
                        schemas.insert(name, id);
                        id
                    }
                };
                let id = writer
                    .add_channel(
                        schema_id,
                        &format!("/{}", p.source),
                        "json",
                        &channel_metadata(&frame, bucket_ms),
                    )
                    .map_err(mcap_err)?;
                *channels[i].insert((id, name))
            }
        };
        if want != name {
            tally.skipped(format!(
                "{}/{}: a {} frame on a {want} channel",
                p.source,
                e.seq,
                frame.modality().as_str()
            ));
            continue;
        }
        message(&frame, bucket_ms, &mut buf);
        let t = frame.capture_ns.max(0) as u64;
        writer
            .write_to_known_channel(
                &::mcap::records::MessageHeader {
                    channel_id: channel,
                    sequence: frame.seq as u32,
                    log_time: t,
                    publish_time: t,
                },
                buf.as_bytes(),
            )
            .map_err(mcap_err)?;
        tally.done(i, &e);
    }
    writer.finish().map_err(mcap_err)?;
    progress.finish();
    Ok(tally.finish(path.display().to_string(), interrupted))
}

#[cfg(test)]
mod tests {
    use super::*;
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
            sealed: false,
        }
    }

    #[test]
    fn messages_are_json_with_the_foxglove_fields() {
        let mut out = String::new();
        message(
            &frame(
                Media::Camera {
                    width: 2,
                    height: 2,
                },
                b"\xff\xd8",
            ),
            33,
            &mut out,
        );
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
        for name in [COMPRESSED_IMAGE, RAW_AUDIO, LOG] {
            let s: serde_json::Value = serde_json::from_str(&schema(name)).unwrap();
            assert_eq!(s["title"], name);
        }
    }
}
