//! Restart on the same port: a new tern binds beside the old one (`SO_REUSEPORT`), the old one
//! gets SIGTERM and exits 0, and nothing that was waiting for the old one is reset.
//! (stress/restart.py does the same under continuous load; this is the bounded, deterministic
//! core of it.)

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TERN: &str = env!("CARGO_BIN_EXE_tern");
const PAGE: &[u8] = b"restart test page\n";

/// A `tern serve` child, killed when dropped.
struct Proc {
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    fn start(dir: &std::path::Path, listen: &str) -> Proc {
        let mut child = Command::new(TERN)
            .args([
                "serve",
                dir.to_str().unwrap(),
                "--listen",
                listen,
                "--workers",
                "2",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tern");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("start-up line: {line:?}"))
            .parse()
            .unwrap();
        Proc { child, addr }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads one response (Content-Length framed); returns the status line and the body.
fn response(s: &mut TcpStream) -> Result<(String, Vec<u8>), String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = head.lines().next().unwrap_or("").to_string();
                return Ok((status, buf[end + 4..end + 4 + len].to_vec()));
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err(format!("EOF after {} bytes", buf.len())),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("{e} after {} bytes", buf.len())),
        }
    }
}

const GET: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: t\r\n\r\n";

#[test]
fn restart_on_the_same_port_resets_nothing() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("index.html"), PAGE).unwrap();
    let mut old = Proc::start(site.path(), "127.0.0.1:0");
    let port = old.addr.port();

    // An idle keep-alive connection on the old process.
    let mut idle = connect(old.addr);
    idle.write_all(GET).unwrap();
    assert_eq!(response(&mut idle).unwrap().1, PAGE);

    let new = Proc::start(site.path(), &format!("127.0.0.1:{port}"));
    assert_eq!(new.addr.port(), port, "the new process shares the port");

    // Freeze the old process so the next connections wait in the accept queues (about half
    // of them in the old process's), then SIGTERM it and let it run: it must serve what was
    // queued for it rather than let the kernel reset it when its listeners close.
    old.signal(libc::SIGSTOP);
    let mut queued: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut s = connect(old.addr);
            s.write_all(GET).unwrap();
            s
        })
        .collect();
    old.signal(libc::SIGTERM);
    old.signal(libc::SIGCONT);

    for (i, s) in queued.iter_mut().enumerate() {
        let (status, body) = response(s).unwrap_or_else(|e| panic!("queued client {i}: {e}"));
        assert!(status.contains(" 200 "), "queued client {i}: {status}");
        assert_eq!(body, PAGE, "queued client {i}");
    }
    assert_eq!(
        old.wait_exit(Duration::from_secs(8)),
        Some(0),
        "old process exits 0"
    );

    // The idle keep-alive connection was closed cleanly (EOF, not a reset).
    let mut rest = Vec::new();
    assert_eq!(idle.read_to_end(&mut rest).map_err(|e| e.kind()), Ok(0));

    // And the port is still served, by the new process.
    let mut s = connect(new.addr);
    s.write_all(GET).unwrap();
    assert_eq!(response(&mut s).unwrap().1, PAGE);
}
