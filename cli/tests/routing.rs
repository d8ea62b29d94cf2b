//! `tern run`'s routing (issue 27): an SPA with a `try_files` fallback and an API proxied
//! under `/api` with its prefix stripped, compressed (tern's `compress = ["gzip"]`, nginx's
//! `gzip on`), run in tern and in Debian's nginx on the same files and the same fake app,
//! answering the same requests the same way (and differing where by design); the path the app gets is
//! the one every decision was made on (seams); rewrites, matchers, body limits, error pages,
//! request ids in the access log, and `--check` naming the lines of misused keys.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support;
use support::*;

/// A fake app: answers `app <path> id=<X-Request-Id> real=<X-Real-IP> body=<n>` and
/// [`filler`] to every request (closing), and records each request line.
struct App {
    addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl App {
    fn start() -> App {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let seen = seen.clone();
                std::thread::spawn(move || answer(stream, &seen));
            }
        });
        App { addr, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

fn answer(mut stream: TcpStream, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let (mut id, mut real, mut length, mut chunked) = (String::new(), String::new(), 0, false);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        let Some((n, v)) = h.split_once(':') else {
            continue;
        };
        let v = v.trim().to_string();
        match n.to_ascii_lowercase().as_str() {
            "x-request-id" => id = v,
            "x-real-ip" => real = v,
            "content-length" => length = v.parse().unwrap_or(0),
            "transfer-encoding" => chunked = true,
            _ => {}
        }
    }
    let mut body = 0;
    if chunked {
        loop {
            let mut size = String::new();
            if reader.read_line(&mut size).unwrap_or(0) == 0 {
                return;
            }
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            if reader.read_exact(&mut chunk).is_err() {
                return;
            }
            body += n;
            if n == 0 {
                break;
            }
        }
    } else {
        let mut buf = vec![0; length];
        if reader.read_exact(&mut buf).is_err() {
            return;
        }
        body = length;
    }
    let path = line.split(' ').nth(1).unwrap_or("").to_string();
    seen.lock().unwrap().push(line.trim_end().to_string());
    let id_kind = if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        "hex32".to_string()
    } else {
        id
    };
    let text = format!(
        "app {path} id={id_kind} real={real} body={body}\n{}",
        filler("app")
    );
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// Lines that make an answer worth compressing: about 1 KiB, over both servers'
/// minimum ([`MIN_SIZE`]).
fn filler(tag: &str) -> String {
    (0..40).map(|i| format!("// {tag} line {i}\n")).collect()
}

/// The smallest answer either server compresses (`compress_min_size`, `gzip_min_length`).
const MIN_SIZE: usize = 256;

/// The SPA's files, each [`filler`]ed past [`MIN_SIZE`] but `tiny.js`.
fn dist(dir: &Path) -> PathBuf {
    let d = dir.join("dist");
    std::fs::create_dir_all(d.join("about")).unwrap();
    std::fs::create_dir_all(d.join("assets")).unwrap();
    for (file, text) in FILES {
        std::fs::write(d.join(file), file_body(text)).unwrap();
    }
    std::fs::write(d.join("assets/tiny.js"), TINY).unwrap();
    d
}

const FILES: [(&str, &str); 3] = [
    ("index.html", INDEX),
    ("about/index.html", ABOUT),
    ("assets/app.js", APP_JS),
];
const INDEX: &str = "<div id=app></div>\n";
const ABOUT: &str = "<h1>about</h1>\n";
const APP_JS: &str = "console.log(1)\n";
const TINY: &str = "console.log(2)\n";

/// A file's whole text: its first line, then [`filler`].
fn file_body(first: &str) -> String {
    format!("{first}{}", filler(first.trim_end()))
}

fn tern_config(dist: &Path, app: SocketAddr) -> String {
    format!(
        r#"
[[site]]
name = "spa"
default = true
request_id = true
compress = ["gzip"]
compress_min_size = {MIN_SIZE}
compress_types = {TYPES:?}

[[site.route]]
path = "/"
static = "{dist}"
try_files = ["$uri", "$uri/index.html", "/index.html"]

[[site.route]]
path = "/api"
proxy = "{app}"
strip_prefix = true
add_request_headers = {{ "X-Real-IP" = "$client" }}
"#,
        dist = dist.display()
    )
}

/// The types both servers compress (nginx compresses text/html whatever `gzip_types` says).
const TYPES: [&str; 4] = [
    "text/html",
    "text/plain",
    "application/javascript",
    "text/javascript",
];

fn nginx_config(dist: &Path, app: SocketAddr, port: u16) -> String {
    format!(
        r#"
gzip on;
gzip_types {types};
gzip_vary on;
gzip_min_length {MIN_SIZE};
server {{
    listen 127.0.0.1:{port};
    root {dist};
    location / {{
        try_files $uri $uri/index.html /index.html;
    }}
    location /api/ {{
        proxy_pass http://{app}/;
        proxy_set_header X-Real-IP $remote_addr;
        proxy_set_header X-Request-Id $request_id;
    }}
}}
"#,
        dist = dist.display(),
        types = TYPES.join(" ")
    )
}

/// Where an answer comes from, for the differences by design.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    /// A file (tern: its cached gzip variant, sized; nginx: gzipped as it is sent, chunked).
    File,
    /// The app (both: compressed as it streams, chunked).
    App,
}

/// Requests both servers get: (path, where the answer comes from, body); all 200.
fn same() -> Vec<(&'static str, From, String)> {
    let app = |line: &str| {
        format!(
            "app {line} id=hex32 real=127.0.0.1 body=0\n{}",
            filler("app")
        )
    };
    vec![
        ("/", From::File, file_body(INDEX)),
        ("/assets/app.js", From::File, file_body(APP_JS)),
        ("/deep/link/page", From::File, file_body(INDEX)),
        ("/about/", From::File, file_body(ABOUT)),
        ("/about", From::File, file_body(ABOUT)),
        ("/index.html", From::File, file_body(INDEX)),
        ("/api/users/1?x=1", From::App, app("/users/1?x=1")),
        ("/api/", From::App, app("/")),
        ("//api//users/./2", From::App, app("/users/2")),
        ("/api/a%20b", From::App, app("/a%20b")),
        ("/api/x/../y", From::App, app("/y")),
        // Climbing out of /api lands on the SPA, in both: the route was chosen on the
        // normalised path, not on the spelling.
        ("/api/%2e%2e/secret", From::File, file_body(INDEX)),
        ("/api/../assets/app.js", From::File, file_body(APP_JS)),
    ]
}

fn fetch(addr: SocketAddr, method: &str, path: &str, accept: Option<&str>) -> Resp {
    let mut c = Client::connect(addr);
    c.chunked_ok = true;
    let ae = accept.map_or(String::new(), |a| format!("Accept-Encoding: {a}\r\n"));
    c.send(
        format!("{method} {path} HTTP/1.1\r\nHost: spa.test\r\n{ae}Connection: close\r\n\r\n")
            .as_bytes(),
    );
    c.read_response(method == "HEAD")
}

/// What a server answered a request with `Accept-Encoding: gzip`, as far as the two must
/// agree: status, the decoded body, Content-Encoding and Vary.
#[derive(Debug, PartialEq, Eq)]
struct Compressed {
    status: u16,
    body: String,
    content_encoding: Option<String>,
    vary: Option<String>,
}

/// Asks every [`same`] request without and with `Accept-Encoding: gzip`; checks the
/// identity answers and the framing each server gives the compressed ones by design, and
/// returns what the two servers must agree on.
fn check_same(addr: SocketAddr, who: &str) -> Vec<Compressed> {
    let mut seen = Vec::new();
    for (path, from, body) in same() {
        let r = fetch(addr, "GET", path, None);
        assert_eq!((r.status, r.text()), (200, body.clone()), "{who}: {path}");
        assert_eq!(r.header("content-encoding"), None, "{who}: {path}");

        let r = fetch(addr, "GET", path, Some("gzip"));
        let decoded = match r.header("content-encoding") {
            Some("gzip") => String::from_utf8(gunzip(&r.body)).unwrap(),
            _ => r.text(),
        };
        // Different by design: tern sends a file's gzip variant from its cache, with its
        // length; nginx (without gzip_static) compresses the file as it sends it, chunked.
        // Both stream the app's answer through the encoder, chunked.
        let sized = match (who, from) {
            ("tern", From::File) => Some(r.body.len() as u64),
            _ => None,
        };
        assert_eq!(r.content_length(), sized, "{who}: {path}");
        seen.push(Compressed {
            status: r.status,
            body: decoded,
            content_encoding: r.header("content-encoding").map(str::to_owned),
            vary: r.header("vary").map(str::to_owned),
        });
    }
    // Under the minimum: as it is, in both; nginx adds no Vary to what it never compresses.
    let r = fetch(addr, "GET", "/assets/tiny.js", Some("gzip"));
    assert_eq!(r.text(), TINY, "{who}");
    assert_eq!(r.header("content-encoding"), None, "{who}");
    seen.push(Compressed {
        status: r.status,
        body: r.text(),
        content_encoding: None,
        vary: r.header("vary").map(str::to_owned),
    });
    seen
}

#[test]
fn an_spa_and_a_stripped_api_answer_as_in_nginx() {
    let tmp = tempfile::tempdir().unwrap();
    let dist = dist(tmp.path());
    let app = App::start();
    let conf = tmp.path().join("tern.toml");
    std::fs::write(&conf, tern_config(&dist, app.addr)).unwrap();
    let tern = Tern::start_run(&conf);
    let in_tern = check_same(tern.addr(), "tern");
    let tern_head = head_answers(tern.addr(), "tern");
    drop(tern);

    let port = free_port();
    let http = nginx_config(&dist, app.addr, port);
    let Some(nginx) = Nginx::start(&tmp.path().join("nginx"), &http, port) else {
        return;
    };
    let in_nginx = check_same(nginx.addr, "nginx");
    for (i, (t, n)) in in_tern.iter().zip(&in_nginx).enumerate() {
        assert_eq!(t, n, "request {i}: tern, then nginx");
    }
    assert!(
        in_tern
            .iter()
            .filter(|c| c.content_encoding.as_deref() == Some("gzip"))
            .count()
            == same().len(),
        "every answer but tiny.js compressed: {in_tern:?}"
    );

    // HEAD: in both, the fields the GET gets (nginx's gzip filter takes HEAD answers too),
    // so the same Content-Encoding and Vary; only a file's length differs, as for GET.
    let nginx_head = head_answers(nginx.addr, "nginx");
    assert_eq!(tern_head, nginx_head);
}

/// HEAD with `Accept-Encoding: gzip` of a file and of the app's answer, checked against the
/// GET's fields (Content-Length too); returns their Content-Encoding and Vary.
fn head_answers(addr: SocketAddr, who: &str) -> Vec<(Option<String>, Option<String>)> {
    ["/", "/api/users/1"]
        .iter()
        .map(|path| {
            let fields = |r: &Resp| {
                (
                    r.header("content-encoding").map(str::to_owned),
                    r.content_length(),
                    r.header("vary").map(str::to_owned),
                )
            };
            let head = fetch(addr, "HEAD", path, Some("gzip"));
            let get = fetch(addr, "GET", path, Some("gzip"));
            assert_eq!(
                (head.status, fields(&head)),
                (200, fields(&get)),
                "{who}: {path}"
            );
            assert_eq!(
                head.header("content-encoding"),
                Some("gzip"),
                "{who}: {path}"
            );
            let (coding, _, vary) = fields(&head);
            (coding, vary)
        })
        .collect()
}

/// A site with every routing key, started for the tests below.
struct Full {
    _tmp: tempfile::TempDir,
    tern: Tern,
    app: App,
    log: PathBuf,
}

fn full() -> Full {
    let tmp = tempfile::tempdir().unwrap();
    let dist = dist(tmp.path());
    std::fs::write(tmp.path().join("404.html"), "<h1>nothing here</h1>\n").unwrap();
    std::fs::write(tmp.path().join("502.html"), "<h1>the app is down</h1>\n").unwrap();
    let dead = free_port();
    let app = App::start();
    let log = tmp.path().join("access.log");
    let conf = tmp.path().join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            r#"
access_log = "access.log"

[[site]]
name = "spa"
default = true
request_id = true
error_pages = {{ 404 = "404.html", 502 = "502.html" }}

[[site.route]]
path = "/"
static = "{dist}"
try_files = ["$uri", "=404"]
add_headers = {{ "X-Request-Id" = "$request_id" }}

[[site.route]]
path = "/api"
methods = ["DELETE"]
respond = "deletes are off\n"
status = 403

[[site.route]]
path = "/api"
proxy = "{app}"
strip_prefix = true
max_body = 100

[[site.route]]
path = "/v1"
path_regex = "^/v1/users/([0-9]+)$"
rewrite = "/api/people/$1"

[[site.route]]
path = "/v1"
match_query = {{ "format" = "json" }}
respond = "json please\n"

[[site.route]]
path = "/down"
proxy = "127.0.0.1:{dead}"
"#,
            dist = dist.display(),
            app = app.addr
        ),
    )
    .unwrap();
    let tern = Tern::start_run(&conf);
    Full {
        _tmp: tmp,
        tern,
        app,
        log,
    }
}

#[test]
fn stripped_and_rewritten_paths_are_the_paths_every_decision_saw() {
    let f = full();
    // Refused before any route acts: nothing reaches the app.
    for path in [
        "/api/a%2Fb",
        "/api%2F..%2Fsecret",
        "/api/%2e%2e/%2e%2e/etc/passwd",
        "/api/..%5C..%5Cx",
        "/api/x;y",
        "/api/%2561",
        "/v1/users/%2e%2e%2F1",
    ] {
        let mut c = f.tern.client();
        c.send(format!("GET {path} HTTP/1.1\r\nHost: spa.test\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    assert!(f.app.lines().is_empty(), "{:?}", f.app.lines());
    // What reaches the app is the canonical path without the prefix, and only from /api.
    for (path, line) in [
        ("/api", "GET / HTTP/1.1"),
        ("/%61pi/x", "GET /x HTTP/1.1"),
        ("/api/./x//y/", "GET /x/y/ HTTP/1.1"),
        ("/api/caf%c3%a9?q=%2F", "GET /caf%C3%A9?q=%2F HTTP/1.1"),
        ("/v1/users/42?x=1", "GET /people/42?x=1 HTTP/1.1"),
        ("/v1/users/%34%32", "GET /people/42 HTTP/1.1"),
    ] {
        let r = f.tern.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(
            f.app.lines().last().map(String::as_str),
            Some(line),
            "{path}"
        );
    }
    // Not under /api (a longer name, a climb out of it): the static route, its 404 page.
    for path in ["/apix", "/api/../nothing", "/v1/users/x"] {
        let r = f.tern.get(path);
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.text(), "<h1>nothing here</h1>\n", "{path}");
        assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    }
    assert_eq!(f.app.lines().len(), 6, "{:?}", f.app.lines());
}

#[test]
fn matchers_limits_and_request_ids_work_end_to_end() {
    let f = full();
    let mut c = f.tern.client();
    let r = c.request("DELETE", "/api/x", &[]);
    assert_eq!((r.status, r.text().as_str()), (403, "deletes are off\n"));
    assert_eq!(f.tern.get("/v1/x?format=json").text(), "json please\n");
    // A body over the route's limit: declared, or chunked and cut off by the relay.
    let mut c = f.tern.client();
    c.send(b"POST /api/up HTTP/1.1\r\nHost: spa.test\r\nContent-Length: 101\r\n\r\n");
    assert_eq!(c.read_response(false).status, 413);
    let mut c = f.tern.client();
    let chunk = "x".repeat(80);
    c.send(format!("POST /api/up HTTP/1.1\r\nHost: spa.test\r\nTransfer-Encoding: chunked\r\n\r\n50\r\n{chunk}\r\n50\r\n{chunk}\r\n0\r\n\r\n").as_bytes());
    assert_eq!(c.read_response(false).status, 413);
    let mut c = f.tern.client();
    c.send(b"POST /api/up HTTP/1.1\r\nHost: spa.test\r\nContent-Length: 100\r\n\r\n");
    c.send(&[b'y'; 100]);
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert!(r.text().contains("body=100"), "{}", r.text());
    // Request ids: one per request, to the app and in the log, the client's own replaced.
    let r = f.tern.get_with("/index.html", &[("X-Request-Id", "mine")]);
    let id = r.header("x-request-id").unwrap().to_string();
    assert_eq!(id.len(), 32, "{id}");
    assert!(
        eventually(Duration::from_secs(5), || {
            std::fs::read_to_string(&f.log)
                .is_ok_and(|t| t.lines().any(|l| l.ends_with(&format!(" {id}"))))
        }),
        "{:?}",
        std::fs::read_to_string(&f.log)
    );
    let r = f.tern.get_with("/api/who", &[("X-Request-Id", "mine")]);
    assert!(r.text().contains("id=hex32"), "{}", r.text());
}

#[test]
fn check_names_the_lines_of_misused_routing_keys() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("site")).unwrap();
    let conf = tmp.path().join("tern.toml");
    std::fs::write(
        &conf,
        "[[site]]\nname = \"a\"\ndefault = true\n\
         [[site.route]]\npath = \"/\"\nstatic = \"site\"\ntry_files = [\"$uri\", \"$uri\"]\n\
         [[site.route]]\npath = \"/p\"\nproxy = \"127.0.0.1:9\"\npath_regex = \"(a+)+\"\n\
         add_request_headers = { \"X-Who\" = \"$user\" }\n",
    )
    .unwrap();
    let out = Command::new(TERN)
        .arg("run")
        .arg("--check")
        .arg("--config")
        .arg(&conf)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "line 7: try_files fallback \"$uri\" routes the request to itself",
        "line 11: path_regex \"(a+)+\" must be anchored",
        "line 12: add_request_headers: X-Who: \"$user\": unknown variable $user",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
}

/// The fenced block of `lang` in the README's SPA section.
fn readme_block(lang: &str) -> String {
    support::readme_block(
        "### An SPA with an API under `/api`, in tern, nginx and Caddy",
        lang,
    )
}

#[test]
fn the_readme_spa_config_checks_and_its_caddyfile_is_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let dist = dist(tmp.path());
    let conf = tmp.path().join("tern.toml");
    let tern = readme_block("toml").replace("/srv/spa/dist", dist.to_str().unwrap());
    std::fs::write(&conf, tern).unwrap();
    let out = Command::new(TERN)
        .args(["run", "--check", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = tmp.path().join("Caddyfile");
    std::fs::write(
        &file,
        readme_block("caddy").replace("/srv/spa/dist", dist.to_str().unwrap()),
    )
    .unwrap();
    if let Some(Err(e)) = caddy_validate(&file, tmp.path()) {
        panic!("{e}");
    }
}

/// The gate judges the path the client asked for, as the route did: with the prefix
/// stripped for the app, a rule on `/api/private` covers `/api/private/...` in every
/// spelling, nothing it refused reaches the app, and a rule written in the app's own paths
/// (`/private`) does not reach through the prefix.
#[test]
fn the_gate_judges_the_path_the_client_asked_for_not_the_stripped_one() {
    let tmp = tempfile::tempdir().unwrap();
    let app = App::start();
    std::fs::write(
        tmp.path().join("policy.toml"),
        "[[rule]]\nname = \"private\"\naction = \"deny\"\npath_prefix = \"/api/private\"\n\
         [[rule]]\nname = \"app-space\"\naction = \"deny\"\npath_prefix = \"/internal\"\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("gate.toml"),
        "keyring = \"gate.keys\"\npolicy = \"policy.toml\"\n",
    )
    .unwrap();
    let conf = tmp.path().join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            "gate = \"gate.toml\"\n[[site]]\nname = \"a\"\ndefault = true\n\
             [[site.route]]\npath = \"/api\"\nproxy = \"{}\"\nstrip_prefix = true\ngate = true\n",
            app.addr
        ),
    )
    .unwrap();
    let tern = Tern::start_run(&conf);
    for path in [
        "/api/private/x",
        "/api/%70rivate/x",
        "//api//private",
        "/api/public/../private/x",
        "/api/./private",
    ] {
        let r = tern.get(path);
        assert_eq!(r.status, 403, "{path}: {}", r.text());
    }
    assert!(app.lines().is_empty(), "{:?}", app.lines());
    let r = tern.get("/api/public");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = tern.get("/api/internal");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        app.lines(),
        ["GET /public HTTP/1.1", "GET /internal HTTP/1.1"]
    );
}

#[test]
fn the_relay_s_own_502_gets_the_site_s_error_page() {
    let f = full();
    let r = f.tern.get("/down/x");
    assert_eq!(r.status, 502);
    assert_eq!(r.text(), "<h1>the app is down</h1>\n");
    assert!(
        r.has("content-type", "text/html; charset=utf-8"),
        "{:?}",
        r.headers
    );
}

/// `allow_encoded_slash` (issue 41 item 4): a proxy route takes `%2F` as one character of its
/// segment (Grafana's data-source proxy, GitLab's `projects/group%2Fname`), chosen, judged and
/// forwarded on that one value; every other route, and a segment no route takes, answer 400
/// as before; `--check` refuses the key where a narrower route could read the decoded slash.
#[test]
fn an_encoded_slash_is_forwarded_only_by_a_route_that_takes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dist = dist(tmp.path());
    let app = App::start();
    let conf = tmp.path().join("tern.toml");
    let routes = format!(
        r#"
[[site]]
name = "s"
default = true

[[site.route]]
path = "/"
static = "{dist}"

[[site.route]]
path = "/api/datasources/proxy"
proxy = "{app}"
allow_encoded_slash = true

[[site.route]]
path = "/api"
proxy = "{app}"

[[site.route]]
path = "/gitlab"
proxy = "{app}"
strip_prefix = true
allow_encoded_slash = true
"#,
        dist = dist.display(),
        app = app.addr
    );
    std::fs::write(&conf, &routes).unwrap();
    let tern = Tern::start_run(&conf);
    for (path, line) in [
        (
            "/api/datasources/proxy/3/a%2fb/c?x=%2F",
            "GET /api/datasources/proxy/3/a%2Fb/c?x=%2F HTTP/1.1",
        ),
        // Never a separator, so never part of a dot segment: sent as it came.
        (
            "/api/datasources/proxy/..%2F..%2Fadmin",
            "GET /api/datasources/proxy/..%2F..%2Fadmin HTTP/1.1",
        ),
        (
            "/gitlab/projects/group%2Fname/%61",
            "GET /projects/group%2Fname/a HTTP/1.1",
        ),
    ] {
        let r = tern.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(app.lines().last().map(String::as_str), Some(line), "{path}");
    }
    let forwarded = app.lines().len();
    for path in [
        "/api/users/a%2Fb",
        "/api%2Fdatasources%2Fproxy/x",
        "/index.html%2F..%2Fsecret",
        "/api/datasources/proxy/a%5Cb",
        "/gitlab%2Fprojects/x",
    ] {
        let mut c = tern.client();
        c.send(format!("GET {path} HTTP/1.1\r\nHost: s.test\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    assert_eq!(app.lines().len(), forwarded, "{:?}", app.lines());

    // A narrower route beneath it, a path pattern on its prefix, or a gate: refused.
    std::fs::write(
        &conf,
        format!(
            "{routes}\n[[site.route]]\npath = \"/gitlab/admin\"\nrespond = \"no\"\nstatus = 403\n\
             \n[[site.route]]\npath = \"/api/datasources/proxy\"\nproxy = \"{app}\"\n\
             path_regex = \"^/api/datasources/proxy/[0-9]+$\"\n",
            app = app.addr
        ),
    )
    .unwrap();
    let out = Command::new(TERN)
        .args(["run", "--check", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "line 13: allow_encoded_slash: a path pattern on route \"/api/datasources/proxy\" (line 31)",
        "line 23: allow_encoded_slash: route \"/gitlab/admin\" (line 26) lies beneath this one",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    std::fs::write(
        &conf,
        "[[site]]\nname = \"s\"\ndefault = true\n[[site.route]]\npath = \"/\"\n\
         static = \".\"\nallow_encoded_slash = true\n",
    )
    .unwrap();
    let out = Command::new(TERN)
        .args(["run", "--check", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 7: `allow_encoded_slash` does not apply to a static route"),
        "{err}"
    );
}
