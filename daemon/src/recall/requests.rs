//! The control topic: the rig reads its requests with a durable subscription `rigd-{rig}` (what is
//! sent while it is offline waits on the broker), answers each on `{control-topic}-status` keyed
//! by the request id, and acknowledges a request only once it is durably recorded on the rig
//! ([`super::store`]). Every message gets an answer, after bounded work: a malformed or refused
//! request is `rejected` with the reason and counted, and the daemon goes on.
//!
//! The connection is the `pulsar` crate's (its keepalive finds a silent link; a consumer or
//! producer that fails is rebuilt after a backoff of at most [`MAX_BACKOFF`]).

use futures::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::producer::Message;
use pulsar::{Consumer, Producer, Pulsar, TokioExecutor};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

use super::protocol::{self, Answer, Held, Request, Span, State};
use super::Recall;
use crate::spool::SpoolError;

/// Longest pause between attempts to reach the control topic.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// An answer not confirmed by the broker this long: the connection is rebuilt.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Coverage is computed at most this often (a flood of coverage requests reuses it).
const COVERAGE_EVERY: Duration = Duration::from_secs(1);
/// A run of held frames ends at a gap in capture time longer than this.
const RUN_GAP_NS: i64 = 2_000_000_000;

/// Where to read and answer.
#[derive(Debug, Clone)]
pub struct Link {
    pub url: String,
    pub token_file: Option<std::path::PathBuf>,
    pub tls_ca: Option<std::path::PathBuf>,
    /// `[pulsar] tls-cert-file` and `tls-key-file`: a broker that requires mutual TLS is
    /// reached through [`crate::tail::bridge`] (the `pulsar` crate presents no certificate).
    pub tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub control_topic: String,
}

impl Link {
    pub fn status_topic(&self) -> String {
        format!("{}-status", self.control_topic)
    }
}

/// Reads requests and writes answers until shutdown.
pub async fn run(
    recall: Arc<Recall>,
    link: Link,
    mut answers: mpsc::Receiver<Answer>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    let mut coverage = Coverage::default();
    // An answer taken from the queue whose send failed: sent first on the next connection.
    let mut unsent: Option<Answer> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = Instant::now();
        let session = Session::open(&recall, &link);
        let result = tokio::select! {
            s = session => match s {
                Ok(mut s) => {
                    recall.stats.connected.store(true, Ordering::Relaxed);
                    tracing::info!(topic = %link.control_topic, "recall: reading requests");
                    let r = s.serve(&recall, &mut answers, &mut unsent, &mut coverage, &mut shutdown).await;
                    recall.stats.connected.store(false, Ordering::Relaxed);
                    s.close().await;
                    r
                }
                Err(e) => Err(e),
            },
            _ = shutdown.changed() => return,
        };
        match result {
            Ok(()) => return,
            Err(why) => {
                recall.stats.error(why.clone());
                tracing::warn!(topic = %link.control_topic, error = %why, retry_in_ms = backoff.as_millis() as u64,
                    "recall: control topic unavailable");
            }
        }
        // A session that held a while starts the backoff over.
        if started.elapsed() > Duration::from_secs(30) {
            backoff = Duration::from_millis(200);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

struct Session {
    consumer: Consumer<Vec<u8>, TokioExecutor>,
    producer: Producer<TokioExecutor>,
    /// The TLS bridge of a client certificate, for as long as the session lives.
    _bridge: Option<crate::tail::bridge::Bridge>,
}

impl Session {
    async fn open(recall: &Recall, link: &Link) -> Result<Session, String> {
        let token = match &link.token_file {
            Some(p) => Some(crate::config::read_token(p)?),
            None => None,
        };
        let (builder, bridge) = match &link.tls_client {
            Some(cert) => {
                let access = crate::tail::Access {
                    token,
                    tls_ca: link.tls_ca.clone(),
                    tls_client: Some(cert.clone()),
                };
                crate::tail::connect(&link.url, &access).await?
            }
            None => (
                crate::tail::client(&link.url, token, link.tls_ca.as_deref())?,
                None,
            ),
        };
        let builder = builder
            .with_connection_retry_options(pulsar::ConnectionRetryOptions {
                min_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                max_retries: 3,
                connection_timeout: Duration::from_secs(10),
                keep_alive: Duration::from_secs(10),
                ..Default::default()
            })
            .with_operation_retry_options(pulsar::OperationRetryOptions {
                operation_timeout: Duration::from_secs(30),
                retry_delay: Duration::from_millis(500),
                max_retries: Some(10),
            });
        let pulsar: Pulsar<TokioExecutor> = builder
            .build()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", link.url))?;
        let consumer = pulsar
            .consumer()
            .with_topic(&link.control_topic)
            .with_subscription(format!("rigd-{}", recall.rig))
            .with_subscription_type(SubType::Failover)
            .with_consumer_name(format!("rigd-{}", recall.rig))
            .with_options(
                ConsumerOptions::default()
                    .durable(true)
                    // Requests sent before the rig ever subscribed wait too.
                    .with_initial_position(InitialPosition::Earliest),
            )
            .build()
            .await
            .map_err(|e| format!("cannot subscribe to {}: {e}", link.control_topic))?;
        let producer = pulsar
            .producer()
            .with_topic(link.status_topic())
            .build()
            .await
            .map_err(|e| format!("cannot publish to {}: {e}", link.status_topic()))?;
        Ok(Session {
            consumer,
            producer,
            _bridge: bridge,
        })
    }

    async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.consumer.close()).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), self.producer.close()).await;
    }

    /// Until shutdown (Ok) or a failure of the connection (Err, to rebuild it).
    async fn serve(
        &mut self,
        recall: &Arc<Recall>,
        answers: &mut mpsc::Receiver<Answer>,
        unsent: &mut Option<Answer>,
        coverage: &mut Coverage,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), String> {
        if let Some(a) = unsent.take() {
            self.send(&a).await.inspect_err(|_| *unsent = Some(a))?;
        }
        loop {
            tokio::select! {
                m = self.consumer.next() => {
                    let msg = match m {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => return Err(format!("reading requests: {e}")),
                        None => return Err("the request stream ended".to_string()),
                    };
                    let replies = handle(recall, &msg.payload.data, coverage).await
                        .map_err(|e| format!("recording a request: {e}"))?;
                    // Recorded: the broker may forget it now. Then the answers.
                    self.consumer.ack(&msg).await.map_err(|e| format!("acknowledging a request: {e}"))?;
                    for a in replies {
                        self.send(&a).await?;
                    }
                }
                a = answers.recv() => {
                    let Some(a) = a else { return Ok(()) };
                    if let Err(e) = self.send(&a).await {
                        *unsent = Some(a);
                        return Err(e);
                    }
                }
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }

    async fn send(&mut self, a: &Answer) -> Result<(), String> {
        let payload = serde_json::to_vec(a).expect("an answer serializes");
        let msg = Message {
            payload,
            partition_key: Some(a.id.clone()),
            properties: [("state".to_string(), format!("{:?}", a.state).to_lowercase())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let receipt = self
            .producer
            .send_non_blocking(msg)
            .await
            .map_err(|e| format!("answering {}: {e}", a.id))?;
        match tokio::time::timeout(ANSWER_TIMEOUT, receipt).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("answering {}: {e}", a.id)),
            Err(_) => Err(format!(
                "answering {}: no receipt in {} s",
                a.id,
                ANSWER_TIMEOUT.as_secs()
            )),
        }
    }
}

/// One control message: recorded (an accepted upload, durably) and answered.
async fn handle(
    recall: &Arc<Recall>,
    bytes: &[u8],
    coverage: &mut Coverage,
) -> Result<Vec<Answer>, SpoolError> {
    let pending = recall.stats.pending.load(Ordering::Relaxed) as usize;
    let request = match protocol::parse(bytes, recall.sources.as_slice(), pending) {
        Ok(r) => r,
        Err(r) => {
            recall.stats.reject(r.kind);
            tracing::info!(id = r.id.as_deref().unwrap_or(""), reason = %r.reason, "recall: request rejected");
            return Ok(vec![Answer::rejected(&r, &recall.rig, (recall.now_ns)())]);
        }
    };
    Ok(match request {
        Request::Upload(u) => {
            recall.stats.uploads.fetch_add(1, Ordering::Relaxed);
            // The same id again: the same answer (idempotent), nothing sent twice.
            if let Some(done) = recall.store.finished(&u.id)? {
                return Ok(vec![done]);
            }
            let known = recall.store.pending()?.iter().any(|p| p.upload.id == u.id);
            if !known {
                let id = u.id.clone();
                recall.store.add(u)?;
                recall.stats.pending.fetch_add(1, Ordering::Relaxed);
                recall.wake.notify_one();
                tracing::info!(request = %id, "recall: request accepted");
                return Ok(vec![recall.answer(State::Accepted, &id)]);
            }
            vec![recall.answer(State::Accepted, &u.id)]
        }
        Request::Cancel { id } => {
            recall.stats.cancels.fetch_add(1, Ordering::Relaxed);
            let mut turn = recall.turn();
            if turn.active.as_deref() == Some(id.as_str()) {
                // The uploader stops at its next step and answers `cancelled`.
                turn.cancel = true;
                return Ok(Vec::new());
            }
            let waiting = recall
                .store
                .pending()?
                .into_iter()
                .find(|p| p.upload.id == id);
            match waiting {
                Some(p) => {
                    let mut a = recall.answer(State::Cancelled, &id);
                    a.sent = Some(p.sent);
                    recall.store.finish(Some(p.arrival), &a, &[])?;
                    recall.stats.pending.fetch_sub(1, Ordering::Relaxed);
                    vec![a]
                }
                None => match recall.store.finished(&id)? {
                    // Finished before the cancel came: its final answer.
                    Some(done) => vec![done],
                    None => {
                        recall.stats.reject("unknown-request");
                        let mut a = recall.answer(State::Rejected, &id);
                        a.reason = Some(format!("no request {id:?} to cancel"));
                        vec![a]
                    }
                },
            }
        }
        Request::Coverage { id } => {
            recall.stats.coverages.fetch_add(1, Ordering::Relaxed);
            let mut a = recall.answer(State::Coverage, &id);
            a.sources = coverage.get(recall).await?;
            vec![a]
        }
    })
}

/// What each on-request source holds, computed at most every [`COVERAGE_EVERY`].
#[derive(Default)]
struct Coverage {
    at: Option<Instant>,
    held: Vec<Held>,
}

impl Coverage {
    async fn get(&mut self, recall: &Arc<Recall>) -> Result<Vec<Held>, SpoolError> {
        if self.at.is_some_and(|t| t.elapsed() < COVERAGE_EVERY) {
            return Ok(self.held.clone());
        }
        let r = recall.clone();
        self.held = tokio::task::spawn_blocking(move || held(&r))
            .await
            .expect("coverage task")?;
        self.at = Some(Instant::now());
        Ok(self.held.clone())
    }
}

/// Each on-request source's frames and the runs of capture time they cover (index only).
fn held(recall: &Recall) -> Result<Vec<Held>, SpoolError> {
    let mut out = Vec::new();
    for (source, on_request) in &recall.sources {
        if !on_request {
            continue;
        }
        let id: Arc<str> = source.as_str().into();
        let mut h = Held {
            source: source.clone(),
            frames: 0,
            bytes: 0,
            held: Vec::new(),
        };
        let mut cursor = 0;
        let mut last: Option<(u64, i64)> = None;
        loop {
            let batch = recall.spool.entries(&id, cursor, 4096)?;
            let Some(end) = batch.last() else { break };
            cursor = end.seq + 1;
            for e in &batch {
                h.frames += 1;
                h.bytes += e.len as u64;
                let joins = last.is_some_and(|(seq, t)| {
                    e.seq == seq + 1 && e.capture_ns >= t && e.capture_ns - t <= RUN_GAP_NS
                });
                match h.held.last_mut() {
                    Some(run) if joins => run.to = e.capture_ns + 1,
                    _ => h.held.push(Span {
                        from: e.capture_ns,
                        to: e.capture_ns + 1,
                    }),
                }
                last = Some((e.seq, e.capture_ns));
            }
        }
        out.push(h);
    }
    Ok(out)
}
