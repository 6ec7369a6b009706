//! rigd's status web UI and HTTP API. Knows nothing of the daemon's internals: the daemon hands it a
//! [`StatusSource`] and it serves `/healthz`, `/api/status` and the page.

#![forbid(unsafe_code)]

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use std::sync::Arc;

/// Everything `/api/status` reports. Field names are part of the API (SPEC.md); add, never rename.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Status {
    pub rig: String,
    pub version: String,
    pub uptime_s: u64,
    pub clock: ClockStatus,
    pub sources: Vec<SourceStatus>,
    pub uplink: UplinkStatus,
    pub spool: SpoolStatus,
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
    /// running | retrying | failed
    pub state: String,
    pub reason: String,
    pub frames: u64,
    pub bytes: u64,
    pub drops: u64,
    pub last_frame_age_ms: Option<u64>,
    pub published: u64,
    pub spooled_records: u64,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct UplinkStatus {
    pub configured: bool,
    pub connected: bool,
    pub broker: Option<String>,
    pub in_flight: u64,
    pub published: u64,
    pub refused: u64,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct SpoolStatus {
    pub path: String,
    pub mode: String,
    pub bytes: u64,
    pub records: u64,
    pub dropped: u64,
    pub quarantined: u64,
    pub oldest_age_ms: Option<u64>,
}

/// Where the router gets the current status from.
pub trait StatusSource: Send + Sync + 'static {
    fn status(&self) -> Status;
}

/// Router state: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub status: Arc<dyn StatusSource>,
}

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(healthz))
        .route("/api/status", get(api_status))
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn api_status(State(state): State<AppState>) -> Json<Status> {
    Json(state.status.status())
}

async fn index(State(state): State<AppState>) -> Response {
    let s = state.status.status();
    let mut rows = String::new();
    for src in &s.sources {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&src.id),
            escape(&src.kind),
            escape(&src.state),
            src.frames,
            src.drops
        ));
    }
    let body = format!(
        "<!doctype html><html><head><meta charset=utf-8><meta name=viewport content=\"width=device-width\">\
         <title>rigd {rig}</title></head><body><h1>rigd {rig}</h1><p>clock: {clock}</p>\
         <p>uplink: {up}</p><p>spool: {rec} records, {bytes} bytes</p>\
         <table><tr><th>source</th><th>kind</th><th>state</th><th>frames</th><th>drops</th></tr>{rows}</table>\
         </body></html>",
        rig = escape(&s.rig),
        clock = escape(&s.clock.state),
        up = if s.uplink.connected { "connected" } else { "not connected" },
        rec = s.spool.records,
        bytes = s.spool.bytes,
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Turns handler errors into responses in one place.
#[derive(Debug)]
pub struct AppError(pub StatusCode, pub String);

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    struct Fixed;
    impl StatusSource for Fixed {
        fn status(&self) -> Status {
            Status {
                rig: "van-07".into(),
                sources: vec![SourceStatus {
                    id: "front".into(),
                    state: "running".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }
        }
    }

    fn app() -> Router {
        router(AppState {
            status: Arc::new(Fixed),
        })
    }

    #[tokio::test]
    async fn status_has_the_fields_scripts_rely_on() {
        let r = app()
            .oneshot(Request::get("/api/status").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["rig"], "van-07");
        for ptr in [
            "/clock/state",
            "/clock/offset_ns",
            "/clock/master",
            "/uplink/connected",
            "/uplink/in_flight",
            "/spool/bytes",
            "/spool/records",
            "/spool/dropped",
            "/spool/quarantined",
        ] {
            assert!(v.pointer(ptr).is_some(), "missing {ptr}");
        }
        for f in [
            "id",
            "kind",
            "state",
            "frames",
            "bytes",
            "drops",
            "last_frame_age_ms",
        ] {
            assert!(v["sources"][0].get(f).is_some(), "missing sources[].{f}");
        }
    }

    #[tokio::test]
    async fn healthz_and_unknown_paths() {
        let r = app()
            .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let r = app()
            .oneshot(
                Request::get("/../../etc/passwd")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
