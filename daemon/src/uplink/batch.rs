//! Pulsar batch messages: several small frames of one bucket key in one broker entry, as the
//! official clients write them. Pure: no I/O.
//!
//! A batch payload is, per message, `[u32 BE size of SingleMessageMetadata][SingleMessageMetadata]
//! [payload]`; the batch's own metadata carries `num_messages_in_batch`, the first message's
//! sequence id and `highest_sequence_id` (the broker deduplicates on the highest), and the shared
//! key as `partition_key`, which Key_Shared subscriptions route by. Per-message properties, key,
//! event time and sequence id live in each SingleMessageMetadata, so consumers see the same
//! messages as without batching.
//!
//! Rules: a batch never mixes keys (Key_Shared stays exact) and never holds a chunk (only frames
//! far below the broker's max message size are batched).

use bytes::{BufMut, BytesMut};
use prost::Message as _;
use pulsar::proto::SingleMessageMetadata;
use std::time::Duration;

use crate::wire::Envelope;

/// When frames are batched: at most `max_messages` frames and `max_bytes` (payload and
/// properties) per batch, held at most `delay` waiting for more frames of the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub delay: Duration,
}

impl From<&crate::config::PulsarConfig> for BatchPolicy {
    fn from(p: &crate::config::PulsarConfig) -> Self {
        BatchPolicy {
            max_messages: p.batch_max_messages,
            max_bytes: p.batch_max_bytes.0 as usize,
            delay: Duration::from_millis(p.batch_delay_ms),
        }
    }
}

impl Default for BatchPolicy {
    /// The config's defaults (the Java client's: 1000 messages, 128 KiB, 1 ms); one home for the
    /// numbers, `config/pulsar.rs`.
    fn default() -> Self {
        (&crate::config::PulsarConfig::default()).into()
    }
}

impl BatchPolicy {
    pub fn enabled(&self) -> bool {
        self.max_messages > 1
    }

    /// Whether a frame of `bytes` (payload and properties) may join a batch.
    pub fn admits(&self, bytes: usize) -> bool {
        self.enabled() && bytes <= self.max_bytes / 2
    }
}

/// Appends one message to a batch payload.
pub fn push(out: &mut BytesMut, envelope: &Envelope, sequence_id: u64, payload: &[u8]) {
    let meta = SingleMessageMetadata {
        properties: super::codec::key_values(envelope),
        partition_key: Some(envelope.key.clone()),
        payload_size: payload.len() as i32,
        event_time: Some(envelope.event_time_ms),
        sequence_id: Some(sequence_id),
        ..Default::default()
    };
    let len = meta.encoded_len();
    out.reserve(4 + len + payload.len());
    out.put_u32(len as u32);
    meta.encode(out).expect("reserved");
    out.put_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    fn envelope(key: &str, seq: u64) -> Envelope {
        Envelope {
            key: key.into(),
            event_time_ms: 1000 + seq,
            properties: vec![("seq".into(), seq.to_string())],
        }
    }

    #[test]
    fn a_batch_payload_splits_back_into_its_messages() {
        let mut out = BytesMut::new();
        for seq in 0..3u64 {
            push(
                &mut out,
                &envelope("42", seq),
                seq << 11,
                &vec![seq as u8; seq as usize * 10],
            );
        }
        let mut b = out.freeze();
        for seq in 0..3u64 {
            let len = b.get_u32() as usize;
            let meta = SingleMessageMetadata::decode(b.split_to(len)).unwrap();
            assert_eq!(meta.partition_key.as_deref(), Some("42"));
            assert_eq!(meta.sequence_id, Some(seq << 11));
            assert_eq!(meta.event_time, Some(1000 + seq));
            assert_eq!(meta.properties[0].value, seq.to_string());
            let payload = b.split_to(meta.payload_size as usize);
            assert_eq!(&payload[..], &vec![seq as u8; seq as usize * 10][..]);
        }
        assert!(b.is_empty());
    }

    #[test]
    fn only_small_frames_are_batched() {
        let p = BatchPolicy::default();
        assert!(p.admits(100));
        assert!(!p.admits(100 << 10));
        let off = BatchPolicy {
            max_messages: 1,
            ..p
        };
        assert!(!off.admits(100));
    }
}
