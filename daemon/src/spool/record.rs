//! Encoding of one spooled frame as it sits in a segment file. Pure: no I/O.
//!
//! Layout (integers little-endian):
//! ```text
//! magic "RGR1" | len u32 (bytes after the crc) | crc32c u32 (over those bytes) |
//! seq u64 | source_len u8 | source | capture_ns i64 | clock u8 | media tag u8 |
//! media fields (JPEG camera: width u32, height u32; audio: rate u32, channels u16, frames u32;
//! serial: text u8; H.264 camera: width u32, height u32, keyframe u8; CAN: frames u32) | payload
//! ```
//! Media tags: 1 JPEG camera, 2 audio, 3 serial, 4 H.264 camera, 5 CAN (a new kind of media is a
//! new tag: records of the older tags read as before, and an older rigd names a newer tag an
//! unknown media kind instead of misreading it).
//! The media tag's high bit marks a sealed payload (encrypted for the fleet key, see
//! [`crate::seal`]): the record's fields stay readable, its payload does not.
//! A record names its source and sequence, so segments are self-describing: the index can be
//! rebuilt from them alone.

use bytes::Bytes;
use rigd_drivers::{ClockState, Codec, Frame, Media};

use crate::payload::Held;

pub const MAGIC: &[u8; 4] = b"RGR1";
/// Media tag bit: the payload is sealed.
const SEALED: u8 = 0x80;
/// Bytes before the checksummed part: magic, len, crc.
pub const PREFIX: usize = 12;
/// Largest record accepted when reading (a frame is at most 1 GiB by config validation).
pub const MAX_LEN: usize = (1 << 30) + 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record of {0} bytes is shorter than its header")]
    Truncated(usize),
    #[error("bad magic")]
    Magic,
    #[error("length {0} out of range")]
    Length(usize),
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("unknown {0}")]
    Unknown(&'static str),
}

/// A frame's whole record.
pub fn encode(frame: &Held) -> Vec<u8> {
    let mut out = header(frame);
    out.extend_from_slice(&frame.payload);
    out
}

/// A frame's record up to its payload, length and checksum filled in: the spool writes the payload
/// after it straight from the frame, without copying it into a record first.
pub fn header(frame: &Held) -> Vec<u8> {
    let src = frame.source.as_bytes();
    let src_len = src.len().min(255);
    let mut out = Vec::with_capacity(PREFIX + 8 + 1 + src_len + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&frame.seq.to_le_bytes());
    out.push(src_len as u8);
    out.extend_from_slice(&src[..src_len]);
    out.extend_from_slice(&frame.capture_ns.to_le_bytes());
    out.push(frame.clock.as_u8());
    let sealed = if frame.sealed { SEALED } else { 0 };
    match &frame.media {
        Media::Camera {
            width,
            height,
            codec: Codec::Jpeg,
            ..
        } => {
            out.push(1 | sealed);
            out.extend_from_slice(&width.to_le_bytes());
            out.extend_from_slice(&height.to_le_bytes());
        }
        Media::Camera {
            width,
            height,
            codec: Codec::H264,
            keyframe,
        } => {
            out.push(4 | sealed);
            out.extend_from_slice(&width.to_le_bytes());
            out.extend_from_slice(&height.to_le_bytes());
            out.push(u8::from(*keyframe));
        }
        Media::Audio {
            sample_rate,
            channels,
            frames,
        } => {
            out.push(2 | sealed);
            out.extend_from_slice(&sample_rate.to_le_bytes());
            out.extend_from_slice(&channels.to_le_bytes());
            out.extend_from_slice(&frames.to_le_bytes());
        }
        Media::Serial { text } => {
            out.push(3 | sealed);
            out.push(u8::from(*text));
        }
        Media::Can { frames } => {
            out.push(5 | sealed);
            out.extend_from_slice(&frames.to_le_bytes());
        }
    }
    let len = (out.len() - PREFIX + frame.payload.len()) as u32;
    out[4..8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[PREFIX..]), &frame.payload);
    out[8..12].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The total size of the record starting with this 12-byte prefix.
pub fn total_len(prefix: &[u8]) -> Result<usize, RecordError> {
    if prefix.len() < PREFIX {
        return Err(RecordError::Truncated(prefix.len()));
    }
    if &prefix[..4] != MAGIC {
        return Err(RecordError::Magic);
    }
    let len = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as usize;
    if !(10..=MAX_LEN).contains(&len) {
        return Err(RecordError::Length(len));
    }
    Ok(PREFIX + len)
}

/// What a pass over a segment's bytes finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scanned {
    /// A span whose header parses (its checksum is not checked here).
    Record { offset: usize, len: usize },
    /// Bytes skipped to reach the next record header (or the end).
    Damaged { offset: usize, len: usize },
}

/// Splits a segment's bytes into records, resynchronising on the next magic after damage (a
/// header whose length was hit, garbage, a torn write), so that one bad header never hides the
/// records after it. Pure.
pub fn scan(data: &[u8]) -> Vec<Scanned> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let parsed = data
            .get(at..at + PREFIX)
            .and_then(|p| total_len(p).ok())
            .filter(|total| at + total <= data.len());
        let ok = parsed.filter(|&total| {
            // A header whose length runs over the next record would hide it: the checksum
            // decides whether the span is a record at all.
            decode(Bytes::copy_from_slice(&data[at..at + total])).is_ok()
                || next_magic(data, at + 1).is_none_or(|m| m >= at + total)
        });
        match ok {
            Some(total) => {
                out.push(Scanned::Record {
                    offset: at,
                    len: total,
                });
                at += total;
            }
            None => {
                let next = next_magic(data, at + 1).unwrap_or(data.len());
                out.push(Scanned::Damaged {
                    offset: at,
                    len: next - at,
                });
                at = next;
            }
        }
    }
    out
}

fn next_magic(data: &[u8], from: usize) -> Option<usize> {
    data.get(from..)?
        .windows(MAGIC.len())
        .position(|w| w == MAGIC)
        .map(|p| from + p)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], RecordError> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or(RecordError::Truncated(self.b.len()))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        let s = self.take(8)?;
        Ok(u64::from_le_bytes(s.try_into().unwrap_or_default()))
    }
}

/// Decodes a whole record; the payload shares `bytes` (no copy).
pub fn decode(bytes: Bytes) -> Result<Held, RecordError> {
    let total = total_len(&bytes)?;
    if bytes.len() < total {
        return Err(RecordError::Truncated(bytes.len()));
    }
    let stored = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let computed = crc32c::crc32c(&bytes[PREFIX..total]);
    if stored != computed {
        return Err(RecordError::Checksum { stored, computed });
    }
    let mut r = Reader {
        b: &bytes[..total],
        at: PREFIX,
    };
    let seq = r.u64()?;
    let src_len = r.u8()? as usize;
    let source = String::from_utf8_lossy(r.take(src_len)?).into_owned();
    let capture_ns = r.u64()? as i64;
    let clock = ClockState::from_u8(r.u8()?).ok_or(RecordError::Unknown("clock state"))?;
    let tag = r.u8()?;
    let media = match tag & !SEALED {
        1 => Media::jpeg(r.u32()?, r.u32()?),
        4 => Media::Camera {
            width: r.u32()?,
            height: r.u32()?,
            codec: Codec::H264,
            keyframe: r.u8()? != 0,
        },
        2 => Media::Audio {
            sample_rate: r.u32()?,
            channels: r.u16()?,
            frames: r.u32()?,
        },
        3 => Media::Serial { text: r.u8()? != 0 },
        5 => Media::Can { frames: r.u32()? },
        _ => return Err(RecordError::Unknown("media kind")),
    };
    let body = r.at;
    Ok(Held {
        frame: Frame {
            source: source.into(),
            seq,
            capture_ns,
            clock,
            media,
            payload: bytes.slice(body..total),
        },
        sealed: tag & SEALED != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn media() -> impl Strategy<Value = Media> {
        prop_oneof![
            (any::<u32>(), any::<u32>()).prop_map(|(width, height)| Media::jpeg(width, height)),
            (any::<u32>(), any::<u32>(), any::<bool>()).prop_map(|(width, height, keyframe)| {
                Media::Camera {
                    width,
                    height,
                    codec: Codec::H264,
                    keyframe,
                }
            }),
            (any::<u32>(), any::<u16>(), any::<u32>()).prop_map(
                |(sample_rate, channels, frames)| Media::Audio {
                    sample_rate,
                    channels,
                    frames
                }
            ),
            any::<bool>().prop_map(|text| Media::Serial { text }),
            any::<u32>().prop_map(|frames| Media::Can { frames }),
        ]
    }

    fn sample() -> Held {
        Held::plain(Frame {
            source: "gps".into(),
            seq: 1,
            capture_ns: 5,
            clock: ClockState::Locked,
            media: Media::Serial { text: true },
            payload: Bytes::from_static(b"$GPRMC,1,2,3*00 and more bytes here"),
        })
    }

    proptest! {
        #[test]
        fn round_trip(seq in any::<u64>(), ns in any::<i64>(), clock in 0u8..4, media in media(),
                      source in "[a-z0-9-]{1,40}", payload in proptest::collection::vec(any::<u8>(), 0..2048),
                      sealed in any::<bool>()) {
            let f = Held { frame: Frame { source: source.as_str().into(), seq, capture_ns: ns,
                            clock: ClockState::from_u8(clock).unwrap(), media, payload: Bytes::from(payload) }, sealed };
            let enc = encode(&f);
            prop_assert_eq!(total_len(&enc[..PREFIX]).unwrap(), enc.len());
            let back = decode(Bytes::from(enc)).unwrap();
            prop_assert_eq!(&*back.source, &*f.source);
            prop_assert_eq!(back.seq, f.seq);
            prop_assert_eq!(back.capture_ns, f.capture_ns);
            prop_assert_eq!(back.clock, f.clock);
            prop_assert_eq!(&back.media, &f.media);
            prop_assert_eq!(back.sealed, f.sealed);
            prop_assert_eq!(&back.payload, &f.payload);
        }

        #[test]
        fn any_bit_flip_or_truncation_is_detected(flip in 0usize..4096, bit in 0u8..8, cut in 0usize..4096) {
            let good = encode(&sample());
            let mut bad = good.clone();
            let i = flip % bad.len();
            bad[i] ^= 1 << bit;
            prop_assert!(decode(Bytes::from(bad)).is_err());
            let cut = cut % good.len();
            prop_assert!(decode(Bytes::from(good[..cut].to_vec())).is_err());
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(Bytes::from(data));
        }
    }
}
