//! Panics are logged the moment they happen, through the log (as JSON with
//! `--log-format json`), at error level, with a backtrace: the default hook writes a line to
//! stderr without one (unless `RUST_BACKTRACE` is set), and a worker's panic used to show
//! only when the process stopped. The release profile keeps unwinding and line tables
//! (`panic = "unwind"`, `debug = 1`) for this.
//!
//! Whether the panic is then contained (a handler's, a connection's) or ends a worker is the
//! catcher's business; it logs its own line and counts it (`tern_panics_total{where}`).
//!
//! A panic an outsider can trigger again and again must not flood the log, nor make the
//! worker symbolize a backtrace each time: at most [`PER_WINDOW`] panics per [`WINDOW_MS`]
//! are logged, process-wide; the next logged one says how many were left out.

use std::backtrace::Backtrace;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tern_runtime::ratelog::RateLimiter;

/// Panics logged per window, process-wide.
const PER_WINDOW: u32 = 5;
const WINDOW_MS: u64 = 10_000;

static LIMITER: Mutex<RateLimiter> = Mutex::new(RateLimiter::new(PER_WINDOW, WINDOW_MS));
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Replaces the default panic hook.
pub fn install() {
    EPOCH.get_or_init(Instant::now);
    std::panic::set_hook(Box::new(|info| {
        let now_ms = EPOCH.get().map_or(0, |e| e.elapsed().as_millis() as u64);
        let mut left_out = 0;
        let admitted = match LIMITER.lock() {
            Ok(mut limiter) => limiter.admit("panic", now_ms, |_, n| left_out = n),
            Err(_) => true,
        };
        if !admitted {
            return;
        }
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("<unnamed>");
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(not a string)");
        let location = info.location().map_or_else(String::new, |l| l.to_string());
        let backtrace = Backtrace::force_capture();
        if left_out > 0 {
            tracing::error!(
                thread,
                %location,
                left_out,
                "panic: {message} ({left_out} panics before it not logged)\nbacktrace:\n{backtrace}"
            );
        } else {
            tracing::error!(thread, %location, "panic: {message}\nbacktrace:\n{backtrace}");
        }
    }));
}
