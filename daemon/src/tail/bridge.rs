//! A client certificate for the `pulsar` crate's clients (`rigd tail`, `rigd recall`, `rigd
//! live`). The crate's TLS has no client authentication (pulsar-rs issue 197), so with
//! `--tls-cert-file` the crate talks plain Pulsar to a listener of this process on 127.0.0.1, and
//! the bridge opens the TLS session to the broker with the certificate (rustls, configured by
//! [`crate::uplink::tls_config`] as the daemon's own uplink is) and carries the bytes both ways.
//!
//! Invariants:
//! - Every connection the crate makes goes through a bridge, never in the clear to a broker: a
//!   broker's lookup answer names the broker that serves the topic (`pulsar+ssl://b2:6651`), and
//!   the bridge rewrites it, in the answer, to a listener of its own for that broker (created on
//!   the first answer naming it). The clear `pulsar://` URL of an answer is replaced, never used.
//! - A listener serves only its own user: a connection whose socket belongs to another uid
//!   (`/proc/net/tcp`) is closed before any byte goes to the broker, since the session carries
//!   this user's certificate.
//! - Listeners and connections live as long as the [`Bridge`] value: dropping it aborts them.
//!
//! Frames from the broker are read whole (`[total u32][cmd size u32][BaseCommand][payload]`) and
//! passed on unchanged, except a lookup answer, which is decoded, rewritten and encoded again.

use bytes::{Bytes, BytesMut};
use prost::Message as _;
use pulsar::proto::{base_command::Type, BaseCommand};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::service::Endpoint;

/// The largest frame carried: a chunk or a message is at most the broker's `maxMessageSize`.
const MAX_FRAME: usize = 128 << 20;

/// The listeners (one per broker) and their connections; dropped: all closed.
pub struct Bridge {
    shared: Arc<Shared>,
}

struct Shared {
    tls: Arc<rustls::ClientConfig>,
    /// Broker address (`host:port`) -> the loopback listener for it.
    listeners: Mutex<HashMap<String, u16>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for t in self
            .shared
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl Bridge {
    /// Listeners for every broker of `url` (`pulsar+ssl://`); returns the bridge and the plain
    /// service URL the crate is to connect to.
    pub async fn start(
        url: &str,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<(Bridge, String), String> {
        let brokers = Endpoint::parse_service(url)?;
        let shared = Arc::new(Shared {
            tls,
            listeners: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
        });
        let mut local = Vec::with_capacity(brokers.len());
        for b in brokers {
            let port = shared.listener_for(&b).await?;
            local.push(format!("127.0.0.1:{port}"));
        }
        Ok((Bridge { shared }, format!("pulsar://{}", local.join(","))))
    }
}

impl Shared {
    /// The loopback port carrying to `broker`, bound on first use.
    async fn listener_for(self: &Arc<Self>, broker: &Endpoint) -> Result<u16, String> {
        let addr = broker.addr();
        if let Some(port) = self.lock_listeners().get(&addr) {
            return Ok(*port);
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot listen on 127.0.0.1 for the TLS bridge: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("TLS bridge: {e}"))?
            .port();
        let mut listeners = self.lock_listeners();
        // Another lookup answer may have bound one meanwhile: keep the first.
        if let Some(port) = listeners.get(&addr) {
            return Ok(*port);
        }
        listeners.insert(addr, port);
        drop(listeners);
        let me = Arc::clone(self);
        let broker = broker.clone();
        self.spawn(me.accept(listener, broker));
        Ok(port)
    }

    fn lock_listeners(&self) -> std::sync::MutexGuard<'_, HashMap<String, u16>> {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(tokio::spawn(f));
    }

    /// Boxed: a connection's lookup answers start listeners, which start connections.
    fn accept(
        self: Arc<Self>,
        listener: TcpListener,
        broker: Endpoint,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move { self.serve(listener, broker).await })
    }

    async fn serve(self: Arc<Self>, listener: TcpListener, broker: Endpoint) {
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        loop {
            let (client, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "TLS bridge: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let own = std::fs::read_to_string("/proc/net/tcp")
                .ok()
                .and_then(|t| socket_uid(&t, peer.port(), port))
                .is_some_and(|uid| Some(uid) == own_uid());
            if !own {
                tracing::warn!(%peer, "TLS bridge: a connection from another user refused");
                continue;
            }
            let me = Arc::clone(&self);
            let broker = broker.clone();
            self.spawn(async move {
                if let Err(e) = me.carry(client, &broker).await {
                    tracing::debug!(broker = %broker.addr(), error = %e, "TLS bridge: connection ended");
                }
            });
        }
    }

    /// One connection: TLS to the broker, then bytes both ways (lookup answers rewritten).
    async fn carry(self: Arc<Self>, client: TcpStream, broker: &Endpoint) -> std::io::Result<()> {
        client.set_nodelay(true)?;
        let tcp = TcpStream::connect(broker.addr()).await?;
        tcp.set_nodelay(true)?;
        let name = rustls_pki_types::ServerName::try_from(broker.host.clone())
            .map_err(|e| std::io::Error::other(format!("TLS server name {}: {e}", broker.host)))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
            .connect(name, tcp)
            .await?;
        let (mut from_broker, mut to_broker) = tokio::io::split(tls);
        let (mut from_client, mut to_client) = client.into_split();
        let up = async {
            tokio::io::copy(&mut from_client, &mut to_broker).await?;
            to_broker.shutdown().await
        };
        let down = async {
            let mut buf = BytesMut::with_capacity(64 << 10);
            loop {
                let Some(frame) = read_frame(&mut from_broker, &mut buf).await? else {
                    return to_client.shutdown().await;
                };
                let frame = self.rewrite(frame).await?;
                to_client.write_all(&frame).await?;
            }
        };
        tokio::try_join!(up, down).map(|_| ())
    }

    /// A lookup answer naming a broker gets this bridge's listener for it as the broker's plain
    /// URL (and no TLS URL: the crate connects in the clear, to the bridge); other frames pass.
    async fn rewrite(self: &Arc<Self>, frame: Bytes) -> std::io::Result<Bytes> {
        let cmd_size = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]) as usize;
        if frame.len() != cmd_size + 8 {
            return Ok(frame); // a frame with a payload: a message, never a lookup answer
        }
        let Ok(mut cmd) = BaseCommand::decode(&frame[8..]) else {
            return Ok(frame);
        };
        if cmd.r#type != Type::LookupResponse as i32 {
            return Ok(frame);
        }
        let Some(answer) = cmd.lookup_topic_response.as_mut() else {
            return Ok(frame);
        };
        let Some(url) = answer.broker_service_url_tls.take() else {
            // No TLS URL: the broker has none (or the lookup failed); the plain URL must not be
            // followed in the clear either.
            answer.broker_service_url = None;
            return Ok(encode(&cmd));
        };
        let broker = Endpoint::parse(&url).map_err(std::io::Error::other)?;
        if answer.proxy_through_service_url == Some(true) {
            // Through a proxy: the crate connects to the service URL (a bridge already) and names
            // the broker to the proxy, by the address the proxy knows it by, the TLS one.
            answer.broker_service_url = Some(format!("pulsar://{}", broker.addr()));
            return Ok(encode(&cmd));
        }
        let port = self
            .listener_for(&broker)
            .await
            .map_err(std::io::Error::other)?;
        answer.broker_service_url = Some(format!("pulsar://127.0.0.1:{port}"));
        Ok(encode(&cmd))
    }
}

fn encode(cmd: &BaseCommand) -> Bytes {
    let size = cmd.encoded_len();
    let mut out = Vec::with_capacity(size + 8);
    out.extend_from_slice(&(size as u32 + 4).to_be_bytes());
    out.extend_from_slice(&(size as u32).to_be_bytes());
    cmd.encode_raw(&mut out);
    out.into()
}

/// This process's effective uid (the owner of its /proc entry).
fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// One whole frame (with its size prefix), or `None` at a clean end of stream.
async fn read_frame(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut BytesMut,
) -> std::io::Result<Option<Bytes>> {
    loop {
        if buf.len() >= 8 {
            let total = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            let cmd = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
            if total > MAX_FRAME || cmd + 4 > total {
                return Err(std::io::Error::other(format!(
                    "a frame of {total} bytes (command {cmd}) from the broker"
                )));
            }
            if buf.len() >= total + 4 {
                return Ok(Some(buf.split_to(total + 4).freeze()));
            }
            buf.reserve(total + 4 - buf.len());
        }
        if r.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
    }
}

/// The uid owning the IPv4 loopback socket `127.0.0.1:local` connected to `127.0.0.1:remote`,
/// from the text of `/proc/net/tcp`. Pure.
fn socket_uid(proc_net_tcp: &str, local: u16, remote: u16) -> Option<u32> {
    let want_local = format!("0100007F:{local:04X}");
    let want_remote = format!("0100007F:{remote:04X}");
    proc_net_tcp.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 7 && f[1] == want_local && f[2] == want_remote)
            .then(|| f[7].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_of_a_loopback_socket_is_read_from_proc_net_tcp() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1\n\
           1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 2 1\n\
           2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 3 1\n";
        assert_eq!(socket_uid(text, 0xC350, 0x1F90), Some(1001));
        assert_eq!(socket_uid(text, 0x1F90, 0xC350), Some(1000));
        assert_eq!(socket_uid(text, 0xC351, 0x1F90), None);
    }

    #[tokio::test]
    async fn frames_are_read_whole_across_reads() {
        let mut cmd = BaseCommand {
            r#type: Type::Ping as i32,
            ..Default::default()
        };
        cmd.ping = Some(Default::default());
        let one = encode(&cmd);
        let mut stream: Vec<u8> = one.to_vec();
        stream.extend_from_slice(&one);
        let mut r = &stream[..];
        let mut buf = BytesMut::new();
        assert_eq!(read_frame(&mut r, &mut buf).await.unwrap().unwrap(), one);
        assert_eq!(read_frame(&mut r, &mut buf).await.unwrap().unwrap(), one);
        assert!(read_frame(&mut r, &mut buf).await.unwrap().is_none());
        let mut cut = &one[..one.len() - 1];
        assert!(read_frame(&mut cut, &mut BytesMut::new()).await.is_err());
    }

    #[tokio::test]
    async fn a_lookup_answer_names_a_listener_of_the_bridge_and_no_clear_url() {
        let tls = crate::uplink::tls_config(None, None).unwrap();
        let (bridge, url) = Bridge::start("pulsar+ssl://broker.example:6651", tls)
            .await
            .unwrap();
        assert!(url.starts_with("pulsar://127.0.0.1:"), "{url}");
        let answer = BaseCommand {
            r#type: Type::LookupResponse as i32,
            lookup_topic_response: Some(pulsar::proto::CommandLookupTopicResponse {
                broker_service_url: Some("pulsar://b2.example:6650".into()),
                broker_service_url_tls: Some("pulsar+ssl://b2.example:6651".into()),
                request_id: 7,
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = bridge.shared.rewrite(encode(&answer)).await.unwrap();
        let got = BaseCommand::decode(&out[8..]).unwrap();
        let r = got.lookup_topic_response.unwrap();
        let port = bridge.shared.lock_listeners()["b2.example:6651"];
        assert_eq!(
            r.broker_service_url,
            Some(format!("pulsar://127.0.0.1:{port}"))
        );
        assert_eq!((r.broker_service_url_tls, r.request_id), (None, 7));
        // The same broker again: the same listener.
        let again = bridge.shared.rewrite(encode(&answer)).await.unwrap();
        assert_eq!(again, out);
        // An answer with a clear URL only: the URL is dropped, never followed in the clear.
        let mut clear = answer.clone();
        clear
            .lookup_topic_response
            .as_mut()
            .unwrap()
            .broker_service_url_tls = None;
        let out = bridge.shared.rewrite(encode(&clear)).await.unwrap();
        let r = BaseCommand::decode(&out[8..])
            .unwrap()
            .lookup_topic_response
            .unwrap();
        assert_eq!(r.broker_service_url, None);
    }
}
