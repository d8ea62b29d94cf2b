//! What tern's test suites share, so that each helper is written (and fixed) once: the
//! end-to-end suites (`cli/tests`), the server's own socket tests (`server/tests`), the IPv4
//! Games' tests and the fuzz targets.
//!
//! - [`http1`]: one keep-alive HTTP/1.1 connection that can pipeline ([`Client`]) and its
//!   strict response reader, over plain TCP or (with [`tls`]) a rustls session.
//! - [`tls`]: the TLS transport of that client, and [`AnyCert`], a verifier that accepts any
//!   certificate (whose signatures must still check out).
//! - [`pattern`]: the bytes of large test files, any window of which can be checked.
//! - [`find`], [`eventually`], [`free_port`]: small things every suite wrote again.
//!
//! A dev-dependency only: it never reaches a release build.

pub mod http1;
pub mod pattern;
pub mod tls;

use std::time::{Duration, Instant};

pub use http1::{request_bytes, Client, NoAnswer, Resp, Transport, READ_TIMEOUT};
pub use tls::{AnyCert, TlsClient, TlsStream};

/// Where `needle` first starts in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
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

/// A port nothing listens on now, for a server that must be told its port before it starts
/// (Pebble and tern's ACME challenges): free for TCP and UDP once the probe closes.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Not the kernel's pick of a free port (bind to port 0): that is one from its ephemeral
    // range, which it may hand to another test's socket between this call and the bind that
    // follows, and tern's listeners take SO_REUSEPORT, so two of them would then share the
    // port and its connections (one test saw another's HTTPS listener answer its plain
    // requests). Ports below that range are never given to a socket bound to port 0 nor
    // used as a client's source port; each call of this process takes the next one, from a
    // place set by the process id.
    const FIRST: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_start.saturating_sub(FIRST);
    if span < 1_000 {
        let any = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        return any.local_addr().unwrap().port();
    }
    let start = std::process::id().wrapping_mul(7_919) % span;
    loop {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        // Free for TCP and UDP alike (an HTTPS listener of tern's binds both).
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_names_the_first_place() {
        assert_eq!(find(b"a\r\n\r\nb\r\n\r\n", b"\r\n\r\n"), Some(1));
        assert_eq!(find(b"abc", b"abcd"), None);
        assert_eq!(find(b"abc", b"x"), None);
    }

    #[test]
    fn eventually_gives_up_after_its_limit() {
        let started = Instant::now();
        assert!(!eventually(Duration::from_millis(60), || false));
        assert!(started.elapsed() >= Duration::from_millis(60));
        let mut calls = 0;
        assert!(eventually(Duration::from_secs(5), || {
            calls += 1;
            calls == 3
        }));
    }
}
