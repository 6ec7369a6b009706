//! A camera's `encoder` resolved on the rig (docs/DRIVERS.md "Encoder choice"): OpenH264
//! (`h264`) or a V4L2 memory-to-memory encoder (`m2m`), both behind `h264::VideoEncoder`. Its own
//! module so that neither of those imports the other.

use crate::h264::{software_encoder, H264Error, H264Settings, VideoEncoder};

/// A camera's `encoder` (docs/DRIVERS.md "Encoder choice"): `auto` (the default) takes the rig's
/// first V4L2 memory-to-memory H.264 encoder and software when it has none; `software` never
/// looks; a device path names the node (an error when it is not an M2M H.264 encoder).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum EncoderChoice {
    #[default]
    Auto,
    Software,
    Device(String),
}

impl TryFrom<String> for EncoderChoice {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "auto" => Ok(EncoderChoice::Auto),
            "software" => Ok(EncoderChoice::Software),
            p if p.starts_with('/') && !p.contains('\0') => Ok(EncoderChoice::Device(s)),
            _ => Err(format!(
                "encoder `{s}`: must be \"auto\", \"software\" or a device path (\"/dev/videoN\")"
            )),
        }
    }
}

impl From<EncoderChoice> for String {
    fn from(c: EncoderChoice) -> String {
        match c {
            EncoderChoice::Auto => "auto".into(),
            EncoderChoice::Software => "software".into(),
            EncoderChoice::Device(p) => p,
        }
    }
}

/// The encoder a camera's streams get once `encoder` is resolved on the rig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chosen {
    /// OpenH264 on the CPU.
    Software,
    /// A V4L2 memory-to-memory H.264 encoder (`crate::m2m`).
    Device(std::path::PathBuf),
}

impl EncoderChoice {
    /// What `self` resolves to, `find` naming the rig's first M2M H.264 encoder (asked only for
    /// `auto`). Pure: the rig's side is `find`.
    pub fn choose(&self, find: impl FnOnce() -> Option<std::path::PathBuf>) -> Chosen {
        match self {
            EncoderChoice::Auto => find().map_or(Chosen::Software, Chosen::Device),
            EncoderChoice::Software => Chosen::Software,
            EncoderChoice::Device(p) => Chosen::Device(p.into()),
        }
    }

    /// [`EncoderChoice::choose`] on this rig: `/dev/video*` scanned for an M2M H.264 encoder.
    pub fn resolve(&self) -> Chosen {
        self.choose(find_m2m_h264)
    }
}

fn find_m2m_h264() -> Option<std::path::PathBuf> {
    #[cfg(all(feature = "v4l", target_os = "linux"))]
    {
        crate::m2m::find_encoder(*b"H264")
    }
    #[cfg(not(all(feature = "v4l", target_os = "linux")))]
    {
        None
    }
}

impl Chosen {
    /// Opens an encoder of this kind for pictures of `width` x `height` (I420), keyframes
    /// placed by the caller (`gop` frames is only the device's own, longer fallback).
    pub fn open(
        &self,
        settings: H264Settings,
        width: usize,
        height: usize,
        gop: u32,
    ) -> Result<Box<dyn VideoEncoder>, H264Error> {
        match self {
            Chosen::Software => software_encoder(settings),
            Chosen::Device(path) => open_m2m(path, settings, width, height, gop),
        }
    }
}

#[cfg(all(feature = "v4l", target_os = "linux"))]
fn open_m2m(
    path: &std::path::Path,
    settings: H264Settings,
    width: usize,
    height: usize,
    gop: u32,
) -> Result<Box<dyn VideoEncoder>, H264Error> {
    let hints = crate::m2m::EncoderHints {
        bitrate: Some(settings.bitrate),
        // rigd forces the keyframes it needs; the device's own interval is a long fallback.
        gop: Some(gop.saturating_mul(2).max(1)),
    };
    crate::m2m::M2mEncoder::open(path, width as u32, height as u32, *b"YU12", *b"H264", hints)
        .map(|e| Box::new(e) as Box<dyn VideoEncoder>)
        .map_err(|e| H264Error::Device(e.to_string()))
}

#[cfg(not(all(feature = "v4l", target_os = "linux")))]
fn open_m2m(
    path: &std::path::Path,
    _settings: H264Settings,
    _width: usize,
    _height: usize,
    _gop: u32,
) -> Result<Box<dyn VideoEncoder>, H264Error> {
    Err(H264Error::Device(format!(
        "{}: this rigd was built without V4L2 (feature `v4l`)",
        path.display()
    )))
}

/// Whether `path` is a node rigd can encode H.264 on (`rigd check` of `encoder = "/dev/..."`):
/// `Err` says what it is instead.
pub fn check_encoder_device(path: &str) -> Result<(), String> {
    #[cfg(all(feature = "v4l", target_os = "linux"))]
    {
        crate::m2m::check_encoder(std::path::Path::new(path), *b"H264")
    }
    #[cfg(not(all(feature = "v4l", target_os = "linux")))]
    {
        Err(format!(
            "{path}: this rigd was built without V4L2 (feature `v4l`), so no M2M encoder"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoder_choice_auto_takes_a_device_when_there_is_one() {
        let parse = |s: &str| EncoderChoice::try_from(s.to_string());
        assert_eq!(parse("auto"), Ok(EncoderChoice::Auto));
        assert_eq!(parse("software"), Ok(EncoderChoice::Software));
        assert_eq!(
            parse("/dev/video11"),
            Ok(EncoderChoice::Device("/dev/video11".into()))
        );
        for bad in ["", "hardware", "video11", "Auto"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("\"auto\", \"software\" or a device path"), "{e}");
        }
        assert_eq!(EncoderChoice::default(), EncoderChoice::Auto);
        let dev = || Some(std::path::PathBuf::from("/dev/video11"));
        let none = || None;
        assert_eq!(
            EncoderChoice::Auto.choose(dev),
            Chosen::Device("/dev/video11".into())
        );
        assert_eq!(EncoderChoice::Auto.choose(none), Chosen::Software);
        // `software` never looks; a named device is taken as named (checked when opened).
        let never = || -> Option<std::path::PathBuf> { panic!("looked for a device") };
        assert_eq!(EncoderChoice::Software.choose(never), Chosen::Software);
        assert_eq!(
            EncoderChoice::Device("/dev/video3".into()).choose(never),
            Chosen::Device("/dev/video3".into())
        );
        assert_eq!(String::from(EncoderChoice::Auto), "auto");
    }
}
