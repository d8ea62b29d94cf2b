//! A relayed answer held for one stream of a multiplexed connection (HTTP/2, HTTP/3) until
//! its protocol frames it: the [`HeldAnswer`], the one [`Sink`] both protocols lend their
//! relays ([`HeldSink`]), and how much of its answer a stream's relay may read from its
//! upstream ([`room_given`]). What differs by protocol stays with it: the framing written from
//! the held answer (`conn/http2/relays.rs`, `quic/conn/relays.rs`) and what an upstream's
//! switch of protocols becomes ([`Tunnels`]).

use std::marker::PhantomData;

use crate::access_log::SavedEntry;
use crate::exchange::{ConnCx, Facts, Sink};
use crate::handler::ExchangeId;
use crate::response::{status_has_no_body, Response};
use crate::stats::Tally;

/// A relayed answer's bytes held for its stream (waiting for window, or for the stream or
/// the output to take them) before its upstream is read no further: about one default
/// HTTP/2 stream window, or one flight of a QUIC stream.
const STREAM_BUFFER: usize = 64 * 1024;
/// The same for all of a connection's streams together: a client that opens many streams
/// and no window gets this much held for it, not a share per stream.
const CONN_BUFFER: usize = 512 * 1024;

/// A relayed answer as its relay produced it, not framed yet.
#[derive(Default)]
pub(crate) struct HeldAnswer {
    /// The head, once known, not yet sent: the fields and the length, if known.
    pub head: Option<(Response, Option<u64>)>,
    /// Body bytes not yet framed (as much as [`room_given`] gave room for).
    pub data: Vec<u8>,
    /// The body is complete.
    pub end: bool,
    /// The answer broke after its head went out (or cannot be carried): the stream must be
    /// reset.
    pub broken: bool,
    /// A whole answer in its place (see [`Sink::whole`]), to be sent as a handler's is.
    pub whole: Option<Box<WholeAnswer>>,
}

impl HeldAnswer {
    /// The head, if it waits to be framed, and whether the stream ends with it (a HEAD
    /// request, a status without a body, or an empty body already complete); if it does,
    /// body bytes held meanwhile are dropped.
    pub fn take_head(&mut self, head_only: bool) -> Option<(Response, Option<u64>, bool)> {
        let (response, length) = self.head.take()?;
        let end =
            head_only || status_has_no_body(response.status) || (self.end && self.data.is_empty());
        if end {
            self.data.clear();
        }
        Some((response, length, end))
    }
}

/// A whole answer a relay gave in place of its upstream's, and what its sending needs.
pub(crate) struct WholeAnswer {
    response: Response,
    tally: Tally,
    log: Option<Box<SavedEntry>>,
}

impl WholeAnswer {
    /// What the protocol's `respond` takes for it, as for a handler's answer on stream `id`:
    /// the response, its facts, and the request's part of its log line.
    pub fn into_parts(
        self,
        id: ExchangeId,
        head_only: bool,
    ) -> (Response, Facts, Option<Box<SavedEntry>>) {
        let facts = Facts {
            id,
            head_only,
            // A stream's end closes nothing else.
            keep_alive: true,
            http10: false,
            tally: self.tally,
        };
        (self.response, facts, self.log)
    }
}

/// What an upstream's switch of protocols (a `101`) becomes on a stream: the one thing the
/// held sink leaves to its protocol (HTTP/2 opens an extended-CONNECT tunnel; HTTP/3 has
/// none).
pub(crate) trait Tunnels {
    /// Does it to `answer` (`r`: the end-to-end fields the upstream sent) and returns the
    /// status the client was answered with (see [`Sink::tunnel`]).
    fn tunnel(answer: &mut HeldAnswer, r: Response, cx: &mut ConnCx<'_>) -> u16;
}

/// What a stream's relay writes its answer through: everything is held in the stream's
/// [`HeldAnswer`] for the protocol to frame once the relay's call returns.
pub(crate) struct HeldSink<'a, T> {
    answer: &'a mut HeldAnswer,
    room: usize,
    /// Encoder state the connection's other streams hold.
    encoders_held: usize,
    tunnels: PhantomData<T>,
}

impl<'a, T: Tunnels> HeldSink<'a, T> {
    /// The sink of a stream holding `own` bytes of its answer (held in `answer` or framed
    /// from it and not yet taken) while the connection's relays hold `held` together.
    pub fn new(answer: &'a mut HeldAnswer, own: usize, held: usize, encoders_held: usize) -> Self {
        HeldSink {
            answer,
            room: room_given(own, held),
            encoders_held,
            tunnels: PhantomData,
        }
    }
}

impl<T: Tunnels> Sink for HeldSink<'_, T> {
    fn room(&self) -> usize {
        self.room
    }

    fn encoders_held(&self) -> usize {
        self.encoders_held
    }

    fn head(&mut self, r: Response, len: Option<u64>, _: bool, _: bool, _: &mut ConnCx<'_>) {
        // The protocol frames the body itself: no chunking, no Connection; HSTS is added as
        // the head is encoded.
        self.answer.head = Some((r, len));
    }

    fn interim(&mut self, _: &Response, _: &mut ConnCx<'_>) {
        // Interim answers are not passed on over HTTP/2 or HTTP/3 (a 103 from an app reaches
        // HTTP/1.1 clients only).
    }

    fn tunnel(&mut self, r: Response, _: Option<&[u8]>, cx: &mut ConnCx<'_>) -> u16 {
        T::tunnel(self.answer, r, cx)
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
        // Sent by the protocol as a handler's answer (HEADERS, then its body, a file too);
        // a stream's end closes nothing else, so `close` is not needed.
        self.answer.whole = Some(Box::new(WholeAnswer {
            response,
            tally,
            log,
        }));
    }
}

/// How many more answer bytes a relayed stream may take from its upstream, holding `own` of
/// them while the connection's relays hold `held` together. A stream whose client keeps its
/// window shut fills its share and stops there: its upstream is then read no further
/// (backpressure, not buffering).
fn room_given(own: usize, held: usize) -> usize {
    STREAM_BUFFER
        .saturating_sub(own)
        .min(CONN_BUFFER.saturating_sub(held))
}

/// Whether the route of a request on a multiplexed stream (its head as decoded so far) takes
/// its body as a stream (the proxy, FastCGI) rather than whole: HTTP/2 and HTTP/3 ask at the
/// head, before any body is held.
pub(crate) fn streams_body(data: &tern_http2::RequestData, cx: &ConnCx<'_>) -> bool {
    let mut few = [httparse::EMPTY_HEADER; 24];
    let mut many;
    let slots: &mut [httparse::Header<'_>] = if data.fields.field_count() <= few.len() {
        &mut few
    } else {
        many = vec![httparse::EMPTY_HEADER; data.fields.field_count()];
        &mut many
    };
    // Any declared length: a streaming route takes it (the session checks the others).
    let limits = tern_codec::Limits {
        max_body: u64::MAX,
        ..cx.config.limits
    };
    data.head(slots, &limits)
        .is_ok_and(|head| crate::exchange::streams_body(&head, cx))
}

/// How a request on a multiplexed stream whose head came without its end takes its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyChoice {
    /// Not known yet (no declared length, no body byte, no end): the request waits,
    /// undecided, for its next body event.
    Wait,
    /// Its route streams bodies: it runs now, its relay fed the body as it comes.
    Stream,
    /// Gathered whole (up to `max_body`), then run; also a stream that ended with no body,
    /// which is a request without one.
    Gather,
}

/// The one rule HTTP/2 and HTTP/3 follow for a request whose HEADERS came without the
/// stream's end (`body`: what came of its body so far, `ended`: the stream's end came too).
/// A body that declares a length (over 0) or has begun goes to a route that streams bodies
/// (the proxy, FastCGI) at once, to any other whole. A stream that ends with no body is a
/// request without one: a GET whose end came in an empty DATA frame (or a trailers block)
/// after its HEADERS must not reach its upstream as a chunked upload of nothing
/// (`Transfer-Encoding: chunked` on a GET), as it would if it were streamed with no length.
/// Until one of those shows, it waits: the route is asked only once it is known.
pub(crate) fn body_choice(
    data: &tern_http2::RequestData,
    body: &[u8],
    ended: bool,
    cx: &ConnCx<'_>,
) -> BodyChoice {
    let declared = data.fields.content_length().is_some_and(|n| n > 0);
    match (body.is_empty(), ended) {
        (true, false) if !declared => BodyChoice::Wait,
        (true, true) => BodyChoice::Gather,
        _ if streams_body(data, cx) => BodyChoice::Stream,
        _ => BodyChoice::Gather,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_the_smaller_of_the_streams_share_and_the_connections() {
        assert_eq!(room_given(0, 0), STREAM_BUFFER);
        assert_eq!(room_given(1000, 1000), STREAM_BUFFER - 1000);
        assert_eq!(room_given(0, CONN_BUFFER - 10), 10);
        assert_eq!(room_given(STREAM_BUFFER + 1, 0), 0);
        assert_eq!(room_given(0, CONN_BUFFER + 1), 0);
    }

    #[test]
    fn a_head_that_ends_the_stream_drops_the_body_held() {
        let mut a = HeldAnswer {
            head: Some((Response::new(204), None)),
            data: b"stray".to_vec(),
            ..HeldAnswer::default()
        };
        let (r, _, end) = a.take_head(false).expect("a head");
        assert_eq!(r.status, 204);
        assert!(end && a.data.is_empty() && a.head.is_none());

        let mut a = HeldAnswer {
            head: Some((Response::new(200), Some(5))),
            data: b"hello".to_vec(),
            ..HeldAnswer::default()
        };
        let (_, len, end) = a.take_head(false).expect("a head");
        assert_eq!(len, Some(5));
        assert!(!end && a.data == b"hello");
        assert!(a.take_head(true).is_none());
    }
}
