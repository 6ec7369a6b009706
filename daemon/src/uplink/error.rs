//! What goes wrong on the way to the broker, by kind: the producer's pace after a failure
//! (`producer.rs` `Pace`) is decided by it.

use pulsar::proto::ServerError;

use super::codec;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    /// The lookup named a broker that takes no connection: it died and its bundles are not yet
    /// reassigned (the metadata store's session timeout), a state that ends by itself soon.
    #[error("topic owner {addr} unreachable: {source}")]
    OwnerUnreachable {
        addr: String,
        source: Box<LinkError>,
    },
    /// The cluster is moving the topic between brokers (`ServiceNotReady`: the bundle is being
    /// unloaded or not yet owned, or the broker closed the producer for a move): it is served
    /// again within seconds, so the producer retries it within a second (its `Pace`).
    #[error("topic moving between brokers: {0}")]
    Moving(String),
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Codec(#[from] codec::CodecError),
    #[error("broker: {0}")]
    Broker(String),
    #[error("topic terminated: {0}")]
    Terminated(String),
    /// The topic is partitioned: its partitions are produced to, each a topic of its own
    /// (`uplink::topic`).
    #[error("{topic} is partitioned ({partitions} partitions)")]
    Partitioned { topic: String, partitions: u32 },
    #[error("timed out waiting for {0}")]
    Timeout(String),
    #[error("connection closed by the broker")]
    Closed,
    #[error("shutting down")]
    Shutdown,
    /// A cheaper link is usable again, or one of the same cost has far more estimate per
    /// producer (`uplink::links::better`): the producer closes and sets up there.
    #[error("moving to link {0}")]
    Moved(String),
}

impl LinkError {
    /// The broker's ERROR for a request: [`LinkError::Terminated`] for a terminated topic, else
    /// as [`LinkError::refused`].
    pub(super) fn refused_request(code: i32, why: String) -> Self {
        if code == ServerError::TopicTerminatedError as i32 {
            LinkError::Terminated(why)
        } else {
            LinkError::refused(Some(code), why)
        }
    }

    /// A broker's refusal: [`LinkError::Moving`] for `ServiceNotReady`, else [`LinkError::Broker`].
    pub(super) fn refused(code: Option<i32>, why: String) -> Self {
        if code == Some(ServerError::ServiceNotReady as i32) {
            LinkError::Moving(why)
        } else {
            LinkError::Broker(why)
        }
    }

    /// A lookup's refusal: a bundle being unloaded answers `MetadataError` (Pulsar 3.0 and 4.0),
    /// a move as well.
    pub(super) fn lookup_refused(code: Option<i32>, why: String) -> Self {
        if code == Some(ServerError::MetadataError as i32) {
            LinkError::Moving(why)
        } else {
            LinkError::refused(code, why)
        }
    }
}

/// A server error code's name (`PersistenceError`, ...).
pub fn server_error(code: i32) -> &'static str {
    ServerError::try_from(code)
        .unwrap_or(ServerError::UnknownError)
        .as_str_name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_not_ready_is_a_move_and_other_refusals_are_not() {
        let moving = LinkError::refused(Some(ServerError::ServiceNotReady as i32), "x".into());
        assert!(matches!(moving, LinkError::Moving(_)));
        for code in [
            None,
            Some(ServerError::AuthorizationError as i32),
            Some(9999),
        ] {
            assert!(matches!(
                LinkError::refused(code, "x".into()),
                LinkError::Broker(_)
            ));
            assert!(matches!(
                LinkError::lookup_refused(code, "x".into()),
                LinkError::Broker(_)
            ));
        }
        // "Namespace bundle ... is being unloaded" comes as a lookup's MetadataError
        let unloading = Some(ServerError::MetadataError as i32);
        assert!(matches!(
            LinkError::lookup_refused(unloading, "x".into()),
            LinkError::Moving(_)
        ));
        assert!(matches!(
            LinkError::refused(unloading, "x".into()),
            LinkError::Broker(_)
        ));
    }
}
