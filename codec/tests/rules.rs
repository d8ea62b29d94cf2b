//! One test (or a small group) per rule the codec enforces, through the public API only.
//! Every refused input is checked for its exact error variant *and* the status it maps to, so a
//! change to either shows up here.

use std::mem::MaybeUninit;

use tern_codec::{
    format_date_line, parse_request, reason_phrase, BodyDecoder, BodyKind, ChunkedDecoder,
    ConnectionHeader, Limits, Method, Parsed, RequestError, RequestHead, ResponseHead, Version,
    CONTINUE_100, MAX_HEADERS_DEFAULT,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// An owned copy of everything a parsed head says, so results can be compared across calls.
#[derive(Debug, Clone, PartialEq)]
struct Head {
    method: Method,
    method_str: String,
    target: String,
    path: String,
    query: Option<String>,
    version: Version,
    head_len: usize,
    body: BodyKind,
    keep_alive: bool,
    expect_continue: bool,
    host: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    fn from(h: &RequestHead<'_>) -> Head {
        Head {
            method: h.method,
            method_str: h.method_str.to_owned(),
            target: h.target.to_owned(),
            path: h.path.to_string(),
            query: h.query.map(str::to_owned),
            version: h.version,
            head_len: h.head_len,
            body: h.body,
            keep_alive: h.keep_alive,
            expect_continue: h.expect_continue,
            host: h.host.map(<[u8]>::to_vec),
            headers: h
                .headers
                .iter()
                .map(|x| (x.name.to_owned(), x.value.to_vec()))
                .collect(),
        }
    }
}

/// `Ok(None)` is Partial.
fn parse_with(buf: &[u8], limits: &Limits) -> Result<Option<Head>, RequestError> {
    let mut scratch = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
    match parse_request(buf, &mut scratch, limits)? {
        Parsed::Complete(h) => Ok(Some(Head::from(&h))),
        Parsed::Partial => Ok(None),
    }
}

fn parse(buf: &[u8]) -> Result<Option<Head>, RequestError> {
    parse_with(buf, &Limits::default())
}

#[track_caller]
fn ok_with(buf: &[u8], limits: &Limits) -> Head {
    match parse_with(buf, limits) {
        Ok(Some(h)) => h,
        other => panic!(
            "expected a complete head for {:?}, got {other:?}",
            show(buf)
        ),
    }
}

#[track_caller]
fn ok(buf: &[u8]) -> Head {
    ok_with(buf, &Limits::default())
}

#[track_caller]
fn rejects_with(buf: &[u8], limits: &Limits, want: RequestError, status: u16) {
    match parse_with(buf, limits) {
        Err(e) => {
            assert_eq!(e, want, "wrong error for {:?}", show(buf));
            assert_eq!(e.status(), status, "wrong status for {:?}", show(buf));
        }
        other => panic!(
            "expected {want:?} ({status}) for {:?}, got {other:?}",
            show(buf)
        ),
    }
}

#[track_caller]
fn rejects(buf: &[u8], want: RequestError, status: u16) {
    rejects_with(buf, &Limits::default(), want, status)
}

#[track_caller]
fn partial(buf: &[u8]) {
    match parse(buf) {
        Ok(None) => {}
        other => panic!("expected Partial for {:?}, got {other:?}", show(buf)),
    }
}

fn show(buf: &[u8]) -> String {
    String::from_utf8_lossy(buf).into_owned()
}

/// `GET / HTTP/1.1` with a Host and the given extra header lines (each without CRLF).
fn get11(extra: &[&str]) -> Vec<u8> {
    let mut s = String::from("GET / HTTP/1.1\r\nHost: example.com\r\n");
    for h in extra {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// A request with the given request line and header lines, properly CRLF-terminated.
fn req(line: &str, headers: &[&str]) -> Vec<u8> {
    let mut s = format!("{line}\r\n");
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// Decodes a whole body in one go; returns the payload and the bytes consumed.
fn decode_all(dec: &mut BodyDecoder, mut input: &[u8]) -> Result<(Vec<u8>, usize), RequestError> {
    let mut out = Vec::new();
    let mut consumed = 0;
    loop {
        let step = dec.decode(input)?;
        out.extend_from_slice(step.data);
        consumed += step.consumed;
        input = &input[step.consumed..];
        if step.done {
            return Ok((out, consumed));
        }
        if step.consumed == 0 {
            panic!(
                "decoder stalled with {} bytes left and not done",
                input.len()
            );
        }
    }
}

/// Feeds the body one byte at a time (as a slow client would); returns payload and consumed.
fn decode_bytewise(dec: &mut BodyDecoder, input: &[u8]) -> Result<(Vec<u8>, usize), RequestError> {
    let mut out = Vec::new();
    let mut consumed = 0;
    while consumed < input.len() {
        let step = dec.decode(&input[consumed..consumed + 1])?;
        out.extend_from_slice(step.data);
        consumed += step.consumed;
        if step.done {
            return Ok((out, consumed));
        }
        assert_eq!(
            step.consumed, 1,
            "one available byte must be consumed unless done"
        );
    }
    // Input exhausted: ask once more with nothing, the decoder must say whether it is done.
    let step = dec.decode(&[])?;
    assert_eq!(step.consumed, 0);
    assert!(step.done, "decoder not done after the whole body");
    Ok((out, consumed))
}

#[track_caller]
fn chunked_ok(body: &[u8], want: &[u8]) {
    for max in [u64::MAX, want.len() as u64] {
        let mut d = BodyDecoder::new(BodyKind::Chunked, max);
        let (got, consumed) = decode_all(&mut d, body).unwrap_or_else(|e| {
            panic!("chunked body {:?} refused with {e:?}", show(body));
        });
        assert_eq!(got, want, "payload of {:?}", show(body));
        assert_eq!(consumed, body.len(), "consumed of {:?}", show(body));
        assert!(d.is_done());

        let mut d = BodyDecoder::new(BodyKind::Chunked, max);
        let (got, consumed) = decode_bytewise(&mut d, body).unwrap();
        assert_eq!((got.as_slice(), consumed), (want, body.len()));
    }
}

#[track_caller]
fn chunked_rejects(body: &[u8], want: RequestError, status: u16) {
    chunked_rejects_with(body, u64::MAX, want, status)
}

#[track_caller]
fn chunked_rejects_with(body: &[u8], max_body: u64, want: RequestError, status: u16) {
    let mut d = BodyDecoder::new(BodyKind::Chunked, max_body);
    let e = decode_all(&mut d, body).expect_err(&format!("accepted {:?}", show(body)));
    assert_eq!((e, e.status()), (want, status), "whole: {:?}", show(body));
    // The verdict must not depend on how the bytes arrive.
    let mut d = BodyDecoder::new(BodyKind::Chunked, max_body);
    let e = decode_bytewise(&mut d, body).expect_err(&format!("accepted {:?}", show(body)));
    assert_eq!(
        (e, e.status()),
        (want, status),
        "bytewise: {:?}",
        show(body)
    );
}

// ---------------------------------------------------------------------------------------------
// A plain request
// ---------------------------------------------------------------------------------------------

#[test]
fn simple_get_parses_every_field() {
    let buf = b"GET /a/b%20c?x=1&y HTTP/1.1\r\nHost: example.com\r\nAccept: text/html\r\n\
        Accept-Encoding: gzip, br\r\nIf-None-Match: \"abc\"\r\n\
        If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\nRange: bytes=0-9\r\n\
        If-Range: \"abc\"\r\nX-Custom: v1\r\nx-custom: v2\r\n\r\nNEXT";
    let mut scratch = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
    let Ok(Parsed::Complete(h)) = parse_request(buf, &mut scratch, &Limits::default()) else {
        panic!("not complete");
    };
    assert_eq!(h.method, Method::Get);
    assert_eq!(h.method_str, "GET");
    assert_eq!(h.target, "/a/b%20c?x=1&y");
    assert_eq!(h.path, "/a/b%20c");
    assert_eq!(h.query, Some("x=1&y"));
    assert_eq!(h.version, Version::Http11);
    assert_eq!(h.head_len, buf.len() - 4);
    assert_eq!(&buf[h.head_len..], b"NEXT");
    assert_eq!(h.body, BodyKind::None);
    assert!(h.keep_alive);
    assert!(!h.expect_continue);
    assert_eq!(h.host, Some(&b"example.com"[..]));
    assert_eq!(h.accept, Some(&b"text/html"[..]));
    assert_eq!(h.accept_encoding, Some(&b"gzip, br"[..]));
    assert_eq!(h.if_none_match, Some(&b"\"abc\""[..]));
    assert_eq!(
        h.if_modified_since,
        Some(&b"Sun, 06 Nov 1994 08:49:37 GMT"[..])
    );
    assert_eq!(h.range, Some(&b"bytes=0-9"[..]));
    assert_eq!(h.if_range, Some(&b"\"abc\""[..]));
    assert_eq!(h.header("X-CUSTOM"), Some(&b"v1"[..]));
    assert_eq!(h.header("missing"), None);
    assert_eq!(
        h.header_all("x-custom").collect::<Vec<_>>(),
        [&b"v1"[..], &b"v2"[..]]
    );
    assert_eq!(h.headers.len(), 9);
}

#[test]
fn methods_are_recognised_and_unknown_tokens_are_other() {
    for (tok, m) in [
        ("GET", Method::Get),
        ("HEAD", Method::Head),
        ("POST", Method::Post),
        ("PUT", Method::Put),
        ("DELETE", Method::Delete),
        ("OPTIONS", Method::Options),
        ("PATCH", Method::Patch),
        ("TRACE", Method::Trace),
        ("BREW", Method::Other),
        ("M-SEARCH", Method::Other),
    ] {
        let h = ok(&req(&format!("{tok} / HTTP/1.1"), &["Host: a"]));
        assert_eq!((h.method, h.method_str.as_str()), (m, tok));
    }
    // Methods are case-sensitive, but apps upper-case them: `post` would be judged as an
    // unknown method and run as POST, so lower case is refused.
    for tok in ["get", "post", "Post", "dElEtE"] {
        rejects(
            &req(&format!("{tok} / HTTP/1.1"), &["Host: a"]),
            RequestError::BadRequestLine,
            400,
        );
    }
    // CONNECT names an authority, never a path.
    rejects(
        &req("CONNECT /x HTTP/1.1", &["Host: a"]),
        RequestError::BadRequestLine,
        400,
    );
    let h = ok(&req(
        "CONNECT example.com:443 HTTP/1.1",
        &["Host: example.com:443"],
    ));
    assert_eq!(
        (h.method, h.path.as_str()),
        (Method::Connect, "example.com:443")
    );
}

#[test]
fn header_values_are_trimmed_and_may_carry_obs_text() {
    let h = ok(&get11(&["X-A: \t padded \t ", "X-B:", "X-C: caf\u{e9}"]));
    assert_eq!(h.headers[1].1, b"padded");
    assert_eq!(h.headers[2].1, b"");
    assert_eq!(h.headers[3].1, "caf\u{e9}".as_bytes());
}

#[test]
fn leading_empty_lines_before_the_request_line_are_ignored() {
    // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request-line.
    let h = ok(b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(h.head_len, 29);
}

// ---------------------------------------------------------------------------------------------
// Keep-alive
// ---------------------------------------------------------------------------------------------

#[test]
fn http11_keeps_alive_by_default() {
    assert!(ok(&get11(&[])).keep_alive);
    assert!(ok(&get11(&["Connection: keep-alive"])).keep_alive);
    assert!(ok(&get11(&["Connection: upgrade"])).keep_alive);
    // Tokens must match exactly, not as substrings.
    assert!(ok(&get11(&["Connection: closed"])).keep_alive);
    assert!(ok(&get11(&["Connection: xclose"])).keep_alive);
    assert!(ok(&get11(&["X-Connection: close"])).keep_alive);
}

#[test]
fn http11_connection_close_is_honoured_in_any_form() {
    for v in [
        "close",
        "Close",
        "CLOSE",
        "foo, close",
        "close, foo",
        "foo,close",
        "foo , \tclose\t, bar",
        "keep-alive, close",
        "close, keep-alive",
    ] {
        let h = ok(&get11(&[&format!("Connection: {v}")]));
        assert!(!h.keep_alive, "Connection: {v}");
    }
    // In a second Connection field, too.
    assert!(!ok(&get11(&["Connection: foo", "Connection: close"])).keep_alive);
}

#[test]
fn http10_keeps_alive_only_on_request() {
    assert!(!ok(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
    assert!(!ok(&req("GET / HTTP/1.0", &["Connection: foo"])).keep_alive);
    assert!(ok(&req("GET / HTTP/1.0", &["Connection: keep-alive"])).keep_alive);
    assert!(ok(&req("GET / HTTP/1.0", &["Connection: Keep-Alive"])).keep_alive);
    assert!(ok(&req("GET / HTTP/1.0", &["Connection: foo, keep-alive"])).keep_alive);
    assert!(!ok(&req("GET / HTTP/1.0", &["Connection: keep-alive, close"])).keep_alive);
    assert!(
        !ok(&req(
            "GET / HTTP/1.0",
            &["Connection: keep-alive", "Connection: close"]
        ))
        .keep_alive
    );
    assert!(!ok(&req("GET / HTTP/1.0", &["Connection: close"])).keep_alive);
}

// ---------------------------------------------------------------------------------------------
// Request bodies: Content-Length
// ---------------------------------------------------------------------------------------------

#[test]
fn content_length_body_is_framed_exactly() {
    let buf = b"POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n";
    let h = ok(buf);
    assert_eq!(h.body, BodyKind::Length(5));
    let mut d = BodyDecoder::new(h.body, Limits::default().max_body);
    let (payload, consumed) = decode_all(&mut d, &buf[h.head_len..]).unwrap();
    assert_eq!(payload, b"hello");
    assert_eq!(consumed, 5, "must not eat the pipelined request");
    assert!(d.is_done());
    // Done decoders consume nothing more.
    let step = d.decode(b"more").unwrap();
    assert_eq!((step.consumed, step.data, step.done), (0, &b""[..], true));
}

#[test]
fn content_length_zero_or_absent_means_no_body() {
    assert_eq!(
        ok(&req("POST / HTTP/1.1", &["Host: a", "Content-Length: 0"])).body,
        BodyKind::None
    );
    assert_eq!(
        ok(&req("POST / HTTP/1.1", &["Host: a"])).body,
        BodyKind::None
    );
    assert_eq!(
        ok(&req("POST / HTTP/1.1", &["Host: a", "Content-Length: 000"])).body,
        BodyKind::None
    );
    assert!(BodyDecoder::new(BodyKind::None, 0).is_done());
    assert!(BodyDecoder::new(BodyKind::Length(0), 0).is_done());
}

#[test]
fn content_length_identical_duplicates_are_accepted() {
    for hs in [
        &["Content-Length: 5", "Content-Length: 5"][..],
        &["Content-Length: 5, 5"],
        &["Content-Length: 5,5,5"],
        &["Content-Length: 5", "Content-Length: 05"],
        &["Content-Length:  5 "],
    ] {
        let mut all = vec!["Host: a"];
        all.extend_from_slice(hs);
        assert_eq!(
            ok(&req("POST / HTTP/1.1", &all)).body,
            BodyKind::Length(5),
            "{hs:?}"
        );
    }
}

#[test]
fn content_length_differing_duplicates_are_400() {
    for hs in [
        &["Content-Length: 5", "Content-Length: 6"][..],
        &["Content-Length: 5, 6"],
        &["Content-Length: 5", "Content-Length: 5, 6"],
        &["Content-Length: 0", "Content-Length: 5"],
    ] {
        let mut all = vec!["Host: a"];
        all.extend_from_slice(hs);
        rejects(
            &req("POST / HTTP/1.1", &all),
            RequestError::BadContentLength,
            400,
        );
    }
}

#[test]
fn content_length_that_is_not_plain_decimal_is_400() {
    for v in [
        "",
        "+5",
        "-5",
        "5x",
        "0x5",
        "5 5",
        "5,",
        ",5",
        "5,,5",
        "1e3",
        "5.0",
        "\u{665}",
        // 19 digits would overflow the fold in some forms; far beyond any body limit anyway.
        "1000000000000000000",
        "99999999999999999999999999",
    ] {
        let line = format!("Content-Length: {v}");
        rejects(
            &req("POST / HTTP/1.1", &["Host: a", &line]),
            RequestError::BadContentLength,
            400,
        );
    }
}

#[test]
fn content_length_above_max_body_is_413_at_head_time() {
    let limits = Limits {
        max_body: 100,
        ..Limits::default()
    };
    let at = req("POST / HTTP/1.1", &["Host: a", "Content-Length: 100"]);
    assert_eq!(ok_with(&at, &limits).body, BodyKind::Length(100));
    let over = req("POST / HTTP/1.1", &["Host: a", "Content-Length: 101"]);
    rejects_with(&over, &limits, RequestError::BodyTooLarge, 413);
    // The default limit is 1 MiB.
    let big = req("POST / HTTP/1.1", &["Host: a", "Content-Length: 1048577"]);
    rejects(&big, RequestError::BodyTooLarge, 413);
    let max = req(
        "POST / HTTP/1.1",
        &["Host: a", "Content-Length: 999999999999999999"],
    );
    rejects(&max, RequestError::BodyTooLarge, 413);
}

// ---------------------------------------------------------------------------------------------
// Request bodies: chunked
// ---------------------------------------------------------------------------------------------

#[test]
fn chunked_request_is_framed_as_chunked() {
    for te in [
        "chunked",
        "Chunked",
        "CHUNKED",
        " chunked ",
        "chunked,",
        ", chunked",
    ] {
        let h = ok(&req(
            "POST / HTTP/1.1",
            &["Host: a", &format!("Transfer-Encoding: {te}")],
        ));
        assert_eq!(h.body, BodyKind::Chunked, "{te:?}");
    }
}

#[test]
fn chunked_body_decodes() {
    chunked_ok(b"5\r\nhello\r\n0\r\n\r\n", b"hello");
    chunked_ok(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world");
    chunked_ok(b"0\r\n\r\n", b"");
    chunked_ok(b"A\r\n0123456789\r\n0\r\n\r\n", b"0123456789");
    chunked_ok(b"a\r\n0123456789\r\n0\r\n\r\n", b"0123456789");
    chunked_ok(b"000005\r\nhello\r\n000\r\n\r\n", b"hello");
    // Chunk data is opaque: CR, LF and NUL inside it are payload.
    chunked_ok(b"4\r\n\r\n\0\n\r\n0\r\n\r\n", b"\r\n\0\n");
}

#[test]
fn chunked_decoder_stops_at_the_end_of_the_body() {
    let body = b"3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
    let mut d = BodyDecoder::new(BodyKind::Chunked, 1 << 20);
    let (payload, consumed) = decode_all(&mut d, body).unwrap();
    assert_eq!(payload, b"abc");
    assert_eq!(&body[consumed..], b"GET / HTTP/1.1\r\n");
    // The bare decoder, too.
    let mut c = ChunkedDecoder::new(1 << 20);
    let mut rest = &body[..];
    let mut out = Vec::new();
    loop {
        let step = c.decode(rest).unwrap();
        out.extend_from_slice(step.data);
        rest = &rest[step.consumed..];
        if step.done {
            break;
        }
    }
    assert_eq!(
        (out.as_slice(), rest),
        (&b"abc"[..], &b"GET / HTTP/1.1\r\n"[..])
    );
    // Once done, it stays done and consumes nothing.
    let step = c.decode(b"xyz").unwrap();
    assert_eq!((step.consumed, step.done), (0, true));
}

#[test]
fn chunked_trailers_are_skipped() {
    chunked_ok(b"5\r\nhello\r\n0\r\nX-Trailer: a\r\n\r\n", b"hello");
    chunked_ok(b"0\r\nA: 1\r\nB: 2\r\nC:\r\n\r\n", b"");
    chunked_ok(
        b"2\r\nhi\r\n0\r\nDigest: sha-256=abc\t\x80\xff\r\n\r\n",
        b"hi",
    );
}

#[test]
fn chunked_trailers_refuse_bare_lf_nul_and_bare_cr() {
    chunked_rejects(b"0\r\nX: a\n\r\n", RequestError::BadChunk, 400);
    chunked_rejects(b"0\r\nX: a\r\n\n", RequestError::BadChunk, 400);
    chunked_rejects(b"0\r\n\n", RequestError::BadChunk, 400);
    chunked_rejects(b"0\r\nX: \0\r\n\r\n", RequestError::BadChunk, 400);
    chunked_rejects(b"0\r\nX: a\rb\r\n\r\n", RequestError::BadChunk, 400);
    chunked_rejects(b"0\r\n\rX", RequestError::BadChunk, 400);
}

#[test]
fn chunked_trailers_must_be_field_lines() {
    // Regression: trailer lines were skipped up to CR without a look at their shape, so a
    // request hidden after `0\r\n` was silently swallowed as a "trailer". A front end that
    // ends the body at `0\r\n` would read it as a request: refuse instead.
    for trailer in [
        &b"GET /smuggled HTTP/1.1\r\nHost: x\r\n"[..],
        b"X-Sum : abc\r\n",
        b": abc\r\n",
        b"X-Sum\r\n",
        b"X@Sum: abc\r\n",
        b"X-Sum: a\r\n b\r\n",
        b" X-Sum: a\r\n",
        b"X-Sum: a\x01b\r\n",
        b"X-Sum: a\x7fb\r\n",
    ] {
        let mut body = b"5\r\nhello\r\n0\r\n".to_vec();
        body.extend_from_slice(trailer);
        body.extend_from_slice(b"\r\n");
        chunked_rejects(&body, RequestError::BadChunk, 400);
    }
    chunked_ok(b"0\r\nX-Empty:\r\nX-Ws: \t a b \t\r\n\r\n", b"");
}

#[test]
fn chunked_trailers_are_capped() {
    let mut body = b"0\r\n".to_vec();
    for _ in 0..200 {
        body.extend_from_slice(b"X-Padding: ");
        body.extend_from_slice(&[b'a'; 50]);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"\r\n");
    chunked_rejects(&body, RequestError::BadChunk, 400);
}

#[test]
fn chunked_extensions_are_validated_and_ignored() {
    for ext in [
        ";name",
        ";name=value",
        "; name = value",
        " ;a",
        "\t;a",
        ";a;b=c;d",
        ";a=\"quoted ; string\"",
        ";a=\"\"",
        ";a=\"has\\\"escaped\\\\quotes\"",
        ";a=\"\\\\\"",
        ";a=\"obs-text \u{e9}\"",
    ] {
        let body = format!("5{ext}\r\nhello\r\n0{ext}\r\n\r\n");
        chunked_ok(body.as_bytes(), b"hello");
    }
}

#[test]
fn chunked_extensions_with_control_bytes_or_open_quotes_are_400() {
    for ext in [
        &b";a\0"[..],
        b";a\nb",
        b";a\x7f",
        b";a\x01",
        b";a=\"unterminated",
        b";a=\"ends in an escape\\\"",
        b";a=\"cr\rinside\"",
        b";a\rb",
    ] {
        let mut body = b"5".to_vec();
        body.extend_from_slice(ext);
        body.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        chunked_rejects(&body, RequestError::BadChunk, 400);
    }
}

#[test]
fn chunked_extensions_must_follow_the_grammar() {
    // Regression: only control bytes and open quotes were refused; a bare `;`, a missing
    // name or bytes outside the token alphabet were skipped (RFC 9112 §7.1.1).
    for ext in [
        ";",
        "; ",
        ";;a",
        ";=a",
        "; =a",
        ";a=",
        ";a= ",
        ";a=;b",
        ";a@b",
        ";a=b@c",
        ";a=b c",
        ";a b",
        ";a=\"x\"y",
        ";a=\"x\" y",
        ";a==b",
        ";\"a\"",
        ";a=\"\x7f\"",
        " x",
    ] {
        let body = format!("5{ext}\r\nhello\r\n0\r\n\r\n");
        chunked_rejects(body.as_bytes(), RequestError::BadChunk, 400);
    }
    // Whitespace before the CR is tolerated.
    for ext in [" ", "\t", ";a ", ";a=b\t", ";a=\"b\" "] {
        let body = format!("5{ext}\r\nhello\r\n0\r\n\r\n");
        chunked_ok(body.as_bytes(), b"hello");
    }
}

#[test]
fn chunked_extension_line_is_capped() {
    let body = format!("5;a={}\r\nhello\r\n0\r\n\r\n", "x".repeat(5000));
    chunked_rejects(body.as_bytes(), RequestError::BadChunk, 400);
    let body = format!("5;a={}\r\nhello\r\n0\r\n\r\n", "x".repeat(4000));
    chunked_ok(body.as_bytes(), b"hello");
}

#[test]
fn chunk_size_garbage_is_400() {
    for size in [
        &b"5x"[..],
        b"5 5",
        b"",
        b" 5",
        b"-5",
        b"+5",
        b"0x5",
        b"g",
        b";ext",
        b"5\t5",
        b"5 =a",
    ] {
        let mut body = size.to_vec();
        body.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        chunked_rejects(&body, RequestError::BadChunk, 400);
    }
}

#[test]
fn chunk_framing_errors_are_400() {
    // Bare LF after the size line, after the data, on the last line.
    chunked_rejects(b"5\nhello\r\n0\r\n\r\n", RequestError::BadChunk, 400);
    chunked_rejects(b"5\r\nhello\n0\r\n\r\n", RequestError::BadChunk, 400);
    chunked_rejects(b"5\r\nhello\r\n0\n\r\n", RequestError::BadChunk, 400);
    chunked_rejects(b"5\r\nhello\r\n0\r\n\n", RequestError::BadChunk, 400);
    // Data longer than announced.
    chunked_rejects(b"5\r\nhello!\r\n0\r\n\r\n", RequestError::BadChunk, 400);
    // CR not followed by LF.
    chunked_rejects(b"5\rxhello\r\n0\r\n\r\n", RequestError::BadChunk, 400);
    chunked_rejects(b"5\r\nhello\rx0\r\n\r\n", RequestError::BadChunk, 400);
}

#[test]
fn absurd_chunk_sizes_are_400() {
    // 16+ hex digits could overflow a u64 accumulator; refused before any arithmetic.
    for size in [
        "10000000000000000",
        "ffffffffffffffff",
        "ffffffffffffffffffffffffffff",
        "0000000000000000",
    ] {
        let body = format!("{size}\r\nx\r\n0\r\n\r\n");
        chunked_rejects(body.as_bytes(), RequestError::BadChunk, 400);
    }
    // 15 digits fits in a u64: it is refused as too large for the body limit instead.
    chunked_rejects_with(
        b"fffffffffffffff\r\n",
        1 << 20,
        RequestError::BodyTooLarge,
        413,
    );
}

#[test]
fn chunked_total_above_max_body_is_413_while_decoding() {
    // Exactly at the limit is fine.
    let mut d = BodyDecoder::new(BodyKind::Chunked, 10);
    let (p, _) = decode_all(&mut d, b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n").unwrap();
    assert_eq!(p, b"helloworld");
    // One byte more is refused when the size line announcing it arrives, before its data.
    chunked_rejects_with(
        b"5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n",
        10,
        RequestError::BodyTooLarge,
        413,
    );
    let mut d = BodyDecoder::new(BodyKind::Chunked, 10);
    let first = d.decode(b"5\r\nhello\r\n").unwrap();
    assert_eq!(first.data, b"hello");
    let rest = &b"5\r\nhello\r\n"[first.consumed..];
    let _ = d.decode(rest).unwrap();
    assert_eq!(d.decode(b"6\r\n").unwrap_err(), RequestError::BodyTooLarge);
    // A single huge chunk too.
    chunked_rejects_with(b"100001\r\n", 1 << 20, RequestError::BodyTooLarge, 413);
}

// ---------------------------------------------------------------------------------------------
// Transfer-Encoding rules
// ---------------------------------------------------------------------------------------------

#[test]
fn content_length_with_transfer_encoding_is_400() {
    rejects(
        &req(
            "POST / HTTP/1.1",
            &["Host: a", "Content-Length: 5", "Transfer-Encoding: chunked"],
        ),
        RequestError::LengthAndChunked,
        400,
    );
    rejects(
        &req(
            "POST / HTTP/1.1",
            &["Host: a", "Transfer-Encoding: chunked", "Content-Length: 5"],
        ),
        RequestError::LengthAndChunked,
        400,
    );
    rejects(
        &req(
            "POST / HTTP/1.1",
            &["Host: a", "Transfer-Encoding: chunked", "Content-Length: 0"],
        ),
        RequestError::LengthAndChunked,
        400,
    );
}

#[test]
fn transfer_encoding_whose_last_coding_is_not_chunked_is_400() {
    for hs in [
        &["Transfer-Encoding: gzip"][..],
        &["Transfer-Encoding: identity"],
        &["Transfer-Encoding: chunked, gzip"],
        &["Transfer-Encoding: chunked", "Transfer-Encoding: gzip"],
        &["Transfer-Encoding: chunked, chunked"],
        &["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
        &["Transfer-Encoding:"],
        &["Transfer-Encoding: chunkedx"],
        &["Transfer-Encoding: \"chunked\""],
        // Codings we cannot decode are refused even if chunked is last: we never guess.
        &["Transfer-Encoding: gzip, chunked"],
    ] {
        let mut all = vec!["Host: a"];
        all.extend_from_slice(hs);
        rejects(
            &req("POST / HTTP/1.1", &all),
            RequestError::BadTransferEncoding,
            400,
        );
    }
}

#[test]
fn transfer_encoding_in_http10_is_400() {
    rejects(
        &req("POST / HTTP/1.0", &["Transfer-Encoding: chunked"]),
        RequestError::BadTransferEncoding,
        400,
    );
}

// ---------------------------------------------------------------------------------------------
// Expect
// ---------------------------------------------------------------------------------------------

#[test]
fn expect_100_continue_only_with_a_body() {
    let h = ok(&req(
        "POST / HTTP/1.1",
        &["Host: a", "Expect: 100-continue", "Content-Length: 5"],
    ));
    assert!(h.expect_continue);
    let h = ok(&req(
        "POST / HTTP/1.1",
        &[
            "Host: a",
            "Expect: 100-Continue",
            "Transfer-Encoding: chunked",
        ],
    ));
    assert!(h.expect_continue);
    // No body: nothing to wait for.
    assert!(
        !ok(&req(
            "POST / HTTP/1.1",
            &["Host: a", "Expect: 100-continue"]
        ))
        .expect_continue
    );
    let h = ok(&req(
        "POST / HTTP/1.1",
        &["Host: a", "Expect: 100-continue", "Content-Length: 0"],
    ));
    assert!(!h.expect_continue);
    assert!(!ok(&get11(&[])).expect_continue);
}

#[test]
fn expect_100_continue_in_http10_is_ignored() {
    // RFC 9110 §10.1.1: "A server that receives a 100-continue expectation in an HTTP/1.0
    // request MUST ignore that expectation." An HTTP/1.0 client cannot parse a 1xx response.
    let h = ok(&req(
        "POST / HTTP/1.0",
        &["Expect: 100-continue", "Content-Length: 5"],
    ));
    assert_eq!(h.body, BodyKind::Length(5));
    assert!(!h.expect_continue);
}

#[test]
fn expect_anything_else_is_417() {
    for v in ["something-else", "100-continue, foo", "", "100", "200-ok"] {
        let line = format!("Expect: {v}");
        rejects(
            &req("POST / HTTP/1.1", &["Host: a", &line, "Content-Length: 1"]),
            RequestError::BadExpectation,
            417,
        );
        rejects(&get11(&[&line]), RequestError::BadExpectation, 417);
    }
}

// ---------------------------------------------------------------------------------------------
// Head limits
// ---------------------------------------------------------------------------------------------

/// A GET whose head is exactly `len` bytes.
fn head_of_len(len: usize) -> Vec<u8> {
    let fixed = "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: \r\n\r\n".len();
    let pad = "p".repeat(len - fixed);
    let v = get11_no_host(&["Host: a", &format!("X-Pad: {pad}")]);
    assert_eq!(v.len(), len);
    v
}

fn get11_no_host(headers: &[&str]) -> Vec<u8> {
    req("GET / HTTP/1.1", headers)
}

#[test]
fn head_of_32_kib_is_accepted_and_one_byte_more_is_431() {
    assert_eq!(Limits::default().max_head, 32 * 1024);
    let at = head_of_len(32 * 1024);
    assert_eq!(ok(&at).head_len, 32 * 1024);
    let over = head_of_len(32 * 1024 + 1);
    rejects(&over, RequestError::HeadTooLarge, 431);
}

#[test]
fn incomplete_head_reaching_the_limit_is_431_not_partial() {
    let at = head_of_len(32 * 1024 + 100);
    partial(&at[..32 * 1024 - 1]);
    rejects(&at[..32 * 1024], RequestError::HeadTooLarge, 431);
    rejects(&at[..32 * 1024 + 50], RequestError::HeadTooLarge, 431);
    // A custom limit.
    let limits = Limits {
        max_head: 64,
        ..Limits::default()
    };
    rejects_with(&at[..64], &limits, RequestError::HeadTooLarge, 431);
    assert!(matches!(parse_with(&at[..63], &limits), Ok(None)));
}

#[test]
fn a_body_beyond_the_head_limit_does_not_count_against_it() {
    let limits = Limits {
        max_head: 64,
        ..Limits::default()
    };
    let mut buf = req("POST / HTTP/1.1", &["Host: a", "Content-Length: 200"]);
    buf.extend_from_slice(&[b'x'; 200]);
    assert_eq!(ok_with(&buf, &limits).body, BodyKind::Length(200));
}

#[test]
fn verdict_depends_only_on_the_first_max_head_bytes() {
    // Regression: a head still incomplete at the limit was 431 when the bytes stopped there but
    // 400 when a bad byte beyond the limit arrived in the same read.
    let limits = Limits {
        max_head: 64,
        ..Limits::default()
    };
    let mut buf = head_of_len(100);
    buf[80] = 0;
    rejects_with(&buf[..64], &limits, RequestError::HeadTooLarge, 431);
    rejects_with(&buf, &limits, RequestError::HeadTooLarge, 431);
    // A bad byte inside the limit is still reported as what it is.
    buf[40] = 0;
    rejects_with(&buf, &limits, RequestError::BadHeader, 400);
}

fn with_n_headers(n: usize) -> Vec<u8> {
    let lines: Vec<String> = std::iter::once("Host: a".to_owned())
        .chain((1..n).map(|i| format!("X-{i}: v")))
        .collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    req("GET / HTTP/1.1", &refs)
}

#[test]
fn a_hundred_headers_are_accepted_and_one_more_is_431() {
    assert_eq!(Limits::default().max_headers, 100);
    assert_eq!(ok(&with_n_headers(100)).headers.len(), 100);
    rejects(&with_n_headers(101), RequestError::TooManyHeaders, 431);
    rejects(&with_n_headers(500), RequestError::TooManyHeaders, 431);
}

#[test]
fn header_count_limit_is_configurable_and_clamped_to_the_scratch() {
    let limits = Limits {
        max_headers: 10,
        ..Limits::default()
    };
    assert_eq!(ok_with(&with_n_headers(10), &limits).headers.len(), 10);
    rejects_with(
        &with_n_headers(11),
        &limits,
        RequestError::TooManyHeaders,
        431,
    );

    // A limit above the scratch size is capped by the scratch.
    let limits = Limits {
        max_headers: 1000,
        ..Limits::default()
    };
    let mut small = [MaybeUninit::uninit(); 4];
    assert!(matches!(
        parse_request(&with_n_headers(4), &mut small, &limits),
        Ok(Parsed::Complete(_))
    ));
    let mut small = [MaybeUninit::uninit(); 4];
    assert_eq!(
        parse_request(&with_n_headers(5), &mut small, &limits).unwrap_err(),
        RequestError::TooManyHeaders
    );
}

// ---------------------------------------------------------------------------------------------
// Malformed request lines and headers
// ---------------------------------------------------------------------------------------------

#[test]
fn malformed_request_lines_are_400() {
    for line in [
        &b"GET\r\n"[..],
        b"GET /\r\n",
        b"GET  / HTTP/1.1\r\n",
        b"GET /  HTTP/1.1\r\n",
        b" GET / HTTP/1.1\r\n",
        b"GET\t/ HTTP/1.1\r\n",
        b"G@T / HTTP/1.1\r\n",
        b"GET / HTTP/1.1 \r\n",
        b"GET / HTTP/1.1x\r\n",
        b"GET / http/1.1\r\n",
        b"GET / FOO/1.1\r\n",
        b"GET /a b HTTP/1.1\r\n",
        b"GET /a\0 HTTP/1.1\r\n",
        b"GET /\x7f HTTP/1.1\r\n",
        b"GET foo HTTP/1.1\r\n",
        b"GET \xff\xfe HTTP/1.1\r\n",
        b"GET / HTTP/1.1\rHost: a\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", // a TLS ClientHello on the plain port
    ] {
        let mut buf = line.to_vec();
        buf.extend_from_slice(b"Host: a\r\n\r\n");
        rejects(&buf, RequestError::BadRequestLine, 400);
    }
}

#[test]
fn malformed_header_fields_are_400() {
    for h in [
        "Host a",
        "Ho st: a",
        ": a",
        "Host : a",
        "Host\t: a",
        "X(y): a",
        "X\u{e9}: a",
        "X: a\u{7f}",
        "X: a\u{1}",
        "X: \u{1b}[31m",
    ] {
        rejects(&get11(&[h]), RequestError::BadHeader, 400);
    }
}

#[test]
fn nul_cr_lf_inside_header_values_are_400() {
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n",
        RequestError::BadHeader,
        400,
    );
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: \0\r\n\r\n",
        RequestError::BadHeader,
        400,
    );
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
        RequestError::BadHeader,
        400,
    );
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\r\n\r\n",
        RequestError::BadHeader,
        400,
    );
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\0\r\n\r\n",
        RequestError::BadHeader,
        400,
    );
    // An LF inside a value ends the line early: what follows is a malformed header line...
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\nb\r\n\r\n",
        RequestError::BadHeader,
        400,
    );
    // ...or, if it happens to look like a field, the line ending is a bare LF.
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\nY: b\r\n\r\n",
        RequestError::BareLf,
        400,
    );
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\nY: b\r\n\r\n",
        RequestError::BareLf,
        400,
    );
}

#[test]
fn obs_fold_is_400() {
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
        RequestError::ObsFold,
        400,
    );
    rejects(
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n\tb\r\n\r\n",
        RequestError::ObsFold,
        400,
    );
    rejects(
        b"GET / HTTP/1.1\r\n Host: a\r\n\r\n",
        RequestError::ObsFold,
        400,
    );
}

#[test]
fn bare_lf_line_endings_are_400() {
    for buf in [
        &b"GET / HTTP/1.1\nHost: a\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n\n",
        b"GET / HTTP/1.1\nHost: a\n\n",
        b"GET / HTTP/1.0\n\n",
        b"\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        rejects(buf, RequestError::BareLf, 400);
    }
}

#[test]
fn missing_host_on_http11_is_400() {
    rejects(b"GET / HTTP/1.1\r\n\r\n", RequestError::MissingHost, 400);
    rejects(
        b"GET / HTTP/1.1\r\nHostname: a\r\n\r\n",
        RequestError::MissingHost,
        400,
    );
    // HTTP/1.0 had no Host requirement.
    assert_eq!(ok(b"GET / HTTP/1.0\r\n\r\n").host, None);
    // An empty Host is allowed (RFC 9112 §3.2).
    assert_eq!(
        ok(b"GET / HTTP/1.1\r\nHost:\r\n\r\n").host,
        Some(Vec::new())
    );
    assert_eq!(
        ok(b"GET / HTTP/1.1\r\nhOsT: x\r\n\r\n").host,
        Some(b"x".to_vec())
    );
}

#[test]
fn invalid_host_is_400() {
    // Regression: RFC 9112 §3.2 says a Host with an invalid field value MUST be answered 400;
    // any value was accepted, so `Host: a/b`, `Host: user@a` or `Host: a b` reached handlers.
    for v in [
        "a b", "a/b", "user@a", "a:http", "a:1:2", "a?b", "[::1", "[::1]x", "%zz", "a\"b",
    ] {
        rejects(
            &get11_no_host(&[&format!("Host: {v}")]),
            RequestError::BadHeader,
            400,
        );
    }
    for v in [
        "",
        "a",
        "a:80",
        "a:",
        "127.0.0.1:8080",
        "[::1]:8080",
        "xn--d-a.b_c~",
        "%41",
    ] {
        let h = ok(&get11_no_host(&[&format!("Host: {v}")]));
        assert_eq!(h.host, Some(v.as_bytes().to_vec()));
    }
}

#[test]
fn repeated_host_is_400() {
    rejects(&get11(&["Host: a"]), RequestError::MissingHost, 400);
    rejects(
        &get11(&["host: example.com"]),
        RequestError::MissingHost,
        400,
    );
    rejects(
        &req("GET / HTTP/1.0", &["Host: a", "Host: b"]),
        RequestError::MissingHost,
        400,
    );
}

// ---------------------------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------------------------

#[test]
fn http2_preface_is_505() {
    rejects(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        RequestError::Http2Preface,
        505,
    );
    rejects(b"PRI * HTTP/2.0\r\n", RequestError::Http2Preface, 505);
    // A prefix of the preface waits for more.
    for n in 0..16 {
        partial(&b"PRI * HTTP/2.0\r\n"[..n]);
    }
    // PRI as an ordinary (unknown) method is not the preface.
    assert_eq!(
        ok(&req("PRI /x HTTP/1.1", &["Host: a"])).method,
        Method::Other
    );
}

#[test]
fn unknown_versions_are_505() {
    for v in [
        "HTTP/1.2",
        "HTTP/3.0",
        "HTTP/2.0",
        "HTTP/2",
        "HTTP/1.9",
        "HTTP/0.9",
        "HTTP/10.0",
    ] {
        rejects(
            &req(&format!("GET / {v}"), &["Host: a"]),
            RequestError::UnsupportedVersion,
            505,
        );
    }
}

#[test]
fn http09_request_is_400() {
    rejects(b"GET /\r\n", RequestError::BadRequestLine, 400);
    rejects(b"GET /\r\n\r\n", RequestError::BadRequestLine, 400);
}

// ---------------------------------------------------------------------------------------------
// Request targets
// ---------------------------------------------------------------------------------------------

#[test]
fn fragment_in_the_target_is_400() {
    for t in [
        "/a#b",
        "/#",
        "/a?b#c",
        "http://host/p#f",
        "http://host#f",
        "http://host?q#f",
        "http://ho#st/p",
    ] {
        rejects(
            &req(&format!("GET {t} HTTP/1.1"), &["Host: a"]),
            RequestError::BadRequestLine,
            400,
        );
    }
}

#[test]
fn absolute_form_is_accepted() {
    for (t, path, query) in [
        ("http://host/p?q", "/p", Some("q")),
        ("http://host/p", "/p", None),
        ("http://host", "/", None),
        ("http://host?x=1", "/", Some("x=1")),
        ("HTTP://host/a/b", "/a/b", None),
        ("https://host:8443/a?", "/a", Some("")),
        ("http://user@host:80/p?a=b?c", "/p", Some("a=b?c")),
    ] {
        let h = ok(&req(&format!("GET {t} HTTP/1.1"), &["Host: host"]));
        assert_eq!((h.path.as_str(), h.query.as_deref()), (path, query), "{t}");
        assert_eq!(h.target, t);
    }
}

#[test]
fn asterisk_form_is_for_options_only() {
    let h = ok(&req("OPTIONS * HTTP/1.1", &["Host: a"]));
    assert_eq!(
        (h.method, h.path.as_str(), h.query),
        (Method::Options, "*", None)
    );
    for line in [
        "GET * HTTP/1.1",
        "HEAD * HTTP/1.1",
        "OPTIONS *x HTTP/1.1",
        "OPTIONS ** HTTP/1.1",
    ] {
        rejects(&req(line, &["Host: a"]), RequestError::BadRequestLine, 400);
    }
}

#[test]
fn other_target_forms_are_400() {
    for line in [
        "GET example.com HTTP/1.1",
        "GET ftp://host/p HTTP/1.1",
        "GET ?q HTTP/1.1",
    ] {
        rejects(&req(line, &["Host: a"]), RequestError::BadRequestLine, 400);
    }
}

// ---------------------------------------------------------------------------------------------
// Partial input
// ---------------------------------------------------------------------------------------------

fn valid_requests() -> Vec<Vec<u8>> {
    vec![
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        b"GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n"
            .to_vec(),
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        b"HEAD /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n".to_vec(),
        b"POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\nhello world"
            .to_vec(),
        b"POST /f HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=\"y\"\r\nhello\r\n6\r\n world\r\n0\r\nT: v\r\n\r\n"
            .to_vec(),
        b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        b"GET http://h/p?q HTTP/1.1\r\nHost: h\r\nX-Empty:\r\nX-Ws: \t v \t\r\n\r\n".to_vec(),
        b"\r\nPRI /not-h2 HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        b"PUT /caf%C3%A9 HTTP/1.1\r\nHost: a\r\nX-Obs: \xc3\xa9\r\nContent-Length: 3\r\n\r\nabc".to_vec(),
    ]
}

#[test]
fn every_valid_request_split_at_every_byte_parses_the_same() {
    for full in valid_requests() {
        let want = ok(&full);
        for k in 0..=full.len() {
            let got = parse(&full[..k]).unwrap_or_else(|e| {
                panic!("prefix of {k} bytes of {:?} refused: {e:?}", show(&full))
            });
            match got {
                None => assert!(
                    k < want.head_len,
                    "Partial at {k} >= head_len {}",
                    want.head_len
                ),
                Some(h) => {
                    assert!(
                        k >= want.head_len,
                        "complete at {k} < head_len {}",
                        want.head_len
                    );
                    assert_eq!(h, want, "split at {k}");
                }
            }
        }
    }
}

#[test]
fn every_valid_body_fed_one_byte_at_a_time_decodes_the_same() {
    for full in valid_requests() {
        let h = ok(&full);
        let body = &full[h.head_len..];
        let mut whole = BodyDecoder::new(h.body, 1 << 20);
        let (a, ac) = decode_all(&mut whole, body).unwrap();
        let mut slow = BodyDecoder::new(h.body, 1 << 20);
        let (b, bc) = decode_bytewise(&mut slow, body).unwrap();
        assert_eq!((&a, ac), (&b, bc));
        assert_eq!(
            ac,
            body.len(),
            "these bodies end exactly at the end of the input"
        );
        match h.body {
            BodyKind::None => assert!(a.is_empty()),
            BodyKind::Length(n) => assert_eq!(a.len() as u64, n),
            BodyKind::Chunked => assert_eq!(a, b"hello world"),
        }
    }
}

/// The verdict on bad input must not depend on how the bytes were segmented: every prefix of a
/// bad request is either Partial or already the same error (never a different status).
#[test]
fn every_bad_request_prefix_is_partial_or_the_same_error() {
    let bad: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.2\r\nHost: a\r\n\r\n".to_vec(),
        b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n".to_vec(),
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\0\r\n\r\n".to_vec(),
        b"GET / HTTP/1.1\nHost: a\r\n\r\n".to_vec(),
        b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        b"GET /\r\n\r\n".to_vec(),
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec(),
        with_n_headers(101),
        head_of_len(3000),
    ];
    // A small head limit keeps this quadratic loop fast; the 431 case works the same at 32 KiB.
    let limits = Limits {
        max_head: 2048,
        ..Limits::default()
    };
    for full in bad {
        let want = parse_with(&full, &limits).expect_err("bad request accepted");
        for k in 0..full.len() {
            match parse_with(&full[..k], &limits) {
                Ok(None) => {}
                Ok(Some(h)) => panic!("prefix {k} of {:?} accepted: {h:?}", show(&full)),
                Err(e) => assert_eq!(e, want, "prefix {k} of {:?}", show(&full)),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[test]
fn every_error_has_a_status_message_name_and_reason_phrase() {
    let mut names = std::collections::HashSet::new();
    for (i, e) in RequestError::ALL.iter().enumerate() {
        assert_eq!(e.index(), i);
        assert!([400, 413, 417, 431, 505].contains(&e.status()), "{e:?}");
        assert!(!reason_phrase(e.status()).is_empty());
        assert!(e.message().ends_with('\n') && e.message().len() > 1);
        assert!(names.insert(e.name()), "duplicate name {}", e.name());
        assert_eq!(
            e.to_string(),
            format!("{} {}", e.status(), e.message().trim_end())
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Response heads
// ---------------------------------------------------------------------------------------------

const DATE: &[u8] = b"Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n";

fn write(head: ResponseHead<'_>) -> String {
    let mut out = Vec::new();
    head.write_to(&mut out);
    String::from_utf8(out).unwrap()
}

fn head(status: u16) -> ResponseHead<'static> {
    ResponseHead {
        status,
        date_line: DATE,
        headers: b"",
        content_length: None,
        chunked: false,
        connection: ConnectionHeader::Persistent,
    }
}

#[test]
fn date_line_is_what_response_heads_expect() {
    assert_eq!(&format_date_line(784_111_777)[..], DATE);
}

#[test]
fn response_200_with_content_length() {
    let h = ResponseHead {
        headers: b"Content-Type: text/plain\r\n",
        content_length: Some(5),
        ..head(200)
    };
    assert_eq!(
        write(h),
        "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: tern\r\n\
         Content-Type: text/plain\r\nContent-Length: 5\r\n\r\n"
    );
    let h = ResponseHead {
        content_length: Some(u64::MAX),
        ..head(200)
    };
    assert!(write(h).contains("\r\nContent-Length: 18446744073709551615\r\n\r\n"));
    let h = ResponseHead {
        content_length: Some(0),
        ..head(200)
    };
    assert!(write(h).ends_with("\r\nContent-Length: 0\r\n\r\n"));
}

#[test]
fn response_304_without_content_length() {
    let h = ResponseHead {
        headers: b"ETag: \"abc\"\r\n",
        ..head(304)
    };
    assert_eq!(
        write(h),
        "HTTP/1.1 304 Not Modified\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: tern\r\n\
         ETag: \"abc\"\r\n\r\n"
    );
}

#[test]
fn response_with_connection_close() {
    let h = ResponseHead {
        content_length: Some(12),
        connection: ConnectionHeader::Close,
        ..head(400)
    };
    assert_eq!(
        write(h),
        "HTTP/1.1 400 Bad Request\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: tern\r\n\
         Content-Length: 12\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn response_for_http10_keep_alive() {
    let h = ResponseHead {
        content_length: Some(2),
        connection: ConnectionHeader::KeepAlive,
        ..head(200)
    };
    assert_eq!(
        write(h),
        "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: tern\r\n\
         Content-Length: 2\r\nConnection: keep-alive\r\n\r\n"
    );
}

#[test]
fn response_chunked() {
    let h = ResponseHead {
        chunked: true,
        ..head(200)
    };
    assert_eq!(
        write(h),
        "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: tern\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
}

#[test]
fn response_appends_to_the_buffer() {
    let mut out = b"previous".to_vec();
    head(204).write_to(&mut out);
    assert!(out.starts_with(b"previousHTTP/1.1 204 No Content\r\n"));
}

#[test]
fn continue_100_is_exact() {
    assert_eq!(CONTINUE_100, b"HTTP/1.1 100 Continue\r\n\r\n");
}

#[test]
fn known_status_lines_use_their_reason_phrase() {
    for (code, line) in [
        (200, "HTTP/1.1 200 OK\r\n"),
        (206, "HTTP/1.1 206 Partial Content\r\n"),
        (413, "HTTP/1.1 413 Content Too Large\r\n"),
        (417, "HTTP/1.1 417 Expectation Failed\r\n"),
        (431, "HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        (503, "HTTP/1.1 503 Service Unavailable\r\n"),
        (505, "HTTP/1.1 505 HTTP Version Not Supported\r\n"),
    ] {
        assert!(write(head(code)).starts_with(line), "{code}");
    }
}

#[test]
fn unknown_status_codes_get_a_valid_status_line() {
    assert!(write(head(299)).starts_with("HTTP/1.1 299 \r\nDate: "));
    assert!(write(head(599)).starts_with("HTTP/1.1 599 \r\nDate: "));
    // Every status a handler can produce parses as a valid response with that code.
    for code in 100..=999u16 {
        let text = write(ResponseHead {
            content_length: Some(0),
            ..head(code)
        });
        let mut hs = [httparse::EMPTY_HEADER; 8];
        let mut resp = httparse::Response::new(&mut hs);
        let status = resp
            .parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("{code}: {e:?}"));
        assert!(status.is_complete(), "{code}");
        assert_eq!(resp.code, Some(code));
        assert_eq!(resp.reason, Some(reason_phrase(code)));
        assert_eq!(resp.version, Some(1));
    }
}

#[test]
fn out_of_range_status_codes_still_produce_a_valid_status_line() {
    // status-code is exactly 3 digits (RFC 9112 §4). A handler bug must not put a malformed
    // status line on the wire; it is answered as a 500.
    for code in [0u16, 1, 42, 99, 1000, u16::MAX] {
        assert!(
            write(head(code)).starts_with("HTTP/1.1 500 Internal Server Error\r\n"),
            "{code}"
        );
    }
}

/// The seams review: a path two components could read differently is refused at the codec,
/// so no route, guard or upstream ever sees it; the others reach handlers canonical.
#[test]
fn paths_reach_handlers_canonical_or_not_at_all() {
    for (target, want) in [
        ("/%61dmin/x", "/admin/x"),
        ("//admin/x", "/admin/x"),
        ("/./admin/x", "/admin/x"),
        ("/public/../admin/x", "/admin/x"),
        ("/public/%2e%2e/admin/x", "/admin/x"),
        ("/.well-known/%2e%2e/secret", "/secret"),
        ("http://h/a/../b?q=1", "/b"),
    ] {
        let h = ok(&req(&format!("GET {target} HTTP/1.1"), &["Host: h"]));
        assert_eq!(h.path, want, "{target}");
    }
    for target in [
        "/admin%2Fx",
        "/public%2F..%2Fadmin",
        "/.well-known/..%2Fsecret",
        "/robots.txt%2F..%2Fsecret",
        "/../etc/passwd",
        "/%2e%2e/x",
        "/admin%00.png",
        "/admin%5Cx",
        "/admin\\x",
        "/admin;x",
        "/%2561dmin",
        "/a%zz",
    ] {
        rejects(
            &req(&format!("GET {target} HTTP/1.1"), &["Host: h"]),
            RequestError::BadPath,
            400,
        );
    }
}
