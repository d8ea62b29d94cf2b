//! One HTTP/3 connection: quinn-proto's QUIC connection carries the streams, tern-http3's
//! sans-IO session reads their frames (and holds every budget against hostile peers), and
//! requests go to the same `exchange::dispatch` as HTTP/1.1's and HTTP/2's. Answers are
//! HEADERS and DATA frames written into the QUIC streams as their flow control allows: QUIC
//! encrypts in user space, so a file is read (`pread`) in pieces rather than sent by the
//! kernel. This file does no I/O: the worker's socket side (`quic/mod.rs`) feeds datagrams to
//! the connection and sends what it has to send.

mod relays;

use std::time::Instant;

use bytes::Bytes;
use quinn_proto::{Dir, Event as QuicEvent, ReadError, StreamEvent, StreamId, VarInt, WriteError};
use tern_codec::{Method, Version};
use tern_http2::RequestData;
use tern_http3::{ConnError, ErrorCode, Event};
use tern_runtime::ratelog;

use crate::access_log::{LogEntry, SavedEntry};
use crate::conn::relay::{body_choice, BodyChoice, BodyFollows, HeldAnswer, Relay, RelayStart};
use crate::exchange::{self, Awaiting, ConnCx, Facts, Link, Outcome};
use crate::handler::ExchangeId;
use crate::head_memo::{HeadMemo, HeadParts};
use crate::response::{header_fields, status_has_no_body, Body, FileBody, Response};
use crate::stats::{Counter, Tally};

/// Requests whose whole body is still arriving, per connection (the session bounds their
/// bytes).
const GATHERING_LIMIT: usize = 128;

/// An answer being written into its stream.
struct Answer {
    stream: StreamId,
    /// Frame bytes (HEADERS, a DATA frame's header) not yet taken by the stream.
    frames: Bytes,
    body: Pending,
}

/// The part of an answer's body its stream has not taken yet.
enum Pending {
    None,
    Memory(Bytes),
    File {
        body: FileBody,
        /// Read from the file but not yet taken by the stream.
        read: Bytes,
    },
}

/// A stream relayed to an upstream server.
struct Relayed {
    stream: StreamId,
    relay: Box<Relay>,
    /// What the relay produced that is not framed yet.
    answer: HeldAnswer,
    /// Frame bytes made and not yet taken by the stream.
    frames: Bytes,
    /// The HEADERS went out (or were queued in `frames`).
    head_done: bool,
    /// The stream was finished or reset: nothing more goes on it.
    stream_done: bool,
}

/// One QUIC connection serving HTTP/3.
pub(crate) struct QuicConn {
    pub quic: quinn_proto::Connection,
    pub handle: quinn_proto::ConnectionHandle,
    /// Which of the worker's UDP sockets it came in on.
    pub socket: usize,
    pub link: Link,
    h3: tern_http3::Connection,
    /// Our control stream, once opened, and what is still to be written on it.
    control: Option<StreamId>,
    control_out: Vec<u8>,
    answers: Vec<Answer>,
    /// Last answer's HEADERS frame and what it was made from (`head_memo.rs`).
    head_memo: HeadMemo,
    /// Streams relayed to upstream servers (`relays.rs`), until their answer is out and
    /// their upstream connection released.
    relays: Vec<Relayed>,
    /// The upstream connection each relay has (exchange id, key in the worker's pool).
    pub upstreams: Vec<(ExchangeId, u64)>,
    /// Request streams whose body is still arriving (the session holds it).
    gathering: Vec<u64>,
    /// Request streams whose head came without its end, and whose body (if any) has not
    /// shown how it will be taken yet (`take_body`).
    undecided: Vec<u64>,
    awaiting: Awaiting,
    /// Established (the handshake completed).
    pub connected: bool,
    /// The worker no longer counts it among handshakes in progress.
    pub handshake_over: bool,
    /// The connection was lost or closed: nothing more is read or dispatched.
    pub closed: bool,
    /// A graceful close was asked for (shutdown): GOAWAY sent, close once idle.
    draining: bool,
    /// The timer (µs on the worker's clock): when it is due, and the earliest time armed in
    /// the side's heap of deadlines.
    pub deadline_us: u64,
    pub armed_us: u64,
}

impl QuicConn {
    pub fn new(
        quic: quinn_proto::Connection,
        handle: quinn_proto::ConnectionHandle,
        socket: usize,
        link: Link,
        cx: &mut ConnCx<'_>,
    ) -> QuicConn {
        let limits = &cx.config.limits;
        let cfg = tern_http3::Config {
            max_field_section_size: limits.max_head as u64,
            max_body: limits.max_body,
            max_buffered_body: limits.max_body.min(16 * 1024 * 1024) as usize,
            ..tern_http3::Config::default()
        };
        let mut control_out = Vec::new();
        let h3 = tern_http3::Connection::new(cfg, &mut control_out);
        QuicConn {
            quic,
            handle,
            socket,
            link,
            h3,
            control: None,
            control_out,
            answers: Vec::new(),
            head_memo: HeadMemo::default(),
            relays: Vec::new(),
            upstreams: Vec::new(),
            gathering: Vec::new(),
            undecided: Vec::new(),
            awaiting: Awaiting::default(),
            connected: false,
            handshake_over: false,
            closed: false,
            draining: false,
            deadline_us: u64::MAX,
            armed_us: u64::MAX,
        }
    }

    /// Everything the QUIC connection has for us since the last call: its events, the
    /// streams' bytes into the session, the session's events into exchanges, and answers
    /// written as far as the streams take them. Transmits are left to the caller.
    pub fn drive(&mut self, now: Instant, cx: &mut ConnCx<'_>) {
        while let Some(event) = self.quic.poll() {
            match event {
                QuicEvent::HandshakeDataReady => {}
                QuicEvent::Connected => {
                    self.connected = true;
                    cx.stats.bump(Counter::Http3Connections);
                    // quinn-proto's `accepted_0rtt` is the client's view (always false on a
                    // server); a server has 0-RTT keys only if rustls accepted the early data.
                    if self.quic.has_0rtt() {
                        cx.stats.bump(Counter::QuicEarlyDataAccepted);
                    }
                    self.open_control();
                }
                QuicEvent::ConnectionLost { .. } => {
                    self.closed = true;
                    self.awaiting.clear();
                    self.answers.clear();
                }
                QuicEvent::Stream(StreamEvent::Opened { dir }) => {
                    while let Some(id) = self.quic.streams().accept(dir) {
                        self.read_stream(id);
                    }
                }
                QuicEvent::Stream(StreamEvent::Readable { id }) => self.read_stream(id),
                QuicEvent::Stream(StreamEvent::Writable { .. }) => {}
                QuicEvent::Stream(StreamEvent::Stopped { id, error_code }) => {
                    // The client wants no more of this answer: it ends here, with the
                    // RESET_STREAM a STOP_SENDING calls for (RFC 9000 §3.5; quinn-proto leaves
                    // it to us), which also lets quinn free the stream once it is acknowledged.
                    let _ = self.quic.send_stream(id).reset(error_code);
                    self.answers.retain(|a| a.stream != id);
                    self.forget_relay(id, cx);
                    self.awaiting.forget(ExchangeId(u64::from(id)));
                    let step = self.h3.stream_reset(u64::from(id));
                    self.check(step, now, cx);
                }
                QuicEvent::Stream(StreamEvent::Finished { .. })
                | QuicEvent::Stream(StreamEvent::Available { .. }) => {}
                QuicEvent::DatagramReceived | QuicEvent::DatagramsUnblocked => {}
            }
        }
        self.follow_peer(now, cx);
        if let Some(e) = self.h3.error() {
            self.fail(e, now, cx);
        }
        self.session_events(now, cx);
        self.feed_relays(cx);
        self.write_control();
        self.write_answers(cx);
        self.flush_relays(cx);
        if self.draining
            && self.h3.open_requests() == 0
            && self.answers.is_empty()
            && self.answers_delivered()
        {
            self.close(now, ErrorCode::NoError, "shutting down");
        }
    }

    /// Every answer's bytes were acknowledged by the client (or its stream reset): only our
    /// control stream, which never ends, may have data under way. Closing sooner would lose
    /// them: quinn-proto's close abandons what its streams have not delivered.
    fn answers_delivered(&mut self) -> bool {
        self.quic.streams().send_streams() <= usize::from(self.control.is_some())
    }

    /// A deferred reply arrived. False if its stream is gone.
    pub fn complete(&mut self, id: ExchangeId, response: Response, cx: &mut ConnCx<'_>) -> bool {
        if self.closed {
            return false;
        }
        let Some(waiting) = self.awaiting.take(id) else {
            return false;
        };
        let entry = waiting.log.as_ref().map(|s| s.entry());
        self.respond(
            StreamId::from(VarInt::from_u64(id.0).unwrap_or(VarInt::MAX)),
            response,
            waiting.facts,
            cx,
            entry.as_ref(),
        );
        self.write_answers(cx);
        true
    }

    /// Shutdown began: GOAWAY, answer what was asked, then close.
    pub fn begin_drain(&mut self, now: Instant) {
        if self.draining || self.closed {
            return;
        }
        self.draining = true;
        self.awaiting.end_keep_alive();
        if !self.connected {
            self.close(now, ErrorCode::NoError, "shutting down");
            return;
        }
        self.h3.go_away(&mut self.control_out);
        self.write_control();
    }

    /// A client whose address changed (NAT rebinding, migration: quinn moved the path) is
    /// named by its new address from here on, in what its requests show (access log,
    /// handlers, forwarded headers, strikes); one that moved to a banned address is closed.
    fn follow_peer(&mut self, now: Instant, cx: &mut ConnCx<'_>) {
        let peer = self.quic.remote_address();
        if peer == self.link.peer || self.closed {
            return;
        }
        self.link.peer = peer;
        if cx.bans.is_some_and(|b| b.is_banned(peer.ip())) {
            cx.stats.bump(Counter::QuicRefusedBanned);
            self.close(now, ErrorCode::NoError, "address banned");
        }
    }

    /// Closes the connection with an HTTP/3 code (CONNECTION_CLOSE of type 0x1d).
    pub fn close(&mut self, now: Instant, code: ErrorCode, reason: &'static str) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.answers.clear();
        self.awaiting.clear();
        let code = VarInt::from_u64(code.code()).unwrap_or(VarInt::MAX);
        self.quic
            .close(now, code, Bytes::from_static(reason.as_bytes()));
    }

    fn open_control(&mut self) {
        if self.control.is_none() {
            self.control = self.quic.streams().open(Dir::Uni);
        }
        self.write_control();
    }

    fn write_control(&mut self) {
        let Some(id) = self.control else { return };
        if self.control_out.is_empty() {
            return;
        }
        if let Ok(n) = self.quic.send_stream(id).write(&self.control_out) {
            self.control_out.drain(..n);
        }
    }

    /// What the stream has for us goes into the session, which buffers what it needs; a
    /// streamed request's stream only as far as its room (`body_room`): the rest waits in
    /// QUIC, whose flow control then holds the client back until its relay takes more.
    pub(super) fn read_stream(&mut self, id: StreamId) {
        let raw = u64::from(id);
        let room = self.h3.body_room(raw);
        let reset = if room == 0 {
            // Nothing is read, but a reset is seen (its relay must not wait for the rest).
            matches!(self.quic.recv_stream(id).received_reset(), Ok(Some(_)))
        } else {
            self.read_into_session(id, room)
        };
        if reset {
            // The client abandoned its request: its answer goes too, ended with a reset of
            // ours, without which quinn would keep the stream (and a draining connection
            // open) for good.
            if id.dir() == Dir::Bi {
                let code =
                    VarInt::from_u64(ErrorCode::RequestCancelled.code()).unwrap_or(VarInt::MAX);
                let _ = self.quic.send_stream(id).reset(code);
            }
            self.answers.retain(|a| a.stream != id);
            self.awaiting.forget(ExchangeId(raw));
            let _ = self.h3.stream_reset(raw);
        }
    }

    /// Reads stream `id` into the session, `room` bytes at most (then as the session's room
    /// says); true if the client reset it.
    fn read_into_session(&mut self, id: StreamId, mut room: usize) -> bool {
        let raw = u64::from(id);
        let mut recv = self.quic.recv_stream(id);
        let Ok(mut chunks) = recv.read(true) else {
            return false;
        };
        let mut reset = false;
        while room > 0 {
            match chunks.next(room) {
                Ok(Some(chunk)) => {
                    if self.h3.recv_stream_data(raw, &chunk.bytes, false).is_err() {
                        break;
                    }
                    room = self.h3.body_room(raw);
                }
                Ok(None) => {
                    let _ = self.h3.recv_stream_data(raw, &[], true);
                    break;
                }
                Err(ReadError::Blocked) => break,
                Err(ReadError::Reset(_)) => {
                    reset = true;
                    break;
                }
            }
        }
        let _ = chunks.finalize();
        reset
    }

    fn session_events(&mut self, now: Instant, cx: &mut ConnCx<'_>) {
        while let Some(event) = self.h3.poll_event() {
            if self.closed {
                return;
            }
            match event {
                Event::Request { stream, end_stream } => {
                    if end_stream {
                        self.dispatch(stream, now, cx);
                    } else if self.gathering.len() + self.undecided.len() >= GATHERING_LIMIT {
                        self.reset_stream(stream, ErrorCode::RequestRejected, cx);
                    } else {
                        self.undecided.push(stream);
                        self.take_body(stream, now, cx);
                    }
                }
                Event::Body(stream) if self.undecided.contains(&stream) => {
                    self.take_body(stream, now, cx)
                }
                Event::Body(stream) => self.body_progress(stream, now, cx),
                Event::Trailers(_) => {}
                Event::Refuse { stream, status } => {
                    self.gathering.retain(|&s| s != stream);
                    self.undecided.retain(|&s| s != stream);
                    cx.stats.bump(Counter::Requests);
                    let id = quic_id(stream);
                    let facts = Facts::own_answer(ExchangeId(stream), cx.clock.now_us());
                    let message = match status {
                        431 => "request header fields too large\n",
                        _ => "request body too large\n",
                    };
                    let entry = cx
                        .access_log
                        .is_some()
                        .then(|| LogEntry::bare(self.link.peer, cx.clock.now_us()));
                    self.respond(
                        id,
                        Response::text(status, message),
                        facts,
                        cx,
                        entry.as_ref(),
                    );
                }
                Event::ResetStream { stream, code, .. } => {
                    cx.stats.bump(Counter::Http3StreamErrors);
                    self.gathering.retain(|&s| s != stream);
                    self.undecided.retain(|&s| s != stream);
                    self.reset_stream(stream, code, cx);
                }
                Event::StopSending { stream, code } => {
                    let code = VarInt::from_u64(code.code()).unwrap_or(VarInt::MAX);
                    let _ = self.quic.recv_stream(quic_id(stream)).stop(code);
                }
                Event::Reset(stream) => {
                    self.forget_relay(quic_id(stream), cx);
                    self.gathering.retain(|&s| s != stream);
                    self.undecided.retain(|&s| s != stream);
                    self.answers.retain(|a| u64::from(a.stream) != stream);
                    self.awaiting.forget(ExchangeId(stream));
                }
                Event::PeerGoAway => {}
            }
        }
        if let Some(e) = self.h3.error() {
            self.fail(e, now, cx);
        }
    }

    /// Chooses how the body of a request whose head came without its end is taken, once that
    /// is known, by the rule HTTP/2 shares (`conn/relay/held.rs`, `body_choice`): streamed to
    /// a route that takes bodies so (the proxy, FastCGI) once it declares a length or begins,
    /// gathered otherwise; a stream that ends with no body is a request without one (a GET
    /// whose FIN came after its HEADERS must not reach its upstream as a chunked upload).
    /// Until then it waits.
    fn take_body(&mut self, stream: u64, now: Instant, cx: &mut ConnCx<'_>) {
        let (Some((chunk, done)), Some(request)) =
            (self.h3.body_chunk(stream), self.h3.peek_request(stream))
        else {
            return;
        };
        let choice = body_choice(request, chunk, done, cx);
        if choice == BodyChoice::Wait {
            return;
        }
        self.undecided.retain(|&s| s != stream);
        if choice == BodyChoice::Stream {
            self.dispatch_streamed(stream, now, cx);
        } else if self.h3.gather_body(stream) {
            self.gathering.push(stream);
            self.body_progress(stream, now, cx);
        }
    }

    /// A request body grew: dispatch once it is complete.
    fn body_progress(&mut self, stream: u64, now: Instant, cx: &mut ConnCx<'_>) {
        let complete = self.h3.body_chunk(stream).is_some_and(|(_, done)| done);
        if complete && self.gathering.contains(&stream) {
            self.gathering.retain(|&s| s != stream);
            self.dispatch(stream, now, cx);
        }
    }

    fn reset_stream(&mut self, stream: u64, code: ErrorCode, cx: &ConnCx<'_>) {
        let id = quic_id(stream);
        let code = VarInt::from_u64(code.code()).unwrap_or(VarInt::MAX);
        let _ = self.quic.send_stream(id).reset(code);
        let _ = self.quic.recv_stream(id).stop(code);
        self.answers.retain(|a| a.stream != id);
        self.awaiting.forget(ExchangeId(stream));
        self.forget_relay(id, cx);
    }

    fn check(&mut self, step: Result<(), ConnError>, now: Instant, cx: &mut ConnCx<'_>) {
        if let Err(e) = step {
            self.fail(e, now, cx);
        }
    }

    /// A connection error of the peer's making: counted, logged (rate-limited), closed.
    fn fail(&mut self, e: ConnError, now: Instant, cx: &mut ConnCx<'_>) {
        if self.closed {
            return;
        }
        cx.stats.bump(Counter::Http3ConnectionErrors);
        if ratelog::admit("http3_connection_error", cx.clock.now_ms()) {
            tracing::info!(peer = %self.link.peer, code = ?e.code, "HTTP/3 connection error: {}", e.reason);
        }
        self.close(now, e.code, e.reason);
    }

    /// A request whose head (and body, if any) is complete: the same dispatch as HTTP/2's.
    fn dispatch(&mut self, stream: u64, now: Instant, cx: &mut ConnCx<'_>) {
        let Some(data) = self.h3.take_request(stream) else {
            return;
        };
        let body = match self.h3.body_chunk(stream) {
            Some((bytes, _)) if !bytes.is_empty() => bytes.to_vec(),
            _ => Vec::new(),
        };
        self.h3.consume_body(stream, body.len());
        self.run_exchange(stream, data, body, false, now, cx);
    }

    /// A request whose route streams its body: dispatched at its head; its relay is fed the
    /// body as it comes (`feed_relays`).
    fn dispatch_streamed(&mut self, stream: u64, now: Instant, cx: &mut ConnCx<'_>) {
        if let Some(data) = self.h3.stream_body(stream) {
            self.run_exchange(stream, data, Vec::new(), true, now, cx);
        }
    }

    /// Runs the exchange of a request; `streamed`: its body is still coming, for its relay.
    fn run_exchange(
        &mut self,
        stream: u64,
        data: RequestData,
        body: Vec<u8>,
        streamed: bool,
        now: Instant,
        cx: &mut ConnCx<'_>,
    ) {
        cx.stats.bump(Counter::Requests);
        // A streamed body's length was accepted by its route (see `streams_body`); a gathered
        // one's was checked by the session.
        let limits = tern_codec::Limits {
            max_body: if streamed {
                u64::MAX
            } else {
                cx.config.limits.max_body
            },
            ..cx.config.limits
        };
        let mut few = [httparse::EMPTY_HEADER; 24];
        let mut many;
        let slots: &mut [httparse::Header<'_>] = if data.fields.field_count() <= few.len() {
            &mut few
        } else {
            many = vec![httparse::EMPTY_HEADER; data.fields.field_count()];
            &mut many
        };
        let mut facts = Facts {
            id: ExchangeId(stream),
            head_only: false,
            keep_alive: true,
            http10: false,
            tally: Tally::starting(cx.clock.now_us()),
        };
        // Before the handshake completes, a request can only have come in 0-RTT early data,
        // which anyone who saw it can replay (RFC 9001 §9.2, RFC 8470): only safe requests
        // tern answers itself are answered from it.
        let early = !self.connected;
        let mut entry = None;
        let outcome = match data.head(slots, &limits) {
            Err(e) => {
                cx.stats.bad_request(e);
                if ratelog::admit(e.name(), cx.clock.now_ms()) {
                    let cause = e.message().trim_end();
                    tracing::info!(peer = %self.link.peer, status = e.status(), "bad HTTP/3 request: {cause}");
                }
                Outcome::Respond(Response::text(e.status(), e.message()))
            }
            // Extended CONNECT (a WebSocket) is not offered over HTTP/3 (SETTINGS say so), so
            // a request naming `:protocol` was refused by the session already.
            Ok(mut head) => {
                head.version = Version::Http3;
                facts.head_only = head.method == Method::Head;
                let safe = matches!(head.method, Method::Get | Method::Head | Method::Options);
                if early && !safe {
                    too_early(cx)
                } else {
                    exchange::dispatch(&head, &body, &self.link, &mut facts, &mut entry, cx)
                }
            }
        };
        let outcome = match outcome {
            // What tern cannot answer itself (a relay, a deferred reply) waits for the
            // handshake: the client sends it again then.
            Outcome::Forward(..) | Outcome::Deferred if early => too_early(cx),
            outcome => outcome,
        };
        if entry.is_none() && cx.access_log.is_some() {
            entry = Some(LogEntry::bare(self.link.peer, cx.clock.now_us()));
        }
        let id = quic_id(stream);
        match outcome {
            Outcome::Respond(r) => self.respond(id, r, facts, cx, entry.as_ref()),
            Outcome::Deferred => self.awaiting.park(facts, entry.as_ref()),
            Outcome::Forward(mut fwd, compress, handback) => {
                // No Upgrade over HTTP/3: it has no extended CONNECT on offer (RFC 9220 is
                // not advertised), so a WebSocket never starts here.
                fwd.upgrade = false;
                let start = RelayStart {
                    fwd,
                    compress,
                    head_only: facts.head_only,
                    handshake_is_ours: false,
                    body: &body,
                    streamed: streamed.then_some(BodyFollows::Raw(data.fields.content_length())),
                    log: entry.as_ref().and_then(SavedEntry::save),
                    tally: facts.tally,
                    conn: self.link.key,
                    exchange: facts.id,
                    handback,
                };
                self.start_relay(id, start, cx);
            }
            Outcome::Drop => {
                self.close(now, ErrorCode::ExcessiveLoad, "dropped");
            }
        }
    }

    /// Writes an answer's HEADERS (and its body's DATA frame header) and queues its body.
    fn respond(
        &mut self,
        stream: StreamId,
        response: Response,
        facts: Facts,
        cx: &mut ConnCx<'_>,
        entry: Option<&LogEntry<'_>>,
    ) {
        cx.answered(response.status, facts.tally);
        let no_body = status_has_no_body(response.status);
        let len = response.body.len();
        let end_stream = no_body || facts.head_only || len == 0;
        if let (Some(log), Some(entry)) = (cx.access_log.as_deref_mut(), entry) {
            let body_bytes = if end_stream { 0 } else { len };
            log.record(entry, response.status, body_bytes, cx.clock);
        }
        let date = cx.clock.date_value();
        let mut length = itoa::Buffer::new();
        let length = length.format(len).as_bytes();
        let secure = self.link.secure_lines(cx).unwrap_or_default();
        let parts = HeadParts {
            status: response.status,
            no_body,
            date,
            length,
            headers: response.headers(),
            secure,
        };
        let mut frames = Vec::with_capacity(128);
        // QPACK here uses no dynamic table: a HEADERS frame depends on its fields only.
        if let Some(head) = self.head_memo.lookup(0, &parts) {
            frames.extend_from_slice(head);
        } else {
            let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(12);
            fields.push((b"date", date));
            fields.push((b"server", b"tern"));
            if !no_body {
                fields.push((b"content-length", length));
            }
            fields.extend(header_fields(response.headers()).chain(header_fields(secure)));
            self.h3
                .send_response_head(response.status, &fields, &mut frames);
            self.head_memo.remember(0, &frames);
        }
        let body = match (end_stream, response.body) {
            (true, _) | (false, Body::Empty) => Pending::None,
            (false, Body::Static(b)) => Pending::Memory(Bytes::from_static(b)),
            (false, Body::Owned(b)) => Pending::Memory(Bytes::from(b)),
            (false, Body::Shared(b)) => Pending::Memory(b),
            (false, Body::File(f)) => Pending::File {
                body: f,
                read: Bytes::new(),
            },
        };
        if !matches!(body, Pending::None) {
            tern_http3::frame::write_header(&mut frames, tern_http3::frame::kind::DATA, len);
        }
        self.answers.push(Answer {
            stream,
            frames: Bytes::from(frames),
            body,
        });
    }

    /// Writes answers into their streams until each is done or blocked by flow control.
    fn write_answers(&mut self, cx: &mut ConnCx<'_>) {
        let mut i = 0;
        while i < self.answers.len() {
            match self.write_answer(i, cx) {
                Written::Done => {
                    let answer = self.answers.swap_remove(i);
                    let raw = u64::from(answer.stream);
                    let _ = self.quic.send_stream(answer.stream).finish();
                    if self.h3.answer_sent(raw) {
                        let code =
                            VarInt::from_u64(ErrorCode::NoError.code()).unwrap_or(VarInt::MAX);
                        let _ = self.quic.recv_stream(answer.stream).stop(code);
                    }
                }
                Written::Blocked => i += 1,
                Written::Gone => {
                    self.answers.swap_remove(i);
                }
            }
        }
    }

    fn write_answer(&mut self, i: usize, cx: &mut ConnCx<'_>) -> Written {
        let answer = &mut self.answers[i];
        let mut send = self.quic.send_stream(answer.stream);
        loop {
            let piece = if !answer.frames.is_empty() {
                &mut answer.frames
            } else {
                match &mut answer.body {
                    Pending::None => return Written::Done,
                    Pending::Memory(b) if b.is_empty() => return Written::Done,
                    Pending::Memory(b) => b,
                    Pending::File { body, read } => {
                        if read.is_empty() {
                            if body.len == 0 {
                                return Written::Done;
                            }
                            match body.read_piece() {
                                Ok(bytes) => *read = bytes,
                                Err(e) => {
                                    // The file shrank or failed under us: the answer cannot be
                                    // completed honestly.
                                    if ratelog::admit("http3_file_read", cx.clock.now_ms()) {
                                        tracing::warn!("HTTP/3 answer's file read failed: {e}");
                                    }
                                    let code = VarInt::from_u64(ErrorCode::Internal.code())
                                        .unwrap_or(VarInt::MAX);
                                    let _ = send.reset(code);
                                    return Written::Gone;
                                }
                            }
                        }
                        read
                    }
                }
            };
            match send.write_chunks(std::slice::from_mut(piece)) {
                Ok(w) if w.bytes > 0 => continue,
                Ok(_) | Err(WriteError::Blocked) => return Written::Blocked,
                Err(_) => return Written::Gone,
            }
        }
    }
}

/// `425 Too Early` (RFC 8470 §5.2) for a request that came in early data.
fn too_early(cx: &mut ConnCx<'_>) -> Outcome {
    cx.stats.bump(Counter::Http3TooEarly);
    Outcome::Respond(Response::text(
        425,
        "too early: send it again after the handshake\n",
    ))
}

enum Written {
    Done,
    Blocked,
    Gone,
}

fn quic_id(stream: u64) -> StreamId {
    StreamId::from(VarInt::from_u64(stream).unwrap_or(VarInt::MAX))
}
