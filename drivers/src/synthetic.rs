//! Deterministic synthetic sources for demos and tests: a camera of JPEG frames, a tone as PCM
//! blocks aligned to buckets, and NMEA sentences. They emit exactly what the real drivers emit, so
//! everything downstream runs for real.
//!
//! Camera frames carry a JPEG comment `rigd-synthetic v1 crc32=<8 hex>` whose CRC-32 (zlib's)
//! covers every byte after that comment segment, so a consumer can check a frame arrived
//! byte-identical.
//!
//! The camera has two formats ([`CameraFormat`]): `mjpeg` hands over JPEGs (large ones rendered
//! once and cycled, as an MJPEG camera hands over encoded bytes), `yuyv` draws a raw YUYV 4:2:2
//! frame each time and encodes it with `camera::yuyv_to_jpeg`, the encoder a raw V4L2 camera's
//! frames go through, so that a benchmark measures the real encoder cost.
//!
//! With [`VideoSettings`] (config `codec = "h264"`) the camera films a textured, noisy pan
//! ([`crate::scene::Pan`]) and encodes every frame to H.264 ([`crate::h264`]), a keyframe on the
//! first frame of every group of `gop` buckets (and after a failed encode), so that a consumer
//! can start at any group.
//!
//! With a [`Clip`] as well (config `clip = FILE`), the camera encodes nothing: it hands over the
//! access units of an H.264 file in a loop, as a camera that delivers H.264 (V4L2 `H264`
//! passthrough) does, so that the rig's own cost of such a camera can be measured without one.

use bytes::Bytes;
use std::f64::consts::PI;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::h264::Groups;
use crate::{FrameClock, FrameSink, Media, Source, SourceError, StopFlag};

/// Complete blocks the synthetic audio keeps for a late thread, as a capture device's ring of
/// periods does (ALSA's buffer is commonly four periods): 4 x 33 ms.
const AUDIO_RING_BLOCKS: i64 = 4;

/// JPEG quality of encoded `yuyv` frames (the `v4l` source's default `jpeg-quality`).
const YUYV_JPEG_QUALITY: u8 = 80;

/// Paces a loop at a fixed period against a monotonic clock; skips periods it fell behind on.
struct Pacer {
    period: Duration,
    next: Instant,
    /// Periods skipped since the last [`Pacer::take_skipped`].
    skipped: u64,
}

impl Pacer {
    fn new(period: Duration) -> Self {
        Self {
            period,
            next: Instant::now() + period,
            skipped: 0,
        }
    }
    fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }
    /// Waits for the next tick; false when stopped.
    fn wait(&mut self, stop: &StopFlag) -> bool {
        let now = Instant::now();
        if self.next > now && stop.sleep(self.next - now) {
            return false;
        }
        self.next += self.period;
        let now = Instant::now();
        if now > self.next + self.period {
            let behind = (now - self.next).as_nanos() / self.period.as_nanos();
            self.next += self.period * behind as u32;
            self.skipped += behind as u64;
        }
        !stop.is_raised()
    }
}

fn closed(id: &str) -> SourceError {
    SourceError::PipelineClosed {
        source_id: id.to_string(),
    }
}

/// What a synthetic camera's frames start as (config `format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CameraFormat {
    /// JPEGs, as an MJPEG camera hands them over.
    #[default]
    Mjpeg,
    /// Raw YUYV 4:2:2, encoded to JPEG by rigd as a raw V4L2 camera's frames are (even width).
    Yuyv,
}

impl CameraFormat {
    pub fn as_str(&self) -> &'static str {
        match self {
            CameraFormat::Mjpeg => "mjpeg",
            CameraFormat::Yuyv => "yuyv",
        }
    }
}

/// The synthetic camera's video (config `codec = "h264"`, `bitrate`, `gop`, `rate-control`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoSettings {
    pub encoder: crate::h264::H264Settings,
    /// Keyframe interval in buckets: a keyframe opens every group of `gop` buckets.
    pub gop: u32,
    pub bucket_ms: u32,
}

/// A camera producing JPEG frames with a moving pattern and the frame number drawn in.
pub struct SyntheticCamera {
    id: String,
    width: u32,
    height: u32,
    fps: f64,
    frame_bytes: Option<usize>,
    format: CameraFormat,
    clock: Arc<dyn FrameClock>,
    /// Pre-rendered frames cycled through for large MJPEG images, so that the source itself costs
    /// next to nothing (a real MJPEG camera hands over encoded bytes) and benchmarks measure rigd.
    cache: Vec<Bytes>,
    /// The raw frame of format `yuyv`, drawn on anew for every frame.
    yuyv: Option<YuyvCanvas>,
    /// Encoder output, reused frame after frame.
    jpeg: Vec<u8>,
    encode_failures: u64,
    video: Option<VideoSettings>,
    /// Access units handed over as they are (config `clip`), instead of the encoded pan.
    clip: Option<std::path::PathBuf>,
    /// With video: a second, small stream of the same pictures (config `proxy`), fed into the
    /// proxy's sink when the daemon gave the camera's sink one.
    proxy: Option<crate::proxy::ProxySettings>,
    /// With video: which encoder (config `encoder`), for the camera's stream and its proxy's.
    encoder: crate::encoder::EncoderChoice,
}

/// A raw YUYV frame over a textured background rendered once. Each frame redraws only what moves
/// (a bar and the frame number) after restoring what the previous frame drew over, so rendering
/// costs a small fraction of the encode, as a camera's DMA into the buffer costs the CPU nothing.
struct YuyvCanvas {
    width: usize,
    height: usize,
    background: Vec<u8>,
    frame: Vec<u8>,
    /// What the previous frame drew over: the bar's first column and width, the number's rows.
    bar: (usize, usize),
    number_rows: usize,
}

/// Width of the moving bar in pixels and its step per frame.
const BAR_WIDTH: usize = 32;
const BAR_STEP: usize = 16;

impl YuyvCanvas {
    fn new(width: usize, height: usize) -> Self {
        // Camera-like content for the entropy coder: gradients plus noise (as tests/bench/jpeg.sh).
        let mut background = Vec::with_capacity(width * height * 2);
        let mut state = 1u32;
        for y in 0..height {
            for x in (0..width).step_by(2) {
                let mut luma = |x: usize| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((x * 160 / width.max(1) + y * 60 / height.max(1)) as u8 + 16)
                        .wrapping_add((state >> 28) as u8)
                };
                let (y0, y1) = (luma(x), luma(x + 1));
                let cb = (96 + x * 64 / width.max(1)) as u8;
                let cr = (160 - y * 64 / height.max(1)) as u8;
                background.extend_from_slice(&[y0, cb, y1, cr]);
            }
        }
        Self {
            width,
            height,
            frame: background.clone(),
            background,
            bar: (0, 0),
            number_rows: 0,
        }
    }

    /// Draws frame `n` and returns the packed YUYV bytes.
    fn draw(&mut self, n: u64) -> &[u8] {
        let (w, h) = (self.width, self.height);
        let row = w * 2;
        // Restore what the previous frame drew over.
        let (x0, bw) = self.bar;
        for y in 0..h {
            let span = y * row + x0 * 2..y * row + (x0 + bw) * 2;
            self.frame[span.clone()].copy_from_slice(&self.background[span]);
        }
        let top = self.number_rows * row;
        self.frame[..top].copy_from_slice(&self.background[..top]);
        // A bright bar sweeping left to right, on even pixel pairs.
        let x0 = ((n % w as u64) as usize * BAR_STEP % w) & !1;
        let bw = BAR_WIDTH.min(w - x0) & !1;
        for y in 0..h {
            for p in self.frame[y * row + x0 * 2..y * row + (x0 + bw) * 2].chunks_exact_mut(2) {
                p[0] = p[0] / 4 + 180;
            }
        }
        self.bar = (x0, bw);
        let scale = (h / 60).max(2);
        let frame = &mut self.frame;
        draw_number(w, h, n, scale, |x, y| {
            let p = (y * w + (x & !1)) * 2;
            frame[p + (x & 1) * 2] = 235;
            frame[p + 1] = 128;
            frame[p + 3] = 128;
        });
        self.number_rows = (scale * 6).min(h);
        &self.frame
    }
}

/// Frames of at least this many pixels or bytes are rendered once and cycled through.
const CACHE_PIXELS: u64 = 1280 * 720;
const CACHE_BYTES: usize = 1 << 20;
/// Memory the cycled frames may take.
const CACHE_BUDGET: usize = 64 << 20;

impl SyntheticCamera {
    /// `format` `yuyv` needs an even `width` (the config checks it; an odd one fails every encode).
    pub fn new(
        id: &str,
        width: u32,
        height: u32,
        fps: f64,
        frame_bytes: Option<usize>,
        format: CameraFormat,
        clock: Arc<dyn FrameClock>,
    ) -> Self {
        Self {
            video: None,
            clip: None,
            proxy: None,
            encoder: crate::encoder::EncoderChoice::default(),
            id: id.to_string(),
            width,
            height,
            fps,
            frame_bytes,
            format,
            clock,
            cache: Vec::new(),
            yuyv: None,
            jpeg: Vec::new(),
            encode_failures: 0,
        }
    }

    /// The camera films the pan and encodes it to H.264 instead (config `codec = "h264"`).
    pub fn with_video(mut self, video: Option<VideoSettings>) -> Self {
        self.video = video;
        self
    }

    /// With video: a proxy of every picture as well (config `proxy`; docs/DRIVERS.md "Proxy").
    pub fn with_proxy(mut self, proxy: Option<crate::proxy::ProxySettings>) -> Self {
        self.proxy = proxy;
        self
    }

    /// With video: the encoder of both streams (config `encoder`; docs/DRIVERS.md "Encoder choice").
    pub fn with_encoder(mut self, encoder: crate::encoder::EncoderChoice) -> Self {
        self.encoder = encoder;
        self
    }

    /// With video: the access units of the H.264 file `clip`, looped, instead of the encoded pan
    /// (config `clip`).
    pub fn with_clip(mut self, clip: Option<std::path::PathBuf>) -> Self {
        self.clip = clip;
        self
    }

    /// Frame `n` as the camera emits it: a tagged JPEG (padded to `frame-bytes`), or the encoder's
    /// error for a `yuyv` frame.
    pub fn frame(&mut self, n: u64) -> Result<Vec<u8>, crate::camera::EncodeError> {
        match self.format {
            CameraFormat::Mjpeg => Ok(self.render(n)),
            CameraFormat::Yuyv => {
                let (w, h) = (self.width as usize, self.height as usize);
                if w == 0 || h == 0 || w % 2 != 0 {
                    return Err(crate::camera::EncodeError::BadSize {
                        width: self.width,
                        height: self.height,
                    });
                }
                let canvas = self.yuyv.get_or_insert_with(|| YuyvCanvas::new(w, h));
                let raw = canvas.draw(n);
                crate::camera::yuyv_to_jpeg(
                    self.width,
                    self.height,
                    raw,
                    YUYV_JPEG_QUALITY,
                    &mut self.jpeg,
                )?;
                Ok(tag_and_pad(&self.jpeg, n, self.frame_bytes))
            }
        }
    }

    /// Renders frame `n` and encodes it (format `mjpeg`).
    pub fn render(&mut self, n: u64) -> Vec<u8> {
        let (w, h) = (self.width as usize, self.height as usize);
        let pattern = Pattern::new(w, h, n);
        let mut jpeg = Vec::with_capacity(w * h / 4);
        let encoder = jpeg_encoder::Encoder::new(&mut jpeg, 80);
        // Encoding fails only on sizes above 65535.
        if let Err(e) = encoder.encode_image(pattern) {
            tracing::warn!(source = %self.id, error = %e, "synthetic camera: encode failed");
        }
        tag_and_pad(&jpeg, n, self.frame_bytes)
    }
}

/// Frame `n` of the `mjpeg` camera: a gradient sliding sideways with the frame number drawn at
/// the top left, computed row by row as the encoder asks for them. No canvas: a 1080p RGB one
/// was 6 MB of the daemon's peak memory, for frames rendered once and cycled.
struct Pattern {
    width: usize,
    height: usize,
    shift: usize,
    /// The number's pixels, `mask_width` wide and as many rows as it covers.
    mask: Vec<bool>,
    mask_width: usize,
}

impl Pattern {
    fn new(width: usize, height: usize, n: u64) -> Self {
        let scale = (height / 60).max(2);
        let mask_width = (scale * (1 + n.to_string().len() * 4)).min(width);
        let rows = (scale * 6).min(height);
        let mut mask = vec![false; mask_width * rows];
        draw_number(mask_width, rows, n, scale, |x, y| {
            mask[y * mask_width + x] = true
        });
        Self {
            width,
            height,
            shift: (n * 4) as usize,
            mask,
            mask_width,
        }
    }
}

impl jpeg_encoder::ImageBuffer for Pattern {
    fn get_jpeg_color_type(&self) -> jpeg_encoder::JpegColorType {
        jpeg_encoder::JpegColorType::Ycbcr
    }

    fn width(&self) -> u16 {
        self.width as u16
    }

    fn height(&self) -> u16 {
        self.height as u16
    }

    fn fill_buffers(&self, y: u16, buffers: &mut [Vec<u8>; 4]) {
        let (w, y) = (self.width.max(1), usize::from(y));
        let g = (y * 255 / self.height.max(1)) as u8;
        let mask = self
            .mask
            .get(y * self.mask_width..(y + 1) * self.mask_width);
        for x in 0..self.width {
            let lit = mask.is_some_and(|m| x < m.len() && m[x]);
            let (r, g, b) = if lit {
                (255, 255, 255)
            } else {
                (((x + self.shift) * 255 / w) as u8, g, 96)
            };
            let (y, cb, cr) = jpeg_encoder::rgb_to_ycbcr(r, g, b);
            buffers[0].push(y);
            buffers[1].push(cb);
            buffers[2].push(cr);
        }
    }
}

/// Inserts the checksum comment after SOI and pads with comment segments up to `target` bytes.
fn tag_and_pad(jpeg: &[u8], n: u64, target: Option<usize>) -> Vec<u8> {
    const TAG_LEN: usize = 4 + 24 + 8; // FF FE len16 + "rigd-synthetic v1 crc32=" + 8 hex
    let body = &jpeg[2..];
    let mut pad_segments = Vec::new();
    if let Some(target) = target {
        let mut pad = target.saturating_sub(jpeg.len() + TAG_LEN);
        let mut state = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        while pad >= 5 {
            let data = (pad - 4).min(65533);
            pad_segments.extend_from_slice(&[0xFF, 0xFE]);
            pad_segments.extend_from_slice(&((data + 2) as u16).to_be_bytes());
            for _ in 0..data {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                pad_segments.push(state as u8);
            }
            pad -= data + 4;
        }
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&pad_segments);
    crc.update(body);
    let tag = format!("rigd-synthetic v1 crc32={:08x}", crc.finalize());
    let mut out = Vec::with_capacity(2 + 4 + tag.len() + pad_segments.len() + body.len());
    out.extend_from_slice(&[0xFF, 0xD8, 0xFF, 0xFE]);
    out.extend_from_slice(&((tag.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(tag.as_bytes());
    out.extend_from_slice(&pad_segments);
    out.extend_from_slice(body);
    out
}

const DIGITS: [[u8; 5]; 10] = [
    [0b111, 0b101, 0b101, 0b101, 0b111],
    [0b010, 0b110, 0b010, 0b010, 0b111],
    [0b111, 0b001, 0b111, 0b100, 0b111],
    [0b111, 0b001, 0b111, 0b001, 0b111],
    [0b101, 0b101, 0b111, 0b001, 0b001],
    [0b111, 0b100, 0b111, 0b001, 0b111],
    [0b111, 0b100, 0b111, 0b101, 0b111],
    [0b111, 0b001, 0b010, 0b010, 0b010],
    [0b111, 0b101, 0b111, 0b101, 0b111],
    [0b111, 0b101, 0b111, 0b001, 0b111],
];

/// Draws `n` in block digits at the top left (`scale` * 6 rows), one `put(x, y)` per lit pixel.
fn draw_number(w: usize, h: usize, n: u64, scale: usize, mut put: impl FnMut(usize, usize)) {
    let text = n.to_string();
    for (i, ch) in text.bytes().enumerate() {
        let glyph = DIGITS[(ch - b'0') as usize];
        let x0 = scale * (1 + i * 4);
        for (gy, bits) in glyph.iter().enumerate() {
            for gx in 0..3 {
                if bits & (0b100 >> gx) == 0 {
                    continue;
                }
                for dy in 0..scale {
                    for dx in 0..scale {
                        let (x, y) = (x0 + gx * scale + dx, scale + gy * scale + dy);
                        if x < w && y < h {
                            put(x, y);
                        }
                    }
                }
            }
        }
    }
}

impl Source for SyntheticCamera {
    fn id(&self) -> &str {
        &self.id
    }

    fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
        if let Some(video) = self.video {
            if let Some(path) = self.clip.clone() {
                return self.run_clip(&path, video, sink, stop);
            }
            return self.run_video(video, sink, stop);
        }
        let mut pacer = Pacer::new(Duration::from_secs_f64(1.0 / self.fps));
        let media = Media::jpeg(self.width, self.height);
        let frame_bytes = self.frame_bytes.unwrap_or(0);
        let cycle = if self.format == CameraFormat::Yuyv {
            0 // every raw frame is drawn and encoded: that cost is what the format is for
        } else if self.width as u64 * self.height as u64 >= CACHE_PIXELS
            || frame_bytes >= CACHE_BYTES
        {
            (CACHE_BUDGET / frame_bytes.max(512 << 10)).clamp(1, 8) as u64
        } else {
            0
        };
        while pacer.wait(stop) {
            // Periods the loop fell behind on (an encode slower than the frame period, a
            // starved process) are frames a camera would have lost.
            let skipped = pacer.take_skipped();
            if skipped > 0 {
                sink.health().add_drops(skipped);
            }
            let stamp = self.clock.now();
            let seq = sink.next_seq();
            let jpeg = if cycle == 0 {
                match self.frame(seq) {
                    Ok(jpeg) => Bytes::from(jpeg),
                    Err(e) => {
                        self.encode_failures += 1;
                        sink.health().add_drops(1);
                        if self.encode_failures.is_power_of_two() {
                            tracing::warn!(source = %self.id, error = %e,
                                failures = self.encode_failures, "synthetic camera: encode failed");
                        }
                        continue;
                    }
                }
            } else {
                let i = (seq % cycle) as usize;
                while self.cache.len() <= i {
                    let n = self.cache.len() as u64;
                    let frame = Bytes::from(self.render(n));
                    self.cache.push(frame);
                }
                self.cache[i].clone()
            };
            sink.emit(stamp, media.clone(), jpeg)
                .map_err(|_| closed(&self.id))?;
        }
        Ok(())
    }
}

impl SyntheticCamera {
    /// Films the pan and encodes it to H.264, a keyframe opening every group.
    #[cfg(feature = "h264")]
    fn run_video(
        &mut self,
        video: VideoSettings,
        sink: &mut FrameSink,
        stop: &StopFlag,
    ) -> Result<(), SourceError> {
        let mut pan = crate::scene::Pan::new(self.width as usize, self.height as usize);
        let (width, height) = (pan.width(), pan.height());
        let chosen = self.encoder.resolve();
        let device_error = |e: crate::h264::H264Error, retryable| SourceError::Device {
            source_id: self.id.clone(),
            device: "H.264 encoder".into(),
            message: e.to_string(),
            retryable,
        };
        let mut encoder = chosen
            .open(video.encoder, width, height, video.gop)
            .map_err(|e| {
                let retryable = matches!(e, crate::h264::H264Error::Device(_));
                device_error(e, retryable)
            })?;
        let mut groups = Groups::default();
        let mut proxy = self
            .proxy
            .map(|p| crate::proxy::Proxy::chosen(p, chosen.clone()));
        let mut pacer = Pacer::new(Duration::from_secs_f64(1.0 / self.fps));
        while pacer.wait(stop) {
            let skipped = pacer.take_skipped();
            if skipped > 0 {
                sink.health().add_drops(skipped);
            }
            let stamp = self.clock.now();
            let seq = sink.next_seq();
            let (_, key) = groups.next(stamp.ns, video.gop, video.bucket_ms);
            let picture = pan.draw(seq);
            let au = match encoder.encode(width, height, picture, key) {
                Ok(au) => au,
                // The encoder's device failed: the camera fails, and is retried.
                Err(e @ crate::h264::H264Error::Device(_)) => {
                    sink.health().add_drops(1);
                    return Err(device_error(e, true));
                }
                Err(e) => {
                    groups.lost();
                    self.encode_failures += 1;
                    sink.health().add_drops(1);
                    if self.encode_failures.is_power_of_two() {
                        tracing::warn!(source = %self.id, error = %e,
                            failures = self.encode_failures, "synthetic camera: encode failed");
                    }
                    continue;
                }
            };
            if key {
                // Once a group: which encoder (and a device's copies so far).
                sink.health()
                    .set_detail(&format!("{width}x{height}, encoder {}", encoder.describe()));
            }
            let media = Media::Camera {
                width: width as u32,
                height: height as u32,
                codec: crate::Codec::H264,
                keyframe: au.keyframe,
            };
            sink.emit(stamp, media, Bytes::from(au.data))
                .map_err(|_| closed(&self.id))?;
            // After the camera's own frame, from the same picture and stamp (crate::proxy).
            if let (Some(proxy), Some(proxy_sink)) = (proxy.as_mut(), sink.proxy_mut()) {
                proxy
                    .feed(proxy_sink, stamp, width, height, picture)
                    .map_err(|e| e.into_source_error(&self.id))?;
            }
        }
        Ok(())
    }

    /// Hands over the clip's access units at `fps`, looped; at the first frame of every group it
    /// moves on to the clip's next keyframe, so keyframes open groups as the encoder's do (the
    /// frames skipped there are the rest of a group of the file, never shown: no drop).
    fn run_clip(
        &mut self,
        path: &std::path::Path,
        video: VideoSettings,
        sink: &mut FrameSink,
        stop: &StopFlag,
    ) -> Result<(), SourceError> {
        let clip = Clip::load(path).map_err(|message| SourceError::Device {
            source_id: self.id.clone(),
            device: path.display().to_string(),
            message,
            retryable: false,
        })?;
        let mut groups = Groups::default();
        let mut pacer = Pacer::new(Duration::from_secs_f64(1.0 / self.fps));
        let mut at = 0;
        while pacer.wait(stop) {
            let skipped = pacer.take_skipped();
            if skipped > 0 {
                sink.health().add_drops(skipped);
            }
            let stamp = self.clock.now();
            let (_, opens) = groups.next(stamp.ns, video.gop, video.bucket_ms);
            if opens {
                at = clip.keyframe_from(at);
            }
            let (au, keyframe) = clip.unit(at);
            at = (at + 1) % clip.len();
            let media = Media::Camera {
                width: self.width,
                height: self.height,
                codec: crate::Codec::H264,
                keyframe,
            };
            sink.emit(stamp, media, au).map_err(|_| closed(&self.id))?;
        }
        Ok(())
    }

    /// Without the encoder (feature `h264` off) the config refuses `codec = "h264"`.
    #[cfg(not(feature = "h264"))]
    fn run_video(
        &mut self,
        _video: VideoSettings,
        _sink: &mut FrameSink,
        _stop: &StopFlag,
    ) -> Result<(), SourceError> {
        Err(SourceError::not_built(
            &self.id,
            "synthetic H.264 encoder",
            "h264",
        ))
    }
}

/// An H.264 elementary stream (Annex B) cut into access units, every keyframe with its SPS and
/// PPS in front, starting at a keyframe: what a camera with `clip = FILE` hands over in a loop.
/// The units share the file's bytes (a frame handed over is a reference, not a copy).
#[derive(Debug, Clone)]
pub struct Clip {
    units: Vec<(Bytes, bool)>,
}

/// NAL unit types (H.264 Table 7-1).
const NAL_SLICE: u8 = 1;
const NAL_IDR: u8 = 5;
const NAL_SPS: u8 = 7;
const NAL_PPS: u8 = 8;

impl Clip {
    /// Reads and cuts the file at `path`.
    pub fn load(path: &std::path::Path) -> Result<Clip, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Clip::parse(Bytes::from(bytes)).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Cuts an Annex B stream into access units: a unit starts at a parameter set, SEI or
    /// delimiter (types 6 to 9) or at a picture's first slice (`first_mb_in_slice` 0) once the
    /// unit being gathered holds a slice. A keyframe (an IDR slice) that lacks the SPS or PPS gets
    /// the latest ones of the stream in front; units before the first keyframe are left out.
    pub fn parse(stream: Bytes) -> Result<Clip, String> {
        let nals = nal_units(&stream);
        let mut units: Vec<(Bytes, bool)> = Vec::new();
        let (mut sps, mut pps): (Option<Bytes>, Option<Bytes>) = (None, None);
        let mut unit: Vec<(usize, usize, u8)> = Vec::new();
        let mut finish = |unit: &mut Vec<(usize, usize, u8)>,
                          sps: &Option<Bytes>,
                          pps: &Option<Bytes>|
         -> Result<(), String> {
            if unit.is_empty() {
                return Ok(());
            }
            let has = |t: u8| unit.iter().any(|&(_, _, u)| u == t);
            let keyframe = has(NAL_IDR);
            if keyframe || !units.is_empty() {
                let (start, end) = (unit[0].0, unit[unit.len() - 1].1);
                let data = if keyframe && !(has(NAL_SPS) && has(NAL_PPS)) {
                    let (Some(sps), Some(pps)) = (sps, pps) else {
                        return Err("a keyframe with no SPS and PPS before it".into());
                    };
                    [&sps[..], &pps[..], &stream[start..end]].concat().into()
                } else {
                    stream.slice(start..end)
                };
                units.push((data, keyframe));
            }
            unit.clear();
            Ok(())
        };
        for &(start, end, header) in &nals {
            let kind = stream[header] & 0x1F;
            let has_slice = unit.iter().any(|&(_, _, t)| t == NAL_SLICE || t == NAL_IDR);
            // ue(v) first_mb_in_slice is 0 exactly when its first bit is 1.
            let first_slice = matches!(kind, NAL_SLICE | NAL_IDR)
                && stream.get(header + 1).is_some_and(|b| b & 0x80 != 0);
            if has_slice && ((6..=9).contains(&kind) || first_slice) {
                finish(&mut unit, &sps, &pps)?;
            }
            match kind {
                NAL_SPS => sps = Some(stream.slice(start..end)),
                NAL_PPS => pps = Some(stream.slice(start..end)),
                _ => {}
            }
            unit.push((start, end, kind));
        }
        finish(&mut unit, &sps, &pps)?;
        if units.is_empty() {
            return Err("no keyframe (IDR) in the stream".into());
        }
        Ok(Clip { units })
    }

    /// Access units in the clip (at least one).
    pub fn len(&self) -> usize {
        self.units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Unit `i`: its bytes and whether it is a keyframe.
    pub fn unit(&self, i: usize) -> (Bytes, bool) {
        let (data, keyframe) = &self.units[i % self.units.len()];
        (data.clone(), *keyframe)
    }

    /// The first keyframe at or after unit `i`, wrapping to the clip's start (a keyframe).
    pub fn keyframe_from(&self, i: usize) -> usize {
        (i..self.units.len())
            .find(|&j| self.units[j].1)
            .unwrap_or(0)
    }
}

/// The NAL units of an Annex B stream: (start with its start code, end, the header byte's offset).
fn nal_units(stream: &[u8]) -> Vec<(usize, usize, usize)> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 3 < stream.len() {
        if stream[i] == 0 && stream[i + 1] == 0 && stream[i + 2] == 1 {
            // A four-byte start code's leading zero belongs to this unit.
            let start = if i > 0 && stream[i - 1] == 0 {
                i - 1
            } else {
                i
            };
            starts.push((start, i + 3));
            i += 3;
        } else {
            i += 1;
        }
    }
    starts
        .iter()
        .enumerate()
        .map(|(k, &(start, header))| {
            let end = starts.get(k + 1).map_or(stream.len(), |&(s, _)| s);
            (start, end, header)
        })
        .collect()
}

/// A sine tone as interleaved S16LE PCM, one block per time bucket, stamped at the bucket start.
pub struct SyntheticAudio {
    id: String,
    sample_rate: u32,
    channels: u16,
    tone_hz: f64,
    bucket_ms: u32,
    clock: Arc<dyn FrameClock>,
    /// The tone's samples over a whole number of its cycles, when that is a whole number of
    /// samples (an integral tone): a block is copied from it rather than computed (empty: each
    /// sample is computed).
    period: Vec<i16>,
    /// Loud intervals at known times (config `burst-every-s`, `burst-s`).
    burst: Option<crate::synthetic_track::Burst>,
}

/// The longest tone period kept as a table (samples).
const MAX_PERIOD: u64 = 1 << 16;

/// The tone's sample at `cycles` (its phase in whole cycles, in [0, 1)).
fn tone_sample(cycles: f64) -> i16 {
    ((2.0 * PI * cycles).sin() * 8192.0) as i16
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// See [`SyntheticAudio::period`]: sample `k` of an integral tone `f` at rate `r` is at phase
/// `(k * f mod r) / r`, and repeats every `r / gcd(r, f)` samples.
fn tone_period(rate: u32, hz: f64) -> Vec<i16> {
    if hz.fract() != 0.0 || !(1.0..=f64::from(u32::MAX)).contains(&hz) || rate == 0 {
        return Vec::new();
    }
    let (f, r) = (hz as u64, u64::from(rate));
    let p = r / gcd(r, f);
    if p > MAX_PERIOD {
        return Vec::new();
    }
    (0..p)
        .map(|k| tone_sample((k * f % r) as f64 / r as f64))
        .collect()
}

impl SyntheticAudio {
    pub fn new(
        id: &str,
        sample_rate: u32,
        channels: u16,
        tone_hz: f64,
        bucket_ms: u32,
        clock: Arc<dyn FrameClock>,
    ) -> Self {
        Self {
            id: id.to_string(),
            sample_rate,
            channels,
            tone_hz,
            bucket_ms,
            clock,
            period: tone_period(sample_rate, tone_hz),
            burst: None,
        }
    }

    /// Tone bursts (`crate::synthetic_track::Burst`): loud for a while every so often.
    pub fn with_burst(mut self, burst: Option<crate::synthetic_track::Burst>) -> Self {
        self.burst = burst;
        self
    }

    /// Sample frames in bucket `bucket` (see [`crate::audio::frames_in_bucket`]).
    pub fn frames_in(&self, bucket: i64) -> u32 {
        crate::audio::frames_in_bucket(self.sample_rate, self.bucket_ms, bucket)
    }

    /// The PCM block of bucket `bucket`: the tone's phase follows absolute time, so blocks of
    /// consecutive buckets join without a click.
    pub fn block(&self, bucket: i64) -> Vec<u8> {
        let frames = self.frames_in(bucket) as i64;
        let mut out = Vec::with_capacity(frames as usize * self.channels as usize * 2);
        let first = bucket * self.bucket_ms as i64 * self.sample_rate as i64 / 1000;
        for k in first..first + frames {
            // The phase is reduced before `sin`: at an absolute sample number (about 1e14 today)
            // the argument's own reduction cost more than the rest of the source.
            let s = if self.period.is_empty() {
                // Whole seconds add whole cycles of the tone's integral part.
                let r = i64::from(self.sample_rate.max(1));
                let (secs, k) = (k.div_euclid(r), k.rem_euclid(r));
                let cycles =
                    k as f64 * self.tone_hz / r as f64 + secs as f64 * self.tone_hz.fract();
                tone_sample(cycles.rem_euclid(1.0))
            } else {
                self.period[k.rem_euclid(self.period.len() as i64) as usize]
            };
            let s = match &self.burst {
                Some(b) => (f64::from(s) * b.gain(k, self.sample_rate)) as i16,
                None => s,
            };
            for _ in 0..self.channels {
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
        out
    }
}

impl Source for SyntheticAudio {
    fn id(&self) -> &str {
        &self.id
    }

    fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
        let width_ns = self.bucket_ms as i64 * 1_000_000;
        let now = self.clock.now();
        let mut bucket = now.ns.div_euclid(width_ns) + 1;
        loop {
            // A block is complete at the end of its bucket.
            let end = (bucket + 1) * width_ns;
            let now = self.clock.now();
            if now.ns < end {
                if stop.sleep(Duration::from_nanos((end - now.ns) as u64)) {
                    return Ok(());
                }
                continue;
            }
            if stop.is_raised() {
                return Ok(());
            }
            let stamp = crate::Stamp {
                ns: bucket * width_ns,
                state: now.state,
            };
            let block = self.block(bucket);
            let media = Media::Audio {
                sample_rate: self.sample_rate,
                channels: self.channels,
                frames: self.frames_in(bucket),
            };
            sink.emit(stamp, media, Bytes::from(block))
                .map_err(|_| closed(&self.id))?;
            bucket += 1;
            // A late thread still finds the last AUDIO_RING_BLOCKS complete blocks, as a device's
            // capture ring holds several periods; fell behind further (a suspended process), the
            // blocks before those are lost: drops.
            let complete = self.clock.now().ns.div_euclid(width_ns);
            if complete - bucket > AUDIO_RING_BLOCKS {
                sink.health()
                    .add_drops((complete - bucket - AUDIO_RING_BLOCKS) as u64);
                bucket = complete - AUDIO_RING_BLOCKS;
            }
        }
    }
}

/// NMEA 0183 `$GPRMC` sentences with valid checksums at a fixed rate, one record per sentence.
pub struct SyntheticSerial {
    id: String,
    rate_hz: f64,
    clock: Arc<dyn FrameClock>,
    /// A closed loop instead of the straight line (config `loop-s`, `loop-radius-m`).
    track: Option<crate::synthetic_track::Loop>,
}

impl SyntheticSerial {
    pub fn new(id: &str, rate_hz: f64, clock: Arc<dyn FrameClock>) -> Self {
        Self {
            id: id.to_string(),
            rate_hz,
            clock,
            track: None,
        }
    }

    /// Drive round `crate::synthetic_track::Loop` instead of along a line.
    pub fn with_loop(mut self, track: Option<crate::synthetic_track::Loop>) -> Self {
        self.track = track;
        self
    }
}

/// The XOR checksum of an NMEA sentence body (between `$` and `*`).
pub fn nmea_checksum(body: &[u8]) -> u8 {
    body.iter().fold(0u8, |acc, b| acc ^ b)
}

/// A `$GPRMC` sentence for time `ns` (UTC) and sample `n`, without the trailing CRLF.
pub fn rmc_sentence(ns: i64, n: u64) -> String {
    let (time, date) = rmc_time_date(ns);
    let lat = 4807.038 + (n % 1000) as f64 * 0.001;
    let body = format!("GPRMC,{time},A,{lat:08.3},N,01131.000,E,022.4,084.4,{date},003.1,W");
    format!("${body}*{:02X}", nmea_checksum(body.as_bytes()))
}

/// A `$GPRMC` sentence of the loop `track` at time `ns`, without the trailing CRLF.
pub fn rmc_loop_sentence(track: &crate::synthetic_track::Loop, ns: i64) -> String {
    let (time, date) = rmc_time_date(ns);
    let body = track.rmc_body(ns, &time, &date);
    format!("${body}*{:02X}", nmea_checksum(body.as_bytes()))
}

/// RMC's `hhmmss.ss` and `ddmmyy` of time `ns` (UTC).
fn rmc_time_date(ns: i64) -> (String, String) {
    let secs = ns.div_euclid(1_000_000_000);
    let centis = ns.rem_euclid(1_000_000_000) / 10_000_000;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    (
        format!(
            "{:02}{:02}{:02}.{:02}",
            sod / 3600,
            sod % 3600 / 60,
            sod % 60,
            centis
        ),
        format!("{:02}{:02}{:02}", d, m, y % 100),
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

impl Source for SyntheticSerial {
    fn id(&self) -> &str {
        &self.id
    }

    fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
        let mut pacer = Pacer::new(Duration::from_secs_f64(1.0 / self.rate_hz));
        while pacer.wait(stop) {
            let stamp = self.clock.now();
            let line = match &self.track {
                Some(track) => rmc_loop_sentence(track, stamp.ns),
                None => rmc_sentence(stamp.ns, sink.next_seq()),
            };
            sink.emit(stamp, Media::Serial { text: true }, Bytes::from(line))
                .map_err(|_| closed(&self.id))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SystemClock;

    /// A rig clock the test moves by hand.
    struct StepClock(std::sync::atomic::AtomicI64);

    impl FrameClock for StepClock {
        fn now(&self) -> crate::Stamp {
            self.map_realtime(self.0.load(std::sync::atomic::Ordering::SeqCst))
        }
        fn map_realtime(&self, ns: i64) -> crate::Stamp {
            crate::Stamp {
                ns,
                state: crate::ClockState::Unsynced,
            }
        }
    }

    #[test]
    fn audio_a_late_thread_finds_the_ring_of_blocks_and_loses_only_what_is_older() {
        use std::sync::atomic::Ordering::SeqCst;
        let w = 33_000_000i64;
        let clock = Arc::new(StepClock(std::sync::atomic::AtomicI64::new(1000 * w + 1)));
        let mut mic = SyntheticAudio::new("a", 48_000, 1, 440.0, 33, clock.clone());
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let mut sink = FrameSink::new(Arc::from("a"), 0, tx, Arc::default());
        let health = sink.health().clone();
        let stop = StopFlag::new();
        let stopping = stop.clone();
        let run = std::thread::spawn(move || mic.run(&mut sink, &stopping));
        // The bucket of the next block handed over, within 2 s (None: none came).
        let mut next = || {
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            loop {
                if let Ok(f) = rx.try_recv() {
                    return Some(f.capture_ns / w);
                }
                if std::time::Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // The thread reads the clock once as it starts (block 1001 is its first).
        std::thread::sleep(Duration::from_millis(200));
        clock.0.store(1002 * w + 1, SeqCst); // block 1001 complete
        assert_eq!(next(), Some(1001));
        // The thread wakes ten buckets late: the last four complete blocks are still there.
        clock.0.store(1012 * w + 1, SeqCst);
        let late: Vec<_> = (0..5).map(|_| next()).collect();
        assert_eq!(late, [1002, 1008, 1009, 1010, 1011].map(Some));
        assert_eq!(health.drops(), 5, "blocks 1003..=1007 were overwritten");
        // Three buckets late: within the ring, nothing lost.
        clock.0.store(1015 * w + 1, SeqCst);
        let late: Vec<_> = (0..3).map(|_| next()).collect();
        assert_eq!(late, [1012, 1013, 1014].map(Some));
        assert_eq!(health.drops(), 5);
        stop.raise();
        run.join().unwrap().unwrap();
    }

    #[test]
    fn camera_frame_is_a_tagged_jpeg_of_the_requested_size() {
        let mut cam = SyntheticCamera::new(
            "c",
            64,
            48,
            10.0,
            Some(100_000),
            CameraFormat::Mjpeg,
            Arc::new(SystemClock),
        );
        let jpeg = cam.render(7);
        assert_eq!(&jpeg[..2], &[0xFF, 0xD8]);
        assert_eq!(&jpeg[jpeg.len() - 2..], &[0xFF, 0xD9]);
        assert!(
            jpeg.len() >= 100_000 && jpeg.len() < 100_005,
            "len {}",
            jpeg.len()
        );
        assert_tagged(&jpeg);
    }

    /// A 64x48 `mjpeg` camera at 10 fps, frames unpadded.
    fn small_mjpeg_camera() -> SyntheticCamera {
        SyntheticCamera::new(
            "c",
            64,
            48,
            10.0,
            None,
            CameraFormat::Mjpeg,
            Arc::new(SystemClock),
        )
    }

    #[test]
    fn camera_frames_differ_per_number() {
        let mut cam = small_mjpeg_camera();
        assert_ne!(cam.render(1), cam.render(2));
    }

    /// The tag's CRC covers everything after the tag segment.
    fn assert_tagged(jpeg: &[u8]) {
        assert_eq!(&jpeg[..4], &[0xFF, 0xD8, 0xFF, 0xFE]);
        let tag_len = u16::from_be_bytes([jpeg[4], jpeg[5]]) as usize;
        let tag = std::str::from_utf8(&jpeg[6..4 + tag_len]).unwrap();
        let hex = tag.strip_prefix("rigd-synthetic v1 crc32=").unwrap();
        assert_eq!(
            u32::from_str_radix(hex, 16).unwrap(),
            crc32fast::hash(&jpeg[4 + tag_len..])
        );
    }

    #[test]
    fn yuyv_camera_frames_decode_as_jpegs_of_the_configured_size() {
        for (w, h) in [(64u32, 48u32), (1920, 1080)] {
            let mut cam = SyntheticCamera::new(
                "c",
                w,
                h,
                30.0,
                None,
                CameraFormat::Yuyv,
                Arc::new(SystemClock),
            );
            let (a, b) = (cam.frame(7).unwrap(), cam.frame(8).unwrap());
            assert_ne!(a, b, "{w}x{h}: the bar and the number move");
            for jpeg in [&a, &b] {
                assert_tagged(jpeg);
                assert!(crate::camera::mjpeg_frame(jpeg).is_some());
                let mut d = jpeg_decoder::Decoder::new(&jpeg[..]);
                let rgb = d.decode().expect("decodes");
                let info = d.info().unwrap();
                assert_eq!((info.width as u32, info.height as u32), (w, h));
                assert_eq!(rgb.len(), (w * h * 3) as usize);
            }
        }
    }

    /// The `mjpeg` pattern decodes to the gradient with the frame number drawn in white.
    #[test]
    fn mjpeg_camera_frames_show_the_gradient_and_the_number() {
        let mut cam = small_mjpeg_camera();
        let jpeg = cam.render(8);
        let mut d = jpeg_decoder::Decoder::new(&jpeg[..]);
        let rgb = d.decode().expect("decodes");
        let px = |x: usize, y: usize| &rgb[(y * 64 + x) * 3..(y * 64 + x) * 3 + 3];
        let near = |got: &[u8], want: [i32; 3]| {
            got.iter()
                .zip(want)
                .all(|(&g, w)| (g as i32 - w).abs() <= 24)
        };
        // "8" at scale 2: its top bar covers x 2..8 on rows 2..4.
        assert!(near(px(4, 2), [255, 255, 255]), "{:?}", px(4, 2));
        // Elsewhere the gradient, shifted by 4 pixels per frame: red (40 + 32) * 255 / 64 mod 256.
        assert!(near(px(40, 30), [30, 159, 96]), "{:?}", px(40, 30));
    }

    #[test]
    fn yuyv_camera_restores_what_the_previous_frame_drew_over() {
        // Drawing frame 5 after frames 1..5 gives the same picture as drawing it first.
        let mut c = YuyvCanvas::new(320, 240);
        for n in 1..5 {
            c.draw(n);
        }
        let after = c.draw(5).to_vec();
        assert_eq!(after, YuyvCanvas::new(320, 240).draw(5));
    }

    #[test]
    fn yuyv_camera_pads_to_frame_bytes_and_refuses_an_odd_width() {
        let mut cam = SyntheticCamera::new(
            "c",
            64,
            48,
            30.0,
            Some(200_000),
            CameraFormat::Yuyv,
            Arc::new(SystemClock),
        );
        let jpeg = cam.frame(1).unwrap();
        assert!(
            (200_000..200_005).contains(&jpeg.len()),
            "len {}",
            jpeg.len()
        );
        assert_tagged(&jpeg);
        let mut odd = SyntheticCamera::new(
            "c",
            63,
            48,
            30.0,
            None,
            CameraFormat::Yuyv,
            Arc::new(SystemClock),
        );
        assert!(odd.frame(1).is_err());
    }

    /// An Annex B NAL unit: a four-byte start code, the header byte, a payload.
    fn nal(header: u8, payload: &[u8]) -> Vec<u8> {
        [&[0, 0, 0, 1, header][..], payload].concat()
    }

    #[test]
    fn a_clip_is_cut_into_access_units_from_its_first_keyframe() {
        let (sps, pps) = (nal(0x67, &[0x42, 0xC0, 0x1E]), nal(0x68, &[0xCE, 0x38]));
        let idr = nal(0x65, &[0x88, 0x84, 0x21]); // first_mb_in_slice 0
        let idr_b = nal(0x65, &[0x40, 0x12]); // a second slice of the same picture
        let p = |n: u8| nal(0x41, &[0x9A, n]);
        let stream = [
            p(0),        // before the first keyframe: left out
            sps.clone(), // unit 0: SPS, PPS, IDR in two slices
            pps.clone(),
            idr.clone(),
            idr_b.clone(),
            p(1),               // unit 1
            nal(0x09, &[0x10]), // unit 2: a delimiter, then its slice
            p(2),
            idr.clone(), // unit 3: an IDR without parameter sets gets the stream's in front
            p(3),        // unit 4
        ]
        .concat();
        let clip = Clip::parse(Bytes::from(stream)).unwrap();
        let units: Vec<(Vec<u8>, bool)> = (0..clip.len())
            .map(|i| {
                let (d, k) = clip.unit(i);
                (d.to_vec(), k)
            })
            .collect();
        assert_eq!(units.len(), 5);
        assert_eq!(units[0], ([&sps[..], &pps, &idr, &idr_b].concat(), true));
        assert_eq!(units[1], (p(1), false));
        assert_eq!(units[2], ([nal(0x09, &[0x10]), p(2)].concat(), false));
        assert_eq!(units[3], ([&sps[..], &pps, &idr].concat(), true));
        assert_eq!(units[4], (p(3), false));
        assert_eq!(crate::h264::nal_types(&units[3].0), vec![7, 8, 5]);
        // The next keyframe at or after a unit, wrapping to the start.
        assert_eq!(
            (0..6).map(|i| clip.keyframe_from(i)).collect::<Vec<_>>(),
            vec![0, 3, 3, 3, 0, 0]
        );
        // No keyframe, or one with no parameter sets anywhere before it: refused.
        assert!(Clip::parse(Bytes::from([p(0), p(1)].concat())).is_err());
        assert!(Clip::parse(Bytes::from([idr.clone(), p(1)].concat())).is_err());
        assert!(Clip::parse(Bytes::new()).is_err());
    }

    /// The encoder's own access units, written one after the other, come back as they were.
    #[cfg(feature = "h264")]
    #[test]
    fn a_clip_of_encoded_frames_gives_back_each_access_unit() {
        let mut pan = crate::scene::Pan::new(160, 96);
        let mut enc = crate::h264::H264Encoder::new(crate::h264::H264Settings {
            bitrate: 300_000,
            rate_control: crate::h264::RateControl::Bitrate,
            fps: 30.0,
        })
        .unwrap();
        let aus: Vec<_> = (0..12u64)
            .map(|n| enc.encode(160, 96, pan.draw(n), n % 5 == 0).unwrap())
            .collect();
        let stream: Vec<u8> = aus.iter().flat_map(|au| au.data.clone()).collect();
        let clip = Clip::parse(Bytes::from(stream)).unwrap();
        assert_eq!(clip.len(), aus.len());
        for (i, au) in aus.iter().enumerate() {
            assert_eq!(
                clip.unit(i),
                (Bytes::from(au.data.clone()), au.keyframe),
                "unit {i}"
            );
        }
    }

    #[test]
    fn a_keyframe_opens_every_group_and_follows_a_lost_frame() {
        // 33 ms buckets, groups of 3 buckets (99 ms), frames every 25 ms.
        let mut g = Groups::default();
        let keys: Vec<(i64, bool)> = (0..9).map(|i| g.next(i * 25_000_000, 3, 33)).collect();
        assert_eq!(
            keys,
            vec![
                (0, true),  // 0 ms, bucket 0
                (0, false), // 25 ms
                (0, false), // 50 ms, bucket 1
                (0, false), // 75 ms, bucket 2
                (3, true),  // 100 ms, bucket 3
                (3, false), // 125
                (3, false), // 150
                (3, false), // 175
                (6, true),  // 200 ms, bucket 6
            ]
        );
        g.lost();
        assert_eq!(g.next(225_000_000, 3, 33), (6, true));
        assert_eq!(g.next(250_000_000, 3, 33), (6, false));
        // gop 1: every bucket is its group.
        let mut one = Groups::default();
        assert_eq!(one.next(0, 1, 33), (0, true));
        assert_eq!(one.next(33_000_000, 1, 33), (1, true));
    }

    #[test]
    fn audio_block_has_one_bucket_of_samples() {
        let a = SyntheticAudio::new("a", 48_000, 2, 440.0, 33, Arc::new(SystemClock));
        assert_eq!(a.frames_in(1000), 1584);
        assert_eq!(a.block(1000).len(), 1584 * 2 * 2);
        // 44.1 kHz: 1455.3 samples per 33 ms bucket, so 1455 or 1456, and ten buckets hold
        // exactly the samples of 330 ms.
        let b = SyntheticAudio::new("b", 44_100, 1, 440.0, 33, Arc::new(SystemClock));
        let n: Vec<u32> = (1000..1010).map(|k| b.frames_in(k)).collect();
        assert!(n.iter().all(|&k| k == 1455 || k == 1456), "{n:?}");
        assert_eq!(n.iter().sum::<u32>(), 14553);
        assert_eq!(b.block(1001).len(), n[1] as usize * 2);
    }

    /// The tone is the same sine whether a block is copied from the period table (integral
    /// tone) or computed (fractional tone), and consecutive buckets join without a step.
    #[test]
    fn audio_tone_from_the_table_matches_the_sine_at_todays_sample_numbers() {
        let bucket = 1_764_900_000_000 / 33; // a bucket of 2025-12, ms / bucket-ms
        for (rate, hz, table) in [
            (48_000, 440.0, 1200),
            (44_100, 1000.0, 441),
            (48_000, 440.5, 0),
        ] {
            let a = SyntheticAudio::new("a", rate, 1, hz, 33, Arc::new(SystemClock));
            assert_eq!(a.period.len(), table, "{rate} Hz, tone {hz}");
            let first = bucket * 33 * rate as i64 / 1000;
            let pcm: Vec<i16> = [a.block(bucket), a.block(bucket + 1)]
                .concat()
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]))
                .collect();
            // Two seconds hold whole cycles of each of these tones: the phase of sample k is that
            // of k mod 2 * rate, small enough to compute exactly.
            let whole = 2 * rate as i64;
            for (i, &got) in pcm.iter().enumerate() {
                let k = (first + i as i64) % whole;
                let want = (2.0 * PI * (k as f64 * hz / rate as f64).fract()).sin() * 8192.0;
                assert!(
                    (got as f64 - want).abs() <= 2.0,
                    "{hz} Hz sample {i}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn nmea_sentence_checksum_and_date() {
        // 2021-03-04T05:06:07.89Z
        let s = rmc_sentence(1_614_834_367_890_000_000, 0);
        assert!(s.starts_with("$GPRMC,050607.89,A,"), "{s}");
        assert!(s.contains(",040321,"), "{s}");
        let (body, sum) = s[1..].split_once('*').unwrap();
        assert_eq!(
            u8::from_str_radix(sum, 16).unwrap(),
            nmea_checksum(body.as_bytes())
        );
    }
}
