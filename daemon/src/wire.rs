//! The Pulsar wire format of a frame, as SPEC.md fixes it: key = bucket, event_time = capture ms,
//! stable producer name, and the property set consumers rely on. Pure: no I/O.

use rigd_drivers::Frame;

/// The 33 ms (by default) time bucket a capture time falls in: floor(capture_ms / width_ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket(pub i64);

impl Bucket {
    pub fn of(capture_ns: i64, width_ms: u32) -> Self {
        Bucket(capture_ms(capture_ns).div_euclid(width_ms as i64))
    }
}

/// Capture time in whole milliseconds (floor), the message's event_time.
pub fn capture_ms(capture_ns: i64) -> i64 {
    capture_ns.div_euclid(1_000_000)
}

/// `rigd-{rig}-{source}`: stable across restarts, so broker deduplication follows the source.
pub fn producer_name(rig: &str, source: &str) -> String {
    format!("rigd-{rig}-{source}")
}

/// The producer name a recall request `id` sends a source's frames under (`crate::recall`): its
/// own, so the broker's deduplication of each name stays exact.
pub fn recall_producer_name(rig: &str, source: &str, id: &str) -> String {
    format!("rigd-{rig}-{source}-recall-{id}")
}

/// The producer name of a source's epoch starting at capture sequence `start` (see
/// `spool::epochs`): the stable name for the first epoch, `rigd-{rig}-{source}-e{start}` after a
/// live-first split. Names need only be unique within the source's topic.
pub fn epoch_producer_name(rig: &str, source: &str, start: u64) -> String {
    match start {
        0 => producer_name(rig, source),
        s => format!("rigd-{rig}-{source}-e{s}"),
    }
}

/// The default topic template (`pulsar.topic`, and `--topic` of the offline tools).
pub const DEFAULT_TOPIC: &str = "persistent://public/default/{rig}-{source}";

/// The placeholders of a topic template.
pub const TOPIC_PLACEHOLDERS: [&str; 3] = ["rig", "source", "modality"];

/// A source's topic: the template with its placeholders `{rig}`, `{source}` and `{modality}`
/// (`camera`, `audio` or `serial`: one topic per modality, which every rig may share) filled in.
pub fn topic(template: &str, rig: &str, source: &str, modality: &str) -> String {
    template
        .replace("{rig}", rig)
        .replace("{source}", source)
        .replace("{modality}", modality)
}

/// What goes into a message's metadata besides the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub key: String,
    pub event_time_ms: u64,
    pub properties: Vec<(String, String)>,
}

impl Envelope {
    pub fn of(rig: &str, bucket_ms: u32, frame: &Frame) -> Self {
        let bucket = Bucket::of(frame.capture_ns, bucket_ms);
        let mut properties: Vec<(String, String)> = vec![
            ("rig".into(), rig.to_string()),
            ("source".into(), frame.source.to_string()),
            ("modality".into(), frame.modality().as_str().to_string()),
            ("seq".into(), frame.seq.to_string()),
            ("capture-ns".into(), frame.capture_ns.to_string()),
            ("bucket".into(), bucket.0.to_string()),
            ("bucket-ms".into(), bucket_ms.to_string()),
            ("clock".into(), frame.clock.as_str().to_string()),
            ("content-type".into(), frame.media.content_type()),
        ];
        properties.extend(
            frame
                .media
                .fields()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v)),
        );
        Envelope {
            key: bucket.0.to_string(),
            event_time_ms: capture_ms(frame.capture_ns).max(0) as u64,
            properties,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use rigd_drivers::{ClockState, Media};

    #[test]
    fn bucket_is_floor_of_ms_over_width() {
        assert_eq!(Bucket::of(0, 33), Bucket(0));
        assert_eq!(Bucket::of(32_999_999, 33), Bucket(0));
        assert_eq!(Bucket::of(33_000_000, 33), Bucket(1));
        assert_eq!(
            Bucket::of(1_700_000_000_123_456_789, 33),
            Bucket(1_700_000_000_123 / 33)
        );
        assert_eq!(Bucket::of(-1, 33), Bucket(-1));
    }

    #[test]
    fn envelope_carries_the_spec_properties() {
        let f = Frame {
            source: "mic".into(),
            seq: 42,
            capture_ns: 1_700_000_000_033_000_001,
            clock: ClockState::Locked,
            media: Media::Audio {
                sample_rate: 48_000,
                channels: 2,
                frames: 1584,
            },
            payload: Bytes::from_static(b""),
        };
        let e = Envelope::of("van-07", 33, &f);
        assert_eq!(e.event_time_ms, 1_700_000_000_033);
        assert_eq!(e.key, (1_700_000_000_033i64 / 33).to_string());
        let get = |k: &str| {
            e.properties
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("seq"), Some("42"));
        assert_eq!(get("clock"), Some("locked"));
        assert_eq!(get("modality"), Some("audio"));
        assert_eq!(get("content-type"), Some("audio/L16;rate=48000;channels=2"));
        assert_eq!(get("frames"), Some("1584"));
        assert_eq!(get("bucket"), Some(e.key.as_str()));
        assert_eq!(producer_name("van-07", "mic"), "rigd-van-07-mic");
    }
}
