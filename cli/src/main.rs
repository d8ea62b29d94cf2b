//! The `tern` binary: argument parsing, logging set-up, then hand-off to a command.
//!
//! This file only dispatches: each command lives in its own module (`serve.rs`), and what
//! server commands share (the common flags and the start/wait loop) is in `common.rs`.

mod acme;
mod bans;
mod cache;
mod common;
mod config;
mod control;
mod demo;
mod gate;
mod hardening;
mod logging;
mod memory;
mod panic_log;
#[cfg(test)]
mod readme_usage;
mod reload;
mod run;
mod serve;
mod service;
mod tls;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use logging::LogFormat;

/// `tern --version`: the crate's version and the commit it was built from (build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TERN_COMMIT"), ")");

#[derive(Parser)]
#[command(
    name = "tern",
    version = VERSION,
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
    /// Reload a running `tern run` through its control socket, as SIGHUP does, and print
    /// what changed (exit 1 when nothing did: the server's reason is printed).
    Reload(reload::ReloadArgs),
    /// Act on a running `tern run`'s caches through its control socket (`tern cache purge`).
    Cache(cache::CacheArgs),
    /// The auth gateway against AI scrapers (form login, proof-of-work guest passes, bot
    /// policy) as an nginx `auth_request` backend.
    Gate(gate::GateArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (tern.1, tern-serve.1, ...) into DIR (for packagers).
    #[command(hide = true)]
    Man { dir: std::path::PathBuf },
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
    logging::init(cli.log_format);
    // After the subscriber: the hook logs through it.
    panic_log::install();
    // Still before any thread exists: it reads and clears environment variables.
    let result = service::init().and_then(|()| match cli.command {
        Command::Serve(args) => serve::serve(args),
        Command::Demo(args) => demo::demo(args),
        Command::Run(args) => run::run(args),
        Command::Gate(args) => gate::gate(args),
        Command::Reload(args) => reload::reload(args),
        Command::Cache(args) => cache::cache(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "tern", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => write_man_pages(&dir),
        Command::GateExecHelper { programs } => tern_gate::checkers::exec_helper_main(&programs)
            .map_err(|e| format!("gate exec helper: {e}")),
        Command::AcmeHelper { no_sandbox } => {
            acme::helper_main(!no_sandbox).map_err(|e| format!("acme helper: {e}"))
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            logging::print_fatal(&message);
            ExitCode::FAILURE
        }
    }
}

/// `tern man DIR`: one page for tern and one per visible subcommand (`tern-serve.1`, ...).
fn write_man_pages(dir: &std::path::Path) -> Result<(), String> {
    use clap::CommandFactory;
    let tern = Cli::command().propagate_version(true);
    clap_mangen::generate_to(tern, dir)
        .map_err(|e| format!("cannot write man pages in {}: {e}", dir.display()))
}
