//! Upstream groups of `tern run`'s proxy routes against real upstream servers: weights and
//! backup servers, retries of idempotent requests (connect failures, 502/503/504 answers)
//! within a tries count and a time budget, and active health checks taking a server out and
//! bringing it back.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support;
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

/// Body bytes the apps of this file were sent (bodies of a declared length).
static BODY_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Reads a request head and its body, if it declares a length; its path, or None at EOF.
fn read_head(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut first = String::new();
    if r.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let mut length = 0;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    std::io::Read::read_exact(r, &mut body).ok()?;
    BODY_BYTES.fetch_add(length, Ordering::SeqCst);
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

/// The retries of cause `cause` of the upstream group of route `path` (site "app").
fn retries(tern: &Tern, path: &str, cause: &str) -> u64 {
    tern.metric(&format!(
        "tern_upstream_retries_total{{upstream=\"app {path}\",cause=\"{cause}\"}}"
    ))
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
        tern.metric("tern_upstream_connect_failures_total{upstream=\"app /connect\"}"),
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
    assert_eq!(tern.metric(&up(&b)), 1);
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
        eventually(Duration::from_secs(5), || tern.metric(&up(&b)) == 0),
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
        eventually(Duration::from_secs(6), || tern.metric(&up(&b)) == 1),
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

/// Waits until the wall clock is early in a second, so that requests sent now are judged
/// within one second of the limiter's refill (it pays debt back at whole seconds).
fn early_in_a_second() {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = since.subsec_millis();
    if into > 600 {
        std::thread::sleep(Duration::from_millis(u64::from(1000 - into) + 20));
    }
}

/// nginx's `limit_req burst=` without `nodelay`: requests past the burst wait their turn on
/// the connection's timer, let through at the rate, and past the queue are refused at once;
/// the worker (one here) answers others meanwhile. Loopback is limited when `exempt` says
/// so.
#[test]
fn a_rate_limit_queue_delays_requests_at_the_rate_without_holding_the_worker() {
    let app = App::start("app", 200);
    let servers = [app.addr.to_string()];
    let routes = format!(
        "{}{}",
        route(
            "/login",
            &servers,
            "rate_limit = { per_second = 2, burst = 1, queue = 2, exempt = \"\" }",
        ),
        route("/open", &servers, ""),
    );
    let tern = Config::new(&routes).start();
    early_in_a_second();
    let started = std::time::Instant::now();
    let asked: Vec<_> = (0..4)
        .map(|i| {
            let addr = tern.addr();
            // One at a time into the limiter, each on its own connection, in order.
            std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 15 }));
            std::thread::spawn(move || {
                let mut c = support::Client::connect(addr);
                // The third, held a second, carries a body: it waits with it.
                let r = if i == 2 {
                    c.send(b"POST /login HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello");
                    c.read_response(false)
                } else {
                    c.get("/login", &[])
                };
                (r.status, started.elapsed())
            })
        })
        .collect();
    // While two wait, the worker answers another route at once.
    let open = tern.get("/open");
    let open_took = started.elapsed();
    assert_eq!(open.status, 200);
    let got: Vec<(u16, Duration)> = asked.into_iter().map(|t| t.join().unwrap()).collect();
    let statuses: Vec<u16> = got.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "{got:?}");
    let ms = |d: Duration| d.as_millis() as u64;
    assert!(ms(got[0].1) < 400, "the first is not held: {got:?}");
    assert!(
        ms(got[3].1) < 400,
        "past the queue, refused at once: {got:?}"
    );
    assert!(
        (480..1400).contains(&ms(got[1].1)),
        "the second waits half a second: {got:?}"
    );
    assert!(
        (980..1900).contains(&ms(got[2].1)),
        "the third a second: {got:?}"
    );
    assert!(
        ms(open_took) < 400,
        "the worker was held: {open_took:?}, {got:?}"
    );
    assert_eq!(app.requests(), 4, "three limited, one open");
    assert_eq!(BODY_BYTES.load(Ordering::SeqCst), 5);
}

/// Behind a local tunnel or proxy every peer is loopback: with `trusted_proxies`, the limit
/// counts the client the proxy names, and loopback itself stays exempt (by default).
#[test]
fn a_rate_limit_counts_the_client_a_trusted_proxy_names() {
    let app = App::start("app", 200);
    let servers = [app.addr.to_string()];
    let routes = route(
        "/login",
        &servers,
        "rate_limit = { per_second = 1, burst = 1, trusted_proxies = \"127.0.0.1, ::1\" }",
    );
    let tern = Config::new(&routes).start();
    early_in_a_second();
    let from = |client: &str| {
        tern.get_with("/login", &[("X-Forwarded-For", client)])
            .status
    };
    assert_eq!(from("198.51.100.7"), 200);
    assert_eq!(from("198.51.100.7"), 429, "the named client is limited");
    assert_eq!(
        from("203.0.113.9"),
        200,
        "another client has its own bucket"
    );
    // A request of the proxy's own (no client named) is loopback's: exempt.
    for _ in 0..3 {
        assert_eq!(tern.get("/login").status, 200);
    }
}
