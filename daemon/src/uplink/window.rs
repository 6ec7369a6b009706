//! The producer's window: every frame a source handed to its producer, from submission to its
//! acknowledgement. Pure: no I/O, no clock of its own (monotonic and wall time are inputs), no
//! tasks; end-to-end encryption goes through the injected `seal::Encryptor` (its random IVs and
//! key rotation are its own). The session
//! (`producer.rs`) carries out what the window decides: it writes the bytes `encode_next` gives,
//! feeds back receipts, send errors, write progress and connection changes, and hands the acks on.
//!
//! Invariants:
//! - A frame is in exactly one place: the open batch, a message of the queue, or an ack. Nothing is
//!   ever dropped: `take_all` returns every frame without an ack (the session may be cancelled at any
//!   await, the window is not).
//! - Acks leave in submission order, whatever the outcome (a refused frame waits behind the frames
//!   submitted before it, so the lane's spool cursor never jumps).
//! - A frame is acknowledged `Persisted` only on its last chunk's receipt. `AlreadyPersisted` is
//!   decided only for frames submitted after this process's first producer creation, against the
//!   last sequence id the broker reported then (frames of an earlier run the spool still holds).
//!   After a reconnect everything without a receipt is written again under the same sequence ids
//!   and the broker's deduplication answers, as the Java client does: the broker's reported id is
//!   its highest *pushed*, not persisted, so it proves nothing about frames of this process.
//! - The link is judged by progress: receipts, or bytes accepted by the socket ([`PROGRESS_BYTES`]
//!   of them, or the last of what the producer handed the connection). Nothing for
//!   `stall_after` while something is outstanding: the link is reported stalled (new frames spool);
//!   nothing for `progress_timeout`: it is dead and the session reconnects. A slow link that keeps
//!   moving is never timed out, however large the frame.

use bytes::{Bytes, BytesMut};
use pulsar::proto::{base_command::Type, BaseCommand, CommandSend, MessageMetadata, ServerError};
use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::batch::{self, BatchPolicy};
use super::codec;
use super::plan;
use crate::config::Compression;
use crate::payload::Held;
use crate::wire::Envelope;

/// Room left in a chunk (and a batch) for the command and metadata.
pub const CHUNK_HEADROOM: usize = 16 << 10;

/// Bytes the socket must take to count as progress (or the last of what waits for it): a link
/// that takes a few hundred bytes a second (8 kbit/s under a 1 MiB frame) moves too little to
/// carry anything live and is reported stalled, as a silent one is; 16 KiB in `stall_after` (5 s)
/// is 26 kbit/s. Shared with the connection's own judgement (`pool::state`).
pub const PROGRESS_BYTES: usize = 16 << 10;

#[derive(Debug, Clone)]
pub struct WindowConfig {
    pub producer_name: String,
    pub rig: String,
    pub bucket_ms: u32,
    /// Messages are keyed by their group of this many buckets (`crate::wire::key`).
    pub group_buckets: u32,
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    pub max_frame_bytes: usize,
    pub compression: Compression,
    /// Every message is encrypted for the fleet key as it is written ([`crate::seal`]).
    pub encryption: Option<std::sync::Arc<crate::seal::Encryptor>>,
    pub batch: BatchPolicy,
    /// No progress for this long while something is outstanding: the link is dead.
    pub progress_timeout: Duration,
    /// No progress for this long: the link is reported stalled and takes no new frames.
    pub stall_after: Duration,
    /// Distinguishes this process's chunk uuids from an earlier run's (ms since the epoch).
    pub run: u64,
    /// Under a bandwidth budget: the largest chunk or batch, a few seconds of the rate, so that
    /// one SEND never outlasts the broker's keepalive (None: the broker's limit alone). Pieces
    /// sealed in the spool keep their size.
    pub max_chunk_bytes: Option<usize>,
    /// Added to every message's properties (a recall's `recall=<id>`).
    pub properties: Vec<(String, String)>,
    /// The source's numbering in this run (a live lane's producers; None: ids are the seqs):
    /// frames numbered before a jump go out under shifted ids ([`plan::Numbering`]).
    pub numbering: Option<plan::Numbering>,
}

/// What became of a submitted frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker persisted it.
    Persisted,
    /// The broker already held this sequence id (a re-send after a restart).
    AlreadyPersisted,
    /// It can never be published (too large, refused by a topic policy); counted and dropped by
    /// the caller.
    Refused(String),
}

/// An acknowledgement to the caller, in submission order.
#[derive(Debug, Clone)]
pub struct Ack {
    pub seq: u64,
    pub outcome: Outcome,
    /// Submission to last receipt.
    pub latency: Duration,
    /// The frame's capture time (rig clock, ns), for capture-to-receipt latency.
    pub capture_ns: i64,
    pub bytes: usize,
}

/// What the session must do after a `SEND_ERROR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnSendError {
    /// The message can never be accepted: it was refused (acked in order); go on.
    Refused,
    /// The topic takes nothing any more: stop publishing, report it; frames stay held.
    Terminated(String),
    /// Transient (persistence, quota, checksum, unknown): reconnect after a backoff and resend.
    Reconnect(String),
}

/// The link as the window sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Nothing outstanding, or progress within `stall_after`.
    Moving,
    /// No progress for `stall_after`.
    Stalled,
    /// No progress for `progress_timeout`.
    Dead,
}

/// A chunk just encoded (for the session's failpoint and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    pub seq: u64,
    pub chunk: usize,
    pub chunks: usize,
}

#[derive(Debug, Clone, Copy)]
struct Connection {
    producer_id: u64,
    max_message_size: usize,
}

#[derive(Debug)]
enum State {
    Sending,
    /// Complete; acked when it reaches the front.
    Done(Outcome),
}

struct Message {
    frame: Held,
    /// The capture sequence its ids are made of ([`plan::Numbering::id_seq`]), and its last
    /// frame's (a batch's highest; the frame's own otherwise).
    id_seq: u64,
    last_id_seq: u64,
    /// The other frames of a batch message, after `frame` (empty when not a batch).
    batch: Vec<Held>,
    envelope: Envelope,
    generation: u64,
    /// Times this process sent it again whole after a reconnect ([`plan::Again::Whole`]): in its
    /// chunk uuid, which stays new once the generations run out.
    whole_again: u32,
    /// The payload as it goes on the wire (compressed or the frame's own bytes), its codec and its
    /// size before compression.
    wire: Bytes,
    compression: i32,
    uncompressed: usize,
    /// A frame sealed in the spool: its pieces go out as they are, one per chunk (`wire` and
    /// `chunks` then only count them).
    sealed: Option<Box<crate::seal::Sealed>>,
    /// Chunk ranges of the wire payload (one when not chunked).
    chunks: Vec<Range<usize>>,
    /// Chunks with a receipt, or counted as held on the broker's word ([`plan::Again::LastChunk`]).
    receipts: usize,
    /// Of `receipts`, those counted on the broker's word: its highest *pushed* id named the last
    /// chunk, and pushed is not stored (writes still pending may fail). Until the last chunk's
    /// receipt comes they are chunks in flight, judged again by the next connection.
    assumed: usize,
    /// Chunks written on the current session (receipts <= written <= chunks).
    written: usize,
    submitted: Instant,
    state: State,
}

impl Message {
    fn sequence_id(&self, chunk: usize) -> u64 {
        plan::sequence_id(self.id_seq, self.generation, chunk)
    }

    fn frames(&self) -> usize {
        1 + self.batch.len()
    }

    fn bytes(&self) -> usize {
        self.frame.payload.len() + self.batch.iter().map(|f| f.payload.len()).sum::<usize>()
    }

    fn sending(&self) -> bool {
        matches!(self.state, State::Sending)
    }

    /// Whether `id` is one of this message's sequence ids (any chunk; a batch answers to its first
    /// frame's id and to its highest).
    fn owns(&self, id: u64) -> bool {
        let first = self.sequence_id(0);
        let last = match self.batch.last() {
            Some(_) => plan::sequence_id(self.last_id_seq, 0, 0),
            None => self.sequence_id(self.chunks.len().saturating_sub(1)),
        };
        (first..=last).contains(&id)
    }
}

/// Small frames of one key waiting to go out as one batch message.
struct OpenBatch {
    frames: Vec<(Held, Envelope)>,
    bytes: usize,
    opened: Instant,
}

pub struct Window {
    cfg: WindowConfig,
    messages: VecDeque<Message>,
    open_batch: Option<OpenBatch>,
    /// When the last frame small enough to batch came: a batch waits for more only when frames
    /// come closer together than `batch-delay-ms`.
    last_small: Option<Instant>,
    /// Under `auto`, chunks of frames handed over now are at most this ([`Window::pace_chunks`]).
    paced_chunk: Option<usize>,
    /// Frames and payload bytes held (queue and open batch).
    frames: usize,
    bytes: usize,
    /// Messages still sending (not every chunk receipted): `outstanding` without a scan of the
    /// queue on every submission.
    sending: usize,
    acks: VecDeque<Ack>,
    session: Option<Connection>,
    /// The broker's last sequence id at this process's first producer creation.
    broker_last: Option<plan::BrokerLast>,
    created_once: bool,
    last_progress: Instant,
    /// Bytes the socket took since `last_progress` (below [`PROGRESS_BYTES`]).
    unproven: usize,
    /// No new frames: shutting down.
    closing: bool,
    terminated: Option<String>,
    /// The sequence ids of the chunked messages refused last ([`REFUSED_IDS`] of them): the
    /// SEND_ERRORs of their other chunks are theirs.
    refused_ids: VecDeque<std::ops::RangeInclusive<u64>>,
}

/// Chunked messages whose refusals are remembered (their chunks' errors come within a window).
const REFUSED_IDS: usize = 64;

impl Window {
    pub fn new(cfg: WindowConfig, now: Instant) -> Self {
        Window {
            cfg,
            messages: VecDeque::new(),
            open_batch: None,
            last_small: None,
            paced_chunk: None,
            frames: 0,
            bytes: 0,
            sending: 0,
            acks: VecDeque::new(),
            session: None,
            broker_last: None,
            created_once: false,
            last_progress: now,
            unproven: 0,
            closing: false,
            terminated: None,
            refused_ids: VecDeque::new(),
        }
    }

    /// A producer was created on a new connection. Everything without a receipt is written again.
    /// Returns the seqs of the frames that go out again whole under a new uuid (chunks of them
    /// were in flight, [`plan::again`]).
    pub fn connected(
        &mut self,
        producer_id: u64,
        max_message_size: usize,
        broker_last: Option<plan::BrokerLast>,
        now: Instant,
    ) -> Vec<u64> {
        if !self.created_once {
            self.created_once = true;
            self.broker_last = broker_last;
        }
        self.session = Some(Connection {
            producer_id,
            max_message_size,
        });
        // The broker took a producer on the topic: whatever terminated it earlier (an operator
        // deleted and recreated it) no longer holds.
        self.terminated = None;
        let last = broker_last.map(|b| b.sequence_id);
        let mut whole_again = Vec::new();
        let mut i = 0;
        while i < self.messages.len() {
            let max_chunk = self.chunk_limit(max_message_size, &self.messages[i].envelope);
            let max_piece = self.broker_limit(max_message_size, &self.messages[i].envelope);
            let m = &mut self.messages[i];
            let assumed = std::mem::take(&mut m.assumed);
            m.receipts -= assumed;
            // Chunks the broker's word spared were written on an earlier connection, without a
            // receipt: in flight, whether or not the last chunk went again since.
            let in_flight = if assumed > 0 {
                m.chunks.len()
            } else {
                m.written
            };
            m.written = m.receipts;
            i += 1;
            if !m.sending() {
                continue;
            }
            match plan::again(
                m.id_seq,
                m.generation,
                m.chunks.len(),
                m.receipts,
                in_flight,
                last,
            ) {
                plan::Again::Resume => {}
                plan::Again::LastChunk => {
                    // The broker names the last chunk: the last one alone goes, for its receipt;
                    // the others count as held until it comes (`assumed`).
                    m.assumed = m.chunks.len() - 1 - m.receipts;
                    m.receipts = m.chunks.len() - 1;
                    m.written = m.receipts;
                }
                plan::Again::Whole => {
                    // Chunks were in flight and the broker may hold some: the frame goes out
                    // whole under a uuid nobody has seen.
                    m.generation = (m.generation + 1).min(plan::MAX_GENERATION);
                    m.whole_again += 1;
                    m.receipts = 0;
                    m.written = 0;
                    whole_again.push(m.frame.seq);
                }
            }
            if let Some(sealed) = &m.sealed {
                // Pieces sealed in the spool cannot be cut again without the fleet's private key:
                // one that no longer fits is refused (counted and logged by the lane), not resent
                // to a broker whose decoder would close the connection each time.
                if let Some(p) = sealed
                    .pieces
                    .iter()
                    .find(|p| p.ciphertext.len() > max_piece)
                {
                    let why = format!(
                        "a sealed piece of {} bytes does not fit the broker's max message size ({max_message_size} bytes) after a reconnect",
                        p.ciphertext.len()
                    );
                    m.state = State::Done(Outcome::Refused(why));
                    self.sending -= 1;
                }
            } else if !m.batch.is_empty() {
                // A batch is one message and cannot be chunked: one that no longer fits goes out
                // as its frames, each a message of its own (their own sequence ids, in order).
                if m.wire.len() > max_chunk {
                    let m = self.messages.remove(i - 1).expect("index in range");
                    let singles: Vec<Message> = std::iter::once(m.frame)
                        .chain(m.batch)
                        .map(|f| self.single(f, m.submitted, max_message_size))
                        .collect();
                    self.sending += singles.len() - 1;
                    let at = i - 1;
                    i = at + singles.len();
                    for (k, single) in singles.into_iter().enumerate() {
                        self.messages.insert(at + k, single);
                    }
                }
            } else if m.chunks.iter().any(|c| c.len() > max_chunk)
                && m.generation < plan::MAX_GENERATION
            {
                // A broker with a smaller message size than the chunks were cut for: cut again,
                // under the next generation (new ids and uuid), so no consumer ever sees chunks
                // of two layouts under one uuid; the earlier partial chunks expire at consumers.
                m.generation += 1;
                m.receipts = 0;
                m.assumed = 0;
                m.written = 0;
                m.chunks = crate::payload::cut(m.wire.len(), max_chunk);
            }
        }
        self.complete_front(now);
        self.last_progress = now;
        whole_again
    }

    pub fn disconnected(&mut self) {
        self.session = None;
    }

    /// The broker terminated the topic: nothing more is taken.
    pub fn terminate(&mut self, why: String) {
        self.terminated = Some(why);
    }

    pub fn terminated(&self) -> Option<&str> {
        self.terminated.as_deref()
    }

    /// Shutting down: take no new frames, close the open batch so it can still go out.
    pub fn close(&mut self) {
        self.closing = true;
        self.close_batch();
    }

    /// Whether a frame submitted now would be taken.
    pub fn accepts(&self, now: Instant) -> bool {
        self.session.is_some()
            && !self.closing
            && self.terminated.is_none()
            && self.health(now) == Health::Moving
            && self.has_room()
    }

    fn has_room(&self) -> bool {
        self.frames < self.cfg.max_in_flight && self.bytes < self.cfg.max_in_flight_bytes
    }

    /// Frames held (awaiting an ack).
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Nothing held and nothing to ack.
    pub fn idle(&self) -> bool {
        self.frames == 0
    }

    /// Takes a frame, or gives it back when the window would not ([`Window::accepts`]).
    pub fn submit(&mut self, frame: Held, now: Instant) -> Result<(), Held> {
        if !self.accepts(now) {
            return Err(frame);
        }
        let Some(session) = self.session else {
            return Err(frame);
        };
        self.touch_if_idle(now);
        self.frames += 1;
        self.bytes += frame.payload.len();
        let envelope = self.envelope(&frame);
        let len = frame.payload.len();
        if len > self.cfg.max_frame_bytes {
            let why = format!(
                "{len} bytes is above max-frame-bytes ({})",
                self.cfg.max_frame_bytes
            );
            self.close_batch();
            self.push_done(frame, envelope, Outcome::Refused(why), now);
            return Ok(());
        }
        let size = len + envelope_size(&envelope);
        let id_seq = self.id_seq(frame.seq);
        let known = matches!(
            plan::resend(id_seq, 0, 1, self.broker_last, false),
            plan::Resend::Done
        );
        let batch_limit = self.batch_limit(session.max_message_size);
        if !known
            && !frame.sealed
            && self.cfg.batch.admits(size)
            && size * 4 <= session.max_message_size
        {
            let full = self.open_batch.as_ref().is_some_and(|b| {
                b.frames.len() >= self.cfg.batch.max_messages
                    || b.bytes + size > batch_limit
                    || b.frames[0].1.key != envelope.key
            });
            if full {
                self.close_batch();
            }
            let b = self.open_batch.get_or_insert_with(|| OpenBatch {
                frames: Vec::new(),
                bytes: 0,
                opened: now,
            });
            b.bytes += size;
            b.frames.push((frame, envelope));
            // A source slower than the delay would only ever fill batches of one, each after a
            // timer wake-up: its frame goes at once. Frames closer together than the delay (a
            // fast sensor, a drain) wait for the next.
            let company = self
                .last_small
                .replace(now)
                .is_some_and(|last| now.saturating_duration_since(last) <= self.cfg.batch.delay);
            if self.cfg.batch.delay.is_zero() || !company || !self.has_room() {
                self.close_batch();
            }
            return Ok(());
        }
        self.close_batch();
        let max_chunk = self.chunk_limit(session.max_message_size, &envelope);
        let (compression, wire, uncompressed, chunks, sealed) = if frame.sealed {
            let s = match crate::seal::Sealed::parse(&frame.payload) {
                Ok(s) => s,
                Err(e) => {
                    self.push_done(frame, envelope, Outcome::Refused(e), now);
                    return Ok(());
                }
            };
            let max_piece = self.broker_limit(session.max_message_size, &envelope);
            if let Some(p) = s.pieces.iter().find(|p| p.ciphertext.len() > max_piece) {
                let why = format!(
                    "a sealed piece of {} bytes does not fit the broker's max message size ({} bytes)",
                    p.ciphertext.len(),
                    session.max_message_size
                );
                self.push_done(frame, envelope, Outcome::Refused(why), now);
                return Ok(());
            }
            let chunks = (0..s.pieces.len()).map(|i| i..i + 1).collect();
            (
                s.compression,
                Bytes::new(),
                s.uncompressed,
                chunks,
                Some(Box::new(s)),
            )
        } else {
            let (compression, wire) =
                crate::payload::compress(self.cfg.compression, &frame.payload);
            let chunks = crate::payload::cut(wire.len(), self.paced(max_chunk, wire.len()));
            (compression, wire, len, chunks, None)
        };
        if chunks.len() > plan::MAX_CHUNKS {
            let why = format!(
                "{len} bytes would take {} chunks at the broker's max message size ({} bytes); the most is {}",
                chunks.len(),
                session.max_message_size,
                plan::MAX_CHUNKS
            );
            self.push_done(frame, envelope, Outcome::Refused(why), now);
            return Ok(());
        }
        let generation = match plan::resend(id_seq, 0, chunks.len(), self.broker_last, false) {
            plan::Resend::Done => {
                self.push_done(frame, envelope, Outcome::AlreadyPersisted, now);
                return Ok(());
            }
            // Never past MAX_GENERATION: plan::resend keeps the last generation's ids after it.
            plan::Resend::From { generation, .. } => generation,
        };
        self.messages.push_back(Message {
            frame,
            id_seq,
            last_id_seq: id_seq,
            batch: Vec::new(),
            envelope,
            generation,
            whole_again: 0,
            wire,
            compression,
            uncompressed,
            sealed,
            chunks,
            receipts: 0,
            assumed: 0,
            written: 0,
            submitted: now,
            state: State::Sending,
        });
        self.sending += 1;
        Ok(())
    }

    /// The largest chunk (or batch) of a message with `envelope`: the broker's limit, and under a
    /// budget [`WindowConfig::max_chunk_bytes`].
    fn chunk_limit(&self, max_message_size: usize, envelope: &Envelope) -> usize {
        let broker = self.broker_limit(max_message_size, envelope);
        self.cfg
            .max_chunk_bytes
            .map_or(broker, |b| broker.min(b.max(1024)))
    }

    /// Under `max-bandwidth = "auto"`: frames handed over from now are cut into chunks of at most
    /// `bytes` (`budget::Budget::paced_chunk`; None: as the limits say). A frame keeps the chunks
    /// it was cut into (its ids and uuid) whatever the pace does after.
    pub fn pace_chunks(&mut self, bytes: Option<usize>) {
        self.paced_chunk = bytes;
    }

    /// The chunk size for a payload of `len` bytes: `limit`, or at the pace (a payload above
    /// `budget::PACED_WHOLE`) as many chunks of even size as it takes, never more than
    /// [`plan::MAX_CHUNKS`].
    fn paced(&self, limit: usize, len: usize) -> usize {
        let whole = super::budget::PACED_WHOLE;
        let Some(p) = self
            .paced_chunk
            .filter(|p| *p < limit && len > whole.max(*p))
        else {
            return limit;
        };
        let n = len.div_ceil(p.max(1)).min(plan::MAX_CHUNKS);
        len.div_ceil(n).min(limit)
    }

    /// The largest message payload with `envelope` at the broker's `max_message_size` (a piece
    /// sealed in the spool is held to this alone: it cannot be cut again).
    fn broker_limit(&self, max_message_size: usize, envelope: &Envelope) -> usize {
        self.max_chunk(max_message_size)
            .saturating_sub(envelope_size(envelope))
            .max(1024)
    }

    /// What a frame's message says besides its payload: the envelope and this producer's own
    /// properties.
    fn envelope(&self, frame: &Held) -> Envelope {
        let mut e = Envelope::grouped(
            &self.cfg.rig,
            self.cfg.bucket_ms,
            self.cfg.group_buckets,
            frame,
        );
        e.properties.extend(self.cfg.properties.iter().cloned());
        e
    }

    /// A frame of a batch as a message of its own (its batch no longer fits the broker).
    fn single(&self, frame: Held, submitted: Instant, max_message_size: usize) -> Message {
        let envelope = self.envelope(&frame);
        let (compression, wire) = crate::payload::compress(self.cfg.compression, &frame.payload);
        let chunks = crate::payload::cut(wire.len(), self.chunk_limit(max_message_size, &envelope));
        let id_seq = self.id_seq(frame.seq);
        Message {
            uncompressed: frame.payload.len(),
            frame,
            id_seq,
            last_id_seq: id_seq,
            batch: Vec::new(),
            envelope,
            generation: 0,
            whole_again: 0,
            wire,
            compression,
            sealed: None,
            chunks,
            receipts: 0,
            assumed: 0,
            written: 0,
            submitted,
            state: State::Sending,
        }
    }

    /// The capture sequence frame `seq`'s ids are made of ([`plan::Numbering::id_seq`]).
    fn id_seq(&self, seq: u64) -> u64 {
        self.cfg.numbering.as_ref().map_or(seq, |n| n.id_seq(seq))
    }

    fn max_chunk(&self, max_message_size: usize) -> usize {
        max_message_size.saturating_sub(CHUNK_HEADROOM).max(2048)
    }

    /// A batch's payload bound: `batch-max-bytes`, and never above the broker's message size.
    fn batch_limit(&self, max_message_size: usize) -> usize {
        self.cfg
            .batch
            .max_bytes
            .min(max_message_size.saturating_sub(CHUNK_HEADROOM))
            .min(self.cfg.max_chunk_bytes.unwrap_or(usize::MAX))
    }

    fn push_done(&mut self, frame: Held, envelope: Envelope, outcome: Outcome, now: Instant) {
        let id_seq = self.id_seq(frame.seq);
        self.messages.push_back(Message {
            frame,
            id_seq,
            last_id_seq: id_seq,
            batch: Vec::new(),
            envelope,
            generation: 0,
            whole_again: 0,
            wire: Bytes::new(),
            compression: 0,
            uncompressed: 0,
            sealed: None,
            chunks: Vec::new(),
            receipts: 0,
            assumed: 0,
            written: 0,
            submitted: now,
            state: State::Done(outcome),
        });
        self.complete_front(now);
    }

    /// When the open batch must go out (`batch-delay-ms` after it opened).
    pub fn batch_due(&self) -> Option<Instant> {
        self.open_batch
            .as_ref()
            .map(|b| b.opened + self.cfg.batch.delay)
    }

    /// Closes the open batch if its delay has passed.
    pub fn close_batch_if_due(&mut self, now: Instant) {
        if self.batch_due().is_some_and(|due| due <= now) {
            self.touch_if_idle(now);
            self.close_batch();
        }
    }

    /// Progress is judged from the moment something becomes outstanding, not from whenever the
    /// link last moved (an idle source must not look stalled when its next frame comes).
    fn touch_if_idle(&mut self, now: Instant) {
        if !self.outstanding() {
            self.last_progress = now;
        }
    }

    /// The open batch becomes a message: one frame as a plain message, several as a batch.
    fn close_batch(&mut self) {
        let Some(b) = self.open_batch.take() else {
            return;
        };
        let mut frames = b.frames.into_iter();
        let Some((first, envelope)) = frames.next() else {
            return;
        };
        let rest: Vec<(Held, Envelope)> = frames.collect();
        // A batch of one is the frame's own bytes, shared, not copied (a drain closes one per
        // camera frame: each has a bucket key of its own).
        let raw = if rest.is_empty() {
            first.payload.clone()
        } else {
            let mut raw = BytesMut::with_capacity(b.bytes + 64 * (rest.len() + 1));
            batch::push(
                &mut raw,
                &envelope,
                plan::sequence_id(self.id_seq(first.seq), 0, 0),
                &first.payload,
            );
            for (f, e) in &rest {
                let id = plan::sequence_id(self.id_seq(f.seq), 0, 0);
                batch::push(&mut raw, e, id, &f.payload);
            }
            raw.freeze()
        };
        let (compression, wire) = crate::payload::compress(self.cfg.compression, &raw);
        let id_seq = self.id_seq(first.seq);
        let last_id_seq = rest.last().map_or(id_seq, |(f, _)| self.id_seq(f.seq));
        self.messages.push_back(Message {
            frame: first,
            id_seq,
            last_id_seq,
            batch: rest.into_iter().map(|(f, _)| f).collect(),
            envelope,
            generation: 0,
            whole_again: 0,
            chunks: crate::payload::cut(wire.len(), wire.len()),
            wire,
            compression,
            uncompressed: raw.len(),
            sealed: None,
            receipts: 0,
            assumed: 0,
            written: 0,
            submitted: b.opened,
            state: State::Sending,
        });
        self.sending += 1;
    }

    /// Whether anything written awaits a receipt, or anything waits to be written.
    fn outstanding(&self) -> bool {
        #[cfg(test)]
        assert_eq!(
            self.sending,
            self.messages.iter().filter(|m| m.sending()).count(),
            "the sending count follows the queue"
        );
        self.sending > 0
    }

    /// Appends the next SEND frame to `out` (the first chunk not yet written on this session), or
    /// returns None when everything is written or there is no session. `publish_ms`: the wall
    /// clock now (the message's publish time).
    pub fn encode_next(
        &mut self,
        out: &mut impl codec::SendOut,
        now: Instant,
        publish_ms: u64,
    ) -> Option<Encoded> {
        let session = self.session?;
        let outstanding_before = self
            .messages
            .iter()
            .any(|m| m.sending() && m.written > m.receipts);
        let m = self
            .messages
            .iter_mut()
            .find(|m| m.sending() && m.written < m.chunks.len())?;
        if !outstanding_before {
            // The clock for progress starts with the first byte awaiting an answer.
            self.last_progress = now;
        }
        let i = m.written;
        let n = m.chunks.len();
        let seq_id = m.sequence_id(i);
        let highest = m
            .batch
            .last()
            .map(|_| plan::sequence_id(m.last_id_seq, 0, 0));
        let mut metadata = MessageMetadata {
            producer_name: self.cfg.producer_name.clone(),
            sequence_id: seq_id,
            publish_time: publish_ms,
            properties: codec::key_values(&m.envelope),
            partition_key: Some(m.envelope.key.clone()),
            event_time: Some(m.envelope.event_time_ms),
            uncompressed_size: Some(m.uncompressed as u32),
            compression: (m.compression != 0).then_some(m.compression),
            ..Default::default()
        };
        if highest.is_some() {
            // A batch: properties are per message (SingleMessageMetadata), the key is shared.
            metadata.properties.clear();
            metadata.num_messages_in_batch = Some(m.frames() as i32);
            metadata.highest_sequence_id = highest;
        }
        if n > 1 {
            // A restart sends a frame cut between its chunks again under a new uuid: consumers
            // drop the earlier run's partial chunks after their reassembly timeout.
            let mut uuid = format!(
                "{}-{:x}-{}",
                self.cfg.producer_name,
                self.cfg.run,
                m.sequence_id(0)
            );
            if m.whole_again > 0 {
                uuid.push_str(&format!("-w{}", m.whole_again));
            }
            metadata.uuid = Some(uuid);
            metadata.num_chunks_from_msg = Some(n as i32);
            let total = m.sealed.as_ref().map_or(m.wire.len(), |s| s.total);
            metadata.total_chunk_msg_size = Some(total as i32);
            metadata.chunk_id = Some(i as i32);
        }
        // Encrypted chunk by chunk, as the clients do: each message decrypts on its own.
        let sealed_now;
        let (payload, encryption) = match (&m.sealed, &self.cfg.encryption) {
            (Some(s), _) => (s.pieces[i].ciphertext.clone(), Some((&s.key, &s.pieces[i]))),
            (None, Some(enc)) => {
                sealed_now = enc.seal(&m.wire[m.chunks[i].clone()]);
                (
                    sealed_now.1.ciphertext.clone(),
                    Some((&sealed_now.0, &sealed_now.1)),
                )
            }
            (None, None) => (m.wire.slice(m.chunks[i].clone()), None),
        };
        if let Some((key, piece)) = encryption {
            metadata.encryption_keys = key.metadata();
            metadata.encryption_param = Some(piece.iv.to_vec());
        }
        let cmd = BaseCommand {
            r#type: Type::Send as i32,
            send: Some(CommandSend {
                producer_id: session.producer_id,
                sequence_id: seq_id,
                highest_sequence_id: highest,
                num_messages: Some(m.frames() as i32),
                is_chunk: Some(n > 1),
                ..Default::default()
            }),
            ..Default::default()
        };
        out.send(&cmd, &metadata, payload);
        m.written += 1;
        Some(Encoded {
            seq: m.frame.seq,
            chunk: i,
            chunks: n,
        })
    }

    /// `bytes` more went out on the socket; `all`: nothing this producer handed the connection
    /// waits untaken. Progress once they add up to [`PROGRESS_BYTES`], or with the last.
    pub fn progressed(&mut self, bytes: usize, all: bool, now: Instant) {
        self.unproven += bytes;
        if all || self.unproven >= PROGRESS_BYTES {
            self.unproven = 0;
            self.last_progress = now;
        }
    }

    /// Bytes are ready but the bandwidth budget holds them back (other sources go first): the
    /// link is not to blame, so the stall and dead clocks start again. A link that dies while
    /// the budget holds a source back is found once it writes again.
    pub fn held_by_budget(&mut self, now: Instant) {
        self.last_progress = now;
    }

    /// A receipt. Receipts for chunks that already have one (a resend the broker deduplicated)
    /// are ignored; a receipt for a chunk not yet due is a protocol violation (reconnect).
    pub fn on_receipt(&mut self, sequence_id: u64, now: Instant) -> Result<(), String> {
        self.last_progress = now;
        let Some(m) = self
            .messages
            .iter_mut()
            .find(|m| m.sending() && m.receipts < m.chunks.len())
        else {
            return Ok(()); // nothing awaits one: a late duplicate
        };
        let expected = m.sequence_id(m.receipts);
        if sequence_id < expected {
            return Ok(());
        }
        if sequence_id > expected || m.receipts >= m.written {
            return Err(format!(
                "receipt for sequence id {sequence_id} while {expected} is pending"
            ));
        }
        m.receipts += 1;
        if m.receipts >= m.chunks.len() {
            m.state = State::Done(Outcome::Persisted);
            self.sending -= 1;
        }
        self.complete_front(now);
        Ok(())
    }

    /// A `SEND_ERROR` for `sequence_id`, decided by its kind as the Java client does
    /// (ClientCnx.handleSendError).
    pub fn on_send_error(
        &mut self,
        sequence_id: u64,
        error: i32,
        message: &str,
        now: Instant,
    ) -> OnSendError {
        let kind = ServerError::try_from(error).unwrap_or(ServerError::UnknownError);
        let what = format!("{} ({})", message, kind.as_str_name());
        match kind {
            ServerError::NotAllowedError => {
                // E.g. a topic policy's max message size: this message can never go. Later
                // messages already written still get their receipts.
                let Some(m) = self
                    .messages
                    .iter_mut()
                    .find(|m| m.sending() && m.owns(sequence_id))
                else {
                    // Every chunk written of a refused frame is refused on its own (issue 46.6):
                    // the first made it Refused, the others name a frame already refused, in
                    // the queue or acked since. Not a reason to reconnect.
                    if self.refused_ids.iter().any(|r| r.contains(&sequence_id)) {
                        return OnSendError::Refused;
                    }
                    return OnSendError::Reconnect(format!(
                        "send error for unknown sequence id {sequence_id}: {what}"
                    ));
                };
                m.state = State::Done(Outcome::Refused(format!("the broker refused it: {what}")));
                if m.chunks.len() > 1 {
                    let ids = m.sequence_id(0)..=m.sequence_id(m.chunks.len() - 1);
                    if self.refused_ids.len() >= REFUSED_IDS {
                        self.refused_ids.pop_front();
                    }
                    self.refused_ids.push_back(ids);
                }
                self.sending -= 1;
                self.complete_front(now);
                OnSendError::Refused
            }
            ServerError::TopicTerminatedError => {
                self.terminated = Some(what.clone());
                OnSendError::Terminated(what)
            }
            _ => OnSendError::Reconnect(format!("send error on sequence id {sequence_id}: {what}")),
        }
    }

    pub fn health(&self, now: Instant) -> Health {
        if self.session.is_none() || !self.outstanding() {
            return Health::Moving;
        }
        let idle = now.saturating_duration_since(self.last_progress);
        if idle >= self.cfg.progress_timeout {
            Health::Dead
        } else if idle >= self.cfg.stall_after {
            Health::Stalled
        } else {
            Health::Moving
        }
    }

    /// Moves completed messages at the front to the acks.
    fn complete_front(&mut self, now: Instant) {
        while let Some(m) = self.messages.front() {
            let State::Done(outcome) = &m.state else {
                break;
            };
            let outcome = outcome.clone();
            let Some(m) = self.messages.pop_front() else {
                break;
            };
            self.frames -= m.frames();
            self.bytes -= m.bytes();
            let latency = now.saturating_duration_since(m.submitted);
            for frame in std::iter::once(m.frame).chain(m.batch) {
                self.acks.push_back(Ack {
                    seq: frame.seq,
                    outcome: outcome.clone(),
                    latency,
                    capture_ns: frame.capture_ns,
                    bytes: frame.payload.len(),
                });
            }
        }
    }

    /// The acks decided so far, in submission order.
    pub fn take_acks(&mut self) -> impl Iterator<Item = Ack> + '_ {
        self.acks.drain(..)
    }

    /// Every frame without an ack, in submission order (shutdown: they go to the spool). Take the
    /// acks first.
    pub fn take_all(&mut self) -> Vec<Held> {
        self.close_batch();
        let mut left = Vec::with_capacity(self.frames);
        for m in self.messages.drain(..) {
            left.push(m.frame);
            left.extend(m.batch);
        }
        self.frames = 0;
        self.bytes = 0;
        self.sending = 0;
        left
    }
}

/// Bytes the metadata of a message takes besides the payload (properties dominate).
pub fn envelope_size(e: &Envelope) -> usize {
    e.key.len()
        + e.properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
}

#[cfg(test)]
mod tests;
