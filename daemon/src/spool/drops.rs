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
    /// `when-full = drop-oldest`, but dropping every sealed segment would still leave no room
    /// (the filesystem is filled by other files): the held records are kept, this frame goes.
    NotEnough,
    /// `when-full = drop-oldest` while the index on disk cannot be opened: the held records are
    /// kept (this run's temporary index cannot record their deletion), this frame goes.
    IndexAway,
    /// Its number is at or past the durable sequence floor, which could not be moved.
    Floor,
    /// The write failed.
    WriteFailed(String),
    /// A technician cleared the source's spool (web UI).
    Cleared,
    /// The final commit failed: the frame was still in the write buffer and never reached the
    /// disk.
    Unwritten,
    /// A delta (an H.264 P-frame) whose group lost a frame before it: no consumer could decode
    /// it, so the lane skipped it up to the next keyframe (issue 48.4).
    GroupBroken,
}

/// Why a record already stored left the index unsent ([`super::counts::Gone::Dropped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dropped {
    /// `when-full = drop-oldest` made room with its segment.
    Oldest,
    /// A technician's clear.
    Cleared,
    /// The final commit could not write it.
    Unwritten,
}

impl From<Dropped> for Loss {
    fn from(d: Dropped) -> Loss {
        match d {
            Dropped::Oldest => Loss::Oldest,
            Dropped::Cleared => Loss::Cleared,
            Dropped::Unwritten => Loss::Unwritten,
        }
    }
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
            Loss::NotEnough => {
                "spool full: dropping every record held would still leave no room (the filesystem is filled by other files); held records kept, this frame dropped (when-full = drop-oldest)"
                    .into()
            }
            Loss::IndexAway => {
                "spool full: held records are kept while the index cannot be opened (no space); this frame dropped (when-full = drop-oldest)"
                    .into()
            }
            Loss::Floor => {
                "spool: the sequence floor (SEQ) cannot be moved past this frame's number; frame dropped"
                    .into()
            }
            Loss::WriteFailed(e) => format!("spool write failed: {e}").into(),
            Loss::Cleared => "spool: records cleared by a technician (clear action)".into(),
            Loss::Unwritten => {
                "spool: the final commit failed; frames still in the write buffer never reached the disk"
                    .into()
            }
            Loss::GroupBroken => {
                "video: a frame of the group was lost, its later frames skipped up to the next keyframe (they would not decode)"
                    .into()
            }
        }
    }

    /// Lost to a fault or a full spool (ERROR), or by a technician's choice (WARN).
    fn unwanted(&self) -> bool {
        !matches!(self, Loss::Cleared)
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
        let dropped = match logged.get_mut(source) {
            Some((at, pending)) if now.duration_since(*at) < LOG_EVERY => {
                *pending += 1;
                return;
            }
            Some((at, pending)) => {
                let n = *pending + 1;
                (*at, *pending) = (now, 0);
                n
            }
            None => {
                logged.insert(source.clone(), (now, 0));
                1
            }
        };
        if loss.unwanted() {
            tracing::error!(source = %source, dropped, "{}", loss.why());
        } else {
            tracing::warn!(source = %source, dropped, "{}", loss.why());
        }
    }
}
