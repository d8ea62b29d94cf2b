//! Session tests on byte slices: a scripted client writes frames, the session answers.

use crate::frame::{self, flag, kind, setting, ErrorCode, FrameHeader, HEADER_LEN, PREFACE};
use crate::session::{Config, Event, Session};

/// A header block of literal fields without indexing (RFC 7541 §6.2.2), no Huffman: enough to
/// drive the session without depending on our own encoder.
fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        b.push(0x00);
        push_str(&mut b, n.as_bytes());
        push_str(&mut b, v.as_bytes());
    }
    b
}

fn push_str(b: &mut Vec<u8>, s: &[u8]) {
    // 7-bit prefix integer.
    let mut n = s.len();
    if n < 127 {
        b.push(n as u8);
    } else {
        b.push(127);
        n -= 127;
        while n >= 128 {
            b.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        b.push(n as u8);
    }
    b.extend_from_slice(s);
}

const GET: [(&str, &str); 4] = [
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/"),
    (":authority", "localhost"),
];

/// The HEADERS frame of a POST on `stream` whose body follows, with a content-length when
/// `len` is given.
fn post_headers(stream: u32, len: Option<usize>) -> Vec<u8> {
    let len = len.map(|n| n.to_string());
    let mut fields = vec![
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/p"),
        (":authority", "localhost"),
    ];
    if let Some(len) = &len {
        fields.push(("content-length", len));
    }
    headers(stream, &fields, false)
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    frame::write_header(&mut v, payload.len(), kind, flags, stream);
    v.extend_from_slice(payload);
    v
}

fn headers(stream: u32, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
    let flags = flag::END_HEADERS | if end_stream { flag::END_STREAM } else { 0 };
    frame_bytes(kind::HEADERS, flags, stream, &block(fields))
}

struct Peer {
    session: Session,
    out: Vec<u8>,
    events: Vec<Event>,
    /// Take bodies as streams (a proxy route) rather than whole.
    stream_bodies: bool,
    /// The requests taken at their head when `stream_bodies`.
    streamed: Vec<crate::RequestData>,
    /// Choose nothing at a head: the stream stays undecided (as the server leaves one until
    /// its body shows what it is).
    wait_at_head: bool,
}

impl Peer {
    fn new(cfg: Config) -> Peer {
        let mut out = Vec::new();
        let session = Session::new(cfg, &mut out);
        let mut p = Peer {
            session,
            out,
            events: Vec::new(),
            stream_bodies: false,
            streamed: Vec::new(),
            wait_at_head: false,
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame_bytes(kind::SETTINGS, 0, 0, &[]));
        p.send(&hello).unwrap();
        p.out.clear();
        p
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), crate::ConnError> {
        let n = self.session.recv(bytes, &mut self.out)?;
        assert_eq!(n, bytes.len(), "whole frames are consumed");
        while let Some(e) = self.session.poll_event() {
            match e {
                // As the server does for a proxy route, or any other handler.
                Event::Head(id) if self.wait_at_head => self.events.push(Event::Head(id)),
                Event::Head(id) if self.stream_bodies => {
                    let data = self.session.stream_body(id, &mut self.out);
                    self.streamed.push(data.expect("a request to stream"));
                    self.events.push(Event::Head(id));
                }
                Event::Head(id) => self.session.gather_body(id, &mut self.out),
                e => self.events.push(e),
            }
        }
        Ok(())
    }

    /// The frames the session wrote since the last call.
    fn frames(&mut self) -> Vec<(FrameHeader, Vec<u8>)> {
        let mut v = Vec::new();
        let mut pos = 0;
        while pos + HEADER_LEN <= self.out.len() {
            let h = FrameHeader::parse(self.out[pos..pos + HEADER_LEN].try_into().unwrap());
            let end = pos + HEADER_LEN + h.len as usize;
            v.push((h, self.out[pos + HEADER_LEN..end].to_vec()));
            pos = end;
        }
        self.out.clear();
        v
    }

    fn goaway_code(&mut self) -> Option<u32> {
        self.frames()
            .into_iter()
            .find(|(h, _)| h.kind == kind::GOAWAY)
            .map(|(_, p)| u32::from_be_bytes(p[4..8].try_into().unwrap()))
    }

    fn rst_codes(&mut self) -> Vec<(u32, u32)> {
        self.frames()
            .into_iter()
            .filter(|(h, _)| h.kind == kind::RST_STREAM)
            .map(|(h, p)| (h.stream, u32::from_be_bytes(p[..4].try_into().unwrap())))
            .collect()
    }
}

/// Sends `frames(n)` for n = 0, 1, 2, ... until the session closes the connection; returns
/// its error and how many rounds went in.
fn until_stopped(p: &mut Peer, mut frames: impl FnMut(u32) -> Vec<u8>) -> (crate::ConnError, u32) {
    for n in 0..100_000 {
        if let Err(e) = p.send(&frames(n)) {
            return (e, n);
        }
    }
    panic!("never stopped");
}

#[test]
fn settings_come_first_and_are_acknowledged() {
    let mut out = Vec::new();
    let mut s = Session::new(Config::default(), &mut out);
    let h = FrameHeader::parse(out[..9].try_into().unwrap());
    assert_eq!(h.kind, kind::SETTINGS);
    out.clear();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame_bytes(kind::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]));
    assert_eq!(s.recv(&hello, &mut out), Ok(hello.len()));
    let h = FrameHeader::parse(out[..9].try_into().unwrap());
    assert_eq!((h.kind, h.flags), (kind::SETTINGS, flag::ACK));
}

#[test]
fn the_preface_may_arrive_in_pieces_and_must_be_exact() {
    let mut out = Vec::new();
    let mut s = Session::new(Config::default(), &mut out);
    assert_eq!(s.recv(&PREFACE[..10], &mut out), Ok(0));
    let mut out = Vec::new();
    let mut s = Session::new(Config::default(), &mut out);
    let err = s.recv(b"GET / HTTP/1.1\r\n\r\n", &mut out).unwrap_err();
    assert_eq!(err.code, ErrorCode::Protocol);
}

#[test]
fn a_get_becomes_a_request_event_and_its_answer_closes_the_stream() {
    let mut p = Peer::new(Config::default());
    p.send(&headers(1, &GET, true)).unwrap();
    assert_eq!(p.events, [Event::Request(1)]);
    let req = p.session.take_request(1).unwrap();
    let mut hs = [httparse::EMPTY_HEADER; crate::MAX_FIELDS];
    let head = req.head(&mut hs, &Default::default()).unwrap();
    assert_eq!(head.path, "/");
    let mut out = Vec::new();
    let mut h = p.session.response(1, 200, &mut out);
    h.field(b"Content-Type", b"text/plain");
    h.finish(false);
    let hdr = p.session.data_frame(1, 5, true);
    out.extend_from_slice(&hdr);
    out.extend_from_slice(b"hello");
    p.session.answer_sent(1, &mut out);
    assert_eq!(p.session.open_streams(), 0);
    let first = FrameHeader::parse(out[..9].try_into().unwrap());
    assert_eq!(first.kind, kind::HEADERS);
    assert!(first.has(flag::END_HEADERS) && !first.has(flag::END_STREAM));
}

#[test]
fn a_bad_field_resets_only_its_stream() {
    let mut p = Peer::new(Config::default());
    let mut bad = GET.to_vec();
    bad.push(("Upper", "x"));
    p.send(&headers(1, &bad, true)).unwrap();
    assert_eq!(p.rst_codes(), [(1, ErrorCode::Protocol as u32)]);
    p.send(&headers(3, &GET, true)).unwrap();
    assert!(p.events.contains(&Event::Request(3)));
    let mut conn = GET.to_vec();
    conn.push(("connection", "keep-alive"));
    p.send(&headers(5, &conn, true)).unwrap();
    assert_eq!(p.rst_codes(), [(5, ErrorCode::Protocol as u32)]);
}

#[test]
fn a_path_not_in_origin_form_resets_its_stream() {
    let mut p = Peer::new(Config::default());
    let mut absolute = GET.to_vec();
    absolute[2] = (":path", "http://other.test/");
    p.send(&headers(1, &absolute, true)).unwrap();
    assert_eq!(p.rst_codes(), [(1, ErrorCode::Protocol as u32)]);
    assert!(!p.events.contains(&Event::Request(1)));
    p.send(&headers(3, &GET, true)).unwrap();
    assert!(p.events.contains(&Event::Request(3)));
}

#[test]
fn rapid_reset_is_stopped() {
    let cfg = Config::default();
    let mut p = Peer::new(cfg);
    let (result, n) = until_stopped(&mut p, |n| {
        let id = 2 * n + 1;
        let mut bytes = headers(id, &GET, false);
        bytes.extend(frame_bytes(kind::RST_STREAM, 0, id, &8u32.to_be_bytes()));
        bytes
    });
    assert_eq!(result.code, ErrorCode::EnhanceYourCalm);
    assert!(
        n <= cfg.reset_budget as u32 + 1,
        "stopped after {n} streams"
    );
    assert_eq!(p.goaway_code(), Some(ErrorCode::EnhanceYourCalm as u32));
}

#[test]
fn completed_streams_earn_back_the_reset_budget() {
    let mut p = Peer::new(Config::default());
    // A browser that cancels one request in two never runs out.
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        if i % 2 == 0 {
            let mut bytes = headers(id, &GET, false);
            bytes.extend(frame_bytes(kind::RST_STREAM, 0, id, &8u32.to_be_bytes()));
            p.send(&bytes).unwrap();
        } else {
            p.send(&headers(id, &GET, true)).unwrap();
            let mut out = Vec::new();
            p.session.take_request(id).unwrap();
            p.session.response(id, 204, &mut out).finish(true);
        }
    }
}

#[test]
fn a_continuation_flood_is_stopped() {
    let mut p = Peer::new(Config::default());
    let mut bytes = frame_bytes(kind::HEADERS, 0, 1, &block(&GET));
    for _ in 0..100 {
        bytes.extend(frame_bytes(kind::CONTINUATION, 0, 1, &[]));
    }
    let err = p.session.recv(&bytes, &mut p.out).unwrap_err();
    assert_eq!(err.code, ErrorCode::EnhanceYourCalm);
}

#[test]
fn a_huge_header_block_is_stopped_by_bytes() {
    let mut p = Peer::new(Config::default());
    let mut bytes = frame_bytes(kind::HEADERS, 0, 1, &block(&GET));
    for _ in 0..4 {
        bytes.extend(frame_bytes(kind::CONTINUATION, 0, 1, &[0x40; 16_000]));
    }
    let err = p.session.recv(&bytes, &mut p.out).unwrap_err();
    assert_eq!(err.code, ErrorCode::EnhanceYourCalm);
}

#[test]
fn a_header_list_over_the_limit_is_answered_431() {
    let cfg = Config {
        max_header_list: 1000,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    let big = "x".repeat(900);
    let mut f = GET.to_vec();
    f.push(("a", &big));
    f.push(("b", &big));
    p.send(&headers(1, &f, true)).unwrap();
    assert_eq!(
        p.events,
        [Event::Refuse {
            stream: 1,
            status: 431
        }]
    );
}

#[test]
fn a_ping_flood_is_stopped() {
    let mut p = Peer::new(Config::default());
    let ping = frame_bytes(kind::PING, 0, 0, &[0; 8]);
    let (err, n) = until_stopped(&mut p, |_| ping.clone());
    assert_eq!(err.code, ErrorCode::EnhanceYourCalm);
    assert!(n >= 100, "ordinary pings are answered");
}

#[test]
fn streams_over_the_limit_are_refused() {
    let cfg = Config {
        max_concurrent_streams: 2,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    for id in [1, 3, 5] {
        p.send(&headers(id, &GET, true)).unwrap();
    }
    assert_eq!(p.rst_codes(), [(5, ErrorCode::RefusedStream as u32)]);
    assert_eq!(p.events[..2], [Event::Request(1), Event::Request(3)]);
    assert!(matches!(p.events[2], Event::StreamError(_)));
}

#[test]
fn a_body_arrives_and_windows_are_returned_in_batches() {
    let mut p = Peer::new(Config::default());
    let len = 300_000;
    p.send(&post_headers(1, Some(len))).unwrap();
    let chunk = vec![7u8; 10_000];
    for i in 0..30 {
        let end = if i == 29 { flag::END_STREAM } else { 0 };
        p.send(&frame_bytes(kind::DATA, end, 1, &chunk)).unwrap();
    }
    let updates = p
        .frames()
        .into_iter()
        .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE)
        .count();
    assert!(
        (1..=4).contains(&updates),
        "{updates} WINDOW_UPDATEs for 30 frames"
    );
    assert_eq!(p.events, [Event::Request(1)]);
    assert_eq!(p.session.take_request(1).unwrap().body.len(), len);
}

#[test]
fn a_body_over_the_limit_is_refused_413() {
    let cfg = Config {
        max_body: 1000,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    p.send(&post_headers(1, Some(5000))).unwrap();
    assert_eq!(
        p.events,
        [Event::Refuse {
            stream: 1,
            status: 413
        }]
    );
    // Undeclared length: refused once the DATA passes the limit.
    p.events.clear();
    p.send(&post_headers(3, None)).unwrap();
    p.send(&frame_bytes(kind::DATA, 0, 3, &[0; 1500])).unwrap();
    assert_eq!(
        p.events,
        [Event::Refuse {
            stream: 3,
            status: 413
        }]
    );
}

#[test]
fn content_length_must_match_the_data() {
    let mut p = Peer::new(Config::default());
    p.send(&post_headers(1, Some(10))).unwrap();
    p.send(&frame_bytes(kind::DATA, flag::END_STREAM, 1, &[0; 5]))
        .unwrap();
    assert_eq!(p.rst_codes(), [(1, ErrorCode::Protocol as u32)]);
}

#[test]
fn data_beyond_the_connection_window_is_a_connection_error() {
    let cfg = Config {
        stream_window: 1 << 20,
        connection_window: 65_535,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    p.send(&post_headers(1, None)).unwrap();
    // Five full frames at once: the window (65 535) is returned only after a batch, so the
    // fourth is beyond it.
    let mut bytes = Vec::new();
    for _ in 0..5 {
        bytes.extend(frame_bytes(kind::DATA, 0, 1, &[0u8; 16_384]));
    }
    let err = p.session.recv(&bytes, &mut p.out).unwrap_err();
    assert_eq!(err.code, ErrorCode::FlowControl);
}

#[test]
fn send_windows_follow_settings_and_updates() {
    let mut p = Peer::new(Config::default());
    p.send(&frame_bytes(
        kind::SETTINGS,
        0,
        0,
        &[0, setting::INITIAL_WINDOW_SIZE as u8, 0, 0, 0, 10],
    ))
    .unwrap();
    p.send(&headers(1, &GET, true)).unwrap();
    assert_eq!(p.session.send_capacity(1), 10);
    p.send(&frame_bytes(
        kind::WINDOW_UPDATE,
        0,
        1,
        &100u32.to_be_bytes(),
    ))
    .unwrap();
    assert_eq!(p.session.send_capacity(1), 110);
    let err = p
        .send(&frame_bytes(
            kind::WINDOW_UPDATE,
            0,
            0,
            &0x7fff_ffffu32.to_be_bytes(),
        ))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::FlowControl);
}

#[test]
fn frames_on_idle_and_closed_streams() {
    let mut p = Peer::new(Config::default());
    let err = p.send(&frame_bytes(kind::DATA, 0, 1, b"x")).unwrap_err();
    assert_eq!(err.code, ErrorCode::Protocol, "DATA on an idle stream");

    let mut p = Peer::new(Config::default());
    p.send(&headers(5, &GET, true)).unwrap();
    let err = p.send(&headers(3, &GET, true)).unwrap_err();
    assert_eq!(err.code, ErrorCode::Protocol, "a lower stream id");

    let mut p = Peer::new(Config::default());
    p.send(&headers(1, &GET, true)).unwrap();
    p.send(&frame_bytes(kind::DATA, 0, 1, b"x")).unwrap();
    assert_eq!(p.rst_codes(), [(1, ErrorCode::StreamClosed as u32)]);
}

#[test]
fn goaway_ignores_later_streams_but_answers_earlier_ones() {
    let mut p = Peer::new(Config::default());
    p.send(&headers(1, &GET, false)).unwrap();
    let mut out = Vec::new();
    p.session.go_away(&mut out);
    p.send(&headers(3, &GET, true)).unwrap();
    assert!(p.events.is_empty());
    assert!(!p.session.is_finished());
    p.send(&frame_bytes(kind::DATA, flag::END_STREAM, 1, &[]))
        .unwrap();
    assert_eq!(p.events, [Event::Request(1)]);
}

#[test]
fn priority_comes_from_the_field_and_from_priority_update() {
    let mut p = Peer::new(Config::default());
    let mut f = GET.to_vec();
    f.push(("priority", "u=1, i"));
    p.send(&headers(1, &f, true)).unwrap();
    let pr = p.session.priority(1);
    assert_eq!((pr.urgency, pr.incremental), (1, true));
    let mut payload = 3u32.to_be_bytes().to_vec();
    payload.extend_from_slice(b"u=0");
    p.send(&frame_bytes(kind::PRIORITY_UPDATE, 0, 0, &payload))
        .unwrap();
    p.send(&headers(3, &GET, true)).unwrap();
    assert_eq!(p.session.priority(3).urgency, 0);
    assert!(
        !p.session.priority(3).incremental,
        "an update's omitted i is false"
    );
    // No signal at all: the default urgency, taking turns with the others.
    p.send(&headers(5, &GET, true)).unwrap();
    assert_eq!(p.session.priority(5), crate::Priority::UNSIGNALLED);
}

#[test]
fn large_response_headers_are_split_into_continuations() {
    let mut p = Peer::new(Config::default());
    p.send(&headers(1, &GET, true)).unwrap();
    let mut out = Vec::new();
    let mut h = p.session.response(1, 200, &mut out);
    let v = "v".repeat(10_000);
    h.field(b"x-a", v.as_bytes());
    h.field(b"x-b", v.as_bytes());
    h.finish(true);
    let first = FrameHeader::parse(out[..9].try_into().unwrap());
    assert_eq!(first.kind, kind::HEADERS);
    assert!(!first.has(flag::END_HEADERS) && first.has(flag::END_STREAM));
    let second_at = 9 + first.len as usize;
    let second = FrameHeader::parse(out[second_at..second_at + 9].try_into().unwrap());
    assert_eq!(second.kind, kind::CONTINUATION);
    assert!(second.has(flag::END_HEADERS));
}

#[test]
fn a_head_block_that_moved_nothing_can_be_sent_again() {
    let mut p = Peer::new(Config::default());
    let fields = |p: &mut Peer, id: u32, out: &mut Vec<u8>| {
        let mut h = p.session.response(id, 200, out);
        h.field(b"content-type", b"text/html");
        h.field(b"server", b"tern");
        h.finish(true)
    };
    for id in [1, 3, 5] {
        p.send(&headers(id, &GET, true)).unwrap();
    }
    let mut out = Vec::new();
    let g0 = p.session.encoder_generation();
    fields(&mut p, 1, &mut out);
    let g1 = p.session.encoder_generation();
    assert_ne!(g0, g1, "the first answer adds its fields to the table");
    out.clear();
    let range = fields(&mut p, 3, &mut out).expect("one frame");
    assert_eq!(
        p.session.encoder_generation(),
        g1,
        "the second only refers to them"
    );
    let block = out[range].to_vec();
    assert!(block.len() <= 3, "indexed fields: {block:?}");
    let mut again = Vec::new();
    p.session.response_block(5, &block, true, &mut again);
    assert_eq!(&again[9..], &block[..]);
    let h = FrameHeader::parse(again[..9].try_into().unwrap());
    assert_eq!((h.kind, h.stream), (kind::HEADERS, 5));
    assert!(h.has(flag::END_STREAM) && h.has(flag::END_HEADERS));
    assert_eq!(p.session.open_streams(), 0);
}

#[test]
fn made_you_reset_is_stopped() {
    // CVE-2025-8671: requests that are cheap to send and make the server reset the stream
    // (here a malformed field) cost the same budget as the peer's own resets.
    let mut p = Peer::new(Config::default());
    let mut bad = GET.to_vec();
    bad.push(("te", "gzip"));
    let (err, _) = until_stopped(&mut p, |n| headers(2 * n + 1, &bad, true));
    assert_eq!(err.code, ErrorCode::EnhanceYourCalm);
    // WINDOW_UPDATE of 0 on a stream, another stream error the peer can cause at will.
    let mut p = Peer::new(Config::default());
    let (err, _) = until_stopped(&mut p, |n| {
        let mut bytes = headers(2 * n + 1, &GET, false);
        bytes.extend(frame_bytes(
            kind::WINDOW_UPDATE,
            0,
            2 * n + 1,
            &0u32.to_be_bytes(),
        ));
        bytes
    });
    assert_eq!(err.code, ErrorCode::EnhanceYourCalm);
}

#[test]
fn empty_data_and_window_update_floods_are_stopped() {
    for flood in [
        frame_bytes(kind::DATA, 0, 1, &[]),
        frame_bytes(kind::WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes()),
        frame_bytes(kind::SETTINGS, 0, 0, &[]),
        frame_bytes(kind::PRIORITY, 0, 1, &[0, 0, 0, 0, 16]),
    ] {
        let mut p = Peer::new(Config::default());
        p.send(&post_headers(1, None)).unwrap();
        let (err, _) = until_stopped(&mut p, |_| flood.clone());
        assert_eq!(err.code, ErrorCode::EnhanceYourCalm);
    }
}

/// A client that honours flow control: uploads `len` bytes on each of `ids`, a frame per
/// stream in turn, sending only what the windows the server granted allow. Returns the
/// streams whose request completed, or panics if no stream can move (a stall).
fn upload(p: &mut Peer, ids: &[u32], len: usize) -> Vec<u32> {
    let stream_window = Config::default().stream_window as i64;
    let mut conn_window = 65_535i64; // raised by the session's first WINDOW_UPDATE
    let mut windows: Vec<i64> = ids.iter().map(|_| stream_window).collect();
    let mut sent = vec![0usize; ids.len()];
    for &id in ids {
        p.send(&post_headers(id, Some(len))).unwrap();
    }
    // The WINDOW_UPDATE the session sent at start (before Peer::new cleared its output).
    conn_window += (Config::default().connection_window - 65_535) as i64;
    loop {
        for (fh, payload) in p.frames() {
            if fh.kind == kind::WINDOW_UPDATE {
                let inc = u32::from_be_bytes(payload[..4].try_into().unwrap()) as i64;
                match ids.iter().position(|&id| id == fh.stream) {
                    Some(i) => windows[i] += inc,
                    None => conn_window += inc,
                }
            }
        }
        let mut moved = false;
        for (i, &id) in ids.iter().enumerate() {
            let n = (len - sent[i])
                .min(16_384)
                .min(windows[i].max(0) as usize)
                .min(conn_window.max(0) as usize);
            if n == 0 && sent[i] < len {
                continue;
            }
            if sent[i] == len {
                continue;
            }
            sent[i] += n;
            windows[i] -= n as i64;
            conn_window -= n as i64;
            let end = if sent[i] == len { flag::END_STREAM } else { 0 };
            p.send(&frame_bytes(kind::DATA, end, id, &vec![1u8; n]))
                .unwrap();
            moved = true;
        }
        if sent.iter().all(|&s| s == len) {
            break;
        }
        assert!(
            moved,
            "stalled: sent {sent:?} of {len}, windows {windows:?}, connection {conn_window}"
        );
    }
    p.events
        .iter()
        .filter_map(|e| match e {
            Event::Request(id) => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn an_upload_larger_than_the_buffered_limit_never_stalls() {
    let cfg = Config {
        max_body: 64 << 20,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    let done = upload(&mut p, &[1], 20 << 20);
    assert_eq!(done, [1]);
    assert_eq!(p.session.take_request(1).unwrap().body.len(), 20 << 20);
}

#[test]
fn many_parallel_uploads_past_the_limit_all_finish() {
    let cfg = Config {
        max_body: 1 << 20,
        max_buffered_bodies: 2 << 20,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    let ids: Vec<u32> = (0..10).map(|i| 2 * i + 1).collect();
    let mut done = upload(&mut p, &ids, 1 << 20);
    done.sort();
    assert_eq!(done, ids);
}

#[test]
fn trailers_on_a_stream_we_reset_are_ignored() {
    let cfg = Config {
        max_body: 1000,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    p.send(&post_headers(1, Some(5000))).unwrap();
    assert!(p.events.contains(&Event::Refuse {
        stream: 1,
        status: 413
    }));
    // The 413 goes out and ends our side: the session resets the rest of the upload.
    let mut out = Vec::new();
    p.session.response(1, 413, &mut out).finish(true);
    // What the client had already sent arrives: DATA, then trailers. Both are ignored.
    p.send(&frame_bytes(kind::DATA, 0, 1, &[0; 100])).unwrap();
    p.send(&headers(1, &[("x-trailer", "1")], true)).unwrap();
    p.send(&headers(3, &GET, true)).unwrap();
    assert!(p.events.contains(&Event::Request(3)));
}

#[test]
fn cancelling_answers_under_way_costs_no_reset_budget() {
    let mut p = Peer::new(Config::default());
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        p.send(&headers(id, &GET, true)).unwrap();
        p.session.take_request(id).unwrap();
        let mut out = Vec::new();
        p.session.response(id, 200, &mut out).finish(false);
        // A video seek: the client cancels a long answer it started to receive.
        p.send(&frame_bytes(kind::RST_STREAM, 0, id, &8u32.to_be_bytes()))
            .unwrap();
    }
}

#[test]
fn the_body_clock_follows_the_stream_that_waited_longest() {
    let mut p = Peer::new(Config::default());
    p.session.set_time(1_000);
    p.send(&post_headers(1, None)).unwrap();
    p.send(&post_headers(3, None)).unwrap();
    assert_eq!(p.session.body_progress(), Some(1_000));
    // Stream 1 trickles on; stream 3 says nothing: the clock stays at stream 3's start.
    for t in [2_000, 3_000, 4_000] {
        p.session.set_time(t);
        p.send(&frame_bytes(kind::DATA, 0, 1, b"x")).unwrap();
        assert_eq!(p.session.body_progress(), Some(1_000));
    }
    p.send(&frame_bytes(kind::DATA, flag::END_STREAM, 3, b"y"))
        .unwrap();
    assert_eq!(
        p.session.body_progress(),
        Some(4_000),
        "now only stream 1 waits"
    );
}

/// A streamed body (a proxy route): any size past `max_body`, taken as it comes, its window
/// returned only as it is consumed, so the session never holds more than a window of it.
#[test]
fn a_streamed_body_flows_as_it_is_consumed_past_max_body() {
    let cfg = Config {
        max_body: 1000,
        stream_window: 64 * 1024,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    p.stream_bodies = true;
    p.send(&post_headers(1, Some(200_000))).unwrap();
    assert_eq!(p.events, [Event::Head(1)]);
    let chunk = vec![b'b'; 16 * 1024];
    let mut taken = 0;
    let mut sent = 0;
    // The peer's window for the stream: 64 KiB, plus what WINDOW_UPDATEs give back.
    let mut window: i64 = 64 * 1024;
    p.out.clear();
    while sent < 200_000 {
        let n = chunk.len().min(200_000 - sent);
        assert!(
            window >= n as i64,
            "stalled after {sent} bytes: no window came back"
        );
        let end = sent + n == 200_000;
        let flags = if end { flag::END_STREAM } else { 0 };
        p.send(&frame_bytes(kind::DATA, flags, 1, &chunk[..n]))
            .unwrap();
        window -= n as i64;
        sent += n;
        let (held, ended) = p.session.body_chunk(1).map(|(c, e)| (c.len(), e)).unwrap();
        assert!(
            held <= 64 * 1024,
            "the session holds at most a window: {held}"
        );
        assert_eq!(ended, end);
        // The caller consumes; the window goes back once most of it is taken.
        let mut out = std::mem::take(&mut p.out);
        p.session.consume_body(1, held, &mut out);
        p.out = out;
        taken += held;
        for (h, payload) in p.frames() {
            if h.kind == kind::WINDOW_UPDATE && h.stream == 1 {
                window += i64::from(u32::from_be_bytes(payload[..4].try_into().unwrap()));
            }
        }
        p.out.clear();
    }
    assert_eq!(taken, 200_000);
    assert!(!p
        .events
        .iter()
        .any(|e| matches!(e, Event::Refuse { .. } | Event::Request(_))));
}

/// A stream left undecided at its head is told when its body shows what it is: `Body` at its
/// first bytes and at its end (an empty DATA frame with END_STREAM, or trailers), never for
/// empty DATA before; what came so far is readable with `body_chunk`. Once the caller gathers
/// the body, `Body` events raised before say nothing and are dropped: `Request` follows.
#[test]
fn an_undecided_stream_is_told_when_its_body_begins_or_ends() {
    let mut p = Peer::new(Config::default());
    p.wait_at_head = true;
    p.send(&headers(1, &GET, false)).unwrap();
    assert_eq!(p.events, [Event::Head(1)]);
    assert!(p.session.is_undecided(1));
    assert_eq!(p.session.body_chunk(1), Some((&b""[..], false)));
    assert_eq!(p.session.body_progress(), Some(0), "the body timeout runs");
    p.send(&frame_bytes(kind::DATA, 0, 1, b"")).unwrap();
    assert_eq!(
        p.events,
        [Event::Head(1)],
        "an empty DATA frame shows nothing"
    );
    p.send(&frame_bytes(kind::DATA, flag::END_STREAM, 1, b""))
        .unwrap();
    assert_eq!(p.events, [Event::Head(1), Event::Body(1)]);
    assert_eq!(p.session.body_chunk(1), Some((&b""[..], true)));
    // Gathered now: the request, without a body.
    p.session.gather_body(1, &mut p.out);
    assert!(!p.session.is_undecided(1));
    assert_eq!(p.session.poll_event(), Some(Event::Request(1)));
    assert!(p.session.take_request(1).unwrap().body.is_empty());

    // Trailers end an undecided stream too.
    p.events.clear();
    p.send(&headers(3, &GET, false)).unwrap();
    p.send(&headers(3, &[("x-t", "1")], true)).unwrap();
    assert_eq!(p.events, [Event::Head(3), Event::Body(3)]);
    assert_eq!(p.session.body_chunk(3), Some((&b""[..], true)));

    // The first bytes of a body, once; then the caller streams it.
    p.events.clear();
    p.send(&post_headers(5, None)).unwrap();
    p.send(&frame_bytes(kind::DATA, 0, 5, b"ab")).unwrap();
    p.send(&frame_bytes(kind::DATA, 0, 5, b"cd")).unwrap();
    assert_eq!(p.events, [Event::Head(5), Event::Body(5)]);
    assert_eq!(p.session.body_chunk(5), Some((&b"abcd"[..], false)));
    let data = p.session.stream_body(5, &mut p.out).expect("the request");
    assert!(data.body.is_empty(), "the body stays with the stream");
    assert_eq!(p.session.body_chunk(5), Some((&b"abcd"[..], false)));

    // Gathered at once, with its bytes and end in the same read: no stale `Body`.
    p.events.clear();
    p.wait_at_head = false;
    let mut both = post_headers(7, None);
    both.extend(frame_bytes(kind::DATA, 0, 7, b"x"));
    both.extend(frame_bytes(kind::DATA, flag::END_STREAM, 7, b"y"));
    p.send(&both).unwrap();
    assert_eq!(p.events, [Event::Request(7)]);
}

/// Many uploads to a proxy route, none taken (their relays wait for upstream connections):
/// the session holds back the connection's window past the streamed-body budget instead of
/// buffering a stream window per stream, and gives it back as the bodies are taken.
#[test]
fn streamed_bodies_that_wait_hold_back_the_connection_window() {
    let cfg = Config {
        stream_window: 128 * 1024,
        connection_window: 1024 * 1024,
        ..Config::default()
    };
    let mut p = Peer::new(cfg);
    p.stream_bodies = true;
    let chunk = vec![b'u'; 16 * 1024];
    let streams: Vec<u32> = (0..12).map(|i| 1 + 2 * i).collect();
    for &id in &streams {
        p.send(&post_headers(id, Some(10_000_000))).unwrap();
    }
    p.out.clear();
    // 64 KiB on each of 12 streams: 768 KiB, past the 512 KiB budget and past half the
    // connection window, none of it taken.
    for _ in 0..4 {
        for &id in &streams {
            p.send(&frame_bytes(kind::DATA, 0, id, &chunk)).unwrap();
        }
    }
    let conn_updates = |p: &mut Peer| {
        p.frames()
            .into_iter()
            .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE && h.stream == 0)
            .count()
    };
    assert_eq!(
        conn_updates(&mut p),
        0,
        "the connection window was given back"
    );
    // What the peer may still send is what is left of the 1 MiB connection window: 256 KiB.
    let mut sent = 0;
    'fill: for _ in 0..8 {
        for &id in &streams[..4] {
            if p.send(&frame_bytes(kind::DATA, 0, id, &chunk)).is_err() {
                break 'fill;
            }
            sent += chunk.len();
        }
    }
    assert_eq!(
        sent,
        256 * 1024,
        "the peer sent up to the connection window and no further"
    );
    assert!(
        p.session.is_closed(),
        "DATA beyond the connection window is a connection error"
    );

    // Taken as the relays attach: the window comes back.
    let mut p = Peer::new(Config {
        stream_window: 128 * 1024,
        connection_window: 1024 * 1024,
        ..Config::default()
    });
    p.stream_bodies = true;
    for &id in &streams {
        p.send(&post_headers(id, Some(10_000_000))).unwrap();
        for _ in 0..4 {
            p.send(&frame_bytes(kind::DATA, 0, id, &chunk)).unwrap();
        }
    }
    p.out.clear();
    for &id in &streams {
        let held = p.session.body_chunk(id).unwrap().0.len();
        let mut out = std::mem::take(&mut p.out);
        p.session.consume_body(id, held, &mut out);
        p.out = out;
    }
    assert_eq!(
        conn_updates(&mut p),
        1,
        "the held window went back once the bodies were taken"
    );
}

/// The SETTINGS values a session writes first, by id.
fn own_settings(cfg: Config) -> Vec<(u16, u32)> {
    let mut out = Vec::new();
    Session::new(cfg, &mut out);
    let h = FrameHeader::parse(out[..HEADER_LEN].try_into().unwrap());
    assert_eq!(h.kind, kind::SETTINGS);
    out[HEADER_LEN..HEADER_LEN + h.len as usize]
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect()
}

const WEBSOCKET: [(&str, &str); 6] = [
    (":method", "CONNECT"),
    (":protocol", "websocket"),
    (":scheme", "https"),
    (":path", "/chat?room=1"),
    (":authority", "localhost"),
    ("sec-websocket-version", "13"),
];

fn extended() -> Config {
    Config {
        extended_connect: true,
        ..Config::default()
    }
}

#[test]
fn extended_connect_is_advertised_only_when_accepted() {
    let on = own_settings(extended());
    assert!(
        on.contains(&(setting::ENABLE_CONNECT_PROTOCOL, 1)),
        "{on:?}"
    );
    let off = own_settings(Config::default());
    assert!(
        !off.iter()
            .any(|(id, _)| *id == setting::ENABLE_CONNECT_PROTOCOL),
        "{off:?}"
    );
}

#[test]
fn an_extended_connect_is_the_get_of_its_path_with_a_protocol() {
    let mut p = Peer::new(extended());
    p.stream_bodies = true;
    // No END_STREAM: the stream carries the tunnel's bytes afterwards.
    p.send(&headers(1, &WEBSOCKET, false)).unwrap();
    assert_eq!(p.events, [Event::Head(1)]);
    assert!(p.rst_codes().is_empty());
    let data = &p.streamed[0];
    assert_eq!(data.fields.protocol(), Some(&b"websocket"[..]));
    let mut hs = [httparse::EMPTY_HEADER; crate::MAX_FIELDS];
    let head = data.head(&mut hs, &Default::default()).unwrap();
    assert_eq!(head.method, tern_codec::Method::Get);
    assert_eq!(head.method_str, "GET");
    assert_eq!((&*head.path, head.query), ("/chat", Some("room=1")));
    assert_eq!(head.protocol, Some("websocket"));
    assert_eq!(head.host, Some(&b"localhost"[..]));
    // Bytes flow both ways on the stream: the client's DATA reaches the caller ...
    p.send(&frame_bytes(kind::DATA, 0, 1, b"\x81\x02hi"))
        .unwrap();
    assert_eq!(p.session.body_chunk(1), Some((&b"\x81\x02hi"[..], false)));
    // ... and a 200 without END_STREAM leaves the stream open for ours.
    let mut out = Vec::new();
    p.session.response(1, 200, &mut out).finish(false);
    assert!(p.session.send_capacity(1) > 0);
    p.send(&frame_bytes(kind::DATA, flag::END_STREAM, 1, b""))
        .unwrap();
    assert_eq!(p.session.body_chunk(1), Some((&b"\x81\x02hi"[..], true)));
}

#[test]
fn malformed_extended_connects_are_stream_errors() {
    let with = |cfg: Config, fields: &[(&str, &str)]| {
        let mut p = Peer::new(cfg);
        p.stream_bodies = true;
        p.send(&headers(1, fields, false)).unwrap();
        let codes = p.rst_codes();
        // The connection goes on.
        p.send(&headers(3, &GET, true)).unwrap();
        assert!(p.events.contains(&Event::Request(3)));
        codes
    };
    let protocol_error = vec![(1, ErrorCode::Protocol as u32)];
    // Not advertised: a :protocol is malformed (RFC 8441 §3).
    assert_eq!(with(Config::default(), &WEBSOCKET), protocol_error);
    let without = |name: &str| -> Vec<(&str, &str)> {
        WEBSOCKET
            .iter()
            .copied()
            .filter(|(n, _)| *n != name)
            .collect()
    };
    // §4: :scheme and :path are required with :protocol.
    assert_eq!(with(extended(), &without(":scheme")), protocol_error);
    assert_eq!(with(extended(), &without(":path")), protocol_error);
    let mut empty_path = WEBSOCKET.to_vec();
    empty_path[3] = (":path", "");
    assert_eq!(with(extended(), &empty_path), protocol_error);
    // :protocol only on CONNECT.
    let mut on_get = WEBSOCKET.to_vec();
    on_get[0] = (":method", "GET");
    assert_eq!(with(extended(), &on_get), protocol_error);
    for bad in ["", "web socket", "ws\x01"] {
        let mut l = WEBSOCKET.to_vec();
        l[1] = (":protocol", bad);
        assert_eq!(with(extended(), &l), protocol_error, "{bad:?}");
    }
    let mut twice = WEBSOCKET.to_vec();
    twice.insert(2, (":protocol", "websocket"));
    assert_eq!(with(extended(), &twice), protocol_error);
    // After a regular field, as any pseudo-header.
    let mut late = without(":protocol");
    late.push((":protocol", "websocket"));
    assert_eq!(with(extended(), &late), protocol_error);
    // Its authority-form CONNECT keeps its rules (and is still refused without :authority).
    let plain = [(":method", "CONNECT"), (":authority", "example.org:443")];
    assert!(with(extended(), &plain).is_empty());
    assert_eq!(with(extended(), &plain[..1]), protocol_error);
}

#[test]
fn a_plain_connect_is_what_it_was() {
    let mut p = Peer::new(extended());
    p.send(&headers(
        1,
        &[(":method", "CONNECT"), (":authority", "example.org:443")],
        true,
    ))
    .unwrap();
    assert_eq!(p.events, [Event::Request(1)]);
    let req = p.session.take_request(1).unwrap();
    assert_eq!(req.fields.protocol(), None);
    let mut hs = [httparse::EMPTY_HEADER; crate::MAX_FIELDS];
    let head = req.head(&mut hs, &Default::default()).unwrap();
    assert_eq!(head.method, tern_codec::Method::Connect);
    assert_eq!(head.protocol, None);
}

#[test]
fn a_client_may_say_connect_protocol_only_with_0_or_1() {
    for (value, ok) in [(0u32, true), (1, true), (2, false)] {
        let mut p = Peer::new(extended());
        let mut payload = setting::ENABLE_CONNECT_PROTOCOL.to_be_bytes().to_vec();
        payload.extend_from_slice(&value.to_be_bytes());
        let r = p.send(&frame_bytes(kind::SETTINGS, 0, 0, &payload));
        assert_eq!(r.is_ok(), ok, "{value}");
        if !ok {
            assert_eq!(r.unwrap_err().code, ErrorCode::Protocol);
        }
    }
}
