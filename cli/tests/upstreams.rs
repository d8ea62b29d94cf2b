//! Upstream groups of `tern run`'s proxy routes against real upstream servers: weights and
//! backup servers, retries of idempotent requests (connect failures, 502/503/504 answers)
//! within a tries count and a time budget, and active health checks taking a server out and
//! bringing it back.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;

use support::*;

/// An upstream server on 127.0.0.1 that answers every request (a thread per connection,
/// keep-alive) with `status` and its own `name` as the body; `status` can be changed while
/// it runs. Counts the requests it answered by path kind (health checks apart).
struct App {
    addr: SocketAddr,
    status: Arc<AtomicU16>,
    /// Status of `/health` answers.
    health: Arc<AtomicU16>,
    requests: Arc<AtomicUsize>,
    checks: Arc<AtomicUsize>,
}

impl App {
    fn start(name: &'static str, status: u16) -> App {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let app = App {
            addr,
            status: Arc::new(AtomicU16::new(status)),
            health: Arc::new(AtomicU16::new(200)),
            requests: Arc::new(AtomicUsize::new(0)),
            checks: Arc::new(AtomicUsize::new(0)),
        };
        let (status, health, requests, checks) = (
            app.status.clone(),
            app.health.clone(),
            app.requests.clone(),
            app.checks.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                stream.set_nodelay(true).unwrap();
                let (status, health, requests, checks) = (
                    status.clone(),
                    health.clone(),
                    requests.clone(),
                    checks.clone(),
                );
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    while let Some(path) = read_head(&mut reader) {
                        let code = if path == "/health" {
                            checks.fetch_add(1, Ordering::SeqCst);
                            health.load(Ordering::SeqCst)
                        } else {
                            requests.fetch_add(1, Ordering::SeqCst);
                            status.load(Ordering::SeqCst)
                        };
                        let answer = format!(
                            "HTTP/1.1 {code} X\r\nContent-Length: {}\r\n\r\n{name}",
                            name.len()
                        );
                        if stream.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        app
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads a request head (requests here have no body); its path, or None at EOF.
fn read_head(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut first = String::new();
    if r.read_line(&mut first).ok()? == 0 {
        return None;
    }
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
    }
    first.split(' ').nth(1).map(str::to_owned)
}

/// An address nothing listens on: connections are refused.
fn refusing() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

struct Config {
    dir: tempfile::TempDir,
}

impl Config {
    fn new(routes: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[[site]]\nname = \"app\"\ndefault = true\n{routes}\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\
             [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n"
        );
        std::fs::write(dir.path().join("tern.toml"), text).unwrap();
        Config { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("tern.toml")
    }

    /// `tern run` on it, one worker (so balancing is one worker's turn), sandboxed.
    fn start(&self) -> Tern {
        let mut cmd = Command::new(TERN);
        cmd.arg("run").arg("--config").arg(self.path());
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--sandbox",
            "on",
            "--workers",
            "1",
        ]);
        let tern = Tern::spawn(cmd);
        assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
        tern
    }
}

fn route(path: &str, servers: &[String], extra: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[[site.route]]\npath = \"{path}\"\nproxy = [{}]\n{extra}\n",
        list.join(", ")
    )
}

/// Bodies of `n` GETs of `path` on one connection, with their statuses.
fn answers(tern: &Tern, path: &str, n: usize) -> Vec<(u16, String)> {
    let mut c = tern.client();
    (0..n)
        .map(|_| {
            let r = c.get(path, &[]);
            (r.status, r.text())
        })
        .collect()
}

#[test]
fn weights_share_requests_and_backups_stand_in_only_when_every_primary_is_down() {
    let (a, b, spare) = (
        App::start("a", 200),
        App::start("b", 200),
        App::start("spare", 200),
    );
    let dead = refusing();
    let routes = format!(
        "{}{}",
        route(
            "/w",
            &[
                format!("{} weight=3", a.addr),
                b.addr.to_string(),
                format!("{} backup", spare.addr)
            ],
            "",
        ),
        route(
            "/b",
            &[dead.to_string(), format!("{} backup", spare.addr)],
            "max_fails = 1\nfail_timeout = 30",
        ),
    );
    let tern = Config::new(&routes).start();
    let got = answers(&tern, "/w", 8);
    assert_eq!(
        got.iter().map(|(_, b)| b.as_str()).collect::<Vec<_>>(),
        ["a", "a", "b", "a", "a", "a", "b", "a"],
        "3:1, spread (smooth weighted round-robin)"
    );
    assert_eq!(
        spare.requests(),
        0,
        "a backup is idle while a primary is up"
    );
    // The only primary refuses: the backup answers, also while the primary is skipped.
    for (status, body) in answers(&tern, "/b", 4) {
        assert_eq!((status, body.as_str()), (200, "spare"));
    }
    assert_eq!(spare.requests(), 4);
}
