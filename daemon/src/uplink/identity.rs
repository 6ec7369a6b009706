//! The rig's client certificate: when it stops being valid. Read from the certificate itself so
//! that an expired identity is said at start and on the status page, not only as a refused
//! handshake. A minimal DER walk to the validity field (RFC 5280 4.1): no X.509 library for
//! one date.

use rustls_pki_types::pem::PemObject;
use std::path::Path;

/// Reads one DER tag-length header at `at`: (tag, start of the value, end of the value).
fn tlv(der: &[u8], at: usize) -> Option<(u8, usize, usize)> {
    let tag = *der.get(at)?;
    let first = *der.get(at + 1)? as usize;
    let (len, start) = if first < 0x80 {
        (first, at + 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = len << 8 | *der.get(at + 2 + i)? as usize;
        }
        (len, at + 2 + n)
    };
    let end = start.checked_add(len)?;
    (end <= der.len()).then_some((tag, start, end))
}

/// UTCTime (tag 0x17, `YYMMDDHHMMSSZ`) or GeneralizedTime (0x18, `YYYYMMDDHHMMSSZ`) in seconds
/// since the Unix epoch.
fn time(tag: u8, v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 if s.len() == 12 => {
            let yy: i64 = s[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &s[2..])
        }
        0x18 if s.len() == 14 => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    let n = |i: usize| rest.get(i..i + 2)?.parse::<i64>().ok();
    let days = crate::civil::days_from_civil(year, n(0)?, n(2)?);
    Some(days * 86_400 + n(4)? * 3600 + n(6)? * 60 + n(8)?)
}

/// (notBefore, notAfter) of a DER certificate, in seconds since the Unix epoch.
pub fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (_, cert, _) = tlv(der, 0)?;
    let (_, tbs, _) = tlv(der, cert)?;
    let mut at = tbs;
    let (tag, _, end) = tlv(der, at)?;
    if tag == 0xa0 {
        at = end; // [0] version
    }
    for _ in 0..3 {
        at = tlv(der, at)?.2; // serialNumber, signature, issuer
    }
    let (_, v, _) = tlv(der, at)?;
    let (t1, s1, e1) = tlv(der, v)?;
    let (t2, s2, e2) = tlv(der, e1)?;
    Some((time(t1, &der[s1..e1])?, time(t2, &der[s2..e2])?))
}

/// The X.509 version of a DER certificate (1, 2 or 3): v1 has no `[0] version` field.
pub fn version(der: &[u8]) -> Option<u8> {
    let (_, cert, _) = tlv(der, 0)?;
    let (_, tbs, _) = tlv(der, cert)?;
    let (tag, start, _) = tlv(der, tbs)?;
    if tag != 0xa0 {
        return Some(1);
    }
    let (int, v, end) = tlv(der, start)?;
    (int == 0x02 && end == v + 1).then(|| der[v] + 1)
}

/// Which file of a certificate and its key a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairFile {
    Cert,
    Key,
    /// Each file is fine alone; they do not belong together.
    Both,
}

/// What is wrong with a certificate chain (PEM) and its private key (PEM) as a TLS identity
/// (the rig's client certificate, the web server's), in words an operator can act on: which
/// file, and what to do. None when rustls would take them.
pub fn pair_problem(cert: &Path, key: &Path) -> Option<(PairFile, String)> {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let holds = |path: &Path, what: &str| {
        std::fs::read_to_string(path).is_ok_and(|t| t.contains(&format!("{what}-----")))
    };
    let chain = match CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
    {
        Ok(chain) => chain,
        Err(e) => return Some((PairFile::Cert, format!("{}: {e}", cert.display()))),
    };
    let Some(first) = chain.first() else {
        let why = if holds(cert, "PRIVATE KEY") {
            "holds a private key, not a certificate (are tls-cert-file and tls-key-file swapped?)"
        } else {
            "no certificate in it (a PEM `-----BEGIN CERTIFICATE-----` block)"
        };
        return Some((PairFile::Cert, format!("{}: {why}", cert.display())));
    };
    match version(first) {
        Some(3) => {}
        Some(v) => {
            return Some((
                PairFile::Cert,
                format!(
                    "{}: an X.509 version {v} certificate: TLS accepts only version 3 certificates (with extensions) as an identity; issue a v3 one (`openssl req -x509` and `openssl x509 -req -extfile FILE` make v3)",
                    cert.display()
                ),
            ))
        }
        None => {
            return Some((
                PairFile::Cert,
                format!(
                    "{}: the first certificate is not valid DER (a damaged or truncated PEM block)",
                    cert.display()
                ),
            ))
        }
    }
    let key_der = match PrivateKeyDer::from_pem_file(key) {
        Ok(k) => k,
        Err(e) => {
            let why = if holds(key, "CERTIFICATE") {
                "holds a certificate, not a private key (are tls-cert-file and tls-key-file swapped?)".to_string()
            } else if holds(key, "PUBLIC KEY") {
                "holds a public key: TLS needs the private key the certificate was issued for"
                    .to_string()
            } else if matches!(e, rustls_pki_types::pem::Error::NoItemsFound) {
                "no private key in it (a PEM `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY` block)".to_string()
            } else {
                e.to_string()
            };
            return Some((PairFile::Key, format!("{}: {why}", key.display())));
        }
    };
    let provider = rustls::crypto::ring::default_provider();
    match rustls::sign::CertifiedKey::from_der(chain, key_der, &provider) {
        Ok(_) => None,
        Err(rustls::Error::InconsistentKeys(_)) => Some((
            PairFile::Both,
            format!(
                "{} and {} do not match: the key is not the one the certificate was issued for (is the key the certificate's? give the pair that belongs together)",
                cert.display(),
                key.display()
            ),
        )),
        Err(e) => Some((
            PairFile::Key,
            format!(
                "{}: a private key rustls cannot use ({e}); RSA (2048 bits or more), ECDSA P-256/P-384 and Ed25519 keys are",
                key.display()
            ),
        )),
    }
}

/// Why the certificate at `path` (its first, the end entity) is not valid at `now` (seconds since
/// the Unix epoch): expired or not yet valid; `what` names it ("the client certificate") and `by`
/// who refuses it then ("the broker").
pub fn dates_problem(path: &Path, what: &str, by: &str, now: i64) -> Option<String> {
    ClientCert::read(path).dated(what, by, now)
}

/// The rig's client certificate as read once at start (a renewal is a restart): its path and,
/// when its first certificate parses, its validity.
#[derive(Debug, Clone)]
pub struct ClientCert {
    path: std::path::PathBuf,
    validity: Option<(i64, i64)>,
}

impl ClientCert {
    pub fn read(path: &Path) -> Self {
        let validity = rustls_pki_types::CertificateDer::pem_file_iter(path)
            .ok()
            .and_then(|mut certs| certs.next())
            .and_then(Result::ok)
            .and_then(|cert| validity(&cert));
        Self {
            path: path.to_path_buf(),
            validity,
        }
    }

    /// Why it cannot identify the rig at `now` (seconds since the Unix epoch): expired, or not
    /// yet valid; None when within its validity or unreadable (loading it at start says so).
    fn invalid_at(&self, now: i64) -> Option<String> {
        self.dated("the client certificate", "the broker", now)
    }

    fn dated(&self, what: &str, by: &str, now: i64) -> Option<String> {
        let (not_before, not_after) = self.validity?;
        let date = |t: i64| crate::civil::format(t * 1_000_000_000);
        if now > not_after {
            Some(format!(
                "{}: {what} expired at {}: {by} refuses it; install a renewed one",
                self.path.display(),
                date(not_after)
            ))
        } else if now < not_before {
            Some(format!(
                "{}: {what} is valid only from {} (is the rig's clock right?)",
                self.path.display(),
                date(not_before)
            ))
        } else {
            None
        }
    }
}

/// Words of a refusal that is about the rig's credentials (rustls alerts from the broker's side of
/// the handshake, the broker's authentication errors), not about the network.
const REFUSALS: &[&str] = &[
    "CertificateExpired",
    "BadCertificate",
    "CertificateRequired",
    "UnknownCA",
    "CertificateRevoked",
    "AccessDenied",
    "AuthenticationError",
    "AuthorizationError",
];

/// What is wrong with the credentials, for the status page: the certificate's own dates first
/// (they say why), else a connection error that is a refusal of the credentials.
pub fn problem(cert: Option<&ClientCert>, last_error: Option<&str>) -> Option<String> {
    let now = rigd_drivers::realtime_ns() / 1_000_000_000;
    if let Some(why) = cert.and_then(|c| c.invalid_at(now)) {
        return Some(why);
    }
    let e = last_error?;
    // A broker that rejects a client certificate ends the handshake with an alert whose name
    // depends on its TLS stack (the JDK's sends InternalError for an unknown CA): with a
    // certificate configured, any fatal alert from the broker is taken as a refusal of it.
    let alert = cert.is_some() && e.contains("received fatal alert");
    (alert || REFUSALS.iter().any(|w| e.contains(w)))
        .then(|| format!("the broker refused them ({e})"))
}

/// A refusal of the rig's producers by a namespace policy, for the status page: the broker answers
/// a producer without end-to-end encryption on a namespace that requires it with
/// "Encryption is required in <topic>" (a MetadataError).
pub fn policy_refusal(encrypting: bool, last_error: Option<&str>) -> Option<String> {
    let e = last_error?;
    (!encrypting && e.contains("Encryption is required")).then(|| {
        format!("the namespace requires end-to-end encryption and [pulsar] encryption-key-file is not set ({e})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_times() {
        assert_eq!(time(0x17, b"261201145000Z"), Some(1_796_136_600));
        assert_eq!(time(0x18, b"20261201145000Z"), Some(1_796_136_600));
        assert_eq!(time(0x17, b"bad"), None);
    }

    #[test]
    fn refusals_are_told_from_network_errors() {
        assert!(problem(None, Some("TLS: received fatal alert: BadCertificate")).is_some());
        assert!(problem(None, Some("connect 127.0.0.1:6651: connection refused")).is_none());
        assert!(problem(None, None).is_none());
        let alert = Some("connection: received fatal alert: InternalError");
        assert!(problem(None, alert).is_none());
        let unreadable = ClientCert::read(Path::new("/nonexistent.pem"));
        assert!(problem(Some(&unreadable), alert).is_some());
        let expired = ClientCert {
            path: "rig.pem".into(),
            validity: Some((0, 1_000)),
        };
        assert!(expired.invalid_at(2_000).unwrap().contains("expired"));
        assert!(expired.invalid_at(500).is_none());
        assert!(expired.invalid_at(-1).unwrap().contains("valid only from"));
    }

    #[test]
    fn an_encryption_policy_refusal_is_told_when_rigd_publishes_in_clear() {
        let e = Some("Encryption is required in persistent://public/x/t (MetadataError) instead of PRODUCER_SUCCESS");
        assert!(policy_refusal(false, e)
            .unwrap()
            .contains("encryption-key-file"));
        assert!(policy_refusal(true, e).is_none());
        assert!(policy_refusal(false, Some("connection refused")).is_none());
        assert!(policy_refusal(false, None).is_none());
    }

    #[test]
    fn issue_47_the_certificate_version_is_read() {
        // SEQUENCE { SEQUENCE (tbs) { [0] { INTEGER 2 } ... } }: v3.
        let v3 = [0x30, 0x07, 0x30, 0x05, 0xa0, 0x03, 0x02, 0x01, 0x02];
        assert_eq!(version(&v3), Some(3));
        // No [0]: the tbs starts with the serial number, v1.
        let v1 = [0x30, 0x05, 0x30, 0x03, 0x02, 0x01, 0x07];
        assert_eq!(version(&v1), Some(1));
        assert_eq!(version(&[0x30]), None);
        let expired = ClientCert {
            path: "web.pem".into(),
            validity: Some((0, 1_000)),
        };
        let why = expired
            .dated("the web certificate", "a browser", 2_000)
            .unwrap();
        assert!(
            why.contains("the web certificate expired") && why.contains("a browser refuses it"),
            "{why}"
        );
    }

    #[test]
    fn truncated_der_is_not_a_date() {
        assert_eq!(validity(&[0x30, 0x82, 0xff]), None);
        assert_eq!(validity(&[]), None);
    }
}
