//! The Pulsar wire format of a frame, as SPEC.md fixes it: key = bucket, event_time = capture ms,
//! stable producer name, and the property set consumers rely on. Pure: no I/O.
//!
//! A rig with a video source keys every message by its **group** instead ([`key`]): the first
//! bucket of the span of `gop` buckets holding the frame, so that a GOP (a keyframe and the
//! frames that need it) is never split across Key_Shared consumers or partitions, and every
//! modality of a group travels together. The exact bucket stays the `bucket` property, the group
//! is the `group` property. Without video a group is one bucket: key = bucket, as before.

use rigd_drivers::Frame;

/// The 33 ms (by default) time bucket a capture time falls in: floor(capture_ms / width_ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket(pub i64);

impl Bucket {
    pub fn of(capture_ns: i64, width_ms: u32) -> Self {
        Bucket(capture_ms(capture_ns).div_euclid(width_ms as i64))
    }
}

/// The message key of a frame captured at `capture_ns`: the first bucket of its group of
/// `group_buckets` buckets (the bucket itself when `group_buckets` is 1).
pub fn key(capture_ns: i64, bucket_ms: u32, group_buckets: u32) -> i64 {
    rigd_drivers::group_start(Bucket::of(capture_ns, bucket_ms).0, group_buckets)
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
    /// The envelope of a frame of a rig without video (key = bucket).
    pub fn of(rig: &str, bucket_ms: u32, frame: &Frame) -> Self {
        Self::grouped(rig, bucket_ms, 1, frame)
    }

    /// The envelope of a frame of a rig whose groups are `group_buckets` buckets wide
    /// (`Config::group_buckets`): key = group; a `group` property when groups are wider than a
    /// bucket.
    pub fn grouped(rig: &str, bucket_ms: u32, group_buckets: u32, frame: &Frame) -> Self {
        let bucket = Bucket::of(frame.capture_ns, bucket_ms);
        let group = rigd_drivers::group_start(bucket.0, group_buckets);
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
        if group_buckets > 1 {
            properties.push(("group".into(), group.to_string()));
        }
        properties.extend(
            frame
                .media
                .fields()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v)),
        );
        Envelope {
            key: group.to_string(),
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
        assert_eq!(get("group"), None, "no group property without video");
    }

    #[test]
    fn a_video_rig_keys_every_frame_by_its_group_and_keeps_the_bucket() {
        let frame = |capture_ns: i64, media: Media| Frame {
            source: "cam".into(),
            seq: 7,
            capture_ns,
            clock: ClockState::Locked,
            media,
            payload: Bytes::from_static(b""),
        };
        let h264 = |keyframe| Media::Camera {
            width: 320,
            height: 240,
            codec: rigd_drivers::Codec::H264,
            keyframe,
        };
        // Bucket 1000 * 30 + 29 (the last of its group of 30) and the next one, at 33 ms.
        let last = frame((30_000 + 29) * 33_000_000, h264(false));
        let e = Envelope::grouped("van-07", 33, 30, &last);
        let get = |e: &Envelope, k: &str| {
            e.properties
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(e.key, "30000");
        assert_eq!(get(&e, "bucket").as_deref(), Some("30029"));
        assert_eq!(get(&e, "group").as_deref(), Some("30000"));
        assert_eq!(get(&e, "codec").as_deref(), Some("h264"));
        assert_eq!(get(&e, "keyframe").as_deref(), Some("false"));
        assert_eq!(get(&e, "content-type").as_deref(), Some("video/h264"));
        let next = frame((30_000 + 30) * 33_000_000, h264(true));
        assert_eq!(Envelope::grouped("van-07", 33, 30, &next).key, "30030");
        // Another modality of the same rig goes under the same group.
        let gps = frame((30_000 + 12) * 33_000_000, Media::Serial { text: true });
        assert_eq!(Envelope::grouped("van-07", 33, 30, &gps).key, "30000");
        assert_eq!(key((30_000 + 12) * 33_000_000, 33, 30), 30_000);
        assert_eq!(key((30_000 + 12) * 33_000_000, 33, 1), 30_012);
        // A JPEG frame says no codec (as before codecs).
        let jpeg = frame(0, Media::jpeg(2, 2));
        assert_eq!(get(&Envelope::of("r", 33, &jpeg), "codec"), None);
        assert_eq!(
            get(&Envelope::of("r", 33, &jpeg), "content-type").as_deref(),
            Some("image/jpeg")
        );
    }
}
