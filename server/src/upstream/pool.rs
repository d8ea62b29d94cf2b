//! A worker's connections to upstream servers: the ones relaying an exchange (owned by a
//! client connection) and the idle ones kept alive for the next request, per server. Only
//! the worker touches them, so there is no lock; each is registered with the worker's epoll
//! once, for its whole life, under a token with [`UPSTREAM_TOKEN`] set.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;

use tern_runtime::io::{Io, Peer, Transmit, Waiting};
use tern_runtime::ratelog;

use super::{UpstreamAddr, Upstreams};
use crate::slab::Slab;

/// Set in the token (and slab key) of every upstream connection; client connection keys
/// never have it (their generation is kept below 2^31).
pub(crate) const UPSTREAM_TOKEN: u64 = 1 << 63;

pub(crate) enum UpStream<I: Io> {
    /// TCP or a Unix socket, bytes as they are.
    Plain(I::Sock),
    /// TCP with TLS on it (boxed: the rustls state is large, plain connections stay small).
    Tls(Box<TlsUp<I>>),
}

/// A TLS client connection to an upstream, driven sans-IO: the relay's bytes are encrypted
/// into rustls and the records written to the socket; records read from the socket are
/// decrypted into the relay's buffer.
pub(crate) struct TlsUp<I: Io> {
    sock: I::Sock,
    tls: rustls::ClientConnection,
    /// The socket reported end of file (or the peer's close_notify came with the last bytes
    /// read): a read must still report the end.
    eof: bool,
}

/// Plaintext taken from the relay per write: one buffer's worth at most sits in rustls
/// (records not yet written to the socket), so a slow upstream holds no more than a plain
/// connection's socket buffer would.
const TLS_WRITE_CHUNK: usize = 16 * 1024;

/// The socket as rustls reads and writes its records: through the backend.
struct Wire<'a, I: Io> {
    io: &'a mut I,
    sock: &'a mut I::Sock,
}

impl<I: Io> Read for Wire<'_, I> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.recv(self.sock, buf)
    }
}

impl<I: Io> Write for Wire<'_, I> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let iov = [IoSlice::new(buf)];
        let what = Transmit::Memory {
            iov: &iov,
            more: false,
        };
        match self.io.send(self.sock, &what)? {
            Some(0) => Err(io::ErrorKind::Interrupted.into()),
            Some(n) => Ok(n),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn wire<'a, I: Io>(sock: &'a mut I::Sock, io: &'a mut I) -> Wire<'a, I> {
    Wire { io, sock }
}

impl<I: Io> TlsUp<I> {
    /// Writes the records rustls holds; WouldBlock if some remain.
    fn flush(&mut self, io: &mut I) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut wire(&mut self.sock, io)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads records into rustls; Ok(false) at end of file.
    fn take_records(&mut self, io: &mut I) -> io::Result<bool> {
        loop {
            match self.tls.read_tls(&mut wire(&mut self.sock, io)) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(_) => {
                    if let Err(e) = self.tls.process_new_packets() {
                        // Best effort: the alert rustls wants to send says why.
                        let _ = self.flush(io);
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Moves the handshake on: true once it is done. A failed handshake's error holds the
    /// `rustls::Error` (see [`tls_failure`]).
    fn handshake(&mut self, io: &mut I, may_read: &mut bool) -> io::Result<bool> {
        loop {
            match self.flush(io) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
            if !self.tls.is_handshaking() {
                return Ok(true);
            }
            if !*may_read {
                return Ok(false);
            }
            match self.take_records(io) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "closed during the TLS handshake",
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    *may_read = false;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Fills `buf` with plaintext as far as there is any: a short read means both the
    /// socket and rustls are drained (or the socket ended: [`UpStream::holds_more`]).
    fn read(&mut self, io: &mut I, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        loop {
            match self.tls.reader().read(&mut buf[n..]) {
                // close_notify: the end, said by the next read if this one has bytes.
                Ok(0) => {
                    self.eof |= n > 0;
                    return Ok(n);
                }
                Ok(k) => {
                    n += k;
                    if n == buf.len() {
                        return Ok(n);
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Closed without close_notify: many servers do; the HTTP framing tells a
                // cut-short answer.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(n),
                Err(e) => return if n > 0 { Ok(n) } else { Err(e) },
            }
            match self.take_records(io) {
                Ok(_) => {}
                Err(e) if n > 0 && e.kind() == io::ErrorKind::WouldBlock => return Ok(n),
                Err(e) => return if n > 0 { Ok(n) } else { Err(e) },
            }
            // Anything rustls answers by itself (a key update) goes out now.
            match self.flush(io) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn write(&mut self, io: &mut I, buf: &[u8]) -> io::Result<usize> {
        self.flush(io)?;
        let n = self
            .tls
            .writer()
            .write(&buf[..buf.len().min(TLS_WRITE_CHUNK)])?;
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match self.flush(io) {
            Ok(()) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
            Err(e) => Err(e),
        }
    }

    /// Between exchanges: plaintext nobody asked for, the end, or nothing (records that carry
    /// no data, such as a late session ticket, are taken and say nothing).
    fn waiting(&mut self, io: &mut I) -> Waiting {
        loop {
            match self.tls.process_new_packets() {
                Ok(state) if state.plaintext_bytes_to_read() > 0 => return Waiting::Bytes,
                Ok(state) if state.peer_has_closed() => return Waiting::Closed,
                Ok(_) => {}
                Err(_) => return Waiting::Closed,
            }
            if self.eof {
                return Waiting::Closed;
            }
            match self.take_records(io) {
                Ok(true) => {}
                Ok(false) => return Waiting::Closed,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Waiting::Nothing,
                Err(_) => return Waiting::Closed,
            }
        }
    }
}

/// The rustls error inside an I/O error from a TLS upstream connection, if that is what it is.
pub(crate) fn tls_failure(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref())
}

impl<I: Io> UpStream<I> {
    fn sock(&mut self) -> &mut I::Sock {
        match self {
            UpStream::Plain(s) => s,
            UpStream::Tls(t) => &mut t.sock,
        }
    }

    pub fn read(&mut self, io: &mut I, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            UpStream::Plain(s) => io.recv(s, buf),
            UpStream::Tls(t) => t.read(io, buf),
        }
    }

    pub fn write(&mut self, io: &mut I, buf: &[u8]) -> io::Result<usize> {
        match self {
            UpStream::Plain(s) => wire(s, io).write(buf),
            UpStream::Tls(t) => t.write(io, buf),
        }
    }

    /// Sends our end of the stream (a tunnel's client ended its side); reading goes on. Over
    /// TLS that is close_notify, then the FIN once it is written (if the socket is full now,
    /// `flush_pending` writes it later and the FIN is left out: close_notify says it all).
    pub fn shutdown_write(&mut self, io: &mut I) -> io::Result<()> {
        match self {
            UpStream::Plain(s) => io.shutdown_write(s),
            UpStream::Tls(t) => {
                t.tls.send_close_notify();
                match t.flush(io) {
                    Ok(()) => io.shutdown_write(&mut t.sock),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Writes what TLS still holds from earlier writes (a plain socket holds nothing back).
    pub fn flush_pending(&mut self, io: &mut I) -> io::Result<()> {
        match self {
            UpStream::Tls(t) => match t.flush(io) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
                other => other,
            },
            UpStream::Plain(_) => Ok(()),
        }
    }

    /// A short read did not drain it: the socket ended and a read must still say so.
    pub fn holds_more(&self) -> bool {
        matches!(self, UpStream::Tls(t) if t.eof)
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, UpStream::Tls(_))
    }

    /// What waits in the socket, looked at without taking it. A connection between exchanges
    /// must hold nothing: bytes there are an answer to no request of ours (a stray answer, or
    /// the answer to a request smuggled in a body the server did not read as one), and the
    /// next request sent on it would be answered with them. Edge-triggered readiness cannot
    /// tell: the bytes may have come with the last answer's, in the read that ended it.
    pub fn waiting(&mut self, io: &mut I) -> Waiting {
        match self {
            UpStream::Plain(s) => io.peek(s),
            UpStream::Tls(t) => t.waiting(io),
        }
    }
}

/// One upstream connection.
pub(crate) struct UpConn<I: Io> {
    pub stream: UpStream<I>,
    pub set: Arc<dyn Upstreams>,
    pub server: usize,
    /// The client connection relaying through it; 0 while idle in the pool.
    pub owner: u64,
    pub connected: bool,
    /// An event said it may be writable (for a connect in progress).
    pub write_event: bool,
    /// Bytes may be waiting (an event came, and no short read since).
    pub may_read: bool,
    /// The peer's FIN was reported: a short read does not mean drained then.
    pub fin: bool,
    /// When it went idle, and how long it may stay so.
    idle_until_ms: u64,
}

impl<I: Io> UpConn<I> {
    /// An event for this connection.
    pub fn note_event(&mut self, readable: bool, writable: bool, fin: bool) {
        if readable || fin {
            self.may_read = true;
        }
        if fin {
            self.fin = true;
        }
        if writable {
            self.write_event = true;
        }
    }

    /// For a connection still connecting: has it connected (or failed) since? With TLS,
    /// connected means the handshake is done too.
    pub fn poll_connected(&mut self, io: &mut I) -> io::Result<bool> {
        if !self.connected {
            if !self.write_event {
                return Ok(false);
            }
            self.connected = io.connected(self.stream.sock())?;
            if !self.connected {
                return Ok(false);
            }
        }
        match &mut self.stream {
            UpStream::Tls(t) => t.handshake(io, &mut self.may_read),
            UpStream::Plain(_) => Ok(true),
        }
    }
}

pub(crate) struct UpstreamConns<I: Io> {
    slab: Slab<UpConn<I>>,
    /// Idle connections by (pool key, server), most recently used last.
    idle: HashMap<(u64, usize), Vec<u64>>,
    idle_count: usize,
    /// When idle connections were last swept for expiry.
    swept_ms: u64,
}

impl<I: Io> Default for UpstreamConns<I> {
    fn default() -> Self {
        UpstreamConns {
            slab: Slab::new(UPSTREAM_TOKEN),
            idle: HashMap::new(),
            idle_count: 0,
            swept_ms: 0,
        }
    }
}

impl<I: Io> UpstreamConns<I> {
    pub fn get_mut(&mut self, key: u64) -> Option<&mut UpConn<I>> {
        self.slab.get_mut(key)
    }

    /// Closes it (dropping the socket also ends its readiness reports).
    pub fn close(&mut self, key: u64) {
        let Some(c) = self.slab.remove(key) else {
            return;
        };
        if c.owner == 0 {
            if let Some(list) = self.idle.get_mut(&(c.set.pool_key(), c.server)) {
                list.retain(|&k| k != key);
                self.idle_count -= 1;
            }
        }
    }

    /// Starts a connection to `server` of `set` for client connection `owner`.
    pub fn connect(
        &mut self,
        set: &Arc<dyn Upstreams>,
        server: usize,
        owner: u64,
        io: &mut I,
    ) -> io::Result<u64> {
        let stream = match set.addr(server) {
            UpstreamAddr::Tcp(addr) => {
                let sock = io.connect(Peer::Tcp(*addr))?;
                match set.tls(server) {
                    None => UpStream::Plain(sock),
                    Some(tls) => {
                        let conn =
                            rustls::ClientConnection::new(tls.config.clone(), tls.name.clone())
                                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                        UpStream::Tls(Box::new(TlsUp {
                            sock,
                            tls: conn,
                            eof: false,
                        }))
                    }
                }
            }
            UpstreamAddr::Unix(path) => UpStream::Plain(io.connect(Peer::Unix(path))?),
        };
        let key = self.slab.insert(|_| UpConn {
            stream,
            set: set.clone(),
            server,
            owner,
            connected: false,
            write_event: false,
            may_read: false,
            fin: false,
            idle_until_ms: 0,
        });
        let conn = self.get_mut(key).expect("just inserted");
        if let Err(e) = io.watch(conn.stream.sock(), key as usize) {
            self.close(key);
            return Err(e);
        }
        Ok(key)
    }

    /// An idle connection to `server` of the set with `pool_key`, now owned by `owner`.
    pub fn take_idle(
        &mut self,
        pool_key: u64,
        server: usize,
        owner: u64,
        now_ms: u64,
    ) -> Option<u64> {
        loop {
            let key = self.idle.get_mut(&(pool_key, server))?.pop()?;
            self.idle_count -= 1;
            let Some(conn) = self.slab.get_mut(key) else {
                continue;
            };
            // Owned from here on (so `close` does not look for it among the idle).
            conn.owner = owner;
            // No look at the socket here: it was empty when it came back (see `release`), and
            // anything since is a readiness event, which drops it while idle: before any
            // client of the same turn gets here (`HttpWorker::before_events`), or in a later
            // turn.
            if conn.idle_until_ms <= now_ms || conn.fin {
                self.close(key);
                continue;
            }
            return Some(key);
        }
    }

    /// Puts a connection whose exchange ended cleanly into the pool, or closes it if the
    /// pool for its server is full or anything waits in its socket (see
    /// [`UpStream::waiting`]).
    pub fn release(&mut self, key: u64, io: &mut I, now_ms: u64) {
        let Some(conn) = self.get_mut(key) else {
            return;
        };
        // A short read after the last readiness event proved the socket empty, and anything
        // since is a new event (edge-triggered), seen while it is idle. Otherwise (the answer
        // ended exactly where a read buffer did) bytes may be there with no event to come:
        // look, without taking them.
        if conn.may_read || conn.fin || conn.stream.is_tls() {
            let waiting = conn.stream.waiting(io);
            if waiting != Waiting::Nothing {
                self.drop_unclean(key, waiting, now_ms);
                return;
            }
        }
        let max = conn.set.max_idle();
        let keepalive = conn.set.timeouts().keepalive.as_millis() as u64;
        let pool = (conn.set.pool_key(), conn.server);
        let list = self.idle.entry(pool).or_default();
        if list.len() >= max {
            self.close(key);
            return;
        }
        list.push(key);
        self.idle_count += 1;
        let conn = self.get_mut(key).expect("checked above");
        conn.owner = 0;
        conn.idle_until_ms = now_ms + keepalive;
    }

    /// Closes a connection that cannot carry another exchange; one holding bytes nobody asked
    /// for says the server is out of step with us (a smuggling attempt, or a broken server).
    fn drop_unclean(&mut self, key: u64, waiting: Waiting, now_ms: u64) {
        if waiting == Waiting::Bytes && ratelog::admit("upstream_stray_bytes", now_ms) {
            if let Some(conn) = self.slab.get_mut(key) {
                let addr = conn.set.addr(conn.server).to_string();
                tracing::warn!(upstream = %addr, "upstream sent bytes outside any exchange; its connection is closed, not reused");
            }
        }
        self.close(key);
    }

    /// How many connections wait in the pool.
    pub fn idle_count(&self) -> usize {
        self.idle_count
    }

    /// Closes `key` if it waits in the pool (its server sent something, or closed it).
    pub fn close_if_idle(&mut self, key: u64) {
        if self.slab.get_mut(key).is_some_and(|c| c.owner == 0) {
            self.close(key);
        }
    }

    /// Closes idle connections past their keep-alive time; at most once a second.
    pub fn sweep(&mut self, now_ms: u64) {
        if self.idle_count == 0 || now_ms < self.swept_ms + 1000 {
            return;
        }
        self.swept_ms = now_ms;
        let slab = &mut self.slab;
        let expired: Vec<u64> = self
            .idle
            .values()
            .flatten()
            .copied()
            .filter(|&k| slab.get_mut(k).is_some_and(|c| c.idle_until_ms <= now_ms))
            .collect();
        for key in expired {
            self.close(key);
        }
        self.idle.retain(|_, list| !list.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_runtime::io::{EpollIo, EpollSock};

    type Backend = EpollIo;

    /// Waits (bounded) until `stream` reports anything but `Nothing`: loopback delivery is
    /// not instant.
    fn settled(stream: &mut UpStream<Backend>, io: &mut Backend) -> Waiting {
        for _ in 0..500 {
            let w = stream.waiting(io);
            if w != Waiting::Nothing {
                return w;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Waiting::Nothing
    }

    #[test]
    fn waiting_sees_stray_bytes_and_closes_without_taking_them() {
        let io = &mut Backend::detached().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let mut up = UpStream::Plain(EpollSock::from_std_tcp(ours).unwrap());
        assert_eq!(up.waiting(io), Waiting::Nothing);
        server.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert_eq!(settled(&mut up, io), Waiting::Bytes);
        // Looking took nothing: the bytes are all still there, and still seen.
        assert_eq!(up.waiting(io), Waiting::Bytes);
        let mut buf = [0u8; 64];
        assert_eq!(up.read(io, &mut buf).unwrap(), 17);
        assert_eq!(up.waiting(io), Waiting::Nothing);
        drop(server);
        assert_eq!(settled(&mut up, io), Waiting::Closed);

        let (ours, mut server) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut up = UpStream::Plain(EpollSock::from_std_unix(ours).unwrap());
        assert_eq!(up.waiting(io), Waiting::Nothing);
        server.write_all(b"x").unwrap();
        assert_eq!(up.waiting(io), Waiting::Bytes);
        assert_eq!(up.read(io, &mut buf).unwrap(), 1);
        drop(server);
        assert_eq!(up.waiting(io), Waiting::Closed);
    }
}
