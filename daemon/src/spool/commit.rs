//! The spool's group commit as a task: what makes appended records durable, and what `always`
//! mode waits for before it publishes them.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

use super::Spool;

/// How often a rig with nothing else to commit makes its sequence notes durable.
const NOTES_EVERY: Duration = Duration::from_secs(1);

/// Commits the spool every `fsync-ms` while it has anything to make durable
/// ([`Spool::commit_due`]), until `shutdown`, refreshing free space once a second. The blocking
/// work runs off the runtime's workers.
pub async fn commit_loop(spool: Arc<Spool>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_free = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let refresh = last_free.elapsed() > Duration::from_secs(1);
        let due = spool.commit_due(NOTES_EVERY);
        if !refresh && !due {
            continue;
        }
        let s = spool.clone();
        if refresh {
            last_free = Instant::now();
        }
        let r = tokio::task::spawn_blocking(move || {
            if refresh {
                s.refresh_free_space();
            }
            if due {
                s.commit()
            } else {
                Ok(())
            }
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::error!(error = %e, "spool commit failed");
        }
    }
}
