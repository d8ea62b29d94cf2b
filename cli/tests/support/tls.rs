//! Helpers for the HTTPS end-to-end tests (`tests/https.rs`): a test CA and certificates made
//! with rcgen, `tern serve`/`tern demo` started with HTTPS listeners, a blocking rustls client
//! that speaks HTTP/1.1 (keep-alive, pipelining), and runners for `curl` and `openssl`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

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

use crate::support::{eventually, find, Failed, Resp, READ_TIMEOUT, TERN};

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
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, "tern test CA");
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

/// One HTTPS connection (blocking rustls over a `TcpStream`) that can keep alive and pipeline.
pub struct TlsClient {
    pub tls: StreamOwned<ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

impl TlsClient {
    /// Connects and completes the handshake, sending `name` as SNI (if the config enables it).
    pub fn connect(addr: SocketAddr, config: &Arc<ClientConfig>, name: &str) -> TlsClient {
        TlsClient::try_connect(addr, config, name)
            .unwrap_or_else(|e| panic!("TLS connection to {addr} as {name:?}: {e}"))
    }

    pub fn try_connect(
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
        Ok(TlsClient {
            tls,
            buf: Vec::new(),
        })
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
        Ok(TlsClient {
            tls: StreamOwned::new(conn, sock),
            buf: Vec::new(),
        })
    }

    pub fn conn(&self) -> &ClientConnection {
        &self.tls.conn
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

    pub fn send(&mut self, bytes: &[u8]) {
        self.tls.write_all(bytes).unwrap();
        self.tls.flush().unwrap();
    }

    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.send(&crate::support::request_bytes(method, path, headers));
        self.read_response(method == "HEAD")
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.request("GET", path, headers)
    }

    pub fn read_response(&mut self, head_only: bool) -> Resp {
        self.try_read_response(head_only)
            .unwrap_or_else(|e| panic!("reading a response over TLS: {e}"))
    }

    pub fn try_read_response(&mut self, head_only: bool) -> Result<Resp, String> {
        let end = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end;
            }
            if self.fill(64 * 1024)? == 0 {
                return Err(format!(
                    "connection closed before a full head; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ));
            }
        };
        let head = String::from_utf8(self.buf[..end].to_vec()).map_err(|e| e.to_string())?;
        self.buf.drain(..end + 4);
        let mut resp = parse_head(&head)?;
        let no_body =
            head_only || matches!(resp.status, 304 | 204) || (100..200).contains(&resp.status);
        if no_body {
            return Ok(resp);
        }
        let len = resp
            .content_length()
            .ok_or("no Content-Length on a response with a body")? as usize;
        while self.buf.len() < len {
            if self.fill(64 * 1024)? == 0 {
                return Err(format!(
                    "connection closed after {} of {len} body bytes",
                    self.buf.len()
                ));
            }
        }
        let rest = self.buf.split_off(len);
        resp.body = std::mem::replace(&mut self.buf, rest);
        Ok(resp)
    }

    /// Reads exactly `n` plaintext bytes (after what is buffered), at most `step` per read.
    pub fn read_exact_raw(&mut self, n: usize, step: usize) -> Vec<u8> {
        while self.buf.len() < n {
            let want = step.min(n - self.buf.len());
            match self.fill(want) {
                Ok(0) => panic!("connection closed after {} of {n} bytes", self.buf.len()),
                Ok(_) => {}
                Err(e) => panic!("after {} of {n} bytes: {e}", self.buf.len()),
            }
        }
        let rest = self.buf.split_off(n);
        std::mem::replace(&mut self.buf, rest)
    }

    /// How the server ended the connection, waiting up to `limit`: `Ok(())` for close_notify
    /// (a clean TLS end), `Err` naming what else happened (data, a bare TCP close, a timeout).
    pub fn end(&mut self, limit: Duration) -> Result<(), String> {
        if !self.buf.is_empty() {
            return Err(format!("{} unread bytes", self.buf.len()));
        }
        self.tls.sock.set_read_timeout(Some(limit)).unwrap();
        let mut chunk = [0u8; 4096];
        let r = loop {
            match self.tls.read(&mut chunk) {
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                r => break r,
            }
        };
        self.tls.sock.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
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
        self.tls.conn.send_close_notify();
        let _ = self.tls.conn.complete_io(&mut self.tls.sock);
    }

    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    fn fill(&mut self, max: usize) -> Result<usize, String> {
        let mut chunk = vec![0u8; max];
        loop {
            match self.tls.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }
}

fn parse_head(head: &str) -> Result<Resp, String> {
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default().to_owned();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    if !version.starts_with("HTTP/1.") {
        return Err(format!("bad status line {status_line:?}"));
    }
    let mut headers = Vec::new();
    for line in lines {
        let (n, v) = line
            .split_once(':')
            .ok_or_else(|| format!("bad header line {line:?}"))?;
        headers.push((n.to_owned(), v.trim().to_owned()));
    }
    Ok(Resp {
        status,
        version,
        headers,
        body: Vec::new(),
    })
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

/// A running `tern serve`/`tern demo` with HTTPS, killed (SIGKILL) and reaped when dropped.
pub struct TlsServer {
    pub child: Child,
    /// The start-up line.
    pub line: String,
    pub https: SocketAddr,
    /// Plain HTTP, when `--listen` was given.
    pub http: Option<SocketAddr>,
    /// The `--redirect-http` listener.
    pub redirect: Option<SocketAddr>,
    stderr: Arc<Mutex<Vec<u8>>>,
    status: Option<ExitStatus>,
}

impl TlsServer {
    /// `tern serve DIR --workers 2 --listen-tls 127.0.0.1:0 EXTRA...`.
    pub fn serve(dir: &Path, extra: &[&str]) -> TlsServer {
        let mut cmd = Command::new(TERN);
        cmd.arg("serve")
            .arg(dir)
            .args(["--workers", "2", "--listen-tls", "127.0.0.1:0"])
            .args(extra);
        TlsServer::start(cmd)
    }

    /// `tern demo --data DATA --workers 2 --listen-tls 127.0.0.1:0 EXTRA...`.
    pub fn demo(data: &Path, extra: &[&str]) -> TlsServer {
        let mut cmd = Command::new(TERN);
        cmd.arg("demo")
            .arg("--data")
            .arg(data)
            .args(["--workers", "2", "--listen-tls", "127.0.0.1:0"])
            .args(extra);
        TlsServer::start(cmd)
    }

    /// Spawns `cmd` and waits (15 s at most) for its start-up line.
    pub fn start(mut cmd: Command) -> TlsServer {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("TERN_LOG");
        let mut child = cmd.spawn().expect("spawn tern");
        let stderr = drain(child.stderr.take().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(15));
        let mut server = TlsServer {
            child,
            line: String::new(),
            https: "0.0.0.0:0".parse().unwrap(),
            http: None,
            redirect: None,
            stderr,
            status: None,
        };
        let Ok(line) = line else {
            panic!("tern printed no start-up line within 15 s")
        };
        server.line = line.trim_end().to_owned();
        match parse_listeners(&server.line) {
            Some((https, http, redirect)) => {
                server.https = https;
                server.http = http;
                server.redirect = redirect;
            }
            None => {
                let _ = server.wait_exit(Duration::from_secs(2));
                panic!(
                    "unexpected start-up line {:?} (exit {:?}); stderr:\n{}",
                    server.line,
                    server.status,
                    server.stderr_text()
                );
            }
        }
        server
    }

    pub fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; the child is reaped only in Drop or wait.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid());
    }

    pub fn alive(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait().unwrap() {
            Some(st) => {
                self.status = Some(st);
                false
            }
            None => true,
        }
    }

    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while self.alive() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.status
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Lines of stderr containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.stderr_text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Sends SIGHUP and waits for the `n`-th log line of a reload; returns it.
    pub fn reload(&self, n: usize) -> String {
        self.signal(libc::SIGHUP);
        let found = eventually(Duration::from_secs(5), || {
            self.log_lines("reload (SIGHUP)").len() >= n
        });
        assert!(
            found,
            "no log line for reload {n} within 5 s; stderr:\n{}",
            self.stderr_text()
        );
        self.log_lines("reload (SIGHUP)")[n - 1].clone()
    }

    pub fn tls(&self, config: &Arc<ClientConfig>, name: &str) -> TlsClient {
        TlsClient::connect(self.https, config, name)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The HTTPS, plain and redirect listeners named in a start-up line such as
/// `tern: serving /d on http://A and https://B and http://C (redirect to https) with 2 workers`.
pub fn parse_listeners(line: &str) -> Option<(SocketAddr, Option<SocketAddr>, Option<SocketAddr>)> {
    let (_, rest) = line.split_once(" on ")?;
    let (listeners, _) = rest.split_once(" with ")?;
    let (mut https, mut http, mut redirect) = (None, None, None);
    for part in listeners.split(" and ") {
        if let Some(addr) = part.strip_prefix("https://") {
            https = Some(addr.parse().ok()?);
        } else if let Some(addr) = part.strip_suffix(" (redirect to https)") {
            redirect = Some(addr.strip_prefix("http://")?.parse().ok()?);
        } else {
            http = Some(part.strip_prefix("http://")?.parse().ok()?);
        }
    }
    Some((https?, http, redirect))
}

fn drain(mut r: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
    });
    buf
}

// ---------------------------------------------------------------------------------------------
// External tools
// ---------------------------------------------------------------------------------------------

/// Whether `tool` can be run (`tool ARG` exits at all). Tests print why they skip.
pub fn have(tool: &str, arg: &str) -> bool {
    let ok = Command::new(tool)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        eprintln!("SKIPPED: `{tool}` is not installed");
    }
    ok
}

/// Runs `cmd` with `input` on its stdin (then closed), bounded by `limit`.
pub fn run_with_input(cmd: &mut Command, input: &[u8], limit: Duration) -> Failed {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still running after {limit:?}; stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.lock().unwrap()),
                String::from_utf8_lossy(&err.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(50));
    let stdout = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err.lock().unwrap()).into_owned();
    Failed {
        status,
        stdout,
        stderr,
    }
}
