//! `rigd_web::serve` on a real port on 127.0.0.1: header and idle deadlines, the connection cap, and
//! a shutdown that finishes within its grace whatever the clients hold.

use axum::response::sse::{Event, Sse};
use axum::routing::get;
use axum::Router;
use rigd_web::{serve, ServeLimits};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `/` answers `ok`; `/slow` after 300 ms; `/hang` never; `/sse` streams forever and ignores
/// shutdown (the server must end it).
fn app() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "ok"
            }),
        )
        .route("/hang", get(std::future::pending::<&'static str>))
        .route(
            "/sse",
            get(|| async {
                let ticks = futures::stream::unfold((), |()| async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Some((Ok::<_, Infallible>(Event::default().data("tick")), ()))
                });
                Sse::new(ticks)
            }),
        )
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(limits: ServeLimits) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app(), limits, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            stop: Some(tx),
            task,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// Starts the shutdown and returns how long `serve` took to return.
    async fn shut_down(mut self) -> Duration {
        let t0 = Instant::now();
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("serve did not return within 10 s")
            .unwrap();
        t0.elapsed()
    }
}

fn limits(header_ms: u64, idle_ms: u64, max: usize) -> ServeLimits {
    ServeLimits {
        header_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_connections: max,
        shutdown_grace: Duration::from_secs(1),
    }
}

const HALF_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n";

/// Reads until the server closes (EOF or reset); returns the time it took and what was read.
/// Panics if the connection is still open after `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> (Duration, Vec<u8>) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((t0 + within).into(), s.read(&mut buf)).await {
            Err(_) => panic!(
                "still open after {within:?}; read {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return (t0.elapsed(), got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// True when the connection is still open after `wait` (nothing read, no EOF).
async fn still_open(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 64];
    tokio::time::timeout(wait, s.read(&mut buf)).await.is_err()
}

/// Sends `GET path` and reads one small response (its body ends with `ok`).
async fn get_ok(s: &mut TcpStream, path: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .expect("no response within 3 s")
            .unwrap();
        assert!(n > 0, "closed before the response: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(got).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    text
}

#[tokio::test]
async fn half_sent_head_is_closed_after_the_header_timeout() {
    let server = Server::start(limits(300, 5_000, 16)).await;
    let mut half = server.connect().await;
    half.write_all(HALF_HEAD).await.unwrap();
    let mut silent = server.connect().await;
    let (t, got) = closed_within(&mut half, Duration::from_secs(2)).await;
    assert!(t >= Duration::from_millis(250), "closed too early: {t:?}");
    assert!(got.is_empty(), "answered a half head: {got:?}");
    // A connection that sends nothing at all has the same deadline.
    let (t, _) = closed_within(&mut silent, Duration::from_secs(2)).await;
    assert!(t < Duration::from_secs(1), "{t:?}");
    // A head that trickles in slower than the deadline is cut too, though bytes keep coming.
    let mut slow = server.connect().await;
    let t0 = Instant::now();
    let mut cut = false;
    for b in HALF_HEAD.iter().cycle().take(40) {
        if slow.write_all(&[*b]).await.is_err() {
            cut = true;
            break;
        }
        if !still_open(&mut slow, Duration::from_millis(50)).await {
            cut = true;
            break;
        }
    }
    assert!(cut, "a trickled head was not cut");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    server.shut_down().await;
}

#[tokio::test]
async fn kept_alive_connection_waits_the_idle_timeout_not_the_header_timeout() {
    let server = Server::start(limits(300, 1_200, 16)).await;
    let mut s = server.connect().await;
    get_ok(&mut s, "/").await;
    // Past the header deadline, the kept-alive connection still serves.
    assert!(still_open(&mut s, Duration::from_millis(700)).await);
    get_ok(&mut s, "/").await;
    let (t, _) = closed_within(&mut s, Duration::from_secs(3)).await;
    assert!(
        t >= Duration::from_millis(1_100) && t < Duration::from_millis(2_000),
        "idle close after {t:?}"
    );
    // A request in flight has no deadline from the server (the router gives its own).
    let mut busy = server.connect().await;
    busy.write_all(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(still_open(&mut busy, Duration::from_millis(1_600)).await);
    server.shut_down().await;
}

#[tokio::test]
async fn cap_closes_new_connections_when_every_connection_is_busy() {
    let server = Server::start(limits(5_000, 5_000, 4)).await;
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut s = server.connect().await;
        s.write_all(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        busy.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = server.connect().await;
    let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let (t, got) = closed_within(&mut extra, Duration::from_secs(1)).await;
    assert!(got.is_empty(), "served past the cap: {got:?}");
    assert!(t < Duration::from_millis(500), "{t:?}");
    for s in &mut busy {
        assert!(still_open(s, Duration::from_millis(10)).await);
    }
    // A slot freed is a slot for the next client.
    busy.pop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut next = server.connect().await;
    get_ok(&mut next, "/").await;
    server.shut_down().await;
}

#[tokio::test]
async fn cap_makes_room_by_closing_the_longest_idle_connection() {
    let server = Server::start(limits(5_000, 5_000, 4)).await;
    let mut busy = server.connect().await;
    busy.write_all(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut idle = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let mut s = server.connect().await;
        s.write_all(HALF_HEAD).await.unwrap();
        idle.push(s);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut newcomer = server.connect().await;
    get_ok(&mut newcomer, "/").await;
    // The oldest idle one went; the busy one and the younger idle ones stay.
    let (t, _) = closed_within(&mut idle[0], Duration::from_secs(1)).await;
    assert!(t < Duration::from_millis(500), "{t:?}");
    assert!(still_open(&mut idle[1], Duration::from_millis(10)).await);
    assert!(still_open(&mut idle[2], Duration::from_millis(10)).await);
    assert!(still_open(&mut busy, Duration::from_millis(10)).await);
    // Many more than the cap: the server never holds more than the cap.
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(server.connect().await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut open = 0;
    for s in flood.iter_mut().chain(idle.iter_mut()) {
        if still_open(s, Duration::from_millis(5)).await {
            open += 1;
        }
    }
    // The busy connection holds one slot; idle ones fill the other three.
    assert_eq!(open, 3, "idle connections open past the cap");
    server.shut_down().await;
}

#[tokio::test]
async fn shutdown_returns_within_the_grace_with_200_half_open_and_a_live_stream() {
    let server = Server::start(ServeLimits {
        max_connections: 512,
        ..ServeLimits::default()
    })
    .await;
    let mut half_open = Vec::new();
    for _ in 0..200 {
        let mut s = server.connect().await;
        s.write_all(HALF_HEAD).await.unwrap();
        half_open.push(s);
    }
    let mut sse = server.connect().await;
    sse.write_all(b"GET /sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = sse.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200 OK"));
    // A request in flight when shutdown starts is allowed to finish within the grace.
    let mut slow = server.connect().await;
    slow.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for s in half_open.iter_mut().step_by(20) {
        assert!(still_open(s, Duration::from_millis(1)).await);
    }
    let addr = server.addr;

    let took = server.shut_down().await;
    assert!(
        took < Duration::from_millis(1_500),
        "shutdown took {took:?}"
    );
    let (_, got) = closed_within(&mut slow, Duration::from_secs(1)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200 OK") && text.ends_with("ok"),
        "{text}"
    );
    closed_within(&mut sse, Duration::from_secs(1)).await;
    for s in &mut half_open {
        closed_within(s, Duration::from_secs(1)).await;
    }
    // Nothing listens any more.
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn shutdown_closes_idle_and_half_open_connections_without_waiting_the_grace() {
    let server = Server::start(limits(5_000, 30_000, 512)).await;
    let mut held = Vec::new();
    for i in 0..200 {
        let mut s = server.connect().await;
        if i % 2 == 0 {
            s.write_all(HALF_HEAD).await.unwrap();
        } else {
            get_ok(&mut s, "/").await; // kept alive, idle
        }
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let took = server.shut_down().await;
    assert!(took < Duration::from_millis(500), "shutdown took {took:?}");
    for s in &mut held {
        closed_within(s, Duration::from_millis(500)).await;
    }
}
