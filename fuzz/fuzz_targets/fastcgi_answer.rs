//! A FastCGI application's answer on arbitrary input under arbitrary fragmentation: the record
//! reader feeds `STDOUT` to the CGI head parser, as the proxy does. The first byte says how
//! many of the following bytes are fragment lengths; the rest is the wire. Nothing may panic,
//! and the outcome (stdout, stderr, end and head, or else the first error) must be the same as
//! reading the wire in one piece.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_fastcgi::{AnswerReader, CgiHead, CgiHeadParser, Event};

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

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n).min(rest.len());
    let (frag_lens, wire) = rest.split_at(n);
    let whole = read(wire, &[]);
    let pieces = read(wire, frag_lens);
    assert_eq!(whole, pieces);
});
