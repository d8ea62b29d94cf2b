//! What tests and fuzz targets need from outside the crate: the whole worker over sockets in
//! memory ([`MemoryWorker`]), one client connection to it as a handle ([`MemoryConn`]), an
//! upstream group it plays ([`MemoryUpstream`], [`ForwardAll`]), the strict reader of a
//! connection's answers ([`parse_responses`]), a request for handler tests
//! ([`with_request`]), and pending replies outside any worker ([`TestReplies`]). This is
//! what the sans-IO split buys: the fuzzers (`fuzz/fuzz_targets/tls_http.rs`,
//! `proxy_relay.rs`) run the transport, the protocols, the relay, the upstream pool and the
//! handlers (the very worker and socket loop a server runs) without the network or threads.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tern_codec::{parse_request, Limits, Method, RequestHead};
use tern_runtime::DetachedInbox;
use tern_tls::TlsAcceptor;

use crate::config::ServerConfig;
use crate::handler::WorkerMessage;
use crate::handler::{Handler, HandlerContext, Pending, Reply, Request};
use crate::response::Response;
use crate::router::Router;
use crate::stats::Stats;
use crate::upstream::{Forward, UpstreamAddr, UpstreamOutcome, UpstreamTimeouts, Upstreams};

/// The whole worker over sockets in memory, with a manual clock (see `memory_worker.rs`).
pub use crate::memory_worker::MemoryWorker;
pub use tern_runtime::io::{MemoryAddr, MemoryPeer};

/// Rounds of [`MemoryConn::upstream_answers`] before it gives up on a relay that keeps
/// sending (each round answers what reached the upstream, then lets the worker settle).
const MAX_UPSTREAM_ROUNDS: usize = 100_000;

/// One client connection to a [`MemoryWorker`] of its own, fed and read as a whole: the
/// bytes fed arrive as the kernel would hand them over, the worker runs until it settles,
/// and what it sent is collected. Relayed exchanges reach [`MemoryUpstream`]'s address,
/// whose side [`MemoryConn::upstream_answers`] plays. Deferred replies are completed only if
/// their handler does so itself.
pub struct MemoryConn {
    worker: MemoryWorker,
    /// The client's end, from the first bytes fed on (the listener hands a connection over
    /// with its first bytes).
    client: Option<MemoryPeer>,
    /// The upstream's ends of the connections the worker made, and the exchange of each that
    /// was answered last.
    upstreams: Vec<(MemoryPeer, u32)>,
    /// Upstream connections opened so far.
    upstream_connections: usize,
}

impl MemoryConn {
    /// A connection as if accepted on a TLS listener (with `tls`) or a plain one.
    pub fn new(router: Router, tls: Option<Arc<TlsAcceptor>>) -> io::Result<MemoryConn> {
        MemoryConn::with_config(router, ServerConfig::default(), tls)
    }

    /// The same with a server config of the test's own.
    pub fn with_config(
        router: Router,
        config: ServerConfig,
        tls: Option<Arc<TlsAcceptor>>,
    ) -> io::Result<MemoryConn> {
        let mut worker = MemoryWorker::with_tls(router, config, None, tls);
        worker.io().listen(upstream_addr());
        Ok(MemoryConn {
            worker,
            client: None,
            upstreams: Vec::new(),
            upstream_connections: 0,
        })
    }

    /// Counts into `stats` (whose rows a handler of the router was given) instead of
    /// counters of its own.
    pub fn with_stats(mut self, stats: Stats) -> MemoryConn {
        assert!(self.client.is_none(), "counters are chosen before any byte");
        self.worker = self.worker.with_stats(stats);
        self
    }

    /// Bytes from the peer, read by the worker as they arrive; it runs until it settles.
    pub fn feed(&mut self, bytes: &[u8]) {
        match &self.client {
            None => self.client = Some(self.worker.connect(bytes)),
            Some(c) if c.closed_by_worker() => {}
            Some(c) => {
                c.write(bytes);
                self.worker.settle();
            }
        }
    }

    /// The peer closed its side.
    pub fn feed_eof(&mut self) {
        if self.client.is_none() {
            self.feed(&[]);
        }
        if let Some(c) = &self.client {
            c.shutdown();
            self.worker.settle();
        }
    }

    /// Everything the connection has sent since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        self.client
            .as_ref()
            .map(MemoryPeer::read)
            .unwrap_or_default()
    }

    /// The connection closed (or shut its write side down to linger).
    pub fn is_closed(&self) -> bool {
        self.client
            .as_ref()
            .is_some_and(|c| c.closed_by_worker() || c.shut_by_worker())
    }

    /// An exchange is still being relayed (its answer may be incomplete so far).
    pub fn relaying(&mut self) -> bool {
        self.worker.relaying()
    }

    /// The server's counters (handshakes, failures, responses).
    pub fn stats(&self) -> &Stats {
        self.worker.stats_handle()
    }

    /// Upstream connections the worker opened so far (the others were reused from its
    /// pool, which keeps one for [`MemoryUpstream`]).
    pub fn upstream_connections(&self) -> usize {
        self.upstream_connections
    }

    /// Plays the upstream server of a relayed exchange: takes what the connection sends it
    /// (returned), answers `answer` in reads of at most `piece` bytes, then closes if
    /// `close`. Every step the client side runs too (its output is collected as usual).
    pub fn upstream(&mut self, answer: &[u8], piece: usize, close: bool) -> Vec<u8> {
        self.upstream_answers(&[answer], piece, close)
    }

    /// Plays the upstream server of the exchanges relayed from here on, over as many
    /// connections as the worker opens; the worker keeps them in its pool between exchanges
    /// by its own rule. Each request reaching a connection (the first bytes of an exchange
    /// on it) is answered with the next of `answers`, any bytes: a well-formed answer, a
    /// broken one, one followed by surplus bytes or by whole answers nobody asked for. The
    /// worker reads at most `piece` bytes at a time. With `close`, a connection with no
    /// answer left to give is closed by the upstream (after its last one). Returns the bytes
    /// the upstream received.
    ///
    /// Panics if the worker takes a connection from its pool for a new exchange while bytes
    /// the upstream sent earlier are still unread in it: they would be read as the new
    /// request's answer.
    pub fn upstream_answers(&mut self, answers: &[&[u8]], piece: usize, close: bool) -> Vec<u8> {
        let piece = piece.max(1);
        let mut got = Vec::new();
        let mut answers = answers.iter();
        let addr = upstream_addr();
        for _ in 0..MAX_UPSTREAM_ROUNDS {
            let mut moved = false;
            while let Some(peer) = self.worker.io().accept(&addr) {
                peer.set_max_read(piece);
                self.upstreams.push((peer, 0));
                self.upstream_connections += 1;
                moved = true;
            }
            for (peer, answered) in &mut self.upstreams {
                let bytes = peer.read();
                if !bytes.is_empty() {
                    moved = true;
                    got.extend_from_slice(&bytes);
                    let exchange = peer.exchanges();
                    if *answered != exchange {
                        // A request (its first bytes) reached the upstream: it answers.
                        *answered = exchange;
                        if let Some(answer) = answers.next() {
                            peer.write(answer);
                        }
                        if close && answers.as_slice().is_empty() {
                            peer.shutdown();
                        }
                    }
                }
                assert_eq!(
                    peer.reused_with_unread_bytes(),
                    0,
                    "an upstream connection was reused with bytes of an earlier answer unread \
                     in it: they would be read as the next request's answer"
                );
            }
            self.upstreams.retain(|(p, _)| !p.closed_by_worker());
            if !moved {
                break;
            }
            self.worker.settle();
        }
        got
    }
}

/// Where [`MemoryUpstream`] is (nobody listens there but the worker in memory).
fn upstream_addr() -> MemoryAddr {
    match MemoryUpstream::default().addr {
        UpstreamAddr::Tcp(a) => MemoryAddr::Tcp(a),
        UpstreamAddr::Unix(p) => MemoryAddr::Unix(p),
    }
}

/// Runs `f` on the [`Request`] a handler would get for `raw` (a whole HTTP/1.1 head, parsed
/// by the codec, so its path is canonical) from `peer`, over TLS if `secure`: for unit tests
/// of handlers, guards and what the proxy forwards. Panics if `raw` is not a whole request.
pub fn with_request<R>(
    raw: &[u8],
    peer: SocketAddr,
    secure: bool,
    f: impl FnOnce(&Request<'_>) -> R,
) -> R {
    let mut headers = [std::mem::MaybeUninit::uninit(); 64];
    let Ok(tern_codec::Parsed::Complete(head)) =
        parse_request(raw, &mut headers, &Limits::default())
    else {
        panic!(
            "test request must parse: {:?}",
            String::from_utf8_lossy(raw)
        );
    };
    f(&Request {
        head: &head,
        body: &[],
        peer,
        secure,
        local_port: if secure { 443 } else { 80 },
        unix_secs: 0,
        now_ms: 0,
    })
}

/// One response as a strict HTTP/1.1 client reads it: status, whether its body was
/// complete, and the body (chunks joined).
#[derive(Debug, PartialEq, Eq)]
pub struct Parsed {
    pub status: u16,
    pub body: Vec<u8>,
    pub complete: bool,
}

/// Reads a connection's whole output as responses to `requests` requests (HEAD ones named
/// in `head`), strictly: every head well-formed, exactly one framing, chunks well-formed.
/// Only the last response may be incomplete, and only if the connection `closed`. An error
/// is a desync: bytes a client would misread.
pub fn parse_responses(mut out: &[u8], head: &[bool], closed: bool) -> Result<Vec<Parsed>, String> {
    let mut all = Vec::new();
    let mut i = 0;
    while !out.is_empty() {
        let end = find(out, b"\r\n\r\n").ok_or("an incomplete head")?;
        // Field values may hold obs-text (bytes above 0x7f): read them as Latin-1 would.
        let text: String = out[..end].iter().map(|&b| b as char).collect();
        out = &out[end + 4..];
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or("");
        let status: u16 = line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|r| r.get(..3))
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad status line {line:?}"))?;
        let mut length = None;
        let mut chunked = false;
        for l in lines {
            let (n, v) = l
                .split_once(": ")
                .ok_or_else(|| format!("bad field {l:?}"))?;
            if n.eq_ignore_ascii_case("content-length") {
                if length.is_some() {
                    return Err("two lengths".into());
                }
                length = Some(v.parse::<usize>().map_err(|_| "bad length")?);
            } else if n.eq_ignore_ascii_case("transfer-encoding") {
                if v != "chunked" || chunked {
                    return Err(format!("transfer-encoding {v:?}"));
                }
                chunked = true;
            }
        }
        if chunked && length.is_some() {
            return Err("both framings".into());
        }
        if (100..200).contains(&status) && status != 101 {
            all.push(Parsed {
                status,
                body: Vec::new(),
                complete: true,
            });
            continue; // interim: the same request's answer follows
        }
        let is_head = head.get(i).copied().unwrap_or(false);
        i += 1;
        if status == 101 {
            all.push(Parsed {
                status,
                body: out.to_vec(),
                complete: true,
            });
            return Ok(all); // a tunnel: whatever follows is not HTTP
        }
        let mut body = Vec::new();
        let complete;
        if is_head || status == 204 || status == 304 {
            complete = true;
        } else if chunked {
            loop {
                let Some(e) = find(out, b"\r\n") else {
                    complete = false;
                    out = &[];
                    break;
                };
                let size = std::str::from_utf8(&out[..e])
                    .ok()
                    .and_then(|t| usize::from_str_radix(t, 16).ok());
                let size = size.ok_or("bad chunk size")?;
                out = &out[e + 2..];
                if size == 0 {
                    if !out.starts_with(b"\r\n") {
                        if out.len() < 2 && closed {
                            complete = false;
                            out = &[];
                            break;
                        }
                        return Err("no end of the chunked body".into());
                    }
                    out = &out[2..];
                    complete = true;
                    break;
                }
                if out.len() < size + 2 {
                    complete = false;
                    out = &[];
                    break;
                }
                if &out[size..size + 2] != b"\r\n" {
                    return Err("a chunk without its CRLF".into());
                }
                body.extend_from_slice(&out[..size]);
                out = &out[size + 2..];
            }
        } else if let Some(n) = length {
            let take = n.min(out.len());
            body.extend_from_slice(&out[..take]);
            out = &out[take..];
            complete = take == n;
        } else {
            if !closed {
                return Err("an unframed body on a connection that stays open".into());
            }
            body.extend_from_slice(out);
            out = &[];
            complete = true;
        }
        if !complete && !closed {
            return Err("an incomplete answer on a connection that stays open".into());
        }
        all.push(Parsed {
            status,
            body,
            complete,
        });
        if !complete && !out.is_empty() {
            return Err("bytes after an incomplete answer".into());
        }
    }
    Ok(all)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// An upstream group of one server that [`MemoryConn::upstream`] plays.
pub struct MemoryUpstream {
    addr: UpstreamAddr,
}

impl Default for MemoryUpstream {
    fn default() -> Self {
        MemoryUpstream {
            addr: UpstreamAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 9))),
        }
    }
}

impl Upstreams for MemoryUpstream {
    fn pool_key(&self) -> u64 {
        1
    }
    fn addr(&self, _: usize) -> &UpstreamAddr {
        &self.addr
    }
    fn pick(&self, _: usize, _: u64, tried: u64) -> Option<usize> {
        (tried & 1 == 0).then_some(0)
    }
    fn begin(&self, _: usize, _: usize) {}
    fn end(&self, _: usize, _: usize, _: UpstreamOutcome, _: u64) {}
    fn timeouts(&self) -> UpstreamTimeouts {
        UpstreamTimeouts::default()
    }
    fn max_idle(&self) -> usize {
        1
    }
}

/// A handler that forwards every request to a [`MemoryUpstream`] as it came (request line
/// and Host), streaming bodies; WebSocket handshakes (a `Upgrade: websocket` field) as such.
pub struct ForwardAll(pub Arc<MemoryUpstream>);

impl Handler for ForwardAll {
    fn handle(&self, req: &Request<'_>, _: &mut HandlerContext<'_>) -> Reply {
        let head = format!(
            "{} {} HTTP/1.1\r\nHost: upstream\r\n",
            req.head.method_str, req.head.target
        );
        let upgrade = req
            .header("upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case(b"websocket"));
        Reply::Forward(Box::new(Forward {
            upstreams: self.0.clone(),
            head: head.into_bytes(),
            idempotent: matches!(req.method(), Method::Get | Method::Head),
            upgrade,
            edit: None,
            own_answers: None,
            max_body: u64::MAX,
            wire: Default::default(),
            not_before_ms: 0,
            tee: None,
            hold: None,
            fallback: None,
        }))
    }

    fn streams_body(&self, _: &RequestHead<'_>) -> bool {
        true
    }
}

/// Pending replies for unit tests of code that completes them (an app's store, a background
/// thread), outside any worker: completions land in an inbox no worker reads, and
/// `completed` takes them out. `wait` sleeps the way a worker does, in `epoll_wait` until the
/// inbox's waker fires, so a benchmark can measure a real hand-off to another thread.
pub struct TestReplies {
    inbox: DetachedInbox<WorkerMessage>,
}

impl TestReplies {
    pub fn new() -> TestReplies {
        TestReplies {
            inbox: DetachedInbox::new(4096).expect("a poll instance"),
        }
    }

    /// Waits up to `timeout` for the inbox's waker, as a worker's event loop does (a
    /// completion, or `complete_all`'s one wake-up for a batch); false if it did not fire.
    /// A wake-up that came before the call is seen at once. Take the replies with
    /// `completed`, which also re-arms the waker.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        self.inbox.wait(timeout)
    }

    /// A reply to be completed; `seq` tells it apart in `completed`.
    pub fn pending(&self, seq: u64) -> Pending {
        Pending::new(self.inbox.sender(), 0, crate::handler::ExchangeId(seq))
    }

    /// The replies completed so far, as (seq, response), in the order they came.
    pub fn completed(&self) -> Vec<(u64, Response)> {
        let mut out = Vec::new();
        self.inbox.inbox().drain(|m| match m {
            WorkerMessage::Complete {
                exchange, response, ..
            } => out.push((exchange.0, response)),
            WorkerMessage::Wake { .. } | WorkerMessage::Datagram(_) => {}
        });
        out
    }
}

impl Default for TestReplies {
    fn default() -> TestReplies {
        TestReplies::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Response, Router};

    fn router() -> Router {
        Router::new().get(
            "/hi",
            |_: &crate::Request<'_>, _: &mut crate::HandlerContext<'_>| {
                Response::text(200, "hi\n").into()
            },
        )
    }

    #[test]
    fn test_replies_wait_for_the_wake_up_of_a_completion_from_another_thread() {
        use std::time::Duration;
        let replies = TestReplies::new();
        assert!(
            !replies.wait(Duration::from_millis(20)),
            "nothing completed yet"
        );
        let pending = replies.pending(7);
        let completer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            crate::complete_all([(pending, Response::text(200, "ok\n"))]);
        });
        assert!(replies.wait(Duration::from_secs(5)));
        completer.join().unwrap();
        let done: Vec<_> = replies
            .completed()
            .into_iter()
            .map(|(seq, r)| (seq, r.status))
            .collect();
        assert_eq!(done, [(7, 200)]);
        // The wake-up was taken: the next wait sleeps again.
        assert!(!replies.wait(Duration::from_millis(20)));
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_in_memory() {
        let mut c = MemoryConn::new(router(), None).unwrap();
        c.feed(b"GET /hi HTTP/1.1\r\nHost: a\r\n\r\nGET /nope HTTP/1.1\r\nHost: a\r\n\r\n");
        let out = String::from_utf8(c.take_output()).unwrap();
        let first = out.find("200 OK").unwrap();
        let second = out.find("404 Not Found").unwrap();
        assert!(first < second, "{out}");
        assert!(!c.is_closed());
        c.feed(b"GET /hi HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        assert!(c.is_closed());
    }

    fn relay() -> MemoryConn {
        let router = Router::new().fallback(ForwardAll(Arc::new(MemoryUpstream::default())));
        MemoryConn::new(router, None).unwrap()
    }

    #[test]
    fn a_relayed_exchange_in_memory_in_every_piece_size() {
        let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        for piece in [1, 2, 7, 64, 4096] {
            let mut c = relay();
            c.feed(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc");
            let sent = c.upstream(answer, piece, false);
            assert_eq!(
                String::from_utf8_lossy(&sent),
                "POST /p HTTP/1.1\r\nHost: upstream\r\nContent-Length: 3\r\n\r\nabc"
            );
            let out = c.take_output();
            let text = String::from_utf8_lossy(&out).into_owned();
            assert!(
                text.contains("\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
                "{text}"
            );
            let parsed = parse_responses(&out, &[false], false).unwrap();
            assert_eq!(
                parsed,
                [Parsed {
                    status: 200,
                    body: b"hello".to_vec(),
                    complete: true
                }]
            );
            assert!(!c.is_closed());
            // The connection goes on with the next request.
            c.feed(b"GET /again HTTP/1.1\r\nHost: a\r\n\r\n");
            let sent = c.upstream(b"HTTP/1.1 204 No Content\r\n\r\n", piece, false);
            assert!(sent.starts_with(b"GET /again HTTP/1.1\r\n"));
            assert!(String::from_utf8(c.take_output())
                .unwrap()
                .starts_with("HTTP/1.1 204 No Content\r\n"));
        }
    }

    #[test]
    fn upstream_connections_are_reused_only_with_nothing_after_the_answer() {
        const NEXT: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext";
        for piece in [1, 2, 7, 64, 4096] {
            // A clean answer: the next exchange takes the same connection.
            let mut c = relay();
            c.feed(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n");
            c.upstream_answers(
                &[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", NEXT],
                piece,
                false,
            );
            let out = c.take_output();
            let parsed = parse_responses(&out, &[false, false], false).unwrap();
            assert_eq!(parsed[1].body, b"next");
            assert_eq!(c.upstream_connections(), 1, "piece {piece}");
            // An answer with another behind it, nobody's (whatever the reads' sizes, the
            // first answer's end among them): the next exchange gets a new connection and its
            // own answer.
            let mut c = relay();
            c.feed(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n");
            c.upstream_answers(
                &[
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray",
                    NEXT,
                ],
                piece,
                false,
            );
            let out = c.take_output();
            let parsed = parse_responses(&out, &[false, false], false).unwrap();
            assert_eq!(parsed[1].body, b"next", "piece {piece}");
            assert_eq!(c.upstream_connections(), 2, "piece {piece}");
            // A GET body the upstream may read as a request of its own: not reused either.
            let mut c = relay();
            c.feed(b"GET /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /2 HTTP/1.1\r\nHost: a\r\n\r\n");
            c.upstream_answers(
                &[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", NEXT],
                piece,
                false,
            );
            assert_eq!(c.upstream_connections(), 2, "piece {piece}");
        }
    }

    #[test]
    fn broken_answers_are_502_before_the_head_and_a_cut_after() {
        let mut c = relay();
        c.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        c.upstream(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
            3,
            true,
        );
        let out = String::from_utf8(c.take_output()).unwrap();
        assert!(out.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{out}");
        assert!(!c.is_closed());
        c.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        c.upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 3, true);
        let out = String::from_utf8(c.take_output()).unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("\r\n\r\nabc"),
            "{out}"
        );
        assert!(
            c.is_closed(),
            "a cut-short body closes the client connection"
        );
    }

    #[test]
    fn garbage_on_a_tls_connection_fails_the_handshake_with_an_alert() {
        let acceptor = TlsAcceptor::new(&tern_tls::TlsOptions {
            self_signed: true,
            alpn: vec![b"http/1.1".to_vec()],
            ..Default::default()
        })
        .unwrap();
        let mut c = MemoryConn::new(router(), Some(Arc::new(acceptor))).unwrap();
        c.feed(&[0x16, 0x03, 0x01, 0x00, 0x04, 1, 0, 0, 0]);
        let out = c.take_output();
        assert!(c.is_closed());
        assert_eq!(out.first(), Some(&0x15), "an alert record: {out:?}");
        let s = c.stats().snapshot();
        assert_eq!(s.get(crate::Counter::TlsFailedBadRecord), 1);
    }
}
