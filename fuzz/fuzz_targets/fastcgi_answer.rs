//! A FastCGI application's answer on arbitrary input under arbitrary fragmentation: the record
//! reader feeds `STDOUT` to the CGI head parser, as the proxy does. The first byte says how
//! many of the following bytes are fragment lengths; the rest is the wire. Nothing may panic,
//! and the outcome (stdout, stderr, end and head, or else the first error) must be the same as
//! reading the wire in one piece.
#![no_main]

use std::mem::MaybeUninit;

use libfuzzer_sys::fuzz_target;
use tern_codec::{parse_upstream_head, ResponseBody};
use tern_fastcgi::{AnswerReader, CgiHead, CgiHeadParser, Event, Http1Answer};

#[derive(Debug, PartialEq)]
struct Outcome {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    end: Option<(u32, String)>,
    head: Option<(CgiHead, Vec<u8>)>,
    error: Option<String>,
}

fn read(wire: &[u8], frag_lens: &[u8]) -> Outcome {
    let mut reader = AnswerReader::new(1);
    let mut parser = CgiHeadParser::new();
    let mut o = Outcome {
        stdout: Vec::new(),
        stderr: Vec::new(),
        end: None,
        head: None,
        error: None,
    };
    let mut lens = frag_lens.iter().cycle();
    let mut pos = 0;
    while pos < wire.len() && o.error.is_none() && !reader.is_done() {
        let len = if frag_lens.is_empty() {
            wire.len()
        } else {
            usize::from(*lens.next().unwrap()).max(1)
        };
        let mut piece = &wire[pos..(pos + len).min(wire.len())];
        pos += piece.len();
        loop {
            match reader.feed(piece) {
                Err(e) => {
                    o.error = Some(format!("{e:?}"));
                    break;
                }
                Ok((n, event)) => {
                    assert!(n <= piece.len());
                    piece = &piece[n..];
                    match event {
                        Some(Event::Stdout(b)) => {
                            o.stdout.extend_from_slice(b);
                            if o.head.is_none() {
                                match parser.feed(b) {
                                    Ok(Some((head, used))) => {
                                        assert!(used <= b.len());
                                        o.head = Some((head, b[used..].to_vec()));
                                    }
                                    Ok(None) => {}
                                    Err(e) => o.error = Some(format!("{e:?}")),
                                }
                            } else if let Some((_, body)) = o.head.as_mut() {
                                body.extend_from_slice(b);
                            }
                        }
                        Some(Event::Stderr(b)) => o.stderr.extend_from_slice(b),
                        Some(Event::End {
                            app_status,
                            protocol,
                        }) => o.end = Some((app_status, format!("{protocol:?}"))),
                        None => break,
                    }
                    if o.error.is_some() {
                        break;
                    }
                }
            }
        }
    }
    if let Some(error) = o.error {
        // What was handed on before the error depends on where the pieces ended; the error
        // itself must not.
        return Outcome {
            stdout: Vec::new(),
            stderr: Vec::new(),
            end: None,
            head: None,
            error: Some(error),
        };
    }
    o
}

/// The answer re-expressed as HTTP/1.1: whatever the application sent, a translation that
/// succeeds is one answer tern's own upstream parser reads whole, with nothing left over.
fn check_translation(wire: &[u8]) {
    let mut t = Http1Answer::new(1, false);
    let mut http = Vec::new();
    let Ok(used) = t.feed(wire, &mut |b| http.extend_from_slice(b)) else {
        return;
    };
    assert!(used <= wire.len());
    if !t.is_done() {
        return;
    }
    let mut headers = [MaybeUninit::uninit(); 128];
    let head = parse_upstream_head(&http, &mut headers, false, 1 << 20)
        .expect("a translated head parses")
        .expect("a translated head is complete");
    let body = &http[head.head_len..];
    match head.body {
        ResponseBody::Length(n) => assert_eq!(n as usize, body.len()),
        ResponseBody::Chunked => {
            let mut dec = tern_codec::ChunkedDecoder::new(u64::MAX);
            let step = dec.decode(body).expect("translated chunks decode");
            let mut rest = &body[step.consumed..];
            let mut done = step.done;
            while !done {
                let step = dec.decode(rest).expect("translated chunks decode");
                assert!(step.consumed > 0 || step.done, "stuck");
                rest = &rest[step.consumed..];
                done = step.done;
            }
            assert!(rest.is_empty(), "bytes after the last chunk");
        }
        ResponseBody::None => assert!(body.is_empty()),
        ResponseBody::UntilClose => panic!("a translated answer is always framed"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n).min(rest.len());
    let (frag_lens, wire) = rest.split_at(n);
    check_translation(wire);
    let whole = read(wire, &[]);
    let pieces = read(wire, frag_lens);
    assert_eq!(whole, pieces);
});
