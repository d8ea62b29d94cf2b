//! One connection as a state machine over bytes, with no I/O of its own: a *transport*
//! (plain, or a TLS session) under a *protocol* (HTTP/1.1 or HTTP/2) under the *exchanges*
//! handlers see.
//!
//! The driver (`driver/mod.rs`) owns the socket and calls, in a loop:
//! 1. [`Conn::poll_transmit`] and sends what it describes (memory slices or a file range),
//!    reporting progress with [`Conn::handle_sent`], until nothing is left or the socket is
//!    full;
//! 2. [`Conn::poll_action`]: read, wait, shut down the write side, or close;
//! 3. to read: [`Conn::recv_buf`], then [`Conn::handle_recv`] (or [`Conn::handle_eof`]),
//!    which runs the transport, the protocol and the handlers.
//!
//! Deadlines come from [`Conn::next_deadline`]; a reply completed by another thread comes in
//! through [`Conn::complete`]. The connection reads the worker's cached clock (passed in),
//! never the system's.
//!
//! While it relays exchanges to upstream servers (`relay/`), the driver also runs their
//! upstream side through the connection's `relay_*` calls, one surface for every protocol
//! (`relays.rs`).

mod close;
pub(crate) mod http1;
mod http2;
pub(crate) mod output;
mod protocol;
mod records;
pub(crate) mod relay;
mod relay_host;
mod relays;
pub(crate) mod stream;
mod tls;
mod types;
mod up_queue;
pub(crate) mod upstream;
mod upstream_wire;
mod websocket;

use std::io::IoSlice;
use std::os::fd::AsRawFd;

use tern_runtime::{ratelog, BufPool};

use crate::bans::BanCause;
use crate::exchange::ConnCx;
use crate::handler::ExchangeId;
use crate::response::Response;
use crate::stats::Counter;
use close::{CloseKind, Next};
use http1::Http1;
use output::Output;
use protocol::{Preface, Protocol};
pub(crate) use relay::RelayNeed;
pub(crate) use relay_host::RelayHost;
use tls::Tls;
pub(crate) use types::{Action, Link, Status, Timeout, Transmit};

enum Transport {
    Plain,
    Tls(Box<Tls>),
}

pub(crate) struct Conn {
    link: Link,
    transport: Transport,
    http: Protocol,
    out: Output,
}

/// Over TLS, a DATA frame of a file is one whole record: its 9-byte header and the rest.
const H2_FILE_FRAME: u16 = (tern_tls::MAX_PLAINTEXT - tern_http2::frame::HEADER_LEN) as u16;

impl Conn {
    /// A connection accepted at `now_ms`. Over TLS the header timeout runs from here: a
    /// client must finish its handshake (and first request head) within it, as in nginx.
    pub fn new(link: Link, tls: Option<tern_tls::TlsSession>, now_ms: u64) -> Conn {
        let mut http = Http1::default();
        if tls.is_some() {
            http.mark_head_start(now_ms);
        }
        Conn {
            transport: match tls {
                Some(session) => Transport::Tls(Box::new(Tls::new(session))),
                None => Transport::Plain,
            },
            link,
            http: Protocol::Http1(http),
            out: Output::default(),
        }
    }

    /// The client's address.
    pub fn peer(&self) -> std::net::SocketAddr {
        self.link.peer
    }

    /// Describes the next bytes to send, filling `iov` for memory. Over TLS, plaintext is
    /// encrypted here (a bounded batch at a time) and the records are what is offered.
    pub fn poll_transmit<'a>(
        &'a mut self,
        cx: &mut ConnCx<'_>,
        iov: &mut [IoSlice<'a>],
    ) -> Transmit {
        if let Transport::Tls(tls) = &mut self.transport {
            if tls.fill(&mut self.out, cx).is_err() {
                return Transmit::Failed;
            }
        }
        let this: &'a Conn = self;
        match &this.transport {
            Transport::Tls(tls) => tls.transmit(iov),
            Transport::Plain => plain_transmit(&this.out, iov),
        }
    }

    /// `n` bytes of what `poll_transmit` described were sent.
    pub fn handle_sent(&mut self, n: usize) {
        match &mut self.transport {
            Transport::Tls(tls) => tls.sent(n),
            Transport::Plain => self.out.advance(n),
        }
    }

    /// What `poll_transmit` described was handed to a backend whose send completes later:
    /// plain output is sealed (see `Output::seal`); TLS records are made only once the
    /// previous ones are all sent, so they stay put anyway.
    pub fn seal(&mut self) {
        if let Transport::Plain = self.transport {
            self.out.seal();
        }
    }

    /// What next, once everything is sent.
    pub fn poll_action(&mut self, cx: &mut ConnCx<'_>) -> Action {
        // Input may be waiting inside the transport (decrypted data a reply held back, or
        // pipelined requests past the output high-water mark): process it first.
        if self.process(cx) {
            return Action::Transmit;
        }
        match self.http.next() {
            Next::Read => Action::Read,
            Next::Wait => Action::Wait,
            Next::Close => {
                if let Transport::Tls(tls) = &mut self.transport {
                    if tls.close_notify() {
                        return Action::Transmit;
                    }
                }
                match self.http.close_kind() {
                    CloseKind::Now => Action::Close,
                    CloseKind::Linger => Action::ShutdownWrite,
                }
            }
        }
    }

    /// The driver shut the write side down: discard input for a moment, then close.
    pub fn handle_write_shutdown(&mut self, cx: &mut ConnCx<'_>) {
        self.http.start_lingering(cx.clock.now_ms());
    }

    /// Where the driver should read into. Empty: take no input now.
    pub fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8] {
        match &mut self.transport {
            Transport::Tls(tls) if !self.http.is_lingering() => tls.recv_buf(cx.buffers),
            _ => self.http.recv_buf(cx),
        }
    }

    /// `n` bytes were read into `recv_buf`.
    pub fn handle_recv(&mut self, n: usize, cx: &mut ConnCx<'_>) {
        match &mut self.transport {
            Transport::Tls(tls) if !self.http.is_lingering() => {
                tls.filled(n);
                if tls.looks_like_plain_http() {
                    return self.answer_plain_http_on_tls_port(cx);
                }
            }
            _ => self.http.filled(n, cx.clock.now_ms()),
        }
        self.process(cx);
    }

    /// The peer closed its side of the TCP stream.
    pub fn handle_eof(&mut self, cx: &mut ConnCx<'_>) {
        if let Transport::Tls(tls) = &mut self.transport {
            if tls.is_handshaking() && !self.http.is_lingering() {
                if tls.started() {
                    cx.stats.bump(Counter::TlsFailedClosed);
                }
                self.http.abort();
            }
        }
        self.http.handle_eof(cx);
    }

    /// Runs the transport and the protocol on the input they hold. True if output was queued.
    fn process(&mut self, cx: &mut ConnCx<'_>) -> bool {
        let before = self.out.pending();
        match &mut self.transport {
            Transport::Plain => {
                match self.http.sniff_preface() {
                    Preface::Yes => self.http.upgrade_to_h2(0, &mut self.out, cx),
                    Preface::Undecided => return false,
                    Preface::No => {}
                }
                self.http.process_input(&mut self.out, &self.link, cx)
            }
            Transport::Tls(tls) => loop {
                // Ciphertext in, plaintext out into the protocol's buffer, protocol runs;
                // again while it takes more and the session has more.
                if let Err(failure) = tls.decrypt() {
                    tls_failed(failure, tls.is_handshaking(), &self.link, cx);
                    // The alert goes out before closing, with a linger: the rest of a large
                    // ClientHello, unread, would otherwise reset the connection first.
                    match &mut self.http {
                        Protocol::Http1(http) => http.close_after_alert(),
                        Protocol::Http2(_) => self.http.abort(),
                    }
                    return tls.wants_write();
                }
                if tls.just_established() {
                    cx.stats.bump(Counter::TlsHandshakes);
                    if tls.chose_acme_tls() {
                        // A TLS-ALPN-01 validation (RFC 8737 §3) only looks at the
                        // certificate: no application data, close once it is sent.
                        self.http.abort();
                        tls.close_notify();
                        return true;
                    }
                    if tls.chose_h2() {
                        self.http.upgrade_to_h2(H2_FILE_FRAME, &mut self.out, cx);
                    }
                }
                // First what the protocol already holds (requests held back behind a pending
                // reply or the output high-water mark), then more from the session.
                self.http.process_input(&mut self.out, &self.link, cx);
                if !self.http.wants_input(&self.out) {
                    break;
                }
                match tls.read_plaintext(|| self.http.recv_buf(cx)) {
                    tls::Moved::Bytes(n) => self.http.filled(n, cx.clock.now_ms()),
                    tls::Moved::PeerClosed => {
                        self.http.handle_eof(cx);
                        break;
                    }
                    tls::Moved::Nothing => break,
                    tls::Moved::Failed(failure) => {
                        tls_failed(failure, false, &self.link, cx);
                        self.http.abort();
                        return tls.wants_write(); // the alert, sent before closing
                    }
                }
            },
        }
        self.out.pending() != before || self.tls_wants_write()
    }

    fn tls_wants_write(&self) -> bool {
        matches!(&self.transport, Transport::Tls(tls) if tls.wants_write())
    }

    /// Plain HTTP sent to the TLS port: say so in plain HTTP (as nginx does), then close.
    #[cold]
    fn answer_plain_http_on_tls_port(&mut self, cx: &mut ConnCx<'_>) {
        cx.stats.bump(Counter::TlsFailedPlainHttp);
        if ratelog::admit("tls_plain_http", cx.clock.now_ms()) {
            tracing::info!(peer = %self.link.peer, "plain HTTP request on the TLS port");
        }
        if let Transport::Tls(tls) = &mut self.transport {
            tls.recycle(cx.buffers);
        }
        self.transport = Transport::Plain;
        self.link.secure = false;
        let response = Response::text(400, "This port speaks HTTPS: use an https:// URL.\n");
        if let Protocol::Http1(http) = &mut self.http {
            http.answer_and_close(response, &mut self.out, &self.link, cx);
        }
    }

    /// The slab key (mio token) of this connection.
    /// A deferred reply arrived from the inbox. False if it was stale.
    pub fn complete(&mut self, id: ExchangeId, response: Response, cx: &mut ConnCx<'_>) -> bool {
        self.http
            .complete(id, response, &mut self.out, &self.link, cx)
    }

    /// Between requests with nothing buffered (shutdown may close it).
    pub fn is_idle(&self) -> bool {
        self.http.is_idle()
            && self.out.is_empty()
            && match &self.transport {
                Transport::Tls(tls) => tls.is_idle(),
                Transport::Plain => true,
            }
    }

    pub fn is_lingering(&self) -> bool {
        self.http.is_lingering()
    }

    /// Shutdown began. True if the connection can be closed at once.
    pub fn begin_drain(&mut self, may_read: bool, cx: &mut ConnCx<'_>) -> bool {
        let may_read = may_read || !self.is_idle();
        self.http.begin_drain(&mut self.out, may_read, cx)
    }

    /// The deadline the connection's state calls for, and which timeout it is.
    pub fn next_deadline(&self, cx: &ConnCx<'_>) -> (u64, Timeout) {
        let waiting = !self.out.is_empty()
            || matches!(&self.transport, Transport::Tls(tls) if tls.wants_write());
        self.http.next_deadline(waiting, cx)
    }

    /// The deadline passed. Counts the timeout and queues what is owed before closing (a
    /// 408 for a slow head or body, close_notify); the driver makes one attempt to send it.
    pub fn time_out(&mut self, cx: &mut ConnCx<'_>) {
        let (_, kind) = self.next_deadline(cx);
        let handshaking = matches!(&self.transport, Transport::Tls(tls) if tls.is_handshaking());
        let (counter, what) = match kind {
            Timeout::Header if handshaking => (
                Counter::TlsFailedTimeout,
                "TLS handshake not completed in time",
            ),
            Timeout::Header => (Counter::TimeoutHeader, "request head not received in time"),
            Timeout::Body => (Counter::TimeoutBody, "request body stalled"),
            Timeout::Idle => (Counter::TimeoutIdle, ""),
            Timeout::Write | Timeout::Stall => {
                (Counter::TimeoutWrite, "client stopped reading our answer")
            }
            Timeout::Linger | Timeout::Trim | Timeout::Upstream => return,
        };
        cx.stats.bump(counter);
        if kind == Timeout::Header {
            // A slow head or handshake: slowloris, if it keeps happening.
            cx.record_ban(self.link.peer.ip(), BanCause::Strikes);
        }
        // Idle keep-alive connections timing out is normal; the others may be slowloris-style
        // abuse, so they are logged, rate-limited.
        if kind != Timeout::Idle && ratelog::admit(counter.name(), cx.clock.now_ms()) {
            tracing::info!(peer = %self.link.peer, "timeout: {what}; closing");
        }
        if handshaking {
            return;
        }
        self.http
            .answer_timeout(kind, &mut self.out, &self.link, cx);
        self.prepare_close();
    }

    /// The deadline passed and it was a `Trim`: memory is given back and the connection stays
    /// open (true); any other deadline is a real timeout (false).
    pub fn trim_if_due(&mut self, cx: &ConnCx<'_>) -> bool {
        if self.next_deadline(cx).1 != Timeout::Trim {
            return false;
        }
        self.http.trim();
        true
    }

    /// The connection is about to be closed by the worker: queue close_notify if the session
    /// is established (the driver then makes one attempt to send it; nobody waits for the
    /// peer's).
    pub fn prepare_close(&mut self) {
        if let Transport::Tls(tls) = &mut self.transport {
            let _ = tls.close_notify();
        }
    }

    /// Idle connections hold no buffers: return the empty ones to the worker's pool.
    pub fn release_idle_buffers(&mut self, pool: &mut BufPool) {
        self.give_back_buffers(pool, false);
    }

    /// Gives back buffers when the connection closes.
    pub fn recycle(&mut self, pool: &mut BufPool) {
        self.give_back_buffers(pool, true);
    }

    /// `all`: the connection is closing, so buffers still holding input go back too (output
    /// buffers only once sent: a queued segment may still point into them).
    fn give_back_buffers(&mut self, pool: &mut BufPool, all: bool) {
        if all {
            self.http.recycle(pool);
        } else {
            self.http.release_idle_buffer(pool);
        }
        if self.out.is_empty() {
            if let Some(b) = self.out.take_buf() {
                pool.give_write(b);
            }
        }
        if let Transport::Tls(tls) = &mut self.transport {
            if all {
                tls.recycle(pool);
            } else {
                tls.release_idle_buffers(pool);
            }
        }
    }
}

/// The plain transport sends the protocol's output as it is: memory by `writev`, files by
/// `sendfile`.
pub(crate) fn plain_transmit<'a>(out: &'a Output, iov: &mut [IoSlice<'a>]) -> Transmit {
    if out.is_empty() {
        return Transmit::Nothing;
    }
    if let Some((file, offset, len)) = out.front_file() {
        return Transmit::File {
            file: file.as_raw_fd(),
            offset,
            len,
        };
    }
    let (count, more) = out.memory_slices(iov, usize::MAX);
    Transmit::Memory { count, more }
}

/// Counts and logs (rate-limited) a failed TLS session.
fn tls_failed(failure: tern_tls::TlsFailure, handshaking: bool, link: &Link, cx: &mut ConnCx<'_>) {
    use tern_tls::TlsFailure as F;
    let counter = match failure {
        F::BadRecord => Counter::TlsFailedBadRecord,
        F::NoSharedParams => Counter::TlsFailedNoSharedParams,
        F::PeerAlert => Counter::TlsFailedPeerAlert,
        F::Other => Counter::TlsFailedOther,
    };
    cx.stats.bump(counter);
    if ratelog::admit(counter.name(), cx.clock.now_ms()) {
        let when = if handshaking { "handshake" } else { "session" };
        tracing::info!(peer = %link.peer, "TLS {when} failed: {}", counter.name());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Idle keep-alive connections must stay cheap (the target is ≤ 512 bytes of RSS each,
    /// slab slot and kernel-side bookkeeping in user space included), on either backend
    /// (io_uring's keeps a slot of its own per socket).
    #[test]
    fn an_idle_connection_is_small() {
        use tern_runtime::io::{EpollIo, UringIo};
        let conn = std::mem::size_of::<Conn>();
        let epoll = conn + std::mem::size_of::<crate::driver::Socket<EpollIo>>();
        assert!(epoll <= 256, "Conn and its epoll socket are {epoll} bytes");
        let uring = conn
            + std::mem::size_of::<crate::driver::Socket<UringIo>>()
            + UringIo::BYTES_PER_SOCKET;
        assert!(
            uring <= 384,
            "Conn and its io_uring socket are {uring} bytes"
        );
    }
}
