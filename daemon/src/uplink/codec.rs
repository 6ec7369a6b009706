//! Pulsar binary-protocol framing: commands and SEND frames out, commands in. Pure: no I/O.
//!
//! Simple frame: `[total u32][cmd size u32][BaseCommand]`. A SEND adds
//! `[magic 0x0e01][crc32c u32][metadata size u32][MessageMetadata][payload]`, the checksum covering
//! everything after itself. The payload is written straight from the frame's buffer (no copy of a
//! message into an intermediate Vec).

use bytes::{BufMut, BytesMut};
use prost::Message as _;
use pulsar::proto::{BaseCommand, KeyValue, MessageMetadata};

use crate::wire::Envelope;

/// A message's properties as metadata key-value pairs (message or batch entry metadata).
pub fn key_values(envelope: &Envelope) -> Vec<KeyValue> {
    envelope
        .properties
        .iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: v.clone(),
        })
        .collect()
}

/// A malformed frame from the broker; the connection cannot continue.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Frames above this from the broker are refused (a producer only receives small commands).
const MAX_INBOUND: usize = 64 << 20;

pub fn encode_command(cmd: &BaseCommand, dst: &mut BytesMut) {
    let size = cmd.encoded_len();
    dst.reserve(size + 8);
    dst.put_u32((size + 4) as u32);
    dst.put_u32(size as u32);
    // Encoding into a BytesMut with reserved space cannot fail.
    let _ = cmd.encode(dst);
}

/// Appends a SEND frame for one message (or one chunk) to `dst`.
pub fn encode_send(
    cmd: &BaseCommand,
    metadata: &MessageMetadata,
    payload: &[u8],
    dst: &mut BytesMut,
) {
    let cmd_size = cmd.encoded_len();
    let meta_size = metadata.encoded_len();
    let total = 4 + cmd_size + 2 + 4 + 4 + meta_size + payload.len();
    dst.reserve(total + 4);
    dst.put_u32(total as u32);
    dst.put_u32(cmd_size as u32);
    let _ = cmd.encode(dst);
    dst.put_u16(0x0e01);
    let crc_at = dst.len();
    dst.put_u32(0);
    let meta_at = dst.len();
    dst.put_u32(meta_size as u32);
    let _ = metadata.encode(dst);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&dst[meta_at..]), payload);
    dst.put_slice(payload);
    dst[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Takes one complete command frame off the front of `src`, if there is one. Payloads (which a
/// producer connection never receives) are skipped.
pub fn decode(src: &mut BytesMut) -> Result<Option<BaseCommand>, CodecError> {
    if src.len() < 8 {
        return Ok(None);
    }
    let total = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
    if total > MAX_INBOUND {
        return Err(CodecError::TooLarge(total));
    }
    if src.len() < total + 4 {
        src.reserve(total + 4 - src.len());
        return Ok(None);
    }
    let cmd_size = u32::from_be_bytes([src[4], src[5], src[6], src[7]]) as usize;
    if cmd_size + 4 > total {
        return Err(CodecError::Malformed(format!(
            "command size {cmd_size} > frame size {total}"
        )));
    }
    let frame = src.split_to(total + 4);
    let cmd = BaseCommand::decode(&frame[8..8 + cmd_size])
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    Ok(Some(cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::proto::{base_command::Type, CommandPing, CommandSend};

    #[test]
    fn command_round_trips_and_partial_input_waits() {
        let cmd = BaseCommand {
            r#type: Type::Ping as i32,
            ping: Some(CommandPing {}),
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        encode_command(&cmd, &mut buf);
        encode_command(&cmd, &mut buf);
        let mut partial = BytesMut::from(&buf[..5]);
        assert!(decode(&mut partial).unwrap().is_none());
        assert_eq!(decode(&mut buf).unwrap().unwrap().r#type, Type::Ping as i32);
        assert_eq!(decode(&mut buf).unwrap().unwrap().r#type, Type::Ping as i32);
        assert!(buf.is_empty());
    }

    #[test]
    fn send_frame_checksum_covers_metadata_and_payload() {
        let cmd = BaseCommand {
            r#type: Type::Send as i32,
            send: Some(CommandSend {
                producer_id: 1,
                sequence_id: 9,
                ..Default::default()
            }),
            ..Default::default()
        };
        let meta = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 9,
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        encode_send(&cmd, &meta, b"hello", &mut buf);
        assert_eq!(
            buf.len(),
            4 + 4 + cmd.encoded_len() + 2 + 4 + 4 + meta.encoded_len() + 5
        );
        let cmd_size = u32::from_be_bytes(buf[4..8].try_into().unwrap()) as usize;
        let magic_at = 8 + cmd_size;
        assert_eq!(&buf[magic_at..magic_at + 2], &[0x0e, 0x01]);
        let crc = u32::from_be_bytes(buf[magic_at + 2..magic_at + 6].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(&buf[magic_at + 6..]));
        assert_eq!(&buf[buf.len() - 5..], b"hello");
        // The broker would see the same command back.
        assert_eq!(
            decode(&mut buf).unwrap().unwrap().send.unwrap().sequence_id,
            9
        );
    }

    #[test]
    fn oversized_and_malformed_frames_are_errors() {
        let mut big = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1][..]);
        assert!(matches!(decode(&mut big), Err(CodecError::TooLarge(_))));
        let mut bad = BytesMut::from(&[0, 0, 0, 4, 0, 0, 0, 9][..]);
        assert!(matches!(decode(&mut bad), Err(CodecError::Malformed(_))));
    }
}
