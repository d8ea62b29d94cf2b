//! The request's side of a relay: the bytes for the upstream, made once from the handler's
//! head ([`Relay::start`]), and the client's body as it streams in, taken only while less than
//! [`TO_UPSTREAM_MAX`] waits for the upstream and framed for it (a length, chunked, or FastCGI
//! STDIN records); in a tunnel, the client's bytes as they are.

use tern_codec::{BodyDecoder, BodyKind};

use super::{BodyFollows, Phase, Relay, RelayStart, UpBody};
use crate::conn::up_queue::UpQueue;
use crate::conn::upstream_wire::{BodyFraming, FastCgiAnswer};
use crate::conn::websocket::Handshake;
use crate::exchange::{ConnCx, Sink};
use crate::upstream::{Forward, UpstreamOutcome, UpstreamWire};

/// Request bytes waiting for the upstream before the client is read no further.
const TO_UPSTREAM_MAX: usize = 64 * 1024;

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
            conn,
            exchange,
            handback,
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
            conn,
            exchange,
            handback,
            held_over: None,
        };
        if no_key {
            relay.answer_own(503, "no random numbers for a WebSocket key\n", sink, cx);
            return relay;
        }
        // A held request waits at least until its first instant (it was just looked at).
        if relay.fwd.not_before_ms > cx.clock.now_ms() || relay.fwd.hold.is_some() {
            relay.phase = Phase::Wait;
            relay.deadline_ms = relay.fwd.not_before_ms.max(cx.clock.now_ms() + 1);
            return relay;
        }
        relay.begin(sink, cx);
        relay
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

    fn pending_up(&self) -> usize {
        self.to_up.pending()
    }

    pub(super) fn request_sent(&self) -> bool {
        self.client_body.is_none() && self.pending_up() == 0
    }
}

impl Forward {
    /// A request with no body still says `Content-Length: 0` when its method usually has
    /// one, as clients do (some servers want it for POST).
    fn idempotent_needs_length(&self) -> bool {
        !self.idempotent
    }
}

fn push_length(to: &mut Vec<u8>, n: u64) {
    to.extend_from_slice(b"Content-Length: ");
    to.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    to.extend_from_slice(b"\r\n\r\n");
}
