//! A hardware video encoder behind the V4L2 memory-to-memory stateful encoder interface (the
//! kernel's "Memory-to-Memory Stateful Video Encoder Interface", dev-encoder.rst): Raspberry Pi's
//! bcm2835-codec, Jetson's and Qualcomm's encoders, and the kernel's `vicodec` test driver (FWHT)
//! all take the same calls:
//!
//! - VIDIOC_QUERYCAP: `V4L2_CAP_VIDEO_M2M` (single-planar queues) or `_M2M_MPLANE`;
//! - S_FMT on the CAPTURE queue first (the coded format: H264 on real hardware, FWHT on vicodec),
//!   then on the OUTPUT queue (the raw format: YUV420 or NV12, one plane);
//! - the controls rigd has hints for, set when the device has them and reported when not
//!   (bitrate, GOP size, FORCE_KEY_FRAME, no B-frames, SPS/PPS in front of every IDR);
//! - REQBUFS and mmap on both queues, every CAPTURE buffer queued, STREAMON on both;
//! - per frame: the raw picture copied into a free OUTPUT buffer (a counted copy), QBUF with the
//!   caller's timestamp, then DQBUF of the coded CAPTURE buffer that carries the same timestamp
//!   back (drivers copy OUTPUT timestamps to CAPTURE, `V4L2_BUF_FLAG_TIMESTAMP_COPY`): that is
//!   how a coded frame is matched to its raw one;
//! - at the end V4L2_ENC_CMD_STOP and the drain up to the buffer flagged LAST ([`M2mEncoder::finish`]),
//!   and STREAMOFF on both queues when the encoder is dropped.
//!
//! Every wait is a `poll` with a deadline ([`M2mEncoder::set_timeout`], 2 s by default): a device
//! that stops answering is an error within that time, never a hang. A device that vanishes
//! (ENODEV, EIO, POLLHUP), fails a buffer (`V4L2_BUF_FLAG_ERROR`) or times out is an
//! [`M2mError::Device`]; the encoder then refuses further frames, and the caller treats it like
//! a camera that fails (reopen with backoff, or fall back to software).
//!
//! One frame is in flight at a time (`encode` returns that frame's coded bytes): the keyframe a
//! caller asks for lands on its frame. With FORCE_KEY_FRAME the control is set before the QBUF;
//! without it (vicodec) the encoder's reset sequence forces one: drain (ENC_CMD_STOP), STREAMOFF
//! and STREAMON on CAPTURE, after which the stream is independent of what came before.
//!
//! Whether a coded frame is a keyframe: the buffer's `V4L2_BUF_FLAG_KEYFRAME`/`PFRAME` when the
//! driver sets them; otherwise read from the bitstream (an FWHT header's I-frame flag; an H.264
//! IDR slice). vicodec's encoder sets neither flag: its FWHT headers say it.
//!
//! Copies: a raw frame handed to [`M2mEncoder::encode`] is copied once into the device's OUTPUT
//! buffer (counted in [`M2mStats`]); a coded frame is copied once out of its CAPTURE buffer. An
//! encoder opened with [`M2mEncoder::open_dmabuf`] imports the caller's buffers instead
//! (`V4L2_MEMORY_DMABUF`, [`M2mEncoder::encode_dmabuf`]: a camera buffer exported with
//! VIDIOC_EXPBUF, in the layout the encoder answered): no copy, counted as imported.
//!
//! [`M2mDecoder`] drives the stateful decoder interface for one resolution (the source-change
//! event, then the CAPTURE queue): the camera guest's check decodes what the encoder made with
//! the kernel's own decoder (vicodec's) and compares pictures.
#![allow(unsafe_code)] // V4L2 ioctls, mmap and poll; every block says why it is sound

use std::fs::File;
use std::io;
use std::os::raw::c_void;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use v4l::v4l2::vidioc;
use v4l::v4l_sys::{
    v4l2_buffer, v4l2_capability, v4l2_control, v4l2_encoder_cmd, v4l2_event,
    v4l2_event_subscription, v4l2_fmtdesc, v4l2_format, v4l2_plane, v4l2_queryctrl,
    v4l2_requestbuffers,
};

const CAP_VIDEO_M2M_MPLANE: u32 = 0x0000_4000;
const CAP_VIDEO_M2M: u32 = 0x0000_8000;
const CAP_DEVICE_CAPS: u32 = 0x8000_0000;
const BUF_CAPTURE: u32 = 1;
const BUF_OUTPUT: u32 = 2;
const BUF_CAPTURE_MPLANE: u32 = 9;
const BUF_OUTPUT_MPLANE: u32 = 10;
const MEMORY_MMAP: u32 = 1;
const MEMORY_DMABUF: u32 = 4;
const FIELD_NONE: u32 = 1;
const FLAG_KEYFRAME: u32 = 0x0000_0008;
const FLAG_PFRAME: u32 = 0x0000_0010;
const FLAG_BFRAME: u32 = 0x0000_0020;
const FLAG_ERROR: u32 = 0x0000_0040;
const FLAG_LAST: u32 = 0x0010_0000;
const CTRL_FLAG_DISABLED: u32 = 0x0001;
const CTRL_FLAG_READ_ONLY: u32 = 0x0004;
const CTRL_FLAG_INACTIVE: u32 = 0x0010;
const ENC_CMD_STOP: u32 = 1;
const DEC_CMD_STOP: u32 = 1;
const EVENT_SOURCE_CHANGE: u32 = 5;
const MAX_PLANES: usize = 8;

/// Codec controls (V4L2_CID_CODEC_BASE + n).
pub const CID_MPEG_VIDEO_B_FRAMES: u32 = 0x0099_09ca;
pub const CID_MPEG_VIDEO_GOP_SIZE: u32 = 0x0099_09cb;
pub const CID_MPEG_VIDEO_BITRATE: u32 = 0x0099_09cf;
pub const CID_MPEG_VIDEO_REPEAT_SEQ_HEADER: u32 = 0x0099_09e2;
pub const CID_MPEG_VIDEO_FORCE_KEY_FRAME: u32 = 0x0099_09e5;
pub const CID_MPEG_VIDEO_H264_I_PERIOD: u32 = 0x0099_0a66;
pub const CID_FWHT_I_FRAME_QP: u32 = 0x0099_0a22;
pub const CID_FWHT_P_FRAME_QP: u32 = 0x0099_0a23;

/// `_IOC(dir, 'V', nr, size)` for the requests `v4l::v4l2::vidioc` lacks.
const fn ioc(dir: u32, nr: u32, size: usize) -> vidioc::_IOC_TYPE {
    ((dir << 30) | ((size as u32) << 16) | ((b'V' as u32) << 8) | nr) as vidioc::_IOC_TYPE
}
const VIDIOC_DQEVENT: vidioc::_IOC_TYPE = ioc(2, 89, std::mem::size_of::<v4l2_event>());
const VIDIOC_SUBSCRIBE_EVENT: vidioc::_IOC_TYPE =
    ioc(1, 90, std::mem::size_of::<v4l2_event_subscription>());
const VIDIOC_DECODER_CMD: vidioc::_IOC_TYPE =
    ioc(3, 96, std::mem::size_of::<v4l::v4l_sys::v4l2_decoder_cmd>());

/// How an M2M device failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The device went away (ENODEV, ENXIO, EIO, POLLHUP): unplugged, unbound, its driver gone.
    Gone,
    /// An ioctl failed or the driver flagged a buffer `V4L2_BUF_FLAG_ERROR`.
    Error,
    /// Nothing came back before the deadline.
    Timeout,
}

#[derive(Debug, thiserror::Error)]
pub enum M2mError {
    /// The device cannot be used as asked (not M2M, the coded or raw format not offered, ...).
    #[error("{device}: {what}")]
    Unsupported { device: String, what: String },
    /// The device failed while encoding: handled like a camera that fails.
    #[error("{device}: {what} ({failure:?})")]
    Device {
        device: String,
        what: String,
        failure: Failure,
    },
    /// The caller's frame does not fit the format set at open; the encoder stays usable.
    #[error(
        "{device}: a frame of {got} bytes in {planes} planes; {want} bytes of {layout} expected"
    )]
    FrameSize {
        device: String,
        got: usize,
        planes: usize,
        want: usize,
        layout: String,
    },
}

impl M2mError {
    /// The device failed (gone, erred or silent), as opposed to a bad frame or format.
    pub fn failure(&self) -> Option<Failure> {
        match self {
            M2mError::Device { failure, .. } => Some(*failure),
            _ => None,
        }
    }
}

impl From<M2mError> for crate::h264::H264Error {
    fn from(e: M2mError) -> Self {
        match e.failure() {
            // The device failed: the camera's capture handles it as a camera that fails.
            Some(_) => crate::h264::H264Error::Device(e.to_string()),
            None => crate::h264::H264Error::Encoder(e.to_string()),
        }
    }
}

fn failure_of(e: &io::Error) -> Failure {
    match e.raw_os_error() {
        Some(libc::ENODEV) | Some(libc::ENXIO) | Some(libc::EIO) | Some(libc::EPIPE) => {
            Failure::Gone
        }
        _ => Failure::Error,
    }
}

fn ioctl<T>(fd: RawFd, request: vidioc::_IOC_TYPE, arg: &mut T) -> io::Result<()> {
    loop {
        // SAFETY: every caller passes the struct type the request code is defined for (the codes
        // encode its size); the struct lives for the whole call and the kernel writes only into it.
        match unsafe { v4l::v4l2::ioctl(fd, request, arg as *mut T as *mut c_void) } {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// `poll` until one of `events` (or an error) or the deadline; `Ok(0)` when the deadline passed.
/// A deadline already passed is `Ok(0)` at once, so a caller woken again and again by an event it
/// does not consume still ends at its deadline.
fn wait(fd: RawFd, events: i16, deadline: Instant) -> io::Result<i16> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(0);
        }
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // Rounded up: poll's milliseconds would otherwise end a wait just short of its deadline.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the length of the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n > 0 {
            return Ok(p.revents);
        }
        // Timed out: the top of the loop returns once the deadline has really passed.
    }
}

fn fourcc_str(f: [u8; 4]) -> String {
    f.iter()
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '?' })
        .collect()
}

/// A timestamp tag carried through the device in a `timeval`: microseconds.
fn to_timeval(ts: u64) -> libc::timeval {
    libc::timeval {
        tv_sec: (ts / 1_000_000) as _,
        tv_usec: (ts % 1_000_000) as _,
    }
}

fn from_timeval(sec: impl Into<i64>, usec: impl Into<i64>) -> u64 {
    // time_t and suseconds_t are 32 bits on some targets.
    let (sec, usec) = (sec.into(), usec.into());
    (sec.max(0) as u64) * 1_000_000 + usec.clamp(0, 999_999) as u64
}

/// Whether a coded frame is a keyframe: the buffer's flags when the driver sets them, else the
/// bitstream (FWHT: the header's I-frame flag; H.264: an IDR slice). `None`: cannot tell.
pub fn keyframe_of(coded: [u8; 4], flags: u32, data: &[u8]) -> Option<bool> {
    if flags & FLAG_KEYFRAME != 0 {
        return Some(true);
    }
    if flags & (FLAG_PFRAME | FLAG_BFRAME) != 0 {
        return Some(false);
    }
    match &coded {
        b"FWHT" => fwht_header(data).map(|h| h.i_frame),
        b"H264" => Some(h264_has_idr(data)),
        _ => None,
    }
}

/// What an FWHT frame's header (vicodec's `struct fwht_cframe_hdr`, 44 bytes) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwhtHeader {
    pub width: u32,
    pub height: u32,
    pub i_frame: bool,
    /// Bytes of coded data after the header.
    pub size: u32,
}

pub const FWHT_HEADER_LEN: usize = 44;

pub fn fwht_header(data: &[u8]) -> Option<FwhtHeader> {
    if data.len() < FWHT_HEADER_LEN || data[..8] != [0x4f, 0x4f, 0x4f, 0x4f, 0xff, 0xff, 0xff, 0xff]
    {
        return None;
    }
    let be = |at: usize| u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    Some(FwhtHeader {
        width: be(12),
        height: be(16),
        i_frame: be(20) & (1 << 10) != 0, // V4L2_FWHT_FL_I_FRAME
        size: be(40),
    })
}

/// An IDR slice (NAL type 5) after any start code.
pub fn h264_has_idr(au: &[u8]) -> bool {
    au.windows(4)
        .any(|w| w[0] == 0 && w[1] == 0 && w[2] == 1 && w[3] & 0x1f == 5)
}

/// Where a raw picture goes in the device's OUTPUT buffer (one plane: YUV420 or NV12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawLayout {
    pub fourcc: [u8; 4],
    pub width: usize,
    pub height: usize,
    /// Bytes per luma row (the chroma rows of YUV420 are half, of NV12 the same).
    pub stride: usize,
    /// Rows of luma the buffer holds before the chroma (the format's height, maybe aligned).
    pub rows: usize,
}

impl RawLayout {
    /// Bytes of a tightly packed picture: what a caller hands over.
    pub fn packed_len(&self) -> usize {
        self.width * self.height + 2 * (self.width / 2) * (self.height / 2)
    }

    /// Bytes of the device's buffer the picture spans.
    pub fn buffer_len(&self) -> usize {
        self.stride * self.rows + self.stride * (self.rows / 2)
    }

    /// Copies a packed picture into a device buffer: `planes` is Y, U, V (I420) or Y, UV (NV12),
    /// or the whole packed picture in one slice; I420 goes into an NV12 buffer interleaved on the
    /// way. Returns the bytes written, or None when the planes do not make one picture.
    pub fn copy_into(&self, planes: &[&[u8]], dst: &mut [u8]) -> Option<usize> {
        let (w, h, s) = (self.width, self.height, self.stride);
        let (cw, ch) = (w / 2, h / 2);
        if dst.len() < self.buffer_len() || s < w {
            return None;
        }
        let one;
        let planes: Vec<&[u8]> = if planes.len() == 1 {
            one = planes[0];
            if one.len() != self.packed_len() {
                return None;
            }
            let (y, c) = one.split_at(w * h);
            if &self.fourcc == b"NV12" {
                vec![y, c]
            } else {
                let (u, v) = c.split_at(cw * ch);
                vec![y, u, v]
            }
        } else {
            planes.to_vec()
        };
        let y = planes[0];
        if y.len() != w * h {
            return None;
        }
        for r in 0..h {
            dst[r * s..r * s + w].copy_from_slice(&y[r * w..(r + 1) * w]);
        }
        let chroma = &mut dst[s * self.rows..];
        match (&self.fourcc, planes.len()) {
            (b"NV12", 2) => {
                let uv = planes[1];
                if uv.len() != 2 * cw * ch {
                    return None;
                }
                for r in 0..ch {
                    chroma[r * s..r * s + 2 * cw]
                        .copy_from_slice(&uv[r * 2 * cw..(r + 1) * 2 * cw]);
                }
            }
            (b"NV12", 3) => {
                let (u, v) = (planes[1], planes[2]);
                if u.len() != cw * ch || v.len() != cw * ch {
                    return None;
                }
                for r in 0..ch {
                    let row = &mut chroma[r * s..r * s + 2 * cw];
                    for c in 0..cw {
                        row[2 * c] = u[r * cw + c];
                        row[2 * c + 1] = v[r * cw + c];
                    }
                }
            }
            (b"YU12", 3) => {
                let (u, v) = (planes[1], planes[2]);
                if u.len() != cw * ch || v.len() != cw * ch {
                    return None;
                }
                let cs = s / 2;
                let (cu, cv) = chroma.split_at_mut(cs * (self.rows / 2));
                for r in 0..ch {
                    cu[r * cs..r * cs + cw].copy_from_slice(&u[r * cw..(r + 1) * cw]);
                    cv[r * cs..r * cs + cw].copy_from_slice(&v[r * cw..(r + 1) * cw]);
                }
            }
            _ => return None,
        }
        Some(self.packed_len())
    }

    /// The packed I420 picture out of a device buffer in this layout (YU12 or NV12).
    pub fn to_i420(&self, src: &[u8]) -> Option<Vec<u8>> {
        let (w, h, s) = (self.width, self.height, self.stride);
        let (cw, ch) = (w / 2, h / 2);
        if src.len() < self.buffer_len() {
            return None;
        }
        let mut out = Vec::with_capacity(self.packed_len());
        for r in 0..h {
            out.extend_from_slice(&src[r * s..r * s + w]);
        }
        let chroma = &src[s * self.rows..];
        match &self.fourcc {
            b"NV12" => {
                for k in 0..2 {
                    for r in 0..ch {
                        out.extend((0..cw).map(|c| chroma[r * s + 2 * c + k]));
                    }
                }
            }
            b"YU12" => {
                let cs = s / 2;
                for plane in 0..2 {
                    let base = plane * cs * (self.rows / 2);
                    for r in 0..ch {
                        out.extend_from_slice(&chroma[base + r * cs..base + r * cs + cw]);
                    }
                }
            }
            _ => return None,
        }
        Some(out)
    }
}

/// "YUV420"/"I420" -> the V4L2 fourcc YU12 (the raw formats rigd hands an encoder).
pub fn raw_fourcc(name: &str) -> Option<[u8; 4]> {
    match name.to_ascii_uppercase().as_str() {
        "YUV420" | "I420" | "YU12" => Some(*b"YU12"),
        "NV12" => Some(*b"NV12"),
        _ => None,
    }
}

/// What became of one of the encoder's hints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Set to this value (clamped into the control's range).
    Set(i64),
    /// The device has no such control (or it is disabled, inactive or read-only).
    Absent,
    /// The device has it but refused the value.
    Refused(String),
    /// Present; rigd uses it per frame (FORCE_KEY_FRAME).
    Present,
}

/// Optional settings for [`M2mEncoder::open`], applied where the device has the controls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderHints {
    /// Bits per second (V4L2_CID_MPEG_VIDEO_BITRATE).
    pub bitrate: Option<u32>,
    /// Frames between the device's own keyframes (V4L2_CID_MPEG_VIDEO_GOP_SIZE, and the H.264
    /// I-period); rigd asks for the keyframes it needs, so a long one.
    pub gop: Option<u32>,
}

/// What the encoder counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct M2mStats {
    pub frames_in: u64,
    pub frames_out: u64,
    /// Raw frames copied into an OUTPUT buffer (every frame: no DMABUF import), and their bytes.
    pub copies: u64,
    pub bytes_copied: u64,
    /// Raw frames imported as DMABUF (no copy).
    pub imported: u64,
    pub coded_bytes: u64,
    pub keyframes: u64,
    /// Keyframes asked for by the caller after the first frame, forced with FORCE_KEY_FRAME or
    /// with the reset sequence.
    pub forced_by_control: u64,
    pub forced_by_restart: u64,
    /// Keyframe flags taken from the buffer's flags or read from the bitstream.
    pub flagged_by_driver: u64,
    pub read_from_bitstream: u64,
    /// Coded buffers with another frame's timestamp whose bytes went in front of the next frame
    /// (an encoder that hands out its stream headers in a buffer of their own).
    pub prefixed: u64,
    /// The longest wait for a coded frame, in microseconds.
    pub max_wait_us: u64,
}

/// One coded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub data: Vec<u8>,
    pub keyframe: bool,
    /// The caller's timestamp, as the device carried it back.
    pub ts: u64,
}

struct Map {
    ptr: *mut c_void,
    len: usize,
}

/// A dequeued buffer.
#[derive(Debug, Clone, Copy)]
struct Dq {
    index: u32,
    start: usize,
    end: usize,
    flags: u32,
    ts: u64,
}

/// One queue of an M2M device: its mmap'ed buffers (one plane each).
struct Queue {
    fd: RawFd,
    type_: u32,
    mplane: bool,
    maps: Vec<Map>,
    queued: Vec<bool>,
    streaming: bool,
    /// MEMORY_MMAP, or MEMORY_DMABUF for an OUTPUT queue that imports the caller's buffers.
    memory: u32,
}

// SAFETY: the mappings belong to this queue alone; the raw pointers are only dereferenced
// through `&self`/`&mut self`.
unsafe impl Send for Queue {}

impl Queue {
    fn new(fd: RawFd, type_: u32, mplane: bool) -> Self {
        Queue {
            fd,
            type_,
            mplane,
            maps: Vec::new(),
            queued: Vec::new(),
            streaming: false,
            memory: MEMORY_MMAP,
        }
    }

    fn request(&mut self, count: u32) -> io::Result<()> {
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut req: v4l2_requestbuffers = unsafe { std::mem::zeroed() };
        req.count = count;
        req.type_ = self.type_;
        req.memory = self.memory;
        ioctl(self.fd, vidioc::VIDIOC_REQBUFS, &mut req)?;
        if req.count == 0 {
            return Err(io::Error::other("REQBUFS granted 0 buffers"));
        }
        if self.memory == MEMORY_DMABUF {
            // Nothing to map: each QBUF names the caller's buffer.
            self.queued = vec![false; req.count as usize];
            return Ok(());
        }
        for index in 0..req.count {
            let (mut buf, planes) = self.buffer(index);
            ioctl(self.fd, vidioc::VIDIOC_QUERYBUF, &mut buf)?;
            let (offset, len) = if self.mplane {
                if buf.length != 1 {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("a format of {} planes (one expected)", buf.length),
                    ));
                }
                // SAFETY: QUERYBUF filled plane 0's mmap offset (`mem_offset`).
                (unsafe { planes[0].m.mem_offset }, planes[0].length)
            } else {
                // SAFETY: for single-planar MMAP buffers the kernel answers in `offset`.
                (unsafe { buf.m.offset }, buf.length)
            };
            // SAFETY: maps `len` bytes of the driver's buffer at the offset it gave; unmapped
            // once, in `release`, before the descriptor is closed.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    self.fd,
                    offset as libc::off_t,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            self.maps.push(Map {
                ptr,
                len: len as usize,
            });
            self.queued.push(false);
        }
        Ok(())
    }

    fn release(&mut self) {
        if self.streaming {
            let _ = self.stream(false);
        }
        for m in self.maps.drain(..) {
            // SAFETY: each mapping was made by mmap in `request` with this length, unmapped once.
            unsafe { libc::munmap(m.ptr, m.len) };
        }
        self.queued.clear();
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut req: v4l2_requestbuffers = unsafe { std::mem::zeroed() };
        req.type_ = self.type_;
        req.memory = self.memory;
        // Errors mean the device is gone: nothing left to free.
        let _ = ioctl(self.fd, vidioc::VIDIOC_REQBUFS, &mut req);
    }

    fn buffer(&self, index: u32) -> (v4l2_buffer, Box<[v4l2_plane; MAX_PLANES]>) {
        // SAFETY: plain C structs; all-zero bytes are valid values.
        let mut planes: Box<[v4l2_plane; MAX_PLANES]> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: as above.
        let mut buf: v4l2_buffer = unsafe { std::mem::zeroed() };
        buf.index = index;
        buf.type_ = self.type_;
        buf.memory = self.memory;
        if self.mplane {
            buf.length = MAX_PLANES as u32;
            buf.m.planes = planes.as_mut_ptr();
        }
        (buf, planes)
    }

    fn queue(&mut self, index: u32, bytesused: usize, ts: u64) -> io::Result<()> {
        let (mut buf, mut planes) = self.buffer(index);
        buf.field = FIELD_NONE;
        let tv = to_timeval(ts);
        buf.timestamp.tv_sec = tv.tv_sec as _;
        buf.timestamp.tv_usec = tv.tv_usec as _;
        if self.mplane {
            buf.length = 1;
            planes[0].bytesused = bytesused as u32;
            planes[0].length = self.maps[index as usize].len as u32;
            buf.m.planes = planes.as_mut_ptr();
        } else {
            buf.bytesused = bytesused as u32;
        }
        // `planes` outlives the call: the kernel reads the plane array through buf.m.planes.
        ioctl(self.fd, vidioc::VIDIOC_QBUF, &mut buf)?;
        self.queued[index as usize] = true;
        Ok(())
    }

    /// Queues a DMABUF (an OUTPUT queue opened for import): the length is the buffer's own.
    fn queue_dmabuf(
        &mut self,
        index: u32,
        dmabuf: RawFd,
        bytesused: usize,
        ts: u64,
    ) -> io::Result<()> {
        let (mut buf, mut planes) = self.buffer(index);
        buf.field = FIELD_NONE;
        let tv = to_timeval(ts);
        buf.timestamp.tv_sec = tv.tv_sec as _;
        buf.timestamp.tv_usec = tv.tv_usec as _;
        // The buffer's length is the caller's to give (vb2 checks bytesused against it): a
        // DMABUF's size is where seeking to its end lands.
        // SAFETY: lseek on a descriptor the caller owns; it changes no data.
        let size = unsafe { libc::lseek(dmabuf, 0, libc::SEEK_END) };
        let length = (size.max(0) as usize).max(bytesused) as u32;
        if self.mplane {
            buf.length = 1;
            planes[0].bytesused = bytesused as u32;
            planes[0].length = length;
            planes[0].m.fd = dmabuf;
            buf.m.planes = planes.as_mut_ptr();
        } else {
            buf.bytesused = bytesused as u32;
            buf.length = length;
            buf.m.fd = dmabuf;
        }
        ioctl(self.fd, vidioc::VIDIOC_QBUF, &mut buf)?;
        self.queued[index as usize] = true;
        Ok(())
    }

    /// The next finished buffer, or None when there is none yet (the descriptor is non-blocking).
    fn dequeue(&mut self) -> io::Result<Option<Dq>> {
        let (mut buf, planes) = self.buffer(0);
        match ioctl(self.fd, vidioc::VIDIOC_DQBUF, &mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
        let index = buf.index;
        if index as usize >= self.queued.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "DQBUF: unknown buffer index",
            ));
        }
        let len = self.maps.get(index as usize).map_or(0, |m| m.len);
        self.queued[index as usize] = false;
        let (used, offset) = if self.mplane {
            (planes[0].bytesused as usize, planes[0].data_offset as usize)
        } else {
            (buf.bytesused as usize, 0)
        };
        let end = used.min(len);
        Ok(Some(Dq {
            index,
            start: offset.min(end),
            end,
            flags: buf.flags,
            ts: from_timeval(buf.timestamp.tv_sec, buf.timestamp.tv_usec),
        }))
    }

    fn bytes(&self, dq: &Dq) -> &[u8] {
        let m = &self.maps[dq.index as usize];
        // SAFETY: the mapping is `m.len` bytes long (dq.end <= m.len) and stays mapped while
        // `self` is borrowed; the driver does not write into a dequeued buffer until it is
        // queued again, which needs `&mut self`.
        unsafe { std::slice::from_raw_parts((m.ptr as *const u8).add(dq.start), dq.end - dq.start) }
    }

    fn bytes_mut(&mut self, index: u32) -> &mut [u8] {
        let m = &self.maps[index as usize];
        // SAFETY: as in `bytes`; the buffer is not queued (the caller took it from `free`), so
        // the driver does not touch it, and `&mut self` makes the slice the only one.
        unsafe { std::slice::from_raw_parts_mut(m.ptr as *mut u8, m.len) }
    }

    fn free(&self) -> Option<u32> {
        self.queued.iter().position(|q| !q).map(|i| i as u32)
    }

    fn stream(&mut self, on: bool) -> io::Result<()> {
        let mut t = self.type_ as i32;
        let req = if on {
            vidioc::VIDIOC_STREAMON
        } else {
            vidioc::VIDIOC_STREAMOFF
        };
        let r = ioctl(self.fd, req, &mut t);
        if r.is_ok() {
            self.streaming = on;
            if !on {
                // STREAMOFF hands every buffer back.
                self.queued.iter_mut().for_each(|q| *q = false);
            }
        }
        r
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.release();
    }
}

/// What QUERYCAP says of a node.
#[derive(Debug, Clone)]
pub struct M2mInfo {
    pub driver: String,
    pub card: String,
    pub mplane: bool,
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn open_node(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// QUERYCAP: Some when the node is a memory-to-memory device.
pub fn m2m_info(fd: RawFd) -> io::Result<Option<M2mInfo>> {
    // SAFETY: a plain C struct; all-zero bytes are a valid value.
    let mut cap: v4l2_capability = unsafe { std::mem::zeroed() };
    ioctl(fd, vidioc::VIDIOC_QUERYCAP, &mut cap)?;
    let caps = if cap.capabilities & CAP_DEVICE_CAPS != 0 {
        cap.device_caps
    } else {
        cap.capabilities
    };
    let mplane = if caps & CAP_VIDEO_M2M_MPLANE != 0 {
        true
    } else if caps & CAP_VIDEO_M2M != 0 {
        false
    } else {
        return Ok(None);
    };
    Ok(Some(M2mInfo {
        driver: cstr(&cap.driver),
        card: cstr(&cap.card),
        mplane,
    }))
}

fn queue_types(mplane: bool) -> (u32, u32) {
    if mplane {
        (BUF_OUTPUT_MPLANE, BUF_CAPTURE_MPLANE)
    } else {
        (BUF_OUTPUT, BUF_CAPTURE)
    }
}

/// The fourccs a queue offers.
pub fn formats(fd: RawFd, type_: u32) -> io::Result<Vec<[u8; 4]>> {
    let mut out = Vec::new();
    for index in 0..256 {
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut d: v4l2_fmtdesc = unsafe { std::mem::zeroed() };
        d.index = index;
        d.type_ = type_;
        match ioctl(fd, vidioc::VIDIOC_ENUM_FMT, &mut d) {
            Ok(()) => out.push(d.pixelformat.to_le_bytes()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

pub type Formats = Vec<[u8; 4]>;

/// The (OUTPUT, CAPTURE) fourccs of an M2M node.
pub fn m2m_formats(fd: RawFd, mplane: bool) -> io::Result<(Formats, Formats)> {
    let (o, c) = queue_types(mplane);
    Ok((formats(fd, o)?, formats(fd, c)?))
}

/// What S_FMT answered for one queue.
#[derive(Debug, Clone, Copy)]
struct SetFormat {
    fourcc: [u8; 4],
    width: u32,
    height: u32,
    stride: u32,
    sizeimage: u32,
    planes: u32,
}

fn set_format(
    fd: RawFd,
    type_: u32,
    mplane: bool,
    fourcc: [u8; 4],
    width: u32,
    height: u32,
) -> io::Result<SetFormat> {
    // SAFETY: a plain C struct (a union of plain structs); all-zero bytes are a valid value.
    let mut f: v4l2_format = unsafe { std::mem::zeroed() };
    f.type_ = type_;
    if mplane {
        f.fmt.pix_mp.width = width;
        f.fmt.pix_mp.height = height;
        f.fmt.pix_mp.pixelformat = u32::from_le_bytes(fourcc);
        f.fmt.pix_mp.field = FIELD_NONE;
        f.fmt.pix_mp.num_planes = 1;
    } else {
        f.fmt.pix.width = width;
        f.fmt.pix.height = height;
        f.fmt.pix.pixelformat = u32::from_le_bytes(fourcc);
        f.fmt.pix.field = FIELD_NONE;
    }
    ioctl(fd, vidioc::VIDIOC_S_FMT, &mut f)?;
    Ok(read_format(&f, mplane))
}

fn get_format(fd: RawFd, type_: u32, mplane: bool) -> io::Result<SetFormat> {
    // SAFETY: as in `set_format`.
    let mut f: v4l2_format = unsafe { std::mem::zeroed() };
    f.type_ = type_;
    ioctl(fd, vidioc::VIDIOC_G_FMT, &mut f)?;
    Ok(read_format(&f, mplane))
}

fn read_format(f: &v4l2_format, mplane: bool) -> SetFormat {
    if mplane {
        // SAFETY: for a multi-planar type the kernel answers in `pix_mp`.
        let p = unsafe { f.fmt.pix_mp };
        SetFormat {
            fourcc: p.pixelformat.to_le_bytes(),
            width: p.width,
            height: p.height,
            stride: p.plane_fmt[0].bytesperline,
            sizeimage: p.plane_fmt[0].sizeimage,
            planes: p.num_planes as u32,
        }
    } else {
        // SAFETY: for a single-planar type the kernel answers in `pix`.
        let p = unsafe { f.fmt.pix };
        SetFormat {
            fourcc: p.pixelformat.to_le_bytes(),
            width: p.width,
            height: p.height,
            stride: p.bytesperline,
            sizeimage: p.sizeimage,
            planes: 1,
        }
    }
}

/// The layout of a raw queue's buffer from its format.
fn layout_of(f: &SetFormat, width: u32, height: u32) -> RawLayout {
    let stride = (f.stride as usize).max(width as usize);
    // The luma rows the buffer holds: the format's height, or what sizeimage implies.
    let rows = if f.stride > 0 && f.sizeimage > 0 {
        ((f.sizeimage as usize * 2) / (3 * stride)).max(height as usize)
    } else {
        f.height.max(height) as usize
    };
    RawLayout {
        fourcc: f.fourcc,
        width: width as usize,
        height: height as usize,
        stride,
        rows: rows.min(f.height.max(height) as usize),
    }
}

const SEL_TGT_CROP: u32 = 0x0000;
const SEL_TGT_COMPOSE: u32 = 0x0100;
const VIDIOC_G_SELECTION: vidioc::_IOC_TYPE =
    ioc(3, 94, std::mem::size_of::<v4l::v4l_sys::v4l2_selection>());
const VIDIOC_S_SELECTION: vidioc::_IOC_TYPE =
    ioc(3, 95, std::mem::size_of::<v4l::v4l_sys::v4l2_selection>());

/// G_SELECTION, or S_SELECTION of a rectangle at the origin: the size the driver answers.
/// `type_` is the single-planar type (the kernel maps the multi-planar ones to it).
fn selection(
    fd: RawFd,
    type_: u32,
    target: u32,
    set: Option<(u32, u32)>,
) -> io::Result<(u32, u32)> {
    // SAFETY: a plain C struct; all-zero bytes are a valid value.
    let mut sel: v4l::v4l_sys::v4l2_selection = unsafe { std::mem::zeroed() };
    sel.type_ = type_;
    sel.target = target;
    match set {
        Some((w, h)) => {
            sel.r.width = w;
            sel.r.height = h;
            ioctl(fd, VIDIOC_S_SELECTION, &mut sel)?;
        }
        None => ioctl(fd, VIDIOC_G_SELECTION, &mut sel)?,
    }
    Ok((sel.r.width, sel.r.height))
}

/// Sets a control if the device has it (clamped into its range).
fn apply_control(fd: RawFd, id: u32, value: i64) -> Control {
    // SAFETY: a plain C struct; all-zero bytes are a valid value.
    let mut q: v4l2_queryctrl = unsafe { std::mem::zeroed() };
    q.id = id;
    if ioctl(fd, vidioc::VIDIOC_QUERYCTRL, &mut q).is_err()
        || q.flags & (CTRL_FLAG_DISABLED | CTRL_FLAG_READ_ONLY | CTRL_FLAG_INACTIVE) != 0
    {
        return Control::Absent;
    }
    let v = value.clamp(q.minimum as i64, q.maximum as i64) as i32;
    let mut c = v4l2_control { id, value: v };
    match ioctl(fd, vidioc::VIDIOC_S_CTRL, &mut c) {
        Ok(()) => Control::Set(c.value as i64),
        Err(e) => Control::Refused(e.to_string()),
    }
}

fn has_control(fd: RawFd, id: u32) -> bool {
    // SAFETY: a plain C struct; all-zero bytes are a valid value.
    let mut q: v4l2_queryctrl = unsafe { std::mem::zeroed() };
    q.id = id;
    ioctl(fd, vidioc::VIDIOC_QUERYCTRL, &mut q).is_ok() && q.flags & CTRL_FLAG_DISABLED == 0
}

/// The `/dev/videoN` nodes in numeric order.
fn video_nodes(dir: &Path) -> Vec<PathBuf> {
    let mut nodes: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let n = name.strip_prefix("video")?.parse().ok()?;
                    Some((n, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    nodes.into_iter().map(|(_, p)| p).collect()
}

/// The first `/dev/video*` node that is an M2M encoder to `coded` (its CAPTURE queue offers the
/// coded format and its OUTPUT queue does not): what `encoder = "auto"` uses.
pub fn find_encoder(coded: [u8; 4]) -> Option<PathBuf> {
    find_m2m(Path::new("/dev"), |out, cap| {
        cap.contains(&coded) && !out.contains(&coded)
    })
}

/// The first M2M decoder from `coded` (its OUTPUT queue offers the coded format).
pub fn find_decoder(coded: [u8; 4]) -> Option<PathBuf> {
    find_m2m(Path::new("/dev"), |out, cap| {
        out.contains(&coded) && !cap.contains(&coded)
    })
}

/// Whether the node at `path` is an M2M encoder to `coded` (`rigd check` of a camera's
/// `encoder = "/dev/videoN"`); `Err` says what it is instead.
pub fn check_encoder(path: &Path, coded: [u8; 4]) -> Result<(), String> {
    let shown = path.display();
    let file = open_node(path).map_err(|e| format!("{shown}: {e}"))?;
    let fd = file.as_raw_fd();
    let info = m2m_info(fd).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTTY) | Some(libc::EINVAL) => format!("{shown}: not a V4L2 device"),
        _ => format!("{shown}: VIDIOC_QUERYCAP: {e}"),
    })?;
    let formats = match &info {
        Some(i) => m2m_formats(fd, i.mplane).map_err(|e| format!("{shown}: ENUM_FMT: {e}"))?,
        None => (Vec::new(), Vec::new()),
    };
    encoder_verdict(
        &shown.to_string(),
        info.as_ref(),
        &formats.0,
        &formats.1,
        coded,
    )
}

/// [`check_encoder`]'s rule on what QUERYCAP and ENUM_FMT said (pure).
pub fn encoder_verdict(
    device: &str,
    info: Option<&M2mInfo>,
    output: &[[u8; 4]],
    capture: &[[u8; 4]],
    coded: [u8; 4],
) -> Result<(), String> {
    let want = fourcc_str(coded);
    let Some(info) = info else {
        return Err(format!(
            "{device}: a V4L2 device but not a memory-to-memory one, so not an {want} encoder"
        ));
    };
    let list = |f: &[[u8; 4]]| {
        f.iter()
            .map(|c| fourcc_str(*c))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !capture.contains(&coded) || output.contains(&coded) {
        return Err(format!(
            "{device} (`{}`): an M2M device but not an {want} encoder (it codes to [{}] from [{}])",
            info.card,
            list(capture),
            list(output)
        ));
    }
    Ok(())
}

fn find_m2m(dir: &Path, fits: impl Fn(&[[u8; 4]], &[[u8; 4]]) -> bool) -> Option<PathBuf> {
    video_nodes(dir).into_iter().find(|p| {
        let Ok(file) = open_node(p) else { return false };
        let fd = file.as_raw_fd();
        match m2m_info(fd) {
            Ok(Some(info)) => m2m_formats(fd, info.mplane)
                .map(|(o, c)| fits(&o, &c))
                .unwrap_or(false),
            _ => false,
        }
    })
}

/// A stateful V4L2 M2M encoder, streaming from `open` until dropped.
pub struct M2mEncoder {
    device: String,
    info: M2mInfo,
    // The queues are dropped (unmapped, freed) before the descriptor is closed.
    out: Queue,
    cap: Queue,
    layout: RawLayout,
    coded: [u8; 4],
    coded_size: (u32, u32),
    controls: Vec<(&'static str, Control)>,
    force_key: bool,
    timeout: Duration,
    prefix: Vec<u8>,
    failed: Option<String>,
    stats: M2mStats,
    next_tag: u64,
    file: File,
}

impl std::fmt::Debug for M2mEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl M2mEncoder {
    /// Opens `path` as an encoder from `raw` (YU12 or NV12) frames of `width` x `height` to
    /// `coded` (H264, FWHT, ...), with the hints set where the device has the controls.
    pub fn open(
        path: impl AsRef<Path>,
        width: u32,
        height: u32,
        raw: [u8; 4],
        coded: [u8; 4],
        hints: EncoderHints,
    ) -> Result<Self, M2mError> {
        Self::open_with(path.as_ref(), width, height, raw, coded, hints, false)
    }

    /// Like [`M2mEncoder::open`], with an OUTPUT queue that imports the caller's buffers
    /// (`V4L2_MEMORY_DMABUF`): frames go in with [`M2mEncoder::encode_dmabuf`], no copy. The
    /// buffers must be in the layout the device answered ([`M2mEncoder::layout`]).
    pub fn open_dmabuf(
        path: impl AsRef<Path>,
        width: u32,
        height: u32,
        raw: [u8; 4],
        coded: [u8; 4],
        hints: EncoderHints,
    ) -> Result<Self, M2mError> {
        Self::open_with(path.as_ref(), width, height, raw, coded, hints, true)
    }

    fn open_with(
        path: &Path,
        width: u32,
        height: u32,
        raw: [u8; 4],
        coded: [u8; 4],
        hints: EncoderHints,
        import: bool,
    ) -> Result<Self, M2mError> {
        let device = path.display().to_string();
        let unsupported = |what: String| M2mError::Unsupported {
            device: device.clone(),
            what,
        };
        let dev_err = |op: &str, e: io::Error| M2mError::Device {
            device: device.clone(),
            what: format!("{op}: {e}"),
            failure: failure_of(&e),
        };
        let file = open_node(path).map_err(|e| dev_err("open", e))?;
        let fd = file.as_raw_fd();
        let info = m2m_info(fd)
            .map_err(|e| dev_err("QUERYCAP", e))?
            .ok_or_else(|| unsupported("not a memory-to-memory device".into()))?;
        let (out_type, cap_type) = queue_types(info.mplane);
        let (outs, caps) = m2m_formats(fd, info.mplane).map_err(|e| dev_err("ENUM_FMT", e))?;
        if !caps.contains(&coded) {
            return Err(unsupported(format!(
                "its CAPTURE queue does not offer {} (it offers {})",
                fourcc_str(coded),
                caps.iter()
                    .map(|f| fourcc_str(*f))
                    .collect::<Vec<_>>()
                    .join(" ")
            )));
        }
        // The coded format first: it decides what the OUTPUT queue accepts.
        let c = set_format(fd, cap_type, info.mplane, coded, width, height)
            .map_err(|e| dev_err("S_FMT CAPTURE", e))?;
        if c.fourcc != coded {
            return Err(unsupported(format!(
                "S_FMT CAPTURE {} answered {}",
                fourcc_str(coded),
                fourcc_str(c.fourcc)
            )));
        }
        if !outs.contains(&raw) && !formats(fd, out_type).unwrap_or_default().contains(&raw) {
            return Err(unsupported(format!(
                "its OUTPUT queue does not offer {}",
                fourcc_str(raw)
            )));
        }
        let o = set_format(fd, out_type, info.mplane, raw, width, height)
            .map_err(|e| dev_err("S_FMT OUTPUT", e))?;
        if o.fourcc != raw || o.width < width || o.height < height || o.planes != 1 {
            return Err(unsupported(format!(
                "S_FMT OUTPUT {} {width}x{height} answered {} {}x{} in {} planes",
                fourcc_str(raw),
                fourcc_str(o.fourcc),
                o.width,
                o.height,
                o.planes
            )));
        }
        let layout = layout_of(&o, width, height);
        // A device that aligns its coded size (1080 rows coded as 1088; vicodec's least 640x360
        // as 640x368) encodes the picture's rectangle: the OUTPUT crop (dev-encoder.rst).
        if (o.width, o.height) != (width, height) {
            let got = selection(fd, BUF_OUTPUT, SEL_TGT_CROP, Some((width, height)))
                .map_err(|e| dev_err("S_SELECTION OUTPUT CROP", e))?;
            if got != (width, height) {
                return Err(unsupported(format!(
                    "it codes {}x{} and crops to {}x{}, not {width}x{height}",
                    o.width, o.height, got.0, got.1
                )));
            }
        }
        // The CAPTURE format again: its size follows the OUTPUT one on some drivers.
        let c = get_format(fd, cap_type, info.mplane).unwrap_or(c);

        let mut controls = Vec::new();
        if let Some(b) = hints.bitrate {
            controls.push((
                "bitrate",
                apply_control(fd, CID_MPEG_VIDEO_BITRATE, b as i64),
            ));
        }
        if let Some(g) = hints.gop {
            controls.push(("gop", apply_control(fd, CID_MPEG_VIDEO_GOP_SIZE, g as i64)));
            if &coded == b"H264" {
                controls.push((
                    "h264-i-period",
                    apply_control(fd, CID_MPEG_VIDEO_H264_I_PERIOD, g as i64),
                ));
            }
        }
        if has_control(fd, CID_MPEG_VIDEO_B_FRAMES) {
            controls.push(("b-frames", apply_control(fd, CID_MPEG_VIDEO_B_FRAMES, 0)));
        }
        if &coded == b"H264" {
            controls.push((
                "repeat-headers",
                apply_control(fd, CID_MPEG_VIDEO_REPEAT_SEQ_HEADER, 1),
            ));
        }
        let force_key = has_control(fd, CID_MPEG_VIDEO_FORCE_KEY_FRAME);
        controls.push((
            "force-key-frame",
            if force_key {
                Control::Present
            } else {
                Control::Absent
            },
        ));

        let mut out = Queue::new(fd, out_type, info.mplane);
        if import {
            out.memory = MEMORY_DMABUF;
        }
        let mut cap = Queue::new(fd, cap_type, info.mplane);
        out.request(2).map_err(|e| dev_err("REQBUFS OUTPUT", e))?;
        cap.request(4).map_err(|e| dev_err("REQBUFS CAPTURE", e))?;
        if out.maps.iter().any(|m| m.len < layout.buffer_len()) {
            return Err(unsupported(format!(
                "OUTPUT buffers of {} bytes for a {} picture of {}",
                out.maps[0].len,
                fourcc_str(raw),
                layout.buffer_len()
            )));
        }
        for i in 0..cap.maps.len() as u32 {
            cap.queue(i, 0, 0).map_err(|e| dev_err("QBUF CAPTURE", e))?;
        }
        out.stream(true)
            .map_err(|e| dev_err("STREAMON OUTPUT", e))?;
        cap.stream(true)
            .map_err(|e| dev_err("STREAMON CAPTURE", e))?;
        Ok(M2mEncoder {
            device,
            info,
            out,
            cap,
            layout,
            coded,
            coded_size: (c.width, c.height),
            controls,
            force_key,
            timeout: Duration::from_secs(2),
            prefix: Vec::new(),
            failed: None,
            stats: M2mStats::default(),
            next_tag: 1,
            file,
        })
    }

    /// How long a frame may take before the device counts as failed (2 s by default).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn stats(&self) -> M2mStats {
        self.stats
    }

    pub fn info(&self) -> &M2mInfo {
        &self.info
    }

    pub fn layout(&self) -> RawLayout {
        self.layout
    }

    /// What became of each hint.
    pub fn controls(&self) -> &[(&'static str, Control)] {
        &self.controls
    }

    /// One line for logs and the status page: device, card, API, formats, controls.
    pub fn describe(&self) -> String {
        let controls: Vec<String> = self
            .controls
            .iter()
            .map(|(n, c)| match c {
                Control::Set(v) => format!("{n}={v}"),
                Control::Absent => format!("{n} absent"),
                Control::Present => format!("{n} present"),
                Control::Refused(e) => format!("{n} refused ({e})"),
            })
            .collect();
        format!(
            "{} `{}` ({}) {} {}x{} (stride {}) -> {} {}x{}; {}",
            self.device,
            self.info.card,
            if self.info.mplane {
                "M2M_MPLANE"
            } else {
                "M2M"
            },
            fourcc_str(self.layout.fourcc),
            self.layout.width,
            self.layout.height,
            self.layout.stride,
            fourcc_str(self.coded),
            self.coded_size.0,
            self.coded_size.1,
            controls.join(", ")
        )
    }

    fn fail(&mut self, what: String, failure: Failure) -> M2mError {
        self.failed = Some(what.clone());
        M2mError::Device {
            device: self.device.clone(),
            what,
            failure,
        }
    }

    fn io_fail(&mut self, op: &str, e: io::Error) -> M2mError {
        let failure = failure_of(&e);
        self.fail(format!("{op}: {e}"), failure)
    }

    /// Encodes one picture (`planes`: Y, U, V or Y, UV, or the packed picture in one slice, of
    /// the size given at open). `keyframe` asks for a keyframe on this frame; `ts` (microseconds,
    /// or any tag below 2^63) comes back in [`Encoded::ts`].
    pub fn encode(
        &mut self,
        planes: &[&[u8]],
        keyframe: bool,
        ts: u64,
    ) -> Result<Encoded, M2mError> {
        if let Some(why) = &self.failed {
            return Err(M2mError::Device {
                device: self.device.clone(),
                what: format!("failed earlier: {why}"),
                failure: Failure::Error,
            });
        }
        let got: usize = planes.iter().map(|p| p.len()).sum();
        if got != self.layout.packed_len() || planes.is_empty() || planes.len() > 3 {
            return Err(M2mError::FrameSize {
                device: self.device.clone(),
                got,
                planes: planes.len(),
                want: self.layout.packed_len(),
                layout: format!(
                    "{} {}x{}",
                    fourcc_str(self.layout.fourcc),
                    self.layout.width,
                    self.layout.height
                ),
            });
        }
        if self.out.memory == MEMORY_DMABUF {
            return Err(M2mError::Unsupported {
                device: self.device.clone(),
                what: "opened for DMABUF import: frames go in with encode_dmabuf".into(),
            });
        }
        let deadline = Instant::now() + self.timeout;
        let index = self.prepare(keyframe, deadline)?;
        let layout = self.layout;
        let n = layout
            .copy_into(planes, self.out.bytes_mut(index))
            .ok_or_else(|| M2mError::FrameSize {
                device: self.device.clone(),
                got,
                planes: planes.len(),
                want: layout.packed_len(),
                layout: fourcc_str(layout.fourcc),
            })?;
        self.stats.copies += 1;
        self.stats.bytes_copied += n as u64;
        let sent = Instant::now();
        self.out
            .queue(index, layout.buffer_len(), ts)
            .map_err(|e| self.io_fail("QBUF OUTPUT", e))?;
        self.stats.frames_in += 1;
        self.collect(ts, sent, deadline)
    }

    /// Encodes the picture in a DMABUF (an encoder opened with [`M2mEncoder::open_dmabuf`]):
    /// `dmabuf` holds [`M2mEncoder::layout`]'s bytes (a camera buffer exported with
    /// VIDIOC_EXPBUF, say); nothing is copied. The device is done with it when this returns.
    pub fn encode_dmabuf(
        &mut self,
        dmabuf: RawFd,
        keyframe: bool,
        ts: u64,
    ) -> Result<Encoded, M2mError> {
        if self.out.memory != MEMORY_DMABUF {
            return Err(M2mError::Unsupported {
                device: self.device.clone(),
                what: "not opened for DMABUF import".into(),
            });
        }
        let deadline = Instant::now() + self.timeout;
        let index = self.prepare(keyframe, deadline)?;
        let sent = Instant::now();
        self.out
            .queue_dmabuf(index, dmabuf, self.layout.buffer_len(), ts)
            .map_err(|e| self.io_fail("QBUF OUTPUT (DMABUF)", e))?;
        self.stats.frames_in += 1;
        self.stats.imported += 1;
        let e = self.collect(ts, sent, deadline)?;
        // The caller may reuse its buffer once the device has handed it back.
        while self.out.queued[index as usize] {
            self.reap_output()?;
            if self.out.queued[index as usize] {
                self.wait_for(libc::POLLOUT, deadline, "the imported buffer back")?;
            }
        }
        Ok(e)
    }

    /// Before a frame: the keyframe forced if asked, and a free OUTPUT buffer.
    fn prepare(&mut self, keyframe: bool, deadline: Instant) -> Result<u32, M2mError> {
        if let Some(why) = &self.failed {
            return Err(M2mError::Device {
                device: self.device.clone(),
                what: format!("failed earlier: {why}"),
                failure: Failure::Error,
            });
        }
        if keyframe && self.stats.frames_in > 0 {
            if self.force_key {
                let mut c = v4l2_control {
                    id: CID_MPEG_VIDEO_FORCE_KEY_FRAME,
                    value: 1,
                };
                ioctl(self.file.as_raw_fd(), vidioc::VIDIOC_S_CTRL, &mut c)
                    .map_err(|e| self.io_fail("S_CTRL FORCE_KEY_FRAME", e))?;
                self.stats.forced_by_control += 1;
            } else {
                self.restart(deadline)?;
                self.stats.forced_by_restart += 1;
            }
        }
        // A free OUTPUT buffer: one the device has finished with.
        loop {
            self.reap_output()?;
            if let Some(i) = self.out.free() {
                return Ok(i);
            }
            self.wait_for(libc::POLLOUT, deadline, "a free OUTPUT buffer")?;
        }
    }

    /// The coded frame of `ts`, after its raw frame was queued.
    fn collect(&mut self, ts: u64, sent: Instant, deadline: Instant) -> Result<Encoded, M2mError> {
        loop {
            if let Some(dq) = self
                .cap
                .dequeue()
                .map_err(|e| self.io_fail("DQBUF CAPTURE", e))?
            {
                let data = self.cap.bytes(&dq).to_vec();
                let last = dq.flags & FLAG_LAST != 0;
                if dq.flags & FLAG_ERROR != 0 {
                    return Err(self.fail(
                        format!("the device flagged the coded buffer of ts {} ERROR", dq.ts),
                        Failure::Error,
                    ));
                }
                if last {
                    return Err(self.fail(
                        "the device ended the stream (a buffer flagged LAST)".into(),
                        Failure::Error,
                    ));
                }
                self.cap
                    .queue(dq.index, 0, 0)
                    .map_err(|e| self.io_fail("QBUF CAPTURE", e))?;
                if dq.ts != ts {
                    if !data.is_empty() {
                        // Stream headers in a buffer of their own: they go in front of the frame.
                        self.prefix.extend_from_slice(&data);
                        self.stats.prefixed += 1;
                    }
                    continue;
                }
                let mut data = data;
                if !self.prefix.is_empty() {
                    let mut p = std::mem::take(&mut self.prefix);
                    p.extend_from_slice(&data);
                    data = p;
                }
                let key = match keyframe_of(self.coded, dq.flags, &data) {
                    Some(k) => {
                        if dq.flags & (FLAG_KEYFRAME | FLAG_PFRAME | FLAG_BFRAME) != 0 {
                            self.stats.flagged_by_driver += 1;
                        } else {
                            self.stats.read_from_bitstream += 1;
                        }
                        k
                    }
                    None => false,
                };
                self.stats.frames_out += 1;
                self.stats.keyframes += u64::from(key);
                self.stats.coded_bytes += data.len() as u64;
                self.stats.max_wait_us = self
                    .stats
                    .max_wait_us
                    .max(sent.elapsed().as_micros() as u64);
                return Ok(Encoded {
                    data,
                    keyframe: key,
                    ts: dq.ts,
                });
            }
            self.reap_output()?;
            self.wait_for(libc::POLLIN, deadline, "the coded frame")?;
        }
    }

    /// Takes back the OUTPUT buffers the device has finished with.
    fn reap_output(&mut self) -> Result<(), M2mError> {
        while let Some(dq) = self
            .out
            .dequeue()
            .map_err(|e| self.io_fail("DQBUF OUTPUT", e))?
        {
            if dq.flags & FLAG_ERROR != 0 {
                return Err(self.fail(
                    format!("the device flagged the raw buffer of ts {} ERROR", dq.ts),
                    Failure::Error,
                ));
            }
        }
        Ok(())
    }

    fn wait_for(&mut self, events: i16, deadline: Instant, what: &str) -> Result<(), M2mError> {
        let fd = self.file.as_raw_fd();
        let r = wait(fd, events, deadline).map_err(|e| self.io_fail("poll", e))?;
        if r == 0 {
            let ms = self.timeout.as_millis();
            return Err(self.fail(format!("no {what} within {ms} ms"), Failure::Timeout));
        }
        if r & (libc::POLLHUP | libc::POLLNVAL) != 0 {
            // Say what the device says, if anything (ENODEV when it was unregistered).
            let why = self
                .cap
                .dequeue()
                .err()
                .map(|e| format!("; DQBUF: {e}"))
                .unwrap_or_default();
            return Err(self.fail(
                format!("the device hung up (poll {r:#x}) waiting for {what}{why}"),
                Failure::Gone,
            ));
        }
        if r & libc::POLLERR != 0 && r & (libc::POLLIN | libc::POLLOUT) == 0 {
            return Err(self.fail(
                format!("poll reported an error ({r:#x}) waiting for {what}"),
                Failure::Error,
            ));
        }
        Ok(())
    }

    fn encoder_cmd(&mut self, cmd: u32) -> Result<(), M2mError> {
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut c: v4l2_encoder_cmd = unsafe { std::mem::zeroed() };
        c.cmd = cmd;
        ioctl(self.file.as_raw_fd(), vidioc::VIDIOC_ENCODER_CMD, &mut c)
            .map_err(|e| self.io_fail("ENCODER_CMD", e))
    }

    /// V4L2_ENC_CMD_STOP, then the coded frames still in the device up to the buffer flagged
    /// LAST (none, when every `encode` returned: one frame is in flight at a time).
    fn drain(&mut self, deadline: Instant) -> Result<Vec<Encoded>, M2mError> {
        self.encoder_cmd(ENC_CMD_STOP)?;
        let mut out = Vec::new();
        loop {
            self.reap_output()?;
            match self
                .cap
                .dequeue()
                .map_err(|e| self.io_fail("DQBUF CAPTURE", e))?
            {
                Some(dq) => {
                    if dq.flags & FLAG_ERROR != 0 {
                        return Err(
                            self.fail("a drained buffer flagged ERROR".into(), Failure::Error)
                        );
                    }
                    let data = self.cap.bytes(&dq).to_vec();
                    if !data.is_empty() {
                        let keyframe = keyframe_of(self.coded, dq.flags, &data).unwrap_or(false);
                        self.stats.frames_out += 1;
                        out.push(Encoded {
                            data,
                            keyframe,
                            ts: dq.ts,
                        });
                    }
                    if dq.flags & FLAG_LAST != 0 {
                        return Ok(out);
                    }
                    self.cap
                        .queue(dq.index, 0, 0)
                        .map_err(|e| self.io_fail("QBUF CAPTURE", e))?;
                }
                None => self.wait_for(libc::POLLIN, deadline, "the drain's LAST buffer")?,
            }
        }
    }

    /// The reset sequence (dev-encoder.rst "Reset"): drain, STREAMOFF and STREAMON on CAPTURE.
    /// What the device encodes next starts a stream of its own: a keyframe.
    fn restart(&mut self, deadline: Instant) -> Result<(), M2mError> {
        let left = self.drain(deadline)?;
        if !left.is_empty() {
            return Err(self.fail(
                format!(
                    "{} coded frames came out of a drain with nothing in flight",
                    left.len()
                ),
                Failure::Error,
            ));
        }
        self.cap
            .stream(false)
            .map_err(|e| self.io_fail("STREAMOFF CAPTURE", e))?;
        for i in 0..self.cap.maps.len() as u32 {
            self.cap
                .queue(i, 0, 0)
                .map_err(|e| self.io_fail("QBUF CAPTURE", e))?;
        }
        self.cap
            .stream(true)
            .map_err(|e| self.io_fail("STREAMON CAPTURE", e))?;
        Ok(())
    }

    /// Ends the stream the way the interface says (ENC_CMD_STOP, drain to LAST) and returns what
    /// was still in the device. The encoder takes no more frames afterwards.
    pub fn finish(&mut self) -> Result<Vec<Encoded>, M2mError> {
        if let Some(why) = &self.failed {
            return Err(M2mError::Device {
                device: self.device.clone(),
                what: format!("failed earlier: {why}"),
                failure: Failure::Error,
            });
        }
        let deadline = Instant::now() + self.timeout;
        let out = self.drain(deadline)?;
        self.failed = Some("finished".into());
        Ok(out)
    }
}

impl Drop for M2mEncoder {
    fn drop(&mut self) {
        // STREAMOFF on both queues (in Queue::release), unmap, free; errors mean the device is
        // gone and there is nothing left to stop. The descriptor closes after.
        self.cap.release();
        self.out.release();
    }
}

/// rigd's encoder seam: I420 planes in, one coded access unit out (the tag is a frame counter).
impl crate::h264::VideoEncoder for M2mEncoder {
    fn encode(
        &mut self,
        width: usize,
        height: usize,
        planes: (&[u8], &[u8], &[u8]),
        keyframe: bool,
    ) -> Result<crate::h264::AccessUnit, crate::h264::H264Error> {
        if (width, height) != (self.layout.width, self.layout.height) {
            return Err(crate::h264::H264Error::BadSize { width, height });
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        let e = M2mEncoder::encode(self, &[planes.0, planes.1, planes.2], keyframe, tag)?;
        Ok(crate::h264::AccessUnit {
            data: e.data,
            keyframe: e.keyframe,
        })
    }

    fn describe(&self) -> String {
        format!(
            "m2m {} `{}`, {} copies",
            self.device, self.info.card, self.stats.copies
        )
    }
}

/// One decoded picture, packed I420.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub i420: Vec<u8>,
    pub width: u32,
    pub height: u32,
    pub keyframe: bool,
    pub ts: u64,
}

/// The stateful decoder interface (dev-decoder.rst) for one resolution: the coded format on
/// OUTPUT, the first frame queued, the source-change event, then the CAPTURE queue in the format
/// the decoder reports (YU12 asked for). One coded frame per buffer, one in flight at a time.
pub struct M2mDecoder {
    device: String,
    out: Queue,
    cap: Queue,
    mplane: bool,
    coded: [u8; 4],
    layout: Option<RawLayout>,
    timeout: Duration,
    file: File,
}

impl M2mDecoder {
    pub fn open(
        path: impl AsRef<Path>,
        coded: [u8; 4],
        width: u32,
        height: u32,
    ) -> Result<Self, M2mError> {
        let device = path.as_ref().display().to_string();
        let dev_err = |op: &str, e: io::Error| M2mError::Device {
            device: device.clone(),
            what: format!("{op}: {e}"),
            failure: failure_of(&e),
        };
        let file = open_node(path.as_ref()).map_err(|e| dev_err("open", e))?;
        let fd = file.as_raw_fd();
        let info = m2m_info(fd)
            .map_err(|e| dev_err("QUERYCAP", e))?
            .ok_or_else(|| M2mError::Unsupported {
                device: device.clone(),
                what: "not a memory-to-memory device".into(),
            })?;
        let (out_type, cap_type) = queue_types(info.mplane);
        let o = set_format(fd, out_type, info.mplane, coded, width, height)
            .map_err(|e| dev_err("S_FMT OUTPUT", e))?;
        if o.fourcc != coded {
            return Err(M2mError::Unsupported {
                device,
                what: format!(
                    "S_FMT OUTPUT {} answered {}",
                    fourcc_str(coded),
                    fourcc_str(o.fourcc)
                ),
            });
        }
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut sub: v4l2_event_subscription = unsafe { std::mem::zeroed() };
        sub.type_ = EVENT_SOURCE_CHANGE;
        ioctl(fd, VIDIOC_SUBSCRIBE_EVENT, &mut sub).map_err(|e| dev_err("SUBSCRIBE_EVENT", e))?;
        let mut out = Queue::new(fd, out_type, info.mplane);
        out.request(2).map_err(|e| dev_err("REQBUFS OUTPUT", e))?;
        out.stream(true)
            .map_err(|e| dev_err("STREAMON OUTPUT", e))?;
        Ok(M2mDecoder {
            device,
            out,
            cap: Queue::new(fd, cap_type, info.mplane),
            mplane: info.mplane,
            coded,
            layout: None,
            timeout: Duration::from_secs(2),
            file,
        })
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn err(&self, what: String, failure: Failure) -> M2mError {
        M2mError::Device {
            device: self.device.clone(),
            what,
            failure,
        }
    }

    fn io_err(&self, op: &str, e: io::Error) -> M2mError {
        self.err(format!("{op}: {e}"), failure_of(&e))
    }

    fn poll(&self, events: i16, deadline: Instant, what: &str) -> Result<i16, M2mError> {
        let r =
            wait(self.file.as_raw_fd(), events, deadline).map_err(|e| self.io_err("poll", e))?;
        if r == 0 {
            return Err(self.err(
                format!("no {what} within {} ms", self.timeout.as_millis()),
                Failure::Timeout,
            ));
        }
        if r & (libc::POLLHUP | libc::POLLNVAL) != 0 {
            return Err(self.err(format!("the device hung up (poll {r:#x})"), Failure::Gone));
        }
        Ok(r)
    }

    /// The source-change event: the CAPTURE queue set up in the size the stream says.
    fn setup_capture(&mut self) -> Result<(), M2mError> {
        let fd = self.file.as_raw_fd();
        // SAFETY: a plain C struct (a union of plain structs); all-zero bytes are a valid value.
        let mut ev: v4l2_event = unsafe { std::mem::zeroed() };
        ioctl(fd, VIDIOC_DQEVENT, &mut ev).map_err(|e| self.io_err("DQEVENT", e))?;
        let cap_type = self.cap.type_;
        let f =
            get_format(fd, cap_type, self.mplane).map_err(|e| self.io_err("G_FMT CAPTURE", e))?;
        let f = if f.fourcc == *b"YU12" {
            f
        } else {
            set_format(fd, cap_type, self.mplane, *b"YU12", f.width, f.height)
                .map_err(|e| self.io_err("S_FMT CAPTURE", e))?
        };
        // The visible picture: the CAPTURE compose rectangle, else the whole format.
        let (w, h) =
            selection(fd, BUF_CAPTURE, SEL_TGT_COMPOSE, None).unwrap_or((f.width, f.height));
        self.layout = Some(layout_of(&f, w.min(f.width), h.min(f.height)));
        self.cap
            .request(4)
            .map_err(|e| self.io_err("REQBUFS CAPTURE", e))?;
        for i in 0..self.cap.maps.len() as u32 {
            self.cap
                .queue(i, 0, 0)
                .map_err(|e| self.io_err("QBUF CAPTURE", e))?;
        }
        self.cap
            .stream(true)
            .map_err(|e| self.io_err("STREAMON CAPTURE", e))
    }

    /// Decodes one coded frame; `ts` comes back with its picture.
    pub fn decode(&mut self, data: &[u8], ts: u64) -> Result<Decoded, M2mError> {
        let deadline = Instant::now() + self.timeout;
        let index = loop {
            while let Some(_dq) = self
                .out
                .dequeue()
                .map_err(|e| self.io_err("DQBUF OUTPUT", e))?
            {}
            if let Some(i) = self.out.free() {
                break i;
            }
            self.poll(libc::POLLOUT, deadline, "free OUTPUT buffer")?;
        };
        let room = self.out.maps[index as usize].len;
        if room < data.len() {
            return Err(self.err(
                format!(
                    "a coded frame of {} bytes, OUTPUT buffers of {room}",
                    data.len()
                ),
                Failure::Error,
            ));
        }
        self.out.bytes_mut(index)[..data.len()].copy_from_slice(data);
        self.out
            .queue(index, data.len(), ts)
            .map_err(|e| self.io_err("QBUF OUTPUT", e))?;
        loop {
            if self.layout.is_none() {
                let r = self.poll(libc::POLLPRI, deadline, "source-change event")?;
                if r & libc::POLLPRI != 0 {
                    self.setup_capture()?;
                }
                continue;
            }
            if let Some(dq) = self
                .cap
                .dequeue()
                .map_err(|e| self.io_err("DQBUF CAPTURE", e))?
            {
                let layout = self.layout.expect("set up");
                if dq.flags & FLAG_ERROR != 0 {
                    return Err(self.err(
                        format!("decoded buffer of ts {} flagged ERROR", dq.ts),
                        Failure::Error,
                    ));
                }
                let picture = layout.to_i420(self.cap.bytes(&dq));
                let (flags, got_ts, empty) = (dq.flags, dq.ts, dq.end == dq.start);
                self.cap
                    .queue(dq.index, 0, 0)
                    .map_err(|e| self.io_err("QBUF CAPTURE", e))?;
                if empty || got_ts != ts {
                    continue;
                }
                let i420 = picture
                    .ok_or_else(|| self.err("a short decoded buffer".into(), Failure::Error))?;
                return Ok(Decoded {
                    i420,
                    width: layout.width as u32,
                    height: layout.height as u32,
                    keyframe: flags & FLAG_KEYFRAME != 0,
                    ts: got_ts,
                });
            }
            while let Some(_dq) = self
                .out
                .dequeue()
                .map_err(|e| self.io_err("DQBUF OUTPUT", e))?
            {}
            let r = self.poll(libc::POLLIN | libc::POLLPRI, deadline, "decoded picture")?;
            if r & libc::POLLPRI != 0 {
                return Err(self.err(
                    "the stream changed resolution mid-way".into(),
                    Failure::Error,
                ));
            }
        }
    }

    /// V4L2_DEC_CMD_STOP (the decoder's drain); errors ignored: the check is over.
    pub fn stop(&mut self) {
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut c: v4l::v4l_sys::v4l2_decoder_cmd = unsafe { std::mem::zeroed() };
        c.cmd = DEC_CMD_STOP;
        let _ = ioctl(self.file.as_raw_fd(), VIDIOC_DECODER_CMD, &mut c);
        let _ = self.coded;
    }
}

impl Drop for M2mDecoder {
    fn drop(&mut self) {
        self.cap.release();
        self.out.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoder_device_must_be_m2m_and_code_to_h264() {
        let info = M2mInfo {
            driver: "vicodec".into(),
            card: "vicodec".into(),
            mplane: false,
        };
        let (yu12, nv12, h264, fwht) = (*b"YU12", *b"NV12", *b"H264", *b"FWHT");
        let verdict = |info, out: &[[u8; 4]], cap: &[[u8; 4]]| {
            encoder_verdict("/dev/video9", info, out, cap, h264)
        };
        assert_eq!(verdict(Some(&info), &[yu12, nv12], &[h264]), Ok(()));
        // A capture camera (no M2M capability).
        let e = verdict(None, &[], &[]).unwrap_err();
        assert!(e.contains("not a memory-to-memory"), "{e}");
        // vicodec's encoder codes FWHT, not H.264.
        let e = verdict(Some(&info), &[yu12], &[fwht]).unwrap_err();
        assert!(
            e.contains("not an H264 encoder") && e.contains("[FWHT]"),
            "{e}"
        );
        // An H.264 decoder: H264 in, raw out.
        let e = verdict(Some(&info), &[h264], &[yu12, h264]).unwrap_err();
        assert!(e.contains("not an H264 encoder"), "{e}");
    }

    #[test]
    fn checking_a_path_that_is_no_v4l2_device_says_so() {
        let e = check_encoder(Path::new("/dev/null"), *b"H264").unwrap_err();
        assert_eq!(e, "/dev/null: not a V4L2 device");
        let e = check_encoder(Path::new("/nonexistent/video7"), *b"H264").unwrap_err();
        assert!(
            e.starts_with("/nonexistent/video7: ") && e.contains("No such file"),
            "{e}"
        );
    }

    fn picture(w: usize, h: usize) -> Vec<u8> {
        (0..w * h * 3 / 2).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn i420_into_a_strided_yu12_buffer_and_back() {
        let l = RawLayout {
            fourcc: *b"YU12",
            width: 6,
            height: 4,
            stride: 8,
            rows: 6,
        };
        let p = picture(6, 4);
        let mut buf = vec![0xEEu8; l.buffer_len()];
        assert_eq!(l.buffer_len(), 8 * 6 + 8 * 3);
        assert_eq!(l.copy_into(&[&p], &mut buf), Some(36));
        // Row 1 of luma starts at the stride; U starts after `rows` luma rows at half stride.
        assert_eq!(&buf[8..14], &p[6..12]);
        assert_eq!(buf[6], 0xEE);
        assert_eq!(&buf[48..51], &p[24..27]);
        assert_eq!(&buf[48 + 4..48 + 7], &p[27..30]);
        assert_eq!(&buf[48 + 12..48 + 15], &p[30..33]);
        assert_eq!(l.to_i420(&buf).unwrap(), p);
        // Three planes give the same buffer.
        let mut buf2 = vec![0xEEu8; l.buffer_len()];
        l.copy_into(&[&p[..24], &p[24..30], &p[30..]], &mut buf2)
            .unwrap();
        assert_eq!(buf, buf2);
    }

    #[test]
    fn i420_into_nv12_is_interleaved() {
        let l = RawLayout {
            fourcc: *b"NV12",
            width: 4,
            height: 2,
            stride: 4,
            rows: 2,
        };
        let y = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut buf = vec![0u8; l.buffer_len()];
        l.copy_into(&[&y, &[10, 11], &[20, 21]], &mut buf).unwrap();
        assert_eq!(&buf[8..12], &[10, 20, 11, 21]);
        let mut i420 = y.to_vec();
        i420.extend_from_slice(&[10, 11, 20, 21]);
        assert_eq!(l.to_i420(&buf).unwrap(), i420);
    }

    #[test]
    fn wrong_sizes_are_refused() {
        let l = RawLayout {
            fourcc: *b"YU12",
            width: 4,
            height: 4,
            stride: 4,
            rows: 4,
        };
        let mut buf = vec![0u8; l.buffer_len()];
        assert_eq!(l.copy_into(&[&[0u8; 23]], &mut buf), None);
        assert_eq!(
            l.copy_into(&[&[0u8; 16], &[0u8; 4], &[0u8; 3]], &mut buf),
            None
        );
        assert_eq!(l.copy_into(&[&[0u8; 24]], &mut buf[..10]), None);
        assert_eq!(l.copy_into(&[&[0u8; 24]], &mut buf), Some(24));
    }

    #[test]
    fn keyframes_from_flags_or_bitstream() {
        let mut fwht = vec![0x4f, 0x4f, 0x4f, 0x4f, 0xff, 0xff, 0xff, 0xff];
        fwht.extend_from_slice(&3u32.to_be_bytes());
        fwht.extend_from_slice(&320u32.to_be_bytes());
        fwht.extend_from_slice(&240u32.to_be_bytes());
        fwht.extend_from_slice(&(1u32 << 10).to_be_bytes());
        fwht.extend_from_slice(&[0; 16]);
        fwht.extend_from_slice(&99u32.to_be_bytes());
        let h = fwht_header(&fwht).unwrap();
        assert_eq!((h.width, h.height, h.i_frame, h.size), (320, 240, true, 99));
        assert_eq!(keyframe_of(*b"FWHT", 0, &fwht), Some(true));
        assert_eq!(keyframe_of(*b"FWHT", FLAG_PFRAME, &fwht), Some(false));
        fwht[22] = 0;
        assert_eq!(keyframe_of(*b"FWHT", 0, &fwht), Some(false));
        assert_eq!(keyframe_of(*b"FWHT", 0, &fwht[..40]), None);
        assert_eq!(keyframe_of(*b"H264", 0, &[0, 0, 0, 1, 0x65, 1]), Some(true));
        assert_eq!(
            keyframe_of(*b"H264", 0, &[0, 0, 0, 1, 0x41, 1]),
            Some(false)
        );
        assert_eq!(keyframe_of(*b"VP80", FLAG_KEYFRAME, &[]), Some(true));
        assert_eq!(keyframe_of(*b"VP80", 0, &[]), None);
    }

    #[test]
    fn a_wait_ends_at_its_deadline_even_when_always_woken() {
        let mut fds = [0; 2];
        // SAFETY: a valid array of two descriptors for pipe() to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: writes one byte from a valid buffer into the pipe just made.
        assert_eq!(
            unsafe { libc::write(fds[1], b"x".as_ptr() as *const c_void, 1) },
            1
        );
        // Readable, never read: a loop waiting on it spins until the deadline, then stops.
        let soon = Instant::now() + Duration::from_millis(50);
        let mut woken = 0;
        while wait(fds[0], libc::POLLIN, soon).unwrap() != 0 {
            woken += 1;
        }
        assert!(woken > 0 && Instant::now() >= soon);
        // An empty pipe: the deadline passes in poll itself.
        let t = Instant::now();
        assert_eq!(
            wait(fds[1], libc::POLLIN, t + Duration::from_millis(30)).unwrap(),
            0
        );
        assert!(t.elapsed() >= Duration::from_millis(25));
        for fd in fds {
            // SAFETY: closes the two descriptors made above, once.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn timestamps_round_trip_through_a_timeval() {
        for ts in [0u64, 1, 999_999, 1_000_000, 1_733_500_000_123_456] {
            let tv = to_timeval(ts);
            assert_eq!(from_timeval(tv.tv_sec, tv.tv_usec), ts);
        }
    }

    #[test]
    fn nodes_in_numeric_order_and_no_encoder_without_devices() {
        let d = tempfile::tempdir().unwrap();
        for n in ["video10", "video2", "video0", "media0", "videox"] {
            std::fs::write(d.path().join(n), b"").unwrap();
        }
        let names: Vec<String> = video_nodes(d.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["video0", "video2", "video10"]);
        // Plain files are no M2M devices (QUERYCAP fails): nothing found, no panic.
        assert_eq!(find_m2m(d.path(), |_, _| true), None);
        assert_eq!(raw_fourcc("yuv420"), Some(*b"YU12"));
        assert_eq!(raw_fourcc("nv12"), Some(*b"NV12"));
    }
}
