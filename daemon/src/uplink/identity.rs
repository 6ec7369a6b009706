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
        let (not_before, not_after) = self.validity?;
        let date = |t: i64| crate::civil::format(t * 1_000_000_000);
        if now > not_after {
            Some(format!(
                "{}: the client certificate expired at {}: the broker refuses it; install a renewed one",
                self.path.display(),
                date(not_after)
            ))
        } else if now < not_before {
            Some(format!(
                "{}: the client certificate is valid only from {} (is the rig's clock right?)",
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
    fn truncated_der_is_not_a_date() {
        assert_eq!(validity(&[0x30, 0x82, 0xff]), None);
        assert_eq!(validity(&[]), None);
    }
}
