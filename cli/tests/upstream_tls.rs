//! TLS to upstream servers (`proxy = "https://host:port"`): a real rustls upstream made from
//! a test CA, proxied requests and bodies both ways, the TLS connection kept alive and reused,
//! a certificate from an unknown CA or for another name refused (502, a log line naming the
//! cause, a counter), a client certificate given to an upstream that requires one, and health
//! checks spoken over TLS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{support, tls_support};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::server::WebPkiClientVerifier;
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use support::*;
use tls_support::{provider, Ca, Leaf};

/// The body of `/big` answers.
const BIG: usize = 300_000;

/// A TLS upstream on 127.0.0.1 (rustls, a thread per connection, keep-alive). Answers
/// `/health` with `health`, `/big` with [`BIG`] bytes, anything else with
/// `NAME METHOD PATH BODY_LEN BODY_SUM`. Counts handshakes, the names clients sent (SNI) and
/// the client certificates they showed.
struct TlsApp {
    addr: SocketAddr,
    /// Status of answers other than `/health` ones.
    status: Arc<AtomicU16>,
    /// Requests answered, health checks apart.
    requests: Arc<AtomicUsize>,
    health: Arc<AtomicU16>,
    handshakes: Arc<AtomicUsize>,
    checks: Arc<AtomicUsize>,
    snis: Arc<Mutex<Vec<String>>>,
    client_certs: Arc<AtomicUsize>,
    /// Handshakes that resumed a session.
    resumed: Arc<AtomicUsize>,
}

impl TlsApp {
    /// With `client_ca`, a client certificate from it is required.
    fn start(name: &'static str, leaf: &Leaf, client_ca: Option<&Ca>) -> TlsApp {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(ca.roots()), provider())
                    .build()
                    .unwrap(),
            ),
        };
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let config = Arc::new(
            builder
                .with_single_cert(vec![leaf.der.clone()], key)
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let app = TlsApp {
            addr: listener.local_addr().unwrap(),
            status: Arc::new(AtomicU16::new(200)),
            requests: Arc::new(AtomicUsize::new(0)),
            health: Arc::new(AtomicU16::new(200)),
            handshakes: Arc::new(AtomicUsize::new(0)),
            checks: Arc::new(AtomicUsize::new(0)),
            snis: Arc::new(Mutex::new(Vec::new())),
            client_certs: Arc::new(AtomicUsize::new(0)),
            resumed: Arc::new(AtomicUsize::new(0)),
        };
        let resumed = app.resumed.clone();
        let (status, requests) = (app.status.clone(), app.requests.clone());
        let (health, handshakes, checks, snis, client_certs) = (
            app.health.clone(),
            app.handshakes.clone(),
            app.checks.clone(),
            app.snis.clone(),
            app.client_certs.clone(),
        );
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(mut tcp) = tcp else { continue };
                let config = config.clone();
                let resumed = resumed.clone();
                let (status, requests) = (status.clone(), requests.clone());
                let (health, handshakes, checks, snis, client_certs) = (
                    health.clone(),
                    handshakes.clone(),
                    checks.clone(),
                    snis.clone(),
                    client_certs.clone(),
                );
                std::thread::spawn(move || {
                    let mut conn = ServerConnection::new(config).unwrap();
                    while conn.is_handshaking() {
                        if conn.complete_io(&mut tcp).is_err() {
                            return;
                        }
                    }
                    handshakes.fetch_add(1, Ordering::SeqCst);
                    if conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                        resumed.fetch_add(1, Ordering::SeqCst);
                    }
                    snis.lock()
                        .unwrap()
                        .push(conn.server_name().unwrap_or("").to_owned());
                    if conn.peer_certificates().is_some_and(|c| !c.is_empty()) {
                        client_certs.fetch_add(1, Ordering::SeqCst);
                    }
                    let mut r = BufReader::new(StreamOwned::new(conn, tcp));
                    while let Some((method, path, len)) = read_head(&mut r) {
                        let mut body = vec![0u8; len];
                        if r.read_exact(&mut body).is_err() {
                            return;
                        }
                        let (code, answer) = match path.as_str() {
                            "/health" => {
                                checks.fetch_add(1, Ordering::SeqCst);
                                (health.load(Ordering::SeqCst), Vec::new())
                            }
                            "/big" => (200, big_body()),
                            _ if status.load(Ordering::SeqCst) != 200 => {
                                requests.fetch_add(1, Ordering::SeqCst);
                                (status.load(Ordering::SeqCst), b"unavailable".to_vec())
                            }
                            _ => {
                                requests.fetch_add(1, Ordering::SeqCst);
                                let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
                                let text = format!("{name} {method} {path} {len} {sum}");
                                (200, text.into_bytes())
                            }
                        };
                        let head = format!(
                            "HTTP/1.1 {code} X\r\nContent-Length: {}\r\n\r\n",
                            answer.len()
                        );
                        let w = r.get_mut();
                        if w.write_all(head.as_bytes()).is_err()
                            || w.write_all(&answer).is_err()
                            || w.flush().is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        app
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

fn big_body() -> Vec<u8> {
    (0..BIG).map(|i| b'a' + (i % 26) as u8).collect()
}

/// A request head: method, path and Content-Length; None at EOF or on a broken connection.
fn read_head<R: BufRead>(r: &mut R) -> Option<(String, String, usize)> {
    let mut first = String::new();
    if r.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let mut len = 0;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((n, v)) = line.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
        }
    }
    let mut words = first.split(' ');
    Some((words.next()?.to_owned(), words.next()?.to_owned(), len))
}

/// A config folder with the test CA as `ca.pem` and `tern.toml` holding `routes`.
struct Config {
    dir: tempfile::TempDir,
}

impl Config {
    fn new(ca: &Ca, routes: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        ca.write(dir.path());
        let text = format!(
            "[[site]]\nname = \"app\"\ndefault = true\n{routes}\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n"
        );
        std::fs::write(dir.path().join("tern.toml"), text).unwrap();
        Config { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("tern.toml")
    }

    /// `tern run` on it, one worker (one pool), sandboxed.
    fn start(&self) -> Tern {
        let tern = Tern::start_run(&self.path());
        assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
        tern
    }

    /// `tern run --check` on it: its exit code and what it printed.
    fn check(&self) -> (i32, String) {
        let out = Command::new(TERN)
            .arg("run")
            .arg("--config")
            .arg(self.path())
            .arg("--check")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }
}

fn post(c: &mut Client, path: &str, body: &[u8]) -> Resp {
    let len = body.len().to_string();
    c.send(&request_bytes("POST", path, &[("Content-Length", &len)]));
    c.send(body);
    c.read_response(false)
}

#[test]
fn requests_and_bodies_go_over_tls_on_one_kept_alive_connection() {
    let ca = Ca::new();
    let app = TlsApp::start("a", &ca.issue("app", &["app.test", "127.0.0.1"]), None);
    let routes = format!(
        "[[site.route]]\npath = \"/\"\nproxy = \"https://127.0.0.1:{port}\"\n\
         proxy_tls_server_name = \"app.test\"\nproxy_tls_ca = \"ca.pem\"\n\
         [[site.route]]\npath = \"/by-ip/\"\nproxy = \"https://127.0.0.1:{port}\"\n\
         proxy_tls_ca = \"ca.pem\"\n",
        port = app.addr.port()
    );
    let tern = Config::new(&ca, &routes).start();
    let mut c = tern.client();
    let r = c.get("/hello", &[]);
    assert_eq!((r.status, r.text().as_str()), (200, "a GET /hello 0 0"));
    for i in 0..5 {
        let r = c.get(&format!("/n{i}"), &[]);
        assert_eq!(r.text(), format!("a GET /n{i} 0 0"));
    }
    assert_eq!(app.handshakes(), 1, "one TLS connection, kept alive");
    // A connection that carried a request body is not reused (conn/relay/mod.rs:
    // `carried_body`): the next request makes a new one, resuming the TLS session.
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
    let r = post(&mut c, "/upload", &body);
    assert_eq!(r.text(), format!("a POST /upload 200000 {sum}"));
    let r = c.get("/big", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == big_body(), "the large answer arrives whole");
    let r = c.get("/last", &[]);
    assert_eq!(r.text(), "a GET /last 0 0");
    assert_eq!(app.handshakes(), 2);
    assert_eq!(
        app.resumed.load(Ordering::SeqCst),
        1,
        "the session is resumed"
    );
    let root = "{upstream=\"app /\"}";
    assert_eq!(
        tern.metric(&format!("tern_upstream_tls_handshakes_total{root}")),
        2
    );
    assert_eq!(tern.metric(&format!("tern_upstream_reuses_total{root}")), 7);
    assert_eq!(
        app.snis.lock().unwrap().as_slice(),
        ["app.test", "app.test"]
    );
    // An IP address is verified against the certificate's IP addresses (no SNI is sent).
    let r = tern.get("/by-ip/x");
    assert_eq!((r.status, r.text().as_str()), (200, "a GET /by-ip/x 0 0"));
    assert_eq!(
        app.snis.lock().unwrap().as_slice(),
        ["app.test", "app.test", ""]
    );
    // Counted for its own route's group.
    let by_ip = "{upstream=\"app /by-ip/\"}";
    assert_eq!(
        tern.metric(&format!("tern_upstream_tls_handshakes_total{by_ip}")),
        1
    );
    assert_eq!(
        tern.metric(&format!("tern_upstream_tls_handshakes_total{root}")),
        2
    );
}

#[test]
fn an_unknown_ca_or_another_name_is_refused_with_502_a_log_line_and_a_counter() {
    let ca = Ca::new();
    let stranger = Ca::named("another CA");
    let app = TlsApp::start("a", &stranger.issue("app", &["app.test"]), None);
    let named = TlsApp::start("b", &ca.issue("other", &["other.test"]), None);
    let routes = format!(
        "[[site.route]]\npath = \"/ca/\"\nproxy = \"https://127.0.0.1:{}\"\n\
         proxy_tls_server_name = \"app.test\"\nproxy_tls_ca = \"ca.pem\"\n\
         [[site.route]]\npath = \"/name/\"\nproxy = \"https://127.0.0.1:{}\"\n\
         proxy_tls_server_name = \"app.test\"\nproxy_tls_ca = \"ca.pem\"\n",
        app.addr.port(),
        named.addr.port()
    );
    let tern = Config::new(&ca, &routes).start();
    assert_eq!(tern.get("/ca/x").status, 502);
    assert_eq!(
        tern.metric("tern_upstream_tls_failures_total{upstream=\"app /ca/\",cause=\"unknown_ca\"}"),
        1
    );
    // The log line was written before the 502; stderr reaches the test through a pipe.
    let logged = || tern.log_lines("TLS handshake with the upstream failed");
    assert!(
        eventually(Duration::from_secs(5), || !logged().is_empty()),
        "{}",
        tern.stderr_text()
    );
    let lines = logged();
    assert_eq!(lines.len(), 1, "{}", tern.stderr_text());
    assert!(lines[0].contains("unknown_ca"), "{}", lines[0]);
    assert_eq!(tern.get("/name/x").status, 502);
    let failures = |group: &str, cause: &str| {
        tern.metric(&format!(
            "tern_upstream_tls_failures_total{{upstream=\"app {group}\",cause=\"{cause}\"}}"
        ))
    };
    assert_eq!(failures("/name/", "name_mismatch"), 1);
    assert_eq!(failures("/name/", "unknown_ca"), 0);
    assert_eq!(failures("/ca/", "unknown_ca"), 1);
    assert_eq!(failures("/ca/", "name_mismatch"), 0);
    for group in ["/ca/", "/name/"] {
        let series = format!("tern_upstream_tls_handshakes_total{{upstream=\"app {group}\"}}");
        assert_eq!(tern.metric(&series), 0);
    }
    assert_eq!(app.handshakes() + named.handshakes(), 0);
}

#[test]
fn a_client_certificate_is_shown_to_an_upstream_that_requires_one() {
    let ca = Ca::new();
    let app = TlsApp::start("a", &ca.issue("app", &["app.test"]), Some(&ca));
    let config_dir_routes = |with_cert: bool| {
        format!(
            "[[site.route]]\npath = \"/\"\nproxy = \"https://127.0.0.1:{}\"\n\
             proxy_tls_server_name = \"app.test\"\nproxy_tls_ca = \"ca.pem\"\n{}",
            app.addr.port(),
            if with_cert {
                "proxy_tls_client_cert = \"client.pem\"\nproxy_tls_client_key = \"client.key\"\n"
            } else {
                ""
            }
        )
    };
    let without = Config::new(&ca, &config_dir_routes(false));
    let tern = without.start();
    // TLS 1.3: the client's side of the handshake ends before the server judges its
    // (missing) certificate, so the refusal comes as an alert where the answer was awaited.
    assert_eq!(tern.get("/x").status, 502, "no certificate: refused");
    assert_eq!(app.handshakes(), 0);
    drop(tern);
    let with = Config::new(&ca, &config_dir_routes(true));
    ca.issue("tern", &["tern.test"])
        .write(with.dir.path(), "client");
    let tern = with.start();
    let r = tern.get("/x");
    assert_eq!((r.status, r.text().as_str()), (200, "a GET /x 0 0"));
    assert_eq!(app.client_certs.load(Ordering::SeqCst), 1);
    // A reload reads the CA, certificate and key files again, inside the sandbox.
    let line = tern.reload(1);
    assert!(!line.contains("failed"), "{line}");
    assert_eq!(tern.get("/y").status, 200);
}

#[test]
fn health_checks_speak_tls() {
    let ca = Ca::new();
    let leaf = ca.issue("app", &["app.test"]);
    let (a, b) = (
        TlsApp::start("a", &leaf, None),
        TlsApp::start("b", &leaf, None),
    );
    let routes = format!(
        "[[site.route]]\npath = \"/\"\nproxy = [\"https://127.0.0.1:{}\", \"https://127.0.0.1:{}\"]\n\
         proxy_tls_server_name = \"app.test\"\nproxy_tls_ca = \"ca.pem\"\n\
         health_check = {{ path = \"/health\", interval = 1, timeout = 1, rise = 1, fall = 1 }}\n",
        a.addr.port(),
        b.addr.port()
    );
    let tern = Config::new(&ca, &routes).start();
    let up = |app: &TlsApp| {
        format!(
            "tern_upstream_server_up{{upstream=\"app /\",server=\"{}\"}}",
            app.addr
        )
    };
    assert!(
        eventually(Duration::from_secs(5), || b.checks.load(Ordering::SeqCst)
            > 0),
        "b is checked over TLS"
    );
    assert_eq!(tern.metric(&up(&b)), 1);
    b.health.store(500, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(5), || tern.metric(&up(&b)) == 0),
        "b taken out: {}",
        tern.stderr_text()
    );
    let mut c = tern.client();
    for _ in 0..4 {
        assert!(c.get("/x", &[]).text().starts_with("a "));
    }
    assert!(a.snis.lock().unwrap().iter().all(|s| s == "app.test"));
}

#[test]
fn check_refuses_tls_settings_it_cannot_honour() {
    let ca = Ca::new();
    let cases = [
        (
            "proxy = \"127.0.0.1:1\"\nproxy_tls_ca = \"ca.pem\"\n",
            "proxy_tls_ca needs TLS upstreams",
        ),
        (
            "proxy = [\"https://127.0.0.1:1\", \"127.0.0.1:2\"]\n",
            "either every upstream of a route is https:// or none is",
        ),
        (
            "proxy = \"https://127.0.0.1:1\"\nproxy_tls_ca = \"missing.pem\"\n",
            "cannot read certificates",
        ),
        (
            "proxy = \"https://127.0.0.1:1\"\nproxy_tls_ca = \"tern.toml\"\n",
            "holds no certificate",
        ),
        (
            "proxy = \"https://127.0.0.1:1\"\nproxy_tls_ca = \"ca.pem\"\nproxy_tls_client_cert = \"ca.pem\"\n",
            "go together",
        ),
        (
            "proxy = \"https://127.0.0.1:1\"\nproxy_tls_server_name = \"not a name\"\n",
            "is not a DNS name or IP address",
        ),
    ];
    for (route, want) in cases {
        let config = Config::new(&ca, &format!("[[site.route]]\npath = \"/\"\n{route}"));
        let (code, text) = config.check();
        assert_eq!(code, 1, "{route}: {text}");
        assert!(
            text.contains(want) && text.contains("line "),
            "{route}: {text}"
        );
    }
    let config = Config::new(
        &ca,
        "[[site.route]]\npath = \"/\"\nproxy = \"https://127.0.0.1:1\"\nproxy_tls_ca = \"ca.pem\"\n",
    );
    assert_eq!(config.check().0, 0, "{}", config.check().1);
}

/// Set-up (3) of issue 27: an app over TLS on two servers (weights 2:1) and a backup, the
/// second failing its health check and answering 503, retries, a per-route body limit; run in
/// tern and in Debian's nginx, which answer the same requests the same way. By design they
/// differ in how: tern's health check takes the failing server out before any request
/// reaches it, while open-source nginx has no active checks and learns from a request that
/// gets a 503 (passed on to the next server by `proxy_next_upstream http_503`, POSTs too with
/// `non_idempotent`; tern retries only idempotent requests on a status, and needs no retry
/// here since no request reaches the failing server).
#[test]
fn setup_3_an_app_over_tls_with_a_failing_server_answers_as_in_nginx() {
    let ca = Ca::new();
    let leaf = ca.issue("app", &["app.test"]);
    let a = TlsApp::start("a", &leaf, None);
    let b = TlsApp::start("b", &leaf, None);
    let spare = TlsApp::start("spare", &leaf, None);
    b.health.store(500, Ordering::SeqCst);
    b.status.store(503, Ordering::SeqCst);
    // The README's block, on this test's ports.
    let routes = setup_3_readme_block("toml")
        .replace("10.0.0.1:8443", &a.addr.to_string())
        .replace("10.0.0.2:8443", &b.addr.to_string())
        .replace("10.0.0.3:8443", &spare.addr.to_string());
    let config = Config::new(&ca, &routes);
    let tern = config.start();
    let b_up = format!(
        "tern_upstream_server_up{{upstream=\"app /\",server=\"{}\"}}",
        b.addr
    );
    assert!(
        eventually(Duration::from_secs(5), || b.checks.load(Ordering::SeqCst)
            > 0
            && tern.metric(&b_up) == 0),
        "b taken out by its check: {}",
        tern.stderr_text()
    );
    let tern_answers = setup_3_answers(tern.addr());
    assert_eq!(
        b.requests.load(Ordering::SeqCst),
        0,
        "tern: b gets no request"
    );
    drop(tern);

    let nginx_dir = config.dir.path().join("nginx");
    let port = free_port();
    let http = format!(
        r#"
upstream app {{
    server 127.0.0.1:{a} weight=2 max_fails=1 fail_timeout=30s;
    server 127.0.0.1:{b} max_fails=1 fail_timeout=30s;
    server 127.0.0.1:{spare} backup;
}}
server {{
    listen 127.0.0.1:{port};
    location / {{
        proxy_pass https://app;
        proxy_ssl_verify on;
        proxy_ssl_trusted_certificate {ca};
        proxy_ssl_name app.test;
        proxy_ssl_server_name on;
        proxy_next_upstream error timeout http_503 non_idempotent;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        client_max_body_size 1k;
    }}
}}
"#,
        a = a.addr.port(),
        b = b.addr.port(),
        spare = spare.addr.port(),
        ca = config.dir.path().join("ca.pem").display(),
    );
    let Some(nginx) = Nginx::start(&nginx_dir, &http, port) else {
        return;
    };
    let nginx_answers = setup_3_answers(nginx.addr);
    assert_eq!(tern_answers, nginx_answers);
    assert!(
        b.requests.load(Ordering::SeqCst) >= 1,
        "nginx: b learnt about from a request's 503"
    );
    assert_eq!(
        spare.requests.load(Ordering::SeqCst),
        0,
        "the backup stays idle in both"
    );
}

fn setup_3_readme_block(lang: &str) -> String {
    readme_block(
        "### An app over TLS on two servers, one failing, in tern and nginx",
        lang,
    )
}

#[test]
fn setup_3_caddyfile_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), Ca::new().pem()).unwrap();
    let file = dir.path().join("Caddyfile");
    let caddyfile = setup_3_readme_block("caddy").replace(
        "tls_trusted_ca_certs ca.pem",
        &format!(
            "tls_trusted_ca_certs {}",
            dir.path().join("ca.pem").display()
        ),
    );
    std::fs::write(&file, caddyfile).unwrap();
    if let Some(Err(e)) = caddy_validate(&file, dir.path()) {
        panic!("{e}");
    }
}

/// The requests of set-up (3), each on a new connection: (status, body, or only the status
/// for a 413, whose body is each server's own).
fn setup_3_answers(addr: SocketAddr) -> Vec<(u16, String)> {
    let mut got = Vec::new();
    for i in 0..6 {
        let r = Client::connect(addr).get(&format!("/page/{i}?q=1"), &[]);
        got.push((r.status, r.text()));
    }
    let small = vec![b'x'; 500];
    let r = post(&mut Client::connect(addr), "/form", &small);
    got.push((r.status, r.text()));
    let mut c = Client::connect(addr);
    c.send(&request_bytes(
        "POST",
        "/form",
        &[("Content-Length", "2000")],
    ));
    let r = c.read_response(false);
    got.push((r.status, String::new()));
    got
}

/// Without `proxy_tls_ca` the system's roots are used (Debian's `ca-certificates`): the config
/// checks, and tern starts sandboxed with the bundle granted; the test CA's upstream is then,
/// rightly, not trusted.
#[test]
fn system_roots_are_the_default_and_do_not_trust_a_private_ca() {
    if !std::path::Path::new("/etc/ssl/certs/ca-certificates.crt").exists() {
        eprintln!("SKIPPED: no system CA bundle (Debian's ca-certificates package)");
        return;
    }
    let ca = Ca::new();
    let app = TlsApp::start("a", &ca.issue("app", &["app.test"]), None);
    let routes = format!(
        "[[site.route]]\npath = \"/\"\nproxy = \"https://127.0.0.1:{}\"\n\
         proxy_tls_server_name = \"app.test\"\n",
        app.addr.port()
    );
    let config = Config::new(&ca, &routes);
    assert_eq!(config.check().0, 0, "{}", config.check().1);
    let tern = config.start();
    assert_eq!(tern.get("/x").status, 502);
    assert_eq!(
        tern.metric("tern_upstream_tls_failures_total{upstream=\"app /\",cause=\"unknown_ca\"}"),
        1
    );
    // A reload reads the bundle again, inside the sandbox.
    let line = tern.reload(1);
    assert!(!line.contains("failed"), "{line}");
}
