//! The ALSA driver opening the device as 32-bit float stereo (cpal's usual default) from a FLOAT_LE
//! file: the driver converts to S16LE for the wire, and `x / 32768` must come back as exactly `x`.
//! (One ALSA configuration per process: this binary holds one test.)
//!
//! The file is float rather than S16 converted by `plug`: with a format conversion in `plug`, ALSA
//! 1.2.8's file plugin reads 1.5 periods from `infile` per period delivered (seen for F32 mono and
//! stereo), which would test ALSA rather than rigd.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{alsa_file_source, check_audio_capture, noise, Capture};
use rigd_drivers::audio::{AudioSettings, AudioSource, SampleFormat};
use rigd_drivers::{Media, SystemClock};

#[test]
fn f32_stereo_capture_matches_the_file_in_bucket_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let file = noise(48_000 * 2 * 3, 30_000);
    alsa_file_source(dir.path(), 2, 48_000, &file, true);
    let settings = AudioSettings {
        device: "rigdtest".into(),
        sample_rate: 48_000,
        channels: 2,
        sample_format: SampleFormat::F32,
        period_frames: None,
        // Unpaced plugin: see audio_s16.rs.
        max_skew_ms: 3_600_000,
        bucket_ms: 33,
    };
    let cap = Capture::start(
        Box::new(AudioSource::new("mic", settings, Arc::new(SystemClock))),
        Duration::from_millis(100),
    );
    cap.wait_for("4 s of blocks", Duration::from_secs(20), |c| {
        c.frame_count() >= 122
    });
    let errors = cap.errors.lock().unwrap().clone();
    let drops = cap.health.drops();
    let frames = cap.stop();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(drops, 0);
    assert!(matches!(
        frames[0].media,
        Media::Audio {
            sample_rate: 48_000,
            channels: 2,
            ..
        }
    ));
    let compared = check_audio_capture(&frames, &file, 48_000, 2, 33, 0);
    assert!(
        compared > 48_000 * 2,
        "compared {compared} frames of a 3 s file"
    );
}

/// CPU time of the audio path per second of 48 kHz stereo: ALSA (file plugin), cpal, F32->S16
/// conversion, bucket alignment, levels, the frame sink. Run alone (one ALSA config per process):
/// `cargo test --release -p rigd-drivers --features audio --test audio_f32 -- --ignored --nocapture bench`
#[test]
#[ignore = "benchmark"]
fn bench_audio_cpu_per_second() {
    let dir = tempfile::tempdir().unwrap();
    let secs = 60;
    let file = noise(48_000 * 2 * secs, 30_000);
    alsa_file_source(dir.path(), 2, 48_000, &file, true);
    let settings = AudioSettings {
        device: "rigdtest".into(),
        sample_rate: 48_000,
        channels: 2,
        sample_format: SampleFormat::F32,
        period_frames: Some(1024),
        max_skew_ms: 3_600_000,
        bucket_ms: 33,
    };
    let blocks = secs * 1000 / 33 - 2;
    let cpu0 = cpu_ns();
    let t0 = std::time::Instant::now();
    let cap = Capture::start(
        Box::new(AudioSource::new("mic", settings, Arc::new(SystemClock))),
        Duration::from_millis(100),
    );
    cap.wait_for("the whole file", Duration::from_secs(120), |c| {
        c.frame_count() >= blocks
    });
    let cpu = (cpu_ns() - cpu0) as f64 / 1e9;
    let wall = t0.elapsed().as_secs_f64();
    let frames = cap.stop();
    let audio_s = frames.len() as f64 * 0.033;
    println!(
        "audio bench: {audio_s:.1} s of 48 kHz stereo in {wall:.2} s wall, process CPU {cpu:.3} s \
         = {:.2} ms CPU per second of audio ({:.3}% of one core)",
        cpu * 1e3 / audio_s,
        cpu * 100.0 / audio_s
    );
}

fn cpu_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as i64 * 1_000_000_000 + t.tv_nsec as i64
}
