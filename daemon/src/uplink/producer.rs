//! One Pulsar producer per source: the caller's handle and the session task that carries out what
//! the [`Window`] decides over one connection at a time.
//!
//! Invariants:
//! - Every frame a caller handed over lives in the window until it is acknowledged, so the session
//!   may be cancelled at any await (a frozen broker, shutdown) without losing one: `close` takes
//!   what is left from the window even when the task has to be aborted.
//! - Every wait has a deadline: connection setup (each request, and the whole setup raced against
//!   shutdown), writes and receipts (by progress, see the window), shutdown (a bounded grace for
//!   outstanding receipts, then the frames go back to the caller).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Notify};

use super::batch::BatchPolicy;
use super::budget::Budget;
use super::connect::{Link, Setup};
use super::error::LinkError;
use super::estimate::Sends;
use super::links;
use super::plan::BrokerLast;
use super::pool::{Connection, Pool};
use super::serve::{Inbound, Serve};
use super::session::{End, LinkEnd, Log, Pace, Retry, Turn};
use super::token::Token;
use super::window::{Ack, Outcome, Window, WindowConfig};
use crate::payload::Held;

/// The whole connection setup (lookups, redirects, producer creation).
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// A link with no progress for this long while frames are outstanding is reported stalled
/// (status: not connected; new frames spool).
const LINK_STALL_AFTER: Duration = Duration::from_secs(5);
pub use super::session::SHUTDOWN_GRACE;
/// How long `close` waits for the task beyond the grace before aborting it.
/// Several links: a producer on a costlier one looks this often whether a cheaper one is back.
const MOVE_LOOK_EVERY: Duration = Duration::from_secs(1);
const CLOSE_SLACK: Duration = Duration::from_secs(1);
/// Reading the topic's last message at the first producer creation.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// `pulsar://host:port`.
    pub url: String,
    pub topic: String,
    pub producer_name: String,
    pub rig: String,
    pub bucket_ms: u32,
    /// The rig's group width in buckets (`Config::group_buckets`): the message key is the group.
    pub group_buckets: u32,
    pub token: Token,
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    pub max_frame_bytes: usize,
    /// No byte accepted by the link and no receipt for this long, while frames are outstanding:
    /// the connection is dead.
    pub send_timeout: Duration,
    /// Client TLS settings for `pulsar+ssl://` (see [`super::tls_config`]).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub compression: crate::config::Compression,
    /// End-to-end encryption for the fleet key (`[pulsar] encryption-key-file`); None: clear.
    pub encryption: Option<Arc<crate::seal::Encryptor>>,
    /// Batching of small frames (`BatchPolicy::default()`: the Java client's defaults).
    pub batch: BatchPolicy,
    /// `pulsar.max-bandwidth`, shared by every producer: each socket write waits for it.
    pub budget: Option<Arc<Budget>>,
    /// This producer's rank in the budget ([`super::budget::rank`]); a rank below
    /// `RECALL_RANK` is a source's live producer (see [`Producer::to_backlog`]).
    pub rank: usize,
    /// Shared by a source's producers (one per epoch); None: its own.
    pub stats: Option<Arc<ProducerStats>>,
    /// No frame was ever sent under this producer name (an epoch this process opened): the
    /// topic is not probed at its creation (its last message is another producer's).
    pub fresh: bool,
    /// `[pulsar] hashing-scheme`: a partitioned topic's key -> partition mapping.
    pub hashing: super::route::HashingScheme,
    /// One partition of a partitioned topic: the link state and window size in the shared stats
    /// are the whole topic's, which [`super::TopicProducer`] reports, not this producer.
    pub partition: bool,
    /// The connections this producer shares (one per broker): the rig's, built with its budget
    /// (`Pool::new(budget)`), so that every producer of the rig writes to one connection.
    pub pool: Arc<Pool>,
    /// Added to every message's properties (a recall's `recall=<id>`).
    pub properties: Vec<(String, String)>,
    /// A live lane's numbering in this run, shared with its capture (None: the offline tools,
    /// recall): a broker holding ids of the name past it makes it jump ([`super::plan::Numbering`]).
    pub numbering: Option<super::plan::Numbering>,
    /// The spool directory that keeps the name's last receipt (issue 46.5, [`super::probe::Receipts`]).
    pub marks: Option<std::path::PathBuf>,
}

impl ProducerConfig {
    /// A producer for `topic` with the uplink's defaults (those of an empty `[pulsar]` table), no
    /// token, TLS, encryption or budget, and a pool of its own: what the offline tools start from.
    pub fn new(url: &str, topic: String, producer_name: String, rig: &str, bucket_ms: u32) -> Self {
        let defaults = crate::config::PulsarConfig::default();
        ProducerConfig {
            url: url.to_string(),
            topic,
            producer_name,
            rig: rig.to_string(),
            bucket_ms,
            group_buckets: 1,
            token: Token::None,
            max_in_flight: defaults.max_in_flight,
            max_in_flight_bytes: defaults.max_in_flight_bytes.0 as usize,
            max_frame_bytes: defaults.max_frame_bytes.0 as usize,
            send_timeout: Duration::from_millis(defaults.send_timeout_ms),
            tls: None,
            compression: defaults.compression,
            encryption: None,
            batch: BatchPolicy::from(&defaults),
            budget: None,
            rank: 0,
            stats: None,
            fresh: false,
            hashing: defaults.hashing_scheme,
            partition: false,
            pool: Pool::new(None),
            properties: Vec::new(),
            numbering: None,
            marks: None,
        }
    }

    /// How this producer connects: its service, topic, name, credentials and the rig's pool.
    pub(super) fn setup(&self) -> Setup {
        let mut setup = Setup::new(
            self.url.clone(),
            self.topic.clone(),
            self.producer_name.clone(),
            self.token.clone(),
            self.tls.clone(),
            self.pool.clone(),
        );
        setup.encrypted = self.encryption.is_some();
        setup
    }

    /// Source `source`'s producer as `config` says (its topic, name and every `[pulsar]` knob);
    /// what the running daemon adds (token, TLS, encryption, budget, rank, shared stats) is set
    /// by the caller.
    pub fn from_config(config: &crate::config::Config, url: &str, source: &str) -> Self {
        let p = &config.pulsar;
        ProducerConfig {
            max_in_flight: p.max_in_flight,
            max_in_flight_bytes: p.max_in_flight_bytes.0 as usize,
            max_frame_bytes: p.max_frame_bytes.0 as usize,
            send_timeout: Duration::from_millis(p.send_timeout_ms),
            compression: p.compression,
            batch: BatchPolicy::from(p),
            hashing: p.hashing_scheme,
            group_buckets: config.group_buckets(),
            ..ProducerConfig::new(
                url,
                config.topic_of(source),
                crate::wire::producer_name(&config.rig.id, source),
                &config.rig.id,
                config.rig.bucket_ms,
            )
        }
    }
}

/// State shared with status and metrics.
#[derive(Debug, Default)]
pub struct ProducerStats {
    /// A producer is up and the link moves (false while stalled).
    pub connected: AtomicBool,
    pub in_flight: AtomicUsize,
    pub published: AtomicU64,
    pub published_bytes: AtomicU64,
    pub reconnects: AtomicU64,
    pub refused: AtomicU64,
    pub max_message_size: AtomicUsize,
    /// Bytes written to the socket (every command and message: what the budget is charged).
    pub wire_bytes: AtomicU64,
    /// The broker terminated the topic: nothing more can be published to it.
    pub terminated: AtomicBool,
    /// How long the source's producers' frames have waited on their connection (`pool`).
    pub starved: Arc<super::pool::Starved>,
    pub last_error: Mutex<String>,
}

impl ProducerStats {
    fn set_error(&self, msg: &str) {
        if let Ok(mut l) = self.last_error.lock() {
            if *l != msg {
                *l = msg.to_string();
            }
        }
    }
}

/// What the handle and the task share.
struct Shared {
    window: Mutex<Window>,
    stats: Arc<ProducerStats>,
    acks: mpsc::UnboundedSender<Ack>,
    /// Handle -> task: frames were submitted, or close was asked for.
    work: Notify,
    /// Task -> caller: room, acks or the connection changed.
    room: Notify,
    closing: AtomicBool,
    source: String,
    last_refused_log: Mutex<Option<Instant>>,
    /// The budget rank, changed when a live producer becomes a backlog's (the connection's writer
    /// reads it for every frame).
    rank: Arc<AtomicUsize>,
    /// This producer's own link state (`stats.connected` follows it while `live`).
    connected: AtomicBool,
    /// Frames in this producer's window.
    held: AtomicUsize,
    /// The producer of a source's live frames: the one whose connection and window the shared
    /// stats report (a source's producers share one [`ProducerStats`]).
    live: AtomicBool,
    /// The broker said the topic is partitioned, into this many (0: it is not, or not known yet).
    partitioned: AtomicU32,
}

impl Shared {
    /// Sets this producer's link state; returns the previous one.
    fn set_connected(&self, up: bool) -> bool {
        let was = self.connected.swap(up, Ordering::AcqRel);
        if self.live.load(Ordering::Relaxed) {
            self.stats.connected.store(up, Ordering::Release);
        }
        was
    }

    fn window(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the window's acks to the caller and updates the counters; one place for both.
    fn settle(&self, w: &mut Window) {
        let mut any = false;
        for ack in w.take_acks() {
            any = true;
            match &ack.outcome {
                Outcome::Persisted => {
                    self.stats.published.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .published_bytes
                        .fetch_add(ack.bytes as u64, Ordering::Relaxed);
                }
                Outcome::Refused(why) => {
                    let n = self.stats.refused.fetch_add(1, Ordering::Relaxed) + 1;
                    let mut last = self
                        .last_refused_log
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::error!(source = %self.source, seq = ack.seq, bytes = ack.bytes,
                            reason = %why, refused_total = n, "frame refused by the uplink");
                        *last = Some(Instant::now());
                    }
                }
                Outcome::AlreadyPersisted => {}
            }
            let _ = self.acks.send(ack);
        }
        self.held.store(w.frames(), Ordering::Relaxed);
        if self.live.load(Ordering::Relaxed) {
            self.stats.in_flight.store(w.frames(), Ordering::Relaxed);
        }
        if any {
            self.room.notify_one();
        }
    }
}

/// The caller's side of a producer.
pub struct Producer {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Producer {
    /// Starts the producer task. Acks arrive on `acks` in submission order. The task stops when
    /// `shutdown` turns true or [`Producer::close`] is called.
    pub fn spawn(
        cfg: ProducerConfig,
        acks: mpsc::UnboundedSender<Ack>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let now = Instant::now();
        let window = Window::new(
            WindowConfig {
                producer_name: cfg.producer_name.clone(),
                rig: cfg.rig.clone(),
                bucket_ms: cfg.bucket_ms,
                group_buckets: cfg.group_buckets,
                max_in_flight: cfg.max_in_flight,
                max_in_flight_bytes: cfg.max_in_flight_bytes,
                max_frame_bytes: cfg.max_frame_bytes,
                compression: cfg.compression,
                encryption: cfg.encryption.clone(),
                batch: cfg.batch,
                progress_timeout: cfg.send_timeout.max(LINK_STALL_AFTER * 2),
                stall_after: LINK_STALL_AFTER,
                run: rigd_drivers::realtime_ns() as u64 / 1_000_000,
                max_chunk_bytes: cfg
                    .budget
                    .as_ref()
                    .map(|b| super::budget::bytes_ahead(b.rate())),
                properties: cfg.properties.clone(),
                numbering: cfg.numbering.clone(),
            },
            now,
        );
        let shared = Arc::new(Shared {
            window: Mutex::new(window),
            stats: cfg.stats.clone().unwrap_or_default(),
            connected: AtomicBool::new(false),
            held: AtomicUsize::new(0),
            live: AtomicBool::new(!cfg.partition && cfg.rank < super::budget::RECALL_RANK),
            acks,
            work: Notify::new(),
            room: Notify::new(),
            closing: AtomicBool::new(false),
            source: cfg
                .topic
                .rsplit('/')
                .next()
                .unwrap_or(&cfg.topic)
                .to_string(),
            last_refused_log: Mutex::new(None),
            rank: Arc::new(AtomicUsize::new(cfg.rank)),
            partitioned: AtomicU32::new(0),
        });
        let setup = cfg.setup();
        let task = tokio::spawn(
            Session {
                shared: shared.clone(),
                setup,
                shutdown,
                created: false,
                serving: None,
                sends: None,
                fresh: cfg.fresh,
                numbering: cfg.numbering.clone(),
                receipts: (cfg.marks.as_deref())
                    .map(|d| super::probe::Receipts::open(d, &cfg.topic, &cfg.producer_name)),
            }
            .run(),
        );
        Producer { shared, task }
    }

    /// Hands a frame over if the producer is connected, its link moves and its window has room;
    /// otherwise gives it back (the caller spools it).
    pub fn try_submit(&self, frame: Held) -> Result<(), Held> {
        let mut w = self.shared.window();
        let r = w.submit(frame, Instant::now());
        self.shared.settle(&mut w);
        drop(w);
        if r.is_ok() {
            self.shared.work.notify_one();
        }
        r
    }

    /// Resolves when the window may have room again, acks arrived or the connection changed.
    pub async fn room(&self) {
        self.shared.room.notified().await
    }

    /// Makes this producer a backlog's (`uplink::budget::rank` with backlog): a later epoch's
    /// producer now takes the live frames and reports the source's link state.
    pub fn to_backlog(&self, rank: usize) {
        self.shared.rank.store(rank, Ordering::Relaxed);
        self.shared.live.store(false, Ordering::Relaxed);
    }

    /// Frames in this producer's window (not yet acked).
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::Relaxed)
    }

    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// The topic turned out partitioned, into this many partitions (0: it is not, or the broker
    /// has not answered yet): this producer publishes nothing, [`super::TopicProducer`] opens one
    /// per partition instead.
    pub fn partitioned(&self) -> u32 {
        self.shared.partitioned.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> &Arc<ProducerStats> {
        &self.shared.stats
    }

    /// Stops the producer: outstanding receipts get [`SHUTDOWN_GRACE`], then the task ends (or is
    /// aborted where it hangs) and every frame without an ack is returned. Acks decided before
    /// are on the ack channel by then. Bounded whatever the network does.
    pub async fn close(mut self) -> Vec<Held> {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.work.notify_one();
        if tokio::time::timeout(SHUTDOWN_GRACE + CLOSE_SLACK, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!(source = %self.shared.source, "uplink did not stop within its grace; aborted");
            self.task.abort();
            let _ = (&mut self.task).await;
        }
        let mut w = self.shared.window();
        self.shared.settle(&mut w);
        let left = w.take_all();
        self.shared.held.store(0, Ordering::Relaxed);
        if self.shared.live.load(Ordering::Relaxed) {
            self.shared.stats.in_flight.store(0, Ordering::Relaxed);
        }
        self.shared.set_connected(false);
        left
    }
}

/// The task: connects, serves a connection until it fails, backs off, again; until stopped.
struct Session {
    shared: Arc<Shared>,
    setup: Setup,
    shutdown: watch::Receiver<bool>,
    /// A producer was created once in this process (the window judges earlier runs' frames
    /// against the first creation only).
    created: bool,
    /// The budget of the link served now (each link has its own, `uplink::links`).
    serving: Option<Arc<Budget>>,
    /// The SENDs of the link served now that await their receipt ([`Sends`]); only under
    /// `max-bandwidth = "auto"`, the one budget that reads their timing.
    sends: Option<Sends>,
    fresh: bool,
    numbering: Option<super::plan::Numbering>,
    receipts: Option<Arc<super::probe::Receipts>>,
}

impl Session {
    fn stopping(&self) -> bool {
        *self.shutdown.borrow() || self.shared.closing.load(Ordering::Acquire)
    }

    async fn run(mut self) {
        let seed = std::process::id() as u64
            ^ self.setup.producer_name.len() as u64
            ^ rigd_drivers::realtime_ns() as u64;
        let mut retry = Retry::new(seed, Instant::now());
        let shared = self.shared.clone();
        let stats = &shared.stats;
        loop {
            if self.stopping() {
                break;
            }
            self.setup.setup_timeout = retry.attempt(super::connect::REQUEST_TIMEOUT);
            let held: super::pool::Held = {
                let (starved, shared) = (shared.stats.starved.clone(), shared.clone());
                Arc::new(super::pool::Reported::new(starved, move || {
                    shared.window().held_by_budget(Instant::now())
                }))
            };
            let establish = self.setup.establish(shared.rank.clone(), held);
            let established = tokio::select! {
                r = tokio::time::timeout(SETUP_TIMEOUT, establish) => {
                    r.unwrap_or_else(|_| Err(LinkError::Timeout("connection setup".into())))
                }
                _ = stopped(&mut self.shutdown, &shared) => break,
            };
            let result = match established {
                Ok((mut link, broker_id)) => {
                    let mark = self.receipts.as_ref().and_then(|r| r.persisted());
                    let how = super::plan::read(
                        self.created,
                        self.fresh,
                        broker_id,
                        mark,
                        self.receipts.is_some(),
                    );
                    let asked = how.judged_as();
                    let read = if how == super::plan::Read::No {
                        None
                    } else {
                        tokio::select! {
                            r = probe(&self.setup, how, self.receipts.as_ref()) => r,
                            _ = stopped(&mut self.shutdown, &shared) => break,
                        }
                    };
                    let broker_last = super::session::broker_last(asked, read, broker_id);
                    self.created = true;
                    if let Some(n) = &self.numbering {
                        let key = format!("{} {}", self.setup.topic, self.setup.producer_name);
                        if let Some(by) = n.judge(&key, broker_last) {
                            tracing::warn!(topic = %self.setup.topic, producer = %self.setup.producer_name,
                                broker_last_sequence_id = ?broker_last.map(|b| b.sequence_id),
                                first_seq = n.first, jump = by,
                                "the broker holds sequence ids of this producer name past every number this spool handed out (a wiped or new spool under a rig id that published before, or another rig under this id): they are not this spool's frames; numbering jumps past them, frames captured since the start go out above them");
                        }
                    }
                    if retry.connected() || stats.reconnects.load(Ordering::Relaxed) == 0 {
                        tracing::info!(topic = %self.setup.topic, producer = %self.setup.producer_name,
                            broker_last_sequence_id = ?broker_last, "uplink connected");
                    }
                    stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    stats
                        .max_message_size
                        .store(link.max_message_size, Ordering::Relaxed);
                    stats.terminated.store(false, Ordering::Relaxed);
                    let whole_again = shared.window().connected(
                        link.producer_id,
                        link.max_message_size,
                        broker_last,
                        Instant::now(),
                    );
                    if !whole_again.is_empty() {
                        tracing::info!(topic = %self.setup.topic, seqs = ?whole_again,
                            "chunks were in flight as the last connection went: these frames go out again whole, under a new uuid");
                    }
                    shared.set_connected(true);
                    shared.room.notify_one();
                    let r = self.serve(&mut link).await;
                    shared.window().disconnected();
                    shared.set_connected(false);
                    shared.room.notify_one();
                    if let Err(e) = &r {
                        let quiet = link.conn.last_inbound().elapsed();
                        match super::session::link_end(e, quiet, LINK_STALL_AFTER) {
                            LinkEnd::CloseProducer => link.close().await,
                            LinkEnd::FailConnection => link.conn.fail(e),
                            LinkEnd::Drop => {}
                        }
                    }
                    r
                }
                Err(e) => Err(e),
            };
            let (delay, watch) = match retry.end(&result, Instant::now()) {
                End::Stop => break,
                End::Partitioned { partitions, wait } => {
                    tracing::info!(topic = %self.setup.topic, partitions, "the topic is partitioned: one producer per partition");
                    shared.partitioned.store(partitions, Ordering::Release);
                    shared.room.notify_one();
                    (wait, false)
                }
                End::Failed(failed) => {
                    let msg = result.err().map(|e| e.to_string()).unwrap_or_default();
                    let topic = &self.setup.topic;
                    let terminated = failed.pace == Pace::Terminated;
                    match failed.log {
                        Log::Down if terminated => {
                            tracing::error!(%topic, error = %msg, in_flight = shared.window().frames(),
                                "topic terminated by the broker: nothing more can be published to it; frames stay in the spool");
                        }
                        Log::Down => {
                            tracing::warn!(%topic, error = %msg, in_flight = shared.window().frames(),
                                "uplink down; frames go to the spool until it is back");
                        }
                        Log::StillDown { attempts, down } => {
                            tracing::warn!(%topic, error = %msg, attempts, down_s = down.as_secs(),
                                "uplink still down, the same error at every attempt since the last line");
                        }
                        Log::Quiet => {}
                    }
                    stats.set_error(&msg);
                    if terminated {
                        stats.terminated.store(true, Ordering::Relaxed);
                    }
                    (failed.delay, failed.pace == Pace::Unreachable)
                }
                End::Again(wait) => (wait, false),
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.setup.reachable(), if watch => {
                    tracing::debug!(topic = %self.setup.topic, "the broker takes connections again");
                    retry.alive();
                }
                _ = stopped(&mut self.shutdown, &shared) => break,
            }
        }
        shared.set_connected(false);
    }

    /// Queues what the window gives on the connection and feeds back what the broker says,
    /// until the link fails, or after a stop once nothing is outstanding or the grace is over.
    async fn serve(&mut self, link: &mut Link) -> Result<(), LinkError> {
        let shared = self.shared.clone();
        self.serving = link.conn.budget().cloned();
        let mut serve = Serve::new(self.serving.as_ref().map(|b| b.rate()));
        let mut abort_armed = false;
        let progress = link.channel.progress.clone();
        // Each SEND on this link, timed for the budget's estimator (`max-bandwidth = "auto"`).
        self.sends = (self.serving.as_ref())
            .filter(|b| b.is_auto())
            .map(|_| Sends::default());
        // Several links: whether a cheaper one is back is looked at this often.
        let mut look_at = Instant::now() + MOVE_LOOK_EVERY;
        loop {
            let now = Instant::now();
            if serve.begin(self.stopping(), now) {
                shared.window().close();
            }
            let (_, queued) = link.conn.progress(link.producer_id);
            let paced_chunk = self.serving.as_ref().and_then(|b| b.paced_chunk());
            let judged = {
                let mut w = shared.window();
                w.pace_chunks(paced_chunk);
                w.close_batch_if_due(now);
                let publish_ms = (rigd_drivers::realtime_ns() / 1_000_000).max(0) as u64;
                while serve.may_encode(queued, link.out.len()) && !abort_armed {
                    let before = link.out.len();
                    let encoded = w.encode_next(&mut link.out, now, publish_ms);
                    if let (Some(s), Some(_)) = (&mut self.sends, &encoded) {
                        s.sent(link.out.len() - before);
                    }
                    match encoded {
                        Some(e) if e.chunks > 1 && abort_after_chunk() == Some(e.chunk) => {
                            abort_armed = true;
                        }
                        Some(_) => {}
                        None => break,
                    }
                }
                shared.settle(&mut w);
                serve.judge(w.health(now), w.idle(), w.batch_due(), now)
            };
            link.push()?;
            if let Some(up) = judged.link {
                shared.set_connected(up);
                shared.room.notify_one();
            }
            if judged.stalled {
                let why = format!(
                    "link stalled: no byte accepted and no receipt for {} s",
                    LINK_STALL_AFTER.as_secs()
                );
                tracing::warn!(topic = %self.setup.topic, "{why}; new frames go to the spool");
                shared.stats.set_error(&why);
            }
            match judged.turn {
                Turn::Serve => {}
                Turn::Dead => {
                    return Err(LinkError::Timeout(
                        "progress on the link (no byte accepted, no receipt)".into(),
                    ))
                }
                Turn::Stopped => return Err(LinkError::Shutdown),
            }
            if now >= look_at && !serve.draining() {
                look_at = now + MOVE_LOOK_EVERY;
                if let Some((to, why)) = self.setup.pool.better(link.conn.path()) {
                    let why = match why {
                        links::Move::Cheaper(_) => "a cheaper link is usable again",
                        links::Move::Spread(_) => {
                            "a link of the same cost has more estimate per producer"
                        }
                    };
                    tracing::info!(topic = %self.setup.topic, from = %link.conn.path().name,
                        to = %to.name, "{why}: the producer moves to it");
                    return Err(LinkError::Moved(to.name.clone()));
                }
            }
            if abort_armed && link.conn.progress(link.producer_id).1 == 0 {
                // Test hook: a crash between the chunks of a frame, after the broker stored some.
                tokio::time::sleep(Duration::from_millis(500)).await;
                tracing::error!("test failpoint: aborting between chunks");
                std::process::abort();
            }
            let draining = serve.draining();
            tokio::select! {
                biased;
                r = self.shutdown.changed(), if !draining => {
                    if r.is_err() {
                        // The daemon's side is gone: stop as if told to.
                        shared.closing.store(true, Ordering::Release);
                    }
                }
                frame = link.channel.inbound.recv() => {
                    let Some(frame) = frame else {
                        return Err(link.conn.failure().unwrap_or(LinkError::Closed));
                    };
                    self.on_command(&frame.cmd, &link.conn)?;
                }
                // Bytes of this producer went out, or of another while this one's wait (the
                // connection moves; the writer serves the best rank first).
                _ = progress.notified() => {
                    let (written, queued) = link.conn.progress(link.producer_id);
                    let (new, now) = (serve.wrote(written), Instant::now());
                    if let Some(s) = &mut self.sends {
                        s.wrote(written, now);
                    }
                    shared.stats.wire_bytes.fetch_add(new, Ordering::Relaxed);
                    shared.window().progressed(new as usize, queued == 0, now);
                    if let Some(e) = link.conn.failure() {
                        return Err(e);
                    }
                }
                _ = shared.work.notified(), if !draining => {}
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(judged.wake)) => {}
            }
        }
    }

    /// Hands a command from the broker to the window (see [`super::serve::inbound`]).
    fn on_command(
        &mut self,
        cmd: &pulsar::proto::BaseCommand,
        conn: &Connection,
    ) -> Result<(), LinkError> {
        let now = Instant::now();
        if let (Some(m), Some(r)) = (&self.receipts, &cmd.send_receipt) {
            m.receipt(r);
        }
        if cmd.send_receipt.is_some() || cmd.send_error.is_some() {
            let answered = self.sends.as_mut().and_then(Sends::answered);
            if let (Some(b), Some((bytes, written))) = (&self.serving, answered) {
                b.receipt(bytes, written, now, || conn.queued());
            }
        }
        match super::serve::inbound(cmd) {
            Inbound::Receipt(sequence_id) => {
                let mut w = self.shared.window();
                let judged = w.on_receipt(sequence_id, now).map_err(LinkError::Broker);
                self.shared.settle(&mut w);
                judged
            }
            Inbound::SendError {
                sequence_id,
                code,
                message,
            } => {
                let mut w = self.shared.window();
                let action = w.on_send_error(sequence_id, code, &message, now);
                self.shared.settle(&mut w);
                super::serve::after_send_error(action)
            }
            Inbound::Closed => Err(super::serve::closed_by_broker()),
            Inbound::Other => Ok(()),
        }
    }
}

/// Asks the topic what it holds (see [`super::probe`], [`super::plan::Probe`]): the broker keeps
/// no deduplication state for the producer (forgotten after a long absence, or dedup off), or
/// named an id without its frame's chunk count. Bounded; on failure the broker's answer stands
/// (frames of an earlier run may then arrive twice, never lost).
async fn probe(
    setup: &Setup,
    asked: super::plan::Read,
    receipts: Option<&Arc<super::probe::Receipts>>,
) -> Option<BrokerLast> {
    // A setup of its own (its host choice), on the rig's connection to the topic's broker.
    let mut own = setup.sibling();
    let settle = asked.settles();
    let r = tokio::time::timeout(
        PROBE_TIMEOUT,
        super::probe::last_entry(&mut own, asked, receipts),
    )
    .await
    .unwrap_or_else(|_| Err(LinkError::Timeout("the probe".into())));
    match r {
        Ok(Some(last)) if !settle => {
            tracing::debug!(topic = %setup.topic, last_sequence_id = last.sequence_id, chunks = ?last.chunks,
                "the broker's last entry for this producer");
            Some(last)
        }
        Ok(Some(last)) => {
            tracing::info!(topic = %setup.topic, last_sequence_id = last.sequence_id,
                seq = super::plan::capture_seq(last.sequence_id), chunks = ?last.chunks,
                "the broker has no deduplication state for this producer; the topic's last message decides what of an earlier run is already stored");
            Some(last)
        }
        Ok(None) => None,
        Err(e) if !settle => {
            tracing::warn!(topic = %setup.topic, error = %e,
                "cannot read the topic's last message; a frame cut into chunks before the restart is judged by this run's cut");
            None
        }
        Err(e) => {
            tracing::warn!(topic = %setup.topic, error = %e,
                "cannot read the topic's last message; frames of an earlier run may arrive twice");
            None
        }
    }
}

/// Resolves once the daemon shuts down or the handle asked to close.
async fn stopped(shutdown: &mut watch::Receiver<bool>, shared: &Shared) {
    loop {
        if *shutdown.borrow_and_update() || shared.closing.load(Ordering::Acquire) {
            return;
        }
        tokio::select! {
            r = shutdown.changed() => if r.is_err() { return },
            _ = shared.work.notified() => {}
        }
    }
}

/// The crash between the chunks of a frame that the end-to-end test of a crash there needs:
/// abort the process right after sending chunk `N` of the first chunked frame. Armed only by
/// [`crash_between_chunks`], which the `rigd` binary never calls (the test's own binary,
/// `daemon/examples/rigd_failpoint.rs`, does): no environment or config can crash a rig.
static CRASH_AFTER_CHUNK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Arms the crash of [`CRASH_AFTER_CHUNK`] for this process (tests only).
pub fn crash_between_chunks(after_chunk: usize) {
    let _ = CRASH_AFTER_CHUNK.set(after_chunk);
}

fn abort_after_chunk() -> Option<usize> {
    CRASH_AFTER_CHUNK.get().copied()
}
