//! Access logs end to end: the real `tern` binary with `--access-log` (or `access_log` in a
//! config file), in both formats, over HTTP/1.1, HTTP/2, and TLS; hostile bytes escaped;
//! SIGUSR1 after logrotate's rename; SIGTERM flushing the last lines; the demo's client
//! address behind trusted proxies; `--user`. Every test runs sandboxed (the support fails a
//! test whose server had a system call refused).

use std::io::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{h2_support, support, tls_support};
use h2_support::*;
use support::*;
use tls_support::*;

const HELLO: &str = "hello, access log\n";

/// One line of the log, from either format.
#[derive(Debug, Clone, PartialEq)]
struct LogLine {
    client: String,
    /// Unix seconds.
    time: u64,
    method: Option<String>,
    target: Option<String>,
    protocol: Option<String>,
    status: u16,
    bytes: u64,
    duration_us: u64,
    referer: Option<String>,
    user_agent: Option<String>,
    host: Option<String>,
    upstream: Option<String>,
}

/// Seconds since the epoch of a civil UTC date and time.
fn unix(y: i64, m: i64, d: i64, hh: u64, mm: u64, ss: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days as u64 * 86_400 + hh * 3600 + mm * 60 + ss
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `$remote_addr - - [$time_local] "$request" $status $bytes "$referer" "$ua" "$host" $us $up`
fn parse_combined(line: &str) -> LogLine {
    let parts: Vec<&str> = line.split('"').collect();
    assert_eq!(parts.len(), 9, "fields of {line:?}");
    let (client, rest) = parts[0].split_once(" - - [").expect(line);
    let stamp = rest.strip_suffix("] ").expect(line);
    // 23/Nov/2026:21:12:08 +0000
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let f: Vec<&str> = stamp.split(['/', ':', ' ']).collect();
    assert_eq!(f.len(), 7, "{stamp:?}");
    assert_eq!(f[6], "+0000");
    let month = months.iter().position(|m| *m == f[1]).expect(stamp) as i64 + 1;
    let n = |s: &str| s.parse::<u64>().expect(stamp);
    let time = unix(
        n(f[2]) as i64,
        month,
        n(f[0]) as i64,
        n(f[3]),
        n(f[4]),
        n(f[5]),
    );
    let (method, target, protocol) = if parts[1] == "-" {
        (None, None, None)
    } else {
        let r: Vec<&str> = parts[1].split(' ').collect();
        assert_eq!(r.len(), 3, "request {:?}", parts[1]);
        (
            Some(r[0].to_string()),
            Some(r[1].to_string()),
            Some(r[2].to_string()),
        )
    };
    let nums: Vec<&str> = parts[2].trim().split(' ').collect();
    let opt = |s: &str| (s != "-").then(|| s.to_string());
    assert_eq!(parts[4], " ");
    assert_eq!(parts[6], " ");
    let tail: Vec<&str> = parts[8].trim().split(' ').collect();
    assert_eq!(tail.len(), 2, "{line:?}");
    LogLine {
        client: client.to_string(),
        time,
        method,
        target,
        protocol,
        status: nums[0].parse().expect(line),
        bytes: nums[1].parse().expect(line),
        duration_us: tail[0].parse().expect(line),
        referer: opt(parts[3]),
        user_agent: opt(parts[5]),
        host: opt(parts[7]),
        upstream: opt(tail[1]),
    }
}

fn parse_json(line: &str) -> LogLine {
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let obj = v.as_object().expect(line);
    assert_eq!(obj.len(), 12, "every field and no other: {line}");
    let s = |k: &str| v[k].as_str().map(str::to_string);
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {line}"));
    // 2026-11-23T21:12:08Z
    let t = s("time").expect(line);
    let f: Vec<u64> = t
        .trim_end_matches('Z')
        .split(['-', 'T', ':'])
        .map(|x| x.parse().expect(&t))
        .collect();
    assert_eq!(f.len(), 6, "{t}");
    LogLine {
        client: s("client").expect(line),
        time: unix(f[0] as i64, f[1] as i64, f[2] as i64, f[3], f[4], f[5]),
        method: s("method"),
        target: s("target"),
        protocol: s("protocol"),
        status: n("status") as u16,
        bytes: n("bytes"),
        duration_us: n("duration_us"),
        referer: s("referer"),
        user_agent: s("user_agent"),
        host: s("host"),
        upstream: (!v["upstream_us"].is_null()).then(|| v["upstream_us"].to_string()),
    }
}

fn parse(format: &str, text: &str) -> Vec<LogLine> {
    text.lines()
        .map(|l| match format {
            "json" => parse_json(l),
            _ => parse_combined(l),
        })
        .collect()
}

/// The lines of `path` once it holds at least `n` (waiting up to 5 s).
fn wait_lines(path: &Path, n: usize) -> String {
    let mut text = String::new();
    let ok = eventually(Duration::from_secs(5), || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().count() >= n
    });
    assert!(
        ok,
        "{path:?} has {} lines, want {n}:\n{text}",
        text.lines().count()
    );
    text
}

/// What one request must have logged (found by its user agent, unique per request).
struct Expect {
    ua: String,
    method: &'static str,
    target: &'static str,
    protocol: &'static str,
    status: u16,
    bytes: u64,
    host: String,
    referer: Option<&'static str>,
}

fn check(lines: &[LogLine], want: &[Expect], from: u64, to: u64) {
    for w in want {
        let found: Vec<&LogLine> = lines
            .iter()
            .filter(|l| l.user_agent.as_deref() == Some(w.ua.as_str()))
            .collect();
        assert_eq!(found.len(), 1, "one line for {}: {lines:#?}", w.ua);
        let l = found[0];
        let what = &w.ua;
        assert_eq!(l.client, "127.0.0.1", "{what}");
        assert_eq!(l.method.as_deref(), Some(w.method), "{what}");
        assert_eq!(l.target.as_deref(), Some(w.target), "{what}");
        assert_eq!(l.protocol.as_deref(), Some(w.protocol), "{what}");
        assert_eq!(l.status, w.status, "{what}");
        assert_eq!(l.bytes, w.bytes, "{what}");
        assert_eq!(l.host.as_deref(), Some(w.host.as_str()), "{what}");
        assert_eq!(l.referer.as_deref(), w.referer, "{what}");
        assert_eq!(l.upstream, None, "{what}");
        assert!(
            (from..=to).contains(&l.time),
            "{what}: time {} not in {from}..={to}",
            l.time
        );
        assert!(l.duration_us < 5_000_000, "{what}: {} µs", l.duration_us);
    }
}

/// GET (with a referer), HEAD, 404, 304 and 206 over one HTTP/1.1 connection.
fn h1_five<S: Transport>(c: &mut Client<S>, prefix: &str, protocol: &'static str) -> Vec<Expect> {
    let ua = |what: &str| format!("{prefix}-{what}");
    let mut want = Vec::new();
    let expect = |ua: String, method, target, status, bytes: usize, referer| Expect {
        ua,
        method,
        target,
        protocol,
        status,
        bytes: bytes as u64,
        host: "test".into(),
        referer,
    };
    let ref_url = "http://ref.example/page";
    let r = c.get(
        "/hello.txt",
        &[("User-Agent", &ua("get")), ("Referer", ref_url)],
    );
    assert_eq!((r.status, r.text().as_str()), (200, HELLO));
    let etag = r.header("etag").expect("an ETag").to_string();
    want.push(expect(
        ua("get"),
        "GET",
        "/hello.txt",
        200,
        HELLO.len(),
        Some(ref_url),
    ));
    let r = c.request("HEAD", "/hello.txt", &[("User-Agent", &ua("head"))]);
    assert_eq!(r.status, 200);
    want.push(expect(ua("head"), "HEAD", "/hello.txt", 200, 0, None));
    let r = c.get("/missing.txt", &[("User-Agent", &ua("404"))]);
    assert_eq!(r.status, 404);
    want.push(expect(
        ua("404"),
        "GET",
        "/missing.txt",
        404,
        r.body.len(),
        None,
    ));
    let r = c.get(
        "/hello.txt",
        &[("User-Agent", &ua("304")), ("If-None-Match", &etag)],
    );
    assert_eq!(r.status, 304);
    want.push(expect(ua("304"), "GET", "/hello.txt", 304, 0, None));
    let r = c.get(
        "/hello.txt",
        &[("User-Agent", &ua("206")), ("Range", "bytes=0-4")],
    );
    assert_eq!((r.status, r.body.len()), (206, 5));
    want.push(expect(ua("206"), "GET", "/hello.txt", 206, 5, None));
    want
}

/// The same five over one HTTP/2 connection.
async fn h2_five(c: &mut H2Conn, prefix: &str) -> Vec<Expect> {
    let ua = |what: &str| format!("{prefix}-{what}");
    let host = c.authority.clone();
    let expect = |ua: String, method, target, status, bytes: usize, referer| Expect {
        ua,
        method,
        target,
        protocol: "HTTP/2.0",
        status,
        bytes: bytes as u64,
        host: host.clone(),
        referer,
    };
    let mut want = Vec::new();
    let ref_url = "http://ref.example/h2";
    let r = c
        .get(
            "/hello.txt",
            &[("user-agent", &ua("get")), ("referer", ref_url)],
        )
        .await;
    assert_eq!((r.status, r.text().as_str()), (200, HELLO));
    let etag = r.header("etag").expect("an ETag").to_string();
    want.push(expect(
        ua("get"),
        "GET",
        "/hello.txt",
        200,
        HELLO.len(),
        Some(ref_url),
    ));
    let r = c
        .try_request("HEAD", "/hello.txt", &[("user-agent", &ua("head"))], None)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    want.push(expect(ua("head"), "HEAD", "/hello.txt", 200, 0, None));
    let r = c.get("/missing.txt", &[("user-agent", &ua("404"))]).await;
    assert_eq!(r.status, 404);
    want.push(expect(
        ua("404"),
        "GET",
        "/missing.txt",
        404,
        r.body.len(),
        None,
    ));
    let r = c
        .get(
            "/hello.txt",
            &[("user-agent", &ua("304")), ("if-none-match", &etag)],
        )
        .await;
    assert_eq!(r.status, 304);
    want.push(expect(ua("304"), "GET", "/hello.txt", 304, 0, None));
    let r = c
        .get(
            "/hello.txt",
            &[("user-agent", &ua("206")), ("range", "bytes=0-4")],
        )
        .await;
    assert_eq!((r.status, r.body.len()), (206, 5));
    want.push(expect(ua("206"), "GET", "/hello.txt", 206, 5, None));
    want
}

/// A site with `hello.txt`, a test CA and a certificate for localhost, and a `logs` folder.
struct Fixture {
    site: Site,
    ca: Ca,
    cert: PathBuf,
    key: PathBuf,
    log: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let site = Site::new();
        site.write("hello.txt", HELLO);
        let ca = Ca::new();
        let leaf = ca.issue("default", &["localhost", "127.0.0.1"]);
        let (cert, key) = leaf.write(site.base(), "default");
        let logs = site.base().join("logs");
        std::fs::create_dir(&logs).unwrap();
        Fixture {
            site,
            ca,
            cert,
            key,
            log: logs.join("access.log"),
        }
    }

    /// `tern serve` with a plain and a TLS listener and `extra`.
    fn start(&self, extra: &[&str]) -> Tern {
        let mut args = cert_key_args(&self.cert, &self.key);
        args.extend(extra.iter().map(|s| s.to_string()));
        Tern::spawn(serve_command(
            &self.site.root,
            &["--listen", "127.0.0.1:0", "--listen-tls", "127.0.0.1:0"],
            &args,
        ))
    }

    fn log_args(&self, format: &str) -> Vec<String> {
        vec![
            "--access-log".into(),
            self.log.to_str().unwrap().into(),
            "--access-log-format".into(),
            format.into(),
        ]
    }
}

/// GET, HEAD, 404, 304 and 206 over HTTP/1.1 and HTTP/2, plain and over TLS: one line
/// each, every field as asked.
async fn every_protocol_logs(fx: &Fixture, tern: &Tern, format: &str) {
    let from = now_secs();
    let mut want = Vec::new();
    want.extend(h1_five(&mut tern.client(), "h1", "HTTP/1.1"));
    let mut h2c = H2Conn::h2c(tern.addr()).await;
    want.extend(h2_five(&mut h2c, "h2c").await);
    let tls = Arc::new(client_config(&fx.ca, &[TLS13]));
    want.extend(h1_five(
        &mut tern.tls(&tls, "localhost"),
        "tls-h1",
        "HTTP/1.1",
    ));
    let mut h2 = H2Conn::tls(tern.https(), &alpn_config(&fx.ca, &["h2"]), "localhost")
        .await
        .unwrap_or_else(|_| panic!("ALPN did not choose h2"));
    want.extend(h2_five(&mut h2, "tls-h2").await);
    let text = wait_lines(&fx.log, want.len());
    let lines = parse(format, &text);
    assert_eq!(lines.len(), want.len(), "one line per answer:\n{text}");
    check(&lines, &want, from, now_secs());
}

#[tokio::test]
async fn combined_lines_for_every_protocol() {
    let fx = Fixture::new();
    let args = fx.log_args("combined");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tern = fx.start(&args);
    every_protocol_logs(&fx, &tern, "combined").await;
}

#[tokio::test]
async fn json_lines_for_every_protocol_from_the_config_file() {
    let fx = Fixture::new();
    // The config file's keys; a relative path is taken from the file's folder.
    let config = fx.site.base().join("tern.toml");
    std::fs::write(
        &config,
        "access_log = \"logs/access.log\"\naccess_log_format = \"json\"\n",
    )
    .unwrap();
    let tern = fx.start(&["--config", config.to_str().unwrap()]);
    every_protocol_logs(&fx, &tern, "json").await;
}

/// A request target and user agent full of quotes, backslashes, control characters and
/// bytes that are not UTF-8, and a request refused by the codec (two Host lines). Returns
/// the status of the first (the backslash is in the query: in a path the codec refuses it).
fn send_hostile(tern: &Tern) -> u16 {
    let mut raw = TcpStream::connect(tern.addr()).unwrap();
    raw.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    raw.write_all(
        b"GET /h\"i?j\\k=\"x HTTP/1.1\r\nHost: test\r\nUser-Agent: evil\" \\ \t\xff\xfe end\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let status = Client::over(raw).read_response(false).status;
    let mut c = tern.client();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
    assert_eq!(c.read_response(false).status, 400);
    status
}

#[test]
fn hostile_bytes_are_escaped_in_combined() {
    let fx = Fixture::new();
    let args = fx.log_args("combined");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tern = fx.start(&args);
    let status = send_hostile(&tern);
    let text = wait_lines(&fx.log, 2);
    assert!(
        text.contains(&format!(
            "\"GET /h\\x22i?j\\x5Ck=\\x22x HTTP/1.1\" {status} "
        )),
        "{text}"
    );
    assert!(
        text.contains("\"evil\\x22 \\x5C \\x09\\xFF\\xFE end\""),
        "{text}"
    );
    let lines = parse("combined", &text);
    assert_eq!(lines.len(), 2, "{text}");
    // Refused before routing: logged with no request.
    // Two connections, maybe on two workers: the lines can come in either order.
    let refused = lines
        .iter()
        .find(|l| l.method.is_none())
        .unwrap_or_else(|| panic!("no line without a request: {text}"));
    assert_eq!(refused.status, 400, "{text}");
}

#[test]
fn hostile_bytes_are_valid_json() {
    let fx = Fixture::new();
    let args = fx.log_args("json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tern = fx.start(&args);
    let status = send_hostile(&tern);
    let text = wait_lines(&fx.log, 2);
    let lines = parse("json", &text);
    // Two connections, maybe on two workers: the lines can come in either order.
    let (answered, refused): (Vec<_>, Vec<_>) = lines.iter().partition(|l| l.protocol.is_some());
    assert_eq!((answered.len(), refused.len()), (1, 1), "{text}");
    assert_eq!(answered[0].status, status);
    assert_eq!(answered[0].target.as_deref(), Some("/h\"i?j\\x5Ck=\"x"));
    // A backslash and bytes that are not UTF-8 read `\xHH`, as in the combined format.
    assert_eq!(
        answered[0].user_agent.as_deref(),
        Some("evil\" \\x5C \t\\xFF\\xFE end")
    );
    assert_eq!(refused[0].status, 400);
}

#[test]
fn sigusr1_after_a_rename_writes_to_a_new_file() {
    let fx = Fixture::new();
    let args = fx.log_args("combined");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tern = fx.start(&args);
    tern.get_with("/hello.txt", &[("User-Agent", "before-rotation")]);
    wait_lines(&fx.log, 1);
    // logrotate: rename, then `postrotate`'s kill -USR1.
    let rotated = fx.log.with_extension("log.1");
    std::fs::rename(&fx.log, &rotated).unwrap();
    tern.signal(libc::SIGUSR1);
    let reopened = eventually(Duration::from_secs(5), || {
        !tern.log_lines("access log reopened").is_empty()
    });
    assert!(reopened, "{}", tern.stderr_text());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&fx.log).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o640);
    tern.get_with("/hello.txt", &[("User-Agent", "after-rotation")]);
    let new = wait_lines(&fx.log, 1);
    assert!(new.contains("\"after-rotation\""), "{new}");
    assert!(!new.contains("before-rotation"), "{new}");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.contains("\"before-rotation\""), "{old}");
    assert!(!old.contains("after-rotation"), "{old}");
}

#[test]
fn sigterm_writes_every_line_before_exiting() {
    let fx = Fixture::new();
    let args = fx.log_args("json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut tern = fx.start(&args);
    // Closed connections: nothing keeps the workers past the signal, and the lines are
    // still in their buffers (younger than the 100 ms hand-over age) when it comes.
    let n = 40;
    for i in 0..n {
        let r = tern.get_with(
            &format!("/hello.txt?{i}"),
            &[("Connection", "close"), ("User-Agent", "flush")],
        );
        assert_eq!(r.status, 200);
    }
    tern.signal(libc::SIGTERM);
    let status = tern.wait_exit(Duration::from_secs(10)).expect("exits");
    assert!(status.success(), "{status:?}: {}", tern.stderr_text());
    let text = std::fs::read_to_string(&fx.log).unwrap();
    let lines = parse("json", &text);
    assert_eq!(lines.len(), n, "{text}");
    for i in 0..n {
        let target = format!("/hello.txt?{i}");
        assert!(
            lines
                .iter()
                .any(|l| l.target.as_deref() == Some(target.as_str())),
            "{target} missing:\n{text}"
        );
    }
}

#[test]
fn the_demo_logs_the_client_behind_trusted_proxies() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("logs").join("access.log");
    std::fs::create_dir(log.parent().unwrap()).unwrap();
    let log_arg = log.to_str().unwrap();
    let data = tmp.path().join("data");
    let forwarded = [
        ("X-Forwarded-For", "203.0.113.9"),
        ("User-Agent", "proxied"),
    ];
    {
        let tern = Tern::start_demo(
            &data,
            &[
                "--trusted-proxies",
                "127.0.0.1",
                "--access-log",
                log_arg,
                "--access-log-format",
                "json",
            ],
        );
        assert_eq!(tern.get_with("/statusz", &forwarded).status, 200);
        let lines = parse("json", &wait_lines(&log, 1));
        assert_eq!(lines[0].client, "203.0.113.9");
        assert_eq!(lines[0].target.as_deref(), Some("/statusz"));
        // Written lines are counted.
        assert!(eventually(Duration::from_secs(2), || tern
            .statusz("access_log_lines")
            >= 1));
        assert_eq!(tern.statusz("access_log_lines_dropped"), 0);
    }
    std::fs::remove_file(&log).unwrap();
    // Without trusting the proxy, the header is the client's own word: the peer is logged.
    let tern = Tern::start_demo(&data, &["--access-log", log_arg]);
    tern.get_with("/statusz", &forwarded);
    let lines = parse("combined", &wait_lines(&log, 1));
    assert_eq!(lines[0].client, "127.0.0.1");
}

#[test]
fn with_user_the_log_belongs_to_the_user_and_rotation_works() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to drop privileges");
        return;
    }
    let fx = Fixture::new();
    // nobody must reach the site, the certificates and the log folder.
    let open = |p: &Path| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap()
    };
    open(fx.site.base());
    open(fx.log.parent().unwrap());
    for f in [&fx.cert, &fx.key] {
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    }
    let mut args = fx.log_args("combined");
    args.extend(["--user".into(), "nobody".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tern = fx.start(&args);
    let nobody = nix_uid("nobody");
    let uid = |p: &Path| std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(p).unwrap());
    assert_eq!(uid(&fx.log), nobody, "the file is given to the user");
    tern.get_with("/hello.txt", &[("User-Agent", "as-nobody")]);
    assert!(wait_lines(&fx.log, 1).contains("\"as-nobody\""));
    // logrotate's `create 0640 nobody ...` makes the new file before `postrotate`.
    let rotated = fx.log.with_extension("log.1");
    std::fs::rename(&fx.log, &rotated).unwrap();
    std::fs::File::create(&fx.log).unwrap();
    std::os::unix::fs::chown(&fx.log, Some(nobody), None).unwrap();
    tern.signal(libc::SIGUSR1);
    assert!(eventually(Duration::from_secs(5), || !tern
        .log_lines("access log reopened")
        .is_empty()));
    tern.get_with("/hello.txt", &[("User-Agent", "rotated")]);
    assert!(wait_lines(&fx.log, 1).contains("\"rotated\""));
}

/// The uid of `name` from /etc/passwd.
fn nix_uid(name: &str) -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd
        .lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .expect("the user exists");
    line.split(':').nth(2).unwrap().parse().unwrap()
}

/// `tern run` with three sites: one with its own JSON log, one on the shared combined log
/// (`access_log` at the top), one with its log off. Each line lands in its site's file only,
/// and SIGUSR1 reopens every file.
#[test]
fn tern_run_writes_each_site_to_its_own_log() {
    let fx = Fixture::new();
    let dir = fx.site.base();
    let conf = dir.join("tern.toml");
    let logs = dir.join("logs");
    std::fs::write(
        &conf,
        format!(
            "access_log = \"logs/shared.log\"\n\
             [[site]]\nname = \"a\"\nhosts = [\"a.test\"]\naccess_log = \"logs/a.log\"\naccess_log_format = \"json\"\n\
             [[site.route]]\npath = \"/\"\nstatic = \"{root}\"\n\
             [[site]]\nname = \"b\"\nhosts = [\"b.test\"]\n\
             [[site.route]]\npath = \"/\"\nstatic = \"{root}\"\n\
             [[site]]\nname = \"c\"\nhosts = [\"c.test\"]\naccess_log = \"off\"\n\
             [[site.route]]\npath = \"/\"\nstatic = \"{root}\"\n",
            root = fx.site.root.display()
        ),
    )
    .unwrap();
    let tern = Tern::start_run_workers(&conf, 2);
    let get = |host: &str, ua: &str| {
        let mut c = tern.client();
        c.send(
            format!("GET /hello.txt HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {ua}\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(c.read_response(false).status, 200);
    };
    get("a.test", "ua-a");
    get("b.test", "ua-b");
    get("c.test", "ua-c");
    let a = wait_lines(&logs.join("a.log"), 1);
    let shared = wait_lines(&logs.join("shared.log"), 1);
    std::thread::sleep(Duration::from_millis(300)); // a stray line would have arrived by now
    let a_lines = parse(
        "json",
        &std::fs::read_to_string(logs.join("a.log")).unwrap(),
    );
    let shared_lines = parse(
        "combined",
        &std::fs::read_to_string(logs.join("shared.log")).unwrap(),
    );
    assert_eq!(a_lines.len(), 1, "{a}");
    assert_eq!(shared_lines.len(), 1, "{shared}");
    assert_eq!(a_lines[0].user_agent.as_deref(), Some("ua-a"));
    assert_eq!(a_lines[0].host.as_deref(), Some("a.test"));
    assert_eq!(a_lines[0].status, 200);
    assert_eq!(a_lines[0].bytes, HELLO.len() as u64);
    assert_eq!(shared_lines[0].user_agent.as_deref(), Some("ua-b"));
    assert!(
        !a.contains("ua-c") && !shared.contains("ua-c"),
        "site c logs nothing"
    );

    // logrotate moves both; one SIGUSR1 reopens both.
    std::fs::rename(logs.join("a.log"), logs.join("a.log.1")).unwrap();
    std::fs::rename(logs.join("shared.log"), logs.join("shared.log.1")).unwrap();
    tern.signal(libc::SIGUSR1);
    assert!(eventually(Duration::from_secs(5), || tern
        .log_lines("access log reopened")
        .len()
        >= 2));
    get("a.test", "ua-a2");
    get("b.test", "ua-b2");
    assert!(wait_lines(&logs.join("a.log"), 1).contains("ua-a2"));
    assert!(wait_lines(&logs.join("shared.log"), 1).contains("ua-b2"));
}
