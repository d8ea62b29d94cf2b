//! The `tern` process: graceful shutdown on SIGTERM/SIGINT, surviving EMFILE, start-up errors
//! and `--help`. Each test starts its own server (or fails to).

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support;
use support::*;

fn connect_refused(addr: std::net::SocketAddr) -> bool {
    match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        Ok(_) => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Graceful shutdown
// ---------------------------------------------------------------------------------------------

const BIG: u64 = 64 << 20;

/// Starts a 64 MiB download, sends SIGTERM a MiB into it, and reads the rest. Checks that new
/// connections are refused at once, an idle connection is closed, every byte arrives, and tern
/// exits 0. With `prompt`, also that the connection closes and tern exits as soon as the
/// download is done rather than when the grace period runs out.
fn download_through_sigterm(prompt: bool) {
    const GRACE_SECS: u64 = 3;
    let site = Site::new();
    write_pattern_file(&site.root.join("big.bin"), BIG);
    site.write("a.txt", "alpha\n");
    let mut tern = site.start(&["--shutdown-grace", &GRACE_SECS.to_string()]);
    let addr = tern.addr();

    // An idle keep-alive connection: it must be closed, not waited for.
    let mut idle = tern.client();
    assert_eq!(idle.get("/a.txt", &[]).text(), "alpha\n");

    let mut c = tern.client();
    // At most a few MiB in the kernel's buffers: tern is mid-transfer when SIGTERM arrives.
    c.small_receive_buffer(128 << 10);
    c.send(&request_bytes("GET", "/big.bin", &[]));
    let head = c.read_head_only();
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(BIG));
    // Read the first MiB slowly, so the transfer is well under way but far from done.
    let mut got = 0u64;
    for _ in 0..4 {
        let chunk = c.read_exact_raw(256 << 10);
        check_pattern(&chunk, got);
        got += chunk.len() as u64;
        std::thread::sleep(Duration::from_millis(30));
    }

    let signalled = Instant::now();
    tern.signal(libc::SIGTERM);

    // New connections are refused while the download goes on.
    assert!(
        eventually(Duration::from_secs(1), || connect_refused(addr)),
        "still accepting connections 1 s after SIGTERM"
    );
    assert!(
        idle.closed_within(Duration::from_secs(1)),
        "idle keep-alive connection not closed on SIGTERM"
    );
    assert!(tern.alive(), "exited before the download finished");

    // Keep reading slowly for a little while, then at full speed; every byte must arrive.
    for _ in 0..3 {
        let chunk = c.read_exact_raw(256 << 10);
        check_pattern(&chunk, got);
        got += chunk.len() as u64;
        std::thread::sleep(Duration::from_millis(50));
    }
    while got < BIG {
        let n = (BIG - got).min(4 << 20) as usize;
        let chunk = c.read_exact_raw(n);
        check_pattern(&chunk, got);
        got += n as u64;
    }
    let downloaded = signalled.elapsed();
    assert!(
        downloaded < Duration::from_secs(GRACE_SECS - 1),
        "the download itself took {downloaded:?}; the test needs a faster machine"
    );

    let wait = if prompt { 1 } else { GRACE_SECS + 1 };
    let closed = c.closed_within(Duration::from_secs(wait));
    let closed_at = signalled.elapsed();
    assert!(
        closed,
        "connection still open {wait} s after its last answer (download done {downloaded:?} \
         after SIGTERM); stderr:\n{}",
        tern.stderr_text()
    );
    let status = tern
        .wait_exit(Duration::from_secs(wait))
        .unwrap_or_else(|| {
            panic!(
                "tern still running {wait} s after the connection closed; stderr:\n{}",
                tern.stderr_text()
            )
        });
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        tern.stderr_text()
    );
    if prompt {
        assert!(
            signalled.elapsed() < downloaded + Duration::from_secs(1),
            "tern exited {:?} after SIGTERM, the download was done after {downloaded:?}, \
             the connection closed after {closed_at:?}; stderr:\n{}",
            signalled.elapsed(),
            tern.stderr_text()
        );
    }
    assert!(connect_refused(addr), "connections accepted after exit");
}

#[test]
fn sigterm_lets_a_download_in_flight_finish_then_exits_0() {
    download_through_sigterm(false);
}

#[test]
fn sigterm_closes_a_busy_connection_after_its_answer_and_exits_at_once() {
    download_through_sigterm(true);
}

#[test]
fn sigint_with_only_idle_connections_exits_0_at_once() {
    let site = Site::new();
    site.write("a.txt", "alpha\n");
    let mut tern = site.start(&[]);
    let mut clients: Vec<Client> = (0..4).map(|_| tern.client()).collect();
    for c in &mut clients {
        assert_eq!(c.get("/a.txt", &[]).text(), "alpha\n");
    }
    // One connection that sent nothing at all.
    let _silent = TcpStream::connect(tern.addr()).unwrap();
    let t = Instant::now();
    tern.signal(libc::SIGINT);
    let status = tern
        .wait_exit(Duration::from_secs(2))
        .expect("tern exits within 2 s when every connection is idle");
    assert!(status.success(), "exit {status:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
    for c in &mut clients {
        assert!(c.at_eof());
    }
    let stderr = tern.stderr_text();
    assert!(
        !stderr.contains("panicked"),
        "a panic during shutdown:\n{stderr}"
    );
}

#[test]
fn sigterm_mid_request_head_still_answers_or_closes_cleanly() {
    // A client that has sent half a request head when SIGTERM arrives: tern must not hang
    // until the grace period ends, and must exit 0.
    let site = Site::new();
    site.write("a.txt", "alpha\n");
    let mut tern = site.start(&["--shutdown-grace", "2"]);
    let mut c = tern.client();
    c.send(b"GET /a.txt HTTP/1.1\r\nHo");
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    tern.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(100));
    // Finishing the request may be answered (with Connection: close) or the connection closed.
    let _ = c.stream.write_all(b"st: test\r\n\r\n");
    if let Ok(r) = c.try_read_response(false) {
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "alpha\n");
        assert!(
            r.closes(),
            "an answer during shutdown says Connection: close"
        );
    }
    let status = tern
        .wait_exit(Duration::from_secs(4))
        .expect("tern exits within the grace period");
    assert!(status.success(), "exit {status:?}");
    assert!(t.elapsed() < Duration::from_secs(4));
}

// ---------------------------------------------------------------------------------------------
// Running out of descriptors
// ---------------------------------------------------------------------------------------------

#[test]
fn survives_emfile_and_recovers() {
    let site = Site::new();
    site.write("index.html", "still here\n");
    let mut tern = Tern::start_with(&site.root, &["--workers", "1"], Some(64));
    // Warm the cache so answering needs no descriptor.
    let mut first = tern.client();
    assert_eq!(first.get("/", &[]).text(), "still here\n");

    let mut held = Vec::new();
    for _ in 0..100 {
        match TcpStream::connect_timeout(&tern.addr(), Duration::from_millis(500)) {
            Ok(mut s) => {
                // The listener defers accepts until data arrives (TCP_DEFER_ACCEPT): a
                // byte of a request makes the kernel hand the connection over.
                let _ = s.write_all(b"G");
                held.push(s)
            }
            Err(_) => break,
        }
    }
    assert!(held.len() > 64, "only {} connections opened", held.len());
    // Give tern time to hit EMFILE, pause, retry, hit it again.
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        tern.alive(),
        "tern died under EMFILE; stderr:\n{}",
        tern.stderr_text()
    );
    assert!(
        tern.stderr_text().contains("pausing accepts"),
        "tern never ran out of descriptors, so this test proves nothing; stderr:\n{}",
        tern.stderr_text()
    );
    // A connection it already had is still served.
    let r = first.get("/", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "still here\n");

    for s in &held {
        let _ = s.shutdown(Shutdown::Both);
    }
    drop(held);
    drop(first);
    let t = Instant::now();
    let ok = eventually(Duration::from_secs(2), || {
        let Ok(s) = TcpStream::connect_timeout(&tern.addr(), Duration::from_millis(500)) else {
            return false;
        };
        let mut c = Client::over(s);
        c.stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        c.send(&request_bytes("GET", "/", &[]));
        matches!(c.try_read_response(false), Ok(r) if r.status == 200 && r.text() == "still here\n")
    });
    assert!(
        ok,
        "no successful request within 2 s after the connections were dropped ({:?}); stderr:\n{}",
        t.elapsed(),
        tern.stderr_text()
    );
    assert!(tern.alive());
}

// ---------------------------------------------------------------------------------------------
// Start-up errors and help
// ---------------------------------------------------------------------------------------------

fn assert_one_line_error(f: &Failed, what: &str) {
    assert!(!f.status.success(), "{what}: exited successfully");
    let lines: Vec<&str> = f
        .stderr
        .lines()
        .filter(|l| l.starts_with("tern: "))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: expected exactly one `tern: ` line on stderr, got:\n{}",
        f.stderr
    );
    assert!(
        !f.stdout.contains("serving"),
        "{what}: printed a start-up line: {}",
        f.stdout
    );
}

#[test]
fn port_in_use_is_one_line_and_nonzero() {
    let site = Site::new();
    // A plain listener, without SO_REUSEPORT, so tern cannot share the port.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let f = run_to_end(
        Command::new(TERN)
            .arg("serve")
            .arg(&site.root)
            .args(["--listen", &format!("127.0.0.1:{port}")]),
        Duration::from_secs(10),
    );
    assert_one_line_error(&f, "port in use");
    let line = f.stderr.lines().find(|l| l.starts_with("tern: ")).unwrap();
    assert!(line.contains(&port.to_string()), "{line}");
}

#[test]
fn missing_dir_is_one_line_and_nonzero() {
    let site = Site::new();
    let missing = site.base().join("does-not-exist");
    let f = Tern::start_failing(&missing, &[]);
    assert_one_line_error(&f, "missing DIR");
    assert!(f.stderr.contains("does-not-exist"), "{}", f.stderr);
}

#[test]
fn dir_that_is_a_file_is_one_line_and_nonzero() {
    let site = Site::new();
    let file = site.write("plain.txt", "not a directory\n");
    let f = Tern::start_failing(&file, &[]);
    assert_one_line_error(&f, "DIR is a file");
    assert!(f.stderr.contains("plain.txt"), "{}", f.stderr);
}

#[test]
fn bad_arguments_exit_nonzero() {
    let site = Site::new();
    let no_dir = run_to_end(Command::new(TERN).arg("serve"), Duration::from_secs(10));
    assert!(!no_dir.status.success());
    assert!(no_dir.stderr.contains("DIR"), "{}", no_dir.stderr);
    let no_cmd = run_to_end(&mut Command::new(TERN), Duration::from_secs(10));
    assert!(!no_cmd.status.success());
    let bad_listen = run_to_end(
        Command::new(TERN)
            .arg("serve")
            .arg(&site.root)
            .args(["--listen", "not-an-address"]),
        Duration::from_secs(10),
    );
    assert!(!bad_listen.status.success());
    let bad_workers = run_to_end(
        Command::new(TERN)
            .arg("serve")
            .arg(&site.root)
            .args(["--workers", "many"]),
        Duration::from_secs(10),
    );
    assert!(!bad_workers.status.success());
}

#[test]
fn help_exits_0() {
    let top = run_to_end(Command::new(TERN).arg("--help"), Duration::from_secs(10));
    assert!(top.status.success());
    assert!(top.stdout.contains("serve"), "{}", top.stdout);
    let serve = run_to_end(
        Command::new(TERN).args(["serve", "--help"]),
        Duration::from_secs(10),
    );
    assert!(serve.status.success());
    for flag in [
        "--listen",
        "--workers",
        "--serve-dotfiles",
        "--shutdown-grace",
        "<DIR>",
    ] {
        assert!(serve.stdout.contains(flag), "serve --help lacks {flag}");
    }
}

#[test]
fn top_level_help_mentions_listen() {
    let top = run_to_end(Command::new(TERN).arg("--help"), Duration::from_secs(10));
    assert!(top.status.success());
    assert!(top.stdout.contains("--listen"), "{}", top.stdout);
}

#[test]
fn startup_line_names_the_canonical_root_and_workers() {
    let site = Site::new();
    std::os::unix::fs::symlink(&site.root, site.base().join("link-to-site")).unwrap();
    // Tern::start asserts the line names the canonical directory and the worker count.
    let tern = Tern::start(&site.base().join("link-to-site"), &["--workers", "1"]);
    assert_eq!(tern.get("/nope").status, 404);
    let tern3 = Tern::start(&site.root, &["--workers", "3"]);
    assert_eq!(tern3.get("/nope").status, 404);
}
