use std::borrow::Cow;
use std::mem::MaybeUninit;

use crate::body::BodyKind;
use crate::error::RequestError;
use crate::path::{canonical_path, canonical_path_opaque_slash};

/// Default cap on header fields per request (more is answered 431).
pub const MAX_HEADERS_DEFAULT: usize = 100;

/// Per-request limits. The caller owns them so each server (or route) can tighten them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Request line + headers, in bytes.
    pub max_head: usize,
    /// Number of header fields. Values above [`MAX_HEADERS_DEFAULT`] are clamped to it because
    /// the parser's header array lives on the stack.
    pub max_headers: usize,
    /// Request body, in bytes (declared Content-Length or decoded chunked total).
    pub max_body: u64,
    /// Keep `%2F` in the path as an opaque escape ([`crate::canonical_path_opaque_slash`])
    /// rather than refuse it: for servers where a handler refuses it itself wherever it is
    /// not taken (`tern run`: routes with `allow_encoded_slash`). Off: 400 (`BadPath`).
    pub allow_encoded_slash: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 32 * 1024,
            max_headers: MAX_HEADERS_DEFAULT,
            max_body: 1024 * 1024,
            allow_encoded_slash: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
    /// HTTP/2: the fields came from HPACK (see [`head_from_fields`]), not a request line.
    Http2,
    /// HTTP/3: the fields came from QPACK; set by the HTTP/3 connection on the head
    /// [`head_from_fields`] made.
    Http3,
}

/// The request method. Unknown but well-formed tokens are `Other`; routes answer them 405/501.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Patch,
    Trace,
    Connect,
    Other,
}

impl Method {
    pub fn from_token(token: &str) -> Method {
        match token {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            "PATCH" => Method::Patch,
            "TRACE" => Method::Trace,
            "CONNECT" => Method::Connect,
            _ => Method::Other,
        }
    }
}

/// A parsed request head. Borrows the caller's read buffer; nothing is copied.
#[derive(Debug)]
pub struct RequestHead<'a> {
    pub method: Method,
    /// The method token exactly as sent.
    pub method_str: &'a str,
    /// The request-target exactly as sent.
    pub target: &'a str,
    /// The path of the target in its canonical form ([`crate::canonical_path`]): still
    /// percent-encoded, but with unreserved escapes decoded and dot and empty segments
    /// resolved, so every decision (route, guard, file, the request line a proxy sends) is
    /// made on the same value. Borrowed unless normalising changed it. `*` for asterisk-form.
    pub path: Cow<'a, str>,
    /// The query string without the `?`, if any.
    pub query: Option<&'a str>,
    pub version: Version,
    /// Bytes of the head including the final CRLF; the body (if any) starts here.
    pub head_len: usize,
    pub body: BodyKind,
    /// Whether the connection may stay open after this exchange (from version + Connection).
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub host: Option<&'a [u8]>,
    // Headers the built-in handlers read on every request, found in the single header pass so
    // that handlers don't rescan.
    pub accept: Option<&'a [u8]>,
    pub accept_encoding: Option<&'a [u8]>,
    pub if_none_match: Option<&'a [u8]>,
    pub if_modified_since: Option<&'a [u8]>,
    pub range: Option<&'a [u8]>,
    pub if_range: Option<&'a [u8]>,
    /// For access logs (found in the same pass, so a log line costs no second scan).
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
    pub headers: &'a [httparse::Header<'a>],
    /// HTTP/2 extended CONNECT's `:protocol` (RFC 8441; `websocket`): the request is
    /// presented as the GET an HTTP/1.1 handshake would be, and asks for a tunnel speaking
    /// this protocol. None for every other request.
    pub protocol: Option<&'a str>,
}

/// What the request line (or HTTP/2's pseudo-headers) says.
struct RequestLine<'a> {
    method: Method,
    method_str: &'a str,
    target: &'a str,
    path: Cow<'a, str>,
    query: Option<&'a str>,
    version: Version,
}

impl<'a> RequestHead<'a> {
    /// A head before [`scan_headers`] fills in framing and the fields handlers read.
    fn unscanned(
        line: RequestLine<'a>,
        head_len: usize,
        headers: &'a [httparse::Header<'a>],
    ) -> RequestHead<'a> {
        RequestHead {
            method: line.method,
            method_str: line.method_str,
            target: line.target,
            path: line.path,
            query: line.query,
            version: line.version,
            head_len,
            body: BodyKind::None,
            keep_alive: line.version != Version::Http10,
            expect_continue: false,
            host: None,
            accept: None,
            accept_encoding: None,
            if_none_match: None,
            if_modified_since: None,
            range: None,
            if_range: None,
            referer: None,
            user_agent: None,
            headers,
            protocol: None,
        }
    }

    /// The same request with another path (an internal rewrite, a stripped prefix), which
    /// must be canonical already ([`crate::canonical_path`]): everything that decides on or
    /// forwards the new head then sees that path, and nothing else changes.
    pub fn with_path<'p>(&self, path: Cow<'p, str>) -> RequestHead<'p>
    where
        'a: 'p,
    {
        RequestHead {
            method: self.method,
            method_str: self.method_str,
            target: self.target,
            path,
            query: self.query,
            version: self.version,
            head_len: self.head_len,
            body: self.body,
            keep_alive: self.keep_alive,
            expect_continue: self.expect_continue,
            host: self.host,
            accept: self.accept,
            accept_encoding: self.accept_encoding,
            if_none_match: self.if_none_match,
            if_modified_since: self.if_modified_since,
            range: self.range,
            if_range: self.if_range,
            referer: self.referer,
            user_agent: self.user_agent,
            headers: self.headers,
            protocol: self.protocol,
        }
    }

    /// First value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    /// Every value of a header, in order.
    pub fn header_all<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        self.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }
}

/// Outcome of feeding the bytes received so far.
// The head is large (~224 bytes of borrowed slices) but lives on the stack for one request;
// boxing it, as clippy suggests, would cost an allocation per request on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parsed<'a> {
    Complete(RequestHead<'a>),
    /// More bytes are needed; the buffer is still under the head limit.
    Partial,
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// Parses one request head from the start of `buf`.
///
/// `headers` is scratch space (uninitialised is fine) whose length caps the header count.
/// On success the returned head borrows `buf` and `headers`.
pub fn parse_request<'a>(
    buf: &'a [u8],
    headers: &'a mut [MaybeUninit<httparse::Header<'a>>],
    limits: &Limits,
) -> Result<Parsed<'a>, RequestError> {
    // HTTP/2 prior knowledge: say so precisely rather than "bad request line".
    let probe = buf.len().min(H2_PREFACE.len());
    if probe >= 4 && buf[..probe] == H2_PREFACE[..probe] {
        return if probe == H2_PREFACE.len() {
            Err(RequestError::Http2Preface)
        } else {
            Ok(Parsed::Partial)
        };
    }

    // Only the first `max_head` bytes can hold an acceptable head, so only they are parsed.
    // That makes the verdict a function of those bytes alone. Before, a head still incomplete
    // at the limit was answered 431 if the bytes stopped there, but 400 if a bad byte beyond
    // the limit had arrived in the same read: the status depended on segmentation.
    let buf = &buf[..buf.len().min(limits.max_head)];

    let max_headers = limits.max_headers.min(headers.len());
    let mut req = httparse::Request::new(&mut []);
    let status = req.parse_with_uninit_headers(buf, &mut headers[..max_headers]);
    let head_len = match status {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() >= limits.max_head {
                return Err(RequestError::HeadTooLarge);
            }
            return Ok(Parsed::Partial);
        }
        Err(e) => return Err(classify_parse_error(e, buf)),
    };
    // head_len <= buf.len() <= max_head here, thanks to the truncation above.
    if has_bare_lf(&buf[..head_len]) {
        return Err(RequestError::BareLf);
    }

    let method_str = req.method.ok_or(RequestError::BadRequestLine)?;
    check_method_case(method_str)?;
    let target = req.path.ok_or(RequestError::BadRequestLine)?;
    let version = match req.version {
        Some(0) => Version::Http10,
        Some(1) => Version::Http11,
        _ => return Err(RequestError::UnsupportedVersion),
    };
    let method = Method::from_token(method_str);
    let (path, query) = split_target(method, target)?;
    let path = canonical(path, limits)?;

    let headers: &'a [httparse::Header<'a>] = req.headers;
    let line = RequestLine {
        method,
        method_str,
        target,
        path,
        query,
        version,
    };
    let mut head = RequestHead::unscanned(line, head_len, headers);
    scan_headers(&mut head, limits)?;
    Ok(Parsed::Complete(head))
}

/// The one canonical path of a request (see [`crate::canonical_path`]).
fn canonical<'a>(path: &'a str, limits: &Limits) -> Result<Cow<'a, str>, RequestError> {
    let path = if limits.allow_encoded_slash {
        canonical_path_opaque_slash(path)
    } else {
        canonical_path(path)
    };
    path.map_err(|_| RequestError::BadPath)
}

/// A request head from fields another protocol decoded (HTTP/2's pseudo-headers and HPACK
/// fields): the target is split and checked, and the fields scanned, exactly as for HTTP/1.1,
/// so handlers see the same head whatever the protocol. `authority` stands in for Host when
/// the request has none. The caller has already applied its own protocol's field rules.
pub fn head_from_fields<'a>(
    method_str: &'a str,
    target: &'a str,
    authority: Option<&'a [u8]>,
    headers: &'a [httparse::Header<'a>],
    limits: &Limits,
) -> Result<RequestHead<'a>, RequestError> {
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic() || b >= 0x80) {
        return Err(RequestError::BadRequestLine);
    }
    check_method_case(method_str)?;
    let method = Method::from_token(method_str);
    let (path, query) = split_target(method, target)?;
    let path = canonical(path, limits)?;
    let line = RequestLine {
        method,
        method_str,
        target,
        path,
        query,
        version: Version::Http2,
    };
    let mut head = RequestHead::unscanned(line, 0, headers);
    scan_headers(&mut head, limits)?;
    if let Some(a) = authority {
        if !valid_host(a) {
            return Err(RequestError::BadHeader);
        }
        // One authority (RFC 9113 §8.3.1): a Host naming another site than `:authority` is
        // refused, so the site, the gate and the upstream's Host all come from one value.
        if head.host.is_some_and(|h| !h.eq_ignore_ascii_case(a)) {
            return Err(RequestError::BadHeader);
        }
        head.host = Some(a);
    }
    Ok(head)
}

/// One pass over the header fields: framing (Content-Length / Transfer-Encoding), connection
/// management, and the handful of fields the built-in handlers need.
fn scan_headers(head: &mut RequestHead<'_>, limits: &Limits) -> Result<(), RequestError> {
    let mut host_count = 0u32;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut saw_te = false;
    let mut conn_close = false;
    let mut conn_keep_alive = false;

    for h in head.headers {
        let name = h.name.as_bytes();
        let value = h.value;
        // httparse already rejects CR, LF and NUL in values; obs-text is allowed (RFC 9110).
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => {
                // RFC 9112 §3.2: a Host with an invalid field value MUST be answered 400.
                if !valid_host(value) {
                    return Err(RequestError::BadHeader);
                }
                host_count += 1;
                head.host = Some(value);
            }
            5 if name.eq_ignore_ascii_case(b"range") => head.range = Some(value),
            6 if name.eq_ignore_ascii_case(b"accept") => head.accept = Some(value),
            7 if name.eq_ignore_ascii_case(b"referer") => head.referer = Some(value),
            6 if name.eq_ignore_ascii_case(b"expect") => {
                if trim_ows(value).eq_ignore_ascii_case(b"100-continue") {
                    head.expect_continue = true;
                } else {
                    return Err(RequestError::BadExpectation);
                }
            }
            8 if name.eq_ignore_ascii_case(b"if-range") => head.if_range = Some(value),
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in value.split(|&b| b == b',').map(trim_ows) {
                    if token.eq_ignore_ascii_case(b"close") {
                        conn_close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        conn_keep_alive = true;
                    }
                }
            }
            10 if name.eq_ignore_ascii_case(b"user-agent") => head.user_agent = Some(value),
            13 if name.eq_ignore_ascii_case(b"if-none-match") => head.if_none_match = Some(value),
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                let n = parse_content_length(value)?;
                if content_length.is_some_and(|prev| prev != n) {
                    return Err(RequestError::BadContentLength);
                }
                content_length = Some(n);
            }
            15 if name.eq_ignore_ascii_case(b"accept-encoding") => {
                head.accept_encoding = Some(value)
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                saw_te = true;
                chunked = parse_transfer_encoding(value, chunked)?;
            }
            17 if name.eq_ignore_ascii_case(b"if-modified-since") => {
                head.if_modified_since = Some(value)
            }
            _ => {}
        }
    }

    if head.version == Version::Http11 && host_count != 1 {
        return Err(RequestError::MissingHost);
    }
    if host_count > 1 {
        return Err(RequestError::MissingHost);
    }
    if saw_te {
        if content_length.is_some() {
            return Err(RequestError::LengthAndChunked);
        }
        // RFC 9112 §6.1: a server MUST treat Transfer-Encoding in an HTTP/1.0 request as
        // faulty framing. The last coding must be chunked or the length is unknowable.
        if head.version == Version::Http10 || !chunked {
            return Err(RequestError::BadTransferEncoding);
        }
        head.body = BodyKind::Chunked;
    } else if let Some(n) = content_length {
        if n > limits.max_body {
            return Err(RequestError::BodyTooLarge);
        }
        if n > 0 {
            head.body = BodyKind::Length(n);
        }
    }
    head.keep_alive = match head.version {
        Version::Http11 => !conn_close,
        Version::Http10 => conn_keep_alive && !conn_close,
        Version::Http2 | Version::Http3 => true,
    };
    // Only meaningful when a body follows; a bodiless request ignores it (RFC 9110 §10.1.1).
    // An HTTP/1.0 client cannot read a 1xx response, so there the expectation MUST be ignored
    // (same section); otherwise we would send it an `HTTP/1.1 100 Continue` it cannot parse.
    head.expect_continue &= head.body != BodyKind::None && head.version == Version::Http11;
    Ok(())
}

/// Content-Length: 1*DIGIT, or a comma list of identical values (RFC 9110 §8.6).
pub(crate) fn parse_content_length(value: &[u8]) -> Result<u64, RequestError> {
    let mut result: Option<u64> = None;
    for part in value.split(|&b| b == b',') {
        let digits = trim_ows(part);
        if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
            return Err(RequestError::BadContentLength);
        }
        let n = digits
            .iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
        if result.is_some_and(|prev| prev != n) {
            return Err(RequestError::BadContentLength);
        }
        result = Some(n);
    }
    result.ok_or(RequestError::BadContentLength)
}

/// Folds one Transfer-Encoding field into the running state. Returns whether the final coding
/// so far is `chunked`. Any coding after chunked, chunked twice, or a coding we cannot decode is
/// refused: we never guess at framing.
pub(crate) fn parse_transfer_encoding(
    value: &[u8],
    mut chunked: bool,
) -> Result<bool, RequestError> {
    for coding in value.split(|&b| b == b',').map(trim_ows) {
        if coding.is_empty() {
            continue;
        }
        if chunked {
            // Something after chunked (or chunked repeated).
            return Err(RequestError::BadTransferEncoding);
        }
        if coding.eq_ignore_ascii_case(b"chunked") {
            chunked = true;
        } else {
            return Err(RequestError::BadTransferEncoding);
        }
    }
    Ok(chunked)
}

/// Methods are case-sensitive (RFC 9110 §9.1) and every registered one is upper case, but
/// many apps upper-case what they get (Django's `request.method`, Werkzeug): `post` would be
/// judged by tern as an unknown method and run by the app as POST. Refused, as nginx does.
fn check_method_case(method: &str) -> Result<(), RequestError> {
    if method.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(RequestError::BadRequestLine);
    }
    Ok(())
}

fn split_target(method: Method, target: &str) -> Result<(&str, Option<&str>), RequestError> {
    // A fragment is never sent (RFC 9112 §3.2). Checked over the whole target up front because
    // the absolute-form branch below can return early (`http://host?q#f` slipped through).
    if target.contains('#') {
        return Err(RequestError::BadRequestLine);
    }
    let bytes = target.as_bytes();
    let path_and_query = match bytes.first() {
        // CONNECT names an authority and nothing else (RFC 9112 §3.2.3): a path would be
        // routed like a request and could reach an upstream that opens a tunnel for it.
        Some(b'/') if method == Method::Connect => return Err(RequestError::BadRequestLine),
        Some(b'/') => target,
        Some(b'*') if target == "*" && method == Method::Options => return Ok(("*", None)),
        // absolute-form: servers MUST accept it (RFC 9112 §3.2.2); the authority is ignored
        // in favour of Host only for routing, which is what proxies expect.
        Some(_)
            if starts_with_ignore_case(bytes, b"http://")
                || starts_with_ignore_case(bytes, b"https://") =>
        {
            let after_scheme = target.find("://").map(|i| i + 3).unwrap_or(0);
            let rest = &target[after_scheme..];
            match rest.find(['/', '?']) {
                Some(i) if rest.as_bytes()[i] == b'/' => &rest[i..],
                Some(i) => return Ok(("/", Some(&rest[i + 1..]))),
                None => "/",
            }
        }
        // authority-form is only for CONNECT, which we route (and refuse) like any method.
        Some(_) if method == Method::Connect => return Ok((target, None)),
        _ => return Err(RequestError::BadRequestLine),
    };
    Ok(match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    })
}

fn classify_parse_error(e: httparse::Error, buf: &[u8]) -> RequestError {
    match e {
        httparse::Error::TooManyHeaders => RequestError::TooManyHeaders,
        httparse::Error::Version => {
            // "HTTP/2.0", "HTTP/3" etc. are versions we don't speak; anything else in the
            // version field is a malformed request line. (HTTP/0.9 has no version field at all
            // and fails earlier, as a bad token.) Only the version field itself is looked at:
            // searching the whole line for " HTTP/" answered `GET /a b HTTP/1.1` and
            // `GET /  HTTP/1.1` with 505 once the line was complete but 400 while it was still
            // partial, so the status depended on how the bytes happened to be segmented.
            if version_field(buf).starts_with(b"HTTP/") {
                RequestError::UnsupportedVersion
            } else {
                RequestError::BadRequestLine
            }
        }
        httparse::Error::HeaderName | httparse::Error::HeaderValue => {
            if memchr::memmem::find(buf, b"\n ").is_some()
                || memchr::memmem::find(buf, b"\n\t").is_some()
            {
                RequestError::ObsFold
            } else {
                RequestError::BadHeader
            }
        }
        httparse::Error::NewLine => {
            if has_bare_lf(buf) {
                RequestError::BareLf
            } else {
                RequestError::BadRequestLine
            }
        }
        _ => RequestError::BadRequestLine,
    }
}

/// `Host = uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2), possibly empty. Anything
/// else (a path, userinfo, whitespace, a second colon) would let the authority we see differ
/// from what a proxy or a URL built from it sees.
fn valid_host(value: &[u8]) -> bool {
    let value = trim_ows(value);
    let (host_ok, rest) = if let Some(lit) = value.strip_prefix(b"[") {
        // IP-literal: IPv6address or IPvFuture, checked for its alphabet only.
        let Some(end) = memchr::memchr(b']', lit) else {
            return false;
        };
        let ok = end > 0
            && lit[..end]
                .iter()
                .all(|&b| b == b':' || is_unreserved(b) || is_sub_delim(b));
        (ok, &lit[end + 1..])
    } else {
        let end = memchr::memchr(b':', value).unwrap_or(value.len());
        (valid_reg_name(&value[..end]), &value[end..])
    };
    host_ok
        && match rest.split_first() {
            None => true,
            // A port names one of 65536: `:99999999999999999999` is not an authority that
            // a site or an upstream could read the same way.
            Some((b':', port)) => {
                port.iter().all(u8::is_ascii_digit)
                    && (port.len() < 5 || port.len() == 5 && port <= &b"65535"[..])
            }
            Some(_) => false,
        }
}

/// reg-name = *( unreserved / pct-encoded / sub-delims ); this also covers IPv4 addresses.
fn valid_reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        let b = name[i];
        if b == b'%' {
            let hex = |j: usize| name.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
        } else if is_unreserved(b) || is_sub_delim(b) {
            i += 1;
        } else {
            return false;
        }
    }
    true
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_sub_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
    )
}

/// The version field of the request line: what follows the second SP, up to the line end. This
/// is exactly where httparse reports `Error::Version` (it skips leading empty lines first, and
/// neither the method token nor the target may contain a SP).
fn version_field(buf: &[u8]) -> &[u8] {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let line = &buf[start..];
    let line = &line[..memchr::memchr(b'\n', line).unwrap_or(line.len())];
    line.splitn(3, |&b| b == b' ').nth(2).unwrap_or(&[])
}

/// What the first line of a connection's bytes says about its protocol, once it is whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstLine {
    /// No line end yet: too early to tell.
    Incomplete,
    /// The line names an HTTP version somewhere (`HTTP/`), has fewer than three fields
    /// (HTTP/0.9), or is binary: answer it as HTTP/1 (400 if malformed).
    Http,
    /// Three fields but no `HTTP/` anywhere (as in `INVALID CONNECTION PREFACE`): not HTTP/1.
    /// On a port that also speaks HTTP/2 by prior knowledge such bytes may come from a
    /// broken HTTP/2 client, so the server closes rather than answer in a protocol the peer
    /// may not speak.
    Foreign,
}

/// Classifies the first request line of a connection (see [`FirstLine`]). Judged on a whole
/// line only, so the verdict does not depend on how the bytes were split.
pub fn first_line(buf: &[u8]) -> FirstLine {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let rest = &buf[start..];
    let end = memchr::memchr(b'\n', rest);
    // Binary bytes (a TLS ClientHello, say) are not a line being typed: judge them now.
    let text = &rest[..end.unwrap_or(rest.len())];
    if text
        .iter()
        .any(|&b| !(b.is_ascii_graphic() || b == b' ' || b == b'\r'))
    {
        return FirstLine::Http;
    }
    let Some(end) = end else {
        return FirstLine::Incomplete;
    };
    let line = &rest[..end];
    let http = line.windows(5).any(|w| w.eq_ignore_ascii_case(b"HTTP/"));
    if version_field(buf).is_empty() || http {
        FirstLine::Http
    } else {
        FirstLine::Foreign
    }
}

/// True if any LF in `head` is not preceded by CR. httparse tolerates bare LF (RFC 9112 allows
/// it as a MAY); we refuse it because front-end proxies that disagree enable smuggling.
fn has_bare_lf(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

/// Strips optional whitespace (SP / HTAB, RFC 9110 §5.6.3) from both ends of a field value.
pub fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn starts_with_ignore_case(s: &[u8], prefix: &[u8]) -> bool {
    s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn referer_and_user_agent_are_found_in_the_header_pass() {
        let mut headers = [std::mem::MaybeUninit::uninit(); crate::MAX_HEADERS_DEFAULT];
        let req = b"GET / HTTP/1.1\r\nHost: h\r\nUSER-AGENT: curl/8\r\nReferer: http://r/\r\n\r\n";
        let Ok(Parsed::Complete(head)) = parse_request(req, &mut headers, &Limits::default())
        else {
            panic!("a valid request");
        };
        assert_eq!(head.user_agent, Some(&b"curl/8"[..]));
        assert_eq!(head.referer, Some(&b"http://r/"[..]));
        let mut headers = [std::mem::MaybeUninit::uninit(); crate::MAX_HEADERS_DEFAULT];
        let req = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n";
        let Ok(Parsed::Complete(head)) = parse_request(req, &mut headers, &Limits::default())
        else {
            panic!("a valid request");
        };
        assert_eq!((head.user_agent, head.referer), (None, None));
    }

    #[test]
    fn trim_strips_only_spaces_and_tabs_at_both_ends() {
        assert_eq!(trim_ows(b""), b"");
        assert_eq!(trim_ows(b" \t "), b"");
        assert_eq!(trim_ows(b" \ta b\t "), b"a b");
        assert_eq!(trim_ows(b"\r\nx\r\n"), b"\r\nx\r\n");
    }

    #[test]
    fn content_length_values() {
        assert_eq!(parse_content_length(b"0"), Ok(0));
        assert_eq!(parse_content_length(b"007"), Ok(7));
        assert_eq!(parse_content_length(b"5, 5 ,5"), Ok(5));
        // 18 digits is the most we take; it cannot overflow a u64.
        assert_eq!(
            parse_content_length(b"999999999999999999"),
            Ok(999_999_999_999_999_999)
        );
        for bad in [
            &b""[..],
            b" ",
            b",",
            b"5,",
            b"5, 6",
            b"1000000000000000000",
            b"0x1",
            b"5 5",
        ] {
            assert_eq!(
                parse_content_length(bad),
                Err(RequestError::BadContentLength),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn transfer_encoding_values() {
        assert_eq!(parse_transfer_encoding(b"chunked", false), Ok(true));
        assert_eq!(parse_transfer_encoding(b" , chunked ,", false), Ok(true));
        assert_eq!(parse_transfer_encoding(b"", false), Ok(false));
        assert_eq!(parse_transfer_encoding(b"", true), Ok(true));
        // State carries across fields: a second field after chunked is "after chunked".
        assert_eq!(
            parse_transfer_encoding(b"chunked", true),
            Err(RequestError::BadTransferEncoding)
        );
        for bad in [
            &b"gzip"[..],
            b"chunked, gzip",
            b"gzip, chunked",
            b"chunked;q=1",
            b"identity",
        ] {
            assert_eq!(
                parse_transfer_encoding(bad, false),
                Err(RequestError::BadTransferEncoding)
            );
        }
    }

    #[test]
    fn split_target_forms() {
        use Method::*;
        assert_eq!(split_target(Get, "/"), Ok(("/", None)));
        assert_eq!(split_target(Get, "/a?b?c"), Ok(("/a", Some("b?c"))));
        assert_eq!(split_target(Get, "/a?"), Ok(("/a", Some(""))));
        assert_eq!(split_target(Options, "*"), Ok(("*", None)));
        assert_eq!(split_target(Get, "*"), Err(RequestError::BadRequestLine));
        assert_eq!(split_target(Get, "http://h"), Ok(("/", None)));
        assert_eq!(split_target(Get, "hTTpS://h/x?y"), Ok(("/x", Some("y"))));
        assert_eq!(split_target(Get, "http://h?y"), Ok(("/", Some("y"))));
        assert_eq!(split_target(Connect, "h:443"), Ok(("h:443", None)));
        assert_eq!(
            split_target(Get, "h:443"),
            Err(RequestError::BadRequestLine)
        );
        assert_eq!(split_target(Get, ""), Err(RequestError::BadRequestLine));
        for t in ["/#", "/a?b#", "http://h#", "http://h?q#f", "http://h/p#f"] {
            assert_eq!(
                split_target(Get, t),
                Err(RequestError::BadRequestLine),
                "{t}"
            );
        }
        assert_eq!(
            split_target(Connect, "h:443#x"),
            Err(RequestError::BadRequestLine)
        );
    }

    #[test]
    fn version_field_is_what_follows_the_second_space() {
        assert_eq!(version_field(b"GET / HTTP/1.2\r\n"), b"HTTP/1.2\r");
        assert_eq!(version_field(b"\r\n\r\nGET / HTTP/2"), b"HTTP/2");
        assert_eq!(version_field(b"GET /a b HTTP/1.1\r\n"), b"b HTTP/1.1\r");
        assert_eq!(version_field(b"GET /  HTTP/1.1"), b" HTTP/1.1");
        assert_eq!(version_field(b"GET /"), b"");
        assert_eq!(version_field(b""), b"");
    }

    #[test]
    fn first_lines_are_classified() {
        use FirstLine::*;
        assert_eq!(first_line(b"INVALID CONNECTION PREFACE\r\n\r\n"), Foreign);
        assert_eq!(first_line(b"NOT HTTP AT ALL\r\n\r\n"), Foreign);
        assert_eq!(first_line(b"GET / HTTP/1.1\r\n"), Http);
        assert_eq!(first_line(b"GET / http/1.1\r\n"), Http);
        assert_eq!(first_line(b"GET /hello\r\n"), Http);
        assert_eq!(first_line(b"GET /a b HTTP/1.1\r\n"), Http);
        assert_eq!(first_line(b"GET  /h"), Incomplete);
        assert_eq!(
            first_line(b"\x16\x03\x01\x02\x00"),
            Http,
            "binary is judged at once"
        );
    }

    #[test]
    fn bare_lf_detection() {
        assert!(!has_bare_lf(b""));
        assert!(!has_bare_lf(b"a\r\nb\r\n\r\n"));
        assert!(has_bare_lf(b"\n"));
        assert!(has_bare_lf(b"a\r\nb\n"));
        assert!(has_bare_lf(b"a\r\n\n"));
    }

    #[test]
    fn parse_errors_are_classified() {
        use httparse::Error as E;
        assert_eq!(
            classify_parse_error(E::TooManyHeaders, b""),
            RequestError::TooManyHeaders
        );
        assert_eq!(
            classify_parse_error(E::Version, b"GET / HTTP/3.0\r\n"),
            RequestError::UnsupportedVersion
        );
        assert_eq!(
            classify_parse_error(E::Version, b"GET / XTTP"),
            RequestError::BadRequestLine
        );
        assert_eq!(
            classify_parse_error(E::HeaderName, b"G / HTTP/1.1\r\n x"),
            RequestError::ObsFold
        );
        assert_eq!(
            classify_parse_error(E::HeaderName, b"G / HTTP/1.1\r\n\tx"),
            RequestError::ObsFold
        );
        assert_eq!(
            classify_parse_error(E::HeaderValue, b"G / HTTP/1.1\r\nX: \0"),
            RequestError::BadHeader
        );
        assert_eq!(
            classify_parse_error(E::NewLine, b"G / HTTP/1.1\n\r"),
            RequestError::BareLf
        );
        assert_eq!(
            classify_parse_error(E::NewLine, b"G / HTTP/1.1\rx"),
            RequestError::BadRequestLine
        );
        assert_eq!(
            classify_parse_error(E::Token, b"G@T"),
            RequestError::BadRequestLine
        );
    }

    #[test]
    fn host_values() {
        for good in [
            &b""[..],
            b"a",
            b"example.com",
            b"example.com:8080",
            b"example.com:",
            b"127.0.0.1:80",
            b"a:65535",
            b"a:0",
            b"[::1]",
            b"[::1]:8080",
            b"[v1.fe80::a+en1]",
            b"xn--caf-dma.example",
            b"a_b~c",
            b"%41b",
            b"a!$&'()*+,;=b",
        ] {
            assert!(valid_host(good), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"a b"[..],
            b"a/b",
            b"a\\b",
            b"user@a",
            b"a:http",
            b"a:80:80",
            b"a:65536",
            b"a:99999999999999999999",
            b"a:123456",
            b"a?b",
            b"a#b",
            b"[]",
            b"[::1",
            b"[::1]x",
            b"[::1]:x",
            b"[::1]]",
            b"[a/b]",
            b"%4",
            b"%zz",
            b"a\"b",
            b"caf\xc3\xa9",
            b"\x7f",
        ] {
            assert!(!valid_host(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn method_tokens() {
        assert_eq!(Method::from_token("GET"), Method::Get);
        assert_eq!(Method::from_token("CONNECT"), Method::Connect);
        assert_eq!(Method::from_token("Get"), Method::Other);
        assert_eq!(Method::from_token(""), Method::Other);
    }
}
