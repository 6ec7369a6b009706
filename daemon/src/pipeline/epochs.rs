//! A source's sending epochs as a value: which capture sequences go out under which producer name,
//! and when live frames should overtake a backlog by opening a new epoch. Pure: the lane asks and
//! performs (persisting a split with `Spool::add_epoch` before anything is sent under it).
//!
//! Why epochs: broker deduplication is per producer name and accepts only increasing sequence ids.
//! A backlog drains oldest first; frames captured after it that went out first would make the
//! broker drop the backlog as duplicates under one name. So after an outage the backlog keeps its
//! producer (it continues, in order, exactly where that producer was) and new frames move to a
//! new producer name whose first sequence is above every frame captured so far. Each name then
//! sees only increasing sequence ids, forever, across restarts (the starts are persisted), and the
//! sequence id stays `seq << 11 | generation << 8 | chunk` (`uplink::plan`): consumers' `seq`
//! property is the capture sequence whatever the epoch.

use crate::config::{Drain, SpoolMode};

/// At most this many epochs of one source send at once (each is a producer and a connection):
/// beyond it, a new outage's backlog drains in order under the live epoch.
pub const MAX_OPEN_EPOCHS: usize = 4;

/// Epoch starts: the first is 0, the rest ascending, as persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epochs {
    starts: Vec<u64>,
}

impl Epochs {
    /// From the persisted starts after the first (`Spool::epochs`).
    pub fn new(persisted: &[u64]) -> Self {
        let mut starts = vec![0];
        starts.extend(persisted.iter().copied().filter(|&s| s > 0));
        starts.dedup();
        Epochs { starts }
    }

    pub fn starts(&self) -> &[u64] {
        &self.starts
    }

    /// The range `[start, end)` of epoch `i` (`end` None for the last, the live one).
    pub fn range(&self, i: usize) -> (u64, Option<u64>) {
        (self.starts[i], self.starts.get(i + 1).copied())
    }

    /// The epoch a capture sequence belongs to.
    pub fn of(&self, seq: u64) -> usize {
        self.starts.partition_point(|&s| s <= seq).saturating_sub(1)
    }

    /// Opens a new live epoch at `start`; false (nothing changes) unless it is above the last.
    pub fn split(&mut self, start: u64) -> bool {
        if self.starts.last().is_some_and(|&l| l >= start) {
            return false;
        }
        self.starts.push(start);
        true
    }
}

/// What the lane knows when it asks whether live frames should overtake the backlog now.
#[derive(Debug, Clone, Copy)]
pub struct SplitCheck {
    pub drain: Drain,
    pub mode: SpoolMode,
    /// The live epoch has frames in the spool not yet handed over.
    pub backlog: bool,
    /// Some of them were spooled while the live producer was down after being up (an outage, not
    /// only a budget that was spent or a producer still connecting).
    pub outage: bool,
    /// The live producer is up again, and the technician has not paused publishing.
    pub connected: bool,
    /// Epochs sending now, the live one included.
    pub open: usize,
}

/// Whether to open a new live epoch now. Only after an outage: a source that waits for bandwidth
/// keeps its order (it would split on every frame otherwise), and `always` mode publishes only
/// what its commits made durable, in order.
pub fn split_due(c: SplitCheck) -> bool {
    c.drain == Drain::LiveFirst
        && c.mode == SpoolMode::OnOutage
        && c.backlog
        && c.outage
        && c.connected
        && c.open < MAX_OPEN_EPOCHS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sequence_has_one_epoch_and_starts_only_ascend() {
        let mut e = Epochs::new(&[]);
        assert_eq!(e.of(0), 0);
        assert_eq!(e.of(u64::MAX), 0);
        assert!(e.split(100));
        assert!(
            !e.split(100) && !e.split(50),
            "a split never reopens captured sequences"
        );
        assert!(e.split(250));
        assert_eq!(e.starts(), [0, 100, 250]);
        assert_eq!(e.of(99), 0);
        assert_eq!(e.of(100), 1);
        assert_eq!(e.of(249), 1);
        assert_eq!(e.of(250), 2);
        assert_eq!(e.range(1), (100, Some(250)));
        assert_eq!(e.range(2), (250, None));
        assert_eq!(
            Epochs::new(&[100, 250]),
            e,
            "what was persisted reads back the same"
        );
    }

    #[test]
    fn live_overtakes_the_backlog_only_after_an_outage_and_only_in_live_first() {
        let due = SplitCheck {
            drain: Drain::LiveFirst,
            mode: SpoolMode::OnOutage,
            backlog: true,
            outage: true,
            connected: true,
            open: 1,
        };
        assert!(split_due(due));
        assert!(!split_due(SplitCheck {
            drain: Drain::InOrder,
            ..due
        }));
        assert!(!split_due(SplitCheck {
            mode: SpoolMode::Always,
            ..due
        }));
        assert!(
            !split_due(SplitCheck {
                outage: false,
                ..due
            }),
            "waiting for bandwidth is not an outage"
        );
        assert!(
            !split_due(SplitCheck {
                connected: false,
                ..due
            }),
            "still down"
        );
        assert!(!split_due(SplitCheck {
            backlog: false,
            ..due
        }));
        assert!(!split_due(SplitCheck {
            open: MAX_OPEN_EPOCHS,
            ..due
        }));
    }
}
