//! HTTPS end to end: the real `tern` binary with TLS listeners on ephemeral ports, talked to by
//! a rustls client, `curl` and `openssl s_client` (issue 11).
//!
//! Certificates come from a test CA made with rcgen in each test (ECDSA P-256): `default`
//! (localhost, 127.0.0.1), `exact` (www.example.test) and `wild` (*.wild.test). Which one a
//! handshake got is told apart by comparing the server's leaf with each certificate's DER.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{support, tls_support};
use rustls::{ClientConfig, ProtocolVersion};
use support::*;
use tls_support::*;

/// A site, a CA, three certificates written to files, and the CA file for curl/openssl.
struct Fixture {
    site: Site,
    ca: Ca,
    default: Leaf,
    exact: Leaf,
    wild: Leaf,
    ca_file: PathBuf,
    files: Vec<(PathBuf, PathBuf)>,
}

impl Fixture {
    fn new() -> Fixture {
        let site = Site::new();
        site.write("hello.txt", "hello over tls\n");
        let ca = Ca::new();
        let default = ca.issue("default", &["localhost", "127.0.0.1"]);
        let exact = ca.issue("exact", &["www.example.test"]);
        let wild = ca.issue("wild", &["*.wild.test"]);
        let ca_file = ca.write(site.base());
        let files = vec![
            default.write(site.base(), "default"),
            exact.write(site.base(), "exact"),
            wild.write(site.base(), "wild"),
        ];
        Fixture {
            site,
            ca,
            default,
            exact,
            wild,
            ca_file,
            files,
        }
    }

    fn base(&self) -> &Path {
        self.site.base()
    }

    /// `--tls-cert/--tls-key` for the first `n` certificates (the first is the default), then
    /// `extra`.
    fn cert_args(&self, n: usize, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = self.files[..n]
            .iter()
            .flat_map(|(cert, key)| cert_key_args(cert, key))
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// `tern serve` with all three certificates and `extra`.
    fn start(&self, extra: &[&str]) -> Tern {
        Tern::serve_tls(&self.site.root, &self.cert_args(3, extra))
    }

    /// `tern demo` on `DIR/data` with the default certificate, a plain listener too, and
    /// `extra`.
    fn demo(&self, extra: &[&str]) -> Tern {
        let mut args = self.cert_args(1, LISTEN);
        args.extend(extra.iter().map(|s| s.to_string()));
        Tern::demo_tls(&self.base().join("data"), &args)
    }

    /// A verifying client (trusts the test CA only) for `versions`.
    fn client(&self, versions: &[&'static rustls::SupportedProtocolVersion]) -> Arc<ClientConfig> {
        Arc::new(client_config(&self.ca, versions))
    }

    fn leaves(&self) -> [&Leaf; 3] {
        [&self.default, &self.exact, &self.wild]
    }
}

/// Reads raw bytes until the server closes (EOF or reset), at most `limit`; `None` if the
/// connection is still open then.
fn read_until_closed(sock: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.read(&mut chunk) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(got),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// What a server sent before closing on bad input: nothing, or TLS alert records only.
fn assert_only_alerts(got: &[u8], what: &str) {
    let mut rest = got;
    while !rest.is_empty() {
        assert!(
            rest.len() >= 7 && rest[0] == 0x15 && rest[3..5] == [0, 2],
            "{what}: the server sent {got:02x?}, not alert records"
        );
        assert_eq!(rest[5], 2, "{what}: a fatal alert, got {got:02x?}");
        rest = &rest[7..];
    }
}

/// `/statusz` of `tern demo` as `name → value`.
fn statusz(c: &mut TlsClient) -> std::collections::HashMap<String, u64> {
    let r = c.get("/statusz", &[]);
    assert_eq!(r.status, 200);
    r.text()
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Handshakes: versions, ALPN, SNI, resumption
// ---------------------------------------------------------------------------------------------

#[test]
fn tls13_and_tls12_handshakes_negotiate_http11() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    assert!(
        tern.line.starts_with(&format!(
            "tern: serving {}",
            fx.site.root.canonicalize().unwrap().display()
        )) && tern.line.ends_with(" with 2 workers")
            && tern.http().is_none(),
        "start-up line {:?}: HTTPS only when --listen is not given",
        tern.line
    );
    for (version, want) in [
        (TLS13, ProtocolVersion::TLSv1_3),
        (TLS12, ProtocolVersion::TLSv1_2),
    ] {
        let mut c = tern.tls(&fx.client(&[version]), "localhost");
        assert_eq!(c.version(), Some(want));
        assert_eq!(c.alpn(), Some(&b"http/1.1"[..]), "{want:?}: ALPN");
        assert_eq!(which(&c.leaf(), &fx.leaves()), "default");
        let r = c.get("/hello.txt", &[]);
        assert_eq!((r.status, r.text().as_str()), (200, "hello over tls\n"));
        assert_eq!(r.version, "HTTP/1.1");
        assert!(r.header("strict-transport-security").is_none(), "no --hsts");
    }
    // The certificate's IP address works as a name too.
    let mut c = tern.tls(&fx.client(&[TLS13]), "127.0.0.1");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
    // A client offering no ALPN at all is served HTTP/1.1.
    let mut config = client_config(&fx.ca, &[TLS13]);
    config.alpn_protocols.clear();
    let mut c = tern.tls(&Arc::new(config), "localhost");
    assert_eq!(c.alpn(), None);
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
    // A client offering h2 and http/1.1 gets h2 (cli/tests/http2.rs speaks it).
    let mut config = client_config(&fx.ca, &[TLS13]);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let c = tern.tls(&Arc::new(config), "localhost");
    assert_eq!(c.alpn(), Some(&b"h2"[..]));
}

#[test]
fn sni_picks_the_exact_name_then_the_wildcard_then_the_default() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    for version in [TLS13, TLS12] {
        let config = Arc::new(any_cert_config(&[version]));
        for (name, want) in [
            ("www.example.test", "exact"),
            ("WWW.Example.TEST", "exact"),
            ("api.wild.test", "wild"),
            ("x-1.wild.test", "wild"),
            // A wildcard covers one label only, and not the bare parent.
            ("a.b.wild.test", "default"),
            ("wild.test", "default"),
            ("unknown.test", "default"),
            ("example.test", "default"),
            ("localhost", "default"),
        ] {
            let mut c = tern.tls(&config, name);
            assert_eq!(
                which(&c.leaf(), &fx.leaves()),
                want,
                "SNI {name:?} over {version:?}"
            );
            assert_eq!(c.get("/hello.txt", &[]).status, 200, "SNI {name:?}");
        }
        // No SNI at all: the default certificate.
        let mut no_sni = any_cert_config(&[version]);
        no_sni.enable_sni = false;
        let mut c = tern.tls(&Arc::new(no_sni), "www.example.test");
        assert_eq!(which(&c.leaf(), &fx.leaves()), "default", "no SNI");
        assert_eq!(c.get("/hello.txt", &[]).status, 200);
    }
    // And the chosen certificates verify against the CA for their names.
    let verified = fx.client(&[TLS13, TLS12]);
    for name in ["www.example.test", "api.wild.test", "localhost"] {
        let mut c = tern.tls(&verified, name);
        assert_eq!(c.get("/hello.txt", &[]).status, 200, "{name}");
    }
}

#[test]
fn sessions_resume_over_tls13_and_tls12() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    for version in [TLS13, TLS12] {
        let config = fx.client(&[version]);
        // The first connection is a full handshake; reading an answer takes in the ticket.
        let mut first = tern.tls(&config, "localhost");
        assert_eq!(
            first.conn().handshake_kind(),
            Some(rustls::HandshakeKind::Full)
        );
        assert_eq!(first.get("/hello.txt", &[]).status, 200);
        first.close();
        drop(first);
        for i in 0..2 {
            let mut again = tern.tls(&config, "localhost");
            assert!(
                again.resumed(),
                "{version:?} connection {} was not resumed ({:?})",
                i + 2,
                again.conn().handshake_kind()
            );
            assert_eq!(again.alpn(), Some(&b"http/1.1"[..]));
            let r = again.get("/hello.txt", &[]);
            assert_eq!((r.status, r.text().as_str()), (200, "hello over tls\n"));
        }
    }
    // Sessions are kept per name: a session for one name is not offered for another, which
    // gets a full handshake and its own certificate.
    let config = Arc::new(any_cert_config(&[TLS13]));
    let mut a = tern.tls(&config, "api.wild.test");
    assert_eq!(a.get("/hello.txt", &[]).status, 200);
    let b = tern.tls(&config, "www.example.test");
    assert!(!b.resumed());
    assert_eq!(which(&b.leaf(), &fx.leaves()), "exact");
}

// ---------------------------------------------------------------------------------------------
// HTTP over TLS
// ---------------------------------------------------------------------------------------------

#[test]
fn keep_alive_and_pipelining_over_tls() {
    let fx = Fixture::new();
    fx.site.write_numbered(16);
    let tern = fx.start(&[]);
    let config = fx.client(&[TLS13]);
    let mut c = tern.tls(&config, "localhost");
    for i in 0..50 {
        let r = c.get(&format!("/n{:02}.txt", i % 16), &[]);
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(r.text(), format!("file number {}\n", i % 16));
        assert!(!r.closes(), "request {i} closed the connection");
    }
    // Sixteen requests in one write (a 404 and a HEAD among them), answered in order.
    sixteen_pipelined(&mut c);
    // A deep pipeline: 1000 requests (far more than one TLS record or rustls's plaintext
    // buffer) in one write, over TLS 1.2 this time.
    let mut c = tern.tls(&fx.client(&[TLS12]), "localhost");
    let mut batch = Vec::new();
    for i in 0..1000 {
        batch.extend(request_bytes("GET", &format!("/n{:02}.txt", i % 16), &[]));
    }
    c.send(&batch);
    for i in 0..1000 {
        let r = c.read_response(false);
        assert_eq!(
            r.text(),
            format!("file number {}\n", i % 16),
            "response {i}"
        );
    }
    assert_eq!(c.buffered(), 0, "nothing after the last answer");
    assert_eq!(c.get("/n00.txt", &[]).text(), "file number 0\n");

    // A request in one-byte TLS records.
    let mut c = tern.tls(&config, "localhost");
    for b in request_bytes("GET", "/n03.txt", &[("User-Agent", "tern-tests")]) {
        c.send(&[b]);
    }
    assert_eq!(c.read_response(false).text(), "file number 3\n");
    // A TLS 1.3 key update (ours, asking for the server's) in the middle of a session.
    c.stream.conn.refresh_traffic_keys().unwrap();
    for i in 0..3 {
        assert_eq!(
            c.get("/n04.txt", &[]).text(),
            "file number 4\n",
            "after key update, {i}"
        );
    }
}

#[test]
fn pipelined_requests_behind_a_large_answer_are_answered_over_tls() {
    // Answers past the output high-water mark (256 KiB) hold the next pipelined requests
    // back; once the output drains they must be answered, as over plain HTTP, even though
    // the client sends nothing more.
    const SIZE: u64 = 1 << 20;
    let fx = Fixture::new();
    write_pattern_file(&fx.site.root.join("big.bin"), SIZE);
    for i in 0..6 {
        fx.site
            .write(&format!("m{i}.bin"), vec![b'a' + i as u8; 100 * 1024]);
    }
    let tern = fx.start(&["--listen", "127.0.0.1:0"]);
    let mut batch = request_bytes("GET", "/big.bin", &[]);
    batch.extend(request_bytes("GET", "/hello.txt", &[]));
    batch.extend(request_bytes("HEAD", "/big.bin", &[]));
    batch.extend(request_bytes(
        "GET",
        "/big.bin",
        &[("Range", "bytes=70000-70999")],
    ));
    // Over plain HTTP first: the reference behaviour.
    let mut p = Client::connect(tern.http().unwrap());
    p.send(&batch);
    assert_eq!(p.read_response(false).body.len() as u64, SIZE);
    assert_eq!(p.read_response(false).text(), "hello over tls\n");
    for (version, name) in [(TLS13, "TLS 1.3"), (TLS12, "TLS 1.2")] {
        let mut c = tern.tls(&fx.client(&[version]), "localhost");
        c.send(&batch);
        let r = c.read_response(false);
        assert_eq!(r.body.len() as u64, SIZE);
        check_pattern(&r.body, 0);
        let r = c
            .try_read_response(false)
            .unwrap_or_else(|e| panic!("{name}: the request after a 1 MiB answer: {e}"));
        assert_eq!(r.text(), "hello over tls\n");
        assert_eq!(c.read_response(true).content_length(), Some(SIZE));
        let r = c.read_response(false);
        assert_eq!(r.status, 206);
        check_pattern(&r.body, 70_000);
        assert_eq!(r.body.len(), 1000);
        // Six 100 KiB answers in one pipeline.
        let mut batch = Vec::new();
        for i in 0..6 {
            batch.extend(request_bytes("GET", &format!("/m{i}.bin"), &[]));
        }
        c.send(&batch);
        for i in 0..6 {
            let r = c
                .try_read_response(false)
                .unwrap_or_else(|e| panic!("{name}: pipelined 100 KiB answer {i}: {e}"));
            assert_eq!(r.body, vec![b'a' + i as u8; 100 * 1024], "answer {i}");
        }
    }
}

#[test]
fn a_handshake_and_request_dribbled_a_few_bytes_at_a_time_are_served() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    for (version, piece) in [(TLS13, 1), (TLS13, 7), (TLS12, 5)] {
        let sock = TcpStream::connect(tern.https()).unwrap();
        let mut c = TlsClient::handshake_dribbled(
            sock,
            &fx.client(&[version]),
            "localhost",
            piece,
            Duration::from_micros(300),
        )
        .unwrap_or_else(|e| panic!("{version:?} in {piece}-byte pieces: {e}"));
        assert_eq!(c.alpn(), Some(&b"http/1.1"[..]));
        assert_eq!(c.get("/hello.txt", &[]).text(), "hello over tls\n");
    }
}

#[test]
fn many_concurrent_tls_clients_are_served() {
    let fx = Fixture::new();
    for i in 0..8 {
        fx.site
            .write(&format!("t{i}.txt"), format!("thread {i}\n").repeat(50 + i));
    }
    let tern = fx.start(&[]);
    let addr = tern.https();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            // Half the threads share a session cache (and resume), half use their own.
            let config = fx.client(if i % 2 == 0 { &[TLS13] } else { &[TLS12] });
            std::thread::spawn(move || {
                let want = format!("thread {i}\n").repeat(50 + i);
                for _ in 0..10 {
                    let mut c = TlsClient::connect_tls(addr, &config, "localhost");
                    for _ in 0..3 {
                        assert_eq!(c.get(&format!("/t{i}.txt"), &[]).text(), want);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
}

#[test]
fn head_304_206_and_gzip_over_tls() {
    let fx = Fixture::new();
    let body = text_body("tls");
    fx.site.write("page.txt", &body);
    let tern = fx.start(&[]);
    let mut c = tern.tls(&fx.client(&[TLS13]), "localhost");
    let full = c.get("/page.txt", &[]);
    assert_eq!(full.text(), body);
    let etag = full.header("etag").expect("ETag").to_owned();

    // HEAD then GET in one write: a leaked HEAD body would garble the GET.
    let mut batch = request_bytes("HEAD", "/page.txt", &[]);
    batch.extend(request_bytes("GET", "/hello.txt", &[]));
    c.send(&batch);
    let head = c.read_response(true);
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(body.len() as u64));
    assert_eq!(head.header("etag"), Some(etag.as_str()));
    assert_eq!(c.read_response(false).text(), "hello over tls\n");

    // 304, with a GET behind it to prove no body followed.
    let mut batch = request_bytes("GET", "/page.txt", &[("If-None-Match", &etag)]);
    batch.extend(request_bytes("GET", "/hello.txt", &[]));
    c.send(&batch);
    let r = c.read_response(false);
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(c.read_response(false).text(), "hello over tls\n");

    // 206.
    let r = c.get("/page.txt", &[("Range", "bytes=10-19")]);
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes 10-19/{}", body.len()).as_str())
    );
    assert_eq!(r.body, body.as_bytes()[10..20]);
    let r = c.get("/page.txt", &[("Range", "bytes=-7")]);
    assert_eq!(r.status, 206);
    assert_eq!(r.body, body.as_bytes()[body.len() - 7..]);

    // gzip.
    let r = c.get("/page.txt", &[("Accept-Encoding", "gzip")]);
    assert_eq!(r.status, 200);
    assert!(r.has("content-encoding", "gzip"), "{:?}", r.headers);
    assert!(r.body.len() < body.len() / 2, "{} bytes", r.body.len());
    assert_eq!(gunzip(&r.body), body.as_bytes());
    // And the connection is still in step.
    assert_eq!(c.get("/hello.txt", &[]).text(), "hello over tls\n");
}

#[test]
fn a_large_file_reaches_a_slow_reader_intact() {
    const SIZE: u64 = 5 << 20;
    let fx = Fixture::new();
    write_pattern_file(&fx.site.root.join("big.bin"), SIZE);
    let tern = fx.start(&[]);
    let mut c = slow_download(&tern, &fx.client(&[TLS13]), SIZE);
    // Let the server fill every buffer and wait on us, then read in small pieces with pauses.
    std::thread::sleep(Duration::from_millis(300));
    let mut at = 0u64;
    let mut pieces = 0;
    while at < SIZE {
        let n = (SIZE - at).min(16 * 1024) as usize;
        let got = c.read_exact_raw_by(n, 4096);
        check_pattern(&got, at);
        at += n as u64;
        pieces += 1;
        if pieces % 16 == 0 {
            std::thread::sleep(Duration::from_millis(15));
        }
    }
    // The connection is still good, for a range in the middle of the big file too.
    assert_eq!(c.get("/hello.txt", &[]).text(), "hello over tls\n");
    let r = c.get("/big.bin", &[("Range", "bytes=1000003-3100002")]);
    assert_eq!(r.status, 206);
    assert_eq!(r.body.len(), 2_100_000);
    check_pattern(&r.body, 1_000_003);
}

// ---------------------------------------------------------------------------------------------
// Bad clients
// ---------------------------------------------------------------------------------------------

#[test]
fn plain_http_on_the_tls_port_gets_400_and_close() {
    let fx = Fixture::new();
    let tern = fx.start(&["--hsts", "600"]);
    let mut c = Client::connect(tern.https());
    let r = c.get("/hello.txt", &[]);
    assert_eq!(r.status, 400);
    assert_eq!(r.version, "HTTP/1.1");
    assert!(
        r.text().to_ascii_lowercase().contains("https"),
        "the body says the port speaks HTTPS: {:?}",
        r.text()
    );
    assert!(
        r.header("strict-transport-security").is_none(),
        "not over TLS"
    );
    assert!(c.at_eof(), "closed after the 400");
    // Sent a byte at a time, and as HTTP/1.0.
    let mut c = Client::connect(tern.https());
    for b in b"HEAD / HTTP/1.0\r\n\r\n" {
        c.send(std::slice::from_ref(b));
        std::thread::sleep(Duration::from_millis(2));
    }
    // (Answered from the first byte, before the method is known: the 400 has its body.)
    let r = c.read_response(false);
    assert_eq!(r.status, 400);
    assert!(c.at_eof());
    // TLS still works.
    let mut t = tern.tls(&fx.client(&[TLS13]), "localhost");
    assert_eq!(t.get("/hello.txt", &[]).status, 200);
}

#[test]
fn garbage_records_close_the_connection() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let config = fx.client(&[TLS13]);
    let limit = Duration::from_secs(5);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "binary garbage",
            (0..64u8).map(|i| i.wrapping_mul(37) | 0x80).collect(),
        ),
        ("NUL bytes", vec![0; 32]),
        (
            "an unknown record type",
            vec![0x63, 0x03, 0x03, 0x00, 0x02, 0x01, 0x02],
        ),
        (
            "a handshake record of nonsense",
            vec![0x16, 0x03, 0x01, 0x00, 0x04, 0xde, 0xad, 0xbe, 0xef],
        ),
        (
            "an oversized record",
            vec![0x16, 0x03, 0x01, 0xff, 0xff, 0x01],
        ),
    ];
    for (what, bytes) in cases {
        let mut sock = TcpStream::connect(tern.https()).unwrap();
        sock.write_all(&bytes).unwrap();
        let got = read_until_closed(&mut sock, limit)
            .unwrap_or_else(|| panic!("{what}: the connection is still open after {limit:?}"));
        assert_only_alerts(&got, what);
    }
    // A record corrupted after the handshake: the session ends with an alert (bad_record_mac),
    // not an answer.
    let (mut c, mut record) = served_then_sealed(&tern, &config);
    let last = record.len() - 1;
    record[last] ^= 0x55;
    c.stream.sock.write_all(&record).unwrap();
    let mut sock = c.stream.sock.try_clone().unwrap();
    let got = read_until_closed(&mut sock, limit).expect("closed after a corrupted record");
    // The alert is encrypted (TLS 1.3): let the client's session read it.
    c.stream.conn.read_tls(&mut &got[..]).unwrap();
    match c.stream.conn.process_new_packets() {
        Err(rustls::Error::AlertReceived(rustls::AlertDescription::BadRecordMac)) => {}
        other => panic!("after a corrupted record: {other:?}, not a bad_record_mac alert"),
    }
    // The server goes on serving others.
    let mut c = tern.tls(&config, "localhost");
    assert_eq!(c.get("/hello.txt", &[]).text(), "hello over tls\n");
}

/// A TLS 1.3 connection that has been served one request, and the records of a second
/// `GET /hello.txt`, encrypted but not sent.
fn served_then_sealed(tern: &Tern, config: &Arc<ClientConfig>) -> (TlsClient, Vec<u8>) {
    let mut c = tern.tls(config, "localhost");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
    let record = c.seal(&request_bytes("GET", "/hello.txt", &[]));
    (c, record)
}

/// A connection to `tern`'s HTTPS port that has sent the first half of a ClientHello.
fn half_a_hello(tern: &Tern, config: &Arc<ClientConfig>) -> TcpStream {
    let hello = client_hello(config);
    let mut sock = TcpStream::connect(tern.https()).unwrap();
    sock.write_all(&hello[..hello.len() / 2]).unwrap();
    sock
}

/// A TLS 1.3 connection with a small receive buffer that has asked for `/big.bin` (`size`
/// bytes) and read the answer's head only, so the server has to wait for us.
fn slow_download(tern: &Tern, config: &Arc<ClientConfig>, size: u64) -> TlsClient {
    let sock = TcpStream::connect(tern.https()).unwrap();
    small_receive_buffer(&sock, 16 * 1024);
    let mut c = TlsClient::handshake(sock, config, "localhost").unwrap();
    c.send(&request_bytes("GET", "/big.bin", &[]));
    let head = c.read_response(true);
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(size));
    c
}

/// Opens a connection to `tern` and sends a truncated record, then closes our write side
/// `fin_after` later. The cases: half a ClientHello, a lone record header, and (after a
/// completed handshake) half an application-data record.
fn send_truncated(
    tern: &Tern,
    config: &Arc<ClientConfig>,
    case: usize,
    fin_after: Duration,
) -> TcpStream {
    let hello = client_hello(config);
    let (mut sock, bytes) = match case {
        0 => (
            TcpStream::connect(tern.https()).unwrap(),
            hello[..hello.len() / 2].to_vec(),
        ),
        1 => (
            TcpStream::connect(tern.https()).unwrap(),
            hello[..5].to_vec(),
        ),
        _ => {
            let (c, record) = served_then_sealed(tern, config);
            let half = record.len() / 2;
            (c.stream.sock.try_clone().unwrap(), record[..half].to_vec())
        }
    };
    if fin_after.is_zero() {
        cork(&sock);
    }
    sock.write_all(&bytes).unwrap();
    std::thread::sleep(fin_after);
    sock.shutdown(Shutdown::Write).unwrap();
    sock
}

/// Holds what is written back (TCP_CORK), so that the shutdown sends it and the FIN in one
/// segment: the server's socket becomes readable with both already there.
fn cork(sock: &TcpStream) {
    set_int_option(sock, libc::IPPROTO_TCP, libc::TCP_CORK, 1, "TCP_CORK");
}

const TRUNCATED: [&str; 3] = [
    "half a ClientHello",
    "a lone record header",
    "half an application-data record",
];

#[test]
fn a_truncated_record_then_eof_closes_the_connection() {
    // The FIN comes 200 ms after the bytes, so the server sees it as a readiness event of its
    // own.
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let config = fx.client(&[TLS13]);
    for (case, what) in TRUNCATED.iter().enumerate() {
        let mut sock = send_truncated(&tern, &config, case, Duration::from_millis(200));
        let started = Instant::now();
        read_until_closed(&mut sock, Duration::from_secs(3))
            .unwrap_or_else(|| panic!("{what}, then EOF: still open 3 s after the EOF"));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{what}: {:?}",
            started.elapsed()
        );
    }
    let mut c = tern.tls(&config, "localhost");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
}

#[test]
fn a_truncated_record_with_the_eof_right_behind_it_closes_the_connection() {
    // The same with the FIN in the segment that carries the bytes: the server's socket turns
    // readable once, with the data and the EOF both waiting. The default header timeout
    // (10 s) must not be what closes it.
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let config = fx.client(&[TLS13]);
    let mut open = Vec::new();
    for (case, what) in TRUNCATED.iter().enumerate() {
        let mut sock = send_truncated(&tern, &config, case, Duration::ZERO);
        if read_until_closed(&mut sock, Duration::from_secs(3)).is_none() {
            open.push(*what);
        }
    }
    assert!(
        open.is_empty(),
        "still open 3 s after the client's EOF (data and FIN arriving together): {open:?}"
    );
}

#[test]
fn a_stalled_handshake_is_cut_off_by_the_header_timeout() {
    let fx = Fixture::new();
    let tern = fx.start(&["--header-timeout", "1"]);
    let config = fx.client(&[TLS13]);
    let started = Instant::now();
    let mut sock = half_a_hello(&tern, &config);
    let got = read_until_closed(&mut sock, Duration::from_secs(6))
        .expect("a handshake stalled midway is cut off");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "cut off after {took:?} with --header-timeout 1"
    );
    assert_only_alerts(&got, "a stalled handshake");
    // A client that connects and sends nothing is cut off too.
    let mut sock = TcpStream::connect(tern.https()).unwrap();
    let got = read_until_closed(&mut sock, Duration::from_secs(6));
    assert!(
        got.is_some_and(|g| g.is_empty()),
        "a silent client is closed"
    );
    // Others are served.
    let mut c = tern.tls(&config, "localhost");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
}

#[test]
fn a_request_stalled_over_tls_gets_408_before_close_notify() {
    // As over plain HTTP: a head (or body) that stalls gets `408 Request Timeout`, and then
    // the TLS session ends cleanly. The 408 must come before the close_notify: a client stops
    // reading at close_notify, so anything after it is lost.
    let fx = Fixture::new();
    let tern = fx.start(&["--header-timeout", "1", "--body-timeout", "1"]);
    for version in [TLS13, TLS12] {
        let config = fx.client(&[version]);
        for (what, bytes) in [
            (
                "a stalled head",
                &b"GET /hello.txt HTTP/1.1\r\nHost: x\r\n"[..],
            ),
            (
                "a stalled body",
                &b"POST /hello.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789"[..],
            ),
        ] {
            let mut c = tern.tls(&config, "localhost");
            c.send(bytes);
            match c.try_read_response(false) {
                Ok(r) => assert_eq!(r.status, 408, "{version:?}, {what}"),
                Err(e) => panic!("{version:?}, {what}: no 408 over TLS ({e})"),
            }
            assert_eq!(c.end(Duration::from_secs(3)), Ok(()), "{version:?}, {what}");
        }
    }
}

#[test]
fn the_server_sends_close_notify_when_it_closes() {
    let fx = Fixture::new();
    let tern = fx.start(&["--idle-timeout", "1"]);
    for version in [TLS13, TLS12] {
        let config = fx.client(&[version]);
        // After `Connection: close`.
        let mut c = tern.tls(&config, "localhost");
        let r = c.get("/hello.txt", &[("Connection", "close")]);
        assert_eq!(r.status, 200);
        assert!(r.closes());
        assert_eq!(
            c.end(Duration::from_secs(3)),
            Ok(()),
            "{version:?}: Connection: close"
        );
        // After a bad request (400, then close).
        let mut c = tern.tls(&config, "localhost");
        c.send(b"GET /hello.txt HTTP/1.1\r\nHost: x\r\nBad header\r\n\r\n");
        let r = c.read_response(false);
        assert_eq!(r.status, 400);
        assert_eq!(c.end(Duration::from_secs(3)), Ok(()), "{version:?}: 400");
        // When an idle keep-alive connection times out.
        let mut c = tern.tls(&config, "localhost");
        assert_eq!(c.get("/hello.txt", &[]).status, 200);
        assert_eq!(
            c.end(Duration::from_secs(4)),
            Ok(()),
            "{version:?}: idle timeout"
        );
        // When the client says goodbye first.
        let mut c = tern.tls(&config, "localhost");
        assert_eq!(c.get("/hello.txt", &[]).status, 200);
        c.close();
        assert_eq!(
            c.end(Duration::from_secs(3)),
            Ok(()),
            "{version:?}: after ours"
        );
    }
}

#[test]
fn shutdown_finishes_a_download_and_ends_sessions_with_close_notify() {
    const SIZE: u64 = 2 << 20;
    let fx = Fixture::new();
    write_pattern_file(&fx.site.root.join("big.bin"), SIZE);
    let mut tern = fx.start(&[]);
    let config = fx.client(&[TLS13]);
    let mut idle = tern.tls(&config, "localhost");
    assert_eq!(idle.get("/hello.txt", &[]).status, 200);
    let mut busy = slow_download(&tern, &config, SIZE);
    std::thread::sleep(Duration::from_millis(100));
    tern.signal(libc::SIGTERM);
    // The idle connection is ended at once, cleanly.
    assert_eq!(
        idle.end(Duration::from_secs(3)),
        Ok(()),
        "idle connection at shutdown"
    );
    // The download in flight completes, then ends cleanly too.
    let body = busy.read_exact_raw(SIZE as usize);
    check_pattern(&body, 0);
    assert_eq!(
        busy.end(Duration::from_secs(3)),
        Ok(()),
        "after the last answer"
    );
    let status = tern.wait_exit(Duration::from_secs(10)).expect("tern exits");
    assert!(status.success(), "{status:?}");
}

// ---------------------------------------------------------------------------------------------
// Reload, restart and start-up errors
// ---------------------------------------------------------------------------------------------

#[test]
fn sighup_swaps_the_certificate_and_keeps_open_connections() {
    let fx = Fixture::new();
    let cert = fx.base().join("live.pem");
    let key = fx.base().join("live.key");
    let old = fx.ca.issue("old", &["localhost"]);
    let new = fx.ca.issue("new", &["localhost"]);
    let broken = fx.ca.issue("broken", &["localhost"]);
    old.write_to(&cert, &key);
    let tern = Tern::serve_tls(&fx.site.root, &cert_key_args(&cert, &key));
    let leaves = [&old, &new, &broken];
    let config = fx.client(&[TLS13, TLS12]);
    let mut kept = tern.tls(&config, "localhost");
    assert_eq!(which(&kept.leaf(), &leaves), "old");
    assert_eq!(kept.get("/hello.txt", &[]).status, 200);

    new.write_to(&cert, &key);
    let line = tern.reload(1);
    assert!(line.contains("certificates re-read"), "{line}");
    // The connection opened before keeps working (its session is unchanged)...
    assert_eq!(kept.get("/hello.txt", &[]).text(), "hello over tls\n");
    // ...and a new one gets the new certificate.
    let fresh = fx.client(&[TLS13]);
    let mut c = tern.tls(&fresh, "localhost");
    assert_eq!(which(&c.leaf(), &leaves), "new");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);

    // A broken file at reload changes nothing: garbage PEM, then a key of another certificate.
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n").unwrap();
    let line = tern.reload(2);
    assert!(line.contains("nothing changed"), "{line}");
    replace_file(&cert, broken.cert_pem.as_bytes());
    replace_file(&key, new.key_pem.as_bytes());
    let line = tern.reload(3);
    assert!(line.contains("nothing changed"), "{line}");
    for _ in 0..3 {
        let mut c = tern.tls(&fx.client(&[TLS13]), "localhost");
        assert_eq!(which(&c.leaf(), &leaves), "new", "after a failed reload");
        assert_eq!(c.get("/hello.txt", &[]).status, 200);
    }
    assert_eq!(kept.get("/hello.txt", &[]).status, 200);
    // Fixed: the next SIGHUP applies it.
    broken.write_to(&cert, &key);
    let line = tern.reload(4);
    assert!(line.contains("certificates re-read"), "{line}");
    let c = tern.tls(&fx.client(&[TLS13]), "localhost");
    assert_eq!(which(&c.leaf(), &leaves), "broken");
    assert_eq!(kept.get("/hello.txt", &[]).status, 200);
}

#[test]
fn a_restart_with_the_same_ticket_keys_file_keeps_resumption() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let keys = fx.base().join("ticket.keys");
    let keys_arg = keys.to_str().unwrap().to_owned();
    let first = fx.start(&["--tls-ticket-keys", &keys_arg]);
    let mode = std::fs::metadata(&keys)
        .expect("the key file exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the ticket key file is private");
    let configs = [fx.client(&[TLS13]), fx.client(&[TLS12])];
    for config in &configs {
        let mut c = first.tls(config, "localhost");
        assert!(!c.resumed());
        assert_eq!(c.get("/hello.txt", &[]).status, 200);
    }
    // The new process starts next to the old one, which then stops.
    let second = fx.start(&["--tls-ticket-keys", &keys_arg]);
    drop(first);
    let mode = std::fs::metadata(&keys).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    for (config, v) in configs.iter().zip(["TLS 1.3", "TLS 1.2"]) {
        let mut c = second.tls(config, "localhost");
        assert!(
            c.resumed(),
            "{v}: a session of the first process was not resumed by the second ({:?})",
            c.conn().handshake_kind()
        );
        assert_eq!(c.get("/hello.txt", &[]).status, 200);
    }
    // Control: a process with other keys cannot resume the sessions (so the check above means
    // something).
    let other = fx.base().join("other.keys");
    let third = fx.start(&["--tls-ticket-keys", other.to_str().unwrap()]);
    for (config, v) in configs.iter().zip(["TLS 1.3", "TLS 1.2"]) {
        let mut c = third.tls(config, "localhost");
        assert!(!c.resumed(), "{v}: resumed with other ticket keys");
        assert_eq!(c.get("/hello.txt", &[]).status, 200);
    }
}

fn assert_one_line_error(f: &Failed, what: &str, want: &str) {
    assert_eq!(
        f.status.code(),
        Some(1),
        "{what}: exit status; stderr {:?}",
        f.stderr
    );
    let err = f.stderr.trim_end();
    assert_eq!(
        err.lines().count(),
        1,
        "{what}: one line on stderr, got {err:?}"
    );
    assert!(err.starts_with("tern: "), "{what}: {err:?}");
    assert!(
        err.contains(want),
        "{what}: {err:?} does not mention {want:?}"
    );
    assert!(
        f.stdout.is_empty(),
        "{what}: nothing on stdout, got {:?}",
        f.stdout
    );
}

#[test]
fn bad_certificates_and_keys_are_one_line_start_up_errors() {
    let fx = Fixture::new();
    let base = fx.base();
    let (cert, key) = (&fx.files[0].0, &fx.files[0].1);
    let other_key = &fx.files[1].1;
    let missing = base.join("missing.pem");
    let garbage = base.join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\n%%% not base64 %%%\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let empty = base.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let damaged_keys = base.join("damaged.keys");
    std::fs::write(&damaged_keys, "12 zz 00\n").unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let cases: Vec<(&str, Vec<String>, String)> = vec![
        (
            "missing certificate file",
            cert_key_args(&missing, key),
            s(&missing),
        ),
        (
            "missing key file",
            cert_key_args(cert, &missing),
            s(&missing),
        ),
        (
            "key of another certificate",
            cert_key_args(cert, other_key),
            "does not belong".into(),
        ),
        (
            "garbage PEM certificate",
            cert_key_args(&garbage, key),
            s(&garbage),
        ),
        (
            "garbage PEM key",
            cert_key_args(cert, &garbage),
            s(&garbage),
        ),
        (
            "empty certificate file",
            cert_key_args(&empty, key),
            s(&empty),
        ),
        (
            "a key given as the certificate",
            cert_key_args(key, key),
            s(key),
        ),
        (
            "--tls-cert without --tls-key",
            vec!["--tls-cert".into(), s(cert)],
            "--tls-key".into(),
        ),
        (
            "--tls-key without --tls-cert",
            vec!["--tls-key".into(), s(key)],
            "--tls-cert".into(),
        ),
        (
            "a damaged ticket key file",
            [
                cert_key_args(cert, key),
                vec!["--tls-ticket-keys".into(), s(&damaged_keys)],
            ]
            .concat(),
            s(&damaged_keys),
        ),
        (
            "--listen-tls without a certificate",
            vec![],
            "certificate".into(),
        ),
    ];
    let one_worker = || vec!["--workers".to_owned(), "1".to_owned()];
    for (what, args, want) in cases {
        let extra = [one_worker(), args].concat();
        let mut cmd = serve_command(&fx.site.root, LISTEN_TLS, &extra);
        let f = run_to_end(&mut cmd, Duration::from_secs(10));
        assert_one_line_error(&f, what, &want);
    }
    // `tern demo` too.
    let extra = [one_worker(), cert_key_args(cert, other_key)].concat();
    let mut cmd = demo_command(&base.join("data"), LISTEN_TLS, &extra);
    let f = run_to_end(&mut cmd, Duration::from_secs(10));
    assert_one_line_error(&f, "demo with a mismatched key", "does not belong");
}

#[test]
fn the_config_file_tls_section_serves_https() {
    let fx = Fixture::new();
    // Paths in the file are relative to it.
    let config = fx.base().join("tern.toml");
    std::fs::write(
        &config,
        format!(
            "root = {:?}\n[tls]\nlisten = \"127.0.0.1:0\"\nhsts = 60\nticket_keys = \"keys\"\n\
             [[tls.certificates]]\ncert = \"default.pem\"\nkey = \"default.key\"\n\
             [[tls.certificates]]\ncert = \"exact.pem\"\nkey = \"exact.key\"\n",
            fx.site.root.to_str().unwrap()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(TERN);
    cmd.arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--workers", "1"]);
    let tern = Tern::spawn(cmd);
    assert!(tern.http().is_none(), "{}", tern.line);
    assert!(
        fx.base().join("keys").exists(),
        "ticket keys beside the config file"
    );
    let any = Arc::new(any_cert_config(&[TLS13]));
    let mut c = tern.tls(&any, "www.example.test");
    assert_eq!(which(&c.leaf(), &fx.leaves()), "exact");
    let r = c.get("/hello.txt", &[]);
    assert_eq!(r.text(), "hello over tls\n");
    assert_eq!(r.header("strict-transport-security"), Some("max-age=60"));
    let c = tern.tls(&any, "other.test");
    assert_eq!(which(&c.leaf(), &fx.leaves()), "default");
    // SIGHUP re-reads the certificates named in the file.
    let replacement = fx.ca.issue("replacement", &["www.example.test"]);
    replacement.write_to(&fx.files[1].0, &fx.files[1].1);
    let line = tern.reload(1);
    assert!(line.contains("certificates re-read"), "{line}");
    let fresh = Arc::new(any_cert_config(&[TLS13])); // no session to resume
    let c = tern.tls(&fresh, "www.example.test");
    assert_eq!(which(&c.leaf(), &[&replacement]), "replacement");
}

// ---------------------------------------------------------------------------------------------
// Redirect, HSTS, self-signed, demo
// ---------------------------------------------------------------------------------------------

#[test]
fn redirect_http_answers_308_and_hsts_is_on_https_answers_only() {
    let fx = Fixture::new();
    let tern = fx.start(&[
        "--listen",
        "127.0.0.1:0",
        "--redirect-http",
        "127.0.0.1:0",
        "--hsts",
        "600",
    ]);
    let plain = tern.http().expect("a plain listener with --listen");
    let redirect = tern.redirect().expect("a redirect listener");
    assert!(
        tern.line.contains(&format!(
            "http://{plain} and https://{} and http://{redirect} (redirect to https)",
            tern.https()
        )),
        "{}",
        tern.line
    );
    let port = tern.https().port();
    let mut c = Client::connect(redirect);
    for (path, host, want) in [
        (
            "/hello.txt",
            "localhost",
            format!("https://localhost:{port}/hello.txt"),
        ),
        (
            "/a/b.html?x=1&y=2",
            "example.org:8080",
            format!("https://example.org:{port}/a/b.html?x=1&y=2"),
        ),
        ("/", "127.0.0.1", format!("https://127.0.0.1:{port}/")),
    ] {
        c.send(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        assert_eq!(r.status, 308, "{path}");
        assert_eq!(
            r.header("location"),
            Some(want.as_str()),
            "{path} Host {host}"
        );
        assert!(
            r.header("strict-transport-security").is_none(),
            "no HSTS over plain HTTP"
        );
    }
    // HSTS on HTTPS answers (errors and 304 included), none on the plain listener.
    let mut t = tern.tls(&fx.client(&[TLS13]), "localhost");
    let r = t.get("/hello.txt", &[]);
    assert_eq!(r.header("strict-transport-security"), Some("max-age=600"));
    let etag = r.header("etag").unwrap().to_owned();
    let r = t.get("/missing", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.header("strict-transport-security"), Some("max-age=600"));
    let r = t.get("/hello.txt", &[("If-None-Match", &etag)]);
    assert_eq!(r.status, 304);
    assert_eq!(r.header("strict-transport-security"), Some("max-age=600"));
    let r = Client::connect(plain).get("/hello.txt", &[]);
    assert_eq!((r.status, r.text().as_str()), (200, "hello over tls\n"));
    assert!(r.header("strict-transport-security").is_none());
}

#[test]
fn self_signed_prints_its_fingerprint_and_serves_localhost() {
    let site = Site::new();
    site.write("hello.txt", "hello\n");
    let tern = Tern::serve_tls(&site.root, &["--tls-self-signed"]);
    let (_, fp) = tern
        .line
        .split_once("; self-signed certificate SHA-256 ")
        .unwrap_or_else(|| panic!("no fingerprint in {:?}", tern.line));
    let mut c = tern.tls(&Arc::new(any_cert_config(&[TLS13])), "localhost");
    let leaf = c.leaf();
    // SHA-256 through rustls's own hash provider (TLS13_AES_128_GCM_SHA256 hashes with it).
    let suite = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let hash = suite
        .tls13()
        .unwrap()
        .common
        .hash_provider
        .hash(leaf.as_ref());
    let want: Vec<String> = hash.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    assert_eq!(fp, want.join(":"));
    assert_eq!(c.get("/hello.txt", &[]).text(), "hello\n");
    // The certificate verifies for localhost and 127.0.0.1 when trusted.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(leaf).unwrap();
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let config = Arc::new(config);
    for name in ["localhost", "127.0.0.1"] {
        let mut c = tern.tls(&config, name);
        assert_eq!(c.get("/hello.txt", &[]).status, 200, "{name}");
    }
}

#[test]
fn demo_over_https_counts_handshakes_and_failures() {
    let fx = Fixture::new();
    let data = fx.base().join("data");
    let tern = fx.demo(&["--header-timeout", "1"]);
    assert!(
        tern.line.starts_with("tern: IPv4 Games (data in ")
            && tern
                .line
                .contains(&format!(" and https://{} with 2 workers", tern.https())),
        "{}",
        tern.line
    );
    // Ticket keys beside the database by default, private.
    use std::os::unix::fs::PermissionsExt;
    let keys = data.join("tls-ticket-keys");
    let mode = std::fs::metadata(&keys)
        .expect("DATA/tls-ticket-keys")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let config = fx.client(&[TLS13]);
    let mut c = tern.tls(&config, "localhost");
    let r = c.get("/ip", &[]);
    assert_eq!((r.status, r.text().as_str()), (200, "127.0.0.1\n"));
    assert_eq!(c.get("/", &[]).status, 200);
    let before = statusz(&mut c);
    for name in [
        "tls_handshakes",
        "tls_handshake_failures{cause=\"plain_http\"}",
        "tls_handshake_failures{cause=\"timeout\"}",
        "tls_handshake_failures{cause=\"bad_record\"}",
        "tls_handshake_failures{cause=\"no_shared_params\"}",
        "tls_handshake_failures{cause=\"peer_alert\"}",
        "tls_handshake_failures{cause=\"closed\"}",
        "tls_handshake_failures{cause=\"other\"}",
    ] {
        assert!(before.contains_key(name), "/statusz has no {name}");
    }
    assert!(before["tls_handshakes"] >= 1);

    // Two handshakes, two plain HTTP requests, one bad record, one truncated handshake.
    for _ in 0..2 {
        let mut t = tern.tls(&config, "localhost");
        assert_eq!(t.get("/ip", &[]).status, 200);
    }
    for _ in 0..2 {
        let r = Client::connect(tern.https()).get("/statusz", &[]);
        assert_eq!(r.status, 400);
    }
    let mut sock = TcpStream::connect(tern.https()).unwrap();
    sock.write_all(&[0x16, 0x03, 0x01, 0x00, 0x04, 0xde, 0xad, 0xbe, 0xef])
        .unwrap();
    read_until_closed(&mut sock, Duration::from_secs(5)).expect("closed on a bad record");
    let mut sock = send_truncated(&tern, &config, 0, Duration::from_millis(200));
    read_until_closed(&mut sock, Duration::from_secs(5)).expect("closed on a truncated hello");
    // A handshake stalled past --header-timeout 1.
    let mut sock = half_a_hello(&tern, &config);
    read_until_closed(&mut sock, Duration::from_secs(5)).expect("a stalled handshake cut off");
    // A client that does not trust the certificate (another CA) sends an alert.
    let stranger = Arc::new(client_config(&Ca::new(), &[TLS13]));
    let e = TlsClient::try_connect_tls(tern.https(), &stranger, "localhost").err();
    assert!(
        e.is_some(),
        "a client of another CA completed the handshake"
    );
    // A client that speaks only a protocol tern does not shares no ALPN protocol with it.
    let mut foreign = client_config(&fx.ca, &[TLS13]);
    foreign.alpn_protocols = vec![b"spdy/3.1".to_vec()];
    let e = TlsClient::try_connect_tls(tern.https(), &Arc::new(foreign), "localhost").err();
    assert!(
        e.is_some(),
        "a client of another protocol completed the handshake"
    );

    let delta =
        |after: &std::collections::HashMap<String, u64>, name: &str| after[name] - before[name];
    let mut after = statusz(&mut c);
    let settled = eventually(Duration::from_secs(3), || {
        after = statusz(&mut c);
        [
            "tls_handshake_failures{cause=\"closed\"}",
            "tls_handshake_failures{cause=\"bad_record\"}",
            "tls_handshake_failures{cause=\"timeout\"}",
            "tls_handshake_failures{cause=\"peer_alert\"}",
            "tls_handshake_failures{cause=\"no_shared_params\"}",
        ]
        .iter()
        .all(|name| delta(&after, name) >= 1)
    });
    let tls: Vec<_> = after
        .iter()
        .filter(|(k, _)| k.starts_with("tls_"))
        .collect();
    assert!(settled, "counters did not move: {tls:?}");
    for (name, want) in [
        ("tls_handshakes", 2),
        ("tls_handshake_failures{cause=\"plain_http\"}", 2),
        ("tls_handshake_failures{cause=\"bad_record\"}", 1),
        ("tls_handshake_failures{cause=\"closed\"}", 1),
        ("tls_handshake_failures{cause=\"timeout\"}", 1),
        ("tls_handshake_failures{cause=\"peer_alert\"}", 1),
        ("tls_handshake_failures{cause=\"no_shared_params\"}", 1),
        ("tls_handshake_failures{cause=\"other\"}", 0),
    ] {
        assert_eq!(delta(&after, name), want, "{name}: {tls:?}");
    }
    // /metrics has them too.
    let m = c.get("/metrics", &[]);
    assert_eq!(m.status, 200);
    let text = m.text();
    for name in [
        "tern_tls_handshakes_total ",
        "tern_tls_handshake_failures_total{cause=\"plain_http\"} ",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "/metrics has no {name}"
        );
    }
}

#[test]
fn demo_pipelined_claims_over_tls_are_all_answered() {
    // A claim is answered later (by the writer thread, through the worker's inbox): requests
    // pipelined behind it wait in the connection and must be answered once it is.
    let fx = Fixture::new();
    let tern = fx.demo(&[]);
    let mut batch = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        batch.extend(request_bytes(
            "GET",
            &format!("/claim/{name}"),
            &[("Accept", "text/plain")],
        ));
    }
    batch.extend(request_bytes("GET", "/ip", &[]));
    // Plain HTTP, the reference.
    let mut p = Client::connect(tern.http().unwrap());
    p.send(&batch);
    for name in ["alpha", "beta", "gamma"] {
        let r = p.read_response(false);
        assert_eq!(r.text(), format!("127.0.0.1 is now claimed by {name}\n"));
    }
    assert_eq!(p.read_response(false).text(), "127.0.0.1\n");
    let mut c = tern.tls(&fx.client(&[TLS13]), "localhost");
    c.send(&batch);
    for name in ["alpha", "beta", "gamma"] {
        let r = c
            .try_read_response(false)
            .unwrap_or_else(|e| panic!("pipelined claim by {name} over TLS: {e}"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains(name), "{}", r.text());
    }
    let r = c.try_read_response(false).expect("/ip after the claims");
    assert_eq!(r.text(), "127.0.0.1\n");
}

// ---------------------------------------------------------------------------------------------
// curl
// ---------------------------------------------------------------------------------------------

/// `curl -sS -v --cacert CA --resolve localhost:PORT:127.0.0.1 ARGS...`.
fn curl(fx: &Fixture, tern: &Tern, args: &[&str]) -> Failed {
    let port = tern.https().port();
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-v", "--max-time", "10", "--cacert"])
        .arg(&fx.ca_file)
        .arg("--resolve")
        .arg(format!("localhost:{port}:127.0.0.1"))
        .args(args);
    run_to_end(&mut cmd, Duration::from_secs(15))
}

#[test]
fn curl_fetches_over_tls13_and_tls12() {
    if !have("curl", "--version") {
        return;
    }
    let fx = Fixture::new();
    let body = text_body("curl");
    fx.site.write("page.txt", &body);
    let tern = fx.start(&[]);
    let url = |path: &str| format!("https://localhost:{}{path}", tern.https().port());

    let f = curl(&fx, &tern, &[&url("/hello.txt")]);
    assert!(f.status.success(), "curl: {}", f.stderr);
    assert_eq!(f.stdout, "hello over tls\n");
    assert!(
        f.stderr.contains("SSL connection using TLSv1.3"),
        "{}",
        f.stderr
    );
    assert!(
        f.stderr
            .lines()
            .any(|l| l.contains("ALPN") && l.contains("accepted") && l.contains("h2")),
        "{}",
        f.stderr
    );
    assert!(
        f.stderr.contains("CN=default") || f.stderr.contains("CN = default"),
        "{}",
        f.stderr
    );

    let f = curl(
        &fx,
        &tern,
        &["--tlsv1.2", "--tls-max", "1.2", &url("/hello.txt")],
    );
    assert!(f.status.success(), "curl: {}", f.stderr);
    assert_eq!(f.stdout, "hello over tls\n");
    assert!(
        f.stderr
            .contains("SSL connection using TLSv1.2 / ECDHE-ECDSA-"),
        "{}",
        f.stderr
    );

    // Two URLs: one connection, kept alive; gzip decoded by curl.
    let f = curl(
        &fx,
        &tern,
        &["--compressed", &url("/page.txt"), &url("/hello.txt")],
    );
    assert!(f.status.success(), "curl: {}", f.stderr);
    assert_eq!(f.stdout, format!("{body}hello over tls\n"));
    assert!(
        f.stderr.contains("Re-using existing connection"),
        "{}",
        f.stderr
    );
    assert!(
        f.stderr
            .to_ascii_lowercase()
            .contains("content-encoding: gzip")
            || f.stderr
                .to_ascii_lowercase()
                .contains("content-encoding: br"),
        "{}",
        f.stderr
    );

    // HEAD and a range.
    let f = curl(&fx, &tern, &["-I", &url("/page.txt")]);
    assert!(f.status.success());
    assert!(f.stdout.starts_with("HTTP/2 200"), "{}", f.stdout);
    assert!(f
        .stdout
        .to_ascii_lowercase()
        .contains(&format!("content-length: {}", body.len())));
    let f = curl(&fx, &tern, &["-r", "0-4", &url("/page.txt")]);
    assert!(f.status.success());
    assert_eq!(f.stdout, &body[..5]);

    // By IP address (the certificate names 127.0.0.1 too).
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&fx.ca_file)
        .arg(format!(
            "https://127.0.0.1:{}/hello.txt",
            tern.https().port()
        ));
    let f = run_to_end(&mut cmd, Duration::from_secs(15));
    assert!(f.status.success(), "{}", f.stderr);
    assert_eq!(f.stdout, "hello over tls\n");

    // Without the CA, curl refuses the certificate (exit 60); the server is unharmed.
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "--resolve"])
        .arg(format!("localhost:{}:127.0.0.1", tern.https().port()))
        .arg(url("/hello.txt"));
    let f = run_to_end(&mut cmd, Duration::from_secs(15));
    assert_eq!(f.status.code(), Some(60), "{}", f.stderr);
    let f = curl(&fx, &tern, &[&url("/hello.txt")]);
    assert_eq!(f.stdout, "hello over tls\n");
}

#[test]
fn curl_follows_the_redirect_to_https_and_sees_hsts() {
    if !have("curl", "--version") {
        return;
    }
    let fx = Fixture::new();
    let tern = fx.start(&["--redirect-http", "127.0.0.1:0", "--hsts", "31536000"]);
    let redirect = tern.redirect().unwrap();
    let f = curl(
        &fx,
        &tern,
        &[
            "-L",
            "-D",
            "-",
            "-o",
            "/dev/null",
            &format!("http://localhost:{}/hello.txt", redirect.port()),
        ],
    );
    assert!(f.status.success(), "{}", f.stderr);
    let heads = f.stdout.to_ascii_lowercase();
    assert!(heads.starts_with("http/1.1 308"), "{}", f.stdout);
    assert!(
        heads.contains(&format!(
            "location: https://localhost:{}/hello.txt",
            tern.https().port()
        )),
        "{}",
        f.stdout
    );
    let (first, second) = heads.split_once("\r\n\r\n").unwrap();
    assert!(!first.contains("strict-transport-security"));
    // curl offers h2 over TLS, and tern takes it.
    assert!(second.starts_with("http/2 200"), "{}", f.stdout);
    assert!(
        second.contains("strict-transport-security: max-age=31536000"),
        "{}",
        f.stdout
    );
}

// ---------------------------------------------------------------------------------------------
// openssl s_client
// ---------------------------------------------------------------------------------------------

/// `openssl s_client -connect 127.0.0.1:PORT -CAfile CA ARGS...` sending one request with
/// `Connection: close` and waiting for the server to close.
fn s_client(fx: &Fixture, tern: &Tern, args: &[&str], path: &str) -> Failed {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect"])
        .arg(tern.https().to_string())
        .arg("-CAfile")
        .arg(&fx.ca_file)
        .arg("-ign_eof")
        .args(args);
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    run_with_input(&mut cmd, request.as_bytes(), Duration::from_secs(15))
}

#[test]
fn openssl_s_client_versions_alpn_sni_and_resumption() {
    if !have("openssl", "version") {
        return;
    }
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let sess13 = fx.base().join("sess13.pem");
    let sess12 = fx.base().join("sess12.pem");
    let (s13, s12) = (sess13.to_str().unwrap(), sess12.to_str().unwrap());

    let f = s_client(
        &fx,
        &tern,
        &[
            "-tls1_3",
            "-servername",
            "localhost",
            "-alpn",
            "http/1.1",
            "-verify_return_error",
            "-sess_out",
            s13,
        ],
        "/hello.txt",
    );
    assert!(f.status.success(), "{}\n{}", f.stdout, f.stderr);
    assert!(f.stdout.contains("New, TLSv1.3"), "{}", f.stdout);
    assert!(f.stdout.contains("ALPN protocol: http/1.1"), "{}", f.stdout);
    assert!(
        f.stdout.contains("Verify return code: 0 (ok)"),
        "{}",
        f.stdout
    );
    assert!(f.stdout.contains("HTTP/1.1 200 OK"), "{}", f.stdout);
    assert!(f.stdout.contains("hello over tls"), "{}", f.stdout);
    let f = s_client(
        &fx,
        &tern,
        &["-tls1_3", "-servername", "localhost", "-sess_in", s13],
        "/hello.txt",
    );
    assert!(f.status.success(), "{}", f.stderr);
    assert!(
        f.stdout.contains("Reused, TLSv1.3"),
        "TLS 1.3 session not reused:\n{}",
        f.stdout
    );
    assert!(f.stdout.contains("hello over tls"));

    let f = s_client(
        &fx,
        &tern,
        &[
            "-tls1_2",
            "-servername",
            "localhost",
            "-verify_return_error",
            "-sess_out",
            s12,
        ],
        "/hello.txt",
    );
    assert!(f.status.success(), "{}", f.stderr);
    assert!(
        f.stdout.contains("New, TLSv1.2, Cipher is ECDHE-ECDSA-"),
        "{}",
        f.stdout
    );
    assert!(f.stdout.contains("hello over tls"));
    let f = s_client(
        &fx,
        &tern,
        &["-tls1_2", "-servername", "localhost", "-sess_in", s12],
        "/hello.txt",
    );
    assert!(f.status.success(), "{}", f.stderr);
    assert!(
        f.stdout.contains("Reused, TLSv1.2"),
        "TLS 1.2 session not reused:\n{}",
        f.stdout
    );
    assert!(f.stdout.contains("hello over tls"));

    // SNI.
    for (sni, want) in [
        (Some("www.example.test"), "CN = exact"),
        (Some("api.wild.test"), "CN = wild"),
        (Some("nobody.test"), "CN = default"),
        (None, "CN = default"),
    ] {
        let args: Vec<&str> = match sni {
            Some(name) => vec!["-servername", name],
            None => vec!["-noservername"],
        };
        let f = s_client(&fx, &tern, &args, "/hello.txt");
        assert!(f.status.success(), "{sni:?}: {}", f.stderr);
        // "subject=CN = exact" (OpenSSL 3.0) or "subject=CN=exact" (later versions).
        assert!(
            f.stdout
                .replace(' ', "")
                .contains(&format!("subject={}", want.replace(' ', ""))),
            "SNI {sni:?}: wanted {want}:\n{}",
            f.stdout
        );
    }

    // Suites outside Mozilla's intermediate list (static RSA, CBC) are refused.
    for cipher in ["AES128-SHA", "ECDHE-ECDSA-AES128-SHA"] {
        let f = s_client(&fx, &tern, &["-tls1_2", "-cipher", cipher], "/hello.txt");
        assert!(!f.status.success(), "{cipher} accepted:\n{}", f.stdout);
        assert!(!f.stdout.contains("HTTP/1.1 200"), "{cipher}");
    }
    // Still serving.
    let f = s_client(&fx, &tern, &["-servername", "localhost"], "/hello.txt");
    assert!(f.stdout.contains("hello over tls"), "{}", f.stdout);
}

// ---------------------------------------------------------------------------------------------
// ClientHellos of any size and cut; post-quantum key exchange (issue 39)
// ---------------------------------------------------------------------------------------------

/// `hello` (a ClientHello in one record) with a padding extension of `pad` bytes added, its
/// message cut into records of at most `record` bytes.
fn grown_hello(hello: &[u8], pad: usize, record: usize) -> Vec<u8> {
    let mut message = hello[5..].to_vec();
    assert_eq!(message[0], 1, "a ClientHello");
    // session id, cipher suites, compression methods: to the extensions' length.
    let mut at = 4 + 2 + 32;
    at += 1 + message[at] as usize;
    at += 2 + u16::from_be_bytes([message[at], message[at + 1]]) as usize;
    at += 1 + message[at] as usize;
    let extensions = u16::from_be_bytes([message[at], message[at + 1]]) as usize + 4 + pad;
    message[at..at + 2].copy_from_slice(&u16::try_from(extensions).unwrap().to_be_bytes());
    message.extend_from_slice(&[0, 21]);
    message.extend_from_slice(&(pad as u16).to_be_bytes());
    message.resize(message.len() + pad, 0);
    let body = (message.len() - 4) as u32;
    message[1..4].copy_from_slice(&body.to_be_bytes()[1..]);
    let mut wire = Vec::new();
    for piece in message.chunks(record) {
        wire.extend_from_slice(&[0x16, 3, 1]);
        wire.extend_from_slice(&(piece.len() as u16).to_be_bytes());
        wire.extend_from_slice(piece);
    }
    wire
}

/// Reads `n` bytes, or `None` if they do not come within `limit`.
fn read_n(sock: &mut TcpStream, n: usize, limit: Duration) -> Option<Vec<u8>> {
    sock.set_read_timeout(Some(limit)).unwrap();
    let mut got = vec![0u8; n];
    sock.read_exact(&mut got).ok().map(|()| got)
}

#[test]
fn client_hellos_of_any_legal_size_and_cut_are_answered_within_a_second() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let hello = client_hello(&fx.client(&[TLS13]));
    let extensions_end = 65535 - (hello.len() - 5 - 4);
    for (pad, record) in [
        (0, 1),
        (3_000, 100),
        (5_000, 7),
        (20_000, 16_384),
        (20_000, 1_000),
        (60_000, 16_384),
        (60_000, 512),
        // The largest message rustls takes: 64 KiB - 1.
        (extensions_end - 4, 16_384),
    ] {
        let what = format!("{pad} bytes of padding in records of {record}");
        let wire = grown_hello(&hello, pad, record);
        let mut sock = TcpStream::connect(tern.https()).unwrap();
        let start = Instant::now();
        sock.write_all(&wire).unwrap();
        let head = read_n(&mut sock, 6, Duration::from_secs(1))
            .unwrap_or_else(|| panic!("{what}: no answer within a second"));
        assert_eq!(
            (head[0], head[5]),
            (0x16, 2),
            "{what}: a ServerHello, got {head:02x?}"
        );
        assert!(start.elapsed() < Duration::from_secs(1), "{what}");
    }
    // One byte more than rustls takes: refused with decode_error, which arrives whole (no
    // reset, though most of the hello is unread when the server closes).
    for record in [16_384, 1_000] {
        let wire = grown_hello(&hello, extensions_end - 3, record);
        let mut sock = TcpStream::connect(tern.https()).unwrap();
        let start = Instant::now();
        sock.write_all(&wire).unwrap();
        let alert = read_n(&mut sock, 7, Duration::from_secs(1));
        assert_eq!(
            alert.as_deref(),
            Some(&[0x15, 3, 3, 0, 2, 2, 50][..]),
            "records of {record}: a fatal decode_error within a second"
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        sock.shutdown(Shutdown::Write).unwrap();
        assert_eq!(
            read_until_closed(&mut sock, Duration::from_secs(3)).as_deref(),
            Some(&[][..]),
            "then the server closes"
        );
    }
    // Still serving.
    let mut c = tern.tls(&fx.client(&[TLS13]), "localhost");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
}

#[test]
fn a_hybrid_post_quantum_key_exchange_is_chosen_when_offered() {
    use rustls::crypto::aws_lc_rs::kx_group;
    use rustls::crypto::SupportedKxGroup;
    use rustls::NamedGroup;
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let offering = |groups: &[&'static dyn SupportedKxGroup], version| {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        provider.kx_groups = groups.to_vec();
        let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(fx.ca.roots())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    };
    let hybrid = kx_group::X25519MLKEM768;
    for (groups, version, want) in [
        // What browsers send: the hybrid first, X25519 after.
        (
            &[hybrid, kx_group::X25519][..],
            TLS13,
            NamedGroup::X25519MLKEM768,
        ),
        (&[hybrid][..], TLS13, NamedGroup::X25519MLKEM768),
        // The client's preference rules; classical clients keep theirs.
        (&[kx_group::X25519, hybrid][..], TLS13, NamedGroup::X25519),
        (&[kx_group::X25519][..], TLS13, NamedGroup::X25519),
        (&[kx_group::SECP384R1][..], TLS13, NamedGroup::secp384r1),
        // The hybrid is TLS 1.3 only.
        (
            &[hybrid, kx_group::SECP256R1][..],
            TLS12,
            NamedGroup::secp256r1,
        ),
    ] {
        let mut c = tern.tls(&offering(groups, version), "localhost");
        let names: Vec<_> = groups.iter().map(|g| g.name()).collect();
        assert_eq!(
            c.conn().negotiated_key_exchange_group().map(|g| g.name()),
            Some(want),
            "{names:?} over {version:?}"
        );
        assert_eq!(c.get("/hello.txt", &[]).status, 200, "{names:?}");
    }
}
