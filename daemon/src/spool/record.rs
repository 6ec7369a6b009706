//! Encoding of one spooled frame. Pure: no I/O.
//!
//! Layout (all integers little-endian):
//! ```text
//! magic "RGS1" | crc32c u32 (over every byte after it) | capture_ns i64 | clock u8 | media tag u8 |
//! media fields (camera: width u32, height u32; audio: rate u32, channels u16, frames u32;
//! serial: text u8) | payload
//! ```
//! The key (source tree + big-endian seq) carries the sequence number, so a record that decodes is
//! the frame exactly as captured.

use bytes::Bytes;
use rigd_drivers::{ClockState, Frame, Media};
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"RGS1";
const HEADER: usize = 4 + 4 + 8 + 1 + 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record of {0} bytes is shorter than its header")]
    Truncated(usize),
    #[error("bad magic")]
    Magic,
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("unknown {0}")]
    Unknown(&'static str),
}

pub fn encode(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + 16 + frame.payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&frame.capture_ns.to_le_bytes());
    out.push(frame.clock.as_u8());
    match &frame.media {
        Media::Camera { width, height } => {
            out.push(1);
            out.extend_from_slice(&width.to_le_bytes());
            out.extend_from_slice(&height.to_le_bytes());
        }
        Media::Audio {
            sample_rate,
            channels,
            frames,
        } => {
            out.push(2);
            out.extend_from_slice(&sample_rate.to_le_bytes());
            out.extend_from_slice(&channels.to_le_bytes());
            out.extend_from_slice(&frames.to_le_bytes());
        }
        Media::Serial { text } => {
            out.push(3);
            out.push(u8::from(*text));
        }
    }
    out.extend_from_slice(&frame.payload);
    let crc = crc32c::crc32c(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a record; `bytes` is the stored value (shared, so the payload is not copied).
pub fn decode(source: &Arc<str>, seq: u64, bytes: Bytes) -> Result<Frame, RecordError> {
    if bytes.len() < HEADER {
        return Err(RecordError::Truncated(bytes.len()));
    }
    if &bytes[..4] != MAGIC {
        return Err(RecordError::Magic);
    }
    let stored = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
    let computed = crc32c::crc32c(&bytes[8..]);
    if stored != computed {
        return Err(RecordError::Checksum { stored, computed });
    }
    let capture_ns = i64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
    let clock = ClockState::from_u8(bytes[16]).ok_or(RecordError::Unknown("clock state"))?;
    let u32_at = |at: usize| -> Result<u32, RecordError> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(RecordError::Truncated(bytes.len()))
    };
    let (media, body) = match bytes[17] {
        1 => (
            Media::Camera {
                width: u32_at(18)?,
                height: u32_at(22)?,
            },
            26,
        ),
        2 => {
            let channels = bytes
                .get(22..24)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .ok_or(RecordError::Truncated(bytes.len()))?;
            (
                Media::Audio {
                    sample_rate: u32_at(18)?,
                    channels,
                    frames: u32_at(24)?,
                },
                28,
            )
        }
        3 => (
            Media::Serial {
                text: *bytes.get(18).ok_or(RecordError::Truncated(bytes.len()))? != 0,
            },
            19,
        ),
        _ => return Err(RecordError::Unknown("media kind")),
    };
    if body > bytes.len() {
        return Err(RecordError::Truncated(bytes.len()));
    }
    Ok(Frame {
        source: source.clone(),
        seq,
        capture_ns,
        clock,
        media,
        payload: bytes.slice(body..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn media() -> impl Strategy<Value = Media> {
        prop_oneof![
            (any::<u32>(), any::<u32>())
                .prop_map(|(width, height)| Media::Camera { width, height }),
            (any::<u32>(), any::<u16>(), any::<u32>()).prop_map(
                |(sample_rate, channels, frames)| Media::Audio {
                    sample_rate,
                    channels,
                    frames
                }
            ),
            any::<bool>().prop_map(|text| Media::Serial { text }),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(seq in any::<u64>(), ns in any::<i64>(), clock in 0u8..4, media in media(),
                      payload in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let source: Arc<str> = "cam".into();
            let f = Frame { source: source.clone(), seq, capture_ns: ns, clock: ClockState::from_u8(clock).unwrap(),
                            media, payload: Bytes::from(payload) };
            let back = decode(&source, seq, Bytes::from(encode(&f))).unwrap();
            prop_assert_eq!(back.capture_ns, f.capture_ns);
            prop_assert_eq!(back.clock, f.clock);
            prop_assert_eq!(back.media, f.media);
            prop_assert_eq!(back.payload, f.payload);
        }

        #[test]
        fn any_single_byte_flip_or_truncation_is_detected(flip in 0usize..64, bit in 0u8..8, cut in 0usize..64) {
            let source: Arc<str> = "s".into();
            let f = Frame { source: source.clone(), seq: 1, capture_ns: 5, clock: ClockState::Locked,
                            media: Media::Serial { text: true }, payload: Bytes::from_static(b"$GPRMC,1,2,3*00 and more bytes here") };
            let good = encode(&f);
            let mut bad = good.clone();
            let i = flip % bad.len();
            bad[i] ^= 1 << bit;
            prop_assert!(decode(&source, 1, Bytes::from(bad)).is_err());
            let cut = cut % good.len();
            prop_assert!(decode(&source, 1, Bytes::from(good[..cut].to_vec())).is_err());
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&"x".into(), 0, Bytes::from(data));
        }
    }
}
