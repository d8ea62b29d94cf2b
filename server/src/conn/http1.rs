//! The HTTP/1.1 protocol of a connection: plaintext bytes in (its read buffer), exchanges run,
//! answers written into the connection's [`Output`]. Keep-alive, pipelining (answers in
//! order, one at a time while a reply is pending), `100 Continue`, bad-input answers and the
//! lingering close after them live here, and so does the framing of a relayed answer (its
//! [`Sink`]: chunking, `Connection`, 1xx, the 101 tunnel). It knows nothing of sockets or TLS.

use std::mem::MaybeUninit;

use tern_codec::{
    parse_request, BodyDecoder, BodyKind, ConnectionHeader, FirstLine, Method, Parsed,
    RequestError, RequestHead, ResponseHead, Version, CONTINUE_100, MAX_HEADERS_DEFAULT,
};
use tern_runtime::{ratelog, BufPool, ReadBuf};

use super::close::{self, CloseKind, Linger, Next};
use super::output::Output;
use super::relay::{self, BodyFollows, Relay, Relays};
use super::types::{Link, Timeout};
use super::upstream_wire::chunk_size_line;
use crate::access_log::{LogEntry, SavedEntry};
use crate::exchange::{self, Awaiting, ConnCx, Facts, Outcome, Sink};
use crate::handler::ExchangeId;
use crate::response::{status_has_no_body, Response};
use crate::stats::{Counter, Tally};

/// Above this much unsent output, stop answering pipelined requests until the client reads.
pub(crate) const OUTPUT_HIGH_WATER: usize = 256 * 1024;

#[derive(Default)]
enum State {
    /// Waiting for (more of) a request head.
    #[default]
    Head,
    /// The head arrived, the body is still coming in.
    Body(Box<BodyState>),
    /// A handler deferred its reply; nothing else is processed until it arrives. (The
    /// table holds one exchange: answers go out in order. Kept in the state, not beside it,
    /// so that an idle connection does not carry it.)
    Awaiting(Awaiting),
    /// We answered and half-closed; reading and discarding until the client closes.
    Lingering(Linger),
    /// The exchange is relayed to an upstream server (`conn/relay/`).
    Relay(Box<Relayed>),
}

struct BodyState {
    /// The head, copied out of the read buffer so the body can stream through it.
    head: Vec<u8>,
    decoder: BodyDecoder,
    body: Vec<u8>,
}

/// An exchange relayed to an upstream server, and how its answer is framed for this client.
struct Relayed {
    relay: Relay,
    framing: Framing,
}

impl Relayed {
    /// The relay, and the sink it writes the answer through.
    fn parts<'a>(&'a mut self, out: &'a mut Output, link: &'a Link) -> (&'a mut Relay, H1Sink<'a>) {
        let sink = H1Sink {
            framing: &mut self.framing,
            out,
            link,
        };
        (&mut self.relay, sink)
    }

    /// The client's connection cannot take another exchange after this one.
    fn closes_client(&self) -> bool {
        self.relay.closes_client() || self.framing.close || !self.framing.facts.keep_alive
    }
}

/// HTTP/1.1's state for an answer that comes in pieces (a relayed one).
struct Framing {
    facts: Facts,
    /// The body goes out chunked.
    chunked: bool,
    /// The connection closes after this answer.
    close: bool,
}

/// What a relay writes its answer through: HTTP/1.1 bytes in the connection's output.
pub(crate) struct H1Sink<'a> {
    framing: &'a mut Framing,
    out: &'a mut Output,
    link: &'a Link,
}

impl Sink for H1Sink<'_> {
    fn room(&self) -> usize {
        if self.out.pending() < OUTPUT_HIGH_WATER {
            usize::MAX
        } else {
            0
        }
    }

    fn head(
        &mut self,
        mut r: Response,
        len: Option<u64>,
        body: bool,
        close: bool,
        cx: &mut ConnCx<'_>,
    ) {
        let f = &mut *self.framing;
        let unsized_body = body && len.is_none();
        // An HTTP/1.0 client learns where an unsized body ends only by the close.
        f.close |= close || (unsized_body && f.facts.http10);
        let keep = f.facts.keep_alive && !f.close && !cx.stopping;
        f.close |= !keep;
        f.chunked = unsized_body && !f.facts.http10;
        if let Some(line) = self.link.secure_lines(cx) {
            r.push_raw_headers(line);
        }
        let head = ResponseHead {
            status: r.status,
            date_line: cx.clock.date_line(),
            headers: r.headers(),
            content_length: len,
            chunked: f.chunked,
            connection: ConnectionHeader::for_answer(keep, f.facts.http10),
        };
        write_head(self.out, &head, cx);
    }

    fn interim(&mut self, r: &Response, cx: &mut ConnCx<'_>) {
        // HTTP/1.0 has no interim answers.
        if self.framing.facts.http10 {
            return;
        }
        let buf = self.out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        buf.extend_from_slice(b"HTTP/1.1 ");
        buf.extend_from_slice(itoa::Buffer::new().format(r.status).as_bytes());
        buf.push(b' ');
        buf.extend_from_slice(tern_codec::reason_phrase(r.status).as_bytes());
        buf.extend_from_slice(b"\r\n");
        buf.extend_from_slice(r.headers());
        buf.extend_from_slice(b"\r\n");
        self.out.commit(before);
    }

    fn tunnel(&mut self, mut r: Response, upgrade: Option<&[u8]>, cx: &mut ConnCx<'_>) -> u16 {
        r.status = 101;
        r.push_header("Connection", b"upgrade");
        if let Some(protocol) = upgrade {
            r.push_header("Upgrade", protocol);
        }
        let head = ResponseHead {
            status: 101,
            date_line: cx.clock.date_line(),
            headers: r.headers(),
            content_length: None,
            chunked: false,
            connection: ConnectionHeader::Persistent,
        };
        write_head(self.out, &head, cx);
        // After the tunnel the connection is not HTTP any more.
        self.framing.close = true;
        cx.stats.bump(Counter::WebsocketTunnelsOpenedHttp1);
        101
    }

    fn data(&mut self, bytes: &[u8], cx: &mut ConnCx<'_>) {
        self.out.head_buf(|| cx.buffers.take_write());
        if self.framing.chunked {
            self.out
                .push_copy(chunk_size_line(bytes.len(), &mut [0; 18]));
            self.out.push_copy(bytes);
            self.out.push_copy(b"\r\n");
        } else {
            self.out.push_copy(bytes);
        }
    }

    fn end(&mut self, cx: &mut ConnCx<'_>) {
        if self.framing.chunked {
            self.out.head_buf(|| cx.buffers.take_write());
            self.out.push_copy(b"0\r\n\r\n");
            self.framing.chunked = false;
        }
    }

    fn reset(&mut self) {
        // Whatever is queued goes out, then the connection closes: the client sees a short
        // body (or no last chunk), never a later answer mistaken for this one.
        self.framing.close = true;
    }

    fn whole(
        &mut self,
        r: Response,
        tally: Tally,
        close: bool,
        log: Option<Box<SavedEntry>>,
        cx: &mut ConnCx<'_>,
    ) {
        let f = &mut *self.framing;
        let facts = Facts {
            keep_alive: f.facts.keep_alive && !close,
            tally,
            ..f.facts
        };
        let entry = log.as_ref().map(|s| s.entry());
        f.close |= !write_answer(r, facts, self.out, self.link, cx, entry.as_ref());
    }
}

fn write_head(out: &mut Output, head: &ResponseHead<'_>, cx: &mut ConnCx<'_>) {
    let buf = out.head_buf(|| cx.buffers.take_write());
    let before = buf.len();
    head.write_to(buf);
    out.commit(before);
}

/// Writes a whole answer (head and body of any kind); with an access log, records its line
/// (`entry`: the request's part). False: the connection closes after it.
fn write_answer(
    mut response: Response,
    ex: Facts,
    out: &mut Output,
    link: &Link,
    cx: &mut ConnCx<'_>,
    entry: Option<&LogEntry<'_>>,
) -> bool {
    let keep = ex.keep_alive && !response.close && !cx.stopping;
    let connection = ConnectionHeader::for_answer(keep, ex.http10);
    if let Some(line) = link.secure_lines(cx) {
        response.push_raw_headers(line);
    }
    let no_body = status_has_no_body(response.status);
    let head = ResponseHead {
        status: response.status,
        date_line: cx.clock.date_line(),
        headers: response.headers(),
        content_length: (!no_body).then(|| response.body.len()),
        chunked: false,
        connection,
    };
    let buf = out.head_buf(|| cx.buffers.take_write());
    let before = buf.len();
    head.write_to(buf);
    out.commit(before);
    let status = response.status;
    let mut body_bytes = 0;
    if !ex.head_only && !no_body {
        body_bytes = response.body.len();
        out.push_body(response.body);
    }
    cx.answered(status, ex.tally);
    if let (Some(log), Some(entry)) = (cx.access_log.as_deref_mut(), entry) {
        log.record(entry, status, body_bytes, cx.clock);
    }
    keep
}

#[derive(Default)]
pub(crate) struct Http1 {
    rbuf: Option<ReadBuf>,
    state: State,
    /// No more requests: close once the output is flushed.
    closing: bool,
    /// Close by lingering (half-close, drain) rather than at once.
    linger_on_close: bool,
    /// Close at once, without an answer or lingering (a handler chose `Reply::Drop`).
    abort: bool,
    peer_eof: bool,
    /// What the wait for the next request head runs from.
    head_wait: HeadWait,
    /// Requests dispatched so far (the last one's exchange id).
    seq: u64,
}

/// Which timeout governs a connection between requests.
#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum HeadWait {
    /// No byte of a head yet: the idle timeout.
    #[default]
    Idle,
    /// The first byte of the current, incomplete head arrived at this time: the header timeout.
    StartedAt(u64),
    /// Shutting down, and no byte has arrived on this connection yet: its client may be about
    /// to send its first request, so it is not closed as idle but has until this time.
    FirstRequestBy(u64),
}

impl Http1 {
    /// Where plaintext input goes: the free tail of the read buffer (taken from the pool when
    /// needed). Empty when no input is wanted now.
    pub fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8] {
        let limit = cx.config.limits.max_head;
        let rbuf = self.rbuf.get_or_insert_with(|| cx.buffers.take_read());
        if let State::Lingering(_) = self.state {
            rbuf.consume(rbuf.len()); // discarded input
        } else if rbuf.spare_mut().is_empty() {
            // A partial head filled a standard buffer; heads may be up to the limit. (At the
            // limit the codec rejects it as too large on the next parse.)
            rbuf.grow_to(limit + 1);
        }
        rbuf.spare_mut()
    }

    /// The input of a connection that has answered nothing yet (to look for the HTTP/2
    /// preface).
    pub fn unanswered_start(&self) -> Option<&[u8]> {
        let fresh = self.seq == 0 && matches!(self.state, State::Head);
        self.rbuf
            .as_ref()
            .filter(|b| fresh && !b.is_empty())
            .map(|b| b.data())
    }

    /// Hands the read buffer (and what it holds) to the protocol taking over.
    pub fn take_read_buf(&mut self) -> Option<ReadBuf> {
        self.rbuf.take()
    }

    /// `n` bytes were placed in [`Self::recv_buf`].
    pub fn filled(&mut self, n: usize, now_ms: u64) {
        if let State::Lingering(linger) = &mut self.state {
            if !linger.discard(n) {
                self.abort = true;
            }
            return;
        }
        if let Some(rbuf) = self.rbuf.as_mut() {
            rbuf.filled(n);
        }
        self.mark_head_start(now_ms);
    }

    /// The transport saw the first bytes of what will be a request (for the TLS handshake:
    /// the header timeout covers it too).
    pub fn mark_head_start(&mut self, now_ms: u64) {
        if !matches!(self.head_wait, HeadWait::StartedAt(_)) && matches!(self.state, State::Head) {
            self.head_wait = HeadWait::StartedAt(now_ms);
        }
    }

    pub fn handle_eof(&mut self, _: &ConnCx<'_>) {
        self.peer_eof = true;
        if let State::Lingering(_) = self.state {
            self.abort = true;
        }
    }

    pub fn is_lingering(&self) -> bool {
        matches!(self.state, State::Lingering(_))
    }

    /// Between requests with nothing buffered (and not waiting for a first request at
    /// shutdown).
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Head)
            && self.rbuf.as_ref().is_none_or(|b| b.is_empty())
            && !matches!(self.head_wait, HeadWait::FirstRequestBy(_))
    }

    /// No byte of any request has arrived on this connection.
    fn never_read(&self) -> bool {
        self.seq == 0
            && matches!(self.state, State::Head)
            && self.head_wait == HeadWait::Idle
            && self.rbuf.as_ref().is_none_or(|b| b.is_empty())
    }

    /// True if the protocol would take more plaintext now.
    pub fn wants_input(&self, out: &Output) -> bool {
        !self.closing
            && out.pending() < OUTPUT_HIGH_WATER
            && match &self.state {
                State::Head | State::Body(_) => true,
                State::Relay(r) => r.relay.wants_input(),
                _ => false,
            }
    }

    /// An exchange is being relayed to an upstream server.
    pub fn in_relay(&self) -> bool {
        matches!(self.state, State::Relay(_))
    }

    /// Answers every complete request in the buffer (pipelining), in order.
    pub fn process_input(&mut self, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        let Some(mut rbuf) = self.rbuf.take() else {
            return;
        };
        while self.wants_input(out) && !rbuf.is_empty() {
            match &mut self.state {
                State::Head => {
                    let consumed = self.process_head(rbuf.data(), out, link, cx);
                    rbuf.consume(consumed);
                    if consumed == 0 {
                        break;
                    }
                    self.head_wait = match rbuf.is_empty() {
                        true => HeadWait::Idle,
                        false => HeadWait::StartedAt(cx.clock.now_ms()),
                    };
                }
                State::Body(body) => {
                    match feed_body(&mut body.decoder, rbuf.data(), &mut body.body) {
                        Err(e) => self.reject(e, out, link, cx),
                        Ok(used) => {
                            rbuf.consume(used);
                            if body.decoder.is_done() {
                                self.finish_body(out, link, cx);
                            }
                        }
                    }
                }
                State::Relay(r) => {
                    let (relay, mut sink) = r.parts(out, link);
                    let used = relay.client_input(rbuf.data(), &mut sink, cx);
                    rbuf.consume(used);
                    if used == 0 {
                        break;
                    }
                }
                State::Awaiting(_) | State::Lingering(_) => break,
            }
        }
        self.rbuf = Some(rbuf);
    }

    /// What to do once the output is sent.
    pub fn next(&self) -> Next {
        if self.closing || self.abort {
            return Next::Close;
        }
        match &self.state {
            State::Awaiting(_) => Next::Wait,
            State::Lingering(_) => Next::Read,
            // A client that went away while its body or a tunnel was still flowing is gone
            // for good; one that half-closed after its request still gets the answer.
            State::Relay(r) if r.relay.wants_input() => {
                if self.peer_eof {
                    Next::Close
                } else {
                    Next::Read
                }
            }
            State::Relay(_) => Next::Wait,
            _ if self.peer_eof => Next::Close, // whatever is buffered is an incomplete request
            _ => Next::Read,
        }
    }

    pub fn close_kind(&self) -> CloseKind {
        let unread = self.rbuf.as_ref().is_some_and(|b| !b.is_empty());
        close::close_kind(self.abort, self.peer_eof, self.linger_on_close || unread)
    }

    /// The write side was shut down: discard input for a moment, then close.
    pub fn start_lingering(&mut self, now_ms: u64) {
        if let Some(b) = self.rbuf.as_mut() {
            b.consume(b.len());
        }
        self.closing = false;
        self.state = State::Lingering(Linger::start(now_ms));
    }

    /// The TLS handshake failed (nothing was read as a request): close once its alert is
    /// sent, half-closing and lingering first, so that input still unread does not reset the
    /// connection before the client has read the alert.
    pub fn close_after_alert(&mut self) {
        self.closing = true;
        self.linger_on_close = true;
    }

    /// Close at once, no answer (the transport failed).
    pub fn abort(&mut self) {
        self.closing = true;
        self.abort = true;
    }

    /// Parses one head at the start of `data` and answers it if its body is here too.
    /// Returns the bytes consumed (0: need more input).
    fn process_head(
        &mut self,
        data: &[u8],
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) -> usize {
        let mut headers = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
        // The declared length is judged here rather than by the codec: a route that streams
        // bodies (the proxy) takes any length.
        let limits = &tern_codec::Limits {
            max_body: u64::MAX,
            ..cx.config.limits
        };
        let head = match parse_request(data, &mut headers, limits) {
            Ok(Parsed::Complete(head)) => head,
            Ok(Parsed::Partial) => return 0,
            // A connection's first line is judged whole (the verdict must not depend on how
            // the bytes were split): one naming no HTTP version at all, on a port that also
            // takes HTTP/2's preface, is closed without guessing which protocol to answer in.
            Err(RequestError::BadRequestLine) if self.seq == 0 => {
                match tern_codec::first_line(&data[..data.len().min(limits.max_head)]) {
                    FirstLine::Incomplete if data.len() < limits.max_head => return 0,
                    FirstLine::Foreign => {
                        let e = RequestError::BadRequestLine;
                        cx.stats.bad_request(e);
                        if ratelog::admit(e.name(), cx.clock.now_ms()) {
                            tracing::info!(peer = %link.peer, "bad request: no HTTP version; closed");
                        }
                        self.abort();
                        return 0;
                    }
                    _ => {
                        self.reject(RequestError::BadRequestLine, out, link, cx);
                        return 0;
                    }
                }
            }
            Err(e) => {
                self.reject(e, out, link, cx);
                return 0;
            }
        };
        cx.stats.bump(Counter::Requests);
        let head_len = head.head_len;
        let available = (data.len() - head_len) as u64;
        let max_body = cx.config.limits.max_body;
        if let BodyKind::Length(n) = head.body {
            if n > max_body && !exchange::streams_body(&head, cx) {
                self.reject(RequestError::BodyTooLarge, out, link, cx);
                return 0;
            }
        }
        match head.body {
            BodyKind::None => {
                self.dispatch(&head, &[], None, out, link, cx);
                head_len
            }
            BodyKind::Length(n) if available >= n => {
                let end = head_len + n as usize;
                self.dispatch(&head, &data[head_len..end], None, out, link, cx);
                end
            }
            kind if exchange::streams_body(&head, cx) => {
                // A route that streams bodies (the reverse proxy): answer from the head, the
                // body follows through the relay with bounded buffers, whatever its size.
                if head.expect_continue {
                    out.head_buf(|| cx.buffers.take_write());
                    out.push_copy(CONTINUE_100);
                }
                self.dispatch(&head, &[], Some(kind), out, link, cx);
                head_len
            }
            kind => {
                let mut decoder = BodyDecoder::new(kind, max_body);
                let mut body = Vec::new();
                let used = match feed_body(&mut decoder, &data[head_len..], &mut body) {
                    Ok(used) => used,
                    Err(e) => {
                        self.reject(e, out, link, cx);
                        return 0;
                    }
                };
                if decoder.is_done() {
                    self.dispatch(&head, &body, None, out, link, cx);
                } else {
                    if head.expect_continue {
                        out.head_buf(|| cx.buffers.take_write());
                        out.push_copy(CONTINUE_100);
                    }
                    let head = data[..head_len].to_vec();
                    self.state = State::Body(Box::new(BodyState {
                        head,
                        decoder,
                        body,
                    }));
                }
                head_len + used
            }
        }
    }

    /// The body is complete: parse the saved head again (cheap, and keeps the fast path
    /// zero-copy) and answer.
    fn finish_body(&mut self, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        let State::Body(saved) = std::mem::replace(&mut self.state, State::Head) else {
            return;
        };
        let mut headers = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
        match parse_request(&saved.head, &mut headers, &cx.config.limits) {
            Ok(Parsed::Complete(head)) => self.dispatch(&head, &saved.body, None, out, link, cx),
            _ => unreachable!("a head that parsed once parses again"),
        }
    }

    fn dispatch(
        &mut self,
        head: &RequestHead<'_>,
        body: &[u8],
        streamed: Option<BodyKind>,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) {
        self.seq += 1;
        let mut facts = Facts {
            id: ExchangeId(self.seq),
            head_only: head.method == Method::Head,
            keep_alive: head.keep_alive && !cx.stopping && !cx.near_limit && !self.peer_eof,
            http10: head.version == Version::Http10,
            tally: Tally::starting(cx.clock.now_us()),
        };
        let mut entry = None;
        let outcome = exchange::dispatch(head, body, link, &mut facts, &mut entry, cx);
        if streamed.is_some() && !matches!(outcome, Outcome::Forward(..)) {
            // Answered without reading the body that follows: the connection cannot go on.
            facts.keep_alive = false;
        }
        match outcome {
            Outcome::Respond(response) => {
                self.respond(response, facts, out, link, cx, entry.as_ref())
            }
            Outcome::Deferred => {
                let mut awaiting = Awaiting::default();
                awaiting.park(facts, entry.as_ref());
                self.state = State::Awaiting(awaiting);
            }
            Outcome::Forward(fwd, compress, handback) => {
                let start = relay::RelayStart {
                    fwd,
                    compress,
                    head_only: facts.head_only,
                    handshake_is_ours: false,
                    body,
                    streamed: streamed.map(BodyFollows::Framed),
                    log: entry.as_ref().and_then(SavedEntry::save),
                    tally: facts.tally,
                    conn: link.key,
                    exchange: facts.id,
                    handback,
                };
                let mut framing = Framing {
                    facts,
                    chunked: false,
                    close: false,
                };
                let mut sink = H1Sink {
                    framing: &mut framing,
                    out,
                    link,
                };
                let relay = Relay::start(start, &mut sink, cx);
                self.state = State::Relay(Box::new(Relayed { relay, framing }));
            }
            Outcome::Drop => self.abort(),
        }
    }

    /// A deferred reply arrived. False if it was stale (the request was already answered,
    /// e.g. the handler panicked after deferring).
    pub fn complete(
        &mut self,
        id: ExchangeId,
        response: Response,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) -> bool {
        let State::Awaiting(awaiting) = &mut self.state else {
            return false;
        };
        let Some(waiting) = awaiting.take(id) else {
            return false;
        };
        self.state = State::Head;
        let entry = waiting.log.as_ref().map(|s| s.entry());
        self.respond(response, waiting.facts, out, link, cx, entry.as_ref());
        true
    }

    /// Writes the answer; with an access log, records its line (`entry`: the request's part).
    fn respond(
        &mut self,
        response: Response,
        ex: Facts,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
        entry: Option<&LogEntry<'_>>,
    ) {
        if !write_answer(response, ex, out, link, cx, entry) {
            self.closing = true;
        }
    }

    /// Bad input: answer its precise status, count it, and close (lingering, since the
    /// client may still be sending).
    pub fn reject(&mut self, e: RequestError, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        cx.stats.bad_request(e);
        // Sampled: at most a few lines a second per cause (an outsider chooses how many).
        if ratelog::admit(e.name(), cx.clock.now_ms()) {
            let cause = e.message().trim_end();
            tracing::info!(peer = %link.peer, status = e.status(), "bad request: {cause}");
        }
        self.answer_and_close(Response::text(e.status(), e.message()), out, link, cx);
    }

    /// Sends one answer of the server's own (bad input, plain HTTP on the TLS port) and
    /// closes with a linger.
    pub fn answer_and_close(
        &mut self,
        response: Response,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) {
        self.state = State::Head;
        let ex = Facts::own_answer(ExchangeId(self.seq), cx.clock.now_us());
        let entry = LogEntry::bare(link.peer, cx.clock.now_us());
        self.respond(response, ex, out, link, cx, Some(&entry));
        self.linger_on_close = true;
    }

    /// Shutdown began: idle connections close now, busy ones after their current answer.
    /// Returns true if the connection can be closed immediately (`may_read`: the socket may
    /// hold an unread request; such a connection is driven once more instead, so the request
    /// is answered rather than reset).
    pub fn begin_drain(&mut self, out: &Output, may_read: bool, cx: &ConnCx<'_>) -> bool {
        if self.never_read() {
            // Closing it now would reset a request already on its way. A client that never
            // sends (a browser's preconnect) is closed silently at the deadline, as an idle one.
            let header_ms = cx.config.header_timeout.as_millis() as u64;
            self.head_wait = HeadWait::FirstRequestBy(cx.clock.now_ms() + header_ms);
            return false;
        }
        let idle = self.is_idle() && out.is_empty() && !may_read;
        if idle || self.is_lingering() {
            return true;
        }
        // Whatever is being answered now is the last answer on this connection.
        match &mut self.state {
            State::Awaiting(awaiting) => awaiting.end_keep_alive(),
            State::Relay(r) => r.framing.facts.keep_alive = false,
            _ => {}
        }
        false
    }

    /// The deadline the protocol's state calls for, and which timeout it is.
    pub fn next_deadline(&self, out_waiting: bool, cx: &ConnCx<'_>) -> (u64, Timeout) {
        let now = cx.clock.now_ms();
        let cfg = cx.config;
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        match &self.state {
            State::Lingering(linger) => (linger.until_ms, Timeout::Linger),
            // A relay's own deadline runs on while the client reads slowly (only the
            // upstream's progress moves it, and the upstream is read only as the client takes
            // the answer): a slow reader cannot hold the upstream connection past it.
            State::Relay(r) if out_waiting && r.relay.deadline() < now + ms(cfg.write_timeout) => {
                (r.relay.deadline(), Timeout::Upstream)
            }
            _ if out_waiting => (now + ms(cfg.write_timeout), Timeout::Write),
            State::Awaiting(_) => (u64::MAX, Timeout::Idle),
            // Held in a rate limit's queue: its turn comes first (its body is taken meanwhile,
            // bounded, as while a connection is awaited).
            State::Relay(r) if r.relay.is_waiting() => (r.relay.deadline(), Timeout::Upstream),
            // The client's body is awaited: its own timeout; else the upstream's.
            State::Relay(r) if r.relay.wants_input() && !r.relay.is_tunnel() => {
                (now + ms(cfg.body_timeout), Timeout::Body)
            }
            State::Relay(r) => (r.relay.deadline(), Timeout::Upstream),
            State::Body(_) => (now + ms(cfg.body_timeout), Timeout::Body),
            State::Head => match self.head_wait {
                HeadWait::StartedAt(t) => (t + ms(cfg.header_timeout), Timeout::Header),
                HeadWait::FirstRequestBy(by) => (by, Timeout::Idle),
                HeadWait::Idle => (now + ms(cfg.idle_timeout), Timeout::Idle),
            },
        }
    }

    /// A slow head or body gets a best-effort 408 (the connection closes right after).
    pub fn answer_timeout(
        &mut self,
        kind: Timeout,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) {
        if matches!(kind, Timeout::Header | Timeout::Body) && out.is_empty() {
            let ex = Facts::own_answer(ExchangeId(self.seq), cx.clock.now_us());
            let entry = LogEntry::bare(link.peer, cx.clock.now_us());
            let response = Response::text(408, "request timeout\n");
            self.respond(response, ex, out, link, cx, Some(&entry));
        }
    }

    /// Idle connections hold no read buffer: give it back to the worker's pool.
    pub fn release_idle_buffer(&mut self, pool: &mut BufPool) {
        if self.rbuf.as_ref().is_some_and(|b| b.is_empty()) {
            if let Some(b) = self.rbuf.take() {
                pool.give_read(b);
            }
        }
    }

    pub fn recycle(&mut self, pool: &mut BufPool) {
        if let Some(b) = self.rbuf.take() {
            pool.give_read(b);
        }
    }
}

/// One relay slot: the exchange in progress, while it is relayed (the driver's calls on it are
/// in `conn/relays.rs`).
impl Relays for Http1 {
    type Sink<'a> = H1Sink<'a>;

    fn count(&self) -> usize {
        usize::from(self.in_relay())
    }

    fn id(&self, _: usize) -> ExchangeId {
        self.relayed().framing.facts.id
    }

    fn relay(&self, _: usize) -> &Relay {
        &self.relayed().relay
    }

    fn relay_mut(&mut self, _: usize) -> &mut Relay {
        &mut self.relayed_mut().relay
    }

    fn parts<'a>(
        &'a mut self,
        _: usize,
        out: &'a mut Output,
        link: &'a Link,
    ) -> (&'a mut Relay, H1Sink<'a>) {
        self.relayed_mut().parts(out, link)
    }

    fn one_exchange(&self) -> bool {
        true
    }

    fn flush(&mut self, _: bool, _: &mut Output, _: &Link, _: &mut ConnCx<'_>) {
        // The sink wrote the answer into the output as it came.
    }

    /// Unless another try follows, the exchange is over and the next request may be read.
    fn released(&mut self, _: usize, over: bool) {
        if !over {
            return;
        }
        let close = self.relayed().closes_client();
        self.state = State::Head;
        if close {
            self.closing = true;
        }
    }

    fn abandon_all(&mut self, cx: &ConnCx<'_>) {
        if let State::Relay(r) = &mut self.state {
            r.relay.abandon(cx.stats);
        }
    }
}

impl Http1 {
    fn relayed(&self) -> &Relayed {
        match &self.state {
            State::Relay(r) => r,
            _ => unreachable!("an HTTP/1.1 relay slot while not relaying"),
        }
    }

    fn relayed_mut(&mut self) -> &mut Relayed {
        match &mut self.state {
            State::Relay(r) => r,
            _ => unreachable!("an HTTP/1.1 relay slot while not relaying"),
        }
    }
}

/// Feeds `input` to the decoder, appending payload to `body`; returns bytes consumed.
fn feed_body(
    decoder: &mut BodyDecoder,
    input: &[u8],
    body: &mut Vec<u8>,
) -> Result<usize, RequestError> {
    let mut used = 0;
    while used < input.len() && !decoder.is_done() {
        let step = decoder.decode(&input[used..])?;
        body.extend_from_slice(step.data);
        used += step.consumed;
        if step.consumed == 0 {
            break;
        }
    }
    Ok(used)
}
