//! One server-side TLS session, driven without I/O: ciphertext in, plaintext out, plaintext in,
//! ciphertext out. This is the only place that calls rustls's connection API, so moving to
//! rustls 0.24's split connection changes this file alone.

use std::io::{self, IoSlice, Read};

use rustls::ServerConnection;

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
    fn of(e: &rustls::Error) -> TlsFailure {
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
    /// The peer sent close_notify: no more data will come.
    Closed,
}

pub struct TlsSession {
    conn: ServerConnection,
}

impl TlsSession {
    pub(crate) fn new(conn: ServerConnection) -> TlsSession {
        TlsSession { conn }
    }

    /// Feeds received ciphertext and processes the records it completes. Returns how much of
    /// `input` was taken: less than all when rustls's buffer of decrypted data is full (read
    /// plaintext, then feed the rest again). On an error the session is dead; an alert for
    /// the peer may be waiting in [`Self::encode`].
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, TlsFailure> {
        let mut rest = input;
        while !rest.is_empty() {
            match self.conn.read_tls(&mut rest) {
                // close_notify was received: whatever follows is ignored.
                Ok(0) => return Ok(input.len()),
                Ok(_) => {}
                // Backpressure: the decrypted-data buffer is full.
                Err(_) => break,
            }
            if let Err(e) = self.conn.process_new_packets() {
                return Err(TlsFailure::of(&e));
            }
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

#[cfg(test)]
mod tests {
    use crate::{TlsAcceptor, TlsFailure, TlsOptions};

    #[test]
    fn garbage_fails_with_an_alert_for_the_peer() {
        let acceptor = TlsAcceptor::new(&TlsOptions {
            self_signed: true,
            ..Default::default()
        })
        .unwrap();
        let mut s = acceptor.accept();
        let err = s
            .feed(&[0x16, 0x03, 0x01, 0x00, 0x04, 1, 0, 0, 0])
            .unwrap_err();
        assert_eq!(err, TlsFailure::BadRecord);
        let mut out = Vec::new();
        s.encode(&mut out);
        assert_eq!(out.first(), Some(&0x15), "{out:?}");
    }
}
