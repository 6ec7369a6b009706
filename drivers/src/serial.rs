//! Serial sensors (`serialport`): a byte stream cut into records by a [`Framer`] (`line`, `nmea`
//! or `raw`), each record stamped at its first byte.
//!
//! The framer is pure (no I/O) and bounded: it never holds more than `max-record-bytes` plus a
//! delimiter, whatever arrives. What it cannot turn into a record (a bad NMEA checksum, garbage
//! between sentences, an overlong line, a partial record when the device goes away) is dropped and
//! counted in the source's `drops`.
//!
//! Timing: a read returns the bytes that arrived since the previous read; the last byte is stamped
//! at the read's return and earlier bytes are back-dated by their time on the wire (start, data,
//! parity and stop bits at the configured baud), never before the previous read returned or timed
//! out empty.

use serde::Deserialize;

use crate::Stamp;

/// How a byte stream is cut into records (`framing` key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framing {
    /// One record per line, without its delimiter (and without a `\r` before a `\n` delimiter);
    /// empty lines are skipped.
    #[default]
    Line,
    /// NMEA 0183 sentences (`$...*HH` or `!...*HH`, CRLF or LF ended), checksum verified; the
    /// record is the sentence without its line end.
    Nmea,
    /// The bytes received within one time bucket (or `max-record-bytes` of them) as one record.
    Raw,
}

/// Parity bit (`parity` key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Parity {
    #[default]
    None,
    Odd,
    Even,
}

/// Flow control (`flow-control` key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowControl {
    #[default]
    None,
    /// XON/XOFF.
    Software,
    /// RTS/CTS.
    Hardware,
}

/// Everything the serial driver needs to open and frame a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialSettings {
    /// Device path, e.g. `/dev/ttyUSB0` or a udev symlink.
    pub device: String,
    pub baud: u32,
    pub parity: Parity,
    pub flow_control: FlowControl,
    /// 5 to 8.
    pub data_bits: u8,
    /// 1 or 2.
    pub stop_bits: u8,
    pub framing: Framing,
    /// Line delimiter (`line` framing), at least one byte.
    pub delimiter: Vec<u8>,
    /// Longest record; longer lines and sentences are dropped, raw records are cut.
    pub max_record_bytes: usize,
    /// Time-bucket width (`raw` framing groups bytes per bucket).
    pub bucket_ms: u32,
}

impl SerialSettings {
    /// Nanoseconds one character takes on the wire: start bit, data, parity, stop bits.
    pub fn byte_ns(&self) -> i64 {
        let bits = 1
            + self.data_bits as i64
            + i64::from(self.parity != Parity::None)
            + self.stop_bits as i64;
        bits * 1_000_000_000 / self.baud.max(1) as i64
    }
}

/// One record cut from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Time of the record's first byte.
    pub stamp: Stamp,
    pub bytes: Vec<u8>,
    /// Printable text (NMEA, or a line that is UTF-8 without control characters other than tab).
    pub text: bool,
}

/// When the bytes of one read arrived: the last at `end`, each earlier one `byte_ns` before the
/// next, none before `floor_ns`.
#[derive(Debug, Clone, Copy)]
pub struct ReadTiming {
    pub end: Stamp,
    pub floor_ns: i64,
    pub byte_ns: i64,
}

impl ReadTiming {
    /// Arrival time of byte `i` of a read of `n` bytes.
    fn at(&self, i: usize, n: usize) -> Stamp {
        let back = (n - 1 - i) as i64 * self.byte_ns;
        Stamp {
            ns: (self.end.ns - back).max(self.floor_ns.min(self.end.ns)),
            state: self.end.state,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Between records (NMEA: waiting for `$`/`!`).
    Idle,
    /// Collecting a record into `buf`.
    Record,
    /// Discarding up to the next record boundary; `counted` once the discarded run is a drop.
    Skip { counted: bool },
}

/// Cuts a byte stream into [`Record`]s; pure and bounded.
#[derive(Debug)]
pub struct Framer {
    framing: Framing,
    delimiter: Vec<u8>,
    max: usize,
    bucket_ns: i64,
    buf: Vec<u8>,
    first: Option<Stamp>,
    scan: Scan,
}

impl Framer {
    pub fn new(
        framing: Framing,
        delimiter: &[u8],
        max_record_bytes: usize,
        bucket_ms: u32,
    ) -> Self {
        let delimiter = if delimiter.is_empty() {
            b"\n".to_vec()
        } else {
            delimiter.to_vec()
        };
        let max = max_record_bytes.max(1);
        Self {
            framing,
            buf: Vec::with_capacity((max + delimiter.len()).min(64 * 1024)),
            delimiter,
            max,
            bucket_ns: bucket_ms.max(1) as i64 * 1_000_000,
            first: None,
            scan: if framing == Framing::Nmea {
                Scan::Idle
            } else {
                Scan::Record
            },
        }
    }

    pub fn from_settings(s: &SerialSettings) -> Self {
        Self::new(s.framing, &s.delimiter, s.max_record_bytes, s.bucket_ms)
    }

    /// Bytes held for an incomplete record (bounded by `max-record-bytes` plus a delimiter).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Feeds the bytes of one read; complete records go to `out`. Returns the drops.
    pub fn push(&mut self, chunk: &[u8], timing: ReadTiming, out: &mut Vec<Record>) -> u64 {
        match self.framing {
            Framing::Line => self.push_line(chunk, timing, out),
            Framing::Nmea => self.push_nmea(chunk, timing, out),
            Framing::Raw => {
                self.push_raw(chunk, timing, out);
                0
            }
        }
    }

    /// Called when a read found nothing: a raw record whose bucket has ended goes out.
    pub fn tick(&mut self, now: Stamp, out: &mut Vec<Record>) {
        if self.framing == Framing::Raw {
            if let Some(first) = self.first {
                if now.ns.div_euclid(self.bucket_ns) != first.ns.div_euclid(self.bucket_ns) {
                    self.flush_raw(out);
                }
            }
        }
    }

    /// The stream ends (stop, device gone): a raw record goes out, a partial line or sentence is a
    /// drop. Returns the drops.
    pub fn finish(&mut self, out: &mut Vec<Record>) -> u64 {
        let drops = match (self.framing, self.scan) {
            (Framing::Raw, _) => {
                self.flush_raw(out);
                0
            }
            (_, Scan::Skip { counted: false }) => 1,
            (_, Scan::Record) if !self.buf.is_empty() => 1,
            _ => 0,
        };
        self.buf.clear();
        self.first = None;
        self.scan = if self.framing == Framing::Nmea {
            Scan::Idle
        } else {
            Scan::Record
        };
        drops
    }

    fn push_line(&mut self, chunk: &[u8], t: ReadTiming, out: &mut Vec<Record>) -> u64 {
        let dlen = self.delimiter.len();
        let last = self.delimiter[dlen - 1];
        let mut drops = 0;
        for (i, &b) in chunk.iter().enumerate() {
            if self.buf.is_empty() && self.scan == Scan::Record {
                self.first = Some(t.at(i, chunk.len()));
            }
            self.buf.push(b);
            let ended = b == last && self.buf.ends_with(&self.delimiter);
            match self.scan {
                Scan::Record if ended => {
                    let mut end = self.buf.len() - dlen;
                    if self.delimiter == b"\n" && end > 0 && self.buf[end - 1] == b'\r' {
                        end -= 1;
                    }
                    if end > 0 {
                        let bytes = self.buf[..end].to_vec();
                        let text = is_text(&bytes);
                        out.push(Record {
                            stamp: self.first.unwrap_or(t.end),
                            bytes,
                            text,
                        });
                    }
                    self.buf.clear();
                }
                Scan::Record if self.buf.len() >= self.max + dlen => {
                    // Longer than max-record-bytes even if the tail is a partial delimiter: drop
                    // it, keeping only what could still start the delimiter.
                    drops += 1;
                    self.scan = Scan::Skip { counted: true };
                    self.keep_tail(dlen - 1);
                }
                Scan::Skip { .. } if ended => {
                    self.buf.clear();
                    self.scan = Scan::Record;
                }
                Scan::Skip { .. } if self.buf.len() >= dlen => self.keep_tail(dlen - 1),
                _ => {}
            }
        }
        drops
    }

    fn keep_tail(&mut self, n: usize) {
        let cut = self.buf.len().saturating_sub(n);
        self.buf.drain(..cut);
    }

    fn push_nmea(&mut self, chunk: &[u8], t: ReadTiming, out: &mut Vec<Record>) -> u64 {
        let mut drops = 0;
        for (i, &b) in chunk.iter().enumerate() {
            let start = b == b'$' || b == b'!';
            let eol = b == b'\n';
            match self.scan {
                Scan::Idle | Scan::Skip { .. } if start => {
                    if self.scan == (Scan::Skip { counted: false }) {
                        drops += 1;
                    }
                    self.begin_sentence(b, t.at(i, chunk.len()));
                }
                Scan::Idle => {
                    if b != b'\r' && !eol {
                        self.scan = Scan::Skip { counted: false };
                    }
                }
                Scan::Skip { counted } => {
                    if eol {
                        drops += u64::from(!counted);
                        self.scan = Scan::Idle;
                    }
                }
                Scan::Record if start => {
                    // A new sentence before the old one ended: the old one is cut short.
                    drops += 1;
                    self.begin_sentence(b, t.at(i, chunk.len()));
                }
                Scan::Record if eol => {
                    let end = self.buf.len() - usize::from(self.buf.last() == Some(&b'\r'));
                    if end <= self.max && nmea_valid(&self.buf[..end]) {
                        out.push(Record {
                            stamp: self.first.unwrap_or(t.end),
                            bytes: self.buf[..end].to_vec(),
                            text: true,
                        });
                    } else {
                        drops += 1;
                    }
                    self.buf.clear();
                    self.scan = Scan::Idle;
                }
                Scan::Record => {
                    if self.buf.len() > self.max {
                        drops += 1;
                        self.buf.clear();
                        self.scan = Scan::Skip { counted: true };
                    } else {
                        self.buf.push(b);
                    }
                }
            }
        }
        drops
    }

    fn begin_sentence(&mut self, b: u8, stamp: Stamp) {
        self.buf.clear();
        self.buf.push(b);
        self.first = Some(stamp);
        self.scan = Scan::Record;
    }

    fn push_raw(&mut self, chunk: &[u8], t: ReadTiming, out: &mut Vec<Record>) {
        let n = chunk.len();
        let mut i = 0;
        while i < n {
            let stamp = t.at(i, n);
            let bucket = stamp.ns.div_euclid(self.bucket_ns);
            match self.first {
                Some(first) if first.ns.div_euclid(self.bucket_ns) != bucket => {
                    self.flush_raw(out);
                    continue;
                }
                Some(_) => {}
                None => self.first = Some(stamp),
            }
            // Bytes up to the end of this bucket (stamps only grow along the chunk) and room left.
            let room = self.max - self.buf.len();
            let mut j = i + 1;
            while j < n && j - i < room && t.at(j, n).ns.div_euclid(self.bucket_ns) == bucket {
                j += 1;
            }
            self.buf.extend_from_slice(&chunk[i..j]);
            if self.buf.len() >= self.max {
                self.flush_raw(out);
            }
            i = j;
        }
    }

    fn flush_raw(&mut self, out: &mut Vec<Record>) {
        if let Some(first) = self.first.take() {
            if !self.buf.is_empty() {
                out.push(Record {
                    stamp: first,
                    bytes: std::mem::take(&mut self.buf),
                    text: false,
                });
            }
        }
        self.buf.clear();
    }
}

/// A line is text when it is UTF-8 without control characters other than tab.
fn is_text(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|s| !s.chars().any(|c| c.is_control() && c != '\t'))
}

/// `$BODY*HH` / `!BODY*HH`: printable ASCII, and HH (hex, either case) is the XOR of BODY.
pub fn nmea_valid(s: &[u8]) -> bool {
    let n = s.len();
    if n < 4 || !(s[0] == b'$' || s[0] == b'!') || s[n - 3] != b'*' {
        return false;
    }
    let body = &s[1..n - 3];
    if !body
        .iter()
        .all(|&b| (0x20..=0x7e).contains(&b) && b != b'$' && b != b'*')
    {
        return false;
    }
    let hex = |b: u8| (b as char).to_digit(16);
    match (hex(s[n - 2]), hex(s[n - 1])) {
        (Some(h), Some(l)) => crate::synthetic::nmea_checksum(body) as u32 == (h << 4 | l),
        _ => false,
    }
}

#[cfg(feature = "serial")]
pub use device::SerialSource;

#[cfg(not(feature = "serial"))]
pub use unavailable::SerialSource;

#[cfg(feature = "serial")]
mod device {
    use bytes::Bytes;
    use std::io::Read;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{FlowControl, Framer, Parity, ReadTiming, Record, SerialSettings};
    use crate::{FrameClock, FrameSink, Media, SourceError, StopFlag};

    /// How long a read waits before the loop checks the stop flag and flushes raw buckets.
    const POLL: Duration = Duration::from_millis(10);

    /// A serial sensor on a tty.
    pub struct SerialSource {
        id: String,
        settings: SerialSettings,
        clock: Arc<dyn FrameClock>,
        buf: Vec<u8>,
        out: Vec<Record>,
        last_drop_log: Option<Instant>,
        unlogged_drops: u64,
    }

    impl SerialSource {
        pub fn new(id: &str, settings: SerialSettings, clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                settings,
                clock,
                buf: vec![0; 4096],
                out: Vec::new(),
                last_drop_log: None,
                unlogged_drops: 0,
            }
        }

        fn device_error(&self, message: String, retryable: bool) -> SourceError {
            SourceError::Device {
                source_id: self.id.clone(),
                device: self.settings.device.clone(),
                message,
                retryable,
            }
        }

        fn open(&self) -> Result<serialport::TTYPort, SourceError> {
            let s = &self.settings;
            let data_bits = match s.data_bits {
                5 => serialport::DataBits::Five,
                6 => serialport::DataBits::Six,
                7 => serialport::DataBits::Seven,
                _ => serialport::DataBits::Eight,
            };
            let stop_bits = if s.stop_bits == 2 {
                serialport::StopBits::Two
            } else {
                serialport::StopBits::One
            };
            let parity = match s.parity {
                Parity::None => serialport::Parity::None,
                Parity::Odd => serialport::Parity::Odd,
                Parity::Even => serialport::Parity::Even,
            };
            let flow = match s.flow_control {
                FlowControl::None => serialport::FlowControl::None,
                FlowControl::Software => serialport::FlowControl::Software,
                FlowControl::Hardware => serialport::FlowControl::Hardware,
            };
            serialport::new(&s.device, s.baud)
                .data_bits(data_bits)
                .stop_bits(stop_bits)
                .parity(parity)
                .flow_control(flow)
                .timeout(POLL)
                .open_native()
                .map_err(|e| {
                    // A bad path or setting will not fix itself; a missing or busy device may.
                    let retryable = e.kind() != serialport::ErrorKind::InvalidInput;
                    self.device_error(format!("cannot open: {e}"), retryable)
                })
        }

        fn emit(&mut self, sink: &mut FrameSink, drops: u64) -> Result<(), SourceError> {
            for r in self.out.drain(..) {
                sink.emit(
                    r.stamp,
                    Media::Serial { text: r.text },
                    Bytes::from(r.bytes),
                )
                .map_err(|_| SourceError::PipelineClosed {
                    source_id: self.id.clone(),
                })?;
            }
            if drops > 0 {
                sink.health().add_drops(drops);
                self.unlogged_drops += drops;
                let due = self
                    .last_drop_log
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
                if due {
                    tracing::warn!(source = %self.id, dropped = self.unlogged_drops,
                        framing = ?self.settings.framing, "serial: bad or overlong records dropped");
                    self.unlogged_drops = 0;
                    self.last_drop_log = Some(Instant::now());
                }
            }
            Ok(())
        }
    }

    impl crate::Source for SerialSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
            let mut port = self.open()?;
            tracing::info!(source = %self.id, device = %self.settings.device, baud = self.settings.baud,
                framing = ?self.settings.framing, "serial: port open");
            let mut framer = Framer::from_settings(&self.settings);
            let byte_ns = self.settings.byte_ns();
            let mut floor_ns = self.clock.now().ns;
            let mut buf = std::mem::take(&mut self.buf);
            let result = loop {
                if stop.is_raised() {
                    let drops = framer.finish(&mut self.out);
                    break self.emit(sink, drops);
                }
                match port.read(&mut buf) {
                    Ok(0) => {
                        let drops = framer.finish(&mut self.out);
                        self.emit(sink, drops)?;
                        break Err(self.device_error("end of file (peer closed)".into(), true));
                    }
                    Ok(n) => {
                        let end = self.clock.now();
                        let timing = ReadTiming {
                            end,
                            floor_ns,
                            byte_ns,
                        };
                        floor_ns = end.ns;
                        let drops = framer.push(&buf[..n], timing, &mut self.out);
                        if let Err(e) = self.emit(sink, drops) {
                            break Err(e);
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                        ) =>
                    {
                        // Nothing had arrived by now: later bytes cannot be stamped before it,
                        // which also keeps a raw bucket closed once flushed.
                        let now = self.clock.now();
                        floor_ns = now.ns;
                        framer.tick(now, &mut self.out);
                        if let Err(e) = self.emit(sink, 0) {
                            break Err(e);
                        }
                    }
                    Err(e) => {
                        // EIO (USB adapter unplugged), hang-up (peer closed): reopen with backoff.
                        let drops = framer.finish(&mut self.out);
                        self.emit(sink, drops)?;
                        break Err(self.device_error(format!("read failed: {e}"), true));
                    }
                }
            };
            self.buf = buf;
            result
        }
    }
}

#[cfg(not(feature = "serial"))]
mod unavailable {
    use std::sync::Arc;

    use super::SerialSettings;
    use crate::{FrameClock, FrameSink, Source, SourceError, StopFlag};

    /// Stand-in when rigd-drivers is built without the `serial` feature: fails for good.
    pub struct SerialSource {
        id: String,
        device: String,
    }

    impl SerialSource {
        pub fn new(id: &str, settings: SerialSettings, _clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                device: settings.device,
            }
        }
    }

    impl Source for SerialSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, _sink: &mut FrameSink, _stop: &StopFlag) -> Result<(), SourceError> {
            Err(SourceError::not_built(&self.id, &self.device, "serial"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClockState;

    fn at(ns: i64) -> ReadTiming {
        ReadTiming {
            end: Stamp {
                ns,
                state: ClockState::Locked,
            },
            floor_ns: 0,
            byte_ns: 0,
        }
    }

    fn feed(f: &mut Framer, chunks: &[&[u8]]) -> (Vec<Record>, u64) {
        let mut out = Vec::new();
        let mut drops = 0;
        for (i, c) in chunks.iter().enumerate() {
            drops += f.push(c, at(1_000 + i as i64), &mut out);
        }
        (out, drops)
    }

    fn texts(r: &[Record]) -> Vec<String> {
        r.iter()
            .map(|r| String::from_utf8_lossy(&r.bytes).into_owned())
            .collect()
    }

    fn sentence(body: &str) -> String {
        format!(
            "${body}*{:02X}",
            crate::synthetic::nmea_checksum(body.as_bytes())
        )
    }

    #[test]
    fn lines_split_across_reads_keep_the_first_byte_stamp() {
        let mut f = Framer::new(Framing::Line, b"\n", 100, 33);
        let (out, drops) = feed(&mut f, &[b"ab", b"c\r\nde", b"f\n\n"]);
        assert_eq!(texts(&out), ["abc", "def"]);
        assert_eq!(out[0].stamp.ns, 1_000);
        assert_eq!(out[1].stamp.ns, 1_001);
        assert!(out[0].text);
        assert_eq!(drops, 0);
    }

    #[test]
    fn multibyte_delimiter_split_across_reads() {
        let mut f = Framer::new(Framing::Line, b"\r\n", 100, 33);
        let (out, _) = feed(&mut f, &[b"one\r", b"\ntwo\rthree\r\n"]);
        assert_eq!(texts(&out), ["one", "two\rthree"]);
        assert!(!out[1].text, "a bare CR is a control character");
    }

    #[test]
    fn overlong_line_is_dropped_once_and_memory_stays_bounded() {
        let mut f = Framer::new(Framing::Line, b"\n", 64, 33);
        let mut out = Vec::new();
        let mut drops = 0;
        let junk = [b'x'; 1000];
        for i in 0..1000 {
            drops += f.push(&junk, at(i), &mut out);
            assert!(f.pending() <= 64 + 1, "pending {}", f.pending());
        }
        drops += f.push(b"\nok\n", at(2000), &mut out);
        assert_eq!(drops, 1);
        assert_eq!(texts(&out), ["ok"]);
    }

    #[test]
    fn line_of_exactly_max_bytes_passes() {
        let mut f = Framer::new(Framing::Line, b"\r\n", 4, 33);
        let (out, drops) = feed(&mut f, &[b"abcd\r\nabcde\r\nx\r\n"]);
        assert_eq!(texts(&out), ["abcd", "x"]);
        assert_eq!(drops, 1);
    }

    #[test]
    fn nmea_good_and_bad_checksums_are_counted() {
        let good = sentence("GPGGA,1,2,3");
        let bad = good.replace("GPGGA,1", "GPGGA,9");
        let lower = {
            let s = sentence("GPVTG,x");
            let (head, sum) = s.split_at(s.len() - 2);
            format!("{head}{}", sum.to_lowercase())
        };
        let ais = sentence("AIVDM,1").replacen('$', "!", 1);
        let stream = format!("{good}\r\n{bad}\r\n{lower}\n$GPXXX,nosum\r\n{ais}\r\n");
        let mut f = Framer::new(Framing::Nmea, b"\n", 100, 33);
        let (out, drops) = feed(&mut f, &[stream.as_bytes()]);
        assert_eq!(texts(&out), [good, lower, ais]);
        assert_eq!(drops, 2);
    }

    #[test]
    fn nmea_resyncs_on_dollar_after_garbage() {
        let good = sentence("GPRMC,a");
        let mut stream = vec![0x00, 0xff, b'x'];
        stream.extend_from_slice(format!("{good}\r\n$GPRMC,cut{good}\r\n\r\n").as_bytes());
        let mut f = Framer::new(Framing::Nmea, b"\n", 100, 33);
        let mut out = Vec::new();
        let drops = f.push(&stream, at(5), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(drops, 2, "the noise run and the cut sentence");
    }

    #[test]
    fn nmea_overlong_sentence_is_one_drop() {
        let mut f = Framer::new(Framing::Nmea, b"\n", 82, 33);
        let long = format!("${}\r\n", "A".repeat(10_000));
        let good = sentence("GPGLL,1");
        let (out, drops) = feed(&mut f, &[long.as_bytes(), format!("{good}\r\n").as_bytes()]);
        assert_eq!(texts(&out), [good]);
        assert_eq!(drops, 1);
        assert!(f.pending() == 0);
    }

    #[test]
    fn partial_record_at_the_end_is_a_drop() {
        let mut f = Framer::new(Framing::Nmea, b"\n", 82, 33);
        let mut out = Vec::new();
        f.push(b"$GPRMC,half", at(1), &mut out);
        assert_eq!(f.finish(&mut out), 1);
        assert_eq!(f.finish(&mut out), 0);
        let mut f = Framer::new(Framing::Line, b"\n", 82, 33);
        f.push(b"half", at(1), &mut out);
        assert_eq!(f.finish(&mut out), 1);
        assert!(out.is_empty());
    }

    #[test]
    fn random_bytes_never_panic_and_stay_bounded() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for framing in [Framing::Line, Framing::Nmea, Framing::Raw] {
            let mut f = Framer::new(framing, b"\r\n", 50, 33);
            let mut out = Vec::new();
            for i in 0..2000 {
                let chunk: Vec<u8> = (0..(i % 97))
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        // Bias towards the bytes the framers care about.
                        match state % 8 {
                            0 => b'$',
                            1 => b'\n',
                            2 => b'\r',
                            3 => b'*',
                            _ => (state >> 8) as u8,
                        }
                    })
                    .collect();
                f.push(&chunk, at(i * 1_000_000), &mut out);
                assert!(f.pending() <= 52);
            }
            assert!(out.iter().all(|r| r.bytes.len() <= 50));
        }
    }

    #[test]
    fn raw_groups_bytes_per_bucket() {
        let mut f = Framer::new(Framing::Raw, b"\n", 1000, 33);
        let mut out = Vec::new();
        // 10 bytes 1 ms apart, the last arriving at 34.5 ms: 8 in bucket 0 (from 25.5 ms), 2 in 1.
        let t = ReadTiming {
            end: Stamp {
                ns: 34_500_000,
                state: ClockState::Unsynced,
            },
            floor_ns: 0,
            byte_ns: 1_000_000,
        };
        f.push(b"0123456789", t, &mut out);
        assert_eq!(texts(&out), ["01234567"]);
        assert_eq!(out[0].stamp.ns, 25_500_000);
        f.tick(
            Stamp {
                ns: 60_000_000,
                state: ClockState::Unsynced,
            },
            &mut out,
        );
        assert_eq!(out.len(), 1, "bucket 1 is still open");
        f.tick(
            Stamp {
                ns: 66_000_000,
                state: ClockState::Unsynced,
            },
            &mut out,
        );
        assert_eq!(texts(&out), ["01234567", "89"]);
        assert_eq!(out[1].stamp.ns, 33_500_000);
        assert!(!out[1].text);
    }

    #[test]
    fn raw_cuts_at_max_record_bytes() {
        let mut f = Framer::new(Framing::Raw, b"\n", 4, 33);
        let (out, drops) = feed(&mut f, &[b"abcdefghij"]);
        assert_eq!(texts(&out), ["abcd", "efgh"]);
        assert_eq!(drops, 0);
        let mut out = Vec::new();
        f.finish(&mut out);
        assert_eq!(texts(&out), ["ij"]);
    }

    #[test]
    fn back_dating_stops_at_the_previous_read() {
        let t = ReadTiming {
            end: Stamp {
                ns: 10_000,
                state: ClockState::Unsynced,
            },
            floor_ns: 9_000,
            byte_ns: 100,
        };
        assert_eq!(t.at(99, 100).ns, 10_000);
        assert_eq!(t.at(95, 100).ns, 9_600);
        assert_eq!(t.at(0, 100).ns, 9_000);
    }

    #[test]
    fn byte_time_counts_start_parity_and_stop_bits() {
        let s = SerialSettings {
            device: "/dev/null".into(),
            baud: 9600,
            parity: Parity::Even,
            flow_control: FlowControl::None,
            data_bits: 8,
            stop_bits: 1,
            framing: Framing::Raw,
            delimiter: b"\n".to_vec(),
            max_record_bytes: 10,
            bucket_ms: 33,
        };
        assert_eq!(s.byte_ns(), 11 * 1_000_000_000 / 9600);
    }
}
