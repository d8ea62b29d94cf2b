//! The upstream half of a relay as a byte stream for the one socket loop (`driver::pump`):
//! the bytes the relay has for the upstream server go out (`RelayHost::relay_send_buf`), its
//! answer comes in (`relay_recv_buf`, `relay_recv`), the end and failures are reported
//! (`relay_closed`). When the upstream speaks TLS, the session sits here, between the relay
//! and the socket, as a client's TLS sits inside its `Conn`: plaintext is encrypted into a
//! buffer of records the loop sends as it would any bytes, and records the loop reads are
//! decrypted into the relay's buffer. So the loop is the same for both kinds of socket and
//! both transports, and what it sends stays put until it is sent (a completion backend may
//! hold it meanwhile).
//!
//! Also here: the TLS session alone ([`TlsRecords`]), for its handshake and for the look at a
//! pooled connection before it is reused, through the same loop.

use std::io::IoSlice;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tern_runtime::io::Waiting;
use tern_runtime::BufPool;
use tern_tls::{ClientSession, Plaintext};

use super::records::Records;
use super::relay::RelayNeed;
use super::relay_host::RelayHost;
use super::stream::Stream;
use super::types::{Action, Transmit};
use crate::exchange::ConnCx;
use crate::handler::ExchangeId;

/// Plaintext encrypted per batch of records: one batch is sent before the next is made, so
/// a slow upstream holds no more than a plain connection's socket buffer would.
const TLS_WRITE_CHUNK: usize = 16 * 1024;

/// A TLS client session with an upstream server, driven without I/O.
pub(crate) struct TlsClient {
    session: ClientSession,
    /// Ciphertext read, and records to send.
    records: Records,
    /// The socket's stream ended (told to the session once what came before is taken).
    eof: bool,
    /// The socket failed.
    broken: bool,
    /// The session failed: why (a failed handshake is counted and logged by its cause).
    failure: Option<rustls::Error>,
    /// close_notify was asked for (a tunnel's client ended its side).
    closing: bool,
}

/// Where a handshake stands after the loop ran it.
pub(crate) enum Handshake {
    Done,
    /// Waiting for the upstream.
    Pending,
    /// The session failed (its error), or the connection did (`None`).
    Failed(Option<rustls::Error>),
}

impl TlsClient {
    pub fn new(
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> Result<TlsClient, rustls::Error> {
        Ok(TlsClient {
            session: ClientSession::connect(config, name)?,
            records: Records::default(),
            eof: false,
            broken: false,
            failure: None,
            closing: false,
        })
    }

    fn usable(&self) -> bool {
        self.failure.is_none() && !self.broken
    }

    /// Once the records made last are all sent: makes the next ones, from `plaintext` (up to
    /// a chunk of it) and whatever the session has to say itself (handshake messages,
    /// alerts, close_notify). Returns how much of `plaintext` the session took.
    fn fill(&mut self, plaintext: &[u8], pool: &mut BufPool) -> usize {
        if self.records.sending() {
            return 0;
        }
        let mut taken = 0;
        if !plaintext.is_empty() && !self.session.is_handshaking() && self.usable() {
            let chunk = &plaintext[..plaintext.len().min(TLS_WRITE_CHUNK)];
            taken = self.session.write_plaintext(&[IoSlice::new(chunk)]);
        }
        if self.session.wants_write() {
            if let Some(outbuf) = self.records.next_batch(pool) {
                self.session.encode(outbuf);
            }
        }
        taken
    }

    fn transmit<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> Transmit {
        self.records.transmit(iov)
    }

    fn sent(&mut self, n: usize) {
        self.records.sent(n);
    }

    fn recv_buf(&mut self, pool: &mut BufPool) -> &mut [u8] {
        let buf = self.records.inbuf.get_or_insert_with(|| pool.take_read());
        buf.compact();
        buf.spare_mut()
    }

    fn filled(&mut self, n: usize) {
        self.records.filled(n);
    }

    /// Feeds the ciphertext read so far to the session, as much as it takes (it stops when
    /// its buffer of decrypted bytes is full), then the end of the stream once all before it
    /// is taken. On a failure the session is dead; its alert waits in the next records.
    fn decrypt(&mut self) {
        if !self.usable() {
            return;
        }
        if let Some(buf) = self.records.inbuf.as_mut().filter(|b| !b.is_empty()) {
            match self.session.feed(buf.data()) {
                Ok(n) => buf.consume(n),
                Err(e) => {
                    buf.consume(buf.len());
                    self.failure = Some(e);
                    return;
                }
            }
        }
        if self.eof && self.records.read_all_taken() {
            self.session.feed_eof();
        }
    }

    /// What a connection between exchanges holds (after the loop read what had come):
    /// decrypted or undecrypted bytes nobody asked for, its end, or nothing.
    pub fn waiting(&mut self) -> Waiting {
        if !self.usable() || self.eof {
            return Waiting::Closed;
        }
        if !self.records.read_all_taken() {
            return Waiting::Bytes;
        }
        match self.session.waiting() {
            Plaintext::Data(_) => Waiting::Bytes,
            Plaintext::Closed => Waiting::Closed,
            Plaintext::Empty => Waiting::Nothing,
        }
    }

    /// Gives back the buffers that hold nothing (between exchanges, and before closing).
    pub fn release_buffers(&mut self, pool: &mut BufPool) {
        self.records.release_idle(pool);
    }
}

/// The upstream half of relay `id` of a connection, over the connection's upstream socket
/// (with its TLS session, if any), for as long as the relay needs I/O (`RelayNeed::Io`).
pub(crate) struct UpstreamView<'a, H: RelayHost> {
    conn: &'a mut H,
    id: ExchangeId,
    tls: Option<&'a mut TlsClient>,
    moved: bool,
}

impl<'a, H: RelayHost> UpstreamView<'a, H> {
    pub fn new(conn: &'a mut H, id: ExchangeId, tls: Option<&'a mut TlsClient>) -> Self {
        UpstreamView {
            conn,
            id,
            tls,
            moved: false,
        }
    }

    /// Anything moved: bytes went either way, or the relay heard of an end or a failure.
    pub fn moved(&self) -> bool {
        self.moved
    }

    fn relaying(&self) -> bool {
        matches!(self.conn.relay_need(self.id), RelayNeed::Io)
    }

    /// TLS: hands decrypted bytes to the relay as far as it takes them, then the end if it
    /// came. True if anything moved.
    fn deliver(&mut self, cx: &mut ConnCx<'_>) -> bool {
        let Some(tls) = self.tls.as_deref_mut() else {
            return false;
        };
        let mut moved = false;
        loop {
            if !matches!(self.conn.relay_need(self.id), RelayNeed::Io) {
                return moved;
            }
            tls.decrypt();
            if !tls.usable() {
                self.conn.relay_closed(self.id, true, cx);
                return true;
            }
            let buf = self.conn.relay_recv_buf(self.id, cx);
            if buf.is_empty() {
                return moved; // the relay takes nothing now: the rest waits in the session
            }
            match tls.session.read_plaintext(buf) {
                Plaintext::Data(n) => {
                    self.conn.relay_recv(self.id, n, cx);
                    moved = true;
                }
                Plaintext::Closed => {
                    self.conn.relay_closed(self.id, false, cx);
                    return true;
                }
                // (`decrypt` fed all it could: the session holds back ciphertext only while
                // it has decrypted bytes to give.)
                Plaintext::Empty => return moved,
            }
        }
    }
}

impl<H: RelayHost> Stream for UpstreamView<'_, H> {
    const ONE_SLICE: bool = true;

    fn poll_transmit<'a>(&'a mut self, cx: &mut ConnCx<'_>, iov: &mut [IoSlice<'a>]) -> Transmit {
        if let Some(tls) = self.tls.as_deref_mut() {
            let taken = tls.fill(self.conn.relay_send_buf(self.id), cx.buffers);
            if taken > 0 {
                // In the session: as good as sent for the relay (the records follow).
                self.conn.relay_sent(self.id, taken, cx);
                self.moved = true;
            }
        }
        let this: &'a Self = self;
        match this.tls.as_deref() {
            Some(tls) => tls.transmit(iov),
            None => {
                let buf = this.conn.relay_send_buf(this.id);
                if buf.is_empty() {
                    return Transmit::Nothing;
                }
                iov[0] = IoSlice::new(buf);
                Transmit::Memory {
                    count: 1,
                    more: false,
                }
            }
        }
    }

    fn handle_sent(&mut self, n: usize, cx: &mut ConnCx<'_>) {
        match self.tls.as_deref_mut() {
            Some(tls) => tls.sent(n),
            None => self.conn.relay_sent(self.id, n, cx),
        }
        self.moved |= n > 0;
    }

    fn seal(&mut self) {
        // TLS records are made only once the previous ones are all sent: they stay put.
        if self.tls.is_none() {
            self.conn.relay_seal(self.id);
        }
    }

    fn poll_action(&mut self, cx: &mut ConnCx<'_>) -> Action {
        if !self.relaying() {
            return Action::Wait; // connecting, released or closed: the relay's step goes on
        }
        // Decrypted bytes the relay had no room for earlier: first those.
        if self.deliver(cx) {
            self.moved = true;
            return Action::Transmit;
        }
        if self.conn.relay_wants_shutdown(self.id) {
            // Over TLS the end is close_notify, sent before the FIN.
            if let Some(tls) = self.tls.as_deref_mut().filter(|t| !t.closing) {
                tls.closing = true;
                tls.session.close();
                return Action::Transmit;
            }
            return Action::ShutdownWrite;
        }
        Action::Read
    }

    fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8] {
        match self.tls.as_deref_mut() {
            None => self.conn.relay_recv_buf(self.id, cx),
            Some(tls) => {
                // No room in the relay: read nothing, as from a plain upstream.
                if !tls.usable() || self.conn.relay_recv_buf(self.id, cx).is_empty() {
                    return &mut [];
                }
                tls.recv_buf(cx.buffers)
            }
        }
    }

    fn handle_recv(&mut self, n: usize, cx: &mut ConnCx<'_>) {
        self.moved = true;
        match self.tls.as_deref_mut() {
            None => self.conn.relay_recv(self.id, n, cx),
            Some(tls) => {
                tls.filled(n);
                self.deliver(cx);
            }
        }
    }

    fn handle_eof(&mut self, cx: &mut ConnCx<'_>) {
        self.moved = true;
        match self.tls.as_deref_mut() {
            None => self.conn.relay_closed(self.id, false, cx),
            Some(tls) => {
                tls.eof = true;
                self.deliver(cx);
            }
        }
    }

    fn handle_write_shutdown(&mut self, _cx: &mut ConnCx<'_>) {
        self.moved = true;
        self.conn.relay_shut_down(self.id);
    }

    fn handle_error(&mut self, cx: &mut ConnCx<'_>) {
        self.moved = true;
        if let Some(tls) = self.tls.as_deref_mut() {
            tls.broken = true;
        }
        self.conn.relay_closed(self.id, true, cx);
    }

    fn is_idle(&self) -> bool {
        false
    }
}

/// An upstream connection's TLS session on its own, no relay: its handshake, or a look at
/// what a pooled connection holds before it goes back to the pool.
pub(crate) struct TlsRecords<'a> {
    tls: &'a mut TlsClient,
    /// Stop reading once the handshake is done (else: read what waits).
    handshake: bool,
}

impl<'a> TlsRecords<'a> {
    pub fn handshake(tls: &'a mut TlsClient) -> Self {
        TlsRecords {
            tls,
            handshake: true,
        }
    }

    pub fn look(tls: &'a mut TlsClient) -> Self {
        TlsRecords {
            tls,
            handshake: false,
        }
    }

    /// After the loop ran the handshake.
    pub fn handshake_state(&mut self) -> Handshake {
        if let Some(e) = self.tls.failure.take() {
            self.tls.broken = true; // the error is handed out once; the session stays dead
            return Handshake::Failed(Some(e));
        }
        if self.tls.broken || self.tls.eof {
            return Handshake::Failed(None);
        }
        if self.tls.session.is_handshaking() {
            Handshake::Pending
        } else {
            Handshake::Done
        }
    }
}

impl Stream for TlsRecords<'_> {
    const ONE_SLICE: bool = true;

    fn poll_transmit<'a>(&'a mut self, cx: &mut ConnCx<'_>, iov: &mut [IoSlice<'a>]) -> Transmit {
        self.tls.fill(&[], cx.buffers);
        let this: &'a Self = self;
        this.tls.transmit(iov)
    }

    fn handle_sent(&mut self, n: usize, _cx: &mut ConnCx<'_>) {
        self.tls.sent(n);
    }

    fn seal(&mut self) {
        // Records are made only once the previous ones are all sent: they stay put.
    }

    fn poll_action(&mut self, _cx: &mut ConnCx<'_>) -> Action {
        let over = !self.tls.usable() || self.tls.eof;
        let done = if self.handshake {
            !self.tls.session.is_handshaking()
        } else {
            self.tls.waiting() != Waiting::Nothing
        };
        if over || done {
            Action::Wait
        } else {
            Action::Read
        }
    }

    fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8] {
        self.tls.recv_buf(cx.buffers)
    }

    fn handle_recv(&mut self, n: usize, _cx: &mut ConnCx<'_>) {
        self.tls.filled(n);
        self.tls.decrypt();
    }

    fn handle_eof(&mut self, _cx: &mut ConnCx<'_>) {
        self.tls.eof = true;
        self.tls.decrypt();
    }

    fn handle_write_shutdown(&mut self, _cx: &mut ConnCx<'_>) {}

    fn handle_error(&mut self, _cx: &mut ConnCx<'_>) {
        self.tls.broken = true;
    }

    fn is_idle(&self) -> bool {
        false
    }
}
