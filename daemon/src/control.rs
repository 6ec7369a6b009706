//! What a technician may ask of the running daemon through the web UI ([`rigd_web::Control`]):
//! pause and resume publishing, mark an event ([`crate::events`]) and ask recall for the window
//! around it ([`crate::recall`]), drop a source's spool.

use rigd_web::{ControlError, EventMarked, UploadWindow};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::events::EVENTS_SOURCE;
use crate::recall::protocol::Upload;
use crate::runtime::Runtime;

impl rigd_web::Control for Runtime {
    fn set_uplink_paused(&self, paused: bool) {
        self.uplink_paused.store(paused, Ordering::Relaxed);
    }

    fn mark_event(
        &self,
        note: &str,
        upload: Option<UploadWindow>,
    ) -> Result<EventMarked, ControlError> {
        // Judged before marking: a technician who asked for an upload that cannot happen is
        // told so and marks again without it, rather than finding a marker that did half.
        let recall = match upload {
            Some(_) => Some(
                self.recall
                    .as_ref()
                    .ok_or_else(|| ControlError::Conflict(self.recall_not_running()))?,
            ),
            None => None,
        };
        let mut marked = self.events.mark(note)?;
        let (Some(window), Some(recall)) = (upload, recall) else {
            return Ok(marked);
        };
        let u = marker_upload(&marked, window, &recall.sources);
        let (id, from, to) = (u.id.clone(), u.from, u.to);
        if let Err(why) = recall.ask(u) {
            tracing::warn!(request = %id, seq = marked.seq, error = %why, "recall: a marker's upload was not queued");
            return Err(ControlError::Unavailable(format!(
                "the event was marked (seq {}, capture_ns {}) but its upload was not queued: {why}",
                marked.seq, marked.capture_ns
            )));
        }
        tracing::info!(request = %id, from, to, "recall: a marker asked for an upload");
        marked.upload_request = Some(id);
        Ok(marked)
    }

    fn clear_spool(&self, source: &str) -> Result<u64, ControlError> {
        let id = self
            .sources
            .iter()
            .map(|e| &e.id)
            .find(|id| &***id == source)
            .cloned()
            .or_else(|| (source == EVENTS_SOURCE).then(|| Arc::from(EVENTS_SOURCE)))
            .ok_or_else(|| ControlError::UnknownSource(source.to_string()))?;
        self.spool
            .clear_source(&id)
            .map_err(|e| ControlError::Failed(format!("clearing the spool of {source}: {e}")))
    }
}

impl Runtime {
    /// Why there is no recall to ask (what `crate::app` starts it on).
    fn recall_not_running(&self) -> String {
        if self.config.pulsar.url.is_none() {
            "recall is not running: no broker is configured ([pulsar] url), nothing can be uploaded"
                .to_string()
        } else {
            "recall is not running: no source has upload = \"on-request\" (live sources publish every frame already)"
                .to_string()
        }
    }
}

/// The upload a marker asks for: every on-request source over the window around the marker's
/// capture time, under an id of its own (`marker-{seq}`; the events lane's seqs are never
/// reused, so neither are the ids, nor the producer names derived from them).
fn marker_upload(marked: &EventMarked, window: UploadWindow, sources: &[(String, bool)]) -> Upload {
    let (from, to) = window.range(marked.capture_ns);
    Upload {
        id: format!("marker-{}", marked.seq),
        sources: sources
            .iter()
            .filter(|(_, on_request)| *on_request)
            .map(|(id, _)| id.clone())
            .collect(),
        from,
        to,
        force: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_asks_for_its_window_of_every_on_request_source() {
        let marked = EventMarked {
            seq: u64::MAX,
            capture_ns: 1_000_000_000_000,
            ..Default::default()
        };
        let sources = [
            ("front".to_string(), true),
            ("gps".to_string(), false),
            ("rear".to_string(), true),
        ];
        let u = marker_upload(
            &marked,
            UploadWindow {
                before_s: 30.0,
                after_s: 10.0,
            },
            &sources,
        );
        assert_eq!(u.id, format!("marker-{}", u64::MAX));
        assert_eq!(crate::recall::protocol::valid_id(&u.id), Ok(()));
        assert_eq!(u.sources, ["front", "rear"]);
        assert_eq!((u.from, u.to), (970_000_000_000, 1_010_000_000_000));
        assert!(!u.force);
    }

    #[test]
    fn events_is_a_reserved_source_id() {
        let e = crate::config::Config::parse(
            "[rig]\nid = \"r\"\n[[source]]\nid = \"events\"\nkind = \"synthetic-serial\"\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("source[0].id") && e.contains("reserved"), "{e}");
    }
}
