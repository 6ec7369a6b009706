//! `rigd live`: the live view relayed from a rig's Pulsar topics instead of served by the rig, so that a
//! rig behind NAT is watched with no inbound port. The same protocol and channels as the rig's
//! `/foxglove` (`rigd_web::live`), fed by a non-durable subscription from the latest message.
//!
//! A source's channels are advertised when its first message arrives (its modality is in the
//! message properties), so clients connected earlier are told of them then. Time messages carry
//! the newest capture time received, advanced by the time elapsed here since it arrived.
//!
//! Before a message becomes a frame ([`Opener`], pure): a message of a rig with end-to-end
//! encryption is decrypted with the fleet's private key (`--decrypt-key`, [`crate::seal::Decryptor`]),
//! chunk by chunk as the rig encrypted it; without the key it is skipped and counted. The chunks of
//! a frame larger than the broker's max message size are put back together ([`Reassembly`]); a
//! frame whose chunks did not all arrive (the subscription started mid-frame, or a chunk was lost)
//! is dropped and counted, and at most [`REASSEMBLY_BYTES`] are held for frames being reassembled.

use futures::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::message::proto::MessageMetadata;
use pulsar::{Consumer, Pulsar, TokioExecutor};
use rigd_drivers::{ClockState, Frame, Media};
use rigd_web::live::LiveHub;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

use crate::live::{source_channels, Encoder};
use crate::progress::Interrupt;
use crate::seal::Decryptor;

/// Bytes held at most for chunked frames being reassembled (all of them together): several of the
/// largest frames a rig sends chunked (a 6 MiB camera frame against a 5 MiB broker limit), and a
/// bound on what a stream of orphaned first chunks can cost.
pub const REASSEMBLY_BYTES: usize = 64 << 20;
/// A chunked frame still incomplete this long after its first chunk is dropped (the Java client
/// expires incomplete chunked messages after a minute, too).
pub const REASSEMBLY_EXPIRY_NS: i64 = 60_000_000_000;
/// Incomplete frames remembered so that each is counted once, whatever number of its chunks arrive.
const ORPHANS_REMEMBERED: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("pulsar {url}: {why}")]
    Pulsar { url: String, why: String },
    #[error("topic template {template:?}: {why}")]
    Template { template: String, why: String },
    #[error("--bind {addr}: {why}")]
    Bind { addr: SocketAddr, why: String },
}

impl RelayError {
    /// A usage error (exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, RelayError::Template { .. })
    }
}

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub url: String,
    pub rig: String,
    /// Topic template with `{rig}` and `{source}`.
    pub topic: String,
    /// Sources to serve; empty: every topic of the rig, found as they appear.
    pub sources: Vec<String>,
    /// The token and TLS files towards the broker (a client certificate through
    /// [`crate::tail::bridge`]).
    pub access: crate::tail::Access,
    pub bind: SocketAddr,
    pub max_clients: usize,
    /// Every camera's full resolution advertised to every client (`--full`); without it a
    /// camera whose `{id}-proxy` arrives is on demand (`?full=1`).
    pub full: bool,
    /// The fleet's private key (`--decrypt-key`): encrypted frames are decrypted; without it they
    /// are skipped and counted.
    pub decryptor: Option<Arc<Decryptor>>,
    /// The peers, names and pages the live view answers (`--allow-from`, `--server-name`,
    /// `--allowed-origin`).
    pub gate: rigd_web::access::Gate,
    /// wss:// instead of ws:// (`--web-tls-cert-file`, `--web-tls-key-file`).
    pub web_tls: Option<Arc<rustls::ServerConfig>>,
}

/// Counts at the end.
#[derive(Debug, Clone, Default)]
pub struct RelaySummary {
    pub frames: u64,
    /// Encrypted messages skipped for want of `--decrypt-key`.
    pub encrypted: u64,
    /// Encrypted messages the key did not open (another fleet key, damaged).
    pub undecryptable: u64,
    /// Frames put back together from their chunks.
    pub reassembled: u64,
    /// Chunked frames dropped incomplete (chunks missing, out of order, or past the byte cap).
    pub incomplete: u64,
    pub sources: usize,
}

/// Serves until interrupted.
pub fn run(cfg: &RelayConfig, interrupt: &Interrupt) -> Result<RelaySummary, RelayError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| RelayError::Pulsar {
            url: cfg.url.clone(),
            why: format!("cannot start the async runtime: {e}"),
        })?;
    rt.block_on(serve(cfg, interrupt))
}

/// The newest capture time received, and this host's clock when it arrived.
#[derive(Debug, Default)]
struct Newest {
    capture_ns: AtomicI64,
    at_ns: AtomicI64,
}

impl Newest {
    fn now(&self) -> i64 {
        let c = self.capture_ns.load(Ordering::Relaxed);
        if c == 0 {
            return 0;
        }
        let elapsed = rigd_drivers::realtime_ns() - self.at_ns.load(Ordering::Relaxed);
        c + elapsed.max(0)
    }

    fn saw(&self, capture_ns: i64) {
        if capture_ns > self.capture_ns.load(Ordering::Relaxed) {
            self.capture_ns.store(capture_ns, Ordering::Relaxed);
            self.at_ns
                .store(rigd_drivers::realtime_ns(), Ordering::Relaxed);
        }
    }
}

async fn serve(cfg: &RelayConfig, interrupt: &Interrupt) -> Result<RelaySummary, RelayError> {
    let perr = |why: String| RelayError::Pulsar {
        url: cfg.url.clone(),
        why,
    };
    let listener = tokio::net::TcpListener::bind(cfg.bind)
        .await
        .map_err(|e| RelayError::Bind {
            addr: cfg.bind,
            why: e.to_string(),
        })?;
    let newest = Arc::new(Newest::default());
    let clock = newest.clone();
    let hub = Arc::new(LiveHub::new(
        format!("rigd live {}", cfg.rig),
        Vec::new(),
        cfg.max_clients,
        Arc::new(move || clock.now()),
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut web_stop = stop_rx.clone();
    let web = tokio::spawn(rigd_web::serve_tls(
        listener,
        rigd_web::live::router(hub.clone(), Some(stop_rx), cfg.gate.clone()),
        rigd_web::ServeLimits::default(),
        cfg.web_tls.clone(),
        async move {
            let _ = web_stop.wait_for(|s| *s).await;
        },
    ));
    tracing::info!(bind = %cfg.bind, rig = %cfg.rig, "rigd live: serving the live view at /foxglove");

    // A client certificate goes through the bridge (kept for as long as the relay serves);
    // without one, the crate's own connection and its reconnects, as the relay always had.
    let (builder, _bridge) = if cfg.access.tls_client.is_some() {
        crate::tail::connect(&cfg.url, &cfg.access)
            .await
            .map_err(perr)?
    } else {
        let b = crate::tail::client(
            &cfg.url,
            cfg.access.token.clone(),
            cfg.access.tls_ca.as_deref(),
        )
        .map_err(|e| perr(format!("--tls-ca {e}")))?;
        (b, None)
    };
    let result = async {
        let pulsar: Pulsar<TokioExecutor> = tokio::select! {
            r = builder.build() => r.map_err(|e| perr(format!("cannot connect: {e}")))?,
            _ = interrupt.wait() => return Ok(RelaySummary::default()),
        };
        let options = ConsumerOptions::default()
            .durable(false)
            .with_initial_position(InitialPosition::Latest);
        let builder = pulsar
            .consumer()
            .with_subscription(format!(
                "rigd-live-{}-{:x}",
                std::process::id(),
                rigd_drivers::realtime_ns() as u64 & 0xffff_ffff
            ))
            .with_subscription_type(SubType::Exclusive)
            .with_consumer_name(format!("rigd-live-{}", cfg.rig))
            .with_options(options);
        let builder = crate::tail::rig_topics(builder, &cfg.topic, &cfg.rig, &cfg.sources)
            .map_err(|why| RelayError::Template {
                template: cfg.topic.clone(),
                why,
            })?;
        let mut consumer: Consumer<Vec<u8>, TokioExecutor> = tokio::select! {
            r = builder.build() => r.map_err(|e| perr(format!("cannot subscribe: {e}")))?,
            _ = interrupt.wait() => return Ok(RelaySummary::default()),
        };
        let mut encoders: HashMap<String, Encoder> = HashMap::new();
        // The video sources' main channels: a camera beside its `{id}-proxy` is on demand.
        let mut videos: HashMap<String, u32> = HashMap::new();
        let mut summary = RelaySummary::default();
        let mut opener = Opener::new(cfg.decryptor.clone(), REASSEMBLY_BYTES);
        loop {
            let msg = tokio::select! {
                m = consumer.next() => m,
                _ = interrupt.wait() => break,
            };
            let mut msg = match msg {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "rigd live: consumer error");
                    continue;
                }
                None => break,
            };
            if let Err(e) = consumer.ack(&msg).await {
                tracing::debug!(error = %e, "rigd live: ack failed");
            }
            let payload = std::mem::take(&mut msg.payload.data);
            let opened = opener.open(&msg.topic, msg.metadata(), payload, rigd_drivers::realtime_ns());
            let payload = match opened {
                Opened::Whole(p) => p,
                Opened::Pending => continue,
                Opened::Skipped(why) => {
                    note_skipped(why, &opener);
                    continue;
                }
            };
            let props = msg
                .metadata()
                .properties
                .iter()
                .map(|kv| (kv.key.as_str(), kv.value.as_str()));
            // On a topic per modality the other sources' frames come too.
            let Some(frame) = frame_of(&cfg.rig, props, payload).filter(|f| {
                cfg.sources.is_empty() || cfg.sources.iter().any(|s| **s == *f.source)
            }) else {
                continue;
            };
            summary.frames += 1;
            newest.saw(frame.capture_ns);
            let source = frame.source.to_string();
            if !encoders.contains_key(&source) {
                let first = hub.channels().iter().map(|c| c.id).max().unwrap_or(0) + 1;
                // Text serial records may be NMEA (a fix channel); the events topic's markers are not.
                let nmea = matches!(frame.media, Media::Serial { text: true })
                    && source != crate::config::EVENTS_SOURCE;
                let video = matches!(
                    frame.media,
                    Media::Camera {
                        codec: rigd_drivers::Codec::H264,
                        ..
                    }
                );
                let (channels, ids) =
                    source_channels(&source, frame.modality(), nmea, video, first);
                for c in channels {
                    hub.add_channel(c);
                }
                if video {
                    videos.insert(source.clone(), ids.main);
                    if let Some(held) = held_by_proxy(&source, &videos).filter(|_| !cfg.full) {
                        hub.set_on_demand(held);
                    }
                }
                tracing::info!(source = %source, modality = frame.modality().as_str(), "rigd live: new source");
                if let Some(e) = Encoder::new(hub.clone(), &ids) {
                    encoders.insert(source.clone(), e);
                }
                summary.sources = encoders.len();
            }
            if let Some(e) = encoders.get_mut(&source) {
                e.encode(&frame);
            }
        }
        let _ = consumer.close().await;
        opener.tally(&mut summary);
        Ok(summary)
    }
    .await;
    let _ = stop_tx.send(true);
    let _ = web.await;
    result
}

/// The main channel of the camera whose full resolution goes on demand now that video source
/// `source` arrived (`videos`: every video source's main channel, `source` among them): the
/// camera itself when its `{id}-proxy` is there, or the proxy's camera. Pure.
pub fn held_by_proxy(source: &str, videos: &HashMap<String, u32>) -> Option<u32> {
    match source.strip_suffix("-proxy") {
        Some(camera) if videos.contains_key(camera) => videos.get(camera).copied(),
        _ => videos
            .get(&crate::config::proxy_id(source))
            .and(videos.get(source).copied()),
    }
}

/// Why a message did not become a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// End-to-end encrypted, and no `--decrypt-key`.
    Encrypted,
    /// Encrypted, and the key given does not open it (another fleet key, or damaged).
    Undecryptable,
    /// A chunk of a frame that will not be whole.
    Incomplete,
}

/// What became of one message.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// The frame's payload, decrypted and whole.
    Whole(Vec<u8>),
    /// A chunk, held until the frame's last chunk arrives.
    Pending,
    Skipped(Skip),
}

/// Turns messages into frame payloads: decrypts (chunk by chunk, as the rig encrypts), then puts
/// chunks back together. Pure: the time is passed in.
#[derive(Debug)]
pub struct Opener {
    decryptor: Option<Arc<Decryptor>>,
    chunks: Reassembly,
    pub encrypted: u64,
    pub undecryptable: u64,
    pub reassembled: u64,
    /// Why the last undecryptable message did not open.
    pub last_error: String,
}

impl Opener {
    pub fn new(decryptor: Option<Arc<Decryptor>>, reassembly_bytes: usize) -> Self {
        Self {
            decryptor,
            chunks: Reassembly::new(reassembly_bytes),
            encrypted: 0,
            undecryptable: 0,
            reassembled: 0,
            last_error: String::new(),
        }
    }

    /// One message of `topic`, received at `now_ns` (this host's clock).
    pub fn open(
        &mut self,
        topic: &str,
        meta: &MessageMetadata,
        payload: Vec<u8>,
        now_ns: i64,
    ) -> Opened {
        let payload = if meta.encryption_keys.is_empty() {
            payload
        } else {
            let Some(d) = &self.decryptor else {
                self.encrypted += 1;
                return Opened::Skipped(Skip::Encrypted);
            };
            match d.open_message(meta, payload) {
                Ok(p) => p,
                Err(e) => {
                    self.undecryptable += 1;
                    self.last_error = e;
                    return Opened::Skipped(Skip::Undecryptable);
                }
            }
        };
        let count = meta.num_chunks_from_msg.unwrap_or(1);
        if count <= 1 {
            return Opened::Whole(payload);
        }
        let (Some(uuid), Some(id), Some(total)) =
            (&meta.uuid, meta.chunk_id, meta.total_chunk_msg_size)
        else {
            // A chunk that does not say which frame it belongs to cannot be put back.
            self.chunks.incomplete += 1;
            return Opened::Skipped(Skip::Incomplete);
        };
        let chunk = Chunk {
            id: id.max(0) as u32,
            count: count as u32,
            total: total.max(0) as usize,
        };
        let before = self.chunks.incomplete;
        match self
            .chunks
            .push(format!("{topic} {uuid}"), chunk, payload, now_ns)
        {
            Some(whole) => {
                self.reassembled += 1;
                Opened::Whole(whole)
            }
            None if self.chunks.incomplete > before => Opened::Skipped(Skip::Incomplete),
            None => Opened::Pending,
        }
    }

    /// Chunked frames dropped incomplete so far.
    pub fn incomplete(&self) -> u64 {
        self.chunks.incomplete
    }

    /// Bytes held for frames being reassembled now.
    pub fn held(&self) -> usize {
        self.chunks.held
    }

    fn tally(&self, summary: &mut RelaySummary) {
        summary.encrypted = self.encrypted;
        summary.undecryptable = self.undecryptable;
        summary.reassembled = self.reassembled;
        summary.incomplete = self.chunks.incomplete;
    }
}

/// Logs a skipped message: the first of each kind, then one line per 1000.
fn note_skipped(why: Skip, o: &Opener) {
    let every = |n: u64| n == 1 || n % 1000 == 0;
    match why {
        Skip::Encrypted if every(o.encrypted) => tracing::warn!(
            skipped = o.encrypted,
            "rigd live: the rig's frames are end-to-end encrypted and are skipped: pass \
             --decrypt-key FILE (the fleet's RSA private key, PEM) to see them"
        ),
        Skip::Undecryptable if every(o.undecryptable) => tracing::warn!(
            skipped = o.undecryptable,
            error = %o.last_error,
            "rigd live: an encrypted frame does not open with --decrypt-key; skipped"
        ),
        Skip::Incomplete if every(o.incomplete()) => tracing::info!(
            dropped = o.incomplete(),
            held_bytes = o.held(),
            "rigd live: a chunked frame dropped incomplete (chunks sent before the subscription \
             started, lost, or past the reassembly cap)"
        ),
        _ => {}
    }
}

/// Where a chunk sits in its frame (`chunk_id`, `num_chunks_from_msg`, `total_chunk_msg_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub id: u32,
    pub count: u32,
    /// The frame's bytes, all chunks together.
    pub total: usize,
}

/// Chunked frames being put back together, as the official consumers do: a frame's chunks arrive
/// in order on its topic (one producer per topic), chunk 0 first. Bounded: a frame's whole size is
/// reserved with its first chunk, and the bytes reserved never exceed the cap (the oldest frames
/// being reassembled are dropped to make room). A frame is dropped and counted, once, when its
/// first chunk was missed, a chunk is missing or out of order, its first chunk is older than
/// [`REASSEMBLY_EXPIRY_NS`], or it is larger than the cap.
#[derive(Debug)]
pub struct Reassembly {
    cap: usize,
    held: usize,
    /// Oldest first.
    open: VecDeque<Partial>,
    /// Frames recently dropped, so that their later chunks are not counted again.
    orphans: VecDeque<String>,
    pub incomplete: u64,
}

#[derive(Debug)]
struct Partial {
    key: String,
    next: u32,
    chunk: Chunk,
    data: Vec<u8>,
    first_ns: i64,
}

impl Reassembly {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            held: 0,
            open: VecDeque::new(),
            orphans: VecDeque::new(),
            incomplete: 0,
        }
    }

    /// Adds a chunk of frame `key` (topic and uuid); returns the frame once its last chunk is in.
    pub fn push(
        &mut self,
        key: String,
        chunk: Chunk,
        data: Vec<u8>,
        now_ns: i64,
    ) -> Option<Vec<u8>> {
        while self
            .open
            .front()
            .is_some_and(|p| now_ns - p.first_ns > REASSEMBLY_EXPIRY_NS)
        {
            self.drop_at(0);
        }
        let found = self.open.iter().position(|p| p.key == key);
        let at = if chunk.id == 0 {
            if let Some(i) = found {
                // Sent again from the start: what was held of it will not be completed.
                self.drop_at(i);
            }
            if chunk.total > self.cap || data.len() > chunk.total {
                self.orphan(key);
                return None;
            }
            while self.held + chunk.total > self.cap {
                self.drop_at(0);
            }
            self.held += chunk.total;
            let mut buf = data;
            buf.reserve_exact(chunk.total - buf.len());
            self.open.push_back(Partial {
                key,
                next: 1,
                chunk,
                data: buf,
                first_ns: now_ns,
            });
            self.open.len() - 1
        } else {
            let Some(i) = found else {
                self.orphan(key);
                return None;
            };
            let p = &mut self.open[i];
            if p.next != chunk.id
                || p.chunk.count != chunk.count
                || p.data.len() + data.len() > p.chunk.total
            {
                self.drop_at(i);
                return None;
            }
            p.data.extend_from_slice(&data);
            p.next += 1;
            i
        };
        let p = &self.open[at];
        if p.next < p.chunk.count {
            return None;
        }
        let p = self.open.remove(at)?;
        self.held -= p.chunk.total;
        if p.data.len() != p.chunk.total {
            self.orphan(p.key);
            return None;
        }
        Some(p.data)
    }

    fn drop_at(&mut self, i: usize) {
        if let Some(p) = self.open.remove(i) {
            self.held -= p.chunk.total;
            self.orphan(p.key);
        }
    }

    /// Counts a frame that will not be whole, once.
    fn orphan(&mut self, key: String) {
        if self.orphans.contains(&key) {
            return;
        }
        self.incomplete += 1;
        if self.orphans.len() == ORPHANS_REMEMBERED {
            self.orphans.pop_front();
        }
        self.orphans.push_back(key);
    }
}

/// The frame a rigd message carries, from its properties; `None` for another rig's message or one
/// that is not a rigd frame.
pub fn frame_of<'a>(
    rig: &str,
    props: impl IntoIterator<Item = (&'a str, &'a str)>,
    payload: Vec<u8>,
) -> Option<Frame> {
    let m: BTreeMap<&str, &str> = props.into_iter().collect();
    if m.get("rig") != Some(&rig) {
        return None;
    }
    let num = |k: &str| m.get(k).and_then(|v| v.parse::<u64>().ok());
    let media = match *m.get("modality")? {
        "camera" => Media::Camera {
            width: num("width").unwrap_or(0) as u32,
            height: num("height").unwrap_or(0) as u32,
            codec: match m.get("codec").copied() {
                Some("h264") => rigd_drivers::Codec::H264,
                _ => rigd_drivers::Codec::Jpeg,
            },
            keyframe: m.get("keyframe").copied() != Some("false"),
        },
        "audio" => Media::Audio {
            sample_rate: num("sample-rate")? as u32,
            channels: num("channels")? as u16,
            frames: num("frames").unwrap_or(0) as u32,
        },
        "serial" => Media::Serial {
            text: m
                .get("content-type")
                .is_some_and(|t| t.starts_with("text/")),
        },
        "can" => Media::Can {
            frames: num("frames").unwrap_or(0) as u32,
        },
        _ => return None,
    };
    let clock = match m.get("clock").copied() {
        Some("locked") => ClockState::Locked,
        Some("locking") => ClockState::Locking,
        Some("holdover") => ClockState::Holdover,
        _ => ClockState::Unsynced,
    };
    Some(Frame {
        source: Arc::from(*m.get("source")?),
        seq: num("seq")?,
        capture_ns: m.get("capture-ns")?.parse().ok()?,
        clock,
        media,
        payload: payload.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_camera_beside_its_proxy_is_on_demand_whichever_arrives_first() {
        let mut videos = HashMap::new();
        videos.insert("cam".to_string(), 1);
        assert_eq!(held_by_proxy("cam", &videos), None, "no proxy yet");
        videos.insert("cam-proxy".to_string(), 2);
        assert_eq!(held_by_proxy("cam-proxy", &videos), Some(1));
        let mut videos = HashMap::new();
        videos.insert("rear-proxy".to_string(), 5);
        assert_eq!(held_by_proxy("rear-proxy", &videos), None, "no camera yet");
        videos.insert("rear".to_string(), 7);
        assert_eq!(held_by_proxy("rear", &videos), Some(7));
        videos.insert("side".to_string(), 9);
        assert_eq!(held_by_proxy("side", &videos), None);
    }

    #[test]
    fn a_rigd_message_becomes_its_frame_again() {
        let frame = Frame {
            source: "mic".into(),
            seq: 7,
            capture_ns: 1_700_000_000_000_000_123,
            clock: ClockState::Locked,
            media: Media::Audio {
                sample_rate: 48_000,
                channels: 2,
                frames: 1584,
            },
            payload: bytes::Bytes::from_static(b"pcm"),
        };
        let env = crate::wire::Envelope::of("van-07", 33, &frame);
        let props = || env.properties.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let back = frame_of("van-07", props(), b"pcm".to_vec()).unwrap();
        assert_eq!(
            (
                back.source.as_ref(),
                back.seq,
                back.capture_ns,
                back.clock,
                &back.media
            ),
            ("mic", 7, frame.capture_ns, ClockState::Locked, &frame.media)
        );
        assert!(
            frame_of("van-08", props(), Vec::new()).is_none(),
            "another rig's"
        );
        let serial = Frame {
            media: Media::Serial { text: true },
            ..frame
        };
        let env = crate::wire::Envelope::of("van-07", 33, &serial);
        let back = frame_of(
            "van-07",
            env.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            Vec::new(),
        )
        .unwrap();
        assert_eq!(back.media, Media::Serial { text: true });
    }

    fn chunk(id: u32, count: u32, total: usize) -> Chunk {
        Chunk { id, count, total }
    }

    #[test]
    fn chunks_in_order_become_the_frame_and_a_frame_missing_its_start_is_counted_once() {
        let mut r = Reassembly::new(100);
        assert_eq!(
            r.push("t a".into(), chunk(0, 3, 7), b"abc".to_vec(), 0),
            None
        );
        assert_eq!(
            r.held, 7,
            "the whole frame is reserved with its first chunk"
        );
        assert_eq!(
            r.push("t a".into(), chunk(1, 3, 7), b"de".to_vec(), 1),
            None
        );
        assert_eq!(
            r.push("t a".into(), chunk(2, 3, 7), b"fg".to_vec(), 2),
            Some(b"abcdefg".to_vec())
        );
        assert_eq!((r.held, r.incomplete), (0, 0));
        // The subscription started after chunk 0 of frame b: its other chunks are dropped, one count.
        assert_eq!(
            r.push("t b".into(), chunk(1, 3, 7), b"de".to_vec(), 3),
            None
        );
        assert_eq!(
            r.push("t b".into(), chunk(2, 3, 7), b"fg".to_vec(), 4),
            None
        );
        assert_eq!((r.held, r.incomplete), (0, 1));
        // A chunk lost in the middle: dropped when the next one arrives, nothing held.
        r.push("t c".into(), chunk(0, 3, 7), b"abc".to_vec(), 5);
        assert_eq!(
            r.push("t c".into(), chunk(2, 3, 7), b"fg".to_vec(), 6),
            None
        );
        assert_eq!((r.held, r.incomplete), (0, 2));
        // Sizes that do not add up are not a frame.
        r.push("t d".into(), chunk(0, 2, 4), b"ab".to_vec(), 7);
        assert_eq!(
            r.push("t d".into(), chunk(1, 2, 4), b"cde".to_vec(), 8),
            None
        );
        r.push("t e".into(), chunk(0, 2, 4), b"ab".to_vec(), 9);
        assert_eq!(
            r.push("t e".into(), chunk(1, 2, 4), b"c".to_vec(), 10),
            None
        );
        assert_eq!((r.held, r.incomplete), (0, 4));
    }

    #[test]
    fn reassembly_holds_at_most_its_cap_and_forgets_what_expired() {
        let mut r = Reassembly::new(10);
        r.push("t a".into(), chunk(0, 2, 6), b"abc".to_vec(), 0);
        // b does not fit beside a: the oldest, a, makes room.
        r.push("t b".into(), chunk(0, 2, 6), b"abc".to_vec(), 1);
        assert_eq!((r.held, r.incomplete), (6, 1));
        assert_eq!(
            r.push("t a".into(), chunk(1, 2, 6), b"def".to_vec(), 2),
            None
        );
        assert_eq!(r.incomplete, 1, "a's late chunk is not counted again");
        // Larger than the cap: never held.
        assert_eq!(
            r.push("t c".into(), chunk(0, 2, 11), b"x".to_vec(), 3),
            None
        );
        assert_eq!((r.held, r.incomplete), (6, 2));
        // b's first chunk came over a minute ago: dropped, and its last chunk is no frame.
        let later = 1 + REASSEMBLY_EXPIRY_NS + 1;
        assert_eq!(
            r.push("t b".into(), chunk(1, 2, 6), b"def".to_vec(), later),
            None
        );
        assert_eq!((r.held, r.incomplete), (0, 3));
        assert!(r.open.is_empty());
    }

    fn metadata(props: &[(&str, &str)]) -> MessageMetadata {
        MessageMetadata {
            properties: props
                .iter()
                .map(|(k, v)| pulsar::proto::KeyValue {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// The messages of a frame cut into `count` chunks and each encrypted, as the rig's uplink
    /// sends them (`uplink::window`: chunk metadata, then `encryption_keys` and the IV per chunk).
    fn encrypted_chunks(
        enc: &crate::seal::Encryptor,
        payload: &[u8],
        count: usize,
    ) -> Vec<(MessageMetadata, Vec<u8>)> {
        let per = payload.len().div_ceil(count);
        crate::payload::cut(payload.len(), per)
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let (key, piece) = enc.seal(&payload[r]);
                let mut m = metadata(&[]);
                if count > 1 {
                    m.uuid = Some("rig-front-1".into());
                    m.num_chunks_from_msg = Some(count as i32);
                    m.chunk_id = Some(i as i32);
                    m.total_chunk_msg_size = Some(payload.len() as i32);
                }
                m.encryption_keys = key.metadata();
                m.encryption_param = Some(piece.iv.to_vec());
                (m, piece.ciphertext.to_vec())
            })
            .collect()
    }

    #[test]
    fn an_encrypted_chunked_frame_opens_with_the_fleet_key_and_is_skipped_without_it() {
        let (public, private) = crate::seal::test_keys();
        let enc =
            crate::seal::Encryptor::new(public, "fleet", std::time::Duration::from_secs(3600))
                .unwrap();
        let frame: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let msgs = encrypted_chunks(&enc, &frame, 3);

        let mut o = Opener::new(Some(Arc::new(Decryptor::new(private))), 1 << 20);
        let got: Vec<Opened> = msgs
            .iter()
            .map(|(m, p)| o.open("t", m, p.clone(), 0))
            .collect();
        assert_eq!(got[..2], [Opened::Pending, Opened::Pending]);
        assert_eq!(got[2], Opened::Whole(frame.clone()));
        assert_eq!((o.reassembled, o.encrypted, o.undecryptable), (1, 0, 0));

        // Without the key: each message skipped and counted as encrypted, nothing held.
        let mut none = Opener::new(None, 1 << 20);
        for (m, p) in &msgs {
            assert_eq!(
                none.open("t", m, p.clone(), 0),
                Opened::Skipped(Skip::Encrypted)
            );
        }
        assert_eq!((none.encrypted, none.held()), (3, 0));

        // Another fleet's key: undecryptable, with the reason.
        let (_, other) = crate::seal::test_keys();
        let mut wrong = Opener::new(Some(Arc::new(Decryptor::new(other))), 1 << 20);
        assert_eq!(
            wrong.open("t", &msgs[0].0, msgs[0].1.clone(), 0),
            Opened::Skipped(Skip::Undecryptable)
        );
        assert!(wrong.last_error.contains("fleet"), "{}", wrong.last_error);

        // A plain single message passes as it is.
        let mut plain = Opener::new(None, 1 << 20);
        assert_eq!(
            plain.open("t", &metadata(&[]), b"jpeg".to_vec(), 0),
            Opened::Whole(b"jpeg".to_vec())
        );
    }
}
