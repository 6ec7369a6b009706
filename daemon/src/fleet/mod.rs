//! The fleet's coverage index (docs/FLEET.md): each rig publishes a digest of what it holds and
//! where it was to one compacted topic keyed by rig, and the operator asks it which rigs hold
//! which ranges of which sources at a place and time, then recalls them.
//!
//! - [`digest`]: the digest, built from recall's held ranges and the track, and its encoding (pure).
//! - [`query`]: a place-and-time query over digests (pure).
//! - [`track`]: the rig's GPS track from its NMEA sources, thinned as fixes come.
//! - [`publish`]: the rig's publisher of its digest.
//! - [`synth`]: synthetic rigs' digests with the same code (tests, benchmarks).
//! - [`cli`]: `rigd fleet coverage` and `rigd fleet recall`.

pub mod cli;
pub mod digest;
pub mod publish;
pub mod query;
pub mod synth;
pub mod track;
