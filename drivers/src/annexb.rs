//! H.264 Annex B access units as a camera hands them over (V4L2 `H264`, a UVC H.264 camera):
//! the NAL units found by their start codes, and the rules that turn a camera's buffers into
//! frames a consumer can start decoding at any keyframe. Pure: no I/O, no clock.
//!
//! Rules ([`Passthrough::accept`], one buffer = one access unit, passed through untouched):
//! - A buffer must begin with a start code (`00 00 01` or `00 00 00 01`, after any zero bytes);
//!   one that does not, or holds a NAL unit with no header byte or with the forbidden bit set, is
//!   rejected (a half-written buffer, garbage), and counts as a lost frame.
//! - A buffer with no slice (only SPS, PPS, SEI, delimiters) is not a frame: its parameter sets
//!   are kept (the last SPS and the last PPS), nothing is emitted.
//! - A keyframe is an access unit with an IDR slice (NAL type 5). One that lacks its SPS or PPS
//!   (a camera that sends them once, or in buffers of their own) gets the last ones inserted in
//!   front of it (after an access unit delimiter, if it starts with one): every keyframe then
//!   carries what a decoder needs to start there. An IDR with none known yet cannot be decoded
//!   and is dropped.
//! - A P-frame (any other slice) needs every frame back to its keyframe: before the first
//!   keyframe of a stream, and after a lost or rejected buffer, P-frames are dropped up to the
//!   next keyframe.
//!
//! A new stream ([`Passthrough::reset`]) forgets the parameter sets: a camera sends them again
//! when it starts streaming, and the size may have changed.

/// NAL unit types (ITU-T H.264 Table 7-1) that the rules look at.
pub const NAL_SLICE: u8 = 1;
pub const NAL_IDR: u8 = 5;
pub const NAL_SEI: u8 = 6;
pub const NAL_SPS: u8 = 7;
pub const NAL_PPS: u8 = 8;
pub const NAL_AUD: u8 = 9;

/// The start code rigd writes in front of a NAL unit it inserts (with its `zero_byte`, as the
/// first NAL units of an access unit have it).
const START_CODE: [u8; 4] = [0, 0, 0, 1];

/// One NAL unit of a buffer: its type and where its bytes (header byte onward, without the start
/// code and the zero bytes before the next one) lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nal {
    pub kind: u8,
    /// Offset of the start code (its `zero_byte` included when it has one).
    pub start: usize,
    /// Offset of the header byte.
    pub body: usize,
    /// One past the last byte.
    pub end: usize,
}

/// Why a buffer is not an access unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("no start code at the buffer's beginning")]
    NoStartCode,
    #[error("a start code with no NAL unit after it")]
    EmptyNal,
    #[error("a NAL unit header with the forbidden bit set")]
    ForbiddenBit,
}

/// The NAL units of `buf`, in order; an error when the buffer is not Annex B.
pub fn nal_units(buf: &[u8]) -> Result<Vec<Nal>, Malformed> {
    let mut units = Vec::new();
    // Leading zero bytes (leading_zero_8bits, zero_byte) then the first start code.
    let first = match next_start_code(buf, 0) {
        Some(at) if buf[..at].iter().all(|b| *b == 0) => at,
        _ => return Err(Malformed::NoStartCode),
    };
    let mut code = first;
    loop {
        let body = code + 3;
        let next = next_start_code(buf, body);
        let mut end = next.unwrap_or(buf.len());
        // The zero bytes before the next start code (its zero_byte, trailing_zero_8bits) are not
        // the NAL unit's: an RBSP ends in its stop bit, never in a zero byte.
        while end > body && buf[end - 1] == 0 {
            end -= 1;
        }
        if end == body {
            return Err(Malformed::EmptyNal);
        }
        let header = buf[body];
        if header & 0x80 != 0 {
            return Err(Malformed::ForbiddenBit);
        }
        // The start of this unit's start code: one zero byte before it belongs to a 4-byte one.
        let start = if code > 0 && buf[code - 1] == 0 {
            code - 1
        } else {
            code
        };
        units.push(Nal {
            kind: header & 0x1F,
            start,
            body,
            end,
        });
        match next {
            Some(n) => code = n,
            None => return Ok(units),
        }
    }
}

/// The offset of the next `00 00 01` at or after `from`.
fn next_start_code(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i + 2 < buf.len() {
        // A third byte above 1, or a 1 not after two zeros, rules out a start code at i, i+1
        // and i+2 alike (each would need that byte to be 0, or a 1 after zeros).
        match buf[i + 2] {
            0 => i += 1,
            1 if buf[i] == 0 && buf[i + 1] == 0 => return Some(i),
            _ => i += 3,
        }
    }
    None
}

/// What one buffer is, once its NAL units are known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contents {
    /// Holds a slice (a picture).
    pub slice: bool,
    /// Holds an IDR slice: a keyframe.
    pub idr: bool,
    pub sps: bool,
    pub pps: bool,
}

impl Contents {
    pub fn of(units: &[Nal]) -> Self {
        let mut c = Contents::default();
        for u in units {
            match u.kind {
                // 1-5: coded slices (2-4 are data partitions, not in the profiles cameras use).
                NAL_IDR => {
                    c.slice = true;
                    c.idr = true;
                }
                1..=4 => c.slice = true,
                NAL_SPS => c.sps = true,
                NAL_PPS => c.pps = true,
                _ => {}
            }
        }
        c
    }
}

/// What became of one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A frame to emit, `keyframe` when it holds an IDR.
    Frame { keyframe: bool, access: Access },
    /// Parameter sets (kept), SEI or delimiters without a picture: not a frame, not a loss.
    HeadersOnly,
    /// Not Annex B: a lost frame.
    Rejected(Malformed),
    /// A picture that cannot be decoded from here: a lost frame.
    Undecodable(Undecodable),
}

/// The bytes of a frame: the buffer as it came, or with parameter sets put in front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Untouched,
    /// The buffer with the last SPS and PPS inserted (a keyframe that came without them).
    WithParameterSets(Vec<u8>),
}

/// Why a picture cannot be decoded from where the stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undecodable {
    /// A P-frame with no keyframe before it since the stream started or a frame was lost.
    NoKeyframe,
    /// A keyframe without SPS and PPS, and none seen in the stream yet.
    NoParameterSets,
}

/// A passthrough camera's stream state: the last parameter sets and whether the frames since
/// the last keyframe are all there.
#[derive(Debug, Clone, Default)]
pub struct Passthrough {
    sps: Option<Vec<u8>>,
    pps: Option<Vec<u8>>,
    /// A keyframe was emitted since the stream started and no frame was lost since.
    decodable: bool,
}

impl Passthrough {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new stream: nothing decodable until its first keyframe, no parameter sets known.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// A frame was lost (a sequence gap, a buffer flagged ERROR or empty): P-frames wait for the
    /// next keyframe.
    pub fn lost(&mut self) {
        self.decodable = false;
    }

    /// Whether a P-frame would be emitted now.
    pub fn decodable(&self) -> bool {
        self.decodable
    }

    /// One buffer (one access unit), by the rules of the module comment.
    pub fn accept(&mut self, buf: &[u8]) -> Verdict {
        let units = match nal_units(buf) {
            Ok(u) => u,
            Err(e) => {
                // Probably a frame, and maybe the keyframe the next P-frames need.
                self.decodable = false;
                return Verdict::Rejected(e);
            }
        };
        for u in &units {
            match u.kind {
                NAL_SPS => self.sps = Some(buf[u.body..u.end].to_vec()),
                NAL_PPS => self.pps = Some(buf[u.body..u.end].to_vec()),
                _ => {}
            }
        }
        let c = Contents::of(&units);
        if !c.slice {
            return Verdict::HeadersOnly;
        }
        if !c.idr {
            if !self.decodable {
                return Verdict::Undecodable(Undecodable::NoKeyframe);
            }
            return Verdict::Frame {
                keyframe: false,
                access: Access::Untouched,
            };
        }
        let access = if c.sps && c.pps {
            Access::Untouched
        } else {
            let (Some(sps), Some(pps)) = (&self.sps, &self.pps) else {
                self.decodable = false;
                return Verdict::Undecodable(Undecodable::NoParameterSets);
            };
            // After a leading access unit delimiter (it must stay first), before the rest.
            let at = match units.first() {
                Some(u) if u.kind == NAL_AUD => units.get(1).map_or(buf.len(), |n| n.start),
                _ => 0,
            };
            let mut out = Vec::with_capacity(buf.len() + sps.len() + pps.len() + 8);
            out.extend_from_slice(&buf[..at]);
            for set in [sps, pps] {
                out.extend_from_slice(&START_CODE);
                out.extend_from_slice(set);
            }
            out.extend_from_slice(&buf[at..]);
            Access::WithParameterSets(out)
        };
        self.decodable = true;
        Verdict::Frame {
            keyframe: true,
            access,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nal(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![0x60 | kind];
        v.extend_from_slice(body);
        v
    }

    fn au(units: &[Vec<u8>], four: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for u in units {
            out.extend_from_slice(if four { &[0, 0, 0, 1] } else { &[0, 0, 1] });
            out.extend_from_slice(u);
        }
        out
    }

    fn kinds(buf: &[u8]) -> Vec<u8> {
        nal_units(buf).unwrap().iter().map(|u| u.kind).collect()
    }

    #[test]
    fn start_codes_of_three_and_four_bytes_split_the_units() {
        let sps = nal(NAL_SPS, &[0x42, 0x00, 0x1e, 0x95]);
        let pps = nal(NAL_PPS, &[0xce, 0x3c, 0x80]);
        let idr = nal(NAL_IDR, &[0x88, 0x84, 0x00, 0x00, 0x03, 0x00, 0x21]);
        let mut mixed = vec![0, 0, 0, 1];
        mixed.extend_from_slice(&sps);
        mixed.extend_from_slice(&[0, 0, 1]);
        mixed.extend_from_slice(&pps);
        mixed.extend_from_slice(&[0, 0, 0, 0, 1]); // trailing_zero_8bits, then a 4-byte code
        mixed.extend_from_slice(&idr);
        mixed.extend_from_slice(&[0, 0]); // trailing zeros at the end of the buffer
        let units = nal_units(&mixed).unwrap();
        assert_eq!(
            units.iter().map(|u| u.kind).collect::<Vec<_>>(),
            [NAL_SPS, NAL_PPS, NAL_IDR]
        );
        assert_eq!(&mixed[units[0].body..units[0].end], &sps[..]);
        assert_eq!(&mixed[units[1].body..units[1].end], &pps[..]);
        assert_eq!(
            &mixed[units[2].body..units[2].end],
            &idr[..],
            "an emulation-prevented 00 00 03 is not a start code, the trailing zeros are not the unit's"
        );
        assert_eq!(units[0].start, 0);
        assert_eq!(mixed[units[2].start..units[2].body], [0, 0, 0, 1]);
        // Leading zero bytes before the first start code are allowed.
        let mut lead = vec![0, 0, 0, 0];
        lead.extend_from_slice(&au(std::slice::from_ref(&idr), false));
        assert_eq!(kinds(&lead), [NAL_IDR]);
    }

    #[test]
    fn garbage_is_rejected_never_a_panic() {
        assert_eq!(nal_units(&[]), Err(Malformed::NoStartCode));
        assert_eq!(nal_units(&[0, 0, 0]), Err(Malformed::NoStartCode));
        assert_eq!(
            nal_units(&[0xFF, 0xD8, 0, 0, 1, 0x65]),
            Err(Malformed::NoStartCode)
        );
        assert_eq!(nal_units(&[0, 0, 1]), Err(Malformed::EmptyNal));
        assert_eq!(
            nal_units(&[0, 0, 1, 0, 0, 1, 0x65]),
            Err(Malformed::EmptyNal)
        );
        assert_eq!(nal_units(&[0, 0, 1, 0xE5, 1]), Err(Malformed::ForbiddenBit));
        // Every prefix and a pseudo-random soup: an answer each, no panic.
        let good = au(
            &[
                nal(NAL_SPS, &[1, 2]),
                nal(NAL_PPS, &[3]),
                nal(NAL_IDR, &[4, 5]),
            ],
            true,
        );
        for n in 0..=good.len() {
            let _ = nal_units(&good[..n]);
            let _ = Passthrough::new().accept(&good[..n]);
        }
        let mut x = 0x1234_5678u32;
        for len in 0..300 {
            let soup: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    // Mostly 0 and 1 so start codes turn up.
                    match x >> 29 {
                        0..=3 => 0,
                        4 | 5 => 1,
                        _ => (x >> 8) as u8,
                    }
                })
                .collect();
            let mut p = Passthrough::new();
            let _ = p.accept(&soup);
            let _ = p.accept(&soup);
        }
    }

    #[test]
    fn a_keyframe_without_parameter_sets_gets_the_last_ones() {
        let sps = nal(NAL_SPS, &[0x42, 0xc0, 0x1e]);
        let pps = nal(NAL_PPS, &[0xce, 0x38]);
        let idr = nal(NAL_IDR, &[0x88, 0x80]);
        let p1 = nal(NAL_SLICE, &[0x9a, 0x01]);
        let mut s = Passthrough::new();
        // The camera sends its parameter sets once, in a buffer of their own: not a frame.
        assert_eq!(
            s.accept(&au(&[sps.clone(), pps.clone()], true)),
            Verdict::HeadersOnly
        );
        let bare = au(&[nal(NAL_SEI, &[5, 1]), idr.clone()], false);
        let Verdict::Frame {
            keyframe: true,
            access: Access::WithParameterSets(with),
        } = s.accept(&bare)
        else {
            panic!("an IDR with its parameter sets inserted")
        };
        assert_eq!(kinds(&with), [NAL_SPS, NAL_PPS, NAL_SEI, NAL_IDR]);
        assert!(
            with.ends_with(&bare),
            "the camera's bytes follow, untouched"
        );
        assert_eq!(with.len(), bare.len() + 8 + sps.len() + pps.len());
        assert_eq!(
            s.accept(&au(std::slice::from_ref(&p1), false)),
            Verdict::Frame {
                keyframe: false,
                access: Access::Untouched
            }
        );
        // A keyframe that carries its own is left alone, and its sets become the last ones.
        let sps2 = nal(NAL_SPS, &[0x42, 0xc0, 0x28]);
        let full = au(&[sps2.clone(), pps.clone(), idr.clone()], true);
        assert_eq!(
            s.accept(&full),
            Verdict::Frame {
                keyframe: true,
                access: Access::Untouched
            }
        );
        let Verdict::Frame {
            access: Access::WithParameterSets(with),
            ..
        } = s.accept(&au(std::slice::from_ref(&idr), true))
        else {
            panic!()
        };
        assert_eq!(&with[4..4 + sps2.len()], &sps2[..], "the newest SPS");
        // An access unit delimiter stays first.
        let aud = nal(NAL_AUD, &[0x10]);
        let delimited = au(&[aud.clone(), idr.clone()], true);
        let Verdict::Frame {
            access: Access::WithParameterSets(with),
            ..
        } = s.accept(&delimited)
        else {
            panic!()
        };
        assert_eq!(kinds(&with), [NAL_AUD, NAL_SPS, NAL_PPS, NAL_IDR]);
        // Only the PPS missing: both inserted in front (the SPS again, the same bytes).
        let Verdict::Frame {
            access: Access::WithParameterSets(with),
            ..
        } = s.accept(&au(&[sps2.clone(), idr.clone()], true))
        else {
            panic!()
        };
        assert_eq!(kinds(&with), [NAL_SPS, NAL_PPS, NAL_SPS, NAL_IDR]);
    }

    #[test]
    fn p_frames_wait_for_a_keyframe_at_the_start_and_after_a_loss() {
        let sets = [nal(NAL_SPS, &[0x42, 0, 0x1e]), nal(NAL_PPS, &[0xce])];
        let mut units = sets.to_vec();
        units.push(nal(NAL_IDR, &[0x88]));
        let key = au(&units, true);
        let p = au(&[nal(NAL_SLICE, &[0x9a])], true);
        let mut s = Passthrough::new();
        let emitted = |v: &Verdict| matches!(v, Verdict::Frame { .. });
        assert_eq!(
            s.accept(&p),
            Verdict::Undecodable(Undecodable::NoKeyframe),
            "stream start"
        );
        assert!(emitted(&s.accept(&key)));
        assert!(emitted(&s.accept(&p)));
        s.lost();
        assert_eq!(s.accept(&p), Verdict::Undecodable(Undecodable::NoKeyframe));
        assert_eq!(s.accept(&p), Verdict::Undecodable(Undecodable::NoKeyframe));
        assert!(emitted(&s.accept(&key)));
        assert!(emitted(&s.accept(&p)));
        // A rejected buffer may have been a frame the next P-frames need.
        assert_eq!(
            s.accept(&[0xDE, 0xAD]),
            Verdict::Rejected(Malformed::NoStartCode)
        );
        assert_eq!(s.accept(&p), Verdict::Undecodable(Undecodable::NoKeyframe));
        // Parameter sets alone do not make P-frames decodable.
        assert_eq!(s.accept(&au(&sets, true)), Verdict::HeadersOnly);
        assert!(!s.decodable());
        // A new stream knows no parameter sets: its bare IDR cannot be decoded.
        s.reset();
        let bare = au(&[nal(NAL_IDR, &[0x88])], true);
        assert_eq!(
            s.accept(&bare),
            Verdict::Undecodable(Undecodable::NoParameterSets)
        );
        assert_eq!(s.accept(&p), Verdict::Undecodable(Undecodable::NoKeyframe));
        assert!(emitted(&s.accept(&key)));
        assert!(emitted(&s.accept(&bare)), "the sets of the key before it");
    }
}

/// The rules on a real stream: OpenH264's access units with their parameter sets taken out (a
/// camera that sends them once, in a buffer of their own), then decoded by OpenH264's decoder.
#[cfg(all(test, feature = "h264"))]
mod decoded {
    use super::*;
    use crate::h264::{H264Encoder, H264Settings, RateControl};
    use openh264::formats::YUVSource;

    /// The luma of each picture `aus` decode to with one fresh decoder, in order; `None` for an
    /// access unit that gives no picture.
    fn luma(aus: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        let mut dec = openh264::decoder::Decoder::new().unwrap();
        aus.iter()
            .map(|au| match dec.decode(au) {
                Ok(Some(pic)) => {
                    let (w, h) = pic.dimensions();
                    let stride = pic.strides().0;
                    Some(
                        (0..h)
                            .flat_map(|r| pic.y()[r * stride..r * stride + w].to_vec())
                            .collect(),
                    )
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn every_group_rigd_emits_decodes_alone_from_its_keyframe() {
        let (w, h) = (160usize, 96usize);
        let mut pan = crate::scene::Pan::new(w, h);
        let mut enc = H264Encoder::new(H264Settings {
            bitrate: 300_000,
            rate_control: RateControl::Bitrate,
            fps: 30.0,
        })
        .unwrap();
        let stream: Vec<Vec<u8>> = (0..24u64)
            .map(|n| enc.encode(w, h, pan.draw(n), n % 8 == 0).unwrap().data)
            .collect();
        // What the camera sends: its SPS and PPS once, alone; access units without them.
        let units = nal_units(&stream[0]).unwrap();
        let sets: Vec<u8> = units
            .iter()
            .filter(|u| matches!(u.kind, NAL_SPS | NAL_PPS))
            .flat_map(|u| stream[0][u.start..u.end].to_vec())
            .collect();
        let bare: Vec<Vec<u8>> = stream
            .iter()
            .map(|au| {
                let units = nal_units(au).unwrap();
                let first = units
                    .iter()
                    .find(|u| !matches!(u.kind, NAL_SPS | NAL_PPS))
                    .unwrap();
                au[first.start..].to_vec()
            })
            .collect();
        assert!(bare
            .iter()
            .all(|au| !Contents::of(&nal_units(au).unwrap()).sps));
        let mut feed: Vec<Vec<u8>> = vec![bare[1].clone(), sets.clone()];
        feed.extend(bare[..11].iter().cloned());
        feed.push(b"not h264".to_vec());
        feed.extend(bare[11..].iter().cloned());
        let mut s = Passthrough::new();
        let mut out: Vec<(Vec<u8>, bool)> = Vec::new();
        for buf in &feed {
            if let Verdict::Frame { keyframe, access } = s.accept(buf) {
                let au = match access {
                    Access::Untouched => buf.clone(),
                    Access::WithParameterSets(with) => with,
                };
                out.push((au, keyframe));
            }
        }
        // Frames 0..=10 and 16..=23: 11..=15 follow the rejected buffer up to keyframe 16.
        assert_eq!(out.len(), 11 + 8);
        assert_eq!(out.iter().filter(|(_, k)| *k).count(), 2 + 1);
        // The reference: the encoder's own stream, decoded in order.
        let all: Vec<&[u8]> = stream.iter().map(|v| &v[..]).collect();
        let reference = luma(&all);
        assert!(reference.iter().all(Option::is_some));
        let emitted: Vec<usize> = (0..=10).chain(16..24).collect();
        let starts: Vec<usize> = (0..out.len()).filter(|&i| out[i].1).collect();
        assert_eq!(starts, [0, 8, 11]);
        for (a, b) in starts.iter().zip(starts[1..].iter().chain([&out.len()])) {
            let group: Vec<&[u8]> = out[*a..*b].iter().map(|(au, _)| &au[..]).collect();
            for (i, picture) in luma(&group).into_iter().enumerate() {
                let n = emitted[a + i];
                assert_eq!(
                    picture, reference[n],
                    "frame {n} decoded alone from its keyframe"
                );
            }
        }
        // Without the insertion, a group does not decode from its keyframe.
        assert_eq!(luma(&[&bare[8][..]])[0], None);
    }
}
