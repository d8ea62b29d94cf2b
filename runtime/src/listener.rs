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
    fn port_held_without_reuseport_is_refused() {
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = bind_reuseport(plain.local_addr().unwrap(), 16).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }
}
