//! What a topic itself holds: the sequence id of its last stored message, read back with a
//! non-durable subscription. Used once per process, at the first producer creation, when the
//! broker reports no last sequence id for the producer name although the spool may hold frames of
//! an earlier run: the broker forgets a producer's deduplication state after
//! `brokerDeduplicationProducerInactivityTimeoutMinutes` (6 h by default: a vehicle parked
//! overnight), and keeps none when deduplication is off. The topic's last message is what was
//! persisted, so frames of the earlier run up to it are not sent twice. Also when the broker does
//! name its last sequence id: the id does not say how many chunks its frame was cut into, and a
//! restart may cut the same frame into fewer (`plan::Probe::ChunksOf`; the answer needs no
//! settling then, the broker's state is what it persisted).
//!
//! The probe speaks the protocol itself, on the rig's connection to the topic's broker (the
//! producer's; the same lookup, token and TLS identity), and reads only the last entry's
//! *metadata*: the sequence ids, the producer name and the chunk fields are there, so an
//! encrypted batch, a compressed entry or one chunk of a frame is read as easily as a plain
//! message (a client library's consumer decrypts, decompresses and splits before it shows
//! metadata, and fails on what it cannot). `SUBSCRIBE` (non-durable, at the latest entry),
//! `GET_LAST_MESSAGE_ID`, then a second subscription started at that entry and `FLOW` for one
//! message; both consumers are closed after, which removes their subscriptions.

use pulsar::proto::{
    base_command::Type, command_subscribe::InitialPosition, command_subscribe::SubType,
    BaseCommand, CommandCloseConsumer, CommandFlow, CommandGetLastMessageId, CommandSubscribe,
    MessageIdData, MessageMetadata,
};

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::connect::Setup;
use super::error::LinkError;
use super::plan::BrokerLast;
use super::pool::{ChannelEnd, Connection};

/// The highest sequence id of the topic's last entry (a batch's highest) and, for a chunk, the
/// number of chunks of its frame; None for a topic without messages. Errors name what failed;
/// the caller then trusts the broker's answer alone. A last entry from another producer name (a
/// source's epochs share the topic, see `spool::epochs`) says nothing about this producer's
/// frames: an error.
/// `settle`: wait for the broker's last confirmed entry to hold still (see [`Settle`]); not needed
/// when the broker has named the id already (its deduplication state is what it persisted).
pub async fn last_entry(setup: &mut Setup, settle: bool) -> Result<Option<BrokerLast>, LinkError> {
    let conn = setup.lookup().await?;
    let subscription = format!(
        "rigd-probe-{}-{:x}",
        std::process::id(),
        rigd_drivers::realtime_ns() as u64 & 0xffff_ffff
    );
    let first = Consumer::attach(&conn)?;
    subscribe(setup, &conn, first.end.id, &subscription, None).await?;
    // The broker answers with its last *confirmed* entry: what a killed run's connection had
    // handed it may still be on its way to the bookies for a moment. The answer counts once it
    // holds still (see [`Settle`]).
    let wait = settle;
    let mut settle = Settle::default();
    let last = loop {
        let now = Instant::now();
        let last = last_message_id(setup, &conn, first.end.id).await?;
        if let Some(settled) = settle.observe(last.as_ref().map(|m| (m.ledger_id, m.entry_id)), now)
        {
            break settled.and(last);
        }
        if !wait {
            break last;
        }
        tokio::time::sleep(SETTLE_POLL).await;
    };
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
    let mut second = Consumer::attach(&conn)?;
    subscribe(
        setup,
        &conn,
        second.end.id,
        &format!("{subscription}-r"),
        Some(at),
    )
    .await?;
    conn.control(&BaseCommand {
        r#type: Type::Flow as i32,
        flow: Some(CommandFlow {
            consumer_id: second.end.id,
            message_permits: 1,
        }),
        ..Default::default()
    });
    let frame = loop {
        let frame = tokio::time::timeout(setup.setup_timeout, second.end.inbound.recv())
            .await
            .map_err(|_| LinkError::Timeout("the last message".into()))?
            .ok_or_else(|| conn.failure().unwrap_or(LinkError::Closed))?;
        if frame.cmd.message.is_some() {
            break frame;
        }
    };
    let m = frame
        .metadata
        .ok_or_else(|| LinkError::Broker("a MESSAGE without a payload".into()))?;
    judge(&m, &setup.producer_name).map(Some)
}

/// A consumer of the probe on the rig's connection, closed on the broker when dropped (a
/// non-durable subscription goes with its consumer).
struct Consumer<'a> {
    conn: &'a Connection,
    end: ChannelEnd,
}

impl<'a> Consumer<'a> {
    fn attach(conn: &'a Connection) -> Result<Self, LinkError> {
        let end = conn.attach(Arc::new(AtomicUsize::new(0)), Arc::new(|| {}))?;
        Ok(Consumer { conn, end })
    }
}

impl Drop for Consumer<'_> {
    fn drop(&mut self) {
        let close = BaseCommand {
            r#type: Type::CloseConsumer as i32,
            close_consumer: Some(CommandCloseConsumer {
                consumer_id: self.end.id,
                request_id: self.conn.next_id(),
            }),
            ..Default::default()
        };
        self.conn.detach(self.end.id, Some(close));
    }
}

/// What the last entry's metadata says of this producer's frames.
fn judge(m: &MessageMetadata, producer_name: &str) -> Result<BrokerLast, LinkError> {
    if m.producer_name != producer_name {
        return Err(LinkError::Broker(format!(
            "the topic's last message is from producer {}, not {producer_name}",
            m.producer_name
        )));
    }
    Ok(BrokerLast {
        // A batch's entry carries its first id and its highest (what dedup compares).
        sequence_id: m.highest_sequence_id.unwrap_or(m.sequence_id),
        // A chunk says how many its frame was cut into (the broker's limit then, not now).
        chunks: m
            .num_chunks_from_msg
            .filter(|n| *n > 1 && m.chunk_id.is_some())
            .map(|n| n as usize),
    })
}

/// How often the last confirmed entry is asked for while it settles.
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// How long the answer must hold still.
const SETTLE_FOR: Duration = Duration::from_secs(1);
/// After this long a topic still moving is taken as it stands (something else writes to it).
const SETTLE_AT_MOST: Duration = Duration::from_secs(5);

/// Decides when the broker's last confirmed entry has settled: the same answer [`SETTLE_FOR`]
/// apart, or whatever it is after [`SETTLE_AT_MOST`]. Measured in CI (a loaded machine, 12 MiB
/// frames): a probe that took the first answer right after a kill -9 missed four frames the
/// killed connection had handed the broker, and sent them twice.
#[derive(Debug, Default)]
struct Settle {
    first: Option<Instant>,
    /// The answer now and since when it has held.
    held: Option<(Option<(u64, u64)>, Instant)>,
}

impl Settle {
    /// Feeds an answer (None: no entry); returns it once it counts.
    fn observe(&mut self, id: Option<(u64, u64)>, now: Instant) -> Option<Option<(u64, u64)>> {
        let first = *self.first.get_or_insert(now);
        let since = match self.held {
            Some((held, since)) if held == id => since,
            _ => {
                self.held = Some((id, now));
                now
            }
        };
        (now.duration_since(since) >= SETTLE_FOR || now.duration_since(first) >= SETTLE_AT_MOST)
            .then_some(id)
    }
}

async fn last_message_id(
    setup: &Setup,
    conn: &Connection,
    consumer_id: u64,
) -> Result<Option<MessageIdData>, LinkError> {
    Ok(setup
        .request(
            conn,
            "GET_LAST_MESSAGE_ID_RESPONSE",
            |id| BaseCommand {
                r#type: Type::GetLastMessageId as i32,
                get_last_message_id: Some(CommandGetLastMessageId {
                    consumer_id,
                    request_id: id,
                }),
                ..Default::default()
            },
            |c| c.get_last_message_id_response.is_some(),
        )
        .await?
        .cmd
        .get_last_message_id_response
        .map(|r| r.last_message_id))
}

async fn subscribe(
    setup: &Setup,
    conn: &Connection,
    consumer_id: u64,
    subscription: &str,
    start: Option<MessageIdData>,
) -> Result<(), LinkError> {
    setup
        .request(
            conn,
            "SUBSCRIBE's SUCCESS",
            |id| BaseCommand {
                r#type: Type::Subscribe as i32,
                subscribe: Some(CommandSubscribe {
                    topic: setup.topic.clone(),
                    subscription: subscription.to_string(),
                    sub_type: SubType::Exclusive as i32,
                    consumer_id,
                    request_id: id,
                    consumer_name: Some(subscription.to_string()),
                    durable: Some(false),
                    start_message_id: start,
                    initial_position: Some(InitialPosition::Latest as i32),
                    // Reading must not create a topic that is not there.
                    force_topic_creation: Some(false),
                    ..Default::default()
                }),
                ..Default::default()
            },
            |c| c.success.is_some(),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_entry_judged_by_its_metadata() {
        let chunk = MessageMetadata {
            producer_name: "rigd-van-cam".into(),
            sequence_id: super::super::plan::sequence_id(7, 0, 1),
            num_chunks_from_msg: Some(3),
            chunk_id: Some(1),
            ..Default::default()
        };
        assert_eq!(
            judge(&chunk, "rigd-van-cam").unwrap(),
            BrokerLast {
                sequence_id: super::super::plan::sequence_id(7, 0, 1),
                chunks: Some(3)
            }
        );
        // A batch: its highest id; another producer's entry: an error.
        let batch = MessageMetadata {
            producer_name: "rigd-van-gps".into(),
            sequence_id: 10 << 11,
            highest_sequence_id: Some(14 << 11),
            num_messages_in_batch: Some(5),
            ..Default::default()
        };
        assert_eq!(judge(&batch, "rigd-van-gps").unwrap().sequence_id, 14 << 11);
        assert!(judge(&batch, "rigd-van-gps-e3").is_err());
    }

    #[test]
    fn the_last_confirmed_entry_counts_once_it_holds_still() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = Settle::default();
        assert_eq!(s.observe(Some((5, 10)), at(0)), None);
        // The killed run's entries still land: the answer moves, the clock starts again.
        assert_eq!(s.observe(Some((5, 12)), at(250)), None);
        assert_eq!(s.observe(Some((5, 12)), at(1000)), None);
        assert_eq!(s.observe(Some((5, 12)), at(1250)), Some(Some((5, 12))));
        // An empty topic settles the same way.
        let mut s = Settle::default();
        assert_eq!(s.observe(None, at(0)), None);
        assert_eq!(s.observe(None, at(1000)), Some(None));
        // A topic that keeps moving is taken as it stands after the bound.
        let mut s = Settle::default();
        for (i, ms) in (0..5000).step_by(250).enumerate() {
            assert_eq!(s.observe(Some((1, i as u64)), at(ms)), None);
        }
        assert_eq!(s.observe(Some((1, 99)), at(5000)), Some(Some((1, 99))));
    }
}
