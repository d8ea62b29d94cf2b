use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// Binds a non-blocking listener with `SO_REUSEPORT`, so that every worker can own one and the
/// kernel balances new connections between them without a shared accept lock. The same option
/// lets a new tern process bind the port while an old one drains.
pub fn bind_reuseport(addr: SocketAddr, backlog: i32) -> io::Result<mio::net::TcpListener> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(
        domain,
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    set_listener_options(&socket)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(mio::net::TcpListener::from_std(socket.into()))
}

/// What a UDP socket's kernel buffers are asked to hold: a QUIC server's receive queue
/// absorbs bursts from many connections between two loop turns, and 4 MiB is what quinn and
/// other QUIC servers ask for. Linux caps the request at `net.core.{r,w}mem_max`.
const DATAGRAM_BUFFER: usize = 4 << 20;

/// Binds a non-blocking UDP socket with `SO_REUSEPORT`, one per worker as for TCP: the kernel
/// spreads datagrams over the group by their addresses, so a QUIC connection's datagrams keep
/// reaching one worker (until the client's address changes). No `SO_REUSEADDR`: for UDP it
/// lets any other socket, of any user, bind the same port and take datagrams, where
/// `SO_REUSEPORT` only admits sockets of the same user. `IPV6_V6ONLY` stays the system's
/// default, as for the TCP listeners, so `[::]:443` takes IPv4 on UDP exactly when it does
/// on TCP.
pub fn bind_datagram_reuseport(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(
        domain,
        Type::DGRAM.nonblocking().cloexec(),
        Some(Protocol::UDP),
    )?;
    socket.set_reuse_port(true)?;
    // Best effort: the kernel caps it, and a smaller buffer only drops more in a burst.
    let _ = socket.set_recv_buffer_size(DATAGRAM_BUFFER);
    let _ = socket.set_send_buffer_size(DATAGRAM_BUFFER);
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A worker's own descriptor for a listening socket a service manager handed over (socket
/// activation): a non-blocking, close-on-exec duplicate with the options tern's own listeners
/// have. Every duplicate shares the one accept queue (see `Runtime::start` for why).
pub fn share_inherited(listener: &std::net::TcpListener) -> io::Result<mio::net::TcpListener> {
    // try_clone is F_DUPFD_CLOEXEC.
    let copy = listener.try_clone()?;
    let socket = socket2::SockRef::from(&copy);
    // O_NONBLOCK belongs to the open socket, not the descriptor: this also covers the other
    // duplicates (and the service manager's copy, which only polls it).
    socket.set_nonblocking(true)?;
    set_listener_options(&socket)?;
    Ok(mio::net::TcpListener::from_std(copy))
}

fn set_listener_options(socket: &Socket) -> io::Result<()> {
    // Accepted sockets inherit TCP_NODELAY from the listener: one setsockopt per listener
    // instead of one per connection. (Answers are written whole; Nagle would only delay the
    // last segment.)
    socket.set_tcp_nodelay(true)?;
    // TCP_DEFER_ACCEPT: the kernel hands a connection to accept() only once its first bytes
    // (a request, a ClientHello) arrived, so the worker can read and answer right after
    // accepting, without waiting for a readiness event; a peer that connects and sends
    // nothing costs no descriptor until the timeout (1 s, as nginx's `deferred`).
    set_defer_accept(socket, 1)
}

fn set_defer_accept(socket: &Socket, seconds: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is the open socket borrowed for the call; the option value is a
    // c_int on the stack whose size is passed with it. socket2 has no wrapper for this option.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&seconds as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Where Linux exposes `net.ipv4.tcp_migrate_req` (per network namespace; it covers IPv6 too).
const MIGRATE_REQ_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// A one-line hint when `net.ipv4.tcp_migrate_req` exists and is 0, else `None`.
///
/// When a `SO_REUSEPORT` listener closes, Linux resets the connections still in its accept
/// queue and the half-open ones, unless this sysctl (Linux 5.14+) is 1: then they move to
/// another listener of the group, e.g. the new tern of a restart. tern accepts what is queued
/// before it closes a listener, but only the kernel can close the last small window.
pub fn migrate_req_hint() -> Option<String> {
    hint_for(std::fs::read_to_string(MIGRATE_REQ_SYSCTL).ok().as_deref())
}

fn hint_for(sysctl: Option<&str>) -> Option<String> {
    (sysctl?.trim() == "0").then(|| {
        "hint: net.ipv4.tcp_migrate_req=0; set it to 1 so that restarting tern on the same \
         port (new process first, then SIGTERM to the old) resets no queued connection"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrate_hint_only_when_the_sysctl_is_off() {
        assert!(hint_for(Some("0\n")).is_some());
        assert_eq!(hint_for(Some("1\n")), None);
        assert_eq!(hint_for(None), None);
    }

    #[test]
    fn accepted_sockets_inherit_nodelay() {
        let l = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        std::io::Write::write_all(&mut c, b"x").unwrap(); // deferred accept waits for data
        let accepted = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert!(accepted.nodelay().unwrap());
    }

    #[test]
    fn two_listeners_share_one_port() {
        let a = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let port = a.local_addr().unwrap().port();
        let b = bind_reuseport(SocketAddr::from(([127, 0, 0, 1], port)), 16).unwrap();
        assert_eq!(b.local_addr().unwrap().port(), port);
    }

    #[test]
    fn an_inherited_listener_is_shared_non_blocking_with_our_options() {
        let inherited = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = inherited.local_addr().unwrap();
        let (a, b) = (
            share_inherited(&inherited).unwrap(),
            share_inherited(&inherited).unwrap(),
        );
        // No connection yet: a blocking accept would hang here.
        assert_eq!(a.accept().unwrap_err().kind(), io::ErrorKind::WouldBlock);
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        std::io::Write::write_all(&mut c, b"x").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let accepted = loop {
            if let Ok((s, _)) = b.accept() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "never accepted");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(accepted.nodelay().unwrap());
        // Taken by one duplicate, the connection is gone for the other.
        assert_eq!(a.accept().unwrap_err().kind(), io::ErrorKind::WouldBlock);
        use std::os::fd::AsRawFd;
        // SAFETY: F_GETFD on a descriptor this test owns; it only reads the flags.
        let flags = unsafe { libc::fcntl(a.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }

    #[test]
    fn datagram_sockets_share_one_port_non_blocking_with_big_buffers() {
        let a = bind_datagram_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = a.local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        let b = bind_datagram_reuseport(addr).unwrap();
        assert_eq!(b.local_addr().unwrap(), addr);
        let mut buf = [0u8; 8];
        assert_eq!(
            a.recv_from(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // Linux doubles what it grants (bookkeeping), and caps the request at rmem_max: the
        // default (about 208 KiB) is what an unset buffer would have.
        let granted = socket2::SockRef::from(&a).recv_buffer_size().unwrap();
        let cap = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok());
        if let Some(cap) = cap {
            assert!(granted >= 2 * cap.min(DATAGRAM_BUFFER), "{granted}");
        }
    }

    #[test]
    fn a_udp_port_held_without_reuseport_is_refused() {
        let plain = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let err = bind_datagram_reuseport(plain.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn port_held_without_reuseport_is_refused() {
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = bind_reuseport(plain.local_addr().unwrap(), 16).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }
}
