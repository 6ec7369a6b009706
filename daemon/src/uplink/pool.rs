//! One connection per broker, shared by every producer of the rig (its sources, their epochs)
//! and by the probe's consumers, as the Java client shares one per broker (`ConnectionPool`,
//! `connectionsPerBroker = 1`).
//!
//! A [`Connection`] owns the socket and three tasks: the reader routes each command from the
//! broker to the producer or consumer it names (by producer or consumer id) or to the request it
//! answers (by request id), and answers PING and AUTH_CHALLENGE itself; the writer takes whole
//! frames from the producers' queues in the order [`state::ConnectionState`] decides (control
//! commands before all, then the best budget rank, every rank's wait bounded), so that frames
//! never interleave on the stream and the budget orders the bytes across sources as it did across
//! sockets; the keepalive pings a quiet broker, ends a silent connection and tells each producer
//! how its frames wait. A connection that fails fails every producer on it at once; the next setup
//! dials a new one. The decisions are [`state`]'s (pure); this file holds the sockets, tasks and
//! channels that perform them. Nothing here decides what a producer does about it (`producer.rs`).

use bytes::{Bytes, BytesMut};
use pulsar::proto::{base_command::Type, BaseCommand};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

use super::budget::Budget;
use super::codec::{self, Inbound};
use super::error::{server_error, LinkError};
use super::links::{self, Path};
use super::token::Token;

pub mod state;

use state::{ConnectionState, Next, Tick};
pub use state::{Wait, STARVED_AFTER};

/// A byte stream to a broker: plain TCP or TLS.
pub trait Conn: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Conn for T {}

/// The rig's connections, one per link and broker address (and TLS, and proxy target).
pub struct Pool {
    /// The links (`uplink::links`): one (the default route) unless `[[pulsar.link]]` names
    /// several; each with the budget its connections' writers are charged against.
    paths: Vec<Arc<Path>>,
    /// Held while a setup chooses its link and is counted on it (concurrent setups spread).
    choosing: Mutex<()>,
    /// When a producer last moved to spread the links of one cost ([`Pool::better`]).
    spread_at: Mutex<Option<Instant>>,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Weak<Connection>>>>>,
    retired: Arc<Retired>,
}

/// A slot's key: the link's name and the connection's own key.
fn slot_key(path: &Path, key: &str) -> String {
    format!("{}|{key}", path.name)
}

/// Sockets of connections given up for silence, kept open (unread, unwritten) until a new
/// connection to the same broker answers CONNECT, then reset.
///
/// The broker keeps a producer's name on its old connection until that connection closes, and
/// a new connection's PRODUCER under the name waits for the broker's liveness check of the old
/// one (5 s, `connectionLivenessCheckTimeoutMillis`): its PING goes behind whatever the broker
/// is retransmitting there, backed off through the outage. A reset sent as the connection is
/// given up is lost in the silence that made rigd give it up, and nothing sends it again. Sent
/// once a new connection proves the link is back, it reaches the broker (directly, or as the
/// answer to the challenge ACK it provokes), the broker closes the old connection, its liveness
/// check ends at once, and the producers are created (5.5 s after a 40 s silent cut before,
/// measured; see docs/UPLINK.md "Reconnects").
/// (Which are kept and for how long: [`state::Retired`]; here they are reset.)
#[derive(Default)]
struct Retired {
    sockets: Mutex<state::Retired<std::os::fd::OwnedFd>>,
}

impl Retired {
    fn sockets(&self) -> MutexGuard<'_, state::Retired<std::os::fd::OwnedFd>> {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `socket` of the connection to `key` for its reset; resets those kept too long.
    fn keep(&self, key: &str, socket: std::os::fd::OwnedFd) {
        let due = self.sockets().keep(key, socket, Instant::now());
        due.into_iter().for_each(reset);
    }

    /// A new connection to `key` answered CONNECT: the kept ones are reset now.
    fn reset(&self, key: &str) {
        let due = self.sockets().answered(key, Instant::now());
        due.into_iter().for_each(reset);
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        self.sockets().take_all().into_iter().for_each(reset);
    }
}

/// Closes a socket with a reset: what its kernel buffers is not sent.
fn reset(socket: std::os::fd::OwnedFd) {
    reset_on_close(&socket);
}

/// SO_LINGER 0: the socket's last close resets it.
fn reset_on_close(socket: &std::os::fd::OwnedFd) {
    if let Err(e) = rustix::net::sockopt::set_socket_linger(socket, Some(Duration::ZERO)) {
        tracing::debug!(error = %e, "cannot set SO_LINGER 0 on a failed connection; closing it");
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl Pool {
    /// One link, the default route, under `budget`.
    pub fn new(budget: Option<Arc<Budget>>) -> Arc<Self> {
        Pool::over(vec![Path::new("default".into(), None, 0, budget)])
    }

    /// Connections over `paths` (at least one).
    pub fn over(paths: Vec<Arc<Path>>) -> Arc<Self> {
        assert!(!paths.is_empty(), "a pool needs a link");
        Arc::new(Pool {
            paths,
            choosing: Mutex::default(),
            spread_at: Mutex::default(),
            slots: Mutex::default(),
            retired: Arc::default(),
        })
    }

    pub fn paths(&self) -> &[Arc<Path>] {
        &self.paths
    }

    /// Several links: connections watch their link's silence and producers move between them.
    pub fn multi(&self) -> bool {
        self.paths.len() > 1
    }

    fn candidates(&self, now: Instant) -> Vec<links::Candidate> {
        self.paths
            .iter()
            .map(|p| p.candidate(p.load(), now))
            .collect()
    }

    /// The link the next setup goes over ([`links::choose`]), counted on it
    /// ([`Path::assign`]: the setup releases it when it chooses again or ends).
    pub fn take(&self) -> Arc<Path> {
        let _choosing = self.choosing.lock().unwrap_or_else(|p| p.into_inner());
        let path = match self.multi() {
            false => self.paths[0].clone(),
            true => self.paths[links::choose(&self.candidates(Instant::now()))].clone(),
        };
        path.assign();
        path
    }

    /// The link a producer on `at` should move to ([`links::better`]), and why; a spread move
    /// only if no other producer of the rig took one in the last [`links::REBALANCE_EVERY`].
    pub fn better(&self, at: &Path) -> Option<(Arc<Path>, links::Move)> {
        if !self.multi() {
            return None;
        }
        let now = Instant::now();
        let i = self.paths.iter().position(|p| std::ptr::eq(&**p, at))?;
        let to = links::better(&self.candidates(now), i)?;
        let j = match to {
            links::Move::Cheaper(j) => j,
            links::Move::Spread(j) => {
                let mut last = self.spread_at.lock().unwrap_or_else(|p| p.into_inner());
                if last.is_some_and(|t| now.saturating_duration_since(t) < links::REBALANCE_EVERY) {
                    return None;
                }
                *last = Some(now);
                j
            }
        };
        self.paths[j].moving_in(to);
        Some((self.paths[j].clone(), to))
    }

    /// Watches the links given up (several links only): each second a TCP connect to one of
    /// `brokers` over it; one that succeeds makes it usable again. Also notes each link's
    /// interface going down and up. Ends with `shutdown`.
    pub async fn watch(
        self: Arc<Self>,
        brokers: Vec<String>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        if !self.multi() {
            return;
        }
        loop {
            let now = Instant::now();
            for p in &self.paths {
                let up = p.interface_up();
                p.interface_seen(up, now);
                if up && p.held(now) && probe(p, &brokers).await {
                    p.answered(Instant::now());
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(links::PROBE_EVERY) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// The live connection under `key` over `path`, or a new one from `dial` (at most one dial
    /// per key at a time: producers that ask meanwhile wait for it and share what it opened).
    pub async fn connection<F>(
        &self,
        key: String,
        path: &Arc<Path>,
        dial: F,
    ) -> Result<Arc<Connection>, LinkError>
    where
        F: std::future::Future<Output = Result<Dialed, LinkError>>,
    {
        let key = slot_key(path, &key);
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.entry(key.clone()).or_default().clone()
        };
        let mut held = slot.lock().await;
        if let Some(c) = held.upgrade().filter(|c| c.failure().is_none()) {
            return Ok(c);
        }
        let dialed = dial.await?;
        self.retired.reset(&key);
        let conn = Arc::new(Connection::start(
            dialed,
            path.clone(),
            self.multi(),
            key.clone(),
            self.retired.clone(),
        ));
        *held = Arc::downgrade(&conn);
        Ok(conn)
    }

    /// Open connections (status and tests: one per broker).
    pub fn open(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .values()
            .filter_map(|s| s.try_lock().ok().and_then(|w| w.upgrade()))
            .filter(|c| c.failure().is_none())
            .count()
    }
}

/// A bare TCP connect over `path` to one of `brokers` (`host:port`) succeeds within
/// [`links::PROBE_EVERY`].
async fn probe(path: &Path, brokers: &[String]) -> bool {
    for b in brokers {
        let tried = tokio::time::timeout(links::PROBE_EVERY, async {
            let sa = tokio::net::lookup_host(b)
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            let socket = bound_socket(sa, path.interface.as_deref())?;
            socket.connect(sa).await
        })
        .await;
        if let Ok(Ok(_)) = tried {
            return true;
        }
    }
    false
}

/// A TCP socket for `sa`, bound to `interface` (SO_BINDTODEVICE) when given.
pub fn bound_socket(
    sa: std::net::SocketAddr,
    interface: Option<&str>,
) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = if sa.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(i) = interface {
        socket
            .bind_device(Some(i.as_bytes()))
            .map_err(|e| std::io::Error::new(e.kind(), format!("binding to interface {i}: {e}")))?;
    }
    Ok(socket)
}

/// A stream that answered CONNECT.
pub struct Dialed {
    pub stream: Box<dyn Conn>,
    /// The TCP socket under the stream (TLS or not), a duplicate descriptor: a failed connection
    /// ends with a reset (see [`Connection::fail`]).
    pub socket: std::os::fd::OwnedFd,
    pub addr: String,
    pub max_message_size: usize,
    pub token: Token,
    /// Bytes the broker sent after CONNECTED, already read.
    pub rest: BytesMut,
}

/// Why a connection ended, kept to tell every producer on it.
#[derive(Debug, Clone)]
enum Failure {
    /// The last producer on it went (a graceful close).
    Dropped,
    Closed,
    Io(std::io::ErrorKind, String),
    Codec(String),
    Timeout(String),
    Broker(String),
}

impl Failure {
    fn of(e: &LinkError) -> Self {
        match e {
            LinkError::Io(io) => Failure::Io(io.kind(), io.to_string()),
            LinkError::Connect { source, .. } => Failure::Io(source.kind(), e.to_string()),
            LinkError::Codec(c) => Failure::Codec(c.to_string()),
            LinkError::Timeout(w) => Failure::Timeout(w.clone()),
            LinkError::Closed => Failure::Closed,
            other => Failure::Broker(other.to_string()),
        }
    }

    fn error(&self) -> LinkError {
        match self {
            Failure::Dropped | Failure::Closed => LinkError::Closed,
            Failure::Io(kind, msg) => LinkError::Io(std::io::Error::new(*kind, msg.clone())),
            Failure::Codec(msg) => LinkError::Broker(format!("protocol: {msg}")),
            Failure::Timeout(what) => LinkError::Timeout(what.clone()),
            Failure::Broker(msg) => LinkError::Broker(msg.clone()),
        }
    }
}

/// Where a command from the broker goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// To the producer or consumer with this id.
    Channel(u64),
    /// To the request with this id.
    Request(u64),
    /// The connection answers it (PING, AUTH_CHALLENGE).
    Answer,
    /// Nobody: a PONG, or something a producer does not use.
    Drop,
}

/// The route of a command from the broker. Pure.
pub fn route(cmd: &BaseCommand) -> Route {
    if cmd.r#type == Type::Ping as i32 || cmd.auth_challenge.is_some() {
        return Route::Answer;
    }
    if let Some(id) = cmd
        .send_receipt
        .as_ref()
        .map(|c| c.producer_id)
        .or(cmd.send_error.as_ref().map(|c| c.producer_id))
        .or(cmd.close_producer.as_ref().map(|c| c.producer_id))
        .or(cmd.message.as_ref().map(|c| c.consumer_id))
        .or(cmd.close_consumer.as_ref().map(|c| c.consumer_id))
        .or(cmd.active_consumer_change.as_ref().map(|c| c.consumer_id))
        .or(cmd.reached_end_of_topic.as_ref().map(|c| c.consumer_id))
    {
        return Route::Channel(id);
    }
    if let Some(id) = cmd
        .success
        .as_ref()
        .map(|c| c.request_id)
        .or(cmd.error.as_ref().map(|c| c.request_id))
        .or(cmd.producer_success.as_ref().map(|c| c.request_id))
        .or(cmd.lookup_topic_response.as_ref().map(|c| c.request_id))
        .or(cmd
            .partition_metadata_response
            .as_ref()
            .map(|c| c.request_id))
        .or(cmd
            .get_last_message_id_response
            .as_ref()
            .map(|c| c.request_id))
    {
        return Route::Request(id);
    }
    Route::Drop
}

/// What a channel's producer is told of how its frames wait ([`Wait`]): while the budget holds
/// its bytes back, while better ranks or a throttling broker hold its queued frames (every
/// keepalive tick), and once that is over. A plain closure is told only that the link is not to
/// blame; [`Reported`] also shows the wait in status.
pub type Held = Arc<dyn Waiter>;

/// See [`Held`].
pub trait Waiter: Send + Sync {
    /// The link is not to blame for the wait ([`Wait::excuses`]): the producer's window restarts
    /// its stall clock.
    fn excused(&self);

    /// Its queued frames have waited untaken this long (zero: they wait no more).
    fn waited(&self, _waited: Duration) {}
}

impl<F: Fn() + Send + Sync> Waiter for F {
    fn excused(&self) {
        self()
    }
}

fn tell_one(held: &Held, wait: Wait) {
    if wait.excuses() {
        held.excused();
    }
    held.waited(wait.waited());
}

/// A producer's [`Waiter`]: `excuse` restarts its stall clock, and its waits go to its source's
/// [`Starved`].
pub struct Reported<F> {
    excuse: F,
    starved: Arc<Starved>,
    /// This producer among the source's.
    who: usize,
}

impl<F: Fn() + Send + Sync> Reported<F> {
    pub fn new(starved: Arc<Starved>, excuse: F) -> Self {
        static PRODUCERS: AtomicUsize = AtomicUsize::new(0);
        Reported {
            excuse,
            starved,
            who: PRODUCERS.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl<F: Fn() + Send + Sync> Waiter for Reported<F> {
    fn excused(&self) {
        (self.excuse)()
    }

    fn waited(&self, waited: Duration) {
        self.starved.note(self.who, waited);
    }
}

impl<F> Drop for Reported<F> {
    fn drop(&mut self) {
        self.starved.note(self.who, Duration::ZERO);
    }
}

/// How long each of a source's producers has waited with frames queued on its connection, as
/// the pool last told it: status and metrics show the longest (`starved_ms`).
#[derive(Debug, Default)]
pub struct Starved {
    waits: Mutex<Vec<(usize, Duration)>>,
}

impl Starved {
    /// Producer `who` (any key unique among the source's producers) has waited this long
    /// (zero: it waits no more).
    pub fn note(&self, who: usize, waited: Duration) {
        let mut waits = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        waits.retain(|(w, _)| *w != who);
        if waited > Duration::ZERO {
            waits.push((who, waited));
        }
    }

    /// The longest wait of the source's producers now (zero: none waits).
    pub fn longest(&self) -> Duration {
        let waits = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        waits.iter().map(|(_, d)| *d).max().unwrap_or_default()
    }
}

/// A producer's or consumer's place on a connection (its queue is [`ConnectionState`]'s).
struct Channel {
    route: mpsc::UnboundedSender<Inbound>,
    rank: Arc<AtomicUsize>,
    held: Held,
    /// Told when bytes of this channel were written (only this channel's).
    progress: Arc<Notify>,
}

struct State {
    /// The queues, write order, keepalive and throttle, decided.
    conn: ConnectionState,
    channels: BTreeMap<u64, Channel>,
    requests: HashMap<u64, mpsc::UnboundedSender<Inbound>>,
    failed: Option<Failure>,
}

impl State {
    /// What the channels are to be told, with whom to tell (called once the lock is released).
    fn told(&mut self) -> Vec<(Held, Wait)> {
        let told = self.conn.take_told();
        told.into_iter()
            .filter_map(|(id, w)| self.channels.get(&id).map(|c| (c.held.clone(), w)))
            .collect()
    }
}

/// Tells each channel its wait (outside the connection's lock: a producer's window has a lock
/// of its own).
fn tell(told: Vec<(Held, Wait)>) {
    for (held, wait) in told {
        tell_one(&held, wait);
    }
}

struct Inner {
    addr: String,
    max_message_size: usize,
    token: Token,
    budget: Option<Arc<Budget>>,
    /// The link it goes over.
    path: Arc<Path>,
    ids: AtomicU64,
    state: Mutex<State>,
    /// The writer has something to do.
    wake: Notify,
    socket: std::os::fd::OwnedFd,
    /// The pool's key of this connection, and where a connection given up for silence leaves
    /// its socket.
    key: String,
    retired: Arc<Retired>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn control(&self, cmd: &BaseCommand) {
        let mut out = BytesMut::new();
        codec::encode_command(cmd, &mut out);
        let mut s = self.state();
        if s.failed.is_none() {
            s.conn.control(out.freeze());
            drop(s);
            self.wake.notify_one();
        }
    }

    /// Ends the connection: every channel and request learns it (their senders are dropped),
    /// the socket is reset rather than closed (a closed socket's kernel would keep sending what
    /// it buffers once the link is back, outside the budget, to nobody), the tasks stop. Given
    /// up for silence, the reset waits for the next connection to the broker ([`Retired`]).
    fn fail(&self, why: Failure) {
        let (channels, requests, waited) = {
            let mut s = self.state();
            if s.failed.is_some() {
                return;
            }
            tracing::debug!(broker = %self.addr, why = ?why, "connection ended");
            s.failed = Some(why);
            let waited = s.conn.end();
            (
                std::mem::take(&mut s.channels),
                std::mem::take(&mut s.requests),
                waited,
            )
        };
        for c in channels.values() {
            c.progress.notify_one();
        }
        for id in waited {
            if let Some(c) = channels.get(&id) {
                tell_one(&c.held, Wait::Over);
            }
        }
        drop((channels, requests));
        let failed = self.state().failed.clone();
        // Given up for silence: the tasks close the stream's descriptor, a duplicate keeps the
        // socket open for its reset (none to spare: reset now).
        let kept = match failed {
            Some(Failure::Timeout(_)) => self.socket.try_clone().ok(),
            _ => None,
        };
        match (failed, kept) {
            (_, Some(kept)) => self.retired.keep(&self.key, kept),
            (Some(Failure::Dropped), _) => {
                let _ = rustix::net::shutdown(&self.socket, rustix::net::Shutdown::Both);
            }
            _ => {
                reset_on_close(&self.socket);
                let _ = rustix::net::shutdown(&self.socket, rustix::net::Shutdown::Both);
            }
        }
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }

    fn deliver(&self, frame: Inbound) {
        self.state().conn.inbound(Instant::now());
        match route(&frame.cmd) {
            Route::Answer if frame.cmd.auth_challenge.is_some() => match self.token.current() {
                Ok(token) => self.control(&codec::auth_response(token)),
                Err(e) => self.fail(Failure::of(&e)),
            },
            Route::Answer => self.control(&codec::pong()),
            Route::Channel(id) => {
                if let Some(c) = self.state().channels.get(&id) {
                    let _ = c.route.send(frame);
                }
            }
            Route::Request(id) => {
                if let Some(r) = self.state().requests.get(&id) {
                    let _ = r.send(frame);
                }
            }
            Route::Drop => {}
        }
    }
}

/// A connection to one broker. Dropped with the last producer on it.
pub struct Connection {
    inner: Arc<Inner>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.inner.fail(Failure::Dropped);
    }
}

/// A producer's or consumer's end of its channel: the broker's commands for it.
pub struct ChannelEnd {
    pub id: u64,
    pub inbound: mpsc::UnboundedReceiver<Inbound>,
    pub progress: Arc<Notify>,
}

impl Connection {
    fn start(
        dialed: Dialed,
        path: Arc<Path>,
        multi: bool,
        key: String,
        retired: Arc<Retired>,
    ) -> Self {
        let Dialed {
            stream,
            socket,
            addr,
            max_message_size,
            token,
            rest,
        } = dialed;
        let inner = Arc::new(Inner {
            addr,
            max_message_size,
            token,
            budget: path.budget.clone(),
            path,
            ids: AtomicU64::new(0),
            state: Mutex::new(State {
                conn: ConnectionState::new(Instant::now()),
                channels: BTreeMap::new(),
                requests: HashMap::new(),
                failed: None,
            }),
            wake: Notify::new(),
            socket,
            key,
            retired,
            tasks: Mutex::default(),
        });
        let (read, write) = tokio::io::split(stream);
        let mut tasks = vec![
            tokio::spawn(read_loop(inner.clone(), read, rest)).abort_handle(),
            tokio::spawn(write_loop(inner.clone(), write)).abort_handle(),
            tokio::spawn(keepalive_loop(inner.clone())).abort_handle(),
        ];
        if multi {
            tasks.push(tokio::spawn(link_loop(inner.clone())).abort_handle());
        }
        inner
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(tasks);
        Connection { inner }
    }

    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// The link it goes over.
    pub fn path(&self) -> &Arc<Path> {
        &self.inner.path
    }

    /// Where its bytes wait, as its kernel sees them (`TCP_INFO`): the estimator tells a link's
    /// queue from a broker slow to answer by it.
    pub fn queued(&self) -> Option<rigd_drivers::tcp::Queued> {
        use std::os::fd::AsFd;
        rigd_drivers::tcp::queued(self.inner.socket.as_fd())
    }

    /// Its link's budget (the one its SENDs' timings feed under `auto`).
    pub fn budget(&self) -> Option<&Arc<Budget>> {
        self.inner.budget.as_ref()
    }

    pub fn max_message_size(&self) -> usize {
        self.inner.max_message_size
    }

    /// A new id for a producer, a consumer or a request (unique on the connection).
    pub fn next_id(&self) -> u64 {
        self.inner.ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Why the connection ended, as the error its producers report; None while it serves.
    pub fn failure(&self) -> Option<LinkError> {
        self.inner.state().failed.as_ref().map(Failure::error)
    }

    /// Ends the connection for everyone on it (a producer found it dead).
    pub fn fail(&self, e: &LinkError) {
        self.inner.fail(Failure::of(e));
    }

    /// The instant of the broker's last command on this connection.
    pub fn last_inbound(&self) -> Instant {
        self.inner.state().conn.last_inbound()
    }

    /// Opens a channel: the broker's commands naming `id` come to its end. `rank`: the budget
    /// rank its frames are written at; `held`: told how its frames wait ([`Held`]).
    pub fn attach(&self, rank: Arc<AtomicUsize>, held: Held) -> Result<ChannelEnd, LinkError> {
        let id = self.next_id();
        let (tx, inbound) = mpsc::unbounded_channel();
        let progress = Arc::new(Notify::new());
        let mut s = self.inner.state();
        if let Some(f) = &s.failed {
            return Err(f.error());
        }
        s.conn.attach(id);
        s.channels.insert(
            id,
            Channel {
                route: tx,
                rank,
                held,
                progress: progress.clone(),
            },
        );
        Ok(ChannelEnd {
            id,
            inbound,
            progress,
        })
    }

    /// Closes channel `id` on the rig's side; `close`: the command that closes it on the broker's
    /// (queued, answered or not). Its queued frames are dropped: none of them is begun (the
    /// Closes consumer `id` on both sides: detaches its channel and queues CLOSE_CONSUMER (the
    /// probe's reads and the control topic's subscription).
    pub fn detach_consumer(&self, id: u64) {
        let close = BaseCommand {
            r#type: Type::CloseConsumer as i32,
            close_consumer: Some(pulsar::proto::CommandCloseConsumer {
                consumer_id: id,
                request_id: self.next_id(),
            }),
            ..Default::default()
        };
        self.detach(id, Some(close));
    }

    /// writer takes a frame whole), and the window sends them again on the producer's next channel.
    pub fn detach(&self, id: u64, close: Option<BaseCommand>) {
        let gone = {
            let mut s = self.inner.state();
            let waited = s.conn.detach(id);
            s.channels.remove(&id).filter(|_| waited)
        };
        if let Some(c) = gone {
            tell_one(&c.held, Wait::Over);
        }
        if let Some(cmd) = close {
            self.inner.control(&cmd);
        }
    }

    /// Queues a command before every frame.
    pub fn control(&self, cmd: &BaseCommand) {
        self.inner.control(cmd);
    }

    /// Queues whole frames of channel `id`.
    pub fn push(&self, id: u64, frames: codec::Frames) -> Result<(), LinkError> {
        let mut s = self.inner.state();
        if let Some(f) = &s.failed {
            return Err(f.error());
        }
        if !s.conn.push(id, frames, Instant::now()) {
            return Err(LinkError::Closed);
        }
        drop(s);
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Channel `id`'s bytes written so far and bytes queued.
    pub fn progress(&self, id: u64) -> (u64, usize) {
        self.inner.state().conn.progress(id)
    }

    /// Sends a request and waits for its answer within `timeout`: the first command with its
    /// request id for which `done` holds (a PRODUCER_SUCCESS not yet ready is waited past), or
    /// the broker's ERROR for it. A request that times out on a connection the broker has said
    /// nothing on meanwhile ends the connection (a frozen broker, a silent link), unless the
    /// broker throttles it (it talks but does not read: the request waits in line).
    pub async fn request(
        &self,
        request_id: u64,
        cmd: BaseCommand,
        what: &'static str,
        timeout: Duration,
        done: impl Fn(&BaseCommand) -> bool,
    ) -> Result<Inbound, LinkError> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        {
            let mut s = self.inner.state();
            if let Some(f) = &s.failed {
                return Err(f.error());
            }
            s.requests.insert(request_id, tx);
        }
        struct Forget<'a>(&'a Inner, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.state().requests.remove(&self.1);
            }
        }
        let _forget = Forget(&self.inner, request_id);
        let asked = Instant::now();
        self.inner.control(&cmd);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let frame = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => {
                    if self.inner.state().conn.silent_since(asked, Instant::now()) {
                        self.fail(&LinkError::Timeout(format!("{what} (the broker silent)")));
                    }
                    return Err(LinkError::Timeout(what.to_string()));
                }
                Ok(None) => return Err(self.failure().unwrap_or(LinkError::Closed)),
                Ok(Some(f)) => f,
            };
            if let Some(e) = &frame.cmd.error {
                let why = format!(
                    "{} ({}) instead of {what}",
                    e.message,
                    server_error(e.error)
                );
                return Err(LinkError::refused_request(e.error, why));
            }
            if done(&frame.cmd) {
                return Ok(frame);
            }
        }
    }
}

async fn read_loop(
    inner: Arc<Inner>,
    mut read: tokio::io::ReadHalf<Box<dyn Conn>>,
    mut buf: BytesMut,
) {
    buf.reserve(64 << 10);
    loop {
        loop {
            match codec::decode_frame(&mut buf) {
                Ok(Some(frame)) => inner.deliver(frame),
                Ok(None) => break,
                Err(e) => return inner.fail(Failure::Codec(e.to_string())),
            }
        }
        match read.read_buf(&mut buf).await {
            Ok(0) => return inner.fail(Failure::Closed),
            Ok(_) => {}
            Err(e) => return inner.fail(Failure::Io(e.kind(), e.to_string())),
        }
    }
}

/// The next thing to write: a control command, or a channel's frame with its rank.
enum Write {
    Control(Bytes),
    Frame {
        bytes: codec::Frames,
        rank: usize,
        held: Held,
    },
}

fn next(inner: &Inner) -> Option<Write> {
    let (next, told) = {
        let mut guard = inner.state();
        let s = &mut *guard;
        let channels = &s.channels;
        let rank = |id: u64| {
            channels
                .get(&id)
                .map_or(usize::MAX, |c| c.rank.load(Ordering::Relaxed))
        };
        let next = match s.conn.next(Instant::now(), rank)? {
            Next::Control(bytes) => Write::Control(bytes),
            Next::Frame { id, bytes } => {
                let c = s.channels.get(&id)?;
                Write::Frame {
                    bytes,
                    rank: c.rank.load(Ordering::Relaxed),
                    held: c.held.clone(),
                }
            }
        };
        (next, s.told())
    };
    tell(told);
    Some(next)
}

/// `n` bytes of the write in progress went out: its channel (only) is told.
fn wrote(inner: &Inner, n: usize) {
    let mut s = inner.state();
    if let Some(c) = s
        .conn
        .wrote(n, Instant::now())
        .and_then(|id| s.channels.get(&id))
    {
        c.progress.notify_one();
    }
}

/// At most this many pieces go to one vectored write (well under the kernel's `IOV_MAX`).
const MAX_IOVECS: usize = 64;

/// The bytes `range` of `parts` laid end to end, as slices for one vectored write (at most
/// [`MAX_IOVECS`]: a write takes what it takes, the rest goes in the next).
fn slices<'a>(
    parts: &'a [Bytes],
    range: std::ops::Range<usize>,
    out: &mut Vec<std::io::IoSlice<'a>>,
) {
    let mut start = 0;
    for p in parts {
        let end = start + p.len();
        let (from, to) = (range.start.max(start), range.end.min(end));
        if from < to {
            out.push(std::io::IoSlice::new(&p[from - start..to - start]));
            if out.len() == MAX_IOVECS {
                return;
            }
        }
        if end >= range.end {
            return;
        }
        start = end;
    }
}

/// Whether a connection's writer has something to write, told to its link's budget as it changes
/// (under `auto` the estimator judges which samples measure the link); idle again when the writer
/// ends.
struct Activity {
    budget: Option<Arc<Budget>>,
    busy: bool,
}

impl Activity {
    fn set(&mut self, busy: bool) {
        if busy != self.busy {
            self.busy = busy;
            if let Some(b) = &self.budget {
                b.writer(busy);
            }
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.set(false);
    }
}

async fn write_loop(inner: Arc<Inner>, mut w: tokio::io::WriteHalf<Box<dyn Conn>>) {
    let mut dirty = false;
    let mut activity = Activity {
        budget: inner.budget.clone().filter(|b| b.is_auto()),
        busy: false,
    };
    loop {
        let wake = inner.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let next = next(&inner);
        activity.set(next.is_some());
        let Some(next) = next else {
            if dirty {
                if let Err(e) = w.flush().await {
                    return inner.fail(Failure::Io(e.kind(), e.to_string()));
                }
                dirty = false;
            }
            wake.await;
            continue;
        };
        let (parts, rank, held) = match next {
            Write::Control(bytes) => (vec![bytes], 0, None),
            Write::Frame {
                mut bytes,
                rank,
                held,
            } => (bytes.take(), rank, Some(held)),
        };
        let len = parts.iter().map(Bytes::len).sum::<usize>();
        // Written as the socket takes it, each write reported: a 5 MiB chunk on a 4 Mbit/s link
        // is ten seconds of progress, not ten seconds of silence. Headers and the payloads they
        // reference go out together, one vectored write (codec::Frames).
        let mut at = 0;
        let mut iov = Vec::with_capacity(parts.len().min(MAX_IOVECS));
        while at < len {
            let granted = match &inner.budget {
                Some(b) => {
                    b.acquire(rank, len - at, || {
                        if let Some(h) = &held {
                            tell_one(h, Wait::Held)
                        }
                    })
                    .await
                }
                None => len - at,
            };
            let end = at + granted;
            while at < end {
                inner.state().conn.write_waits(Instant::now());
                iov.clear();
                slices(&parts, at..end, &mut iov);
                match w.write_vectored(&iov).await {
                    Ok(0) => return inner.fail(Failure::Closed),
                    Ok(n) => {
                        at += n;
                        wrote(&inner, n);
                    }
                    Err(e) => return inner.fail(Failure::Io(e.kind(), e.to_string())),
                }
            }
        }
        inner.state().conn.frame_done(Instant::now());
        dirty = true;
    }
}

async fn keepalive_loop(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(state::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (judged, told) = {
            let mut s = inner.state();
            let judged = s.conn.tick(Instant::now());
            (judged, s.told())
        };
        tell(told);
        match judged {
            Tick::Quiet => {}
            Tick::Ping => inner.control(&codec::ping()),
            Tick::Dead => {
                return inner.fail(Failure::Timeout("any traffic from the broker".into()))
            }
        }
    }
}

/// A connection over one of several links: every [`links::LOOK_EVERY`] its link is judged. Its
/// interface down, or its socket silent ([`links::Silence`]): the link is given up, this
/// connection and every other on the link fail (kept for their reset when the link answers
/// again, as one given up for silence), and their producers set up again on another link.
async fn link_loop(inner: Arc<Inner>) {
    let path = inner.path.clone();
    let generation = path.generation();
    let mut silence = links::Silence::default();
    let mut tick = tokio::time::interval(links::LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let why = if path.generation() != generation {
            Some(format!("link {} given up", path.name))
        } else if !path.interface_up() {
            Some(format!(
                "link {}: interface {} down",
                path.name,
                path.interface.as_deref().unwrap_or("-")
            ))
        } else {
            use std::os::fd::AsFd;
            rigd_drivers::tcp::acks(inner.socket.as_fd())
                .filter(|&(unacked, since_ack)| silence.sample(unacked, since_ack, now))
                .map(|(unacked, since_ack)| {
                    format!(
                        "link {}: {unacked} segments unacknowledged, no ACK for {} ms",
                        path.name,
                        since_ack.as_millis()
                    )
                })
        };
        if let Some(why) = why {
            path.give_up(generation, &why, now);
            return inner.fail(Failure::Timeout(why));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::proto::{CommandSendReceipt, CommandSuccess, MessageIdData};

    #[test]
    fn a_vectored_write_takes_the_range_asked_across_pieces() {
        let parts = [
            Bytes::from_static(b"head"),
            Bytes::from_static(b"payload"),
            Bytes::from_static(b"next"),
        ];
        let joined = |r: std::ops::Range<usize>| {
            let mut iov = Vec::new();
            slices(&parts, r, &mut iov);
            iov.iter().flat_map(|s| s.to_vec()).collect::<Vec<u8>>()
        };
        assert_eq!(joined(0..15), b"headpayloadnext");
        assert_eq!(joined(2..6), b"adpa", "a grant that ends inside a piece");
        assert_eq!(joined(4..11), b"payload");
        assert_eq!(joined(13..15), b"xt");
        let many: Vec<Bytes> = (0..100).map(|_| Bytes::from_static(b"x")).collect();
        let mut iov = Vec::new();
        slices(&many, 0..100, &mut iov);
        assert_eq!(iov.len(), MAX_IOVECS, "the rest goes in the next write");
    }

    #[test]
    fn the_brokers_commands_go_to_the_producer_or_request_they_name() {
        let receipt = BaseCommand {
            r#type: Type::SendReceipt as i32,
            send_receipt: Some(CommandSendReceipt {
                producer_id: 7,
                sequence_id: 3,
                message_id: Some(MessageIdData::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(route(&receipt), Route::Channel(7));
        let success = BaseCommand {
            r#type: Type::Success as i32,
            success: Some(CommandSuccess {
                request_id: 11,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(route(&success), Route::Request(11));
        assert_eq!(route(&codec::ping()), Route::Answer);
        assert_eq!(route(&codec::pong()), Route::Drop);
    }

    /// A connected loopback pair: (rig's end, broker's end).
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let rig = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (broker, _) = l.accept().unwrap();
        broker
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        (rig, broker)
    }

    /// What the broker's end reads now: Ok(0) for a close, an error kind for a reset or nothing.
    fn read_kind(broker: &mut std::net::TcpStream) -> Result<usize, std::io::ErrorKind> {
        use std::io::Read;
        broker.read(&mut [0u8; 16]).map_err(|e| e.kind())
    }

    #[test]
    fn a_connection_given_up_for_silence_is_reset_when_the_next_one_to_its_broker_answers() {
        let retired = Retired::default();
        let (rig, mut broker) = pair();
        let (other, mut other_broker) = pair();
        retired.keep("b1", std::os::fd::OwnedFd::from(rig));
        retired.keep("b2", std::os::fd::OwnedFd::from(other));
        // Kept: the broker's end sees neither a close nor a reset (its keepalive is not answered).
        assert_eq!(read_kind(&mut broker), Err(std::io::ErrorKind::WouldBlock));
        // A new connection to another broker leaves it kept.
        retired.reset("b2");
        assert_eq!(
            read_kind(&mut other_broker),
            Err(std::io::ErrorKind::ConnectionReset)
        );
        assert_eq!(read_kind(&mut broker), Err(std::io::ErrorKind::WouldBlock));
        // One to its broker resets it: a reset, not a close (nothing buffered is sent).
        retired.reset("b1");
        assert_eq!(
            read_kind(&mut broker),
            Err(std::io::ErrorKind::ConnectionReset)
        );
    }

    #[test]
    fn at_most_a_few_given_up_connections_per_broker_are_kept() {
        let retired = Retired::default();
        let mut brokers = Vec::new();
        for _ in 0..=state::RETIRED_MAX {
            let (rig, broker) = pair();
            retired.keep("b", std::os::fd::OwnedFd::from(rig));
            brokers.push(broker);
        }
        assert_eq!(
            read_kind(&mut brokers[0]),
            Err(std::io::ErrorKind::ConnectionReset)
        );
        assert_eq!(
            read_kind(&mut brokers[1]),
            Err(std::io::ErrorKind::WouldBlock)
        );
        drop(retired);
        assert_eq!(
            read_kind(&mut brokers[1]),
            Err(std::io::ErrorKind::ConnectionReset)
        );
    }
}
