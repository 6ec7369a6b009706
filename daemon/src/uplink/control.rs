//! The rig's control channel on its own connections: a durable consumer of the control topic and a
//! publisher of the answers, both on the rig's [`super::pool`] (one connection per broker, the
//! same lookup, token, TLS identity and keepalive as every producer; before, recall read and
//! answered through the `pulsar` crate on connections of their own, with their own keepalive and
//! no client certificate but through a local bridge).
//!
//! The consumer is `Failover` and durable (what is sent while the rig is offline waits on the
//! broker, from the topic's earliest entry for a subscription that is new), takes a few messages at
//! a time (FLOW), and acknowledges each entry once the caller says it is recorded: an entry not
//! acknowledged when the connection goes is delivered again. A message as a client sent it is
//! unpacked here ([`unpack`], pure): its compression undone (none, LZ4 or ZSTD, the codecs rigd
//! itself writes; ZLIB and SNAPPY are named and refused), a batch split into its messages (the
//! Java client batches by default). The `pulsar` crate used before was built without its
//! compression features: a compressed request was unreadable.
//!
//! The publisher is a producer named `rigd-{rig}-control` numbering from the broker's last id for
//! the name + 1 (the Java client's rule), one message at a time, each receipt awaited with a
//! deadline.

use bytes::{Buf, Bytes, BytesMut};
use prost::Message as _;
use pulsar::proto::{
    base_command::Type, command_ack::AckType, command_subscribe::InitialPosition,
    command_subscribe::SubType, BaseCommand, CommandAck, CommandSend, CommandSubscribe,
    CompressionType, KeyValue, MessageIdData, MessageMetadata, SingleMessageMetadata,
};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use super::connect::{Link, Setup};
use super::error::LinkError;
use super::pool::{ChannelEnd, Connection};

/// Messages asked for at a time; more are asked for when half are taken.
const PERMITS: u32 = 16;

/// One message of the control topic, unpacked.
#[derive(Debug)]
pub struct Delivery {
    /// The entry's id: acknowledged with [`Subscription::ack`] once what it asks is recorded.
    pub id: MessageIdData,
    /// Its messages (a batch holds several), or why it cannot be read.
    pub messages: Result<Vec<Bytes>, String>,
}

/// A durable subscription on the rig's connection to the topic's broker.
pub struct Subscription {
    conn: Arc<Connection>,
    end: ChannelEnd,
    /// The broker's count of this consumer's permits: a batch is charged one per message in it,
    /// so it goes below zero after a batch larger than what was granted (the broker sends
    /// nothing more until the flow covers the debt).
    permits: i64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.conn.detach_consumer(self.end.id);
    }
}

impl Subscription {
    /// Subscribes `setup.topic` as `subscription` (Failover, durable, from the earliest entry when
    /// the subscription is new), within the setup's deadline.
    pub async fn open(
        setup: &mut Setup,
        subscription: &str,
        consumer_name: &str,
    ) -> Result<Self, LinkError> {
        let conn = setup.lookup().await?;
        let end = conn.attach(Arc::new(AtomicUsize::new(0)), Arc::new(|| {}))?;
        let mut sub = Subscription {
            conn,
            end,
            permits: 0,
        };
        let (topic, consumer_id) = (setup.topic.clone(), sub.end.id);
        setup
            .request(
                &sub.conn,
                "SUBSCRIBE's SUCCESS",
                |id| BaseCommand {
                    r#type: Type::Subscribe as i32,
                    subscribe: Some(CommandSubscribe {
                        topic,
                        subscription: subscription.to_string(),
                        sub_type: SubType::Failover as i32,
                        consumer_id,
                        request_id: id,
                        consumer_name: Some(consumer_name.to_string()),
                        durable: Some(true),
                        initial_position: Some(InitialPosition::Earliest as i32),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                |c| c.success.is_some(),
            )
            .await?;
        sub.flow();
        Ok(sub)
    }

    fn flow(&mut self) {
        if self.permits >= i64::from(PERMITS / 2) {
            return;
        }
        let more = i64::from(PERMITS) - self.permits;
        super::probe::flow(&self.conn, self.end.id, more as u32);
        self.permits += more;
    }

    /// The next message; an error when the connection failed or the broker closed the consumer
    /// (a move: subscribe again).
    pub async fn next(&mut self) -> Result<Delivery, LinkError> {
        loop {
            let frame = self
                .end
                .inbound
                .recv()
                .await
                .ok_or_else(|| self.conn.failure().unwrap_or(LinkError::Closed))?;
            if frame.cmd.close_consumer.is_some() {
                return Err(LinkError::Moving(
                    "the broker closed the consumer (topic unloaded or moved)".into(),
                ));
            }
            let Some(msg) = frame.cmd.message else {
                continue;
            };
            // The broker charges a batch one permit per message in it.
            let charged = frame
                .metadata
                .as_ref()
                .and_then(|m| m.num_messages_in_batch)
                .unwrap_or(1)
                .max(1);
            self.permits -= i64::from(charged);
            self.flow();
            let messages = match &frame.metadata {
                Some(m) => unpack(m, &frame.payload),
                None => Err("a message without metadata".to_string()),
            };
            return Ok(Delivery {
                id: msg.message_id,
                messages,
            });
        }
    }

    /// Acknowledges entry `id` (the broker forgets it for this subscription).
    pub fn ack(&self, id: &MessageIdData) {
        self.conn.control(&BaseCommand {
            r#type: Type::Ack as i32,
            ack: Some(CommandAck {
                consumer_id: self.end.id,
                ack_type: AckType::Individual as i32,
                message_id: vec![MessageIdData {
                    ledger_id: id.ledger_id,
                    entry_id: id.entry_id,
                    partition: id.partition,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
    }
}

/// The messages of one entry as a client sent it: decompressed, and split when it is a batch.
/// Pure.
pub fn unpack(metadata: &MessageMetadata, payload: &[u8]) -> Result<Vec<Bytes>, String> {
    if !metadata.encryption_keys.is_empty() {
        return Err("an encrypted message (the control topic is read in the clear)".into());
    }
    let size = metadata.uncompressed_size.unwrap_or(payload.len() as u32) as usize;
    let whole = match CompressionType::try_from(metadata.compression.unwrap_or(0)) {
        Ok(CompressionType::None | CompressionType::Lz4 | CompressionType::Zstd) => {
            crate::payload::decompress(metadata.compression.unwrap_or(0), payload, size)?
        }
        Ok(other) => {
            return Err(format!(
                "compressed with {} (rigd reads LZ4, ZSTD or none)",
                other.as_str_name()
            ))
        }
        Err(_) => return Err(format!("unknown compression {:?}", metadata.compression)),
    };
    let Some(n) = metadata.num_messages_in_batch else {
        return Ok(vec![whole]);
    };
    let mut rest = whole;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) {
        let bad = |why: &str| format!("batch message {i} of {n}: {why}");
        if rest.len() < 4 {
            return Err(bad("truncated"));
        }
        let len = rest.get_u32() as usize;
        if rest.len() < len {
            return Err(bad("metadata truncated"));
        }
        let single =
            SingleMessageMetadata::decode(rest.split_to(len)).map_err(|e| bad(&e.to_string()))?;
        let size = single.payload_size.max(0) as usize;
        if rest.len() < size {
            return Err(bad("payload truncated"));
        }
        let payload = rest.split_to(size);
        // A message the producer dropped from the batch after a failure stays in its slot.
        if !single.compacted_out.unwrap_or(false) {
            out.push(payload);
        }
    }
    Ok(out)
}

/// The rig's subscription `subscription` to `topic`, on the connections and credentials of its
/// producers (`base`: a producer's settings, from which the pool, token and TLS are taken).
pub async fn subscribe(
    base: &super::ProducerConfig,
    topic: &str,
    subscription: &str,
) -> Result<Subscription, LinkError> {
    let mut setup = base.setup();
    setup.topic = topic.to_string();
    Subscription::open(&mut setup, subscription, subscription).await
}

/// A [`Publisher`] of `topic` named `name`, on the connections and credentials of `base`. Its
/// messages are sent in the clear (what the rig's frames' encryption protects is not in them).
pub async fn publisher(
    base: &super::ProducerConfig,
    topic: &str,
    name: &str,
    timeout: Duration,
) -> Result<Publisher, LinkError> {
    let mut setup = base.setup();
    setup.topic = topic.to_string();
    setup.producer_name = name.to_string();
    setup.encrypted = false;
    Publisher::open(&mut setup, timeout).await
}

/// A producer of small messages, one at a time, on the rig's connection to the topic's broker.
pub struct Publisher {
    link: Link,
    name: String,
    next_sequence_id: u64,
    timeout: Duration,
}

impl Publisher {
    /// Creates the producer (`setup.producer_name`), numbering past what the broker holds of the
    /// name; each receipt is waited for at most `timeout`.
    pub async fn open(setup: &mut Setup, timeout: Duration) -> Result<Self, LinkError> {
        let (link, last) = setup
            .establish(Arc::new(AtomicUsize::new(0)), Arc::new(|| {}))
            .await?;
        Ok(Publisher {
            link,
            name: setup.producer_name.clone(),
            next_sequence_id: last.map_or(0, |l| l + 1),
            timeout,
        })
    }

    /// Publishes one message and waits for its receipt.
    pub async fn send(
        &mut self,
        key: &str,
        properties: &[(&str, String)],
        payload: &[u8],
    ) -> Result<(), LinkError> {
        let sequence_id = self.next_sequence_id;
        let cmd = BaseCommand {
            r#type: Type::Send as i32,
            send: Some(CommandSend {
                producer_id: self.link.producer_id,
                sequence_id,
                num_messages: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        };
        let metadata = MessageMetadata {
            producer_name: self.name.clone(),
            sequence_id,
            publish_time: (rigd_drivers::realtime_ns() / 1_000_000).max(0) as u64,
            partition_key: Some(key.to_string()),
            properties: properties
                .iter()
                .map(|(k, v)| KeyValue {
                    key: k.to_string(),
                    value: v.clone(),
                })
                .collect(),
            uncompressed_size: Some(payload.len() as u32),
            ..Default::default()
        };
        let mut out = BytesMut::new();
        super::codec::encode_send(&cmd, &metadata, payload, &mut out);
        self.link.out = out.freeze().into();
        self.link.push()?;
        self.next_sequence_id += 1;
        let wait = async {
            loop {
                let frame = self
                    .link
                    .channel
                    .inbound
                    .recv()
                    .await
                    .ok_or_else(|| self.link.conn.failure().unwrap_or(LinkError::Closed))?;
                let cmd = frame.cmd;
                if let Some(r) = cmd.send_receipt {
                    if r.sequence_id >= sequence_id {
                        return Ok(());
                    }
                } else if let Some(e) = cmd.send_error {
                    return Err(LinkError::Broker(format!(
                        "the answer was refused: {} ({})",
                        e.message, e.error
                    )));
                } else if cmd.close_producer.is_some() {
                    return Err(super::serve::closed_by_broker());
                }
            }
        };
        tokio::time::timeout(self.timeout, wait)
            .await
            .unwrap_or_else(|_| {
                Err(LinkError::Timeout(format!(
                    "the answer's receipt ({} s)",
                    self.timeout.as_secs()
                )))
            })
    }

    /// Closes the producer on the broker (bounded).
    pub async fn close(self) {
        self.link.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn batch(messages: &[(&[u8], bool)]) -> Bytes {
        let mut b = BytesMut::new();
        for (payload, dropped) in messages {
            let m = SingleMessageMetadata {
                payload_size: payload.len() as i32,
                compacted_out: dropped.then_some(true),
                ..Default::default()
            };
            b.put_u32(m.encoded_len() as u32);
            m.encode(&mut b).unwrap();
            b.put_slice(payload);
        }
        b.freeze()
    }

    #[test]
    fn a_message_is_decompressed_and_a_batch_split_into_its_messages() {
        let plain = MessageMetadata::default();
        assert_eq!(
            unpack(&plain, b"{}").unwrap(),
            vec![Bytes::from_static(b"{}")]
        );
        let text = br#"{"op":"upload","id":"r1","sources":["cam"]}"#.repeat(20);
        let lz4 = MessageMetadata {
            compression: Some(CompressionType::Lz4 as i32),
            uncompressed_size: Some(text.len() as u32),
            ..Default::default()
        };
        let packed = lz4_flex::block::compress(&text);
        assert_eq!(
            unpack(&lz4, &packed).unwrap(),
            vec![Bytes::from(text.clone())]
        );
        let zstd = MessageMetadata {
            compression: Some(CompressionType::Zstd as i32),
            ..lz4.clone()
        };
        let packed = zstd::bulk::compress(&text, 3).unwrap();
        assert_eq!(unpack(&zstd, &packed).unwrap(), vec![Bytes::from(text)]);
        // A batch of three, the second dropped by its producer.
        let body = batch(&[(b"a", false), (b"bb", true), (b"ccc", false)]);
        let batched = MessageMetadata {
            num_messages_in_batch: Some(3),
            uncompressed_size: Some(body.len() as u32),
            ..Default::default()
        };
        assert_eq!(
            unpack(&batched, &body).unwrap(),
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"ccc")]
        );
        // A compressed batch.
        let zbatch = MessageMetadata {
            compression: Some(CompressionType::Zstd as i32),
            ..batched.clone()
        };
        assert_eq!(
            unpack(&zbatch, &zstd::bulk::compress(&body, 3).unwrap())
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn what_cannot_be_read_says_why() {
        let zlib = MessageMetadata {
            compression: Some(CompressionType::Zlib as i32),
            ..Default::default()
        };
        assert!(unpack(&zlib, b"x").unwrap_err().contains("ZLIB"));
        let body = batch(&[(b"abc", false)]);
        let short = MessageMetadata {
            num_messages_in_batch: Some(2),
            ..Default::default()
        };
        assert!(unpack(&short, &body)
            .unwrap_err()
            .contains("batch message 1 of 2"));
        let cut = MessageMetadata {
            num_messages_in_batch: Some(1),
            ..Default::default()
        };
        assert!(unpack(&cut, &body[..body.len() - 1])
            .unwrap_err()
            .contains("payload truncated"));
        let lz4 = MessageMetadata {
            compression: Some(CompressionType::Lz4 as i32),
            uncompressed_size: Some(100),
            ..Default::default()
        };
        assert!(unpack(&lz4, b"\xff\xff").is_err());
        let sealed = MessageMetadata {
            encryption_keys: vec![Default::default()],
            ..Default::default()
        };
        assert!(unpack(&sealed, b"x").unwrap_err().contains("encrypted"));
    }
}
