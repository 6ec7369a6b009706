//! A camera's proxy: a second, small H.264 stream made from the same captured pictures as the
//! camera's own (config `proxy = { width, height, bitrate }`, docs/DRIVERS.md "Proxy").
//!
//! The camera's driver hands every picture it encoded to [`Proxy::feed`] with the picture's
//! capture stamp; the proxy scales it by area ([`crate::scale`]), encodes it with an encoder of its
//! own ([`crate::h264::VideoEncoder`]) and hands it to the proxy's sink ([`FrameSink::proxy_mut`]),
//! a source of its own downstream (`{id}-proxy`: its lane, numbering, topic and live channel).
//!
//! What holds between the two streams:
//! - A proxy frame carries the capture stamp of the camera's frame it was made from, so the
//!   same `capture-ns`, bucket and group. The camera's frame is emitted first; the proxy's only
//!   after it, so every proxy frame has a full frame at the same capture time. The reverse holds
//!   but for the proxy's own losses, each counted as a drop of the proxy: a failed scale or
//!   encode, or a proxy lane with no room (the proxy's frame is then dropped, never waited for:
//!   the camera's capture does not wait on its proxy).
//! - Keyframes open the same groups: the first proxy frame of a group is a keyframe, as the
//!   camera's is, and so is the first one after a proxy frame was lost.
//! - Sequence numbers are the proxy's own (a source of its own); the capture time is what ties a
//!   proxy frame to its full frame.

use bytes::Bytes;

use crate::encoder::Chosen;
use crate::h264::Groups;
use crate::h264::{H264Error, H264Settings, VideoEncoder};
use crate::scale::Scaler;
use crate::{Codec, FrameSink, Media, Stamp};

/// A proxy's size and encoder settings (config `proxy`), and the camera's groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProxySettings {
    pub width: u32,
    pub height: u32,
    pub encoder: H264Settings,
    /// The camera's `gop` in buckets (the rig's group width) and the bucket width.
    pub gop: u32,
    pub bucket_ms: u32,
}

/// Opens a proxy's encoder for pictures of the given width and height.
pub type Opener =
    Box<dyn FnMut(H264Settings, usize, usize) -> Result<Box<dyn VideoEncoder>, H264Error> + Send>;

/// Why [`Proxy::feed`] stops the camera's capture.
#[derive(Debug)]
pub enum ProxyStop {
    /// The pipeline closed (shutting down).
    Closed,
    /// The proxy's encoder device failed (gone, erred, silent): the camera fails and is retried,
    /// as when its own device fails.
    Device(String),
}

impl ProxyStop {
    /// The camera's error for it.
    pub fn into_source_error(self, source_id: &str) -> crate::SourceError {
        match self {
            ProxyStop::Closed => crate::SourceError::PipelineClosed {
                source_id: source_id.to_string(),
            },
            ProxyStop::Device(message) => crate::SourceError::Device {
                source_id: source_id.to_string(),
                device: "proxy encoder".into(),
                message,
                retryable: true,
            },
        }
    }
}

/// Makes a camera's proxy frames ([the module](self)). One per capture thread.
pub struct Proxy {
    settings: ProxySettings,
    open: Opener,
    encoder: Option<Box<dyn VideoEncoder>>,
    scaler: Option<Scaler>,
    picture: Vec<u8>,
    groups: Groups,
    failures: u64,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("settings", &self.settings)
            .field("failures", &self.failures)
            .finish()
    }
}

impl Proxy {
    /// A proxy encoded in software (OpenH264).
    pub fn new(settings: ProxySettings) -> Proxy {
        Self::chosen(settings, Chosen::Software)
    }

    /// A proxy encoded by the camera's chosen encoder (config `encoder`).
    pub fn chosen(settings: ProxySettings, chosen: Chosen) -> Proxy {
        let gop = settings.gop;
        Self::with_encoder(settings, Box::new(move |s, w, h| chosen.open(s, w, h, gop)))
    }

    /// A proxy whose encoder `open` makes (opened at the first picture, again after it failed).
    pub fn with_encoder(settings: ProxySettings, open: Opener) -> Proxy {
        Proxy {
            settings,
            open,
            encoder: None,
            scaler: None,
            picture: Vec::new(),
            groups: Groups::default(),
            failures: 0,
        }
    }

    /// Proxy frames lost to a failed scale or encode (counted on the proxy's health as drops).
    pub fn failures(&self) -> u64 {
        self.failures
    }

    pub fn settings(&self) -> ProxySettings {
        self.settings
    }

    /// The proxy's encoder as the status page shows it (empty before it opened).
    pub fn describe(&self) -> String {
        self.encoder
            .as_ref()
            .map(|e| e.describe())
            .unwrap_or_default()
    }

    /// Makes the proxy frame of one picture (I420, tight, `width` x `height`) captured at `stamp`
    /// and hands it to `sink` (the proxy's). A bad picture or encode is a proxy frame lost,
    /// counted and logged, never the camera's. `Err` when the pipeline closed (shutting down) or
    /// the encoder's device failed (the camera then fails and is retried, its reason on the card).
    pub fn feed(
        &mut self,
        sink: &mut FrameSink,
        stamp: Stamp,
        width: usize,
        height: usize,
        planes: (&[u8], &[u8], &[u8]),
    ) -> Result<(), ProxyStop> {
        let (_, key) = self
            .groups
            .next(stamp.ns, self.settings.gop, self.settings.bucket_ms);
        let (pw, ph) = (self.settings.width as usize, self.settings.height as usize);
        let au = match self.make(width, height, planes, key) {
            Ok(au) => au,
            Err(H264Error::Device(e)) => {
                self.lost(sink, &e);
                return Err(ProxyStop::Device(e));
            }
            Err(e) => {
                self.lost(sink, &e.to_string());
                return Ok(());
            }
        };
        if key {
            // Once a group: which encoder, and (a device's) the copies made so far.
            let encoder = self.describe();
            sink.health()
                .set_detail(&format!("{pw}x{ph}, encoder {encoder}"));
        }
        let media = Media::Camera {
            width: pw as u32,
            height: ph as u32,
            codec: Codec::H264,
            keyframe: au.keyframe,
        };
        let taken = sink
            .try_emit(stamp, media, Bytes::from(au.data))
            .map_err(|_| ProxyStop::Closed)?;
        if !taken {
            // Counted by the sink; the next frame opens a group afresh.
            self.groups.lost();
        }
        Ok(())
    }

    fn make(
        &mut self,
        width: usize,
        height: usize,
        planes: (&[u8], &[u8], &[u8]),
        key: bool,
    ) -> Result<crate::h264::AccessUnit, H264Error> {
        let target = (self.settings.width as usize, self.settings.height as usize);
        let bad = |e: crate::scale::BadSize| H264Error::Encoder(format!("scale: {e}"));
        if self
            .scaler
            .as_ref()
            .is_none_or(|s| s.source() != (width, height))
        {
            self.scaler = Some(Scaler::new((width, height), target).map_err(bad)?);
        }
        let scaler = self.scaler.as_mut().expect("made above");
        scaler.scale(planes, &mut self.picture).map_err(bad)?;
        if self.encoder.is_none() {
            self.encoder = Some((self.open)(self.settings.encoder, target.0, target.1)?);
        }
        let encoder = self.encoder.as_mut().expect("opened above");
        let planes = crate::scale::planes(&self.picture, target.0, target.1);
        encoder.encode(target.0, target.1, planes, key)
    }

    fn lost(&mut self, sink: &FrameSink, error: &str) {
        self.groups.lost();
        // An encoder that failed is opened afresh for the next picture (a keyframe).
        self.encoder = None;
        self.failures += 1;
        sink.health().add_drops(1);
        if self.failures.is_power_of_two() {
            tracing::warn!(source = %sink.source(), error, failures = self.failures,
                "proxy: frame lost (the camera's own frame is not affected)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h264::{AccessUnit, H264Error, RateControl};
    use crate::{ClockState, Frame};
    use std::sync::Arc;
    use tokio::sync::mpsc;

    fn settings() -> ProxySettings {
        ProxySettings {
            width: 64,
            height: 36,
            encoder: H264Settings {
                bitrate: 100_000,
                rate_control: RateControl::Bitrate,
                fps: 30.0,
            },
            gop: 3,
            bucket_ms: 33,
        }
    }

    /// A test encoder: `au` makes the access unit of picture `n` (from 1) of `width` x `height`,
    /// a keyframe asked or not; `describe` is what its card says.
    struct Scripted<F> {
        n: u32,
        au: F,
        describe: &'static str,
    }

    impl<F> VideoEncoder for Scripted<F>
    where
        F: FnMut(u32, usize, usize, bool) -> Result<AccessUnit, H264Error> + Send,
    {
        fn encode(
            &mut self,
            width: usize,
            height: usize,
            planes: (&[u8], &[u8], &[u8]),
            keyframe: bool,
        ) -> Result<AccessUnit, H264Error> {
            assert_eq!(planes.0.len(), width * height);
            self.n += 1;
            (self.au)(self.n, width, height, keyframe)
        }
        fn describe(&self) -> String {
            self.describe.into()
        }
    }

    /// An opener of [`Scripted`] encoders (each opened afresh counts from picture 1).
    fn scripted<F>(describe: &'static str, au: F) -> Opener
    where
        F: FnMut(u32, usize, usize, bool) -> Result<AccessUnit, H264Error> + Send + Clone + 'static,
    {
        Box::new(move |_, _, _| {
            Ok(Box::new(Scripted {
                n: 0,
                au: au.clone(),
                describe,
            }))
        })
    }

    /// Never fails; a keyframe when asked.
    fn steady(_: u32, _: usize, _: usize, keyframe: bool) -> Result<AccessUnit, H264Error> {
        Ok(AccessUnit {
            data: b"au".to_vec(),
            keyframe,
        })
    }

    /// Says what it was asked for: a keyframe when asked, the picture's size in the payload;
    /// fails every third picture.
    fn fake() -> Opener {
        scripted("software (OpenH264)", |n, width, height, keyframe| {
            if n % 3 == 0 {
                return Err(H264Error::Encoder("fake failure".into()));
            }
            Ok(AccessUnit {
                data: format!("{width}x{height}").into_bytes(),
                keyframe: keyframe || n == 1,
            })
        })
    }

    #[test]
    fn a_proxy_frame_keeps_its_capture_stamp_and_a_lost_one_is_counted_and_reopens_a_group() {
        let (tx, mut rx) = mpsc::channel::<Frame>(64);
        let mut sink = FrameSink::new(Arc::from("cam-proxy"), 0, tx, Arc::default());
        let mut proxy = Proxy::with_encoder(settings(), fake());
        let (w, h) = (128usize, 72usize);
        let picture = vec![100u8; w * h * 3 / 2];
        // Frames every 33 ms from bucket 30: groups of 3 buckets open at 30, 33, 36.
        for n in 0..9i64 {
            let stamp = Stamp {
                ns: (30 + n) * 33_000_000 + 5,
                state: ClockState::Locked,
            };
            proxy
                .feed(&mut sink, stamp, w, h, crate::scale::planes(&picture, w, h))
                .unwrap();
        }
        let frames: Vec<Frame> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        // Encodes 3, 6, 9 fail (buckets 32, 35, 38): counted, not emitted, numbering gapless.
        assert_eq!(proxy.failures(), 3);
        assert_eq!(sink.health().drops(), 3);
        let got: Vec<(i64, u64, bool)> = frames
            .iter()
            .map(|f| (f.capture_ns / 33_000_000, f.seq, f.media.is_keyframe()))
            .collect();
        // Keyframes open every group (30, 33, 36); the failures fall on each group's last frame,
        // after which the encoder is opened afresh (its first picture is a keyframe anyway).
        assert_eq!(
            got,
            [
                (30, 0, true),
                (31, 1, false),
                (33, 2, true),
                (34, 3, false),
                (36, 4, true),
                (37, 5, false)
            ]
        );
        assert!(frames.iter().all(|f| &f.payload[..] == b"64x36"));
        assert!(frames.iter().all(|f| f.capture_ns % 33_000_000 == 5));
    }

    #[test]
    fn a_failed_encoder_device_fails_the_camera_for_a_retry() {
        let (tx, mut rx) = mpsc::channel::<Frame>(8);
        let mut sink = FrameSink::new(Arc::from("cam-proxy"), 0, tx, Arc::default());
        // An encoder device that fails after its first picture.
        let vanishing = scripted("m2m /dev/video9", |n, w, h, key| match n {
            1 => steady(n, w, h, key),
            _ => Err(H264Error::Device("/dev/video9: gone (Gone)".into())),
        });
        let mut proxy = Proxy::with_encoder(settings(), vanishing);
        let picture = vec![0u8; 128 * 72 * 3 / 2];
        let planes = crate::scale::planes(&picture, 128, 72);
        let stamp = |n: i64| Stamp {
            ns: n * 33_000_000,
            state: ClockState::Unsynced,
        };
        proxy.feed(&mut sink, stamp(30), 128, 72, planes).unwrap();
        assert_eq!(sink.health().detail(), "64x36, encoder m2m /dev/video9");
        let stop = proxy
            .feed(&mut sink, stamp(31), 128, 72, planes)
            .unwrap_err();
        let e = stop.into_source_error("cam");
        assert!(e.retryable(), "{e}");
        assert!(e.to_string().contains("/dev/video9: gone"), "{e}");
        assert_eq!(sink.health().drops(), 1);
        assert_eq!(rx.try_recv().unwrap().seq, 0);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_full_proxy_lane_drops_the_proxy_frame_without_waiting() {
        let (tx, mut rx) = mpsc::channel::<Frame>(1);
        let mut sink = FrameSink::new(Arc::from("cam-proxy"), 0, tx, Arc::default());
        let mut proxy = Proxy::with_encoder(settings(), scripted("software (OpenH264)", steady));
        let picture = vec![0u8; 128 * 72 * 3 / 2];
        let stamp = |n: i64| Stamp {
            ns: n * 33_000_000,
            state: ClockState::Unsynced,
        };
        let planes = crate::scale::planes(&picture, 128, 72);
        proxy.feed(&mut sink, stamp(30), 128, 72, planes).unwrap();
        // The channel is full: dropped at once, counted, the next frame a keyframe.
        proxy.feed(&mut sink, stamp(31), 128, 72, planes).unwrap();
        assert_eq!(sink.health().drops(), 1);
        assert_eq!(rx.try_recv().unwrap().seq, 0);
        proxy.feed(&mut sink, stamp(32), 128, 72, planes).unwrap();
        let next = rx.try_recv().unwrap();
        assert_eq!((next.seq, next.media.is_keyframe()), (1, true));
    }

    #[cfg(feature = "h264")]
    #[test]
    fn the_software_proxy_of_the_pan_is_h264_of_the_proxy_size() {
        let (tx, mut rx) = mpsc::channel::<Frame>(64);
        let mut sink = FrameSink::new(Arc::from("cam-proxy"), 0, tx, Arc::default());
        let mut proxy = Proxy::new(ProxySettings {
            width: 160,
            height: 90,
            ..settings()
        });
        let mut pan = crate::scene::Pan::new(320, 180);
        for n in 0..6u64 {
            let stamp = Stamp {
                ns: (30 + n as i64) * 33_000_000,
                state: ClockState::Locked,
            };
            proxy.feed(&mut sink, stamp, 320, 180, pan.draw(n)).unwrap();
        }
        let frames: Vec<Frame> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(frames.len(), 6);
        let first = crate::h264::decode_keyframe(&frames[0].payload).unwrap();
        assert_eq!((first.width, first.height), (160, 90));
        let keys: Vec<bool> = frames.iter().map(|f| f.media.is_keyframe()).collect();
        assert_eq!(keys, [true, false, false, true, false, false]);
    }

    /// CPU time of this thread (ns): what a step costs whatever else runs on the machine.
    #[cfg(feature = "h264")]
    #[allow(unsafe_code)] // one clock_gettime into a local timespec
    fn thread_cpu_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// A 1080p30 H.264 camera with its proxy, step by step as its capture thread runs them: the
    /// pan drawn, the full picture encoded (2 Mbit/s), scaled to 854x480, the proxy encoded (300
    /// kbit/s); thread CPU time per picture, and the share of the two OpenH264 encodes (what a
    /// hardware M2M encoder takes off the CPU). docs/PERFORMANCE.md "Four cameras with proxies":
    /// `cargo test --release --locked -p rigd-drivers --features h264 --lib -- --ignored --nocapture bench_camera_thread`
    #[cfg(feature = "h264")]
    #[test]
    #[ignore = "benchmark"]
    fn bench_camera_thread() {
        let (w, h, n) = (1920usize, 1080usize, 150u64);
        let mut pan = crate::scene::Pan::new(w, h);
        let settings = |bitrate| H264Settings {
            bitrate,
            rate_control: RateControl::Bitrate,
            fps: 30.0,
        };
        let mut full = crate::h264::software_encoder(settings(2_000_000)).unwrap();
        let mut proxy = crate::h264::software_encoder(settings(300_000)).unwrap();
        let mut scaler = Scaler::new((w, h), (854, 480)).unwrap();
        let mut small = Vec::new();
        let mut ns = [0u64; 4];
        for i in 0..n {
            let key = i % 30 == 0;
            let t0 = thread_cpu_ns();
            let planes = pan.draw(i);
            let t1 = thread_cpu_ns();
            full.encode(w, h, planes, key).unwrap();
            let t2 = thread_cpu_ns();
            scaler.scale(planes, &mut small).unwrap();
            let t3 = thread_cpu_ns();
            proxy
                .encode(854, 480, crate::scale::planes(&small, 854, 480), key)
                .unwrap();
            let t4 = thread_cpu_ns();
            for (acc, d) in ns.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3]) {
                *acc += d;
            }
        }
        let ms = |x: u64| x as f64 / 1e6 / n as f64;
        let total: u64 = ns.iter().sum();
        println!(
            "1080p30 camera + proxy, thread CPU per picture: draw {:.2} ms, full encode {:.2} ms, scale {:.2} ms, proxy encode {:.2} ms = {:.2} ms ({:.0} % of a core at 30 fps); the two encodes {:.0} % of it",
            ms(ns[0]),
            ms(ns[1]),
            ms(ns[2]),
            ms(ns[3]),
            ms(total),
            total as f64 / 1e9 / n as f64 * 30.0 * 100.0,
            (ns[1] + ns[3]) as f64 * 100.0 / total as f64
        );
    }

    /// A 1080p30 camera's proxy at 854x480 and 300 kbit/s, on the textured pan: time per picture
    /// (wall, one thread) for the scale and for the encode, and the share of a core at 30 fps.
    /// docs/PERFORMANCE.md "Proxy":
    /// `cargo test --release --locked -p rigd-drivers --features h264 --lib -- --ignored --nocapture bench_proxy`
    #[cfg(feature = "h264")]
    #[test]
    #[ignore = "benchmark"]
    fn bench_proxy() {
        let (w, h, n) = (1920usize, 1080usize, 150u64);
        let mut pan = crate::scene::Pan::new(w, h);
        let pictures: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let (y, u, v) = pan.draw(i);
                [y, u, v].concat()
            })
            .collect();
        let mut scaler = Scaler::new((w, h), (854, 480)).unwrap();
        let mut enc = crate::h264::software_encoder(H264Settings {
            bitrate: 300_000,
            rate_control: RateControl::Bitrate,
            fps: 30.0,
        })
        .unwrap();
        let mut small = Vec::new();
        let (mut scale_s, mut encode_s, mut bytes) = (0f64, 0f64, 0usize);
        // RIGD_PROXY_OUT=DIR: the source (source.yuv, I420 1080p) and the proxy (proxy.h264)
        // written there, for ffmpeg's SSIM against the source scaled to the proxy's size.
        let out = std::env::var_os("RIGD_PROXY_OUT").map(std::path::PathBuf::from);
        let (mut source_file, mut proxy_file) = (Vec::new(), Vec::new());
        for (i, p) in pictures.iter().enumerate() {
            let t = std::time::Instant::now();
            scaler
                .scale(crate::scale::planes(p, w, h), &mut small)
                .unwrap();
            scale_s += t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            let au = enc
                .encode(
                    854,
                    480,
                    crate::scale::planes(&small, 854, 480),
                    i % 30 == 0,
                )
                .unwrap();
            encode_s += t.elapsed().as_secs_f64();
            bytes += au.data.len();
            if out.is_some() {
                source_file.extend_from_slice(p);
                proxy_file.extend_from_slice(&au.data);
            }
        }
        if let Some(dir) = &out {
            std::fs::write(dir.join("source.yuv"), &source_file).unwrap();
            std::fs::write(dir.join("proxy.h264"), &proxy_file).unwrap();
        }
        let per = |s: f64| s * 1e3 / n as f64;
        println!(
            "proxy 1920x1080 -> 854x480 @ 300 kbit/s: scale {:.2} ms + encode {:.2} ms per picture = {:.0} % of a core at 30 fps; {:.0} kbit/s",
            per(scale_s),
            per(encode_s),
            (scale_s + encode_s) / n as f64 * 30.0 * 100.0,
            bytes as f64 * 8.0 / (n as f64 / 30.0) / 1000.0
        );
    }
}
