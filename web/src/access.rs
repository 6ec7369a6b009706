//! Who may talk to the web server at all: an allow-list of networks, checked against the peer
//! address of each connection before any route (reads included) answers.
//!
//! The status page shows the camera preview, the last serial records (GPS positions) and the
//! broker's address; a rig bound to `0.0.0.0` serves them on every interface, a cellular one
//! included. The default list is the networks a technician's laptop or phone is on when it is
//! next to the rig (loopback, RFC 1918, link-local, IPv6 ULA): a carrier's CGNAT range
//! (100.64.0.0/10) and public addresses are refused with 403 unless `[web] allow-from` names them.
//!
//! [`Gate`] puts the peer's network and the browser rules of [`crate::site`] (the `Host` and
//! `Origin` a request carries) in front of a router: the rig's own server and `rigd live` both.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::site::{Refusal, RequestHead, SitePolicy};

/// The peer address of the connection a request came on (set by [`crate::serve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// One network: an address and a prefix length (`10.0.0.0/8`, `fe80::/10`; a bare address is
/// one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an address or network (a.b.c.d/n, x::/n)"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}`: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { net, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - self.prefix as u32).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - self.prefix as u32).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The networks allowed to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList(Vec<Cidr>);

impl AllowList {
    pub fn new(nets: Vec<Cidr>) -> Self {
        AllowList(nets)
    }

    /// Loopback, RFC 1918, link-local and IPv6 unique-local: the networks next to the rig.
    pub fn private() -> Self {
        let v4 = |a, b, c, d, p| Cidr {
            net: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix: p,
        };
        let v6 = |first: u16, p| Cidr {
            net: IpAddr::V6(Ipv6Addr::new(first, 0, 0, 0, 0, 0, 0, 0)),
            prefix: p,
        };
        AllowList(vec![
            v4(127, 0, 0, 0, 8),
            v4(10, 0, 0, 0, 8),
            v4(172, 16, 0, 0, 12),
            v4(192, 168, 0, 0, 16),
            v4(169, 254, 0, 0, 16),
            Cidr {
                net: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
            v6(0xfc00, 7),
            v6(0xfe80, 10),
        ])
    }

    /// Loopback only (127.0.0.0/8, ::1): `rigd live`'s default.
    pub fn loopback() -> Self {
        AllowList(vec![
            Cidr {
                net: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
                prefix: 8,
            },
            Cidr {
                net: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
        ])
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }

    pub fn nets(&self) -> &[Cidr] {
        &self.0
    }
}

/// Who is answered at all: peers on `allow` (None: every peer) whose request passes `site`
/// (None: no browser rules, as before the rules existed; only tests build that).
#[derive(Debug, Clone, Default)]
pub struct Gate {
    pub allow: Option<AllowList>,
    pub site: Option<SitePolicy>,
}

impl Gate {
    /// Refuses before any route answers: 403 for a peer outside the allow-list (a request
    /// without a peer, which only a test makes, is judged as one from nowhere: refused when
    /// there is a list), 421 for a name that is not the rig's, 403 for another site's page.
    pub fn judge(
        &self,
        peer: Option<IpAddr>,
        method: &str,
        headers: &HeaderMap,
    ) -> Result<(), (StatusCode, String)> {
        if let Some(allow) = &self.allow {
            if !peer.is_some_and(|ip| allow.allows(ip)) {
                let who = peer.map_or("this client".to_string(), |ip| ip.to_string());
                return Err((
                    StatusCode::FORBIDDEN,
                    format!("{who} is not on a network in [web] allow-from"),
                ));
            }
        }
        let Some(site) = &self.site else {
            return Ok(());
        };
        let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        let head = RequestHead {
            method,
            host: text(header::HOST),
            origin: text(header::ORIGIN),
            fetch_site: text(header::HeaderName::from_static("sec-fetch-site")),
            fetch_mode: text(header::HeaderName::from_static("sec-fetch-mode")),
            fetch_dest: text(header::HeaderName::from_static("sec-fetch-dest")),
        };
        site.judge(&head).map_err(|r| match r {
            Refusal::Host(m) => (StatusCode::MISDIRECTED_REQUEST, m),
            Refusal::Origin(m) => (StatusCode::FORBIDDEN, m),
        })
    }

    /// `router` behind this gate.
    pub fn guard(self, router: Router) -> Router {
        router.layer(middleware::from_fn_with_state(Arc::new(self), gate))
    }
}

async fn gate(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<Peer>().map(|p| p.0.ip());
    match gate.judge(peer, req.method().as_str(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err((code, why)) => {
            tracing::debug!(peer = ?peer, code = code.as_u16(), why, "web: request refused");
            crate::AppError(code, why).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_parse_and_contain_what_they_should() {
        let n: Cidr = "192.168.7.0/24".parse().unwrap();
        assert!(n.contains(ip("192.168.7.200")) && !n.contains(ip("192.168.8.1")));
        assert!(
            n.contains(ip("::ffff:192.168.7.9")),
            "IPv4 via a dual-stack listener"
        );
        let host: Cidr = "203.0.113.5".parse().unwrap();
        assert!(host.contains(ip("203.0.113.5")) && !host.contains(ip("203.0.113.6")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")) && !all.contains(ip("2001:db8::1")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")) && !v6.contains(ip("2001:db9::1")));
        for bad in ["10.0.0.0/33", "fe80::/129", "ten.0.0.0/8", "10.0.0.0/", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert_eq!(
            "10.1.2.3/8".parse::<Cidr>().unwrap().to_string(),
            "10.1.2.3/8"
        );
    }

    #[test]
    fn the_default_takes_the_networks_next_to_the_rig_and_refuses_the_rest() {
        let p = AllowList::private();
        for ok in [
            "127.0.0.1",
            "10.1.2.3",
            "172.31.255.1",
            "192.168.1.20",
            "169.254.3.4",
            "::1",
            "fd12::3",
            "fe80::1",
        ] {
            assert!(p.allows(ip(ok)), "{ok}");
        }
        // A carrier's CGNAT range (the cellular side), public addresses, documentation ranges.
        for no in [
            "100.64.1.2",
            "8.8.8.8",
            "172.32.0.1",
            "203.0.113.2",
            "2001:db8::1",
        ] {
            assert!(!p.allows(ip(no)), "{no}");
        }
    }
}
