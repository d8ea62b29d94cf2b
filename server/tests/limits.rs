//! Timeouts and connection limits over real sockets: a real server on an ephemeral port, raw
//! TCP clients. Every read has a timeout, so a broken server fails a test instead of hanging it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tern_server::{
    Body, Counter, HandlerContext, Reply, Request, Response, Router, Server, ServerConfig,
    ServerHandle, Stats,
};
use tern_testkit::{eventually, find, Client, Resp};

/// Large enough that the kernel's socket buffers (send and receive side together, a few MiB on
/// loopback) cannot hold it: a client that never reads stalls the server's writes.
const BIG: usize = 32 << 20;
/// A generous bound for what should happen within about a second, even on a loaded machine.
const SOON: Duration = Duration::from_secs(5);
/// The longest any one read helper keeps reading: a server that never stops sending (say, one
/// answer after another) fails the test instead of hanging it.
const GIVE_UP: Duration = Duration::from_secs(15);

fn start(tweak: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    let mut config = ServerConfig::default();
    config.runtime.listen = vec!["127.0.0.1:0".parse().unwrap()];
    config.runtime.workers = 2;
    tweak(&mut config);
    Server::new(config, router())
        .start()
        .expect("server starts")
}

fn router() -> Router {
    Router::new()
        .get("/hello", |_: &Request<'_>, _: &mut HandlerContext<'_>| {
            Reply::Now(Response::text(200, "hello\n"))
        })
        .post("/echo", |req: &Request<'_>, _: &mut HandlerContext<'_>| {
            Reply::Now(Response::new(200).with_body(Body::Owned(req.body.to_vec())))
        })
        .get("/big", |_: &Request<'_>, _: &mut HandlerContext<'_>| {
            Reply::Now(Response::new(200).with_body(Body::Owned(vec![b'x'; BIG])))
        })
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// How a stream ended for the client.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The server closed (FIN).
    Eof,
    /// The server reset the connection (or similar hard error).
    Reset(io::ErrorKind),
    /// Nothing arrived for the read timeout, or data kept coming past `GIVE_UP`: the server
    /// kept the connection open.
    TimedOut,
}

/// Reads until the stream ends; returns the byte count, the first 64 KiB, and how it ended.
fn read_until_end(s: &mut TcpStream) -> (usize, Vec<u8>, End) {
    let mut total = 0;
    let mut prefix = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let started = Instant::now();
    loop {
        if started.elapsed() > GIVE_UP {
            return (total, prefix, End::TimedOut);
        }
        match s.read(&mut buf) {
            Ok(0) => return (total, prefix, End::Eof),
            Ok(n) => {
                let keep = n.min((64 * 1024usize).saturating_sub(prefix.len()));
                prefix.extend_from_slice(&buf[..keep]);
                total += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return (total, prefix, End::TimedOut)
            }
            Err(e) => return (total, prefix, End::Reset(e.kind())),
        }
    }
}

/// One keep-alive GET of /hello on an open connection.
fn get_hello(c: &mut Client) -> Resp {
    let r = c.get("/hello", &[]);
    assert_eq!(r.body, b"hello\n");
    assert_eq!(c.buffered(), 0, "nothing beyond the response");
    r
}

/// Polls the server's counters until `ok` holds or `limit` passes; returns whether it held.
fn wait_for(
    stats: &Stats,
    limit: Duration,
    ok: impl Fn(&tern_server::StatsSnapshot) -> bool,
) -> bool {
    eventually(limit, || ok(&stats.snapshot()))
}

#[test]
fn body_timeout_answers_408_and_closes_a_stalled_upload() {
    let server = start(|c| c.body_timeout = Duration::from_secs(1));
    let mut s = connect(server.local_addr());
    // A complete head announcing 100 bytes, then only 10 of them.
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        .unwrap();
    let sent = Instant::now();
    let (_, all, end) = read_until_end(&mut s);
    let waited = sent.elapsed();
    let text = String::from_utf8_lossy(&all);
    assert_eq!(end, End::Eof, "closed cleanly after the answer: {text:?}");
    assert!(
        text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{text:?}"
    );
    assert!(text.contains("\r\nConnection: close\r\n"), "{text:?}");
    assert!(text.contains("\r\nDate: "), "{text:?}");
    assert!(text.ends_with("\r\n\r\nrequest timeout\n"), "{text:?}");
    assert!(
        waited >= Duration::from_millis(800),
        "cut off before the timeout: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(5),
        "cut off too late: {waited:?}"
    );

    let stats = server.stats();
    assert!(wait_for(stats, SOON, |s| s.get(Counter::TimeoutBody) >= 1));
    let snap = stats.snapshot();
    assert_eq!(snap.get(Counter::TimeoutBody), 1);
    assert_eq!(snap.get(Counter::TimeoutHeader), 0);
    assert_eq!(snap.get(Counter::TimeoutWrite), 0);
    assert_eq!(snap.get(Counter::Requests), 1);
    assert_eq!(snap.responses(2), 0);
    assert_eq!(snap.responses(4), 1);
    assert!(wait_for(stats, SOON, |s| s.open_connections() == 0));
}

#[test]
fn body_timeout_is_measured_between_progress_not_in_total() {
    let server = start(|c| c.body_timeout = Duration::from_secs(1));
    let mut s = connect(server.local_addr());
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
        .unwrap();
    // 2.5 s in all, well past the timeout, but never more than 250 ms without progress.
    for chunk in b"abcdefghijklmnopqrst".chunks(2) {
        std::thread::sleep(Duration::from_millis(250));
        s.write_all(chunk).unwrap();
    }
    let r = Client::over(s).read_response(false);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"abcdefghijklmnopqrst");
    assert!(!r.closes(), "{r:?}");
    assert_eq!(server.stats().snapshot().get(Counter::TimeoutBody), 0);
}

/// A client that reads nothing but sends a byte now and then (the start of a next request)
/// must not push the write deadline back with each: the period runs from when output started
/// waiting, and only bytes it acknowledges start it over (found while fixing issue 21's
/// HTTP/2 stall: HTTP/1.1 re-armed the deadline on every event).
#[test]
fn a_client_trickling_bytes_without_reading_still_times_out() {
    let server = start(|c| c.write_timeout = Duration::from_secs(1));
    let stats = server.stats();
    let mut s = connect(server.local_addr());
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let sent = Instant::now();
    let next = b"GET /hello HTTP/1.1\r\nHost: x\r\n";
    let mut i = 0;
    // A byte every 200 ms for at most 8 s: five per write-timeout period.
    while stats.snapshot().get(Counter::TimeoutWrite) == 0
        && sent.elapsed() < Duration::from_secs(8)
    {
        if s.write_all(&next[i % next.len()..][..1]).is_err() {
            break;
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    // Cut while the trickle went on (a second's period and a loaded machine's slack), not
    // only once it stopped.
    let cut = sent.elapsed();
    assert_eq!(
        stats.snapshot().get(Counter::TimeoutWrite),
        1,
        "the trickle kept the stalled answer open for {cut:?}"
    );
    assert!(cut < Duration::from_secs(6), "cut only after {cut:?}");
    assert!(wait_for(stats, SOON, |s| s.open_connections() == 0));
}

#[test]
fn write_timeout_drops_a_client_that_stops_reading() {
    let server = start(|c| c.write_timeout = Duration::from_secs(1));
    let stats = server.stats();
    let head_len;

    // Control: a client that reads gets the whole body, and no timeout is counted.
    {
        let mut s = connect(server.local_addr());
        s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let (n, prefix, end) = read_until_end(&mut s);
        assert_eq!(end, End::Eof);
        head_len = find(&prefix, b"\r\n\r\n").expect("a head") + 4;
        let head = String::from_utf8_lossy(&prefix[..head_len]);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains(&format!("\r\nContent-Length: {BIG}\r\n")),
            "{head}"
        );
        assert_eq!(n, head_len + BIG);
        assert!(wait_for(stats, SOON, |s| s.open_connections() == 0));
        assert_eq!(stats.snapshot().get(Counter::TimeoutWrite), 0);
    }

    // A client that asks for the big body and then reads nothing.
    let mut s = connect(server.local_addr());
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let sent = Instant::now();
    assert!(
        wait_for(stats, SOON, |s| s.get(Counter::TimeoutWrite) >= 1),
        "no write timeout within {SOON:?}"
    );
    let fired = sent.elapsed();
    assert!(
        fired >= Duration::from_millis(800),
        "timed out before the write timeout: {fired:?}"
    );
    assert!(
        fired < Duration::from_secs(5),
        "timed out too late: {fired:?}"
    );
    assert!(
        wait_for(stats, SOON, |s| s.open_connections() == 0),
        "the stalled connection was closed"
    );

    // Reading now yields what the kernel had buffered, then the end: never the whole body.
    let (n, prefix, end) = read_until_end(&mut s);
    assert!(
        matches!(end, End::Eof | End::Reset(_)),
        "the server closed the connection: {end:?} after {n} bytes"
    );
    assert!(prefix.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(
        n < head_len + BIG,
        "the whole body arrived ({n} bytes): the connection was not cut off"
    );
    let snap = stats.snapshot();
    assert_eq!(snap.get(Counter::TimeoutWrite), 1);
    assert_eq!(snap.get(Counter::TimeoutIdle), 0);
}

/// Reads up to 16 KiB every `every` for `total`, on a fixed schedule; the bytes read. The
/// server must keep the connection open all along.
fn read_paced(s: &mut TcpStream, every: Duration, total: Duration) -> usize {
    let started = Instant::now();
    let mut buf = vec![0u8; 16 * 1024];
    let mut got = 0usize;
    let mut next = started;
    while started.elapsed() < total {
        next += every;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let n = s.read(&mut buf).expect("the reader is still served");
        assert!(n > 0, "closed after {got} bytes in {:?}", started.elapsed());
        got += n;
    }
    got
}

#[test]
fn write_timeout_spares_a_client_that_reads_slowly() {
    // 16 KiB every 100 ms: far slower than the kernel's "writable" wake-ups (a third of a
    // multi-MiB send buffer), so only the client's acknowledgements show it is reading.
    let server = start(|c| c.write_timeout = Duration::from_secs(1));
    let stats = server.stats();
    let mut s = connect(server.local_addr());
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let got = read_paced(
        &mut s,
        Duration::from_millis(100),
        Duration::from_millis(3500),
    );
    assert_eq!(
        stats.snapshot().get(Counter::TimeoutWrite),
        0,
        "a reading client was timed out ({got} bytes read)"
    );
    assert_eq!(stats.snapshot().open_connections(), 1);
    // Now it stops reading altogether: cut off after the timeout like any stalled client.
    assert!(
        wait_for(stats, SOON, |s| s.get(Counter::TimeoutWrite) == 1),
        "the stalled reader was not timed out"
    );
}

/// A client reading steadily, fast enough that the kernel wakes tern to refill its socket
/// within a write period: tern's refills keep the send queue as full as when the period
/// began, so only the bytes sent since show that it reads. Before that counted, such a
/// client (2 MB/s here) was cut off after a few periods.
#[test]
fn write_timeout_spares_a_steady_reader_whose_reads_let_tern_refill() {
    let server = start(|c| c.write_timeout = Duration::from_secs(1));
    let stats = server.stats();
    let mut s = connect(server.local_addr());
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // 16 KiB every 8 ms: about 2 MB/s, for 5 write periods.
    let got = read_paced(&mut s, Duration::from_millis(8), Duration::from_secs(5));
    assert_eq!(
        stats.snapshot().get(Counter::TimeoutWrite),
        0,
        "a reading client was timed out ({got} bytes read)"
    );
}

#[test]
fn connection_limit_refuses_extras_and_near_it_keep_alive_stops() {
    const MAX: usize = 20;
    const NEAR: usize = MAX - MAX / 10; // 18: from here on, answers close their connection
    const EXTRA: usize = 3;
    let server = start(|c| {
        c.runtime.workers = 1;
        c.max_connections_per_worker = MAX;
    });
    let addr = server.local_addr();
    let stats = server.stats();

    // Below the threshold, answers keep their connections alive.
    let mut open = Vec::new();
    for i in 1..NEAR {
        let mut c = Client::connect(addr);
        let r = get_hello(&mut c);
        assert_eq!(r.status, 200);
        assert!(!r.closes(), "connection {i}: {r:?}");
        open.push(c);
    }
    // The connection that reaches the threshold is answered, with close, and closed.
    let mut c = Client::connect(addr);
    let r = get_hello(&mut c);
    assert_eq!(r.status, 200);
    assert!(r.closes(), "connection {NEAR}: {r:?}");
    assert_eq!(read_until_end(&mut c.stream), (0, Vec::new(), End::Eof));
    drop(c);

    // Fill up to the limit with idle connections and wait until the worker holds them all.
    for _ in NEAR..=MAX {
        open.push(Client::connect(addr));
    }
    assert_eq!(open.len(), MAX);
    assert!(
        wait_for(stats, SOON, |s| {
            s.get(Counter::ConnectionsAccepted) == MAX as u64 + 1
                && s.open_connections() == MAX as u64
        }),
        "{:?}",
        stats.snapshot()
    );

    // Over the limit: closed at once, without an answer.
    for i in 0..EXTRA {
        let mut s = connect(addr);
        let t = Instant::now();
        // The write may fail if the server has already closed; the read tells.
        let _ = s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
        let (n, got, end) = read_until_end(&mut s);
        assert_eq!(
            n,
            0,
            "extra {i} got an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(
            matches!(end, End::Eof | End::Reset(_)),
            "extra {i} was not closed: {end:?}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "extra {i}: {:?}",
            t.elapsed()
        );
    }
    assert!(wait_for(stats, SOON, |s| {
        s.get(Counter::ConnectionsRefused) == EXTRA as u64
    }));
    let snap = stats.snapshot();
    assert_eq!(snap.get(Counter::ConnectionsAccepted), MAX as u64 + 1);
    assert_eq!(snap.open_connections(), MAX as u64);

    // The connections already open are still served. While the worker holds NEAR or more,
    // each answer closes its connection; below that, keep-alive is back.
    let mut still_open = Vec::new();
    for (i, mut c) in open.into_iter().enumerate() {
        let r = get_hello(&mut c);
        assert_eq!(r.status, 200, "connection {i}");
        let held = MAX - i; // connections the worker holds while answering this one
        if held >= NEAR {
            assert!(r.closes(), "connection {i}: {r:?}");
            assert_eq!(read_until_end(&mut c.stream).2, End::Eof, "connection {i}");
        } else {
            assert!(!r.closes(), "connection {i}: {r:?}");
            still_open.push(c);
        }
    }
    assert_eq!(still_open.len(), NEAR - 1);
    // They stay usable, and the limit has room again: a new connection is served.
    for c in &mut still_open {
        let r = get_hello(c);
        assert_eq!(r.status, 200);
        assert!(!r.closes(), "{r:?}");
    }
    let mut c = Client::connect(addr);
    let r = get_hello(&mut c);
    assert_eq!(r.status, 200);
    assert!(r.closes(), "at the threshold again: {r:?}");
    assert_eq!(
        stats.snapshot().get(Counter::ConnectionsRefused),
        EXTRA as u64
    );
}
