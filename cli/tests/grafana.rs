//! Grafana under a sub-path (issue 41), as Grafana's tutorial "Run Grafana behind a reverse
//! proxy" (<https://grafana.com/tutorials/run-grafana-behind-a-proxy/>, from
//! `docs/sources/tutorials/run-grafana-behind-a-proxy/index.md` in grafana/grafana) sets it up:
//! its sub-path nginx server block (a `/grafana/` location, a `/grafana/api/live/` location with
//! the `$connection_upgrade` map for Grafana Live's WebSocket) and Grafana's `root_url = ...
//! /grafana/` with `serve_from_sub_path = true`. The README's `tern.toml` for it and the page's
//! nginx block run in front of one upstream, get the same requests, and must give the same
//! answers; the README's Caddyfile must pass `caddy validate`.
//!
//! The upstream is a STAND-IN written for this test, not Grafana (Grafana has no Debian
//! package and does not build with `go install`). It answers the requests compared as Grafana
//! does with `serve_from_sub_path = true`: every path under `/grafana/`, `/grafana/` redirected
//! to `/grafana/login` for a visitor without a session, the login `POST` setting the session
//! cookie on `Path=/grafana`, static assets under `/grafana/public/`, the API under
//! `/grafana/api/`, the data-source proxy (`/grafana/api/datasources/proxy/uid/UID/...`, whose
//! rest is the data source's own path and may hold `%2F`), and Grafana Live's WebSocket at
//! `/grafana/api/live/ws` (an RFC 6455 handshake, then every message echoed). Its answers name
//! what it was sent (the request target as it arrived, the Host), so a proxy that changed
//! either shows.
//! nginx is installed by `scripts/install-gate-test-deps`; without it only tern is asked.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use crate::support;
use base64::Engine;
use support::*;

// ---------------------------------------------------------------------------------------
// The stand-in

const SESSION: &str = "grafana_session=7c9e6679f4b8a3de";

/// One request as the stand-in read it: the head's lines and the body.
struct Seen {
    method: String,
    target: String,
    version: String,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.field(name)
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    }

    fn logged_in(&self) -> bool {
        self.field("cookie")
            .is_some_and(|c| c.split(';').any(|kv| kv.trim() == SESSION))
    }
}

/// Reads one request head and its body (by Content-Length; the proxies send no other).
fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            break end;
        }
        let n = s.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end + 4);
    let mut lines = head.split("\r\n");
    let mut start = lines.next()?.split(' ');
    let (method, target, version) = (start.next()?, start.next()?, start.next()?);
    let fields: Vec<(String, String)> = lines
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let mut seen = Seen {
        method: method.to_string(),
        target: target.to_string(),
        version: version.to_string(),
        fields,
        body: Vec::new(),
    };
    let len: usize = seen
        .field("content-length")
        .map_or(0, |v| v.parse().unwrap());
    while buf.len() < len {
        let n = s.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    seen.body = buf.drain(..len).collect();
    Some(seen)
}

/// What the stand-in answers: status, fields, body.
struct Reply {
    status: u16,
    fields: Vec<(&'static str, String)>,
    body: String,
}

fn reply(status: u16, content_type: &str, body: impl Into<String>) -> Reply {
    Reply {
        status,
        fields: vec![("Content-Type", content_type.to_string())],
        body: body.into(),
    }
}

fn json(status: u16, body: impl Into<String>) -> Reply {
    reply(status, "application/json", body)
}

/// Grafana's redirect of a visitor without a session to the login page, remembering where
/// they were going (Grafana's `redirect_to` cookie, on the sub-path as every cookie of its).
fn to_login(target: &str) -> Reply {
    let to = target
        .replace('/', "%2F")
        .replace('?', "%3F")
        .replace('=', "%3D")
        .replace('&', "%26");
    Reply {
        status: 302,
        fields: vec![
            ("Location", "/grafana/login".to_string()),
            (
                "Set-Cookie",
                format!("redirect_to={to}; Path=/grafana; HttpOnly; SameSite=Lax"),
            ),
        ],
        body: String::new(),
    }
}

const LOGIN_PAGE: &str = "<!DOCTYPE html><html><head><base href=\"/grafana/\" />\
    <link rel=\"stylesheet\" href=\"public/build/grafana.light.css\" /></head>\
    <body><div id=\"reactRoot\"></div><script src=\"public/build/app.js\"></script></body></html>\n";
const APP_PAGE: &str = "<!DOCTYPE html><html><head><base href=\"/grafana/\" /></head>\
    <body><div id=\"reactRoot\" data-user=\"admin\"></div>\
    <script src=\"public/build/app.js\"></script></body></html>\n";
const APP_JS: &str = "window.grafanaBootData={settings:{appSubUrl:\"/grafana\"}};\n";
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n";

/// The stand-in's answer to one request that is not a WebSocket handshake.
fn grafana(seen: &Seen) -> Reply {
    let Some(rest) = seen.target.strip_prefix("/grafana/") else {
        // serve_from_sub_path: Grafana's routes all live under the sub-path.
        return json(404, "{\"message\":\"Not found\"}\n");
    };
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let host = seen.field("host").unwrap_or("-");
    match (seen.method.as_str(), path) {
        ("GET", "login") => reply(200, "text/html; charset=UTF-8", LOGIN_PAGE),
        ("POST", "login") => {
            if seen.body != br#"{"user":"admin","password":"admin"}"# {
                return json(401, "{\"message\":\"Invalid username or password\"}\n");
            }
            let mut r = json(
                200,
                "{\"message\":\"Logged in\",\"redirectUrl\":\"/grafana/\"}\n",
            );
            r.fields.push((
                "Set-Cookie",
                format!("{SESSION}; Path=/grafana; Max-Age=2592000; HttpOnly; SameSite=Lax"),
            ));
            r
        }
        ("GET", "public/build/app.js") => reply(200, "application/javascript", APP_JS),
        ("GET", "public/img/grafana_icon.svg") => reply(200, "image/svg+xml", ICON),
        ("GET", "api/health") => json(200, "{\"database\":\"ok\",\"version\":\"stand-in\"}\n"),
        ("GET", "api/live/ws") => json(
            400,
            "{\"message\":\"websocket: the client is not using the websocket protocol\"}\n",
        ),
        (_, p) if p.starts_with("api/") && !seen.logged_in() => {
            json(401, "{\"message\":\"Unauthorized\"}\n")
        }
        ("GET", "api/user") => json(200, "{\"login\":\"admin\",\"isGrafanaAdmin\":true}\n"),
        (_, p) if p.starts_with("api/datasources/proxy/uid/") => {
            // The data source's answer, through Grafana: what reached it, as it reached it.
            let ds = &p["api/datasources/proxy/uid/".len()..];
            let (uid, ds_path) = ds.split_once('/').unwrap_or((ds, ""));
            json(
                200,
                format!(
                    "{{\"uid\":\"{uid}\",\"path\":\"/{ds_path}\",\"query\":\"{query}\",\
                     \"target\":\"{}\",\"host\":\"{host}\"}}\n",
                    seen.target
                ),
            )
        }
        (_, p) if p.starts_with("api/") => json(404, "{\"message\":\"Not found\"}\n"),
        ("GET", _) if !seen.logged_in() => to_login(&seen.target),
        // The app's pages (the home page, dashboards' deep links): one page, routed in the
        // browser.
        ("GET", _) => reply(200, "text/html; charset=UTF-8", APP_PAGE),
        _ => json(405, "{\"message\":\"Method not allowed\"}\n"),
    }
}

fn accept_for(key: &str) -> String {
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(d.as_ref())
}

/// One RFC 6455 frame: (FIN+opcode byte, payload), unmasked; short payloads only.
fn read_frame(s: &mut impl Read) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).ok()?;
    let len = usize::from(h[1] & 0x7f);
    assert!(len < 126, "the test sends short frames only");
    let mut mask = [0u8; 4];
    if h[1] & 0x80 != 0 {
        s.read_exact(&mut mask).ok()?;
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    for (i, b) in payload.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
    Some((h[0], payload))
}

/// A short frame, masked as a client must send it (RFC 6455 §5.3), or not, as a server does.
fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut v = vec![first, payload.len() as u8];
    match mask {
        Some(m) => {
            v[1] |= 0x80;
            v.extend_from_slice(&m);
            v.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
        }
        None => v.extend_from_slice(payload),
    }
    v
}

const TEXT: u8 = 0x81;
const CLOSE: u8 = 0x88;

/// Grafana Live's endpoint: the handshake (refused without `Upgrade: websocket` and a key),
/// then every frame echoed, prefixed with what the handshake carried; a Close answered.
fn live(mut s: TcpStream, seen: &Seen) {
    let key = seen.field("sec-websocket-key").unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        accept_for(key)
    );
    if s.write_all(answer.as_bytes()).is_err() {
        return;
    }
    let said = format!("host={} ", seen.field("host").unwrap_or("-"));
    while let Some((first, payload)) = read_frame(&mut s) {
        if first == CLOSE {
            let _ = s.write_all(&frame(CLOSE, &payload, None));
            return;
        }
        let mut echo = said.clone().into_bytes();
        echo.extend_from_slice(&payload);
        if s.write_all(&frame(first, &echo, None)).is_err() {
            return;
        }
    }
}

/// Serves one connection: requests one after another until either side closes (HTTP/1.0
/// and `Connection: close` end it after the answer, as nginx's proxy asks by default).
fn serve(mut s: TcpStream) {
    let mut buf = Vec::new();
    while let Some(seen) = read_request(&mut s, &mut buf) {
        let upgrade = seen.has_token("connection", "upgrade")
            && seen
                .field("upgrade")
                .is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
            && seen.field("sec-websocket-key").is_some();
        if upgrade && seen.target == "/grafana/api/live/ws" {
            return live(s, &seen);
        }
        let r = grafana(&seen);
        let close = seen.version == "HTTP/1.0" || seen.has_token("connection", "close");
        let reason = match r.status {
            200 => "OK",
            302 => "Found",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Other",
        };
        let mut out = format!("HTTP/1.1 {} {reason}\r\n", r.status);
        for (n, v) in &r.fields {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        let body = if seen.method == "HEAD" { "" } else { &r.body };
        out.push_str(&format!("Content-Length: {}\r\n", r.body.len()));
        if close {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        out.push_str(body);
        if s.write_all(out.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// The stand-in on a port of its own, a thread per connection, for the test's life.
fn stand_in() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

// ---------------------------------------------------------------------------------------
// The set-ups

const SECTION: &str = "### Grafana under a sub-path, in tern, nginx and Caddy";

/// The page's sub-path server block and its `http`-level lines, as written there (comments
/// included), with only the upstream's address, the port and the root swapped for the test's.
const GRAFANA_NGINX: &str = r#"
# This is required to proxy Grafana Live WebSocket connections.
map $http_upgrade $connection_upgrade {
  default upgrade;
  '' close;
}

upstream grafana {
  server localhost:3000;
}

server {
  listen 80;
  root /usr/share/nginx/www;
  index index.html index.htm;

  location /grafana/ {
    proxy_set_header Host $host;
    proxy_pass http://grafana;
  }

  # Proxy Grafana Live WebSocket connections.
  location /grafana/api/live/ {
    proxy_http_version 1.1;
    proxy_set_header Upgrade $http_upgrade;
    proxy_set_header Connection $connection_upgrade;
    proxy_set_header Host $host;
    proxy_pass http://grafana;
  }
}
"#;

fn nginx_conf(upstream: SocketAddr, port: u16, www: &Path) -> String {
    GRAFANA_NGINX
        .replace("localhost:3000", &upstream.to_string())
        .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
        .replace("/usr/share/nginx/www", www.to_str().unwrap())
}

/// The README's block, with the upstream's address and the root swapped for the test's.
fn tern_toml(upstream: SocketAddr, www: &Path) -> String {
    readme_block(SECTION, "toml")
        .replace("127.0.0.1:3000", &upstream.to_string())
        .replace("/usr/share/nginx/www", www.to_str().unwrap())
}

const FRONT_PAGE: &str = "<h1>example.com</h1>\n";

/// The proxy's own folder (nginx's `root`): a front page beside Grafana.
fn www(dir: &Path) -> std::path::PathBuf {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), FRONT_PAGE).unwrap();
    www
}

// ---------------------------------------------------------------------------------------
// The requests

/// One request both proxies get.
struct Ask {
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
}

const fn get(path: &'static str) -> Ask {
    Ask {
        method: "GET",
        path,
        headers: &[],
        body: "",
    }
}

const LOGGED_IN: &[(&str, &str)] = &[("Cookie", SESSION)];

const fn get_logged_in(path: &'static str) -> Ask {
    Ask {
        method: "GET",
        path,
        headers: LOGGED_IN,
        body: "",
    }
}

/// The answer both must give: the status, the body, and fields with this value (or absent:
/// `None`).
struct Answer {
    status: u16,
    body: &'static str,
    fields: &'static [(&'static str, Option<&'static str>)],
}

const fn answer(status: u16, body: &'static str) -> Answer {
    Answer {
        status,
        body,
        fields: &[],
    }
}

fn send(addr: SocketAddr, ask: &Ask) -> Resp {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut req = format!(
        "{} {} HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n",
        ask.method, ask.path
    );
    for (n, v) in ask.headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    if !ask.body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", ask.body.len()));
    }
    req.push_str("\r\n");
    req.push_str(ask.body);
    stream.write_all(req.as_bytes()).unwrap();
    let mut c = Client::over(stream);
    c.chunked_ok = true;
    c.read_response(ask.method == "HEAD")
}

fn check(addr: SocketAddr, who: &str, cases: &[(Ask, Answer)]) {
    for (ask, want) in cases {
        let what = format!("{who}: {} {}", ask.method, ask.path);
        let r = send(addr, ask);
        assert_eq!(r.status, want.status, "{what}: {r:?}");
        assert_eq!(r.text(), want.body, "{what}");
        for (name, value) in want.fields {
            assert_eq!(r.header(name), *value, "{what}: {name}: {r:?}");
        }
    }
}

const LOGIN_FORM: &str = r#"{"user":"admin","password":"admin"}"#;
const JSON: (&str, Option<&str>) = ("Content-Type", Some("application/json"));

const CASES: &[(Ask, Answer)] = &[
    // The proxy's own folder beside Grafana.
    (get("/"), answer(200, FRONT_PAGE)),
    // A visitor without a session: to the login page, on the sub-path.
    (
        get("/grafana/"),
        Answer {
            status: 302,
            body: "",
            fields: &[
                ("Location", Some("/grafana/login")),
                (
                    "Set-Cookie",
                    Some("redirect_to=%2Fgrafana%2F; Path=/grafana; HttpOnly; SameSite=Lax"),
                ),
            ],
        },
    ),
    (
        get("/grafana/d/rYdddlPWk/node-exporter-full?orgId=1&refresh=30s"),
        Answer {
            status: 302,
            body: "",
            fields: &[
                ("Location", Some("/grafana/login")),
                (
                    "Set-Cookie",
                    Some("redirect_to=%2Fgrafana%2Fd%2FrYdddlPWk%2Fnode-exporter-full%3ForgId%3D1%26refresh%3D30s; Path=/grafana; HttpOnly; SameSite=Lax"),
                ),
            ],
        },
    ),
    (
        get("/grafana/login"),
        Answer {
            status: 200,
            body: LOGIN_PAGE,
            fields: &[("Content-Type", Some("text/html; charset=UTF-8"))],
        },
    ),
    // The login form's POST: the session cookie on the sub-path.
    (
        Ask {
            method: "POST",
            path: "/grafana/login",
            headers: &[("Content-Type", "application/json")],
            body: r#"{"user":"admin","password":"wrong"}"#,
        },
        Answer {
            status: 401,
            body: "{\"message\":\"Invalid username or password\"}\n",
            fields: &[("Set-Cookie", None)],
        },
    ),
    (
        Ask {
            method: "POST",
            path: "/grafana/login",
            headers: &[("Content-Type", "application/json")],
            body: LOGIN_FORM,
        },
        Answer {
            status: 200,
            body: "{\"message\":\"Logged in\",\"redirectUrl\":\"/grafana/\"}\n",
            fields: &[
                JSON,
                (
                    "Set-Cookie",
                    Some("grafana_session=7c9e6679f4b8a3de; Path=/grafana; Max-Age=2592000; HttpOnly; SameSite=Lax"),
                ),
            ],
        },
    ),
    // With the session: the app's pages, a dashboard's deep link with its query.
    (get_logged_in("/grafana/"), answer(200, APP_PAGE)),
    (
        get_logged_in("/grafana/d/rYdddlPWk/node-exporter-full?orgId=1&refresh=30s"),
        answer(200, APP_PAGE),
    ),
    // Static assets, relative to the page's `<base href="/grafana/">`.
    (
        get("/grafana/public/build/app.js"),
        Answer {
            status: 200,
            body: APP_JS,
            fields: &[("Content-Type", Some("application/javascript"))],
        },
    ),
    (
        get("/grafana/public/img/grafana_icon.svg"),
        Answer {
            status: 200,
            body: ICON,
            fields: &[("Content-Type", Some("image/svg+xml"))],
        },
    ),
    // The API, with and without the session.
    (
        get("/grafana/api/health"),
        answer(200, "{\"database\":\"ok\",\"version\":\"stand-in\"}\n"),
    ),
    (
        get("/grafana/api/user"),
        answer(401, "{\"message\":\"Unauthorized\"}\n"),
    ),
    (
        get_logged_in("/grafana/api/user"),
        Answer {
            status: 200,
            body: "{\"login\":\"admin\",\"isGrafanaAdmin\":true}\n",
            fields: &[JSON],
        },
    ),
    // The data-source proxy: a Prometheus query with its escapes, and a Jaeger service whose
    // name holds a slash, sent as `%2F` inside one segment: the target reaches Grafana as the
    // browser sent it, and the Host as the client gave it.
    (
        get_logged_in(
            "/grafana/api/datasources/proxy/uid/P1809F7CD0C75ACF3/api/v1/query_range?query=rate%28node_cpu_seconds_total%5B5m%5D%29&start=1700000000&end=1700003600&step=60",
        ),
        answer(
            200,
            "{\"uid\":\"P1809F7CD0C75ACF3\",\"path\":\"/api/v1/query_range\",\
             \"query\":\"query=rate%28node_cpu_seconds_total%5B5m%5D%29&start=1700000000&end=1700003600&step=60\",\
             \"target\":\"/grafana/api/datasources/proxy/uid/P1809F7CD0C75ACF3/api/v1/query_range?query=rate%28node_cpu_seconds_total%5B5m%5D%29&start=1700000000&end=1700003600&step=60\",\
             \"host\":\"example.com\"}\n",
        ),
    ),
    (
        get_logged_in(
            "/grafana/api/datasources/proxy/uid/jaeger-1/api/services/frontend%2Fcheckout/operations",
        ),
        answer(
            200,
            "{\"uid\":\"jaeger-1\",\"path\":\"/api/services/frontend%2Fcheckout/operations\",\
             \"query\":\"\",\
             \"target\":\"/grafana/api/datasources/proxy/uid/jaeger-1/api/services/frontend%2Fcheckout/operations\",\
             \"host\":\"example.com\"}\n",
        ),
    ),
    (
        get("/grafana/api/datasources/proxy/uid/jaeger-1/api/services/frontend%2Fcheckout/operations"),
        answer(401, "{\"message\":\"Unauthorized\"}\n"),
    ),
    // Grafana Live's endpoint asked for without an upgrade.
    (
        get("/grafana/api/live/ws"),
        answer(
            400,
            "{\"message\":\"websocket: the client is not using the websocket protocol\"}\n",
        ),
    ),
];

/// Grafana Live through the proxy at `addr`: the handshake with the session cookie, a
/// message each way (the stand-in's echo names the Host it was given), and a Close exchange.
fn live_through(addr: SocketAddr, who: &str) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let key = "x3JJHMbDL1EzLkh9GBhXDw==";
    s.write_all(
        format!(
            "GET /grafana/api/live/ws HTTP/1.1\r\nHost: example.com\r\nConnection: Upgrade\r\n\
             Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\
             Origin: http://example.com\r\nCookie: {SESSION}\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut b).unwrap(),
            1,
            "{who}: the head ended early: {head:?}"
        );
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{who}: {head}");
    let accept = head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case("sec-websocket-accept")
            .then(|| v.trim().to_string())
    });
    assert_eq!(accept, Some(accept_for(key)), "{who}: {head}");
    let connect = br#"{"connect":{"name":"js"},"id":1}"#;
    s.write_all(&frame(TEXT, connect, Some([3, 1, 4, 1])))
        .unwrap();
    let mut want = b"host=example.com ".to_vec();
    want.extend_from_slice(connect);
    assert_eq!(read_frame(&mut s), Some((TEXT, want)), "{who}");
    s.write_all(&frame(CLOSE, &1000u16.to_be_bytes(), Some([5, 9, 2, 6])))
        .unwrap();
    assert_eq!(
        read_frame(&mut s),
        Some((CLOSE, 1000u16.to_be_bytes().to_vec())),
        "{who}"
    );
}

/// `/grafana` without its slash: a prefix location ending in `/` with `proxy_pass` answers
/// 301 to the folder in nginx, and so does a proxy route written `/grafana/` in tern (the
/// bodies differ: nginx's is HTML, tern's text).
fn bare_prefix_redirected(addr: SocketAddr, who: &str) {
    for (path, to) in [
        ("/grafana", "/grafana/"),
        ("/grafana?orgId=1", "/grafana/?orgId=1"),
    ] {
        let r = send(addr, &get(path));
        assert_eq!(r.status, 301, "{who}: {path}: {r:?}");
        let location = r.header("Location").unwrap_or_default();
        assert!(location.ends_with(to), "{who}: {path}: {location}");
    }
}

#[test]
fn grafana_under_a_sub_path_answers_alike_in_tern_and_nginx() {
    let tmp = tempfile::tempdir().unwrap();
    let www = www(tmp.path());
    let upstream = stand_in();

    let conf = tmp.path().join("tern.toml");
    std::fs::write(&conf, tern_toml(upstream, &www)).unwrap();
    let out = run_to_end(
        std::process::Command::new(TERN)
            .args(["run", "--check", "--config"])
            .arg(&conf),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let tern = Tern::start_run(&conf);
    check(tern.addr(), "tern", CASES);
    bare_prefix_redirected(tern.addr(), "tern");
    live_through(tern.addr(), "tern");
    drop(tern);

    let port = free_port();
    let nginx = nginx_conf(upstream, port, &www);
    if let Some(nginx) = Nginx::start(&tmp.path().join("nginx"), &nginx, port) {
        check(nginx.addr, "nginx", CASES);
        bare_prefix_redirected(nginx.addr, "nginx");
        live_through(nginx.addr, "nginx");
    }
}

#[test]
fn the_readme_grafana_caddyfile_is_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let www = www(tmp.path());
    let file = tmp.path().join("Caddyfile");
    std::fs::write(
        &file,
        readme_block(SECTION, "caddy").replace("/usr/share/nginx/www", www.to_str().unwrap()),
    )
    .unwrap();
    if let Some(Err(e)) = caddy_validate(&file, tmp.path()) {
        panic!("{e}");
    }
}
