//! The HTTP server under the router: accepts connections, bounds what a client can hold, and stops
//! promptly. axum's own `serve` has no header or idle deadline and no connection cap, and its
//! graceful shutdown waits for every connection without end, so a half-sent request (or an open
//! page) could hold the daemon's SIGTERM open; this server is hyper's HTTP/1 connection driven by a
//! small per-connection watchdog.
//!
//! What a connection may hold, and for how long ([`ServeLimits`]):
//! - from accept (or the first byte of a new request on a kept-alive connection) to the end of the
//!   request head: `header_timeout`, then the connection is closed;
//! - between requests on a kept-alive connection: `idle_timeout`;
//! - a response the client stops reading (the socket accepts nothing): `idle_timeout`;
//! - a request being served has no deadline here: the router gives every route but the live
//!   stream its own ([`crate::REQUEST_TIMEOUT`]), and live streams end on shutdown.
//!
//! At most `max_connections` are open. A new connection beyond that closes the connection that has
//! been idle longest (no request in flight: a half-sent head, a kept-alive client); when every
//! connection has a request in flight, the new one is closed at once.
//!
//! Shutdown stops accepting (the listener is dropped, so new connects are refused by the kernel),
//! asks every connection to finish (idle ones close at once, in-flight requests may complete),
//! waits at most `shutdown_grace` and then drops whatever is left, live streams included.

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How much a client may hold of the server. The defaults suit a status page on a rig: a phone or
/// laptop or two, scripts polling `/api/status`, a Prometheus scraper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Time from accept, or from the first byte of a request on a kept-alive connection, to the
    /// end of its head. Default 5 s: a browser on a phone sends its head in one packet.
    pub header_timeout: Duration,
    /// Time a kept-alive connection may sit between requests, and a response may stay unread by
    /// its client. Default 30 s: longer than the page's 2 s polling fallback, so browsers reuse
    /// their connections.
    pub idle_timeout: Duration,
    /// Connections open at once. Default 128: far more than a rig's technicians open (the live
    /// stream alone is capped at [`crate::MAX_STREAMS`]), far fewer than the daemon's file
    /// descriptor limit.
    pub max_connections: usize,
    /// On shutdown, how long requests in flight may take to finish before every connection is
    /// dropped. Default 1 s.
    pub shutdown_grace: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_connections: 128,
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops within
/// `limits.shutdown_grace` (plus the time to drop the connections). Accept errors (out of file
/// descriptors, say) are logged and retried; nothing here ends the server but `shutdown`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) {
    serve_tls(listener, app, limits, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given: the handshake must end within the header deadline
/// (a client that opens a connection and says nothing holds it no longer than a silent HTTP
/// client would), and a client that speaks plain HTTP to it fails the handshake and is closed.
pub async fn serve_tls(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut open: Vec<Weak<Activity>> = Vec::new();
    let mut refused = RateLimitedCount::new("web connection cap reached: new connections closed");
    let mut evicted = RateLimitedCount::new("web connection cap reached: idle connections closed");
    let mut failed = RateLimitedCount::new("web server: accept failed");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // EMFILE, ENFILE, ENOBUFS: the error stays until something closes, so
                        // wait instead of spinning on it. Per-connection errors (ECONNABORTED)
                        // cost the same short pause.
                        failed.bump_with(&e);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // The cap is enforced after accept rather than by not accepting: a connection
                // left in the kernel's backlog costs the daemon no descriptor, but it cannot be
                // judged or timed out there, so a flood of half-open clients would hold the
                // technician's page out until they give up. Accepted, the new connection costs one
                // descriptor for a moment: it either replaces the longest-idle connection (which
                // closes on its next poll) or is closed at once. Descriptors stay within the cap
                // plus the evictions still closing.
                open.retain(|w| w.strong_count() > 0);
                let live = open
                    .iter()
                    .filter_map(Weak::upgrade)
                    .filter(|a| !a.lock().evicted)
                    .count();
                if live >= limits.max_connections.max(1) {
                    if evict_longest_idle(&open) {
                        evicted.bump();
                    } else {
                        refused.bump();
                        drop(stream);
                        continue;
                    }
                }
                let activity = Arc::new(Activity::new());
                open.push(Arc::downgrade(&activity));
                let (app, stop) = (app.clone(), stop_rx.clone());
                let _ = stream.set_nodelay(true);
                match acceptor.clone() {
                    None => connections.spawn(connection(stream, peer, app, limits, activity, stop)),
                    Some(acceptor) => connections.spawn(async move {
                        match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
                            Ok(Ok(tls)) => connection(tls, peer, app, limits, activity, stop).await,
                            Ok(Err(e)) => tracing::debug!(error = %e, "web connection: TLS handshake failed"),
                            Err(_) => tracing::debug!("web connection: no TLS handshake within the header deadline"),
                        }
                    }),
                };
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            connections = connections.len(),
            "web server: dropping connections still open after the shutdown grace"
        );
    }
    // Aborting drops each connection's future, and with it the socket (live streams included).
    connections.shutdown().await;
}

/// Marks the connection that has been idle longest for closing; false when every connection has
/// a request in flight.
fn evict_longest_idle(open: &[Weak<Activity>]) -> bool {
    let victim = open
        .iter()
        .filter_map(Weak::upgrade)
        .filter_map(|a| {
            let s = a.lock();
            (!s.evicted && s.in_flight == 0).then_some((s.idle_since, a.clone()))
        })
        .min_by_key(|(since, _)| *since);
    match victim {
        Some((_, a)) => {
            a.lock().evicted = true;
            a.changed.notify_one();
            true
        }
        None => false,
    }
}

/// One connection: hyper's HTTP/1 state machine, its watchdog, and the shutdown request. Each
/// request carries the connection's peer address ([`crate::access::Peer`]).
async fn connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    peer: std::net::SocketAddr,
    app: Router,
    limits: ServeLimits,
    activity: Arc<Activity>,
    mut stop: watch::Receiver<bool>,
) {
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(crate::access::Peer(peer));
        let guard = InFlight::start(service_activity.clone());
        let app = app.clone();
        async move {
            let response = tower::ServiceExt::oneshot(app, req).await?;
            // The request counts as in flight until hyper drops the response body, which it
            // does once the last byte is written (or the connection ends); the guard lives in
            // the body for that reason.
            Ok::<_, std::convert::Infallible>(response.map(move |body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &guard;
                    frame
                }))
            }))
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper's own header timeout also runs while a kept-alive connection waits for its next
    // request, which would cut idle connections at the header deadline; the watchdog below keeps
    // the two apart.
    http.header_read_timeout(None);
    // With upgrades: the live view (`/foxglove`) turns its connection into a WebSocket, which
    // then lives on in the task that serves it (ending on shutdown), outside this watchdog.
    let conn = http.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "web connection ended with an error");
            }
            return;
        }
        why = watchdog(&activity, limits) => {
            tracing::debug!(reason = why, "web connection closed");
            return;
        }
        _ = stop.wait_for(|stop| *stop) => {}
    }
    // Idle connections close now (hyper would keep one with a half-read head until the grace
    // ends); a request in flight may finish, and the server drops us after the grace.
    if activity.lock().in_flight == 0 {
        return;
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Resolves when the connection has outlived a deadline (or was evicted), with the reason.
async fn watchdog(activity: &Activity, limits: ServeLimits) -> &'static str {
    loop {
        // Register for a change before reading the state, so none is missed in between.
        let changed = activity.changed.notified();
        let next = activity.lock().deadline(&limits);
        match next {
            Some((at, why)) if at <= Instant::now() => return why,
            Some((at, _)) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = changed => {}
                }
            }
            None => changed.await,
        }
    }
}

/// What the watchdog and the connection cap know of one connection.
struct Activity {
    state: Mutex<ConnState>,
    /// Signalled whenever a deadline may have moved earlier (a head starts, a write blocks, a
    /// request ends, an eviction).
    changed: Notify,
}

struct ConnState {
    /// Requests whose response has not been written out yet.
    in_flight: usize,
    /// A response was written: the next wait counts as keep-alive idle, not as the first head.
    served: bool,
    /// Accept, or the end of the last response.
    idle_since: Instant,
    /// The first byte of a request head arrived on an idle connection.
    head_started: Option<Instant>,
    /// The socket has refused a write since then (the client does not read).
    write_blocked_since: Option<Instant>,
    /// The connection cap chose this connection to make room.
    evicted: bool,
}

impl Activity {
    fn new() -> Self {
        Self {
            state: Mutex::new(ConnState {
                in_flight: 0,
                served: false,
                idle_since: Instant::now(),
                head_started: None,
                write_blocked_since: None,
                evicted: false,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ConnState> {
        // The state is plain data, valid after any panic of a holder.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ConnState {
    /// The earliest deadline the connection is under, and what it is for; `None` while a request
    /// is being served and its response flows.
    fn deadline(&self, limits: &ServeLimits) -> Option<(Instant, &'static str)> {
        if self.evicted {
            return Some((Instant::now(), "evicted to make room (connection cap)"));
        }
        let stalled = self
            .write_blocked_since
            .map(|t| (t + limits.idle_timeout, "client stopped reading"));
        let waiting = if self.in_flight > 0 {
            None
        } else if let Some(t) = self.head_started {
            Some((
                t + limits.header_timeout,
                "request head not finished in time",
            ))
        } else if self.served {
            Some((self.idle_since + limits.idle_timeout, "idle keep-alive"))
        } else {
            Some((
                self.idle_since + limits.header_timeout,
                "no request head in time",
            ))
        };
        match (stalled, waiting) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

/// Held by a request from the moment hyper has its head until its response body is dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> Self {
        {
            let mut s = activity.lock();
            s.in_flight += 1;
            s.head_started = None;
        }
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight -= 1;
        if s.in_flight == 0 {
            s.served = true;
            s.idle_since = Instant::now();
            // Bytes of a pipelined next request read meanwhile fall under the idle deadline.
            s.head_started = None;
            drop(s);
            self.0.changed.notify_one();
        }
    }
}

/// The socket, noting for the watchdog when a request head starts and when the client stops
/// taking bytes.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let mut s = this.activity.lock();
            if s.in_flight == 0 && s.head_started.is_none() {
                s.head_started = Some(Instant::now());
                drop(s);
                this.activity.changed.notify_one();
            }
        }
        r
    }
}

impl<S> Watched<S> {
    fn note_write<T>(&self, r: &Poll<io::Result<T>>) {
        match r {
            Poll::Pending => {
                let mut s = self.activity.lock();
                if s.write_blocked_since.is_none() {
                    s.write_blocked_since = Some(Instant::now());
                    drop(s);
                    self.activity.changed.notify_one();
                }
            }
            Poll::Ready(_) => {
                let mut s = self.activity.lock();
                s.write_blocked_since = None;
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.note_write(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.note_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A warning for a burst of the same event: the first one, then at most one every 10 s with the
/// count since.
struct RateLimitedCount {
    what: &'static str,
    since_log: u64,
    last_log: Option<Instant>,
}

impl RateLimitedCount {
    const EVERY: Duration = Duration::from_secs(10);

    fn new(what: &'static str) -> Self {
        Self {
            what,
            since_log: 0,
            last_log: None,
        }
    }

    fn bump(&mut self) {
        if self.due() {
            tracing::warn!(count = self.since_log, "{}", self.what);
            self.since_log = 0;
        }
    }

    /// The same, naming the latest error.
    fn bump_with(&mut self, error: &io::Error) {
        if self.due() {
            tracing::warn!(count = self.since_log, %error, "{}", self.what);
            self.since_log = 0;
        }
    }

    fn due(&mut self) -> bool {
        self.since_log += 1;
        let now = Instant::now();
        let due = self
            .last_log
            .is_none_or(|t| now.duration_since(t) >= Self::EVERY);
        if due {
            self.last_log = Some(now);
        }
        due
    }
}

/// The TLS configuration for [`serve_tls`] from a PEM certificate chain and its private key; the
/// error names the file and what is wrong with it.
pub fn tls_server_config(
    cert_file: &std::path::Path,
    key_file: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", cert_file.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("{}: no private key in it ({e})", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "{} and {}: {e} (is the key the certificate's?)",
                cert_file.display(),
                key_file.display()
            )
        })?;
    Ok(Arc::new(config))
}
