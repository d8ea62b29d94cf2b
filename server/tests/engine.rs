//! The HTTP engine over real sockets: a real server on an ephemeral port, raw TCP clients.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tern_server::{
    Body, HandlerContext, Reply, Request, Response, Router, Server, ServerConfig, ServerHandle,
};

fn start(router: Router, tweak: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    let mut config = ServerConfig::default();
    config.runtime.listen = vec!["127.0.0.1:0".parse().unwrap()];
    config.runtime.workers = 2;
    tweak(&mut config);
    Server::new(config, router).start().expect("server starts")
}

fn hello(_: &Request<'_>, _: &mut HandlerContext<'_>) -> Reply {
    Reply::Now(Response::text(200, "hello\n"))
}

fn echo(req: &Request<'_>, _: &mut HandlerContext<'_>) -> Reply {
    Reply::Now(Response::new(200).with_body(Body::Owned(req.body.to_vec())))
}

fn router() -> Router {
    Router::new()
        .get("/hello", hello)
        .post("/echo", echo)
        .get("/later", |_: &Request<'_>, cx: &mut HandlerContext<'_>| {
            let pending = cx.defer();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                pending.complete_retrying(Response::text(200, "later\n"));
            });
            Reply::Later
        })
        .get("/slow", |_: &Request<'_>, cx: &mut HandlerContext<'_>| {
            let pending = cx.defer();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(700));
                pending.complete_retrying(Response::text(200, "slow\n"));
            });
            Reply::Later
        })
        .get(
            "/forgotten",
            |_: &Request<'_>, cx: &mut HandlerContext<'_>| {
                drop(cx.defer());
                Reply::Later
            },
        )
        .get(
            "/panic",
            |_: &Request<'_>, _: &mut HandlerContext<'_>| -> Reply { panic!("boom") },
        )
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads one response (head + Content-Length body) from the stream.
fn read_response(s: &mut TcpStream, pending: &mut Vec<u8>) -> Option<(u16, String, Vec<u8>)> {
    loop {
        if let Some(end) = find(pending, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_string();
            let status: u16 = head[9..12].parse().unwrap();
            let len = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Content-Length: ")
                        .or_else(|| l.strip_prefix("content-length: "))
                })
                .map(|v| v.trim().parse::<usize>().unwrap())
                .unwrap_or(0);
            let total = end + 4 + len;
            while pending.len() < total {
                let mut buf = [0u8; 65536];
                let n = s.read(&mut buf).ok()?;
                if n == 0 {
                    return None;
                }
                pending.extend_from_slice(&buf[..n]);
            }
            let body = pending[end + 4..total].to_vec();
            pending.drain(..total);
            return Some((status, head, body));
        }
        let mut buf = [0u8; 65536];
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn exchange(addr: SocketAddr, raw: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    read_response(&mut s, &mut Vec::new()).expect("a response")
}

/// Reads until the server closes; returns everything read.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    all
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let server = start(router(), |_| {});
    let mut s = connect(server.local_addr());
    let mut pending = Vec::new();
    for _ in 0..100 {
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let (status, head, body) = read_response(&mut s, &mut pending).unwrap();
        assert_eq!(status, 200);
        assert_eq!(body, b"hello\n");
        assert!(head.contains("\r\nDate: "), "{head}");
        assert!(head.contains("\r\nServer: tern"), "{head}");
        assert!(!head.contains("Connection: close"));
    }
}

#[test]
fn http10_closes_unless_keep_alive_requested() {
    let server = start(router(), |_| {});
    let mut s = connect(server.local_addr());
    s.write_all(b"GET /hello HTTP/1.0\r\n\r\n").unwrap();
    let all = read_to_close(&mut s);
    assert!(all.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(find(&all, b"Connection: close\r\n").is_some());

    let mut s = connect(server.local_addr());
    let mut pending = Vec::new();
    for _ in 0..2 {
        s.write_all(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap();
        let (status, head, _) = read_response(&mut s, &mut pending).unwrap();
        assert_eq!(status, 200);
        assert!(head.contains("Connection: keep-alive"), "{head}");
    }
}

#[test]
fn connection_close_is_honoured() {
    let server = start(router(), |_| {});
    let mut s = connect(server.local_addr());
    s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let all = read_to_close(&mut s);
    assert!(find(&all, b"Connection: close\r\n").is_some());
    assert!(all.ends_with(b"hello\n"));
}

#[test]
fn pipelined_requests_in_one_packet_are_answered_in_order() {
    let server = start(router(), |_| {});
    let mut s = connect(server.local_addr());
    let mut batch = Vec::new();
    for i in 0..16 {
        if i == 5 {
            batch.extend_from_slice(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n");
        } else if i == 9 {
            batch.extend_from_slice(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
            );
        } else {
            batch.extend_from_slice(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
        }
    }
    s.write_all(&batch).unwrap();
    let mut pending = Vec::new();
    for i in 0..16 {
        let (status, _, body) = read_response(&mut s, &mut pending).unwrap();
        assert_eq!(status, 200);
        let want: &[u8] = match i {
            5 => b"later\n",
            9 => b"abc",
            _ => b"hello\n",
        };
        assert_eq!(body, want, "response {i}");
    }
}

#[test]
fn a_request_split_across_many_writes_still_parses() {
    let server = start(router(), |_| {});
    let mut s = connect(server.local_addr());
    s.set_nodelay(true).unwrap();
    let raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: y\r\n\r\n";
    for chunk in raw.chunks(3) {
        s.write_all(chunk).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let (status, _, body) = read_response(&mut s, &mut Vec::new()).unwrap();
    assert_eq!(status, 200);
    assert_eq!(body, b"hello world");
}

#[test]
fn head_has_length_but_no_body() {
    let server = start(router(), |_| {});
    let mut s = connect(server.local_addr());
    s.write_all(b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut pending = Vec::new();
    // A HEAD answer announces the GET length but carries no body, so the next response follows
    // the head directly. Parse it by hand: read_response would wait for 6 body bytes.
    while find(&pending, b"hello\n").is_none() {
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        pending.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&pending);
    let second = text
        .find("HTTP/1.1 200")
        .and_then(|i| text[i + 1..].find("HTTP/1.1 200"))
        .expect("two responses");
    assert!(text[..second + 1].contains("Content-Length: 6"));
    assert!(!text[..second + 1].contains("hello"));
}

#[test]
fn expect_100_continue_gets_interim_response() {
    let server = start(router(), |_| {});
    let mut s = connect(server.local_addr());
    s.write_all(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let mut buf = [0u8; 25];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"data").unwrap();
    let (status, _, body) = read_response(&mut s, &mut Vec::new()).unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"data"[..]));
}

#[test]
fn bad_input_gets_precise_status_and_close() {
    let server = start(router(), |c| c.limits.max_body = 1000);
    let cases: &[(&[u8], u16)] = &[
        (b"GET / HTTP/1.1\r\n\r\n", 400),                                            // no Host
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 400),                    // obs-fold
        (b"GET / HTTP/1.1\nHost: x\n\n", 400),                                         // bare LF
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n", 400),
        // (The HTTP/2 preface itself starts HTTP/2: cli/tests/http2.rs.)
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413),
        (b"BREW /hello HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    ];
    for (raw, want) in cases {
        let mut s = connect(server.local_addr());
        s.write_all(raw).unwrap();
        let all = read_to_close(&mut s);
        let text = String::from_utf8_lossy(&all);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {want} ")),
            "{:?} → {text}",
            String::from_utf8_lossy(raw)
        );
        if *want != 404 && *want != 405 {
            assert!(text.contains("Connection: close"), "{text}");
        }
    }
    let mut big = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..101 {
        big.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    big.extend_from_slice(b"\r\n");
    assert_eq!(exchange(server.local_addr(), &big).0, 431);
    let mut huge = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    huge.resize(40 * 1024, b'a');
    let mut s = connect(server.local_addr());
    let _ = s.write_all(&huge);
    let text = String::from_utf8_lossy(&read_to_close(&mut s)).to_string();
    assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
    let (_, head, _) = exchange(
        server.local_addr(),
        b"BREW /hello HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert!(head.contains("Allow: GET, HEAD"), "{head}");
}

#[test]
fn pending_replies_and_panics() {
    let server = start(router(), |_| {});
    let (status, _, body) = exchange(
        server.local_addr(),
        b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert_eq!((status, body.as_slice()), (200, &b"later\n"[..]));
    assert_eq!(
        exchange(
            server.local_addr(),
            b"GET /forgotten HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .0,
        500
    );
    for _ in 0..4 {
        assert_eq!(
            exchange(
                server.local_addr(),
                b"GET /panic HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            .0,
            500
        );
    }
    // Workers survived the panics.
    assert_eq!(
        exchange(
            server.local_addr(),
            b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .0,
        200
    );
    let snap = server.stats().snapshot();
    assert_eq!(snap.get(tern_server::Counter::HandlerPanics), 4);
}

#[test]
fn header_timeout_cuts_off_a_dribbling_client() {
    let server = start(router(), |c| c.header_timeout = Duration::from_secs(1));
    let mut s = connect(server.local_addr());
    let started = Instant::now();
    let mut cut_off = false;
    for b in b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa".iter() {
        if s.write_all(&[*b]).is_err() {
            cut_off = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() > Duration::from_secs(4) {
            break;
        }
    }
    let rest = read_to_close(&mut s);
    assert!(
        cut_off || (rest.starts_with(b"HTTP/1.1 408") && find(&rest, b"\r\nDate: ").is_some()),
        "{:?}",
        String::from_utf8_lossy(&rest)
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(
        server
            .stats()
            .snapshot()
            .get(tern_server::Counter::TimeoutHeader),
        1
    );
}

#[test]
fn idle_keep_alive_connections_are_closed() {
    let server = start(router(), |c| c.idle_timeout = Duration::from_secs(1));
    let mut s = connect(server.local_addr());
    s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut pending = Vec::new();
    read_response(&mut s, &mut pending).unwrap();
    let t = Instant::now();
    assert!(read_to_close(&mut s).is_empty());
    assert!(t.elapsed() < Duration::from_secs(3));
}

/// Waits until the server has accepted `n` connections. A client that connects and sends
/// nothing is handed to `accept` only after TCP_DEFER_ACCEPT's period (1 s, one SYN-ACK
/// retransmission), as a browser's preconnect or a slow client would be.
fn wait_accepted(server: &ServerHandle, n: u64) {
    let t = Instant::now();
    while server
        .stats()
        .snapshot()
        .get(tern_server::Counter::ConnectionsAccepted)
        < n
    {
        assert!(t.elapsed() < Duration::from_secs(10), "not accepted");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection accepted before shutdown that has not sent its first request may have one on
/// its way: closing it as idle when draining begins would reset that request. It gets the
/// header timeout to arrive, and is answered with `Connection: close`.
#[test]
fn graceful_shutdown_waits_for_the_first_request_of_an_accepted_connection() {
    let server = start(router(), |c| c.header_timeout = Duration::from_secs(5));
    let mut late = connect(server.local_addr());
    wait_accepted(&server, 1);
    server.shutdown();
    // Well past the settle time after the last accept, when idle connections are closed.
    std::thread::sleep(Duration::from_millis(600));
    late.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let all = read_to_close(&mut late);
    assert!(
        all.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&all)
    );
    assert!(find(&all, b"Connection: close").is_some());
    server.join();
}

/// The other side of it: an accepted connection that never sends (a preconnect) holds the
/// shutdown only for the header timeout, is closed silently, and is no slowloris strike.
#[test]
fn graceful_shutdown_closes_a_silent_connection_at_the_header_timeout() {
    let server = start(router(), |c| c.header_timeout = Duration::from_secs(1));
    let mut silent = connect(server.local_addr());
    wait_accepted(&server, 1);
    let t = Instant::now();
    server.shutdown();
    assert!(
        read_to_close(&mut silent).is_empty(),
        "closed without a 408"
    );
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    let stats = server.stats().snapshot();
    server.join();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(stats.get(tern_server::Counter::TimeoutHeader), 0);
    assert_eq!(stats.get(tern_server::Counter::TimeoutIdle), 1);
}

#[test]
fn graceful_shutdown_finishes_the_request_in_flight() {
    let server = start(router(), |_| {});
    let addr = server.local_addr();
    let mut busy = connect(addr);
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut idle = connect(addr);
    idle.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_response(&mut idle, &mut Vec::new()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    server.shutdown();
    let all = read_to_close(&mut busy);
    assert!(
        all.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&all)
    );
    assert!(find(&all, b"Connection: close").is_some());
    assert!(all.ends_with(b"slow\n"));
    assert!(
        read_to_close(&mut idle).is_empty(),
        "idle connection closed"
    );
    server.join();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(TcpStream::connect(addr).is_err(), "no longer accepting");
}
