//! Camera frames: raw V4L2 pixel formats encoded to JPEG (the wire payload), and the check that an
//! MJPEG buffer holds a whole JPEG. Pure; the V4L2 capture loop (feature `camera`) is not written
//! yet (see docs/DRIVERS.md).
//!
//! YUYV (4:2:2) and NV12 (4:2:0) are fed to the encoder as Y'CbCr rows directly, with no RGB round
//! trip, and keep their chroma subsampling in the JPEG.

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

struct Nv12<'a> {
    width: u16,
    height: u16,
    data: &'a [u8],
}

impl ImageBuffer for Nv12<'_> {
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
        let uv = &self.data[w * h + (y / 2) * w..w * h + (y / 2 + 1) * w];
        for c in uv.chunks_exact(2) {
            buffers[1].extend_from_slice(&[c[0], c[0]]);
            buffers[2].extend_from_slice(&[c[1], c[1]]);
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

/// Encodes a packed YUYV (YUY2) frame to JPEG, 4:2:2.
pub fn yuyv_to_jpeg(
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let need = width as usize * height as usize * 2;
    let (w, h) = check("YUYV", width, height, need, data.len())?;
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

/// Encodes an NV12 frame (Y plane, then interleaved CbCr at half resolution) to JPEG, 4:2:0.
pub fn nv12_to_jpeg(
    width: u32,
    height: u32,
    data: &[u8],
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let need = width as usize * height as usize * 3 / 2;
    if height % 2 != 0 {
        return Err(EncodeError::BadSize { width, height });
    }
    let (w, h) = check("NV12", width, height, need, data.len())?;
    out.clear();
    let mut enc = Encoder::new(out, quality);
    enc.set_sampling_factor(SamplingFactor::R_4_2_0);
    enc.encode_image(Nv12 {
        width: w,
        height: h,
        data,
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

    #[test]
    fn yuyv_encodes_to_a_decodable_jpeg_of_the_same_size() {
        let (w, h) = (64, 48);
        let mut out = Vec::new();
        yuyv_to_jpeg(w, h, &yuyv(64, 48), 90, &mut out).unwrap();
        assert!(mjpeg_frame(&out).is_some());
        let (info, rgb) = decode(&out);
        assert_eq!((info.width, info.height), (64, 48));
        // Y 128, Cb 90, Cr 200 is a red-orange: R high, B low.
        let mid = (24 * 64 + 32) * 3;
        let (r, g, b) = (rgb[mid], rgb[mid + 1], rgb[mid + 2]);
        assert!(r > 200 && b < 80 && g < r, "{r} {g} {b}");
        // The luma ramp survives: left darker than right.
        assert!(rgb[24 * 64 * 3] < rgb[(24 * 64 + 63) * 3]);
    }

    #[test]
    fn nv12_encodes_to_a_decodable_jpeg_of_the_same_size() {
        let (w, h) = (32usize, 16usize);
        let mut data = vec![128u8; w * h];
        data.extend(std::iter::repeat_n([128u8, 128u8], w * h / 4).flatten());
        let mut out = Vec::new();
        nv12_to_jpeg(w as u32, h as u32, &data, 90, &mut out).unwrap();
        let (info, rgb) = decode(&out);
        assert_eq!((info.width, info.height), (32, 16));
        assert!(rgb.iter().all(|&c| c.abs_diff(128) <= 3), "mid grey");
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

    /// YUYV -> JPEG encode time per frame (quality 80).
    /// `cargo test --release -p rigd-drivers --lib -- --ignored --nocapture bench_yuyv`
    /// (add `--features jpeg-simd` for the encoder's AVX2 path)
    #[test]
    #[ignore = "benchmark"]
    fn bench_yuyv_to_jpeg() {
        for (w, h) in [(640usize, 480usize), (1920, 1080)] {
            // Camera-like content: gradients plus noise, so the entropy coder has work to do.
            let mut state = 1u32;
            let mut frame = yuyv(w, h);
            for b in frame.iter_mut().step_by(2) {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *b = b.wrapping_add((state >> 28) as u8);
            }
            let mut out = Vec::with_capacity(w * h);
            let n = if w > 1000 { 30 } else { 100 };
            yuyv_to_jpeg(w as u32, h as u32, &frame, 80, &mut out).unwrap();
            let t = std::time::Instant::now();
            for _ in 0..n {
                yuyv_to_jpeg(w as u32, h as u32, &frame, 80, &mut out).unwrap();
            }
            let per = t.elapsed().as_secs_f64() * 1e3 / n as f64;
            println!(
                "yuyv->jpeg {w}x{h} q80: {per:.2} ms/frame ({} bytes), simd feature: {}",
                out.len(),
                cfg!(feature = "jpeg-simd")
            );
        }
    }
}
