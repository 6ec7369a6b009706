//! `rigd replay --mcap FILE`: a spool as one MCAP file that Foxglove and the reference readers open
//! and seek.
//!
//! Channels, per source (topic `/{source}`), with Foxglove's schemas:
//! - camera: `foxglove.CompressedImage` (`format` = `jpeg`, `frame_id` = source),
//! - audio: `foxglove.RawAudio` (`format` = `pcm-s16`, interleaved little-endian),
//! - serial: `foxglove.Log` per record (level INFO, `name` = source; binary records as
//!   `base64:...`); on a source whose records are NMEA sentences also `foxglove.LocationFix` on
//!   `/{source}/fix`, one per GGA/RMC epoch ([`crate::nmea`]). A sentence that does not parse stays
//!   a Log line (level WARNING) and is counted.
//! - CAN: one `rigd.CanFrame` per frame of each record, stamped with the frame's own time; with
//!   a DBC (`--dbc`) also `/{source}/{Message}` per DBC message seen, its signals as numbers
//!   ([`crate::foxglove::can`]).
//!
//! Encodings: `protobuf` (default; each schema's data is a `FileDescriptorSet`, [`crate::foxglove`])
//! or `json` (Foxglove's JSON schemas, [`json`]; no `/fix` channels). Chunks are compressed with
//! zstd (default), lz4 or not at all, and close after 1 s of capture time (or 64 MiB), with message
//! indexes, chunk indexes, statistics and the summary, so readers seek without scanning.
//!
//! Times: log time = publish time = capture time (ns, the rig clock), message sequence = the
//! frame's `seq` (low 32 bits), in capture order. What the schemas have no field for goes into
//! metadata records: `foxglove` (`deviceName` = rig id, what Foxglove's device import keys on),
//! `rigd` (rig, bucket width, sources, time range, counts), `rigd.clock` (per source, the runs of
//! clock state) and one `rigd.event` per technician marker (which also stay a Log channel of their
//! own, `/events`).
//!
//! The spool is read on a thread of its own, a few frames ahead ([`READ_AHEAD`]), so that reading
//! and checking records overlaps encoding and compression.
//!
//! An existing output file is kept unless `force`; an encrypted spool without a key is refused
//! before the file is created; a failure part way removes the partial file (an interrupt does not:
//! the file is closed properly and is a valid, shorter MCAP).

pub mod json;

use rigd_drivers::{ClockState, Frame, Media};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use super::{capture_order, total_bytes, ReplayError, SourcePlan, Summary, Tally};
use crate::foxglove::{self, location_fix, log_text, protobuf_message, schema_name, LOCATION_FIX};
use crate::nmea::{self, Fix, FixBuilder, Sentence};
use crate::payload::Held;
use crate::progress::{Interrupt, Progress};
use crate::spool::snapshot::{Entry, ReadError, SpoolSnapshot};

/// Message encoding of the MCAP file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Encoding {
    /// Foxglove's protobuf schemas, FileDescriptorSets embedded.
    #[default]
    Protobuf,
    /// Foxglove's JSON schemas, bytes as base64 (a third larger).
    Json,
}

/// Chunk compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Compression {
    #[default]
    Zstd,
    Lz4,
    None,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Protobuf => "protobuf",
            Encoding::Json => "json",
        }
    }
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
            Compression::None => "none",
        }
    }

    fn mcap(self) -> Option<::mcap::Compression> {
        match self {
            Compression::Zstd => Some(::mcap::Compression::Zstd),
            Compression::Lz4 => Some(::mcap::Compression::Lz4),
            Compression::None => None,
        }
    }
}

/// How to write the file.
#[derive(Debug, Clone)]
pub struct Options {
    pub encoding: Encoding,
    pub compression: Compression,
    /// Overwrite an existing output file.
    pub force: bool,
    /// The rig id (empty when neither the spool nor `--rig` says it: no `foxglove` record).
    pub rig: String,
    pub bucket_ms: u32,
    /// DBC files for CAN sources: `(Some(source), dbc)` for one source, `(None, dbc)` for every
    /// other CAN source.
    pub dbc: Vec<(Option<String>, std::sync::Arc<crate::can::Dbc>)>,
}

impl Options {
    /// The DBC of a CAN source: its own, else the one for every source.
    pub fn dbc_for(&self, source: &str) -> Option<&crate::can::Dbc> {
        let own = self.dbc.iter().find(|(s, _)| s.as_deref() == Some(source));
        own.or_else(|| self.dbc.iter().find(|(s, _)| s.is_none()))
            .map(|(_, d)| &**d)
    }
}

/// A chunk closes once a message is [`CHUNK_NS`] later than the chunk's first, or, for a second of
/// capture larger than this (uncompressed), earlier: a 30 MB/s rig's second is one chunk, so a
/// reader's 1 s range query reads at most two.
pub const CHUNK_BYTES: u64 = 64 << 20;
/// The time a chunk covers at most.
pub const CHUNK_NS: u64 = 1_000_000_000;
/// zstd level 1: JPEG and PCM gain little from higher levels, which cost several times the CPU.
const ZSTD_LEVEL: u32 = 1;

/// What the MCAP export wrote, beside the per-source counts of [`Summary`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct McapReport {
    pub encoding: &'static str,
    pub compression: &'static str,
    /// Size of the file written.
    pub output_bytes: u64,
    /// Messages written, all channels.
    pub messages: u64,
    /// `foxglove.LocationFix` messages made from NMEA.
    pub location_fixes: u64,
    /// NMEA sentences that did not parse (kept as Log lines, level WARNING).
    pub nmea_unparsed: u64,
    /// Technician markers written as `rigd.event` metadata.
    pub markers: u64,
    /// CAN frames written (`rigd.CanFrame`), and of those, the ones decoded with a DBC.
    pub can_frames: u64,
    pub can_decoded: u64,
}

fn channel_metadata(f: &Frame, bucket_ms: u32) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("source".into(), f.source.to_string());
    m.insert("modality".into(), f.modality().as_str().into());
    m.insert("content-type".into(), f.media.content_type());
    m.insert("bucket-ms".into(), bucket_ms.to_string());
    for (k, v) in f.media.fields() {
        if k != "frames" {
            m.insert(k.into(), v);
        }
    }
    m
}

/// Runs of one clock state in a source's frames: `[first_capture_ns, last_capture_ns, state]`.
#[derive(Debug, Default)]
struct ClockRuns(Vec<(i64, i64, ClockState)>);

impl ClockRuns {
    fn push(&mut self, ns: i64, state: ClockState) {
        match self.0.last_mut() {
            Some((_, last, s)) if *s == state => *last = ns,
            _ => self.0.push((ns, ns, state)),
        }
    }

    fn json(&self) -> String {
        let runs: Vec<(i64, i64, &str)> = self
            .0
            .iter()
            .map(|(a, b, s)| (*a, *b, s.as_str()))
            .collect();
        serde_json::to_string(&runs).unwrap_or_default()
    }
}

/// Per source: its channels and what the export keeps about it.
#[derive(Debug, Default)]
struct SourceOut {
    /// The channel, and the schema it was made for (frames of another one are skipped).
    channel: Option<(u16, &'static str)>,
    fix_channel: Option<u16>,
    fixes: FixBuilder,
    clock: ClockRuns,
    /// CAN: the channel of each DBC message seen, by its index in the DBC; frames written.
    can_channels: BTreeMap<usize, u16>,
    can_seq: u32,
}

/// The MCAP writer and the channels and schemas it has so far.
struct Out<'a> {
    writer: ::mcap::Writer<BufWriter<File>>,
    path: &'a Path,
    encoding: Encoding,
    schemas: BTreeMap<&'static str, u16>,
    chunk_start: Option<u64>,
    report: McapReport,
}

impl Out<'_> {
    fn err(&self) -> impl FnOnce(::mcap::McapError) -> ReplayError {
        let path = self.path.to_path_buf();
        move |source| ReplayError::Mcap { path, source }
    }

    fn schema(&mut self, name: &'static str) -> Result<u16, ReplayError> {
        if let Some(id) = self.schemas.get(name) {
            return Ok(*id);
        }
        let (encoding, data) = match self.encoding {
            Encoding::Protobuf => (
                "protobuf",
                foxglove::file_descriptor_set(name).unwrap_or_default(),
            ),
            Encoding::Json => ("jsonschema", json::schema(name).into_bytes()),
        };
        let err = self.err();
        let id = self.writer.add_schema(name, encoding, &data).map_err(err)?;
        self.schemas.insert(name, id);
        Ok(id)
    }

    fn channel(
        &mut self,
        name: &'static str,
        topic: &str,
        metadata: &BTreeMap<String, String>,
    ) -> Result<u16, ReplayError> {
        let schema = self.schema(name)?;
        let encoding = match self.encoding {
            Encoding::Protobuf => "protobuf",
            Encoding::Json => "json",
        };
        let err = self.err();
        self.writer
            .add_channel(schema, topic, encoding, metadata)
            .map_err(err)
    }

    fn message(
        &mut self,
        channel: u16,
        seq: u64,
        capture_ns: i64,
        data: &[u8],
    ) -> Result<(), ReplayError> {
        let t = capture_ns.max(0) as u64;
        // Close the chunk at 1 s of capture time (the writer closes it at CHUNK_BYTES itself).
        match self.chunk_start {
            Some(start) if t.saturating_sub(start) >= CHUNK_NS => {
                let err = self.err();
                self.writer.flush().map_err(err)?;
                self.chunk_start = Some(t);
            }
            None => self.chunk_start = Some(t),
            Some(_) => {}
        }
        let err = self.err();
        self.writer
            .write_to_known_channel(
                &::mcap::records::MessageHeader {
                    channel_id: channel,
                    sequence: seq as u32,
                    log_time: t,
                    publish_time: t,
                },
                data,
            )
            .map_err(err)?;
        self.report.messages += 1;
        Ok(())
    }

    fn metadata(
        &mut self,
        name: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<(), ReplayError> {
        let err = self.err();
        self.writer
            .write_metadata(&::mcap::records::Metadata {
                name: name.into(),
                metadata,
            })
            .map_err(err)
    }

    fn fix(
        &mut self,
        src: &mut SourceOut,
        source: &str,
        fix: &Fix,
        buf: &mut Vec<u8>,
    ) -> Result<(), ReplayError> {
        let channel = match src.fix_channel {
            Some(c) => c,
            None => {
                let mut m = BTreeMap::new();
                m.insert("source".into(), source.to_string());
                m.insert("modality".into(), "serial".into());
                m.insert("derived-from".into(), "NMEA GGA and RMC".into());
                *src.fix_channel.insert(self.channel(
                    LOCATION_FIX,
                    &format!("/{source}/fix"),
                    &m,
                )?)
            }
        };
        location_fix(fix, source, buf);
        self.message(channel, fix.seq, fix.capture_ns, buf)?;
        self.report.location_fixes += 1;
        Ok(())
    }
}

impl Out<'_> {
    /// A schema whose name and data are made at run time (a DBC message's signals).
    fn dynamic_schema(&mut self, name: &str, data: &[u8]) -> Result<u16, ReplayError> {
        let encoding = match self.encoding {
            Encoding::Protobuf => "protobuf",
            Encoding::Json => "jsonschema",
        };
        let err = self.err();
        self.writer.add_schema(name, encoding, data).map_err(err)
    }

    /// A CAN record: each frame on the source's channel, and with a DBC each frame it knows on
    /// its message's channel; `Some(why)` for a record that does not read.
    fn can(
        &mut self,
        src: &mut SourceOut,
        channel: u16,
        frame: &Frame,
        dbc: Option<&crate::can::Dbc>,
        bin: &mut Vec<u8>,
        text: &mut String,
    ) -> Result<Option<String>, ReplayError> {
        use crate::foxglove::can as m;
        let frames = match rigd_drivers::can_record::decode(&frame.payload) {
            Ok(f) => f,
            Err(e) => return Ok(Some(e.to_string())),
        };
        for f in &frames {
            let seq = src.can_seq;
            src.can_seq = src.can_seq.wrapping_add(1);
            match self.encoding {
                Encoding::Protobuf => {
                    m::can_frame(f, &frame.source, bin);
                    self.message(channel, seq as u64, f.ts_ns, bin)?;
                }
                Encoding::Json => {
                    m::can_frame_json(f, &frame.source, text);
                    self.message(channel, seq as u64, f.ts_ns, text.as_bytes())?;
                }
            }
            self.report.can_frames += 1;
            let Some(dbc) = dbc else { continue };
            let Some((index, message)) = dbc.message_index(f.id) else {
                continue;
            };
            let Some(decoded) = dbc.decode(f.id, &f.data) else {
                continue;
            };
            let ch = match src.can_channels.get(&index) {
                Some(c) => *c,
                None => {
                    let name = m::signals_schema_name(message);
                    let schema = match self.encoding {
                        Encoding::Protobuf => {
                            self.dynamic_schema(&name, &m::signals_descriptor_set(message))?
                        }
                        Encoding::Json => {
                            self.dynamic_schema(&name, m::signals_json_schema(message).as_bytes())?
                        }
                    };
                    let mut meta = BTreeMap::new();
                    meta.insert("source".into(), frame.source.to_string());
                    meta.insert("modality".into(), "can".into());
                    meta.insert("derived-from".into(), "DBC".into());
                    meta.insert("can-id".into(), format!("{:#x}", message.can_id));
                    let encoding = self.encoding.as_str();
                    let topic = format!("/{}/{}", frame.source, message.name);
                    let err = self.err();
                    let id = self
                        .writer
                        .add_channel(schema, &topic, encoding, &meta)
                        .map_err(err)?;
                    src.can_channels.insert(index, id);
                    id
                }
            };
            match self.encoding {
                Encoding::Protobuf => {
                    m::signals_protobuf(message, &decoded, f.ts_ns, bin);
                    self.message(ch, seq as u64, f.ts_ns, bin)?;
                }
                Encoding::Json => {
                    m::signals_json(&decoded, f.ts_ns, text);
                    self.message(ch, seq as u64, f.ts_ns, text.as_bytes())?;
                }
            }
            self.report.can_decoded += 1;
        }
        Ok(None)
    }
}

/// Creates the output file: a new one, or with `force` over an existing one.
fn create(path: &Path, force: bool) -> Result<File, ReplayError> {
    let mut open = OpenOptions::new();
    open.write(true);
    if force {
        open.create(true).truncate(true);
    } else {
        open.create_new(true);
    }
    open.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            ReplayError::OutputExists {
                path: path.to_path_buf(),
            }
        } else {
            ReplayError::Output {
                path: path.to_path_buf(),
                op: "create",
                source: e,
            }
        }
    })
}

/// Refuses an encrypted spool without a key before anything is written: the first readable
/// record of each source tells.
fn check_readable(
    snap: &SpoolSnapshot,
    plan: &[SourcePlan],
    key: Option<&crate::seal::Decryptor>,
) -> Result<(), ReplayError> {
    if key.is_some() {
        return Ok(());
    }
    for p in plan {
        if let Some(frame) = p.entries.iter().find_map(|e| snap.read(&p.source, e).ok()) {
            // A sealed frame is the error; what a readable one holds does not matter here.
            let _ = super::readable(frame, None)?;
        }
    }
    Ok(())
}

/// Frames read ahead of the writer.
const READ_AHEAD: usize = 32;

/// Reads the planned records in capture order on a thread of its own, [`READ_AHEAD`] frames ahead,
/// so that reading the spool (page cache or disk, checksums) overlaps chunk compression. The
/// thread stops when the receiver is dropped.
fn read_ahead<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    snap: &'scope SpoolSnapshot,
    plan: &'scope [SourcePlan],
) -> std::sync::mpsc::Receiver<(usize, Entry, Result<Held, ReadError>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(READ_AHEAD);
    scope.spawn(move || {
        for (i, e) in capture_order(plan) {
            let read = snap.read(&plan[i].source, &e);
            if tx.send((i, e, read)).is_err() {
                break;
            }
        }
    });
    rx
}

/// Writes the planned records to one MCAP file at `path`.
pub fn export(
    snap: &SpoolSnapshot,
    plan: &[SourcePlan],
    path: &Path,
    opts: &Options,
    key: Option<&crate::seal::Decryptor>,
    interrupt: &Interrupt,
) -> Result<Summary, ReplayError> {
    check_readable(snap, plan, key)?;
    let file = create(path, opts.force)?;
    let written = write(snap, plan, path, file, opts, key, interrupt);
    if written.is_err() {
        // What is there is no valid MCAP: do not leave it for a reader to trip over.
        let _ = std::fs::remove_file(path);
    }
    written
}

fn write(
    snap: &SpoolSnapshot,
    plan: &[SourcePlan],
    path: &Path,
    file: File,
    opts: &Options,
    key: Option<&crate::seal::Decryptor>,
    interrupt: &Interrupt,
) -> Result<Summary, ReplayError> {
    let mcap_err = |source| ReplayError::Mcap {
        path: path.to_path_buf(),
        source,
    };
    let mut options = ::mcap::WriteOptions::new()
        .compression(opts.compression.mcap())
        .chunk_size(Some(CHUNK_BYTES))
        .profile("")
        .library(concat!("rigd ", env!("CARGO_PKG_VERSION")));
    if opts.compression == Compression::Zstd {
        options = options.compression_level(ZSTD_LEVEL);
    }
    let writer = options
        .create(BufWriter::with_capacity(4 << 20, file))
        .map_err(mcap_err)?;
    let mut out = Out {
        writer,
        path,
        encoding: opts.encoding,
        schemas: BTreeMap::new(),
        chunk_start: None,
        report: McapReport {
            encoding: opts.encoding.as_str(),
            compression: opts.compression.as_str(),
            ..Default::default()
        },
    };
    if !opts.rig.is_empty() {
        out.metadata(
            "foxglove",
            BTreeMap::from([("deviceName".to_string(), opts.rig.clone())]),
        )?;
    }
    let progress = Progress::new(total_bytes(plan), "mcap");
    let mut tally = Tally::new(plan);
    let mut sources: Vec<SourceOut> = plan.iter().map(|_| SourceOut::default()).collect();
    let mut bin = Vec::new();
    let mut text = String::new();
    let mut interrupted = false;
    std::thread::scope(|scope| -> Result<(), ReplayError> {
        let frames = read_ahead(scope, snap, plan);
        for (i, e, read) in frames {
            if interrupt.is_set() {
                interrupted = true;
                break;
            }
            progress.inc(e.len as u64);
            let p = &plan[i];
            let frame = match read {
                Ok(f) => f,
                Err(err) => {
                    // A permission problem stops the export (the file is removed: no MCAP).
                    let c = super::damage(err)?;
                    progress.println(&format!("skipped corrupt {}", super::inspect::describe(&c)));
                    tally.corrupt(c);
                    continue;
                }
            };
            let frame = match super::readable(frame, key)? {
                Ok(f) => f,
                Err(why) => {
                    tally.skipped(format!("{}/{}: {why}", p.source, e.seq));
                    continue;
                }
            };
            let name = schema_name(&frame.media);
            let src = &mut sources[i];
            let (channel, want) = match src.channel {
                Some(c) => c,
                None => {
                    let metadata = channel_metadata(&frame, opts.bucket_ms);
                    let id = out.channel(name, &format!("/{}", p.source), &metadata)?;
                    *src.channel.insert((id, name))
                }
            };
            if want != name {
                tally.skipped(format!(
                    "{}/{}: a {} frame on a {want} channel",
                    p.source,
                    e.seq,
                    frame.modality().as_str()
                ));
                continue;
            }
            src.clock.push(frame.capture_ns, frame.clock);
            if let Media::Can { .. } = frame.media {
                let dbc = opts.dbc_for(&p.source);
                match out.can(src, channel, &frame, dbc, &mut bin, &mut text)? {
                    None => tally.done(i, &e),
                    Some(why) => tally.skipped(format!("{}/{}: {why}", p.source, e.seq)),
                }
                continue;
            }
            if *p.source == *crate::events::EVENTS_SOURCE {
                out.metadata("rigd.event", marker(&frame))?;
                out.report.markers += 1;
            }
            match opts.encoding {
                Encoding::Json => {
                    json::message(&frame, opts.bucket_ms, &mut text);
                    out.message(channel, frame.seq, frame.capture_ns, text.as_bytes())?;
                }
                Encoding::Protobuf => {
                    let sentence = match frame.media {
                        Media::Serial { text: true } => nmea::parse(&frame.payload),
                        _ => Ok(None),
                    };
                    let level = if sentence.is_err() {
                        out.report.nmea_unparsed += 1;
                        foxglove::LOG_WARNING
                    } else {
                        foxglove::LOG_INFO
                    };
                    protobuf_message(&frame, level, &mut bin);
                    out.message(channel, frame.seq, frame.capture_ns, &bin)?;
                    if let Ok(Some(s @ (Sentence::Gga(_) | Sentence::Rmc(_)))) = &sentence {
                        for fix in src.fixes.push(s, frame.capture_ns, frame.seq) {
                            out.fix(src, &p.source, &fix, &mut bin)?;
                        }
                    }
                }
            }
            tally.done(i, &e);
        }
        Ok(())
    })?;
    for (p, src) in plan.iter().zip(sources.iter_mut()) {
        if let Some(fix) = src.fixes.finish() {
            out.fix(src, &p.source, &fix, &mut bin)?;
        }
    }
    let range = |entries: &mut dyn Iterator<Item = &Entry>| {
        entries.fold(None, |r: Option<(i64, i64)>, e| {
            Some(r.map_or((e.capture_ns, e.capture_ns), |(a, b)| {
                (a.min(e.capture_ns), b.max(e.capture_ns))
            }))
        })
    };
    let held = range(&mut plan.iter().flat_map(|p| p.entries.iter()));
    let spool = range(&mut snap.sources().flat_map(|(_, e)| e.iter()));
    let mut rigd = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        rigd.insert(k.to_string(), v);
    };
    put("rig", opts.rig.clone());
    put("bucket-ms", opts.bucket_ms.to_string());
    put(
        "sources",
        plan.iter()
            .map(|p| &*p.source)
            .collect::<Vec<_>>()
            .join(","),
    );
    let ns = |t: Option<i64>| t.map(|t| t.to_string()).unwrap_or_default();
    put("first-capture-ns", ns(held.map(|r| r.0)));
    put("last-capture-ns", ns(held.map(|r| r.1)));
    put("spool-first-capture-ns", ns(spool.map(|r| r.0)));
    put("spool-last-capture-ns", ns(spool.map(|r| r.1)));
    put("encoding", opts.encoding.as_str().into());
    put("nmea-unparsed", out.report.nmea_unparsed.to_string());
    put("interrupted", interrupted.to_string());
    put("rigd-version", env!("CARGO_PKG_VERSION").into());
    out.metadata("rigd", rigd)?;
    let clock = plan
        .iter()
        .zip(&sources)
        .map(|(p, s)| (p.source.to_string(), s.clock.json()))
        .collect();
    out.metadata("rigd.clock", clock)?;
    out.writer.finish().map_err(mcap_err)?;
    let mut inner = out.writer.into_inner();
    inner.flush().map_err(ReplayError::output(path, "write"))?;
    out.report.output_bytes = inner
        .get_ref()
        .metadata()
        .map(|m| m.len())
        .unwrap_or_default();
    progress.finish();
    let mut summary = tally.finish(path.display().to_string(), interrupted);
    summary.mcap = Some(out.report);
    Ok(summary)
}

/// A technician marker (a JSON frame of the events source) as metadata: its fields as strings.
fn marker(f: &Frame) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    match serde_json::from_slice::<serde_json::Value>(&f.payload) {
        Ok(serde_json::Value::Object(fields)) => {
            for (k, v) in fields {
                let v = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                m.insert(k, v);
            }
        }
        _ => {
            m.insert("record".into(), log_text(f));
        }
    }
    m.insert("seq".into(), f.seq.to_string());
    m.insert("capture_ns".into(), f.capture_ns.to_string());
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use prost::Message as _;

    fn frame(media: Media, payload: &'static [u8]) -> Frame {
        Frame {
            source: "gps".into(),
            seq: 9,
            capture_ns: 1_700_000_000_123_456_789,
            clock: ClockState::Locked,
            media,
            payload: Bytes::from_static(payload),
        }
    }

    #[test]
    fn serial_records_are_log_lines_text_or_base64() {
        let mut out = Vec::new();
        protobuf_message(
            &frame(Media::Serial { text: true }, b"$GPGGA,x\r\n"),
            foxglove::LOG_WARNING,
            &mut out,
        );
        let log = foxglove::Log::decode(&out[..]).unwrap();
        assert_eq!(log.message, "$GPGGA,x");
        assert_eq!(log.level, foxglove::LOG_WARNING);
        assert_eq!(log.name, "gps");
        protobuf_message(
            &frame(Media::Serial { text: false }, b"\x00\xff"),
            foxglove::LOG_INFO,
            &mut out,
        );
        assert_eq!(
            foxglove::Log::decode(&out[..]).unwrap().message,
            "base64:AP8="
        );
    }

    #[test]
    fn audio_is_raw_audio_with_rate_and_channels() {
        let mut out = Vec::new();
        protobuf_message(
            &frame(
                Media::Audio {
                    sample_rate: 48_000,
                    channels: 2,
                    frames: 1,
                },
                b"\x01\x00\x02\x00",
            ),
            foxglove::LOG_INFO,
            &mut out,
        );
        let a = foxglove::RawAudio::decode(&out[..]).unwrap();
        assert_eq!((a.sample_rate, a.number_of_channels), (48_000, 2));
        assert_eq!(a.format, "pcm-s16");
        assert_eq!(&a.data[..], b"\x01\x00\x02\x00");
        assert_eq!(a.timestamp.unwrap().seconds, 1_700_000_000);
    }

    #[test]
    fn clock_runs_merge_equal_states() {
        let mut runs = ClockRuns::default();
        runs.push(1, ClockState::Unsynced);
        runs.push(2, ClockState::Unsynced);
        runs.push(3, ClockState::Locked);
        assert_eq!(runs.json(), r#"[[1,2,"unsynced"],[3,3,"locked"]]"#);
    }

    #[test]
    fn markers_become_metadata_strings() {
        let m = marker(&frame(
            Media::Serial { text: true },
            br#"{"event":"pothole","bucket":5}"#,
        ));
        assert_eq!(m["event"], "pothole");
        assert_eq!(m["bucket"], "5");
        assert_eq!(m["seq"], "9");
        let m = marker(&frame(Media::Serial { text: true }, b"not json"));
        assert_eq!(m["record"], "not json");
    }
}
