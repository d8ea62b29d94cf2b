//! The protocol layer of a connection: HTTP/1.1, or HTTP/2 once ALPN chose `h2` or a plain
//! connection opened with the HTTP/2 preface. Both take plaintext and write answers into the
//! connection's [`Output`]; this enum only forwards.

use tern_runtime::{BufPool, ReadBuf};

use super::close::{CloseKind, Next};
use super::http1::Http1;
use super::http2::Http2;
use super::output::Output;
use super::types::{Link, Timeout};
use crate::exchange::ConnCx;
use crate::handler::ExchangeId;
use crate::response::Response;

pub(crate) enum Protocol {
    Http1(Http1),
    /// Boxed: an idle HTTP/1.1 connection stays small.
    Http2(Box<Http2>),
}

/// Whether the first bytes of a plain connection are the HTTP/2 preface.
pub(crate) enum Preface {
    Yes,
    No,
    /// Too few bytes to tell (a prefix of the preface).
    Undecided,
}

/// `$e` once per protocol, with `$p` bound to it (`$http`: the `Protocol`, by reference): the
/// one place that names every protocol. The relays' calls (`relays.rs`) go through it too.
macro_rules! forward {
    ($http:expr, $p:ident => $e:expr) => {
        match $http {
            Protocol::Http1($p) => $e,
            Protocol::Http2($p) => $e,
        }
    };
}
pub(crate) use forward;

impl Protocol {
    /// Switches to HTTP/2, keeping the input read so far.
    /// `file_frame`: see [`Http2`]'s field (0 in plain TCP).
    pub fn upgrade_to_h2(&mut self, file_frame: u16, out: &mut Output, cx: &mut ConnCx<'_>) {
        let rbuf: Option<ReadBuf> = match self {
            Protocol::Http1(h) => h.take_read_buf(),
            Protocol::Http2(_) => return,
        };
        *self = Protocol::Http2(Box::new(Http2::new(rbuf, file_frame, out, cx)));
    }

    /// On a plain connection that has not answered anything yet: is this HTTP/2?
    pub fn sniff_preface(&self) -> Preface {
        let Protocol::Http1(h) = self else {
            return Preface::No;
        };
        let Some(data) = h.unanswered_start() else {
            return Preface::No;
        };
        let preface = tern_http2::PREFACE;
        let n = data.len().min(preface.len());
        if data[..n] != preface[..n] {
            Preface::No
        } else if n < preface.len() {
            Preface::Undecided
        } else {
            Preface::Yes
        }
    }

    pub fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8] {
        forward!(self, p => p.recv_buf(cx))
    }

    pub fn filled(&mut self, n: usize, now_ms: u64) {
        forward!(self, p => p.filled(n, now_ms))
    }

    pub fn handle_eof(&mut self, cx: &ConnCx<'_>) {
        forward!(self, p => p.handle_eof(cx))
    }

    pub fn is_lingering(&self) -> bool {
        forward!(self, p => p.is_lingering())
    }

    pub fn is_idle(&self) -> bool {
        forward!(self, p => p.is_idle())
    }

    pub fn wants_input(&self, out: &Output) -> bool {
        forward!(self, p => p.wants_input(out))
    }

    pub fn process_input(&mut self, out: &mut Output, link: &Link, cx: &mut ConnCx<'_>) {
        forward!(self, p => p.process_input(out, link, cx))
    }

    pub fn next(&self) -> Next {
        forward!(self, p => p.next())
    }

    pub fn close_kind(&self) -> CloseKind {
        forward!(self, p => p.close_kind())
    }

    pub fn start_lingering(&mut self, now_ms: u64) {
        forward!(self, p => p.start_lingering(now_ms))
    }

    pub fn abort(&mut self) {
        forward!(self, p => p.abort())
    }

    pub fn complete(
        &mut self,
        id: ExchangeId,
        response: Response,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) -> bool {
        forward!(self, p => p.complete(id, response, out, link, cx))
    }

    pub fn begin_drain(&mut self, out: &mut Output, may_read: bool, cx: &mut ConnCx<'_>) -> bool {
        match self {
            Protocol::Http1(h) => h.begin_drain(out, may_read, cx),
            Protocol::Http2(h) => h.begin_drain(out, cx),
        }
    }

    pub fn next_deadline(&self, out_waiting: bool, cx: &ConnCx<'_>) -> (u64, Timeout) {
        forward!(self, p => p.next_deadline(out_waiting, cx))
    }

    pub fn answer_timeout(
        &mut self,
        kind: Timeout,
        out: &mut Output,
        link: &Link,
        cx: &mut ConnCx<'_>,
    ) {
        match self {
            Protocol::Http1(h) => h.answer_timeout(kind, out, link, cx),
            Protocol::Http2(h) => h.answer_timeout(kind, out, cx),
        }
    }

    /// The `Trim` deadline passed (HTTP/2 only: see `Http2::trim`).
    pub fn trim(&mut self) {
        if let Protocol::Http2(h) = self {
            h.trim();
        }
    }

    pub fn release_idle_buffer(&mut self, pool: &mut BufPool) {
        forward!(self, p => p.release_idle_buffer(pool))
    }

    pub fn recycle(&mut self, pool: &mut BufPool) {
        forward!(self, p => p.recycle(pool))
    }
}
