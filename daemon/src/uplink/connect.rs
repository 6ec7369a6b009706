//! Producer setup: the rig's connection to the service (dialled if the pool has none: TCP with a
//! bounded send buffer or TLS, `CONNECT` with token auth), `PARTITIONED_METADATA`, `LOOKUP` with
//! redirects (to the owner's connection), `PRODUCER` under a stable name. Every step has a
//! deadline; the caller also races the whole setup against shutdown.

use bytes::BytesMut;
use pulsar::proto::{
    base_command::Type, command_lookup_topic_response::LookupType, BaseCommand,
    CommandCloseProducer, CommandConnect, CommandLookupTopic, CommandPartitionedTopicMetadata,
    CommandProducer, FeatureFlags,
};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::service::Endpoint;

use super::codec::{self, PROTOCOL_VERSION};
use super::error::{server_error, LinkError};
use super::pool::{self, ChannelEnd, Conn, Connection, Dialed, Pool};
use super::token::Token;
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

/// A producer's place on a shared [`Connection`]: the broker's commands for it, and a buffer of
/// whole frames it encodes before it queues them on the connection.
pub struct Link {
    pub conn: Arc<Connection>,
    pub channel: ChannelEnd,
    pub out: codec::Frames,
    pub max_message_size: usize,
    pub producer_id: u64,
    /// How long a request waits: the setup's deadline (see `Setup::setup_timeout`).
    pub request_timeout: Duration,
    /// The broker holds a producer under [`Link::producer_id`] (closed when the link goes).
    open: bool,
}

impl Drop for Link {
    fn drop(&mut self) {
        let close = self
            .open
            .then(|| close_producer(self.producer_id, self.conn.next_id()));
        self.conn.detach(self.producer_id, close);
    }
}

impl Link {
    /// Queues what `out` holds on the connection.
    pub fn push(&mut self) -> Result<(), LinkError> {
        if self.out.is_empty() {
            return Ok(());
        }
        self.conn
            .push(self.producer_id, std::mem::take(&mut self.out))
    }

    /// Closes the producer on the broker and waits for its answer (bounded), so that the next
    /// producer under the same name on this connection is not refused as a duplicate. A close
    /// the broker does not answer in time ends the connection.
    ///
    /// The channel is detached first, its queued frames dropped (none is begun: the writer takes
    /// a frame whole; the window holds them all): the close is a control command, written before
    /// any frame, and a SEND of this producer after it would make the broker close the whole
    /// connection ("producer is not ready"), every other producer on it failing (issue 46.2).
    pub async fn close(mut self) {
        self.open = false;
        self.conn.detach(self.producer_id, None);
        let id = self.conn.next_id();
        let r = self
            .conn
            .request(
                id,
                close_producer(self.producer_id, id),
                "CLOSE_PRODUCER's SUCCESS",
                self.request_timeout,
                |c| c.success.is_some(),
            )
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "producer close unanswered; ending its connection");
            self.conn.fail(&e);
        }
    }
}

fn close_producer(producer_id: u64, request_id: u64) -> BaseCommand {
    BaseCommand {
        r#type: Type::CloseProducer as i32,
        close_producer: Some(CommandCloseProducer {
            producer_id,
            request_id,
        }),
        ..Default::default()
    }
}

/// What a producer connection needs to know.
pub struct Setup {
    pub url: String,
    pub topic: String,
    pub producer_name: String,
    pub token: Token,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The rig's connections (one per link and broker), shared by its producers.
    pub pool: Arc<Pool>,
    /// The link this setup goes over, chosen at its start (`Pool::take`).
    path: Option<Arc<super::links::Path>>,
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

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            p.release();
        }
    }
}

impl Setup {
    pub fn new(
        url: String,
        topic: String,
        producer_name: String,
        token: Token,
        tls: Option<Arc<rustls::ClientConfig>>,
        pool: Arc<Pool>,
    ) -> Self {
        Setup {
            url,
            topic,
            producer_name,
            token,
            tls,
            pool,
            path: None,
            next_host: 0,
            service_host: None,
            setup_timeout: REQUEST_TIMEOUT,
            encrypted: false,
        }
    }

    /// A setup of its own for the same topic (same service hosts, name, token, TLS identity and
    /// connections), whose host choice does not disturb this one's.
    pub(super) fn sibling(&self) -> Setup {
        Setup::new(
            self.url.clone(),
            self.topic.clone(),
            self.producer_name.clone(),
            self.token.clone(),
            self.tls.clone(),
            self.pool.clone(),
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

    /// The rig's connection to `ep` (through it to `proxy_to`), opened if there is none.
    async fn open(
        &mut self,
        ep: &Endpoint,
        proxy_to: Option<String>,
    ) -> Result<Arc<Connection>, LinkError> {
        let key = format!(
            "{}{}",
            ep.url(),
            proxy_to
                .as_deref()
                .map_or(String::new(), |p| format!(" via {p}"))
        );
        let path = match &self.path {
            Some(p) => p.clone(),
            None => self.choose_path(),
        };
        let dial = self.dial(ep, proxy_to, path.interface.clone());
        self.pool.connection(key, &path, dial).await
    }

    /// A new setup chooses its link again (`Pool::take`): where it goes now.
    fn choose_path(&mut self) -> Arc<super::links::Path> {
        let path = self.pool.take();
        if let Some(old) = self.path.replace(path.clone()) {
            old.release();
        }
        path
    }

    /// TCP (or TLS) to `ep` and CONNECT, each step within its deadline.
    fn dial(
        &self,
        ep: &Endpoint,
        proxy_to: Option<String>,
        interface: Option<String>,
    ) -> impl std::future::Future<Output = Result<Dialed, LinkError>> + 'static {
        let ep = ep.clone();
        let tls = self.tls.clone();
        let token_source = self.token.clone();
        let setup_timeout = self.setup_timeout;
        async move {
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
                let socket = pool::bound_socket(sa, interface.as_deref())?;
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
            let cert_auth = ep.tls
                && tls
                    .as_ref()
                    .is_some_and(|t| t.client_auth_cert_resolver.has_certs());
            let mut stream: Box<dyn Conn> = if ep.tls {
                let tls = tls.ok_or_else(|| {
                    LinkError::Broker("pulsar+ssl:// without a TLS configuration".into())
                })?;
                let name =
                    rustls_pki_types::ServerName::try_from(ep.host.clone()).map_err(|e| {
                        LinkError::Broker(format!("TLS server name `{}`: {e}", ep.host))
                    })?;
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
            let token = token_source.current()?;
            // A client certificate is the identity when there is no token: the broker's TLS
            // provider takes the role from the certificate the handshake verified.
            let auth_method_name = match &token {
                Some(_) => Some("token".to_string()),
                None if cert_auth => Some("tls".to_string()),
                None => None,
            };
            let connect = BaseCommand {
                r#type: Type::Connect as i32,
                connect: Some(CommandConnect {
                    client_version: format!("rigd-{}", env!("CARGO_PKG_VERSION")),
                    protocol_version: Some(PROTOCOL_VERSION),
                    auth_method_name,
                    auth_data: token.map(String::into_bytes),
                    proxy_to_broker_url: proxy_to,
                    // Without this the broker closes the connection when a token expires
                    // instead of sending AUTH_CHALLENGE
                    // (ServerCnx.refreshAuthenticationCredentials).
                    feature_flags: Some(FeatureFlags {
                        supports_auth_refresh: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let mut out = BytesMut::new();
            codec::encode_command(&connect, &mut out);
            tokio::time::timeout(REQUEST_TIMEOUT, stream.write_all(&out))
                .await
                .map_err(|_| LinkError::Timeout("the broker to take CONNECT".into()))??;
            // A broker that took the connection and does not answer is not serving yet (it is
            // starting): the same as one that takes no connection, for the producer's pace.
            let mut rest = BytesMut::with_capacity(4096);
            let connected = match tokio::time::timeout(
                setup_timeout,
                connected(&mut stream, &mut rest),
            )
            .await
            {
                Err(_) => Err(LinkError::Connect {
                    addr: addr.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "took the connection, no CONNECTED within {} ms (the broker starting?)",
                            setup_timeout.as_millis()
                        ),
                    ),
                }),
                Ok(r) => r,
            }?;
            Ok(Dialed {
                stream,
                socket,
                addr,
                max_message_size: connected
                    .max_message_size
                    .map_or(5 << 20, |size| size.max(64 << 10) as usize),
                token: token_source,
                rest,
            })
        }
    }

    /// Connects to the first of the service URL's hosts that answers, starting where the last
    /// setup left off.
    async fn open_service(
        &mut self,
        hosts: &[Endpoint],
    ) -> Result<(Endpoint, Arc<Connection>), LinkError> {
        let start = self.next_host % hosts.len();
        let mut last = None;
        for k in 0..hosts.len() {
            let i = (start + k) % hosts.len();
            match self.open(&hosts[i], None).await {
                Ok(conn) => {
                    self.next_host = i;
                    return Ok((hosts[i].clone(), conn));
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

    async fn open_owner(&mut self, owner: &Endpoint) -> Result<Arc<Connection>, LinkError> {
        self.open(owner, None).await.map_err(|e| match e {
            LinkError::Connect { .. } | LinkError::Timeout(_) => LinkError::OwnerUnreachable {
                addr: owner.addr(),
                source: Box::new(e),
            },
            e => e,
        })
    }

    /// Connects (or shares the rig's connection), looks the topic up (following redirects), and
    /// creates the producer, its frames written at the budget rank `rank` (`held`: told while the
    /// budget holds them back).
    pub async fn establish(
        &mut self,
        rank: Arc<AtomicUsize>,
        held: pool::Held,
    ) -> Result<(Link, Option<u64>), LinkError> {
        let conn = self.lookup().await?;
        self.create_producer(conn, rank, held).await
    }

    /// A request on `conn` within the setup's deadline.
    pub(super) async fn request(
        &self,
        conn: &Connection,
        what: &'static str,
        make: impl FnOnce(u64) -> BaseCommand,
        done: impl Fn(&BaseCommand) -> bool,
    ) -> Result<codec::Inbound, LinkError> {
        let id = conn.next_id();
        conn.request(id, make(id), what, self.setup_timeout, done)
            .await
    }

    /// How many partitions the topic has (0: not partitioned), asked on the rig's connection to
    /// the service (a partitioned producer watches for partitions added while it runs).
    pub async fn partitions(&mut self) -> Result<u32, LinkError> {
        self.choose_path();
        let hosts = Endpoint::parse_service(&self.url).map_err(LinkError::Broker)?;
        let (_, conn) = self.open_service(&hosts).await?;
        self.partitions_on(&conn).await
    }

    async fn partitions_on(&mut self, conn: &Connection) -> Result<u32, LinkError> {
        let topic = self.topic.clone();
        let meta = self
            .request(
                conn,
                "PARTITIONED_METADATA",
                |id| BaseCommand {
                    r#type: Type::PartitionedMetadata as i32,
                    partition_metadata: Some(CommandPartitionedTopicMetadata {
                        topic: topic.clone(),
                        request_id: id,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                |c| c.partition_metadata_response.is_some(),
            )
            .await?
            .cmd;
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
    /// redirects): the rig's connection to the broker that owns the topic.
    pub(super) async fn lookup(&mut self) -> Result<Arc<Connection>, LinkError> {
        self.choose_path();
        let hosts = Endpoint::parse_service(&self.url).map_err(LinkError::Broker)?;
        let (service, mut conn) = self.open_service(&hosts).await?;
        self.service_host = Some(service.url());

        let topic = self.topic.clone();
        let partitions = self.partitions_on(&conn).await?;
        if partitions > 0 {
            return Err(LinkError::Partitioned { topic, partitions });
        }

        let mut authoritative = false;
        for _hop in 0..8 {
            let r = self
                .request(
                    &conn,
                    "LOOKUP",
                    |id| BaseCommand {
                        r#type: Type::Lookup as i32,
                        lookup_topic: Some(CommandLookupTopic {
                            topic: topic.clone(),
                            request_id: id,
                            authoritative: Some(authoritative),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    |c| c.lookup_topic_response.is_some(),
                )
                .await?
                .cmd;
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
                            conn = self.open(&service, Some(b.addr())).await?;
                        }
                        Some(b) if b != service => conn = self.open_owner(&b).await?,
                        _ => {}
                    }
                    return Ok(conn);
                }
                Some(LookupType::Redirect) => {
                    authoritative = r.authoritative.unwrap_or(false);
                    let b = broker.ok_or_else(|| {
                        LinkError::Broker(format!(
                            "lookup of {topic}: redirect without a broker URL"
                        ))
                    })?;
                    conn = self.open_owner(&b).await?;
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

    /// Creates the producer on `conn`; returns its link and the broker's last sequence id for
    /// the name.
    async fn create_producer(
        &mut self,
        conn: Arc<Connection>,
        rank: Arc<AtomicUsize>,
        held: pool::Held,
    ) -> Result<(Link, Option<u64>), LinkError> {
        let channel = conn.attach(rank, held)?;
        let mut link = Link {
            max_message_size: conn.max_message_size(),
            producer_id: channel.id,
            conn,
            channel,
            out: codec::Frames::default(),
            request_timeout: self.setup_timeout,
            open: true,
        };
        let (topic, name, encrypted) = (
            self.topic.clone(),
            self.producer_name.clone(),
            self.encrypted,
        );
        let producer_id = link.producer_id;
        let r = self
            .request(
                &link.conn,
                "PRODUCER_SUCCESS",
                |id| BaseCommand {
                    r#type: Type::Producer as i32,
                    producer: Some(CommandProducer {
                        topic,
                        producer_id,
                        request_id: id,
                        producer_name: Some(name),
                        user_provided_producer_name: Some(true),
                        encrypted: Some(encrypted),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                // A producer waiting for the topic's exclusive access is answered twice.
                |c| {
                    c.producer_success
                        .as_ref()
                        .is_some_and(|s| s.producer_ready.unwrap_or(true))
                },
            )
            .await;
        let s = match r {
            Ok(r) => r.cmd.producer_success.unwrap_or_default(),
            Err(e) => {
                // Refused or unanswered: nothing to close on the broker.
                link.open = !matches!(
                    e,
                    LinkError::Broker(_) | LinkError::Moving(_) | LinkError::Terminated(_)
                );
                return Err(e);
            }
        };
        let last = s.last_sequence_id.filter(|v| *v >= 0).map(|v| v as u64);
        Ok((link, last))
    }
}

/// Reads until CONNECTED; what the broker sent after it stays in `rest`.
async fn connected(
    stream: &mut Box<dyn Conn>,
    rest: &mut BytesMut,
) -> Result<pulsar::proto::CommandConnected, LinkError> {
    loop {
        while let Some(frame) = codec::decode_frame(rest)? {
            let cmd = frame.cmd;
            if let Some(c) = cmd.connected {
                return Ok(c);
            }
            if let Some(e) = cmd.error {
                let why = format!(
                    "{} ({}) instead of CONNECTED",
                    e.message,
                    server_error(e.error)
                );
                return Err(LinkError::refused(Some(e.error), why));
            }
        }
        if stream.read_buf(rest).await? == 0 {
            return Err(LinkError::Closed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::proto::{CommandSend, MessageMetadata};

    /// A SEND of `bytes` for producer `producer_id`.
    fn send(producer_id: u64, sequence_id: u64, bytes: usize) -> codec::Frames {
        let cmd = BaseCommand {
            r#type: Type::Send as i32,
            send: Some(CommandSend {
                producer_id,
                sequence_id,
                ..Default::default()
            }),
            ..Default::default()
        };
        let metadata = MessageMetadata {
            producer_name: "rigd-van-cam".into(),
            sequence_id,
            ..Default::default()
        };
        // Written as the window writes: a large payload referenced, in a vectored write.
        let mut out = codec::Frames::default();
        out.send(&cmd, &metadata, bytes::Bytes::from(vec![7u8; bytes]));
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producer_closed_by_rigd_sends_nothing_after_its_close_producer() {
        // Issue 46.2: the close of a producer rigd gives up on (a SEND_ERROR it reconnects on) went
        // out as a control command, ahead of the SENDs still queued on the producer's channel. The
        // broker then saw a SEND for a producer it had removed and closed the whole connection,
        // every other producer on it included. Its queued frames are dropped first now: nothing of
        // it follows the close on the wire.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let rig = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut broker, _) = listener.accept().await.unwrap();
        let socket = rustix::io::dup(&rig).unwrap();
        let pool = Pool::new(None);
        let dialed = Dialed {
            stream: Box::new(rig),
            socket,
            addr: addr.to_string(),
            max_message_size: 5 << 20,
            token: Token::None,
            rest: BytesMut::new(),
        };
        let path = pool.take();
        let conn = pool
            .connection("b".into(), &path, async { Ok(dialed) })
            .await
            .unwrap();
        let attach = || conn.attach(Arc::new(AtomicUsize::new(0)), Arc::new(|| {}));
        let (closed, other) = (attach().unwrap(), attach().unwrap());
        let (closed_id, other_id) = (closed.id, other.id);
        // The broker reads nothing yet: the socket fills and frames stay queued on the channel.
        for seq in 0..48 {
            conn.push(closed_id, send(closed_id, seq, 1 << 20)).unwrap();
        }
        conn.push(other_id, send(other_id, 0, 1000)).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(conn.progress(closed_id).1 > 0, "frames still queued");
        let link = Link {
            max_message_size: 5 << 20,
            producer_id: closed_id,
            conn: conn.clone(),
            channel: closed,
            out: codec::Frames::default(),
            request_timeout: Duration::from_secs(3),
            open: true,
        };
        let close = tokio::spawn(link.close());
        // The broker reads everything the rig writes until the close comes, then answers it.
        let mut buf = BytesMut::new();
        let mut seen = Vec::new();
        let mut close_request = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while close_request.is_none() {
            let n = tokio::time::timeout_at(deadline, broker.read_buf(&mut buf))
                .await
                .expect("the close reaches the broker")
                .unwrap();
            assert!(n > 0, "the connection ended");
            while let Some(f) = codec::decode_frame(&mut buf).unwrap() {
                if let Some(c) = &f.cmd.close_producer {
                    close_request = Some((c.producer_id, c.request_id));
                }
                seen.push(f.cmd);
            }
        }
        let (producer_id, request_id) = close_request.unwrap();
        assert_eq!(producer_id, closed_id);
        // Whatever the socket still holds comes next.
        let mut after = Vec::new();
        while let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(500), broker.read_buf(&mut buf)).await
        {
            if n == 0 {
                break;
            }
            while let Some(f) = codec::decode_frame(&mut buf).unwrap() {
                after.push(f.cmd);
            }
        }
        let sends_after: Vec<u64> = after
            .iter()
            .filter_map(|c| c.send.as_ref())
            .filter(|s| s.producer_id == closed_id)
            .map(|s| s.sequence_id)
            .collect();
        assert!(
            sends_after.is_empty(),
            "SENDs of the closed producer after its CLOSE_PRODUCER: {sends_after:?}"
        );
        // The close is a request: answered, it returns and the connection serves the others.
        let mut success = BytesMut::new();
        codec::encode_command(
            &BaseCommand {
                r#type: Type::Success as i32,
                success: Some(pulsar::proto::CommandSuccess {
                    request_id,
                    ..Default::default()
                }),
                ..Default::default()
            },
            &mut success,
        );
        broker.write_all(&success).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), close)
            .await
            .expect("the close returns once answered")
            .unwrap();
        assert!(conn.failure().is_none(), "the connection still serves");
        let other_sent = seen
            .iter()
            .chain(&after)
            .filter_map(|c| c.send.as_ref())
            .any(|s| s.producer_id == other_id);
        assert!(other_sent, "the other producer's frame went out");
    }
}
