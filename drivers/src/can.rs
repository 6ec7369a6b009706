//! CAN buses on SocketCAN (`kind = "can"`, feature `can`, Linux): a raw socket on one interface
//! (can0, vcan0), classic CAN and CAN FD, kernel filters, kernel receive stamps; the frames of each
//! bucket batched into one record ([`crate::can_record`]).

use serde::Deserialize;

use crate::can_record::{
    CanFrame, BRS, EFF_FLAG, EFF_MASK, ESI, FD, MAX_CLASSIC_LEN, MAX_FD_LEN, SFF_MASK,
};
use crate::Stamp;

/// Everything the CAN driver needs to open and batch a bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanSettings {
    /// The network interface (`can0`, `vcan0`).
    pub interface: String,
    /// Receive CAN FD frames too (CAN_RAW_FD_FRAMES).
    pub fd: bool,
    /// Kernel filters (CAN_RAW_FILTER); empty: every frame.
    pub filters: Vec<CanFilter>,
    /// Time-bucket width: one record per bucket.
    pub bucket_ms: u32,
}

/// A kernel receive filter: a frame passes when `frame_id & mask == id & mask`. Written as a table
/// `{ id = 0x123, mask = 0x7FF }` or a string `"0x123/0x7FF"` (candump's `id:mask` with a `/`).
/// An `id` or `mask` above 0x7FF (or `extended = true`) matches 29-bit frames only, one within
/// 11 bits standard frames only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CanFilter {
    pub id: u32,
    pub mask: u32,
    pub extended: bool,
}

impl CanFilter {
    /// The filter as the kernel takes it (`struct can_filter`: can_id, can_mask). The frame
    /// format bit is in the mask, so a standard filter never matches an extended frame whose
    /// low 11 bits happen to agree.
    pub fn kernel(&self) -> (u32, u32) {
        if self.extended {
            (
                self.id & EFF_MASK | EFF_FLAG,
                self.mask & EFF_MASK | EFF_FLAG,
            )
        } else {
            (self.id & SFF_MASK, self.mask & SFF_MASK | EFF_FLAG)
        }
    }

    /// What is wrong with it, for `rigd check`.
    pub fn problem(&self) -> Option<String> {
        let max = if self.extended { EFF_MASK } else { SFF_MASK };
        if self.id > max || self.mask > max {
            return Some(format!(
                "id {:#x} / mask {:#x} above {:#x} ({} identifiers)",
                self.id,
                self.mask,
                max,
                if self.extended { "29-bit" } else { "11-bit" }
            ));
        }
        None
    }

    fn new(id: u32, mask: u32, extended: Option<bool>) -> Self {
        Self {
            id,
            mask,
            extended: extended.unwrap_or(id > SFF_MASK || mask > SFF_MASK),
        }
    }
}

impl std::str::FromStr for CanFilter {
    type Err = String;
    /// `0x123/0x7FF`, `123/7FF` (hex either way), or `0x123` alone (mask: every bit of the id's
    /// format).
    fn from_str(s: &str) -> Result<Self, String> {
        let hex = |t: &str| {
            let t = t.trim();
            let t = t
                .strip_prefix("0x")
                .or_else(|| t.strip_prefix("0X"))
                .unwrap_or(t);
            u32::from_str_radix(t, 16).map_err(|_| format!("`{s}`: expected hex id/mask"))
        };
        match s.split_once('/') {
            Some((id, mask)) => Ok(Self::new(hex(id)?, hex(mask)?, None)),
            None => {
                let id = hex(s)?;
                let mask = if id > SFF_MASK { EFF_MASK } else { SFF_MASK };
                Ok(Self::new(id, mask, None))
            }
        }
    }
}

impl<'de> Deserialize<'de> for CanFilter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        struct Table {
            id: u32,
            mask: u32,
            extended: Option<bool>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Table(Table),
        }
        match Either::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "a CAN filter is `{ id = 0x123, mask = 0x7FF }` or \"0x123/0x7FF\"",
            )
        })? {
            Either::Text(s) => s.parse().map_err(serde::de::Error::custom),
            Either::Table(t) => Ok(CanFilter::new(t.id, t.mask, t.extended)),
        }
    }
}

/// A bucket's frames, ready to be one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The first frame's time and the clock's state then: the record's capture time, inside its
    /// bucket.
    pub stamp: Stamp,
    pub frames: Vec<CanFrame>,
}

impl Batch {
    /// The record's payload ([`crate::can_record`]).
    pub fn payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.frames.iter().map(CanFrame::encoded_len).sum());
        crate::can_record::encode(&self.frames, &mut out);
        out
    }
}

/// Most frames in one record: a bus cannot carry more in a bucket (a 1 Mbit/s bus about 8,000
/// frames a second, 264 in 33 ms; CAN FD at 8 Mbit/s a few times that), but a virtual bus has no
/// rate: past this a bucket's frames go out in more than one record.
pub const MAX_RECORD_FRAMES: usize = 8192;

/// Groups frames into one batch per bucket, by each frame's own time, in time order. Pure.
///
/// - A bucket's batch goes out once the bucket has ended and a grace has passed
///   ([`Batcher::ready`]). The kernel stamps a frame when it takes it in and hands it to the
///   sockets a softirq later: microseconds on a quiet rig, tens of milliseconds in a loaded or
///   emulated one, where frames taken in on two CPUs can even reach the socket out of the order
///   of their stamps (seen on vcan in the TCG guest: up to 70 ms). So the frames of a batch are in
///   the order of their stamps (the order they were taken in; the order of arrival among equal
///   stamps), and the grace follows the delivery lag seen ([`Batcher::grace_ns`]: twice the
///   largest of the last 10 s, 50 ms to 2 s).
/// - A frame that still arrives for a bucket already sent keeps its time and goes out in a record
///   of its own bucket at once (counted, `late`): every frame lies in its record's bucket, and
///   every time is the kernel's.
/// - An idle bus makes no batch.
#[derive(Debug)]
pub struct Batcher {
    bucket_ns: i64,
    /// Frames not sent yet, in (time, arrival) order, with the clock's state at their stamp.
    pending: Vec<(CanFrame, crate::ClockState)>,
    /// The end of the last bucket sent.
    sent_until: i64,
    late: u64,
    /// Frames that arrived before one stamped earlier (delivered out of stamp order).
    reordered: u64,
    /// The largest delivery lag of each of the last [`LAG_WINDOWS`] seconds (of read time).
    lags: [i64; LAG_WINDOWS],
    lag_second: i64,
}

/// Seconds of delivery lag the grace remembers.
const LAG_WINDOWS: usize = 10;
/// The grace's bounds: a bucket's record is out this long after the bucket's end at the least
/// (the cost: CAN records reach the uplink 50 ms later than they could on a quiet rig) and at the
/// most (a rig whose CPUs stall for a second, as a TCG guest beside a loaded host's does, holds
/// its CAN records up to 2 s rather than send a frame out of its bucket's order).
pub const MIN_GRACE_NS: i64 = 50_000_000;
pub const MAX_GRACE_NS: i64 = 2_000_000_000;

/// Frames read from the socket in one turn of the capture loop before the stop flag and the
/// buckets' ends are looked at again.
const READS_PER_TURN: usize = 1024;

/// Up to when the buckets may be released after a turn of reads: `seen`, the clock read before
/// the reads, when they ran the socket's queue empty (every frame delivered by then was read);
/// else the newest stamp read (the frames still queued were delivered after it, so stamped about
/// as late or later), never past `seen`.
pub fn release_horizon(seen: i64, drained: bool, last_stamp: i64) -> i64 {
    if drained {
        seen
    } else {
        last_stamp.min(seen)
    }
}

impl Batcher {
    pub fn new(bucket_ms: u32) -> Self {
        Self {
            bucket_ns: i64::from(bucket_ms.max(1)) * 1_000_000,
            pending: Vec::new(),
            sent_until: i64::MIN,
            late: 0,
            reordered: 0,
            lags: [0; LAG_WINDOWS],
            lag_second: i64::MIN,
        }
    }

    fn bucket_of(&self, ns: i64) -> i64 {
        ns.div_euclid(self.bucket_ns)
    }

    /// A frame stamped at `stamp_ns` was read at `read_ns` (both rig clock): its delivery lag.
    pub fn note_delivery(&mut self, stamp_ns: i64, read_ns: i64) {
        let n = LAG_WINDOWS as i64;
        let second = read_ns.div_euclid(1_000_000_000);
        if self.lag_second != i64::MIN && second > self.lag_second {
            // The seconds since the last read start empty (a quiet bus had no lag).
            for s in (self.lag_second + 1)..=second.min(self.lag_second + n) {
                self.lags[s.rem_euclid(n) as usize] = 0;
            }
        }
        self.lag_second = self.lag_second.max(second);
        let slot = &mut self.lags[second.rem_euclid(n) as usize];
        *slot = (*slot).max(read_ns - stamp_ns);
    }

    /// How long after its end a bucket is held open for frames still on their way.
    pub fn grace_ns(&self) -> i64 {
        let lag = self.lags.iter().copied().max().unwrap_or(0);
        lag.saturating_mul(2).clamp(MIN_GRACE_NS, MAX_GRACE_NS)
    }

    /// Adds a frame stamped `stamp` (its `ts_ns` is set here), in the order of its time.
    pub fn push(&mut self, stamp: Stamp, mut frame: CanFrame) {
        frame.ts_ns = stamp.ns;
        if stamp.ns < self.sent_until {
            self.late += 1;
        }
        let at = self.pending.partition_point(|(f, _)| f.ts_ns <= stamp.ns);
        if at < self.pending.len() {
            self.reordered += 1;
        }
        self.pending.insert(at, (frame, stamp.state));
    }

    /// The batches of the buckets that ended at or before `now_ns` minus the grace, in bucket
    /// order (a bucket of more than [`MAX_RECORD_FRAMES`] in several).
    pub fn ready(&mut self, now_ns: i64) -> Vec<Batch> {
        let until = now_ns.saturating_sub(self.grace_ns());
        let mut out = Vec::new();
        while let Some((first, _)) = self.pending.first() {
            let bucket = self.bucket_of(first.ts_ns);
            let end = (bucket + 1) * self.bucket_ns;
            if end > until {
                break;
            }
            self.take_bucket(bucket, &mut out);
        }
        out
    }

    /// When the oldest open bucket may go out: its end plus the grace (ns on the rig clock).
    pub fn closes_at(&self) -> Option<i64> {
        let (first, _) = self.pending.first()?;
        Some((self.bucket_of(first.ts_ns) + 1) * self.bucket_ns + self.grace_ns())
    }

    /// Every open batch, whatever its bucket (the source stops or its device failed).
    pub fn finish(&mut self) -> Vec<Batch> {
        let mut out = Vec::new();
        while let Some((first, _)) = self.pending.first() {
            let bucket = self.bucket_of(first.ts_ns);
            self.take_bucket(bucket, &mut out);
        }
        out
    }

    /// Frames that arrived after their bucket's record was sent.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Frames that arrived before a frame stamped earlier (put in their place).
    pub fn reordered(&self) -> u64 {
        self.reordered
    }

    /// Moves the frames of `bucket` (at the front) into batches.
    fn take_bucket(&mut self, bucket: i64, out: &mut Vec<Batch>) {
        let n = self
            .pending
            .partition_point(|(f, _)| self.bucket_of(f.ts_ns) == bucket);
        let frames: Vec<_> = self.pending.drain(..n).collect();
        for chunk in frames.chunks(MAX_RECORD_FRAMES) {
            let (first, state) = &chunk[0];
            out.push(Batch {
                stamp: Stamp {
                    ns: first.ts_ns,
                    state: *state,
                },
                frames: chunk.iter().map(|(f, _)| f.clone()).collect(),
            });
        }
        self.sent_until = self.sent_until.max((bucket + 1) * self.bucket_ns);
    }
}

/// `CAN_ERR_*` classes in an error frame's `can_id` (linux/can/error.h).
pub mod err {
    /// The controller's state changed (data[1] says which).
    pub const CRTL: u32 = 0x0000_0004;
    /// Bus off.
    pub const BUSOFF: u32 = 0x0000_0040;
    /// The controller restarted (after bus-off).
    pub const RESTARTED: u32 = 0x0000_0100;
}

/// What a bus reported about itself: error frames and bus-off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BusCounts {
    /// Error frames (CAN_ERR_FLAG) received.
    pub error_frames: u64,
    /// Of those, the controller went bus-off.
    pub bus_off: u64,
    /// Of those, the controller restarted.
    pub restarted: u64,
}

impl BusCounts {
    /// Counts `frame` if it is an error frame; true when it reports bus-off.
    pub fn count(&mut self, frame: &CanFrame) -> bool {
        if !frame.is_error() {
            return false;
        }
        self.error_frames += 1;
        let class = frame.id & crate::can_record::EFF_MASK;
        if class & err::RESTARTED != 0 {
            self.restarted += 1;
        }
        if class & err::BUSOFF != 0 {
            self.bus_off += 1;
            return true;
        }
        false
    }
}

/// The frame the kernel handed over in `n` bytes (CAN_MTU for a classic frame, CANFD_MTU for an
/// FD frame), from `struct canfd_frame`'s fields (a classic frame's `len` is its `can_dlc`);
/// `None` for any other size. Its time is set by the [`Batcher`].
pub fn frame_of(n: usize, can_id: u32, len: u8, fd_flags: u8, data: &[u8]) -> Option<CanFrame> {
    /// `CANFD_BRS`, `CANFD_ESI` of `struct canfd_frame`.
    const KERNEL_BRS: u8 = 0x01;
    const KERNEL_ESI: u8 = 0x02;
    let (flags, max) = match n {
        16 => (0, MAX_CLASSIC_LEN),
        72 => {
            let mut f = FD;
            if fd_flags & KERNEL_BRS != 0 {
                f |= BRS;
            }
            if fd_flags & KERNEL_ESI != 0 {
                f |= ESI;
            }
            (f, MAX_FD_LEN)
        }
        _ => return None,
    };
    let len = (len as usize).min(max).min(data.len());
    Some(CanFrame {
        ts_ns: 0,
        id: can_id,
        flags,
        data: data[..len].to_vec(),
    })
}

#[cfg(all(feature = "can", target_os = "linux"))]
pub use device::CanSource;

#[cfg(not(all(feature = "can", target_os = "linux")))]
pub use unavailable::CanSource;

/// Whether this build reads CAN buses.
pub const BUILT: bool = cfg!(all(feature = "can", target_os = "linux"));

#[cfg(all(feature = "can", target_os = "linux"))]
mod device {
    use bytes::Bytes;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{
        frame_of, release_horizon, socket, Batch, Batcher, BusCounts, CanSettings, READS_PER_TURN,
    };
    use crate::{FrameClock, FrameSink, Media, SourceError, Stamp, StopFlag};

    /// Longest wait for the socket before the loop checks the stop flag.
    const POLL: Duration = Duration::from_millis(50);
    /// A hardware stamp further than this from the software one is not on the system's time
    /// (a controller's free-running counter): the software stamp is used.
    const HW_PLAUSIBLE_NS: i64 = 1_000_000_000;

    /// A CAN bus on a SocketCAN interface.
    pub struct CanSource {
        id: String,
        settings: CanSettings,
        clock: Arc<dyn FrameClock>,
        counts: BusCounts,
        /// Opens after the first (the interface went down or away and came back).
        reopened: u64,
        opens: u64,
        /// Frames the kernel dropped (SO_RXQ_OVFL: a full receive queue), in all.
        kernel_drops: u64,
        /// The open socket's own count (SO_RXQ_OVFL counts from its open).
        socket_drops: u32,
        /// Frames delivered out of the order of their stamps, and frames after their bucket's
        /// record, of the sockets before the open one.
        reordered: u64,
        late: u64,
        stamps: Stamps,
        last_error_log: Option<Instant>,
        unlogged_errors: u64,
    }

    /// Which clock stamped the frames.
    #[derive(Debug, Default, Clone, Copy)]
    struct Stamps {
        hardware: u64,
        software: u64,
        /// No kernel stamp: the time of the read.
        read: u64,
    }

    impl CanSource {
        pub fn new(id: &str, settings: CanSettings, clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                settings,
                clock,
                counts: BusCounts::default(),
                reopened: 0,
                opens: 0,
                kernel_drops: 0,
                socket_drops: 0,
                reordered: 0,
                late: 0,
                stamps: Stamps::default(),
                last_error_log: None,
                unlogged_errors: 0,
            }
        }

        fn device_error(&self, message: String, retryable: bool) -> SourceError {
            SourceError::Device {
                source_id: self.id.clone(),
                device: self.settings.interface.clone(),
                message,
                retryable,
            }
        }

        /// The kernel's stamps on the rig clock: hardware when plausible, else software, else now.
        fn stamp(&mut self, ts: socket::Stamps) -> Stamp {
            match (ts.hardware, ts.software) {
                (Some(hw), Some(sw)) if (hw - sw).abs() <= HW_PLAUSIBLE_NS => {
                    self.stamps.hardware += 1;
                    self.clock.map_realtime(hw)
                }
                (Some(hw), None) => {
                    self.stamps.hardware += 1;
                    self.clock.map_realtime(hw)
                }
                (_, Some(sw)) => {
                    self.stamps.software += 1;
                    self.clock.map_realtime(sw)
                }
                (None, None) => {
                    self.stamps.read += 1;
                    self.clock.now()
                }
            }
        }

        fn detail(&self, bus: &socket::Bus, batcher: &Batcher) -> String {
            let s = &self.settings;
            let kind = if s.fd && bus.mtu >= 72 {
                "CAN FD".to_string()
            } else if s.fd {
                format!(
                    "classic only (fd = true but the interface's MTU is {}, not 72)",
                    bus.mtu
                )
            } else {
                "classic".to_string()
            };
            let stamps = if self.stamps.hardware > 0 {
                "hardware"
            } else if self.stamps.software > 0 || self.stamps.read == 0 {
                "software"
            } else {
                "read time"
            };
            format!(
                "{} {kind}, {} filters, {stamps} stamps, grace {} ms; {} error frames, {} bus-off, {} kernel drops, {} reordered, {} late, reopened {}",
                s.interface,
                s.filters.len(),
                batcher.grace_ns() / 1_000_000,
                self.counts.error_frames,
                self.counts.bus_off,
                self.kernel_drops,
                self.reordered + batcher.reordered(),
                self.late + batcher.late(),
                self.reopened
            )
        }

        fn emit(&self, sink: &mut FrameSink, batch: Batch) -> Result<(), SourceError> {
            let media = Media::Can {
                frames: batch.frames.len() as u32,
            };
            sink.emit(batch.stamp, media, Bytes::from(batch.payload()))
                .map_err(|_| SourceError::PipelineClosed {
                    source_id: self.id.clone(),
                })
        }

        fn log_errors(&mut self, n: u64) {
            self.unlogged_errors += n;
            let due = self
                .last_error_log
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
            if due && self.unlogged_errors > 0 {
                tracing::warn!(source = %self.id, interface = %self.settings.interface,
                    error_frames = self.unlogged_errors, total = self.counts.error_frames,
                    bus_off = self.counts.bus_off, "can: error frames on the bus");
                self.unlogged_errors = 0;
                self.last_error_log = Some(Instant::now());
            }
        }

        /// Reads until stopped or the interface fails; the open batch goes out either way.
        fn capture(
            &mut self,
            bus: &mut socket::Bus,
            sink: &mut FrameSink,
            stop: &StopFlag,
            batcher: &mut Batcher,
        ) -> Result<(), SourceError> {
            let mut last_detail = Instant::now();
            loop {
                if stop.is_raised() {
                    return Ok(());
                }
                let wait = match batcher.closes_at() {
                    Some(at) => {
                        let left = at - self.clock.now().ns;
                        POLL.min(Duration::from_nanos(left.max(0) as u64))
                    }
                    None => POLL,
                };
                bus.wait(wait)
                    .map_err(|e| self.device_error(format!("poll failed: {e}"), true))?;
                // The time before the reads: every frame the socket had by then is read below
                // when the queue runs empty, so only a frame delivered after it (stamped earlier
                // on another CPU) can still come for a bucket this releases. Read after the reads,
                // a thread preempted between its last read and the clock (a loaded or emulated
                // rig) would release buckets whose frames were queued meanwhile: late frames.
                let seen = self.clock.now().ns;
                let mut drained = false;
                let mut last_stamp = i64::MIN;
                for _ in 0..READS_PER_TURN {
                    let got = bus.read().map_err(|e| self.read_error(e))?;
                    let Some(read) = got else {
                        drained = true;
                        break;
                    };
                    if let Some(dropped) = read.dropped {
                        let new = dropped.wrapping_sub(self.socket_drops);
                        if new > 0 {
                            sink.health().add_drops(u64::from(new));
                            self.kernel_drops += u64::from(new);
                            tracing::warn!(source = %self.id, dropped = new,
                                "can: the kernel dropped frames (the socket's receive queue was full)");
                        }
                        self.socket_drops = dropped;
                    }
                    let Some(frame) =
                        frame_of(read.bytes, read.can_id, read.len, read.flags, &read.data)
                    else {
                        continue;
                    };
                    if frame.is_error() {
                        let bus_off = self.counts.count(&frame);
                        if bus_off {
                            tracing::warn!(source = %self.id, interface = %self.settings.interface,
                                bus_off = self.counts.bus_off, "can: controller bus-off");
                        }
                        self.log_errors(1);
                    }
                    let stamp = self.stamp(read.stamps);
                    batcher.note_delivery(stamp.ns, self.clock.now().ns);
                    last_stamp = last_stamp.max(stamp.ns);
                    batcher.push(stamp, frame);
                }
                for batch in batcher.ready(release_horizon(seen, drained, last_stamp)) {
                    self.emit(sink, batch)?;
                }
                if last_detail.elapsed() >= Duration::from_secs(1) {
                    sink.health().set_detail(&self.detail(bus, batcher));
                    last_detail = Instant::now();
                }
            }
        }

        fn read_error(&self, e: std::io::Error) -> SourceError {
            let why = match e.raw_os_error() {
                Some(libc::ENETDOWN) => "the interface went down".to_string(),
                Some(libc::ENODEV) => "the interface is gone".to_string(),
                _ => format!("read failed: {e}"),
            };
            self.device_error(why, true)
        }
    }

    impl crate::Source for CanSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
            let mut bus = socket::Bus::open(&self.settings).map_err(|e| {
                let retryable = e.retryable;
                self.device_error(e.message, retryable)
            })?;
            self.opens += 1;
            if self.opens > 1 {
                self.reopened += 1;
            }
            // A new socket counts its kernel drops from 0.
            self.socket_drops = 0;
            let mut batcher = Batcher::new(self.settings.bucket_ms);
            sink.health().set_detail(&self.detail(&bus, &batcher));
            tracing::info!(source = %self.id, interface = %self.settings.interface,
                mtu = bus.mtu, fd = self.settings.fd, filters = self.settings.filters.len(),
                reopened = self.reopened, "can: bus open");
            let result = self.capture(&mut bus, sink, stop, &mut batcher);
            // What was read goes out whatever ended the capture.
            let last = batcher
                .finish()
                .into_iter()
                .try_for_each(|batch| self.emit(sink, batch));
            if batcher.reordered() > 0 || batcher.late() > 0 {
                tracing::info!(source = %self.id, reordered = batcher.reordered(), late = batcher.late(),
                    "can: frames delivered out of the order of their stamps (put in place), frames after their bucket's record (a record of their own)");
            }
            sink.health().set_detail(&self.detail(&bus, &batcher));
            self.reordered += batcher.reordered();
            self.late += batcher.late();
            result.and(last)
        }
    }
}

/// The raw CAN socket: open, filters, stamps, one frame per read. The only unsafe code of the
/// driver, each block with why it is sound.
#[cfg(all(feature = "can", target_os = "linux"))]
#[allow(unsafe_code)]
mod socket {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    use super::CanSettings;

    /// `SO_TIMESTAMPING` and its control message (asm-generic; the same on x86_64 and arm64,
    /// where `struct timespec` is 64-bit either way). libc does not name it for Linux.
    const SO_TIMESTAMPING: libc::c_int = 37;
    /// `SO_RXQ_OVFL`: a control message with the socket's dropped-frame count.
    const SO_RXQ_OVFL: libc::c_int = 40;
    /// `SOCK_RAW` sockets of `PF_CAN`.
    const CAN_RAW: libc::c_int = 1;
    const SOL_CAN_RAW: libc::c_int = 101;
    const CAN_RAW_FILTER: libc::c_int = 1;
    const CAN_RAW_ERR_FILTER: libc::c_int = 2;
    const CAN_RAW_FD_FRAMES: libc::c_int = 5;
    /// Every error class (CAN_ERR_MASK).
    const CAN_ERR_MASK: u32 = 0x1FFF_FFFF;
    /// `ARPHRD_CAN`: /sys/class/net/IF/type of a CAN interface.
    const ARPHRD_CAN: u32 = 280;
    /// The receive queue asked for (the kernel caps it at net.core.rmem_max without
    /// CAP_NET_ADMIN): at 2,000 frames a second about a second of frames.
    const RCVBUF: libc::c_int = 2 << 20;

    /// Why the bus did not open.
    pub struct OpenError {
        pub message: String,
        pub retryable: bool,
    }

    /// The kernel's stamps of one frame, ns since the Unix epoch.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Stamps {
        pub software: Option<i64>,
        pub hardware: Option<i64>,
    }

    /// One frame as read.
    pub struct Read {
        /// CAN_MTU (16) or CANFD_MTU (72).
        pub bytes: usize,
        pub can_id: u32,
        pub len: u8,
        pub flags: u8,
        pub data: [u8; 64],
        pub stamps: Stamps,
        /// The socket's dropped-frame count, when the kernel sent it.
        pub dropped: Option<u32>,
    }

    /// `struct canfd_frame` (a classic `struct can_frame` is its first 16 bytes).
    #[repr(C)]
    struct CanFdFrame {
        can_id: u32,
        len: u8,
        flags: u8,
        res0: u8,
        res1: u8,
        data: [u8; 64],
    }

    /// `struct sockaddr_can` with the transport-protocol addresses left zero.
    #[repr(C)]
    struct SockaddrCan {
        can_family: libc::sa_family_t,
        can_ifindex: libc::c_int,
        addr: [u64; 2],
    }

    /// An open raw socket bound to one interface.
    pub struct Bus {
        fd: OwnedFd,
        pub mtu: u32,
        /// Control messages of one read (8-byte aligned).
        control: [u64; 32],
    }

    fn sys(name: &str, interface: &str) -> Option<String> {
        std::fs::read_to_string(format!("/sys/class/net/{interface}/{name}"))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn setsockopt<T>(
        fd: &OwnedFd,
        level: libc::c_int,
        name: libc::c_int,
        value: &[T],
    ) -> std::io::Result<()> {
        // SAFETY: `value` is a live slice of plain integers/structs of the layout the option
        // expects; the kernel reads `size_of_val(value)` bytes from it during the call.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                value.as_ptr().cast(),
                std::mem::size_of_val(value) as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    impl Bus {
        pub fn open(s: &CanSettings) -> Result<Self, OpenError> {
            let name = &s.interface;
            let retry = |message: String| OpenError {
                message,
                retryable: true,
            };
            let Some(ifindex) = sys("ifindex", name).and_then(|v| v.parse::<libc::c_int>().ok())
            else {
                return Err(retry(format!(
                    "no interface {name} (not there yet, or gone)"
                )));
            };
            match sys("type", name).and_then(|v| v.parse::<u32>().ok()) {
                Some(ARPHRD_CAN) | None => {}
                Some(other) => {
                    return Err(OpenError {
                        message: format!(
                            "{name} is not a CAN interface (type {other}, not {ARPHRD_CAN})"
                        ),
                        retryable: false,
                    })
                }
            }
            let flags = sys("flags", name)
                .and_then(|v| u32::from_str_radix(v.trim_start_matches("0x"), 16).ok())
                .unwrap_or(0);
            if flags & libc::IFF_UP as u32 == 0 {
                return Err(retry(format!("interface {name} is down")));
            }
            let mtu = sys("mtu", name).and_then(|v| v.parse().ok()).unwrap_or(16);
            let os = |what: &str, e: std::io::Error| retry(format!("{what}: {e}"));
            // SAFETY: plain socket(2); the descriptor is owned by the OwnedFd below.
            let raw =
                unsafe { libc::socket(libc::PF_CAN, libc::SOCK_RAW | libc::SOCK_CLOEXEC, CAN_RAW) };
            if raw < 0 {
                let e = std::io::Error::last_os_error();
                return Err(OpenError {
                    retryable: e.raw_os_error() != Some(libc::EAFNOSUPPORT),
                    message: format!("CAN socket: {e} (is the can and can_raw module there?)"),
                });
            }
            // SAFETY: `raw` is a new descriptor nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            if s.fd {
                setsockopt(&fd, SOL_CAN_RAW, CAN_RAW_FD_FRAMES, &[1 as libc::c_int])
                    .map_err(|e| os("CAN_RAW_FD_FRAMES", e))?;
            }
            if !s.filters.is_empty() {
                let filters: Vec<[u32; 2]> = s
                    .filters
                    .iter()
                    .map(|f| {
                        let (id, mask) = f.kernel();
                        [id, mask]
                    })
                    .collect();
                setsockopt(&fd, SOL_CAN_RAW, CAN_RAW_FILTER, &filters)
                    .map_err(|e| os("CAN_RAW_FILTER", e))?;
            }
            setsockopt(&fd, SOL_CAN_RAW, CAN_RAW_ERR_FILTER, &[CAN_ERR_MASK])
                .map_err(|e| os("CAN_RAW_ERR_FILTER", e))?;
            let stamping = libc::SOF_TIMESTAMPING_RX_SOFTWARE
                | libc::SOF_TIMESTAMPING_SOFTWARE
                | libc::SOF_TIMESTAMPING_RX_HARDWARE
                | libc::SOF_TIMESTAMPING_RAW_HARDWARE;
            setsockopt(&fd, libc::SOL_SOCKET, SO_TIMESTAMPING, &[stamping])
                .map_err(|e| os("SO_TIMESTAMPING", e))?;
            setsockopt(&fd, libc::SOL_SOCKET, SO_RXQ_OVFL, &[1 as libc::c_int])
                .map_err(|e| os("SO_RXQ_OVFL", e))?;
            // Past rmem_max with CAP_NET_ADMIN; otherwise up to rmem_max.
            if setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &[RCVBUF]).is_err() {
                let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &[RCVBUF]);
            }
            let addr = SockaddrCan {
                can_family: libc::AF_CAN as libc::sa_family_t,
                can_ifindex: ifindex,
                addr: [0; 2],
            };
            // SAFETY: `addr` is a sockaddr_can of the size passed, alive for the call.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&addr as *const SockaddrCan).cast(),
                    std::mem::size_of::<SockaddrCan>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                return Err(os(
                    &format!("bind to {name}"),
                    std::io::Error::last_os_error(),
                ));
            }
            Ok(Bus {
                fd,
                mtu,
                control: [0; 32],
            })
        }

        /// Waits up to `d` for a frame or an error; true when the socket has one.
        pub fn wait(&self, d: Duration) -> std::io::Result<bool> {
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = d.as_millis().min(i32::MAX as u128) as libc::c_int;
            // SAFETY: one valid pollfd, alive for the call.
            let rc = unsafe { libc::poll(&mut p, 1, ms) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                return if e.kind() == std::io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                };
            }
            Ok(rc > 0)
        }

        /// One frame without waiting; `None` when the queue is empty.
        pub fn read(&mut self) -> std::io::Result<Option<Read>> {
            let mut frame = CanFdFrame {
                can_id: 0,
                len: 0,
                flags: 0,
                res0: 0,
                res1: 0,
                data: [0; 64],
            };
            let mut iov = libc::iovec {
                iov_base: (&mut frame as *mut CanFdFrame).cast(),
                iov_len: std::mem::size_of::<CanFdFrame>(),
            };
            // SAFETY: msghdr is plain old data; all-zero is valid (no name, no control yet).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = self.control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&self.control) as _;
            // SAFETY: `msg` points at `iov` (into `frame`) and `self.control`, all alive and
            // writable for the call, with their sizes.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
                    _ => Err(e),
                };
            }
            let mut stamps = Stamps::default();
            let mut dropped = None;
            // SAFETY: the CMSG_* walk stays inside the control buffer the kernel filled
            // (msg_controllen), and each payload is read unaligned with the size the kernel
            // gives for its type.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    let h = &*c;
                    let data = libc::CMSG_DATA(c);
                    if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == SO_TIMESTAMPING {
                        let ts = std::ptr::read_unaligned(data.cast::<[libc::timespec; 3]>());
                        // `as i64`: time_t and c_long are i64 on the 64-bit targets, not on all.
                        #[allow(clippy::unnecessary_cast)]
                        let ns = |t: libc::timespec| {
                            (t.tv_sec != 0 || t.tv_nsec != 0)
                                .then(|| t.tv_sec as i64 * 1_000_000_000 + t.tv_nsec as i64)
                        };
                        stamps.software = ns(ts[0]);
                        stamps.hardware = ns(ts[2]);
                    } else if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == SO_RXQ_OVFL {
                        dropped = Some(std::ptr::read_unaligned(data.cast::<u32>()));
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            Ok(Some(Read {
                bytes: n as usize,
                can_id: frame.can_id,
                len: frame.len,
                flags: frame.flags,
                data: frame.data,
                stamps,
                dropped,
            }))
        }
    }
}
#[cfg(not(all(feature = "can", target_os = "linux")))]
mod unavailable {
    use std::sync::Arc;

    use super::CanSettings;
    use crate::{FrameClock, FrameSink, Source, SourceError, StopFlag};

    /// Stand-in when rigd-drivers is built without the `can` feature: fails for good.
    pub struct CanSource {
        id: String,
        interface: String,
    }

    impl CanSource {
        pub fn new(id: &str, settings: CanSettings, _clock: Arc<dyn FrameClock>) -> Self {
            Self {
                id: id.to_string(),
                interface: settings.interface,
            }
        }
    }

    impl Source for CanSource {
        fn id(&self) -> &str {
            &self.id
        }

        fn run(&mut self, _sink: &mut FrameSink, _stop: &StopFlag) -> Result<(), SourceError> {
            Err(SourceError::not_built(&self.id, &self.interface, "can"))
        }
    }
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    #[test]
    fn filters_read_as_tables_or_strings_and_take_the_frame_format_from_their_size() {
        let f: CanFilter = "0x100/0x700".parse().unwrap();
        assert_eq!(
            f,
            CanFilter {
                id: 0x100,
                mask: 0x700,
                extended: false
            }
        );
        assert_eq!(f.kernel(), (0x100, 0x700 | EFF_FLAG));
        let e: CanFilter = "18FEF100/1FFFFFFF".parse().unwrap();
        assert!(e.extended);
        assert_eq!(e.kernel(), (0x18FE_F100 | EFF_FLAG, 0x1FFF_FFFF | EFF_FLAG));
        let alone: CanFilter = "0x123".parse().unwrap();
        assert_eq!(alone.mask, 0x7FF);
        assert!("0x12G/0x7FF".parse::<CanFilter>().is_err());

        let d = serde::de::value::StrDeserializer::<serde::de::value::Error>::new("0x200/0x700");
        assert_eq!(
            CanFilter::deserialize(d).unwrap().kernel(),
            (0x200, 0x700 | EFF_FLAG)
        );
        let big = CanFilter {
            id: 0x800,
            mask: 0x7FF,
            extended: false,
        };
        assert!(big.problem().is_some());
        assert!(f.problem().is_none());
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use crate::ClockState;

    const B: i64 = 33_000_000;
    const G: i64 = MIN_GRACE_NS;

    fn at(ns: i64) -> Stamp {
        Stamp {
            ns,
            state: ClockState::Locked,
        }
    }

    fn f(id: u32) -> CanFrame {
        CanFrame {
            ts_ns: 0,
            id,
            flags: 0,
            data: vec![id as u8],
        }
    }

    fn ids(b: &Batch) -> Vec<u32> {
        b.frames.iter().map(|f| f.id).collect()
    }

    #[test]
    fn one_batch_per_bucket_once_the_bucket_and_its_grace_are_over() {
        let mut b = Batcher::new(33);
        b.push(at(100 * B + 1), f(1));
        b.push(at(100 * B + 5), f(2));
        b.push(at(101 * B - 1), f(3));
        b.push(at(101 * B), f(4));
        assert_eq!(b.closes_at(), Some(101 * B + G));
        assert!(b.ready(101 * B + G - 1).is_empty(), "inside the grace");
        let out = b.ready(101 * B + G);
        assert_eq!(out.len(), 1);
        assert_eq!(ids(&out[0]), [1, 2, 3]);
        assert_eq!(out[0].stamp, at(100 * B + 1));
        assert_eq!(
            out[0].frames.iter().map(|f| f.ts_ns).collect::<Vec<_>>(),
            [100 * B + 1, 100 * B + 5, 101 * B - 1]
        );
        // A skipped bucket (an idle bus) makes no batch.
        b.push(at(103 * B + 7), f(5));
        let out = b.ready(110 * B);
        assert_eq!(out.iter().map(ids).collect::<Vec<_>>(), [vec![4], vec![5]]);
        assert!(b.ready(200 * B).is_empty(), "an idle bus sends nothing");
        assert!(b.finish().is_empty());
        assert_eq!((b.late(), b.reordered()), (0, 0));
    }

    #[test]
    fn frames_delivered_out_of_stamp_order_are_put_in_their_place() {
        // Two CPUs' backlogs: frames 3 and 4 reach the socket before 1 and 2, stamped earlier.
        let mut b = Batcher::new(33);
        b.push(at(5 * B + 300), f(3));
        b.push(at(6 * B + 10), f(4));
        b.push(at(5 * B + 100), f(1));
        b.push(at(5 * B + 200), f(2));
        b.push(at(5 * B + 200), f(22)); // the same stamp: arrival order
        let out = b.finish();
        assert_eq!(
            out.iter().map(ids).collect::<Vec<_>>(),
            [vec![1, 2, 22, 3], vec![4]]
        );
        assert_eq!(out[0].stamp.ns, 5 * B + 100);
        assert_eq!(b.reordered(), 3);
        assert_eq!(b.late(), 0);
    }

    #[test]
    fn a_late_frame_keeps_its_time_in_a_record_of_its_own_bucket() {
        let mut b = Batcher::new(33);
        b.push(at(10 * B + 3), f(1));
        assert_eq!(b.ready(11 * B + G).len(), 1);
        b.push(at(11 * B - 10), f(2));
        b.push(at(11 * B + 5), f(3));
        let out = b.ready(12 * B + G);
        assert_eq!(out.iter().map(ids).collect::<Vec<_>>(), [vec![2], vec![3]]);
        assert_eq!(out[0].frames[0].ts_ns, 11 * B - 10);
        assert_eq!(b.late(), 1);
    }

    #[test]
    fn the_grace_follows_the_delivery_lag_of_the_last_ten_seconds() {
        let mut b = Batcher::new(33);
        let s = 1_000_000_000;
        b.note_delivery(100 * s, 100 * s + 500_000);
        assert_eq!(b.grace_ns(), MIN_GRACE_NS, "0.5 ms lag: the floor");
        b.note_delivery(101 * s, 101 * s + 70_000_000);
        assert_eq!(b.grace_ns(), 140_000_000, "twice the largest lag");
        b.note_delivery(105 * s, 105 * s + 1_000_000);
        assert_eq!(b.grace_ns(), 140_000_000, "remembered");
        b.note_delivery(111 * s + 1, 111 * s + 1_000_001);
        assert_eq!(b.grace_ns(), MIN_GRACE_NS, "forgotten after ten seconds");
        b.note_delivery(112 * s, 112 * s + 1_500_000_000);
        assert_eq!(b.grace_ns(), MAX_GRACE_NS, "bounded");
        // The open bucket waits for it.
        b.push(at(3400 * B), f(1));
        assert!(b.ready(3401 * B + MAX_GRACE_NS - 1).is_empty());
        assert_eq!(b.ready(3401 * B + MAX_GRACE_NS).len(), 1);
    }

    #[test]
    fn a_turn_releases_up_to_the_clock_before_its_reads_or_its_newest_stamp_when_frames_are_left() {
        // The queue ran empty: everything delivered before the clock read was read.
        assert_eq!(release_horizon(10 * B, true, 9 * B), 10 * B);
        assert_eq!(
            release_horizon(10 * B, true, i64::MIN),
            10 * B,
            "no frame this turn"
        );
        // Frames left in the queue (a turn's limit): no further than the newest stamp read.
        assert_eq!(release_horizon(10 * B, false, 4 * B), 4 * B);
        assert_eq!(
            release_horizon(10 * B, false, 12 * B),
            10 * B,
            "never past the clock"
        );
        // What that keeps open: a bucket whose frames may still be queued.
        let mut b = Batcher::new(33);
        b.push(at(4 * B + 1), f(1));
        assert!(b
            .ready(release_horizon(5 * B + MIN_GRACE_NS, false, 4 * B + 1))
            .is_empty());
        assert_eq!(
            b.ready(release_horizon(5 * B + MIN_GRACE_NS, true, 4 * B + 1))
                .len(),
            1
        );
    }

    #[test]
    fn a_flood_is_cut_into_records_of_at_most_the_limit() {
        let mut b = Batcher::new(33);
        for i in 0..(MAX_RECORD_FRAMES as i64 + 10) {
            b.push(at(B + i), f(i as u32));
        }
        let out = b.finish();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].frames.len(), MAX_RECORD_FRAMES);
        assert_eq!(out[1].frames.len(), 10);
        assert_eq!(
            crate::can_record::decode(&out[1].payload()).unwrap(),
            out[1].frames
        );
    }

    #[test]
    fn kernel_frames_become_records_flags() {
        let data = [0xAB; 64];
        let classic = frame_of(16, 0x123, 4, 0, &data).unwrap();
        assert_eq!((classic.flags, classic.data.len()), (0, 4));
        // A classic frame's len is never above 8, whatever the byte says.
        assert_eq!(frame_of(16, 0x123, 15, 0, &data).unwrap().data.len(), 8);
        let fd = frame_of(72, 0x456, 64, 0x01, &data).unwrap();
        assert_eq!(fd.flags, FD | BRS);
        assert_eq!(fd.data.len(), 64);
        assert_eq!(frame_of(72, 1, 12, 0x02, &data).unwrap().flags, FD | ESI);
        assert!(frame_of(20, 1, 1, 0, &data).is_none());
    }

    #[test]
    fn error_frames_and_bus_off_are_counted() {
        let mut c = BusCounts::default();
        assert!(!c.count(&f(0x123)));
        let mut e = f(crate::can_record::ERR_FLAG | err::CRTL);
        assert!(!c.count(&e));
        e.id = crate::can_record::ERR_FLAG | err::BUSOFF;
        assert!(c.count(&e));
        e.id = crate::can_record::ERR_FLAG | err::RESTARTED;
        assert!(!c.count(&e));
        assert_eq!(
            c,
            BusCounts {
                error_frames: 3,
                bus_off: 1,
                restarted: 1
            }
        );
    }
}
