//! Units a config is written in: byte sizes (`20GiB`), bandwidths (`2Mbit/s`) and ages (`2h`).

use super::*;

/// A bit rate written as tc writes one: "1800kbit", "2mbit", "64000bit" (SI: k = 1000). Held in
/// bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bandwidth(pub u64);

impl Bandwidth {
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite())
            .ok_or_else(|| format!("`{s}` is not a rate like 1800kbit"))?;
        let mult = match unit.trim().to_ascii_lowercase().as_str() {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            other => {
                return Err(format!(
                    "unknown rate unit `{other}` in `{s}` (use bit, kbit, mbit, gbit)"
                ))
            }
        };
        let bits = n * mult;
        if bits >= u64::MAX as f64 {
            return Err(format!("`{s}` is too large"));
        }
        Ok(Bandwidth(bits.round() as u64))
    }

    pub fn bytes_per_second(self) -> u64 {
        self.0 / 8
    }
}

impl Serialize for Bandwidth {
    /// As written: `"1800000bit"` (what [`Bandwidth::parse`] reads back).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}bit", self.0))
    }
}

impl<'de> Deserialize<'de> for Bandwidth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Bandwidth::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A byte count written as an integer or a string with a unit ("8GiB", "512 MiB", "64k").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (n, unit) = number_and_unit(s, "a size like 512MiB")?;
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "tib" => 1 << 40,
            other => {
                return Err(format!(
                    "unknown size unit `{other}` (use B, KiB, MiB, GiB, TiB)"
                ))
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("`{}` is too large", s.trim()))
    }

    /// `2.1 GiB`, `512 B`: for people (not parsed back).
    pub fn human(self) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            format!("{} B", self.0)
        } else {
            format!("{v:.1} {}", UNITS[u])
        }
    }
}

impl Serialize for ByteSize {
    /// In bytes, an integer (what the config reads back).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl Written for ByteSize {
    const EXPECTING: &'static str = "a whole number of bytes or a size like \"512MiB\"";
    const WHAT: &'static str = "size";
    fn from_number(n: u64) -> Self {
        ByteSize(n)
    }
    fn parse(s: &str) -> Result<Self, String> {
        ByteSize::parse(s)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WrittenVisitor(std::marker::PhantomData))
    }
}

/// `gop`: a keyframe interval as a whole number of buckets (`30`), or as a duration (`"1s"`,
/// `"500ms"`) taken to the nearest whole number of buckets, at least one ([`Gop::buckets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gop {
    Buckets(u32),
    Millis(u64),
}

impl Gop {
    /// The interval in buckets of `bucket_ms` (0 when written as 0 buckets, which the checks
    /// refuse).
    pub fn buckets(self, bucket_ms: u32) -> u32 {
        match self {
            Gop::Buckets(n) => n,
            Gop::Millis(ms) => {
                let b = u64::from(bucket_ms.max(1));
                ((ms + b / 2) / b).clamp(1, u64::from(u32::MAX)) as u32
            }
        }
    }
}

impl Serialize for Gop {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Gop::Buckets(n) => s.serialize_u32(*n),
            Gop::Millis(ms) => s.serialize_str(&format!("{ms}ms")),
        }
    }
}

impl Written for Gop {
    const EXPECTING: &'static str =
        "a whole number of buckets or a duration like \"1s\" or \"500ms\"";
    const WHAT: &'static str = "gop";
    fn from_number(n: u64) -> Self {
        Gop::Buckets(n.min(u64::from(u32::MAX)) as u32)
    }
    fn parse(s: &str) -> Result<Self, String> {
        let (n, unit) = number_and_unit(s, "a duration like 1s")?;
        let ms = match unit {
            "ms" => n,
            "s" => n.saturating_mul(1000),
            other => return Err(format!("unknown gop unit `{other}` (use ms or s)")),
        };
        Ok(Gop::Millis(ms))
    }
}

impl<'de> Deserialize<'de> for Gop {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WrittenVisitor(std::marker::PhantomData))
    }
}

/// A duration written as a string with a unit: "90s", "20m", "2h", "7d" (or an integer of seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Age(pub std::time::Duration);

impl Age {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (n, unit) = number_and_unit(s, "a duration like 2h")?;
        let secs: u64 = match unit {
            "" | "s" => 1,
            "m" | "min" => 60,
            "h" => 3600,
            "d" => 86_400,
            other => return Err(format!("unknown duration unit `{other}` (use s, m, h, d)")),
        };
        n.checked_mul(secs)
            .map(|s| Age(std::time::Duration::from_secs(s)))
            .ok_or_else(|| format!("`{}` is too long", s.trim()))
    }
}

impl Serialize for Age {
    /// In seconds, an integer (what the config reads back).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0.as_secs())
    }
}

impl Written for Age {
    const EXPECTING: &'static str = "a whole number of seconds or a duration like \"2h\"";
    const WHAT: &'static str = "duration";
    fn from_number(n: u64) -> Self {
        Age(std::time::Duration::from_secs(n))
    }
    fn parse(s: &str) -> Result<Self, String> {
        Age::parse(s)
    }
}

impl<'de> Deserialize<'de> for Age {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WrittenVisitor(std::marker::PhantomData))
    }
}

/// The leading whole number of `s` and the unit after it (trimmed); `example` says what was
/// expected when there is no number.
fn number_and_unit<'a>(s: &'a str, example: &str) -> Result<(u64, &'a str), String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n = num.parse().map_err(|_| format!("`{s}` is not {example}"))?;
    Ok((n, unit.trim()))
}

/// A quantity a config writes as a whole number (in its base unit) or as a string with a unit.
trait Written: Sized {
    const EXPECTING: &'static str;
    const WHAT: &'static str;
    fn from_number(n: u64) -> Self;
    fn parse(s: &str) -> Result<Self, String>;
}

struct WrittenVisitor<T>(std::marker::PhantomData<T>);

impl<T: Written> serde::de::Visitor<'_> for WrittenVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(T::EXPECTING)
    }
    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<T, E> {
        u64::try_from(n)
            .map(T::from_number)
            .map_err(|_| E::custom(format!("{} must not be negative, got {n}", T::WHAT)))
    }
    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<T, E> {
        Ok(T::from_number(n))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<T, E> {
        T::parse(s).map_err(E::custom)
    }
}
