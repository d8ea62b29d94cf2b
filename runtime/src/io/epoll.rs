//! The readiness backend: non-blocking sockets watched by the worker's epoll (through
//! `mio`), each call one syscall made at once. Edge-triggered: a socket is registered once
//! for reading and writing and reported again only when something new happens.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use socket2::SockRef;

use super::{sys, Backend, Io, Peer, Readiness, Transmit, Waiting};
use crate::waker::Waker;

/// One worker's epoll, as the sockets see it.
pub struct EpollIo {
    registry: Registry,
    /// The epoll a worker's loop waits on, and its event buffer (none for a detached
    /// backend, whose sockets are driven by hand).
    poll: Option<(Poll, Events)>,
}

impl EpollIo {
    pub fn new(registry: Registry) -> EpollIo {
        EpollIo {
            registry,
            poll: None,
        }
    }

    /// The backend of a worker's loop, on an epoll of its own.
    pub fn for_worker() -> io::Result<EpollIo> {
        let poll = Poll::new()?;
        Ok(EpollIo {
            registry: poll.registry().try_clone()?,
            poll: Some((poll, Events::with_capacity(1024))),
        })
    }

    /// A backend on an epoll nobody waits on: for sockets driven by hand (tests, tools).
    pub fn detached() -> io::Result<EpollIo> {
        // The registry keeps its own descriptor of the epoll instance.
        Ok(EpollIo::new(mio::Poll::new()?.registry().try_clone()?))
    }
}

/// A socket of the epoll backend: TCP or Unix, non-blocking, its descriptor alone (an idle
/// connection's state is budgeted in bytes). Dropping it closes it, which also takes it out
/// of epoll.
#[derive(Debug)]
pub struct EpollSock {
    fd: OwnedFd,
}

impl EpollSock {
    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A connected Unix socket, made non-blocking (tests, and pairs).
    pub fn from_std_unix(s: std::os::unix::net::UnixStream) -> io::Result<EpollSock> {
        s.set_nonblocking(true)?;
        Ok(EpollSock { fd: s.into() })
    }

    /// A connected TCP socket, made non-blocking.
    pub fn from_std_tcp(s: std::net::TcpStream) -> io::Result<EpollSock> {
        s.set_nonblocking(true)?;
        Ok(EpollSock { fd: s.into() })
    }
}

impl Io for EpollIo {
    type Sock = EpollSock;

    fn connect(&mut self, to: Peer<'_>) -> io::Result<EpollSock> {
        Ok(EpollSock {
            fd: sys::connect(to)?,
        })
    }

    fn watch(&mut self, sock: &mut EpollSock, token: usize) -> io::Result<()> {
        self.registry.register(
            &mut SourceFd(&sock.fd()),
            Token(token),
            Interest::READABLE | Interest::WRITABLE,
        )
    }

    fn connected(&mut self, sock: &mut EpollSock) -> io::Result<bool> {
        sys::connected(&sock.fd)
    }

    fn send(&mut self, sock: &mut EpollSock, what: &Transmit<'_>) -> io::Result<Option<usize>> {
        let fd = sock.fd();
        let result = match *what {
            Transmit::Memory { iov, more } => sys::write_memory(fd, iov, more),
            Transmit::File {
                fd: file,
                offset,
                len,
            } => sys::send_file(fd, file, offset, len),
        };
        match result {
            Ok(0) => Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }

    fn recv(&mut self, sock: &mut EpollSock, buf: &mut [u8]) -> io::Result<usize> {
        sys::recv(sock.fd(), buf)
    }

    fn peek(&mut self, sock: &mut EpollSock) -> Waiting {
        sys::peek(sock.fd())
    }

    fn shutdown_write(&mut self, sock: &mut EpollSock) -> io::Result<()> {
        SockRef::from(&sock.fd).shutdown(std::net::Shutdown::Write)
    }

    fn unacked_bytes(&self, sock: &EpollSock) -> io::Result<u32> {
        crate::sockstat::unacked_bytes(&sock.fd)
    }
}

impl Backend for EpollIo {
    const NAME: &'static str = "epoll";
    type Prepared = ();

    fn start((): ()) -> io::Result<EpollIo> {
        EpollIo::for_worker()
    }

    fn watch_listener(
        &mut self,
        listener: &mut mio::net::TcpListener,
        token: usize,
    ) -> io::Result<()> {
        self.registry
            .register(listener, Token(token), Interest::READABLE)
    }

    fn unwatch_listener(&mut self, listener: &mut mio::net::TcpListener) {
        let _ = self.registry.deregister(listener);
    }

    fn watch_waker(&mut self, waker: &Waker, token: usize) -> io::Result<()> {
        // Edge-triggered: every write to the eventfd is reported, none needs reading.
        self.registry
            .register(&mut SourceFd(&waker.fd()), Token(token), Interest::READABLE)
    }

    fn wait(&mut self, timeout: Option<Duration>, ready: &mut Vec<Readiness>) -> io::Result<()> {
        let Some((poll, events)) = &mut self.poll else {
            return Err(io::Error::other("a detached epoll backend has no loop"));
        };
        match poll.poll(events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        ready.extend(events.iter().map(|e| Readiness {
            token: e.token().0,
            readable: e.is_readable(),
            writable: e.is_writable(),
            read_closed: e.is_read_closed(),
            error: e.is_error(),
        }));
        Ok(())
    }

    fn adopt(&mut self, stream: std::net::TcpStream) -> EpollSock {
        // The runtime's listeners hand out non-blocking sockets already.
        EpollSock { fd: stream.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{IoSlice, Read, Write};

    fn pair() -> (EpollIo, EpollSock, std::net::TcpStream) {
        let poll = mio::Poll::new().unwrap();
        let io = EpollIo::new(poll.registry().try_clone().unwrap());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        (io, EpollSock::from_std_tcp(ours).unwrap(), theirs)
    }

    /// Every call against a real socket: gathered sends, MSG_MORE, a file range, reads,
    /// peeks, the write shutdown (exercises each `unsafe` block here).
    #[test]
    fn sends_reads_peeks_and_shuts_down() {
        let (mut io, mut sock, mut peer) = pair();
        let iov = [IoSlice::new(b"head "), IoSlice::new(b"and body")];
        let sent = io
            .send(
                &mut sock,
                &Transmit::Memory {
                    iov: &iov,
                    more: false,
                },
            )
            .unwrap();
        assert_eq!(sent, Some(13));
        let one = [IoSlice::new(b"!")];
        io.send(
            &mut sock,
            &Transmit::Memory {
                iov: &one,
                more: true,
            },
        )
        .unwrap();
        let mut file = tempfile_with(b"0123456789");
        let f = Transmit::File {
            fd: file.as_raw_fd(),
            offset: 2,
            len: 5,
        };
        assert_eq!(io.send(&mut sock, &f).unwrap(), Some(5));
        let mut got = [0u8; 19];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"head and body!23456");
        // Past the file's end: the length promised cannot be met.
        let past = Transmit::File {
            fd: file.as_raw_fd(),
            offset: 10,
            len: 5,
        };
        assert_eq!(
            io.send(&mut sock, &past).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        file.flush().unwrap();

        assert_eq!(io.peek(&mut sock), Waiting::Nothing);
        let mut buf = [0u8; 8];
        assert_eq!(
            io.recv(&mut sock, &mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        peer.write_all(b"hello").unwrap();
        while io.peek(&mut sock) == Waiting::Nothing {
            std::thread::yield_now();
        }
        assert_eq!(io.peek(&mut sock), Waiting::Bytes);
        assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");

        io.shutdown_write(&mut sock).unwrap();
        assert_eq!(peer.read(&mut buf).unwrap(), 0, "the peer sees our end");
        drop(peer);
        while io.peek(&mut sock) == Waiting::Nothing {
            std::thread::yield_now();
        }
        assert_eq!(io.peek(&mut sock), Waiting::Closed);
        assert_eq!(io.unacked_bytes(&sock).unwrap(), 0);
    }

    #[test]
    fn connects_over_tcp_and_unix_and_reports_a_refusal() {
        let poll = mio::Poll::new().unwrap();
        let mut io = EpollIo::new(poll.registry().try_clone().unwrap());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = io
            .connect(Peer::Tcp(listener.local_addr().unwrap()))
            .unwrap();
        io.watch(&mut s, 9).unwrap();
        let _accepted = listener.accept().unwrap();
        while !io.connected(&mut s).unwrap() {
            std::thread::yield_now();
        }

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut u = io.connect(Peer::Unix(&path)).unwrap();
        let _accepted = unix.accept().unwrap();
        assert!(io.connected(&mut u).unwrap());

        // A port nobody listens on: the connect fails, now or once it is tried.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        if let Ok(mut s) = io.connect(Peer::Tcp(addr)) {
            let failed = loop {
                match io.connected(&mut s) {
                    Ok(true) => break false,
                    Ok(false) => std::thread::yield_now(),
                    Err(_) => break true,
                }
            };
            assert!(failed);
        }
    }

    /// A look at what waits takes nothing, on TCP and Unix sockets alike (the upstream
    /// pool's check of a connection between exchanges).
    #[test]
    fn peek_sees_bytes_and_the_end_without_taking_them() {
        let (mut io, mut sock, mut peer) = pair();
        peer.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        while io.peek(&mut sock) == Waiting::Nothing {
            std::thread::yield_now();
        }
        assert_eq!(io.peek(&mut sock), Waiting::Bytes, "still there");
        let mut buf = [0u8; 64];
        assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 17);
        assert_eq!(io.peek(&mut sock), Waiting::Nothing);

        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut unix = EpollSock::from_std_unix(ours).unwrap();
        assert_eq!(io.peek(&mut unix), Waiting::Nothing);
        theirs.write_all(b"x").unwrap();
        assert_eq!(io.peek(&mut unix), Waiting::Bytes);
        assert_eq!(io.recv(&mut unix, &mut buf).unwrap(), 1);
        drop(theirs);
        assert_eq!(io.peek(&mut unix), Waiting::Closed);
    }

    fn tempfile_with(bytes: &[u8]) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }
}
