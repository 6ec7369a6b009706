//! End-to-end encryption in Pulsar's own message format, so that an unmodified official consumer
//! holding the fleet's private key decrypts what rigd publishes (a `CryptoKeyReader` in the Java,
//! C++ and Python clients), and a spool that holds only ciphertext.
//!
//! The format, as the clients write it (C++ `MessageCrypto`, Java `MessageCryptoBc`):
//! - a random 256-bit AES data key, wrapped for the fleet's RSA public key with OAEP (SHA-1,
//!   MGF1-SHA-1) and carried in every message's `encryption_keys` under the key's name;
//! - every message on the wire (a single frame, a batch, one chunk of a large frame) encrypted on
//!   its own with AES-256-GCM under a fresh random 12-byte IV (`encryption_param`), the 16-byte tag
//!   appended, no associated data;
//! - compression first, then encryption; a chunked frame is compressed, split, and each chunk
//!   encrypted, so consumers decrypt chunk by chunk and `total_chunk_msg_size` counts the
//!   compressed plaintext;
//! - properties, key and event time stay in clear: Pulsar encrypts payloads only.
//!
//! The data key is renewed every `encryption-key-rotation-s` (the clients renew theirs every four
//! hours). RSA only: the C++ and Python clients decrypt RSA-wrapped keys only (`PEM_read_bio_RSA_PUBKEY`),
//! and the Java client's EC scheme is Bouncy Castle's ECIES, which no other client reads.
//!
//! Spooled frames are *sealed*: compressed, cut into pieces of at most [`PIECE`] bytes (less under a
//! bandwidth budget: [`Sealing::piece`]) and each piece encrypted, with the wrapped data key beside them, so that every piece is a wire-ready Pulsar
//! message. The rig holds only the public key: after a restart it cannot read its spool back, and
//! it does not need to, it sends the pieces as they are. Layout of a sealed payload
//! (little-endian):
//! ```text
//! "RGS1" | compression u8 (wire code) | uncompressed u32 | total u32 (compressed bytes) |
//! name_len u8 | key name | wrapped_len u16 | wrapped data key | pieces u16 |
//! per piece: iv [12] | len u32 | ciphertext with its tag
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::{Oaep, RsaPrivateKey, RsaPublicKey};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Compression;
use crate::payload::Held;
use rigd_drivers::Frame;

pub const MAGIC: &[u8; 4] = b"RGS1";
/// Plaintext bytes per sealed piece: each piece becomes one chunk, so it has to fit under the
/// broker's max message size (5 MiB by default) with its metadata.
pub const PIECE: usize = 1 << 20;
/// The AES-GCM tag appended to every ciphertext.
pub const TAG_LEN: usize = 16;

/// A data key as the messages carry it: the fleet key's name and the data key wrapped for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub name: Arc<str>,
    pub wrapped: Bytes,
}

impl Key {
    /// `MessageMetadata.encryption_keys`.
    pub fn metadata(&self) -> Vec<pulsar::proto::EncryptionKeys> {
        vec![pulsar::proto::EncryptionKeys {
            key: self.name.to_string(),
            value: self.wrapped.to_vec(),
            metadata: Vec::new(),
        }]
    }
}

/// One encrypted message payload: its IV (`encryption_param`) and ciphertext with the tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub iv: [u8; NONCE_LEN],
    pub ciphertext: Bytes,
}

struct DataKey {
    aes: LessSafeKey,
    key: Key,
    created: Instant,
}

/// Encrypts for one fleet public key; shared by a producer's window and its lane.
pub struct Encryptor {
    name: Arc<str>,
    public: RsaPublicKey,
    rotation: Duration,
    rng: SystemRandom,
    current: Mutex<Arc<DataKey>>,
    rotations: AtomicU64,
}

impl std::fmt::Debug for Encryptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encryptor")
            .field("name", &self.name)
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

fn read_pem(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads an RSA public key: SubjectPublicKeyInfo (`BEGIN PUBLIC KEY`, what `openssl rsa -pubout`
/// writes and the clients read) or PKCS#1 (`BEGIN RSA PUBLIC KEY`).
pub fn public_key(pem: &str) -> Result<RsaPublicKey, String> {
    if pem.contains("PRIVATE KEY-----") {
        return Err(
            "this is a private key: it must not be on a rig (whoever reads it there decrypts every frame of the fleet); give the fleet's public key (`openssl rsa -in fleet.key.pem -pubout -out fleet.pub.pem`) and keep the private key with the consumers"
                .to_string(),
        );
    }
    RsaPublicKey::from_public_key_pem(pem)
        .or_else(|_| RsaPublicKey::from_pkcs1_pem(pem))
        .map_err(|e| {
            format!(
                "not an RSA public key in PEM ({e}); the official C++ and Python clients decrypt \
                 RSA-wrapped data keys only, so rigd encrypts for RSA keys"
            )
        })
}

/// The smallest fleet key accepted: NIST has disallowed RSA below 2048 bits since 2013, and a
/// 1024-bit key is within reach of a well-funded attacker for every frame it ever wrapped.
pub const MIN_RSA_BITS: usize = 2048;

/// Reads the fleet's public key from `path` as [`public_key`] and refuses one below
/// [`MIN_RSA_BITS`]; the message names the file.
pub fn load_public_key(path: &Path) -> Result<RsaPublicKey, String> {
    use rsa::traits::PublicKeyParts;
    let public = public_key(&read_pem(path)?).map_err(|e| format!("{}: {e}", path.display()))?;
    let bits = public.n().bits();
    if bits < MIN_RSA_BITS {
        return Err(format!(
            "{}: a {bits}-bit RSA key: at least {MIN_RSA_BITS} bits are needed (shorter keys can be factored; every frame encrypted for it would be readable); make a new fleet key (`openssl genrsa -out fleet.key.pem 3072`)",
            path.display()
        ));
    }
    Ok(public)
}

/// Reads an RSA private key: PKCS#8 (`BEGIN PRIVATE KEY`) or PKCS#1 (`BEGIN RSA PRIVATE KEY`).
pub fn private_key(pem: &str) -> Result<RsaPrivateKey, String> {
    RsaPrivateKey::from_pkcs8_pem(pem)
        .or_else(|_| RsaPrivateKey::from_pkcs1_pem(pem))
        .map_err(|e| format!("not an RSA private key in PEM ({e})"))
}

fn aes_key(bytes: &[u8]) -> Result<LessSafeKey, String> {
    UnboundKey::new(&AES_256_GCM, bytes)
        .map(LessSafeKey::new)
        .map_err(|_| "the data key is not 32 bytes".to_string())
}

impl Encryptor {
    /// Loads the fleet's public key from `path`; `name` is the key name consumers look it up by.
    pub fn load(path: &Path, name: &str, rotation: Duration) -> Result<Self, String> {
        let public = load_public_key(path)?;
        Self::new(public, name, rotation)
    }

    pub fn new(public: RsaPublicKey, name: &str, rotation: Duration) -> Result<Self, String> {
        let name: Arc<str> = name.into();
        let rng = SystemRandom::new();
        let first = Self::generate(&public, &name, &rng)?;
        Ok(Self {
            name,
            public,
            rotation,
            rng,
            current: Mutex::new(Arc::new(first)),
            rotations: AtomicU64::new(0),
        })
    }

    fn generate(
        public: &RsaPublicKey,
        name: &Arc<str>,
        rng: &SystemRandom,
    ) -> Result<DataKey, String> {
        let mut secret = [0u8; 32];
        rng.fill(&mut secret)
            .map_err(|_| "no randomness for a data key".to_string())?;
        let wrapped = public
            .encrypt(
                &mut rsa::rand_core::OsRng,
                Oaep::new::<sha1::Sha1>(),
                &secret,
            )
            .map_err(|e| format!("wrapping the data key: {e}"))?;
        Ok(DataKey {
            aes: aes_key(&secret)?,
            key: Key {
                name: name.clone(),
                wrapped: wrapped.into(),
            },
            created: Instant::now(),
        })
    }

    /// Data keys generated after the first (status and metrics).
    pub fn rotations(&self) -> u64 {
        self.rotations.load(Ordering::Relaxed)
    }

    /// The current data key, renewed when it is older than the rotation period. A failed renewal
    /// (no randomness) keeps the old key and tries again on the next message.
    fn data_key(&self) -> Arc<DataKey> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.created.elapsed() >= self.rotation {
            match Self::generate(&self.public, &self.name, &self.rng) {
                Ok(k) => {
                    *current = Arc::new(k);
                    self.rotations.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(key = %self.name, "encryption: new data key");
                }
                Err(e) => tracing::error!(error = %e, "encryption: cannot renew the data key"),
            }
        }
        current.clone()
    }

    fn seal_with(&self, k: &DataKey, plain: &[u8]) -> Piece {
        let mut iv = [0u8; NONCE_LEN];
        // SystemRandom fails only without a kernel random source, which ring checks at start.
        self.rng.fill(&mut iv).expect("system randomness");
        let mut buf = Vec::with_capacity(plain.len() + TAG_LEN);
        buf.extend_from_slice(plain);
        k.aes
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(iv), Aad::empty(), &mut buf)
            .expect("AES-GCM seals any length below 64 GiB");
        Piece {
            iv,
            ciphertext: buf.into(),
        }
    }

    /// Encrypts one message payload under the current data key.
    pub fn seal(&self, plain: &[u8]) -> (Key, Piece) {
        let k = self.data_key();
        (k.key.clone(), self.seal_with(&k, plain))
    }

    /// Seals a frame for the spool: compressed, cut into pieces of at most `piece` bytes (more only
    /// where the layout's 65,535 pieces would not hold it), each piece encrypted.
    pub fn seal_frame(&self, compression: Compression, piece: usize, mut frame: Frame) -> Held {
        let (code, wire) = crate::payload::compress(compression, &frame.payload);
        let k = self.data_key();
        let piece = piece.max(wire.len().div_ceil(u16::MAX as usize)).max(1);
        let pieces: Vec<Piece> = crate::payload::cut(wire.len(), piece)
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(|r| self.seal_with(&k, &wire[r]))
            .collect();
        let sealed = Sealed {
            compression: code,
            uncompressed: frame.payload.len(),
            total: wire.len(),
            key: k.key.clone(),
            pieces,
        };
        frame.payload = sealed.encode();
        Held {
            frame,
            sealed: true,
        }
    }
}

/// How a lane seals its frames for the spool.
#[derive(Clone)]
pub struct Sealing {
    pub encryptor: Arc<Encryptor>,
    pub compression: Compression,
    /// Plaintext bytes per piece: [`PIECE`], or under a bandwidth budget what the budget sends in
    /// a few seconds (`uplink::budget::bytes_ahead`). A piece is one SEND that cannot be cut
    /// again, so a larger one would hold the connection past the broker's keepalive.
    pub piece: usize,
}

impl Sealing {
    /// A plain frame sealed; a sealed one (read back from the spool) as it is.
    pub fn seal(&self, held: Held) -> Held {
        if held.sealed {
            return held;
        }
        self.encryptor
            .seal_frame(self.compression, self.piece, held.frame)
    }
}

/// A sealed frame's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub compression: i32,
    pub uncompressed: usize,
    pub total: usize,
    pub key: Key,
    pub pieces: Vec<Piece>,
}

impl Sealed {
    pub fn encode(&self) -> Bytes {
        let name = self.key.name.as_bytes();
        let body: usize = self.pieces.iter().map(|p| 16 + p.ciphertext.len()).sum();
        let mut out = BytesMut::with_capacity(20 + name.len() + self.key.wrapped.len() + body);
        out.put_slice(MAGIC);
        out.put_u8(self.compression as u8);
        out.put_u32_le(self.uncompressed as u32);
        out.put_u32_le(self.total as u32);
        out.put_u8(name.len() as u8);
        out.put_slice(name);
        out.put_u16_le(self.key.wrapped.len() as u16);
        out.put_slice(&self.key.wrapped);
        out.put_u16_le(self.pieces.len() as u16);
        for p in &self.pieces {
            out.put_slice(&p.iv);
            out.put_u32_le(p.ciphertext.len() as u32);
            out.put_slice(&p.ciphertext);
        }
        out.freeze()
    }

    /// Parses a sealed payload; the pieces share the payload's memory.
    pub fn parse(blob: &Bytes) -> Result<Self, String> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<Bytes, String> {
            if blob.len() - at < n {
                return Err(format!(
                    "sealed payload of {} bytes is truncated at byte {at}",
                    blob.len()
                ));
            }
            at += n;
            Ok(blob.slice(at - n..at))
        };
        if take(4)?[..] != MAGIC[..] {
            return Err("not a sealed payload (bad magic)".into());
        }
        let le32 = |b: Bytes| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let le16 = |b: Bytes| u16::from_le_bytes([b[0], b[1]]) as usize;
        let compression = take(1)?[0] as i32;
        let uncompressed = le32(take(4)?);
        let total = le32(take(4)?);
        let name_len = take(1)?[0] as usize;
        let name = String::from_utf8(take(name_len)?.to_vec())
            .map_err(|_| "sealed payload: key name is not UTF-8".to_string())?;
        let wrapped_len = le16(take(2)?);
        let wrapped = take(wrapped_len)?;
        let n = le16(take(2)?);
        let mut pieces = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let iv_bytes = take(NONCE_LEN)?;
            let mut iv = [0u8; NONCE_LEN];
            iv.copy_from_slice(&iv_bytes);
            let len = le32(take(4)?);
            if len < TAG_LEN {
                return Err(format!(
                    "sealed piece of {len} bytes is shorter than its tag"
                ));
            }
            pieces.push(Piece {
                iv,
                ciphertext: take(len)?,
            });
        }
        let plain: usize = pieces.iter().map(|p| p.ciphertext.len() - TAG_LEN).sum();
        if plain != total || at != blob.len() {
            return Err(format!(
                "sealed payload: pieces hold {plain} bytes, header says {total}"
            ));
        }
        Ok(Self {
            compression,
            uncompressed,
            total,
            key: Key {
                name: name.into(),
                wrapped,
            },
            pieces,
        })
    }
}

/// Decrypts with the fleet's private key: the offline tools' `--decrypt-key` at the depot.
pub struct Decryptor {
    private: RsaPrivateKey,
    /// Unwrapped data keys by their wrapped bytes (one RSA operation per data key, as the clients
    /// cache them).
    keys: Mutex<HashMap<Bytes, Arc<LessSafeKey>>>,
}

impl std::fmt::Debug for Decryptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decryptor").finish_non_exhaustive()
    }
}

impl Decryptor {
    pub fn load(path: &Path) -> Result<Self, String> {
        let private =
            private_key(&read_pem(path)?).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self::new(private))
    }

    pub fn new(private: RsaPrivateKey) -> Self {
        Self {
            private,
            keys: Mutex::new(HashMap::new()),
        }
    }

    fn data_key(&self, key: &Key) -> Result<Arc<LessSafeKey>, String> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = keys.get(&key.wrapped) {
            return Ok(k.clone());
        }
        let secret = self
            .private
            .decrypt(Oaep::new::<sha1::Sha1>(), &key.wrapped)
            .map_err(|_| {
                format!(
                    "the data key for '{}' does not open with this private key",
                    key.name
                )
            })?;
        let k = Arc::new(aes_key(&secret)?);
        keys.insert(key.wrapped.clone(), k.clone());
        Ok(k)
    }

    /// Decrypts one piece (one message payload).
    pub fn open(&self, key: &Key, piece: &Piece) -> Result<Vec<u8>, String> {
        let k = self.data_key(key)?;
        let mut buf = piece.ciphertext.to_vec();
        let n = k
            .open_in_place(
                Nonce::assume_unique_for_key(piece.iv),
                Aad::empty(),
                &mut buf,
            )
            .map_err(|_| "ciphertext does not authenticate (damaged or another key)".to_string())?
            .len();
        buf.truncate(n);
        Ok(buf)
    }

    /// One encrypted message as a consumer reads it, opened: the data key is the first of its
    /// `encryption_keys` that this private key opens ([`Key::metadata`] writes them), the IV its
    /// `encryption_param`.
    pub fn open_message(
        &self,
        meta: &pulsar::proto::MessageMetadata,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        let iv = meta
            .encryption_param
            .as_deref()
            .and_then(|p| <[u8; NONCE_LEN]>::try_from(p).ok())
            .ok_or("an encrypted message without a 12-byte IV (encryption_param)")?;
        let piece = Piece {
            iv,
            ciphertext: payload.into(),
        };
        let mut why = String::from("an encrypted message without a data key");
        for k in &meta.encryption_keys {
            let key = Key {
                name: k.key.as_str().into(),
                wrapped: k.value.clone().into(),
            };
            match self.open(&key, &piece) {
                Ok(plain) => return Ok(plain),
                Err(e) => why = e,
            }
        }
        Err(why)
    }

    /// A sealed frame back to the frame as captured; a frame that is not sealed as it is.
    pub fn open_frame(&self, held: &Held) -> Result<Frame, String> {
        if !held.sealed {
            return Ok(held.frame.clone());
        }
        let s = Sealed::parse(&held.payload)?;
        let mut wire = Vec::with_capacity(s.total);
        for p in &s.pieces {
            wire.extend_from_slice(&self.open(&s.key, p)?);
        }
        let payload = crate::payload::decompress(s.compression, &wire, s.uncompressed)?;
        let mut out = held.frame.clone();
        out.payload = payload;
        Ok(out)
    }
}

/// A key pair for unit tests: 1024 bits keeps them fast; rigd takes any RSA size the clients take.
#[cfg(test)]
pub(crate) fn test_keys() -> (RsaPublicKey, RsaPrivateKey) {
    let private = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 1024).unwrap();
    (RsaPublicKey::from(&private), private)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigd_drivers::{ClockState, Media};

    use super::test_keys as keys;

    fn frame(payload: Vec<u8>) -> Frame {
        Frame {
            source: "gps".into(),
            seq: 7,
            capture_ns: 1,
            clock: ClockState::Locked,
            media: Media::Serial { text: true },
            payload: payload.into(),
        }
    }

    #[test]
    fn a_sealed_frame_opens_with_the_private_key_only() {
        let (public, private) = keys();
        let e = Encryptor::new(public, "fleet-2026", Duration::from_secs(3600)).unwrap();
        let text = b"$GPRMC,123519,A,4807.038,N,01131.000,E*6A\r\n".repeat(40_000);
        let sealed = e.seal_frame(Compression::Zstd, PIECE, frame(text.clone()));
        assert!(sealed.sealed);
        let s = Sealed::parse(&sealed.payload).unwrap();
        assert_eq!(s.key.name.as_ref(), "fleet-2026");
        assert_eq!(s.uncompressed, text.len());
        assert!(!sealed.payload.windows(6).any(|w| w == b"$GPRMC"));
        let opened = Decryptor::new(private).open_frame(&sealed).unwrap();
        assert_eq!(&opened.payload[..], &text[..]);
        let (_, other) = keys();
        let err = Decryptor::new(other).open_frame(&sealed).unwrap_err();
        assert!(err.contains("does not open"), "{err}");
    }

    #[test]
    fn large_frames_are_sealed_in_pieces_that_each_decrypt() {
        let (public, private) = keys();
        let e = Encryptor::new(public, "k", Duration::from_secs(3600)).unwrap();
        let payload: Vec<u8> = (0..(PIECE * 2 + 100))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let sealed = e.seal_frame(Compression::None, PIECE, frame(payload.clone()));
        let s = Sealed::parse(&sealed.payload).unwrap();
        assert_eq!(s.pieces.len(), 3);
        assert_eq!(s.total, payload.len());
        let d = Decryptor::new(private);
        let first = d.open(&s.key, &s.pieces[0]).unwrap();
        assert_eq!(&first[..], &payload[..PIECE]);
        assert_ne!(s.pieces[0].iv, s.pieces[1].iv, "a fresh IV per piece");
    }

    #[test]
    fn under_a_budget_pieces_hold_what_it_sends_in_a_few_seconds_and_open_to_the_frame() {
        // Issue 31.2: a sealed piece is one SEND that cannot be cut again; at 200 kbit/s a 1 MiB
        // piece took ~42 s, past the broker's keepalive tick.
        let (public, private) = keys();
        let sealing = Sealing {
            encryptor: Arc::new(Encryptor::new(public, "k", Duration::from_secs(3600)).unwrap()),
            compression: Compression::None,
            piece: 50_000,
        };
        let payload: Vec<u8> = (0..2_000_000).map(|i| (i * 7 % 251) as u8).collect();
        let sealed = sealing.seal(frame(payload.clone()).into());
        let s = Sealed::parse(&sealed.payload).unwrap();
        assert_eq!(s.pieces.len(), 40);
        assert!(s
            .pieces
            .iter()
            .all(|p| p.ciphertext.len() <= 50_000 + TAG_LEN));
        let opened = Decryptor::new(private).open_frame(&sealed).unwrap();
        assert_eq!(&opened.payload[..], &payload[..]);
        // The layout counts pieces in 16 bits: a piece never gets so small that it cannot.
        let tiny = Sealing {
            piece: 1,
            ..sealing
        };
        let s = Sealed::parse(&tiny.seal(frame(payload).into()).payload).unwrap();
        assert!(s.pieces.len() <= u16::MAX as usize, "{}", s.pieces.len());
    }

    #[test]
    fn damage_is_reported_not_decrypted() {
        let (public, private) = keys();
        let e = Encryptor::new(public, "k", Duration::from_secs(3600)).unwrap();
        let sealed = e.seal_frame(Compression::None, PIECE, frame(vec![1; 1000]));
        let mut bad = sealed.payload.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let mut f = sealed.clone();
        f.payload = bad.into();
        let err = Decryptor::new(private).open_frame(&f).unwrap_err();
        assert!(err.contains("authenticate"), "{err}");
        for cut in [3, 10, sealed.payload.len() - 1] {
            assert!(Sealed::parse(&sealed.payload.slice(..cut)).is_err());
        }
    }

    #[test]
    fn the_data_key_is_renewed_on_schedule() {
        let (public, _) = keys();
        let e = Encryptor::new(public, "k", Duration::ZERO).unwrap();
        let (a, _) = e.seal(b"x");
        let (b, _) = e.seal(b"x");
        assert_ne!(a.wrapped, b.wrapped);
        assert!(e.rotations() >= 2);
        let (public, _) = keys();
        let e = Encryptor::new(public, "k", Duration::from_secs(3600)).unwrap();
        assert_eq!(e.seal(b"x").0, e.seal(b"y").0);
    }

    #[test]
    fn only_rsa_public_keys_are_accepted() {
        let err = public_key("-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n")
            .unwrap_err();
        assert!(err.contains("RSA"), "{err}");
    }

    #[test]
    fn issue_47_a_private_key_or_a_short_one_is_refused_in_words() {
        use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
        let (public, private) = keys();
        let dir = tempfile::tempdir().unwrap();
        let priv_pem = private.to_pkcs8_pem(LineEnding::LF).unwrap();
        let err = public_key(&priv_pem).unwrap_err();
        assert!(
            err.starts_with("this is a private key: it must not be on a rig")
                && !err.contains("expecting"),
            "{err}"
        );
        let short = dir.path().join("fleet-1024.pub.pem");
        std::fs::write(&short, public.to_public_key_pem(LineEnding::LF).unwrap()).unwrap();
        let err = load_public_key(&short).unwrap_err();
        assert!(
            err.contains("a 1024-bit RSA key: at least 2048 bits"),
            "{err}"
        );
        assert!(Encryptor::load(&short, "k", Duration::from_secs(60)).is_err());
    }
}
