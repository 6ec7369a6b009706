//! The per-source lane between capture and Pulsar: publish live while the uplink keeps up, spill to
//! the spool when it cannot, and drain the spool in capture order.
//!
//! One lane task per source owns that source's order end to end: it is the only writer of the
//! source's spool records and the only submitter to its producers, so its order needs no locks.
//! With `drain = "in-order"` spooled frames go before newer frames. With `live-first` (the
//! default), once an outage is over new frames go out live under a new sending epoch (a producer
//! name of their own, see [`epochs`]) while the backlog drains oldest first under the producer
//! it was captured for, with what the budget leaves. In `always` mode every frame is appended
//! first and published, in order, once its group commit is durable.

//!
//! The rules are a value, [`lane::Lane`] (pure, unit-tested); [`task::LaneTask`] performs them
//! (the spool, the producers, the counters).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

mod backlog;
pub mod epochs;
pub mod lane;
mod task;

pub use backlog::{Backlog, Route};
pub use task::{LaneTask, Observer};

use crate::uplink::{Ack, ProducerConfig, ProducerStats, TopicProducer};

/// Lane counters for status and metrics.
#[derive(Debug, Default)]
pub struct LaneStats {
    pub already_persisted: AtomicU64,
    /// Frames spooled while the uplink was up: its window was full (the budget spent).
    pub waiting_for_bandwidth: AtomicU64,
    /// Live-first splits: new frames moved to a new epoch while a backlog drains.
    pub splits: AtomicU64,
    /// Submission-to-receipt latency of published frames (web UI and `/metrics`).
    pub latency: crate::metrics::LatencyHistogram,
    /// Capture-to-receipt latency of frames published live (not from the spool), per source.
    pub capture_latency: crate::metrics::LatencyHistogram,
    /// The latest frames for the web UI (a reference to a payload a few times a second).
    pub preview: crate::metrics::Preview,
    /// The live view's tap (Foxglove): hands frames over only while a client subscribes.
    pub live: crate::live::Tap,
    /// Beats on every turn of the lane loop, and at least once a second while idle (watchdog).
    pub heartbeat: crate::lifecycle::Heartbeat,
}

/// How a lane opens producers: one per sending epoch ([`epochs`]), all sharing the source's
/// stats and the budget.
pub struct Uplink {
    /// Epoch 0's settings; the others differ in name, rank and `fresh`.
    pub config: ProducerConfig,
    pub priority: u8,
    pub shutdown: watch::Receiver<bool>,
}

impl Uplink {
    fn spawn(
        &self,
        source: &str,
        start: u64,
        backlog: bool,
        fresh: bool,
        acks: &mpsc::UnboundedSender<Ack>,
    ) -> TopicProducer {
        let mut cfg = self.config.clone();
        cfg.producer_name = crate::wire::epoch_producer_name(&cfg.rig, source, start);
        cfg.rank = crate::uplink::budget::rank(self.priority, backlog);
        cfg.fresh = fresh;
        TopicProducer::spawn(cfg, acks.clone(), self.shutdown.clone())
    }
}

/// Read-only view of a producer's state for status.
pub type UplinkStats = Arc<ProducerStats>;
