//! Process lifecycle: which signals stop the daemon, what SIGHUP reloads, and the heartbeats its
//! watchdog reads.

use std::path::PathBuf;

/// What SIGHUP re-reads while the daemon runs. Only what is read on use can change: the web
/// control token. The config file is not re-read (sources, spool, uplink and web bind are wired
/// at start), and the log filter comes from `RIGD_LOG` in the environment, which a running process
/// cannot see change: those need a restart.
#[derive(Debug)]
pub struct Reload {
    /// `[web].token-file`.
    pub web_token_file: Option<PathBuf>,
    /// The token the web UI checks control actions against.
    pub web_token: rigd_web::ControlToken,
}

impl Reload {
    /// Re-reads what can change and logs what it did and what needs a restart.
    pub fn apply(&self) {
        let web = match &self.web_token_file {
            None => "web token-file (none configured: control actions stay disabled)".to_string(),
            // The rule of the start: a missing or empty token file disables control actions.
            Some(path) => match crate::config::read_token(path) {
                // The rule of `check` and the start: a short token is guessed, so it enables nothing.
                Ok(token) if token.chars().count() < crate::config::MIN_TOKEN_CHARS => {
                    self.web_token.set(None);
                    tracing::warn!(file = %path.display(), chars = token.chars().count(),
                        "SIGHUP: web control actions disabled: the new token is shorter than {} characters (make one with `openssl rand -hex 24`)",
                        crate::config::MIN_TOKEN_CHARS);
                    "web token-file (control actions disabled: token too short)".to_string()
                }
                Ok(token) => {
                    self.web_token.set(Some(token));
                    "web token-file (control actions enabled)".to_string()
                }
                Err(e) => {
                    self.web_token.set(None);
                    tracing::warn!(error = %e, "SIGHUP: web control actions disabled");
                    "web token-file (control actions disabled)".to_string()
                }
            },
        };
        tracing::info!("SIGHUP: reloaded {web}; the config file and RIGD_LOG need a restart");
    }
}

/// Makes SIGHUP harmless from now on (its default action ends the process), before the daemon
/// reaches [`wait_for_signal`]: a SIGHUP during startup is ignored instead of killing it. Needs a
/// tokio runtime.
pub fn catch_hangup() {
    use tokio::signal::unix::{signal, SignalKind};
    // The handler stays installed for the life of the process once registered.
    if let Err(e) = signal(SignalKind::hangup()) {
        tracing::warn!(error = %e, "cannot install the SIGHUP handler; SIGHUP will stop the daemon");
    }
}

/// Resolves on SIGTERM or SIGINT; SIGHUP meanwhile applies `reload` and goes on waiting.
pub async fn wait_for_signal(reload: &Reload) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stopping");
        return;
    };
    let mut hup = signal(SignalKind::hangup())
        .map_err(|e| tracing::warn!(error = %e, "cannot install the SIGHUP handler"))
        .ok();
    loop {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM received");
                return;
            }
            _ = int.recv() => {
                tracing::info!("SIGINT received");
                return;
            }
            Some(()) = async { match &mut hup { Some(h) => h.recv().await, None => None } } => {
                reload.apply();
            }
        }
    }
}

/// A task's last sign of progress, read by the watchdog (see [`crate::notify`]): milliseconds on a
/// process-wide monotonic clock. A new heartbeat counts as beaten now.
#[derive(Debug)]
pub struct Heartbeat(std::sync::atomic::AtomicU64);

/// The monotonic origin all heartbeats count from.
fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self(std::sync::atomic::AtomicU64::new(now_ms()))
    }
}

impl Heartbeat {
    /// Records progress now.
    pub fn beat(&self) {
        self.0.store(now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Time since the last beat.
    pub fn age(&self) -> std::time::Duration {
        let last = self.0.load(std::sync::atomic::Ordering::Relaxed);
        std::time::Duration::from_millis(now_ms().saturating_sub(last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_token_on_sighup_disables_control_actions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.token");
        let reload = Reload {
            web_token_file: Some(path.clone()),
            web_token: rigd_web::ControlToken::new(None),
        };
        std::fs::write(&path, "a-good-token-of-24-chars\n").unwrap();
        reload.apply();
        assert!(reload.web_token.enabled());
        std::fs::write(&path, "short\n").unwrap();
        reload.apply();
        assert!(
            !reload.web_token.enabled(),
            "a 5-character token enabled control actions"
        );
    }
}
