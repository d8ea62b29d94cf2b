//! A worker's connections to upstream servers: the ones relaying an exchange (owned by a
//! client connection) and the idle ones kept alive for the next request, per server. Only
//! the worker touches them, so there is no lock; each is watched by the worker's event loop
//! once, for its whole life, under a token with [`UPSTREAM_TOKEN`] set. Their bytes move
//! through the one socket loop (`driver::pump`, see `driver/relay.rs`); this file only
//! keeps them.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use tern_runtime::io::{Io, Peer, Waiting};
use tern_runtime::{ratelog, BufPool};

use super::Socket;
use crate::conn::upstream::TlsClient;
use crate::slab::Slab;
use crate::upstream::{UpstreamAddr, Upstreams};

/// Set in the token (and slab key) of every upstream connection; client connection keys
/// never have it (their generation is kept below 2^31).
pub(crate) const UPSTREAM_TOKEN: u64 = 1 << 63;

/// One upstream connection.
pub(crate) struct UpConn<I: Io> {
    pub sock: Socket<I>,
    /// TLS with the upstream (boxed: the rustls state is large, plain connections stay
    /// small). Driven by the socket loop like a client's (`conn/upstream.rs`).
    pub tls: Option<Box<TlsClient>>,
    pub set: Arc<dyn Upstreams>,
    pub server: usize,
    /// The client connection relaying through it; 0 while idle in the pool.
    pub owner: u64,
    pub connected: bool,
    /// An event said it may be writable (for a connect in progress).
    pub write_event: bool,
    /// When it went idle, and how long it may stay so.
    idle_until_ms: u64,
}

impl<I: Io> UpConn<I> {
    /// An event for this connection.
    pub fn note_event(&mut self, readable: bool, writable: bool, fin: bool) {
        self.sock.note(readable, fin);
        if writable {
            self.write_event = true;
        }
    }

    /// For a connection still connecting: has its TCP (or Unix) connection been made (or
    /// failed) since? A TLS handshake follows (`driver/relay.rs`).
    pub fn poll_connected(&mut self, io: &mut I) -> io::Result<bool> {
        if !self.connected {
            if !self.write_event {
                return Ok(false);
            }
            self.connected = io.connected(&mut self.sock.sock)?;
        }
        Ok(self.connected)
    }

    /// Gives back the TLS session's buffers that hold nothing (between exchanges).
    pub fn release_buffers(&mut self, pool: &mut BufPool) {
        if let Some(tls) = self.tls.as_deref_mut() {
            tls.release_buffers(pool);
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

    /// After a panic in client connection `owner`'s code: closes the connections it owned
    /// (listed in its entry or not yet) and every idle one, since the panic may have struck
    /// while one was being put back, mid-answer (see `HttpWorker::contain_panic`).
    pub fn close_after_panic(&mut self, owner: u64) {
        for key in self.slab.keys() {
            if self
                .slab
                .get_mut(key)
                .is_some_and(|c| c.owner == owner || c.owner == 0)
            {
                self.close(key);
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
        let (sock, tls) = match set.addr(server) {
            UpstreamAddr::Tcp(addr) => {
                let tls = match set.tls(server) {
                    None => None,
                    Some(tls) => Some(Box::new(
                        TlsClient::new(tls.config.clone(), tls.name.clone())
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
                    )),
                };
                (io.connect(Peer::Tcp(*addr))?, tls)
            }
            UpstreamAddr::Unix(path) => (io.connect(Peer::Unix(path))?, None),
        };
        let key = self.slab.insert(|_| UpConn {
            // Nothing to read before the connection is made and reported.
            sock: Socket::new(sock, false),
            tls,
            set: set.clone(),
            server,
            owner,
            connected: false,
            write_event: false,
            idle_until_ms: 0,
        });
        let conn = self.get_mut(key).expect("just inserted");
        if let Err(e) = io.watch(&mut conn.sock.sock, key as usize) {
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
        io: &mut I,
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
            if conn.idle_until_ms <= now_ms || conn.sock.peer_fin() {
                self.close(key);
                continue;
            }
            io.reused(&mut conn.sock.sock);
            return Some(key);
        }
    }

    /// Puts a connection whose exchange ended cleanly into the pool, or closes it if the
    /// pool for its server is full or anything waits in it: `waiting` is what a look found
    /// (`driver::relay`'s `look_before_pooling`).
    pub fn release(&mut self, key: u64, waiting: Waiting, now_ms: u64) {
        let Some(conn) = self.get_mut(key) else {
            return;
        };
        if waiting != Waiting::Nothing {
            self.drop_unclean(key, waiting, now_ms);
            return;
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
    use crate::testing::MemoryUpstream;
    use tern_runtime::io::{MemoryAddr, MemoryIo};

    /// The pool's rule: in only if nothing waits and there is room, out only before its
    /// keep-alive time is over; a connection taken out again is told to the backend.
    #[test]
    fn connections_are_pooled_only_clean_and_reuse_is_told() {
        let mut io = MemoryIo::new();
        let set: Arc<dyn Upstreams> = Arc::new(MemoryUpstream::default());
        let UpstreamAddr::Tcp(addr) = *set.addr(0) else {
            unreachable!()
        };
        let addr = MemoryAddr::Tcp(addr);
        io.listen(addr.clone());
        let mut pool = UpstreamConns::<MemoryIo>::default();

        let a = pool.connect(&set, 0, 7, &mut io).unwrap();
        let peer_a = io.accept(&addr).unwrap();
        pool.release(a, Waiting::Nothing, 1_000);
        assert_eq!(pool.idle_count(), 1);
        // The pool holds one per server (`max_idle`): a second clean one is closed.
        let b = pool.connect(&set, 0, 7, &mut io).unwrap();
        let peer_b = io.accept(&addr).unwrap();
        pool.release(b, Waiting::Nothing, 1_000);
        assert!(peer_b.closed_by_worker());

        assert_eq!(
            pool.take_idle(set.pool_key(), 0, 9, &mut io, 2_000),
            Some(a)
        );
        assert_eq!(peer_a.exchanges(), 2, "reuse is told to the backend");
        assert_eq!(pool.idle_count(), 0);
        // Bytes nobody asked for: closed, not pooled.
        pool.release(a, Waiting::Bytes, 3_000);
        assert!(peer_a.closed_by_worker());
        assert_eq!(pool.idle_count(), 0);

        // Past its keep-alive time a pooled connection is not handed out.
        let c = pool.connect(&set, 0, 7, &mut io).unwrap();
        let peer_c = io.accept(&addr).unwrap();
        pool.release(c, Waiting::Nothing, 4_000);
        let keepalive = set.timeouts().keepalive.as_millis() as u64;
        let late = 4_000 + keepalive;
        assert_eq!(pool.take_idle(set.pool_key(), 0, 9, &mut io, late), None);
        assert!(peer_c.closed_by_worker());
    }
}
