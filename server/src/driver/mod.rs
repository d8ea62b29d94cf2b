//! The socket side of the server: the one loop that moves bytes between a socket and a
//! sans-IO byte stream ([`pump`]), for client sockets and upstream sockets alike, all through
//! the worker's [`Io`] backend. It runs a [`Stream`] the way quinn's driver runs a quinn-proto
//! connection: send what `poll_transmit` offers until the socket is full or the budget is
//! spent, ask `poll_action` what next, read into `recv_buf` and report it with `handle_recv`,
//! repeat. The stream is a client's [`Conn`] or the upstream half of one of its relays
//! (`conn/upstream.rs`). TLS lives on the stream side of both (inside `Conn`; beside the
//! relay in the upstream half): the loop moves records, never plaintext, so it needs no
//! wrapper per transport, and a completion backend is handed buffers that stay put until
//! sent. Besides the loop, this file keeps the client socket's write-stall bookkeeping.
//!
//! The upstream side: `relay.rs` drives a connection's relays (connect, handshake, pool,
//! release) and `pool.rs` keeps the worker's upstream connections.

pub(crate) mod pool;
pub(crate) mod relay;

use std::io::{self, IoSlice};

use tern_runtime::io::{Io, Transmit as IoTransmit};

use crate::conn::output::MAX_IOVECS;
use crate::conn::stream::Stream;
use crate::conn::{Action, Conn, Status, Timeout, Transmit};
use crate::exchange::ConnCx;
use crate::handler::ExchangeId;

/// Bytes one client connection may write per turn before yielding to the others.
pub const FLUSH_BUDGET: usize = 4 << 20;

/// A connection in the worker's slab: the socket (driver side), the sans-IO connection, and
/// its timer bookkeeping.
pub(crate) struct Entry<I: Io> {
    pub sock: Socket<I>,
    pub conn: Conn,
    /// Current deadline and the deadline of the live timer-wheel entry (see TimerWheel).
    pub deadline_ms: u64,
    pub armed_ms: u64,
    /// The upstream connections (keys in the worker's `UpstreamConns`) of the exchanges it
    /// relays, by relay id (HTTP/1.1: one, id 0; HTTP/2: a stream id each).
    pub upstreams: Vec<(ExchangeId, u64)>,
}

/// A socket and what the driver knows about it: a client's, or one to an upstream server.
pub(crate) struct Socket<I: Io> {
    pub sock: I::Sock,
    /// The socket may hold unread bytes (an event came, and no short read since).
    may_read: bool,
    /// The event loop reported the peer's FIN: a short read does not mean drained then, the
    /// EOF still has to be read (edge-triggered readiness will not report it again).
    peer_fin: bool,
    /// While output waits: some of it went out since the write period began. The socket
    /// was full when the period began, so a send that succeeded since means the client's
    /// side took bytes (and that our refills may keep the kernel's queue as full as
    /// `unacked_mark` says it was). (Client sockets only, as the two fields below: an
    /// upstream socket never starts a write period, its timeouts are the relay's.)
    sent_in_period: bool,
    /// While output waits: the kernel's unacknowledged bytes when the write period began,
    /// to tell a slow reader (it shrinks) from one that stopped (it does not).
    unacked_mark: u32,
    /// While output waits: when the current write period ends. Set when output starts
    /// waiting and moved only by the client's progress (see [`still_reading`]), never by its
    /// other events: a client that sends a byte now and then but reads nothing must not hold
    /// its answer, and its connection, forever.
    write_deadline_ms: Option<u64>,
}

impl<I: Io> Socket<I> {
    /// `may_read`: bytes may be there already (an accepted client socket: the listener waited
    /// for its first bytes); an outgoing connection waits for its first readiness report.
    pub fn new(sock: I::Sock, may_read: bool) -> Socket<I> {
        Socket {
            sock,
            may_read,
            peer_fin: false,
            sent_in_period: false,
            unacked_mark: 0,
            write_deadline_ms: None,
        }
    }

    /// A readiness report: bytes (or an error) may wait, and the peer may have ended its side.
    pub fn note(&mut self, readable: bool, peer_fin: bool) {
        if readable || peer_fin {
            self.may_read = true;
        }
        if peer_fin {
            self.peer_fin = true;
        }
    }

    /// True if bytes may be waiting unread (shutdown then reads before closing).
    pub fn may_read(&self) -> bool {
        self.may_read
    }

    /// The event loop reported the peer's FIN.
    pub fn peer_fin(&self) -> bool {
        self.peer_fin
    }
}

/// Readiness (or a retry after a yield, or a completed reply) of a client connection: send,
/// read, answer, repeat. `peer_fin`: the event said the peer closed its side.
pub(crate) fn drive<I: Io>(
    conn: &mut Conn,
    sock: &mut Socket<I>,
    io: &mut I,
    readable: bool,
    peer_fin: bool,
    cx: &mut ConnCx<'_>,
) -> Status {
    sock.note(readable, peer_fin);
    let status = pump(conn, sock, io, cx, FLUSH_BUDGET);
    if status != Status::Close {
        conn.release_idle_buffers(cx.buffers);
    }
    status
}

/// The one socket loop: sends what the stream offers, then does what it asks next (read,
/// wait, shut the write side, close), until it waits, the socket is full or drained, or
/// `budget` bytes were written (`Yielded`: the worker drives it again next turn). `Close`:
/// the stream asked for it, or the socket failed (the stream was told, `handle_error`).
pub(crate) fn pump<I: Io, S: Stream>(
    s: &mut S,
    sock: &mut Socket<I>,
    io: &mut I,
    cx: &mut ConnCx<'_>,
    budget: usize,
) -> Status {
    let mut written = 0usize;
    loop {
        match send(s, sock, io, cx, &mut written, budget) {
            Sent::All => {}
            Sent::Blocked => return Status::Open,
            Sent::BudgetSpent => return Status::Yielded,
            Sent::Failed => {
                s.handle_error(cx);
                return Status::Close;
            }
        }
        match s.poll_action(cx) {
            Action::Transmit => {}
            Action::Close => return Status::Close,
            Action::Wait => return Status::Open,
            Action::ShutdownWrite => {
                let _ = io.shutdown_write(&mut sock.sock);
                sock.may_read = true;
                s.handle_write_shutdown(cx);
            }
            Action::Read => {
                if !sock.may_read {
                    // Shutting down, between requests, and the socket is drained: this
                    // connection is done. (With bytes possibly waiting we read first: closing
                    // a socket with an unread request would reset it.)
                    if cx.draining && s.is_idle() {
                        return Status::Close;
                    }
                    return Status::Open;
                }
                let buf = s.recv_buf(cx);
                if buf.is_empty() {
                    // The stream takes no input now (backpressure): what waits stays in
                    // the kernel until it asks again.
                    io.hold_input(&mut sock.sock);
                    return Status::Open;
                }
                let want = buf.len();
                match io.recv(&mut sock.sock, buf) {
                    Ok(0) => {
                        sock.may_read = false;
                        s.handle_eof(cx);
                    }
                    Ok(n) => {
                        // A short read drained the socket: skip the read that would say EAGAIN
                        // (unless a FIN is known to follow the data).
                        if n < want && !sock.peer_fin && io.short_read_drains(&sock.sock) {
                            sock.may_read = false;
                        }
                        s.handle_recv(n, cx);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        sock.may_read = false;
                        // Draining: go round once more so an idle connection is closed now.
                        if !cx.draining {
                            return Status::Open;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        sock.may_read = false;
                        s.handle_error(cx);
                        return Status::Close;
                    }
                }
            }
        }
    }
}

enum Sent {
    All,
    Blocked,
    BudgetSpent,
    Failed,
}

/// Sends what the stream has until it has nothing more, the socket is full, or `budget` is
/// spent.
fn send<I: Io, S: Stream>(
    s: &mut S,
    sock: &mut Socket<I>,
    io: &mut I,
    cx: &mut ConnCx<'_>,
    written: &mut usize,
    budget: usize,
) -> Sent {
    // The slices are made afresh for every send (they borrow the stream): a stream that
    // offers one at a time is not given 64 to clear each time (1 KiB, several times per
    // proxied request).
    if S::ONE_SLICE {
        send_with::<1, I, S>(s, sock, io, cx, written, budget)
    } else {
        send_with::<MAX_IOVECS, I, S>(s, sock, io, cx, written, budget)
    }
}

fn send_with<const N: usize, I: Io, S: Stream>(
    s: &mut S,
    sock: &mut Socket<I>,
    io: &mut I,
    cx: &mut ConnCx<'_>,
    written: &mut usize,
    budget: usize,
) -> Sent {
    loop {
        if *written >= budget {
            return Sent::BudgetSpent;
        }
        let mut iov = [IoSlice::new(&[]); N];
        let result = match s.poll_transmit(cx, &mut iov) {
            Transmit::Nothing => return Sent::All,
            Transmit::Failed => return Sent::Failed,
            transmit => send_once(io, &mut sock.sock, &transmit, &iov),
        };
        match result {
            Ok(Some(n)) => {
                s.handle_sent(n, cx);
                *written += n;
                sock.sent_in_period |= n > 0 && sock.write_deadline_ms.is_some();
            }
            Ok(None) => {
                if I::SENDS_COMPLETE_LATER {
                    s.seal();
                }
                return Sent::Blocked;
            }
            Err(_) => return Sent::Failed,
        }
    }
}

/// One last attempt to send what is queued (a 408, close_notify), ignoring the outcome: the
/// connection closes right after.
pub(crate) fn send_best_effort<I: Io>(
    conn: &mut Conn,
    sock: &mut Socket<I>,
    io: &mut I,
    cx: &mut ConnCx<'_>,
) {
    let mut written = 0;
    let _ = send(conn, sock, io, cx, &mut written, FLUSH_BUDGET);
}

/// Hands what `poll_transmit` chose to the backend. `Ok(None)` means no room now.
pub(crate) fn send_once<I: Io>(
    io: &mut I,
    sock: &mut I::Sock,
    transmit: &Transmit,
    iov: &[IoSlice<'_>],
) -> io::Result<Option<usize>> {
    let what = match *transmit {
        Transmit::Memory { count, more } => IoTransmit::Memory {
            iov: &iov[..count],
            more,
        },
        Transmit::File { file, offset, len } => IoTransmit::File {
            fd: file,
            offset,
            len,
        },
        Transmit::Nothing | Transmit::Failed => return Ok(Some(0)),
    };
    io.send(sock, &what)
}

/// Called whenever the deadline is set, with the one the connection's state calls for; returns
/// the one to arm. A write deadline is kept from when output started waiting (remembering how
/// much of it the client had yet to acknowledge then), not pushed back by every event.
pub(crate) fn write_period<I: Io>(
    sock: &mut Socket<I>,
    io: &I,
    kind: Timeout,
    deadline: u64,
) -> u64 {
    if kind != Timeout::Write {
        sock.write_deadline_ms = None;
        return deadline;
    }
    if let Some(d) = sock.write_deadline_ms {
        return d;
    }
    // An error leaves 0, which nothing can undercut: the stall then times out.
    sock.unacked_mark = io.unacked_bytes(&sock.sock).unwrap_or(0);
    sock.sent_in_period = false;
    sock.write_deadline_ms = Some(deadline);
    deadline
}

/// The write deadline passed, but the client took some of our output since the period
/// began: more of it went out (room freed up, and we filled it again), or the kernel holds
/// fewer unacknowledged bytes than then (it reads, only slower than the kernel wakes us:
/// epoll reports a socket writable only once a third of its send buffer is free). Such a
/// client gets another period (the next [`write_period`] starts one); one that took nothing
/// is cut off.
pub(crate) fn still_reading<I: Io>(
    conn: &Conn,
    sock: &mut Socket<I>,
    io: &I,
    cx: &ConnCx<'_>,
) -> bool {
    let reading = conn.next_deadline(cx).1 == Timeout::Write
        && (sock.sent_in_period
            || io
                .unacked_bytes(&sock.sock)
                .is_ok_and(|n| n < sock.unacked_mark));
    if reading {
        sock.write_deadline_ms = None;
    }
    reading
}
