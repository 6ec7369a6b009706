//! The recall control protocol (docs/RECALL.md): requests read from the control topic, answers
//! written to `{control-topic}-status`. Pure: parsing, validation and the answers' shapes.
//!
//! Every message gets an answer: what cannot be read or is not allowed is `rejected` with the
//! reason, after bounded work (a size limit before parsing, limits on every list).

use serde::{Deserialize, Serialize};

/// A request larger than this is rejected unread.
pub const MAX_REQUEST_BYTES: usize = 16 << 10;
/// Longest range one upload may ask for.
pub const MAX_RANGE_NS: i64 = 24 * 3600 * 1_000_000_000;
/// Upload requests accepted and not finished at once; the next is rejected.
pub const MAX_PENDING: usize = 64;
/// Longest request id (it is part of producer names).
pub const MAX_ID_LEN: usize = 64;
/// Most sources one request may name.
const MAX_SOURCES: usize = 64;

/// A request as it arrives on the control topic.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Wire {
    Upload {
        id: String,
        /// Empty or absent: every on-request source.
        #[serde(default)]
        sources: Vec<String>,
        from: i64,
        to: i64,
        /// Send again what an earlier request already sent.
        #[serde(default)]
        force: bool,
    },
    Cancel {
        id: String,
    },
    Coverage {
        id: String,
    },
}

/// An accepted upload: what is persisted before the request is acknowledged on the topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    pub id: String,
    /// Resolved: never empty, each an on-request source of this rig.
    pub sources: Vec<String>,
    /// `[from, to)`, ns on the rig's capture clock.
    pub from: i64,
    pub to: i64,
    pub force: bool,
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Upload(Upload),
    Cancel { id: String },
    Coverage { id: String },
}

/// Why a request is refused; the reason is the answer's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Known when the message said it (for the answer's key).
    pub id: Option<String>,
    /// Short, for the metric label: `too-large`, `malformed`, `bad-id`, `unknown-source`,
    /// `live-source`, `bad-range`, `range-too-long`, `too-many-pending`.
    pub kind: &'static str,
    pub reason: String,
}

/// Reads one control message. `sources` are the rig's, `(id, on_request)`; `pending` is how many
/// uploads are accepted and unfinished.
pub fn parse(
    bytes: &[u8],
    sources: &[(String, bool)],
    pending: usize,
) -> Result<Request, Rejected> {
    let reject = |id: Option<String>, kind, reason: String| Rejected { id, kind, reason };
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(reject(
            None,
            "too-large",
            format!(
                "request of {} bytes is over {MAX_REQUEST_BYTES}",
                bytes.len()
            ),
        ));
    }
    let wire: Wire = serde_json::from_slice(bytes).map_err(|e| {
        // The id, if the message has one, so the sender can match the answer.
        let id = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| v.get("id")?.as_str().map(str::to_string))
            .filter(|id| valid_id(id).is_ok());
        reject(id, "malformed", format!("malformed request: {e}"))
    })?;
    let id = match &wire {
        Wire::Upload { id, .. } | Wire::Cancel { id } | Wire::Coverage { id } => id.clone(),
    };
    valid_id(&id).map_err(|why| reject(None, "bad-id", why))?;
    let Wire::Upload {
        sources: named,
        from,
        to,
        force,
        ..
    } = wire
    else {
        return Ok(match wire {
            Wire::Cancel { .. } => Request::Cancel { id },
            _ => Request::Coverage { id },
        });
    };
    let some = |kind, reason| reject(Some(id.clone()), kind, reason);
    if from >= to {
        return Err(some(
            "bad-range",
            format!("from ({from}) must be before to ({to})"),
        ));
    }
    if to.saturating_sub(from) > MAX_RANGE_NS {
        return Err(some(
            "range-too-long",
            format!(
                "range of {} s is over 24 h",
                to.saturating_sub(from) / 1_000_000_000
            ),
        ));
    }
    if named.len() > MAX_SOURCES {
        return Err(some(
            "unknown-source",
            format!("{} sources named, at most {MAX_SOURCES}", named.len()),
        ));
    }
    let mut resolved = Vec::new();
    for s in &named {
        match sources.iter().find(|(id, _)| id == s).map(|(_, r)| *r) {
            None => return Err(some("unknown-source", format!("unknown source {s:?}"))),
            Some(false) => {
                return Err(some(
                    "live-source",
                    format!("source {s:?} uploads live: its frames are published as captured, none are held for recall"),
                ))
            }
            Some(true) if !resolved.contains(s) => resolved.push(s.clone()),
            Some(true) => {}
        }
    }
    if resolved.is_empty() {
        resolved = sources
            .iter()
            .filter(|(_, r)| *r)
            .map(|(s, _)| s.clone())
            .collect();
        if resolved.is_empty() {
            return Err(some(
                "unknown-source",
                "this rig has no on-request source".to_string(),
            ));
        }
    }
    if pending >= MAX_PENDING {
        return Err(some(
            "too-many-pending",
            format!("{MAX_PENDING} requests are pending; ask again when one is done"),
        ));
    }
    Ok(Request::Upload(Upload {
        id,
        sources: resolved,
        from,
        to,
        force,
    }))
}

/// A request id: 1 to 64 of `[A-Za-z0-9-]` (a UUID fits), as it becomes part of producer names.
pub fn valid_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("request id must be 1 to {MAX_ID_LEN} characters"));
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err("request id may hold only letters, digits and '-'".to_string());
    }
    Ok(())
}

/// A request's state as the answers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Accepted,
    Progress,
    Done,
    Partial,
    Rejected,
    Cancelled,
    Coverage,
    /// A campaign's answers (docs/CAMPAIGNS.md): a trigger became a window; stopped; the list.
    Triggered,
    Stopped,
    Campaigns,
}

impl State {
    /// No answer follows this one for the request.
    pub fn is_final(self) -> bool {
        !matches!(self, State::Accepted | State::Progress | State::Triggered)
    }
}

/// An interval of capture time no longer held (or held, in a coverage answer), `[from, to)` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub from: i64,
    pub to: i64,
}

/// A range's frames not uploaded, per source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Missing {
    pub source: String,
    /// Evicted (retention or a full spool) before it was asked for.
    pub evicted: Vec<Span>,
    /// Held but unreadable (quarantined) or refused by the broker.
    #[serde(default)]
    pub unreadable: u64,
}

/// What one source holds (a `coverage` answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub source: String,
    pub frames: u64,
    pub bytes: u64,
    /// Runs of consecutive frames, by capture time (a run ends at a gap of frames).
    pub held: Vec<Span>,
}

/// One answer on the status topic, keyed by the request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub id: String,
    pub rig: String,
    pub state: State,
    /// The rig's clock when answered, ns.
    pub at_ns: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Frames and bytes of the request sent (with receipt), this request and all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<Counts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Counts>,
    /// Frames of the range an earlier request already sent (not sent again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub already_sent: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<Missing>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Held>,
    /// Sources whose range started inside a group of pictures (H.264): sent from its keyframe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_keyframe: Vec<FromKeyframe>,
    /// A campaign's answer: its state, or every campaign's (docs/CAMPAIGNS.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campaign: Option<serde_json::Value>,
}

/// A video source's range moved back to the keyframe of the group it started in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FromKeyframe {
    pub source: String,
    /// The keyframe's capture time, ns: what is sent of this source starts here.
    pub from: i64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub frames: u64,
    pub bytes: u64,
}

impl Answer {
    pub fn new(id: &str, rig: &str, state: State, at_ns: i64) -> Self {
        Answer {
            id: id.to_string(),
            rig: rig.to_string(),
            state,
            at_ns,
            reason: None,
            sent: None,
            total: None,
            already_sent: None,
            missing: Vec::new(),
            sources: Vec::new(),
            from_keyframe: Vec::new(),
            campaign: None,
        }
    }

    pub fn rejected(r: &Rejected, rig: &str, at_ns: i64) -> Self {
        Answer {
            reason: Some(r.reason.clone()),
            ..Answer::new(r.id.as_deref().unwrap_or(""), rig, State::Rejected, at_ns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rig() -> Vec<(String, bool)> {
        vec![("front".into(), true), ("gps".into(), false)]
    }

    fn p(s: &str) -> Result<Request, Rejected> {
        parse(s.as_bytes(), rig().as_slice(), 0)
    }

    #[test]
    fn an_upload_names_on_request_sources_or_gets_them_all() {
        let r = p(r#"{"op":"upload","id":"a-1","sources":["front","front"],"from":1,"to":5}"#);
        assert_eq!(
            r,
            Ok(Request::Upload(Upload {
                id: "a-1".into(),
                sources: vec!["front".into()],
                from: 1,
                to: 5,
                force: false
            }))
        );
        let Ok(Request::Upload(u)) = p(r#"{"op":"upload","id":"b","from":1,"to":5,"force":true}"#)
        else {
            panic!()
        };
        assert_eq!((u.sources, u.force), (vec!["front".to_string()], true));
        assert_eq!(
            p(r#"{"op":"cancel","id":"b"}"#),
            Ok(Request::Cancel { id: "b".into() })
        );
        assert_eq!(
            p(r#"{"op":"coverage","id":"c"}"#),
            Ok(Request::Coverage { id: "c".into() })
        );
    }

    #[test]
    fn bad_requests_are_rejected_with_the_reason() {
        let kind = |s: &str| p(s).unwrap_err();
        let r = kind("{not json");
        assert_eq!((r.kind, r.id), ("malformed", None));
        let r = kind(r#"{"op":"explode","id":"x1"}"#);
        assert_eq!(r.kind, "malformed");
        assert_eq!(r.id.as_deref(), Some("x1"), "the id is kept for the answer");
        assert!(r.reason.contains("explode"), "{}", r.reason);
        assert_eq!(
            kind(r#"{"op":"upload","id":"x","sources":["rear"],"from":1,"to":2}"#).kind,
            "unknown-source"
        );
        assert_eq!(
            kind(r#"{"op":"upload","id":"x","sources":["gps"],"from":1,"to":2}"#).kind,
            "live-source"
        );
        assert_eq!(
            kind(r#"{"op":"upload","id":"x","from":2,"to":2}"#).kind,
            "bad-range"
        );
        let day = MAX_RANGE_NS + 1;
        assert_eq!(
            kind(&format!(
                r#"{{"op":"upload","id":"x","from":0,"to":{day}}}"#
            ))
            .kind,
            "range-too-long"
        );
        assert_eq!(kind(r#"{"op":"coverage","id":"a b"}"#).kind, "bad-id");
        assert_eq!(kind(r#"{"op":"coverage","id":""}"#).kind, "bad-id");
        let big = format!(
            r#"{{"op":"coverage","id":"{}"}}"#,
            "a".repeat(MAX_REQUEST_BYTES)
        );
        assert_eq!(kind(&big).kind, "too-large");
        let full = parse(
            br#"{"op":"upload","id":"x","from":1,"to":2}"#,
            rig().as_slice(),
            MAX_PENDING,
        );
        assert_eq!(full.unwrap_err().kind, "too-many-pending");
        // Cancel and coverage are answered whatever is pending.
        assert!(parse(
            br#"{"op":"cancel","id":"x"}"#,
            rig().as_slice(),
            MAX_PENDING
        )
        .is_ok());
    }

    #[test]
    fn answers_leave_out_what_they_do_not_say() {
        let a = Answer::new("r1", "van", State::Accepted, 7);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"id":"r1","rig":"van","state":"accepted","at_ns":7}"#
        );
        assert!(State::Partial.is_final() && !State::Progress.is_final());
    }
}
