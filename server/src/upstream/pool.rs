//! A worker's connections to upstream servers: the ones relaying an exchange (owned by a
//! client connection) and the idle ones kept alive for the next request, per server. Only
//! the worker touches them, so there is no lock; each is registered with the worker's epoll
//! once, for its whole life, under a token with [`UPSTREAM_TOKEN`] set.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use mio::{Interest, Registry, Token};

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
            if conn.idle_until_ms <= now_ms || conn.fin {
                self.close(key);
                continue;
            }
            return Some(key);
        }
    }

    /// Puts a connection whose exchange ended cleanly into the pool, or closes it if the
    /// pool for its server is full.
    pub fn release(&mut self, key: u64, now_ms: u64) {
        let Some(conn) = self.get_mut(key) else {
            return;
        };
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
