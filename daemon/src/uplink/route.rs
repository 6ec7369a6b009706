//! Which partition of a partitioned topic a message goes to: its key hashed, then
//! `signSafeMod(hash, partitions)`, as the Java client's key-based routing does
//! (`RoundRobinPartitionMessageRouterImpl` for a message with a key), so that rigd and Java
//! producers put one bucket on one partition. Pure: no I/O.
//!
//! The two schemes are the Java client's `HashingScheme`s, bit for bit:
//! - `murmur3-32` (`Murmur3_32Hash`): MurmurHash3 x86 32-bit, seed 0, over the key's UTF-8 bytes,
//!   masked to 31 bits;
//! - `java-string` (`JavaStringHash`, the Java client's default): `String.hashCode()` over the
//!   key's UTF-16 code units, masked to 31 bits.

pub use crate::config::HashingScheme;

/// The key's hash as the Java client computes it (non-negative).
pub fn hash(scheme: HashingScheme, key: &str) -> i32 {
    let h = match scheme {
        HashingScheme::Murmur3_32 => murmur3_32(key.as_bytes(), 0) as i32,
        HashingScheme::JavaString => java_string_hash(key),
    };
    h & i32::MAX
}

/// The partition (0-based) of a message with this key on a topic of `partitions` partitions.
pub fn partition(scheme: HashingScheme, key: &str, partitions: u32) -> u32 {
    sign_safe_mod(hash(scheme, key), partitions.max(1) as i32) as u32
}

/// `MathUtils.signSafeMod`: the remainder, made non-negative.
fn sign_safe_mod(dividend: i32, divisor: i32) -> i32 {
    let m = dividend % divisor;
    if m < 0 {
        m + divisor
    } else {
        m
    }
}

/// `String.hashCode()`: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, wrapping.
fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
}

/// MurmurHash3, x86 32-bit variant (Austin Appleby's reference algorithm).
fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mix = |k: u32| k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        h ^= mix(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let k = tail
            .iter()
            .rev()
            .fold(0u32, |k, &byte| (k << 8) | u32::from(byte));
        h ^= mix(k);
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_matches_the_reference_vectors() {
        // SMHasher's published vectors for MurmurHash3_x86_32.
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"", 0xffff_ffff), 0x81f1_6f39);
        assert_eq!(murmur3_32(&[0, 0, 0, 0], 0), 0x2362_f9de);
        assert_eq!(murmur3_32(b"aaaa", 0x9747_b28c), 0x5a97_808a);
        assert_eq!(murmur3_32(b"aaa", 0x9747_b28c), 0x283e_0130);
        assert_eq!(murmur3_32(b"aa", 0x9747_b28c), 0x5d21_1726);
        assert_eq!(murmur3_32(b"a", 0x9747_b28c), 0x7fa0_9ea6);
        assert_eq!(murmur3_32(b"Hello, world!", 0x9747_b28c), 0x2488_4cba);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0x9747_b28c),
            0x2fa8_26cd
        );
    }

    #[test]
    fn java_string_hash_is_string_hash_code() {
        // Values of "...".hashCode() in Java.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        // Outside the BMP: two UTF-16 code units (U+1F600 is D83D DE00).
        assert_eq!(java_string_hash("\u{1F600}"), 0xD83Di32 * 31 + 0xDE00);
    }

    #[test]
    fn the_hash_is_masked_to_31_bits_and_the_partition_is_in_range() {
        assert_eq!(hash(HashingScheme::JavaString, "polygenelubricants"), 0);
        for scheme in [HashingScheme::Murmur3_32, HashingScheme::JavaString] {
            for key in ["0", "1", "53030303", "51515151515", "x"] {
                assert!(hash(scheme, key) >= 0);
                for n in 1..=7 {
                    assert!(partition(scheme, key, n) < n);
                }
            }
        }
        assert_eq!(
            partition(HashingScheme::Murmur3_32, "7", 0),
            0,
            "0 partitions act as 1"
        );
        assert_eq!(sign_safe_mod(-5, 3), 1);
        assert_eq!(sign_safe_mod(5, 3), 2);
    }

    #[test]
    fn bucket_keys_spread_over_the_partitions() {
        // Consecutive 33 ms buckets (the message keys) fill four partitions evenly enough.
        for scheme in [HashingScheme::Murmur3_32, HashingScheme::JavaString] {
            let mut count = [0u32; 4];
            for bucket in 53_000_000u64..53_004_000 {
                count[partition(scheme, &bucket.to_string(), 4) as usize] += 1;
            }
            assert!(count.iter().all(|&c| c > 600), "{scheme:?}: {count:?}");
        }
    }
}
