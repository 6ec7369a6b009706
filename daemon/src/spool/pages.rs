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
//! version u8 = 3 | count u32 | count x (seq u64 | segment u64 | offset u64 | len u32 | capture_ns i64 | flags u8)
//! ```
//! Version 3 (issue 48.4) adds a flags byte per entry; bit 0 is [`Location::delta`], a frame that
//! decodes only after an earlier one (an H.264 P-frame), which drop-oldest and retention need to
//! keep a group of pictures whole without reading records. A page is written as version 2 when no
//! entry of it is a delta (every spool without video stays byte for byte what it was, and an
//! older rigd reads it); a version 3 page is one an older rigd does not decode, so it rebuilds its
//! index from the segments (the module doc of [`super`]), losing nothing. Both versions are read.
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
    /// The frame decodes only after an earlier one of its source (an H.264 P-frame): dropping
    /// the frames before it leaves it useless ([`super::gop`]).
    pub(super) delta: bool,
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
            delta: false,
        })
    }
}

/// Entries per page written by a commit. Merging into an existing page may exceed it.
pub const PAGE_MAX: usize = 256;

const VERSION: u8 = 2;
/// Version 3: an entry is followed by its flags byte.
const VERSION_FLAGS: u8 = 3;
const HEADER: usize = 5;
const ENTRY: usize = 36;
const LEGACY: usize = 28;
/// Flags bit: [`Location::delta`].
const DELTA: u8 = 1;

/// A page's entry size by its version byte; None for an unknown version.
fn entry_size(version: u8) -> Option<usize> {
    match version {
        VERSION => Some(ENTRY),
        VERSION_FLAGS => Some(ENTRY + 1),
        _ => None,
    }
}

/// One entry of a page's bytes (`e` is `entry_size` long).
fn entry_at(e: &[u8]) -> (u64, Location) {
    let u64_at = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or_default());
    let loc = Location {
        segment: u64_at(8),
        offset: u64_at(16),
        len: u32::from_le_bytes(e[24..28].try_into().unwrap_or_default()),
        capture_ns: u64_at(28) as i64,
        delta: e.get(ENTRY).is_some_and(|f| f & DELTA != 0),
    };
    (u64_at(0), loc)
}

/// One page: (seq, location), strictly increasing seq.
pub type Page = Vec<(u64, Location)>;

pub fn encode(page: &[(u64, Location)]) -> Vec<u8> {
    let flags = page.iter().any(|(_, l)| l.delta);
    let version = if flags { VERSION_FLAGS } else { VERSION };
    let size = entry_size(version).unwrap_or(ENTRY);
    let mut b = Vec::with_capacity(HEADER + size * page.len());
    b.push(version);
    b.extend((page.len() as u32).to_le_bytes());
    for (seq, loc) in page {
        b.extend(seq.to_le_bytes());
        b.extend(loc.segment.to_le_bytes());
        b.extend(loc.offset.to_le_bytes());
        b.extend(loc.len.to_le_bytes());
        b.extend(loc.capture_ns.to_le_bytes());
        if flags {
            b.push(if loc.delta { DELTA } else { 0 });
        }
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
    let size = entry_size(version)?;
    if body.len() != count.checked_mul(size)? {
        return None;
    }
    // A version 3 page is written only when an entry is a delta, and a flags byte holds only
    // the delta bit: anything else is not a page this code wrote.
    if version == VERSION_FLAGS
        && (body.chunks_exact(size).all(|e| e[ENTRY] == 0)
            || body.chunks_exact(size).any(|e| e[ENTRY] & !DELTA != 0))
    {
        return None;
    }
    let mut page = Vec::with_capacity(count);
    for e in body.chunks_exact(size) {
        let (seq, loc) = entry_at(e);
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
    let size = entry_size(*v.first()?)?;
    if v.len() < HEADER + size || (v.len() - HEADER) % size != 0 {
        return None;
    }
    let at = v.len() - size;
    Some(u64::from_le_bytes(v[at..at + 8].try_into().ok()?))
}

/// One seq's location in a page's bytes, found by binary search without decoding the page.
pub fn find(key: u64, v: &[u8], seq: u64) -> Option<Location> {
    if v.len() == LEGACY {
        return (seq == key).then(|| Location::decode(v)).flatten();
    }
    let size = entry_size(*v.first()?)?;
    if v.len() < HEADER || (v.len() - HEADER) % size != 0 {
        return None;
    }
    let body = &v[HEADER..];
    let n = body.len() / size;
    let seq_at =
        |i: usize| u64::from_le_bytes(body[i * size..i * size + 8].try_into().unwrap_or_default());
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match seq_at(mid).cmp(&seq) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => {
                return Some(entry_at(&body[mid * size..(mid + 1) * size]).1);
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
        let size = v.first().and_then(|&b| entry_size(b)).unwrap_or(ENTRY);
        v.len().saturating_sub(HEADER) / size
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
            delta: false,
        }
    }

    #[test]
    fn a_page_with_deltas_is_version_3_and_without_stays_version_2() {
        let plain: Page = (0..20).map(|s| (s, loc(s))).collect();
        assert_eq!(
            encode(&plain)[0],
            2,
            "no video: the format an older rigd reads"
        );
        let video: Page = (0..20)
            .map(|s| {
                (
                    s,
                    Location {
                        delta: s % 5 != 0,
                        ..loc(s)
                    },
                )
            })
            .collect();
        let v = encode(&video);
        assert_eq!(v[0], 3);
        assert_eq!(decode(0, &v), Some(video.clone()));
        assert_eq!(last_seq(0, &v), Some(19));
        assert_eq!(count(&v), 20);
        for (seq, l) in &video {
            assert_eq!(find(0, &v, *seq), Some(*l));
        }
        // A version 2 page read by this code: nothing is a delta.
        assert!(decode(0, &encode(&plain))
            .unwrap()
            .iter()
            .all(|(_, l)| !l.delta));
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
