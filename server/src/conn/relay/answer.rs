//! The answer's side of a relay: the upstream's head parsed and judged (a tunnel, an interim
//! answer, a status the route retries, or the answer), its fields rewritten, its body decoded
//! and compressed if the route asks (a [`Squeeze`] of the encoder at a time) and handed to the
//! client's sink; and the exchange's end, counted and logged, whether the upstream answered or
//! tern answers in its place ([`Relay::fail`], [`Relay::answer_own`]).

use std::mem::MaybeUninit;

use tern_codec::{parse_upstream_head, BodyDecoder, BodyKind, ResponseBody, UpstreamError};
use tern_runtime::ratelog;

use super::{Phase, Relay, UpBody, MAX_UPSTREAM_HEAD};
use crate::compression::{self, EncoderRoom, Streamed};
use crate::exchange::{ConnCx, Sink};
use crate::response::Response;
use crate::stats::{Counter, UpstreamCounter};
use crate::upstream::UpstreamOutcome;

const MAX_UPSTREAM_HEADERS: usize = 100;

/// Response fields tern never passes on: hop-by-hop ones (RFC 9110 §7.6.1), the framing it
/// re-encodes, those it writes itself, and the app's instructions to its proxy, the
/// `X-Accel-*` fields nginx hides by default (`ngx_http_proxy_hide_headers` and
/// `ngx_http_fastcgi_hide_headers`), whether the route follows `X-Accel-Redirect` or not.
const DROPPED_RESPONSE_FIELDS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "date",
    "server",
    "x-accel-redirect",
    "x-accel-expires",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

impl Relay {
    /// Parses and relays what the upstream sent.
    pub(super) fn process(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        let Some(mut buf) = self.from_up.take() else {
            return;
        };
        loop {
            if buf.is_empty() || self.phase == Phase::Done {
                break;
            }
            if self.phase == Phase::Connect {
                // The answer is dropped for another server's (a retried 502/503/504).
                buf.consume(buf.len());
                break;
            }
            if self.phase == Phase::Tunnel {
                self.body_bytes += buf.len() as u64;
                sink.data(buf.data(), cx);
                buf.consume(buf.len());
                break;
            }
            match &mut self.up_body {
                UpBody::Head => {
                    let used = self.take_head(buf.data(), sink, cx);
                    if used == 0 {
                        break;
                    }
                    buf.consume(used);
                }
                UpBody::UntilClose => {
                    self.push_body(buf.data(), sink, cx);
                    buf.consume(buf.len());
                }
                UpBody::Decoding(_) => {
                    let (used, done, broken) = self.decode_body(buf.data(), sink, cx);
                    buf.consume(used);
                    if broken {
                        self.fail(502, "upstream sent a malformed chunked body", sink, cx);
                        break;
                    }
                    if !done {
                        break;
                    }
                    self.finish_body(sink, cx);
                    self.complete(UpstreamOutcome::Ok, sink, cx);
                }
            }
        }
        if self.encoder.is_some() && self.phase == Phase::Exchange {
            // The upstream has nothing more for now: what it sent so far goes to the
            // client decodable, so a slow app's partial answer is not held back.
            self.squeeze(Squeeze::Flush, sink, cx);
        }
        if self.phase == Phase::Done && !buf.is_empty() {
            // Bytes past the end of the answer (a body after a HEAD answer, say): the
            // server is out of step with us, so its connection is not reused.
            self.upstream_keep = false;
            buf.consume(buf.len());
        }
        if buf.is_empty() && buf.capacity() == cx.buffers.read_size() && self.phase == Phase::Done {
            cx.buffers.give_read(buf);
        } else {
            self.from_up = Some(buf);
        }
    }

    /// Decodes body bytes of a sized or chunked answer into the client's output. Returns
    /// the bytes used, whether the body is complete, and whether its framing broke.
    fn decode_body(
        &mut self,
        input: &[u8],
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> (usize, bool, bool) {
        let mut used = 0;
        while used < input.len() {
            let UpBody::Decoding(decoder) = &mut self.up_body else {
                break;
            };
            match decoder.decode(&input[used..]) {
                Err(_) => return (used, false, true),
                Ok(step) => {
                    used += step.consumed;
                    let done = step.done;
                    let stalled = step.consumed == 0;
                    if done {
                        self.push_last(step.data, sink, cx);
                    } else {
                        self.push_body(step.data, sink, cx);
                    }
                    if done {
                        return (used, true, false);
                    }
                    if stalled {
                        break;
                    }
                }
            }
        }
        (used, false, false)
    }

    /// Takes a response head from `data`; returns the bytes used (0: incomplete).
    fn take_head(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) -> usize {
        let mut headers = [MaybeUninit::uninit(); MAX_UPSTREAM_HEADERS];
        let head = match parse_upstream_head(data, &mut headers, self.head_only, MAX_UPSTREAM_HEAD)
        {
            Ok(Some(h)) => h,
            Ok(None) => return 0,
            Err(e) => {
                if ratelog::admit(e.name(), cx.clock.now_ms()) {
                    tracing::warn!(upstream = %self.addr(), "upstream response refused: {}", e.name());
                }
                let msg = match e {
                    UpstreamError::TooLarge => {
                        "bad gateway: the upstream's response head is too large\n"
                    }
                    _ => "bad gateway: the upstream's response is malformed\n",
                };
                self.fail(502, msg, sink, cx);
                return 0;
            }
        };
        let used = head.head_len;
        if head.status == 101 {
            if !self.fwd.upgrade {
                self.fail(
                    502,
                    "bad gateway: the upstream switched protocols unasked\n",
                    sink,
                    cx,
                );
                return 0;
            }
            if self.websocket.is_some() {
                return self.websocket_accepted(&head, sink, cx);
            }
            // The client's own handshake: the upstream's answer to it goes back as it is.
            let mut r = Response::new(101);
            copy_fields(&head, &mut r);
            if let Some(edit) = &self.fwd.edit {
                edit(&mut r);
            }
            let upgrade = head
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("upgrade"))
                .map(|h| h.value);
            self.status = sink.tunnel(r, upgrade, cx);
            // After the tunnel the connection is not HTTP any more: it closes.
            self.close_client = true;
            self.open_tunnel(cx);
            return used;
        }
        if self.websocket.is_some() && (200..300).contains(&head.status) {
            // An HTTP/2 client takes any 2xx to its CONNECT as the tunnel open: an upstream
            // that answered the handshake as a plain GET must not look like one.
            self.fail(
                502,
                "bad gateway: the upstream did not switch to WebSocket\n",
                sink,
                cx,
            );
            return 0;
        }
        if head.status < 200 {
            // 100 Continue was ours to give; other interim answers (103 Early Hints) go on
            // where the client's protocol passes them.
            if head.status != 100 {
                let mut r = Response::new(head.status);
                copy_fields(&head, &mut r);
                sink.interim(&r, cx);
            }
            return used;
        }
        if self.retried_on_status(head.status, cx) {
            return used;
        }
        if head.status >= 500 {
            if let Some(used) = self.fall_back_on(&head, data, sink, cx) {
                return used;
            }
        }
        if let Some(used) = self.hand_back(&head, data, sink, cx) {
            return used;
        }
        // Not switched: an ordinary answer, but a connection asked for an upgrade stays out
        // of the pool.
        self.upstream_keep = head.keep_alive && !self.fwd.upgrade;
        self.status = head.status;
        let mut r = Response::new(head.status);
        if copy_fields(&head, &mut r) && ratelog::admit("x_accel_redirect_off", cx.clock.now_ms()) {
            tracing::info!(upstream = %self.addr(), "the app's X-Accel-Redirect was dropped: its route does not follow it (x_accel_redirect = true)");
        }
        if head.status == 304 {
            if let Some(used) = self.revalidated(&head, &r, sink, cx) {
                return used;
            }
        }
        if self.fwd.tee.is_some() {
            let (declared, sized) = match head.body {
                ResponseBody::None => (Some(0), true),
                ResponseBody::Length(n) => (Some(n), true),
                ResponseBody::Chunked => (None, true),
                ResponseBody::UntilClose => (None, false),
            };
            let date = head
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("date"))
                .map(|h| h.value);
            self.tee_head(&r, declared, sized, date, cx);
        }
        if let Some(edit) = &self.fwd.edit {
            edit(&mut r);
        }
        if let Some(log) = self.log.as_mut() {
            log.cache = r.cache_outcome;
        }
        let (content_length, body) = match head.body {
            ResponseBody::None => {
                // A HEAD answer keeps the length the GET would have had.
                let len = if self.head_only && !crate::response::status_has_no_body(head.status) {
                    head.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                } else {
                    None
                };
                (len, None)
            }
            ResponseBody::Length(n) => (
                Some(n),
                Some(UpBody::Decoding(BodyDecoder::new(
                    BodyKind::Length(n),
                    u64::MAX,
                ))),
            ),
            ResponseBody::Chunked => (
                None,
                Some(UpBody::Decoding(BodyDecoder::new(
                    BodyKind::Chunked,
                    u64::MAX,
                ))),
            ),
            ResponseBody::UntilClose => (None, Some(UpBody::UntilClose)),
        };
        let content_length = match self.compress.take() {
            Some(choice) => {
                // The encoder's state is charged to the worker's and the connection's
                // budgets; a HEAD answer needs none.
                let room = (body.is_some() && !self.head_only).then(|| EncoderRoom {
                    worker: cx.stats.encoders(),
                    conn_held: sink.encoders_held(),
                });
                // The length the decision sees: the body's, or a HEAD answer's for the GET.
                match choice.edit_streamed_head(&mut r, content_length, room, cx.stats) {
                    Ok(Streamed::Compressed(encoder)) => {
                        self.encoder = encoder;
                        // Streamed: no length.
                        None
                    }
                    Ok(Streamed::AsIs) => content_length,
                    Err(_) => {
                        // Ours, not the upstream's: counted apart, and its connection is
                        // not blamed (nor reused).
                        cx.stats.bump(Counter::CompressionFailures);
                        self.outcome = UpstreamOutcome::Abandoned;
                        self.answer_own(502, "bad gateway: out of memory\n", sink, cx);
                        return 0;
                    }
                }
            }
            None => content_length,
        };
        if self.client_body.is_some() {
            // Answered before the request body was all sent: the client's connection cannot
            // be read in step any more, nor the upstream's reused.
            self.close_client = true;
        }
        let follows = body.is_some() && !self.head_only;
        sink.head(r, content_length, follows, self.close_client, cx);
        self.head_sent = true;
        match body {
            Some(b) if !matches!(&b, UpBody::Decoding(d) if d.is_done()) => self.up_body = b,
            _ => {
                self.finish_body(sink, cx);
                self.complete(UpstreamOutcome::Ok, sink, cx);
            }
        }
        used
    }

    /// The upstream's `101` to an HTTP/2 client's WebSocket: checked against the key sent,
    /// then the client gets its `200` (RFC 8441 §5) with the upstream's end-to-end fields
    /// (`Sec-WebSocket-Protocol`, `-Extensions`, cookies), and the stream is the tunnel.
    fn websocket_accepted(
        &mut self,
        head: &tern_codec::UpstreamHead<'_>,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> usize {
        let fields = head.headers.iter().map(|h| (h.name, h.value));
        if !self
            .websocket
            .as_ref()
            .is_some_and(|w| w.completed_by(fields))
        {
            if ratelog::admit("websocket_accept", cx.clock.now_ms()) {
                tracing::warn!(upstream = %self.addr(), "upstream's 101 does not complete the WebSocket handshake");
            }
            self.fail(
                502,
                "bad gateway: the upstream's WebSocket handshake is wrong\n",
                sink,
                cx,
            );
            return 0;
        }
        let mut r = Response::new(200);
        copy_fields(head, &mut r);
        r.remove_header("sec-websocket-accept");
        if let Some(edit) = &self.fwd.edit {
            edit(&mut r);
        }
        self.status = sink.tunnel(r, None, cx);
        self.open_tunnel(cx);
        head.head_len
    }

    /// The upstream switched protocols: bytes both ways from now on (the sink counted the
    /// tunnel under its protocol).
    fn open_tunnel(&mut self, cx: &mut ConnCx<'_>) {
        self.head_sent = true;
        self.phase = Phase::Tunnel;
        self.client_body = None;
        self.upstream_keep = false;
        self.deadline_ms =
            cx.clock.now_ms() + self.fwd.upstreams.timeouts().idle.as_millis() as u64;
    }

    /// Body bytes of the upstream's answer, compressed if it is, framed for the client.
    fn push_body(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if data.is_empty() || self.head_only {
            return;
        }
        self.tee_body(data);
        if self.encoder.is_some() {
            self.squeeze(Squeeze::Data(data), sink, cx);
        } else {
            self.emit(data, sink, cx);
        }
    }

    /// The last body bytes of a sized or chunked answer: an answer that came whole is
    /// compressed in one pass (see `Encoder::finish_with`), never held back for it.
    fn push_last(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if self.encoder.is_some() && !data.is_empty() && !self.head_only {
            self.tee_body(data);
            self.squeeze(Squeeze::Last(data), sink, cx);
        } else {
            self.push_body(data, sink, cx);
        }
    }

    /// One step of the answer's encoder; its output goes to the client. A failing encoder
    /// (no memory) cuts the answer short, as a failing upstream does, but it is counted as
    /// ours and says nothing about the upstream's health.
    fn squeeze(&mut self, step: Squeeze<'_>, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        let Some(mut encoder) = self.encoder.take() else {
            return;
        };
        let coded = match step {
            Squeeze::Data(data) => encoder.write(data),
            Squeeze::Flush => encoder.flush(),
            Squeeze::Finish => encoder.finish(),
            Squeeze::Last(data) => encoder.finish_with(data),
        };
        match coded {
            Ok(bytes) => self.emit(bytes, sink, cx),
            Err(_) => {
                cx.stats.bump(Counter::CompressionFailures);
                self.close_client = true;
                self.upstream_keep = false;
                sink.reset();
                self.end(UpstreamOutcome::Abandoned, None, cx);
                return;
            }
        }
        if matches!(step, Squeeze::Finish | Squeeze::Last(_)) {
            let e = encoder.encoding();
            compression::count(cx.stats, e, encoder.bytes_in(), encoder.bytes_out());
        } else {
            self.encoder = Some(encoder);
        }
    }

    /// Body bytes for the client (the sink frames them).
    fn emit(&mut self, data: &[u8], sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        if data.is_empty() {
            return;
        }
        self.body_bytes += data.len() as u64;
        sink.data(data, cx);
    }

    pub(super) fn finish_body(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        self.squeeze(Squeeze::Finish, sink, cx);
        sink.end(cx);
    }

    /// The exchange is over: count it, log it, and let the driver release the upstream.
    pub(super) fn complete(
        &mut self,
        outcome: UpstreamOutcome,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) {
        if self.phase == Phase::Done {
            return;
        }
        self.log_fastcgi_stderr(cx);
        sink.end(cx);
        let upstream_us = cx.clock.now_us().saturating_sub(self.sent_us);
        self.end(outcome, Some(upstream_us), cx);
    }

    /// Ends the exchange with `outcome`: counted, and its access-log line written.
    pub(super) fn end(
        &mut self,
        outcome: UpstreamOutcome,
        upstream_us: Option<u64>,
        cx: &mut ConnCx<'_>,
    ) {
        // A copy is kept only of an answer that came whole: `complete` with `Ok` is reached
        // only after the body's framing ended (or with no body).
        self.tee_end(outcome == UpstreamOutcome::Ok && upstream_us.is_some(), cx);
        // An answer cut short frees its encoder now, not when the relay goes.
        self.encoder = None;
        if self.phase == Phase::Tunnel {
            cx.stats.bump(Counter::WebsocketTunnelsClosed);
        }
        self.outcome = outcome;
        self.phase = Phase::Done;
        self.deadline_ms = u64::MAX;
        cx.answered(self.status, self.tally);
        if let (Some(log), Some(saved)) = (cx.access_log.as_deref_mut(), self.log.as_ref()) {
            let entry = saved.entry();
            log.record_upstream(&entry, self.status, self.body_bytes, upstream_us, cx.clock);
        }
    }

    /// The upstream failed this exchange: a `status` answer if the client has heard nothing
    /// yet, else the client connection is cut (its answer cannot be completed honestly).
    pub(super) fn fail(
        &mut self,
        status: u16,
        msg: &'static str,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) {
        if self.phase == Phase::Done {
            return;
        }
        cx.stats
            .bump_upstream(self.counted_as, UpstreamCounter::Failures);
        if self.head_sent {
            // Whatever was queued goes out, then the connection closes: the client sees a
            // short body (or no last chunk), never a later response mistaken for this one.
            // On HTTP/2 the stream is reset instead (its answer never ends).
            self.close_client = true;
            sink.reset();
            self.end(UpstreamOutcome::Failed, None, cx);
            return;
        }
        if status < 500 {
            self.outcome = UpstreamOutcome::Abandoned;
        } else {
            self.outcome = UpstreamOutcome::Failed;
            if self.fall_back(sink, cx) {
                // Still the server's failure, for its health.
                self.outcome = UpstreamOutcome::Failed;
                return;
            }
        }
        self.answer_own(status, msg, sink, cx);
    }

    /// Answers the client with tern's own short response in place of the upstream's.
    pub(super) fn answer_own(
        &mut self,
        status: u16,
        msg: &'static str,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) {
        let outcome = if self.outcome == UpstreamOutcome::Ok {
            UpstreamOutcome::Failed
        } else {
            self.outcome
        };
        if self.client_body.is_some() {
            self.close_client = true;
        }
        let mut r = Response::text(status, msg);
        if let Some(page) = &self.fwd.own_answers {
            page(&mut r); // the site's error page for this status, if it has one
        }
        let body = std::mem::take(&mut r.body);
        // Pages are in memory, tern's own bodies too (a file would be sent as empty).
        let bytes = body.as_memory().unwrap_or_default();
        let len = bytes.len() as u64;
        sink.head(r, Some(len), !self.head_only, self.close_client, cx);
        if !self.head_only {
            sink.data(bytes, cx);
        }
        self.head_sent = true;
        self.status = status;
        self.body_bytes = len;
        self.complete(outcome, sink, cx);
    }

    /// A FastCGI answer broke its protocol or ended without an answer.
    pub(super) fn fastcgi_failed(
        &mut self,
        e: tern_fastcgi::TranslateError,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) {
        self.upstream_keep = false;
        if ratelog::admit("fastcgi_answer", cx.clock.now_ms()) {
            tracing::warn!(upstream = %self.addr(), "FastCGI answer refused: {}", e.message());
        }
        let (status, msg) = match e {
            tern_fastcgi::TranslateError::Overloaded => {
                (503, "service unavailable: the application is overloaded\n")
            }
            _ => (502, "bad gateway: the application's answer is malformed\n"),
        };
        self.fail(status, msg, sink, cx);
        self.log_fastcgi_stderr(cx);
    }

    /// What a FastCGI application wrote to its error stream (PHP warnings) goes to tern's
    /// log, as nginx's "FastCGI sent in stderr", rate-limited.
    pub(super) fn log_fastcgi_stderr(&mut self, cx: &ConnCx<'_>) {
        let Some(f) = self.fastcgi.as_mut() else {
            return;
        };
        let stderr = f.take_stderr();
        if !stderr.is_empty() && ratelog::admit("fastcgi_stderr", cx.clock.now_ms()) {
            let addr = self.fwd.upstreams.addr(self.server.unwrap_or(0));
            tracing::warn!(upstream = %addr, "FastCGI sent in stderr: {}", String::from_utf8_lossy(&stderr).trim_end());
        }
    }
}

/// A step of the answer's encoder.
#[derive(Clone, Copy)]
enum Squeeze<'a> {
    Data(&'a [u8]),
    /// The upstream has nothing more for now.
    Flush,
    /// The answer is complete.
    Finish,
    /// These are the answer's last bytes: compress them and end.
    Last(&'a [u8]),
}

/// Copies the upstream's fields a client may see: not the hop-by-hop ones, not those named
/// by its Connection fields, not the framing, not Date/Server (tern writes its own) and not
/// `X-Accel-*`. True if an `X-Accel-Redirect` was among those left out.
fn copy_fields(head: &tern_codec::UpstreamHead<'_>, r: &mut Response) -> bool {
    let names_fields = head
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("connection"));
    let mut accel_redirect = false;
    for h in head.headers {
        let name = h.name;
        if DROPPED_RESPONSE_FIELDS
            .iter()
            .any(|d| name.eq_ignore_ascii_case(d))
            || names_fields && head.connection_names(name.as_bytes())
        {
            accel_redirect |= name.eq_ignore_ascii_case("x-accel-redirect");
            continue;
        }
        // The parser took only a token name and a value without CR, LF or NUL.
        r.push_parsed_header(name, h.value);
    }
    accel_redirect
}
