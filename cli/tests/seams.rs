//! One view of a request (the seams an adversarial review found, issue 21 items 1, 2 and 5):
//! every spelling of a path reaches the route, the gate rule and the file its segments name,
//! the proxy forwards exactly that path, and what two components could read differently is
//! refused before anything acts on it. Over HTTP/1.1 and HTTP/2, against `tern run` with a
//! fixed `/admin` answer, a gated `/private` and a proxy or static root at `/`.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::{h2_support, support};
use support::*;

/// An upstream that records each request line and answers `200 upstream` (closing).
struct Recorder {
    addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
    hosts: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let hosts = Arc::new(Mutex::new(Vec::new()));
        let (seen, seen_hosts) = (lines.clone(), hosts.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some((n, v)) = h.split_once(':') {
                        if n.eq_ignore_ascii_case("host") {
                            seen_hosts.lock().unwrap().push(v.trim().to_string());
                        }
                    }
                }
                seen.lock().unwrap().push(line.trim_end().to_string());
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nupstream",
                );
            }
        });
        Recorder { addr, lines, hosts }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// A gate that refuses `/private` outright and lets everything else through.
const POLICY: &str = r#"
[[rule]]
name = "robots"
action = "allow"
path_prefix = "/robots.txt"

[[rule]]
name = "private"
action = "deny"
path_prefix = "/private"

[[rule]]
name = "no-backups"
action = "deny"
path_regex = "\\.bak$"
"#;

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    /// `root`: the `/` route's action (`proxy = [...]` or `static = "..."`).
    fn new(root: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site");
        std::fs::create_dir_all(site.join("admin")).unwrap();
        std::fs::create_dir_all(site.join("private")).unwrap();
        std::fs::write(site.join("admin/secret.txt"), "admin secret\n").unwrap();
        std::fs::write(site.join("private/secret.txt"), "private secret\n").unwrap();
        std::fs::write(site.join("public.txt"), "public\n").unwrap();
        std::fs::write(dir.path().join("policy.toml"), POLICY).unwrap();
        std::fs::write(
            dir.path().join("gate.toml"),
            "keyring = \"gate.keys\"\npolicy = \"policy.toml\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("tern.toml"),
            format!(
                "gate = \"gate.toml\"\n\n[[site]]\nname = \"app\"\ndefault = true\n\n\
                 [[site.route]]\npath = \"/\"\n{root}\ngate = true\n\n\
                 [[site.route]]\npath = \"/admin\"\nrespond = \"admin is closed\\n\"\nstatus = 403\n\n\
                 [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n\n\
                 [[site.route]]\npath = \"/a+b\"\nrespond = \"plus is closed\\n\"\nstatus = 403\n"
            ),
        )
        .unwrap();
        Setup { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn start(&self) -> Tern {
        let tern = Tern::start_run(&self.path("tern.toml"));
        assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
        tern
    }
}

/// Spellings of `/admin/secret.txt` that must reach the `/admin` route (403).
const ADMIN_SPELLINGS: &[&str] = &[
    "/%61dmin/secret.txt",
    "/%61%64%6D%69%6E/secret.txt",
    "//admin/secret.txt",
    "/./admin/secret.txt",
    "/x/../admin/secret.txt",
    "/x/%2e%2e/admin/secret.txt",
    "/admin/./secret.txt",
    "http://app/x/../admin/secret.txt",
];

/// Spellings of gated paths that must meet the gate's rule for `/private` (403).
const PRIVATE_SPELLINGS: &[&str] = &[
    "/%70rivate/secret.txt",
    "//private/secret.txt",
    "/public/../private/secret.txt",
    "/robots.txt/../private/secret.txt",
    "/robots.txt.bak",
];

/// Paths two readers could split differently: refused with 400 before any route acts.
const AMBIGUOUS: &[&str] = &[
    "/admin%2Fsecret.txt",
    "/x%2F..%2Fadmin/secret.txt",
    "/.well-known/..%2Fprivate/secret.txt",
    "/robots.txt%2F..%2Fprivate/secret.txt",
    "/%2e%2e/admin/secret.txt",
    "/../private/secret.txt",
    "/admin%00.txt",
    "/admin%5Csecret.txt",
    "/admin\\secret.txt",
    "/admin;x/secret.txt",
    "/..;/admin/secret.txt",
    "/%2561dmin/secret.txt",
    "/admin%0d%0aX-Injected:%201",
];

fn check_http1(tern: &Tern, reached: impl Fn(&str) -> bool) {
    for path in ADMIN_SPELLINGS {
        let r = tern.get(path);
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert_eq!(r.text(), "admin is closed\n", "{path}");
    }
    for path in PRIVATE_SPELLINGS {
        let r = tern.get(path);
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(!r.text().contains("secret"), "{path}");
        assert!(!reached(path), "{path} reached the upstream");
    }
    for path in AMBIGUOUS {
        let mut c = tern.client();
        c.send(format!("GET {path} HTTP/1.1\r\nHost: app\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.text(), "path cannot be normalised safely\n", "{path}");
    }
    assert!(
        tern.statusz("bad_requests{cause=\"bad_path\"}") >= AMBIGUOUS.len() as u64,
        "refusals are counted: {}",
        tern.stderr_text()
    );
}

#[test]
fn the_proxy_forwards_the_path_every_decision_was_made_on() {
    let up = Recorder::start();
    let setup = Setup::new(&format!("proxy = [\"{}\"]", up.addr));
    let tern = setup.start();
    check_http1(&tern, |_| !up.lines().is_empty());
    assert!(
        up.lines().is_empty(),
        "nothing refused reached the upstream: {:?}",
        up.lines()
    );
    // What is allowed is forwarded in canonical form: the upstream reads the same segments,
    // whether it decodes escapes or not.
    for (path, line) in [
        ("/public/%7Euser/../b?q=%2F", "GET /public/b?q=%2F HTTP/1.1"),
        ("/a%20b/%e2%82%ac", "GET /a%20b/%E2%82%AC HTTP/1.1"),
        ("//robots.txt", "GET /robots.txt HTTP/1.1"),
        ("/%3Bx", "GET /%3Bx HTTP/1.1"),
    ] {
        let r = tern.get(path);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(up.lines().last().map(String::as_str), Some(line), "{path}");
    }
}

#[test]
fn static_files_open_the_file_the_route_and_gate_judged() {
    let setup = Setup::new("static = \"site\"");
    let tern = setup.start();
    check_http1(&tern, |_| false);
    assert_eq!(tern.get("/public.txt").text(), "public\n");
    assert_eq!(tern.get("/%70ublic.txt").text(), "public\n");
}

/// An HTTP/2 client that sends header blocks exactly as given (nothing validated on this
/// side) and reads the `:status` of each answer.
struct H2Probe {
    raw: h2_support::RawH2,
    hpack: tern_http2::hpack::Decoder,
    next_stream: u32,
}

impl H2Probe {
    fn connect(addr: SocketAddr) -> H2Probe {
        H2Probe {
            raw: h2_support::RawH2::connect(addr, &[]),
            hpack: tern_http2::hpack::Decoder::new(4096),
            next_stream: 1,
        }
    }

    /// The status answered to a request of exactly `fields`; `None` when the stream was reset.
    fn status(&mut self, fields: &[(&str, &str)]) -> Option<u16> {
        use h2_support::{END_HEADERS, END_STREAM, GOAWAY, HEADERS, RST_STREAM};
        let id = self.next_stream;
        self.next_stream += 2;
        self.raw.frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &h2_support::header_block(fields),
        );
        let f = self.raw.until("an answer", |f| {
            f.ty == GOAWAY || (f.stream == id && (f.ty == HEADERS || f.ty == RST_STREAM))
        });
        assert_ne!(f.ty, GOAWAY, "{fields:?}: the connection was closed");
        if f.ty == RST_STREAM {
            return None;
        }
        let mut status = None;
        self.hpack
            .decode(&f.payload, 1 << 16, |name, value| {
                if name == b":status" {
                    status = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                }
                Ok(())
            })
            .unwrap();
        status
    }

    fn get(&mut self, path: &str) -> Option<u16> {
        self.status(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "app"),
            (":path", path),
        ])
    }
}

#[test]
fn http2_requests_meet_the_same_view() {
    let up = Recorder::start();
    let setup = Setup::new(&format!("proxy = [\"{}\"]", up.addr));
    let tern = setup.start();
    let mut h2 = H2Probe::connect(tern.addr());
    for path in ADMIN_SPELLINGS.iter().filter(|p| p.starts_with('/')) {
        assert_eq!(h2.get(path), Some(403), "{path}");
    }
    for path in PRIVATE_SPELLINGS {
        assert_eq!(h2.get(path), Some(403), "{path}");
    }
    for path in AMBIGUOUS {
        assert_eq!(h2.get(path), Some(400), "{path}");
    }
    assert!(up.lines().is_empty(), "{:?}", up.lines());
    assert_eq!(h2.get("/x/../public.txt"), Some(200));
    assert_eq!(
        up.lines().last().map(String::as_str),
        Some("GET /public.txt HTTP/1.1")
    );
}

/// The proxy never relays a request line its upstream could read as another (HTTP/2 lets a
/// client put anything in `:method`), a Host that names another site than `:authority`, or a
/// field with control bytes (issue 21 item 5).
#[test]
fn http2_fields_that_would_rewrite_the_upstream_request_are_refused() {
    let up = Recorder::start();
    let setup = Setup::new(&format!("proxy = [\"{}\"]", up.addr));
    let tern = setup.start();
    let mut h2 = H2Probe::connect(tern.addr());
    let refused = |s: Option<u16>| s.is_none() || s == Some(400);
    for method in [
        "GET /private/secret.txt HTTP/1.1",
        "GET /private?",
        "G\tET",
        "",
        "GET\x7f",
    ] {
        let s = h2.status(&[
            (":method", method),
            (":scheme", "http"),
            (":authority", "app"),
            (":path", "/public.txt"),
        ]);
        assert!(refused(s), "{method:?}: {s:?}");
    }
    let base = [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "app"),
        (":path", "/public.txt"),
    ];
    for extra in [
        ("host", "admin.internal"),
        ("x-value", "a\u{1}b"),
        ("x-value", "a\u{7f}b"),
        ("x-value", "a\u{1f}"),
    ] {
        let mut fields = base.to_vec();
        fields.push(extra);
        let s = h2.status(&fields);
        assert!(refused(s), "{extra:?}: {s:?}");
    }
    let mut scheme = base.to_vec();
    scheme[1] = (":scheme", "ht tp");
    assert!(refused(h2.status(&scheme)), "a :scheme that is not one");
    assert!(up.lines().is_empty(), "{:?}", up.lines());
    // The same request, well formed, does reach it.
    assert_eq!(h2.status(&base), Some(200));
    assert_eq!(up.lines().len(), 1);
}

#[test]
fn an_upstream_status_outside_100_to_599_is_a_502() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ =
                s.write_all(b"HTTP/1.1 700 Odd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    let setup = Setup::new(&format!("proxy = [\"{addr}\"]"));
    let tern = setup.start();
    assert_eq!(tern.get("/public.txt").status, 502);
    let _ = TcpStream::connect(addr);
}

/// The second adversarial pass: a lower-case method (`post`, which apps run as POST while
/// tern would have judged an unknown method), a route's name spelled with escapes, CONNECT
/// with a path and TRACE, and a Host spelled differently from the site it chose.
#[test]
fn methods_route_names_and_hosts_mean_one_thing() {
    let up = Recorder::start();
    let setup = Setup::new(&format!("proxy = [\"{}\"]", up.addr));
    let tern = setup.start();
    for raw in [
        "post /public.txt HTTP/1.1\r\nHost: app\r\nContent-Length: 0\r\n\r\n",
        "Get /public.txt HTTP/1.1\r\nHost: app\r\n\r\n",
        "CONNECT /public.txt HTTP/1.1\r\nHost: app\r\n\r\n",
    ] {
        let mut c = tern.client();
        c.send(raw.as_bytes());
        assert_eq!(c.read_response(false).status, 400, "{raw:?}");
    }
    assert_eq!(tern.get_with("/public.txt", &[]).status, 200);
    let mut c = tern.client();
    c.send(b"TRACE /public.txt HTTP/1.1\r\nHost: app\r\n\r\n");
    assert_eq!(c.read_response(false).status, 405, "TRACE is not relayed");
    let mut h2 = H2Probe::connect(tern.addr());
    let s = h2.status(&[
        (":method", "post"),
        (":scheme", "http"),
        (":authority", "app"),
        (":path", "/public.txt"),
    ]);
    assert!(s.is_none() || s == Some(400), "{s:?}");
    for path in ["/a+b", "/a%2Bb", "/a%2bb/x"] {
        let r = tern.get(path);
        assert_eq!(
            (r.status, r.text().as_str()),
            (403, "plus is closed\n"),
            "{path}"
        );
    }
    assert_eq!(up.lines(), ["GET /public.txt HTTP/1.1"]);
    let mut c = tern.client();
    c.send(b"GET /public.txt HTTP/1.1\r\nHost: APP.:80\r\n\r\n");
    assert_eq!(c.read_response(false).status, 200);
    assert_eq!(
        up.hosts.lock().unwrap().last().map(String::as_str),
        Some("app:80"),
        "the upstream gets the name the site was chosen by"
    );
    let mut c = tern.client();
    c.send(b"GET /public.txt HTTP/1.1\r\nHost: app:99999999999999999999\r\n\r\n");
    assert_eq!(c.read_response(false).status, 400, "a port out of range");
}
