//! Encoding of the spool index: where a record is ([`Location`]), and a source's record locations
//! grouped into pages, one sled entry per page. Pure: no I/O.
//!
//! A page holds up to [`PAGE_MAX`] entries of one source in increasing `seq`, keyed in sled by a
//! seq at or below its first entry (big-endian, so sled orders pages by seq). Pages of a source
//! never overlap: every seq in `key..=last entry` that is stored at all is in that page, so the
//! page that may hold a seq is the one with the greatest key not above it.
//!
//! Value layout (integers little-endian):
//! ```text
//! version u8 = 2 | count u32 | count x (seq u64 | segment u64 | offset u64 | len u32 | capture_ns i64)
//! ```
//! A 28-byte value is the earlier format: one record's location, its seq being the key.
//!
//! One sled entry per page rather than per record: a group commit of thousands of small frames
//! costs a few sled inserts instead of thousands (sled copies a node on every insert).

/// Where a record is: its segment, offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Location {
    pub(super) segment: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
    /// Capture time of the frame, so the oldest age is known without reading the record.
    pub(super) capture_ns: i64,
}

impl Location {
    /// The earlier one-entry-per-record index value (still read, see the module doc).
    #[cfg(test)]
    pub(super) fn encode(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..].copy_from_slice(&self.capture_ns.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 28 {
            return None;
        }
        Some(Location {
            segment: u64::from_le_bytes(b[..8].try_into().ok()?),
            offset: u64::from_le_bytes(b[8..16].try_into().ok()?),
            len: u32::from_le_bytes(b[16..20].try_into().ok()?),
            capture_ns: i64::from_le_bytes(b[20..].try_into().ok()?),
        })
    }
}

/// Entries per page written by a commit. Merging into an existing page may exceed it.
pub const PAGE_MAX: usize = 256;

const VERSION: u8 = 2;
const HEADER: usize = 5;
const ENTRY: usize = 36;
const LEGACY: usize = 28;

/// One page: (seq, location), strictly increasing seq.
pub type Page = Vec<(u64, Location)>;

pub fn encode(page: &[(u64, Location)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER + ENTRY * page.len());
    b.push(VERSION);
    b.extend((page.len() as u32).to_le_bytes());
    for (seq, loc) in page {
        b.extend(seq.to_le_bytes());
        b.extend(loc.segment.to_le_bytes());
        b.extend(loc.offset.to_le_bytes());
        b.extend(loc.len.to_le_bytes());
        b.extend(loc.capture_ns.to_le_bytes());
    }
    b
}

/// Decodes a page stored under `key`; `None` when the bytes are not a page.
pub fn decode(key: u64, v: &[u8]) -> Option<Page> {
    if v.len() == LEGACY {
        return Location::decode(v).map(|loc| vec![(key, loc)]);
    }
    let (&version, rest) = v.split_first()?;
    let count = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let body = &rest[4..];
    if version != VERSION || body.len() != count.checked_mul(ENTRY)? {
        return None;
    }
    let mut page = Vec::with_capacity(count);
    for e in body.chunks_exact(ENTRY) {
        let u64_at = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or_default());
        let seq = u64_at(0);
        let loc = Location {
            segment: u64_at(8),
            offset: u64_at(16),
            len: u32::from_le_bytes(e[24..28].try_into().unwrap_or_default()),
            capture_ns: u64_at(28) as i64,
        };
        if seq < key || page.last().is_some_and(|(prev, _)| *prev >= seq) {
            return None;
        }
        page.push((seq, loc));
    }
    Some(page)
}

/// The last seq of a page's bytes without decoding it all; `None` for an empty or bad page.
pub fn last_seq(key: u64, v: &[u8]) -> Option<u64> {
    if v.len() == LEGACY {
        return Some(key);
    }
    if v.len() < HEADER + ENTRY || v[0] != VERSION || (v.len() - HEADER) % ENTRY != 0 {
        return None;
    }
    let at = v.len() - ENTRY;
    Some(u64::from_le_bytes(v[at..at + 8].try_into().ok()?))
}

/// One seq's location in a page's bytes, found by binary search without decoding the page.
pub fn find(key: u64, v: &[u8], seq: u64) -> Option<Location> {
    if v.len() == LEGACY {
        return (seq == key).then(|| Location::decode(v)).flatten();
    }
    if v.len() < HEADER || v[0] != VERSION || (v.len() - HEADER) % ENTRY != 0 {
        return None;
    }
    let body = &v[HEADER..];
    let n = body.len() / ENTRY;
    let seq_at = |i: usize| {
        u64::from_le_bytes(
            body[i * ENTRY..i * ENTRY + 8]
                .try_into()
                .unwrap_or_default(),
        )
    };
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match seq_at(mid).cmp(&seq) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => {
                let e = &body[mid * ENTRY..(mid + 1) * ENTRY];
                let u64_at =
                    |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or_default());
                return Some(Location {
                    segment: u64_at(8),
                    offset: u64_at(16),
                    len: u32::from_le_bytes(e[24..28].try_into().unwrap_or_default()),
                    capture_ns: u64_at(28) as i64,
                });
            }
        }
    }
    None
}

/// How many entries a page's bytes hold, without decoding them.
pub fn count(v: &[u8]) -> usize {
    if v.len() == LEGACY {
        1
    } else {
        v.len().saturating_sub(HEADER) / ENTRY
    }
}

/// Where new entries (increasing seq, none of them stored yet) go, given the pages around them.
/// `containing(seq)`: the key of the stored page whose `key..=last` holds `seq`, if any;
/// `next_key(seq)`: the smallest stored key above `seq`, if any. Returns, in order, the entries
/// for each existing page (merge) or new page (`None` key, its first entry's seq becomes the key).
pub fn place(
    entries: &[(u64, Location)],
    mut containing: impl FnMut(u64) -> Option<u64>,
    mut next_key: impl FnMut(u64) -> Option<u64>,
) -> Vec<(Option<u64>, Page)> {
    let mut out: Vec<(Option<u64>, Page)> = Vec::new();
    // Entries below `bound` need no check: no stored page starts between the last check and it.
    let mut bound = 0u64;
    let mut open_new = false;
    for &(seq, loc) in entries {
        if seq >= bound || !open_new {
            if let Some(key) = containing(seq) {
                match out.last_mut() {
                    Some((Some(k), page)) if *k == key => page.push((seq, loc)),
                    _ => out.push((Some(key), vec![(seq, loc)])),
                }
                open_new = false;
                continue;
            }
            bound = next_key(seq).unwrap_or(u64::MAX);
            out.push((None, vec![(seq, loc)]));
            open_new = true;
            continue;
        }
        match out.last_mut() {
            Some((None, page)) if page.len() < PAGE_MAX => page.push((seq, loc)),
            _ => out.push((None, vec![(seq, loc)])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(i: u64) -> Location {
        Location {
            segment: 1 + i / 100,
            offset: i * 4096,
            len: 4096 + i as u32,
            capture_ns: -(i as i64),
        }
    }

    #[test]
    fn a_page_round_trips_and_knows_its_last_seq() {
        let page: Page = (10..300).step_by(3).map(|s| (s, loc(s))).collect();
        let v = encode(&page);
        assert_eq!(decode(10, &v), Some(page.clone()));
        assert_eq!(last_seq(10, &v), Some(page.last().unwrap().0));
        assert_eq!(count(&v), page.len());
        for (seq, l) in &page {
            assert_eq!(find(10, &v, *seq), Some(*l));
            assert_eq!(find(10, &v, seq + 1), None);
        }
        // A key above the first entry, a truncation or a wrong version is not a page.
        assert_eq!(decode(11, &v), None);
        assert_eq!(decode(10, &v[..v.len() - 1]), None);
        let mut bad = v.clone();
        bad[0] = 9;
        assert_eq!(decode(10, &bad), None);
    }

    #[test]
    fn the_earlier_one_record_format_reads_as_a_page_of_one() {
        let l = loc(7);
        let v = l.encode();
        assert_eq!(decode(42, &v), Some(vec![(42, l)]));
        assert_eq!(find(42, &v, 42), Some(l));
        assert_eq!(find(42, &v, 43), None);
        assert_eq!(last_seq(42, &v), Some(42));
        assert_eq!(count(&v), 1);
    }

    #[test]
    fn new_entries_fill_pages_and_never_span_a_stored_page() {
        let entries: Vec<_> = (0..600).map(|s| (s, loc(s))).collect();
        // Nothing stored: pages of PAGE_MAX.
        let placed = place(&entries, |_| None, |_| None);
        let sizes: Vec<_> = placed.iter().map(|(k, p)| (*k, p.len())).collect();
        assert_eq!(sizes, vec![(None, 256), (None, 256), (None, 88)]);
        // A stored page starting at 300 (holding 300..=305, which these entries skip): the new
        // page before it ends at 299 and a new one starts after it.
        let entries: Vec<_> = (290..300).chain(306..310).map(|s| (s, loc(s))).collect();
        let placed = place(
            &entries,
            |_| None,
            |s| if s < 300 { Some(300) } else { None },
        );
        let firsts: Vec<_> = placed.iter().map(|(k, p)| (*k, p[0].0, p.len())).collect();
        assert_eq!(firsts, vec![(None, 290, 10), (None, 306, 4)]);
    }

    #[test]
    fn entries_inside_a_stored_page_are_merged_into_it() {
        // Stored: page 100 holding 100..=200 with holes (frames published live in between).
        let entries: Vec<_> = [150, 151, 250].iter().map(|&s| (s, loc(s))).collect();
        let placed = place(
            &entries,
            |s| (100..=200).contains(&s).then_some(100),
            |s| if s < 100 { Some(100) } else { None },
        );
        let got: Vec<_> = placed
            .iter()
            .map(|(k, p)| (*k, p.iter().map(|e| e.0).collect::<Vec<_>>()))
            .collect();
        assert_eq!(got, vec![(Some(100), vec![150, 151]), (None, vec![250])]);
    }

    proptest::proptest! {
        /// Whatever bytes sled hands back: no panic, and what decodes re-encodes to the same bytes.
        #[test]
        fn garbage_never_panics_and_what_decodes_is_exact(
            key in 0u64..1000,
            v in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let _ = last_seq(key, &v);
            let _ = count(&v);
            let _ = find(key, &v, key + 3);
            if let Some(page) = decode(key, &v) {
                if v.len() != LEGACY {
                    proptest::prop_assert_eq!(encode(&page), v);
                }
            }
        }
    }
}
