//! The retention of on-request sources. Such a source's lane has no producer, so its frames stay
//! in the spool; [`spawn_retention`] evicts the oldest of them once a second, those captured
//! longer ago than `retain-age` (on the rig's clock, as their capture times) and those beyond
//! `retain-bytes`, each counted (`rigd_retention_evicted_total{source}`) and logged, but never a
//! frame a pending recall request still wants (captured at or after its `from`). A video
//! source's groups of pictures go whole ([`Spool::evict`](crate::spool::Spool::evict)): an
//! eviction ending inside a group takes the rest of it, one stopped by a wanted frame keeps that
//! frame's whole group from its keyframe. The spool's own limits (`max-bytes`, `when-full`) still
//! apply on top.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

use crate::config::{Config, Upload};
use crate::spool::Spool;

/// How often the retention looks.
const EVERY: Duration = Duration::from_secs(1);
/// Evictions of a source are logged at most this often (with the count since).
const LOG_EVERY: Duration = Duration::from_secs(30);

/// One on-request source's retention.
#[derive(Debug, Clone)]
pub struct Retention {
    pub source: Arc<str>,
    pub max_age: Option<Duration>,
    pub max_bytes: Option<u64>,
}

impl Retention {
    /// The retention of every on-request source that has one.
    pub fn of(config: &Config) -> Vec<Retention> {
        config
            .sources
            .iter()
            .filter_map(|s| {
                let head = s.head();
                (head.upload == Upload::OnRequest
                    && (head.retain_age.is_some() || head.retain_bytes.is_some()))
                .then(|| Retention {
                    source: s.id().into(),
                    max_age: head.retain_age.map(|a| a.0),
                    max_bytes: head.retain_bytes.map(|b| b.0),
                })
            })
            .collect()
    }

    /// Frames captured before this (ns on the rig clock) are too old, at `now_ns`.
    fn captured_before(&self, now_ns: i64) -> Option<i64> {
        self.max_age
            .map(|age| now_ns.saturating_sub(age.as_nanos().min(i64::MAX as u128) as i64))
    }
}

/// Runs the retentions until shutdown (nothing when there are none).
pub fn spawn_retention(
    spool: Arc<Spool>,
    retentions: Vec<Retention>,
    now_ns: impl Fn() -> i64 + Send + 'static,
    pinned: impl Fn(&str) -> Option<i64> + Send + 'static,
    mut shutdown: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    if retentions.is_empty() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut logged: Vec<(Instant, u64)> = vec![(Instant::now(), 0); retentions.len()];
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
            }
            let now = now_ns();
            for (r, (at, since)) in retentions.iter().zip(logged.iter_mut()) {
                let (spool, r2) = (spool.clone(), r.clone());
                let keep_from = pinned(&r.source);
                let evicted = tokio::task::spawn_blocking(move || {
                    spool.evict(&r2.source, r2.captured_before(now), r2.max_bytes, keep_from)
                })
                .await;
                match evicted {
                    Ok(Ok(n)) => *since += n,
                    Ok(Err(e)) => {
                        tracing::error!(source = %r.source, error = %e, "retention: cannot evict; the spool's own limits still hold")
                    }
                    Err(e) => {
                        tracing::error!(source = %r.source, error = %e, "retention task failed")
                    }
                }
                if *since > 0 && at.elapsed() >= LOG_EVERY {
                    tracing::info!(source = %r.source, evicted = *since,
                        retain_age_s = r.max_age.map(|a| a.as_secs()), retain_bytes = r.max_bytes,
                        "retention evicted the oldest held frames");
                    (*at, *since) = (Instant::now(), 0);
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_on_request_sources_with_a_retention_have_one() {
        let text = "[rig]\nid = \"a\"\n\
            [[source]]\nid = \"front\"\nkind = \"synthetic-camera\"\nupload = \"on-request\"\nretain-age = \"2h\"\nretain-bytes = \"20GiB\"\n\
            [[source]]\nid = \"rear\"\nkind = \"synthetic-camera\"\nupload = \"on-request\"\n\
            [[source]]\nid = \"gps\"\nkind = \"synthetic-serial\"\n";
        let c = Config::parse(text, "t").unwrap();
        let r = Retention::of(&c);
        assert_eq!(r.len(), 1);
        assert_eq!(&*r[0].source, "front");
        assert_eq!(r[0].max_age, Some(Duration::from_secs(7200)));
        assert_eq!(r[0].max_bytes, Some(20 << 30));
        assert_eq!(
            r[0].captured_before(10_000_000_000_000),
            Some(10_000_000_000_000 - 7_200_000_000_000)
        );
    }
}
