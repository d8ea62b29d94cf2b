//! The README's three-site setup, as written there: its tern config runs under `tern run`, its
//! nginx config under Debian's nginx, both on the same files with the wiki a fake upstream
//! (only paths and ports swapped for a temporary folder and free ports), and both must give
//! the same answers to the same requests; its Caddyfile must pass `caddy validate`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support;
use support::*;

/// The fenced block of `lang` in the README's three-site section.
fn readme_block(lang: &str) -> String {
    support::readme_block("### Three sites in tern, nginx and Caddy", lang)
}

/// A fake wiki server: answers every request with which server it is, the path, and what
/// the proxy told it (Host, X-Forwarded-For, X-Forwarded-Proto).
fn wiki(name: &'static str, hits: Arc<AtomicUsize>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let hits = hits.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = find(&buf, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        hits.fetch_add(1, Ordering::SeqCst);
                        let path = head.split(' ').nth(1).unwrap_or("").to_string();
                        let field = |n: &str| {
                            head.lines()
                                .find_map(|l| {
                                    let (k, v) = l.split_once(':')?;
                                    k.eq_ignore_ascii_case(n).then(|| v.trim().to_string())
                                })
                                .unwrap_or_default()
                        };
                        let body = format!(
                            "wiki {name} {path} host={} xff={} proto={}\n",
                            field("host"),
                            field("x-forwarded-for"),
                            field("x-forwarded-proto")
                        );
                        let _ = s.write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        );
                    }
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

struct Setup {
    tmp: tempfile::TempDir,
    www: PathBuf,
    wikis: [SocketAddr; 2],
    hits: [Arc<AtomicUsize>; 2],
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let www = tmp.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        std::fs::write(www.join("index.html"), "<h1>example.org</h1>\n").unwrap();
        std::fs::write(www.join("about.html"), "<p>about</p>\n").unwrap();
        for d in ["tern-logs", "nginx-logs", "caddy-logs"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        let hits = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
        let wikis = [wiki("a", hits[0].clone()), wiki("b", hits[1].clone())];
        Setup {
            tmp,
            www,
            wikis,
            hits,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// The README's text with its paths and ports replaced by this test's.
    fn adapt(&self, text: &str, logs: &str, port: u16) -> String {
        text.replace("/srv/www", self.www.to_str().unwrap())
            .replace("/var/log/tern", self.path(logs).to_str().unwrap())
            .replace("/var/log/nginx", self.path(logs).to_str().unwrap())
            .replace("/var/log/caddy", self.path(logs).to_str().unwrap())
            .replace("127.0.0.1:3000", &self.wikis[0].to_string())
            .replace("127.0.0.1:3001", &self.wikis[1].to_string())
            .replace("0.0.0.0:80", &format!("127.0.0.1:{port}"))
            .replace("listen 80", &format!("listen 127.0.0.1:{port}"))
    }
}

/// What a request got: status, Location, HSTS, body.
type Answer = (u16, Option<String>, Option<String>, String);

/// One request with a Host, on a fresh connection.
fn ask(addr: SocketAddr, host: &str, path: &str) -> Answer {
    let mut c = Client::connect(addr);
    c.send(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes());
    let r = c.read_response(false);
    (
        r.status,
        r.header("location").map(str::to_owned),
        r.header("strict-transport-security").map(str::to_owned),
        r.text(),
    )
}

/// The requests both servers get, and what both must answer.
fn check_answers(addr: SocketAddr, who: &str) {
    let index = "<h1>example.org</h1>\n";
    let hsts = Some("max-age=63072000".to_string());
    let cases: Vec<(&str, &str, Answer)> = vec![
        ("example.org", "/", (200, None, hsts.clone(), index.into())),
        (
            "example.org",
            "/about.html",
            (200, None, hsts.clone(), "<p>about</p>\n".into()),
        ),
        ("example.org", "/healthz", (200, None, None, "ok\n".into())),
        (
            "EXAMPLE.org:80",
            "/",
            (200, None, hsts.clone(), index.into()),
        ),
        ("unknown.test", "/", (200, None, hsts.clone(), index.into())),
        (
            "example.org",
            "/blog/2024/post",
            (
                301,
                Some("https://blog.example.net".into()),
                None,
                String::new(),
            ),
        ),
        (
            "a.example.org",
            "/x?y=1",
            (
                308,
                Some("https://example.org/x?y=1".into()),
                None,
                String::new(),
            ),
        ),
    ];
    for (host, path, want) in cases {
        let mut got = ask(addr, host, path);
        if want.0 >= 300 {
            got.3 = String::new(); // redirect bodies are each server's own prose
        }
        assert_eq!(got, want, "{who}: Host {host}, {path}");
    }
    for i in 0..4 {
        let (status, _, _, body) = ask(addr, "wiki.example.org", &format!("/page/{i}"));
        assert_eq!(status, 200, "{who}: {body}");
        assert!(body.starts_with("wiki "), "{who}: {body}");
        assert!(
            body.ends_with(&format!(
                "/page/{i} host=wiki.example.org xff=127.0.0.1 proto=http\n"
            )),
            "{who}: {body}"
        );
    }
}

#[test]
fn the_readme_tern_config_runs_and_answers_as_its_nginx_config() {
    let setup = Setup::new();
    // tern
    let conf = setup.path("tern.toml");
    std::fs::write(&conf, setup.adapt(&readme_block("toml"), "tern-logs", 0)).unwrap();
    let mut cmd = Command::new(TERN);
    cmd.arg("run")
        .arg("--config")
        .arg(&conf)
        .args(["--workers", "2", "--sandbox", "on"]);
    let tern = Tern::spawn(cmd);
    check_answers(tern.addr(), "tern");
    let (a, b) = (
        setup.hits[0].load(Ordering::SeqCst),
        setup.hits[1].load(Ordering::SeqCst),
    );
    assert!(a > 0 && b > 0, "both wiki servers were used: {a} and {b}");
    // The main site's lines in its own log, the others in the shared one.
    let www = std::fs::read_to_string(setup.path("tern-logs/www.log"));
    assert!(
        eventually(Duration::from_secs(3), || {
            std::fs::read_to_string(setup.path("tern-logs/www.log"))
                .is_ok_and(|t| t.lines().count() >= 6)
                && std::fs::read_to_string(setup.path("tern-logs/access.log"))
                    .is_ok_and(|t| t.lines().count() >= 5)
        }),
        "{www:?}"
    );
    let shared = std::fs::read_to_string(setup.path("tern-logs/access.log")).unwrap();
    assert!(
        shared
            .lines()
            .all(|l| l.contains("example.org\"") && !l.contains("\"example.org\"")),
        "{shared}"
    );
    drop(tern);

    // nginx, if installed (scripts/install-gate-test-deps).
    let port = free_port();
    let http = setup.adapt(&readme_block("nginx"), "nginx-logs", port);
    let Some(nginx) = Nginx::start(&setup.path("nginx"), &http, port) else {
        return;
    };
    check_answers(nginx.addr, "nginx");
}

#[test]
fn the_readme_caddyfile_is_valid() {
    let setup = Setup::new();
    let file = setup.path("Caddyfile");
    std::fs::write(&file, setup.adapt(&readme_block("caddy"), "caddy-logs", 0)).unwrap();
    if let Some(Err(e)) = caddy_validate(&file, setup.tmp.path()) {
        panic!("{e}");
    }
}
