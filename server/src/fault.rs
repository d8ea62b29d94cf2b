//! Test-only fault injection: makes a chosen layer panic on a marked request, so the tests
//! can prove that each kind of panic is contained (or, for the worker, recovered from) as
//! `HttpWorker::contain_panic` and the runtime say.
//!
//! It exists only in a build with the `fault-injection` feature, which nothing but the
//! tests turns on (the `tern` package enables it through its dev-dependency on this crate,
//! so `cargo test` builds a binary with it and `cargo build --release` one without). Even
//! there it does nothing unless the process started with `TERN_TEST_FAULTS=1`, read once by
//! [`arm_from_env`] at start-up. Without the feature every call below is an empty inline
//! function: a production binary has no path an outsider could use to make tern panic.
//!
//! The marked requests (any method, any protocol), by path:
//! - `/tern-test-fault/connection`: a panic in the connection's code, before routing (as a
//!   panic in a codec, TLS, the relay or compression would be): the connection is closed.
//! - `/tern-test-fault/handler`: a panic in the route's handler, under its catch: a 500.
//! - `/tern-test-fault/worker`: a panic at the end of the worker's loop turn, outside every
//!   connection: the worker is lost.

/// The path prefix of a marked request.
#[cfg_attr(not(any(test, feature = "fault-injection")), allow(dead_code))]
const MARK: &str = "/tern-test-fault/";

#[cfg(any(test, feature = "fault-injection"))]
mod armed {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, Ordering};

    pub static ARMED: AtomicBool = AtomicBool::new(false);

    thread_local! {
        /// A worker fault was asked for on this thread; it strikes at the end of the turn.
        pub static WORKER_DUE: Cell<bool> = const { Cell::new(false) };
    }

    pub fn armed() -> bool {
        ARMED.load(Ordering::Relaxed)
    }
}

/// At start-up (`Server::start`, before any worker exists): arms the faults if
/// `TERN_TEST_FAULTS=1` (and the build has them).
pub(crate) fn arm_from_env() {
    #[cfg(any(test, feature = "fault-injection"))]
    if std::env::var_os("TERN_TEST_FAULTS").is_some_and(|v| v == "1") {
        armed::ARMED.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!("TERN_TEST_FAULTS=1: test faults armed (a test build; never in production)");
    }
}

/// Arms the faults in this process (unit tests of this crate).
#[cfg(test)]
pub(crate) fn arm_for_tests() {
    armed::ARMED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Called by every exchange before routing: a marked request's connection fault strikes
/// here, a worker fault is noted for the end of the turn.
#[inline(always)]
pub(crate) fn before_routing(_path: &str) {
    #[cfg(any(test, feature = "fault-injection"))]
    if armed::armed() {
        match _path.strip_prefix(MARK) {
            Some("connection") => panic!("test fault: connection"),
            Some("worker") => armed::WORKER_DUE.with(|due| due.set(true)),
            _ => {}
        }
    }
}

/// Called inside the handler's catch: a marked request's handler fault strikes here.
#[inline(always)]
pub(crate) fn in_handler(_path: &str) {
    #[cfg(any(test, feature = "fault-injection"))]
    if armed::armed() && _path.strip_prefix(MARK) == Some("handler") {
        panic!("test fault: handler");
    }
}

/// Called at the end of each loop turn, outside every connection: a noted worker fault
/// strikes here.
#[inline(always)]
pub(crate) fn worker_turn_ends() {
    #[cfg(any(test, feature = "fault-injection"))]
    if armed::armed() && armed::WORKER_DUE.with(|due| due.replace(false)) {
        panic!("test fault: worker");
    }
}
