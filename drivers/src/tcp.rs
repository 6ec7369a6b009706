//! What the kernel knows of a TCP connection that the socket API does not say: whether the peer
//! still acknowledges what was sent (`TCP_INFO`). The uplink judges a link silent by it
//! (`rigd::uplink::links`).

#![allow(unsafe_code)] // getsockopt(TCP_INFO); every block says why it is sound

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// (Segments sent and not yet acknowledged, time since the last ACK arrived) of a TCP socket.
/// None: not a TCP socket, or the call failed.
pub fn acks(socket: BorrowedFd<'_>) -> Option<(u32, Duration)> {
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
    (r == 0).then(|| {
        (
            info.tcpi_unacked,
            Duration::from_millis(info.tcpi_last_ack_recv.into()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn a_loopback_connection_has_its_bytes_acknowledged_and_a_file_is_no_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer, _) = l.accept().unwrap();
        c.write_all(b"hello").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (unacked, since_ack) = acks(c.as_fd()).unwrap();
        assert_eq!(unacked, 0);
        assert!(since_ack < Duration::from_secs(1), "{since_ack:?}");
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(acks(f.as_fd()).is_none());
    }
}
