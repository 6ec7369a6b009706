//! rigd capture sources: the [`Frame`] every source produces, the [`Source`] trait the daemon runs,
//! the [`FrameClock`] that stamps frames, and one module per device kind.
//!
//! Sources run on their own threads (device APIs block) and hand frames to a [`FrameSink`], which
//! assigns the per-source sequence number and passes them to the daemon's pipeline.

pub mod audio;
pub mod camera;
mod clock;
mod frame;
pub mod serial;
mod source;
pub mod synthetic;
#[cfg(feature = "turbojpeg")]
pub mod turbojpeg;
pub mod v4l;
#[cfg(feature = "v4l")]
mod v4l_mplane;

pub use clock::{
    monotonic_ns_now, realtime_ns, ClockState, FrameClock, KernelClock, Stamp, SystemClock,
};
pub use frame::{Frame, Media, Modality};
pub use source::{
    AudioLevel, FrameSink, SeqJump, SinkClosed, Source, SourceError, SourceHealth, SourceState,
    StopFlag,
};
