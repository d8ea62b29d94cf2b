//! Least privilege, end to end: the real binary behind Landlock and seccomp (`--sandbox`),
//! dropping to an unprivileged user (`--user`), with test-only probe routes
//! (`--sandbox-probes`) that try what the sandbox forbids.
//!
//! Every other integration test runs sandboxed too (the test support passes `--sandbox on`)
//! and fails if the sandbox refused any system call, so the whole suite checks that the
//! allow-list is enough for static files, HTTPS, HTTP/2, the game and reloads.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::{support, tls_support};
use support::*;
use tls_support::*;

const PROTECTED: &str =
    "protections: Landlock (fully enforced); seccomp allow-list (other system calls fail with EPERM)";

/// The start-up line naming the protections, without its last part (the sockets' backend,
/// checked by `io_uring_rings_exist_only_from_before_the_lockdown`).
fn protections(tern: &Tern) -> Vec<String> {
    tern.log_lines("protections:")
        .into_iter()
        .map(|l| match l.rfind("; sockets: ") {
            Some(i) => l[..i].to_string(),
            None => l,
        })
        .collect()
}

fn probe(tern: &Tern, what: &str) -> String {
    tern.get(&format!("/.tern-test/sandbox/{what}")).text()
}

#[test]
fn a_sandboxed_server_reaches_only_its_paths_and_system_calls() {
    let site = Site::new();
    site.write("index.html", "home\n");
    let mut tern = site.start(&["--sandbox-probes"]);
    tern.refusals_expected = &["execve"];
    assert_eq!(tern.log_lines(PROTECTED).len(), 1, "{}", tern.stderr_text());
    assert_eq!(tern.get("/").text(), "home\n");

    let inside = site.root.join("index.html");
    assert_eq!(probe(&tern, &format!("open?{}", inside.display())), "ok\n");
    // Landlock lets `tern serve` read the root's parent (where deploys swap roots), nothing
    // else: not another folder, not /etc.
    let elsewhere = tempfile::tempdir().unwrap();
    let secret = elsewhere.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let denied = "error: Permission denied (os error 13)\n";
    assert_eq!(probe(&tern, &format!("open?{}", secret.display())), denied);
    assert_eq!(probe(&tern, "open?/etc/hostname"), denied);
    // execve is not on the allow-list: EPERM, and the server lives on.
    assert_eq!(
        probe(&tern, "exec"),
        "error: Operation not permitted (os error 1)\n"
    );
    assert_eq!(tern.get("/").text(), "home\n");
    assert!(
        eventually(Duration::from_secs(5), || {
            tern.log_lines(
                "sandbox: refused system calls with EPERM since start-up: execve (59) ×1",
            )
            .len()
                == 1
        }),
        "no log line for the refused execve: {}",
        tern.stderr_text()
    );
}

#[test]
fn without_the_sandbox_the_same_probes_get_through() {
    let site = Site::new();
    let tern = site.start(&["--sandbox-probes", "--sandbox", "off"]);
    let line = protections(&tern);
    assert!(
        line.len() == 1 && line[0].ends_with("protections: no sandbox"),
        "{line:?}"
    );
    assert_eq!(probe(&tern, "open?/etc/hostname"), "ok\n");
    // The probe's path does not exist: without seccomp execve itself says so.
    assert_eq!(
        probe(&tern, "exec"),
        "error: No such file or directory (os error 2)\n"
    );
}

#[test]
fn the_game_plays_sandboxed_and_counts_refused_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut tern = Tern::start_demo(&data, &["--sandbox-probes"]);
    tern.refusals_expected = &["execve"];
    assert_eq!(tern.log_lines(PROTECTED).len(), 1, "{}", tern.stderr_text());
    let r = tern.get_with("/claim/sandboxed", &[("Accept", "text/plain")]);
    assert_eq!(r.text(), "127.0.0.1 is now claimed by sandboxed\n");
    assert_eq!(tern.statusz("sandbox_denied_syscalls"), 0);
    probe(&tern, "exec");
    probe(&tern, "exec");
    assert_eq!(tern.statusz("sandbox_denied_syscalls"), 2);
    let metrics = tern.get("/metrics").text();
    assert!(
        metrics.contains("\ntern_sandbox_denied_syscalls_total 2\n")
            || metrics.contains("\nsandbox_denied_syscalls 2\n"),
        "{metrics}"
    );
    // The database keeps working inside the sandbox: a second claim and a clean stop.
    let r = tern.get_with("/claim/again", &[("Accept", "text/plain")]);
    assert_eq!(r.text(), "127.0.0.1 is now claimed by again\n");
    tern.signal(libc::SIGTERM);
    let status = tern.wait_exit(Duration::from_secs(10)).expect("exits");
    assert!(status.success(), "{status:?}: {}", tern.stderr_text());
}

/// `Uid:` or `Gid:` of /proc/PID/status: real, effective, saved, filesystem.
fn proc_ids(pid: libc::pid_t, key: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    line[key.len()..]
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

fn uid_of(name: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd
        .lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .unwrap();
    let fields: Vec<&str> = line.split(':').collect();
    (fields[2].parse().unwrap(), fields[3].parse().unwrap())
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn started_as_root_it_runs_as_the_user_and_gives_it_the_data() {
    if !running_as_root() {
        eprintln!("skipped: needs root to drop privileges");
        return;
    }
    let (uid, gid) = uid_of("nobody");
    let tmp = tempfile::tempdir().unwrap();
    // nobody must be able to reach the data folder's parent.
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let data = tmp.path().join("data");
    let mut tern = Tern::start_demo(&data, &["--user", "nobody"]);
    assert!(
        tern.log_lines(&format!(
            "protections: running as nobody (uid {uid}, gid {gid}); Landlock"
        ))
        .len()
            == 1,
        "{}",
        tern.stderr_text()
    );
    assert!(tern.log_lines("running as root").is_empty());
    assert_eq!(proc_ids(tern.pid(), "Uid:"), vec![uid; 4]);
    assert_eq!(proc_ids(tern.pid(), "Gid:"), vec![gid; 4]);
    let groups = proc_ids(tern.pid(), "Groups:");
    assert_eq!(groups, vec![gid], "supplementary groups");

    let r = tern.get_with("/claim/nobody", &[("Accept", "text/plain")]);
    assert_eq!(r.text(), "127.0.0.1 is now claimed by nobody\n");
    for entry in std::fs::read_dir(&data).unwrap() {
        let entry = entry.unwrap();
        assert_eq!(entry.metadata().unwrap().uid(), uid, "{:?}", entry.path());
    }
    assert_eq!(std::fs::metadata(&data).unwrap().uid(), uid);
    tern.signal(libc::SIGTERM);
    let status = tern.wait_exit(Duration::from_secs(10)).expect("exits");
    assert!(status.success(), "{status:?}: {}", tern.stderr_text());

    // Started again as root, it warns that it keeps root without --user.
    let tern = Tern::start_demo(&data, &[]);
    assert_eq!(tern.log_lines("running as root: give --user NAME").len(), 1);
}

#[test]
fn an_unknown_user_or_group_is_a_one_line_start_up_error() {
    let site = Site::new();
    let failed = Tern::start_failing(&site.root, &["--user", "no-such-user-tern"]);
    assert!(!failed.status.success());
    assert_eq!(
        failed.stderr.trim_end(),
        "tern: no such user: no-such-user-tern"
    );
    let failed = Tern::start_failing(
        &site.root,
        &["--user", "nobody", "--group", "no-such-group-tern"],
    );
    assert!(!failed.status.success());
    assert!(
        failed
            .stderr
            .ends_with("tern: no such group: no-such-group-tern\n"),
        "{}",
        failed.stderr
    );
}

#[test]
fn a_reload_to_a_root_outside_the_sandbox_changes_nothing_and_says_why() {
    let site = Site::new();
    site.write("index.html", "first\n");
    // A root in a folder of its own, away from the first root's parent.
    let elsewhere = tempfile::tempdir().unwrap();
    let other = elsewhere.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("index.html"), "second\n").unwrap();
    let config = site.base().join("tern.toml");
    std::fs::write(&config, "root = \"site\"\n").unwrap();
    let mut cmd = std::process::Command::new(TERN);
    cmd.args([
        "serve",
        "--sandbox",
        "on",
        "--config",
        config.to_str().unwrap(),
    ])
    .args(LISTEN);
    let tern = Tern::spawn(cmd);
    assert_eq!(tern.get("/").text(), "first\n");
    std::fs::write(&config, format!("root = {:?}\n", other.to_str().unwrap())).unwrap();
    let line = tern.reload(1);
    assert!(
        line.contains("reload (SIGHUP) failed, nothing changed")
            && line.contains("the sandbox allows only the paths given at start-up"),
        "{line}"
    );
    assert_eq!(tern.get("/").text(), "first\n");
}

#[test]
fn on_a_kernel_without_landlock_on_refuses_to_start_and_the_default_says_what_is_missing() {
    let site = Site::new();
    let mut cmd = serve_command(&site.root, LISTEN, &["--sandbox", "on"]);
    cmd.env("TERN_TEST_KERNEL_WITHOUT", "landlock");
    let failed = run_to_end(&mut cmd, Duration::from_secs(10));
    assert!(!failed.status.success());
    assert!(
        failed.stderr.ends_with(
            "tern: cannot sandbox (--sandbox on): Landlock: not in this kernel (TERN_TEST_KERNEL_WITHOUT)\n"
        ),
        "{}",
        failed.stderr
    );
    assert_eq!(failed.stdout, "", "nothing was served");

    // The default starts with what there is and names what is missing.
    let mut cmd = serve_command(
        &site.root,
        LISTEN,
        &["--sandbox-probes", "--sandbox", "auto"],
    );
    cmd.env("TERN_TEST_KERNEL_WITHOUT", "landlock,seccomp");
    let tern = Tern::spawn(cmd);
    let line = protections(&tern);
    assert!(
        line.len() == 1 && line[0].ends_with("protections: no sandbox; without Landlock (not in this kernel (TERN_TEST_KERNEL_WITHOUT)), seccomp (not in this kernel (TERN_TEST_KERNEL_WITHOUT))"),
        "{line:?}"
    );
    assert_eq!(probe(&tern, "open?/etc/hostname"), "ok\n");
}

/// Certificates the way certbot keeps them, in a folder of their own: `live/` holds links to
/// files in `archive/`, and a renewal adds new files there and swaps the links. Landlock rules
/// bind to files, so the sandbox allows the folders (of the link and of its target): a SIGHUP
/// after a renewal serves the new certificate, also as an unprivileged user.
#[test]
fn a_renewed_certificate_is_served_after_sighup_inside_the_sandbox() {
    let site = Site::new();
    site.write("index.html", "home\n");
    let certs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        certs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (live, archive) = (certs.path().join("live"), certs.path().join("archive"));
    std::fs::create_dir(&live).unwrap();
    std::fs::create_dir(&archive).unwrap();
    let ca = Ca::new();
    let (first, second) = (
        ca.issue("first", &["localhost"]),
        ca.issue("second", &["localhost"]),
    );
    let link = |n: u32| {
        for (what, link) in [("cert", "fullchain.pem"), ("key", "privkey.pem")] {
            let tmp = live.join(format!("{link}.new"));
            std::os::unix::fs::symlink(format!("../archive/{what}{n}.pem"), &tmp).unwrap();
            std::fs::rename(&tmp, live.join(link)).unwrap();
        }
    };
    first.write_to(&archive.join("cert1.pem"), &archive.join("key1.pem"));
    link(1);
    let (cert, key) = (live.join("fullchain.pem"), live.join("privkey.pem"));
    let mut args = cert_key_args(&cert, &key);
    if running_as_root() {
        // The key stays readable by the user (as with certbot's group-readable setups).
        for f in ["key1.pem", "key2.pem"] {
            let path = archive.join(f);
            if path.exists() {
                std::fs::set_permissions(
                    &path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o644),
                )
                .unwrap();
            }
        }
        std::fs::set_permissions(
            site.base(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        args.extend(["--user".to_string(), "nobody".to_string()]);
    }
    let tern = Tern::serve_tls(&site.root, &args);
    let leaves = [&first, &second];
    let config = Arc::new(client_config(&ca, &[TLS13]));
    assert_eq!(
        which(&tern.tls(&config, "localhost").leaf(), &leaves),
        "first"
    );

    second.write_to(&archive.join("cert2.pem"), &archive.join("key2.pem"));
    std::fs::set_permissions(
        archive.join("key2.pem"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    link(2);
    let line = tern.reload(1);
    assert!(line.contains("certificates re-read"), "{line}");
    let mut c = tern.tls(&config, "localhost");
    assert_eq!(which(&c.leaf(), &leaves), "second");
    assert_eq!(c.get("/", &[]).text(), "home\n");
}

/// Root binds a port below 1024, then serves it as `nobody`.
#[test]
fn a_privileged_port_is_bound_as_root_and_served_as_the_user() {
    if !running_as_root() {
        eprintln!("skipped: needs root to bind a port below 1024");
        return;
    }
    let Some(port) = (700..1000).find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
    else {
        eprintln!("skipped: no free port below 1024");
        return;
    };
    let site = Site::new();
    site.write("index.html", "low\n");
    std::fs::set_permissions(
        site.base(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{port}");
    let tern = Tern::spawn(serve_command(
        &site.root,
        &["--listen", &listen],
        &["--user", "nobody"],
    ));
    assert_eq!(tern.addr().port(), port);
    assert_eq!(tern.get("/").text(), "low\n");
    let (uid, _) = uid_of("nobody");
    assert_eq!(proc_ids(tern.pid(), "Uid:"), vec![uid; 4]);
}

/// An app on 127.0.0.1 that answers every request with `body` (keep-alive).
fn app(body: &'static str) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || listener.incoming().for_each(|s| answer(s, body)));
    addr
}

/// The same app on a Unix socket.
fn unix_app(socket: &Path, body: &'static str) {
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || listener.incoming().for_each(|s| answer(s, body)));
}

/// Answers each request head on `stream` with `body`, on a thread of its own.
fn answer<S: std::io::Read + std::io::Write + Send + 'static>(
    stream: std::io::Result<S>,
    body: &'static str,
) {
    let Ok(mut stream) = stream else { return };
    std::thread::spawn(move || {
        let (mut buf, mut pending) = ([0u8; 4096], Vec::new());
        while let Ok(n @ 1..) = stream.read(&mut buf) {
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                pending.drain(..end + 4);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            }
        }
    });
}

/// `tern run` with one site whose `/` is proxied to `upstream`, sandboxed, with the probes.
struct ProxyConfig {
    dir: tempfile::TempDir,
}

impl ProxyConfig {
    fn new(upstream: &str) -> ProxyConfig {
        let config = ProxyConfig {
            dir: tempfile::tempdir().unwrap(),
        };
        config.write(upstream);
        config
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("tern.toml")
    }

    fn write(&self, upstream: &str) {
        let text = format!(
            "[[site]]\nname = \"app\"\ndefault = true\n[[site.route]]\npath = \"/\"\nproxy = \"{upstream}\"\n"
        );
        let new = self.dir.path().join("tern.toml.new");
        std::fs::write(&new, text).unwrap();
        std::fs::rename(&new, self.path()).unwrap();
    }

    fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(TERN);
        cmd.arg("run").arg("--config").arg(self.path());
        cmd.args(LISTEN)
            .args(["--workers", "1", "--sandbox", "on", "--sandbox-probes"]);
        cmd
    }

    fn start(&self) -> Tern {
        Tern::spawn(self.command())
    }
}

/// Issue #21, item 8: with a TCP upstream the workers reach its port and nothing else: not
/// another port (Landlock), not a Unix socket such as docker.sock (seccomp), and not another
/// port through TCP Fast Open, which Landlock does not see (seccomp).
#[test]
fn a_tcp_proxy_connects_only_to_its_upstream_ports() {
    let upstream = app("from the app\n");
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    other.set_nonblocking(true).unwrap();
    let other_addr = other.local_addr().unwrap();
    let sockets = tempfile::tempdir().unwrap();
    let docker = sockets.path().join("docker.sock");
    let _docker = std::os::unix::net::UnixListener::bind(&docker).unwrap();
    let config = ProxyConfig::new(&upstream.to_string());
    let mut tern = config.start();
    tern.refusals_expected = &["socket", "sendto"];
    assert_eq!(tern.log_lines(PROTECTED).len(), 1, "{}", tern.stderr_text());
    assert_eq!(tern.get("/").text(), "from the app\n");

    assert_eq!(probe(&tern, &format!("connect?{upstream}")), "ok\n");
    assert_eq!(
        probe(&tern, &format!("connect?{other_addr}")),
        "error: Permission denied (os error 13)\n"
    );
    let eperm = "error: Operation not permitted (os error 1)\n";
    assert_eq!(
        probe(&tern, &format!("connect-unix?{}", docker.display())),
        eperm
    );
    assert_eq!(probe(&tern, &format!("fast-open?{other_addr}")), eperm);
    assert!(other.accept().is_err(), "nothing reached the other port");
    assert_eq!(tern.get("/").text(), "from the app\n");
}

/// Issue #21, item 8: with only a `unix:` upstream no IPv4 or IPv6 socket can be made.
#[test]
fn a_unix_proxy_makes_no_tcp_socket() {
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("app.sock");
    unix_app(&socket, "over unix\n");
    let elsewhere = app("elsewhere\n");
    let config = ProxyConfig::new(&format!("unix:{}", socket.display()));
    let mut tern = config.start();
    tern.refusals_expected = &["socket"];
    assert_eq!(tern.get("/").text(), "over unix\n");
    assert_eq!(
        probe(&tern, &format!("connect?{elsewhere}")),
        "error: Operation not permitted (os error 1)\n"
    );
    assert_eq!(tern.get("/").text(), "over unix\n");
}

/// Issue #21, item 8: a reload that needs a port the sandbox did not allow at start-up
/// changes nothing and says to restart; the old upstream keeps serving.
#[test]
fn a_reload_to_an_upstream_port_outside_the_sandbox_says_restart() {
    let (first, moved) = (app("first\n"), app("moved\n"));
    let config = ProxyConfig::new(&first.to_string());
    let tern = config.start();
    assert_eq!(tern.get("/").text(), "first\n");
    config.write(&moved.to_string());
    let line = tern.reload(1);
    assert!(
        line.contains("reload (SIGHUP) failed, nothing changed: the upstream")
            && line.contains(&moved.to_string())
            && line.contains("restart tern"),
        "{line}"
    );
    assert_eq!(tern.get("/").text(), "first\n");
}

/// On a kernel whose Landlock has no TCP rules (before ABI 4, Linux 6.7) the start-up line
/// names what is missing, and the other port is indeed reachable.
#[test]
fn without_landlock_tcp_rules_the_start_up_line_says_any_port_is_reachable() {
    let upstream = app("from the app\n");
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ProxyConfig::new(&upstream.to_string());
    let mut cmd = config.command();
    cmd.env("TERN_TEST_KERNEL_WITHOUT", "landlock-tcp");
    let tern = Tern::spawn(cmd);
    let line = protections(&tern);
    assert!(
        line.len() == 1
            && line[0].ends_with("without Landlock TCP port rules (kernel ABI 3 < 4: the workers may connect to any TCP port)"),
        "{line:?}"
    );
    let other = other.local_addr().unwrap();
    assert_eq!(probe(&tern, &format!("connect?{other}")), "ok\n");
}

/// Issue #21, item 13: `openat2` carries its mode where seccomp cannot see it, so it is
/// answered ENOSYS: no setuid file can be made in a writable folder (here the access log's),
/// while static files are still served through the fallback.
#[test]
fn openat2_is_answered_enosys_so_no_setuid_file_can_be_made() {
    let site = Site::new();
    site.write("index.html", "home\n");
    let logs = site.base().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("access.log");
    let tern = site.start(&["--sandbox-probes", "--access-log", log.to_str().unwrap()]);
    assert_eq!(tern.get("/").text(), "home\n");
    let setuid = logs.join("setuid");
    assert_eq!(
        probe(&tern, &format!("openat2-setuid?{}", setuid.display())),
        "error: Function not implemented (os error 38)\n"
    );
    assert!(!setuid.exists(), "no file was made");
    assert_eq!(tern.get("/").text(), "home\n");
}

/// Issue #21, item 13: a root directly in /tmp opens that root, not all of /tmp.
#[test]
fn a_root_directly_in_a_system_folder_opens_only_itself() {
    let root = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    std::fs::write(root.path().join("index.html"), "home\n").unwrap();
    let neighbour = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let secret = neighbour.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let tern = Tern::start(root.path(), &["--sandbox-probes"]);
    assert_eq!(tern.get("/").text(), "home\n");
    assert_eq!(
        probe(&tern, &format!("open?{}", secret.display())),
        "error: Permission denied (os error 13)\n"
    );
}

/// Issue #21, item 13: what would open a system folder whole is a one-line start-up error:
/// serving /etc, or an access log directly in /tmp (its folder must take new files).
#[test]
fn a_system_folder_is_never_granted_whole_and_says_so_at_start_up() {
    let failed = run_to_end(
        &mut serve_command(Path::new("/etc"), LISTEN, &["--sandbox", "on"]),
        Duration::from_secs(10),
    );
    assert!(!failed.status.success());
    assert_eq!(
        failed.stderr,
        "tern: cannot sandbox: the folder to read /etc is a system folder, which the sandbox never opens whole: use a folder of its own, or --sandbox off\n"
    );
    assert_eq!(failed.stdout, "", "nothing was served");

    let site = Site::new();
    let log = std::path::PathBuf::from(format!("/tmp/tern-test-{}.log", std::process::id()));
    let failed = Tern::start_failing(&site.root, &["--access-log", log.to_str().unwrap()]);
    let _ = std::fs::remove_file(&log);
    assert!(!failed.status.success());
    assert_eq!(
        failed.stderr,
        "tern: cannot sandbox: the access log's folder /tmp is a system folder, which the sandbox never opens whole: use a folder of its own, or --sandbox off\n"
    );
}

/// io_uring under the sandbox: the workers' rings are made before lockdown (the start-up
/// line names the backend) and serve; a ring asked for afterwards is refused by seccomp, and
/// the server lives on. (What a ring itself may do is its allow-list, tested in
/// `runtime/src/io/uring/tests.rs`.)
#[test]
fn io_uring_rings_exist_only_from_before_the_lockdown() {
    let site = Site::new();
    site.write("index.html", "home\n");
    let mut tern = site.start(&["--sandbox-probes", "--io", "uring"]);
    tern.refusals_expected = &["io_uring_setup"];
    let line = tern.log_lines("protections:");
    assert!(
        line.len() == 1 && line[0].contains(PROTECTED) && line[0].ends_with("; sockets: io_uring"),
        "{line:?}"
    );
    assert_eq!(tern.get("/").text(), "home\n");
    assert_eq!(
        probe(&tern, "io-uring"),
        "error: io_uring_setup: Operation not permitted (os error 1)\n"
    );
    assert_eq!(tern.get("/").text(), "home\n");
}

/// `--io auto` on a kernel without io_uring (pretended, debug builds only) starts on epoll
/// and says why in the start-up line; `--io uring` refuses to start, in one line.
#[test]
fn without_io_uring_auto_falls_back_and_uring_refuses_to_start() {
    let site = Site::new();
    site.write("index.html", "home\n");
    let mut cmd = serve_command(&site.root, LISTEN, &["--io", "auto"]);
    cmd.env("TERN_TEST_KERNEL_WITHOUT", "io_uring");
    let tern = Tern::spawn(cmd);
    let line = tern.log_lines("protections:");
    assert!(
        line.len() == 1
            && line[0].ends_with(
                "; sockets: epoll (io_uring: not in this kernel (TERN_TEST_KERNEL_WITHOUT))"
            ),
        "{line:?}"
    );
    assert_eq!(tern.get("/").text(), "home\n");

    let mut cmd = serve_command(&site.root, LISTEN, &["--io", "uring"]);
    cmd.env("TERN_TEST_KERNEL_WITHOUT", "io_uring");
    let failed = run_to_end(&mut cmd, Duration::from_secs(10));
    assert!(!failed.status.success());
    assert_eq!(
        failed.stderr.lines().last(),
        Some("tern: cannot use io_uring: not in this kernel (TERN_TEST_KERNEL_WITHOUT) (--io auto falls back to epoll)"),
        "{}",
        failed.stderr
    );
}
