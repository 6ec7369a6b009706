//! Multi-planar V4L2 capture (`V4L2_BUF_TYPE_VIDEO_CAPTURE_MPLANE`), as SoC cameras and ISPs
//! expose it: the `v4l` crate streams single-planar buffers only, so this module does the
//! multi-planar calls itself (VIDIOC_ENUM_FMT, S_FMT with `pix_mp`, S_PARM, REQBUFS, QUERYBUF,
//! mmap of every plane, QBUF/DQBUF with a plane array, STREAMON/OFF) on the device's descriptor.
//!
//! A buffer of a single-plane format (YUYV, NV12) is handed over as it is; NV12M's two planes
//! (Y, then interleaved CbCr, in separate buffers) are joined into one NV12 frame for the encoder.
#![allow(unsafe_code)] // V4L2 ioctls and mmap; every block says why it is sound

use std::os::raw::c_void;
use std::os::unix::io::RawFd;

use v4l::v4l2::vidioc;
use v4l::v4l_sys::{
    v4l2_buffer, v4l2_fmtdesc, v4l2_format, v4l2_plane, v4l2_requestbuffers, v4l2_streamparm,
};

/// V4L2_BUF_TYPE_VIDEO_CAPTURE_MPLANE.
pub const BUF_TYPE: u32 = 9;
const MEMORY_MMAP: u32 = 1;
/// Most planes a V4L2 format has (VIDEO_MAX_PLANES).
const MAX_PLANES: usize = 8;

fn ioctl<T>(fd: RawFd, request: vidioc::_IOC_TYPE, arg: &mut T) -> std::io::Result<()> {
    // SAFETY: every caller passes the struct type the request code is defined for (the codes
    // encode its size); the struct lives for the whole call and the kernel writes only into it.
    unsafe { v4l::v4l2::ioctl(fd, request, arg as *mut T as *mut c_void) }
}

/// The fourccs the device offers for multi-planar capture.
pub fn formats(fd: RawFd) -> std::io::Result<Vec<[u8; 4]>> {
    let mut out = Vec::new();
    for index in 0..256 {
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut d: v4l2_fmtdesc = unsafe { std::mem::zeroed() };
        d.index = index;
        d.type_ = BUF_TYPE;
        match ioctl(fd, vidioc::VIDIOC_ENUM_FMT, &mut d) {
            Ok(()) => out.push(d.pixelformat.to_le_bytes()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// What S_FMT answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneFormat {
    pub fourcc: [u8; 4],
    pub width: u32,
    pub height: u32,
    pub num_planes: usize,
    /// Bytes per row of plane 0.
    pub stride: u32,
}

/// VIDIOC_S_FMT for multi-planar capture.
pub fn set_format(
    fd: RawFd,
    width: u32,
    height: u32,
    fourcc: [u8; 4],
) -> std::io::Result<PlaneFormat> {
    // SAFETY: a plain C struct (a union of plain structs); all-zero bytes are a valid value.
    let mut f: v4l2_format = unsafe { std::mem::zeroed() };
    f.type_ = BUF_TYPE;
    // Writing a union's plain-integer fields needs no unsafe.
    f.fmt.pix_mp.width = width;
    f.fmt.pix_mp.height = height;
    f.fmt.pix_mp.pixelformat = u32::from_le_bytes(fourcc);
    f.fmt.pix_mp.field = 1; // V4L2_FIELD_NONE
    ioctl(fd, vidioc::VIDIOC_S_FMT, &mut f)?;
    // SAFETY: for BUF_TYPE the kernel answers in `pix_mp`.
    let p = unsafe { f.fmt.pix_mp };
    Ok(PlaneFormat {
        fourcc: p.pixelformat.to_le_bytes(),
        width: p.width,
        height: p.height,
        num_planes: (p.num_planes as usize).clamp(1, MAX_PLANES),
        stride: p.plane_fmt[0].bytesperline,
    })
}

/// VIDIOC_S_PARM: asks for a frame interval; returns the driver's answer as fps, if any.
pub fn set_interval(fd: RawFd, numerator: u32, denominator: u32) -> Option<f64> {
    // SAFETY: a plain C struct; all-zero bytes are a valid value.
    let mut p: v4l2_streamparm = unsafe { std::mem::zeroed() };
    p.type_ = BUF_TYPE;
    p.parm.capture.timeperframe.numerator = numerator;
    p.parm.capture.timeperframe.denominator = denominator;
    ioctl(fd, vidioc::VIDIOC_S_PARM, &mut p).ok()?;
    // SAFETY: for a capture type the kernel answers in `capture`.
    let t = unsafe { p.parm.capture.timeperframe };
    (t.numerator > 0 && t.denominator > 0).then(|| t.denominator as f64 / t.numerator as f64)
}

/// One mapped plane.
struct Map {
    ptr: *mut c_void,
    len: usize,
}

/// A dequeued buffer: its index (to queue it again), the used bytes of each plane, and what the
/// driver said about it.
pub struct Dequeued<'a> {
    pub index: u32,
    pub planes: Vec<&'a [u8]>,
    pub meta: v4l::buffer::Metadata,
}

/// Mapped multi-planar buffers, streaming from creation until drop.
pub struct MplaneStream {
    fd: RawFd,
    num_planes: usize,
    buffers: Vec<Vec<Map>>,
    queued: Vec<bool>,
}

impl MplaneStream {
    /// REQBUFS `count` buffers, maps every plane, queues them all and streams on. `fd` must stay
    /// open for the life of the stream (the caller keeps the device).
    pub fn new(fd: RawFd, count: u32, num_planes: usize) -> std::io::Result<Self> {
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut req: v4l2_requestbuffers = unsafe { std::mem::zeroed() };
        req.count = count;
        req.type_ = BUF_TYPE;
        req.memory = MEMORY_MMAP;
        ioctl(fd, vidioc::VIDIOC_REQBUFS, &mut req)?;
        let mut s = Self {
            fd,
            num_planes,
            buffers: Vec::new(),
            queued: Vec::new(),
        };
        for index in 0..req.count {
            let (mut buf, planes) = s.buffer(index);
            ioctl(fd, vidioc::VIDIOC_QUERYBUF, &mut buf)?;
            let mut maps = Vec::with_capacity(num_planes);
            for p in planes.iter().take(buf.length as usize) {
                // SAFETY: QUERYBUF filled the mmap offset of this plane (the `mem_offset` member).
                let offset = unsafe { p.m.mem_offset };
                // SAFETY: maps `length` bytes of the driver's buffer at the offset it gave; the
                // mapping is unmapped once, in drop, before the descriptor is closed.
                let ptr = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        p.length as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        fd,
                        offset as libc::off_t,
                    )
                };
                if ptr == libc::MAP_FAILED {
                    return Err(std::io::Error::last_os_error());
                }
                maps.push(Map {
                    ptr,
                    len: p.length as usize,
                });
            }
            s.buffers.push(maps);
            s.queued.push(false);
        }
        for index in 0..s.buffers.len() as u32 {
            s.queue(index)?;
        }
        let mut t = BUF_TYPE as i32;
        ioctl(fd, vidioc::VIDIOC_STREAMON, &mut t)?;
        Ok(s)
    }

    /// Buffers granted.
    pub fn count(&self) -> u32 {
        self.buffers.len() as u32
    }

    fn buffer(&self, index: u32) -> (v4l2_buffer, Box<[v4l2_plane; MAX_PLANES]>) {
        // SAFETY: plain C structs; all-zero bytes are valid values.
        let mut planes: Box<[v4l2_plane; MAX_PLANES]> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: as above.
        let mut buf: v4l2_buffer = unsafe { std::mem::zeroed() };
        buf.index = index;
        buf.type_ = BUF_TYPE;
        buf.memory = MEMORY_MMAP;
        buf.length = self.num_planes as u32;
        buf.m.planes = planes.as_mut_ptr();
        (buf, planes)
    }

    /// Hands buffer `index` back to the driver.
    pub fn queue(&mut self, index: u32) -> std::io::Result<()> {
        let (mut buf, _planes) = self.buffer(index);
        // `_planes` outlives the call: the kernel reads the plane array through buf.m.planes.
        ioctl(self.fd, vidioc::VIDIOC_QBUF, &mut buf)?;
        self.queued[index as usize] = true;
        Ok(())
    }

    /// Takes the next filled buffer (the caller has polled the descriptor readable).
    pub fn dequeue(&mut self) -> std::io::Result<Dequeued<'_>> {
        let (mut buf, planes) = self.buffer(0);
        ioctl(self.fd, vidioc::VIDIOC_DQBUF, &mut buf)?;
        let index = buf.index;
        let maps = self.buffers.get(index as usize).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "DQBUF: unknown buffer index",
            )
        })?;
        self.queued[index as usize] = false;
        let mut out = Vec::with_capacity(maps.len());
        let mut used = 0u32;
        for (map, p) in maps.iter().zip(planes.iter()) {
            let end = (p.bytesused as usize).min(map.len);
            let start = (p.data_offset as usize).min(end);
            used += (end - start) as u32;
            // SAFETY: the mapping is `map.len` bytes long and stays mapped while `self` is
            // borrowed; the driver does not write into a dequeued buffer until it is queued again,
            // which needs `&mut self`, so the slice cannot outlive that.
            out.push(unsafe {
                std::slice::from_raw_parts((map.ptr as *const u8).add(start), end - start)
            });
        }
        let meta = v4l::buffer::Metadata {
            bytesused: used,
            flags: v4l::buffer::Flags::from(buf.flags),
            field: buf.field,
            timestamp: v4l::timestamp::Timestamp::from(buf.timestamp),
            sequence: buf.sequence,
        };
        Ok(Dequeued {
            index,
            planes: out,
            meta,
        })
    }
}

impl Drop for MplaneStream {
    fn drop(&mut self) {
        let mut t = BUF_TYPE as i32;
        // Errors here mean the device is gone: nothing left to stop.
        let _ = ioctl(self.fd, vidioc::VIDIOC_STREAMOFF, &mut t);
        for maps in &self.buffers {
            for m in maps {
                // SAFETY: each mapping was made by mmap in `new` with this length, unmapped once.
                unsafe { libc::munmap(m.ptr, m.len) };
            }
        }
        // SAFETY: a plain C struct; all-zero bytes are a valid value.
        let mut req: v4l2_requestbuffers = unsafe { std::mem::zeroed() };
        req.type_ = BUF_TYPE;
        req.memory = MEMORY_MMAP;
        let _ = ioctl(self.fd, vidioc::VIDIOC_REQBUFS, &mut req);
    }
}
