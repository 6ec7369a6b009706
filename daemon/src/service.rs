//! Pulsar service URLs as the official clients take them: `pulsar://host[:port][,host2...]` or
//! `pulsar+ssl://`, the port defaulting per scheme. Pure: the uplink connects to what this
//! parses, and `check` refuses what it refuses.

/// Where to connect: from `pulsar://host:port` or `pulsar+ssl://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

impl Endpoint {
    /// One broker: `pulsar://host:port` (a lookup answer).
    pub fn parse(url: &str) -> Result<Self, String> {
        let mut all = Self::parse_service(url)?;
        if all.len() != 1 {
            return Err(format!(
                "`{url}` names {} brokers where one was expected",
                all.len()
            ));
        }
        Ok(all.remove(0))
    }

    /// A service URL: one broker or several, as the official clients take them
    /// (`pulsar://host1:6650,host2:6650`); the port defaults per host.
    pub fn parse_service(url: &str) -> Result<Vec<Self>, String> {
        let (rest, tls, default_port) = if let Some(r) = url.strip_prefix("pulsar+ssl://") {
            (r, true, 6651)
        } else if let Some(r) = url.strip_prefix("pulsar://") {
            (r, false, 6650)
        } else {
            return Err(format!(
                "unsupported service URL `{url}` (use pulsar:// or pulsar+ssl://)"
            ));
        };
        let rest = rest.trim_end_matches('/');
        // A service URL names brokers only: `pulsar://host/admin` would otherwise make the
        // host `host/admin`, which `check` passed and the uplink then failed to resolve forever.
        if let Some(at) = rest.find(['/', '?', '#', '@']) {
            return Err(format!(
                "`{url}` has `{}` after its brokers: a service URL is scheme://host[:port][,host[:port]...], without a path, query or user",
                &rest[at..]
            ));
        }
        rest.split(',')
            .map(|hostport| {
                let hostport = hostport.trim();
                let (host, port) = match hostport.rsplit_once(':') {
                    Some((h, p)) if !p.contains(']') => {
                        (h, p.parse().map_err(|_| format!("bad port in `{url}`"))?)
                    }
                    _ => (hostport, default_port),
                };
                let host = host.trim_matches(['[', ']']);
                if host.is_empty() {
                    return Err(format!("empty host in `{url}`"));
                }
                Ok(Endpoint {
                    host: host.to_string(),
                    port,
                    tls,
                })
            })
            .collect()
    }

    /// This broker alone as a service URL (for clients that take one host).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "pulsar+ssl" } else { "pulsar" };
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }

    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A service URL as the uplink will take it: whether it is TLS, or why it cannot be used.
pub fn service_url(url: &str) -> Result<bool, String> {
    Endpoint::parse_service(url)?;
    Ok(url.starts_with("pulsar+ssl://"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls_map_to_endpoints() {
        let e = Endpoint::parse("pulsar://127.0.0.1:6650").unwrap();
        assert_eq!((e.addr(), e.tls), ("127.0.0.1:6650".to_string(), false));
        let e = Endpoint::parse("pulsar+ssl://broker.example/").unwrap();
        assert_eq!((e.addr(), e.tls), ("broker.example:6651".to_string(), true));
        assert_eq!(Endpoint::parse("pulsar://[::1]:7000").unwrap().host, "::1");
        assert!(Endpoint::parse("http://x").is_err());
        assert!(Endpoint::parse("pulsar://x:notaport").is_err());
    }

    #[test]
    fn a_service_url_with_a_path_is_refused() {
        // `pulsar://host/admin` parsed as the host `host/admin` (issue 32).
        for url in [
            "pulsar://host/admin",
            "pulsar://host:6650/admin",
            "pulsar+ssl://a:1,b/x/",
            "pulsar://host?x=1",
            "pulsar://user@host:6650",
        ] {
            let e = Endpoint::parse_service(url).unwrap_err();
            assert!(e.contains("after its brokers"), "{url}: {e}");
        }
        assert!(Endpoint::parse_service("pulsar://host/").is_ok());
    }

    #[test]
    fn a_service_url_may_name_several_brokers() {
        let all = Endpoint::parse_service("pulsar://127.0.0.1:6660, 127.0.0.1:6661,b3/").unwrap();
        let addrs: Vec<_> = all.iter().map(Endpoint::addr).collect();
        assert_eq!(addrs, ["127.0.0.1:6660", "127.0.0.1:6661", "b3:6650"]);
        assert_eq!(all[1].url(), "pulsar://127.0.0.1:6661");
        let all = Endpoint::parse_service("pulsar+ssl://[::1]:7000,[::2]").unwrap();
        assert!(all.iter().all(|e| e.tls));
        assert_eq!(all[1].port, 6651);
        assert_eq!(all[0].url(), "pulsar+ssl://[::1]:7000");
        // a lookup answer names one broker
        assert!(Endpoint::parse("pulsar://a:1,b:2").is_err());
        assert!(Endpoint::parse_service("pulsar://a:1,,b:2").is_err());
    }
}
