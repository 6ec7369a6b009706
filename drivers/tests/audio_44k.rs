//! The ALSA driver at 44.1 kHz (most USB microphones), through ALSA's `file` and `plug` plugins:
//! 33 ms buckets hold 1455.3 samples, so blocks are 1455 or 1456 samples long, each inside its
//! bucket, and over 60 s of audio no sample is lost or repeated (issue 32). (One ALSA
//! configuration per process: this binary holds one test.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{alsa_file_source, check_audio_capture, noise, Capture};
use rigd_drivers::audio::{AudioSettings, AudioSource, SampleFormat};
use rigd_drivers::{Media, SystemClock};

#[test]
fn at_44_1_khz_blocks_of_two_lengths_carry_60_s_of_audio_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let rate = 44_100;
    let file = noise(rate as usize * 62, 20_000);
    alsa_file_source(dir.path(), 1, rate, &file, false);
    let settings = AudioSettings {
        device: "rigdtest".into(),
        sample_rate: rate,
        channels: 1,
        sample_format: SampleFormat::I16,
        period_frames: Some(441),
        // The file plugin is not paced (seconds of samples arrive in milliseconds), so the
        // capture timestamps fall far behind the sample count; follow it regardless.
        max_skew_ms: 3_600_000,
        bucket_ms: 33,
    };
    let cap = Capture::start(
        Box::new(AudioSource::new("mic", settings, Arc::new(SystemClock))),
        Duration::from_millis(100),
    );
    // 60 s of audio: 1819 buckets of 33 ms.
    cap.wait_for("60 s of blocks", Duration::from_secs(120), |c| {
        c.frame_count() >= 1819
    });
    let errors = cap.errors.lock().unwrap().clone();
    let drops = cap.health.drops();
    let frames = cap.stop();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(drops, 0);
    // Blocks of more than one length, each its bucket's share (1455 or 1456) give or take the one
    // frame of drift correction (the file plugin delivers far faster than real time, so blocks
    // are lengthened): `check_audio_capture` holds each to its bucket's share. The exact
    // alternation with a paced device is the aligner's unit test.
    let lengths: std::collections::BTreeSet<u32> = frames
        .iter()
        .map(|f| match f.media {
            Media::Audio { frames, .. } => frames,
            _ => 0,
        })
        .collect();
    assert!(
        lengths.len() >= 2 && lengths.iter().all(|n| (1454..=1457).contains(n)),
        "{lengths:?}"
    );
    let compared = check_audio_capture(&frames, &file, rate, 1, 33, 0);
    assert!(
        compared >= rate as usize * 60,
        "compared {compared} frames, fewer than 60 s"
    );
}
