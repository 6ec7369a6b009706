//! The segment ledger: which segment files the index knows, and how far. Decides, from the
//! ledger and the segment files on disk alone, whether the index covers the segments, which byte
//! ranges must be read back from the segments, and when the index cannot be trusted at all.
//! Pure: no I/O (the daemon and the offline tools both call [`plan`]).
//!
//! Stored in sled's `meta` tree: `ledger` = 1 once the spool keeps a ledger, and per segment
//! `seg:{id:016x}` = the segment's length (u64 LE) up to which every record's index entry is in
//! sled. A commit writes it after the segment's data is synced and the entries are in sled; a
//! segment's entry is removed only after its file is deleted and that deletion is durable.
//!
//! The rule it serves: a segment is deleted only when the index proves that every record in it
//! is acknowledged or dropped. The index proves that only for bytes the ledger covers; anything
//! else is read back from the segment.

use std::collections::BTreeMap;

/// `meta/ledger`: present once the spool keeps a ledger (spools from before it have none).
pub const MARK: &str = "ledger";

pub fn key(id: u64) -> String {
    format!("seg:{id:016x}")
}

/// The segment id of a `seg:` key.
pub fn id_of(key: &[u8]) -> Option<u64> {
    let hex = std::str::from_utf8(key.strip_prefix(b"seg:")?).ok()?;
    u64::from_str_radix(hex, 16).ok()
}

pub fn decode_len(v: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(v.try_into().ok()?))
}

/// What the index knows, as read from sled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// `meta` holds nothing at all: the index is new (or was removed, wiped, truncated).
    pub blank: bool,
    /// The ledger (`None`: a spool from before the ledger, whose index is trusted as it is).
    pub ledger: Option<BTreeMap<u64, u64>>,
}

/// What must happen before the index can be used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The index does not describe these segments: rebuild it from all of them. Why, in words.
    pub damage: Option<String>,
    /// Segments with bytes the index has not taken in (a crash before the commit that would have):
    /// segment -> offset to read from.
    pub uncovered: BTreeMap<u64, u64>,
    /// Ledger entries of segment files that are gone (a crash between the deletion and the
    /// ledger's update): to be removed.
    pub stale: Vec<u64>,
}

/// Compares what the index knows with the segment files on disk (`files`: id -> size).
pub fn plan(known: &Known, files: &BTreeMap<u64, u64>) -> Plan {
    let mut plan = Plan::default();
    let data: Vec<(u64, u64)> = files
        .iter()
        .filter(|(_, size)| **size > 0)
        .map(|(id, size)| (*id, *size))
        .collect();
    if known.blank {
        if !data.is_empty() {
            plan.damage = Some(format!(
                "the index is empty (removed, wiped or truncated) but {} segment file(s) with {} bytes are on disk",
                data.len(),
                data.iter().map(|(_, s)| s).sum::<u64>()
            ));
        }
        return plan;
    }
    let Some(ledger) = &known.ledger else {
        return plan;
    };
    let newest_known = ledger.keys().next_back().copied();
    for &(id, size) in &data {
        match ledger.get(&id) {
            Some(&len) if size <= len => {}
            Some(&len) => {
                plan.uncovered.insert(id, len);
            }
            // A segment newer than every one the ledger knows was created after the last commit:
            // a crash. One older than a known segment was known once: the index lost it.
            None if newest_known.is_some_and(|n| n > id) => {
                plan.damage.get_or_insert(format!(
                    "segment {id:016x} ({size} bytes) is not in the index, newer segments are"
                ));
            }
            None => {
                plan.uncovered.insert(id, 0);
            }
        }
    }
    for &id in ledger.keys() {
        if !files.contains_key(&id) {
            plan.stale.push(id);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(v: &[(u64, u64)]) -> BTreeMap<u64, u64> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_blank_index_beside_segments_is_damage() {
        let known = Known {
            blank: true,
            ledger: None,
        };
        assert!(plan(&known, &files(&[(1, 100)])).damage.is_some());
        assert!(plan(&known, &files(&[(1, 0)])).damage.is_none());
        assert!(plan(&known, &files(&[])).damage.is_none());
    }

    #[test]
    fn tails_and_new_segments_are_read_back_lost_ones_are_damage() {
        let known = Known {
            blank: false,
            ledger: Some(files(&[(2, 50), (3, 10)])),
        };
        let p = plan(&known, &files(&[(2, 50), (3, 40), (4, 9)]));
        assert_eq!(p.damage, None);
        assert_eq!(p.uncovered, files(&[(3, 10), (4, 0)]));
        let p = plan(&known, &files(&[(1, 5), (2, 50), (3, 10)]));
        assert!(p.damage.unwrap().contains("0000000000000001"));
        let p = plan(&known, &files(&[(3, 10)]));
        assert_eq!(p.stale, vec![2]);
    }

    #[test]
    fn keys_round_trip() {
        assert_eq!(id_of(key(0xabc).as_bytes()), Some(0xabc));
        assert_eq!(id_of(b"seq:x"), None);
    }
}
