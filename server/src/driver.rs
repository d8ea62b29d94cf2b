//! The socket side of a connection: the only code that reads, writes, sends files, shuts down
//! and closes. It runs a [`Conn`] (which does no I/O) the way quinn's driver runs a
//! quinn-proto connection: send what `poll_transmit` offers until the socket is full or the
//! budget is spent, ask `poll_action` what next, read into `recv_buf` and report it with
//! `handle_recv`, repeat. An io_uring driver would replace this file, not the connection.

use std::io::{self, IoSlice, Read};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};

use mio::net::TcpStream;

use crate::conn::output::MAX_IOVECS;
use crate::conn::{Action, Conn, Status, Timeout, Transmit};
use crate::exchange::ConnCx;
use crate::stats::Counter;

/// Largest `sendfile` per call: bounds how long one connection holds the worker.
const SENDFILE_CHUNK: u64 = 1 << 20;
/// Bytes one connection may write per turn before yielding to the others.
pub const FLUSH_BUDGET: usize = 4 << 20;

/// A connection in the worker's slab: the socket (driver side), the sans-IO connection, and
/// its timer bookkeeping.
pub(crate) struct Entry {
    pub sock: Socket,
    pub conn: Conn,
    /// Current deadline and the deadline of the live timer-wheel entry (see TimerWheel).
    pub deadline_ms: u64,
    pub armed_ms: u64,
    /// The upstream connections (keys in the worker's `UpstreamConns`) of the exchanges it
    /// relays, by relay id (HTTP/1.1: one, id 0; HTTP/2: a stream id each).
    pub upstreams: Vec<(u32, u64)>,
}

/// A connection's socket and what the driver knows about it.
pub(crate) struct Socket {
    pub stream: TcpStream,
    /// The socket may hold unread bytes (an event came, and no short read since).
    may_read: bool,
    /// epoll reported the peer's FIN: a short read does not mean drained then, the EOF still
    /// has to be read (edge-triggered epoll will not report it again).
    peer_fin: bool,
    /// While output waits: the kernel's unacknowledged bytes when the write period began,
    /// to tell a slow reader (it shrinks) from one that stopped (it does not).
    unacked_mark: u32,
    /// While output waits: when the current write period ends. Set when output starts
    /// waiting and moved only by the client's progress (see [`still_reading`]), never by its
    /// other events: a client that sends a byte now and then but reads nothing must not hold
    /// its answer, and its connection, forever.
    write_deadline_ms: Option<u64>,
}

impl Socket {
    pub fn new(stream: TcpStream) -> Socket {
        Socket {
            stream,
            may_read: true,
            peer_fin: false,
            unacked_mark: 0,
            write_deadline_ms: None,
        }
    }

    /// True if bytes may be waiting unread (shutdown then reads before closing).
    pub fn may_read(&self) -> bool {
        self.may_read
    }
}

/// Readiness (or a retry after a yield, or a completed reply): send, read, answer, repeat.
/// `peer_fin`: the event said the peer closed its side.
pub(crate) fn drive(
    conn: &mut Conn,
    sock: &mut Socket,
    readable: bool,
    peer_fin: bool,
    cx: &mut ConnCx<'_>,
) -> Status {
    if readable {
        sock.may_read = true;
    }
    if peer_fin {
        sock.peer_fin = true;
    }
    let status = run(conn, sock, cx);
    if status != Status::Close {
        conn.release_idle_buffers(cx.buffers);
    }
    status
}

fn run(conn: &mut Conn, sock: &mut Socket, cx: &mut ConnCx<'_>) -> Status {
    let mut written = 0usize;
    loop {
        match send(conn, sock, cx, &mut written) {
            Sent::All => {}
            Sent::Blocked => return Status::Open,
            Sent::BudgetSpent => return Status::Yielded,
            Sent::Failed => {
                cx.stats.bump(Counter::IoErrors);
                return Status::Close;
            }
        }
        match conn.poll_action(cx) {
            Action::Transmit => {}
            Action::Close => return Status::Close,
            Action::Wait => return Status::Open,
            Action::ShutdownWrite => {
                let _ = sock.stream.shutdown(Shutdown::Write);
                sock.may_read = true;
                conn.handle_write_shutdown(cx);
            }
            Action::Read => {
                if !sock.may_read {
                    // Shutting down, between requests, and the socket is drained: this
                    // connection is done. (With bytes possibly waiting we read first: closing
                    // a socket with an unread request would reset it.)
                    if cx.draining && conn.is_idle() {
                        return Status::Close;
                    }
                    return Status::Open;
                }
                let buf = conn.recv_buf(cx);
                if buf.is_empty() {
                    return Status::Open; // the connection takes no input now (backpressure)
                }
                let want = buf.len();
                match (&sock.stream).read(buf) {
                    Ok(0) => {
                        sock.may_read = false;
                        conn.handle_eof(cx);
                    }
                    Ok(n) => {
                        // A short read drained the socket: skip the read that would say EAGAIN
                        // (unless a FIN is known to follow the data).
                        if n < want && !sock.peer_fin {
                            sock.may_read = false;
                        }
                        conn.handle_recv(n, cx);
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
                        if !conn.is_lingering() {
                            cx.stats.bump(Counter::IoErrors);
                        }
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

/// Sends what the connection has until it has nothing more, the socket is full, or the
/// turn's budget is spent.
fn send(conn: &mut Conn, sock: &mut Socket, cx: &mut ConnCx<'_>, written: &mut usize) -> Sent {
    let fd = sock.stream.as_raw_fd();
    loop {
        if *written >= FLUSH_BUDGET {
            return Sent::BudgetSpent;
        }
        let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
        let result = match conn.poll_transmit(cx, &mut iov) {
            Transmit::Nothing => return Sent::All,
            Transmit::Failed => return Sent::Failed,
            transmit => send_once(fd, &transmit, &iov),
        };
        match result {
            Ok(Some(n)) => {
                conn.handle_sent(n);
                *written += n;
            }
            Ok(None) => return Sent::Blocked,
            Err(_) => return Sent::Failed,
        }
    }
}

/// One last attempt to send what is queued (a 408, close_notify), ignoring the outcome: the
/// connection closes right after.
pub(crate) fn send_best_effort(conn: &mut Conn, sock: &mut Socket, cx: &mut ConnCx<'_>) {
    let mut written = 0;
    let _ = send(conn, sock, cx, &mut written);
}

/// One `write`, `writev`, `sendmsg(MSG_MORE)` or `sendfile`. `Ok(None)` means would block.
pub(crate) fn send_once(
    fd: RawFd,
    transmit: &Transmit,
    iov: &[IoSlice<'_>],
) -> io::Result<Option<usize>> {
    let result = match *transmit {
        Transmit::Memory { count, more } => write_memory(fd, &iov[..count], more),
        Transmit::File { file, offset, len } => send_file(fd, file, offset, len),
        Transmit::Nothing | Transmit::Failed => return Ok(Some(0)),
    };
    match result {
        Ok(0) => Err(io::ErrorKind::WriteZero.into()),
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(0)),
        Err(e) => Err(e),
    }
}

fn write_memory(fd: RawFd, iov: &[IoSlice<'_>], more: bool) -> io::Result<usize> {
    // A file follows (a head before sendfile): MSG_MORE lets the kernel fill the head's packet
    // with the file's first bytes instead of sending the head alone.
    let flags = libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    let n = if iov.len() == 1 {
        // The common case: one contiguous buffer.
        // SAFETY: the slice is valid for its length for the duration of the call; `fd` is
        // the caller's open socket.
        unsafe { libc::send(fd, iov[0].as_ptr().cast(), iov[0].len(), flags) }
    } else {
        // SAFETY: IoSlice is ABI-compatible with iovec on Unix (std guarantees it); the slices
        // outlive the call; the msghdr names no address and no control data.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov.len() as _;
            libc::sendmsg(fd, &msg, flags)
        }
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn send_file(fd: RawFd, file: RawFd, offset: u64, len: u64) -> io::Result<usize> {
    let count = len.min(SENDFILE_CHUNK) as usize;
    let mut off = offset as libc::off_t;
    // SAFETY: both descriptors are open for the duration of the call (the socket is the
    // caller's, the file is held by the output segment); `off` is a valid, exclusively
    // borrowed off_t that the kernel updates; no memory is shared otherwise.
    let n = unsafe { libc::sendfile(fd, file, &mut off, count) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        // The file shrank under us: the promised Content-Length can no longer be met.
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file truncated while sending",
        ));
    }
    Ok(n as usize)
}

/// Called whenever the deadline is set, with the one the connection's state calls for; returns
/// the one to arm. A write deadline is kept from when output started waiting (remembering how
/// much of it the client had yet to acknowledge then), not pushed back by every event.
pub(crate) fn write_period(sock: &mut Socket, kind: Timeout, deadline: u64) -> u64 {
    if kind != Timeout::Write {
        sock.write_deadline_ms = None;
        return deadline;
    }
    if let Some(d) = sock.write_deadline_ms {
        return d;
    }
    // An error leaves 0, which nothing can undercut: the stall then times out.
    sock.unacked_mark = tern_runtime::unacked_bytes(&sock.stream).unwrap_or(0);
    sock.write_deadline_ms = Some(deadline);
    deadline
}

/// The write deadline passed, but the client acknowledged some of our output since the
/// period began: it is reading, only slower than the kernel wakes us (epoll reports a socket
/// writable only once a third of its send buffer is free). Such a client gets another period
/// (the next [`write_period`] starts one); one that acknowledged nothing is cut off.
pub(crate) fn still_reading(conn: &Conn, sock: &mut Socket, cx: &ConnCx<'_>) -> bool {
    let reading = conn.next_deadline(cx).1 == Timeout::Write
        && tern_runtime::unacked_bytes(&sock.stream).is_ok_and(|n| n < sock.unacked_mark);
    if reading {
        sock.write_deadline_ms = None;
    }
    reading
}
