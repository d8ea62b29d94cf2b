//! The HTTP/2 side of relayed answers: one relay slot per relayed stream (`Relays`, through
//! which the driver reaches them, `conn/relays.rs`), the [`H2Sink`] a relay writes its answer
//! through (held as an `H2Answer` until it is framed), how much each may read from its upstream
//! (its stream's share and the connection's budget), request bodies fed to them as DATA
//! arrives, and their answers out: HEADERS, then DATA as windows allow (`pump_relay` in
//! `send.rs`), RST_STREAM when one breaks.

use tern_http2::ErrorCode;

use super::{add_line, H2Answer, Http2, RelayedStream, Remaining, Sending, WholeAnswer};
use crate::access_log::SavedEntry;
use crate::conn::output::Output;
use crate::conn::relay::{Relay, RelayStart, Relays};
use crate::conn::types::Link;
use crate::exchange::{ConnCx, Facts, Sink};
use crate::handler::ExchangeId;
use crate::response::{status_has_no_body, Response};
use crate::stats::{Counter, Tally};

/// A proxied answer's bytes held for its stream (waiting for window or for the output to
/// drain) before its upstream is read no further: about one default stream window.
const RELAY_STREAM_BUFFER: usize = 64 * 1024;
/// The same for all of a connection's streams together: a client that opens many streams
/// and no window gets this much held for it, not a share per stream.
const RELAY_CONN_BUFFER: usize = 512 * 1024;

/// What a stream's relay writes its answer through; `flush_relays` and `pump_relay` frame it.
pub(crate) struct H2Sink<'a> {
    answer: &'a mut H2Answer,
    room: usize,
    /// Encoder state the connection's other streams hold.
    encoders_held: usize,
}

impl Sink for H2Sink<'_> {
    fn room(&self) -> usize {
        self.room
    }

    fn encoders_held(&self) -> usize {
        self.encoders_held
    }

    fn head(&mut self, r: Response, len: Option<u64>, _: bool, _: bool, _: &mut ConnCx<'_>) {
        // HTTP/2 frames the body itself: no chunking, no Connection; HSTS is added as the
        // head is encoded.
        self.answer.head = Some((r, len));
    }

    fn interim(&mut self, _: &Response, _: &mut ConnCx<'_>) {
        // Interim answers are not passed on over HTTP/2 (as before the sink: a 103 from an
        // app reaches HTTP/1.1 clients only).
    }

    fn tunnel(&mut self, mut r: Response, _: Option<&[u8]>, cx: &mut ConnCx<'_>) -> u16 {
        // RFC 8441 §5: a 2xx to the extended CONNECT opens the tunnel.
        r.status = 200;
        self.answer.head = Some((r, None));
        cx.stats.bump(Counter::WebsocketTunnelsOpenedHttp2);
        200
    }

    fn data(&mut self, bytes: &[u8], _: &mut ConnCx<'_>) {
        self.answer.data.extend_from_slice(bytes);
    }

    fn end(&mut self, _: &mut ConnCx<'_>) {
        self.answer.end = true;
    }

    fn reset(&mut self) {
        self.answer.broken = true;
    }

    fn whole(
        &mut self,
        response: Response,
        tally: Tally,
        _: bool,
        log: Option<Box<SavedEntry>>,
        _: &mut ConnCx<'_>,
    ) {
        // Sent by `flush_relays` as a handler's answer (HEADERS, then DATA or a file as
        // windows allow); an HTTP/2 stream's end closes nothing else.
        self.answer.whole = Some(Box::new(WholeAnswer {
            response,
            tally,
            log,
        }));
    }
}

impl RelayedStream {
    /// The client gave up (its stream reset, its connection failed): nothing more goes to it.
    pub(super) fn abandon(&mut self, stats: &crate::stats::WorkerStats) {
        self.relay.abandon(stats);
        self.answer = H2Answer {
            end: true,
            ..H2Answer::default()
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

    /// The sink takes what is left of the stream's room and the connection's (`relay_room`);
    /// the answer goes out when `flush` frames it.
    fn parts<'a>(
        &'a mut self,
        i: usize,
        _: &'a mut Output,
        _: &'a Link,
    ) -> (&'a mut Relay, H2Sink<'a>) {
        let room = self.relay_room(i);
        let encoders_held = self.encoders_held() - self.relays[i].relay.encoder_bytes();
        let r = &mut self.relays[i];
        let sink = H2Sink {
            answer: &mut r.answer,
            room,
            encoders_held,
        };
        (&mut r.relay, sink)
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
        let mut answer = H2Answer::default();
        let room = self.room_for(0);
        let mut sink = H2Sink {
            answer: &mut answer,
            room,
            encoders_held: self.encoders_held(),
        };
        let relay = Box::new(Relay::start(start, &mut sink, cx));
        self.relays.push(RelayedStream { id, relay, answer });
        self.feed_relays(out, cx);
        self.flush_relays(out, link, cx);
    }

    /// How many more bytes of its answer the relay at `i` may take from its upstream now:
    /// what is left of its stream's share and of the connection's budget (all streams
    /// together). A stream whose window the client keeps shut fills its share and stops there:
    /// its upstream is then read no further (backpressure, not buffering).
    fn relay_room(&self, i: usize) -> usize {
        self.room_for(self.relays[i].answer.data.len())
    }

    /// The room of a stream holding `own` bytes of its answer.
    fn room_for(&self, own: usize) -> usize {
        room_given(own, self.held())
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
            let room = room_given(self.relays[i].answer.data.len(), held);
            let Some((chunk, ended)) = self.session.body_chunk(id) else {
                continue;
            };
            // (The session's buffers and the relays are separate fields: the chunk stays
            // borrowed from the session while the relay takes it.)
            let r = &mut self.relays[i];
            let mut sink = H2Sink {
                answer: &mut r.answer,
                room,
                encoders_held: encoders - r.relay.encoder_bytes(),
            };
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
                let WholeAnswer {
                    response,
                    tally,
                    log,
                } = *whole;
                let facts = Facts {
                    id: ExchangeId(u64::from(id)),
                    head_only,
                    keep_alive: true,
                    http10: false,
                    tally,
                };
                let entry = log.as_ref().map(|s| s.entry());
                self.respond(id, response, facts, out, link, cx, entry.as_ref());
                continue;
            }
            if let Some((response, length)) = answer.head.take() {
                let end_stream = head_only
                    || status_has_no_body(response.status)
                    || (answer.end && answer.data.is_empty());
                if end_stream {
                    answer.data.clear();
                }
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
        let date_line = cx.clock.date_line();
        let date = &date_line[6..date_line.len() - 2];
        let buf = out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        let mut h = self.session.response(id, response.status, buf);
        h.field(b"date", date);
        h.field(b"server", b"tern");
        if let Some(n) = length {
            h.field(b"content-length", itoa::Buffer::new().format(n).as_bytes());
        }
        for line in response.headers().split(|&b| b == b'\n') {
            add_line(&mut h, line);
        }
        for line in link
            .secure_lines(cx)
            .unwrap_or_default()
            .split(|&b| b == b'\n')
        {
            add_line(&mut h, line);
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

/// How many more answer bytes a relayed stream may take from its upstream, holding `own` of
/// them while the connection's relays hold `held` together.
fn room_given(own: usize, held: usize) -> usize {
    RELAY_STREAM_BUFFER
        .saturating_sub(own)
        .min(RELAY_CONN_BUFFER.saturating_sub(held))
}
