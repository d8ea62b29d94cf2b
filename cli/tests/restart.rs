//! Restart on the same port: a new tern binds beside the old one (`SO_REUSEPORT`), the old one
//! gets SIGTERM and exits 0, and nothing that was waiting for the old one is reset.
//! (stress/restart.py does the same under continuous load; this is the bounded, deterministic
//! core of it.)

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use crate::support;
use support::{request_bytes, serve_command, Client, Tern};

const PAGE: &[u8] = b"restart test page\n";

/// `tern serve DIR --listen LISTEN --workers 2`, waiting for its start-up line.
fn start(dir: &Path, listen: &str) -> Tern {
    Tern::spawn(serve_command(dir, &["--listen", listen], &[] as &[&str]))
}

#[test]
fn restart_on_the_same_port_resets_nothing() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("index.html"), PAGE).unwrap();
    let mut old = start(site.path(), "127.0.0.1:0");
    let port = old.addr().port();

    // An idle keep-alive connection on the old process.
    let mut idle = Client::connect(old.addr());
    assert_eq!(idle.get("/index.html", &[]).body, PAGE);

    let new = start(site.path(), &format!("127.0.0.1:{port}"));
    assert_eq!(new.addr().port(), port, "the new process shares the port");

    // Freeze the old process so the next connections wait in the accept queues (about half
    // of them in the old process's), then SIGTERM it and let it run: it must serve what was
    // queued for it rather than let the kernel reset it when its listeners close.
    old.signal(libc::SIGSTOP);
    let mut queued: Vec<Client> = (0..40)
        .map(|_| {
            let mut c = Client::connect(old.addr());
            c.send(&request_bytes("GET", "/index.html", &[]));
            c
        })
        .collect();
    old.signal(libc::SIGTERM);
    old.signal(libc::SIGCONT);

    for (i, c) in queued.iter_mut().enumerate() {
        let r = c
            .try_read_response(false)
            .unwrap_or_else(|e| panic!("queued client {i}: {e}"));
        assert_eq!(r.status, 200, "queued client {i}");
        assert_eq!(r.body, PAGE, "queued client {i}");
    }
    let exit = old.wait_exit(Duration::from_secs(8));
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "old process exits 0");

    // The idle keep-alive connection was closed cleanly (EOF, not a reset): read on the
    // socket itself, since the client counts a reset as a close.
    assert_eq!(idle.buffered(), 0);
    let mut rest = Vec::new();
    assert_eq!(
        idle.stream.read_to_end(&mut rest).map_err(|e| e.kind()),
        Ok(0)
    );

    // And the port is still served, by the new process.
    assert_eq!(new.get("/index.html").body, PAGE);
}
