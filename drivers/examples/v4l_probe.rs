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
//! 6. With `--h264 LOOPBACK DIR` (a second v4l2loopback device, and the buffers
//!    `tests/vm/h264_clip.py` made from libx264's packets on the host), H.264 passthrough: every
//!    file of `DIR/feed` is written as one buffer (one `write()`) into the loopback device in
//!    format `H264` while the source captures with `codec = "h264"`; every frame emitted is a
//!    written buffer byte for byte, or a keyframe with the stream's SPS and PPS (`DIR/sets.bin`)
//!    in front of one, in order; keyframe flags follow the IDR slices; every sequence number is a
//!    frame, a counted drop or a headers-only buffer. Each frame is printed
//!    (`RIGD-VM-CAMERA H264-AU ...`, its bytes in base64) for the host to compare and decode.
//!
//! 7. With `--m2m MODULE` (vicodec.ko, built out of tree by camera.sh and loaded single-planar),
//!    the M2M encoder (`rigd_drivers::m2m`) on vicodec's stateful FWHT encoder: a moving test
//!    picture (640x360 I420, vicodec's least size) encoded frame by frame with keyframes asked at some frames; every
//!    raw frame gives one coded frame with its timestamp, keyframes exactly where asked (forced
//!    by vicodec's reset sequence: it has no FORCE_KEY_FRAME), a frame of the wrong size refused
//!    with the encoder usable after, the drain (ENC_CMD_STOP) ending on the LAST buffer; then the
//!    coded frames decoded by vicodec's own stateful decoder: same timestamps, the decoder's
//!    keyframe flags equal the encoder's, PSNR against the pictures put in, and a group decoded
//!    alone from its forced keyframe gives the same pictures (`m2m`). Then vicodec reloaded with
//!    `multiplanar=1` and the same on the multi-planar API (`m2m-mplane`). Zero-copy: vivid's
//!    capture buffers (YU12 640x480) exported with EXPBUF and imported by the encoder as DMABUF,
//!    no copy, decoded back to vivid's pictures (`m2m-dmabuf`). Last, vicodec's
//!    platform device unbound (sysfs) while the encoder streams: an error within the deadline,
//!    no hang, the encoder refusing frames after, its drop returning (`m2m-gone`).
//!
//! Prints `RIGD-VM-CAMERA PASS <check> ...` per check and `RIGD-VM-CAMERA DONE ok` at the end; any
//! failed check prints `RIGD-VM-CAMERA FAIL <check>: <why>` and exits 1.
//!
//! `v4l_probe [--mplane DEVICE] [--h264 LOOPBACK DIR] [--m2m MODULE] [--only PREFIX]
//! [DEVICE [LOOPBACK]]` (default /dev/video0, no loopback check; `--only`: the checks whose names
//! start with PREFIX).

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
    let h264 = all.iter().position(|a| a == "--h264").map(|i| {
        let d = all.get(i + 1).cloned().unwrap_or_default();
        let dir = all.get(i + 2).cloned().unwrap_or_default();
        all.drain(i..(i + 3).min(all.len()));
        format!("{d}\n{dir}")
    });
    let m2m = all.iter().position(|a| a == "--m2m").map(|i| {
        let d = all.get(i + 1).cloned().unwrap_or_default();
        all.drain(i..(i + 2).min(all.len()));
        d
    });
    // `--only PREFIX`: just the checks whose names start with it (iterating on one check).
    let only = all.iter().position(|a| a == "--only").map(|i| {
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
    match h264 {
        Some(h) => checks.push(("h264", h, h264_passthrough)),
        None => println!("RIGD-VM-CAMERA SKIP h264: no H.264 loopback device and clip given"),
    }
    match m2m {
        Some(module) => {
            checks.push(("m2m", String::new(), m2m_single_planar));
            checks.push(("m2m-mplane", module, m2m_multi_planar));
            checks.push(("m2m-dmabuf", path.clone(), m2m_dmabuf));
            checks.push(("m2m-gone", String::new(), m2m_device_gone));
        }
        None => println!("RIGD-VM-CAMERA SKIP m2m: no vicodec module given"),
    }
    if let Some(only) = &only {
        checks.retain(|(name, _, _)| name.starts_with(only.as_str()));
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
        video: None,
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
        let Media::Camera { width, height, .. } = f.media else {
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

/// 64-bit FNV-1a: a fingerprint the host recomputes in a line of Python.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Standard base64 with padding (no crate for one probe).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Whether an access unit holds an IDR slice, read here without rigd's parser: every
/// `00 00 01` followed by a NAL header of type 5.
fn has_idr(au: &[u8]) -> bool {
    au.windows(4)
        .any(|w| w[0] == 0 && w[1] == 0 && w[2] == 1 && w[3] & 0x1F == 5)
}

/// `arg` is "DEVICE\nDIR": DIR holds `sets.bin` (the stream's SPS and PPS, Annex B) and
/// `feed/NNNN.bin`, one buffer each, written in name order.
fn h264_passthrough(arg: &str) -> Check {
    use std::io::Write;
    use v4l::video::Output;
    let (path, dir) = arg.split_once('\n').ok_or("--h264 DEVICE DIR")?;
    let sets = std::fs::read(format!("{dir}/sets.bin")).map_err(|e| format!("sets.bin: {e}"))?;
    let mut names: Vec<_> = std::fs::read_dir(format!("{dir}/feed"))
        .map_err(|e| format!("{dir}/feed: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    names.sort();
    let written: Vec<Vec<u8>> = names
        .iter()
        .map(|p| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display())))
        .collect::<Result<_, _>>()?;
    if written.len() < 10 {
        return Err(format!("{} buffers in {dir}/feed", written.len()));
    }
    let (w, h) = (640, 360);
    // The first buffer is written before the reader streams (the loopback device offers a
    // format to readers only once a writer has set it and written): the reader may never see it.
    let out_dev = v4l::Device::with_path(path).map_err(|e| format!("open {path}: {e}"))?;
    let fmt = v4l::Format::new(w, h, v4l::FourCC::new(b"H264"));
    let set = Output::set_format(&out_dev, &fmt).map_err(|e| format!("S_FMT output H264: {e}"))?;
    if set.fourcc.repr != *b"H264" {
        return Err(format!(
            "the loopback device answered {} for H264",
            set.fourcc
        ));
    }
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("open {path} for writing: {e}"))?;
    let write = |writer: &mut std::fs::File, buf: &[u8]| -> Result<(), String> {
        // One write() per buffer: the loopback device makes each write one buffer.
        match writer.write(buf) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => Err(format!("wrote {n} of {} bytes", buf.len())),
            Err(e) => Err(format!("write: {e}")),
        }
    };
    write(&mut writer, &written[0])?;

    let mut settings = settings(path, vec![PixelFormat::H264, PixelFormat::Mjpg]);
    (settings.width, settings.height) = (w, h);
    // A group of 15 buckets of 33 ms (495 ms) against the clip's keyframe every 15 frames: rigd
    // cannot place a passthrough camera's keyframes, it counts where they fall.
    settings.video = Some(rigd_drivers::synthetic::VideoSettings {
        encoder: rigd_drivers::h264::H264Settings {
            bitrate: 1_000_000,
            rate_control: rigd_drivers::h264::RateControl::Bitrate,
            fps: 30.0,
        },
        gop: 15,
        bucket_ms: 33,
    });
    let source = CameraSource::new("cam", settings, Arc::new(AheadClock));
    let mut cap = start(source);
    let t = Instant::now();
    while cap.health.detail().is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if cap.health.detail().is_empty() {
        let (_, errors, _) = cap.finish();
        return Err(format!("the source never streamed: {errors:?}"));
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut frames = Vec::new();
    for buf in &written[1..] {
        write(&mut writer, buf)?;
        std::thread::sleep(Duration::from_millis(33));
        frames.extend(cap.frames(written.len(), Duration::ZERO));
    }
    frames.extend(cap.frames(written.len(), Duration::from_millis(500)));
    let (source, errors, health) = cap.finish();
    drop(writer);
    drop(out_dev);
    let c = source.counts();
    let neg = source.negotiated().ok_or("nothing negotiated")?;
    if neg.format != PixelFormat::H264 || (neg.width, neg.height) != (w, h) {
        return Err(format!("negotiated {neg}"));
    }
    if frames.len() < 10 {
        return Err(format!(
            "{} frames of {} buffers written; counts {c:?}; errors {errors:?}",
            frames.len(),
            written.len()
        ));
    }
    // In front of a keyframe rigd puts the stream's SPS and PPS with 4-byte start codes: the
    // bytes of sets.bin, start codes made 4 bytes long.
    let mut inserted = Vec::new();
    {
        let mut i = 0;
        while i < sets.len() {
            if sets[i..].starts_with(&[0, 0, 0, 1]) {
                inserted.extend_from_slice(&[0, 0, 0, 1]);
                i += 4;
            } else if sets[i..].starts_with(&[0, 0, 1]) {
                inserted.extend_from_slice(&[0, 0, 0, 1]);
                i += 3;
            } else {
                inserted.push(sets[i]);
                i += 1;
            }
        }
    }
    let (mut next, mut with_sets, mut keys) = (0, 0, 0);
    let mut lines = Vec::new();
    let mut stream = Vec::new();
    for f in &frames {
        let Media::Camera {
            width,
            height,
            codec,
            keyframe,
        } = f.media
        else {
            return Err(format!("frame {} is not a camera frame", f.seq));
        };
        if (width, height, codec) != (w, h, rigd_drivers::Codec::H264) {
            return Err(format!("frame {}: {width}x{height} {codec:?}", f.seq));
        }
        let p = &f.payload[..];
        let found = (next..written.len()).find_map(|k| {
            if written[k][..] == *p {
                Some((k, false))
            } else if p.len() == inserted.len() + written[k].len()
                && p.starts_with(&inserted)
                && p.ends_with(&written[k])
            {
                Some((k, true))
            } else {
                None
            }
        });
        let Some((k, sets_in_front)) = found else {
            return Err(format!(
                "frame {} ({} bytes) is not a later written buffer (after #{next}), with or \
                 without the SPS/PPS in front",
                f.seq,
                p.len()
            ));
        };
        if keyframe != has_idr(&written[k]) || (sets_in_front && !keyframe) {
            return Err(format!(
                "frame {} (buffer #{k}): keyframe={keyframe}, sets inserted={sets_in_front}",
                f.seq
            ));
        }
        if f.clock != ClockState::Locked {
            return Err(format!("frame {}: clock {:?}", f.seq, f.clock));
        }
        next = k + 1;
        with_sets += usize::from(sets_in_front);
        keys += usize::from(keyframe);
        stream.extend_from_slice(p);
        lines.push(format!(
            "RIGD-VM-CAMERA H264-AU seq={} written={k} key={} sets={} ns={} len={} fnv={:016x} \
             b64={}",
            f.seq,
            u8::from(keyframe),
            u8::from(sets_in_front),
            f.capture_ns,
            p.len(),
            fnv1a(p),
            base64(p)
        ));
    }
    let (first, last) = (c.first_sequence.unwrap_or(0), c.last_sequence.unwrap_or(0));
    let span = last.wrapping_sub(first) as u64 + 1;
    // Every sequence number: a frame, a counted drop, or a buffer of headers only; a re-read
    // (the same buffer again) is neither.
    if c.frames + c.drops() + c.headers_only != span + c.repeated - c.reread
        || health.drops() != c.drops()
        || c.frames as usize != frames.len()
        || c.keyframes as usize != keys
        || c.parameter_sets_inserted as usize != with_sets
    {
        return Err(format!(
            "sequence {first}..={last} ({span}) vs {c:?}; health drops {}; {} frames received, \
             {keys} keyframes, {with_sets} with sets",
            health.drops(),
            frames.len()
        ));
    }
    for line in &lines {
        println!("{line}");
    }
    Ok(format!(
        "negotiated=`{neg}` written={} frames={} keyframes={} inserted={} headers-only={} \
         undecodable={} rejected={} lost={} repeated={} reread={} groups={} \
         groups-without-keyframe={} frames-before-group-keyframe={} keyframe-interval-ms={} \
         bytes={} stream-fnv={:016x} identical=all",
        written.len(),
        c.frames,
        c.keyframes,
        c.parameter_sets_inserted,
        c.headers_only,
        c.undecodable,
        c.rejected,
        c.lost,
        c.repeated,
        c.reread,
        c.groups,
        c.groups_without_keyframe,
        c.frames_before_group_keyframe,
        c.keyframe_interval_ns.map_or(-1, |ns| ns / 1_000_000),
        stream.len(),
        fnv1a(&stream),
    ))
}

// ---- M2M encoder on vicodec (check 7) ----

use rigd_drivers::m2m::{self, EncoderHints, M2mDecoder, M2mEncoder};

/// vicodec's least size (it codes 640x368 and crops to 360 rows: the crop path of the encoder).
const M2M_W: u32 = 640;
const M2M_H: u32 = 360;
const M2M_FRAMES: usize = 30;
/// Frames a keyframe is asked for (vicodec's GOP is set to its longest, 16: after the forced
/// keyframe at 20 its own next one would be at 36, past the end).
const M2M_KEYS: [usize; 3] = [0, 8, 20];
const M2M_GROUP: std::ops::Range<usize> = 8..20;

/// Frame `i` of a test picture that pans: smooth luma and chroma waves moving 3 pixels a frame
/// (sums of tabulated periods: f64 sines per pixel are slow under TCG).
fn m2m_picture(i: usize) -> Vec<u8> {
    let (w, h) = (M2M_W as usize, M2M_H as usize);
    let wave = |period: usize, amp: f64, f: fn(f64) -> f64| -> Vec<f64> {
        (0..period)
            .map(|k| amp * f(std::f64::consts::TAU * k as f64 / period as f64))
            .collect()
    };
    let (lx, ly) = (wave(64, 50.0, f64::sin), wave(48, 30.0, f64::cos));
    let (ux, vy) = (wave(48, 40.0, f64::sin), wave(40, 40.0, f64::cos));
    let px = |v: f64| (128.0 + v).round().clamp(0.0, 255.0) as u8;
    let mut out = Vec::with_capacity(w * h * 3 / 2);
    for y in 0..h {
        out.extend((0..w).map(|x| px(lx[(x + 3 * i) % 64] + ly[(y + i) % 48])));
    }
    for y in 0..h / 2 {
        out.extend((0..w / 2).map(|x| px(ux[(x + 2 * i) % 48])));
        let _ = y;
    }
    for y in 0..h / 2 {
        out.extend((0..w / 2).map(|_| px(vy[y % 40])));
    }
    out
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let n = a.len().min(b.len()).max(1);
    let mse = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum::<f64>()
        / n as f64;
    if mse == 0.0 {
        99.0
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }
}

/// vicodec's stateful encoder and decoder nodes, found the way `encoder = "auto"` finds one.
fn vicodec_nodes() -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let enc = m2m::find_encoder(*b"FWHT").ok_or("no M2M encoder to FWHT among /dev/video*")?;
    let dec = m2m::find_decoder(*b"FWHT").ok_or("no M2M decoder from FWHT among /dev/video*")?;
    for p in [&enc, &dec] {
        let card = card_of(&p.display().to_string())?;
        if card != "vicodec" {
            return Err(format!("{} is `{card}`, not vicodec", p.display()));
        }
    }
    Ok((enc, dec))
}

fn m2m_ts(i: usize) -> u64 {
    // Microseconds of a 30 fps clock, starting at 1000 s: what rigd passes is a capture time.
    1_000_000_000 + i as u64 * 33_333
}

fn m2m_round_trip(mplane: bool) -> Check {
    use rigd_drivers::m2m::M2mError;
    let (enc_path, dec_path) = vicodec_nodes()?;
    let hints = EncoderHints {
        bitrate: Some(500_000),
        gop: Some(16),
    };
    let t = Instant::now();
    let mut enc = M2mEncoder::open(&enc_path, M2M_W, M2M_H, *b"YU12", *b"FWHT", hints)
        .map_err(|e| format!("open: {e}"))?;
    if enc.info().mplane != mplane {
        return Err(format!(
            "{} mplane={}, expected {mplane}",
            enc.describe(),
            enc.info().mplane
        ));
    }
    let described = enc.describe();
    let pictures: Vec<Vec<u8>> = (0..M2M_FRAMES).map(m2m_picture).collect();
    let mut coded = Vec::new();
    let mut wrong_size = String::new();
    for (i, pic) in pictures.iter().enumerate() {
        let (y, rest) = pic.split_at((M2M_W * M2M_H) as usize);
        let (u, v) = rest.split_at(rest.len() / 2);
        let e = enc
            .encode(&[y, u, v], M2M_KEYS.contains(&i), m2m_ts(i))
            .map_err(|e| format!("frame {i}: {e}"))?;
        if e.ts != m2m_ts(i) {
            return Err(format!("frame {i}: ts {} came back as {}", m2m_ts(i), e.ts));
        }
        let h = m2m::fwht_header(&e.data).ok_or_else(|| format!("frame {i}: no FWHT header"))?;
        if (h.width, h.height) != (M2M_W, M2M_H)
            || h.size as usize + m2m::FWHT_HEADER_LEN != e.data.len()
        {
            return Err(format!(
                "frame {i}: header {h:?} for {} bytes; {:02x?}; {described}",
                e.data.len(),
                &e.data[..48]
            ));
        }
        coded.push(e);
        if i == 12 {
            // A frame one byte short: refused before it reaches the device, the encoder goes on.
            match enc.encode(&[&pic[..pic.len() - 1]], false, 7) {
                Err(M2mError::FrameSize { got, want, .. }) => {
                    wrong_size = format!("refused ({got} of {want} bytes)")
                }
                other => return Err(format!("a short frame gave {other:?}")),
            }
        }
    }
    let encode_s = t.elapsed().as_secs_f64();
    let left = enc.finish().map_err(|e| format!("drain: {e}"))?;
    if !left.is_empty() {
        return Err(format!("{} frames came out of the drain", left.len()));
    }
    let stats = enc.stats();
    let t_drop = Instant::now();
    drop(enc);
    let drop_ms = t_drop.elapsed().as_secs_f64() * 1e3;
    let keys: Vec<usize> = (0..coded.len()).filter(|&i| coded[i].keyframe).collect();
    if keys != M2M_KEYS {
        return Err(format!("keyframes at {keys:?}, asked at {M2M_KEYS:?}"));
    }
    if stats.frames_in != M2M_FRAMES as u64
        || stats.frames_out != M2M_FRAMES as u64
        || stats.copies != M2M_FRAMES as u64
    {
        return Err(format!("stats {stats:?}"));
    }

    // The kernel's own decoder on what came out.
    let t = Instant::now();
    let mut dec =
        M2mDecoder::open(&dec_path, *b"FWHT", M2M_W, M2M_H).map_err(|e| format!("decoder: {e}"))?;
    let mut decoded = Vec::new();
    let mut worst = f64::MAX;
    for (i, e) in coded.iter().enumerate() {
        let d = dec
            .decode(&e.data, e.ts)
            .map_err(|e| format!("decode {i}: {e}"))?;
        if d.ts != e.ts || (d.width, d.height) != (M2M_W, M2M_H) || d.keyframe != e.keyframe {
            return Err(format!(
                "decoded {i}: ts {} {}x{} keyframe {} (coded: ts {} keyframe {})",
                d.ts, d.width, d.height, d.keyframe, e.ts, e.keyframe
            ));
        }
        worst = worst.min(psnr(&d.i420, &pictures[i]));
        decoded.push(d.i420);
    }
    dec.stop();
    drop(dec);
    if worst < 30.0 {
        return Err(format!(
            "decoded pictures differ from the input: worst PSNR {worst:.1} dB"
        ));
    }
    // A group alone, from its forced keyframe, with a fresh decoder.
    let mut dec =
        M2mDecoder::open(&dec_path, *b"FWHT", M2M_W, M2M_H).map_err(|e| format!("decoder: {e}"))?;
    for i in M2M_GROUP {
        let d = dec
            .decode(&coded[i].data, coded[i].ts)
            .map_err(|e| format!("group decode {i}: {e}"))?;
        if d.i420 != decoded[i] {
            return Err(format!(
                "frame {i} decoded alone from keyframe {} differs",
                M2M_GROUP.start
            ));
        }
    }
    drop(dec);
    let decode_s = t.elapsed().as_secs_f64();
    // A device that stops answering: vicodec's decoder given half a frame waits for the rest;
    // the wait ends at its deadline with an error.
    let mut dec =
        M2mDecoder::open(&dec_path, *b"FWHT", M2M_W, M2M_H).map_err(|e| format!("decoder: {e}"))?;
    let deadline = Duration::from_millis(300);
    dec.set_timeout(deadline);
    let t = Instant::now();
    let half = &coded[0].data[..coded[0].data.len() / 2];
    let stall = match dec.decode(half, coded[0].ts) {
        Err(e) if e.failure() == Some(m2m::Failure::Timeout) => t.elapsed(),
        other => return Err(format!("half a frame gave {other:?}")),
    };
    drop(dec);
    if stall > deadline + Duration::from_millis(700) {
        return Err(format!("the 300 ms deadline ended after {stall:?}"));
    }
    let bytes: usize = coded.iter().map(|e| e.data.len()).sum();
    Ok(format!(
        "encoder=`{described}` in={} out={} ts=kept keyframes={} asked={} forced-by-restart={} \
         wrong-size={wrong_size} drained=LAST decoded={} decoder-keyframes=same psnr-min={worst:.1}dB \
         group={}..{}=identical copies={} bytes-copied={} coded-bytes={bytes} max-wait={:.1}ms \
         stall=timeout-after-{}ms encode={encode_s:.2}s decode={decode_s:.2}s drop={drop_ms:.1}ms",
        stats.frames_in,
        stats.frames_out,
        keys.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
        M2M_KEYS.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
        stats.forced_by_restart,
        decoded.len(),
        M2M_GROUP.start,
        M2M_GROUP.end - 1,
        stats.copies,
        stats.bytes_copied,
        stats.max_wait_us as f64 / 1e3,
        stall.as_millis(),
    ))
}

fn m2m_single_planar(_: &str) -> Check {
    m2m_round_trip(false)
}

/// Runs a busybox applet, its output in the error.
fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn m2m_multi_planar(module: &str) -> Check {
    let t = Instant::now();
    run("rmmod", &["vicodec"])?;
    run("insmod", &[module, "multiplanar=1"])?;
    while m2m::find_encoder(*b"FWHT").is_none() || m2m::find_decoder(*b"FWHT").is_none() {
        if t.elapsed() > Duration::from_secs(5) {
            return Err("vicodec's nodes did not come back within 5 s of insmod".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let reload_s = t.elapsed().as_secs_f64();
    m2m_round_trip(true).map(|s| format!("{s} reload={reload_s:.2}s"))
}

fn m2m_device_gone(_: &str) -> Check {
    const DRIVER: &str = "/sys/bus/platform/drivers/vicodec";
    let (enc_path, _) = vicodec_nodes()?;
    let name = std::fs::read_dir(DRIVER)
        .map_err(|e| format!("{DRIVER}: {e}"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|n| n.starts_with("vicodec."))
        .ok_or_else(|| format!("no vicodec device bound in {DRIVER}"))?;
    let mut enc = M2mEncoder::open(
        &enc_path,
        M2M_W,
        M2M_H,
        *b"YU12",
        *b"FWHT",
        EncoderHints::default(),
    )
    .map_err(|e| format!("open: {e}"))?;
    let timeout = Duration::from_secs(2);
    enc.set_timeout(timeout);
    let pictures: Vec<Vec<u8>> = (0..4).map(m2m_picture).collect();
    let mut frames = 0usize;
    let unbind = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let unbind2 = unbind.clone();
    let name2 = name.clone();
    // The unbind happens on another thread while this one keeps encoding: mid-stream.
    let thread = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        *unbind2.lock().unwrap() = Some(Instant::now());
        std::fs::write(format!("{DRIVER}/unbind"), &name2)
            .map_err(|e| format!("unbind {name2}: {e}"))
    });
    let started = Instant::now();
    let err = loop {
        let pic = &pictures[frames % pictures.len()];
        match enc.encode(&[pic], frames == 0, m2m_ts(frames)) {
            Ok(_) => frames += 1,
            Err(e) => break e,
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "{frames} frames encoded and no error 20 s after the unbind"
            ));
        }
    };
    let failed_at = Instant::now();
    thread.join().map_err(|_| "unbind thread panicked")??;
    let unbound = unbind.lock().unwrap().ok_or("no unbind time")?;
    let after_ms = failed_at.saturating_duration_since(unbound).as_secs_f64() * 1e3;
    if frames == 0 {
        return Err(format!("no frame encoded before the unbind: {err}"));
    }
    if err.failure().is_none() || after_ms > timeout.as_secs_f64() * 1e3 + 500.0 {
        return Err(format!("after {after_ms:.0} ms: {err}"));
    }
    let again = enc.encode(&[&pictures[0]], false, 1);
    if again.is_ok() {
        return Err("the encoder took a frame after failing".into());
    }
    let t = Instant::now();
    drop(enc);
    let drop_ms = t.elapsed().as_secs_f64() * 1e3;
    let found = m2m::find_encoder(*b"FWHT");
    if found.is_some() {
        return Err(format!(
            "an FWHT encoder is still found after the unbind: {found:?}"
        ));
    }
    // Bind it again: the device comes back (what a reopen with backoff would find).
    std::fs::write(format!("{DRIVER}/bind"), &name).map_err(|e| format!("bind {name}: {e}"))?;
    let t = Instant::now();
    while m2m::find_encoder(*b"FWHT").is_none() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let back =
        m2m::find_encoder(*b"FWHT").ok_or("vicodec's encoder did not come back after bind")?;
    Ok(format!(
        "frames-before={frames} failure={:?} error=`{err}` after={after_ms:.0}ms refused-after=yes \
         drop={drop_ms:.1}ms rebound={}",
        err.failure().unwrap(),
        back.display()
    ))
}

/// Zero-copy: vivid's capture buffers (YU12 640x480, the layout vicodec takes at that size)
/// exported with VIDIOC_EXPBUF and imported by the encoder's OUTPUT queue as DMABUF.
#[allow(unsafe_code)] // V4L2 ioctls and mmap on vivid's node, as drivers/src/v4l_mplane.rs does
fn m2m_dmabuf(camera: &str) -> Check {
    use v4l::v4l2::vidioc;
    use v4l::v4l_sys::{v4l2_buffer, v4l2_exportbuffer, v4l2_requestbuffers};
    use v4l::video::Capture;
    const N: usize = 10;
    let (w, h) = (640u32, 480u32);
    let ioctl = |fd: i32, req: vidioc::_IOC_TYPE, arg: *mut std::os::raw::c_void, what: &str| {
        // SAFETY: each call below passes the struct its request code is defined for.
        unsafe { v4l::v4l2::ioctl(fd, req, arg) }.map_err(|e| format!("{what}: {e}"))
    };
    let (enc_path, dec_path) = vicodec_nodes()?;
    let cam = v4l::Device::with_path(camera).map_err(|e| format!("open {camera}: {e}"))?;
    let f = Capture::set_format(&cam, &v4l::Format::new(w, h, v4l::FourCC::new(b"YU12")))
        .map_err(|e| format!("S_FMT: {e}"))?;
    if f.fourcc.repr != *b"YU12" || (f.width, f.height, f.stride) != (w, h, w) {
        return Err(format!(
            "vivid answered {} {}x{} stride {}",
            f.fourcc, f.width, f.height, f.stride
        ));
    }
    let mut enc =
        M2mEncoder::open_dmabuf(&enc_path, w, h, *b"YU12", *b"FWHT", EncoderHints::default())
            .map_err(|e| format!("open: {e}"))?;
    let l = enc.layout();
    if (l.stride, l.rows, l.buffer_len()) != (w as usize, h as usize, f.size as usize) {
        return Err(format!(
            "vicodec's layout {l:?} is not vivid's ({} bytes)",
            f.size
        ));
    }
    let fd = cam.handle().fd();
    // SAFETY: plain C structs; all-zero bytes are valid values.
    let mut req: v4l2_requestbuffers = unsafe { std::mem::zeroed() };
    (req.count, req.type_, req.memory) = (4, 1, 1);
    ioctl(
        fd,
        vidioc::VIDIOC_REQBUFS,
        &mut req as *mut _ as *mut _,
        "REQBUFS",
    )?;
    let mut maps = Vec::new();
    let mut dmabufs = Vec::new();
    for index in 0..req.count {
        // SAFETY: as above.
        let mut buf: v4l2_buffer = unsafe { std::mem::zeroed() };
        (buf.index, buf.type_, buf.memory) = (index, 1, 1);
        ioctl(
            fd,
            vidioc::VIDIOC_QUERYBUF,
            &mut buf as *mut _ as *mut _,
            "QUERYBUF",
        )?;
        // SAFETY: maps the buffer QUERYBUF described, read-only; unmapped below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                buf.length as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                buf.m.offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        maps.push((ptr, buf.length as usize));
        // SAFETY: as above.
        let mut exp: v4l2_exportbuffer = unsafe { std::mem::zeroed() };
        (exp.type_, exp.index, exp.flags) = (1, index, libc::O_CLOEXEC as u32);
        ioctl(
            fd,
            vidioc::VIDIOC_EXPBUF,
            &mut exp as *mut _ as *mut _,
            "EXPBUF",
        )?;
        dmabufs.push(exp.fd);
        ioctl(
            fd,
            vidioc::VIDIOC_QBUF,
            &mut buf as *mut _ as *mut _,
            "QBUF",
        )?;
    }
    let mut t = 1i32;
    ioctl(
        fd,
        vidioc::VIDIOC_STREAMON,
        &mut t as *mut _ as *mut _,
        "STREAMON",
    )?;
    let mut pictures = Vec::new();
    let mut coded = Vec::new();
    let started = Instant::now();
    let result = (|| -> Result<(), String> {
        for i in 0..N {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut p, 1, 5000) } != 1 {
                return Err(format!("no frame from {camera} within 5 s"));
            }
            // SAFETY: as above.
            let mut buf: v4l2_buffer = unsafe { std::mem::zeroed() };
            (buf.type_, buf.memory) = (1, 1);
            ioctl(
                fd,
                vidioc::VIDIOC_DQBUF,
                &mut buf as *mut _ as *mut _,
                "DQBUF",
            )?;
            let (ptr, len) = maps[buf.index as usize];
            // SAFETY: the mapping is `len` bytes and the buffer is ours until queued again.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            // A copy for the comparison below only: the encoder reads the buffer itself.
            pictures.push(bytes[..l.packed_len()].to_vec());
            let e = enc
                .encode_dmabuf(dmabufs[buf.index as usize], i == 0, m2m_ts(i))
                .map_err(|e| format!("frame {i}: {e}"))?;
            if e.ts != m2m_ts(i) {
                return Err(format!("frame {i}: ts {} came back as {}", m2m_ts(i), e.ts));
            }
            coded.push(e);
            ioctl(
                fd,
                vidioc::VIDIOC_QBUF,
                &mut buf as *mut _ as *mut _,
                "QBUF",
            )?;
        }
        Ok(())
    })();
    let _ = ioctl(
        fd,
        vidioc::VIDIOC_STREAMOFF,
        &mut t as *mut _ as *mut _,
        "STREAMOFF",
    );
    for (ptr, len) in maps {
        // SAFETY: mapped above with this length, unmapped once.
        unsafe { libc::munmap(ptr, len) };
    }
    for d in &dmabufs {
        // SAFETY: the descriptors EXPBUF gave, closed once.
        unsafe { libc::close(*d) };
    }
    result?;
    let encode_s = started.elapsed().as_secs_f64();
    let stats = enc.stats();
    drop(enc);
    drop(cam);
    if stats.copies != 0 || stats.imported != N as u64 || stats.frames_out != N as u64 {
        return Err(format!("stats {stats:?}"));
    }
    let mut dec =
        M2mDecoder::open(&dec_path, *b"FWHT", w, h).map_err(|e| format!("decoder: {e}"))?;
    let mut worst = f64::MAX;
    for (i, e) in coded.iter().enumerate() {
        let d = dec
            .decode(&e.data, e.ts)
            .map_err(|e| format!("decode {i}: {e}"))?;
        if d.ts != e.ts || (d.width, d.height) != (w, h) {
            return Err(format!("decoded {i}: ts {} {}x{}", d.ts, d.width, d.height));
        }
        worst = worst.min(psnr(&d.i420, &pictures[i]));
    }
    drop(dec);
    if worst < 30.0 {
        return Err(format!(
            "decoded pictures differ from vivid's: worst PSNR {worst:.1} dB"
        ));
    }
    Ok(format!(
        "camera=`{camera} {} {}x{} stride {}` frames={N} imported={} copies={} out={} psnr-min={worst:.1}dB \
         coded-bytes={} encode={encode_s:.2}s",
        f.fourcc,
        f.width,
        f.height,
        f.stride,
        stats.imported,
        stats.copies,
        stats.frames_out,
        stats.coded_bytes
    ))
}
