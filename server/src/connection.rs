use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use mio::net::TcpStream;
use tern_codec::{
    parse_request, BodyDecoder, BodyKind, ConnectionHeader, Method, Parsed, RequestError,
    RequestHead, ResponseHead, Version, CONTINUE_100, MAX_HEADERS_DEFAULT,
};
use tern_runtime::{ratelog, BufPool, Clock, InboxSender, ReadBuf};

use crate::handler::{HandlerContext, Reply, Request, WorkerMessage};
use crate::output::{Flush, Output};
use crate::response::{status_has_no_body, Response};
use crate::router::RouteMatch;
use crate::stats::{Counter, WorkerStats};
use crate::worker::Shared;
use crate::ServerConfig;

/// Above this much unsent output, stop answering pipelined requests until the client reads.
const OUTPUT_HIGH_WATER: usize = 256 * 1024;
/// After an error answer, how long to keep reading (and discarding) so that closing with
/// unread input does not reset the connection before the client has read our answer.
const LINGER_MS: u64 = 2_000;
const LINGER_MAX_BYTES: usize = 256 * 1024;

/// Borrowed worker state a connection needs while it runs.
pub(crate) struct ConnCx<'a> {
    pub shared: &'a Shared,
    /// The worker's settings in force (timeouts, limits; changed by reloads between turns).
    pub config: &'a ServerConfig,
    pub stats: &'a WorkerStats,
    pub clock: &'a Clock,
    pub buffers: &'a mut BufPool,
    pub inbox: &'a InboxSender<WorkerMessage>,
    pub worker_id: usize,
    /// A stop was requested: no answer keeps its connection alive.
    pub stopping: bool,
    pub draining: bool,
    /// The worker is near its connection limit: answer, but do not keep alive.
    pub near_limit: bool,
}

/// What a connection asks of its worker after an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Open,
    /// Flushing was cut short by the fairness budget; drive again next turn.
    Yielded,
    Close,
}

enum State {
    /// Waiting for (more of) a request head.
    Head,
    /// The head arrived, the body is still coming in.
    Body(Box<BodyState>),
    /// A handler deferred its reply; nothing else is processed until it arrives.
    Awaiting(Exchange),
    /// We answered and half-closed; reading and discarding until the client closes.
    Lingering { until_ms: u64, discarded: usize },
}

struct BodyState {
    /// The head, copied out of the read buffer so the body can stream through it.
    head: Vec<u8>,
    decoder: BodyDecoder,
    body: Vec<u8>,
}

/// The facts about a request its response needs.
#[derive(Clone, Copy)]
struct Exchange {
    head_only: bool,
    keep_alive: bool,
    http10: bool,
    seq: u32,
}

impl Exchange {
    /// An answer the server sends on its own (bad input, timeout) before closing.
    fn last_answer(seq: u32) -> Exchange {
        Exchange {
            head_only: false,
            keep_alive: false,
            http10: false,
            seq,
        }
    }
}

/// Which timeout a deadline stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timeout {
    Header,
    Body,
    Idle,
    Write,
    Linger,
}

pub(crate) struct Conn {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub key: u64,
    rbuf: Option<ReadBuf>,
    out: Output,
    state: State,
    /// No more requests: close once the output is flushed.
    closing: bool,
    /// Close by lingering (half-close, drain) rather than at once.
    linger_on_close: bool,
    /// Close at once, without an answer or lingering (a handler chose `Reply::Drop`).
    abort: bool,
    peer_eof: bool,
    /// The socket may hold unread bytes (an event came, and no short read since).
    may_read: bool,
    /// When the first byte of the current, incomplete head arrived.
    head_started_ms: Option<u64>,
    seq: u32,
    /// Current deadline and the deadline of the live timer-wheel entry (see TimerWheel).
    pub deadline_ms: u64,
    pub armed_ms: u64,
    /// While output waits: the kernel's unacknowledged bytes when the write deadline was
    /// last set, to tell a slow reader (it shrinks) from one that stopped (it does not).
    unacked_mark: u32,
}

impl Conn {
    pub fn new(stream: TcpStream, peer: SocketAddr, key: u64) -> Conn {
        Conn {
            stream,
            peer,
            key,
            rbuf: None,
            out: Output::default(),
            state: State::Head,
            closing: false,
            linger_on_close: false,
            abort: false,
            peer_eof: false,
            may_read: true,
            head_started_ms: None,
            seq: 0,
            deadline_ms: u64::MAX,
            armed_ms: u64::MAX,
            unacked_mark: 0,
        }
    }

    /// Readiness (or a retry after a yield): write what is pending, read, answer, repeat.
    pub fn drive(&mut self, readable: bool, cx: &mut ConnCx<'_>) -> Status {
        if readable {
            self.may_read = true;
        }
        let status = self.run(cx);
        if status != Status::Close {
            self.release_idle_buffers(cx.buffers);
        }
        status
    }

    fn run(&mut self, cx: &mut ConnCx<'_>) -> Status {
        loop {
            if !self.out.is_empty() {
                match self.out.flush(&mut self.stream) {
                    Ok(Flush::Done) => {}
                    Ok(Flush::Blocked) => return Status::Open,
                    Ok(Flush::Yielded) => return Status::Yielded,
                    Err(_) => {
                        cx.stats.bump(Counter::IoErrors);
                        return Status::Close;
                    }
                }
            }
            if let State::Lingering { .. } = self.state {
                return self.linger_read(cx);
            }
            if self.closing {
                return self.finish_close(cx);
            }

            self.process_input(cx);
            if !self.out.is_empty() {
                continue;
            }
            if self.closing {
                continue;
            }
            if matches!(self.state, State::Awaiting(_)) {
                return Status::Open;
            }
            if cx.draining
                && matches!(self.state, State::Head)
                && self.rbuf.as_ref().is_none_or(|b| b.is_empty())
                && !self.may_read
            {
                // Shutting down, between requests, and the socket is drained: this connection
                // is done. (With bytes possibly waiting we read first: closing a socket with an
                // unread request would reset it; instead the request is answered, with close.)
                return Status::Close;
            }
            if self.peer_eof {
                // The client finished sending; whatever is buffered is an incomplete request.
                return Status::Close;
            }
            if !self.may_read {
                return Status::Open;
            }
            match self.read(cx) {
                Ok(true) => {}
                // Draining: go round once more so an idle connection is closed now.
                Ok(false) if cx.draining => {}
                Ok(false) => return Status::Open,
                Err(_) => {
                    cx.stats.bump(Counter::IoErrors);
                    return Status::Close;
                }
            }
        }
    }

    /// One read into the connection's buffer. `Ok(false)` means nothing more to read now.
    fn read(&mut self, cx: &mut ConnCx<'_>) -> io::Result<bool> {
        let limit = cx.config.limits.max_head;
        let rbuf = self.rbuf.get_or_insert_with(|| cx.buffers.take_read());
        if rbuf.spare_mut().is_empty() {
            // A partial head filled a standard buffer; heads may be up to the limit.
            rbuf.grow_to(limit + 1);
            if rbuf.spare_mut().is_empty() {
                return Ok(false); // the codec rejects it as too large on the next parse
            }
        }
        let spare = rbuf.spare_mut();
        let want = spare.len();
        loop {
            match self.stream.read(spare) {
                Ok(0) => {
                    self.peer_eof = true;
                    self.may_read = false;
                    return Ok(true);
                }
                Ok(n) => {
                    rbuf.filled(n);
                    // A short read drained the socket: skip the read that would say EAGAIN.
                    if n < want {
                        self.may_read = false;
                    }
                    if self.head_started_ms.is_none() && matches!(self.state, State::Head) {
                        self.head_started_ms = Some(cx.clock.now_ms());
                    }
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.may_read = false;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Answers every complete request in the buffer (pipelining), in order.
    fn process_input(&mut self, cx: &mut ConnCx<'_>) {
        let Some(mut rbuf) = self.rbuf.take() else {
            return;
        };
        while !self.closing && self.out.pending() < OUTPUT_HIGH_WATER && !rbuf.is_empty() {
            match &mut self.state {
                State::Head => {
                    let consumed = self.process_head(rbuf.data(), cx);
                    rbuf.consume(consumed);
                    if consumed == 0 {
                        break;
                    }
                    self.head_started_ms = (!rbuf.is_empty()).then(|| cx.clock.now_ms());
                }
                State::Body(body) => {
                    match feed_body(&mut body.decoder, rbuf.data(), &mut body.body) {
                        Err(e) => self.reject(e, cx),
                        Ok(used) => {
                            rbuf.consume(used);
                            if body.decoder.is_done() {
                                self.finish_body(cx);
                            }
                        }
                    }
                }
                State::Awaiting(_) | State::Lingering { .. } => break,
            }
        }
        self.rbuf = Some(rbuf);
    }

    /// Parses one head at the start of `data` and answers it if its body is here too.
    /// Returns the bytes consumed (0: need more input).
    fn process_head(&mut self, data: &[u8], cx: &mut ConnCx<'_>) -> usize {
        let mut headers = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
        let limits = &cx.config.limits;
        let head = match parse_request(data, &mut headers, limits) {
            Ok(Parsed::Complete(head)) => head,
            Ok(Parsed::Partial) => return 0,
            Err(e) => {
                self.reject(e, cx);
                return 0;
            }
        };
        cx.stats.bump(Counter::Requests);
        let head_len = head.head_len;
        let available = (data.len() - head_len) as u64;
        match head.body {
            BodyKind::None => {
                self.dispatch(&head, &[], cx);
                head_len
            }
            BodyKind::Length(n) if available >= n => {
                let end = head_len + n as usize;
                self.dispatch(&head, &data[head_len..end], cx);
                end
            }
            kind => {
                let mut decoder = BodyDecoder::new(kind, limits.max_body);
                let mut body = Vec::new();
                let used = match feed_body(&mut decoder, &data[head_len..], &mut body) {
                    Ok(used) => used,
                    Err(e) => {
                        self.reject(e, cx);
                        return 0;
                    }
                };
                if decoder.is_done() {
                    self.dispatch(&head, &body, cx);
                } else {
                    if head.expect_continue {
                        self.out.head_buf(|| cx.buffers.take_write());
                        self.out.push_copy(CONTINUE_100);
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
    fn finish_body(&mut self, cx: &mut ConnCx<'_>) {
        let State::Body(saved) = std::mem::replace(&mut self.state, State::Head) else {
            return;
        };
        let mut headers = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
        match parse_request(&saved.head, &mut headers, &cx.config.limits) {
            Ok(Parsed::Complete(head)) => self.dispatch(&head, &saved.body, cx),
            _ => unreachable!("a head that parsed once parses again"),
        }
    }

    fn dispatch(&mut self, head: &RequestHead<'_>, body: &[u8], cx: &mut ConnCx<'_>) {
        let exchange = Exchange {
            head_only: head.method == Method::Head,
            keep_alive: head.keep_alive && !cx.stopping && !cx.near_limit && !self.peer_eof,
            http10: head.version == Version::Http10,
            seq: self.seq.wrapping_add(1),
        };
        self.seq = exchange.seq;
        let handler = match cx.shared.router.find(head.method, head.path) {
            RouteMatch::Handler(h) => h,
            RouteMatch::MethodNotAllowed(allow) => {
                let r = Response::text(405, "method not allowed\n").with_header("Allow", allow);
                return self.respond(r, exchange, cx);
            }
            RouteMatch::NotFound => {
                return self.respond(Response::text(404, "not found\n"), exchange, cx);
            }
        };
        let req = Request {
            head,
            body,
            peer: self.peer,
            unix_secs: cx.clock.unix_secs(),
            now_ms: cx.clock.now_ms(),
        };
        let mut hcx = HandlerContext {
            inbox: cx.inbox,
            conn: self.key,
            seq: exchange.seq,
            deferred: false,
            worker_id: cx.worker_id,
        };
        match catch_unwind(AssertUnwindSafe(|| handler.handle(&req, &mut hcx))) {
            Ok(Reply::Now(response)) => self.respond(response, exchange, cx),
            Ok(Reply::Later) if hcx.deferred => self.state = State::Awaiting(exchange),
            Ok(Reply::Drop) => {
                cx.stats.bump(Counter::ConnectionsDropped);
                self.closing = true;
                self.abort = true;
            }
            Ok(Reply::Later) => {
                if ratelog::admit("handler_later_without_defer", cx.clock.now_ms()) {
                    tracing::error!(path = head.path, "handler returned Later without defer()");
                }
                self.respond(
                    Response::text(500, "internal error\n").close(),
                    exchange,
                    cx,
                );
            }
            Err(_) => {
                cx.stats.bump(Counter::HandlerPanics);
                if ratelog::admit("handler_panic", cx.clock.now_ms()) {
                    let peer = self.peer;
                    tracing::error!(path = head.path, %peer, "handler panicked; answered 500");
                }
                self.respond(
                    Response::text(500, "internal error\n").close(),
                    exchange,
                    cx,
                );
            }
        }
    }

    /// A deferred reply arrived from the inbox.
    pub fn complete(&mut self, seq: u32, response: Response, cx: &mut ConnCx<'_>) -> Status {
        match self.state {
            State::Awaiting(exchange) if exchange.seq == seq => {
                self.state = State::Head;
                self.respond(response, exchange, cx);
                self.drive(false, cx)
            }
            // A reply for a request that was already answered (e.g. the handler panicked
            // after deferring): nothing to do.
            _ => Status::Open,
        }
    }

    fn respond(&mut self, response: Response, ex: Exchange, cx: &mut ConnCx<'_>) {
        let keep = ex.keep_alive && !response.close && !cx.stopping;
        let connection = match (keep, ex.http10) {
            (false, _) => ConnectionHeader::Close,
            (true, true) => ConnectionHeader::KeepAlive,
            (true, false) => ConnectionHeader::Persistent,
        };
        let no_body = status_has_no_body(response.status);
        let head = ResponseHead {
            status: response.status,
            date_line: cx.clock.date_line(),
            headers: response.headers(),
            content_length: (!no_body).then(|| response.body.len()),
            chunked: false,
            connection,
        };
        let buf = self.out.head_buf(|| cx.buffers.take_write());
        let before = buf.len();
        head.write_to(buf);
        self.out.commit(before);
        if !ex.head_only && !no_body {
            self.out.push_body(response.body);
        }
        cx.stats.response(response.status);
        if !keep {
            self.closing = true;
        }
    }

    /// Bad input: answer its precise status, count it, and close (lingering, since the
    /// client may still be sending).
    fn reject(&mut self, e: RequestError, cx: &mut ConnCx<'_>) {
        cx.stats.bad_request(e);
        // Sampled: at most a few lines a second per cause (an outsider chooses how many).
        if ratelog::admit(e.name(), cx.clock.now_ms()) {
            let cause = e.message().trim_end();
            tracing::info!(peer = %self.peer, status = e.status(), "bad request: {cause}");
        }
        self.state = State::Head;
        let ex = Exchange::last_answer(self.seq);
        self.respond(Response::text(e.status(), e.message()), ex, cx);
        self.linger_on_close = true;
    }

    fn finish_close(&mut self, cx: &mut ConnCx<'_>) -> Status {
        let unread = self.rbuf.as_ref().is_some_and(|b| !b.is_empty());
        if self.abort || !(self.linger_on_close || unread) || self.peer_eof {
            return Status::Close;
        }
        // Half-close so the client sees the end of our answer, then drain its input for a
        // moment: closing with unread bytes would send RST and could destroy the answer.
        let _ = self.stream.shutdown(Shutdown::Write);
        if let Some(b) = self.rbuf.as_mut() {
            b.consume(b.len());
        }
        self.state = State::Lingering {
            until_ms: cx.clock.now_ms() + LINGER_MS,
            discarded: 0,
        };
        self.may_read = true;
        self.linger_read(cx)
    }

    fn linger_read(&mut self, cx: &mut ConnCx<'_>) -> Status {
        let State::Lingering { discarded, .. } = &mut self.state else {
            return Status::Close;
        };
        let rbuf = self.rbuf.get_or_insert_with(|| cx.buffers.take_read());
        loop {
            match self.stream.read(rbuf.spare_mut()) {
                Ok(0) => return Status::Close,
                Ok(n) => {
                    *discarded += n;
                    if *discarded > LINGER_MAX_BYTES {
                        return Status::Close;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Status::Open,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Status::Close,
            }
        }
    }

    /// Shutdown began: idle connections close now, busy ones after their current answer.
    /// Returns true if the connection can be closed immediately.
    pub fn begin_drain(&mut self) -> bool {
        // `may_read`: a request may be waiting unread in the socket (a fresh connection, or
        // one whose last read filled the buffer); such a connection is driven once more
        // instead, so the request is answered rather than reset.
        let idle = matches!(self.state, State::Head)
            && self.out.is_empty()
            && self.rbuf.as_ref().is_none_or(|b| b.is_empty())
            && !self.may_read;
        if idle || matches!(self.state, State::Lingering { .. }) {
            return true;
        }
        // Whatever is being answered now is the last answer on this connection.
        if let State::Awaiting(ex) = &mut self.state {
            ex.keep_alive = false;
        }
        false
    }

    /// The deadline the connection's current state calls for, and which timeout it is.
    pub fn next_deadline(&self, cx: &ConnCx<'_>) -> (u64, Timeout) {
        let now = cx.clock.now_ms();
        let cfg = cx.config;
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        match &self.state {
            State::Lingering { until_ms, .. } => (*until_ms, Timeout::Linger),
            _ if !self.out.is_empty() => (now + ms(cfg.write_timeout), Timeout::Write),
            State::Awaiting(_) => (u64::MAX, Timeout::Idle),
            State::Body(_) => (now + ms(cfg.body_timeout), Timeout::Body),
            State::Head => match self.head_started_ms {
                Some(t) => (t + ms(cfg.header_timeout), Timeout::Header),
                None => (now + ms(cfg.idle_timeout), Timeout::Idle),
            },
        }
    }

    /// Called whenever the deadline is set: remembers how much output the client has yet to
    /// acknowledge, if output is waiting.
    pub fn mark_progress(&mut self, kind: Timeout) {
        if kind == Timeout::Write {
            // An error leaves 0, which nothing can undercut: the stall then times out.
            self.unacked_mark = tern_runtime::unacked_bytes(&self.stream).unwrap_or(0);
        }
    }

    /// The write deadline passed, but the client acknowledged some of our output since it
    /// was set: it is reading, only slower than the kernel wakes us (epoll reports a socket
    /// writable only once a third of its send buffer is free). Such a client gets another
    /// period; one that acknowledged nothing is cut off.
    pub fn still_reading(&self, cx: &ConnCx<'_>) -> bool {
        self.next_deadline(cx).1 == Timeout::Write
            && tern_runtime::unacked_bytes(&self.stream).is_ok_and(|n| n < self.unacked_mark)
    }

    /// The deadline passed. Counts the timeout; a slow head gets a best-effort 408.
    pub fn time_out(&mut self, cx: &mut ConnCx<'_>) {
        let (_, kind) = self.next_deadline(cx);
        let (counter, what) = match kind {
            Timeout::Header => (Counter::TimeoutHeader, "request head not received in time"),
            Timeout::Body => (Counter::TimeoutBody, "request body stalled"),
            Timeout::Idle => (Counter::TimeoutIdle, ""),
            Timeout::Write => (Counter::TimeoutWrite, "client stopped reading our answer"),
            Timeout::Linger => return,
        };
        cx.stats.bump(counter);
        // Idle keep-alive connections timing out is normal; the others may be slowloris-style
        // abuse, so they are logged, rate-limited.
        if kind != Timeout::Idle && ratelog::admit(counter.name(), cx.clock.now_ms()) {
            tracing::info!(peer = %self.peer, "timeout: {what}; closing");
        }
        if matches!(kind, Timeout::Header | Timeout::Body) && self.out.is_empty() {
            // Best effort, one non-blocking write: the connection closes right after.
            let ex = Exchange::last_answer(self.seq);
            self.respond(Response::text(408, "request timeout\n"), ex, cx);
            let _ = self.out.flush(&mut self.stream);
        }
    }

    /// Idle connections hold no buffers: return them to the worker's pool.
    fn release_idle_buffers(&mut self, pool: &mut BufPool) {
        if self.rbuf.as_ref().is_some_and(|b| b.is_empty()) {
            if let Some(b) = self.rbuf.take() {
                pool.give_read(b);
            }
        }
        if self.out.is_empty() {
            if let Some(b) = self.out.take_buf() {
                pool.give_write(b);
            }
        }
    }

    /// Gives back buffers when the connection closes.
    pub fn recycle(mut self: Box<Self>, pool: &mut BufPool) {
        if let Some(b) = self.rbuf.take() {
            pool.give_read(b);
        }
        if self.out.is_empty() {
            if let Some(b) = self.out.take_buf() {
                pool.give_write(b);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Idle keep-alive connections must stay cheap (the target is ≤ 512 bytes of RSS each,
    /// slab slot and kernel-side bookkeeping in user space included).
    #[test]
    fn an_idle_connection_is_small() {
        let size = std::mem::size_of::<Conn>();
        assert!(size <= 256, "Conn is {size} bytes");
    }
}
