//! The other direction, for a reverse proxy: parsing an upstream server's response head and
//! deciding how its body is framed (RFC 9112 §6.3). A proxy must never pass on framing it is
//! unsure of, so anything ambiguous (Content-Length with Transfer-Encoding, differing
//! lengths, an unknown coding) is an error the caller answers with 502, never a guess.

use std::mem::MaybeUninit;

use crate::request::{parse_content_length, parse_transfer_encoding, trim_ows, Version};

/// How an upstream response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body: HEAD, 1xx, 204, 304.
    None,
    Length(u64),
    Chunked,
    /// Read until the upstream closes (no length, no chunking).
    UntilClose,
}

/// Why an upstream response head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// Not an HTTP/1.x status line and header block (or bare LF, obs-fold, bad bytes).
    Malformed,
    /// The head is longer than the caller's limit, or has too many fields.
    TooLarge,
    /// Content-Length and Transfer-Encoding together, differing lengths, a coding other
    /// than a final `chunked`: framing a proxy cannot pass on safely.
    AmbiguousFraming,
}

impl UpstreamError {
    pub fn name(self) -> &'static str {
        match self {
            UpstreamError::Malformed => "upstream_head_malformed",
            UpstreamError::TooLarge => "upstream_head_too_large",
            UpstreamError::AmbiguousFraming => "upstream_framing_ambiguous",
        }
    }
}

/// A parsed upstream response head; the fields borrow the caller's buffer.
#[derive(Debug)]
pub struct UpstreamHead<'a> {
    pub status: u16,
    pub version: Version,
    pub head_len: usize,
    pub headers: &'a [httparse::Header<'a>],
    pub body: ResponseBody,
    /// The upstream lets the connection be reused after this response.
    pub keep_alive: bool,
}

impl UpstreamHead<'_> {
    /// True if `name` is one of the tokens of the `Connection` fields (ASCII case-insensitive):
    /// those fields are hop-by-hop and never forwarded.
    pub fn connection_names(&self, name: &[u8]) -> bool {
        connection_lists(self.headers, name)
    }
}

/// Whether the comma-separated `Connection` lists in `headers` contain `token`.
pub fn connection_lists(headers: &[httparse::Header<'_>], token: &[u8]) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .any(|t| trim_ows(t).eq_ignore_ascii_case(token))
}

/// Parses the response head at the start of `buf`. `Ok(None)`: more bytes are needed.
/// `head_request`: the request was HEAD, so no body follows whatever the head says.
pub fn parse_upstream_head<'a>(
    buf: &'a [u8],
    headers: &'a mut [MaybeUninit<httparse::Header<'a>>],
    head_request: bool,
    max_head: usize,
) -> Result<Option<UpstreamHead<'a>>, UpstreamError> {
    let buf = &buf[..buf.len().min(max_head)];
    let mut res = httparse::Response::new(&mut []);
    let head_len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, buf, headers)
    {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max_head => {
            return Err(UpstreamError::TooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(UpstreamError::TooLarge),
        Err(_) => return Err(UpstreamError::Malformed),
    };
    // httparse takes a bare LF as a line end; what we pass on is re-serialised anyway, but a
    // server that sends them is broken enough that its framing is not to be trusted.
    if buf[..head_len]
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || buf[i - 1] != b'\r'))
    {
        return Err(UpstreamError::Malformed);
    }
    let version = match res.version {
        Some(0) => Version::Http10,
        Some(1) => Version::Http11,
        _ => return Err(UpstreamError::Malformed),
    };
    let status = res.code.ok_or(UpstreamError::Malformed)?;
    // RFC 9110 §15 defines 100–599 only; a client may treat anything else as malformed, and
    // an HTTP/2 client must (its `:status` is checked the same way), so it is a 502 here.
    if !(100..=599).contains(&status) {
        return Err(UpstreamError::Malformed);
    }
    let headers: &'a [httparse::Header<'a>] = res.headers;

    let mut length: Option<u64> = None;
    let mut transfer_encoding = false;
    let mut chunked_last = false;
    // The same field rules as for requests (`request.rs`); any failure is framing a proxy
    // cannot pass on. A coding other than `chunked` is refused even before a final
    // `chunked`: undoing the chunking would hand the client, say, gzip bytes unannounced.
    let ambiguous = |_| UpstreamError::AmbiguousFraming;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_content_length(h.value).map_err(ambiguous)?;
            if length.is_some_and(|m| m != n) {
                return Err(UpstreamError::AmbiguousFraming);
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
            chunked_last = parse_transfer_encoding(h.value, chunked_last).map_err(ambiguous)?;
        }
    }
    if transfer_encoding && (length.is_some() || !chunked_last) {
        // Both framings, or a coding we would have to undo to know where the body ends.
        return Err(UpstreamError::AmbiguousFraming);
    }
    let no_body = head_request || (100..200).contains(&status) || status == 204 || status == 304;
    let body = match (no_body, chunked_last, length) {
        (true, _, _) => ResponseBody::None,
        (false, true, _) => ResponseBody::Chunked,
        (false, false, Some(n)) => ResponseBody::Length(n),
        (false, false, None) => ResponseBody::UntilClose,
    };
    let keep_alive = match version {
        Version::Http11 => !connection_lists(headers, b"close"),
        Version::Http10 | Version::Http2 | Version::Http3 => {
            connection_lists(headers, b"keep-alive")
        }
    } && body != ResponseBody::UntilClose;
    Ok(Some(UpstreamHead {
        status,
        version,
        head_len,
        headers,
        body,
        keep_alive,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8], head: bool) -> Result<Option<(u16, ResponseBody, bool)>, UpstreamError> {
        let mut headers = [MaybeUninit::uninit(); 64];
        parse_upstream_head(raw, &mut headers, head, 8192)
            .map(|o| o.map(|h| (h.status, h.body, h.keep_alive)))
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let ok = |raw: &[u8], head| parse(raw, head).unwrap().unwrap();
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false),
            (200, ResponseBody::Length(5), true)
        );
        assert_eq!(
            ok(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false
            ),
            (200, ResponseBody::Chunked, true)
        );
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\n\r\n", false),
            (200, ResponseBody::UntilClose, false)
        );
        assert_eq!(
            ok(
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false
            ),
            (304, ResponseBody::None, true)
        );
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true),
            (200, ResponseBody::None, true)
        );
        assert_eq!(
            ok(b"HTTP/1.1 204 No Content\r\n\r\n", false),
            (204, ResponseBody::None, true)
        );
        assert_eq!(
            ok(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", false),
            (103, ResponseBody::None, true)
        );
        assert_eq!(
            ok(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
                false
            ),
            (200, ResponseBody::Length(3), false)
        );
        assert_eq!(
            ok(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n", false),
            (200, ResponseBody::Length(3), false)
        );
        assert_eq!(
            ok(
                b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: Keep-Alive\r\n\r\n",
                false
            ),
            (200, ResponseBody::Length(3), true)
        );
        // Repeated equal lengths are one length (RFC 9110 §8.6).
        assert_eq!(
            ok(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\nContent-Length: 3\r\n\r\n",
                false
            ),
            (200, ResponseBody::Length(3), true)
        );
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\nContent-Le", false), Ok(None));
    }

    #[test]
    fn ambiguous_or_broken_heads_are_refused() {
        use UpstreamError::*;
        let cases: &[(&[u8], UpstreamError)] = &[
            (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", AmbiguousFraming),
            (b"HTTP/1.1 200 OK\nContent-Length: 1\n\n", Malformed),
            (b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", Malformed),
            (b"HTTP/2 200\r\n\r\n", Malformed),
            (b"HTTP/1.1 2000 OK\r\n\r\n", Malformed),
            (b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n", Malformed),
            (b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n", Malformed),
            (b"SSH-2.0-OpenSSH\r\n\r\n", Malformed),
            (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", Malformed),
        ];
        for (raw, want) in cases {
            assert_eq!(
                parse(raw, false),
                Err(*want),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        let mut huge = b"HTTP/1.1 200 OK\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 9000));
        assert_eq!(parse(&huge, false), Err(TooLarge));
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..100 {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse(&many, false), Err(TooLarge));
    }

    #[test]
    fn connection_tokens_are_found_case_insensitively() {
        let mut headers = [MaybeUninit::uninit(); 8];
        let raw =
            b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, X-Secret\r\nContent-Length: 0\r\n\r\n";
        let h = parse_upstream_head(raw, &mut headers, false, 8192)
            .unwrap()
            .unwrap();
        assert!(h.connection_names(b"x-secret"));
        assert!(h.connection_names(b"keep-alive"));
        assert!(!h.connection_names(b"close"));
    }
}
