//! `rigd tail`: a rig's frames live from Pulsar, one line per time bucket saying which sources
//! (and so modalities) arrived in it and how far apart their capture times are.
//!
//! A Key_Shared subscription (non-durable, so nothing is left behind on the broker) over the rig's
//! topics: the ones named by `--source`, or every topic of the template's namespace that matches
//! it. A bucket is reported once the newest bucket seen is [`Assembler::lag`] buckets past it, or
//! when nothing arrived for a second; frames arriving for a bucket already reported are counted
//! as late. The bucket logic ([`Assembler`]) is pure and unit-tested; the consumer only feeds it.

use futures::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::{Authentication, Consumer, ConsumerBuilder, Pulsar, PulsarBuilder, TokioExecutor};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::time::{Duration, Instant};

use crate::civil as time;
use crate::progress::Interrupt;

pub mod bridge;

/// How long `rigd tail` and `rigd recall` try to reach the broker before they say it is
/// unreachable (the `pulsar` crate's own retries, [`connect`], give up before this on a refused
/// connection and say why).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How a client of the `pulsar` crate reaches the cluster (`rigd tail`, `rigd recall`, `rigd
/// live`): the token, the CA certificates to trust, the client certificate for mutual TLS.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub token: Option<String>,
    /// CA certificates (PEM) for a `pulsar+ssl://` URL (default: the Mozilla roots).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Client certificate and its key (PEM) for a broker that requires mutual TLS.
    pub tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum TailError {
    #[error("pulsar {url}: {why}")]
    Pulsar { url: String, why: String },
    #[error("topic template {template:?}: {why}")]
    Template { template: String, why: String },
    #[error("stdout: {0}")]
    Output(std::io::Error),
}

impl TailError {
    /// A usage error (exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, TailError::Template { .. })
    }
}

#[derive(Debug, Clone)]
pub struct TailConfig {
    pub url: String,
    pub rig: String,
    /// Topic template with `{rig}` and `{source}`.
    pub topic: String,
    /// Sources to subscribe to and to expect in every bucket; empty: discover the rig's topics
    /// and expect every source seen so far.
    pub sources: Vec<String>,
    pub access: Access,
    pub json: bool,
    /// Start from the oldest message the topics hold instead of the newest.
    pub from_earliest: bool,
    /// Stop after this many bucket lines.
    pub max_buckets: Option<u64>,
    /// Buckets to wait past a bucket before reporting it.
    pub lag: i64,
}

/// One frame as tail sees it (from the message properties).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub source: String,
    pub modality: String,
    pub seq: u64,
    pub capture_ns: i64,
    pub bucket: i64,
    pub bucket_ms: u32,
}

impl Hit {
    /// Reads the rigd properties of a message; `None` when it is not a rigd frame of `rig`.
    pub fn from_properties<'a>(
        rig: &str,
        props: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Hit> {
        let mut m: BTreeMap<&str, &str> = BTreeMap::new();
        m.extend(props);
        if m.get("rig") != Some(&rig) {
            return None;
        }
        Some(Hit {
            source: m.get("source")?.to_string(),
            modality: m.get("modality")?.to_string(),
            seq: m.get("seq")?.parse().ok()?,
            capture_ns: m.get("capture-ns")?.parse().ok()?,
            bucket: m.get("bucket")?.parse().ok()?,
            bucket_ms: m
                .get("bucket-ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(33),
        })
    }
}

/// What arrived from one source in a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceHits {
    pub modality: String,
    pub frames: u64,
    pub first_capture_ns: i64,
    pub last_capture_ns: i64,
}

/// One reported bucket (`--json`: this object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketLine {
    pub bucket: i64,
    pub bucket_start_ns: i64,
    pub sources: BTreeMap<String, SourceHits>,
    /// Modalities present, sorted.
    pub modalities: Vec<String>,
    /// Expected sources without a frame in this bucket.
    pub missing: Vec<String>,
    pub complete: bool,
    /// Spread of the sources' first capture times in the bucket (max - min), ns.
    pub skew_ns: i64,
}

#[derive(Debug, Default)]
struct Open {
    bucket_ms: u32,
    sources: BTreeMap<String, SourceHits>,
    seqs: HashSet<(String, u64)>,
}

/// Groups frames into buckets and decides when a bucket is reported. Pure.
#[derive(Debug)]
pub struct Assembler {
    expected: BTreeSet<String>,
    /// `expected` grows with every source seen (no `--source` given).
    learn: bool,
    open: BTreeMap<i64, Open>,
    newest: Option<i64>,
    /// Highest bucket reported; frames at or below it are late.
    reported: Option<i64>,
    pub lag: i64,
    pub late: u64,
}

impl Assembler {
    pub fn new(expected: &[String], lag: i64) -> Self {
        Assembler {
            expected: expected.iter().cloned().collect(),
            learn: expected.is_empty(),
            open: BTreeMap::new(),
            newest: None,
            reported: None,
            lag: lag.max(0),
            late: 0,
        }
    }

    /// Adds a frame; returns the buckets now ready, oldest first.
    pub fn add(&mut self, hit: Hit) -> Vec<BucketLine> {
        if self.reported.is_some_and(|r| hit.bucket <= r) {
            self.late += 1;
            return Vec::new();
        }
        if self.learn {
            self.expected.insert(hit.source.clone());
        }
        let b = self.open.entry(hit.bucket).or_default();
        b.bucket_ms = hit.bucket_ms;
        if b.seqs.insert((hit.source.clone(), hit.seq)) {
            let s = b.sources.entry(hit.source).or_insert(SourceHits {
                modality: hit.modality,
                frames: 0,
                first_capture_ns: hit.capture_ns,
                last_capture_ns: hit.capture_ns,
            });
            s.frames += 1;
            s.first_capture_ns = s.first_capture_ns.min(hit.capture_ns);
            s.last_capture_ns = s.last_capture_ns.max(hit.capture_ns);
        }
        self.newest = Some(self.newest.map_or(hit.bucket, |n| n.max(hit.bucket)));
        let ready_below = self.newest.unwrap_or(i64::MIN).saturating_sub(self.lag);
        self.take(|b| b <= ready_below)
    }

    /// Reports every open bucket (nothing arrived for a while, or the end).
    pub fn flush(&mut self) -> Vec<BucketLine> {
        self.take(|_| true)
    }

    fn take(&mut self, ready: impl Fn(i64) -> bool) -> Vec<BucketLine> {
        let keys: Vec<i64> = self
            .open
            .keys()
            .copied()
            .take_while(|b| ready(*b))
            .collect();
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(open) = self.open.remove(&k) {
                out.push(self.line(k, open));
                self.reported = Some(self.reported.map_or(k, |r| r.max(k)));
            }
        }
        out
    }

    fn line(&self, bucket: i64, open: Open) -> BucketLine {
        let missing: Vec<String> = self
            .expected
            .iter()
            .filter(|s| !open.sources.contains_key(*s))
            .cloned()
            .collect();
        let modalities: BTreeSet<String> =
            open.sources.values().map(|s| s.modality.clone()).collect();
        let firsts = open.sources.values().map(|s| s.first_capture_ns);
        let skew_ns = match (firsts.clone().max(), firsts.min()) {
            (Some(a), Some(b)) => a - b,
            _ => 0,
        };
        BucketLine {
            bucket,
            bucket_start_ns: bucket
                .saturating_mul(open.bucket_ms as i64)
                .saturating_mul(1_000_000),
            complete: missing.is_empty(),
            missing,
            modalities: modalities.into_iter().collect(),
            skew_ns,
            sources: open.sources,
        }
    }
}

/// The human line of a bucket.
pub fn format_line(l: &BucketLine) -> String {
    let mut s = format!("{} {}", l.bucket, time::format(l.bucket_start_ns));
    for (id, h) in &l.sources {
        s.push_str(&format!("  {}:{id}", h.modality));
        if h.frames > 1 {
            s.push_str(&format!("x{}", h.frames));
        }
    }
    s.push_str(&format!("  skew {:.1} ms", l.skew_ns as f64 / 1e6));
    if l.complete {
        s.push_str("  complete");
    } else {
        s.push_str(&format!("  MISSING {}", l.missing.join(",")));
    }
    s
}

/// A consumer of a rig's topics (`rigd tail`, `rigd live`): the named sources' topics, or, with none
/// named, every topic the template gives the rig, listed again every 5 s so that a source added
/// later is read too. `Err`: the template gives no pattern (why).
pub fn rig_topics(
    builder: ConsumerBuilder<TokioExecutor>,
    template: &str,
    rig: &str,
    sources: &[String],
) -> Result<ConsumerBuilder<TokioExecutor>, String> {
    // A topic per modality (shared by rigs): the rig's frames are picked by their properties.
    if sources.is_empty() || template.contains("{modality}") {
        let (re, namespace) = topic_pattern(template, rig)?;
        return Ok(builder
            .with_topic_regex(re)
            .with_lookup_namespace(namespace)
            .with_topic_refresh(Duration::from_secs(5)));
    }
    Ok(builder.with_topics(
        sources
            .iter()
            .map(|s| crate::wire::topic(template, rig, s, "")),
    ))
}

/// The regular expression of the rig's topics and the namespace to look them up in.
pub fn topic_pattern(template: &str, rig: &str) -> Result<(regex::Regex, String), String> {
    let (_, rest) = template
        .split_once("://")
        .ok_or("expected persistent://tenant/namespace/name")?;
    let mut parts = rest.splitn(3, '/');
    let (Some(tenant), Some(ns), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected persistent://tenant/namespace/name".into());
    };
    if !template.contains("{source}") && !template.contains("{modality}") {
        return Err("needs a {source} or {modality} placeholder to find the rig's topics".into());
    }
    // Each placeholder left becomes what it may stand for; a partitioned topic is listed by
    // its partitions.
    const SOURCE: &str = "\u{0}source\u{0}";
    const MODALITY: &str = "\u{0}modality\u{0}";
    let marked = template
        .replace("{rig}", rig)
        .replace("{source}", SOURCE)
        .replace("{modality}", MODALITY);
    let pattern = regex::escape(&marked)
        .replace(&regex::escape(SOURCE), "[a-z0-9-]+")
        .replace(&regex::escape(MODALITY), "(camera|audio|serial)");
    let re = regex::Regex::new(&format!("^{pattern}(-partition-[0-9]+)?$"))
        .map_err(|e| e.to_string())?;
    Ok((re, format!("{tenant}/{ns}")))
}

/// Runs until interrupted (or `max_buckets` lines); prints a bucket line per bucket on stdout.
pub fn run(cfg: &TailConfig, interrupt: &Interrupt) -> Result<TailSummary, TailError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| TailError::Pulsar {
            url: cfg.url.clone(),
            why: format!("cannot start the async runtime: {e}"),
        })?;
    rt.block_on(tail(cfg, interrupt))
}

/// Counts at the end of a tail.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TailSummary {
    pub buckets: u64,
    pub complete: u64,
    pub frames: u64,
    pub late: u64,
}

async fn tail(cfg: &TailConfig, interrupt: &Interrupt) -> Result<TailSummary, TailError> {
    let perr = |why: String| TailError::Pulsar {
        url: cfg.url.clone(),
        why,
    };
    let (pulsar, _bridge) = tokio::select! {
        r = open(&cfg.url, &cfg.access) => r.map_err(perr)?,
        _ = interrupt.wait() => return Ok(TailSummary::default()),
    };
    let subscription = format!(
        "rigd-tail-{}-{:x}",
        std::process::id(),
        rigd_drivers::realtime_ns() as u64 & 0xffff_ffff
    );
    let options = ConsumerOptions::default()
        .durable(false)
        .with_initial_position(if cfg.from_earliest {
            InitialPosition::Earliest
        } else {
            InitialPosition::Latest
        });
    let builder = pulsar
        .consumer()
        .with_subscription(subscription)
        .with_subscription_type(SubType::KeyShared)
        .with_consumer_name(format!("rigd-tail-{}", cfg.rig))
        .with_options(options);
    let builder = rig_topics(builder, &cfg.topic, &cfg.rig, &cfg.sources).map_err(|why| {
        TailError::Template {
            template: cfg.topic.clone(),
            why,
        }
    })?;
    let mut consumer: Consumer<Vec<u8>, TokioExecutor> = tokio::select! {
        r = builder.build() => r.map_err(|e| perr(format!("cannot subscribe: {e}")))?,
        _ = interrupt.wait() => return Ok(TailSummary::default()),
    };
    let mut asm = Assembler::new(&cfg.sources, cfg.lag);
    let mut summary = TailSummary::default();
    let mut out = std::io::stdout().lock();
    let mut last_message = Instant::now();
    let mut emit = |lines: Vec<BucketLine>, summary: &mut TailSummary| -> Result<bool, TailError> {
        for l in lines {
            let text = if cfg.json {
                serde_json::to_string(&l).unwrap_or_default()
            } else {
                format_line(&l)
            };
            writeln!(out, "{text}").map_err(TailError::Output)?;
            summary.buckets += 1;
            summary.complete += u64::from(l.complete);
            if cfg.max_buckets.is_some_and(|m| summary.buckets >= m) {
                out.flush().map_err(TailError::Output)?;
                return Ok(true);
            }
        }
        out.flush().map_err(TailError::Output)?;
        Ok(false)
    };
    loop {
        let next = tokio::select! {
            m = consumer.next() => m,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                if last_message.elapsed() > Duration::from_secs(1) && emit(asm.flush(), &mut summary)? {
                    break;
                }
                if interrupt.is_set() {
                    break;
                }
                continue;
            }
            _ = interrupt.wait() => break,
        };
        let msg = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "tail: consumer error");
                continue;
            }
            None => break,
        };
        last_message = Instant::now();
        let hit = Hit::from_properties(
            &cfg.rig,
            msg.metadata()
                .properties
                .iter()
                .map(|kv| (kv.key.as_str(), kv.value.as_str())),
        );
        if let Err(e) = consumer.ack(&msg).await {
            tracing::debug!(error = %e, "tail: ack failed");
        }
        // On a topic per modality the other sources' frames come too.
        let Some(hit) = hit.filter(|h| cfg.sources.is_empty() || cfg.sources.contains(&h.source))
        else {
            continue;
        };
        summary.frames += 1;
        if emit(asm.add(hit), &mut summary)? {
            break;
        }
    }
    if cfg.max_buckets.is_none_or(|m| summary.buckets < m) {
        emit(asm.flush(), &mut summary)?;
    }
    summary.late = asm.late;
    let _ = consumer.close().await;
    Ok(summary)
}

/// "the broker is unreachable (...)" with what is known of why. Over TLS the `pulsar` crate
/// reports a refused handshake only as "fatal error when connecting to the Pulsar server", so a
/// handshake of our own with the first broker says which side refused: the broker's certificate
/// (not signed by a CA of --tls-ca, or the Mozilla roots without it), or ours (a broker that
/// requires a client certificate, or refuses the one given).
pub(crate) async fn unreachable(url: &str, access: &Access, why: &str) -> String {
    let mut line = format!("the broker is unreachable ({why}");
    let tls = tls_diagnosis(url, access).await;
    if let Some(d) = &tls {
        line += &format!("; TLS: {d}");
    }
    line.push(')');
    let d = tls.unwrap_or_default().to_lowercase();
    if d.contains("issuer") || d.contains("invalid peer certificate") {
        line += if access.tls_ca.is_some() {
            ": --tls-ca does not name the CA that signed the broker's certificate"
        } else {
            ": the broker's certificate is not signed by a CA of the Mozilla roots; give its CA with --tls-ca"
        };
    } else if d.contains("certificate") && access.tls_client.is_none() {
        line += ": it requires a client certificate (mutual TLS): give --tls-cert-file and --tls-key-file";
    } else if d.contains("certificate") {
        line += ": it refuses the client certificate given (--tls-cert-file)";
    }
    line
}

/// Why a TLS session with the first broker of `url` does not open, from a handshake of our own
/// (`None`: not TLS, no TCP connection, or it opens).
async fn tls_diagnosis(url: &str, access: &Access) -> Option<String> {
    use tokio::io::AsyncReadExt;
    if !url.starts_with("pulsar+ssl://") {
        return None;
    }
    let ep = crate::service::Endpoint::parse_service(url)
        .ok()?
        .into_iter()
        .next()?;
    let client = access
        .tls_client
        .as_ref()
        .map(|(c, k)| (c.as_path(), k.as_path()));
    let config = match crate::uplink::tls_config(access.tls_ca.as_deref(), client) {
        Ok(c) => c,
        Err(e) => return Some(e),
    };
    let wait = Duration::from_secs(5);
    let tcp = tokio::time::timeout(wait, tokio::net::TcpStream::connect(ep.addr()))
        .await
        .ok()?
        .ok()?;
    let name = rustls_pki_types::ServerName::try_from(ep.host.clone()).ok()?;
    let connect = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
    let mut session = match tokio::time::timeout(wait, connect).await.ok()? {
        Ok(s) => s,
        Err(e) => return Some(e.to_string()),
    };
    // TLS 1.3: the broker judges the client's certificate after the handshake and says so in
    // an alert, the first thing it sends (a Pulsar broker says nothing before CONNECT).
    let mut byte = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(2), session.read(&mut byte)).await {
        Ok(Err(e)) => Some(e.to_string()),
        _ => None,
    }
}

/// A connected client for `url` with `access` within [`CONNECT_TIMEOUT`], or why not: a flag's
/// file that does not load, or the broker unreachable with [`unreachable`]'s diagnosis. The
/// bridge (if any) lives as long as the returned value.
pub(crate) async fn open(
    url: &str,
    access: &Access,
) -> Result<(Pulsar<TokioExecutor>, Option<bridge::Bridge>), String> {
    let (builder, bridge) = connect(url, access).await?;
    let why = tokio::select! {
        r = builder.build() => match r {
            Ok(p) => return Ok((p, bridge)),
            Err(e) => e.to_string(),
        },
        _ = tokio::time::sleep(CONNECT_TIMEOUT) => {
            format!("no connection in {} s", CONNECT_TIMEOUT.as_secs())
        }
    };
    Err(unreachable(url, access, &why).await)
}

/// A client of the `pulsar` crate for `url` with `access`. With a client certificate (which the
/// crate cannot present) the client talks to a [`bridge::Bridge`] that does the TLS with it; the
/// bridge lives as long as the returned value. A file that does not load is an error naming the
/// flag.
pub(crate) async fn connect(
    url: &str,
    access: &Access,
) -> Result<(PulsarBuilder<TokioExecutor>, Option<bridge::Bridge>), String> {
    // Reconnects within CONNECT_TIMEOUT (0.1 s doubling to 2 s, with the crate's jitter, 6
    // times: 5 to 10 s of refused connections), then the crate gives up with the reason: an
    // offline tool says the broker is unreachable instead of retrying for minutes.
    let retry = pulsar::ConnectionRetryOptions {
        min_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(2),
        max_retries: 6,
        connection_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let Some((cert, key)) = &access.tls_client else {
        return client(url, access.token.clone(), access.tls_ca.as_deref())
            .map(|b| (b.with_connection_retry_options(retry), None))
            .map_err(|e| format!("--tls-ca {e}"));
    };
    if !url.starts_with("pulsar+ssl://") {
        return Err(
            "a client certificate goes with a pulsar+ssl:// URL (a clear pulsar:// link is neither encrypted nor authenticated by certificate)".into(),
        );
    }
    let tls = crate::uplink::tls_config(access.tls_ca.as_deref(), Some((cert, key)))
        .map_err(|e| format!("--tls-ca/--tls-cert-file/--tls-key-file: {e}"))?;
    let (bridge, local) = bridge::Bridge::start(url, tls).await?;
    let mut builder =
        client(&local, access.token.clone(), None)?.with_connection_retry_options(retry);
    if access.token.is_none() {
        // The certificate is the identity: the broker's TLS provider takes the role from it.
        builder = builder.with_auth(Authentication {
            name: "tls".into(),
            data: Vec::new(),
        });
    }
    Ok((builder, Some(bridge)))
}

/// A client of the `pulsar` crate: the token, if any, and for `pulsar+ssl://` the CA
/// certificates to trust (default: the Mozilla roots).
pub(crate) fn client(
    url: &str,
    token: Option<String>,
    tls_ca: Option<&std::path::Path>,
) -> Result<PulsarBuilder<TokioExecutor>, String> {
    let mut builder = Pulsar::builder(url.to_string(), TokioExecutor);
    if let Some(t) = token {
        builder = builder.with_auth(Authentication {
            name: "token".into(),
            data: t.into_bytes(),
        });
    }
    if let Some(ca) = tls_ca {
        builder = builder
            .with_certificate_chain_file(ca)
            .map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(source: &str, modality: &str, seq: u64, capture_ms: i64) -> Hit {
        Hit {
            source: source.into(),
            modality: modality.into(),
            seq,
            capture_ns: capture_ms * 1_000_000 + 5,
            bucket: capture_ms / 33,
            bucket_ms: 33,
        }
    }

    #[test]
    fn buckets_are_reported_after_the_lag_with_what_arrived() {
        let mut a = Assembler::new(&[], 2);
        assert!(a.add(hit("mic", "audio", 0, 33)).is_empty());
        assert!(a.add(hit("cam", "camera", 0, 40)).is_empty());
        assert!(a.add(hit("cam", "camera", 0, 40)).is_empty(), "a duplicate");
        assert!(a.add(hit("gps", "serial", 0, 50)).is_empty());
        assert!(a.add(hit("mic", "audio", 1, 66)).is_empty());
        let lines = a.add(hit("mic", "audio", 2, 99));
        assert_eq!(lines.len(), 1);
        let l = &lines[0];
        assert_eq!(l.bucket, 1);
        assert_eq!(l.bucket_start_ns, 33_000_000);
        assert!(l.complete);
        assert_eq!(l.modalities, vec!["audio", "camera", "serial"]);
        assert_eq!(l.sources["cam"].frames, 1);
        assert_eq!(l.skew_ns, 17_000_000);
        // Bucket 2 had only the microphone: the others are missing.
        let lines = a.add(hit("mic", "audio", 3, 132));
        assert_eq!(lines[0].bucket, 2);
        assert_eq!(lines[0].missing, vec!["cam", "gps"]);
        assert!(format_line(&lines[0]).contains("MISSING cam,gps"));
        // Late for a reported bucket.
        assert!(a.add(hit("cam", "camera", 1, 70)).is_empty());
        assert_eq!(a.late, 1);
        let rest = a.flush();
        assert_eq!(
            rest.iter().map(|l| l.bucket).collect::<Vec<_>>(),
            vec![3, 4]
        );
    }

    #[test]
    fn expected_sources_can_be_fixed() {
        let mut a = Assembler::new(&["cam".to_string(), "mic".to_string()], 0);
        let lines = a.add(hit("mic", "audio", 0, 0));
        assert_eq!(lines[0].missing, vec!["cam"]);
    }

    #[test]
    fn only_the_rigs_frames_count() {
        let props = [
            ("rig", "van-07"),
            ("source", "cam"),
            ("modality", "camera"),
            ("seq", "4"),
            ("capture-ns", "99"),
            ("bucket", "0"),
            ("bucket-ms", "33"),
        ];
        let h = Hit::from_properties("van-07", props).unwrap();
        assert_eq!((h.seq, h.capture_ns), (4, 99));
        assert!(Hit::from_properties("van-08", props).is_none());
    }

    #[test]
    fn the_topic_template_becomes_a_pattern() {
        let (re, ns) = topic_pattern("persistent://public/rigs/{rig}-{source}", "van-07").unwrap();
        assert_eq!(ns, "public/rigs");
        assert!(re.is_match("persistent://public/rigs/van-07-front"));
        assert!(!re.is_match("persistent://public/rigs/van-070-front"));
        assert!(!re.is_match("persistent://public/rigs/van-07-front-partition-0x/y"));
        assert!(re.is_match("persistent://public/rigs/van-07-front-partition-3"));
        let (re, ns) = topic_pattern("persistent://ai/ingest/{modality}", "van-07").unwrap();
        assert_eq!(ns, "ai/ingest");
        assert!(re.is_match("persistent://ai/ingest/camera"));
        assert!(re.is_match("persistent://ai/ingest/serial-partition-0"));
        assert!(!re.is_match("persistent://ai/ingest/lidar"));
        assert!(topic_pattern("public/{rig}", "x").is_err());
        assert!(topic_pattern("persistent://a/b/{rig}", "x").is_err());
    }
}
