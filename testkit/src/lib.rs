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

/// A port nothing listens on now (the kernel's pick; free again once the probe closes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
