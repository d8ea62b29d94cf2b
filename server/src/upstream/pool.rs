//! A worker's connections to upstream servers: the ones relaying an exchange (owned by a
//! client connection) and the idle ones kept alive for the next request, per server. Only
//! the worker touches them, so there is no lock; each is registered with the worker's epoll
//! once, for its whole life, under a token with [`UPSTREAM_TOKEN`] set.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use mio::{Interest, Registry, Token};
use tern_runtime::ratelog;

use super::{UpstreamAddr, Upstreams};
use crate::slab::Slab;

/// Set in the mio token (and slab key) of every upstream connection; client connection keys
/// never have it (their generation is kept below 2^31).
pub(crate) const UPSTREAM_TOKEN: u64 = 1 << 63;

pub(crate) enum UpStream {
    Tcp(mio::net::TcpStream),
    Unix(mio::net::UnixStream),
}

impl UpStream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            UpStream::Tcp(s) => s,
            UpStream::Unix(s) => s,
        }
    }

    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            UpStream::Tcp(s) => (&*s).read(buf),
            UpStream::Unix(s) => (&*s).read(buf),
        }
    }

    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            UpStream::Tcp(s) => (&*s).write(buf),
            UpStream::Unix(s) => (&*s).write(buf),
        }
    }

    /// Sends our FIN (a tunnel's client ended its side); reading goes on.
    pub fn shutdown_write(&self) -> io::Result<()> {
        match self {
            UpStream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            UpStream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            UpStream::Tcp(s) => s.as_raw_fd(),
            UpStream::Unix(s) => s.as_raw_fd(),
        }
    }

    /// What waits in the socket, looked at without taking it. A connection between exchanges
    /// must hold nothing: bytes there are an answer to no request of ours (a stray answer, or
    /// the answer to a request smuggled in a body the server did not read as one), and the
    /// next request sent on it would be answered with them. Edge-triggered readiness cannot
    /// tell: the bytes may have come with the last answer's, in the read that ended it.
    pub fn waiting(&self) -> Waiting {
        let mut byte = 0u8;
        loop {
            // SAFETY: `recv` into one live, exclusively borrowed byte, on a socket this
            // connection owns and keeps open for the call; MSG_PEEK leaves the byte queued and
            // MSG_DONTWAIT keeps the call from blocking.
            let n = unsafe {
                libc::recv(
                    self.fd(),
                    (&mut byte as *mut u8).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            return match n {
                0 => Waiting::Closed,
                1.. => Waiting::Bytes,
                _ => match io::Error::last_os_error().kind() {
                    io::ErrorKind::WouldBlock => Waiting::Nothing,
                    io::ErrorKind::Interrupted => continue,
                    // Reset or failed: as good as closed.
                    _ => Waiting::Closed,
                },
            };
        }
    }

    /// After a writable event on a connecting socket: connected (true), still connecting
    /// (false), or failed.
    fn check_connected(&self) -> io::Result<bool> {
        let (err, peer) = match self {
            UpStream::Tcp(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
            UpStream::Unix(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
        };
        if let Some(e) = err {
            return Err(e);
        }
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// What [`UpStream::waiting`] found in a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Nothing: the connection may carry another exchange.
    Nothing,
    /// Bytes no request of ours asked for.
    Bytes,
    /// The server closed it (or it failed).
    Closed,
}

/// One upstream connection.
pub(crate) struct UpConn {
    pub stream: UpStream,
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

impl UpConn {
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

    /// For a connection still connecting: has it connected (or failed) since?
    pub fn poll_connected(&mut self) -> io::Result<bool> {
        if self.connected {
            return Ok(true);
        }
        if !self.write_event {
            return Ok(false);
        }
        self.connected = self.stream.check_connected()?;
        Ok(self.connected)
    }
}

pub(crate) struct UpstreamConns {
    slab: Slab<UpConn>,
    /// Idle connections by (pool key, server), most recently used last.
    idle: HashMap<(u64, usize), Vec<u64>>,
    idle_count: usize,
    /// When idle connections were last swept for expiry.
    swept_ms: u64,
}

impl Default for UpstreamConns {
    fn default() -> Self {
        UpstreamConns {
            slab: Slab::new(UPSTREAM_TOKEN),
            idle: HashMap::new(),
            idle_count: 0,
            swept_ms: 0,
        }
    }
}

impl UpstreamConns {
    pub fn get_mut(&mut self, key: u64) -> Option<&mut UpConn> {
        self.slab.get_mut(key)
    }

    /// Closes it (dropping the socket also takes it out of epoll).
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
        registry: &Registry,
    ) -> io::Result<u64> {
        let stream = match set.addr(server) {
            UpstreamAddr::Tcp(addr) => {
                let s = mio::net::TcpStream::connect(*addr)?;
                s.set_nodelay(true)?;
                UpStream::Tcp(s)
            }
            UpstreamAddr::Unix(path) => UpStream::Unix(mio::net::UnixStream::connect(path)?),
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
        if let Err(e) = registry.register(
            conn.stream.source(),
            Token(key as usize),
            Interest::READABLE | Interest::WRITABLE,
        ) {
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
    pub fn release(&mut self, key: u64, now_ms: u64) {
        let Some(conn) = self.get_mut(key) else {
            return;
        };
        // A short read after the last readiness event proved the socket empty, and anything
        // since is a new event (edge-triggered), seen while it is idle. Otherwise (the answer
        // ended exactly where a read buffer did) bytes may be there with no event to come:
        // look, without taking them.
        if conn.may_read || conn.fin {
            let waiting = conn.stream.waiting();
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

    /// Waits (bounded) until `stream` reports anything but `Nothing`: loopback delivery is
    /// not instant.
    fn settled(stream: &UpStream) -> Waiting {
        for _ in 0..500 {
            let w = stream.waiting();
            if w != Waiting::Nothing {
                return w;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Waiting::Nothing
    }

    #[test]
    fn waiting_sees_stray_bytes_and_closes_without_taking_them() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        ours.set_nonblocking(true).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let up = UpStream::Tcp(mio::net::TcpStream::from_std(ours));
        assert_eq!(up.waiting(), Waiting::Nothing);
        server.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert_eq!(settled(&up), Waiting::Bytes);
        // Looking took nothing: the bytes are all still there, and still seen.
        assert_eq!(up.waiting(), Waiting::Bytes);
        let mut buf = [0u8; 64];
        assert_eq!(up.read(&mut buf).unwrap(), 17);
        assert_eq!(up.waiting(), Waiting::Nothing);
        drop(server);
        assert_eq!(settled(&up), Waiting::Closed);

        let (ours, mut server) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let up = UpStream::Unix(mio::net::UnixStream::from_std(ours));
        assert_eq!(up.waiting(), Waiting::Nothing);
        server.write_all(b"x").unwrap();
        assert_eq!(up.waiting(), Waiting::Bytes);
        assert_eq!(up.read(&mut buf).unwrap(), 1);
        drop(server);
        assert_eq!(up.waiting(), Waiting::Closed);
    }
}
