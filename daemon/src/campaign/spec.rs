//! A campaign as pushed on the control topic (docs/CAMPAIGNS.md) and its validation, pure: every
//! message is read after a size check, with limits on every list and on nesting, and a refusal
//! names its reason (`kind` for the metric label, `reason` for the answer).

use serde::{Deserialize, Serialize};

/// A campaign message larger than this is rejected unread (a 256-vertex polygon is ~10 KB).
pub const MAX_CAMPAIGN_BYTES: usize = 16 << 10;
/// The protocol version this rig reads (`"v"`).
pub const VERSION: u32 = 1;
/// Longest campaign id: its windows' recall ids are `{id}-w{n}`, 64 at most.
pub const MAX_ID_LEN: usize = 40;
/// Campaigns active at once; the next push of a new id is rejected.
pub const MAX_ACTIVE: usize = 64;
/// Vertices of one polygon.
pub const MAX_VERTICES: usize = 256;
/// Conditions (leaves) in one campaign, and how deep `all`/`any` nest.
pub const MAX_LEAVES: usize = 32;
pub const MAX_DEPTH: usize = 4;
/// Longest `before_s + after_s` (as a technician's marker's window).
pub const MAX_WINDOW_S: f64 = 3600.0;

/// What the control topic carries with `op = "campaign"`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wire {
    pub op: String,
    pub v: u32,
    pub id: String,
    /// `true`: stop the campaign `id` (nothing else is read but `cancel`).
    #[serde(default)]
    pub stop: bool,
    /// With `stop`: its windows still waiting or uploading are cancelled too.
    #[serde(default)]
    pub cancel: bool,
    #[serde(default)]
    pub when: Option<Condition>,
    #[serde(default)]
    pub sources: Vec<String>,
    #[serde(default)]
    pub before_s: Option<f64>,
    #[serde(default)]
    pub after_s: Option<f64>,
    #[serde(default)]
    pub gap_s: Option<f64>,
    #[serde(default)]
    pub priority: Option<u8>,
    #[serde(default)]
    pub quota_bytes: Option<u64>,
    /// Unix ns on the rig clock; absent: never.
    #[serde(default)]
    pub expires_ns: Option<i64>,
}

/// A condition over what the rig sees (one key per object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Condition {
    /// Ground speed of a GPS source's fixes (from consecutive fixes), above or below a threshold.
    Speed {
        source: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        above_kmh: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        below_kmh: Option<f64>,
    },
    /// A GPS source's fix against a polygon of `[lat, lon]` vertices (degrees).
    Geofence {
        source: String,
        polygon: Vec<[f64; 2]>,
        on: Fence,
    },
    /// An audio source's RMS level above `above_dbfs` for `for_s` without a break.
    Audio {
        source: String,
        above_dbfs: f64,
        for_s: f64,
    },
    /// A technician's marker (`POST /api/events`), whose note contains `note` if given.
    Marker {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// The rig clock leaves `locked`.
    ClockUnlocked {},
    /// No frame from `source` for `for_s`.
    Stall {
        source: String,
        for_s: f64,
    },
    All(Vec<Condition>),
    Any(Vec<Condition>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fence {
    /// The first fix inside after one outside (a moment).
    Enter,
    /// The first fix outside after one inside (a moment).
    Leave,
    /// Every fix inside (a state: it triggers when it starts).
    Inside,
}

/// An accepted campaign: what is persisted before the message is acknowledged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Campaign {
    pub id: String,
    pub when: Condition,
    /// On-request sources whose frames each window uploads.
    pub sources: Vec<String>,
    pub before_ns: i64,
    pub after_ns: i64,
    pub gap_ns: i64,
    /// 0 (first) to 9; operators' recall requests are 0.
    pub priority: u8,
    /// Payload bytes uploaded per UTC day (rig clock) at most.
    pub quota_bytes: u64,
    pub expires_ns: Option<i64>,
}

/// A message that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Push(Campaign),
    /// Stop triggering; with `cancel` the windows not yet uploaded are cancelled too.
    Stop {
        id: String,
        cancel: bool,
    },
    /// Every campaign's state, answered under this request id.
    List {
        id: String,
    },
}

/// Why a message is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub id: Option<String>,
    /// `too-large`, `malformed`, `bad-version`, `bad-id`, `unknown-source`, `live-source`,
    /// `bad-condition`, `bad-polygon`, `bad-window`, `bad-quota`, `expired`.
    pub kind: &'static str,
    pub reason: String,
}

/// One of the rig's sources as a campaign sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    pub id: String,
    pub on_request: bool,
    pub kind: SourceKind,
    /// An on-request source's `retain-age` (a window cannot reach back further).
    pub retain_ns: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// Serial records (NMEA for a GPS condition).
    Serial,
    Audio,
    Other,
}

/// Whether a message is a campaign's (`op` `campaign` or `campaigns`), read cheaply: the caller
/// routes it here or to recall.
pub fn is_campaign(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(256)];
    let text = String::from_utf8_lossy(head);
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    compact.contains(r#""op":"campaign""#) || compact.contains(r#""op":"campaigns""#)
}

/// Reads one campaign message at rig time `now_ns`.
pub fn parse(bytes: &[u8], sources: &[SourceInfo], now_ns: i64) -> Result<Message, Rejected> {
    let reject = |id: Option<String>, kind, reason: String| Rejected { id, kind, reason };
    if bytes.len() > MAX_CAMPAIGN_BYTES {
        return Err(reject(
            None,
            "too-large",
            format!(
                "campaign of {} bytes is over {MAX_CAMPAIGN_BYTES}",
                bytes.len()
            ),
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| reject(None, "malformed", format!("malformed campaign: {e}")))?;
    let said_id = value
        .get("id")
        .and_then(|v| v.as_str())
        .filter(|id| valid_id(id).is_ok())
        .map(str::to_string);
    if value.get("op").and_then(|v| v.as_str()) == Some("campaigns") {
        let id = said_id
            .ok_or_else(|| reject(None, "bad-id", "a list request needs an id".to_string()))?;
        return Ok(Message::List { id });
    }
    let wire: Wire = serde_json::from_value(value).map_err(|e| {
        reject(
            said_id.clone(),
            "malformed",
            format!("malformed campaign: {e}"),
        )
    })?;
    valid_id(&wire.id).map_err(|why| reject(None, "bad-id", why))?;
    let some = |kind, reason: String| reject(Some(wire.id.clone()), kind, reason);
    if wire.v != VERSION {
        return Err(some(
            "bad-version",
            format!("version {} is not one this rig reads ({VERSION})", wire.v),
        ));
    }
    if wire.stop {
        return Ok(Message::Stop {
            id: wire.id,
            cancel: wire.cancel,
        });
    }
    let when = wire
        .when
        .ok_or_else(|| some("malformed", "a campaign needs `when`".to_string()))?;
    let mut leaves = 0;
    check_condition(&when, sources, 1, &mut leaves).map_err(|(k, r)| some(k, r))?;
    if wire.sources.is_empty() || wire.sources.len() > 64 {
        return Err(some(
            "unknown-source",
            "name 1 to 64 on-request sources to collect".to_string(),
        ));
    }
    let seconds = |name: &str, v: Option<f64>, default: f64| -> Result<i64, Rejected> {
        let v = v.unwrap_or(default);
        if !(v.is_finite() && (0.0..=MAX_WINDOW_S).contains(&v)) {
            return Err(some(
                "bad-window",
                format!("{name} must be 0 to {MAX_WINDOW_S} seconds"),
            ));
        }
        Ok((v * 1e9) as i64)
    };
    let before_ns = seconds("before_s", wire.before_s, 10.0)?;
    let after_ns = seconds("after_s", wire.after_s, 10.0)?;
    let gap_ns = seconds("gap_s", wire.gap_s, 0.0)?;
    if before_ns + after_ns == 0 || (before_ns + after_ns) as f64 > MAX_WINDOW_S * 1e9 {
        return Err(some(
            "bad-window",
            format!("before_s + after_s must be above 0 and at most {MAX_WINDOW_S}"),
        ));
    }
    let mut named: Vec<String> = Vec::new();
    for s in &wire.sources {
        let info = source(sources, s).map_err(|r| some("unknown-source", r))?;
        if !info.on_request {
            return Err(some(
                "live-source",
                format!("source {s:?} uploads live: a campaign collects on-request sources"),
            ));
        }
        if let Some(retain) = info.retain_ns.filter(|&r| before_ns > r) {
            return Err(some(
                "bad-window",
                format!(
                    "before_s reaches back further than source {s:?} keeps frames ({} s)",
                    retain / 1_000_000_000
                ),
            ));
        }
        if !named.contains(s) {
            named.push(s.clone());
        }
    }
    let priority = wire.priority.unwrap_or(5);
    if priority > 9 {
        return Err(some(
            "bad-window",
            format!("priority {priority} is not 0 to 9"),
        ));
    }
    let quota_bytes = wire
        .quota_bytes
        .ok_or_else(|| some("bad-quota", "a campaign needs quota_bytes".to_string()))?;
    if quota_bytes == 0 {
        return Err(some("bad-quota", "quota_bytes must be above 0".to_string()));
    }
    if let Some(e) = wire.expires_ns.filter(|&e| e <= now_ns) {
        return Err(some(
            "expired",
            format!("expires_ns {e} is in the past (the rig's clock is {now_ns})"),
        ));
    }
    Ok(Message::Push(Campaign {
        id: wire.id,
        when,
        sources: named,
        before_ns,
        after_ns,
        gap_ns,
        priority,
        quota_bytes,
        expires_ns: wire.expires_ns,
    }))
}

/// A campaign id: 1 to [`MAX_ID_LEN`] of `[A-Za-z0-9-]`.
pub fn valid_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("campaign id must be 1 to {MAX_ID_LEN} characters"));
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err("campaign id may hold only letters, digits and '-'".to_string());
    }
    Ok(())
}

fn source<'a>(sources: &'a [SourceInfo], id: &str) -> Result<&'a SourceInfo, String> {
    sources
        .iter()
        .find(|s| s.id == id)
        .ok_or_else(|| format!("unknown source {id:?}"))
}

type Problem = (&'static str, String);

fn check_condition(
    c: &Condition,
    sources: &[SourceInfo],
    depth: usize,
    leaves: &mut usize,
) -> Result<(), Problem> {
    let bad = |r: String| Err(("bad-condition", r));
    let of_kind = |id: &str, kind: SourceKind, what: &str| -> Result<(), Problem> {
        let s = source(sources, id).map_err(|r| ("unknown-source", r))?;
        if s.kind != kind {
            return Err(("bad-condition", format!("source {id:?} is not {what}")));
        }
        Ok(())
    };
    let duration = |name: &str, v: f64| -> Result<(), Problem> {
        if !(v.is_finite() && v > 0.0 && v <= MAX_WINDOW_S) {
            return Err((
                "bad-condition",
                format!("{name} must be above 0 and at most {MAX_WINDOW_S} s"),
            ));
        }
        Ok(())
    };
    if depth > MAX_DEPTH {
        return bad(format!("all/any nest deeper than {MAX_DEPTH}"));
    }
    if !matches!(c, Condition::All(_) | Condition::Any(_)) {
        *leaves += 1;
        if *leaves > MAX_LEAVES {
            return bad(format!("more than {MAX_LEAVES} conditions"));
        }
    }
    match c {
        Condition::Speed {
            source,
            above_kmh,
            below_kmh,
        } => {
            of_kind(source, SourceKind::Serial, "a serial (NMEA GPS) source")?;
            match (above_kmh, below_kmh) {
                (Some(v), None) | (None, Some(v)) if v.is_finite() && *v >= 0.0 => Ok(()),
                _ => bad("speed needs one of above_kmh or below_kmh, >= 0".to_string()),
            }
        }
        Condition::Geofence {
            source, polygon, ..
        } => {
            of_kind(source, SourceKind::Serial, "a serial (NMEA GPS) source")?;
            check_polygon(polygon).map_err(|r| ("bad-polygon", r))
        }
        Condition::Audio {
            source,
            above_dbfs,
            for_s,
        } => {
            of_kind(source, SourceKind::Audio, "an audio source")?;
            if !(above_dbfs.is_finite() && (-120.0..=0.0).contains(above_dbfs)) {
                return bad("above_dbfs must be -120 to 0".to_string());
            }
            duration("for_s", *for_s)
        }
        Condition::Marker { note } => match note {
            Some(n) if n.chars().count() > 500 => bad("note over 500 characters".to_string()),
            _ => Ok(()),
        },
        Condition::ClockUnlocked {} => Ok(()),
        Condition::Stall { source: s, for_s } => {
            source(sources, s).map_err(|r| ("unknown-source", r))?;
            duration("for_s", *for_s)
        }
        Condition::All(cs) | Condition::Any(cs) => {
            if cs.is_empty() {
                return bad("all/any of nothing".to_string());
            }
            cs.iter()
                .try_for_each(|c| check_condition(c, sources, depth + 1, leaves))
        }
    }
}

/// A polygon the rig can test fixes against: 3 to [`MAX_VERTICES`] vertices, each a finite
/// `[lat, lon]` in range, not all on one line (an area above 0), not across the antimeridian.
fn check_polygon(p: &[[f64; 2]]) -> Result<(), String> {
    if p.len() < 3 || p.len() > MAX_VERTICES {
        return Err(format!(
            "a polygon needs 3 to {MAX_VERTICES} vertices, not {}",
            p.len()
        ));
    }
    for [lat, lon] in p {
        if !(lat.is_finite() && lon.is_finite() && lat.abs() <= 90.0 && lon.abs() <= 180.0) {
            return Err(format!(
                "vertex [{lat}, {lon}] is not a latitude and longitude"
            ));
        }
    }
    let lons = p.iter().map(|v| v[1]);
    let (lo, hi) = lons.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if hi - lo > 180.0 {
        return Err("a polygon may not span more than 180 degrees of longitude".to_string());
    }
    let area: f64 = (0..p.len())
        .map(|i| {
            let (a, b) = (p[i], p[(i + 1) % p.len()]);
            a[1] * b[0] - b[1] * a[0]
        })
        .sum();
    if area.abs() < 1e-12 {
        return Err("a polygon with no area (its vertices on one line)".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn rig() -> Vec<SourceInfo> {
        let s = |id: &str, on_request, kind| SourceInfo {
            id: id.into(),
            on_request,
            kind,
            retain_ns: on_request.then_some(3600 * 1_000_000_000),
        };
        vec![
            s("cam", true, SourceKind::Other),
            s("gps", false, SourceKind::Serial),
            s("mic", false, SourceKind::Audio),
        ]
    }

    fn p(s: &str) -> Result<Message, Rejected> {
        parse(s.as_bytes(), &rig(), 1_000)
    }

    const FENCE: &str = r#"{"geofence":{"source":"gps","polygon":[[48.1,11.5],[48.2,11.5],[48.2,11.6]],"on":"enter"}}"#;

    #[test]
    fn a_campaign_is_read_with_its_defaults() {
        let m = p(&format!(
            r#"{{"op":"campaign","v":1,"id":"gate","when":{FENCE},"sources":["cam","cam"],"quota_bytes":1000}}"#
        ))
        .unwrap();
        let Message::Push(c) = m else { panic!() };
        assert_eq!(c.sources, ["cam"]);
        assert_eq!(
            (c.before_ns, c.after_ns, c.gap_ns, c.priority),
            (10_000_000_000, 10_000_000_000, 0, 5)
        );
        assert_eq!(
            p(r#"{"op":"campaign","v":1,"id":"gate","stop":true}"#).unwrap(),
            Message::Stop {
                id: "gate".into(),
                cancel: false
            }
        );
        assert_eq!(
            p(r#"{"op":"campaign","v":1,"id":"gate","stop":true,"cancel":true}"#).unwrap(),
            Message::Stop {
                id: "gate".into(),
                cancel: true
            }
        );
        assert_eq!(
            p(r#"{"op":"campaigns","id":"q1"}"#).unwrap(),
            Message::List { id: "q1".into() }
        );
        assert!(is_campaign(br#"{ "op" : "campaign", "v":1}"#));
        assert!(!is_campaign(br#"{"op":"upload","id":"campaign"}"#));
    }

    #[test]
    fn every_rejection_says_its_reason() {
        let kind = |s: String| p(&s).unwrap_err();
        let c = |rest: &str| format!(r#"{{"op":"campaign","v":1,"id":"x",{rest}}}"#);
        let fence = |poly: &str| {
            c(&format!(
                r#""when":{{"geofence":{{"source":"gps","polygon":{poly},"on":"enter"}}}},"sources":["cam"],"quota_bytes":1"#
            ))
        };
        assert_eq!(kind("{nope".into()).kind, "malformed");
        let r = kind(c(
            r#""when":{"levitate":{}},"sources":["cam"],"quota_bytes":1"#,
        ));
        assert_eq!((r.kind, r.id.as_deref()), ("malformed", Some("x")));
        assert_eq!(
            kind(r#"{"op":"campaign","v":2,"id":"x"}"#.into()).kind,
            "bad-version"
        );
        assert_eq!(
            kind(r#"{"op":"campaign","v":1,"id":"a b"}"#.into()).kind,
            "bad-id"
        );
        let huge = c(&format!(r#""pad":"{}""#, "a".repeat(MAX_CAMPAIGN_BYTES)));
        let r = kind(huge);
        assert_eq!(r.kind, "too-large");
        assert!(r.reason.contains("over 16384"), "{}", r.reason);
        assert_eq!(kind(fence("[[48.1,11.5],[48.2,11.5]]")).kind, "bad-polygon");
        assert_eq!(
            kind(fence("[[48.1,11.5],[48.2,11.5],[48.3,11.5]]")).kind,
            "bad-polygon"
        );
        assert_eq!(
            kind(fence("[[148.1,11.5],[48.2,11.5],[48.2,11.6]]")).kind,
            "bad-polygon"
        );
        let with = |when: &str, rest: &str| c(&format!(r#""when":{when},{rest}"#));
        assert_eq!(
            kind(with(FENCE, r#""sources":["rear"],"quota_bytes":1"#)).kind,
            "unknown-source"
        );
        assert_eq!(
            kind(with(FENCE, r#""sources":["gps"],"quota_bytes":1"#)).kind,
            "live-source"
        );
        assert_eq!(
            kind(with(
                r#"{"audio":{"source":"gps","above_dbfs":-6,"for_s":1}}"#,
                r#""sources":["cam"],"quota_bytes":1"#
            ))
            .kind,
            "bad-condition"
        );
        assert_eq!(
            kind(with(
                r#"{"stall":{"source":"nope","for_s":1}}"#,
                r#""sources":["cam"],"quota_bytes":1"#
            ))
            .kind,
            "unknown-source"
        );
        assert_eq!(
            kind(with(
                r#"{"any":[]}"#,
                r#""sources":["cam"],"quota_bytes":1"#
            ))
            .kind,
            "bad-condition"
        );
        assert_eq!(
            kind(with(FENCE, r#""sources":["cam"],"quota_bytes":0"#)).kind,
            "bad-quota"
        );
        assert_eq!(
            kind(with(
                FENCE,
                r#""sources":["cam"],"quota_bytes":1,"before_s":7200"#
            ))
            .kind,
            "bad-window"
        );
        assert_eq!(
            kind(with(
                FENCE,
                r#""sources":["cam"],"quota_bytes":1,"before_s":0,"after_s":0"#
            ))
            .kind,
            "bad-window"
        );
        let r = kind(with(
            FENCE,
            r#""sources":["cam"],"quota_bytes":1,"expires_ns":999"#,
        ));
        assert_eq!(r.kind, "expired");
        assert!(r.reason.contains("in the past"), "{}", r.reason);
        let deep = r#"{"all":[{"all":[{"all":[{"all":[{"marker":{}}]}]}]}]}"#;
        assert_eq!(
            kind(with(deep, r#""sources":["cam"],"quota_bytes":1"#)).kind,
            "bad-condition"
        );
    }
}
