//! Runs the V4L2 camera source against a real kernel driver and checks what comes out. Built
//! statically and run inside the QEMU guest of `tests/vm/camera.sh`, against vivid's /dev/video0:
//!
//! 1. YUYV by card name, with MJPG preferred first (vivid does not offer it): frames are JPEGs of
//!    the negotiated size, stamped from the buffer's monotonic timestamp through the frame clock
//!    (a clock 1000 s ahead of CLOCK_REALTIME, `locked`), strictly increasing; every sequence number
//!    from the first to the last is either a frame or a counted drop.
//! 2. vivid's "Percentage of Dropped Buffers" control at 50: the sequence gaps are counted as drops.
//! 3. vivid's "Disconnect" control (a USB unplug): the source ends with a retryable error, is
//!    reopened as the daemon does, and frames flow again.
//! 4. With a second device given (v4l2loopback), MJPEG passthrough: a feeder thread writes real
//!    JPEGs into the loopback device; every frame the source emits is byte-identical to one the
//!    feeder wrote, in order; a buffer that is not a whole JPEG is rejected and counted.
//!
//! 5. With `--mplane DEVICE` (vivid loaded with `multiplanar=2`: a capture node with only the
//!    multi-planar API), multi-planar capture: NV12M (two planes, joined), NV12 and YUYV in one
//!    plane each; frames are JPEGs of the negotiated size with mapped stamps and every sequence
//!    number accounted for, and the NV12M and NV12 pictures match the YUYV one (same test pattern;
//!    a plane joined wrongly or a chroma plane misread would not).
//!
//! Prints `RIGD-VM-CAMERA PASS <check> ...` per check and `RIGD-VM-CAMERA DONE ok` at the end; any
//! failed check prints `RIGD-VM-CAMERA FAIL <check>: <why>` and exits 1.
//!
//! `v4l_probe [--mplane DEVICE] [DEVICE [LOOPBACK]]` (default /dev/video0, no loopback check).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rigd_drivers::v4l::{CameraSettings, CameraSource, PixelFormat};
use rigd_drivers::{
    ClockState, Frame, FrameClock, FrameSink, Media, Source, SourceError, SourceHealth, Stamp,
    StopFlag,
};

const OFFSET_NS: i64 = 1_000_000_000_000;

/// A rig clock 1000 s ahead of CLOCK_REALTIME and locked: a frame stamped with it was mapped.
struct AheadClock;

impl FrameClock for AheadClock {
    fn now(&self) -> Stamp {
        self.map_realtime(rigd_drivers::realtime_ns())
    }
    fn map_realtime(&self, realtime_ns: i64) -> Stamp {
        Stamp {
            ns: realtime_ns + OFFSET_NS,
            state: ClockState::Locked,
        }
    }
}

type Check = Result<String, String>;
type CheckFn = fn(&str) -> Check;

fn main() {
    let mut all: Vec<String> = std::env::args().skip(1).collect();
    let mplane = all.iter().position(|a| a == "--mplane").map(|i| {
        let d = all.get(i + 1).cloned().unwrap_or_default();
        all.drain(i..(i + 2).min(all.len()));
        d
    });
    let mut args = all.into_iter();
    let path = args.next().unwrap_or_else(|| "/dev/video0".into());
    let loopback = args.next();
    let started = Instant::now();
    let mut failed = false;
    let mut checks: Vec<(&str, String, CheckFn)> = vec![
        ("yuyv", path.clone(), yuyv_by_card_name),
        ("drops", path.clone(), dropped_buffers_are_counted),
        ("reopen", path.clone(), disconnect_then_reopen),
    ];
    match loopback {
        Some(l) => checks.push(("mjpeg", l, mjpeg_passthrough)),
        None => println!("RIGD-VM-CAMERA SKIP mjpeg: no loopback device given"),
    }
    match mplane {
        Some(m) => checks.push(("mplane", m, multi_planar_formats)),
        None => println!("RIGD-VM-CAMERA SKIP mplane: no multi-planar device given"),
    }
    for (name, device, check) in checks {
        let t = Instant::now();
        match check(&device) {
            Ok(msg) => println!(
                "RIGD-VM-CAMERA PASS {name} {msg} ({:.1} s)",
                t.elapsed().as_secs_f64()
            ),
            Err(why) => {
                println!("RIGD-VM-CAMERA FAIL {name}: {why}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
    println!(
        "RIGD-VM-CAMERA DONE ok ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

fn settings(device: &str, formats: Vec<PixelFormat>) -> CameraSettings {
    CameraSettings {
        device: device.to_string(),
        width: 640,
        height: 480,
        fps: 30.0,
        formats,
        buffers: 4,
        jpeg_quality: 80,
    }
}

/// A capture thread fed the way the daemon feeds one, and the frames it emitted.
struct Capture {
    rx: tokio::sync::mpsc::Receiver<Frame>,
    health: Arc<SourceHealth>,
    stop: StopFlag,
    thread: std::thread::JoinHandle<(CameraSource, Vec<SourceError>)>,
}

/// Runs `source` like `daemon/src/app.rs` does: a retryable error reopens after 200 ms.
fn start(mut source: CameraSource) -> Capture {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let health = Arc::new(SourceHealth::default());
    let mut sink = FrameSink::new("cam".into(), 0, tx, health.clone());
    let stop = StopFlag::new();
    let stop2 = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut errors = Vec::new();
        while !stop2.is_raised() {
            match source.run(&mut sink, &stop2) {
                Ok(()) => break,
                Err(e) if e.retryable() => {
                    errors.push(e);
                    stop2.sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    errors.push(e);
                    break;
                }
            }
        }
        (source, errors)
    });
    Capture {
        rx,
        health,
        stop,
        thread,
    }
}

impl Capture {
    /// Up to `n` frames, waiting at most `within`.
    fn frames(&mut self, n: usize, within: Duration) -> Vec<Frame> {
        self.frames_after(i64::MIN, n, within)
    }

    /// Up to `n` frames captured after `after_ns` (earlier ones are skipped), waiting at most
    /// `within`.
    fn frames_after(&mut self, after_ns: i64, n: usize, within: Duration) -> Vec<Frame> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        while out.len() < n {
            match self.rx.try_recv() {
                Ok(f) if f.capture_ns > after_ns => out.push(f),
                Ok(_) => {}
                Err(_) if Instant::now() >= deadline => break,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        out
    }

    fn finish(self) -> (CameraSource, Vec<SourceError>, Arc<SourceHealth>) {
        self.stop.raise();
        let mut rx = self.rx;
        // Unblock a source waiting on a full queue.
        while rx.try_recv().is_ok() {}
        let (source, errors) = self.thread.join().expect("capture thread panicked");
        (source, errors, self.health)
    }
}

/// Frames are valid JPEGs of `size`, mapped through the clock, strictly increasing, and stamped
/// within 2 s before their receipt — or up to `lead_ns` after it: vivid stamps the end of the
/// frame (0.9 of a frame period after it hands the buffer over) unless told to stamp its start.
fn check_frames(frames: &[(Frame, i64)], size: (u32, u32), lead_ns: i64) -> Result<(), String> {
    let mut last = i64::MIN;
    for (f, received_ns) in frames {
        let Media::Camera { width, height } = f.media else {
            return Err(format!("frame {} is not a camera frame", f.seq));
        };
        if (width, height) != size {
            return Err(format!(
                "frame {} is {width}x{height}, negotiated {size:?}",
                f.seq
            ));
        }
        let mut d = jpeg_decoder::Decoder::new(&f.payload[..]);
        d.decode()
            .map_err(|e| format!("frame {}: not a JPEG: {e}", f.seq))?;
        let info = d.info().ok_or("no JPEG info")?;
        if (info.width as u32, info.height as u32) != size {
            return Err(format!(
                "frame {}: JPEG is {}x{}, negotiated {size:?}",
                f.seq, info.width, info.height
            ));
        }
        if f.clock != ClockState::Locked {
            return Err(format!("frame {}: clock {:?}, not mapped", f.seq, f.clock));
        }
        if f.capture_ns > received_ns + lead_ns || f.capture_ns < received_ns - 2_000_000_000 {
            return Err(format!(
                "frame {}: stamped {} ms from its receipt: not the mapped monotonic time",
                f.seq,
                (f.capture_ns - received_ns) / 1_000_000
            ));
        }
        if f.capture_ns <= last {
            return Err(format!("frame {}: timestamp not increasing", f.seq));
        }
        last = f.capture_ns;
    }
    Ok(())
}

fn received(frames: Vec<Frame>) -> Vec<(Frame, i64)> {
    // Receipt is after the frame was stamped; a batch is checked against the time it was taken.
    let now = AheadClock.now().ns;
    frames.into_iter().map(|f| (f, now)).collect()
}

fn card_of(path: &str) -> Result<String, String> {
    let dev = v4l::Device::with_path(path).map_err(|e| format!("open {path}: {e}"))?;
    let caps = dev.query_caps().map_err(|e| format!("QUERYCAP: {e}"))?;
    Ok(caps.card)
}

fn yuyv_by_card_name(path: &str) -> Check {
    let card = card_of(path)?;
    let source = CameraSource::new(
        "cam",
        settings(&card, vec![PixelFormat::Mjpg, PixelFormat::Yuyv]),
        Arc::new(AheadClock),
    );
    let mut cap = start(source);
    let mut frames = Vec::new();
    for _ in 0..4 {
        frames.extend(received(cap.frames(5, Duration::from_secs(20))));
    }
    let (source, errors, health) = cap.finish();
    let neg = source.negotiated().ok_or("nothing negotiated")?;
    let c = source.counts();
    if frames.len() < 20 {
        return Err(format!(
            "{} frames in 80 s; errors: {errors:?}",
            frames.len()
        ));
    }
    if neg.format != PixelFormat::Yuyv {
        return Err(format!("negotiated {neg}, expected YUYV"));
    }
    let period_ns = (1e9 / neg.fps.unwrap_or(1.0)) as i64;
    check_frames(&frames, (neg.width, neg.height), period_ns)?;
    let (first, last) = (c.first_sequence.unwrap_or(0), c.last_sequence.unwrap_or(0));
    let span = (last - first) as u64 + 1;
    if c.frames + c.drops() != span + c.repeated {
        return Err(format!(
            "sequence {first}..={last} ({span}) != frames {} + drops {} - repeated {}",
            c.frames,
            c.drops(),
            c.repeated
        ));
    }
    if c.kernel_stamps < c.frames {
        return Err(format!(
            "{} of {} frames stamped from the kernel's monotonic timestamp",
            c.kernel_stamps, c.frames
        ));
    }
    if health.detail() != neg.to_string() {
        return Err(format!("health detail `{}`", health.detail()));
    }
    let span_s = (frames.last().unwrap().0.capture_ns - frames[0].0.capture_ns) as f64 / 1e9;
    Ok(format!(
        "card=`{card}` negotiated=`{neg}` frames={} drops={} (lost {}) repeated={} \
         seq={first}..={last} rate={:.1}/s encode={:.1}ms/frame jpeg={}B",
        c.frames,
        c.drops(),
        c.lost,
        c.repeated,
        (frames.len() - 1) as f64 / span_s,
        c.encode_ns as f64 / 1e6 / c.frames.max(1) as f64,
        frames[0].0.payload.len()
    ))
}

/// What [`capture_mplane`] saw: a summary, the decoded RGB of the last frame, its size.
struct Captured {
    summary: String,
    rgb: Vec<u8>,
    size: (u32, u32),
}

/// Frames of one format from a multi-planar device, checked like the YUYV ones.
fn capture_mplane(path: &str, format: PixelFormat) -> Result<Captured, String> {
    let source = CameraSource::new("cam", settings(path, vec![format]), Arc::new(AheadClock));
    let mut cap = start(source);
    let mut frames = Vec::new();
    for _ in 0..2 {
        frames.extend(received(cap.frames(5, Duration::from_secs(20))));
    }
    let (source, errors, _health) = cap.finish();
    let neg = source.negotiated().ok_or_else(|| {
        format!(
            "{}: nothing negotiated; errors: {errors:?}",
            format.as_str()
        )
    })?;
    let c = source.counts();
    if neg.format != format {
        return Err(format!("negotiated {neg}, expected {}", format.as_str()));
    }
    if frames.len() < 10 {
        return Err(format!(
            "{neg}: {} frames in 40 s; errors: {errors:?}",
            frames.len()
        ));
    }
    let period_ns = (1e9 / neg.fps.unwrap_or(1.0)) as i64;
    check_frames(&frames, (neg.width, neg.height), period_ns).map_err(|e| format!("{neg}: {e}"))?;
    let (first, last) = (c.first_sequence.unwrap_or(0), c.last_sequence.unwrap_or(0));
    let span = (last - first) as u64 + 1;
    if c.frames + c.drops() != span + c.repeated {
        return Err(format!(
            "{neg}: sequence {first}..={last} ({span}) != frames {} + drops {} - repeated {}",
            c.frames,
            c.drops(),
            c.repeated
        ));
    }
    if c.kernel_stamps < c.frames {
        return Err(format!(
            "{neg}: {} of {} frames kernel-stamped",
            c.kernel_stamps, c.frames
        ));
    }
    let jpeg = &frames.last().unwrap().0.payload;
    let mut d = jpeg_decoder::Decoder::new(&jpeg[..]);
    let rgb = d.decode().map_err(|e| format!("{neg}: {e}"))?;
    Ok(Captured {
        summary: format!(
            "`{neg}` frames={} drops={} jpeg={}B",
            c.frames,
            c.drops(),
            jpeg.len()
        ),
        rgb,
        size: (neg.width, neg.height),
    })
}

/// Mean absolute difference of two RGB pictures over their lower half (vivid's text overlay,
/// which changes from frame to frame, is at the top).
fn lower_half_difference(a: &[u8], b: &[u8], size: (u32, u32)) -> f64 {
    let row = size.0 as usize * 3;
    let from = (size.1 as usize / 2) * row;
    let (a, b) = (&a[from.min(a.len())..], &b[from.min(b.len())..]);
    let n = a.len().min(b.len()).max(1);
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y) as f64)
        .sum::<f64>()
        / n as f64
}

fn multi_planar_formats(path: &str) -> Check {
    let dev = v4l::Device::with_path(path).map_err(|e| format!("open {path}: {e}"))?;
    let caps = dev.query_caps().map_err(|e| format!("QUERYCAP: {e}"))?;
    use v4l::capability::Flags as Caps;
    if caps.capabilities.contains(Caps::VIDEO_CAPTURE)
        || !caps.capabilities.contains(Caps::VIDEO_CAPTURE_MPLANE)
    {
        return Err(format!(
            "{path} is not a multi-planar-only capture node: {:?}",
            caps.capabilities
        ));
    }
    drop(dev);
    let yuyv = capture_mplane(path, PixelFormat::Yuyv)?;
    let (yuyv_rgb, size) = (&yuyv.rgb, yuyv.size);
    let mut out = vec![format!("YUYV {}", yuyv.summary)];
    for format in [PixelFormat::Nv12m, PixelFormat::Nv12] {
        let Captured {
            summary,
            rgb,
            size: s,
        } = capture_mplane(path, format)?;
        if s != size {
            return Err(format!(
                "{} negotiated {s:?}, YUYV {size:?}",
                format.as_str()
            ));
        }
        let diff = lower_half_difference(&rgb, yuyv_rgb, size);
        if diff > 12.0 {
            return Err(format!(
                "{} picture differs from YUYV's by {diff:.1} per channel on average",
                format.as_str()
            ));
        }
        out.push(format!("{} {summary} vs-YUYV={diff:.1}", format.as_str()));
    }
    Ok(out.join(" | "))
}

/// Sets the vivid control named `name` (an integer; `None` for a button).
fn set_vivid_control(path: &str, name: &str, value: Option<i64>) -> Result<(), String> {
    let dev = v4l::Device::with_path(path).map_err(|e| format!("open {path}: {e}"))?;
    let controls = dev.query_controls().map_err(|e| format!("controls: {e}"))?;
    let ctl = controls
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("vivid has no control `{name}`"))?;
    let value = match value {
        Some(v) => v4l::control::Value::Integer(v),
        None => v4l::control::Value::None,
    };
    dev.set_control(v4l::control::Control { id: ctl.id, value })
        .map_err(|e| format!("set `{name}`: {e}"))
}

fn dropped_buffers_are_counted(path: &str) -> Check {
    set_vivid_control(path, "Percentage of Dropped Buffers", Some(50))?;
    let source = CameraSource::new(
        "cam",
        settings(path, vec![PixelFormat::Yuyv]),
        Arc::new(AheadClock),
    );
    let mut cap = start(source);
    let frames = received(cap.frames(12, Duration::from_secs(60)));
    let (source, errors, health) = cap.finish();
    set_vivid_control(path, "Percentage of Dropped Buffers", Some(0))?;
    let c = source.counts();
    if frames.len() < 12 {
        return Err(format!("{} frames", frames.len()));
    }
    let (first, last) = (c.first_sequence.unwrap_or(0), c.last_sequence.unwrap_or(0));
    let span = (last - first) as u64 + 1;
    if c.lost == 0 || c.frames + c.drops() != span + c.repeated || health.drops() != c.drops() {
        return Err(format!(
            "lost {} drops {} (health {}) repeated {} restarted {} frames {} for sequence \
             {first}..={last}, {} streams, errors {errors:?}",
            c.lost,
            c.drops(),
            health.drops(),
            c.repeated,
            c.restarted,
            c.frames,
            c.streams
        ));
    }
    Ok(format!(
        "frames={} lost={} repeated={} seq={first}..={last}",
        c.frames, c.lost, c.repeated
    ))
}

fn disconnect_then_reopen(path: &str) -> Check {
    let source = CameraSource::new(
        "cam",
        settings(path, vec![PixelFormat::Yuyv]),
        Arc::new(AheadClock),
    );
    let mut cap = start(source);
    let before = cap.frames(3, Duration::from_secs(30));
    if before.len() < 3 {
        return Err(format!("{} frames before the unplug", before.len()));
    }
    let unplugged_ns = AheadClock.now().ns;
    set_vivid_control(path, "Disconnect", None)?;
    // The source sees the device go, closes it (vivid reconnects once every handle is closed),
    // and reopens it after its backoff.
    let t = Instant::now();
    let after = cap.frames_after(unplugged_ns, 3, Duration::from_secs(30));
    let reopen_s = t.elapsed().as_secs_f64();
    let (source, errors, _) = cap.finish();
    let c = source.counts();
    if after.len() < 3 || c.streams < 2 {
        return Err(format!(
            "{} frames after the unplug, {} streams; errors: {errors:?}",
            after.len(),
            c.streams
        ));
    }
    let retryable = errors.iter().all(|e| e.retryable());
    if errors.is_empty() || !retryable {
        return Err(format!("errors: {errors:?}"));
    }
    if after[0].seq <= before.last().unwrap().seq {
        return Err("the sink's sequence did not continue across the reopen".into());
    }
    Ok(format!(
        "streams={} error=`{}` frames flowing again {reopen_s:.1} s after the unplug",
        c.streams, errors[0]
    ))
}

/// A distinct JPEG per index: a 320x240 frame whose luma ramp is shifted by the index.
fn feeder_jpeg(i: usize) -> Vec<u8> {
    let (w, h) = (320usize, 240usize);
    let mut yuyv = Vec::with_capacity(w * h * 2);
    for y in 0..h {
        for x in (0..w).step_by(2) {
            let l = ((x + y + i * 7) % 220) as u8 + 16;
            yuyv.extend_from_slice(&[l, 128, l, 128]);
        }
    }
    let mut out = Vec::new();
    rigd_drivers::camera::yuyv_to_jpeg(w as u32, h as u32, &yuyv, 75, &mut out).expect("encodes");
    out
}

fn mjpeg_passthrough(path: &str) -> Check {
    use std::io::Write;
    use v4l::video::Output;
    const N: usize = 40;
    // Every tenth buffer is a JPEG cut in half (what a reader sees when a writer dies mid-frame):
    // the source must reject and count it, not pass it on.
    let cut = |i: usize| i % 10 == 5;
    let written: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let j = feeder_jpeg(i);
            if cut(i) {
                j[..j.len() / 2].to_vec()
            } else {
                j
            }
        })
        .collect();
    // The writer sets the format and writes once before a reader can negotiate.
    let out_dev = v4l::Device::with_path(path).map_err(|e| format!("open {path}: {e}"))?;
    let fmt = v4l::Format::new(320, 240, v4l::FourCC::new(b"MJPG"));
    Output::set_format(&out_dev, &fmt).map_err(|e| format!("S_FMT output: {e}"))?;
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("open {path} for writing: {e}"))?;
    writer
        .write_all(&written[0])
        .map_err(|e| format!("write: {e}"))?;

    let source = CameraSource::new(
        "cam",
        settings(path, vec![PixelFormat::Mjpg, PixelFormat::Yuyv]),
        Arc::new(AheadClock),
    );
    let mut cap = start(source);
    let t = Instant::now();
    while cap.health.detail().is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let detail = cap.health.detail();
    if detail.is_empty() {
        let (_, errors, _) = cap.finish();
        return Err(format!("the source never streamed: {errors:?}"));
    }
    // Frames written before the reader streams are dropped by v4l2loopback; give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    let mut frames = Vec::new();
    for jpeg in &written[1..] {
        writer.write_all(jpeg).map_err(|e| format!("write: {e}"))?;
        std::thread::sleep(Duration::from_millis(40));
        frames.extend(cap.frames(N, Duration::ZERO));
    }
    frames.extend(cap.frames(N, Duration::from_millis(500)));
    let (source, errors, _) = cap.finish();
    drop(writer);
    drop(out_dev);
    let c = source.counts();
    let neg = source.negotiated().ok_or("nothing negotiated")?;
    if neg.format != PixelFormat::Mjpg || (neg.width, neg.height) != (320, 240) {
        return Err(format!("negotiated {neg}"));
    }
    if frames.len() < N / 2 {
        return Err(format!(
            "{} frames of {} written; counts {c:?}; errors {errors:?}",
            frames.len(),
            N - 1
        ));
    }
    let (first, last) = (c.first_sequence.unwrap_or(0), c.last_sequence.unwrap_or(0));
    let span = last.wrapping_sub(first) as u64 + 1;
    if c.rejected == 0 || c.frames + c.drops() != span + c.repeated {
        return Err(format!(
            "rejected {} (cut JPEGs written: {}), sequence {first}..={last} vs {c:?}",
            c.rejected,
            (0..N).filter(|&i| cut(i)).count()
        ));
    }
    // Every frame is one the feeder wrote, byte for byte, in the order written.
    let mut next = 0;
    for f in &frames {
        let Some(k) = (next..N).find(|&k| !cut(k) && written[k][..] == f.payload[..]) else {
            return Err(format!(
                "frame {} ({} bytes) is not a later written JPEG (after #{next})",
                f.seq,
                f.payload.len()
            ));
        };
        next = k + 1;
    }
    Ok(format!(
        "negotiated=`{neg}` written={N} (cut {}) frames={} identical=all rejected={} lost={} \
         repeated={} kernel-stamped={}",
        (0..N).filter(|&i| cut(i)).count(),
        c.frames,
        c.rejected,
        c.lost,
        c.repeated,
        c.kernel_stamps
    ))
}
