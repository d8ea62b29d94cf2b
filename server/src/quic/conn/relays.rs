//! The HTTP/3 side of relayed answers (proxy and FastCGI routes, the cache's fills): one relay
//! per relayed stream, writing through the sink HTTP/2 shares (`conn/relay/held.rs`: the
//! answer held until it is framed, and how much each may read from its upstream), and its
//! answer out as HEADERS and DATA frames written into the stream as QUIC's flow control takes
//! them, or a reset when it breaks. The driver reaches the relays through [`RelayHost`], as it
//! reaches a TCP connection's.

use std::sync::Arc;

use bytes::Bytes;
use quinn_proto::{StreamId, VarInt};
use tern_http3::ErrorCode;

use super::{quic_id, QuicConn, Relayed};
use crate::conn::relay::{HeldAnswer, HeldSink, Relay, RelayNeed, RelayStart, Tunnels};
use crate::conn::RelayHost;
use crate::exchange::{ConnCx, Sink};
use crate::handler::ExchangeId;
use crate::response::{header_fields, Response};
use crate::upstream::Upstreams;

/// What a stream's relay writes its answer through (held, see `conn/relay/held.rs`).
type H3Sink<'a> = HeldSink<'a, NoTunnels>;

/// HTTP/3 carries no tunnel: it offers no extended CONNECT (its SETTINGS say so), and a
/// request's Upgrade is never forwarded from it (`dispatch`), so no upstream can switch
/// protocols here; if one claims to, the stream is reset rather than carry a tunnel.
struct NoTunnels;

impl Tunnels for NoTunnels {
    fn tunnel(answer: &mut HeldAnswer, _: Response, _: &mut ConnCx<'_>) -> u16 {
        answer.broken = true;
        502
    }
}

impl QuicConn {
    /// Starts relaying `stream`'s exchange; what the relay answered at once (a 503 with no
    /// server to try) goes out.
    pub(super) fn start_relay(
        &mut self,
        stream: StreamId,
        start: RelayStart<'_>,
        cx: &mut ConnCx<'_>,
    ) {
        let mut answer = HeldAnswer::default();
        let mut sink = H3Sink::new(&mut answer, 0, self.relays_held(), self.encoders_held());
        let relay = Box::new(Relay::start(start, &mut sink, cx));
        self.relays.push(Relayed {
            stream,
            relay,
            answer,
            frames: Bytes::new(),
            head_done: false,
            stream_done: false,
        });
        self.feed_relays(cx);
        self.flush_relays(cx);
    }

    /// Hands streamed request bodies to their relays as far as each takes them; then reads
    /// more of each stream from QUIC as far as its room in the session (the rest, and the
    /// client's flow-control credit with it, wait for the upstream to take more).
    pub(crate) fn feed_relays(&mut self, cx: &mut ConnCx<'_>) {
        let held = self.relays_held();
        let encoders = self.encoders_held();
        for i in 0..self.relays.len() {
            if !self.relays[i].relay.wants_input() {
                continue;
            }
            let stream = self.relays[i].stream;
            let raw = u64::from(stream);
            let Some((chunk, ended)) = self.h3.body_chunk(raw) else {
                continue;
            };
            // (The session and the relays are separate fields: the chunk stays borrowed from
            // the session while the relay takes it.)
            let r = &mut self.relays[i];
            let own = r.answer.data.len() + r.frames.len();
            let encoders_held = encoders - r.relay.encoder_bytes();
            let mut sink = H3Sink::new(&mut r.answer, own, held, encoders_held);
            let used = r.relay.client_input(chunk, &mut sink, cx);
            let all = used == chunk.len();
            self.h3.consume_body(raw, used);
            if all && ended {
                self.relays[i].relay.end_client_body();
            } else if used > 0 {
                self.read_stream(stream);
            }
        }
    }

    fn relays_held(&self) -> usize {
        (self.relays.iter())
            .map(|r| r.answer.data.len() + r.frames.len())
            .sum()
    }

    fn encoders_held(&self) -> usize {
        self.relays.iter().map(|r| r.relay.encoder_bytes()).sum()
    }

    fn slot(&self, id: ExchangeId) -> Option<usize> {
        self.relays.iter().position(|r| u64::from(r.stream) == id.0)
    }

    /// The relay in slot `i` and its sink, with its room: what is left of its stream's share
    /// and of the connection's budget.
    fn parts(&mut self, i: usize) -> (&mut Relay, H3Sink<'_>) {
        let held = self.relays_held();
        let encoders_held = self.encoders_held() - self.relays[i].relay.encoder_bytes();
        let r = &mut self.relays[i];
        // Frames made from the answer and not yet taken by the stream count as held.
        let own = r.answer.data.len() + r.frames.len();
        (
            &mut r.relay,
            H3Sink::new(&mut r.answer, own, held, encoders_held),
        )
    }

    /// Frames what the relays produced and writes it into their streams as far as the
    /// streams take it; relays whose answer is out and whose upstream is released go.
    pub(super) fn flush_relays(&mut self, cx: &mut ConnCx<'_>) {
        if self.closed {
            return;
        }
        for i in 0..self.relays.len() {
            let head_only = self.relays[i].relay.head_only();
            let r = &mut self.relays[i];
            if r.stream_done {
                continue;
            }
            if let Some(whole) = r.answer.whole.take() {
                // Answered as a handler's answer is (HEADERS, then its body, a file too).
                r.stream_done = true;
                let stream = r.stream;
                let (response, facts, log) =
                    whole.into_parts(ExchangeId(u64::from(stream)), head_only);
                let entry = log.as_ref().map(|s| s.entry());
                self.respond(stream, response, facts, cx, entry.as_ref());
                continue;
            }
            if r.answer.broken {
                r.answer.broken = false;
                r.stream_done = true;
                r.answer.data.clear();
                r.frames = Bytes::new();
                let code = VarInt::from_u64(ErrorCode::Internal.code()).unwrap_or(VarInt::MAX);
                let _ = self.quic.send_stream(r.stream).reset(code);
                let _ = self.h3.answer_sent(u64::from(r.stream));
                continue;
            }
            if let Some((response, length, end)) = r.answer.take_head(head_only) {
                if end {
                    // `write_relay` finishes the stream after the HEADERS.
                    r.answer.end = true;
                }
                let mut frames = Vec::with_capacity(256);
                let date = cx.clock.date_value();
                let mut length_text = itoa::Buffer::new();
                let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(16);
                fields.push((b"date", date));
                fields.push((b"server", b"tern"));
                if let Some(n) = length {
                    fields.push((b"content-length", length_text.format(n).as_bytes()));
                }
                let secure = self.link.secure_lines(cx).unwrap_or_default();
                fields.extend(header_fields(response.headers()).chain(header_fields(secure)));
                self.h3
                    .send_response_head(response.status, &fields, &mut frames);
                let r = &mut self.relays[i];
                r.frames = Bytes::from(frames);
                r.head_done = true;
            }
            self.write_relay(i);
        }
        self.drop_finished_relays();
    }

    /// Writes slot `i`'s frames, then its body bytes as one DATA frame at a time, and its
    /// FIN once all is out.
    fn write_relay(&mut self, i: usize) {
        let r = &mut self.relays[i];
        if !r.head_done || r.stream_done {
            return;
        }
        let mut send = self.quic.send_stream(r.stream);
        loop {
            while !r.frames.is_empty() {
                match send.write_chunks(std::slice::from_mut(&mut r.frames)) {
                    Ok(w) if w.bytes > 0 => {}
                    _ => return,
                }
            }
            if r.answer.data.is_empty() {
                break;
            }
            let data = std::mem::take(&mut r.answer.data);
            let mut frame = Vec::with_capacity(data.len() + 9);
            tern_http3::frame::write_header(
                &mut frame,
                tern_http3::frame::kind::DATA,
                data.len() as u64,
            );
            frame.extend_from_slice(&data);
            r.frames = Bytes::from(frame);
            r.answer.data = data;
            r.answer.data.clear();
        }
        if r.answer.end {
            r.stream_done = true;
            let _ = send.finish();
            let stream = u64::from(r.stream);
            if self.h3.answer_sent(stream) {
                let code = VarInt::from_u64(ErrorCode::NoError.code()).unwrap_or(VarInt::MAX);
                let _ = self.quic.recv_stream(quic_id(stream)).stop(code);
            }
        }
    }

    /// Relays whose upstream connection is released and whose answer is out (or reset).
    fn drop_finished_relays(&mut self) {
        self.relays
            .retain(|r| !(r.relay.is_finished() && r.stream_done));
    }

    /// The client reset or stopped `stream`: its relay ends unfinished (its upstream
    /// connection is closed when the driver next looks).
    pub(super) fn forget_relay(&mut self, stream: StreamId, cx: &ConnCx<'_>) {
        if let Some(r) = self.relays.iter_mut().find(|r| r.stream == stream) {
            r.relay.abandon(cx.stats);
            r.answer = HeldAnswer::default();
            r.frames = Bytes::new();
            r.stream_done = true;
        }
    }

    /// The earliest deadline of a relay (an upstream's timeouts), `u64::MAX` without one.
    pub(crate) fn relay_deadline(&self) -> u64 {
        (self.relays.iter())
            .filter(|r| !r.relay.is_finished())
            .map(|r| r.relay.deadline())
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The relays whose deadline passed handle it (another server, a 504, or an answer its
    /// client stopped taking ended).
    pub(crate) fn relays_timed_out(&mut self, cx: &mut ConnCx<'_>) {
        let now = cx.clock.now_ms();
        for i in 0..self.relays.len() {
            if self.relays[i].relay.is_finished() || self.relays[i].relay.deadline() > now {
                continue;
            }
            let (relay, mut sink) = self.parts(i);
            let room = sink.room() > 0;
            relay.timed_out(room, &mut sink, cx);
        }
        self.flush_relays(cx);
    }

    /// A held relay's hold may answer now (the cache fill it waits for ended). False: no
    /// relay of that id is held.
    pub(crate) fn relay_wake(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) -> bool {
        let Some(i) = self.slot(id) else {
            return false;
        };
        if !self.relays[i].relay.is_held() {
            return false;
        }
        let (relay, mut sink) = self.parts(i);
        let room = sink.room() > 0;
        relay.timed_out(room, &mut sink, cx);
        self.flush_relays(cx);
        true
    }
}

impl RelayHost for QuicConn {
    fn key(&self) -> u64 {
        self.link.key
    }

    fn in_relay(&self) -> bool {
        !self.relays.is_empty()
    }

    fn relay_ids(&self, into: &mut Vec<ExchangeId>) {
        into.extend(self.relays.iter().map(|r| ExchangeId(u64::from(r.stream))));
    }

    fn relay_need(&self, id: ExchangeId) -> RelayNeed {
        self.slot(id)
            .map_or(RelayNeed::Nothing, |i| self.relays[i].relay.need())
    }

    fn relay_upstreams(&self, id: ExchangeId) -> Option<Arc<dyn Upstreams>> {
        self.slot(id)
            .map(|i| self.relays[i].relay.upstreams().clone())
    }

    fn relay_attached(&mut self, id: ExchangeId, reused: bool, connected: bool, cx: &ConnCx<'_>) {
        if let Some(i) = self.slot(id) {
            self.relays[i].relay.attached(reused, connected, cx);
        }
    }

    fn relay_connected(&mut self, id: ExchangeId, cx: &ConnCx<'_>) {
        if let Some(i) = self.slot(id) {
            self.relays[i].relay.now_connected(cx);
        }
    }

    fn relay_released(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) {
        if let Some(i) = self.slot(id) {
            self.relays[i].relay.released(cx);
        }
        self.flush_relays(cx);
    }

    fn relay_seal(&mut self, id: ExchangeId) {
        if let Some(i) = self.slot(id) {
            self.relays[i].relay.seal_send();
        }
    }

    fn relay_send_buf(&self, id: ExchangeId) -> &[u8] {
        self.slot(id)
            .map_or(&[][..], |i| self.relays[i].relay.send_buf())
    }

    fn relay_sent(&mut self, id: ExchangeId, n: usize, cx: &ConnCx<'_>) {
        if let Some(i) = self.slot(id) {
            self.relays[i].relay.sent(n, cx);
        }
    }

    fn relay_recv_buf(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) -> &mut [u8] {
        match self.slot(id) {
            Some(i) => {
                let (relay, sink) = self.parts(i);
                let room = sink.room();
                relay.recv_buf(room, cx)
            }
            None => &mut [],
        }
    }

    fn relay_recv(&mut self, id: ExchangeId, n: usize, cx: &mut ConnCx<'_>) {
        if let Some(i) = self.slot(id) {
            let (relay, mut sink) = self.parts(i);
            relay.recv(n, &mut sink, cx);
        }
        self.flush_relays(cx);
    }

    fn relay_closed(&mut self, id: ExchangeId, error: bool, cx: &mut ConnCx<'_>) {
        if let Some(i) = self.slot(id) {
            let (relay, mut sink) = self.parts(i);
            relay.closed(error, &mut sink, cx);
        }
        self.flush_relays(cx);
    }

    fn relay_connect_failed(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) {
        if let Some(i) = self.slot(id) {
            let (relay, mut sink) = self.parts(i);
            relay.connect_failed(&mut sink, cx);
        }
        self.flush_relays(cx);
    }

    fn relay_wants_shutdown(&self, id: ExchangeId) -> bool {
        self.slot(id)
            .is_some_and(|i| self.relays[i].relay.wants_shutdown())
    }

    fn relay_shut_down(&mut self, id: ExchangeId) {
        if let Some(i) = self.slot(id) {
            self.relays[i].relay.shut_down();
        }
    }

    fn abandon_relays(&mut self, cx: &ConnCx<'_>) {
        for r in &mut self.relays {
            r.relay.abandon(cx.stats);
        }
        self.relays.clear();
    }
}
