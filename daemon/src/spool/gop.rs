//! Where a drop of a source's oldest records may end so that no group of pictures is split
//! (issue 48.4). Pure: no I/O; the spool's drop-oldest and retention ask it with what the index
//! knows of each record ([`super::pages::Location::delta`]: a frame that decodes only after an
//! earlier one, an H.264 P-frame).
//!
//! A group is a keyframe and the deltas after it up to the next keyframe of the source. A drop
//! takes the oldest records of a source, so what it can get wrong is the cut: a cut inside a group
//! leaves the group's later frames at the head of the source's spool without their keyframe,
//! frames that no consumer can decode. The rules:
//! - A drop for room or for age/size ends at a group's end: the deltas right after the cut go
//!   with it ([`extend`]), counted the same way as the frames that made the drop.
//! - A drop that must stop because a later frame is still wanted (a recall's range) stops at the
//!   start of that frame's group instead ([`keep_whole`]), so what a recall reads begins at a
//!   keyframe.
//! - Sources without video have no deltas: every cut is already at a group's end, nothing changes.

/// How far a cut at `cut` (the first record kept) goes to end at a group's end: past every delta
/// from `cut` on. `deltas[i]`: record `i` (oldest first) is a delta. `dropped_before`: records of
/// the source were dropped before `cut` now or in an earlier batch (a head of deltas is broken only
/// if something before it went: deltas at the head of an untouched spool follow a keyframe already
/// published). Returns the new cut, `deltas.len()` when the group runs past what was given (the
/// caller looks further).
pub fn extend(deltas: &[bool], cut: usize, dropped_before: bool) -> usize {
    if !dropped_before && cut == 0 {
        return 0;
    }
    let cut = cut.min(deltas.len());
    cut + deltas[cut..].iter().take_while(|d| **d).count()
}

/// Where a drop that must keep record `stop` (wanted) ends so that `stop`'s group stays whole: at
/// the group's keyframe, the last non-delta at or before `stop`. None when that keyframe is not
/// among `deltas` (it went in an earlier batch): the caller keeps `stop` as it is.
pub fn keep_whole(deltas: &[bool], stop: usize) -> Option<usize> {
    let stop = stop.min(deltas.len());
    if deltas.get(stop).is_none_or(|d| !d) {
        return Some(stop);
    }
    deltas[..stop].iter().rposition(|d| !d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `K` a keyframe, `p` a delta.
    fn g(s: &str) -> Vec<bool> {
        s.chars().map(|c| c == 'p').collect()
    }

    #[test]
    fn a_cut_inside_a_group_takes_the_rest_of_the_group() {
        // KppKpp: a cut after the first P-frame takes the next one, not the second keyframe.
        assert_eq!(extend(&g("KppKpp"), 2, true), 3);
        assert_eq!(extend(&g("KppKpp"), 1, true), 3);
        // A cut on a keyframe is a group's end already.
        assert_eq!(extend(&g("KppKpp"), 3, true), 3);
        // The group runs past the batch: everything given goes, the caller looks further.
        assert_eq!(extend(&g("Kppppp"), 1, true), 6);
        assert_eq!(extend(&g("ppp"), 0, true), 3);
    }

    #[test]
    fn an_untouched_head_of_deltas_is_left_alone() {
        // Its keyframe was published before the rest of the group spooled.
        assert_eq!(extend(&g("ppKpp"), 0, false), 0);
        // The same head after a drop in an earlier batch is broken and goes.
        assert_eq!(extend(&g("ppKpp"), 0, true), 2);
    }

    #[test]
    fn without_video_nothing_changes() {
        let plain = g("KKKKKK");
        for cut in 0..=plain.len() {
            assert_eq!(extend(&plain, cut, true), cut);
            assert_eq!(keep_whole(&plain, cut), Some(cut));
        }
    }

    #[test]
    fn a_wanted_frame_keeps_its_whole_group() {
        // Frame 4 (a P-frame) is wanted: its group starts at 3, so the drop ends there.
        assert_eq!(keep_whole(&g("KppKpp"), 4), Some(3));
        assert_eq!(keep_whole(&g("KppKpp"), 3), Some(3));
        assert_eq!(keep_whole(&g("KppKpp"), 2), Some(0));
        // Its keyframe is not in the batch.
        assert_eq!(keep_whole(&g("ppKpp"), 1), None);
    }

    proptest::proptest! {
        /// After any cut, the first record kept is a keyframe (or nothing is left), and nothing
        /// beyond the group of the cut goes.
        #[test]
        fn every_cut_ends_at_a_keyframe(deltas in proptest::collection::vec(proptest::bool::ANY, 0..64),
                                        cut in 0usize..70) {
            let cut = cut.min(deltas.len());
            let end = extend(&deltas, cut, true);
            proptest::prop_assert!(end >= cut);
            proptest::prop_assert!(end == deltas.len() || !deltas[end]);
            proptest::prop_assert!(deltas[cut..end].iter().all(|d| *d));
            if let Some(k) = keep_whole(&deltas, cut) {
                proptest::prop_assert!(k <= cut);
                proptest::prop_assert!(k == deltas.len() || !deltas[k]);
                if k < cut {
                    proptest::prop_assert!(deltas[k + 1..cut].iter().all(|d| *d));
                }
            }
        }
    }
}
