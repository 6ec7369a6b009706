//! `rigd replay --out DIR`: a spool as plain files.
//!
//! Layout under DIR:
//! - `{source}/{capture_ns}-{seq}.jpg`: one JPEG per camera frame, the bytes as captured.
//! - `{source}.h264`: an H.264 camera's access units in order, one Annex B elementary stream
//!   (`ffplay`/`ffmpeg -f h264` read it), from its first keyframe (the P-frames before it need a
//!   keyframe the export does not hold: skipped and counted); and `{source}.timestamps.ndjson`,
//!   one line per access unit: `capture_ns`, `seq`, `bucket`, `keyframe`.
//! - `{source}.wav`: one 16-bit PCM WAV per audio source, blocks placed by capture time; gaps
//!   longer than [`GAP_TOLERANCE_NS`] are filled with silence and listed, with overlaps, in
//!   `{source}.gaps.json`.
//! - `{source}.ndjson`: one line per serial record: `capture_ns`, `seq`, `bucket`, `clock`,
//!   `record` and its `encoding` (`text`, or `base64` for binary records).
//! - `{source}.log`: a CAN source's frames in can-utils' log format, `(1700000000.123456) SOURCE
//!   123#DEADBEEF` ([`crate::can::candump`]), the source id as the interface name, so that
//!   `canplayer -I {source}.log can0={source}` replays the drive onto `can0`.

use base64::Engine;
use rigd_drivers::{Codec, Frame, Media};
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{total_bytes, ReplayError, SourcePlan, Summary, Tally};
use crate::progress::{Interrupt, Progress};
use crate::spool::snapshot::SpoolSnapshot;
use crate::wire::Bucket;

/// Audio blocks are stamped at bucket starts; a block this much later than the end of the one
/// before it leaves a gap that is filled with silence.
pub const GAP_TOLERANCE_NS: i64 = 2_000_000;

/// Exports the planned records to `dir`: created if missing; an existing one must be empty
/// unless `force` (then files of the same name are replaced and the others stay).
pub fn export(
    snap: &SpoolSnapshot,
    plan: &[SourcePlan],
    dir: &Path,
    force: bool,
    bucket_ms: u32,
    key: Option<&crate::seal::Decryptor>,
    interrupt: &Interrupt,
) -> Result<Summary, ReplayError> {
    check_output(dir, force)?;
    std::fs::create_dir_all(dir).map_err(ReplayError::output(dir, "create directory"))?;
    let progress = Progress::new(total_bytes(plan), "export");
    let mut tally = Tally::new(plan);
    let mut interrupted = false;
    'sources: for (i, p) in plan.iter().enumerate() {
        let mut sink: Option<Sink> = None;
        for e in &p.entries {
            if interrupt.is_set() {
                interrupted = true;
                if let Some(s) = sink.take() {
                    s.finish()?;
                }
                break 'sources;
            }
            progress.inc(e.len as u64);
            let frame = match snap.read(&p.source, e) {
                Ok(f) => f,
                Err(err) => {
                    let c = match super::damage(err) {
                        Ok(c) => c,
                        Err(stop) => {
                            // What was written stays readable (a WAV's header patched).
                            if let Some(s) = sink.take() {
                                s.finish()?;
                            }
                            progress.finish();
                            return Err(stop);
                        }
                    };
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
            let s = match &mut sink {
                Some(s) => s,
                None => sink.insert(Sink::open(dir, &frame)?),
            };
            match s.write(&frame, bucket_ms)? {
                None => tally.done(i, e),
                Some(why) => tally.skipped(format!("{}/{}: {why}", p.source, e.seq)),
            }
        }
        if let Some(s) = sink.take() {
            s.finish()?;
        }
    }
    progress.finish();
    Ok(tally.finish(dir.display().to_string(), interrupted))
}

/// An H.264 camera's stream and its timestamps.
struct VideoOut {
    path: PathBuf,
    out: BufWriter<File>,
    times_path: PathBuf,
    times: BufWriter<File>,
    /// A keyframe was written: the frames after it decode.
    started: bool,
}

/// One line of `{source}.timestamps.ndjson`.
#[derive(Serialize)]
struct AccessUnitLine {
    capture_ns: i64,
    seq: u64,
    bucket: i64,
    keyframe: bool,
}

impl VideoOut {
    fn create(dir: &Path, source: &str) -> Result<Self, ReplayError> {
        let path = dir.join(format!("{source}.h264"));
        let times_path = dir.join(format!("{source}.timestamps.ndjson"));
        let out = File::create(&path).map_err(ReplayError::output(&path, "create"))?;
        let times =
            File::create(&times_path).map_err(ReplayError::output(&times_path, "create"))?;
        Ok(VideoOut {
            path,
            out: BufWriter::with_capacity(1 << 20, out),
            times_path,
            times: BufWriter::new(times),
            started: false,
        })
    }

    fn write(
        &mut self,
        f: &Frame,
        keyframe: bool,
        bucket_ms: u32,
    ) -> Result<Option<String>, ReplayError> {
        self.started |= keyframe;
        if !self.started {
            return Ok(Some(
                "an H.264 frame before the export's first keyframe (it cannot be decoded)".into(),
            ));
        }
        self.out
            .write_all(&f.payload)
            .map_err(ReplayError::output(&self.path, "write"))?;
        let line = AccessUnitLine {
            capture_ns: f.capture_ns,
            seq: f.seq,
            bucket: Bucket::of(f.capture_ns, bucket_ms).0,
            keyframe,
        };
        serde_json::to_writer(&mut self.times, &line)
            .map_err(std::io::Error::from)
            .and_then(|_| self.times.write_all(b"\n"))
            .map_err(ReplayError::output(&self.times_path, "write"))?;
        Ok(None)
    }

    fn finish(mut self) -> Result<(), ReplayError> {
        self.out
            .flush()
            .map_err(ReplayError::output(&self.path, "write"))?;
        self.times
            .flush()
            .map_err(ReplayError::output(&self.times_path, "write"))
    }
}

/// Refuses an output that is not a directory, and a non-empty one without `force`: a second
/// export into the same directory would leave the first one's files beside its own, and nothing
/// would tell which frames belong to which.
fn check_output(dir: &Path, force: bool) -> Result<(), ReplayError> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ReplayError::output(dir, "stat")(e)),
        Ok(m) if !m.is_dir() => Err(ReplayError::OutputNotDirectory {
            path: dir.to_path_buf(),
        }),
        Ok(_) if force => Ok(()),
        Ok(_) => {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .map_err(ReplayError::output(dir, "read directory"))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            if names.is_empty() {
                return Ok(());
            }
            names.sort();
            let holds = match names.len() {
                1 => names[0].clone(),
                n => format!("{}, ... {n} entries", names[0]),
            };
            Err(ReplayError::OutputNotEmpty {
                path: dir.to_path_buf(),
                holds,
            })
        }
    }
}

/// Where one source's frames go.
enum Sink {
    Camera {
        dir: PathBuf,
    },
    Video(Box<VideoOut>),
    Audio(Box<AudioOut>),
    Serial {
        path: PathBuf,
        out: BufWriter<File>,
    },
    Can {
        path: PathBuf,
        out: BufWriter<File>,
        /// The record's lines, written at once.
        line: String,
    },
}

impl Sink {
    fn open(dir: &Path, first: &Frame) -> Result<Self, ReplayError> {
        let source = &*first.source;
        Ok(match first.media {
            Media::Camera {
                codec: Codec::H264, ..
            } => Sink::Video(Box::new(VideoOut::create(dir, source)?)),
            Media::Camera { .. } => {
                let dir = dir.join(source);
                std::fs::create_dir_all(&dir)
                    .map_err(ReplayError::output(&dir, "create directory"))?;
                Sink::Camera { dir }
            }
            Media::Audio {
                sample_rate,
                channels,
                ..
            } => Sink::Audio(Box::new(AudioOut::create(
                dir,
                source,
                sample_rate,
                channels,
            )?)),
            Media::Can { .. } => {
                let path = dir.join(format!("{source}.log"));
                let file = File::create(&path).map_err(ReplayError::output(&path, "create"))?;
                Sink::Can {
                    path,
                    out: BufWriter::with_capacity(1 << 20, file),
                    line: String::new(),
                }
            }
            Media::Serial { .. } => {
                let path = dir.join(format!("{source}.ndjson"));
                let file = File::create(&path).map_err(ReplayError::output(&path, "create"))?;
                Sink::Serial {
                    path,
                    out: BufWriter::with_capacity(1 << 20, file),
                }
            }
        })
    }

    /// Writes a frame; `Ok(Some(why))` when it does not fit this sink and was skipped.
    fn write(&mut self, f: &Frame, bucket_ms: u32) -> Result<Option<String>, ReplayError> {
        match (self, &f.media) {
            (
                Sink::Video(v),
                Media::Camera {
                    codec: Codec::H264,
                    keyframe,
                    ..
                },
            ) => v.write(f, *keyframe, bucket_ms),
            (
                Sink::Camera { dir },
                Media::Camera {
                    codec: Codec::Jpeg, ..
                },
            ) => {
                let path = dir.join(format!("{}-{}.jpg", f.capture_ns, f.seq));
                std::fs::write(&path, &f.payload).map_err(ReplayError::output(&path, "write"))?;
                Ok(None)
            }
            (Sink::Audio(a), Media::Audio { .. }) => a.write(f),
            (Sink::Can { path, out, line }, Media::Can { .. }) => {
                let frames = match rigd_drivers::can_record::decode(&f.payload) {
                    Ok(frames) => frames,
                    Err(e) => return Ok(Some(e.to_string())),
                };
                line.clear();
                for frame in &frames {
                    crate::can::candump::write_line(frame, &f.source, line);
                }
                out.write_all(line.as_bytes())
                    .map_err(ReplayError::output(&*path, "write"))?;
                Ok(None)
            }
            (Sink::Serial { path, out }, Media::Serial { text }) => {
                let line = serial_line(f, *text, bucket_ms);
                serde_json::to_writer(&mut *out, &line)
                    .map_err(std::io::Error::from)
                    .and_then(|_| out.write_all(b"\n"))
                    .map_err(ReplayError::output(&*path, "write"))?;
                Ok(None)
            }
            (_, media) => Ok(Some(format!(
                "a {} frame in a source that started with another modality",
                media.modality().as_str()
            ))),
        }
    }

    fn finish(self) -> Result<(), ReplayError> {
        match self {
            Sink::Camera { .. } => Ok(()),
            Sink::Video(v) => v.finish(),
            Sink::Audio(a) => a.finish(),
            Sink::Serial { path, mut out } | Sink::Can { path, mut out, .. } => {
                out.flush().map_err(ReplayError::output(path, "write"))
            }
        }
    }
}

/// One NDJSON line of a serial source.
#[derive(Debug, Serialize)]
pub struct SerialLine {
    pub capture_ns: i64,
    pub seq: u64,
    pub bucket: i64,
    pub clock: &'static str,
    pub record: String,
    pub encoding: &'static str,
}

pub fn serial_line(f: &Frame, text: bool, bucket_ms: u32) -> SerialLine {
    let (record, encoding) = match std::str::from_utf8(&f.payload) {
        Ok(s) if text => (s.to_string(), "text"),
        _ => (
            base64::engine::general_purpose::STANDARD.encode(&f.payload),
            "base64",
        ),
    };
    SerialLine {
        capture_ns: f.capture_ns,
        seq: f.seq,
        bucket: Bucket::of(f.capture_ns, bucket_ms).0,
        clock: f.clock.as_str(),
        record,
        encoding,
    }
}

/// The 44-byte header of a 16-bit PCM WAV holding `data_bytes` of samples. Pure.
pub fn wav_header(sample_rate: u32, channels: u16, data_bytes: u32) -> [u8; 44] {
    let block_align = channels.saturating_mul(2);
    let mut h = [0u8; 44];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&data_bytes.saturating_add(36).to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes());
    h[22..24].copy_from_slice(&channels.to_le_bytes());
    h[24..28].copy_from_slice(&sample_rate.to_le_bytes());
    h[28..32].copy_from_slice(&(sample_rate.saturating_mul(block_align as u32)).to_le_bytes());
    h[32..34].copy_from_slice(&block_align.to_le_bytes());
    h[34..36].copy_from_slice(&16u16.to_le_bytes());
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&data_bytes.to_le_bytes());
    h
}

/// Where an audio block lands relative to what is written so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Right after the previous block (within the tolerance).
    Contiguous,
    /// This many sample frames of silence go before it.
    Gap(u64),
    /// It starts this many sample frames before the end of what is written (kept, not trimmed).
    Overlap(u64),
}

/// The time line of one WAV: sample frame `n` plays at `first_ns + n / rate`. Pure.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    pub sample_rate: u32,
    pub first_ns: i64,
    /// Sample frames written so far (audio and silence).
    pub written: u64,
}

impl Timeline {
    pub fn place(&self, capture_ns: i64) -> Placement {
        let rate = self.sample_rate.max(1) as i128;
        let end_ns = self.first_ns as i128 + self.written as i128 * 1_000_000_000 / rate;
        let delta = capture_ns as i128 - end_ns;
        if delta.abs() <= GAP_TOLERANCE_NS as i128 {
            Placement::Contiguous
        } else if delta > 0 {
            Placement::Gap((delta * rate / 1_000_000_000) as u64)
        } else {
            Placement::Overlap((-delta * rate / 1_000_000_000) as u64)
        }
    }
}

#[derive(Debug, Serialize)]
struct GapNote {
    /// The block after the gap.
    seq: u64,
    /// Sample frame where the silence starts.
    at_frame: u64,
    start_ns: i64,
    end_ns: i64,
    silence_frames: u64,
}

#[derive(Debug, Serialize)]
struct OverlapNote {
    seq: u64,
    at_frame: u64,
    capture_ns: i64,
    overlap_frames: u64,
}

/// `{source}.gaps.json`.
#[derive(Debug, Serialize)]
struct GapsFile {
    source: String,
    sample_rate: u32,
    channels: u16,
    first_capture_ns: i64,
    blocks: u64,
    audio_frames: u64,
    silence_frames: u64,
    total_frames: u64,
    gaps: Vec<GapNote>,
    overlaps: Vec<OverlapNote>,
}

struct AudioOut {
    path: PathBuf,
    gaps_path: PathBuf,
    out: BufWriter<File>,
    channels: u16,
    timeline: Option<Timeline>,
    data_bytes: u64,
    notes: GapsFile,
}

impl AudioOut {
    fn create(
        dir: &Path,
        source: &str,
        sample_rate: u32,
        channels: u16,
    ) -> Result<Self, ReplayError> {
        let path = dir.join(format!("{source}.wav"));
        let mut out = BufWriter::with_capacity(
            1 << 20,
            File::create(&path).map_err(ReplayError::output(&path, "create"))?,
        );
        out.write_all(&wav_header(sample_rate, channels, 0))
            .map_err(ReplayError::output(&path, "write"))?;
        Ok(AudioOut {
            gaps_path: dir.join(format!("{source}.gaps.json")),
            path,
            out,
            channels,
            timeline: None,
            data_bytes: 0,
            notes: GapsFile {
                source: source.to_string(),
                sample_rate,
                channels,
                first_capture_ns: 0,
                blocks: 0,
                audio_frames: 0,
                silence_frames: 0,
                total_frames: 0,
                gaps: Vec::new(),
                overlaps: Vec::new(),
            },
        })
    }

    fn write(&mut self, f: &Frame) -> Result<Option<String>, ReplayError> {
        let Media::Audio {
            sample_rate,
            channels,
            ..
        } = f.media
        else {
            return Ok(Some("not audio".into()));
        };
        if sample_rate != self.notes.sample_rate || channels != self.channels {
            return Ok(Some(format!(
                "format changed to {sample_rate} Hz x {channels} from {} Hz x {} (one WAV holds one format)",
                self.notes.sample_rate, self.channels
            )));
        }
        let frame_bytes = 2 * channels as u64;
        let frames = f.payload.len() as u64 / frame_bytes.max(1);
        let tl = *self.timeline.get_or_insert(Timeline {
            sample_rate,
            first_ns: f.capture_ns,
            written: 0,
        });
        if self.notes.blocks == 0 {
            self.notes.first_capture_ns = f.capture_ns;
        }
        let silence = match tl.place(f.capture_ns) {
            Placement::Contiguous => 0,
            Placement::Gap(n) => n,
            Placement::Overlap(n) => {
                self.notes.overlaps.push(OverlapNote {
                    seq: f.seq,
                    at_frame: tl.written,
                    capture_ns: f.capture_ns,
                    overlap_frames: n,
                });
                0
            }
        };
        let added = (silence + frames) * frame_bytes;
        if self.data_bytes + added > u32::MAX as u64 - 44 {
            return Ok(Some(format!(
                "{} would pass the 4 GiB WAV limit; export less with --from/--to",
                self.path.display()
            )));
        }
        if silence > 0 {
            let end_ns = tl.first_ns
                + (tl.written as i128 * 1_000_000_000 / sample_rate.max(1) as i128) as i64;
            self.notes.gaps.push(GapNote {
                seq: f.seq,
                at_frame: tl.written,
                start_ns: end_ns,
                end_ns: f.capture_ns,
                silence_frames: silence,
            });
            let zeros = vec![0u8; (64 << 10).min((silence * frame_bytes) as usize)];
            let mut left = silence * frame_bytes;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                self.out
                    .write_all(&zeros[..n])
                    .map_err(ReplayError::output(&self.path, "write"))?;
                left -= n as u64;
            }
        }
        let whole = (frames * frame_bytes) as usize;
        self.out
            .write_all(&f.payload[..whole])
            .map_err(ReplayError::output(&self.path, "write"))?;
        self.data_bytes += added;
        self.notes.blocks += 1;
        self.notes.audio_frames += frames;
        self.notes.silence_frames += silence;
        if let Some(t) = &mut self.timeline {
            t.written += silence + frames;
        }
        Ok(None)
    }

    fn finish(mut self) -> Result<(), ReplayError> {
        let io = |op| ReplayError::output(&self.path, op);
        self.out.flush().map_err(io("write"))?;
        let file = self.out.get_mut();
        file.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
        file.write_all(&wav_header(
            self.notes.sample_rate,
            self.channels,
            self.data_bytes as u32,
        ))
        .map_err(io("write header"))?;
        self.notes.total_frames = self.notes.audio_frames + self.notes.silence_frames;
        let json = serde_json::to_vec_pretty(&self.notes).unwrap_or_default();
        std::fs::write(&self.gaps_path, json).map_err(ReplayError::output(&self.gaps_path, "write"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wav_header_is_canonical_pcm16() {
        let h = wav_header(48_000, 2, 1000);
        assert_eq!(&h[0..4], b"RIFF");
        assert_eq!(u32::from_le_bytes(h[4..8].try_into().unwrap()), 1036);
        assert_eq!(u16::from_le_bytes(h[22..24].try_into().unwrap()), 2);
        assert_eq!(u32::from_le_bytes(h[28..32].try_into().unwrap()), 192_000);
        assert_eq!(u16::from_le_bytes(h[32..34].try_into().unwrap()), 4);
        assert_eq!(u32::from_le_bytes(h[40..44].try_into().unwrap()), 1000);
    }

    #[test]
    fn blocks_are_placed_by_capture_time() {
        let t = Timeline {
            sample_rate: 48_000,
            first_ns: 1_000_000_000,
            written: 1584, // one 33 ms block
        };
        assert_eq!(t.place(1_033_000_000), Placement::Contiguous);
        assert_eq!(t.place(1_034_500_000), Placement::Contiguous);
        assert_eq!(t.place(1_066_000_000), Placement::Gap(1584));
        assert_eq!(t.place(1_000_000_000), Placement::Overlap(1584));
    }

    #[test]
    fn serial_lines_keep_text_and_encode_binary() {
        let mut f = Frame {
            source: "gps".into(),
            seq: 3,
            capture_ns: 66_000_001,
            clock: rigd_drivers::ClockState::Locked,
            media: Media::Serial { text: true },
            payload: bytes::Bytes::from_static(b"$GPRMC*00\r\n"),
        };
        let l = serial_line(&f, true, 33);
        assert_eq!(
            (l.bucket, l.encoding, l.record.as_str()),
            (2, "text", "$GPRMC*00\r\n")
        );
        f.payload = bytes::Bytes::from_static(&[0xff, 0x00]);
        let l = serial_line(&f, false, 33);
        assert_eq!((l.encoding, l.record.as_str()), ("base64", "/wA="));
    }
}
