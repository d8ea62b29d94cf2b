//! The reverse proxy (`proxy = ...` routes of `tern run`) against fake upstream servers that
//! behave well and badly: pooled keep-alive connections (one upstream connection for many
//! requests), heads rewritten both ways, chunked, close-delimited and 1xx answers, 100-continue,
//! malformed and huge heads (502), upstreams that die mid-answer, stall (504) or refuse (502,
//! and the next server), a dead pooled connection retried once for an idempotent request,
//! smuggling attempts, a WebSocket echo, 1 GiB each way with tern's memory bounded, Python's
//! http.server as a real app server, a Unix socket upstream, and SIGHUP under load.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{h2_support, support, tls_support};
use support::*;

/// One request as a fake upstream received it.
#[derive(Debug, Clone)]
struct Seen {
    head: String,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    fn line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }
}

/// What a fake upstream does with a request: write an answer on the stream; false closes
/// the connection.
type Script = dyn Fn(&Seen, &mut TcpStream, usize) -> bool + Send + Sync;

/// A fake upstream on 127.0.0.1: one thread per connection, counting connections and
/// recording requests.
struct Upstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    fn start(
        script: impl Fn(&Seen, &mut TcpStream, usize) -> bool + Send + Sync + 'static,
    ) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let (c, s, st) = (connections.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut stream) = stream else { continue };
                // Answers are written in pieces: without this, Nagle and delayed ACKs would
                // hold each second piece back 40 ms.
                stream.set_nodelay(true).unwrap();
                c.fetch_add(1, Ordering::SeqCst);
                let (s, script) = (s.clone(), script.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut n = 0;
                    while let Some(req) = read_request(&mut reader) {
                        s.lock().unwrap().push(req.clone());
                        n += 1;
                        if !script(&req, &mut stream, n) {
                            return;
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            connections,
            seen,
            stop,
        }
    }

    /// Answers every request `200` with `body` and keeps the connection.
    fn ok(body: &'static str) -> Upstream {
        Upstream::start(move |_, s, _| {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(body.as_bytes()).unwrap();
            true
        })
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Reads one request (head, and a Content-Length or chunked body) or None at EOF.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<Seen> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let seen = Seen {
        head,
        body: Vec::new(),
    };
    let mut body = Vec::new();
    if let Some(n) = seen.header("content-length") {
        let n: usize = n.parse().unwrap();
        let mut left = n;
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let want = left.min(buf.len());
            let k = r.read(&mut buf[..want]).ok()?;
            if k == 0 {
                return None;
            }
            // Large bodies are counted, not kept.
            if n <= 1 << 20 {
                body.extend_from_slice(&buf[..k]);
            }
            left -= k;
        }
        if n > 1 << 20 {
            body = n.to_string().into_bytes();
        }
    } else if seen
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end).ok()?;
                break;
            }
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk).ok()?;
            body.extend_from_slice(&chunk[..n]);
        }
    }
    Some(Seen { body, ..seen })
}

/// A `tern run` config folder with a proxy route (and anything else given).
struct Proxy {
    dir: tempfile::TempDir,
}

impl Proxy {
    fn new() -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("conf")).unwrap();
        Proxy { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("conf/tern.toml")
    }

    fn write(&self, text: &str) {
        let tmp = self.dir.path().join("conf/tern.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.config()).unwrap();
    }

    /// `tern run` with `routes` (TOML of `[[site.route]]` tables) on one default site.
    fn start(&self, routes: &str, extra: &[&str]) -> Tern {
        self.write(&site(routes));
        let mut cmd = Command::new(TERN);
        cmd.arg("run").arg("--config").arg(self.config());
        cmd.args(["--listen", "127.0.0.1:0", "--sandbox", "on"]);
        if !extra.contains(&"--workers") {
            cmd.args(["--workers", "2"]);
        }
        cmd.args(extra);
        let tern = Tern::spawn(cmd);
        assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
        tern
    }
}

fn site(routes: &str) -> String {
    format!("[[site]]\nname = \"app\"\ndefault = true\n{routes}")
}

fn proxy_route(path: &str, upstreams: &[SocketAddr], extra: &str) -> String {
    let list: Vec<String> = upstreams.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[site.route]]\npath = \"{path}\"\nproxy = [{}]\n{extra}\n",
        list.join(", ")
    )
}

#[test]
fn requests_reach_the_upstream_rewritten_and_answers_come_back_rewritten() {
    let up = Upstream::start(|req, s, _| {
        let body = format!("you asked {}", req.line());
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive, X-Up-Secret\r\n\
             X-Up-Secret: hidden\r\nKeep-Alive: timeout=5\r\nServer: upstream/1\r\n\
             Date: Mon, 01 Jan 2001 00:00:00 GMT\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        if !req.line().starts_with("HEAD") {
            s.write_all(body.as_bytes()).unwrap();
        }
        true
    });
    let p = Proxy::new();
    let tern = p.start(
        &proxy_route(
            "/",
            &[up.addr],
            "add_headers = { \"X-Route\" = \"proxied\" }",
        ),
        &[],
    );
    let mut c = tern.client();
    let r = c.get(
        "/some/path?q=1",
        &[
            ("Connection", "keep-alive, X-Client-Secret"),
            ("X-Client-Secret", "s"),
            ("X-Forwarded-For", "6.6.6.6"),
            ("Proxy-Authorization", "Basic abc"),
            ("Cookie", "c=3"),
        ],
    );
    assert_eq!(r.status, 200, "{}", tern.stderr_text());
    assert_eq!(r.text(), "you asked GET /some/path?q=1 HTTP/1.1");
    assert_eq!(r.header("x-route"), Some("proxied"));
    assert_eq!(r.header("server"), Some("tern"));
    assert!(
        r.header("x-up-secret").is_none(),
        "a field the upstream's Connection names is dropped"
    );
    assert!(r.header("keep-alive").is_none());
    let cookies: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(cookies, ["a=1", "b=2"]);

    let seen = &up.seen()[0];
    assert_eq!(seen.line(), "GET /some/path?q=1 HTTP/1.1");
    assert_eq!(seen.header("host").as_deref(), Some("test"));
    assert_eq!(
        seen.header("x-forwarded-for").as_deref(),
        Some("127.0.0.1"),
        "a client's own X-Forwarded-For is replaced"
    );
    assert_eq!(seen.header("x-forwarded-proto").as_deref(), Some("http"));
    assert_eq!(seen.header("x-forwarded-host").as_deref(), Some("test"));
    assert_eq!(
        seen.header("forwarded").as_deref(),
        Some("for=127.0.0.1;proto=http;host=\"test\"")
    );
    assert_eq!(seen.header("cookie").as_deref(), Some("c=3"));
    for gone in [
        "x-client-secret",
        "proxy-authorization",
        "connection",
        "keep-alive",
    ] {
        assert!(
            seen.header(gone).is_none(),
            "{gone} reached the upstream:\n{}",
            seen.head
        );
    }

    // HEAD keeps the length; a POST body goes through with a length.
    let r = c.request("HEAD", "/h", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    c.send(b"POST /form HTTP/1.1\r\nHost: test\r\nContent-Length: 11\r\n\r\nhello=world");
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    let seen = up.seen();
    assert_eq!(seen[2].line(), "POST /form HTTP/1.1");
    assert_eq!(seen[2].body, b"hello=world");
    assert_eq!(seen[2].header("content-length").as_deref(), Some("11"));
}

#[test]
fn one_pooled_upstream_connection_serves_many_requests() {
    let up = Upstream::ok("pong");
    let p = Proxy::new();
    let routes = format!(
        "{}[[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n",
        proxy_route("/", &[up.addr], "")
    );
    let tern = p.start(&routes, &[]);
    let mut c = tern.client();
    for i in 0..50 {
        let r = c.get(&format!("/ping/{i}"), &[]);
        assert_eq!((r.status, r.text().as_str()), (200, "pong"));
    }
    // Pipelined: answered in order through the same upstream connection.
    let mut batch = Vec::new();
    for i in 0..10 {
        batch.extend(request_bytes("GET", &format!("/p/{i}"), &[]));
    }
    c.send(&batch);
    for _ in 0..10 {
        assert_eq!(c.read_response(false).text(), "pong");
    }
    assert_eq!(
        up.connections(),
        1,
        "the upstream saw one connection for 60 requests"
    );
    assert_eq!(up.seen().len(), 60);
    // The counters say so too (a `counters` route, for this machine only).
    assert_eq!(tern.counter_at("/statusz", "upstream_connects"), 1);
    assert_eq!(tern.counter_at("/statusz", "upstream_reuses"), 59);
    assert_eq!(tern.counter_at("/statusz", "upstream_failures"), 0);
    // The same for the route's group, by its label: the only group, so the same figures.
    let group = "{upstream=\"app /\"}";
    for (name, want) in [("upstream_connects", 1), ("upstream_reuses", 59)] {
        assert_eq!(tern.counter_at("/statusz", &format!("{name}{group}")), want);
    }
}

#[test]
fn chunked_close_delimited_and_interim_answers_are_reframed() {
    let up = Upstream::start(|req, s, _| match req.line().split(' ').nth(1).unwrap() {
        "/chunked" => {
            s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 1\r\n\r\n").unwrap();
            true
        }
        "/close" => {
            s.write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
                .unwrap();
            false
        }
        "/hints" => {
            s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n").unwrap();
            true
        }
        _ => {
            s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                .unwrap();
            true
        }
    });
    let p = Proxy::new();
    let tern = p.start(&proxy_route("/", &[up.addr], ""), &[]);
    let mut c = tern.client();
    c.chunked_ok = true;
    for path in ["/chunked", "/close"] {
        c.send(&request_bytes("GET", path, &[]));
        let raw = read_raw_response(&mut c);
        assert!(raw.contains("Transfer-Encoding: chunked\r\n"), "{raw}");
        assert!(
            !raw.contains("Trailer"),
            "trailers are dropped, and so is their announcement: {raw}"
        );
    }
    let r = c.get("/chunked", &[]);
    assert_eq!(r.text(), "hello world");
    let r = c.get("/close", &[]);
    assert_eq!(r.text(), "until the end");
    // 103 goes to the client before the answer; the upstream's 100 does not (ours was sent).
    c.send(&request_bytes("GET", "/hints", &[]));
    let first = c.read_response(true);
    assert_eq!(first.status, 103);
    assert_eq!(first.header("link"), Some("</style.css>; rel=preload"));
    let second = c.read_response(false);
    assert_eq!(second.status, 204);

    // An HTTP/1.0 client gets an unsized body delimited by the close.
    let mut old = TcpStream::connect(tern.addr()).unwrap();
    old.write_all(b"GET /chunked HTTP/1.0\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut all = String::new();
    old.read_to_string(&mut all).unwrap();
    assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all}");
    assert!(!all.contains("chunked"), "{all}");
    assert!(all.ends_with("\r\n\r\nhello world"), "{all}");
}

/// The head of one response (its body read and dropped), as text.
fn read_raw_response(c: &mut Client) -> String {
    let r = c.read_response(false);
    let mut text = format!("HTTP/1.1 {}\r\n", r.status);
    for (n, v) in &r.headers {
        text.push_str(&format!("{n}: {v}\r\n"));
    }
    text
}

#[test]
fn malformed_and_ambiguous_upstream_answers_become_502_and_the_client_goes_on() {
    let up = Upstream::start(|req, s, _| {
        let answer: &[u8] = match req.line().split(' ').nth(1).unwrap() {
            "/both" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "/two-lengths" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            "/garbage" => b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
            "/bare-lf" => b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
            "/gzip-te" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",
            "/huge" => {
                let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
                for i in 0..2000 {
                    head.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "y".repeat(20)).as_bytes());
                }
                head.extend_from_slice(b"Content-Length: 0\r\n\r\n");
                let _ = s.write_all(&head);
                return false;
            }
            "/bad-chunk" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        };
        let _ = s.write_all(answer);
        false // a broken server's connection is never reused anyway
    });
    let p = Proxy::new();
    let tern = p.start(&proxy_route("/", &[up.addr], ""), &[]);
    let mut c = tern.client();
    c.chunked_ok = true;
    for path in [
        "/both",
        "/two-lengths",
        "/garbage",
        "/bare-lf",
        "/gzip-te",
        "/huge",
    ] {
        let r = c.get(path, &[]);
        assert_eq!(r.status, 502, "{path}: {}", r.text());
        assert!(r.text().starts_with("bad gateway"), "{path}: {}", r.text());
        let ok = c.get("/fine", &[]);
        assert_eq!((ok.status, ok.text().as_str()), (200, "ok"), "after {path}");
    }
    // A broken chunk after the head was passed on: the client's connection is cut (it sees
    // no final chunk), never left out of step.
    c.send(&request_bytes("GET", "/bad-chunk", &[]));
    let r = c.try_read_response(false);
    assert!(
        r.is_err(),
        "a cut-short chunked body cannot parse as complete: {r:?}"
    );
}

#[test]
fn an_upstream_that_dies_mid_answer_cuts_the_client_short() {
    let up = Upstream::start(|_, s, _| {
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            .unwrap();
        s.write_all(&[b'x'; 100]).unwrap();
        false
    });
    let p = Proxy::new();
    let tern = p.start(&proxy_route("/", &[up.addr], ""), &[]);
    let mut c = tern.client();
    c.send(&request_bytes("GET", "/", &[]));
    let head = c.read_head_only();
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(1000));
    let got = c.read_exact_raw_by(100, 100);
    assert_eq!(got.len(), 100);
    assert!(
        c.closed_within(Duration::from_secs(5)),
        "the client connection must close"
    );
}

#[test]
fn slow_unreachable_and_failing_upstreams_get_504_502_and_are_skipped() {
    let slow = Upstream::start(|_, s, _| {
        std::thread::sleep(Duration::from_millis(2500));
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate");
        true
    });
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap() // closed when `l` drops: connections are refused
    };
    let good = Upstream::ok("good");
    let p = Proxy::new();
    let routes = format!(
        "{}{}{}",
        proxy_route("/slow", &[slow.addr], "first_byte_timeout = 1"),
        proxy_route("/dead", &[dead], ""),
        proxy_route(
            "/mixed",
            &[dead, good.addr],
            "max_fails = 1\nfail_timeout = 30"
        ),
    );
    let tern = p.start(&routes, &[]);
    let mut c = tern.client();
    let t = Instant::now();
    let r = c.get("/slow", &[]);
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(
        t.elapsed() < Duration::from_millis(2400),
        "{:?}",
        t.elapsed()
    );
    let r = c.get("/dead", &[]);
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(
        r.text(),
        "bad gateway: no upstream server could be reached\n"
    );
    // With a dead and a good server, every request is answered (the dead one is tried
    // once, then skipped for fail_timeout).
    for _ in 0..20 {
        let r = c.get("/mixed", &[]);
        assert_eq!((r.status, r.text().as_str()), (200, "good"));
    }
    assert_eq!(
        tern.log_lines("cannot connect to upstream").len(),
        2,
        "{}",
        tern.stderr_text()
    );
}

#[test]
fn a_dead_pooled_connection_is_retried_once_for_idempotent_requests_only() {
    // Answers the first request on a connection; on the second it hangs up without a word,
    // as a server whose keep-alive ran out just as the request arrived.
    let up = Upstream::start(|_, s, n| {
        if n >= 2 {
            return false;
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .unwrap();
        true
    });
    let p = Proxy::new();
    let routes = format!(
        "{}[[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n",
        proxy_route("/", &[up.addr], "")
    );
    let tern = p.start(&routes, &["--workers", "1"]);
    let mut c = tern.client();
    assert_eq!(c.get("/a", &[]).status, 200);
    let r = c.get("/b", &[]);
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "ok"),
        "GET retried on a fresh connection"
    );
    assert_eq!(up.connections(), 2);
    // A POST is not repeated: the upstream may have acted on it.
    c.send(b"POST /c HTTP/1.1\r\nHost: test\r\nContent-Length: 1\r\n\r\nx");
    let r = c.read_response(false);
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(up.connections(), 2);
    let metrics = tern.get("/metrics").text();
    assert!(
        metrics.contains(
            "\ntern_upstream_retries_total{upstream=\"app /\",cause=\"stale_connection\"} 1\n"
        ),
        "{metrics}"
    );
}

#[test]
fn expect_100_continue_and_streamed_chunked_uploads() {
    let up = Upstream::start(|req, s, _| {
        let body = format!("{} bytes", req.body.len());
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        true
    });
    let p = Proxy::new();
    let tern = p.start(&proxy_route("/", &[up.addr], ""), &[]);
    let mut c = tern.client();
    c.send(
        b"PUT /up HTTP/1.1\r\nHost: test\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n",
    );
    let interim = c.read_head_only();
    assert_eq!(interim.status, 100);
    c.send(&[b'a'; 5000]);
    let r = c.read_response(false);
    assert_eq!(r.text(), "5000 bytes");
    // Chunked in, chunked out (re-chunked: the sizes are tern's, the bytes the same).
    c.send(b"POST /up HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.text(), "7 bytes");
    let seen = up.seen();
    assert!(
        seen[0].header("expect").is_none(),
        "Expect is answered by tern, not passed on"
    );
    assert_eq!(seen[1].body, b"abcdefg");
    assert_eq!(
        seen[1].header("transfer-encoding").as_deref(),
        Some("chunked")
    );
    assert!(seen[1].header("x-trailer").is_none());
}

#[test]
fn smuggling_attempts_never_reach_the_upstream_as_two_requests() {
    let up = Upstream::ok("ok");
    let p = Proxy::new();
    let tern = p.start(&proxy_route("/", &[up.addr], ""), &[]);
    let attempts: &[&[u8]] = &[
        b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: test\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nGET /admin HTTP/1.1\r\nHost: test\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding:\tchunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n Transfer-Encoding: chunked\r\n\r\nhello",
        b"POST / HTTP/1.1\nHost: test\nContent-Length: 5\n\nhelloGET /admin HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0x0\r\n\r\nGET /admin HTTP/1.1\r\n\r\n",
    ];
    for raw in attempts {
        let mut c = tern.client();
        c.send(raw);
        let r = c.read_response(false);
        assert!(
            r.status == 400 || r.status == 501,
            "{}: {}",
            String::from_utf8_lossy(raw),
            r.status
        );
        assert!(c.closed_within(Duration::from_secs(5)));
    }
    let seen = up.seen();
    assert!(
        seen.iter().all(|s| !s.line().contains("/admin")),
        "{seen:?}"
    );
    // A chunked body that holds a request is a body, one request upstream.
    let mut c = tern.client();
    c.send(b"POST /x HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n23\r\nGET /admin HTTP/1.1\r\nHost: test\r\n\r\n\r\n0\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
    let seen = up.seen();
    assert_eq!(
        seen.iter()
            .filter(|s| s.line().starts_with("POST /x"))
            .count(),
        1
    );
    assert!(
        seen.iter().all(|s| !s.line().contains("/admin")),
        "{seen:?}"
    );
}

#[test]
fn websocket_upgrades_are_relayed_both_ways() {
    let up = Upstream::start(|req, s, _| {
        assert_eq!(req.header("upgrade").as_deref(), Some("websocket"));
        assert_eq!(req.header("connection").as_deref(), Some("upgrade"));
        assert!(req.header("sec-websocket-key").is_some());
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n").unwrap();
        // Echo until the client goes.
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    if s.write_all(&buf[..n]).is_err() {
                        return false;
                    }
                }
            }
        }
    });
    let p = Proxy::new();
    let tern = p.start(
        &proxy_route("/ws", &[up.addr], "upstream_idle_timeout = 2"),
        &[],
    );
    let mut c = tern.client();
    c.send(b"GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    let r = c.read_head_only();
    assert_eq!(r.status, 101);
    assert_eq!(r.header("upgrade"), Some("websocket"));
    assert_eq!(
        r.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    // Frames are opaque to tern: any bytes go through, in order, both ways.
    for i in 0..20u8 {
        let frame: Vec<u8> = (0..(100 + i as usize * 300))
            .map(|k| (k as u8) ^ i)
            .collect();
        c.send(&frame);
        assert_eq!(c.read_exact_raw(frame.len()), frame);
    }
    // Idle for longer than upstream_idle_timeout: closed.
    assert!(c.closed_within(Duration::from_secs(5)));
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: libc::pid_t) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_gibibyte_each_way_streams_through_with_bounded_memory() {
    const SIZE: u64 = 1 << 30;
    let up = Upstream::start(|req, s, _| {
        if req.line().starts_with("GET") {
            s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes())
                .unwrap();
            let chunk = vec![7u8; 256 * 1024];
            let mut left = SIZE;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                if s.write_all(&chunk[..n]).is_err() {
                    return false;
                }
                left -= n as u64;
            }
        } else {
            // The body was read (and counted) by read_request.
            let body = String::from_utf8_lossy(&req.body).into_owned();
            s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .unwrap();
        }
        true
    });
    let p = Proxy::new();
    let tern = p.start(&proxy_route("/", &[up.addr], ""), &[]);
    let pid = tern.pid();
    let before = rss_kib(pid);
    let peak = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid) as usize, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // Download.
    let mut s = TcpStream::connect(tern.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::with_capacity(256 * 1024, s.try_clone().unwrap());
    let mut line = String::new();
    let mut length = 0u64;
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        if line == "\r\n" {
            break;
        }
    }
    assert_eq!(length, SIZE);
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    while got < SIZE {
        let n = reader.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {got} bytes");
        assert!(buf[..n].iter().all(|&b| b == 7));
        got += n as u64;
    }
    // Upload, on the same connection.
    s.write_all(
        format!("PUT /big HTTP/1.1\r\nHost: test\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let chunk = vec![9u8; 256 * 1024];
    let mut left = SIZE;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    let mut answer = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; SIZE.to_string().len()];
    reader.read_exact(&mut body).unwrap();
    answer.push_str(&String::from_utf8_lossy(&body));
    assert_eq!(answer, SIZE.to_string(), "the upstream got every byte");
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let grew =
        peak.load(Ordering::Relaxed) as u64 - before.min(peak.load(Ordering::Relaxed) as u64);
    assert!(
        grew < 16 * 1024,
        "tern's RSS grew by {grew} KiB moving 2 GiB"
    );
}

#[test]
fn python_http_server_as_a_real_app_server_and_a_unix_socket_upstream() {
    let www = tempfile::tempdir().unwrap();
    std::fs::write(www.path().join("hello.txt"), "hello from python\n").unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut py = Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "-d",
        ])
        .arg(www.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(eventually(Duration::from_secs(10), || TcpStream::connect(
        addr
    )
    .is_ok()));

    // A Unix socket upstream: a tiny server answering one fixed response per request.
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("app.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut pending = Vec::new();
                loop {
                    let n = match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(end) = find(&pending, b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nunix socket")
                            .unwrap();
                    }
                }
            });
        }
    });
    let p = Proxy::new();
    let routes = format!(
        "{}[[site.route]]\npath = \"/unix\"\nproxy = \"unix:{}\"\n",
        proxy_route("/", &[addr], ""),
        sock.display()
    );
    let tern = p.start(&routes, &[]);
    let mut c = tern.client();
    let r = c.get("/hello.txt", &[]);
    assert_eq!((r.status, r.text().as_str()), (200, "hello from python\n"));
    let r = c.get("/missing", &[]);
    assert_eq!(r.status, 404);
    for _ in 0..5 {
        let r = c.get("/unix/x", &[]);
        assert_eq!((r.status, r.text().as_str()), (200, "unix socket"));
    }
    let _ = py.kill();
    let _ = py.wait();
}

#[test]
fn sighup_under_load_fails_no_request() {
    let a = Upstream::ok("a");
    let b = Upstream::ok("b");
    let p = Proxy::new();
    // b is named at start-up too (on another path): the sandbox lets the workers connect only
    // to the upstream ports it started with, and refuses a reload that needs another.
    let routes = proxy_route("/", &[a.addr], "") + &proxy_route("/later", &[b.addr], "");
    let tern = p.start(&routes, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let addr = tern.addr();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut ok, mut seen_b) = (0, false);
                let mut c = Client::connect(addr);
                while !stop.load(Ordering::Relaxed) {
                    let r = c.get("/", &[]);
                    assert_eq!(r.status, 200, "{}", r.text());
                    seen_b |= r.text() == "b";
                    ok += 1;
                    if ok % 50 == 0 {
                        c = Client::connect(addr);
                    }
                }
                (ok, seen_b)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    p.write(&site(&proxy_route("/", &[b.addr], "")));
    let line = tern.reload(1);
    assert!(line.contains("reload (SIGHUP)"), "{line}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for c in clients {
        let (ok, seen_b) = c.join().unwrap();
        assert!(
            seen_b,
            "every client reached the new upstream after the reload"
        );
        total += ok;
    }
    assert!(total > 100, "{total} requests");
}

#[test]
fn access_log_lines_carry_the_upstream_time() {
    let up = Upstream::ok("logged");
    let p = Proxy::new();
    let log: PathBuf = p.dir.path().join("access.log");
    let tern = p.start(
        &proxy_route("/", &[up.addr], ""),
        &[
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-format",
            "json",
        ],
    );
    let r = tern.get_with("/logged?x=1", &[("User-Agent", "proxy-test")]);
    assert_eq!(r.status, 200);
    assert!(eventually(Duration::from_secs(3), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("/logged"))
    }));
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.contains("/logged")).unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["method"], "GET");
    assert_eq!(v["target"], "/logged?x=1");
    assert_eq!(v["status"], 200);
    assert_eq!(v["bytes"], 6);
    assert_eq!(v["user_agent"], "proxy-test");
    assert!(v["upstream_us"].as_u64().is_some(), "{line}");
    assert!(v["duration_us"].as_u64().unwrap() >= v["upstream_us"].as_u64().unwrap() / 2);
    let _ = Path::new("");
}

#[test]
fn proxy_routes_are_checked_with_line_numbers() {
    let p = Proxy::new();
    p.write(&site(
        "[[site.route]]\npath = \"/a\"\nproxy = \"nowhere\"\n\
         [[site.route]]\npath = \"/b\"\nproxy = []\n\
         [[site.route]]\npath = \"/c\"\nproxy = \"127.0.0.1:1\"\nbalance = \"random\"\nmax_fails = 0\n\
         [[site.route]]\npath = \"/d\"\nstatic = \".\"\nkeepalive = 4\n\
         [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\ntrusted_proxies = \"10.0.0.0/8\"\n",
    ));
    let mut cmd = Command::new(TERN);
    cmd.arg("run")
        .arg("--check")
        .arg("--config")
        .arg(p.config());
    let out = run_to_end(&mut cmd, Duration::from_secs(10));
    assert!(!out.status.success());
    for want in [
        "line 6: upstream \"nowhere\": give host:port, [v6]:port or unix:/path",
        "line 9: proxy needs at least one upstream server",
        "line 13: balance \"random\": use \"round_robin\" or \"least_conn\"",
        "line 14: max_fails must be at least 1",
        "line 18: `keepalive` does not apply to a static route",
    ] {
        assert!(
            out.stderr.contains(want),
            "missing {want:?} in:\n{}",
            out.stderr
        );
    }
    // Those five and nothing else: a counters route takes trusted_proxies too.
    let problems = out.stderr.lines().filter(|l| l.contains(": line ")).count();
    assert_eq!(problems, 5, "{}", out.stderr);
}

/// What an HTTP/2 client's stream became upstream, as the upstream of
/// [`http2_a_stream_ended_by_an_empty_data_frame_has_no_body_upstream`] echoes it back.
fn echo_framing(req: &Seen, s: &mut TcpStream) -> bool {
    let body = format!(
        "{} te={} cl={} body={}",
        req.line(),
        req.header("transfer-encoding").unwrap_or_default(),
        req.header("content-length").unwrap_or_default(),
        String::from_utf8_lossy(&req.body)
    );
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    true
}

/// An HTTP/2 request whose HEADERS lack END_STREAM and whose stream then ends with an empty
/// DATA frame (how some clients send a GET) has no body: it reaches the upstream as a plain
/// bodiless request, as over HTTP/1.1 and HTTP/3, not as a chunked upload of nothing
/// (`Transfer-Encoding: chunked` on a GET). Whether the DATA comes in the same read as the
/// HEADERS or later (the request then waits undecided), the same. A body that declares its
/// length or begins still streams as before: with its length, or chunked without one.
#[test]
fn http2_a_stream_ended_by_an_empty_data_frame_has_no_body_upstream() {
    use h2_support::{frame_bytes, RawH2, DATA, END_HEADERS, END_STREAM, HEADERS};
    let up = Upstream::start(|req, s, _| echo_framing(req, s));
    let p = Proxy::new();
    std::fs::create_dir_all(p.dir.path().join("site/files")).unwrap();
    std::fs::write(p.dir.path().join("site/files/hello.txt"), "static hello\n").unwrap();
    let routes = format!(
        "{}[[site.route]]\npath = \"/files\"\nstatic = \"../site\"\n\n\
         [[site.route]]\npath = \"/fixed\"\nrespond = \"fixed\\n\"\n",
        proxy_route("/", &[up.addr], "")
    );
    let tern = p.start(&routes, &["--workers", "1"]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    let mut hpack = tern_http2::hpack::Decoder::new(4096);
    // Each answer's status and body, read before the next request is sent (so that the
    // header blocks are decoded in the order they were written).
    let mut answer = |raw: &mut RawH2, id: u32| -> (u16, String) {
        let body = raw.response_body(id);
        let head = raw
            .seen
            .iter()
            .rev()
            .find(|f| f.stream == id && f.ty == HEADERS)
            .expect("the answer's HEADERS")
            .clone();
        let mut status = 0;
        hpack
            .decode(&head.payload, 1 << 16, |name, value| {
                if name == b":status" {
                    status = std::str::from_utf8(value).unwrap().parse().unwrap();
                }
                Ok(())
            })
            .unwrap();
        (status, String::from_utf8(body).unwrap())
    };
    let pause = || std::thread::sleep(Duration::from_millis(150));

    // A GET: HEADERS, and later (in a read of its own) an empty DATA with END_STREAM.
    raw.request(1, "GET", "/late-end", &[], true);
    pause();
    raw.frame(DATA, END_STREAM, 1, &[]);
    assert_eq!(
        answer(&mut raw, 1),
        (200, "GET /late-end HTTP/1.1 te= cl= body=".to_string())
    );
    // The same with both frames in one write.
    let mut both = frame_bytes(
        HEADERS,
        END_HEADERS,
        3,
        &h2_support::header_block(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "localhost"),
            (":path", "/one-write"),
        ]),
    );
    both.extend(frame_bytes(DATA, END_STREAM, 3, &[]));
    raw.write(&both);
    assert_eq!(
        answer(&mut raw, 3),
        (200, "GET /one-write HTTP/1.1 te= cl= body=".to_string())
    );
    // A POST ended the same way has no body either: a length of 0, as a bodiless POST over
    // HTTP/1.1 is forwarded.
    raw.request(5, "POST", "/empty-post", &[], true);
    pause();
    raw.frame(DATA, END_STREAM, 5, &[]);
    assert_eq!(
        answer(&mut raw, 5),
        (200, "POST /empty-post HTTP/1.1 te= cl=0 body=".to_string())
    );
    // A declared length: streamed with it.
    raw.request(7, "POST", "/with-length", &[("content-length", "5")], true);
    pause();
    raw.frame(DATA, END_STREAM, 7, b"hello");
    assert_eq!(
        answer(&mut raw, 7),
        (
            200,
            "POST /with-length HTTP/1.1 te= cl=5 body=hello".to_string()
        )
    );
    // No length, and a body in two DATA frames: chunked.
    raw.request(9, "POST", "/no-length", &[], true);
    pause();
    raw.frame(DATA, 0, 9, b"hello ");
    pause();
    raw.frame(DATA, END_STREAM, 9, b"world");
    assert_eq!(
        answer(&mut raw, 9),
        (
            200,
            "POST /no-length HTTP/1.1 te=chunked cl= body=hello world".to_string()
        )
    );
    // Routes that take bodies whole answer such a request as before.
    for (id, path, expected) in [
        (11, "/files/hello.txt", "static hello\n"),
        (13, "/fixed", "fixed\n"),
    ] {
        raw.request(id, "GET", path, &[], true);
        pause();
        raw.frame(DATA, END_STREAM, id, &[]);
        assert_eq!(answer(&mut raw, id), (200, expected.to_string()), "{path}");
    }
    let seen = up.seen();
    assert_eq!(seen.len(), 5, "{seen:?}");
    for s in &seen[..3] {
        assert!(
            s.header("transfer-encoding").is_none() && s.body.is_empty(),
            "{s:?}"
        );
    }
}

/// Upstream connections of `/slow` that the proxy closed (the client cancelled the stream).
static SLOW_CLOSED: AtomicUsize = AtomicUsize::new(0);

/// HTTP/2 clients: every stream becomes an HTTP/1.1 request upstream (on pooled connections),
/// many at once on one client connection, bodies both ways, answers framed as DATA within the
/// client's windows, and a broken answer resets only its stream.
#[tokio::test(flavor = "current_thread")]
async fn http2_streams_become_upstream_requests() {
    use h2_support::H2Conn;
    let up = Upstream::start(|req, s, _| {
        let path = req.line().split(' ').nth(1).unwrap_or("").to_string();
        if path == "/slow" {
            // Holds the answer until tern closes the connection (the stream was cancelled).
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nstart")
                .unwrap();
            let mut buf = [0u8; 16];
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            if s.read(&mut buf).is_ok_and(|n| n == 0) {
                SLOW_CLOSED.fetch_add(1, Ordering::SeqCst);
            }
            return false;
        }
        if path == "/broken" {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
            return false;
        }
        if path == "/big" {
            let body = vec![b'z'; 3 << 20];
            s.write_all(
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
            )
            .unwrap();
            s.write_all(&body).unwrap();
            return true;
        }
        let body = format!(
            "{} {} {}",
            req.line(),
            req.header("x-forwarded-proto").unwrap_or_default(),
            req.body.len()
        );
        s.write_all(format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n", body.len()).as_bytes()).unwrap();
        true
    });
    let p = Proxy::new();
    let tern = p.start(&proxy_route("/", &[up.addr], ""), &["--workers", "1"]);
    let mut h2 = H2Conn::h2c(tern.addr()).await;
    let r = h2.get("/hello?x=1", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "GET /hello?x=1 HTTP/1.1 http 0");
    assert_eq!(r.header("x-up"), Some("1"));
    h2_support::assert_no_connection_headers(&r, "a proxied HTTP/2 answer");
    let r = h2
        .try_request("POST", "/form", &[], Some(b"a=1&b=2"))
        .await
        .unwrap();
    assert_eq!(r.text(), "POST /form HTTP/1.1 http 7");
    // Twenty streams at once, and a 3 MiB answer through the client's windows.
    let mut pending = Vec::new();
    for i in 0..20 {
        pending.push(
            h2.start("GET", &format!("/s/{i}"), &[], None)
                .await
                .unwrap(),
        );
    }
    // Read as it comes (a client that left it unread would hold the connection window and
    // starve its own other streams).
    let big = tokio::spawn(h2.start("GET", "/big", &[], None).await.unwrap());
    for (i, f) in pending.into_iter().enumerate() {
        let r = f
            .await
            .unwrap_or_else(|e| panic!("stream {i}: {e}; tern's log:\n{}", tern.stderr_text()));
        assert_eq!(r.text(), format!("GET /s/{i} HTTP/1.1 http 0"));
    }
    let r = big.await.unwrap().unwrap();
    assert_eq!(r.body.len(), 3 << 20);
    assert!(r.body.iter().all(|&b| b == b'z'));
    // Uploads stream too, past --max-body (1 MiB by default), with a length or without one
    // (then chunked upstream), tern's memory staying put.
    let rss_before = rss_kib(tern.pid());
    let body = vec![b'u'; 48 << 20];
    let r = h2
        .try_request(
            "POST",
            "/upload",
            &[("content-length", &body.len().to_string())],
            Some(&body),
        )
        .await
        .unwrap();
    assert_eq!(
        r.text(),
        format!(
            "POST /upload HTTP/1.1 http {}",
            (48 << 20).to_string().len()
        )
    );
    let small = vec![b'v'; 3 << 20];
    let r = h2
        .try_request("PUT", "/chunked-up", &[], Some(&small))
        .await
        .unwrap();
    assert_eq!(
        r.text(),
        format!("PUT /chunked-up HTTP/1.1 http {}", 3 << 20)
    );
    let grew = rss_kib(tern.pid()).saturating_sub(rss_before);
    assert!(
        grew < 16 * 1024,
        "tern's RSS grew by {grew} KiB for a 48 MiB upload"
    );
    let last = up.seen().last().cloned().unwrap();
    assert_eq!(
        last.header("transfer-encoding").as_deref(),
        Some("chunked"),
        "{}",
        last.head
    );
    // A client that cancels a slow answer (RST_STREAM) frees its relay: the upstream
    // connection is closed, the client connection goes on.
    let before = up.connections();
    let slow = h2.start("GET", "/slow", &[], None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(slow);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h2.get("/after-cancel", &[]).await.status, 200);
    assert!(
        eventually(Duration::from_secs(5), || SLOW_CLOSED
            .load(Ordering::SeqCst)
            >= 1),
        "the cancelled stream's upstream connection was closed ({} opened since)",
        up.connections() - before
    );
    // A broken answer resets its stream; the connection goes on.
    let broken = h2.try_request("GET", "/broken", &[], None).await;
    assert!(broken.is_err(), "{broken:?}");
    let r = h2.get("/after", &[]).await;
    assert_eq!(r.status, 200);
    assert!(
        up.connections() < 25,
        "pooled: {} upstream connections",
        up.connections()
    );
}

/// Over HTTPS with `hsts`, a proxied answer carries the HSTS field once, over HTTP/1.1 and
/// HTTP/2 alike (and tern's own 502 too).
#[tokio::test(flavor = "current_thread")]
async fn proxied_answers_over_https_carry_hsts_once() {
    use h2_support::{alpn_config, H2Conn};
    let up = Upstream::ok("secure");
    let p = Proxy::new();
    let ca = tls_support::Ca::new();
    let (cert, key) = ca
        .issue("default", &["localhost", "127.0.0.1"])
        .write(p.dir.path(), "default");
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let routes = format!(
        "{}{}",
        proxy_route("/", &[up.addr], ""),
        proxy_route("/dead", &[dead], "")
    );
    p.write(&format!(
        "[tls]\nlisten = \"127.0.0.1:0\"\nhsts = 600\n[[tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n{}",
        cert.display(),
        key.display(),
        site(&routes)
    ));
    let mut cmd = Command::new(TERN);
    cmd.arg("run").arg("--config").arg(p.config());
    cmd.args(["--workers", "1", "--sandbox", "on"]);
    let tern = Tern::spawn(cmd);
    let hsts = |values: Vec<&str>, what: &str| {
        assert_eq!(values, ["max-age=600"], "{what}");
    };
    // HTTP/1.1 over TLS.
    let config = alpn_config(&ca, &["http/1.1"]);
    let mut c = tern.tls(&config, "localhost");
    for path in ["/x", "/dead"] {
        let r = c.get(path, &[]);
        let values = r
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("strict-transport-security"))
            .map(|(_, v)| v.as_str())
            .collect();
        hsts(values, &format!("HTTP/1.1 {path} ({})", r.status));
    }
    // HTTP/2 over TLS.
    let config = alpn_config(&ca, &["h2"]);
    let mut h2 = H2Conn::tls(tern.https(), &config, "localhost")
        .await
        .unwrap();
    for path in ["/x", "/dead"] {
        let r = h2.get(path, &[]).await;
        let values = r
            .headers
            .get_all("strict-transport-security")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        hsts(values, &format!("HTTP/2 {path} ({})", r.status));
    }
}
