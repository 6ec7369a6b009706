//! The decisions of a producer's connection as values, time passed in: when the broker's silence
//! asks for a PING or proves the connection dead, when a stop's drain ends, when the link's health
//! changes what status reports. The session task (`producer.rs`) and the connection's keepalive
//! (`pool.rs`) perform them; nothing here sleeps or writes.

use std::time::{Duration, Instant};

use super::error::LinkError;
use super::window::Health;

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
        LinkError::Broker(_) | LinkError::Terminated(_) => LinkEnd::CloseProducer,
        _ => LinkEnd::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
