//! `rigd fleet coverage` and `rigd fleet recall`: the operator's side. The coverage topic is read
//! from its earliest entry with `readCompacted` (the `pulsar` crate's `ConsumerOptions::
//! read_compacted`: a compacted topic gives the latest digest per rig, then whatever came after
//! the compaction), keeping the latest per key in any case, up to the topic's last message at
//! the start; then [`super::query`] answers. `recall` turns each rig's answer into recall
//! requests ([`crate::recall::client`], what `rigd recall` sends) and follows them.

use futures::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::{Consumer, TokioExecutor};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::digest::Digest;
use super::query::{self, Hit, Query};
use crate::recall::client::{self, Ask, RecallConfig};
use crate::recall::protocol::{Span, State, MAX_RANGE_NS};

/// The coverage topic's default (`[pulsar] coverage-topic`'s with the default topic template).
pub const DEFAULT_TOPIC: &str = "persistent://public/default/rigd-coverage";

/// `--near LAT,LON,RADIUS_M`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Near {
    pub lat: f64,
    pub lon: f64,
    pub radius_m: f64,
}

/// Parses `--near`.
pub fn parse_near(s: &str) -> Result<Near, String> {
    let v: Vec<f64> = s
        .split(',')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{s:?}: expected LAT,LON,RADIUS_M (degrees, degrees, metres)"))?;
    match v.as_slice() {
        [lat, lon, r]
            if (-90.0..=90.0).contains(lat)
                && (-180.0..=180.0).contains(lon)
                && r.is_finite()
                && *r > 0.0 =>
        {
            Ok(Near {
                lat: *lat,
                lon: *lon,
                radius_m: *r,
            })
        }
        _ => Err(format!(
            "{s:?}: expected LAT,LON,RADIUS_M with latitude -90..90, longitude -180..180, radius > 0"
        )),
    }
}

/// The query, as `rigd fleet coverage` and `rigd fleet recall` take it.
#[derive(Debug, Clone, clap::Args)]
pub struct QueryArgs {
    /// Only rigs whose track puts them within RADIUS_M metres of LAT,LON (degrees) ...
    #[arg(long, value_name = "LAT,LON,RADIUS_M", value_parser = parse_near, allow_hyphen_values = true)]
    pub near: Option<Near>,
    /// ... at or after T (RFC 3339, or unix nanoseconds) ...
    #[arg(long, value_name = "T", value_parser = crate::civil::parse)]
    pub from: Option<i64>,
    /// ... and before T.
    #[arg(long, value_name = "T", value_parser = crate::civil::parse)]
    pub to: Option<i64>,
    /// Only this source (repeatable; default: every source).
    #[arg(long = "source", value_name = "S")]
    pub sources: Vec<String>,
    /// JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The fleet's coverage topic (`pulsar.coverage-topic`).
    #[arg(long, value_name = "TOPIC", default_value = DEFAULT_TOPIC)]
    pub topic: String,
}

impl QueryArgs {
    pub fn query(&self) -> Result<Query, String> {
        if let (Some(f), Some(t)) = (self.from, self.to) {
            if f >= t {
                return Err("--from must be before --to".into());
            }
        }
        Ok(Query {
            near: self.near.map(|n| (n.lat, n.lon, n.radius_m)),
            from: self.from,
            to: self.to,
            sources: self.sources.clone(),
        })
    }
}

/// `rigd fleet recall`'s own flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RecallOpts {
    /// The rigs' control topic (`pulsar.control-topic`, with {rig}).
    #[arg(
        long,
        value_name = "TOPIC",
        default_value = "persistent://public/default/{rig}-control"
    )]
    pub control_topic: String,
    /// Send again frames an earlier request already sent.
    #[arg(long)]
    pub force: bool,
    /// Give up on a request after this many seconds without its final answer.
    #[arg(long, value_name = "S", default_value_t = 600)]
    pub timeout: u64,
}

/// What the topic gave.
#[derive(Debug, Default)]
pub struct Read {
    /// The latest digest per rig.
    pub digests: Vec<Digest>,
    /// Messages read (more than rigs when the topic is not compacted yet).
    pub messages: u64,
    /// Messages that are not digests this rigd reads (skipped, counted).
    pub unreadable: u64,
}

/// Reads the coverage topic: the latest digest per key, up to the last message at the start.
pub async fn read(
    url: &str,
    access: &crate::tail::Access,
    topic: &str,
    timeout: Duration,
) -> Result<Read, String> {
    let (pulsar, _bridge) = crate::tail::open(url, access).await?;
    let mut consumer: Consumer<Vec<u8>, TokioExecutor> = pulsar
        .consumer()
        .with_topic(topic)
        .with_subscription(format!(
            "rigd-fleet-{}-{:x}",
            std::process::id(),
            rigd_drivers::realtime_ns() as u64 & 0xffff_ffff
        ))
        .with_subscription_type(SubType::Exclusive)
        .with_options(
            ConsumerOptions::default()
                .durable(false)
                .read_compacted(true)
                .with_initial_position(InitialPosition::Earliest),
        )
        .build()
        .await
        .map_err(|e| format!("cannot read {topic}: {e}"))?;
    let last = consumer
        .get_last_message_id()
        .await
        .map_err(|e| format!("{topic}: its last message: {e}"))?
        .pop();
    let mut out = Read::default();
    let mut latest: BTreeMap<String, Digest> = BTreeMap::new();
    // An empty topic's last id is (-1, -1).
    let end = last
        .filter(|l| l.ledger_id != u64::MAX && l.entry_id != u64::MAX)
        .map(|l| (l.ledger_id, l.entry_id));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    while let Some(end) = end {
        let m = tokio::select! {
            m = consumer.next() => m,
            _ = &mut deadline => return Err(format!(
                "{topic}: not read to its end in {} s ({} messages)", timeout.as_secs(), out.messages)),
        };
        let msg = match m {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(format!("reading {topic}: {e}")),
            None => break,
        };
        out.messages += 1;
        let id = msg.message_id();
        let at = (id.ledger_id, id.entry_id);
        match Digest::decode(&msg.payload.data) {
            // Keyed by the rig: the latest wins, as compaction would keep it.
            Ok(d) => {
                let key = msg.key().unwrap_or_else(|| d.rig.clone());
                latest.insert(key, d);
            }
            Err(_) => out.unreadable += 1,
        }
        if at >= end {
            break;
        }
    }
    let _ = consumer.close().await;
    out.digests = latest.into_values().collect();
    Ok(out)
}

/// The answer as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Answer {
    pub digests: usize,
    pub messages: u64,
    pub unreadable: u64,
    /// Reading the topic and answering, ms.
    pub read_ms: u64,
    pub query_ms: u64,
    pub rigs: Vec<Hit>,
}

/// Reads and answers.
pub async fn coverage(
    url: &str,
    access: &crate::tail::Access,
    args: &QueryArgs,
    q: &Query,
) -> Result<Answer, String> {
    let started = Instant::now();
    let read = read(url, access, &args.topic, Duration::from_secs(60)).await?;
    let read_ms = started.elapsed().as_millis() as u64;
    let started = Instant::now();
    let rigs: Vec<Hit> = read
        .digests
        .iter()
        .filter_map(|d| query::answer(d, q))
        .collect();
    Ok(Answer {
        digests: read.digests.len(),
        messages: read.messages,
        unreadable: read.unreadable,
        read_ms,
        query_ms: started.elapsed().as_millis() as u64,
        rigs,
    })
}

/// The table for a person.
pub fn table(a: &Answer) -> String {
    let mut out = format!(
        "{:<20} {:<12} {:<30} {:<30}\n",
        "RIG", "SOURCE", "FROM", "TO"
    );
    for h in &a.rigs {
        for s in &h.sources {
            for r in &s.ranges {
                out.push_str(&format!(
                    "{:<20} {:<12} {:<30} {:<30}{}\n",
                    h.rig,
                    s.source,
                    crate::civil::format(r.from),
                    crate::civil::format(r.to),
                    if s.coarse { " (coarse)" } else { "" }
                ));
            }
        }
    }
    out.push_str(&format!(
        "{} rigs of {} hold it ({} messages read in {} ms)",
        a.rigs.len(),
        a.digests,
        a.messages,
        a.read_ms + a.query_ms
    ));
    out
}

/// One recall request that a rig's answer makes: one per stretch of time (the union of its
/// sources' ranges, at most the protocol's 24 h), naming the sources that hold part of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub rig: String,
    pub sources: Vec<String>,
    pub from: i64,
    pub to: i64,
}

/// The requests for a rig's answer.
pub fn requests(hit: &Hit) -> Vec<Request> {
    let all = super::digest::merge(
        hit.sources
            .iter()
            .flat_map(|s| s.ranges.iter().copied())
            .collect(),
    );
    let mut out = Vec::new();
    for span in all {
        let mut from = span.from;
        while from < span.to {
            let to = span.to.min(from.saturating_add(MAX_RANGE_NS));
            let piece = [Span { from, to }];
            let sources = hit
                .sources
                .iter()
                .filter(|s| !query::intersect(&s.ranges, &piece).is_empty())
                .map(|s| s.source.clone())
                .collect();
            out.push(Request {
                rig: hit.rig.clone(),
                sources,
                from,
                to,
            });
            from = to;
        }
    }
    out
}

/// Sends every rig's requests (the rigs side by side, each rig's one after the other) and follows
/// each to its final answer; true when every one is `done`.
pub fn recall(
    url: &str,
    access: &crate::tail::Access,
    hits: &[Hit],
    opts: &RecallOpts,
    json: bool,
    interrupt: &crate::progress::Interrupt,
) -> bool {
    let per_rig: Vec<Vec<Request>> = hits.iter().map(requests).collect();
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for reqs in &per_rig {
            let results = &results;
            scope.spawn(move || {
                for r in reqs {
                    let cfg = RecallConfig {
                        url: url.to_string(),
                        control_topic: opts.control_topic.replace("{rig}", &r.rig),
                        access: access.clone(),
                        ask: Ask::Upload {
                            sources: r.sources.clone(),
                            from: r.from,
                            to: r.to,
                            force: opts.force,
                        },
                        id: None,
                        wait: true,
                        json,
                        timeout: Duration::from_secs(opts.timeout),
                    };
                    let said = client::run(&cfg, interrupt);
                    let ok = matches!(&said, Ok(a) if a.state == State::Done);
                    let line = match &said {
                        Ok(a) => client::describe(a),
                        Err(e) => e.to_string(),
                    };
                    if !json {
                        eprintln!(
                            "rigd fleet recall: {} {} {} .. {}: {line}",
                            r.rig,
                            r.sources.join(","),
                            crate::civil::format(r.from),
                            crate::civil::format(r.to)
                        );
                    }
                    results.lock().unwrap_or_else(|p| p.into_inner()).push(ok);
                    if interrupt.is_set() {
                        break;
                    }
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.iter().all(|&ok| ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::query::SourceHit;

    #[test]
    fn near_parses_and_refuses_what_is_not_a_place() {
        assert_eq!(
            parse_near("48.137,-11.5,250").unwrap(),
            Near {
                lat: 48.137,
                lon: -11.5,
                radius_m: 250.0
            }
        );
        for bad in [
            "48,11",
            "91,11,5",
            "48,181,5",
            "48,11,0",
            "48,11,x",
            "48,11,5,6",
        ] {
            assert!(parse_near(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_rigs_answer_becomes_one_request_per_stretch_naming_the_sources_in_it() {
        const S: i64 = 1_000_000_000;
        let span = |f: i64, t: i64| Span {
            from: f * S,
            to: t * S,
        };
        let hit = Hit {
            rig: "van-07".into(),
            digest_at: 0,
            there: None,
            sources: vec![
                SourceHit {
                    source: "cam".into(),
                    ranges: vec![span(0, 10), span(20, 30)],
                    coarse: false,
                },
                SourceHit {
                    source: "mic".into(),
                    ranges: vec![span(5, 12)],
                    coarse: false,
                },
            ],
        };
        let r = requests(&hit);
        assert_eq!(
            r,
            vec![
                Request {
                    rig: "van-07".into(),
                    sources: vec!["cam".into(), "mic".into()],
                    from: 0,
                    to: 12 * S
                },
                Request {
                    rig: "van-07".into(),
                    sources: vec!["cam".into()],
                    from: 20 * S,
                    to: 30 * S
                },
            ]
        );
        // Two days: cut at 24 h.
        let long = Hit {
            sources: vec![SourceHit {
                source: "cam".into(),
                ranges: vec![span(0, 48 * 3600)],
                coarse: false,
            }],
            ..hit
        };
        assert_eq!(requests(&long).len(), 2);
    }
}
