//! Request smuggling and malformed input over real sockets: every case is sent on a fresh TCP
//! connection to a real server, and the status of every answer plus what happens to the
//! connection afterwards are checked.
//!
//! The safety property behind every case: when framing is ambiguous the server answers 400 and
//! closes; it never reads bytes a front end might treat as body as a request of its own.
//! Requests that hide behind a body target `/smuggled`; any answer from that route fails the
//! case. `KeptAlive` is verified by a follow-up request on the same socket that must get the
//! `/follow` answer (so an unexpected extra answer in between is caught); `Closed` by reading
//! EOF, with nothing more on the wire, within a timeout.
//!
//! Each case runs twice: written in one piece, and (when short) written a byte at a time, since
//! the verdict must not depend on how the bytes arrive.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};

use tern_server::{
    Body, HandlerContext, Method, Reply, Request, Response, Router, Server, ServerConfig,
    ServerHandle,
};
use tern_testkit::{Client, NoAnswer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The server closes after the listed answers.
    Closed,
    /// The connection stays usable: a follow-up request gets its answer.
    KeptAlive,
}
use End::*;

struct Case {
    name: &'static str,
    raw: Vec<u8>,
    statuses: &'static [u16],
    end: End,
    /// If set, the body of the first answer (the echo of what the server took as the body).
    first_body: Option<&'static [u8]>,
}

fn case(name: &'static str, raw: impl AsRef<[u8]>, statuses: &'static [u16], end: End) -> Case {
    Case {
        name,
        raw: raw.as_ref().to_vec(),
        statuses,
        end,
        first_body: None,
    }
}

impl Case {
    fn body(mut self, body: &'static [u8]) -> Case {
        self.first_body = Some(body);
        self
    }
}

/// A request hidden where a body (or trailer) might be; the server must never answer it.
const HIDDEN: &str = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
const FOLLOW: &[u8] = b"GET /follow HTTP/1.1\r\nHost: x\r\n\r\n";
const GET_HELLO: &str = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";

/// `POST /echo HTTP/1.1` with Host, the given header lines and the raw body.
fn post(headers: &[&str], body: &str) -> Vec<u8> {
    let mut s = String::from("POST /echo HTTP/1.1\r\nHost: x\r\n");
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.push_str(body);
    s.into_bytes()
}

/// A chunked POST to `/echo` with the given raw chunked body.
fn chunked(body: &str) -> Vec<u8> {
    post(&["Transfer-Encoding: chunked"], body)
}

/// `GET /hello HTTP/1.1` with Host and the given header lines.
fn get(headers: &[&str]) -> Vec<u8> {
    let mut s = String::from("GET /hello HTTP/1.1\r\nHost: x\r\n");
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// A request line followed by the given header lines, CRLF-terminated.
fn line(request_line: &str, headers: &[&str]) -> Vec<u8> {
    let mut s = format!("{request_line}\r\n");
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn with_n_headers(n: usize) -> Vec<u8> {
    let lines: Vec<String> = (1..n).map(|i| format!("X-{i}: v")).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    get(&refs) // plus Host: n fields in all
}

fn cases() -> Vec<Case> {
    let hidden_len = HIDDEN.len().to_string();
    let cl_hidden = format!("Content-Length: {hidden_len}");
    let hidden_chunk = format!("{:x}\r\n{HIDDEN}\r\n0\r\n\r\n", HIDDEN.len());
    let long_target = format!("GET /{} HTTP/1.1", "a".repeat(40 * 1024));
    let long_header = format!("X-Long: {}", "a".repeat(40 * 1024));

    vec![
        // --- Controls: what well-formed framing looks like.
        case("control: GET", GET_HELLO, &[200], KeptAlive),
        case(
            "control: POST with Content-Length",
            post(&["Content-Length: 5"], "hello"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            "control: POST chunked",
            chunked("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            &[200],
            KeptAlive,
        )
        .body(b"hello world"),
        case(
            "control: request pipelined after a chunked body is a real request",
            cat(&[&chunked("0\r\n\r\n"), GET_HELLO.as_bytes()]),
            &[200, 200],
            KeptAlive,
        ),
        case(
            "control: request pipelined after a Content-Length body is a real request",
            cat(&[&post(&["Content-Length: 5"], "hello"), GET_HELLO.as_bytes()]),
            &[200, 200],
            KeptAlive,
        )
        .body(b"hello"),
        // --- CL.TE and TE.CL: both framings present is refused, whatever the order.
        case(
            "CL.TE",
            post(
                &["Content-Length: 6", "Transfer-Encoding: chunked"],
                &format!("0\r\n\r\n{HIDDEN}"),
            ),
            &[400],
            Closed,
        ),
        case(
            "TE.CL",
            post(
                &["Transfer-Encoding: chunked", "Content-Length: 4"],
                &hidden_chunk,
            ),
            &[400],
            Closed,
        ),
        case(
            "TE.CL with Content-Length: 0",
            post(
                &["Transfer-Encoding: chunked", "Content-Length: 0"],
                &hidden_chunk,
            ),
            &[400],
            Closed,
        ),
        case(
            "CL.TE on HTTP/1.0",
            line(
                "POST /echo HTTP/1.0",
                &["Content-Length: 5", "Transfer-Encoding: chunked"],
            ),
            &[400],
            Closed,
        ),
        case(
            "TE chunked on HTTP/1.0 (RFC 9112 §6.1: faulty framing)",
            cat(&[
                &line("POST /echo HTTP/1.0", &["Transfer-Encoding: chunked"]),
                b"0\r\n\r\n",
            ]),
            &[400],
            Closed,
        ),
        // --- TE.TE: obfuscated Transfer-Encoding.
        case(
            "TE: xchunked",
            post(&["Transfer-Encoding: xchunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE: chunked, identity",
            post(&["Transfer-Encoding: chunked, identity"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE: identity, chunked",
            post(&["Transfer-Encoding: identity, chunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE: gzip, chunked (a coding we cannot decode)",
            post(&["Transfer-Encoding: gzip, chunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE twice: chunked + chunked",
            post(
                &["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
                &hidden_chunk,
            ),
            &[400],
            Closed,
        ),
        case(
            "TE twice: chunked + identity",
            post(
                &["Transfer-Encoding: chunked", "Transfer-Encoding: identity"],
                &hidden_chunk,
            ),
            &[400],
            Closed,
        ),
        case(
            "TE: \"chunked\" quoted",
            post(&["Transfer-Encoding: \"chunked\""], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE: chunked;q=1 (parameter)",
            post(&["Transfer-Encoding: chunked;q=1"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE: empty",
            post(&["Transfer-Encoding:"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE value with a vertical tab",
            post(&["Transfer-Encoding: \x0bchunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE name with a space before the colon",
            post(&["Transfer-Encoding : chunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE name with a tab before the colon",
            post(&["Transfer-Encoding\t: chunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE value folded onto the next line (obs-fold)",
            post(&["Transfer-Encoding:", " chunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE hidden in an obs-fold continuation line",
            post(&["X-A: b", " Transfer-Encoding: chunked"], &hidden_chunk),
            &[400],
            Closed,
        ),
        case(
            "TE with extra whitespace around chunked is still chunked",
            post(
                &["Transfer-Encoding: \t chunked \t"],
                "5\r\nhello\r\n0\r\n\r\n",
            ),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            "TE: CHUNKED (codings are case-insensitive)",
            post(&["Transfer-Encoding: CHUNKED"], "5\r\nhello\r\n0\r\n\r\n"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            // Not Transfer-Encoding at all: the POST has no body, and the chunked bytes are
            // then a (bad) request of their own. Never normalise `_` to `-`.
            "Transfer_Encoding (underscore) is an unknown field",
            post(&["Transfer_Encoding: chunked"], "0\r\n\r\n"),
            &[200, 400],
            Closed,
        )
        .body(b""),
        // --- Content-Length.
        case(
            "CL duplicated, same value",
            post(&["Content-Length: 5", "Content-Length: 5"], "hello"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            "CL duplicated, differing",
            post(&["Content-Length: 5", "Content-Length: 6"], "hello!"),
            &[400],
            Closed,
        ),
        case(
            "CL duplicated, 0 then the hidden request's length",
            post(&["Content-Length: 0", &cl_hidden], HIDDEN),
            &[400],
            Closed,
        ),
        case(
            "CL comma list, same value",
            post(&["Content-Length: 5, 5"], "hello"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            "CL comma list, differing",
            post(&["Content-Length: 5, 6"], "hello!"),
            &[400],
            Closed,
        ),
        case(
            "CL comma list with an empty element",
            post(&["Content-Length: 5,,5"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL trailing comma",
            post(&["Content-Length: 5,"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL negative",
            post(&["Content-Length: -5"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL plus-signed",
            post(&["Content-Length: +5"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL hex",
            post(&["Content-Length: 0x5"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL decimal point",
            post(&["Content-Length: 5.0"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL overflowing u64",
            post(&["Content-Length: 18446744073709551621"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL 18 digits, above the body limit",
            post(&["Content-Length: 999999999999999999"], "hello"),
            &[413],
            Closed,
        ),
        case(
            "CL empty",
            post(&["Content-Length:"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL with a space between digits",
            post(&["Content-Length: 1 5"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL with a space before the colon",
            post(&["Content-Length : 5"], "hello"),
            &[400],
            Closed,
        ),
        case(
            "CL padded with whitespace",
            post(&["Content-Length: \t 5 \t"], "hello"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            "CL with leading zeros",
            post(&["Content-Length: 0005"], "hello"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            "CL covering a hidden request: it is body, not a request",
            post(&[&cl_hidden], HIDDEN),
            &[200],
            KeptAlive,
        )
        .body(HIDDEN.as_bytes()),
        case(
            "GET with a Content-Length body holding a request",
            cat(&[&get(&[&cl_hidden]), HIDDEN.as_bytes()]),
            &[200],
            KeptAlive,
        ),
        case(
            "GET with a chunked body holding a request",
            cat(&[&get(&["Transfer-Encoding: chunked"]), hidden_chunk.as_bytes()]),
            &[200],
            KeptAlive,
        ),
        // --- Chunked bodies.
        case(
            "chunk size not hex",
            chunked("g\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size with 0x prefix",
            chunked("0x5\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size with leading whitespace",
            chunked(" 5\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size with a plus sign",
            chunked("+5\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size with trailing junk",
            chunked("5x\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size with two numbers",
            chunked("5 5\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size empty",
            chunked("\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size overlong (17 hex digits, overflows u64)",
            chunked("10000000000000005\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size overlong (16 zeros)",
            chunked("0000000000000005\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size above the body limit",
            chunked("200000\r\nhello\r\n0\r\n\r\n"),
            &[413],
            Closed,
        ),
        case(
            "chunk extension: bare semicolon",
            chunked("5;\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extension: no name before =",
            chunked("5;=a\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extension: name with a non-token byte",
            chunked("5;a@b\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extension: value with a non-token byte",
            chunked("5;a=b@c\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extension with a NUL",
            chunked("5;a\0\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extension ended by a bare LF",
            chunked("5;a\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extension with a bare CR",
            chunked("5;a\rb\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extension with an unterminated quote",
            chunked("5;a=\"b\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk extensions, well-formed, are ignored",
            chunked("5;a=b;c=\"d;e\\\"f\" ; g\r\nhello\r\n0;h\r\n\r\n"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            "chunk data longer than its size (no CRLF after the data)",
            chunked("3\r\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk data followed by a bare LF",
            chunked("5\r\nhello\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "chunk size line ended by a bare LF",
            chunked("5\nhello\r\n0\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "last chunk followed by a bare LF",
            chunked("5\r\nhello\r\n0\r\n\n"),
            &[400],
            Closed,
        ),
        case(
            "chunked trailers, well-formed, are skipped",
            chunked("5\r\nhello\r\n0\r\nX-Sum: abc\r\nX-Other:\r\n\r\n"),
            &[200],
            KeptAlive,
        )
        .body(b"hello"),
        case(
            // A front end that ends the body at `0\r\n` would see the hidden request; swallowing
            // it as a "trailer" would desync. A request line is no field line.
            "request line hidden in the trailer section",
            chunked(&format!("5\r\nhello\r\n0\r\n{HIDDEN}")),
            &[400],
            Closed,
        ),
        case(
            "trailer with a space before the colon",
            chunked("5\r\nhello\r\n0\r\nX-Sum : abc\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "trailer continued by obs-fold",
            chunked("5\r\nhello\r\n0\r\nX-Sum: a\r\n b\r\n\r\n"),
            &[400],
            Closed,
        ),
        case(
            "trailer value with a control byte",
            chunked("5\r\nhello\r\n0\r\nX-Sum: a\x01b\r\n\r\n"),
            &[400],
            Closed,
        ),
        // --- Line endings.
        case(
            "bare LF after the request line",
            "GET /hello HTTP/1.1\nHost: x\r\n\r\n",
            &[400],
            Closed,
        ),
        case(
            "bare LF after a header",
            "GET /hello HTTP/1.1\r\nHost: x\n\r\n",
            &[400],
            Closed,
        ),
        case(
            "bare LF everywhere",
            "GET /hello HTTP/1.1\nHost: x\n\n",
            &[400],
            Closed,
        ),
        case(
            "bare CR after the request line",
            "GET /hello HTTP/1.1\rHost: x\r\n\r\n",
            &[400],
            Closed,
        ),
        case(
            "bare CR inside a header value",
            "GET /hello HTTP/1.1\r\nHost: x\rX: y\r\n\r\n",
            &[400],
            Closed,
        ),
        case(
            "leading empty line before the request line is ignored",
            format!("\r\n{GET_HELLO}"),
            &[200],
            KeptAlive,
        ),
        // --- Header syntax and injection.
        case("obs-fold", get(&["X-A: b", " c"]), &[400], Closed),
        case(
            "first header line starting with whitespace",
            "GET /hello HTTP/1.1\r\n Host: x\r\n\r\n",
            &[400],
            Closed,
        ),
        case("NUL in a header value", get(&["X-A: b\0c"]), &[400], Closed),
        case(
            "LF inside a header value",
            get(&["X-A: b\nc"]),
            &[400],
            Closed,
        ),
        case(
            "LF inside a header value that looks like a field",
            get(&["X-A: b\nTransfer-Encoding: chunked"]),
            &[400],
            Closed,
        ),
        case(
            "space before the colon",
            get(&["X-A : b"]),
            &[400],
            Closed,
        ),
        case("empty header name", get(&[": b"]), &[400], Closed),
        case(
            "header name with a non-token byte",
            get(&["X@A: b"]),
            &[400],
            Closed,
        ),
        case(
            "header line without a colon",
            get(&["X-A b"]),
            &[400],
            Closed,
        ),
        case(
            "CRLF percent-encoded in the target is refused (an app echoing the path would inject it)",
            "GET /hello%0d%0aX-Injected:%20y HTTP/1.1\r\nHost: x\r\n\r\n",
            &[400],
            Closed,
        ),
        case(
            "obs-text in a header value is allowed",
            get(&["X-A: caf\u{e9}"]),
            &[200],
            KeptAlive,
        ),
        // --- Limits.
        case(
            "overlong request line",
            line(&long_target, &["Host: x"]),
            &[431],
            Closed,
        ),
        case(
            "overlong header field",
            get(&[&long_header]),
            &[431],
            Closed,
        ),
        case(
            "100 header fields is the limit",
            with_n_headers(100),
            &[200],
            KeptAlive,
        ),
        case(
            "101 header fields",
            with_n_headers(101),
            &[431],
            Closed,
        ),
        // --- Request targets.
        case(
            "absolute-form",
            line("GET http://x/hello HTTP/1.1", &["Host: x"]),
            &[200],
            KeptAlive,
        ),
        case(
            "absolute-form with another authority than Host",
            line("GET https://elsewhere:8443/hello?q HTTP/1.1", &["Host: x"]),
            &[200],
            KeptAlive,
        ),
        case(
            "absolute-form with a scheme we do not serve",
            line("GET ftp://x/hello HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "authority-form with CONNECT (no route: refused, connection stays HTTP)",
            line("CONNECT x:443 HTTP/1.1", &["Host: x:443"]),
            &[404],
            KeptAlive,
        ),
        case(
            "authority-form with GET",
            line("GET x:443 HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "asterisk-form with OPTIONS",
            line("OPTIONS * HTTP/1.1", &["Host: x"]),
            &[200],
            KeptAlive,
        ),
        case(
            "asterisk-form with GET",
            line("GET * HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "fragment in the target",
            line("GET /hello#frag HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "space inside the target",
            line("GET /hel lo HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "two spaces after the method",
            line("GET  /hello HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "NUL in the target",
            line("GET /hel\0lo HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        // --- Versions and methods.
        case("HTTP/0.9 request", "GET /hello\r\n", &[400], Closed),
        // (The HTTP/2 prior-knowledge preface starts HTTP/2: cli/tests/http2.rs and h2spec.)
        case(
            "HTTP/1.2",
            line("GET /hello HTTP/1.2", &["Host: x"]),
            &[505],
            Closed,
        ),
        case(
            "HTTP/2.0 in an HTTP/1 request line",
            line("GET /hello HTTP/2.0", &["Host: x"]),
            &[505],
            Closed,
        ),
        case(
            "HTTP/3",
            line("GET /hello HTTP/3", &["Host: x"]),
            &[505],
            Closed,
        ),
        case(
            "lowercase protocol name",
            line("GET /hello http/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "lowercase method is refused (apps upper-case it and would run another method)",
            line("get /hello HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "unknown method",
            line("BREW /hello HTTP/1.1", &["Host: x"]),
            &[405],
            KeptAlive,
        ),
        case(
            "method with a non-token byte",
            line("G@T /hello HTTP/1.1", &["Host: x"]),
            &[400],
            Closed,
        ),
        case(
            "HTTP/1.0 closes by default",
            line("GET /hello HTTP/1.0", &[]),
            &[200],
            Closed,
        ),
        case(
            "HTTP/1.0 with keep-alive",
            line("GET /hello HTTP/1.0", &["Connection: keep-alive"]),
            &[200],
            KeptAlive,
        ),
        // --- Garbage.
        case(
            "binary garbage",
            b"\x00\x01\x02\x03\xff\xfe\xfd\r\n\r\n",
            &[400],
            Closed,
        ),
        // A line that names no HTTP version may be a broken HTTP/2 preface: closed, no answer.
        case(
            "text garbage",
            "hello there, server\r\n\r\n",
            &[],
            Closed,
        ),
        case(
            "TLS ClientHello on the plain port",
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\x5e\x2f\x8c\x11\x00\x00\x02\x13\x01\x01\x00",
            &[400],
            Closed,
        ),
        // --- Host.
        case(
            "missing Host",
            line("GET /hello HTTP/1.1", &[]),
            &[400],
            Closed,
        ),
        case(
            "duplicate Host, differing",
            line("GET /hello HTTP/1.1", &["Host: x", "Host: y"]),
            &[400],
            Closed,
        ),
        case(
            "duplicate Host, same value in other case",
            line("GET /hello HTTP/1.1", &["Host: x", "host: x"]),
            &[400],
            Closed,
        ),
        case(
            "Host with a path",
            line("GET /hello HTTP/1.1", &["Host: x/evil"]),
            &[400],
            Closed,
        ),
        case(
            "Host with a space",
            line("GET /hello HTTP/1.1", &["Host: x y"]),
            &[400],
            Closed,
        ),
        case(
            "Host with userinfo",
            line("GET /hello HTTP/1.1", &["Host: user@x"]),
            &[400],
            Closed,
        ),
        case(
            "Host with a non-numeric port",
            line("GET /hello HTTP/1.1", &["Host: x:http"]),
            &[400],
            Closed,
        ),
        case(
            "Host with a port",
            line("GET /hello HTTP/1.1", &["Host: x.example:8080"]),
            &[200],
            KeptAlive,
        ),
        case(
            "Host as an IPv6 literal",
            line("GET /hello HTTP/1.1", &["Host: [::1]:8080"]),
            &[200],
            KeptAlive,
        ),
        case(
            "empty Host (allowed by RFC 9112 §3.2)",
            line("GET /hello HTTP/1.1", &["Host:"]),
            &[200],
            KeptAlive,
        ),
        // --- Pipelining around bad input.
        case(
            "valid request, then CL.TE",
            cat(&[
                GET_HELLO.as_bytes(),
                &post(
                    &["Content-Length: 6", "Transfer-Encoding: chunked"],
                    &format!("0\r\n\r\n{HIDDEN}"),
                ),
            ]),
            &[200, 400],
            Closed,
        ),
        case(
            "valid request, then garbage, then a request",
            cat(&[GET_HELLO.as_bytes(), b"\x01\x02\r\n\r\n", HIDDEN.as_bytes()]),
            &[200, 400],
            Closed,
        ),
        case(
            "Connection: close, then a pipelined request",
            cat(&[&get(&["Connection: close"]), HIDDEN.as_bytes()]),
            &[200],
            Closed,
        ),
        case(
            "bad chunk, then a pipelined request",
            cat(&[
                &chunked("5\r\nhelloXX\r\n0\r\n\r\n"),
                HIDDEN.as_bytes(),
            ]),
            &[400],
            Closed,
        ),
        case(
            "Expect with an unknown expectation",
            post(&["Expect: 200-ok", "Content-Length: 5"], "hello"),
            &[417],
            Closed,
        ),
    ]
}

fn start() -> ServerHandle {
    let mut config = ServerConfig::default();
    config.runtime.listen = vec!["127.0.0.1:0".parse().unwrap()];
    config.runtime.workers = 2;
    let router = Router::new()
        .get("/hello", |_: &Request<'_>, _: &mut HandlerContext<'_>| {
            Reply::Now(Response::text(200, "hello\n"))
        })
        .get("/follow", |_: &Request<'_>, _: &mut HandlerContext<'_>| {
            Reply::Now(Response::text(200, "follow\n"))
        })
        .get(
            "/smuggled",
            |_: &Request<'_>, _: &mut HandlerContext<'_>| {
                Reply::Now(Response::text(200, "SMUGGLED\n"))
            },
        )
        .post("/echo", |req: &Request<'_>, _: &mut HandlerContext<'_>| {
            Reply::Now(Response::new(200).with_body(Body::Owned(req.body.to_vec())))
        })
        .route(
            Method::Options,
            "*",
            |_: &Request<'_>, _: &mut HandlerContext<'_>| Reply::Now(Response::new(200)),
        );
    Server::new(config, router).start().expect("server starts")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Whole,
    Bytewise,
}

/// Reads one answer: `Ok(None)` when the server closed cleanly before any byte of one.
fn read_answer(c: &mut Client) -> Result<Option<(u16, Vec<u8>)>, String> {
    match c.read_answer(false) {
        Ok(r) => Ok(Some((r.status, r.body))),
        Err(NoAnswer::Closed) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 200 {
        format!("{}... ({} bytes)", &s[..200], b.len())
    } else {
        s.into_owned()
    }
}

fn run_case(addr: SocketAddr, case: &Case, mode: Mode) -> Result<(), String> {
    let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let mut c = Client::over(s);
    match mode {
        Mode::Whole => {
            // The server may answer and close before reading everything; that is its right.
            let _ = c.stream.write_all(&case.raw);
        }
        Mode::Bytewise => {
            for b in &case.raw {
                if c.stream.write_all(std::slice::from_ref(b)).is_err() {
                    break;
                }
            }
        }
    }

    let mut got = Vec::new();
    for (i, &want) in case.statuses.iter().enumerate() {
        match read_answer(&mut c)? {
            None => {
                return Err(format!(
                    "closed after {got:?}, expected statuses {:?}",
                    case.statuses
                ))
            }
            Some((status, body)) => {
                if body == b"SMUGGLED\n" {
                    return Err(format!("answered the hidden request (answer {i})"));
                }
                got.push(status);
                if status != want {
                    return Err(format!(
                        "statuses {got:?}, expected {:?}; body {:?}",
                        case.statuses,
                        show(&body)
                    ));
                }
                if i == 0 {
                    if let Some(want_body) = case.first_body {
                        if body != want_body {
                            return Err(format!(
                                "first body {:?}, expected {:?}",
                                show(&body),
                                show(want_body)
                            ));
                        }
                    }
                }
            }
        }
    }

    match case.end {
        End::Closed => match read_answer(&mut c)? {
            None => Ok(()),
            Some((status, body)) => Err(format!(
                "expected close after {got:?}, got another answer {status} {:?}",
                show(&body)
            )),
        },
        End::KeptAlive => {
            if c.buffered() > 0 {
                return Err(format!(
                    "unexpected bytes after the answers: {:?}",
                    show(c.unread())
                ));
            }
            c.stream
                .write_all(FOLLOW)
                .map_err(|e| format!("follow-up write failed (closed?): {e}"))?;
            match read_answer(&mut c)? {
                Some((200, body)) if body == b"follow\n" => Ok(()),
                Some((status, body)) => Err(format!(
                    "follow-up got {status} {:?} (an extra answer?)",
                    show(&body)
                )),
                None => Err("closed; expected the connection to stay open".into()),
            }
        }
    }
}

fn run_all(mode: Mode) {
    let server = start();
    let addr = server.local_addr();
    let all = cases();
    let mut failures = Vec::new();
    let mut names = std::collections::HashSet::new();
    for case in &all {
        assert!(
            names.insert(case.name),
            "duplicate case name {:?}",
            case.name
        );
        if mode == Mode::Bytewise && case.raw.len() > 1024 {
            continue;
        }
        if let Err(why) = run_case(addr, case, mode) {
            failures.push(format!("  {}: {why}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed ({}):\n{}",
        failures.len(),
        all.len(),
        match mode {
            Mode::Whole => "written in one piece",
            Mode::Bytewise => "written a byte at a time",
        },
        failures.join("\n")
    );
}

#[test]
fn there_are_at_least_sixty_cases() {
    assert!(cases().len() >= 60, "{}", cases().len());
}

#[test]
fn every_case_written_in_one_piece() {
    run_all(Mode::Whole);
}

#[test]
fn every_case_written_a_byte_at_a_time() {
    run_all(Mode::Bytewise);
}
