//! rigd's status web UI and HTTP API. Knows nothing of the daemon's internals: the daemon hands it a
//! [`StatusSource`] (what to show) and a [`Control`] (what a technician may ask it to do), and it
//! serves the page, `/api/status`, the live stream, `/metrics`, `/healthz`, `/readyz` and the control actions,
//! and with a [`live::LiveHub`] the live view for Foxglove at `/foxglove`.
//! docs/WEB.md documents every route and field.
//!
//! Hostile clients are bounded: request bodies are capped ([`MAX_BODY_BYTES`]), every request but
//! the live stream has a deadline ([`REQUEST_TIMEOUT`]), live streams are capped
//! ([`MAX_STREAMS`], then 503), assets are served from a fixed embedded table (no file system), and
//! control actions need the configured bearer token, compared in constant time. Below the router,
//! [`serve`] bounds connections: a deadline for the request head and for idle keep-alive, a cap on
//! open connections, and a shutdown that finishes within a short grace ([`ServeLimits`]).

#![forbid(unsafe_code)]

pub mod access;
mod alerts;
pub mod live;
pub mod peers;
mod prometheus;
mod serve;
pub mod site;

pub use alerts::{alerts, Alert};
pub use serve::{serve, serve_tls, tls_server_config, ServeLimits};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Largest request body accepted (control actions carry a short JSON object at most).
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Live status streams served at once; more get 503.
pub const MAX_STREAMS: usize = 32;
/// Deadline for every request except the live stream.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the live stream sends a status.
pub const STREAM_PERIOD: Duration = Duration::from_secs(1);
/// Longest event note accepted by `POST /api/events`, in characters.
pub const MAX_NOTE_CHARS: usize = 500;

/// Everything `/api/status` reports. Field names are part of the API (SPEC.md, docs/WEB.md): add,
/// never rename.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Status {
    pub rig: String,
    pub version: String,
    pub uptime_s: u64,
    pub clock: ClockStatus,
    pub sources: Vec<SourceStatus>,
    pub uplink: UplinkStatus,
    pub spool: SpoolStatus,
    pub events: EventsStatus,
    pub live: LiveStatus,
    /// Recall (docs/RECALL.md); absent when it is not running (no broker, or no source with
    /// `upload = "on-request"`).
    pub recall: Option<RecallStatus>,
    /// Campaigns (docs/CAMPAIGNS.md); absent when recall is not running.
    pub campaigns: Option<CampaignsStatus>,
}

/// The live view for Foxglove (`/foxglove`).
#[derive(Debug, Clone, Serialize, Default)]
pub struct LiveStatus {
    /// Clients connected now.
    pub clients: u64,
    /// `[web] max-live-clients` (0: the live view is off).
    pub max_clients: u64,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct ClockStatus {
    /// unsynced | locking | locked | holdover
    pub state: String,
    /// Offset from the master at the last PTP sample (the filter's estimate).
    pub offset_ns: Option<i64>,
    /// Grandmaster clock identity, as ptp4l prints it.
    pub master: Option<String>,
    /// PTP port state (listening, slave, faulty, ...); absent without PTP.
    pub port_state: Option<String>,
    /// Mean path delay to the master.
    pub path_delay_ns: Option<i64>,
    /// Clock steps since start (slews are not counted).
    pub steps: u64,
    /// Grandmaster changes made by BMCA since start.
    pub master_changes: u64,
    /// Frequency correction applied to the local oscillator, ppm.
    pub frequency_ppm: Option<f64>,
    /// Seconds from start to the first lock.
    pub time_to_lock_s: Option<f64>,
    pub locked_for_s: Option<f64>,
    pub holdover_s: Option<f64>,
    /// In holdover: how far the clock may have drifted since the master was lost.
    pub estimated_drift_ns: Option<i64>,
    /// The rig clock's reading (frame time) when this status was made.
    pub now_ns: i64,
    /// The rig clock minus this host's CLOCK_REALTIME at the same instant. The true error only
    /// when the grandmaster serves this host's CLOCK_REALTIME (as in the tests).
    pub realtime_error_ns: i64,
    /// CPU time used by the PTP task.
    pub task_cpu_ms: Option<u64>,
    /// Last failure of the PTP port, while it is being reopened.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct SourceStatus {
    pub id: String,
    pub kind: String,
    /// camera | audio | serial
    pub modality: String,
    /// running | retrying | failed
    pub state: String,
    /// Why the source is retrying or failed (the device error), empty while running.
    pub reason: String,
    /// What the device agreed to at its last open (format, size, rate, buffers); empty for
    /// sources that do not negotiate.
    pub detail: String,
    /// Frames captured since start.
    pub frames: u64,
    pub bytes: u64,
    /// Frames lost anywhere: `device_drops + spool_dropped + refused`.
    pub drops: u64,
    /// Frames the device or driver lost (sequence gaps, xruns, bad records).
    pub device_drops: u64,
    /// Frames whose hand-off to the rig's pipeline waited (its queue of 256 full): capture held
    /// by the rig itself, never by the device. Nonzero means a lane fell behind its source.
    pub capture_waits: u64,
    /// This source's frames dropped from the spool (full, or cleared by a technician).
    pub spool_dropped: u64,
    /// Frames the broker refused (too large, rejected); lost.
    pub refused: u64,
    pub last_frame_age_ms: Option<u64>,
    /// No frame for this long means the source is stalled (from its configured rate).
    pub stall_after_ms: u64,
    /// Frames per second over the last few seconds.
    pub frame_rate: Option<f64>,
    pub byte_rate: Option<f64>,
    pub drop_rate: Option<f64>,
    /// Frames with a broker receipt since start.
    pub published: u64,
    pub spooled_records: u64,
    pub spool_bytes: u64,
    /// Records appended to / removed from the spool since start (depth = pushed - popped).
    pub spool_pushed: u64,
    pub spool_popped: u64,
    /// Uplink priority, 0 first (`[[source]] priority`).
    pub priority: u8,
    /// Bytes per second this source's producers wrote to the broker over the last few seconds:
    /// its share of the budget.
    pub uplink_rate: Option<f64>,
    /// Bytes this source's producers wrote to the broker since start (framing included).
    pub uplink_bytes: u64,
    /// Frames spooled while the uplink was up because the budget was spent (or the window full).
    pub waiting_for_bandwidth: u64,
    /// The source has frames in the spool while the uplink is up: they wait for bandwidth, this
    /// is not an outage.
    pub bandwidth_waiting: bool,
    /// How long this source's queued frames have waited on the broker connection now, behind
    /// better ranks or a broker that reads nothing (0: not waiting); every rank is served within
    /// 2 s (docs/UPLINK.md, "Ranks on one connection").
    pub starved_ms: u64,
    /// `starved_ms` is a second or more.
    pub starved: bool,
    /// Seconds until this source's backlog is drained at the rate it drains now.
    pub backlog_eta_s: Option<f64>,
    /// Sequence number of the frame at `/api/sources/{id}/preview.jpg` (cameras).
    pub preview_seq: Option<u64>,
    /// Level of the latest audio block (audio sources).
    pub audio: Option<AudioLevelStatus>,
    /// The last few records, oldest first (serial sources; binary records as hex).
    pub last_records: Vec<String>,
    /// Messages of this source that live-view clients (Foxglove) lost because they read slower
    /// than the rig captures (capture, publish and spool are not affected).
    pub live_dropped: u64,
    /// `live`, or `on-request`: held on the rig within its retention until a recall asks for it.
    pub upload: String,
    /// Frames its retention (`retain-age`, `retain-bytes`) evicted since start.
    pub retention_evicted: u64,
    /// How old the oldest frame the spool holds of this source is.
    pub held_since_age_ms: Option<u64>,
    /// Publish latency (submission to broker receipt) since start; `/metrics` only.
    #[serde(skip)]
    pub latency: Option<Histogram>,
    /// Capture-to-receipt latency of frames published live; `/metrics` only.
    #[serde(skip)]
    pub capture_latency: Option<Histogram>,
}

#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq)]
pub struct AudioLevelStatus {
    /// RMS level in dB full scale (-120 for silence).
    pub rms_dbfs: f64,
    pub peak_dbfs: f64,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct UplinkStatus {
    /// A `[pulsar] url` is set.
    pub configured: bool,
    /// Every source's producer is connected.
    pub connected: bool,
    pub broker: Option<String>,
    /// A technician paused publishing (`POST /api/uplink/pause`): frames spool as in an outage.
    pub paused: bool,
    pub in_flight: u64,
    pub published: u64,
    pub refused: u64,
    pub reconnects: u64,
    /// Receipts per second over the last few seconds.
    pub publish_rate: Option<f64>,
    /// Publish latency quantiles over the last 30 to 60 s.
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// Receipts those quantiles are computed from.
    pub latency_samples: u64,
    pub last_error: Option<String>,
    /// What is wrong with the rig's credentials: its client certificate expired (or not yet
    /// valid), or the broker refused the certificate or the token. Absent: nothing known wrong.
    pub credentials: Option<String>,
    /// A namespace policy the broker refuses the rig's producers for (end-to-end encryption
    /// required while the rig publishes in clear). Absent: nothing known.
    pub policy: Option<String>,
    /// Sources whose topic the broker terminated: nothing more can be published there; their
    /// frames stay in the spool.
    pub terminated: Vec<String>,
    /// `pulsar.max-bandwidth` in bytes per second (under `auto`: what the budget paces at now);
    /// None: unlimited.
    pub budget_bytes_per_second: Option<u64>,
    /// Under `max-bandwidth = "auto"`: the link's estimate (docs/UPLINK.md "auto").
    pub estimate: Option<LinkEstimate>,
    /// Bytes per second the budget granted each rank over the last few seconds (ranks with
    /// traffic; 0-9 live priorities, 10 recall, 11-20 backlogs).
    pub rank_shares: Vec<RankShare>,
    /// Bytes per second written to the broker by every source over the last few seconds.
    pub wire_rate: Option<f64>,
    /// `[[pulsar.link]]`: each link, its health and estimate (empty: one link, the default
    /// route; its estimate is `estimate`).
    pub links: Vec<LinkStatus>,
}

/// One of several links to the brokers (docs/UPLINK.md "Several links").
#[derive(Debug, Clone, Serialize, Default)]
pub struct LinkStatus {
    pub name: String,
    pub interface: String,
    pub cost: u8,
    /// Its interface is up.
    pub up: bool,
    /// Given up (silent, or its interface went down) and not yet answering a connect again.
    pub held: bool,
    /// Times it was given up, and why the last time.
    pub given_up: u64,
    pub last_given_up: Option<String>,
    /// Producers that moved onto it from a link still serving them.
    pub moved_in: LinkMoves,
    /// Producers and consumers on it now.
    pub producers: usize,
    /// What its budget paces at now (bytes per second; None: unlimited).
    pub budget_bytes_per_second: Option<u64>,
    /// Under `auto`: its estimate.
    pub estimate: Option<LinkEstimate>,
}

/// Why producers moved onto a link that was not failing them where they were.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct LinkMoves {
    /// Back from a costlier link once this one settled.
    pub cheaper: u64,
    /// From a link of the same cost, to spread them by estimate per producer.
    pub spread: u64,
}

/// The link's capacity as rigd estimates it (`max-bandwidth = "auto"`).
#[derive(Debug, Clone, Serialize, Default)]
pub struct LinkEstimate {
    /// The estimated capacity, bytes per second.
    pub bytes_per_second: u64,
    /// What the budget paces at now (the estimate times the mode's gain), bytes per second.
    pub pacing_bytes_per_second: u64,
    /// The smallest write-to-receipt time of the last 10 s, ms.
    pub base_rtt_ms: Option<f64>,
    /// How long bytes wait in the link's queues now (the receipts' delay above the base), ms.
    pub queueing_ms: f64,
    /// grow | cruise | probe | drain | backoff
    pub mode: String,
    /// Times the receipts came late while the kernel saw no queue on the path (`TCP_INFO`): the
    /// broker was slow to answer, and the estimate was not cut.
    pub broker_delays: u64,
    /// What the kernel saw queued on the path at the last late receipt (its smoothed RTT over its
    /// smallest, and the unsent bytes at the estimate), ms.
    pub path_queue_ms: Option<f64>,
}

/// One budget rank's share of the link.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RankShare {
    pub rank: u32,
    pub bytes_per_second: f64,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct SpoolStatus {
    pub path: String,
    /// on-outage | always
    pub mode: String,
    /// drop-oldest | drop-newest
    pub when_full: String,
    /// Bytes on disk, segments and index together (what `max_bytes` limits).
    pub bytes: u64,
    /// Of `bytes`, the sled index.
    pub index_bytes: u64,
    pub max_bytes: u64,
    pub records: u64,
    pub dropped: u64,
    /// Records set aside in `quarantine/` (its files, as `rigd spool verify` counts them).
    pub quarantined: u64,
    /// Why the index was rebuilt from the segments at start, or found damaged since (absent:
    /// it covers the segments).
    pub index_damage: Option<String>,
    pub oldest_age_ms: Option<u64>,
    pub pushed: u64,
    pub popped: u64,
    /// Records appended / removed per second over the last few seconds.
    pub push_rate: Option<f64>,
    pub pop_rate: Option<f64>,
    /// Time to empty the spool at the current net drain rate (pop - push); absent when it is not
    /// shrinking.
    pub drain_eta_s: Option<f64>,
}

/// Recall: uploads of on-request sources' frames that someone asked for, on the control topic
/// or with a technician's marker.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RecallStatus {
    /// Where requests are read; answers go to `{control_topic}-status`.
    pub control_topic: String,
    /// The rig reads the control topic now.
    pub connected: bool,
    /// Upload requests accepted and not finished.
    pub pending: u64,
    /// Requests received since start, by op (a marker's upload counts as an upload).
    pub uploads: u64,
    pub cancels: u64,
    pub coverages: u64,
    /// Requests rejected since start, every reason.
    pub rejected: u64,
    /// Of `rejected`, by reason kind (`malformed`, `bad-range`, ...).
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// Frames (and their bytes as the spool holds them) uploaded with a broker receipt since start.
    pub frames_sent: u64,
    pub bytes_sent: u64,
    /// The last failure of the control topic's link or of an upload (it is retried).
    pub last_error: Option<String>,
}

/// Campaigns: conditions pushed from the fleet, each trigger a recall-style upload of a window.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default)]
pub struct CampaignsStatus {
    /// Campaigns evaluated now.
    pub active: u64,
    /// Campaign messages rejected since start, and by reason kind.
    pub rejected: u64,
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// Frames the evaluation could not take (its queue was full); capture never waits for it.
    pub feed_dropped: u64,
    pub campaigns: Vec<CampaignStatus>,
}

/// One campaign's state (also the `campaign` of its answers on the status topic).
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default, PartialEq, Eq)]
pub struct CampaignStatus {
    pub id: String,
    /// `active`, `quota-reached` (active, the day's quota spent), `expired`, `stopped`.
    pub state: String,
    pub priority: u8,
    pub sources: Vec<String>,
    /// Times the condition turned true; windows queued for upload; triggers within the gap,
    /// while the quota was spent, or whose window overlapped the last one (merged).
    pub triggers: u64,
    pub windows: u64,
    pub skipped_gap: u64,
    pub skipped_quota: u64,
    pub merged: u64,
    pub last_trigger_ns: Option<i64>,
    /// Payload bytes uploaded this UTC day (rig clock) and since the campaign began.
    pub bytes_today: u64,
    pub bytes_total: u64,
    pub quota_bytes: u64,
    pub quota_reached: bool,
    pub expires_ns: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct EventsStatus {
    /// Event markers made since start (`POST /api/events`).
    pub marked: u64,
    /// Where they are published (absent without a broker).
    pub topic: Option<String>,
    /// The last markers, oldest first.
    pub last: Vec<String>,
}

/// A histogram as Prometheus shows it: cumulative counts at increasing upper bounds (seconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub bounds_s: Vec<f64>,
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum_s: f64,
}

/// The latest camera frame of a source.
#[derive(Debug, Clone)]
pub struct PreviewImage {
    pub seq: u64,
    pub jpeg: Bytes,
}

/// Where the router gets what it shows.
pub trait StatusSource: Send + Sync + 'static {
    fn status(&self) -> Status;
    /// The latest camera frame of `source`, if it is a camera that has delivered one.
    fn preview(&self, source: &str) -> Option<PreviewImage> {
        let _ = source;
        None
    }
}

/// What a technician may ask the daemon to do. Called on a blocking thread: implementations may do
/// short blocking I/O (the spool) but must not wait for the network.
pub trait Control: Send + Sync + 'static {
    /// Pauses or resumes publishing; while paused, frames go to the spool as in an outage.
    fn set_uplink_paused(&self, paused: bool);
    /// Emits an event marker frame stamped now and, with `upload`, asks recall for the window
    /// around it (the answer's `upload_request`). With `upload`, [`ControlError::Conflict`] when
    /// recall is not running, checked before anything is marked; a marker made whose upload
    /// could not be queued is [`ControlError::Unavailable`], saying both.
    fn mark_event(
        &self,
        note: &str,
        upload: Option<UploadWindow>,
    ) -> Result<EventMarked, ControlError>;
    /// Drops every spooled frame of `source`; returns how many.
    fn clear_spool(&self, source: &str) -> Result<u64, ControlError>;
}

/// The answer to `POST /api/events`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct EventMarked {
    pub seq: u64,
    pub capture_ns: i64,
    pub bucket: i64,
    pub note: String,
    pub topic: Option<String>,
    /// The id of the recall request for the window around the marker (`marker-{seq}`), when
    /// one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_request: Option<String>,
}

/// Longest window a marker may ask to upload, `before_s + after_s`, in seconds.
pub const MAX_UPLOAD_WINDOW_S: f64 = 3600.0;

/// `"upload"` of `POST /api/events`: the window around the marker to upload, in seconds before
/// and after its capture time.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadWindow {
    pub before_s: f64,
    pub after_s: f64,
}

impl UploadWindow {
    /// Why the window cannot be asked for, if it cannot. Judged before the marker is made, so
    /// that a bad window marks nothing.
    pub fn check(&self) -> Result<(), String> {
        let Self { before_s, after_s } = *self;
        if !before_s.is_finite() || !after_s.is_finite() || before_s < 0.0 || after_s < 0.0 {
            return Err(format!(
                "upload.before_s and upload.after_s must be numbers of seconds, 0 or more (got {before_s} and {after_s})"
            ));
        }
        if before_s + after_s > MAX_UPLOAD_WINDOW_S {
            return Err(format!(
                "upload window of {} s is over {MAX_UPLOAD_WINDOW_S} s",
                before_s + after_s
            ));
        }
        // In whole nanoseconds, as the range is asked for: 1e-12 s before and after is empty.
        if ns(before_s) + ns(after_s) <= 0 {
            return Err("upload window is empty: before_s + after_s must be more than 0".into());
        }
        Ok(())
    }

    /// `[from, to)` in ns on the rig clock around a marker captured at `mark_ns`.
    pub fn range(&self, mark_ns: i64) -> (i64, i64) {
        (
            mark_ns.saturating_sub(ns(self.before_s)),
            mark_ns.saturating_add(ns(self.after_s)),
        )
    }
}

/// Seconds to whole nanoseconds (saturating; a checked window is far below the limits).
fn ns(s: f64) -> i64 {
    (s * 1e9).round() as i64
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ControlError {
    #[error("no source `{0}`")]
    UnknownSource(String),
    /// What was asked cannot be done in the rig's state (recall not running): 409.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Failed(String),
}

/// The bearer token control actions need, shared with the daemon so that it can replace it while
/// serving (SIGHUP re-reads the token file). `None`: control actions are disabled (403).
#[derive(Clone, Default, Debug)]
pub struct ControlToken(Arc<std::sync::RwLock<Option<Arc<str>>>>);

impl ControlToken {
    /// `None` or empty: control actions disabled.
    pub fn new(token: Option<String>) -> Self {
        let t = Self::default();
        t.set(token);
        t
    }

    /// Replaces the token; the next request is checked against the new one. Returns whether
    /// control actions are enabled now.
    pub fn set(&self, token: Option<String>) -> bool {
        let token: Option<Arc<str>> = token.filter(|t| !t.is_empty()).map(Arc::from);
        let enabled = token.is_some();
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = token;
        enabled
    }

    fn get(&self) -> Option<Arc<str>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether control actions are enabled now.
    pub fn enabled(&self) -> bool {
        self.get().is_some()
    }
}

/// Router state: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    status: Arc<dyn StatusSource>,
    control: Arc<dyn Control>,
    token: ControlToken,
    streams: Arc<Semaphore>,
    shutdown: Option<watch::Receiver<bool>>,
    stream_period: Duration,
    /// Who is answered at all: networks, names, pages.
    gate: access::Gate,
    /// Wrong control tokens per peer.
    guesses: Arc<std::sync::Mutex<peers::TokenGuesses>>,
    /// Live status streams per peer.
    stream_peers: peers::SharedPeerSlots,
    /// The live view (`/foxglove`); None: 404.
    live: Option<Arc<live::LiveHub>>,
}

impl AppState {
    pub fn new(status: Arc<dyn StatusSource>, control: Arc<dyn Control>) -> Self {
        Self {
            status,
            control,
            token: ControlToken::default(),
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            shutdown: None,
            stream_period: STREAM_PERIOD,
            gate: access::Gate::default(),
            guesses: Arc::default(),
            stream_peers: peers::SharedPeerSlots::new(peers::per_peer_share(MAX_STREAMS)),
            live: None,
        }
    }

    /// Serves the live view at `/foxglove` from this hub.
    pub fn with_live(mut self, hub: Arc<live::LiveHub>) -> Self {
        self.live = Some(hub);
        self
    }

    /// Only peers on these networks get an answer (403 for the rest, every route): see
    /// [`access`].
    pub fn with_allow_list(mut self, allow: access::AllowList) -> Self {
        self.gate.allow = Some(allow);
        self
    }

    /// Only requests naming the rig in `Host`, and from pages of the rig or `site`'s origins,
    /// get an answer (421 or 403 for the rest): see [`site`].
    pub fn with_site_policy(mut self, site: site::SitePolicy) -> Self {
        self.gate.site = Some(site);
        self
    }

    /// Enables control actions for this bearer token (`None` or empty: disabled).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = ControlToken::new(token);
        self
    }

    /// Control actions check this token, which its holder may replace while serving.
    pub fn with_control_token(mut self, token: ControlToken) -> Self {
        self.token = token;
        self
    }

    /// Live streams end when this turns true, so that graceful shutdown does not wait for them.
    pub fn with_shutdown(mut self, shutdown: watch::Receiver<bool>) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    pub fn with_stream_limit(mut self, max: usize, period: Duration) -> Self {
        self.streams = Arc::new(Semaphore::new(max));
        self.stream_peers = peers::SharedPeerSlots::new(peers::per_peer_share(max));
        self.stream_period = period;
        self
    }

    fn view(&self) -> StatusView {
        let status = self.status.status();
        StatusView {
            alerts: alerts(&status),
            control_enabled: self.token.get().is_some(),
            status,
        }
    }
}

/// `/api/status`: the status plus what the web layer derives from it.
#[derive(Serialize)]
struct StatusView {
    #[serde(flatten)]
    status: Status,
    alerts: Vec<Alert>,
    control_enabled: bool,
}

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    let control = Router::new()
        .route("/api/uplink/pause", post(pause))
        .route("/api/uplink/resume", post(resume))
        .route("/api/events", post(mark_event))
        .route("/api/spool/{source}", delete(clear_spool))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let bounded = Router::new()
        .route("/", get(index))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/status", get(api_status))
        .route("/metrics", get(metrics))
        .route("/api/sources/{source}/preview.jpg", get(preview))
        .route("/assets/{*path}", get(asset))
        .merge(control)
        .fallback(not_found)
        .layer(middleware::from_fn(deadline));
    let gate = state.gate.clone();
    gate.guard(
        Router::new()
            .route("/api/stream", get(stream))
            .route("/foxglove", get(foxglove))
            .merge(bounded)
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .layer(middleware::from_fn(json_refusals))
            .with_state(state),
    )
}

/// Refusals that axum's extractors write as plain text (a body over [`MAX_BODY_BYTES`]: 413, a
/// body that is not the JSON asked for: 400/415/422) become the JSON every other error is.
async fn json_refusals(req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    let plain = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/plain"));
    if !(plain && r.status().is_client_error()) {
        return r;
    }
    let code = r.status();
    let text = match axum::body::to_bytes(r.into_body(), MAX_BODY_BYTES).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => code.canonical_reason().unwrap_or("refused").to_string(),
    };
    let text = if code == StatusCode::PAYLOAD_TOO_LARGE {
        format!("request body larger than {MAX_BODY_BYTES} bytes")
    } else {
        text
    };
    AppError(code, text).into_response()
}

/// Turns handler errors into JSON responses in one place.
#[derive(Debug)]
pub struct AppError(pub StatusCode, pub String);

impl AppError {
    fn bad_request(msg: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, msg.into())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl From<ControlError> for AppError {
    fn from(e: ControlError) -> Self {
        let code = match e {
            ControlError::UnknownSource(_) => StatusCode::NOT_FOUND,
            ControlError::Conflict(_) => StatusCode::CONFLICT,
            ControlError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ControlError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        AppError(code, e.to_string())
    }
}

async fn deadline(req: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => AppError(StatusCode::REQUEST_TIMEOUT, "request timed out".into()).into_response(),
    }
}

async fn not_found() -> AppError {
    AppError(StatusCode::NOT_FOUND, "not found".into())
}

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const FAVICON_SVG: &str = include_str!("../assets/favicon.svg");

/// Security headers for the page: nothing from elsewhere, no framing, no sniffing.
fn page_headers(content_type: &'static str) -> [(header::HeaderName, &'static str); 5] {
    [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-cache"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
             img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    ]
}

async fn index() -> Response {
    (page_headers("text/html; charset=utf-8"), INDEX_HTML).into_response()
}

/// Embedded assets by exact name; anything else (traversal included) is 404.
async fn asset(Path(path): Path<String>) -> Response {
    match path.as_str() {
        "favicon.svg" => (page_headers("image/svg+xml"), FAVICON_SVG).into_response(),
        "app.js" => (page_headers("text/javascript; charset=utf-8"), APP_JS).into_response(),
        _ => not_found().await.into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// `/readyz`: 200 when the rig does its whole job now, 503 with the reasons when it does not.
/// `/healthz` says the process answers (liveness); this says whether its data is complete.
async fn readyz(State(state): State<AppState>) -> Response {
    let view = state.view();
    let reasons = not_ready(&view.status, &view.alerts);
    let code = if reasons.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut r = (
        code,
        Json(serde_json::json!({ "ready": reasons.is_empty(), "reasons": reasons })),
    )
        .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Why the rig is not ready (none: ready): an error-level alert about now (frames lost or not
/// captured: a source down, the spool not writable or full; frames dropped earlier are an alert
/// on the page, not a reason), a PTP clock that is neither locked nor in
/// holdover, a configured uplink that is not connected (unless a technician paused it).
pub fn not_ready(status: &Status, alerts: &[Alert]) -> Vec<String> {
    let mut reasons: Vec<String> = alerts
        .iter()
        .filter(|a| a.level == "error" && !a.past)
        .map(|a| format!("{}: {}", a.subject, a.text))
        .collect();
    let clock = &status.clock;
    if clock.port_state.is_some() && !matches!(clock.state.as_str(), "locked" | "holdover") {
        reasons.push(format!("clock: {}", clock.state));
    }
    let uplink = &status.uplink;
    if uplink.configured && !uplink.connected && !uplink.paused {
        reasons.push("uplink: not connected".to_string());
    }
    reasons
}

async fn api_status(State(state): State<AppState>) -> Response {
    let mut r = Json(state.view()).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = prometheus::render(&state.status.status());
    ([(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)], text).into_response()
}

async fn preview(State(state): State<AppState>, Path(source): Path<String>) -> Response {
    let valid = !source.is_empty()
        && source.len() <= 64
        && source
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    // A blocking task: an H.264 camera's still is a keyframe decoded on first request.
    let image = if valid {
        let (status, name) = (state.status.clone(), source.clone());
        tokio::task::spawn_blocking(move || status.preview(&name))
            .await
            .ok()
            .flatten()
    } else {
        None
    };
    match image {
        Some(p) => (
            [
                (header::CONTENT_TYPE, "image/jpeg".to_string()),
                (header::CACHE_CONTROL, "no-store".to_string()),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
                (
                    header::HeaderName::from_static("x-frame-seq"),
                    p.seq.to_string(),
                ),
            ],
            p.jpeg,
        )
            .into_response(),
        None => {
            AppError(StatusCode::NOT_FOUND, format!("no preview for `{source}`")).into_response()
        }
    }
}

/// `/api/stream`: server-sent events, one `status` event (the `/api/status` JSON) per second.
async fn stream(
    State(state): State<AppState>,
    peer: Option<axum::Extension<access::Peer>>,
) -> Result<Response, AppError> {
    let peer_slot = state
        .stream_peers
        .take(peer.map(|p| p.0 .0.ip()))
        .map_err(|share| {
            AppError(
                StatusCode::TOO_MANY_REQUESTS,
                format!("this client holds {share} live connections already, the most one client may; close another tab or window"),
            )
        })?;
    let permit = state.streams.clone().try_acquire_owned().map_err(|_| {
        AppError(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many live connections; close another tab or window".into(),
        )
    })?;
    let permit = (permit, peer_slot);
    let mut tick = tokio::time::interval(state.stream_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = state.shutdown.clone();
    let events = futures::stream::unfold(
        (state, permit, tick, shutdown, true),
        |(state, permit, mut tick, mut shutdown, first)| async move {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutting_down(&mut shutdown) => return None,
            }
            let mut ev = match Event::default().event("status").json_data(state.view()) {
                Ok(ev) => ev,
                Err(e) => Event::default().event("error").data(e.to_string()),
            };
            if first {
                ev = ev.retry(Duration::from_secs(2));
            }
            Some((
                Ok::<_, Infallible>(ev),
                (state, permit, tick, shutdown, false),
            ))
        },
    );
    let mut r = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// `/foxglove`: the live view (Foxglove's WebSocket protocol, [`live`]). The subprotocol and
/// the client cap are judged before the upgrade, so a refusal is a plain HTTP answer.
async fn foxglove(
    State(state): State<AppState>,
    peer: Option<axum::Extension<access::Peer>>,
    headers: HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    ws: Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Response {
    match state.live.clone() {
        Some(hub) => live::handle(
            hub,
            state.shutdown.clone(),
            peer.map(|p| p.0 .0.ip()),
            &headers,
            query.as_deref(),
            ws,
        ),
        None => not_found().await.into_response(),
    }
}

/// Resolves when the daemon shuts down (or never, without a shutdown signal).
async fn shutting_down(shutdown: &mut Option<watch::Receiver<bool>>) {
    match shutdown {
        Some(rx) => {
            let _ = rx.wait_for(|down| *down).await;
        }
        None => std::future::pending().await,
    }
}

/// Constant-time equality: the time taken depends on the lengths only, not on where they differ.
fn same_token(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = (presented.len() != expected.len()) as u8;
    for (i, &e) in expected.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(!e);
        diff |= p ^ e;
    }
    std::hint::black_box(diff) == 0
}

async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(expected) = state.token.get() else {
        return AppError(
            StatusCode::FORBIDDEN,
            "control actions are disabled: no [web] token-file is configured".into(),
        )
        .into_response();
    };
    let peer = req.extensions().get::<access::Peer>().map(|p| p.0.ip());
    let lock_guesses = || state.guesses.lock().unwrap_or_else(|p| p.into_inner());
    let now = std::time::Instant::now();
    if let Some(ip) = peer {
        if let Some(wait) = lock_guesses().must_wait(ip, now) {
            return too_many_guesses(wait);
        }
    }
    if !authorized(req.headers(), &expected) {
        if let Some(ip) = peer {
            let wait = lock_guesses().failed(ip, now);
            if !wait.is_zero() {
                tracing::warn!(peer = %ip, wait_s = wait.as_secs(), "web: wrong control token again; this client now waits before its next try");
            }
        }
        return AppError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong token: send Authorization: Bearer <token>".into(),
        )
        .into_response();
    }
    if let Some(ip) = peer {
        lock_guesses().succeeded(ip);
    }
    next.run(req).await
}

/// 429 for a peer that sent too many wrong tokens ([`peers::TokenGuesses`]).
fn too_many_guesses(wait: Duration) -> Response {
    let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
    let mut r = AppError(
        StatusCode::TOO_MANY_REQUESTS,
        format!("too many wrong tokens from this client: try again in {secs} s"),
    )
    .into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn authorized(headers: &HeaderMap, expected: &str) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    match value.trim().split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            same_token(token.trim().as_bytes(), expected.as_bytes())
        }
        _ => false,
    }
}

/// Runs a control call on a blocking thread (it may touch the spool).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ControlError> + Send + 'static,
) -> Result<T, AppError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(AppError::from),
        Err(_) => Err(AppError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "control action failed".into(),
        )),
    }
}

async fn set_paused(state: AppState, paused: bool) -> Result<Json<serde_json::Value>, AppError> {
    let control = state.control.clone();
    blocking(move || {
        control.set_uplink_paused(paused);
        Ok(())
    })
    .await?;
    tracing::info!(
        paused,
        "technician {} the uplink",
        if paused { "paused" } else { "resumed" }
    );
    Ok(Json(serde_json::json!({ "paused": paused })))
}

async fn pause(State(state): State<AppState>) -> Result<Json<serde_json::Value>, AppError> {
    set_paused(state, true).await
}

async fn resume(State(state): State<AppState>) -> Result<Json<serde_json::Value>, AppError> {
    set_paused(state, false).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventRequest {
    #[serde(default)]
    note: String,
    #[serde(default)]
    upload: Option<UploadWindow>,
}

/// `POST /api/events` with `{"note": "...", "upload": {"before_s": 30, "after_s": 10}}` (both
/// optional, or an empty body).
async fn mark_event(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<(StatusCode, Json<EventMarked>), AppError> {
    let req: EventRequest = if body.iter().all(u8::is_ascii_whitespace) {
        EventRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            AppError::bad_request(format!(
                "bad JSON (want {{\"note\": \"...\", \"upload\": {{\"before_s\": 30, \"after_s\": 10}}}}, both optional): {e}"
            ))
        })?
    };
    if req.note.chars().count() > MAX_NOTE_CHARS {
        return Err(AppError::bad_request(format!(
            "note is longer than {MAX_NOTE_CHARS} characters"
        )));
    }
    if let Some(w) = &req.upload {
        w.check().map_err(AppError::bad_request)?;
    }
    let control = state.control.clone();
    let (note, upload) = (req.note.clone(), req.upload);
    let marked = blocking(move || control.mark_event(&note, upload)).await?;
    tracing::info!(seq = marked.seq, bucket = marked.bucket, note = %marked.note.escape_debug(),
        upload_request = marked.upload_request.as_deref().unwrap_or(""), "technician marked an event");
    Ok((StatusCode::CREATED, Json(marked)))
}

#[derive(Debug, Deserialize)]
struct ClearQuery {
    confirm: Option<String>,
}

/// `DELETE /api/spool/{source}?confirm={source}`.
async fn clear_spool(
    State(state): State<AppState>,
    Path(source): Path<String>,
    query: Result<Query<ClearQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, AppError> {
    let confirm = query.ok().and_then(|Query(q)| q.confirm);
    if confirm.as_deref() != Some(source.as_str()) {
        return Err(AppError::bad_request(format!(
            "dropping a spool loses its frames: repeat the source name as ?confirm={source}"
        )));
    }
    let control = state.control.clone();
    let s = source.clone();
    let dropped = blocking(move || control.clear_spool(&s)).await?;
    tracing::warn!(source = %source, dropped, "technician dropped a source's spool");
    Ok(Json(
        serde_json::json!({ "source": source, "dropped": dropped }),
    ))
}

#[cfg(test)]
mod tests;
