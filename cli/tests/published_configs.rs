//! Published nginx set-ups beside their `tern.toml` (issue 41), run as a new user would: the
//! same files and the same requests to nginx and to tern, answer by answer, headers included
//! (`cli/tests/php_apps.rs` does the same for the PHP apps). Each set-up names its source;
//! the README's Caddyfile beside a set-up must pass `caddy validate`.
//! nginx is installed by `scripts/install-gate-test-deps`; without it only tern is asked.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support;
use support::*;

/// One request both servers get.
struct Ask {
    method: &'static str,
    host: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
}

const fn get(host: &'static str, path: &'static str) -> Ask {
    Ask {
        method: "GET",
        host,
        path,
        headers: &[],
    }
}

/// A field the answer must carry with this value (`Some("*")`: any value), or not at all.
type Field = (&'static str, Option<&'static str>);

/// The answer both must give: the status, the body when given, the `Location` when given
/// (compared whole when it is absolute in the case, else by its path: nginx writes absolute
/// ones), and fields.
struct Answer {
    status: u16,
    body: Option<&'static str>,
    location: Option<&'static str>,
    fields: &'static [Field],
}

const fn answer(status: u16, body: Option<&'static str>, fields: &'static [Field]) -> Answer {
    Answer {
        status,
        body,
        location: None,
        fields,
    }
}

const fn moved(status: u16, location: &'static str, fields: &'static [Field]) -> Answer {
    Answer {
        status,
        body: None,
        location: Some(location),
        fields,
    }
}

/// Sends one request on a connection of its own, the answer read to its end.
fn send(addr: SocketAddr, ask: &Ask) -> Resp {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut req = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        ask.method, ask.path, ask.host
    );
    for (n, v) in ask.headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    let mut c = Client::over(stream);
    c.chunked_ok = true;
    c.read_response(ask.method == "HEAD")
}

fn location_path(location: &str) -> &str {
    match location.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
        None => location,
    }
}

fn check(addr: SocketAddr, who: &str, cases: &[(Ask, Answer)]) {
    for (ask, want) in cases {
        let what = format!("{who}: {} {}{}", ask.method, ask.host, ask.path);
        let r = send(addr, ask);
        assert_eq!(r.status, want.status, "{what}: {r:?}");
        if let Some(body) = want.body {
            assert_eq!(r.text(), body, "{what}");
        }
        if let Some(location) = want.location {
            let got = r
                .header("location")
                .unwrap_or_else(|| panic!("{what}: no Location"));
            if location.contains("://") {
                assert_eq!(got, location, "{what}");
            } else {
                assert_eq!(location_path(got), location, "{what}");
            }
        }
        for (name, value) in want.fields {
            let got = r.header(name);
            match value {
                None => assert_eq!(got, None, "{what}: {name} {r:?}"),
                Some("*") => assert!(got.is_some(), "{what}: no {name}: {r:?}"),
                Some(v) => assert_eq!(got, Some(*v), "{what}: {name} {r:?}"),
            }
        }
    }
}

/// Writes `files` (path, content) under `dir/www`.
fn files(dir: &Path, list: &[(&str, &str)]) -> PathBuf {
    let www = dir.join("www");
    for (rel, text) in list {
        let p = www.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    www
}

/// The cases against tern with `toml` (checked by `--check` first), then against nginx with
/// `nginx_http` (server blocks on the port given) when nginx is installed.
fn both(toml: &str, nginx_http: &str, port: u16, dir: &Path, cases: &[(Ask, Answer)]) {
    let conf = dir.join("tern.toml");
    std::fs::write(&conf, toml).unwrap();
    let out = run_to_end(
        std::process::Command::new(TERN)
            .args(["run", "--check", "--config"])
            .arg(&conf),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let tern = Tern::start_run(&conf);
    check(tern.addr(), "tern", cases);
    drop(tern);
    if let Some(nginx) = Nginx::start(&dir.join("nginx"), nginx_http, port) {
        check(nginx.addr, "nginx", cases);
    }
}

// ---------------------------------------------------------------------------------------
// A hardened static site

const STATIC_SITE: &[(&str, &str)] = &[
    ("index.html", "<!doctype html><title>home</title>\n"),
    ("about/index.html", "<!doctype html><title>about</title>\n"),
    ("404.html", "<!doctype html><title>not here</title>\n"),
    ("css/style.css", "body { margin: 0 }\n"),
    ("img/logo.png", "PNG"),
    ("favicon.ico", "ICO"),
    ("data.json", "{\"a\":1}\n"),
    (
        ".well-known/security.txt",
        "Contact: mailto:security@example.com\n",
    ),
    (".git/config", "[core]\n"),
    ("backup.sql", "DROP TABLE users;\n"),
];

const CSP: &str = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'";

/// A static site hardened as the HTML5 Boilerplate's nginx configuration
/// (<https://github.com/h5bp/server-configs-nginx>) does it: `h5bp/security/*.conf` (the
/// security headers, the page-only ones by content type through `map
/// $sent_http_content_type`, `always`), `h5bp/web_performance/cache_expiration.conf`
/// (`expires` by content type, a shorter list of types here), `h5bp/location/
/// security_file_access.conf` (hidden files but `/.well-known/`, backup and config files
/// refused), `h5bp/rewrites/no-www.conf` (the `www.` name redirected to the bare one), an
/// error page, and a moved page.
fn static_site_nginx(www: &Path, port: u16) -> String {
    format!(
        r#"
map $sent_http_content_type $expires {{
    default                   1y;
    ""                        off;
    ~*text/html               0;
    ~*application/json        0;
    ~*image/x-icon            1w;
    ~*image/                  1M;
    ~*font/                   1M;
}}
map $sent_http_content_type $x_frame_options {{
    ~*text/html DENY;
}}
map $sent_http_content_type $content_security_policy {{
    ~*text/html "{CSP}";
}}
map $sent_http_content_type $referrer_policy {{
    ~*text/(css|html|javascript)|application/javascript "strict-origin-when-cross-origin";
}}
server {{
    listen 127.0.0.1:{port};
    server_name www.example.com;
    return 301 $scheme://example.com$request_uri;
}}
server {{
    listen 127.0.0.1:{port} default_server;
    server_name example.com;
    root {www};
    index index.html;
    error_page 404 /404.html;

    expires $expires;
    add_header X-Content-Type-Options "nosniff" always;
    add_header X-Frame-Options $x_frame_options always;
    add_header Content-Security-Policy $content_security_policy always;
    add_header Referrer-Policy $referrer_policy always;

    location ~* /\.(?!well-known\/) {{ deny all; }}
    location ~* (?:#.*#|\.(?:bak|conf|dist|fla|in[ci]|log|orig|psd|sh|sql|sw[op])|~)$ {{ deny all; }}
    location = /old-page.html {{ return 301 /about/; }}
}}
"#,
        www = www.display()
    )
}

const STATIC_SITE_SECTION: &str = "### A hardened static site in tern, nginx and Caddy";

/// The same in tern: the README's block (its hardened static site section).
fn static_site_tern(www: &Path) -> String {
    readme_block(STATIC_SITE_SECTION, "toml").replace("/var/www/example", www.to_str().unwrap())
}

/// On every answer (`always`); on pages only.
const NOSNIFF: Field = ("X-Content-Type-Options", Some("nosniff"));
const PAGE: [Field; 4] = [
    NOSNIFF,
    ("X-Frame-Options", Some("DENY")),
    ("Content-Security-Policy", Some(CSP)),
    ("Referrer-Policy", Some("strict-origin-when-cross-origin")),
];
const NOT_A_PAGE: [Field; 3] = [
    NOSNIFF,
    ("X-Frame-Options", None),
    ("Content-Security-Policy", None),
];

const STATIC_SITE_CASES: &[(Ask, Answer)] = &[
    (
        get("example.com", "/"),
        answer(
            200,
            Some("<!doctype html><title>home</title>\n"),
            &[
                PAGE[0],
                PAGE[1],
                PAGE[2],
                PAGE[3],
                ("Cache-Control", Some("max-age=0")),
                ("Expires", Some("*")),
            ],
        ),
    ),
    (
        get("example.com", "/about/"),
        answer(
            200,
            Some("<!doctype html><title>about</title>\n"),
            &[PAGE[0], PAGE[1], ("Cache-Control", Some("max-age=0"))],
        ),
    ),
    (
        get("example.com", "/css/style.css"),
        answer(
            200,
            Some("body { margin: 0 }\n"),
            &[
                NOT_A_PAGE[0],
                NOT_A_PAGE[1],
                NOT_A_PAGE[2],
                ("Referrer-Policy", Some("strict-origin-when-cross-origin")),
                ("Cache-Control", Some("max-age=31536000")),
                ("Expires", Some("*")),
            ],
        ),
    ),
    (
        get("example.com", "/img/logo.png"),
        answer(
            200,
            Some("PNG"),
            &[
                NOT_A_PAGE[0],
                NOT_A_PAGE[1],
                ("Referrer-Policy", None),
                ("Cache-Control", Some("max-age=2592000")),
            ],
        ),
    ),
    (
        get("example.com", "/favicon.ico"),
        answer(
            200,
            Some("ICO"),
            &[("Cache-Control", Some("max-age=604800"))],
        ),
    ),
    (
        get("example.com", "/data.json"),
        answer(
            200,
            Some("{\"a\":1}\n"),
            &[NOSNIFF, ("Cache-Control", Some("max-age=0"))],
        ),
    ),
    (
        get("example.com", "/.well-known/security.txt"),
        answer(
            200,
            Some("Contact: mailto:security@example.com\n"),
            &[NOSNIFF, ("Cache-Control", Some("max-age=31536000"))],
        ),
    ),
    // The error page: a page's headers, never made cacheable.
    (
        get("example.com", "/missing"),
        answer(
            404,
            Some("<!doctype html><title>not here</title>\n"),
            &[
                PAGE[0],
                PAGE[1],
                PAGE[2],
                ("Cache-Control", None),
                ("Expires", None),
            ],
        ),
    ),
    (
        get("example.com", "/.git/config"),
        answer(403, None, &[PAGE[0], PAGE[1], ("Expires", None)]),
    ),
    (
        get("example.com", "/backup.sql"),
        answer(403, None, &[PAGE[0], PAGE[1]]),
    ),
    (
        get("example.com", "/about"),
        moved(301, "/about/", &[NOSNIFF]),
    ),
    (
        get("example.com", "/old-page.html"),
        moved(301, "/about/", &[NOSNIFF]),
    ),
    (
        get("www.example.com", "/about/?lang=fr"),
        moved(301, "http://example.com/about/?lang=fr", &[]),
    ),
];

#[test]
fn a_hardened_static_site_answers_as_in_nginx() {
    let tmp = tempfile::tempdir().unwrap();
    let www = files(tmp.path(), STATIC_SITE);
    let port = free_port();
    both(
        &static_site_tern(&www),
        &static_site_nginx(&www, port),
        port,
        tmp.path(),
        STATIC_SITE_CASES,
    );
}

/// The README's Caddyfile for the same site, on the test's files.
#[test]
fn the_readme_hardened_static_site_caddyfile_is_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let www = files(tmp.path(), STATIC_SITE);
    let file = tmp.path().join("Caddyfile");
    std::fs::write(
        &file,
        readme_block(STATIC_SITE_SECTION, "caddy")
            .replace("/var/www/example", www.to_str().unwrap()),
    )
    .unwrap();
    if let Some(Err(e)) = caddy_validate(&file, tmp.path()) {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------
// A canonical host over HTTPS

/// The canonical-host set-up of nginx's "Pitfalls and Common Mistakes" page
/// (<https://www.nginx.com/resources/wiki/start/topics/tutorials/config_pitfalls/>, "Taxing
/// Rewrites"): `server { listen 80; server_name example.com www.example.com; return 301
/// https://example.com$request_uri; }`, in one hop from either name. nginx is asked on plain
/// HTTP (its answer has no port); tern's redirect listener names its HTTPS port.
#[test]
fn a_canonical_host_takes_one_hop_from_plain_http() {
    let tmp = tempfile::tempdir().unwrap();
    let www = files(tmp.path(), &[("about/index.html", "about\n")]);
    let conf = tmp.path().join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            r#"[tls]
self_signed = true
listen = "127.0.0.1:0"
redirect_http = "127.0.0.1:0"
redirect_http_status = 301
redirect_http_hosts = {{ "*" = "example.com" }}

[[site]]
name = "main"
default = true
hosts = ["example.com"]

[[site.route]]
path = "/"
static = "{www}"
"#,
            www = www.display()
        ),
    )
    .unwrap();
    let tern = Tern::start_run(&conf);
    let redirect = tern.redirect().expect("a redirect listener");
    let port = tern.https().port();
    for host in [
        "www.example.com",
        "example.com",
        "Example.COM:80",
        "other.test",
    ] {
        let r = send(redirect, &get(host, "/about/?lang=fr"));
        assert_eq!(r.status, 301, "{host}: {r:?}");
        assert_eq!(
            r.header("location"),
            Some(format!("https://example.com:{port}/about/?lang=fr").as_str()),
            "{host}"
        );
    }
    let nginx_port = free_port();
    let http = format!(
        "server {{ listen 127.0.0.1:{nginx_port}; server_name example.com www.example.com; \
         return 301 https://example.com$request_uri; }}"
    );
    if let Some(nginx) = Nginx::start(&tmp.path().join("nginx"), &http, nginx_port) {
        for host in ["www.example.com", "example.com"] {
            let r = send(nginx.addr, &get(host, "/about/?lang=fr"));
            assert_eq!(r.status, 301);
            assert_eq!(
                r.header("location"),
                Some("https://example.com/about/?lang=fr"),
                "{host}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// `always` on the proxy's own errors

/// An app that is down: the proxy's own 502 carries the site's headers in both (nginx's
/// `add_header ... always`), and a route's own header goes over the site's.
#[test]
fn the_proxy_s_own_errors_carry_the_site_s_headers() {
    let tmp = tempfile::tempdir().unwrap();
    let dead = free_port();
    let toml = format!(
        r#"[[site]]
name = "app"
default = true
add_headers = {{ X-Content-Type-Options = "nosniff", X-Frame-Options = "DENY" }}

[[site.route]]
path = "/api"
proxy = "127.0.0.1:{dead}"
add_headers = {{ X-Frame-Options = "SAMEORIGIN" }}
"#
    );
    let port = free_port();
    let nginx = format!(
        r#"
server {{
    listen 127.0.0.1:{port};
    add_header X-Content-Type-Options "nosniff" always;
    add_header X-Frame-Options "DENY" always;
    location /api {{
        add_header X-Content-Type-Options "nosniff" always;
        add_header X-Frame-Options "SAMEORIGIN" always;
        proxy_pass http://127.0.0.1:{dead};
    }}
}}
"#
    );
    const CASES: &[(Ask, Answer)] = &[
        (
            get("example.com", "/api/users"),
            answer(
                502,
                None,
                &[NOSNIFF, ("X-Frame-Options", Some("SAMEORIGIN"))],
            ),
        ),
        (
            get("example.com", "/elsewhere"),
            answer(404, None, &[NOSNIFF, ("X-Frame-Options", Some("DENY"))]),
        ),
    ];
    both(&toml, &nginx, port, tmp.path(), CASES);
}
