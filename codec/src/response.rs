/// The interim response sent before reading a body the client announced with
/// `Expect: 100-continue`.
pub const CONTINUE_100: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

const SERVER_LINE: &[u8] = b"Server: tern\r\n";

/// What the `Connection` header of a response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionHeader {
    /// HTTP/1.1 keep-alive: the default, so no header is written.
    Persistent,
    /// HTTP/1.0 client that asked for keep-alive: it must be told explicitly.
    KeepAlive,
    /// The connection closes after this response.
    Close,
}

impl ConnectionHeader {
    /// What an answer says: close, or keep-alive in the form the client's version needs.
    pub fn for_answer(keep_alive: bool, http10: bool) -> ConnectionHeader {
        match (keep_alive, http10) {
            (false, _) => ConnectionHeader::Close,
            (true, true) => ConnectionHeader::KeepAlive,
            (true, false) => ConnectionHeader::Persistent,
        }
    }
}

/// A response head, written straight into the caller's output buffer from pre-serialized
/// pieces: a static status line, the cached Date line, caller-prepared header lines, and an
/// `itoa` Content-Length. No `format!`, no allocation beyond the buffer's own growth.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    pub status: u16,
    /// The complete `Date: ...\r\n` line (see [`crate::format_date_line`]).
    pub date_line: &'a [u8],
    /// Extra header lines, each `Name: value\r\n`.
    pub headers: &'a [u8],
    /// `Some(n)` writes `Content-Length: n`; `None` writes none (1xx, 204, 304, or chunked).
    pub content_length: Option<u64>,
    pub chunked: bool,
    pub connection: ConnectionHeader,
}

impl ResponseHead<'_> {
    pub fn write_to(&self, out: &mut Vec<u8>) {
        write_status_line(out, self.status);
        out.extend_from_slice(self.date_line);
        out.extend_from_slice(SERVER_LINE);
        out.extend_from_slice(self.headers);
        if let Some(n) = self.content_length {
            out.extend_from_slice(b"Content-Length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if self.chunked {
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        }
        match self.connection {
            ConnectionHeader::Persistent => {}
            ConnectionHeader::KeepAlive => out.extend_from_slice(b"Connection: keep-alive\r\n"),
            ConnectionHeader::Close => out.extend_from_slice(b"Connection: close\r\n"),
        }
        out.extend_from_slice(b"\r\n");
    }
}

fn write_status_line(out: &mut Vec<u8>, status: u16) {
    let line: &[u8] = match status {
        // status-code is exactly three digits (RFC 9112 §4). A status outside 100..=999 is a
        // handler bug; writing it would put a malformed status line on the wire (`HTTP/1.1 42 `)
        // that clients and proxies handle unpredictably, so it is answered as what it is.
        0..=99 | 1000.. => b"HTTP/1.1 500 Internal Server Error\r\n",
        200 => b"HTTP/1.1 200 OK\r\n",
        204 => b"HTTP/1.1 204 No Content\r\n",
        206 => b"HTTP/1.1 206 Partial Content\r\n",
        301 => b"HTTP/1.1 301 Moved Permanently\r\n",
        304 => b"HTTP/1.1 304 Not Modified\r\n",
        400 => b"HTTP/1.1 400 Bad Request\r\n",
        404 => b"HTTP/1.1 404 Not Found\r\n",
        405 => b"HTTP/1.1 405 Method Not Allowed\r\n",
        429 => b"HTTP/1.1 429 Too Many Requests\r\n",
        503 => b"HTTP/1.1 503 Service Unavailable\r\n",
        _ => {
            out.extend_from_slice(b"HTTP/1.1 ");
            out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
            out.push(b' ');
            out.extend_from_slice(reason_phrase(status).as_bytes());
            out.extend_from_slice(b"\r\n");
            return;
        }
    };
    out.extend_from_slice(line);
}

/// The standard reason phrase for a status code ("" for unknown codes, which is valid).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}
