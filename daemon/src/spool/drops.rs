//! Frames the spool loses, counted and logged in one place (as Vector's `BufferEventsDropped`
//! emits both): every lost frame bumps its source's `dropped` (status, `/metrics`, the UI's alert)
//! and is reported by one ERROR line per source at most every 10 s, with the count since the last
//! line and the latest reason.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::SourceSpoolStats;

/// How often a source's losses are logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Why a frame was lost.
#[derive(Debug)]
pub enum Loss {
    /// `when-full = drop-newest` and the spool is full.
    Newest,
    /// `when-full = drop-oldest`: its segment was the oldest when room was needed.
    Oldest,
    /// `when-full = drop-oldest` with only the segment being written left: this frame instead.
    NoRoom,
    /// Its number is at or past the durable sequence floor, which could not be moved.
    Floor,
    /// The write failed.
    WriteFailed(String),
}

impl Loss {
    pub(super) fn why(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Loss::Newest => "spool full: dropped the newest frame (when-full = drop-newest)".into(),
            Loss::Oldest => "spool full: dropped the oldest frames (when-full = drop-oldest)".into(),
            Loss::NoRoom => {
                "spool full: nothing older left to drop, this frame dropped (when-full = drop-oldest)"
                    .into()
            }
            Loss::Floor => {
                "spool: the sequence floor (SEQ) cannot be moved past this frame's number; frame dropped"
                    .into()
            }
            Loss::WriteFailed(e) => format!("spool write failed: {e}").into(),
        }
    }
}

/// Per source: when its losses were last logged and how many since.
#[derive(Debug, Default)]
pub(super) struct Drops {
    logged: Mutex<HashMap<Arc<str>, (Instant, u64)>>,
}

impl Drops {
    /// One frame of `source` lost for `loss`.
    pub(super) fn emit(&self, source: &Arc<str>, stats: &SourceSpoolStats, loss: Loss) {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        match logged.get_mut(source) {
            Some((at, pending)) if now.duration_since(*at) < LOG_EVERY => *pending += 1,
            Some((at, pending)) => {
                tracing::error!(source = %source, dropped = *pending + 1, "{}", loss.why());
                (*at, *pending) = (now, 0);
            }
            None => {
                tracing::error!(source = %source, dropped = 1, "{}", loss.why());
                logged.insert(source.clone(), (now, 0));
            }
        }
    }
}
