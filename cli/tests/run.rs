//! `tern run --config FILE` against the real binary: sites chosen by Host (exact, wildcard,
//! default, 421) over HTTP/1.1, HTTP/2 and TLS with a certificate per SNI name; routes by
//! path prefix on segment boundaries; every route kind; header edits; `--check` and its line
//! numbers; SIGHUP swapping the site table under an open connection, and bad reloads
//! changing nothing.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::{h2_support, support, tls_support};
use h2_support::*;
use support::*;
use tls_support::*;

/// `conf/tern.toml` beside `sites/a` and `sites/b` (each with `index.html` and `who.txt`), so
/// the sandbox allows `conf/` and `sites/` and nothing else of the temporary folder.
struct Files {
    tmp: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("conf")).unwrap();
        for name in ["a", "b"] {
            let dir = tmp.path().join("sites").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("who.txt"), format!("site {name}\n")).unwrap();
            std::fs::write(dir.join("index.html"), format!("<p>{name}</p>\n")).unwrap();
        }
        Files { tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn config(&self) -> PathBuf {
        self.path("conf/tern.toml")
    }

    /// Writes the config (replacing it by rename, as editors do).
    fn write_config(&self, text: &str) {
        let tmp = self.path("conf/tern.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.config()).unwrap();
    }

    fn start(&self, text: &str) -> Tern {
        self.write_config(text);
        let tern = Tern::spawn(run_command(&self.config(), &[] as &[&str]));
        assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
        tern
    }
}

/// `tern run --config FILE --workers 2 [--sandbox on] EXTRA...`.
fn run_command<S: AsRef<OsStr>>(config: &Path, extra: &[S]) -> Command {
    let mut cmd = Command::new(TERN);
    cmd.arg("run").arg("--config").arg(config);
    cmd.args(["--workers", "2"]);
    if std::env::var_os("TERN_TEST_SANDBOX").as_deref() != Some(OsStr::new("off")) {
        cmd.args(["--sandbox", "on"]);
    }
    cmd.args(extra);
    cmd
}

/// `tern run --check --config FILE`, to its end.
fn check(config: &Path) -> Failed {
    let mut cmd = Command::new(TERN);
    cmd.arg("run").arg("--check").arg("--config").arg(config);
    run_to_end(&mut cmd, Duration::from_secs(20))
}

/// One GET with this Host (the support client always sends `Host: test`).
fn get_host<S: Transport>(c: &mut Client<S>, host: &str, path: &str) -> Resp {
    c.send(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    c.read_response(false)
}

fn host_get(tern: &Tern, host: &str, path: &str) -> Resp {
    get_host(&mut tern.client(), host, path)
}

const THREE_SITES: &str = r#"
listen = "127.0.0.1:0"

[[site]]
name = "a"
hosts = ["a.test"]
[[site.route]]
path = "/"
static = "../sites/a"

[[site]]
name = "wild"
hosts = ["*.wild.test"]
[[site.route]]
path = "/"
respond = "wild\n"

[[site]]
name = "www"
hosts = ["www.wild.test"]
[[site.route]]
path = "/"
respond = "www\n"
"#;

#[test]
fn hosts_choose_sites_exact_then_wildcard_else_421() {
    let files = Files::new();
    let tern = files.start(THREE_SITES);
    assert!(
        tern.line.contains("3 sites (3 routes)"),
        "start-up line {:?}",
        tern.line
    );
    for host in ["a.test", "A.Test", "a.test:8080", "a.test."] {
        let r = host_get(&tern, host, "/who.txt");
        assert_eq!((r.status, r.text().as_str()), (200, "site a\n"), "{host}");
    }
    for (host, want) in [
        ("x.wild.test", "wild\n"),
        ("X.WILD.test:1", "wild\n"),
        ("www.wild.test", "www\n"),
    ] {
        let r = host_get(&tern, host, "/");
        assert_eq!((r.status, r.text().as_str()), (200, want), "{host}");
    }
    for host in ["wild.test", "a.b.wild.test", "b.test", "127.0.0.1"] {
        assert_eq!(host_get(&tern, host, "/who.txt").status, 421, "{host}");
    }
    // HTTP/1.0 may leave Host out: that is no known host either.
    let mut c = tern.client();
    c.send(b"GET /who.txt HTTP/1.0\r\n\r\n");
    assert_eq!(c.read_response(false).status, 421);
}

#[test]
fn unknown_hosts_get_the_default_site_when_there_is_one() {
    let files = Files::new();
    let tern =
        files.start(&THREE_SITES.replace("name = \"www\"\n", "name = \"www\"\ndefault = true\n"));
    for host in ["b.test", "wild.test", "127.0.0.1:9"] {
        let r = host_get(&tern, host, "/");
        assert_eq!((r.status, r.text().as_str()), (200, "www\n"), "{host}");
    }
    let mut c = tern.client();
    c.send(b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "www\n");
    assert_eq!(host_get(&tern, "a.test", "/who.txt").text(), "site a\n");
}

#[test]
fn routes_by_prefix_on_segment_boundaries_with_every_kind_and_header_edits() {
    let files = Files::new();
    std::fs::write(files.path("sites/a/apple"), "an apple\n").unwrap();
    std::fs::create_dir(files.path("sites/a/app")).unwrap();
    std::fs::write(files.path("sites/a/app/file.txt"), "never served\n").unwrap();
    let tern = files.start(
        r#"
listen = "127.0.0.1:0"
[[site]]
name = "k"
hosts = ["k.test"]

[[site.route]]
path = "/"
static = "../sites/a"
cache_control = "public, max-age=5"
add_headers = { "Strict-Transport-Security" = "max-age=100", "Content-Security-Policy" = "default-src 'self'" }
remove_headers = ["ETag"]

[[site.route]]
path = "/cached"
static = "../sites/a"
cache_control = "public, max-age=5"
add_headers = { "Cache-Control" = "no-store" }

[[site.route]]
path = "/app/"
respond = "the app\n"
status = 201
content_type = "text/x-app"

[[site.route]]
path = "/app/plain"
respond = "no type\n"
remove_headers = ["Content-Type"]

[[site.route]]
path = "/old"
redirect = "https://new.test/base/"
status = 301

[[site.route]]
path = "/gone"
redirect = "/"
status = 302
keep_path = false
"#,
    );
    let get = |path: &str| host_get(&tern, "k.test", path);

    let r = get("/who.txt");
    assert_eq!((r.status, r.text().as_str()), (200, "site a\n"));
    assert!(r.has("strict-transport-security", "max-age=100"), "{r:?}");
    assert!(
        r.has("content-security-policy", "default-src 'self'"),
        "{r:?}"
    );
    assert!(r.has("cache-control", "public, max-age=5"), "{r:?}");
    assert_eq!(r.header("etag"), None, "removed: {r:?}");
    assert!(r.header("last-modified").is_some(), "{r:?}");
    // A set header replaces the handler's own (`header` panics on a second one).
    let r = get("/cached/who.txt");
    assert_eq!(r.status, 404, "the full path is looked up under the root");
    std::fs::create_dir(files.path("sites/a/cached")).unwrap();
    std::fs::write(files.path("sites/a/cached/x.txt"), "cached x\n").unwrap();
    let r = get("/cached/x.txt");
    assert_eq!((r.status, r.text().as_str()), (200, "cached x\n"));
    assert!(r.has("cache-control", "no-store"), "{r:?}");
    assert!(
        r.header("strict-transport-security").is_none(),
        "edits are per route"
    );

    // Segment boundaries: /app and /app/x are the app route, /apple is not.
    for path in ["/app", "/app/", "/app/file.txt", "/app/x?y=1"] {
        let r = get(path);
        assert_eq!((r.status, r.text().as_str()), (201, "the app\n"), "{path}");
        assert!(r.has("content-type", "text/x-app"), "{path}: {r:?}");
    }
    let r = get("/apple");
    assert_eq!((r.status, r.text().as_str()), (200, "an apple\n"));
    // The longest prefix wins, and removal reaches the route's own fields.
    let r = get("/app/plain");
    assert_eq!((r.status, r.text().as_str()), (200, "no type\n"));
    assert_eq!(r.header("content-type"), None, "{r:?}");

    let r = get("/old/page?x=1");
    assert_eq!(r.status, 301);
    assert!(
        r.has("location", "https://new.test/base/old/page?x=1"),
        "{r:?}"
    );
    let r = get("/gone/deep/path");
    assert_eq!(r.status, 302);
    assert!(r.has("location", "/"), "{r:?}");
    // /oldies is not under /old.
    assert_eq!(get("/oldies").status, 404);
}

#[test]
fn the_game_runs_on_its_own_host() {
    let files = Files::new();
    let tern = files.start(
        r#"
listen = "127.0.0.1:0"
[[site]]
name = "a"
hosts = ["a.test"]
[[site.route]]
path = "/"
static = "../sites/a"

[[site]]
name = "game"
hosts = ["game.test"]
[[site.route]]
path = "/"
app = "ipv4-games"
data = "../data"
add_headers = { "X-Frame-Options" = "DENY" }
"#,
    );
    assert!(files.path("data/journal-0000000001.log").exists());
    let r = host_get(&tern, "game.test", "/ip");
    assert_eq!((r.status, r.text().as_str()), (200, "127.0.0.1\n"));
    assert!(r.has("x-frame-options", "DENY"), "{r:?}");
    let mut c = tern.client();
    c.send(b"GET /claim/runner HTTP/1.1\r\nHost: game.test\r\nAccept: text/plain\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.text(), "127.0.0.1 is now claimed by runner\n");
    assert_eq!(host_get(&tern, "game.test", "/").status, 200, "the pages");
    // The game's routes are not on the other site.
    assert_eq!(host_get(&tern, "a.test", "/ip").status, 404);
    assert_eq!(host_get(&tern, "a.test", "/who.txt").text(), "site a\n");
}

#[test]
fn tls_picks_a_certificate_per_sni_name_and_the_site_by_host_over_h1_and_h2() {
    let files = Files::new();
    let ca = Ca::new();
    let leaf_a = ca.issue("a", &["a.test"]);
    let leaf_b = ca.issue("b", &["b.test"]);
    leaf_a.write(&files.path("conf"), "a");
    leaf_b.write(&files.path("conf"), "b");
    let tern = files.start(
        r#"
listen = "127.0.0.1:0"
[tls]
listen = "127.0.0.1:0"
[[tls.certificates]]
cert = "a.pem"
key = "a.key"
[[tls.certificates]]
cert = "b.pem"
key = "b.key"

[[site]]
name = "a"
hosts = ["a.test"]
[[site.route]]
path = "/"
static = "../sites/a"

[[site]]
name = "b"
hosts = ["b.test"]
[[site.route]]
path = "/"
static = "../sites/b"
add_headers = { "Strict-Transport-Security" = "max-age=31536000" }
"#,
    );
    let config = Arc::new(client_config(&ca, &[TLS13, TLS12]));
    for (name, leaf) in [("a.test", &leaf_a), ("b.test", &leaf_b)] {
        let mut c = tern.tls(&config, name);
        assert_eq!(which(&c.leaf(), &[&leaf_a, &leaf_b]), leaf.label, "{name}");
        let r = get_host(&mut c, name, "/who.txt");
        let want = format!("site {}\n", &name[..1]);
        assert_eq!((r.status, r.text()), (200, want), "{name}");
        assert_eq!(
            r.header("strict-transport-security").is_some(),
            name == "b.test",
            "{r:?}"
        );
        // The site follows Host: an unknown one inside a good session is 421.
        assert_eq!(get_host(&mut c, "c.test", "/who.txt").status, 421);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // HTTP/2 over TLS: :authority (b.test:PORT) chooses the site.
        let mut h2 = H2Conn::tls(tern.https(), &alpn_config(&ca, &["h2"]), "b.test")
            .await
            .expect("ALPN h2");
        let r = h2.get("/who.txt", &[]).await;
        assert_eq!((r.status, r.text().as_str()), (200, "site b\n"));
        assert!(r.has("strict-transport-security", "max-age=31536000"));
        // HTTP/2 with prior knowledge on the plain port, :authority set per connection.
        for (authority, status, body) in [
            ("A.TEST:80", 200, "site a\n"),
            ("b.test", 200, "site b\n"),
            ("nobody.test", 421, ""),
        ] {
            let mut h2 = H2Conn::h2c(tern.addr()).await;
            h2.authority = authority.to_string();
            let r = h2.get("/who.txt", &[]).await;
            assert_eq!(r.status, status, "{authority}");
            if status == 200 {
                assert_eq!(r.text(), body, "{authority}");
            }
        }
    });
}

#[test]
fn check_accepts_a_good_file_with_a_one_line_summary() {
    let files = Files::new();
    files.write_config(THREE_SITES);
    let out = check(&files.config());
    assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{:?}", out.stdout);
    assert!(
        lines[0].contains(
            ": ok: 3 sites, 3 routes, unknown hosts get 421; listening on http://127.0.0.1:0"
        ),
        "{}",
        lines[0]
    );
    assert_eq!(out.stderr, "");
}

#[test]
fn check_lists_every_problem_with_its_line_and_fails() {
    let files = Files::new();
    files.write_config(
        r#"listen = "127.0.0.1:0"
[[site]]
name = "a"
hosts = ["a.test", "*bad.test"]
default = true
[[site.route]]
path = "/"
static = "../sites/missing"
[[site]]
name = "a"
default = true
hosts = ["b.test"]
[[site.route]]
path = "nope"
redirect = "https://a.test"
status = 200
[[site.route]]
path = "/api"
proxy = "127.0.0.1"
"#,
    );
    let out = check(&files.config());
    assert!(!out.status.success());
    assert_eq!(out.stdout, "");
    let config = files.config().display().to_string();
    for want in [
        "line 4: host \"*bad.test\" is a bad wildcard",
        "line 8: static root ",
        "line 10: site name \"a\" is already used (line 3)",
        "line 11: two default sites: \"a\" (line 5) and \"a\"",
        "line 14: path \"nope\" must start with /",
        "line 16: status 200 is not a redirect",
        "line 19: upstream \"127.0.0.1\": give host:port, [v6]:port or unix:/path",
    ] {
        let line = format!("config {config}: {want}");
        assert!(
            out.stderr.lines().any(|l| l.starts_with(&line)),
            "no {line:?} in:\n{}",
            out.stderr
        );
    }
    assert!(
        out.stderr.trim_end().ends_with("7 problems"),
        "{}",
        out.stderr
    );
    // An unknown key stops at once, with its line.
    files.write_config(
        "listen = \"127.0.0.1:0\"\n\n[[site]]\nname = \"a\"\nhostname = \"a.test\"\n",
    );
    let out = check(&files.config());
    assert!(!out.status.success());
    assert!(
        out.stderr.contains(&format!(
            "config {config}: line 5: unknown key \"hostname\""
        )),
        "{}",
        out.stderr
    );
    // And a file that does not run does not start either.
    let out = run_to_end(
        &mut run_command(&files.config(), &[] as &[&str]),
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("unknown key \"hostname\""),
        "{}",
        out.stderr
    );
}

#[test]
fn io_in_the_file_picks_the_sockets_backend_and_the_flag_or_its_env_wins() {
    let files = Files::new();
    files.write_config(&format!("io = \"uring\"\n{THREE_SITES}"));
    let out = check(&files.config());
    assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
    // With io_uring missing, the file's `uring` refuses to start: the key reached the runtime.
    let mut cmd = run_command(&files.config(), &[] as &[&str]);
    cmd.env("TERN_TEST_KERNEL_WITHOUT", "io_uring")
        .env_remove("TERN_IO");
    let out = run_to_end(&mut cmd, Duration::from_secs(10));
    assert!(!out.status.success());
    assert_eq!(
        out.stderr.lines().last(),
        Some("tern: cannot use io_uring: not in this kernel (TERN_TEST_KERNEL_WITHOUT) (--io auto falls back to epoll)"),
        "{}",
        out.stderr
    );
    // `--io`, or TERN_IO, wins over the file, as for `tern serve`.
    for (flag, env) in [(Some("epoll"), None), (None, Some("epoll"))] {
        let extra: Vec<&str> = flag.map(|io| vec!["--io", io]).unwrap_or_default();
        let mut cmd = run_command(&files.config(), &extra);
        cmd.env("TERN_TEST_KERNEL_WITHOUT", "io_uring")
            .env_remove("TERN_IO");
        if let Some(io) = env {
            cmd.env("TERN_IO", io);
        }
        let tern = Tern::spawn(cmd);
        assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
        let line = tern.log_lines("protections:");
        assert!(
            line.len() == 1 && line[0].ends_with("; sockets: epoll"),
            "{flag:?} {env:?}: {line:?}"
        );
        assert_eq!(host_get(&tern, "a.test", "/who.txt").text(), "site a\n");
    }
}

#[test]
fn the_shipped_example_passes_the_check() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tern.toml");
    let out = check(&example);
    assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains(": ok: 3 sites, 6 routes, default site \"www\"; listening on "),
        "{}",
        out.stdout
    );
}

#[test]
fn sighup_swaps_the_sites_under_an_open_connection() {
    let files = Files::new();
    let one = r#"
listen = "127.0.0.1:0"
[[site]]
name = "a"
hosts = ["a.test"]
[[site.route]]
path = "/"
static = "../sites/a"
"#;
    let tern = files.start(one);
    let mut kept = tern.client();
    assert_eq!(get_host(&mut kept, "a.test", "/who.txt").text(), "site a\n");
    assert_eq!(host_get(&tern, "b.test", "/who.txt").status, 421);

    let two = format!(
        "{one}\n[[site]]\nname = \"b\"\nhosts = [\"b.test\"]\n[[site.route]]\npath = \"/\"\nstatic = \"../sites/b\"\n"
    );
    files.write_config(&two);
    let line = tern.reload(1);
    assert!(
        line.contains("2 sites (2 routes) (was 1 site (1 route))"),
        "{line}"
    );
    assert_eq!(host_get(&tern, "b.test", "/who.txt").text(), "site b\n");
    // The connection opened before the reload goes on, and sees the new table.
    let r = get_host(&mut kept, "b.test", "/who.txt");
    assert_eq!((r.status, r.text().as_str()), (200, "site b\n"));
    assert!(!r.closes());
    assert_eq!(get_host(&mut kept, "a.test", "/who.txt").text(), "site a\n");

    // A bad file changes nothing, and says why in one line.
    files.write_config(&format!("{two}\nbogus = 1\n"));
    let line = tern.reload(2);
    assert!(line.contains("failed, nothing changed"), "{line}");
    assert!(line.contains("unknown key \"bogus\""), "{line}");
    assert_eq!(host_get(&tern, "b.test", "/who.txt").text(), "site b\n");
    assert_eq!(get_host(&mut kept, "a.test", "/who.txt").text(), "site a\n");

    // A root that is not there: the whole reload is refused, the other site too stays.
    files.write_config(&two.replace("../sites/b", "../sites/none"));
    let line = tern.reload(3);
    assert!(line.contains("failed, nothing changed"), "{line}");
    assert!(line.contains("sites/none does not exist"), "{line}");
    assert_eq!(host_get(&tern, "b.test", "/who.txt").text(), "site b\n");

    // What needs a restart is reported, the rest applied.
    files.write_config(&two.replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\""));
    let line = tern.reload(4);
    assert!(
        line.contains("listeners need(s) a restart (ignored)"),
        "{line}"
    );
    assert_eq!(get_host(&mut kept, "b.test", "/who.txt").text(), "site b\n");
}

#[test]
fn a_reload_outside_the_sandbox_is_refused_with_the_reason() {
    if std::env::var_os("TERN_TEST_SANDBOX").as_deref() == Some(OsStr::new("off")) {
        eprintln!("SKIPPED: TERN_TEST_SANDBOX=off");
        return;
    }
    let files = Files::new();
    let outside = files.path("outside/c");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("who.txt"), "site c\n").unwrap();
    let one = "listen = \"127.0.0.1:0\"\n[[site]]\nname = \"a\"\nhosts = [\"a.test\"]\n[[site.route]]\npath = \"/\"\nstatic = \"../sites/a\"\n";
    let tern = files.start(one);
    files.write_config(&one.replace("../sites/a", "../outside/c"));
    let line = tern.reload(1);
    assert!(line.contains("failed, nothing changed"), "{line}");
    assert!(
        line.contains("the sandbox allows only the paths given at start-up"),
        "{line}"
    );
    assert_eq!(host_get(&tern, "a.test", "/who.txt").text(), "site a\n");
}
