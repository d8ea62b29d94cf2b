//! Upstream groups of `tern run`'s proxy routes against real upstream servers: weights and
//! backup servers, retries of idempotent requests (connect failures, 502/503/504 answers)
//! within a tries count and a time budget, and active health checks taking a server out and
//! bringing it back.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
        let tern = Tern::start_run(&self.path());
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

/// The value of a `/metrics` sample (a line `NAME VALUE`, labels in NAME).
fn metric(tern: &Tern, name: &str) -> u64 {
    let page = tern.get("/metrics").text();
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{page}"))
        .trim()
        .parse()
        .unwrap()
}

/// The retries of cause `cause` of the upstream group of route `path` (site "app").
fn retries(tern: &Tern, path: &str, cause: &str) -> u64 {
    metric(
        tern,
        &format!("tern_upstream_retries_total{{upstream=\"app {path}\",cause=\"{cause}\"}}"),
    )
}

#[test]
fn idempotent_requests_go_on_after_refusals_and_retried_statuses_within_tries_and_budget() {
    let failing = App::start("failing", 503);
    let good = App::start("good", 200);
    let slow = {
        // Answers 503 after 1.2 s: past a 1 s budget, so the 503 goes to the client.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut r = BufReader::new(s.try_clone().unwrap());
                    while read_head(&mut r).is_some() {
                        std::thread::sleep(std::time::Duration::from_millis(1200));
                        let _ = s.write_all(b"HTTP/1.1 503 X\r\nContent-Length: 4\r\n\r\nslow");
                    }
                });
            }
        });
        addr
    };
    let (dead1, dead2) = (refusing(), refusing());
    let pair = [failing.addr.to_string(), good.addr.to_string()];
    let routes = [
        // (A retried status counts against the server's health, as in nginx: a high
        // max_fails keeps it in turn here.)
        route(
            "/status",
            &pair,
            "retry_on_status = [502, 503]\nmax_fails = 100",
        ),
        route("/once", &pair, "retry_on_status = [503]\nretries = 0"),
        route("/plain", &pair, ""),
        route(
            "/connect",
            &[dead1.to_string(), dead2.to_string(), good.addr.to_string()],
            "retries = 1\nmax_fails = 10",
        ),
        route(
            "/budget",
            &[slow.to_string(), good.addr.to_string()],
            "retry_on_status = [503]\nretry_budget = 1",
        ),
    ]
    .concat();
    let tern = Config::new(&routes).start();

    // Every GET is answered by the good server, every other one after the failing one's 503:
    // the first tries still take turns (a retry moves no cursor), so the failing server gets
    // its share of first tries, not all of them.
    for (status, body) in answers(&tern, "/status", 6) {
        assert_eq!((status, body.as_str()), (200, "good"));
    }
    assert_eq!(failing.requests(), 3);
    assert_eq!(retries(&tern, "/status", "status"), 3);
    // A POST may have been acted on: its 503 goes to the client.
    let mut c = tern.client();
    let posts: Vec<u16> = (0..2)
        .map(|_| {
            c.send(b"POST /status HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx");
            c.read_response(false).status
        })
        .collect();
    assert_eq!(posts, [503, 200]);
    assert_eq!(failing.requests(), 4);
    // No further server allowed, or no status retried: the 503 goes through.
    let once: Vec<u16> = answers(&tern, "/once", 2).iter().map(|a| a.0).collect();
    assert!(once.contains(&503) && once.contains(&200), "{once:?}");
    let plain: Vec<u16> = answers(&tern, "/plain", 2).iter().map(|a| a.0).collect();
    assert!(plain.contains(&503) && plain.contains(&200), "{plain:?}");
    assert_eq!(retries(&tern, "/status", "status"), 3);
    assert_eq!(retries(&tern, "/once", "status"), 0);
    assert_eq!(retries(&tern, "/plain", "status"), 0);

    // Refused by both dead servers, with one retry allowed: 502; the next request starts at
    // the next server in turn (the second dead one), is refused, and goes on to the good one.
    let got = answers(&tern, "/connect", 2);
    assert_eq!(got[0].0, 502, "{got:?}");
    assert_eq!(got[1], (200, "good".to_string()));
    assert_eq!(retries(&tern, "/connect", "connect"), 2);
    assert_eq!(
        metric(
            &tern,
            "tern_upstream_connect_failures_total{upstream=\"app /connect\"}"
        ),
        3
    );
    assert_eq!(retries(&tern, "/status", "connect"), 0);

    // The slow 503 came after the budget: it is the answer.
    let got = answers(&tern, "/budget", 1);
    assert_eq!(got[0], (503, "slow".to_string()));
    assert_eq!(retries(&tern, "/budget", "status"), 0);
    assert_eq!(retries(&tern, "/status", "status"), 3);
}

#[test]
fn a_server_failing_its_health_check_is_taken_out_without_a_failed_request_and_comes_back() {
    let (a, b) = (App::start("a", 200), App::start("b", 200));
    let servers = [a.addr.to_string(), b.addr.to_string()];
    // A high max_fails: the health check, not the requests, takes b out (the clients below
    // send b thousands of requests, each a retried 503, before its check fails).
    let routes = route(
        "/",
        &servers,
        "retry_on_status = [503]\nmax_fails = 1000000\n\
         health_check = { path = \"/health\", interval = 1, timeout = 1, rise = 2, fall = 1 }",
    );
    let tern = Config::new(&routes).start();
    let up = |server: &App| {
        format!(
            "tern_upstream_server_up{{upstream=\"app /\",server=\"{}\"}}",
            server.addr
        )
    };
    assert!(
        eventually(Duration::from_secs(5), || b.checks.load(Ordering::SeqCst)
            > 0),
        "b is checked"
    );
    assert_eq!(metric(&tern, &up(&b)), 1);
    // Clients all along: none may see a failure.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = {
        let (stop, done, addr) = (stop.clone(), done.clone(), tern.addr());
        std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            let mut got = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let r = c.get("/x", &[]);
                got.push((r.status, r.text()));
                done.fetch_add(1, Ordering::SeqCst);
            }
            got
        })
    };
    // b goes into maintenance: its check and its answers fail at once.
    b.health.store(500, Ordering::SeqCst);
    b.status.store(503, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(5), || metric(&tern, &up(&b)) == 0),
        "b taken out: {}",
        tern.stderr_text()
    );
    // The client's request in flight when b went out may have reached b already: count from
    // the request after it.
    let now = done.load(Ordering::SeqCst);
    assert!(eventually(Duration::from_secs(5), || done
        .load(Ordering::SeqCst)
        >= now + 2));
    let before = b.requests();
    for (status, body) in answers(&tern, "/x", 6) {
        assert_eq!((status, body.as_str()), (200, "a"));
    }
    assert_eq!(b.requests(), before, "b gets no request while out");
    assert_eq!(
        tern.log_lines("taken out").len(),
        1,
        "{}",
        tern.stderr_text()
    );
    // Back: two good checks in a row (rise = 2) bring it back into turn.
    b.status.store(200, Ordering::SeqCst);
    b.health.store(200, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(6), || metric(&tern, &up(&b)) == 1),
        "b back: {}",
        tern.stderr_text()
    );
    stop.store(true, Ordering::SeqCst);
    let got = client.join().unwrap();
    assert!(got.len() > 10, "{}", got.len());
    assert!(got.iter().all(|(s, _)| *s == 200), "{got:?}");
    // (The clients are done: these take turns alone.)
    let bodies: Vec<String> = answers(&tern, "/x", 2).into_iter().map(|a| a.1).collect();
    assert!(bodies.contains(&"b".to_string()), "{bodies:?}");
    assert_eq!(
        tern.log_lines("back in turn").len(),
        1,
        "{}",
        tern.stderr_text()
    );
    let page = tern.get("/metrics").text();
    for want in [
        format!(
            "tern_upstream_health_changes_total{{upstream=\"app /\",server=\"{}\",to=\"down\"}} 1",
            b.addr
        ),
        format!(
            "tern_upstream_health_changes_total{{upstream=\"app /\",server=\"{}\",to=\"up\"}} 1",
            b.addr
        ),
        format!(
            "tern_upstream_health_checks_total{{upstream=\"app /\",server=\"{}\",result=\"ok\"}}",
            a.addr
        ),
    ] {
        assert!(page.contains(&want), "missing {want} in\n{page}");
    }
    if have_promtool() {
        promtool_accepts("/metrics with health checks", &page);
    }
    let statusz = tern.get("/statusz").text();
    assert!(
        statusz.contains(&format!(
            "upstream_server_up{{upstream=\"app /\",server=\"{}\"}}: 1",
            b.addr
        )),
        "{statusz}"
    );
}
