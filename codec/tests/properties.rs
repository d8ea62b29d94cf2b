//! Property tests: the parser never panics and its verdict does not depend on how the bytes are
//! segmented; bodies of either framing decode back to their payload under any fragmentation.

use std::mem::MaybeUninit;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use tern_codec::{
    parse_request, BodyDecoder, BodyKind, ConnectionHeader, Limits, Parsed, RequestError,
    ResponseHead, Version, MAX_HEADERS_DEFAULT,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// What a parse says, owned, so that two parses can be compared.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Partial,
    Error(RequestError),
    Complete {
        head_len: usize,
        target: String,
        path: String,
        query: Option<String>,
        version: Version,
        body: BodyKind,
        keep_alive: bool,
        expect_continue: bool,
        headers: Vec<(String, Vec<u8>)>,
    },
}

fn verdict(buf: &[u8], limits: &Limits) -> Verdict {
    let mut scratch = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
    match parse_request(buf, &mut scratch, limits) {
        Err(e) => Verdict::Error(e),
        Ok(Parsed::Partial) => Verdict::Partial,
        Ok(Parsed::Complete(h)) => {
            // Invariants every accepted head satisfies, whatever the input.
            assert!(h.head_len > 0 && h.head_len <= buf.len() && h.head_len <= limits.max_head);
            let head = &buf[..h.head_len];
            assert!(head.ends_with(b"\r\n\r\n"), "head must end with CRLF CRLF");
            for (i, &b) in head.iter().enumerate() {
                assert_ne!(b, 0, "NUL in an accepted head");
                if b == b'\n' {
                    assert!(i > 0 && head[i - 1] == b'\r', "bare LF in an accepted head");
                }
                if b == b'\r' {
                    assert_eq!(head.get(i + 1), Some(&b'\n'), "bare CR in an accepted head");
                }
            }
            for x in h.headers {
                assert!(!x.value.iter().any(|b| matches!(b, 0 | b'\r' | b'\n')));
                assert!(!x.name.is_empty());
            }
            assert!(
                h.path.starts_with('/') || h.path == "*" || h.method == tern_codec::Method::Connect
            );
            assert!(!h.target.contains('#'));
            if h.version == Version::Http11 {
                assert_eq!(h.header_all("host").count(), 1);
            }
            if let BodyKind::Length(n) = h.body {
                assert!(n > 0 && n <= limits.max_body);
            }
            assert!(!h.expect_continue || h.body != BodyKind::None);
            Verdict::Complete {
                head_len: h.head_len,
                target: h.target.to_owned(),
                path: h.path.to_string(),
                query: h.query.map(str::to_owned),
                version: h.version,
                body: h.body,
                keep_alive: h.keep_alive,
                expect_continue: h.expect_continue,
                headers: h
                    .headers
                    .iter()
                    .map(|x| (x.name.to_owned(), x.value.to_vec()))
                    .collect(),
            }
        }
    }
}

/// The segmentation invariant: what the parser says about a prefix of `buf` is either "need
/// more" or already the final verdict on `buf`.
fn check_prefixes(buf: &[u8], limits: &Limits) -> Result<(), TestCaseError> {
    let full = verdict(buf, limits);
    for k in 0..buf.len() {
        let v = verdict(&buf[..k], limits);
        match (&full, &v) {
            (_, Verdict::Partial) => {
                if let Verdict::Complete { head_len, .. } = full {
                    prop_assert!(
                        k < head_len,
                        "Partial at {} although the head ends at {}",
                        k,
                        head_len
                    );
                }
            }
            (Verdict::Complete { head_len, .. }, _) => {
                prop_assert!(k >= *head_len, "prefix {} not Partial: {:?}", k, v);
                prop_assert_eq!(&v, &full, "prefix {}", k);
            }
            (Verdict::Error(want), Verdict::Error(got)) => {
                // The status on the wire never depends on segmentation. Among the 400 variants
                // (and so the message text) it may: httparse does not say where it failed, so
                // e.g. `\rGET \n` is "bare LF" whole but "bad request line" as `\rG`.
                prop_assert_eq!(
                    got.status(),
                    want.status(),
                    "prefix {}: {:?} vs {:?}",
                    k,
                    got,
                    want
                );
                if want.status() != 400 {
                    prop_assert_eq!(got, want, "prefix {}", k);
                }
            }
            _ => prop_assert!(
                false,
                "prefix {} gives {:?} but the whole gives {:?}",
                k,
                v,
                full
            ),
        }
    }
    Ok(())
}

/// Splits `wire` at the given cut points (any order, duplicates fine).
fn fragments<'a>(wire: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
    at.push(0);
    at.push(wire.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| &wire[w[0]..w[1]]).collect()
}

/// Feeds fragments to a body decoder the way a connection would: unconsumed bytes stay buffered
/// and are offered again with the next fragment. Returns the payload and the number of wire
/// bytes the body took once the decoder says it is done, or `Ok(None)` if the input ran out
/// first.
type Outcome = Result<Option<(Vec<u8>, usize)>, RequestError>;

fn decode_fragmented(kind: BodyKind, max_body: u64, frags: &[&[u8]]) -> Outcome {
    let mut dec = BodyDecoder::new(kind, max_body);
    let mut pending: Vec<u8> = Vec::new();
    let mut payload = Vec::new();
    let mut used = 0;
    if dec.is_done() {
        return Ok(Some((payload, 0)));
    }
    for frag in frags {
        pending.extend_from_slice(frag);
        while !pending.is_empty() {
            let step = dec.decode(&pending)?;
            payload.extend_from_slice(step.data);
            let (consumed, done) = (step.consumed, step.done);
            used += consumed;
            pending.drain(..consumed);
            if done {
                assert!(dec.is_done());
                return Ok(Some((payload, used)));
            }
            assert!(
                consumed > 0,
                "no progress on {} buffered bytes",
                pending.len()
            );
        }
    }
    Ok(None)
}

/// [`decode_fragmented`] for input that must hold a whole, valid body.
fn decode_ok(kind: BodyKind, max_body: u64, frags: &[&[u8]]) -> (Vec<u8>, usize) {
    match decode_fragmented(kind, max_body, frags) {
        Ok(Some(done)) => done,
        other => panic!("body did not decode: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Byte strings built from pieces of HTTP, so that random inputs reach deep parser states.
fn http_soup() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        4 => prop::sample::select(vec![
            &b"GET "[..], b"POST ", b"OPTIONS ", b"CONNECT ", b"PRI * HTTP/2.0\r\n",
            b"/", b"/a?b=c", b"*", b"http://h/p?q", b"h:443", b"#", b"?",
            b" HTTP/1.1", b" HTTP/1.0", b" HTTP/1.2", b" HTTP/2", b"HTTP/",
            b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r", b" ", b"\t", b"\0", b":", b",", b";",
            b"Host: a", b"Host:", b"Content-Length: 5", b"Content-Length: 0",
            b"Content-Length: 5, 5", b"Content-Length: 6", b"Content-Length: 99999999999",
            b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip",
            b"Connection: close", b"Connection: keep-alive", b"Expect: 100-continue",
            b"Expect: nope", b"X-A: b", b"\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n",
        ]).prop_map(<[u8]>::to_vec),
        1 => vec(any::<u8>(), 0..4),
    ];
    vec(piece, 0..40).prop_map(|v| v.concat())
}

/// A well-formed request head (with its body, if any), plus the payload the body carries.
fn valid_request() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let method = prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "X-CUSTOM"]);
    let target = prop_oneof![
        // Paths that have a canonical form (segments never start with a dot, escapes are
        // whole); codec/src/path.rs tests the ones that do not.
        "/([a-z0-9_-][a-z0-9._-]{0,6}(%20)?/?){0,3}(\\?[a-z0-9=&%]{0,10})?",
        "http://[a-z]{1,8}(:[0-9]{1,4})?(/[a-z0-9]{0,8}){0,3}(\\?[a-z=&]{0,8})?",
    ];
    let extra = vec(
        (
            "[A-Za-z][A-Za-z0-9-]{0,15}",
            "[ -~\\t\u{80}-\u{ff}]{0,30}".prop_map(|s| s.trim_matches([' ', '\t']).to_owned()),
        ),
        0..8,
    );
    let framing = 0..3u8;
    let payload = vec(any::<u8>(), 0..200);
    let conn = prop::sample::select(vec!["", "close", "keep-alive", "foo, close"]);
    (
        method,
        target,
        prop::bool::ANY,
        extra,
        framing,
        payload,
        conn,
    )
        .prop_map(|(method, target, http10, extra, framing, payload, conn)| {
            let mut s = format!(
                "{method} {target} HTTP/1.{}\r\n",
                if http10 { 0 } else { 1 }
            );
            s.push_str("Host: example.com\r\n");
            for (name, value) in &extra {
                // Keep the headers that would change framing or validity out of this generator.
                let lower = name.to_ascii_lowercase();
                if [
                    "host",
                    "content-length",
                    "transfer-encoding",
                    "expect",
                    "connection",
                ]
                .contains(&lower.as_str())
                {
                    continue;
                }
                s.push_str(&format!("{name}: {value}\r\n"));
            }
            if !conn.is_empty() {
                s.push_str(&format!("Connection: {conn}\r\n"));
            }
            let mut wire = Vec::new();
            let body = match (framing, http10) {
                (1, _) => {
                    s.push_str(&format!("Content-Length: {}\r\n\r\n", payload.len()));
                    wire.extend_from_slice(s.as_bytes());
                    wire.extend_from_slice(&payload);
                    payload
                }
                (2, false) => {
                    s.push_str("Transfer-Encoding: chunked\r\n\r\n");
                    wire.extend_from_slice(s.as_bytes());
                    for c in payload.chunks(37) {
                        wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                        wire.extend_from_slice(c);
                        wire.extend_from_slice(b"\r\n");
                    }
                    wire.extend_from_slice(b"0\r\n\r\n");
                    payload
                }
                _ => {
                    s.push_str("\r\n");
                    wire.extend_from_slice(s.as_bytes());
                    Vec::new()
                }
            };
            (wire, body)
        })
}

/// A chunk extension (`;name`, `;name=token` or `;name="quoted"`) with optional whitespace.
fn chunk_ext() -> impl Strategy<Value = String> {
    let name = "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,8}";
    let value = prop_oneof![
        Just(String::new()),
        "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,8}".prop_map(|t| format!("={t}")),
        "[ -~\t]{0,12}".prop_map(|q| {
            let escaped = q.replace('\\', "\\\\").replace('"', "\\\"");
            format!("=\"{escaped}\"")
        }),
    ];
    let ws = prop::sample::select(vec!["", " ", "\t", "  "]);
    (ws.clone(), ws, name, value).prop_map(|(a, b, n, v)| format!("{a};{b}{n}{v}"))
}

/// Chunked encoding of `payload` with random chunk boundaries, extensions, hex case, leading
/// zeros and trailers.
fn chunked_wire() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let payload = vec(any::<u8>(), 0..3000);
    let sizes = vec(1usize..700, 1..12);
    let style = vec((prop::bool::ANY, 0usize..3, vec(chunk_ext(), 0..3)), 1..16);
    let trailers = vec(("[A-Za-z][A-Za-z0-9-]{0,10}", "[ -~\t]{0,20}"), 0..3);
    (payload, sizes, style, trailers).prop_map(|(payload, sizes, style, trailers)| {
        let mut wire = Vec::new();
        let mut rest = &payload[..];
        let mut i = 0;
        loop {
            let (upper, zeros, exts) = &style[i % style.len()];
            let n = if rest.is_empty() {
                0
            } else {
                sizes[i % sizes.len()].min(rest.len())
            };
            let hex = if *upper {
                format!("{n:X}")
            } else {
                format!("{n:x}")
            };
            wire.extend_from_slice("0".repeat(*zeros).as_bytes());
            wire.extend_from_slice(hex.as_bytes());
            for e in exts {
                wire.extend_from_slice(e.as_bytes());
            }
            wire.extend_from_slice(b"\r\n");
            if n == 0 {
                break;
            }
            wire.extend_from_slice(&rest[..n]);
            wire.extend_from_slice(b"\r\n");
            rest = &rest[n..];
            i += 1;
        }
        for (name, value) in trailers {
            wire.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        (wire, payload)
    })
}

const NEXT_REQUEST: &[u8] = b"GET /next HTTP/1.1\r\n";

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parse_request_never_panics_on_arbitrary_bytes(buf in vec(any::<u8>(), 0..512)) {
        // `verdict` asserts the invariants of every complete head.
        let _ = verdict(&buf, &Limits::default());
    }

    #[test]
    fn parse_request_never_panics_on_http_soup(buf in http_soup()) {
        let _ = verdict(&buf, &Limits::default());
    }

    #[test]
    fn parse_verdict_does_not_depend_on_segmentation(
        buf in http_soup(),
        max_head in prop_oneof![Just(32 * 1024), 8usize..200],
        max_headers in prop_oneof![Just(100), 0usize..4],
    ) {
        let limits = Limits { max_head, max_headers, max_body: 1 << 20, allow_encoded_slash: false };
        check_prefixes(&buf, &limits)?;
    }

    #[test]
    fn valid_requests_parse_and_their_bodies_decode_under_any_fragmentation(
        (wire, payload) in valid_request(),
        cuts in vec(any::<Index>(), 0..12),
    ) {
        let limits = Limits::default();
        check_prefixes(&wire, &limits)?;
        let Verdict::Complete { head_len, body, .. } = verdict(&wire, &limits) else {
            panic!("valid request refused: {:?}", verdict(&wire, &limits));
        };
        let mut all = wire.clone();
        all.extend_from_slice(NEXT_REQUEST);
        let frags = fragments(&all[head_len..], &cuts);
        let (got, used) = decode_ok(body, limits.max_body, &frags);
        prop_assert_eq!(got, payload);
        prop_assert_eq!(used, wire.len() - head_len);
    }

    #[test]
    fn chunked_bodies_decode_back_under_any_fragmentation(
        (wire, payload) in chunked_wire(),
        cuts in vec(any::<Index>(), 0..40),
    ) {
        let mut all = wire.clone();
        all.extend_from_slice(NEXT_REQUEST);
        let frags = fragments(&all, &cuts);
        let (got, used) = decode_ok(BodyKind::Chunked, u64::MAX, &frags);
        prop_assert_eq!(&got, &payload);
        prop_assert_eq!(used, wire.len(), "must stop exactly at the end of the body");

        // One byte at a time.
        let bytes: Vec<&[u8]> = all.chunks(1).collect();
        let (got, used) = decode_ok(BodyKind::Chunked, u64::MAX, &bytes);
        prop_assert_eq!((&got, used), (&payload, wire.len()));

        // The body limit: exactly the payload fits, one byte less is 413 however it arrives.
        let (got, _) = decode_ok(BodyKind::Chunked, payload.len() as u64, &frags);
        prop_assert_eq!(&got, &payload);
        if !payload.is_empty() {
            let e = decode_fragmented(BodyKind::Chunked, payload.len() as u64 - 1, &frags)
                .unwrap_err();
            prop_assert_eq!(e, RequestError::BodyTooLarge);
        }
    }

    #[test]
    fn corrupted_chunked_bodies_fail_the_same_under_any_fragmentation(
        (wire, _) in chunked_wire(),
        at in any::<Index>(),
        byte in any::<u8>(),
        cuts in vec(any::<Index>(), 0..20),
    ) {
        // Changing one byte may still leave a valid body; whatever the outcome, it must not
        // depend on how the bytes arrive.
        let mut bad = wire.clone();
        bad[at.index(wire.len())] = byte;
        bad.extend_from_slice(NEXT_REQUEST);
        let whole = decode_fragmented(BodyKind::Chunked, u64::MAX, &[&bad]);
        let split = decode_fragmented(BodyKind::Chunked, u64::MAX, &fragments(&bad, &cuts));
        prop_assert_eq!(whole, split);
    }

    #[test]
    fn content_length_bodies_decode_back_under_any_fragmentation(
        payload in vec(any::<u8>(), 0..3000),
        cuts in vec(any::<Index>(), 0..40),
    ) {
        let mut all = payload.clone();
        all.extend_from_slice(NEXT_REQUEST);
        let kind = BodyKind::Length(payload.len() as u64);
        let (got, used) = decode_ok(kind, 0, &fragments(&all, &cuts));
        prop_assert_eq!(&got, &payload);
        prop_assert_eq!(used, payload.len());
        let bytes: Vec<&[u8]> = all.chunks(1).collect();
        let (got, used) = decode_ok(kind, 0, &bytes);
        prop_assert_eq!((&got, used), (&payload, payload.len()));
    }

    #[test]
    fn header_values_with_nul_cr_or_lf_never_reach_a_handler(
        name in "[A-Za-z][A-Za-z0-9-]{0,10}",
        value in vec(prop_oneof![Just(0u8), Just(b'\r'), Just(b'\n'), any::<u8>()], 0..20),
    ) {
        let mut buf = b"GET / HTTP/1.1\r\nHost: a\r\nX-".to_vec();
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(b": ");
        buf.extend_from_slice(&value);
        buf.extend_from_slice(b"\r\n\r\n");
        // `verdict` checks that no accepted value or head contains NUL, bare CR or bare LF.
        let v = verdict(&buf, &Limits::default());
        if value.contains(&0) {
            let nul_in_head = match &v {
                Verdict::Complete { head_len, .. } => buf[..*head_len].contains(&0),
                _ => false,
            };
            prop_assert!(!nul_in_head);
        }
        let plain = !value.iter().any(|b| matches!(b, 0..=8 | 10..=31 | 127));
        if plain {
            let Verdict::Complete { headers, .. } = v else {
                panic!("plain value refused: {:?}", v);
            };
            let trimmed: &[u8] = {
                let s = value.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(value.len());
                let e = value.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(s, |e| e + 1);
                &value[s..e]
            };
            prop_assert_eq!(&headers[1].1[..], trimmed);
        }
    }

    #[test]
    fn response_heads_always_parse_back(
        status in any::<u16>(),
        content_length in proptest::option::of(any::<u64>()),
        chunked in prop::bool::ANY,
        connection in prop::sample::select(vec![
            ConnectionHeader::Persistent, ConnectionHeader::KeepAlive, ConnectionHeader::Close,
        ]),
    ) {
        let date = tern_codec::format_date_line(1_700_000_000);
        let head = ResponseHead {
            status,
            date_line: &date,
            headers: b"X-A: b\r\n",
            content_length,
            chunked,
            connection,
        };
        let mut out = Vec::new();
        head.write_to(&mut out);
        let mut hs = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut hs);
        let n = resp.parse(&out).unwrap();
        prop_assert_eq!(n, httparse::Status::Complete(out.len()));
        let want = if (100..=999).contains(&status) { status } else { 500 };
        prop_assert_eq!(resp.code, Some(want));
        let cl = resp.headers.iter().find(|h| h.name == "Content-Length").map(|h| h.value);
        prop_assert_eq!(cl.map(|v| std::str::from_utf8(v).unwrap().parse::<u64>().unwrap()), content_length);
    }
}
