//! Process lifecycle: which signals stop the daemon, and the heartbeats its watchdog reads.

/// Resolves on SIGTERM or SIGINT.
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stopping");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
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
