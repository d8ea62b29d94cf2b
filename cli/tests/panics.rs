//! No panic silently removes a worker. A panic in a connection's own code (its protocol,
//! TLS, relay, compression) closes that connection only, while the others go on being
//! served; one in a handler is answered 500; one outside every connection loses the worker,
//! and tern then stops with an error for its service manager to restart it. Each is counted
//! (`tern_panics_total{where}`) and logged at once with a backtrace.
//!
//! The panics come from the test-only fault hook (`server/src/fault.rs`): the binary `cargo
//! test` builds has it (the `fault-injection` feature, through this package's
//! dev-dependency), and it is armed by `TERN_TEST_FAULTS=1`.

use std::ffi::OsStr;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::{h2_support, support};
use h2_support::RawH2;
use support::*;

/// Keep-alive connections served while one of their neighbours panics.
const NEIGHBOURS: usize = 8;
/// Requests each of them sends.
const ROUNDS: usize = 200;

/// `tern run` with one worker: a static site, and its counters on /metrics.
fn start_run(dir: &std::path::Path, workers: &str) -> Tern {
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(dir.join("site/a.txt"), "alpha\n").unwrap();
    let config = dir.join("tern.toml");
    std::fs::write(
        &config,
        "[[site]]\nname = \"test\"\nhosts = [\"test\", \"localhost\"]\n\n\
         [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\n\
         [[site.route]]\npath = \"/\"\nstatic = \"site\"\n",
    )
    .unwrap();
    let mut cmd = Command::new(TERN);
    cmd.arg("run").arg("--config").arg(&config);
    cmd.args(["--listen", "127.0.0.1:0", "--workers", workers]);
    sandboxed(&mut cmd);
    cmd.env("TERN_TEST_FAULTS", "1");
    Tern::spawn(cmd)
}

/// `--sandbox on`, as every test runs, unless TERN_TEST_SANDBOX=off (a kernel without it).
fn sandboxed(cmd: &mut Command) {
    if std::env::var_os("TERN_TEST_SANDBOX").as_deref() != Some(OsStr::new("off")) {
        cmd.args(["--sandbox", "on"]);
    }
}

/// Waits (5 s at most) for a logged panic with `message`, with a backtrace naming `frame`;
/// the process must still be running for "at once" to mean anything, so the caller checks.
fn panic_logged(tern: &Tern, message: &str, frame: &str) {
    let logged = eventually(Duration::from_secs(5), || {
        let text = tern.stderr_text();
        text.find(&format!("panic: {message}"))
            .is_some_and(|at| text[at..].contains("backtrace:") && text[at..].contains(frame))
    });
    assert!(
        logged,
        "no panic {message:?} logged with a backtrace naming {frame}; stderr:\n{}",
        tern.stderr_text()
    );
}

#[test]
fn a_connection_panic_under_load_loses_only_that_connections_requests() {
    let dir = tempfile::tempdir().unwrap();
    let tern = start_run(dir.path(), "1");
    let addr = tern.addr();
    // Every neighbour has its connection open and one answer in before the panic, and sends
    // the rest of its requests while it happens and after.
    let started = Arc::new(Barrier::new(NEIGHBOURS + 1));
    let neighbours: Vec<_> = (0..NEIGHBOURS)
        .map(|n| {
            let started = started.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for round in 0..ROUNDS {
                    c.send(&request_bytes("GET", "/a.txt", &[]));
                    let r = c.try_read_response(false);
                    let r = r.unwrap_or_else(|e| panic!("neighbour {n}, request {round}: {e}"));
                    assert_eq!(
                        (r.status, r.text().as_str()),
                        (200, "alpha\n"),
                        "{n}/{round}"
                    );
                    if round == 0 {
                        started.wait();
                    }
                }
            })
        })
        .collect();
    started.wait();
    let mut victim = Client::connect(addr);
    assert_eq!(victim.get("/a.txt", &[]).status, 200);
    victim.send(&request_bytes("GET", "/tern-test-fault/connection", &[]));
    assert!(
        victim.at_eof(),
        "the panicking connection is closed without an answer"
    );
    // It is logged while tern serves on, not when it stops.
    panic_logged(
        &tern,
        "test fault: connection",
        "tern_server::fault::before_routing",
    );
    for n in neighbours {
        n.join().expect("a neighbour lost a request");
    }
    // The one worker serves new connections too, and counted the panic where it was held.
    assert_eq!(tern.get("/a.txt").text(), "alpha\n");
    assert_eq!(tern.metric("tern_panics_total{where=\"connection\"}"), 1);
    assert_eq!(tern.metric("tern_panics_total{where=\"worker\"}"), 0);
    assert_eq!(
        tern.log_lines("closed that connection; the worker goes on")
            .len(),
        1
    );

    // Over HTTP/2 the whole connection goes (its other streams with it: the panic may have
    // struck in state they share), and another HTTP/2 connection is served on.
    let mut neighbour = RawH2::connect(addr, &[]);
    neighbour.request(1, "GET", "/a.txt", &[], false);
    assert_eq!(neighbour.response_body(1), b"alpha\n");
    let mut victim = RawH2::connect(addr, &[]);
    victim.request(1, "GET", "/a.txt", &[], false);
    assert_eq!(victim.response_body(1), b"alpha\n");
    victim.request(3, "GET", "/tern-test-fault/connection", &[], false);
    assert!(victim.closed_within(READ_TIMEOUT));
    neighbour.request(3, "GET", "/a.txt", &[], false);
    assert_eq!(neighbour.response_body(3), b"alpha\n");
    assert_eq!(tern.metric("tern_panics_total{where=\"connection\"}"), 2);

    // A handler's panic is answered 500 and counted as the handler's.
    let r = tern.get("/tern-test-fault/handler");
    assert_eq!(r.status, 500);
    panic_logged(
        &tern,
        "test fault: handler",
        "tern_server::fault::in_handler",
    );
    assert_eq!(tern.metric("tern_panics_total{where=\"handler\"}"), 1);
    assert_eq!(tern.metric("tern_panics_total{where=\"connection\"}"), 2);
}

#[test]
fn a_lost_worker_stops_tern_with_an_error_for_its_service_manager() {
    for workers in ["1", "2"] {
        let dir = tempfile::tempdir().unwrap();
        let mut tern = start_run(dir.path(), workers);
        // An idle keep-alive connection, maybe on the worker about to be lost.
        let mut idle = tern.client();
        assert_eq!(idle.get("/a.txt", &[]).status, 200);
        // The panic strikes at the end of the worker's loop turn, outside every connection:
        // the marked request's answer (a 404) may or may not have gone out by then (not with
        // io_uring, whose sends of the turn were still queued in the ring).
        let mut marked = tern.client();
        marked.send(&request_bytes("GET", "/tern-test-fault/worker", &[]));
        if let Ok(r) = marked.try_read_response(false) {
            assert_eq!(r.status, 404);
        }
        panic_logged(
            &tern,
            "test fault: worker",
            "tern_server::fault::worker_turn_ends",
        );
        let status = tern.wait_exit(Duration::from_secs(15));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "{workers} worker(s): tern exits with an error; stderr:\n{}",
            tern.stderr_text()
        );
        assert!(idle.at_eof(), "its connections are closed");
        let lost = tern.log_lines("worker lost: a panic no connection could contain");
        assert_eq!(lost.len(), 1, "{}", tern.stderr_text());
        assert_eq!(
            tern.log_lines("tern: stopped: a worker was lost").len(),
            1,
            "{}",
            tern.stderr_text()
        );
    }
}
