//! Connection setup to a broker: TCP (bounded send buffer) or TLS, `CONNECT` with token auth,
//! `PARTITIONED_METADATA`, `LOOKUP` with redirects, `PRODUCER` under a stable name. Every step has a
//! deadline; the caller also races the whole setup against shutdown.

use bytes::BytesMut;
use pulsar::proto::{
    base_command::Type, command_lookup_topic_response::LookupType, AuthData, BaseCommand,
    CommandAuthResponse, CommandConnect, CommandLookupTopic, CommandPartitionedTopicMetadata,
    CommandPing, CommandPong, CommandProducer, FeatureFlags, ServerError,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::service::Endpoint;

use super::codec;

const PROTOCOL_VERSION: i32 = 21;
/// Each request of the setup (TCP connect, TLS handshake, each command and its answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a producer whose broker took no connection checks whether it does again
/// ([`Setup::reachable`]).
pub const REACH_EVERY: Duration = Duration::from_millis(500);
/// ... and how long one check waits for the SYN's answer.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(1);
/// The socket's send buffer. Small enough that bytes the socket accepts are close to bytes the
/// link carried (write progress means the link moves: a silent link stops it within a second or
/// two even at 1 Mbit/s), large enough for a cellular link's bandwidth-delay product.
const SEND_BUFFER: u32 = 128 << 10;

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
}

/// Where a token comes from: a file re-read at every connection and authentication challenge (a
/// rotated JWT is picked up without a restart), or a fixed one (the offline tools).
#[derive(Debug, Clone, Default)]
pub enum Token {
    #[default]
    None,
    Fixed(String),
    File(PathBuf),
}

impl Token {
    /// The token now; a file that cannot be read is an error that names it.
    pub fn current(&self) -> Result<Option<String>, LinkError> {
        match self {
            Token::None => Ok(None),
            Token::Fixed(t) => Ok(Some(t.clone())),
            Token::File(path) => crate::config::read_token(path)
                .map(Some)
                .map_err(|e| LinkError::Broker(format!("token file {e}"))),
        }
    }
}

/// A live connection: a writer half, an outgoing buffer of whole frames, and decoded inbound
/// commands from a reader task.
pub struct Link {
    pub writer: tokio::io::WriteHalf<Box<dyn Conn>>,
    pub inbound: mpsc::Receiver<Result<codec::Inbound, LinkError>>,
    reader: tokio::task::JoinHandle<()>,
    pub out: BytesMut,
    pub max_message_size: usize,
    pub producer_id: u64,
    pub last_inbound: Instant,
    token: Token,
    /// The TCP socket under the stream (TLS or not), a duplicate descriptor, for [`Link::reset`].
    socket: std::os::fd::OwnedFd,
    /// How long [`Link::response`] waits: the setup's deadline (see `Setup::setup_timeout`).
    pub request_timeout: Duration,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Link {
    /// Ends a link given up on with a reset instead of a close: a closed socket's kernel keeps
    /// sending what it still buffers (up to the send buffer, 256 KiB) once the link is back, outside
    /// the bandwidth budget, to a connection nobody reads; the frames go again on the next
    /// connection anyway. Measured on the thin-link test's 2 Mbit/s link after a 25 s cut: the wire
    /// carried 1922 kbit/s against an 1800 kbit/s budget for half a minute, 1844 normally.
    pub fn reset(self) {
        if let Err(e) = rustix::net::sockopt::set_socket_linger(&self.socket, Some(Duration::ZERO))
        {
            tracing::debug!(error = %e, "cannot set SO_LINGER 0 on a failed link; closing it");
        }
    }

    /// Writes a command and whatever is buffered, within the request deadline.
    pub(super) async fn command(&mut self, cmd: BaseCommand) -> Result<(), LinkError> {
        codec::encode_command(&cmd, &mut self.out);
        tokio::time::timeout(REQUEST_TIMEOUT, self.writer.write_all(&self.out))
            .await
            .map_err(|_| LinkError::Timeout("the broker to take a request".into()))??;
        self.out.clear();
        Ok(())
    }

    /// Queues the answer to an authentication challenge: the token as it is now.
    pub fn answer_challenge(&mut self) -> Result<(), LinkError> {
        let token = self.token.current()?;
        codec::encode_command(&auth_response(token), &mut self.out);
        Ok(())
    }

    /// Waits for the response to a request, answering pings and challenges meanwhile.
    pub(super) async fn response(
        &mut self,
        what: &'static str,
        matches: impl Fn(&BaseCommand) -> bool,
    ) -> Result<BaseCommand, LinkError> {
        Ok(self.frame(what, matches).await?.cmd)
    }

    /// [`Link::response`] with the metadata of the frame's payload, if it has one.
    pub(super) async fn frame(
        &mut self,
        what: &'static str,
        matches: impl Fn(&BaseCommand) -> bool,
    ) -> Result<codec::Inbound, LinkError> {
        self.frame_within(what, self.request_timeout, matches).await
    }

    /// [`Link::frame`] within `timeout`.
    async fn frame_within(
        &mut self,
        what: &'static str,
        timeout: Duration,
        matches: impl Fn(&BaseCommand) -> bool,
    ) -> Result<codec::Inbound, LinkError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.inbound.recv())
                .await
                .map_err(|_| LinkError::Timeout(what.to_string()))?
                .ok_or(LinkError::Closed)??;
            let cmd = &frame.cmd;
            if cmd.r#type == Type::Ping as i32 {
                self.command(pong()).await?;
                continue;
            }
            if cmd.auth_challenge.is_some() {
                let token = self.token.current()?;
                self.command(auth_response(token)).await?;
                continue;
            }
            if let Some(e) = &cmd.error {
                let why = format!(
                    "{} ({}) instead of {what}",
                    e.message,
                    server_error(e.error)
                );
                if e.error == ServerError::TopicTerminatedError as i32 {
                    return Err(LinkError::Terminated(why));
                }
                return Err(LinkError::refused(Some(e.error), why));
            }
            if matches(cmd) {
                return Ok(frame);
            }
        }
    }
}

impl LinkError {
    /// A broker's refusal: [`LinkError::Moving`] for `ServiceNotReady`, else [`LinkError::Broker`].
    fn refused(code: Option<i32>, why: String) -> Self {
        if code == Some(ServerError::ServiceNotReady as i32) {
            LinkError::Moving(why)
        } else {
            LinkError::Broker(why)
        }
    }

    /// A lookup's refusal: a bundle being unloaded answers `MetadataError` (Pulsar 3.0 and 4.0),
    /// a move as well.
    fn lookup_refused(code: Option<i32>, why: String) -> Self {
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

fn auth_response(token: Option<String>) -> BaseCommand {
    BaseCommand {
        r#type: Type::AuthResponse as i32,
        auth_response: Some(CommandAuthResponse {
            client_version: Some(format!("rigd-{}", env!("CARGO_PKG_VERSION"))),
            response: Some(AuthData {
                auth_method_name: Some("token".into()),
                auth_data: token.map(String::into_bytes),
            }),
            protocol_version: Some(PROTOCOL_VERSION),
        }),
        ..Default::default()
    }
}

pub fn pong() -> BaseCommand {
    BaseCommand {
        r#type: Type::Pong as i32,
        pong: Some(CommandPong {}),
        ..Default::default()
    }
}

pub fn ping() -> BaseCommand {
    BaseCommand {
        r#type: Type::Ping as i32,
        ping: Some(CommandPing {}),
        ..Default::default()
    }
}

/// A byte stream to a broker: plain TCP or TLS.
pub trait Conn: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Conn for T {}

/// What a producer connection needs to know.
pub struct Setup {
    pub url: String,
    pub topic: String,
    pub producer_name: String,
    pub token: Token,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    next_request: u64,
    /// Which of the service URL's hosts to try first: the one that answered last, and the next
    /// one after a setup that failed (a dead broker is not asked first again).
    next_host: usize,
    /// The service host the last setup went through (`pulsar://host:port`).
    pub service_host: Option<String>,
    /// Every message is end-to-end encrypted: the producer says so, as a namespace whose policy
    /// requires encryption refuses a producer that does not.
    pub encrypted: bool,
    /// How long the broker has to answer each request of the setup (CONNECT, lookups, PRODUCER).
    /// A starting broker takes connections seconds before it answers them, and answers lookups
    /// later still while it loads its topics; a producer coming back after an outage asks with
    /// short deadlines that grow (`session::setup_timeout`), so that an attempt is pending when
    /// the broker starts to answer, never a 10 s one that began just before.
    pub setup_timeout: Duration,
}

impl Setup {
    pub fn new(
        url: String,
        topic: String,
        producer_name: String,
        token: Token,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Self {
        Setup {
            url,
            topic,
            producer_name,
            token,
            tls,
            next_request: 1,
            next_host: 0,
            service_host: None,
            setup_timeout: REQUEST_TIMEOUT,
            encrypted: false,
        }
    }

    /// A setup of its own for another connection to the same topic (same service hosts, name,
    /// token and TLS identity), whose request ids and host choice do not disturb this one's.
    pub(super) fn sibling(&self) -> Setup {
        Setup::new(
            self.url.clone(),
            self.topic.clone(),
            self.producer_name.clone(),
            self.token.clone(),
            self.tls.clone(),
        )
    }

    /// Resolves once one of the service URL's hosts takes a TCP connection again (checked every
    /// [`REACH_EVERY`], each try bounded by [`REACH_TIMEOUT`]): a sign of life that ends a
    /// producer's backoff after an outage. A bare connect and close, no Pulsar handshake: a refused
    /// port answers at once with a reset, a silent link costs one SYN per try.
    pub(super) async fn reachable(&self) {
        let Ok(hosts) = Endpoint::parse_service(&self.url) else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(REACH_EVERY).await;
            for ep in &hosts {
                let addr = ep.addr();
                let tried =
                    tokio::time::timeout(REACH_TIMEOUT, tokio::net::TcpStream::connect(&addr))
                        .await;
                if let Ok(Ok(_)) = tried {
                    return;
                }
            }
        }
    }

    pub(super) fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    async fn open(&mut self, ep: &Endpoint, proxy_to: Option<String>) -> Result<Link, LinkError> {
        let addr = ep.addr();
        let connect_err = |source| LinkError::Connect {
            addr: addr.clone(),
            source,
        };
        // A blackholed SYN answers nothing: the deadline covers name lookup and connect.
        let tcp = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let sa = tokio::net::lookup_host(&addr)
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            let socket = if sa.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            socket.set_send_buffer_size(SEND_BUFFER)?;
            socket.connect(sa).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer (a silent link?)",
            ))
        })
        .map_err(connect_err)?;
        tcp.set_nodelay(true)?;
        let socket = rustix::io::dup(&tcp).map_err(std::io::Error::from)?;
        let stream: Box<dyn Conn> = if ep.tls {
            let tls = self.tls.clone().ok_or_else(|| {
                LinkError::Broker("pulsar+ssl:// without a TLS configuration".into())
            })?;
            let name = rustls_pki_types::ServerName::try_from(ep.host.clone())
                .map_err(|e| LinkError::Broker(format!("TLS server name `{}`: {e}", ep.host)))?;
            let s = tokio::time::timeout(
                REQUEST_TIMEOUT,
                tokio_rustls::TlsConnector::from(tls).connect(name, tcp),
            )
            .await
            .map_err(|_| LinkError::Timeout(format!("TLS handshake with {addr}")))?
            .map_err(|source| LinkError::Connect {
                addr: format!("{addr} (TLS)"),
                source,
            })?;
            Box::new(s)
        } else {
            Box::new(tcp)
        };
        let (mut read, writer) = tokio::io::split(stream);
        let (tx, inbound) = mpsc::channel(1024);
        let reader = tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(64 << 10);
            loop {
                match read.read_buf(&mut buf).await {
                    Ok(0) => {
                        let _ = tx.send(Err(LinkError::Closed)).await;
                        return;
                    }
                    Ok(_) => loop {
                        match codec::decode_frame(&mut buf) {
                            Ok(Some(cmd)) => {
                                if tx.send(Ok(cmd)).await.is_err() {
                                    return;
                                }
                            }
                            Ok(None) => break,
                            Err(e) => {
                                let _ = tx.send(Err(e.into())).await;
                                return;
                            }
                        }
                    },
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                }
            }
        });
        let mut link = Link {
            writer,
            inbound,
            reader,
            out: BytesMut::new(),
            max_message_size: 5 << 20,
            producer_id: 1,
            last_inbound: Instant::now(),
            token: self.token.clone(),
            socket,
            request_timeout: self.setup_timeout,
        };
        let token = self.token.current()?;
        // A client certificate is the identity when there is no token: the broker's TLS
        // provider takes the role from the certificate the handshake verified.
        let cert_auth = ep.tls
            && self
                .tls
                .as_ref()
                .is_some_and(|t| t.client_auth_cert_resolver.has_certs());
        let auth_method_name = match &token {
            Some(_) => Some("token".to_string()),
            None if cert_auth => Some("tls".to_string()),
            None => None,
        };
        let connect = CommandConnect {
            client_version: format!("rigd-{}", env!("CARGO_PKG_VERSION")),
            protocol_version: Some(PROTOCOL_VERSION),
            auth_method_name,
            auth_data: token.map(String::into_bytes),
            proxy_to_broker_url: proxy_to,
            // Without this the broker closes the connection when a token expires instead of
            // sending AUTH_CHALLENGE (ServerCnx.refreshAuthenticationCredentials).
            feature_flags: Some(FeatureFlags {
                supports_auth_refresh: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        link.command(BaseCommand {
            r#type: Type::Connect as i32,
            connect: Some(connect),
            ..Default::default()
        })
        .await?;
        // A broker that took the connection and does not answer is not serving yet (it is
        // starting): the same as one that takes no connection, for the producer's pace.
        let connected = match link
            .frame_within("CONNECTED", self.setup_timeout, |c| c.connected.is_some())
            .await
        {
            Err(LinkError::Timeout(_)) => Err(LinkError::Connect {
                addr: addr.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "took the connection, no CONNECTED within {} ms (the broker starting?)",
                        self.setup_timeout.as_millis()
                    ),
                ),
            }),
            r => r.map(|f| f.cmd),
        }?;
        if let Some(size) = connected.connected.and_then(|c| c.max_message_size) {
            link.max_message_size = size.max(64 << 10) as usize;
        }
        Ok(link)
    }

    /// Connects to the first of the service URL's hosts that answers, starting where the last
    /// setup left off.
    async fn open_service(&mut self, hosts: &[Endpoint]) -> Result<(Endpoint, Link), LinkError> {
        let start = self.next_host % hosts.len();
        let mut last = None;
        for k in 0..hosts.len() {
            let i = (start + k) % hosts.len();
            match self.open(&hosts[i], None).await {
                Ok(link) => {
                    self.next_host = i;
                    return Ok((hosts[i].clone(), link));
                }
                Err(e) => {
                    if hosts.len() > 1 {
                        tracing::debug!(host = %hosts[i].addr(), error = %e, "service host unreachable; trying the next");
                    }
                    last = Some(e);
                }
            }
        }
        self.next_host = start + 1;
        Err(last.unwrap_or(LinkError::Closed))
    }

    async fn open_owner(&mut self, owner: &Endpoint) -> Result<Link, LinkError> {
        self.open(owner, None).await.map_err(|e| match e {
            LinkError::Connect { .. } | LinkError::Timeout(_) => LinkError::OwnerUnreachable {
                addr: owner.addr(),
                source: Box::new(e),
            },
            e => e,
        })
    }

    /// Connects, looks the topic up (following redirects), and creates the producer.
    pub async fn establish(&mut self) -> Result<(Link, Option<u64>), LinkError> {
        let link = self.lookup().await?;
        self.create_producer(link).await
    }

    /// How many partitions the topic has (0: not partitioned), asked on a connection of its own
    /// to the service (a partitioned producer watches for partitions added while it runs).
    pub async fn partitions(&mut self) -> Result<u32, LinkError> {
        let hosts = Endpoint::parse_service(&self.url).map_err(LinkError::Broker)?;
        let (_, mut link) = self.open_service(&hosts).await?;
        self.partitions_on(&mut link).await
    }

    async fn partitions_on(&mut self, link: &mut Link) -> Result<u32, LinkError> {
        let id = self.request_id();
        let topic = self.topic.clone();
        link.command(BaseCommand {
            r#type: Type::PartitionedMetadata as i32,
            partition_metadata: Some(CommandPartitionedTopicMetadata {
                topic: topic.clone(),
                request_id: id,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
        let meta = link
            .response("PARTITIONED_METADATA", |c| {
                c.partition_metadata_response.is_some()
            })
            .await?;
        let Some(m) = meta.partition_metadata_response else {
            return Ok(0);
        };
        if let Some(msg) = m.message.filter(|_| m.response == Some(1)) {
            return Err(LinkError::refused(
                m.error,
                format!(
                    "partitioned metadata of {topic}: {msg} ({})",
                    m.error.map_or("no code", server_error)
                ),
            ));
        }
        Ok(m.partitions.unwrap_or(0))
    }

    /// Connects to the service, learns whether the topic is partitioned and looks it up (following
    /// redirects): a connection to the broker that owns the topic.
    pub(super) async fn lookup(&mut self) -> Result<Link, LinkError> {
        let hosts = Endpoint::parse_service(&self.url).map_err(LinkError::Broker)?;
        let (service, mut link) = self.open_service(&hosts).await?;
        self.service_host = Some(service.url());

        let topic = self.topic.clone();
        let partitions = self.partitions_on(&mut link).await?;
        if partitions > 0 {
            return Err(LinkError::Partitioned { topic, partitions });
        }

        let mut authoritative = false;
        for _hop in 0..8 {
            let id = self.request_id();
            link.command(BaseCommand {
                r#type: Type::Lookup as i32,
                lookup_topic: Some(CommandLookupTopic {
                    topic: topic.clone(),
                    request_id: id,
                    authoritative: Some(authoritative),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?;
            let r = link
                .response("LOOKUP", |c| c.lookup_topic_response.is_some())
                .await?;
            let r = r.lookup_topic_response.unwrap_or_default();
            let broker = if service.tls {
                r.broker_service_url_tls.clone()
            } else {
                r.broker_service_url.clone()
            };
            let broker = match broker.filter(|b| !b.is_empty()) {
                Some(b) => Some(Endpoint::parse(&b).map_err(LinkError::Broker)?),
                None => None,
            };
            match r.response.and_then(|v| LookupType::try_from(v).ok()) {
                Some(LookupType::Connect) => {
                    match broker {
                        Some(b) if r.proxy_through_service_url() => {
                            link = self.open(&service, Some(b.addr())).await?;
                        }
                        Some(b) if b != service => link = self.open_owner(&b).await?,
                        _ => {}
                    }
                    return Ok(link);
                }
                Some(LookupType::Redirect) => {
                    authoritative = r.authoritative.unwrap_or(false);
                    let b = broker.ok_or_else(|| {
                        LinkError::Broker(format!(
                            "lookup of {topic}: redirect without a broker URL"
                        ))
                    })?;
                    link = self.open_owner(&b).await?;
                }
                _ => {
                    return Err(LinkError::lookup_refused(
                        r.error,
                        format!(
                            "lookup of {topic} failed: {} ({})",
                            r.message.unwrap_or_else(|| "no reason given".into()),
                            r.error.map_or("no code", server_error)
                        ),
                    ))
                }
            }
        }
        Err(LinkError::Broker(format!(
            "lookup of {topic}: too many redirects"
        )))
    }

    /// Creates the producer; returns the link and the broker's last sequence id for the name.
    async fn create_producer(&mut self, mut link: Link) -> Result<(Link, Option<u64>), LinkError> {
        let id = self.request_id();
        link.command(BaseCommand {
            r#type: Type::Producer as i32,
            producer: Some(CommandProducer {
                topic: self.topic.clone(),
                producer_id: link.producer_id,
                request_id: id,
                producer_name: Some(self.producer_name.clone()),
                user_provided_producer_name: Some(true),
                encrypted: Some(self.encrypted),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
        loop {
            let r = link
                .response("PRODUCER_SUCCESS", |c| c.producer_success.is_some())
                .await?;
            let s = r.producer_success.unwrap_or_default();
            if s.producer_ready.unwrap_or(true) {
                let last = s.last_sequence_id.filter(|v| *v >= 0).map(|v| v as u64);
                return Ok((link, last));
            }
        }
    }
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
