//! One Pulsar producer per source, speaking the binary protocol itself: connect, lookup (with
//! redirects), producer creation under a stable name, pipelined SENDs with Pulsar-native chunking,
//! receipts in order, ping/pong, reconnect with backoff, and deduplication-safe sequence ids.
//!
//! Invariants:
//! - Frames are sent in submission order and acknowledged to the caller in that order.
//! - A frame is acknowledged only when the broker persisted it (its last chunk's receipt), or when
//!   the broker reported at producer creation that it already holds that sequence id.
//! - Nothing awaiting a receipt is dropped: on reconnect it is resent (chunks from the first one
//!   without a receipt, same uuid and sequence id); on shutdown it is returned to the caller.

use bytes::{Bytes, BytesMut};
use pulsar::proto::{
    base_command::Type, command_lookup_topic_response::LookupType, BaseCommand, CommandConnect,
    CommandLookupTopic, CommandPartitionedTopicMetadata, CommandPing, CommandPong, CommandProducer,
    CommandSend, MessageMetadata,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify};

use super::batch::{self, BatchPolicy};
use super::codec;
use super::compress;
use super::plan::{self, Backoff};
use crate::wire::Envelope;
use rigd_drivers::Frame;

const PROTOCOL_VERSION: i32 = 21;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const PING_IDLE: Duration = Duration::from_secs(30);
const DEAD_IDLE: Duration = Duration::from_secs(90);
/// Frames handed over but not yet taken by the producer task: enough that a burst of small
/// frames costs the task one wake-up, not one each. They count as in flight (returned at shutdown,
/// lost with the in-flight window on a power cut in `on-outage` mode).
const SUBMIT_QUEUE: usize = 64;
/// Room left in a chunk for the command and metadata (the Java client leaves the metadata size).
const CHUNK_HEADROOM: usize = 16 << 10;

#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// `pulsar://host:port`.
    pub url: String,
    pub topic: String,
    pub producer_name: String,
    pub rig: String,
    pub bucket_ms: u32,
    pub token: Option<String>,
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    pub max_frame_bytes: usize,
    pub send_timeout: Duration,
    /// Client TLS settings for `pulsar+ssl://` (see [`super::tls_config`]).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub compression: crate::config::Compression,
    /// Batching of small frames (`BatchPolicy::default()`: the Java client's defaults).
    pub batch: BatchPolicy,
}

/// What became of a submitted frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker persisted it.
    Persisted,
    /// The broker already held this sequence id (a re-send after a restart).
    AlreadyPersisted,
    /// It can never be published (too large); counted and dropped by the caller.
    Refused(String),
}

/// An acknowledgement to the caller, in submission order.
#[derive(Debug, Clone)]
pub struct Ack {
    pub seq: u64,
    pub outcome: Outcome,
    /// Submission to last receipt.
    pub latency: Duration,
    /// The frame's capture time (rig clock, ns), for capture-to-receipt latency.
    pub capture_ns: i64,
}

/// State shared with status and metrics.
#[derive(Debug, Default)]
pub struct ProducerStats {
    pub connected: AtomicBool,
    pub in_flight: AtomicUsize,
    pub published: AtomicU64,
    pub published_bytes: AtomicU64,
    pub reconnects: AtomicU64,
    pub refused: AtomicU64,
    pub max_message_size: AtomicUsize,
    pub last_error: Mutex<String>,
}

/// The caller's side of a producer.
pub struct Producer {
    tx: mpsc::Sender<Frame>,
    stats: Arc<ProducerStats>,
    room: Arc<Notify>,
    task: tokio::task::JoinHandle<Vec<Frame>>,
}

impl Producer {
    /// Starts the producer task. Acks arrive on `acks` in submission order. The task stops when
    /// `shutdown` turns true, returning every frame without a receipt from [`Producer::close`].
    pub fn spawn(
        cfg: ProducerConfig,
        acks: mpsc::UnboundedSender<Ack>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(SUBMIT_QUEUE);
        let stats = Arc::new(ProducerStats::default());
        let room = Arc::new(Notify::new());
        let task = tokio::spawn(
            Task {
                cfg,
                rx,
                acks,
                stats: stats.clone(),
                room: room.clone(),
                pending: VecDeque::new(),
                pending_bytes: 0,
                pending_frames: 0,
                open_batch: None,
                shutdown,
                broker_last: None,
                next_request: 1,
                run: rigd_drivers::realtime_ns() as u64 / 1_000_000,
            }
            .run(),
        );
        Producer {
            tx,
            stats,
            room,
            task,
        }
    }

    /// Hands a frame over if the producer is connected and its window has room; otherwise gives it
    /// back (the caller spools it).
    pub fn try_submit(&self, frame: Frame) -> Result<(), Frame> {
        if !self.stats.connected.load(Ordering::Acquire) {
            return Err(frame);
        }
        self.tx.try_send(frame).map_err(|e| e.into_inner())
    }

    /// Resolves when the window may have room again or the connection state changed.
    pub async fn room(&self) {
        self.room.notified().await
    }

    pub fn is_connected(&self) -> bool {
        self.stats.connected.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> &Arc<ProducerStats> {
        &self.stats
    }

    /// Waits for the task to end (after shutdown) and returns the frames it could not publish.
    pub async fn close(self) -> Vec<Frame> {
        drop(self.tx);
        self.task.await.unwrap_or_default()
    }
}

struct Pending {
    frame: Frame,
    /// The other frames of a batch message, after `frame` (empty when not a batch).
    batch: Vec<Frame>,
    envelope: Envelope,
    generation: u64,
    /// The payload as it goes on the wire (compressed or the frame's own bytes), its codec and
    /// its size before compression.
    wire: Bytes,
    compression: i32,
    uncompressed: usize,
    /// Chunk ranges of the wire payload (one when not chunked).
    chunks: Vec<std::ops::Range<usize>>,
    receipts: usize,
    submitted: Instant,
    sent: Instant,
}

/// The state of a pending frame carried into its resend after a reconnect.
struct Resume {
    batch: Vec<Frame>,
    generation: u64,
    receipts: usize,
    submitted: Instant,
    envelope: Envelope,
    wire: Bytes,
    compression: i32,
    uncompressed: usize,
    chunks: Vec<std::ops::Range<usize>>,
}

impl Pending {
    /// The sequence id of chunk `i` (every chunk has its own, see [`plan::sequence_id`]).
    fn sequence_id(&self, i: usize) -> u64 {
        plan::sequence_id(self.frame.seq, self.generation, i)
    }

    fn frames(&self) -> usize {
        1 + self.batch.len()
    }

    fn bytes(&self) -> usize {
        self.frame.payload.len() + self.batch.iter().map(|f| f.payload.len()).sum::<usize>()
    }
}

/// Small frames of one key waiting to go out as one batch message.
struct OpenBatch {
    frames: Vec<(Frame, Envelope)>,
    bytes: usize,
    opened: Instant,
}

#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Codec(#[from] codec::CodecError),
    #[error("broker: {0}")]
    Broker(String),
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    #[error("connection closed by the broker")]
    Closed,
    #[error("shutting down")]
    Shutdown,
}

/// A live connection: a writer half and decoded inbound commands from a reader task.
struct Link {
    writer: tokio::io::WriteHalf<Box<dyn Conn>>,
    inbound: mpsc::Receiver<Result<BaseCommand, LinkError>>,
    reader: tokio::task::JoinHandle<()>,
    out: BytesMut,
    max_message_size: usize,
    producer_id: u64,
    last_inbound: Instant,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Link {
    async fn flush(&mut self) -> Result<(), LinkError> {
        if !self.out.is_empty() {
            self.writer.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    async fn command(&mut self, cmd: BaseCommand) -> Result<(), LinkError> {
        codec::encode_command(&cmd, &mut self.out);
        self.flush().await
    }

    /// Waits for the response to request `id`, answering pings meanwhile.
    async fn response(
        &mut self,
        what: &'static str,
        matches: impl Fn(&BaseCommand) -> bool,
    ) -> Result<BaseCommand, LinkError> {
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        loop {
            let cmd = tokio::time::timeout_at(deadline, self.inbound.recv())
                .await
                .map_err(|_| LinkError::Timeout(what))?
                .ok_or(LinkError::Closed)??;
            if cmd.r#type == Type::Ping as i32 {
                self.command(pong()).await?;
                continue;
            }
            if let Some(e) = &cmd.error {
                return Err(LinkError::Broker(format!(
                    "{what}: {} ({})",
                    e.message, e.error
                )));
            }
            if matches(&cmd) {
                return Ok(cmd);
            }
        }
    }
}

fn pong() -> BaseCommand {
    BaseCommand {
        r#type: Type::Pong as i32,
        pong: Some(CommandPong {}),
        ..Default::default()
    }
}

fn ping() -> BaseCommand {
    BaseCommand {
        r#type: Type::Ping as i32,
        ping: Some(CommandPing {}),
        ..Default::default()
    }
}

/// A byte stream to a broker: plain TCP or TLS.
trait Conn: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Conn for T {}

/// Where to connect: from `pulsar://host:port` or `pulsar+ssl://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    host: String,
    port: u16,
    tls: bool,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Self, LinkError> {
        let (rest, tls, default_port) = if let Some(r) = url.strip_prefix("pulsar+ssl://") {
            (r, true, 6651)
        } else if let Some(r) = url.strip_prefix("pulsar://") {
            (r, false, 6650)
        } else {
            return Err(LinkError::Broker(format!(
                "unsupported service URL `{url}` (use pulsar:// or pulsar+ssl://)"
            )));
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse()
                    .map_err(|_| LinkError::Broker(format!("bad port in `{url}`")))?,
            ),
            None => (rest, default_port),
        };
        Ok(Endpoint {
            host: host.trim_matches(['[', ']']).to_string(),
            port,
            tls,
        })
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

struct Task {
    cfg: ProducerConfig,
    rx: mpsc::Receiver<Frame>,
    acks: mpsc::UnboundedSender<Ack>,
    stats: Arc<ProducerStats>,
    room: Arc<Notify>,
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// Frames in `pending` (a batch message holds several).
    pending_frames: usize,
    open_batch: Option<OpenBatch>,
    shutdown: watch::Receiver<bool>,
    /// The broker's last persisted sequence id at producer creation (None: it had none).
    broker_last: Option<u64>,
    next_request: u64,
    /// Distinguishes this process's chunk uuids from an earlier run's (ms since the epoch).
    run: u64,
}

impl Task {
    async fn run(mut self) -> Vec<Frame> {
        let seed = std::process::id() as u64
            ^ self.cfg.producer_name.len() as u64
            ^ rigd_drivers::realtime_ns() as u64;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10), seed);
        let mut last_logged_error = String::new();
        loop {
            if *self.shutdown.borrow() {
                break;
            }
            let result = match self.establish().await {
                Ok(link) => {
                    backoff.reset();
                    if !last_logged_error.is_empty()
                        || self.stats.reconnects.load(Ordering::Relaxed) == 0
                    {
                        tracing::info!(topic = %self.cfg.topic, producer = %self.cfg.producer_name,
                            broker_last_sequence_id = ?self.broker_last, "uplink connected");
                    }
                    last_logged_error.clear();
                    self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    self.stats.connected.store(true, Ordering::Release);
                    self.room.notify_waiters();
                    let r = self.serve(link).await;
                    self.stats.connected.store(false, Ordering::Release);
                    self.room.notify_waiters();
                    r
                }
                Err(e) => Err(e),
            };
            match result {
                Err(LinkError::Shutdown) => break,
                Err(e) => {
                    let msg = e.to_string();
                    if msg != last_logged_error {
                        tracing::warn!(topic = %self.cfg.topic, error = %msg, in_flight = self.pending.len(),
                            "uplink down; frames go to the spool until it is back");
                        last_logged_error = msg.clone();
                    }
                    if let Ok(mut l) = self.stats.last_error.lock() {
                        *l = msg;
                    }
                }
                Ok(()) => {}
            }
            let delay = backoff.next_delay();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.shutdown.changed() => {}
            }
        }
        self.stats.connected.store(false, Ordering::Release);
        self.rx.close();
        let mut left: Vec<Frame> = Vec::new();
        for p in self.pending.drain(..) {
            left.push(p.frame);
            left.extend(p.batch);
        }
        if let Some(b) = self.open_batch.take() {
            left.extend(b.frames.into_iter().map(|(f, _)| f));
        }
        while let Ok(f) = self.rx.try_recv() {
            left.push(f);
        }
        self.stats.in_flight.store(0, Ordering::Relaxed);
        left
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    async fn open(&mut self, ep: &Endpoint, proxy_to: Option<String>) -> Result<Link, LinkError> {
        let addr = ep.addr();
        let tcp = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(&addr))
            .await
            .map_err(|_| LinkError::Timeout("TCP connect"))?
            .map_err(|source| LinkError::Connect {
                addr: addr.clone(),
                source,
            })?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Conn> = if ep.tls {
            let tls = self.cfg.tls.clone().ok_or_else(|| {
                LinkError::Broker("pulsar+ssl:// without a TLS configuration".into())
            })?;
            let name = rustls_pki_types::ServerName::try_from(ep.host.clone())
                .map_err(|e| LinkError::Broker(format!("TLS server name `{}`: {e}", ep.host)))?;
            let s = tokio::time::timeout(
                REQUEST_TIMEOUT,
                tokio_rustls::TlsConnector::from(tls).connect(name, tcp),
            )
            .await
            .map_err(|_| LinkError::Timeout("TLS handshake"))?
            .map_err(|source| LinkError::Connect {
                addr: format!("{addr} (TLS)"),
                source,
            })?;
            Box::new(s)
        } else {
            Box::new(tcp)
        };
        let (mut read, writer) = tokio::io::split(stream);
        let (tx, inbound) = mpsc::channel(1024);
        let reader = tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(64 << 10);
            loop {
                match read.read_buf(&mut buf).await {
                    Ok(0) => {
                        let _ = tx.send(Err(LinkError::Closed)).await;
                        return;
                    }
                    Ok(_) => loop {
                        match codec::decode(&mut buf) {
                            Ok(Some(cmd)) => {
                                if tx.send(Ok(cmd)).await.is_err() {
                                    return;
                                }
                            }
                            Ok(None) => break,
                            Err(e) => {
                                let _ = tx.send(Err(e.into())).await;
                                return;
                            }
                        }
                    },
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                }
            }
        });
        let mut link = Link {
            writer,
            inbound,
            reader,
            out: BytesMut::new(),
            max_message_size: 5 << 20,
            producer_id: 1,
            last_inbound: Instant::now(),
        };
        let connect = CommandConnect {
            client_version: format!("rigd-{}", env!("CARGO_PKG_VERSION")),
            protocol_version: Some(PROTOCOL_VERSION),
            auth_method_name: self.cfg.token.as_ref().map(|_| "token".to_string()),
            auth_data: self.cfg.token.as_ref().map(|t| t.as_bytes().to_vec()),
            proxy_to_broker_url: proxy_to,
            ..Default::default()
        };
        link.command(BaseCommand {
            r#type: Type::Connect as i32,
            connect: Some(connect),
            ..Default::default()
        })
        .await?;
        let connected = link
            .response("CONNECTED", |c| c.connected.is_some())
            .await?;
        if let Some(size) = connected.connected.and_then(|c| c.max_message_size) {
            link.max_message_size = size.max(64 << 10) as usize;
        }
        Ok(link)
    }

    /// Connects, looks the topic up (following redirects), and creates the producer.
    async fn establish(&mut self) -> Result<Link, LinkError> {
        let service = Endpoint::parse(&self.cfg.url)?;
        let mut link = self.open(&service, None).await?;

        let id = self.request_id();
        let topic = self.cfg.topic.clone();
        link.command(BaseCommand {
            r#type: Type::PartitionedMetadata as i32,
            partition_metadata: Some(CommandPartitionedTopicMetadata {
                topic: topic.clone(),
                request_id: id,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
        let meta = link
            .response("PARTITIONED_METADATA", |c| {
                c.partition_metadata_response.is_some()
            })
            .await?;
        if let Some(m) = meta.partition_metadata_response {
            if let Some(msg) = m.message.filter(|_| m.response == Some(1)) {
                return Err(LinkError::Broker(format!(
                    "partitioned metadata of {topic}: {msg}"
                )));
            }
            if m.partitions.unwrap_or(0) > 0 {
                return Err(LinkError::Broker(format!(
                    "{topic} is partitioned ({} partitions); rigd publishes one non-partitioned topic per source",
                    m.partitions.unwrap_or(0)
                )));
            }
        }

        let mut authoritative = false;
        for _hop in 0..8 {
            let id = self.request_id();
            link.command(BaseCommand {
                r#type: Type::Lookup as i32,
                lookup_topic: Some(CommandLookupTopic {
                    topic: topic.clone(),
                    request_id: id,
                    authoritative: Some(authoritative),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?;
            let r = link
                .response("LOOKUP", |c| c.lookup_topic_response.is_some())
                .await?;
            let r = r.lookup_topic_response.unwrap_or_default();
            let broker = if service.tls {
                r.broker_service_url_tls.clone()
            } else {
                r.broker_service_url.clone()
            };
            let broker = match broker.filter(|b| !b.is_empty()) {
                Some(b) => Some(Endpoint::parse(&b)?),
                None => None,
            };
            match r.response.and_then(|v| LookupType::try_from(v).ok()) {
                Some(LookupType::Connect) => {
                    match broker {
                        Some(b) if r.proxy_through_service_url() => {
                            link = self.open(&service, Some(b.addr())).await?;
                        }
                        Some(b) if b != service => link = self.open(&b, None).await?,
                        _ => {}
                    }
                    return self.create_producer(link).await;
                }
                Some(LookupType::Redirect) => {
                    authoritative = r.authoritative.unwrap_or(false);
                    let b = broker.ok_or_else(|| {
                        LinkError::Broker(format!(
                            "lookup of {topic}: redirect without a broker URL"
                        ))
                    })?;
                    link = self.open(&b, None).await?;
                }
                _ => {
                    return Err(LinkError::Broker(format!(
                        "lookup of {topic} failed: {}",
                        r.message.unwrap_or_else(|| "no reason given".into())
                    )))
                }
            }
        }
        Err(LinkError::Broker(format!(
            "lookup of {topic}: too many redirects"
        )))
    }

    async fn create_producer(&mut self, mut link: Link) -> Result<Link, LinkError> {
        let id = self.request_id();
        link.command(BaseCommand {
            r#type: Type::Producer as i32,
            producer: Some(CommandProducer {
                topic: self.cfg.topic.clone(),
                producer_id: link.producer_id,
                request_id: id,
                producer_name: Some(self.cfg.producer_name.clone()),
                user_provided_producer_name: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
        loop {
            let r = link
                .response("PRODUCER_SUCCESS", |c| c.producer_success.is_some())
                .await?;
            let s = r.producer_success.unwrap_or_default();
            if s.producer_ready.unwrap_or(true) {
                self.broker_last = s.last_sequence_id.filter(|v| *v >= 0).map(|v| v as u64);
                break;
            }
        }
        self.stats
            .max_message_size
            .store(link.max_message_size, Ordering::Relaxed);
        Ok(link)
    }

    /// Resends what awaits a receipt, then publishes until the link fails or shutdown.
    async fn serve(&mut self, mut link: Link) -> Result<(), LinkError> {
        // Resend in order: each pending frame from its first chunk without a receipt.
        let mut resend = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        self.pending_frames = 0;
        self.stats.in_flight.store(0, Ordering::Relaxed);
        while let Some(p) = resend.pop_front() {
            let resume = Resume {
                batch: p.batch,
                generation: p.generation,
                receipts: p.receipts,
                submitted: p.submitted,
                envelope: p.envelope,
                wire: p.wire,
                compression: p.compression,
                uncompressed: p.uncompressed,
                chunks: p.chunks,
            };
            if let Err(e) = self.send(&mut link, p.frame, resume, true).await {
                // The link died again: what was not resent yet stays pending, in order.
                for p in resend {
                    self.pending_bytes += p.bytes();
                    self.pending_frames += p.frames();
                    self.pending.push_back(p);
                }
                return Err(e);
            }
        }
        link.flush().await?;
        let mut ping_timer = tokio::time::interval(Duration::from_secs(5));
        loop {
            let window_open = self.window_open();
            let batch_due = self
                .open_batch
                .as_ref()
                .map(|b| tokio::time::Instant::from_std(b.opened + self.cfg.batch.delay));
            tokio::select! {
                biased;
                _ = self.shutdown.changed() => {
                    self.flush_batch(&mut link).await?;
                    link.flush().await?;
                    return self.finish(link).await;
                }
                cmd = link.inbound.recv() => {
                    let cmd = cmd.ok_or(LinkError::Closed)??;
                    link.last_inbound = Instant::now();
                    self.on_command(&mut link, cmd).await?;
                }
                frame = self.rx.recv(), if window_open => {
                    let Some(frame) = frame else { return Err(LinkError::Shutdown) };
                    self.submit(&mut link, frame).await?;
                    // Pipeline: take whatever else is already queued before flushing.
                    while self.window_open() {
                        match self.rx.try_recv() {
                            Ok(f) => self.submit(&mut link, f).await?,
                            Err(_) => break,
                        }
                    }
                    if self.cfg.batch.delay.is_zero() || !self.window_open() {
                        self.flush_batch(&mut link).await?;
                    }
                    link.flush().await?;
                    self.room.notify_waiters();
                }
                _ = tokio::time::sleep_until(batch_due.unwrap_or_else(tokio::time::Instant::now)), if batch_due.is_some() => {
                    self.flush_batch(&mut link).await?;
                    link.flush().await?;
                }
                _ = ping_timer.tick() => {
                    let idle = link.last_inbound.elapsed();
                    if idle > DEAD_IDLE {
                        return Err(LinkError::Timeout("any traffic from the broker"));
                    }
                    if idle > PING_IDLE {
                        link.command(ping()).await?;
                    }
                    if let Some(front) = self.pending.front() {
                        if front.sent.elapsed() > self.cfg.send_timeout {
                            return Err(LinkError::Timeout("a send receipt"));
                        }
                    }
                }
            }
        }
    }

    /// On shutdown: give outstanding receipts a moment, then hand the rest back.
    async fn finish(&mut self, mut link: Link) -> Result<(), LinkError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while !self.pending.is_empty() {
            match tokio::time::timeout_at(deadline, link.inbound.recv()).await {
                Ok(Some(Ok(cmd))) => self.on_command(&mut link, cmd).await?,
                _ => break,
            }
        }
        Err(LinkError::Shutdown)
    }

    async fn on_command(&mut self, link: &mut Link, cmd: BaseCommand) -> Result<(), LinkError> {
        if let Some(r) = cmd.send_receipt {
            let Some(front) = self.pending.front_mut() else {
                return Ok(());
            };
            let id = front.sequence_id(front.receipts);
            if r.sequence_id < id {
                return Ok(()); // a receipt for a chunk resent after a reconnect
            }
            if r.sequence_id > id {
                return Err(LinkError::Broker(format!(
                    "receipt for sequence id {} while {id} is pending",
                    r.sequence_id
                )));
            }
            front.receipts += 1;
            if front.receipts >= front.chunks.len() {
                self.complete_front(Outcome::Persisted);
            }
        } else if let Some(e) = cmd.send_error {
            return Err(LinkError::Broker(format!(
                "send error on sequence id {}: {} ({})",
                e.sequence_id, e.message, e.error
            )));
        } else if cmd.close_producer.is_some() {
            return Err(LinkError::Broker(
                "broker closed the producer (topic moved or unloaded)".into(),
            ));
        } else if cmd.r#type == Type::Ping as i32 {
            link.command(pong()).await?;
        }
        Ok(())
    }

    fn complete_front(&mut self, outcome: Outcome) {
        if let Some(p) = self.pending.pop_front() {
            self.pending_bytes -= p.bytes();
            self.pending_frames -= p.frames();
            self.stats
                .in_flight
                .store(self.pending_frames, Ordering::Relaxed);
            let latency = p.submitted.elapsed();
            for frame in std::iter::once(p.frame).chain(p.batch) {
                if outcome == Outcome::Persisted {
                    self.stats.published.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .published_bytes
                        .fetch_add(frame.payload.len() as u64, Ordering::Relaxed);
                }
                let _ = self.acks.send(Ack {
                    seq: frame.seq,
                    outcome: outcome.clone(),
                    latency,
                    capture_ns: frame.capture_ns,
                });
            }
            self.room.notify_waiters();
        }
    }

    /// Room for one more frame in the in-flight window (the open batch counts).
    fn window_open(&self) -> bool {
        let open = self
            .open_batch
            .as_ref()
            .map_or((0, 0), |b| (b.frames.len(), b.bytes));
        self.pending_frames + open.0 < self.cfg.max_in_flight
            && self.pending_bytes + open.1 < self.cfg.max_in_flight_bytes
    }

    /// Takes a new frame: small frames join the open batch (which goes out first when the key
    /// changes or it is full); others go out on their own, after the open batch.
    async fn submit(&mut self, link: &mut Link, frame: Frame) -> Result<(), LinkError> {
        let envelope = Envelope::of(&self.cfg.rig, self.cfg.bucket_ms, &frame);
        let size = frame.payload.len() + envelope_size(&envelope);
        let known = matches!(
            plan::resend(frame.seq, 0, 1, self.broker_last, false),
            plan::Resend::Done
        );
        let alone = known || !self.cfg.batch.admits(size) || size * 4 > link.max_message_size;
        let full = self.open_batch.as_ref().is_some_and(|b| {
            b.frames.len() >= self.cfg.batch.max_messages
                || b.bytes + size > self.cfg.batch.max_bytes
                || b.frames[0].1.key != envelope.key
        });
        if alone || full {
            if let Err(e) = self.flush_batch(link).await {
                // The link died: the batch is pending (resent on reconnect); this frame waits as
                // the next open batch, alone (a frame too big to batch fills it).
                self.hold(frame, envelope, size);
                return Err(e);
            }
        }
        if alone {
            let resume = self.fresh(link, &frame, envelope);
            return self.send(link, frame, resume, false).await;
        }
        self.hold(frame, envelope, size);
        Ok(())
    }

    /// Adds a frame to the open batch (opening one).
    fn hold(&mut self, frame: Frame, envelope: Envelope, size: usize) {
        let b = self.open_batch.get_or_insert_with(|| OpenBatch {
            frames: Vec::new(),
            bytes: 0,
            opened: Instant::now(),
        });
        b.bytes += size;
        b.frames.push((frame, envelope));
    }

    /// Sends the open batch: one frame goes out as a plain message, several as a batch message.
    async fn flush_batch(&mut self, link: &mut Link) -> Result<(), LinkError> {
        let Some(b) = self.open_batch.take() else {
            return Ok(());
        };
        let mut frames = b.frames.into_iter();
        let Some((first, envelope)) = frames.next() else {
            return Ok(());
        };
        let rest: Vec<(Frame, Envelope)> = frames.collect();
        if rest.is_empty() {
            let resume = self.fresh(link, &first, envelope);
            return self.send(link, first, resume, false).await;
        }
        let mut raw = BytesMut::with_capacity(b.bytes + 64 * (rest.len() + 1));
        batch::push(
            &mut raw,
            &envelope,
            plan::sequence_id(first.seq, 0, 0),
            &first.payload,
        );
        for (f, e) in &rest {
            batch::push(&mut raw, e, plan::sequence_id(f.seq, 0, 0), &f.payload);
        }
        let raw = raw.freeze();
        let (compression, wire) = compress::compress(self.cfg.compression, &raw);
        let resume = Resume {
            batch: rest.into_iter().map(|(f, _)| f).collect(),
            generation: 0,
            receipts: 0,
            submitted: b.opened,
            envelope,
            chunks: plan::chunk_ranges(wire.len(), wire.len()),
            wire,
            compression,
            uncompressed: raw.len(),
        };
        self.send(link, first, resume, false).await
    }

    /// A new frame's first send: its payload compressed and cut into chunks for the broker's
    /// message size.
    fn fresh(&self, link: &Link, frame: &Frame, envelope: Envelope) -> Resume {
        let len = frame.payload.len();
        let max_chunk = link
            .max_message_size
            .saturating_sub(CHUNK_HEADROOM + envelope_size(&envelope))
            .max(1024);
        let (compression, wire) = if len > self.cfg.max_frame_bytes {
            (0, frame.payload.clone()) // refused by `send`: not worth compressing
        } else {
            compress::compress(self.cfg.compression, &frame.payload)
        };
        Resume {
            batch: Vec::new(),
            uncompressed: len,
            generation: 0,
            receipts: 0,
            submitted: Instant::now(),
            chunks: plan::chunk_ranges(wire.len(), max_chunk),
            envelope,
            wire,
            compression,
        }
    }

    /// Writes a frame's SEND frames into the link's buffer: a new frame ([`Task::fresh`]), a batch,
    /// or with `resuming` a pending one resent after a reconnect.
    async fn send(
        &mut self,
        link: &mut Link,
        frame: Frame,
        resume: Resume,
        resuming: bool,
    ) -> Result<(), LinkError> {
        let len = frame.payload.len();
        let ack_now = |task: &mut Self, frame: Frame, outcome: Outcome| {
            if let Outcome::Refused(reason) = &outcome {
                task.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::error!(source = %frame.source, seq = frame.seq, bytes = len, reason = %reason, "frame refused by the uplink");
            }
            let _ = task.acks.send(Ack {
                seq: frame.seq,
                outcome,
                latency: Duration::ZERO,
                capture_ns: frame.capture_ns,
            });
        };
        if len > self.cfg.max_frame_bytes {
            let reason = format!(
                "{len} bytes is above max-frame-bytes ({})",
                self.cfg.max_frame_bytes
            );
            ack_now(self, frame, Outcome::Refused(reason));
            return Ok(());
        }
        let Resume {
            batch,
            mut generation,
            receipts,
            submitted,
            envelope,
            wire,
            compression,
            uncompressed,
            chunks,
        } = resume;
        if chunks.len() > plan::MAX_CHUNKS {
            let reason = format!(
                "{len} bytes would take {} chunks at the broker's max message size ({} bytes); the most is {}",
                chunks.len(),
                link.max_message_size,
                plan::MAX_CHUNKS
            );
            ack_now(self, frame, Outcome::Refused(reason));
            return Ok(());
        }
        // Decide against what the broker reported holding when this producer was created.
        let mut receipts = receipts;
        match plan::resend(
            frame.seq,
            generation,
            chunks.len(),
            self.broker_last,
            resuming,
        ) {
            plan::Resend::Done => {
                ack_now(self, frame, Outcome::AlreadyPersisted);
                for f in batch {
                    ack_now(self, f, Outcome::AlreadyPersisted);
                }
                return Ok(());
            }
            plan::Resend::From {
                generation: g,
                first,
            } => {
                if g > plan::MAX_GENERATION {
                    ack_now(
                        self,
                        frame,
                        Outcome::Refused("resent too many times under new sequence ids".into()),
                    );
                    return Ok(());
                }
                if g != generation {
                    // Cut between its chunks by a restart: out again whole, under a new uuid.
                    tracing::info!(source = %frame.source, seq = frame.seq, generation = g,
                        "a frame cut between its chunks by a restart goes out again whole under a new chunk uuid");
                    generation = g;
                    receipts = 0;
                } else {
                    receipts = receipts.max(first);
                }
            }
        }
        let pending = Pending {
            frame,
            batch,
            envelope,
            generation,
            wire,
            compression,
            uncompressed,
            chunks,
            receipts,
            submitted,
            sent: Instant::now(),
        };
        let n = pending.chunks.len();
        let mut metadata = MessageMetadata {
            producer_name: self.cfg.producer_name.clone(),
            sequence_id: pending.sequence_id(0),
            publish_time: (rigd_drivers::realtime_ns() / 1_000_000).max(0) as u64,
            properties: codec::key_values(&pending.envelope),
            partition_key: Some(pending.envelope.key.clone()),
            event_time: Some(pending.envelope.event_time_ms),
            uncompressed_size: Some(pending.uncompressed as u32),
            compression: (pending.compression != 0).then_some(pending.compression),
            ..Default::default()
        };
        let highest = pending.batch.last().map(|f| plan::sequence_id(f.seq, 0, 0));
        if highest.is_some() {
            // A batch: properties are per message (SingleMessageMetadata), the key is shared.
            metadata.properties.clear();
            metadata.num_messages_in_batch = Some(pending.frames() as i32);
            metadata.highest_sequence_id = highest;
        }
        if n > 1 {
            // A restart sends a frame cut between its chunks again under a new uuid: consumers
            // drop the earlier run's partial chunks after their reassembly timeout.
            metadata.uuid = Some(format!(
                "{}-{:x}-{}",
                self.cfg.producer_name,
                self.run,
                pending.sequence_id(0)
            ));
            metadata.num_chunks_from_msg = Some(n as i32);
            metadata.total_chunk_msg_size = Some(pending.wire.len() as i32);
        }
        // Queued before any write that can fail: a link that dies mid-frame leaves it pending, to
        // be resent on reconnect or handed back at shutdown, never dropped.
        let payload: Bytes = pending.wire.clone();
        let chunks = pending.chunks.clone();
        let (skip, frames, seq, generation) = (
            pending.receipts,
            pending.frames(),
            pending.frame.seq,
            pending.generation,
        );
        self.pending_bytes += pending.bytes();
        self.pending_frames += frames;
        self.pending.push_back(pending);
        self.stats
            .in_flight
            .store(self.pending_frames, Ordering::Relaxed);
        for (i, range) in chunks.iter().enumerate().skip(skip) {
            let seq_id = plan::sequence_id(seq, generation, i);
            metadata.sequence_id = seq_id;
            let cmd = BaseCommand {
                r#type: Type::Send as i32,
                send: Some(CommandSend {
                    producer_id: link.producer_id,
                    sequence_id: seq_id,
                    highest_sequence_id: highest,
                    num_messages: Some(frames as i32),
                    is_chunk: Some(n > 1),
                    ..Default::default()
                }),
                ..Default::default()
            };
            if n > 1 {
                metadata.chunk_id = Some(i as i32);
            }
            codec::encode_send(&cmd, &metadata, &payload[range.clone()], &mut link.out);
            if n > 1 && abort_after_chunk() == Some(i) {
                // Test hook: a crash between the chunks of a frame, after the broker stored some.
                link.flush().await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                tracing::error!(seq, chunk = i, "RIGD_FAILPOINT: aborting between chunks");
                std::process::abort();
            }
            if link.out.len() >= 1 << 20 {
                link.flush().await?;
            }
        }
        Ok(())
    }
}

/// `RIGD_FAILPOINT=abort-after-chunk=N`: abort the process right after sending chunk `N` of the
/// first chunked frame (the end-to-end test of a crash between chunks; unset in production).
fn abort_after_chunk() -> Option<usize> {
    static AT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var("RIGD_FAILPOINT")
            .ok()?
            .strip_prefix("abort-after-chunk=")?
            .parse()
            .ok()
    })
}

/// Bytes the metadata of a message takes besides the payload (properties dominate).
fn envelope_size(e: &Envelope) -> usize {
    e.key.len()
        + e.properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls_map_to_endpoints() {
        let e = Endpoint::parse("pulsar://127.0.0.1:6650").unwrap();
        assert_eq!((e.addr(), e.tls), ("127.0.0.1:6650".to_string(), false));
        let e = Endpoint::parse("pulsar+ssl://broker.example/").unwrap();
        assert_eq!((e.addr(), e.tls), ("broker.example:6651".to_string(), true));
        assert_eq!(Endpoint::parse("pulsar://[::1]:7000").unwrap().host, "::1");
        assert!(Endpoint::parse("http://x").is_err());
        assert!(Endpoint::parse("pulsar://x:notaport").is_err());
    }
}
