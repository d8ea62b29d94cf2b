//! A PHP site on Debian's PHP-FPM behind `tern run` (issue 27, set-up 2): static files beside
//! `*.php` scripts, a front controller by `try_files`, a form post, redirects, a large
//! answer streamed with `flush()`, errors; the same requests answered the same way by nginx
//! with the configuration its documentation gives for PHP; and what tern refuses that a
//! careless PHP set-up does not (scripts named by `upload.jpg/x.php`, `.PHP` sources, client
//! claims and `Proxy:` reaching PHP as server variables, scripts through symlinks out of the
//! root and dotfile scripts, `SERVER_NAME`/`SERVER_PORT` taken from `Host`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{php_support, support};
use php_support::PhpFpm;
use support::*;

/// The site: scripts, a static file, and files that must never run or be served raw; beside
/// it, `outside/` with a script that symlinks in `www` point to and must never run.
fn www(dir: &Path) -> PathBuf {
    let w = dir.join("www");
    let put = |rel: &str, text: &str| {
        let p = w.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put(
        "index.php",
        "<?php header('Content-Type: text/plain');\n\
         echo 'front ', $_SERVER['REQUEST_URI'], ' script=', $_SERVER['SCRIPT_NAME'],\n\
         ' info=', $_SERVER['PATH_INFO'] ?? 'unset', ' method=', $_SERVER['REQUEST_METHOD'],\n\
         ' q=', $_SERVER['QUERY_STRING'], \"\\n\";\n",
    );
    put(
        "form.php",
        "<?php header('Content-Type: text/plain');\n\
         echo 'hello ', $_POST['name'] ?? '?', ' len=', $_SERVER['CONTENT_LENGTH'] ?? '-', \"\\n\";\n",
    );
    put(
        "redirect.php",
        "<?php header('Location: /form.php'); echo 'moving';\n",
    );
    put(
        "moved.php",
        "<?php http_response_code(301); header('Location: https://example.org/new');\n",
    );
    put(
        "big.php",
        "<?php header('Content-Type: application/octet-stream');\n\
         $chunk = str_repeat('0123456789abcdef', 4096);\n\
         for ($i = 0; $i < 80; $i++) { echo $chunk; flush(); }\n",
    );
    put(
        "fail.php",
        "<?php error_log('tern-test: something broke'); http_response_code(500); echo \"err\\n\";\n",
    );
    put(
        "blog/index.php",
        "<?php echo 'blog index ', $_SERVER['SCRIPT_NAME'], \"\\n\";\n",
    );
    put(
        "who.php",
        "<?php echo 'xff=', $_SERVER['HTTP_X_FORWARDED_FOR'] ?? '-', ' real=',\n\
         $_SERVER['HTTP_X_REAL_IP'] ?? '-', ' proxy=', $_SERVER['HTTP_PROXY'] ?? '-',\n\
         ' remote=', $_SERVER['REMOTE_ADDR'], ' https=', $_SERVER['HTTPS'] ?? '-', \"\\n\";\n",
    );
    put(
        "server.php",
        "<?php echo 'name=', $_SERVER['SERVER_NAME'], ' port=', $_SERVER['SERVER_PORT'],\n\
         ' host=', $_SERVER['HTTP_HOST'], \"\\n\";\n",
    );
    put("style.css", "body { color: teal }\n");
    put("upload.jpg", "<?php echo 'pwned';\n");
    put("secret.PHP", "<?php $password = 'hunter2';\n");
    put(".hidden.php", "<?php echo 'hidden ran';\n");
    put(".git/x.php", "<?php echo 'git ran';\n");
    let outside = dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("evil.php"), "<?php echo 'outside ran';\n").unwrap();
    std::fs::write(outside.join("index.php"), "<?php echo 'outside ran';\n").unwrap();
    let link =
        |target: &Path, name: &str| std::os::unix::fs::symlink(target, w.join(name)).unwrap();
    link(Path::new("../outside/evil.php"), "escape.php");
    link(&outside.join("evil.php"), "abs-escape.php");
    link(Path::new("../outside"), "linked");
    // A link that stays beneath the root is followed, as for static files.
    link(Path::new("blog/index.php"), "alias.php");
    w
}

/// Two sites on the same folder: `php` (the default) with a front controller, `bare` without
/// one, where a refused script gets the static side's answer as it is.
fn tern_config(www: &Path, socket: &Path) -> String {
    format!(
        r#"
[[site]]
name = "php"
default = true
hosts = ["*.php.example", "php.example"]

[[site.route]]
path = "/"
static = "{www}"
fastcgi = "unix:{socket}"
try_files = ["$uri", "$uri/", "/index.php"]

[[site.route]]
path = "/statusz"
counters = "statusz"

[[site]]
name = "bare"
hosts = ["bare.example"]

[[site.route]]
path = "/"
static = "{www}"
fastcgi = "unix:{socket}"
"#,
        www = www.display(),
        socket = socket.display()
    )
}

/// nginx's PHP set-up as its documentation and Debian's snippets/fastcgi-php.conf give it.
fn nginx_config(www: &Path, socket: &Path, port: u16) -> String {
    format!(
        r#"
server {{
    listen 127.0.0.1:{port};
    root {www};
    index index.php;
    location / {{
        try_files $uri $uri/ /index.php$is_args$args;
    }}
    location ~ [^/]\.php(/|$) {{
        fastcgi_split_path_info ^(.+?\.php)(/.*)$;
        if (!-f $document_root$fastcgi_script_name) {{ return 404; }}
        include /etc/nginx/fastcgi_params;
        fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
        fastcgi_param PATH_INFO $fastcgi_path_info;
        fastcgi_pass unix:{socket};
    }}
}}
"#,
        www = www.display(),
        socket = socket.display()
    )
}

struct Case {
    method: &'static str,
    path: &'static str,
    body: &'static str,
    status: u16,
    /// The answer's body, or `None` to check only the status.
    text: Option<&'static str>,
    location: Option<&'static str>,
}

const fn get(path: &'static str, status: u16, text: Option<&'static str>) -> Case {
    Case {
        method: "GET",
        path,
        body: "",
        status,
        text,
        location: None,
    }
}

/// Requests both servers get, and the answers both must give.
const SAME: &[Case] = &[
    get(
        "/",
        200,
        Some("front / script=/index.php info= method=GET q=\n"),
    ),
    get(
        "/index.php?page=2",
        200,
        Some("front /index.php?page=2 script=/index.php info= method=GET q=page=2\n"),
    ),
    // The front controller: a path with no file runs /index.php with the path it asked for.
    get(
        "/articles/42?x=1",
        200,
        Some("front /articles/42?x=1 script=/index.php info= method=GET q=x=1\n"),
    ),
    get(
        "/index.php/extra/info",
        200,
        Some("front /index.php/extra/info script=/index.php info=/extra/info method=GET q=\n"),
    ),
    get("/blog/", 200, Some("blog index /blog/index.php\n")),
    get("/style.css", 200, Some("body { color: teal }\n")),
    Case {
        method: "POST",
        path: "/form.php",
        body: "name=tern&x=1",
        status: 200,
        text: Some("hello tern len=13\n"),
        location: None,
    },
    Case {
        location: Some("/form.php"),
        ..get("/redirect.php", 302, Some("moving"))
    },
    Case {
        location: Some("https://example.org/new"),
        ..get("/moved.php", 301, Some(""))
    },
    get("/fail.php", 500, Some("err\n")),
];

fn check_same(addr: SocketAddr, who: &str) {
    for case in SAME {
        let mut c = Client::connect(addr);
        c.chunked_ok = true;
        let mut headers = vec![("Connection", "close")];
        let len = case.body.len().to_string();
        if !case.body.is_empty() {
            headers.push(("Content-Type", "application/x-www-form-urlencoded"));
            headers.push(("Content-Length", &len));
        }
        let mut req = request_bytes(case.method, case.path, &headers);
        req.extend_from_slice(case.body.as_bytes());
        c.send(&req);
        let r = c.read_response(false);
        assert_eq!(
            r.status, case.status,
            "{who}: {} {}",
            case.method, case.path
        );
        if let Some(text) = case.text {
            assert_eq!(r.text(), text, "{who}: {} {}", case.method, case.path);
        }
        assert_eq!(
            r.header("location"),
            case.location,
            "{who}: {} {}",
            case.method,
            case.path
        );
    }
    // A large answer streamed with flush(): every byte, in order.
    let mut c = Client::connect(addr);
    c.chunked_ok = true;
    let r = c.get("/big.php", &[("Connection", "close")]);
    assert_eq!(r.status, 200, "{who}: big");
    assert_eq!(r.body.len(), 80 * 65536, "{who}: big");
    assert!(
        r.body.chunks(16).all(|c| c == b"0123456789abcdef"),
        "{who}: big body"
    );
}

/// PHP-FPM and `tern run` on the test site; `None` (skipped) without php-fpm.
struct PhpSite {
    tmp: tempfile::TempDir,
    fpm: PhpFpm,
    www: PathBuf,
    tern: Tern,
}

fn php_site() -> Option<PhpSite> {
    let tmp = tempfile::tempdir().unwrap();
    let fpm = PhpFpm::start(tmp.path())?;
    let www = www(tmp.path());
    let conf = tmp.path().join("tern.toml");
    std::fs::write(&conf, tern_config(&www, &fpm.socket)).unwrap();
    let tern = Tern::start_run(&conf);
    Some(PhpSite {
        tmp,
        fpm,
        www,
        tern,
    })
}

#[test]
fn a_php_site_answers_as_behind_nginx() {
    let Some(PhpSite {
        tmp,
        fpm,
        www,
        tern,
    }) = php_site()
    else {
        return;
    };
    check_same(tern.addr(), "tern");
    // PHP's error stream reaches tern's log, as nginx's "FastCGI sent in stderr".
    assert!(
        eventually(Duration::from_secs(5), || !tern
            .log_lines("tern-test: something broke")
            .is_empty()),
        "{}",
        tern.stderr_text()
    );
    drop(tern);

    let port = free_port();
    let http = nginx_config(&www, &fpm.socket, port);
    let Some(nginx) = Nginx::start(&tmp.path().join("nginx"), &http, port) else {
        return;
    };
    check_same(nginx.addr, "nginx");
}

#[test]
fn what_php_gets_is_what_tern_decided_and_nothing_a_client_claims() {
    // Held whole: php-fpm and the site's folder live as long as the test.
    let Some(site) = php_site() else {
        return;
    };
    let tern = &site.tern;
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut c = tern.client();
        c.chunked_ok = true;
        c.get(path, headers)
    };
    let r = get(
        "/who.php",
        &[
            ("X-Forwarded-For", "6.6.6.6"),
            ("X-Real-IP", "6.6.6.6"),
            ("Proxy", "http://evil.example:8080"),
        ],
    );
    assert_eq!(
        r.text(),
        "xff=127.0.0.1 real=- proxy=- remote=127.0.0.1 https=-\n"
    );
    // A script's source is never sent, whatever the case of its extension: with no such
    // script, try_files falls back to the front controller (as Caddy's php_fastcgi does;
    // nginx's `location ~ \.php$` answers 404 instead).
    let r = get("/secret.PHP", &[]);
    assert!(!r.text().contains("hunter2"), "{}", r.text());
    assert_eq!(
        r.text(),
        "front /secret.PHP script=/index.php info= method=GET q=\n"
    );
    assert_eq!(
        get("/missing.php", &[]).text(),
        "front /missing.php script=/index.php info= method=GET q=\n"
    );
    // A script named after an uploaded image: the image never runs.
    let r = get("/upload.jpg/x.php", &[]);
    assert_eq!(
        r.text(),
        "front /upload.jpg/x.php script=/index.php info= method=GET q=\n"
    );
    // The path PHP is told is the one routing saw: dot segments resolved.
    let r = get("/blog/../index.php?a=b", &[]);
    assert_eq!(
        r.text(),
        "front /index.php?a=b script=/index.php info= method=GET q=a=b\n"
    );
    // A newline smuggled into PATH_INFO (CVE-2019-11043) is refused before PHP sees it.
    assert_eq!(get("/index.php/a%0Ab", &[]).status, 400);
    // HEAD: the head GET would get, no body.
    let mut c = tern.client();
    c.chunked_ok = true;
    let r = c.request("HEAD", "/index.php", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    // Keep-alive both ways: many requests on one client connection, and the FastCGI
    // connection pooled between them (each answer ended exactly with END_REQUEST).
    let connects = tern.statusz("upstream_connects");
    let mut c = tern.client();
    c.chunked_ok = true;
    for i in 0..20 {
        let r = c.get(&format!("/index.php?n={i}"), &[]);
        assert_eq!(r.status, 200);
        assert!(r.text().ends_with(&format!("q=n={i}\n")), "{}", r.text());
    }
    // A form post too: its STDIN ends exactly, so its connection is kept as well.
    let body = "name=pooled";
    let len = body.len().to_string();
    let mut req = request_bytes(
        "POST",
        "/form.php",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Content-Length", &len),
        ],
    );
    req.extend_from_slice(body.as_bytes());
    c.send(&req);
    assert_eq!(c.read_response(false).text(), "hello pooled len=11\n");
    assert!(
        tern.statusz("upstream_connects") - connects <= 1,
        "connects {} reuses {}",
        tern.statusz("upstream_connects"),
        tern.statusz("upstream_reuses")
    );
    assert!(tern.statusz("upstream_reuses") >= 20);
    // Counted for the route's FastCGI group, named as a proxy route's group is.
    assert_eq!(
        tern.statusz("upstream_reuses{upstream=\"php /\"}"),
        tern.statusz("upstream_reuses")
    );
}

/// One request on a new connection with its own `Host`.
fn get_as(tern: &Tern, host: &str, path: &str) -> Resp {
    let mut c = tern.client();
    c.chunked_ok = true;
    c.send(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes());
    c.read_response(false)
}

/// A script is judged as the static files judge a file: nothing through a symlink (of the
/// script or of a folder on its way) out of the root, no dotfile; the same 404.
#[test]
fn scripts_through_symlinks_out_of_the_root_or_dotfiles_never_run() {
    let Some(site) = php_site() else {
        return;
    };
    let tern = &site.tern;
    let refused = [
        "/escape.php",
        "/abs-escape.php",
        "/linked/evil.php",
        "/linked/evil.php/info",
        "/.hidden.php",
        "/.git/x.php",
    ];
    for path in refused {
        // As the static side answers for the file itself.
        let r = get_as(tern, "bare.example", path);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert!(!r.text().contains("ran"), "{path}: {}", r.text());
        // Behind try_files, a refused script is a missing one: the front controller answers.
        let r = get_as(tern, "php.example", path);
        assert_eq!(
            r.text(),
            format!("front {path} script=/index.php info= method=GET q=\n")
        );
    }
    // The folder's index script beyond the link: the folder is the static side's (404).
    assert_eq!(get_as(tern, "bare.example", "/linked/").status, 404);
    // The static side answers the same for the same paths' static files.
    assert_eq!(get_as(tern, "bare.example", "/.git/").status, 404);
    // A link that stays inside the root runs its target, under the name asked for.
    let r = get_as(tern, "bare.example", "/alias.php");
    assert_eq!(r.text(), "blog index /alias.php\n");
}

/// `SERVER_NAME` is the site's first name and `SERVER_PORT` the listener's, whatever the
/// `Host` says; `HTTP_HOST` still says what the client sent.
#[test]
fn server_name_and_port_come_from_the_config_and_the_listener() {
    let Some(site) = php_site() else {
        return;
    };
    let tern = &site.tern;
    let port = tern.addr().port();
    let cases = [
        // Any Host reaches the default site: none may name the server.
        ("evil.example:6666", "php.example"),
        ("evil.example", "php.example"),
        // A wildcard is no name: the site's first exact one.
        ("a.php.example:81", "php.example"),
        ("bare.example:6666", "bare.example"),
    ];
    for (host, name) in cases {
        assert_eq!(
            get_as(tern, host, "/server.php").text(),
            format!("name={name} port={port} host={host}\n"),
            "Host: {host}"
        );
    }
}

#[test]
fn php_fpm_down_is_a_clear_502_and_the_static_files_go_on() {
    let tmp = tempfile::tempdir().unwrap();
    let www = www(tmp.path());
    let conf = tmp.path().join("tern.toml");
    // Nothing listens on this socket (its folder exists, so the sandbox allows it).
    std::fs::write(&conf, tern_config(&www, &tmp.path().join("absent.sock"))).unwrap();
    let tern = Tern::start_run(&conf);
    let r = tern.get("/index.php");
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(tern.get("/style.css").status, 200);
}

#[test]
fn check_names_the_lines_of_misused_fastcgi_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let www = www(tmp.path());
    let conf = tmp.path().join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            "[[site]]\nname = \"a\"\n\n[[site.route]]\npath = \"/\"\nstatic = \"{w}\"\n\
             fastcgi = \"unix:{w}/php.sock\"\nindex = \"../x.php\"\n\n\
             [[site.route]]\npath = \"/p\"\nproxy = \"127.0.0.1:9\"\nindex = \"index.php\"\n\n\
             [[site.route]]\npath = \"/q\"\nfastcgi = \"127.0.0.1:9000\"\n\n\
             [[site.route]]\npath = \"/r\"\nstatic = \"{w}\"\nfastcgi = \"unix:{w}/php.sock\"\n\
             index = [\"index.php\", \"/$uri\"]\n\
             [site.route.fastcgi_params]\nSCRIPT_FILENAME = \"/etc/passwd\"\n\
             SERVER_NAME = \"$host\"\nAPP_ENV = \"$nope\"\nfront_controller_active = \"true\"\n\n\
             [[site.route]]\npath = \"/s\"\nproxy = \"127.0.0.1:9\"\nfastcgi_params = {{ A = \"1\" }}\n",
            w = www.display()
        ),
    )
    .unwrap();
    let out = run_to_end(
        Command::new(TERN)
            .arg("run")
            .arg("--config")
            .arg(&conf)
            .arg("--check"),
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    let text = out.stderr;
    assert!(text.contains("line 8: index \"../x.php\""), "{text}");
    assert!(
        text.contains("line 13: `index` does not apply to a proxy route"),
        "{text}"
    );
    assert!(text.contains("line 17:"), "{text}");
    // The front controller must name a script; parameters that choose the script are
    // refused, those that name the server take fixed values, variables are known ones.
    assert!(
        text.contains("line 23: index \"/$uri\": the front controller"),
        "{text}"
    );
    assert!(
        text.contains("line 25: fastcgi_params: SCRIPT_FILENAME is decided by tern"),
        "{text}"
    );
    assert!(
        text.contains("line 26: fastcgi_params: SERVER_NAME takes a fixed value"),
        "{text}"
    );
    assert!(
        text.contains("line 27: fastcgi_params: APP_ENV: \"$nope\": unknown variable $nope"),
        "{text}"
    );
    assert!(!text.contains("line 28"), "{text}");
    assert!(
        text.contains("line 33: `fastcgi_params` does not apply to a proxy route"),
        "{text}"
    );
}

#[test]
fn the_readme_php_caddyfile_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("blog");
    std::fs::create_dir(&root).unwrap();
    let file = dir.path().join("Caddyfile");
    let caddyfile = readme_block("### PHP sites (FastCGI)", "caddy")
        .replace("/srv/blog", root.to_str().unwrap());
    std::fs::write(&file, caddyfile).unwrap();
    if let Some(Err(e)) = caddy_validate(&file, dir.path()) {
        panic!("{e}");
    }
}
