//! The ALSA driver through ALSA's own user-space plugins: a `file` plugin feeding a raw file as a
//! capture device under a `plug` wrapper. Signed 16-bit mono: the captured samples must equal the
//! file exactly. (One ALSA configuration per process: this binary holds one test.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{alsa_file_source, check_audio_capture, noise, Capture};
use rigd_drivers::audio::{AudioSettings, AudioSource, SampleFormat};
use rigd_drivers::SystemClock;

#[test]
fn s16_mono_capture_equals_the_file_in_bucket_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let file = noise(48_000 * 4, 20_000);
    alsa_file_source(dir.path(), 1, 48_000, &file, false);
    let settings = AudioSettings {
        device: "rigdtest".into(),
        sample_rate: 48_000,
        channels: 1,
        sample_format: SampleFormat::I16,
        period_frames: Some(480),
        // The file plugin is not paced (seconds of samples arrive in milliseconds), so the
        // capture timestamps fall far behind the sample count; follow it regardless.
        max_skew_ms: 3_600_000,
        bucket_ms: 33,
    };
    let cap = Capture::start(
        Box::new(AudioSource::new("mic", settings, Arc::new(SystemClock))),
        Duration::from_millis(100),
    );
    cap.wait_for("5 s of blocks", Duration::from_secs(20), |c| {
        c.frame_count() >= 152
    });
    let errors = cap.errors.lock().unwrap().clone();
    let drops = cap.health.drops();
    let level = cap.health.audio_level();
    let frames = cap.stop();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(drops, 0);
    let compared = check_audio_capture(&frames, &file, 48_000, 1, 33, 0);
    assert!(
        compared > 48_000 * 3,
        "compared {compared} frames of a 4 s file"
    );
    let level = level.expect("a level was recorded");
    assert!(level.peak > 0.5 && level.rms > 0.2, "{level:?}");
}
