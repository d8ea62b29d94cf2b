//! Shared helpers for the end-to-end tests: start the real `tern` binary on an ephemeral port,
//! kill it on drop, and talk HTTP/1.1 to it over raw `TcpStream`s.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
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

    pub fn start(&self, extra: &[&str]) -> Tern {
        Tern::start(&self.root, extra)
    }
}

/// A running `tern serve`, killed (SIGKILL) and reaped when dropped.
pub struct Tern {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: Arc<Mutex<Vec<u8>>>,
    status: Option<ExitStatus>,
}

/// How a `tern` run that was expected to fail ended.
pub struct Failed {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Tern {
    /// `tern serve DIR --listen 127.0.0.1:0 --workers 2 EXTRA...`, waiting for the start-up line.
    pub fn start(dir: &Path, extra: &[&str]) -> Tern {
        Tern::start_with(dir, extra, None)
    }

    /// Like [`start`](Self::start); `fd_limit` runs tern under `ulimit -n LIMIT`.
    pub fn start_with(dir: &Path, extra: &[&str], fd_limit: Option<u32>) -> Tern {
        let mut cmd = command(dir, extra, fd_limit);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
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
        let line = match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tern printed no start-up line within 15 s");
            }
        };
        let mut tern = Tern {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            stderr,
            status: None,
        };
        let Some(addr) = parse_startup_line(&line, dir) else {
            let status = tern.wait_exit(Duration::from_secs(2));
            panic!(
                "unexpected start-up line {line:?} (exit {status:?}); stderr:\n{}",
                tern.stderr_text()
            );
        };
        tern.addr = addr;
        tern
    }

    /// Runs `tern serve` expecting it to fail at start-up; returns how it ended.
    pub fn start_failing(dir: &Path, extra: &[&str]) -> Failed {
        let mut cmd = command(dir, extra, None);
        run_to_end(&mut cmd, Duration::from_secs(10))
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

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while self.alive() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.status
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
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
    }
}

fn command(dir: &Path, extra: &[&str], fd_limit: Option<u32>) -> Command {
    let mut args: Vec<String> = vec![
        "serve".into(),
        dir.to_str().unwrap().into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
    ];
    if !extra.contains(&"--workers") {
        args.extend(["--workers".into(), "2".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
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
    cmd.args(args).stdin(Stdio::null()).env_remove("TERN_LOG");
    cmd
}

/// Runs a command to its end (bounded), capturing both streams.
pub fn run_to_end(cmd: &mut Command, limit: Duration) -> Failed {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
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
                String::from_utf8_lossy(&out.lock().unwrap()),
                String::from_utf8_lossy(&err.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The pipes close at exit; give the drain threads a moment to see EOF.
    std::thread::sleep(Duration::from_millis(50));
    let stdout = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err.lock().unwrap()).into_owned();
    Failed {
        status,
        stdout,
        stderr,
    }
}

fn drain(mut r: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
    });
    buf
}

/// `tern: serving /abs/dir on http://127.0.0.1:PORT with N workers` → the address.
fn parse_startup_line(line: &str, dir: &Path) -> Option<SocketAddr> {
    let rest = line.trim_end().strip_prefix("tern: serving ")?;
    let (served, rest) = rest.split_once(" on http://")?;
    let canonical = std::fs::canonicalize(dir).ok()?;
    assert_eq!(
        Path::new(served),
        canonical,
        "start-up line names the canonical root"
    );
    let (addr, rest) = rest.split_once(" with ")?;
    let n: usize = rest.split(' ').next()?.parse().ok()?;
    assert!(
        rest == format!("{n} workers") || (n == 1 && rest == "1 worker"),
        "start-up line ends {rest:?}"
    );
    addr.parse().ok()
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

/// One keep-alive connection that can pipeline.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        Client::from_stream(stream)
    }

    pub fn from_stream(stream: TcpStream) -> Client {
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// Shrinks the socket's receive buffer (which also turns off its autotuning), so that a
    /// large answer cannot fit in the kernel's buffers and the server must wait for us.
    pub fn small_receive_buffer(&self, bytes: libc::c_int) {
        use std::os::fd::AsRawFd;
        // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
        let rc = unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "setsockopt(SO_RCVBUF)");
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
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
            if self.fill()? == 0 {
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
        assert!(
            resp.header("transfer-encoding").is_none(),
            "chunked responses are not expected from static files"
        );
        let no_body = head_only || status == 304 || status == 204 || (100..200).contains(&status);
        if no_body {
            return Ok(resp);
        }
        match resp.content_length() {
            Some(len) => {
                let len = len as usize;
                while self.buf.len() < len {
                    if self.fill()? == 0 {
                        return Err(format!(
                            "connection closed after {} of {len} body bytes",
                            self.buf.len()
                        ));
                    }
                }
                resp.body = self.take(len);
            }
            None => {
                while self.fill()? > 0 {}
                resp.body = std::mem::take(&mut self.buf);
            }
        }
        Ok(resp)
    }

    /// Reads exactly `n` raw bytes (after whatever was already buffered).
    pub fn read_exact_raw(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            if self.fill().unwrap() == 0 {
                panic!("connection closed after {} of {n} bytes", self.buf.len());
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
        self.stream.set_read_timeout(Some(limit)).unwrap();
        let r = self.fill();
        self.stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        matches!(r, Ok(0))
    }

    /// Bytes already buffered and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    fn fill(&mut self) -> Result<usize, String> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(0),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    for (n, v) in headers {
        r.push_str(&format!("{n}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
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

/// `tern demo --data DATA --listen 127.0.0.1:0 --workers 2 EXTRA...` (the IPv4 Games).
pub fn demo_command(data: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(TERN);
    cmd.arg("demo")
        .arg("--data")
        .arg(data)
        .args(["--listen", "127.0.0.1:0"]);
    if !extra.contains(&"--workers") {
        cmd.args(["--workers", "2"]);
    }
    cmd.args(extra).stdin(Stdio::null()).env_remove("TERN_LOG");
    cmd
}

/// `tern: IPv4 Games (data in DIR) on http://127.0.0.1:PORT with N workers` → the address.
pub fn parse_demo_startup_line(line: &str) -> Option<SocketAddr> {
    let rest = line.trim_end().strip_prefix("tern: IPv4 Games (data in ")?;
    let (_, rest) = rest.split_once(") on http://")?;
    let (addr, _) = rest.split_once(" with ")?;
    addr.parse().ok()
}

impl Tern {
    /// Starts `tern demo` on `data` (see [`demo_command`]), waiting for the start-up line;
    /// returns the running process and that line.
    pub fn start_demo(data: &Path, extra: &[&str]) -> (Tern, String) {
        let mut cmd = demo_command(data, extra);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn tern demo");
        let stderr = drain(child.stderr.take().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tern demo printed no start-up line within 15 s");
            }
        };
        let mut tern = Tern {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            stderr,
            status: None,
        };
        let Some(addr) = parse_demo_startup_line(&line) else {
            let status = tern.wait_exit(Duration::from_secs(2));
            panic!(
                "unexpected start-up line {line:?} (exit {status:?}); stderr:\n{}",
                tern.stderr_text()
            );
        };
        tern.addr = addr;
        (tern, line)
    }

    /// Runs `tern demo` expecting it to fail at start-up; returns how it ended.
    pub fn demo_failing(data: &Path, extra: &[&str]) -> Failed {
        run_to_end(&mut demo_command(data, extra), Duration::from_secs(10))
    }
}
