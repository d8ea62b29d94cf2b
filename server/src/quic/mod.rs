//! HTTP/3's side of a worker: its UDP sockets (one per QUIC address, each worker its own,
//! SO_REUSEPORT), a quinn-proto `Endpoint` per socket, and the QUIC connections they accepted
//! (`conn.rs`). Datagrams are read in batches (recvmmsg, with GRO where the kernel has it),
//! handed to the endpoint, which routes them to their connection or starts one; what the
//! connections have to send goes out in GSO batches from the socket the connection came in
//! on. The sockets' calls go through the `Io` trait like every other socket's, so epoll,
//! io_uring and the in-memory backend all carry HTTP/3.
//!
//! Keys: a connection's slab key has [`QUIC_TAG`] set, so its deferred replies and cache
//! wake-ups reach it through the worker's inbox; socket `i` is watched under `QUIC_TAG | i`,
//! which no connection key equals (their generation is never 0). Its timers are kept here, in
//! microseconds, not in the worker's 100 ms wheel: the loop's sleep is bounded by the first
//! (`WorkerApp::next_deadline_us`), and due ones run at the end of the turn.
//!
//! Migration across workers: SO_REUSEPORT picks a worker by the client's address and port, so
//! a client whose address changed (NAT rebinding, migration) lands on a worker whose endpoints
//! do not know its connection. Every CID an endpoint makes names its worker (`cid.rs`), and
//! the worker that received a datagram naming another hands it to that one through its inbox
//! (`WorkerMessage::Datagram`), which handles it as if its own socket of the same address had
//! received it and answers from that socket. All workers' endpoints share one stateless-reset
//! key, so that the reset of a connection that is really gone is valid wherever it is sent
//! from; the hand-off comes first, so no worker resets a connection another one serves.

mod cid;
mod conn;
mod deadlines;
mod settings;
#[cfg(test)]
mod test_client;
#[cfg(test)]
mod tests;

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quinn_proto::{DatagramEvent, Endpoint, EndpointConfig, Incoming};
use tern_runtime::io::{Io, Readiness};
use tern_runtime::{ratelog, DatagramTransmit, InboxSender, RecvMeta, DATAGRAM_BATCH};

use crate::conn::RelayHost;
use crate::driver::relay::{self as relay_driver, Sockets};
use crate::exchange::{ConnCx, Link};
use crate::handler::{ExchangeId, QuicDatagram, WorkerMessage};
use crate::response::Response;
use crate::slab::Slab;
use crate::stats::Counter;
use conn::QuicConn;
use deadlines::Deadlines;
pub(crate) use settings::server_config;

/// The tag of QUIC connections' keys and sockets' tokens (bit 63 is the upstreams').
pub(crate) const QUIC_TAG: u64 = 1 << 62;
/// Receive buffers of one batch: with GRO one buffer holds up to 64 KiB of datagrams.
const RECV_BUF: usize = 64 * 1024;
/// Batches read from one socket per readiness before the other connections' turn: a
/// datagram flood cannot starve the worker's TCP clients.
const BATCHES_PER_TURN: usize = 8;
/// Datagrams per connection per transmit call (a GSO batch at most): bounds both a burst and
/// the time one connection holds the worker. 10, as quinn's own driver: 64 (the kernel's
/// most) made a fifth of the `sendmsg` calls but cost more CPU per answer and 40% of the
/// throughput in h3-large (measured 2026-12-02: 2.36 against 2.50-2.65 ms per 1 MiB answer).
const MAX_GSO: usize = 10;
/// Datagrams kept while the socket's send buffer is full; past it they are dropped (QUIC
/// recovers them as losses).
const BLOCKED_LIMIT: usize = 256;

/// Connection timers run in one turn at most: thousands of idle timeouts due together must not
/// hold the loop while other connections' datagrams wait (as the worker's wheel does).
const TIMERS_PER_TURN: usize = 1024;
/// Superseded timer entries allowed beyond 4 per connection (`deadlines.rs`).
const STALE_TIMERS: usize = 1024;
/// Handshakes in progress on a worker above which a new client without a validated address
/// is sent a Retry first (one round trip more, but no state until it proves its address).
const RETRY_ABOVE: usize = 256;
/// Datagrams handed to one worker and not yet taken by it, past which more are dropped. The
/// queue stands in for the owner's socket receive queue: 1,024 datagrams of at most 1,472
/// bytes are 1.5 MiB, well under the 4 MiB each socket's own buffer holds, and a 64th of the
/// inbox's 65,536 slots, so deferred replies always find room there. Full, it means the owner
/// does not keep up: the datagram is lost as from a full socket, and QUIC recovers it.
const HANDOFF_QUEUE: usize = 1024;

/// HTTP/3's part of what every worker shares, made at start-up.
pub(crate) struct QuicShared {
    server: Arc<quinn_proto::ServerConfig>,
    /// Every worker's endpoint settings but the CID generator: one stateless-reset key.
    endpoint: EndpointConfig,
    cids: Arc<cid::CidKey>,
    /// Per worker: datagrams handed to it and not yet taken.
    handed: Box<[HandedCount]>,
    /// Each worker's [`QuicSide::retry_above`] to start with: [`RETRY_ABOVE`], or 0 (a Retry
    /// for every new client) with the test hook `ServerConfig::quic_retry_always`.
    pub(crate) retry_above: usize,
}

/// Each on its own cache line: the workers that hand datagrams to one worker do not slow
/// the counts of the others.
#[repr(align(128))]
#[derive(Default)]
struct HandedCount(AtomicUsize);

impl QuicShared {
    /// The settings for `workers` workers, with this process's own CID and reset keys.
    pub fn new(server: Arc<quinn_proto::ServerConfig>, workers: usize) -> QuicShared {
        let mut reset_secret = [0u8; 32];
        aws_lc_rs::rand::fill(&mut reset_secret).expect("the system's random source");
        let reset_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &reset_secret);
        QuicShared {
            server,
            endpoint: EndpointConfig::new(Arc::new(reset_key)),
            cids: Arc::new(cid::CidKey::random(workers)),
            handed: (0..workers).map(|_| HandedCount::default()).collect(),
            retry_above: RETRY_ABOVE,
        }
    }

    /// Worker `worker`'s endpoint settings: the shared ones, with CIDs that name it.
    fn endpoint_config(&self, worker: usize) -> EndpointConfig {
        let mut config = self.endpoint.clone();
        let cids = self.cids.clone();
        config.cid_generator(move || Box::new(cids.generator(worker)));
        config
    }

    /// Worker `worker` took a datagram handed to it.
    pub fn handed_taken(&self, worker: usize) {
        if let Some(count) = self.handed.get(worker) {
            count.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What a worker needs to hand datagrams to the others (none with one worker).
struct Handoff {
    shared: Arc<QuicShared>,
    inboxes: Vec<InboxSender<WorkerMessage>>,
    /// This worker's index.
    me: usize,
}

impl Handoff {
    /// The worker, other than this one, whose CID `datagram` carries.
    fn owner_elsewhere(&self, datagram: &[u8]) -> Option<usize> {
        let owner = self.shared.cids.owner(cid::datagram_dcid(datagram)?)?;
        (owner != self.me).then_some(owner)
    }
}

/// One of the worker's UDP sockets and its endpoint.
struct QuicSocket<D> {
    sock: D,
    endpoint: Endpoint,
    local_port: u16,
    /// Each of the endpoint's connection handles' key in the worker's slab.
    keys: Vec<u64>,
    /// Datagrams the socket had no room for, in order.
    blocked: std::collections::VecDeque<Queued>,
    /// Connections with more to send once `blocked` is empty.
    waiting: Vec<u64>,
    /// Batches were left unread for fairness: read again next turn.
    more: bool,
    gso: usize,
}

struct Queued {
    destination: SocketAddr,
    ecn: Option<tern_runtime::EcnCodepoint>,
    src_ip: Option<std::net::IpAddr>,
    segment_size: Option<usize>,
    bytes: Vec<u8>,
}

/// The worker's HTTP/3.
pub(crate) struct QuicSide<I: Io> {
    sockets: Vec<QuicSocket<I::Datagram>>,
    conns: Slab<Box<QuicConn>>,
    /// The `Instant` of the worker clock's zero: quinn counts in `Instant`s, the worker in
    /// its clock's microseconds (a manual one in tests).
    epoch: Instant,
    recv: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
    send_buf: Vec<u8>,
    touched: Vec<u64>,
    /// Connections whose relays yielded for fairness: driven again next turn.
    again: Vec<u64>,
    /// Connections' timers, in µs (`deadlines.rs`): the loop sleeps until the first
    /// ([`QuicSide::next_deadline_us`]).
    deadlines: Deadlines,
    /// Handshakes begun and not yet complete or failed.
    handshaking: usize,
    handoff: Option<Handoff>,
    /// From this many handshakes in progress on, a new client must prove its address first:
    /// [`RETRY_ABOVE`], which tests lower to reach it with a client or two.
    pub(crate) retry_above: usize,
}

impl<I: Io> QuicSide<I> {
    /// Takes worker `worker`'s UDP sockets (by index of the configured QUIC addresses, whose
    /// ports are `ports`), watching each under `QUIC_TAG | i`. `inboxes` are every worker's,
    /// by index, for datagrams of their connections.
    pub fn new(
        io: &mut I,
        socks: Vec<I::Datagram>,
        ports: &[u16],
        shared: Arc<QuicShared>,
        worker: usize,
        inboxes: &[InboxSender<WorkerMessage>],
        now_us: u64,
    ) -> io::Result<QuicSide<I>> {
        let endpoint_config = Arc::new(shared.endpoint_config(worker));
        let mut sockets = Vec::with_capacity(socks.len());
        for (i, mut sock) in socks.into_iter().enumerate() {
            io.watch_datagram(&mut sock, (QUIC_TAG | i as u64) as usize)?;
            let gso = io.max_gso_segments(&sock).clamp(1, MAX_GSO);
            let endpoint = Endpoint::new(
                endpoint_config.clone(),
                Some(shared.server.clone()),
                true,
                None,
            );
            sockets.push(QuicSocket {
                sock,
                endpoint,
                local_port: ports.get(i).copied().unwrap_or(0),
                keys: Vec::new(),
                blocked: Default::default(),
                waiting: Vec::new(),
                more: false,
                gso,
            });
        }
        let epoch = Instant::now() - Duration::from_micros(now_us);
        let retry_above = shared.retry_above;
        let handoff = (inboxes.len() > 1).then(|| Handoff {
            shared,
            inboxes: inboxes.to_vec(),
            me: worker,
        });
        Ok(QuicSide {
            sockets,
            conns: Slab::new(QUIC_TAG),
            epoch,
            recv: Vec::new(),
            metas: Vec::new(),
            send_buf: Vec::with_capacity(MAX_GSO * 1500),
            touched: Vec::new(),
            again: Vec::new(),
            deadlines: Deadlines::new(STALE_TIMERS),
            handshaking: 0,
            handoff,
            retry_above,
        })
    }

    pub fn connections(&self) -> usize {
        self.conns.len
    }

    /// Some socket has datagrams left unread, or some connection's relays more to move,
    /// left for fairness.
    pub fn wants_another_turn(&self) -> bool {
        !self.again.is_empty() || self.sockets.iter().any(|s| s.more)
    }

    /// Work for [`QuicSide::after_turn`]: sockets left with datagrams, or connections that
    /// datagrams handed from other workers reached.
    pub fn wants_after_turn(&self, now_us: u64) -> bool {
        self.wants_another_turn()
            || !self.touched.is_empty()
            || self.next_deadline_us().is_some_and(|at| at <= now_us)
    }

    /// See `MemoryWorker::set_quic_stale_timers`.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn set_stale_timers(&mut self, entries: usize) {
        self.deadlines.stale_allowed = entries;
    }

    /// When the earliest connection timer is due (µs on the worker's clock).
    pub fn next_deadline_us(&self) -> Option<u64> {
        self.deadlines.next()
    }

    fn instant(&self, cx: &ConnCx<'_>) -> Instant {
        self.epoch + Duration::from_micros(cx.clock.now_us())
    }

    /// Readiness of socket `QUIC_TAG | i`.
    pub fn on_ready(&mut self, up: &mut Sockets<'_, I>, ready: Readiness, cx: &mut ConnCx<'_>) {
        let i = (ready.token as u64 & !QUIC_TAG) as usize;
        if i >= self.sockets.len() {
            return;
        }
        if ready.writable {
            self.flush_blocked(up, i, cx);
        }
        if ready.calls_for_read() {
            self.read_socket(up, i, cx);
        }
    }

    /// Runs the connections the turn's handed datagrams reached (once each, however many
    /// datagrams) and those left with relay work, then reads the sockets left with datagrams,
    /// for fairness.
    pub fn after_turn(&mut self, up: &mut Sockets<'_, I>, cx: &mut ConnCx<'_>) {
        self.fire_due(up, cx);
        for key in std::mem::take(&mut self.touched) {
            self.drive(up, key, cx);
        }
        for key in std::mem::take(&mut self.again) {
            self.drive(up, key, cx);
        }
        for i in 0..self.sockets.len() {
            if self.sockets[i].more {
                self.read_socket(up, i, cx);
            }
        }
    }

    fn read_socket(&mut self, up: &mut Sockets<'_, I>, i: usize, cx: &mut ConnCx<'_>) {
        if self.recv.is_empty() {
            self.recv = (0..DATAGRAM_BATCH).map(|_| vec![0; RECV_BUF]).collect();
            self.metas = vec![RecvMeta::default(); DATAGRAM_BATCH];
        }
        let now = self.instant(cx);
        self.sockets[i].more = false;
        for batch in 0.. {
            if batch == BATCHES_PER_TURN {
                self.sockets[i].more = true;
                break;
            }
            let mut slices: Vec<IoSliceMut<'_>> =
                self.recv.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let n =
                match up
                    .io
                    .recv_datagrams(&mut self.sockets[i].sock, &mut slices, &mut self.metas)
                {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        if ratelog::admit("quic_recv", cx.clock.now_ms()) {
                            tracing::warn!("HTTP/3 socket read failed: {e}");
                        }
                        break;
                    }
                };
            drop(slices);
            for k in 0..n {
                let meta = self.metas[k];
                let stride = if meta.stride == 0 {
                    meta.len
                } else {
                    meta.stride
                };
                let mut at = 0;
                while at < meta.len {
                    let end = (at + stride).min(meta.len);
                    let datagram = BytesMut::from(&self.recv[k][at..end]);
                    at = end;
                    cx.stats.bump(Counter::QuicDatagramsIn);
                    cx.stats.add(Counter::QuicBytesIn, datagram.len() as u64);
                    self.on_datagram(up, i, now, &meta, datagram, cx);
                }
            }
        }
        for key in std::mem::take(&mut self.touched) {
            self.drive(up, key, cx);
        }
    }

    /// A datagram socket `i` received: handed to the worker its CID names, if that is another
    /// one (the client's address changed), else handled here.
    fn on_datagram(
        &mut self,
        up: &mut Sockets<'_, I>,
        i: usize,
        now: Instant,
        meta: &RecvMeta,
        bytes: BytesMut,
        cx: &mut ConnCx<'_>,
    ) {
        let datagram = QuicDatagram {
            socket: i,
            remote: meta.addr,
            local_ip: meta.dst_ip,
            ecn: meta.ecn.map(|e| e as u8),
            bytes,
        };
        let owner = self.handoff.as_ref();
        match owner.and_then(|h| h.owner_elsewhere(&datagram.bytes)) {
            Some(owner) => self.hand_off(owner, datagram, cx),
            None => self.handle_datagram(up, now, datagram, cx),
        }
    }

    /// Sends `datagram` to worker `owner`, whose connection it is for: dropped (and counted)
    /// when [`HANDOFF_QUEUE`] of them wait for that worker already, or its inbox is full.
    fn hand_off(&mut self, owner: usize, datagram: QuicDatagram, cx: &mut ConnCx<'_>) {
        let Some(handoff) = &self.handoff else {
            return;
        };
        let (Some(queued), Some(inbox)) =
            (handoff.shared.handed.get(owner), handoff.inboxes.get(owner))
        else {
            return;
        };
        if queued.0.fetch_add(1, Ordering::Relaxed) >= HANDOFF_QUEUE {
            queued.0.fetch_sub(1, Ordering::Relaxed);
            cx.stats.bump(Counter::QuicHandoffsDropped);
            return;
        }
        match inbox.send(WorkerMessage::Datagram(Box::new(datagram))) {
            Ok(()) => cx.stats.bump(Counter::QuicDatagramsHandedOff),
            Err(_) => {
                queued.0.fetch_sub(1, Ordering::Relaxed);
                cx.stats.bump(Counter::QuicHandoffsDropped);
            }
        }
    }

    /// A datagram another worker received for a connection of this one: handled as if this
    /// worker's socket of the same address had received it, and answered from that socket.
    /// The connections it reached run at the end of the turn ([`QuicSide::after_turn`]).
    pub fn take_handed(
        &mut self,
        up: &mut Sockets<'_, I>,
        datagram: QuicDatagram,
        cx: &mut ConnCx<'_>,
    ) {
        if datagram.socket < self.sockets.len() {
            let now = self.instant(cx);
            self.handle_datagram(up, now, datagram, cx);
        }
    }

    /// Gives a datagram to socket `datagram.socket`'s endpoint, which routes it to its
    /// connection (run later: `touched`), starts one, or answers it itself.
    fn handle_datagram(
        &mut self,
        up: &mut Sockets<'_, I>,
        now: Instant,
        datagram: QuicDatagram,
        cx: &mut ConnCx<'_>,
    ) {
        let i = datagram.socket;
        let ecn = datagram.ecn.and_then(quinn_proto::EcnCodepoint::from_bits);
        let sock = &mut self.sockets[i];
        self.send_buf.clear();
        let buf = &mut self.send_buf;
        let event = catch_unwind(AssertUnwindSafe(|| {
            let QuicDatagram {
                remote,
                local_ip,
                bytes,
                ..
            } = datagram;
            sock.endpoint.handle(now, remote, local_ip, ecn, bytes, buf)
        }));
        let event = match event {
            Ok(event) => event,
            Err(_) => {
                // A datagram that panicked the endpoint's parser is dropped (quinn-proto's
                // remote panics were all in parsing, before any state changed).
                cx.stats.bump(Counter::QuicPanics);
                return;
            }
        };
        match event {
            None => {}
            Some(DatagramEvent::ConnectionEvent(handle, event)) => {
                let Some(&key) = sock.keys.get(handle.0) else {
                    return;
                };
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.quic.handle_event(event);
                    if !self.touched.contains(&key) {
                        self.touched.push(key);
                    }
                }
            }
            Some(DatagramEvent::Response(t)) => {
                let bytes = std::mem::take(&mut self.send_buf);
                self.send(up, i, &t, &bytes[..t.size], cx);
                self.send_buf = bytes;
            }
            Some(DatagramEvent::NewConnection(incoming)) => self.accept(up, i, now, incoming, cx),
        }
    }

    fn accept(
        &mut self,
        up: &mut Sockets<'_, I>,
        i: usize,
        now: Instant,
        incoming: Incoming,
        cx: &mut ConnCx<'_>,
    ) {
        let peer = incoming.remote_address();
        let sock = &mut self.sockets[i];
        self.send_buf.clear();
        if cx.bans.is_some_and(|b| b.is_banned(peer.ip())) {
            cx.stats.bump(Counter::QuicRefusedBanned);
            sock.endpoint.ignore(incoming);
            return;
        }
        if self.conns.len >= cx.config.max_connections_per_worker || cx.draining {
            cx.stats.bump(Counter::QuicRefusedLimit);
            let t = sock.endpoint.refuse(incoming, &mut self.send_buf);
            let bytes = std::mem::take(&mut self.send_buf);
            self.send(up, i, &t, &bytes[..t.size], cx);
            self.send_buf = bytes;
            return;
        }
        if self.handshaking >= self.retry_above
            && !incoming.remote_address_validated()
            && incoming.may_retry()
        {
            if let Ok(t) = sock.endpoint.retry(incoming, &mut self.send_buf) {
                cx.stats.bump(Counter::QuicRetries);
                let bytes = std::mem::take(&mut self.send_buf);
                self.send(up, i, &t, &bytes[..t.size], cx);
                self.send_buf = bytes;
            }
            return;
        }
        match sock
            .endpoint
            .accept(incoming, now, &mut self.send_buf, None)
        {
            Ok((handle, quic)) => {
                cx.stats.bump(Counter::QuicAccepted);
                self.handshaking += 1;
                let local_port = sock.local_port;
                let key = self.conns.insert(|key| {
                    let link = Link {
                        peer,
                        key,
                        secure: true,
                        local_port,
                        redirect_to_https: None,
                    };
                    Box::new(QuicConn::new(quic, handle, i, link, cx))
                });
                let sock = &mut self.sockets[i];
                if sock.keys.len() <= handle.0 {
                    sock.keys.resize(handle.0 + 1, 0);
                }
                sock.keys[handle.0] = key;
                self.touched.push(key);
            }
            Err(e) => {
                cx.stats.bump(Counter::QuicHandshakesFailed);
                if let Some(t) = e.response {
                    let bytes = std::mem::take(&mut self.send_buf);
                    self.send(up, i, &t, &bytes[..t.size], cx);
                    self.send_buf = bytes;
                }
            }
        }
    }

    /// Runs connection `key`: its events and exchanges, then what it has to send, then its
    /// timer. A panic in it (quinn-proto's or ours) closes that connection only.
    fn drive(&mut self, up: &mut Sockets<'_, I>, key: u64, cx: &mut ConnCx<'_>) {
        let now = self.instant(cx);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let i = conn.socket;
        let sock = &mut self.sockets[i];
        let ran = catch_unwind(AssertUnwindSafe(|| {
            conn.drive(now, cx);
            let finished = drive_relays(conn, up, cx);
            if conn.closed && !conn.upstreams.is_empty() {
                // Lost or closed: what its relays were doing cannot be finished.
                let mut upstreams = std::mem::take(&mut conn.upstreams);
                relay_driver::abandon_host(&mut **conn, &mut upstreams, up, cx);
            }
            endpoint_events(conn, &mut sock.endpoint);
            finished
        }));
        let relays_done = match ran {
            Ok(done) => done,
            Err(_) => return self.contain_panic(up, key, cx),
        };
        if !relays_done && !self.again.contains(&key) {
            self.again.push(key);
        }
        if !conn.handshake_over && (conn.connected || conn.closed) {
            conn.handshake_over = true;
            self.handshaking = self.handshaking.saturating_sub(1);
            if !conn.connected {
                cx.stats.bump(Counter::QuicHandshakesFailed);
            }
        }
        self.transmit(up, key, cx);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.quic.is_drained() {
            return self.remove(up, key, cx);
        }
        let deadline = match conn.quic.poll_timeout() {
            // Rounded up: a timer run a fraction of a µs early finds nothing due, and would
            // be armed again for the same moment, with the clock not past it yet.
            Some(at) => (at.saturating_duration_since(self.epoch).as_nanos()).div_ceil(1000) as u64,
            None => u64::MAX,
        }
        .min(conn.relay_deadline().saturating_mul(1000));
        conn.deadline_us = deadline;
        if deadline < conn.armed_us {
            conn.armed_us = deadline;
            self.arm(key, deadline);
        }
    }

    /// Puts connection `key`'s timer at `at_us` in the heap of deadlines.
    fn arm(&mut self, key: u64, at_us: u64) {
        let conns = &mut self.conns;
        self.deadlines.arm(key, at_us, conns.len, || {
            let mut armed = Vec::with_capacity(conns.len);
            for key in conns.keys() {
                if let Some(conn) = conns.get_mut(key) {
                    if conn.armed_us != u64::MAX {
                        armed.push((key, conn.armed_us));
                    }
                }
            }
            armed
        });
    }

    /// Sends what connection `key` has to send, as long as its socket takes it.
    fn transmit(&mut self, up: &mut Sockets<'_, I>, key: u64, cx: &mut ConnCx<'_>) {
        let now = self.instant(cx);
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let i = conn.socket;
            if !self.sockets[i].blocked.is_empty() {
                if !self.sockets[i].waiting.contains(&key) {
                    self.sockets[i].waiting.push(key);
                }
                return;
            }
            let max = self.sockets[i].gso;
            let mut buf = std::mem::take(&mut self.send_buf);
            buf.clear();
            let polled = catch_unwind(AssertUnwindSafe(|| {
                conn.quic.poll_transmit(now, max, &mut buf)
            }));
            let t = match polled {
                Ok(Some(t)) => t,
                Ok(None) => {
                    self.send_buf = buf;
                    return;
                }
                Err(_) => {
                    self.send_buf = buf;
                    return self.contain_panic(up, key, cx);
                }
            };
            self.send(up, i, &t, &buf[..t.size], cx);
            self.send_buf = buf;
        }
    }

    fn send(
        &mut self,
        up: &mut Sockets<'_, I>,
        i: usize,
        t: &quinn_proto::Transmit,
        bytes: &[u8],
        cx: &mut ConnCx<'_>,
    ) {
        let sock = &mut self.sockets[i];
        let ecn = t
            .ecn
            .and_then(|e| tern_runtime::EcnCodepoint::from_bits(e as u8));
        let datagrams = match t.segment_size {
            Some(s) if s > 0 => bytes.len().div_ceil(s),
            _ => 1,
        };
        if sock.blocked.is_empty() {
            let transmit = DatagramTransmit {
                destination: t.destination,
                ecn,
                contents: bytes,
                segment_size: t.segment_size,
                src_ip: t.src_ip,
            };
            match up.io.send_datagram(&mut sock.sock, &transmit) {
                Ok(true) => {
                    cx.stats.add(Counter::QuicDatagramsOut, datagrams as u64);
                    cx.stats.add(Counter::QuicBytesOut, bytes.len() as u64);
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    cx.stats.bump(Counter::QuicSendErrors);
                    if ratelog::admit("quic_send", cx.clock.now_ms()) {
                        tracing::warn!(to = %t.destination, "HTTP/3 datagram not sent: {e}");
                    }
                    return;
                }
            }
        }
        if sock.blocked.len() >= BLOCKED_LIMIT {
            cx.stats.bump(Counter::QuicSendErrors);
            return;
        }
        sock.blocked.push_back(Queued {
            destination: t.destination,
            ecn,
            src_ip: t.src_ip,
            segment_size: t.segment_size,
            bytes: bytes.to_vec(),
        });
    }

    /// The socket has room again: what waited goes first, then the connections that had more.
    fn flush_blocked(&mut self, up: &mut Sockets<'_, I>, i: usize, cx: &mut ConnCx<'_>) {
        let sock = &mut self.sockets[i];
        while let Some(q) = sock.blocked.front() {
            let transmit = DatagramTransmit {
                destination: q.destination,
                ecn: q.ecn,
                contents: &q.bytes,
                segment_size: q.segment_size,
                src_ip: q.src_ip,
            };
            match up.io.send_datagram(&mut sock.sock, &transmit) {
                Ok(true) => {
                    cx.stats.bump(Counter::QuicDatagramsOut);
                    cx.stats.add(Counter::QuicBytesOut, q.bytes.len() as u64);
                }
                Ok(false) => return,
                Err(_) => cx.stats.bump(Counter::QuicSendErrors),
            }
            sock.blocked.pop_front();
        }
        for key in std::mem::take(&mut sock.waiting) {
            self.drive(up, key, cx);
        }
    }

    /// Runs the connections whose timers are due, [`TIMERS_PER_TURN`] at most (the rest
    /// next turn: the loop does not sleep while one is due).
    fn fire_due(&mut self, up: &mut Sockets<'_, I>, cx: &mut ConnCx<'_>) {
        let now_us = cx.clock.now_us();
        for _ in 0..TIMERS_PER_TURN {
            let Some((key, at)) = self.deadlines.pop_due(now_us) else {
                return;
            };
            self.on_timer(up, key, at, cx);
        }
    }

    /// The timer of connection `key` fired (armed for `at_us`).
    fn on_timer(&mut self, up: &mut Sockets<'_, I>, key: u64, at_us: u64, cx: &mut ConnCx<'_>) {
        let now = self.instant(cx);
        let now_us = cx.clock.now_us();
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.armed_us != at_us {
            return;
        }
        conn.armed_us = u64::MAX;
        if conn.deadline_us > now_us {
            conn.armed_us = conn.deadline_us;
            let at = conn.deadline_us;
            self.arm(key, at);
            return;
        }
        let now_ms = cx.clock.now_ms();
        let timed_out = catch_unwind(AssertUnwindSafe(|| {
            if conn.relay_deadline() <= now_ms {
                conn.relays_timed_out(cx);
            }
            conn.quic.handle_timeout(now)
        }));
        if timed_out.is_err() {
            return self.contain_panic(up, key, cx);
        }
        self.drive(up, key, cx);
    }

    /// A deferred reply for an exchange of connection `key`.
    pub fn complete(
        &mut self,
        up: &mut Sockets<'_, I>,
        key: u64,
        exchange: ExchangeId,
        response: Response,
        cx: &mut ConnCx<'_>,
    ) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let ran = catch_unwind(AssertUnwindSafe(|| conn.complete(exchange, response, cx)));
        match ran {
            Ok(true) => self.drive(up, key, cx),
            Ok(false) => {}
            Err(_) => self.contain_panic(up, key, cx),
        }
    }

    /// A cache fill that relay `exchange` of connection `key` waits for ended.
    pub fn wake(
        &mut self,
        up: &mut Sockets<'_, I>,
        key: u64,
        exchange: ExchangeId,
        cx: &mut ConnCx<'_>,
    ) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        match catch_unwind(AssertUnwindSafe(|| conn.relay_wake(exchange, cx))) {
            Ok(true) => self.drive(up, key, cx),
            Ok(false) => {}
            Err(_) => self.contain_panic(up, key, cx),
        }
    }

    /// An upstream connection of connection `key`'s relays is ready.
    pub fn relay_ready(&mut self, up: &mut Sockets<'_, I>, key: u64, cx: &mut ConnCx<'_>) {
        self.drive(up, key, cx);
    }

    /// Shutdown began: every connection says GOAWAY and closes once its requests are
    /// answered; no new one is accepted (`accept` refuses while draining).
    pub fn begin_drain(&mut self, up: &mut Sockets<'_, I>, cx: &mut ConnCx<'_>) {
        let now = self.instant(cx);
        for key in self.conns.keys() {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.begin_drain(now);
            }
            self.drive(up, key, cx);
        }
    }

    fn remove(&mut self, up: &mut Sockets<'_, I>, key: u64, cx: &mut ConnCx<'_>) {
        if let Some(mut conn) = self.conns.remove(key) {
            let mut upstreams = std::mem::take(&mut conn.upstreams);
            relay_driver::abandon_host(&mut *conn, &mut upstreams, up, cx);
            self.handshake_gone(&conn);
            let stats = conn.quic.stats();
            cx.stats
                .add(Counter::QuicLostPackets, stats.path.lost_packets);
            cx.stats.bump(Counter::QuicClosed);
            if let Some(k) = self.sockets[conn.socket].keys.get_mut(conn.handle.0) {
                *k = 0;
            }
        }
    }

    /// A panic in connection `key`'s code: it is dropped without another datagram, its
    /// endpoint told it is gone, and the worker goes on. Its state is dropped whole; the
    /// endpoint's is only its table of connection ids, which the drained event clears.
    #[cold]
    fn contain_panic(&mut self, up: &mut Sockets<'_, I>, key: u64, cx: &mut ConnCx<'_>) {
        cx.stats.bump(Counter::QuicPanics);
        let Some(mut conn) = self.conns.remove(key) else {
            return;
        };
        // Its upstream connections are closed unused: one may have been mid-answer.
        for (_, up_key) in conn.upstreams.drain(..) {
            up.conns.close(up_key);
        }
        self.handshake_gone(&conn);
        let sock = &mut self.sockets[conn.socket];
        let _ = catch_unwind(AssertUnwindSafe(|| {
            sock.endpoint
                .handle_event(conn.handle, quinn_proto::EndpointEvent::drained())
        }));
        if let Some(k) = sock.keys.get_mut(conn.handle.0) {
            *k = 0;
        }
        if ratelog::admit("quic_panic", cx.clock.now_ms()) {
            tracing::error!(peer = %conn.link.peer, "a panic in an HTTP/3 connection's code closed it; the worker goes on");
        }
        let _ = catch_unwind(AssertUnwindSafe(move || drop(conn)));
    }
}

impl<I: Io> QuicSide<I> {
    /// A connection leaves the table: if its handshake was still counted, it is no more.
    fn handshake_gone(&mut self, conn: &QuicConn) {
        if !conn.handshake_over {
            self.handshaking = self.handshaking.saturating_sub(1);
        }
    }
}

/// Rounds of relay work per drive of a connection before the others' turn.
const RELAY_ROUNDS: usize = 64;

/// Moves connection `conn`'s relays (their upstream sockets and answers) until nothing moves.
/// False: it stopped for fairness with work left.
fn drive_relays<I: Io>(conn: &mut QuicConn, up: &mut Sockets<'_, I>, cx: &mut ConnCx<'_>) -> bool {
    if conn.upstreams.is_empty() && !conn.in_relay() {
        return true;
    }
    let mut upstreams = std::mem::take(&mut conn.upstreams);
    let mut done = false;
    for _ in 0..RELAY_ROUNDS {
        // Streamed request bodies go to relays whose upstream took what they had.
        conn.feed_relays(cx);
        if !relay_driver::step(conn, &mut upstreams, up, cx) {
            done = true;
            break;
        }
    }
    conn.upstreams = upstreams;
    done
}

/// Hands the connection's news to its endpoint (new connection ids, its end) and the
/// endpoint's answers back.
fn endpoint_events(conn: &mut QuicConn, endpoint: &mut Endpoint) {
    while let Some(event) = conn.quic.poll_endpoint_events() {
        if let Some(back) = endpoint.handle_event(conn.handle, event) {
            conn.quic.handle_event(back);
        }
    }
}
