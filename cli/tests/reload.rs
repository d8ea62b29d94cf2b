//! `SIGHUP` reloads (`tern serve --config FILE`), config-file start-up errors, rate-limited
//! abuse logging, and `tern run`'s reload over its control socket (`tern reload`,
//! `control_group`), against the real binary.

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

// ---------------------------------------------------------------------------------------------
// `tern run`: reload over the control socket (`tern reload`), and `control_group`
// ---------------------------------------------------------------------------------------------

/// A `tern run` config in a folder of its own, its control socket beside it.
struct RunFiles {
    tmp: tempfile::TempDir,
}

impl RunFiles {
    fn new() -> RunFiles {
        RunFiles {
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self) -> PathBuf {
        self.tmp.path().join("tern.toml")
    }

    fn control(&self) -> PathBuf {
        self.tmp.path().join("control.sock")
    }

    /// The file: `control` and `top` (more top-level keys), then one site answering each of
    /// `routes` (path, body) with a fixed answer. Written as an editor would (new file,
    /// rename).
    fn write(&self, top: &str, routes: &[(&str, &str)]) {
        let mut text = format!("control = {:?}\n{top}\n", self.control().to_str().unwrap());
        text.push_str("[[site]]\nname = \"a\"\ndefault = true\n");
        for (path, body) in routes {
            text.push_str(&format!(
                "[[site.route]]\npath = {path:?}\nrespond = \"{body}\\n\"\n"
            ));
        }
        let tmp = self.tmp.path().join("tern.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.config()).unwrap();
    }

    fn start(&self) -> Tern {
        Tern::start_run(&self.config())
    }

    /// `tern reload --control SOCKET`, bounded.
    fn tern_reload(&self) -> Failed {
        run_to_end(&mut self.tern_reload_command(), Duration::from_secs(60))
    }

    fn tern_reload_command(&self) -> Command {
        let mut cmd = Command::new(TERN);
        cmd.args(["reload", "--control"]).arg(self.control());
        cmd
    }
}

/// The lines of `tern`'s stderr that log a reload asked over the control socket, once there
/// are `n` of them.
fn socket_reload_lines(tern: &Tern, n: usize) -> Vec<String> {
    let found = eventually(Duration::from_secs(10), || {
        tern.log_lines("reload (control socket)").len() >= n
    });
    assert!(
        found,
        "fewer than {n} control socket reloads logged; stderr:\n{}",
        tern.stderr_text()
    );
    tern.log_lines("reload (control socket)")
}

/// The one line a failed `tern` command prints, which must be all of its stderr.
fn one_error_line(f: &Failed) -> String {
    assert!(!f.status.success(), "exited successfully: {}", f.stdout);
    assert_eq!(f.status.code(), Some(1), "stderr:\n{}", f.stderr);
    let lines: Vec<&str> = f.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", f.stderr);
    assert!(f.stdout.is_empty(), "{}", f.stdout);
    lines[0].to_owned()
}

#[test]
fn tern_reload_applies_a_change_and_a_broken_config_is_answered_with_error_changing_nothing() {
    let files = RunFiles::new();
    files.write("", &[("/", "one")]);
    let tern = files.start();
    let mut kept = tern.client();
    assert_eq!(kept.get("/", &[]).text(), "one\n");
    assert_eq!(
        kept.get("/two", &[]).text(),
        "one\n",
        "the / route takes it"
    );

    // A new route: applied before `tern reload` returns, on the open connection too.
    files.write("", &[("/", "one"), ("/two", "two")]);
    let done = files.tern_reload();
    assert!(done.status.success(), "{}{}", done.stdout, done.stderr);
    assert_eq!(
        done.stdout,
        "1 site (2 routes) (was 1 site (1 route)); cached files dropped\n"
    );
    assert_eq!(kept.get("/two", &[]).text(), "two\n");
    assert_eq!(tern.get("/two").text(), "two\n");
    let logged = socket_reload_lines(&tern, 1);
    assert!(
        logged[0].contains("reload (control socket): 1 site (2 routes)"),
        "{}",
        logged[0]
    );

    // A broken file: the answer is `error` with the reason, the exit status 1, and the
    // running table stays whole.
    files.write("rooot = \"b\"", &[("/", "changed"), ("/three", "three")]);
    let refused = files.tern_reload();
    let line = one_error_line(&refused);
    assert!(
        line.starts_with("tern: reload failed: config ")
            && line.contains("tern.toml: line 2: unknown key \"rooot\""),
        "{line}"
    );
    let answer = request_line(&files.control(), "reload");
    assert!(
        answer.starts_with("error config ") && answer.contains("unknown key \"rooot\""),
        "{answer}"
    );
    assert_eq!(kept.get("/", &[]).text(), "one\n");
    assert_eq!(kept.get("/two", &[]).text(), "two\n");
    assert_eq!(tern.get("/three").text(), "one\n", "no half-applied table");
    let logged = socket_reload_lines(&tern, 3);
    assert!(
        logged[1].contains("reload (control socket) failed, nothing changed: config ")
            && logged[2].contains("failed, nothing changed"),
        "{logged:#?}"
    );

    // SIGHUP still reloads, and names itself.
    files.write("", &[("/", "one"), ("/two", "two"), ("/three", "three")]);
    let line = tern.reload(1);
    assert!(
        line.contains("1 site (3 routes) (was 1 site (2 routes))"),
        "{line}"
    );
    assert_eq!(tern.get("/three").text(), "three\n");
    // One line per reload, and none of them named for the other trigger.
    assert_eq!(tern.log_lines("reload (control socket)").len(), 3);
    assert_eq!(tern.log_lines("reload (SIGHUP)").len(), 1);
}

/// One request line to a control socket, by hand; its answer line.
fn request_line(control: &Path, line: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(control).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.trim_end().to_owned()
}

#[test]
fn tern_reload_without_a_server_is_one_line_and_exit_status_1() {
    let files = RunFiles::new();
    let line = one_error_line(&files.tern_reload());
    assert!(
        line.contains("cannot reach a server's control socket at")
            && line.contains(files.control().to_str().unwrap()),
        "{line}"
    );
    // A socket no server answers on (left by one that was killed) is no different.
    drop(std::os::unix::net::UnixListener::bind(files.control()).unwrap());
    let line = one_error_line(&files.tern_reload());
    assert!(line.contains("Connection refused"), "{line}");
}

#[test]
fn reloads_asked_together_over_the_socket_and_by_sighup_each_run_whole() {
    const ASKERS: usize = 3;
    const EACH: usize = 4;
    let files = RunFiles::new();
    files.write("", &[("/", "one")]);
    let tern = files.start();
    let pid = tern.pid();
    let signals = std::thread::spawn(move || {
        for _ in 0..10 {
            // SAFETY: kill(2) on the pid of a child this test holds.
            unsafe { libc::kill(pid, libc::SIGHUP) };
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let askers: Vec<_> = (0..ASKERS)
        .map(|_| {
            let mut cmd = files.tern_reload_command();
            std::thread::spawn(move || {
                (0..EACH)
                    .map(|_| run_to_end(&mut cmd, Duration::from_secs(60)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    signals.join().unwrap();
    for asker in askers {
        for done in asker.join().unwrap() {
            assert!(done.status.success(), "{}", done.stderr);
            assert_eq!(done.stdout, "1 site (1 route); cached files dropped\n");
        }
    }
    // Each socket reload ran and logged once; the signals (which may fold together) too,
    // and none failed.
    assert_eq!(
        socket_reload_lines(&tern, ASKERS * EACH).len(),
        ASKERS * EACH
    );
    assert!(eventually(Duration::from_secs(10), || !tern
        .log_lines("reload (SIGHUP)")
        .is_empty()));
    assert!(
        tern.log_lines("failed").is_empty(),
        "{}",
        tern.stderr_text()
    );
    assert_eq!(tern.get("/").text(), "one\n");
}

/// The id of a group in /etc/group.
fn etc_group_id(name: &str) -> u32 {
    std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .find_map(|l| {
            let mut fields = l.split(':');
            (fields.next() == Some(name)).then(|| fields.nth(1).unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no group {name} in /etc/group"))
}

#[test]
fn a_control_group_socket_is_the_groups_mode_0660_and_its_members_may_reload() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root (to give the socket to a group tern is not in)");
        return;
    }
    let files = RunFiles::new();
    // Others may pass through the folder to the socket: the socket's own mode decides.
    std::fs::set_permissions(files.tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    files.write("control_group = \"daemon\"", &[("/", "one")]);
    let tern = files.start();
    let meta = std::fs::metadata(files.control()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), etc_group_id("daemon"));
    assert_eq!(meta.uid(), 0, "the user tern started as");

    // A member of the group (here its only group) reloads; someone outside it may not.
    files.write(
        "control_group = \"daemon\"",
        &[("/", "one"), ("/two", "two")],
    );
    let mut as_member = files.tern_reload_command();
    as_member
        .uid(etc_group_id("daemon"))
        .gid(etc_group_id("daemon"));
    let done = run_to_end(&mut as_member, Duration::from_secs(60));
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stdout.starts_with("1 site (2 routes)"),
        "{}",
        done.stdout
    );
    assert_eq!(tern.get("/two").text(), "two\n");
    let mut as_other = files.tern_reload_command();
    as_other.uid(65534).gid(65534);
    let line = one_error_line(&run_to_end(&mut as_other, Duration::from_secs(60)));
    assert!(line.contains("Permission denied"), "{line}");

    // The group is fixed at start-up: a reload that changes it says so, and applies the rest.
    files.write("control_group = \"root\"", &[("/", "changed")]);
    let done = files.tern_reload();
    assert!(
        done.stdout
            .contains("control or control_group need(s) a restart (ignored)"),
        "{}{}",
        done.stdout,
        done.stderr
    );
    assert_eq!(tern.get("/").text(), "changed\n");
    assert_eq!(
        std::fs::metadata(files.control()).unwrap().gid(),
        etc_group_id("daemon")
    );
}

#[test]
fn an_unknown_control_group_is_one_line_from_check_and_at_start() {
    let files = RunFiles::new();
    files.write(
        "control_group = \"no-such-group-tern-test\"",
        &[("/", "one")],
    );
    let want = "tern.toml: line 2: control_group: no such group: no-such-group-tern-test";
    let mut check = Command::new(TERN);
    check
        .args(["run", "--check", "--config"])
        .arg(files.config());
    let line = one_error_line(&run_to_end(&mut check, Duration::from_secs(30)));
    assert!(line.contains(want), "{line}");
    let mut start = Command::new(TERN);
    start
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(files.config());
    let failed = run_to_end(&mut start, Duration::from_secs(30));
    let line = one_error_line(&failed);
    assert!(line.contains(want), "{line}");
    assert!(!files.control().exists(), "no socket made");
}
