//! CAN buses on the rig's side of the record: DBC decoding ([`dbc`]: a signal database ready to
//! turn a frame into named physical values), can-utils' log format ([`candump`]: what `rigd
//! replay --out` writes for `canplayer`), and `rigd can decode` ([`decode_log`]: a candump log
//! through a DBC, one JSON line per decoded frame). The raw frames stay what is spooled and
//! published; decoded values are for what needs numbers (plots, the status page). The record
//! format itself is `rigd_drivers::can_record`'s.

pub mod candump;
pub mod dbc;

pub use dbc::{Dbc, DbcError, Decoded, Value};

use rigd_drivers::can_record::CanFrame;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Signals the status page shows of a CAN source with a DBC; frames of one without.
pub const STATUS_LINES: usize = 8;

/// The status page's lines of a CAN source from its last records (oldest first): with a DBC the
/// latest value of its first [`STATUS_LINES`] signals seen, in the DBC's order (`Powertrain.Gear =
/// 3 (D)`, `VehicleSpeed.Speed = 46.6 km/h`); without, the last frames as candump writes them.
/// Pure.
pub fn status_lines(dbc: Option<&Dbc>, records: &[bytes::Bytes]) -> Vec<String> {
    let frames = records
        .iter()
        .filter_map(|r| rigd_drivers::can_record::decode(r).ok())
        .flatten();
    let Some(dbc) = dbc else {
        let mut last: Vec<CanFrame> = frames.collect();
        let keep = last.len().saturating_sub(STATUS_LINES);
        return last
            .drain(keep..)
            .map(|f| {
                let mut s = String::new();
                candump::write_frame(&f, &mut s);
                s
            })
            .collect();
    };
    // (message index, signal index) -> (value, unit, label)
    let mut latest: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for f in frames {
        let Some((mi, message)) = dbc.message_index(f.id) else {
            continue;
        };
        let Some(d) = dbc.decode(f.id, &f.data) else {
            continue;
        };
        for v in &d.signals {
            let mut text = format!("{}.{} = {}", message.name, v.name, round(v.value));
            if !v.unit.is_empty() {
                text.push(' ');
                text.push_str(v.unit);
            }
            if let Some(l) = v.label {
                text.push_str(&format!(" ({l})"));
            }
            latest.insert((mi, v.index), text);
        }
    }
    latest.into_values().take(STATUS_LINES).collect()
}

/// A value for a person: at most 6 significant decimals, no float noise (`46.6`, not
/// `46.600000000000001`).
fn round(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// The DBC at `path`, loaded once per process (the status page asks every second; the config,
/// which names it, does not change while the daemon runs). `None` for one that does not load
/// (the config's check said so at start).
pub fn cached_dbc(path: &Path) -> Option<Arc<Dbc>> {
    static LOADED: OnceLock<Mutex<BTreeMap<PathBuf, Option<Arc<Dbc>>>>> = OnceLock::new();
    let mut loaded = LOADED.get_or_init(Default::default).lock().ok()?;
    loaded
        .entry(path.to_path_buf())
        .or_insert_with(|| Dbc::load(path).ok().map(Arc::new))
        .clone()
}

/// One line of `rigd can decode`'s output.
#[derive(Debug, Serialize)]
pub struct DecodedLine<'a> {
    /// The input line (1-based).
    pub line: u64,
    pub ts_ns: i64,
    pub iface: &'a str,
    /// The identifier without flags.
    pub id: u32,
    pub extended: bool,
    pub message: &'a str,
    /// Signal -> physical value (NaN, from a float signal, is `null`).
    pub signals: BTreeMap<&'a str, f64>,
    /// Signal -> its value table's description of the raw value, where it has one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<&'a str, &'a str>,
}

/// What [`decode_log`] read.
#[derive(Debug, Default, Clone, Serialize)]
pub struct DecodeCounts {
    pub frames: u64,
    pub decoded: u64,
    /// Frames whose id the DBC does not know (remote and error frames too).
    pub unknown: u64,
    /// Lines that are not a frame (said on stderr with their number).
    pub bad_lines: u64,
}

/// The line of a decoded frame.
pub fn decoded_line<'a>(
    line: u64,
    iface: &'a str,
    frame: &CanFrame,
    d: &'a Decoded<'a>,
) -> DecodedLine<'a> {
    DecodedLine {
        line,
        ts_ns: frame.ts_ns,
        iface,
        id: frame.raw_id(),
        extended: frame.is_extended(),
        message: d.message,
        signals: d.signals.iter().map(|v| (v.name, v.value)).collect(),
        labels: d
            .signals
            .iter()
            .filter_map(|v| v.label.map(|l| (v.name, l)))
            .collect(),
    }
}

/// `rigd can decode`: each frame of a candump log (`input`) through `dbc`, one JSON object per
/// decoded frame on `out`; lines that are not frames are said on `err` and counted.
pub fn decode_log(
    dbc: &Dbc,
    input: impl BufRead,
    mut out: impl Write,
    mut err: impl Write,
) -> std::io::Result<DecodeCounts> {
    let mut counts = DecodeCounts::default();
    let mut buf = Vec::new();
    for (n, text) in input.lines().enumerate() {
        let text = text?;
        let n = n as u64 + 1;
        let (iface, frame) = match candump::parse_line(&text) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(why) => {
                counts.bad_lines += 1;
                writeln!(err, "line {n}: {why}")?;
                continue;
            }
        };
        counts.frames += 1;
        let Some(d) = dbc.decode(frame.id, &frame.data) else {
            counts.unknown += 1;
            continue;
        };
        counts.decoded += 1;
        buf.clear();
        serde_json::to_writer(&mut buf, &decoded_line(n, &iface, &frame, &d))?;
        buf.push(b'\n');
        out.write_all(&buf)?;
    }
    out.flush()?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigd_drivers::can_record::encode;

    #[test]
    fn the_status_page_shows_the_latest_value_of_each_signal_or_the_last_frames() {
        let dbc = Dbc::parse(
            r#"VERSION ""
BS_:
BU_: A
BO_ 256 VehicleSpeed: 8 A
 SG_ Speed : 0|16@1+ (0.01,0) [0|655.35] "km/h" A
BO_ 512 Powertrain: 8 A
 SG_ Gear : 0|4@1+ (1,0) [0|15] "" A
VAL_ 512 Gear 3 "D" ;
"#,
            "t.dbc",
        )
        .unwrap();
        let frame = |id, data: &[u8]| CanFrame {
            ts_ns: 1,
            id,
            flags: 0,
            data: data.to_vec(),
        };
        let mut a = Vec::new();
        encode(&[frame(0x200, &[3]), frame(0x100, &[0x34, 0x12])], &mut a);
        let mut b = Vec::new();
        encode(&[frame(0x100, &[0x10, 0x27]), frame(0x7ff, &[1])], &mut b);
        let records = [bytes::Bytes::from(a), bytes::Bytes::from(b)];
        assert_eq!(
            status_lines(Some(&dbc), &records),
            ["VehicleSpeed.Speed = 100 km/h", "Powertrain.Gear = 3 (D)"]
        );
        assert_eq!(
            status_lines(None, &records),
            ["200#03", "100#3412", "100#1027", "7FF#01"]
        );
        assert_eq!(round(0.1 + 0.2), "0.3");
        assert_eq!(round(-0.0001), "-0.0001");
        assert_eq!(round(-0.0000001), "0");
    }
}
