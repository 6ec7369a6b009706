//! `rigd live`: the live view relayed from a rig's Pulsar topics instead of served by the rig, so that a
//! rig behind NAT is watched with no inbound port. The same protocol and channels as the rig's
//! `/foxglove` (`rigd_web::live`), fed by a non-durable subscription from the latest message.
//!
//! A source's channels are advertised when its first message arrives (its modality is in the
//! message properties), so clients connected earlier are told of them then. Time messages carry
//! the newest capture time received, advanced by the time elapsed here since it arrived.
//! Encrypted frames (the rig's end-to-end encryption) are skipped and counted; decrypting them
//! (`--decrypt-key`) is not done yet.

use futures::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::{Consumer, Pulsar, TokioExecutor};
use rigd_drivers::{ClockState, Frame, Media};
use rigd_web::live::LiveHub;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

use crate::live::{source_channels, Encoder};
use crate::replay::progress::Interrupt;

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
    pub token: Option<String>,
    pub tls_ca: Option<std::path::PathBuf>,
    pub bind: SocketAddr,
    pub max_clients: usize,
}

/// Counts at the end.
#[derive(Debug, Clone, Default)]
pub struct RelaySummary {
    pub frames: u64,
    pub encrypted: u64,
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
    let web = tokio::spawn(rigd_web::serve(
        listener,
        rigd_web::live::router(hub.clone(), Some(stop_rx)),
        rigd_web::ServeLimits::default(),
        async move {
            let _ = web_stop.wait_for(|s| *s).await;
        },
    ));
    tracing::info!(bind = %cfg.bind, rig = %cfg.rig, "rigd live: serving the live view at /foxglove");

    let builder = crate::tail::client(&cfg.url, cfg.token.clone(), cfg.tls_ca.as_deref())
        .map_err(|e| perr(format!("--tls-ca {e}")))?;
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
        let mut summary = RelaySummary::default();
        loop {
            let msg = tokio::select! {
                m = consumer.next() => m,
                _ = interrupt.wait() => break,
            };
            let msg = match msg {
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
            if !msg.metadata().encryption_keys.is_empty() {
                if summary.encrypted == 0 {
                    tracing::warn!("rigd live: the rig's frames are end-to-end encrypted; they are skipped (no --decrypt-key yet)");
                }
                summary.encrypted += 1;
                continue;
            }
            let props = msg
                .metadata()
                .properties
                .iter()
                .map(|kv| (kv.key.as_str(), kv.value.as_str()));
            let Some(frame) = frame_of(&cfg.rig, props, msg.payload.data.clone()) else {
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
                let (channels, ids) = source_channels(&source, frame.modality(), nmea, first);
                for c in channels {
                    hub.add_channel(c);
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
        Ok(summary)
    }
    .await;
    let _ = stop_tx.send(true);
    let _ = web.await;
    result
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
}
