//! tern-server: connections, routing, handlers and the relay to upstream servers, on top of
//! tern-runtime (workers, sockets) and the sans-IO protocols (tern-codec, tern-http2,
//! tern-tls, tern-fastcgi, tern-compress).
//!
//! A [`Server`] is a [`Router`] plus settings; [`Server::start`] binds the port and runs one
//! [`worker::HttpWorker`] per runtime worker thread. Handlers return a [`Response`] now or a
//! [`Pending`] reply completed later from any thread.

mod access_log;
mod answer_tee;
pub mod bans;
mod compression;
mod config;
mod conn;
mod driver;
mod exchange;
mod fault;
mod guard;
mod handler;
mod head_memo;
mod identity;
// The in-memory harness is for tests and fuzz targets only: never in a release build.
#[cfg(any(test, feature = "testing"))]
mod memory_worker;
pub mod negotiate;
mod quic;
mod request_id;
mod response;
mod router;
mod slab;
pub mod static_files;
mod stats;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod upstream;
mod worker;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

pub use access_log::{AccessLog, AccessLogFormat, ClientIp};
pub use answer_tee::{AnswerTee, Fallback, Hold, HoldStep};
pub use bans::{BanConfig, BanNotice, Bans};
pub use config::{ListenerKind, RedirectHttp, ServerConfig};
pub use guard::{Guard, Guarded, Verdict};
pub use handler::{
    complete_all, ExchangeId, Handback, Handler, HandlerContext, Handoff, HoldWaker, LogTarget,
    Pending, Reenter, Refusal, Reply, Request, Rerun, TurnEnd, WorkerMessage,
};
pub use identity::Identity;
pub use request_id::{RequestId, MAX_REQUEST_ID};
pub use response::{Body, CacheOutcome, FileBody, Response};
pub use router::Router;
pub use stats::{
    AnswerFigures, AnswerRow, Counter, Stats, StatsSnapshot, UpstreamCounter, UpstreamFigures,
    UpstreamRow, WorkerStats, ANSWER_CHUNK, DURATION_BOUNDS, DURATION_BUCKETS, MAX_ANSWER_ROWS,
    MAX_SITES, MAX_UPSTREAMS, OTHER, STATUS_CLASSES, UPSTREAM_CHUNK,
};
pub use tern_codec::{
    canonical_path, canonical_path_opaque_slash, connection_lists, decoded_path, has_encoded_slash,
    is_token, parse_request, path_under, trim_ows, BodyKind, Limits, Method, Parsed, PathError,
    RequestError, RequestHead, Version,
};
pub use tern_runtime::{RuntimeConfig, SignalAction};
pub use tern_tls::{CertFiles, TlsAcceptor, TlsOptions};
pub use upstream::{
    Forward, RetryPolicy, UpstreamAddr, UpstreamOutcome, UpstreamTimeouts, UpstreamTls,
    UpstreamWire, Upstreams,
};

/// A router plus its settings, ready to start.
pub struct Server {
    config: ServerConfig,
    router: Router,
    stats: Stats,
    background: Vec<(String, BackgroundTask)>,
    tls: Option<Arc<TlsAcceptor>>,
    after_bind: Option<AfterBind>,
    bans: Option<Arc<Bans>>,
    access_logs: Vec<AccessLog>,
    turn_ends: Vec<Arc<dyn TurnEnd>>,
}

type AfterBind = Box<dyn FnOnce(&str) -> io::Result<()>>;
type BackgroundTask = Box<dyn FnOnce(StopSignal) + Send + 'static>;

/// Tells a background thread that the server is stopping. It is raised only after every worker
/// has drained, so a background thread that completes pending replies (a database writer) keeps
/// serving them until no request can still be waiting.
#[derive(Clone, Default)]
pub struct StopSignal(Arc<std::sync::atomic::AtomicBool>);

impl StopSignal {
    pub fn is_stopped(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Raises the signal. The server does this itself once its workers have drained; tests
    /// of a background thread's loop raise it by hand.
    pub fn raise(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release)
    }
}

impl Server {
    pub fn new(config: ServerConfig, router: Router) -> Server {
        let stats = Stats::new(config.runtime.workers.max(1));
        Server {
            config,
            router,
            stats,
            background: Vec::new(),
            tls: None,
            after_bind: None,
            bans: None,
            access_logs: Vec::new(),
            turn_ends: Vec::new(),
        }
    }

    /// Runs `f` on the starting thread once the listeners are bound and before any thread
    /// of the server exists (workers, background threads): where privileges are dropped and
    /// the sandbox entered, so that every thread inherits them. Its error stops the start.
    /// It is told the sockets' backend the workers will run on, in a few words.
    pub fn after_bind(mut self, f: impl FnOnce(&str) -> io::Result<()> + 'static) -> Server {
        self.after_bind = Some(Box::new(f));
        self
    }

    /// Certificates and session settings for the `Https` listeners.
    pub fn with_tls(mut self, tls: Arc<TlsAcceptor>) -> Server {
        self.tls = Some(tls);
        self
    }

    /// Peers to close at accept, and where strikes and dropped connections add bans.
    pub fn with_bans(mut self, bans: Arc<Bans>) -> Server {
        self.bans = Some(bans);
        self
    }

    /// Logs every answer to this file, from a writer thread of the server's own (see
    /// `access_log/`).
    pub fn with_access_log(self, log: AccessLog) -> Server {
        self.with_access_logs(vec![log])
    }

    /// Several access logs (a site's own, `tern run`): a handler chooses one per request
    /// with `HandlerContext::log_to` (by its index here); without a choice a line goes to the
    /// first. Each file has its own writer thread.
    pub fn with_access_logs(mut self, logs: Vec<AccessLog>) -> Server {
        self.access_logs = logs;
        self
    }

    /// The routes, for adding handlers that need something only the server has (its stats).
    pub fn router_mut(&mut self) -> &mut Router {
        &mut self.router
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The server's per-worker counters, available before start so handlers (a /metrics page)
    /// can hold a clone.
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// Adds a background thread owned by the server: started after the listeners are bound,
    /// stopped (via its [`StopSignal`]) and joined after the workers have drained. The thread
    /// should poll `is_stopped()` at least every few hundred milliseconds.
    pub fn background(
        &mut self,
        name: &str,
        run: impl FnOnce(StopSignal) + Send + 'static,
    ) -> &mut Server {
        self.background.push((name.to_string(), Box::new(run)));
        self
    }

    /// Runs `hook` at the end of every event-loop turn of every worker (see [`TurnEnd`]).
    pub fn on_turn_end(&mut self, hook: Arc<dyn TurnEnd>) -> &mut Server {
        self.turn_ends.push(hook);
        self
    }

    /// Binds the listen address on every worker and starts serving. Errors (address in use,
    /// permission) come back here, before any thread has started.
    pub fn start(self) -> io::Result<ServerHandle> {
        fault::arm_from_env();
        let stats = self.stats;
        let kinds = &self.config.listener_kinds;
        if kinds.contains(&ListenerKind::Https) && self.tls.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an HTTPS listener needs a certificate",
            ));
        }
        let hsts_line = self
            .config
            .hsts_max_age
            .map(|secs| format!("Strict-Transport-Security: max-age={secs}\r\n").into_bytes());
        let mut runtime_config = self.config.runtime.clone();
        let workers = self.config.runtime.workers.max(1);
        let quic = match (&self.tls, self.config.http3) {
            (Some(tls), true) => {
                let config = quic::server_config(tls.quic_config(), &self.config)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                runtime_config.datagram_beside = (0..runtime_config.listen.len())
                    .filter(|&i| kinds.get(i) == Some(&ListenerKind::Https))
                    .collect();
                // The process's CID and stateless-reset keys, the same for every worker.
                let mut shared = quic::QuicShared::new(config, workers);
                if self.config.quic_retry_always {
                    shared.retry_above = 0;
                }
                Some(Arc::new(shared))
            }
            _ => None,
        };
        let access_logs: Vec<_> = self
            .access_logs
            .into_iter()
            .map(|log| {
                let shared = Arc::new(access_log::LogShared::new(&log, workers, stats.clone()));
                (shared, log)
            })
            .collect();
        let shared = Arc::new(worker::Shared {
            router: self.router,
            config: self.config.clone(),
            stats: stats.clone(),
            live: arc_swap::ArcSwap::from_pointee(self.config.clone()),
            reloads: std::sync::atomic::AtomicU64::new(0),
            tls: self.tls,
            secure_lines: std::sync::OnceLock::new(),
            quic,
            https_port: std::sync::atomic::AtomicU16::new(0),
            listener_ports: (self.config.runtime.listen.iter())
                .map(|addr| std::sync::atomic::AtomicU16::new(addr.port()))
                .collect(),
            bans: self.bans,
            access_logs: access_logs
                .iter()
                .map(|(shared, _)| shared.clone())
                .collect(),
            turn_ends: self.turn_ends,
            reload_hooks: vec![static_files::forget_thread_caches],
        });
        let for_workers = shared.clone();
        let after_bind = self.after_bind.unwrap_or_else(|| Box::new(|_| Ok(())));
        let runtime = tern_runtime::Runtime::start_app(
            runtime_config,
            after_bind,
            worker::MakeHttpWorker(for_workers),
        )?;
        // Alt-Svc names the UDP ports HTTP/3 is bound on: known only now.
        let mut secure_lines = hsts_line.unwrap_or_default();
        if let Some(line) = alt_svc_line(runtime.datagram_addrs()) {
            secure_lines.extend_from_slice(&line);
        }
        let _ = shared.secure_lines.set(secure_lines);
        for (port, addr) in shared.listener_ports.iter().zip(runtime.local_addrs()) {
            port.store(addr.port(), std::sync::atomic::Ordering::Relaxed);
        }
        let https = (0..runtime.local_addrs().len())
            .find(|&i| self.config.listener_kinds.get(i) == Some(&ListenerKind::Https));
        if let Some(i) = https {
            let port = runtime.local_addrs()[i].port();
            shared
                .https_port
                .store(port, std::sync::atomic::Ordering::Relaxed);
        }
        let stop = StopSignal::default();
        let mut background = Vec::new();
        for (i, (log, opened)) in access_logs.into_iter().enumerate() {
            let inboxes = runtime.inboxes().to_vec();
            let signal = stop.clone();
            let name = match i {
                0 => "tern-access-log".to_string(),
                i => format!("tern-access-log-{i}"),
            };
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    access_log::run_writer(log, opened.into_file(), inboxes, move || {
                        signal.is_stopped()
                    })
                })?;
            background.push((name, thread));
        }
        for (name, run) in self.background {
            let signal = stop.clone();
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || run(signal))?;
            background.push((name, thread));
        }
        Ok(ServerHandle {
            runtime,
            stats,
            stop,
            background,
            shared,
        })
    }
}

/// `Alt-Svc: h3=":8443"; ma=86400` for the UDP ports HTTP/3 is bound on (RFC 7838, RFC 9114
/// §3.1.1): a day, as h2o and Caddy say. `None` without HTTP/3.
fn alt_svc_line(udp: &[SocketAddr]) -> Option<Vec<u8>> {
    let mut ports: Vec<u16> = udp.iter().map(|a| a.port()).collect();
    ports.sort_unstable();
    ports.dedup();
    if ports.is_empty() {
        return None;
    }
    let alternatives: Vec<String> = ports
        .iter()
        .map(|p| format!("h3=\":{p}\"; ma=86400"))
        .collect();
    Some(format!("Alt-Svc: {}\r\n", alternatives.join(", ")).into_bytes())
}

/// How many workers a server lost (see [`ServerHandle::join_checked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkersLost(pub usize);

impl std::fmt::Display for WorkersLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            1 => write!(f, "a worker was lost (see the log above)"),
            n => write!(f, "{n} workers were lost (see the log above)"),
        }
    }
}

impl std::error::Error for WorkersLost {}

/// A running server.
pub struct ServerHandle {
    runtime: tern_runtime::RuntimeHandle<WorkerMessage>,
    stats: Stats,
    stop: StopSignal,
    background: Vec<(String, std::thread::JoinHandle<()>)>,
    shared: Arc<worker::Shared>,
}

impl ServerHandle {
    /// The first listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.runtime.local_addr()
    }

    /// Every listener's bound address, in the order of `RuntimeConfig::listen`.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        self.runtime.local_addrs()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// A function that begins graceful shutdown; safe to call from any thread, repeatedly.
    pub fn stopper(&self) -> impl Fn() + Send + Sync + Clone + 'static {
        self.runtime.stopper()
    }

    pub fn shutdown(&self) {
        self.runtime.shutdown();
    }

    /// A watchdog's probe: true when every worker's event loop turned since the previous call
    /// (see `RuntimeHandle::liveness_probe`).
    pub fn liveness_probe(&self) -> impl FnMut() -> bool + Send + 'static {
        self.runtime.liveness_probe()
    }

    /// A function that makes the access log's writer reopen its file (`SIGUSR1`, after
    /// logrotate moved it away); does nothing without an access log. Safe to call from any
    /// thread, repeatedly.
    pub fn log_reopener(&self) -> impl Fn() -> bool + Send + Sync + Clone + 'static {
        let logs = self.shared.access_logs.clone();
        move || {
            for log in &logs {
                log.request_reopen();
            }
            !logs.is_empty()
        }
    }

    /// A function that applies a reload (`SIGHUP`); safe to call from any thread, repeatedly.
    /// Of the config it takes what can change while running: the header, body, idle and write
    /// timeouts, the request limits (`max_body`, ...) and the connections per worker.
    /// `config.runtime` is ignored: listen address, workers, pinning and shutdown grace need a
    /// restart. Every worker also drops its static-file front caches.
    ///
    /// Each worker picks the reload up at the start of its next loop turn (it is woken for
    /// it), by comparing a counter once per turn; requests never look at shared state.
    /// Connections keep the deadlines and body limits already armed for their current request.
    pub fn reloader(&self) -> impl Fn(&ServerConfig) + Send + Sync + Clone + 'static {
        let shared = self.shared.clone();
        let inboxes = self.runtime.inboxes().to_vec();
        move |config| {
            let mut live = config.clone();
            live.runtime = shared.config.runtime.clone();
            live.max_connections_per_worker = live.max_connections_per_worker.max(1);
            shared.live.store(Arc::new(live));
            shared
                .reloads
                .fetch_add(1, std::sync::atomic::Ordering::Release);
            for inbox in &inboxes {
                inbox.nudge();
            }
        }
    }

    /// Blocks until every worker has drained and exited, then stops and joins the background
    /// threads (in the order they were added; the access log's writer first, which writes
    /// out every line the workers handed over as they exited).
    pub fn join(self) {
        let _ = self.join_checked();
    }

    /// [`join`](Self::join), with an error if a worker was lost (a panic no connection
    /// contained, or a failed event loop) rather than stopped: the process should then exit
    /// with an error so that its service manager starts it again.
    pub fn join_checked(self) -> Result<(), WorkersLost> {
        let lost = self.runtime.join();
        self.stop.raise();
        for (name, thread) in self.background {
            if thread.join().is_err() {
                tracing::error!(thread = %name, "background thread panicked");
            }
        }
        match lost {
            0 => Ok(()),
            n => Err(WorkersLost(n)),
        }
    }
}
