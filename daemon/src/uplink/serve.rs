//! The turns of one producer's connection, decided: how much to write ahead into the shared
//! connection, when the link's health changes what status says, when the turn ends the link, when
//! the session wakes next, and what the broker's commands mean for the session. Pure (time passed
//! in, no socket, channel or clock): `producer.rs` reads the window and the connection, asks
//! [`Serve`], and performs what it answers, as `pipeline/lane.rs` does for a source's lane.

use std::time::{Duration, Instant};

use super::error::LinkError;
use super::session::{Deadlines, Turn};
use super::window::{Health, OnSendError};

/// Written ahead into the connection per turn (whole frames).
pub const WRITE_AHEAD: usize = 1 << 20;
/// ... under a bandwidth budget: little, so that frames queued on the shared connection stay close
/// to what the budget sends soon (the connection takes a queued frame whole).
pub const BUDGET_WRITE_AHEAD: usize = 64 << 10;
/// A turn ends at the latest this long after it began (batches, stalls and deadlines are looked at
/// again).
pub const TICK: Duration = Duration::from_millis(500);

/// How far ahead of the connection's writer a producer encodes: [`WRITE_AHEAD`], or under a budget
/// of `rate` bytes/s the budget's own look-ahead capped at [`BUDGET_WRITE_AHEAD`].
pub fn write_ahead(budget_rate: Option<u64>) -> usize {
    match budget_rate {
        Some(rate) => BUDGET_WRITE_AHEAD.min(super::budget::bytes_ahead(rate)),
        None => WRITE_AHEAD,
    }
}

/// What a turn decided once the window had its say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judged {
    /// The link's state for status changed to this (true: frames move); the caller tells whoever
    /// waits for room.
    pub link: Option<bool>,
    /// The link just stalled: worth a warning and the status's last error.
    pub stalled: bool,
    pub turn: Turn,
    /// Wake by then at the latest (a batch due, the drain's deadline, the tick).
    pub wake: Instant,
}

/// What a command from the broker, addressed to this producer, asks of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// A receipt for this sequence id: the window judges it.
    Receipt(u64),
    /// A refusal: the window judges it, then [`after_send_error`] says what becomes of the link.
    SendError {
        sequence_id: u64,
        code: i32,
        message: String,
    },
    /// The broker closed the producer (an unload or a move): the link ends, set up again.
    Closed,
    /// Nothing for the session (a success to a request, a pong).
    Other,
}

/// Sorts a command from the broker.
pub fn inbound(cmd: &pulsar::proto::BaseCommand) -> Inbound {
    if let Some(r) = &cmd.send_receipt {
        Inbound::Receipt(r.sequence_id)
    } else if let Some(e) = &cmd.send_error {
        Inbound::SendError {
            sequence_id: e.sequence_id,
            code: e.error,
            message: e.message.clone(),
        }
    } else if cmd.close_producer.is_some() {
        Inbound::Closed
    } else {
        Inbound::Other
    }
}

/// The link's fate after the window judged a refusal.
pub fn after_send_error(action: OnSendError) -> Result<(), LinkError> {
    match action {
        OnSendError::Refused => Ok(()),
        OnSendError::Terminated(why) => Err(LinkError::Terminated(why)),
        OnSendError::Reconnect(why) => Err(LinkError::Broker(why)),
    }
}

/// The link's end when the broker closed the producer.
pub fn closed_by_broker() -> LinkError {
    LinkError::Moving("the broker closed the producer (topic unloaded or moved)".into())
}

/// The serving of one link, from its producer's creation to its end.
#[derive(Debug)]
pub struct Serve {
    deadlines: Deadlines,
    /// What status was last told: frames move on this link.
    moving: bool,
    /// The connection's count of this producer's bytes written, as last seen.
    written: u64,
    ahead: usize,
}

impl Serve {
    /// A link just set up (status was told it is up); `budget_rate`: the uplink's budget, if any.
    pub fn new(budget_rate: Option<u64>) -> Self {
        Serve {
            deadlines: Deadlines::default(),
            moving: true,
            written: 0,
            ahead: write_ahead(budget_rate),
        }
    }

    /// A turn begins; `stopping`: the daemon or the handle asked to stop. True the first time:
    /// the caller closes the window (no new frames) and the drain's grace runs.
    pub fn begin(&mut self, stopping: bool, now: Instant) -> bool {
        self.deadlines.stop_if(stopping, now)
    }

    /// Whether the window may encode another frame, with `queued` bytes of this producer on the
    /// connection and `pending` encoded but not yet handed to it.
    pub fn may_encode(&self, queued: usize, pending: usize) -> bool {
        queued + pending < self.ahead
    }

    /// The window's turn is over: its `health`, whether it holds nothing (`idle`), when its open
    /// batch is due.
    pub fn judge(
        &mut self,
        health: Health,
        idle: bool,
        batch_due: Option<Instant>,
        now: Instant,
    ) -> Judged {
        let moving = health == Health::Moving;
        let link = (moving != self.moving).then_some(moving);
        self.moving = moving;
        let mut wake = now + TICK;
        for t in [batch_due, self.deadlines.drain_deadline()]
            .into_iter()
            .flatten()
        {
            wake = wake.min(t);
        }
        Judged {
            link,
            stalled: link == Some(false),
            turn: self.deadlines.turn(health, idle, now),
            wake,
        }
    }

    /// While draining, new work and the daemon's stop no longer wake the session.
    pub fn draining(&self) -> bool {
        self.deadlines.draining()
    }

    /// The connection says `total` bytes of this producer were written so far: the bytes new
    /// since the last look (for the wire counter).
    pub fn wrote(&mut self, total: u64) -> u64 {
        let new = total.saturating_sub(self.written);
        self.written = self.written.max(total);
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_reports_a_stall_once_and_its_recovery_once() {
        let t0 = Instant::now();
        let mut s = Serve::new(None);
        let j = s.judge(Health::Moving, false, None, t0);
        assert_eq!((j.link, j.stalled, j.turn), (None, false, Turn::Serve));
        let j = s.judge(Health::Stalled, false, None, t0);
        assert_eq!(
            (j.link, j.stalled, j.turn),
            (Some(false), true, Turn::Serve)
        );
        let j = s.judge(Health::Stalled, false, None, t0);
        assert_eq!((j.link, j.stalled), (None, false), "said once");
        let j = s.judge(Health::Moving, false, None, t0);
        assert_eq!((j.link, j.stalled), (Some(true), false));
        // A link without progress for the window's timeout ends.
        assert_eq!(s.judge(Health::Dead, false, None, t0).turn, Turn::Dead);
    }

    #[test]
    fn a_turn_wakes_for_the_batch_the_drain_or_the_tick_whichever_is_first() {
        let t0 = Instant::now();
        let mut s = Serve::new(None);
        assert_eq!(s.judge(Health::Moving, false, None, t0).wake, t0 + TICK);
        let due = t0 + Duration::from_millis(5);
        assert_eq!(s.judge(Health::Moving, false, Some(due), t0).wake, due);
        let late = t0 + Duration::from_secs(5);
        assert_eq!(
            s.judge(Health::Moving, false, Some(late), t0).wake,
            t0 + TICK
        );
        // A stop: the window closes once, the drain's deadline wakes the session, and the turn
        // stops once nothing is outstanding.
        assert!(!s.draining());
        let t1 = t0 + Duration::from_secs(1);
        assert!(s.begin(true, t1));
        assert!(!s.begin(true, t1), "closed once");
        assert!(s.draining());
        let grace = super::super::session::SHUTDOWN_GRACE;
        let j = s.judge(Health::Moving, false, None, t1 + grace - TICK / 2);
        assert_eq!((j.turn, j.wake), (Turn::Serve, t1 + grace));
        assert_eq!(s.judge(Health::Moving, true, None, t1).turn, Turn::Stopped);
        assert_eq!(
            s.judge(Health::Stalled, false, None, t1 + grace).turn,
            Turn::Stopped
        );
    }

    #[test]
    fn a_producer_writes_ahead_less_under_a_budget() {
        let s = Serve::new(None);
        assert!(s.may_encode(0, WRITE_AHEAD - 1));
        assert!(!s.may_encode(WRITE_AHEAD / 2, WRITE_AHEAD / 2));
        // 6 Mbit/s: the budget's own look-ahead, under the cap
        let rate = 750_000;
        let ahead = write_ahead(Some(rate));
        assert_eq!(
            ahead,
            BUDGET_WRITE_AHEAD.min(super::super::budget::bytes_ahead(rate))
        );
        assert!(ahead <= BUDGET_WRITE_AHEAD);
        let s = Serve::new(Some(rate));
        assert!(s.may_encode(0, ahead - 1));
        assert!(!s.may_encode(ahead - 1, 1));
        assert_eq!(write_ahead(Some(u64::MAX / 2)), BUDGET_WRITE_AHEAD);
    }

    #[test]
    fn wire_bytes_are_counted_once_whatever_order_the_wakeups_come_in() {
        let mut s = Serve::new(None);
        assert_eq!(s.wrote(100), 100);
        assert_eq!(s.wrote(100), 0);
        assert_eq!(s.wrote(250), 150);
        // a stale look (a wakeup that read before the last one)
        assert_eq!(s.wrote(200), 0);
        assert_eq!(s.wrote(260), 10);
    }

    #[test]
    fn the_brokers_commands_are_sorted_and_refusals_decide_the_link() {
        use pulsar::proto::{
            BaseCommand, CommandCloseProducer, CommandSendError, CommandSendReceipt,
        };
        let receipt = BaseCommand {
            send_receipt: Some(CommandSendReceipt {
                sequence_id: 7,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(inbound(&receipt), Inbound::Receipt(7));
        let error = BaseCommand {
            send_error: Some(CommandSendError {
                sequence_id: 8,
                error: 3,
                message: "no".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            inbound(&error),
            Inbound::SendError {
                sequence_id: 8,
                code: 3,
                message: "no".into()
            }
        );
        let closed = BaseCommand {
            close_producer: Some(CommandCloseProducer::default()),
            ..Default::default()
        };
        assert_eq!(inbound(&closed), Inbound::Closed);
        assert_eq!(inbound(&BaseCommand::default()), Inbound::Other);
        assert!(after_send_error(OnSendError::Refused).is_ok());
        assert!(matches!(
            after_send_error(OnSendError::Terminated("t".into())),
            Err(LinkError::Terminated(_))
        ));
        assert!(matches!(
            after_send_error(OnSendError::Reconnect("r".into())),
            Err(LinkError::Broker(_))
        ));
        assert!(matches!(closed_by_broker(), LinkError::Moving(_)));
    }
}
