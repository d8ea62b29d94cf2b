//! A whole HTTP/2 server session on hostile bytes: the input (after the client preface) is
//! fed in pieces; every request is answered (a head, sometimes a body in DATA frames), so the
//! send side and the stream states run too. The session must never panic, must stop taking
//! input once it has closed, and everything it writes must parse as frames. Every request it
//! accepts must be one an HTTP/1.1 upstream reads the same way: a token for a method, field
//! values without control bytes, a canonical path, one authority.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_http2::frame::{FrameHeader, HEADER_LEN, PREFACE};
use tern_http2::{Config, Event, Session};

fuzz_target!(|data: &[u8]| {
    let cfg = Config {
        max_header_list: 4096,
        max_body: 4096,
        reset_budget: 20,
        overhead_budget: 50,
        ..Config::default()
    };
    let mut out = Vec::new();
    let mut session = Session::new(cfg, &mut out);
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(data);
    // Cut the input at a few places chosen by the input itself: partial frames must wait.
    let step = 1 + data.first().copied().unwrap_or(7) as usize * 13;
    let mut fed = 0;
    let mut pending = Vec::new();
    while fed < input.len() {
        let end = (fed + step).min(input.len());
        pending.extend_from_slice(&input[fed..end]);
        fed = end;
        match session.recv(&pending, &mut out) {
            Ok(n) => {
                assert!(n <= pending.len());
                pending.drain(..n);
            }
            Err(_) => {
                assert!(session.is_closed());
                break;
            }
        }
        while let Some(event) = session.poll_event() {
            answer(&mut session, event, &mut out);
        }
    }
    check_frames(&out);
});

/// What a proxied request is built from cannot smuggle another request line or field.
fn check_head(head: &tern_codec::RequestHead<'_>) {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    assert!(
        !head.method_str.is_empty() && head.method_str.bytes().all(tchar),
        "method {:?}",
        head.method_str
    );
    for h in head.headers {
        assert!(
            !h.value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f),
            "value {:?}",
            h.value
        );
    }
    if head.path.starts_with('/') {
        let again = tern_codec::canonical_path(&head.path).expect("a canonical path");
        assert_eq!(again, head.path, "not canonical");
        assert!(!head.path.contains(';'));
    }
}

fn answer(session: &mut Session, event: Event, out: &mut Vec<u8>) {
    let (id, status) = match event {
        Event::Request(id) => {
            let Some(req) = session.take_request(id) else {
                return;
            };
            let mut slots = vec![httparse::EMPTY_HEADER; req.fields.field_count()];
            let status = match req.head(&mut slots, &Default::default()) {
                Ok(head) => {
                    check_head(&head);
                    200 + (head.path.len() % 3) as u16
                }
                Err(e) => e.status(),
            };
            session.recycle(req);
            (id, status)
        }
        Event::Refuse { stream, status } => (stream, status),
        // Odd streams are taken as streams (a proxy route), even ones gathered whole; a
        // streamed body is consumed as it comes, and answered at its end.
        Event::Head(id) if id % 4 == 1 => {
            if let Some(req) = session.stream_body(id, out) {
                session.recycle(req);
            }
            return;
        }
        Event::Head(id) => return session.gather_body(id, out),
        Event::Body(id) => {
            let Some((chunk, ended)) = session.body_chunk(id) else {
                return;
            };
            let n = chunk.len();
            session.consume_body(id, n, out);
            if !ended {
                return;
            }
            (id, 200)
        }
        _ => return,
    };
    let body_len = (id as usize * 37) % 40_000;
    let mut h = session.response(id, status, out);
    h.field(b"Content-Type", b"text/plain");
    h.field(b"content-length", body_len.to_string().as_bytes());
    h.finish(body_len == 0);
    let mut left = body_len;
    while left > 0 {
        let n = session.send_capacity(id).min(left);
        if n == 0 {
            break; // waits for window; a server would keep it queued
        }
        left -= n;
        let header = session.data_frame(id, n, left == 0);
        out.extend_from_slice(&header);
        out.resize(out.len() + n, b'x');
        if left == 0 {
            session.answer_sent(id, out);
        }
    }
}

/// Everything the session wrote is a sequence of whole frames.
fn check_frames(out: &[u8]) {
    let mut pos = 0;
    while pos < out.len() {
        let header: &[u8; HEADER_LEN] = out[pos..pos + HEADER_LEN].try_into().unwrap();
        let h = FrameHeader::parse(header);
        pos += HEADER_LEN + h.len as usize;
    }
    assert_eq!(pos, out.len());
}
