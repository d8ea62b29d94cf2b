//! What every server command shares: the common flags and the start/wait loop.
//!
//! The flags are `Option`s so that a command with a config file can tell "not given" from a
//! default; [`CommonArgs::server_config`] applies the defaults for commands without one.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use clap::{Args, ValueEnum};
use ipnet::IpNet;
use serde::Deserialize;
use tern_runtime::{IoChoice, SignalPipe, SignalThreadWaker};
use tern_server::{
    AccessLog, AccessLogFormat, BanConfig, Server, ServerConfig, SignalAction, TlsAcceptor,
};

use crate::hardening::Needs;

use crate::service;
use crate::tls::{describe_listeners, TlsPlan};

/// Settings every server command shares.
#[derive(Args, Debug, Clone, Default)]
pub struct CommonArgs {
    /// Address and port to listen on (port 0 picks a free port) [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// Worker threads, one event loop each [default: the CPUs this process may use].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Pin each worker to its own CPU.
    #[arg(long)]
    pub pin: bool,
    /// The sockets' backend: `epoll`; `uring` (io_uring, one ring per worker; start-up
    /// fails if the kernel or its policy refuses it); `auto` (io_uring where it can be set
    /// up, else epoll) [default: epoll]. Start-up names the one in use.
    #[arg(long, env = "TERN_IO", value_enum, value_name = "epoll|uring|auto")]
    pub io: Option<IoArg>,
    /// Seconds a client may take to send a request head, from its first byte [default: 10].
    #[arg(long, value_name = "SECS")]
    pub header_timeout: Option<u64>,
    /// Seconds between progress while reading a request body [default: 10].
    #[arg(long, value_name = "SECS")]
    pub body_timeout: Option<u64>,
    /// Seconds an idle keep-alive connection stays open [default: 60].
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<u64>,
    /// Seconds a client may go without reading any of our output [default: 30].
    #[arg(long, value_name = "SECS")]
    pub write_timeout: Option<u64>,
    /// Largest request body in bytes (larger is answered 413) [default: 1048576].
    #[arg(long, value_name = "BYTES")]
    pub max_body: Option<u64>,
    /// Open connections per worker; above it new connections are closed at once
    /// [default: 16384].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT [default: 5].
    #[arg(long, value_name = "SECS")]
    pub shutdown_grace: Option<u64>,
    #[command(flatten)]
    pub hardening: crate::hardening::HardeningArgs,
    /// Ban abusive peers: after --ban-after slow request heads within --ban-window, or when a
    /// handler drops a connection far over a rate limit, close the peer's connections at
    /// accept for --ban-seconds. At most 4096 bans are held (384 KiB with the strike table)
    /// [default: on].
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"], help_heading = "Bans")]
    pub ban: Option<String>,
    /// Header timeouts (slow request heads or TLS handshakes) that ban a peer; 0: only
    /// dropped connections ban [default: 3].
    #[arg(long, value_name = "N", help_heading = "Bans")]
    pub ban_after: Option<u32>,
    /// Seconds within which --ban-after timeouts must fall [default: 60].
    #[arg(long, value_name = "SECS", help_heading = "Bans")]
    pub ban_window: Option<u64>,
    /// Seconds a ban lasts [default: 600].
    #[arg(long, value_name = "SECS", help_heading = "Bans")]
    pub ban_seconds: Option<u64>,
    /// What an IPv4 ban covers: the address (32) or its /24; IPv6 bans cover the /64
    /// [default: 32].
    #[arg(long, value_name = "32|24", value_parser = clap::builder::TypedValueParser::map(
        clap::builder::PossibleValuesParser::new(["32", "24"]),
        |s| s.parse::<u8>().expect("32 or 24"),
    ), help_heading = "Bans")]
    pub ban_ipv4_prefix: Option<u8>,
    /// Addresses and networks never banned; replaces the default, "" exempts nothing
    /// [default: 127.0.0.1,::1].
    #[arg(long, value_name = "CIDRS", help_heading = "Bans")]
    pub ban_exempt: Option<String>,
    /// Also add bans to this nftables set, so the kernel drops those peers (needs
    /// CAP_NET_ADMIN at start-up; the set needs `flags timeout`, and `interval` for /24 and
    /// IPv6 bans). Once per address family: a `type ipv4_addr` and a `type ipv6_addr` set.
    #[arg(long, value_name = "FAMILY/TABLE/SET", help_heading = "Bans")]
    pub ban_nft_set: Vec<String>,
    /// Append a line for every answer to this file (created with mode 0640; with --user it
    /// is given to the user). SIGUSR1 reopens it, after logrotate moved it away; its folder
    /// stays writable for that [default: no access log].
    #[arg(long, value_name = "FILE", help_heading = "Access log")]
    pub access_log: Option<PathBuf>,
    /// `combined`: nginx's, then "host", the duration in µs and the upstream time; `json`:
    /// one object a line [default: combined].
    #[arg(long, value_enum, value_name = "FORMAT", help_heading = "Access log")]
    pub access_log_format: Option<LogFormatArg>,
    /// Test hook (tern's HTTP/3 tests, `cli/tests/http3_netns.rs`): send every new QUIC
    /// client a Retry before its handshake, as tern does only above 256 handshakes in
    /// progress on a worker.
    #[arg(long, hide = true)]
    pub test_quic_retry: bool,
}

/// `--io` (and `io` in a config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoArg {
    #[default]
    Epoll,
    Uring,
    Auto,
}

impl From<IoArg> for IoChoice {
    fn from(io: IoArg) -> IoChoice {
        match io {
            IoArg::Epoll => IoChoice::Epoll,
            IoArg::Uring => IoChoice::Uring,
            IoArg::Auto => IoChoice::Auto,
        }
    }
}

/// `--access-log-format` (and `access_log_format` in a config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormatArg {
    #[default]
    Combined,
    Json,
}

impl From<LogFormatArg> for AccessLogFormat {
    fn from(f: LogFormatArg) -> AccessLogFormat {
        match f {
            LogFormatArg::Combined => AccessLogFormat::Combined,
            LogFormatArg::Json => AccessLogFormat::Json,
        }
    }
}

/// Opens the access log now, while tern may still create it (as root with --user), and
/// adds what it needs once running ([`Needs::access_log`]).
pub fn open_access_log(
    path: &Path,
    format: LogFormatArg,
    needs: &mut Needs,
) -> Result<AccessLog, String> {
    let log = AccessLog::open(path, format.into())
        .map_err(|e| format!("cannot open the access log {}: {e}", path.display()))?;
    // The file itself, not a link to it: that is what logrotate renames and --user gets.
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    needs.access_log(&real);
    Ok(log)
}

impl CommonArgs {
    /// The server config these flags ask for, defaults filling what is not given (for
    /// commands without a config file; `tern serve` resolves through `config.rs`).
    pub fn server_config(&self) -> ServerConfig {
        let mut config = ServerConfig::default();
        if let Some(listen) = self.listen {
            config.runtime.listen = vec![listen];
        }
        if let Some(n) = self.workers {
            config.runtime.workers = n.max(1);
        }
        config.runtime.pin = self.pin;
        config.runtime.io = self.io.unwrap_or_default().into();
        let secs = |flag: Option<u64>, default: Duration| flag.map_or(default, Duration::from_secs);
        config.runtime.shutdown_grace = secs(self.shutdown_grace, config.runtime.shutdown_grace);
        config.header_timeout = secs(self.header_timeout, config.header_timeout);
        config.body_timeout = secs(self.body_timeout, config.body_timeout);
        config.idle_timeout = secs(self.idle_timeout, config.idle_timeout);
        config.write_timeout = secs(self.write_timeout, config.write_timeout);
        if let Some(n) = self.max_body {
            config.limits.max_body = n;
        }
        if let Some(n) = self.max_connections {
            config.max_connections_per_worker = n.max(1);
        }
        config.quic_retry_always = self.test_quic_retry;
        config
    }
}

impl CommonArgs {
    /// The ban settings these flags ask for; None with `--ban off`. `also_exempt` joins the
    /// exemptions (a command's trusted proxies: banning one would lock out everyone behind it).
    pub fn ban_config(&self, also_exempt: &[IpNet]) -> Result<Option<BanConfig>, String> {
        if self.ban.as_deref() == Some("off") {
            return Ok(None);
        }
        let mut c = BanConfig::default();
        if let Some(n) = self.ban_after {
            c.after_strikes = n;
        }
        if let Some(s) = self.ban_window {
            c.strike_window = Duration::from_secs(s.max(1));
        }
        if let Some(s) = self.ban_seconds {
            c.duration = Duration::from_secs(s.max(1));
        }
        if let Some(p) = self.ban_ipv4_prefix {
            if p != 24 && p != 32 {
                return Err(format!("--ban-ipv4-prefix {p}: want 32 or 24"));
            }
            c.ipv4_prefix = p;
        }
        if let Some(list) = &self.ban_exempt {
            c.exempt = tern_services::TrustedProxies::parse(list)
                .map_err(|e| format!("--ban-exempt: {e}"))?
                .into_nets();
        }
        c.exempt.extend_from_slice(also_exempt);
        Ok(Some(c))
    }

    /// Gives the server its ban set (unless `--ban off`), with the nftables feeder if asked.
    /// Call before `run_server`: nft is checked and started while tern may still run it.
    pub fn install_bans(&self, server: Server, also_exempt: &[IpNet]) -> Result<Server, String> {
        match self.ban_config(also_exempt)? {
            None if !self.ban_nft_set.is_empty() => {
                Err("--ban-nft-set needs bans on (not --ban off)".into())
            }
            None => Ok(server),
            Some(config) => crate::bans::install(server, config, &self.ban_nft_set),
        }
    }
}

/// Applies a reload to the running server: the settings that can change while running (see
/// `ServerHandle::reloader`); every worker also drops its static-file front caches.
pub type ServerReload<'a> = &'a dyn Fn(&ServerConfig);

/// What started a reload; its log lines name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadTrigger {
    /// `SIGHUP` (`kill -HUP`, or `systemctl reload` for a config without `control`).
    Sighup,
    /// A `reload` request on the control socket (`tern reload`).
    ControlSocket,
}

impl fmt::Display for ReloadTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReloadTrigger::Sighup => "SIGHUP",
            ReloadTrigger::ControlSocket => "control socket",
        })
    }
}

/// A reload's outcome: what changed, or why nothing did.
pub type ReloadOutcome = Result<String, String>;

/// What a command does on a reload, on the signal thread: re-read its settings and apply them
/// (calling the [`ServerReload`] with the new server config), or change nothing and say why.
/// [`run_server_with_reload`] logs the outcome.
pub type OnReload = Box<dyn FnMut(ServerReload<'_>, ReloadTrigger) -> ReloadOutcome + Send>;

/// What else a command re-reads on a reload before the server's own (a gate's config and
/// keys), logging its own outcome.
pub type ReloadHook = Box<dyn Fn(ReloadTrigger) + Send>;

/// The reloads asked for over the control socket, waiting for the signal thread, which runs
/// each where it runs `SIGHUP`'s: one reload at a time, whatever asked for it. Made before the
/// server starts (the control socket's thread starts with it, before the signal thread);
/// [`run_server_with_reload`] takes it.
pub struct ReloadQueue {
    asked: mpsc::Receiver<ReloadRequest>,
    pipe: SignalPipe,
}

/// One reload asked for: its outcome goes back here.
type ReloadRequest = mpsc::SyncSender<ReloadOutcome>;

/// The control socket's end of the [`ReloadQueue`]: asks for a reload and waits for it.
#[derive(Clone)]
pub struct ReloadRequester {
    ask: mpsc::Sender<ReloadRequest>,
    waker: SignalThreadWaker,
}

/// A queue of reloads and the handle that asks for them.
pub fn reload_queue() -> Result<(ReloadRequester, ReloadQueue), String> {
    let pipe = SignalPipe::new().map_err(|e| format!("cannot make the signal pipe: {e}"))?;
    let (ask, asked) = mpsc::channel();
    let requester = ReloadRequester {
        ask,
        waker: pipe.waker(),
    };
    Ok((requester, ReloadQueue { asked, pipe }))
}

impl ReloadRequester {
    /// Asks the signal thread for a reload and waits up to `within` for its outcome. A reload
    /// under way (a `SIGHUP`'s) finishes first; this one then starts from the file as it is.
    pub fn reload(&self, within: Duration) -> ReloadOutcome {
        let (reply, outcome) = mpsc::sync_channel(1);
        if self.ask.send(reply).is_err() {
            return Err("the server is stopping".into());
        }
        // After the request is queued: the thread takes the queue after the byte.
        self.waker.wake();
        match outcome.recv_timeout(within) {
            Ok(outcome) => outcome,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
                "no outcome within {} s; the reload may still finish, and its outcome will \
                 be in the server's log",
                within.as_secs()
            )),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err("the server stopped before the reload ran".into())
            }
        }
    }
}

#[cfg(test)]
impl ReloadQueue {
    /// Answers each reload asked for with `run`, on a thread of its own, until every
    /// requester is gone: the signal thread's part, for tests of what asks.
    pub fn answer_in_place_of_the_signal_thread(
        self,
        mut run: impl FnMut() -> ReloadOutcome + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for reply in self.asked.iter() {
                let _ = reply.send(run());
            }
        })
    }
}

/// Runs one reload on the signal thread: the service manager is told around it, and its
/// outcome logged in one line.
fn reload_now(
    on_reload: &mut OnReload,
    server: ServerReload<'_>,
    trigger: ReloadTrigger,
) -> ReloadOutcome {
    service::notify_reloading();
    let outcome = on_reload(server, trigger).map_err(crate::hardening::explain_reload_error);
    match &outcome {
        Ok(changes) => tracing::info!("reload ({trigger}): {changes}"),
        Err(why) => tracing::error!("reload ({trigger}) failed, nothing changed: {why}"),
    }
    service::notify_reloaded();
    outcome
}

/// Runs the reloads asked for so far, one after another, each answered with its own outcome.
fn run_asked_reloads(
    asked: &mpsc::Receiver<ReloadRequest>,
    on_reload: &mut OnReload,
    server: ServerReload<'_>,
) {
    for reply in asked.try_iter() {
        let outcome = reload_now(on_reload, server, ReloadTrigger::ControlSocket);
        // The asker may have given up waiting: the outcome is in the log anyway.
        let _ = reply.send(outcome);
    }
}

/// Starts an assembled server (routes plus background threads), prints the one start-up line,
/// and waits for a signal to stop. A reload runs `also_reload`, then re-reads the certificates
/// and re-applies the start-up config (dropping every worker's cached files).
pub fn run_server(
    server: Server,
    what: &str,
    tls: Option<(Arc<TlsAcceptor>, TlsPlan)>,
    also_reload: Option<ReloadHook>,
) -> Result<(), String> {
    let same = server.config().clone();
    let acceptor = tls.as_ref().map(|(a, _)| a.clone());
    let on_reload: OnReload = Box::new(move |reload: ServerReload<'_>, trigger| {
        if let Some(also_reload) = &also_reload {
            also_reload(trigger);
        }
        // Certificates first: a bad one changes nothing (the cached files stay too).
        let note = match &tls {
            None => "nothing to re-read",
            Some((acceptor, plan)) => {
                acceptor
                    .reload(&plan.options)
                    .map_err(|e| format!("certificates unchanged: {e}"))?;
                "certificates re-read"
            }
        };
        reload(&same);
        Ok(format!("{note}; cached files dropped"))
    });
    run_server_with_reload(server, what, on_reload, acceptor.as_deref(), None)
}

/// Like [`run_server`], with the command's own reload. `SIGHUP` runs it on the signal thread,
/// and so does every reload asked through `reloads` (the control socket's), in turn.
pub fn run_server_with_reload(
    server: Server,
    what: &str,
    mut on_reload: OnReload,
    tls: Option<&TlsAcceptor>,
    reloads: Option<ReloadQueue>,
) -> Result<(), String> {
    let workers = server.config().runtime.workers;
    match tern_runtime::raise_fd_limit() {
        Ok((before, after)) => {
            tracing::info!("{}", fd_limit_line(before, after));
            let per_worker = server.config().max_connections_per_worker;
            if let Some(warning) = fd_limit_warning(after, workers, per_worker) {
                tracing::warn!("{warning}");
            }
        }
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
    let kinds = server.config().listener_kinds.clone();
    let mut server = server;
    server.background("sandbox-report", |stop| {
        tern_sandbox::report_denials(|| stop.is_stopped())
    });
    let server = server
        .start()
        .map_err(|e| crate::hardening::start_error(&e))?;
    let stop = server.stopper();
    let reload = server.reloader();
    let reopen_logs = server.log_reopener();
    let (pipe, asked) = match reloads {
        Some(queue) => (queue.pipe, Some(queue.asked)),
        None => (
            SignalPipe::new().map_err(|e| format!("cannot make the signal pipe: {e}"))?,
            None,
        ),
    };
    tern_runtime::spawn_signal_thread(pipe, move |action| match action {
        SignalAction::Shutdown => {
            tracing::info!("shutting down: finishing in-flight requests");
            service::notify_stopping();
            stop();
        }
        SignalAction::Reload => {
            // Logged; a signal has no one to answer.
            let _ = reload_now(&mut on_reload, &reload, ReloadTrigger::Sighup);
        }
        SignalAction::ReopenLogs => {
            // The writer thread reopens and logs the outcome.
            if !reopen_logs() {
                tracing::info!("reopen logs (SIGUSR1): there is no access log");
            }
        }
        SignalAction::Woken => {
            if let Some(asked) = &asked {
                run_asked_reloads(asked, &mut on_reload, &reload);
            }
        }
    })
    .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let fingerprint = tls
        .and_then(TlsAcceptor::self_signed_fingerprint)
        .map(|f| format!("; self-signed certificate SHA-256 {f}"))
        .unwrap_or_default();
    let line = format!(
        "tern: {what} on {} with {workers} worker{}{fingerprint}",
        describe_listeners(server.local_addrs(), &kinds),
        if workers == 1 { "" } else { "s" }
    );
    crate::logging::print_startup_line(&line);
    service::notify_ready(&line);
    service::start_watchdog(server.liveness_probe())?;
    // A lost worker stopped the others: exit with an error, for the service manager to
    // start tern again (`Restart=on-failure`).
    server
        .join_checked()
        .map_err(|lost| format!("stopped: {lost}; exiting with an error"))?;
    tracing::info!("stopped");
    Ok(())
}

/// The start-up's open-file limit line: raised (soft to hard), or already at its hard limit.
fn fd_limit_line(before: u64, after: u64) -> String {
    if after > before {
        format!("open-file limit raised from {before} to {after} (the hard limit)")
    } else {
        format!("open-file limit: {after} (the hard limit)")
    }
}

/// A warning when the hard limit is below what the workers may hold open: a service manager
/// or container caps `LimitNOFILE=` silently (systemd keeps showing the value asked for).
fn fd_limit_warning(limit: u64, workers: usize, per_worker: usize) -> Option<String> {
    let connections = (workers as u64).saturating_mul(per_worker as u64);
    (limit < connections).then(|| {
        format!(
            "open-file limit {limit} is below the {connections} connections {workers} worker{} \
             may hold ({per_worker} each, --max-connections): past it new connections fail \
             (EMFILE); raise the hard limit (LimitNOFILE= under systemd, which a container or \
             the manager's own limit may cap) or lower --max-connections",
            if workers == 1 { "" } else { "s" }
        )
    })
}

#[cfg(test)]
mod reload_tests {
    use super::*;

    #[test]
    fn asked_reloads_run_in_turn_each_answered_with_its_own_outcome() {
        let (requester, queue) = reload_queue().unwrap();
        let mut replies = Vec::new();
        for _ in 0..2 {
            let (reply, outcome) = mpsc::sync_channel(1);
            requester.ask.send(reply).unwrap();
            replies.push(outcome);
        }
        let mut runs = 0;
        let mut on_reload: OnReload = Box::new(move |server, trigger| {
            assert_eq!(trigger, ReloadTrigger::ControlSocket);
            server(&ServerConfig::default());
            runs += 1;
            match runs {
                1 => Ok("first".into()),
                _ => Err("second".into()),
            }
        });
        let applied = std::cell::Cell::new(0);
        run_asked_reloads(&queue.asked, &mut on_reload, &|_| {
            applied.set(applied.get() + 1)
        });
        assert_eq!(applied.get(), 2);
        assert_eq!(replies[0].try_recv().unwrap(), Ok("first".into()));
        assert_eq!(replies[1].try_recv().unwrap(), Err("second".into()));
        // Nothing left: a wake-up with an empty queue runs no reload.
        run_asked_reloads(&queue.asked, &mut on_reload, &|_| {
            applied.set(applied.get() + 1)
        });
        assert_eq!(applied.get(), 2);
    }

    #[test]
    fn a_requester_waits_within_its_bound_and_knows_a_stopped_server() {
        let (requester, queue) = reload_queue().unwrap();
        let answering = queue.answer_in_place_of_the_signal_thread(|| Ok("done".into()));
        assert_eq!(requester.reload(Duration::from_secs(10)), Ok("done".into()));
        let (unanswered, _queue) = reload_queue().unwrap();
        let e = unanswered.reload(Duration::from_millis(50)).unwrap_err();
        assert!(
            e.starts_with("no outcome within 0 s; the reload may"),
            "{e}"
        );
        let (stopped, queue) = reload_queue().unwrap();
        drop(queue);
        assert_eq!(
            stopped.reload(Duration::from_secs(10)).unwrap_err(),
            "the server is stopping"
        );
        drop(requester);
        answering.join().unwrap();
    }

    #[test]
    fn triggers_are_named_in_the_log_lines() {
        assert_eq!(ReloadTrigger::Sighup.to_string(), "SIGHUP");
        assert_eq!(ReloadTrigger::ControlSocket.to_string(), "control socket");
    }
}

#[cfg(test)]
mod fd_limit_tests {
    use super::*;

    #[test]
    fn the_limit_line_says_raised_only_when_it_was() {
        assert_eq!(
            fd_limit_line(1024, 20000),
            "open-file limit raised from 1024 to 20000 (the hard limit)"
        );
        assert_eq!(
            fd_limit_line(20000, 20000),
            "open-file limit: 20000 (the hard limit)"
        );
    }

    #[test]
    fn a_limit_below_the_connections_warns() {
        assert_eq!(fd_limit_warning(1048576, 2, 16384), None);
        let warning = fd_limit_warning(20000, 2, 16384).unwrap();
        assert!(warning.starts_with(
            "open-file limit 20000 is below the 32768 connections 2 workers may hold"
        ));
    }
}
