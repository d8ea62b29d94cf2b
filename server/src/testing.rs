//! A connection driven in memory, with no socket: the very [`Conn`](crate::conn) a worker runs,
//! fed bytes by the caller, its output collected. This is what the sans-IO split buys: the
//! fuzzer (`fuzz/fuzz_targets/tls_http.rs`) and tests run the transport, the protocol and the
//! handlers without the network or threads. Deferred replies are never completed here.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;

use tern_codec::{parse_request, Limits, Method, RequestHead};
use tern_runtime::{BufPool, Clock, DetachedInbox, InboxSender};
use tern_tls::TlsAcceptor;

use crate::config::{ListenerKind, ServerConfig};
use crate::conn::output::MAX_IOVECS;
use crate::conn::{Action, Conn, Link, RelayNeed, Transmit};
use crate::exchange::ConnCx;
use crate::handler::WorkerMessage;
use crate::handler::{Handler, HandlerContext, Pending, Reply, Request};
use crate::response::Response;
use crate::router::Router;
use crate::stats::Stats;
use crate::upstream::{Forward, UpstreamAddr, UpstreamOutcome, UpstreamTimeouts, Upstreams};
use tern_runtime::io::Waiting;

/// The whole worker over sockets in memory, with a manual clock (see `memory_worker.rs`).
pub use crate::memory_worker::MemoryWorker;
pub use tern_runtime::io::{MemoryAddr, MemoryPeer};

/// The borrowed worker state a step of the connection runs with (a macro: it borrows
/// fields of the `MemoryConn` one by one, leaving `conn` and `output` free).
macro_rules! conn_cx {
    ($this:ident) => {
        ConnCx {
            router: &$this.router,
            acme: None,
            bans: None,
            hsts_line: None,
            config: &$this.config,
            stats: $this.stats.worker(0),
            clock: &$this.clock,
            buffers: &mut $this.buffers,
            scratch: &mut $this.scratch,
            access_log: None,
            inbox: &$this.inbox,
            worker_id: 0,
            stopping: false,
            draining: false,
            near_limit: false,
        }
    };
}

/// One connection, in memory.
pub struct MemoryConn {
    router: Router,
    config: ServerConfig,
    stats: Stats,
    clock: Clock,
    buffers: BufPool,
    scratch: Vec<u8>,
    inbox: InboxSender<WorkerMessage>,
    /// Where the connection's deferred replies land (kept open for the senders).
    _replies: DetachedInbox<WorkerMessage>,
    conn: Conn,
    output: Vec<u8>,
    closed: bool,
    eof_delivered: bool,
    /// The upstream connection kept idle between exchanges (a pool of one).
    pooled: Option<FakeUpstreamConn>,
    /// Upstream connections opened so far.
    upstream_connections: usize,
    /// Exchanges relayed so far (numbers the bytes each exchange's answer came in).
    exchanges: u32,
}

/// One upstream connection as [`MemoryConn::upstream_answers`] plays it.
#[derive(Default)]
struct FakeUpstreamConn {
    /// Bytes the upstream sent that the relay has not read yet, each with the number of the
    /// exchange whose request it was answering.
    unread: VecDeque<(u32, u8)>,
    /// The exchange this connection last received a request of (answered once).
    answering: Option<u32>,
    /// The upstream closed its side (after `unread`); `eof_told`: the relay read the EOF.
    closed: bool,
    eof_told: bool,
}

impl FakeUpstreamConn {
    /// What a peek at its socket would find (see `UpStream::waiting`).
    fn waiting(&self) -> Waiting {
        if !self.unread.is_empty() {
            Waiting::Bytes
        } else if self.closed {
            Waiting::Closed
        } else {
            Waiting::Nothing
        }
    }
}

impl MemoryConn {
    /// A connection as if accepted on a TLS listener (with `tls`) or a plain one.
    pub fn new(router: Router, tls: Option<Arc<TlsAcceptor>>) -> io::Result<MemoryConn> {
        let config = ServerConfig {
            listener_kinds: vec![if tls.is_some() {
                ListenerKind::Https
            } else {
                ListenerKind::Http
            }],
            ..ServerConfig::default()
        };
        let replies = DetachedInbox::new(16)?;
        let inbox = replies.sender();
        let session = tls.as_ref().map(|t| t.accept());
        let link = Link {
            peer: SocketAddr::from(([192, 0, 2, 1], 40000)),
            key: 1 << 32,
            secure: session.is_some(),
            redirect_to_https: None,
        };
        Ok(MemoryConn {
            router,
            config,
            stats: Stats::new(1),
            clock: Clock::new(),
            buffers: BufPool::new(4096, 16 * 1024, 4),
            scratch: Vec::new(),
            inbox,
            _replies: replies,
            conn: Conn::new(link, session, 0),
            output: Vec::new(),
            closed: false,
            eof_delivered: false,
            pooled: None,
            upstream_connections: 0,
            exchanges: 0,
        })
    }

    /// Counts into `stats` (whose rows a handler of the router was given) instead of
    /// counters of its own.
    pub fn with_stats(mut self, stats: Stats) -> MemoryConn {
        self.stats = stats;
        self
    }

    /// Bytes from the peer, as one read each time the connection asks for input.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.run(bytes, false);
    }

    /// The peer closed its side.
    pub fn feed_eof(&mut self) {
        self.run(&[], true);
    }

    /// Everything the connection has sent since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// The connection closed (or shut its write side down to linger).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// An exchange is still being relayed (its answer may be incomplete so far).
    pub fn relaying(&self) -> bool {
        self.conn.in_relay()
    }

    /// The server's counters (handshakes, failures, responses).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Upstream connections opened so far by [`Self::upstream_answers`] (the others were
    /// reused from its pool of one).
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
    /// connections as the relay asks for, keeping one idle between exchanges by the worker's
    /// pool rule (`UpstreamConns::release` and `take_idle`): in only when its exchange allows
    /// it and nothing waits in its socket, out again only if nothing waits in it then. Each
    /// request reaching a connection is answered with the next of `answers`, any bytes: a
    /// well-formed answer, a broken one, one followed by surplus bytes or by whole answers
    /// nobody asked for. The relay reads at most `piece` bytes at a time. With `close`, a
    /// connection with no answer left to give is closed by the upstream (after its last one).
    /// Returns the bytes the upstream received. Every step the client side runs too.
    ///
    /// Panics if the relay reads, for one exchange, bytes sent in answer to another: the
    /// next request on a reused connection would be answered with them.
    pub fn upstream_answers(&mut self, answers: &[&[u8]], piece: usize, close: bool) -> Vec<u8> {
        let piece = piece.max(1);
        let mut got = Vec::new();
        let mut answers = answers.iter();
        let mut attached: Option<FakeUpstreamConn> = None;
        for _ in 0..1_000_000 {
            if self.closed {
                break;
            }
            let mut cx = conn_cx!(self);
            let mut moved = true;
            // The first relay under way (HTTP/1.1 has one).
            let mut ids = Vec::new();
            self.conn.relay_ids(&mut ids);
            let id = ids.first().copied().unwrap_or(0);
            match self.conn.relay_need(id) {
                RelayNeed::Nothing => moved = false,
                RelayNeed::Release { keep, .. } => {
                    if let Some(c) = attached.take() {
                        if keep && c.waiting() == Waiting::Nothing {
                            self.pooled = Some(c);
                        }
                    }
                    self.conn.relay_released(id, &mut cx);
                    if !self.conn.in_relay() {
                        self.exchanges += 1;
                    }
                }
                RelayNeed::Connect { fresh, .. } => {
                    let idle = if fresh { None } else { self.pooled.take() };
                    match idle.filter(|c| c.waiting() == Waiting::Nothing) {
                        Some(c) => {
                            attached = Some(c);
                            self.conn.relay_attached(id, true, true, &cx);
                        }
                        None => {
                            attached = Some(FakeUpstreamConn::default());
                            self.upstream_connections += 1;
                            self.conn.relay_attached(id, false, false, &cx);
                        }
                    }
                }
                RelayNeed::Connecting => self.conn.relay_connected(id, &cx),
                RelayNeed::Io => {
                    let Some(c) = attached.as_mut() else {
                        break;
                    };
                    let out = self.conn.relay_send_buf(id);
                    let sent = out.len();
                    got.extend_from_slice(out);
                    if sent > 0 {
                        self.conn.relay_sent(id, sent, &cx);
                        // A request (its first bytes) reached the upstream: it answers.
                        if c.answering != Some(self.exchanges) {
                            c.answering = Some(self.exchanges);
                            if let Some(answer) = answers.next() {
                                c.unread.extend(answer.iter().map(|&b| (self.exchanges, b)));
                            }
                            if close && answers.as_slice().is_empty() {
                                c.closed = true;
                            }
                        }
                    } else if !c.unread.is_empty() {
                        let buf = self.conn.relay_recv_buf(id, &mut cx);
                        let n = buf.len().min(piece).min(c.unread.len());
                        if n == 0 {
                            moved = false;
                        } else {
                            for (slot, (exchange, byte)) in buf.iter_mut().zip(c.unread.drain(..n))
                            {
                                assert_eq!(
                                    exchange, self.exchanges,
                                    "bytes sent in answer to exchange {exchange} were read for \
                                     exchange {}: a stray answer reaches another request",
                                    self.exchanges
                                );
                                *slot = byte;
                            }
                            self.conn.relay_recv(id, n, &mut cx);
                        }
                    } else if c.closed && !c.eof_told {
                        c.eof_told = true;
                        self.conn.relay_closed(id, false, &mut cx);
                    } else {
                        moved = false;
                    }
                }
            }
            let before = self.output.len();
            self.run(&[], false);
            if !moved && self.output.len() == before {
                break;
            }
        }
        got
    }

    fn run(&mut self, mut input: &[u8], eof: bool) {
        if self.closed {
            return;
        }
        let mut cx = conn_cx!(self);
        loop {
            loop {
                let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                let sent = match self.conn.poll_transmit(&mut cx, &mut iov) {
                    Transmit::Nothing => break,
                    Transmit::Failed => {
                        self.closed = true;
                        return;
                    }
                    Transmit::Memory { count, .. } => {
                        let mut n = 0;
                        for slice in &iov[..count] {
                            self.output.extend_from_slice(slice);
                            n += slice.len();
                        }
                        n
                    }
                    Transmit::File { file, offset, len } => {
                        let len = len.min(1 << 20) as usize;
                        let start = self.output.len();
                        self.output.resize(start + len, 0);
                        // SAFETY: `file` is open (held by the connection's output for as long
                        // as the segment is queued); the buffer is valid for `len` bytes.
                        let got = unsafe {
                            libc::pread(
                                file,
                                self.output[start..].as_mut_ptr().cast(),
                                len,
                                offset as libc::off_t,
                            )
                        };
                        if got <= 0 {
                            self.output.truncate(start);
                            self.closed = true;
                            return;
                        }
                        self.output.truncate(start + got as usize);
                        got as usize
                    }
                };
                self.conn.handle_sent(sent);
            }
            match self.conn.poll_action(&mut cx) {
                Action::Transmit => {}
                Action::Wait => return,
                Action::Close | Action::ShutdownWrite => {
                    self.conn.prepare_close();
                    let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                    if let Transmit::Memory { count, .. } =
                        self.conn.poll_transmit(&mut cx, &mut iov)
                    {
                        for slice in &iov[..count] {
                            self.output.extend_from_slice(slice);
                        }
                    }
                    self.closed = true;
                    return;
                }
                Action::Read => {
                    if input.is_empty() {
                        if eof && !self.eof_delivered {
                            self.eof_delivered = true;
                            self.conn.handle_eof(&mut cx);
                            continue;
                        }
                        return;
                    }
                    let buf = self.conn.recv_buf(&mut cx);
                    if buf.is_empty() {
                        return;
                    }
                    let n = buf.len().min(input.len());
                    buf[..n].copy_from_slice(&input[..n]);
                    input = &input[n..];
                    self.conn.handle_recv(n, &mut cx);
                }
            }
        }
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
