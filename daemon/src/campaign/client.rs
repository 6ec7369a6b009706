//! `rigd campaign push FILE | list | stop ID | status [ID]`: the operator's side, over recall's
//! connection ([`crate::recall::client::converse`]): the message goes to the rig's control topic,
//! the answer with its id is read from the status topic.

use std::path::PathBuf;

use crate::progress::Interrupt;
use crate::recall::client::{converse, new_id, Link, RecallError};
use crate::recall::protocol::{Answer, State};

/// What to ask.
#[derive(Debug, Clone)]
pub enum Ask {
    /// A campaign's JSON (`op` and `v` filled in when the file leaves them out).
    Push(PathBuf),
    /// Stop campaign `id`; `true`: cancel its windows not yet uploaded too.
    Stop(String, bool),
    /// Every campaign's state (`list`), or one's (`status ID`) or all in full (`status`).
    List,
    Status(Option<String>),
}

#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Link(#[from] RecallError),
}

/// The message and the id its answer carries.
pub fn message(ask: &Ask) -> Result<(String, Vec<u8>), CampaignError> {
    let usage = CampaignError::Usage;
    match ask {
        Ask::Push(path) => {
            let text =
                std::fs::read(path).map_err(|e| usage(format!("{}: {e}", path.display())))?;
            let mut v: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| usage(format!("{}: not JSON: {e}", path.display())))?;
            let o = v
                .as_object_mut()
                .ok_or_else(|| usage(format!("{}: not a JSON object", path.display())))?;
            o.entry("op").or_insert("campaign".into());
            o.entry("v").or_insert(super::spec::VERSION.into());
            let id = o
                .get("id")
                .and_then(|i| i.as_str())
                .ok_or_else(|| usage(format!("{}: the campaign has no \"id\"", path.display())))?
                .to_string();
            Ok((id, serde_json::to_vec(&v).expect("JSON")))
        }
        Ask::Stop(id, cancel) => Ok((
            id.clone(),
            serde_json::to_vec(&serde_json::json!({
                "op": "campaign", "v": super::spec::VERSION, "id": id, "stop": true,
                "cancel": cancel,
            }))
            .expect("JSON"),
        )),
        Ask::List | Ask::Status(_) => {
            let id = new_id();
            let body = serde_json::json!({"op": "campaigns", "id": id});
            Ok((id, serde_json::to_vec(&body).expect("JSON")))
        }
    }
}

/// Sends the message and waits for its answer.
pub fn run(link: &Link<'_>, ask: &Ask, interrupt: &Interrupt) -> Result<Answer, CampaignError> {
    let (id, body) = message(ask)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CampaignError::Usage(format!("cannot start the async runtime: {e}")))?;
    Ok(rt.block_on(converse(link, &id, body, None, interrupt, |a| {
        matches!(
            a.state,
            State::Accepted | State::Rejected | State::Stopped | State::Campaigns
        )
    }))?)
}

/// The answer for a person (or its JSON with `json`).
pub fn describe(a: &Answer, ask: &Ask, json: bool) -> String {
    let states: Vec<rigd_web::CampaignStatus> = match &a.campaign {
        Some(v) if a.state == State::Campaigns => v
            .get("campaigns")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default(),
        Some(v) => serde_json::from_value(v.clone()).into_iter().collect(),
        None => Vec::new(),
    };
    let states: Vec<_> = match ask {
        Ask::Status(Some(id)) => states.into_iter().filter(|s| &s.id == id).collect(),
        _ => states,
    };
    if json {
        return match ask {
            Ask::List | Ask::Status(_) => serde_json::to_string(&states).expect("JSON"),
            _ => serde_json::to_string(a).expect("JSON"),
        };
    }
    let line = |s: &rigd_web::CampaignStatus| {
        format!(
            "{}: {}, {} triggers, {} windows, {} of {} bytes today",
            s.id, s.state, s.triggers, s.windows, s.bytes_today, s.quota_bytes
        )
    };
    match (a.state, ask) {
        (State::Rejected, _) => format!(
            "{}: rejected: {}",
            a.id,
            a.reason.as_deref().unwrap_or("no reason given")
        ),
        (State::Campaigns, Ask::Status(_)) => states
            .iter()
            .map(|s| serde_json::to_string_pretty(s).expect("JSON"))
            .collect::<Vec<_>>()
            .join("\n"),
        (State::Campaigns, _) if states.is_empty() => "no campaigns".to_string(),
        _ => states.iter().map(line).collect::<Vec<_>>().join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pushed_file_gets_its_op_and_version_and_the_rig_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.json");
        std::fs::write(
            &f,
            r#"{"id":"gate","when":{"marker":{}},"sources":["cam"],"quota_bytes":100}"#,
        )
        .unwrap();
        let (id, body) = message(&Ask::Push(f)).unwrap();
        assert_eq!(id, "gate");
        let rig = vec![super::super::spec::SourceInfo {
            id: "cam".into(),
            on_request: true,
            kind: super::super::spec::SourceKind::Other,
            retain_ns: None,
        }];
        assert!(matches!(
            super::super::spec::parse(&body, &rig, 0),
            Ok(super::super::spec::Message::Push(_))
        ));
        for cancel in [false, true] {
            let (id, body) = message(&Ask::Stop("gate".into(), cancel)).unwrap();
            assert_eq!(
                super::super::spec::parse(&body, &rig, 0),
                Ok(super::super::spec::Message::Stop { id, cancel })
            );
        }
        let (id, body) = message(&Ask::List).unwrap();
        assert_eq!(
            super::super::spec::parse(&body, &rig, 0),
            Ok(super::super::spec::Message::List { id })
        );
    }
}
