//! A frame's payload on its way to Pulsar, one step each for live frames (`uplink::window`) and
//! frames sealed into the spool (`seal`): compressed as Pulsar consumers expect it (LZ4 as a raw
//! block, the Java client's lz4-java "fast" compressor; ZSTD as a frame), then cut into pieces
//! (chunks of a message, or sealed pieces); each piece is then encrypted by `seal::Encryptor`.
//! Pure: no I/O. [`Held`] is a frame as the daemon holds it between capture and the broker: as
//! captured, or sealed.

use bytes::Bytes;
use pulsar::proto::CompressionType;
use rigd_drivers::Frame;

use crate::config::Compression;

/// A frame between capture and the broker. Capture hands out plain frames; with end-to-end
/// encryption on, the spool holds them sealed (`seal::Encryptor::seal_frame`: the payload
/// compressed, cut and encrypted for the fleet's key), and a sealed frame read back goes to the
/// broker as it is. Whether a payload is sealed is the daemon's concern, not the drivers'.
#[derive(Debug, Clone)]
pub struct Held {
    pub frame: Frame,
    pub sealed: bool,
}

impl Held {
    /// A frame as captured.
    pub fn plain(frame: Frame) -> Self {
        Held {
            frame,
            sealed: false,
        }
    }
}

impl std::ops::Deref for Held {
    type Target = Frame;
    fn deref(&self) -> &Frame {
        &self.frame
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut Frame {
        &mut self.frame
    }
}

impl From<Frame> for Held {
    fn from(frame: Frame) -> Self {
        Held::plain(frame)
    }
}

/// Compresses `data`; returns the wire codec (`MessageMetadata.compression`) and the bytes to send.
/// When compression does not make the payload smaller it is sent as it is, without a copy.
pub fn compress(kind: Compression, data: &Bytes) -> (i32, Bytes) {
    let out = match kind {
        Compression::None => return (CompressionType::None as i32, data.clone()),
        Compression::Lz4 => (CompressionType::Lz4, lz4_flex::block::compress(data)),
        Compression::Zstd => match zstd::bulk::compress(data, 3) {
            Ok(c) => (CompressionType::Zstd, c),
            Err(_) => return (CompressionType::None as i32, data.clone()),
        },
    };
    if out.1.len() >= data.len() {
        return (CompressionType::None as i32, data.clone());
    }
    (out.0 as i32, Bytes::from(out.1))
}

/// Undoes [`compress`] for a wire codec (`MessageMetadata.compression`); `size` is the
/// uncompressed size the message carries.
pub fn decompress(code: i32, data: &[u8], size: usize) -> Result<Bytes, String> {
    let out = match CompressionType::try_from(code) {
        Ok(CompressionType::None) => return Ok(Bytes::copy_from_slice(data)),
        Ok(CompressionType::Lz4) => {
            lz4_flex::block::decompress(data, size).map_err(|e| e.to_string())
        }
        Ok(CompressionType::Zstd) => zstd::bulk::decompress(data, size).map_err(|e| e.to_string()),
        _ => Err(format!("compression codec {code} is not one rigd writes")),
    }?;
    if out.len() != size {
        return Err(format!("decompressed {} bytes, expected {size}", out.len()));
    }
    Ok(out.into())
}

/// Byte ranges of the chunks of a payload of `len` bytes, each at most `max_chunk`. One range
/// (the whole payload) when it fits.
pub fn cut(len: usize, max_chunk: usize) -> Vec<std::ops::Range<usize>> {
    let max_chunk = max_chunk.max(1);
    (0..len.div_ceil(max_chunk).max(1))
        .map(|i| i * max_chunk..((i + 1) * max_chunk).min(len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_skips_what_does_not_shrink() {
        let text = Bytes::from("$GPRMC,123519,A,4807.038,N,01131.000,E*6A\r\n".repeat(200));
        let (codec, wire) = compress(Compression::Lz4, &text);
        assert_eq!(codec, CompressionType::Lz4 as i32);
        assert!(wire.len() < text.len() / 4);
        assert_eq!(
            lz4_flex::block::decompress(&wire, text.len()).unwrap(),
            text
        );
        let (codec, wire) = compress(Compression::Zstd, &text);
        assert_eq!(codec, CompressionType::Zstd as i32);
        assert_eq!(zstd::bulk::decompress(&wire, text.len()).unwrap(), text);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let noise: Bytes = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect::<Vec<_>>()
            .into();
        assert_eq!(
            compress(Compression::Lz4, &noise).0,
            CompressionType::None as i32
        );
        assert_eq!(compress(Compression::None, &text).1, text);
        let (codec, wire) = compress(Compression::Zstd, &text);
        assert_eq!(decompress(codec, &wire, text.len()).unwrap(), text);
        assert!(decompress(codec, &wire, text.len() + 1).is_err());
    }
}
