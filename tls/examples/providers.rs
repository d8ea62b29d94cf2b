//! Server-side cost of TLS with each crypto provider rustls offers (aws-lc-rs, ring), measured
//! in memory with no sockets: a full TLS 1.3 handshake with an ECDSA P-256 certificate, a
//! resumed TLS 1.3 handshake (ticket), a full TLS 1.2 handshake, and bulk encryption of
//! 16 KiB records (AES-128-GCM). Only the server's calls are timed; the client runs untimed.
//! The two providers run interleaved, so drift on the machine hits both alike.
//!
//!   cargo run --release -p tern-tls --example providers

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

struct Pair {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

fn configs(
    provider: CryptoProvider,
    ticketer: Arc<dyn rustls::server::ProducesTickets>,
    tls12: bool,
    resume: bool,
) -> Pair {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert: CertificateDer<'static> = made.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let provider = Arc::new(provider);
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    server.send_tls13_tickets = 1;
    server.ticketer = ticketer;
    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !resume {
        client.resumption = rustls::client::Resumption::disabled();
    } else {
        client.resumption = rustls::client::Resumption::store(Arc::new(
            rustls::client::ClientSessionMemoryCache::new(16),
        ));
    }
    Pair {
        server: Arc::new(server),
        client: Arc::new(client),
    }
}

/// Moves records both ways until the handshake is over; returns the server's time.
fn handshake(pair: &Pair) -> (Duration, ServerConnection, ClientConnection) {
    let mut server = ServerConnection::new(pair.server.clone()).unwrap();
    let mut client = ClientConnection::new(
        pair.client.clone(),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let mut spent = Duration::ZERO;
    let mut buf = Vec::new();
    while client.is_handshaking() || server.is_handshaking() || server.wants_write() {
        buf.clear();
        while client.wants_write() {
            client.write_tls(&mut buf).unwrap();
        }
        let t = Instant::now();
        let mut rest = &buf[..];
        while !rest.is_empty() {
            server.read_tls(&mut rest).unwrap();
            server.process_new_packets().unwrap();
        }
        let mut out = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut out).unwrap();
        }
        spent += t.elapsed();
        let mut rest = &out[..];
        while !rest.is_empty() {
            client.read_tls(&mut rest).unwrap();
            client.process_new_packets().unwrap();
        }
        if buf.is_empty() && out.is_empty() {
            break;
        }
    }
    (spent, server, client)
}

fn per_handshake(pair: &Pair, n: u32, resumed: bool) -> f64 {
    if resumed {
        handshake(pair); // fills the client's ticket cache
    }
    let mut total = Duration::ZERO;
    for _ in 0..n {
        let (t, server, _) = handshake(pair);
        if resumed {
            assert_eq!(
                server.handshake_kind(),
                Some(rustls::HandshakeKind::Resumed)
            );
        }
        total += t;
    }
    total.as_secs_f64() * 1e6 / f64::from(n)
}

fn bulk_mb_per_s(pair: &Pair, mib: usize) -> f64 {
    let (_, mut server, mut client) = handshake(pair);
    let chunk = vec![7u8; 16 * 1024];
    let mut sink = vec![0u8; 64 * 1024];
    let mut spent = Duration::ZERO;
    let mut out = Vec::with_capacity(64 * 1024);
    for _ in 0..mib * 64 {
        let t = Instant::now();
        server.writer().write_all(&chunk).unwrap();
        out.clear();
        while server.wants_write() {
            server.write_tls(&mut out).unwrap();
        }
        spent += t.elapsed();
        let mut rest = &out[..];
        while !rest.is_empty() {
            client.read_tls(&mut rest).unwrap();
            client.process_new_packets().unwrap();
            while client.reader().read(&mut sink).is_ok_and(|n| n > 0) {}
        }
    }
    mib as f64 / spent.as_secs_f64() * 1.048576
}

fn main() {
    let aws = || rustls::crypto::aws_lc_rs::default_provider();
    let ring = || rustls::crypto::ring::default_provider();
    println!("server-side cost, in memory, median of 5 interleaved rounds (lower µs is better)");
    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![
        ("full TLS 1.3 ECDSA P-256 (µs)", vec![], vec![]),
        ("resumed TLS 1.3 (µs)", vec![], vec![]),
        ("full TLS 1.2 ECDSA P-256 (µs)", vec![], vec![]),
        ("resumed TLS 1.2 (µs)", vec![], vec![]),
        ("bulk 16 KiB records (MB/s)", vec![], vec![]),
    ];
    for _ in 0..5 {
        for i in 0..2 {
            let make = || if i == 0 { aws() } else { ring() };
            let ticketer = || -> Arc<dyn rustls::server::ProducesTickets> {
                if i == 0 {
                    rustls::crypto::aws_lc_rs::Ticketer::new().unwrap()
                } else {
                    rustls::crypto::ring::Ticketer::new().unwrap()
                }
            };
            let full13 = configs(make(), ticketer(), false, false);
            let res13 = configs(make(), ticketer(), false, true);
            let full12 = configs(make(), ticketer(), true, false);
            let res12 = configs(make(), ticketer(), true, true);
            let values = [
                per_handshake(&full13, 300, false),
                per_handshake(&res13, 300, true),
                per_handshake(&full12, 300, false),
                per_handshake(&res12, 300, true),
                bulk_mb_per_s(&full13, 64),
            ];
            for (row, v) in rows.iter_mut().zip(values) {
                if i == 0 {
                    row.1.push(v)
                } else {
                    row.2.push(v)
                }
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!(
        "{:<34} {:>10} {:>10} {:>8}",
        "", "aws-lc-rs", "ring", "aws/ring"
    );
    for (name, mut a, mut r) in rows {
        let (a, r) = (median(&mut a), median(&mut r));
        println!("{name:<34} {a:>10.1} {r:>10.1} {:>8.2}", a / r);
    }
}
