//! The reverse proxy against upstreams and clients that try to turn it against others
//! (issue #21): an upstream that sends more than its answer (a stray answer after it, or the
//! answer to a request smuggled in a GET body it ignored) must never have those bytes reach a
//! later request, whoever sends it and wherever the answer's end falls against tern's reads;
//! HTTP/2 clients that shut their windows must pin neither memory nor upstream connections
//! (PINGs do not keep a stalled connection alive); and a client that reads slowly must not
//! hold its upstream connection past the upstream idle timeout.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{h2_support, support};
use support::*;

/// What a fake upstream does with one connection.
type Serve = dyn Fn(TcpStream, &Counts) + Send + Sync;

/// What happened at a fake upstream.
#[derive(Default)]
struct Counts {
    /// Connections accepted.
    accepted: AtomicUsize,
    /// Connections whose handler is still running.
    live: AtomicUsize,
    /// Request lines seen, in order.
    requests: Mutex<Vec<String>>,
    /// Connections on which a write failed: tern closed them under the answer.
    cut: AtomicUsize,
}

/// A fake upstream on 127.0.0.1: one thread per connection running `serve`.
struct Upstream {
    addr: SocketAddr,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    fn start(serve: impl Fn(TcpStream, &Counts) + Send + Sync + 'static) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let serve: Arc<Serve> = Arc::new(serve);
        let (c, st) = (counts.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                stream.set_nodelay(true).unwrap();
                c.accepted.fetch_add(1, Ordering::SeqCst);
                c.live.fetch_add(1, Ordering::SeqCst);
                let (c, serve) = (c.clone(), serve.clone());
                std::thread::spawn(move || {
                    serve(stream, &c);
                    c.live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Upstream { addr, counts, stop }
    }

    fn accepted(&self) -> usize {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    fn live(&self) -> usize {
        self.counts.live.load(Ordering::SeqCst)
    }

    fn cut(&self) -> usize {
        self.counts.cut.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.counts.requests.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// One request head at the start of `buf`: its request line and length, and its
/// Content-Length (0 if none).
fn parse_head(buf: &[u8]) -> Option<(String, usize, usize)> {
    let end = find(buf, b"\r\n\r\n")? + 4;
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let line = text.lines().next().unwrap_or("").to_string();
    let length = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    Some((line, end, length))
}

/// Serves requests with a Content-Length body or none, like an HTTP/1.1 server that reads
/// whatever it has: every complete request in its buffer is answered by `answer` (which gets
/// the request line), and the answers go out together, in one write. With `ignore_get_bodies`
/// a GET's body is not read as a body but as whatever follows (a server that assumes GET has
/// none: CL.0).
fn serve_batched(
    mut s: TcpStream,
    counts: &Counts,
    ignore_get_bodies: bool,
    answer: &(dyn Fn(&str) -> Vec<u8> + Sync),
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let mut out = Vec::new();
        while let Some((line, head, length)) = parse_head(&buf) {
            let body = if ignore_get_bodies && line.starts_with("GET ") {
                0
            } else {
                length
            };
            if buf.len() < head + body {
                break;
            }
            buf.drain(..head + body);
            counts.requests.lock().unwrap().push(line.clone());
            out.extend_from_slice(&answer(&line));
        }
        if !out.is_empty() && s.write_all(&out).is_err() {
            return;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An answer of exactly `total` bytes (head and body) whose body names `tag`.
fn answer_of_size(tag: &str, total: usize) -> Vec<u8> {
    let mut body_len = total.saturating_sub(40);
    loop {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {body_len}\r\n\r\n");
        if head.len() + body_len == total {
            let mut answer = head.into_bytes();
            let mut body = format!("answer to {tag};").into_bytes();
            body.resize(body_len, b'.');
            answer.extend_from_slice(&body);
            return answer;
        }
        body_len = total - head.len();
    }
}

/// The request path of a request line.
fn path_of(line: &str) -> &str {
    line.split(' ').nth(1).unwrap_or("")
}

/// A `tern run` config folder.
struct Config {
    dir: tempfile::TempDir,
}

impl Config {
    fn new() -> Config {
        Config {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("tern.toml")
    }

    /// `tern run` with `top` (server keys), one default site with a proxy route for `/` to
    /// `upstream` (`route`: more keys of that route), one worker (so every request meets the
    /// same pool of upstream connections).
    fn start(&self, top: &str, upstream: SocketAddr, route: &str) -> Tern {
        std::fs::write(
            self.path(),
            format!(
                "{top}\n[[site]]\nname = \"app\"\ndefault = true\n\
                 [[site.route]]\npath = \"/\"\nproxy = \"{upstream}\"\n{route}\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new(TERN);
        cmd.arg("run").arg("--config").arg(self.path());
        cmd.args(["--listen", "127.0.0.1:0", "--workers", "1"]);
        let tern = Tern::spawn(cmd);
        assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
        tern
    }
}

/// Answer ends that fall on tern's reads: the first read of an answer takes 4 KiB (a read
/// buffer), later ones up to 64 KiB more; a few bytes either side of each.
fn sizes_around_read_boundaries() -> Vec<usize> {
    let mut sizes = Vec::new();
    for boundary in [4096, 4096 + 65536] {
        sizes.extend(boundary - 6..=boundary + 6);
    }
    sizes
}

/// An upstream that writes a second, unrequested answer right behind each answer (in the same
/// write, so both are in tern's socket at once): whatever the first answer's size, the stray
/// one reaches nobody; the next request on the same client connection and a request from
/// another client each get their own answer.
#[test]
fn bytes_after_an_answer_never_reach_a_later_request() {
    let up = Upstream::start(|s, counts| {
        serve_batched(s, counts, false, &|line| {
            let path = path_of(line);
            let size = path
                .rsplit('/')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(200);
            let mut out = answer_of_size(path, size);
            out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nSTRAY-ANSWER");
            out
        })
    });
    let config = Config::new();
    let tern = config.start("", up.addr, "");
    for size in sizes_around_read_boundaries() {
        let mut a = tern.client();
        let first = format!("/a/{size}");
        let r = a.get(&first, &[]);
        assert!(
            r.text().starts_with(&format!("answer to {first};")),
            "{size}"
        );
        for (who, c) in [
            ("the same client", &mut a),
            ("another client", &mut tern.client()),
        ] {
            let next = format!("/next/{size}/200");
            let r = c.get(&next, &[]);
            assert!(
                r.text().starts_with(&format!("answer to {next};")),
                "after a {size}-byte answer with bytes behind it, {who} got {:?}",
                r.text()
            );
        }
    }
}

/// Answers that have no body by definition (to HEAD, 204, 304) from an upstream that sends a
/// body anyway, shaped as a second answer: tern sends the head alone, and the bytes behind it
/// reach neither the next request on that client connection nor another client's.
#[test]
fn a_body_behind_a_bodiless_answer_never_reaches_a_later_request() {
    const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nSTRAY-ANSWER";
    let up = Upstream::start(|s, counts| {
        serve_batched(s, counts, false, &|line| {
            let path = path_of(line);
            let head: &[u8] = if line.starts_with("HEAD ") {
                b"HTTP/1.1 200 OK\r\nContent-Length: 55\r\n\r\n"
            } else if path.starts_with("/204") {
                b"HTTP/1.1 204 No Content\r\nContent-Length: 55\r\n\r\n"
            } else if path.starts_with("/304") {
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: 55\r\n\r\n"
            } else {
                return answer_of_size(path, 200);
            };
            [head, STRAY].concat()
        })
    });
    let config = Config::new();
    let tern = config.start("", up.addr, "");
    for (method, path, status) in [
        ("HEAD", "/h", 200),
        ("GET", "/204", 204),
        ("GET", "/304", 304),
    ] {
        let mut a = tern.client();
        a.send(format!("{method} {path} HTTP/1.1\r\nHost: app.test\r\n\r\n").as_bytes());
        let r = a.read_response(true);
        assert_eq!(r.status, status, "{method} {path}");
        for (who, c) in [
            ("the same client", &mut a),
            ("another client", &mut tern.client()),
        ] {
            let next = format!("/next{path}");
            let r = c.get(&next, &[]);
            assert!(
                r.text().starts_with(&format!("answer to {next};")),
                "after {method} {path}, {who} got {:?}",
                r.text()
            );
        }
    }
}

/// CL.0 through the proxy: a GET whose body holds a second request, to an upstream that
/// ignores GET bodies and so answers twice. The second answer (here the "gated" one) reaches
/// no one, wherever the first answer's end falls against tern's reads: not the attacker's next
/// request, not another client's.
#[test]
fn a_request_smuggled_in_a_get_body_is_never_answered_to_anyone() {
    const GATED: &str = "GATED-FILE-CONTENTS";
    let up = Upstream::start(|s, counts| {
        serve_batched(s, counts, true, &|line| {
            let path = path_of(line);
            if path == "/gated" {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{GATED}",
                    GATED.len()
                )
                .into_bytes()
            } else {
                let size = path
                    .rsplit('/')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(200);
                answer_of_size(path, size)
            }
        })
    });
    let config = Config::new();
    let tern = config.start("", up.addr, "");
    for size in sizes_around_read_boundaries() {
        let mut attacker = tern.client();
        let smuggled = "GET /gated HTTP/1.1\r\nHost: test\r\n\r\n";
        let first = format!("/public/{size}");
        attacker.send(
            format!(
                "GET {first} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n{smuggled}",
                smuggled.len()
            )
            .as_bytes(),
        );
        let r = attacker.read_response(false);
        assert!(r.text().starts_with(&format!("answer to {first};")));
        let mut other = tern.client();
        for (who, c) in [
            ("the attacker", &mut attacker),
            ("another client", &mut other),
        ] {
            let next = format!("/next/{size}/200");
            let r = c.get(&next, &[]);
            assert!(
                !r.text().contains(GATED),
                "after a {size}-byte first answer, {who} got the smuggled request's answer"
            );
            assert!(
                r.text().starts_with(&format!("answer to {next};")),
                "{who}: {:?}",
                r.text()
            );
        }
    }
    assert!(
        up.requests().iter().any(|l| l.contains("/gated")),
        "the upstream never parsed the smuggled request: the test tested nothing"
    );
}

/// The same smuggling in the body of a POST to a handler that answers without reading it
/// (Python's http.server does this for any method it has no handler for), with the smuggled
/// request answered *late*: no look at the socket when the first answer ends can see it
/// coming. A connection that carried a body is never reused, so the late answer reaches no one.
#[test]
fn a_late_answer_to_a_request_smuggled_in_any_body_is_never_delivered() {
    const GATED: &str = "GATED-FILE-CONTENTS";
    let up = Upstream::start(|mut s, counts| {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        loop {
            // Bodies are never read as bodies: what follows a head is the next request.
            while let Some((line, head, _)) = parse_head(&buf) {
                buf.drain(..head);
                counts.requests.lock().unwrap().push(line.clone());
                let path = path_of(&line).to_string();
                let answer = if path == "/gated" {
                    std::thread::sleep(Duration::from_millis(150));
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{GATED}",
                        GATED.len()
                    )
                    .into_bytes()
                } else {
                    answer_of_size(&path, 200)
                };
                if s.write_all(&answer).is_err() {
                    return;
                }
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    });
    let config = Config::new();
    let tern = config.start("", up.addr, "");
    let smuggled = "GET /gated HTTP/1.1\r\nHost: test\r\n\r\n";
    for method in ["POST", "PUT", "PATCH", "DELETE"] {
        let mut attacker = tern.client();
        attacker.send(
            format!(
                "{method} /form HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n{smuggled}",
                smuggled.len()
            )
            .as_bytes(),
        );
        assert!(attacker
            .read_response(false)
            .text()
            .starts_with("answer to /form;"));
        let mut other = tern.client();
        for (who, c) in [
            ("the attacker", &mut attacker),
            ("another client", &mut other),
        ] {
            let r = c.get("/next", &[]);
            assert!(
                !r.text().contains(GATED),
                "{method}: {who} got the smuggled answer"
            );
            assert!(
                r.text().starts_with("answer to /next;"),
                "{who}: {:?}",
                r.text()
            );
        }
    }
    assert!(
        up.requests().iter().any(|l| l.contains("/gated")),
        "the upstream never parsed the smuggled request: the test tested nothing"
    );
}

/// Answers every request with a `size`-byte body, then waits for the next request; ends when
/// tern closes the connection (counting a failed write as `cut`).
fn serve_big(mut s: TcpStream, counts: &Counts, size: usize) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        while let Some((line, head, _)) = parse_head(&buf) {
            buf.drain(..head);
            counts.requests.lock().unwrap().push(line);
            let mut out = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n").into_bytes();
            out.resize(out.len() + size, b'b');
            for piece in out.chunks(16384) {
                if s.write_all(piece).is_err() {
                    counts.cut.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// How many upstream connections one client connection may hold at once
/// (`MAX_UPSTREAMS_PER_CONN` in server/src/upstream/driver.rs).
const UPSTREAMS_PER_CLIENT_CONNECTION: usize = 16;

/// An HTTP/2 client that opens its streams' windows to nothing and asks for 40 large proxied
/// answers at once makes tern open at most a bounded number of upstream connections for it
/// (the other streams wait their turn), not one per stream.
#[test]
fn shut_http2_windows_pin_a_bounded_number_of_upstream_connections() {
    use h2_support::{RawH2, SETTINGS_INITIAL_WINDOW_SIZE};
    let up = Upstream::start(|s, counts| serve_big(s, counts, 1 << 20));
    let config = Config::new();
    let tern = config.start("", up.addr, "");
    let mut h2 = RawH2::connect(tern.addr(), &[(SETTINGS_INITIAL_WINDOW_SIZE, 0)]);
    for i in 0..40u32 {
        h2.request(1 + 2 * i, "GET", &format!("/big/{i}"), &[], false);
    }
    assert!(
        eventually(Duration::from_secs(10), || up.requests().len()
            >= UPSTREAMS_PER_CLIENT_CONNECTION),
        "the upstream saw {} requests",
        up.requests().len()
    );
    // Time for more, were more allowed (none of the answers can end: no window).
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        up.accepted() <= UPSTREAMS_PER_CLIENT_CONNECTION,
        "one client connection made tern open {} upstream connections",
        up.accepted()
    );
    assert_eq!(up.live(), up.accepted());
}

/// Proxied answers stalled by a window the client never opens end at the write timeout
/// counted from when the stall began: PINGs (answered, and read) do not extend it. The
/// connection gets GOAWAY and is closed, and its upstream connections are closed too.
#[test]
fn pings_do_not_keep_a_stalled_http2_connection_alive() {
    use h2_support::{Closed, RawH2, GOAWAY, PING, SETTINGS_INITIAL_WINDOW_SIZE};
    let up = Upstream::start(|s, counts| serve_big(s, counts, 1 << 20));
    let config = Config::new();
    let tern = config.start("write_timeout = 2", up.addr, "");
    let mut h2 = RawH2::connect(tern.addr(), &[(SETTINGS_INITIAL_WINDOW_SIZE, 0)]);
    for i in 0..4u32 {
        h2.request(1 + 2 * i, "GET", &format!("/big/{i}"), &[], false);
    }
    assert!(eventually(Duration::from_secs(10), || up.requests().len() == 4));
    let start = Instant::now();
    let closed = loop {
        // A PING every 200 ms, well inside the 2 s write timeout, its ACK read at once.
        let _ = h2
            .sock
            .write_all(&h2_support::frame_bytes(PING, 0, 0, &[7; 8]));
        match h2.close_within(Duration::from_millis(200)) {
            Closed::Open if start.elapsed() < Duration::from_secs(15) => continue,
            how => break how,
        }
    };
    assert_ne!(
        closed,
        Closed::Open,
        "still open after {:?} of PINGs; frames: {:?}",
        start.elapsed(),
        h2.seen
    );
    assert!(
        h2.seen.iter().any(|f| f.ty == GOAWAY),
        "closed without GOAWAY: {:?}",
        h2.seen
    );
    assert!(
        eventually(Duration::from_secs(5), || up.live() == 0),
        "{} upstream connections still open",
        up.live()
    );
}

/// A client that reads a large proxied answer slowly (a KiB now and then, enough to count
/// as reading for the write timeout) cannot hold the upstream connection past the upstream
/// idle timeout: once tern has stopped reading the upstream because the client's output is
/// full, the exchange must move within that time or end, its upstream connection closed.
#[test]
fn a_slow_reader_does_not_pin_its_upstream_connection() {
    let up = Upstream::start(|s, counts| serve_big(s, counts, 256 << 20));
    let config = Config::new();
    let tern = config.start("write_timeout = 600", up.addr, "upstream_idle_timeout = 2");
    let sock = TcpStream::connect(tern.addr()).unwrap();
    small_receive_buffer(&sock, 4096);
    let mut c = Client::over(sock);
    c.send(b"GET /huge HTTP/1.1\r\nHost: test\r\n\r\n");
    assert!(eventually(Duration::from_secs(10), || up.requests().len() == 1));
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    let mut read = 0usize;
    c.stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    while up.live() > 0 && start.elapsed() < Duration::from_secs(15) {
        match c.stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        up.live(),
        0,
        "after {:?} of a client reading {read} bytes, its upstream connection is still open",
        start.elapsed()
    );
    assert_eq!(up.cut(), 1, "closed under the answer, not after it");
}

/// `len` bytes of text that compresses about 3:1 (words drawn by an LCG, never repeating
/// within a compression window), so an encoder keeps working through a large answer.
fn wordy_text(len: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "tern ",
        "gull ",
        "skua ",
        "puffin ",
        "auk ",
        "gannet ",
        "shag ",
        "petrel ",
        "fulmar ",
        "kittiwake ",
        "razorbill ",
        "guillemot ",
        "eider ",
        "scoter ",
        "loon ",
        "grebe ",
    ];
    let mut out = Vec::with_capacity(len + 16);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    while out.len() < len {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.extend_from_slice(WORDS[(x >> 60) as usize].as_bytes());
        if x & 0xff < 24 {
            out.extend_from_slice(format!("{} ", x >> 40).as_bytes());
        }
    }
    out.truncate(len);
    out
}

/// Answers every request with `body` as text/plain, then waits for the next request.
fn serve_text(mut s: TcpStream, counts: &Counts, body: &[u8]) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        while let Some((line, head, _)) = parse_head(&buf) {
            buf.drain(..head);
            counts.requests.lock().unwrap().push(line);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            if s.write_all(head.as_bytes()).is_err() {
                return;
            }
            for piece in body.chunks(16384) {
                if s.write_all(piece).is_err() {
                    counts.cut.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A gauge or counter of `/metrics` (its first series whose line starts with `name`).
fn metric(tern: &Tern, name: &str) -> f64 {
    let text = tern.get("/metrics").text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} on /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// An HTTP/2 client that shuts its windows and asks for 16 large answers of a route that
/// compresses them (brotli, about 2 MiB of encoder state each) gets one encoder for its
/// connection, not one per stream: the other answers go uncompressed, counted. When it
/// half-closes its connection (it can open no window any more), every stalled answer is
/// abandoned at once (encoder freed, upstream connections closed), not at the write timeout.
#[test]
fn compressed_answers_to_shut_http2_windows_hold_one_encoder_and_end_at_eof() {
    use h2_support::{RawH2, SETTINGS_INITIAL_WINDOW_SIZE};
    let body = Arc::new(wordy_text(1 << 20));
    let up = Upstream::start(move |s, counts| serve_text(s, counts, &body));
    let config = Config::new();
    std::fs::write(
        config.path(),
        format!(
            "write_timeout = 60\n[[site]]\nname = \"app\"\ndefault = true\n\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\
             [[site.route]]\npath = \"/\"\nproxy = \"{}\"\ncompress = [\"br\"]\n",
            up.addr
        ),
    )
    .unwrap();
    let mut cmd = Command::new(TERN);
    cmd.arg("run").arg("--config").arg(config.path());
    cmd.args(["--listen", "127.0.0.1:0", "--workers", "1"]);
    let tern = Tern::spawn(cmd);
    let mut h2 = RawH2::connect(tern.addr(), &[(SETTINGS_INITIAL_WINDOW_SIZE, 0)]);
    for i in 0..16u32 {
        h2.request(
            1 + 2 * i,
            "GET",
            &format!("/big/{i}"),
            &[("accept-encoding", "br")],
            false,
        );
    }
    assert!(
        eventually(Duration::from_secs(10), || up.requests().len() == 16
            && metric(
                &tern,
                "tern_compression_skipped_total{cause=\"memory\"}"
            ) >= 15.0),
        "upstream requests {}, skipped {}",
        up.requests().len(),
        metric(&tern, "tern_compression_skipped_total{cause=\"memory\"}")
    );
    let held = metric(&tern, "tern_compress_encoder_bytes");
    assert!(
        (1_000_000.0..=2_200_000.0).contains(&held),
        "one brotli encoder expected, {held} bytes charged"
    );
    // The client can open no window any more: nothing it is owed can go out.
    h2.sock.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(
        eventually(Duration::from_secs(3), || up.live() == 0),
        "{} upstream connections still open after the client's EOF",
        up.live()
    );
    assert_eq!(metric(&tern, "tern_compress_encoder_bytes"), 0.0);
}
