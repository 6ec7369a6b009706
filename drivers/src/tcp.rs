//! What the kernel knows of a TCP connection that the socket API does not say (`TCP_INFO`):
//! whether the peer still acknowledges what was sent (the uplink judges a link silent by it,
//! `rigd::uplink::links`), and whether bytes wait on the path (the estimator tells a link's queue
//! from a broker slow to answer by it, `rigd::uplink::estimate`).

#![allow(unsafe_code)] // getsockopt(TCP_INFO); every block says why it is sound

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// The socket's `tcp_info` and how many of its bytes the kernel filled. None: not a TCP socket,
/// or the call failed.
fn info(socket: BorrowedFd<'_>) -> Option<(libc::tcp_info, usize)> {
    // SAFETY: tcp_info is a plain C struct of integers, valid zeroed; getsockopt writes at most
    // `len` bytes into it and reports how many in `len`.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid descriptor for the borrow's life, and a pointer/length pair to `info`.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some((info, len as usize))
}

/// (Segments sent and not yet acknowledged, time since the last ACK arrived) of a TCP socket.
/// None: not a TCP socket, or the call failed.
pub fn acks(socket: BorrowedFd<'_>) -> Option<(u32, Duration)> {
    let (info, _) = info(socket)?;
    Some((
        info.tcpi_unacked,
        Duration::from_millis(info.tcpi_last_ack_recv.into()),
    ))
}

/// Where a TCP connection's bytes wait, as its kernel sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// The smoothed RTT above the smallest the connection has seen (the kernel's window of it is
    /// 5 minutes): the time a segment now waits in queues on the path (the host's qdisc, a
    /// modem's buffer), not the peer's application.
    pub rtt_over_min: Duration,
    /// Bytes written to the socket and not yet sent (a congestion window or the peer's receive
    /// window holds them).
    pub notsent: u64,
}

/// Where the bytes of a TCP socket wait ([`Queued`]). None: not a TCP socket, the call failed,
/// or a kernel older than 4.6 (no `tcpi_notsent_bytes`, `tcpi_min_rtt`).
pub fn queued(socket: BorrowedFd<'_>) -> Option<Queued> {
    let (info, len) = info(socket)?;
    if len < std::mem::offset_of!(libc::tcp_info, tcpi_min_rtt) + 4 || info.tcpi_min_rtt == 0 {
        return None;
    }
    Some(Queued {
        rtt_over_min: Duration::from_micros(info.tcpi_rtt.saturating_sub(info.tcpi_min_rtt).into()),
        notsent: info.tcpi_notsent_bytes.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A loopback connection (ours, the peer's) with "hello" written and 50 ms for its ACK.
    fn connected() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        c.write_all(b"hello").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        (c, peer)
    }

    #[test]
    fn a_loopback_connection_has_its_bytes_acknowledged_and_a_file_is_no_socket() {
        let (c, _peer) = connected();
        let (unacked, since_ack) = acks(c.as_fd()).unwrap();
        assert_eq!(unacked, 0);
        assert!(since_ack < Duration::from_secs(1), "{since_ack:?}");
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(acks(f.as_fd()).is_none());
        assert!(queued(f.as_fd()).is_none());
    }

    #[test]
    fn a_peer_that_stops_reading_leaves_bytes_unsent_while_the_path_has_no_queue() {
        let (mut c, _peer) = connected();
        let q = queued(c.as_fd()).unwrap();
        assert_eq!(q.notsent, 0);
        assert!(q.rtt_over_min < Duration::from_millis(50), "{q:?}");
        // The peer reads nothing: its receive window fills and the rest waits in ours.
        c.set_nonblocking(true).unwrap();
        let block = vec![0u8; 1 << 16];
        let mut wrote = 0usize;
        while wrote < 64 << 20 {
            match c.write(&block) {
                Ok(n) => wrote += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        let q = queued(c.as_fd()).unwrap();
        assert!(q.notsent > 0, "{q:?} after {wrote} bytes");
    }
}
