//! V4L2 cameras (`v4l` crate, feature `v4l`): mmap streaming, each buffer turned into one JPEG frame
//! stamped with the buffer's kernel timestamp.
//!
//! - **Device**: a path (`/dev/video0`, a udev symlink) or a card name (`VIDIOC_QUERYCAP` card, as
//!   `v4l2-ctl --list-devices` shows it), looked up among `/dev/video*` at every open.
//! - **Negotiation**: the first format of the preference list that the device enumerates *and* keeps
//!   after `VIDIOC_S_FMT` wins (some drivers silently answer another fourcc); size and frame interval
//!   are requested, and the driver's answer (it may snap both) is what frames carry and what is
//!   logged and shown in [`crate::SourceHealth::detail`].
//! - **Multi-planar devices** (`V4L2_CAP_VIDEO_CAPTURE_MPLANE` without single-planar capture, as
//!   SoC cameras and ISPs expose them) are streamed through [`crate::v4l_mplane`]: YUYV and NV12 in
//!   one plane, NV12M in two (joined into NV12 for the encoder).
//! - **Payload**: MJPEG buffers pass through byte for byte when they hold a whole JPEG; a buffer that
//!   does not (the first after stream-on often does not) is rejected and counted as a drop. YUYV and
//!   NV12 are encoded with [`crate::camera`] (or [`crate::h264`] with `codec = "h264"`). H.264
//!   buffers (a UVC H.264 camera, `codec = "h264"` only) pass through as one access unit each,
//!   by the rules of [`crate::annexb`]: parameter sets kept and put in front of a keyframe that
//!   lacks them, P-frames that cannot be decoded dropped up to the next keyframe; where their
//!   keyframes fall against the rig's groups is measured ([`KeyframePlacement`]).
//! - **Time**: a buffer whose flags say `TIMESTAMP_MONOTONIC` is stamped with that time mapped through
//!   [`crate::FrameClock::map_monotonic`]; other drivers' buffers are stamped at dequeue.
//! - **Drops**: the driver's buffer sequence numbers are tracked ([`SequenceTracker`]); every number
//!   skipped is a frame the driver lost and counts as a drop, as do buffers flagged `ERROR`, empty
//!   buffers and frames that cannot be encoded.
//! - **Device gone**: any capture error (ENODEV/EIO on unplug) or no buffer for [`STALL`] ends `run`
//!   with a retryable error; the daemon reopens with backoff.

use serde::Deserialize;
use std::fmt;

use crate::camera::{nv12_to_jpeg, yuyv_to_jpeg};

/// A pixel format rigd can take from a camera, named by its V4L2 fourcc (`formats` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
pub enum PixelFormat {
    /// Motion JPEG: each buffer is a JPEG, passed through untouched.
    #[serde(rename = "MJPG")]
    Mjpg,
    /// Packed 4:2:2 (YUY2), encoded to JPEG.
    #[serde(rename = "YUYV")]
    Yuyv,
    /// Y plane then interleaved CbCr at half resolution (4:2:0), encoded to JPEG.
    #[serde(rename = "NV12")]
    Nv12,
    /// NV12 with its two planes in separate buffers (multi-planar devices only), encoded to JPEG.
    #[serde(rename = "NV12M")]
    Nv12m,
    /// H.264 with start codes (a UVC H.264 camera's own encoder): each buffer one access unit,
    /// passed through; only with `codec = "h264"`.
    #[serde(rename = "H264")]
    H264,
}

impl PixelFormat {
    pub fn fourcc(self) -> [u8; 4] {
        match self {
            PixelFormat::Mjpg => *b"MJPG",
            PixelFormat::Yuyv => *b"YUYV",
            PixelFormat::Nv12 => *b"NV12",
            PixelFormat::Nv12m => *b"NM12",
            PixelFormat::H264 => *b"H264",
        }
    }

    pub fn from_fourcc(fourcc: [u8; 4]) -> Option<Self> {
        match &fourcc {
            b"MJPG" => Some(PixelFormat::Mjpg),
            b"YUYV" => Some(PixelFormat::Yuyv),
            b"NV12" => Some(PixelFormat::Nv12),
            b"NM12" => Some(PixelFormat::Nv12m),
            b"H264" => Some(PixelFormat::H264),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PixelFormat::Mjpg => "MJPG",
            PixelFormat::Yuyv => "YUYV",
            PixelFormat::Nv12 => "NV12",
            PixelFormat::Nv12m => "NV12M",
            PixelFormat::H264 => "H264",
        }
    }
}

/// Everything the camera driver needs to open and negotiate a device.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraSettings {
    /// A path (starts with `/`) or a card name.
    pub device: String,
    /// Requested size; the driver may snap it.
    pub width: u32,
    pub height: u32,
    /// Requested frame rate; the driver may snap it.
    pub fps: f64,
    /// In order of preference; at least one.
    pub formats: Vec<PixelFormat>,
    /// mmap buffers requested (the driver may grant more or fewer).
    pub buffers: u32,
    /// JPEG quality for encoded formats (1..=100).
    pub jpeg_quality: u8,
    /// Raw frames (YUYV, NV12) encoded to H.264 instead of JPEG (config `codec = "h264"`), a
    /// keyframe opening every group; an MJPEG stream is never re-encoded. Also what lets an
    /// `H264` format be negotiated (passed through; its `gop` is the group width its keyframes
    /// are measured against).
    pub video: Option<crate::synthetic::VideoSettings>,
}

impl CameraSettings {
    /// The formats to negotiate, in preference order: `H264` only for a video source (a JPEG
    /// camera source cannot carry H.264; `rigd check` refuses the combination too).
    pub fn wanted_formats(&self) -> Vec<PixelFormat> {
        self.formats
            .iter()
            .copied()
            .filter(|f| *f != PixelFormat::H264 || self.video.is_some())
            .collect()
    }
}

/// What the driver agreed to: the frames' real format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Negotiated {
    pub format: PixelFormat,
    pub width: u32,
    pub height: u32,
    /// Bytes per row the driver uses (may exceed the packed row).
    pub stride: u32,
    /// From the driver's frame interval; `None` when it does not report one.
    pub fps: Option<f64>,
    /// mmap buffers granted.
    pub buffers: u32,
}

impl fmt::Display for Negotiated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}x{}", self.format.as_str(), self.width, self.height)?;
        match self.fps {
            Some(fps) => write!(f, " @ {fps:.2} fps")?,
            None => write!(f, " @ ? fps")?,
        }
        write!(f, ", {} buffers", self.buffers)
    }
}

/// Counters of one camera source since it was created (across reopens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CameraCounts {
    /// Frames emitted.
    pub frames: u64,
    /// Frames the driver skipped (gaps in its sequence numbers).
    pub lost: u64,
    /// MJPEG buffers that were not a whole JPEG, H.264 buffers that were not Annex B.
    pub rejected: u64,
    /// Buffers flagged `ERROR` or empty.
    pub errored: u64,
    /// Raw frames the encoder refused (short buffer).
    pub encode_failed: u64,
    /// Buffers that repeated the previous sequence number (not drops).
    pub repeated: u64,
    /// Times the sequence went backwards within a stream (the driver restarted its count).
    pub restarted: u64,
    /// Frames stamped from the buffer's kernel (monotonic) timestamp rather than at dequeue.
    pub kernel_stamps: u64,
    /// Time spent encoding raw frames to JPEG (ns).
    pub encode_ns: u64,
    /// The driver's sequence number of the first buffer of the newest stream.
    pub first_sequence: Option<u32>,
    /// The driver's sequence number of the newest buffer.
    pub last_sequence: Option<u32>,
    /// Stream-ons (opens that got as far as streaming).
    pub streams: u64,
    /// H.264 passthrough: keyframes emitted.
    pub keyframes: u64,
    /// H.264 passthrough: keyframes that came without SPS/PPS and got the last ones inserted.
    pub parameter_sets_inserted: u64,
    /// H.264 passthrough: buffers without a picture (parameter sets, SEI): not frames, not drops.
    pub headers_only: u64,
    /// H.264 passthrough: pictures dropped because they cannot be decoded from where the stream
    /// is (P-frames before the stream's first keyframe or after a lost frame, up to the next
    /// keyframe; a keyframe with no parameter sets known).
    pub undecodable: u64,
    /// H.264 passthrough: a repeated sequence number on the same bytes (the driver handed the
    /// buffer over again): not emitted twice.
    pub reread: u64,
    /// H.264 passthrough: groups (the rig's message keys) its frames opened.
    pub groups: u64,
    /// ... of which the first frame was a P-frame (the camera's keyframe was in an earlier group).
    pub groups_without_keyframe: u64,
    /// P-frames in a group before the group's first keyframe: a consumer of that group's key
    /// alone cannot decode them (they need the earlier group's frames).
    pub frames_before_group_keyframe: u64,
    /// The camera's last keyframe interval, capture time to capture time (ns).
    pub keyframe_interval_ns: Option<i64>,
}

impl CameraCounts {
    /// Everything counted as a drop.
    pub fn drops(&self) -> u64 {
        self.lost + self.rejected + self.errored + self.encode_failed + self.undecodable
    }
}

/// Where a passthrough camera's frames fall against the rig's groups, the message keys
/// (`group_start` of the bucket). rigd cannot place the keyframes of a camera that encodes by
/// itself, so a group may open on a P-frame whose keyframe is in the group before: pure, counts
/// what a consumer of one key could not decode alone.
#[derive(Debug, Default, Clone)]
pub struct KeyframePlacement {
    group: Option<i64>,
    /// The current group has had no keyframe yet (it opened on a P-frame).
    without_keyframe: bool,
    last_keyframe_ns: Option<i64>,
    interval_ns: Option<i64>,
}

/// What [`KeyframePlacement::observe`] says about one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The frame is the first of its group.
    pub opens_group: bool,
    /// A P-frame in a group with no keyframe before it: decodes only after the earlier group.
    pub needs_earlier_group: bool,
}

impl KeyframePlacement {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new stream (its first frame is a keyframe: the rules of [`crate::annexb`]).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// The emitted frame captured at `capture_ns`, of a rig whose groups are `gop` buckets of
    /// `bucket_ms`.
    pub fn observe(
        &mut self,
        capture_ns: i64,
        keyframe: bool,
        gop: u32,
        bucket_ms: u32,
    ) -> Placement {
        let bucket = capture_ns
            .div_euclid(1_000_000)
            .div_euclid(i64::from(bucket_ms.max(1)));
        let group = crate::group_start(bucket, gop);
        let opens_group = self.group != Some(group);
        self.group = Some(group);
        if keyframe {
            if let Some(last) = self.last_keyframe_ns {
                self.interval_ns = Some(capture_ns - last);
            }
            self.last_keyframe_ns = Some(capture_ns);
            self.without_keyframe = false;
        } else if opens_group {
            self.without_keyframe = true;
        }
        Placement {
            opens_group,
            needs_earlier_group: !keyframe && self.without_keyframe,
        }
    }

    /// The time between the camera's last two keyframes.
    pub fn keyframe_interval_ns(&self) -> Option<i64> {
        self.interval_ns
    }
}

/// What one buffer's sequence number says about the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStep {
    /// The number expected (or the first of a stream).
    Next,
    /// This many numbers were skipped: frames the driver lost.
    Lost(u64),
    /// The previous number again (vivid does this when its timer thread runs early); not a loss.
    Repeat,
    /// The number went backwards: the driver restarted its count; a new baseline.
    Restart,
}

/// Turns the driver's buffer sequence numbers into lost-frame counts; pure.
///
/// The first buffer of a stream sets the baseline (the kernel numbers from 0 at stream-on, but a
/// loopback device numbers from whatever its writer reached). After that, every number skipped is
/// a lost frame. A number that goes backwards (more than 2^31 behind, with wrapping) means the
/// driver restarted its count: a new baseline, nothing counted.
#[derive(Debug, Default, Clone)]
pub struct SequenceTracker {
    expected: Option<u32>,
}

impl SequenceTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the baseline (a new stream).
    pub fn reset(&mut self) {
        self.expected = None;
    }

    /// Classifies the buffer numbered `seq`.
    pub fn observe(&mut self, seq: u32) -> SeqStep {
        let step = match self.expected {
            None => SeqStep::Next,
            Some(want) => match seq.wrapping_sub(want) {
                0 => SeqStep::Next,
                gap if gap < 1 << 31 => SeqStep::Lost(gap as u64),
                gap if gap == u32::MAX => SeqStep::Repeat,
                _ => SeqStep::Restart,
            },
        };
        self.expected = Some(seq.wrapping_add(1));
        step
    }
}

/// Copies `rows` rows of `row_bytes` each from a buffer whose rows are `stride` apart into `out`,
/// packed. Returns false when the buffer is too short.
pub fn pack_rows(
    data: &[u8],
    stride: usize,
    row_bytes: usize,
    rows: usize,
    out: &mut Vec<u8>,
) -> bool {
    if rows == 0 {
        return true;
    }
    if stride < row_bytes || data.len() < stride * (rows - 1) + row_bytes {
        return false;
    }
    for r in 0..rows {
        out.extend_from_slice(&data[r * stride..r * stride + row_bytes]);
    }
    true
}

/// The frame interval to request for `fps`, as numerator/denominator (1000/30000 for 30 fps).
pub fn interval_for(fps: f64) -> (u32, u32) {
    let milli = (fps * 1000.0).round().clamp(1.0, u32::MAX as f64) as u32;
    let g = gcd(1000, milli);
    (1000 / g, milli / g)
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The formats of `preferences` that the device offers, in preference order.
pub fn choose_formats(preferences: &[PixelFormat], offered: &[[u8; 4]]) -> Vec<PixelFormat> {
    preferences
        .iter()
        .copied()
        .filter(|p| offered.contains(&p.fourcc()))
        .collect()
}

/// Encodes one raw YUYV or NV12 buffer of the negotiated format into `jpeg`, first packing rows
/// that the driver padded to its stride into `packed`. (An MJPEG buffer is copied as it is.)
pub fn encode_raw(
    neg: &Negotiated,
    data: &[u8],
    q: u8,
    packed: &mut Vec<u8>,
    jpeg: &mut Vec<u8>,
) -> Result<(), crate::camera::EncodeError> {
    let (w, h) = (neg.width, neg.height);
    let stride = neg.stride as usize;
    let rows = h as usize;
    // Rows padded to the driver's stride are packed first; a buffer too short for its
    // stride is refused like one too short for the packed size.
    let short = |format, need| crate::camera::EncodeError::ShortBuffer {
        format,
        width: w,
        height: h,
        need,
        have: data.len(),
    };
    match neg.format {
        PixelFormat::Yuyv => {
            let row = w as usize * 2;
            if stride <= row {
                return yuyv_to_jpeg(w, h, data, q, jpeg);
            }
            packed.clear();
            if !pack_rows(data, stride, row, rows, packed) {
                return Err(short("YUYV", stride * rows));
            }
            yuyv_to_jpeg(w, h, packed, q, jpeg)
        }
        // NV12M arrives here with its planes joined (Y rows, then CbCr rows): NV12.
        PixelFormat::Nv12 | PixelFormat::Nv12m => {
            let row = w as usize;
            if stride <= row {
                return nv12_to_jpeg(w, h, data, q, jpeg);
            }
            packed.clear();
            let (luma, chroma) = data.split_at((stride * rows).min(data.len()));
            if !(pack_rows(luma, stride, row, rows, packed)
                && pack_rows(chroma, stride, row, rows / 2, packed))
            {
                return Err(short("NV12", stride * rows * 3 / 2));
            }
            nv12_to_jpeg(w, h, packed, q, jpeg)
        }
        PixelFormat::Mjpg => {
            jpeg.clear();
            jpeg.extend_from_slice(data);
            Ok(())
        }
        PixelFormat::H264 => Err(short("H264 (passed through, not encoded)", 0)),
    }
}

/// A raw frame (YUYV, NV12/NV12M; rows packed from the driver's stride) as I420 planes in `out`,
/// for the H.264 encoder. MJPEG is refused: rigd does not decode to re-encode.
pub fn raw_to_i420(
    neg: &Negotiated,
    data: &[u8],
    packed: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(), crate::camera::EncodeError> {
    let (w, h) = (neg.width as usize, neg.height as usize);
    if w == 0 || h == 0 || w % 2 != 0 || h % 2 != 0 {
        return Err(crate::camera::EncodeError::BadSize {
            width: neg.width,
            height: neg.height,
        });
    }
    let stride = neg.stride as usize;
    let short = |format, need| crate::camera::EncodeError::ShortBuffer {
        format,
        width: neg.width,
        height: neg.height,
        need,
        have: data.len(),
    };
    match neg.format {
        PixelFormat::Yuyv => {
            let row = w * 2;
            let frame = if stride <= row {
                data
            } else {
                packed.clear();
                if !pack_rows(data, stride, row, h, packed) {
                    return Err(short("YUYV", stride * h));
                }
                &packed[..]
            };
            if frame.len() < row * h {
                return Err(short("YUYV", row * h));
            }
            crate::camera::yuyv_to_i420(w, h, frame, out);
            Ok(())
        }
        PixelFormat::Nv12 | PixelFormat::Nv12m => {
            let frame = if stride <= w {
                data
            } else {
                packed.clear();
                let (luma, chroma) = data.split_at((stride * h).min(data.len()));
                if !(pack_rows(luma, stride, w, h, packed)
                    && pack_rows(chroma, stride, w, h / 2, packed))
                {
                    return Err(short("NV12", stride * h * 3 / 2));
                }
                &packed[..]
            };
            if frame.len() < w * h * 3 / 2 {
                return Err(short("NV12", w * h * 3 / 2));
            }
            crate::camera::nv12_to_i420(w, h, frame, out);
            Ok(())
        }
        PixelFormat::Mjpg => Err(short("MJPG (not re-encoded to H.264)", 0)),
        PixelFormat::H264 => Err(short("H264 (passed through, not re-encoded)", 0)),
    }
}

/// How long without a buffer before the device counts as gone (a camera slower than 2.5 fps gets
/// 5 of its frame intervals instead).
pub const STALL: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(feature = "v4l")]
pub use device::CameraSource;

#[cfg(not(feature = "v4l"))]
pub use unavailable::CameraSource;

#[cfg(feature = "v4l")]
mod device {
    use bytes::Bytes;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use v4l::buffer::{Flags, Type};
    use v4l::capability::Flags as Caps;
    use v4l::io::traits::CaptureStream;
    use v4l::prelude::{Device, MmapStream};
    use v4l::video::capture::Parameters;
    use v4l::video::Capture;
    use v4l::{Format, FourCC, Fraction};

    use super::{
        choose_formats, encode_raw, interval_for, CameraCounts, CameraSettings, KeyframePlacement,
        Negotiated, PixelFormat, SeqStep, SequenceTracker, STALL,
    };
    use crate::annexb::{Access, Passthrough, Verdict};
    use crate::camera::mjpeg_frame;
    use crate::{FrameClock, FrameSink, Media, SourceError, Stamp, StopFlag};

    /// How long a dequeue waits before the loop checks the stop flag.
    const POLL: Duration = Duration::from_millis(100);

    /// What became of an H.264 camera's buffer.
    enum Passed {
        Frame(Bytes, bool),
        /// Parameter sets, SEI, a re-read: nothing to emit, nothing lost.
        NotAFrame,
        Dropped,
    }

    /// A V4L2 capture device.
    pub struct CameraSource {
        id: String,
        settings: CameraSettings,
        clock: Arc<dyn FrameClock>,
        counts: CameraCounts,
        negotiated: Option<Negotiated>,
        /// The path the device was last found at (a card name resolves to one).
        path: String,
        jpeg: Vec<u8>,
        packed: Vec<u8>,
        /// `codec = "h264"`: the frame as I420, the encoder (opened at the first frame) and the
        /// groups its keyframes open.
        i420: Vec<u8>,
        #[cfg(feature = "h264")]
        h264: Option<Box<dyn crate::h264::VideoEncoder>>,
        groups: crate::h264::Groups,
        /// Config `encoder`, resolved at the first frame (both streams use it) and again after
        /// an encoder device failed (the camera then fails, to be retried).
        encoder: crate::encoder::EncoderChoice,
        chosen: Option<crate::encoder::Chosen>,
        /// `codec = "h264"` from raw frames with `proxy`: the second, small stream of each
        /// encoded picture (`crate::proxy`), fed into the sink's proxy.
        proxy: Option<crate::proxy::Proxy>,
        /// H.264 passthrough: the stream's parameter sets and decodability, the last buffer (to
        /// tell a re-read from a new access unit), where keyframes fall against the groups.
        annexb: Passthrough,
        last_h264: Option<Bytes>,
        placement: KeyframePlacement,
        last_group_warning: Option<Instant>,
        last_drop_log: Option<Instant>,
        logged: CameraCounts,
        /// The stream whose first sequence number `counts` holds.
        stream_of_first: u64,
    }

    impl CameraSource {
        pub fn new(id: &str, settings: CameraSettings, clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                path: settings.device.clone(),
                settings,
                clock,
                counts: CameraCounts::default(),
                negotiated: None,
                jpeg: Vec::new(),
                packed: Vec::new(),
                i420: Vec::new(),
                #[cfg(feature = "h264")]
                h264: None,
                groups: crate::h264::Groups::default(),
                encoder: crate::encoder::EncoderChoice::default(),
                chosen: None,
                proxy: None,
                annexb: Passthrough::new(),
                last_h264: None,
                placement: KeyframePlacement::new(),
                last_group_warning: None,
                last_drop_log: None,
                logged: CameraCounts::default(),
                stream_of_first: 0,
            }
        }

        /// Raw frames encoded to H.264 get a proxy as well (config `proxy`; docs/DRIVERS.md
        /// "Proxy"): made from the I420 picture the camera's own encoder took.
        pub fn with_proxy(mut self, proxy: Option<crate::proxy::ProxySettings>) -> Self {
            self.proxy = proxy.map(crate::proxy::Proxy::new);
            self
        }

        /// Raw frames encoded to H.264, and their proxy, on this encoder (config `encoder`;
        /// docs/DRIVERS.md "Encoder choice").
        pub fn with_encoder(mut self, encoder: crate::encoder::EncoderChoice) -> Self {
            self.encoder = encoder;
            self
        }

        /// Counters since creation (frames, drops by cause, the driver's last sequence number).
        pub fn counts(&self) -> CameraCounts {
            self.counts
        }

        /// What the driver agreed to at the last open.
        pub fn negotiated(&self) -> Option<Negotiated> {
            self.negotiated
        }

        fn device_error(&self, message: String, retryable: bool) -> SourceError {
            let device = if self.path == self.settings.device {
                self.path.clone()
            } else {
                format!("{} ({})", self.settings.device, self.path)
            };
            SourceError::Device {
                source_id: self.id.clone(),
                device,
                message,
                retryable,
            }
        }

        /// Opens the device; `true` with it when it captures through the multi-planar API only.
        fn open(&mut self) -> Result<(Device, bool), SourceError> {
            let wanted = self.settings.device.clone();
            let dev = if wanted.starts_with('/') {
                self.path = wanted.clone();
                // Missing (unplugged), busy or not yet permitted (udev) may all change.
                Device::with_path(&wanted)
                    .map_err(|e| self.device_error(format!("cannot open: {e}"), true))?
            } else {
                let (path, dev) = find_card(&wanted).ok_or_else(|| {
                    self.device_error("no V4L2 capture device with this card name".into(), true)
                })?;
                self.path = path;
                dev
            };
            let caps = dev
                .query_caps()
                .map_err(|e| self.device_error(format!("VIDIOC_QUERYCAP: {e}"), true))?;
            let c = caps.capabilities;
            let single = c.contains(Caps::VIDEO_CAPTURE | Caps::STREAMING);
            let multi = c.contains(Caps::VIDEO_CAPTURE_MPLANE | Caps::STREAMING);
            if !single && !multi {
                return Err(self.device_error(
                    format!(
                        "`{}` ({}) is not a streaming video capture device",
                        caps.card, caps.driver
                    ),
                    false,
                ));
            }
            Ok((dev, !single))
        }

        /// Format negotiation through the multi-planar API (same rules as [`Self::negotiate`]).
        fn negotiate_mplane(&self, dev: &Device) -> Result<(Negotiated, usize), SourceError> {
            let s = &self.settings;
            let fd = dev.handle().fd();
            let offered = crate::v4l_mplane::formats(fd).map_err(|e| {
                self.device_error(format!("VIDIOC_ENUM_FMT (multi-planar): {e}"), true)
            })?;
            let mut answered = Vec::new();
            for want in choose_formats(&s.wanted_formats(), &offered) {
                let got = crate::v4l_mplane::set_format(fd, s.width, s.height, want.fourcc())
                    .map_err(|e| {
                        self.device_error(format!("VIDIOC_S_FMT (multi-planar): {e}"), true)
                    })?;
                let planes_ok = match want {
                    PixelFormat::Nv12m => got.num_planes == 2,
                    _ => got.num_planes == 1,
                };
                if got.fourcc != want.fourcc() || !planes_ok {
                    answered.push(format!(
                        "{} in {} planes for {}",
                        String::from_utf8_lossy(&got.fourcc),
                        got.num_planes,
                        want.as_str()
                    ));
                    continue;
                }
                let (num, den) = interval_for(s.fps);
                let fps = crate::v4l_mplane::set_interval(fd, num, den);
                let neg = Negotiated {
                    format: want,
                    width: got.width,
                    height: got.height,
                    stride: got.stride,
                    fps,
                    buffers: 0,
                };
                return Ok((neg, got.num_planes));
            }
            Err(self.no_format(&offered, &answered, " for multi-planar capture"))
        }

        /// None of the configured formats is offered: what was wanted, offered and answered.
        fn no_format(&self, offered: &[[u8; 4]], answered: &[String], api: &str) -> SourceError {
            let offered: Vec<String> = offered
                .iter()
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect();
            let wanted: Vec<&str> = self.settings.formats.iter().map(|f| f.as_str()).collect();
            let answered = if answered.is_empty() {
                String::new()
            } else {
                format!("; it answered {}", answered.join(", "))
            };
            self.device_error(
                format!(
                    "none of the formats [{}] is offered{api} (the device offers [{}]{answered})",
                    wanted.join(", "),
                    offered.join(", "),
                ),
                false,
            )
        }

        fn announce(&mut self, neg: &Negotiated, sink: &mut FrameSink, api: &str) {
            let s = &self.settings;
            if (neg.width, neg.height) != (s.width, s.height)
                || neg.fps.is_some_and(|f| (f - s.fps).abs() > 0.01)
            {
                tracing::info!(source = %self.id, asked_width = s.width, asked_height = s.height,
                    asked_fps = s.fps, "camera: the driver adjusted the request");
            }
            tracing::info!(source = %self.id, device = %self.path, format = neg.format.as_str(),
                width = neg.width, height = neg.height, fps = ?neg.fps, buffers = neg.buffers,
                api, "camera: streaming");
            sink.health().set_detail(&neg.to_string());
            self.counts.streams += 1;
            // A new stream: an H.264 camera starts again at a keyframe with its parameter sets.
            self.annexb.reset();
            self.last_h264 = None;
            self.placement.reset();
        }

        /// The streaming loop of a multi-planar device.
        fn run_mplane(
            &mut self,
            dev: Device,
            sink: &mut FrameSink,
            stop: &StopFlag,
        ) -> Result<(), SourceError> {
            let (mut neg, num_planes) = self.negotiate_mplane(&dev)?;
            let fd = dev.handle().fd();
            let mut stream =
                crate::v4l_mplane::MplaneStream::new(fd, self.settings.buffers, num_planes)
                    .map_err(|e| self.device_error(format!("cannot map buffers: {e}"), true))?;
            neg.buffers = stream.count();
            self.negotiated = Some(neg);
            self.announce(&neg, sink, "multi-planar");
            // NV12M frames are joined into NV12 for the encoder.
            let mut as_nv12 = neg;
            if neg.format == PixelFormat::Nv12m {
                as_nv12.format = PixelFormat::Nv12;
            }
            let mut joined = Vec::new();
            let mut tracker = SequenceTracker::new();
            let mut last_buffer = Instant::now();
            let stall = match neg.fps {
                Some(f) if f > 0.0 => STALL.max(Duration::from_secs_f64(5.0 / f)),
                _ => STALL,
            };
            let result = loop {
                if stop.is_raised() {
                    break Ok(());
                }
                let mut pfd = [libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }];
                // SAFETY: one pollfd that lives for the call.
                #[allow(unsafe_code)]
                let r = unsafe { libc::poll(pfd.as_mut_ptr(), 1, POLL.as_millis() as i32) };
                if r < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    break Err(self.device_error(format!("poll failed: {e}"), true));
                }
                if r == 0 {
                    if last_buffer.elapsed() >= stall {
                        break Err(self.device_error(
                            format!("no buffer for {:.1} s", stall.as_secs_f64()),
                            true,
                        ));
                    }
                    continue;
                }
                let (index, result) = match stream.dequeue() {
                    Ok(d) => {
                        last_buffer = Instant::now();
                        let meta = d.meta;
                        let r = if neg.format == PixelFormat::Nv12m {
                            joined.clear();
                            for p in &d.planes {
                                joined.extend_from_slice(p);
                            }
                            self.frame(&as_nv12, &joined, &meta, &mut tracker, sink)
                        } else {
                            let data = d.planes.first().copied().unwrap_or(&[]);
                            self.frame(&as_nv12, data, &meta, &mut tracker, sink)
                        };
                        (d.index, r)
                    }
                    // ENODEV/EIO (unplugged, vivid's disconnect), EPIPE: reopen with backoff.
                    Err(e) => break Err(self.device_error(format!("capture failed: {e}"), true)),
                };
                if let Err(e) = result {
                    break Err(e);
                }
                if let Err(e) = stream.queue(index) {
                    break Err(self.device_error(format!("VIDIOC_QBUF: {e}"), true));
                }
            };
            drop(stream);
            drop(dev);
            result
        }

        fn negotiate(&self, dev: &Device) -> Result<Negotiated, SourceError> {
            let s = &self.settings;
            let offered: Vec<[u8; 4]> = dev
                .enum_formats()
                .map_err(|e| self.device_error(format!("VIDIOC_ENUM_FMT: {e}"), true))?
                .iter()
                .map(|d| d.fourcc.repr)
                .collect();
            let mut answered = Vec::new();
            for want in choose_formats(&s.wanted_formats(), &offered) {
                let asked = Format::new(s.width, s.height, FourCC::new(&want.fourcc()));
                let got = dev
                    .set_format(&asked)
                    .map_err(|e| self.device_error(format!("VIDIOC_S_FMT: {e}"), true))?;
                if got.fourcc.repr != want.fourcc() {
                    // The driver answered another format instead of refusing (vivid does this
                    // for formats it lists only for other inputs): try the next preference.
                    answered.push(format!("{} for {}", got.fourcc, want.as_str()));
                    continue;
                }
                let (num, den) = interval_for(s.fps);
                let fps = dev
                    .set_params(&Parameters::new(Fraction::new(num, den)))
                    .ok()
                    .map(|p| p.interval)
                    .filter(|i| i.numerator > 0 && i.denominator > 0)
                    .map(|i| i.denominator as f64 / i.numerator as f64);
                return Ok(Negotiated {
                    format: want,
                    width: got.width,
                    height: got.height,
                    stride: got.stride,
                    fps,
                    buffers: 0,
                });
            }
            Err(self.no_format(&offered, &answered, ""))
        }

        /// One dequeued buffer: checks, stamps, encodes or passes it through, emits it.
        fn frame(
            &mut self,
            neg: &Negotiated,
            data: &[u8],
            meta: &v4l::buffer::Metadata,
            tracker: &mut SequenceTracker,
            sink: &mut FrameSink,
        ) -> Result<(), SourceError> {
            let step = tracker.observe(meta.sequence);
            let lost = match step {
                SeqStep::Lost(n) => n,
                SeqStep::Repeat => {
                    self.counts.repeated += 1;
                    0
                }
                SeqStep::Restart => {
                    self.counts.restarted += 1;
                    0
                }
                SeqStep::Next => 0,
            };
            if self.counts.streams != self.stream_of_first {
                self.stream_of_first = self.counts.streams;
                self.counts.first_sequence = Some(meta.sequence);
            }
            self.counts.last_sequence = Some(meta.sequence);
            self.counts.lost += lost;
            let mut drops = lost;
            if lost > 0 {
                // The lost buffer may have been a frame the next P-frames need.
                self.annexb.lost();
            }
            let used = (meta.bytesused as usize).min(data.len());
            let stamp = self.stamp(meta);
            // Some(keyframe) for an H.264 frame.
            let mut keyframe = None;
            // A buffer that is no frame and no loss (H.264 parameter sets, a re-read).
            let mut not_a_frame = false;
            let payload = if meta.flags.contains(Flags::ERROR) || used == 0 {
                self.counts.errored += 1;
                self.annexb.lost();
                None
            } else {
                match neg.format {
                    PixelFormat::H264 => {
                        match self.pass_h264(&data[..used], step == SeqStep::Repeat) {
                            Passed::Frame(au, key) => {
                                keyframe = Some(key);
                                Some(au)
                            }
                            Passed::NotAFrame => {
                                not_a_frame = true;
                                None
                            }
                            Passed::Dropped => None,
                        }
                    }
                    PixelFormat::Mjpg => match mjpeg_frame(&data[..used]) {
                        Some(jpeg) => Some(Bytes::copy_from_slice(jpeg)),
                        None => {
                            self.counts.rejected += 1;
                            None
                        }
                    },
                    PixelFormat::Yuyv | PixelFormat::Nv12 | PixelFormat::Nv12m
                        if self.settings.video.is_some() =>
                    {
                        let t = Instant::now();
                        let encoded = self.encode_h264(neg, &data[..used], stamp.ns);
                        self.counts.encode_ns += t.elapsed().as_nanos() as u64;
                        match encoded {
                            Ok((au, key)) => {
                                keyframe = Some(key);
                                Some(Bytes::from(au))
                            }
                            Err(e @ crate::h264::H264Error::Device(_)) => {
                                // The encoder's device failed: the camera fails, to be retried.
                                self.encoder_gone();
                                sink.health().add_drops(1);
                                return Err(self.device_error(format!("encoder: {e}"), true));
                            }
                            Err(e) => {
                                self.groups.lost();
                                self.counts.encode_failed += 1;
                                tracing::debug!(source = %self.id, error = %e, "camera: frame not encodable to H.264");
                                None
                            }
                        }
                    }
                    PixelFormat::Yuyv | PixelFormat::Nv12 | PixelFormat::Nv12m => {
                        let t = Instant::now();
                        let encoded = self.encode(neg, &data[..used]);
                        self.counts.encode_ns += t.elapsed().as_nanos() as u64;
                        match encoded {
                            Ok(()) => Some(Bytes::copy_from_slice(&self.jpeg)),
                            Err(e) => {
                                self.counts.encode_failed += 1;
                                tracing::debug!(source = %self.id, error = %e, "camera: frame not encodable");
                                None
                            }
                        }
                    }
                }
            };
            if payload.is_none() && !not_a_frame {
                drops += 1;
            }
            if drops > 0 {
                sink.health().add_drops(drops);
                self.log_drops();
            }
            if let Some(payload) = payload {
                let media = match keyframe {
                    Some(keyframe) => Media::Camera {
                        width: neg.width,
                        height: neg.height,
                        codec: crate::Codec::H264,
                        keyframe,
                    },
                    None => Media::jpeg(neg.width, neg.height),
                };
                if let (PixelFormat::H264, Some(key)) = (neg.format, keyframe) {
                    self.place(stamp.ns, key);
                }
                sink.emit(stamp, media, payload)
                    .map_err(|_| SourceError::PipelineClosed {
                        source_id: self.id.clone(),
                    })?;
                self.counts.frames += 1;
                // An encoded raw frame: its proxy from the same picture and stamp, after it.
                if neg.format != PixelFormat::H264 && keyframe.is_some() {
                    #[cfg(feature = "h264")]
                    if let (Some(true), Some(enc)) = (keyframe, self.h264.as_ref()) {
                        // Once a group: the encoder (a device's copies so far).
                        sink.health()
                            .set_detail(&format!("{neg}, encoder {}", enc.describe()));
                    }
                    if let (Some(proxy), Some(proxy_sink)) = (self.proxy.as_mut(), sink.proxy_mut())
                    {
                        let (w, h) = (neg.width as usize, neg.height as usize);
                        let planes = crate::scale::planes(&self.i420, w, h);
                        if let Err(e) = proxy.feed(proxy_sink, stamp, w, h, planes) {
                            if matches!(e, crate::proxy::ProxyStop::Device(_)) {
                                self.encoder_gone();
                            }
                            return Err(e.into_source_error(&self.id));
                        }
                    }
                }
            }
            Ok(())
        }

        /// One buffer of an H.264 camera, by the rules of [`crate::annexb`].
        fn pass_h264(&mut self, buf: &[u8], repeated: bool) -> Passed {
            if repeated && self.last_h264.as_deref() == Some(buf) {
                // The driver handed the same buffer over again (a loopback's re-read): an access
                // unit decoded twice would corrupt the pictures after it.
                self.counts.reread += 1;
                return Passed::NotAFrame;
            }
            let raw = Bytes::copy_from_slice(buf);
            let verdict = self.annexb.accept(&raw);
            self.last_h264 = Some(raw.clone());
            match verdict {
                Verdict::Frame { keyframe, access } => {
                    let au = match access {
                        Access::Untouched => raw,
                        Access::WithParameterSets(with) => {
                            self.counts.parameter_sets_inserted += 1;
                            Bytes::from(with)
                        }
                    };
                    if keyframe {
                        self.counts.keyframes += 1;
                    }
                    Passed::Frame(au, keyframe)
                }
                Verdict::HeadersOnly => {
                    self.counts.headers_only += 1;
                    Passed::NotAFrame
                }
                Verdict::Rejected(why) => {
                    self.counts.rejected += 1;
                    tracing::debug!(source = %self.id, %why, bytes = buf.len(), "camera: H.264 buffer rejected");
                    Passed::Dropped
                }
                Verdict::Undecodable(why) => {
                    self.counts.undecodable += 1;
                    tracing::debug!(source = %self.id, ?why, "camera: H.264 picture not decodable from here, dropped");
                    Passed::Dropped
                }
            }
        }

        /// Where a passthrough keyframe fell against the rig's groups: counted, and a warning
        /// (at most one a minute) when a group opens on a P-frame.
        fn place(&mut self, capture_ns: i64, keyframe: bool) {
            let Some(video) = self.settings.video else {
                return;
            };
            let p = self
                .placement
                .observe(capture_ns, keyframe, video.gop, video.bucket_ms);
            if p.opens_group {
                self.counts.groups += 1;
            }
            if p.needs_earlier_group {
                self.counts.frames_before_group_keyframe += 1;
            }
            self.counts.keyframe_interval_ns = self.placement.keyframe_interval_ns();
            if !(p.opens_group && p.needs_earlier_group) {
                return;
            }
            self.counts.groups_without_keyframe += 1;
            let due = self
                .last_group_warning
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
            if due {
                self.last_group_warning = Some(Instant::now());
                let group_ms = u64::from(video.gop) * u64::from(video.bucket_ms);
                let camera_ms = self.counts.keyframe_interval_ns.map(|ns| ns / 1_000_000);
                tracing::warn!(source = %self.id, device = %self.path, group_ms, camera_keyframe_interval_ms = ?camera_ms,
                    groups = self.counts.groups, groups_without_keyframe = self.counts.groups_without_keyframe,
                    "camera: a group opens on a P-frame (the camera places its own keyframes): a consumer of that group's key alone decodes it from the group's first keyframe on (a camera keyframe interval shorter than the group leaves fewer frames before it); a consumer reading the topic in order decodes all");
            }
        }

        fn stamp(&mut self, meta: &v4l::buffer::Metadata) -> Stamp {
            let kind = meta.flags & Flags::TIMESTAMP_MASK;
            let ts = meta.timestamp;
            if kind == Flags::TIMESTAMP_MONOTONIC && (ts.sec != 0 || ts.usec != 0) {
                self.counts.kernel_stamps += 1;
                let mono = Duration::from(ts).as_nanos() as i64;
                self.clock.map_monotonic(mono)
            } else {
                // Unknown or copied (an output device's writer's) timestamps: dequeue time.
                self.clock.now()
            }
        }

        fn encode(
            &mut self,
            neg: &Negotiated,
            data: &[u8],
        ) -> Result<(), crate::camera::EncodeError> {
            let q = self.settings.jpeg_quality;
            encode_raw(neg, data, q, &mut self.packed, &mut self.jpeg)
        }

        /// An encoder device failed: both streams' encoder is chosen and opened afresh when the
        /// camera is retried (`auto` looks again).
        fn encoder_gone(&mut self) {
            #[cfg(feature = "h264")]
            {
                self.h264 = None;
            }
            self.chosen = None;
        }

        /// A raw frame as an H.264 access unit, a keyframe when it opens its group.
        #[cfg(feature = "h264")]
        fn encode_h264(
            &mut self,
            neg: &Negotiated,
            data: &[u8],
            capture_ns: i64,
        ) -> Result<(Vec<u8>, bool), crate::h264::H264Error> {
            use crate::h264::H264Error;
            let Some(video) = self.settings.video else {
                return Err(H264Error::Encoder("no video settings".into()));
            };
            super::raw_to_i420(neg, data, &mut self.packed, &mut self.i420)
                .map_err(|e| H264Error::Encoder(e.to_string()))?;
            let (w, h) = (neg.width as usize, neg.height as usize);
            if self.h264.is_none() {
                let chosen = match &self.chosen {
                    Some(c) => c.clone(),
                    None => {
                        let c = self.encoder.resolve();
                        // The proxy on the same encoder as the camera's own stream.
                        self.proxy = self
                            .proxy
                            .take()
                            .map(|p| crate::proxy::Proxy::chosen(p.settings(), c.clone()));
                        self.chosen = Some(c.clone());
                        c
                    }
                };
                self.h264 = Some(chosen.open(video.encoder, w, h, video.gop)?);
            }
            let encoder = self.h264.as_mut().expect("opened above");
            let (_, key) = self.groups.next(capture_ns, video.gop, video.bucket_ms);
            let (y, chroma) = self.i420.split_at(w * h);
            let (u, v) = chroma.split_at(w * h / 4);
            let au = encoder.encode(w, h, (y, u, v), key)?;
            Ok((au.data, au.keyframe))
        }

        #[cfg(not(feature = "h264"))]
        fn encode_h264(
            &mut self,
            _neg: &Negotiated,
            _data: &[u8],
            _capture_ns: i64,
        ) -> Result<(Vec<u8>, bool), crate::h264::H264Error> {
            let _ = (&self.i420, &self.groups, &self.encoder, &self.chosen);
            Err(crate::h264::H264Error::Encoder(
                "rigd was built without the `h264` feature".into(),
            ))
        }

        fn log_drops(&mut self) {
            let due = self
                .last_drop_log
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
            if due {
                let (c, l) = (self.counts, self.logged);
                tracing::warn!(source = %self.id, device = %self.path,
                    lost = c.lost - l.lost, rejected = c.rejected - l.rejected,
                    errored = c.errored - l.errored, encode_failed = c.encode_failed - l.encode_failed,
                    "camera: frames dropped");
                self.logged = c;
                self.last_drop_log = Some(Instant::now());
            }
        }
    }

    /// The first `/dev/video*` whose card name is `card` and that can capture.
    fn find_card(card: &str) -> Option<(String, Device)> {
        let mut paths: Vec<_> = std::fs::read_dir("/dev")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("video"))
            })
            .collect();
        // video2 before video10.
        paths.sort_by_key(|p| {
            let n = p.to_string_lossy();
            (n.len(), n.into_owned())
        });
        paths.into_iter().find_map(|p| {
            let dev = Device::with_path(&p).ok()?;
            let caps = dev.query_caps().ok()?;
            (caps.card == card
                && caps
                    .capabilities
                    .intersects(Caps::VIDEO_CAPTURE | Caps::VIDEO_CAPTURE_MPLANE))
            .then(|| (p.to_string_lossy().into_owned(), dev))
        })
    }

    impl crate::Source for CameraSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
            let (dev, multi_planar) = self.open()?;
            if multi_planar {
                return self.run_mplane(dev, sink, stop);
            }
            let mut neg = self.negotiate(&dev)?;
            let mut stream =
                MmapStream::with_buffers(&dev, Type::VideoCapture, self.settings.buffers)
                    .map_err(|e| self.device_error(format!("cannot map buffers: {e}"), true))?;
            neg.buffers = granted_buffers(&dev).unwrap_or(self.settings.buffers);
            self.negotiated = Some(neg);
            self.announce(&neg, sink, "single-planar");

            let mut tracker = SequenceTracker::new();
            let mut last_buffer = Instant::now();
            let stall = match neg.fps {
                Some(f) if f > 0.0 => STALL.max(Duration::from_secs_f64(5.0 / f)),
                _ => STALL,
            };
            // The v4l crate's `next()` re-queues the buffer it handed out last before it waits;
            // after a wait that timed out it would queue that buffer twice (EINVAL). So the loop
            // waits itself, and calls `next()` only once a buffer is ready (or to start).
            stream.set_timeout(stall);
            let handle = stream.handle();
            let readable = rustix::event::PollFlags::IN.bits() as i16;
            let mut started = false;
            let result = loop {
                if stop.is_raised() {
                    break Ok(());
                }
                if started {
                    match handle.poll(readable, POLL.as_millis() as i32) {
                        Ok(0) if last_buffer.elapsed() >= stall => {
                            break Err(self.device_error(
                                format!("no buffer for {:.1} s", stall.as_secs_f64()),
                                true,
                            ))
                        }
                        Ok(0) => continue,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => break Err(self.device_error(format!("poll failed: {e}"), true)),
                    }
                }
                started = true;
                match stream.next() {
                    Ok((data, meta)) => {
                        last_buffer = Instant::now();
                        let meta = *meta;
                        if let Err(e) = self.frame(&neg, data, &meta, &mut tracker, sink) {
                            break Err(e);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                        break Err(self.device_error(
                            format!("no buffer for {:.1} s", stall.as_secs_f64()),
                            true,
                        ))
                    }
                    // ENODEV/EIO (unplugged, vivid's disconnect), EPIPE: reopen with backoff.
                    Err(e) => break Err(self.device_error(format!("capture failed: {e}"), true)),
                }
            };
            // The v4l crate panics in drop when STREAMOFF or unmapping fails with anything but
            // ENODEV; a vanished device must not take the capture thread down with it.
            let teardown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                drop(stream);
                drop(dev);
            }));
            if teardown.is_err() {
                tracing::warn!(source = %self.id, device = %self.path, "camera: stream teardown failed");
            }
            result
        }
    }

    /// How many buffers the driver granted: REQBUFS may change the count, and the v4l crate keeps
    /// its own copy private, so ask VIDIOC_QUERYBUF index by index until the driver says EINVAL.
    #[allow(unsafe_code)]
    fn granted_buffers(dev: &Device) -> Option<u32> {
        let fd = dev.handle().fd();
        let mut n = 0u32;
        while n < 256 {
            // SAFETY: v4l2_buffer is a plain C struct for which all-zero bytes are valid; the
            // ioctl reads and writes only that struct, which lives for the whole call, and `fd`
            // is owned by `dev`, which outlives the call.
            let ok = unsafe {
                let mut buf: v4l::v4l_sys::v4l2_buffer = std::mem::zeroed();
                buf.index = n;
                buf.type_ = Type::VideoCapture as u32;
                buf.memory = v4l::memory::Memory::Mmap as u32;
                v4l::v4l2::ioctl(
                    fd,
                    v4l::v4l2::vidioc::VIDIOC_QUERYBUF,
                    &mut buf as *mut _ as *mut std::os::raw::c_void,
                )
                .is_ok()
            };
            if !ok {
                break;
            }
            n += 1;
        }
        (n > 0).then_some(n)
    }
}

#[cfg(not(feature = "v4l"))]
mod unavailable {
    use std::sync::Arc;

    use super::{CameraCounts, CameraSettings, Negotiated};
    use crate::{FrameClock, FrameSink, Source, SourceError, StopFlag};

    /// Stand-in when rigd-drivers is built without the `v4l` feature: fails for good.
    pub struct CameraSource {
        id: String,
        device: String,
    }

    impl CameraSource {
        pub fn new(id: &str, settings: CameraSettings, _clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                device: settings.device,
            }
        }

        pub fn with_proxy(self, _proxy: Option<crate::proxy::ProxySettings>) -> Self {
            self
        }

        pub fn with_encoder(self, _encoder: crate::encoder::EncoderChoice) -> Self {
            self
        }

        pub fn counts(&self) -> CameraCounts {
            CameraCounts::default()
        }

        pub fn negotiated(&self) -> Option<Negotiated> {
            None
        }
    }

    impl Source for CameraSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, _sink: &mut FrameSink, _stop: &StopFlag) -> Result<(), SourceError> {
            Err(SourceError::not_built(&self.id, &self.device, "v4l"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_gaps_are_lost_frames() {
        let mut t = SequenceTracker::new();
        assert_eq!(
            t.observe(7),
            SeqStep::Next,
            "the first buffer sets the baseline"
        );
        assert_eq!(t.observe(8), SeqStep::Next);
        assert_eq!(t.observe(11), SeqStep::Lost(2));
        assert_eq!(t.observe(11), SeqStep::Repeat);
        assert_eq!(t.observe(12), SeqStep::Next);
        t.reset();
        assert_eq!(
            t.observe(0),
            SeqStep::Next,
            "a new stream numbers from 0 again"
        );
    }

    #[test]
    fn sequence_wraps_and_restarts() {
        let mut t = SequenceTracker::new();
        t.observe(u32::MAX - 1);
        assert_eq!(t.observe(u32::MAX), SeqStep::Next);
        assert_eq!(
            t.observe(1),
            SeqStep::Lost(1),
            "0 was skipped across the wrap"
        );
        assert_eq!(
            t.observe(0),
            SeqStep::Restart,
            "backwards: a restarted count, not 4 billion drops"
        );
        assert_eq!(t.observe(1), SeqStep::Next);
    }

    #[test]
    fn rows_with_padding_are_packed() {
        // 2 rows of 4 bytes, stride 6.
        let data = [1, 2, 3, 4, 0, 0, 5, 6, 7, 8];
        let mut out = Vec::new();
        assert!(pack_rows(&data, 6, 4, 2, &mut out));
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(!pack_rows(&data[..9], 6, 4, 2, &mut Vec::new()), "short");
    }

    #[test]
    fn raw_frames_become_i420_for_h264_padded_or_not() {
        let (w, h) = (16u32, 16u32);
        let tight: Vec<u8> = (0..w * h * 2).map(|i| (i * 7 % 251) as u8).collect();
        let stride = w as usize * 2 + 12;
        let mut padded = Vec::new();
        for row in tight.chunks(w as usize * 2) {
            padded.extend_from_slice(row);
            padded.extend_from_slice(&[0xEE; 12]);
        }
        let mut neg = Negotiated {
            format: PixelFormat::Yuyv,
            width: w,
            height: h,
            stride: w * 2,
            fps: None,
            buffers: 4,
        };
        let (mut packed, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        raw_to_i420(&neg, &tight, &mut packed, &mut a).unwrap();
        assert_eq!(a.len(), (w * h * 3 / 2) as usize);
        let luma: Vec<u8> = tight.iter().step_by(2).copied().collect();
        assert_eq!(&a[..(w * h) as usize], &luma[..]);
        neg.stride = stride as u32;
        raw_to_i420(&neg, &padded, &mut packed, &mut b).unwrap();
        assert_eq!(a, b, "the padding does not reach the planes");
        assert!(raw_to_i420(&neg, &padded[..stride * 3], &mut packed, &mut b).is_err());
        neg.format = PixelFormat::Mjpg;
        assert!(raw_to_i420(&neg, &tight, &mut packed, &mut b).is_err());
        neg.format = PixelFormat::Nv12;
        neg.stride = w;
        let nv12: Vec<u8> = (0..w * h * 3 / 2).map(|i| (i % 200) as u8).collect();
        raw_to_i420(&neg, &nv12, &mut packed, &mut b).unwrap();
        assert_eq!(&b[..(w * h) as usize], &nv12[..(w * h) as usize]);
        #[cfg(feature = "h264")]
        {
            let mut enc = crate::h264::H264Encoder::new(crate::h264::H264Settings {
                bitrate: 100_000,
                rate_control: crate::h264::RateControl::Bitrate,
                fps: 30.0,
            })
            .unwrap();
            let n = (w * h) as usize;
            let au = enc
                .encode(16, 16, (&b[..n], &b[n..n + n / 4], &b[n + n / 4..]), true)
                .unwrap();
            assert!(au.keyframe);
        }
    }

    #[test]
    fn padded_rows_encode_like_packed_ones() {
        let (w, h) = (16u32, 8u32);
        let tight: Vec<u8> = (0..w * h * 2).map(|i| (i * 7 % 251) as u8).collect();
        let stride = w as usize * 2 + 12;
        let mut padded = Vec::new();
        for row in tight.chunks(w as usize * 2) {
            padded.extend_from_slice(row);
            padded.extend_from_slice(&[0xEE; 12]);
        }
        let mut neg = Negotiated {
            format: PixelFormat::Yuyv,
            width: w,
            height: h,
            stride: w * 2,
            fps: None,
            buffers: 4,
        };
        let (mut packed, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        encode_raw(&neg, &tight, 80, &mut packed, &mut a).unwrap();
        neg.stride = stride as u32;
        encode_raw(&neg, &padded, 80, &mut packed, &mut b).unwrap();
        assert_eq!(a, b, "the padding does not reach the JPEG");
        assert!(matches!(
            encode_raw(&neg, &padded[..stride * 3], 80, &mut packed, &mut b),
            Err(crate::camera::EncodeError::ShortBuffer { have, .. }) if have == stride * 3
        ));
        // NV12: both planes padded.
        let nv12: Vec<u8> = (0..w * h * 3 / 2).map(|i| (i % 200) as u8).collect();
        let mut nv12_padded = Vec::new();
        for row in nv12.chunks(w as usize) {
            nv12_padded.extend_from_slice(row);
            nv12_padded.extend_from_slice(&[0x11; 12]);
        }
        neg.format = PixelFormat::Nv12;
        neg.stride = w;
        encode_raw(&neg, &nv12, 80, &mut packed, &mut a).unwrap();
        neg.stride = w + 12;
        encode_raw(&neg, &nv12_padded, 80, &mut packed, &mut b).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn h264_is_negotiated_only_for_a_video_source() {
        assert_eq!(PixelFormat::from_fourcc(*b"H264"), Some(PixelFormat::H264));
        assert_eq!(PixelFormat::H264.as_str(), "H264");
        let mut s = CameraSettings {
            device: "/dev/video0".into(),
            width: 640,
            height: 360,
            fps: 30.0,
            formats: vec![PixelFormat::H264, PixelFormat::Yuyv],
            buffers: 4,
            jpeg_quality: 80,
            video: None,
        };
        assert_eq!(s.wanted_formats(), [PixelFormat::Yuyv], "a JPEG source");
        s.video = Some(crate::synthetic::VideoSettings {
            encoder: crate::h264::H264Settings {
                bitrate: 1_000_000,
                rate_control: crate::h264::RateControl::Bitrate,
                fps: 30.0,
            },
            gop: 30,
            bucket_ms: 33,
        });
        assert_eq!(s.wanted_formats(), [PixelFormat::H264, PixelFormat::Yuyv]);
        let neg = Negotiated {
            format: PixelFormat::H264,
            width: 640,
            height: 360,
            stride: 0,
            fps: None,
            buffers: 2,
        };
        let (mut packed, mut out) = (Vec::new(), Vec::new());
        assert!(raw_to_i420(&neg, &[0, 0, 1, 0x65], &mut packed, &mut out).is_err());
        assert!(encode_raw(&neg, &[0, 0, 1, 0x65], 80, &mut packed, &mut out).is_err());
    }

    #[test]
    fn a_passthrough_cameras_keyframes_are_placed_against_the_groups() {
        // Groups of 3 buckets of 10 ms (30 ms); the camera makes a keyframe every 4 frames of
        // 10 ms, starting at 5 ms: it cannot know where rigd's groups start.
        let mut p = KeyframePlacement::new();
        let ms = 1_000_000i64;
        let mut seen = Vec::new();
        for i in 0..12i64 {
            let key = i % 4 == 0;
            let at = (5 + 10 * i) * ms;
            let pl = p.observe(at, key, 3, 10);
            seen.push((pl.opens_group, pl.needs_earlier_group));
        }
        // Buckets 0..=11 (frame i at 5+10i ms), groups 0,3,6,9; keyframes at frames 0, 4, 8.
        assert_eq!(
            seen,
            [
                (true, false),  // 0: key, opens group 0
                (false, false), // 1
                (false, false), // 2
                (true, true),   // 3: P opens group 3: needs group 0
                (false, false), // 4: key
                (false, false), // 5
                (true, true),   // 6: P opens group 6
                (false, true),  // 7: still before group 6's keyframe
                (false, false), // 8: key
                (true, true),   // 9: P opens group 9
                (false, true),
                (false, true),
            ]
        );
        assert_eq!(p.keyframe_interval_ns(), Some(40 * ms));
        // A camera whose keyframes land on the groups' first frames: every group opens on one.
        let mut aligned = KeyframePlacement::new();
        for i in 0..12i64 {
            let pl = aligned.observe((1 + 10 * i) * ms, i % 3 == 0, 3, 10);
            assert!(!pl.needs_earlier_group, "frame {i}");
        }
        aligned.reset();
        assert_eq!(aligned.keyframe_interval_ns(), None);
    }

    #[test]
    fn fps_becomes_a_reduced_interval() {
        assert_eq!(interval_for(30.0), (1, 30));
        assert_eq!(interval_for(29.97), (100, 2997));
        assert_eq!(interval_for(7.5), (2, 15));
    }

    #[test]
    fn preference_order_wins_over_device_order() {
        let offered = [*b"YUYV", *b"NV12", *b"MJPG", *b"RGB3"];
        assert_eq!(
            choose_formats(&[PixelFormat::Mjpg, PixelFormat::Yuyv], &offered),
            [PixelFormat::Mjpg, PixelFormat::Yuyv]
        );
        assert_eq!(
            choose_formats(&[PixelFormat::Nv12, PixelFormat::Mjpg], &[*b"YUYV"]),
            []
        );
        assert_eq!(PixelFormat::from_fourcc(*b"NV12"), Some(PixelFormat::Nv12));
    }

    #[test]
    fn negotiated_reads_like_a_status_line() {
        let n = Negotiated {
            format: PixelFormat::Yuyv,
            width: 320,
            height: 180,
            stride: 640,
            fps: Some(25.0),
            buffers: 4,
        };
        assert_eq!(n.to_string(), "YUYV 320x180 @ 25.00 fps, 4 buffers");
    }

    /// H.264 passthrough cost per frame: the Annex B scan and rules plus the copy out of the mmap
    /// buffer, on OpenH264's 1080p access units of the textured pan (a keyframe every 30).
    /// `cargo test --release -p rigd-drivers --features h264 --lib -- --ignored --nocapture bench_h264_pass`
    #[cfg(feature = "h264")]
    #[test]
    #[ignore = "benchmark"]
    fn bench_h264_passthrough() {
        let (w, h) = (1920usize, 1080usize);
        let mut pan = crate::scene::Pan::new(w, h);
        let mut enc = crate::h264::H264Encoder::new(crate::h264::H264Settings {
            bitrate: 4_000_000,
            rate_control: crate::h264::RateControl::Bitrate,
            fps: 30.0,
        })
        .unwrap();
        let aus: Vec<Vec<u8>> = (0..30u64)
            .map(|n| enc.encode(w, h, pan.draw(n), n == 0).unwrap().data)
            .collect();
        let bytes: usize = aus.iter().map(Vec::len).sum();
        let rounds = 200;
        let mut s = crate::annexb::Passthrough::new();
        let t = std::time::Instant::now();
        let mut total = 0;
        for _ in 0..rounds {
            for au in &aus {
                let copy = bytes::Bytes::copy_from_slice(std::hint::black_box(au));
                if let crate::annexb::Verdict::Frame { .. } = s.accept(&copy) {
                    total += copy.len();
                }
            }
        }
        let per = t.elapsed().as_secs_f64() * 1e6 / (rounds * aus.len()) as f64;
        assert_eq!(total, bytes * rounds);
        println!(
            "h264 passthrough 1920x1080 (keyframe {} bytes, mean {} bytes): {per:.1} us/frame",
            aus[0].len(),
            bytes / aus.len()
        );
    }

    /// MJPEG passthrough cost per frame: the whole-JPEG check plus the copy out of the mmap buffer.
    /// `cargo test --release -p rigd-drivers --lib -- --ignored --nocapture bench_mjpeg`
    #[test]
    #[ignore = "benchmark"]
    fn bench_mjpeg_passthrough() {
        for (w, h) in [(640u16, 480u16), (1920, 1080)] {
            let mut state = 7u32;
            let grey: Vec<u8> = (0..w as usize * h as usize)
                .map(|i| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (i % 251) as u8 ^ (state >> 29) as u8
                })
                .collect();
            let jpeg = crate::camera::grey_to_jpeg(w, h, &grey, 80);
            // A driver buffer is larger than the JPEG; the tail is zero padding.
            let mut buf = jpeg.clone();
            buf.resize(jpeg.len() + 4096, 0);
            let n = 2000;
            let t = std::time::Instant::now();
            let mut total = 0;
            for _ in 0..n {
                let frame = crate::camera::mjpeg_frame(std::hint::black_box(&buf)).unwrap();
                total += bytes::Bytes::copy_from_slice(frame).len();
            }
            let per = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            assert_eq!(total, jpeg.len() * n);
            println!(
                "mjpeg passthrough {w}x{h} ({} bytes): {per:.1} us/frame",
                jpeg.len()
            );
        }
    }
}
