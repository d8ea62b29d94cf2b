//! Apps that hand a request back to the server (issue 41, item 6): a PHP app on Debian's
//! PHP-FPM sends `X-Accel-Redirect` to an internal static route (a protected download) and to
//! an internal proxy route (an API behind it), and a 404 of its own is answered by a page of
//! the site (`reroute_status`, nginx's `fastcgi_intercept_errors` with `error_page 404 =`).
//! tern and nginx run side by side with the equivalent configurations (nginx's from its
//! documentation of `X-Accel-Redirect` and `internal`), and every request gets the same answer
//! from both, over HTTP/1.1 and HTTP/2 (curl with prior knowledge): the same status, body and
//! fields a download depends on, never an `X-Accel-*` field, and 404 for a client that asks
//! an internal route itself.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{php_support, support};
use php_support::PhpFpm;
use support::*;

/// The PHP app and the files: `www/` (its scripts, and `fallback.html`), `files/protected/`
/// (what only the app may hand out).
fn app_files(dir: &Path) -> (PathBuf, PathBuf) {
    let www = dir.join("www");
    let files = dir.join("files");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(files.join("protected")).unwrap();
    std::fs::write(files.join("protected/report.txt"), "quarterly report\n").unwrap();
    std::fs::write(www.join("fallback.html"), "<p>fallback page</p>\n").unwrap();
    let put = |name: &str, text: &str| std::fs::write(www.join(name), text).unwrap();
    // A download the app authorises and the server sends: the app's body never reaches the
    // client, its Content-Type, Content-Disposition, Cache-Control and cookie do.
    put(
        "download.php",
        "<?php $f = basename($_GET['f'] ?? 'report.txt');\n\
         header('X-Accel-Redirect: /protected/' . $f);\n\
         header('Content-Type: application/octet-stream');\n\
         header('Content-Disposition: attachment; filename=\"' . $f . '\"');\n\
         header('Cache-Control: private, max-age=0');\n\
         header('Set-Cookie: downloaded=1; Path=/');\n\
         header('X-Accel-Buffering: no');\n\
         header('X-App: download');\n\
         echo \"this body is never sent\\n\";\n",
    );
    // An API call the app hands to the service behind it, with a query of its own.
    put(
        "api.php",
        "<?php header('X-Accel-Redirect: /backend/data?from=php');\n\
         header('Set-Cookie: php=1; Path=/');\n\
         echo 'dropped';\n",
    );
    put(
        "notfound.php",
        "<?php http_response_code(404); header('Set-Cookie: lost=1'); echo \"app 404\\n\";\n",
    );
    put(
        "plain.php",
        "<?php header('Content-Type: text/plain'); echo \"plain php\\n\";\n",
    );
    (www, files)
}

/// The service behind the internal proxy route: answers `backend METHOD TARGET` with a type,
/// a cache lifetime and a cookie of its own; `/accel` also sends an `X-Accel-Redirect` (which
/// the route that reaches it does not follow).
fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || serve_backend(stream));
        }
    });
    addr
}

fn serve_backend(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                if n.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let text = format!("backend {method} {target}\n");
        let accel = if target.starts_with("/accel") {
            "X-Accel-Redirect: /protected/report.txt\r\n"
        } else {
            ""
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\n\
             Set-Cookie: b=2; Path=/\r\n{accel}Content-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn tern_config(www: &Path, files: &Path, socket: &Path, backend: SocketAddr) -> String {
    format!(
        r#"
[[site]]
name = "app"
default = true

[[site.route]]
path = "/"
static = "{www}"
fastcgi = "unix:{socket}"
x_accel_redirect = true
reroute_status = {{ 404 = "/fallback.html" }}

[[site.route]]
path = "/protected/"
static = "{files}"
internal = true

[[site.route]]
path = "/backend/"
proxy = "{backend}"
strip_prefix = true
internal = true

[[site.route]]
path = "/plain/"
proxy = "{backend}"
strip_prefix = true
"#,
        www = www.display(),
        files = files.display(),
        socket = socket.display(),
    )
}

/// The same in nginx: `internal` locations, `X-Accel-Redirect` followed by default (and
/// ignored where tern's route does not follow it), `fastcgi_intercept_errors` with
/// `error_page 404 =` for `reroute_status`. HTTP/2 on a second port (nginx 1.22 takes prior
/// knowledge only on a port of its own).
fn nginx_config(
    www: &Path,
    files: &Path,
    socket: &Path,
    backend: SocketAddr,
    port: u16,
    h2_port: u16,
) -> String {
    format!(
        r#"
server {{
    listen 127.0.0.1:{port};
    listen 127.0.0.1:{h2_port} http2;
    root {www};
    location / {{
        try_files $uri =404;
    }}
    location ~ \.php$ {{
        include /etc/nginx/fastcgi_params;
        fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
        fastcgi_pass unix:{socket};
        fastcgi_intercept_errors on;
        error_page 404 = /fallback.html;
    }}
    location /protected/ {{
        internal;
        root {files};
    }}
    location /backend/ {{
        internal;
        proxy_pass http://{backend}/;
    }}
    location /plain/ {{
        proxy_pass http://{backend}/;
        proxy_ignore_headers X-Accel-Redirect;
    }}
}}
"#,
        www = www.display(),
        files = files.display(),
        socket = socket.display(),
    )
}

/// One answer as curl read it: status, fields (names in lower case) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    fields: Vec<(String, String)>,
    body: String,
}

impl Answer {
    /// The values of field `name`, sorted (servers may order repeated fields differently).
    /// `Content-Type` by its media type: nginx rewrites the parameters (PHP's
    /// `text/plain;charset=UTF-8` becomes `text/plain; charset=UTF-8`), and keeps the first
    /// answer's charset on the one an `X-Accel-Redirect` leads to (the service's `text/plain`
    /// goes out as `text/plain; charset=UTF-8`, the charset PHP gave), where tern sends each
    /// value as its app wrote it.
    fn all(&self, name: &str) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .fields
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| match name {
                "content-type" => v.split(';').next().unwrap_or("").trim(),
                _ => v.as_str(),
            })
            .collect();
        v.sort_unstable();
        v
    }
}

/// `method path` on `addr` with curl, over HTTP/2 with prior knowledge if `h2`, a form body
/// for POST.
fn curl(addr: SocketAddr, method: &str, path: &str, h2: bool) -> Answer {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-S", "--max-time", "10"]);
    cmd.arg(if h2 {
        "--http2-prior-knowledge"
    } else {
        "--http1.1"
    });
    match method {
        // The head alone, once, on stdout.
        "HEAD" => {
            cmd.arg("-I");
        }
        "POST" => {
            cmd.args(["-D", "-", "-o", "-", "--data", "name=tern"]);
        }
        _ => {
            cmd.args(["-D", "-", "-o", "-"]);
        }
    }
    cmd.arg(format!("http://{addr}{path}"));
    let out = run_to_end(&mut cmd, Duration::from_secs(15));
    assert!(out.status.success(), "curl {method} {path}: {}", out.stderr);
    let text = out.stdout;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("curl {method} {path}: no status in {text:?}"));
    let fields = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        fields,
        body: body.to_string(),
    }
}

/// A request both servers get, and what both must answer.
struct Case {
    method: &'static str,
    path: &'static str,
    status: u16,
    /// The body (a HEAD answer's: empty).
    body: &'static str,
    /// Fields compared between the two servers (and here, where given).
    fields: &'static [(&'static str, &'static [&'static str])],
}

const DOWNLOAD_FIELDS: &[(&str, &[&str])] = &[
    ("content-type", &["application/octet-stream"]),
    (
        "content-disposition",
        &["attachment; filename=\"report.txt\""],
    ),
    ("cache-control", &["private, max-age=0"]),
    ("set-cookie", &["downloaded=1; Path=/"]),
    ("content-length", &["17"]),
];

const CASES: &[Case] = &[
    // The download: the file, with the app's fields that describe it.
    Case {
        method: "GET",
        path: "/download.php?f=report.txt",
        status: 200,
        body: "quarterly report\n",
        fields: DOWNLOAD_FIELDS,
    },
    // A POST is handed back as a GET (a static route takes no POST), a HEAD stays HEAD.
    Case {
        method: "POST",
        path: "/download.php",
        status: 200,
        body: "quarterly report\n",
        fields: DOWNLOAD_FIELDS,
    },
    Case {
        method: "HEAD",
        path: "/download.php",
        status: 200,
        body: "",
        fields: DOWNLOAD_FIELDS,
    },
    // A file the app names that is not there: the internal route's 404.
    Case {
        method: "GET",
        path: "/download.php?f=missing.txt",
        status: 404,
        body: "-",
        fields: &[],
    },
    // Handed to the internal proxy route: the service's answer, its own type, the app's
    // cookie beside its own.
    Case {
        method: "GET",
        path: "/api.php",
        status: 200,
        body: "backend GET /data?from=php\n",
        fields: &[
            ("content-type", &["text/plain"]),
            ("cache-control", &["max-age=60"]),
            ("set-cookie", &["b=2; Path=/", "php=1; Path=/"]),
        ],
    },
    // The app's own 404, answered by the site's page with that page's status.
    Case {
        method: "GET",
        path: "/notfound.php",
        status: 200,
        body: "<p>fallback page</p>\n",
        fields: &[("set-cookie", &[])],
    },
    Case {
        method: "GET",
        path: "/plain.php",
        status: 200,
        body: "plain php\n",
        fields: &[("content-type", &["text/plain"])],
    },
    // A route that does not follow the header passes the answer on, without it.
    Case {
        method: "GET",
        path: "/plain/accel",
        status: 200,
        body: "backend GET /accel\n",
        fields: &[("set-cookie", &["b=2; Path=/"])],
    },
    // A client's own request to an internal route.
    Case {
        method: "GET",
        path: "/protected/report.txt",
        status: 404,
        body: "-",
        fields: &[],
    },
    Case {
        method: "GET",
        path: "/backend/data",
        status: 404,
        body: "-",
        fields: &[],
    },
];

/// Every case on `addr` (HTTP/1.1) and `h2` (HTTP/2), checked; the answers, for comparing.
fn check_cases(addr: SocketAddr, h2: SocketAddr, who: &str) -> Vec<Answer> {
    let mut answers = Vec::new();
    for (proto, at, is_h2) in [("HTTP/1.1", addr, false), ("HTTP/2", h2, true)] {
        for case in CASES {
            let what = format!("{who} {proto}: {} {}", case.method, case.path);
            let a = curl(at, case.method, case.path, is_h2);
            assert_eq!(a.status, case.status, "{what}: {a:?}");
            if case.body != "-" {
                assert_eq!(a.body, case.body, "{what}");
            }
            for (name, want) in case.fields {
                assert_eq!(a.all(name), *want, "{what}: {name}: {a:?}");
            }
            for (name, _) in &a.fields {
                assert!(
                    !name.starts_with("x-accel-"),
                    "{what}: {name} reached the client"
                );
            }
            assert!(a.all("x-app").is_empty(), "{what}: {a:?}");
            answers.push(a);
        }
    }
    answers
}

#[test]
fn apps_hand_downloads_and_api_calls_back_as_behind_nginx() {
    if !have("curl", "--version") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(fpm) = PhpFpm::start(tmp.path()) else {
        return;
    };
    let (www, files) = app_files(tmp.path());
    let backend = backend();
    let conf = tmp.path().join("tern.toml");
    std::fs::write(&conf, tern_config(&www, &files, &fpm.socket, backend)).unwrap();
    let tern = Tern::start_run(&conf);
    let ours = check_cases(tern.addr(), tern.addr(), "tern");
    drop(tern);

    let (port, h2_port) = (free_port(), free_port());
    let http = nginx_config(&www, &files, &fpm.socket, backend, port, h2_port);
    let Some(nginx) = Nginx::start(&tmp.path().join("nginx"), &http, port) else {
        return;
    };
    let h2 = SocketAddr::from(([127, 0, 0, 1], h2_port));
    assert!(eventually(Duration::from_secs(5), || TcpStream::connect(
        h2
    )
    .is_ok()));
    let theirs = check_cases(nginx.addr, h2, "nginx");
    // Beyond the cases' own: the fields a client acts on are the same in both.
    for (a, b) in ours.iter().zip(&theirs) {
        for name in [
            "content-type",
            "content-disposition",
            "set-cookie",
            "cache-control",
        ] {
            if a.status < 400 {
                assert_eq!(a.all(name), b.all(name), "{name}: tern {a:?}, nginx {b:?}");
            }
        }
    }
}

/// `tern run --check` names the lines of misused keys, and the README's migration example
/// (its tern.toml and its Caddyfile) is valid.
#[test]
fn check_names_misused_keys_and_the_readme_example_is_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let (www, _) = app_files(tmp.path());
    let conf = tmp.path().join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            "[[site]]\nname = \"a\"\ndefault = true\n\n[[site.route]]\npath = \"/\"\n\
             static = \"{w}\"\nx_accel_redirect = true\n\n\
             [[site.route]]\npath = \"/p\"\nproxy = \"127.0.0.1:9\"\n\
             reroute_status = {{ 200 = \"/x\" }}\n\n\
             [[site]]\nname = \"b\"\nhosts = [\"b.test\"]\n\n\
             [[site.route]]\npath = \"/hidden\"\nrespond = \"x\"\ninternal = true\n",
            w = www.display()
        ),
    )
    .unwrap();
    let out = run_to_end(
        Command::new(TERN)
            .args(["run", "--check", "--config"])
            .arg(&conf),
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    let text = out.stderr;
    assert!(
        text.contains("line 8: `x_accel_redirect` does not apply to a static route"),
        "{text}"
    );
    assert!(
        text.contains("line 13: reroute_status: 200 is not a status that can be rerouted"),
        "{text}"
    );
    assert!(
        text.contains("line 22: internal = true: nothing on this site routes a request here"),
        "{text}"
    );

    // The README's set-up, its paths made real.
    let section = "### Downloads an app hands back (X-Accel-Redirect), in tern, nginx and Caddy";
    let app = tmp.path().join("app");
    let private = tmp.path().join("private");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&private).unwrap();
    let real = |text: String| {
        text.replace("/srv/app/public", app.to_str().unwrap())
            .replace("/srv/app/private", private.to_str().unwrap())
    };
    let toml = tmp.path().join("readme.toml");
    std::fs::write(&toml, real(readme_block(section, "toml"))).unwrap();
    let out = run_to_end(
        Command::new(TERN)
            .args(["run", "--check", "--config"])
            .arg(&toml),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let caddyfile = tmp.path().join("Caddyfile");
    std::fs::write(&caddyfile, real(readme_block(section, "caddy"))).unwrap();
    if let Some(Err(e)) = caddy_validate(&caddyfile, tmp.path()) {
        panic!("{e}");
    }
}
