//! Helpers for the HTTPS end-to-end tests (`tests/https.rs`), on top of `support` (whose
//! `Tern` runs the server and whose `Client` speaks HTTP/1.1 over any `Transport`): a test CA
//! and certificates made with rcgen, rustls client configurations, the TLS `Client`
//! (`TlsClient`), and `tern serve`/`tern demo` started with an HTTPS listener.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme,
    StreamOwned, SupportedProtocolVersion,
};

use crate::support::{demo_command, serve_command, Client, Tern, Transport, READ_TIMEOUT};

// ---------------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------------

/// A test certificate authority (ECDSA P-256) that signs leaf certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, as PEM and DER.
#[derive(Clone)]
pub struct Leaf {
    /// The subject's common name, to tell certificates apart in messages.
    pub label: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new() -> Ca {
        Ca::named("tern test CA")
    }

    /// A CA with its own common name (two CAs of one name are told apart only by signature).
    pub fn named(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// Writes the CA certificate as `dir/ca.pem` (for curl and openssl).
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.pem()).unwrap();
        path
    }

    /// A leaf for `names` (DNS names or IP addresses) with common name `label`.
    pub fn issue(&self, label: &str, names: &[&str]) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, label);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            label: label.to_owned(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// Roots trusting only this CA.
    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.der()).unwrap();
        roots
    }
}

impl Leaf {
    /// Writes `dir/STEM.pem` (the chain: the leaf) and `dir/STEM.key`; returns both paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        self.write_to(&cert, &key);
        (cert, key)
    }

    /// Writes the certificate and key over `cert` and `key` (each replaced atomically).
    pub fn write_to(&self, cert: &Path, key: &Path) {
        replace_file(cert, self.cert_pem.as_bytes());
        replace_file(key, self.key_pem.as_bytes());
    }
}

/// Writes `data` to a temporary file beside `path` and renames it over `path`.
pub fn replace_file(path: &Path, data: &[u8]) {
    let tmp = path.with_extension("writing");
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `--tls-cert CERT --tls-key KEY`.
pub fn cert_key_args(cert: &Path, key: &Path) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        cert.to_str().unwrap().into(),
        "--tls-key".into(),
        key.to_str().unwrap().into(),
    ]
}

/// Which of `leaves` a connection's server certificate is (by DER), as its label.
pub fn which<'a>(got: &CertificateDer<'_>, leaves: &[&'a Leaf]) -> &'a str {
    leaves
        .iter()
        .find(|l| l.der.as_ref() == got.as_ref())
        .map(|l| l.label.as_str())
        .unwrap_or("an unknown certificate")
}

// ---------------------------------------------------------------------------------------------
// Client configurations
// ---------------------------------------------------------------------------------------------

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(aws_lc_rs::default_provider())
}

pub const TLS13: &SupportedProtocolVersion = &rustls::version::TLS13;
pub const TLS12: &SupportedProtocolVersion = &rustls::version::TLS12;

/// A client trusting only `ca`, limited to `versions`, offering ALPN `http/1.1`, with an
/// in-memory session cache (so a second connection from the same config tries to resume).
pub fn client_config(ca: &Ca, versions: &[&'static SupportedProtocolVersion]) -> ClientConfig {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// A client that accepts any certificate (whose signatures still have to check out), for the
/// SNI tests, where a certificate that does not match the name asked for is the point.
pub fn any_cert_config(versions: &[&'static SupportedProtocolVersion]) -> ClientConfig {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider())))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);

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

// ---------------------------------------------------------------------------------------------
// The client connection
// ---------------------------------------------------------------------------------------------

/// A blocking rustls session over a `TcpStream`.
pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

impl Transport for TlsStream {
    fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

/// One HTTPS connection that can keep alive and pipeline (`support::Client` over TLS).
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
        self.stream
            .sock
            .set_read_timeout(Some(READ_TIMEOUT))
            .unwrap();
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

// ---------------------------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------------------------

/// `--listen-tls 127.0.0.1:0`: an HTTPS listener on a free port.
pub const LISTEN_TLS: &[&str] = &["--listen-tls", "127.0.0.1:0"];

impl Tern {
    /// `tern serve DIR --listen-tls 127.0.0.1:0 --workers 2 EXTRA...` (plain HTTP too only if
    /// EXTRA has `--listen`), waiting for the start-up line.
    pub fn serve_tls<S: AsRef<OsStr>>(dir: &Path, extra: &[S]) -> Tern {
        Tern::spawn(serve_command(dir, LISTEN_TLS, extra))
    }

    /// `tern demo --data DATA --listen-tls 127.0.0.1:0 --workers 2 EXTRA...`.
    pub fn demo_tls<S: AsRef<OsStr>>(data: &Path, extra: &[S]) -> Tern {
        Tern::spawn(demo_command(data, LISTEN_TLS, extra))
    }

    /// A TLS connection to the HTTPS listener, as `name`.
    pub fn tls(&self, config: &Arc<ClientConfig>, name: &str) -> TlsClient {
        TlsClient::connect_tls(self.https(), config, name)
    }
}
