//! What a technician may ask of the running daemon through the web UI ([`rigd_web::Control`]):
//! pause and resume publishing, mark an event ([`crate::events`]), drop a source's spool.

use rigd_web::{ControlError, EventMarked};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::events::EVENTS_SOURCE;
use crate::runtime::Runtime;

impl rigd_web::Control for Runtime {
    fn set_uplink_paused(&self, paused: bool) {
        self.uplink_paused.store(paused, Ordering::Relaxed);
    }

    fn mark_event(&self, note: &str) -> Result<EventMarked, ControlError> {
        self.events.mark(note)
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

#[cfg(test)]
mod tests {
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
