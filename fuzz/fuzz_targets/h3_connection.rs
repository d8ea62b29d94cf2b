//! A whole HTTP/3 server connection (tern-http3) on hostile stream bytes, and its QPACK code.
//!
//! The input is records `[stream, flags, len, bytes...]`: `stream` picks one of a few
//! client streams (requests 0/4/8/12, unidirectional 2/6/10/14), bit 0 of `flags` ends the
//! stream with these bytes, bit 1 resets it instead. Request bodies are streamed on streams 0
//! and 8 and gathered on 4 and 12. Every request is answered (a head, a body,
//! the answer ended), so the send side runs too. The connection must never panic, must ignore
//! input once closed, and every request it hands over must build a head an HTTP/1.1 upstream
//! reads the same way. The whole input is also decoded as one QPACK field section: whatever
//! decodes must re-encode and decode to the same fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_http3::{qpack, Config, Connection, Event};

const STREAMS: [u64; 8] = [0, 4, 8, 12, 2, 6, 10, 14];

fuzz_target!(|data: &[u8]| {
    qpack_round_trip(data);
    let cfg = Config {
        max_field_section_size: 4096,
        max_body: 4096,
        max_buffered_body: 2048,
        reset_budget: 20,
        overhead_budget: 50,
        ..Config::default()
    };
    let mut control = Vec::new();
    let mut c = Connection::new(cfg, &mut control);
    let mut out = Vec::new();
    let mut rest = data;
    while let [stream, flags, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (bytes, tail) = tail.split_at(n);
        rest = tail;
        let id = STREAMS[usize::from(*stream) % STREAMS.len()];
        let result = if flags & 2 != 0 {
            c.stream_reset(id)
        } else {
            c.recv_stream_data(id, bytes, flags & 1 != 0)
        };
        if result.is_err() {
            assert!(c.error().is_some());
            assert!(
                c.recv_stream_data(0, b"\x01\x00", true).is_ok(),
                "closed: input ignored"
            );
            assert!(c.poll_event().is_none() || c.error().is_some());
            break;
        }
        while let Some(event) = c.poll_event() {
            answer(&mut c, event, &mut out);
        }
        if flags & 4 != 0 {
            c.go_away(&mut control);
        }
    }
});

fn answer(c: &mut Connection, event: Event, out: &mut Vec<u8>) {
    match event {
        Event::Request { stream, end_stream } => {
            // A body follows: streams 0 and 8 take it as a stream (a proxy route), 4 and 12
            // gather it (413 past max_body).
            let data = if end_stream {
                c.take_request(stream).expect("a raised request is there")
            } else if stream % 8 == 0 {
                let data = c.stream_body(stream).expect("an undecided request is there");
                assert!(c.stream_body(stream).is_none(), "taken once");
                data
            } else {
                if !c.gather_body(stream) {
                    return; // refused: an Event::Refuse follows
                }
                c.take_request(stream).expect("a gathered request is there")
            };
            let mut slots = [httparse::EMPTY_HEADER; 128];
            if let Ok(head) = data.head(&mut slots, &tern_codec::Limits::default()) {
                check_head(&head);
            }
            out.clear();
            c.send_response_head(200, &[(b"Content-Type", b"text/plain")], out);
            c.send_data(b"hello", out);
            check_frames(out);
            c.answer_sent(stream);
        }
        Event::Body(stream) => {
            let n = c.body_chunk(stream).map_or(0, |(b, _)| b.len());
            c.consume_body(stream, n);
        }
        Event::Trailers(stream) => {
            for (n, _) in c.take_trailers(stream) {
                assert!(!n.starts_with(b":"));
            }
        }
        Event::Refuse { stream, status } => {
            assert!(status == 431 || status == 413);
            out.clear();
            c.send_response_head(status, &[], out);
            check_frames(out);
            c.answer_sent(stream);
        }
        Event::ResetStream { .. }
        | Event::StopSending { .. }
        | Event::Reset(_)
        | Event::PeerGoAway => {}
    }
}

/// What a proxied request is built from cannot smuggle another request line or field.
fn check_head(head: &tern_codec::RequestHead<'_>) {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    assert!(!head.method_str.is_empty() && head.method_str.bytes().all(tchar));
    for h in head.headers {
        assert!(!h
            .value
            .iter()
            .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f));
        assert!(!h.name.is_empty() && h.name.bytes().all(tchar));
    }
}

/// Our output parses as whole frames.
fn check_frames(mut out: &[u8]) {
    while !out.is_empty() {
        let (_, len, n) = tern_http3::frame::parse_header(out).expect("a whole frame header");
        out = &out[n + len as usize..];
    }
}

fn qpack_round_trip(block: &[u8]) {
    let mut got = Vec::new();
    let mut scratch = Default::default();
    let Ok(d) = qpack::decode_section(block, 1 << 16, &mut scratch, |n, v| {
        got.push((n.to_vec(), v.to_vec()));
        Ok(())
    }) else {
        return;
    };
    if d.too_large {
        return;
    }
    let mut again = Vec::new();
    qpack::begin_section(&mut again);
    for (i, (n, v)) in got.iter().enumerate() {
        qpack::encode_field(n, v, i % 2 == 0, &mut again);
    }
    let mut back = Vec::new();
    qpack::decode_section(&again, usize::MAX, &mut scratch, |n, v| {
        back.push((n.to_vec(), v.to_vec()));
        Ok(())
    })
    .expect("our own section decodes");
    assert_eq!(back, got);
}
