//! Pulsar binary-protocol framing: commands and SEND frames out, commands (and a MESSAGE's
//! metadata) in. Pure: no I/O.
//!
//! Simple frame: `[total u32][cmd size u32][BaseCommand]`. A SEND adds
//! `[magic 0x0e01][crc32c u32][metadata size u32][MessageMetadata][payload]`, the checksum covering
//! everything after itself. A payload of [`REFERENCE_FROM`] bytes or more is not copied: [`Frames`]
//! holds each SEND's header and a reference to its payload where it lies (the frame's buffer, a
//! sealed piece), and the writer hands both to one vectored write. A MESSAGE from the broker may put
//! `[magic 0x0e02][size u32][BrokerEntryMetadata]` before the magic.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message as _;
use pulsar::proto::{
    base_command::Type, AuthData, BaseCommand, CommandAuthResponse, CommandPing, CommandPong,
    KeyValue, MessageMetadata,
};

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
    encode_send_head(cmd, metadata, payload, dst);
    dst.put_slice(payload);
}

/// A SEND frame up to its payload, the checksum covering `payload` (appended by the caller).
fn encode_send_head(
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
    dst[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Payloads from this size on are referenced by [`Frames`], smaller ones copied: a serial line or
/// a batch costs less copied than as a piece of its own in a vectored write.
pub const REFERENCE_FROM: usize = 8 << 10;

/// SEND frames as the writer writes them, in order: headers encoded here, payloads of
/// [`REFERENCE_FROM`] bytes or more referenced where they lie (no copy), one vectored write for
/// all of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frames {
    /// Written in order; the last may still grow (`open`).
    parts: Vec<Bytes>,
    /// The headers and small payloads not yet sealed into `parts`.
    open: BytesMut,
    len: usize,
}

impl Frames {
    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a SEND frame for one message (or one chunk) whose payload is `payload`.
    pub fn send(&mut self, cmd: &BaseCommand, metadata: &MessageMetadata, payload: Bytes) {
        let before = self.open.len();
        encode_send_head(cmd, metadata, &payload, &mut self.open);
        if payload.len() < REFERENCE_FROM {
            self.open.put_slice(&payload);
            self.len += self.open.len() - before;
        } else {
            self.len += self.open.len() - before + payload.len();
            self.seal();
            self.parts.push(payload);
        }
    }

    /// Appends what `other` holds after this.
    pub fn append(&mut self, mut other: Frames) {
        self.seal();
        other.seal();
        self.len += other.len;
        self.parts.append(&mut other.parts);
    }

    fn seal(&mut self) {
        if !self.open.is_empty() {
            self.parts.push(self.open.split().freeze());
        }
    }

    /// Its pieces in write order; empty afterwards.
    pub fn take(&mut self) -> Vec<Bytes> {
        self.seal();
        self.len = 0;
        std::mem::take(&mut self.parts)
    }

    /// All of it in one buffer (what the writer's vectored writes put on the wire).
    #[cfg(test)]
    pub fn to_bytes(&self) -> Bytes {
        let mut all = BytesMut::with_capacity(self.len);
        for p in &self.parts {
            all.put_slice(p);
        }
        all.put_slice(&self.open);
        all.freeze()
    }
}

impl From<Bytes> for Frames {
    fn from(b: Bytes) -> Self {
        Frames {
            len: b.len(),
            parts: vec![b],
            open: BytesMut::new(),
        }
    }
}

/// Where a window's SEND frames go: [`Frames`] for the writer, a plain buffer in tests.
pub trait SendOut {
    fn send(&mut self, cmd: &BaseCommand, metadata: &MessageMetadata, payload: Bytes);
}

impl SendOut for Frames {
    fn send(&mut self, cmd: &BaseCommand, metadata: &MessageMetadata, payload: Bytes) {
        Frames::send(self, cmd, metadata, payload)
    }
}

impl SendOut for BytesMut {
    fn send(&mut self, cmd: &BaseCommand, metadata: &MessageMetadata, payload: Bytes) {
        encode_send(cmd, metadata, &payload, self)
    }
}

/// One frame from the broker: the command and, for a frame with a payload (a MESSAGE), the
/// message's metadata and its payload as sent. The payload itself is not decoded here: compressed,
/// encrypted, a batch or one chunk of a message, its metadata says what it is (the probe reads
/// nothing else; the control topic's reader unpacks it, [`super::control::unpack`]).
#[derive(Debug)]
pub struct Inbound {
    pub cmd: BaseCommand,
    pub metadata: Option<MessageMetadata>,
    pub payload: bytes::Bytes,
}

/// The command of the next frame (tests read back what a session wrote).
/// The protocol version rigd speaks (CONNECT, AUTH_RESPONSE).
pub const PROTOCOL_VERSION: i32 = 21;

pub fn auth_response(token: Option<String>) -> BaseCommand {
    BaseCommand {
        r#type: Type::AuthResponse as i32,
        auth_response: Some(CommandAuthResponse {
            client_version: Some(format!("rigd-{}", env!("CARGO_PKG_VERSION"))),
            response: Some(AuthData {
                auth_method_name: Some("token".into()),
                auth_data: token.map(String::into_bytes),
            }),
            protocol_version: Some(PROTOCOL_VERSION),
        }),
        ..Default::default()
    }
}

pub fn pong() -> BaseCommand {
    BaseCommand {
        r#type: Type::Pong as i32,
        pong: Some(CommandPong {}),
        ..Default::default()
    }
}

pub fn ping() -> BaseCommand {
    BaseCommand {
        r#type: Type::Ping as i32,
        ping: Some(CommandPing {}),
        ..Default::default()
    }
}

#[cfg(test)]
pub fn decode(src: &mut BytesMut) -> Result<Option<BaseCommand>, CodecError> {
    Ok(decode_frame(src)?.map(|f| f.cmd))
}

/// Takes one complete frame off the front of `src`, if there is one; a payload's checksum is
/// verified and its metadata decoded.
pub fn decode_frame(src: &mut BytesMut) -> Result<Option<Inbound>, CodecError> {
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
    let frame = src.split_to(total + 4).freeze();
    let cmd = BaseCommand::decode(&frame[8..8 + cmd_size])
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    let rest = frame.slice(8 + cmd_size..);
    let (metadata, payload) = if rest.is_empty() {
        (None, bytes::Bytes::new())
    } else {
        let (m, at) = payload_metadata(&rest)?;
        (Some(m), rest.slice(at..))
    };
    Ok(Some(Inbound {
        cmd,
        metadata,
        payload,
    }))
}

/// The metadata of a payload: `[0x0e02 size broker-entry-metadata]? 0x0e01 crc32c size metadata
/// payload`, the checksum covering everything after itself; and where the payload starts.
fn payload_metadata(whole: &[u8]) -> Result<(MessageMetadata, usize), CodecError> {
    let mut rest = whole;
    let bad = |why: &str| CodecError::Malformed(format!("payload: {why}"));
    let u32_at = |b: &[u8], at: usize| -> Result<usize, CodecError> {
        b.get(at..at + 4)
            .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]) as usize)
            .ok_or_else(|| bad("truncated"))
    };
    if rest.starts_with(&[0x0e, 0x02]) {
        let skip = 6 + u32_at(rest, 2)?;
        rest = rest
            .get(skip..)
            .ok_or_else(|| bad("broker entry metadata"))?;
    }
    if !rest.starts_with(&[0x0e, 0x01]) {
        return Err(bad("no magic"));
    }
    let crc = u32_at(rest, 2)? as u32;
    if crc32c::crc32c(&rest[6..]) != crc {
        return Err(bad("checksum"));
    }
    let size = u32_at(rest, 6)?;
    let meta = rest
        .get(10..10 + size)
        .ok_or_else(|| bad("metadata size"))?;
    let m = MessageMetadata::decode(meta).map_err(|e| bad(&e.to_string()))?;
    Ok((m, whole.len() - rest.len() + 10 + size))
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
        // The vectored form writes the same bytes, a large payload referenced, not copied.
        let large = Bytes::from(vec![3u8; REFERENCE_FROM]);
        let mut frames = Frames::default();
        frames.send(&cmd, &meta, Bytes::from_static(b"hello"));
        frames.send(&cmd, &meta, large.clone());
        let mut plain = buf.clone();
        encode_send(&cmd, &meta, &large, &mut plain);
        assert_eq!(frames.len(), plain.len());
        assert_eq!(frames.to_bytes(), plain.freeze());
        let parts = frames.take();
        assert_eq!(
            parts.len(),
            2,
            "the small frame with the large one's header, then its payload"
        );
        assert_eq!(parts.last().unwrap().as_ptr(), large.as_ptr(), "referenced");
        assert!(frames.is_empty());
        // The broker would see the same command back.
        assert_eq!(
            decode(&mut buf).unwrap().unwrap().send.unwrap().sequence_id,
            9
        );
    }

    #[test]
    fn a_message_frame_yields_its_metadata_and_a_bad_checksum_is_an_error() {
        // A MESSAGE is laid out like a SEND; the broker may put its entry metadata first.
        let cmd = BaseCommand {
            r#type: Type::Message as i32,
            ..Default::default()
        };
        let meta = MessageMetadata {
            producer_name: "rigd-van-cam".into(),
            sequence_id: 7 << 11,
            num_chunks_from_msg: Some(3),
            chunk_id: Some(1),
            ..Default::default()
        };
        let mut send = BytesMut::new();
        encode_send(&cmd, &meta, b"not decoded", &mut send);
        let got = decode_frame(&mut send.clone()).unwrap().unwrap();
        assert_eq!(got.metadata.as_ref(), Some(&meta));
        // With broker entry metadata (2 bytes of it) between the command and the magic.
        let cmd_end = 8 + cmd.encoded_len();
        let mut with_entry = BytesMut::new();
        with_entry.put_u32((send.len() - 4 + 8) as u32);
        with_entry.put_slice(&send[4..cmd_end]);
        with_entry.put_slice(&[0x0e, 0x02, 0, 0, 0, 2, 0x08, 0x01]);
        with_entry.put_slice(&send[cmd_end..]);
        let got = decode_frame(&mut with_entry).unwrap().unwrap();
        assert_eq!(got.metadata, Some(meta));
        let last = send.len() - 1;
        send[last] ^= 1;
        assert!(matches!(
            decode_frame(&mut send),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn oversized_and_malformed_frames_are_errors() {
        let mut big = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1][..]);
        assert!(matches!(decode(&mut big), Err(CodecError::TooLarge(_))));
        let mut bad = BytesMut::from(&[0, 0, 0, 4, 0, 0, 0, 9][..]);
        assert!(matches!(decode(&mut bad), Err(CodecError::Malformed(_))));
    }
}
