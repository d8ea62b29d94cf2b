//! h3spec's cases (kazu-yamamoto/h3spec, not runnable here) and the rest of RFC 9114 / 9204's
//! rules, each with the error code the RFC names; and round trips of the QPACK code.

use proptest::prelude::*;
use tern_codec::{Limits, RequestError};

use crate::frame::{self, kind, setting};
use crate::qpack;
use crate::varint;
use crate::{Config, ConnError, Connection, ErrorCode, Event};

const CONTROL: u64 = 2;
const ENCODER: u64 = 6;
const DECODER: u64 = 10;

fn frame_bytes(k: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    frame::write_header(&mut v, k, payload.len() as u64);
    v.extend_from_slice(payload);
    v
}

/// A field section from our own encoder (static table and literals).
fn section(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut s = Vec::new();
    qpack::begin_section(&mut s);
    for (n, v) in fields {
        qpack::encode_field(n.as_bytes(), v.as_bytes(), false, &mut s);
    }
    s
}

fn headers(fields: &[(&str, &str)]) -> Vec<u8> {
    frame_bytes(kind::HEADERS, &section(fields))
}

const GET: [(&str, &str); 4] = [
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/index.html?x=1"),
    (":authority", "example.org"),
];

/// The client's control stream: its type and an empty SETTINGS.
fn client_control() -> Vec<u8> {
    let mut v = vec![0x00];
    frame::write_settings(&mut v, &[(setting::MAX_FIELD_SECTION_SIZE, 16384)]);
    v
}

fn conn() -> Connection {
    conn_with(Config::default())
}

fn conn_with(cfg: Config) -> Connection {
    let mut control = Vec::new();
    Connection::new(cfg, &mut control)
}

fn events(c: &mut Connection) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// Feeds `data` on `stream` and expects a connection error with `code`.
fn expect_conn_error(c: &mut Connection, stream: u64, data: &[u8], fin: bool, code: ErrorCode) {
    match c.recv_stream_data(stream, data, fin) {
        Err(ConnError { code: got, reason }) => assert_eq!(got, code, "{reason}"),
        Ok(()) => panic!("expected {code:?}, got events {:?}", events(c)),
    }
    assert_eq!(c.error().map(|e| e.code), Some(code));
}

fn expect_reset(c: &mut Connection, stream: u64, code: ErrorCode) {
    let evs = events(c);
    assert!(
        evs.iter().any(|e| matches!(e, Event::ResetStream { stream: s, code: got, .. } if *s == stream && *got == code)),
        "expected reset {code:?} of {stream}, got {evs:?}"
    );
}

#[test]
fn settings_come_first_on_our_control_stream() {
    let mut out = Vec::new();
    let _c = Connection::new(Config::default(), &mut out);
    assert_eq!(out[0], 0x00, "control stream type");
    let (k, len, n) = frame::parse_header(&out[1..]).unwrap();
    assert_eq!(k, kind::SETTINGS);
    let mut p = &out[1 + n..1 + n + len as usize];
    let mut got = Vec::new();
    while !p.is_empty() {
        let (id, a) = varint::decode(p).unwrap();
        let (v, b) = varint::decode(&p[a..]).unwrap();
        got.push((id, v));
        p = &p[a + b..];
    }
    assert!(got.contains(&(setting::QPACK_MAX_TABLE_CAPACITY, 0)));
    assert!(got.contains(&(setting::QPACK_BLOCKED_STREAMS, 0)));
    assert!(got.contains(&(setting::MAX_FIELD_SECTION_SIZE, 32 * 1024)));
}

#[test]
fn a_get_becomes_the_same_head_as_http2() {
    let mut c = conn();
    c.recv_stream_data(CONTROL, &client_control(), false)
        .unwrap();
    let mut list = GET.to_vec();
    list.push(("accept-encoding", "gzip"));
    c.recv_stream_data(0, &headers(&list), true).unwrap();
    assert_eq!(
        events(&mut c),
        [Event::Request {
            stream: 0,
            end_stream: true
        }]
    );
    assert_eq!(c.peer_max_field_section(), Some(16384));
    let data = c.take_request(0).unwrap();
    let mut hs = [httparse::EMPTY_HEADER; 16];
    let head = data.head(&mut hs, &Limits::default()).unwrap();
    assert_eq!(head.method, tern_codec::Method::Get);
    assert_eq!(head.path, "/index.html");
    assert_eq!(head.query, Some("x=1"));
    assert_eq!(head.host, Some(&b"example.org"[..]));
    assert_eq!(head.accept_encoding, Some(&b"gzip"[..]));
    assert!(!c.answer_sent(0));
    assert_eq!(c.open_requests(), 0);
}

/// A POST with a body and trailers, as one buffer.
fn post_bytes() -> Vec<u8> {
    let mut v = headers(&[
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/up"),
        (":authority", "example.org"),
        ("content-length", "11"),
    ]);
    v.extend(frame_bytes(kind::DATA, b"hello "));
    v.extend(frame_bytes(0x21, b"reserved frame type: skipped"));
    v.extend(frame_bytes(kind::DATA, b"world"));
    v.extend(headers(&[("x-checksum", "abc")]));
    v
}

/// Drives a connection over `pieces` of the request stream and gathers what came out.
type FieldList = Vec<(Vec<u8>, Vec<u8>)>;

/// A request head's fields, as tests edit them.
type Edit = dyn Fn(&mut Vec<(&'static str, &'static str)>);

fn drive(pieces: &[&[u8]]) -> (Vec<Event>, Vec<u8>, FieldList) {
    let mut c = conn();
    let mut body = Vec::new();
    let mut trailers = Vec::new();
    let mut evs = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        let fin = i + 1 == pieces.len();
        c.recv_stream_data(0, p, fin).unwrap();
        while let Some(e) = c.poll_event() {
            match e {
                Event::Request { stream, .. } => assert!(c.take_request(stream).is_some()),
                Event::Body(s) => {
                    let (chunk, _) = c.body_chunk(s).unwrap();
                    let n = chunk.len();
                    body.extend_from_slice(chunk);
                    c.consume_body(s, n);
                }
                Event::Trailers(s) => trailers = c.take_trailers(s),
                _ => {}
            }
            // Events are compared without how often Body came.
            if !matches!(e, Event::Body(_)) || evs.last() != Some(&e) {
                evs.push(e);
            }
        }
    }
    assert_eq!(c.body_chunk(0).map(|(_, done)| done), Some(true));
    (evs, body, trailers)
}

#[test]
fn a_request_in_one_byte_pieces() {
    let bytes = post_bytes();
    let whole = drive(&[&bytes]);
    let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
    let split = drive(&pieces);
    assert_eq!(whole.1, b"hello world");
    assert_eq!(whole.2, [(b"x-checksum".to_vec(), b"abc".to_vec())]);
    let simplify = |evs: &[Event]| -> Vec<Event> {
        let mut v: Vec<Event> = evs
            .iter()
            .copied()
            .filter(|e| !matches!(e, Event::Body(_)))
            .collect();
        v.dedup();
        v
    };
    assert_eq!(simplify(&whole.0), simplify(&split.0));
    assert_eq!(whole.1, split.1);
    assert_eq!(whole.2, split.2);
    // The control stream in one-byte pieces too.
    let mut c = conn();
    for b in client_control() {
        c.recv_stream_data(CONTROL, &[b], false).unwrap();
    }
    assert_eq!(c.peer_max_field_section(), Some(16384));
}

#[test]
fn data_before_headers() {
    let mut c = conn();
    expect_conn_error(
        &mut c,
        0,
        &frame_bytes(kind::DATA, b"x"),
        false,
        ErrorCode::FrameUnexpected,
    );
}

#[test]
fn data_or_headers_after_trailers() {
    for late in [frame_bytes(kind::DATA, b"x"), headers(&[("a", "b")])] {
        let mut c = conn();
        let mut v = headers(&GET);
        v.extend(headers(&[("x-t", "1")]));
        c.recv_stream_data(0, &v, false).unwrap();
        expect_conn_error(&mut c, 0, &late, false, ErrorCode::FrameUnexpected);
    }
}

#[test]
fn a_second_control_stream() {
    let mut c = conn();
    c.recv_stream_data(CONTROL, &client_control(), false)
        .unwrap();
    expect_conn_error(
        &mut c,
        14,
        &client_control(),
        false,
        ErrorCode::StreamCreation,
    );
    // The same for QPACK streams.
    let mut c = conn();
    c.recv_stream_data(ENCODER, &[0x02], false).unwrap();
    expect_conn_error(&mut c, 14, &[0x02], false, ErrorCode::StreamCreation);
}

#[test]
fn a_closed_control_stream() {
    let mut c = conn();
    c.recv_stream_data(CONTROL, &client_control(), false)
        .unwrap();
    expect_conn_error(&mut c, CONTROL, &[], true, ErrorCode::ClosedCriticalStream);
    let mut c = conn();
    c.recv_stream_data(CONTROL, &client_control(), false)
        .unwrap();
    assert_eq!(
        c.stream_reset(CONTROL).map_err(|e| e.code),
        Err(ErrorCode::ClosedCriticalStream)
    );
    for (id, ty) in [(ENCODER, 0x02), (DECODER, 0x03)] {
        let mut c = conn();
        expect_conn_error(&mut c, id, &[ty], true, ErrorCode::ClosedCriticalStream);
    }
}

#[test]
fn http2_frame_types_are_unexpected_everywhere() {
    for k in [0x02, 0x06, 0x08, 0x09] {
        let mut c = conn();
        let mut v = client_control();
        v.extend(frame_bytes(k, &[0; 4]));
        expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::FrameUnexpected);
        let mut c = conn();
        let mut v = headers(&GET);
        v.extend(frame_bytes(k, &[0; 4]));
        expect_conn_error(&mut c, 0, &v, false, ErrorCode::FrameUnexpected);
        let mut c = conn();
        expect_conn_error(
            &mut c,
            0,
            &frame_bytes(k, &[]),
            false,
            ErrorCode::FrameUnexpected,
        );
    }
}

#[test]
fn control_frames_on_a_request_stream_and_request_frames_on_the_control_stream() {
    for k in [
        kind::SETTINGS,
        kind::GOAWAY,
        kind::MAX_PUSH_ID,
        kind::CANCEL_PUSH,
        kind::PUSH_PROMISE,
    ] {
        let mut c = conn();
        let mut v = headers(&GET);
        v.extend(frame_bytes(k, &[0]));
        expect_conn_error(&mut c, 0, &v, false, ErrorCode::FrameUnexpected);
    }
    for k in [kind::DATA, kind::HEADERS, kind::PUSH_PROMISE] {
        let mut c = conn();
        let mut v = client_control();
        v.extend(frame_bytes(k, &[0, 0]));
        expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::FrameUnexpected);
    }
}

#[test]
fn settings_twice_or_not_first_or_bad() {
    let mut c = conn();
    let mut v = client_control();
    v.extend(frame_bytes(kind::SETTINGS, &[]));
    expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::FrameUnexpected);

    for first in [frame_bytes(kind::GOAWAY, &[0]), frame_bytes(0x21, &[])] {
        let mut c = conn();
        let mut v = vec![0x00];
        v.extend(first);
        expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::MissingSettings);
    }

    let bad_settings: [&[u8]; 4] = [
        &[0x02, 0x00],             // HTTP/2's ENABLE_PUSH
        &[0x06, 0x01, 0x06, 0x02], // repeated
        &[0x08, 0x02],             // ENABLE_CONNECT_PROTOCOL = 2
        &[0x00, 0x00],             // reserved 0x00
    ];
    for payload in bad_settings {
        let mut c = conn();
        let mut v = vec![0x00];
        v.extend(frame_bytes(kind::SETTINGS, payload));
        expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::Settings);
    }
    let mut c = conn();
    let mut v = vec![0x00];
    v.extend(frame_bytes(kind::SETTINGS, &[0x06]));
    expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::Frame);
    // Unknown (GREASE) settings are fine.
    let mut c = conn();
    let mut v = vec![0x00];
    v.extend(frame_bytes(kind::SETTINGS, &[0x40, 0x21, 0x07]));
    c.recv_stream_data(CONTROL, &v, false).unwrap();
}

#[test]
fn bad_qpack() {
    let mut huffman_eos = vec![0x00, 0x00, 0x5f, 0x1d, 0x84];
    huffman_eos.extend([0xff, 0xff, 0xff, 0xff]); // :path = Huffman with EOS inside
    let cases: [Vec<u8>; 7] = [
        vec![0x01, 0x00, 0xd1],             // Required Insert Count 1
        vec![0x00, 0x00, 0x80],             // indexed, dynamic table
        vec![0x00, 0x00, 0x10],             // indexed post-base
        vec![0x00, 0x00, 0x40, 0x00],       // literal with dynamic name reference
        vec![0x00, 0x00, 0xff, 0x7f],       // static index 63 + 127: out of the table
        vec![0x00, 0x00, 0x51, 0x05, b'/'], // value longer than the section
        huffman_eos,
    ];
    for block in cases {
        let mut c = conn();
        let v = frame_bytes(kind::HEADERS, &block);
        expect_conn_error(&mut c, 0, &v, false, ErrorCode::QpackDecompressionFailed);
    }
    // A truncated prefix.
    let mut c = conn();
    expect_conn_error(
        &mut c,
        0,
        &frame_bytes(kind::HEADERS, &[0x00]),
        false,
        ErrorCode::QpackDecompressionFailed,
    );
}

#[test]
fn qpack_instruction_streams_with_capacity_zero() {
    let mut c = conn();
    c.recv_stream_data(ENCODER, &[0x02, 0x20], false).unwrap(); // capacity 0: fine
    expect_conn_error(
        &mut c,
        ENCODER,
        &[0xc0, 0x01, b'x'],
        false,
        ErrorCode::QpackEncoderStream,
    );
    let mut c = conn();
    expect_conn_error(
        &mut c,
        ENCODER,
        &[0x02, 0x21],
        false,
        ErrorCode::QpackEncoderStream,
    );
    let mut c = conn();
    // Stream Cancellations (short and long ids) are fine.
    c.recv_stream_data(DECODER, &[0x03, 0x44, 0x7f, 0x81], false)
        .unwrap();
    c.recv_stream_data(DECODER, &[0x01], false).unwrap();
    expect_conn_error(
        &mut c,
        DECODER,
        &[0x80],
        false,
        ErrorCode::QpackDecoderStream,
    );
    let mut c = conn();
    expect_conn_error(
        &mut c,
        DECODER,
        &[0x03, 0x01],
        false,
        ErrorCode::QpackDecoderStream,
    );
}

/// A request whose head is `fields` on stream 0; the events it gives.
fn request_events(fields: &[(&str, &str)]) -> Vec<Event> {
    let mut c = conn();
    c.recv_stream_data(0, &headers(fields), true).unwrap();
    events(&mut c)
}

#[test]
fn bad_pseudo_headers_are_message_errors() {
    let with = |edit: &Edit| {
        let mut l = GET.to_vec();
        edit(&mut l);
        request_events(&l)
    };
    let malformed: [&Edit; 11] = [
        &|l| {
            l.remove(2); // no :path
        },
        &|l| l[2] = (":path", "http://other.test/"), // absolute-form
        &|l| l[2] = (":path", "*"),                  // on a GET
        &|l| {
            l.remove(0); // no :method
        },
        &|l| l.push(("Accept", "x")),
        &|l| l.push(("connection", "close")),
        &|l| l.push(("transfer-encoding", "chunked")),
        &|l| l.push(("te", "gzip")),
        &|l| l.push((":path", "/again")),
        &|l| l.insert(0, (":status", "200")),
        &|l| {
            l.remove(3); // neither :authority nor Host
        },
    ];
    for (i, edit) in malformed.iter().enumerate() {
        let evs = with(edit);
        assert!(
            matches!(
                evs[..],
                [Event::ResetStream {
                    stream: 0,
                    code: ErrorCode::Message,
                    ..
                }]
            ),
            "case {i}: {evs:?}"
        );
    }
    // Host instead of :authority is fine.
    let evs = with(&|l| {
        l.remove(3);
        l.push(("host", "example.org"));
    });
    assert!(
        matches!(evs[..], [Event::Request { stream: 0, .. }]),
        "{evs:?}"
    );
}

#[test]
fn authority_and_host_must_agree() {
    let mut c = conn();
    let mut l = GET.to_vec();
    l.push(("host", "admin.internal"));
    c.recv_stream_data(0, &headers(&l), true).unwrap();
    let data = c.take_request(0).unwrap();
    let mut hs = [httparse::EMPTY_HEADER; 16];
    assert_eq!(
        data.head(&mut hs, &Limits::default()).err(),
        Some(RequestError::BadHeader)
    );
}

#[test]
fn incomplete_streams() {
    // FIN before any HEADERS.
    let mut c = conn();
    c.recv_stream_data(0, &[], true).unwrap();
    expect_reset(&mut c, 0, ErrorCode::RequestIncomplete);
    // FIN inside a frame.
    let mut c = conn();
    let v = headers(&GET);
    expect_conn_error(&mut c, 0, &v[..v.len() - 1], true, ErrorCode::Frame);
    // Content-length that the body does not reach.
    let mut c = conn();
    let mut l = GET.to_vec();
    l.push(("content-length", "5"));
    let mut v = headers(&l);
    v.extend(frame_bytes(kind::DATA, b"abc"));
    c.recv_stream_data(0, &v, true).unwrap();
    expect_reset(&mut c, 0, ErrorCode::Message);
}

#[test]
fn push_is_refused_and_unknown_streams_ignored() {
    let mut c = conn();
    expect_conn_error(&mut c, 14, &[0x01, 0x00], false, ErrorCode::StreamCreation);
    let mut c = conn();
    // A reserved (GREASE) stream type 0x21: stopped, its bytes dropped.
    c.recv_stream_data(14, &[0x40, 0x21, 0xde, 0xad], false)
        .unwrap();
    assert_eq!(
        events(&mut c),
        [Event::StopSending {
            stream: 14,
            code: ErrorCode::StreamCreation
        }]
    );
    c.recv_stream_data(14, &[0xff; 100], true).unwrap();
    assert_eq!(c.error(), None);
}

#[test]
fn goaway_from_either_side() {
    let mut c = conn();
    c.recv_stream_data(0, &headers(&GET), false).unwrap();
    c.recv_stream_data(4, &headers(&GET), false).unwrap();
    events(&mut c);
    let mut control = Vec::new();
    c.go_away(&mut control);
    assert_eq!(control, frame_bytes(kind::GOAWAY, &[8]));
    c.recv_stream_data(8, &headers(&GET), true).unwrap();
    expect_reset(&mut c, 8, ErrorCode::RequestRejected);
    assert!(!c.is_finished());
    c.recv_stream_data(0, &[], true).unwrap();
    c.recv_stream_data(4, &[], true).unwrap();
    c.answer_sent(0);
    c.answer_sent(4);
    assert!(c.is_finished());

    // The client's GOAWAY carries a push id that may only go down.
    let mut c = conn();
    let mut v = client_control();
    v.extend(frame_bytes(kind::GOAWAY, &[4]));
    c.recv_stream_data(CONTROL, &v, false).unwrap();
    assert_eq!(events(&mut c), [Event::PeerGoAway]);
    expect_conn_error(
        &mut c,
        CONTROL,
        &frame_bytes(kind::GOAWAY, &[8]),
        false,
        ErrorCode::Id,
    );
    // A GOAWAY whose payload is not one varint.
    let mut c = conn();
    let mut v = client_control();
    v.extend(frame_bytes(kind::GOAWAY, &[4, 4]));
    expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::Frame);
}

#[test]
fn push_ids() {
    let mut c = conn();
    let mut v = client_control();
    v.extend(frame_bytes(kind::MAX_PUSH_ID, &[5]));
    c.recv_stream_data(CONTROL, &v, false).unwrap();
    expect_conn_error(
        &mut c,
        CONTROL,
        &frame_bytes(kind::MAX_PUSH_ID, &[4]),
        false,
        ErrorCode::Id,
    );
    let mut c = conn();
    let mut v = client_control();
    v.extend(frame_bytes(kind::CANCEL_PUSH, &[0]));
    expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::Id);
}

#[test]
fn oversized_heads_and_bodies_are_refused() {
    let cfg = Config {
        max_field_section_size: 200,
        max_body: 10,
        ..Config::default()
    };
    // Decoded over the limit: 431.
    let mut c = conn_with(cfg);
    let big = "x".repeat(150);
    let mut l = GET.to_vec();
    l.push(("x-big", &big));
    c.recv_stream_data(0, &headers(&l), true).unwrap();
    assert_eq!(
        events(&mut c),
        [Event::Refuse {
            stream: 0,
            status: 431
        }]
    );
    // A HEADERS frame too large to buffer: 431 without reading it.
    let mut c = conn_with(cfg);
    let mut v = Vec::new();
    frame::write_header(&mut v, kind::HEADERS, 5000);
    c.recv_stream_data(0, &v, false).unwrap();
    c.recv_stream_data(0, &[0; 5000], true).unwrap();
    assert_eq!(
        events(&mut c),
        [Event::Refuse {
            stream: 0,
            status: 431
        }]
    );
    // A declared body over max_body: 413.
    let cfg = Config {
        max_body: 10,
        ..Config::default()
    };
    // (Judged when the caller gathers the body: a streaming route would take it.)
    let mut c = conn_with(cfg);
    let mut l = GET.to_vec();
    l.push(("content-length", "11"));
    c.recv_stream_data(0, &headers(&l), false).unwrap();
    assert_eq!(
        events(&mut c),
        [Event::Request {
            stream: 0,
            end_stream: false
        }]
    );
    assert!(!c.gather_body(0), "refused");
    assert_eq!(
        events(&mut c),
        [Event::Refuse {
            stream: 0,
            status: 413
        }]
    );
    // An undeclared body past it before the caller chose to gather it: 413, the rest of the
    // frame dropped.
    let mut c = conn_with(cfg);
    let mut v = headers(&GET);
    frame::write_header(&mut v, kind::DATA, 30);
    v.extend([0; 11]);
    c.recv_stream_data(0, &v, false).unwrap();
    events(&mut c);
    assert!(!c.gather_body(0), "refused");
    c.recv_stream_data(0, &[0; 19], true).unwrap();
    assert_eq!(
        events(&mut c),
        [Event::Refuse {
            stream: 0,
            status: 413
        }]
    );
    assert!(!c.answer_sent(0));
    // An undeclared body that grows past it once gathered: reset.
    let mut c = conn_with(cfg);
    c.recv_stream_data(0, &headers(&GET), false).unwrap();
    events(&mut c);
    assert!(c.gather_body(0), "gathered");
    c.recv_stream_data(0, &frame_bytes(kind::DATA, &[0; 11]), false)
        .unwrap();
    expect_reset(&mut c, 0, ErrorCode::ExcessiveLoad);
    // Control frames are bounded.
    let mut c = conn_with(cfg);
    let mut v = vec![0x00];
    frame::write_header(&mut v, kind::SETTINGS, 5000);
    expect_conn_error(&mut c, CONTROL, &v, false, ErrorCode::ExcessiveLoad);
}

#[test]
fn budgets() {
    // Unknown frames: the overhead budget.
    let cfg = Config {
        overhead_budget: 5,
        ..Config::default()
    };
    let mut c = conn_with(cfg);
    let mut v = client_control();
    for _ in 0..5 {
        v.extend(frame_bytes(0x21, b"grease"));
    }
    c.recv_stream_data(CONTROL, &v, false).unwrap();
    expect_conn_error(
        &mut c,
        CONTROL,
        &frame_bytes(0x21, b""),
        false,
        ErrorCode::ExcessiveLoad,
    );
    // Request streams: over the limit, rejected.
    let cfg = Config {
        max_request_streams: 2,
        ..Config::default()
    };
    let mut c = conn_with(cfg);
    for id in [0, 4] {
        c.recv_stream_data(id, &headers(&GET), false).unwrap();
    }
    c.recv_stream_data(8, &headers(&GET), false).unwrap();
    expect_reset(&mut c, 8, ErrorCode::RequestRejected);
    // Rapid reset: resets before the answer spend the budget, completed streams earn it back.
    let cfg = Config {
        reset_budget: 3,
        ..Config::default()
    };
    let mut c = conn_with(cfg);
    let mut result = Ok(());
    for i in 0..5u64 {
        c.recv_stream_data(4 * i, &headers(&GET), false).unwrap();
        result = c.stream_reset(4 * i);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result.map_err(|e| e.code), Err(ErrorCode::ExcessiveLoad));
}

#[test]
fn an_encoded_answer_decodes_back() {
    let mut c = conn();
    let mut out = Vec::new();
    let fields: [(&[u8], &[u8]); 6] = [
        (b"Content-Type", b"text/html; charset=utf-8"),
        (b"content-length", b"1234"),
        (b"server", b"tern"),
        (b"Set-Cookie", b"id=42; Secure"),
        (b"x-custom-header", b"some value"),
        (b"connection", b"close"),
    ];
    c.send_response_head(404, &fields, &mut out);
    c.send_data(b"not here", &mut out);
    let (k, len, n) = frame::parse_header(&out).unwrap();
    assert_eq!(k, kind::HEADERS);
    let block = &out[n..n + len as usize];
    let mut got = Vec::new();
    let mut scratch = Default::default();
    let d = qpack::decode_section(block, usize::MAX, &mut scratch, |n, v| {
        got.push((n.to_vec(), v.to_vec()));
        Ok(())
    })
    .unwrap();
    assert!(!d.too_large && !d.rejected);
    let want: FieldList = [
        (&b":status"[..], &b"404"[..]),
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", b"1234"),
        (b"server", b"tern"),
        (b"set-cookie", b"id=42; Secure"),
        (b"x-custom-header", b"some value"),
    ]
    .iter()
    .map(|(n, v)| (n.to_vec(), v.to_vec()))
    .collect();
    assert_eq!(got, want);
    // Fully indexed fields are one byte each.
    assert_eq!(block[2], 0xc0 | 27, ":status 404 is static entry 27");
    let rest = &out[n + len as usize..];
    assert_eq!(rest, frame_bytes(kind::DATA, b"not here"));
}

#[test]
fn answering_before_the_request_ends_stops_it() {
    let mut c = conn();
    let mut l = GET.to_vec();
    l[0] = (":method", "POST");
    c.recv_stream_data(0, &headers(&l), false).unwrap();
    assert!(c.answer_sent(0), "request still arriving: stop reading");
    // Late body bytes are ignored.
    c.recv_stream_data(0, &frame_bytes(kind::DATA, b"late"), true)
        .unwrap();
    assert_eq!(c.error(), None);
}

fn field_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::sample::select(
            qpack::STATIC
                .iter()
                .map(|e| e.0.to_vec())
                .collect::<Vec<_>>()
        ),
        "[a-z0-9-]{1,20}".prop_map(String::into_bytes),
    ]
}

fn field_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::sample::select(
            qpack::STATIC
                .iter()
                .map(|e| e.1.to_vec())
                .collect::<Vec<_>>()
        ),
        proptest::collection::vec(any::<u8>(), 0..300),
    ]
}

proptest! {
    /// Whatever the encoder writes, the decoder reads back unchanged.
    #[test]
    fn qpack_round_trip(
        fields in proptest::collection::vec((field_name(), field_value(), any::<bool>()), 0..20),
    ) {
        let mut block = Vec::new();
        qpack::begin_section(&mut block);
        for (n, v, sensitive) in &fields {
            qpack::encode_field(n, v, *sensitive, &mut block);
        }
        let mut got = Vec::new();
        let mut scratch = Default::default();
        qpack::decode_section(&block, usize::MAX, &mut scratch, |n, v| {
            got.push((n.to_vec(), v.to_vec()));
            Ok(())
        }).unwrap();
        let want: Vec<_> = fields.iter().map(|(n, v, _)| (n.clone(), v.clone())).collect();
        prop_assert_eq!(got, want);
    }

    /// A request split anywhere gives the same head, body and trailers.
    #[test]
    fn any_split_gives_the_same_request(cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let bytes = post_bytes();
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        at.sort_unstable();
        let mut pieces = Vec::new();
        let mut last = 0;
        for a in at {
            pieces.push(&bytes[last..a]);
            last = a;
        }
        pieces.push(&bytes[last..]);
        let (_, body, trailers) = drive(&pieces);
        prop_assert_eq!(body, b"hello world".to_vec());
        prop_assert_eq!(trailers, vec![(b"x-checksum".to_vec(), b"abc".to_vec())]);
    }
}

/// A streamed body (a proxy route's upload) is not bound by `max_body`: the caller takes it
/// in pieces, and `body_room` tells it how much more to read before it has taken some.
#[test]
fn a_streamed_body_passes_max_body_in_pieces_within_its_room() {
    let cfg = Config {
        max_body: 10,
        streamed_body_buffer: 64,
        ..Config::default()
    };
    let mut c = conn_with(cfg);
    let mut l = vec![
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", "a"),
        (":path", "/up"),
    ];
    l.push(("content-length", "200"));
    c.recv_stream_data(0, &headers(&l), false).unwrap();
    assert_eq!(
        events(&mut c),
        [Event::Request {
            stream: 0,
            end_stream: false
        }]
    );
    assert_eq!(c.body_room(0), usize::MAX, "undecided: not bounded yet");
    let data = c.stream_body(0).expect("the request's fields");
    assert_eq!(data.fields.content_length(), Some(200));
    assert!(c.stream_body(0).is_none(), "taken once");
    assert_eq!(c.body_room(0), 64);
    let mut taken = Vec::new();
    for piece in [[1u8; 50], [2; 50], [3; 50], [4; 50]] {
        c.recv_stream_data(0, &frame_bytes(kind::DATA, &piece), false)
            .unwrap();
        assert_eq!(c.body_room(0), 14, "50 of 64 held");
        let (chunk, done) = c.body_chunk(0).unwrap();
        assert!(!done);
        taken.extend_from_slice(chunk);
        let n = chunk.len();
        c.consume_body(0, n);
        assert_eq!(c.body_room(0), 64);
    }
    c.recv_stream_data(0, &[], true).unwrap();
    assert_eq!(c.body_chunk(0), Some((&[][..], true)));
    assert_eq!(taken.len(), 200);
    assert!(events(&mut c).iter().all(|e| matches!(e, Event::Body(0))));
    // The declared length still binds a streamed body.
    let mut c = conn_with(cfg);
    c.recv_stream_data(0, &headers(&l), false).unwrap();
    events(&mut c);
    c.stream_body(0).unwrap();
    c.recv_stream_data(0, &frame_bytes(kind::DATA, &[0; 201]), false)
        .unwrap();
    expect_reset(&mut c, 0, ErrorCode::Message);
}
