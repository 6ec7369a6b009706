//! Shared helpers of the driver integration tests: run a source the way the daemon does (on its own
//! thread, reopened after a retryable error) and collect what it emits.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rigd_drivers::{Frame, FrameSink, Source, SourceHealth, StopFlag};

/// A source running on its own thread, its frames collected.
pub struct Capture {
    pub frames: Arc<Mutex<Vec<Frame>>>,
    pub health: Arc<SourceHealth>,
    /// Every error `run` returned, with whether it was retryable.
    pub errors: Arc<Mutex<Vec<(String, bool)>>>,
    stop: StopFlag,
    thread: Option<std::thread::JoinHandle<()>>,
    collector: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    /// Starts `source`; after a retryable error it is run again after `reopen_after`.
    pub fn start(mut source: Box<dyn Source>, reopen_after: Duration) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Frame>(1024);
        let health = Arc::new(SourceHealth::default());
        let mut sink = FrameSink::new(source.id().into(), 1, tx, health.clone());
        let frames = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = StopFlag::new();
        let collector = {
            let frames = frames.clone();
            std::thread::spawn(move || {
                while let Some(f) = rx.blocking_recv() {
                    frames.lock().unwrap().push(f);
                }
            })
        };
        let thread = {
            let (stop, errors) = (stop.clone(), errors.clone());
            std::thread::spawn(move || {
                while !stop.is_raised() {
                    match source.run(&mut sink, &stop) {
                        Ok(()) => break,
                        Err(e) => {
                            let retry = e.retryable();
                            errors.lock().unwrap().push((e.to_string(), retry));
                            if !retry {
                                break;
                            }
                            stop.sleep(reopen_after);
                        }
                    }
                }
            })
        };
        Self {
            frames,
            health,
            errors,
            stop,
            thread: Some(thread),
            collector: Some(collector),
        }
    }

    pub fn frame_count(&self) -> usize {
        self.frames.lock().unwrap().len()
    }

    /// Waits until `cond` holds; panics with `what` and the current counts after `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, cond: impl Fn(&Capture) -> bool) {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}: frames {}, drops {}, errors {:?}",
                    self.frame_count(),
                    self.health.drops(),
                    self.errors.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the source and returns every frame it emitted.
    pub fn stop(mut self) -> Vec<Frame> {
        self.stop.raise();
        if let Some(t) = self.thread.take() {
            t.join().expect("capture thread panicked");
        }
        if let Some(c) = self.collector.take() {
            c.join().expect("collector thread panicked");
        }
        std::mem::take(&mut *self.frames.lock().unwrap())
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.raise();
    }
}

/// Skips the calling test with a clear message (the test passes without running).
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        eprintln!("SKIPPED: {}", format!($($arg)*));
        return;
    }};
}

/// An ALSA configuration whose pcm `rigdtest` captures from a raw file through a `plug` wrapper
/// (so any format, rate and channel count can be opened). The file holds `samples` as S16_LE, or
/// as FLOAT_LE (`sample / 32768`) when `float`. ALSA reads its configuration once per process:
/// call this before the first ALSA call, one configuration per test binary.
pub fn alsa_file_source(
    dir: &std::path::Path,
    channels: u16,
    rate: u32,
    samples: &[i16],
    float: bool,
) -> std::path::PathBuf {
    let raw = dir.join("signal.raw");
    let bytes: Vec<u8> = if float {
        samples
            .iter()
            .flat_map(|&s| (s as f32 / 32768.0).to_le_bytes())
            .collect()
    } else {
        samples.iter().flat_map(|s| s.to_le_bytes()).collect()
    };
    let format = if float { "FLOAT_LE" } else { "S16_LE" };
    std::fs::write(&raw, bytes).unwrap();
    let rc = dir.join("asoundrc");
    std::fs::write(
        &rc,
        format!(
            "pcm.rigdtest {{ type plug; slave {{ pcm \"rigdraw\"; format {format}; rate {rate}; channels {channels} }} }}\n\
             pcm.rigdraw {{ type file; slave.pcm \"rigdnull\"; file \"/dev/null\"; infile \"{}\"; format \"raw\" }}\n\
             pcm.rigdnull {{ type null }}\n",
            raw.display()
        ),
    )
    .unwrap();
    // alsa.conf first, or periods shrink to one frame.
    std::env::set_var(
        "ALSA_CONFIG_PATH",
        format!("/usr/share/alsa/alsa.conf:{}", rc.display()),
    );
    rc
}

/// Deterministic noise: every window of a few samples occurs once, so an offset is unambiguous.
pub fn noise(n: usize, amplitude: i32) -> Vec<i16> {
    let mut state = 0x853c_49e6_748f_ea9bu64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (((state >> 33) as i64 % (2 * amplitude as i64 + 1)) - amplitude as i64) as i16
        })
        .collect()
}

/// Checks the audio frames of a capture of `file` (interleaved, `channels`): blocks on consecutive
/// buckets, stamped at the bucket start, one bucket's share of samples long (see
/// `frames_in_bucket`), and their samples a contiguous stretch
/// of the file (within `tolerance` per sample) from before its end. Returns the frames compared.
pub fn check_audio_capture(
    frames: &[Frame],
    file: &[i16],
    rate: u32,
    channels: u16,
    bucket_ms: u32,
    tolerance: i32,
) -> usize {
    use rigd_drivers::Media;
    let ch = channels as usize;
    let width_ns = bucket_ms as i64 * 1_000_000;
    let mut samples: Vec<i16> = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let Media::Audio {
            sample_rate,
            channels: c,
            frames: n,
        } = f.media
        else {
            panic!("frame {i} is not audio: {:?}", f.media);
        };
        assert_eq!((sample_rate, c), (rate, channels));
        // The bucket's share of samples (two lengths when a bucket holds a fraction of one,
        // 44.1 kHz at 33 ms), give or take one where the device clock drifts.
        let share = rigd_drivers::audio::frames_in_bucket(
            rate,
            bucket_ms,
            f.capture_ns.div_euclid(width_ns),
        );
        assert!(
            n.abs_diff(share) <= 1,
            "block {i} has {n} frames, its bucket holds {share}"
        );
        assert_eq!(f.payload.len(), n as usize * ch * 2, "block {i} length");
        assert_eq!(
            f.capture_ns % width_ns,
            0,
            "block {i} not at a bucket start"
        );
        if i > 0 {
            assert_eq!(
                f.capture_ns - frames[i - 1].capture_ns,
                width_ns,
                "block {i} does not follow its predecessor's bucket"
            );
            assert_eq!(f.seq, frames[i - 1].seq + 1);
        }
        samples.extend(
            f.payload
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]])),
        );
    }
    // The stream may begin a few periods into the file (frames the device delivered before the
    // first callback); the noise makes the start unambiguous.
    let probe = 64.min(samples.len());
    let close = |a: &[i16], b: &[i16]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| (*x as i32 - *y as i32).abs() <= tolerance)
    };
    let starts: Vec<usize> = (0..=(rate as usize / 2))
        .map(|k| k * ch)
        .filter(|&o| o + probe <= file.len() && close(&samples[..probe], &file[o..o + probe]))
        .collect();
    assert_eq!(
        starts.len(),
        1,
        "the first block must start once within the first 0.5 s of the file: {starts:?}"
    );
    let start = starts[0];
    // Past the end of the file ALSA's file plugin hands out stale buffer data; compare up to it.
    let n = samples.len().min(file.len() - start);
    for (k, (got, want)) in samples[..n].iter().zip(&file[start..start + n]).enumerate() {
        assert!(
            (*got as i32 - *want as i32).abs() <= tolerance,
            "sample {k} (file sample {}): got {got}, file has {want}",
            start + k
        );
    }
    n / ch
}
