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
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(mio::net::TcpListener::from_std(socket.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_listeners_share_one_port() {
        let a = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let port = a.local_addr().unwrap().port();
        let b = bind_reuseport(SocketAddr::from(([127, 0, 0, 1], port)), 16).unwrap();
        assert_eq!(b.local_addr().unwrap().port(), port);
    }

    #[test]
    fn port_held_without_reuseport_is_refused() {
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = bind_reuseport(plain.local_addr().unwrap(), 16).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }
}
