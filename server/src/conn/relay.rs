//! One exchange relayed to an upstream server: a state of the HTTP/1.1 protocol, or one of
//! an HTTP/2 connection's streams. Sans-IO like the rest of the connection: the driver (`upstream/driver.rs`) attaches an upstream
//! connection, sends [`Relay::send_buf`], reads into [`Relay::recv_buf`], and reports what
//! happened; the relay parses the upstream's answer (`tern_codec::parse_upstream_head`),
//! rewrites its head, and streams its body to the client through the protocol's
//! [`Sink`] (`exchange/sink.rs`): the relay knows no client protocol, HTTP/1.1 framing lives
//! in `http1.rs` and HTTP/2's in `http2.rs`.
//!
//! Memory is bounded both ways: the request body is taken from the client only while less
//! than `TO_UPSTREAM_MAX` waits for the upstream, and the upstream is read only as far as the
//! client side has room (the HTTP/1.1 output under its high-water mark; for an HTTP/2 stream,
//! its share of the connection's relay budget, see `conn/http2.rs`). Time is bounded too: a
//! client that leaves the answer unread stops the upstream's reads, and the upstream idle
//! timeout, which only the upstream's progress moves, then ends the exchange. Framing is re-encoded, never passed
//! through: Content-Length stays a length, a chunked or close-delimited body goes to an
//! HTTP/1.1 client chunked (to HTTP/1.0 until close), and trailers are dropped. An upstream
//! that breaks its framing before the head was passed on gets a 502; after, the client
//! connection is closed, so it can never be desynchronised.

use std::mem::MaybeUninit;

use tern_codec::{parse_upstream_head, BodyDecoder, BodyKind, ResponseBody, UpstreamError};
use tern_runtime::{ratelog, ReadBuf};

use super::output::Output;
use super::types::Link;
use super::up_queue::UpQueue;
use super::upstream_wire::{BodyFraming, FastCgiAnswer};
use super::websocket::Handshake;
use crate::access_log::SavedEntry;
use crate::compression::{self, Choice, EncoderRoom, Streamed};
use crate::exchange::{ConnCx, Sink};
use crate::handler::ExchangeId;
use crate::response::Response;
use crate::stats::{Counter, Tally, UpstreamCounter};
use crate::upstream::{Forward, UpstreamOutcome, UpstreamRow, UpstreamWire};

/// Request bytes waiting for the upstream before the client is read no further.
const TO_UPSTREAM_MAX: usize = 64 * 1024;
/// The largest upstream response head (nginx's default proxy buffer is 4–8 KiB).
const MAX_UPSTREAM_HEAD: usize = 32 * 1024;
/// Upstream reads go into a buffer this large once a body is flowing.
const BODY_READ_SIZE: usize = 64 * 1024;
const MAX_UPSTREAM_HEADERS: usize = 100;

/// Response fields tern never passes on: hop-by-hop ones (RFC 9110 §7.6.1), the framing it
/// re-encodes, and those it writes itself.
const DROPPED_RESPONSE_FIELDS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "date",
    "server",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Held until its deadline (a rate limit's queue): nothing is sent or read until then.
    Wait,
    /// Waiting for the driver to attach a connection (pooled or new).
    Connect,
    /// Attached, the connection being established.
    Connecting,
    /// Sending the request, awaiting and relaying the response.
    Exchange,
    /// After a 101: bytes both ways.
    Tunnel,
    /// Finished; the driver releases the upstream connection.
    Done,
}

/// An exchange a handler forwarded, as the protocol hands it to the relay.
pub(crate) struct RelayStart<'b> {
    pub fwd: Box<Forward>,
    /// On-the-fly compression of the answer, if its route asks for it.
    pub compress: Option<Choice>,
    /// A HEAD request: the answer has no body.
    pub head_only: bool,
    /// The client made no HTTP/1.1 WebSocket handshake of its own (HTTP/2's extended
    /// CONNECT): the relay makes the one the upstream needs, and checks its answer.
    pub handshake_is_ours: bool,
    /// The complete body, if it came with the head.
    pub body: &'b [u8],
    /// A body still to come from the client.
    pub streamed: Option<BodyFollows>,
    /// The request's part of its access-log line.
    pub log: Option<Box<SavedEntry>>,
    /// What the answer is counted under.
    pub tally: Tally,
}

/// How a request body that follows its head arrives.
pub(crate) enum BodyFollows {
    /// HTTP/1.1: in the client's own framing, decoded here.
    Framed(BodyKind),
    /// HTTP/2: DATA payloads as they are; the length if the request declared one (else the
    /// body goes upstream chunked and ends with [`Relay::end_client_body`]).
    Raw(Option<u64>),
}

/// What the relay needs from the driver.
pub(crate) enum RelayNeed {
    /// Nothing now.
    Nothing,
    /// A connection to `server` (`fresh`: not from the pool).
    Connect { server: usize, fresh: bool },
    /// Its attached connection is still connecting: check whether it has.
    Connecting,
    /// Its attached connection: send `send_buf`, read into `recv_buf`.
    Io,
    /// Detach the connection, back into the pool when `keep`.
    Release {
        keep: bool,
        outcome: UpstreamOutcome,
    },
}

/// Where a protocol keeps the exchanges it relays: slots `0..count()`, each a [`Relay`] under
/// its exchange's id, lent with the [`Sink`] its answer goes through. HTTP/1.1 has one slot
/// (the exchange in progress, while it is relayed), HTTP/2 one per relayed stream. The calls
/// the driver makes on them are written once, over this trait, in `conn/relays.rs`; what
/// differs by protocol is here. The slot methods take `i < count()`.
pub(crate) trait Relays {
    /// What a relay writes its answer through.
    type Sink<'a>: Sink
    where
        Self: 'a;

    /// How many relays are under way.
    fn count(&self) -> usize;

    /// The exchange relayed in slot `i`.
    fn id(&self, i: usize) -> ExchangeId;

    fn relay(&self, i: usize) -> &Relay;

    fn relay_mut(&mut self, i: usize) -> &mut Relay;

    /// The relay in slot `i` and the sink its answer goes through (HTTP/1.1 writes into the
    /// connection's `out`, for the client at `link`).
    fn parts<'a>(
        &'a mut self,
        i: usize,
        out: &'a mut Output,
        link: &'a Link,
    ) -> (&'a mut Relay, Self::Sink<'a>);

    /// One exchange at a time (HTTP/1.1): the connection's upstream deadline is its relay's,
    /// so when it passes that relay is due, and an answer its client stopped taking ends with
    /// the connection. Otherwise each relay is due at its own deadline, and a stalled answer
    /// ends its own exchange only.
    fn one_exchange(&self) -> bool;

    /// Relays wrote to their sinks (an upstream's bytes or end, a failure, a timeout): what
    /// they produced goes to the client as far as the protocol can send it now. `upstream_bytes`:
    /// an upstream's bytes were taken, which may have opened a tunnel (its client's bytes that
    /// came meanwhile then go up).
    fn flush(&mut self, upstream_bytes: bool, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>);

    /// The relay in slot `i` let its upstream connection go; `over`: its exchange is over (else
    /// another try follows).
    fn released(&mut self, i: usize, over: bool);

    /// The connection is closing or failed: every relay ends unfinished.
    fn abandon_all(&mut self, cx: &ConnCx<'_>);

    /// The slot of exchange `id`'s relay, if it is under way.
    fn slot(&self, id: ExchangeId) -> Option<usize> {
        (0..self.count()).find(|&i| self.id(i) == id)
    }
}

/// How the upstream's body is being read.
enum UpBody {
    /// Not yet known (head awaited).
    Head,
    Decoding(BodyDecoder),
    UntilClose,
}

pub(crate) struct Relay {
    pub(crate) fwd: Box<Forward>,
    head_only: bool,
    log: Option<Box<SavedEntry>>,
    tally: Tally,
    /// The upstream group's row of counters (asked of the group once).
    counted_as: UpstreamRow,
    phase: Phase,
    server: Option<usize>,
    /// Servers that failed this request (bit i: server i).
    tried: u64,
    /// Servers tried after the first (held to `RetryPolicy::retries`).
    retries: u32,
    /// Monotonic ms when the first try started (for `RetryPolicy::budget`).
    first_try_ms: u64,
    /// The whole request is in `to_up` (no body streams in from the client): it can be sent
    /// again as it was.
    whole_request: bool,
    /// The attached connection came from the pool.
    reused: bool,
    /// Send a fresh connection's worth: the pooled one died before answering.
    retry: bool,
    attached: bool,
    /// Request bytes for the upstream (see `up_queue.rs`). While a retry is possible
    /// the whole request stays here.
    to_up: UpQueue,
    /// The client's body still streaming in, and how it is framed for the upstream.
    client_body: Option<(BodyDecoder, BodyFraming)>,
    /// Body bytes taken from the client so far (held to `Forward::max_body`).
    client_body_bytes: u64,
    /// The upstream's answer as HTTP/1.1 bytes (a FastCGI answer after re-expressing it).
    from_up: Option<ReadBuf>,
    /// A FastCGI upstream: its records, re-expressed into `from_up` as they come.
    fastcgi: Option<Box<FastCgiAnswer>>,
    up_body: UpBody,
    /// Anything came back from the upstream on this attempt.
    got_bytes: bool,
    /// The response head went to the client.
    head_sent: bool,
    /// The route's compression, until the answer's head is known.
    compress: Option<Choice>,
    /// The answer's body is being compressed: the encoder's state lives only as long as
    /// that (see `tern_compress::Encoder` for its size).
    encoder: Option<Box<tern_compress::Encoder>>,
    /// The upstream allows its connection to be reused after this response.
    upstream_keep: bool,
    status: u16,
    body_bytes: u64,
    deadline_ms: u64,
    /// Monotonic µs when the request started going out (for the access log).
    sent_us: u64,
    outcome: UpstreamOutcome,
    /// The client connection cannot be reused after this exchange (its body was not read to
    /// the end, or the response was cut short).
    close_client: bool,
    /// The client stopped taking the answer for the upstream idle timeout: the exchange was
    /// ended for it (see [`Relay::timed_out`]).
    client_stalled: bool,
    /// The request has a body. A server may not read it as a body but as requests of its own
    /// (CL.0: a GET body, a POST to a handler that answers without reading, Python's
    /// http.server on a method it has no handler for), and answer them after this answer,
    /// later than any look at the socket can see; the next request on the connection, from
    /// whoever, would get those answers. So a connection that carried a body is not reused.
    carried_body: bool,
    /// Over, its upstream connection released (an HTTP/2 stream's relay stays until its
    /// answer is sent).
    finished: bool,
    /// An HTTP/2 client's WebSocket (RFC 8441): the handshake sent upstream for it.
    websocket: Option<Box<Handshake>>,
    /// An HTTP/2 tunnel's client ended its side (END_STREAM): the upstream's write side is
    /// shut once what it sent is out (`Some(true)`: done).
    client_ended: Option<bool>,
}

impl Relay {
    /// A relay for an exchange a handler forwarded. `body`: the complete body, if it came
    /// with the head; `streamed`: the framing of a body still to come from the client (HTTP/1.1
    /// only). With no server to try, the answer (503) is ready at once.
    pub fn start(start: RelayStart<'_>, sink: &mut impl Sink, cx: &mut ConnCx<'_>) -> Relay {
        let RelayStart {
            mut fwd,
            compress,
            head_only,
            handshake_is_ours,
            body,
            streamed,
            log,
            tally,
        } = start;
        let has_body = !body.is_empty()
            || matches!(
                streamed,
                Some(
                    BodyFollows::Framed(BodyKind::Chunked)
                        | BodyFollows::Raw(None)
                        | BodyFollows::Framed(BodyKind::Length(1..))
                        | BodyFollows::Raw(Some(1..))
                )
            );
        // The handler's head becomes the start of the request bytes (no copy).
        let mut to_up = std::mem::take(&mut fwd.head);
        // An HTTP/2 client's WebSocket: the key its HTTP/1.1 handshake needs is ours.
        let websocket =
            (fwd.upgrade && handshake_is_ours).then(|| Handshake::start(&mut to_up).map(Box::new));
        let no_key = websocket.as_ref().is_some_and(Option::is_none);
        to_up.reserve(64 + body.len().min(16 * 1024));
        let whole_request = matches!(streamed, None | Some(BodyFollows::Framed(BodyKind::None)));
        let client_body = if fwd.wire == UpstreamWire::FastCgi {
            // The head (PARAMS) says the length; the body goes as STDIN records, ended by an
            // empty one.
            let whole = BodyFraming::FastCgi;
            match streamed {
                Some(BodyFollows::Framed(kind)) if kind != BodyKind::None => {
                    Some((BodyDecoder::new(kind, u64::MAX), whole))
                }
                Some(BodyFollows::Raw(n)) => Some((
                    BodyDecoder::new(BodyKind::Length(n.unwrap_or(u64::MAX)), u64::MAX),
                    whole,
                )),
                _ => {
                    whole.push(&mut to_up, body);
                    whole.finish(&mut to_up);
                    None
                }
            }
        } else {
            match streamed {
                Some(BodyFollows::Framed(BodyKind::Length(n)) | BodyFollows::Raw(Some(n))) => {
                    push_length(&mut to_up, n);
                    Some((
                        BodyDecoder::new(BodyKind::Length(n), u64::MAX),
                        BodyFraming::Plain,
                    ))
                }
                Some(BodyFollows::Framed(BodyKind::Chunked)) => {
                    to_up.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    // No size limit: the app has its own (as for a declared length).
                    Some((
                        BodyDecoder::new(BodyKind::Chunked, u64::MAX),
                        BodyFraming::Chunked,
                    ))
                }
                Some(BodyFollows::Raw(None)) => {
                    // Bytes pass through as they are (a length never reached), re-chunked.
                    to_up.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    Some((
                        BodyDecoder::new(BodyKind::Length(u64::MAX), u64::MAX),
                        BodyFraming::Chunked,
                    ))
                }
                Some(BodyFollows::Framed(BodyKind::None)) | None => {
                    if !body.is_empty() || fwd.idempotent_needs_length() {
                        push_length(&mut to_up, body.len() as u64);
                    } else {
                        to_up.extend_from_slice(b"\r\n");
                    }
                    to_up.extend_from_slice(body);
                    None
                }
            }
        };
        let fastcgi =
            (fwd.wire == UpstreamWire::FastCgi).then(|| Box::new(FastCgiAnswer::new(head_only)));
        let mut relay = Relay {
            counted_as: fwd.upstreams.counted_as(),
            fwd,
            head_only,
            log,
            tally,
            phase: Phase::Connect,
            server: None,
            tried: 0,
            retries: 0,
            first_try_ms: cx.clock.now_ms(),
            whole_request,
            reused: false,
            retry: false,
            attached: false,
            to_up: UpQueue::new(to_up),
            client_body,
            client_body_bytes: body.len() as u64,
            from_up: None,
            fastcgi,
            up_body: UpBody::Head,
            got_bytes: false,
            head_sent: false,
            compress,
            encoder: None,
            upstream_keep: false,
            status: 0,
            body_bytes: 0,
            deadline_ms: u64::MAX,
            sent_us: cx.clock.now_us(),
            outcome: UpstreamOutcome::Ok,
            close_client: false,
            client_stalled: false,
            carried_body: has_body,
            finished: false,
            websocket: websocket.flatten(),
            client_ended: None,
        };
        if no_key {
            relay.answer_own(503, "no random numbers for a WebSocket key\n", sink, cx);
            return relay;
        }
        if relay.fwd.not_before_ms > cx.clock.now_ms() {
            relay.phase = Phase::Wait;
            relay.deadline_ms = relay.fwd.not_before_ms;
            return relay;
        }
        relay.begin(sink, cx);
        relay
    }

    /// Picks the first server, or answers 503 when there is none to try.
    fn begin(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        self.first_try_ms = cx.clock.now_ms();
        self.pick(cx);
        if self.server.is_none() {
            cx.stats
                .bump_upstream(self.counted_as, UpstreamCounter::Failures);
            self.answer_own(503, "no upstream server is available\n", sink, cx);
        }
    }

    pub fn need(&self) -> RelayNeed {
        if self.finished {
            return RelayNeed::Nothing;
        }
        match self.phase {
            Phase::Done => RelayNeed::Release {
                keep: self.attached && self.reusable(),
                outcome: self.outcome,
            },
            Phase::Connect if self.attached => RelayNeed::Release {
                keep: false,
                outcome: self.outcome,
            },
            Phase::Connect => match self.server {
                Some(server) => RelayNeed::Connect {
                    server,
                    fresh: self.retry,
                },
                None => RelayNeed::Nothing,
            },
            Phase::Wait => RelayNeed::Nothing,
            Phase::Connecting => RelayNeed::Connecting,
            Phase::Exchange | Phase::Tunnel => RelayNeed::Io,
        }
    }

    pub fn upstreams(&self) -> &std::sync::Arc<dyn crate::upstream::Upstreams> {
        &self.fwd.upstreams
    }

    /// The driver attached a connection; `connected`: it is usable now (pooled).
    pub fn attached(&mut self, reused: bool, connected: bool, cx: &ConnCx<'_>) {
        self.attached = true;
        self.outcome = UpstreamOutcome::Ok;
        self.reused = reused;
        self.got_bytes = false;
        if connected {
            self.connected(cx);
        } else {
            self.phase = Phase::Connecting;
            self.deadline_ms =
                cx.clock.now_ms() + self.fwd.upstreams.timeouts().connect.as_millis() as u64;
        }
    }

    /// A new connection finished connecting.
    pub fn now_connected(&mut self, cx: &ConnCx<'_>) {
        if self.phase == Phase::Connecting {
            self.connected(cx);
        }
    }

    /// The driver detached the connection it was told to release. True if the exchange is
    /// over (false: a retry or another server, the driver connects next).
    pub fn released(&mut self, cx: &mut ConnCx<'_>) -> bool {
        self.attached = false;
        if self.phase == Phase::Connect {
            return false;
        }
        if let Some(b) = self.from_up.take() {
            cx.buffers.give_read(b);
        }
        if let Some(f) = self.fastcgi.as_mut() {
            f.recycle(cx.buffers);
        }
        self.finished = true;
        true
    }

    /// Over, with its upstream connection released.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The client's connection cannot take another exchange after this one.
    pub fn closes_client(&self) -> bool {
        self.close_client
    }

    /// What `send_buf` gave was handed to a backend whose send completes later: it stays
    /// where it is until `sent` (see `up_queue.rs`).
    pub fn seal_send(&mut self) {
        self.to_up.seal();
    }

    /// Request bytes to send upstream (empty: none now).
    pub fn send_buf(&self) -> &[u8] {
        if matches!(self.phase, Phase::Exchange | Phase::Tunnel) {
            self.to_up.unsent()
        } else {
            &[]
        }
    }

    pub fn sent(&mut self, n: usize, cx: &ConnCx<'_>) {
        self.to_up.advance(n);
        let now = cx.clock.now_ms();
        if self.to_up.all_sent() && !self.may_retry() && !self.may_retry_on_status() {
            self.to_up.clear();
        }
        let t = self.fwd.upstreams.timeouts();
        self.deadline_ms = if !self.request_sent() || self.phase == Phase::Tunnel || self.head_sent
        {
            now + t.idle.as_millis() as u64
        } else {
            now + t.first_byte.as_millis() as u64
        };
    }

    /// Where to read the upstream's bytes (empty: not now). `room`: how many more bytes of
    /// the answer the client side takes now (0: none until the client reads; an HTTP/1.1
    /// output under its high-water mark takes any). A response head is read whatever the room:
    /// it is bounded by `MAX_UPSTREAM_HEAD`, and the answer cannot start without it.
    pub fn recv_buf(&mut self, room: usize, cx: &mut ConnCx<'_>) -> &mut [u8] {
        if !matches!(self.phase, Phase::Exchange | Phase::Tunnel) {
            return &mut [];
        }
        let head_sent = self.head_sent;
        if room == 0 && head_sent {
            // Waiting for the client (maybe for long): hold no empty buffer meanwhile.
            if self.from_up.as_ref().is_some_and(|b| b.is_empty()) {
                if let Some(b) = self.from_up.take() {
                    cx.buffers.give_read(b);
                }
            }
            return &mut [];
        }
        if let Some(f) = self.fastcgi.as_mut() {
            // Records are read as far as the answer may grow now; a head is read whatever
            // the room, as below (the CGI head parser bounds it).
            return f.recv_buf(if head_sent { room } else { usize::MAX }, cx.buffers);
        }
        let buf = self.from_up.get_or_insert_with(|| cx.buffers.take_read());
        buf.compact();
        // An answer that may be compressed is read in large steps from the first: one that
        // comes whole in one read is then compressed in one pass (`Encoder::finish_with`),
        // and the encoder's own state dwarfs the buffer anyway.
        let compressing = self.compress.as_ref().is_some_and(|c| c.may_compress());
        if (head_sent || compressing) && buf.capacity() < BODY_READ_SIZE {
            // A body is flowing and did not fit the first read: read it in larger steps.
            buf.grow_to(BODY_READ_SIZE);
        } else if buf.spare_mut().is_empty() {
            // A long head: up to the limit (past it the parser refuses it).
            buf.grow_to(MAX_UPSTREAM_HEAD + 1);
        }
        let spare = buf.spare_mut();
        let n = if head_sent {
            spare.len().min(room)
        } else {
            spare.len()
        };
        &mut spare[..n]
    }

    /// `n` bytes of the upstream's were read into `recv_buf`.
    pub fn recv(&mut self, n: usize, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        self.got_bytes = true;
        if let Some(f) = self.fastcgi.as_mut() {
            let http = self.from_up.get_or_insert_with(|| cx.buffers.take_read());
            if let Err(e) = f.filled(n, http) {
                self.fastcgi_failed(e, sink, cx);
                return;
            }
        } else if let Some(b) = self.from_up.as_mut() {
            b.filled(n);
        }
        let now = cx.clock.now_ms();
        self.deadline_ms = now + self.fwd.upstreams.timeouts().idle.as_millis() as u64;
        self.process(sink, cx);
    }

    /// The upstream closed its side (`error`: or the connection failed).
    pub fn closed(&mut self, error: bool, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        match (self.phase, &self.up_body) {
            (Phase::Exchange, UpBody::UntilClose) if !error => {
                self.finish_body(sink, cx);
                self.complete(UpstreamOutcome::Ok, sink, cx);
            }
            (Phase::Tunnel, _) => self.complete(UpstreamOutcome::Ok, sink, cx),
            (Phase::Exchange | Phase::Connecting, _) => {
                if self.phase == Phase::Exchange
                    && self.reused
                    && !self.got_bytes
                    && self.may_retry()
                {
                    // The pooled connection was closed by the server before it saw this
                    // request (its keep-alive ran out): send it once more on a new one.
                    cx.stats
                        .bump_upstream(self.counted_as, UpstreamCounter::RetriesStale);
                    self.restart(true);
                    return;
                }
                let cause = if self.got_bytes {
                    "upstream closed the connection in the middle of its response"
                } else {
                    "upstream closed the connection without answering"
                };
                self.fail(502, cause, sink, cx);
            }
            _ => {}
        }
    }

    /// The relay's deadline passed. `client_room`: the client side would take more of the
    /// answer now (false: the relay stopped reading the upstream because the client leaves
    /// the answer unread, so the client, not the upstream, stalled the exchange).
    pub fn timed_out(&mut self, client_room: bool, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        match self.phase {
            // Its turn in the rate limit's queue came.
            Phase::Wait => self.begin(sink, cx),
            Phase::Connecting => {
                cx.stats
                    .bump_upstream(self.counted_as, UpstreamCounter::Timeouts);
                self.connect_failed(sink, cx)
            }
            Phase::Exchange | Phase::Tunnel if self.head_sent && !client_room => {
                // A reader too slow for the upstream idle timeout must not hold the upstream
                // connection for as long as it likes: the exchange ends (the answer cut short,
                // so the client's connection or stream is ended too) and the connection is
                // closed. It says nothing about the upstream's health.
                if ratelog::admit("relay_client_stalled", cx.clock.now_ms()) {
                    tracing::info!(upstream = %self.addr(), "client stopped taking a proxied answer; exchange ended");
                }
                self.client_stalled = true;
                self.close_client = true;
                self.upstream_keep = false;
                sink.reset();
                self.end(UpstreamOutcome::Abandoned, None, cx);
            }
            Phase::Exchange | Phase::Tunnel => {
                cx.stats
                    .bump_upstream(self.counted_as, UpstreamCounter::Timeouts);
                if self.phase == Phase::Tunnel {
                    self.complete(UpstreamOutcome::Ok, sink, cx);
                } else {
                    self.fail(504, "upstream timed out", sink, cx);
                }
            }
            Phase::Connect | Phase::Done => {}
        }
    }

    /// The exchange was ended because the client stopped taking its answer.
    pub fn client_stalled(&self) -> bool {
        self.client_stalled
    }

    /// Held until its turn in a rate limit's queue: its deadline is that turn.
    pub fn is_waiting(&self) -> bool {
        self.phase == Phase::Wait
    }

    pub fn is_tunnel(&self) -> bool {
        self.phase == Phase::Tunnel
    }

    pub fn deadline(&self) -> u64 {
        self.deadline_ms
    }

    /// The client gave up (its stream was reset, its connection closed): the exchange ends
    /// without an answer and the upstream connection is not reused.
    pub fn abandon(&mut self, stats: &crate::stats::WorkerStats) {
        self.encoder = None;
        if self.phase == Phase::Tunnel {
            stats.bump(Counter::WebsocketTunnelsClosed);
        }
        if self.phase != Phase::Done {
            self.phase = Phase::Done;
            self.outcome = UpstreamOutcome::Abandoned;
            self.upstream_keep = false;
            self.deadline_ms = u64::MAX;
        }
    }

    /// What this exchange's encoder is charged now (0 when its answer is not being
    /// compressed, or no longer).
    pub fn encoder_bytes(&self) -> usize {
        self.encoder.as_ref().map_or(0, |e| e.charged_bytes())
    }

    /// The answer is for a HEAD request.
    pub fn head_only(&self) -> bool {
        self.head_only
    }

    /// Client input while relaying: the request body, or a tunnel's bytes.
    pub fn client_input(
        &mut self,
        input: &[u8],
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> usize {
        if self.phase == Phase::Tunnel {
            let take = input
                .len()
                .min(TO_UPSTREAM_MAX.saturating_sub(self.pending_up()));
            self.to_up.tail().extend_from_slice(&input[..take]);
            return take;
        }
        let Some((decoder, framing)) = self.client_body.as_mut() else {
            return 0;
        };
        let framing = *framing;
        let mut used = 0;
        while used < input.len() && self.to_up.pending() < TO_UPSTREAM_MAX {
            let room = TO_UPSTREAM_MAX - self.to_up.pending();
            let end = input.len().min(used + room);
            match decoder.decode(&input[used..end]) {
                Err(e) => {
                    // The client's own framing broke mid-body: nothing more can be trusted
                    // from it, and the upstream has seen a partial request: drop both.
                    cx.stats.bad_request(e);
                    self.close_client = true;
                    self.fail(e.status(), e.message(), sink, cx);
                    return input.len();
                }
                Ok(step) => {
                    self.client_body_bytes += step.data.len() as u64;
                    if self.client_body_bytes > self.fwd.max_body {
                        // A route's own limit: the upstream has seen part of the body, so
                        // its connection goes (the relay never pools one that carried a
                        // body), and so does the client's, its body unread.
                        let e = tern_codec::RequestError::BodyTooLarge;
                        cx.stats.bad_request(e);
                        self.close_client = true;
                        self.fail(e.status(), e.message(), sink, cx);
                        return input.len();
                    }
                    framing.push(self.to_up.tail(), step.data);
                    used += step.consumed;
                    if step.done {
                        framing.finish(self.to_up.tail());
                        self.client_body = None;
                        break;
                    }
                    if step.consumed == 0 {
                        break;
                    }
                }
            }
        }
        used
    }

    /// The client's body ended (HTTP/2: END_STREAM) with everything handed to
    /// `client_input`: a chunked upload gets its last chunk (FastCGI, its empty STDIN); a
    /// tunnel's upstream gets its write side shut once the bytes before are out, as TCP's
    /// FIN (RFC 8441 §4: END_STREAM is the half-close).
    pub fn end_client_body(&mut self) {
        if let Some((_, framing)) = self.client_body.take() {
            framing.finish(self.to_up.tail());
        }
        if self.phase == Phase::Tunnel && self.client_ended.is_none() {
            self.client_ended = Some(false);
        }
    }

    /// The upstream's write side is due to be shut (see [`Relay::end_client_body`]).
    pub fn wants_shutdown(&self) -> bool {
        self.phase == Phase::Tunnel && self.client_ended == Some(false) && self.pending_up() == 0
    }

    /// The driver shut the upstream's write side.
    pub fn shut_down(&mut self) {
        self.client_ended = Some(true);
    }

    pub fn wants_input(&self) -> bool {
        match self.phase {
            Phase::Tunnel => self.client_ended.is_none() && self.pending_up() < TO_UPSTREAM_MAX,
            Phase::Done => false,
            // A held request's body is taken as while a connection is awaited (up to
            // TO_UPSTREAM_MAX), ready to go when its turn comes.
            _ => self.client_body.is_some() && self.pending_up() < TO_UPSTREAM_MAX,
        }
    }

    /// Parses and relays what the upstream sent.
    fn process(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        let Some(mut buf) = self.from_up.take() else {
            return;
        };
        loop {
            if buf.is_empty() || self.phase == Phase::Done {
                break;
            }
            if self.phase == Phase::Connect {
                // The answer is dropped for another server's (a retried 502/503/504).
                buf.consume(buf.len());
                break;
            }
            if self.phase == Phase::Tunnel {
                self.body_bytes += buf.len() as u64;
                sink.data(buf.data(), cx);
                buf.consume(buf.len());
                break;
            }
            match &mut self.up_body {
                UpBody::Head => {
                    let used = self.take_head(buf.data(), sink, cx);
                    if used == 0 {
                        break;
                    }
                    buf.consume(used);
                }
                UpBody::UntilClose => {
                    self.push_body(buf.data(), sink, cx);
                    buf.consume(buf.len());
                }
                UpBody::Decoding(_) => {
                    let (used, done, broken) = self.decode_body(buf.data(), sink, cx);
                    buf.consume(used);
                    if broken {
                        self.fail(502, "upstream sent a malformed chunked body", sink, cx);
                        break;
                    }
                    if !done {
                        break;
                    }
                    self.finish_body(sink, cx);
                    self.complete(UpstreamOutcome::Ok, sink, cx);
                }
            }
        }
        if self.encoder.is_some() && self.phase == Phase::Exchange {
            // The upstream has nothing more for now: what it sent so far goes to the
            // client decodable, so a slow app's partial answer is not held back.
            self.squeeze(Squeeze::Flush, sink, cx);
        }
        if self.phase == Phase::Done && !buf.is_empty() {
            // Bytes past the end of the answer (a body after a HEAD answer, say): the
            // server is out of step with us, so its connection is not reused.
            self.upstream_keep = false;
            buf.consume(buf.len());
        }
        if buf.is_empty() && buf.capacity() == cx.buffers.read_size() && self.phase == Phase::Done {
            cx.buffers.give_read(buf);
        } else {
            self.from_up = Some(buf);
        }
    }

    /// Decodes body bytes of a sized or chunked answer into the client's output. Returns
    /// the bytes used, whether the body is complete, and whether its framing broke.
    fn decode_body(
        &mut self,
        input: &[u8],
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> (usize, bool, bool) {
        let mut used = 0;
        while used < input.len() {
            let UpBody::Decoding(decoder) = &mut self.up_body else {
                break;
            };
            match decoder.decode(&input[used..]) {
                Err(_) => return (used, false, true),
                Ok(step) => {
                    used += step.consumed;
                    let done = step.done;
                    let stalled = step.consumed == 0;
                    if done {
                        self.push_last(step.data, sink, cx);
                    } else {
                        self.push_body(step.data, sink, cx);
                    }
                    if done {
                        return (used, true, false);
                    }
                    if stalled {
                        break;
                    }
                }
            }
        }
        (used, false, false)
    }
}

impl Forward {
    /// A request with no body still says `Content-Length: 0` when its method usually has
    /// one, as clients do (some servers want it for POST).
    fn idempotent_needs_length(&self) -> bool {
        !self.idempotent
    }
}

impl Relay {
    fn pick(&mut self, cx: &mut ConnCx<'_>) {
        let now = cx.clock.now_ms();
        self.server = self.fwd.upstreams.pick(cx.worker_id, now, self.tried);
        self.phase = Phase::Connect;
        self.deadline_ms = u64::MAX;
    }

    fn connected(&mut self, cx: &ConnCx<'_>) {
        self.phase = Phase::Exchange;
        self.sent_us = cx.clock.now_us();
        self.deadline_ms =
            cx.clock.now_ms() + self.fwd.upstreams.timeouts().idle.as_millis() as u64;
    }

    fn pending_up(&self) -> usize {
        self.to_up.pending()
    }

    fn request_sent(&self) -> bool {
        self.client_body.is_none() && self.pending_up() == 0
    }

    /// A 502/503/504 answer may send this request to another server: the route asks for it,
    /// the method may be repeated, and the whole request is still at hand (its body came
    /// with its head). Checked before the answer's head goes to the client.
    fn may_retry_on_status(&self) -> bool {
        self.fwd.idempotent
            && self.whole_request
            && !self.fwd.upgrade
            && self.fwd.upstreams.retry().retries_on_any()
    }

    /// The server the request goes on to after the current one failed it, if the tries and
    /// the time budget allow one and a server is left; the current one counts as tried.
    fn next_server(&mut self, cx: &ConnCx<'_>) -> Option<usize> {
        if let Some(s) = self.server {
            if s < 64 {
                self.tried |= 1 << s;
            }
        }
        let policy = self.fwd.upstreams.retry();
        let now = cx.clock.now_ms();
        let spent = now.saturating_sub(self.first_try_ms);
        if self.retries >= policy.retries
            || policy.budget.is_some_and(|b| spent >= b.as_millis() as u64)
        {
            return None;
        }
        let next = self.fwd.upstreams.pick(cx.worker_id, now, self.tried)?;
        self.retries += 1;
        Some(next)
    }

    /// The whole request is still at hand (no streamed body), nothing has come back, and the
    /// method may be repeated.
    fn may_retry(&self) -> bool {
        self.fwd.idempotent
            && self.reused
            && !self.got_bytes
            && !self.retry
            && self.client_body.is_none()
    }

    /// The connection may carry another exchange as far as this one can tell: the answer
    /// was read to its exact end (nothing after it in our buffer), the request was sent whole,
    /// and it had no body the server could have read as requests of its own. (The pool then
    /// makes sure nothing waits in the socket either.)
    fn reusable(&self) -> bool {
        let in_step = match &self.fastcgi {
            // STDIN records frame a body exactly, and the answer ended with END_REQUEST.
            Some(f) => f.ended_cleanly(),
            None => !self.carried_body,
        };
        self.upstream_keep && self.request_sent() && self.outcome == UpstreamOutcome::Ok && in_step
    }

    /// Back to connecting, sending the request again from the start (`fresh`: not pooled).
    fn restart(&mut self, fresh: bool) {
        self.retry = fresh;
        self.to_up.rewind();
        self.phase = Phase::Connect;
        self.outcome = UpstreamOutcome::Abandoned;
        self.deadline_ms = u64::MAX;
        self.up_body = UpBody::Head;
        if let Some(b) = self.from_up.as_mut() {
            b.consume(b.len());
        }
        if let Some(f) = self.fastcgi.as_mut() {
            f.reset();
        }
    }

    /// A FastCGI answer broke its protocol or ended without an answer.
    fn fastcgi_failed(
        &mut self,
        e: tern_fastcgi::TranslateError,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) {
        self.upstream_keep = false;
        if ratelog::admit("fastcgi_answer", cx.clock.now_ms()) {
            tracing::warn!(upstream = %self.addr(), "FastCGI answer refused: {}", e.message());
        }
        let (status, msg) = match e {
            tern_fastcgi::TranslateError::Overloaded => {
                (503, "service unavailable: the application is overloaded\n")
            }
            _ => (502, "bad gateway: the application's answer is malformed\n"),
        };
        self.fail(status, msg, sink, cx);
        self.log_fastcgi_stderr(cx);
    }

    /// What a FastCGI application wrote to its error stream (PHP warnings) goes to tern's
    /// log, as nginx's "FastCGI sent in stderr", rate-limited.
    fn log_fastcgi_stderr(&mut self, cx: &ConnCx<'_>) {
        let Some(f) = self.fastcgi.as_mut() else {
            return;
        };
        let stderr = f.take_stderr();
        if !stderr.is_empty() && ratelog::admit("fastcgi_stderr", cx.clock.now_ms()) {
            let addr = self.fwd.upstreams.addr(self.server.unwrap_or(0));
            tracing::warn!(upstream = %addr, "FastCGI sent in stderr: {}", String::from_utf8_lossy(&stderr).trim_end());
        }
    }

    pub fn connect_failed(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        cx.stats
            .bump_upstream(self.counted_as, UpstreamCounter::ConnectFailures);
        if let Some(s) = self.server {
            if ratelog::admit("upstream_connect", cx.clock.now_ms()) {
                let addr = self.fwd.upstreams.addr(s);
                tracing::warn!(upstream = %addr, "cannot connect to upstream");
            }
        }
        // Nothing of the request reached a server: another one may take it.
        self.outcome = UpstreamOutcome::Failed;
        self.to_up.rewind();
        self.retry = false;
        let next = self.next_server(cx);
        self.phase = Phase::Connect;
        self.deadline_ms = u64::MAX;
        self.server = next;
        if next.is_some() {
            cx.stats
                .bump_upstream(self.counted_as, UpstreamCounter::RetriesConnect);
        } else {
            self.phase = Phase::Exchange;
            self.answer_own(
                502,
                "bad gateway: no upstream server could be reached\n",
                sink,
                cx,
            );
        }
    }

    /// Takes a response head from `data`; returns the bytes used (0: incomplete).
    fn take_head(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) -> usize {
        let mut headers = [MaybeUninit::uninit(); MAX_UPSTREAM_HEADERS];
        let head = match parse_upstream_head(data, &mut headers, self.head_only, MAX_UPSTREAM_HEAD)
        {
            Ok(Some(h)) => h,
            Ok(None) => return 0,
            Err(e) => {
                if ratelog::admit(e.name(), cx.clock.now_ms()) {
                    tracing::warn!(upstream = %self.addr(), "upstream response refused: {}", e.name());
                }
                let msg = match e {
                    UpstreamError::TooLarge => {
                        "bad gateway: the upstream's response head is too large\n"
                    }
                    _ => "bad gateway: the upstream's response is malformed\n",
                };
                self.fail(502, msg, sink, cx);
                return 0;
            }
        };
        let used = head.head_len;
        if head.status == 101 {
            if !self.fwd.upgrade {
                self.fail(
                    502,
                    "bad gateway: the upstream switched protocols unasked\n",
                    sink,
                    cx,
                );
                return 0;
            }
            if self.websocket.is_some() {
                return self.websocket_accepted(&head, sink, cx);
            }
            // The client's own handshake: the upstream's answer to it goes back as it is.
            let mut r = Response::new(101);
            copy_fields(&head, &mut r);
            if let Some(edit) = &self.fwd.edit {
                edit(&mut r);
            }
            let upgrade = head
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("upgrade"))
                .map(|h| h.value);
            self.status = sink.tunnel(r, upgrade, cx);
            // After the tunnel the connection is not HTTP any more: it closes.
            self.close_client = true;
            self.open_tunnel(cx);
            return used;
        }
        if self.websocket.is_some() && (200..300).contains(&head.status) {
            // An HTTP/2 client takes any 2xx to its CONNECT as the tunnel open: an upstream
            // that answered the handshake as a plain GET must not look like one.
            self.fail(
                502,
                "bad gateway: the upstream did not switch to WebSocket\n",
                sink,
                cx,
            );
            return 0;
        }
        if head.status < 200 {
            // 100 Continue was ours to give; other interim answers (103 Early Hints) go on
            // where the client's protocol passes them.
            if head.status != 100 {
                let mut r = Response::new(head.status);
                copy_fields(&head, &mut r);
                sink.interim(&r, cx);
            }
            return used;
        }
        if self.fwd.upstreams.retry().retries_on(head.status) && self.may_retry_on_status() {
            if let Some(next) = self.next_server(cx) {
                cx.stats
                    .bump_upstream(self.counted_as, UpstreamCounter::RetriesStatus);
                if ratelog::admit("upstream_retry_status", cx.clock.now_ms()) {
                    tracing::info!(upstream = %self.addr(), status = head.status, "upstream answered a retried status; request sent to the next server");
                }
                self.server = Some(next);
                self.restart(false);
                self.outcome = UpstreamOutcome::Failed;
                self.got_bytes = false;
                self.upstream_keep = false;
                return used;
            }
        }
        // Not switched: an ordinary answer, but a connection asked for an upgrade stays out
        // of the pool.
        self.upstream_keep = head.keep_alive && !self.fwd.upgrade;
        self.status = head.status;
        let mut r = Response::new(head.status);
        copy_fields(&head, &mut r);
        if let Some(edit) = &self.fwd.edit {
            edit(&mut r);
        }
        let (content_length, body) = match head.body {
            ResponseBody::None => {
                // A HEAD answer keeps the length the GET would have had.
                let len = if self.head_only && !crate::response::status_has_no_body(head.status) {
                    head.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                } else {
                    None
                };
                (len, None)
            }
            ResponseBody::Length(n) => (
                Some(n),
                Some(UpBody::Decoding(BodyDecoder::new(
                    BodyKind::Length(n),
                    u64::MAX,
                ))),
            ),
            ResponseBody::Chunked => (
                None,
                Some(UpBody::Decoding(BodyDecoder::new(
                    BodyKind::Chunked,
                    u64::MAX,
                ))),
            ),
            ResponseBody::UntilClose => (None, Some(UpBody::UntilClose)),
        };
        let content_length = match self.compress.take() {
            Some(choice) => {
                // The encoder's state is charged to the worker's and the connection's
                // budgets; a HEAD answer needs none.
                let room = (body.is_some() && !self.head_only).then(|| EncoderRoom {
                    worker: cx.stats.encoders(),
                    conn_held: sink.encoders_held(),
                });
                // The length the decision sees: the body's, or a HEAD answer's for the GET.
                match choice.edit_streamed_head(&mut r, content_length, room, cx.stats) {
                    Ok(Streamed::Compressed(encoder)) => {
                        self.encoder = encoder;
                        // Streamed: no length.
                        None
                    }
                    Ok(Streamed::AsIs) => content_length,
                    Err(_) => {
                        // Ours, not the upstream's: counted apart, and its connection is
                        // not blamed (nor reused).
                        cx.stats.bump(Counter::CompressionFailures);
                        self.outcome = UpstreamOutcome::Abandoned;
                        self.answer_own(502, "bad gateway: out of memory\n", sink, cx);
                        return 0;
                    }
                }
            }
            None => content_length,
        };
        if self.client_body.is_some() {
            // Answered before the request body was all sent: the client's connection cannot
            // be read in step any more, nor the upstream's reused.
            self.close_client = true;
        }
        let follows = body.is_some() && !self.head_only;
        sink.head(r, content_length, follows, self.close_client, cx);
        self.head_sent = true;
        match body {
            Some(b) if !matches!(&b, UpBody::Decoding(d) if d.is_done()) => self.up_body = b,
            _ => {
                self.finish_body(sink, cx);
                self.complete(UpstreamOutcome::Ok, sink, cx);
            }
        }
        used
    }

    /// The upstream's `101` to an HTTP/2 client's WebSocket: checked against the key sent,
    /// then the client gets its `200` (RFC 8441 §5) with the upstream's end-to-end fields
    /// (`Sec-WebSocket-Protocol`, `-Extensions`, cookies), and the stream is the tunnel.
    fn websocket_accepted(
        &mut self,
        head: &tern_codec::UpstreamHead<'_>,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> usize {
        let fields = head.headers.iter().map(|h| (h.name, h.value));
        if !self
            .websocket
            .as_ref()
            .is_some_and(|w| w.completed_by(fields))
        {
            if ratelog::admit("websocket_accept", cx.clock.now_ms()) {
                tracing::warn!(upstream = %self.addr(), "upstream's 101 does not complete the WebSocket handshake");
            }
            self.fail(
                502,
                "bad gateway: the upstream's WebSocket handshake is wrong\n",
                sink,
                cx,
            );
            return 0;
        }
        let mut r = Response::new(200);
        copy_fields(head, &mut r);
        r.remove_header("sec-websocket-accept");
        if let Some(edit) = &self.fwd.edit {
            edit(&mut r);
        }
        self.status = sink.tunnel(r, None, cx);
        self.open_tunnel(cx);
        head.head_len
    }

    /// The upstream switched protocols: bytes both ways from now on (the sink counted the
    /// tunnel under its protocol).
    fn open_tunnel(&mut self, cx: &mut ConnCx<'_>) {
        self.head_sent = true;
        self.phase = Phase::Tunnel;
        self.client_body = None;
        self.upstream_keep = false;
        self.deadline_ms =
            cx.clock.now_ms() + self.fwd.upstreams.timeouts().idle.as_millis() as u64;
    }

    /// Body bytes of the upstream's answer, compressed if it is, framed for the client.
    fn push_body(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if data.is_empty() || self.head_only {
            return;
        }
        if self.encoder.is_some() {
            self.squeeze(Squeeze::Data(data), sink, cx);
        } else {
            self.emit(data, sink, cx);
        }
    }

    /// The last body bytes of a sized or chunked answer: an answer that came whole is
    /// compressed in one pass (see `Encoder::finish_with`), never held back for it.
    fn push_last(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if self.encoder.is_some() && !data.is_empty() && !self.head_only {
            self.squeeze(Squeeze::Last(data), sink, cx);
        } else {
            self.push_body(data, sink, cx);
        }
    }

    /// One step of the answer's encoder; its output goes to the client. A failing encoder
    /// (no memory) cuts the answer short, as a failing upstream does, but it is counted as
    /// ours and says nothing about the upstream's health.
    fn squeeze(&mut self, step: Squeeze<'_>, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        let Some(mut encoder) = self.encoder.take() else {
            return;
        };
        let coded = match step {
            Squeeze::Data(data) => encoder.write(data),
            Squeeze::Flush => encoder.flush(),
            Squeeze::Finish => encoder.finish(),
            Squeeze::Last(data) => encoder.finish_with(data),
        };
        match coded {
            Ok(bytes) => self.emit(bytes, sink, cx),
            Err(_) => {
                cx.stats.bump(Counter::CompressionFailures);
                self.close_client = true;
                self.upstream_keep = false;
                sink.reset();
                self.end(UpstreamOutcome::Abandoned, None, cx);
                return;
            }
        }
        if matches!(step, Squeeze::Finish | Squeeze::Last(_)) {
            let e = encoder.encoding();
            compression::count(cx.stats, e, encoder.bytes_in(), encoder.bytes_out());
        } else {
            self.encoder = Some(encoder);
        }
    }

    /// Body bytes for the client (the sink frames them).
    fn emit(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if data.is_empty() {
            return;
        }
        self.body_bytes += data.len() as u64;
        sink.data(data, cx);
    }

    fn finish_body(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        self.squeeze(Squeeze::Finish, sink, cx);
        sink.end(cx);
    }

    /// The exchange is over: count it, log it, and let the driver release the upstream.
    fn complete(&mut self, outcome: UpstreamOutcome, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if self.phase == Phase::Done {
            return;
        }
        self.log_fastcgi_stderr(cx);
        sink.end(cx);
        let upstream_us = cx.clock.now_us().saturating_sub(self.sent_us);
        self.end(outcome, Some(upstream_us), cx);
    }

    /// Ends the exchange with `outcome`: counted, and its access-log line written.
    fn end(&mut self, outcome: UpstreamOutcome, upstream_us: Option<u64>, cx: &mut ConnCx<'_>) {
        // An answer cut short frees its encoder now, not when the relay goes.
        self.encoder = None;
        if self.phase == Phase::Tunnel {
            cx.stats.bump(Counter::WebsocketTunnelsClosed);
        }
        self.outcome = outcome;
        self.phase = Phase::Done;
        self.deadline_ms = u64::MAX;
        cx.answered(self.status, self.tally);
        if let (Some(log), Some(saved)) = (cx.access_log.as_deref_mut(), self.log.as_ref()) {
            let entry = saved.entry();
            log.record_upstream(&entry, self.status, self.body_bytes, upstream_us, cx.clock);
        }
    }

    /// The upstream failed this exchange: a `status` answer if the client has heard nothing
    /// yet, else the client connection is cut (its answer cannot be completed honestly).
    fn fail(&mut self, status: u16, msg: &'static str, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if self.phase == Phase::Done {
            return;
        }
        cx.stats
            .bump_upstream(self.counted_as, UpstreamCounter::Failures);
        if self.head_sent {
            // Whatever was queued goes out, then the connection closes: the client sees a
            // short body (or no last chunk), never a later response mistaken for this one.
            // On HTTP/2 the stream is reset instead (its answer never ends).
            self.close_client = true;
            sink.reset();
            self.end(UpstreamOutcome::Failed, None, cx);
            return;
        }
        if status < 500 {
            self.outcome = UpstreamOutcome::Abandoned;
        } else {
            self.outcome = UpstreamOutcome::Failed;
        }
        self.answer_own(status, msg, sink, cx);
    }

    /// Answers the client with tern's own short response in place of the upstream's.
    fn answer_own(
        &mut self,
        status: u16,
        msg: &'static str,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) {
        let outcome = if self.outcome == UpstreamOutcome::Ok {
            UpstreamOutcome::Failed
        } else {
            self.outcome
        };
        if self.client_body.is_some() {
            self.close_client = true;
        }
        let mut r = Response::text(status, msg);
        if let Some(page) = &self.fwd.own_answers {
            page(&mut r); // the site's error page for this status, if it has one
        }
        let body = std::mem::take(&mut r.body);
        // Pages are in memory, tern's own bodies too (a file would be sent as empty).
        let bytes = body.as_memory().unwrap_or_default();
        let len = bytes.len() as u64;
        sink.head(r, Some(len), !self.head_only, self.close_client, cx);
        if !self.head_only {
            sink.data(bytes, cx);
        }
        self.head_sent = true;
        self.status = status;
        self.body_bytes = len;
        self.complete(outcome, sink, cx);
    }

    fn addr(&self) -> String {
        match self.server {
            Some(s) => self.fwd.upstreams.addr(s).to_string(),
            None => "-".into(),
        }
    }
}

/// A step of the answer's encoder.
#[derive(Clone, Copy)]
enum Squeeze<'a> {
    Data(&'a [u8]),
    /// The upstream has nothing more for now.
    Flush,
    /// The answer is complete.
    Finish,
    /// These are the answer's last bytes: compress them and end.
    Last(&'a [u8]),
}

/// Copies the upstream's fields a client may see: not the hop-by-hop ones, not those named
/// by its Connection fields, not the framing and not Date/Server (tern writes its own).
fn copy_fields(head: &tern_codec::UpstreamHead<'_>, r: &mut Response) {
    let names_fields = head
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("connection"));
    for h in head.headers {
        let name = h.name;
        if DROPPED_RESPONSE_FIELDS
            .iter()
            .any(|d| name.eq_ignore_ascii_case(d))
            || names_fields && head.connection_names(name.as_bytes())
        {
            continue;
        }
        // The parser took only a token name and a value without CR, LF or NUL.
        r.push_parsed_header(name, h.value);
    }
}

fn push_length(to: &mut Vec<u8>, n: u64) {
    to.extend_from_slice(b"Content-Length: ");
    to.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    to.extend_from_slice(b"\r\n\r\n");
}
