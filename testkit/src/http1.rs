//! One keep-alive HTTP/1.1 connection that can pipeline ([`Client`]), over a `TcpStream` or
//! (see [`crate::tls`]) a rustls session on one, and its strict response reader.
//!
//! The reader frames answers as a client must: no body for HEAD, 1xx, 204 and 304; a
//! chunked body decoded strictly (when the test allows chunked answers at all); a
//! Content-Length body; otherwise the body runs to the close. Megabytes are cheap even in
//! debug builds (no per-byte loops).

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::find;

/// Read timeout of test clients: long enough for a loaded CI machine, short enough that a
/// server that never answers fails the test instead of hanging it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The most a client reads at once.
const FILL: usize = 64 * 1024;

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

/// How reading a response can end without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAnswer {
    /// The server closed the connection (FIN or reset) before the first byte of a response.
    Closed,
    /// Nothing (more) arrived within the read timeout.
    TimedOut,
    /// Anything else: a close inside a response, bytes that are not a response, a read error.
    Broken(String),
}

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoAnswer::Closed => f.write_str("the connection closed before a response"),
            NoAnswer::TimedOut => f.write_str("timed out waiting for the server"),
            NoAnswer::Broken(why) => f.write_str(why),
        }
    }
}

/// What a [`Client`] talks over: a `TcpStream`, or a TLS session on one.
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
/// [`crate::TlsClient`]) over TLS.
pub struct Client<S: Transport = TcpStream> {
    pub stream: S,
    /// Read but not yet taken as part of a response.
    buf: Vec<u8>,
    /// Chunked answers are decoded (a proxy's); otherwise one fails the test (static files
    /// always know their length).
    pub chunked_ok: bool,
    /// How long one read waits (see [`Client::read_timeout`]).
    read_timeout: Duration,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
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
            read_timeout: READ_TIMEOUT,
        }
    }

    /// The same client waiting `limit` (instead of [`READ_TIMEOUT`]) for each read.
    pub fn read_timeout(mut self, limit: Duration) -> Client<S> {
        self.read_timeout = limit;
        self.stream.socket().set_read_timeout(Some(limit)).unwrap();
        self
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

    /// [`read_answer`](Self::read_answer) with the reason as text.
    pub fn try_read_response(&mut self, head_only: bool) -> Result<Resp, String> {
        self.read_answer(head_only).map_err(|e| e.to_string())
    }

    /// [`read_answer`](Self::read_answer), waiting `limit` at most for each read.
    pub fn read_answer_within(
        &mut self,
        head_only: bool,
        limit: Duration,
    ) -> Result<Resp, NoAnswer> {
        self.stream.socket().set_read_timeout(Some(limit)).unwrap();
        let answer = self.read_answer(head_only);
        self.restore_timeout();
        answer
    }

    /// Reads one response, or says why there is none.
    pub fn read_answer(&mut self, head_only: bool) -> Result<Resp, NoAnswer> {
        let end = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end;
            }
            if self.fill(FILL)? == 0 {
                if self.buf.is_empty() {
                    return Err(NoAnswer::Closed);
                }
                return Err(NoAnswer::Broken(format!(
                    "connection closed before a full head; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                )));
            }
        };
        let head = String::from_utf8(self.buf[..end].to_vec())
            .map_err(|e| NoAnswer::Broken(format!("a head that is not UTF-8: {e}")))?;
        self.buf.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let bad_status = || NoAnswer::Broken(format!("bad status line {status_line:?}"));
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_owned();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad_status)?;
        if !version.starts_with("HTTP/1.") {
            return Err(bad_status());
        }
        let mut headers = Vec::new();
        for line in lines {
            let (n, v) = line
                .split_once(':')
                .ok_or_else(|| NoAnswer::Broken(format!("bad header line {line:?}")))?;
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
            "a chunked answer where none was expected (set chunked_ok where one is)"
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
                        return Err(NoAnswer::Broken(format!(
                            "connection closed after {} of {len} body bytes",
                            self.buf.len()
                        )));
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
    fn read_chunked(&mut self) -> Result<Vec<u8>, NoAnswer> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line()?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let n = usize::from_str_radix(size, 16)
                .map_err(|_| NoAnswer::Broken(format!("bad chunk size {line:?}")))?;
            if n == 0 {
                while !self.read_line()?.is_empty() {}
                return Ok(body);
            }
            while self.buf.len() < n + 2 {
                if self.fill(FILL)? == 0 {
                    return Err(NoAnswer::Broken(format!(
                        "closed inside a chunk after {} body bytes",
                        body.len()
                    )));
                }
            }
            let chunk = self.take(n + 2);
            if &chunk[n..] != b"\r\n" {
                return Err(NoAnswer::Broken("a chunk does not end with CRLF".into()));
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }

    /// One CRLF-terminated line, without its CRLF.
    fn read_line(&mut self) -> Result<String, NoAnswer> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = self.take(end + 2);
                return Ok(String::from_utf8_lossy(&line[..end]).into_owned());
            }
            if self.fill(FILL)? == 0 {
                return Err(NoAnswer::Broken("closed before the end of a line".into()));
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

    /// Everything until the server closes the connection (or a read fails or times out),
    /// after whatever was already buffered.
    pub fn read_to_close(&mut self) -> Vec<u8> {
        while let Ok(n) = self.fill(FILL) {
            if n == 0 {
                break;
            }
        }
        std::mem::take(&mut self.buf)
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
        self.closed_within(self.read_timeout)
    }

    /// True when the server closes the connection within `limit` with nothing else sent.
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.stream.socket().set_read_timeout(Some(limit)).unwrap();
        let r = self.fill(FILL);
        self.restore_timeout();
        matches!(r, Ok(0))
    }

    /// Bytes already buffered and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The bytes already read and not yet taken as part of a response.
    pub fn unread(&self) -> &[u8] {
        &self.buf
    }

    pub(crate) fn restore_timeout(&self) {
        self.stream
            .socket()
            .set_read_timeout(Some(self.read_timeout))
            .unwrap();
    }

    /// Reads at most `max` (up to [`FILL`]) bytes into the buffer; `Ok(0)` when the server has
    /// closed (EOF, a reset, or over TLS a TCP close without close_notify).
    fn fill(&mut self, max: usize) -> Result<usize, NoAnswer> {
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
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(NoAnswer::TimedOut)
                }
                Err(e) => return Err(NoAnswer::Broken(format!("read: {e}"))),
            }
        }
    }
}

/// `METHOD PATH HTTP/1.1` with `Host: test` and `headers`, ended by the empty line.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    for (n, v) in headers {
        r.push_str(&format!("{n}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// A server that writes `answer` after the first request head and then closes (or not).
    fn answering(answer: &'static [u8], close: bool) -> Client {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut chunk = [0u8; 1024];
            while find(&got, b"\r\n\r\n").is_none() {
                let n = s.read(&mut chunk).unwrap();
                got.extend_from_slice(&chunk[..n]);
            }
            s.write_all(answer).unwrap();
            if !close {
                std::thread::sleep(Duration::from_secs(2));
            }
        });
        let mut c = Client::connect(addr).read_timeout(Duration::from_millis(500));
        c.send(&request_bytes("GET", "/", &[]));
        c
    }

    #[test]
    fn pipelined_answers_are_framed_by_length_and_chunks() {
        let mut c = answering(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc\
              HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n\
              HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nde\r\n1\r\nf\r\n0\r\nT: 1\r\n\r\n\
              HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
            true,
        );
        c.chunked_ok = true;
        let r = c.read_response(false);
        assert_eq!((r.status, r.text().as_str()), (200, "abc"));
        let r = c.read_response(false);
        assert_eq!((r.status, r.body.len()), (304, 0));
        assert_eq!(c.read_response(false).text(), "def");
        let r = c.read_response(false);
        assert!(r.closes());
        assert_eq!(r.text(), "to the end");
        assert_eq!(c.read_answer(false).unwrap_err(), NoAnswer::Closed);
    }

    #[test]
    fn a_short_body_a_bad_chunk_and_silence_are_told_apart() {
        let mut c = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", true);
        assert!(
            matches!(c.read_answer(false), Err(NoAnswer::Broken(why)) if why.contains("3 of 10"))
        );
        let mut c = answering(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc",
            true,
        );
        c.chunked_ok = true;
        assert!(matches!(c.read_answer(false), Err(NoAnswer::Broken(_))));
        let mut c = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n", false);
        assert_eq!(c.read_answer(false).unwrap_err(), NoAnswer::TimedOut);
        let mut c = answering(b"SSH-2.0-x\r\n\r\n", true);
        assert!(
            matches!(c.read_answer(false), Err(NoAnswer::Broken(why)) if why.contains("status line"))
        );
    }
}
