use std::io;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::bufpool::BufPool;
use crate::clock::Clock;
use crate::inbox::{Inbox, InboxSender};
use crate::io::{Backend, EpollIo, Io, Readiness, UringIo};
use crate::listener::{bind_datagram_reuseport, bind_reuseport, migrate_req_hint, share_inherited};
use crate::timer::{TimerKey, TimerWheel};
use crate::waker::Waker;

/// Expired timers handled per loop turn; the rest wait for the next turn (taken at once).
const TIMERS_PER_TURN: usize = 256;
const WAKER: usize = 1;
/// Listener `i` of a worker has token `FIRST_LISTENER_TOKEN + i`.
const FIRST_LISTENER_TOKEN: usize = 2;
/// The most addresses a runtime listens on (plain, TLS, redirect, ...).
pub const MAX_LISTENERS: usize = 32;
/// Tokens below this are the runtime's own; the app numbers its connections from here.
pub const FIRST_CONN_TOKEN: usize = FIRST_LISTENER_TOKEN + MAX_LISTENERS;

/// Accepts per loop turn before serving existing connections again, so an accept flood cannot
/// starve established clients.
const ACCEPT_BUDGET: usize = 128;
/// How long to stop accepting after EMFILE/ENFILE before trying again.
const ACCEPT_BACKOFF_MS: u64 = 100;
/// At shutdown, the most connections taken from the accept queue before the listener closes
/// (the queue holds at most `backlog`; this only bounds a flood that keeps refilling it).
const SHUTDOWN_ACCEPT_LIMIT: usize = 16_384;
/// At shutdown, how long the worker keeps serving normally after its last accept before it
/// starts draining. Connections taken from the accept queue at shutdown have usually not been
/// read yet; draining at once would close them as idle, and closing a socket with an unread
/// request resets it. One short period lets their requests arrive and be answered.
const SHUTDOWN_SETTLE_MS: u64 = 100;

/// Start-up settings of the runtime.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Every address to listen on; the app learns which one a connection came in on by its
    /// index here.
    pub listen: Vec<SocketAddr>,
    pub workers: usize,
    /// Pin worker `i` to the `i`-th CPU this process may use.
    pub pin: bool,
    pub backlog: i32,
    pub inbox_capacity: usize,
    pub read_buf_size: usize,
    pub write_buf_size: usize,
    /// How long draining may take after a shutdown request before connections are dropped.
    pub shutdown_grace: Duration,
    /// Listening sockets handed over by a service manager (socket activation), by index of
    /// `listen`: where one is given, every worker serves a duplicate of it and `listen[i]` is
    /// not bound. Missing entries and `None` mean "bind `listen[i]`".
    pub inherited: Vec<Option<Arc<std::net::TcpListener>>>,
    /// The sockets' backend the workers run on.
    pub io: IoChoice,
    /// UDP addresses to bind (QUIC): every worker gets its own socket on each, with
    /// `SO_REUSEPORT` (port 0: the first bind picks the port, the other workers join it), and
    /// its app gets them, in this order, through [`WorkerApp::adopt_datagrams`]. Bound before
    /// `after_bind`, like the TCP listeners.
    pub datagram_listen: Vec<SocketAddr>,
    /// Listeners (by index of `listen`) whose bound address gets a UDP socket too, after the
    /// addresses of `datagram_listen`: the same IP and port, so a TCP listener on port 0 gets
    /// its UDP twin on the port it was given (HTTP/3 beside HTTPS).
    pub datagram_beside: Vec<usize>,
}

/// Which sockets' backend the workers run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoChoice {
    /// Readiness: epoll, one syscall per socket operation.
    #[default]
    Epoll,
    /// Completions: io_uring, one ring per worker; start-up fails if it cannot be set up.
    Uring,
    /// io_uring if this kernel and its policy allow it, else epoll (start-up says why).
    Auto,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 8080))],
            workers: available_cpus().len().max(1),
            pin: false,
            backlog: 4096,
            inbox_capacity: 65536,
            // Most request heads fit in 4 KiB (longer ones grow the buffer to the head limit).
            // A connection holds its read buffer while a head is incomplete, so this is also
            // what each slowloris socket costs: 4 KiB rather than 16.
            read_buf_size: 4 * 1024,
            write_buf_size: 16 * 1024,
            shutdown_grace: Duration::from_secs(5),
            inherited: Vec::new(),
            io: IoChoice::default(),
            datagram_listen: Vec::new(),
            datagram_beside: Vec::new(),
        }
    }
}

/// What the event loop lends the app on every callback: its sockets' backend, clock, timers,
/// buffers and the worker's own inbox sender (to hand to other threads).
pub struct Context<'w, M, I: Io = EpollIo> {
    pub io: &'w mut I,
    pub clock: &'w Clock,
    pub timers: &'w mut TimerWheel,
    pub buffers: &'w mut BufPool,
    pub inbox: &'w InboxSender<M>,
    /// Every worker's inbox, by worker index (this one's included): for work that belongs to
    /// another worker (a datagram of a connection it owns).
    pub inboxes: &'w [InboxSender<M>],
    pub worker_id: usize,
    /// True once a stop was requested: answers no longer keep connections alive (the worker
    /// still reads and answers for a short settle time before draining).
    pub stopping: bool,
    /// True once shutdown began: finish in-flight work, close idle connections.
    pub draining: bool,
}

/// The layer above the runtime (the HTTP server) implements this once per worker, for the
/// sockets' backend `I` it runs on (this runtime's loop is epoll's; a test harness may drive
/// the same app over sockets in memory).
pub trait WorkerApp<I: Io = EpollIo>: 'static {
    /// What other threads send this worker through its inbox.
    type Message: Send + 'static;

    /// A connection arrived on `listener` (its index in `RuntimeConfig::listen`), not
    /// watched yet.
    fn on_accept(
        &mut self,
        cx: &mut Context<'_, Self::Message, I>,
        sock: I::Sock,
        peer: SocketAddr,
        listener: usize,
    );
    /// Readiness for a token `>= FIRST_CONN_TOKEN` that the app watches (`Io::watch`).
    fn on_ready(&mut self, cx: &mut Context<'_, Self::Message, I>, ready: Readiness);
    fn on_timer(&mut self, cx: &mut Context<'_, Self::Message, I>, key: TimerKey, at_ms: u64);
    fn on_message(&mut self, cx: &mut Context<'_, Self::Message, I>, msg: Self::Message);
    /// Shutdown began: close idle connections, mark busy ones to close when done.
    fn on_shutdown(&mut self, cx: &mut Context<'_, Self::Message, I>);
    /// Called once per loop turn before its events: the place to pick up, with one cheap check,
    /// what other threads published for this worker (a reload), so the turn's events see it.
    fn before_turn(&mut self, _cx: &mut Context<'_, Self::Message, I>) {}
    /// Sees the turn's events once before any is handled, so the app can act on what one
    /// event says before another event's handler runs (an idle pooled connection that became
    /// readable must be dropped before a client's request in the same turn takes it).
    fn before_events(&mut self, _cx: &mut Context<'_, Self::Message, I>, _ready: &[Readiness]) {}
    /// Called once per loop turn after events, timers and messages.
    fn after_turn(&mut self, _cx: &mut Context<'_, Self::Message, I>) {}
    /// True if the app has work it postponed for fairness: the loop then polls without
    /// sleeping and calls `after_turn` again.
    fn wants_another_turn(&self) -> bool {
        false
    }
    /// The earliest moment (µs on the worker's clock) the app needs a turn for a deadline of
    /// its own, finer than the timer wheel's 100 ms ticks (QUIC's ACK-delay, loss and pacing
    /// timers are milliseconds or less): the loop sleeps no longer than that, and the app
    /// handles what is due in [`WorkerApp::after_turn`].
    fn next_deadline_us(&self) -> Option<u64> {
        None
    }
    /// Open connections; draining ends when this reaches zero.
    fn connections(&self) -> usize;
    /// This worker's UDP sockets, one per `RuntimeConfig::datagram_listen` address in its
    /// order (none when it is empty): called once, after the app was made and before the
    /// loop's first turn. The app watches them itself ([`Io::watch_datagram`], with tokens
    /// `>= FIRST_CONN_TOKEN`) and hears of them through [`WorkerApp::on_ready`]. By default
    /// they are dropped (closed): an app that serves no UDP.
    fn adopt_datagrams(
        &mut self,
        _cx: &mut Context<'_, Self::Message, I>,
        _socks: Vec<I::Datagram>,
    ) {
    }
}

/// A worker's count of event-loop turns. Only its worker writes it (one relaxed store per
/// turn); its own cache line keeps a watchdog's reads off the worker's other data.
#[repr(align(128))]
#[derive(Default)]
struct Heartbeat(AtomicU64);

/// A started runtime: the bound address, each worker's inbox, and the way to stop it.
pub struct RuntimeHandle<M> {
    local_addrs: Vec<SocketAddr>,
    datagram_addrs: Vec<SocketAddr>,
    inboxes: Vec<InboxSender<M>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    heartbeats: Arc<[Heartbeat]>,
    /// Workers whose loop ended other than by a shutdown (see [`worker_lost`]).
    lost: Arc<AtomicUsize>,
}

impl<M: Send + 'static> RuntimeHandle<M> {
    /// The first listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addrs[0]
    }

    /// Every listener's bound address, in the order of `RuntimeConfig::listen`.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// Every UDP socket's bound address, in the order of `RuntimeConfig::datagram_listen`
    /// (each worker has a socket on each).
    pub fn datagram_addrs(&self) -> &[SocketAddr] {
        &self.datagram_addrs
    }

    pub fn inboxes(&self) -> &[InboxSender<M>] {
        &self.inboxes
    }

    /// A cloneable function that begins graceful shutdown (for signal threads).
    pub fn stopper(&self) -> impl Fn() + Send + Sync + Clone + 'static {
        let stop = self.stop.clone();
        let inboxes = self.inboxes.clone();
        move || {
            stop.store(true, Ordering::SeqCst);
            for inbox in &inboxes {
                inbox.nudge();
            }
        }
    }

    pub fn shutdown(&self) {
        (self.stopper())()
    }

    /// A watchdog's probe: each call returns true when every worker has finished a loop turn
    /// since the previous call (or since the probe was made), then wakes every worker, so
    /// that an idle one (asleep in `epoll_wait` with no timer armed, which may be forever)
    /// turns before the next call. False means a worker is stuck in a turn or its loop ended.
    /// Each call costs every worker one wake-up: call it every few hundred ms, not in a loop.
    pub fn liveness_probe(&self) -> impl FnMut() -> bool + Send + 'static {
        let heartbeats = self.heartbeats.clone();
        let inboxes = self.inboxes.clone();
        let nudge_all = move || inboxes.iter().for_each(InboxSender::nudge);
        let mut seen: Vec<u64> = heartbeats
            .iter()
            .map(|h| h.0.load(Ordering::Relaxed))
            .collect();
        nudge_all();
        move || {
            let mut all_turned = true;
            for (beat, seen) in heartbeats.iter().zip(&mut seen) {
                let now = beat.0.load(Ordering::Relaxed);
                all_turned &= now != *seen;
                *seen = now;
            }
            nudge_all();
            all_turned
        }
    }

    /// Waits until every worker has drained and exited; returns how many were lost instead
    /// (a panic no connection contained, or a failed event loop): the caller should then
    /// exit with an error (see [`worker_lost`]).
    pub fn join(self) -> usize {
        for t in self.threads {
            if t.join().is_err() {
                // Only a panic outside the worker's catch (its log line, or the catch's own
                // bookkeeping) gets here.
                tracing::error!("a worker thread panicked");
                self.lost.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.lost.load(Ordering::SeqCst)
    }
}

pub struct Runtime;

impl Runtime {
    /// Binds every worker's listener on the calling thread (so a bad address or a port in use
    /// is reported before anything starts), then starts the workers. `make_app` runs on each
    /// worker thread with the worker's index and its inbox sender.
    pub fn start<A, F>(config: RuntimeConfig, make_app: F) -> io::Result<RuntimeHandle<A::Message>>
    where
        A: WorkerApp,
        F: Fn(usize, InboxSender<A::Message>) -> A + Send + Sync + 'static,
    {
        Runtime::start_with(config, || Ok(()), make_app)
    }

    /// Like [`start`](Self::start); `after_bind` runs on the calling thread once every
    /// listener is bound and before any worker thread exists: the moment to drop privileges
    /// and enter a sandbox, which the workers then inherit. Its error stops the start.
    pub fn start_with<A, F, B>(
        config: RuntimeConfig,
        after_bind: B,
        make_app: F,
    ) -> io::Result<RuntimeHandle<A::Message>>
    where
        A: WorkerApp,
        F: Fn(usize, InboxSender<A::Message>) -> A + Send + Sync + 'static,
        B: FnOnce() -> io::Result<()>,
    {
        let prepared = (0..config.workers.max(1)).map(|_| ()).collect();
        Runtime::launch::<EpollIo, A, F, B, _>(config, after_bind, make_app, |_| {}, prepared)
    }

    /// Like [`start_with`](Self::start_with), on the backend `config.io` names: `make`
    /// makes each worker's app for whichever it is. io_uring's rings are made here, before
    /// `after_bind` closes the sandbox (which then refuses new rings); `after_bind` is told
    /// the backend in a few words, for the start-up line ("io_uring", or "epoll (io_uring:
    /// why not)").
    pub fn start_app<M, B>(
        config: RuntimeConfig,
        after_bind: B,
        make: M,
    ) -> io::Result<RuntimeHandle<M::Message>>
    where
        M: MakeApp,
        B: FnOnce(&str) -> io::Result<()>,
    {
        let workers = config.workers.max(1);
        let make = Arc::new(make);
        let counter = make.clone();
        let on_panic = move |id| counter.worker_panicked(id);
        let rings = match config.io {
            IoChoice::Epoll => Err(None),
            IoChoice::Uring | IoChoice::Auto => {
                UringIo::prepare(workers).map_err(|e| Some(format!("io_uring: {e}")))
            }
        };
        match rings {
            Ok(rings) => {
                let make_app = move |id, inbox| make.make::<UringIo>(id, inbox);
                let after_bind = || after_bind(UringIo::NAME);
                Runtime::launch::<UringIo, _, _, _, _>(
                    config, after_bind, make_app, on_panic, rings,
                )
            }
            Err(Some(why)) if config.io == IoChoice::Uring => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                BackendUnavailable(why),
            )),
            Err(why) => {
                let make_app = move |id, inbox| make.make::<EpollIo>(id, inbox);
                let prepared = (0..workers).map(|_| ()).collect();
                let named = match &why {
                    Some(why) => format!("{} ({why})", EpollIo::NAME),
                    None => EpollIo::NAME.to_string(),
                };
                let after_bind = || after_bind(&named);
                Runtime::launch::<EpollIo, _, _, _, _>(
                    config, after_bind, make_app, on_panic, prepared,
                )
            }
        }
    }

    /// Binds, runs `after_bind`, and starts one worker per prepared backend. `on_panic`
    /// runs on a worker's thread when a panic ended its loop (after its app was dropped).
    fn launch<Bk, A, F, B, P>(
        config: RuntimeConfig,
        after_bind: B,
        make_app: F,
        on_panic: P,
        prepared: Vec<Bk::Prepared>,
    ) -> io::Result<RuntimeHandle<A::Message>>
    where
        Bk: Backend,
        A: WorkerApp<Bk>,
        F: Fn(usize, InboxSender<A::Message>) -> A + Send + Sync + 'static,
        B: FnOnce() -> io::Result<()>,
        P: Fn(usize) + Send + Sync + 'static,
    {
        let workers = config.workers.max(1);
        debug_assert_eq!(prepared.len(), workers);
        if config.listen.is_empty() || config.listen.len() > MAX_LISTENERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("between 1 and {MAX_LISTENERS} listen addresses are needed"),
            ));
        }
        // Once per process, and only when the sysctl exists and is off and some listener is
        // tern's own (an inherited socket outlives the process: nothing to migrate).
        static HINT: std::sync::Once = std::sync::Once::new();
        let binds_own = (0..config.listen.len())
            .any(|i| config.inherited.get(i).and_then(Option::as_ref).is_none());
        HINT.call_once(|| {
            if let Some(hint) = migrate_req_hint().filter(|_| binds_own) {
                tracing::info!("{hint}");
            }
        });
        // Port 0 means "any": the first bind picks the port and the other workers join it.
        let mut local_addrs = Vec::with_capacity(config.listen.len());
        let mut per_worker: Vec<Vec<mio::net::TcpListener>> =
            (0..workers).map(|_| Vec::new()).collect();
        for (i, &addr) in config.listen.iter().enumerate() {
            if let Some(inherited) = config.inherited.get(i).and_then(Option::as_ref) {
                // A socket from the service manager: every worker gets a duplicate of it, so
                // all share one accept queue. Each connection then wakes every worker's epoll
                // and the losers' non-blocking accept gets EAGAIN, a cost the kernel's
                // per-listener balancing of our own SO_REUSEPORT sockets avoids. But binding
                // extra sockets beside it would need the privileges socket activation spares
                // us (a port below 1024), works only if the manager set SO_REUSEPORT on its
                // socket, and our extra sockets would reset their queued connections when
                // tern exits, where the manager's socket keeps them for the next tern.
                local_addrs.push(inherited.local_addr()?);
                for listeners in per_worker.iter_mut() {
                    listeners.push(share_inherited(inherited)?);
                }
                continue;
            }
            let first = bind_reuseport(addr, config.backlog)
                .map_err(|e| io::Error::new(e.kind(), format!("{addr}: {e}")))?;
            let bound = first.local_addr()?;
            local_addrs.push(bound);
            per_worker[0].push(first);
            for listeners in per_worker.iter_mut().skip(1) {
                listeners.push(bind_reuseport(bound, config.backlog)?);
            }
        }
        let mut datagram_addrs = Vec::with_capacity(config.datagram_listen.len());
        let mut datagrams_per_worker: Vec<Vec<std::net::UdpSocket>> =
            (0..workers).map(|_| Vec::new()).collect();
        let beside = config
            .datagram_beside
            .iter()
            .filter_map(|&i| local_addrs.get(i).copied());
        for addr in config.datagram_listen.iter().copied().chain(beside) {
            let bind = |addr| {
                bind_datagram_reuseport(addr)
                    .map_err(|e| io::Error::new(e.kind(), format!("{addr} (UDP): {e}")))
            };
            let first = bind(addr)?;
            let bound = first.local_addr()?;
            datagram_addrs.push(bound);
            datagrams_per_worker[0].push(first);
            for socks in datagrams_per_worker.iter_mut().skip(1) {
                socks.push(bind(bound)?);
            }
        }

        after_bind()?;

        let cpus = available_cpus();
        let stop = Arc::new(AtomicBool::new(false));
        let heartbeats: Arc<[Heartbeat]> = (0..workers).map(|_| Heartbeat::default()).collect();
        let make_app = Arc::new(make_app);
        let lost = Arc::new(AtomicUsize::new(0));
        let on_panic = Arc::new(on_panic);
        let all_inboxes = (0..workers)
            .map(|_| {
                let inbox = Inbox::new(Waker::new()?, config.inbox_capacity);
                Ok(InboxSender::new(Arc::new(inbox)))
            })
            .collect::<io::Result<Vec<InboxSender<A::Message>>>>()?;
        let mut threads = Vec::with_capacity(workers);
        let per_worker = per_worker.into_iter().zip(datagrams_per_worker);
        for ((id, (listeners, datagrams)), prepared) in per_worker.enumerate().zip(prepared) {
            let sender = all_inboxes[id].clone();
            let make_app = make_app.clone();
            let stop = stop.clone();
            let heartbeats = heartbeats.clone();
            let config = config.clone();
            let lost = lost.clone();
            let on_panic = on_panic.clone();
            let others = all_inboxes.clone();
            let cpu = config
                .pin
                .then(|| cpus.get(id % cpus.len().max(1)).copied())
                .flatten();
            let thread = std::thread::Builder::new()
                .name(format!("tern-worker-{id}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_to_cpu(cpu);
                    }
                    // Everything the closure owns (backend, listeners, timers, buffers, the
                    // app and its connections) is dropped by the unwinding and never used
                    // again, so no half-updated state of it can be seen: asserting unwind
                    // safety is sound. What it shares lives on: the stop flag and heartbeat
                    // (atomics), the inbox (a lock-free queue, whose messages for this
                    // worker's connections are dropped with it).
                    let ran = catch_unwind(AssertUnwindSafe(|| {
                        let mut io = Bk::start(prepared)
                            .map_err(|e| format!("its event loop failed to start: {e}"))?;
                        let datagrams = datagrams
                            .into_iter()
                            .map(|sock| io.adopt_datagram(sock))
                            .collect::<io::Result<Vec<_>>>()
                            .map_err(|e| format!("its UDP sockets failed to start: {e}"))?;
                        let app = make_app(id, sender.clone());
                        let mut worker = Worker::new(
                            id,
                            io,
                            listeners,
                            sender,
                            others.clone(),
                            stop.clone(),
                            &config,
                        );
                        worker
                            .run(app, datagrams, &heartbeats[id])
                            .map_err(|e| format!("its event loop failed: {e}"))
                    }));
                    let why = match ran {
                        Ok(Ok(())) => return,
                        Ok(Err(why)) => why,
                        Err(_) => {
                            on_panic(id);
                            "a panic no connection could contain (logged above)".to_string()
                        }
                    };
                    worker_lost(id, &why, &lost, &stop, &others);
                })?;
            threads.push(thread);
        }
        Ok(RuntimeHandle {
            local_addrs,
            datagram_addrs,
            inboxes: all_inboxes,
            stop,
            threads,
            heartbeats,
            lost,
        })
    }
}

/// Worker `id` is gone (a panic escaped its loop, or its loop failed). It is not started
/// again on its listeners: after the sandbox closed, a new io_uring ring cannot be made, and
/// the old one (with the rest of the worker's state) was given up half-way through whatever
/// panicked; messages other threads queued for its connections would reach a new worker's
/// connections under the same keys. Going on with fewer workers would leave its share of
/// the listeners' connections unserved (all of them with one worker) until a watchdog,
/// if any, noticed. So every worker is stopped as at a shutdown (the others finish what they
/// serve, within the grace period) and [`RuntimeHandle::join`] reports the loss: the process
/// then exits with an error, and its service manager starts it again (`Restart=on-failure`;
/// with socket activation the listening sockets, and connections queued on them, outlive
/// the restart).
#[cold]
fn worker_lost<M>(
    id: usize,
    why: &str,
    lost: &AtomicUsize,
    stop: &AtomicBool,
    inboxes: &[InboxSender<M>],
) {
    lost.fetch_add(1, Ordering::SeqCst);
    tracing::error!(
        worker = id,
        "worker lost: {why}; stopping the other workers (they finish what they serve), then \
         exiting with an error for the service manager to restart tern"
    );
    stop.store(true, Ordering::SeqCst);
    for inbox in inboxes {
        inbox.nudge();
    }
}

/// The start error when the backend asked for cannot be set up (`IoChoice::Uring` on a
/// kernel or policy that refuses io_uring): says what was refused.
#[derive(Debug)]
pub struct BackendUnavailable(pub String);

impl std::fmt::Display for BackendUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BackendUnavailable {}

/// Makes each worker's app for whichever backend the worker runs on (a closure cannot be
/// generic over it).
pub trait MakeApp: Send + Sync + 'static {
    type Message: Send + 'static;
    type App<B: Backend>: WorkerApp<B, Message = Self::Message>;

    /// Runs on worker `worker`'s own thread.
    fn make<B: Backend>(&self, worker: usize, inbox: InboxSender<Self::Message>) -> Self::App<B>;

    /// A panic no connection contained ended worker `worker`'s loop (its app is dropped, the
    /// panic hook has logged it): the moment to count it. Runs on that worker's thread.
    fn worker_panicked(&self, _worker: usize) {}
}

struct Worker<M, B: Backend> {
    id: usize,
    /// The sockets' backend: the app's sockets, and what the loop waits on.
    io: B,
    /// Closed (taken) when shutdown begins.
    listeners: Vec<mio::net::TcpListener>,
    inbox: Arc<Inbox<M>>,
    sender: InboxSender<M>,
    /// Every worker's inbox, by worker index.
    inboxes: Vec<InboxSender<M>>,
    stop: Arc<AtomicBool>,
    clock: Clock,
    timers: TimerWheel,
    buffers: BufPool,
    grace_ms: u64,
}

impl<M: Send + 'static, B: Backend> Worker<M, B> {
    fn new(
        id: usize,
        io: B,
        listeners: Vec<mio::net::TcpListener>,
        sender: InboxSender<M>,
        inboxes: Vec<InboxSender<M>>,
        stop: Arc<AtomicBool>,
        config: &RuntimeConfig,
    ) -> Worker<M, B> {
        Worker {
            id,
            io,
            listeners,
            inbox: sender.inbox().clone(),
            sender,
            inboxes,
            stop,
            clock: Clock::new(),
            // 100 ms ticks × 1024 slots ≈ 100 s horizon; timeouts are seconds, not millis.
            timers: TimerWheel::new(100, 1024),
            // Keep only a small reserve (32 × 32 KiB): a burst of thousands of requests must not leave thousands
            // of 16 KiB buffers parked (idle connections are budgeted at < 512 bytes each).
            buffers: BufPool::new(config.read_buf_size, config.write_buf_size, 32),
            grace_ms: config.shutdown_grace.as_millis() as u64,
        }
    }

    fn run<A: WorkerApp<B, Message = M>>(
        &mut self,
        mut app: A,
        datagrams: Vec<B::Datagram>,
        heartbeat: &Heartbeat,
    ) -> io::Result<()> {
        for (i, l) in self.listeners.iter_mut().enumerate() {
            self.io.watch_listener(l, FIRST_LISTENER_TOKEN + i)?;
        }
        self.io.watch_waker(self.inbox.waker(), WAKER)?;
        app.adopt_datagrams(
            &mut Context {
                io: &mut self.io,
                clock: &self.clock,
                timers: &mut self.timers,
                buffers: &mut self.buffers,
                inbox: &self.sender,
                inboxes: &self.inboxes,
                worker_id: self.id,
                stopping: false,
                draining: false,
            },
            datagrams,
        );
        let all_listeners: u64 = (1u64 << self.listeners.len()) - 1;
        // The turn's events as the app sees them (kept: no allocation per turn).
        let mut ready: Vec<Readiness> = Vec::with_capacity(1024);
        // Expired timers not yet handled (kept in order; the wheel appends newer ones).
        let mut fired = Vec::new();
        let mut timers_pending = false;
        let mut draining = false;
        let mut drain_deadline = u64::MAX;
        // Set once the stop flag is seen: the listener is closed, draining begins at this time.
        let mut settle_until: Option<u64> = None;
        // Bit i: listener i may have connections waiting.
        let mut accept_more: u64 = 0;
        let mut accept_paused_until: Option<u64> = None;
        let mut turns: u64 = 0;
        self.clock.update();

        loop {
            let now = self.clock.now_ms();
            let mut timeout = self.timers.poll_timeout_ms(now);
            if let Some(until) = accept_paused_until {
                timeout = Some(timeout.unwrap_or(u64::MAX).min(until.saturating_sub(now)));
            }
            if let Some(until) = settle_until {
                timeout = Some(timeout.unwrap_or(u64::MAX).min(until.saturating_sub(now)));
            }
            if draining {
                timeout = Some(
                    timeout
                        .unwrap_or(u64::MAX)
                        .min(drain_deadline.saturating_sub(now)),
                );
            }
            if accept_more != 0 || timers_pending || app.wants_another_turn() {
                timeout = Some(0);
            }
            let mut wait = timeout.map(Duration::from_millis);
            if let Some(at_us) = app.next_deadline_us() {
                let left = Duration::from_micros(at_us.saturating_sub(self.clock.now_us()));
                wait = Some(wait.map_or(left, |w| w.min(left)));
            }
            ready.clear();
            self.io.wait(wait, &mut ready)?;
            turns += 1;
            heartbeat.0.store(turns, Ordering::Relaxed);
            self.clock.update();

            let mut cx = Context {
                io: &mut self.io,
                clock: &self.clock,
                timers: &mut self.timers,
                buffers: &mut self.buffers,
                inbox: &self.sender,
                inboxes: &self.inboxes,
                worker_id: self.id,
                stopping: draining || settle_until.is_some(),
                draining,
            };
            app.before_turn(&mut cx);

            app.before_events(&mut cx, &ready);
            let mut listener_ready = accept_more;
            for r in &ready {
                match r.token {
                    t if t == WAKER => self.inbox.drain(|m| app.on_message(&mut cx, m)),
                    t if t < FIRST_CONN_TOKEN => {
                        listener_ready |= 1 << (t - FIRST_LISTENER_TOKEN);
                    }
                    _ => app.on_ready(&mut cx, *r),
                }
            }
            // A waker event may have been coalesced with an earlier turn; draining an empty
            // queue is one atomic load, so always look.
            if !self.inbox.is_empty() {
                self.inbox.drain(|m| app.on_message(&mut cx, m));
            }

            if let Some(until) = accept_paused_until {
                if cx.clock.now_ms() >= until {
                    accept_paused_until = None;
                    listener_ready = all_listeners; // backlogs may hold connections with no new edge
                }
            }
            accept_more = 0;
            if listener_ready != 0 && accept_paused_until.is_none() {
                for (i, listener) in self.listeners.iter().enumerate() {
                    if listener_ready & (1 << i) == 0 {
                        continue;
                    }
                    match accept_batch(listener, i, &mut app, &mut cx, ACCEPT_BUDGET) {
                        AcceptOutcome::Drained => {}
                        AcceptOutcome::BudgetSpent => accept_more |= 1 << i,
                        AcceptOutcome::OutOfFds => {
                            accept_paused_until = Some(cx.clock.now_ms() + ACCEPT_BACKOFF_MS);
                            break;
                        }
                    }
                }
            }

            // Expired timers are handled at most TIMERS_PER_TURN a turn: 5 000 slowloris
            // connections cut off in the same tick would otherwise hold the loop for tens of
            // milliseconds while clients with complete requests wait (stress/slowloris.py).
            cx.timers.expire(cx.clock.now_ms(), &mut fired);
            let due = fired.len().min(TIMERS_PER_TURN);
            for (key, at) in fired.drain(..due) {
                app.on_timer(&mut cx, key, at);
            }
            timers_pending = !fired.is_empty();
            // Summaries of rate-limited log lines whose window ended (a no-op when quiet).
            crate::ratelog::flush(cx.clock.now_ms());

            if !draining && settle_until.is_none() && self.stop.load(Ordering::SeqCst) {
                let now = cx.clock.now_ms();
                drain_deadline = now + self.grace_ms;
                // Closing our listener makes the kernel route new connections to any other
                // listener on the port (another tern during a restart). But Linux resets the
                // connections still waiting in a closed listener's accept queue (unless
                // net.ipv4.tcp_migrate_req=1 moves them to another listener), so first take
                // everything queued and serve it like any other connection.
                for (i, mut l) in std::mem::take(&mut self.listeners).into_iter().enumerate() {
                    cx.io.unwatch_listener(&mut l);
                    let _ = accept_batch(&l, i, &mut app, &mut cx, SHUTDOWN_ACCEPT_LIMIT);
                }
                accept_more = 0;
                accept_paused_until = None;
                // Nothing open: nothing to settle. Never settle past the grace period.
                let settle = if app.connections() == 0 {
                    0
                } else {
                    SHUTDOWN_SETTLE_MS.min(self.grace_ms)
                };
                settle_until = Some(now + settle);
                cx.stopping = true;
            }
            if settle_until.is_some_and(|until| cx.clock.now_ms() >= until) {
                settle_until = None;
                draining = true;
                cx.draining = true;
                app.on_shutdown(&mut cx);
            }
            app.after_turn(&mut cx);

            if draining && (app.connections() == 0 || cx.clock.now_ms() >= drain_deadline) {
                if app.connections() > 0 {
                    tracing::warn!(
                        worker = self.id,
                        open = app.connections(),
                        "shutdown grace expired; dropping connections"
                    );
                }
                // Closed connections' last bytes may still be on their way (a completion
                // backend's sends); they get what is left of the grace period.
                drop(app);
                let left = drain_deadline.saturating_sub(self.clock.now_ms());
                self.io.flush(Duration::from_millis(left));
                return Ok(());
            }
        }
    }
}

enum AcceptOutcome {
    Drained,
    BudgetSpent,
    OutOfFds,
}

fn accept_batch<B: Backend, A: WorkerApp<B>>(
    listener: &mio::net::TcpListener,
    index: usize,
    app: &mut A,
    cx: &mut Context<'_, A::Message, B>,
    budget: usize,
) -> AcceptOutcome {
    for _ in 0..budget {
        match listener.accept() {
            Ok((stream, peer)) => {
                let sock = cx.io.adopt(stream.into());
                app.on_accept(cx, sock, peer, index)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return AcceptOutcome::Drained,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // The peer gave up before we accepted; nothing to do.
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(e) if is_resource_exhaustion(&e) => {
                // Rate-limited: an fd flood must not become a disk flood.
                if crate::ratelog::admit("accept_out_of_fds", cx.clock.now_ms()) {
                    tracing::warn!(
                        worker = cx.worker_id,
                        "accept: {e}; pausing accepts for {ACCEPT_BACKOFF_MS} ms"
                    );
                }
                return AcceptOutcome::OutOfFds;
            }
            Err(e) => {
                tracing::warn!(worker = cx.worker_id, "accept failed: {e}");
                return AcceptOutcome::OutOfFds;
            }
        }
    }
    AcceptOutcome::BudgetSpent
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The CPUs this process may run on (respects taskset/cgroup affinity).
pub fn available_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most size_of::<cpu_set_t>()
    // bytes into it, and CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            let n = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            return (0..n).collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: as above; the set is fully initialised before sched_setaffinity reads it, and
    // pid 0 means the calling thread.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if !ok {
        tracing::warn!(cpu, "could not pin worker: {}", io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_lists_at_least_one_cpu_and_pinning_sticks() {
        let cpus = available_cpus();
        assert!(!cpus.is_empty());
        let target = *cpus.last().unwrap();
        std::thread::spawn(move || {
            pin_to_cpu(target);
            assert_eq!(available_cpus(), vec![target]);
        })
        .join()
        .unwrap();
    }
}

#[cfg(test)]
mod shutdown_tests {
    use super::*;
    use crate::io::Io;
    use std::collections::HashMap;
    use std::io::{Read, Write};

    /// Answers "ok" to the first bytes of each connection and closes it; on shutdown it closes
    /// connections that have sent nothing yet, as an HTTP server closes idle ones. A message
    /// keeps the worker busy for the given time (so connections queue in the backlog).
    #[derive(Default)]
    pub(super) struct Answerer {
        conns: HashMap<usize, crate::io::EpollSock>,
        next: usize,
    }

    impl WorkerApp for Answerer {
        type Message = Duration;

        fn on_accept(
            &mut self,
            cx: &mut Context<'_, Duration>,
            mut s: crate::io::EpollSock,
            _: SocketAddr,
            _: usize,
        ) {
            let token = FIRST_CONN_TOKEN + self.next;
            self.next += 1;
            cx.io.watch(&mut s, token).unwrap();
            self.conns.insert(token, s);
        }

        fn on_ready(&mut self, cx: &mut Context<'_, Duration>, ready: Readiness) {
            let token = ready.token;
            if let Some(s) = self.conns.get_mut(&token) {
                let mut buf = [0u8; 64];
                if matches!(cx.io.recv(s, &mut buf), Ok(n) if n > 0) {
                    let iov = [std::io::IoSlice::new(b"ok")];
                    let _ = cx.io.send(
                        s,
                        &crate::io::Transmit::Memory {
                            iov: &iov,
                            more: false,
                        },
                    );
                }
                self.conns.remove(&token);
            }
        }

        fn on_timer(&mut self, _: &mut Context<'_, Duration>, _: TimerKey, _: u64) {}

        fn on_message(&mut self, _: &mut Context<'_, Duration>, busy: Duration) {
            std::thread::sleep(busy);
        }

        fn on_shutdown(&mut self, _: &mut Context<'_, Duration>) {
            self.conns.clear();
        }

        fn connections(&self) -> usize {
            self.conns.len()
        }
    }

    /// Connections that are still in the listener's accept queue when shutdown begins are
    /// accepted and served, not reset by the kernel when the listener closes.
    #[test]
    fn connections_queued_at_shutdown_are_served() {
        let config = RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            workers: 1,
            shutdown_grace: Duration::from_secs(3),
            ..RuntimeConfig::default()
        };
        let handle = Runtime::start(config, |_, _| Answerer::default()).unwrap();
        let addr = handle.local_addr();
        // Keep the worker busy, then queue clients behind it and ask for shutdown; the worker
        // sees the stop request in the same turn that it wakes up in.
        handle.inboxes()[0]
            .send(Duration::from_millis(400))
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut clients: Vec<std::net::TcpStream> = (0..20)
            .map(|_| {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                c.write_all(b"hi").unwrap();
                c
            })
            .collect();
        handle.shutdown();
        for (i, c) in clients.iter_mut().enumerate() {
            let mut got = Vec::new();
            let r = c.read_to_end(&mut got);
            assert!(r.is_ok() && got == b"ok", "client {i}: {r:?}, got {got:?}");
        }
        handle.join();
    }
}

#[cfg(test)]
mod inherited_and_liveness_tests {
    use super::shutdown_tests::Answerer;
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn workers_serve_an_inherited_listener_instead_of_binding() {
        let inherited = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = inherited.local_addr().unwrap();
        let config = RuntimeConfig {
            // TEST-NET-1 is no local address: binding it would fail start-up.
            listen: vec![SocketAddr::from(([192, 0, 2, 1], 80))],
            workers: 2,
            inherited: vec![Some(Arc::new(inherited))],
            ..RuntimeConfig::default()
        };
        let handle = Runtime::start(config, |_, _| Answerer::default()).unwrap();
        assert_eq!(handle.local_addrs(), &[addr]);
        for i in 0..20 {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(b"hi").unwrap();
            let mut got = Vec::new();
            let r = c.read_to_end(&mut got);
            assert!(r.is_ok() && got == b"ok", "client {i}: {r:?}, got {got:?}");
        }
        handle.shutdown();
        handle.join();
    }

    #[test]
    fn liveness_probe_sees_idle_workers_turn_and_a_stuck_one_not() {
        let config = RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            workers: 2,
            ..RuntimeConfig::default()
        };
        let handle = Runtime::start(config, |_, _| Answerer::default()).unwrap();
        let mut probe = handle.liveness_probe();
        let pause = || std::thread::sleep(Duration::from_millis(100));
        // Idle workers have no timer armed and would sleep forever; the probe's wake-ups
        // make them turn.
        for _ in 0..3 {
            pause();
            assert!(probe());
        }
        // Worker 1 busy for 700 ms inside one turn.
        handle.inboxes()[1]
            .send(Duration::from_millis(700))
            .unwrap();
        pause();
        probe(); // may still count the turn that began the busy message
        pause();
        assert!(!probe(), "a worker stuck in a turn counts as alive");
        std::thread::sleep(Duration::from_millis(700));
        probe();
        pause();
        assert!(probe());
        handle.shutdown();
        handle.join();
    }
}

#[cfg(test)]
mod lost_worker_tests {
    use super::shutdown_tests::Answerer;
    use super::*;

    /// Answers as [`Answerer`]; panics on a message.
    #[derive(Default)]
    struct PanicsOnMessage(Answerer);

    impl WorkerApp for PanicsOnMessage {
        type Message = Duration;

        fn on_accept(
            &mut self,
            cx: &mut Context<'_, Duration>,
            s: crate::io::EpollSock,
            peer: SocketAddr,
            listener: usize,
        ) {
            self.0.on_accept(cx, s, peer, listener)
        }
        fn on_ready(&mut self, cx: &mut Context<'_, Duration>, ready: Readiness) {
            self.0.on_ready(cx, ready)
        }
        fn on_timer(&mut self, _: &mut Context<'_, Duration>, _: TimerKey, _: u64) {}
        fn on_message(&mut self, _: &mut Context<'_, Duration>, _: Duration) {
            panic!("test: a panic outside every connection");
        }
        fn on_shutdown(&mut self, cx: &mut Context<'_, Duration>) {
            self.0.on_shutdown(cx)
        }
        fn connections(&self) -> usize {
            self.0.connections()
        }
    }

    /// A worker lost to a panic stops the others (no stop was asked for) and `join` says
    /// one was lost; the counting hook ran on its thread.
    #[test]
    fn a_lost_worker_stops_every_worker_and_join_reports_it() {
        struct Counting(Arc<AtomicUsize>);
        impl MakeApp for Counting {
            type Message = Duration;
            type App<B: Backend> = PanicsOnMessageOn<B>;
            fn make<B: Backend>(&self, _: usize, _: InboxSender<Duration>) -> PanicsOnMessageOn<B> {
                PanicsOnMessageOn(std::marker::PhantomData)
            }
            fn worker_panicked(&self, worker: usize) {
                assert_eq!(worker, 1);
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let panicked = Arc::new(AtomicUsize::new(0));
        let config = RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            workers: 3,
            ..RuntimeConfig::default()
        };
        let handle = Runtime::start_app(config, |_| Ok(()), Counting(panicked.clone())).unwrap();
        handle.inboxes()[1].send(Duration::ZERO).unwrap();
        // No shutdown asked for: join returns because the loss stopped every worker.
        assert_eq!(join_within(handle), Ok(1));
        assert_eq!(panicked.load(Ordering::SeqCst), 1);
    }

    /// [`PanicsOnMessage`] on any backend (it only panics, so it needs no socket of its own).
    struct PanicsOnMessageOn<B>(std::marker::PhantomData<B>);

    impl<B: Backend> WorkerApp<B> for PanicsOnMessageOn<B> {
        type Message = Duration;

        fn on_accept(
            &mut self,
            _: &mut Context<'_, Duration, B>,
            _: B::Sock,
            _: SocketAddr,
            _: usize,
        ) {
        }
        fn on_ready(&mut self, _: &mut Context<'_, Duration, B>, _: Readiness) {}
        fn on_timer(&mut self, _: &mut Context<'_, Duration, B>, _: TimerKey, _: u64) {}
        fn on_message(&mut self, _: &mut Context<'_, Duration, B>, _: Duration) {
            panic!("test: a panic outside every connection");
        }
        fn on_shutdown(&mut self, _: &mut Context<'_, Duration, B>) {}
        fn connections(&self) -> usize {
            0
        }
    }

    /// Through `Runtime::start` (no counting hook) the loss is reported alike.
    #[test]
    fn a_lost_worker_is_reported_by_join_without_a_counting_hook() {
        let config = RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            workers: 2,
            ..RuntimeConfig::default()
        };
        let handle = Runtime::start(config, |_, _| PanicsOnMessage::default()).unwrap();
        handle.inboxes()[0].send(Duration::ZERO).unwrap();
        assert_eq!(join_within(handle), Ok(1));
    }

    /// `join`'s answer, if the workers all end within 10 s.
    fn join_within(
        handle: RuntimeHandle<Duration>,
    ) -> Result<usize, std::sync::mpsc::RecvTimeoutError> {
        let (joined, lost) = std::sync::mpsc::channel();
        std::thread::spawn(move || joined.send(handle.join()));
        lost.recv_timeout(Duration::from_secs(10))
    }
}

#[cfg(test)]
mod timer_tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// On a message, arms `n` timers that all expire at once; records how many fire per turn.
    struct Burst {
        fired_this_turn: usize,
        per_turn: Arc<Mutex<Vec<usize>>>,
        total: Arc<AtomicUsize>,
    }

    impl WorkerApp for Burst {
        type Message = u64;

        fn on_accept(
            &mut self,
            _: &mut Context<'_, u64>,
            _: crate::io::EpollSock,
            _: SocketAddr,
            _: usize,
        ) {
        }
        fn on_ready(&mut self, _: &mut Context<'_, u64>, _: Readiness) {}

        fn on_timer(&mut self, _: &mut Context<'_, u64>, _: TimerKey, _: u64) {
            self.fired_this_turn += 1;
            self.total.fetch_add(1, Ordering::SeqCst);
        }

        fn on_message(&mut self, cx: &mut Context<'_, u64>, n: u64) {
            let at = cx.clock.now_ms() + 1;
            for key in 0..n {
                cx.timers.schedule(key, at);
            }
        }

        fn after_turn(&mut self, _: &mut Context<'_, u64>) {
            if self.fired_this_turn > 0 {
                self.per_turn.lock().unwrap().push(self.fired_this_turn);
                self.fired_this_turn = 0;
            }
        }

        fn on_shutdown(&mut self, _: &mut Context<'_, u64>) {}

        fn connections(&self) -> usize {
            0
        }
    }

    #[test]
    fn a_burst_of_expiries_is_spread_over_turns_and_none_is_lost() {
        let per_turn = Arc::new(Mutex::new(Vec::new()));
        let total = Arc::new(AtomicUsize::new(0));
        let config = RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            workers: 1,
            ..RuntimeConfig::default()
        };
        let (p, t) = (per_turn.clone(), total.clone());
        let handle = Runtime::start(config, move |_, _| Burst {
            fired_this_turn: 0,
            per_turn: p.clone(),
            total: t.clone(),
        })
        .unwrap();
        handle.inboxes()[0].send(1000).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while total.load(Ordering::SeqCst) < 1000 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        handle.shutdown();
        handle.join();
        assert_eq!(total.load(Ordering::SeqCst), 1000);
        let turns = per_turn.lock().unwrap();
        assert!(turns.iter().all(|&n| n <= TIMERS_PER_TURN), "{turns:?}");
        assert!(turns.len() >= 1000 / TIMERS_PER_TURN, "{turns:?}");
    }
}

#[cfg(test)]
mod deadline_tests {
    use super::*;
    use std::sync::Mutex;

    /// On a message, asks for a turn `n` µs later through `next_deadline_us` (no timer, no
    /// event); records the clock each time a turn finds its deadline passed.
    struct Deadlines {
        due_us: Option<u64>,
        woke: Arc<Mutex<Vec<(u64, u64)>>>,
    }

    impl WorkerApp for Deadlines {
        type Message = u64;

        fn on_accept(
            &mut self,
            _: &mut Context<'_, u64>,
            _: crate::io::EpollSock,
            _: SocketAddr,
            _: usize,
        ) {
        }
        fn on_ready(&mut self, _: &mut Context<'_, u64>, _: Readiness) {}
        fn on_timer(&mut self, _: &mut Context<'_, u64>, _: TimerKey, _: u64) {}

        fn on_message(&mut self, cx: &mut Context<'_, u64>, n: u64) {
            self.due_us = Some(cx.clock.now_us() + n);
        }

        fn after_turn(&mut self, cx: &mut Context<'_, u64>) {
            let now = cx.clock.now_us();
            if let Some(due) = self.due_us.filter(|&due| due <= now) {
                self.woke.lock().unwrap().push((due, now));
                self.due_us = None;
            }
        }

        fn next_deadline_us(&self) -> Option<u64> {
            self.due_us
        }

        fn on_shutdown(&mut self, _: &mut Context<'_, u64>) {}

        fn connections(&self) -> usize {
            0
        }
    }

    /// A loop with nothing to do sleeps until the app's own deadline, not past it: with no
    /// timer armed it would otherwise sleep until the next event, which never comes here.
    #[test]
    fn a_sleeping_loop_wakes_for_the_app_s_deadline() {
        let woke = Arc::new(Mutex::new(Vec::new()));
        let config = RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            workers: 1,
            ..RuntimeConfig::default()
        };
        let w = woke.clone();
        let handle = Runtime::start(config, move |_, _| Deadlines {
            due_us: None,
            woke: w.clone(),
        })
        .unwrap();
        for round in 1..=3 {
            handle.inboxes()[0].send(3_000).unwrap();
            let give_up = std::time::Instant::now() + Duration::from_secs(10);
            while woke.lock().unwrap().len() < round && std::time::Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        handle.shutdown();
        handle.join();
        let woke = woke.lock().unwrap();
        assert_eq!(woke.len(), 3, "{woke:?}");
        assert!(woke.iter().all(|(due, at)| at >= due), "{woke:?}");
    }
}

#[cfg(test)]
mod datagram_tests {
    use super::*;
    use quinn_udp::{RecvMeta, Transmit};
    use std::io::IoSliceMut;
    use std::net::IpAddr;
    use std::sync::Mutex;

    /// Answers every datagram to its sender, from the address it was sent to, with the
    /// worker's id in front; notes each socket's address with its worker.
    struct Echo<B: Backend> {
        worker: u8,
        socks: Vec<B::Datagram>,
        /// Answers that found no room, sent again on the socket's writable report:
        /// (socket, to, from, bytes).
        unsent: Vec<(usize, SocketAddr, Option<IpAddr>, Vec<u8>)>,
        bound: Arc<Mutex<Vec<(u8, SocketAddr)>>>,
    }

    impl<B: Backend> Echo<B> {
        fn send(
            &mut self,
            io: &mut B,
            i: usize,
            to: SocketAddr,
            from: Option<IpAddr>,
            bytes: Vec<u8>,
        ) {
            let answer = Transmit {
                destination: to,
                ecn: None,
                contents: &bytes,
                segment_size: None,
                src_ip: from,
            };
            match io.send_datagram(&mut self.socks[i], &answer) {
                Ok(true) => {}
                Ok(false) => self.unsent.push((i, to, from, bytes)),
                Err(e) => panic!("send to {to}: {e}"),
            }
        }
    }

    impl<B: Backend> WorkerApp<B> for Echo<B> {
        type Message = ();

        fn adopt_datagrams(&mut self, cx: &mut Context<'_, (), B>, mut socks: Vec<B::Datagram>) {
            for (i, sock) in socks.iter_mut().enumerate() {
                cx.io.watch_datagram(sock, FIRST_CONN_TOKEN + i).unwrap();
                let local = cx.io.datagram_local_addr(sock);
                self.bound.lock().unwrap().push((self.worker, local));
            }
            self.socks = socks;
        }

        fn on_ready(&mut self, cx: &mut Context<'_, (), B>, ready: Readiness) {
            let i = ready.token - FIRST_CONN_TOKEN;
            if ready.writable {
                for (i, to, from, bytes) in std::mem::take(&mut self.unsent) {
                    self.send(cx.io, i, to, from, bytes);
                }
            }
            if !ready.readable {
                return;
            }
            let mut storage = vec![vec![0u8; 64 * 1024]; 4];
            let mut meta = [RecvMeta::default(); 4];
            loop {
                let mut bufs: Vec<IoSliceMut<'_>> =
                    storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                let n = match cx
                    .io
                    .recv_datagrams(&mut self.socks[i], &mut bufs, &mut meta)
                {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) => panic!("receive: {e}"),
                };
                for (m, buf) in meta.iter().zip(&storage).take(n) {
                    for datagram in buf[..m.len].chunks(m.stride) {
                        let answer = [&[self.worker][..], datagram].concat();
                        self.send(cx.io, i, m.addr, m.dst_ip, answer);
                    }
                }
            }
        }

        fn on_accept(&mut self, _: &mut Context<'_, (), B>, _: B::Sock, _: SocketAddr, _: usize) {}
        fn on_timer(&mut self, _: &mut Context<'_, (), B>, _: TimerKey, _: u64) {}
        fn on_message(&mut self, _: &mut Context<'_, (), B>, _: ()) {}
        fn on_shutdown(&mut self, _: &mut Context<'_, (), B>) {}
        fn connections(&self) -> usize {
            0
        }
    }

    struct MakeEcho(Arc<Mutex<Vec<(u8, SocketAddr)>>>);

    impl MakeApp for MakeEcho {
        type Message = ();
        type App<B: Backend> = Echo<B>;
        fn make<B: Backend>(&self, worker: usize, _: InboxSender<()>) -> Echo<B> {
            Echo {
                worker: worker as u8,
                socks: Vec::new(),
                unsent: Vec::new(),
                bound: self.0.clone(),
            }
        }
    }

    fn config(io: IoChoice, datagram_listen: SocketAddr) -> RuntimeConfig {
        RuntimeConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            workers: 2,
            datagram_listen: vec![datagram_listen],
            io,
            ..RuntimeConfig::default()
        }
    }

    /// Two workers with a UDP socket each on one port (picked by the first bind): clients
    /// from many ports get their datagrams echoed, by both workers (the kernel spreads the
    /// clients over the port's sockets), from the address they sent to.
    fn echoes_on_both_workers(io: IoChoice) {
        let bound = Arc::new(Mutex::new(Vec::new()));
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let handle =
            Runtime::start_app(config(io, any_port), |_| Ok(()), MakeEcho(bound.clone())).unwrap();
        let addr = handle.datagram_addrs()[0];
        assert_ne!(addr.port(), 0);
        let mut answered_by = [0usize; 2];
        for i in 0..32u32 {
            let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            client
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let ping = i.to_be_bytes();
            let mut buf = [0u8; 16];
            // Loopback loses nothing in practice; a lost datagram is sent again all the same.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let (n, from) = loop {
                assert!(
                    std::time::Instant::now() < deadline,
                    "client {i}: no answer"
                );
                client.send_to(&ping, addr).unwrap();
                if let Ok(got) = client.recv_from(&mut buf) {
                    break got;
                }
            };
            assert_eq!((&buf[1..n], from), (&ping[..], addr), "client {i}");
            answered_by[buf[0] as usize] += 1;
        }
        assert!(answered_by.iter().all(|&n| n > 0), "{answered_by:?}");
        let mut bound = bound.lock().unwrap().clone();
        bound.sort();
        assert_eq!(bound, [(0, addr), (1, addr)]);
        handle.shutdown();
        assert_eq!(handle.join(), 0);
    }

    #[test]
    fn datagrams_are_echoed_by_both_workers_on_epoll() {
        echoes_on_both_workers(IoChoice::Epoll);
    }

    #[test]
    fn datagrams_are_echoed_by_both_workers_on_io_uring() {
        echoes_on_both_workers(IoChoice::Uring);
    }

    #[test]
    fn a_udp_port_in_use_fails_the_start_naming_it() {
        let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let bound = Arc::new(Mutex::new(Vec::new()));
        let started =
            Runtime::start_app(config(IoChoice::Epoll, addr), |_| Ok(()), MakeEcho(bound));
        let e = started.err().expect("the port is taken");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        assert!(e.to_string().starts_with(&format!("{addr} (UDP): ")), "{e}");
    }
}
