//! HTTP/3 end to end: the real `tern` binary serving HTTPS (HTTP/3 is on by default; the
//! first config says `[tls] http3 = true` anyway, the second leaves it out), talked
//! to by aioquic (PyPI, through `testkit/h3client.py`; installed by
//! `scripts/install-h3-test-deps`) over QUIC on the HTTPS listener's UDP port, with a test CA's
//! certificate so the client verifies it as a browser would; and by headless Chromium
//! (`scripts/install-browser-test-deps`, see `testkit/chromium-h3.md`), which loads a page and
//! its image over HTTP/3, forced and after Alt-Svc. `http3_hostile.rs` is the hostile side.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::{support, tls_support};
use serde_json::Value;
use support::*;
use tls_support::*;

/// The venv's python and the client script, or `None` (the test says it skips).
pub(crate) fn h3client() -> Option<(PathBuf, PathBuf)> {
    let venv = std::env::var_os("TERN_AIOQUIC_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"));
            cache.join("tern/aioquic-venv")
        });
    let python = venv.join("bin/python");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testkit/h3client.py");
    if !python.exists() {
        eprintln!("SKIPPED: aioquic is not installed (scripts/install-h3-test-deps)");
        return None;
    }
    Some((python, script))
}

/// What one h3client run printed: its answers (JSON lines) and its exit status.
pub(crate) struct Run {
    pub lines: Vec<Value>,
    pub code: i32,
}

impl Run {
    pub fn answer(&self, i: usize) -> &Value {
        &self.lines[i]
    }
}

fn header<'v>(answer: &'v Value, name: &str) -> Option<&'v str> {
    answer["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0].as_str() == Some(name))
        .and_then(|h| h[1].as_str())
}

/// Runs the client with `args` (the URLs last), trusting `ca_file`.
pub(crate) fn h3(client: &(PathBuf, PathBuf), ca_file: &std::path::Path, args: &[&str]) -> Run {
    let out = Command::new(&client.0)
        .arg(&client.1)
        .arg("--ca")
        .arg(ca_file)
        .arg("--sni")
        .arg("localhost")
        .arg("--timeout")
        .arg("20")
        .args(args)
        .output()
        .expect("h3client runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    Run {
        lines,
        code: out.status.code().unwrap_or(-1),
    }
}

/// A site with a page, a 1 MiB file, a CA and its certificate for localhost.
pub(crate) struct Fixture {
    pub site: Site,
    pub ca_file: PathBuf,
    pub cert: (PathBuf, PathBuf),
    pub big: Vec<u8>,
    _ca: Ca,
}

impl Fixture {
    /// Writes a `tern run` config to `tern.toml` beside the site and returns its path: `top`
    /// after the plain listener (workers, an access log), `tls` after the HTTPS listener's
    /// address, then the test certificate, then `rest` (caches, sites, routes).
    pub fn run_config(&self, top: &str, tls: &str, rest: &str) -> PathBuf {
        let conf = self.site.base().join("tern.toml");
        let text = format!(
            "listen = \"127.0.0.1:0\"\n{top}\n\
             [tls]\nlisten = \"127.0.0.1:0\"\n{tls}\
             [[tls.certificates]]\ncert = {:?}\nkey = {:?}\n\n{rest}",
            self.cert.0, self.cert.1
        );
        std::fs::write(&conf, text).unwrap();
        conf
    }

    pub fn new() -> Fixture {
        let site = Site::new();
        site.write("hello.txt", "hello over quic\n");
        let big: Vec<u8> = (0..1024 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
        site.write("big.bin", &big);
        let ca = Ca::new();
        let leaf = ca.issue("default", &["localhost", "127.0.0.1"]);
        let ca_file = ca.write(site.base());
        let cert = leaf.write(site.base(), "default");
        Fixture {
            site,
            ca_file,
            cert,
            big,
            _ca: ca,
        }
    }

    fn serve(&self, extra: &[&str]) -> Tern {
        let mut args = cert_key_args(&self.cert.0, &self.cert.1);
        args.extend(extra.iter().map(|s| s.to_string()));
        Tern::serve_tls(&self.site.root, &args)
    }

    fn url(&self, tern: &Tern, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", tern.https().port())
    }
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_page_and_a_large_file_over_http3_verified_against_the_certificate() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    let tern = fx.serve(&[]);
    let page = fx.url(&tern, "/hello.txt");
    let big = fx.url(&tern, "/big.bin");
    let missing = fx.url(&tern, "/missing");
    let run = h3(&client, &fx.ca_file, &[&page, &big, &missing]);
    assert_eq!(run.code, 0, "{:?}", run.lines);
    let a = run.answer(0);
    assert_eq!(a["alpn"], "h3");
    assert_eq!(a["status"], 200);
    assert_eq!(a["body"], "hello over quic\n");
    assert_eq!(header(a, "content-length"), Some("16"));
    assert_eq!(header(a, "server"), Some("tern"));
    assert!(header(a, "date").is_some());
    let b = run.answer(1);
    assert_eq!(b["status"], 200);
    assert_eq!(b["body_len"], fx.big.len() as u64);
    assert_eq!(b["body_sha256"], sha256_hex(&fx.big));
    assert_eq!(run.answer(2)["status"], 404);
}

#[test]
fn many_streams_at_once_and_in_sequence_on_one_connection() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    fx.site.write_numbered(8);
    let tern = fx.serve(&[]);
    let page = fx.url(&tern, "/hello.txt");
    let run = h3(
        &client,
        &fx.ca_file,
        &["--parallel", "40", "--repeat", "3", &page],
    );
    assert_eq!(run.code, 0, "{:?}", run.lines.first());
    assert_eq!(run.lines.len(), 120);
    assert!(run
        .lines
        .iter()
        .all(|l| l["status"] == 200 && l["body"] == "hello over quic\n"));
}

#[test]
fn tcp_answers_advertise_http3_with_alt_svc_only_when_it_is_on() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    for on in [true, false] {
        let tern = fx.serve(if on {
            &["--hsts", "60"]
        } else {
            &["--no-http3", "--hsts", "60"]
        });
        let port = tern.https().port();
        let out = Command::new("curl")
            .args(["-s", "-D", "-", "-o", "/dev/null", "--cacert"])
            .arg(&fx.ca_file)
            .arg(format!("https://localhost:{port}/hello.txt"))
            .output()
            .expect("curl runs");
        let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
        assert!(
            head.contains("strict-transport-security: max-age=60"),
            "{head}"
        );
        let alt = format!("alt-svc: h3=\":{port}\"; ma=86400");
        assert_eq!(head.contains(&alt), on, "http3 {on}: {head}");
        // The same over HTTP/2 (its own header encoding of the same lines).
        let out = Command::new("curl")
            .args(["-s", "--http2", "-D", "-", "-o", "/dev/null", "--cacert"])
            .arg(&fx.ca_file)
            .arg(format!("https://localhost:{port}/hello.txt"))
            .output()
            .expect("curl runs");
        let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
        assert!(head.starts_with("http/2 200"), "{head}");
        assert_eq!(head.contains(&alt), on, "http3 {on}, HTTP/2: {head}");
        if !on {
            // Nothing answers on the UDP port.
            let run = h3(
                &client,
                &fx.ca_file,
                &["--timeout", "2", &fx.url(&tern, "/hello.txt")],
            );
            assert_eq!(run.code, 2, "no HTTP/3 without --http3: {:?}", run.lines);
        }
    }
}

#[test]
fn http3_answers_are_logged_counted_and_compressed_like_the_others() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    fx.site.write("page.html", "<p>".repeat(2000));
    let log = fx.site.base().join("access.log");
    let conf = fx.run_config(
        &format!("workers = 2\naccess_log = {log:?}\n"),
        "http3 = true\n",
        &format!(
            "[[site]]\nname = \"main\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\
             [[site.route]]\npath = \"/\"\nstatic = {:?}\ncompress = [\"gzip\"]\n",
            fx.site.root
        ),
    );
    let tern = Tern::start_run(&conf);
    let url = format!("https://127.0.0.1:{}/page.html", tern.https().port());
    let run = h3(
        &client,
        &fx.ca_file,
        &["--header", "accept-encoding: gzip", "--repeat", "2", &url],
    );
    assert_eq!(run.code, 0, "{:?}", run.lines);
    let a = run.answer(0);
    assert_eq!(a["status"], 200);
    assert_eq!(header(a, "content-encoding"), Some("gzip"));
    assert!(a["body_len"].as_u64().unwrap() < 6000);
    assert_eq!(tern.metric("tern_http3_connections_total"), 1);
    assert!(tern.metric("tern_quic_datagrams_total{direction=\"in\"}") >= 3);
    assert!(tern.metric("tern_quic_datagrams_total{direction=\"out\"}") >= 3);
    assert_eq!(tern.metric("tern_http3_connection_errors_total"), 0);
    let page = tern.get("/metrics").text();
    promtool_accepts("tern run's /metrics with HTTP/3", &page);
    // The access log's protocol field (written by a background thread: wait for it).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let h3_lines = text
            .lines()
            .filter(|l| l.contains("\"GET /page.html HTTP/3.0\" 200"))
            .count();
        if h3_lines == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "access log:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A small HTTP/1.1 app server on 127.0.0.1 for the proxy routes: keep-alive, one thread
/// per connection. `/big` is 1 MiB (the relay's backpressure against QUIC's flow control),
/// `/chunked` comes chunked without a length, anything else echoes its method, path and
/// body length; every answer is cacheable for a minute and counted.
pub(crate) struct App {
    pub addr: std::net::SocketAddr,
    served: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl App {
    pub fn start(big: Vec<u8>) -> App {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = served.clone();
        let big = std::sync::Arc::new(big);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (big, count) = (big.clone(), count.clone());
                std::thread::spawn(move || {
                    let mut r = BufReader::new(stream.try_clone().unwrap());
                    let mut w = stream;
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut parts = line.split_whitespace();
                        let method = parts.next().unwrap_or("").to_string();
                        let path = parts.next().unwrap_or("").to_string();
                        let mut length = 0usize;
                        loop {
                            let mut h = String::new();
                            if r.read_line(&mut h).unwrap_or(0) == 0 {
                                return;
                            }
                            if h == "\r\n" {
                                break;
                            }
                            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:")
                            {
                                length = v.trim().parse().unwrap();
                            }
                        }
                        let mut body = vec![0; length];
                        r.read_exact(&mut body).unwrap();
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let cache = "Cache-Control: public, max-age=60\r\n";
                        let sent = if path.ends_with("/big") {
                            let head = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{cache}\r\n",
                                big.len()
                            );
                            w.write_all(head.as_bytes()).and_then(|_| w.write_all(&big))
                        } else if path.ends_with("/chunked") {
                            w.write_all(
                                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                                  5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
                            )
                        } else {
                            let text = format!("{method} {path} body={}\n", body.len());
                            let head = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-App: yes\r\n{cache}\r\n",
                                text.len()
                            );
                            w.write_all(head.as_bytes())
                                .and_then(|_| w.write_all(text.as_bytes()))
                        };
                        if sent.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        App { addr, served }
    }

    fn served(&self) -> usize {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn proxy_and_cache_routes_relay_over_http3() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    let app = App::start(fx.big.clone());
    let conf = fx.run_config(
        "workers = 2\n",
        "",
        &format!(
            "[cache.main]\nmemory = \"4M\"\nmax_object = \"256K\"\n\n\
             [[site]]\nname = \"main\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/cached/\"\nproxy = \"{}\"\ncache = \"main\"\ncache_status = true\n\
             [[site.route]]\npath = \"/api/\"\nproxy = \"{}\"\n",
            app.addr, app.addr
        ),
    );
    let tern = Tern::start_run(&conf);
    let url = |p: &str| format!("https://127.0.0.1:{}{p}", tern.https().port());
    let upload = fx.site.base().join("upload.bin");
    std::fs::write(&upload, vec![b'x'; 200_000]).unwrap();
    let run = h3(
        &client,
        &fx.ca_file,
        &[&url("/api/one"), &url("/api/big"), &url("/api/chunked")],
    );
    assert_eq!(run.code, 0, "{:?}", run.lines);
    assert_eq!(run.answer(0)["status"], 200);
    assert_eq!(run.answer(0)["body"], "GET /api/one body=0\n");
    assert_eq!(header(run.answer(0), "x-app"), Some("yes"));
    assert_eq!(run.answer(1)["body_sha256"], sha256_hex(&fx.big));
    assert_eq!(run.answer(2)["body"], "hello, world");
    let posted = h3(
        &client,
        &fx.ca_file,
        &["--data-file", upload.to_str().unwrap(), &url("/api/up")],
    );
    assert_eq!(posted.code, 0, "{:?}", posted.lines);
    assert_eq!(posted.answer(0)["body"], "POST /api/up body=200000\n");
    // Many relayed streams at once on one connection, each its own upstream exchange.
    let many = h3(
        &client,
        &fx.ca_file,
        &["--parallel", "24", &url("/api/many")],
    );
    assert_eq!(many.code, 0);
    assert!(many
        .lines
        .iter()
        .all(|l| l["body"] == "GET /api/many body=0\n"));
    // The cache: the second GET is a hit, and the app saw one request.
    let before = app.served();
    let cached = h3(
        &client,
        &fx.ca_file,
        &["--repeat", "2", &url("/cached/page")],
    );
    assert_eq!(cached.code, 0, "{:?}", cached.lines);
    assert_eq!(
        header(cached.answer(0), "cache-status"),
        Some("tern; fwd=miss")
    );
    assert_eq!(header(cached.answer(1), "cache-status"), Some("tern; hit"));
    assert_eq!(cached.answer(1)["body"], "GET /cached/page body=0\n");
    assert_eq!(app.served(), before + 1);
}

/// The peak resident memory of a process (VmHWM), in KiB.
fn peak_rss_kib(pid: libc::pid_t) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// An upload larger than `max_body` (1 MiB by default) and than any buffer tern keeps for a
/// gathered body goes through a proxy route over HTTP/3 as over HTTP/1.1 and HTTP/2: the
/// route streams it to the app as it comes, and QUIC's flow control holds the client back
/// meanwhile, so tern's memory does not grow with it. A static route still answers 413.
#[test]
fn a_large_upload_streams_to_the_app_over_http3() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    let app = App::start(fx.big.clone());
    let conf = fx.run_config(
        "workers = 1\n",
        "",
        &format!(
            "[[site]]\nname = \"main\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/api/\"\nproxy = \"{}\"\n\
             [[site.route]]\npath = \"/\"\nstatic = {:?}\n",
            app.addr, fx.site.root
        ),
    );
    let tern = Tern::start_run(&conf);
    let url = |p: &str| format!("https://127.0.0.1:{}{p}", tern.https().port());
    const SIZE: usize = 24 << 20;
    let upload = fx.site.base().join("large-upload.bin");
    std::fs::write(&upload, vec![b'u'; SIZE]).unwrap();
    // A first exchange, so that what a connection and a relay cost is in the baseline.
    let warm = h3(&client, &fx.ca_file, &[&url("/api/warm")]);
    assert_eq!(warm.code, 0, "{:?}", warm.lines);
    let before = peak_rss_kib(tern.pid());
    let posted = h3(
        &client,
        &fx.ca_file,
        &["--data-file", upload.to_str().unwrap(), &url("/api/up")],
    );
    assert_eq!(posted.code, 0, "{:?}", posted.lines);
    assert_eq!(posted.answer(0)["status"], 200);
    assert_eq!(
        posted.answer(0)["body"],
        format!("POST /api/up body={SIZE}\n")
    );
    let grew = peak_rss_kib(tern.pid()) - before;
    assert!(
        grew < 8 << 10,
        "peak memory grew {grew} KiB for a {SIZE}-byte upload"
    );
    // A route that takes bodies whole still refuses one over max_body.
    let refused = h3(
        &client,
        &fx.ca_file,
        &["--data-file", upload.to_str().unwrap(), &url("/hello.txt")],
    );
    assert_eq!(refused.answer(0)["status"], 413, "{:?}", refused.lines);
}

/// A PHP upload over HTTP/3 (3 MiB: over tern's default `max_body`, under PHP's
/// `post_max_size`) reaches PHP-FPM whole, streamed through the FastCGI route as over TCP.
#[test]
fn a_php_upload_over_http3_streams_to_php_fpm() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    let Some(fpm) = crate::php_support::PhpFpm::start(fx.site.base()) else {
        return;
    };
    fx.site.write(
        "up.php",
        "<?php $b = file_get_contents('php://input');\n\
         echo $_SERVER['REQUEST_METHOD'], ' ', strlen($b), ' ', md5($b), \"\\n\";\n",
    );
    let conf = fx.run_config(
        "workers = 1\n",
        "",
        &format!(
            "[[site]]\nname = \"main\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/\"\nstatic = {:?}\nfastcgi = \"unix:{}\"\n",
            fx.site.root,
            fpm.socket.display()
        ),
    );
    let tern = Tern::start_run(&conf);
    let body: Vec<u8> = (0..3u32 << 20).map(|i| (i * 31 % 253) as u8).collect();
    let upload = fx.site.base().join("php-upload.bin");
    std::fs::write(&upload, &body).unwrap();
    let url = format!("https://127.0.0.1:{}/up.php", tern.https().port());
    let posted = h3(
        &client,
        &fx.ca_file,
        &["--data-file", upload.to_str().unwrap(), &url],
    );
    assert_eq!(posted.code, 0, "{:?}", posted.lines);
    assert_eq!(posted.answer(0)["status"], 200, "{:?}", posted.lines);
    let md5 = Command::new("md5sum").arg(&upload).output().unwrap();
    let md5 = String::from_utf8_lossy(&md5.stdout);
    let md5 = md5.split_whitespace().next().unwrap();
    assert_eq!(
        posted.answer(0)["body"],
        format!("POST {} {md5}\n", body.len())
    );
}

#[test]
fn shutdown_closes_http3_connections_and_tern_exits() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    let mut tern = fx.serve(&[]);
    let run = h3(&client, &fx.ca_file, &[&fx.url(&tern, "/hello.txt")]);
    assert_eq!(run.code, 0);
    tern.signal(libc::SIGTERM);
    let status = tern.wait_exit(Duration::from_secs(10)).expect("tern exits");
    assert!(status.success(), "{status:?}: {}", tern.stderr_text());
}

#[test]
fn zero_rtt_answers_safe_requests_only_and_only_when_turned_on() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    let upload = fx.site.base().join("form.txt");
    std::fs::write(&upload, "a=1").unwrap();
    for on in [true, false] {
        let tern = fx.serve(if on { &["--http3-0rtt"] } else { &[] });
        let ticket = fx.site.base().join(format!("ticket-{on}"));
        let ticket = ticket.to_str().unwrap();
        let page = fx.url(&tern, "/hello.txt");
        let first = h3(&client, &fx.ca_file, &["--session-ticket", ticket, &page]);
        assert_eq!(first.code, 0, "{:?}", first.lines);
        assert_eq!(first.answer(0)["resumed"], false);
        if on {
            // A replay: the same ticket (and so the same early data) used twice. The session
            // is single-use, so the second try gets a full handshake and no early data.
            let copy = format!("{ticket}-replay");
            for (i, want) in [(0, true), (1, false)] {
                std::fs::copy(ticket, &copy).unwrap();
                let run = h3(
                    &client,
                    &fx.ca_file,
                    &["--session-ticket", &copy, "--zero-rtt", &page],
                );
                assert_eq!(run.code, 0, "{:?}", run.lines);
                assert_eq!(
                    run.answer(0)["early_data_accepted"],
                    want,
                    "use {i} of one ticket"
                );
                assert_eq!(run.answer(0)["status"], 200);
            }
            // The original ticket was taken by those: get a fresh one.
            let again = h3(&client, &fx.ca_file, &["--session-ticket", ticket, &page]);
            assert_eq!(again.code, 0);
        }
        let get = h3(
            &client,
            &fx.ca_file,
            &["--session-ticket", ticket, "--zero-rtt", &page],
        );
        assert_eq!(get.code, 0, "{:?}", get.lines);
        let a = get.answer(0);
        assert_eq!(
            (a["resumed"].as_bool(), a["status"].as_u64()),
            (Some(true), Some(200))
        );
        assert_eq!(a["early_data_accepted"], on, "0-RTT on: {on}");
        assert_eq!(a["body"], "hello over quic\n");
        let post = h3(
            &client,
            &fx.ca_file,
            &[
                "--session-ticket",
                ticket,
                "--zero-rtt",
                "--data-file",
                upload.to_str().unwrap(),
                &page,
            ],
        );
        assert_eq!(post.code, 0, "{:?}", post.lines);
        // In early data a POST is refused before any route sees it; after the handshake it
        // reaches the static route, which allows no POST.
        let want = if on { 425 } else { 405 };
        assert_eq!(post.answer(0)["status"], want, "0-RTT on: {on}");
    }
}

/// `tern run` with HTTP/3 on `workers` workers, a page and the counters at /metrics.
fn run_with_counters(fx: &Fixture, workers: usize) -> Tern {
    let conf = fx.run_config(
        "",
        "http3 = true\n",
        &format!(
            "[[site]]\nname = \"main\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\
             [[site.route]]\npath = \"/\"\nstatic = {:?}\n",
            fx.site.root
        ),
    );
    Tern::start_run_workers(&conf, workers)
}

/// SO_REUSEPORT picks a worker by the client's address and port, so a client whose port
/// changes mid-connection (NAT rebinding) lands on either worker: half the time on the one
/// that does not have its connection, which must hand its datagrams to the one that does.
/// Each connection here moves to a new port after its first request; every request after the
/// move must be answered. Over 20 connections some moves must have needed a hand-off (none
/// of them did with odds of 2^-20).
#[test]
fn a_client_whose_port_changes_keeps_its_connection_on_any_worker() {
    let Some(client) = h3client() else { return };
    let fx = Fixture::new();
    let tern = run_with_counters(&fx, 2);
    let url = format!("https://127.0.0.1:{}/hello.txt", tern.https().port());
    for n in 0..20 {
        let run = h3(
            &client,
            &fx.ca_file,
            &[
                "--repeat",
                "3",
                "--rebind-after",
                "1",
                "--timeout",
                "10",
                &url,
            ],
        );
        assert_eq!(run.code, 0, "connection {n}: {:?}", run.lines);
        assert_eq!(run.lines.len(), 3, "connection {n}: {:?}", run.lines);
        for line in &run.lines {
            assert_eq!(line["status"], 200, "connection {n}: {line}");
            assert_eq!(line["body"], "hello over quic\n");
        }
        assert_ne!(
            run.answer(0)["local_port"],
            run.answer(1)["local_port"],
            "the client did not move"
        );
    }
    assert_eq!(tern.metric("tern_http3_connections_total"), 20);
    assert!(tern.metric("tern_quic_datagrams_handed_off_total") > 0);
    assert_eq!(tern.metric("tern_quic_handoffs_dropped_total"), 0);
    assert_eq!(tern.metric("tern_http3_connection_errors_total"), 0);
}

/// Whether Debian's ngtcp2 example client is installed (`scripts/install-h3-test-deps`).
fn gtlsclient() -> bool {
    let there = Command::new("gtlsclient").arg("--help").output().is_ok();
    if !there {
        eprintln!("SKIPPED: gtlsclient is not installed (scripts/install-h3-test-deps)");
    }
    there
}

/// One gtlsclient connection to tern's HTTP/3 port fetching `path` (it does not check the
/// certificate): its log, and the body it saved. It exits with 0 whatever happened, so the
/// body is the verdict; `--timeout` (idle) bounds a stalled connection.
fn ngtcp2_get(fx: &Fixture, port: u16, path: &str, args: &[&str]) -> (String, Option<Vec<u8>>) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = fx.site.base().join(format!("ngtcp2-{run}"));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("gtlsclient")
        .args(["--exit-on-all-streams-close", "--timeout=5s"])
        .arg(format!("--download={}", dir.display()))
        .args(args)
        .args(["127.0.0.1", &port.to_string()])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("gtlsclient runs");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let name = path.rsplit('/').next().unwrap();
    (log, std::fs::read(dir.join(name)).ok())
}

/// The length of the first CRYPTO frame of the server's Handshake packets in a gtlsclient
/// log: its certificate is in it unless the session was resumed.
pub(crate) fn server_handshake_flight(log: &str) -> usize {
    log.lines()
        .find_map(|l| {
            let rest = l
                .split_once("frm rx 0 Handshake CRYPTO(0x06) offset=0 len=")?
                .1;
            rest.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no server Handshake CRYPTO frame in:\n{log}"))
}

/// A second QUIC stack (ngtcp2, on GnuTLS) against tern's two workers: connection migration
/// (a new port, announced with path validation and a new connection ID) and NAT rebinding (a
/// new port, unannounced), the request sent from the new port each time; then a session
/// resumed from the first connection's ticket, with a key update before its request.
#[test]
fn ngtcp2_migrates_rebinds_resumes_and_updates_keys() {
    if !gtlsclient() {
        return;
    }
    let fx = Fixture::new();
    let tern = run_with_counters(&fx, 2);
    let port = tern.https().port();
    for n in 0..20 {
        let mut args = vec!["-q", "--change-local-addr=100ms", "--delay-stream=400ms"];
        if n % 2 == 1 {
            args.push("--nat-rebinding");
        }
        let (log, body) = ngtcp2_get(&fx, port, "/hello.txt", &args);
        assert_eq!(
            body.as_deref(),
            Some(&b"hello over quic\n"[..]),
            "connection {n} {args:?}:\n{log}"
        );
    }
    assert!(tern.metric("tern_quic_datagrams_handed_off_total") > 0);
    assert_eq!(tern.metric("tern_quic_handoffs_dropped_total"), 0);

    let session = fx.site.base().join("ngtcp2-session.pem");
    let params = fx.site.base().join("ngtcp2-params.txt");
    let files = [
        format!("--session-file={}", session.display()),
        format!("--tp-file={}", params.display()),
    ];
    let (full, body) = ngtcp2_get(&fx, port, "/hello.txt", &[&files[0], &files[1]]);
    assert_eq!(body.as_deref(), Some(&b"hello over quic\n"[..]), "{full}");
    assert!(session.exists(), "no session ticket saved:\n{full}");
    let resumed_args = [
        files[0].as_str(),
        &files[1],
        "--key-update=100ms",
        "--delay-stream=400ms",
    ];
    let (resumed, body) = ngtcp2_get(&fx, port, "/hello.txt", &resumed_args);
    assert_eq!(
        body.as_deref(),
        Some(&b"hello over quic\n"[..]),
        "{resumed}"
    );
    assert!(resumed.contains("key update confirmed"), "{resumed}");
    // Without the certificate (a few hundred bytes here), the flight is far shorter.
    let (full_flight, resumed_flight) = (
        server_handshake_flight(&full),
        server_handshake_flight(&resumed),
    );
    assert!(
        resumed_flight + 300 < full_flight,
        "not resumed: {resumed_flight} bytes against {full_flight}"
    );
    assert_eq!(tern.metric("tern_http3_connection_errors_total"), 0);
}

// ---------------------------------------------------------------------------------------------
// quic-go's example client
// ---------------------------------------------------------------------------------------------

/// quic-go's example HTTP/3 client (`example/client` of the quic-go module, at the version
/// `bench/h3load/go.mod` pins), built by `scripts/install-h3-test-deps` into
/// `${XDG_CACHE_HOME:-~/.cache}/tern/bin/quic-go-client`, or `None` (the test says it skips).
pub(crate) fn quic_go_client() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"));
    let path = cache.join("tern/bin/quic-go-client");
    if !path.exists() {
        eprintln!("SKIPPED: quic-go's client is not installed (scripts/install-h3-test-deps)");
        return None;
    }
    Some(path)
}

/// What one quic-go client run got: the bodies in the order they ended, its log, and
/// whether it exited with 0.
pub(crate) struct QuicGoRun {
    pub bodies: Vec<Vec<u8>>,
    pub log: String,
    pub ok: bool,
}

/// Runs quic-go's client (after `prefix`, such as `ip netns exec NAME`) fetching `urls` on
/// one connection, trusting only `ca_file` (with SSL_CERT_FILE and an empty SSL_CERT_DIR; the
/// client adds quic-go's own test CA). It writes each body to its log after
/// `Response Body (N bytes):`; the log goes to a file (the bodies are binary) in `dir`.
/// Killed after `limit`.
pub(crate) fn quic_go_get(
    client: &std::path::Path,
    prefix: &[&str],
    dir: &std::path::Path,
    ca_file: &std::path::Path,
    urls: &[&str],
    limit: Duration,
) -> QuicGoRun {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let no_certs = dir.join("no-certs");
    std::fs::create_dir_all(&no_certs).unwrap();
    let log_path = dir.join(format!("quic-go-{run}.log"));
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(client);
            c
        }
        None => Command::new(client),
    };
    cmd.args(urls)
        .env("SSL_CERT_FILE", ca_file)
        .env("SSL_CERT_DIR", &no_certs)
        .env_remove("QLOGDIR")
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("quic-go-{run}.out"))).unwrap())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let mut child = cmd.spawn().expect("quic-go's client runs");
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "quic-go's client still running after {limit:?}; its log:\n{}",
                String::from_utf8_lossy(&std::fs::read(&log_path).unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let raw = std::fs::read(&log_path).unwrap();
    let mut bodies = Vec::new();
    let mut text = Vec::new();
    let mut rest = &raw[..];
    const MARK: &[u8] = b"Response Body (";
    while let Some(at) = rest.windows(MARK.len()).position(|w| w == MARK) {
        text.extend_from_slice(&rest[..at + MARK.len()]);
        rest = &rest[at + MARK.len()..];
        let close = rest.windows(9).position(|w| w == b" bytes):\n");
        let Some(close) = close else { break };
        let Ok(len) = std::str::from_utf8(&rest[..close])
            .unwrap()
            .parse::<usize>()
        else {
            break;
        };
        let body = &rest[close + 9..];
        let len = len.min(body.len());
        bodies.push(body[..len].to_vec());
        text.extend_from_slice(format!("{len} bytes):\n[the body]").as_bytes());
        rest = &body[len..];
    }
    text.extend_from_slice(rest);
    QuicGoRun {
        bodies,
        log: String::from_utf8_lossy(&text).into_owned(),
        ok: status.success(),
    }
}

/// A third QUIC stack, quic-go (Go), verifying tern's certificate against the test CA:
/// a page and a 1 MiB file on one connection, every byte checked.
#[test]
fn quic_go_fetches_a_page_and_a_large_file_over_http3() {
    let Some(client) = quic_go_client() else {
        return;
    };
    let fx = Fixture::new();
    let tern = fx.serve(&[]);
    let urls = [fx.url(&tern, "/hello.txt"), fx.url(&tern, "/big.bin")];
    let run = quic_go_get(
        &client,
        &[],
        fx.site.base(),
        &fx.ca_file,
        &[&urls[0], &urls[1]],
        Duration::from_secs(30),
    );
    assert!(run.ok, "{}", run.log);
    let mut bodies = run.bodies;
    bodies.sort_by_key(|b| b.len());
    assert_eq!(bodies.len(), 2, "{}", run.log);
    assert_eq!(bodies[0], b"hello over quic\n", "{}", run.log);
    assert_eq!(bodies[1].len(), fx.big.len());
    assert!(bodies[1] == fx.big, "the 1 MiB body differs");
    assert_eq!(
        run.log.matches("Proto:\"HTTP/3.0\"").count(),
        2,
        "{}",
        run.log
    );
    // A client that trusts another CA refuses tern's certificate: the CA above was checked.
    let other_dir = fx.site.base().join("other-ca");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other = Ca::named("another CA").write(&other_dir);
    let refused = quic_go_get(
        &client,
        &[],
        fx.site.base(),
        &other,
        &[&urls[0]],
        Duration::from_secs(30),
    );
    assert!(!refused.ok, "{}", refused.log);
    assert!(
        refused
            .log
            .contains("certificate signed by unknown authority"),
        "{}",
        refused.log
    );
}

// ---------------------------------------------------------------------------------------------
// Headless Chromium (testkit/chromium-h3.md)
// ---------------------------------------------------------------------------------------------

/// Writes the protocol of its navigation (`nav`) and, once the page has loaded, of an image
/// from the same origin (`img`, "not loaded" if it did not decode). With `?reload` it then
/// fetches a small file until one comes over HTTP/3 (Chromium connects to the Alt-Svc
/// alternative in the background, in its own time: a slow machine takes longer) and reloads
/// itself as `?first=PROTOCOL`, which the reloaded page shows as `first`; each load's image
/// has its own URL, so the second is not taken from Chromium's cache.
const PROTO_PAGE: &str = r#"<!doctype html><title>protocols</title>
<p id=nav>pending</p><p id=img>pending</p><p id=first>-</p>
<script>
const q = new URLSearchParams(location.search);
const nav = performance.getEntriesByType("navigation")[0].nextHopProtocol;
document.getElementById("nav").textContent = nav;
document.getElementById("first").textContent = q.get("first") || "-";
const pic = new Image();
pic.src = "/dot.png?" + (q.get("first") ? "again" : "once");
document.body.appendChild(pic);
const protocol = url => performance.getEntriesByName(new URL(url, location).href)[0]?.nextHopProtocol;
async function untilHttp3() {
  for (let i = 0; i < 2000; i++) {
    const url = "/dot.png?probe" + i;
    await (await fetch(url, {cache: "no-store"})).arrayBuffer();
    await new Promise(r => setTimeout(r, 0));
    if (protocol(url) === "h3") return;
  }
}
addEventListener("load", async () => {
  const e = performance.getEntriesByName(pic.src)[0];
  document.getElementById("img").textContent =
    e && pic.naturalWidth === 1 ? e.nextHopProtocol : "not loaded";
  if (q.has("reload")) {
    await untilHttp3();
    location.replace("?first=" + nav);
  }
});
</script>
"#;

/// A 1×1 PNG.
const DOT_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// A site with the page and its image, served by `tern serve` over HTTPS (and so HTTP/3) with
/// an access log; the base64 SHA-256 of its certificate's public key (SubjectPublicKeyInfo),
/// which `--ignore-certificate-errors-spki-list` takes.
fn chromium_fixture() -> (Fixture, Tern, PathBuf, String) {
    use base64::Engine;
    let fx = Fixture::new();
    fx.site.write("proto.html", PROTO_PAGE);
    let png = base64::engine::general_purpose::STANDARD
        .decode(DOT_PNG)
        .unwrap();
    fx.site.write("dot.png", png);
    let log = fx.site.base().join("access.log");
    let tern = fx.serve(&["--access-log", log.to_str().unwrap()]);
    let key = std::fs::read_to_string(&fx.cert.1).unwrap();
    let spki =
        rcgen::PublicKeyData::subject_public_key_info(&rcgen::KeyPair::from_pem(&key).unwrap());
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &spki);
    let spki = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    (fx, tern, log, spki)
}

/// Chromium's DOM of `url` once loaded (and, with the virtual time budget, once what the page
/// started then, such as a reload, has run), with a fresh profile and `flags`.
fn chromium_dom(profile: &std::path::Path, flags: &[String], url: &str) -> String {
    let mut cmd = Command::new("chromium");
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(flags)
        .args(["--virtual-time-budget=5000", "--dump-dom", url]);
    // The first start on a machine has taken 18 s; later ones about one.
    let out = run_to_end(&mut cmd, Duration::from_secs(120));
    assert!(out.status.success(), "{:?}: {}", out.status, out.stderr);
    out.stdout
}

/// The text of the page's `<p id=ID>`.
fn dom_field<'d>(dom: &'d str, id: &str) -> &'d str {
    let open = format!("<p id=\"{id}\">");
    let Some(at) = dom.find(&open) else {
        panic!("no {open} in the DOM (the page did not load?):\n{dom}")
    };
    let rest = &dom[at + open.len()..];
    &rest[..rest.find("</p>").unwrap()]
}

/// Waits for the access log to hold `lines` (written by a background thread).
fn access_log_has(log: &std::path::Path, lines: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if lines.iter().all(|l| text.contains(l)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "want {lines:?} in the access log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn chromium_loads_a_page_and_its_image_over_http3() {
    if !have("chromium", "--version") {
        return;
    }
    let (fx, tern, log, spki) = chromium_fixture();
    let origin = format!("127.0.0.1:{}", tern.https().port());
    let dom = chromium_dom(
        &fx.site.base().join("profile"),
        &[
            format!("--origin-to-force-quic-on={origin}"),
            format!("--ignore-certificate-errors-spki-list={spki}"),
        ],
        &format!("https://{origin}/proto.html"),
    );
    assert_eq!(dom_field(&dom, "nav"), "h3", "{dom}");
    assert_eq!(dom_field(&dom, "img"), "h3", "{dom}");
    // tern's side of it.
    access_log_has(
        &log,
        &[
            "\"GET /proto.html HTTP/3.0\" 200",
            "\"GET /dot.png?once HTTP/3.0\" 200",
        ],
    );
}

/// Without forcing: the first load goes over HTTP/2 and learns of HTTP/3 from Alt-Svc, and the
/// reload that follows uses it. Chromium takes an Alt-Svc to QUIC only for a certificate from
/// a known (public) root, unless the host is one `--origin-to-force-quic-on` names (its
/// ProofVerifierChromium's `hostnames_to_allow_unknown_roots` is made of those hosts, without
/// their ports): naming the same host with another port, where nothing listens, lifts that
/// for the test certificate without forcing QUIC on tern's origin. Without that flag both
/// loads stay on HTTP/2 (Chromium marks the alternative broken: CERTIFICATE_VERIFY_FAILED).
#[test]
fn chromium_moves_to_http3_on_reload_after_alt_svc() {
    if !have("chromium", "--version") {
        return;
    }
    let (fx, tern, log, spki) = chromium_fixture();
    let port = tern.https().port();
    let other = if port == 9 { 7 } else { 9 };
    let dom = chromium_dom(
        &fx.site.base().join("profile"),
        &[
            format!("--origin-to-force-quic-on=127.0.0.1:{other}"),
            format!("--ignore-certificate-errors-spki-list={spki}"),
        ],
        &format!("https://127.0.0.1:{port}/proto.html?reload"),
    );
    assert_eq!(dom_field(&dom, "first"), "h2", "{dom}");
    assert_eq!(dom_field(&dom, "nav"), "h3", "{dom}");
    assert_eq!(dom_field(&dom, "img"), "h3", "{dom}");
    access_log_has(
        &log,
        &[
            "\"GET /proto.html?reload HTTP/2.0\" 200",
            "\"GET /proto.html?first=h2 HTTP/3.0\" 200",
            "\"GET /dot.png?again HTTP/3.0\" 200",
        ],
    );
}
