//! The real worker (`HttpWorker`: connections, relays, timers, deferred replies, bans)
//! driven over sockets in memory (`tern_runtime::io::MemoryIo`) with a clock that moves only
//! when the test says so. What needs seconds of waiting and real sockets elsewhere (a header
//! timeout, a write stall, idle keep-alive, a slow client's strikes) is a few calls here,
//! exact and without sleeping. The turn is the epoll loop's (`runtime/src/worker.rs`), in
//! the same order: reports, inbox, expired timers, end of turn.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tern_runtime::io::{MemoryDatagramPeer, MemoryIo, MemoryPeer};
use tern_runtime::{BufPool, Clock, Context, DetachedInbox, InboxSender, TimerWheel, WorkerApp};

/// The context the worker borrows for a call, from the harness's fields (written out so the
/// worker itself stays borrowable beside it).
macro_rules! context {
    ($h:expr) => {
        Context {
            io: &mut $h.io,
            clock: &$h.clock,
            timers: &mut $h.timers,
            buffers: &mut $h.buffers,
            inbox: &$h.sender,
            inboxes: std::slice::from_ref(&$h.sender),
            worker_id: 0,
            stopping: $h.draining,
            draining: $h.draining,
        }
    };
}

use crate::bans::Bans;
use crate::config::ServerConfig;
use crate::handler::WorkerMessage;
use crate::router::Router;
use crate::stats::{Counter, Stats, StatsSnapshot};
use crate::worker::{HttpWorker, Shared};

/// Turns `settle` may take before it gives up: a worker that never goes quiet is a bug the
/// test should see, not a hang.
const MAX_TURNS: usize = 10_000;

/// One worker, its sockets in memory and a manual clock.
pub struct MemoryWorker {
    worker: HttpWorker<MemoryIo>,
    shared: Arc<Shared>,
    io: MemoryIo,
    clock: Clock,
    timers: TimerWheel,
    buffers: BufPool,
    inbox: DetachedInbox<WorkerMessage>,
    sender: InboxSender<WorkerMessage>,
    fired: Vec<(u64, u64)>,
    draining: bool,
    next_port: u16,
}

impl MemoryWorker {
    /// A worker serving `router` with `config` (its listener kinds say what connection 0,
    /// 1... of `connect` speak), with `bans` if given.
    pub fn new(router: Router, config: ServerConfig, bans: Option<Arc<Bans>>) -> MemoryWorker {
        MemoryWorker::with_tls(router, config, bans, None)
    }

    /// As [`MemoryWorker::new`]; with `tls`, listener 0 speaks HTTPS with that acceptor.
    pub fn with_tls(
        router: Router,
        mut config: ServerConfig,
        bans: Option<Arc<Bans>>,
        tls: Option<Arc<tern_tls::TlsAcceptor>>,
    ) -> MemoryWorker {
        if tls.is_some() {
            config.listener_kinds = vec![crate::config::ListenerKind::Https];
        }
        MemoryWorker::build(router, config, bans, tls, None)
    }

    /// As [`MemoryWorker::with_tls`], serving HTTP/3 too: `config.http3` on, QUIC's settings
    /// made from `tls` as `Server::start` makes them, and one UDP socket at `local` handed to
    /// the worker as the runtime hands over its sockets (`adopt_datagrams`, before the first
    /// turn), with `bans` if given. The returned end of that socket plays every client and the
    /// network between.
    pub fn with_http3(
        router: Router,
        mut config: ServerConfig,
        bans: Option<Arc<Bans>>,
        tls: Arc<tern_tls::TlsAcceptor>,
        local: SocketAddr,
    ) -> (MemoryWorker, MemoryDatagramPeer) {
        config.http3 = true;
        config.listener_kinds = vec![crate::config::ListenerKind::Https];
        let quic = crate::quic::server_config(tls.quic_config(), &config)
            .expect("QUIC settings from the acceptor's TLS configuration");
        let mut w = MemoryWorker::build(router, config, bans, Some(tls), Some(quic));
        let (sock, peer) = w.io.datagram_socket(local);
        let mut cx = context!(w);
        w.worker.adopt_datagrams(&mut cx, vec![sock]);
        assert!(peer.watched(), "the worker took the socket");
        w.settle();
        (w, peer)
    }

    /// The worker around its `Shared` (HTTP/3's settings in `quic`), sockets and clock.
    fn build(
        router: Router,
        config: ServerConfig,
        bans: Option<Arc<Bans>>,
        tls: Option<Arc<tern_tls::TlsAcceptor>>,
        quic: Option<Arc<quinn_proto::ServerConfig>>,
    ) -> MemoryWorker {
        let stats = Stats::new(1);
        let shared = Shared {
            router,
            config: config.clone(),
            stats,
            live: arc_swap::ArcSwap::from_pointee(config.clone()),
            reloads: std::sync::atomic::AtomicU64::new(0),
            tls,
            secure_lines: std::sync::OnceLock::new(),
            quic: quic.map(|server| Arc::new(crate::quic::QuicShared::new(server, 1))),
            https_port: std::sync::atomic::AtomicU16::new(0),
            listener_ports: (config.runtime.listen.iter())
                .map(|addr| std::sync::atomic::AtomicU16::new(addr.port()))
                .collect(),
            bans,
            access_logs: Vec::new(),
            turn_ends: Vec::new(),
            reload_hooks: Vec::new(),
        };
        let inbox = DetachedInbox::new(1024).expect("a poll instance");
        let sender = inbox.sender();
        let shared = Arc::new(shared);
        let worker = HttpWorker::new(0, shared.clone(), sender.clone());
        MemoryWorker {
            worker,
            shared,
            io: MemoryIo::new(),
            // A fixed wall clock: the Date line is the same in every run.
            clock: Clock::manual(1_800_000_000),
            // The runtime's own wheel: 100 ms ticks.
            timers: TimerWheel::new(100, 1024),
            buffers: BufPool::new(4096, 16 * 1024, 32),
            inbox,
            sender,
            fired: Vec::new(),
            draining: false,
            next_port: 40_000,
        }
    }

    /// Counts into `stats` (whose rows a handler of the router was given) instead of
    /// counters of its own. Before any connection: the worker is made again around them
    /// (so not for a worker [`MemoryWorker::with_http3`] made: its UDP socket would go).
    pub(crate) fn with_stats(self, stats: Stats) -> MemoryWorker {
        let MemoryWorker {
            worker,
            shared,
            io,
            clock,
            timers,
            buffers,
            inbox,
            sender,
            fired,
            draining,
            next_port,
        } = self;
        assert_eq!(WorkerApp::<MemoryIo>::connections(&worker), 0);
        drop(worker); // it held the only other reference to `shared`
        let Ok(old) = Arc::try_unwrap(shared) else {
            unreachable!("the worker held the only other reference")
        };
        let shared = Arc::new(Shared { stats, ..old });
        MemoryWorker {
            worker: HttpWorker::new(0, shared.clone(), sender.clone()),
            shared,
            io,
            clock,
            timers,
            buffers,
            inbox,
            sender,
            fired,
            draining,
            next_port,
        }
    }

    /// A client connects from 192.0.2.1 (a new port each time) and has already sent
    /// `first` (as TCP_DEFER_ACCEPT hands over a connection with its first bytes); the
    /// worker serves it at once, then the loop settles.
    pub fn connect(&mut self, first: &[u8]) -> MemoryPeer {
        self.next_port += 1;
        self.connect_from(SocketAddr::from(([192, 0, 2, 1], self.next_port)), first)
    }

    /// As [`MemoryWorker::connect`], from `peer`, on listener 0.
    pub fn connect_from(&mut self, peer: SocketAddr, first: &[u8]) -> MemoryPeer {
        self.connect_with(peer, first, |_| {})
    }

    /// As [`MemoryWorker::connect_from`], with the client's socket set up by `set` first
    /// (its room, its read size).
    pub fn connect_with(
        &mut self,
        peer: SocketAddr,
        first: &[u8],
        set: impl FnOnce(&MemoryPeer),
    ) -> MemoryPeer {
        let (sock, client) = self.io.pair();
        set(&client);
        client.write(first);
        let mut cx = context!(self);
        // (The runtime's epoll loop makes the same call after `accept`.)
        self.worker.on_accept(&mut cx, sock, peer, 0);
        self.settle();
        client
    }

    /// The sockets, to let the worker connect to upstreams (`listen`) and take them
    /// (`accept`).
    pub fn io(&mut self) -> &mut MemoryIo {
        &mut self.io
    }

    /// Runs loop turns until nothing is left to do now: every report, message and due
    /// timer handled.
    pub fn settle(&mut self) {
        for _ in 0..MAX_TURNS {
            if !self.turn() {
                return;
            }
        }
        panic!("the worker did not settle in {MAX_TURNS} turns");
    }

    /// Moves the clock on by `by`, then settles (timers due by then fire).
    pub fn advance(&mut self, by: Duration) {
        // In steps of a tick at most, and to the worker's own next deadline (QUIC's), as a
        // sleeping worker would wake for each.
        let mut left = by.as_millis() as u64;
        while left > 0 {
            let now = self.clock.now_ms();
            let own = self
                .own_deadline_ms()
                .map_or(u64::MAX, |at| at.saturating_sub(now));
            let step = left.min(100).min(own.max(1));
            self.clock.advance_ms(step);
            left -= step;
            self.settle();
        }
    }

    /// Begins shutdown as the runtime does once its settle time is over: idle connections
    /// close, busy ones finish with `Connection: close`.
    pub fn drain(&mut self) {
        self.draining = true;
        let mut cx = context!(self);
        self.worker.on_shutdown(&mut cx);
        self.settle();
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        WorkerApp::<MemoryIo>::connections(&self.worker)
    }

    pub fn counter(&self, c: Counter) -> u64 {
        self.stats().get(c)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The counters themselves.
    pub(crate) fn stats_handle(&self) -> &Stats {
        &self.shared.stats
    }

    /// Some connection is relaying an exchange (its answer may be incomplete so far).
    pub fn relaying(&mut self) -> bool {
        self.worker.relaying()
    }

    /// Milliseconds on the worker's clock.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Microseconds on the worker's clock (QUIC's timers are finer than milliseconds).
    pub fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    /// When (on the worker's clock, in ms) a sleeping worker would wake for its timers: the
    /// next tick of its wheel if any timer is armed, as the runtime's loop sleeps.
    pub fn wakes_at_ms(&self) -> Option<u64> {
        let now = self.clock.now_ms();
        let wheel = self.timers.poll_timeout_ms(now).map(|wait| now + wait);
        wheel.into_iter().chain(self.own_deadline_ms()).min()
    }

    /// The worker's next deadline of its own (QUIC's timers, finer than the wheel), in ms
    /// rounded up: the manual clock moves in milliseconds.
    fn own_deadline_ms(&self) -> Option<u64> {
        WorkerApp::<MemoryIo>::next_deadline_us(&self.worker).map(|us| us.div_ceil(1000))
    }

    /// From this many HTTP/3 handshakes in progress on, a new client without a validated
    /// address is sent a Retry first (lowered so that a test reaches it with a client or two).
    pub fn set_quic_retry_above(&mut self, handshakes: usize) {
        self.worker.set_quic_retry_above(handshakes);
    }

    /// Superseded QUIC timer entries allowed beyond 4 per connection before the heap of
    /// deadlines is made again (lowered so that a test makes it again all the time).
    pub fn set_quic_stale_timers(&mut self, entries: usize) {
        self.worker.set_quic_stale_timers(entries);
    }

    /// One loop turn; false if there was nothing to do.
    fn turn(&mut self) -> bool {
        let ready = self.io.take_reports();
        let messages = !self.inbox.inbox().is_empty();
        self.timers.expire(self.clock.now_ms(), &mut self.fired);
        let timers = !self.fired.is_empty();
        let again = WorkerApp::<MemoryIo>::wants_another_turn(&self.worker)
            || self
                .own_deadline_ms()
                .is_some_and(|at| at <= self.clock.now_ms());
        if ready.is_empty() && !messages && !timers && !again {
            return false;
        }
        let fired = std::mem::take(&mut self.fired);
        let worker = &mut self.worker;
        let inbox = &self.inbox;
        let mut cx = context!(self);
        worker.before_turn(&mut cx);
        worker.before_events(&mut cx, &ready);
        for r in &ready {
            worker.on_ready(&mut cx, *r);
        }
        inbox.inbox().drain(|m| worker.on_message(&mut cx, m));
        for (key, at) in fired {
            worker.on_timer(&mut cx, key, at);
        }
        worker.after_turn(&mut cx);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{Pending, Reply};
    use crate::response::{Body, Response};
    use crate::BanConfig;
    use std::sync::Mutex;
    use tern_runtime::io::MemoryAddr;

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";

    fn config() -> ServerConfig {
        ServerConfig {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            ..ServerConfig::default()
        }
    }

    fn hello() -> Router {
        Router::new().fallback(
            |_: &crate::Request<'_>, _: &mut crate::HandlerContext<'_>| {
                Reply::Now(Response::text(200, "hello"))
            },
        )
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_slow_head_gets_408_at_the_header_timeout_not_before() {
        let mut w = MemoryWorker::new(hello(), config(), None);
        let c = w.connect(b"GET / HTTP/1.1\r\nHost: a\r\n");
        w.advance(Duration::from_millis(9_800));
        assert_eq!(w.connections(), 1);
        assert!(c.read().is_empty());
        w.advance(Duration::from_millis(400));
        let out = text(&c.read());
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        assert!(c.closed_by_worker());
        assert_eq!(w.connections(), 0);
        assert_eq!(w.counter(Counter::TimeoutHeader), 1);
    }

    #[test]
    fn an_idle_keep_alive_connection_closes_silently_at_the_idle_timeout() {
        let mut w = MemoryWorker::new(hello(), config(), None);
        let c = w.connect(GET);
        assert!(text(&c.read()).starts_with("HTTP/1.1 200 OK"));
        w.advance(59 * SECOND);
        assert_eq!(w.connections(), 1, "idle, but not for long enough");
        // A second request on it: the idle period starts again from its answer.
        c.write(GET);
        w.settle();
        assert!(text(&c.read()).starts_with("HTTP/1.1 200 OK"));
        w.advance(59 * SECOND);
        assert_eq!(w.connections(), 1);
        w.advance(2 * SECOND);
        assert!(c.closed_by_worker());
        assert!(c.read().is_empty(), "closed without a word");
        assert_eq!(w.counter(Counter::TimeoutIdle), 1);
        assert_eq!(w.counter(Counter::TimeoutHeader), 0);
    }

    fn big(len: usize) -> Router {
        Router::new().fallback(
            move |_: &crate::Request<'_>, _: &mut crate::HandlerContext<'_>| {
                Reply::Now(Response::new(200).with_body(Body::Owned(vec![b'x'; len])))
            },
        )
    }

    /// A client that reads nothing is cut off once the write timeout passes with nothing
    /// acknowledged; one that reads, however slowly, keeps its connection and gets it all.
    #[test]
    fn a_stalled_reader_is_cut_off_at_the_write_timeout_and_a_slow_one_is_not() {
        let len = 256 * 1024;
        let mut w = MemoryWorker::new(big(len), config(), None);
        let peer = SocketAddr::from(([192, 0, 2, 7], 1000));
        let stalled = w.connect_with(peer, GET, |c| c.set_room(32 * 1024));
        assert_eq!(stalled.unread(), 32 * 1024, "the room is full");
        w.advance(29 * SECOND);
        assert!(!stalled.closed_by_worker());
        w.advance(2 * SECOND);
        assert!(stalled.closed_by_worker());
        assert_eq!(w.counter(Counter::TimeoutWrite), 1);

        let slow = w.connect_with(peer, GET, |c| c.set_room(32 * 1024));
        let mut got = slow.read_some(4096);
        // 4 KiB every 20 s: less than a write period's worth of room, but steady. Once the
        // whole answer is handed over (the rest waits in the "kernel"), the connection is
        // idle and may close; what was sent is still delivered, as a TCP close delivers it.
        while slow.unread() > 0 || !slow.closed_by_worker() {
            w.advance(20 * SECOND);
            got.extend(slow.read_some(4096));
        }
        let body_at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(got.len() - body_at, len, "the whole answer");
        assert_eq!(w.counter(Counter::TimeoutWrite), 1, "only the stalled one");
        assert_eq!(
            w.counter(Counter::TimeoutIdle),
            1,
            "the slow one, once all was sent"
        );
    }

    type Parked = Arc<Mutex<Vec<Pending>>>;

    fn deferring(parked: Parked) -> Router {
        Router::new().fallback(
            move |req: &crate::Request<'_>, cx: &mut crate::HandlerContext<'_>| {
                if req.path() == "/later" {
                    parked.lock().unwrap().push(cx.defer());
                    Reply::Later
                } else {
                    Reply::Now(Response::text(200, "now"))
                }
            },
        )
    }

    /// A deferred reply completed from elsewhere reaches its connection through the inbox;
    /// the request pipelined behind it waits its turn, and the answers leave in order.
    #[test]
    fn a_deferred_reply_goes_out_first_and_the_pipelined_request_waits_for_it() {
        let parked = Parked::default();
        let mut w = MemoryWorker::new(deferring(parked.clone()), config(), None);
        let c = w
            .connect(b"GET /later HTTP/1.1\r\nHost: a\r\n\r\nGET /now HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(c.read().is_empty());
        let pending = parked.lock().unwrap().pop().expect("deferred");
        // Time passes while the reply is being made: no timeout applies to the wait.
        w.advance(90 * SECOND);
        assert_eq!(w.connections(), 1);
        assert!(pending.complete(Response::text(201, "later")).is_ok());
        w.settle();
        let out = text(&c.read());
        let later = out.find("HTTP/1.1 201").expect("the deferred answer");
        let now = out.find("HTTP/1.1 200").expect("the pipelined answer");
        assert!(later < now, "{out}");
    }

    /// Draining: an idle connection closes at once; one waiting for its deferred reply gets
    /// it, marked `Connection: close`, and then closes.
    #[test]
    fn draining_closes_idle_connections_and_finishes_busy_ones() {
        let parked = Parked::default();
        let mut w = MemoryWorker::new(deferring(parked.clone()), config(), None);
        let idle = w.connect(b"GET /now HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(text(&idle.read()).contains("200 OK"));
        let busy = w.connect(b"GET /later HTTP/1.1\r\nHost: a\r\n\r\n");
        w.drain();
        assert!(idle.closed_by_worker());
        assert!(!busy.closed_by_worker());
        let pending = parked.lock().unwrap().pop().unwrap();
        assert!(pending.complete(Response::text(200, "done")).is_ok());
        w.settle();
        let out = text(&busy.read()).to_ascii_lowercase();
        assert!(out.contains("connection: close"), "{out}");
        assert!(busy.closed_by_worker());
        assert_eq!(w.connections(), 0);
    }

    /// Slow heads from one address are strikes; enough of them ban it, and its next
    /// connection is closed at accept, unread.
    #[test]
    fn slow_heads_strike_then_ban_the_peer() {
        let bans = Arc::new(Bans::new(BanConfig {
            after_strikes: 2,
            ..BanConfig::default()
        }));
        let mut w = MemoryWorker::new(hello(), config(), Some(bans));
        let slowloris = SocketAddr::from(([198, 51, 100, 9], 5000));
        for _ in 0..2 {
            let c = w.connect_from(slowloris, b"GET / HTTP/1.1\r\n");
            w.advance(11 * SECOND);
            assert!(c.closed_by_worker());
        }
        assert_eq!(w.counter(Counter::BansAdded), 1);
        let c = w.connect_from(slowloris, GET);
        assert!(c.closed_by_worker());
        assert!(c.read().is_empty());
        assert_eq!(w.counter(Counter::ConnectionsBanned), 1);
        // Others are served as before.
        let other = w.connect(GET);
        assert!(text(&other.read()).starts_with("HTTP/1.1 200"));
    }

    fn proxy() -> (MemoryWorker, MemoryAddr) {
        let upstream = Arc::new(crate::testing::MemoryUpstream::default());
        let router = Router::new().fallback(crate::testing::ForwardAll(upstream));
        let mut w = MemoryWorker::new(router, config(), None);
        let addr = MemoryAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 9)));
        w.io().listen(addr.clone());
        (w, addr)
    }

    /// The relay over sockets in memory: the request reaches the upstream the test plays,
    /// its answer the client; the upstream connection is pooled and reused, unless it holds
    /// bytes no request asked for, which close it instead.
    #[test]
    fn a_proxied_exchange_pools_its_connection_and_a_stray_byte_unpools_it() {
        let (mut w, addr) = proxy();
        let c = w.connect(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n");
        let up = w.io().accept(&addr).expect("the worker connected");
        assert!(text(&up.read()).starts_with("GET /a HTTP/1.1\r\n"));
        up.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
        w.settle();
        let out = text(&c.read());
        assert!(
            out.starts_with("HTTP/1.1 200 OK") && out.ends_with("first"),
            "{out}"
        );

        c.write(b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        assert!(
            w.io().accept(&addr).is_none(),
            "the pooled connection is reused"
        );
        assert!(text(&up.read()).starts_with("GET /b HTTP/1.1\r\n"));
        // The answer, and one byte more that no request asked for.
        up.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecondX");
        w.settle();
        assert!(text(&c.read()).ends_with("second"));
        assert!(up.closed_by_worker(), "not pooled with a stray byte in it");

        c.write(b"GET /c HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        let fresh = w.io().accept(&addr).expect("a new connection");
        assert!(text(&fresh.read()).starts_with("GET /c HTTP/1.1\r\n"));
    }

    /// A panic in one connection's own code (the test fault, before routing) closes that
    /// connection only: a neighbour whose relay is under way gets its answer; the pooled
    /// upstream connection the panicking one had used is closed, never handed to anyone
    /// (the panic could have struck while it was being put back mid-answer).
    #[test]
    fn a_connection_panic_closes_that_connection_and_the_idle_pool_only() {
        crate::fault::arm_for_tests();
        let (mut w, addr) = proxy();
        let neighbour = w.connect(b"GET /n HTTP/1.1\r\nHost: a\r\n\r\n");
        let up_n = w.io().accept(&addr).expect("the neighbour's relay");
        assert!(text(&up_n.read()).starts_with("GET /n "));

        let victim = w.connect(b"GET /v HTTP/1.1\r\nHost: a\r\n\r\n");
        let up_v = w.io().accept(&addr).expect("the victim's relay");
        assert!(text(&up_v.read()).starts_with("GET /v "));
        up_v.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nv");
        w.settle();
        assert!(text(&victim.read()).ends_with("\r\n\r\nv"));
        assert!(!up_v.closed_by_worker(), "pooled");

        victim.write(b"GET /tern-test-fault/connection HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        assert!(victim.closed_by_worker());
        assert!(victim.read().is_empty(), "closed without a word");
        assert!(up_v.closed_by_worker(), "the idle pool is emptied");
        assert!(!up_n.closed_by_worker(), "the neighbour's relay goes on");
        assert_eq!(w.counter(Counter::ConnectionPanics), 1);
        assert_eq!(w.connections(), 1);

        up_n.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nn");
        w.settle();
        assert!(text(&neighbour.read()).ends_with("\r\n\r\nn"));
        // The neighbour's next request: its own connection, pooled again, carries it.
        neighbour.write(b"GET /n2 HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        assert!(w.io().accept(&addr).is_none());
        assert!(text(&up_n.read()).starts_with("GET /n2 "));
    }

    /// An upstream that never answers: 504 at the first-byte timeout, exactly then.
    #[test]
    fn a_silent_upstream_gets_504_at_its_first_byte_timeout() {
        let (mut w, addr) = proxy();
        let first_byte = crate::upstream::UpstreamTimeouts::default().first_byte;
        let c = w.connect(GET);
        let up = w.io().accept(&addr).unwrap();
        assert!(!up.read().is_empty());
        w.advance(first_byte - SECOND);
        assert!(c.read().is_empty(), "still waiting");
        w.advance(2 * SECOND);
        let out = text(&c.read());
        assert!(out.starts_with("HTTP/1.1 504 "), "{out}");
        assert!(up.closed_by_worker());
        assert_eq!(w.connections(), 1, "the client's connection goes on");
    }

    /// An HTTP/2 frame: length, type, flags, stream, payload.
    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([ty, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    /// A GET's header block, every field a literal without indexing (RFC 7541 §6.2.2).
    fn get_block(path: &str) -> Vec<u8> {
        let mut b = Vec::new();
        for (name, value) in [
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "a"),
            (":path", path),
        ] {
            b.push(0);
            b.push(name.len() as u8);
            b.extend(name.as_bytes());
            b.push(value.len() as u8);
            b.extend(value.as_bytes());
        }
        b
    }

    /// Each frame's (type, stream), in order.
    type Kinds = Vec<(u8, u32)>;
    /// DATA payloads with their stream, in order.
    type Payloads = Vec<(u32, Vec<u8>)>;

    /// The frames in `bytes`: their kinds, and the DATA payloads.
    fn frames(mut bytes: &[u8]) -> (Kinds, Payloads) {
        let (mut kinds, mut data) = (Vec::new(), Vec::new());
        while bytes.len() >= 9 {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let (ty, stream) = (
                bytes[3],
                u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
            );
            kinds.push((ty, stream));
            if ty == 0 && len > 0 {
                data.push((stream, bytes[9..9 + len].to_vec()));
            }
            bytes = &bytes[9 + len..];
        }
        (kinds, data)
    }

    /// Over HTTP/2 deferred replies are independent: completed in the opposite order of
    /// their requests, each answer goes out as its reply arrives, on its own stream.
    #[test]
    fn http2_deferred_replies_completed_out_of_order_go_out_as_they_complete() {
        let parked = Parked::default();
        let mut w = MemoryWorker::new(deferring(parked.clone()), config(), None);
        let mut hello = tern_http2::PREFACE.to_vec();
        hello.extend(frame(4, 0, 0, &[])); // SETTINGS
        const END_HEADERS_AND_STREAM: u8 = 0x4 | 0x1;
        hello.extend(frame(1, END_HEADERS_AND_STREAM, 1, &get_block("/later")));
        hello.extend(frame(1, END_HEADERS_AND_STREAM, 3, &get_block("/later")));
        let c = w.connect(&hello);
        let (kinds, _) = frames(&c.read());
        assert!(
            kinds.iter().all(|&(_, stream)| stream == 0),
            "only connection frames (SETTINGS, WINDOW_UPDATE) so far: {kinds:?}"
        );
        let (first, second) = {
            let mut p = parked.lock().unwrap();
            assert_eq!(p.len(), 2, "both streams deferred at once");
            let second = p.pop().unwrap();
            (p.pop().unwrap(), second)
        };
        assert!(second.complete(Response::text(200, "two")).is_ok());
        w.settle();
        let (kinds, data) = frames(&c.read());
        assert!(
            kinds.contains(&(1, 3)),
            "stream 3 answered first: {kinds:?}"
        );
        assert!(
            !kinds.iter().any(|&(_, s)| s == 1),
            "stream 1 still waits: {kinds:?}"
        );
        assert_eq!(data, [(3, b"two".to_vec())]);
        assert!(first.complete(Response::text(200, "one")).is_ok());
        w.settle();
        let (kinds, data) = frames(&c.read());
        assert!(kinds.contains(&(1, 1)), "{kinds:?}");
        assert_eq!(data, [(1, b"one".to_vec())]);
        assert_eq!(w.connections(), 1);
    }

    const END_STREAM: u8 = 0x1;
    const END_HEADERS: u8 = 0x4;

    /// The preface, an empty SETTINGS and `frames`: what an HTTP/2 client sends first.
    fn h2_hello(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut hello = tern_http2::PREFACE.to_vec();
        hello.extend(frame(4, 0, 0, &[]));
        for f in frames {
            hello.extend(f);
        }
        hello
    }

    /// A GET whose HEADERS come without END_STREAM is not forwarded until its stream shows
    /// whether a body follows; ended by an empty DATA frame, it goes upstream as a GET
    /// without a body (no `Transfer-Encoding: chunked`), as it does over HTTP/1.1. A POST
    /// whose body begins without a length goes chunked, at its first byte.
    #[test]
    fn an_http2_get_ended_by_an_empty_data_frame_goes_upstream_without_a_body() {
        let (mut w, addr) = proxy();
        let c = w.connect(&h2_hello(&[frame(1, END_HEADERS, 1, &get_block("/a"))]));
        assert!(
            w.io().accept(&addr).is_none(),
            "undecided: nothing forwarded yet"
        );
        c.write(&frame(0, END_STREAM, 1, &[]));
        w.settle();
        let up = w.io().accept(&addr).expect("forwarded at the stream's end");
        assert_eq!(
            text(&up.read()),
            "GET /a HTTP/1.1\r\nHost: upstream\r\n\r\n"
        );
        up.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        w.settle();
        let (_, data) = frames(&c.read());
        assert_eq!(data, [(1, b"ok".to_vec())]);

        let post = block(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", "a"),
            (":path", "/p"),
        ]);
        c.write(&frame(1, END_HEADERS, 3, &post));
        w.settle();
        assert!(up.read().is_empty(), "undecided: nothing forwarded yet");
        c.write(&frame(0, 0, 3, b"abc"));
        w.settle();
        assert_eq!(
            text(&up.read()),
            "POST /p HTTP/1.1\r\nHost: upstream\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
            "streamed at its first byte"
        );
        c.write(&frame(0, END_STREAM, 3, &[]));
        w.settle();
        assert_eq!(text(&up.read()), "0\r\n\r\n");
    }

    /// A stream waiting undecided (HEADERS without END_STREAM, nothing after) that the client
    /// resets leaves nothing behind, and one left waiting is cut off at the body timeout,
    /// even while another stream's relay waits for its upstream (whose own deadline is
    /// later); neither ever reaches the upstream.
    #[test]
    fn an_undecided_http2_stream_is_forgotten_on_reset_and_times_out_as_a_body() {
        let (mut w, addr) = proxy();
        let c = w.connect(&h2_hello(&[frame(1, END_HEADERS, 1, &get_block("/reset"))]));
        const CANCEL: u32 = 0x8;
        c.write(&frame(3, 0, 1, &CANCEL.to_be_bytes())); // RST_STREAM
        w.settle();
        assert!(w.io().accept(&addr).is_none());
        // The connection goes on: a GET with END_STREAM is relayed at once, and its upstream
        // stays silent (its first-byte timeout is 60 s away).
        c.write(&frame(1, END_HEADERS | END_STREAM, 3, &get_block("/slow")));
        w.settle();
        let up = w.io().accept(&addr).expect("the relay of stream 3");
        assert!(text(&up.read()).starts_with("GET /slow HTTP/1.1\r\n"));
        c.read();
        // A stream left undecided.
        c.write(&frame(1, END_HEADERS, 5, &get_block("/stalled")));
        w.settle();
        w.advance(9 * SECOND);
        assert!(!c.closed_by_worker());
        assert_eq!(w.counter(Counter::TimeoutBody), 0);
        w.advance(2 * SECOND);
        let (kinds, _) = frames(&c.read());
        assert!(kinds.contains(&(7, 0)), "GOAWAY: {kinds:?}");
        assert_eq!(w.counter(Counter::TimeoutBody), 1);
        assert!(c.closed_by_worker() || c.shut_by_worker());
        assert!(w.io().accept(&addr).is_none());
        assert!(
            !text(&up.read()).contains("/stalled"),
            "the undecided stream never went upstream"
        );
    }

    fn acceptor() -> Arc<tern_tls::TlsAcceptor> {
        Arc::new(
            tern_tls::TlsAcceptor::new(&tern_tls::TlsOptions {
                self_signed: true,
                alpn: vec![b"http/1.1".to_vec()],
                ..Default::default()
            })
            .unwrap(),
        )
    }

    /// A TLS client that starts a handshake and stops: at the header timeout it is cut off,
    /// counted as a handshake that timed out (not as an HTTP one), and it is a strike like
    /// a slow head; garbage instead of a ClientHello gets an alert at once.
    #[test]
    fn a_stalled_tls_handshake_times_out_as_one_and_strikes() {
        let bans = Arc::new(Bans::new(BanConfig {
            after_strikes: 1,
            ..BanConfig::default()
        }));
        let mut w = MemoryWorker::with_tls(hello(), config(), Some(bans), Some(acceptor()));
        let peer = SocketAddr::from(([198, 51, 100, 20], 4000));
        // The first bytes of a ClientHello record, and no more.
        let c = w.connect_from(peer, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]);
        w.advance(9 * SECOND);
        assert!(!c.closed_by_worker());
        w.advance(2 * SECOND);
        assert!(c.closed_by_worker());
        assert_eq!(w.counter(Counter::TlsFailedTimeout), 1);
        assert_eq!(w.counter(Counter::TimeoutHeader), 0);
        assert_eq!(w.counter(Counter::BansAdded), 1);

        let garbage = w.connect(&[0x16, 0x03, 0x01, 0x00, 0x04, 1, 0, 0, 0]);
        // The alert, then a half-close; the socket closes once the client has closed too
        // (unread input would otherwise reset the connection before the alert is read).
        assert!(garbage.shut_by_worker() && !garbage.closed_by_worker());
        assert_eq!(garbage.read().first(), Some(&0x15), "an alert record");
        garbage.shutdown();
        w.settle();
        assert!(garbage.closed_by_worker());
        assert_eq!(w.counter(Counter::TlsFailedBadRecord), 1);
    }

    /// An upstream group of one server spoken to over TLS, at `addr`.
    struct TlsGroup {
        addr: crate::upstream::UpstreamAddr,
        tls: crate::upstream::UpstreamTls,
    }

    impl crate::upstream::Upstreams for TlsGroup {
        fn pool_key(&self) -> u64 {
            2
        }
        fn addr(&self, _: usize) -> &crate::upstream::UpstreamAddr {
            &self.addr
        }
        fn pick(&self, _: usize, _: u64, tried: u64) -> Option<usize> {
            (tried & 1 == 0).then_some(0)
        }
        fn begin(&self, _: usize, _: usize) {}
        fn end(&self, _: usize, _: usize, _: crate::upstream::UpstreamOutcome, _: u64) {}
        fn timeouts(&self) -> crate::upstream::UpstreamTimeouts {
            crate::upstream::UpstreamTimeouts::default()
        }
        fn max_idle(&self) -> usize {
            1
        }
        fn tls(&self, _: usize) -> Option<&crate::upstream::UpstreamTls> {
            Some(&self.tls)
        }
    }

    /// The upstream's end of a TLS connection, played by the test: rustls's own server
    /// connection (with tern's acceptor's configuration) over the socket in memory.
    struct TlsUpstream {
        peer: MemoryPeer,
        session: rustls::ServerConnection,
        /// The plaintext it received.
        got: Vec<u8>,
        /// The worker's close_notify came.
        closed: bool,
    }

    impl TlsUpstream {
        /// Takes what the worker sent, answers what the session has to say.
        fn shuttle(&mut self) {
            let bytes = self.peer.read();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                self.session.read_tls(&mut rest).unwrap();
                self.session.process_new_packets().unwrap();
            }
            let mut buf = [0u8; 4096];
            loop {
                match std::io::Read::read(&mut self.session.reader(), &mut buf) {
                    Ok(0) => break self.closed = true,
                    Ok(n) => self.got.extend_from_slice(&buf[..n]),
                    Err(_) => break,
                }
            }
            let mut out = Vec::new();
            while self.session.wants_write() {
                self.session.write_tls(&mut out).unwrap();
            }
            if !out.is_empty() {
                self.peer.write(&out);
            }
        }

        fn send(&mut self, plaintext: &[u8]) {
            std::io::Write::write_all(&mut self.session.writer(), plaintext).unwrap();
            self.shuttle();
        }
    }

    /// A worker with `config` whose every request is forwarded (as `GET` of its target, a
    /// WebSocket handshake if `upgrade`) to one upstream over TLS, at the returned address;
    /// the acceptor is the upstream's side (a certificate for `upstream.test`, which the
    /// worker's client config trusts).
    fn tls_proxy(
        config: ServerConfig,
        upgrade: bool,
    ) -> (MemoryWorker, MemoryAddr, tern_tls::TlsAcceptor) {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["upstream.test".into()]).unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        let acceptor = tern_tls::TlsAcceptor::new(&tern_tls::TlsOptions {
            certs: vec![tern_tls::CertFiles {
                cert: cert.clone(),
                key,
            }],
            alpn: vec![b"http/1.1".to_vec()],
            ..Default::default()
        })
        .unwrap();
        let client = tern_tls::upstream::client_config(&tern_tls::upstream::UpstreamTlsOptions {
            ca: Some(cert),
            client_cert: None,
        })
        .unwrap();
        let at = SocketAddr::from(([127, 0, 0, 1], 443));
        let group = Arc::new(TlsGroup {
            addr: crate::upstream::UpstreamAddr::Tcp(at),
            tls: crate::upstream::UpstreamTls {
                config: client,
                name: "upstream.test".try_into().unwrap(),
            },
        });
        let router = Router::new().fallback(
            move |req: &crate::Request<'_>, _: &mut crate::HandlerContext<'_>| {
                let mut head = format!("GET {} HTTP/1.1\r\nHost: upstream\r\n", req.head.target);
                if upgrade {
                    head.push_str("Connection: upgrade\r\nUpgrade: websocket\r\n");
                }
                Reply::Forward(Box::new(crate::upstream::Forward {
                    upstreams: group.clone(),
                    head: head.into_bytes(),
                    idempotent: true,
                    upgrade,
                    edit: None,
                    own_answers: None,
                    max_body: u64::MAX,
                    wire: Default::default(),
                    not_before_ms: 0,
                    tee: None,
                    hold: None,
                    fallback: None,
                }))
            },
        );
        let mut w = MemoryWorker::new(router, config, None);
        let addr = MemoryAddr::Tcp(at);
        w.io().listen(addr.clone());
        (w, addr, acceptor)
    }

    /// TLS toward an upstream through the same socket loop as everything else: the handshake,
    /// the request, an answer read in pieces of a few bytes of ciphertext, the connection
    /// pooled and reused for the next request without a second handshake, and dropped once
    /// the upstream closes it while idle.
    #[test]
    fn a_tls_upstream_is_handshaken_relayed_in_pieces_and_reused() {
        let (mut w, addr, acceptor) = tls_proxy(config(), false);
        let c = w.connect(GET);
        let peer = w.io().accept(&addr).expect("the worker connected");
        peer.set_max_read(5);
        let mut up = TlsUpstream {
            peer,
            session: rustls::ServerConnection::new(acceptor.config()).unwrap(),
            got: Vec::new(),
            closed: false,
        };
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nover tls!\r\n";
        for round in 1.. {
            assert!(round < 100, "no answer after {round} rounds");
            up.shuttle();
            w.settle();
            if up.got.ends_with(b"\r\n\r\n") {
                break;
            }
        }
        assert!(
            text(&up.got).starts_with("GET / HTTP/1.1\r\n"),
            "{}",
            text(&up.got)
        );
        up.send(answer);
        w.settle();
        let out = text(&c.read());
        assert!(
            out.starts_with("HTTP/1.1 200 OK") && out.ends_with("over tls!\r\n"),
            "{out}"
        );
        let handshakes = || {
            w.stats()
                .upstream_total(crate::stats::UpstreamCounter::TlsHandshakes)
        };
        assert_eq!(handshakes(), 1);

        // The next request reuses the connection and its session.
        up.got.clear();
        c.write(b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        assert!(w.io().accept(&addr).is_none(), "no second connection");
        assert_eq!(up.peer.exchanges(), 2);
        up.shuttle();
        assert!(
            text(&up.got).starts_with("GET /b HTTP/1.1\r\n"),
            "{}",
            text(&up.got)
        );
        up.send(answer);
        w.settle();
        assert!(text(&c.read()).ends_with("over tls!\r\n"));
        assert_eq!(
            w.stats()
                .upstream_total(crate::stats::UpstreamCounter::TlsHandshakes),
            1
        );
        assert_eq!(up.peer.reused_with_unread_bytes(), 0);

        // The upstream closes the idle connection (close_notify, then its end): dropped.
        up.session.send_close_notify();
        up.shuttle();
        up.peer.shutdown();
        w.settle();
        assert!(up.peer.closed_by_worker());
    }

    /// A header block of literal fields without indexing (RFC 7541 §6.2.2).
    fn block(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (name, value) in fields {
            b.push(0);
            b.push(name.len() as u8);
            b.extend(name.as_bytes());
            b.push(value.len() as u8);
            b.extend(value.as_bytes());
        }
        b
    }

    /// A WebSocket over HTTP/2 relayed to a TLS upstream: the tunnel opens on the upstream's
    /// 101, the client's bytes go through, and the client's END_STREAM ends the upstream's
    /// side as TLS ends it: close_notify first, then the FIN (a send after the FIN would fail).
    #[test]
    fn an_http2_tunnel_to_a_tls_upstream_ends_with_close_notify_then_the_fin() {
        let config = ServerConfig {
            http2_websocket: true,
            ..config()
        };
        let (mut w, addr, acceptor) = tls_proxy(config, true);
        let mut hello = tern_http2::PREFACE.to_vec();
        hello.extend(frame(4, 0, 0, &[])); // SETTINGS
        const END_HEADERS: u8 = 0x4;
        let connect = block(&[
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "http"),
            (":authority", "a"),
            (":path", "/chat"),
            ("sec-websocket-version", "13"),
        ]);
        hello.extend(frame(1, END_HEADERS, 1, &connect));
        let c = w.connect(&hello);
        let mut up = TlsUpstream {
            peer: w.io().accept(&addr).expect("the worker connected"),
            session: rustls::ServerConnection::new(acceptor.config()).unwrap(),
            got: Vec::new(),
            closed: false,
        };
        for round in 1.. {
            assert!(round < 100, "no handshake request after {round} rounds");
            up.shuttle();
            w.settle();
            if up.got.ends_with(b"\r\n\r\n") {
                break;
            }
        }
        let head = text(&up.got);
        assert!(head.starts_with("GET /chat HTTP/1.1\r\n"), "{head}");
        let key = head
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .expect("the relay's key");
        let digest = aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
            format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
        );
        use base64::Engine as _;
        let accept = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
        up.got.clear();
        up.send(
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            )
            .as_bytes(),
        );
        w.settle();
        let (kinds, _) = frames(&c.read());
        assert!(kinds.contains(&(1, 1)), "the tunnel's 200: {kinds:?}");

        // The client's last bytes, and the end of its side.
        const END_STREAM: u8 = 0x1;
        c.write(&frame(0, END_STREAM, 1, b"hello"));
        w.settle();
        up.shuttle();
        assert_eq!(text(&up.got), "hello");
        assert!(up.closed, "close_notify came");
        assert!(up.peer.shut_by_worker(), "then the FIN");
        assert!(!up.peer.closed_by_worker(), "the upstream may still answer");

        // It answers, then ends its side: the stream ends.
        up.send(b"bye");
        up.session.send_close_notify();
        up.shuttle();
        up.peer.shutdown();
        w.settle();
        let (kinds, data) = frames(&c.read());
        assert_eq!(data, [(1, b"bye".to_vec())], "{kinds:?}");
        assert!(up.peer.closed_by_worker());
        assert_eq!(w.connections(), 1);
    }

    /// Where a handed-back request goes in [`handing_back`]'s router: its path and query,
    /// as the reentry saw them, and the file an answer may send.
    struct HandedTo {
        file: std::path::PathBuf,
    }

    /// A worker whose every request is forwarded to [`crate::testing::MemoryUpstream`] by a
    /// route that follows `X-Accel-Redirect` and reroutes 404 to `/page`. A request handed
    /// back is built again from the head the route kept and answered by: `/page` (a page
    /// naming the method and query it got), `/file` (the file, sent as a file), `/up` (the
    /// same upstream again, without a hand-back), `/later` (a deferred reply).
    fn handing_back() -> (MemoryWorker, MemoryAddr, tempfile::TempDir) {
        use crate::handler::{Handback, Handoff, Rerun};
        use crate::upstream::Forward;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("report.txt");
        std::fs::write(&file, "the report\n").unwrap();
        let to = Arc::new(HandedTo { file });
        let upstream = Arc::new(crate::testing::MemoryUpstream::default());
        let forward = move |head: String| {
            Reply::Forward(Box::new(Forward {
                upstreams: upstream.clone(),
                head: head.into_bytes(),
                idempotent: true,
                upgrade: false,
                edit: None,
                own_answers: None,
                max_body: u64::MAX,
                wire: Default::default(),
                not_before_ms: 0,
                tee: None,
                hold: None,
                fallback: None,
            }))
        };
        let forward = Arc::new(forward);
        let router = Router::new().fallback(
            move |req: &crate::Request<'_>, cx: &mut crate::HandlerContext<'_>| {
                let head = format!(
                    "{} {} HTTP/1.1\r\nHost: upstream\r\n",
                    req.head.method_str, req.head.target
                );
                let (to, again) = (to.clone(), forward.clone());
                // The route keeps what it needs of the request: here its Host and method.
                let host = String::from_utf8_lossy(req.head.host.unwrap_or_default()).into_owned();
                let method = if req.method() == crate::Method::Head {
                    "HEAD"
                } else {
                    "GET"
                };
                let reenter = Box::new(move |h: &Handoff<'_>, run: &mut dyn Rerun| {
                    let query = h.query.map_or(String::new(), |q| format!("?{q}"));
                    let raw = format!(
                        "{method} {}{query} HTTP/1.1\r\nHost: {host}\r\n\r\n",
                        h.path
                    );
                    let peer = SocketAddr::from(([127, 0, 0, 1], 1));
                    crate::testing::with_request(raw.as_bytes(), peer, false, |req| {
                        let answer = |req: &crate::Request<'_>,
                                      cx: &mut crate::HandlerContext<'_>|
                         -> Reply {
                            match req.path() {
                                "/page" => {
                                    let q = req.query().unwrap_or("-");
                                    let body = format!("page {} q={q}", req.head.method_str);
                                    Response::new(200)
                                        .with_header("Content-Type", "text/plain")
                                        .with_header("Cache-Control", "no-store")
                                        .with_body(Body::Owned(body.into_bytes()))
                                        .into()
                                }
                                "/file" => {
                                    let f = std::fs::File::open(&to.file).unwrap();
                                    let len = f.metadata().unwrap().len();
                                    Response::new(200)
                                        .with_header("Content-Type", "text/plain")
                                        .with_body(Body::File(crate::FileBody {
                                            file: Arc::new(f),
                                            offset: 0,
                                            len,
                                        }))
                                        .into()
                                }
                                "/up" => again("GET /up HTTP/1.1\r\nHost: upstream\r\n".into()),
                                "/later" => {
                                    std::mem::forget(cx.defer());
                                    Reply::Later
                                }
                                _ => Response::text(404, "not found\n").into(),
                            }
                        };
                        run.answer(req, &answer);
                    });
                });
                cx.hand_back(Box::new(Handback {
                    x_accel_redirect: true,
                    reroute_status: Arc::from(vec![(404, "/page?from=404".into())]),
                    reenter,
                }));
                forward(head)
            },
        );
        let mut w = MemoryWorker::new(router, config(), None);
        let addr = MemoryAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 9)));
        w.io().listen(addr.clone());
        (w, addr, dir)
    }

    /// The app's answer that hands a request back: its head, the fields nginx carries over,
    /// one it does not, and a body that must never reach the client.
    fn accel(to: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nX-Accel-Redirect: {to}\r\nContent-Type: application/pdf\r\n\
             Content-Disposition: attachment; filename=\"r.pdf\"\r\nSet-Cookie: seen=1\r\n\
             X-App: yes\r\nContent-Length: 7\r\n\r\nIGNORED"
        )
    }

    /// A response's head fields in lower case, and its body.
    fn split(out: &str) -> (Vec<(String, String)>, String) {
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((out, ""));
        let fields = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
            .collect();
        (fields, body.to_string())
    }

    fn value<'f>(fields: &'f [(String, String)], name: &str) -> Vec<&'f str> {
        fields
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// HTTP/1.1: the app's `X-Accel-Redirect` is followed to a page of the route's own (a GET
    /// with the query named; the app's body dropped, its connection pooled as its answer was
    /// read whole), with the fields nginx carries: the app's `Content-Type` and
    /// `Content-Disposition` over the page's, `Set-Cookie`; its others and the header itself
    /// never reach the client. A POST is handed back as a GET, a HEAD stays HEAD, a file goes
    /// as a file.
    #[test]
    fn x_accel_redirect_answers_with_the_route_s_answer_over_http1() {
        let (mut w, addr, _dir) = handing_back();
        let c = w.connect(b"GET /download?id=7 HTTP/1.1\r\nHost: a\r\n\r\n");
        let up = w.io().accept(&addr).expect("the worker connected");
        assert!(text(&up.read()).starts_with("GET /download?id=7 HTTP/1.1\r\n"));
        up.write(accel("/page?x=1").as_bytes());
        w.settle();
        let out = text(&c.read());
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        let (fields, body) = split(&out);
        assert_eq!(body, "page GET q=x=1");
        assert_eq!(value(&fields, "content-type"), ["application/pdf"]);
        assert_eq!(
            value(&fields, "content-disposition"),
            ["attachment; filename=\"r.pdf\""]
        );
        assert_eq!(value(&fields, "set-cookie"), ["seen=1"]);
        assert_eq!(
            value(&fields, "cache-control"),
            ["no-store"],
            "the page's own"
        );
        assert!(value(&fields, "x-app").is_empty(), "{out}");
        assert!(value(&fields, "x-accel-redirect").is_empty(), "{out}");
        assert!(!up.closed_by_worker(), "read whole: pooled");

        // A POST goes back as a GET (its body went to the app), a HEAD as a HEAD.
        c.write(b"POST /form HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc");
        w.settle();
        assert!(w.io().accept(&addr).is_none(), "the pooled connection");
        assert!(text(&up.read()).starts_with("POST /form HTTP/1.1\r\n"));
        up.write(accel("/page").as_bytes());
        w.settle();
        let (_, body) = split(&text(&c.read()));
        assert_eq!(body, "page GET q=-");
        c.write(b"HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        let up = w
            .io()
            .accept(&addr)
            .expect("a connection that carried a body is not pooled");
        assert!(text(&up.read()).starts_with("HEAD /x HTTP/1.1\r\n"));
        up.write(b"HTTP/1.1 200 OK\r\nX-Accel-Redirect: /page\r\nContent-Length: 7\r\n\r\n");
        w.settle();
        let out = text(&c.read());
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        let (fields, body) = split(&out);
        assert_eq!(
            value(&fields, "content-length"),
            ["13"],
            "the GET's: page HEAD q=-"
        );
        assert_eq!(body, "", "no body for a HEAD");

        // A file, sent as one.
        c.write(b"GET /f HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        up.read();
        up.write(accel("/file").as_bytes());
        w.settle();
        let (fields, body) = split(&text(&c.read()));
        assert_eq!(body, "the report\n");
        assert_eq!(value(&fields, "content-type"), ["application/pdf"]);
        assert_eq!(w.connections(), 1, "the client's connection goes on");
    }

    /// A hand-back the route forwards again: the app's connection is let go first, back into
    /// the pool (its answer was read whole), and the new request goes out on it, a GET with
    /// no body; the second answer reaches the client with its own fields and those carried
    /// from the first where it has none of their names.
    /// An app answer whose body is not all there yet closes its connection instead.
    #[test]
    fn a_handed_back_request_may_be_forwarded_again_on_the_pooled_connection() {
        let (mut w, addr, _dir) = handing_back();
        let c = w.connect(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n");
        let up = w.io().accept(&addr).unwrap();
        up.read();
        up.write(accel("/up").as_bytes());
        w.settle();
        assert!(
            w.io().accept(&addr).is_none(),
            "the same connection, from the pool"
        );
        let second = text(&up.read());
        assert!(second.starts_with("GET /up HTTP/1.1\r\n"), "{second}");
        assert!(c.read().is_empty(), "nothing before the second answer");
        up.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nsecond");
        w.settle();
        let out = text(&c.read());
        let (fields, body) = split(&out);
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert_eq!(body, "second");
        assert_eq!(
            value(&fields, "content-type"),
            ["text/plain"],
            "the upstream's own"
        );
        assert_eq!(
            value(&fields, "content-disposition"),
            ["attachment; filename=\"r.pdf\""],
            "the app's, where the upstream has none"
        );
        assert_eq!(value(&fields, "set-cookie"), ["seen=1"]);

        // The app's body is still coming when its head hands the request back.
        c.write(b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        up.read();
        up.write(b"HTTP/1.1 200 OK\r\nX-Accel-Redirect: /up\r\nContent-Length: 100\r\n\r\npart");
        w.settle();
        assert!(up.closed_by_worker(), "its unread body goes with it");
        let fresh = w.io().accept(&addr).expect("a new connection for /up");
        assert!(text(&fresh.read()).starts_with("GET /up HTTP/1.1\r\n"));
        fresh.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        w.settle();
        assert!(text(&c.read()).ends_with("\r\n\r\nok"));
    }

    /// A status the route reroutes is answered by its path (the page's status, 200); a
    /// target with no canonical form is a 502 (not the app's server's failure: its
    /// connection is not blamed); a route that answers later cannot take a hand-back: 500.
    #[test]
    fn rerouted_statuses_bad_targets_and_deferred_answers() {
        let (mut w, addr, _dir) = handing_back();
        let c = w.connect(b"GET /gone HTTP/1.1\r\nHost: a\r\n\r\n");
        let up = w.io().accept(&addr).unwrap();
        up.read();
        up.write(b"HTTP/1.1 404 Not Found\r\nSet-Cookie: no=1\r\nContent-Length: 4\r\n\r\ngone");
        w.settle();
        let out = text(&c.read());
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        let (fields, body) = split(&out);
        assert_eq!(body, "page GET q=from=404");
        assert!(
            value(&fields, "set-cookie").is_empty(),
            "only a 401's WWW-Authenticate"
        );
        for bad in ["/a/../../etc/passwd", "relative", "/a%2Fb", "/a b"] {
            c.write(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
            w.settle();
            let up = w.io().accept(&addr).unwrap_or_else(|| up.clone());
            up.read();
            up.write(accel(bad).as_bytes());
            w.settle();
            let out = text(&c.read());
            assert!(out.starts_with("HTTP/1.1 502 "), "{bad}: {out}");
            assert!(
                !out.contains("IGNORED") && !out.contains("X-Accel"),
                "{out}"
            );
        }
        c.write(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
        w.settle();
        let up = w.io().accept(&addr).unwrap();
        up.read();
        up.write(accel("/later").as_bytes());
        w.settle();
        assert!(text(&c.read()).starts_with("HTTP/1.1 500 "));
        assert_eq!(w.connections(), 1);
    }

    /// An HTTP/2 response's header block decoded, and the DATA of its stream.
    /// (`decoder`: the connection's, every block goes through it in order.)
    fn h2_answer(
        decoder: &mut tern_http2::hpack::Decoder,
        bytes: &[u8],
        stream: u32,
    ) -> (Vec<(String, String)>, Vec<u8>) {
        let mut rest = bytes;
        let (mut fields, mut data) = (Vec::new(), Vec::new());
        while rest.len() >= 9 {
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
            let payload = &rest[9..9 + len];
            match rest[3] {
                1 => {
                    decoder
                        .decode(payload, usize::MAX, |n, v| {
                            if id == stream {
                                fields.push((text(n), text(v)));
                            }
                            Ok(())
                        })
                        .unwrap();
                }
                0 if id == stream => data.extend_from_slice(payload),
                _ => {}
            }
            rest = &rest[9 + len..];
        }
        (fields, data)
    }

    /// HTTP/2: the same hand-backs as over HTTP/1.1, each answered on its own stream: a page
    /// (a whole answer sent as a handler's), a file, and the request forwarded again.
    #[test]
    fn x_accel_redirect_answers_with_the_route_s_answer_over_http2() {
        let (mut w, addr, _dir) = handing_back();
        let mut hello = tern_http2::PREFACE.to_vec();
        hello.extend(frame(4, 0, 0, &[])); // SETTINGS
        const END_HEADERS_AND_STREAM: u8 = 0x4 | 0x1;
        hello.extend(frame(1, END_HEADERS_AND_STREAM, 1, &get_block("/download")));
        let c = w.connect(&hello);
        let up = w.io().accept(&addr).expect("the worker connected");
        assert!(text(&up.read()).starts_with("GET /download HTTP/1.1\r\n"));
        up.write(accel("/page?x=2").as_bytes());
        w.settle();
        let mut decoder = tern_http2::hpack::Decoder::new(4096);
        let (fields, data) = h2_answer(&mut decoder, &c.read(), 1);
        assert_eq!(text(&data), "page GET q=x=2");
        assert_eq!(value(&fields, ":status"), ["200"]);
        assert_eq!(value(&fields, "content-type"), ["application/pdf"]);
        assert_eq!(value(&fields, "set-cookie"), ["seen=1"]);
        assert!(value(&fields, "x-accel-redirect").is_empty(), "{fields:?}");
        assert!(value(&fields, "x-app").is_empty(), "{fields:?}");

        c.write(&frame(1, END_HEADERS_AND_STREAM, 3, &get_block("/f")));
        w.settle();
        up.read();
        up.write(accel("/file").as_bytes());
        w.settle();
        let (_, data) = h2_answer(&mut decoder, &c.read(), 3);
        assert_eq!(text(&data), "the report\n");

        c.write(&frame(1, END_HEADERS_AND_STREAM, 5, &get_block("/again")));
        w.settle();
        up.read();
        up.write(accel("/up").as_bytes());
        w.settle();
        assert!(text(&up.read()).starts_with("GET /up HTTP/1.1\r\n"));
        up.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
        w.settle();
        let (fields, data) = h2_answer(&mut decoder, &c.read(), 5);
        assert_eq!(text(&data), "second");
        assert_eq!(
            value(&fields, "content-disposition"),
            ["attachment; filename=\"r.pdf\""]
        );
        assert!(!w.relaying(), "every relay is over");
        assert_eq!(w.connections(), 1);
    }
}
