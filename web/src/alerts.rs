//! Alerts: whatever needs a technician's attention, in words a technician understands, derived
//! from a [`Status`] alone (pure; the page shows them as they come, most severe first).

use serde::Serialize;

use crate::{SourceStatus, Status};

/// One line on the page's alert list.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Alert {
    /// error (red: data is lost or not being captured) | warn (amber) | info
    pub level: &'static str,
    /// clock | uplink | spool | source:{id}
    pub subject: String,
    pub text: String,
    /// Says what happened since the start (frames dropped), not what is wrong now: shown, but
    /// no reason for `/readyz` to fail (readiness is now, not history).
    #[serde(skip)]
    pub past: bool,
}

fn alert(level: &'static str, subject: impl Into<String>, text: String) -> Alert {
    Alert {
        level,
        subject: subject.into(),
        text,
        past: false,
    }
}

/// The alerts for a status, errors first.
pub fn alerts(s: &Status) -> Vec<Alert> {
    let mut out = Vec::new();
    for src in &s.sources {
        source_alerts(s, src, &mut out);
    }
    uplink_alerts(s, &mut out);
    spool_alerts(s, &mut out);
    clock_alerts(s, &mut out);
    out.sort_by_key(|a| rank(a.level));
    out
}

fn rank(level: &str) -> u8 {
    match level {
        "error" => 0,
        "warn" => 1,
        _ => 2,
    }
}

/// "Camera front", "Microphone mic", "Serial gps".
fn source_name(src: &SourceStatus) -> String {
    let what = match src.modality.as_str() {
        "camera" => "Camera",
        "audio" => "Microphone",
        "serial" => "Serial",
        _ => "Source",
    };
    format!("{what} {}", src.id)
}

fn source_alerts(s: &Status, src: &SourceStatus, out: &mut Vec<Alert>) {
    let subject = format!("source:{}", src.id);
    let name = source_name(src);
    // Device errors start with "source {id}: ", which the alert already says.
    let prefix = format!("source {}: ", src.id);
    let reason = match src.reason.strip_prefix(&prefix).unwrap_or(&src.reason) {
        "" => String::new(),
        r => format!(": {r}"),
    };
    match src.state.as_str() {
        "failed" => out.push(alert(
            "error",
            subject.clone(),
            format!("{name} has failed and will not be retried{reason}"),
        )),
        "retrying" => out.push(alert(
            "error",
            subject.clone(),
            format!("{name} is not capturing, reconnecting{reason}"),
        )),
        _ => match src.last_frame_age_ms {
            Some(age) if age > src.stall_after_ms => out.push(alert(
                "error",
                subject.clone(),
                format!("{name} has not delivered a frame for {}", duration(age)),
            )),
            None if s.uptime_s * 1000 > src.stall_after_ms => out.push(alert(
                "error",
                subject.clone(),
                format!(
                    "{name} has not delivered any frame since rigd started {} ago",
                    duration(s.uptime_s * 1000)
                ),
            )),
            _ => {}
        },
    }
    if let Some(rate) = src.drop_rate.filter(|r| *r > 0.0) {
        out.push(alert(
            "warn",
            subject,
            format!("{name} is losing frames ({rate:.1} per second)"),
        ));
    }
}

fn uplink_alerts(s: &Status, out: &mut Vec<Alert>) {
    let u = &s.uplink;
    let waiting = bytes(s.spool.bytes);
    if !u.configured {
        out.push(alert(
            "info",
            "uplink",
            format!("No broker configured: everything stays in the spool ({waiting} stored)"),
        ));
    } else if u.paused {
        out.push(alert(
            "warn",
            "uplink",
            format!("Uplink paused by a technician: spooling, {waiting} waiting"),
        ));
    } else if !u.connected {
        let why = u
            .last_error
            .as_deref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        out.push(alert(
            "error",
            "uplink",
            format!("Broker unreachable: spooling, {waiting} waiting{why}"),
        ));
    }
    if u.configured && u.connected && !u.paused {
        let waiting: Vec<String> = s
            .sources
            .iter()
            .filter(|x| x.bandwidth_waiting)
            .map(|x| match x.backlog_eta_s {
                Some(eta) => format!("{} ({}, ETA {:.0} s)", x.id, bytes(x.spool_bytes), eta),
                None => format!("{} ({})", x.id, bytes(x.spool_bytes)),
            })
            .collect();
        if !waiting.is_empty() {
            out.push(alert(
                "info",
                "uplink",
                format!("Waiting for bandwidth: {}", waiting.join(", ")),
            ));
        }
    }
    if let Some(why) = u.credentials.as_deref().filter(|_| u.configured) {
        out.push(alert(
            "error",
            "uplink",
            format!(
                "Broker refuses the rig's credentials: {why}. Frames stay in the spool ({waiting}) until the certificate or token is renewed"
            ),
        ));
    }
    if let Some(why) = u.policy.as_deref().filter(|_| u.configured) {
        out.push(alert(
            "error",
            "uplink",
            format!("The broker refuses the rig's producers by namespace policy: {why}. Frames stay in the spool ({waiting})"),
        ));
    }
    if !u.terminated.is_empty() {
        out.push(alert(
            "error",
            "uplink",
            format!(
                "Topic terminated by the broker for {}: nothing more can be published there, its frames stay in the spool (the topic must be recreated)",
                u.terminated.join(", ")
            ),
        ));
    }
    if u.refused > 0 {
        out.push(alert(
            "warn",
            "uplink",
            format!(
                "{} frame{} refused by the broker and lost (too large or rejected)",
                u.refused,
                plural(u.refused)
            ),
        ));
    }
    if let Some(p99) = u.latency_p99_ms.filter(|p| *p > 5_000.0) {
        out.push(alert(
            "warn",
            "uplink",
            format!(
                "Publishing is slow: 1 frame in 100 waits over {} for the broker",
                duration(p99 as u64)
            ),
        ));
    }
}

fn spool_alerts(s: &Status, out: &mut Vec<Alert>) {
    let sp = &s.spool;
    if sp.max_bytes > 0 && sp.bytes.saturating_mul(10) >= sp.max_bytes.saturating_mul(9) {
        let what = if sp.when_full == "drop-newest" {
            "new frames"
        } else {
            "the oldest frames"
        };
        out.push(alert(
            "error",
            "spool",
            format!(
                "Spool {}% full ({} of {}): {what} are being dropped when it fills",
                sp.bytes * 100 / sp.max_bytes,
                bytes(sp.bytes),
                bytes(sp.max_bytes)
            ),
        ));
    }
    if sp.dropped > 0 {
        out.push(Alert {
            past: true,
            ..alert(
                "error",
                "spool",
                format!(
                    "{} spooled frame{} dropped (spool full, or cleared by a technician)",
                    sp.dropped,
                    plural(sp.dropped)
                ),
            )
        });
    }
    if let Some(why) = &sp.index_damage {
        out.push(alert(
            "warn",
            "spool",
            format!(
                "Spool index damaged: {why}. Nothing was deleted; check with `rigd spool verify`"
            ),
        ));
    }
    if sp.quarantined > 0 {
        out.push(alert(
            "warn",
            "spool",
            format!(
                "{} corrupt spool record{} set aside (quarantined)",
                sp.quarantined,
                plural(sp.quarantined)
            ),
        ));
    }
    let u = &s.uplink;
    if u.connected && !u.paused && sp.mode == "on-outage" && sp.records > 0 {
        let eta = sp
            .drain_eta_s
            .map(|e| format!(", about {} to go", duration((e * 1000.0) as u64)))
            .unwrap_or_default();
        out.push(alert(
            "info",
            "spool",
            format!(
                "Broker reachable: sending spooled frames, {} left{eta}",
                sp.records
            ),
        ));
    }
}

fn clock_alerts(s: &Status, out: &mut Vec<Alert>) {
    let c = &s.clock;
    if let Some(e) = &c.error {
        out.push(alert("error", "clock", format!("PTP port failing: {e}")));
    }
    match (c.port_state.is_some(), c.state.as_str()) {
        (false, _) => out.push(alert(
            "info",
            "clock",
            "No PTP configured: frames are stamped with this computer's clock (unsynced)".into(),
        )),
        (true, "unsynced") => out.push(alert(
            "error",
            "clock",
            "Clock not synchronised: no PTP master heard, frames are stamped \"unsynced\"".into(),
        )),
        (true, "locking") => out.push(alert(
            "warn",
            "clock",
            format!(
                "Clock locking to the PTP master{}",
                c.offset_ns
                    .map(|o| format!(", offset {}", offset(o)))
                    .unwrap_or_default()
            ),
        )),
        (true, "holdover") => out.push(alert(
            "warn",
            "clock",
            format!(
                "PTP master lost{}: clock in holdover{}",
                c.holdover_s
                    .map(|h| format!(" {} ago", duration((h * 1000.0) as u64)))
                    .unwrap_or_default(),
                c.estimated_drift_ns
                    .map(|d| format!(", may be off by up to {}", offset(d)))
                    .unwrap_or_default()
            ),
        )),
        _ => {}
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// "512 B", "12.0 KiB", "1.2 GiB".
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// "850 ms", "12 s", "4 min", "2 h 5 min", "3 d 4 h".
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms} ms"),
        1..=119 => format!("{s} s"),
        120..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// "850 ns", "12.3 µs", "4.50 ms" (signed).
fn offset(ns: i64) -> String {
    let a = ns.unsigned_abs() as f64;
    let sign = if ns < 0 { "-" } else { "" };
    if a < 1e3 {
        format!("{ns} ns")
    } else if a < 1e6 {
        format!("{sign}{:.1} µs", a / 1e3)
    } else {
        format!("{sign}{:.2} ms", a / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SpoolStatus, UplinkStatus};

    fn rig() -> Status {
        Status {
            rig: "van-07".into(),
            uptime_s: 60,
            clock: crate::ClockStatus {
                state: "locked".into(),
                port_state: Some("slave".into()),
                ..Default::default()
            },
            sources: vec![SourceStatus {
                id: "front".into(),
                modality: "camera".into(),
                state: "running".into(),
                last_frame_age_ms: Some(30),
                stall_after_ms: 2000,
                ..Default::default()
            }],
            uplink: UplinkStatus {
                configured: true,
                connected: true,
                ..Default::default()
            },
            spool: SpoolStatus {
                mode: "on-outage".into(),
                max_bytes: 8 << 30,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_healthy_rig_has_no_alerts() {
        assert_eq!(alerts(&rig()), vec![]);
    }

    #[test]
    fn a_stalled_camera_is_named_with_the_time_since_its_last_frame() {
        let mut s = rig();
        s.sources[0].last_frame_age_ms = Some(12_300);
        let a = alerts(&s);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].level, "error");
        assert_eq!(a[0].text, "Camera front has not delivered a frame for 12 s");
        s.sources[0].last_frame_age_ms = None;
        assert!(alerts(&s)[0]
            .text
            .contains("not delivered any frame since rigd started 60 s ago"));
        s.sources[0].state = "retrying".into();
        s.sources[0].reason = "source front: device /dev/video0: No such device".into();
        assert_eq!(
            alerts(&s)[0].text,
            "Camera front is not capturing, reconnecting: device /dev/video0: No such device"
        );
    }

    #[test]
    fn a_terminated_topic_names_its_source_and_says_the_frames_stay() {
        let mut s = rig();
        s.uplink.terminated = vec!["front".into()];
        let a = alerts(&s);
        let t = a.iter().find(|a| a.text.contains("terminated")).unwrap();
        assert_eq!(t.level, "error");
        assert!(t.text.contains("for front") && t.text.contains("stay in the spool"));
    }

    #[test]
    fn a_namespace_policy_refusal_is_named() {
        let mut s = rig();
        s.uplink.connected = false;
        s.uplink.policy = Some("end-to-end encryption is required".into());
        let a = alerts(&s);
        assert!(a.iter().any(|a| a.level == "error"
            && a.text
                .contains("namespace policy: end-to-end encryption is required")));
    }

    #[test]
    fn a_broker_outage_says_how_much_is_waiting() {
        let mut s = rig();
        s.uplink.connected = false;
        s.spool.bytes = 1_288_490_189; // 1.2 GiB
        let a = alerts(&s);
        assert_eq!(a[0].text, "Broker unreachable: spooling, 1.2 GiB waiting");
        s.uplink.last_error = Some("connection refused".into());
        assert_eq!(
            alerts(&s)[0].text,
            "Broker unreachable: spooling, 1.2 GiB waiting (connection refused)"
        );
        s.uplink.paused = true;
        assert_eq!(alerts(&s)[0].level, "warn");
    }

    #[test]
    fn draining_shows_an_eta_and_errors_come_first() {
        let mut s = rig();
        s.spool.records = 1500;
        s.spool.drain_eta_s = Some(250.0);
        s.spool.quarantined = 2;
        s.sources[0].drop_rate = Some(0.5);
        s.clock.state = "holdover".into();
        s.clock.holdover_s = Some(30.0);
        let a = alerts(&s);
        let texts: Vec<_> = a.iter().map(|a| a.text.as_str()).collect();
        assert!(
            texts.contains(
                &"Broker reachable: sending spooled frames, 1500 left, about 4 min to go"
            ),
            "{texts:?}"
        );
        assert!(texts.contains(&"Camera front is losing frames (0.5 per second)"));
        assert!(texts.contains(&"PTP master lost 30 s ago: clock in holdover"));
        assert!(a.windows(2).all(|w| rank(w[0].level) <= rank(w[1].level)));
        assert_eq!(a[0].level, "warn");
    }

    #[test]
    fn formats() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(8 << 30), "8.0 GiB");
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(7_500_000), "2 h 5 min");
        assert_eq!(offset(-1500), "-1.5 µs");
        assert_eq!(offset(999), "999 ns");
    }
}
