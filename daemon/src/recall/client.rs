//! `rigd recall`: the operator's side of the control protocol. Subscribes to the rig's status
//! topic first (non-durable, from its end), then sends one request to the control topic and
//! follows the answers with its id: a progress bar, or one JSON line per answer.

use futures::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::{Consumer, Pulsar, TokioExecutor};
use std::time::Duration;

use super::protocol::{Answer, State};
use crate::progress::{Interrupt, Progress};

/// What to ask.
#[derive(Debug, Clone)]
pub enum Ask {
    Upload {
        sources: Vec<String>,
        from: i64,
        to: i64,
        force: bool,
    },
    Coverage,
    Cancel {
        id: String,
    },
}

#[derive(Debug, Clone)]
pub struct RecallConfig {
    pub url: String,
    pub control_topic: String,
    pub access: crate::tail::Access,
    pub ask: Ask,
    /// The request's id (default: a fresh random one).
    pub id: Option<String>,
    /// Follow an upload to its end (otherwise: until it is accepted or rejected).
    pub wait: bool,
    pub json: bool,
    /// Give up after this long without the awaited answer.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RecallError {
    #[error("{url}: {why}")]
    Pulsar { url: String, why: String },
    /// `why`: [`crate::tail::unreachable`]'s line.
    #[error("{url}: {why}; nothing was sent to the rig")]
    Unreachable { url: String, why: String },
    #[error("no answer from the rig in {0} s: the request is on its control topic, where the rig reads it once it runs and is connected (is it? its web page says)")]
    Timeout(u64),
    #[error("{}", match .0 {
        Some(id) => format!("interrupted; the request stays with the rig (cancel it with --cancel {id})"),
        None => "interrupted before the request was sent".to_string(),
    })]
    Interrupted(Option<String>),
}

/// Sends the request and follows it; returns the last answer seen.
pub fn run(cfg: &RecallConfig, interrupt: &Interrupt) -> Result<Answer, RecallError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RecallError::Pulsar {
            url: cfg.url.clone(),
            why: format!("cannot start the async runtime: {e}"),
        })?;
    rt.block_on(recall(cfg, interrupt))
}

/// A request id: 128 random bits as a UUID (version 4 layout).
pub fn new_id() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if random.is_err() {
        // No /dev/urandom: the time and the pid (unique enough for one operator's requests).
        b[..8].copy_from_slice(&rigd_drivers::realtime_ns().to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The request's JSON.
pub fn request(id: &str, ask: &Ask) -> serde_json::Value {
    match ask {
        Ask::Upload {
            sources,
            from,
            to,
            force,
        } => serde_json::json!({
            "op": "upload", "id": id, "sources": sources, "from": from, "to": to, "force": force,
        }),
        Ask::Coverage => serde_json::json!({"op": "coverage", "id": id}),
        Ask::Cancel { id } => serde_json::json!({"op": "cancel", "id": id}),
    }
}

async fn recall(cfg: &RecallConfig, interrupt: &Interrupt) -> Result<Answer, RecallError> {
    let id = match &cfg.ask {
        Ask::Cancel { id } => id.clone(),
        _ => cfg.id.clone().unwrap_or_else(new_id),
    };
    let body = serde_json::to_vec(&request(&id, &cfg.ask)).expect("a request serializes");
    let link = Link {
        url: &cfg.url,
        control_topic: &cfg.control_topic,
        access: &cfg.access,
        timeout: cfg.timeout,
    };
    let mut bar: Option<Progress> = None;
    let mut last: Option<Answer> = None;
    let said = (!cfg.json).then_some("recall");
    let end = converse(&link, &id, body, said, interrupt, |a| {
        if cfg.json {
            println!(
                "{}",
                serde_json::to_string(a).expect("an answer serializes")
            );
        } else if let (Some(total), Some(sent)) = (a.total, a.sent) {
            let b = bar.get_or_insert_with(|| Progress::new(total.bytes, "recall"));
            b.set_message(format!(
                "{} of {} frames sent{}",
                sent.frames,
                total.frames,
                a.already_sent
                    .filter(|&n| n > 0)
                    .map(|n| format!(", {n} sent before"))
                    .unwrap_or_default()
            ));
            b.inc(sent.bytes.saturating_sub(b_bytes(&last)));
        }
        last = Some(a.clone());
        a.state.is_final() || (!cfg.wait && a.state == State::Accepted)
    })
    .await;
    if let Some(b) = bar {
        b.finish();
    }
    end
}

/// Where an operator's control message goes, and how long the rig may take to answer.
pub struct Link<'a> {
    pub url: &'a str,
    pub control_topic: &'a str,
    pub access: &'a crate::tail::Access,
    pub timeout: Duration,
}

/// Subscribes to the status topic (from its end), sends `body` to the control topic (said on
/// stderr as `rigd {tool}: ...` when `tool` is given) and hands each answer keyed `id` to `each`
/// until it says settled (true); returns that answer. Shared by `rigd recall` and `rigd campaign`.
pub async fn converse(
    link: &Link<'_>,
    id: &str,
    body: Vec<u8>,
    tool: Option<&str>,
    interrupt: &Interrupt,
    mut each: impl FnMut(&Answer) -> bool,
) -> Result<Answer, RecallError> {
    let url = link.url.to_string();
    let perr = |why: String| RecallError::Pulsar {
        url: url.clone(),
        why,
    };
    let status_topic = format!("{}-status", link.control_topic);
    let (builder, _bridge) = crate::tail::connect(link.url, link.access)
        .await
        .map_err(perr)?;
    // Connecting has a deadline of its own: --timeout is how long the rig may take to answer.
    let connect_within = link.timeout.min(crate::tail::CONNECT_TIMEOUT);
    let failed = tokio::select! {
        r = builder.build() => match r {
            Ok(p) => Ok(p),
            Err(e) => Err(e.to_string()),
        },
        _ = tokio::time::sleep(connect_within) => {
            Err(format!("no connection in {} s", connect_within.as_secs()))
        }
        _ = interrupt.wait() => return Err(RecallError::Interrupted(None)),
    };
    let pulsar: Pulsar<TokioExecutor> = match failed {
        Ok(p) => p,
        Err(why) => {
            return Err(RecallError::Unreachable {
                url: url.clone(),
                why: crate::tail::unreachable(link.url, link.access, &why).await,
            })
        }
    };
    let deadline = tokio::time::sleep(link.timeout);
    tokio::pin!(deadline);
    // Subscribed before the request goes out, so no answer is missed.
    let mut answers: Consumer<Vec<u8>, TokioExecutor> = pulsar
        .consumer()
        .with_topic(&status_topic)
        .with_subscription(format!(
            "rigd-recall-{}-{:x}",
            std::process::id(),
            rigd_drivers::realtime_ns() as u64 & 0xffff_ffff
        ))
        .with_subscription_type(SubType::Exclusive)
        .with_options(
            ConsumerOptions::default()
                .durable(false)
                .with_initial_position(InitialPosition::Latest),
        )
        .build()
        .await
        .map_err(|e| perr(format!("cannot subscribe to {status_topic}: {e}")))?;
    let mut producer = pulsar
        .producer()
        .with_topic(link.control_topic)
        .build()
        .await
        .map_err(|e| perr(format!("cannot publish to {}: {e}", link.control_topic)))?;
    producer
        .send_non_blocking(body)
        .await
        .map_err(|e| perr(format!("sending the request: {e}")))?
        .await
        .map_err(|e| perr(format!("sending the request: {e}")))?;
    if let Some(tool) = tool {
        eprintln!("rigd {tool}: request {id} sent to {}", link.control_topic);
    }
    loop {
        let m = tokio::select! {
            m = answers.next() => m,
            _ = &mut deadline => return Err(RecallError::Timeout(link.timeout.as_secs())),
            _ = interrupt.wait() => return Err(RecallError::Interrupted(Some(id.to_string()))),
        };
        let msg = match m {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(perr(format!("reading answers: {e}"))),
            None => return Err(perr("the answer stream ended".to_string())),
        };
        let _ = answers.ack(&msg).await;
        let Ok(a) = serde_json::from_slice::<Answer>(&msg.payload.data) else {
            continue;
        };
        if a.id != id {
            continue;
        }
        if each(&a) {
            let _ = answers.close().await;
            return Ok(a);
        }
    }
}

fn b_bytes(last: &Option<Answer>) -> u64 {
    last.as_ref().and_then(|a| a.sent).map_or(0, |s| s.bytes)
}

/// The answer for a person: one line, and one per source for coverage or what is missing.
pub fn describe(a: &Answer) -> String {
    let mut out = format!("{}: {}", a.id, format!("{:?}", a.state).to_lowercase());
    if let (Some(sent), Some(total)) = (a.sent, a.total) {
        out.push_str(&format!(
            ", {} frames ({} bytes) sent of {} in the range",
            sent.frames, sent.bytes, total.frames
        ));
    }
    if let Some(n) = a.already_sent.filter(|&n| n > 0) {
        out.push_str(&format!(", {n} already sent by earlier requests"));
    }
    if let Some(r) = &a.reason {
        out.push_str(&format!(": {r}"));
    }
    for k in &a.from_keyframe {
        out.push_str(&format!(
            "\n  {}: the range starts inside a group of pictures; sent from its keyframe, captured {}",
            k.source,
            crate::civil::format(k.from)
        ));
    }
    for m in &a.missing {
        for s in &m.evicted {
            out.push_str(&format!(
                "\n  {}: no longer held from {} to {}",
                m.source,
                crate::civil::format(s.from),
                crate::civil::format(s.to)
            ));
        }
        if m.unreadable > 0 {
            out.push_str(&format!(
                "\n  {}: {} frames unreadable or refused",
                m.source, m.unreadable
            ));
        }
    }
    for h in &a.sources {
        out.push_str(&format!(
            "\n  {}: {} frames, {} bytes",
            h.source, h.frames, h.bytes
        ));
        for s in &h.held {
            out.push_str(&format!(
                "\n    {} .. {}",
                crate::civil::format(s.from),
                crate::civil::format(s.to)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_names_a_range_moved_back_to_its_keyframe() {
        let mut a = Answer::new("r1", "rig", State::Done, 0);
        assert!(!describe(&a).contains("keyframe"));
        a.from_keyframe = vec![super::super::protocol::FromKeyframe {
            source: "cam".into(),
            from: 1_700_000_000_000_000_000,
        }];
        let said = describe(&a);
        assert!(
            said.contains("cam: the range starts inside a group of pictures; sent from its keyframe, captured 2023-11-14T22:13:20"),
            "{said}"
        );
    }

    #[test]
    fn ids_are_uuids_the_rig_accepts() {
        let id = new_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(super::super::protocol::valid_id(&id).is_ok());
        assert_ne!(id, new_id());
    }

    #[test]
    fn requests_are_what_the_rig_parses() {
        let sources = vec![("front".to_string(), true)];
        let ask = Ask::Upload {
            sources: vec!["front".into()],
            from: 10,
            to: 20,
            force: false,
        };
        let body = serde_json::to_vec(&request("r-1", &ask)).unwrap();
        let parsed = super::super::protocol::parse(&body, sources.as_slice(), 0).unwrap();
        assert!(
            matches!(parsed, super::super::protocol::Request::Upload(u) if u.from == 10 && u.to == 20)
        );
    }
}
