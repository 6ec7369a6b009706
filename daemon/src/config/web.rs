//! `[web]`: the status page's address, TLS and who may reach it.

use super::*;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct WebConfig {
    #[serde(default = "default_bind")]
    pub bind: String,
    /// Control actions are disabled without it.
    pub token_file: Option<PathBuf>,
    /// Certificate chain (PEM) for HTTPS; with `tls-key-file` the UI and API are served over
    /// TLS only (plain HTTP is refused), so the control token never crosses the rig's network in
    /// clear.
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: Option<PathBuf>,
    /// Networks whose clients get an answer at all, reads included (`10.0.0.0/8`, `fe80::/10`,
    /// a bare address); absent: loopback, RFC 1918, link-local and IPv6 ULA, the networks next
    /// to the rig (`rigd_web::access`). `["0.0.0.0/0", "::/0"]` answers everyone.
    pub allow_from: Option<Vec<String>>,
    /// Live-view clients (Foxglove at `/foxglove`) served at once; the next is refused (503).
    /// 0 turns the live view off.
    #[serde(default = "default_max_live_clients")]
    pub max_live_clients: u32,
    /// Names the rig answers to in `Host` besides its addresses, `localhost`, its hostname and
    /// `hostname.local` (a DNS name technicians use for it); others get 421, so that DNS
    /// rebinding cannot make an attacker's page same-origin with the rig (`rigd_web::site`).
    #[serde(default)]
    pub server_names: Vec<String>,
    /// Origins of other sites whose pages may use the rig (`https://app.foxglove.dev` for
    /// Foxglove's web app); a browser request from any other page is refused (403).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

/// Most live-view clients a rig may be asked to serve: each may hold its queue's bytes.
pub const MAX_LIVE_CLIENTS: u32 = 16;

fn default_max_live_clients() -> u32 {
    4
}

fn default_bind() -> String {
    "127.0.0.1:8088".to_string()
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            bind: default_bind(),
            token_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            allow_from: None,
            max_live_clients: default_max_live_clients(),
            server_names: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

impl WebConfig {
    /// The networks allowed to connect (see `allow_from`); entries that do not parse are
    /// [`Config::problems`].
    pub fn allow_list(&self) -> rigd_web::access::AllowList {
        match &self.allow_from {
            None => rigd_web::access::AllowList::private(),
            Some(nets) => rigd_web::access::AllowList::new(
                nets.iter().filter_map(|n| n.parse().ok()).collect(),
            ),
        }
    }
}

impl WebConfig {
    /// The names and pages the rig answers (see `server_names`, `allowed_origins`): this host's
    /// own names added; entries that do not parse are [`Config::problems`].
    pub fn site_policy(&self) -> Result<rigd_web::site::SitePolicy, String> {
        let mut names = rigd_web::site::this_host_names();
        names.extend(self.server_names.iter().cloned());
        rigd_web::site::SitePolicy::new(&names, &self.allowed_origins)
    }
}

impl WebConfig {
    /// What is wrong with the `[web]` table alone.
    pub(super) fn problems(&self, p: &mut Vec<String>) {
        both(
            p,
            ("web.tls-cert-file", self.tls_cert_file.is_some()),
            ("web.tls-key-file", self.tls_key_file.is_some()),
            "HTTPS needs both",
        );
        for (key, file) in [
            ("web.token-file", &self.token_file),
            ("web.tls-cert-file", &self.tls_cert_file),
            ("web.tls-key-file", &self.tls_key_file),
        ] {
            file_problems(p, key, file.as_deref());
        }
        if self.bind.parse::<SocketAddr>().is_err() {
            p.push(format!(
                "web.bind: `{}` is not an address like 127.0.0.1:8088",
                self.bind
            ));
        }
        if self.max_live_clients > MAX_LIVE_CLIENTS {
            p.push(format!(
                "web.max-live-clients: {} is more than {MAX_LIVE_CLIENTS} (each client may hold {} MiB of queued messages; 0 turns the live view off)",
                self.max_live_clients,
                rigd_web::live::CLIENT_QUEUE_BYTES >> 20
            ));
        }
        for name in &self.server_names {
            if let Err(e) = rigd_web::site::SitePolicy::new(std::slice::from_ref(name), &[]) {
                p.push(format!("web.server-names: {e}"));
            }
        }
        for origin in &self.allowed_origins {
            if let Err(e) = rigd_web::site::Origin::parse(origin) {
                p.push(format!("web.allowed-origins: {e}"));
            }
        }
        for net in self.allow_from.iter().flatten() {
            if let Err(e) = net.parse::<rigd_web::access::Cidr>() {
                p.push(format!("web.allow-from: {e}"));
            }
        }
        if self.allow_from.as_ref().is_some_and(Vec::is_empty) {
            p.push(
                "web.allow-from: an empty list refuses every client (403), loopback and /healthz included; leave the key out for the private networks, or name the networks that may connect"
                    .to_string(),
            );
        }
    }

    /// What `check` says of `[web]` without refusing it: a network that admits every address
    /// beside narrower ones (the narrower ones then restrict nothing, which is rarely what
    /// was meant; `["0.0.0.0/0", "::/0"]` alone is a choice, and said nowhere).
    pub(super) fn warnings(&self, w: &mut Vec<String>) {
        let nets: Vec<rigd_web::access::Cidr> = self
            .allow_from
            .iter()
            .flatten()
            .filter_map(|n| n.parse().ok())
            .collect();
        let (open, narrow): (Vec<rigd_web::access::Cidr>, Vec<rigd_web::access::Cidr>) = nets
            .into_iter()
            .partition(|n| n.to_string().ends_with("/0"));
        if !open.is_empty() && !narrow.is_empty() {
            let open: Vec<String> = open.iter().map(ToString::to_string).collect();
            let narrow: Vec<String> = narrow.iter().map(ToString::to_string).collect();
            w.push(format!(
                "web.allow-from: {} admits every address, so the page and the API are open to everyone who can reach {} and the narrower {} restrict nothing; remove {} to keep only those networks",
                open.join(" and "),
                self.bind,
                narrow.join(", "),
                open.join(" and ")
            ));
        }
    }
}
