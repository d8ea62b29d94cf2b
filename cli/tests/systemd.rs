//! Running under systemd, against the real binary: socket activation through
//! `systemd-socket-activate` (one socket; two named ones, http and https), sd_notify messages
//! to a datagram socket the test binds (ready, reloading, stopping, watchdog), JSON log lines,
//! and the unit files in `dist/` checked by `systemd-analyze verify`.

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{support, tls_support};
use support::*;
use tls_support::{any_cert_config, TlsClient};

const ACTIVATE: &str = "systemd-socket-activate";

fn have_activate() -> bool {
    have(ACTIVATE, "--version")
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `systemd-socket-activate -l 127.0.0.1:PORT --fdname=NAME ... tern serve DIR ARGS...`.
/// The tool binds the sockets, waits for the first connection and then executes tern with
/// `LISTEN_FDS` (and `LISTEN_FDNAMES` when names are given) for its own pid.
fn activated_serve(sockets: &[(u16, Option<&str>)], dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(ACTIVATE);
    for (port, name) in sockets {
        cmd.arg("-l").arg(format!("127.0.0.1:{port}"));
        if let Some(name) = name {
            cmd.arg(format!("--fdname={name}"));
        }
    }
    cmd.arg(TERN).arg("serve").arg(dir).args(args);
    cmd
}

/// Sends a GET for `path` on `port` from a thread as soon as the port accepts connections;
/// that connection is what makes `systemd-socket-activate` start tern. Returns the answer.
fn first_request(port: u16, path: &'static str) -> std::thread::JoinHandle<Resp> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let stream = loop {
            match TcpStream::connect(local(port)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("{port}: {e}"),
            }
        };
        Client::over(stream).get(path, &[])
    })
}

#[test]
fn one_inherited_socket_replaces_the_configured_listener() {
    if !have_activate() {
        return;
    }
    let site = Site::new();
    site.write("hello.txt", "hello from an inherited socket\n");
    let port = free_port();
    let first = first_request(port, "/hello.txt");
    // The configured --listen is never bound: only the inherited socket is served.
    let tern = Tern::spawn(activated_serve(
        &[(port, None)],
        &site.root,
        &["--listen", "127.0.0.1:1", "--workers", "2"],
    ));
    assert_eq!(
        tern.listeners,
        vec![Listener::Http(local(port))],
        "{}",
        tern.line
    );
    let resp = first.join().unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "hello from an inherited socket\n");
    // Both workers take connections from the one socket; many in a row all get answers.
    for _ in 0..20 {
        assert_eq!(tern.get("/hello.txt").status, 200);
    }
    assert!(
        !tern
            .log_lines("socket activation: serving 1 inherited socket")
            .is_empty(),
        "{}",
        tern.stderr_text()
    );
    // The inherited descriptor itself was made close-on-exec and non-blocking.
    let fdinfo = std::fs::read_to_string(format!("/proc/{}/fdinfo/3", tern.pid())).unwrap();
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
        .unwrap();
    assert_eq!(
        flags & libc::O_CLOEXEC as u32,
        libc::O_CLOEXEC as u32,
        "{fdinfo}"
    );
    assert_eq!(
        flags & libc::O_NONBLOCK as u32,
        libc::O_NONBLOCK as u32,
        "{fdinfo}"
    );
}

#[test]
fn named_sockets_serve_http_and_https() {
    if !have_activate() {
        return;
    }
    let site = Site::new();
    site.write("who.txt", "both ways\n");
    let (http, https) = (free_port(), free_port());
    let first = first_request(http, "/who.txt");
    // --listen-tls and --listen name other addresses: the names decide.
    let tern = Tern::spawn(activated_serve(
        &[(https, Some("https")), (http, Some("http"))],
        &site.root,
        &[
            "--tls-self-signed",
            "--listen",
            "127.0.0.1:1",
            "--listen-tls",
            "127.0.0.1:2",
        ],
    ));
    assert_eq!(
        tern.listeners,
        vec![Listener::Https(local(https)), Listener::Http(local(http))],
        "{}",
        tern.line
    );
    assert_eq!(first.join().unwrap().text(), "both ways\n");
    let config = Arc::new(any_cert_config(&[&rustls::version::TLS13]));
    let mut tls = TlsClient::connect_tls(local(https), &config, "localhost");
    let resp = tls.get("/who.txt", &[]);
    assert_eq!((resp.status, resp.text().as_str()), (200, "both ways\n"));
    // Plain HTTP on the HTTPS socket is refused as on a configured HTTPS listener.
    let plain = Client::connect(local(https)).get("/who.txt", &[]);
    assert_eq!(plain.status, 400);
}

/// Runs an activated tern expected to fail at start-up (after the triggering connection).
fn activated_failure(sockets: &[(u16, Option<&str>)], args: &[&str]) -> Failed {
    let site = Site::new();
    let port = sockets[0].0;
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(local(port)).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    run_to_end(
        &mut activated_serve(sockets, &site.root, args),
        Duration::from_secs(15),
    )
}

#[test]
fn an_ambiguous_socket_is_a_one_line_start_up_error() {
    if !have_activate() {
        return;
    }
    // Plain and HTTPS configured, the socket neither named nor on a configured address.
    let failed = activated_failure(
        &[(free_port(), None)],
        &["--tls-self-signed", "--listen", "127.0.0.1:1"],
    );
    assert!(!failed.status.success());
    let ours: Vec<&str> = failed
        .stderr
        .lines()
        .filter(|l| l.starts_with("tern: "))
        .collect();
    assert_eq!(ours.len(), 1, "{}", failed.stderr);
    assert!(ours[0].contains("name it http or https"), "{}", ours[0]);
    assert!(failed.stdout.is_empty(), "{}", failed.stdout);
}

#[test]
fn an_https_socket_without_a_certificate_is_an_error() {
    if !have_activate() {
        return;
    }
    let failed = activated_failure(&[(free_port(), Some("https"))], &[]);
    assert!(!failed.status.success());
    assert!(
        failed.stderr.contains("no certificate is configured"),
        "{}",
        failed.stderr
    );
}

#[test]
fn a_datagram_socket_is_refused() {
    if !have_activate() {
        return;
    }
    let site = Site::new();
    let port = free_port();
    let mut cmd = Command::new(ACTIVATE);
    cmd.args(["--datagram", "-l"])
        .arg(format!("127.0.0.1:{port}"))
        .arg(TERN)
        .arg("serve")
        .arg(&site.root);
    std::thread::spawn(move || {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..100 {
            let _ = udp.send_to(b"wake up", local(port));
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let failed = run_to_end(&mut cmd, Duration::from_secs(15));
    assert!(!failed.status.success());
    assert!(
        failed.stderr.contains("is not a listening TCP socket"),
        "{}",
        failed.stderr
    );
}

#[test]
fn listen_fds_for_another_pid_are_ignored() {
    let site = Site::new();
    // Descriptor 3 is not even open in tern: taking it would fail start-up.
    let mut cmd = serve_command(&site.root, LISTEN, &[] as &[&str]);
    cmd.env("LISTEN_PID", "1").env("LISTEN_FDS", "1");
    let tern = Tern::spawn(cmd);
    assert_eq!(tern.get("/").status, 404);
    assert!(tern.log_lines("socket activation").is_empty());
}

/// What a test's notify socket received, with when.
#[derive(Clone)]
struct Notifications {
    got: Arc<Mutex<Vec<(Instant, String)>>>,
    _dir: Arc<tempfile::TempDir>,
    path: std::path::PathBuf,
}

impl Notifications {
    /// Binds a datagram socket in a temporary directory and records everything sent to it.
    fn listen() -> Notifications {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = socket.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock().unwrap().push((Instant::now(), text));
            }
        });
        Notifications {
            got,
            _dir: Arc::new(dir),
            path,
        }
    }

    fn all(&self) -> Vec<String> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// The messages other than `WATCHDOG=1`, in order.
    fn states(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|m| m != "WATCHDOG=1")
            .collect()
    }

    fn watchdog_times(&self) -> Vec<Instant> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, m)| m == "WATCHDOG=1")
            .map(|(t, _)| *t)
            .collect()
    }

    fn wait_states(&self, n: usize) -> Vec<String> {
        let arrived = eventually(Duration::from_secs(5), || self.states().len() >= n);
        assert!(arrived, "expected {n} notifications, got {:?}", self.all());
        self.states()
    }
}

fn monotonic_usec_now() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the variable passed.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

#[test]
fn notify_ready_reloading_stopping_and_watchdog() {
    let notes = Notifications::listen();
    let site = Site::new();
    let mut cmd = serve_command(&site.root, LISTEN, &[] as &[&str]);
    cmd.env("NOTIFY_SOCKET", &notes.path)
        .env("WATCHDOG_USEC", "200000");
    let mut tern = Tern::spawn(cmd);

    let states = notes.wait_states(1);
    let status = format!("READY=1\nSTATUS={}", tern.line);
    assert_eq!(states, [status.as_str()], "ready after the start-up line");

    // Every 100 ms (half of WATCHDOG_USEC) while the workers turn, idle as they are.
    std::thread::sleep(Duration::from_millis(1000));
    let beats = notes.watchdog_times();
    assert!(beats.len() >= 5, "{} watchdog pings in 1 s", beats.len());
    let longest = beats.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(longest < Duration::from_millis(200), "a gap of {longest:?}");

    let before = monotonic_usec_now();
    tern.reload(1);
    let states = notes.wait_states(3);
    let reloading = &states[1];
    let usec: u64 = reloading
        .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
        .unwrap_or_else(|| panic!("{reloading:?}"))
        .parse()
        .unwrap();
    assert!(
        usec >= before && usec <= monotonic_usec_now(),
        "MONOTONIC_USEC {usec} not between {before} and now"
    );
    assert_eq!(states[2], "READY=1");

    tern.signal(libc::SIGTERM);
    let states = notes.wait_states(4);
    assert_eq!(states[3], "STOPPING=1");
    let status = tern.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    // The watchdog stopped with the shutdown (one ping may have been on its way).
    let stopping_at = notes
        .got
        .lock()
        .unwrap()
        .iter()
        .find(|(_, m)| m == "STOPPING=1")
        .unwrap()
        .0;
    let after = notes
        .watchdog_times()
        .into_iter()
        .filter(|t| *t > stopping_at)
        .count();
    assert!(after <= 1, "{after} watchdog pings after STOPPING=1");
}

#[test]
fn no_watchdog_for_another_pid_and_an_abstract_notify_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("tern-systemd-test-{}", std::process::id());
    let socket = UnixDatagram::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap(),
    )
    .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(600)))
        .unwrap();
    let site = Site::new();
    let mut cmd = serve_command(&site.root, LISTEN, &[] as &[&str]);
    cmd.env("NOTIFY_SOCKET", format!("@{name}"))
        .env("WATCHDOG_USEC", "100000")
        .env("WATCHDOG_PID", "1");
    let _tern = Tern::spawn(cmd);
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .expect("READY=1 over the abstract socket");
    assert!(buf[..n].starts_with(b"READY=1\n"));
    // WATCHDOG_PID names another process: no pings (every 50 ms otherwise).
    match socket.recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("expected silence, got {other:?}"),
    }
}

#[test]
fn json_log_lines_parse() {
    let site = Site::new();
    let mut tern = site.start(&["--log-format", "json"]);
    // A bad request is logged (rate-limited) with its cause.
    let mut c = tern.client();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nbad header\r\n\r\n");
    assert_eq!(c.read_response(false).status, 400);
    tern.signal(libc::SIGTERM);
    assert!(tern.wait_exit(Duration::from_secs(10)).is_some());
    let stderr = tern.stderr_text();
    let mut messages = Vec::new();
    for line in stderr.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(value["timestamp"].is_string(), "{line}");
        assert!(value["level"].is_string(), "{line}");
        messages.push(value["message"].as_str().unwrap_or_default().to_owned());
    }
    assert!(messages.iter().any(|m| m == "stopped"), "{stderr}");
    assert!(messages.len() >= 3, "{stderr}");
}

#[test]
fn json_start_up_errors_are_json_too() {
    let site = Site::new();
    let cmd = serve_command(&site.root, LISTEN, &["--log-format", "json"]);
    // LISTEN_PID must be ours for LISTEN_FDS to count: a shell sets it to its own pid and
    // then becomes tern.
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg("LISTEN_PID=$$ exec \"$0\" \"$@\"")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env("LISTEN_FDS", "many");
    let failed = run_to_end(&mut shell, Duration::from_secs(10));
    assert!(!failed.status.success());
    let lines: Vec<&str> = failed.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", failed.stderr);
    let value: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(value["level"], "ERROR");
    let message = value["message"].as_str().unwrap();
    assert!(message.contains("LISTEN_FDS=\"many\""), "{message}");
}

/// The units in `dist/` (`tern.service`, `tern@.service`, `tern.socket`,
/// `tern-https.socket`), with `ExecStart` pointing at the built binary (verify checks that it
/// exists), must pass `systemd-analyze verify` without a warning (an unknown key or a bad value
/// is only a warning there, and its exit status stays 0). The man pages they name are the
/// package's (`--man=no`); scripts/test-deb runs them under a real systemd.
#[test]
fn unit_files_verify() {
    if !have("systemd-analyze", "--version") {
        return;
    }
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist");
    let tmp = tempfile::tempdir().unwrap();
    let units = [
        "tern.socket",
        "tern-https.socket",
        "tern.service",
        "tern@.service",
    ];
    for unit in units {
        let text = std::fs::read_to_string(dist.join(unit)).unwrap();
        assert!(
            text.contains("ExecStart=/usr/bin/tern ") || unit.ends_with(".socket"),
            "{unit}: the test rewrites this path"
        );
        // Every command must exist on a minimal system: /bin/kill (procps) does not.
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("Exec") && l.contains("/bin/kill")),
            "{unit}"
        );
        let text = text.replace("/usr/bin/tern", TERN);
        std::fs::write(tmp.path().join(unit), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(units.map(|unit| tmp.path().join(unit)))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Lines about the test machine, not about our units: this container runs no systemd.
    let about_us: Vec<&str> = stderr.lines().filter(|l| l.contains("tern")).collect();
    assert!(
        out.status.success() && about_us.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

/// With `--log-format json` the start-up line on stdout is a JSON object too (under systemd
/// stdout reaches the journal as stderr does), its `message` the usual text.
#[test]
fn json_start_up_line_is_json_on_stdout() {
    use std::io::BufRead;
    let site = Site::new();
    let mut cmd = serve_command(&site.root, LISTEN, &["--log-format", "json"]);
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let value: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
    assert_eq!(value["level"], "INFO", "{line}");
    assert!(value["timestamp"].is_string(), "{line}");
    let message = value["message"].as_str().unwrap();
    assert!(parse_startup_line(message).is_some(), "{message}");
}

/// A pipe whose write end stands for the journal's stream: returns (read end, write end,
/// `JOURNAL_STREAM` naming the write end).
fn journal_like_pipe() -> (std::fs::File, std::os::fd::OwnedFd, String) {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::MetadataExt;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors it creates, which are owned below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created by pipe2 and are owned nowhere else.
    let (read, write) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    let meta = std::fs::File::from(write.try_clone().unwrap())
        .metadata()
        .unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    (read, write, stream)
}

/// Under systemd (`JOURNAL_STREAM` names stderr), each line carries its syslog level, `<3>`
/// error, `<4>` warning, `<6>` info, which journald turns into the entry's priority (and
/// strips): `journalctl -p warning` then finds warnings. The JSON after it is intact.
#[test]
fn journal_lines_carry_their_syslog_level() {
    use std::io::BufRead;
    let site = Site::new();
    let (read, write, stream) = journal_like_pipe();
    // Far more connections than any open-file limit: the start-up warns about the limit.
    let mut cmd = serve_command(
        &site.root,
        LISTEN,
        &["--log-format", "json", "--max-connections", "100000000"],
    );
    let child = cmd
        .env("JOURNAL_STREAM", &stream)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(write))
        .spawn()
        .unwrap();
    // The command holds the pipe's write end until dropped: no end of file before that.
    drop(cmd);
    let mut tern_child = KillOnDrop(child);
    // Lines as they come, from a thread: a missing start-up line fails the test, never hangs it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(read).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.contains("tern: serving")) {
        match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(line) => lines.push(line),
            Err(e) => panic!("no start-up line ({e}): {lines:#?}"),
        }
    }
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(tern_child.0.id() as i32, libc::SIGTERM) };
    // The sender ends with the pipe: once tern and its threads exit.
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(15)) {
        lines.push(line);
    }
    assert!(tern_child.0.wait().unwrap().success());
    let mut levels = Vec::new();
    for line in &lines {
        let (prefix, json) = line
            .split_at_checked(3)
            .unwrap_or_else(|| panic!("{line:?}"));
        let value: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        let level = value["level"].as_str().unwrap().to_owned();
        let want = match level.as_str() {
            "ERROR" => "<3>",
            "WARN" => "<4>",
            "INFO" => "<6>",
            _ => "<7>",
        };
        assert_eq!(prefix, want, "{line}");
        levels.push(level);
    }
    assert!(levels.iter().any(|l| l == "WARN"), "{lines:#?}");
    assert!(
        levels.iter().filter(|l| *l == "INFO").count() >= 3,
        "{lines:#?}"
    );

    // Text, failing at start-up: the reason is an error for the journal too.
    let (read, write, stream) = journal_like_pipe();
    let mut cmd = serve_command(&site.root.join("missing"), LISTEN, &[] as &[&str]);
    let status = cmd
        .env("JOURNAL_STREAM", &stream)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(write))
        .status()
        .unwrap();
    drop(cmd);
    assert!(!status.success());
    let text = std::io::read_to_string(read).unwrap();
    let last = text.lines().last().unwrap_or_default();
    assert!(last.starts_with("<3>tern: "), "{text}");

    // A JOURNAL_STREAM naming another stream (inherited from a parent): no prefixes.
    let (_read, _write, other) = journal_like_pipe();
    let failed = run_to_end(
        serve_command(&site.root.join("missing"), LISTEN, &[] as &[&str])
            .env("JOURNAL_STREAM", &other),
        Duration::from_secs(10),
    );
    assert!(
        failed
            .stderr
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("tern: "),
        "{}",
        failed.stderr
    );
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
