//! The HTTP/2 side of relayed answers: one relay slot per relayed stream (`Relays`, through
//! which the driver reaches them, `conn/relays.rs`), the tunnel an upstream's `101` opens
//! ([`ExtendedConnect`]; the sink that holds a stream's answer and its room are shared with
//! HTTP/3, `conn/relay/held.rs`), request bodies fed to the relays as DATA arrives, and their
//! answers out: HEADERS, then DATA as windows allow (`pump_relay` in `send.rs`), RST_STREAM
//! when one breaks.

use tern_http2::ErrorCode;

use super::{Http2, RelayedStream, Remaining, Sending};
use crate::conn::output::Output;
use crate::conn::relay::{HeldAnswer, HeldSink, Relay, RelayStart, Relays, Tunnels};
use crate::conn::types::Link;
use crate::exchange::ConnCx;
use crate::handler::ExchangeId;
use crate::response::{header_fields, Response};
use crate::stats::Counter;

/// What a stream's relay writes its answer through (held, see `conn/relay/held.rs`);
/// `flush_relays` and `pump_relay` frame it.
pub(crate) type H2Sink<'a> = HeldSink<'a, ExtendedConnect>;

/// HTTP/2's answer to an upstream that switches protocols: the extended CONNECT's tunnel
/// opens (the relay made the WebSocket handshake and checked the upstream's `101`).
pub(crate) struct ExtendedConnect;

impl Tunnels for ExtendedConnect {
    fn tunnel(answer: &mut HeldAnswer, mut r: Response, cx: &mut ConnCx<'_>) -> u16 {
        // RFC 8441 §5: a 2xx to the extended CONNECT opens the tunnel.
        r.status = 200;
        answer.head = Some((r, None));
        cx.stats.bump(Counter::WebsocketTunnelsOpenedHttp2);
        200
    }
}

impl RelayedStream {
    /// The client gave up (its stream reset, its connection failed): nothing more goes to it.
    pub(super) fn abandon(&mut self, stats: &crate::stats::WorkerStats) {
        self.relay.abandon(stats);
        self.answer = HeldAnswer {
            end: true,
            ..HeldAnswer::default()
        };
    }
}

/// One relay slot per relayed stream (the driver's calls on them are in `conn/relays.rs`).
impl Relays for Http2 {
    type Sink<'a> = H2Sink<'a>;

    fn count(&self) -> usize {
        self.relays.len()
    }

    fn id(&self, i: usize) -> ExchangeId {
        ExchangeId(u64::from(self.relays[i].id))
    }

    fn relay(&self, i: usize) -> &Relay {
        &self.relays[i].relay
    }

    fn relay_mut(&mut self, i: usize) -> &mut Relay {
        &mut self.relays[i].relay
    }

    /// The sink takes what is left of the stream's room and the connection's; the answer goes
    /// out when `flush` frames it.
    fn parts<'a>(
        &'a mut self,
        i: usize,
        _: &'a mut Output,
        _: &'a Link,
    ) -> (&'a mut Relay, H2Sink<'a>) {
        let held = self.held();
        let encoders_held = self.encoders_held() - self.relays[i].relay.encoder_bytes();
        let r = &mut self.relays[i];
        let own = r.answer.data.len();
        (
            &mut r.relay,
            HeldSink::new(&mut r.answer, own, held, encoders_held),
        )
    }

    fn one_exchange(&self) -> bool {
        false
    }

    fn flush(&mut self, upstream_bytes: bool, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        if upstream_bytes {
            // A tunnel just opened takes what its client sent meanwhile.
            self.feed_relays(out, cx);
        }
        self.flush_relays(out, link, cx);
    }

    /// The relay is kept until its answer has gone out.
    fn released(&mut self, _: usize, _: bool) {
        self.drop_finished_relays();
    }

    fn abandon_all(&mut self, cx: &ConnCx<'_>) {
        for r in &mut self.relays {
            r.abandon(cx.stats);
        }
    }
}

/// The HTTP/2 side of the relays: room, request bodies in, answers out.
impl Http2 {
    /// Starts relaying stream `id`'s exchange: the relay takes its body as far as it came,
    /// and what it answered at once (a 503 with no server to try) goes out.
    pub(super) fn start_relay(
        &mut self,
        id: u32,
        start: RelayStart<'_>,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) {
        let mut answer = HeldAnswer::default();
        let mut sink = H2Sink::new(&mut answer, 0, self.held(), self.encoders_held());
        let relay = Box::new(Relay::start(start, &mut sink, cx));
        self.relays.push(RelayedStream { id, relay, answer });
        self.feed_relays(out, cx);
        self.flush_relays(out, link, cx);
    }

    /// Answer bytes all the connection's relays hold.
    fn held(&self) -> usize {
        self.relays.iter().map(|r| r.answer.data.len()).sum()
    }

    /// Encoder state all the connection's relays hold (see `compression::CONN_ENCODER_BUDGET`).
    fn encoders_held(&self) -> usize {
        self.relays.iter().map(|r| r.relay.encoder_bytes()).sum()
    }

    /// Hands streamed request bodies to their relays as far as each takes them (the rest,
    /// and the stream's window, wait for the upstream to take more).
    pub(super) fn feed_relays(&mut self, out: &mut Output, cx: &mut ConnCx<'_>) {
        // (Taking client input reads nothing from the upstreams: what they hold stays.)
        let held = self.held();
        let encoders = self.encoders_held();
        for i in 0..self.relays.len() {
            let id = self.relays[i].id;
            if !self.relays[i].relay.wants_input() {
                continue;
            }
            let Some((chunk, ended)) = self.session.body_chunk(id) else {
                continue;
            };
            // (The session's buffers and the relays are separate fields: the chunk stays
            // borrowed from the session while the relay takes it.)
            let r = &mut self.relays[i];
            let own = r.answer.data.len();
            let encoders_held = encoders - r.relay.encoder_bytes();
            let mut sink = H2Sink::new(&mut r.answer, own, held, encoders_held);
            let used = r.relay.client_input(chunk, &mut sink, cx);
            let all = used == chunk.len();
            let buf = out.head_buf(|| cx.buffers.take_write());
            let before = buf.len();
            self.session.consume_body(id, used, buf);
            out.commit(before);
            if all && ended {
                self.relays[i].relay.end_client_body();
            }
        }
    }

    /// Sends what the relays have produced: heads as HEADERS (their bodies then wait in
    /// `sending` for window), broken answers as RST_STREAM.
    fn flush_relays(&mut self, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        if self.closing || self.session.is_closed() {
            return;
        }
        for i in 0..self.relays.len() {
            let id = self.relays[i].id;
            let head_only = self.relays[i].relay.head_only();
            let answer = &mut self.relays[i].answer;
            if let Some(whole) = answer.whole.take() {
                let (response, facts, log) = whole.into_parts(ExchangeId(u64::from(id)), head_only);
                let entry = log.as_ref().map(|s| s.entry());
                self.respond(id, response, facts, out, link, cx, entry.as_ref());
                continue;
            }
            if let Some((response, length, end_stream)) = answer.take_head(head_only) {
                self.relay_head(id, &response, length, end_stream, out, link, cx);
                if !end_stream {
                    let priority = self.session.priority(id);
                    self.sending.push(Sending {
                        stream: id,
                        body: Remaining::Relay,
                        priority,
                    });
                }
                continue;
            }
            if answer.broken {
                answer.broken = false;
                answer.data.clear();
                self.sending.retain(|s| s.stream != id);
                let buf = out.head_buf(|| cx.buffers.take_write());
                let before = buf.len();
                self.session.reset(id, ErrorCode::Internal, buf);
                out.commit(before);
            }
        }
        self.pump(out, cx);
        self.drop_finished_relays();
    }

    /// The HEADERS of a relayed answer (no memo: proxied heads differ from one another).
    #[allow(clippy::too_many_arguments)]
    fn relay_head(
        &mut self,
        id: u32,
        response: &Response,
        length: Option<u64>,
        end_stream: bool,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) {
        let date = cx.clock.date_value();
        let buf = out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        let mut h = self.session.response(id, response.status, buf);
        h.field(b"date", date);
        h.field(b"server", b"tern");
        if let Some(n) = length {
            h.field(b"content-length", itoa::Buffer::new().format(n).as_bytes());
        }
        let secure = link.secure_lines(cx).unwrap_or_default();
        for (name, value) in header_fields(response.headers()).chain(header_fields(secure)) {
            h.field(name, value);
        }
        h.finish(end_stream);
        out.commit(before);
    }

    /// Relays whose upstream connection is released and whose answer is out (or reset).
    fn drop_finished_relays(&mut self) {
        let sending = &self.sending;
        self.relays.retain(|r| {
            let answered = !sending.iter().any(|s| s.stream == r.id)
                && r.answer.head.is_none()
                && r.answer.whole.is_none();
            !(r.relay.is_finished() && answered)
        });
    }
}
