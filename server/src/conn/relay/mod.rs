//! One exchange relayed to an upstream server: a state of the HTTP/1.1 protocol, or one of
//! an HTTP/2 or HTTP/3 connection's streams. Sans-IO like the rest of the connection: the driver
//! (`driver/relay.rs`, through the connection's calls in `conn/relays.rs`) attaches an
//! upstream connection, sends [`Relay::send_buf`], reads into [`Relay::recv_buf`], and reports
//! what happened; the relay parses the upstream's answer (`tern_codec::parse_upstream_head`),
//! rewrites its head, and streams its body to the client through the protocol's [`Sink`]
//! (`exchange/sink.rs`): the relay knows no client protocol, HTTP/1.1 framing lives in
//! `http1.rs`, HTTP/2's in `http2/relays.rs` and HTTP/3's in `quic/conn/relays.rs`; the two
//! multiplexed ones share the sink that holds a stream's answer until they frame it
//! (`held.rs`). Where a protocol over TCP keeps its relays is the [`Relays`] trait below.
//!
//! Memory is bounded both ways: the request body is taken from the client only while less
//! than `TO_UPSTREAM_MAX` waits for the upstream, and the upstream is read only as far as the
//! client side has room (the HTTP/1.1 output under its high-water mark; for an HTTP/2 or
//! HTTP/3 stream, its share of the connection's relay budget, see `held.rs`). Time is bounded
//! too: a client that leaves the answer unread stops the upstream's reads, and the upstream
//! idle timeout, which only the upstream's progress moves, then ends the exchange. Framing is
//! re-encoded, never passed through: Content-Length stays a length, a chunked or
//! close-delimited body goes to an HTTP/1.1 client chunked (to HTTP/1.0 until close), and
//! trailers are dropped. An upstream that breaks its framing before the head was passed on
//! gets a 502; after, the client connection is closed, so it can never be desynchronised.
//!
//! Here: the relay's state and what the driver and the protocols call (what it needs, its
//! upstream connection's life, bytes both ways, timeouts). The rest, as `impl Relay` blocks
//! of their own: `request.rs`, the request's bytes for the upstream and the client's body as
//! it streams in; `answer.rs`, the upstream's answer (head, body, compression) and how the
//! exchange ends; `retry.rs`, which server gets the request, first and after a failure;
//! `handoff.rs`, a request the app hands back to its route (`X-Accel-Redirect`, a status the
//! route reroutes) answered by the route's site instead. Beside them, `held.rs`: the answer
//! held for an HTTP/2 or HTTP/3 stream, its sink and its room.

mod answer;
mod handoff;
mod held;
mod request;
mod retry;
mod tee;

use tern_codec::{BodyDecoder, BodyKind};
use tern_runtime::{ratelog, ReadBuf};

use super::output::Output;
use super::types::Link;
use super::up_queue::UpQueue;
use super::upstream_wire::{BodyFraming, FastCgiAnswer};
use super::websocket::Handshake;
use crate::access_log::SavedEntry;
use crate::compression::Choice;
use crate::exchange::{ConnCx, Sink};
use crate::handler::{ExchangeId, Handback};
use crate::stats::{Counter, Tally, UpstreamCounter};
use crate::upstream::{Forward, UpstreamOutcome, UpstreamRow};

pub(crate) use held::{body_choice, BodyChoice, HeldAnswer, HeldSink, Tunnels};

/// The largest upstream response head (nginx's default proxy buffer is 4–8 KiB).
const MAX_UPSTREAM_HEAD: usize = 32 * 1024;
/// Upstream reads go into a buffer this large once a body is flowing.
const BODY_READ_SIZE: usize = 64 * 1024;

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
    /// The client connection's key and the exchange's id (for a reply deferred by the route
    /// an app hands the request back to).
    pub conn: u64,
    pub exchange: ExchangeId,
    /// What the route does if its app hands the request back (`handoff.rs`).
    pub handback: Option<Box<Handback>>,
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
    /// See [`RelayStart::conn`].
    conn: u64,
    exchange: ExchangeId,
    /// See [`RelayStart::handback`]; taken when the app hands the request back.
    handback: Option<Box<Handback>>,
    /// The relay started over for a request its app handed back (`handoff.rs`) while the
    /// app's connection is still attached: it is let go first, back into the pool when
    /// `Some(true)`.
    held_over: Option<bool>,
}

impl Relay {
    pub fn need(&self) -> RelayNeed {
        if self.finished {
            return RelayNeed::Nothing;
        }
        if let (Some(keep), true) = (self.held_over, self.attached) {
            // The app's exchange ended well: it answered.
            return RelayNeed::Release {
                keep,
                outcome: UpstreamOutcome::Ok,
            };
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

    fn connected(&mut self, cx: &ConnCx<'_>) {
        self.phase = Phase::Exchange;
        self.sent_us = cx.clock.now_us();
        self.deadline_ms =
            cx.clock.now_ms() + self.fwd.upstreams.timeouts().idle.as_millis() as u64;
    }

    /// The driver detached the connection it was told to release. True if the exchange is
    /// over (false: a retry or another server, the driver connects next).
    pub fn released(&mut self, cx: &mut ConnCx<'_>) -> bool {
        self.attached = false;
        let held_over = self.held_over.take().is_some();
        if self.phase == Phase::Connect || (held_over && self.phase == Phase::Wait) {
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
            // Its turn in the rate limit's queue came, or its hold's instant.
            Phase::Wait => self.unhold(sink, cx),
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

    /// Held by its route's hold (not a rate limit's queue): waiting for another request's
    /// fill of its key.
    pub fn is_held(&self) -> bool {
        self.phase == Phase::Wait && self.fwd.hold.is_some()
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

    fn addr(&self) -> String {
        match self.server {
            Some(s) => self.fwd.upstreams.addr(s).to_string(),
            None => "-".into(),
        }
    }
}
