//! Sockets in memory: the backend tests drive a real worker with, byte by byte and without
//! a kernel. Each socket is a pair of byte queues shared with a [`MemoryPeer`], the test's
//! end (the client, or an upstream server the worker connected to). What the peer does
//! (writes, closes its side, reads what the worker sent) is reported to the worker as
//! readiness, as edge-triggered epoll would report it; the worker's sends land in the
//! peer's queue, within a room the test may limit, and its unacknowledged bytes are the ones
//! the peer has not read yet (a client that stops reading stalls the worker's writes).
//!
//! Single-threaded on purpose (`Rc`): the worker and the test take turns on one thread.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;

use super::{Io, Peer, Readiness, Transmit, Waiting};

/// The readiness reports not yet handed to the worker, shared by every socket.
type Reports = Rc<RefCell<Vec<Readiness>>>;

#[derive(Default)]
struct Pipe {
    /// Bytes from the peer the worker has not read.
    inbound: VecDeque<u8>,
    /// The peer closed its side: once `inbound` is read, a read says end of file.
    peer_shut: bool,
    /// Bytes the worker sent that the peer has not read.
    outbound: Vec<u8>,
    /// The most `outbound` may hold: a send finds no room past it.
    room: usize,
    /// A read returns at most this many bytes (the relay's "every piece size" tests); such a
    /// socket says a short read does not drain it (`Io::short_read_drains`).
    max_read: usize,
    worker_shut: bool,
    /// The worker dropped its socket.
    worker_closed: bool,
    /// The token the worker watches it under.
    token: Option<usize>,
    /// The worker found no room: the next read by the peer reports writable.
    blocked: bool,
    /// Exchanges the connection has carried: 1, and one more each time the worker took it
    /// from its pool again (`Io::reused`).
    exchanges: u32,
    /// Times it was taken again with bytes from the peer still unread in it.
    reused_unread: u32,
    reports: Reports,
}

impl Pipe {
    fn report(&self, r: impl FnOnce(&mut Readiness)) {
        if let Some(token) = self.token {
            let mut ready = Readiness {
                token,
                ..Readiness::default()
            };
            r(&mut ready);
            self.reports.borrow_mut().push(ready);
        }
    }
}

/// The worker's end of a socket in memory. Dropping it closes it (the peer sees
/// [`MemoryPeer::closed_by_worker`]).
pub struct MemorySock {
    pipe: Rc<RefCell<Pipe>>,
}

impl Drop for MemorySock {
    fn drop(&mut self) {
        self.pipe.borrow_mut().worker_closed = true;
    }
}

/// The test's end of a socket in memory.
#[derive(Clone)]
pub struct MemoryPeer {
    pipe: Rc<RefCell<Pipe>>,
}

impl MemoryPeer {
    /// Sends bytes to the worker (reported as readable).
    pub fn write(&self, bytes: &[u8]) {
        let mut p = self.pipe.borrow_mut();
        p.inbound.extend(bytes);
        p.report(|r| r.readable = true);
    }

    /// Closes the peer's sending side (the worker reads the end after what was sent).
    pub fn shutdown(&self) {
        let mut p = self.pipe.borrow_mut();
        p.peer_shut = true;
        p.report(|r| {
            r.readable = true;
            r.read_closed = true;
        });
    }

    /// Takes what the worker sent so far; room frees up (reported as writable if the
    /// worker was waiting for it).
    pub fn read(&self) -> Vec<u8> {
        let n = self.unread();
        self.read_some(n)
    }

    /// Takes at most `n` bytes of what the worker sent (a slow reader). A worker that found
    /// no room hears of it, as from epoll, once a third of the room is free.
    pub fn read_some(&self, n: usize) -> Vec<u8> {
        let mut p = self.pipe.borrow_mut();
        let n = n.min(p.outbound.len());
        let got: Vec<u8> = p.outbound.drain(..n).collect();
        let free = p.room - p.outbound.len();
        if p.blocked && free >= p.room.div_ceil(3) {
            p.blocked = false;
            p.report(|r| r.writable = true);
        }
        got
    }

    /// Bytes the worker sent that the peer has not read.
    pub fn unread(&self) -> usize {
        self.pipe.borrow().outbound.len()
    }

    /// The most the worker's sends may have unread by the peer (a full socket buffer).
    pub fn set_room(&self, room: usize) {
        self.pipe.borrow_mut().room = room;
    }

    /// The worker's reads return at most `n` bytes each.
    pub fn set_max_read(&self, n: usize) {
        self.pipe.borrow_mut().max_read = n.max(1);
    }

    /// The worker shut its sending side down (a FIN after its last bytes).
    pub fn shut_by_worker(&self) -> bool {
        self.pipe.borrow().worker_shut
    }

    /// The worker closed (dropped) its socket.
    pub fn closed_by_worker(&self) -> bool {
        self.pipe.borrow().worker_closed
    }

    /// The worker watches this socket (it registered for readiness).
    pub fn watched(&self) -> bool {
        self.pipe.borrow().token.is_some()
    }

    /// Bytes sent to the worker that it has not read yet.
    pub fn unread_by_worker(&self) -> usize {
        self.pipe.borrow().inbound.len()
    }

    /// Exchanges the worker has sent over this connection so far: 1 from the start, one more
    /// each time it took the connection from its pool again.
    pub fn exchanges(&self) -> u32 {
        self.pipe.borrow().exchanges
    }

    /// Times the worker took this connection from its pool with bytes of ours still unread
    /// in it: whatever it reads next would be taken for the new exchange's answer.
    pub fn reused_with_unread_bytes(&self) -> u32 {
        self.pipe.borrow().reused_unread
    }
}

/// Where an outgoing connection may go: a TCP address or a Unix socket path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MemoryAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl From<Peer<'_>> for MemoryAddr {
    fn from(p: Peer<'_>) -> MemoryAddr {
        match p {
            Peer::Tcp(a) => MemoryAddr::Tcp(a),
            Peer::Unix(path) => MemoryAddr::Unix(path.to_path_buf()),
        }
    }
}

/// One worker's sockets in memory.
pub struct MemoryIo {
    reports: Reports,
    /// Addresses that take connections, and the peers of the connections made to each, not
    /// yet taken by the test.
    listening: HashMap<MemoryAddr, VecDeque<MemoryPeer>>,
}

/// A socket's room when the test sets none: far more than any test sends.
const UNLIMITED: usize = usize::MAX / 2;

impl Default for MemoryIo {
    fn default() -> Self {
        MemoryIo::new()
    }
}

impl MemoryIo {
    pub fn new() -> MemoryIo {
        MemoryIo {
            reports: Rc::default(),
            listening: HashMap::new(),
        }
    }

    /// A new connection, as a listener would accept it: the worker's end, and the test's.
    pub fn pair(&mut self) -> (MemorySock, MemoryPeer) {
        let pipe = Rc::new(RefCell::new(Pipe {
            room: UNLIMITED,
            max_read: usize::MAX,
            exchanges: 1,
            reports: self.reports.clone(),
            ..Pipe::default()
        }));
        (MemorySock { pipe: pipe.clone() }, MemoryPeer { pipe })
    }

    /// Lets the worker connect to `addr` (an upstream server the test plays).
    pub fn listen(&mut self, addr: MemoryAddr) {
        self.listening.entry(addr).or_default();
    }

    /// The next connection the worker made to `addr`, if any.
    pub fn accept(&mut self, addr: &MemoryAddr) -> Option<MemoryPeer> {
        self.listening.get_mut(addr)?.pop_front()
    }

    /// The readiness reports since the last call, in the order they happened.
    pub fn take_reports(&mut self) -> Vec<Readiness> {
        std::mem::take(&mut *self.reports.borrow_mut())
    }

    /// True if a report waits.
    pub fn has_reports(&self) -> bool {
        !self.reports.borrow().is_empty()
    }
}

impl Io for MemoryIo {
    type Sock = MemorySock;

    fn connect(&mut self, to: Peer<'_>) -> io::Result<MemorySock> {
        let addr = MemoryAddr::from(to);
        if !self.listening.contains_key(&addr) {
            return Err(io::ErrorKind::ConnectionRefused.into());
        }
        let (sock, peer) = self.pair();
        self.listening
            .get_mut(&addr)
            .expect("checked above")
            .push_back(peer);
        Ok(sock)
    }

    fn watch(&mut self, sock: &mut MemorySock, token: usize) -> io::Result<()> {
        let mut p = sock.pipe.borrow_mut();
        p.token = Some(token);
        // As epoll reports a new registration's current state.
        let (readable, closed) = (!p.inbound.is_empty() || p.peer_shut, p.peer_shut);
        p.report(|r| {
            r.writable = true;
            r.readable = readable;
            r.read_closed = closed;
        });
        Ok(())
    }

    fn connected(&mut self, _: &mut MemorySock) -> io::Result<bool> {
        Ok(true)
    }

    fn send(&mut self, sock: &mut MemorySock, what: &Transmit<'_>) -> io::Result<Option<usize>> {
        let mut p = sock.pipe.borrow_mut();
        if p.worker_shut {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = p.room.saturating_sub(p.outbound.len());
        if room == 0 {
            p.blocked = true;
            return Ok(None);
        }
        let n = match *what {
            Transmit::Memory { iov, .. } => {
                let mut n = 0;
                for slice in iov {
                    let take = slice.len().min(room - n);
                    p.outbound.extend_from_slice(&slice[..take]);
                    n += take;
                    if n == room {
                        break;
                    }
                }
                n
            }
            Transmit::File { fd, offset, len } => {
                let want = (len as usize).min(room).min(1 << 20);
                let mut buf = vec![0u8; want];
                // SAFETY: `buf` is a live buffer of `want` bytes; `fd` is the open file of the
                // output segment that names it, held for the duration of the call.
                let got = unsafe {
                    libc::pread(fd, buf.as_mut_ptr().cast(), want, offset as libc::off_t)
                };
                if got < 0 {
                    return Err(io::Error::last_os_error());
                }
                if got == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file truncated while sending",
                    ));
                }
                p.outbound.extend_from_slice(&buf[..got as usize]);
                got as usize
            }
        };
        Ok(Some(n))
    }

    fn recv(&mut self, sock: &mut MemorySock, buf: &mut [u8]) -> io::Result<usize> {
        let mut p = sock.pipe.borrow_mut();
        if p.inbound.is_empty() {
            return if p.peer_shut {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(p.inbound.len()).min(p.max_read);
        for (slot, byte) in buf.iter_mut().zip(p.inbound.drain(..n)) {
            *slot = byte;
        }
        Ok(n)
    }

    fn peek(&mut self, sock: &mut MemorySock) -> Waiting {
        let p = sock.pipe.borrow();
        if !p.inbound.is_empty() {
            Waiting::Bytes
        } else if p.peer_shut {
            Waiting::Closed
        } else {
            Waiting::Nothing
        }
    }

    fn shutdown_write(&mut self, sock: &mut MemorySock) -> io::Result<()> {
        sock.pipe.borrow_mut().worker_shut = true;
        Ok(())
    }

    fn unacked_bytes(&self, sock: &MemorySock) -> io::Result<u32> {
        Ok(sock.pipe.borrow().outbound.len().min(u32::MAX as usize) as u32)
    }

    fn short_read_drains(&self, sock: &MemorySock) -> bool {
        sock.pipe.borrow().max_read == usize::MAX
    }

    fn reused(&mut self, sock: &mut MemorySock) {
        let mut p = sock.pipe.borrow_mut();
        p.exchanges += 1;
        if !p.inbound.is_empty() {
            p.reused_unread += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{IoSlice, Write};
    use std::os::fd::AsRawFd;

    #[test]
    fn bytes_flow_both_ways_with_readiness_and_room() {
        let mut io = MemoryIo::new();
        let (mut sock, peer) = io.pair();
        peer.write(b"early");
        io.watch(&mut sock, 40).unwrap();
        let r = io.take_reports();
        assert_eq!(r.len(), 1);
        assert!(r[0].readable && r[0].writable && r[0].token == 40);
        let mut buf = [0u8; 3];
        assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 3);
        assert_eq!(io.peek(&mut sock), Waiting::Bytes);
        assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 2);
        assert_eq!(
            io.recv(&mut sock, &mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );

        peer.set_room(4);
        let iov = [IoSlice::new(b"ab"), IoSlice::new(b"cdef")];
        let what = Transmit::Memory {
            iov: &iov,
            more: false,
        };
        assert_eq!(io.send(&mut sock, &what).unwrap(), Some(4));
        assert_eq!(io.unacked_bytes(&sock).unwrap(), 4);
        assert_eq!(io.send(&mut sock, &what).unwrap(), None, "no room");
        assert_eq!(peer.read_some(1), b"a");
        assert!(
            io.take_reports().is_empty(),
            "a quarter free: not yet writable"
        );
        assert_eq!(io.unacked_bytes(&sock).unwrap(), 3);
        assert_eq!(peer.read_some(1), b"b");
        assert!(io.take_reports()[0].writable, "half free: writable");
        assert_eq!(peer.read(), b"cd");

        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"0123456789").unwrap();
        peer.set_room(100);
        let f = Transmit::File {
            fd: file.as_raw_fd(),
            offset: 3,
            len: 4,
        };
        assert_eq!(io.send(&mut sock, &f).unwrap(), Some(4));
        assert_eq!(peer.read(), b"3456");

        peer.shutdown();
        assert!(io.take_reports()[0].read_closed);
        assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 0);
        assert_eq!(io.peek(&mut sock), Waiting::Closed);
        io.shutdown_write(&mut sock).unwrap();
        assert!(peer.shut_by_worker());
        drop(sock);
        assert!(peer.closed_by_worker());
    }

    #[test]
    fn connects_only_where_the_test_listens() {
        let mut io = MemoryIo::new();
        let addr: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert_eq!(
            io.connect(Peer::Tcp(addr)).err().unwrap().kind(),
            io::ErrorKind::ConnectionRefused
        );
        io.listen(MemoryAddr::Tcp(addr));
        let mut sock = io.connect(Peer::Tcp(addr)).unwrap();
        assert!(io.connected(&mut sock).unwrap());
        let upstream = io.accept(&MemoryAddr::Tcp(addr)).unwrap();
        let iov = [IoSlice::new(b"GET / HTTP/1.1\r\n\r\n")];
        io.send(
            &mut sock,
            &Transmit::Memory {
                iov: &iov,
                more: false,
            },
        )
        .unwrap();
        assert_eq!(upstream.read(), b"GET / HTTP/1.1\r\n\r\n");
        assert!(io.accept(&MemoryAddr::Tcp(addr)).is_none());
    }

    #[test]
    fn reads_in_pieces_do_not_claim_to_drain_and_reuse_is_noted() {
        let mut io = MemoryIo::new();
        let (mut sock, peer) = io.pair();
        assert!(io.short_read_drains(&sock));
        peer.set_max_read(2);
        assert!(
            !io.short_read_drains(&sock),
            "a short read leaves bytes behind"
        );
        peer.write(b"abcde");
        let mut buf = [0u8; 8];
        assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 2);
        assert_eq!(peer.unread_by_worker(), 3);

        assert_eq!(peer.exchanges(), 1);
        io.reused(&mut sock);
        assert_eq!((peer.exchanges(), peer.reused_with_unread_bytes()), (2, 1));
        while io.recv(&mut sock, &mut buf).is_ok() {}
        io.reused(&mut sock);
        assert_eq!((peer.exchanges(), peer.reused_with_unread_bytes()), (3, 1));
    }
}
