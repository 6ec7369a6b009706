//! libturbojpeg's YUV-plane encoder, loaded at run time (feature `turbojpeg`).
//!
//! YUYV and NV12 are Y'CbCr already: `tjCompressFromYUVPlanes` takes the planes as they are and
//! skips colour conversion and chroma downsampling, the part of a JPEG encode a camera frame does
//! not need. The library is opened with `dlopen("libturbojpeg.so.0")` on first use, not linked:
//! the binary and its package do not depend on it, and where it is absent (a static build, a rig
//! without the package) [`library`] says so once and the pure-Rust encoder in `camera` is used.
//! Measured side by side in docs/PERFORMANCE.md ("YUYV to JPEG").
#![allow(unsafe_code)] // FFI to libturbojpeg; every block says why it is sound

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::sync::OnceLock;

/// The soname of libjpeg-turbo's TurboJPEG API (Debian: libturbojpeg0).
pub const SONAME: &CStr = c"libturbojpeg.so.0";

const TJFLAG_NOREALLOC: c_int = 1024;
const TJFLAG_FASTDCT: c_int = 2048;

/// Chroma subsampling of the planes handed over (TurboJPEG's TJSAMP values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    /// Chroma planes of half width, full height (YUYV).
    S422 = 1,
    /// Chroma planes of half width and half height (NV12).
    S420 = 2,
}

type InitCompress = unsafe extern "C" fn() -> *mut c_void;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type BufSize = unsafe extern "C" fn(c_int, c_int, c_int) -> c_ulong;
type GetErrorStr2 = unsafe extern "C" fn(*mut c_void) -> *mut c_char;
type CompressFromYuvPlanes = unsafe extern "C" fn(
    *mut c_void,
    *const *const u8,
    c_int,
    *const c_int,
    c_int,
    c_int,
    *mut *mut u8,
    *mut c_ulong,
    c_int,
    c_int,
) -> c_int;

/// The entry points used, resolved once.
#[derive(Debug)]
pub struct Library {
    init_compress: InitCompress,
    destroy: Destroy,
    buf_size: BufSize,
    error_str: GetErrorStr2,
    compress: CompressFromYuvPlanes,
}

/// The loaded library, or `None` (logged once) when it cannot be opened.
pub fn library() -> Option<&'static Library> {
    static LIB: OnceLock<Option<Library>> = OnceLock::new();
    LIB.get_or_init(|| match Library::open() {
        Ok(l) => {
            tracing::debug!(library = ?SONAME, "JPEG: encoding raw frames with libturbojpeg");
            Some(l)
        }
        Err(e) => {
            tracing::info!(library = ?SONAME, reason = %e,
                "JPEG: libturbojpeg not available, raw frames use the built-in encoder");
            None
        }
    })
    .as_ref()
}

impl Library {
    fn open() -> Result<Self, String> {
        // SAFETY: dlopen with a NUL-terminated name; the handle is never closed, so the function
        // pointers taken from it stay valid for the life of the process.
        let h = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next call.
            let e = unsafe { libc::dlerror() };
            return Err(if e.is_null() {
                "dlopen failed".into()
            } else {
                // SAFETY: non-null, NUL-terminated (above).
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            });
        }
        let sym = |name: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: h is a live handle from dlopen, name is NUL-terminated.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) };
            if p.is_null() {
                Err(format!(
                    "{} has no {}",
                    SONAME.to_string_lossy(),
                    name.to_string_lossy()
                ))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is the TurboJPEG 2.x function of that name, whose C signature the
        // types above spell out (turbojpeg.h of libjpeg-turbo 2.0 and later).
        unsafe {
            Ok(Self {
                init_compress: std::mem::transmute::<*mut c_void, InitCompress>(sym(
                    c"tjInitCompress",
                )?),
                destroy: std::mem::transmute::<*mut c_void, Destroy>(sym(c"tjDestroy")?),
                buf_size: std::mem::transmute::<*mut c_void, BufSize>(sym(c"tjBufSize")?),
                error_str: std::mem::transmute::<*mut c_void, GetErrorStr2>(sym(
                    c"tjGetErrorStr2",
                )?),
                compress: std::mem::transmute::<*mut c_void, CompressFromYuvPlanes>(sym(
                    c"tjCompressFromYUVPlanes",
                )?),
            })
        }
    }
}

/// A compressor handle, one per thread (TurboJPEG handles are not shared between threads).
struct Handle {
    lib: &'static Library,
    ptr: *mut c_void,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: ptr came from tjInitCompress of this library and is destroyed once.
        unsafe { (self.lib.destroy)(self.ptr) };
    }
}

thread_local! {
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

/// Planes of one frame: Y (`width` x `height`), then Cb and Cr at the subsampled size, each
/// tightly packed.
pub struct Planes<'a> {
    pub width: u32,
    pub height: u32,
    pub subsampling: Subsampling,
    pub y: &'a [u8],
    pub cb: &'a [u8],
    pub cr: &'a [u8],
}

/// Encodes `planes` into `out` (replacing its contents). `fast_dct`: TurboJPEG's faster, slightly
/// less accurate forward DCT. The caller has checked the sizes: `width`, `height` within
/// 1..=65535 and every plane at least as long as its size.
pub fn encode(
    lib: &'static Library,
    planes: &Planes<'_>,
    quality: u8,
    fast_dct: bool,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let (width, height, sub) = (planes.width, planes.height, planes.subsampling);
    let (w, h) = (width as usize, height as usize);
    let (cw, ch) = match sub {
        Subsampling::S422 => (w.div_ceil(2), h),
        Subsampling::S420 => (w.div_ceil(2), h.div_ceil(2)),
    };
    if planes.y.len() < w * h || planes.cb.len() < cw * ch || planes.cr.len() < cw * ch {
        return Err(format!("planes too short for {width}x{height}"));
    }
    HANDLE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            // SAFETY: no arguments; returns NULL on failure (checked).
            let ptr = unsafe { (lib.init_compress)() };
            if ptr.is_null() {
                return Err("tjInitCompress failed".to_string());
            }
            *slot = Some(Handle { lib, ptr });
        }
        let handle = slot.as_ref().map(|h| h.ptr).unwrap_or(std::ptr::null_mut());
        // SAFETY: pure function of its arguments.
        let cap = unsafe { (lib.buf_size)(width as c_int, height as c_int, sub as c_int) } as usize;
        out.clear();
        out.reserve(cap);
        let src = [planes.y.as_ptr(), planes.cb.as_ptr(), planes.cr.as_ptr()];
        let strides = [w as c_int, cw as c_int, cw as c_int];
        let mut buf = out.as_mut_ptr();
        let mut size = out.capacity() as c_ulong;
        let flags = TJFLAG_NOREALLOC | if fast_dct { TJFLAG_FASTDCT } else { 0 };
        // SAFETY: handle is a live compressor of this thread; the three planes are at least
        // stride * rows long (checked above); with TJFLAG_NOREALLOC the library writes at most
        // `size` bytes (out's capacity, tjBufSize's worst case) into `buf` and never frees it.
        let r = unsafe {
            (lib.compress)(
                handle,
                src.as_ptr(),
                width as c_int,
                strides.as_ptr(),
                height as c_int,
                sub as c_int,
                &mut buf,
                &mut size,
                quality.clamp(1, 100) as c_int,
                flags,
            )
        };
        if r != 0 {
            // SAFETY: a NUL-terminated message owned by the handle, copied at once.
            let msg = unsafe { CStr::from_ptr((lib.error_str)(handle)) };
            return Err(msg.to_string_lossy().into_owned());
        }
        if buf != out.as_mut_ptr() || size as usize > out.capacity() {
            return Err("libturbojpeg moved the output buffer".to_string());
        }
        // SAFETY: the library wrote `size` initialised bytes into out's allocation (checked).
        unsafe { out.set_len(size as usize) };
        Ok(())
    })
}
