use std::fmt;

/// Why a request was refused. Each variant maps to one precise status and a short body; the
/// connection that produced it is always closed after the answer, because after bad framing
/// nothing later on the wire can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestError {
    /// Malformed request line (bad method token, bad target, garbage).
    BadRequestLine,
    /// Malformed header name or value, including NUL/CR/LF inside a value, or a Host value
    /// that is not `uri-host [":" port]`.
    BadHeader,
    /// A line ended with a bare LF instead of CRLF.
    BareLf,
    /// obs-fold: a header line starting with SP/HTAB (RFC 9112 §5.2 says reject or replace).
    ObsFold,
    /// HTTP/1.1 request without a Host header, or with more than one.
    MissingHost,
    /// Both Content-Length and Transfer-Encoding present (request smuggling vector).
    LengthAndChunked,
    /// Content-Length that is not a plain decimal, or duplicates that differ.
    BadContentLength,
    /// Transfer-Encoding whose final coding is not `chunked`, or an unknown coding.
    BadTransferEncoding,
    /// Chunk size line that is malformed or absurdly large.
    BadChunk,
    /// Request line + headers exceed the configured byte limit.
    HeadTooLarge,
    /// More header fields than the configured limit.
    TooManyHeaders,
    /// Body larger than the configured limit.
    BodyTooLarge,
    /// HTTP/2 connection preface sent to this HTTP/1.1 port.
    Http2Preface,
    /// Any version other than HTTP/1.0 and HTTP/1.1.
    UnsupportedVersion,
    /// `Expect` with anything other than `100-continue`.
    BadExpectation,
    /// A path with no canonical form (see [`crate::canonical_path`]): an encoded slash,
    /// backslash or control byte, double encoding, a `;`, `..` above the root, a bad escape.
    BadPath,
}

impl RequestError {
    /// The status code to answer with.
    pub fn status(self) -> u16 {
        use RequestError::*;
        match self {
            BadRequestLine | BadHeader | BareLf | ObsFold | MissingHost | LengthAndChunked
            | BadContentLength | BadChunk | BadPath => 400,
            BadTransferEncoding => 400,
            HeadTooLarge | TooManyHeaders => 431,
            BodyTooLarge => 413,
            Http2Preface | UnsupportedVersion => 505,
            BadExpectation => 417,
        }
    }

    /// A short, human-readable body (ends with a newline).
    pub fn message(self) -> &'static str {
        use RequestError::*;
        match self {
            BadRequestLine => "bad request line\n",
            BadHeader => "bad header field\n",
            BareLf => "bare LF line ending; use CRLF\n",
            ObsFold => "obsolete header line folding is not allowed\n",
            MissingHost => "missing or repeated Host header\n",
            LengthAndChunked => "both Content-Length and Transfer-Encoding\n",
            BadContentLength => "bad Content-Length\n",
            BadTransferEncoding => "unsupported Transfer-Encoding\n",
            BadChunk => "bad chunked encoding\n",
            HeadTooLarge => "request head too large\n",
            TooManyHeaders => "too many header fields\n",
            BodyTooLarge => "request body too large\n",
            Http2Preface => "HTTP/2 is not spoken on this port\n",
            UnsupportedVersion => "HTTP version not supported\n",
            BadExpectation => "only Expect: 100-continue is supported\n",
            BadPath => "path cannot be normalised safely\n",
        }
    }

    /// A stable, metric-friendly name for counting.
    pub fn name(self) -> &'static str {
        use RequestError::*;
        match self {
            BadRequestLine => "bad_request_line",
            BadHeader => "bad_header",
            BareLf => "bare_lf",
            ObsFold => "obs_fold",
            MissingHost => "missing_host",
            LengthAndChunked => "length_and_chunked",
            BadContentLength => "bad_content_length",
            BadTransferEncoding => "bad_transfer_encoding",
            BadChunk => "bad_chunk",
            HeadTooLarge => "head_too_large",
            TooManyHeaders => "too_many_headers",
            BodyTooLarge => "body_too_large",
            Http2Preface => "http2_preface",
            UnsupportedVersion => "unsupported_version",
            BadExpectation => "bad_expectation",
            BadPath => "bad_path",
        }
    }

    /// Every variant, for counters indexed by error kind.
    pub const ALL: [RequestError; 16] = [
        RequestError::BadRequestLine,
        RequestError::BadHeader,
        RequestError::BareLf,
        RequestError::ObsFold,
        RequestError::MissingHost,
        RequestError::LengthAndChunked,
        RequestError::BadContentLength,
        RequestError::BadTransferEncoding,
        RequestError::BadChunk,
        RequestError::HeadTooLarge,
        RequestError::TooManyHeaders,
        RequestError::BodyTooLarge,
        RequestError::Http2Preface,
        RequestError::UnsupportedVersion,
        RequestError::BadExpectation,
        RequestError::BadPath,
    ];

    /// Position in [`RequestError::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status(), self.message().trim_end())
    }
}

impl std::error::Error for RequestError {}
