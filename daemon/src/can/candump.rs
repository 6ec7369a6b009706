//! can-utils' log format, the one `candump -l` writes and `canplayer` replays: one frame a line,
//! `(SECONDS.MICROS) IFACE FRAME`, where FRAME is `candump`'s compact text (lib.c,
//! `sprint_canframe`):
//! - classic: `123#DEADBEEF` (3 hex digits: a standard id, 8: an extended one), `123#` empty,
//!   `123#R` a remote request (`123#R5` one asking for 5 bytes);
//! - CAN FD: `123##<flags><data>`, the flags one hex digit (1 bit rate switch, 2 error state);
//! - an error frame: its id with `CAN_ERR_FLAG` as 8 hex digits (`20000004#0004...`).
//!
//! Written by `rigd replay --out` (one `{source}.log` per CAN source) and read by `rigd can
//! decode`. Pure.

use rigd_drivers::can_record::{CanFrame, BRS, EFF_FLAG, EFF_MASK, ERR_FLAG, ESI, FD, RTR_FLAG};
use std::fmt::Write as _;

/// Appends a frame's log line (with its `\n`) to `out`. The time is cut to microseconds, as
/// candump's is.
pub fn write_line(f: &CanFrame, iface: &str, out: &mut String) {
    let secs = f.ts_ns.div_euclid(1_000_000_000);
    let micros = f.ts_ns.rem_euclid(1_000_000_000) / 1_000;
    let _ = write!(out, "({secs:010}.{micros:06}) {iface} ");
    write_frame(f, out);
    out.push('\n');
}

/// Appends candump's compact text of a frame (`123#DEADBEEF`) to `out`.
pub fn write_frame(f: &CanFrame, out: &mut String) {
    let _ = if f.id & ERR_FLAG != 0 {
        write!(out, "{:08X}#", f.id & (EFF_MASK | ERR_FLAG))
    } else if f.id & EFF_FLAG != 0 {
        write!(out, "{:08X}#", f.id & EFF_MASK)
    } else {
        write!(out, "{:03X}#", f.id & 0x7FF)
    };
    if f.flags & FD != 0 {
        let nibble = u8::from(f.flags & BRS != 0) | (u8::from(f.flags & ESI != 0) << 1);
        let _ = write!(out, "#{nibble:X}");
    } else if f.id & RTR_FLAG != 0 && f.id & ERR_FLAG == 0 {
        out.push('R');
        if (1..=8).contains(&f.data.len()) {
            let _ = write!(out, "{:X}", f.data.len());
        }
        return;
    }
    for b in &f.data {
        let _ = write!(out, "{b:02X}");
    }
}

/// One line of a log: the interface and the frame; `Ok(None)` for an empty line or a comment.
pub fn parse_line(line: &str) -> Result<Option<(String, CanFrame)>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let mut words = line.split_whitespace();
    let (Some(time), Some(iface), Some(frame)) = (words.next(), words.next(), words.next()) else {
        return Err(format!("not `(TIME) IFACE FRAME`: {line}"));
    };
    let ts_ns = time
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .and_then(parse_time)
        .ok_or_else(|| format!("not a time `(SECONDS.MICROS)`: {time}"))?;
    let mut frame = parse_frame(frame)?;
    frame.ts_ns = ts_ns;
    Ok(Some((iface.to_string(), frame)))
}

/// `SECONDS.FRACTION` as nanoseconds.
fn parse_time(t: &str) -> Option<i64> {
    let (s, frac) = t.split_once('.').unwrap_or((t, ""));
    let secs: i64 = s.parse().ok()?;
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ns: i64 = format!("{frac:0<9}").parse().ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(ns)
}

/// candump's compact text of a frame (its time 0).
pub fn parse_frame(text: &str) -> Result<CanFrame, String> {
    let bad = |why: &str| format!("{why}: {text}");
    let (id_text, rest) = text.split_once('#').ok_or_else(|| bad("no `#`"))?;
    let raw = u32::from_str_radix(id_text, 16).map_err(|_| bad("not a hex id"))?;
    let mut id = match id_text.len() {
        3 if raw <= 0x7FF => raw,
        8 if raw & ERR_FLAG != 0 => raw & (EFF_MASK | ERR_FLAG),
        8 => EFF_FLAG | (raw & EFF_MASK),
        _ => return Err(bad("an id is 3 hex digits (standard) or 8 (extended)")),
    };
    let mut flags = 0;
    let hex = if let Some(fd) = rest.strip_prefix('#') {
        let mut chars = fd.chars();
        let nibble = chars
            .next()
            .and_then(|c| c.to_digit(16))
            .ok_or_else(|| bad("a CAN FD frame needs its flags digit after `##`"))?;
        flags = FD | if nibble & 1 != 0 { BRS } else { 0 } | if nibble & 2 != 0 { ESI } else { 0 };
        chars.as_str()
    } else if let Some(len) = rest.strip_prefix(['R', 'r']) {
        id |= RTR_FLAG;
        let n = if len.is_empty() {
            0
        } else {
            len.parse::<usize>()
                .ok()
                .filter(|n| *n <= 8)
                .ok_or_else(|| bad("a remote request's length is 0 to 8"))?
        };
        return Ok(CanFrame {
            ts_ns: 0,
            id,
            flags,
            data: vec![0; n],
        });
    } else {
        rest
    };
    let hex: String = hex.chars().filter(|c| *c != '.').collect();
    if hex.len() % 2 != 0 {
        return Err(bad("odd number of hex digits"));
    }
    let data = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| bad("data is not hex"))?;
    let max = if flags & FD != 0 { 64 } else { 8 };
    if data.len() > max {
        return Err(bad("too much data for the frame"));
    }
    Ok(CanFrame {
        ts_ns: 0,
        id,
        flags,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(f: &CanFrame) -> String {
        let mut s = String::new();
        write_line(f, "vcan0", &mut s);
        s
    }

    #[test]
    fn frames_are_written_as_candump_writes_them() {
        let f = |id, flags, data: &[u8]| CanFrame {
            ts_ns: 1_700_000_000_123_456_789,
            id,
            flags,
            data: data.to_vec(),
        };
        assert_eq!(
            line(&f(0x123, 0, b"\xde\xad\xbe\xef")),
            "(1700000000.123456) vcan0 123#DEADBEEF\n"
        );
        assert_eq!(line(&f(0x7, 0, b"")), "(1700000000.123456) vcan0 007#\n");
        assert_eq!(
            line(&f(EFF_FLAG | 0x18DA_F110, 0, b"\x01")),
            "(1700000000.123456) vcan0 18DAF110#01\n"
        );
        assert_eq!(
            line(&f(0x123 | RTR_FLAG, 0, &[0; 3])),
            "(1700000000.123456) vcan0 123#R3\n"
        );
        assert_eq!(
            line(&f(0x456, FD | BRS, &[0x11; 12])),
            "(1700000000.123456) vcan0 456##1111111111111111111111111\n"
        );
        assert_eq!(
            line(&f(ERR_FLAG | 0x4, 0, &[0, 4, 0, 0, 0, 0, 0, 0])),
            "(1700000000.123456) vcan0 20000004#0004000000000000\n"
        );
        // Before 1970 the seconds go negative and the micros stay positive, as timeval's.
        let mut early = f(0x1, 0, b"");
        early.ts_ns = -1;
        assert!(line(&early).starts_with("(-000000001.999999)"));
    }

    #[test]
    fn lines_read_back_to_the_same_frames() {
        let frames = [
            CanFrame {
                ts_ns: 1_700_000_000_123_456_000,
                id: 0x123,
                flags: 0,
                data: vec![1, 2, 3],
            },
            CanFrame {
                ts_ns: 5_000,
                id: EFF_FLAG | 0x1ABC_DEF0,
                flags: FD | ESI,
                data: (0..64).collect(),
            },
            CanFrame {
                ts_ns: 7_000,
                id: 0x7FF | RTR_FLAG,
                flags: 0,
                data: vec![0; 8],
            },
            CanFrame {
                ts_ns: 8_000,
                id: ERR_FLAG | 0x40,
                flags: 0,
                data: vec![0; 8],
            },
        ];
        for f in frames {
            let (iface, back) = parse_line(&line(&f)).unwrap().unwrap();
            assert_eq!(iface, "vcan0");
            assert_eq!(back, f);
        }
        assert_eq!(parse_line("  ").unwrap(), None);
        assert!(parse_line("(1.0) can0 1234#00").is_err());
        assert!(parse_line("(1.0) can0 123#0").is_err());
        assert!(parse_line("(x) can0 123#00").is_err());
        assert!(parse_line("(1.5) can0 123#001122334455667788").is_err());
        assert_eq!(
            parse_line("(1.5) can0 123#").unwrap().unwrap().1.ts_ns,
            1_500_000_000
        );
    }
}
