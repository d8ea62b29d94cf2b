use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tern_runtime::io::{Backend, Io, Readiness};
use tern_runtime::{ratelog, Context, InboxSender, MakeApp, TimerKey, WorkerApp};

use crate::access_log::{LogShared, WorkerLog};
use crate::bans::Bans;
use crate::config::{ListenerKind, ServerConfig};
use crate::conn::{Conn, Link, Status};
use crate::driver::pool::{UpstreamConns, UPSTREAM_TOKEN};
use crate::driver::relay::{self as relay_driver, Sockets};
use crate::driver::{self, Entry, Socket};
use crate::exchange::{ConnCx, DateLine, WorkerClock};
use crate::fault;
use crate::handler::ExchangeId;
use crate::handler::{Pending, TurnEnd, WorkerMessage};
use crate::quic::{QuicShared, QuicSide, QUIC_TAG};
use crate::response::Response;
use crate::router::Router;
use crate::slab::Slab;
use crate::stats::{Counter, Stats};
use crate::upstream::UpstreamOutcome;

/// The context a connection runs with, borrowed field by field from the worker (`$w`) and the
/// loop's context (`$cx`): a macro, not a method, so that the worker's other fields (its
/// connections) stay free to borrow beside it.
macro_rules! conn_cx {
    ($w:ident, $cx:ident, $clock:ident, $near_limit:expr) => {
        ConnCx {
            router: &$w.shared.router,
            acme: $w.shared.tls.as_ref().and_then(|t| t.acme()),
            bans: $w.shared.bans.as_deref(),
            secure_lines: ($w.shared.secure_lines.get())
                .filter(|l| !l.is_empty())
                .map(Vec::as_slice),
            config: &$w.config,
            stats: $w.shared.stats.worker($w.id),
            clock: &$clock,
            buffers: $cx.buffers,
            access_log: $w.access_log.as_mut(),
            inbox: &$w.inbox,
            worker_id: $w.id,
            stopping: $cx.stopping,
            draining: $cx.draining,
            near_limit: $near_limit,
        }
    };
}

/// What every worker shares, read-only (but for reloads).
pub(crate) struct Shared {
    pub router: Router,
    /// The start-up config.
    pub config: ServerConfig,
    pub stats: Stats,
    /// The config of the latest reload (its `runtime` part is the start-up one).
    pub live: ArcSwap<ServerConfig>,
    /// Bumped after `live` is stored; workers compare it once per loop turn.
    pub reloads: AtomicU64,
    pub tls: Option<Arc<tern_tls::TlsAcceptor>>,
    /// `Strict-Transport-Security: ...\r\n` and `Alt-Svc: ...\r\n`, added to answers over
    /// TLS. Set once the listeners are bound (Alt-Svc names the UDP port bound); a worker
    /// answering before that (the first instants) leaves them out.
    pub secure_lines: std::sync::OnceLock<Vec<u8>>,
    /// The bound port of the first TLS listener (for `--redirect-http`); 0 until known.
    pub https_port: std::sync::atomic::AtomicU16,
    /// Each listener's bound port (by index in `runtime.listen`): the configured one, then,
    /// once the runtime has bound them, the one chosen for port 0.
    pub listener_ports: Vec<std::sync::atomic::AtomicU16>,
    pub bans: Option<Arc<Bans>>,
    pub access_logs: Vec<Arc<LogShared>>,
    /// Apps' end-of-turn work (see `TurnEnd`).
    pub turn_ends: Vec<Arc<dyn TurnEnd>>,
    /// HTTP/3's QUIC settings and keys (`None`: HTTP/3 off).
    pub quic: Option<Arc<QuicShared>>,
    /// Run on each worker thread when it takes a reload (`Server::start` registers the
    /// static files' `forget_thread_caches`, so that the event loop names no handler).
    pub reload_hooks: Vec<fn()>,
}

/// Rounds of end-of-turn hooks in one turn (see `HttpWorker::end_turn`).
const END_TURN_ROUNDS: usize = 8;

/// The HTTP server on one worker thread.
pub(crate) struct HttpWorker<I: Io> {
    id: usize,
    shared: Arc<Shared>,
    inbox: InboxSender<WorkerMessage>,
    /// Boxed, so that the slot vector stays small: growing it by doubling then copies
    /// 16-byte slots, not whole connections, and leaves little freed-but-resident memory
    /// behind (idle connections are budgeted in bytes).
    conns: Slab<Box<Entry<I>>>,
    /// Connections whose flush yielded to be fair to others; driven again next turn.
    yielded: Vec<u64>,
    near_limit_at: usize,
    /// This worker's copy of the settings in force (replaced on reload, between turns).
    config: Arc<ServerConfig>,
    /// The `Shared::reloads` value `config` reflects.
    seen_reloads: u64,
    /// This worker's access-log buffer (with `--access-log`).
    access_log: Option<WorkerLog>,
    /// Connections to upstream servers (reverse proxy): relaying, or idle in the pool.
    upstreams: UpstreamConns<I>,
    /// Scratch for a connection's relay ids.
    relay_ids: Vec<ExchangeId>,
    /// Reused by `end_turn`.
    turn_answers: Vec<(Pending, Response)>,
    /// `end_turn` stopped while its hooks still answered: run them again next turn.
    turn_end_again: bool,
    /// The `Date` line of the clock's second, for this worker's answers.
    date: DateLine,
    /// HTTP/3: this worker's UDP sockets and QUIC connections (`None` with HTTP/3 off).
    quic: Option<QuicSide<I>>,
}

impl<I: Io> HttpWorker<I> {
    pub fn new(id: usize, shared: Arc<Shared>, inbox: InboxSender<WorkerMessage>) -> HttpWorker<I> {
        let seen_reloads = shared.reloads.load(Ordering::Acquire);
        let config = shared.live.load_full();
        let max = config.max_connections_per_worker;
        HttpWorker {
            id,
            inbox,
            conns: Slab::new(0),
            yielded: Vec::new(),
            near_limit_at: max - max / 10,
            config,
            seen_reloads,
            access_log: (!shared.access_logs.is_empty())
                .then(|| WorkerLog::new(&shared.access_logs, id)),
            shared,
            upstreams: UpstreamConns::default(),
            relay_ids: Vec::new(),
            turn_answers: Vec::new(),
            turn_end_again: false,
            date: DateLine::new(0),
            quic: None,
        }
    }

    /// Runs the apps' end-of-turn hooks and delivers the answers they give, like inbox
    /// completions but without the message.
    fn end_turn(&mut self, cx: &mut Context<'_, WorkerMessage, I>) {
        let shared = self.shared.clone();
        let mut answers = std::mem::take(&mut self.turn_answers);
        self.turn_end_again = false;
        // An answer lets its connection go on to a request pipelined behind it, which a hook
        // may stage in turn: run the hooks again until a round answers nothing, so such a
        // request is not left waiting for the next wake-up. Past a few rounds the loop turns
        // again without sleeping instead (fairness to the other connections).
        for round in 0.. {
            let mut answered = false;
            for hook in &shared.turn_ends {
                hook.end_turn(self.id, &mut answers);
                answered |= !answers.is_empty();
                for (pending, response) in answers.drain(..) {
                    let (conn, exchange) = pending.into_local();
                    self.on_message(
                        cx,
                        WorkerMessage::Complete {
                            conn,
                            exchange,
                            response,
                        },
                    );
                }
            }
            if !answered {
                break;
            }
            if round == END_TURN_ROUNDS {
                self.turn_end_again = true;
                break;
            }
        }
        self.turn_answers = answers;
    }

    /// A reload happened since the last turn: take the new settings and run the reload hooks
    /// (the static files drop this thread's front caches: their files may come from an old
    /// root or old options).
    #[cold]
    fn apply_reload(&mut self, reloads: u64) {
        self.seen_reloads = reloads;
        self.config = self.shared.live.load_full();
        let max = self.config.max_connections_per_worker;
        self.near_limit_at = max - max / 10;
        for hook in &self.shared.reload_hooks {
            hook();
        }
    }

    /// Runs `f` on the connection with its borrowed context, then applies the outcome:
    /// close it, queue it for another turn, or (re)arm its timer.
    fn with_conn(
        &mut self,
        cx: &mut Context<'_, WorkerMessage, I>,
        key: u64,
        f: impl FnOnce(&mut Entry<I>, &mut ConnCx<'_>, &mut Sockets<'_, I>) -> Status,
    ) {
        let near_limit = self.conns.len >= self.near_limit_at;
        let Some(entry) = self.conns.get_mut(key) else {
            return;
        };
        let clock = WorkerClock {
            clock: cx.clock,
            date: self.date.at(cx.clock.unix_secs()),
        };
        let mut ccx = conn_cx!(self, cx, clock, near_limit);
        let mut ucx = Sockets {
            io: cx.io,
            conns: &mut self.upstreams,
            ids: &mut self.relay_ids,
        };
        // Everything that runs the connection's own code (its protocol, TLS, relays,
        // compression, FastCGI) runs inside this catch: a panic there closes this connection
        // only, see `contain_panic` for why that is sound.
        let ran = catch_unwind(AssertUnwindSafe(|| {
            let status = f(entry, &mut ccx, &mut ucx);
            if status == Status::Close {
                relay_driver::abandon(entry, &mut ucx, &mut ccx);
                // close_notify on an established TLS session (and a 408 a timeout queued):
                // one attempt, nobody waits for the peer.
                entry.conn.prepare_close();
                driver::send_best_effort(&mut entry.conn, &mut entry.sock, ucx.io, &mut ccx);
                entry.conn.recycle(ccx.buffers);
                return (status, 0);
            }
            let (deadline, kind) = entry.conn.next_deadline(&ccx);
            let deadline = driver::write_period(&mut entry.sock, ucx.io, kind, deadline);
            (status, deadline)
        }));
        let (status, deadline) = match ran {
            Ok(done) => done,
            Err(panic) => return self.contain_panic(cx, key, panic),
        };
        match status {
            Status::Close => {
                // Dropping the stream closes the fd, which also removes it from epoll.
                self.conns.remove(key);
                self.shared
                    .stats
                    .worker(self.id)
                    .bump(Counter::ConnectionsClosed);
                return;
            }
            Status::Yielded => self.yielded.push(key),
            Status::Open => {}
        }
        let Some(entry) = self.conns.get_mut(key) else {
            return;
        };
        entry.deadline_ms = deadline;
        if deadline < entry.armed_ms {
            entry.armed_ms = deadline;
            cx.timers.schedule(key, deadline);
        }
    }

    /// A panic unwound out of connection `key`'s code. The connection is closed without
    /// another byte (its state is whatever the panic left) and the worker goes on, which is
    /// sound because what that code could have left half-updated is dropped or checked here:
    /// - the connection itself (parser, TLS session, HTTP/2 streams, encoders, relays, its
    ///   buffers): dropped whole, nothing of it is looked at again. Its buffers are freed,
    ///   not given back to the pool (the pool holds only what was given back whole).
    /// - its timer: left in the wheel; its key's generation finds no connection when it
    ///   fires, as for any closed connection. So do replies other threads still send it,
    ///   and its key in `yielded`.
    /// - upstream connections: the ones it owned are closed (their server's exchange ended as
    ///   abandoned); the idle ones in the pool are closed too, since the panic may have struck
    ///   while one was being handed back, and a connection put back mid-answer would give
    ///   its bytes to the next client.
    /// - the access log: a line being written may be cut short; it is dropped.
    /// - this thread's static-file caches: dropped, as on a reload (a handler panics under
    ///   the handler's own catch, but a cache may be mid-update when a connection panics
    ///   around it).
    /// - the sockets' backend: a panic inside one of its calls may leave its tables (which
    ///   completion is whose, which buffers are lent) half-updated, and that it cannot
    ///   contain: `Io::poisoned` says so and the panic goes on to end the worker (the
    ///   runtime then stops tern with an error, `runtime/src/worker.rs`).
    /// - the counters are atomics, and the shared state (router, config, TLS keys, bans) is
    ///   read-only here or behind locks that a panic poisons for every worker alike.
    #[cold]
    fn contain_panic(
        &mut self,
        cx: &mut Context<'_, WorkerMessage, I>,
        key: u64,
        panic: Box<dyn std::any::Any + Send>,
    ) {
        if cx.io.poisoned() {
            std::panic::resume_unwind(panic);
        }
        let stats = self.shared.stats.worker(self.id);
        stats.bump(Counter::ConnectionPanics);
        stats.bump(Counter::ConnectionsClosed);
        let entry = self.conns.remove(key);
        let peer = entry.as_ref().map(|e| e.conn.peer());
        for &(_, up) in entry.iter().flat_map(|e| &e.upstreams) {
            if let Some(c) = self.upstreams.get_mut(up) {
                let now = cx.clock.now_ms();
                c.set
                    .end(self.id, c.server, UpstreamOutcome::Abandoned, now);
            }
        }
        self.upstreams.close_after_panic(key);
        self.relay_ids.clear();
        if let Some(log) = &mut self.access_log {
            log.drop_partial_lines();
        }
        for hook in &self.shared.reload_hooks {
            hook();
        }
        // Its drop runs its code once more (encoders, TLS state): a second panic there is
        // contained too, leaking at most what was left undropped.
        drop(panic);
        let _ = catch_unwind(AssertUnwindSafe(move || drop(entry)));
        if ratelog::admit("connection_panic", cx.clock.now_ms()) {
            tracing::error!(
                worker = self.id,
                peer = ?peer,
                "a panic in a connection's code (logged above) closed that connection; the \
                 worker goes on"
            );
        }
    }
}

impl<I: Io> HttpWorker<I> {
    /// Runs `f` on the worker's HTTP/3 side with a connection's context (nothing with
    /// HTTP/3 off).
    fn with_quic(
        &mut self,
        cx: &mut Context<'_, WorkerMessage, I>,
        f: impl FnOnce(&mut QuicSide<I>, &mut Sockets<'_, I>, &mut ConnCx<'_>),
    ) {
        let Some(quic) = self.quic.as_mut() else {
            return;
        };
        let near_limit = self.conns.len + quic.connections() >= self.near_limit_at;
        let clock = WorkerClock {
            clock: cx.clock,
            date: self.date.at(cx.clock.unix_secs()),
        };
        let mut ccx = conn_cx!(self, cx, clock, near_limit);
        let mut up = Sockets {
            io: cx.io,
            conns: &mut self.upstreams,
            ids: &mut self.relay_ids,
        };
        f(quic, &mut up, &mut ccx);
    }
}

impl<I: Io> HttpWorker<I> {
    /// Some connection is relaying an exchange to an upstream server (for the in-memory
    /// harness: an answer may be incomplete so far).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn relaying(&mut self) -> bool {
        use crate::conn::RelayHost;
        let conns = &mut self.conns;
        conns.keys().into_iter().any(|k| {
            conns
                .get_mut(k)
                .is_some_and(|e| RelayHost::in_relay(&e.conn))
        })
    }

    /// See `MemoryWorker::set_quic_stale_timers`.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn set_quic_stale_timers(&mut self, entries: usize) {
        self.quic
            .as_mut()
            .expect("HTTP/3 on")
            .set_stale_timers(entries);
    }

    /// See `MemoryWorker::set_quic_retry_above`.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn set_quic_retry_above(&mut self, handshakes: usize) {
        self.quic.as_mut().expect("HTTP/3 on").retry_above = handshakes;
    }

    /// Readiness of an upstream connection: drive the client connection relaying through
    /// it; an idle pooled one that became readable was closed by its server (or sent
    /// something unasked) and is dropped.
    fn on_upstream_ready(
        &mut self,
        cx: &mut Context<'_, WorkerMessage, I>,
        key: u64,
        ready: Readiness,
    ) {
        let Some(up) = self.upstreams.get_mut(key) else {
            return;
        };
        let readable = ready.calls_for_read();
        up.note_event(readable, ready.writable || ready.error, ready.read_closed);
        if up.owner == 0 {
            if readable {
                self.upstreams.close(key);
            }
            return;
        }
        let owner = up.owner;
        if owner & QUIC_TAG != 0 {
            return self.with_quic(cx, |q, up, ccx| q.relay_ready(up, owner, ccx));
        }
        self.with_conn(cx, owner, |e, ccx, up| {
            relay_driver::drive(e, up, false, false, ccx)
        });
    }
}

/// Makes each worker's [`HttpWorker`] for the backend the runtime chose.
pub(crate) struct MakeHttpWorker(pub Arc<Shared>);

impl MakeApp for MakeHttpWorker {
    type Message = WorkerMessage;
    type App<B: Backend> = HttpWorker<B>;

    fn make<B: Backend>(&self, id: usize, inbox: InboxSender<WorkerMessage>) -> HttpWorker<B> {
        HttpWorker::new(id, self.0.clone(), inbox)
    }

    fn worker_panicked(&self, id: usize) {
        // On the lost worker's own thread: its block still has this one writer.
        self.0.stats.worker(id).bump(Counter::WorkerPanics);
    }
}

impl<I: Io> WorkerApp<I> for HttpWorker<I> {
    type Message = WorkerMessage;

    fn on_accept(
        &mut self,
        cx: &mut Context<'_, WorkerMessage, I>,
        sock: I::Sock,
        peer: SocketAddr,
        listener: usize,
    ) {
        let stats = self.shared.stats.worker(self.id);
        // Before any read: the request (TCP_DEFER_ACCEPT waited for it) is never looked at,
        // and closing with it unread resets the connection.
        if self
            .shared
            .bans
            .as_ref()
            .is_some_and(|b| b.is_banned(peer.ip()))
        {
            stats.bump(Counter::ConnectionsBanned);
            return;
        }
        if self.conns.len >= self.config.max_connections_per_worker || cx.draining {
            stats.bump(Counter::ConnectionsRefused);
            return; // dropping the stream closes it
        }
        // What the listener serves (`config.listener_kinds`, by index in `runtime.listen`).
        let kind = self
            .shared
            .config
            .listener_kinds
            .get(listener)
            .copied()
            .unwrap_or(ListenerKind::Http);
        let tls = match (kind, &self.shared.tls) {
            (ListenerKind::Https, Some(acceptor)) => Some(acceptor.accept()),
            _ => None,
        };
        let redirect_to_https = (kind == ListenerKind::RedirectToHttps).then(|| {
            match self.shared.https_port.load(Ordering::Relaxed) {
                0 => 443,
                port => port,
            }
        });
        let key = self.conns.insert(|key| {
            Box::new(Entry {
                conn: Conn::new(
                    Link {
                        peer,
                        key,
                        secure: tls.is_some(),
                        local_port: self
                            .shared
                            .listener_ports
                            .get(listener)
                            .map_or(0, |p| p.load(Ordering::Relaxed)),
                        redirect_to_https,
                    },
                    tls,
                    cx.clock.now_ms(),
                ),
                sock: Socket::new(sock, true),
                deadline_ms: u64::MAX,
                armed_ms: u64::MAX,
                upstreams: Vec::new(),
            })
        });
        stats.bump(Counter::ConnectionsAccepted);
        // The listeners defer accepts until data arrived (TCP_DEFER_ACCEPT), so the request or
        // ClientHello is usually here already: serve it now, without waiting for an event. A
        // connection that is done by then (`Connection: close`) is closed without ever being
        // registered with epoll; the others are registered (edge-triggered, once), and with_conn
        // has armed their timer.
        self.with_conn(cx, key, |e, ccx, up| {
            relay_driver::drive(e, up, true, false, ccx)
        });
        let Some(entry) = self.conns.get_mut(key) else {
            return;
        };
        if let Err(e) = cx.io.watch(&mut entry.sock.sock, key as usize) {
            tracing::warn!("register failed: {e}");
            self.conns.remove(key);
        }
    }

    fn on_ready(&mut self, cx: &mut Context<'_, WorkerMessage, I>, ready: Readiness) {
        let key = ready.token as u64;
        let readable = ready.calls_for_read();
        let fin = ready.read_closed;
        if key & UPSTREAM_TOKEN != 0 {
            return self.on_upstream_ready(cx, key, ready);
        }
        if key & QUIC_TAG != 0 {
            return self.with_quic(cx, |q, up, ccx| q.on_ready(up, ready, ccx));
        }
        self.with_conn(cx, key, |e, ccx, up| {
            relay_driver::drive(e, up, readable, fin, ccx)
        });
    }

    fn on_timer(&mut self, cx: &mut Context<'_, WorkerMessage, I>, key: TimerKey, at_ms: u64) {
        let now = cx.clock.now_ms();
        let Some(entry) = self.conns.get_mut(key) else {
            return;
        };
        if entry.armed_ms != at_ms {
            return; // superseded by an earlier arm
        }
        entry.armed_ms = u64::MAX;
        if entry.deadline_ms > now {
            // The deadline moved later since this was armed: re-arm (lazy cancellation).
            entry.armed_ms = entry.deadline_ms;
            cx.timers.schedule(key, entry.deadline_ms);
            return;
        }
        self.with_conn(cx, key, |e, ccx, up| {
            if driver::still_reading(&e.conn, &mut e.sock, up.io, ccx) {
                return Status::Open; // with_conn sets a fresh deadline and mark
            }
            if e.conn.trim_if_due(ccx) {
                return Status::Open; // idle memory given back; with_conn sets the next deadline
            }
            if e.conn.relay_timed_out(ccx) {
                // Another server is tried, or a 504 goes out: the connection goes on.
                return relay_driver::drive(e, up, false, false, ccx);
            }
            e.conn.time_out(ccx);
            Status::Close
        });
    }

    fn on_message(&mut self, cx: &mut Context<'_, WorkerMessage, I>, msg: WorkerMessage) {
        match msg {
            WorkerMessage::Complete {
                conn,
                exchange,
                response,
            } if conn & QUIC_TAG != 0 => self.with_quic(cx, |q, up, ccx| {
                q.complete(up, conn, exchange, response, ccx)
            }),
            WorkerMessage::Wake { conn, exchange } if conn & QUIC_TAG != 0 => {
                self.with_quic(cx, |q, up, ccx| q.wake(up, conn, exchange, ccx))
            }
            WorkerMessage::Datagram(datagram) => {
                if let Some(quic) = &self.shared.quic {
                    quic.handed_taken(self.id);
                }
                self.with_quic(cx, |q, up, ccx| q.take_handed(up, *datagram, ccx));
            }
            WorkerMessage::Complete {
                conn,
                exchange,
                response,
            } => {
                self.with_conn(cx, conn, |e, ccx, up| {
                    if e.conn.complete(exchange, response, ccx) {
                        relay_driver::drive(e, up, false, false, ccx)
                    } else {
                        Status::Open
                    }
                });
            }
            WorkerMessage::Wake { conn, exchange } => {
                self.with_conn(cx, conn, |e, ccx, up| {
                    if e.conn.relay_wake(exchange, ccx) {
                        relay_driver::drive(e, up, false, false, ccx)
                    } else {
                        Status::Open
                    }
                });
            }
        }
    }

    fn on_shutdown(&mut self, cx: &mut Context<'_, WorkerMessage, I>) {
        self.with_quic(cx, |q, up, ccx| q.begin_drain(up, ccx));
        for key in self.conns.keys() {
            self.with_conn(cx, key, |e, ccx, up| {
                if e.conn.begin_drain(e.sock.may_read(), ccx) {
                    Status::Close
                } else {
                    // Reads what may be waiting (answering it with `Connection: close`), or
                    // closes the connection if nothing was; busy connections just go on.
                    relay_driver::drive(e, up, false, false, ccx)
                }
            });
        }
    }

    fn before_events(&mut self, _cx: &mut Context<'_, WorkerMessage, I>, ready: &[Readiness]) {
        // An idle pooled upstream connection with news (bytes nobody asked for, or its close)
        // is dropped before any client event of this turn can take it from the pool; one that
        // goes idle during the turn is dropped on its event by `on_upstream_ready`.
        if self.upstreams.idle_count() == 0 {
            return;
        }
        for r in ready {
            let key = r.token as u64;
            if key & UPSTREAM_TOKEN != 0 && r.calls_for_read() {
                self.upstreams.close_if_idle(key);
            }
        }
    }

    fn before_turn(&mut self, _cx: &mut Context<'_, WorkerMessage, I>) {
        // One uncontended load per turn (written only by a reload).
        let reloads = self.shared.reloads.load(Ordering::Acquire);
        if reloads != self.seen_reloads {
            self.apply_reload(reloads);
        }
    }

    fn after_turn(&mut self, cx: &mut Context<'_, WorkerMessage, I>) {
        fault::worker_turn_ends();
        if let Some(ring) = cx.io.take_ring_counts() {
            let stats = self.shared.stats.worker(self.id);
            stats.add(Counter::IoUringSubmissions, ring.submissions);
            stats.add(Counter::IoUringCompletions, ring.completions);
            stats.add(Counter::IoUringEnters, ring.enters);
            stats.add(Counter::IoUringRearms, ring.rearms);
            stats.add(Counter::IoUringBufferExhaustions, ring.buffers_exhausted);
            stats.add(Counter::IoUringBuffersReclaimed, ring.buffers_reclaimed);
        }
        if !self.shared.turn_ends.is_empty() {
            self.end_turn(cx);
        }
        if let Some(log) = &mut self.access_log {
            log.tick(cx.clock.now_ms());
        }
        self.upstreams.sweep(cx.clock.now_ms());
        let now_us = cx.clock.now_us();
        if self
            .quic
            .as_ref()
            .is_some_and(|q| q.wants_after_turn(now_us))
        {
            self.with_quic(cx, |q, up, ccx| q.after_turn(up, ccx));
        }
        if self.yielded.is_empty() {
            return;
        }
        for key in std::mem::take(&mut self.yielded) {
            self.with_conn(cx, key, |e, ccx, up| {
                relay_driver::drive(e, up, true, false, ccx)
            });
        }
    }

    fn wants_another_turn(&self) -> bool {
        !self.yielded.is_empty()
            || self.turn_end_again
            || self.quic.as_ref().is_some_and(|q| q.wants_another_turn())
    }

    fn next_deadline_us(&self) -> Option<u64> {
        self.quic.as_ref().and_then(|q| q.next_deadline_us())
    }

    fn connections(&self) -> usize {
        self.conns.len + self.quic.as_ref().map_or(0, |q| q.connections())
    }

    fn adopt_datagrams(&mut self, cx: &mut Context<'_, WorkerMessage, I>, socks: Vec<I::Datagram>) {
        let Some(quic) = self.shared.quic.clone() else {
            return;
        };
        if socks.is_empty() {
            return;
        }
        let ports: Vec<u16> = socks
            .iter()
            .map(|s| cx.io.datagram_local_addr(s).port())
            .collect();
        let now_us = cx.clock.now_us();
        match QuicSide::new(cx.io, socks, &ports, quic, self.id, cx.inboxes, now_us) {
            Ok(quic) => self.quic = Some(quic),
            Err(e) => tracing::error!(worker = self.id, "HTTP/3 sockets could not be watched: {e}"),
        }
    }
}
