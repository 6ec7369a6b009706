//! `[pulsar]`: the broker, topics, the producer's window, batching, compression and encryption.

use super::*;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PulsarConfig {
    /// `pulsar://host:port` or `pulsar+ssl://host:port`; absent: no uplink, everything spools.
    pub url: Option<String>,
    /// Topic template; placeholders `{rig}` and `{source}`.
    #[serde(default = "default_topic")]
    pub topic: String,
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) that sign the broker's certificate for `pulsar+ssl://`; absent: the
    /// Mozilla root set.
    pub tls_ca_file: Option<PathBuf>,
    /// Device identity for mutual TLS: the rig's client certificate chain (PEM) and its private
    /// key (PEM, PKCS#8, PKCS#1 or SEC1); the broker's TLS authentication provider maps it to a role.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// End-to-end encryption: the fleet's RSA public key (PEM). Every payload is encrypted in
    /// Pulsar's format for it, and the spool holds only ciphertext.
    pub encryption_key_file: Option<PathBuf>,
    /// The name consumers' CryptoKeyReader looks the private key up by.
    pub encryption_key_name: Option<String>,
    /// A new data key this often (the official clients: every 4 hours).
    #[serde(default = "default_encryption_key_rotation_s")]
    pub encryption_key_rotation_s: u64,
    #[serde(default)]
    pub compression: Compression,
    /// Messages awaiting a receipt, per source.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Bytes awaiting a receipt, per source.
    #[serde(default = "default_max_in_flight_bytes")]
    pub max_in_flight_bytes: ByteSize,
    /// Frames above this are refused (counted), whatever the broker accepts with chunking.
    #[serde(default = "default_max_frame_bytes")]
    pub max_frame_bytes: ByteSize,
    /// How long a send may wait for its receipt before the connection is considered dead.
    #[serde(default = "default_send_timeout_ms")]
    pub send_timeout_ms: u64,
    /// Small frames of one bucket key go out together in a batch message of at most this many
    /// frames (1: no batching).
    #[serde(default = "default_batch_max_messages")]
    pub batch_max_messages: usize,
    /// ... and at most this many bytes (payload and properties).
    #[serde(default = "default_batch_max_bytes")]
    pub batch_max_bytes: ByteSize,
    /// ... held at most this long waiting for more frames of the same key.
    #[serde(default = "default_batch_delay_ms")]
    pub batch_delay_ms: u64,
    /// One budget for all that rigd sends to the broker (every source, framing included);
    /// absent: unlimited.
    pub max_bandwidth: Option<Bandwidth>,
}

/// Batching defaults (the Java client's): 1000 messages, 128 KiB, 1 ms.
fn default_batch_max_messages() -> usize {
    1000
}
fn default_batch_max_bytes() -> ByteSize {
    ByteSize(128 << 10)
}
fn default_batch_delay_ms() -> u64 {
    1
}

fn default_encryption_key_rotation_s() -> u64 {
    4 * 3600
}

fn default_topic() -> String {
    crate::wire::DEFAULT_TOPIC.to_string()
}
fn default_max_in_flight() -> usize {
    500
}
fn default_max_in_flight_bytes() -> ByteSize {
    ByteSize(64 << 20)
}
fn default_max_frame_bytes() -> ByteSize {
    ByteSize(50 << 20)
}
fn default_send_timeout_ms() -> u64 {
    30_000
}

impl Default for PulsarConfig {
    fn default() -> Self {
        Self {
            url: None,
            topic: default_topic(),
            token_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            encryption_key_file: None,
            encryption_key_name: None,
            encryption_key_rotation_s: default_encryption_key_rotation_s(),
            compression: Compression::None,
            max_in_flight: default_max_in_flight(),
            max_in_flight_bytes: default_max_in_flight_bytes(),
            max_frame_bytes: default_max_frame_bytes(),
            send_timeout_ms: default_send_timeout_ms(),
            batch_max_messages: default_batch_max_messages(),
            batch_max_bytes: default_batch_max_bytes(),
            batch_delay_ms: default_batch_delay_ms(),
            max_bandwidth: None,
        }
    }
}

impl PulsarConfig {
    /// The topic of one source.
    pub fn topic_for(&self, rig: &str, source: &str) -> String {
        crate::wire::topic(&self.topic, rig, source)
    }
}
