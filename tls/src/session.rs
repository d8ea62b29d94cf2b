//! One TLS session, driven without I/O: ciphertext in, plaintext out, plaintext in, ciphertext
//! out. The server side of a client's connection ([`TlsSession`]) and the client side of a
//! connection to an upstream server ([`ClientSession`]) are the same code over rustls's two
//! connection types. This is the only place that calls rustls's connection API, so moving to
//! rustls 0.24's split connection changes this file alone.

use std::io::{self, IoSlice, Read};
use std::ops::DerefMut;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ConnectionCommon, ServerConnection};

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
    /// The peer sent close_notify (or its stream ended): no more data will come.
    Closed,
}

/// One TLS session over rustls's connection `C` (server or client).
pub struct Session<C> {
    conn: C,
}

/// The server side of a client's connection (made by [`crate::TlsAcceptor::accept`]).
pub type TlsSession = Session<ServerConnection>;

/// The client side of a connection to an upstream server.
pub type ClientSession = Session<ClientConnection>;

impl<C, D: 'static> Session<C>
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    pub(crate) fn new(conn: C) -> Session<C> {
        Session { conn }
    }

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

impl TlsSession {
    /// Feeds received ciphertext (see [`Session::read_plaintext`] for what comes out). Returns
    /// how much of `input` was taken: less than all when rustls's buffer of decrypted data is
    /// full (read plaintext, then feed the rest again). On an error the session is dead; an
    /// alert for the peer may be waiting in [`Session::encode`].
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, TlsFailure> {
        self.feed_records(input).map_err(|e| TlsFailure::of(&e))
    }
}

impl ClientSession {
    /// A session that will introduce itself as `name` (SNI, and the name the certificate is
    /// checked against).
    pub fn connect(
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> Result<ClientSession, rustls::Error> {
        ClientConnection::new(config, name).map(Session::new)
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

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, Read};
    use std::sync::Arc;

    use super::Plaintext;
    use crate::{CertFiles, TlsAcceptor, TlsFailure, TlsOptions};

    /// A server session with a rustls client in memory, handshake done.
    fn connected() -> (super::TlsSession, rustls::ClientConnection) {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        let acceptor = TlsAcceptor::new(&TlsOptions {
            certs: vec![CertFiles { cert, key }],
            ..Default::default()
        })
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(made.cert.der().clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut server = acceptor.accept();
        for _ in 0..10 {
            let mut to_server = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            server.feed(&to_server).unwrap();
            let mut to_client = Vec::new();
            server.encode(&mut to_client);
            let mut rest = &to_client[..];
            while !rest.is_empty() {
                client.read_tls(&mut rest).unwrap();
                client.process_new_packets().unwrap();
            }
        }
        assert!(!server.is_handshaking() && !client.is_handshaking());
        (server, client)
    }

    /// rustls takes only what fits its output buffer; a write that takes 0 means "encode the
    /// pending records first", after which writing goes on. Every byte must arrive.
    #[test]
    fn a_full_output_buffer_means_encode_then_write_more() {
        let (mut server, mut client) = connected();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut offset = 0;
        let mut wire = Vec::new();
        let mut zero_takes = 0;
        while offset < data.len() {
            let taken = server.write_plaintext(&[IoSlice::new(&data[offset..])]);
            if taken == 0 {
                zero_takes += 1;
                server.encode(&mut wire);
                assert!(zero_takes < 100, "no progress after encoding");
            }
            offset += taken;
        }
        server.encode(&mut wire);
        assert!(
            zero_takes > 0,
            "300 KB should overflow rustls's 64 KiB output buffer"
        );
        let mut got = Vec::new();
        let mut rest = &wire[..];
        let mut buf = vec![0u8; 65536];
        while !rest.is_empty() {
            client.read_tls(&mut rest).unwrap();
            client.process_new_packets().unwrap();
            while let Ok(n) = client.reader().read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        assert!(got == data, "got {} of {} bytes", got.len(), data.len());
        // And the other way: what the client sends comes out as plaintext.
        std::io::Write::write_all(&mut client.writer(), b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut to_server = Vec::new();
        client.write_tls(&mut to_server).unwrap();
        server.feed(&to_server).unwrap();
        let mut out = [0u8; 64];
        assert_eq!(server.read_plaintext(&mut out), Plaintext::Data(18));
        assert_eq!(server.read_plaintext(&mut out), Plaintext::Empty);
    }

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
