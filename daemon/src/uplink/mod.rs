//! The uplink to Apache Pulsar: a producer per source that speaks the binary protocol itself
//! (the `pulsar` crate supplies only the protocol types), with native chunking for large frames
//! and sequence ids that make broker-side deduplication exact across restarts.

mod codec;
pub mod plan;
mod producer;

pub use producer::{Ack, Outcome, Producer, ProducerConfig, ProducerStats};
