//! Route tests with `oneshot`, no port: shapes, metrics names, auth on every control route, and
//! hostile requests.

use super::*;
use axum::body::Body;
use axum::http::{Method, Request};
use std::sync::Mutex;
use tower::ServiceExt;

#[derive(Default)]
struct FakeRig {
    paused: Mutex<Option<bool>>,
    notes: Mutex<Vec<String>>,
    /// The upload windows markers asked for.
    uploads: Mutex<Vec<UploadWindow>>,
    cleared: Mutex<Vec<String>>,
    /// Recall is not running (no broker or no on-request source).
    without_recall: bool,
}

impl StatusSource for FakeRig {
    fn status(&self) -> Status {
        Status {
            rig: "van-07".into(),
            version: "0.1.0".into(),
            sources: vec![SourceStatus {
                id: "front".into(),
                kind: "synthetic-camera".into(),
                modality: "camera".into(),
                state: "running".into(),
                frames: 42,
                device_drops: 1,
                drops: 1,
                preview_seq: Some(40),
                latency: Some(Histogram {
                    bounds_s: vec![0.001, 0.01],
                    cumulative: vec![3, 5],
                    count: 6,
                    sum_s: 0.5,
                }),
                ..Default::default()
            }],
            clock: ClockStatus {
                state: "locked".into(),
                offset_ns: Some(-120),
                ..Default::default()
            },
            uplink: UplinkStatus {
                paused: self.paused.lock().unwrap().unwrap_or(false),
                ..Default::default()
            },
            recall: (!self.without_recall).then(|| RecallStatus {
                control_topic: "persistent://public/default/van-07-control".into(),
                rejected: 2,
                rejected_by_reason: [("malformed".to_string(), 2)].into_iter().collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn preview(&self, source: &str) -> Option<PreviewImage> {
        (source == "front").then(|| PreviewImage {
            seq: 40,
            jpeg: Bytes::from_static(b"\xff\xd8\xff\xd9"),
        })
    }
}

impl Control for FakeRig {
    fn set_uplink_paused(&self, paused: bool) {
        *self.paused.lock().unwrap() = Some(paused);
    }
    fn mark_event(
        &self,
        note: &str,
        upload: Option<UploadWindow>,
    ) -> Result<EventMarked, ControlError> {
        if upload.is_some() && self.without_recall {
            return Err(ControlError::Conflict("recall is not running".into()));
        }
        self.notes.lock().unwrap().push(note.to_string());
        self.uploads.lock().unwrap().extend(upload);
        Ok(EventMarked {
            seq: 7,
            bucket: 123,
            note: note.to_string(),
            upload_request: upload.map(|_| "marker-7".to_string()),
            ..Default::default()
        })
    }
    fn clear_spool(&self, source: &str) -> Result<u64, ControlError> {
        if source != "front" {
            return Err(ControlError::UnknownSource(source.to_string()));
        }
        self.cleared.lock().unwrap().push(source.to_string());
        Ok(12)
    }
}

const TOKEN: &str = "s3cret-token";

fn app_with(token: Option<&str>) -> (Router, Arc<FakeRig>) {
    let rig = Arc::new(FakeRig::default());
    let state = AppState::new(rig.clone(), rig.clone()).with_token(token.map(str::to_string));
    (router(state), rig)
}

fn app() -> Router {
    app_with(None).0
}

async fn send(app: Router, req: Request<Body>) -> (StatusCode, HeaderMap, Vec<u8>) {
    let r = app.oneshot(req).await.unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    let body = axum::body::to_bytes(r.into_body(), 1 << 22).await.unwrap();
    (status, headers, body.to_vec())
}

async fn get(app: Router, path: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
    send(app, Request::get(path).body(Body::empty()).unwrap()).await
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn status_has_the_fields_scripts_rely_on() {
    let (code, headers, body) = get(app(), "/api/status").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    let v = json(&body);
    assert_eq!(v["rig"], "van-07");
    for ptr in [
        "/clock/state",
        "/clock/offset_ns",
        "/clock/master",
        "/uplink/connected",
        "/uplink/in_flight",
        "/uplink/paused",
        "/uplink/latency_p50_ms",
        "/uplink/latency_p99_ms",
        "/spool/bytes",
        "/spool/records",
        "/spool/dropped",
        "/spool/quarantined",
        "/spool/drain_eta_s",
        "/events/marked",
        "/recall/control_topic",
        "/recall/connected",
        "/recall/pending",
        "/recall/rejected",
        "/recall/frames_sent",
        "/recall/last_error",
        "/alerts",
        "/control_enabled",
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
        "frame_rate",
        "preview_seq",
        "audio",
        "last_records",
    ] {
        assert!(v["sources"][0].get(f).is_some(), "missing sources[].{f}");
    }
    assert!(
        v["sources"][0].get("latency").is_none(),
        "histogram is /metrics only"
    );
    assert_eq!(v["control_enabled"], false);
    assert_eq!(v["alerts"][0]["subject"], "uplink", "no broker configured");
    assert!(v["alerts"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("No broker configured"));
}

#[tokio::test]
async fn metrics_are_prometheus_text_with_rigd_names() {
    let (code, headers, body) = get(app(), "/metrics").await;
    assert_eq!(code, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = String::from_utf8(body).unwrap();
    let mut typed = std::collections::HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            typed.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        // name{labels} value
        let (series, value) = line.rsplit_once(' ').unwrap();
        let name = series.split('{').next().unwrap();
        assert!(name.starts_with("rigd_"), "{line}");
        assert!(value.parse::<f64>().is_ok() || value == "+Inf", "{line}");
        let family = name
            .strip_suffix("_bucket")
            .or_else(|| name.strip_suffix("_sum"))
            .or_else(|| name.strip_suffix("_count"))
            .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
            .unwrap_or(name);
        let kind = typed
            .get(family)
            .unwrap_or_else(|| panic!("no TYPE for {line}"));
        if kind == "counter" {
            assert!(name.ends_with("_total"), "{line}");
        }
    }
    for want in [
        "rigd_source_frames_total{source=\"front\"} 42",
        "rigd_source_drops_total{source=\"front\",stage=\"capture\"} 1",
        "rigd_publish_latency_seconds_bucket{source=\"front\",le=\"0.001\"} 3",
        "rigd_publish_latency_seconds_bucket{source=\"front\",le=\"+Inf\"} 6",
        "rigd_publish_latency_seconds_count{source=\"front\"} 6",
        "rigd_spool_pushed_total{source=\"front\"} 0",
        "rigd_spool_popped_total{source=\"front\"} 0",
        "rigd_spool_bytes 0",
        "rigd_clock_offset_seconds -0.00000012",
        "rigd_clock_state{state=\"locked\"} 1",
        "rigd_uplink_connected 0",
        "rigd_recall_rejected_total{reason=\"malformed\"} 2",
        "rigd_recall_connected 0",
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "missing `{want}` in\n{text}"
        );
    }
}

#[tokio::test]
async fn the_page_is_self_contained() {
    let (code, headers, body) = get(app(), "/").await;
    assert_eq!(code, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .contains("default-src 'self'"));
    // No inline script runs: a note or a source name that got into the page could not execute.
    let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("script-src 'self';"), "{csp}");
    let page = String::from_utf8(body).unwrap();
    assert!(page.contains(r#"<script src="/assets/app.js"></script>"#));
    let (code, headers, script) = get(app(), "/assets/app.js").await;
    assert_eq!(code, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    let script = String::from_utf8(script).unwrap();
    assert!(script.contains("/api/stream"));
    assert!(
        !(page.clone() + &script).contains("http://") && !(page + &script).contains("https://"),
        "no CDN"
    );
    let (code, _, _) = get(app(), "/assets/favicon.svg").await;
    assert_eq!(code, StatusCode::OK);
}

#[tokio::test]
async fn healthz_preview_and_unknown_paths() {
    let (code, _, body) = get(app(), "/healthz").await;
    assert_eq!((code, body.as_slice()), (StatusCode::OK, &b"ok\n"[..]));
    let (code, headers, body) = get(app(), "/api/sources/front/preview.jpg").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], "image/jpeg");
    assert_eq!(headers["x-frame-seq"], "40");
    assert_eq!(body, b"\xff\xd8\xff\xd9");
    for path in [
        "/api/sources/mic/preview.jpg",
        "/api/sources/..%2F..%2Fetc/preview.jpg",
        "/../../etc/passwd",
        "/assets/../Cargo.toml",
        "/assets/..%2F..%2FCargo.toml",
        "/assets/%2e%2e/%2e%2e/etc/passwd",
        "/assets//etc/passwd",
        "/assets/favicon.svg/../../src/lib.rs",
        "/nowhere",
    ] {
        let (code, _, body) = get(app(), path).await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{path}");
        assert!(json(&body)["error"].is_string(), "{path}");
    }
}

fn control_requests() -> Vec<(Method, &'static str, &'static str)> {
    vec![
        (Method::POST, "/api/uplink/pause", ""),
        (Method::POST, "/api/uplink/resume", ""),
        (Method::POST, "/api/events", r#"{"note":"pothole"}"#),
        (Method::DELETE, "/api/spool/front?confirm=front", ""),
    ]
}

fn control(method: &Method, path: &str, body: &str, auth: Option<&str>) -> Request<Body> {
    let mut r = Request::builder().method(method.clone()).uri(path);
    if let Some(a) = auth {
        r = r.header(header::AUTHORIZATION, a);
    }
    r.body(Body::from(body.to_string())).unwrap()
}

#[tokio::test]
async fn control_is_forbidden_without_a_configured_token() {
    for (m, path, body) in control_requests() {
        for auth in [None, Some("Bearer anything"), Some("Bearer ")] {
            let (code, _, resp) = send(app(), control(&m, path, body, auth)).await;
            assert_eq!(code, StatusCode::FORBIDDEN, "{m} {path} {auth:?}");
            assert!(json(&resp)["error"]
                .as_str()
                .unwrap()
                .contains("token-file"));
        }
    }
}

#[tokio::test]
async fn control_needs_the_right_token() {
    for (m, path, body) in control_requests() {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer s3cret-toke"),
            Some("Bearer s3cret-token-and-more"),
            Some("Basic czNjcmV0LXRva2Vu"),
            Some("s3cret-token"),
            Some("Bearer"),
        ] {
            let (app, rig) = app_with(Some(TOKEN));
            let (code, headers, _) = send(app, control(&m, path, body, auth)).await;
            assert_eq!(code, StatusCode::UNAUTHORIZED, "{m} {path} {auth:?}");
            assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
            assert!(rig.paused.lock().unwrap().is_none());
            assert!(rig.notes.lock().unwrap().is_empty());
            assert!(rig.cleared.lock().unwrap().is_empty());
        }
        for auth in ["Bearer s3cret-token", "bearer s3cret-token"] {
            let (app, _) = app_with(Some(TOKEN));
            let (code, _, resp) = send(app, control(&m, path, body, Some(auth))).await;
            assert!(
                code.is_success(),
                "{m} {path}: {code} {}",
                String::from_utf8_lossy(&resp)
            );
        }
    }
}

#[tokio::test]
async fn a_replaced_control_token_applies_to_the_next_request() {
    let rig = Arc::new(FakeRig::default());
    let token = ControlToken::new(Some(TOKEN.into()));
    let app = router(AppState::new(rig.clone(), rig).with_control_token(token.clone()));
    let pause = |auth| control(&Method::POST, "/api/uplink/pause", "", Some(auth));
    let (code, _, _) = send(app.clone(), pause("Bearer s3cret-token")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(token.set(Some("rotated".into())));
    let (code, _, _) = send(app.clone(), pause("Bearer s3cret-token")).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, _, _) = send(app.clone(), pause("Bearer rotated")).await;
    assert_eq!(code, StatusCode::OK);
    assert!(!token.set(None));
    let (code, _, _) = send(app.clone(), pause("Bearer rotated")).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let (_, _, body) = send(
        app,
        Request::get("/api/status").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(json(&body)["control_enabled"], false);
}

#[tokio::test]
async fn control_actions_reach_the_daemon() {
    let auth = Some("Bearer s3cret-token");
    let (app, rig) = app_with(Some(TOKEN));
    let (code, _, body) = send(
        app.clone(),
        control(&Method::POST, "/api/uplink/pause", "", auth),
    )
    .await;
    assert_eq!(
        (code, json(&body)["paused"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    assert_eq!(*rig.paused.lock().unwrap(), Some(true));
    let (_, _, body) = get(app.clone(), "/api/status").await;
    assert_eq!(json(&body)["uplink"]["paused"], true);
    assert_eq!(json(&body)["control_enabled"], true);
    send(
        app.clone(),
        control(&Method::POST, "/api/uplink/resume", "", auth),
    )
    .await;
    assert_eq!(*rig.paused.lock().unwrap(), Some(false));

    let (code, _, body) = send(
        app.clone(),
        control(
            &Method::POST,
            "/api/events",
            r#"{"note":"pothole at km 12"}"#,
            auth,
        ),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED);
    assert_eq!(json(&body)["bucket"], 123);
    let (code, _, _) = send(app.clone(), control(&Method::POST, "/api/events", "", auth)).await;
    assert_eq!(
        code,
        StatusCode::CREATED,
        "an empty body marks an event without a note"
    );
    assert_eq!(
        *rig.notes.lock().unwrap(),
        vec!["pothole at km 12".to_string(), String::new()]
    );

    // Dropping a spool needs the confirmation, and an existing source.
    for path in [
        "/api/spool/front",
        "/api/spool/front?confirm=rear",
        "/api/spool/front?confirm",
    ] {
        let (code, _, body) = send(app.clone(), control(&Method::DELETE, path, "", auth)).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{path}");
        assert!(json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("?confirm=front"));
    }
    assert!(rig.cleared.lock().unwrap().is_empty());
    let (code, _, body) = send(
        app.clone(),
        control(&Method::DELETE, "/api/spool/rear?confirm=rear", "", auth),
    )
    .await;
    assert_eq!(
        code,
        StatusCode::NOT_FOUND,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (code, _, body) = send(
        app,
        control(&Method::DELETE, "/api/spool/front?confirm=front", "", auth),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(json(&body)["dropped"], 12);
}

#[test]
fn an_upload_window_is_finite_not_negative_not_empty_and_at_most_an_hour() {
    let w = |before_s, after_s| UploadWindow { before_s, after_s };
    for ok in [
        w(30.0, 10.0),
        w(0.0, 0.5),
        w(5.0, 0.0),
        w(3599.0, 1.0),
        w(1e-9, 0.0),
    ] {
        assert_eq!(ok.check(), Ok(()), "{ok:?}");
    }
    for (bad, says) in [
        (w(-1.0, 10.0), "0 or more"),
        (w(1.0, -0.0001), "0 or more"),
        (w(f64::NAN, 1.0), "0 or more"),
        (w(1.0, f64::INFINITY), "0 or more"),
        (w(0.0, 0.0), "empty"),
        (w(1e-12, 1e-12), "empty"),
        (w(3000.0, 600.5), "over 3600 s"),
        (w(1e300, 1.0), "over 3600 s"),
    ] {
        let e = bad.check().unwrap_err();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
    let mark = 1_700_000_000_123_456_789;
    assert_eq!(
        w(30.0, 10.0).range(mark),
        (mark - 30_000_000_000, mark + 10_000_000_000)
    );
    assert_eq!(w(0.25, 0.0).range(mark), (mark - 250_000_000, mark));
    assert_eq!(w(1.0, 1.0).range(i64::MAX - 5).1, i64::MAX, "saturates");
}

#[tokio::test]
async fn a_marker_asks_for_an_upload_window_once_it_is_judged_sound() {
    let auth = Some("Bearer s3cret-token");
    let (app, rig) = app_with(Some(TOKEN));
    let (code, _, body) = send(
        app.clone(),
        control(
            &Method::POST,
            "/api/events",
            r#"{"note":"hard brake","upload":{"before_s":30,"after_s":10}}"#,
            auth,
        ),
    )
    .await;
    assert_eq!(
        code,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(json(&body)["upload_request"], "marker-7");
    assert_eq!(
        *rig.uploads.lock().unwrap(),
        vec![UploadWindow {
            before_s: 30.0,
            after_s: 10.0
        }]
    );
    // Without a window the answer has no request id.
    let (_, _, body) = send(
        app.clone(),
        control(&Method::POST, "/api/events", r#"{"note":"x"}"#, auth),
    )
    .await;
    assert!(json(&body).get("upload_request").is_none());
    for (bad, says) in [
        (r#"{"upload":{"before_s":-1,"after_s":10}}"#, "0 or more"),
        (r#"{"upload":{"before_s":0,"after_s":0}}"#, "empty"),
        (r#"{"upload":{"before_s":3600,"after_s":1}}"#, "over 3600"),
        (r#"{"upload":{"before_s":1e400,"after_s":1}}"#, "bad JSON"),
        (r#"{"upload":{"before_s":"30","after_s":1}}"#, "bad JSON"),
        (r#"{"upload":{"before_s":30}}"#, "bad JSON"),
        (
            r#"{"upload":{"before_s":1,"after_s":1,"around":2}}"#,
            "bad JSON",
        ),
    ] {
        let (code, _, body) = send(
            app.clone(),
            control(&Method::POST, "/api/events", bad, auth),
        )
        .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}");
        let e = json(&body)["error"].as_str().unwrap().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    assert_eq!(
        rig.notes.lock().unwrap().len(),
        2,
        "a bad window marks nothing"
    );
    assert_eq!(rig.uploads.lock().unwrap().len(), 1);

    // Recall not running: 409, and the daemon marks nothing.
    let rig = Arc::new(FakeRig {
        without_recall: true,
        ..Default::default()
    });
    let app = router(AppState::new(rig.clone(), rig.clone()).with_token(Some(TOKEN.into())));
    let (code, _, body) = send(
        app,
        control(
            &Method::POST,
            "/api/events",
            r#"{"upload":{"before_s":5,"after_s":5}}"#,
            auth,
        ),
    )
    .await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert!(json(&body)["error"].as_str().unwrap().contains("recall"));
    assert!(rig.notes.lock().unwrap().is_empty());
}

#[tokio::test]
async fn hostile_bodies_get_clear_answers() {
    let auth = Some("Bearer s3cret-token");
    let (app, rig) = app_with(Some(TOKEN));
    let big = format!(r#"{{"note":"{}"}}"#, "x".repeat(MAX_BODY_BYTES + 1));
    let (code, _, _) = send(
        app.clone(),
        control(&Method::POST, "/api/events", &big, auth),
    )
    .await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
    let (_, headers, body) = send(
        app.clone(),
        control(&Method::POST, "/api/events", &big, auth),
    )
    .await;
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert!(json(&body)["error"]
        .as_str()
        .unwrap()
        .contains("larger than"));
    for bad in [
        "{",
        "[1,2]",
        r#"{"note": 5}"#,
        r#"{"nope": "x"}"#,
        "\u{0}\u{1}",
        "null",
    ] {
        let (code, _, body) = send(
            app.clone(),
            control(&Method::POST, "/api/events", bad, auth),
        )
        .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad:?}");
        assert!(json(&body)["error"]
            .as_str()
            .unwrap()
            .starts_with("bad JSON"));
    }
    let long = format!(r#"{{"note":"{}"}}"#, "é".repeat(MAX_NOTE_CHARS + 1));
    let (code, _, _) = send(
        app.clone(),
        control(&Method::POST, "/api/events", &long, auth),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(rig.notes.lock().unwrap().is_empty());
    // A huge body on a read-only route is not read at all.
    let r = Request::get("/api/status")
        .body(Body::from(vec![b'x'; 1 << 20]))
        .unwrap();
    let (code, _, _) = send(app, r).await;
    assert_eq!(code, StatusCode::OK);
}

#[tokio::test]
async fn live_stream_sends_status_events_and_caps_clients() {
    let rig = Arc::new(FakeRig::default());
    let state = AppState::new(rig.clone(), rig).with_stream_limit(2, Duration::from_millis(20));
    let app = router(state);
    let mut open = Vec::new();
    for _ in 0..2 {
        let r = app
            .clone()
            .oneshot(Request::get("/api/stream").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/event-stream");
        open.push(r);
    }
    let (code, _, body) = get(app.clone(), "/api/stream").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(json(&body)["error"].is_string());

    // Read two events from the first stream.
    use http_body_util::BodyExt;
    let mut body = open.remove(0).into_body();
    let mut text = String::new();
    while text.matches("event: status").count() < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("an event within 5 s")
            .unwrap()
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let first = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    assert_eq!(json(first.as_bytes())["rig"], "van-07");
    assert!(text.contains("retry: 2000"));
    // A closed stream frees its slot.
    drop(body);
    let r = app
        .oneshot(Request::get("/api/stream").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn live_stream_ends_at_shutdown() {
    let rig = Arc::new(FakeRig::default());
    let (tx, rx) = watch::channel(false);
    let state = AppState::new(rig.clone(), rig)
        .with_shutdown(rx)
        .with_stream_limit(4, Duration::from_millis(20));
    let r = router(state)
        .oneshot(Request::get("/api/stream").body(Body::empty()).unwrap())
        .await
        .unwrap();
    tx.send(true).unwrap();
    let body = tokio::time::timeout(
        Duration::from_secs(5),
        axum::body::to_bytes(r.into_body(), 1 << 20),
    )
    .await
    .expect("the stream ends")
    .unwrap();
    assert!(body.len() < 1 << 20);
}

#[test]
fn token_comparison() {
    assert!(same_token(b"abc", b"abc"));
    assert!(!same_token(b"abd", b"abc"));
    assert!(!same_token(b"ab", b"abc"));
    assert!(!same_token(b"abcd", b"abc"));
    assert!(!same_token(b"", b"abc"));
    // The missing tail is compared against a byte that always differs.
    assert!(!same_token(b"\xff", b"\x00"));
}

#[tokio::test]
async fn readyz_is_200_when_the_rig_does_its_job_and_503_with_reasons_when_not() {
    let (code, _, body) = get(app(), "/readyz").await;
    assert_eq!(code, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["ready"], true);
    // PTP configured but not locked; a broker configured and not reached; a source failed.
    let mut s = FakeRig::default().status();
    s.clock.port_state = Some("listening".into());
    s.clock.state = "locking".into();
    s.uplink.configured = true;
    s.sources[0].state = "failed".into();
    s.sources[0].reason = "no such device".into();
    let reasons = not_ready(&s, &alerts(&s));
    assert!(reasons.iter().any(|r| r == "clock: locking"), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r == "uplink: not connected"),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.starts_with("source:front")),
        "{reasons:?}"
    );
    // Holdover is ready (timestamps still good); a technician's pause is not an outage.
    s.clock.state = "holdover".into();
    s.uplink.paused = true;
    s.sources[0].state = "running".into();
    assert_eq!(not_ready(&s, &alerts(&s)), Vec::<String>::new());
    // Frames dropped earlier stay an alert on the page; readiness is now, not history.
    s.spool.dropped = 12;
    let a = alerts(&s);
    assert!(a
        .iter()
        .any(|a| a.level == "error" && a.text.contains("12 spooled frames dropped")));
    assert_eq!(not_ready(&s, &a), Vec::<String>::new());
    // A spool dropping now (90 % full) is a reason.
    s.spool.max_bytes = 100;
    s.spool.bytes = 95;
    assert!(not_ready(&s, &alerts(&s))
        .iter()
        .any(|r| r.starts_with("spool: Spool 95% full")));
}

#[tokio::test]
async fn peers_outside_the_allow_list_get_403_on_every_route() {
    let rig = Arc::new(FakeRig::default());
    let app = router(AppState::new(rig.clone(), rig).with_allow_list(access::AllowList::private()));
    for (ip, want) in [
        ("192.168.1.5", StatusCode::OK),
        ("::ffff:10.0.0.7", StatusCode::OK),
        ("100.64.0.9", StatusCode::FORBIDDEN),
        ("203.0.113.2", StatusCode::FORBIDDEN),
    ] {
        for path in [
            "/",
            "/api/status",
            "/healthz",
            "/readyz",
            "/metrics",
            "/api/sources/front/preview.jpg",
        ] {
            let mut req = Request::get(path).body(Body::empty()).unwrap();
            let peer = std::net::SocketAddr::new(ip.parse().unwrap(), 5555);
            req.extensions_mut().insert(access::Peer(peer));
            let (code, _, body) = send(app.clone(), req).await;
            assert_eq!(
                code,
                want,
                "{ip} {path}: {}",
                String::from_utf8_lossy(&body)
            );
            if want == StatusCode::FORBIDDEN {
                assert!(String::from_utf8_lossy(&body).contains("allow-from"));
            }
        }
    }
}

/// `/foxglove` answers a refusal in plain HTTP before any upgrade: 404 without a live view, 400
/// for a request offering neither Foxglove subprotocol (or not an upgrade at all), 503 past the
/// client cap, and the peer allow-list applies as on every route.
#[tokio::test]
async fn the_live_view_refuses_in_plain_http() {
    assert_eq!(get(app(), "/foxglove").await.0, StatusCode::NOT_FOUND);
    let rig = Arc::new(FakeRig::default());
    let hub = Arc::new(live::LiveHub::new(
        "rigd van-07".into(),
        vec![],
        0,
        Arc::new(|| 0),
    ));
    let live_app =
        |hub: Arc<live::LiveHub>| router(AppState::new(rig.clone(), rig.clone()).with_live(hub));
    let upgrade = |protocol: &str| {
        Request::get("/foxglove")
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
            .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
            .body(Body::empty())
            .unwrap()
    };
    let (code, _, body) = send(live_app(hub.clone()), upgrade("graphql-ws")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(json(&body)["error"]
        .as_str()
        .unwrap()
        .contains(live::SUBPROTOCOL_SDK));
    // max-live-clients = 0: the live view is off.
    let (code, _, body) = send(live_app(hub), upgrade(live::SUBPROTOCOL_WEBSOCKET)).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(json(&body)["error"].as_str().unwrap().contains("off"));
    // A subprotocol but no upgrade (oneshot has no connection to upgrade): 400, not a hang.
    let hub = Arc::new(live::LiveHub::new(
        "rigd van-07".into(),
        vec![],
        1,
        Arc::new(|| 0),
    ));
    let (code, _, _) = send(live_app(hub.clone()), upgrade(live::SUBPROTOCOL_SDK)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let refused = router(
        AppState::new(rig.clone(), rig.clone())
            .with_live(hub)
            .with_allow_list(access::AllowList::new(vec![])),
    );
    assert_eq!(
        send(refused, upgrade(live::SUBPROTOCOL_SDK)).await.0,
        StatusCode::FORBIDDEN
    );
}

fn from_peer(mut req: Request<Body>, ip: &str) -> Request<Body> {
    let peer = std::net::SocketAddr::new(ip.parse().unwrap(), 5555);
    req.extensions_mut().insert(access::Peer(peer));
    req
}

fn site_app() -> Router {
    let rig = Arc::new(FakeRig::default());
    let hub = Arc::new(live::LiveHub::new(
        "rigd van-07".into(),
        vec![],
        4,
        Arc::new(|| 0),
    ));
    let site = site::SitePolicy::new(
        &["van-07.local".into()],
        &["https://app.foxglove.dev".into()],
    )
    .unwrap();
    router(
        AppState::new(rig.clone(), rig)
            .with_live(hub)
            .with_site_policy(site),
    )
}

/// DNS rebinding: the attacker's name in `Host` gets 421 on every route, the rig's names and
/// addresses are answered.
#[tokio::test]
async fn a_rebound_name_gets_421_on_every_route() {
    let app = site_app();
    for path in [
        "/",
        "/api/status",
        "/api/sources/front/preview.jpg",
        "/metrics",
        "/api/stream",
    ] {
        let req = Request::get(path)
            .header(header::HOST, "rebind.attacker.example:8088")
            .body(Body::empty())
            .unwrap();
        let (code, _, body) = send(app.clone(), req).await;
        assert_eq!(code, StatusCode::MISDIRECTED_REQUEST, "{path}");
        assert!(json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("server-names"));
    }
    for host in ["127.0.0.2:8088", "van-07.local:8088", "localhost:8088"] {
        let req = Request::get("/api/status")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(app.clone(), req).await.0, StatusCode::OK, "{host}");
    }
}

/// A WebSocket from another site's page is refused before the upgrade; the rig's own page, a
/// listed origin and a native client (no Origin) reach the live view's own checks.
#[tokio::test]
async fn the_live_view_refuses_another_sites_page() {
    let upgrade = |origin: Option<&str>| {
        let mut b = Request::get("/foxglove")
            .header(header::HOST, "127.0.0.2:8088")
            .header(header::SEC_WEBSOCKET_PROTOCOL, live::SUBPROTOCOL_SDK);
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(Body::empty()).unwrap()
    };
    let (code, _, body) = send(site_app(), upgrade(Some("http://evil.example"))).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert!(json(&body)["error"]
        .as_str()
        .unwrap()
        .contains("allowed-origins"));
    // Past the origin rule, oneshot has no connection to upgrade: 400 from the live view itself.
    for ok in [
        None,
        Some("http://127.0.0.2:8088"),
        Some("https://app.foxglove.dev"),
    ] {
        assert_eq!(
            send(site_app(), upgrade(ok)).await.0,
            StatusCode::BAD_REQUEST,
            "{ok:?}"
        );
    }
    // A cross-origin POST with the right token is still another site's: refused.
    let mut req = control(
        &Method::POST,
        "/api/uplink/pause",
        "",
        Some("Bearer s3cret-token"),
    );
    req.headers_mut().insert(
        header::ORIGIN,
        HeaderValue::from_static("http://evil.example"),
    );
    req.headers_mut()
        .insert(header::HOST, HeaderValue::from_static("127.0.0.2:8088"));
    assert_eq!(send(site_app(), req).await.0, StatusCode::FORBIDDEN);
}

/// After the free tries, wrong tokens from one peer get 429 with Retry-After, even with the right
/// token meanwhile; another peer is not slowed.
#[tokio::test]
async fn wrong_tokens_slow_the_peer_that_sends_them() {
    let (app, _) = app_with(Some(TOKEN));
    let try_token = |auth: &'static str, ip: &'static str| {
        from_peer(
            control(&Method::POST, "/api/uplink/pause", "", Some(auth)),
            ip,
        )
    };
    for _ in 0..peers::FREE_FAILURES {
        assert_eq!(
            send(app.clone(), try_token("Bearer wrong", "10.0.0.9"))
                .await
                .0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        send(app.clone(), try_token("Bearer wrong", "10.0.0.9"))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    let (code, headers, body) =
        send(app.clone(), try_token("Bearer s3cret-token", "10.0.0.9")).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers[header::RETRY_AFTER], "1");
    assert!(json(&body)["error"].as_str().unwrap().contains("try again"));
    assert_eq!(
        send(app.clone(), try_token("Bearer s3cret-token", "10.0.0.10"))
            .await
            .0,
        StatusCode::OK
    );
}

/// One peer holds at most half of the status streams; another peer still gets one.
#[tokio::test]
async fn one_peer_cannot_take_every_stream() {
    let rig = Arc::new(FakeRig::default());
    let app =
        router(AppState::new(rig.clone(), rig).with_stream_limit(4, Duration::from_millis(20)));
    let stream = |ip| from_peer(Request::get("/api/stream").body(Body::empty()).unwrap(), ip);
    let mut open = Vec::new();
    for _ in 0..2 {
        let r = app.clone().oneshot(stream("192.168.1.20")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        open.push(r);
    }
    let (code, _, body) = send(app.clone(), stream("192.168.1.20")).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    assert!(json(&body)["error"]
        .as_str()
        .unwrap()
        .contains("close another"));
    let r = app.clone().oneshot(stream("192.168.1.21")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    drop(open);
    let r = app.oneshot(stream("192.168.1.20")).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "slots come back when streams end"
    );
}
