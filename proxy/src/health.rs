//! Active health checks: one checker thread for the whole process, shared by every group
//! that asks for checks, sends each server a `GET` for the check's path every `interval`
//! on a blocking socket with timeouts (never on a worker), and publishes the verdict in the
//! group's per-server atomics ([`UpstreamGroup::set_checked_down`]), which the workers read
//! as they pick a server. A server is taken out after `fall` failed checks in a row and
//! comes back after `rise` good ones; each change is logged on one line and counted.
//!
//! Groups are held weakly: a group dropped with its route table (a reload) is forgotten at
//! the next turn, and a reload's new groups register themselves.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tern_server::{UpstreamAddr, UpstreamTls, Upstreams};
use tern_services::metrics::Metric;

use crate::group::{HealthCheck, UpstreamGroup};

/// The longest status line read from a server checked.
const MAX_STATUS_LINE: usize = 1024;

/// One check of `addr`: the status of its answer, or why there is none.
/// With `tls`, over TLS (the handshake within the timeout; a failed one is the check's
/// failure, with rustls's reason).
pub fn check(
    addr: &UpstreamAddr,
    tls: Option<&UpstreamTls>,
    check: &HealthCheck,
) -> Result<u16, String> {
    let host = match (&check.host, addr) {
        (Some(h), _) => h.clone(),
        (None, UpstreamAddr::Tcp(_)) if tls.is_some() => tls
            .map(|t| t.name.to_str().into_owned())
            .unwrap_or_default(),
        (None, UpstreamAddr::Tcp(a)) => a.to_string(),
        (None, UpstreamAddr::Unix(_)) => "localhost".into(),
    };
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tern-health-check\r\nConnection: close\r\n\r\n",
        check.path
    );
    let deadline = Instant::now() + check.timeout;
    match addr {
        UpstreamAddr::Tcp(a) => {
            let s = TcpStream::connect_timeout(a, check.timeout).map_err(|e| e.to_string())?;
            match tls {
                None => exchange(s, request.as_bytes(), deadline),
                Some(tls) => {
                    let conn = rustls::ClientConnection::new(tls.config.clone(), tls.name.clone())
                        .map_err(|e| e.to_string())?;
                    exchange(
                        rustls::StreamOwned::new(conn, s),
                        request.as_bytes(),
                        deadline,
                    )
                }
            }
        }
        UpstreamAddr::Unix(p) => {
            let s = UnixStream::connect(p).map_err(|e| e.to_string())?;
            exchange(s, request.as_bytes(), deadline)
        }
    }
}

/// Sends `request` and reads the status line, all before `deadline`.
fn exchange<S: Read + Write + SetTimeouts>(
    mut s: S,
    request: &[u8],
    deadline: Instant,
) -> Result<u16, String> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| "timed out".to_string())
    };
    s.set_timeouts(left()?).map_err(|e| e.to_string())?;
    s.write_all(request).map_err(|e| e.to_string())?;
    let mut buf = [0u8; MAX_STATUS_LINE];
    let mut got = 0;
    loop {
        if let Some(end) = buf[..got].windows(2).position(|w| w == b"\r\n") {
            return status_of(&buf[..end]).ok_or_else(|| "a malformed status line".into());
        }
        if got == buf.len() {
            return Err("a status line too long".into());
        }
        s.set_timeouts(left()?).map_err(|e| e.to_string())?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err("closed without an answer".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err("timed out".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The status of `HTTP/1.x NNN ...`.
fn status_of(line: &[u8]) -> Option<u16> {
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))?;
    let digits = rest.get(..3)?;
    if !digits.iter().all(u8::is_ascii_digit) || rest.get(3).is_some_and(|&b| b != b' ') {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

trait SetTimeouts {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()>;
}

impl SetTimeouts for TcpStream {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

impl SetTimeouts for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()> {
        self.sock.set_timeouts(d)
    }
}

impl SetTimeouts for UnixStream {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

/// Checks in a row of one server, as the checker counts them.
#[derive(Default, Clone, Copy)]
struct Streak {
    oks: u32,
    fails: u32,
}

/// A group the checker looks after.
struct Watched {
    group: Weak<UpstreamGroup>,
    streaks: Vec<Streak>,
    due: Instant,
}

/// The groups registered, and a signal for the checker that one was added.
struct Registry {
    groups: Mutex<Vec<Watched>>,
    added: Condvar,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        groups: Mutex::new(Vec::new()),
        added: Condvar::new(),
    })
}

/// Has `group`'s servers checked (nothing if it has no health check), the first check as
/// soon as the checker thread runs ([`start`]).
pub fn watch(group: &Arc<UpstreamGroup>) {
    if group.health_check().is_none() {
        return;
    }
    let r = registry();
    r.groups
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Watched {
            group: Arc::downgrade(group),
            streaks: vec![Streak::default(); group.servers().len()],
            due: Instant::now(),
        });
    r.added.notify_one();
}

/// Starts the checker thread if a group is watched and it is not running yet. Called once
/// the process is sandboxed (the sandbox goes on while one thread runs; the checker then
/// inherits it) and after every reload (which may add the first checks).
pub fn start() -> std::io::Result<()> {
    static STARTED: OnceLock<()> = OnceLock::new();
    if STARTED.get().is_some()
        || registry()
            .groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("tern-health".into())
        .spawn(run)?;
    let _ = STARTED.set(());
    Ok(())
}

/// The checker thread: the group due first is checked, then waits its interval.
fn run() {
    let r = registry();
    let mut groups = r.groups.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        groups.retain(|w| w.group.strong_count() > 0);
        let now = Instant::now();
        let Some(next) = groups
            .iter()
            .enumerate()
            .min_by_key(|(_, w)| w.due)
            .map(|(i, w)| (i, w.due))
        else {
            groups = r.added.wait(groups).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        if next.1 > now {
            groups = r
                .added
                .wait_timeout(groups, next.1 - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        }
        let (i, _) = next;
        let Some(group) = groups[i].group.upgrade() else {
            continue;
        };
        let mut streaks = std::mem::take(&mut groups[i].streaks);
        // No lock while checking: registering (a reload) and the counters page go on.
        drop(groups);
        let Some(hc) = group.health_check().cloned() else {
            groups = r.groups.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        };
        for (server, streak) in streaks.iter_mut().enumerate() {
            let verdict = check(&group.servers()[server].addr, group.tls(server), &hc);
            judge(&group, server, streak, verdict, &hc);
        }
        groups = r.groups.lock().unwrap_or_else(|p| p.into_inner());
        // The list may have changed meanwhile; find the group again by identity.
        if let Some(w) = groups
            .iter_mut()
            .find(|w| std::ptr::eq(w.group.as_ptr(), Arc::as_ptr(&group)))
        {
            w.streaks = streaks;
            w.due = Instant::now() + hc.interval;
        }
    }
}

/// Counts a check's verdict, and takes the server out or brings it back.
fn judge(
    group: &UpstreamGroup,
    server: usize,
    streak: &mut Streak,
    verdict: Result<u16, String>,
    hc: &HealthCheck,
) {
    let ok = verdict
        .as_ref()
        .is_ok_and(|status| hc.statuses.contains(status));
    group.count_check(server, ok);
    let addr = &group.servers()[server].addr;
    if ok {
        streak.fails = 0;
        streak.oks = streak.oks.saturating_add(1);
        if streak.oks >= hc.rise && group.set_checked_down(server, false) {
            tracing::info!(upstream = %group.name(), server = %addr, "upstream server back in turn: its health check passed {} time(s) in a row", streak.oks);
        }
    } else {
        streak.oks = 0;
        streak.fails = streak.fails.saturating_add(1);
        if streak.fails >= hc.fall && group.set_checked_down(server, true) {
            let why = match verdict {
                Ok(status) => format!("answered {status}"),
                Err(e) => e,
            };
            tracing::warn!(upstream = %group.name(), server = %addr, "upstream server taken out: its health check failed {} time(s) in a row ({why})", streak.fails);
        }
    }
}

/// The health figures of every group checked, for `/statusz` and `/metrics`: a gauge per
/// server (1: in turn, 0: taken out), checks by result, and changes by direction. Labels:
/// the group's name (its site and route) and the server's address, so their number is
/// bounded by the config. A group replaced by a reload shows only once, as its successor.
pub fn metrics(out: &mut Vec<Metric>) {
    let groups: Vec<Arc<UpstreamGroup>> = {
        let g = registry().groups.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().filter_map(|w| w.group.upgrade()).collect()
    };
    let mut shown: Vec<&str> = Vec::new();
    let mut up = Vec::new();
    let mut checks = Vec::new();
    let mut changes = Vec::new();
    for group in groups.iter().rev() {
        if shown.contains(&group.name()) {
            continue;
        }
        shown.push(group.name());
        for (i, server) in group.servers().iter().enumerate() {
            let labels = vec![
                ("upstream", group.name().to_string().into()),
                ("server", server.addr.to_string().into()),
            ];
            let f = group.check_figures(i);
            up.push(Metric {
                labels: labels.clone(),
                ..Metric::gauge(
                    "upstream_server_up",
                    "1 while the health check keeps an upstream server in turn, 0 while it is taken out",
                    if f.down { 0.0 } else { 1.0 },
                )
            });
            for (result, n) in [("ok", f.ok), ("failed", f.failed)] {
                let mut l = labels.clone();
                l.push(("result", result.into()));
                checks.push(Metric {
                    labels: l,
                    ..Metric::counter(
                        "upstream_health_checks",
                        "upstream health checks by result",
                        n,
                    )
                });
            }
            for (to, n) in [("down", f.went_down), ("up", f.came_up)] {
                let mut l = labels.clone();
                l.push(("to", to.into()));
                changes.push(Metric {
                    labels: l,
                    ..Metric::counter(
                        "upstream_health_changes",
                        "upstream servers taken out (to=down) or brought back (to=up) by their health check",
                        n,
                    )
                });
            }
        }
    }
    out.extend(up);
    out.extend(checks);
    out.extend(changes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn status_lines_are_read_strictly() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 503"), Some(503));
        assert_eq!(status_of(b"HTTP/1.1 20"), None);
        assert_eq!(status_of(b"HTTP/1.1 2000 x"), None);
        assert_eq!(status_of(b"HTTP/2 200"), None);
        assert_eq!(status_of(b"SSH-2.0-OpenSSH"), None);
    }

    /// A server that answers one connection with `answer` (None: accepts and says nothing).
    fn server(answer: Option<&'static [u8]>) -> UpstreamAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            let req = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(
                req.starts_with("GET /health?x=1 HTTP/1.1\r\nHost: app.internal\r\n"),
                "{req}"
            );
            match answer {
                Some(a) => s.write_all(a).unwrap(),
                None => std::thread::sleep(Duration::from_secs(2)),
            }
        });
        UpstreamAddr::Tcp(addr)
    }

    #[test]
    fn a_check_reads_the_status_or_says_why_there_is_none() {
        let hc = HealthCheck {
            path: "/health?x=1".into(),
            host: Some("app.internal".into()),
            timeout: Duration::from_millis(300),
            ..HealthCheck::default()
        };
        assert_eq!(
            check(&server(Some(b"HTTP/1.1 204 No Content\r\n\r\n")), None, &hc),
            Ok(204)
        );
        assert_eq!(
            check(&server(Some(b"HTTP/1.1 500 Oops\r\n")), None, &hc),
            Ok(500)
        );
        assert_eq!(
            check(&server(Some(b"garbage\r\n")), None, &hc),
            Err("a malformed status line".into())
        );
        let t = Instant::now();
        assert_eq!(check(&server(None), None, &hc), Err("timed out".into()));
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
        let refused = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            UpstreamAddr::Tcp(l.local_addr().unwrap())
        };
        assert!(check(&refused, None, &hc).is_err());
    }
}
