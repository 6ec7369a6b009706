//! The payload of a CAN record: the frames one bus carried within one bucket. Pure: no I/O.
//!
//! One record per bus per bucket (`Media::Can { frames }`, content type
//! `application/x-rigd-can`), its frames in the order the kernel delivered them, each as
//! (integers little-endian, no padding, no header: the count is `Media::Can`'s `frames`, the
//! `frames` message property):
//! ```text
//! ts_ns i64 | can_id u32 | flags u8 | len u8 | reserved u16 = 0 | data (len bytes)
//! ```
//! - `ts_ns`: the frame's receive time on the rig clock, ns since the Unix epoch (the kernel's
//!   receive stamp mapped as a V4L2 buffer stamp is); every frame of a record lies in the
//!   record's bucket by this time.
//! - `can_id`: Linux's `can_id` as the kernel gives it: the identifier (11 bits, or 29 with
//!   [`EFF_FLAG`]) and the flags [`EFF_FLAG`] (extended frame), [`RTR_FLAG`] (remote request),
//!   [`ERR_FLAG`] (an error frame: its class in the low bits, details in `data`, linux/can/error.h).
//! - `flags`: [`FD`] (a CAN FD frame), [`BRS`] (bit rate switch), [`ESI`] (error state indicator).
//! - `len`: the data length in bytes, 0..=8 for classic CAN, 0..=64 for CAN FD (an FD length is
//!   one of 0..=8, 12, 16, 20, 24, 32, 48, 64 on a real bus; any value up to 64 is read back).
//!
//! A record of `n` frames of lengths `l_i` is `16 n + sum(l_i)` bytes.

use thiserror::Error;

/// The `content-type` property of a CAN record.
pub const CONTENT_TYPE: &str = "application/x-rigd-can";

/// `can_id` flag: extended (29-bit) identifier.
pub const EFF_FLAG: u32 = 0x8000_0000;
/// `can_id` flag: remote transmission request.
pub const RTR_FLAG: u32 = 0x4000_0000;
/// `can_id` flag: error frame.
pub const ERR_FLAG: u32 = 0x2000_0000;
/// The identifier bits of an extended frame.
pub const EFF_MASK: u32 = 0x1FFF_FFFF;
/// The identifier bits of a standard frame.
pub const SFF_MASK: u32 = 0x0000_07FF;

/// `flags` bit: a CAN FD frame.
pub const FD: u8 = 0x01;
/// `flags` bit: CAN FD bit rate switch.
pub const BRS: u8 = 0x02;
/// `flags` bit: CAN FD error state indicator.
pub const ESI: u8 = 0x04;

/// Bytes of a frame before its data.
pub const HEADER: usize = 16;
/// Longest data of a classic frame.
pub const MAX_CLASSIC_LEN: usize = 8;
/// Longest data of a CAN FD frame.
pub const MAX_FD_LEN: usize = 64;

/// One frame of a CAN bus as it was received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanFrame {
    /// Receive time on the rig clock, ns since the Unix epoch.
    pub ts_ns: i64,
    /// Linux's `can_id`: identifier with [`EFF_FLAG`], [`RTR_FLAG`], [`ERR_FLAG`].
    pub id: u32,
    /// [`FD`], [`BRS`], [`ESI`].
    pub flags: u8,
    /// 0..=8 bytes (classic), 0..=64 (FD).
    pub data: Vec<u8>,
}

impl CanFrame {
    /// A CAN FD frame.
    pub fn is_fd(&self) -> bool {
        self.flags & FD != 0
    }
    /// An error frame (the kernel's report of a bus error, not traffic).
    pub fn is_error(&self) -> bool {
        self.id & ERR_FLAG != 0
    }
    /// A 29-bit identifier.
    pub fn is_extended(&self) -> bool {
        self.id & EFF_FLAG != 0
    }
    /// A remote transmission request.
    pub fn is_remote(&self) -> bool {
        self.id & RTR_FLAG != 0
    }
    /// The identifier without its flags.
    pub fn raw_id(&self) -> u32 {
        if self.is_extended() {
            self.id & EFF_MASK
        } else {
            self.id & SFF_MASK
        }
    }
    /// Bytes this frame takes in a record.
    pub fn encoded_len(&self) -> usize {
        HEADER + self.data.len()
    }
}

/// What is wrong with a record's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CanRecordError {
    #[error("CAN record truncated at offset {offset}: {need} bytes needed, {have} left")]
    Truncated {
        offset: usize,
        need: usize,
        have: usize,
    },
    #[error("CAN record: frame at offset {offset} has length {len}, above {max}")]
    Length { offset: usize, len: u8, max: usize },
    #[error("CAN record: frame at offset {offset} has reserved bytes {value:#06x}, not 0")]
    Reserved { offset: usize, value: u16 },
}

/// Appends `frames` to `out` in the record format. A frame's data beyond 64 bytes (which no
/// kernel gives) is cut there, so that the record always reads back.
pub fn encode<'a>(frames: impl IntoIterator<Item = &'a CanFrame>, out: &mut Vec<u8>) {
    for f in frames {
        let len = f.data.len().min(MAX_FD_LEN);
        out.extend_from_slice(&f.ts_ns.to_le_bytes());
        out.extend_from_slice(&f.id.to_le_bytes());
        out.push(f.flags);
        out.push(len as u8);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&f.data[..len]);
    }
}

/// The frames of a record, in order. Never panics: damage is an error naming its offset.
pub fn decode(mut b: &[u8]) -> Result<Vec<CanFrame>, CanRecordError> {
    let mut out = Vec::with_capacity(b.len() / (HEADER + MAX_CLASSIC_LEN));
    let mut offset = 0usize;
    while !b.is_empty() {
        let Some((head, rest)) = b.split_first_chunk::<HEADER>() else {
            return Err(CanRecordError::Truncated {
                offset,
                need: HEADER,
                have: b.len(),
            });
        };
        let ts_ns = i64::from_le_bytes(head[0..8].try_into().unwrap_or_default());
        let id = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default());
        let flags = head[12];
        let len = head[13];
        let reserved = u16::from_le_bytes([head[14], head[15]]);
        if reserved != 0 {
            return Err(CanRecordError::Reserved {
                offset,
                value: reserved,
            });
        }
        let max = if flags & FD != 0 {
            MAX_FD_LEN
        } else {
            MAX_CLASSIC_LEN
        };
        if len as usize > max {
            return Err(CanRecordError::Length { offset, len, max });
        }
        let Some(data) = rest.get(..len as usize) else {
            return Err(CanRecordError::Truncated {
                offset,
                need: HEADER + len as usize,
                have: b.len(),
            });
        };
        out.push(CanFrame {
            ts_ns,
            id,
            flags,
            data: data.to_vec(),
        });
        b = &rest[len as usize..];
        offset += HEADER + len as usize;
    }
    Ok(out)
}

/// The number of frames in a record, without copying their data.
pub fn count(b: &[u8]) -> Result<u32, CanRecordError> {
    decode(b).map(|f| f.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ts_ns: i64, id: u32, flags: u8, data: &[u8]) -> CanFrame {
        CanFrame {
            ts_ns,
            id,
            flags,
            data: data.to_vec(),
        }
    }

    fn sample() -> Vec<CanFrame> {
        vec![
            frame(
                1_700_000_000_000_000_001,
                0x123,
                0,
                &[0xDE, 0xAD, 0xBE, 0xEF],
            ),
            frame(1_700_000_000_000_000_002, 0x1ABC_DEF0 | EFF_FLAG, 0, &[]),
            frame(1_700_000_000_000_000_003, 0x7FF | RTR_FLAG, 0, &[]),
            frame(
                1_700_000_000_000_000_004,
                0x0040 | ERR_FLAG,
                0,
                &[0, 0, 0, 0, 0, 0, 0, 0],
            ),
            frame(1_700_000_000_000_000_005, 0x456, FD | BRS, &[7; 64]),
            frame(1_700_000_000_000_000_006, 0x457, FD | ESI, &[1, 2, 3]),
        ]
    }

    #[test]
    fn frames_read_back_as_written_in_order() {
        let frames = sample();
        let mut out = Vec::new();
        encode(&frames, &mut out);
        let expect: usize = frames.iter().map(CanFrame::encoded_len).sum();
        assert_eq!(out.len(), expect);
        assert_eq!(out.len(), 6 * HEADER + 4 + 8 + 64 + 3);
        assert_eq!(decode(&out).unwrap(), frames);
        assert_eq!(count(&out).unwrap(), 6);
    }

    #[test]
    fn the_layout_is_little_endian_without_padding() {
        let mut out = Vec::new();
        encode(&[frame(-2, 0x8000_0123, FD | BRS, &[0xAA, 0xBB])], &mut out);
        assert_eq!(
            out,
            [
                0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, // ts_ns -2
                0x23, 0x01, 0x00, 0x80, // can_id
                0x03, 0x02, 0x00, 0x00, // flags, len, reserved
                0xAA, 0xBB,
            ]
        );
    }

    #[test]
    fn an_empty_record_has_no_frames() {
        assert_eq!(decode(&[]).unwrap(), Vec::new());
    }

    #[test]
    fn a_cut_record_is_an_error_naming_the_frame_it_cut() {
        let frames = sample();
        let mut out = Vec::new();
        encode(&frames, &mut out);
        // Inside the second frame's header (the first frame is 16 + 4 bytes).
        let e = decode(&out[..25]).unwrap_err();
        assert_eq!(
            e,
            CanRecordError::Truncated {
                offset: 20,
                need: HEADER,
                have: 5
            }
        );
        // Inside the first frame's data.
        let e = decode(&out[..18]).unwrap_err();
        assert_eq!(
            e,
            CanRecordError::Truncated {
                offset: 0,
                need: 20,
                have: 18
            }
        );
        assert!(e.to_string().contains("offset 0"), "{e}");
        for cut in 1..out.len() {
            let boundary = {
                let mut at = 0;
                let mut on = false;
                for f in &frames {
                    at += f.encoded_len();
                    on |= at == cut;
                }
                on
            };
            assert_eq!(decode(&out[..cut]).is_ok(), boundary, "cut at {cut}");
        }
    }

    #[test]
    fn a_classic_frame_longer_than_8_and_reserved_bytes_are_errors() {
        let mut out = Vec::new();
        encode(&[frame(0, 1, 0, &[0; 8])], &mut out);
        out[13] = 9;
        out.push(0);
        assert_eq!(
            decode(&out).unwrap_err(),
            CanRecordError::Length {
                offset: 0,
                len: 9,
                max: 8
            }
        );
        let mut out = Vec::new();
        encode(&[frame(0, 1, FD, &[0; 64])], &mut out);
        out[13] = 65;
        assert!(matches!(
            decode(&out),
            Err(CanRecordError::Length { max: 64, .. })
        ));
        let mut out = Vec::new();
        encode(&[frame(0, 1, 0, &[])], &mut out);
        out[15] = 1;
        assert_eq!(
            decode(&out).unwrap_err(),
            CanRecordError::Reserved {
                offset: 0,
                value: 0x100
            }
        );
    }

    #[test]
    fn garbage_never_panics() {
        // A deterministic walk over many byte strings (xorshift), every length up to 300.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for n in 0..300 {
            for _ in 0..20 {
                let bytes: Vec<u8> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Mostly small bytes, so that lengths and reserved fields often pass.
                        if x % 3 == 0 {
                            (x >> 8) as u8
                        } else {
                            (x >> 8) as u8 & 0x07
                        }
                    })
                    .collect();
                let _ = decode(&bytes);
            }
        }
    }

    #[test]
    fn id_helpers_split_flags_from_the_identifier() {
        let f = sample();
        assert_eq!(f[0].raw_id(), 0x123);
        assert!(!f[0].is_extended() && !f[0].is_fd());
        assert_eq!(f[1].raw_id(), 0x1ABC_DEF0);
        assert!(f[1].is_extended());
        assert!(f[2].is_remote());
        assert!(f[3].is_error());
        assert!(f[4].is_fd());
    }

    #[test]
    fn data_beyond_64_bytes_is_cut_so_the_record_reads_back() {
        let mut out = Vec::new();
        encode(&[frame(0, 1, FD, &[1; 70])], &mut out);
        assert_eq!(decode(&out).unwrap()[0].data.len(), 64);
    }
}
