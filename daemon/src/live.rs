//! The live view's daemon side (the protocol itself is `rigd_web::live`): which Foxglove channels
//! each source offers, the tap on each lane that hands frames over only while a client subscribes
//! to one of them and encodes them there with Foxglove's schemas ([`crate::foxglove`], shared
//! with the MCAP export).
//!
//! Channels: a camera `foxglove.CompressedImage` on `/{source}`, audio `foxglove.RawAudio` on
//! `/{source}`, serial `foxglove.Log` on `/{source}` and, for NMEA sources (synthetic serial,
//! `framing = "nmea"` or `"line"`), `foxglove.LocationFix` on `/{source}/fix`. Last, `/events`
//! (`foxglove.Log`), the channel `rigd live` makes of the rig's events topic: the technician's
//! markers (the events lane's frames, through its tap like any source's) and the daemon's alerts
//! (the status page's, [`rigd_web::alerts`]) as they appear and clear ([`spawn_alerts`]).
//! A CAN source: `rigd.CanFrame` on `/{source}`, one message per frame at its own time, and with
//! a `dbc` a channel per DBC message, `/{source}/{Message}`, its signals as doubles for the Plot
//! panel ([`crate::foxglove::can`], as in the MCAP export).
//!
//! A camera with a proxy (`proxy = {...}`, its `{id}-proxy` source) has its own channel
//! `/{id}` on demand: a client sees `/{id}-proxy` and, only when it connected with `?full=1`,
//! the full resolution as well (`rigd_web::live::LiveHub::set_on_demand`, docs/LIVE.md).
//!
//! What the lane pays: with no client subscribed, one atomic load per frame (no clone, no encode);
//! with one, the frame's encoding (a copy of its payload into the message, once for every client)
//! and a push onto each subscribed client's queue, none of which waits. Encoding in the lane, not
//! on a task of its own, saves a task wake-up per frame: on a small board that wake-up cost more
//! than the copy (docs/PERFORMANCE.md "Live view cost").

use base64::Engine as _;
use bytes::Bytes;
use rigd_drivers::{Frame, Media};
use rigd_web::live::{Channel, ChannelHandle, Class, LiveHub, Picture};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::watch;

use crate::config::{Config, Modality, SourceConfig, EVENTS_SOURCE};
use crate::foxglove::{self, location_fix, protobuf_message, schema_name};
use crate::nmea::{self, FixBuilder, Sentence};

/// The channels of one source.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceChannels {
    pub source: Arc<str>,
    /// `/{source}`.
    pub main: u32,
    /// `/{source}/fix` (NMEA sources).
    pub fix: Option<u32>,
    /// A CAN source with a DBC: its messages' channels.
    pub can: Option<CanChannels>,
    /// A camera with a proxy: its full resolution is on demand (`?full=1`), its proxy's channel
    /// is what a viewer sees (docs/LIVE.md "Proxies first").
    pub on_demand: bool,
}

/// A CAN source's decoded channels: DBC message `i` on channel `first + i`.
#[derive(Debug, Clone)]
pub struct CanChannels {
    pub dbc: Arc<crate::can::Dbc>,
    pub first: u32,
}

impl PartialEq for CanChannels {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.dbc, &other.dbc) && self.first == other.first
    }
}

/// The channels of a CAN source's DBC messages, `/{source}/{Message}`, numbered from `first`.
pub fn can_channels(
    source: &str,
    dbc: Arc<crate::can::Dbc>,
    first: u32,
) -> (Vec<Channel>, CanChannels) {
    use crate::foxglove::can::{signals_descriptor_set, signals_schema_name};
    let channels = dbc
        .messages()
        .iter()
        .enumerate()
        .map(|(i, m)| Channel {
            id: first + i as u32,
            topic: format!("/{source}/{}", m.name),
            source: source.to_string(),
            class: Class::Serial,
            schema_name: signals_schema_name(m),
            schema: base64::engine::general_purpose::STANDARD.encode(signals_descriptor_set(m)),
        })
        .collect();
    (channels, CanChannels { dbc, first })
}

/// How often the alerts are looked at while a client subscribes to `/events`.
const ALERT_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Every source's channels (ids from 1, in config order), then the events lane's `/events`, for
/// the hub and for the taps.
pub fn channels(config: &Config) -> (Vec<Channel>, Vec<SourceChannels>) {
    let mut all = Vec::new();
    let mut per_source = Vec::new();
    let sources = config
        .sources
        .iter()
        .map(|sc| {
            let video = sc.gop(config.rig.bucket_ms).is_some();
            // Checked by the config's own check: a DBC that no longer loads has no channels.
            let dbc = sc
                .dbc()
                .and_then(|p| crate::can::Dbc::load(p).ok())
                .map(Arc::new);
            let proxied = config.sources.iter().any(|o| o.proxy_of() == Some(sc.id()));
            (sc.id(), sc.modality(), speaks_nmea(sc), video, dbc, proxied)
        })
        .chain([(EVENTS_SOURCE, Modality::Serial, false, false, None, false)]);
    for (id, modality, nmea, video, dbc, proxied) in sources {
        let (channels, mut source) =
            source_channels(id, modality, nmea, video, all.len() as u32 + 1);
        source.on_demand = proxied;
        all.extend(channels);
        if let Some(dbc) = dbc {
            let (channels, can) = can_channels(id, dbc, all.len() as u32 + 1);
            all.extend(channels);
            source.can = Some(can);
        }
        per_source.push(source);
    }
    (all, per_source)
}

/// What to say on `/events` about the alerts now, given those already said: each alert whose
/// subject and level are new (error ERROR, warn WARNING, else INFO), and for a subject that has no
/// alert any more, INFO `cleared`. Pure.
pub fn alert_changes(said: &[rigd_web::Alert], now: &[rigd_web::Alert]) -> Vec<(i32, String)> {
    let level = |a: &rigd_web::Alert| match a.level {
        "error" => foxglove::LOG_ERROR,
        "warn" => foxglove::LOG_WARNING,
        _ => foxglove::LOG_INFO,
    };
    let mut out: Vec<(i32, String)> = now
        .iter()
        .filter(|a| {
            !said
                .iter()
                .any(|b| b.subject == a.subject && b.level == a.level)
        })
        .map(|a| (level(a), format!("{}: {}", a.subject, a.text)))
        .collect();
    let mut cleared: Vec<&str> = Vec::new();
    for b in said {
        if !now.iter().any(|a| a.subject == b.subject) && !cleared.contains(&b.subject.as_str()) {
            cleared.push(&b.subject);
            out.push((
                foxglove::LOG_INFO,
                format!("{}: cleared ({})", b.subject, b.text),
            ));
        }
    }
    out
}

/// The daemon's alerts on `/events` (channel `channel`), as `foxglove.Log` named `alert`: looked
/// at every [`ALERT_POLL`] while a client subscribes, and only then (the status is not built for
/// nobody). A client subscribing first gets the alerts standing then, every client the changes.
pub fn spawn_alerts(
    hub: Arc<LiveHub>,
    channel: u32,
    status: Arc<dyn rigd_web::StatusSource>,
    now: rigd_web::live::Now,
    mut shutdown: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let handle = hub.handle(channel)?;
    Some(tokio::spawn(async move {
        let mut said: Vec<rigd_web::Alert> = Vec::new();
        let mut tick = tokio::time::interval(ALERT_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buf = Vec::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|down| *down) => return,
            }
            if !handle.wanted() {
                said.clear();
                continue;
            }
            let current = rigd_web::alerts(&status.status());
            let ns = now();
            for (level, text) in alert_changes(&said, &current) {
                foxglove::log_line(ns, level, "alert", &text, &mut buf);
                hub.publish(&handle, ns, Bytes::copy_from_slice(&buf));
            }
            said = current;
        }
    }))
}

/// The channels of one source, numbered from `first`: `/{source}` with the modality's schema
/// (`video`: a camera of H.264 frames, `foxglove.CompressedVideo`), and for an NMEA source
/// `/{source}/fix`.
pub fn source_channels(
    source: &str,
    modality: Modality,
    nmea: bool,
    video: bool,
    first: u32,
) -> (Vec<Channel>, SourceChannels) {
    let schema = |name: &str| {
        base64::engine::general_purpose::STANDARD
            .encode(foxglove::file_descriptor_set(name).unwrap_or_default())
    };
    let (class, media) = match modality {
        Modality::Camera if video => (
            Class::Camera,
            Media::Camera {
                width: 0,
                height: 0,
                codec: rigd_drivers::Codec::H264,
                keyframe: true,
            },
        ),
        Modality::Camera => (Class::Camera, Media::jpeg(0, 0)),
        Modality::Audio => (
            Class::Audio,
            Media::Audio {
                sample_rate: 0,
                channels: 0,
                frames: 0,
            },
        ),
        Modality::Serial => (Class::Serial, Media::Serial { text: true }),
        Modality::Can => (Class::Serial, Media::Can { frames: 0 }),
    };
    let name = schema_name(&media);
    let mut all = vec![Channel {
        id: first,
        topic: format!("/{source}"),
        source: source.to_string(),
        class,
        schema_name: name.to_string(),
        schema: schema(name),
    }];
    let fix = (nmea && modality == Modality::Serial).then(|| {
        all.push(Channel {
            id: first + 1,
            topic: format!("/{source}/fix"),
            source: source.to_string(),
            class,
            schema_name: foxglove::LOCATION_FIX.to_string(),
            schema: schema(foxglove::LOCATION_FIX),
        });
        first + 1
    });
    (
        all,
        SourceChannels {
            source: source.into(),
            main: first,
            fix,
            can: None,
            on_demand: false,
        },
    )
}

/// Whether a source's records are NMEA sentences worth a `/fix` channel.
fn speaks_nmea(sc: &SourceConfig) -> bool {
    match &sc.kind {
        crate::config::SourceKind::SyntheticSerial(_) => true,
        crate::config::SourceKind::Serial(c) => {
            !matches!(c.framing, rigd_drivers::serial::Framing::Raw)
        }
        _ => false,
    }
}

/// A lane's tap: unconnected (no live view) it does nothing.
#[derive(Debug, Default)]
pub struct Tap(OnceLock<TapLink>);

#[derive(Debug)]
struct TapLink {
    main: ChannelHandle,
    fix: Option<ChannelHandle>,
    can: Vec<ChannelHandle>,
    /// Only the source's lane encodes: the lock is never contended.
    encoder: Mutex<Encoder>,
}

impl Tap {
    /// Looks at a frame on its way through the lane: encoded and handed to the clients only
    /// while one subscribes to one of the source's channels. Never waits for a client.
    pub fn offer(&self, frame: &Frame) {
        let Some(link) = self.0.get() else {
            return;
        };
        let wanted = link.main.wanted()
            || link.fix.as_ref().is_some_and(ChannelHandle::wanted)
            || link.can.iter().any(ChannelHandle::wanted);
        if !wanted {
            return;
        }
        link.encoder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .encode(frame);
    }
}

/// Connects `tap` to the hub; false (and nothing happens) for channels the hub does not have.
pub fn connect(tap: &Tap, hub: Arc<LiveHub>, channels: SourceChannels) -> bool {
    if channels.on_demand {
        hub.set_on_demand(channels.main);
    }
    let Some(encoder) = Encoder::new(hub, &channels) else {
        return false;
    };
    let _ = tap.0.set(TapLink {
        main: encoder.main.clone(),
        fix: encoder.fix.clone(),
        can: encoder.can.iter().map(|(h, _)| h.clone()).collect(),
        encoder: Mutex::new(encoder),
    });
    true
}

/// Encodes one source's frames for the clients subscribed now.
#[derive(Debug)]
pub struct Encoder {
    hub: Arc<LiveHub>,
    source: Arc<str>,
    main: ChannelHandle,
    fix: Option<ChannelHandle>,
    fixes: FixBuilder,
    /// A CAN source's decoded channels (by DBC message index) and the DBC.
    can: Vec<(ChannelHandle, usize)>,
    dbc: Option<Arc<crate::can::Dbc>>,
}

impl Encoder {
    /// The encoder of a source whose channels the hub has.
    pub fn new(hub: Arc<LiveHub>, channels: &SourceChannels) -> Option<Self> {
        Some(Self {
            main: hub.handle(channels.main)?,
            fix: match channels.fix {
                Some(id) => Some(hub.handle(id)?),
                None => None,
            },
            can: match &channels.can {
                Some(c) => (0..c.dbc.messages().len())
                    .map(|i| Some((hub.handle(c.first + i as u32)?, i)))
                    .collect::<Option<Vec<_>>>()?,
                None => Vec::new(),
            },
            dbc: channels.can.as_ref().map(|c| c.dbc.clone()),
            source: channels.source.clone(),
            hub,
            fixes: FixBuilder::default(),
        })
    }

    /// Encodes `frame` for the channels someone subscribes to now, and hands it to the hub.
    pub fn encode(&mut self, frame: &Frame) {
        if let Media::Can { .. } = frame.media {
            return self.encode_can(frame);
        }
        let main = self.main.wanted();
        let fix = self.fix.as_ref().filter(|f| f.wanted());
        let sentence = match frame.media {
            Media::Serial { text: true } if main || fix.is_some() => nmea::parse(&frame.payload),
            _ => Ok(None),
        };
        if main {
            let level = if sentence.is_err() {
                foxglove::LOG_WARNING
            } else {
                foxglove::LOG_INFO
            };
            let mut buf = Vec::with_capacity(frame.payload.len() + 64);
            protobuf_message(frame, level, &mut buf);
            let picture = match frame.media {
                Media::Camera {
                    codec: rigd_drivers::Codec::H264,
                    keyframe,
                    ..
                } if keyframe => Picture::Key,
                Media::Camera {
                    codec: rigd_drivers::Codec::H264,
                    ..
                } => Picture::Delta,
                _ => Picture::Whole,
            };
            self.hub
                .publish_picture(&self.main, frame.capture_ns, Bytes::from(buf), picture);
        }
        if let Ok(Some(s @ (Sentence::Gga(_) | Sentence::Rmc(_)))) = &sentence {
            // The builder sees every sentence while anyone watches the source, so a fix channel
            // subscribed later starts from a whole epoch.
            for f in self.fixes.push(s, frame.capture_ns, frame.seq) {
                if let Some(h) = fix {
                    let mut buf = Vec::with_capacity(128);
                    location_fix(&f, &self.source, &mut buf);
                    self.hub.publish(h, f.capture_ns, Bytes::from(buf));
                }
            }
        }
    }
}

impl Encoder {
    /// A CAN record: each frame on `/{source}` and, decoded, on its message's channel, for the
    /// channels someone subscribes to now.
    fn encode_can(&mut self, record: &Frame) {
        use crate::foxglove::can as m;
        let main = self.main.wanted();
        let decoded = self.dbc.is_some() && self.can.iter().any(|(h, _)| h.wanted());
        if !main && !decoded {
            return;
        }
        // A record that does not read was counted by the lane that spooled it; nothing to show.
        let Ok(frames) = rigd_drivers::can_record::decode(&record.payload) else {
            return;
        };
        let mut buf = Vec::with_capacity(96);
        for f in &frames {
            if main {
                m::can_frame(f, &self.source, &mut buf);
                self.hub
                    .publish(&self.main, f.ts_ns, Bytes::copy_from_slice(&buf));
            }
            let Some(dbc) = self.dbc.as_deref().filter(|_| decoded) else {
                continue;
            };
            let Some((index, message)) = dbc.message_index(f.id) else {
                continue;
            };
            let Some((handle, _)) = self.can.get(index).filter(|(h, _)| h.wanted()) else {
                continue;
            };
            if let Some(d) = dbc.decode(f.id, &f.data) {
                m::signals_protobuf(message, &d, f.ts_ns, &mut buf);
                self.hub
                    .publish(handle, f.ts_ns, Bytes::copy_from_slice(&buf));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_has_a_channel_and_nmea_sources_a_fix_channel() {
        let c = Config::parse(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"front\"\nkind = \"synthetic-camera\"\n\
             [[source]]\nid = \"mic\"\nkind = \"synthetic-audio\"\n\
             [[source]]\nid = \"gps\"\nkind = \"synthetic-serial\"\n\
             [[source]]\nid = \"can\"\nkind = \"serial\"\ndevice = \"/dev/null\"\nframing = \"raw\"\n",
            "t",
        )
        .unwrap();
        let (all, per) = channels(&c);
        let topics: Vec<(&str, &str)> = all
            .iter()
            .map(|c| (c.topic.as_str(), c.schema_name.as_str()))
            .collect();
        assert_eq!(
            topics,
            [
                ("/front", foxglove::COMPRESSED_IMAGE),
                ("/mic", foxglove::RAW_AUDIO),
                ("/gps", foxglove::LOG),
                ("/gps/fix", foxglove::LOCATION_FIX),
                ("/can", foxglove::LOG),
                ("/events", foxglove::LOG),
            ]
        );
        assert_eq!(per[2].fix, Some(4));
        assert_eq!(
            per[3],
            SourceChannels {
                source: "can".into(),
                main: 5,
                fix: None,
                can: None,
                on_demand: false,
            }
        );
        assert!(all.iter().all(|c| !c.schema.is_empty()));
        assert_eq!(all[0].class, Class::Camera);
        assert_eq!(
            per[4],
            SourceChannels {
                source: EVENTS_SOURCE.into(),
                main: 6,
                fix: None,
                can: None,
                on_demand: false,
            },
            "the events lane's channel, the one `rigd live` makes of the events topic"
        );
    }

    #[test]
    fn a_camera_with_a_proxy_is_on_demand_and_its_proxy_is_not() {
        let mut config = Config::parse(
                "[rig]\nid = \"a\"\n[[source]]\nid = \"cam\"\nkind = \"synthetic-camera\"\ncodec = \"h264\"\nwidth = 640\nheight = 360\nproxy = { width = 320, height = 180 }\n[[source]]\nid = \"side\"\nkind = \"synthetic-camera\"\ncodec = \"h264\"\n",
                "t",
            )
            .unwrap();
        config.sources = crate::config::with_proxies(&config.sources, config.rig.bucket_ms);
        let (all, per) = channels(&config);
        let on_demand: Vec<(&str, bool)> = per.iter().map(|s| (&*s.source, s.on_demand)).collect();
        assert_eq!(
            on_demand,
            [
                ("cam", true),
                ("cam-proxy", false),
                ("side", false),
                (EVENTS_SOURCE, false)
            ]
        );
        let hub = Arc::new(LiveHub::new("t".into(), all, 1, Arc::new(|| 0)));
        for (tap, s) in [Tap::default(), Tap::default()].iter().zip(&per) {
            assert!(connect(tap, hub.clone(), s.clone()));
        }
        assert!(hub.on_demand(per[0].main) && !hub.on_demand(per[1].main));
    }

    #[test]
    fn a_can_source_with_a_dbc_has_a_channel_per_message() {
        let dbc = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/vehicle.dbc");
        let c = Config::parse(
            &format!(
                "[rig]\nid = \"a\"\n[[source]]\nid = \"bus\"\nkind = \"synthetic-can\"\ndbc = \"{dbc}\"\n\
                 [[source]]\nid = \"raw\"\nkind = \"synthetic-can\"\n"
            ),
            "t",
        )
        .unwrap();
        let (all, per) = channels(&c);
        let topics: Vec<(&str, &str)> = all
            .iter()
            .map(|c| (c.topic.as_str(), c.schema_name.as_str()))
            .collect();
        assert_eq!(
            topics[..4],
            [
                ("/bus", crate::foxglove::can::CAN_FRAME),
                ("/bus/VehicleSpeed", "rigd.can.VehicleSpeed"),
                ("/bus/SteeringAngle", "rigd.can.SteeringAngle"),
                ("/bus/Brake", "rigd.can.Brake"),
            ]
        );
        assert_eq!(topics[6], ("/bus/BatteryCells", "rigd.can.BatteryCells"));
        assert_eq!(topics[7], ("/raw", crate::foxglove::can::CAN_FRAME));
        assert_eq!(per[0].can.as_ref().map(|c| c.first), Some(2));
        assert!(per[1].can.is_none());
    }

    fn alert(level: &'static str, subject: &str, text: &str) -> rigd_web::Alert {
        rigd_web::Alert {
            level,
            subject: subject.into(),
            text: text.into(),
            past: false,
        }
    }

    #[test]
    fn alerts_are_said_when_they_appear_change_level_and_clear() {
        let first = [
            alert("error", "uplink", "Broker unreachable"),
            alert("warn", "spool", "Spool 80 % full"),
        ];
        assert_eq!(
            alert_changes(&[], &first),
            [
                (
                    foxglove::LOG_ERROR,
                    "uplink: Broker unreachable".to_string()
                ),
                (foxglove::LOG_WARNING, "spool: Spool 80 % full".to_string()),
            ]
        );
        // The same alerts with other numbers in their text: nothing new to say.
        let same = [
            alert("error", "uplink", "Broker unreachable for 12 s"),
            alert("warn", "spool", "Spool 81 % full"),
        ];
        assert!(alert_changes(&first, &same).is_empty());
        // The spool's warning became an error; the uplink's cleared.
        let later = [alert("error", "spool", "Spool full: dropping")];
        assert_eq!(
            alert_changes(&same, &later),
            [
                (
                    foxglove::LOG_ERROR,
                    "spool: Spool full: dropping".to_string()
                ),
                (
                    foxglove::LOG_INFO,
                    "uplink: cleared (Broker unreachable for 12 s)".to_string()
                ),
            ]
        );
    }

    #[test]
    fn the_client_cap_is_a_web_key_checked_by_name() {
        let c = Config::parse("[rig]\nid = \"a\"\n", "t").unwrap();
        assert_eq!(c.web.max_live_clients, 4);
        let off = Config::parse("[rig]\nid = \"a\"\n[web]\nmax-live-clients = 0\n", "t").unwrap();
        assert_eq!(off.web.max_live_clients, 0);
        let e = Config::parse("[rig]\nid = \"a\"\n[web]\nmax-live-clients = 17\n", "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("web.max-live-clients") && e.contains("16"),
            "{e}"
        );
        let e = Config::parse("[rig]\nid = \"a\"\n[web]\nmax-live-clients = -1\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max-live-clients"), "{e}");
    }

    #[tokio::test]
    async fn a_frame_nobody_wants_is_not_handed_over() {
        let hub = Arc::new(LiveHub::new("t".into(), vec![], 1, Arc::new(|| 0)));
        let tap = Tap::default();
        let frame = Frame {
            source: "front".into(),
            seq: 1,
            capture_ns: 5,
            clock: rigd_drivers::ClockState::Unsynced,
            media: Media::jpeg(1, 1),
            payload: Bytes::from_static(b"jpeg"),
        };
        tap.offer(&frame);
        let (all, per) = channels(
            &Config::parse(
                "[rig]\nid = \"a\"\n[[source]]\nid = \"front\"\nkind = \"synthetic-camera\"\n",
                "t",
            )
            .unwrap(),
        );
        assert!(
            !connect(&tap, hub.clone(), per[0].clone()),
            "the hub has no channel 1"
        );
        let hub = Arc::new(LiveHub::new("t".into(), all, 1, Arc::new(|| 0)));
        assert!(connect(&tap, hub.clone(), per[0].clone()));
        // Nobody subscribes: nothing is encoded, nothing counted.
        tap.offer(&frame);
        assert!(!tap.0.get().unwrap().main.wanted());
        assert_eq!(hub.dropped("front"), 0);
    }
}
