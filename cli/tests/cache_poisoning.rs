//! Cache poisoning and web cache deception against the shared cache of proxy routes (issue
//! 42): the real server in front of a deliberately careless app that believes every field a
//! framework believes (`X-Forwarded-Host`, `X-Original-URL`, method overrides...), answers
//! per-user pages with a lifetime, and echoes in its body the request line and the fields it
//! was sent. Each attack is made first, by an attacker; then a normal client asks, and must
//! get what the app answers a normal request (and the app must never have seen the
//! attacker's unkeyed input).
//!
//! Covered: unkeyed fields (forwarding claims, URL and method overrides, conditionals,
//! unkeyed query parameters, a trusted proxy's fields), GETs with a body (a length or
//! chunks, one hiding a request), web cache deception (`/account/x.css` and its delimiter
//! variants, for an app that marks per-user pages public, private, or answers them with
//! `Set-Cookie`), path and delimiter normalisation, Host variants (case, trailing dot, port,
//! absolute-form targets, a duplicate Host, none at all), CPDoS (oversized fields, meta
//! characters, method override, errors the app or tern answered, 404 and 410 stored only as
//! the rules say), logged-in answers and credentials, ranges on a miss, an app answer longer
//! than its framing (a body after a HEAD answer), and a WebSocket handshake on a cached page.
//!
//! Two tests are ignored: they fail on tern today, and their `ignore` names the bug.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use crate::support;
use support::*;

/// One request as the app got it.
#[derive(Clone)]
struct Seen {
    /// The head, raw (request line and fields, without the empty line).
    head: Vec<u8>,
    body: Vec<u8>,
}

impl Seen {
    fn target(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        head.split(' ').nth(1).unwrap_or("").to_owned()
    }
}

/// The careless app: see the module doc and [`answer`].
struct App {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl App {
    fn start() -> App {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
        let counts = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (seen, counts) = (s.clone(), counts.clone());
                std::thread::spawn(move || serve(conn, &seen, &counts));
            }
        });
        App { addr, seen }
    }

    /// How many requests for this exact target (path and query, as sent) reached the app.
    fn asked(&self, target: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.target() == target)
            .count()
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Whether any request that reached the app held `needle` (head or body, any case for
    /// text).
    fn saw(&self, needle: &[u8]) -> bool {
        let lower = needle.to_ascii_lowercase();
        self.all().iter().any(|s| {
            find(&s.head.to_ascii_lowercase(), &lower).is_some()
                || find(&s.body.to_ascii_lowercase(), &lower).is_some()
        })
    }

    /// The targets of every request that reached the app, in order.
    fn targets(&self) -> Vec<String> {
        self.all().iter().map(Seen::target).collect()
    }
}

/// Reads one line (through its LF) of raw bytes; None at the end of the connection.
fn read_line(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    match reader.read_until(b'\n', &mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
    }
}

fn serve(conn: TcpStream, seen: &Mutex<Vec<Seen>>, counts: &Mutex<HashMap<String, usize>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let mut head = Vec::new();
        loop {
            let Some(line) = read_line(&mut reader) else {
                return;
            };
            if line == b"\r\n" {
                break;
            }
            head.extend_from_slice(&line);
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let field = |name: &str| field_of(&text, name);
        let mut body = Vec::new();
        if field("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let Some(size) = read_line(&mut reader) else {
                    return;
                };
                let size = String::from_utf8_lossy(&size);
                let n = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16).unwrap();
                if n == 0 {
                    // Trailers, up to the empty line.
                    while read_line(&mut reader).is_some_and(|l| l != b"\r\n") {}
                    break;
                }
                let mut chunk = vec![0; n + 2];
                if reader.read_exact(&mut chunk).is_err() {
                    return;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(n) = field("content-length") {
            let mut data = vec![0; n.parse().unwrap()];
            if reader.read_exact(&mut data).is_err() {
                return;
            }
            body = data;
        }
        seen.lock().unwrap().push(Seen {
            head: head.clone(),
            body: body.clone(),
        });
        let method = text.split(' ').next().unwrap_or("").to_owned();
        let target = text.split(' ').nth(1).unwrap_or("").to_owned();
        let host = field("host").unwrap_or_default();
        let n = {
            let mut c = counts.lock().unwrap();
            let n = c.entry(format!("{host} {target}")).or_default();
            *n += 1;
            *n
        };
        let (status, extra, body) = answer(&method, &target, &head, &body, n);
        // Two broken framings: a body after a HEAD answer, and a body longer than the
        // length the answer gave. Both in the same write as the head.
        let path = target.split('?').next().unwrap_or("");
        let declared = if path == "/short" { 0 } else { body.len() };
        let mut bytes = format!("HTTP/1.1 {status} X\r\n{extra}Content-Length: {declared}\r\n\r\n")
            .into_bytes();
        if method != "HEAD" || path == "/reflect" {
            bytes.extend_from_slice(&body);
        }
        if out.write_all(&bytes).is_err() {
            return;
        }
    }
}

/// The value of the first `name` field of a head (its text).
fn field_of(head: &str, name: &str) -> Option<String> {
    head.split("\r\n").skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

/// The value of cookie `name` in any Cookie field of a head.
fn cookie_of(head: &str, name: &str) -> Option<String> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
        .flat_map(|(_, v)| v.split(';'))
        .find_map(|crumb| {
            let (n, v) = crumb.trim().split_once('=')?;
            (n == name).then(|| v.to_owned())
        })
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

const CACHEABLE: &str = "Cache-Control: max-age=60\r\n";

/// What the app answers: its status, extra header lines and body. It believes what a
/// careless framework believes, so that any unkeyed input that reached it would show in the
/// answer (and be stored, if the cache stored it).
fn answer(
    method: &str,
    target: &str,
    raw_head: &[u8],
    req_body: &[u8],
    n: usize,
) -> (u16, String, Vec<u8>) {
    let head = String::from_utf8_lossy(raw_head).into_owned();
    let field = |name: &str| field_of(&head, name);
    // The fields after the request line, as sent: what the body echoes.
    let echo = head
        .split_once("\r\n")
        .map_or("", |(_, rest)| rest)
        .to_owned();
    let text = |s: String| s.into_bytes();
    // HMC: a control character in a field value, or a byte past ASCII.
    let meta = raw_head.split(|&b| b == b'\n').skip(1).any(|l| {
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        l.iter()
            .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f || b >= 0x80)
    });
    if meta {
        return (400, CACHEABLE.into(), text("bad header character\n".into()));
    }
    // HHO: this app takes heads of at most 1 KiB.
    if raw_head.len() > 1024 {
        return (431, CACHEABLE.into(), text("header too large\n".into()));
    }
    // Symfony, Laravel, Express: the method the override names; no route for it here.
    if let Some(m) = field("x-http-method-override")
        .or(field("x-http-method"))
        .or(field("x-method-override"))
    {
        return (404, CACHEABLE.into(), text(format!("no route for {m}\n")));
    }
    // A WebSocket handshake on a path that has no WebSocket: a 404, with a lifetime.
    if field("upgrade").is_some() {
        return (404, CACHEABLE.into(), text("no websocket here\n".into()));
    }
    // A conditional request: "not modified", whatever the page.
    if field("if-none-match").is_some() || field("if-modified-since").is_some() {
        return (304, CACHEABLE.into(), Vec::new());
    }
    let mut path = target.split('?').next().unwrap_or("").to_owned();
    // Reflects its query, decoded, as the whole body (a search page's echo, say).
    if path == "/reflect" || path == "/short" {
        let q = target.split_once("?q=").map_or("", |(_, q)| q);
        let q = q.split('&').next().unwrap_or("");
        return (200, CACHEABLE.into(), percent_decode(q));
    }
    // IIS / Symfony: routed by the URL these name.
    if let Some(u) = field("x-original-url").or(field("x-rewrite-url")) {
        path = u;
    }
    // Rack-style: an insecure scheme is sent to https, permanently (a storable 301).
    if let Some(s) = field("x-forwarded-scheme") {
        if s != "https" {
            return (
                301,
                format!(
                    "{CACHEABLE}Location: https://{}{path}\r\n",
                    field("host").unwrap_or_default()
                ),
                text("moved\n".into()),
            );
        }
    }
    // The host the app builds its links with: the first claim it finds.
    let forwarded_host = field("forwarded").and_then(|f| {
        f.split([';', ',']).find_map(|p| {
            p.trim()
                .strip_prefix("host=")
                .map(|h| h.trim_matches('"').to_owned())
        })
    });
    let link_host = field("x-forwarded-host")
        .or(forwarded_host)
        .or(field("x-host"))
        .or(field("x-http-host-override"))
        .or(field("x-original-host"))
        .or(field("host"))
        .unwrap_or_default();
    let user = cookie_of(&head, "session").or(field("authorization").map(|a| format!("auth {a}")));
    let first = n == 1;
    let plain = |s: &str| format!("{s} #{n}\n{echo}").into_bytes();
    let (status, extra, mut body): (u16, String, Vec<u8>) = if path.starts_with("/admin") {
        (200, CACHEABLE.into(), plain("ADMIN PANEL"))
    } else if path.contains("cookie-account") {
        // A session started (or refreshed) on every visit: personal, and says so.
        match &user {
            Some(u) => (
                200,
                format!("{CACHEABLE}Set-Cookie: session={u}; HttpOnly\r\n"),
                plain(&format!("account of {u}")),
            ),
            None => (
                200,
                format!("{CACHEABLE}Set-Cookie: session=guest{n}; HttpOnly\r\n"),
                plain(&format!("welcome, your new session is guest{n}")),
            ),
        }
    } else if path.contains("private-account") {
        let who = user
            .as_deref()
            .map_or("please log in".to_owned(), |u| format!("account of {u}"));
        (
            200,
            "Cache-Control: private, max-age=60\r\n".into(),
            plain(&who),
        )
    } else if path.contains("account") {
        // The careless one: per-user, and marked cacheable all the same.
        let who = user
            .as_deref()
            .map_or("please log in".to_owned(), |u| format!("account of {u}"));
        (
            200,
            "Cache-Control: public, max-age=60\r\n".into(),
            plain(&who),
        )
    } else if let Some(code) = path.strip_prefix("/status/") {
        // An error once (the moment an attacker provoked it), fine afterwards.
        let code: u16 = code.parse().unwrap();
        let status = if first { code } else { 200 };
        (
            status,
            "Cache-Control: public, max-age=60\r\n".into(),
            plain(&format!("status {status}")),
        )
    } else if path == "/gone-explicit" {
        (
            if first { 404 } else { 200 },
            CACHEABLE.into(),
            plain("maybe gone"),
        )
    } else if path == "/gone-410" {
        (
            if first { 410 } else { 200 },
            CACHEABLE.into(),
            plain("maybe gone"),
        )
    } else if path == "/gone-plain" || path.starts_with("/valid404/") {
        match first {
            true => (404, String::new(), plain("not yet")),
            false => (200, CACHEABLE.into(), plain("here now")),
        }
    } else if path == "/gone-nostore" {
        match first {
            true => (
                404,
                "Cache-Control: no-store, max-age=60\r\n".into(),
                plain("not yet"),
            ),
            false => (200, CACHEABLE.into(), plain("here now")),
        }
    } else if path == "/gone-cookie" {
        match first {
            true => (
                404,
                format!("{CACHEABLE}Set-Cookie: t=1\r\n"),
                plain("not yet"),
            ),
            false => (200, CACHEABLE.into(), plain("here now")),
        }
    } else if path == "/partial" {
        // A broken app: a part, unasked.
        let whole = plain("partial whole");
        let len = whole.len();
        (
            206,
            format!("{CACHEABLE}Content-Range: bytes 0-3/{len}\r\n"),
            whole[..4].to_vec(),
        )
    } else {
        (
            200,
            CACHEABLE.into(),
            plain(&format!("page {path} for host {link_host}")),
        )
    };
    if !req_body.is_empty() {
        body.extend_from_slice(b"body=");
        body.extend_from_slice(req_body);
        body.push(b'\n');
    }
    // A range-capable app: a GET's Range gets its part.
    if let (Some(range), "GET", 200) = (field("range"), method, status) {
        if let Some(end) = range
            .strip_prefix("bytes=0-")
            .and_then(|e| e.parse::<usize>().ok())
        {
            let len = body.len();
            let end = end.min(len - 1);
            return (
                206,
                format!("{extra}Content-Range: bytes 0-{end}/{len}\r\n"),
                body[..=end].to_vec(),
            );
        }
    }
    (status, extra, body)
}

const CACHED: &str = "cache = \"main\"\ncache_status = true\ncache_ignore_cookies = [\"_ga*\"]";

/// tern in front of the app: one site (two names, and the default for any other) whose
/// routes all use the cache `main`: `/` as it is, and routes for the keys a test needs.
fn started() -> (tempfile::TempDir, App, Tern) {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let route = |path: &str, more: &str| {
        format!(
            "[[site.route]]\npath = \"{path}\"\nproxy = \"{}\"\n{CACHED}\n{more}\n\n",
            app.addr
        )
    };
    let conf = dir.path().join("tern.toml");
    let mut text = String::from(
        "[cache.main]\nmemory = \"4M\"\nmax_object = \"256K\"\n\n\
         [[site]]\nname = \"one\"\nhosts = [\"one.test\", \"other.test\"]\ndefault = true\n\n",
    );
    text.push_str(&route("/", ""));
    text.push_str(&route("/enc/", "allow_encoded_slash = true"));
    text.push_str(&route(
        "/lang/",
        "cache_key_headers = [\"accept-language\"]",
    ));
    text.push_str(&route("/ranged/", "cache_key_headers = [\"range\"]"));
    text.push_str(&route("/valid404/", "cache_valid = { \"404\" = \"1m\" }"));
    text.push_str(&route("/q/", "cache_key_query = [\"id\"]"));
    text.push_str(&route("/sorted/", "cache_key_query = \"sorted\""));
    text.push_str(&route("/trusted/", "trusted_proxies = \"127.0.0.1\""));
    text.push_str(&route("/small/", "max_body = 1024"));
    text.push_str("[[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n");
    std::fs::write(&conf, text).unwrap();
    let tern = Tern::start_run(&conf);
    (dir, app, tern)
}

/// Sends `bytes` on a fresh connection and reads one answer (`head_only` for a HEAD); None
/// when the server closed the connection without one.
fn exchange(tern: &Tern, bytes: &[u8], head_only: bool) -> Option<Resp> {
    let mut c = tern.client();
    c.chunked_ok = true;
    c.send(bytes);
    c.try_read_response(head_only).ok()
}

/// `METHOD TARGET HTTP/1.1` with `Host: HOST` and `headers`, ended by the empty line.
fn request(method: &str, target: &str, host: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n");
    for (n, v) in headers {
        r.push_str(&format!("{n}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
}

/// A GET on one.test.
fn get(tern: &Tern, target: &str, headers: &[(&str, &str)]) -> Resp {
    get_on(tern, "one.test", target, headers)
}

fn get_on(tern: &Tern, host: &str, target: &str, headers: &[(&str, &str)]) -> Resp {
    exchange(tern, &request("GET", target, host, headers), false)
        .unwrap_or_else(|| panic!("no answer to GET {target} on {host}"))
}

const HIT: Option<&str> = Some("tern; hit");
const MISS: Option<&str> = Some("tern; fwd=miss");
const BYPASS: Option<&str> = Some("tern; fwd=bypass");

/// The field lines a body echoes (everything after its first line).
fn echoed(r: &Resp) -> String {
    r.text()
        .split_once('\n')
        .map_or("", |(_, rest)| rest)
        .to_owned()
}

/// What a normal client's request on one.test reaches the app as, on a cached route: Host
/// and tern's own forwarding fields, in the form the site was matched in.
const CLEAN_FIELDS: &str = "Host: one.test\r\nX-Forwarded-For: 127.0.0.1\r\n\
    X-Forwarded-Proto: http\r\nX-Forwarded-Host: one.test\r\n\
    Forwarded: for=127.0.0.1;proto=http;host=\"one.test\"\r\n";

#[test]
fn unkeyed_forwarding_override_and_host_fields_never_reach_the_app_or_the_entry() {
    let (_dir, app, tern) = started();
    // A clean request first: what every client of a page should get.
    let clean = get(&tern, "/u/clean", &[]);
    assert_eq!(clean.header("cache-status"), MISS);
    assert_eq!(echoed(&clean), CLEAN_FIELDS);
    let attacks: &[(&str, &str)] = &[
        ("X-Forwarded-Host", "evil.test"),
        ("X-Forwarded-Host", "one.test, evil.test"),
        ("X-Forwarded-Scheme", "nothttps"),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Port", "1337"),
        ("X-Forwarded-Prefix", "/evil"),
        ("X-Forwarded-Server", "evil.test"),
        ("X-Original-URL", "/admin"),
        ("X-Rewrite-URL", "/admin"),
        ("X-HTTP-Method-Override", "DELETE"),
        ("X-HTTP-Method", "DELETE"),
        ("X-Method-Override", "DELETE"),
        ("Forwarded", "host=evil.test;proto=https"),
        ("Forwarded", "for=6.6.6.6;host=\"evil.test\";proto=https"),
        ("X-Host", "evil.test"),
        ("X-HTTP-Host-Override", "evil.test"),
        ("X-Original-Host", "evil.test"),
        ("X-Real-IP", "6.6.6.6"),
        ("True-Client-IP", "6.6.6.6"),
        ("If-None-Match", "*"),
        ("If-Modified-Since", "Sat, 01 Jan 2000 00:00:00 GMT"),
    ];
    for (i, (name, value)) in attacks.iter().enumerate() {
        let path = format!("/u/{i}");
        // The attacker asks first, so that its answer fills the entry.
        let poisoned = get(&tern, &path, &[(name, value)]);
        assert_eq!(poisoned.status, 200, "{name}: {}", poisoned.text());
        assert_eq!(poisoned.header("cache-status"), MISS, "{name}");
        assert_eq!(
            poisoned.text(),
            format!("page {path} for host one.test #1\n{CLEAN_FIELDS}"),
            "{name}: {value} changed what the app made"
        );
        // The normal client after: the same clean page, from the entry.
        let victim = get(&tern, &path, &[]);
        assert_eq!(victim.header("cache-status"), HIT, "{name}");
        assert_eq!(victim.text(), poisoned.text(), "{name}");
        assert_eq!(app.asked(&path), 1, "{name}");
    }
    for word in [
        "evil", "/admin", "DELETE", "1337", "6.6.6.6", "nothttps", "If-",
    ] {
        assert!(!app.saw(word.as_bytes()), "{word} reached the app");
    }
    // An unkeyed spelling in either case is the same field.
    let shouted = get(&tern, "/u/shout", &[("x-fOrWaRdEd-hOsT", "evil.test")]);
    assert!(shouted
        .text()
        .starts_with("page /u/shout for host one.test #1\n"));
    assert!(!app.saw(b"evil"));
}

#[test]
fn unkeyed_query_parameters_never_reach_the_app() {
    let (_dir, app, tern) = started();
    // Only `id` is keyed on /q/: the rest of the query is neither keyed nor sent.
    for attack in [
        "/q/p?id=1&callback=alert(1)",
        "/q/p?callback=alert(1)&id=1",
        "/q/p?id=1&utm_content=%3Cscript%3E",
    ] {
        let poisoned = get(&tern, attack, &[]);
        assert_eq!(poisoned.status, 200, "{attack}");
        assert!(
            poisoned
                .text()
                .starts_with("page /q/p for host one.test #1\n"),
            "{attack}: {}",
            poisoned.text()
        );
    }
    assert_eq!(
        app.targets(),
        ["/q/p?id=1"],
        "one request, with the keyed query only"
    );
    let victim = get(&tern, "/q/p?id=1", &[]);
    assert_eq!(victim.header("cache-status"), HIT);
    // Parameter cloaking: what is not split on `&` stays in the keyed parameter, whole,
    // so it is its own entry and the app sees it as it was keyed.
    let cloaked = get(&tern, "/q/p?id=1;callback=alert(1)", &[]);
    assert_eq!(cloaked.header("cache-status"), MISS);
    assert_eq!(app.asked("/q/p?id=1;callback=alert(1)"), 1);
    assert_eq!(get(&tern, "/q/p?id=1", &[]).text(), victim.text());
    // Sorted: both orders are one entry, and the app sees the sorted one only.
    get(&tern, "/sorted/p?b=2&a=1", &[]);
    assert_eq!(
        get(&tern, "/sorted/p?a=1&b=2", &[]).header("cache-status"),
        HIT
    );
    assert_eq!(app.asked("/sorted/p?a=1&b=2"), 1);
    assert_eq!(app.asked("/sorted/p?b=2&a=1"), 0);
    assert!(!app.saw(b"callback=alert(1)&") && !app.saw(b"utm_content"));
}

#[test]
fn a_trusted_proxys_scheme_and_host_claims_are_not_passed_on_a_keyed_request() {
    let (_dir, app, tern) = started();
    // The test's client is a trusted proxy on /trusted/: its words about the scheme and
    // host are still not what the key holds, so they do not reach the app.
    let attacks: &[(&str, &str)] = &[
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "evil.test"),
        ("Forwarded", "for=6.6.6.6;host=evil.test;proto=https"),
    ];
    for (i, (name, value)) in attacks.iter().enumerate() {
        let path = format!("/trusted/{i}");
        let poisoned = get(&tern, &path, &[(name, value)]);
        // The client's address is what the trusted proxies say it is (here Forwarded's
        // for=), resolved to one parsed address: the only word of theirs that goes on.
        let fields = match *name {
            "Forwarded" => CLEAN_FIELDS.replace("127.0.0.1", "6.6.6.6"),
            _ => CLEAN_FIELDS.to_owned(),
        };
        assert_eq!(
            poisoned.text(),
            format!("page {path} for host one.test #1\n{fields}"),
            "{name}"
        );
        assert_eq!(get(&tern, &path, &[]).header("cache-status"), HIT);
    }
    assert!(!app.saw(b"evil") && !app.saw(b"https") && !app.saw(b"host=evil"));
}

#[test]
fn a_trusted_proxys_forwarded_for_list_is_not_an_unkeyed_input() {
    let (_dir, app, tern) = started();
    let evil = "<script>alert(1)</script>";
    let poisoned = get(
        &tern,
        "/trusted/xff",
        &[("X-Forwarded-For", &format!("{evil}, 6.6.6.6"))],
    );
    assert_eq!(poisoned.header("cache-status"), MISS);
    let victim = get(&tern, "/trusted/xff", &[]);
    assert_eq!(victim.header("cache-status"), HIT);
    assert!(
        !victim.text().contains(evil),
        "the attacker's X-Forwarded-For is in the entry others get:\n{}",
        victim.text()
    );
    assert!(!app.saw(evil.as_bytes()), "it reached the app");
}

#[test]
fn a_get_with_a_body_neither_fills_the_cache_nor_is_answered_from_it() {
    let (_dir, app, tern) = started();
    let with_length = b"GET /fat HTTP/1.1\r\nHost: one.test\r\nContent-Length: 9\r\n\r\npoisoned!";
    let fat = exchange(&tern, with_length, false).unwrap();
    assert_eq!(fat.header("cache-status"), BYPASS);
    assert!(fat.text().contains("body=poisoned!"), "{}", fat.text());
    let victim = get(&tern, "/fat", &[]);
    assert_eq!(
        victim.header("cache-status"),
        MISS,
        "the fat GET stored nothing"
    );
    assert_eq!(
        victim.text(),
        format!("page /fat for host one.test #2\n{CLEAN_FIELDS}")
    );
    assert_eq!(get(&tern, "/fat", &[]).header("cache-status"), HIT);
    // Chunked, now that an entry exists: past it, and the entry stays.
    let chunked = b"GET /fat HTTP/1.1\r\nHost: one.test\r\nTransfer-Encoding: chunked\r\n\r\n\
                    9\r\npoisoned!\r\n0\r\n\r\n";
    let fat = exchange(&tern, chunked, false).unwrap();
    assert_eq!(fat.header("cache-status"), BYPASS);
    assert!(fat.text().contains("#3") && fat.text().contains("body=poisoned!"));
    let after = get(&tern, "/fat", &[]);
    assert_eq!(after.header("cache-status"), HIT);
    assert_eq!(after.text(), victim.text());
    assert_eq!(app.asked("/fat"), 3);

    // A body that is itself a request, followed on the same connection by a normal one:
    // the body stays a body (never a request of its own, never keyed as one).
    for framing in ["length", "chunked"] {
        let path = format!("/fat-{framing}");
        let hidden = format!(
            "GET {path}/smuggled HTTP/1.1\r\nHost: one.test\r\nX-Forwarded-Host: evil.test\r\n\r\n"
        );
        let mut bytes = format!("GET {path} HTTP/1.1\r\nHost: one.test\r\n").into_bytes();
        match framing {
            "length" => bytes.extend_from_slice(
                format!("Content-Length: {}\r\n\r\n{hidden}", hidden.len()).as_bytes(),
            ),
            _ => bytes.extend_from_slice(
                format!(
                    "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{hidden}\r\n0\r\n\r\n",
                    hidden.len()
                )
                .as_bytes(),
            ),
        }
        bytes.extend_from_slice(&request("GET", &path, "one.test", &[]));
        let mut c = tern.client();
        c.send(&bytes);
        let first = c.read_response(false);
        assert_eq!(first.header("cache-status"), BYPASS, "{framing}");
        let second = c.read_response(false);
        assert_eq!(second.header("cache-status"), MISS, "{framing}");
        assert_eq!(
            second.text(),
            format!("page {path} for host one.test #2\n{CLEAN_FIELDS}"),
            "{framing}"
        );
        assert_eq!(app.asked(&format!("{path}/smuggled")), 0, "{framing}");
        assert_eq!(get(&tern, &path, &[]).text(), second.text(), "{framing}");
    }
    assert_eq!(
        tern.metric("tern_cache_bypassed_total{cause=\"body\",cache=\"main\"}"),
        4
    );
}

/// Deception URLs for an account page under `prefix` (`/account`, ...): what tern answers
/// 400 and what reaches the app (`Some(path the app is sent)`).
fn deception_urls(prefix: &str) -> Vec<(String, Option<String>)> {
    vec![
        (format!("{prefix}/x.css"), Some(format!("{prefix}/x.css"))),
        (format!("{prefix};x.css"), None),
        (format!("{prefix}%2Fx.css"), None),
        (format!("{prefix}%00.css"), None),
        (format!("{prefix}/.css"), Some(format!("{prefix}/.css"))),
        (format!("{prefix}/..;/x.css"), None),
        (format!("{prefix}/%2e%2e/x.css"), Some("/x.css".to_owned())),
        (
            format!("{prefix}%3Bx.css"),
            Some(format!("{prefix}%3Bx.css")),
        ),
        (
            format!("{prefix}/x.css?v=1"),
            Some(format!("{prefix}/x.css?v=1")),
        ),
    ]
}

#[test]
fn web_cache_deception_never_serves_a_logged_in_page_to_a_logged_out_client() {
    let (_dir, app, tern) = started();
    let mut urls = Vec::new();
    for prefix in ["/account", "/private-account", "/cookie-account"] {
        urls.extend(deception_urls(prefix));
    }
    // A route that takes %2F: the app then gets the path with it, as one segment.
    urls.push((
        "/enc/account%2Fx.css".to_owned(),
        Some("/enc/account%2Fx.css".to_owned()),
    ));
    let victims: &[&[(&str, &str)]] = &[
        &[("Cookie", "session=victim")],
        &[("Cookie", "_ga=GA1.2.3; session=victim")],
        &[("Cookie", "_ga=GA1.2.3"), ("Cookie", "session=victim")],
        &[("Authorization", "Basic dmljdGltOnNlY3JldA==")],
    ];
    for (url, sent) in &urls {
        for credentials in victims {
            // The victim, logged in, follows the attacker's link.
            let own = get(&tern, url, credentials);
            match sent {
                None => {
                    assert_eq!(own.status, 400, "{url}: {}", own.text());
                    continue;
                }
                Some(sent) => {
                    assert_eq!(own.status, 200, "{url}");
                    assert_eq!(own.header("cache-status"), BYPASS, "{url} {credentials:?}");
                    // Their own page, made for them (`/x.css` is no account page).
                    if sent.contains("account") {
                        assert!(
                            own.text().starts_with("account of "),
                            "{url}: {}",
                            own.text()
                        );
                    }
                }
            }
            // The attacker, logged out, asks for the same URL: never the victim's page.
            let stolen = get(&tern, url, &[]);
            assert_eq!(stolen.status, 200, "{url}");
            for secret in ["victim", "dmljdGlt"] {
                assert!(
                    !stolen.text().contains(secret),
                    "{url}: the victim's page went to a logged-out client:\n{}",
                    stolen.text()
                );
            }
        }
        if let Some(sent) = sent {
            assert!(app.asked(sent) > 0, "{url} reached the app as {sent}");
        }
    }
    // What tern refused never reached the app in any form.
    for target in app.targets() {
        assert!(
            !target.contains(';') && !target.contains("%00"),
            "{target} reached the app"
        );
        assert!(
            !target.contains("%2F") || target.starts_with("/enc/"),
            "{target} reached the app"
        );
    }
    // Every logged-in request that tern let through reached the app with its credentials
    // (it went past the cache): 4 victims for each URL the app is sent.
    let reached = urls.iter().filter(|(_, sent)| sent.is_some()).count();
    let with_credentials = app
        .all()
        .iter()
        .filter(|s| find(&s.head, b"victim").is_some() || find(&s.head, b"dmljdGlt").is_some())
        .count();
    assert_eq!(with_credentials, reached * victims.len());
    // Only logged-out pages of the careless `/account` (public, max-age) were stored; the
    // private and Set-Cookie ones never.
    let stored = tern.metric("tern_cache_stored_total{cache=\"main\"}");
    let careless = urls
        .iter()
        .filter(|(u, s)| s.is_some() && u.starts_with("/account") || u.starts_with("/enc/"))
        .count() as u64;
    // (`/account/%2e%2e/x.css` is `/x.css`, a page stored once, which the other prefixes'
    // `/%2e%2e/x.css` then hit.)
    assert_eq!(stored, careless, "one logged-out page per careless URL");
    assert_eq!(
        tern.metric("tern_cache_uncacheable_total{cause=\"private\",cache=\"main\"}")
            + tern.metric("tern_cache_uncacheable_total{cause=\"set_cookie\",cache=\"main\"}"),
        2 * 4 * 4,
        "each logged-out request for a private or cookie page went to the app, unstored"
    );
}

#[test]
fn a_set_cookie_answer_to_a_logged_out_client_is_never_served_to_another() {
    let (_dir, _app, tern) = started();
    let first = get(&tern, "/cookie-account/welcome", &[]);
    assert!(first
        .text()
        .starts_with("welcome, your new session is guest1 "));
    assert!(first
        .header("set-cookie")
        .is_some_and(|c| c.starts_with("session=guest1")));
    let second = get(&tern, "/cookie-account/welcome", &[]);
    assert_eq!(second.header("cache-status"), MISS);
    assert!(
        second
            .text()
            .starts_with("welcome, your new session is guest2 "),
        "{}",
        second.text()
    );
    assert!(second
        .header("set-cookie")
        .is_some_and(|c| c.starts_with("session=guest2")));
}

#[test]
fn a_logged_in_page_never_reaches_a_logged_out_client_and_credentials_go_past() {
    let (_dir, app, tern) = started();
    // Logged in first: the careless app marks the page public.
    let own = get(&tern, "/account", &[("Cookie", "session=victim")]);
    assert!(
        own.text().starts_with("account of victim #1"),
        "{}",
        own.text()
    );
    assert_eq!(own.header("cache-status"), BYPASS);
    let out = get(&tern, "/account", &[]);
    assert_eq!(
        out.header("cache-status"),
        MISS,
        "nothing was stored for the victim"
    );
    assert!(out.text().starts_with("please log in #2"), "{}", out.text());
    assert_eq!(get(&tern, "/account", &[]).text(), out.text());
    // Logged in after a logged-out page was stored: the victim still gets their own.
    let own = get(&tern, "/account", &[("Cookie", "session=victim")]);
    assert!(own.text().starts_with("account of victim #3"));
    let auth = get(
        &tern,
        "/account",
        &[("Authorization", "Bearer victim-token")],
    );
    assert_eq!(auth.header("cache-status"), BYPASS);
    assert!(auth
        .text()
        .starts_with("account of auth Bearer victim-token #4"));
    // A harmless cookie: answered from the entry, and the app never gets it.
    let ga = get(&tern, "/account", &[("Cookie", "_ga=GA1.2.3")]);
    assert_eq!(ga.header("cache-status"), HIT);
    assert_eq!(ga.text(), out.text());
    // Cookies as comma-separated pairs (RFC 2965's old form): tern reads `_ga` only, so the
    // request is looked up; no cookie reaches the app on it, so nothing personal is made.
    let commas = get(&tern, "/account", &[("Cookie", "_ga=1, session=victim")]);
    assert_eq!(commas.text(), out.text());
    // A session cookie in another case, or with spaces: past the cache.
    for cookie in ["SESSION=victim", "  session=victim  ", "x=1;session=victim"] {
        let r = get(&tern, "/account", &[("Cookie", cookie)]);
        assert_eq!(r.header("cache-status"), BYPASS, "{cookie}");
    }
    let last = get(&tern, "/account", &[]);
    assert_eq!(last.text(), out.text());
    assert_eq!(app.asked("/account"), 2 + 2 + 3);
    assert_eq!(
        tern.metric("tern_cache_bypassed_total{cause=\"cookie\",cache=\"main\"}"),
        5
    );
    assert_eq!(
        tern.metric("tern_cache_bypassed_total{cause=\"authorization\",cache=\"main\"}"),
        1
    );
    // An answer to a request with Authorization is not stored even if the app says public.
    let authed = get(&tern, "/page-a", &[("Authorization", "Basic YTpi")]);
    assert_eq!(authed.header("cache-status"), BYPASS);
    assert_eq!(get(&tern, "/page-a", &[]).header("cache-status"), MISS);
}

#[test]
fn path_spellings_share_the_canonical_entry_and_none_puts_another_pages_content_there() {
    let (_dir, app, tern) = started();
    let first = get(&tern, "/./page", &[]);
    assert_eq!(first.header("cache-status"), MISS);
    let page = format!("page /page for host one.test #1\n{CLEAN_FIELDS}");
    assert_eq!(first.text(), page);
    // Spellings of /page: one entry, filled once.
    for spelling in [
        "/page",
        "/x/../page",
        "//page",
        "/%70age",
        "/p%61ge",
        "/%2e/page",
        "/a/..//page",
        "/admin/../page",
        "/./x/.././/page",
        "http://one.test/./page",
    ] {
        let r = get(&tern, spelling, &[]);
        assert_eq!(r.header("cache-status"), HIT, "{spelling}");
        assert_eq!(r.text(), page, "{spelling}");
    }
    // Delimiters two readers could split differently: refused, never sent.
    for refused in [
        "/page;x",
        "/page;/../admin",
        "/page/..;/admin",
        "/page%2F..%2Fadmin",
        "/page%5C..%5Cadmin",
        "/page\\..\\admin",
        "/..%2fpage",
        "/page%00",
        "/page%2500",
        "/../page",
    ] {
        let r = exchange(&tern, &request("GET", refused, "one.test", &[]), false);
        let status = r.as_ref().map(|r| r.status);
        assert_eq!(status, Some(400), "{refused}");
    }
    // Other paths: entries of their own, each with its own content.
    for (other, sent) in [
        ("/PAGE", "/PAGE"),
        ("/page/", "/page/"),
        ("/page?", "/page?"),
        ("/page%3Bx", "/page%3Bx"),
        ("/page/../admin", "/admin"),
        ("/page%2e%2e", "/page.."),
    ] {
        let r = get(&tern, other, &[]);
        assert_eq!(r.header("cache-status"), MISS, "{other}");
        assert_eq!(app.asked(sent), 1, "{other} reached the app as {sent}");
    }
    assert!(get(&tern, "/admin", &[])
        .text()
        .starts_with("ADMIN PANEL #1"));
    // The canonical page's entry is as it was, filled by one request.
    assert_eq!(get(&tern, "/page", &[]).text(), page);
    assert_eq!(app.asked("/page"), 1);
    // The app only ever got canonical request lines.
    for target in app.targets() {
        let path = target.split('?').next().unwrap();
        assert!(
            !path.contains("/./")
                && !path.contains("/../")
                && !path.contains("//")
                && !path.contains(';')
                && !path.contains('\\')
                && !path.contains("%2F")
                && !path.contains("%70"),
            "{target}"
        );
    }
}

#[test]
fn host_variants_share_only_their_own_sites_entry() {
    let (_dir, app, tern) = started();
    let one = get_on(&tern, "one.test", "/h", &[]);
    assert!(one.text().starts_with("page /h for host one.test #1\n"));
    // The same name, spelt otherwise: the same entry, which the app made for one.test.
    for host in ["ONE.TEST", "One.Test.", "one.test."] {
        let r = get_on(&tern, host, "/h", &[]);
        assert_eq!(r.header("cache-status"), HIT, "{host}");
        assert_eq!(r.text(), one.text(), "{host}");
    }
    // An absolute-form target naming the other name: tern routes and keys by Host, and the
    // app is sent Host, never the target's authority.
    let absolute = get_on(&tern, "one.test", "http://other.test/h", &[]);
    assert_eq!(absolute.header("cache-status"), HIT);
    assert_eq!(absolute.text(), one.text());
    let absolute = get_on(&tern, "other.test", "http://one.test/h2", &[]);
    assert!(absolute
        .text()
        .starts_with("page /h2 for host other.test #1\n"));
    let h2 = get_on(&tern, "one.test", "/h2", &[]);
    assert_eq!(
        h2.header("cache-status"),
        MISS,
        "other.test's entry is not one.test's"
    );
    assert!(h2.text().starts_with("page /h2 for host one.test #1\n"));
    // The other name: its own entry, made for it.
    let other = get_on(&tern, "other.test", "/h", &[]);
    assert_eq!(other.header("cache-status"), MISS);
    assert!(other.text().starts_with("page /h for host other.test #1\n"));
    // A port: its own entry (the app is told the port), never one.test's.
    let port = get_on(&tern, "one.test:8080", "/h", &[]);
    assert_eq!(port.header("cache-status"), MISS);
    assert!(port
        .text()
        .starts_with("page /h for host one.test:8080 #1\n"));
    assert_eq!(get_on(&tern, "one.test", "/h", &[]).text(), one.text());
    // A name no site lists goes to the default site, under its own key.
    let unknown = get_on(&tern, "evil.test", "/h", &[]);
    assert_eq!(unknown.header("cache-status"), MISS);
    assert!(unknown
        .text()
        .starts_with("page /h for host evil.test #1\n"));
    assert_eq!(get_on(&tern, "one.test", "/h", &[]).text(), one.text());
    // Two Host fields: refused, never sent.
    let two = exchange(
        &tern,
        b"GET /h3 HTTP/1.1\r\nHost: one.test\r\nHost: evil.test\r\n\r\n",
        false,
    );
    assert_eq!(two.map(|r| r.status), Some(400));
    assert_eq!(app.asked("/h3"), 0);
    // No Host at all (HTTP/1.0), with an absolute-form target naming a host: the app is
    // not told that host, and the entry is not one.test's.
    let bare = exchange(&tern, b"GET http://evil2.test/h HTTP/1.0\r\n\r\n", false).unwrap();
    assert_eq!(bare.status, 200);
    assert!(!bare.text().contains("evil2"), "{}", bare.text());
    assert_ne!(bare.text(), one.text());
    assert!(!app.saw(b"evil2"));
    assert_eq!(get_on(&tern, "one.test", "/h", &[]).text(), one.text());
    assert_eq!(get_on(&tern, "other.test", "/h", &[]).text(), other.text());
    assert_eq!(get_on(&tern, "one.test", "/h2", &[]).text(), h2.text());
}

#[test]
fn oversized_fields_and_meta_characters_neither_reach_the_app_nor_deny_the_page() {
    let (_dir, app, tern) = started();
    // HHO: a field the app would refuse (its heads are 1 KiB at most), under tern's limit.
    let big = "a".repeat(8000);
    let poisoned = get(&tern, "/cpdos/hho", &[("X-Oversized-Header", &big)]);
    assert_eq!(poisoned.status, 200, "{}", poisoned.text());
    assert_eq!(
        poisoned.text(),
        format!("page /cpdos/hho for host one.test #1\n{CLEAN_FIELDS}")
    );
    assert_eq!(get(&tern, "/cpdos/hho", &[]).header("cache-status"), HIT);
    // Over tern's own limit: tern's 431, then the page as before.
    let huge = "a".repeat(40_000);
    let refused = exchange(
        &tern,
        &request(
            "GET",
            "/cpdos/hho2",
            "one.test",
            &[("X-Oversized-Header", &huge)],
        ),
        false,
    );
    assert_eq!(refused.map(|r| r.status), Some(431));
    let after = get(&tern, "/cpdos/hho2", &[]);
    assert_eq!((after.status, after.header("cache-status")), (200, MISS));
    // Many fields, each small.
    let many: Vec<(String, String)> = (0..90)
        .map(|i| (format!("X-F{i}"), "b".repeat(20)))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let r = get(&tern, "/cpdos/hho3", &many);
    assert_eq!(r.status, 200);
    assert_eq!(get(&tern, "/cpdos/hho3", &[]).header("cache-status"), HIT);
    assert!(
        app.all().iter().all(|s| s.head.len() <= 1024),
        "a large head reached the app"
    );

    // A keyed field the app refuses when it is too large: the refusal is the attacker's
    // own, never stored, and the page stays for everyone else.
    let lang = "en,".repeat(500);
    for _ in 0..2 {
        let r = get(&tern, "/lang/hho", &[("Accept-Language", &lang)]);
        assert_eq!((r.status, r.header("cache-status")), (431, MISS));
    }
    assert_eq!(app.asked("/lang/hho"), 2, "the app's 431 was not stored");
    let fine = get(&tern, "/lang/hho", &[]);
    assert_eq!((fine.status, fine.header("cache-status")), (200, MISS));
    let fine = get(&tern, "/lang/hho", &[("Accept-Language", "en")]);
    assert_eq!((fine.status, fine.header("cache-status")), (200, MISS));
    assert_eq!(get(&tern, "/lang/hho", &[]).header("cache-status"), HIT);

    // HMC: control characters, DEL, a bare CR, an obsolete line fold, bytes past ASCII.
    let metas: &[&[u8]] = &[
        b"a\x00b", b"a\x01b", b"a\x7fb", b"a\rb", b"a\r\n b", b"a\xffb", b"a\x1bb",
    ];
    for (i, meta) in metas.iter().enumerate() {
        let path = format!("/cpdos/hmc{i}");
        let mut bytes =
            format!("GET {path} HTTP/1.1\r\nHost: one.test\r\nX-Metachar: ").into_bytes();
        bytes.extend_from_slice(meta);
        bytes.extend_from_slice(b"\r\n\r\n");
        let attacked = exchange(&tern, &bytes, false);
        if let Some(r) = &attacked {
            // tern's own 400, or the page without the field.
            assert!(
                r.status == 400 || r.text().starts_with(&format!("page {path} ")),
                "{meta:?}: {} {}",
                r.status,
                r.text()
            );
        }
        let victim = get(&tern, &path, &[]);
        assert_eq!(victim.status, 200, "{meta:?}: {}", victim.text());
        assert_eq!(
            victim.text().split_once(" #").unwrap().0,
            format!("page {path} for host one.test"),
            "{meta:?}"
        );
        assert_eq!(
            get(&tern, &path, &[]).header("cache-status"),
            HIT,
            "{meta:?}"
        );
    }
    assert!(
        !app.saw(b"X-Metachar"),
        "a meta character's field reached the app"
    );
    assert!(!app.all().iter().any(|s| {
        s.head
            .iter()
            .any(|&b| (b < 0x20 && !matches!(b, b'\t' | b'\r' | b'\n')) || b >= 0x7f)
    }));
}

#[test]
fn a_method_override_cannot_turn_a_page_into_a_stored_error() {
    let (_dir, app, tern) = started();
    for (i, name) in [
        "X-HTTP-Method-Override",
        "X-HTTP-Method",
        "X-Method-Override",
        "x-http-method-override",
    ]
    .iter()
    .enumerate()
    {
        let path = format!("/cpdos/hmo{i}");
        let attacked = get(&tern, &path, &[(name, "DELETE")]);
        assert_eq!(attacked.status, 200, "{name}: {}", attacked.text());
        let victim = get(&tern, &path, &[]);
        assert_eq!(
            (victim.status, victim.header("cache-status")),
            (200, HIT),
            "{name}"
        );
        assert!(victim.text().starts_with(&format!("page {path} ")));
    }
    assert!(!app.saw(b"DELETE") && !app.saw(b"method-override"));
    // Methods tern does not cache go past it, and drop nothing: no method purges.
    let page = get(&tern, "/cpdos/m", &[]);
    for method in ["PURGE", "BAN", "OPTIONS", "REFRESH"] {
        let r = exchange(&tern, &request(method, "/cpdos/m", "one.test", &[]), false).unwrap();
        assert_eq!(r.header("cache-status"), BYPASS, "{method}");
    }
    let after = get(&tern, "/cpdos/m", &[]);
    assert_eq!(
        (after.header("cache-status"), after.text()),
        (HIT, page.text())
    );
    assert_eq!(
        tern.metric("tern_cache_bypassed_total{cause=\"method\",cache=\"main\"}"),
        4
    );
}

#[test]
fn error_answers_are_never_stored_for_everyone() {
    let (_dir, app, tern) = started();
    let codes = [
        400, 401, 403, 405, 413, 414, 429, 431, 500, 501, 502, 503, 504,
    ];
    for code in codes {
        let path = format!("/status/{code}");
        // The app fails once, when the attacker asks (with a lifetime, even public).
        let attacked = get(&tern, &path, &[]);
        assert_eq!(attacked.status, code, "{}", attacked.text());
        let victim = get(&tern, &path, &[]);
        assert_eq!(
            (victim.status, victim.header("cache-status")),
            (200, MISS),
            "{code}"
        );
        assert_eq!(get(&tern, &path, &[]).header("cache-status"), HIT, "{code}");
        assert_eq!(app.asked(&path), 2, "{code}");
    }
    assert_eq!(
        tern.metric("tern_cache_uncacheable_total{cause=\"status\",cache=\"main\"}"),
        codes.len() as u64
    );
    // tern's own errors, before any lookup: never stored either.
    let long_query = format!("/cpdos/own2?{}", "q".repeat(40_000));
    let own: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "/small/own1",
            request(
                "GET",
                "/small/own1",
                "one.test",
                &[("Content-Length", "99999")],
            ),
            413,
        ),
        (
            "/cpdos/own2",
            request("GET", &long_query, "one.test", &[]),
            431,
        ),
        (
            "/cpdos/own3",
            request(
                "GET",
                "/cpdos/own3",
                "one.test",
                &[("Content-Length", "1"), ("Content-Length", "2")],
            ),
            400,
        ),
        (
            "/cpdos/own4",
            request(
                "GET",
                "/cpdos/own4",
                "one.test",
                &[("Transfer-Encoding", "chunked, gzip")],
            ),
            400,
        ),
        (
            "/cpdos/own5",
            request(
                "GET",
                "/cpdos/own5",
                "one.test",
                &[("Content-Length", "1x")],
            ),
            400,
        ),
    ];
    for (path, bytes, status) in &own {
        let r = exchange(&tern, bytes, false);
        assert_eq!(r.map(|r| r.status), Some(*status), "{path}");
        let victim = get(&tern, path, &[]);
        assert_eq!(
            (victim.status, victim.header("cache-status")),
            (200, MISS),
            "{path}"
        );
        assert_eq!(app.asked(path), 1, "{path}");
    }
}

#[test]
fn a_404_or_410_is_stored_only_as_the_rules_say() {
    let (_dir, app, tern) = started();
    // With a lifetime of its own: stored (RFC 9111), for everyone, for that lifetime.
    let first = get(&tern, "/gone-explicit", &[]);
    assert_eq!(first.status, 404);
    let again = get(&tern, "/gone-explicit", &[]);
    assert_eq!((again.status, again.header("cache-status")), (404, HIT));
    let first = get(&tern, "/gone-410", &[]);
    assert_eq!(first.status, 410);
    assert_eq!(get(&tern, "/gone-410", &[]).header("cache-status"), HIT);
    // Without a lifetime and none for 404 on the route: not stored.
    assert_eq!(get(&tern, "/gone-plain", &[]).status, 404);
    let next = get(&tern, "/gone-plain", &[]);
    assert_eq!((next.status, next.header("cache-status")), (200, MISS));
    // ...but stored where the route gives 404 a lifetime.
    assert_eq!(get(&tern, "/valid404/x", &[]).status, 404);
    let next = get(&tern, "/valid404/x", &[]);
    assert_eq!((next.status, next.header("cache-status")), (404, HIT));
    // Never with no-store or Set-Cookie.
    for path in ["/gone-nostore", "/gone-cookie"] {
        assert_eq!(get(&tern, path, &[]).status, 404, "{path}");
        let next = get(&tern, path, &[]);
        assert_eq!(
            (next.status, next.header("cache-status")),
            (200, MISS),
            "{path}"
        );
    }
    // A 404 the attacker could provoke through an unkeyed input never happens: the
    // override does not reach the app.
    let r = get(
        &tern,
        "/gone-by-override",
        &[("X-HTTP-Method-Override", "PUT")],
    );
    assert_eq!(r.status, 200);
    assert_eq!(app.asked("/gone-explicit"), 1);
    assert_eq!(app.asked("/valid404/x"), 1);
}

#[test]
fn a_range_on_a_miss_stores_the_whole_answer_and_a_partial_one_is_never_stored() {
    let (_dir, app, tern) = started();
    // A miss with Range: the app is asked for the whole page (Range is not keyed).
    let part = get(&tern, "/r", &[("Range", "bytes=0-3")]);
    assert_eq!(part.header("cache-status"), MISS);
    let whole = get(&tern, "/r", &[]);
    assert_eq!((whole.status, whole.header("cache-status")), (200, HIT));
    assert_eq!(
        whole.text(),
        format!("page /r for host one.test #1\n{CLEAN_FIELDS}")
    );
    match part.status {
        200 => assert_eq!(part.body, whole.body),
        206 => assert_eq!(part.body, whole.body[..4]),
        s => panic!("{s}"),
    }
    assert!(
        !app.saw(b"range:"),
        "Range reached the app on a keyed request"
    );
    // From the whole entry, a range of it.
    let hit = get(&tern, "/r", &[("Range", "bytes=0-3")]);
    assert_eq!((hit.status, &hit.body[..]), (206, &whole.body[..4]));

    // Where Range is keyed, the app answers 206: never stored, the next asks again.
    for _ in 0..2 {
        let r = get(&tern, "/ranged/r", &[("Range", "bytes=0-3")]);
        assert_eq!((r.status, r.header("cache-status")), (206, MISS));
        assert_eq!(r.body.len(), 4);
    }
    assert_eq!(app.asked("/ranged/r"), 2);
    let whole = get(&tern, "/ranged/r", &[]);
    assert_eq!((whole.status, whole.header("cache-status")), (200, MISS));
    assert!(whole.body.len() > 4);
    let again = get(&tern, "/ranged/r", &[]);
    assert_eq!(
        (again.status, again.header("cache-status"), &again.body),
        (200, HIT, &whole.body)
    );
    // An app that answers a part nobody asked for: not stored either.
    for _ in 0..2 {
        let r = get(&tern, "/partial", &[]);
        assert_eq!((r.status, r.header("cache-status")), (206, MISS));
    }
    assert_eq!(
        tern.metric("tern_cache_uncacheable_total{cause=\"partial\",cache=\"main\"}"),
        4
    );
}

#[test]
fn an_answer_longer_than_its_framing_is_never_taken_for_the_next_requests_answer() {
    let (_dir, app, tern) = started();
    // The app reflects a query into its body, and sends that body after a HEAD answer, or
    // past the length it gave: the attacker writes a whole answer there.
    let smuggled =
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 8\r\n\r\nPOISONED";
    let q = percent_encode(smuggled);
    for (method, path) in [("HEAD", "/reflect"), ("GET", "/short")] {
        for i in 0..3 {
            let target = format!("{path}?q={q}&i={i}");
            let attacked = exchange(
                &tern,
                &request(method, &target, "one.test", &[]),
                method == "HEAD",
            );
            assert_eq!(attacked.map(|r| r.status), Some(200), "{method} {path}");
            // The next requests, at once: each gets its own page, and keeps it.
            let victim_path = format!("/victim-{method}-{i}");
            let victim = get(&tern, &victim_path, &[]);
            assert_eq!(victim.status, 200);
            assert_eq!(
                victim.text(),
                format!("page {victim_path} for host one.test #1\n{CLEAN_FIELDS}"),
                "{method} {path}: the smuggled answer was taken for the next one's"
            );
            let again = get(&tern, &victim_path, &[]);
            assert_eq!(
                (again.header("cache-status"), again.text()),
                (HIT, victim.text())
            );
        }
    }
    assert_eq!(app.asked(&format!("/reflect?q={q}&i=0")), 1);
}

#[test]
fn a_websocket_handshake_on_a_cached_page_cannot_store_the_apps_answer_to_it() {
    let (_dir, app, tern) = started();
    let handshake = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("Sec-WebSocket-Version", "13"),
    ];
    // The app has no WebSocket here and says so with a 404 it gives a lifetime.
    let attacked = get(&tern, "/ws-page", &handshake);
    assert_ne!(attacked.status, 101);
    let victim = get(&tern, "/ws-page", &[]);
    assert_eq!(
        victim.status,
        200,
        "the answer to the attacker's handshake is served to others: {} {:?}",
        victim.text(),
        victim.header("cache-status")
    );
    assert!(victim
        .text()
        .starts_with("page /ws-page for host one.test "));
    let _ = app;
}
