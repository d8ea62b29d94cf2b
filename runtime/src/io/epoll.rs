//! The readiness backend: non-blocking sockets watched by the worker's epoll (through
//! `mio`), each call one syscall made at once. Edge-triggered: a socket is registered once
//! for reading and writing and reported again only when something new happens.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use quinn_udp::{RecvMeta, Transmit as DatagramTransmit};
use socket2::SockRef;

use super::datagram::KernelDatagram;
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

/// A UDP socket of the epoll backend, with quinn-udp's state of it. Watched for writing too,
/// so epoll also reports room after sends that never lacked it (the kernel wakes writers as
/// sent datagrams leave the buffer): a writable report is a hint to retry what was kept, if
/// anything. Dropping it closes it, which also takes it out of epoll.
#[derive(Debug)]
pub struct EpollDatagram {
    sock: mio::net::UdpSocket,
    kernel: KernelDatagram,
}

impl Io for EpollIo {
    type Sock = EpollSock;
    type Datagram = EpollDatagram;

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

    fn watch_datagram(&mut self, sock: &mut EpollDatagram, token: usize) -> io::Result<()> {
        self.registry.register(
            &mut sock.sock,
            Token(token),
            Interest::READABLE | Interest::WRITABLE,
        )
    }

    fn recv_datagrams(
        &mut self,
        sock: &mut EpollDatagram,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        sock.kernel.recv(&sock.sock, bufs, meta)
    }

    fn send_datagram(
        &mut self,
        sock: &mut EpollDatagram,
        transmit: &DatagramTransmit<'_>,
    ) -> io::Result<bool> {
        sock.kernel.send(&sock.sock, transmit)
    }

    fn datagram_local_addr(&self, sock: &EpollDatagram) -> SocketAddr {
        sock.kernel.local_addr()
    }

    fn max_gso_segments(&self, sock: &EpollDatagram) -> usize {
        sock.kernel.max_gso_segments()
    }

    fn gro_segments(&self, sock: &EpollDatagram) -> usize {
        sock.kernel.gro_segments()
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

    fn adopt_datagram(&mut self, sock: std::net::UdpSocket) -> io::Result<EpollDatagram> {
        let kernel = KernelDatagram::new(&sock)?;
        Ok(EpollDatagram {
            sock: mio::net::UdpSocket::from_std(sock),
            kernel,
        })
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

    /// Turns of the loop until a report for `token` says `what` (or 5 s pass).
    fn wait_for(io: &mut EpollIo, token: usize, what: fn(&Readiness) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut ready = Vec::new();
        while !ready
            .iter()
            .any(|r: &Readiness| r.token == token && what(r))
        {
            assert!(std::time::Instant::now() < deadline, "no report");
            ready.clear();
            io.wait(Some(Duration::from_millis(10)), &mut ready)
                .unwrap();
        }
    }

    /// A UDP socket through quinn-udp: readiness, recvmmsg with the packet's source and
    /// destination, sendmsg from a chosen source IP and with GSO, an oversized datagram
    /// counted as sent.
    #[test]
    fn datagrams_are_received_and_answered_with_their_addresses() {
        let mut io = EpollIo::for_worker().unwrap();
        let bound = crate::bind_datagram_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
        let local = bound.local_addr().unwrap();
        let mut sock = io.adopt_datagram(bound).unwrap();
        assert_eq!(io.datagram_local_addr(&sock), local);
        assert!(io.max_gso_segments(&sock) >= 1 && io.gro_segments(&sock) >= 1);
        io.watch_datagram(&mut sock, 70).unwrap();
        wait_for(&mut io, 70, |r| r.writable);

        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client.send_to(b"one", local).unwrap();
        client.send_to(b"two", local).unwrap();
        wait_for(&mut io, 70, |r| r.readable);
        let mut storage = vec![[0u8; 2048]; 4];
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let mut meta = [RecvMeta::default(); 4];
        let mut got = Vec::new();
        while got.len() < 2 {
            match io.recv_datagrams(&mut sock, &mut bufs, &mut meta) {
                Ok(n) => got.extend((0..n).map(|i| (meta[i], bufs[i][..meta[i].len].to_vec()))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got[0].1, b"one");
        assert_eq!(got[1].1, b"two");
        assert_eq!(got[0].0.addr, client.local_addr().unwrap());
        assert_eq!(got[0].0.dst_ip, Some(local.ip()));
        assert_eq!(
            io.recv_datagrams(&mut sock, &mut bufs, &mut meta)
                .unwrap_err()
                .kind(),
            io::ErrorKind::WouldBlock
        );

        let mut answer = DatagramTransmit {
            destination: got[0].0.addr,
            ecn: None,
            contents: b"answer",
            segment_size: None,
            src_ip: got[0].0.dst_ip,
        };
        assert!(io.send_datagram(&mut sock, &answer).unwrap());
        let mut buf = [0u8; 64];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"answer"[..], local));

        if io.max_gso_segments(&sock) > 1 {
            answer.contents = b"aaabbbcc";
            answer.segment_size = Some(3);
            assert!(io.send_datagram(&mut sock, &answer).unwrap());
            for want in [&b"aaa"[..], b"bbb", b"cc"] {
                let n = client.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], want);
            }
        }

        // Larger than any UDP datagram: EMSGSIZE, lost on the way as far as the app knows.
        let huge = vec![0u8; 70_000];
        answer.contents = &huge;
        answer.segment_size = None;
        assert!(io.send_datagram(&mut sock, &answer).unwrap());
        // Another error is the app's to see.
        answer.contents = b"x";
        answer.destination = "[::1]:9".parse().unwrap();
        assert!(io.send_datagram(&mut sock, &answer).is_err());
    }

    fn tempfile_with(bytes: &[u8]) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }
}
