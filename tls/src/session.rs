//! The client side of a connection to an upstream server, driven without I/O over rustls's
//! buffered connection: ciphertext in, plaintext out, plaintext in, ciphertext out. (The
//! server side, where large answers go, seals records in place: `server_session.rs`.)

use std::io::{self, IoSlice, Read};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

/// Why a handshake or session failed; counted by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// Garbage, truncated or unexpected records, bad MACs, protocol violations.
    BadRecord,
    /// No version, cipher suite, group, signature scheme or ALPN protocol in common.
    NoSharedParams,
    /// The client sent a fatal alert (e.g. it does not trust our certificate).
    PeerAlert,
    Other,
}

impl TlsFailure {
    pub(crate) fn of(e: &rustls::Error) -> TlsFailure {
        use rustls::Error as E;
        match e {
            E::InvalidMessage(_)
            | E::DecryptError
            | E::InappropriateMessage { .. }
            | E::InappropriateHandshakeMessage { .. }
            | E::PeerMisbehaved(_)
            | E::PeerSentOversizedRecord => TlsFailure::BadRecord,
            E::PeerIncompatible(_) | E::NoApplicationProtocol => TlsFailure::NoSharedParams,
            E::AlertReceived(_) => TlsFailure::PeerAlert,
            _ => TlsFailure::Other,
        }
    }
}

/// What reading plaintext found.
#[derive(Debug, PartialEq, Eq)]
pub enum Plaintext {
    Data(usize),
    /// Nothing decrypted is waiting.
    Empty,
    /// The peer sent close_notify (or its stream ended): no more data will come.
    Closed,
}

/// The client side of a connection to an upstream server.
pub struct ClientSession {
    conn: ClientConnection,
}

impl ClientSession {
    /// Feeds received ciphertext and processes the records it completes. Returns how much of
    /// `input` was taken: less than all when rustls's buffer of decrypted data is full (read
    /// plaintext, then feed the rest again). On an error the session is dead; an alert for
    /// the peer may be waiting in [`Self::encode`].
    fn feed_records(&mut self, input: &[u8]) -> Result<usize, rustls::Error> {
        let mut rest = input;
        while !rest.is_empty() {
            match self.conn.read_tls(&mut rest) {
                // close_notify was received: whatever follows is ignored.
                Ok(0) => return Ok(input.len()),
                Ok(_) => {}
                // Backpressure: the decrypted-data buffer is full.
                Err(_) => break,
            }
            self.conn.process_new_packets()?;
        }
        Ok(input.len() - rest.len())
    }

    /// Moves decrypted bytes into `out`.
    pub fn read_plaintext(&mut self, out: &mut [u8]) -> Plaintext {
        match self.conn.reader().read(out) {
            Ok(0) if out.is_empty() => Plaintext::Empty,
            Ok(0) => Plaintext::Closed,
            Ok(n) => Plaintext::Data(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Plaintext::Empty,
            // UnexpectedEof: the peer closed the TCP stream without close_notify.
            Err(_) => Plaintext::Closed,
        }
    }

    /// Encrypts as much of `bufs` as rustls's output buffer takes; 0 means "encode (flush) the
    /// pending records first", not "stop".
    pub fn write_plaintext(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        io::Write::write_vectored(&mut self.conn.writer(), bufs).unwrap_or(0)
    }

    /// Appends every pending record (handshake messages, data, alerts) to `out`.
    pub fn encode(&mut self, out: &mut Vec<u8>) {
        while self.conn.wants_write() {
            match self.conn.write_tls(out) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }

    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Queues close_notify (idempotent); [`Self::encode`] then yields it.
    pub fn close(&mut self) {
        self.conn.send_close_notify();
    }

    /// The ALPN protocol agreed on, if any.
    pub fn alpn(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// True when this session was resumed from a ticket.
    pub fn resumed(&self) -> bool {
        self.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    }
}

impl ClientSession {
    /// A session that will introduce itself as `name` (SNI, and the name the certificate is
    /// checked against).
    pub fn connect(
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> Result<ClientSession, rustls::Error> {
        ClientConnection::new(config, name).map(|conn| ClientSession { conn })
    }

    /// As [`TlsSession::feed`], with rustls's own error (the upstream's failures are counted
    /// and logged by cause: `crate::upstream::failure_cause`).
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, rustls::Error> {
        self.feed_records(input)
    }

    /// The stream under the session ended: from now on reading plaintext says
    /// [`Plaintext::Closed`] once the data before the end is read (whether close_notify came
    /// or not: many servers close without it, and the HTTP framing tells a cut-short answer).
    pub fn feed_eof(&mut self) {
        let _ = self.conn.read_tls(&mut io::empty());
    }

    /// What the session holds that nobody has read: decrypted bytes (their count), the
    /// peer's close_notify, or nothing. A record that carries no data (a late session
    /// ticket) says nothing.
    pub fn waiting(&mut self) -> Plaintext {
        match self.conn.process_new_packets() {
            Ok(state) if state.plaintext_bytes_to_read() > 0 => {
                Plaintext::Data(state.plaintext_bytes_to_read())
            }
            Ok(state) if state.peer_has_closed() => Plaintext::Closed,
            Ok(_) => Plaintext::Empty,
            Err(_) => Plaintext::Closed,
        }
    }
}
