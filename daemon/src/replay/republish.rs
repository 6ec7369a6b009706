//! `rigd replay --pulsar URL`: a spool republished with the daemon's own producer, so the topics,
//! keys, event times, properties, producer names (`rigd-{rig}-{source}`) and sequence ids
//! (`seq << 11 | generation << 8 | chunk`, `uplink::plan::sequence_id`) are exactly what the rig itself would have sent. A broker with
//! deduplication on therefore drops every frame it already holds (the producer even skips sending
//! them, from the last sequence id the broker reports); without deduplication delivery is at
//! least once.
//!
//! Frames go out across sources in capture order, each source in `seq` order. The replay ends
//! when every submitted frame has its receipt; Ctrl-C stops submitting, waits briefly for the
//! receipts in flight, and reports what is left unacknowledged.

use crate::payload::Held;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

use super::{capture_order, total_bytes, Published, ReplayError, SourcePlan, Summary, Tally};
use crate::progress::{Interrupt, Progress};
use crate::spool::snapshot::SpoolSnapshot;
use crate::uplink::{Ack, Outcome, ProducerConfig, TopicProducer};
use crate::wire;
use rigd_drivers::Modality;

/// Where and as whom to republish.
#[derive(Debug, Clone)]
pub struct Target {
    /// `pulsar://host:port`.
    pub url: String,
    /// The rig id the frames were captured under (topic and producer names).
    pub rig: String,
    /// Topic template with `{rig}` and `{source}`, as `pulsar.topic` in the config.
    pub topic: String,
    pub bucket_ms: u32,
    /// Token, CA certificates (the Mozilla roots when absent) and client certificate.
    pub access: crate::tail::Access,
    /// Give up when nothing moves (no connection, no receipt) for this long.
    pub stall_timeout: Duration,
    /// A partitioned topic's key -> partition mapping (`pulsar.hashing-scheme`).
    pub hashing: crate::config::HashingScheme,
}

impl Target {
    pub fn topic_of(&self, source: &str, modality: Modality) -> String {
        crate::wire::topic(&self.topic, &self.rig, source, modality.as_str())
    }
}

struct EpochSender {
    producer: TopicProducer,
    acks: mpsc::UnboundedReceiver<Ack>,
    submitted: u64,
    acked: u64,
}

/// Republishes the planned records; blocks until done (runs its own async runtime).
pub fn run(
    snap: &SpoolSnapshot,
    plan: &[SourcePlan],
    target: &Target,
    interrupt: &Interrupt,
) -> Result<Summary, ReplayError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ReplayError::Pulsar {
            url: target.url.clone(),
            why: format!("cannot start the async runtime: {e}"),
        })?;
    rt.block_on(republish(snap, plan, target, interrupt))
}

async fn republish(
    snap: &SpoolSnapshot,
    plan: &[SourcePlan],
    target: &Target,
    interrupt: &Interrupt,
) -> Result<Summary, ReplayError> {
    let tls = if target.url.starts_with("pulsar+ssl://") {
        let client = target
            .access
            .tls_client
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()));
        Some(
            crate::uplink::tls_config(target.access.tls_ca.as_deref(), client).map_err(|why| {
                ReplayError::Pulsar {
                    url: target.url.clone(),
                    why: format!("TLS: {why}"),
                }
            })?,
        )
    } else {
        None
    };
    let (shutdown_tx, shutdown) = watch::channel(false);
    // One producer per sending epoch of each source, under the name the daemon used for it
    // (`spool::epochs`): deduplication is per producer name, so a frame republished under another
    // epoch's name would be dropped, or would make that name drop the frames still to come.
    let mut epochs = Vec::with_capacity(plan.len());
    let mut first_sender = Vec::with_capacity(plan.len());
    let mut wanted: Vec<(usize, u64)> = Vec::new();
    for (i, p) in plan.iter().enumerate() {
        let persisted = crate::spool::epochs::read_epochs(snap.path(), &p.source).map_err(|e| {
            ReplayError::Pulsar {
                url: target.url.clone(),
                why: format!("{}: sending epochs: {e}", p.source),
            }
        })?;
        let e = crate::pipeline::epochs::Epochs::new(&persisted);
        first_sender.push(wanted.len());
        wanted.extend(e.starts().iter().map(|s| (i, *s)));
        epochs.push(e);
    }
    // One connection per broker for every sender, as the daemon's producers share one.
    let pool = crate::uplink::Pool::new(None);
    let mut senders: Vec<EpochSender> = wanted
        .iter()
        .map(|&(i, start)| {
            let p = &plan[i];
            let (tx, acks) = mpsc::unbounded_channel();
            // For a `{modality}` template: what the source's records are (its first readable one).
            let modality = p
                .entries
                .iter()
                .find_map(|e| snap.read(&p.source, e).ok())
                .map_or(Modality::Serial, |f| f.modality());
            let cfg = ProducerConfig {
                token: target
                    .access
                    .token
                    .clone()
                    .map_or(crate::uplink::Token::None, crate::uplink::Token::Fixed),
                max_in_flight: 1000,
                max_frame_bytes: record_limit(),
                send_timeout: Duration::from_secs(30),
                tls: tls.clone(),
                compression: crate::config::Compression::None,
                batch: crate::uplink::BatchPolicy::default(),
                hashing: target.hashing,
                pool: pool.clone(),
                ..ProducerConfig::new(
                    &target.url,
                    target.topic_of(&p.source, modality),
                    wire::epoch_producer_name(&target.rig, &p.source, start),
                    &target.rig,
                    target.bucket_ms,
                )
            };
            EpochSender {
                producer: TopicProducer::spawn(cfg, tx, shutdown.clone()),
                acks,
                submitted: 0,
                acked: 0,
            }
        })
        .collect();
    let progress = Progress::new(total_bytes(plan), "publish");
    let mut tally = Tally::new(plan);
    let mut counts = Published::default();
    let mut moved = Instant::now();
    let mut interrupted = false;
    // Why nothing moved for --timeout, and whether the producer was connected then.
    let mut stalled: Option<(String, bool)> = None;
    // A segment this user may no longer open: stop submitting, settle what went, then say so.
    let mut unreadable: Option<ReplayError> = None;

    'records: for (i, e) in capture_order(plan) {
        let p = &plan[i];
        let sender = first_sender[i] + epochs[i].of(e.seq);
        let mut frame: Held = match snap.read(&p.source, &e) {
            Ok(f) => f,
            Err(err) => {
                let c = match super::damage(err) {
                    Ok(c) => c,
                    Err(stop) => {
                        unreadable = Some(stop);
                        break 'records;
                    }
                };
                progress.println(&format!("skipped corrupt {}", super::inspect::describe(&c)));
                tally.corrupt(c);
                progress.inc(e.len as u64);
                continue;
            }
        };
        loop {
            if drain(&mut senders, &mut counts, &progress) {
                moved = Instant::now();
            }
            if interrupt.is_set() {
                interrupted = true;
                break 'records;
            }
            match senders[sender].producer.try_submit(frame) {
                Ok(()) => {
                    senders[sender].submitted += 1;
                    tally.done(i, &e);
                    progress.inc(e.len as u64);
                    moved = Instant::now();
                    break;
                }
                Err(f) => {
                    frame = f;
                    // A topic found partitioned: its producer took no frame before (it never
                    // connected), so none comes back.
                    let left = senders[sender].producer.refresh().await;
                    debug_assert!(
                        left.is_empty(),
                        "a producer that never connected held frames"
                    );
                    let sender = &senders[sender];
                    if !sender.producer.is_connected() {
                        progress.set_message(format!("waiting for {}", target.url));
                        if moved.elapsed() > target.stall_timeout {
                            stalled = Some((last_error(sender), false));
                            break 'records;
                        }
                    }
                    tokio::select! {
                        _ = sender.producer.room() => {}
                        _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                    }
                }
            }
        }
    }
    progress.set_message("waiting for receipts");
    // Receipts for what was submitted; after an interrupt only briefly.
    let mut waited_from = Instant::now();
    while stalled.is_none() && senders.iter().any(|l| l.acked < l.submitted) {
        if drain(&mut senders, &mut counts, &progress) {
            waited_from = Instant::now();
        }
        if interrupt.is_set() && !interrupted {
            interrupted = true;
            waited_from = Instant::now();
        }
        let limit = if interrupted {
            Duration::from_secs(5)
        } else {
            target.stall_timeout
        };
        if waited_from.elapsed() > limit {
            if !interrupted {
                let stuck = senders.iter().find(|l| l.acked < l.submitted);
                stalled = Some((
                    stuck.map(last_error).unwrap_or_default(),
                    stuck.is_some_and(|l| l.producer.is_connected()),
                ));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = shutdown_tx.send(true);
    for sender in senders {
        let mut acks = sender.acks;
        let left = sender.producer.close().await;
        while let Ok(a) = acks.try_recv() {
            count(&mut counts, &a);
        }
        counts.unacknowledged += left.len() as u64;
    }
    progress.finish();
    if let Some(e) = unreadable {
        return Err(e);
    }
    if let Some((why, connected)) = stalled {
        let secs = target.stall_timeout.as_secs();
        let sent = match (counts.persisted, counts.already_persisted) {
            (0, 0) => "nothing was published".to_string(),
            (p, a) => format!("{p} frames persisted before, {a} already held"),
        };
        let why = match (connected, why.is_empty()) {
            (false, true) => {
                format!("the broker is unreachable: no connection in {secs} s (--timeout); {sent}")
            }
            (false, false) => {
                format!("the broker is unreachable ({why}), for {secs} s (--timeout); {sent}")
            }
            (true, true) => format!("connected, but no receipt in {secs} s (--timeout); {sent}"),
            (true, false) => {
                format!("connected, but no receipt in {secs} s (--timeout; {why}); {sent}")
            }
        };
        return Err(ReplayError::Pulsar {
            url: target.url.clone(),
            why,
        });
    }
    let mut summary = tally.finish(target.url.clone(), interrupted);
    summary.published = Some(counts);
    Ok(summary)
}

/// The producer's limit: any frame the spool can hold (it is chunked on the wire).
fn record_limit() -> usize {
    crate::spool::record::MAX_LEN
}

fn last_error(sender: &EpochSender) -> String {
    sender
        .producer
        .stats()
        .last_error
        .lock()
        .map(|e| e.clone())
        .unwrap_or_default()
}

fn count(c: &mut Published, ack: &Ack) {
    match &ack.outcome {
        Outcome::Persisted => c.persisted += 1,
        Outcome::AlreadyPersisted => c.already_persisted += 1,
        Outcome::Refused(_) => c.refused += 1,
    }
}

/// Takes every receipt waiting; true when there was one.
fn drain(senders: &mut [EpochSender], counts: &mut Published, progress: &Progress) -> bool {
    let mut any = false;
    for sender in senders.iter_mut() {
        while let Ok(a) = sender.acks.try_recv() {
            if let Outcome::Refused(why) = &a.outcome {
                progress.println(&format!("refused seq {}: {why}", a.seq));
            }
            count(counts, &a);
            sender.acked += 1;
            any = true;
        }
    }
    if any {
        progress.set_message(format!(
            "{} persisted, {} already held",
            counts.persisted, counts.already_persisted
        ));
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_the_config_template() {
        let t = Target {
            url: "pulsar://x:6650".into(),
            rig: "van-07".into(),
            topic: crate::wire::DEFAULT_TOPIC.into(),
            bucket_ms: 33,
            access: Default::default(),
            stall_timeout: Duration::from_secs(1),
            hashing: Default::default(),
        };
        assert_eq!(
            t.topic_of("front", Modality::Camera),
            "persistent://public/default/van-07-front"
        );
    }
}
