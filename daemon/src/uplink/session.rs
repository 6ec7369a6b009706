//! The decisions of a producer's connection as values, time passed in: when the broker's silence
//! asks for a PING or proves the connection dead, when a stop's drain ends, when the link's health
//! changes what status reports. The session task (`producer.rs`) and the connection's keepalive
//! (`pool.rs`) perform them; nothing here sleeps or writes.

use std::time::{Duration, Instant};

use super::error::LinkError;
use super::window::Health;
use crate::backoff::Backoff;

/// Silence from the broker for this long: send a PING.
pub const PING_IDLE: Duration = Duration::from_secs(30);
/// Silence for this long: the connection is dead.
pub const DEAD_IDLE: Duration = Duration::from_secs(90);
/// On shutdown: how long outstanding receipts are waited for before the frames go to the spool.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Coming back after an outage: the deadline of each request (CONNECT, lookup, PRODUCER) of the
/// first attempt after the broker takes connections again; each later attempt doubles it, up to
/// `connect::REQUEST_TIMEOUT`.
pub const RECOVERY_SETUP: Duration = Duration::from_secs(1);

/// The request deadline of an attempt: `since_life` is the number of attempts since the broker
/// took a connection again after an outage (None: not recovering, the full deadline). A starting
/// broker takes connections many seconds before it answers them, and answers a CONNECT that
/// waited as soon as it serves: short deadlines that grow keep an attempt pending at that moment
/// (a 10 s attempt begun just before it timed out up to 10 s later: 22 s to the first receipt
/// after a 5 s broker restart, measured) without asking a slow link every second for long.
pub fn setup_timeout(since_life: Option<u32>, full: Duration) -> Duration {
    match since_life {
        None => full,
        Some(k) => RECOVERY_SETUP.saturating_mul(1 << k.min(8)).min(full),
    }
}

/// What the broker's silence calls for at a keepalive tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keepalive {
    Quiet,
    Ping,
    Dead,
}

/// `quiet`: since the last command from the broker.
pub fn keepalive(quiet: Duration) -> Keepalive {
    if quiet > DEAD_IDLE {
        Keepalive::Dead
    } else if quiet > PING_IDLE {
        Keepalive::Ping
    } else {
        Keepalive::Quiet
    }
}

/// What a turn of the session decides after the window has had its say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Go on serving.
    Serve,
    /// The link made no progress for the window's timeout: reconnect.
    Dead,
    /// Stopping, and nothing is outstanding or the grace is over.
    Stopped,
}

/// A connection's deadlines and what status was last told of its health.
#[derive(Debug, Default)]
pub struct Deadlines {
    /// Once stopping: when the drain gives up.
    draining: Option<Instant>,
}

impl Deadlines {
    /// The daemon asked to stop (`stopping`): true the first time, when the caller closes the
    /// window (no new frames) and the drain's grace starts.
    pub fn stop_if(&mut self, stopping: bool, now: Instant) -> bool {
        if self.draining.is_none() && stopping {
            self.draining = Some(now + SHUTDOWN_GRACE);
            return true;
        }
        false
    }

    /// When the drain gives up, while stopping.
    pub fn drain_deadline(&self) -> Option<Instant> {
        self.draining
    }

    pub fn draining(&self) -> bool {
        self.draining.is_some()
    }

    /// After the window's turn: its link health and whether it holds nothing.
    pub fn turn(&self, health: Health, idle: bool, now: Instant) -> Turn {
        if health == Health::Dead {
            return Turn::Dead;
        }
        match self.draining {
            Some(deadline) if idle || now >= deadline => Turn::Stopped,
            _ => Turn::Serve,
        }
    }
}

/// What becomes of a producer's link once its session stopped serving it with `why`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEnd {
    /// rigd gives this producer up and the connection serves the others: detach its channel,
    /// then close it on the broker as a request with a deadline (`connect::Link::close`; issue
    /// 46.2), before it is created again under the same name.
    CloseProducer,
    /// The connection is dead or failed: every producer on it goes, to be set up on a new one.
    FailConnection,
    /// The broker closed the producer itself (a move), or a stop: the link is dropped (its channel
    /// detached, then a close queued without waiting).
    Drop,
}

/// Decides [`LinkEnd`]; `broker_quiet_for`: since the broker's last command on the connection
/// (any producer's). Pure.
pub fn link_end(why: &LinkError, broker_quiet_for: Duration, stall_after: Duration) -> LinkEnd {
    match why {
        // No progress for this producer while the broker keeps talking on the connection (the
        // others' receipts): this producer's trouble, not the connection's.
        LinkError::Timeout(_) if broker_quiet_for < stall_after => LinkEnd::CloseProducer,
        LinkError::Timeout(_) | LinkError::Io(_) | LinkError::Closed | LinkError::Codec(_) => {
            LinkEnd::FailConnection
        }
        // The broker refused this producer's frames (or its topic) and the connection serves the
        // others.
        LinkError::Broker(_) | LinkError::Terminated(_) | LinkError::Moved(_) => {
            LinkEnd::CloseProducer
        }
        _ => LinkEnd::Drop,
    }
}

/// Retries while a topic moves between brokers (a dead owner, an unload, a rolling restart) are
/// at most this far apart...
pub const OWNER_RETRY_MAX: Duration = Duration::from_secs(1);
/// ...for this long; a move that takes longer is a sick cluster, and the fleet backs off as
/// usual rather than ask it once a second per producer. Past Pulsar's default 30 s session timeout.
pub const MOVING_FAST_FOR: Duration = Duration::from_secs(60);
/// A terminated topic is looked at again this often (an operator may recreate it).
pub const TERMINATED_RETRY: Duration = Duration::from_secs(60);

/// How soon to try again after a failed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// The topic is terminated: rarely (an operator may recreate it).
    Terminated,
    /// The topic is between brokers: the cluster named an owner that is gone (its bundles move
    /// within the metadata store's session timeout), or answered `ServiceNotReady` or closed the
    /// producer (an unload, a rolling restart). Retry often (capped at [`OWNER_RETRY_MAX`]) rather
    /// than let the backoff grow past the moment the topic is served again, for
    /// [`MOVING_FAST_FOR`].
    OwnerMoving,
    /// The service URL's hosts take no TCP connection (refused, reset, no route, or a SYN
    /// unanswered): exponential backoff up to 10 s, cut short by the first sign of life (a TCP
    /// connect that succeeds, [`super::connect::Setup::reachable`]), which also resets the backoff. Before, the
    /// uplink was back up to a whole backoff step after the broker: ~21 s after a 40 s outage.
    Unreachable,
    /// Anything else (the broker answered and refused): exponential backoff up to 10 s.
    Backoff,
}

impl Pace {
    /// `moving_for`: how long the failures before this one (of any kind) have lasted.
    pub fn after(e: &LinkError, moving_for: Duration) -> Self {
        match e {
            LinkError::Terminated(_) => Pace::Terminated,
            LinkError::OwnerUnreachable { .. } | LinkError::Moving(_)
                if moving_for < MOVING_FAST_FOR =>
            {
                Pace::OwnerMoving
            }
            LinkError::Connect { source, .. } if unreachable(source.kind()) => Pace::Unreachable,
            _ => Pace::Backoff,
        }
    }
}

/// A connect failure that says nothing answers there (yet): refused, reset, no route, or no answer
/// in time. Not a TLS handshake the broker refused, which a TCP connect cannot tell is fixed: a
/// sign of life must not end the backoff of a connection that fails once connected.
fn unreachable(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | TimedOut
            | HostUnreachable
            | NetworkUnreachable
            | NotConnected
            | AddrNotAvailable
    )
}

/// A connection failure that repeats unchanged is logged once, then again this often with the
/// attempts since (the CI run of 3 Dec 2026 21:52Z had a broker refuse a topic's producer with the
/// same error for 90 s after one line: the log read as a silent stall).
const STILL_DOWN_EVERY: Duration = Duration::from_secs(30);

/// The attempts that failed the same way since the last line about it. Pure (time passed in).
#[derive(Debug)]
pub struct Repeats {
    logged_at: Instant,
    attempts: u32,
}

impl Repeats {
    pub fn new(now: Instant) -> Self {
        Repeats {
            logged_at: now,
            attempts: 0,
        }
    }

    /// One more failure like the last one logged: the attempts to log now, if a line is due.
    pub fn again(&mut self, now: Instant) -> Option<u32> {
        self.attempts += 1;
        if now.saturating_duration_since(self.logged_at) < STILL_DOWN_EVERY {
            return None;
        }
        let n = self.attempts;
        *self = Repeats::new(now);
        Some(n)
    }
}

/// The session's decisions across connection attempts, as values (time passed in): each attempt's
/// setup deadline, how long to wait after a failure and at which pace, which failures are worth a
/// log line, and what a connection or a sign of life resets. `producer.rs` sleeps, logs and
/// counts as told.
#[derive(Debug)]
pub struct Retry {
    backoff: Backoff,
    owner_backoff: Backoff,
    /// The error logged last ("": none since the last connection).
    last_logged: String,
    repeats: Repeats,
    /// Failing since (reset only by a connection): a move that outlasts the fast window backs off
    /// for good, not for one attempt.
    failing_since: Option<Instant>,
    /// Attempts since the broker took a connection again after an outage (None: not recovering).
    since_life: Option<u32>,
}

/// What a failure is worth in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// A new error: "uplink down" (or "topic terminated").
    Down,
    /// The same error for [`STILL_DOWN_EVERY`]: said again with the attempts since, and how long
    /// the uplink has been down.
    StillDown { attempts: u32, down: Duration },
    /// The same error again, said recently.
    Quiet,
}

/// After a failed attempt: what to log, the pace, and the wait before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    pub log: Log,
    pub pace: Pace,
    pub delay: Duration,
}

impl Retry {
    /// `seed`: the backoffs' jitter.
    pub fn new(seed: u64, now: Instant) -> Self {
        Retry {
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10), seed),
            owner_backoff: Backoff::new(Duration::from_millis(100), OWNER_RETRY_MAX, seed ^ 1),
            last_logged: String::new(),
            repeats: Repeats::new(now),
            failing_since: None,
            since_life: None,
        }
    }

    /// An attempt begins: the deadline of each of its requests (`full` when not recovering, see
    /// [`setup_timeout`]).
    pub fn attempt(&mut self, full: Duration) -> Duration {
        let t = setup_timeout(self.since_life, full);
        self.since_life = self.since_life.map(|k| k.saturating_add(1));
        t
    }

    /// A producer was created: every pace starts again. True when failures were logged since the
    /// last connection (the connection is worth a line).
    pub fn connected(&mut self) -> bool {
        self.since_life = None;
        self.backoff.reset();
        self.owner_backoff.reset();
        self.failing_since = None;
        let logged = !self.last_logged.is_empty();
        self.last_logged.clear();
        logged
    }

    /// A served link ended without an error (it cannot, but): the wait before the next attempt.
    pub fn ended(&mut self) -> Duration {
        self.backoff.next_delay()
    }

    /// An attempt, or the link it set up, failed with `e`.
    pub fn failed(&mut self, e: &LinkError, now: Instant) -> Failed {
        let msg = e.to_string();
        let since = *self.failing_since.get_or_insert(now);
        let log = if msg != self.last_logged {
            self.last_logged = msg;
            self.repeats = Repeats::new(now);
            Log::Down
        } else if let Some(attempts) = self.repeats.again(now) {
            Log::StillDown {
                attempts,
                down: now.saturating_duration_since(since),
            }
        } else {
            Log::Quiet
        };
        let pace = Pace::after(e, now.saturating_duration_since(since));
        let delay = match pace {
            Pace::Terminated => TERMINATED_RETRY,
            Pace::OwnerMoving => self.owner_backoff.next_delay(),
            Pace::Unreachable | Pace::Backoff => self.backoff.next_delay(),
        };
        Failed { log, pace, delay }
    }

    /// The broker takes connections again (a sign of life while [`Pace::Unreachable`]): the backoff
    /// ends, and the next attempts ask with short deadlines that grow.
    pub fn alive(&mut self) {
        self.backoff.reset();
        self.since_life.get_or_insert(0);
    }
}

/// What the session does once a link, or an attempt at one, ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A stop: the task ends.
    Stop,
    /// The topic is partitioned into this many: this producer publishes nothing (its
    /// `TopicProducer` opens one per partition and closes it); asked again after `wait` only if not.
    Partitioned { partitions: u32, wait: Duration },
    /// A failure: logged as `Failed::log`, the error recorded for status, then the wait (cut short
    /// by the broker's first sign of life when the pace is [`Pace::Unreachable`]).
    Failed(Failed),
    /// Served, and ended without an error: wait this long.
    Again(Duration),
}

impl Retry {
    /// A link or an attempt ended with `result`.
    pub fn end(&mut self, result: &Result<(), LinkError>, now: Instant) -> End {
        match result {
            Err(LinkError::Shutdown) => End::Stop,
            // Closed on purpose to set up on a better link: at once.
            Err(LinkError::Moved(_)) => End::Again(Duration::ZERO),
            Err(LinkError::Partitioned { partitions, .. }) => End::Partitioned {
                partitions: *partitions,
                wait: TERMINATED_RETRY,
            },
            Err(e) => End::Failed(self.failed(e, now)),
            Ok(()) => End::Again(self.ended()),
        }
    }
}

/// What the session knows of the broker's last stored frame of this producer name after the
/// probe (`asked`, what it read, `read`) at a creation where the broker named `named` (its
/// deduplication state). Asked for the chunk count of the named id, only the entry of that id
/// says it (another entry is a later epoch's); asked for the last entry, what it read decides.
pub fn broker_last(
    asked: super::plan::Probe,
    read: Option<super::plan::BrokerLast>,
    named: Option<u64>,
) -> Option<super::plan::BrokerLast> {
    let named_last = named.map(super::plan::BrokerLast::id);
    match asked {
        super::plan::Probe::No => named_last,
        super::plan::Probe::ChunksOf(id) => read.filter(|r| r.sequence_id == id).or(named_last),
        super::plan::Probe::LastEntry => read,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_that_repeats_is_logged_again_every_30_s_with_its_attempts() {
        let t0 = Instant::now();
        let mut r = Repeats::new(t0);
        assert_eq!(r.again(t0 + Duration::from_secs(1)), None);
        assert_eq!(r.again(t0 + Duration::from_secs(11)), None);
        assert_eq!(r.again(t0 + STILL_DOWN_EVERY), Some(3));
        // counted again from that line
        assert_eq!(
            r.again(t0 + STILL_DOWN_EVERY + Duration::from_secs(10)),
            None
        );
        assert_eq!(r.again(t0 + STILL_DOWN_EVERY * 2), Some(2));
    }

    #[test]
    fn a_dead_owner_is_retried_soon_and_a_terminated_topic_rarely() {
        let refused = || LinkError::Connect {
            addr: "127.0.0.1:6661".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        let owner_gone = LinkError::OwnerUnreachable {
            addr: "127.0.0.1:6661".into(),
            source: Box::new(refused()),
        };
        let now = Duration::ZERO;
        assert_eq!(Pace::after(&owner_gone, now), Pace::OwnerMoving);
        let unloading = LinkError::Moving("bundle is being unloaded".into());
        assert_eq!(Pace::after(&unloading, now), Pace::OwnerMoving);
        // a move that lasts past the fast window: a sick cluster, back off as usual
        assert_eq!(Pace::after(&unloading, MOVING_FAST_FOR), Pace::Backoff);
        assert_eq!(Pace::after(&owner_gone, MOVING_FAST_FOR), Pace::Backoff);
        // the service URL's own hosts down: the cluster is not there, back off until it takes a
        // connection again
        assert_eq!(Pace::after(&refused(), now), Pace::Unreachable);
        assert_eq!(Pace::after(&refused(), MOVING_FAST_FOR), Pace::Unreachable);
        assert_eq!(Pace::after(&LinkError::Closed, now), Pace::Backoff);
        let refusal = LinkError::Broker("AuthenticationError".into());
        assert_eq!(Pace::after(&refusal, now), Pace::Backoff);
        // a TLS handshake the broker refuses: the port takes connections, so no sign of life
        // may end the backoff (it would be asked every half second)
        let tls = LinkError::Connect {
            addr: "127.0.0.1:6651 (TLS)".into(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "unknown CA"),
        };
        assert_eq!(Pace::after(&tls, now), Pace::Backoff);
        let silent = LinkError::Connect {
            addr: "127.0.0.1:6650".into(),
            source: std::io::ErrorKind::TimedOut.into(),
        };
        assert_eq!(Pace::after(&silent, now), Pace::Unreachable);
        assert_eq!(
            Pace::after(&LinkError::Terminated("t".into()), now),
            Pace::Terminated
        );
    }

    #[test]
    fn retries_pace_log_and_reset_as_the_failures_and_connections_come() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let full = Duration::from_secs(10);
        let mut r = Retry::new(7, t0);
        assert_eq!(r.attempt(full), full, "not recovering: the full deadline");
        let refused = LinkError::Connect {
            addr: "127.0.0.1:6650".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        // A new error is logged; the same again is quiet until STILL_DOWN_EVERY, then said with
        // the attempts since and how long the uplink is down.
        let f = r.failed(&refused, at(0));
        assert_eq!((f.log, f.pace), (Log::Down, Pace::Unreachable));
        assert!(f.delay <= Duration::from_millis(200), "{:?}", f.delay);
        assert_eq!(r.failed(&refused, at(5)).log, Log::Quiet);
        assert_eq!(
            r.failed(&refused, at(30)).log,
            Log::StillDown {
                attempts: 2,
                down: Duration::from_secs(30)
            }
        );
        // The backoff grows to its 10 s cap...
        let delays: Vec<Duration> = (31..40).map(|s| r.failed(&refused, at(s)).delay).collect();
        assert!(
            delays.last().unwrap() > &Duration::from_secs(4),
            "{delays:?}"
        );
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(10)));
        // ... until the broker takes connections again: short deadlines that grow, a short wait.
        r.alive();
        assert_eq!(r.attempt(full), Duration::from_secs(1));
        assert_eq!(r.attempt(full), Duration::from_secs(2));
        assert!(r.failed(&refused, at(41)).delay <= Duration::from_millis(200));
        // A connection: worth a line after failures were logged, and everything starts again.
        assert!(r.connected());
        assert!(!r.connected(), "nothing logged since");
        assert_eq!(r.attempt(full), full);
        // A topic between brokers: retried within a second for MOVING_FAST_FOR, then backed off.
        let moving = LinkError::Moving("unloaded".into());
        let f = r.failed(&moving, at(100));
        assert_eq!((f.log, f.pace), (Log::Down, Pace::OwnerMoving));
        for s in 101..159 {
            assert!(r.failed(&moving, at(s)).delay <= OWNER_RETRY_MAX);
        }
        assert_eq!(r.failed(&moving, at(160)).pace, Pace::Backoff);
        // A terminated topic: rarely, and a new error is logged.
        let f = r.failed(&LinkError::Terminated("t".into()), at(161));
        assert_eq!(
            (f.log, f.pace, f.delay),
            (Log::Down, Pace::Terminated, TERMINATED_RETRY)
        );
    }

    #[test]
    fn rigd_closes_only_the_producer_it_gives_up_on_and_ends_a_connection_only_when_it_is_dead() {
        let stall = Duration::from_secs(5);
        let quiet = Duration::from_secs(1);
        let timeout = || LinkError::Timeout("progress".into());
        // A producer whose frames stopped moving while the broker answers the others.
        assert_eq!(link_end(&timeout(), quiet, stall), LinkEnd::CloseProducer);
        // ... and while the broker is silent too: the connection is dead.
        assert_eq!(link_end(&timeout(), stall, stall), LinkEnd::FailConnection);
        // A SEND_ERROR rigd reconnects on (a receipt out of order, ChecksumError, UnknownError),
        // a terminated topic: this producer alone.
        let refused = LinkError::Broker("send error (UnknownError)".into());
        assert_eq!(link_end(&refused, quiet, stall), LinkEnd::CloseProducer);
        let gone = LinkError::Terminated("t".into());
        assert_eq!(link_end(&gone, stall, stall), LinkEnd::CloseProducer);
        for dead in [
            LinkError::Closed,
            LinkError::Io(std::io::ErrorKind::BrokenPipe.into()),
        ] {
            assert_eq!(link_end(&dead, quiet, stall), LinkEnd::FailConnection);
        }
        // The broker closed it (a move), or a stop.
        assert_eq!(
            link_end(&LinkError::Moving("unloaded".into()), quiet, stall),
            LinkEnd::Drop
        );
        assert_eq!(link_end(&LinkError::Shutdown, quiet, stall), LinkEnd::Drop);
    }

    #[test]
    fn after_an_outage_setup_deadlines_start_short_and_double_to_the_full_one() {
        let full = Duration::from_secs(10);
        assert_eq!(setup_timeout(None, full), full);
        let seq: Vec<u64> = (0..6)
            .map(|k| setup_timeout(Some(k), full).as_secs())
            .collect();
        assert_eq!(seq, [1, 2, 4, 8, 10, 10]);
        assert_eq!(setup_timeout(Some(u32::MAX), full), full);
    }

    #[test]
    fn the_brokers_silence_asks_for_a_ping_then_proves_the_connection_dead() {
        assert_eq!(keepalive(Duration::from_secs(5)), Keepalive::Quiet);
        assert_eq!(keepalive(PING_IDLE), Keepalive::Quiet);
        assert_eq!(
            keepalive(PING_IDLE + Duration::from_millis(1)),
            Keepalive::Ping
        );
        assert_eq!(
            keepalive(DEAD_IDLE + Duration::from_millis(1)),
            Keepalive::Dead
        );
    }

    #[test]
    fn a_stop_drains_until_nothing_is_outstanding_or_the_grace_is_over() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        assert!(!d.stop_if(false, t0));
        assert_eq!(d.turn(Health::Moving, false, t0), Turn::Serve);
        assert!(d.stop_if(true, t0), "the first stop closes the window");
        assert!(!d.stop_if(true, t0 + Duration::from_millis(10)), "once");
        assert_eq!(d.drain_deadline(), Some(t0 + SHUTDOWN_GRACE));
        assert_eq!(
            d.turn(Health::Moving, false, t0 + Duration::from_secs(1)),
            Turn::Serve
        );
        assert_eq!(
            d.turn(Health::Moving, true, t0 + Duration::from_secs(1)),
            Turn::Stopped
        );
        assert_eq!(
            d.turn(Health::Stalled, false, t0 + SHUTDOWN_GRACE),
            Turn::Stopped
        );
        // A dead link is dead, stopping or not.
        assert_eq!(d.turn(Health::Dead, true, t0), Turn::Dead);
    }

    #[test]
    fn a_link_ends_in_a_stop_a_partitioned_topic_a_failure_or_again() {
        let t0 = Instant::now();
        let mut r = Retry::new(1, t0);
        assert_eq!(r.end(&Err(LinkError::Shutdown), t0), End::Stop);
        assert_eq!(
            r.end(
                &Err(LinkError::Partitioned {
                    topic: "t".into(),
                    partitions: 4
                }),
                t0
            ),
            End::Partitioned {
                partitions: 4,
                wait: TERMINATED_RETRY
            }
        );
        let End::Failed(f) = r.end(&Err(LinkError::Closed), t0) else {
            panic!("a failure")
        };
        assert_eq!((f.log, f.pace), (Log::Down, Pace::Backoff));
        assert!(matches!(r.end(&Ok(()), t0), End::Again(d) if d <= Duration::from_secs(10)));
    }

    #[test]
    fn the_probe_decides_the_brokers_last_only_for_what_it_was_asked() {
        use super::super::plan::{BrokerLast, Probe};
        let entry = |id: u64, chunks| BrokerLast {
            sequence_id: id,
            chunks: Some(chunks),
        };
        // not asked: the broker's named id
        assert_eq!(
            broker_last(Probe::No, None, Some(9)),
            Some(BrokerLast::id(9))
        );
        assert_eq!(broker_last(Probe::No, None, None), None);
        // the chunk count of the named id: that entry only
        assert_eq!(
            broker_last(Probe::ChunksOf(9), Some(entry(9, 3)), Some(9)),
            Some(entry(9, 3))
        );
        assert_eq!(
            broker_last(Probe::ChunksOf(9), Some(entry(12, 2)), Some(9)),
            Some(BrokerLast::id(9)),
            "a later epoch's entry says nothing of id 9"
        );
        assert_eq!(
            broker_last(Probe::ChunksOf(9), None, Some(9)),
            Some(BrokerLast::id(9))
        );
        // no deduplication state: the topic's entry decides, or nothing is known
        assert_eq!(
            broker_last(Probe::LastEntry, Some(entry(4, 1)), None),
            Some(entry(4, 1))
        );
        assert_eq!(broker_last(Probe::LastEntry, None, None), None);
    }
}
