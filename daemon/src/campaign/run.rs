//! The campaigns' task: frames of the GPS, audio and events sources reach it from their lanes
//! ([`observer`]: a bounded queue it never waits on, so capture never waits for the
//! conditions), ticks carry the clock's lock and each source's silence; triggers become windows
//! queued with recall, ledgers are checkpointed, expiries applied.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

use rigd_drivers::{AudioLevel, ClockState, FrameClock, Media, SourceHealth};

use super::eval::{Decision, Input};
use super::store::Phase;
use super::Campaigns;
use crate::recall::protocol::{State, Upload};

/// Frames waiting for the evaluation at most; more are counted as `feed_dropped`.
const FEED_QUEUE: usize = 4096;
/// How often the clock and the sources' silence are looked at.
const TICK: Duration = Duration::from_millis(100);
/// Ledgers that moved are made durable this often (and at each trigger).
const CHECKPOINT: Duration = Duration::from_secs(1);

/// Where the lanes' observers put frames for the evaluation.
#[derive(Clone)]
pub struct Feed {
    tx: mpsc::Sender<rigd_drivers::Frame>,
    pub dropped: Arc<AtomicU64>,
    /// A campaign is active (set by [`Campaigns::refeed`]): with none, the observers offer nothing.
    pub feeding: Arc<AtomicBool>,
}

/// A feed and its receiving end (for [`run`]).
pub fn feed() -> (Feed, mpsc::Receiver<rigd_drivers::Frame>) {
    let (tx, rx) = mpsc::channel(FEED_QUEUE);
    (
        Feed {
            tx,
            dropped: Arc::default(),
            feeding: Arc::default(),
        },
        rx,
    )
}

/// Whether a source's frames can concern a condition (serial NMEA, audio, the markers).
pub fn wanted(modality: rigd_drivers::Modality) -> bool {
    matches!(
        modality,
        rigd_drivers::Modality::Serial | rigd_drivers::Modality::Audio
    )
}

/// What the lane of a [`wanted`] source calls with each frame ([`crate::pipeline::Observer`]):
/// while a campaign is active the frame is offered to `feed` without waiting; a full feed counts
/// it as dropped for the evaluation only.
pub fn observer(feed: Feed) -> crate::pipeline::Observer {
    Box::new(move |f: &rigd_drivers::Frame| {
        if feed.feeding.load(Ordering::Relaxed) && feed.tx.try_send(f.clone()).is_err() {
            feed.dropped.fetch_add(1, Ordering::Relaxed);
        }
    })
}

/// What the task reads besides the frames.
pub struct Watch {
    pub clock: Arc<dyn FrameClock>,
    /// Each source's health (its frame count moves while it captures).
    pub health: Vec<(String, Arc<SourceHealth>)>,
}

/// The input a frame gives, if any.
fn input_of<'a>(f: &'a rigd_drivers::Frame, note: &'a mut String) -> Option<Input<'a>> {
    let source = &*f.source;
    match f.media {
        Media::Audio {
            sample_rate,
            frames,
            ..
        } if sample_rate > 0 => Some(Input::Audio {
            source,
            t: f.capture_ns,
            dur_ns: i64::from(frames) * 1_000_000_000 / i64::from(sample_rate),
            dbfs: f64::from(AudioLevel::of_s16le(&f.payload).rms_dbfs()),
        }),
        Media::Serial { .. } if source == crate::events::EVENTS_SOURCE => {
            let v: serde_json::Value = serde_json::from_slice(&f.payload).ok()?;
            *note = v.get("event")?.as_str()?.to_string();
            Some(Input::Marker {
                t: f.capture_ns,
                note,
            })
        }
        Media::Serial { .. } => {
            let (lat, lon) = match crate::nmea::parse(&f.payload).ok()?? {
                crate::nmea::Sentence::Rmc(r) if r.valid => r.position?,
                crate::nmea::Sentence::Gga(g) if g.quality > 0 => g.position?,
                _ => return None,
            };
            Some(Input::Fix {
                source,
                t: f.capture_ns,
                lat,
                lon,
            })
        }
        _ => None,
    }
}

/// Evaluates until shutdown.
pub async fn run(
    campaigns: Arc<Campaigns>,
    mut frames: mpsc::Receiver<rigd_drivers::Frame>,
    watch: Watch,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut checkpoint = tokio::time::interval(CHECKPOINT);
    // Per source: its frame count and the rig time it last moved.
    let start = watch.clock.now().ns;
    let mut seen: Vec<(u64, i64)> = watch
        .health
        .iter()
        .map(|(_, h)| (h.frames(), start))
        .collect();
    let mut silent: Vec<(String, i64)> =
        watch.health.iter().map(|(id, _)| (id.clone(), 0)).collect();
    // Every observer gone (no source to feed, or shutdown): ticks go on.
    let mut open = true;
    loop {
        tokio::select! {
            f = frames.recv(), if open => {
                let Some(f) = f else {
                    open = false;
                    continue;
                };
                let mut note = String::new();
                if let Some(input) = input_of(&f, &mut note) {
                    evaluate(&campaigns, &input);
                }
            }
            _ = tick.tick() => {
                let now = watch.clock.now();
                for (i, (_, h)) in watch.health.iter().enumerate() {
                    let n = h.frames();
                    if n != seen[i].0 {
                        seen[i] = (n, now.ns);
                    }
                    silent[i].1 = now.ns - seen[i].1;
                }
                evaluate(&campaigns, &Input::Tick {
                    t: now.ns,
                    locked: now.state == ClockState::Locked,
                    silent: &silent,
                });
                expire(&campaigns, now.ns);
            }
            _ = checkpoint.tick() => checkpoint_ledgers(&campaigns),
            _ = shutdown.changed() => {
                checkpoint_ledgers(&campaigns);
                return;
            }
        }
    }
}

/// One input to every active campaign; its triggers become windows.
fn evaluate(campaigns: &Campaigns, input: &Input) {
    let mut book = campaigns.book();
    let mut answers = Vec::new();
    for e in book.entries.values_mut() {
        if e.record.phase != Phase::Active {
            continue;
        }
        let Some(t) = e.eval.input(input) else {
            continue;
        };
        let c = &e.record.campaign;
        let decision = e.record.ledger.trigger(c, t);
        let mut window = None;
        if let Decision::Window(w) = decision {
            // The window's recall id: the next number no request holds (a crash between the
            // ask and the checkpoint must not reuse one).
            let mut n = e.record.ledger.windows;
            let id = loop {
                let id = format!("{}-w{n}", c.id);
                if !campaigns.recall.known(&id).unwrap_or(false) {
                    break id;
                }
                n += 1;
            };
            let upload = Upload {
                id: id.clone(),
                sources: c.sources.clone(),
                from: w.from,
                to: w.to,
                force: false,
            };
            match campaigns.recall.ask(upload) {
                Ok(()) => window = Some((id, w)),
                Err(why) => {
                    tracing::warn!(campaign = %c.id, error = %why, "campaign: a window could not be queued")
                }
            }
        }
        if let Err(err) = campaigns.store().put(&[&e.record], true) {
            tracing::error!(campaign = %c.id, error = %err, "campaign: cannot record a trigger");
        }
        e.dirty = false;
        tracing::info!(campaign = %c.id, trigger_ns = t, decision = ?decision, "campaign: triggered");
        let mut a = campaigns.answer(State::Triggered, &c.id, Some(e));
        if let Some(state) = a.campaign.as_mut() {
            state["trigger_ns"] = t.into();
            state["decision"] = format!("{decision:?}").to_lowercase().into();
            if let Some((id, w)) = window {
                state["window"] = serde_json::json!({"upload": id, "from": w.from, "to": w.to});
            }
        }
        answers.push(a);
    }
    drop(book);
    for a in answers {
        campaigns.recall.say_progress(a);
    }
}

/// Campaigns past their expiry stop.
fn expire(campaigns: &Campaigns, now: i64) {
    let mut book = campaigns.book();
    let mut answers = Vec::new();
    for e in book.entries.values_mut() {
        let c = &e.record.campaign;
        if e.record.phase == Phase::Active && c.expires_ns.is_some_and(|x| now >= x) {
            e.record.phase = Phase::Expired;
            if let Err(err) = campaigns.store().put(&[&e.record], true) {
                tracing::error!(campaign = %c.id, error = %err, "campaign: cannot record its expiry");
            }
            tracing::info!(campaign = %c.id, "campaign: expired");
            answers.push(campaigns.answer(State::Stopped, &c.id, Some(e)));
        }
    }
    if !answers.is_empty() {
        let _ = campaigns.forget_inactive(&mut book);
        campaigns.refeed(&book);
    }
    drop(book);
    for a in answers {
        campaigns.recall.say_progress(a);
    }
}

/// Ledgers whose bytes moved, durable; a quota spent since is answered once.
fn checkpoint_ledgers(campaigns: &Campaigns) {
    let mut book = campaigns.book();
    let mut answers = Vec::new();
    let mut dirty = Vec::new();
    for e in book.entries.values_mut().filter(|e| e.dirty) {
        e.dirty = false;
        dirty.push(e.record.clone());
        let spent = e.record.ledger.quota_reached;
        if spent && !e.quota_said {
            answers.push(campaigns.answer(State::Progress, &e.record.campaign.id, Some(e)));
        }
        e.quota_said = spent;
    }
    drop(book);
    if !dirty.is_empty() {
        let refs: Vec<_> = dirty.iter().collect();
        if let Err(err) = campaigns.store().put(&refs, true) {
            tracing::error!(error = %err, "campaign: cannot checkpoint the quotas");
        }
    }
    for a in answers {
        campaigns.recall.say_progress(a);
    }
}

/// The rig's sources as campaigns see them.
pub fn sources_of(config: &crate::config::Config) -> Vec<super::spec::SourceInfo> {
    use super::spec::{SourceInfo, SourceKind};
    config
        .sources
        .iter()
        .map(|s| {
            let head = s.head();
            SourceInfo {
                id: s.id().to_string(),
                on_request: head.upload == crate::config::Upload::OnRequest,
                kind: match s.modality() {
                    rigd_drivers::Modality::Serial => SourceKind::Serial,
                    rigd_drivers::Modality::Audio => SourceKind::Audio,
                    _ => SourceKind::Other,
                },
                retain_ns: head
                    .retain_age
                    .map(|a| a.0.as_nanos().min(i64::MAX as u128) as i64),
            }
        })
        .collect()
}

/// A feed for the lanes' observers when campaigns can run (recall runs: a broker and an
/// on-request source).
pub fn feed_for(
    config: &crate::config::Config,
) -> Option<(Feed, mpsc::Receiver<rigd_drivers::Frame>)> {
    let on_request = config
        .sources
        .iter()
        .any(|s| s.head().upload == crate::config::Upload::OnRequest);
    (config.pulsar.url.is_some() && on_request).then(feed)
}

/// Opens the persisted campaigns, hooks them into `recall` and starts their task (detached; it
/// ends at shutdown).
pub fn start(
    recall: &Arc<crate::recall::Recall>,
    config: &crate::config::Config,
    (feed, frames): (Feed, mpsc::Receiver<rigd_drivers::Frame>),
    watch: Watch,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let clock = watch.clock.clone();
    let campaigns = Campaigns::open(
        recall.clone(),
        sources_of(config),
        Box::new(move || clock.now().ns),
        feed.dropped.clone(),
        feed.feeding.clone(),
    )
    .map_err(|e| anyhow::anyhow!("opening the campaigns in the spool: {e}"))?;
    recall.extend(campaigns.clone());
    drop(tokio::spawn(run(campaigns, frames, watch, shutdown)));
    Ok(())
}
