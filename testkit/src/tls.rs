//! The TLS side of the test client: [`TlsClient`] ([`Client`] over a blocking rustls
//! session), and [`AnyCert`], a verifier for clients that must accept any certificate.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};

use crate::http1::{Client, Transport, READ_TIMEOUT};

/// Accepts any certificate, whatever its name, issuer or dates; the handshake's signatures
/// must still check out with the certificate shown. For tests where a certificate that does
/// not match the name asked for is the point (SNI), or that are shown one made at start-up.
#[derive(Debug)]
pub struct AnyCert(Arc<CryptoProvider>);

impl AnyCert {
    /// Checking signatures with aws-lc-rs (the workspace's provider).
    pub fn new() -> AnyCert {
        AnyCert::with_provider(Arc::new(aws_lc_rs::default_provider()))
    }

    pub fn with_provider(provider: Arc<CryptoProvider>) -> AnyCert {
        AnyCert(provider)
    }
}

impl Default for AnyCert {
    fn default() -> AnyCert {
        AnyCert::new()
    }
}

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A blocking rustls session over a `TcpStream`.
pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

impl Transport for TlsStream {
    fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

/// One HTTPS connection that can keep alive and pipeline ([`Client`] over TLS).
pub type TlsClient = Client<TlsStream>;

impl Client<TlsStream> {
    /// Connects and completes the handshake, sending `name` as SNI (if the config enables it).
    pub fn connect_tls(addr: SocketAddr, config: &Arc<ClientConfig>, name: &str) -> TlsClient {
        TlsClient::try_connect_tls(addr, config, name)
            .unwrap_or_else(|e| panic!("TLS connection to {addr} as {name:?}: {e}"))
    }

    pub fn try_connect_tls(
        addr: SocketAddr,
        config: &Arc<ClientConfig>,
        name: &str,
    ) -> Result<TlsClient, String> {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("connect: {e}"))?;
        TlsClient::handshake(sock, config, name)
    }

    /// Runs the handshake over an already connected socket.
    pub fn handshake(
        sock: TcpStream,
        config: &Arc<ClientConfig>,
        name: &str,
    ) -> Result<TlsClient, String> {
        sock.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        sock.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
        sock.set_nodelay(true).unwrap();
        let server_name = ServerName::try_from(name.to_owned()).unwrap();
        let conn = ClientConnection::new(config.clone(), server_name).unwrap();
        let mut tls = StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn
                .complete_io(&mut tls.sock)
                .map_err(|e| format!("handshake: {e}"))?;
        }
        Ok(Client::over(tls))
    }

    /// Runs the handshake writing our records at most `piece` bytes at a time, with `pause`
    /// between the pieces (a client on a slow or fragmenting network).
    pub fn handshake_dribbled(
        mut sock: TcpStream,
        config: &Arc<ClientConfig>,
        name: &str,
        piece: usize,
        pause: Duration,
    ) -> Result<TlsClient, String> {
        sock.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        sock.set_nodelay(true).unwrap();
        let server_name = ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = ClientConnection::new(config.clone(), server_name).unwrap();
        loop {
            while conn.wants_write() {
                let mut out = Vec::new();
                conn.write_tls(&mut out).map_err(|e| e.to_string())?;
                for chunk in out.chunks(piece) {
                    sock.write_all(chunk).map_err(|e| format!("write: {e}"))?;
                    std::thread::sleep(pause);
                }
            }
            if !conn.is_handshaking() {
                break;
            }
            match conn.read_tls(&mut sock) {
                Ok(0) => return Err("the server closed during the handshake".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("read: {e}")),
            }
            conn.process_new_packets()
                .map_err(|e| format!("handshake: {e}"))?;
        }
        Ok(Client::over(StreamOwned::new(conn, sock)))
    }

    pub fn conn(&self) -> &ClientConnection {
        &self.stream.conn
    }

    pub fn resumed(&self) -> bool {
        self.conn().handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    }

    pub fn version(&self) -> Option<rustls::ProtocolVersion> {
        self.conn().protocol_version()
    }

    pub fn alpn(&self) -> Option<&[u8]> {
        self.conn().alpn_protocol()
    }

    /// The server's leaf certificate.
    pub fn leaf(&self) -> CertificateDer<'static> {
        self.conn()
            .peer_certificates()
            .and_then(|c| c.first())
            .expect("a server certificate")
            .clone()
    }

    /// `bytes` encrypted into TLS records as the session would send them, but not sent.
    pub fn seal(&mut self, bytes: &[u8]) -> Vec<u8> {
        let conn = &mut self.stream.conn;
        conn.writer().write_all(bytes).unwrap();
        let mut records = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut records).unwrap();
        }
        records
    }

    /// How the server ended the connection, waiting up to `limit`: `Ok(())` for close_notify
    /// (a clean TLS end), `Err` naming what else happened (data, a bare TCP close, a timeout).
    pub fn end(&mut self, limit: Duration) -> Result<(), String> {
        if self.buffered() > 0 {
            return Err(format!("{} unread bytes", self.buffered()));
        }
        self.stream.sock.set_read_timeout(Some(limit)).unwrap();
        let mut chunk = [0u8; 4096];
        let r = loop {
            match self.stream.read(&mut chunk) {
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                r => break r,
            }
        };
        self.restore_timeout();
        match r {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!(
                "{n} more bytes: {:?}",
                String::from_utf8_lossy(&chunk[..n])
            )),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                Err("TCP closed without close_notify".into())
            }
            Err(e) => Err(format!("read: {e} ({:?})", e.kind())),
        }
    }

    /// Sends our close_notify (a polite client's goodbye).
    pub fn close(&mut self) {
        self.stream.conn.send_close_notify();
        let _ = self.stream.conn.complete_io(&mut self.stream.sock);
    }
}

/// The first flight of a TLS 1.3 client (its ClientHello records), for tests that send a
/// handshake by hand.
pub fn client_hello(config: &Arc<ClientConfig>) -> Vec<u8> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = ClientConnection::new(config.clone(), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}
