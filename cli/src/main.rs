//! The `tern` binary: argument parsing, logging set-up, then hand-off to a command.
//!
//! This file only dispatches: each command lives in its own module (`serve.rs`), and what
//! server commands share (the common flags and the start/wait loop) is in `common.rs`.

mod common;
mod config;
mod demo;
mod serve;
mod tls;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

// mimalloc: lower fragmentation and faster small allocations than the system allocator (swad
// fought RSS growth from fragmentation for weeks).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tern",
    version,
    about = "A thread-per-core web server that lets one cheap machine serve the world.",
    after_help = "Quick start:\n  tern demo                      # the IPv4 Games on http://127.0.0.1:8080\n  tern serve ./site --listen 127.0.0.1:8080 [--workers N]\n\nSee `tern serve --help` for every option."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the files of DIR over HTTP/1.1 and HTTPS.
    Serve(serve::ServeArgs),
    /// Run the IPv4 Games (claim your address for a name) on embedded SQLite.
    Demo(demo::DemoArgs),
}

/// mimalloc's `mi_option_purge_delay` (not exported as a constant by libmimalloc-sys; its
/// place in mimalloc v2's `mi_option_e`).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Give memory freed after a burst (5 000 slowloris connections) back to the OS at once
/// instead of keeping it for reuse: measured with stress/slowloris.py, RSS otherwise stayed at
/// the attack's peak.
fn return_freed_memory_promptly() {
    // SAFETY: mi_option_set only stores an integer option; it is called before any other
    // thread exists, and purge_delay accepts any value (0 = purge immediately).
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

/// No transparent huge pages for this process. mimalloc asks for them on its arena
/// (MADV_HUGEPAGE, before `main` runs), so RSS grew in 2 MiB steps: whether a burst of 10 000
/// idle connections crossed into one more huge page decided between ~460 and ~670 bytes per
/// connection from run to run (bench idle-rss). A server's heap is small; predictable memory
/// matters more than the TLB.
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map; the unused
    // arguments are 0 as prctl(2) requires.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        eprintln!(
            "tern: warning: cannot disable transparent huge pages: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn main() -> ExitCode {
    return_freed_memory_promptly();
    no_transparent_huge_pages();
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
        Command::Serve(args) => serve::serve(args),
        Command::Demo(args) => demo::demo(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tern: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn purge_delay_option_is_set() {
        super::return_freed_memory_promptly();
        // SAFETY: mi_option_get only reads an option value.
        let v = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(v, 0);
    }

    #[test]
    fn transparent_huge_pages_are_off() {
        super::no_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE only reads the flag.
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(flag, 1);
    }
}
