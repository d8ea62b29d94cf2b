//! The `tern` binary: argument parsing, logging set-up, then hand-off to a command.
//!
//! This file only dispatches: each command lives in its own module (`serve.rs`), and what
//! server commands share (the common flags and the start/wait loop) is in `common.rs`.

mod acme;
mod bans;
mod common;
mod config;
mod demo;
mod gate;
mod hardening;
mod memory;
mod panic_log;
mod run;
mod serve;
mod service;
mod tls;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "tern",
    version,
    about = "A thread-per-core web server that lets one cheap machine serve the world.",
    after_help = "Quick start:\n  tern demo                      # the IPv4 Games on http://127.0.0.1:8080\n  tern serve ./site --listen 127.0.0.1:8080 [--workers N]\n  tern run --config tern.toml    # several sites from one file (--check to validate it)\n  tern gate --config gate.toml   # the auth gateway for nginx auth_request (or --gate FILE on serve/demo)\n\nSee `tern serve --help` for every option."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines (stderr) are written: text, or one JSON object per line for log
    /// shippers.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the files of DIR over HTTP/1.1, HTTP/2 and HTTPS.
    Serve(serve::ServeArgs),
    /// Run the IPv4 Games (claim your address for a name): state in memory, claims in an
    /// append-only journal (or PostgreSQL with --store).
    Demo(demo::DemoArgs),
    /// Serve several sites, chosen by host name, from one config file (static files,
    /// redirects, fixed answers, the IPv4 Games).
    Run(run::RunArgs),
    /// The auth gateway against AI scrapers (form login, proof-of-work guest passes, bot
    /// policy) as an nginx `auth_request` backend.
    Gate(gate::GateArgs),
    /// Runs the gate's `exec:` checkers for a sandboxed server (started by tern itself).
    #[command(hide = true)]
    GateExecHelper { programs: Vec<std::path::PathBuf> },
    /// Orders and renews certificates from an ACME CA for a server (started by tern itself;
    /// its settings come on stdin).
    #[command(hide = true)]
    AcmeHelper {
        /// The server runs with `--sandbox off`: so does the helper.
        #[arg(long)]
        no_sandbox: bool,
    },
}

fn main() -> ExitCode {
    memory::configure();
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TERN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never into journals and log files.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        // The event's fields (message included) at the top level of each object.
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    panic_log::install();
    // Still before any thread exists: it reads and clears environment variables.
    let result = service::init().and_then(|()| match cli.command {
        Command::Serve(args) => serve::serve(args),
        Command::Demo(args) => demo::demo(args),
        Command::Run(args) => run::run(args),
        Command::Gate(args) => gate::gate(args),
        Command::GateExecHelper { programs } => tern_gate::checkers::exec_helper_main(&programs)
            .map_err(|e| format!("gate exec helper: {e}")),
        Command::AcmeHelper { no_sandbox } => {
            acme::helper_main(!no_sandbox).map_err(|e| format!("acme helper: {e}"))
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) if cli.log_format == LogFormat::Json => {
            // A log shipper reads stderr as JSON lines: the reason tern stopped is one too.
            tracing::error!("tern: {message}");
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("tern: {message}");
            ExitCode::FAILURE
        }
    }
}
