//! What a topic itself holds of a producer name, read back with a non-durable subscription. Used
//! once per process, at the first producer creation ([`super::plan::Read`]):
//!
//! - **Forward** (issue 46.5): the spool keeps, per producer name and topic, the message id of the
//!   name's last receipt ([`Receipts`], `spool::epochs::Mark`). The probe reads the topic forward
//!   from it to the topic's last entry, this name's entries only, and takes the highest sequence id
//!   found (and its frame's chunk count). Other producers' entries in between (a `{modality}`
//!   topic shared by several rigs, a source's later epochs) are skipped, so this works where the
//!   last entry is almost never this name's. Bounded: [`FORWARD_FOR`] from the probe's start and
//!   [`FORWARD_ENTRIES`] entries; at the bound the highest found so far (or the mark's own id)
//!   stands and a warning says frames past it may arrive twice. Stops early at the broker's last id
//!   when it named one (its entry says the chunk count).
//! - **Start**: a name that never sent a frame records the topic's last entry as its mark before
//!   its first frame, so that a kill -9 before its first receipt is read forward from there too.
//! - **LastEntry** (a name without a mark: a spool of an older rigd): the single last entry, which
//!   says something only when it is this name's; another producer's is an error (the caller then
//!   sends what it holds: duplicates possible, never a loss), as before marks.
//!
//! Needed because the broker forgets a producer's deduplication state after
//! `brokerDeduplicationProducerInactivityTimeoutMinutes` (6 h by default: a vehicle parked
//! overnight), and keeps none when deduplication is off; and when the broker does name its last
//! sequence id, the id does not say how many chunks its frame was cut into, and a restart may cut
//! the same frame into fewer (`plan::Probe::ChunksOf`).
//!
//! The probe speaks the protocol itself, on the rig's connection to the topic's broker (the
//! producer's; the same lookup, token and TLS identity), and reads only the entries' *metadata*:
//! the sequence ids, the producer name and the chunk fields are there, so an encrypted batch, a
//! compressed entry or one chunk of a frame is read as easily as a plain message. The payloads
//! still cross the link (a consumer cannot ask for metadata alone): the bounds keep that short.
//! `SUBSCRIBE` (non-durable, at the latest entry), `GET_LAST_MESSAGE_ID` (until it holds still),
//! then a second subscription started at the entry to read from, `FLOW` in batches; both consumers
//! are closed after, which removes their subscriptions.

use pulsar::proto::{
    base_command::Type, command_subscribe::InitialPosition, command_subscribe::SubType,
    BaseCommand, CommandFlow, CommandGetLastMessageId, CommandSubscribe, MessageIdData,
    MessageMetadata,
};

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::connect::Setup;
use super::error::LinkError;
use super::plan::{BrokerLast, Read};
use super::pool::{ChannelEnd, Connection};
use crate::spool::epochs::Mark;

/// The forward read ends this long after the probe started (inside the producer's 10 s bound on
/// the whole probe, settling included).
pub const FORWARD_FOR: Duration = Duration::from_millis(8500);
/// ... or after this many entries read.
pub const FORWARD_ENTRIES: usize = 20_000;
/// Permits asked at once while reading forward.
const FLOW_BATCH: u32 = 500;
/// No entry for this long short of the topic's end: permits are asked again.
const QUIET: Duration = Duration::from_millis(500);
/// A producer's mark is written at most this often while receipts come.
pub const MARK_EVERY: Duration = Duration::from_secs(1);

/// What the probe found: the highest sequence id of the name (None: nothing of it), and, when a
/// bound ended the forward read before the topic's last entry, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub last: Option<BrokerLast>,
    pub bounded: Option<String>,
    /// Entries read.
    pub entries: usize,
}

/// Reads what the topic holds of `setup.producer_name`, as `asked` says ([`Read`]).
/// `receipts`: the name's marks in the spool (a start mark is recorded here when there is none).
/// Errors name what failed; the caller then trusts the broker's answer alone.
pub async fn read(
    setup: &mut Setup,
    asked: Read,
    receipts: Option<&Arc<Receipts>>,
) -> Result<Found, LinkError> {
    let started = Instant::now();
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
    let wait = asked.settles();
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
    let last = last.filter(|id| id.ledger_id != u64::MAX && id.entry_id != u64::MAX);
    let nothing = Found {
        last: None,
        bounded: None,
        entries: 0,
    };
    // A name without a mark gets one now, before any frame of this process goes out under it:
    // the topic's last entry (whatever this read finds of the name is at or before it).
    let start = Mark {
        at: last.as_ref().map(|l| (l.ledger_id, l.entry_id)),
        sequence_id: None,
    };
    let (from, stop_at) = match asked {
        Read::No => return Ok(nothing),
        Read::Start => {
            if let Some(r) = receipts {
                r.start(start).await;
            }
            return Ok(nothing);
        }
        Read::LastEntry(_) => (start.at, None),
        Read::Forward { mark, broker } => (mark.at, broker),
    };
    let Some(end) = last else {
        if let Some(r) = receipts {
            r.start(start).await;
        }
        // Nothing on the topic: a mark's own receipt is all that is known (its entry trimmed).
        let last = match asked {
            Read::Forward { mark, .. } => mark.sequence_id.map(BrokerLast::id),
            _ => None,
        };
        return Ok(Found { last, ..nothing });
    };
    if from.is_some_and(|f| f > (end.ledger_id, end.entry_id)) {
        // The mark is past the topic's end (the topic was emptied or recreated): nothing to read.
        if let Read::Forward { mark, .. } = asked {
            return Ok(Scan::new("", (0, 0), None, started).found(mark));
        }
    }
    let mut second = Consumer::attach(&conn)?;
    // A non-durable subscription started at an entry delivers that entry first (measured on
    // Pulsar 3.0.7: starting one entry earlier read the previous message and resent the last).
    let at = from.map(|(ledger_id, entry_id)| MessageIdData {
        ledger_id,
        entry_id,
        ..Default::default()
    });
    let earliest = at.is_none();
    subscribe_at(
        setup,
        &conn,
        second.end.id,
        &format!("{subscription}-r"),
        at,
        earliest,
    )
    .await?;
    let mut scan = Scan::new(
        &setup.producer_name,
        (end.ledger_id, end.entry_id),
        stop_at,
        started + FORWARD_FOR,
    );
    let Read::Forward { mark, .. } = asked else {
        // The last entry alone: judged as it is (another name's is an error).
        flow(&conn, second.end.id, 1);
        let frame = next_message(&conn, &mut second, setup.setup_timeout).await?;
        let m = frame
            .metadata
            .ok_or_else(|| LinkError::Broker("a MESSAGE without a payload".into()))?;
        let judged = judge(&m, &setup.producer_name);
        if let Some(r) = receipts {
            let seq = judged.as_ref().ok().map(|j| j.sequence_id);
            r.start(Mark {
                sequence_id: seq,
                ..start
            })
            .await;
        }
        return judged.map(|j| Found {
            last: Some(j),
            bounded: None,
            entries: 1,
        });
    };
    let mut permits = 0u32;
    loop {
        if permits < FLOW_BATCH / 2 {
            flow(&conn, second.end.id, FLOW_BATCH);
            permits += FLOW_BATCH;
        }
        let wait = scan
            .deadline
            .saturating_duration_since(Instant::now())
            .min(QUIET);
        let frame = match next_message(&conn, &mut second, wait).await {
            Ok(f) => f,
            // Quiet short of the end: permits are asked again (the broker counts a batch's
            // messages, not its entry), until the deadline.
            Err(LinkError::Timeout(_)) if Instant::now() < scan.deadline => {
                permits = 0;
                continue;
            }
            Err(LinkError::Timeout(_)) => {
                scan.bound(format!(
                    "no entry past {:?} within {} ms",
                    scan.at,
                    FORWARD_FOR.as_millis()
                ));
                break;
            }
            Err(e) => return Err(e),
        };
        let (Some(m), Some(msg)) = (frame.metadata.as_ref(), frame.cmd.message.as_ref()) else {
            continue;
        };
        // A batch's entry costs as many permits as it holds messages.
        permits = permits.saturating_sub(m.num_messages_in_batch.unwrap_or(1).max(1) as u32);
        let id = (msg.message_id.ledger_id, msg.message_id.entry_id);
        if scan.entry(id, m, Instant::now()) {
            break;
        }
    }
    if let (Some(r), Some(next)) = (receipts, scan.advanced(mark)) {
        r.advance(next).await;
    }
    Ok(scan.found(mark))
}

/// [`read`] as the producer takes it: the name's highest stored sequence id, logged as a forward
/// read found it (how far it read; a bound that ended it, and what that costs).
pub async fn last_entry(
    setup: &mut Setup,
    asked: Read,
    receipts: Option<&Arc<Receipts>>,
) -> Result<Option<BrokerLast>, LinkError> {
    let found = read(setup, asked, receipts).await?;
    if let Read::Forward { mark, broker } = asked {
        let last = found.last.map(|l| l.sequence_id);
        match &found.bounded {
            None => tracing::info!(topic = %setup.topic, producer = %setup.producer_name,
                mark = ?mark.at, entries = found.entries, last_sequence_id = ?last,
                seq = ?last.map(super::plan::capture_seq), broker_last_sequence_id = ?broker,
                "read the topic forward from this producer's last recorded receipt: its highest stored frame decides what of an earlier run is already stored"),
            Some(why) => tracing::warn!(topic = %setup.topic, producer = %setup.producer_name,
                mark = ?mark.at, entries = found.entries, last_sequence_id = ?last, bound = %why,
                "the forward read from this producer's last recorded receipt stopped at its bound before the topic's end: frames of an earlier run above what it found may arrive twice"),
        }
    }
    Ok(found.last)
}

/// The next MESSAGE of `consumer`, waiting at most `wait`.
async fn next_message(
    conn: &Connection,
    consumer: &mut Consumer<'_>,
    wait: Duration,
) -> Result<super::codec::Inbound, LinkError> {
    loop {
        let frame = tokio::time::timeout(wait, consumer.end.inbound.recv())
            .await
            .map_err(|_| LinkError::Timeout("the topic's entries".into()))?
            .ok_or_else(|| conn.failure().unwrap_or(LinkError::Closed))?;
        if frame.cmd.message.is_some() {
            return Ok(frame);
        }
    }
}

pub(super) fn flow(conn: &Connection, consumer_id: u64, permits: u32) {
    conn.control(&BaseCommand {
        r#type: Type::Flow as i32,
        flow: Some(CommandFlow {
            consumer_id,
            message_permits: permits,
        }),
        ..Default::default()
    });
}

/// The forward read's decisions, pure: what the entries read say of one producer name, and when
/// the read is over (the topic's last entry as it stood, the broker's last id found, or a bound).
#[derive(Debug)]
struct Scan {
    producer: String,
    /// The topic's last entry when the read started: reached, the read is complete.
    end: (u64, u64),
    /// The broker's last id for the name: the name holds nothing above it, so its entry ends the
    /// read.
    stop_at: Option<u64>,
    deadline: Instant,
    /// The last entry read.
    at: Option<(u64, u64)>,
    found: Option<BrokerLast>,
    /// The entry `found` was read from.
    found_at: Option<(u64, u64)>,
    entries: usize,
    bounded: Option<String>,
}

impl Scan {
    fn new(producer: &str, end: (u64, u64), stop_at: Option<u64>, deadline: Instant) -> Self {
        Scan {
            producer: producer.to_string(),
            end,
            stop_at,
            deadline,
            at: None,
            found: None,
            found_at: None,
            entries: 0,
            bounded: None,
        }
    }

    /// Feeds an entry (each message of a batch comes with its entry's id); true: the read is over.
    fn entry(&mut self, id: (u64, u64), m: &MessageMetadata, now: Instant) -> bool {
        if self.at != Some(id) {
            self.entries += 1;
        }
        self.at = Some(id);
        if let Ok(j) = judge(m, &self.producer) {
            if self.found.is_none_or(|f| j.sequence_id >= f.sequence_id) {
                self.found = Some(j);
                self.found_at = Some(id);
            }
        }
        let past_end = id >= self.end;
        let at_broker =
            matches!((self.stop_at, self.found), (Some(s), Some(f)) if f.sequence_id >= s);
        if past_end || at_broker {
            return true;
        }
        if self.entries >= FORWARD_ENTRIES {
            self.bound(format!("{FORWARD_ENTRIES} entries read"));
            return true;
        }
        if now >= self.deadline {
            self.bound(format!("{} ms", FORWARD_FOR.as_millis()));
            return true;
        }
        false
    }

    fn bound(&mut self, why: String) {
        self.bounded = Some(why);
    }

    /// What the read found, with the mark's own receipt as a floor (its entry may be gone).
    /// Where the next start may read from after a read that reached the topic's end (None: it
    /// was bounded, the mark stands): this name's highest entry (read again for its chunk count),
    /// or with nothing of the name past the mark, the end itself with the mark's receipt. A name
    /// that sent nothing (a start mark) so stops reading the whole topic at every start.
    fn advanced(&self, mark: Mark) -> Option<Mark> {
        if self.bounded.is_some() {
            return None;
        }
        let next = match (self.found_at, self.found) {
            (Some(at), Some(f)) if mark.sequence_id.is_none_or(|m| f.sequence_id >= m) => Mark {
                at: Some(at),
                sequence_id: Some(f.sequence_id),
            },
            _ => Mark {
                at: Some(self.end),
                ..mark
            },
        };
        (next != mark).then_some(next)
    }

    fn found(self, mark: Mark) -> Found {
        let floor = mark.sequence_id.map(BrokerLast::id);
        let last = match (self.found, floor) {
            (Some(f), Some(m)) if m.sequence_id > f.sequence_id => Some(m),
            (f, m) => f.or(m),
        };
        Found {
            last,
            bounded: self.bounded,
            entries: self.entries,
        }
    }
}

/// A producer name's marks on one topic, as the spool keeps them (`spool::epochs::Mark`): the
/// message id of its last receipt, written at most every [`MARK_EVERY`] while receipts come
/// (never per frame), and when the producer ends (its session's task drops it: a clean close).
/// A kill -9 loses at most the last second's receipts, which the forward read covers.
pub struct Receipts {
    dir: PathBuf,
    topic: String,
    producer: String,
    state: Mutex<MarkState>,
}

#[derive(Debug, Default)]
struct MarkState {
    /// What the spool holds.
    persisted: Option<Mark>,
    /// The last receipt's (not written yet when it differs).
    latest: Option<Mark>,
    written_at: Option<Instant>,
    /// A write is under way on the blocking pool.
    writing: bool,
}

impl Receipts {
    /// The marks of `producer` on `topic` in the spool directory `dir`. A mark that cannot be read
    /// is logged and taken as none (the probe then does what it did before marks).
    pub fn open(dir: &Path, topic: &str, producer: &str) -> Arc<Self> {
        let persisted = match crate::spool::epochs::read_mark(dir, topic, producer) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(%topic, %producer, error = %e,
                    "spool: the producer's mark cannot be read; a restart judges by the topic's last entry");
                None
            }
        };
        Arc::new(Receipts {
            dir: dir.to_path_buf(),
            topic: topic.to_string(),
            producer: producer.to_string(),
            state: Mutex::new(MarkState {
                persisted,
                latest: persisted,
                ..Default::default()
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MarkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mark as the spool holds it.
    pub fn persisted(&self) -> Option<Mark> {
        self.state().persisted
    }

    /// A SEND_RECEIPT of the name: noted, written if [`MARK_EVERY`] has passed since the last
    /// write (on the blocking pool: the session does not wait for it).
    pub fn receipt(self: &Arc<Self>, r: &pulsar::proto::CommandSendReceipt) {
        let Some(id) = &r.message_id else { return };
        let mark = Mark {
            at: Some((id.ledger_id, id.entry_id)),
            sequence_id: Some(highest(r.sequence_id, r.highest_sequence_id)),
        };
        let now = Instant::now();
        let due = {
            let mut st = self.state();
            st.latest = Some(mark);
            let due = !st.writing && st.written_at.is_none_or(|t| now >= t + MARK_EVERY);
            if due {
                st.writing = true;
                st.written_at = Some(now);
            }
            due
        };
        if due {
            let me = self.clone();
            drop(tokio::task::spawn_blocking(move || me.write_latest()));
        }
    }

    /// Writes the latest mark if the spool does not hold it; logs a failure (the older mark
    /// stands: a lower bound).
    fn write_latest(&self) {
        let (latest, persisted) = {
            let st = self.state();
            (st.latest, st.persisted)
        };
        let r = match latest {
            Some(m) if Some(m) != persisted => {
                crate::spool::epochs::write_mark(&self.dir, &self.topic, &self.producer, m)
                    .map(|()| Some(m))
            }
            _ => Ok(None),
        };
        let mut st = self.state();
        st.writing = false;
        match r {
            Ok(Some(m)) => st.persisted = Some(m),
            Ok(None) => {}
            Err(e) => tracing::warn!(topic = %self.topic, producer = %self.producer, error = %e,
                "spool: cannot record the producer's last receipt; a restart reads the topic from an older one"),
        }
    }

    /// Moves the mark forward after a complete read (before this process sends under the name);
    /// waits for it.
    pub async fn advance(self: &Arc<Self>, mark: Mark) {
        {
            let mut st = self.state();
            if st.latest != st.persisted || st.writing {
                return;
            }
            st.latest = Some(mark);
            st.writing = true;
        }
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.write_latest()).await;
    }

    /// Records a start mark (the name has none) before the first frame goes out; waits for it.
    pub async fn start(self: &Arc<Self>, mark: Mark) {
        {
            let mut st = self.state();
            if st.persisted.is_some() {
                return;
            }
            st.latest = Some(mark);
            st.writing = true;
        }
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.write_latest()).await;
    }
}

impl Drop for Receipts {
    /// The producer ended: its last receipt is recorded (a clean close leaves the exact mark).
    fn drop(&mut self) {
        self.write_latest();
    }
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
        self.conn.detach_consumer(self.end.id);
    }
}

/// A batch's highest sequence id, or the id itself: the broker answers a message that is not a
/// batch with `highest_sequence_id` -1 (u64::MAX on the wire; measured on Pulsar 3.0.7), which
/// taken as an id would judge every frame stored.
fn highest(sequence_id: u64, highest: Option<u64>) -> u64 {
    highest
        .filter(|&h| h != u64::MAX && h >= sequence_id)
        .unwrap_or(sequence_id)
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
        sequence_id: highest(m.sequence_id, m.highest_sequence_id),
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
    subscribe_at(setup, conn, consumer_id, subscription, start, false).await
}

/// A non-durable subscription at `start`, or at the latest entry (`earliest`: the first).
async fn subscribe_at(
    setup: &Setup,
    conn: &Connection,
    consumer_id: u64,
    subscription: &str,
    start: Option<MessageIdData>,
    earliest: bool,
) -> Result<(), LinkError> {
    let initial = if earliest {
        InitialPosition::Earliest
    } else {
        InitialPosition::Latest
    };
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
                    initial_position: Some(initial as i32),
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
    use crate::uplink::plan::sequence_id;

    fn entry(producer: &str, seq: u64, chunk: Option<(i32, i32)>) -> MessageMetadata {
        MessageMetadata {
            producer_name: producer.into(),
            sequence_id: sequence_id(seq, 0, chunk.map_or(0, |c| c.0 as usize)),
            chunk_id: chunk.map(|c| c.0),
            num_chunks_from_msg: chunk.map(|c| c.1),
            ..Default::default()
        }
    }

    #[test]
    fn the_forward_read_finds_its_own_highest_entry_among_other_rigs() {
        // Issue 46.5: a `{modality}` topic shared with another rig; read from the mark (3, 10)
        // to the topic's end (3, 20) when the read started.
        let t0 = Instant::now();
        let mark = Mark {
            at: Some((3, 10)),
            sequence_id: Some(sequence_id(40, 0, 0)),
        };
        let mut scan = Scan::new("rigd-a-gps", (3, 20), None, t0 + FORWARD_FOR);
        assert!(!scan.entry((3, 10), &entry("rigd-a-gps", 40, None), t0));
        assert!(!scan.entry((3, 11), &entry("rigd-b-gps", 900, None), t0));
        assert!(!scan.entry((3, 12), &entry("rigd-a-gps", 41, Some((0, 2))), t0));
        assert!(!scan.entry((3, 13), &entry("rigd-a-gps", 41, Some((1, 2))), t0));
        assert!(!scan.entry((3, 14), &entry("rigd-a-gps", 42, Some((0, 3))), t0));
        // Another rig's entries after this rig's last: skipped, whatever their ids.
        for e in 15..20 {
            assert!(!scan.entry((3, e), &entry("rigd-b-gps", 901 + e, None), t0));
        }
        assert!(
            scan.entry((3, 20), &entry("rigd-b-gps", 999, None), t0),
            "the end"
        );
        let found = scan.found(mark);
        assert_eq!(
            found.last,
            Some(BrokerLast {
                sequence_id: sequence_id(42, 0, 0),
                chunks: Some(3)
            }),
            "frame 42's first of 3 chunks: not complete"
        );
        assert_eq!((found.bounded, found.entries), (None, 11));
        // The next start reads from frame 42's entry on (again, for its chunk count).
        let mut scan = Scan::new("rigd-a-gps", (3, 20), None, t0 + FORWARD_FOR);
        assert!(!scan.entry((3, 14), &entry("rigd-a-gps", 42, Some((0, 3))), t0));
        assert!(scan.entry((3, 20), &entry("rigd-b-gps", 999, None), t0));
        assert_eq!(
            scan.advanced(mark),
            Some(Mark {
                at: Some((3, 14)),
                sequence_id: Some(sequence_id(42, 0, 0))
            })
        );

        // The broker named frame 41's last chunk: its entry ends the read early.
        let mut scan = Scan::new(
            "rigd-a-gps",
            (3, 20),
            Some(sequence_id(41, 0, 1)),
            t0 + FORWARD_FOR,
        );
        assert!(!scan.entry((3, 12), &entry("rigd-a-gps", 41, Some((0, 2))), t0));
        assert!(scan.entry((3, 13), &entry("rigd-a-gps", 41, Some((1, 2))), t0));

        // Nothing of the name past the mark (its own entry trimmed): the mark's receipt stands.
        let mut scan = Scan::new("rigd-a-gps", (3, 20), None, t0 + FORWARD_FOR);
        assert!(scan.entry((3, 20), &entry("rigd-b-gps", 1, None), t0));
        assert_eq!(
            scan.advanced(mark),
            Some(Mark {
                at: Some((3, 20)),
                ..mark
            }),
            "nothing of the name up to the end: the next start reads from there"
        );
        assert_eq!(
            scan.found(mark).last,
            Some(BrokerLast::id(sequence_id(40, 0, 0)))
        );
        // A start mark (no receipt yet) and nothing found: nothing is known to be stored.
        let start = Mark {
            at: Some((3, 10)),
            sequence_id: None,
        };
        let scan = Scan::new("rigd-a-gps", (3, 20), None, t0 + FORWARD_FOR);
        assert_eq!(scan.found(start).last, None);
    }

    #[test]
    fn the_forward_read_stops_at_its_bounds_with_what_it_found() {
        let t0 = Instant::now();
        let mark = Mark {
            at: Some((1, 0)),
            sequence_id: None,
        };
        // The deadline: what was found so far stands, and the bound is named.
        let mut scan = Scan::new("rigd-a-gps", (9, 0), None, t0 + FORWARD_FOR);
        assert!(!scan.entry((1, 0), &entry("rigd-a-gps", 5, None), t0));
        assert!(scan.entry((1, 1), &entry("rigd-b-gps", 5, None), t0 + FORWARD_FOR));
        let found = scan.found(mark);
        assert_eq!(found.last, Some(BrokerLast::id(sequence_id(5, 0, 0))));
        assert!(found.bounded.is_some());
        let mut scan = Scan::new("rigd-a-gps", (9, 0), None, t0 + FORWARD_FOR);
        assert!(scan.entry((1, 1), &entry("rigd-b-gps", 5, None), t0 + FORWARD_FOR));
        assert_eq!(scan.advanced(mark), None, "bounded: the mark stands");
        // The number of entries; a batch's messages share their entry and count once.
        let mut scan = Scan::new("rigd-a-gps", (9, 0), None, t0 + FORWARD_FOR);
        for i in 0..FORWARD_ENTRIES as u64 - 1 {
            assert!(!scan.entry((1, i), &entry("rigd-b-gps", i, None), t0));
            assert!(!scan.entry((1, i), &entry("rigd-b-gps", i, None), t0));
        }
        assert!(scan.entry(
            (1, FORWARD_ENTRIES as u64),
            &entry("rigd-b-gps", 0, None),
            t0
        ));
        let found = scan.found(mark);
        assert_eq!((found.last, found.entries), (None, FORWARD_ENTRIES));
        assert!(found.bounded.unwrap().contains("entries"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn receipts_are_recorded_at_most_every_second_and_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (t, p) = ("persistent://public/default/serial", "rigd-a-gps");
        let receipt = |seq: u64, entry: u64| pulsar::proto::CommandSendReceipt {
            producer_id: 1,
            sequence_id: sequence_id(seq, 0, 0),
            message_id: Some(MessageIdData {
                ledger_id: 7,
                entry_id: entry,
                ..Default::default()
            }),
            // As the broker answers a message that is not a batch.
            highest_sequence_id: Some(u64::MAX),
        };
        let r = Receipts::open(d, t, p);
        assert_eq!(r.persisted(), None);
        // A start mark before the first frame, awaited.
        let start = Mark {
            at: Some((7, 0)),
            sequence_id: None,
        };
        r.start(start).await;
        assert_eq!(
            crate::spool::epochs::read_mark(d, t, p).unwrap(),
            Some(start)
        );
        // The first receipt is written at once (in the background), the next ones within the
        // second are not.
        r.receipt(&receipt(1, 1));
        let first = Mark {
            at: Some((7, 1)),
            sequence_id: Some(sequence_id(1, 0, 0)),
        };
        for _ in 0..100 {
            if r.persisted() == Some(first) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(r.persisted(), Some(first));
        for i in 2..50 {
            r.receipt(&receipt(i, i));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            crate::spool::epochs::read_mark(d, t, p).unwrap(),
            Some(first)
        );
        assert_eq!(highest(5, Some(u64::MAX)), 5, "not a batch");
        assert_eq!(highest(5, Some(9)), 9, "a batch's highest");
        assert_eq!(highest(5, None), 5);
        // The producer ends: its last receipt is recorded.
        drop(r);
        let last = Mark {
            at: Some((7, 49)),
            sequence_id: Some(sequence_id(49, 0, 0)),
        };
        assert_eq!(
            crate::spool::epochs::read_mark(d, t, p).unwrap(),
            Some(last)
        );
        // Opened again (a restart): the mark is there; a start mark does not replace it.
        let r = Receipts::open(d, t, p);
        assert_eq!(r.persisted(), Some(last));
        r.start(start).await;
        drop(r);
        assert_eq!(
            crate::spool::epochs::read_mark(d, t, p).unwrap(),
            Some(last)
        );
    }

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
