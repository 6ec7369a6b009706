//! The video benchmark's frames and rigd's own encodes of them (tests/bench/video.sh,
//! docs/PERFORMANCE.md "Video (H.264)"): the synthetic camera's pan (`scene::Pan`, the frames a
//! `codec = "h264"` camera films) written raw, and encoded by the two encoders a rig uses, each
//! timed in thread CPU time per frame (`CLOCK_THREAD_CPUTIME_ID`; the drawing is not counted):
//!
//! - `DIR/source.yuv`: the frames as I420 (what ffmpeg reads as `-f rawvideo -pix_fmt yuv420p`);
//! - `DIR/clean.yuv` (with `--clean`): the same frames without the sensor noise, the scene itself;
//! - `DIR/mjpeg.mjpeg`: each frame as a JPEG by libturbojpeg from the Y'CbCr planes, 4:2:0, at
//!   `--quality` (80: a raw camera's `jpeg-quality` default), concatenated;
//! - `DIR/h264-<bps>.h264`: per `--bitrates` entry, OpenH264 as rigd configures it (`H264Encoder`:
//!   rate control `bitrate`, one thread, a keyframe every `--gop` frames), Annex B.
//!
//! One JSON line per encode on stdout: `{"what", "file", "frames", "bytes", "cpu_ms_per_frame",
//! "wall_ms_per_frame", ...}`.
//!
//! `video_bench --out DIR [--frames 300] [--width 1920] [--height 1080] [--fps 30] [--gop 30]
//! [--quality 80] [--bitrates 2000000,4000000] [--no-source] [--clean] [--no-mjpeg]`
//! (needs features `h264` and `turbojpeg`, as the workspace builds it, and libturbojpeg.so.0).

#[cfg(all(feature = "h264", feature = "turbojpeg"))]
use std::io::Write;
#[cfg(all(feature = "h264", feature = "turbojpeg"))]
use std::path::{Path, PathBuf};

#[cfg(all(feature = "h264", feature = "turbojpeg"))]
use rigd_drivers::h264::{H264Encoder, H264Settings, RateControl};
#[cfg(all(feature = "h264", feature = "turbojpeg"))]
use rigd_drivers::scene::Pan;

#[cfg(all(feature = "h264", feature = "turbojpeg"))]
struct Args {
    out: PathBuf,
    frames: u64,
    width: usize,
    height: usize,
    fps: f64,
    gop: u64,
    quality: u8,
    bitrates: Vec<u32>,
    source: bool,
    clean: bool,
    mjpeg: bool,
}

#[cfg(all(feature = "h264", feature = "turbojpeg"))]
fn parse() -> Result<Args, String> {
    let mut a = Args {
        out: PathBuf::new(),
        frames: 300,
        width: 1920,
        height: 1080,
        fps: 30.0,
        gop: 30,
        quality: 80,
        bitrates: vec![2_000_000, 4_000_000],
        source: true,
        clean: false,
        mjpeg: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let bad = |e: &dyn std::fmt::Display| format!("{flag}: {e}");
        match flag.as_str() {
            "--out" => a.out = PathBuf::from(value()?),
            "--frames" => a.frames = value()?.parse().map_err(|e| bad(&e))?,
            "--width" => a.width = value()?.parse().map_err(|e| bad(&e))?,
            "--height" => a.height = value()?.parse().map_err(|e| bad(&e))?,
            "--fps" => a.fps = value()?.parse().map_err(|e| bad(&e))?,
            "--gop" => a.gop = value()?.parse().map_err(|e| bad(&e))?,
            "--quality" => a.quality = value()?.parse().map_err(|e| bad(&e))?,
            "--bitrates" => {
                a.bitrates = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
            "--no-source" => a.source = false,
            "--clean" => a.clean = true,
            "--no-mjpeg" => a.mjpeg = false,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if a.out.as_os_str().is_empty() {
        return Err("--out DIR is required".into());
    }
    if a.width % 2 != 0 || a.height % 2 != 0 || a.gop == 0 {
        return Err("width and height must be even, gop at least 1".into());
    }
    Ok(a)
}

/// This thread's CPU time in seconds.
#[cfg(all(feature = "h264", feature = "turbojpeg"))]
fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Times one encoder over every frame of the pan: `encode(n, planes)` returns the frame's bytes.
#[cfg(all(feature = "h264", feature = "turbojpeg"))]
fn run(
    a: &Args,
    file: &Path,
    mut pan: Pan,
    mut encode: impl FnMut(u64, (&[u8], &[u8], &[u8])) -> Result<Vec<u8>, String>,
) -> Result<(u64, f64, f64), String> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(file).map_err(|e| format!("{}: {e}", file.display()))?,
    );
    let (mut bytes, mut cpu, mut wall) = (0u64, 0f64, 0f64);
    for n in 0..a.frames {
        let planes = pan.draw(n);
        let (c0, t0) = (thread_cpu(), std::time::Instant::now());
        let data = encode(n, planes)?;
        cpu += thread_cpu() - c0;
        wall += t0.elapsed().as_secs_f64();
        bytes += data.len() as u64;
        out.write_all(&data).map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())?;
    Ok((bytes, cpu, wall))
}

#[cfg(all(feature = "h264", feature = "turbojpeg"))]
fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("video_bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = bench(&a) {
        eprintln!("video_bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(all(feature = "h264", feature = "turbojpeg"))]
fn bench(a: &Args) -> Result<(), String> {
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let (w, h, n) = (a.width, a.height, a.frames as f64);
    let line = |what: &str, file: &Path, extra: String, (bytes, cpu, wall): (u64, f64, f64)| {
        println!(
            "{{\"what\": \"{what}\", \"file\": \"{}\", \"frames\": {}, \"width\": {w}, \"height\": {h}, \
             \"fps\": {}, \"bytes\": {bytes}, \"bytes_per_s\": {:.0}, \"cpu_ms_per_frame\": {:.3}, \
             \"wall_ms_per_frame\": {:.3}{extra}}}",
            file.display(),
            a.frames,
            a.fps,
            bytes as f64 / n * a.fps,
            cpu * 1e3 / n,
            wall * 1e3 / n
        );
    };
    if a.source {
        let file = a.out.join("source.yuv");
        let r = run(a, &file, Pan::new(w, h), |_, (y, u, v)| {
            Ok([y, u, v].concat())
        })?;
        line("source", &file, String::new(), r);
    }
    if a.clean {
        let file = a.out.join("clean.yuv");
        let pan = Pan::new(w, h).without_noise();
        let r = run(a, &file, pan, |_, (y, u, v)| Ok([y, u, v].concat()))?;
        line("clean", &file, String::new(), r);
    }
    if a.mjpeg {
        let lib = rigd_drivers::turbojpeg::library()
            .ok_or("libturbojpeg.so.0 does not open (Debian: libturbojpeg0)")?;
        let file = a.out.join("mjpeg.mjpeg");
        let r = run(a, &file, Pan::new(w, h), |_, (y, cb, cr)| {
            let planes = rigd_drivers::turbojpeg::Planes {
                width: w as u32,
                height: h as u32,
                subsampling: rigd_drivers::turbojpeg::Subsampling::S420,
                y,
                cb,
                cr,
            };
            let mut jpeg = Vec::new();
            rigd_drivers::turbojpeg::encode(lib, &planes, a.quality, false, &mut jpeg)?;
            Ok(jpeg)
        })?;
        line("mjpeg", &file, format!(", \"quality\": {}", a.quality), r);
    }
    for &bitrate in &a.bitrates {
        let mut enc = H264Encoder::new(H264Settings {
            bitrate,
            rate_control: RateControl::Bitrate,
            fps: a.fps,
        })
        .map_err(|e| e.to_string())?;
        let file = a.out.join(format!("h264-{bitrate}.h264"));
        let r = run(a, &file, Pan::new(w, h), |i, planes| {
            enc.encode(w, h, planes, i % a.gop == 0)
                .map(|au| au.data)
                .map_err(|e| e.to_string())
        })?;
        line(
            "h264",
            &file,
            format!(", \"bitrate\": {bitrate}, \"gop\": {}", a.gop),
            r,
        );
    }
    Ok(())
}

#[cfg(not(all(feature = "h264", feature = "turbojpeg")))]
fn main() {
    eprintln!("video_bench: needs rigd-drivers' features `h264` and `turbojpeg` (the workspace build has both)");
    std::process::exit(2);
}
