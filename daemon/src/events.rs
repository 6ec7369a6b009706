//! Technician event markers: frames of an internal source, [`EVENTS_SOURCE`], through a lane of
//! their own: they get sequence numbers, are spooled during an outage and published on the
//! `{rig}-events` topic like any other source, keyed by the bucket of the moment they were marked.

use bytes::Bytes;
use rigd_drivers::{FrameClock, FrameSink, Media, SourceHealth};
use rigd_web::{ControlError, EventMarked};
use std::sync::{Arc, Mutex};

pub use crate::config::EVENTS_SOURCE;
use crate::pipeline::LaneStats;
use crate::wire::Bucket;

/// Makes event marker frames.
pub struct EventMarker {
    /// `None` once the daemon shuts down: dropping the sink ends the events lane.
    sink: Mutex<Option<FrameSink>>,
    clock: Arc<dyn FrameClock>,
    bucket_ms: u32,
    rig: String,
    /// Where markers are published (absent without a broker).
    pub topic: Option<String>,
    /// The events lane's counters (its preview keeps the last markers).
    pub lane: Arc<LaneStats>,
    health: Arc<SourceHealth>,
}

impl EventMarker {
    pub fn new(
        sink: FrameSink,
        clock: Arc<dyn FrameClock>,
        bucket_ms: u32,
        rig: String,
        topic: Option<String>,
        lane: Arc<LaneStats>,
    ) -> Self {
        Self {
            health: sink.health().clone(),
            sink: Mutex::new(Some(sink)),
            clock,
            bucket_ms,
            rig,
            topic,
            lane,
        }
    }

    /// Markers made since start.
    pub fn marked(&self) -> u64 {
        self.health.frames()
    }

    /// Emits one marker stamped now. Blocks while the events lane applies backpressure.
    pub fn mark(&self, note: &str) -> Result<EventMarked, ControlError> {
        let mut guard = self
            .sink
            .lock()
            .map_err(|_| ControlError::Failed("event marker unavailable".into()))?;
        let sink = guard
            .as_mut()
            .ok_or_else(|| ControlError::Unavailable("rigd is shutting down".into()))?;
        let stamp = self.clock.now();
        let bucket = Bucket::of(stamp.ns, self.bucket_ms).0;
        let payload = serde_json::json!({
            "event": note,
            "bucket": bucket,
            "capture_ns": stamp.ns,
            "clock": stamp.state.as_str(),
            "rig": self.rig,
        });
        let seq = sink.next_seq();
        sink.emit(
            stamp,
            Media::Serial { text: true },
            Bytes::from(payload.to_string()),
        )
        .map_err(|_| ControlError::Unavailable("rigd is shutting down".into()))?;
        Ok(EventMarked {
            seq,
            capture_ns: stamp.ns,
            bucket,
            note: note.to_string(),
            topic: self.topic.clone(),
            // Asked for by the caller, once the marker is made (crate::control).
            upload_request: None,
        })
    }

    /// Stops taking markers; the events lane then drains and ends like the others.
    pub fn close(&self) {
        if let Ok(mut s) = self.sink.lock() {
            s.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigd_drivers::SystemClock;
    use tokio::sync::mpsc;

    #[test]
    fn a_marker_is_a_json_frame_keyed_by_the_current_bucket() {
        let (tx, mut rx) = mpsc::channel(4);
        let sink = FrameSink::new(
            Arc::from(EVENTS_SOURCE),
            41,
            tx,
            Arc::new(SourceHealth::default()),
        );
        let m = EventMarker::new(
            sink,
            Arc::new(SystemClock),
            33,
            "van-07".into(),
            None,
            Arc::new(LaneStats::default()),
        );
        let marked = m.mark("pothole").unwrap();
        assert_eq!(marked.seq, 41);
        assert_eq!(marked.bucket, marked.capture_ns.div_euclid(33_000_000));
        let f = rx.try_recv().unwrap();
        assert_eq!((f.seq, &*f.source), (41, EVENTS_SOURCE));
        assert_eq!(f.media, Media::Serial { text: true });
        let v: serde_json::Value = serde_json::from_slice(&f.payload).unwrap();
        assert_eq!(v["event"], "pothole");
        assert_eq!(v["bucket"], marked.bucket);
        assert_eq!(v["rig"], "van-07");
        assert_eq!(m.marked(), 1);
        m.close();
        assert!(matches!(m.mark("late"), Err(ControlError::Unavailable(_))));
        assert_eq!(m.marked(), 1);
    }
}
