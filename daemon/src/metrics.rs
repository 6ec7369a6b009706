//! Live measurements behind the status page and `/metrics` that plain counters do not give: the
//! publish-latency histogram, each source's preview (latest camera frame, audio level, last serial
//! records) and rates computed from counters over time.
//!
//! The lane task writes the histogram and the preview on its hot path, so both are cheap there: the
//! histogram is a fixed array of atomics (one `fetch_add` per receipt), and the preview keeps a
//! reference to a frame's payload (a `Bytes` clone, never a copy) at most a few times per second.
//! Rates are computed by the status reader from counter samples it keeps itself.

use bytes::Bytes;
use rigd_drivers::{AudioLevel, Frame, Media};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bucket mantissas per decade (log-linear: 12 steps per power of ten, at most a third apart).
const MANTISSAS: [u64; 12] = [10, 12, 15, 20, 25, 30, 40, 50, 60, 70, 80, 90];
/// Decades covered: 10 µs up to 900 s (above: the overflow bucket).
const DECADES: usize = 8;
const BUCKETS: usize = MANTISSAS.len() * DECADES;

/// Upper bounds (inclusive, microseconds) of the histogram's buckets.
const BOUNDS_US: [u64; BUCKETS] = bounds();

const fn bounds() -> [u64; BUCKETS] {
    let mut b = [0u64; BUCKETS];
    let mut d = 0;
    let mut scale = 1u64;
    while d < DECADES {
        let mut m = 0;
        while m < MANTISSAS.len() {
            b[d * MANTISSAS.len() + m] = MANTISSAS[m] * scale;
            m += 1;
        }
        scale *= 10;
        d += 1;
    }
    b
}

/// Lock-free histogram of publish latencies (submission to broker receipt).
#[derive(Debug)]
pub struct LatencyHistogram {
    /// `counts[i]`: samples <= `BOUNDS_US[i]` and above the previous bound; the last is overflow.
    counts: [AtomicU64; BUCKETS + 1],
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    pub fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let i = BOUNDS_US.partition_point(|&b| b < us);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// A copy of a histogram's buckets (per-bucket counts, not cumulative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub counts: Vec<u64>,
    pub sum_us: u64,
}

impl Default for LatencySnapshot {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS + 1],
            sum_us: 0,
        }
    }
}

impl LatencySnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn add(&mut self, other: &LatencySnapshot) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_us += other.sum_us;
    }

    /// What was recorded after `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &LatencySnapshot) -> LatencySnapshot {
        LatencySnapshot {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
        }
    }

    /// The `q` quantile (0..=1), interpolated linearly inside its bucket; `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            if (seen + c) as f64 >= rank {
                let lo = if i == 0 { 0 } else { BOUNDS_US[i - 1] };
                let Some(&hi) = BOUNDS_US.get(i) else {
                    // Overflow bucket: all we know is "above the last bound".
                    return Some(Duration::from_micros(lo));
                };
                let frac = (rank - seen as f64) / c as f64;
                let us = lo as f64 + frac * (hi - lo) as f64;
                return Some(Duration::from_micros(us.round() as u64));
            }
            seen += c;
        }
        None
    }

    /// The Prometheus view: cumulative counts at every 1, 2.5 and 5 of each decade (seconds).
    /// Cumulative counts at a subset of the bounds are exact.
    pub fn to_web(&self) -> rigd_web::Histogram {
        let mut bounds_s = Vec::new();
        let mut cumulative = Vec::new();
        let mut acc = 0u64;
        for (i, &b) in BOUNDS_US.iter().enumerate() {
            acc += self.counts[i];
            if matches!(MANTISSAS[i % MANTISSAS.len()], 10 | 25 | 50) {
                bounds_s.push(b as f64 / 1e6);
                cumulative.push(acc);
            }
        }
        rigd_web::Histogram {
            bounds_s,
            cumulative,
            count: self.count(),
            sum_s: self.sum_us as f64 / 1e6,
        }
    }
}

/// Latency quantiles over a recent window (30 to 60 s), from snapshots of a cumulative histogram:
/// the window restarts every 30 s from the snapshot taken at the previous restart.
#[derive(Debug, Default)]
pub struct RecentLatency {
    base: Option<LatencySnapshot>,
    next: Option<(Instant, LatencySnapshot)>,
}

impl RecentLatency {
    const STEP: Duration = Duration::from_secs(30);

    /// What was recorded in the window ending with `now_snapshot`.
    pub fn window(&mut self, now: Instant, now_snapshot: &LatencySnapshot) -> LatencySnapshot {
        match &self.next {
            None => self.next = Some((now, now_snapshot.clone())),
            Some((t, snap)) if now.duration_since(*t) >= Self::STEP => {
                self.base = Some(snap.clone());
                self.next = Some((now, now_snapshot.clone()));
            }
            Some(_) => {}
        }
        match &self.base {
            Some(base) => now_snapshot.since(base),
            None => now_snapshot.clone(),
        }
    }
}

/// Serial records kept per source for the page.
pub const PREVIEW_RECORDS: usize = 8;
/// CAN records kept for the status page: a second of 33 ms buckets.
const PREVIEW_CAN_RECORDS: usize = 30;
/// A serial record is shown up to this many bytes.
const PREVIEW_RECORD_BYTES: usize = 160;
/// Camera frames and audio levels are taken at most this often.
const PREVIEW_EVERY_NS: i64 = 250_000_000;
/// Larger camera frames are not kept for the preview (a thumbnail must stay cheap to fetch).
pub const PREVIEW_MAX_JPEG: usize = 4 << 20;

/// The latest look at one source: updated by its lane, read by the web UI.
#[derive(Debug, Default)]
pub struct Preview {
    /// Capture time of the last sampled camera frame or audio block (throttles the lane's work).
    last_sample_ns: AtomicI64,
    inner: Mutex<PreviewState>,
    /// An H.264 camera's still: the last keyframe decoded and made a JPEG, by the first page that
    /// asks for it after it arrives (apart from `inner`: the lane never waits on a decode).
    still: Mutex<Option<(u64, Bytes)>>,
}

#[derive(Debug, Default)]
struct PreviewState {
    jpeg: Option<(u64, Bytes)>,
    /// An H.264 camera's last keyframe access unit (SPS, PPS, IDR).
    keyframe: Option<(u64, Bytes)>,
    level: Option<AudioLevel>,
    records: VecDeque<(i64, bool, Bytes)>,
    /// A CAN source's last records (about a second of the bus), decoded only when the status
    /// page asks (`crate::can::status_lines`).
    can: VecDeque<Bytes>,
}

/// The latest camera frame of a source.
#[derive(Debug, Clone)]
pub struct PreviewJpeg {
    pub seq: u64,
    pub jpeg: Bytes,
}

impl Preview {
    /// Looks at a frame on its way through the lane. Serial records are all kept (they are few and
    /// small); camera frames and audio blocks are sampled at most every 250 ms of capture time.
    pub fn offer(&self, frame: &Frame) {
        if let Media::Can { .. } = frame.media {
            if let Ok(mut s) = self.inner.lock() {
                if s.can.len() == PREVIEW_CAN_RECORDS {
                    s.can.pop_front();
                }
                s.can.push_back(frame.payload.clone());
            }
            return;
        }
        if let Media::Serial { text } = frame.media {
            let cut = frame.payload.len().min(PREVIEW_RECORD_BYTES);
            if let Ok(mut s) = self.inner.lock() {
                if s.records.len() == PREVIEW_RECORDS {
                    s.records.pop_front();
                }
                s.records
                    .push_back((frame.capture_ns, text, frame.payload.slice(..cut)));
            }
            return;
        }
        if let Media::Camera {
            codec: rigd_drivers::Codec::H264,
            keyframe,
            ..
        } = frame.media
        {
            // Every keyframe is kept (a clone of its bytes): one a second, and the only frames
            // that decode alone.
            if keyframe && frame.payload.len() <= PREVIEW_MAX_JPEG {
                if let Ok(mut s) = self.inner.lock() {
                    s.keyframe = Some((frame.seq, frame.payload.clone()));
                }
            }
            return;
        }
        let last = self.last_sample_ns.load(Ordering::Relaxed);
        // Absolute difference: a clock step backwards must not freeze the preview.
        if last != 0 && (frame.capture_ns - last).unsigned_abs() < PREVIEW_EVERY_NS as u64 {
            return;
        }
        self.last_sample_ns
            .store(frame.capture_ns, Ordering::Relaxed);
        match frame.media {
            Media::Camera {
                codec: rigd_drivers::Codec::Jpeg,
                ..
            } if frame.payload.len() <= PREVIEW_MAX_JPEG => {
                if let Ok(mut s) = self.inner.lock() {
                    s.jpeg = Some((frame.seq, frame.payload.clone()));
                }
            }
            Media::Audio { .. } => {
                let level = AudioLevel::of_s16le(&frame.payload);
                if let Ok(mut s) = self.inner.lock() {
                    s.level = Some(level);
                }
            }
            _ => {}
        }
    }

    /// The latest picture as a JPEG: a JPEG camera's sampled frame, or an H.264 camera's last
    /// keyframe decoded on the caller's thread (once per keyframe, whoever asks first; the web
    /// UI asks from a blocking task).
    pub fn jpeg(&self) -> Option<PreviewJpeg> {
        let (jpeg, keyframe) = {
            let s = self.inner.lock().ok()?;
            (s.jpeg.clone(), s.keyframe.clone())
        };
        if let Some((seq, jpeg)) = jpeg {
            return Some(PreviewJpeg { seq, jpeg });
        }
        let (seq, au) = keyframe?;
        let mut still = self.still.lock().ok()?;
        if let Some((done, jpeg)) = still.as_ref().filter(|(done, _)| *done == seq) {
            return Some(PreviewJpeg {
                seq: *done,
                jpeg: jpeg.clone(),
            });
        }
        let jpeg = match still_of_keyframe(&au) {
            Ok(jpeg) => Bytes::from(jpeg),
            Err(e) => {
                tracing::debug!(seq, error = %e, "preview: keyframe not decodable");
                return None;
            }
        };
        *still = Some((seq, jpeg.clone()));
        Some(PreviewJpeg { seq, jpeg })
    }

    /// The sequence number of the frame [`Preview::jpeg`] would show.
    pub fn jpeg_seq(&self) -> Option<u64> {
        let s = self.inner.lock().ok()?;
        s.jpeg.as_ref().or(s.keyframe.as_ref()).map(|(seq, _)| *seq)
    }

    /// The level of the last sampled audio block.
    pub fn level(&self) -> Option<AudioLevel> {
        self.inner.lock().ok()?.level
    }

    /// The last serial records, oldest first, as display text (binary records as hex).
    /// A CAN source's last records, oldest first.
    pub fn can_records(&self) -> Vec<Bytes> {
        self.inner
            .lock()
            .map(|s| s.can.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn records(&self) -> Vec<String> {
        let Ok(s) = self.inner.lock() else {
            return Vec::new();
        };
        s.records
            .iter()
            .map(|(_, text, b)| display_record(*text, b))
            .collect()
    }
}

/// A keyframe access unit as a JPEG (quality 80).
fn still_of_keyframe(au: &[u8]) -> Result<Vec<u8>, String> {
    let p = rigd_drivers::h264::decode_keyframe(au).map_err(|e| e.to_string())?;
    let mut jpeg = Vec::new();
    rigd_drivers::camera::i420_to_jpeg(p.width, p.height, &p.i420, 80, &mut jpeg)
        .map_err(|e| e.to_string())?;
    Ok(jpeg)
}

/// Printable text for a serial record: line endings trimmed, control characters escaped.
fn display_record(text: bool, b: &[u8]) -> String {
    if !text {
        return b
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" ");
    }
    let s = String::from_utf8_lossy(b);
    s.trim_end_matches(['\r', '\n'])
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// A counter's rate of change per second over the last few seconds, from samples taken whenever
/// status is read.
#[derive(Debug, Default)]
pub struct CounterRate {
    samples: VecDeque<(Instant, u64)>,
}

impl CounterRate {
    const MIN_SPACING: Duration = Duration::from_millis(200);
    const WINDOW: Duration = Duration::from_secs(5);
    const MIN_SPAN: Duration = Duration::from_millis(500);

    /// Records `value` at `now` and returns the rate since the oldest sample in the window; `None`
    /// until the samples span half a second. A counter that went backwards restarts the window.
    pub fn observe(&mut self, now: Instant, value: u64) -> Option<f64> {
        if self.samples.back().is_some_and(|&(_, v)| v > value) {
            self.samples.clear();
        }
        if self
            .samples
            .back()
            .is_none_or(|&(t, _)| now.duration_since(t) >= Self::MIN_SPACING)
        {
            self.samples.push_back((now, value));
        }
        // Keep one sample at least WINDOW old so that the rate covers the whole window.
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= Self::WINDOW {
            self.samples.pop_front();
        }
        let &(t0, v0) = self.samples.front()?;
        let span = now.duration_since(t0);
        (span >= Self::MIN_SPAN).then(|| (value - v0) as f64 / span.as_secs_f64())
    }
}

/// What status keeps between reads to turn counters into rates and windows.
#[derive(Debug, Default)]
pub struct Observed {
    rates: HashMap<(String, &'static str), CounterRate>,
    pub latency: RecentLatency,
}

impl Observed {
    /// The rate of counter `what` of `owner` (a source id, or "" for rig-wide counters).
    pub fn rate(
        &mut self,
        owner: &str,
        what: &'static str,
        now: Instant,
        value: u64,
    ) -> Option<f64> {
        self.rates
            .entry((owner.to_string(), what))
            .or_default()
            .observe(now, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigd_drivers::ClockState;
    use std::sync::Arc;

    #[test]
    fn bounds_are_increasing_and_log_linear() {
        assert_eq!(BOUNDS_US[0], 10);
        assert_eq!(BOUNDS_US[12], 100);
        assert_eq!(*BOUNDS_US.last().unwrap(), 900_000_000);
        assert!(BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
        assert!(BOUNDS_US.windows(2).all(|w| w[1] * 3 <= w[0] * 4));
    }

    #[test]
    fn quantiles_are_within_a_bucket_of_the_truth() {
        let h = LatencyHistogram::default();
        for ms in 1..=1000u64 {
            h.record(Duration::from_millis(ms));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 1000);
        let p50 = s.quantile(0.5).unwrap().as_secs_f64() * 1e3;
        let p99 = s.quantile(0.99).unwrap().as_secs_f64() * 1e3;
        assert!((p50 - 500.0).abs() / 500.0 < 0.2, "p50 {p50}");
        assert!((p99 - 990.0).abs() / 990.0 < 0.2, "p99 {p99}");
        assert_eq!(LatencySnapshot::default().quantile(0.5), None);
    }

    #[test]
    fn overflow_and_zero_latencies_are_counted() {
        let h = LatencyHistogram::default();
        h.record(Duration::ZERO);
        h.record(Duration::from_secs(3600));
        let s = h.snapshot();
        assert_eq!(s.counts[0], 1);
        assert_eq!(s.counts[BUCKETS], 1);
        let w = s.to_web();
        assert_eq!(w.count, 2);
        assert_eq!(*w.cumulative.last().unwrap(), 1, "+Inf holds the other one");
        assert_eq!(w.bounds_s.len(), w.cumulative.len());
        assert!((w.bounds_s[0] - 0.00001).abs() < 1e-12);
    }

    #[test]
    fn recent_window_forgets_old_samples() {
        let h = LatencyHistogram::default();
        let mut r = RecentLatency::default();
        let t0 = Instant::now();
        h.record(Duration::from_secs(10));
        assert_eq!(r.window(t0, &h.snapshot()).count(), 1);
        // 31 s later the window restarts at t0's snapshot; 62 s later the old sample is gone.
        h.record(Duration::from_millis(1));
        assert_eq!(
            r.window(t0 + Duration::from_secs(31), &h.snapshot())
                .count(),
            1
        );
        let w = r.window(t0 + Duration::from_secs(62), &h.snapshot());
        assert_eq!(w.count(), 0);
    }

    #[test]
    fn rate_over_the_window() {
        let mut c = CounterRate::default();
        let t0 = Instant::now();
        assert_eq!(c.observe(t0, 0), None);
        let r = c.observe(t0 + Duration::from_secs(1), 30).unwrap();
        assert!((r - 30.0).abs() < 1e-9);
        let mut last = None;
        for i in 2..20u64 {
            last = c.observe(t0 + Duration::from_secs(i), 30 * i);
        }
        assert!((last.unwrap() - 30.0).abs() < 1e-9);
        assert!(c.samples.len() <= 7, "{}", c.samples.len());
        // A counter reset restarts the window instead of going negative.
        assert_eq!(c.observe(t0 + Duration::from_secs(21), 0), None);
    }

    fn frame(seq: u64, ns: i64, media: Media, payload: &[u8]) -> Frame {
        Frame {
            source: Arc::from("s"),
            seq,
            capture_ns: ns,
            clock: ClockState::Unsynced,
            media,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn preview_samples_camera_frames_a_few_times_per_second() {
        let p = Preview::default();
        let cam = Media::jpeg(1, 1);
        for i in 0..30u64 {
            // 30 frames over one second
            p.offer(&frame(
                i,
                1_000_000_000 + i as i64 * 33_333_333,
                cam.clone(),
                b"jpeg",
            ));
        }
        // Sampled at 0, 250, 500, 750 ms (+ one frame period): the latest sample is frame 24.
        assert_eq!(p.jpeg_seq(), Some(24));
        assert_eq!(&p.jpeg().unwrap().jpeg[..], b"jpeg");
    }

    #[test]
    fn preview_keeps_the_last_serial_records_and_audio_level() {
        let p = Preview::default();
        for i in 0..20 {
            let line = format!("$GPRMC,{i}*00\r\n");
            p.offer(&frame(
                i,
                i as i64,
                Media::Serial { text: true },
                line.as_bytes(),
            ));
        }
        let r = p.records();
        assert_eq!(r.len(), PREVIEW_RECORDS);
        assert_eq!(r.last().unwrap(), "$GPRMC,19*00");
        p.offer(&frame(0, 5, Media::Serial { text: false }, &[0, 0xff]));
        assert_eq!(p.records().last().unwrap(), "00 ff");
        p.offer(&frame(1, 6, Media::Serial { text: true }, b"a\x07b"));
        assert_eq!(p.records().last().unwrap(), "a\\u{7}b");

        let pcm: Vec<u8> = [16384i16, -16384]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        let audio = Media::Audio {
            sample_rate: 48000,
            channels: 2,
            frames: 1,
        };
        p.offer(&frame(0, 1_000_000_000, audio, &pcm));
        let l = p.level().unwrap();
        assert!((l.peak - 0.5).abs() < 1e-6);
    }
}
