//! One connection's decisions as a value, time passed in: which queued frame the writer takes
//! next (control commands first, then live before backlog with every rank's wait bounded), what
//! each channel is credited with and how long its frames have waited (starved), when a quiet
//! broker is pinged and when its silence ends the connection, when a write the socket does not
//! take is the broker throttling the connection (wait) rather than a dead link, and which sockets
//! of connections given up for silence are reset when. No clock read, lock, channel or socket
//! here: the connection's tasks (`pool.rs`) tell it what happened and perform what it answers, as
//! `pipeline/lane.rs` does for a source's lane.
//!
//! What the tasks must do, and what then holds:
//! - The writer asks [`ConnectionState::next`] and writes what it answers whole; around every
//!   socket write it calls [`ConnectionState::write_waits`] and [`ConnectionState::wrote`] (whose
//!   answer is the one channel to tell of progress), and [`ConnectionState::frame_done`] after
//!   the last byte. The reader calls [`ConnectionState::inbound`] for every command.
//! - The keepalive calls [`ConnectionState::tick`] every [`TICK`] and performs its [`Tick`].
//! - After every call, [`ConnectionState::take_told`] gives what each channel is to be told
//!   ([`Wait`]); the producer restarts its stall clock on a [`Wait::excuses`] and shows the wait.
//!
//! Then: a channel with frames queued is taken within [`OVERDUE_AFTER`] of the moment its frames
//! began to wait, or once the connection's deficit covers [`OUT_OF_RANK_COST`] times its next
//! entry if that is later, plus the entry being written and those of channels overdue
//! before it (live first otherwise, equals frame by frame); progress is credited to the channel written only;
//! a channel that waits while the connection moves is told so, never credited; a connection is
//! ended for the broker's silence only (`session::keepalive`), never for a write the broker does
//! not take while it still talks.

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;
use std::time::Instant;

use crate::uplink::codec::Frames;

pub use super::super::budget::OVERDUE_AFTER;
use super::super::session::{keepalive, Keepalive};
#[cfg(test)]
use super::super::session::{DEAD_IDLE, PING_IDLE};
pub use super::super::window::PROGRESS_BYTES;

/// The keepalive's tick.
pub const TICK: Duration = Duration::from_millis(500);
/// A turn out of rank order costs this many times its bytes from a deficit the connection earns
/// with every byte it writes in rank order while some channel waits (the turn then takes every
/// queued entry of the channel the deficit covers): the channels waiting behind better ranks take
/// at most a tenth of the link that way, together, so live frames keep nine tenths; a small entry
/// (a serial source's batch) goes at [`OVERDUE_AFTER`], a large one (a camera backlog's chunk,
/// under a budget up to `budget::SECONDS_AHEAD` of the link) after nine times its length of
/// traffic in rank order.
pub const OUT_OF_RANK_COST: u64 = 9;
/// A channel whose frames have waited this long is reported starved.
pub const STARVED_AFTER: Duration = Duration::from_secs(1);
/// A socket write that waited this long, with the broker talking since it began, is the broker
/// not reading (its per-connection throttle: publish rate limits, pending publish requests):
/// every channel waits, none is to blame.
pub const THROTTLED_AFTER: Duration = Duration::from_secs(1);
/// ... as long as the broker said something this recently (it pings every 30 s, as rigd does,
/// whether or not it reads: `keepAliveIntervalSeconds`).
pub const THROTTLE_QUIET: Duration = Duration::from_secs(40);
/// ... and as long as the connection moved this recently (`last_written`: [`PROGRESS_BYTES`]
/// taken, or a frame's entry written whole). A broker's throttle pauses reading for at most about
/// a second at a time (a publish rate limit's period; pending publishes persisted), so the link
/// moves between pauses; a link slowed to a trickle in rigd's direction (the broker's receipts for
/// what got through and its pings still arrive) does not, and is found stalled.
pub const THROTTLE_STILL: Duration = Duration::from_secs(2);
/// A quiet broker is pinged again this often until it answers.
pub const PING_EVERY: Duration = Duration::from_secs(5);
/// A connection given up for silence is kept open at most this long for its reset (see
/// [`Retired`]); by then the broker's own keepalive has closed its end.
pub const RETIRED_FOR: Duration = Duration::from_secs(120);
/// ... and at most this many per broker.
pub const RETIRED_MAX: usize = 8;

/// What a channel's producer is told of its frames on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Its frames have waited untaken this long. `excused`: the connection moves meanwhile
    /// (other channels' bytes go out) or the broker talks while it takes nothing (a throttle), so
    /// the link is not to blame; unexcused, the producer's own stall clock runs on.
    Queued { waited: Duration, excused: bool },
    /// Its bytes are being written and held back, not by a fault of the link: by the budget, or
    /// by a broker that talks while it takes nothing.
    Held,
    /// It waits no more: taken, emptied, detached, or the connection ended.
    Over,
}

impl Wait {
    /// The producer's stall clock starts again.
    pub fn excuses(&self) -> bool {
        matches!(self, Wait::Held | Wait::Queued { excused: true, .. })
    }

    /// How long its frames have waited untaken (zero while written or not waiting).
    pub fn waited(&self) -> Duration {
        match self {
            Wait::Queued { waited, .. } => *waited,
            _ => Duration::ZERO,
        }
    }

    pub fn starved(&self) -> bool {
        self.waited() >= STARVED_AFTER
    }
}

/// What the writer writes next, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A command before every frame (answers to the broker, requests, closes, pings).
    Control(Bytes),
    /// Queued frames of channel `id`.
    Frame { id: u64, bytes: Frames },
}

/// What a keepalive tick asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// Nothing.
    Quiet,
    /// The broker has been quiet for `session::PING_IDLE`: queue a PING.
    Ping,
    /// The broker has been silent for `session::DEAD_IDLE` (`session::keepalive`): end the
    /// connection.
    Dead,
}

#[derive(Debug, Default)]
struct Queue {
    frames: VecDeque<Frames>,
    queued: usize,
    written: u64,
    /// Since when its frames have waited untaken (None: nothing queued, or being written).
    waiting_since: Option<Instant>,
    /// Told a [`Wait::Queued`] since it was last taken (its end is told once).
    told: bool,
}

impl Queue {
    /// Its frames may go out of rank order with the connection's deficit `credit`.
    fn covered_by(&self, credit: u64) -> bool {
        self.frames
            .front()
            .is_some_and(|f| credit >= OUT_OF_RANK_COST * f.len() as u64)
    }
}

/// The write in progress.
#[derive(Debug, Clone, Copy)]
struct Writing {
    /// Its channel (None: a control command).
    id: Option<u64>,
    /// Since when the socket has not taken a byte of the current write call (None: not waiting).
    waits_since: Option<Instant>,
    /// The broker said something while the socket took nothing of it.
    heard_while_waiting: bool,
    /// Taken out of rank order (paid from the deficit already).
    out_of_rank: bool,
}

/// One connection's queues, write order, keepalive and throttle. Pure.
#[derive(Debug)]
pub struct ConnectionState {
    control: VecDeque<Bytes>,
    queues: BTreeMap<u64, Queue>,
    /// The channel taken last (equals take turns).
    last_served: u64,
    writing: Option<Writing>,
    /// When the socket last moved: took [`PROGRESS_BYTES`] (since the previous time) or the
    /// last byte of a frame's entry. A link that takes a few hundred bytes a second (a trickle)
    /// does not move by this measure, so the channels waiting behind it are not excused.
    last_written: Option<Instant>,
    /// Bytes taken since `last_written`.
    moved: usize,
    /// When the broker answered CONNECT.
    opened: Instant,
    last_inbound: Instant,
    pinged: Option<Instant>,
    told: Vec<(u64, Wait)>,
    /// Bytes written in rank order while some channel waited, less [`OUT_OF_RANK_COST`] times
    /// the bytes of every turn out of rank order since (the deficit).
    credit: u64,
}

impl ConnectionState {
    /// A connection that answered CONNECT at `now`.
    pub fn new(now: Instant) -> Self {
        ConnectionState {
            control: VecDeque::new(),
            queues: BTreeMap::new(),
            last_served: 0,
            writing: None,
            last_written: None,
            moved: 0,
            opened: now,
            last_inbound: now,
            pinged: None,
            told: Vec::new(),
            credit: 0,
        }
    }

    pub fn attach(&mut self, id: u64) {
        self.queues.entry(id).or_default();
    }

    /// Channel `id` goes, its queued frames dropped (none is begun: the writer takes an entry
    /// whole). True when it had been told it waits: tell it [`Wait::Over`].
    pub fn detach(&mut self, id: u64) -> bool {
        self.queues.remove(&id).is_some_and(|q| q.told)
    }

    /// The connection ended: the channels that had been told they wait (tell them it is over).
    pub fn end(&mut self) -> Vec<u64> {
        self.control.clear();
        let told = self
            .queues
            .iter()
            .filter(|(_, q)| q.told)
            .map(|(id, _)| *id)
            .collect();
        self.queues.clear();
        told
    }

    pub fn control(&mut self, cmd: Bytes) {
        self.control.push_back(cmd);
    }

    /// Queues frames of channel `id`; false when it is not attached.
    pub fn push(&mut self, id: u64, frames: Frames, now: Instant) -> bool {
        let written_now = self.writing.is_some_and(|w| w.id == Some(id));
        let Some(q) = self.queues.get_mut(&id) else {
            return false;
        };
        q.queued += frames.len();
        q.frames.push_back(frames);
        if q.waiting_since.is_none() && !written_now {
            q.waiting_since = Some(now);
        }
        true
    }

    /// Channel `id`'s bytes written so far and bytes queued.
    pub fn progress(&self, id: u64) -> (u64, usize) {
        self.queues
            .get(&id)
            .map_or((0, 0), |q| (q.written, q.queued))
    }

    /// The instant of the broker's last command.
    pub fn last_inbound(&self) -> Instant {
        self.last_inbound
    }

    /// The next thing to write (a control command before any frame), and the write begins.
    /// `rank`: each channel's budget rank now.
    pub fn next(&mut self, now: Instant, rank: impl Fn(u64) -> usize) -> Option<Next> {
        if let Some(cmd) = self.control.pop_front() {
            self.writing = Some(Writing::of(None));
            return Some(Next::Control(cmd));
        }
        let id = pick(
            self.queues
                .iter()
                .filter(|(_, q)| !q.frames.is_empty())
                .map(|(id, q)| Candidate {
                    id: *id,
                    rank: rank(*id),
                    waiting_since: q.waiting_since.filter(|_| q.covered_by(self.credit)),
                }),
            self.last_served,
            now,
        )?;
        self.last_served = id;
        let q = self.queues.get_mut(&id)?;
        let out_of_rank = q.covered_by(self.credit)
            && q.waiting_since
                .is_some_and(|t| now.saturating_duration_since(t) >= OVERDUE_AFTER);
        let mut bytes = q.frames.pop_front()?;
        if out_of_rank {
            // The turn is worth what the deficit covers: every queued entry it covers goes with
            // the first (a producer of small frames queues one entry per turn of its own).
            let allowance = self.credit / OUT_OF_RANK_COST;
            let mut more = bytes.len() as u64;
            while let Some(f) = q.frames.front() {
                more += f.len() as u64;
                if more > allowance {
                    break;
                }
                let f = q.frames.pop_front()?;
                bytes.append(f);
            }
            self.credit = self
                .credit
                .saturating_sub(OUT_OF_RANK_COST * bytes.len() as u64);
        }
        q.waiting_since = None;
        if std::mem::take(&mut q.told) {
            self.told.push((id, Wait::Over));
        }
        self.writing = Some(Writing {
            out_of_rank,
            ..Writing::of(Some(id))
        });
        Some(Next::Frame { id, bytes })
    }

    /// The writer waits for the socket to take bytes of the write in progress.
    pub fn write_waits(&mut self, now: Instant) {
        if let Some(w) = &mut self.writing {
            w.waits_since.get_or_insert(now);
        }
    }

    /// The socket took `n` bytes of the write in progress: its channel is credited, and is the
    /// one to tell of progress (None: a control command, or a channel detached meanwhile).
    pub fn wrote(&mut self, n: usize, now: Instant) -> Option<u64> {
        self.moved += n;
        if self.moved >= PROGRESS_BYTES {
            self.moved = 0;
            self.last_written = Some(now);
        }
        let w = self.writing.as_mut()?;
        w.waits_since = None;
        w.heard_while_waiting = false;
        let written = w.id;
        if !w.out_of_rank {
            let waits = self.queues.values().any(|q| q.waiting_since.is_some());
            self.credit = if waits { self.credit + n as u64 } else { 0 };
        }
        let q = self.queues.get_mut(&written?)?;
        q.written += n as u64;
        q.queued = q.queued.saturating_sub(n);
        written
    }

    /// The write in progress is whole: its channel's next frames, if any, wait from now.
    pub fn frame_done(&mut self, now: Instant) {
        let Some(Writing { id: Some(id), .. }) = self.writing.take() else {
            return;
        };
        self.moved = 0;
        self.last_written = Some(now);
        if let Some(q) = self.queues.get_mut(&id) {
            if !q.frames.is_empty() {
                q.waiting_since = Some(now);
            }
        }
    }

    /// A command from the broker.
    pub fn inbound(&mut self, now: Instant) {
        self.last_inbound = self.last_inbound.max(now);
        if let Some(w) = &mut self.writing {
            if w.waits_since.is_some() {
                w.heard_while_waiting = true;
            }
        }
    }

    /// The broker takes nothing of the write in progress and talks meanwhile: it throttles this
    /// connection (its publish rate limits, `maxPendingPublishRequestsPerConnection`: it stops
    /// reading), and the connection waits rather than being ended or its producers closed.
    /// A throttle lets the connection move between its pauses: one that has not moved for
    /// [`THROTTLE_STILL`] is a link that carries (almost) nothing, whatever the broker says.
    pub fn throttled(&self, now: Instant) -> bool {
        self.writing.is_some_and(|w| {
            w.heard_while_waiting
                && w.waits_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= THROTTLED_AFTER)
        }) && now.saturating_duration_since(self.last_inbound) < THROTTLE_QUIET
            && now.saturating_duration_since(self.last_written.unwrap_or(self.opened))
                < THROTTLE_STILL
    }

    /// A request sent at `asked` found no answer in time: true when that proves the connection
    /// dead (the broker said nothing since, and does not merely throttle it).
    pub fn silent_since(&self, asked: Instant, now: Instant) -> bool {
        self.last_inbound < asked && !self.throttled(now)
    }

    /// The keepalive's tick: the broker's silence judged, and every channel with frames queued
    /// told how long they have waited (excused while the connection moves or is throttled).
    pub fn tick(&mut self, now: Instant) -> Tick {
        let silence = keepalive(now.saturating_duration_since(self.last_inbound));
        if silence == Keepalive::Dead {
            return Tick::Dead;
        }
        let throttled = self.throttled(now);
        let moving = self
            .last_written
            .is_some_and(|t| now.saturating_duration_since(t) < TICK * 2);
        let writing = self.writing.and_then(|w| w.id);
        for (id, q) in &mut self.queues {
            if let Some(since) = q.waiting_since {
                q.told = true;
                self.told.push((
                    *id,
                    Wait::Queued {
                        waited: now.saturating_duration_since(since),
                        excused: moving || throttled,
                    },
                ));
            } else if throttled && writing == Some(*id) {
                self.told.push((*id, Wait::Held));
            }
        }
        if silence == Keepalive::Quiet {
            self.pinged = None;
            return Tick::Quiet;
        }
        if self
            .pinged
            .is_some_and(|t| now.saturating_duration_since(t) < PING_EVERY)
        {
            return Tick::Quiet;
        }
        self.pinged = Some(now);
        Tick::Ping
    }

    /// What each channel is to be told, in order, since the last call.
    pub fn take_told(&mut self) -> Vec<(u64, Wait)> {
        std::mem::take(&mut self.told)
    }
}

impl Writing {
    fn of(id: Option<u64>) -> Self {
        Writing {
            id,
            waits_since: None,
            heard_while_waiting: false,
            out_of_rank: false,
        }
    }
}

/// A channel that holds frames, as [`pick`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub id: u64,
    pub rank: usize,
    /// Since when its frames have waited, once the deficit covers a turn out of rank order
    /// ([`OUT_OF_RANK_COST`]; None: not yet, or not waiting).
    pub waiting_since: Option<Instant>,
}

/// Which channel's frames go next, of `queued` (in id order). One whose turn the deficit covers
/// and that waited [`OVERDUE_AFTER`] or longer goes first (the longest waiting of them: the
/// deficit is shared, so the best rank first would leave the worst to wait for ever); otherwise
/// the best (lowest) rank, and among equals the first after the one served last (`after`), so
/// that producers of one rank take turns frame by frame.
pub fn pick(queued: impl IntoIterator<Item = Candidate>, after: u64, now: Instant) -> Option<u64> {
    let mut overdue: Option<(Instant, u64)> = None;
    let mut best: Option<(usize, bool, u64)> = None;
    for Candidate {
        id,
        rank,
        waiting_since: since,
    } in queued
    {
        if let Some(t) = since.filter(|t| now.saturating_duration_since(*t) >= OVERDUE_AFTER) {
            if overdue.is_none_or(|o| (t, id) < o) {
                overdue = Some((t, id));
            }
        }
        // Sorts before: a better rank, then ids after the last served (taking turns), then lower.
        let key = (rank, id <= after, id);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    overdue.map(|(_, id)| id).or(best.map(|(_, _, id)| id))
}

/// Sockets of connections given up for silence, kept until a new connection to the same broker
/// answers CONNECT, then reset (why: `pool.rs`'s `Retired`). Generic over the socket so that the
/// rules are tested without one. Pure.
#[derive(Debug)]
pub struct Retired<S> {
    kept: HashMap<String, Vec<(Instant, S)>>,
}

impl<S> Default for Retired<S> {
    fn default() -> Self {
        Retired {
            kept: HashMap::new(),
        }
    }
}

impl<S> Retired<S> {
    /// Keeps `socket` of the connection to `key`; answers the sockets to reset now (kept longer
    /// than [`RETIRED_FOR`], or the oldest beyond [`RETIRED_MAX`] for the broker).
    pub fn keep(&mut self, key: &str, socket: S, now: Instant) -> Vec<S> {
        let mut reset = self.expire(now);
        let kept = self.kept.entry(key.to_string()).or_default();
        if kept.len() >= RETIRED_MAX {
            reset.push(kept.remove(0).1);
        }
        kept.push((now, socket));
        reset
    }

    /// A new connection to `key` answered CONNECT: its kept sockets (and expired ones) to reset.
    pub fn answered(&mut self, key: &str, now: Instant) -> Vec<S> {
        let mut reset = self.expire(now);
        reset.extend(self.kept.remove(key).into_iter().flatten().map(|(_, s)| s));
        reset
    }

    /// Every socket kept (the pool goes).
    pub fn take_all(&mut self) -> Vec<S> {
        std::mem::take(&mut self.kept)
            .into_values()
            .flatten()
            .map(|(_, s)| s)
            .collect()
    }

    fn expire(&mut self, now: Instant) -> Vec<S> {
        let mut reset = Vec::new();
        for kept in self.kept.values_mut() {
            while kept
                .first()
                .is_some_and(|(since, _)| now.saturating_duration_since(*since) >= RETIRED_FOR)
            {
                reset.push(kept.remove(0).1);
            }
        }
        self.kept.retain(|_, kept| !kept.is_empty());
        reset
    }
}

#[cfg(test)]
mod tests;
