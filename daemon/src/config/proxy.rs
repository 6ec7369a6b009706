//! A camera's `proxy = { width, height, bitrate }`: a second, small H.264 stream of the same
//! pictures, published live as a source of its own, `{id}-proxy` (docs/DRIVERS.md "Proxy").
//!
//! The table is read on the camera kinds that encode H.264 on the rig (`synthetic-camera` and
//! `v4l` with `codec = "h264"`); everything downstream (lane, spool counters, numbering, topic,
//! status card, live channel, recall's list of sources) sees the proxy as the source
//! [`SourceKind::Proxy`] that [`with_proxies`] adds right after its camera when the daemon starts.
//! That source is never read from a file and never opened: its camera's capture thread feeds it.

use super::*;

/// `proxy = { width = 854, height = 480, bitrate = "300kbit" }` on a camera.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ProxyConfig {
    #[serde(default = "default_proxy_width")]
    pub width: u32,
    #[serde(default = "default_proxy_height")]
    pub height: u32,
    #[serde(default = "default_proxy_bitrate")]
    pub bitrate: Bandwidth,
}

fn default_proxy_width() -> u32 {
    854
}
fn default_proxy_height() -> u32 {
    480
}
fn default_proxy_bitrate() -> Bandwidth {
    Bandwidth(300_000)
}

/// The id of camera `camera`'s proxy.
pub fn proxy_id(camera: &str) -> String {
    format!("{camera}-proxy")
}

/// What a camera's proxy cannot be: `encoded` is false for a camera whose frames rigd does not
/// encode (H.264 passed through, a synthetic `clip`), whose pictures it never has to scale.
pub(super) fn proxy_problems(
    p: &mut Vec<String>,
    key: &str,
    proxy: &ProxyConfig,
    camera: (rigd_drivers::Codec, u32, u32),
    encoded: Result<(), &str>,
) {
    let (codec, width, height) = camera;
    if codec != rigd_drivers::Codec::H264 {
        p.push(format!(
            "{key}.proxy: needs codec = \"h264\" (the proxy is a second H.264 encode of the camera's raw pictures)"
        ));
        return;
    }
    if let Err(why) = encoded {
        p.push(format!(
            "{key}.proxy: needs the camera's pictures encoded on the rig, not {why}"
        ));
    }
    for (name, v, of) in [
        ("width", proxy.width, width),
        ("height", proxy.height, height),
    ] {
        if v < 16 || v % 2 != 0 {
            p.push(format!(
                "{key}.proxy.{name}: {v} must be even and at least 16"
            ));
        } else if v > of {
            p.push(format!(
                "{key}.proxy.{name}: {v} is above the camera's {name} ({of}): a proxy is a downscale"
            ));
        }
    }
    if !(10_000..=100_000_000).contains(&proxy.bitrate.0) {
        p.push(format!(
            "{key}.proxy.bitrate: {}bit must be between 10kbit and 100mbit",
            proxy.bitrate.0
        ));
    }
}

/// The proxies' ids against every source's: `{id}-proxy` must name no other source, and fit
/// the spool record as any id does.
pub(super) fn proxy_id_problems(config: &Config, p: &mut Vec<String>) {
    let proxies: Vec<(usize, String)> = config
        .sources
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind.get().proxy().is_some())
        .map(|(i, s)| (i, proxy_id(s.id())))
        .collect();
    for (i, id) in &proxies {
        if id.len() > MAX_SOURCE_ID_BYTES {
            p.push(format!(
                "{}.id: its proxy's id `{id}` is above {MAX_SOURCE_ID_BYTES} bytes",
                config.source_key(*i)
            ));
        }
    }
    for (i, s) in config.sources.iter().enumerate() {
        if let Some((j, id)) = proxies.iter().find(|(_, id)| id == s.id()) {
            p.push(format!(
                "{}.id: `{id}` is the id of {}'s proxy (a source of its own): rename one",
                config.source_key(i),
                config.source_key(*j)
            ));
        }
    }
}

/// The source a camera's proxy is downstream (never in a file: [`with_proxies`]).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ProxySourceConfig {
    /// The camera whose capture feeds it.
    pub camera: String,
    pub width: u32,
    pub height: u32,
    pub bitrate: Bandwidth,
    pub fps: f64,
    /// The camera's `gop` (the rig's group width).
    pub gop: u32,
}

impl ProxySourceConfig {
    /// What the camera's driver makes the proxy with.
    pub fn settings(&self, bucket_ms: u32) -> rigd_drivers::proxy::ProxySettings {
        proxy_settings(
            &ProxyConfig {
                width: self.width,
                height: self.height,
                bitrate: self.bitrate,
            },
            self.fps,
            self.gop,
            bucket_ms,
        )
    }
}

/// A camera's proxy settings for its driver.
pub(super) fn proxy_settings(
    proxy: &ProxyConfig,
    fps: f64,
    gop: u32,
    bucket_ms: u32,
) -> rigd_drivers::proxy::ProxySettings {
    rigd_drivers::proxy::ProxySettings {
        width: proxy.width,
        height: proxy.height,
        encoder: rigd_drivers::h264::H264Settings {
            bitrate: proxy.bitrate.0.min(u64::from(u32::MAX)) as u32,
            rate_control: rigd_drivers::h264::RateControl::Bitrate,
            fps,
        },
        gop,
        bucket_ms,
    }
}

/// The proxy's source: it captures nothing itself, its camera's thread feeds its sink.
struct FedByCamera(String);

impl rigd_drivers::Source for FedByCamera {
    fn id(&self) -> &str {
        &self.0
    }
    fn run(
        &mut self,
        _sink: &mut rigd_drivers::FrameSink,
        stop: &rigd_drivers::StopFlag,
    ) -> Result<(), rigd_drivers::SourceError> {
        while !stop.sleep(std::time::Duration::from_secs(3600)) {}
        Ok(())
    }
}

impl Kind for ProxySourceConfig {
    fn modality(&self) -> Modality {
        Modality::Camera
    }
    fn frame_interval(&self, _bucket_ms: u32) -> Option<std::time::Duration> {
        (self.fps.is_finite() && self.fps > 0.0)
            .then(|| std::time::Duration::from_secs_f64(1.0 / self.fps))
    }
    fn open(
        &self,
        id: &str,
        _bucket_ms: u32,
        _clock: std::sync::Arc<dyn rigd_drivers::FrameClock>,
    ) -> Box<dyn rigd_drivers::Source> {
        Box::new(FedByCamera(id.to_string()))
    }
    fn gop(&self, _bucket_ms: u32) -> Option<u32> {
        Some(self.gop)
    }
    fn problems(&self, _p: &mut Vec<String>, _key: &str, _limits: &Limits) {}
}

impl SourceConfig {
    /// The source of this camera's proxy (`{id}-proxy`): the camera's priority and drain, always
    /// `upload = "live"` (the full resolution follows the camera's own `upload`), no retention.
    pub fn proxy(&self, bucket_ms: u32) -> Option<SourceConfig> {
        let proxy = self.kind.get().proxy()?;
        let fps = self
            .frame_interval(bucket_ms)
            .map_or(0.0, |d| 1.0 / d.as_secs_f64());
        Some(SourceConfig {
            head: Head {
                id: proxy_id(self.id()),
                priority: Some(self.priority()),
                drain: self.drain(),
                upload: Upload::Live,
                retain_age: None,
                retain_bytes: None,
            },
            kind: SourceKind::Proxy(ProxySourceConfig {
                camera: self.id().to_string(),
                width: proxy.width,
                height: proxy.height,
                bitrate: proxy.bitrate,
                fps,
                gop: self.gop(bucket_ms).unwrap_or(1),
            }),
        })
    }

    /// The camera this source is the proxy of.
    pub fn proxy_of(&self) -> Option<&str> {
        match &self.kind {
            SourceKind::Proxy(p) => Some(&p.camera),
            _ => None,
        }
    }
}

/// The sources as the daemon runs them: each camera with a `proxy` followed by its proxy's
/// source ([`SourceConfig::proxy`]).
pub fn with_proxies(sources: &[SourceConfig], bucket_ms: u32) -> Vec<SourceConfig> {
    let mut all = Vec::with_capacity(sources.len());
    for s in sources {
        all.push(s.clone());
        all.extend(s.proxy(bucket_ms));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAMERA: &str = "[rig]\nid = \"r\"\n[[source]]\nid = \"cam\"\nkind = \"synthetic-camera\"\nwidth = 640\nheight = 360\ncodec = \"h264\"\n";

    fn problems(text: &str) -> Vec<String> {
        match Config::parse(text, "t") {
            Ok(_) => Vec::new(),
            Err(e) => e.to_string().lines().map(str::to_string).collect(),
        }
    }

    #[test]
    fn a_camera_proxy_is_a_live_source_of_its_own_after_its_camera() {
        let text = format!(
            "{CAMERA}priority = 4\nupload = \"on-request\"\nretain-age = \"1h\"\nproxy = {{ width = 320, height = 180, bitrate = \"150kbit\" }}\n[[source]]\nid = \"gps\"\nkind = \"synthetic-serial\"\n"
        );
        let c = Config::parse(&text, "t").unwrap();
        assert_eq!(c.sources.len(), 2, "the file's sources only");
        let all = with_proxies(&c.sources, 33);
        let ids: Vec<&str> = all.iter().map(|s| s.id()).collect();
        assert_eq!(ids, ["cam", "cam-proxy", "gps"]);
        let p = &all[1];
        assert_eq!(p.proxy_of(), Some("cam"));
        assert_eq!(p.kind(), "proxy");
        assert_eq!(p.priority(), 4);
        assert_eq!(p.head().upload, Upload::Live);
        assert_eq!(p.head().retain_age, None);
        assert_eq!(p.modality(), Modality::Camera);
        assert_eq!(p.gop(33), Some(30));
        assert_eq!(
            p.frame_interval(33),
            Some(std::time::Duration::from_secs_f64(1.0 / 30.0))
        );
        let SourceKind::Proxy(k) = &p.kind else {
            panic!()
        };
        let s = k.settings(33);
        assert_eq!((s.width, s.height, s.encoder.bitrate), (320, 180, 150_000));
        assert_eq!((s.gop, s.bucket_ms), (30, 33));
        // Defaults: 854x480 at 300kbit.
        let hd = CAMERA.replace("width = 640\nheight = 360", "width = 1280\nheight = 720");
        let c = Config::parse(&format!("{hd}proxy = {{}}\n"), "t").unwrap();
        let all = with_proxies(&c.sources, 33);
        let SourceKind::Proxy(k) = &all[1].kind else {
            panic!()
        };
        assert_eq!((k.width, k.height, k.bitrate.0), (854, 480, 300_000));
    }

    #[test]
    fn check_refuses_a_proxy_that_cannot_be_made() {
        let jpeg = "[rig]\nid = \"r\"\n[[source]]\nid = \"cam\"\nkind = \"synthetic-camera\"\nproxy = { width = 320, height = 180 }\n";
        let p = problems(jpeg);
        assert!(
            p.iter()
                .any(|l| l.contains("source[0].proxy: needs codec = \"h264\"")),
            "{p:?}"
        );
        let p = problems(&format!(
            "{CAMERA}proxy = {{ width = 1280, height = 181, bitrate = \"1kbit\" }}\n"
        ));
        assert!(
            p.iter()
                .any(|l| l.contains("proxy.width: 1280 is above the camera's width (640)")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|l| l.contains("proxy.height: 181 must be even")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|l| l.contains("proxy.bitrate: 1000bit")),
            "{p:?}"
        );
        let p = problems(&format!(
            "{CAMERA}proxy = {{ width = 320, heigth = 180 }}\n"
        ));
        assert!(p.iter().any(|l| l.contains("heigth")), "{p:?}");
        let clip =
            format!("{CAMERA}clip = \"/dev/null\"\nproxy = {{ width = 320, height = 180 }}\n");
        let p = problems(&clip);
        assert!(
            p.iter()
                .any(|l| l
                    .contains("proxy: needs the camera's pictures encoded on the rig, not a clip")),
            "{p:?}"
        );
        let v4l = "[rig]\nid = \"r\"\n[[source]]\nid = \"front\"\nkind = \"v4l\"\ndevice = \"/dev/video9\"\ncodec = \"h264\"\nformats = [\"H264\", \"YUYV\"]\nproxy = { width = 320, height = 180 }\n";
        let p = problems(v4l);
        assert!(p.iter().any(|l| l.contains("source[0].proxy: needs the camera's pictures encoded on the rig, not H264 passed through")), "{p:?}");
        let ok = v4l.replace("\"H264\", ", "");
        assert_eq!(problems(&ok), Vec::<String>::new());
        // `cam-proxy` is the proxy's id: no other source may have it.
        let clash = format!(
            "{CAMERA}proxy = {{ width = 320, height = 180 }}\n[[source]]\nid = \"cam-proxy\"\nkind = \"synthetic-serial\"\n"
        );
        let p = problems(&clash);
        assert!(
            p.iter()
                .any(|l| l.contains("`cam-proxy`") && l.contains("proxy")),
            "{p:?}"
        );
        assert_eq!(
            problems(&format!(
                "{CAMERA}proxy = {{ width = 320, height = 180 }}\n"
            )),
            Vec::<String>::new()
        );
    }
}
