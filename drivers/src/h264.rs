//! H.264 encoding of raw frames on the rig (Cisco's OpenH264, built from source by the `openh264`
//! crate; the encoder needs feature `h264`, the settings do not). One access unit per frame, Annex B, Constrained Baseline (no B-frames:
//! nothing waits for a later frame), one slice, and a keyframe (IDR, with its SPS and PPS in front)
//! only when the caller asks for one: groups are the caller's, placed on bucket boundaries
//! (docs/DRIVERS.md "H.264").

#[cfg(feature = "h264")]
use openh264::encoder::{
    BitRate, Complexity, Encoder, EncoderConfig, FrameRate, FrameType, IntraFramePeriod,
    RateControlMode, SpsPpsStrategy, UsageType,
};
#[cfg(feature = "h264")]
use openh264::formats::YUVSlices;
#[cfg(feature = "h264")]
use openh264::OpenH264API;

/// Whether this build can encode H.264 (feature `h264`).
pub const BUILT: bool = cfg!(feature = "h264");

/// How the encoder spends bits (config `rate-control`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateControl {
    /// Holds the average at `bitrate` (quantiser moves with the picture; no frame is skipped).
    #[default]
    Bitrate,
    /// Keeps the quality steady and lets the rate follow the picture, `bitrate` as its target.
    Quality,
}

/// An encoder's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct H264Settings {
    /// Bits per second.
    pub bitrate: u32,
    pub rate_control: RateControl,
    /// Frames per second the rate is spread over.
    pub fps: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum H264Error {
    #[error("H.264 encoder: {0}")]
    Encoder(String),
    #[error("H.264 encoder: frame of {width}x{height} (sizes must be even, at most 3840x2160)")]
    BadSize { width: usize, height: usize },
    #[error("H.264 decoder: {0}")]
    Decoder(String),
    /// The encoder device failed (gone, erred, silent): handled like a camera that fails.
    #[error("H.264 encoder device: {0}")]
    Device(String),
}

/// An OpenH264 encoder that emits a keyframe only when told.
#[cfg(feature = "h264")]
pub struct H264Encoder {
    encoder: Encoder,
}

#[cfg(feature = "h264")]
impl std::fmt::Debug for H264Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("H264Encoder")
    }
}

/// One encoded frame: its access unit (Annex B NAL units) and whether it is a keyframe.
#[derive(Debug, Clone)]
pub struct AccessUnit {
    pub data: Vec<u8>,
    pub keyframe: bool,
}

#[cfg(feature = "h264")]
impl H264Encoder {
    pub fn new(settings: H264Settings) -> Result<Self, H264Error> {
        let rc = match settings.rate_control {
            RateControl::Bitrate => RateControlMode::Bitrate,
            RateControl::Quality => RateControlMode::Quality,
        };
        let config = EncoderConfig::new()
            .bitrate(BitRate::from_bps(settings.bitrate))
            .max_frame_rate(FrameRate::from_hz(settings.fps as f32))
            .rate_control_mode(rc)
            .usage_type(UsageType::CameraVideoRealTime)
            // Every frame becomes an access unit: a skipped frame would be a hole in the
            // sequence numbers that no drop accounts for.
            .skip_frames(false)
            // Keyframes only where asked for (group starts): none on a timer or a scene cut.
            .intra_frame_period(IntraFramePeriod::from_num_frames(0))
            .scene_change_detect(false)
            .sps_pps_strategy(SpsPpsStrategy::ConstantId)
            .complexity(Complexity::Low)
            // One thread: a rig's cores are for its sources, and the cost per frame stays
            // measurable.
            .num_threads(1);
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| H264Error::Encoder(e.to_string()))?;
        Ok(H264Encoder { encoder })
    }

    /// Encodes one I420 frame (planes Y, U, V with strides `width`, `width / 2`, `width / 2`);
    /// `keyframe` forces an IDR (with SPS and PPS). The first frame is always one.
    pub fn encode(
        &mut self,
        width: usize,
        height: usize,
        planes: (&[u8], &[u8], &[u8]),
        keyframe: bool,
    ) -> Result<AccessUnit, H264Error> {
        if width == 0
            || height == 0
            || width % 2 != 0
            || height % 2 != 0
            || width.max(height) > 3840
            || width.min(height) > 2160
            || planes.0.len() < width * height
            || planes.1.len() < width * height / 4
            || planes.2.len() < width * height / 4
        {
            return Err(H264Error::BadSize { width, height });
        }
        if keyframe {
            self.encoder.force_intra_frame();
        }
        let source = YUVSlices::new(planes, (width, height), (width, width / 2, width / 2));
        let stream = self
            .encoder
            .encode(&source)
            .map_err(|e| H264Error::Encoder(e.to_string()))?;
        let keyframe = matches!(stream.frame_type(), FrameType::IDR);
        Ok(AccessUnit {
            data: stream.to_vec(),
            keyframe,
        })
    }
}

/// What turns a camera's raw pictures into access units: the seam an encoder plugs into. OpenH264
/// in software ([`H264Encoder`]) is the one built; a V4L2 memory-to-memory device (issue 49.2) is
/// the next. Every implementation keeps [`H264Encoder::encode`]'s contract: one access unit per
/// picture, a keyframe with its SPS and PPS exactly when asked (and on the first picture).
pub trait VideoEncoder: Send {
    fn encode(
        &mut self,
        width: usize,
        height: usize,
        planes: (&[u8], &[u8], &[u8]),
        keyframe: bool,
    ) -> Result<AccessUnit, H264Error>;

    /// Which encoder this is, for the status page (`software (OpenH264)`, or the device and the
    /// copies made into it).
    fn describe(&self) -> String {
        "software (OpenH264)".into()
    }
}

#[cfg(feature = "h264")]
impl VideoEncoder for H264Encoder {
    fn encode(
        &mut self,
        width: usize,
        height: usize,
        planes: (&[u8], &[u8], &[u8]),
        keyframe: bool,
    ) -> Result<AccessUnit, H264Error> {
        H264Encoder::encode(self, width, height, planes, keyframe)
    }
}

/// The software encoder behind the seam; without feature `h264`, an error saying so.
pub fn software_encoder(settings: H264Settings) -> Result<Box<dyn VideoEncoder>, H264Error> {
    #[cfg(feature = "h264")]
    {
        H264Encoder::new(settings).map(|e| Box::new(e) as Box<dyn VideoEncoder>)
    }
    #[cfg(not(feature = "h264"))]
    {
        let _ = settings;
        Err(H264Error::Encoder(
            "this build has no H.264 (feature `h264`)".into(),
        ))
    }
}

/// A decoded picture, I420 with tight strides (Y `width` x `height`, then U and V at half size).
#[derive(Debug, Clone)]
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub i420: Vec<u8>,
}

/// Decodes one keyframe access unit (SPS, PPS and an IDR slice) on its own, with a decoder opened
/// for it and dropped after: the status page's still of an H.264 camera, made when a page asks
/// for a new keyframe, never per frame.
#[cfg(feature = "h264")]
pub fn decode_keyframe(au: &[u8]) -> Result<Picture, H264Error> {
    use openh264::decoder::{Decoder, DecoderConfig};
    use openh264::formats::YUVSource;
    let types = nal_types(au);
    if !types.contains(&5) || !types.contains(&7) || !types.contains(&8) {
        return Err(H264Error::Decoder(format!(
            "not a keyframe with its parameter sets (NAL types {types:?})"
        )));
    }
    let mut decoder = Decoder::with_api_config(OpenH264API::from_source(), DecoderConfig::new())
        .map_err(|e| H264Error::Decoder(e.to_string()))?;
    let yuv = decoder
        .decode(au)
        .map_err(|e| H264Error::Decoder(e.to_string()))?
        .ok_or_else(|| H264Error::Decoder("no picture out of the keyframe".into()))?;
    let (w, h) = yuv.dimensions();
    let (sy, su, sv) = yuv.strides();
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let mut i420 = Vec::with_capacity(w * h + 2 * cw * ch);
    for (plane, stride, pw, ph) in [
        (yuv.y(), sy, w, h),
        (yuv.u(), su, cw, ch),
        (yuv.v(), sv, cw, ch),
    ] {
        for row in 0..ph {
            let line = plane
                .get(row * stride..row * stride + pw)
                .ok_or_else(|| H264Error::Decoder("decoded plane shorter than its size".into()))?;
            i420.extend_from_slice(line);
        }
    }
    Ok(Picture {
        width: w as u32,
        height: h as u32,
        i420,
    })
}

/// Without feature `h264` there is no decoder: the status page shows no still.
#[cfg(not(feature = "h264"))]
pub fn decode_keyframe(_au: &[u8]) -> Result<Picture, H264Error> {
    Err(H264Error::Decoder(
        "this build has no H.264 (feature `h264`)".into(),
    ))
}

/// Which group a frame captured at `capture_ns` falls in, and whether it must be a keyframe:
/// the first frame of a group (or the first after `last` was lost) opens it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Groups {
    last: Option<i64>,
}

impl Groups {
    /// The group start (a bucket number) of a frame captured at `capture_ns`, and whether the
    /// frame must be a keyframe.
    pub fn next(&mut self, capture_ns: i64, gop: u32, bucket_ms: u32) -> (i64, bool) {
        let bucket = (capture_ns.div_euclid(1_000_000)).div_euclid(i64::from(bucket_ms.max(1)));
        let group = crate::group_start(bucket, gop);
        let key = self.last != Some(group);
        self.last = Some(group);
        (group, key)
    }

    /// The frame just numbered was lost (not encoded): the next one opens its group afresh.
    pub fn lost(&mut self) {
        self.last = None;
    }
}

/// The NAL unit types of an Annex B access unit, in order (5 IDR slice, 1 other slice, 7 SPS,
/// 8 PPS, 6 SEI, 9 access unit delimiter).
pub fn nal_types(au: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    let mut i = 0;
    while i + 3 < au.len() {
        if au[i] == 0 && au[i + 1] == 0 && au[i + 2] == 1 {
            types.push(au[i + 3] & 0x1F);
            i += 3;
        } else {
            i += 1;
        }
    }
    types
}

#[cfg(all(test, feature = "h264"))]
mod tests {
    use super::*;
    use crate::scene::Pan;

    /// An encoder as a 30 fps camera runs it, at `bitrate`.
    fn encoder(bitrate: u32) -> H264Encoder {
        H264Encoder::new(H264Settings {
            bitrate,
            rate_control: RateControl::Bitrate,
            fps: 30.0,
        })
        .unwrap()
    }

    #[test]
    fn keyframes_come_only_when_asked_and_carry_their_parameter_sets() {
        let mut pan = Pan::new(160, 96);
        let mut enc = encoder(300_000);
        for n in 0..20u64 {
            let ask = n % 8 == 0;
            let au = enc.encode(160, 96, pan.draw(n), ask).unwrap();
            assert_eq!(au.keyframe, ask, "frame {n}");
            let types = nal_types(&au.data);
            if ask {
                assert!(
                    types.starts_with(&[7, 8]) && types.contains(&5),
                    "{types:?}"
                );
            } else {
                assert!(types.iter().all(|t| *t == 1 || *t == 6), "{types:?}");
            }
            assert!(!au.data.is_empty());
        }
        assert!(enc.encode(161, 96, pan.draw(0), true).is_err());
    }

    #[test]
    fn a_keyframe_decodes_alone_to_the_picture_it_was_made_from_and_garbage_is_an_error() {
        let (w, h) = (320usize, 180usize);
        let mut pan = Pan::new(w, h);
        let mut enc = encoder(2_000_000);
        let (y, u, v) = pan.draw(3);
        let source = [y, u, v].concat();
        let au = enc.encode(w, h, (y, u, v), true).unwrap();
        let p = decode_keyframe(&au.data).unwrap();
        assert_eq!((p.width, p.height), (w as u32, h as u32));
        assert_eq!(p.i420.len(), source.len());
        let mse = p.i420[..w * h]
            .iter()
            .zip(&source[..w * h])
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum::<f64>()
            / (w * h) as f64;
        let psnr = 10.0 * (255.0f64 * 255.0 / mse.max(1e-9)).log10();
        assert!(psnr > 28.0, "luma PSNR {psnr:.1} dB");
        // A P-frame, a cut keyframe and noise: errors, never a panic.
        let p_frame = enc.encode(w, h, pan.draw(4), false).unwrap();
        assert!(decode_keyframe(&p_frame.data).is_err());
        assert!(decode_keyframe(b"\x00\x00\x01\x67garbage").is_err());
        let _ = decode_keyframe(&au.data[..au.data.len() / 3]);
    }

    /// The status page's still of an H.264 camera: one 1080p keyframe decoded alone (a decoder
    /// opened and dropped) and made a JPEG at quality 80, per call. docs/WEB.md:
    /// `cargo test --release --locked -p rigd-drivers --features h264,turbojpeg --lib -- --ignored --nocapture bench_keyframe_still`
    #[test]
    #[ignore = "benchmark"]
    fn bench_keyframe_still() {
        let (w, h) = (1920usize, 1080usize);
        let mut pan = Pan::new(w, h);
        let key = encoder(4_000_000).encode(w, h, pan.draw(0), true).unwrap();
        let mut jpeg = Vec::new();
        let rounds = 20;
        let t = std::time::Instant::now();
        for _ in 0..rounds {
            let p = decode_keyframe(&key.data).unwrap();
            crate::camera::i420_to_jpeg(p.width, p.height, &p.i420, 80, &mut jpeg).unwrap();
        }
        let per = t.elapsed().as_secs_f64() * 1e3 / rounds as f64;
        println!(
            "1080p keyframe ({} bytes) to a JPEG still ({} bytes): {per:.1} ms",
            key.data.len(),
            jpeg.len()
        );
    }

    /// The same 1080p30 pan (texture, motion, sensor noise) as JPEG (quality 80, the rig's raw
    /// camera path: `camera::nv12_to_jpeg`) and as H.264 at 2 and 4 Mbit/s: bytes per second and
    /// encode time per frame (wall, one thread; a group every 30 frames). docs/DRIVERS.md "H.264":
    /// `cargo test --release --locked -p rigd-drivers --features h264,turbojpeg --lib -- --ignored --nocapture bench_h264`
    #[test]
    #[ignore = "benchmark"]
    fn bench_h264() {
        let (w, h, n) = (1920usize, 1080usize, 90u64);
        let mut pan = Pan::new(w, h);
        let mut jpeg = Vec::new();
        let (mut bytes, mut secs) = (0usize, 0f64);
        for i in 0..n {
            let (y, u, v) = pan.draw(i);
            let mut nv12 = y.to_vec();
            for (cu, cv) in u.iter().zip(v) {
                nv12.extend_from_slice(&[*cu, *cv]);
            }
            let t = std::time::Instant::now();
            crate::camera::nv12_to_jpeg(w as u32, h as u32, &nv12, 80, &mut jpeg).unwrap();
            secs += t.elapsed().as_secs_f64();
            bytes += jpeg.len();
        }
        println!("| codec | bytes/s at 30 fps | ms/frame |");
        println!("|---|---|---|");
        let jpeg_rate = bytes as f64 / n as f64 * 30.0;
        println!(
            "| JPEG q80 | {:.2} MB/s | {:.1} |",
            jpeg_rate / 1e6,
            secs * 1e3 / n as f64
        );
        for bitrate in [2_000_000, 4_000_000] {
            let mut enc = H264Encoder::new(H264Settings {
                bitrate,
                rate_control: RateControl::Bitrate,
                fps: 30.0,
            })
            .unwrap();
            let (mut bytes, mut secs) = (0usize, 0f64);
            for i in 0..n {
                let planes = pan.draw(i);
                let t = std::time::Instant::now();
                let au = enc.encode(w, h, planes, i % 30 == 0).unwrap();
                secs += t.elapsed().as_secs_f64();
                bytes += au.data.len();
            }
            let rate = bytes as f64 / n as f64 * 30.0;
            println!(
                "| H.264 {} Mbit/s | {:.2} MB/s ({:.0}x below JPEG) | {:.1} |",
                bitrate / 1_000_000,
                rate / 1e6,
                jpeg_rate / rate,
                secs * 1e3 / n as f64
            );
        }
    }
}
