//! A source's order between capture, spool and uplink, as a value: what of the source is in the
//! spool and not yet handed to the producer, what was handed over from it, and (in `always` mode)
//! which appends are durable enough to publish. Pure: no I/O; the lane task asks it and performs.
//!
//! Invariants:
//! - While the backlog is active, no frame goes live: new frames are spooled and the spool drains in
//!   capture order from `cursor`, so a source's frames reach the broker in capture order.
//! - A frame handed over from the spool is removed from the spool only on its ack (acks arrive in
//!   submission order, see `uplink::window`).
//! - In `always` mode nothing is published before the group commit that made it durable, and the
//!   lane never leaves the spool path.

use std::collections::VecDeque;

use crate::config::SpoolMode;

/// Where a new frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Try the producer; on refusal call [`Backlog::spill`] and spool it.
    Live,
    Spool,
}

#[derive(Debug)]
pub struct Backlog {
    mode: SpoolMode,
    active: bool,
    /// The next spooled seq to hand over.
    cursor: u64,
    /// Seqs handed over from the spool, in order, awaiting their acks.
    handed: VecDeque<u64>,
    /// `always` mode: (commit epoch, seq) of appends not yet known durable.
    appended: VecDeque<(u64, u64)>,
    /// Frames below this seq may be published (`always`: the durable ones).
    publish_below: u64,
}

impl Backlog {
    /// `spooled_from`: the first seq an earlier run left in the spool (it drains first);
    /// `next_seq`: the source's next capture sequence (in `always` mode what an earlier run
    /// left is durable, so everything below it may go). None: the spool could not say; then
    /// nothing goes until [`Backlog::earlier_run_below`] or a durable commit says how far.
    pub fn new(mode: SpoolMode, spooled_from: Option<u64>, next_seq: Option<u64>) -> Self {
        let publish_below = match (mode, spooled_from) {
            (SpoolMode::OnOutage, _) => u64::MAX,
            (SpoolMode::Always, Some(_)) => next_seq.unwrap_or(0),
            (SpoolMode::Always, None) => 0,
        };
        Backlog {
            mode,
            active: spooled_from.is_some(),
            cursor: spooled_from.unwrap_or(0),
            handed: VecDeque::new(),
            appended: VecDeque::new(),
            publish_below,
        }
    }

    pub fn active(&self) -> bool {
        self.active
    }

    /// Every frame handed over from the spool has its ack.
    pub fn settled(&self) -> bool {
        self.handed.is_empty()
    }

    /// Where a new frame goes: live only in `on-outage` mode, with no backlog, and an uplink that
    /// may take it (`uplink_open`: configured and not paused by a technician).
    pub fn route(&self, uplink_open: bool) -> Route {
        if self.mode == SpoolMode::OnOutage && !self.active && uplink_open {
            Route::Live
        } else {
            Route::Spool
        }
    }

    /// The producer gave frame `seq` back: it and everything after it spool until the backlog
    /// drains.
    pub fn spill(&mut self, seq: u64) {
        self.spooled(seq, None);
    }

    /// Frame `seq` was appended to the spool; `epoch`: in `always` mode, the commit epoch it was
    /// appended in (durable once a later epoch is).
    pub fn spooled(&mut self, seq: u64, epoch: Option<u64>) {
        if !self.active {
            self.active = true;
            self.cursor = seq;
        }
        if let (SpoolMode::Always, Some(e)) = (self.mode, epoch) {
            self.appended.push_back((e, seq));
        }
    }

    /// Every seq below `seq` is an earlier run's (this run's first capture took `seq`): in
    /// `always` mode those are durable, so they may be published.
    pub fn earlier_run_below(&mut self, seq: u64) {
        self.publish_below = self.publish_below.max(seq);
    }

    /// The spool's durable epoch moved: appends of earlier epochs may be published.
    pub fn durable(&mut self, durable_commit: u64) {
        while let Some(&(epoch, seq)) = self.appended.front() {
            if epoch >= durable_commit {
                break;
            }
            self.publish_below = self.publish_below.max(seq + 1);
            self.appended.pop_front();
        }
    }

    /// The seq to read the spool from for a drain step, when there is anything to hand over.
    pub fn drain_from(&self) -> Option<u64> {
        (self.active && self.cursor < self.publish_below).then_some(self.cursor)
    }

    /// Whether a spooled frame may be handed over now (`always`: durable).
    pub fn may_publish(&self, seq: u64) -> bool {
        seq < self.publish_below
    }

    /// Spooled frame `seq` was taken by the producer.
    pub fn handed_over(&mut self, seq: u64) {
        self.handed.push_back(seq);
        self.cursor = seq + 1;
    }

    /// The spool holds nothing more of the source from the cursor on: frames go live again (not in
    /// `always` mode, which stays on the spool path).
    pub fn caught_up(&mut self) {
        self.active = self.mode == SpoolMode::Always;
    }

    /// An ack for `seq`. Returns whether the frame came from the spool (remove it there). Acks
    /// come in submission order; a handed-over seq below the ack (its ack was lost with a closed
    /// producer) stays in the spool.
    pub fn acked(&mut self, seq: u64) -> bool {
        while let Some(&front) = self.handed.front() {
            if front > seq {
                break;
            }
            self.handed.pop_front();
            if front == seq {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_outage_goes_live_until_the_uplink_refuses_then_drains_in_order_before_going_live_again() {
        let mut b = Backlog::new(SpoolMode::OnOutage, None, Some(0));
        assert_eq!(b.route(true), Route::Live);
        assert_eq!(b.route(false), Route::Spool, "paused or no uplink");
        // Frame 3 is refused (link down): 3, 4, 5 spool; 6 too, though the link is back.
        b.spill(3);
        b.spooled(4, None);
        b.spooled(5, None);
        assert_eq!(b.route(true), Route::Spool);
        assert_eq!(b.drain_from(), Some(3));
        b.handed_over(3);
        b.handed_over(4);
        assert_eq!(b.drain_from(), Some(5));
        b.handed_over(5);
        b.caught_up();
        assert_eq!(b.route(true), Route::Live);
        assert!(b.acked(3) && b.acked(4) && b.acked(5));
        assert!(!b.acked(7), "a live frame is not in the spool");
    }

    #[test]
    fn an_earlier_runs_backlog_drains_first() {
        let b = Backlog::new(SpoolMode::OnOutage, Some(40), Some(100));
        assert!(b.active());
        assert_eq!(b.route(true), Route::Spool);
        assert_eq!(b.drain_from(), Some(40));
    }

    #[test]
    fn always_mode_publishes_only_what_a_commit_made_durable_and_stays_on_the_spool() {
        let mut b = Backlog::new(SpoolMode::Always, None, Some(0));
        assert_eq!(b.route(true), Route::Spool);
        b.spooled(0, Some(1));
        b.spooled(1, Some(1));
        b.spooled(2, Some(2));
        assert_eq!(b.drain_from(), None, "nothing durable yet");
        b.durable(1);
        assert_eq!(b.drain_from(), None, "epoch 1 is durable once epoch 2 is");
        b.durable(2);
        assert_eq!(b.drain_from(), Some(0));
        assert!(b.may_publish(1) && !b.may_publish(2));
        b.handed_over(0);
        b.handed_over(1);
        assert_eq!(b.drain_from(), None);
        b.caught_up();
        assert!(b.active(), "always mode never goes live");
        // What an earlier run left (committed before its end) may go at once.
        let b = Backlog::new(SpoolMode::Always, Some(5), Some(9));
        assert_eq!(b.drain_from(), Some(5));
        assert!(b.may_publish(8) && !b.may_publish(9));
    }

    #[test]
    fn acks_remove_only_what_was_handed_over_from_the_spool_and_never_skip_ahead() {
        let mut b = Backlog::new(SpoolMode::OnOutage, Some(10), Some(20));
        for s in 10..13 {
            b.handed_over(s);
        }
        assert!(b.acked(10));
        // The ack for 11 was lost with a closed producer: 11 stays spooled, 12 is removed.
        assert!(b.acked(12));
        assert!(!b.acked(11), "already passed: stays in the spool");
    }
}
