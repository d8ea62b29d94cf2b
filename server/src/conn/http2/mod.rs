//! The HTTP/2 protocol of a connection: plaintext in (its read buffer), the sans-IO session
//! of `tern-http2` turns it into requests, exchanges run as for HTTP/1.1, and answers go out
//! as HEADERS and DATA frames in the connection's [`Output`]. Here live what the session does
//! not know: the frames in and their events, dispatch, answers (`respond`), pending replies,
//! timeouts and closing. Beside it, as `impl Http2` blocks of their own: `send.rs`, which
//! answers are waiting for window, their order (RFC 9218 urgency, then incremental
//! round-robin) and the DATA frames (`pump`), and when a connection counts as stalled;
//! `relays.rs`, the HTTP/2 side of relayed answers (its relay slots, one per stream, each
//! answer held by the sink HTTP/3 shares, `conn/relay/held.rs`; request bodies fed to them,
//! HEADERS and DATA as flow control allows, RST_STREAM when one breaks).
//!
//! The types the connection holds are defined here with it, their code in those files: they
//! import from here, never the other way (`server/tests/layers.rs` forbids a cycle).

mod relays;
mod send;

use std::cell::Cell;

use bytes::Bytes;
use tern_codec::Method;
use tern_http2::{Config, ErrorCode, Event, Priority, RequestData, Session};
use tern_runtime::{ratelog, BufPool, ReadBuf};

use super::close::{self, CloseKind, Linger, Next};
use super::output::Output;
use super::relay::{body_choice, BodyChoice, BodyFollows, HeldAnswer, Relay, RelayStart, Relays};
use super::types::{Link, Timeout};
use crate::access_log::{LogEntry, SavedEntry};
use crate::exchange::{self, Awaiting, ConnCx, Facts, Outcome};
use crate::handler::ExchangeId;
use crate::head_memo::{HeadMemo, HeadParts};
use crate::response::{header_fields, status_has_no_body, Body, FileBody, Response};
use crate::stats::{Counter, Tally};

/// Body bytes queued ahead of the socket: enough to keep a TLS batch full, little enough that
/// a late urgent answer is not stuck behind a queue.
const PUMP_TARGET: usize = 128 * 1024;
/// Above this much unsent output, stop reading (h2o's soft limit): control-frame floods and
/// readers that never read cannot grow our memory.
const READ_HIGH_WATER: usize = 512 * 1024;
/// How long a connection with nothing in flight keeps its busy-time buffers.
const TRIM_AFTER_MS: u64 = 1_000;

/// The rest of an answer's body, waiting for flow-control window.
struct Sending {
    stream: u32,
    body: Remaining,
    priority: Priority,
}

enum Remaining {
    Memory(Bytes),
    File {
        body: FileBody,
    },
    /// A proxied answer: its bytes come from the stream's relay as the upstream sends them.
    Relay,
}

/// A stream relayed to an upstream server, and its answer as the relay produced it: sent as
/// HEADERS, then DATA as windows allow.
struct RelayedStream {
    id: u32,
    relay: Box<Relay>,
    answer: HeldAnswer,
}

pub(crate) struct Http2 {
    session: Session,
    rbuf: Option<ReadBuf>,
    sending: Vec<Sending>,
    /// Streams whose handler deferred its reply.
    awaiting: Awaiting,
    /// Streams relayed to an upstream server (`conn/relay/`), until their answer is sent
    /// and their upstream connection released.
    relays: Vec<RelayedStream>,
    /// The stream served last among incremental ones (round-robin position).
    last_served: u32,
    /// Close once the output is sent (connection error, timeout, Drop).
    closing: bool,
    /// Close at once rather than lingering.
    abort: bool,
    peer_eof: bool,
    /// When the bytes of an incomplete frame (or the preface) started to arrive.
    partial_since_ms: Option<u64>,
    lingering: Option<Linger>,
    head_memo: Box<HeadMemo>,
    /// Memory for busy times was given back since the last request (see [`Http2::trim`]).
    trimmed: bool,
    /// Since when the client has been owed bytes without DATA going out (see [`Stall`]).
    stall: Cell<Stall>,
    /// Over TLS, the payload of a DATA frame of a file: one frame then fills one TLS record,
    /// and its bytes are read by the transport straight into it. 0 in plain TCP, where a
    /// frame is read next to its header in memory so one write carries many frames.
    file_frame: u16,
}

/// An HTTP/2 connection that owes its client bytes (answers waiting for window, or output
/// the socket has not taken) is stalled until DATA goes out again. The write timeout runs from
/// the stall's start, and only DATA restarts it (`STALL_PROGRESS` bytes of it): frames a client
/// reads while it keeps its windows shut (PING and SETTINGS ACKs) are not progress, and
/// whatever moves the connection otherwise (its PINGs, an upstream's bytes) does not move the
/// deadline. Kept in a `Cell`: `next_deadline` is where the connection's state is looked at
/// after every turn, so that is where a stall is seen to start or end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Stall {
    since_ms: Option<u64>,
    /// DATA bytes queued since `since_ms`.
    data: usize,
}

impl Http2 {
    /// A new HTTP/2 connection; `rbuf` holds what was already read (on a plain port, the
    /// preface and maybe more). Our SETTINGS go out first.
    pub fn new(
        rbuf: Option<ReadBuf>,
        file_frame: u16,
        out: &mut Output,
        cx: &mut ConnCx<'_>,
    ) -> Http2 {
        cx.stats.bump(Counter::Http2Connections);
        let limits = &cx.config.limits;
        let cfg = Config {
            max_header_list: limits.max_head as u32,
            max_body: limits.max_body,
            extended_connect: cx.config.http2_websocket,
            ..Config::default()
        };
        let buf = out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        let session = Session::new(cfg, buf);
        out.commit(before);
        Http2 {
            session,
            rbuf,
            sending: Vec::new(),
            awaiting: Awaiting::default(),
            relays: Vec::new(),
            last_served: 0,
            closing: false,
            abort: false,
            peer_eof: false,
            partial_since_ms: Some(cx.clock.now_ms()),
            lingering: None,
            head_memo: Box::default(),
            trimmed: false,
            stall: Cell::default(),
            file_frame,
        }
    }

    /// Where plaintext goes: the read buffer's free tail, grown to hold a whole frame.
    pub fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8] {
        let rbuf = self.rbuf.get_or_insert_with(|| cx.buffers.take_read());
        if self.lingering.is_some() {
            rbuf.consume(rbuf.len());
        } else if rbuf.spare_mut().is_empty() {
            let need = self.session.frame_len(rbuf.data()).unwrap_or(0);
            rbuf.grow_to(need.max(rbuf.capacity()) + tern_http2::frame::HEADER_LEN);
        }
        rbuf.spare_mut()
    }

    pub fn filled(&mut self, n: usize, now_ms: u64) {
        if let Some(linger) = &mut self.lingering {
            if !linger.discard(n) {
                self.abort = true;
            }
            return;
        }
        if let Some(rbuf) = self.rbuf.as_mut() {
            rbuf.filled(n);
        }
        if self.partial_since_ms.is_none() {
            self.partial_since_ms = Some(now_ms);
        }
    }

    pub fn handle_eof(&mut self, cx: &ConnCx<'_>) {
        self.peer_eof = true;
        if self.lingering.is_some() {
            self.abort = true;
        }
        self.drop_starved(cx);
    }

    pub fn is_lingering(&self) -> bool {
        self.lingering.is_some()
    }

    pub fn is_idle(&self) -> bool {
        self.session.open_streams() == 0
            && self.sending.is_empty()
            && self.relays.is_empty()
            && self.rbuf.as_ref().is_none_or(|b| b.is_empty())
    }

    /// True if the protocol would take more plaintext now.
    pub fn wants_input(&self, out: &Output) -> bool {
        !self.closing && self.lingering.is_none() && out.pending() < READ_HIGH_WATER
    }

    /// Runs the session on the buffered input, answers what it can, and queues DATA.
    pub fn process_input(&mut self, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        if let Some(mut rbuf) = self.rbuf.take() {
            if self.wants_input(out) && !rbuf.is_empty() {
                let buf = out.head_buf(|| cx.buffers.take_write());
                let before = buf.len();
                self.session.set_time(cx.clock.now_ms());
                let result = self.session.recv(rbuf.data(), buf);
                out.commit(before);
                let now = cx.clock.now_ms();
                match result {
                    Ok(0) => {
                        // Still the same incomplete frame: its clock keeps running (a peer
                        // dribbling one frame byte by byte is a slow head).
                        self.partial_since_ms.get_or_insert(now);
                    }
                    Ok(n) => {
                        rbuf.consume(n);
                        if self.session.is_mid_head() {
                            // A header block split over CONTINUATIONs is one head: its clock
                            // runs from its first frame, whatever the frames in between.
                            self.partial_since_ms.get_or_insert(now);
                        } else {
                            // Progress: a partial frame left over starts its own clock.
                            self.partial_since_ms = (!rbuf.is_empty()).then_some(now);
                        }
                    }
                    Err(e) => {
                        rbuf.consume(rbuf.len());
                        // Nothing more is answered after our GOAWAY with an error.
                        self.sending.clear();
                        self.awaiting.clear();
                        self.abandon_all(cx);
                        let counter = if e.code == ErrorCode::EnhanceYourCalm {
                            Counter::Http2Floods
                        } else {
                            Counter::Http2ConnectionErrors
                        };
                        cx.stats.bump(counter);
                        if ratelog::admit(counter.name(), cx.clock.now_ms()) {
                            tracing::info!(peer = %link.peer, code = e.code.name(), "HTTP/2 connection error: {}", e.reason);
                        }
                        self.closing = true;
                    }
                }
            }
            self.rbuf = Some(rbuf);
        }
        while let Some(event) = self.session.poll_event() {
            self.on_event(event, out, link, cx);
        }
        self.feed_relays(out, cx);
        self.pump(out, cx);
    }

    fn on_event(&mut self, event: Event, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        match event {
            Event::Request(id) => {
                if let Some(data) = self.session.take_request(id) {
                    self.dispatch(data, false, out, link, cx);
                }
            }
            Event::Head(id) => self.take_body(id, out, link, cx),
            Event::Body(id) if self.session.is_undecided(id) => self.take_body(id, out, link, cx),
            Event::Body(_) => self.feed_relays(out, cx),
            Event::Refuse { stream, status } => {
                let e = if status == 413 {
                    tern_codec::RequestError::BodyTooLarge
                } else {
                    tern_codec::RequestError::HeadTooLarge
                };
                cx.stats.bump(Counter::Requests);
                cx.stats.bad_request(e);
                let entry = LogEntry::bare(link.peer, cx.clock.now_us());
                let facts = Facts::own_answer(ExchangeId(u64::from(stream)), cx.clock.now_us());
                self.respond(
                    stream,
                    Response::text(e.status(), e.message()),
                    facts,
                    out,
                    link,
                    cx,
                    Some(&entry),
                );
            }
            Event::Reset(id) => {
                self.sending.retain(|s| s.stream != id);
                self.awaiting.forget(ExchangeId(u64::from(id)));
                if let Some(r) = self.relays.iter_mut().find(|r| r.id == id) {
                    r.abandon(cx.stats);
                }
            }
            Event::Reprioritize(id) => {
                let p = self.session.priority(id);
                for s in self.sending.iter_mut().filter(|s| s.stream == id) {
                    s.priority = p;
                }
            }
            Event::StreamError(reason) => {
                cx.stats.bump(Counter::Http2StreamErrors);
                if ratelog::admit("http2_stream_error", cx.clock.now_ms()) {
                    tracing::info!(peer = %link.peer, "HTTP/2 stream error: {reason}");
                }
            }
        }
    }

    /// Chooses how the body of a request whose HEADERS came without END_STREAM is taken, once
    /// that is known, by the rule HTTP/3 shares (`conn/relay/held.rs`, `body_choice`): a
    /// route that streams bodies (the proxy, FastCGI) gets the request as soon as its body
    /// declares a length or begins, and the body as it comes; any other gets it whole, later.
    /// A stream that ends with no body (an empty DATA frame or trailers with END_STREAM) is a
    /// request without one, not a chunked upload of nothing. Until one of those shows, the
    /// stream waits undecided in the session, which raises `Event::Body` when it does: no list
    /// of its own here, so a reset stream leaves nothing behind, and the streams waiting are
    /// bounded by the concurrent-stream limit (100), each holding its head and no body byte.
    /// The body timeout runs for them as for any body awaited (`Session::body_progress`). A
    /// tunnel (extended CONNECT) is answered at its head whatever its route: its DATA comes
    /// only once it is open.
    fn take_body(&mut self, id: u32, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        let (Some(data), Some((body, ended))) =
            (self.session.peek_request(id), self.session.body_chunk(id))
        else {
            return;
        };
        let choice = if data.fields.protocol().is_some() {
            BodyChoice::Stream
        } else {
            body_choice(data, body, ended, cx)
        };
        if choice == BodyChoice::Wait {
            return;
        }
        let buf = out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        let data = if choice == BodyChoice::Stream {
            self.session.stream_body(id, buf)
        } else {
            self.session.gather_body(id, buf);
            None
        };
        out.commit(before);
        if let Some(data) = data {
            self.dispatch(data, true, out, link, cx);
        }
    }

    /// Runs the exchange of a request; `streamed`: its body is still coming (a streaming
    /// route), to be fed to its relay.
    fn dispatch(
        &mut self,
        data: RequestData,
        streamed: bool,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) {
        cx.stats.bump(Counter::Requests);
        self.trimmed = false;
        let id = data.stream;
        // The field list on the stack for the usual request, on the heap for a long one.
        let mut few = [httparse::EMPTY_HEADER; 24];
        let mut many;
        let slots: &mut [httparse::Header<'_>] = if data.fields.field_count() <= few.len() {
            &mut few
        } else {
            many = vec![httparse::EMPTY_HEADER; data.fields.field_count()];
            &mut many
        };
        let mut facts = Facts {
            id: ExchangeId(u64::from(id)),
            head_only: false,
            keep_alive: true,
            http10: false,
            tally: Tally::starting(cx.clock.now_us()),
        };
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
        // An extended CONNECT (RFC 8441): a tunnel only a proxy route's WebSocket gives.
        let tunnel = data.fields.protocol().is_some();
        // The entry borrows the request's buffers: they go back to the session only after the
        // answer.
        let mut entry = None;
        let outcome = match data.head(slots, &limits) {
            Err(e) => {
                cx.stats.bad_request(e);
                if ratelog::admit(e.name(), cx.clock.now_ms()) {
                    let cause = e.message().trim_end();
                    tracing::info!(peer = %link.peer, status = e.status(), "bad HTTP/2 request: {cause}");
                }
                Outcome::Respond(Response::text(e.status(), e.message()))
            }
            Ok(head) => {
                facts.head_only = head.method == Method::Head;
                exchange::dispatch(&head, &data.body, link, &mut facts, &mut entry, cx)
            }
        };
        if cx.stopping || cx.near_limit {
            // As HTTP/1.1 stops keep-alive there: this connection takes no new streams.
            self.go_away(out, cx);
        }
        if entry.is_none() && cx.access_log.is_some() {
            // A head the codec refused: answered without a request to name.
            entry = Some(LogEntry::bare(link.peer, cx.clock.now_us()));
        }
        let outcome = if tunnel {
            tunnel_outcome(outcome)
        } else {
            outcome
        };
        match outcome {
            Outcome::Respond(r) => self.respond(id, r, facts, out, link, cx, entry.as_ref()),
            Outcome::Deferred => {
                // The head's buffers go back now: the table keeps a copy of the line's
                // request part.
                self.awaiting.park(facts, entry.as_ref());
            }
            Outcome::Forward(mut fwd, compress, handback) => {
                // HTTP/2 has no Upgrade: a WebSocket is an extended CONNECT (`tunnel_outcome`
                // let only those through), relayed as an HTTP/1.1 handshake.
                fwd.upgrade &= tunnel;
                let start = RelayStart {
                    fwd,
                    compress,
                    head_only: facts.head_only,
                    handshake_is_ours: true,
                    body: &data.body,
                    // A tunnel's DATA is no body: it goes up as it is once the tunnel is open.
                    streamed: (streamed && !tunnel)
                        .then_some(BodyFollows::Raw(data.fields.content_length())),
                    log: entry.as_ref().and_then(SavedEntry::save),
                    tally: facts.tally,
                    conn: link.key,
                    exchange: facts.id,
                    handback,
                };
                self.start_relay(id, start, out, link, cx);
            }
            Outcome::Drop => {
                self.fail(
                    ErrorCode::EnhanceYourCalm,
                    "handler dropped the connection",
                    out,
                    cx,
                );
                self.abort = true;
            }
        }
        self.session.recycle(data);
    }

    /// A deferred reply arrived. False if its stream is gone (reset meanwhile) or unknown.
    pub fn complete(
        &mut self,
        id: ExchangeId,
        response: Response,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) -> bool {
        if self.closing || self.lingering.is_some() || self.session.is_closed() {
            return false;
        }
        let Some(waiting) = self.awaiting.take(id) else {
            return false;
        };
        let entry = waiting.log.as_ref().map(|s| s.entry());
        // Stream ids are 31 bits: every id parked here came from one.
        let stream = u32::try_from(id.0).expect("an HTTP/2 stream id");
        self.respond(
            stream,
            response,
            waiting.facts,
            out,
            link,
            cx,
            entry.as_ref(),
        );
        self.pump(out, cx);
        true
    }

    /// Queues the answer of stream `id` (`facts`: whether it asked for the head only, and
    /// what its answer is counted under); with an access log, records its line (`entry`: the
    /// request's part).
    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        id: u32,
        response: Response,
        facts: Facts,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
        entry: Option<&LogEntry<'_>>,
    ) {
        let (head_only, tally) = (facts.head_only, facts.tally);
        cx.answered(response.status, tally);
        let no_body = status_has_no_body(response.status);
        let len = response.body.len();
        let end_stream = no_body || head_only || len == 0;
        if let (Some(log), Some(entry)) = (cx.access_log.as_deref_mut(), entry) {
            let body_bytes = if end_stream { 0 } else { len };
            log.record(entry, response.status, body_bytes, cx.clock);
        }
        let date = cx.clock.date_value();
        let mut length = itoa::Buffer::new();
        let length = length.format(len).as_bytes();
        let secure = link.secure_lines(cx).unwrap_or_default();
        let parts = HeadParts {
            status: response.status,
            no_body,
            date,
            length,
            headers: response.headers(),
            secure,
        };
        let buf = out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        // A block that changed nothing in the HPACK table can be sent again while the table
        // stays as it is.
        let generation = self.session.encoder_generation();
        if let Some(block) = self.head_memo.lookup(generation, &parts) {
            self.session.response_block(id, block, end_stream, buf);
        } else {
            let mut h = self.session.response(id, response.status, buf);
            h.field(b"date", date);
            h.field(b"server", b"tern");
            if !no_body {
                h.field(b"content-length", length);
            }
            for (name, value) in header_fields(response.headers()).chain(header_fields(secure)) {
                h.field(name, value);
            }
            let block = h.finish(end_stream);
            match block {
                Some(range) if self.session.encoder_generation() == generation => {
                    self.head_memo.remember(generation, &buf[range])
                }
                _ => self.head_memo.forget(),
            }
        }
        out.commit(before);
        if response.close {
            // What HTTP/1.1 would end with `Connection: close`: no new streams.
            self.go_away(out, cx);
        }
        if end_stream {
            return;
        }
        // The usual case: nothing queued before it and the window takes the whole body, so
        // it goes out at once, right behind its head.
        if self.sending.is_empty()
            && out.pending() < PUMP_TARGET
            && len <= self.session.send_capacity(id) as u64
        {
            let header = self.session.data_frame(id, len as usize, true);
            out.push_copy(&header);
            out.push_body(response.body);
            self.data_sent(len as usize);
            let buf = out.head_buf(|| cx.buffers.take_write());
            let before = buf.len();
            self.session.answer_sent(id, buf);
            out.commit(before);
            return;
        }
        let body = match response.body {
            Body::Empty => return,
            Body::Static(b) => Remaining::Memory(Bytes::from_static(b)),
            Body::Owned(b) => Remaining::Memory(Bytes::from(b)),
            Body::Shared(b) => Remaining::Memory(b),
            Body::File(f) => Remaining::File { body: f },
        };
        let priority = self.session.priority(id);
        self.sending.push(Sending {
            stream: id,
            body,
            priority,
        });
    }

    /// What to do once the output is sent.
    pub fn next(&self) -> Next {
        if self.abort {
            return Next::Close;
        }
        if self.lingering.is_some() {
            return Next::Read;
        }
        if self.closing || self.session.is_closed() {
            return Next::Close;
        }
        let busy = !self.awaiting.is_empty() || !self.sending.is_empty() || !self.relays.is_empty();
        if self.session.is_finished() && !busy {
            return Next::Close;
        }
        if self.peer_eof {
            // Nothing more can arrive; answers still owed are waited for.
            return if self.awaiting.is_empty() && self.relays.is_empty() {
                Next::Close
            } else {
                Next::Wait
            };
        }
        Next::Read
    }

    /// Always a lingering close unless aborted or the peer is gone: an HTTP/2 peer may send
    /// control frames (PING, WINDOW_UPDATE, its own GOAWAY) at any time, and closing with
    /// them unread would reset the connection before our last frames are read.
    pub fn close_kind(&self) -> CloseKind {
        close::close_kind(self.abort, self.peer_eof, true)
    }

    pub fn start_lingering(&mut self, now_ms: u64) {
        if let Some(b) = self.rbuf.as_mut() {
            b.consume(b.len());
        }
        self.closing = false;
        self.lingering = Some(Linger::start(now_ms));
    }

    pub fn abort(&mut self) {
        self.closing = true;
        self.abort = true;
    }

    /// Sends GOAWAY(NO_ERROR): streams already started are answered, then the connection
    /// closes.
    fn go_away(&mut self, out: &mut Output, cx: &mut ConnCx<'_>) {
        let buf = out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        self.session.go_away(buf);
        out.commit(before);
    }

    fn fail(
        &mut self,
        code: ErrorCode,
        reason: &'static str,
        out: &mut Output,
        cx: &mut ConnCx<'_>,
    ) {
        let buf = out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        self.session.abort(code, reason, buf);
        out.commit(before);
        self.sending.clear();
        self.awaiting.clear();
        self.abandon_all(cx);
        self.closing = true;
    }

    /// Shutdown began: GOAWAY, then close once the streams already started are answered.
    /// True if the connection can be closed at once.
    pub fn begin_drain(&mut self, out: &mut Output, cx: &mut ConnCx<'_>) -> bool {
        if self.is_lingering() {
            return true;
        }
        self.go_away(out, cx);
        false
    }

    pub fn next_deadline(&self, out_waiting: bool, cx: &ConnCx<'_>) -> (u64, Timeout) {
        let now = cx.clock.now_ms();
        let cfg = cx.config;
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        if let Some(linger) = self.lingering {
            return (linger.until_ms, Timeout::Linger);
        }
        // An answer stalled by a window the peer never opens counts as not reading (a proxied
        // one only when it has bytes to send: else it waits for its upstream).
        let answers_waiting = self.sending.iter().any(|s| match s.body {
            Remaining::Relay => self.relay_has_output(s.stream),
            _ => true,
        });
        let stall = self
            .stalled_since(out_waiting || answers_waiting, now)
            .map(|since| (since + ms(cfg.write_timeout), Timeout::Stall));
        let relay = self
            .relays
            .iter()
            .map(|r| r.relay.deadline())
            .min()
            .filter(|&d| d != u64::MAX)
            .map(|d| (d, Timeout::Upstream));
        if let Some(stall) = stall {
            // While output is owed, a late head or body is not judged: the reading may have
            // stopped on our side (`READ_HIGH_WATER`).
            return relay.filter(|r| r.0 < stall.0).unwrap_or(stall);
        }
        let partial = self.rbuf.as_ref().map_or(&[][..], |b| b.data());
        let slow_body = self.session.partial_is_data(partial);
        let head = self
            .partial_since_ms
            .filter(|_| self.session.is_mid_head() || (!partial.is_empty() && !slow_body))
            .map(|t| (t + ms(cfg.header_timeout), Timeout::Header));
        // From the stream that has waited longest for its body (a partial DATA frame counts
        // as waiting from now), whatever the relays of other streams wait for: a stream
        // waiting undecided (`take_body`) or gathering its body is cut off in time even on a
        // connection whose other streams relay for long.
        let waiting_since = match (self.session.body_progress(), slow_body) {
            (Some(t), _) => Some(t),
            (None, true) => Some(now),
            (None, false) => None,
        };
        let body = waiting_since.map(|t| (t + ms(cfg.body_timeout), Timeout::Body));
        if let Some(first) = [relay, head.or(body)]
            .into_iter()
            .flatten()
            .min_by_key(|d| d.0)
        {
            return first;
        }
        if !self.is_quiet() {
            return (u64::MAX, Timeout::Idle);
        }
        if !self.trimmed {
            return (now + TRIM_AFTER_MS, Timeout::Trim);
        }
        (now + ms(cfg.idle_timeout), Timeout::Idle)
    }

    /// A timeout: GOAWAY (NO_ERROR when idle) and close.
    pub fn answer_timeout(&mut self, kind: Timeout, out: &mut Output, cx: &mut ConnCx<'_>) {
        match kind {
            Timeout::Idle => self.go_away(out, cx),
            Timeout::Linger => {}
            _ => {
                let reason = "timeout";
                self.fail(ErrorCode::NoError, reason, out, cx);
            }
        }
        self.closing = true;
    }

    pub fn release_idle_buffer(&mut self, pool: &mut BufPool) {
        if self.rbuf.as_ref().is_some_and(|b| b.is_empty()) {
            if let Some(b) = self.rbuf.take() {
                pool.give_read(b);
            }
        }
    }

    /// Idle for [`TRIM_AFTER_MS`]: give back what only a busy connection needs (stream slots,
    /// spare request buffers, queues), keeping what makes the next request fast (the HPACK
    /// tables and the response-head memo). Not at once: a busy client is idle between every
    /// two batches of requests, and freeing there would cost allocations on every batch.
    pub fn trim(&mut self) {
        self.sending = Vec::new();
        self.awaiting.release();
        self.relays = Vec::new();
        self.session.release_idle_memory();
        self.trimmed = true;
    }

    fn is_quiet(&self) -> bool {
        self.session.open_streams() == 0
            && self.awaiting.is_empty()
            && self.sending.is_empty()
            && self.relays.is_empty()
    }

    pub fn recycle(&mut self, pool: &mut BufPool) {
        if let Some(b) = self.rbuf.take() {
            pool.give_read(b);
        }
    }
}

/// What an extended CONNECT gets: the tunnel when its route relays it as a WebSocket (the
/// proxy's `Forward` with `upgrade`), the answer when its route refused it (a guard's 401 or
/// redirect, a 404, a 405), and 501 otherwise. A 2xx would tell the client its tunnel is
/// open (RFC 8441 §5), so a static file, a fixed answer, a FastCGI script or a deferred
/// reply must not get through; 501 rather than 405 because what is missing is tern's support
/// for tunnels on such routes, not a method of the resource (405 would need an `Allow` the
/// route cannot honestly give for a WebSocket).
fn tunnel_outcome(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Forward(fwd, compress, handback) if fwd.upgrade => {
            Outcome::Forward(fwd, compress, handback)
        }
        Outcome::Respond(r) if !(200..300).contains(&r.status) => Outcome::Respond(r),
        Outcome::Drop => Outcome::Drop,
        _ => Outcome::Respond(Response::text(
            501,
            "WebSocket over HTTP/2 is served only by proxy routes\n",
        )),
    }
}
