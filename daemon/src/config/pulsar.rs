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

/// `max-bandwidth`: a fixed rate (`"1800kbit"`), or `"auto"`: the link's capacity estimated from
/// rigd's own sends and the broker's receipts (`uplink::estimate`), optionally under a cap
/// (`"auto, at most 8mbit"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxBandwidth {
    Fixed(Bandwidth),
    Auto { cap: Option<Bandwidth> },
}

/// Under `auto` without a cap, chunks and windows are sized for this rate (8 Mbit/s).
const AUTO_SIZING: Bandwidth = Bandwidth(8_000_000);

impl MaxBandwidth {
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let Some(rest) = t.strip_prefix("auto") else {
            return Bandwidth::parse(t).map(MaxBandwidth::Fixed);
        };
        let rest = rest.trim();
        if rest.is_empty() {
            return Ok(MaxBandwidth::Auto { cap: None });
        }
        let cap = rest
            .strip_prefix(',')
            .map(str::trim)
            .and_then(|r| r.strip_prefix("at most"))
            .ok_or_else(|| {
                format!("`{s}`: write a rate like 1800kbit, \"auto\" or \"auto, at most 8mbit\"")
            })?;
        Ok(MaxBandwidth::Auto {
            cap: Some(Bandwidth::parse(cap)?),
        })
    }

    /// The fixed rate, or under `auto` the rate that sizes a SEND and a source's window (the
    /// cap, at most 8 Mbit/s), in bytes per second.
    pub fn bytes_per_second(self) -> u64 {
        match self {
            MaxBandwidth::Fixed(b) => b.bytes_per_second(),
            MaxBandwidth::Auto { cap } => cap
                .map_or(AUTO_SIZING, |c| c.min(AUTO_SIZING))
                .bytes_per_second(),
        }
    }

    /// The rate that must lie within the bounds: the fixed one, or the cap.
    fn bound(self) -> Option<Bandwidth> {
        match self {
            MaxBandwidth::Fixed(b) => Some(b),
            MaxBandwidth::Auto { cap } => cap,
        }
    }
}

impl Serialize for MaxBandwidth {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MaxBandwidth::Fixed(b) => b.serialize(s),
            MaxBandwidth::Auto { cap: None } => s.serialize_str("auto"),
            MaxBandwidth::Auto { cap: Some(c) } => {
                s.serialize_str(&format!("auto, at most {}bit", c.0))
            }
        }
    }
}

impl<'de> Deserialize<'de> for MaxBandwidth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        MaxBandwidth::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// `[[pulsar.link]]`: one way to the brokers, its connections bound to `interface`
/// (SO_BINDTODEVICE).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LinkConfig {
    /// The network interface (`wwan0`, `wlan0`): the link is up while it is.
    pub interface: String,
    /// Shown in status, metrics and logs; default: the interface.
    pub name: Option<String>,
    /// 0-9: the cheapest usable link carries the sources (depot Wi-Fi 0, a metered modem 9);
    /// links of equal cost share them by their estimates.
    #[serde(default)]
    pub cost: u8,
    /// This link's budget; default: `pulsar.max-bandwidth`, else `"auto"`.
    pub max_bandwidth: Option<MaxBandwidth>,
}

/// At most this many `[[pulsar.link]]`.
pub const MAX_LINKS: usize = 8;

impl LinkConfig {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.interface)
    }
}

/// `hashing-scheme`: how a message's key picks its partition on a partitioned topic, as the Java
/// client's `HashingScheme` (`uplink::route`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum HashingScheme {
    /// `Murmur3_32Hash`: the same in every client that offers it.
    #[default]
    #[serde(rename = "murmur3-32")]
    Murmur3_32,
    /// `JavaStringHash`: the Java client's default.
    #[serde(rename = "java-string")]
    JavaString,
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
    /// One budget for all that rigd sends to the broker (every source, framing included): a
    /// rate, or `"auto"` (estimated from the link, `"auto, at most 8mbit"` under a cap);
    /// absent: unlimited.
    pub max_bandwidth: Option<MaxBandwidth>,
    /// Several links to the brokers (modems, depot Wi-Fi), each bound to its interface and
    /// estimated on its own (docs/UPLINK.md "Several links"); empty: the default route.
    #[serde(default, rename = "link")]
    pub links: Vec<LinkConfig>,
    /// A partitioned topic's key -> partition mapping (the same as Java producers that use it).
    #[serde(default)]
    pub hashing_scheme: HashingScheme,
    /// Where recall requests are read (docs/RECALL.md), with `{rig}`; answers go to
    /// `{control-topic}-status`. Default: the topic template's tenant and namespace, `{rig}-control`.
    pub control_topic: Option<String>,
    /// The fleet's coverage topic (docs/FLEET.md): every rig's digest of what it holds, keyed by
    /// rig, compacted. Default: the topic template's tenant and namespace, `rigd-coverage`.
    pub coverage_topic: Option<String>,
    /// A digest at least this often (s); sooner when what the rig holds changes shape.
    #[serde(default = "default_coverage_interval_s")]
    pub coverage_interval_s: u64,
}

fn default_coverage_interval_s() -> u64 {
    60
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
            links: Vec::new(),
            hashing_scheme: HashingScheme::default(),
            control_topic: None,
            coverage_topic: None,
            coverage_interval_s: default_coverage_interval_s(),
        }
    }
}

impl PulsarConfig {
    /// The control topic of rig `rig` (recall requests); its answers go to `{this}-status`.
    pub fn control_topic(&self, rig: &str) -> String {
        let template = match &self.control_topic {
            Some(t) => t.clone(),
            None => self.beside_topic("{rig}-control"),
        };
        template.replace("{rig}", rig)
    }

    /// The fleet's coverage topic (one for every rig).
    pub fn coverage_topic(&self) -> String {
        self.coverage_topic
            .clone()
            .unwrap_or_else(|| self.beside_topic("rigd-coverage"))
    }

    /// `name` in the topic template's tenant and namespace (`persistent://tenant/namespace/...`),
    /// or in public/default when the template's are placeholders.
    fn beside_topic(&self, name: &str) -> String {
        let scheme = self.topic.find("://").map_or(0, |i| i + 3);
        let parts: Vec<&str> = self.topic[scheme..].splitn(3, '/').collect();
        match parts.as_slice() {
            [tenant, ns, _] if !tenant.contains('{') && !ns.contains('{') => {
                format!("{}{tenant}/{ns}/{name}", &self.topic[..scheme])
            }
            _ => format!("persistent://public/default/{name}"),
        }
    }

    /// The topic of one source.
    pub fn topic_for(&self, rig: &str, source: &str, modality: rigd_drivers::Modality) -> String {
        crate::wire::topic(&self.topic, rig, source, modality.as_str())
    }
}

impl PulsarConfig {
    /// What is wrong with the `[pulsar]` table alone.
    pub(super) fn problems(&self, p: &mut Vec<String>) {
        if let Some(url) = &self.url {
            match crate::service::service_url(url) {
                Err(why) => p.push(format!("pulsar.url: {why}")),
                // TLS settings with a clear link: the operator believes the link is encrypted
                // (and authenticated by certificate) while it is not.
                Ok(false) => {
                    let tls = [
                        ("pulsar.tls-cert-file", self.tls_cert_file.is_some()),
                        ("pulsar.tls-key-file", self.tls_key_file.is_some()),
                        ("pulsar.tls-ca-file", self.tls_ca_file.is_some()),
                    ];
                    if let Some((key, _)) = tls.iter().find(|(_, set)| *set) {
                        p.push(format!(
                            "{key}: set with a clear pulsar:// URL, so the link would be neither encrypted nor authenticated by certificate; use pulsar+ssl://"
                        ));
                    }
                }
                Ok(true) => {}
            }
            for e in crate::service::Endpoint::parse_service(url).unwrap_or_default() {
                if e.port == 0 {
                    p.push(format!(
                        "pulsar.url: `{}` has port 0, which no broker listens on (the uplink would retry forever); leave the port out for {}",
                        e.host,
                        if e.tls { "6651" } else { "6650" }
                    ));
                }
            }
        }
        let mut rest = self.topic.as_str();
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            match after.find('}') {
                Some(close) => {
                    let name = &after[..close];
                    if !crate::wire::TOPIC_PLACEHOLDERS.contains(&name) {
                        p.push(format!(
                            "pulsar.topic: unknown placeholder `{{{name}}}` (known: {{rig}}, {{source}}, {{modality}})"
                        ));
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    p.push("pulsar.topic: `{` without a closing `}`".to_string());
                    break;
                }
            }
        }
        if !self.topic.contains("{source}") && !self.topic.contains("{modality}") {
            p.push(
                "pulsar.topic: must contain {source} (a topic per source) or {modality} (a topic per modality)"
                    .to_string(),
            );
        }
        if let Some(t) = &self.control_topic {
            if !t.contains("{rig}") {
                p.push(
                    "pulsar.control-topic: must contain {rig} (each rig reads its own requests)"
                        .to_string(),
                );
            } else if t.replace("{rig}", "").contains(['{', '}']) {
                p.push("pulsar.control-topic: the only placeholder is {rig}".to_string());
            }
        }
        if let Some(t) = &self.coverage_topic {
            if t.contains(['{', '}']) || t.is_empty() {
                p.push(
                    "pulsar.coverage-topic: one topic for the whole fleet, without placeholders (the rig id is the message key)"
                        .to_string(),
                );
            }
        }
        if !(1..=3600).contains(&self.coverage_interval_s) {
            p.push(format!(
                "pulsar.coverage-interval-s: {} is not 1 to 3600 seconds",
                self.coverage_interval_s
            ));
        }
        if self.max_in_flight == 0 {
            p.push("pulsar.max-in-flight: must be at least 1".to_string());
        }
        if self.max_in_flight_bytes.0 < MIN_IN_FLIGHT_BYTES {
            p.push(format!(
                "pulsar.max-in-flight-bytes: {} is below {} (nothing would be sent)",
                self.max_in_flight_bytes.0,
                ByteSize(MIN_IN_FLIGHT_BYTES).human()
            ));
        }
        if self.send_timeout_ms < 1000 {
            p.push(format!(
                "pulsar.send-timeout-ms: {} is below 1000: it is how long a connection may make no \
                 progress before it counts as dead (the uplink waits at least 10 s)",
                self.send_timeout_ms
            ));
        } else if self.send_timeout_ms > 3_600_000 {
            p.push(format!(
                "pulsar.send-timeout-ms: {} is above one hour (3600000)",
                self.send_timeout_ms
            ));
        }
        for (key, file) in [
            ("pulsar.token-file", &self.token_file),
            ("pulsar.tls-ca-file", &self.tls_ca_file),
            ("pulsar.tls-cert-file", &self.tls_cert_file),
            ("pulsar.tls-key-file", &self.tls_key_file),
            ("pulsar.encryption-key-file", &self.encryption_key_file),
        ] {
            file_problems(p, key, file.as_deref());
        }
        both(
            p,
            ("pulsar.tls-cert-file", self.tls_cert_file.is_some()),
            ("pulsar.tls-key-file", self.tls_key_file.is_some()),
            "a client certificate needs its key",
        );
        both(
            p,
            (
                "pulsar.encryption-key-file",
                self.encryption_key_file.is_some(),
            ),
            (
                "pulsar.encryption-key-name",
                self.encryption_key_name.is_some(),
            ),
            "consumers find the private key by the name",
        );
        if let Some(name) = &self.encryption_key_name {
            if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
                p.push(
                    "pulsar.encryption-key-name: 1 to 255 bytes, no control characters".to_string(),
                );
            }
        }
        if !(60..=30 * 86_400).contains(&self.encryption_key_rotation_s) {
            p.push(format!(
                "pulsar.encryption-key-rotation-s: {} must be between 60 (a minute) and 2592000 (30 days)",
                self.encryption_key_rotation_s
            ));
        }
        if self.batch_max_messages == 0 {
            p.push(
                "pulsar.batch-max-messages: must be at least 1 (1 turns batching off)".to_string(),
            );
        }
        if self.batch_max_bytes.0 < 1 << 10 {
            p.push(format!(
                "pulsar.batch-max-bytes: {} is below 1KiB (batch-max-messages = 1 turns batching off)",
                self.batch_max_bytes.0
            ));
        }
        if self.batch_max_bytes.0 > 4 << 20 {
            p.push(
                "pulsar.batch-max-bytes: must be at most 4MiB (below the broker's message size)"
                    .to_string(),
            );
        }
        if self.batch_delay_ms > 1000 {
            p.push("pulsar.batch-delay-ms: must be at most 1000".to_string());
        }
        if let Some(max) = self.max_bandwidth {
            if let Some(b) = max
                .bound()
                .filter(|b| !(MIN_BANDWIDTH..=MAX_BANDWIDTH).contains(&b.0))
            {
                p.push(format!(
                    "pulsar.max-bandwidth: {} bit/s must be between 64kbit and 100gbit (below, a 16 KiB grant and a chunk ahead of a keepalive answer can outlast the broker's keepalive)",
                    b.0
                ));
            }
            if self.url.is_none() {
                p.push(
                    "pulsar.max-bandwidth: set without pulsar.url (nothing is sent)".to_string(),
                );
            }
        }
        self.link_problems(p);
        if self.max_frame_bytes.0 == 0 || self.max_frame_bytes.0 > 1 << 30 {
            p.push("pulsar.max-frame-bytes: must be between 1 and 1GiB".to_string());
        }
    }
}

impl PulsarConfig {
    /// Each link's budget: its own `max-bandwidth`, else `pulsar.max-bandwidth`, else `"auto"`.
    pub fn link_bandwidth(&self, link: &LinkConfig) -> MaxBandwidth {
        link.max_bandwidth
            .or(self.max_bandwidth)
            .unwrap_or(MaxBandwidth::Auto { cap: None })
    }

    fn link_problems(&self, p: &mut Vec<String>) {
        if self.links.is_empty() {
            return;
        }
        if self.url.is_none() {
            p.push("pulsar.link: set without pulsar.url (nothing is sent)".to_string());
        }
        if self.links.len() > MAX_LINKS {
            p.push(format!(
                "pulsar.link: {} links, at most {MAX_LINKS}",
                self.links.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, l) in self.links.iter().enumerate() {
            let at = format!("pulsar.link[{i}]");
            // IFNAMSIZ: 15 bytes and a NUL; no '/' (a path under /sys/class/net), no space.
            if l.interface.is_empty()
                || l.interface.len() > 15
                || l.interface.contains(['/', ' ', ':'])
                || l.interface == "."
                || l.interface == ".."
            {
                p.push(format!(
                    "{at}.interface: `{}` is not an interface name (1 to 15 bytes, no '/', ':' or space)",
                    l.interface
                ));
            }
            let name = l.name();
            if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control()) {
                p.push(format!(
                    "{at}.name: 1 to 64 characters, no control characters"
                ));
            }
            if !seen.insert(name.to_string()) {
                p.push(format!("{at}: a second link named `{name}`"));
            }
            if self.links[..i].iter().any(|o| o.interface == l.interface) {
                p.push(format!(
                    "{at}.interface: `{}` is already another link's",
                    l.interface
                ));
            }
            if l.cost > 9 {
                p.push(format!("{at}.cost: {} is not 0 to 9", l.cost));
            }
            if let Some(b) = l
                .max_bandwidth
                .and_then(MaxBandwidth::bound)
                .filter(|b| !(MIN_BANDWIDTH..=MAX_BANDWIDTH).contains(&b.0))
            {
                p.push(format!(
                    "{at}.max-bandwidth: {} bit/s must be between 64kbit and 100gbit",
                    b.0
                ));
            }
        }
    }
}

#[cfg(test)]
mod link_tests {
    use super::*;

    #[test]
    fn links_are_checked_and_take_the_rigs_budget_by_default() {
        let mut p = PulsarConfig {
            url: Some("pulsar://10.0.0.1:6650".into()),
            ..Default::default()
        };
        let link = |interface: &str, cost| LinkConfig {
            interface: interface.into(),
            name: None,
            cost,
            max_bandwidth: None,
        };
        p.links = vec![link("wlan0", 0), link("wwan0", 9)];
        let mut problems = Vec::new();
        p.problems(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            p.link_bandwidth(&p.links[0]),
            MaxBandwidth::Auto { cap: None }
        );
        p.max_bandwidth = Some(MaxBandwidth::parse("2mbit").unwrap());
        p.links[1].max_bandwidth = Some(MaxBandwidth::parse("auto, at most 4mbit").unwrap());
        assert_eq!(p.link_bandwidth(&p.links[0]), p.max_bandwidth.unwrap());
        assert_eq!(
            p.link_bandwidth(&p.links[1]),
            p.links[1].max_bandwidth.unwrap()
        );

        p.links = vec![
            link("wlan0", 0),
            link("wlan0", 10),
            link("../x", 0),
            link("averyveryverylongname", 0),
        ];
        p.links[3].name = Some("wlan0".into());
        let mut problems = Vec::new();
        p.problems(&mut problems);
        let all = problems.join("\n");
        assert!(
            all.contains("pulsar.link[1]: a second link named `wlan0`"),
            "{all}"
        );
        assert!(
            all.contains("pulsar.link[1].interface: `wlan0` is already"),
            "{all}"
        );
        assert!(
            all.contains("pulsar.link[1].cost: 10 is not 0 to 9"),
            "{all}"
        );
        assert!(
            all.contains("pulsar.link[2].interface: `../x` is not"),
            "{all}"
        );
        assert!(
            all.contains("pulsar.link[3].interface: `averyveryverylongname`"),
            "{all}"
        );
        assert!(
            all.contains("pulsar.link[3]: a second link named `wlan0`"),
            "{all}"
        );
    }

    #[test]
    fn a_link_table_parses_from_toml() {
        let p: PulsarConfig = toml::from_str(
            r#"
url = "pulsar://10.0.0.1:6650"
[[link]]
interface = "wlan0"
[[link]]
interface = "wwan0"
name = "lte"
cost = 9
max-bandwidth = "auto, at most 4mbit"
"#,
        )
        .unwrap();
        assert_eq!(p.links.len(), 2);
        assert_eq!(p.links[0].name(), "wlan0");
        assert_eq!((p.links[1].name(), p.links[1].cost), ("lte", 9));
        let e =
            toml::from_str::<PulsarConfig>("[[link]]\ninterface = \"x\"\nspeed = 1\n").unwrap_err();
        assert!(e.to_string().contains("speed"), "{e}");
    }
}

#[cfg(test)]
mod coverage_tests {
    use super::*;

    #[test]
    fn the_coverage_topic_defaults_beside_the_topics_and_refuses_placeholders() {
        let mut p = PulsarConfig::default();
        assert_eq!(
            p.coverage_topic(),
            "persistent://public/default/rigd-coverage"
        );
        p.topic = "persistent://ai/ingest/{rig}-{source}".into();
        assert_eq!(p.coverage_topic(), "persistent://ai/ingest/rigd-coverage");
        assert_eq!(p.control_topic("r"), "persistent://ai/ingest/r-control");
        p.coverage_topic = Some("persistent://ai/ingest/{rig}-coverage".into());
        p.coverage_interval_s = 0;
        let mut problems = Vec::new();
        p.problems(&mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("pulsar.coverage-topic:"));
        assert!(problems[1].starts_with("pulsar.coverage-interval-s:"));
    }
}
