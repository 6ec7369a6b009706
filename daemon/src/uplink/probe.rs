//! What a topic itself holds: the sequence id of its last stored message, read back with a
//! non-durable reader. Used once per process, at the first producer creation, when the broker
//! reports no last sequence id for the producer name although the spool may hold frames of an
//! earlier run: the broker forgets a producer's deduplication state after
//! `brokerDeduplicationProducerInactivityTimeoutMinutes` (6 h by default: a vehicle parked
//! overnight), and keeps none when deduplication is off. The topic's last message is what was
//! persisted, so frames of the earlier run up to it are not sent twice.

use futures::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::message::proto::MessageIdData;
use pulsar::{Authentication, Consumer, Pulsar, PulsarBuilder, TokioExecutor};
use std::path::Path;
use std::time::Duration;

use super::connect::Token;
use super::plan::BrokerLast;

/// A client of the `pulsar` crate (the probe's and `rigd tail`'s): the token, if any, and for
/// `pulsar+ssl://` the CA certificates to trust (default: the Mozilla roots).
pub fn client(
    url: &str,
    token: Option<String>,
    tls_ca: Option<&Path>,
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

/// The highest sequence id of the topic's last message (a batch's highest) and, for a chunk, the
/// number of chunks of its frame; None for a topic without messages. Errors name what failed; the
/// caller then trusts the broker's answer alone.
/// A last message from another producer name (a source's epochs share the topic, see
/// `spool::split`) says nothing about this producer's frames: an error.
pub async fn last_sequence_id(
    url: &str,
    topic: &str,
    producer_name: &str,
    token: &Token,
    tls_ca: Option<&Path>,
) -> Result<Option<BrokerLast>, String> {
    let token = token.current().map_err(|e| e.to_string())?;
    let pulsar: Pulsar<TokioExecutor> = client(url, token, tls_ca)?
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let subscription = format!(
        "rigd-probe-{}-{:x}",
        std::process::id(),
        rigd_drivers::realtime_ns() as u64 & 0xffff_ffff
    );
    let last = last_message_id(&pulsar, topic, &subscription, None).await?;
    // An empty topic answers -1:-1.
    let Some(last) = last.filter(|id| id.ledger_id != u64::MAX && id.entry_id != u64::MAX) else {
        return Ok(None);
    };
    // A non-durable subscription started at an entry delivers that entry first (measured on
    // Pulsar 3.0.7: starting one entry earlier read the previous message and resent the last).
    let at = MessageIdData {
        batch_index: None,
        ..last
    };
    let mut reader: Consumer<Vec<u8>, TokioExecutor> =
        subscribe(&pulsar, topic, &format!("{subscription}-r"), Some(at)).await?;
    let msg = tokio::time::timeout(Duration::from_secs(5), reader.next())
        .await
        .map_err(|_| "the last message did not arrive".to_string())?
        .ok_or("the reader closed")?
        .map_err(|e| e.to_string())?;
    let m = msg.metadata();
    if m.producer_name != producer_name {
        return Err(format!(
            "the topic's last message is from producer {}, not {producer_name}",
            m.producer_name
        ));
    }
    Ok(Some(BrokerLast {
        sequence_id: m.highest_sequence_id.unwrap_or(m.sequence_id),
        // A chunk says how many its frame was cut into (the broker's limit then, not now).
        chunks: m
            .num_chunks_from_msg
            .filter(|n| *n > 1 && m.chunk_id.is_some())
            .map(|n| n as usize),
    }))
}

async fn subscribe(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    subscription: &str,
    start: Option<MessageIdData>,
) -> Result<Consumer<Vec<u8>, TokioExecutor>, String> {
    let mut options = ConsumerOptions::default()
        .durable(false)
        .with_initial_position(InitialPosition::Latest);
    if let Some(id) = start {
        options = options.starting_on_message(id);
    }
    pulsar
        .consumer()
        .with_topic(topic)
        .with_subscription(subscription)
        .with_subscription_type(SubType::Exclusive)
        .with_options(options)
        .build()
        .await
        .map_err(|e| e.to_string())
}

async fn last_message_id(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    subscription: &str,
    start: Option<MessageIdData>,
) -> Result<Option<MessageIdData>, String> {
    let mut consumer = subscribe(pulsar, topic, subscription, start).await?;
    Ok(consumer
        .get_last_message_id()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .next())
}
