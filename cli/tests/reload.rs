//! `SIGHUP` reloads (`tern serve --config FILE`), config-file start-up errors, and rate-limited
//! abuse logging, against the real binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support;
use support::*;

/// `tmp/a` and `tmp/b` with different content, and `tmp/tern.toml`.
struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["a", "b"] {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("who.txt"), format!("site {name}\n")).unwrap();
            std::fs::write(dir.join("index.html"), format!("<p>{name}</p>\n")).unwrap();
        }
        Dirs { tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn config(&self) -> PathBuf {
        self.path("tern.toml")
    }

    /// Rewrites the config file the way an editor or deploy tool would (new file, rename).
    fn write_config(&self, text: &str) {
        let tmp = self.path("tern.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.config()).unwrap();
    }
}

/// `tern serve ARGS... --listen 127.0.0.1:0` (no `--workers`: the config file may set it).
fn serve(args: &[&str]) -> Command {
    let mut cmd = Command::new(TERN);
    cmd.arg("serve").args(args).args(LISTEN);
    cmd
}

/// [`serve`], waiting for the start-up line.
fn start(args: &[&str]) -> Tern {
    Tern::spawn(serve(args))
}

fn config_for(root: &Path, extra: &str) -> String {
    format!("root = {:?}\n{extra}", root.to_str().unwrap())
}

#[test]
fn sighup_switches_root_on_an_open_keep_alive_connection() {
    let dirs = Dirs::new();
    write_pattern_file(&dirs.path("a/big.bin"), 32 << 20);
    dirs.write_config(&config_for(&dirs.path("a"), "workers = 2\n"));
    let tern = start(&["--config", dirs.config().to_str().unwrap()]);

    let mut kept = tern.client();
    let r = kept.get("/who.txt", &[]);
    assert_eq!(r.text(), "site a\n");
    assert!(r.header("cache-control").is_none());
    assert!(!r.closes());

    // A download from A is under way across the reload.
    let mut download = tern.client();
    download.small_receive_buffer(128 << 10);
    download.send(&request_bytes("GET", "/big.bin", &[]));
    let head = download.read_head_only();
    assert_eq!(head.status, 200);
    let first = download.read_exact_raw(1 << 20);
    check_pattern(&first, 0);

    // Relative root: taken from the config file's directory. Workers need a restart.
    dirs.write_config(
        "root = \"b\"\nworkers = 3\ncache_control = \"no-store\"\nidle_timeout = 30\n",
    );
    let line = tern.reload(1);
    assert!(line.contains("root "), "{line}");
    assert!(
        line.contains("cache_control none -> \"no-store\""),
        "{line}"
    );
    assert!(line.contains("idle_timeout 60 -> 30"), "{line}");
    assert!(
        line.contains("workers 2 -> 3 need(s) a restart (ignored)"),
        "{line}"
    );
    assert!(line.contains("cached files dropped"), "{line}");

    // The same connection, open across the reload, now sees B, with B's options.
    let r = kept.get("/who.txt", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "site b\n", "stale file after reload");
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(kept.get("/", &[]).text(), "<p>b</p>\n");
    assert_eq!(tern.client().get("/who.txt", &[]).text(), "site b\n");
    assert_eq!(kept.get("/big.bin", &[]).status, 404, "B has no big.bin");

    // The download from A finishes intact.
    let mut got = first.len() as u64;
    while got < 32 << 20 {
        let n = ((32u64 << 20) - got).min(4 << 20) as usize;
        let chunk = download.read_exact_raw(n);
        check_pattern(&chunk, got);
        got += n as u64;
    }
    // Still two workers: the ignored part really was ignored.
    assert!(
        tern.log_lines("failed").is_empty(),
        "{}",
        tern.stderr_text()
    );
}

#[test]
fn bad_config_on_sighup_keeps_serving_and_logs_the_error() {
    let dirs = Dirs::new();
    dirs.write_config(&config_for(&dirs.path("a"), ""));
    let tern = start(&["--config", dirs.config().to_str().unwrap()]);
    let mut c = tern.client();
    assert_eq!(c.get("/who.txt", &[]).text(), "site a\n");

    // An unknown key: nothing changes, one error line naming file, line and key.
    dirs.write_config("cache_control = \"no-store\"\n\nrooot = \"b\"\n");
    let line = tern.reload(1);
    assert!(line.contains("failed, nothing changed"), "{line}");
    assert!(
        line.contains("tern.toml: line 3: unknown key \"rooot\""),
        "{line}"
    );
    let r = c.get("/who.txt", &[]);
    assert_eq!(r.text(), "site a\n");
    assert!(r.header("cache-control").is_none(), "half-applied reload");

    // A root that cannot be served: the old one is kept.
    dirs.write_config("root = \"missing\"\ncache_control = \"no-store\"\n");
    let line = tern.reload(2);
    assert!(line.contains("failed, nothing changed"), "{line}");
    assert!(line.contains("missing"), "{line}");
    let r = c.get("/who.txt", &[]);
    assert_eq!(r.text(), "site a\n");
    assert!(r.header("cache-control").is_none(), "half-applied reload");

    // A bad value.
    dirs.write_config("root = \"b\"\nheader_timeout = \"soon\"\n");
    let line = tern.reload(3);
    assert!(line.contains("line 2: header_timeout"), "{line}");
    assert_eq!(c.get("/who.txt", &[]).text(), "site a\n");

    // Fixed: the next SIGHUP applies it, on the same connection.
    dirs.write_config("root = \"b\"\n");
    let line = tern.reload(4);
    assert!(!line.contains("failed"), "{line}");
    assert_eq!(c.get("/who.txt", &[]).text(), "site b\n");
}

#[test]
fn sighup_without_config_sees_a_replaced_directory_at_once() {
    let dirs = Dirs::new();
    let site = dirs.path("a");
    let tern = start(&[site.to_str().unwrap()]);
    let mut c = tern.client();
    assert_eq!(c.get("/who.txt", &[]).text(), "site a\n");
    assert_eq!(c.get("/who.txt", &[]).text(), "site a\n");

    // A deploy swaps a new directory in under the same path.
    let next = dirs.path("next");
    std::fs::create_dir(&next).unwrap();
    std::fs::write(next.join("who.txt"), "site next\n").unwrap();
    std::fs::rename(&site, dirs.path("a.old")).unwrap();
    std::fs::rename(&next, &site).unwrap();

    let line = tern.reload(1);
    assert!(line.contains("no setting changed"), "{line}");
    assert!(line.contains("cached files dropped"), "{line}");
    assert_eq!(c.get("/who.txt", &[]).text(), "site next\n");
}

#[test]
fn flags_override_the_config_file() {
    let dirs = Dirs::new();
    dirs.write_config(&config_for(
        &dirs.path("a"),
        "cache_control = \"from-file\"\nserve_dotfiles = false\n",
    ));
    std::fs::write(dirs.path("b/.env"), "dot\n").unwrap();
    let tern = start(&[
        dirs.path("b").to_str().unwrap(),
        "--config",
        dirs.config().to_str().unwrap(),
        "--serve-dotfiles",
    ]);
    let mut c = tern.client();
    let r = c.get("/who.txt", &[]);
    assert_eq!(r.text(), "site b\n", "DIR wins over root");
    assert_eq!(r.header("cache-control"), Some("from-file"));
    assert_eq!(c.get("/.env", &[]).text(), "dot\n");
    // On reload too, the flags keep winning.
    dirs.write_config(&config_for(
        &dirs.path("a"),
        "cache_control = \"changed\"\n",
    ));
    let line = tern.reload(1);
    assert!(!line.contains("root"), "{line}");
    let r = c.get("/who.txt", &[]);
    assert_eq!(r.text(), "site b\n");
    assert_eq!(r.header("cache-control"), Some("changed"));
}

fn assert_one_line_error(f: &Failed, want: &str) {
    assert!(
        !f.status.success(),
        "exited successfully; stderr:\n{}",
        f.stderr
    );
    let lines: Vec<&str> = f
        .stderr
        .lines()
        .filter(|l| l.starts_with("tern: "))
        .collect();
    assert_eq!(lines.len(), 1, "stderr:\n{}", f.stderr);
    assert!(lines[0].contains(want), "{:?} lacks {want:?}", lines[0]);
    assert!(!f.stdout.contains("serving"), "{}", f.stdout);
}

fn start_failing(args: &[&str]) -> Failed {
    run_to_end(&mut serve(args), Duration::from_secs(10))
}

#[test]
fn bad_config_files_are_one_line_start_up_errors() {
    let dirs = Dirs::new();
    let cfg = dirs.config();
    let cfg_s = cfg.to_str().unwrap();
    let cases = [
        (
            "root = \"a\"\nserve_dotfiles = true\nrooot = \"b\"\n",
            "tern.toml: line 3: unknown key \"rooot\"",
        ),
        ("root = \"a\"\nmax_body = \"big\"\n", "line 2: max_body: "),
        (
            "root = \"a\"\nworkers = 0\n",
            "line 2: workers must be at least 1",
        ),
        ("root = \"a\"\nlisten = \"nowhere\"\n", "line 2: listen: "),
        ("root = \"a\"\nroot = \"b\"\n", "line 2: "),
        ("root = \n", "line 1: "),
        ("serve_dotfiles = true\n", "no directory to serve"),
        ("root = \"missing\"\n", "missing"),
    ];
    for (text, want) in cases {
        dirs.write_config(text);
        let f = start_failing(&["--config", cfg_s]);
        assert_one_line_error(&f, want);
        assert!(
            f.stderr.contains(&format!("tern: config {cfg_s}: ")) || !want.starts_with("line"),
            "{}",
            f.stderr
        );
    }
    let f = start_failing(&["--config", dirs.path("nope.toml").to_str().unwrap()]);
    assert_one_line_error(&f, "nope.toml: cannot read");
}

#[test]
fn bad_request_flood_is_logged_rate_limited() {
    let dirs = Dirs::new();
    let tern = start(&[dirs.path("a").to_str().unwrap(), "--workers", "1"]);
    const FLOOD: usize = 300;
    for _ in 0..FLOOD {
        let mut c = tern.client();
        // Malformed HTTP/1 (a space in the target). Bytes that name no HTTP version at all are
        // closed without an answer instead (they may be a broken HTTP/2 preface).
        c.send(b"GET /a b HTTP/1.1\r\n\r\n");
        let r = c.read_response(false);
        assert_eq!(r.status, 400);
    }
    // One worker: at most 5 lines per second for this cause, then a summary.
    assert!(
        eventually(Duration::from_secs(5), || !tern
            .log_lines("suppressed")
            .is_empty()),
        "no summary line; stderr:\n{}",
        tern.stderr_text()
    );
    let logged = tern.log_lines("bad request: bad request line");
    assert!(!logged.is_empty(), "bad requests are not logged at all");
    assert!(
        logged.len() <= 5 * 4,
        "{} lines for {FLOOD} bad requests",
        logged.len()
    );
    assert!(
        logged[0].contains("127.0.0.1:"),
        "no peer address: {}",
        logged[0]
    );
    let summary = &tern.log_lines("suppressed")[0];
    assert!(
        summary.contains("similar messages (bad_request_line)"),
        "{summary}"
    );
    // The server is fine.
    assert_eq!(tern.client().get("/who.txt", &[]).text(), "site a\n");
    // stderr is a pipe here, not a terminal: no colour codes go into logs.
    assert!(
        !tern.stderr_text().contains('\u{1b}'),
        "ANSI escapes in a log that is not a terminal"
    );
}
