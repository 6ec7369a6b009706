//! Audio capture (`cpal` on ALSA): PCM cut into one block per time bucket, stamped at the bucket
//! start, as interleaved S16LE — the same wire format as the synthetic audio source.
//!
//! The [`BlockAligner`] (pure) owns the alignment. Within a run the sample count is the timeline:
//! frame `k` is at `t0 + k / rate`, `t0` taken from the stream's capture timestamp of the first
//! period (ALSA's hardware timestamp where the device has one, mapped to the rig clock). Every
//! period's capture timestamp is compared with that prediction:
//! - the difference is smoothed and tracks the drift between the device's sample clock and the rig
//!   clock; when the start of a block drifts more than 0.5 ms from its bucket start, that block is
//!   made one frame shorter or longer (`frames` property), so blocks stay within 0.5 ms of their
//!   bucket boundaries without dropping or inventing samples (timestamp jitter is smoothed away);
//! - a jump of more than `max-skew` (lost samples after an overrun, a step of the rig clock) or an
//!   xrun re-anchors: the partial block and every bucket skipped are counted as drops and capture
//!   resumes at the next bucket boundary.

use serde::Deserialize;

/// Sample format the device is opened with (`sample-format` key); blocks are always S16LE.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SampleFormat {
    #[default]
    I16,
    I32,
    F32,
}

/// Everything the audio driver needs to open and align a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioSettings {
    /// ALSA PCM name: `default`, `hw:CARD=USB,DEV=0`, `plughw:1,0`, or one defined in asoundrc.
    pub device: String,
    pub sample_rate: u32,
    pub channels: u16,
    pub sample_format: SampleFormat,
    /// ALSA period in frames; `None`: the device's default.
    pub period_frames: Option<u32>,
    /// Largest jump between predicted and reported capture time that is still followed smoothly.
    pub max_skew_ms: u32,
    pub bucket_ms: u32,
}

/// One aligned block: the frames whose time falls in `bucket`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub bucket: i64,
    /// The bucket start (rig clock, ns).
    pub stamp_ns: i64,
    pub frames: u32,
    /// Interleaved samples, `frames * channels`.
    pub samples: Vec<i16>,
}

/// Sample frames in bucket `bucket` at `rate` Hz: those whose nominal index, counted from the
/// epoch, falls in it: `floor((b+1)·w·r/1000) − floor(b·w·r/1000)` for a bucket of `w` ms. When a
/// bucket holds a whole number of samples that is it; otherwise it is the floor or the ceiling,
/// in the proportion that keeps every block inside its bucket (44.1 kHz at 33 ms: 1455 or 1456,
/// 1455.3 on average), and a block's `frames` property says which.
pub fn frames_in_bucket(rate: u32, bucket_ms: u32, bucket: i64) -> u32 {
    let start = |b: i64| (b as i128 * bucket_ms as i128 * rate as i128).div_euclid(1000);
    (start(bucket + 1) - start(bucket)) as u32
}

/// Cuts a stream of timestamped periods into bucket-aligned blocks; pure.
#[derive(Debug)]
pub struct BlockAligner {
    channels: usize,
    frame_ns: f64,
    bucket_ns: i64,
    sample_rate: u32,
    bucket_ms: u32,
    max_skew_ns: f64,
    /// Frames a block start may sit off its bucket start before a block is lengthened or shortened.
    deadband: f64,
    /// Model time (rig ns) of the next frame to arrive; `None` until anchored.
    next_ns: Option<f64>,
    /// Smoothed (reported - model) capture time.
    skew_ns: f64,
    /// Frames still to skip before the first bucket boundary after an anchor.
    skip: u64,
    bucket: i64,
    /// Length of the block being filled (frames).
    target: usize,
    block: Vec<i16>,
}

impl BlockAligner {
    pub fn new(sample_rate: u32, channels: u16, bucket_ms: u32, max_skew_ms: u32) -> Self {
        let frames_per_block = (sample_rate as u64 * bucket_ms as u64).div_ceil(1000) as usize;
        Self {
            channels: channels.max(1) as usize,
            frame_ns: 1e9 / sample_rate.max(1) as f64,
            bucket_ns: bucket_ms.max(1) as i64 * 1_000_000,
            sample_rate,
            bucket_ms: bucket_ms.max(1),
            max_skew_ns: max_skew_ms as f64 * 1e6,
            deadband: sample_rate as f64 / 2000.0,
            next_ns: None,
            skew_ns: 0.0,
            skip: 0,
            bucket: 0,
            target: 0,
            block: Vec::with_capacity(frames_per_block.max(1) * channels as usize + 8),
        }
    }

    /// Forgets the timeline (after an xrun): the next period re-anchors. Returns the drops.
    pub fn resync(&mut self) -> u64 {
        self.next_ns = None;
        let partial = !self.block.is_empty();
        self.block.clear();
        u64::from(partial)
    }

    /// Feeds one period whose first frame was captured at `capture_ns` (rig clock); complete blocks
    /// go to `out`. Returns the drops (blocks lost to a re-anchor).
    pub fn push(&mut self, capture_ns: i64, samples: &[i16], out: &mut Vec<Block>) -> u64 {
        let frames = samples.len() / self.channels;
        let mut drops = 0;
        if let Some(next) = self.next_ns {
            let skew = capture_ns as f64 - next;
            if (skew - self.skew_ns).abs() > self.max_skew_ns {
                let old_bucket = self.bucket;
                let partial = !self.block.is_empty();
                self.block.clear();
                self.anchor(capture_ns);
                drops = if self.bucket > old_bucket {
                    (self.bucket - old_bucket) as u64
                } else {
                    u64::from(partial)
                };
            } else {
                self.skew_ns += (skew - self.skew_ns) / 32.0;
            }
        } else {
            self.anchor(capture_ns);
        }
        let start_ns = self.next_ns.unwrap_or(capture_ns as f64);
        let mut i = 0;
        while i < frames {
            if self.skip > 0 {
                let s = self.skip.min((frames - i) as u64);
                self.skip -= s;
                i += s as usize;
                continue;
            }
            if self.block.is_empty() {
                self.target = self.block_len(start_ns + i as f64 * self.frame_ns);
            }
            let have = self.block.len() / self.channels;
            let take = (self.target - have).min(frames - i);
            self.block
                .extend_from_slice(&samples[i * self.channels..(i + take) * self.channels]);
            i += take;
            if self.block.len() / self.channels == self.target {
                out.push(Block {
                    bucket: self.bucket,
                    stamp_ns: self.bucket * self.bucket_ns,
                    frames: self.target as u32,
                    samples: std::mem::replace(
                        &mut self.block,
                        Vec::with_capacity((self.target + 1) * self.channels),
                    ),
                });
                self.bucket += 1;
            }
        }
        self.next_ns = Some(start_ns + frames as f64 * self.frame_ns);
        drops
    }

    /// Starts the timeline at `capture_ns`: the first block is the next bucket that starts at or
    /// after it.
    fn anchor(&mut self, capture_ns: i64) {
        let first = (capture_ns - 1).div_euclid(self.bucket_ns) + 1;
        let gap_ns = (first * self.bucket_ns - capture_ns) as f64;
        self.skip = (gap_ns / self.frame_ns).ceil() as u64;
        self.bucket = first;
        self.next_ns = Some(capture_ns as f64);
        self.skew_ns = 0.0;
    }

    /// Length of the block for `self.bucket` whose first frame is at model time `first_ns`.
    fn block_len(&self, first_ns: f64) -> usize {
        let start = (self.bucket * self.bucket_ns) as f64;
        let phase = (first_ns + self.skew_ns - start) / self.frame_ns;
        let n = frames_in_bucket(self.sample_rate, self.bucket_ms, self.bucket) as i64;
        (if phase >= 1.0 + self.deadband {
            n - 1
        } else if phase < -self.deadband {
            n + 1
        } else {
            n
        })
        .max(1) as usize
    }
}

/// Interleaved samples to little-endian bytes (the wire payload).
pub fn s16le_bytes(samples: &[i16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(samples.len() * 2);
    for s in samples {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// f32 (full scale ±1.0) to i16, rounding, clipped.
pub fn f32_to_s16(x: f32) -> i16 {
    (x * 32768.0).round().clamp(-32768.0, 32767.0) as i16
}

#[cfg(feature = "audio")]
pub use device::AudioSource;

#[cfg(not(feature = "audio"))]
pub use unavailable::AudioSource;

#[cfg(feature = "audio")]
mod device {
    use bytes::Bytes;
    use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc::{sync_channel, RecvTimeoutError};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::{f32_to_s16, s16le_bytes, AudioSettings, Block, BlockAligner, SampleFormat};
    use crate::{AudioLevel, FrameClock, FrameSink, Media, SourceError, StopFlag};

    /// No samples for this long: the device is stuck or gone; reopen it.
    const STALL: Duration = Duration::from_secs(2);

    /// One period as the ALSA thread hands it over.
    struct Period {
        /// CLOCK_MONOTONIC ns of the period's first frame.
        capture_mono_ns: i64,
        samples: Vec<i16>,
        /// Xruns seen so far (the aligner re-anchors when it changes).
        xruns: u64,
    }

    /// An ALSA capture device.
    pub struct AudioSource {
        id: String,
        settings: AudioSettings,
        clock: Arc<dyn FrameClock>,
        last_xrun_log: Option<Instant>,
    }

    impl AudioSource {
        pub fn new(id: &str, settings: AudioSettings, clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                settings,
                clock,
                last_xrun_log: None,
            }
        }

        fn device_error(&self, message: String, retryable: bool) -> SourceError {
            SourceError::Device {
                source_id: self.id.clone(),
                device: self.settings.device.clone(),
                message,
                retryable,
            }
        }

        fn open_device(&self) -> Result<cpal::Device, SourceError> {
            let host = cpal::default_host();
            let name = self.settings.device.as_str();
            let found = if name == "default" {
                host.default_input_device()
            } else {
                host.device_by_id(&cpal::DeviceId::new(cpal::HostId::Alsa, name))
                    .or_else(|| {
                        // Also accept the card's description, e.g. "USB Audio Device".
                        host.input_devices().ok()?.find(|d| {
                            d.description()
                                .is_ok_and(|desc| desc.name().lines().next() == Some(name))
                        })
                    })
            };
            // Not there (yet): a USB device may come back.
            found.ok_or_else(|| self.device_error("no such ALSA capture device".into(), true))
        }
    }

    fn convert(data: &cpal::Data, format: SampleFormat) -> Option<Vec<i16>> {
        Some(match format {
            SampleFormat::I16 => data.as_slice::<i16>()?.to_vec(),
            SampleFormat::I32 => data
                .as_slice::<i32>()?
                .iter()
                .map(|&s| (s >> 16) as i16)
                .collect(),
            SampleFormat::F32 => data
                .as_slice::<f32>()?
                .iter()
                .map(|&s| f32_to_s16(s))
                .collect(),
        })
    }

    impl crate::Source for AudioSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
            let s = self.settings.clone();
            let device = self.open_device()?;
            let config = cpal::StreamConfig {
                channels: s.channels,
                sample_rate: s.sample_rate,
                buffer_size: match s.period_frames {
                    Some(n) => cpal::BufferSize::Fixed(n),
                    None => cpal::BufferSize::Default,
                },
            };
            let format = match s.sample_format {
                SampleFormat::I16 => cpal::SampleFormat::I16,
                SampleFormat::I32 => cpal::SampleFormat::I32,
                SampleFormat::F32 => cpal::SampleFormat::F32,
            };
            // About a second of periods in flight; beyond that the ALSA thread blocks, the
            // device's ring buffer overruns and ALSA reports the xrun (counted below).
            let (tx, rx) = sync_channel::<Period>(64);
            let xruns = Arc::new(AtomicU64::new(0));
            let fatal: Arc<Mutex<Option<String>>> = Arc::default();
            let data_xruns = xruns.clone();
            let wanted = s.sample_format;
            let on_data = move |data: &cpal::Data, info: &cpal::InputCallbackInfo| {
                let ts = info.timestamp();
                // Stream instants count from the stream's creation; only their difference (the
                // frames still in the buffer) is used, against CLOCK_MONOTONIC now.
                let delay = ts.callback.as_nanos().saturating_sub(ts.capture.as_nanos());
                let capture_mono_ns = crate::monotonic_ns_now() - delay as i64;
                if let Some(samples) = convert(data, wanted) {
                    let _ = tx.send(Period {
                        capture_mono_ns,
                        samples,
                        xruns: data_xruns.load(Ordering::Relaxed),
                    });
                }
            };
            let (err_xruns, err_fatal) = (xruns.clone(), fatal.clone());
            let on_error = move |e: cpal::Error| match e.kind() {
                cpal::ErrorKind::Xrun => {
                    err_xruns.fetch_add(1, Ordering::Relaxed);
                }
                cpal::ErrorKind::RealtimeDenied | cpal::ErrorKind::DeviceChanged => {}
                _ => {
                    if let Ok(mut f) = err_fatal.lock() {
                        f.get_or_insert_with(|| e.to_string());
                    }
                }
            };
            let stream = device
                .build_input_stream_raw(config, format, on_data, on_error, None)
                .map_err(|e| {
                    let retryable = !matches!(
                        e.kind(),
                        cpal::ErrorKind::UnsupportedConfig | cpal::ErrorKind::InvalidInput
                    );
                    self.device_error(format!("cannot open the stream: {e}"), retryable)
                })?;
            stream
                .play()
                .map_err(|e| self.device_error(format!("cannot start: {e}"), true))?;
            tracing::info!(source = %self.id, device = %s.device, rate = s.sample_rate, channels = s.channels,
                format = ?s.sample_format, "audio: capturing");

            let mut aligner =
                BlockAligner::new(s.sample_rate, s.channels, s.bucket_ms, s.max_skew_ms);
            let mut blocks: Vec<Block> = Vec::new();
            let mut seen_xruns = 0;
            let mut last_data = Instant::now();
            let result = loop {
                if stop.is_raised() {
                    break Ok(());
                }
                if let Some(msg) = fatal.lock().ok().and_then(|f| f.clone()) {
                    break Err(self.device_error(msg, true));
                }
                let period = match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(p) => p,
                    Err(RecvTimeoutError::Timeout) if last_data.elapsed() < STALL => continue,
                    Err(RecvTimeoutError::Timeout) => {
                        break Err(self.device_error(format!("no samples for {STALL:?}"), true))
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        break Err(self.device_error("the capture thread ended".into(), true))
                    }
                };
                last_data = Instant::now();
                let mut drops = 0;
                if period.xruns != seen_xruns {
                    drops += aligner.resync();
                    self.log_xruns(period.xruns - seen_xruns);
                    seen_xruns = period.xruns;
                }
                let stamp = self.clock.map_monotonic(period.capture_mono_ns);
                drops += aligner.push(stamp.ns, &period.samples, &mut blocks);
                if drops > 0 {
                    sink.health().add_drops(drops);
                }
                for b in blocks.drain(..) {
                    sink.health()
                        .set_audio_level(AudioLevel::of_s16(&b.samples));
                    let media = Media::Audio {
                        sample_rate: s.sample_rate,
                        channels: s.channels,
                        frames: b.frames,
                    };
                    let stamp = crate::Stamp {
                        ns: b.stamp_ns,
                        state: stamp.state,
                    };
                    if sink
                        .emit(stamp, media, Bytes::from(s16le_bytes(&b.samples)))
                        .is_err()
                    {
                        drop(rx);
                        return Err(SourceError::PipelineClosed {
                            source_id: self.id.clone(),
                        });
                    }
                }
            };
            // The receiver goes first so a callback blocked on a full channel returns, then the
            // stream (joining the ALSA thread).
            drop(rx);
            drop(stream);
            result
        }
    }

    impl AudioSource {
        fn log_xruns(&mut self, n: u64) {
            let due = self
                .last_xrun_log
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
            if due {
                tracing::warn!(source = %self.id, xruns = n, "audio: overrun, samples lost; re-aligning");
                self.last_xrun_log = Some(Instant::now());
            }
        }
    }
}

#[cfg(not(feature = "audio"))]
mod unavailable {
    use std::sync::Arc;

    use super::AudioSettings;
    use crate::{FrameClock, FrameSink, Source, SourceError, StopFlag};

    /// Stand-in when rigd-drivers is built without the `audio` feature: fails for good.
    pub struct AudioSource {
        id: String,
        device: String,
    }

    impl AudioSource {
        pub fn new(id: &str, settings: AudioSettings, _clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                device: settings.device,
            }
        }
    }

    impl Source for AudioSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, _sink: &mut FrameSink, _stop: &StopFlag) -> Result<(), SourceError> {
            Err(SourceError::not_built(&self.id, &self.device, "audio"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: i64 = 33_000_000;

    /// Mono samples numbered from `first`.
    fn ramp(first: i64, n: usize) -> Vec<i16> {
        (0..n as i64).map(|i| (first + i) as i16).collect()
    }

    fn run(
        a: &mut BlockAligner,
        start_ns: i64,
        period: usize,
        periods: usize,
    ) -> (Vec<Block>, u64) {
        let mut out = Vec::new();
        let mut drops = 0;
        for p in 0..periods {
            let t = start_ns + (p * period) as i64 * 1_000_000_000 / 48_000;
            drops += a.push(t, &ramp((p * period) as i64, period), &mut out);
        }
        (out, drops)
    }

    #[test]
    fn blocks_start_at_the_next_bucket_and_hold_one_bucket() {
        let mut a = BlockAligner::new(48_000, 1, 33, 50);
        // First frame 10 ms into bucket 100: 23 ms = 1104 frames skipped.
        let (out, drops) = run(&mut a, 100 * W + 10_000_000, 480, 100);
        assert_eq!(drops, 0);
        assert!(out.len() >= 28, "{}", out.len());
        for (i, b) in out.iter().enumerate() {
            assert_eq!(b.bucket, 101 + i as i64);
            assert_eq!(b.stamp_ns, b.bucket * W);
            assert_eq!(b.frames, 1584);
            assert_eq!(b.samples.len(), 1584);
            assert_eq!(b.samples[0], (1104 + i * 1584) as i16, "block {i}");
        }
    }

    #[test]
    fn at_44_1_khz_every_block_holds_its_bucket_s_samples_and_none_is_lost_or_repeated() {
        // Issue 32: 44.1 kHz (most USB microphones) gives 1455.3 samples per 33 ms bucket and was
        // refused. 60 s of 441-frame periods, timed exactly; a realistic capture start (a
        // sample-clock phase off the bucket grid).
        let rate = 44_100u32;
        let mut a = BlockAligner::new(rate, 1, 33, 50);
        let start = 5_000 * W + 12_345_678;
        let mut out = Vec::new();
        let period = 441usize;
        for p in 0..6_000usize {
            let first = (p * period) as i64;
            let t = start + first * 1_000_000_000 / rate as i64;
            let samples: Vec<i16> = (first..first + period as i64).map(|i| i as i16).collect();
            assert_eq!(a.push(t, &samples, &mut out), 0);
        }
        assert!(out.len() >= 1815, "{}", out.len());
        let mut sizes = std::collections::BTreeSet::new();
        for (i, b) in out.iter().enumerate() {
            assert_eq!(b.bucket, out[0].bucket + i as i64, "block {i}");
            assert_eq!(b.stamp_ns, b.bucket * W);
            // Inside its bucket: its length is the bucket's share of samples.
            assert_eq!(b.frames, frames_in_bucket(rate, 33, b.bucket), "block {i}");
            assert_eq!(b.samples.len(), b.frames as usize);
            sizes.insert(b.frames);
            // Contiguous: no sample lost or repeated between blocks.
            if i > 0 {
                let prev = &out[i - 1];
                assert_eq!(
                    b.samples[0],
                    prev.samples[prev.samples.len() - 1].wrapping_add(1),
                    "block {i}"
                );
            }
        }
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), vec![1455, 1456]);
        // The first block starts at the first sample of its bucket.
        let first_ns = out[0].bucket * W - start;
        let first_sample = (first_ns as f64 * rate as f64 / 1e9).ceil() as i64;
        assert!((out[0].samples[0] as i64 - first_sample as i16 as i64).abs() <= 1);
    }

    #[test]
    fn a_period_straddling_several_buckets_is_split() {
        let mut a = BlockAligner::new(48_000, 2, 33, 50);
        let mut out = Vec::new();
        let samples: Vec<i16> = (0..48_000 * 2).map(|i| i as i16).collect();
        a.push(7 * W, &samples, &mut out);
        assert_eq!(out.len(), 30);
        assert_eq!(out[0].bucket, 7);
        assert_eq!(out[0].samples.len(), 1584 * 2);
        let joined: Vec<i16> = out.iter().flat_map(|b| b.samples.clone()).collect();
        assert_eq!(joined[..], samples[..joined.len()]);
    }

    #[test]
    fn slow_device_clock_shortens_a_block_now_and_then() {
        // The device runs 100 ppm slow against the rig clock: its frames arrive later and later.
        let mut a = BlockAligner::new(48_000, 1, 33, 50);
        let mut out = Vec::new();
        let mut drops = 0;
        let period = 480;
        for p in 0..3000 {
            let model = (p * period) as f64 * 1e9 / 48_000.0;
            let t = 1_000 * W + (model * (1.0 + 100e-6)) as i64;
            drops += a.push(t, &ramp((p * period) as i64, period), &mut out);
        }
        assert_eq!(drops, 0);
        let short = out.iter().filter(|b| b.frames == 1583).count();
        assert!(out.iter().all(|b| b.frames == 1583 || b.frames == 1584));
        // 30 s at 100 ppm = 3 ms = 144 frames, less the 0.5 ms (24 frames) dead band.
        assert!((112..=124).contains(&short), "{short} short blocks");
        for w in out.windows(2) {
            assert_eq!(w[1].bucket, w[0].bucket + 1);
            assert_eq!(
                w[1].samples[0],
                w[0].samples[0].wrapping_add(w[0].frames as i16)
            );
        }
    }

    #[test]
    fn a_gap_re_anchors_and_counts_the_lost_buckets() {
        let mut a = BlockAligner::new(48_000, 1, 33, 50);
        let mut out = Vec::new();
        a.push(10 * W, &ramp(0, 1584 * 2 + 100), &mut out);
        assert_eq!(out.len(), 2);
        // 200 ms of samples never arrive; the next period starts 3 ms into bucket 18.
        let t = 10 * W + (1584 * 2 + 100) * 1_000_000_000 / 48_000 + 200_000_000;
        assert_eq!(t.div_euclid(W), 18);
        let drops = a.push(t, &ramp(0, 1584 * 3), &mut out);
        // Buckets 12 (partial) to 18 (started late) are lost.
        assert_eq!(drops, 7);
        assert_eq!(out[2].bucket, 19);
        assert_eq!(out[2].stamp_ns, 19 * W);
    }

    #[test]
    fn xrun_resync_drops_the_partial_block() {
        let mut a = BlockAligner::new(48_000, 1, 33, 50);
        let mut out = Vec::new();
        a.push(5 * W, &ramp(0, 2000), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(a.resync(), 1);
        assert_eq!(a.resync(), 0);
        a.push(9 * W + 1, &ramp(0, 1584 * 2), &mut out);
        assert_eq!(out[1].bucket, 10);
    }

    #[test]
    fn small_jitter_keeps_blocks_full_length() {
        let mut a = BlockAligner::new(48_000, 1, 33, 50);
        let mut out = Vec::new();
        let mut state = 12345u64;
        for p in 0..2000i64 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            let jitter = (state >> 33) as i64 % 400_000 - 200_000; // ±0.2 ms
            let t = 50 * W + p * 10_000_000 + jitter;
            a.push(t, &ramp(p * 480, 480), &mut out);
        }
        assert!(
            out.iter().all(|b| b.frames == 1584),
            "jitter must not change lengths"
        );
    }

    #[test]
    fn sample_conversion() {
        assert_eq!(f32_to_s16(1.0), 32767);
        assert_eq!(f32_to_s16(-1.0), -32768);
        assert_eq!(f32_to_s16(-2.0), -32768);
        assert_eq!(f32_to_s16(1234.0 / 32768.0), 1234);
        assert_eq!(s16le_bytes(&[0x0102, -1]), [2, 1, 0xff, 0xff]);
    }
}
