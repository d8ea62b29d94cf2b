//! Sockets in memory: the backend tests drive a real worker with, byte by byte and without
//! a kernel. Each socket is a pair of byte queues shared with a [`MemoryPeer`], the test's
//! end (the client, or an upstream server the worker connected to). What the peer does
//! (writes, closes its side, reads what the worker sent) is reported to the worker as
//! readiness, as edge-triggered epoll would report it; the worker's sends land in the
//! peer's queue, within a room the test may limit, and its unacknowledged bytes are the ones
//! the peer has not read yet (a client that stops reading stalls the worker's writes).
//!
//! UDP sockets in memory ([`MemoryIo::datagram_socket`]) are queues of datagrams both ways,
//! shared with a [`MemoryDatagramPeer`] that plays every client at once (it names the
//! address each datagram comes from) and can lose, reorder and re-address datagrams as a
//! network would.
//!
//! Single-threaded on purpose (`Rc`): the worker and the test take turns on one thread.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;

use quinn_udp::{EcnCodepoint, RecvMeta, Transmit as DatagramTransmit};

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

    /// A UDP socket bound to `local` (not watched yet): the worker's end, and the test's.
    /// `local` should be a specific address: it is also the destination address the worker
    /// reads for every datagram (`RecvMeta::dst_ip`).
    pub fn datagram_socket(&mut self, local: SocketAddr) -> (MemoryDatagram, MemoryDatagramPeer) {
        let pipe = Rc::new(RefCell::new(DatagramPipe {
            local,
            to_worker: Lane::default(),
            from_worker: Lane::default(),
            rebound: Vec::new(),
            room: UNLIMITED,
            blocked: false,
            token: None,
            worker_closed: false,
            reports: self.reports.clone(),
        }));
        (
            MemoryDatagram { pipe: pipe.clone() },
            MemoryDatagramPeer { pipe },
        )
    }
}

/// Which way datagrams go, for the knobs of a [`MemoryDatagramPeer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    ToWorker,
    FromWorker,
}

/// In what order datagrams are delivered. A batch is what was sent one way since the other
/// end last took any: the worker's next reads take the test's batch, the test's next
/// receives the worker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reorder {
    #[default]
    InOrder,
    /// The batch last to first.
    Reversed,
    /// The 2nd before the 1st, the 4th before the 3rd, ... (an odd last one stays last).
    PairsSwapped,
}

/// A datagram the worker sent, as the test receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentDatagram {
    /// Where the worker sent it.
    pub to: SocketAddr,
    /// Where it came from: the socket's address, with the source IP the worker chose
    /// (`Transmit::src_ip`) if it chose one.
    pub from: SocketAddr,
    pub ecn: Option<EcnCodepoint>,
    pub bytes: Vec<u8>,
}

/// A datagram on its way to the worker, with the source address the worker will see.
struct Arrival {
    from: SocketAddr,
    bytes: Vec<u8>,
}

/// What the network does to the datagrams going one way.
#[derive(Default)]
struct Faults {
    /// Lose this many of the next datagrams offered.
    drop_next: usize,
    /// Lose every `drop_every`-th datagram offered (0: none), counting in `offered`.
    drop_every: usize,
    /// Datagrams offered since `drop_every` was set.
    offered: usize,
    reorder: Reorder,
}

/// One way of a UDP socket in memory: the datagrams under way, and what the network does to
/// them.
struct Lane<D> {
    /// Offered since the other end last took any: the next batch.
    arriving: Vec<D>,
    /// The batch being taken, in delivery order.
    delivering: VecDeque<D>,
    faults: Faults,
}

impl<D> Default for Lane<D> {
    fn default() -> Self {
        Lane {
            arriving: Vec::new(),
            delivering: VecDeque::new(),
            faults: Faults::default(),
        }
    }
}

impl<D> Lane<D> {
    /// Puts a datagram on its way: false if the network lost it.
    fn offer(&mut self, datagram: D) -> bool {
        let f = &mut self.faults;
        f.offered += 1;
        if f.drop_next > 0 {
            f.drop_next -= 1;
            return false;
        }
        if f.drop_every > 0 && f.offered.is_multiple_of(f.drop_every) {
            return false;
        }
        self.arriving.push(datagram);
        true
    }

    fn take(&mut self) -> Option<D> {
        if self.delivering.is_empty() {
            let mut batch = std::mem::take(&mut self.arriving);
            match self.faults.reorder {
                Reorder::InOrder => {}
                Reorder::Reversed => batch.reverse(),
                Reorder::PairsSwapped => batch.chunks_exact_mut(2).for_each(|p| p.swap(0, 1)),
            }
            self.delivering.extend(batch);
        }
        self.delivering.pop_front()
    }

    fn len(&self) -> usize {
        self.arriving.len() + self.delivering.len()
    }
}

struct DatagramPipe {
    local: SocketAddr,
    to_worker: Lane<Arrival>,
    from_worker: Lane<SentDatagram>,
    /// Source addresses a NAT rewrote: datagrams the test sends from `.0` reach the worker
    /// from `.1`.
    rebound: Vec<(SocketAddr, SocketAddr)>,
    /// The most datagrams from the worker the test may leave untaken before a send finds
    /// no room.
    room: usize,
    /// The worker found no room: the test's next receives report writable.
    blocked: bool,
    token: Option<usize>,
    worker_closed: bool,
    reports: Reports,
}

impl DatagramPipe {
    fn faults(&mut self, way: Direction) -> &mut Faults {
        match way {
            Direction::ToWorker => &mut self.to_worker.faults,
            Direction::FromWorker => &mut self.from_worker.faults,
        }
    }

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

/// The worker's end of a UDP socket in memory. Dropping it closes it (the peer sees
/// [`MemoryDatagramPeer::closed_by_worker`]; nothing is reported for it any more).
pub struct MemoryDatagram {
    pipe: Rc<RefCell<DatagramPipe>>,
}

impl Drop for MemoryDatagram {
    fn drop(&mut self) {
        let mut p = self.pipe.borrow_mut();
        p.worker_closed = true;
        p.token = None;
    }
}

/// The test's end of a UDP socket in memory: every client of it, and the network between.
#[derive(Clone)]
pub struct MemoryDatagramPeer {
    pipe: Rc<RefCell<DatagramPipe>>,
}

impl MemoryDatagramPeer {
    /// Sends a datagram to the worker from `from` (reported as readable, unless the network
    /// loses it). A NAT rebinding ([`Self::rebind`]) changes the address the worker sees.
    pub fn send_to(&self, from: SocketAddr, bytes: &[u8]) {
        let mut p = self.pipe.borrow_mut();
        let from = p
            .rebound
            .iter()
            .find(|(sent, _)| *sent == from)
            .map_or(from, |&(_, seen)| seen);
        let arrival = Arrival {
            from,
            bytes: bytes.to_vec(),
        };
        if p.to_worker.offer(arrival) {
            p.report(|r| r.readable = true);
        }
    }

    /// Takes the next datagram the worker sent, if any; room frees up (reported as writable,
    /// as from epoll, once a third of the room is free, to a worker that found none).
    pub fn recv(&self) -> Option<SentDatagram> {
        let mut p = self.pipe.borrow_mut();
        let got = p.from_worker.take();
        let free = p.room.saturating_sub(p.from_worker.len());
        if p.blocked && free >= p.room.div_ceil(3) {
            p.blocked = false;
            p.report(|r| r.writable = true);
        }
        got
    }

    /// Takes every datagram the worker sent so far.
    pub fn recv_all(&self) -> Vec<SentDatagram> {
        std::iter::from_fn(|| self.recv()).collect()
    }

    /// From now on, datagrams the test sends from `from` reach the worker from `seen_as`, as
    /// when a NAT gives the client a new address (a new one replaces an earlier rebinding of
    /// `from`). Answers go where the worker sends them: the test sees them addressed to
    /// `seen_as`.
    pub fn rebind(&self, from: SocketAddr, seen_as: SocketAddr) {
        let mut p = self.pipe.borrow_mut();
        p.rebound.retain(|(sent, _)| *sent != from);
        p.rebound.push((from, seen_as));
    }

    /// The network loses the next `n` datagrams going `way`.
    pub fn drop_next(&self, way: Direction, n: usize) {
        self.pipe.borrow_mut().faults(way).drop_next = n;
    }

    /// The network loses every `k`-th datagram going `way`, counting from now (0: none).
    pub fn drop_every(&self, way: Direction, k: usize) {
        let mut p = self.pipe.borrow_mut();
        let faults = p.faults(way);
        faults.drop_every = k;
        faults.offered = 0;
    }

    /// The order in which datagrams going `way` are delivered, from the next batch on.
    pub fn reorder(&self, way: Direction, order: Reorder) {
        self.pipe.borrow_mut().faults(way).reorder = order;
    }

    /// The most datagrams the worker's sends may leave untaken by the test (a full socket
    /// buffer): past it a send finds no room.
    pub fn set_room(&self, datagrams: usize) {
        self.pipe.borrow_mut().room = datagrams.max(1);
    }

    /// Datagrams sent to the worker that it has not read yet.
    pub fn unread_by_worker(&self) -> usize {
        self.pipe.borrow().to_worker.len()
    }

    /// The worker watches this socket.
    pub fn watched(&self) -> bool {
        self.pipe.borrow().token.is_some()
    }

    /// The worker closed (dropped) its socket.
    pub fn closed_by_worker(&self) -> bool {
        self.pipe.borrow().worker_closed
    }
}

impl Io for MemoryIo {
    type Sock = MemorySock;
    type Datagram = MemoryDatagram;

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

    fn watch_datagram(&mut self, sock: &mut MemoryDatagram, token: usize) -> io::Result<()> {
        let mut p = sock.pipe.borrow_mut();
        p.token = Some(token);
        // As epoll reports a new registration's current state.
        let readable = p.to_worker.len() > 0;
        p.report(|r| {
            r.writable = true;
            r.readable = readable;
        });
        Ok(())
    }

    fn recv_datagrams(
        &mut self,
        sock: &mut MemoryDatagram,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        let mut p = sock.pipe.borrow_mut();
        let local = p.local;
        let mut filled = 0;
        for (buf, meta) in bufs.iter_mut().zip(meta.iter_mut()) {
            let Some(arrival) = p.to_worker.take() else {
                break;
            };
            // Longer than the buffer: cut short, as the kernel does.
            let len = arrival.bytes.len().min(buf.len());
            buf[..len].copy_from_slice(&arrival.bytes[..len]);
            *meta = RecvMeta::default();
            meta.addr = arrival.from;
            meta.len = len;
            meta.stride = len;
            meta.dst_ip = Some(local.ip());
            filled += 1;
        }
        if filled == 0 && !bufs.is_empty() && !meta.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(filled)
    }

    fn send_datagram(
        &mut self,
        sock: &mut MemoryDatagram,
        transmit: &DatagramTransmit<'_>,
    ) -> io::Result<bool> {
        let mut p = sock.pipe.borrow_mut();
        if p.from_worker.len() >= p.room {
            p.blocked = true;
            return Ok(false);
        }
        let from = SocketAddr::new(transmit.src_ip.unwrap_or(p.local.ip()), p.local.port());
        let segment = match transmit.segment_size {
            Some(size) if size > 0 => size,
            _ => transmit.contents.len().max(1),
        };
        for bytes in transmit.contents.chunks(segment) {
            p.from_worker.offer(SentDatagram {
                to: transmit.destination,
                from,
                ecn: transmit.ecn,
                bytes: bytes.to_vec(),
            });
        }
        Ok(true)
    }

    fn datagram_local_addr(&self, sock: &MemoryDatagram) -> SocketAddr {
        sock.pipe.borrow().local
    }

    fn max_gso_segments(&self, _: &MemoryDatagram) -> usize {
        1
    }

    fn gro_segments(&self, _: &MemoryDatagram) -> usize {
        1
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

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn transmit<'a>(to: SocketAddr, contents: &'a [u8]) -> DatagramTransmit<'a> {
        DatagramTransmit {
            destination: to,
            ecn: None,
            contents,
            segment_size: None,
            src_ip: None,
        }
    }

    /// What the worker reads now, as (source, bytes).
    fn read_datagrams(io: &mut MemoryIo, sock: &mut MemoryDatagram) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut storage = [[0u8; 16]; 8];
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let mut meta = [RecvMeta::default(); 8];
        match io.recv_datagrams(sock, &mut bufs, &mut meta) {
            Ok(n) => (0..n)
                .map(|i| (meta[i].addr, bufs[i][..meta[i].len].to_vec()))
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Vec::new(),
            Err(e) => panic!("{e}"),
        }
    }

    fn bytes_of(got: &[(SocketAddr, Vec<u8>)]) -> Vec<&[u8]> {
        got.iter().map(|(_, b)| b.as_slice()).collect()
    }

    #[test]
    fn datagrams_flow_both_ways_with_readiness_and_addresses() {
        let mut io = MemoryIo::new();
        let local = addr("192.0.2.1:443");
        let client = addr("198.51.100.7:5000");
        let (mut sock, peer) = io.datagram_socket(local);
        assert_eq!(io.datagram_local_addr(&sock), local);
        assert_eq!((io.max_gso_segments(&sock), io.gro_segments(&sock)), (1, 1));
        peer.send_to(client, b"early");
        assert!(io.take_reports().is_empty(), "not watched yet");
        io.watch_datagram(&mut sock, 40).unwrap();
        let r = io.take_reports();
        assert_eq!(r.len(), 1);
        assert!(r[0].token == 40 && r[0].readable && r[0].writable);
        assert!(peer.watched());

        // One datagram per buffer, with its source and our address; a long one is cut short.
        peer.send_to(client, b"0123456789abcdefLONG");
        let mut storage = [[0u8; 16]; 3];
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let mut meta = [RecvMeta::default(); 3];
        assert_eq!(
            io.recv_datagrams(&mut sock, &mut bufs, &mut meta).unwrap(),
            2
        );
        assert_eq!(&bufs[0][..meta[0].len], b"early");
        assert_eq!(&bufs[1][..meta[1].len], b"0123456789abcdef");
        assert_eq!((meta[0].addr, meta[0].stride), (client, 5));
        assert_eq!(meta[1].dst_ip, Some(local.ip()));
        assert_eq!(
            io.recv_datagrams(&mut sock, &mut bufs, &mut meta)
                .unwrap_err()
                .kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(peer.unread_by_worker(), 0);

        // Answers carry the destination, our address or the source IP chosen, and ECN.
        let mut answer = transmit(client, b"hi");
        answer.ecn = Some(EcnCodepoint::Ect0);
        assert!(io.send_datagram(&mut sock, &answer).unwrap());
        answer.src_ip = Some(addr("192.0.2.9:0").ip());
        assert!(io.send_datagram(&mut sock, &answer).unwrap());
        let sent = peer.recv_all();
        assert_eq!(sent.len(), 2);
        assert_eq!(
            sent[0],
            SentDatagram {
                to: client,
                from: local,
                ecn: Some(EcnCodepoint::Ect0),
                bytes: b"hi".to_vec()
            }
        );
        assert_eq!(sent[1].from, addr("192.0.2.9:443"));
        assert!(peer.recv().is_none());

        io.take_reports();
        drop(sock);
        assert!(peer.closed_by_worker());
        peer.send_to(client, b"late");
        assert!(
            io.take_reports().iter().all(|r| r.token != 40),
            "closed: no reports"
        );
    }

    #[test]
    fn a_segmented_send_arrives_as_separate_datagrams() {
        let mut io = MemoryIo::new();
        let (mut sock, peer) = io.datagram_socket(addr("192.0.2.1:443"));
        let mut gso = transmit(addr("198.51.100.7:5000"), b"aaabbbcc");
        gso.segment_size = Some(3);
        assert!(io.send_datagram(&mut sock, &gso).unwrap());
        let got: Vec<Vec<u8>> = peer.recv_all().into_iter().map(|d| d.bytes).collect();
        assert_eq!(got, [b"aaa".to_vec(), b"bbb".to_vec(), b"cc".to_vec()]);
    }

    #[test]
    fn a_full_socket_says_no_room_and_reports_writable_once_the_test_takes_some() {
        let mut io = MemoryIo::new();
        let to = addr("198.51.100.7:5000");
        let (mut sock, peer) = io.datagram_socket(addr("192.0.2.1:443"));
        io.watch_datagram(&mut sock, 7).unwrap();
        io.take_reports();
        peer.set_room(3);
        for _ in 0..3 {
            assert!(io.send_datagram(&mut sock, &transmit(to, b"x")).unwrap());
        }
        assert!(
            !io.send_datagram(&mut sock, &transmit(to, b"y")).unwrap(),
            "no room"
        );
        assert!(peer.recv().is_some());
        assert_eq!(
            io.take_reports(),
            [Readiness {
                token: 7,
                writable: true,
                ..Readiness::default()
            }]
        );
        assert!(io.send_datagram(&mut sock, &transmit(to, b"y")).unwrap());
        assert!(peer.recv().is_some());
        assert!(io.take_reports().is_empty(), "it never waited this time");
    }

    #[test]
    fn the_network_drops_the_next_datagrams_each_way() {
        let mut io = MemoryIo::new();
        let client = addr("198.51.100.7:5000");
        let (mut sock, peer) = io.datagram_socket(addr("192.0.2.1:443"));
        io.watch_datagram(&mut sock, 7).unwrap();
        io.take_reports();
        peer.drop_next(Direction::ToWorker, 2);
        for b in [b"1", b"2", b"3"] {
            peer.send_to(client, b);
        }
        assert_eq!(
            io.take_reports().len(),
            1,
            "a lost datagram is not reported"
        );
        assert_eq!(bytes_of(&read_datagrams(&mut io, &mut sock)), [b"3"]);

        peer.drop_next(Direction::FromWorker, 1);
        for b in [b"a", b"b"] {
            assert!(
                io.send_datagram(&mut sock, &transmit(client, b)).unwrap(),
                "lost, but sent"
            );
        }
        let got: Vec<Vec<u8>> = peer.recv_all().into_iter().map(|d| d.bytes).collect();
        assert_eq!(got, [b"b".to_vec()]);
    }

    #[test]
    fn the_network_drops_every_kth_datagram_each_way() {
        let mut io = MemoryIo::new();
        let client = addr("198.51.100.7:5000");
        let (mut sock, peer) = io.datagram_socket(addr("192.0.2.1:443"));
        peer.send_to(client, b"before");
        peer.drop_every(Direction::ToWorker, 3);
        for i in 1..=7u8 {
            peer.send_to(client, &[i]);
        }
        let got = read_datagrams(&mut io, &mut sock);
        assert_eq!(
            bytes_of(&got),
            [&b"before"[..], &[1], &[2], &[4], &[5], &[7]]
        );

        peer.drop_every(Direction::FromWorker, 2);
        for i in 1..=5u8 {
            io.send_datagram(&mut sock, &transmit(client, &[i]))
                .unwrap();
        }
        let got: Vec<Vec<u8>> = peer.recv_all().into_iter().map(|d| d.bytes).collect();
        assert_eq!(got, [vec![1], vec![3], vec![5]]);
        peer.drop_every(Direction::FromWorker, 0);
        io.send_datagram(&mut sock, &transmit(client, &[6]))
            .unwrap();
        io.send_datagram(&mut sock, &transmit(client, &[7]))
            .unwrap();
        assert_eq!(peer.recv_all().len(), 2, "off again");
    }

    #[test]
    fn the_network_reorders_a_batch_each_way() {
        let mut io = MemoryIo::new();
        let client = addr("198.51.100.7:5000");
        let (mut sock, peer) = io.datagram_socket(addr("192.0.2.1:443"));
        peer.reorder(Direction::ToWorker, Reorder::Reversed);
        for i in 1..=4u8 {
            peer.send_to(client, &[i]);
        }
        let got = read_datagrams(&mut io, &mut sock);
        assert_eq!(bytes_of(&got), [&[4u8][..], &[3], &[2], &[1]]);
        peer.reorder(Direction::ToWorker, Reorder::PairsSwapped);
        for i in 1..=5u8 {
            peer.send_to(client, &[i]);
        }
        let got = read_datagrams(&mut io, &mut sock);
        assert_eq!(bytes_of(&got), [&[2u8][..], &[1], &[4], &[3], &[5]]);

        peer.reorder(Direction::FromWorker, Reorder::Reversed);
        for i in 1..=3u8 {
            io.send_datagram(&mut sock, &transmit(client, &[i]))
                .unwrap();
        }
        // The batch is what was sent before the test took any; later sends are the next.
        assert_eq!(peer.recv().unwrap().bytes, [3]);
        io.send_datagram(&mut sock, &transmit(client, &[4]))
            .unwrap();
        io.send_datagram(&mut sock, &transmit(client, &[5]))
            .unwrap();
        let got: Vec<Vec<u8>> = peer.recv_all().into_iter().map(|d| d.bytes).collect();
        assert_eq!(got, [vec![2], vec![1], vec![5], vec![4]]);
    }

    #[test]
    fn a_rebinding_changes_the_source_the_worker_sees() {
        let mut io = MemoryIo::new();
        let (mut sock, peer) = io.datagram_socket(addr("192.0.2.1:443"));
        let (client, after_nat) = (addr("198.51.100.7:5000"), addr("203.0.113.4:61000"));
        let other = addr("198.51.100.8:5000");
        peer.send_to(client, b"a");
        peer.rebind(client, after_nat);
        peer.send_to(client, b"b");
        peer.send_to(other, b"c");
        let got = read_datagrams(&mut io, &mut sock);
        let sources: Vec<SocketAddr> = got.iter().map(|(from, _)| *from).collect();
        assert_eq!(sources, [client, after_nat, other]);
        io.send_datagram(&mut sock, &transmit(after_nat, b"answer"))
            .unwrap();
        assert_eq!(peer.recv().unwrap().to, after_nat);
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
