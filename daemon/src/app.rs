//! `rigd run`: wires clock, sources, lanes, spool, uplink and web together, and shuts them down in
//! order (capture stops, lanes hand unacknowledged frames to the spool, the spool commits).

use anyhow::Context;
use rigd_drivers::{
    FrameClock, FrameSink, Source, SourceHealth, SourceState, StopFlag, SystemClock,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

use crate::config::{read_token, Config, SpoolMode, EVENTS_SOURCE};
use crate::events::EventMarker;
use crate::pipeline::{self, LaneStats, LaneTask};
use crate::runtime::{Runtime, SourceEntry};
use crate::spool::Spool;
use crate::uplink::{Budget, ProducerConfig, ProducerStats, Token};

/// Frames buffered between a capture thread and its lane.
const CAPTURE_QUEUE: usize = 256;
/// Shutdown deadlines: capture threads to stop, lanes beyond the uplink's receipt grace (their
/// producers are aborted at the grace plus a second), the group commit to finish its last round.
const CAPTURE_STOP: Duration = Duration::from_secs(2);
const LANE_SLACK: Duration = Duration::from_secs(3);
const COMMIT_STOP: Duration = Duration::from_secs(2);
/// The smallest window a budget leaves a source (one camera frame or a batch or two).
const MIN_BUDGET_WINDOW: usize = 256 << 10;

/// Runs a source on its own thread, reopening it with backoff after a device failure.
fn spawn_capture(
    mut source: Box<dyn Source>,
    mut sink: FrameSink,
    stop: StopFlag,
) -> std::thread::JoinHandle<()> {
    let name = format!("capture-{}", source.id());
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let mut backoff = crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(30), sink.next_seq() | 1);
            while !stop.is_raised() {
                sink.set_state(SourceState::Running, "");
                match source.run(&mut sink, &stop) {
                    Ok(()) => break,
                    Err(e) if e.retryable() => {
                        let delay = backoff.next_delay();
                        tracing::warn!(source = %source.id(), error = %e, retry_in_ms = delay.as_millis() as u64, "source failed; reopening");
                        sink.set_state(SourceState::Retrying, &e.to_string());
                        stop.sleep(delay);
                    }
                    Err(e) => {
                        if !stop.is_raised() {
                            tracing::error!(source = %source.id(), error = %e, "source failed for good");
                            sink.set_state(SourceState::Failed, &e.to_string());
                        }
                        break;
                    }
                }
            }
        })
        .expect("spawning a capture thread")
}

/// What every lane is wired to: the spool, the uplink's settings, the pause switch, shutdown.
struct LaneWiring<'a> {
    config: &'a Config,
    token: Token,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// End-to-end encryption for the fleet key, shared by every lane and producer.
    encryption: Option<Arc<crate::seal::Encryptor>>,
    spool: Arc<Spool>,
    paused: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
    /// `pulsar.max-bandwidth`, shared by every producer.
    budget: Option<Arc<Budget>>,
    /// One connection per broker, shared by every producer (charged against `budget`).
    pool: Arc<crate::uplink::Pool>,
    /// Where the rig was, from its serial sources' NMEA (crate::fleet, the coverage digest).
    track: Arc<crate::fleet::track::Track>,
    /// Campaigns' conditions see GPS, audio and markers through their lanes' observers
    /// (crate::campaign).
    feed: Option<crate::campaign::run::Feed>,
}

/// A lane that runs: its task, its counters and its producer's.
struct SpawnedLane {
    task: tokio::task::JoinHandle<()>,
    stats: Arc<LaneStats>,
    uplink: Option<Arc<ProducerStats>>,
}

impl LaneWiring<'_> {
    /// Starts recall's tasks when there is a broker and an on-request source.
    fn recall(
        &self,
        clock: Arc<dyn FrameClock>,
    ) -> anyhow::Result<Option<Arc<crate::recall::Recall>>> {
        let config = self.config;
        let sources: Vec<(String, bool)> = config
            .sources
            .iter()
            .map(|s| {
                let upload = s.head().upload;
                (
                    s.id().to_string(),
                    upload == crate::config::Upload::OnRequest,
                )
            })
            .collect();
        let Some(url) = config.pulsar.url.clone() else {
            return Ok(None);
        };
        if !sources.iter().any(|s| s.1) {
            return Ok(None);
        }
        let producer = {
            let (config, url) = (config.clone(), url.clone());
            let (token, tls, encryption) = (
                self.token.clone(),
                self.tls.clone(),
                self.encryption.clone(),
            );
            let (budget, pool) = (self.budget.clone(), self.pool.clone());
            Box::new(move |source: &str| ProducerConfig {
                token: token.clone(),
                tls: tls.clone(),
                encryption: encryption.clone(),
                budget: budget.clone(),
                pool: pool.clone(),
                ..ProducerConfig::from_config(&config, &url, source)
            })
        };
        let (recall, answers) = crate::recall::Recall::new(
            config.rig.id.clone(),
            sources,
            self.spool.clone(),
            producer,
            Box::new(move || clock.now().ns),
        )
        .context("opening recall's records in the spool")?;
        let link = crate::recall::requests::Link {
            control_topic: config.pulsar.control_topic(&config.rig.id),
        };
        drop(tokio::spawn(crate::recall::requests::run(
            recall.clone(),
            link,
            answers,
            self.shutdown.clone(),
        )));
        drop(tokio::spawn(crate::recall::upload::run(
            recall.clone(),
            self.shutdown.clone(),
        )));
        Ok(Some(recall))
    }

    /// Starts source `sc`'s lane; returns it with the sink its frames go into (numbered on from
    /// what the spool holds) and the source's health.
    fn source(
        &self,
        sc: &crate::config::SourceConfig,
    ) -> anyhow::Result<(FrameSink, SpawnedLane, Arc<SourceHealth>)> {
        let id: Arc<str> = sc.id().into();
        let (tx, rx) = mpsc::channel(CAPTURE_QUEUE);
        let mut observers: Vec<pipeline::Observer> = Vec::new();
        // A serial source's NMEA fixes make the track of the fleet's coverage digest.
        if matches!(sc.modality(), crate::config::Modality::Serial)
            && self.config.pulsar.url.is_some()
        {
            observers.push(crate::fleet::track::observer(self.track.clone()));
        }
        if let Some(f) = self
            .feed
            .as_ref()
            .filter(|_| crate::campaign::run::wanted(sc.modality()))
        {
            observers.push(crate::campaign::run::observer(f.clone()));
        }
        let health = Arc::new(SourceHealth::default());
        let first_seq = self
            .spool
            .next_seq(&id)
            .context("reading the sequence number")?;
        // Issue 46.3: the uplink may make the numbering jump past a broker's ids of a wiped spool.
        let jump = Arc::new(rigd_drivers::SeqJump::default());
        let sink =
            FrameSink::new(id.clone(), first_seq, tx, health.clone()).with_jump(jump.clone());
        let on_request = sc.head().upload == crate::config::Upload::OnRequest;
        let numbering = crate::uplink::plan::Numbering::new(first_seq, jump);
        let lane = self.spawn(
            &id,
            sc.priority(),
            sc.drain(),
            on_request,
            (rx, observers),
            numbering,
        );
        Ok((sink, lane, health))
    }

    /// Starts the lane of source `id` (and its producer, with a broker) reading `frames`, with
    /// uplink priority `priority`.
    fn spawn(
        &self,
        id: &Arc<str>,
        priority: u8,
        drain: crate::config::Drain,
        on_request: bool,
        (frames, observers): (mpsc::Receiver<rigd_drivers::Frame>, Vec<pipeline::Observer>),
        numbering: crate::uplink::plan::Numbering,
    ) -> SpawnedLane {
        let config = self.config;
        // Under a budget a source's window holds about two seconds of the whole budget: what
        // the budget cannot send soon waits in the spool, not in memory.
        let max_in_flight_bytes = match &self.budget {
            Some(b) => (config.pulsar.max_in_flight_bytes.0 as usize)
                .min((b.rate() as usize * 2).max(MIN_BUDGET_WINDOW)),
            None => config.pulsar.max_in_flight_bytes.0 as usize,
        };
        let uplink_stats = Arc::new(ProducerStats::default());
        // An on-request source's frames stay in the spool: its lane has no producer.
        let url = config.pulsar.url.as_ref().filter(|_| !on_request);
        let uplink = url.map(|url| pipeline::Uplink {
            config: ProducerConfig {
                token: self.token.clone(),
                max_in_flight_bytes,
                tls: self.tls.clone(),
                encryption: self.encryption.clone(),
                budget: self.budget.clone(),
                rank: crate::uplink::budget::rank(priority, false),
                stats: Some(uplink_stats.clone()),
                pool: self.pool.clone(),
                numbering: Some(numbering),
                marks: Some(self.spool.path().to_path_buf()),
                ..ProducerConfig::from_config(config, url, id)
            },
            priority,
            shutdown: self.shutdown.clone(),
        });
        let stats = Arc::new(LaneStats::default());
        let stats_of_uplink = uplink.as_ref().map(|_| uplink_stats);
        let lane = LaneTask {
            source: id.clone(),
            mode: config.spool.mode,
            drain,
            frames,
            uplink,
            spool: self.spool.clone(),
            seal: self
                .encryption
                .clone()
                .map(|encryptor| crate::seal::Sealing {
                    encryptor,
                    compression: config.pulsar.compression,
                    piece: config
                        .pulsar
                        .max_bandwidth
                        .map(|b| crate::uplink::budget::bytes_ahead(b.bytes_per_second()))
                        .map_or(crate::seal::PIECE, |ahead| ahead.min(crate::seal::PIECE)),
                }),
            stats: stats.clone(),
            observers,
            paused: self.paused.clone(),
            shutdown: self.shutdown.clone(),
        };
        SpawnedLane {
            task: tokio::spawn(lane.run()),
            stats,
            uplink: stats_of_uplink,
        }
    }
}

/// The rig's connections: over the default route under `budget`, or over each
/// `[[pulsar.link]]`, each with a budget of its own (`uplink::links`).
fn link_pool(config: &Config, budget: Option<Arc<Budget>>) -> Arc<crate::uplink::Pool> {
    let links = &config.pulsar.links;
    if links.is_empty() {
        return crate::uplink::Pool::new(budget);
    }
    crate::uplink::Pool::over(
        links
            .iter()
            .map(|l| {
                crate::uplink::links::Path::new(
                    l.name().to_string(),
                    Some(l.interface.clone()),
                    l.cost,
                    Some(Budget::of(config.pulsar.link_bandwidth(l))),
                )
            })
            .collect(),
    )
}

/// The daemon. Returns when SIGTERM/SIGINT has been handled and everything is flushed. The config
/// has passed [`crate::preflight`]; what can still fail here fails before capture starts.
pub async fn run(mut config: Config) -> anyhow::Result<()> {
    // A camera's proxy is a source of its own from here on (lane, numbering, topic, status,
    // live channel, recall's list), right after its camera, fed by the camera's capture.
    config.sources = crate::config::with_proxies(&config.sources, config.rig.bucket_ms);
    // The web port first: a port taken since the preflight fails the start, not a running rig.
    let bind = config.web_bind();
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("web.bind: cannot listen on {bind}"))?;
    let rig = crate::spool::identity::RigIdentity {
        rig: config.rig.id.clone(),
        bucket_ms: config.rig.bucket_ms,
        topic: config.pulsar.topic.clone(),
    };
    let spool = Spool::open_for(&config.spool, &rig).context("opening the spool")?;
    if spool.unclean_start() {
        let note = match config.spool.mode {
            SpoolMode::OnOutage => {
                "sequence numbers skip ahead past frames that may have been published"
            }
            SpoolMode::Always => {
                "frames after the last commit were lost; nothing published is repeated"
            }
        };
        tracing::warn!(spool = %spool.path().display(), "previous run did not shut down cleanly; {note}");
    }
    // Read once now so a missing token fails the start; the uplink re-reads it at every
    // connection and authentication challenge (a rotated token needs no restart).
    let token = match config.pulsar.token_file.as_deref() {
        Some(path) => {
            read_token(path).map_err(|e| anyhow::anyhow!("pulsar.token-file: {e}"))?;
            Token::File(path.to_path_buf())
        }
        None => Token::None,
    };
    let web_tls = web_tls(&config)?;
    let tls = match &config.pulsar.url {
        Some(url) if url.starts_with("pulsar+ssl://") => Some(
            crate::uplink::tls_config(config.pulsar.tls_ca_file.as_deref(), client_cert(&config))
                .map_err(|e| anyhow::anyhow!("pulsar TLS: {e}"))?,
        ),
        _ => None,
    };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (clock, ptp, ptp_thread): (Arc<dyn FrameClock>, _, _) = match &config.clock.interface {
        Some(_) => {
            let (ptp, thread) = crate::clock::start(&config.clock, shutdown_rx.clone())
                .context("starting the PTP clock task")?;
            (ptp.clock.clone(), Some(ptp), Some(thread))
        }
        None => (Arc::new(SystemClock), None, None),
    };
    let stop = StopFlag::new();
    let uplink_paused = Arc::new(AtomicBool::new(false));
    // With several links each has a budget of its own (the pool's); this one then only sizes
    // chunks and windows.
    let budget = config
        .pulsar
        .max_bandwidth
        .or_else(|| (config.pulsar.links.first()).map(|l| config.pulsar.link_bandwidth(l)))
        .filter(|_| config.pulsar.url.is_some())
        .map(Budget::of);
    let pool = link_pool(&config, budget.clone());
    if let Some(url) = config.pulsar.url.as_deref().filter(|_| pool.multi()) {
        let brokers = crate::service::Endpoint::parse_service(url)
            .map(|hosts| hosts.iter().map(|h| h.addr()).collect())
            .unwrap_or_default();
        drop(tokio::spawn(
            pool.clone().watch(brokers, shutdown_rx.clone()),
        ));
    }
    let encryption = encryption(&config)?;
    let campaign_feed = crate::campaign::run::feed_for(&config);
    let wiring = LaneWiring {
        config: &config,
        token,
        tls,
        encryption,
        spool: spool.clone(),
        paused: uplink_paused.clone(),
        shutdown: shutdown_rx.clone(),
        pool: pool.clone(),
        budget,
        track: Arc::new(crate::fleet::track::Track::load(
            &crate::fleet::track::file(spool.path()),
        )),
        feed: campaign_feed.as_ref().map(|(f, _)| f.clone()),
    };

    // The live view (Foxglove at /foxglove): one channel per source (two for NMEA), fed by a tap
    // on each lane that costs nothing while no client subscribes (crate::live).
    let (live_channels, live_sources) = crate::live::channels(&config);
    let live = {
        let clock = clock.clone();
        Arc::new(rigd_web::live::LiveHub::new(
            format!("rigd {}", config.rig.id),
            live_channels,
            config.web.max_live_clients as usize,
            Arc::new(move || clock.now().ns),
        ))
    };
    let mut live_sources = live_sources.into_iter();

    // Every source: a capture thread feeding a lane (spool and uplink), watched by the watchdog.
    // A proxy has a lane and no thread: its sink goes with its camera's (config::proxy).
    let mut entries = Vec::new();
    let mut lanes = Vec::new();
    let mut captures = Vec::new();
    let mut liveness = crate::notify::Liveness::new();
    let mut capturing: Vec<(&crate::config::SourceConfig, FrameSink)> = Vec::new();
    for sc in &config.sources {
        let (sink, lane, health) = wiring.source(sc)?;
        let id = sink.source().clone();
        if let Some(channels) = live_sources.next() {
            crate::live::connect(&lane.stats.live, live.clone(), channels);
        }
        liveness.lane(id.clone(), lane.stats.clone());
        // A proxy's frames come from its camera's thread, which the camera's entry watches: a
        // proxy that loses its frames (counted) must not stop the watchdog's pings.
        if sc.proxy_of().is_none() {
            liveness.capture(id.clone(), health.clone(), sc, config.rig.bucket_ms);
        }
        entries.push(SourceEntry {
            id: id.clone(),
            kind: sc.kind(),
            modality: sc.modality(),
            health,
            lane: lane.stats,
            uplink: lane.uplink,
            priority: sc.priority(),
            on_request: sc.head().upload == crate::config::Upload::OnRequest,
        });
        lanes.push(lane.task);
        match (sc.proxy_of(), capturing.pop()) {
            (Some(camera), Some((csc, camera_sink))) if csc.id() == camera => {
                capturing.push((csc, camera_sink.with_proxy(sink)));
            }
            (Some(camera), _) => unreachable!("proxy {id} follows its camera {camera}"),
            (None, last) => {
                capturing.extend(last);
                capturing.push((sc, sink));
            }
        }
    }
    for (sc, sink) in capturing {
        let source = sc.open(config.rig.bucket_ms, clock.clone());
        tracing::info!(source = %sc.id(), kind = sc.kind(), first_seq = sink.next_seq(),
            proxy = sc.proxy(config.rig.bucket_ms).is_some(), "source starting");
        captures.push(spawn_capture(source, sink, stop.clone()));
    }
    let mut events_channel = None;
    // Technician event markers: an internal source with a lane of its own, so markers spool
    // during an outage and publish on `{rig}-events` like frames (crate::events).
    let events = {
        let id: Arc<str> = EVENTS_SOURCE.into();
        let (tx, rx) = mpsc::channel(16);
        let observers: Vec<pipeline::Observer> = wiring
            .feed
            .iter()
            .map(|f| crate::campaign::run::observer(f.clone()))
            .collect();
        let first_seq = spool.next_seq(&id).context("reading the sequence number")?;
        let jump = Arc::new(rigd_drivers::SeqJump::default());
        let sink = FrameSink::new(id.clone(), first_seq, tx, Arc::new(SourceHealth::default()))
            .with_jump(jump.clone());
        let numbering = crate::uplink::plan::Numbering::new(first_seq, jump);
        // Markers are rare and small: first.
        let lane = wiring.spawn(
            &id,
            0,
            crate::config::Drain::InOrder,
            false,
            (rx, observers),
            numbering,
        );
        lanes.push(lane.task);
        // The live view's `/events` (last of crate::live::channels): markers through the tap.
        if let Some(channels) = live_sources.next() {
            events_channel = Some(channels.main);
            crate::live::connect(&lane.stats.live, live.clone(), channels);
        }
        let topic = config.pulsar.url.as_ref().map(|_| config.topic_of(&id));
        EventMarker::new(
            sink,
            clock.clone(),
            config.rig.bucket_ms,
            config.rig.id.clone(),
            topic,
            lane.stats,
        )
    };
    // Recall (crate::recall): with a broker and an on-request source, the control topic's
    // reader and the uploader; both detached, they end at shutdown (a request not finished
    // stays pending in the spool for the next start).
    let recall = wiring.recall(clock.clone())?;
    // The fleet's coverage digest of what recall holds (crate::fleet): detached, ends at shutdown.
    if let Some(r) = &recall {
        drop(tokio::spawn(crate::fleet::publish::run(
            r.clone(),
            crate::fleet::publish::Publishing {
                topic: config.pulsar.coverage_topic(),
                every: Duration::from_secs(config.pulsar.coverage_interval_s),
                track: wiring.track.clone(),
                track_file: crate::fleet::track::file(spool.path()),
            },
            shutdown_rx.clone(),
        )));
    }
    // Campaigns (crate::campaign): conditions on what the lanes' observers feed, windows
    // uploaded by recall.
    if let (Some(r), Some(feed)) = (&recall, campaign_feed) {
        let health = entries.iter().map(|e| (e.id.to_string(), e.health.clone()));
        let watch = crate::campaign::run::Watch {
            clock: clock.clone(),
            health: health.collect(),
        };
        crate::campaign::run::start(r, &config, feed, watch, shutdown_rx.clone())?;
    }
    drop(wiring);
    // On-request sources' retention (crate::recall): detached, it ends at shutdown.
    let clock_of_retention = clock.clone();
    let pins = recall.clone();
    drop(crate::recall::spawn_retention(
        spool.clone(),
        crate::recall::Retention::of(&config),
        move || clock_of_retention.now().ns,
        move |source| pins.as_ref().and_then(|r| r.pinned(source)),
        shutdown_rx.clone(),
    ));
    let committer = tokio::spawn(crate::spool::commit_loop(
        spool.clone(),
        Duration::from_millis(config.spool.fsync_ms),
        shutdown_rx.clone(),
    ));

    let runtime = Arc::new(Runtime {
        config: config.clone(),
        started: Instant::now(),
        clock,
        ptp,
        sources: entries,
        spool: spool.clone(),
        uplink_paused,
        events,
        observed: Mutex::default(),
        live,
        client_cert: client_cert(&config).map(|c| crate::uplink::identity::ClientCert::read(c.0)),
        recall,
        pool: config.pulsar.url.is_some().then_some(pool),
    });
    // The alerts on the live view's `/events`, while a client subscribes (crate::live).
    if let Some(channel) = events_channel {
        let clock = runtime.clock.clone();
        drop(crate::live::spawn_alerts(
            runtime.live.clone(),
            channel,
            runtime.clone(),
            Arc::new(move || clock.now().ns),
            shutdown_rx.clone(),
        ));
    }
    let (web, web_token) = serve_web(listener, &runtime, &config, web_tls, shutdown_rx.clone());
    tracing::info!(rig = %config.rig.id, sources = config.sources.len(), web = %bind,
        uplink = config.pulsar.url.as_deref().unwrap_or("none (spooling everything)"),
        spool = %config.spool.path.display(), "rigd running");
    // Every task has started: tell systemd, then keep STATUS= fresh and the watchdog fed.
    let notifier = Arc::new(crate::notify::Notifier::from_env());
    notifier.ready(&crate::notify::status_line(
        &rigd_web::StatusSource::status(&*runtime),
    ));
    let supervisor = tokio::spawn(crate::notify::supervise(
        notifier.clone(),
        runtime.clone(),
        liveness,
    ));

    let reload = crate::lifecycle::Reload {
        web_token_file: config.web.token_file.clone(),
        web_token,
    };
    crate::lifecycle::wait_for_signal(&reload).await;
    supervisor.abort();
    notifier.stopping("stopping: capture stops, unacknowledged frames go to the spool");
    tracing::info!("shutting down: stopping capture, spooling what is unacknowledged");
    shut_down(ShutDown {
        stop,
        captures,
        runtime: &runtime,
        shutdown_tx,
        lanes,
        committer,
        ptp_thread,
        web,
    })
    .await
}

/// The web UI on `listener`, with control actions when `[web] token-file` holds a token (SIGHUP
/// replaces it through the returned handle).
fn serve_web(
    listener: tokio::net::TcpListener,
    runtime: &Arc<Runtime>,
    config: &Config,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: watch::Receiver<bool>,
) -> (tokio::task::JoinHandle<()>, rigd_web::ControlToken) {
    // A missing or empty token file disables control actions; capture goes on regardless.
    let web_token = config.web.token_file.as_deref().and_then(|p| {
        read_token(p)
            .map_err(|e| tracing::warn!(error = %e, "web control actions disabled"))
            .ok()
    });
    let web_token = rigd_web::ControlToken::new(web_token);
    let app = rigd_web::router(
        rigd_web::AppState::new(runtime.clone(), runtime.clone())
            .with_live(runtime.live.clone())
            .with_control_token(web_token.clone())
            .with_allow_list(config.web.allow_list())
            .with_site_policy(config.web.site_policy().unwrap_or_else(|e| {
                // Config::problems refused it before the start; never answer every name.
                tracing::error!(error = %e, "web.server-names / allowed-origins");
                rigd_web::site::SitePolicy::localhost_only()
            }))
            .with_shutdown(shutdown.clone()),
    );
    // Header and idle deadlines, a connection cap, and a shutdown that ends within its grace
    // (live streams included), so web clients cannot hold SIGTERM open (rigd_web::serve).
    let mut web_shutdown = shutdown;
    let web = tokio::spawn(rigd_web::serve_tls(
        listener,
        app,
        rigd_web::ServeLimits::default(),
        tls,
        async move {
            let _ = web_shutdown.wait_for(|down| *down).await;
        },
    ));
    (web, web_token)
}

/// What the shutdown stops, in its order.
struct ShutDown<'a> {
    stop: StopFlag,
    captures: Vec<std::thread::JoinHandle<()>>,
    runtime: &'a Runtime,
    shutdown_tx: watch::Sender<bool>,
    lanes: Vec<tokio::task::JoinHandle<()>>,
    committer: tokio::task::JoinHandle<()>,
    ptp_thread: Option<std::thread::JoinHandle<()>>,
    web: tokio::task::JoinHandle<()>,
}

/// Capture stops first, so the lanes see their channels close after the last frame. Every step
/// has a deadline (docs/UPLINK.md, "Shutdown"): a capture thread stuck in a device read or a lane
/// stuck on the network cannot hold the stop, and the lanes still hand what they hold to the
/// spool, which commits last.
async fn shut_down(s: ShutDown<'_>) -> anyhow::Result<()> {
    s.stop.raise();
    let capture_deadline = tokio::time::Instant::now() + CAPTURE_STOP;
    for c in s.captures {
        let name = c.thread().name().unwrap_or("capture").to_string();
        let join = tokio::task::spawn_blocking(move || c.join());
        if tokio::time::timeout_at(capture_deadline, join)
            .await
            .is_err()
        {
            tracing::warn!(thread = %name, "capture did not stop in time; its lane stops without it");
        }
    }
    s.runtime.events.close(); // ends the events lane like a stopped capture
    let _ = s.shutdown_tx.send(true);
    let lane_deadline = tokio::time::Instant::now() + crate::uplink::SHUTDOWN_GRACE + LANE_SLACK;
    for l in s.lanes {
        if tokio::time::timeout_at(lane_deadline, l).await.is_err() {
            tracing::error!("a lane did not stop in time; frames it held are lost");
        }
    }
    if tokio::time::timeout(COMMIT_STOP, s.committer)
        .await
        .is_err()
    {
        tracing::warn!("the group commit did not stop in time (slow disk?)");
    }
    if let Some(t) = s.ptp_thread {
        let join = tokio::task::spawn_blocking(move || t.join());
        if tokio::time::timeout(CAPTURE_STOP, join).await.is_err() {
            tracing::warn!("the PTP task did not stop in time");
        }
    }
    let _ = s.web.await;
    let spool = s.runtime.spool.clone();
    let closing = spool.clone();
    tokio::task::spawn_blocking(move || closing.close())
        .await?
        .context("closing the spool")?;
    // The run's own tallies, per source, once capture and the lanes have stopped: what a
    // technician (or a test) reads to account for every frame of this run, which the status API
    // can only show while frames still move.
    let mut left = 0;
    for e in &s.runtime.sources {
        let sp = spool.stats(&e.id);
        let spooled = sp.records.load(Ordering::Relaxed);
        left += spooled;
        tracing::info!(
            source = %e.id,
            frames = e.health.frames(),
            published = e.uplink.as_ref().map_or(0, |u| u.published.load(Ordering::Relaxed)),
            spool_dropped = sp.dropped.load(Ordering::Relaxed),
            device_drops = e.health.drops(),
            capture_waits = e.health.capture_waits(),
            refused = e.uplink.as_ref().map_or(0, |u| u.refused.load(Ordering::Relaxed)),
            spooled,
            "source totals"
        );
    }
    tracing::info!(spooled_records = left, "rigd stopped");
    Ok(())
}

/// `[web] tls-cert-file` and `tls-key-file`: the HTTPS configuration, read once at start.
pub fn web_tls(config: &Config) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    match (&config.web.tls_cert_file, &config.web.tls_key_file) {
        (Some(cert), Some(key)) => rigd_web::tls_server_config(cert, key)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("web.tls-cert-file / web.tls-key-file: {e}")),
        _ => Ok(None),
    }
}

/// `[pulsar] tls-cert-file` and `tls-key-file`: the rig's client certificate for mutual TLS.
pub fn client_cert(config: &Config) -> Option<(&std::path::Path, &std::path::Path)> {
    match (&config.pulsar.tls_cert_file, &config.pulsar.tls_key_file) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        _ => None,
    }
}

/// `[pulsar] encryption-key-file` and `encryption-key-name`: the fleet key, read once at start.
pub fn encryption(config: &Config) -> anyhow::Result<Option<Arc<crate::seal::Encryptor>>> {
    let p = &config.pulsar;
    match (&p.encryption_key_file, &p.encryption_key_name) {
        (Some(file), Some(name)) => crate::seal::Encryptor::load(
            file,
            name,
            Duration::from_secs(p.encryption_key_rotation_s),
        )
        .map(|e| Some(Arc::new(e)))
        .map_err(|e| anyhow::anyhow!("pulsar.encryption-key-file: {e}")),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uplink::BatchPolicy;

    #[test]
    fn batching_keys_have_the_java_defaults_and_are_validated() {
        let c = Config::parse("[rig]\nid = \"a\"\n", "t").unwrap();
        let java = BatchPolicy {
            max_messages: 1000,
            max_bytes: 128 << 10,
            delay: Duration::from_millis(1),
        };
        assert_eq!(BatchPolicy::from(&c.pulsar), java);
        assert_eq!(BatchPolicy::default(), java);
        let c =
            Config::parse("[rig]\nid = \"a\"\n[pulsar]\nbatch-max-messages = 1\n", "t").unwrap();
        assert!(!BatchPolicy::from(&c.pulsar).enabled());
        let p = Config::parse(
            "[rig]\nid = \"a\"\n[pulsar]\nbatch-max-messages = 0\nbatch-max-bytes = \"8MiB\"\nbatch-delay-ms = 5000\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(p.lines().count(), 3, "{p}");
        assert!(p.lines().all(|l| l.contains("pulsar.batch-")), "{p}");
    }
}
