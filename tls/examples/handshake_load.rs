//! A load of full TLS 1.3 handshakes from a rustls client offering one key exchange group,
//! for `bench/pq-handshakes` (bench/tlsload's OpenSSL 3.0 cannot offer X25519MLKEM768).
//! Each connection: connect, full handshake (no session offered), `GET PATH` with
//! `Connection: close`, read to the end, close; `--conns` threads do so until `--seconds` are
//! up. The server's certificate is not checked (a load generator trusts anyone; the test
//! suite checks the chain), which keeps the client's own cost down. Every handshake must
//! negotiate the group asked for. Prints one line:
//!   handshakes=N seconds=S group=NAME
//!
//!   cargo run --release -p tern-tls --example handshake_load -- 127.0.0.1:PORT \
//!       [--group x25519mlkem768|x25519] [--seconds 5] [--conns 8] [--path /]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{aws_lc_rs, SupportedKxGroup};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};

/// Accepts any certificate and signature (see the file's comment).
#[derive(Debug)]
struct TrustAnyone;

impl ServerCertVerifier for TrustAnyone {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![
            SignatureScheme::ECDSA_NISTP256_SHA256,
            SignatureScheme::ECDSA_NISTP384_SHA384,
            SignatureScheme::RSA_PSS_SHA256,
            SignatureScheme::ED25519,
        ]
    }
}

fn config(group: &'static dyn SupportedKxGroup) -> Arc<ClientConfig> {
    let mut provider = aws_lc_rs::default_provider();
    provider.kx_groups = vec![group];
    provider.cipher_suites = vec![aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256];
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(TrustAnyone))
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// One connection: handshake, one request, the whole answer.
fn one(addr: &str, config: &Arc<ClientConfig>, request: &[u8], group: &dyn SupportedKxGroup) {
    let sock = TcpStream::connect(addr).expect("connect");
    sock.set_nodelay(true).ok();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = ClientConnection::new(config.clone(), name).expect("a client");
    let mut tls = StreamOwned::new(conn, sock);
    tls.write_all(request).expect("the request");
    let mut answer = Vec::new();
    // The server closes after its answer (close_notify, then EOF).
    let _ = tls.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "answer {:?}",
        &answer[..answer.len().min(40)]
    );
    let got = tls.conn.negotiated_key_exchange_group().map(|g| g.name());
    assert_eq!(got, Some(group.name()), "the group negotiated");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .expect("usage: handshake_load ADDR [--group G] [--seconds S] [--conns C] [--path P]");
    let (mut group, mut seconds, mut conns, mut path) =
        ("x25519mlkem768".to_string(), 5u64, 8usize, "/".to_string());
    while let Some(flag) = args.next() {
        let value = args.next().expect("a value after each flag");
        match flag.as_str() {
            "--group" => group = value,
            "--seconds" => seconds = value.parse().expect("seconds"),
            "--conns" => conns = value.parse().expect("conns"),
            "--path" => path = value,
            other => panic!("unknown flag {other}"),
        }
    }
    let kx: &'static dyn SupportedKxGroup = match group.as_str() {
        "x25519mlkem768" => aws_lc_rs::kx_group::X25519MLKEM768,
        "x25519" => aws_lc_rs::kx_group::X25519,
        other => panic!("unknown group {other}"),
    };
    let config = config(kx);
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let (addr, config, request, done) =
                (addr.clone(), config.clone(), request.clone(), done.clone());
            std::thread::spawn(move || {
                while Instant::now() < until {
                    one(&addr, &config, request.as_bytes(), kx);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a load thread");
    }
    println!(
        "handshakes={} seconds={:.3} group={group}",
        done.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
}
