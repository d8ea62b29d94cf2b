//! The HTTP engine over real sockets: a real server on an ephemeral port, raw TCP clients.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tern_server::{
    Body, HandlerContext, Reply, Request, Response, Router, Server, ServerConfig, ServerHandle,
};
use tern_testkit::{find, Client, Resp};

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

/// One request on a fresh connection, and its answer.
fn exchange(addr: SocketAddr, raw: &[u8]) -> Resp {
    let mut c = Client::connect(addr);
    c.send(raw);
    c.read_response(false)
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let server = start(router(), |_| {});
    let mut c = Client::connect(server.local_addr());
    for _ in 0..100 {
        c.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = c.read_response(false);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello\n");
        assert!(r.header("date").is_some(), "{r:?}");
        assert!(
            r.header("server").is_some_and(|v| v.starts_with("tern")),
            "{r:?}"
        );
        assert!(!r.closes(), "{r:?}");
    }
}

#[test]
fn http10_closes_unless_keep_alive_requested() {
    let server = start(router(), |_| {});
    let mut c = Client::connect(server.local_addr());
    c.send(b"GET /hello HTTP/1.0\r\n\r\n");
    let all = c.read_to_close();
    assert!(all.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(find(&all, b"Connection: close\r\n").is_some());

    let mut c = Client::connect(server.local_addr());
    for _ in 0..2 {
        c.send(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        let r = c.read_response(false);
        assert_eq!(r.status, 200);
        assert!(r.has("connection", "keep-alive"), "{r:?}");
    }
}

#[test]
fn connection_close_is_honoured() {
    let server = start(router(), |_| {});
    let mut c = Client::connect(server.local_addr());
    c.send(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let all = c.read_to_close();
    assert!(find(&all, b"Connection: close\r\n").is_some());
    assert!(all.ends_with(b"hello\n"));
}

#[test]
fn pipelined_requests_in_one_packet_are_answered_in_order() {
    let server = start(router(), |_| {});
    let mut c = Client::connect(server.local_addr());
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
    c.send(&batch);
    for i in 0..16 {
        let r = c.read_response(false);
        assert_eq!(r.status, 200);
        let want: &[u8] = match i {
            5 => b"later\n",
            9 => b"abc",
            _ => b"hello\n",
        };
        assert_eq!(r.body, want, "response {i}");
    }
}

#[test]
fn a_request_split_across_many_writes_still_parses() {
    let server = start(router(), |_| {});
    let mut c = Client::connect(server.local_addr());
    let raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: y\r\n\r\n";
    for chunk in raw.chunks(3) {
        c.send(chunk);
        std::thread::sleep(Duration::from_millis(2));
    }
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello world");
}

#[test]
fn head_has_length_but_no_body() {
    let server = start(router(), |_| {});
    let mut c = Client::connect(server.local_addr());
    c.send(b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    // The HEAD answer announces the GET's length but carries no body: the GET's answer
    // follows its head directly (a body would be read as the next status line).
    let head = c.read_response(true);
    assert_eq!((head.status, head.content_length()), (200, Some(6)));
    let get = c.read_response(false);
    assert_eq!((get.status, get.body.as_slice()), (200, &b"hello\n"[..]));
}

#[test]
fn expect_100_continue_gets_interim_response() {
    let server = start(router(), |_| {});
    let mut c = Client::connect(server.local_addr());
    c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
    assert_eq!(c.read_exact_raw(25), b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send(b"data");
    let r = c.read_response(false);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"data"[..]));
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
        let mut c = Client::connect(server.local_addr());
        c.send(raw);
        let all = c.read_to_close();
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
    assert_eq!(exchange(server.local_addr(), &big).status, 431);
    let mut huge = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    huge.resize(40 * 1024, b'a');
    let mut c = Client::connect(server.local_addr());
    // The server may answer and close before reading it all.
    let _ = c.stream.write_all(&huge);
    let text = String::from_utf8_lossy(&c.read_to_close()).to_string();
    assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
    let r = exchange(
        server.local_addr(),
        b"BREW /hello HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert!(r.has("allow", "GET, HEAD"), "{r:?}");
}

#[test]
fn pending_replies_and_panics() {
    let server = start(router(), |_| {});
    let r = exchange(
        server.local_addr(),
        b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert_eq!((r.status, r.body.as_slice()), (200, &b"later\n"[..]));
    assert_eq!(
        exchange(
            server.local_addr(),
            b"GET /forgotten HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .status,
        500
    );
    for _ in 0..4 {
        assert_eq!(
            exchange(
                server.local_addr(),
                b"GET /panic HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            .status,
            500
        );
    }
    // Workers survived the panics.
    assert_eq!(
        exchange(
            server.local_addr(),
            b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .status,
        200
    );
    let snap = server.stats().snapshot();
    assert_eq!(snap.get(tern_server::Counter::HandlerPanics), 4);
}

#[test]
fn header_timeout_cuts_off_a_dribbling_client() {
    let server = start(router(), |c| c.header_timeout = Duration::from_secs(1));
    let mut c = Client::connect(server.local_addr());
    let started = Instant::now();
    let mut cut_off = false;
    for b in b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa".iter() {
        if c.stream.write_all(&[*b]).is_err() {
            cut_off = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() > Duration::from_secs(4) {
            break;
        }
    }
    let rest = c.read_to_close();
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
    let mut c = Client::connect(server.local_addr());
    c.get("/hello", &[]);
    let t = Instant::now();
    assert!(c.read_to_close().is_empty());
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
    let mut late = Client::connect(server.local_addr());
    wait_accepted(&server, 1);
    server.shutdown();
    // Well past the settle time after the last accept, when idle connections are closed.
    std::thread::sleep(Duration::from_millis(600));
    late.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    let all = late.read_to_close();
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
    let mut silent = Client::connect(server.local_addr());
    wait_accepted(&server, 1);
    let t = Instant::now();
    server.shutdown();
    assert!(silent.read_to_close().is_empty(), "closed without a 408");
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
    let mut busy = Client::connect(addr);
    busy.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut idle = Client::connect(addr);
    idle.get("/hello", &[]);
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    server.shutdown();
    let all = busy.read_to_close();
    assert!(
        all.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&all)
    );
    assert!(find(&all, b"Connection: close").is_some());
    assert!(all.ends_with(b"slow\n"));
    assert!(idle.read_to_close().is_empty(), "idle connection closed");
    server.join();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(TcpStream::connect(addr).is_err(), "no longer accepting");
}
