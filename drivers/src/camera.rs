//! Camera frames: raw V4L2 pixel formats encoded to JPEG (the wire payload), and the check that an
//! MJPEG buffer holds a whole JPEG. Pure; the V4L2 capture loop (feature `camera`) is not written
//! yet (see docs/DRIVERS.md).
//!
//! YUYV (4:2:2) and NV12 (4:2:0) are fed to the encoder as Y'CbCr directly, with no RGB round
//! trip, and keep their chroma subsampling in the JPEG. Two encoders ([`JpegBackend`]): the
//! built-in pure-Rust `jpeg-encoder`, and with feature `turbojpeg` libturbojpeg's YUV-plane API
//! when the library can be opened (the frame split into Y, Cb and Cr planes first; 2-3x faster,
//! docs/PERFORMANCE.md). [`JpegBackend::preferred`] picks the faster one available.

use jpeg_encoder::{ColorType, Encoder, ImageBuffer, JpegColorType, SamplingFactor};

/// Why a raw frame could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("{format} {width}x{height} needs {need} bytes, the buffer has {have}")]
    ShortBuffer {
        format: &'static str,
        width: u32,
        height: u32,
        need: usize,
        have: usize,
    },
    #[error("{width}x{height} is not encodable (1..=65535, even width)")]
    BadSize { width: u32, height: u32 },
    #[error("JPEG encoder: {0}")]
    Encoder(#[from] jpeg_encoder::EncodingError),
    #[error("libturbojpeg: {0}")]
    Turbo(String),
}

/// Packed YUYV 4:2:2 (`w` even, `h` even, `w * h * 2` bytes) to planar I420 in `out` (Y, then
/// U, then V): the H.264 encoder's input. A 2x2 block's chroma is the mean of its two rows'.
pub fn yuyv_to_i420(w: usize, h: usize, yuyv: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.resize(w * h * 3 / 2, 0);
    let (y, chroma) = out.split_at_mut(w * h);
    let (u, v) = chroma.split_at_mut(w * h / 4);
    for row in 0..h {
        let src = &yuyv[row * w * 2..][..w * 2];
        for (d, s) in y[row * w..][..w].iter_mut().zip(src.iter().step_by(2)) {
            *d = *s;
        }
    }
    for crow in 0..h / 2 {
        let (a, b) = (
            &yuyv[2 * crow * w * 2..][..w * 2],
            &yuyv[(2 * crow + 1) * w * 2..][..w * 2],
        );
        for x in 0..w / 2 {
            let mean = |i: usize| (a[4 * x + i] as u16 + b[4 * x + i] as u16).div_ceil(2) as u8;
            u[crow * w / 2 + x] = mean(1);
            v[crow * w / 2 + x] = mean(3);
        }
    }
}

/// NV12 (a Y plane, then interleaved CbCr at half size; `w * h * 3 / 2` bytes) to planar I420.
pub fn nv12_to_i420(w: usize, h: usize, nv12: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&nv12[..w * h]);
    let cbcr = &nv12[w * h..][..w * h / 2];
    out.extend(cbcr.iter().step_by(2));
    out.extend(cbcr.iter().skip(1).step_by(2));
}

/// Which encoder turns raw frames into JPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JpegBackend {
    /// `jpeg-encoder`, pure Rust (its AVX2 path with feature `jpeg-simd`).
    Builtin,
    /// libturbojpeg from Y'CbCr planes; `fast_dct` is TurboJPEG's faster forward DCT.
    #[cfg(feature = "turbojpeg")]
    Turbo { fast_dct: bool },
}

impl JpegBackend {
    /// The fastest encoder this process can use: libturbojpeg (accurate DCT) when built with
    /// `turbojpeg` and the library opens, else the built-in one.
    pub fn preferred() -> Self {
        #[cfg(feature = "turbojpeg")]
        if crate::turbojpeg::library().is_some() {
            return JpegBackend::Turbo { fast_dct: false };
        }
        JpegBackend::Builtin
    }

    pub fn name(&self) -> &'static str {
        match self {
            JpegBackend::Builtin => "jpeg-encoder",
            #[cfg(feature = "turbojpeg")]
            JpegBackend::Turbo { fast_dct: false } => "libturbojpeg",
            #[cfg(feature = "turbojpeg")]
            JpegBackend::Turbo { fast_dct: true } => "libturbojpeg-fastdct",
        }
    }
}

/// Splits packed YUYV into Y (width x height) and Cb, Cr (width/2 x height) planes. Written
/// as index loops over pre-sized planes so the compiler vectorises it (pushing byte by byte took
/// 3.4 ms for a 1080p frame, this about a third of that).
pub fn yuyv_to_planes(data: &[u8], y: &mut Vec<u8>, cb: &mut Vec<u8>, cr: &mut Vec<u8>) {
    let n = data.len() / 4;
    y.resize(n * 2, 0);
    cb.resize(n, 0);
    cr.resize(n, 0);
    for (((px, yy), u), v) in data
        .chunks_exact(4)
        .zip(y.chunks_exact_mut(2))
        .zip(cb.iter_mut())
        .zip(cr.iter_mut())
    {
        yy[0] = px[0];
        yy[1] = px[2];
        *u = px[1];
        *v = px[3];
    }
}

/// Splits interleaved CbCr (NV12's second plane) into Cb and Cr planes.
pub fn uv_to_planes(uv: &[u8], cb: &mut Vec<u8>, cr: &mut Vec<u8>) {
    let n = uv.len() / 2;
    cb.resize(n, 0);
    cr.resize(n, 0);
    for ((c, u), v) in uv.chunks_exact(2).zip(cb.iter_mut()).zip(cr.iter_mut()) {
        *u = c[0];
        *v = c[1];
    }
}

#[cfg(feature = "turbojpeg")]
thread_local! {
    /// Plane scratch for libturbojpeg, reused frame after frame.
    static PLANES: std::cell::RefCell<[Vec<u8>; 3]> = const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

struct Yuyv<'a> {
    width: u16,
    height: u16,
    data: &'a [u8],
}

impl ImageBuffer for Yuyv<'_> {
    fn get_jpeg_color_type(&self) -> JpegColorType {
        JpegColorType::Ycbcr
    }
    fn width(&self) -> u16 {
        self.width
    }
    fn height(&self) -> u16 {
        self.height
    }
    fn fill_buffers(&self, y: u16, buffers: &mut [Vec<u8>; 4]) {
        let stride = self.width as usize * 2;
        let row = &self.data[y as usize * stride..(y as usize + 1) * stride];
        for px in row.chunks_exact(4) {
            let (y0, u, y1, v) = (px[0], px[1], px[2], px[3]);
            buffers[0].extend_from_slice(&[y0, y1]);
            buffers[1].extend_from_slice(&[u, u]);
            buffers[2].extend_from_slice(&[v, v]);
        }
    }
}

/// A 4:2:0 frame for the pure-Rust encoder: the Y plane, then chroma at half resolution either
/// interleaved (NV12: CbCr pairs) or planar (I420: all Cb, then all Cr).
struct Yuv420<'a> {
    width: u16,
    height: u16,
    data: &'a [u8],
    interleaved: bool,
}

impl ImageBuffer for Yuv420<'_> {
    fn get_jpeg_color_type(&self) -> JpegColorType {
        JpegColorType::Ycbcr
    }
    fn width(&self) -> u16 {
        self.width
    }
    fn height(&self) -> u16 {
        self.height
    }
    fn fill_buffers(&self, y: u16, buffers: &mut [Vec<u8>; 4]) {
        let (w, h) = (self.width as usize, self.height as usize);
        let y = y as usize;
        buffers[0].extend_from_slice(&self.data[y * w..(y + 1) * w]);
        let mut put = |cb: u8, cr: u8| {
            buffers[1].extend_from_slice(&[cb, cb]);
            buffers[2].extend_from_slice(&[cr, cr]);
        };
        if self.interleaved {
            let uv = &self.data[w * h + (y / 2) * w..][..w];
            for c in uv.chunks_exact(2) {
                put(c[0], c[1]);
            }
        } else {
            let cw = w / 2;
            let u = &self.data[w * h + (y / 2) * cw..][..cw];
            let v = &self.data[w * h + (w * h) / 4 + (y / 2) * cw..][..cw];
            for (cb, cr) in u.iter().zip(v) {
                put(*cb, *cr);
            }
        }
    }
}

fn check(
    format: &'static str,
    width: u32,
    height: u32,
    need: usize,
    have: usize,
) -> Result<(u16, u16), EncodeError> {
    if width == 0 || height == 0 || width > 65_535 || height > 65_535 || width % 2 != 0 {
        return Err(EncodeError::BadSize { width, height });
    }
    if have < need {
        return Err(EncodeError::ShortBuffer {
            format,
            width,
            height,
            need,
            have,
        });
    }
    Ok((width as u16, height as u16))
}

/// Encodes a packed YUYV (YUY2) frame to JPEG, 4:2:2, with [`JpegBackend::preferred`].
pub fn yuyv_to_jpeg(
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    yuyv_to_jpeg_with(JpegBackend::preferred(), width, height, data, quality, out)
}

/// [`yuyv_to_jpeg`] with the encoder chosen by the caller.
pub fn yuyv_to_jpeg_with(
    backend: JpegBackend,
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let need = width as usize * height as usize * 2;
    let (w, h) = check("YUYV", width, height, need, data.len())?;
    #[cfg(feature = "turbojpeg")]
    if let (JpegBackend::Turbo { fast_dct }, Some(lib)) = (backend, crate::turbojpeg::library()) {
        return PLANES.with(|p| {
            let [y, cb, cr] = &mut *p.borrow_mut();
            yuyv_to_planes(&data[..need], y, cb, cr);
            let planes = crate::turbojpeg::Planes {
                width,
                height,
                subsampling: crate::turbojpeg::Subsampling::S422,
                y,
                cb,
                cr,
            };
            crate::turbojpeg::encode(lib, &planes, quality, fast_dct, out)
                .map_err(EncodeError::Turbo)
        });
    }
    let _ = backend;
    out.clear();
    let mut enc = Encoder::new(out, quality);
    enc.set_sampling_factor(SamplingFactor::R_4_2_2);
    enc.encode_image(Yuyv {
        width: w,
        height: h,
        data,
    })?;
    Ok(())
}

/// Encodes an NV12 frame (Y plane, then interleaved CbCr at half resolution) to JPEG, 4:2:0,
/// with [`JpegBackend::preferred`].
pub fn nv12_to_jpeg(
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    nv12_to_jpeg_with(JpegBackend::preferred(), width, height, data, quality, out)
}

/// [`nv12_to_jpeg`] with the encoder chosen by the caller.
pub fn nv12_to_jpeg_with(
    backend: JpegBackend,
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    yuv420_to_jpeg(backend, true, width, height, data, quality, out)
}

/// Encodes an I420 frame (Y, then U and V at half resolution, tight strides) to JPEG, 4:2:0, with
/// [`JpegBackend::preferred`]: a decoded H.264 keyframe as the status page's still.
pub fn i420_to_jpeg(
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    i420_to_jpeg_with(JpegBackend::preferred(), width, height, data, quality, out)
}

/// [`i420_to_jpeg`] with the encoder chosen by the caller.
pub fn i420_to_jpeg_with(
    backend: JpegBackend,
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    yuv420_to_jpeg(backend, false, width, height, data, quality, out)
}

/// A 4:2:0 frame to JPEG: the Y plane, then chroma at half resolution, `interleaved` (NV12: CbCr
/// pairs, split into planes for libturbojpeg) or planar (I420: all Cb, then all Cr).
fn yuv420_to_jpeg(
    backend: JpegBackend,
    interleaved: bool,
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    if height % 2 != 0 {
        return Err(EncodeError::BadSize { width, height });
    }
    let luma = width as usize * height as usize;
    let need = luma + luma / 2;
    let format = if interleaved { "NV12" } else { "I420" };
    let (w, h) = check(format, width, height, need, data.len())?;
    #[cfg(feature = "turbojpeg")]
    if let (JpegBackend::Turbo { fast_dct }, Some(lib)) = (backend, crate::turbojpeg::library()) {
        return PLANES.with(|p| {
            let [_, split_cb, split_cr] = &mut *p.borrow_mut();
            let (cb, cr) = if interleaved {
                uv_to_planes(&data[luma..need], split_cb, split_cr);
                (&split_cb[..], &split_cr[..])
            } else {
                (&data[luma..luma + luma / 4], &data[luma + luma / 4..need])
            };
            let planes = crate::turbojpeg::Planes {
                width,
                height,
                subsampling: crate::turbojpeg::Subsampling::S420,
                y: &data[..luma],
                cb,
                cr,
            };
            crate::turbojpeg::encode(lib, &planes, quality, fast_dct, out)
                .map_err(EncodeError::Turbo)
        });
    }
    let _ = backend;
    out.clear();
    let mut enc = Encoder::new(out, quality);
    enc.set_sampling_factor(SamplingFactor::R_4_2_0);
    enc.encode_image(Yuv420 {
        width: w,
        height: h,
        data,
        interleaved,
    })?;
    Ok(())
}

/// Encodes 8-bit grey to JPEG (used for tests and a `GREY` camera).
pub fn grey_to_jpeg(width: u16, height: u16, data: &[u8], quality: u8) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = Encoder::new(&mut out, quality).encode(data, width, height, ColorType::Luma);
    out
}

/// The JPEG inside an MJPEG buffer, or `None` when the buffer is not a whole JPEG (the first
/// buffer after stream-on often is not): it must start with SOI and end with EOI, trailing zero
/// padding allowed.
pub fn mjpeg_frame(buf: &[u8]) -> Option<&[u8]> {
    if buf.len() < 4 || buf[..2] != [0xFF, 0xD8] {
        return None;
    }
    let end = buf.iter().rposition(|&b| b != 0)? + 1;
    (end >= 4 && buf[end - 2..end] == [0xFF, 0xD9]).then_some(&buf[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A YUYV frame with a horizontal luma ramp and constant chroma.
    fn yuyv(w: usize, h: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(w * h * 2);
        for _ in 0..h {
            for x in (0..w).step_by(2) {
                v.extend_from_slice(&[(x * 255 / w) as u8, 90, ((x + 1) * 255 / w) as u8, 200]);
            }
        }
        v
    }

    fn decode(jpeg: &[u8]) -> (jpeg_decoder::ImageInfo, Vec<u8>) {
        let mut d = jpeg_decoder::Decoder::new(jpeg);
        let pixels = d.decode().expect("decodes");
        (d.info().unwrap(), pixels)
    }

    /// Every encoder this build has (libturbojpeg only where the library opens).
    fn backends() -> Vec<JpegBackend> {
        #[allow(unused_mut)]
        let mut v = vec![JpegBackend::Builtin];
        #[cfg(feature = "turbojpeg")]
        if crate::turbojpeg::library().is_some() {
            v.push(JpegBackend::Turbo { fast_dct: false });
            v.push(JpegBackend::Turbo { fast_dct: true });
        }
        v
    }

    #[test]
    fn yuyv_encodes_to_a_decodable_jpeg_of_the_same_size() {
        let (w, h) = (64, 48);
        for backend in backends() {
            let mut out = Vec::new();
            yuyv_to_jpeg_with(backend, w, h, &yuyv(64, 48), 90, &mut out).unwrap();
            assert!(mjpeg_frame(&out).is_some(), "{backend:?}");
            let (info, rgb) = decode(&out);
            assert_eq!((info.width, info.height), (64, 48), "{backend:?}");
            // Y 128, Cb 90, Cr 200 is a red-orange: R high, B low.
            let mid = (24 * 64 + 32) * 3;
            let (r, g, b) = (rgb[mid], rgb[mid + 1], rgb[mid + 2]);
            assert!(r > 200 && b < 80 && g < r, "{backend:?}: {r} {g} {b}");
            // The luma ramp survives: left darker than right.
            assert!(rgb[24 * 64 * 3] < rgb[(24 * 64 + 63) * 3], "{backend:?}");
        }
    }

    #[test]
    fn i420_and_nv12_of_one_picture_make_the_same_jpeg() {
        let (w, h) = (64usize, 48usize);
        let y: Vec<u8> = (0..w * h).map(|i| (i * 7 % 251) as u8).collect();
        let (cb, cr): (Vec<u8>, Vec<u8>) = (0..w * h / 4)
            .map(|i| ((i * 3 % 200) as u8 + 20, (255 - i * 5 % 180) as u8))
            .unzip();
        let nv12: Vec<u8> = y
            .iter()
            .copied()
            .chain(cb.iter().zip(&cr).flat_map(|(b, r)| [*b, *r]))
            .collect();
        let i420 = [&y[..], &cb[..], &cr[..]].concat();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for backend in [JpegBackend::Builtin, JpegBackend::preferred()] {
            nv12_to_jpeg_with(backend, w as u32, h as u32, &nv12, 85, &mut a).unwrap();
            i420_to_jpeg_with(backend, w as u32, h as u32, &i420, 85, &mut b).unwrap();
            assert_eq!(a, b, "{}", backend.name());
            assert!(a.starts_with(&[0xFF, 0xD8]));
        }
        assert!(i420_to_jpeg(w as u32, h as u32, &i420[..i420.len() - 1], 85, &mut b).is_err());
    }

    #[test]
    fn nv12_encodes_to_a_decodable_jpeg_of_the_same_size() {
        let (w, h) = (32usize, 16usize);
        let mut data = vec![128u8; w * h];
        data.extend(std::iter::repeat_n([128u8, 128u8], w * h / 4).flatten());
        for backend in backends() {
            let mut out = Vec::new();
            nv12_to_jpeg_with(backend, w as u32, h as u32, &data, 90, &mut out).unwrap();
            let (info, rgb) = decode(&out);
            assert_eq!((info.width, info.height), (32, 16), "{backend:?}");
            assert!(
                rgb.iter().all(|&c| c.abs_diff(128) <= 3),
                "{backend:?}: mid grey"
            );
        }
    }

    #[test]
    fn the_encoders_agree_on_the_picture() {
        // A camera-like frame: every backend must decode to nearly the same pixels.
        let (w, h) = (160usize, 96usize);
        let mut frame = yuyv(w, h);
        for (i, b) in frame.iter_mut().enumerate().step_by(2) {
            *b = b.wrapping_add(((i / (w * 2)) * 2) as u8);
        }
        let reference = {
            let mut out = Vec::new();
            yuyv_to_jpeg_with(
                JpegBackend::Builtin,
                w as u32,
                h as u32,
                &frame,
                90,
                &mut out,
            )
            .unwrap();
            decode(&out).1
        };
        for backend in backends() {
            let mut out = Vec::new();
            yuyv_to_jpeg_with(backend, w as u32, h as u32, &frame, 90, &mut out).unwrap();
            let rgb = decode(&out).1;
            let mean = rgb
                .iter()
                .zip(&reference)
                .map(|(a, b)| a.abs_diff(*b) as f64)
                .sum::<f64>()
                / rgb.len() as f64;
            assert!(mean < 3.0, "{backend:?}: mean difference {mean}");
        }
    }

    #[test]
    fn planes_split_yuyv_and_uv() {
        let (mut y, mut cb, mut cr) = (Vec::new(), Vec::new(), Vec::new());
        yuyv_to_planes(&[1, 2, 3, 4, 5, 6, 7, 8], &mut y, &mut cb, &mut cr);
        assert_eq!(
            (y, cb.clone(), cr.clone()),
            (vec![1, 3, 5, 7], vec![2, 6], vec![4, 8])
        );
        uv_to_planes(&[9, 10, 11, 12], &mut cb, &mut cr);
        assert_eq!((cb, cr), (vec![9, 11], vec![10, 12]));
    }

    #[test]
    fn short_buffers_and_odd_sizes_are_errors() {
        let mut out = Vec::new();
        assert!(matches!(
            yuyv_to_jpeg(64, 48, &[0; 100], 80, &mut out),
            Err(EncodeError::ShortBuffer { need: 6144, .. })
        ));
        assert!(matches!(
            yuyv_to_jpeg(63, 48, &[0; 10_000], 80, &mut out),
            Err(EncodeError::BadSize { .. })
        ));
        assert!(nv12_to_jpeg(64, 47, &[0; 10_000], 80, &mut out).is_err());
    }

    #[test]
    fn mjpeg_buffer_must_hold_a_whole_jpeg() {
        let jpeg = grey_to_jpeg(8, 8, &[7; 64], 80);
        assert_eq!(mjpeg_frame(&jpeg), Some(&jpeg[..]));
        let mut padded = jpeg.clone();
        padded.extend_from_slice(&[0; 100]);
        assert_eq!(mjpeg_frame(&padded), Some(&jpeg[..]));
        assert_eq!(mjpeg_frame(&jpeg[..jpeg.len() - 10]), None, "truncated");
        assert_eq!(mjpeg_frame(&[0u8; 4096]), None, "empty buffer");
        assert_eq!(mjpeg_frame(&jpeg[2..]), None, "no SOI");
    }

    #[test]
    fn raw_frames_become_i420_planes() {
        // 4x2 YUYV: luma 10..17, Cb 100/110 over 200/210 (row 0 / row 1), Cr 50/60 over 70/80.
        let yuyv = [
            10, 100, 11, 50, 12, 110, 13, 60, //
            14, 200, 15, 70, 16, 210, 17, 80,
        ];
        let mut out = Vec::new();
        yuyv_to_i420(4, 2, &yuyv, &mut out);
        assert_eq!(out, [10, 11, 12, 13, 14, 15, 16, 17, 150, 160, 60, 70]);
        let nv12 = [1, 2, 3, 4, 5, 6, 7, 8, 100, 50, 110, 60];
        nv12_to_i420(4, 2, &nv12, &mut out);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 100, 110, 50, 60]);
    }

    /// YUYV and NV12 -> JPEG encode time per frame (quality 80), every encoder of this build side
    /// by side: `tests/bench/jpeg.sh` runs it with and without `jpeg-simd`, or
    /// `cargo test --release --locked -p rigd-drivers --features turbojpeg --lib -- --ignored --nocapture bench_raw_to_jpeg`
    #[test]
    #[ignore = "benchmark"]
    fn bench_raw_to_jpeg() {
        println!("| input | encoder | ms/frame (median of 5 rounds) | JPEG bytes |");
        println!("|---|---|---|---|");
        for (w, h) in [(1280usize, 720usize), (1920, 1080)] {
            // Camera-like content: gradients plus noise, so the entropy coder has work to do.
            let mut state = 1u32;
            let mut frame = yuyv(w, h);
            for b in frame.iter_mut().step_by(2) {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *b = b.wrapping_add((state >> 28) as u8);
            }
            // NV12 of the same picture: the luma, and the chroma of every other row.
            let mut nv12: Vec<u8> = frame.iter().step_by(2).copied().collect();
            for row in (0..h).step_by(2) {
                nv12.extend_from_slice(
                    &frame[row * w * 2..(row + 1) * w * 2]
                        .iter()
                        .skip(1)
                        .step_by(2)
                        .copied()
                        .collect::<Vec<_>>(),
                );
            }
            // RIGD_BENCH_QUICK (`tests/bench/jpeg.sh --quick`, the CI smoke): 2 frames a round, every
            // encoder still runs; no figure of it means anything.
            let n = if std::env::var_os("RIGD_BENCH_QUICK").is_some() {
                2
            } else if w > 1500 {
                20
            } else {
                40
            };
            let time = |f: &mut dyn FnMut()| -> f64 {
                f();
                let mut rounds: Vec<f64> = (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..n {
                            f();
                        }
                        t.elapsed().as_secs_f64() * 1e3 / n as f64
                    })
                    .collect();
                rounds.sort_by(f64::total_cmp);
                rounds[2]
            };
            let simd = if cfg!(feature = "jpeg-simd") {
                " (jpeg-simd)"
            } else {
                ""
            };
            for backend in backends() {
                let mut out = Vec::with_capacity(w * h);
                let per = time(&mut || {
                    yuyv_to_jpeg_with(backend, w as u32, h as u32, &frame, 80, &mut out).unwrap()
                });
                let extra = if backend == JpegBackend::Builtin {
                    simd
                } else {
                    ""
                };
                println!(
                    "| YUYV {w}x{h} | {}{extra} | {per:.2} | {} |",
                    backend.name(),
                    out.len()
                );
                let per = time(&mut || {
                    nv12_to_jpeg_with(backend, w as u32, h as u32, &nv12, 80, &mut out).unwrap()
                });
                println!(
                    "| NV12 {w}x{h} | {}{extra} | {per:.2} | {} |",
                    backend.name(),
                    out.len()
                );
            }
            let (mut y, mut cb, mut cr) = (Vec::new(), Vec::new(), Vec::new());
            let per = time(&mut || yuyv_to_planes(&frame, &mut y, &mut cb, &mut cr));
            println!("| YUYV {w}x{h} | (plane split alone, part of libturbojpeg's figure) | {per:.2} | - |");
        }
    }
}
