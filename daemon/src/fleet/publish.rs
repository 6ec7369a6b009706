//! The rig's side: its digest on the fleet's coverage topic (`[pulsar] coverage-topic`), keyed by
//! the rig id, every `coverage-interval-s` and sooner when what it holds changes shape (a range
//! begins or ends, a source starts or is evicted away: at most every [`DEBOUNCE`]). The held ranges
//! are recall's own answer to `coverage`, kept up to date from what the spool's index gained and
//! lost since the last look ([`HeldScan`]: not the whole index every [`DEBOUNCE`]);
//! the publisher is a producer on the rig's connection ([`crate::uplink::control::publisher`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

use super::digest::{Digest, TOLERANCE_M};
use super::track::Track;
use crate::recall::protocol::Held;
use crate::recall::requests::HeldScan;
use crate::recall::Recall;
use crate::uplink::control::{self, Publisher};

/// A change of shape is published no sooner than this after the last digest.
pub const DEBOUNCE: Duration = Duration::from_secs(5);
/// A digest not confirmed by the broker this long: the producer is rebuilt.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// What the publisher needs besides recall.
pub struct Publishing {
    pub topic: String,
    /// The periodic publication (`coverage-interval-s`).
    pub every: Duration,
    pub track: Arc<Track>,
    /// Where the track is kept between runs ([`super::track::file`]).
    pub track_file: PathBuf,
}

/// What makes a digest worth sending before its time: per source the number of ranges and where
/// the first begins (the last one growing as capture goes on is not a change), and the number of
/// the track's runs (a GPS that came, or came back after a gap).
type Shape = (Vec<(String, usize, Option<i64>)>, usize);

fn shape(held: &[Held], track: &Track) -> Shape {
    let sources = held
        .iter()
        .map(|h| {
            (
                h.source.clone(),
                h.held.len(),
                h.held.first().map(|s| s.from),
            )
        })
        .collect();
    (sources, track.run_count())
}

/// Publishes until shutdown.
pub async fn run(recall: Arc<Recall>, p: Publishing, mut shutdown: watch::Receiver<bool>) {
    let tick = p.every.min(DEBOUNCE);
    let mut publisher: Option<Publisher> = None;
    let mut said: Option<(Instant, Shape)> = None;
    let mut failing = false;
    let mut scan = HeldScan::default();
    // What the track's file holds.
    let mut saved = p.track.runs(i64::MIN);
    loop {
        let r = recall.clone();
        let mut s = std::mem::take(&mut scan);
        let held = match tokio::task::spawn_blocking(move || (s.held(&r), s)).await {
            Ok((Ok(h), s)) => {
                scan = s;
                Some(h)
            }
            Ok((Err(e), _)) => {
                tracing::warn!(error = %e, "coverage digest: cannot read what the spool holds");
                None
            }
            Err(_) => None,
        };
        if let Some(held) = held {
            let now_shape = shape(&held, &p.track);
            let due = match &said {
                None => true,
                Some((at, s)) => {
                    at.elapsed() >= p.every || (*s != now_shape && at.elapsed() >= DEBOUNCE)
                }
            };
            if due {
                let at = (recall.now_ns)();
                let since = super::digest::track_since(&held).unwrap_or(at);
                let runs = p.track.runs(since);
                let digest = Digest::build(&recall.rig, at, &held, &runs, TOLERANCE_M);
                let bytes = digest.encode();
                match send(&recall, &p.topic, &mut publisher, &bytes).await {
                    Ok(()) => {
                        if said.is_none() || failing {
                            tracing::info!(topic = %p.topic, bytes = bytes.len(),
                                "coverage digest published");
                        }
                        failing = false;
                        said = Some((Instant::now(), now_shape));
                        // The track's file, when the track moved since it was written.
                        if runs != saved {
                            let file = p.track_file.clone();
                            let wrote = tokio::task::spawn_blocking(move || {
                                Track::save(&file, &runs).map(|()| runs)
                            });
                            if let Ok(Ok(runs)) = wrote.await {
                                saved = runs;
                            }
                        }
                    }
                    Err(why) => {
                        if !failing {
                            tracing::warn!(topic = %p.topic, error = %why,
                                "coverage digest not published; retrying");
                        }
                        failing = true;
                        if let Some(old) = publisher.take() {
                            let _ = tokio::time::timeout(Duration::from_secs(2), old.close()).await;
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = shutdown.changed() => break,
        }
    }
    if let Some(old) = publisher {
        let _ = tokio::time::timeout(Duration::from_secs(2), old.close()).await;
    }
}

async fn send(
    recall: &Recall,
    topic: &str,
    publisher: &mut Option<Publisher>,
    bytes: &[u8],
) -> Result<(), String> {
    if publisher.is_none() {
        let base = (recall.producer)("coverage");
        let name = format!("rigd-{}-coverage", recall.rig);
        *publisher = Some(
            control::publisher(&base, topic, &name, SEND_TIMEOUT)
                .await
                .map_err(|e| format!("cannot publish to {topic}: {e}"))?,
        );
    }
    let p = publisher.as_mut().expect("opened above");
    p.send(
        &recall.rig,
        &[("content-type", "application/json".to_string())],
        bytes,
    )
    .await
    .map_err(|e| e.to_string())
}
