//! Which names and which pages may reach the rig through a browser: the `Host` a request names,
//! the `Origin` a browser sends, and its fetch metadata (`Sec-Fetch-*`). Pure: the daemon builds a
//! [`SitePolicy`] once, the web layer asks it about each request's headers.
//!
//! `allow-from` ([`crate::access`]) judges the TCP peer, but a technician's browser on the rig's
//! network is an allowed peer that runs whatever page it opened. Three rules close that door:
//!
//! - **Host.** DNS rebinding points an attacker's name at the rig after the attacker's page has
//!   loaded, so that the page is same-origin with the rig and reads every answer. The browser still
//!   sends the attacker's name in `Host`. A request is answered only when `Host` is an IP address
//!   literal (rebinding needs a name: a page whose origin is an address is the rig's, or an
//!   address the technician typed), one of the rig's own names (`localhost`, its hostname and
//!   `hostname.local`), or a configured name (`[web] server-names`); else 421.
//! - **Origin.** Browsers apply no same-origin rule to WebSockets and send any page's cross-origin
//!   POSTs. A request whose `Origin` is present must come from the rig's own page (the origin's
//!   host and port are the request's `Host`) or a listed origin (`[web] allowed-origins`, e.g.
//!   `https://app.foxglove.dev` for Foxglove's web app); else 403. Native clients (Foxglove
//!   desktop, the npm client, curl) send no `Origin` and are not affected.
//! - **Fetch metadata.** Where the browser sends it (Chromium and Firefox, to `https://` and
//!   loopback), a request that another site's page made (`Sec-Fetch-Site: cross-site` or
//!   `same-site`: another port or address of this host is another site's page too) is refused
//!   unless it is a top-level `GET` navigation (a link the technician follows) or its `Origin`
//!   is listed: an `<img>` of the camera preview on another page gets 403.

use std::net::IpAddr;

/// Why a request is refused (the text is the answer's `error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `Host` names neither an address nor one of the rig's names: 421 Misdirected Request.
    Host(String),
    /// The page that made the request is another site's: 403.
    Origin(String),
}

impl Refusal {
    pub fn message(&self) -> &str {
        match self {
            Refusal::Host(m) | Refusal::Origin(m) => m,
        }
    }
}

/// What the policy needs of a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub fetch_site: Option<&'a str>,
    pub fetch_mode: Option<&'a str>,
    pub fetch_dest: Option<&'a str>,
}

/// The names the rig answers to and the other origins whose pages may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitePolicy {
    /// Lowercase, no trailing dot.
    names: Vec<String>,
    /// `scheme://host:port`, normalized by [`Origin::parse`].
    origins: Vec<Origin>,
}

/// A serialized origin: scheme, host (lowercase, brackets kept on IPv6) and port (the scheme's
/// default filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// `http://name[:port]`, `https://...`; anything else (a path, `null`, another scheme) is an
    /// error naming what is wrong.
    pub fn parse(s: &str) -> Result<Origin, String> {
        let t = s.trim();
        let (scheme, rest) = t
            .split_once("://")
            .ok_or_else(|| format!("`{s}` is not an origin like https://app.foxglove.dev"))?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(format!("`{s}`: an origin's scheme is http or https")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
            return Err(format!(
                "`{s}`: an origin is scheme://host[:port], without a path"
            ));
        }
        let (host, port) = split_authority(rest)
            .ok_or_else(|| format!("`{s}`: the port must be a number from 1 to 65535"))?;
        Ok(Origin {
            scheme,
            host: normalize_name(host),
            port: port.unwrap_or(default_port),
        })
    }

    fn default_port(&self) -> u16 {
        if self.scheme == "https" {
            443
        } else {
            80
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.port == self.default_port() {
            write!(f, "{}://{}", self.scheme, self.host)
        } else {
            write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

/// `host[:port]` -> (host, port); `[v6]:port` keeps its brackets. None: a port that is not 1 to
/// 65535.
fn split_authority(a: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(end) = a.strip_prefix('[').and_then(|r| r.find(']')) {
        let host = &a[..end + 2];
        match &a[end + 2..] {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (a, None),
        }
    };
    match port {
        None => Some((host, None)),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .map(|p| (host, Some(p))),
    }
}

fn normalize_name(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// An IP address literal as it appears in `Host` (`[::1]` bracketed).
fn is_address(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().is_ok()
}

impl SitePolicy {
    /// The rig answers to `names` (and to any address) and serves pages of `origins` besides
    /// its own. `localhost` is always among the names.
    pub fn new(names: &[String], origins: &[String]) -> Result<SitePolicy, String> {
        let mut all: Vec<String> = vec!["localhost".into()];
        for n in names {
            let n = normalize_name(n);
            if n.is_empty() || n.contains(['/', ':', '@', ' ']) {
                return Err(format!("`{n}` is not a host name like rig-07.local"));
            }
            if !all.contains(&n) {
                all.push(n);
            }
        }
        let origins = origins
            .iter()
            .map(|o| Origin::parse(o))
            .collect::<Result<_, _>>()?;
        Ok(SitePolicy {
            names: all,
            origins,
        })
    }

    /// `localhost` and addresses only, no other origin.
    pub fn localhost_only() -> SitePolicy {
        SitePolicy {
            names: vec!["localhost".into()],
            origins: Vec::new(),
        }
    }

    /// The names this policy accepts in `Host`, `localhost` first.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether the rig answers this request (see the module's rules).
    pub fn judge(&self, r: &RequestHead<'_>) -> Result<(), Refusal> {
        let host = match r.host {
            // HTTP/1.0 without Host: not a browser of this century.
            None => None,
            Some(h) => Some(self.host(h)?),
        };
        let listed = match r.origin {
            None => false,
            Some(o) => self.origin(o, host.as_ref())?,
        };
        let other_site = matches!(r.fetch_site, Some("cross-site" | "same-site"));
        let followed_link = r.fetch_mode == Some("navigate")
            && matches!(r.fetch_dest, None | Some("document"))
            && matches!(r.method, "GET" | "HEAD");
        if other_site && !listed && !followed_link {
            return Err(Refusal::Origin(format!(
                "a page of another site may not use this rig ({} request{}); add its origin to [web] allowed-origins if it should",
                r.fetch_dest.unwrap_or("a"),
                r.origin.map(|o| format!(" from {o}")).unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// The request's authority (host, port) when `Host` names the rig.
    fn host(&self, host: &str) -> Result<(String, Option<u16>), Refusal> {
        let bad = || {
            Refusal::Host(format!("`Host: {host}` is not an address or name of this rig; add the name to [web] server-names if the rig should answer to it"))
        };
        let (name, port) = split_authority(host.trim()).ok_or_else(bad)?;
        let name = normalize_name(name);
        if is_address(&name) || self.names.contains(&name) {
            Ok((name, port))
        } else {
            Err(bad())
        }
    }

    /// Ok(true): a listed origin; Ok(false): the rig's own page.
    fn origin(&self, origin: &str, host: Option<&(String, Option<u16>)>) -> Result<bool, Refusal> {
        let refused = || {
            Refusal::Origin(format!(
                "a page of {origin} may not use this rig; add the origin to [web] allowed-origins if it should"
            ))
        };
        let o = Origin::parse(origin).map_err(|_| refused())?;
        if self.origins.contains(&o) {
            return Ok(true);
        }
        // The rig's own page: the origin's authority is the one the request was sent to (the
        // scheme cannot differ on one port, and the Host check has judged the name).
        match host {
            Some((name, port)) if *name == o.host && port.unwrap_or(o.default_port()) == o.port => {
                Ok(false)
            }
            _ => Err(refused()),
        }
    }
}

/// This host's own names for [`SitePolicy::new`]: its hostname and `hostname.local` (mDNS), read
/// from the kernel; none when it cannot be read.
pub fn this_host_names() -> Vec<String> {
    let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") else {
        return Vec::new();
    };
    let name = normalize_name(name.trim());
    if name.is_empty() || name == "(none)" {
        return Vec::new();
    }
    let short = name.split('.').next().unwrap_or(&name).to_string();
    let mut names = vec![name.clone()];
    for n in [short.clone(), format!("{short}.local")] {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    // Only what SitePolicy::new takes: a hostname with odd characters is left out, not an error.
    names.retain(|n| SitePolicy::new(std::slice::from_ref(n), &[]).is_ok());
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> SitePolicy {
        SitePolicy::new(
            &["Van-07.local.".into(), "rig.example".into()],
            &["https://app.foxglove.dev".into()],
        )
        .unwrap()
    }

    fn get(host: &str) -> RequestHead<'_> {
        RequestHead {
            method: "GET",
            host: Some(host),
            ..Default::default()
        }
    }

    #[test]
    fn a_rebound_name_is_misdirected_and_the_rigs_names_and_addresses_are_answered() {
        let p = policy();
        for ok in [
            "127.0.0.2:8088",
            "10.1.2.3",
            "[::1]:8088",
            "[fe80::1]",
            "localhost:8088",
            "LOCALHOST",
            "van-07.local",
            "van-07.local.:8088",
            "rig.example:443",
        ] {
            assert_eq!(p.judge(&get(ok)), Ok(()), "{ok}");
        }
        for bad in [
            "rebind.attacker.example",
            "rebind.attacker.example:8088",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "van-07",
            "rig.example:0",
            "rig.example:99999",
            "",
        ] {
            assert!(
                matches!(p.judge(&get(bad)), Err(Refusal::Host(_))),
                "{bad} accepted"
            );
        }
        // No Host at all (HTTP/1.0): answered.
        assert_eq!(p.judge(&RequestHead::default()), Ok(()));
    }

    #[test]
    fn only_the_rigs_own_page_and_listed_origins_may_send_an_origin() {
        let p = policy();
        let with = |host, origin| RequestHead {
            method: "GET",
            host: Some(host),
            origin: Some(origin),
            ..Default::default()
        };
        for (host, origin) in [
            ("127.0.0.2:8088", "http://127.0.0.2:8088"),
            ("van-07.local:8088", "http://VAN-07.local:8088"),
            ("rig.example", "https://rig.example"),
            ("rig.example", "http://rig.example"),
            ("127.0.0.2:8088", "https://app.foxglove.dev"),
            ("127.0.0.2:8088", "https://app.foxglove.dev:443"),
        ] {
            assert_eq!(p.judge(&with(host, origin)), Ok(()), "{host} {origin}");
        }
        for (host, origin) in [
            ("127.0.0.2:8088", "http://evil.example"),
            ("127.0.0.2:8088", "http://127.0.0.2:9999"),
            ("127.0.0.2:8088", "http://127.0.0.3:8088"),
            ("127.0.0.2:8088", "null"),
            ("127.0.0.2:8088", "file://"),
            ("127.0.0.2:8088", "http://app.foxglove.dev"),
            ("rig.example", "https://rig.example:8443"),
        ] {
            assert!(
                matches!(p.judge(&with(host, origin)), Err(Refusal::Origin(_))),
                "{host} {origin} accepted"
            );
        }
    }

    #[test]
    fn another_sites_subresource_is_refused_and_a_followed_link_is_not() {
        let p = policy();
        let fetch = |method, site, mode, dest, origin| RequestHead {
            method,
            host: Some("127.0.0.2:8088"),
            origin,
            fetch_site: Some(site),
            fetch_mode: Some(mode),
            fetch_dest: Some(dest),
        };
        // An <img> of the preview on another site's page (no Origin on a no-cors GET).
        assert!(p
            .judge(&fetch("GET", "cross-site", "no-cors", "image", None))
            .is_err());
        assert!(p
            .judge(&fetch("GET", "same-site", "no-cors", "image", None))
            .is_err());
        // A link followed to the page, or typed: answered.
        assert!(p
            .judge(&fetch("GET", "cross-site", "navigate", "document", None))
            .is_ok());
        assert!(p
            .judge(&fetch("GET", "none", "navigate", "document", None))
            .is_ok());
        // A form posted from another site is not a followed link.
        assert!(p
            .judge(&fetch("POST", "cross-site", "navigate", "document", None))
            .is_err());
        // Framed: not a document navigation.
        assert!(p
            .judge(&fetch("GET", "cross-site", "navigate", "iframe", None))
            .is_err());
        // The rig's own page.
        assert!(p
            .judge(&fetch(
                "GET",
                "same-origin",
                "cors",
                "empty",
                Some("http://127.0.0.2:8088")
            ))
            .is_ok());
        // Foxglove's web app, listed.
        assert!(p
            .judge(&fetch(
                "GET",
                "cross-site",
                "websocket",
                "websocket",
                Some("https://app.foxglove.dev")
            ))
            .is_ok());
    }

    #[test]
    fn names_and_origins_that_cannot_be_meant_are_refused_with_the_reason() {
        assert!(SitePolicy::new(&["rig/x".into()], &[]).is_err());
        for bad in [
            "app.foxglove.dev",
            "ftp://x",
            "https://x/path",
            "https://x:0",
            "https://",
        ] {
            assert!(SitePolicy::new(&[], &[bad.into()]).is_err(), "{bad}");
        }
        let o = Origin::parse("HTTPS://App.Foxglove.Dev:443/").unwrap();
        assert_eq!(o.to_string(), "https://app.foxglove.dev");
        assert_eq!(
            Origin::parse("http://[::1]:8088").unwrap().to_string(),
            "http://[::1]:8088"
        );
    }
}
