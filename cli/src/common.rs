//! What every server command shares: the common flags and the start/wait loop.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use tern_server::{Router, Server, ServerConfig, SignalAction};

/// Settings every server command shares.
#[derive(Args)]
pub struct CommonArgs {
    /// Address and port to listen on (port 0 picks a free port).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Worker threads, one event loop each [default: the CPUs this process may use].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Pin each worker to its own CPU.
    #[arg(long)]
    pub pin: bool,
    /// Seconds a client may take to send a request head, from its first byte.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub header_timeout: u64,
    /// Seconds between progress while reading a request body.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub body_timeout: u64,
    /// Seconds an idle keep-alive connection stays open.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub idle_timeout: u64,
    /// Seconds a client may go without reading any of our output.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub write_timeout: u64,
    /// Largest request body in bytes (larger is answered 413).
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub max_body: u64,
    /// Open connections per worker; above it new connections are closed at once.
    #[arg(long, value_name = "N", default_value_t = 16_384)]
    pub max_connections: usize,
    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub shutdown_grace: u64,
}

impl CommonArgs {
    pub fn server_config(&self) -> ServerConfig {
        let mut config = ServerConfig::default();
        config.runtime.listen = self.listen;
        if let Some(n) = self.workers {
            config.runtime.workers = n.max(1);
        }
        config.runtime.pin = self.pin;
        config.runtime.shutdown_grace = Duration::from_secs(self.shutdown_grace);
        config.header_timeout = Duration::from_secs(self.header_timeout);
        config.body_timeout = Duration::from_secs(self.body_timeout);
        config.idle_timeout = Duration::from_secs(self.idle_timeout);
        config.write_timeout = Duration::from_secs(self.write_timeout);
        config.limits.max_body = self.max_body;
        config.max_connections_per_worker = self.max_connections.max(1);
        config
    }
}

/// Starts the server, prints the one start-up line, and waits for a signal to stop.
pub fn run(config: ServerConfig, router: Router, what: &str) -> Result<(), String> {
    run_server(Server::new(config, router), what)
}

/// Like [`run`], for a server an app has already assembled (routes plus background threads).
pub fn run_server(server: Server, what: &str) -> Result<(), String> {
    match tern_runtime::raise_fd_limit() {
        Ok((before, after)) => tracing::info!("open-file limit raised from {before} to {after}"),
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
    let workers = server.config().runtime.workers;
    let listen = server.config().runtime.listen;
    let server = server
        .start()
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let stop = server.stopper();
    tern_runtime::spawn_signal_thread(move |action| match action {
        SignalAction::Shutdown => {
            tracing::info!("shutting down: finishing in-flight requests");
            stop();
        }
        SignalAction::Reload => {
            tracing::info!("SIGHUP: files are re-checked continuously; nothing to reload")
        }
    })
    .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    println!(
        "tern: {what} on http://{} with {workers} worker{}",
        server.local_addr(),
        if workers == 1 { "" } else { "s" }
    );
    server.join();
    tracing::info!("stopped");
    Ok(())
}
