//! The boundary between the server and its sockets: everything above it names no file
//! descriptor, no `mio` type and no socket syscall, so another backend (io_uring, or sockets
//! in memory for tests) plugs in here without the connections above changing.
//!
//! The calls are *progress* calls. A readiness backend (epoll, [`EpollIo`]) makes the
//! syscall at once; a completion backend may submit the operation and answer "not yet"
//! (`WouldBlock`, `Ok(None)`), then report readiness for the socket's token once it
//! completed, and hand the result to the next call. Memory a [`Transmit`] names must
//! therefore not move until a call reports it sent (`conn/output.rs` seals what it handed
//! out), and `recv` copies into its buffer only when it returns bytes, so read buffers may
//! move between calls.

mod datagram;
mod epoll;
mod memory;
mod sys;
mod uring;

use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::path::Path;
use std::time::Duration;

use quinn_udp::{RecvMeta, Transmit as DatagramTransmit};

use crate::waker::Waker;

pub use epoll::{EpollDatagram, EpollIo, EpollSock};
pub use memory::{
    Direction, MemoryAddr, MemoryDatagram, MemoryDatagramPeer, MemoryIo, MemoryPeer, MemorySock,
    Reorder, SentDatagram,
};
pub use uring::{UringDatagram, UringIo, UringSock, UringStats};

/// What the event loop learnt about one watched socket in a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Readiness {
    /// The token the socket was watched under ([`Io::watch`]).
    pub token: usize,
    /// Bytes, the peer's FIN, or an error may be waiting: a read will say which.
    pub readable: bool,
    /// Room to write (for a connect in progress: it finished, one way or the other).
    pub writable: bool,
    /// The peer closed its side: a short read does not mean drained then, the end still has
    /// to be read (edge-triggered readiness will not report it again).
    pub read_closed: bool,
    /// The socket has an error to collect (by a read, or [`Io::connected`]).
    pub error: bool,
}

impl Readiness {
    /// Anything that calls for a read: bytes, the peer's FIN, or an error to collect.
    pub fn calls_for_read(&self) -> bool {
        self.readable || self.read_closed || self.error
    }
}

/// Bytes to send: memory (gathered), or a range of an open file.
#[derive(Debug)]
pub enum Transmit<'a> {
    /// `more`: more follows at once (a head before a file): the kernel may hold a partial
    /// packet back for it.
    Memory {
        iov: &'a [IoSlice<'a>],
        more: bool,
    },
    File {
        fd: RawFd,
        offset: u64,
        len: u64,
    },
}

/// Where an outgoing connection goes.
#[derive(Debug, Clone, Copy)]
pub enum Peer<'a> {
    Tcp(SocketAddr),
    Unix(&'a Path),
}

/// What waits in a socket, looked at without taking it ([`Io::peek`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    Nothing,
    Bytes,
    /// The peer closed it (or it failed).
    Closed,
}

/// One worker's sockets. Every call is made on the worker's own thread.
pub trait Io: 'static {
    type Sock;
    /// One bound UDP socket of this backend (`RuntimeConfig::datagram_listen`, handed to the
    /// app by `WorkerApp::adopt_datagrams`). Dropping it closes it.
    type Datagram;

    /// A send may complete after [`Io::send`] returns (a completion backend: io_uring): it
    /// answers `Ok(None)` for a send it took, keeps using the memory it was given until the
    /// socket's next readiness report, and the server seals that memory meanwhile (see
    /// `Output::seal` in tern-server). Readiness backends send at once.
    const SENDS_COMPLETE_LATER: bool = false;

    /// Starts an outgoing connection (non-blocking: [`Io::connected`] tells when it is up).
    fn connect(&mut self, to: Peer<'_>) -> io::Result<Self::Sock>;
    /// Reports the socket's readiness under `token` from now on, for its whole life.
    fn watch(&mut self, sock: &mut Self::Sock, token: usize) -> io::Result<()>;
    /// For an outgoing connection, after its socket turned writable: established (`true`),
    /// still connecting (`false`), or its error.
    fn connected(&mut self, sock: &mut Self::Sock) -> io::Result<bool>;
    /// Sends some of `what`: `Ok(Some(n))` bytes went, `Ok(None)` no room now. A file range
    /// that ended early (the file shrank) is an `UnexpectedEof` error.
    fn send(&mut self, sock: &mut Self::Sock, what: &Transmit<'_>) -> io::Result<Option<usize>>;
    /// Reads into `buf`: `Ok(0)` is the peer's end; `WouldBlock` means nothing now.
    fn recv(&mut self, sock: &mut Self::Sock, buf: &mut [u8]) -> io::Result<usize>;
    /// Looks at what waits without taking it.
    fn peek(&mut self, sock: &mut Self::Sock) -> Waiting;
    /// Sends our end of the stream; reading goes on.
    fn shutdown_write(&mut self, sock: &mut Self::Sock) -> io::Result<()>;
    /// Bytes sent that the peer has not acknowledged yet: a client that reads, however
    /// slowly, makes it shrink (the write-stall check).
    fn unacked_bytes(&self, sock: &Self::Sock) -> io::Result<u32>;

    /// True if a `recv` that filled less than its buffer took everything that was waiting,
    /// as a kernel socket's does: the worker then skips the read that would only say
    /// `WouldBlock`, and trusts the socket to be empty until its next readiness report. A
    /// backend that hands bytes out in smaller pieces on purpose (the memory one, to run the
    /// relay over every read size) says false for such a socket, and is read until
    /// `WouldBlock`.
    #[inline]
    fn short_read_drains(&self, _sock: &Self::Sock) -> bool {
        true
    }

    /// A connection that waited idle in a pool is taken to carry another exchange. Nothing
    /// for a kernel socket; the memory backend notes it, so that a test sees a connection
    /// reused with bytes of an earlier answer still unread in it (they would be read as the
    /// next answer).
    #[inline]
    fn reused(&mut self, _sock: &mut Self::Sock) {}

    /// The app has no room for this socket's input now (a relay whose client takes
    /// nothing): a backend that receives ahead of the app stops doing so until the next
    /// `recv`, so the bytes wait in the kernel's socket buffer (and push back on the sender)
    /// rather than in the backend's memory. A readiness backend never reads ahead.
    #[inline]
    fn hold_input(&mut self, _sock: &mut Self::Sock) {}

    /// Reports the UDP socket's readiness under `token` from now on, for its whole life, edge
    /// triggered as for [`Io::watch`]: readable when datagrams arrive (read until
    /// `WouldBlock`: no new report comes for datagrams already waiting), writable once
    /// there is room again after [`Io::send_datagram`] found none. Like a new epoll
    /// registration, the first report gives the socket's state now (writable, and readable
    /// if datagrams wait).
    fn watch_datagram(&mut self, sock: &mut Self::Datagram, token: usize) -> io::Result<()>;
    /// Receives into `bufs`, one buffer (and the `meta` of the same index) per arrival:
    /// the number of buffers filled, or `WouldBlock` when nothing waits. With GRO
    /// ([`Io::gro_segments`] above 1) a buffer may hold several datagrams from one sender,
    /// `meta.stride` bytes apart (the last may be shorter), so buffers should hold
    /// 64 KiB; a datagram longer than its buffer is cut short.
    fn recv_datagrams(
        &mut self,
        sock: &mut Self::Datagram,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize>;
    /// Sends one datagram, or with `segment_size` several of that size cut from `contents`
    /// (GSO; at most [`Io::max_gso_segments`]): `Ok(true)` sent, `Ok(false)` no room now
    /// (keep it; a writable report follows). A datagram too large for the path (`EMSGSIZE`,
    /// an MTU probe) counts as sent, lost on the way; other errors (an unreachable
    /// network, ...) are returned and the datagram is gone.
    fn send_datagram(
        &mut self,
        sock: &mut Self::Datagram,
        transmit: &DatagramTransmit<'_>,
    ) -> io::Result<bool>;
    /// The address the socket is bound to (with the port picked if 0 was asked for).
    fn datagram_local_addr(&self, sock: &Self::Datagram) -> SocketAddr;
    /// The most datagrams one [`Io::send_datagram`] may carry: 1 without GSO. It may drop to
    /// 1 after a send failed with GSO (a device that cannot segment).
    fn max_gso_segments(&self, sock: &Self::Datagram) -> usize;
    /// The most datagrams one receive buffer may hold (GRO): 1 without it, 64 with it.
    fn gro_segments(&self, sock: &Self::Datagram) -> usize;

    /// The ring's work since the last call, for a completion backend (`None` for others).
    #[inline]
    fn take_ring_counts(&mut self) -> Option<UringStats> {
        None
    }

    /// True if a panic unwound out of one of this backend's own calls: its tables (which
    /// socket a completion belongs to, which buffers are lent out) may be half-updated, so a
    /// worker that contains a connection's panic must not go on with it (it gives the panic
    /// up to its thread instead: the worker is lost). A backend whose state lives in the
    /// kernel (epoll) has nothing to leave half-updated.
    #[inline]
    fn poisoned(&self) -> bool {
        false
    }
}

/// The event-loop side of a backend: what the runtime's worker loop asks of the backend it
/// runs on (epoll's [`EpollIo`], or io_uring's), besides the sockets' calls of [`Io`].
pub trait Backend: Io + Sized {
    /// The name start-up reports.
    const NAME: &'static str;
    /// What a worker's backend needs made on the thread that starts the runtime, before the
    /// sandbox closes; handed to the worker's thread.
    type Prepared: Send + 'static;

    /// Makes the backend on its worker's own thread.
    fn start(prepared: Self::Prepared) -> io::Result<Self>;

    /// Reports `listener` readable under `token` whenever connections wait in its queue
    /// (the worker then accepts them with `accept` until it would block).
    fn watch_listener(
        &mut self,
        listener: &mut mio::net::TcpListener,
        token: usize,
    ) -> io::Result<()>;
    /// Stops reporting `listener` (it is about to close).
    fn unwatch_listener(&mut self, listener: &mut mio::net::TcpListener);
    /// Reports the inbox's waker under `token` whenever another thread wakes the worker.
    fn watch_waker(&mut self, waker: &Waker, token: usize) -> io::Result<()>;
    /// Waits up to `timeout` (`None`: until something happens; zero: not at all) and
    /// appends what it learnt to `ready`, at most one entry per token.
    fn wait(&mut self, timeout: Option<Duration>, ready: &mut Vec<Readiness>) -> io::Result<()>;
    /// Takes a connection a listener accepted (not watched yet: the first request is often
    /// there already and is served before any event).
    fn adopt(&mut self, stream: std::net::TcpStream) -> Self::Sock;
    /// Takes a bound UDP socket (not watched yet), on the worker's thread: turns on the
    /// kernel's offloads and control messages for it (setsockopt, which the sandbox allows
    /// after lockdown) and makes it non-blocking.
    fn adopt_datagram(&mut self, sock: std::net::UdpSocket) -> io::Result<Self::Datagram>;
    /// The worker is about to exit, its sockets dropped: what they sent that is still on its
    /// way gets up to `within` to go out (a kernel socket's buffer outlives the process; a
    /// ring's operations do not). Nothing to do for a readiness backend.
    fn flush(&mut self, _within: Duration) {}
}
