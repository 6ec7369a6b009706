//! rigd capture sources: the [`Frame`] every source produces, the [`Source`] trait the daemon runs,
//! the [`FrameClock`] that stamps frames, and one module per device kind.
//!
//! Sources run on their own threads (device APIs block) and hand frames to a [`FrameSink`], which
//! assigns the per-source sequence number and passes them to the daemon's pipeline.

pub mod annexb;
pub mod audio;
pub mod camera;
pub mod can;
pub mod can_record;
mod clock;
pub mod encoder;
mod frame;
pub mod h264;
#[cfg(all(feature = "v4l", target_os = "linux"))]
pub mod m2m;
pub mod proxy;
pub mod scale;
pub mod scene;
pub mod serial;
mod source;
pub mod synthetic;
pub mod synthetic_can;
pub mod synthetic_track;
/// Not a source: the one socket query the uplink needs that takes `unsafe` (kept here, where the
/// workspace's unsafe code lives).
pub mod tcp;
#[cfg(feature = "turbojpeg")]
pub mod turbojpeg;
pub mod v4l;
#[cfg(feature = "v4l")]
mod v4l_mplane;

pub use clock::{
    monotonic_ns_now, realtime_ns, ClockState, FrameClock, KernelClock, Stamp, SystemClock,
};
pub use frame::{group_start, Codec, Frame, Media, Modality};
pub use source::{
    AudioLevel, FrameSink, SeqJump, SinkClosed, Source, SourceError, SourceHealth, SourceState,
    StopFlag,
};
