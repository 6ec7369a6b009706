//! The running daemon as the status page and the control actions see it ([`Runtime`]): built by
//! [`crate::app::run`], read by [`crate::status`] and [`crate::control`].

use rigd_drivers::{FrameClock, SourceHealth};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::{Config, Modality};
use crate::pipeline::LaneStats;
use crate::spool::Spool;
use crate::uplink::ProducerStats;

/// What status reads for one source.
pub struct SourceEntry {
    pub id: Arc<str>,
    pub kind: &'static str,
    pub modality: Modality,
    pub health: Arc<SourceHealth>,
    pub lane: Arc<LaneStats>,
    pub uplink: Option<Arc<ProducerStats>>,
    /// Uplink priority (0 first).
    pub priority: u8,
    /// `on-request`: held on the rig, not published live.
    pub on_request: bool,
}

/// Everything the status API reads.
pub struct Runtime {
    pub config: Config,
    pub started: Instant,
    pub clock: Arc<dyn FrameClock>,
    /// The PTP port's clock and report, when `[clock].interface` is set.
    pub ptp: Option<Arc<crate::clock::Ptp>>,
    pub sources: Vec<SourceEntry>,
    pub spool: Arc<Spool>,
    /// Raised by a technician (web UI): the lanes submit nothing new and spool instead.
    pub uplink_paused: Arc<AtomicBool>,
    /// Technician event markers (the internal `events` source, crate::events).
    pub events: crate::events::EventMarker,
    /// Counter samples that status keeps to compute rates.
    pub observed: Mutex<crate::metrics::Observed>,
    /// The live view's channels and clients (`/foxglove`).
    pub live: Arc<rigd_web::live::LiveHub>,
    /// `[pulsar] tls-cert-file`, read at start, for the status's `uplink.credentials`.
    pub client_cert: Option<crate::uplink::identity::ClientCert>,
    /// Recall's shared state, for its status and a marker's upload; absent without a broker or
    /// without an on-request source (then nothing can be recalled).
    pub recall: Option<Arc<crate::recall::Recall>>,
    /// The rig's connections over its links, each with its budget, for status (under `auto`:
    /// the estimates); None without a broker.
    pub pool: Option<Arc<crate::uplink::Pool>>,
}
