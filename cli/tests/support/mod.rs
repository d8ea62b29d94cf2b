//! Shared helpers for the end-to-end tests: start the real `tern` binary on an ephemeral port,
//! kill it on drop, and talk HTTP/1.1 to it over raw `TcpStream`s (the client is
//! tern-testkit's, re-exported here with the kit's other helpers).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use tern_testkit::http1::{set_int_option, small_receive_buffer};
pub use tern_testkit::pattern::{check_pattern, write_pattern_file};
pub use tern_testkit::{
    eventually, find, free_port, request_bytes, Client, Resp, Transport, READ_TIMEOUT,
};

pub const TERN: &str = env!("CARGO_BIN_EXE_tern");

/// A site in a temporary directory: `base/site` is served, `base/secret` sits just outside it.
pub struct Site {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
}

pub const SECRET: &[u8] = b"TOP-SECRET-c0ffee-7f3a9c-never-serve-me";

impl Site {
    pub fn new() -> Site {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("site");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(tmp.path().join("secret"), SECRET).unwrap();
        Site { tmp, root }
    }

    pub fn base(&self) -> &Path {
        self.tmp.path()
    }

    /// Writes `rel` (creating parent directories) under the root.
    pub fn write(&self, rel: &str, data: impl AsRef<[u8]>) -> PathBuf {
        let path = self.root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, data).unwrap();
        path
    }

    /// `n00.txt`, `n01.txt`, ... (`count` files), each `file number I\n`.
    pub fn write_numbered(&self, count: usize) {
        for i in 0..count {
            self.write(&format!("n{i:02}.txt"), format!("file number {i}\n"));
        }
    }

    pub fn start(&self, extra: &[&str]) -> Tern {
        Tern::start(&self.root, extra)
    }
}

/// A running `tern serve` or `tern demo` (plain HTTP, HTTPS or both), killed (SIGKILL) and
/// reaped when dropped.
pub struct Tern {
    pub child: Child,
    /// The start-up line, without its line end.
    pub line: String,
    /// The listeners the start-up line names, in its order.
    pub listeners: Vec<Listener>,
    /// The worker count the start-up line names.
    pub workers: usize,
    pub stderr: Drained,
    status: Option<ExitStatus>,
    /// System calls the sandbox may refuse in this test (it probes them on purpose); any
    /// other refusal in the log fails the test when the server is dropped.
    pub refusals_expected: &'static [&'static str],
}

/// One listener named in a start-up line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `http://ADDR`: plain HTTP (`--listen`).
    Http(SocketAddr),
    /// `https://ADDR` (`--listen-tls`).
    Https(SocketAddr),
    /// `http://ADDR (redirect to https)` (`--redirect-http`).
    Redirect(SocketAddr),
}

/// How a `tern` run that was expected to fail ended.
pub struct Failed {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// `--listen 127.0.0.1:0`: a plain HTTP listener on a free port.
pub const LISTEN: &[&str] = &["--listen", "127.0.0.1:0"];

impl Tern {
    /// `tern serve DIR --listen 127.0.0.1:0 --workers 2 EXTRA...`, waiting for the start-up line.
    pub fn start(dir: &Path, extra: &[&str]) -> Tern {
        Tern::start_with(dir, extra, None)
    }

    /// Like [`start`](Self::start); `fd_limit` runs tern under `ulimit -n LIMIT`. Checks that
    /// the start-up line names the canonical root, a plain listener and the worker count.
    pub fn start_with(dir: &Path, extra: &[&str], fd_limit: Option<u32>) -> Tern {
        let tern = Tern::spawn(command(Sub::Serve(dir), LISTEN, extra, fd_limit));
        let canonical = std::fs::canonicalize(dir).unwrap();
        assert!(
            tern.line
                .starts_with(&format!("tern: serving {} on ", canonical.display())),
            "start-up line {:?} names the canonical root {canonical:?}",
            tern.line
        );
        assert!(
            tern.http().is_some(),
            "no plain listener in {:?}",
            tern.line
        );
        let workers = match extra.iter().position(|a| *a == "--workers") {
            Some(i) => extra[i + 1].parse().unwrap(),
            None => 2,
        };
        assert_eq!(tern.workers, workers, "start-up line {:?}", tern.line);
        tern
    }

    /// Runs `tern serve` expecting it to fail at start-up; returns how it ended.
    pub fn start_failing(dir: &Path, extra: &[&str]) -> Failed {
        run_to_end(
            &mut command(Sub::Serve(dir), LISTEN, extra, None),
            Duration::from_secs(10),
        )
    }

    /// `tern run --config CONF` on a free port, one worker, sandboxed.
    pub fn start_run(conf: &Path) -> Tern {
        Tern::start_run_workers(conf, 1)
    }

    /// `tern run --config CONF` on a free port with `workers` workers, sandboxed.
    pub fn start_run_workers(conf: &Path, workers: usize) -> Tern {
        let mut cmd = Command::new(TERN);
        cmd.arg("run").arg("--config").arg(conf).args([
            "--listen",
            "127.0.0.1:0",
            "--workers",
            &workers.to_string(),
            "--sandbox",
            "on",
        ]);
        Tern::spawn(cmd)
    }

    /// `tern demo --data DATA --listen 127.0.0.1:0 --workers 2 EXTRA...` (the IPv4 Games),
    /// waiting for the start-up line.
    pub fn start_demo(data: &Path, extra: &[&str]) -> Tern {
        let tern = Tern::spawn(demo_command(data, LISTEN, extra));
        assert!(
            tern.line.starts_with("tern: IPv4 Games (data in ") && tern.http().is_some(),
            "start-up line {:?}",
            tern.line
        );
        tern
    }

    /// `start_demo` with no file allowed past `max_file_bytes` (RLIMIT_FSIZE, SIGXFSZ
    /// ignored): writes past it fail (EFBIG) the way writes to a full disk fail (ENOSPC).
    pub fn start_demo_limited(data: &Path, extra: &[&str], max_file_bytes: u64) -> Tern {
        use std::os::unix::process::CommandExt;
        let mut cmd = demo_command(data, LISTEN, extra);
        // SAFETY: the closure runs between fork and exec and makes only async-signal-safe
        // calls (setrlimit, signal) on values it owns.
        unsafe {
            cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: max_file_bytes,
                    rlim_max: max_file_bytes,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
        let tern = Tern::spawn(cmd);
        assert!(tern.http().is_some(), "start-up line {:?}", tern.line);
        tern
    }

    /// Runs `tern demo` expecting it to fail at start-up; returns how it ended.
    pub fn demo_failing(data: &Path, extra: &[&str]) -> Failed {
        run_to_end(
            &mut demo_command(data, LISTEN, extra),
            Duration::from_secs(10),
        )
    }

    /// Spawns `cmd` (a `tern serve` or `tern demo` command line) and waits (15 s at most) for
    /// its start-up line, which must parse (see [`parse_startup_line`]).
    pub fn spawn(mut cmd: Command) -> Tern {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("TERN_LOG");
        let mut child = cmd.spawn().expect("spawn tern");
        let stderr = drain(child.stderr.take().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so tern can never block on a full stdout pipe.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let mut tern = Tern {
            child,
            line: String::new(),
            listeners: Vec::new(),
            workers: 0,
            stderr,
            status: None,
            refusals_expected: &[],
        };
        // (On a panic, Drop kills the process.)
        let Ok(line) = rx.recv_timeout(Duration::from_secs(15)) else {
            panic!(
                "tern printed no start-up line within 15 s; stderr:\n{}",
                tern.stderr_text()
            )
        };
        tern.line = startup_message(line.trim_end());
        let Some((listeners, workers)) = parse_startup_line(&tern.line) else {
            let status = tern.wait_exit(Duration::from_secs(2));
            panic!(
                "unexpected start-up line {:?} (exit {status:?}); stderr:\n{}",
                tern.line,
                tern.stderr_text()
            );
        };
        tern.listeners = listeners;
        tern.workers = workers;
        tern
    }

    fn find_listener(&self, pick: impl Fn(&Listener) -> Option<SocketAddr>) -> Option<SocketAddr> {
        self.listeners.iter().find_map(pick)
    }

    /// The plain HTTP listener (`--listen`), if there is one.
    pub fn http(&self) -> Option<SocketAddr> {
        self.find_listener(|l| match l {
            Listener::Http(a) => Some(*a),
            _ => None,
        })
    }

    /// The `--redirect-http` listener, if there is one.
    pub fn redirect(&self) -> Option<SocketAddr> {
        self.find_listener(|l| match l {
            Listener::Redirect(a) => Some(*a),
            _ => None,
        })
    }

    /// The plain HTTP listener; panics when there is none.
    pub fn addr(&self) -> SocketAddr {
        self.http()
            .unwrap_or_else(|| panic!("no plain HTTP listener in {:?}", self.line))
    }

    /// The HTTPS listener; panics when there is none.
    pub fn https(&self) -> SocketAddr {
        self.find_listener(|l| match l {
            Listener::Https(a) => Some(*a),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no HTTPS listener in {:?}", self.line))
    }

    pub fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; the child is not reaped before Drop.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid());
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait().unwrap() {
            Some(st) => {
                self.status = Some(st);
                false
            }
            None => true,
        }
    }

    /// Waits up to `limit` for the process to exit, and then for the end of its stderr, so
    /// that [`Tern::stderr_text`] holds every line it wrote.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while self.alive() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stderr.wait_end(Duration::from_secs(5));
        self.status
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.text()
    }

    /// The value of `name` on /statusz (`tern demo` has that page).
    pub fn statusz(&self, name: &str) -> u64 {
        self.counter_at("/statusz", name)
    }

    /// Counter `name` of the `name: value` page at `page` (a /statusz of some component).
    pub fn counter_at(&self, page: &str, name: &str) -> u64 {
        let text = self.get(page).text();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {page}:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// The value of a `/metrics` sample: `series` is its name and labels as the page writes
    /// them.
    pub fn metric(&self, series: &str) -> u64 {
        let page = self.get("/metrics").text();
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} on /metrics:\n{page}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Lines of stderr containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.stderr_text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Sends SIGHUP and waits for the `n`-th reload's log line; returns it.
    pub fn reload(&self, n: usize) -> String {
        self.signal(libc::SIGHUP);
        let found = eventually(Duration::from_secs(5), || {
            self.log_lines("reload (SIGHUP)").len() >= n
        });
        assert!(
            found,
            "no log line for reload {n} within 5 s; stderr:\n{}",
            self.stderr_text()
        );
        self.log_lines("reload (SIGHUP)")[n - 1].clone()
    }

    /// A plain HTTP connection to [`addr`](Self::addr).
    pub fn client(&self) -> Client {
        Client::connect(self.addr())
    }

    /// One GET on a fresh connection.
    pub fn get(&self, path: &str) -> Resp {
        self.client().get(path, &[])
    }

    /// One GET with extra header lines on a fresh connection.
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.client().get(path, headers)
    }
}

impl Drop for Tern {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // Every test runs sandboxed, so every test also checks the seccomp allow-list: a
        // system call the server needed but was refused shows up here.
        // The log thread's summary lines, and the line a debug build's trap handler writes
        // at once (`tern: sandbox: refused NAME (NR) with EPERM`).
        let summaries = self.log_lines("sandbox: refused system calls with EPERM since start-up: ");
        let traces = self.log_lines("tern: sandbox: refused ");
        let unexpected: Vec<String> = summaries
            .iter()
            .flat_map(|line| {
                let list = line.rsplit(": ").next().unwrap_or("");
                list.split(", ")
                    .map(|item| item.split(' ').next().unwrap_or("").to_string())
                    .collect::<Vec<_>>()
            })
            .chain(traces.iter().map(|line| {
                let rest = line.split("tern: sandbox: refused ").nth(1).unwrap_or("");
                rest.split(' ').next().unwrap_or("").to_string()
            }))
            .filter(|name| !self.refusals_expected.contains(&name.as_str()))
            .collect();
        if !unexpected.is_empty() && !std::thread::panicking() {
            panic!(
                "the sandbox refused system calls: {unexpected:?}; stderr:\n{}",
                self.stderr_text()
            );
        }
    }
}

/// What `tern` is asked to run.
enum Sub<'a> {
    /// `serve DIR`
    Serve(&'a Path),
    /// `demo --data DATA`
    Demo(&'a Path),
}

/// `tern SUB LISTEN... [--workers 2 unless EXTRA has --workers] EXTRA...`, under
/// `ulimit -n LIMIT` with `fd_limit`.
fn command<S: AsRef<OsStr>>(
    sub: Sub,
    listen: &[&str],
    extra: &[S],
    fd_limit: Option<u32>,
) -> Command {
    let mut cmd = match fd_limit {
        None => Command::new(TERN),
        Some(n) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(TERN);
            c
        }
    };
    match sub {
        Sub::Serve(dir) => cmd.arg("serve").arg(dir),
        Sub::Demo(data) => cmd.arg("demo").arg("--data").arg(data),
    };
    cmd.args(listen);
    if !extra.iter().any(|a| a.as_ref() == OsStr::new("--workers")) {
        cmd.args(["--workers", "2"]);
    }
    // The whole suite runs sandboxed (`--sandbox on` refuses to start without Landlock and
    // seccomp), unless a test says otherwise or TERN_TEST_SANDBOX=off (a kernel without them).
    let sandbox_given = extra.iter().any(|a| a.as_ref() == OsStr::new("--sandbox"));
    if !sandbox_given && std::env::var_os("TERN_TEST_SANDBOX").as_deref() != Some(OsStr::new("off"))
    {
        cmd.args(["--sandbox", "on"]);
    }
    cmd.args(extra).stdin(Stdio::null()).env_remove("TERN_LOG");
    cmd
}

/// `tern serve DIR LISTEN... --workers 2 EXTRA...` (no `--workers 2` if EXTRA has one).
pub fn serve_command<S: AsRef<OsStr>>(dir: &Path, listen: &[&str], extra: &[S]) -> Command {
    command(Sub::Serve(dir), listen, extra, None)
}

/// `tern demo --data DATA LISTEN... --workers 2 EXTRA...` (no `--workers 2` if EXTRA has one).
pub fn demo_command<S: AsRef<OsStr>>(data: &Path, listen: &[&str], extra: &[S]) -> Command {
    command(Sub::Demo(data), listen, extra, None)
}

/// Runs a command to its end (bounded), capturing both streams.
pub fn run_to_end(cmd: &mut Command, limit: Duration) -> Failed {
    run(cmd, None, limit)
}

/// Runs `cmd` with `input` on its stdin (then closed), bounded by `limit`.
pub fn run_with_input(cmd: &mut Command, input: &[u8], limit: Duration) -> Failed {
    run(cmd, Some(input), limit)
}

fn run(cmd: &mut Command, input: Option<&[u8]>, limit: Duration) -> Failed {
    let stdin = if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    cmd.stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    if let Some(input) = input {
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still running after {limit:?}; stdout:\n{}\nstderr:\n{}",
                out.text(),
                err.text()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The pipes close at exit: what the process wrote is all read once the drains end.
    out.wait_end(Duration::from_secs(5));
    err.wait_end(Duration::from_secs(5));
    let stdout = out.text();
    let stderr = err.text();
    Failed {
        status,
        stdout,
        stderr,
    }
}

/// Whether `tool` can be run (`tool ARG` exits at all). Tests print why they skip.
pub fn have(tool: &str, arg: &str) -> bool {
    let ok = Command::new(tool)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        eprintln!("SKIPPED: `{tool}` is not installed");
    }
    ok
}

/// What a thread has read of a child's pipe so far, and whether it reached the end.
#[derive(Clone, Default)]
pub struct Drained(Arc<DrainState>);

#[derive(Default)]
pub struct DrainState {
    /// The bytes, and whether the pipe ended.
    read: Mutex<(Vec<u8>, bool)>,
    ended: std::sync::Condvar,
}

impl Drained {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.read.lock().unwrap().0).into_owned()
    }

    /// Waits, `limit` at most, for the pipe's end (every writer closed it: a process that
    /// exited, unless a child of its holds it).
    pub fn wait_end(&self, limit: Duration) {
        let read = self.0.read.lock().unwrap();
        let _ = self
            .0
            .ended
            .wait_timeout_while(read, limit, |(_, end)| !*end);
    }
}

fn drain(mut r: impl Read + Send + 'static) -> Drained {
    let drained = Drained::default();
    let state = drained.0.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            let n = r.read(&mut chunk).unwrap_or(0);
            let mut read = state.read.lock().unwrap();
            read.0.extend_from_slice(&chunk[..n]);
            if n == 0 {
                read.1 = true;
                state.ended.notify_all();
                return;
            }
        }
    });
    drained
}

/// The listeners and worker count of a start-up line,
/// `tern: WHAT on LISTENER and LISTENER... with N workers`, where a listener is
/// `http://ADDR`, `https://ADDR` or `http://ADDR (redirect to https)`, `1 worker` is singular,
/// and `; self-signed certificate SHA-256 FINGERPRINT` may follow.
/// The start-up line's text: the line itself, or with `--log-format json` the `message` of the
/// JSON object it is then (the line as it is when it does not parse).
pub fn startup_message(line: &str) -> String {
    if line.starts_with('{') {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(line) {
            if let Some(message) = value["message"].as_str() {
                return message.to_owned();
            }
        }
    }
    line.to_owned()
}

pub fn parse_startup_line(line: &str) -> Option<(Vec<Listener>, usize)> {
    let rest = line.trim_end().strip_prefix("tern: ")?;
    let (_what, rest) = rest.rsplit_once(" on ")?;
    let (listeners, rest) = rest.rsplit_once(" with ")?;
    let listeners = listeners
        .split(" and ")
        .map(|part| {
            if let Some(addr) = part.strip_prefix("https://") {
                Some(Listener::Https(addr.parse().ok()?))
            } else if let Some(part) = part.strip_suffix(" (redirect to https)") {
                Some(Listener::Redirect(
                    part.strip_prefix("http://")?.parse().ok()?,
                ))
            } else {
                Some(Listener::Http(part.strip_prefix("http://")?.parse().ok()?))
            }
        })
        .collect::<Option<Vec<_>>>()?;
    let count = match rest.split_once("; ") {
        Some((count, more)) => {
            more.strip_prefix("self-signed certificate SHA-256 ")?;
            count
        }
        None => rest,
    };
    let n: usize = count.split(' ').next()?.parse().ok()?;
    let workers_ok = count == format!("{n} workers") || (n == 1 && count == "1 worker");
    workers_ok.then_some((listeners, n))
}

/// A compressible text body a few KiB long, distinguishable by `tag`.
pub fn text_body(tag: &str) -> String {
    (0..120)
        .map(|i| format!("{tag} line {i}: the quick brown fox jumps over the lazy dog\n"))
        .collect()
}

pub fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("valid gzip body");
    out
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

pub fn unbrotli(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::Decompressor::new(data, 4096)
        .read_to_end(&mut out)
        .expect("valid brotli body");
    out
}

/// Sends sixteen requests for `n00.txt`..`n15.txt` (see [`Site::write_numbered`]) in one write
/// and checks that they are answered in order: request 7 asks for a missing file and 11 is a
/// HEAD, and both must keep their place.
pub fn sixteen_pipelined<S: Transport>(c: &mut Client<S>) {
    let mut batch = Vec::new();
    for i in 0..16 {
        let (method, path) = match i {
            7 => ("GET", "/missing.txt".to_owned()),
            11 => ("HEAD", format!("/n{i:02}.txt")),
            _ => ("GET", format!("/n{i:02}.txt")),
        };
        batch.extend(request_bytes(method, &path, &[]));
    }
    c.send(&batch);
    for i in 0..16 {
        let r = c.read_response(i == 11);
        match i {
            7 => assert_eq!(r.status, 404, "response {i}"),
            11 => {
                assert_eq!(r.status, 200);
                assert_eq!(
                    r.content_length(),
                    Some(format!("file number {i}\n").len() as u64)
                );
            }
            _ => {
                assert_eq!(r.status, 200, "response {i}");
                assert_eq!(r.text(), format!("file number {i}\n"), "response {i}");
            }
        }
    }
}

/// Whether promtool is here; under CI its absence is a failure.
pub fn have_promtool() -> bool {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing under CI: scripts/install-metrics-test-deps installs it"
        );
        eprintln!("SKIPPED: promtool is not installed (scripts/install-metrics-test-deps)");
    }
    found
}

/// Pipes `page` through `promtool check metrics`; any problem it reports fails the test.
pub fn promtool_accepts(what: &str, page: &str) {
    assert!(
        page.contains("# TYPE "),
        "{what}: not a metrics page:\n{page}"
    );
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics refused {what} ({}):\n{said}\n--- the page:\n{page}",
        out.status
    );
}

/// nginx from Debian's package, run in the foreground from a folder of its own for a
/// comparison test; killed on drop. `None` (with a SKIPPED line) when nginx is not installed.
pub struct Nginx {
    child: std::process::Child,
    pub addr: SocketAddr,
}

impl Nginx {
    /// nginx with `http_block` (server blocks, listening on `port`) inside a minimal
    /// `http {}` of its own in `dir`; panics with its error output if it does not start.
    pub fn start(dir: &Path, http_block: &str, port: u16) -> Option<Nginx> {
        let Some(nginx) = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .iter()
            .find(|p| Path::new(p).exists())
        else {
            eprintln!("SKIPPED: nginx is not installed (scripts/install-gate-test-deps)");
            return None;
        };
        std::fs::create_dir_all(dir).unwrap();
        let conf = dir.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "daemon off; master_process off; worker_processes 1; pid {t}/nginx.pid;\n\
                 error_log {t}/error.log;\nevents {{ worker_connections 256; }}\n\
                 http {{\n include /etc/nginx/mime.types; access_log off;\n client_body_temp_path {t}/body; proxy_temp_path {t}/proxy;\n\
                 fastcgi_temp_path {t}/fcgi; uwsgi_temp_path {t}/uwsgi; scgi_temp_path {t}/scgi;\n{http_block}\n}}\n",
                t = dir.display()
            ),
        )
        .unwrap();
        let mut child = std::process::Command::new(nginx)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        if !eventually(Duration::from_secs(5), || TcpStream::connect(addr).is_ok()) {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("nginx did not start: {err}");
        }
        Some(Nginx { child, addr })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first fenced block of `lang` after the README heading `section` (a whole line, such
/// as "### PHP sites (FastCGI)"): the examples the tests run or validate are the ones a
/// reader copies.
pub fn readme_block(section: &str, lang: &str) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let heading = format!("\n{section}\n");
    let body = readme
        .split(&heading)
        .nth(1)
        .unwrap_or_else(|| panic!("the README has no section {section:?}"));
    let fence = format!("```{lang}\n");
    let start = body
        .find(&fence)
        .unwrap_or_else(|| panic!("no {lang} block in {section:?}"))
        + fence.len();
    let len = body[start..].find("```").unwrap();
    body[start..start + len].to_string()
}

/// `caddy validate` on a Caddyfile, with Caddy's state kept under `home`. `None` when Caddy
/// is not installed (scripts/install-proxy-test-deps installs it), the output on failure.
pub fn caddy_validate(file: &Path, home: &Path) -> Option<Result<(), String>> {
    let installed = Command::new("caddy")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        eprintln!("SKIPPED: caddy is not installed (scripts/install-proxy-test-deps installs it)");
        return None;
    }
    let out = Command::new("caddy")
        .args(["validate", "--adapter", "caddyfile", "--config"])
        .arg(file)
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("caddy-data"))
        .env("XDG_CONFIG_HOME", home.join("caddy-config"))
        .output()
        .unwrap();
    Some(if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "caddy validate: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    })
}
