//! Automatic HTTPS against a real ACME CA: Let's Encrypt's test server Pebble, with
//! pebble-challtestsrv as its DNS (every name is 127.0.0.1). Both are installed by
//! `scripts/install-acme-test-deps` (`go install ...@v2.10.3`) and started here on loopback
//! ports of their own, one pair per test.
//!
//! Each test starts tern first, while the CA is not there yet (start-up must not wait for it:
//! the self-signed certificate is served), then the CA with its validation ports pointed at
//! tern's listeners, then sends SIGHUP (tern's helper looks again at once instead of after its
//! back-off). Served chains are verified against the root Pebble's management API hands out.
//! Everything runs with `--sandbox on` (the suite's default).

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::{support, tls_support};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use support::*;
use tls_support::*;

/// A Pebble binary installed by scripts/install-acme-test-deps.
fn tool(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(gobin) = std::env::var_os("GOBIN") {
        dirs.push(PathBuf::from(gobin));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join("go/bin"));
    }
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is missing: run scripts/install-acme-test-deps (it is part of scripts/test-all)")
        })
}

/// A Pebble CA and its DNS server, killed when dropped.
struct Pebble {
    pebble: Child,
    dns: Child,
    /// Trusted for the CA's own HTTPS (`--acme-ca-root`).
    ca_file: PathBuf,
    directory: String,
    management: SocketAddr,
    log: PathBuf,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for child in [&mut self.pebble, &mut self.dns] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn listening(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

impl Pebble {
    /// Starts Pebble validating HTTP-01 on `http_port` and TLS-ALPN-01 on `tls_port` of
    /// 127.0.0.1, with `env` added (PEBBLE_WFE_NONCEREJECT...). Its directory listens on
    /// `listen` if given (a URL tern was started with), else on a free port.
    fn start(
        dir: &Path,
        listen: Option<u16>,
        http_port: u16,
        tls_port: u16,
        env: &[(&str, &str)],
    ) -> Pebble {
        Pebble::start_with(dir, listen, http_port, tls_port, env, None)
    }

    /// [`Pebble::start`], requiring external account binding with `eab` (key id, base64url
    /// HMAC key) if given.
    fn start_with(
        dir: &Path,
        listen: Option<u16>,
        http_port: u16,
        tls_port: u16,
        env: &[(&str, &str)],
        eab: Option<(&str, &str)>,
    ) -> Pebble {
        let eab_json = match eab {
            Some((kid, key)) => format!(
                r#""externalAccountBindingRequired": true, "externalAccountMACKeys": {{"{kid}": "{key}"}},"#
            ),
            None => r#""externalAccountBindingRequired": false,"#.to_string(),
        };
        let ca = Ca::new();
        let leaf = ca.issue("pebble", &["127.0.0.1", "localhost"]);
        let (cert, key) = leaf.write(dir, "pebble");
        let ca_file = ca.write(dir);
        // Free ports are picked by binding and letting go: if another process takes one in
        // between, the CA or DNS server exits at once and is started again on others.
        for _attempt in 0..5 {
            let (management, dns_port, dns_management) = (free_port(), free_port(), free_port());
            let listen = listen.unwrap_or_else(free_port);
            let config = dir.join("pebble.json");
            let json = format!(
                r#"{{"pebble": {{"listenAddress": "127.0.0.1:{listen}",
"managementListenAddress": "127.0.0.1:{management}",
"certificate": "{}", "privateKey": "{}",
"httpPort": {http_port}, "tlsPort": {tls_port}, "ocspResponderURL": "",
{eab_json}
"retryAfter": {{"authz": 1, "order": 1}}, "keyAlgorithm": "ecdsa",
"profiles": {{"default": {{"description": "90 days", "validityPeriod": 7776000}},
"shortlived": {{"description": "6 days", "validityPeriod": 518400}}}}}}}}"#,
                cert.display(),
                key.display()
            );
            std::fs::write(&config, json).unwrap();
            let log = dir.join("pebble.log");
            let mut dns = Command::new(tool("pebble-challtestsrv"))
                .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
                .args(["-management", &format!("127.0.0.1:{dns_management}")])
                // No AAAA answers: tern listens on 127.0.0.1 only. Its own challenge
                // servers are off: tern answers.
                .args(["-defaultIPv6", "", "-http01", "", "-https01", ""])
                .args(["-tlsalpn01", "", "-doh", ""])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut pebble = Command::new(tool("pebble"))
                .arg("-config")
                .arg(&config)
                .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
                .env("PEBBLE_VA_NOSLEEP", "1")
                .env("PEBBLE_WFE_NONCEREJECT", "0")
                .env("PEBBLE_AUTHZREUSE", "0")
                .envs(env.iter().copied())
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let addrs =
                [listen, management, dns_management].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
            let up = eventually(Duration::from_secs(10), || {
                let exited = [&mut pebble, &mut dns]
                    .iter_mut()
                    .any(|c| c.try_wait().unwrap().is_some());
                exited || addrs.iter().all(|a| listening(*a))
            });
            let exited = [&mut pebble, &mut dns]
                .iter_mut()
                .any(|c| c.try_wait().unwrap().is_some());
            if up && !exited {
                return Pebble {
                    pebble,
                    dns,
                    ca_file,
                    directory: format!("https://127.0.0.1:{listen}/dir"),
                    management: addrs[1],
                    log,
                };
            }
            for c in [&mut pebble, &mut dns] {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        panic!("Pebble did not start on free ports five times")
    }

    /// A request to the management API (HTTPS, Pebble's own test CA), with curl.
    fn management(&self, method: &str, path: &str, body: Option<&str>) -> String {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--fail", "-X", method, "--cacert"])
            .arg(&self.ca_file)
            .arg(format!("https://{}{path}", self.management));
        if let Some(b) = body {
            cmd.args(["--data-binary", b]);
        }
        let out = cmd.output().expect("curl");
        assert!(
            out.status.success(),
            "{method} {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A client that trusts only the root Pebble issues from (its management API's
    /// `/roots/0`), offering HTTP/1.1.
    fn client(&self) -> Arc<ClientConfig> {
        let pem = self.management("GET", "/roots/0", None);
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(pem.as_bytes()).unwrap())
            .unwrap();
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    fn orders_placed(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("POST /order-plz"))
            .count()
    }
}

/// The ACME flags for `names` against `pebble`'s directory, state in `state`.
fn acme_args(pebble_ca: &Path, directory: &str, state: &Path, names: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--acme-state".to_string(),
        state.display().to_string(),
        "--acme-directory".into(),
        directory.into(),
        "--acme-ca-root".into(),
        pebble_ca.display().to_string(),
        "--acme-email".into(),
        "ops@a.test".into(),
    ];
    for n in names {
        args.push("--acme".into());
        args.push(n.to_string());
    }
    args
}

/// A site with `hello.txt`, a Pebble that validates on two fresh ports, and the `tern serve`
/// arguments that listen on them and ask for a certificate for `name`.
struct OneSite {
    site: Site,
    state: PathBuf,
    pebble: Pebble,
    args: Vec<String>,
    _ca_dir: tempfile::TempDir,
}

fn one_site(name: &str) -> OneSite {
    let site = Site::new();
    site.write("hello.txt", "hello\n");
    let state = site.base().join("acme-state");
    let ca_dir = tempfile::tempdir().unwrap();
    let (http_port, https_port) = (free_port(), free_port());
    let pebble = Pebble::start(ca_dir.path(), None, http_port, https_port, &[]);
    let mut args = vec![
        "--listen-tls".to_string(),
        format!("127.0.0.1:{https_port}"),
        "--listen".into(),
        format!("127.0.0.1:{http_port}"),
    ];
    args.extend(acme_args(
        &pebble.ca_file,
        &pebble.directory,
        &state,
        &[name],
    ));
    OneSite {
        site,
        state,
        pebble,
        args,
        _ca_dir: ca_dir,
    }
}

/// A labelled value of /statusz, e.g. `acme_orders{result="valid"}`.
fn value(tern: &Tern, name: &str) -> u64 {
    tern.counter_at("/statusz", name)
}

/// Waits (SIGHUP every few seconds: the helper backs off a minute after the CA was not
/// there) until `valid` orders succeeded.
fn wait_for_orders(tern: &Tern, valid: u64) {
    let mut next_hup = std::time::Instant::now();
    let done = eventually(Duration::from_secs(60), || {
        if std::time::Instant::now() >= next_hup {
            tern.signal(libc::SIGHUP);
            next_hup += Duration::from_secs(5);
        }
        value(tern, "acme_orders{result=\"valid\"}") >= valid
    });
    assert!(
        done,
        "{valid} orders not done within 60 s; /statusz:\n{}\nstderr:\n{}",
        tern.get("/statusz").text(),
        tern.stderr_text()
    );
}

/// The leaf tern shows `name` (any certificate accepted).
fn leaf_for(tern: &Tern, name: &str) -> CertificateDer<'static> {
    let config = Arc::new(any_cert_config(&[TLS13]));
    TlsClient::connect_tls(tern.https(), &config, name).leaf()
}

/// The start-up promise: the server answers at once, with the self-signed certificate,
/// while the CA is not even there.
fn serves_before_the_ca(tern: &Tern, name: &str) -> CertificateDer<'static> {
    let leaf = leaf_for(tern, name);
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).unwrap();
    assert_eq!(
        cert.subject(),
        cert.issuer(),
        "a self-signed certificate before any issuance"
    );
    leaf
}

#[test]
fn tls_alpn_for_a_name_and_an_address_then_a_restart_orders_nothing() {
    let site = Site::new();
    site.write("hello.txt", "hello over acme\n");
    let state = site.base().join("acme-state");
    let ca_dir = tempfile::tempdir().unwrap();
    let names = ["a.test", "127.0.0.1"];
    // The CA is down at start: nothing listens at its URL yet, and its root file is missing.
    let pebble_port = free_port();
    let directory = format!("https://127.0.0.1:{pebble_port}/dir");
    let ca_file = ca_dir.path().join("ca.pem");
    let mut args: Vec<String> = vec!["--listen".into(), "127.0.0.1:0".into()];
    args.extend(["--acme-challenge".into(), "tls-alpn-01".into()]);
    args.extend(acme_args(&ca_file, &directory, &state, &names));
    let tern = Tern::serve_tls(&site.root, &args);
    let self_signed = serves_before_the_ca(&tern, "a.test");
    assert!(
        eventually(Duration::from_secs(10), || value(
            &tern,
            "acme_orders{result=\"failed\"}"
        ) >= 1),
        "the CA is down: an order fails; stderr:\n{}",
        tern.stderr_text()
    );
    assert_eq!(leaf_for(&tern, "a.test"), self_signed);
    // The CA comes up, validating on tern's ports; tern issues without a restart.
    let pebble = Pebble::start(
        ca_dir.path(),
        Some(pebble_port),
        tern.addr().port(),
        tern.https().port(),
        &[],
    );
    assert_eq!(pebble.ca_file, ca_file);
    let second = vec![
        "--listen".to_string(),
        format!("127.0.0.1:{}", tern.addr().port()),
        "--listen-tls".into(),
        format!("127.0.0.1:{}", tern.https().port()),
        "--acme-challenge".into(),
        "tls-alpn-01".into(),
    ]
    .into_iter()
    .chain(acme_args(&ca_file, &directory, &state, &names))
    .collect::<Vec<_>>();
    wait_for_orders(&tern, 2);
    let trusted = pebble.client();
    let mut c = TlsClient::connect_tls(tern.https(), &trusted, "a.test");
    let resp = c.get("/hello.txt", &[]);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "hello over acme\n");
    let a_leaf = c.leaf();
    assert_ne!(a_leaf, self_signed);
    // An https://127.0.0.1/ client sends no SNI: it gets the address's certificate.
    let ip_leaf = TlsClient::connect_tls(tern.https(), &trusted, "127.0.0.1").leaf();
    assert_ne!(ip_leaf, a_leaf);
    // The address's certificate is a short-lived one (Pebble's `shortlived`: 6 days).
    let (_, ip) = x509_parser::parse_x509_certificate(ip_leaf.as_ref()).unwrap();
    let days = (ip.validity().not_after.timestamp() - ip.validity().not_before.timestamp()) / 86400;
    assert!(days <= 7, "IP certificate valid {days} days");
    assert_eq!(
        tern.log_lines("certificate issued").len(),
        2,
        "{}",
        tern.stderr_text()
    );
    // The ACME figures on /metrics keep Prometheus's conventions.
    if have_promtool() {
        let page = tern.get("/metrics").text();
        assert!(page.contains("tern_acme_orders_total{"), "{page}");
        promtool_accepts("tern serve --acme's /metrics", &page);
    }
    // The helper runs sandboxed too (Landlock sets no_new_privs).
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", tern.pid())).unwrap();
    let helper = children.split_whitespace().next().expect("the ACME helper");
    let status = std::fs::read_to_string(format!("/proc/{helper}/status")).unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{helper}/cmdline")).unwrap();
    assert!(cmdline.contains("acme-helper"), "{cmdline:?}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    // Keys are private to tern's account.
    use std::os::unix::fs::PermissionsExt;
    let ca_folder = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    for file in [
        "account.json",
        "certs/a.test/cert.pem",
        "certs/127.0.0.1/cert.pem",
    ] {
        let mode = std::fs::metadata(ca_folder.join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
    drop(tern);

    // A restart with the state folder kept places zero orders and serves the same
    // certificates from its first handshake on.
    let orders_before = pebble.orders_placed();
    assert_eq!(orders_before, 2, "Pebble's log counts the orders");
    let tern = Tern::spawn(serve_command(&site.root, &[], &second));
    assert!(
        eventually(Duration::from_secs(15), || value(&tern, "acme_checks") >= 1),
        "the helper's first look; stderr:\n{}",
        tern.stderr_text()
    );
    assert_eq!(leaf_for(&tern, "a.test"), a_leaf);
    assert_eq!(value(&tern, "acme_orders{result=\"valid\"}"), 0);
    assert_eq!(value(&tern, "acme_orders{result=\"failed\"}"), 0);
    assert_eq!(pebble.orders_placed(), orders_before);
    assert!(value(&tern, "acme_next_renewal_seconds{name=\"a.test\"}") > 86400);
    // The expiry shown is the stored certificate's (Pebble picks a profile at random for
    // orders that name none: 6 or 90 days).
    let expiry = value(&tern, "acme_certificate_expiry_seconds{name=\"a.test\"}") as i64;
    let (_, a) = x509_parser::parse_x509_certificate(a_leaf.as_ref()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let left = a.validity().not_after.timestamp() - now;
    assert!((expiry - left).abs() <= 5, "{expiry} vs {left}");
}

#[test]
fn http01_is_answered_before_the_https_redirect_despite_bad_nonces() {
    let site = Site::new();
    site.write("hello.txt", "hello\n");
    let state = site.base().join("acme-state");
    let ca_dir = tempfile::tempdir().unwrap();
    let (redirect_port, https_port) = (free_port(), free_port());
    // A third of the good nonces refused (badNonce): instant-acme retries them.
    let pebble = Pebble::start(
        ca_dir.path(),
        None,
        redirect_port,
        https_port,
        &[("PEBBLE_WFE_NONCEREJECT", "30")],
    );
    let mut args = vec![
        "--listen-tls".to_string(),
        format!("127.0.0.1:{https_port}"),
        "--redirect-http".into(),
        format!("127.0.0.1:{redirect_port}"),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--acme-challenge".into(),
        "http-01".into(),
    ];
    args.extend(acme_args(
        &pebble.ca_file,
        &pebble.directory,
        &state,
        &["a.test"],
    ));
    let tern = Tern::spawn(serve_command(&site.root, &[], &args));
    // Anything else on the redirect listener, unknown tokens included, is redirected.
    let redirect: SocketAddr = format!("127.0.0.1:{redirect_port}").parse().unwrap();
    let resp = Client::connect(redirect).get("/.well-known/acme-challenge/unknown", &[]);
    assert_eq!(resp.status, 308);
    wait_for_orders(&tern, 1);
    let trusted = pebble.client();
    let mut c = TlsClient::connect_tls(tern.https(), &trusted, "a.test");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
    // Pebble's HTTP-01 port is the redirect listener: the answer came before the redirect.
    assert!(!tern.log_lines("order placed (http-01)").is_empty());
}

#[test]
fn the_ca_moving_the_renewal_window_renews_without_a_restart() {
    let OneSite {
        site,
        pebble,
        args,
        _ca_dir,
        ..
    } = one_site("a.test");
    let tern = Tern::spawn(serve_command(&site.root, &[], &args));
    wait_for_orders(&tern, 1);
    let trusted = pebble.client();
    let first = TlsClient::connect_tls(tern.https(), &trusted, "a.test").leaf();
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64(first.as_ref())
    );
    // A malformed ARI answer: logged, nothing ordered, the certificate kept.
    let body = serde_json::json!({"Certificate": pem, "ARIResponse": "{\"suggestedWindow\": 7"})
        .to_string();
    pebble.management("POST", "/set-renewal-info/", Some(&body));
    tern.signal(libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(10), || !tern
            .log_lines("a.test: renewal information:")
            .is_empty()),
        "{}",
        tern.stderr_text()
    );
    assert_eq!(value(&tern, "acme_orders{result=\"valid\"}"), 1);
    assert_eq!(
        TlsClient::connect_tls(tern.https(), &trusted, "a.test").leaf(),
        first
    );
    // ARI (RFC 9773): the CA says "renew now" (a window that began an hour ago).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let window = format!(
        r#"{{"suggestedWindow": {{"start": "{}", "end": "{}"}}}}"#,
        rfc3339(now - 3600),
        rfc3339(now - 60)
    );
    let body = serde_json::json!({"Certificate": pem, "ARIResponse": window}).to_string();
    pebble.management("POST", "/set-renewal-info/", Some(&body));
    wait_for_orders(&tern, 2);
    assert!(
        eventually(Duration::from_secs(5), || {
            TlsClient::connect_tls(tern.https(), &trusted, "a.test").leaf() != first
        }),
        "the renewed certificate is served without a restart"
    );
    assert_eq!(tern.log_lines("certificate renewed").len(), 1);
    // The renewal named the certificate it replaces (RFC 9773 §5), and the CA took it.
    assert_eq!(
        tern.log_lines("a.test: the order replaces certificate ")
            .len(),
        1,
        "{}",
        tern.stderr_text()
    );
}

#[test]
fn a_wildcard_or_a_missing_state_folder_is_refused_at_start() {
    let site = Site::new();
    let failed = Tern::start_failing(
        site.base(),
        &[
            "--listen-tls",
            "127.0.0.1:0",
            "--acme",
            "*.a.test",
            "--acme-state",
            "/tmp",
        ],
    );
    assert!(!failed.status.success());
    assert!(failed.stderr.contains("DNS-01"), "{}", failed.stderr);
    let failed = Tern::start_failing(
        site.base(),
        &["--listen-tls", "127.0.0.1:0", "--acme", "a.test"],
    );
    assert!(!failed.status.success());
    assert!(failed.stderr.contains("--acme-state"), "{}", failed.stderr);
    assert_eq!(failed.stderr.trim().lines().count(), 1, "{}", failed.stderr);
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339(secs: u64) -> String {
    let days = secs / 86400;
    let rem = secs % 86400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn dates_for_the_renewal_window() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_709_251_199), "2024-02-29T23:59:59Z");
    assert_eq!(base64(b"hello"), "aGVsbG8=");
}

#[test]
fn tern_run_takes_the_names_from_the_sites_hosts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("site")).unwrap();
    std::fs::write(dir.path().join("site/hello.txt"), "from tern run\n").unwrap();
    let https_port = free_port();
    let pebble = Pebble::start(dir.path(), None, free_port(), https_port, &[]);
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!(
            r#"
listen = "127.0.0.1:0"
[tls]
listen = "127.0.0.1:{https_port}"
[tls.acme]
email = "ops@a.test"
agree_tos = true
state = "acme-state"
directory = "{}"
ca_root = "ca.pem"
challenges = ["tls-alpn-01"]

[[site]]
name = "a"
hosts = ["a.test", "www.a.test"]
[[site.route]]
path = "/statusz"
counters = "statusz"
[[site.route]]
path = "/"
static = "site"
"#,
            pebble.directory
        ),
    )
    .unwrap();
    let tern = start_run(&config);
    run_wait_for(&tern, "acme_orders{result=\"valid\"}: 2");
    let trusted = pebble.client();
    for name in ["a.test", "www.a.test"] {
        let mut c = TlsClient::connect_tls(tern.https(), &trusted, name);
        c.send(format!("GET /hello.txt HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes());
        assert_eq!(c.read_response(false).text(), "from tern run\n");
    }
    // A wildcard host needs names of its own.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"www.a.test\"", "\"*.a.test\"");
    std::fs::write(&config, text).unwrap();
    let failed = run_to_end(
        Command::new(env!("CARGO_BIN_EXE_tern"))
            .arg("run")
            .arg("--check")
            .arg("--config")
            .arg(&config),
        Duration::from_secs(10),
    );
    assert!(!failed.status.success());
    assert!(failed.stderr.contains("DNS-01"), "{}", failed.stderr);
}

/// A `tern run` file for one site `a.test` with `[tls.acme]` lines `acme` added.
fn run_config(dir: &Path, https_port: u16, directory: &str, acme: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("site")).unwrap();
    std::fs::write(dir.join("site/hello.txt"), "hello\n").unwrap();
    let config = dir.join("tern.toml");
    std::fs::write(
        &config,
        format!(
            r#"
listen = "127.0.0.1:0"
[tls]
listen = "127.0.0.1:{https_port}"
[tls.acme]
agree_tos = true
state = "acme-state"
directory = "{directory}"
ca_root = "ca.pem"
challenges = ["tls-alpn-01"]
{acme}
[[site]]
name = "a"
hosts = ["a.test"]
[[site.route]]
path = "/statusz"
counters = "statusz"
[[site.route]]
path = "/"
static = "site"
"#
        ),
    )
    .unwrap();
    config
}

fn start_run(config: &Path) -> Tern {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tern"));
    cmd.arg("run").arg("--config").arg(config);
    cmd.args(["--workers", "2", "--sandbox", "on"]);
    Tern::spawn(cmd)
}

/// /statusz of a `tern run` whose site is `a.test`.
fn run_statusz(tern: &Tern) -> String {
    let mut c = Client::connect(tern.addr());
    c.send(b"GET /statusz HTTP/1.1\r\nHost: a.test\r\n\r\n");
    c.read_response(false).text()
}

/// SIGHUP every 5 s until /statusz holds `line` (60 s at most).
fn run_wait_for(tern: &Tern, line: &str) {
    let mut next_hup = std::time::Instant::now();
    let found = eventually(Duration::from_secs(60), || {
        if std::time::Instant::now() >= next_hup {
            tern.signal(libc::SIGHUP);
            next_hup += Duration::from_secs(5);
        }
        run_statusz(tern).contains(line)
    });
    assert!(
        found,
        "no {line:?}:\n{}\n{}",
        run_statusz(tern),
        tern.stderr_text()
    );
}

#[test]
fn a_ca_that_requires_external_account_binding_gets_it() {
    let dir = tempfile::tempdir().unwrap();
    let https_port = free_port();
    let key = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";
    let pebble = Pebble::start_with(
        dir.path(),
        None,
        free_port(),
        https_port,
        &[],
        Some(("kid-1", key)),
    );
    // Without the binding the CA refuses the account, with its reason in the log.
    let config = run_config(dir.path(), https_port, &pebble.directory, "");
    let tern = start_run(&config);
    run_wait_for(&tern, "acme_orders{result=\"failed\"}: 1");
    assert!(
        tern.stderr_text().contains("externalAccountRequired"),
        "{}",
        tern.stderr_text()
    );
    drop(tern);
    let config = run_config(
        dir.path(),
        https_port,
        &pebble.directory,
        &format!("eab_kid = \"kid-1\"\neab_hmac = \"{key}\""),
    );
    let tern = start_run(&config);
    run_wait_for(&tern, "acme_orders{result=\"valid\"}: 1");
    let mut c = TlsClient::connect_tls(tern.https(), &pebble.client(), "a.test");
    c.send(b"GET /hello.txt HTTP/1.1\r\nHost: a.test\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
}

#[test]
fn a_revoked_certificate_is_replaced_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let https_port = free_port();
    let pebble = Pebble::start(dir.path(), None, free_port(), https_port, &[]);
    let config = run_config(dir.path(), https_port, &pebble.directory, "");
    let tern = start_run(&config);
    run_wait_for(&tern, "acme_orders{result=\"valid\"}: 1");
    let trusted = pebble.client();
    let first = TlsClient::connect_tls(tern.https(), &trusted, "a.test").leaf();
    // Revoked with tern's own account (as an operator would after a key leak); Pebble's ARI
    // then says "renew now".
    let state = dir.path().join("acme-state");
    let ca_folder = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let credentials: instant_acme::AccountCredentials =
        serde_json::from_str(&std::fs::read_to_string(ca_folder.join("account.json")).unwrap())
            .unwrap();
    // Two crypto providers are compiled into rustls in a workspace build: name one.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let account = instant_acme::Account::builder_with_root(&pebble.ca_file)
            .unwrap()
            .from_credentials(credentials)
            .await
            .unwrap();
        account
            .revoke(&instant_acme::RevocationRequest {
                certificate: &first,
                reason: None,
            })
            .await
            .unwrap();
    });
    run_wait_for(&tern, "acme_orders{result=\"valid\"}: 2");
    let second = TlsClient::connect_tls(tern.https(), &trusted, "a.test").leaf();
    assert_ne!(first, second, "the revoked certificate is no longer served");
    assert_eq!(tern.log_lines("certificate renewed").len(), 1);
}

/// The README's "Automatic HTTPS" config: its tern half passes `tern run --check`, its
/// Caddyfile half (the comments on the right) `caddy validate` when caddy is installed
/// (scripts/install-proxy-test-deps).
#[test]
fn the_readmes_config_and_caddyfile_are_valid() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let section = &readme[readme.find("## Automatic HTTPS").expect("the section")..];
    let start = section.find("```toml\n").unwrap() + "```toml\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    // The Caddyfile is the right-hand column: what follows `# ` where the first line puts it.
    let column = block.lines().next().unwrap().rfind("# Caddyfile").unwrap();
    let caddyfile: String = block
        .lines()
        .skip(1)
        .filter_map(|l| l.get(column..))
        .map(|c| {
            format!(
                "{}\n",
                c.strip_prefix('#').unwrap_or(c).trim_start_matches(' ')
            )
        })
        .collect();
    assert!(
        caddyfile.contains("example.org, www.example.org {"),
        "{caddyfile}"
    );
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        block
            .replace("/srv/www", &www.display().to_string())
            .replace(
                "/var/lib/tern/acme",
                &dir.path().join("acme").display().to_string(),
            ),
    )
    .unwrap();
    let checked = run_to_end(
        Command::new(env!("CARGO_BIN_EXE_tern"))
            .arg("run")
            .arg("--check")
            .arg("--config")
            .arg(&config),
        Duration::from_secs(10),
    );
    assert!(checked.status.success(), "{}", checked.stderr);
    if !have("caddy", "version") {
        eprintln!("caddy missing (scripts/install-proxy-test-deps): its half is not checked");
        return;
    }
    let file = dir.path().join("Caddyfile");
    std::fs::write(
        &file,
        caddyfile.replace("/srv/www", &www.display().to_string()),
    )
    .unwrap();
    let out = Command::new("caddy")
        .args(["validate", "--adapter", "caddyfile", "--config"])
        .arg(&file)
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{caddyfile}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two nodes sharing one state folder: one order between them (a lock per name), and both
/// serve its certificate. Pebble validates nothing here (PEBBLE_VA_ALWAYS_VALID): whichever
/// node orders, the CA cannot reach the other one's port.
#[test]
fn two_nodes_sharing_the_state_folder_order_once() {
    let site = Site::new();
    site.write("hello.txt", "hello\n");
    let state = site.base().join("acme-state");
    let ca_dir = tempfile::tempdir().unwrap();
    let pebble = Pebble::start(
        ca_dir.path(),
        None,
        free_port(),
        free_port(),
        &[("PEBBLE_VA_ALWAYS_VALID", "1")],
    );
    let mut args = vec!["--listen".to_string(), "127.0.0.1:0".into()];
    args.extend(acme_args(
        &pebble.ca_file,
        &pebble.directory,
        &state,
        &["a.test"],
    ));
    let nodes = [
        Tern::serve_tls(&site.root, &args),
        Tern::serve_tls(&site.root, &args),
    ];
    let trusted = pebble.client();
    let serves = |tern: &Tern| TlsClient::try_connect_tls(tern.https(), &trusted, "a.test").ok();
    let mut next_hup = std::time::Instant::now();
    let both = eventually(Duration::from_secs(60), || {
        if std::time::Instant::now() >= next_hup {
            // The node that found the name locked looks again now, not in 30 s.
            for n in &nodes {
                n.signal(libc::SIGHUP);
            }
            next_hup += Duration::from_secs(2);
        }
        nodes.iter().all(|n| serves(n).is_some())
    });
    assert!(
        both,
        "{}\n---\n{}",
        nodes[0].stderr_text(),
        nodes[1].stderr_text()
    );
    let leaves: Vec<_> = nodes.iter().map(|n| serves(n).unwrap().leaf()).collect();
    assert_eq!(leaves[0], leaves[1], "both serve the one certificate");
    assert_eq!(pebble.orders_placed(), 1, "one order between the two nodes");
    let valid: u64 = nodes
        .iter()
        .map(|n| value(n, "acme_orders{result=\"valid\"}"))
        .sum();
    assert_eq!(valid, 1);
    // The other node waited for the lock or found the certificate stored, and took it.
    let other = nodes
        .iter()
        .find(|n| value(n, "acme_orders{result=\"valid\"}") == 0)
        .unwrap();
    assert_eq!(
        other
            .log_lines("took the certificate another node stored")
            .len(),
        1,
        "{}",
        other.stderr_text()
    );
}

/// A full disk (here: no file may grow past 1 KiB, RLIMIT_FSIZE, inherited by the helper):
/// the certificate cannot be stored, which is logged, and it is served all the same.
#[test]
fn a_full_disk_is_logged_and_the_certificate_still_served() {
    use std::os::unix::process::CommandExt;
    let OneSite {
        site,
        state,
        pebble,
        args,
        _ca_dir,
    } = one_site("a.test");
    let mut cmd = serve_command(&site.root, &[], &args);
    // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, signal) on
    // values the closure owns.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: 1024,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let tern = Tern::spawn(cmd);
    wait_for_orders(&tern, 1);
    let mut c = TlsClient::connect_tls(tern.https(), &pebble.client(), "a.test");
    assert_eq!(c.get("/hello.txt", &[]).status, 200);
    let errors = tern.log_lines("cannot write");
    assert!(
        errors.iter().any(|l| l.contains("cert.pem")),
        "{}",
        tern.stderr_text()
    );
    // No half-written file is left, under its name or a temporary one.
    let ca_folder = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let left: Vec<_> = std::fs::read_dir(ca_folder.join("certs/a.test"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("cert.pem"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
