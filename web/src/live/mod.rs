//! The live view: Foxglove's WebSocket protocol at `/foxglove` (foxglove/ws-protocol `docs/spec.md`),
//! so that Foxglove or Lichtblick show the rig's cameras, audio and GPS as they are captured.
//!
//! The daemon describes its channels ([`Channel`]: topic, schema, which source and which class of
//! drop), at start or as sources appear ([`LiveHub::add_channel`], advertised to the clients
//! connected then), and hands every message it encodes to [`LiveHub::publish`] through the
//! channel's [`ChannelHandle`]; it asks [`ChannelHandle::wanted`] (one atomic load) first, so a
//! channel nobody subscribes to costs it nothing. The hub knows nothing of frames.
//!
//! Each client has a queue of its own, bounded in bytes ([`queue::ClientQueue`]): a client that
//! reads slower than the rig captures loses camera frames first, then audio, then serial records,
//! is told which channel in a `status` warning (at most one per channel every
//! [`WARN_EVERY`]), and the loss is counted per source ([`LiveHub::dropped`], shown as
//! `rigd_live_dropped_total`). Publishing never waits for a client. At most `max_clients` are
//! connected at once; the next one is refused with 503 before the upgrade.
//!
//! A camera with a proxy (docs/LIVE.md "Proxies first") has its full-resolution channel **on
//! demand** ([`LiveHub::set_on_demand`]): advertised only to a client that connected with
//! `?full=1` ([`wants_full`]), so a viewer sees the proxies by default; a channel set on demand
//! after clients connected is unadvertised to the others (and their subscriptions to it end).
//!
//! Both subprotocol names in use are accepted: `foxglove.sdk.v1` (the current Foxglove app,
//! foxglove_bridge 3.x) and `foxglove.websocket.v1` (older clients, Lichtblick); the one the
//! client offered is echoed, and a request that offers neither gets 400.

pub mod queue;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
pub use queue::Picture;
use queue::{ClientQueue, Data, Outgoing};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

pub use queue::Class;

/// The subprotocol of the current Foxglove app and foxglove_bridge 3.x.
pub const SUBPROTOCOL_SDK: &str = "foxglove.sdk.v1";
/// The subprotocol of older clients and Lichtblick.
pub const SUBPROTOCOL_WEBSOCKET: &str = "foxglove.websocket.v1";
/// Message data a client may have waiting before it loses messages.
pub const CLIENT_QUEUE_BYTES: usize = 4 << 20;
/// How often a client is sent the rig clock (the `time` capability).
pub const TIME_EVERY: Duration = Duration::from_millis(250);
/// At most one write to a client this often: what is published meanwhile (a serial record and
/// its fix, a camera frame or an audio block landing beside them) waits on a timer and leaves in
/// the same write, instead of a wake-up and a write each (docs/PERFORMANCE.md "Live view cost").
pub const FLUSH_GAP: Duration = Duration::from_millis(10);
/// At most one drop warning per channel and client this often.
pub const WARN_EVERY: Duration = Duration::from_secs(5);
/// Largest message a client may send (subscribe lists are short).
pub const MAX_CLIENT_MESSAGE: usize = 64 << 10;
/// A client whose socket takes nothing for this long is disconnected.
pub const STALL_LIMIT: Duration = Duration::from_secs(120);
/// Control messages (status, time) a client may leave unread before it is disconnected.
const MAX_CONTROL: usize = 256;

/// One channel the rig offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    pub id: u32,
    /// `/front`, `/gps/fix`.
    pub topic: String,
    /// The source the channel's messages come from (what drops are counted against).
    pub source: String,
    pub class: Class,
    /// `foxglove.CompressedImage`, ...
    pub schema_name: String,
    /// The schema: a base64 protobuf `FileDescriptorSet` (encoding and schema encoding `protobuf`).
    pub schema: String,
}

/// The rig clock, ns (a closure over the daemon's clock).
pub type Now = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The channels, the clients and their subscriptions; shared by the router and the daemon.
pub struct LiveHub {
    name: String,
    /// Channels are only ever added ([`LiveHub::add_channel`]), never removed.
    channels: RwLock<Vec<Arc<ChannelEntry>>>,
    /// Drops per source, in the order of first appearance among the channels.
    dropped: Mutex<Vec<(String, Arc<AtomicU64>)>>,
    clients: Mutex<Vec<Arc<Client>>>,
    slots: Arc<Semaphore>,
    /// Each peer's share of the slots.
    peers: crate::peers::SharedPeerSlots,
    max_clients: usize,
    now: Now,
    queue_bytes: usize,
    session: String,
    next_client: AtomicU64,
}

impl std::fmt::Debug for LiveHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveHub")
            .field("name", &self.name)
            .field("channels", &self.read_channels().len())
            .field("max_clients", &self.max_clients)
            .finish()
    }
}

struct ChannelEntry {
    channel: Channel,
    /// Advertised only to clients that asked for full resolution (a camera with a proxy).
    on_demand: AtomicBool,
    subscribers: AtomicUsize,
    /// The source's drop counter (shared by its channels).
    dropped: Arc<AtomicU64>,
}

/// One channel as its publisher holds it: whether anybody wants it is one atomic load.
#[derive(Clone)]
pub struct ChannelHandle(Arc<ChannelEntry>);

impl std::fmt::Debug for ChannelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ChannelHandle")
            .field(&self.0.channel.topic)
            .finish()
    }
}

impl ChannelHandle {
    /// Whether any client subscribes to the channel now: the publisher encodes nothing otherwise.
    pub fn wanted(&self) -> bool {
        self.0.subscribers.load(Ordering::Relaxed) > 0
    }

    pub fn id(&self) -> u32 {
        self.0.channel.id
    }
}

impl LiveHub {
    /// `name`: what `serverInfo` calls the server; `max_clients`: 0 turns the live view off.
    pub fn new(name: String, channels: Vec<Channel>, max_clients: usize, now: Now) -> Self {
        let hub = Self {
            name,
            channels: RwLock::default(),
            dropped: Mutex::default(),
            clients: Mutex::default(),
            slots: Arc::new(Semaphore::new(max_clients)),
            peers: crate::peers::SharedPeerSlots::new(crate::peers::per_peer_share(max_clients)),
            max_clients,
            now,
            queue_bytes: CLIENT_QUEUE_BYTES,
            session: format!("{:x}", session_stamp()),
            next_client: AtomicU64::new(1),
        };
        for c in channels {
            hub.add_channel(c);
        }
        hub
    }

    /// Adds a channel (its id must be new) and advertises it to the clients connected now; later
    /// clients get it with the others. Returns its handle.
    pub fn add_channel(&self, channel: Channel) -> ChannelHandle {
        let dropped = {
            let mut d = self.dropped.lock().unwrap_or_else(|p| p.into_inner());
            match d.iter().find(|(s, _)| *s == channel.source) {
                Some((_, n)) => n.clone(),
                None => {
                    let n = Arc::new(AtomicU64::new(0));
                    d.push((channel.source.clone(), n.clone()));
                    n
                }
            }
        };
        let entry = Arc::new(ChannelEntry {
            channel,
            on_demand: AtomicBool::new(false),
            subscribers: AtomicUsize::new(0),
            dropped,
        });
        let text = advertise(std::slice::from_ref(&entry));
        self.channels
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(entry.clone());
        for client in self.lock_clients().iter() {
            let mut s = client.lock();
            if s.queue.push_text(text.clone()) > MAX_CONTROL {
                s.overflow = true;
            }
            drop(s);
            client.wake.notify_one();
        }
        ChannelHandle(entry)
    }

    /// Makes channel `id` (a camera's full resolution, beside its proxy's channel) on demand:
    /// from now on advertised only to clients that connected with `?full=1`; the others are sent
    /// `unadvertise` and lose their subscriptions to it. False for a channel the hub does not have.
    pub fn set_on_demand(&self, id: u32) -> bool {
        let Some(entry) = self.entry(id) else {
            return false;
        };
        if entry.on_demand.swap(true, Ordering::Relaxed) {
            return true;
        }
        let text = serde_json::json!({ "op": "unadvertise", "channelIds": [id] }).to_string();
        for client in self.lock_clients().iter().filter(|c| !c.full) {
            let mut s = client.lock();
            let subs: Vec<u32> = s
                .subscriptions
                .iter()
                .filter(|(_, c)| **c == id)
                .map(|(sub, _)| *sub)
                .collect();
            for sub in subs {
                s.subscriptions.remove(&sub);
                s.queue.remove_subscription(sub);
                entry.subscribers.fetch_sub(1, Ordering::Relaxed);
            }
            if s.queue.push_text(text.clone()) > MAX_CONTROL {
                s.overflow = true;
            }
            drop(s);
            client.wake.notify_one();
        }
        true
    }

    /// Whether channel `id` is on demand ([`LiveHub::set_on_demand`]).
    pub fn on_demand(&self, id: u32) -> bool {
        self.entry(id)
            .is_some_and(|e| e.on_demand.load(Ordering::Relaxed))
    }

    /// The handle of channel `id`.
    pub fn handle(&self, id: u32) -> Option<ChannelHandle> {
        self.entry(id).map(ChannelHandle)
    }

    /// Another bound on each client's message data (tests).
    pub fn with_queue_bytes(mut self, bytes: usize) -> Self {
        self.queue_bytes = bytes;
        self
    }

    pub fn channels(&self) -> Vec<Channel> {
        self.read_channels()
            .iter()
            .map(|e| e.channel.clone())
            .collect()
    }

    fn read_channels(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<ChannelEntry>>> {
        self.channels.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any client subscribes to `channel` now ([`ChannelHandle::wanted`] without the
    /// lookup).
    pub fn wanted(&self, channel: u32) -> bool {
        self.entry(channel)
            .is_some_and(|e| e.subscribers.load(Ordering::Relaxed) > 0)
    }

    /// Messages of `source` lost to slow clients since start.
    pub fn dropped(&self, source: &str) -> u64 {
        self.dropped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(s, _)| s == source)
            .map_or(0, |(_, n)| n.load(Ordering::Relaxed))
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.lock_clients().len()
    }

    pub fn max_clients(&self) -> usize {
        self.max_clients
    }

    fn entry(&self, channel: u32) -> Option<Arc<ChannelEntry>> {
        self.read_channels()
            .iter()
            .find(|e| e.channel.id == channel)
            .cloned()
    }

    fn lock_clients(&self) -> MutexGuard<'_, Vec<Arc<Client>>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands one encoded message of `channel`, captured at `receive_ns` on the rig clock, to every
    /// client subscribed to it. Never waits: a client that is behind loses messages instead.
    pub fn publish(&self, channel: &ChannelHandle, receive_ns: i64, payload: Bytes) {
        self.publish_picture(channel, receive_ns, payload, Picture::Whole)
    }

    /// [`LiveHub::publish`] for a message that is a video picture: a subscription starts at a
    /// keyframe, and a picture a slow client loses takes the rest of its group with it
    /// ([`queue`]).
    pub fn publish_picture(
        &self,
        channel: &ChannelHandle,
        receive_ns: i64,
        payload: Bytes,
        picture: Picture,
    ) {
        let entry = &channel.0;
        if entry.subscribers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let clients = self.lock_clients().clone();
        for client in clients {
            for (lost, n) in client.push(entry, receive_ns.max(0) as u64, &payload, picture, self) {
                if let Some(lost) = self.entry(lost) {
                    count_dropped(&lost, n, client.id);
                }
            }
        }
    }

    /// Counts messages lost before they reached a client's queue (the daemon's encoder was
    /// behind), against the channel's source.
    pub fn note_dropped(&self, channel: &ChannelHandle, messages: u64) {
        count_dropped(&channel.0, messages, 0);
    }

    /// `serverInfo`.
    fn server_info(&self) -> String {
        serde_json::json!({
            "op": "serverInfo",
            "name": self.name,
            "capabilities": ["time"],
            "supportedEncodings": [],
            "metadata": { "server": "rigd", "version": env!("CARGO_PKG_VERSION") },
            "sessionId": self.session,
        })
        .to_string()
    }

    /// `advertise`: every channel, but the on-demand ones only for a client that asked (`full`).
    fn advertise(&self, full: bool) -> String {
        let shown: Vec<Arc<ChannelEntry>> = self
            .read_channels()
            .iter()
            .filter(|e| full || !e.on_demand.load(Ordering::Relaxed))
            .cloned()
            .collect();
        advertise(&shown)
    }
}

/// Counts a loss against the channel's source, and logs the first, then one line per 1000 (a
/// stalled client would otherwise log per frame).
fn count_dropped(entry: &ChannelEntry, messages: u64, client: u64) {
    let before = entry.dropped.fetch_add(messages, Ordering::Relaxed);
    if before == 0 || (before + messages) / 1000 != before / 1000 {
        tracing::warn!(source = %entry.channel.source, topic = %entry.channel.topic, client,
            dropped_total = before + messages,
            "live view: a client reads slower than the rig captures; its messages are dropped");
    }
}

/// `advertise` for these channels.
fn advertise(entries: &[Arc<ChannelEntry>]) -> String {
    {
        let channels: Vec<_> = entries
            .iter()
            .map(|e| &e.channel)
            .map(|c| {
                serde_json::json!({
                    "id": c.id,
                    "topic": c.topic,
                    "encoding": "protobuf",
                    "schemaName": c.schema_name,
                    "schema": c.schema,
                    "schemaEncoding": "protobuf",
                })
            })
            .collect();
        serde_json::json!({ "op": "advertise", "channels": channels }).to_string()
    }
}

/// A number that differs between runs of the daemon (the `sessionId`): a client that reconnects
/// to a restarted rig knows its subscriptions are gone.
fn session_stamp() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// `{"op": "status", ...}`: level 0 info, 1 warning, 2 error.
fn status(level: u8, message: &str) -> String {
    serde_json::json!({ "op": "status", "level": level, "message": message }).to_string()
}

/// One connected client.
struct Client {
    id: u64,
    /// Connected with `?full=1`: the on-demand channels are advertised to it too.
    full: bool,
    state: Mutex<ClientState>,
    /// Something was queued, or the client must go.
    wake: Notify,
}

struct ClientState {
    queue: ClientQueue,
    /// Subscription id -> channel id.
    subscriptions: BTreeMap<u32, u32>,
    /// When each channel's last drop warning was queued.
    warned: HashMap<u32, Instant>,
    /// Drops since that warning, per channel.
    unwarned: HashMap<u32, u64>,
    /// The client left too much unread: disconnect it.
    overflow: bool,
}

impl Client {
    fn lock(&self) -> MutexGuard<'_, ClientState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues the message for each of this client's subscriptions to the channel; returns the
    /// messages this client lost meanwhile (its own queue's drops), as (channel, count).
    fn push(
        &self,
        entry: &ChannelEntry,
        receive_ns: u64,
        payload: &Bytes,
        picture: queue::Picture,
        hub: &LiveHub,
    ) -> Vec<(u32, u64)> {
        let channel = entry.channel.id;
        let mut s = self.lock();
        let subs: Vec<u32> = s
            .subscriptions
            .iter()
            .filter(|(_, c)| **c == channel)
            .map(|(sub, _)| *sub)
            .collect();
        if subs.is_empty() {
            return Vec::new();
        }
        let mut lost = Vec::new();
        for subscription in subs {
            lost.extend(s.queue.push_data(Data {
                class: entry.channel.class,
                channel,
                subscription,
                receive_ns,
                payload: payload.clone(),
                picture,
            }));
        }
        let mut counts: Vec<(u32, u64)> = Vec::new();
        for c in lost {
            *s.unwarned.entry(c).or_default() += 1;
            match counts.iter_mut().find(|(ch, _)| *ch == c) {
                Some((_, n)) => *n += 1,
                None => counts.push((c, 1)),
            }
        }
        let now = Instant::now();
        let due: Vec<(u32, u64)> = s
            .unwarned
            .iter()
            .filter(|(c, _)| {
                s.warned
                    .get(c)
                    .is_none_or(|t| now.duration_since(*t) >= WARN_EVERY)
            })
            .map(|(c, n)| (*c, *n))
            .collect();
        for (c, n) in due {
            s.unwarned.remove(&c);
            s.warned.insert(c, now);
            let topic = hub
                .entry(c)
                .map_or_else(|| c.to_string(), |e| e.channel.topic.clone());
            let text = format!(
                "{topic}: {n} message(s) dropped, this client reads slower than the rig captures \
                 (camera frames go first, then audio, then serial)"
            );
            if s.queue.push_text(status(1, &text)) > MAX_CONTROL {
                s.overflow = true;
            }
        }
        drop(s);
        self.wake.notify_one();
        counts
    }
}

/// Why an upgrade request is refused before the upgrade.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Neither subprotocol offered.
    Subprotocol,
    /// `max_clients` are connected (or the live view is off).
    Full(usize),
    /// This peer holds its share of the slots ([`crate::peers::per_peer_share`]).
    PeerFull(usize),
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Subprotocol => StatusCode::BAD_REQUEST,
            Refusal::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::PeerFull(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refusal::Subprotocol => format!(
                "the live view speaks the Foxglove WebSocket protocol: offer subprotocol \
                 `{SUBPROTOCOL_SDK}` or `{SUBPROTOCOL_WEBSOCKET}` (open this URL in Foxglove or Lichtblick)"
            ),
            Refusal::Full(0) => "the live view is off ([web] max-live-clients = 0)".to_string(),
            Refusal::Full(n) => format!(
                "the live view serves at most {n} client(s) at once ([web] max-live-clients): close another"
            ),
            Refusal::PeerFull(n) => format!(
                "this client holds {n} live-view connection(s) already, the most one client may ([web] max-live-clients / 2): close another"
            ),
        }
    }
}

/// The subprotocol to answer with: the first of ours the client offered (`foxglove.sdk.v1`
/// preferred).
pub fn choose_subprotocol(headers: &HeaderMap) -> Option<&'static str> {
    let offered: Vec<&str> = headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    [SUBPROTOCOL_SDK, SUBPROTOCOL_WEBSOCKET]
        .into_iter()
        .find(|p| offered.contains(p))
}

/// A client's slots: one of the hub's and one of its peer's share, given back when dropped.
pub struct Admission {
    _slot: OwnedSemaphorePermit,
    _peer: crate::peers::PeerSlot,
}

/// Whether a `/foxglove` request's query asks for the full-resolution channels of the cameras
/// with a proxy: `full`, `full=1`, `full=true` or `full=yes` among its parameters. Pure.
pub fn wants_full(query: Option<&str>) -> bool {
    query.unwrap_or("").split('&').any(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        k == "full" && matches!(v, "" | "1" | "true" | "yes")
    })
}

/// A client slot, or why not; checked before the upgrade.
pub fn admit(
    hub: &Arc<LiveHub>,
    peer: Option<std::net::IpAddr>,
    headers: &HeaderMap,
) -> Result<(&'static str, Admission), Refusal> {
    let protocol = choose_subprotocol(headers).ok_or(Refusal::Subprotocol)?;
    if hub.max_clients == 0 {
        return Err(Refusal::Full(0));
    }
    let peer_slot = hub.peers.take(peer).map_err(Refusal::PeerFull)?;
    let permit = hub
        .slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| Refusal::Full(hub.max_clients))?;
    Ok((
        protocol,
        Admission {
            _slot: permit,
            _peer: peer_slot,
        },
    ))
}

/// `/foxglove`: refusals in plain HTTP before the upgrade (400 neither subprotocol, 503 past the
/// cap, 400 not a WebSocket upgrade), else the upgrade. `query`: the request's (`?full=1`).
pub fn handle(
    hub: Arc<LiveHub>,
    shutdown: Option<watch::Receiver<bool>>,
    peer: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    query: Option<&str>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let full = wants_full(query);
    let (protocol, permit) = match admit(&hub, peer, headers) {
        Ok(admitted) => admitted,
        Err(refusal) => {
            return crate::AppError(refusal.status(), refusal.message()).into_response()
        }
    };
    match ws {
        Ok(ws) => upgrade(hub, ws, protocol, permit, full, shutdown),
        Err(e) => crate::AppError(
            StatusCode::BAD_REQUEST,
            format!("not a WebSocket upgrade ({e}): open this URL in Foxglove or Lichtblick"),
        )
        .into_response(),
    }
}

/// A server of the live view alone (`rigd live`): `/foxglove` and `/healthz`, behind `gate`
/// (the peers, names and pages it answers, as the rig's own server).
pub fn router(
    hub: Arc<LiveHub>,
    shutdown: Option<watch::Receiver<bool>>,
    gate: crate::access::Gate,
) -> Router {
    gate.guard(
        Router::new()
            .route(
                "/foxglove",
                get(
                    move |peer: Option<axum::Extension<crate::access::Peer>>,
                          headers: HeaderMap,
                          axum::extract::RawQuery(query): axum::extract::RawQuery,
                          ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>| async move {
                        let peer = peer.map(|p| p.0 .0.ip());
                        handle(hub, shutdown, peer, &headers, query.as_deref(), ws)
                    },
                ),
            )
            .route("/healthz", get(|| async { "ok\n" }))
            .layer(axum::extract::DefaultBodyLimit::max(crate::MAX_BODY_BYTES)),
    )
}

/// Upgrades the connection and serves one client until it leaves or the daemon stops.
fn upgrade(
    hub: Arc<LiveHub>,
    ws: WebSocketUpgrade,
    protocol: &'static str,
    permit: Admission,
    full: bool,
    shutdown: Option<watch::Receiver<bool>>,
) -> Response {
    ws.protocols([protocol])
        .max_message_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| async move {
            serve_client(hub, socket, protocol, full, shutdown).await;
            drop(permit);
        })
}

async fn serve_client(
    hub: Arc<LiveHub>,
    socket: WebSocket,
    protocol: &'static str,
    full: bool,
    mut shutdown: Option<watch::Receiver<bool>>,
) {
    let id = hub.next_client.fetch_add(1, Ordering::Relaxed);
    let client = Arc::new(Client {
        id,
        full,
        state: Mutex::new(ClientState {
            queue: ClientQueue::new(hub.queue_bytes),
            subscriptions: BTreeMap::new(),
            warned: HashMap::new(),
            unwarned: HashMap::new(),
            overflow: false,
        }),
        wake: Notify::new(),
    });
    {
        let mut s = client.lock();
        let _ = s.queue.push_text(hub.server_info());
        let _ = s.queue.push_text(hub.advertise(full));
    }
    hub.lock_clients().push(client.clone());
    tracing::info!(
        client = id,
        protocol,
        full,
        clients = hub.clients(),
        "live view: client connected"
    );
    let (sink, stream) = socket.split();
    let why = tokio::select! {
        why = write_loop(&hub, &client, sink) => why,
        why = read_loop(&hub, &client, stream) => why,
        _ = crate::shutting_down(&mut shutdown) => "the daemon stops",
    };
    hub.lock_clients().retain(|c| !Arc::ptr_eq(c, &client));
    let subs: Vec<u32> = client.lock().subscriptions.values().copied().collect();
    for channel in subs {
        if let Some(e) = hub.entry(channel) {
            e.subscribers.fetch_sub(1, Ordering::Relaxed);
        }
    }
    tracing::info!(client = id, reason = why, "live view: client disconnected");
}

/// Sends what the client has queued, and the rig clock every [`TIME_EVERY`]; at most one write
/// every [`FLUSH_GAP`].
async fn write_loop<S>(hub: &LiveHub, client: &Client, mut sink: S) -> &'static str
where
    S: futures::Sink<Message> + Unpin,
{
    let mut next_time = tokio::time::Instant::now();
    let mut last_time = 0u64;
    // Messages handed to the socket since the last flush: what is queued goes out in one flush
    // (few writes for many small messages), and nothing waits unflushed once the queue is empty.
    let mut unflushed = 0usize;
    let mut last_flush = tokio::time::Instant::now();
    loop {
        // Due before anything else in the queue is sent, so a busy queue cannot starve the clock.
        if tokio::time::Instant::now() >= next_time {
            client.lock().queue.push_time((hub.now)().max(0) as u64);
            next_time = tokio::time::Instant::now() + TIME_EVERY;
        }
        let next = {
            let mut s = client.lock();
            if s.overflow {
                return "too many unread control messages";
            }
            s.queue.pop()
        };
        let message = match next {
            Some(Outgoing::Text(t)) => Message::Text(t.into()),
            Some(Outgoing::Time(ns)) => {
                // Never backwards, whatever the rig clock does.
                last_time = last_time.max(ns);
                Message::Binary(queue::time(last_time).into())
            }
            Some(Outgoing::Data(d)) => Message::Binary(
                queue::message_data(d.subscription, d.receive_ns, &d.payload).into(),
            ),
            None if unflushed > 0 => {
                unflushed = 0;
                last_flush = tokio::time::Instant::now();
                match tokio::time::timeout(STALL_LIMIT, sink.flush()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => return "the connection failed",
                    Err(_) => return "the client took nothing for two minutes",
                }
            }
            None if tokio::time::Instant::now() < last_flush + FLUSH_GAP => {
                // Too soon after the last write: publishes meanwhile only queue (the wake-up's
                // permit is kept), and the timer sends them together.
                tokio::time::sleep_until((last_flush + FLUSH_GAP).min(next_time)).await;
                continue;
            }
            None => {
                tokio::select! {
                    _ = client.wake.notified() => {}
                    _ = tokio::time::sleep_until(next_time) => {}
                }
                continue;
            }
        };
        unflushed += 1;
        // `feed` writes into the socket's buffer and flushes only when it is full.
        match tokio::time::timeout(STALL_LIMIT, sink.feed(message)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return "the connection failed",
            Err(_) => return "the client took nothing for two minutes",
        }
    }
}

/// A message from the client.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
enum ClientMessage {
    Subscribe {
        subscriptions: Vec<Subscription>,
    },
    Unsubscribe {
        #[serde(rename = "subscriptionIds")]
        subscription_ids: Vec<u32>,
    },
}

#[derive(Debug, Deserialize)]
struct Subscription {
    id: u32,
    #[serde(rename = "channelId")]
    channel_id: u32,
}

/// Reads the client's subscribe and unsubscribe requests until it closes.
async fn read_loop(
    hub: &LiveHub,
    client: &Client,
    mut stream: futures::stream::SplitStream<WebSocket>,
) -> &'static str {
    while let Some(message) = stream.next().await {
        let text = match message {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(_)) => return "the client closed",
            Ok(Message::Binary(_)) => {
                client_error(
                    client,
                    "this server takes no client messages (no clientPublish)",
                );
                continue;
            }
            Ok(_) => continue,
            Err(_) => return "the connection failed",
        };
        let op = match serde_json::from_str::<ClientMessage>(text.as_str()) {
            Ok(op) => op,
            Err(_) => {
                let name = serde_json::from_str::<serde_json::Value>(text.as_str())
                    .ok()
                    .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_string))
                    .unwrap_or_default();
                client_error(
                    client,
                    &format!("unsupported or malformed request `{name}`: this server takes subscribe and unsubscribe"),
                );
                continue;
            }
        };
        apply(hub, client, op);
    }
    "the client closed"
}

fn client_error(client: &Client, text: &str) {
    let mut s = client.lock();
    if s.queue.push_text(status(2, text)) > MAX_CONTROL {
        s.overflow = true;
    }
    drop(s);
    client.wake.notify_one();
}

fn apply(hub: &LiveHub, client: &Client, op: ClientMessage) {
    match op {
        ClientMessage::Subscribe { subscriptions } => {
            for sub in subscriptions {
                let Some(entry) = hub.entry(sub.channel_id) else {
                    client_error(client, &format!("no channel {}", sub.channel_id));
                    continue;
                };
                if !client.full && entry.on_demand.load(Ordering::Relaxed) {
                    client_error(
                        client,
                        &format!(
                            "channel {} ({}) is a camera's full resolution, on demand: connect with ?full=1",
                            sub.channel_id, entry.channel.topic
                        ),
                    );
                    continue;
                }
                let mut s = client.lock();
                if s.subscriptions.contains_key(&sub.id) {
                    drop(s);
                    client_error(client, &format!("subscription {} is in use", sub.id));
                    continue;
                }
                if s.subscriptions.len() >= hub.read_channels().len() * 4 {
                    drop(s);
                    client_error(client, "too many subscriptions");
                    continue;
                }
                s.subscriptions.insert(sub.id, sub.channel_id);
                entry.subscribers.fetch_add(1, Ordering::Relaxed);
            }
        }
        ClientMessage::Unsubscribe { subscription_ids } => {
            for id in subscription_ids {
                let mut s = client.lock();
                if let Some(channel) = s.subscriptions.remove(&id) {
                    s.queue.remove_subscription(id);
                    if let Some(e) = hub.entry(channel) {
                        e.subscribers.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> LiveHub {
        let ch = |id, topic: &str, source: &str, class| Channel {
            id,
            topic: topic.into(),
            source: source.into(),
            class,
            schema_name: "foxglove.Log".into(),
            schema: String::new(),
        };
        LiveHub::new(
            "rigd t".into(),
            vec![
                ch(1, "/front", "front", Class::Camera),
                ch(2, "/gps", "gps", Class::Serial),
                ch(3, "/gps/fix", "gps", Class::Serial),
            ],
            2,
            Arc::new(|| 5),
        )
        .with_queue_bytes(100)
    }

    fn client(hub: &LiveHub) -> Arc<Client> {
        client_with(hub, false)
    }

    /// A client connected with `?full=1` (`full`) or without.
    fn client_with(hub: &LiveHub, full: bool) -> Arc<Client> {
        let c = Arc::new(Client {
            id: 9,
            full,
            state: Mutex::new(ClientState {
                queue: ClientQueue::new(hub.queue_bytes),
                subscriptions: BTreeMap::new(),
                warned: HashMap::new(),
                unwarned: HashMap::new(),
                overflow: false,
            }),
            wake: Notify::new(),
        });
        hub.lock_clients().push(c.clone());
        c
    }

    #[test]
    fn subprotocols_are_chosen_from_what_the_client_offers() {
        let mut h = HeaderMap::new();
        assert_eq!(choose_subprotocol(&h), None);
        h.insert(
            "sec-websocket-protocol",
            "foxglove.websocket.v1".parse().unwrap(),
        );
        assert_eq!(choose_subprotocol(&h), Some(SUBPROTOCOL_WEBSOCKET));
        h.insert(
            "sec-websocket-protocol",
            "x, foxglove.sdk.v1, foxglove.websocket.v1".parse().unwrap(),
        );
        assert_eq!(choose_subprotocol(&h), Some(SUBPROTOCOL_SDK));
        h.insert("sec-websocket-protocol", "foxglove.sdk.v2".parse().unwrap());
        assert_eq!(choose_subprotocol(&h), None);
    }

    #[test]
    fn only_subscribed_channels_are_wanted_and_queued() {
        let hub = hub();
        let c = client(&hub);
        assert!(!hub.wanted(1));
        hub.publish(&hub.handle(1).unwrap(), 10, Bytes::from_static(b"x"));
        assert!(c.lock().queue.is_empty());
        apply(
            &hub,
            &c,
            ClientMessage::Subscribe {
                subscriptions: vec![Subscription {
                    id: 7,
                    channel_id: 1,
                }],
            },
        );
        assert!(hub.wanted(1) && !hub.wanted(2));
        hub.publish(&hub.handle(1).unwrap(), 10, Bytes::from_static(b"x"));
        hub.publish(&hub.handle(2).unwrap(), 11, Bytes::from_static(b"y"));
        match c.lock().queue.pop() {
            Some(Outgoing::Data(d)) => assert_eq!(
                (d.subscription, d.receive_ns, &d.payload[..]),
                (7, 10, &b"x"[..])
            ),
            other => panic!("{other:?}"),
        }
        assert!(c.lock().queue.is_empty());
        hub.publish(&hub.handle(1).unwrap(), 12, Bytes::from_static(b"z"));
        apply(
            &hub,
            &c,
            ClientMessage::Unsubscribe {
                subscription_ids: vec![7],
            },
        );
        assert!(!hub.wanted(1));
        assert!(
            c.lock().queue.is_empty(),
            "queued messages of the subscription are forgotten"
        );
    }

    #[test]
    fn a_slow_client_loses_camera_frames_is_warned_once_and_counted() {
        let hub = hub();
        let c = client(&hub);
        apply(
            &hub,
            &c,
            ClientMessage::Subscribe {
                subscriptions: vec![
                    Subscription {
                        id: 1,
                        channel_id: 1,
                    },
                    Subscription {
                        id: 2,
                        channel_id: 2,
                    },
                ],
            },
        );
        for i in 0..10 {
            hub.publish(&hub.handle(1).unwrap(), i, Bytes::from(vec![0u8; 40]));
        }
        hub.publish(&hub.handle(2).unwrap(), 20, Bytes::from(vec![0u8; 40]));
        // 100 bytes hold one 53-byte message; the serial record pushed out the last camera frame.
        assert_eq!(hub.dropped("front"), 10);
        assert_eq!(hub.dropped("gps"), 0);
        let mut texts = Vec::new();
        let mut data = Vec::new();
        while let Some(o) = c.lock().queue.pop() {
            match o {
                Outgoing::Text(t) => texts.push(t),
                Outgoing::Data(d) => data.push(d.channel),
                Outgoing::Time(_) => {}
            }
        }
        assert_eq!(data, [2]);
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert!(
            texts[0].contains("/front") && texts[0].contains("\"level\":1"),
            "{}",
            texts[0]
        );
    }

    #[test]
    fn a_channel_added_later_is_advertised_to_connected_clients() {
        let hub = hub();
        let c = client(&hub);
        let h = hub.add_channel(Channel {
            id: 9,
            topic: "/rear".into(),
            source: "rear".into(),
            class: Class::Camera,
            schema_name: "foxglove.CompressedImage".into(),
            schema: String::new(),
        });
        assert!(!h.wanted() && h.id() == 9);
        match c.lock().queue.pop() {
            Some(Outgoing::Text(t)) => {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                assert_eq!(v["op"], "advertise");
                assert_eq!(v["channels"].as_array().unwrap().len(), 1);
                assert_eq!(v["channels"][0]["topic"], "/rear");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(hub.channels().len(), 4);
    }

    fn subscribe(hub: &LiveHub, c: &Client, id: u32, channel_id: u32) {
        apply(
            hub,
            c,
            ClientMessage::Subscribe {
                subscriptions: vec![Subscription { id, channel_id }],
            },
        );
    }

    fn texts(c: &Client) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        while let Some(o) = c.lock().queue.pop() {
            if let Outgoing::Text(t) = o {
                out.push(serde_json::from_str(&t).unwrap());
            }
        }
        out
    }

    #[test]
    fn an_on_demand_channel_is_only_for_clients_that_asked_for_full_resolution() {
        for (q, full) in [
            (None, false),
            (Some(""), false),
            (Some("full"), true),
            (Some("full=1"), true),
            (Some("a=b&full=true"), true),
            (Some("full=0"), false),
            (Some("fully=1"), false),
        ] {
            assert_eq!(wants_full(q), full, "{q:?}");
        }
        let hub = hub();
        let viewer = client(&hub);
        let wide = client_with(&hub, true);
        subscribe(&hub, &viewer, 1, 1);
        subscribe(&hub, &wide, 1, 1);
        assert_eq!(
            hub.handle(1).unwrap().0.subscribers.load(Ordering::Relaxed),
            2
        );
        assert!(hub.set_on_demand(1) && hub.on_demand(1) && !hub.on_demand(2));
        // The viewer is told the channel is gone and loses its subscription; the full client not.
        let told = texts(&viewer);
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0]["op"], "unadvertise");
        assert_eq!(told[0]["channelIds"], serde_json::json!([1]));
        assert!(texts(&wide).is_empty());
        assert_eq!(
            hub.handle(1).unwrap().0.subscribers.load(Ordering::Relaxed),
            1
        );
        // A new client is advertised it only with `full`; a viewer that asks anyway is refused.
        let ids = |t: String| -> Vec<u64> {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            v["channels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_u64().unwrap())
                .collect()
        };
        assert!(!ids(hub.advertise(false)).contains(&1));
        assert!(ids(hub.advertise(true)).contains(&1));
        subscribe(&hub, &viewer, 2, 1);
        let told = texts(&viewer);
        assert!(
            told[0]["message"]
                .as_str()
                .unwrap()
                .contains("connect with ?full=1"),
            "{told:?}"
        );
        assert!(!hub.set_on_demand(99));
    }

    #[test]
    fn refusals_say_why() {
        let hub = Arc::new(hub());
        let mut h = HeaderMap::new();
        assert_eq!(admit(&hub, None, &h).err(), Some(Refusal::Subprotocol));
        h.insert("sec-websocket-protocol", "foxglove.sdk.v1".parse().unwrap());
        let a = admit(&hub, None, &h).unwrap();
        let b = admit(&hub, None, &h).unwrap();
        let full = admit(&hub, None, &h).err().unwrap();
        assert_eq!(full, Refusal::Full(2));
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(full.message().contains("max-live-clients"));
        drop((a, b));
        assert!(admit(&hub, None, &h).is_ok());
        let info: serde_json::Value = serde_json::from_str(&hub.server_info()).unwrap();
        assert_eq!(info["capabilities"], serde_json::json!(["time"]));
        let adv: serde_json::Value = serde_json::from_str(&hub.advertise(false)).unwrap();
        assert_eq!(adv["channels"][2]["topic"], "/gps/fix");
        assert_eq!(adv["channels"][0]["encoding"], "protobuf");
    }

    /// What the write loop asked of its socket, and when (ms of paused time from the start).
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Wrote {
        /// Message data (opcode 1) of this subscription.
        Data(u32),
        Time,
        Flush,
    }

    struct Recorder {
        log: Arc<Mutex<Vec<(u128, Wrote)>>>,
        t0: tokio::time::Instant,
    }

    impl Recorder {
        fn note(&self, w: Wrote) {
            let at = self.t0.elapsed().as_millis();
            self.log.lock().unwrap().push((at, w));
        }
    }

    impl futures::Sink<Message> for Recorder {
        type Error = std::convert::Infallible;

        fn poll_ready(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn start_send(self: std::pin::Pin<&mut Self>, m: Message) -> Result<(), Self::Error> {
            match m {
                Message::Binary(b) if b[0] == 1 => {
                    self.note(Wrote::Data(u32::from_le_bytes(b[1..5].try_into().unwrap())))
                }
                Message::Binary(b) if b[0] == 2 => self.note(Wrote::Time),
                other => panic!("{other:?}"),
            }
            Ok(())
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            self.note(Wrote::Flush);
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_close(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_after_a_quiet_spell_goes_at_once_and_those_soon_after_a_write_share_the_next(
    ) {
        let hub = Arc::new(hub().with_queue_bytes(1 << 20));
        let c = client(&hub);
        let subscribe = |id, channel_id| {
            apply(
                &hub,
                &c,
                ClientMessage::Subscribe {
                    subscriptions: vec![Subscription { id, channel_id }],
                },
            )
        };
        subscribe(7, 1);
        subscribe(8, 2);
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Recorder {
            log: log.clone(),
            t0: tokio::time::Instant::now(),
        };
        let writer = {
            let (hub, c) = (hub.clone(), c.clone());
            tokio::spawn(async move { write_loop(&hub, &c, sink).await })
        };
        let ms = |n| tokio::time::sleep(Duration::from_millis(n));
        ms(20).await;
        hub.publish(&hub.handle(1).unwrap(), 10, Bytes::from_static(b"a"));
        ms(2).await;
        hub.publish(&hub.handle(2).unwrap(), 11, Bytes::from_static(b"b"));
        ms(3).await;
        hub.publish(&hub.handle(1).unwrap(), 12, Bytes::from_static(b"c"));
        ms(75).await;
        writer.abort();
        use Wrote::*;
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                // The rig clock, first thing.
                (0, Time),
                (0, Flush),
                // Nothing written for 20 ms: no wait.
                (20, Data(7)),
                (20, Flush),
                // 2 and 5 ms after that write: together, FLUSH_GAP after it.
                (30, Data(8)),
                (30, Data(7)),
                (30, Flush),
            ]
        );
    }
}
