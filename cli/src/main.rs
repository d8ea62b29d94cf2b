//! The `tern` binary: argument parsing, logging set-up, then hand-off to the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tern_server::static_files::{StaticFiles, StaticOptions};
use tern_server::{Router, Server, ServerConfig, SignalAction};

// mimalloc: lower fragmentation and faster small allocations than the system allocator (swad
// fought RSS growth from fragmentation for weeks).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tern",
    version,
    about = "A thread-per-core web server that lets one cheap machine serve the world.",
    after_help = "Quick start:\n  tern serve ./site --listen 127.0.0.1:8080 [--workers N]\n\nSee `tern serve --help` for every option."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the files of DIR over HTTP/1.1.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// The directory to serve.
    dir: PathBuf,
    #[command(flatten)]
    common: CommonArgs,
    /// Serve files and directories whose name starts with a dot.
    #[arg(long)]
    serve_dotfiles: bool,
    /// Value of the Cache-Control header on file responses, e.g. "public, max-age=60".
    #[arg(long, value_name = "VALUE")]
    cache_control: Option<String>,
    /// Files up to this many bytes are held in memory with gzip and brotli variants.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024)]
    max_cached_size: u64,
}

/// Settings every server command shares.
#[derive(Args)]
struct CommonArgs {
    /// Address and port to listen on (port 0 picks a free port).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Worker threads, one event loop each [default: the CPUs this process may use].
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Pin each worker to its own CPU.
    #[arg(long)]
    pin: bool,
    /// Seconds a client may take to send a request head, from its first byte.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    header_timeout: u64,
    /// Seconds between progress while reading a request body.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    body_timeout: u64,
    /// Seconds an idle keep-alive connection stays open.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    idle_timeout: u64,
    /// Seconds a client may go without reading any of our output.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    write_timeout: u64,
    /// Largest request body in bytes (larger is answered 413).
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    max_body: u64,
    /// Open connections per worker; above it new connections are closed at once.
    #[arg(long, value_name = "N", default_value_t = 16_384)]
    max_connections: usize,
    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    shutdown_grace: u64,
}

impl CommonArgs {
    fn server_config(&self) -> ServerConfig {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TERN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tern: {message}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let files = StaticFiles::new(StaticOptions {
        root: args.dir.clone(),
        serve_dotfiles: args.serve_dotfiles,
        cache_control: args.cache_control.clone(),
        max_cached_size: args.max_cached_size,
        index_file: "index.html".into(),
    })
    .map_err(|e| format!("cannot serve {}: {e}", args.dir.display()))?;
    let config = args.common.server_config();
    let root = std::fs::canonicalize(&args.dir).unwrap_or(args.dir);
    run(
        config,
        Router::new().fallback(files),
        &format!("serving {}", root.display()),
    )
}

/// Starts the server, prints the one start-up line, and waits for a signal to stop.
fn run(config: ServerConfig, router: Router, what: &str) -> Result<(), String> {
    match tern_runtime::raise_fd_limit() {
        Ok((before, after)) => tracing::info!("open-file limit raised from {before} to {after}"),
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
    let workers = config.runtime.workers;
    let listen = config.runtime.listen;
    let server = Server::new(config, router)
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
