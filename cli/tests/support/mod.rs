//! Shared helpers for the end-to-end tests: start the real `tern` binary on an ephemeral port,
//! kill it on drop, and talk HTTP/1.1 to it over raw `TcpStream`s.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TERN: &str = env!("CARGO_BIN_EXE_tern");

/// Read timeout of test clients: long enough for a loaded CI machine, short enough that a
/// server that never answers fails the test instead of hanging it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

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
    #[allow(dead_code)] // not every test binary reads a component's page
    pub fn counter_at(&self, page: &str, name: &str) -> u64 {
        let text = self.get(page).text();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {page}:\n{text}"))
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

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub version: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The value of a header (case-insensitive name); panics if it appears twice.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut found = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str());
        let first = found.next();
        assert!(found.next().is_none(), "header {name} appears twice");
        first
    }

    pub fn has(&self, name: &str, value: &str) -> bool {
        self.header(name) == Some(value)
    }

    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").map(|v| v.parse().unwrap())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// What a [`Client`] talks over: a `TcpStream`, or (support/tls.rs) a TLS session on one.
pub trait Transport: Read + Write {
    /// The TCP socket underneath.
    fn socket(&self) -> &TcpStream;
}

impl Transport for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }
}

/// One keep-alive HTTP/1.1 connection that can pipeline, over plain TCP or (as
/// `tls_support::TlsClient`) over TLS.
pub struct Client<S: Transport = TcpStream> {
    pub stream: S,
    buf: Vec<u8>,
    /// Chunked answers are decoded (a proxy's); otherwise one fails the test (static files
    /// always know their length).
    pub chunked_ok: bool,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        Client::from_stream(stream)
    }

    pub fn from_stream(stream: TcpStream) -> Client {
        Client::over(stream)
    }
}

/// Shrinks a socket's receive buffer (which also turns off its autotuning), so that a large
/// answer cannot fit in the kernel's buffers and the server must wait for us.
pub fn small_receive_buffer(sock: &TcpStream, bytes: libc::c_int) {
    set_int_option(sock, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes, "SO_RCVBUF");
}

/// `setsockopt(sock, level, name, &value)` for an `int` option; panics (naming `what`) if it
/// fails.
pub fn set_int_option(
    sock: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
    what: &str,
) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt({what})");
}

impl<S: Transport> Client<S> {
    /// A client on a connected (and, for TLS, handshaken) stream: the read timeout is
    /// [`READ_TIMEOUT`] and Nagle is off.
    pub fn over(stream: S) -> Client<S> {
        stream
            .socket()
            .set_read_timeout(Some(READ_TIMEOUT))
            .unwrap();
        stream.socket().set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
            chunked_ok: false,
        }
    }

    /// See [`small_receive_buffer`].
    pub fn small_receive_buffer(&self, bytes: libc::c_int) {
        small_receive_buffer(self.stream.socket(), bytes);
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
        self.stream.flush().unwrap();
    }

    /// Sends a request with `Host` and the given headers, and reads its response.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.send(&request_bytes(method, path, headers));
        self.read_response(method == "HEAD")
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Resp {
        self.request("GET", path, headers)
    }

    /// Reads one response. `head_only`: the request was HEAD (no body whatever the headers say).
    pub fn read_response(&mut self, head_only: bool) -> Resp {
        self.try_read_response(head_only)
            .unwrap_or_else(|e| panic!("reading a response: {e}"))
    }

    pub fn try_read_response(&mut self, head_only: bool) -> Result<Resp, String> {
        let end = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end;
            }
            if self.fill(FILL)? == 0 {
                return Err(format!(
                    "connection closed before a full head; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ));
            }
        };
        let head = String::from_utf8(self.buf[..end].to_vec()).map_err(|e| e.to_string())?;
        self.buf.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_owned();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {status_line:?}"))?;
        if !version.starts_with("HTTP/1.") {
            return Err(format!("bad status line {status_line:?}"));
        }
        let mut headers = Vec::new();
        for line in lines {
            let (n, v) = line
                .split_once(':')
                .ok_or_else(|| format!("bad header line {line:?}"))?;
            headers.push((n.to_owned(), v.trim().to_owned()));
        }
        let mut resp = Resp {
            status,
            version,
            headers,
            body: Vec::new(),
        };
        let chunked = resp.header("transfer-encoding").is_some();
        assert!(
            !chunked || self.chunked_ok,
            "chunked responses are not expected from static files"
        );
        let no_body = head_only || status == 304 || status == 204 || (100..200).contains(&status);
        if no_body {
            return Ok(resp);
        }
        if chunked {
            resp.body = self.read_chunked()?;
            return Ok(resp);
        }
        match resp.content_length() {
            Some(len) => {
                let len = len as usize;
                while self.buf.len() < len {
                    if self.fill(FILL)? == 0 {
                        return Err(format!(
                            "connection closed after {} of {len} body bytes",
                            self.buf.len()
                        ));
                    }
                }
                resp.body = self.take(len);
            }
            None => {
                while self.fill(FILL)? > 0 {}
                resp.body = std::mem::take(&mut self.buf);
            }
        }
        Ok(resp)
    }

    /// A chunked body, strictly: hex sizes (extensions ignored), CRLF after each chunk, and
    /// the trailer section up to its empty line.
    fn read_chunked(&mut self) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line()?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let n =
                usize::from_str_radix(size, 16).map_err(|_| format!("bad chunk size {line:?}"))?;
            if n == 0 {
                while !self.read_line()?.is_empty() {}
                return Ok(body);
            }
            while self.buf.len() < n + 2 {
                if self.fill(FILL)? == 0 {
                    return Err(format!(
                        "closed inside a chunk after {} body bytes",
                        body.len()
                    ));
                }
            }
            let chunk = self.take(n + 2);
            if &chunk[n..] != b"\r\n" {
                return Err("a chunk does not end with CRLF".into());
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }

    /// One CRLF-terminated line, without its CRLF.
    fn read_line(&mut self) -> Result<String, String> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = self.take(end + 2);
                return Ok(String::from_utf8_lossy(&line[..end]).into_owned());
            }
            if self.fill(FILL)? == 0 {
                return Err("closed before the end of a line".into());
            }
        }
    }

    /// Reads exactly `n` raw bytes (after whatever was already buffered).
    pub fn read_exact_raw(&mut self, n: usize) -> Vec<u8> {
        self.read_exact_raw_by(n, FILL)
    }

    /// Reads exactly `n` raw bytes (after whatever was already buffered), at most `step` bytes
    /// a read.
    pub fn read_exact_raw_by(&mut self, n: usize, step: usize) -> Vec<u8> {
        while self.buf.len() < n {
            match self.fill(step.min(n - self.buf.len())) {
                Ok(0) => panic!("connection closed after {} of {n} bytes", self.buf.len()),
                Ok(_) => {}
                Err(e) => panic!("after {} of {n} bytes: {e}", self.buf.len()),
            }
        }
        self.take(n)
    }

    /// The first `n` buffered bytes (a copy of the rest stays buffered; no per-byte loop, so
    /// that megabytes are cheap even in debug builds).
    fn take(&mut self, n: usize) -> Vec<u8> {
        let rest = self.buf[n..].to_vec();
        self.buf.truncate(n);
        std::mem::replace(&mut self.buf, rest)
    }

    /// Reads one head (status line and headers) only, leaving the body on the socket/buffer.
    pub fn read_head_only(&mut self) -> Resp {
        self.read_response(true)
    }

    /// True when the server has closed the connection (EOF or reset) with nothing else to
    /// read, waiting up to the read timeout for it.
    pub fn at_eof(&mut self) -> bool {
        self.closed_within(READ_TIMEOUT)
    }

    /// True when the server closes the connection within `limit` with nothing else sent.
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.stream.socket().set_read_timeout(Some(limit)).unwrap();
        let r = self.fill(FILL);
        self.stream
            .socket()
            .set_read_timeout(Some(READ_TIMEOUT))
            .unwrap();
        matches!(r, Ok(0))
    }

    /// Bytes already buffered and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Reads at most `max` (up to [`FILL`]) bytes into the buffer; `Ok(0)` when the server has
    /// closed (EOF, a reset, or over TLS a TCP close without close_notify).
    fn fill(&mut self, max: usize) -> Result<usize, String> {
        let mut chunk = [0u8; FILL];
        let max = max.min(FILL);
        loop {
            match self.stream.read(&mut chunk[..max]) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof
                    ) =>
                {
                    return Ok(0)
                }
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }
}

/// The most a client reads at once.
const FILL: usize = 64 * 1024;

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    for (n, v) in headers {
        r.push_str(&format!("{n}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
}

/// A port nothing listens on now (the kernel's pick; free again once the probe closes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Period of the large-file pattern: a prime, so no power-of-two shift (page, buffer or
/// sendfile step) of the data lines up with itself.
const PERIOD: usize = 65_521;

/// Two periods of pseudo-random bytes, so that any window of up to one period is one slice.
fn table() -> &'static [u8] {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut t: Vec<u8> = (0..PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        t.extend_from_within(..);
        t
    })
}

/// The pattern byte at file offset `i`.
pub fn pattern_byte(i: u64) -> u8 {
    table()[(i % PERIOD as u64) as usize]
}

/// The pattern bytes at file offsets `start..start + len`.
pub fn pattern(start: u64, len: usize) -> Vec<u8> {
    let t = table();
    let mut out = Vec::with_capacity(len);
    let mut at = (start % PERIOD as u64) as usize;
    while out.len() < len {
        let n = (len - out.len()).min(PERIOD);
        out.extend_from_slice(&t[at..at + n]);
        at = (at + n) % PERIOD;
    }
    out
}

/// Writes `len` patterned bytes to `path` (in 1 MiB steps).
pub fn write_pattern_file(path: &Path, len: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut at = 0;
    while at < len {
        let n = (len - at).min(1 << 20);
        f.write_all(&pattern(at, n as usize)).unwrap();
        at += n;
    }
    f.flush().unwrap();
}

/// Compares `got` with the pattern starting at `start`, naming the first differing offset.
pub fn check_pattern(got: &[u8], start: u64) {
    let want = pattern(start, got.len());
    if got != want.as_slice() {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!(
            "byte {} (file offset {}) is {:#04x}, expected {:#04x}",
            at,
            start + at as u64,
            got[at],
            want[at]
        );
    }
}

/// Polls `f` every 20 ms until it returns true or `limit` passes; returns the last result.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
