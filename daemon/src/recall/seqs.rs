//! A set of a source's sequence numbers kept as sorted, disjoint half-open runs: what recall has
//! sent of a source (so overlapping requests send each frame once), and the runs of frames a
//! source holds (a coverage answer). Pure.

use serde::{Deserialize, Serialize};

/// Sorted, disjoint, non-adjacent `[start, end)` runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqSet(Vec<(u64, u64)>);

impl SeqSet {
    pub fn contains(&self, seq: u64) -> bool {
        let i = self.0.partition_point(|r| r.1 <= seq);
        self.0.get(i).is_some_and(|r| r.0 <= seq)
    }

    pub fn insert(&mut self, seq: u64) {
        self.insert_run(seq, seq.saturating_add(1));
    }

    /// Adds `[start, end)`, merging with the runs it touches.
    pub fn insert_run(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // First run that ends at or after `start` (touching counts), last that starts at or
        // before `end`.
        let lo = self.0.partition_point(|r| r.1 < start);
        let hi = self.0.partition_point(|r| r.0 <= end);
        if lo >= hi {
            self.0.insert(lo, (start, end));
            return;
        }
        let merged = (start.min(self.0[lo].0), end.max(self.0[hi - 1].1));
        self.0.splice(lo..hi, [merged]);
    }

    /// Forgets every seq below `seq` (frames no longer held cannot be sent again anyway).
    pub fn forget_below(&mut self, seq: u64) {
        self.0.retain(|r| r.1 > seq);
        if let Some(first) = self.0.first_mut() {
            first.0 = first.0.max(seq);
        }
    }

    pub fn runs(&self) -> &[(u64, u64)] {
        &self.0
    }

    pub fn len(&self) -> u64 {
        self.0.iter().map(|r| r.1 - r.0).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_merge_when_they_touch() {
        let mut s = SeqSet::default();
        s.insert_run(10, 20);
        s.insert_run(30, 40);
        s.insert(20);
        assert_eq!(s.runs(), &[(10, 21), (30, 40)]);
        s.insert_run(21, 30);
        assert_eq!(s.runs(), &[(10, 40)]);
        s.insert_run(0, 5);
        s.insert_run(2, 12);
        assert_eq!(s.runs(), &[(0, 40)]);
        assert!(s.contains(0) && s.contains(39) && !s.contains(40));
        s.forget_below(35);
        assert_eq!(s.runs(), &[(35, 40)]);
        assert_eq!(s.len(), 5);
    }

    proptest! {
        #[test]
        fn the_set_holds_exactly_what_was_inserted(
            runs in proptest::collection::vec((0u64..200, 0u64..20), 0..30),
            below in 0u64..220,
        ) {
            let mut s = SeqSet::default();
            let mut plain = std::collections::BTreeSet::new();
            for (a, n) in runs {
                s.insert_run(a, a + n);
                plain.extend(a..a + n);
            }
            for w in s.runs().windows(2) {
                prop_assert!(w[0].1 < w[1].0, "runs sorted, apart: {:?}", s.runs());
            }
            for q in 0..230 {
                prop_assert_eq!(s.contains(q), plain.contains(&q));
            }
            prop_assert_eq!(s.len(), plain.len() as u64);
            s.forget_below(below);
            for q in 0..230 {
                prop_assert_eq!(s.contains(q), q >= below && plain.contains(&q));
            }
        }
    }
}
