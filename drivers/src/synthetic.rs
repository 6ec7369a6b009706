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

use bytes::Bytes;
use std::f64::consts::PI;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{FrameClock, FrameSink, Media, Source, SourceError, StopFlag};

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
        let mut pacer = Pacer::new(Duration::from_secs_f64(1.0 / self.fps));
        let media = Media::Camera {
            width: self.width,
            height: self.height,
        };
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
        }
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
            // Fell behind by more than a bucket (suspended process): the lost blocks are drops.
            let current = self.clock.now().ns.div_euclid(width_ns);
            if current > bucket {
                sink.health().add_drops((current - bucket) as u64);
                bucket = current;
            }
        }
    }
}

/// NMEA 0183 `$GPRMC` sentences with valid checksums at a fixed rate, one record per sentence.
pub struct SyntheticSerial {
    id: String,
    rate_hz: f64,
    clock: Arc<dyn FrameClock>,
}

impl SyntheticSerial {
    pub fn new(id: &str, rate_hz: f64, clock: Arc<dyn FrameClock>) -> Self {
        Self {
            id: id.to_string(),
            rate_hz,
            clock,
        }
    }
}

/// The XOR checksum of an NMEA sentence body (between `$` and `*`).
pub fn nmea_checksum(body: &[u8]) -> u8 {
    body.iter().fold(0u8, |acc, b| acc ^ b)
}

/// A `$GPRMC` sentence for time `ns` (UTC) and sample `n`, without the trailing CRLF.
pub fn rmc_sentence(ns: i64, n: u64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let centis = ns.rem_euclid(1_000_000_000) / 10_000_000;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let lat = 4807.038 + (n % 1000) as f64 * 0.001;
    let body = format!(
        "GPRMC,{:02}{:02}{:02}.{:02},A,{:08.3},N,01131.000,E,022.4,084.4,{:02}{:02}{:02},003.1,W",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        centis,
        lat,
        d,
        m,
        y % 100
    );
    format!("${body}*{:02X}", nmea_checksum(body.as_bytes()))
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
            let line = rmc_sentence(stamp.ns, sink.next_seq());
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
