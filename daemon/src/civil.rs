//! Capture times on the command line and in reports: RFC 3339 or unix nanoseconds in, RFC 3339
//! (UTC, nanoseconds) out. Pure: no I/O.

/// Parses `2024-05-01T12:00:00Z`, `2024-05-01T14:00:00.25+02:00`, or an integer of unix ns.
pub fn parse(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if !s.is_empty()
        && s.trim_start_matches('-')
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        return s
            .parse::<i64>()
            .map_err(|_| format!("{s:?}: unix nanoseconds out of range"));
    }
    parse_rfc3339(s).ok_or_else(|| {
        format!("{s:?}: expected RFC 3339 (2024-05-01T12:00:00Z, 2024-05-01T14:00:00.5+02:00) or unix nanoseconds")
    })
}

fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut frac_ns = 0i64;
    if b[at] == b'.' {
        let start = at + 1;
        let mut end = start;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        if end == start {
            return None;
        }
        let digits = &s[start..end.min(start + 9)];
        frac_ns = digits.parse::<i64>().ok()? * 10i64.pow(9 - digits.len() as u32);
        at = end;
    }
    let offset_s = match &s[at..] {
        "Z" | "z" => 0,
        tz if tz.len() == 6 && (tz.starts_with('+') || tz.starts_with('-')) && &tz[3..4] == ":" => {
            let h = num(at + 1..at + 3)?;
            let m = num(at + 4..at + 6)?;
            if h > 23 || m > 59 {
                return None;
            }
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

/// Formats unix ns as RFC 3339 UTC with nanoseconds: `2024-05-01T12:00:00.000000000Z`.
pub fn format(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_forms_the_cli_documents() {
        assert_eq!(parse("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse("1714564800123456789"), Ok(1_714_564_800_123_456_789));
        assert_eq!(parse("2024-05-01T12:00:00Z"), Ok(1_714_564_800_000_000_000));
        assert_eq!(
            parse("2024-05-01T14:00:00.25+02:00"),
            Ok(1_714_564_800_250_000_000)
        );
        assert_eq!(
            parse("2024-05-01T12:00:00.123456789123Z"),
            Ok(1_714_564_800_123_456_789)
        );
        assert_eq!(
            parse("2024-02-29T00:00:00-00:30"),
            Ok(1_709_166_600_000_000_000)
        );
        for bad in [
            "",
            "yesterday",
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-05-01T12:00:00.Z",
            "2024-05-01T12:00:00+0200",
            "99999999999999999999",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn format_and_parse_round_trip(ns in -4_000_000_000_000_000_000i64..4_000_000_000_000_000_000) {
            prop_assert_eq!(parse(&format(ns)), Ok(ns));
        }
    }
}
