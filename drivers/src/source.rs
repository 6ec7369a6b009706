//! The capture-source contract: a [`Source`] runs on its own thread and emits frames into a
//! [`FrameSink`]; its [`SourceHealth`] is what status and metrics read.

use bytes::Bytes;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

use crate::{Frame, Media, Stamp};

/// Why a source stopped capturing. The daemon reopens the device with backoff unless `retryable`
/// is false (a configuration problem that no retry can fix).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("source {source_id}: device {device}: {message}")]
    Device {
        source_id: String,
        device: String,
        message: String,
        retryable: bool,
    },
    #[error("source {source_id}: frame pipeline closed")]
    PipelineClosed { source_id: String },
}

impl SourceError {
    /// The error of a device kind whose Cargo feature was left out of the build (for good).
    pub fn not_built(source_id: &str, device: &str, feature: &str) -> Self {
        SourceError::Device {
            source_id: source_id.to_string(),
            device: device.to_string(),
            message: format!("rigd was built without the `{feature}` feature"),
            retryable: false,
        }
    }

    pub fn retryable(&self) -> bool {
        match self {
            SourceError::Device { retryable, .. } => *retryable,
            SourceError::PipelineClosed { .. } => false,
        }
    }
}

/// A capture source. `run` captures until `stop` is raised (returning `Ok`) or the device fails.
pub trait Source: Send {
    fn id(&self) -> &str;
    fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError>;
}

/// A shared stop signal that blocking capture loops poll, and that ends their sleeps at once.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<StopInner>);

#[derive(Debug, Default)]
struct StopInner {
    raised: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

impl StopFlag {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn raise(&self) {
        // Under the lock: a sleeper between its check and its wait cannot miss the notify.
        let _held = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.0.raised.store(true, Ordering::Release);
        self.0.wake.notify_all();
    }
    pub fn is_raised(&self) -> bool {
        self.0.raised.load(Ordering::Acquire)
    }
    /// Sleeps up to `d` in one wait (one wake-up per period of a paced source), waking early
    /// (returning true) when the flag is raised.
    pub fn sleep(&self, d: Duration) -> bool {
        let held = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        let _held = self
            .0
            .wake
            .wait_timeout_while(held, d, |_| !self.is_raised())
            .unwrap_or_else(|p| p.into_inner());
        self.is_raised()
    }
}

/// Running state of a source, as status shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceState {
    Running,
    Retrying,
    Failed,
}

/// Counters and state of one source; written by its capture thread, read by status and metrics.
#[derive(Debug)]
pub struct SourceHealth {
    frames: AtomicU64,
    bytes: AtomicU64,
    drops: AtomicU64,
    /// Frames whose hand-off waited for the pipeline (its queue full): capture held by the rig.
    waits: AtomicU64,
    last_frame_ns: AtomicI64,
    state: AtomicU8,
    reason: Mutex<String>,
    /// What the device agreed to (a camera's negotiated format, size and rate); empty if nothing.
    detail: Mutex<String>,
    /// The newest [`AudioLevel`] as two f32 bit patterns (rms high, peak low); 0 before the first.
    audio_level: AtomicU64,
}

impl Default for SourceHealth {
    fn default() -> Self {
        Self {
            frames: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            last_frame_ns: AtomicI64::new(0),
            state: AtomicU8::new(0),
            reason: Mutex::new(String::new()),
            detail: Mutex::new(String::new()),
            audio_level: AtomicU64::new(0),
        }
    }
}

impl SourceHealth {
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    pub fn drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }
    /// Frames whose hand-off waited for the pipeline ([`FrameSink::emit`] found its queue full):
    /// the rig, not the device, held capture. A source that cannot wait (a camera's ring of
    /// buffers, an audio period) loses frames while it does, counted by the driver as drops.
    pub fn capture_waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }
    /// Capture time (rig clock, ns) of the newest frame; 0 before the first.
    pub fn last_frame_ns(&self) -> i64 {
        self.last_frame_ns.load(Ordering::Relaxed)
    }
    /// Frames the device or driver lost (sequence gaps, xruns, bad records).
    pub fn add_drops(&self, n: u64) {
        self.drops.fetch_add(n, Ordering::Relaxed);
    }
    pub fn state(&self) -> SourceState {
        match self.state.load(Ordering::Relaxed) {
            0 => SourceState::Running,
            1 => SourceState::Retrying,
            _ => SourceState::Failed,
        }
    }
    pub fn reason(&self) -> String {
        self.reason.lock().map(|r| r.clone()).unwrap_or_default()
    }
    pub fn set_state(&self, state: SourceState, reason: &str) {
        let v = match state {
            SourceState::Running => 0,
            SourceState::Retrying => 1,
            SourceState::Failed => 2,
        };
        self.state.store(v, Ordering::Relaxed);
        if let Ok(mut r) = self.reason.lock() {
            r.clear();
            r.push_str(reason);
        }
    }
}

impl SourceHealth {
    /// Records what the device agreed to at its last open, e.g. `YUYV 640x480 @ 30.00 fps, 4 buffers`.
    pub fn set_detail(&self, detail: &str) {
        if let Ok(mut d) = self.detail.lock() {
            d.clear();
            d.push_str(detail);
        }
    }

    /// What the device agreed to at its last open; empty for sources that do not negotiate.
    pub fn detail(&self) -> String {
        self.detail.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// Records the level of the newest audio block (what the UI's level meter shows).
    pub fn set_audio_level(&self, level: AudioLevel) {
        let bits = (level.rms.to_bits() as u64) << 32 | level.peak.to_bits() as u64;
        // A silent block is stored as the smallest positive rms so that 0 keeps meaning "none".
        let bits = if bits == 0 { 1 << 32 } else { bits };
        self.audio_level.store(bits, Ordering::Relaxed);
    }

    /// The level of the newest audio block; `None` for sources that emitted no audio yet.
    pub fn audio_level(&self) -> Option<AudioLevel> {
        match self.audio_level.load(Ordering::Relaxed) {
            0 => None,
            bits => Some(AudioLevel {
                rms: f32::from_bits((bits >> 32) as u32),
                peak: f32::from_bits(bits as u32),
            }),
        }
    }
}

/// Level of one audio block, linear, 1.0 = full scale (all channels together).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AudioLevel {
    pub rms: f32,
    pub peak: f32,
}

impl AudioLevel {
    /// The level of interleaved signed 16-bit samples.
    pub fn of_s16(samples: &[i16]) -> Self {
        Self::of_samples(samples.iter().copied())
    }

    /// The level of interleaved little-endian signed 16-bit samples as they lie in a frame's
    /// payload (no copy into samples first; a trailing odd byte is ignored).
    pub fn of_s16le(pcm: &[u8]) -> Self {
        Self::of_samples(
            pcm.chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]])),
        )
    }

    fn of_samples(samples: impl ExactSizeIterator<Item = i16>) -> Self {
        let n = samples.len();
        if n == 0 {
            return Self {
                rms: 0.0,
                peak: 0.0,
            };
        }
        let mut sum = 0u64;
        let mut peak = 0u32;
        for s in samples {
            let a = s.unsigned_abs() as u32;
            sum += (a * a) as u64;
            peak = peak.max(a);
        }
        Self {
            rms: ((sum as f64 / n as f64).sqrt() / 32768.0) as f32,
            peak: peak as f32 / 32768.0,
        }
    }

    /// `rms` in dB relative to full scale (-inf for silence).
    pub fn rms_dbfs(&self) -> f32 {
        20.0 * self.rms.log10()
    }

    /// `peak` in dB relative to full scale (-inf for silence).
    pub fn peak_dbfs(&self) -> f32 {
        20.0 * self.peak.log10()
    }
}

/// The pipeline closed: the daemon is shutting down.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("frame pipeline closed")]
pub struct SinkClosed;

/// A jump of a source's numbering asked for while it captures (the daemon's uplink found the
/// broker holding sequence ids of the source's producer name above every number this spool handed
/// out: a wiped spool). Asked once; the sink applies it before its next frame and says where.
#[derive(Debug)]
pub struct SeqJump {
    by: AtomicU64,
    at: AtomicU64,
}

impl Default for SeqJump {
    fn default() -> Self {
        SeqJump {
            by: AtomicU64::new(0),
            at: AtomicU64::new(u64::MAX),
        }
    }
}

impl SeqJump {
    /// Asks the numbering to skip `by` numbers before the next frame; false when a jump was asked
    /// already (there is one per run).
    pub fn ask(&self, by: u64) -> bool {
        by > 0
            && self
                .by
                .compare_exchange(0, by, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The jump asked for (0: none).
    pub fn by(&self) -> u64 {
        self.by.load(Ordering::Acquire)
    }

    /// The first number the jump skipped (frames below it were numbered before it, frames at or
    /// past it + `by` after it); None until the sink applied it.
    pub fn at(&self) -> Option<u64> {
        Some(self.at.load(Ordering::Acquire)).filter(|&at| at != u64::MAX)
    }

    /// The sink numbers its next frame `next`: how far to skip first (once; called by the sink).
    pub fn apply(&self, next: u64) -> u64 {
        let by = self.by.load(Ordering::Acquire);
        if by == 0 || self.at.load(Ordering::Relaxed) != u64::MAX {
            return 0;
        }
        self.at.store(next, Ordering::Release);
        by
    }
}

/// Where a source puts its frames. Assigns the per-source sequence number.
#[derive(Debug)]
pub struct FrameSink {
    source: Arc<str>,
    next_seq: u64,
    tx: mpsc::Sender<Frame>,
    health: Arc<SourceHealth>,
    jump: Option<Arc<SeqJump>>,
    /// A camera's proxy (`{id}-proxy`, [`crate::proxy`]): a source of its own downstream, fed by
    /// this camera's capture thread with its own numbering.
    proxy: Option<Box<FrameSink>>,
}

impl FrameSink {
    /// `first_seq` is the sequence number of the next frame (persisted by the daemon across restarts).
    pub fn new(
        source: Arc<str>,
        first_seq: u64,
        tx: mpsc::Sender<Frame>,
        health: Arc<SourceHealth>,
    ) -> Self {
        Self {
            source,
            next_seq: first_seq,
            tx,
            health,
            jump: None,
            proxy: None,
        }
    }

    /// A camera's sink that carries its proxy's: the camera's driver feeds both from one capture.
    pub fn with_proxy(mut self, proxy: FrameSink) -> Self {
        self.proxy = Some(Box::new(proxy));
        self
    }

    /// The proxy's sink, when the camera has one.
    pub fn proxy_mut(&mut self) -> Option<&mut FrameSink> {
        self.proxy.as_deref_mut()
    }

    /// Sets the state of the source and of its proxy (which runs and fails with it).
    pub fn set_state(&self, state: SourceState, reason: &str) {
        self.health.set_state(state, reason);
        if let Some(p) = &self.proxy {
            p.set_state(state, reason);
        }
    }

    /// Numbering that jumps when `jump` asks ([`SeqJump`]).
    pub fn with_jump(mut self, jump: Arc<SeqJump>) -> Self {
        self.jump = Some(jump);
        self
    }

    pub fn source(&self) -> &Arc<str> {
        &self.source
    }

    pub fn health(&self) -> &Arc<SourceHealth> {
        &self.health
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Hands one frame to the pipeline; blocks while the pipeline applies backpressure.
    pub fn emit(&mut self, stamp: Stamp, media: Media, payload: Bytes) -> Result<(), SinkClosed> {
        let (frame, len) = self.number(stamp, media, payload);
        // Room in the channel (the usual case): no blocking hand-off machinery per frame.
        match self.tx.try_send(frame) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(frame)) => {
                self.health.waits.fetch_add(1, Ordering::Relaxed);
                self.tx.blocking_send(frame).map_err(|_| SinkClosed)?
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(SinkClosed),
        }
        self.taken(stamp, len);
        Ok(())
    }

    /// Hands one frame over only if the pipeline has room now: `Ok(false)` (the frame not taken,
    /// its number not used, counted as a drop) rather than block. A proxy's frames go this way,
    /// so that a stuck proxy lane never holds its camera's capture.
    pub fn try_emit(
        &mut self,
        stamp: Stamp,
        media: Media,
        payload: Bytes,
    ) -> Result<bool, SinkClosed> {
        let (frame, len) = self.number(stamp, media, payload);
        match self.tx.try_send(frame) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.health.add_drops(1);
                return Ok(false);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(SinkClosed),
        }
        self.taken(stamp, len);
        Ok(true)
    }

    /// The frame numbered `next_seq` (after a jump asked for), and its payload's length.
    fn number(&mut self, stamp: Stamp, media: Media, payload: Bytes) -> (Frame, u64) {
        let len = payload.len() as u64;
        if let Some(j) = &self.jump {
            self.next_seq += j.apply(self.next_seq);
        }
        let frame = Frame {
            source: self.source.clone(),
            seq: self.next_seq,
            capture_ns: stamp.ns,
            clock: stamp.state,
            media,
            payload,
        };
        (frame, len)
    }

    /// The pipeline took the frame just numbered.
    fn taken(&mut self, stamp: Stamp, len: u64) {
        self.next_seq += 1;
        self.health.frames.fetch_add(1, Ordering::Relaxed);
        self.health.bytes.fetch_add(len, Ordering::Relaxed);
        self.health.last_frame_ns.store(stamp.ns, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod level_tests {
    use super::*;

    #[test]
    fn a_raised_stop_ends_a_sleep_at_once() {
        let stop = StopFlag::new();
        let t0 = std::time::Instant::now();
        assert!(!stop.sleep(Duration::from_millis(30)), "not raised");
        assert!(t0.elapsed() >= Duration::from_millis(30));
        let other = stop.clone();
        let raiser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            other.raise();
        });
        let t1 = std::time::Instant::now();
        assert!(stop.sleep(Duration::from_secs(60)), "raised while asleep");
        assert!(t1.elapsed() < Duration::from_secs(30), "{:?}", t1.elapsed());
        raiser.join().unwrap();
        assert!(
            stop.sleep(Duration::from_secs(60)),
            "already raised: no wait"
        );
    }

    #[test]
    fn level_of_full_scale_square_and_silence() {
        let l = AudioLevel::of_s16(&[i16::MIN, i16::MIN, i16::MIN, i16::MIN]);
        assert_eq!(l.peak, 1.0);
        assert!((l.rms - 1.0).abs() < 1e-6);
        let h = SourceHealth::default();
        assert_eq!(h.audio_level(), None);
        h.set_audio_level(AudioLevel::of_s16(&[0; 8]));
        let silent = h.audio_level().expect("silence is a level");
        assert_eq!(silent.peak, 0.0);
        assert!(silent.rms < 1e-30);
        h.set_audio_level(AudioLevel::of_s16(&[16384, -16384]));
        // The payload's bytes give what the samples give.
        let pcm: Vec<u8> = [16384i16, -16384, 7, i16::MIN]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        assert_eq!(
            AudioLevel::of_s16le(&pcm),
            AudioLevel::of_s16(&[16384, -16384, 7, i16::MIN])
        );
        let half = h.audio_level().unwrap();
        assert!((half.rms_dbfs() + 6.02).abs() < 0.01, "{half:?}");
        assert!((half.peak - 0.5).abs() < 1e-6);
    }
}

#[cfg(test)]
mod jump_tests {
    use super::*;
    use crate::ClockState;

    #[test]
    fn a_proxy_sink_numbers_on_its_own_and_runs_and_fails_with_its_camera() {
        let (tx, mut rx) = mpsc::channel(4);
        let (ptx, mut prx) = mpsc::channel(1);
        let proxy = FrameSink::new(Arc::from("cam-proxy"), 100, ptx, Arc::default());
        let mut sink = FrameSink::new(Arc::from("cam"), 7, tx, Arc::default()).with_proxy(proxy);
        let stamp = Stamp {
            ns: 5,
            state: ClockState::Locked,
        };
        let media = Media::jpeg(2, 2);
        sink.emit(stamp, media.clone(), Bytes::from_static(b"full"))
            .unwrap();
        let p = sink.proxy_mut().unwrap();
        assert!(p
            .try_emit(stamp, media.clone(), Bytes::from_static(b"small"))
            .unwrap());
        // Its queue full: not taken, not numbered, a drop of the proxy only.
        assert!(!p
            .try_emit(stamp, media, Bytes::from_static(b"small"))
            .unwrap());
        assert_eq!(
            (p.next_seq(), p.health().drops(), p.health().frames()),
            (101, 1, 1)
        );
        assert_eq!(
            (rx.try_recv().unwrap().seq, prx.try_recv().unwrap().seq),
            (7, 100)
        );
        assert_eq!(sink.health().drops(), 0);
        sink.set_state(SourceState::Retrying, "device gone");
        let p = sink.proxy_mut().unwrap();
        assert_eq!(p.health().state(), SourceState::Retrying);
        assert_eq!(p.health().reason(), "device gone");
        drop(prx);
        assert!(sink
            .proxy_mut()
            .unwrap()
            .try_emit(stamp, Media::jpeg(2, 2), Bytes::new())
            .is_err());
    }

    #[test]
    fn a_hand_off_that_waits_for_a_full_queue_is_counted_as_capture_held() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut sink = FrameSink::new(Arc::from("gps"), 0, tx, Arc::default());
        let stamp = Stamp {
            ns: 1,
            state: ClockState::Locked,
        };
        let media = Media::Serial { text: true };
        sink.emit(stamp, media.clone(), Bytes::from_static(b"a"))
            .unwrap();
        assert_eq!(sink.health().capture_waits(), 0);
        // The queue is full: the second hand-off waits until the pipeline takes the first.
        let taker = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let first = rx.blocking_recv().unwrap().seq;
            (first, rx.blocking_recv().unwrap().seq)
        });
        sink.emit(stamp, media, Bytes::from_static(b"b")).unwrap();
        assert_eq!(taker.join().unwrap(), (0, 1));
        let h = sink.health();
        assert_eq!((h.capture_waits(), h.drops(), h.frames()), (1, 0, 2));
    }

    #[test]
    fn a_jump_asked_while_capturing_skips_numbers_once_before_the_next_frame() {
        let (tx, mut rx) = mpsc::channel(16);
        let jump = Arc::new(SeqJump::default());
        let mut sink =
            FrameSink::new(Arc::from("gps"), 0, tx, Arc::default()).with_jump(jump.clone());
        let stamp = Stamp {
            ns: 1,
            state: ClockState::Unsynced,
        };
        let emit = |sink: &mut FrameSink| {
            sink.emit(
                stamp,
                Media::Serial { text: true },
                Bytes::from_static(b"$GPRMC"),
            )
            .unwrap();
        };
        emit(&mut sink);
        emit(&mut sink);
        assert!(jump.ask(500));
        assert!(!jump.ask(7), "one jump per run");
        assert_eq!(jump.at(), None, "not applied before the next frame");
        emit(&mut sink);
        emit(&mut sink);
        let seqs: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|f| f.seq)
            .collect();
        assert_eq!(seqs, [0, 1, 502, 503]);
        assert_eq!(jump.at(), Some(2));
        assert_eq!(sink.next_seq(), 504);
    }
}
