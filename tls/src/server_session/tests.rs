//! The server session against rustls's own client, in memory: handshakes of each protection,
//! data both ways, key updates both ways, close_notify, resumption, and hostile records.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::ClientConnection;

use super::{Received, TlsSession};
use crate::{CertFiles, TlsAcceptor, TlsFailure, TlsOptions, MAX_PLAINTEXT};

fn acceptor() -> (TlsAcceptor, rcgen::CertifiedKey<rcgen::KeyPair>) {
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
    (acceptor, made)
}

/// A client config trusting `made`, limited to `suites` (all of the provider's if empty).
fn client_config(
    made: &rcgen::CertifiedKey<rcgen::KeyPair>,
    suites: &[rustls::SupportedCipherSuite],
) -> Arc<rustls::ClientConfig> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if !suites.is_empty() {
        provider.cipher_suites = suites.to_vec();
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add(made.cert.der().clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::in_memory_sessions(8);
    Arc::new(config)
}

/// The server's end, kept as the connection keeps it: bytes read and not yet consumed.
struct Server {
    session: TlsSession,
    inbuf: Vec<u8>,
    got: Vec<u8>,
    closed: bool,
}

impl Server {
    fn new(acceptor: &TlsAcceptor) -> Server {
        Server {
            session: acceptor.accept(),
            inbuf: Vec::new(),
            got: Vec::new(),
            closed: false,
        }
    }

    fn input(&mut self, bytes: &[u8]) -> Result<(), TlsFailure> {
        self.inbuf.extend_from_slice(bytes);
        loop {
            let handshaking = self.session.is_handshaking();
            match self.session.receive(&mut self.inbuf)? {
                Received::More { taken, .. } => {
                    self.inbuf.drain(..taken);
                    if taken == 0 && handshaking == self.session.is_handshaking() {
                        return Ok(());
                    }
                }
                Received::Data { data, taken } => {
                    self.got.extend_from_slice(&self.inbuf[data]);
                    self.inbuf.drain(..taken);
                }
                Received::Closed { taken } => {
                    self.inbuf.drain(..taken);
                    self.closed = true;
                    return Ok(());
                }
            }
        }
    }

    /// Seals `data` in records of at most `MAX_PLAINTEXT`, with the control records.
    fn send(&mut self, data: &[u8]) -> Vec<u8> {
        let mut wire = self.control();
        for piece in data.chunks(MAX_PLAINTEXT) {
            let (front, back) = self.session.record_frame().expect("may seal");
            let mut record = vec![0u8; front + piece.len() + back];
            record[front..front + piece.len()].copy_from_slice(piece);
            let n = self.session.seal(&mut record, piece.len());
            wire.extend_from_slice(&record[..n]);
            wire.extend(self.control());
        }
        wire
    }

    fn control(&mut self) -> Vec<u8> {
        let mut out = vec![0u8; 1 << 20];
        let n = self.session.take_control(&mut out);
        out.truncate(n);
        out
    }
}

fn to_client(client: &mut ClientConnection, wire: &[u8]) -> Result<Vec<u8>, rustls::Error> {
    let mut rest = wire;
    let mut got = Vec::new();
    while !rest.is_empty() {
        client.read_tls(&mut rest).unwrap();
        client.process_new_packets()?;
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = client.reader().read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    }
    Ok(got)
}

fn from_client(client: &mut ClientConnection) -> Vec<u8> {
    let mut wire = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut wire).unwrap();
    }
    wire
}

/// Handshakes; the client's first data goes with its last flight.
fn connect(
    acceptor: &TlsAcceptor,
    config: Arc<rustls::ClientConfig>,
    first: &[u8],
) -> (Server, ClientConnection) {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut client = ClientConnection::new(config, name).unwrap();
    client.writer().write_all(first).unwrap();
    let mut server = Server::new(acceptor);
    for _ in 0..10 {
        server.input(&from_client(&mut client)).unwrap();
        let wire = server.control();
        to_client(&mut client, &wire).unwrap();
        if !server.session.is_handshaking() && !client.is_handshaking() && !client.wants_write() {
            break;
        }
    }
    assert!(!server.session.is_handshaking() && !client.is_handshaking());
    (server, client)
}

fn suites() -> Vec<(&'static str, Vec<rustls::SupportedCipherSuite>)> {
    use rustls::crypto::aws_lc_rs::cipher_suite as cs;
    vec![
        ("tls13-aes128", vec![cs::TLS13_AES_128_GCM_SHA256]),
        ("tls13-aes256", vec![cs::TLS13_AES_256_GCM_SHA384]),
        ("tls13-chacha", vec![cs::TLS13_CHACHA20_POLY1305_SHA256]),
        (
            "tls12-aes128",
            vec![cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256],
        ),
        (
            "tls12-aes256",
            vec![cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384],
        ),
        (
            "tls12-chacha",
            vec![cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256],
        ),
    ]
}

#[test]
fn every_suite_carries_data_both_ways_and_closes_cleanly() {
    let (acceptor, made) = acceptor();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    for (name, suites) in suites() {
        let (mut server, mut client) = connect(
            &acceptor,
            client_config(&made, &suites),
            b"GET / HTTP/1.1\r\n\r\n",
        );
        server.input(&from_client(&mut client)).unwrap();
        assert_eq!(server.got, b"GET / HTTP/1.1\r\n\r\n", "{name}");
        let wire = server.send(&data);
        assert!(
            to_client(&mut client, &wire).unwrap() == data,
            "{name}: 300 KB arrive"
        );
        // A large upload, in the client's own records.
        server.got.clear();
        for chunk in data.chunks(40_000) {
            client.writer().write_all(chunk).unwrap();
            // Fed in uneven pieces: records complete only across reads.
            for piece in from_client(&mut client).chunks(7_001) {
                server.input(piece).unwrap();
            }
        }
        assert!(server.got == data, "{name}: the upload arrives");
        // close_notify both ways.
        server.session.close();
        let wire = server.control();
        to_client(&mut client, &wire).unwrap();
        assert!(
            client.process_new_packets().unwrap().peer_has_closed(),
            "{name}"
        );
        client.send_close_notify();
        server.input(&from_client(&mut client)).unwrap();
        assert!(server.closed, "{name}");
        assert!(
            server.session.record_frame().is_none(),
            "no data after close_notify"
        );
    }
}

#[test]
fn key_updates_work_both_ways() {
    let (acceptor, made) = acceptor();
    let (mut server, mut client) = connect(&acceptor, client_config(&made, &[]), b"");
    // The client updates its key and asks for ours.
    client.refresh_traffic_keys().unwrap();
    client.writer().write_all(b"after the update").unwrap();
    server.input(&from_client(&mut client)).unwrap();
    assert_eq!(server.got, b"after the update");
    let wire = server.send(b"ours changed too");
    assert_eq!(to_client(&mut client, &wire).unwrap(), b"ours changed too");
    // Our key reaches its limit: the update follows the record that reached it.
    server.session.set_tx_limit(3);
    let many: Vec<u8> = vec![b'x'; 5 * MAX_PLAINTEXT];
    let wire = server.send(&many);
    assert!(to_client(&mut client, &wire).unwrap() == many);
    client.writer().write_all(b"still").unwrap();
    server.input(&from_client(&mut client)).unwrap();
    assert!(server.got.ends_with(b"still"));
}

#[test]
fn a_resumed_session_says_so() {
    let (acceptor, made) = acceptor();
    let config = client_config(&made, &[]);
    let (server, _) = connect(&acceptor, config.clone(), b"");
    assert!(!server.session.resumed());
    let (server, _) = connect(&acceptor, config, b"");
    assert!(
        server.session.resumed(),
        "the ticket from the first is used"
    );
}

#[test]
fn an_altered_record_is_refused_with_an_alert_the_client_reads() {
    let (acceptor, made) = acceptor();
    let (mut server, mut client) = connect(&acceptor, client_config(&made, &[]), b"");
    client.writer().write_all(b"hello").unwrap();
    let mut wire = from_client(&mut client);
    let last = wire.len() - 1;
    wire[last] ^= 1;
    assert_eq!(server.input(&wire), Err(TlsFailure::BadRecord));
    let alert = server.control();
    let err = to_client(&mut client, &alert).unwrap_err();
    assert!(
        matches!(
            err,
            rustls::Error::AlertReceived(rustls::AlertDescription::BadRecordMac)
        ),
        "{err:?}"
    );
    assert!(server.session.record_frame().is_none(), "dead");
    assert_eq!(
        server.session.receive(&mut [23, 3, 3, 0, 1, 0]),
        Ok(Received::More {
            taken: 6,
            want: None
        }),
        "a dead session takes and ignores everything"
    );
}

#[test]
fn garbage_fails_the_handshake_with_an_alert() {
    let (acceptor, _) = acceptor();
    let mut s = acceptor.accept();
    let err = s
        .receive(&mut [0x16, 0x03, 0x01, 0x00, 0x04, 1, 0, 0, 0])
        .unwrap_err();
    assert_eq!(err, TlsFailure::BadRecord);
    let mut out = [0u8; 64];
    let n = s.take_control(&mut out);
    assert_eq!(out[..n].first(), Some(&0x15), "{:?}", &out[..n]);
}

#[test]
fn an_oversized_record_is_refused_in_both_phases() {
    let (acceptor, made) = acceptor();
    let mut s = acceptor.accept();
    let mut huge = vec![0x16, 3, 3, 0xff, 0xff];
    huge.resize(100, 0);
    assert!(s.receive(&mut huge).is_err());
    let (mut server, _) = connect(&acceptor, client_config(&made, &[]), b"");
    assert_eq!(
        server.input(&[23, 3, 3, 0xff, 0xff]),
        Err(TlsFailure::BadRecord)
    );
}

#[test]
fn a_partial_record_asks_for_its_length() {
    let (acceptor, made) = acceptor();
    let (mut server, mut client) = connect(&acceptor, client_config(&made, &[]), b"");
    client.writer().write_all(&[1u8; 10_000]).unwrap();
    let wire = from_client(&mut client);
    let mut part = wire[..100].to_vec();
    assert_eq!(
        server.session.receive(&mut part),
        Ok(Received::More {
            taken: 0,
            want: Some(wire.len())
        })
    );
}

#[test]
fn a_flood_of_key_updates_is_refused() {
    let (acceptor, made) = acceptor();
    let (mut server, mut client) = connect(&acceptor, client_config(&made, &[]), b"");
    let mut failed = None;
    for i in 0..40 {
        client.refresh_traffic_keys().unwrap();
        // refresh_traffic_keys queues the update for the next write.
        client.writer().write_all(b"").unwrap();
        let wire = from_client(&mut client);
        if let Err(e) = server.input(&wire) {
            failed = Some((i, e));
            break;
        }
        let reply = server.control();
        to_client(&mut client, &reply).unwrap();
    }
    assert_eq!(failed.map(|(_, e)| e), Some(TlsFailure::BadRecord));
}

/// Cuts the plaintext handshake records at the front of `wire` (up to the first other
/// record) into records of `size` bytes of payload; the rest goes as it was.
fn refragment(wire: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= wire.len() && wire[at] == 0x16 {
        let len = u16::from_be_bytes([wire[at + 3], wire[at + 4]]) as usize;
        for piece in wire[at + 5..at + 5 + len].chunks(size) {
            out.extend_from_slice(&wire[at..at + 3]);
            out.extend_from_slice(&(piece.len() as u16).to_be_bytes());
            out.extend_from_slice(piece);
        }
        at += 5 + len;
    }
    out.extend_from_slice(&wire[at..]);
    out
}

#[test]
fn a_handshake_cut_into_tiny_records_completes() {
    let (acceptor, made) = acceptor();
    for (name, suites) in suites() {
        for size in [1, 2, 7, 100] {
            let name_ = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut client = ClientConnection::new(client_config(&made, &suites), name_).unwrap();
            client.writer().write_all(b"hi").unwrap();
            let mut server = Server::new(&acceptor);
            for _ in 0..10 {
                let wire = refragment(&from_client(&mut client), size);
                // Fed in pieces that cut records anywhere, as reads would.
                for piece in wire.chunks(13) {
                    server.input(piece).unwrap();
                }
                to_client(&mut client, &server.control()).unwrap();
                if !server.session.is_handshaking() && !client.wants_write() {
                    break;
                }
            }
            assert!(
                !server.session.is_handshaking(),
                "{name}, {size}-byte records"
            );
            assert_eq!(server.got, b"hi", "{name}, {size}-byte records");
        }
    }
}

#[test]
fn a_client_hello_over_several_records_asks_for_the_next_header() {
    let (acceptor, made) = acceptor();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut client = ClientConnection::new(client_config(&made, &[]), name).unwrap();
    let wire = refragment(&from_client(&mut client), 100);
    let mut s = acceptor.accept();
    // Exactly the first record: it is taken (gathered), and a header is what comes next.
    let mut first = wire[..105].to_vec();
    assert_eq!(
        s.receive(&mut first),
        Ok(Received::More {
            taken: 105,
            want: Some(5)
        })
    );
    let mut part = wire[105..108].to_vec();
    assert_eq!(
        s.receive(&mut part),
        Ok(Received::More {
            taken: 0,
            want: Some(5)
        })
    );
    let mut part = wire[105..115].to_vec();
    assert_eq!(
        s.receive(&mut part),
        Ok(Received::More {
            taken: 0,
            want: Some(105)
        })
    );
}

/// The alert record `s` has for the peer, in plaintext.
fn plaintext_alert(s: &mut TlsSession) -> Vec<u8> {
    let mut out = [0u8; 64];
    let n = s.take_control(&mut out);
    out[..n].to_vec()
}

#[test]
fn a_handshake_message_too_large_to_accept_fails_at_once() {
    let (acceptor, _) = acceptor();
    let mut s = acceptor.accept();
    let got = s.receive(&mut [0x16, 0x03, 0x01, 0x00, 0x04, 0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(got, Err(TlsFailure::BadRecord));
    assert_eq!(
        plaintext_alert(&mut s),
        [0x15, 3, 3, 0, 2, 2, 50],
        "decode_error"
    );
    // A ClientHello of 64 KiB + 1 in full records: refused on its first.
    let mut s = acceptor.accept();
    let mut record = vec![0x16, 3, 1, 0x40, 0x00, 1, 0x01, 0x00, 0x00];
    record.resize(5 + 0x4000, 0);
    assert_eq!(s.receive(&mut record), Err(TlsFailure::BadRecord));
    assert_eq!(
        plaintext_alert(&mut s),
        [0x15, 3, 3, 0, 2, 2, 50],
        "decode_error"
    );
}

#[test]
fn a_record_inside_a_handshake_message_is_refused() {
    let (acceptor, _) = acceptor();
    let mut s = acceptor.accept();
    // Half a ClientHello, then a ChangeCipherSpec.
    let mut wire = vec![0x16, 3, 1, 0, 4, 1, 0, 0, 100, 0x14, 3, 3, 0, 1, 1];
    assert_eq!(s.receive(&mut wire), Err(TlsFailure::BadRecord));
    assert_eq!(
        plaintext_alert(&mut s),
        [0x15, 3, 3, 0, 2, 2, 10],
        "unexpected_message"
    );
}

/// The client's end of an established session, as records made by hand (to send what
/// rustls's client never would), with `client`'s keys.
fn client_records(client: ClientConnection) -> crate::record::RecordLayer {
    use crate::record::Protection;
    let version = client.protocol_version();
    let secrets = client.dangerous_extract_secrets().unwrap();
    let protection = match (version, &secrets.tx.1) {
        (Some(rustls::ProtocolVersion::TLSv1_3), _) => Protection::Tls13,
        (_, rustls::ConnectionTrafficSecrets::Chacha20Poly1305 { .. }) => Protection::Tls12ChaCha,
        _ => Protection::Tls12Gcm,
    };
    crate::record::RecordLayer::new(protection, secrets.tx, secrets.rx, u64::MAX)
        .unwrap_or_else(|_| panic!("a supported suite"))
}

fn extracting(config: Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = (*config).clone();
    config.enable_secret_extraction = true;
    Arc::new(config)
}

/// Opens every record of `wire` with `rx`: (content type, payload) each.
fn open_all(rx: &mut crate::record::RecordLayer, wire: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut wire = wire.to_vec();
    let mut got = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let len = crate::record::record_len(&wire[at..]).unwrap();
        let record = &mut wire[at..at + len];
        let opened = rx.open(record).unwrap();
        got.push((opened.content_type, record[opened.payload].to_vec()));
        at += len;
    }
    got
}

#[test]
fn a_key_update_split_across_records_is_taken() {
    use crate::record::content;
    let (acceptor, made) = acceptor();
    let config = extracting(client_config(&made, &[]));
    let (mut server, client) = connect(&acceptor, config, b"");
    let mut ours = client_records(client);
    let mut wire = Vec::new();
    ours.seal_to(content::HANDSHAKE, &[24, 0], &mut wire);
    ours.seal_to(content::HANDSHAKE, &[0, 1, 1], &mut wire);
    server.input(&wire).unwrap();
    // The server updated its key as asked: its KeyUpdate comes under the old one.
    let reply = open_all(&mut ours, &server.control());
    assert_eq!(reply, vec![(content::HANDSHAKE, vec![24, 0, 0, 1, 0])]);
    // And it changed the key it reads with: a record under the old one fails.
    let mut stale = Vec::new();
    ours.seal_to(content::APPLICATION_DATA, b"old key", &mut stale);
    assert_eq!(server.input(&stale), Err(TlsFailure::BadRecord));
}

#[test]
fn malformed_key_updates_get_the_alerts_rfc_8446_names() {
    use crate::record::content;
    let (acceptor, made) = acceptor();
    let cases: [(&[&[u8]], u8); 5] = [
        (&[&[24, 0, 0, 1, 2]], 47),     // request_update 2: illegal_parameter
        (&[&[24, 0, 0, 0]], 50),        // no body: decode_error
        (&[&[24, 0, 0, 2, 1, 0]], 50),  // a body too long: decode_error
        (&[&[24, 0, 0, 1, 0, 24]], 10), // not at its record's end: unexpected_message
        (&[&[24, 0], b""], 10),         // an empty handshake record: unexpected_message
    ];
    for (records, description) in cases {
        let config = extracting(client_config(&made, &[]));
        let (mut server, client) = connect(&acceptor, config, b"");
        let mut ours = client_records(client);
        let mut wire = Vec::new();
        for record in records {
            ours.seal_to(content::HANDSHAKE, record, &mut wire);
        }
        assert_eq!(
            server.input(&wire),
            Err(TlsFailure::BadRecord),
            "{records:?}"
        );
        let reply = open_all(&mut ours, &server.control());
        assert_eq!(
            reply,
            vec![(content::ALERT, vec![2, description])],
            "{records:?}"
        );
    }
    // Half a KeyUpdate, then data: unexpected_message.
    let config = extracting(client_config(&made, &[]));
    let (mut server, client) = connect(&acceptor, config, b"");
    let mut ours = client_records(client);
    let mut wire = Vec::new();
    ours.seal_to(content::HANDSHAKE, &[24, 0, 0], &mut wire);
    ours.seal_to(content::APPLICATION_DATA, b"data", &mut wire);
    assert_eq!(server.input(&wire), Err(TlsFailure::BadRecord));
    let reply = open_all(&mut ours, &server.control());
    assert_eq!(reply, vec![(content::ALERT, vec![2, 10])]);
}

#[test]
fn a_tls12_renegotiation_is_declined_with_a_warning_and_the_session_goes_on() {
    use crate::record::content;
    let (acceptor, made) = acceptor();
    for (name, suites) in suites().into_iter().filter(|(n, _)| n.starts_with("tls12")) {
        let config = extracting(client_config(&made, &suites));
        let (mut server, client) = connect(&acceptor, config, b"");
        let mut ours = client_records(client);
        // A ClientHello (its body need not make sense: it is skipped), in two records.
        let mut hello = vec![1, 0, 0, 200];
        hello.resize(204, 9);
        let mut wire = Vec::new();
        ours.seal_to(content::HANDSHAKE, &hello[..50], &mut wire);
        ours.seal_to(content::HANDSHAKE, &hello[50..], &mut wire);
        ours.seal_to(content::APPLICATION_DATA, b"still here", &mut wire);
        server.input(&wire).unwrap();
        let reply = open_all(&mut ours, &server.control());
        assert_eq!(
            reply,
            vec![(content::ALERT, vec![1, 100])],
            "{name}: warning no_renegotiation"
        );
        assert_eq!(server.got, b"still here", "{name}");
    }
}

#[test]
fn a_hello_retry_with_the_second_client_hello_in_tiny_records_completes() {
    use rustls::crypto::aws_lc_rs::kx_group;
    let (acceptor, made) = acceptor();
    // The client's first group is one the server lacks: its key share is for that one, so
    // the server asks again (HelloRetryRequest) for X25519.
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![kx_group::MLKEM1024, kx_group::X25519];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(made.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut client = ClientConnection::new(Arc::new(config), name).unwrap();
    let mut server = Server::new(&acceptor);
    for _ in 0..10 {
        // The first ClientHello, then (after a ChangeCipherSpec) the second, in 3-byte records.
        let wire = from_client(&mut client);
        let ccs = if wire.first() == Some(&0x14) { 6 } else { 0 };
        let mut cut = wire[..ccs].to_vec();
        cut.extend(refragment(&wire[ccs..], 3));
        for piece in cut.chunks(11) {
            server.input(piece).unwrap();
        }
        to_client(&mut client, &server.control()).unwrap();
        if !server.session.is_handshaking() && !client.wants_write() {
            break;
        }
    }
    assert!(!server.session.is_handshaking() && !client.is_handshaking());
    assert_eq!(
        client.negotiated_key_exchange_group().map(|g| g.name()),
        Some(rustls::NamedGroup::X25519)
    );
}

#[test]
fn a_refusal_after_the_server_spoke_is_sealed_by_rustls() {
    use rustls::crypto::aws_lc_rs::cipher_suite as cs;
    let (acceptor, made) = acceptor();
    let config = client_config(&made, &[cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut client = ClientConnection::new(config, name).unwrap();
    let mut server = Server::new(&acceptor);
    server.input(&from_client(&mut client)).unwrap();
    to_client(&mut client, &server.control()).unwrap();
    // TLS 1.2: ClientKeyExchange, ChangeCipherSpec, Finished. Half the first, then a CCS.
    let flight = from_client(&mut client);
    assert_eq!(flight[0], 0x16);
    let len = u16::from_be_bytes([flight[3], flight[4]]) as usize;
    let mut wire = vec![0x16, 3, 3];
    wire.extend_from_slice(&((len / 2) as u16).to_be_bytes());
    wire.extend_from_slice(&flight[5..5 + len / 2]);
    wire.extend_from_slice(&[0x14, 3, 3, 0, 1, 1]);
    assert_eq!(server.input(&wire), Err(TlsFailure::BadRecord));
    // The server's flight was in plaintext, so is rustls's alert: decode_error, what it says
    // to the oversized header it is shown.
    assert_eq!(
        plaintext_alert(&mut server.session),
        [0x15, 3, 3, 0, 2, 2, 50]
    );
}
