//! Helpers for the HTTP/2 end-to-end tests (`tests/http2.rs`), on top of `support` (the `Tern`
//! process) and `support/tls.rs` (the test CA and rustls client configurations):
//!
//! - [`H2Conn`]: the `h2` crate as a client, on the test's tokio runtime, over plain TCP with
//!   prior knowledge or over TLS with ALPN `h2`; [`H2Resp`] is a whole response.
//! - [`RawH2`]: a blocking client that writes frames by hand and reads them back undecoded, for
//!   what `h2` will not send (uppercase names, connection-specific headers) and for watching
//!   the frames themselves (RST_STREAM codes, GOAWAY, flow control). Its HPACK is literal
//!   fields without indexing or Huffman coding; it never decodes the server's header blocks.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::{self, ResponseFuture, SendRequest};
use http::{HeaderMap, Method, Request};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;

/// How long a test waits for anything from the server before failing.
pub const H2_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The h2 crate as a client
// ---------------------------------------------------------------------------------------------

/// One HTTP/2 connection made with the `h2` crate. Its connection task runs on the current
/// tokio runtime (the test's), so every use must be inside that runtime.
pub struct H2Conn {
    pub send: SendRequest<Bytes>,
    /// The connection task: `Ok(())` once the connection ended cleanly.
    pub task: tokio::task::JoinHandle<Result<(), h2::Error>>,
    /// `http` or `https`, for the `:scheme` of requests.
    pub scheme: &'static str,
    /// The `:authority` of requests.
    pub authority: String,
    /// The ALPN protocol the TLS handshake chose (`None` over plain TCP).
    pub alpn: Option<Vec<u8>>,
}

/// A client builder with push disabled (tern never pushes; a PUSH_PROMISE would then be a
/// connection error here).
pub fn builder() -> client::Builder {
    let mut b = client::Builder::new();
    b.enable_push(false);
    b
}

impl H2Conn {
    /// HTTP/2 with prior knowledge on the plain port.
    pub async fn h2c(addr: SocketAddr) -> H2Conn {
        H2Conn::h2c_with(addr, builder()).await
    }

    pub async fn h2c_with(addr: SocketAddr, builder: client::Builder) -> H2Conn {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        tcp.set_nodelay(true).unwrap();
        let (send, conn) = builder
            .handshake::<_, Bytes>(tcp)
            .await
            .unwrap_or_else(|e| panic!("h2c handshake with {addr}: {e}"));
        H2Conn {
            send,
            task: tokio::spawn(conn),
            scheme: "http",
            authority: addr.to_string(),
            alpn: None,
        }
    }

    /// TLS as `name`, then HTTP/2 if ALPN chose `h2`; `Err(alpn)` with what it chose instead.
    pub async fn tls(
        addr: SocketAddr,
        config: &Arc<ClientConfig>,
        name: &str,
    ) -> Result<H2Conn, Option<Vec<u8>>> {
        H2Conn::tls_with(addr, config, name, builder()).await
    }

    pub async fn tls_with(
        addr: SocketAddr,
        config: &Arc<ClientConfig>,
        name: &str,
        builder: client::Builder,
    ) -> Result<H2Conn, Option<Vec<u8>>> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        tcp.set_nodelay(true).unwrap();
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let server_name = ServerName::try_from(name.to_owned()).unwrap();
        let tls = connector
            .connect(server_name, tcp)
            .await
            .unwrap_or_else(|e| panic!("TLS handshake with {addr} as {name:?}: {e}"));
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        if alpn.as_deref() != Some(b"h2") {
            return Err(alpn);
        }
        let (send, conn) = builder
            .handshake::<_, Bytes>(tls)
            .await
            .unwrap_or_else(|e| panic!("h2 handshake over TLS with {addr}: {e}"));
        Ok(H2Conn {
            send,
            task: tokio::spawn(conn),
            scheme: "https",
            authority: format!("{name}:{}", addr.port()),
            alpn,
        })
    }

    /// A request for `path` with `headers`, ready to send.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(format!("{}://{}{}", self.scheme, self.authority, path));
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        req.body(()).unwrap()
    }

    /// Opens a stream for `method path` with `headers` and `body` (none: the HEADERS frame ends
    /// the stream), waiting for the server's concurrency limit if need be. The returned future
    /// is the whole response; it does not borrow the connection, so many can be in flight.
    pub async fn start(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<impl std::future::Future<Output = Result<H2Resp, h2::Error>>, h2::Error> {
        let req = self.request(method, path, headers);
        let mut send = self.send.clone().ready().await?;
        let (resp, mut stream) = send.send_request(req, body.is_none())?;
        if let Some(body) = body {
            // Buffered by h2 and sent as the server's windows allow. A server that answers
            // early and resets the stream makes this fail; the response says what happened.
            let _ = stream.send_data(Bytes::copy_from_slice(body), true);
        }
        Ok(read_response(resp))
    }

    /// Like [`start`](Self::start), then waits for the whole response (bounded by
    /// [`H2_TIMEOUT`]).
    pub async fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<H2Resp, h2::Error> {
        let fut = self.start(method, path, headers, body).await?;
        within(H2_TIMEOUT, &format!("{method} {path}"), fut).await
    }

    /// A GET that must succeed at the HTTP/2 level (any status).
    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> H2Resp {
        self.try_request("GET", path, headers, None)
            .await
            .unwrap_or_else(|e| panic!("GET {path} over HTTP/2: {e}"))
    }

    /// Whether the connection task has ended (and how), without waiting.
    pub fn ended(&self) -> bool {
        self.task.is_finished()
    }
}

/// Waits for `fut` at most `limit`; panics naming `what` when it takes longer.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {limit:?}"),
    }
}

/// Reads a whole response, giving flow-control capacity back as the data is consumed.
pub async fn read_response(fut: ResponseFuture) -> Result<H2Resp, h2::Error> {
    let resp = fut.await?;
    let (parts, mut body) = resp.into_parts();
    let ended_with_headers = body.is_end_stream();
    let mut data = Vec::new();
    let mut chunks = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        chunks += 1;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    // Trailers end the stream too (the suites check none, but an error in them must show).
    body.trailers().await?;
    Ok(H2Resp {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: data,
        data_chunks: chunks,
        ended_with_headers,
    })
}

/// A whole HTTP/2 response.
#[derive(Debug)]
pub struct H2Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// How many non-empty DATA chunks came (0 for HEAD, 304...).
    pub data_chunks: usize,
    /// The HEADERS frame carried END_STREAM: no DATA frame at all.
    pub ended_with_headers: bool,
}

impl H2Resp {
    /// The value of a header; panics if it appears twice.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut all = self.headers.get_all(name).iter();
        let first = all
            .next()
            .map(|v| v.to_str().expect("a visible-ASCII value"));
        assert!(all.next().is_none(), "header {name} appears twice");
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
}

/// Header names HTTP/2 forbids in a message (RFC 9113 section 8.2.2).
pub const CONNECTION_SPECIFIC: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// Panics if a response carries a connection-specific header.
pub fn assert_no_connection_headers(resp: &H2Resp, what: &str) {
    for name in CONNECTION_SPECIFIC {
        assert!(
            resp.headers.get(*name).is_none(),
            "{what}: connection-specific header {name} in an HTTP/2 response: {:?}",
            resp.headers
        );
    }
}

/// A rustls client configuration trusting `ca`, offering ALPN `protocols` in that order.
pub fn alpn_config(ca: &crate::tls_support::Ca, protocols: &[&str]) -> Arc<ClientConfig> {
    let mut config = crate::tls_support::client_config(
        ca,
        &[crate::tls_support::TLS13, crate::tls_support::TLS12],
    );
    config.alpn_protocols = protocols.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

// ---------------------------------------------------------------------------------------------
// Frames by hand
// ---------------------------------------------------------------------------------------------

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;

pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// One frame as read: type, flags, stream and payload (padding included, nothing decoded).
#[derive(Clone)]
pub struct Frame {
    pub ty: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

fn type_name(ty: u8) -> &'static str {
    match ty {
        DATA => "DATA",
        HEADERS => "HEADERS",
        0x2 => "PRIORITY",
        RST_STREAM => "RST_STREAM",
        SETTINGS => "SETTINGS",
        PUSH_PROMISE => "PUSH_PROMISE",
        PING => "PING",
        GOAWAY => "GOAWAY",
        WINDOW_UPDATE => "WINDOW_UPDATE",
        CONTINUATION => "CONTINUATION",
        _ => "UNKNOWN",
    }
}

pub fn error_name(code: u32) -> &'static str {
    match code {
        0x0 => "NO_ERROR",
        0x1 => "PROTOCOL_ERROR",
        0x2 => "INTERNAL_ERROR",
        0x3 => "FLOW_CONTROL_ERROR",
        0x4 => "SETTINGS_TIMEOUT",
        0x5 => "STREAM_CLOSED",
        0x6 => "FRAME_SIZE_ERROR",
        0x7 => "REFUSED_STREAM",
        0x8 => "CANCEL",
        0x9 => "COMPRESSION_ERROR",
        0xa => "CONNECT_ERROR",
        0xb => "ENHANCE_YOUR_CALM",
        0xc => "INADEQUATE_SECURITY",
        0xd => "HTTP_1_1_REQUIRED",
        _ => "unknown error code",
    }
}

impl Frame {
    /// RST_STREAM's or GOAWAY's error code.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.ty {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes(b.try_into().unwrap()))
    }

    /// GOAWAY's last stream id.
    pub fn last_stream(&self) -> Option<u32> {
        if self.ty != GOAWAY || self.payload.len() < 8 {
            return None;
        }
        Some(u32::from_be_bytes(self.payload[..4].try_into().unwrap()) & 0x7fff_ffff)
    }

    pub fn end_stream(&self) -> bool {
        matches!(self.ty, DATA | HEADERS) && self.flags & END_STREAM != 0
    }

    /// A DATA frame's data (padding removed).
    pub fn data(&self) -> &[u8] {
        assert_eq!(self.ty, DATA);
        if self.flags & 0x8 != 0 {
            let pad = self.payload[0] as usize;
            &self.payload[1..self.payload.len() - pad]
        } else {
            &self.payload
        }
    }

    /// SETTINGS parameters (identifier, value).
    pub fn settings(&self) -> Vec<(u16, u32)> {
        assert_eq!(self.ty, SETTINGS);
        self.payload
            .chunks_exact(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect()
    }
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}(stream {}, flags {:#04x}, {} bytes",
            type_name(self.ty),
            self.stream,
            self.flags,
            self.payload.len()
        )?;
        match self.ty {
            RST_STREAM => write!(f, ", {}", error_name(self.error_code().unwrap_or(u32::MAX)))?,
            GOAWAY => write!(
                f,
                ", last stream {}, {}, debug {:?}",
                self.last_stream().unwrap_or(0),
                error_name(self.error_code().unwrap_or(u32::MAX)),
                String::from_utf8_lossy(self.payload.get(8..).unwrap_or_default())
            )?,
            SETTINGS => write!(f, ", {:?}", self.settings())?,
            WINDOW_UPDATE if self.payload.len() == 4 => write!(
                f,
                ", +{}",
                u32::from_be_bytes(self.payload[..4].try_into().unwrap())
            )?,
            _ => {}
        }
        write!(f, ")")
    }
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `first` (RFC 7541 5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A header block of literal fields without indexing, new names, no Huffman coding: the name
/// and value bytes go on the wire exactly as given.
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_int(&mut out, 0x00, 7, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, 0x00, 7, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// A blocking HTTP/2 client over plain TCP (prior knowledge) that writes frames by hand.
pub struct RawH2 {
    pub sock: TcpStream,
    buf: Vec<u8>,
    /// Every frame read so far, for failure messages.
    pub seen: Vec<Frame>,
    /// The server's SETTINGS (the first non-ACK SETTINGS frame), once read.
    pub server_settings: Option<Vec<(u16, u32)>>,
}

impl RawH2 {
    /// Connects, sends the preface and a SETTINGS frame with `settings`.
    pub fn connect(addr: SocketAddr, settings: &[(u16, u32)]) -> RawH2 {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        sock.set_nodelay(true).unwrap();
        let mut raw = RawH2 {
            sock,
            buf: Vec::new(),
            seen: Vec::new(),
            server_settings: None,
        };
        let mut hello = PREFACE.to_vec();
        let payload: Vec<u8> = settings
            .iter()
            .flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes()))
            .collect();
        hello.extend(frame_bytes(SETTINGS, 0, 0, &payload));
        raw.write(&hello);
        raw
    }

    pub fn write(&mut self, bytes: &[u8]) {
        self.sock
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write: {e}; frames so far: {:?}", self.seen));
    }

    pub fn frame(&mut self, ty: u8, flags: u8, stream: u32, payload: &[u8]) {
        self.write(&frame_bytes(ty, flags, stream, payload));
    }

    /// A request's HEADERS frame (END_HEADERS; END_STREAM unless `more` follows) with
    /// `:method`, `:scheme http`, `:authority`, `:path` first, then `extra` as given.
    pub fn request(
        &mut self,
        stream: u32,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        more: bool,
    ) {
        let mut fields = vec![
            (":method", method),
            (":scheme", "http"),
            (":authority", "localhost"),
            (":path", path),
        ];
        fields.extend_from_slice(extra);
        let flags = END_HEADERS | if more { 0 } else { END_STREAM };
        self.frame(HEADERS, flags, stream, &header_block(&fields));
    }

    pub fn window_update(&mut self, stream: u32, increment: u32) {
        self.frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes());
    }

    /// The next frame, answering SETTINGS (ACK) and PING (ACK) on the way (they are returned
    /// too); `None` when the server closed the connection or `limit` passed.
    pub fn next_frame(&mut self, limit: Duration) -> Option<Frame> {
        let deadline = Instant::now() + limit;
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let f = Frame {
                        ty: self.buf[3],
                        flags: self.buf[4],
                        stream: u32::from_be_bytes(self.buf[5..9].try_into().unwrap())
                            & 0x7fff_ffff,
                        payload: self.buf[9..9 + len].to_vec(),
                    };
                    self.buf.drain(..9 + len);
                    if f.ty == SETTINGS && f.flags & ACK == 0 {
                        if self.server_settings.is_none() {
                            self.server_settings = Some(f.settings());
                        }
                        let _ = self.sock.write_all(&frame_bytes(SETTINGS, ACK, 0, &[]));
                    }
                    if f.ty == PING && f.flags & ACK == 0 {
                        let _ = self.sock.write_all(&frame_bytes(PING, ACK, 0, &f.payload));
                    }
                    self.seen.push(f.clone());
                    return Some(f);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.sock.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 65536];
            match self.sock.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return None
                }
                Err(_) => return None,
            }
        }
    }

    /// Reads frames until `pick` chooses one, and returns it; panics (listing every frame read
    /// on this connection) if the connection ends or [`H2_TIMEOUT`] passes first.
    pub fn until(&mut self, what: &str, mut pick: impl FnMut(&Frame) -> bool) -> Frame {
        let deadline = Instant::now() + H2_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_frame(left) {
                Some(f) if pick(&f) => return f,
                Some(_) => {}
                None => panic!(
                    "waiting for {what}: the connection ended or went quiet; frames read: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Reads one response on `stream` (HEADERS, then DATA up to END_STREAM) and returns its
    /// body; panics on RST_STREAM or GOAWAY with an error.
    pub fn response_body(&mut self, stream: u32) -> Vec<u8> {
        let mut body = Vec::new();
        let mut got_headers = false;
        loop {
            let f = self.until(&format!("the response on stream {stream}"), |f| {
                f.stream == stream || f.ty == GOAWAY
            });
            match f.ty {
                HEADERS => got_headers = true,
                DATA => {
                    assert!(got_headers, "DATA before HEADERS on stream {stream}");
                    body.extend_from_slice(f.data());
                    if !f.data().is_empty() {
                        // Keep both windows open.
                        let n = f.payload.len() as u32;
                        self.window_update(0, n);
                        if !f.end_stream() {
                            self.window_update(stream, n);
                        }
                    }
                }
                GOAWAY if f.error_code() == Some(NO_ERROR) => continue,
                _ => panic!("stream {stream}: {f:?}; frames read: {:?}", self.seen),
            }
            if f.end_stream() {
                return body;
            }
        }
    }

    /// True when the server closes the connection within `limit`, by FIN or reset (frames
    /// before the close are read and kept in `seen`).
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        self.close_within(limit) != Closed::Open
    }

    /// How the connection ends within `limit`: a clean FIN, a reset, or not at all.
    pub fn close_within(&mut self, limit: Duration) -> Closed {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Closed::Open;
            }
            self.sock.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 65536];
            match self.sock.read(&mut chunk) {
                Ok(0) => return Closed::Fin,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    while self.next_frame(Duration::from_millis(1)).is_some() {}
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Closed::Reset,
                Err(_) => return Closed::Open,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    Fin,
    Reset,
    Open,
}

/// A frame's bytes.
pub fn frame_bytes(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}
