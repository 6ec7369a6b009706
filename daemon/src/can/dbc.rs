//! A DBC file (a CAN bus's signal database) made ready to decode frames: messages by the frame's
//! id (standard or extended), their signals with start bit, length, byte order, sign, IEEE float
//! types (`SIG_VALTYPE_`), factor and offset, range and unit, multiplexing (a switch `M` and the
//! signals `mN` valid for its value, and `SG_MUL_VAL_`'s extended multiplexing), and value tables
//! (`VAL_`) kept for display. Parsing is the `can-dbc` crate's; what a decoder needs is checked
//! here once, at load, so that [`Dbc::decode`] cannot fail part way. Pure but for [`Dbc::load`]'s
//! read of the file.
//!
//! Bit numbering, as Vector's CANdb++ and `cantools` read it: a little-endian (Intel, `@1`)
//! signal's start bit is its least significant bit, counted from bit 0 of byte 0 upwards through
//! the bytes (bit `b` is bit `b % 8` of byte `b / 8`); a big-endian (Motorola, `@0`) signal's start
//! bit is its *most* significant bit, numbered the same way, and the signal runs from there towards
//! the less significant bits of the same byte, then on into the next byte's most significant bit
//! (the "sawtooth"). The classic bug is to count a Motorola signal from its LSB or to walk it
//! backwards through the bytes; [`motorola_msb_index`] turns its start bit into a position in the
//! payload read as one big-endian bit string, where the signal is `length` bits in a row.

use std::collections::HashMap;
use std::path::Path;

use can_dbc::{ByteOrder, MessageId, MultiplexIndicator, SignalExtendedValueType, ValueType};

/// Linux's `can_id` flags (`linux/can.h`).
pub const CAN_EFF_FLAG: u32 = 0x8000_0000;
pub const CAN_RTR_FLAG: u32 = 0x4000_0000;
pub const CAN_ERR_FLAG: u32 = 0x2000_0000;
pub const CAN_SFF_MASK: u32 = 0x0000_07ff;
pub const CAN_EFF_MASK: u32 = 0x1fff_ffff;

/// Why a DBC file cannot be used; the text names the file and, where the parser or the check
/// knows it, the line.
#[derive(Debug, thiserror::Error)]
pub enum DbcError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not UTF-8 and not Windows-1252 text")]
    Encoding { path: String },
    #[error("{path}{}: {what}", .line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Invalid {
        path: String,
        line: Option<usize>,
        what: String,
    },
}

/// How a signal's bits are read as a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unsigned,
    Signed,
    Float32,
    Float64,
}

/// When a signal is in a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mux {
    /// Always.
    Plain,
    /// While the signal at index `switch` (of the same message) is in the frame and its raw
    /// value is in one of `ranges` (inclusive).
    Muxed {
        switch: usize,
        ranges: Vec<(u64, u64)>,
    },
}

/// One signal of a message, as the decoder reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    pub name: String,
    /// As the DBC says it: the LSB (little endian) or the MSB (big endian), sawtooth numbering.
    pub start_bit: u32,
    pub length: u32,
    pub little_endian: bool,
    pub kind: Kind,
    pub factor: f64,
    pub offset: f64,
    pub min: f64,
    pub max: f64,
    pub unit: String,
    /// This signal is a multiplexor switch (`M`, or `mNM`).
    pub is_switch: bool,
    pub mux: Mux,
    /// `VAL_`: raw value -> description, for display.
    pub values: Vec<(i64, String)>,
}

/// One message of the DBC.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The frame id as Linux has it: 11 bits, or 29 bits with [`CAN_EFF_FLAG`].
    pub can_id: u32,
    pub name: String,
    /// Bytes (8 for classic CAN, up to 64 for CAN FD).
    pub size: u32,
    pub signals: Vec<Signal>,
}

/// A DBC file ready to decode frames.
#[derive(Debug, Clone, Default)]
pub struct Dbc {
    /// Index into `messages` by [`lookup_key`] of the frame id.
    by_id: HashMap<u32, usize>,
    messages: Vec<Message>,
}

/// One decoded signal of a frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Value<'a> {
    /// The signal's index in its [`Message::signals`].
    pub index: usize,
    pub name: &'a str,
    /// The physical value: `raw * factor + offset`.
    pub value: f64,
    pub unit: &'a str,
    /// The value table's description of the raw value, when it has one.
    pub label: Option<&'a str>,
}

/// What one frame says, by its message in the DBC.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded<'a> {
    pub message: &'a str,
    /// The signals in the frame, in the DBC's order (a multiplexed signal only while its switch
    /// selects it).
    pub signals: Vec<Value<'a>>,
}

/// The key a frame id and a DBC message id meet on: standard ids as they are, extended ones with
/// [`CAN_EFF_FLAG`] (so 0x123 standard and 0x123 extended are two messages).
pub fn lookup_key(can_id: u32) -> u32 {
    if can_id & CAN_EFF_FLAG != 0 {
        CAN_EFF_FLAG | (can_id & CAN_EFF_MASK)
    } else {
        can_id & CAN_SFF_MASK
    }
}

/// A Motorola (big-endian) signal's start bit (its MSB, sawtooth numbering) as its index in the
/// payload read as one big-endian bit string (index 0 = the MSB of byte 0). Pure.
pub fn motorola_msb_index(start_bit: u32) -> u32 {
    8 * (start_bit / 8) + (7 - start_bit % 8)
}

fn mask(length: u32) -> u128 {
    (1u128 << length) - 1
}

/// The raw bits of a signal in `data`; `None` when the frame is too short to hold them. Pure.
pub fn raw_bits(data: &[u8], start_bit: u32, length: u32, little_endian: bool) -> Option<u64> {
    let (first, end) = if little_endian {
        (start_bit, start_bit + length)
    } else {
        let msb = motorola_msb_index(start_bit);
        (msb, msb + length)
    };
    if length == 0 || length > 64 || end as usize > data.len() * 8 {
        return None;
    }
    let (lo, hi) = ((first / 8) as usize, ((end - 1) / 8) as usize);
    let bytes = &data[lo..=hi];
    let raw = if little_endian {
        let acc = bytes
            .iter()
            .rev()
            .fold(0u128, |acc, b| (acc << 8) | u128::from(*b));
        (acc >> (first % 8)) & mask(length)
    } else {
        let acc = bytes
            .iter()
            .fold(0u128, |acc, b| (acc << 8) | u128::from(*b));
        let tail = (bytes.len() as u32) * 8 - (end - (lo as u32) * 8);
        (acc >> tail) & mask(length)
    };
    Some(raw as u64)
}

impl Signal {
    /// The signal's raw bits in `data`, `None` when the frame does not hold them.
    pub fn raw(&self, data: &[u8]) -> Option<u64> {
        raw_bits(data, self.start_bit, self.length, self.little_endian)
    }

    /// The raw bits as a number (sign-extended, or an IEEE float), before scaling.
    pub fn number(&self, raw: u64) -> f64 {
        match self.kind {
            Kind::Unsigned => raw as f64,
            Kind::Signed if self.length < 64 && raw >> (self.length - 1) & 1 == 1 => {
                (raw as i64 - (1i64 << self.length)) as f64
            }
            Kind::Signed => raw as i64 as f64,
            Kind::Float32 => f64::from(f32::from_bits(raw as u32)),
            Kind::Float64 => f64::from_bits(raw),
        }
    }

    /// The physical value of raw bits: `number * factor + offset`.
    pub fn physical(&self, raw: u64) -> f64 {
        let n = self.number(raw);
        if self.factor == 1.0 && self.offset == 0.0 {
            n
        } else {
            n * self.factor + self.offset
        }
    }

    /// The value table's description of raw bits, if any.
    pub fn label(&self, raw: u64) -> Option<&str> {
        if self.values.is_empty() {
            return None;
        }
        let key = match self.kind {
            Kind::Signed if self.length < 64 && raw >> (self.length - 1) & 1 == 1 => {
                raw as i64 - (1i64 << self.length)
            }
            _ => raw as i64,
        };
        self.values
            .iter()
            .find(|(v, _)| *v == key)
            .map(|(_, d)| d.as_str())
    }
}

impl Dbc {
    /// Reads and checks a DBC file (UTF-8, or Windows-1252 as CANdb++ writes them).
    pub fn load(path: &Path) -> Result<Self, DbcError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| DbcError::Read {
            path: name.clone(),
            source,
        })?;
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => std::borrow::Cow::Borrowed(t),
            Err(_) => {
                can_dbc::decode_cp1252(&bytes).ok_or(DbcError::Encoding { path: name.clone() })?
            }
        };
        Self::parse(&text, &name)
    }

    /// Parses and checks DBC text; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, DbcError> {
        let invalid = |line: Option<usize>, what: String| DbcError::Invalid {
            path: path.to_string(),
            line,
            what,
        };
        let dbc = can_dbc::Dbc::try_from(text).map_err(|e| {
            let (line, what) = parse_error(&e);
            invalid(line, what)
        })?;
        let mut out = Dbc::default();
        for m in &dbc.messages {
            let at = message_line(text, m.id);
            let message = build_message(&dbc, m).map_err(|(signal, what)| {
                let line = signal
                    .and_then(|s| at.and_then(|at| signal_line(text, at, &s)))
                    .or(at);
                invalid(line, what)
            })?;
            let key = message.can_id;
            if let Some(&other) = out.by_id.get(&key) {
                return Err(invalid(
                    at,
                    format!(
                        "messages {} and {} have the same id {}",
                        out.messages[other].name,
                        message.name,
                        id_text(key)
                    ),
                ));
            }
            out.by_id.insert(key, out.messages.len());
            out.messages.push(message);
        }
        Ok(out)
    }

    /// The messages in the file's order.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The message a frame id (Linux `can_id`) carries, if the DBC knows it.
    pub fn message(&self, can_id: u32) -> Option<&Message> {
        if can_id & (CAN_RTR_FLAG | CAN_ERR_FLAG) != 0 {
            return None;
        }
        self.by_id
            .get(&lookup_key(can_id))
            .map(|i| &self.messages[*i])
    }

    /// The message a frame id carries and its index in [`Dbc::messages`].
    pub fn message_index(&self, can_id: u32) -> Option<(usize, &Message)> {
        if can_id & (CAN_RTR_FLAG | CAN_ERR_FLAG) != 0 {
            return None;
        }
        let i = *self.by_id.get(&lookup_key(can_id))?;
        Some((i, &self.messages[i]))
    }

    /// The signals of a frame (`can_id` as Linux has it, with its flags); `None` for an id the
    /// DBC does not know, a remote or error frame. Signals the frame is too short for are left
    /// out, as are multiplexed signals their switch does not select.
    pub fn decode(&self, can_id: u32, data: &[u8]) -> Option<Decoded<'_>> {
        let message = self.message(can_id)?;
        let raws: Vec<Option<u64>> = message.signals.iter().map(|s| s.raw(data)).collect();
        let present = |i: usize| selected(&message.signals, &raws, i, 0);
        let signals = message
            .signals
            .iter()
            .zip(&raws)
            .enumerate()
            .filter_map(|(i, (s, raw))| {
                let raw = (*raw)?;
                present(i).then(|| Value {
                    index: i,
                    name: &s.name,
                    value: s.physical(raw),
                    unit: &s.unit,
                    label: s.label(raw),
                })
            })
            .collect();
        Some(Decoded {
            message: &message.name,
            signals,
        })
    }
}

/// Whether signal `i` is in the frame: its bits are, and its switch (recursively) selects it.
/// `depth` bounds a cycle the load check missed.
fn selected(signals: &[Signal], raws: &[Option<u64>], i: usize, depth: usize) -> bool {
    if raws[i].is_none() || depth > signals.len() {
        return false;
    }
    match &signals[i].mux {
        Mux::Plain => true,
        Mux::Muxed { switch, ranges } => {
            let Some(v) = raws[*switch] else {
                return false;
            };
            ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&v))
                && selected(signals, raws, *switch, depth + 1)
        }
    }
}

fn id_text(can_id: u32) -> String {
    if can_id & CAN_EFF_FLAG != 0 {
        format!("0x{:08X} (extended)", can_id & CAN_EFF_MASK)
    } else {
        format!("0x{:03X}", can_id)
    }
}

/// The line and the words of a parser error.
fn parse_error(e: &can_dbc::DbcError) -> (Option<usize>, String) {
    match e {
        can_dbc::DbcError::Pest(p) => {
            // pest says ` --> LINE:COL` and then shows the line; its variant the expectation.
            let shown = p.to_string();
            let line = shown
                .lines()
                .find_map(|l| l.trim_start().strip_prefix("--> "))
                .and_then(|lc| lc.split(':').next())
                .and_then(|l| l.trim().parse().ok());
            let what = p.variant.message().to_string();
            (
                line,
                format!("does not parse as DBC ({what}): {}", p.line().trim()),
            )
        }
        other => (None, format!("does not parse as DBC: {other}")),
    }
}

/// The 1-based line of `BO_ {id}` in the text.
fn message_line(text: &str, id: MessageId) -> Option<usize> {
    let needle = format!("{} ", id.raw());
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix("BO_ ")
                .is_some_and(|r| r.trim_start().starts_with(&needle))
        })
        .map(|i| i + 1)
}

/// The 1-based line of `SG_ {name}` after the message's line `from`.
fn signal_line(text: &str, from: usize, name: &str) -> Option<usize> {
    text.lines()
        .enumerate()
        .skip(from)
        .take_while(|(_, l)| !l.trim_start().starts_with("BO_ "))
        .find(|(_, l)| {
            l.trim_start()
                .strip_prefix("SG_ ")
                .and_then(|r| r.split_whitespace().next())
                == Some(name)
        })
        .map(|(i, _)| i + 1)
}

/// A message's problem that one of its signals has (its line is that signal's).
fn named(signal: String, what: String) -> (Option<String>, String) {
    (Some(signal), what)
}

fn numeric(v: &can_dbc::NumericValue) -> f64 {
    match v {
        can_dbc::NumericValue::Uint(u) => *u as f64,
        can_dbc::NumericValue::Int(i) => *i as f64,
        can_dbc::NumericValue::Double(d) => *d,
    }
}

/// A message of the parsed file as the decoder needs it, checked: every signal fits the message,
/// has 1 to 64 bits (32 or 64 for floats), and a multiplexed one has its switch. The error names
/// the signal (for its line) and says what is wrong.
fn build_message(
    dbc: &can_dbc::Dbc,
    m: &can_dbc::Message,
) -> Result<Message, (Option<String>, String)> {
    let can_id = match m.id {
        MessageId::Standard(id) if u32::from(id) <= CAN_SFF_MASK => u32::from(id),
        MessageId::Extended(id) => CAN_EFF_FLAG | (id & CAN_EFF_MASK),
        MessageId::Standard(id) => {
            return Err((
                None,
                format!(
                    "message {}: id {id} is more than 11 bits and not marked extended (bit 31)",
                    m.name
                ),
            ))
        }
    };
    let mut signals = Vec::with_capacity(m.signals.len());
    let bits = m.size as u32 * 8;
    let mut problem: Option<(String, String)> = None;
    for s in &m.signals {
        let kind = match dbc.extended_value_type_for_signal(m.id, &s.name) {
            Some(SignalExtendedValueType::IEEEfloat32Bit) => Kind::Float32,
            Some(SignalExtendedValueType::IEEEdouble64bit) => Kind::Float64,
            _ if s.value_type == ValueType::Signed => Kind::Signed,
            _ => Kind::Unsigned,
        };
        let little_endian = s.byte_order == ByteOrder::LittleEndian;
        let (start, length) = (s.start_bit as u32, s.size as u32);
        let end = if little_endian {
            start as u64 + length as u64
        } else {
            motorola_msb_index(start) as u64 + length as u64
        };
        let wrong = if length == 0 || length > 64 {
            Some(format!("{length} bits (1 to 64)"))
        } else if (kind == Kind::Float32 && length != 32) || (kind == Kind::Float64 && length != 64)
        {
            Some(format!("a float of {length} bits (32 or 64)"))
        } else if end > bits as u64 {
            Some(format!(
                "{}|{}@{} does not fit the message's {} bytes",
                s.start_bit,
                s.size,
                if little_endian { 1 } else { 0 },
                m.size
            ))
        } else {
            None
        };
        if let Some(w) = wrong {
            problem.get_or_insert((s.name.clone(), w));
        }
        signals.push(Signal {
            name: s.name.clone(),
            start_bit: start,
            length,
            little_endian,
            kind,
            factor: s.factor,
            offset: s.offset,
            min: numeric(&s.min),
            max: numeric(&s.max),
            unit: s.unit.clone(),
            is_switch: matches!(
                s.multiplexer_indicator,
                MultiplexIndicator::Multiplexor
                    | MultiplexIndicator::MultiplexorAndMultiplexedSignal(_)
            ),
            mux: Mux::Plain,
            values: dbc
                .value_descriptions_for_signal(m.id, &s.name)
                .map(|v| v.iter().map(|d| (d.id, d.description.clone())).collect())
                .unwrap_or_default(),
        });
    }
    if let Some((signal, what)) = problem {
        let what = format!("message {}: signal {signal}: {what}", m.name);
        return Err(named(signal, what));
    }
    // Multiplexing: SG_MUL_VAL_ where the file has it for the signal, else the message's one
    // switch `M` and the signal's `mN`.
    let index = |name: &str| signals.iter().position(|s| s.name == name);
    let switches: Vec<usize> = m
        .signals
        .iter()
        .enumerate()
        .filter(|(_, s)| s.multiplexer_indicator == MultiplexIndicator::Multiplexor)
        .map(|(i, _)| i)
        .collect();
    let mut muxes = Vec::with_capacity(signals.len());
    for s in &m.signals {
        let value = match s.multiplexer_indicator {
            MultiplexIndicator::MultiplexedSignal(v)
            | MultiplexIndicator::MultiplexorAndMultiplexedSignal(v) => v,
            _ => {
                muxes.push(Mux::Plain);
                continue;
            }
        };
        let extended: Vec<&can_dbc::ExtendedMultiplex> = dbc
            .extended_multiplex
            .iter()
            .filter(|x| x.message_id == m.id && x.signal_name == s.name)
            .collect();
        let mux = match extended.as_slice() {
            [] => match switches.as_slice() {
                [one] => Mux::Muxed {
                    switch: *one,
                    ranges: vec![(value, value)],
                },
                [] => {
                    return Err(named(
                        s.name.clone(),
                        format!(
                            "message {}: signal {} is multiplexed (m{value}) but the message has no switch (M)",
                            m.name, s.name
                        ),
                    ))
                }
                _ => {
                    return Err(named(
                        s.name.clone(),
                        format!(
                            "message {}: signal {}: the message has several switches (M) and no SG_MUL_VAL_ says which one selects it",
                            m.name, s.name
                        ),
                    ))
                }
            },
            [x, ..] => {
                let Some(switch) = index(&x.multiplexor_signal_name) else {
                    return Err(named(
                        s.name.clone(),
                        format!(
                            "message {}: SG_MUL_VAL_ of {} names switch {}, not a signal of the message",
                            m.name, s.name, x.multiplexor_signal_name
                        ),
                    ));
                };
                Mux::Muxed {
                    switch,
                    ranges: extended
                        .iter()
                        .flat_map(|x| x.mappings.iter())
                        .map(|r| (r.min_value, r.max_value))
                        .collect(),
                }
            }
        };
        muxes.push(mux);
    }
    for (s, mux) in signals.iter_mut().zip(muxes) {
        s.mux = mux;
    }
    // A switch that selects itself, through others or not, would never be in a frame.
    for start in 0..signals.len() {
        let mut at = start;
        for _ in 0..=signals.len() {
            match &signals[at].mux {
                Mux::Plain => break,
                Mux::Muxed { switch, .. } if *switch == start => {
                    return Err(named(
                        signals[start].name.clone(),
                        format!(
                            "message {}: signal {} is multiplexed by itself",
                            m.name, signals[start].name
                        ),
                    ))
                }
                Mux::Muxed { switch, .. } => at = *switch,
            }
        }
    }
    Ok(Message {
        can_id,
        name: m.name.clone(),
        size: m.size as u32,
        signals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VEHICLE: &str = r#"VERSION ""

NS_ :

BS_:

BU_: ECU

BO_ 256 VehicleSpeed: 8 ECU
 SG_ Speed : 0|16@1+ (0.01,0) [0|655.35] "km/h" Vector__XXX
 SG_ Accel : 16|12@1- (0.001,-0.5) [-2.548|1.547] "m/s2" Vector__XXX

BO_ 257 Steering: 8 ECU
 SG_ Angle : 7|16@0- (0.1,0) [-3276.8|3276.7] "deg" Vector__XXX
 SG_ Rate : 19|12@0+ (1,0) [0|4095] "deg/s" Vector__XXX

BO_ 2566844688 BrakeExt: 8 ECU
 SG_ Pressure : 0|32@1+ (1,0) [0|0] "bar" Vector__XXX

BO_ 512 Muxed: 8 ECU
 SG_ Page M : 0|8@1+ (1,0) [0|255] "" Vector__XXX
 SG_ Gear m1 : 8|4@1+ (1,0) [0|15] "" Vector__XXX
 SG_ Temp m2 : 8|8@1- (1,-40) [-168|87] "degC" Vector__XXX

VAL_ 512 Gear 0 "Park" 1 "Reverse" 2 "Neutral" 3 "Drive" ;
SIG_VALTYPE_ 2566844688 Pressure : 1;
"#;

    fn dbc() -> Dbc {
        Dbc::parse(VEHICLE, "vehicle.dbc").unwrap()
    }

    fn values(d: &Decoded<'_>) -> Vec<(String, f64)> {
        d.signals
            .iter()
            .map(|v| (v.name.to_string(), v.value))
            .collect()
    }

    #[test]
    fn intel_bits_count_up_from_the_lsb_of_byte_0() {
        let data = [0x34, 0x12, 0xff, 0x0f, 0, 0, 0, 0];
        assert_eq!(raw_bits(&data, 0, 16, true), Some(0x1234));
        assert_eq!(raw_bits(&data, 4, 8, true), Some(0x23));
        assert_eq!(raw_bits(&data, 16, 12, true), Some(0xfff));
        assert_eq!(raw_bits(&data, 60, 8, true), None, "past the frame");
        let d = dbc();
        let v = d.decode(0x100, &data).unwrap();
        assert_eq!(v.message, "VehicleSpeed");
        // 0x1234 * 0.01; 0xfff is -1 in 12 bits: -1 * 0.001 - 0.5.
        assert_eq!(
            values(&v),
            [("Speed".into(), 46.6), ("Accel".into(), -0.501)]
        );
        assert_eq!(v.signals[0].unit, "km/h");
    }

    /// Motorola's start bit is its MSB in the sawtooth numbering: `7|16@0` is bytes 0 and 1 read
    /// big-endian, `19|12@0` starts at bit 3 of byte 2 and ends in byte 3's high nibble.
    #[test]
    fn motorola_bits_start_at_the_msb_and_run_on_into_the_next_byte() {
        assert_eq!(motorola_msb_index(7), 0);
        assert_eq!(motorola_msb_index(0), 7);
        assert_eq!(motorola_msb_index(19), 20);
        let data = [0xfe, 0x0c, 0x0a, 0xbc, 0, 0, 0, 0];
        assert_eq!(raw_bits(&data, 7, 16, false), Some(0xfe0c));
        // Byte 2 = 0000_1010: bits 3..0 are 1010; byte 3 = 1011_1100: its high byte 1011_1100.
        assert_eq!(raw_bits(&data, 19, 12, false), Some(0b1010_1011_1100));
        assert_eq!(raw_bits(&data, 3, 12, false), Some(0xe0c));
        assert_eq!(raw_bits(&data, 63, 8, false), Some(0));
        assert_eq!(raw_bits(&data, 56, 8, false), None, "past the frame");
        let d = dbc();
        let v = d.decode(0x101, &data).unwrap();
        // 0xfe0c is -500 as i16: -50.0 deg.
        assert_eq!(
            values(&v),
            [("Angle".into(), -50.0), ("Rate".into(), 2748.0)]
        );
    }

    #[test]
    fn extended_ids_float_signals_and_flags() {
        let d = dbc();
        let data = 2.5f32.to_le_bytes();
        let mut frame = [0u8; 8];
        frame[..4].copy_from_slice(&data);
        // The DBC's 2566844688 is 0x18FEF110 with bit 31: an extended id.
        let v = d.decode(CAN_EFF_FLAG | 0x18FE_F110, &frame).unwrap();
        assert_eq!(values(&v), [("Pressure".into(), 2.5)]);
        assert!(d.decode(0x18FE_F110 & 0x7ff, &frame).is_none());
        assert!(d.decode(0x100 | CAN_RTR_FLAG, &frame).is_none());
        assert!(d.decode(0x100 | CAN_ERR_FLAG, &frame).is_none());
        assert!(d.decode(0x7ff, &frame).is_none());
        assert!(d.decode(CAN_EFF_FLAG | 0x100, &frame).is_none());
    }

    #[test]
    fn a_switch_selects_its_signals_and_tables_label_values() {
        let d = dbc();
        let gear = d.decode(0x200, &[1, 3, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(values(&gear), [("Page".into(), 1.0), ("Gear".into(), 3.0)]);
        assert_eq!(gear.signals[1].label, Some("Drive"));
        let temp = d.decode(0x200, &[2, 0xf6, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(
            values(&temp),
            [("Page".into(), 2.0), ("Temp".into(), -50.0)]
        );
        let neither = d.decode(0x200, &[9, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(values(&neither), [("Page".into(), 9.0)]);
        // A short frame: what it holds.
        let short = d.decode(0x200, &[1]).unwrap();
        assert_eq!(values(&short), [("Page".into(), 1.0)]);
    }

    #[test]
    fn extended_multiplexing_follows_sg_mul_val() {
        let text = r#"VERSION ""
BS_:
BU_: A
BO_ 300 Ext: 8 A
 SG_ A M : 0|4@1+ (1,0) [0|0] "" A
 SG_ B m1M : 4|4@1+ (1,0) [0|0] "" A
 SG_ C m2 : 8|8@1+ (1,0) [0|0] "" A
SG_MUL_VAL_ 300 B A 1-1;
SG_MUL_VAL_ 300 C B 2-3, 5-5;
"#;
        let d = Dbc::parse(text, "x.dbc").unwrap();
        let names = |data: &[u8]| -> Vec<String> {
            let dec = d.decode(300, data).unwrap();
            dec.signals.iter().map(|v| v.name.to_string()).collect()
        };
        assert_eq!(names(&[0x31, 7]), ["A", "B", "C"]);
        assert_eq!(names(&[0x51, 7]), ["A", "B", "C"]);
        assert_eq!(names(&[0x41, 7]), ["A", "B"]);
        assert_eq!(names(&[0x32, 7]), ["A"], "B not selected, so neither is C");
    }

    #[test]
    fn errors_name_the_file_and_the_line() {
        let e = Dbc::parse(
            "VERSION \"\"\nBS_:\nBU_: A\nBO_ 1 M: 8 A\n SG_ S : x|8@1+ (1,0) [0|0] \"\" A\n",
            "v.dbc",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("v.dbc line 5: does not parse"), "{e}");
        let e = Dbc::parse(
            "VERSION \"\"\nBS_:\nBU_: A\nBO_ 1 M: 2 A\n SG_ Ok : 0|8@1+ (1,0) [0|0] \"\" A\n SG_ S : 12|8@1+ (1,0) [0|0] \"\" A\n",
            "v.dbc",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "v.dbc line 6: message M: signal S: 12|8@1 does not fit the message's 2 bytes"
        );
        // Motorola 0|8 runs from bit 0 of byte 0 into byte 1: a 1-byte message cannot hold it.
        let e = Dbc::parse(
            "VERSION \"\"\nBS_:\nBU_: A\nBO_ 1 M: 1 A\n SG_ S : 0|8@0+ (1,0) [0|0] \"\" A\n",
            "v.dbc",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 5") && e.contains("does not fit"), "{e}");
        let e = Dbc::parse(
            "VERSION \"\"\nBS_:\nBU_: A\nBO_ 1 M: 8 A\n SG_ S m1 : 0|8@1+ (1,0) [0|0] \"\" A\n",
            "v.dbc",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 5") && e.contains("no switch"), "{e}");
        let e = Dbc::load(Path::new("/nonexistent/v.dbc"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/nonexistent/v.dbc: "), "{e}");
    }
}
