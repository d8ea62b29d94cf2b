//! A FastCGI answer re-expressed as an HTTP/1.1 answer, as it arrives. The proxy then judges
//! it on its one answer path, with the same head checks, field rules and re-framing as any
//! upstream's, instead of a second path that could judge differently.
//!
//! The HTTP/1.1 answer ends only when `END_REQUEST` has been read (the last bytes of a sized
//! body, or a bodiless head, wait for it): once the proxy sees the answer end, nothing of the
//! request is left on the connection, so it can be pooled for the next one.

use crate::answer::{AnswerError, AnswerReader, Event, ProtocolStatus};
use crate::cgi::{CgiError, CgiHeadParser};

/// How much of the application's error stream is kept for the log line.
const MAX_STDERR: usize = 1024;

/// Why an answer could not be re-expressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranslateError {
    Answer(AnswerError),
    Head(CgiError),
    /// The application ended the request without an answer because it is busy
    /// (`FCGI_OVERLOADED`, or it does not multiplex).
    Overloaded,
    /// The request ended without an answer, or inside its head.
    NoAnswer,
    /// The body was longer or shorter than the application's own Content-Length.
    Length,
}

impl TranslateError {
    pub fn message(self) -> &'static str {
        match self {
            TranslateError::Answer(e) => e.message(),
            TranslateError::Head(e) => e.message(),
            TranslateError::Overloaded => "FastCGI application overloaded",
            TranslateError::NoAnswer => "FastCGI request ended without an answer",
            TranslateError::Length => "FastCGI answer does not match its Content-Length",
        }
    }
}

#[derive(Debug)]
enum Body {
    /// The head is still being read.
    Head(CgiHeadParser),
    /// Sized by the application: this much is still to come.
    Length(u64),
    Chunked,
    /// No body may be sent (HEAD, 204, 304): what the application writes is dropped.
    Dropped,
}

/// Reads one request's records and writes the HTTP/1.1 answer they make.
#[derive(Debug)]
pub struct Http1Answer {
    reader: AnswerReader,
    body: Body,
    head_only: bool,
    stderr: Vec<u8>,
    /// The bytes that end the HTTP/1.1 answer, held until `END_REQUEST`.
    held: Vec<u8>,
    /// `END_REQUEST` was read and the answer ended.
    done: bool,
}

impl Http1Answer {
    /// `head_only`: the request was HEAD (the answer has no body, whatever the script says).
    pub fn new(request_id: u16, head_only: bool) -> Http1Answer {
        Http1Answer {
            reader: AnswerReader::new(request_id),
            body: Body::Head(CgiHeadParser::new()),
            head_only,
            stderr: Vec::new(),
            held: Vec::new(),
            done: false,
        }
    }

    /// The answer is complete: nothing more belongs to this request.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The start of what the application wrote to its error stream (PHP warnings), for a log
    /// line; empty if nothing.
    pub fn take_stderr(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.stderr)
    }

    /// Reads records from `input`, handing the HTTP/1.1 bytes they make to `emit`. Returns
    /// how much of `input` was used: all of it, unless the answer ended (what follows belongs
    /// to no request).
    pub fn feed(
        &mut self,
        input: &[u8],
        emit: &mut impl FnMut(&[u8]),
    ) -> Result<usize, TranslateError> {
        let mut used = 0;
        while !self.done {
            let (n, event) = self
                .reader
                .feed(&input[used..])
                .map_err(TranslateError::Answer)?;
            used += n;
            match event {
                None => break,
                Some(Event::Stdout(bytes)) => self.stdout(bytes, emit)?,
                Some(Event::Stderr(bytes)) => {
                    let room = MAX_STDERR.saturating_sub(self.stderr.len());
                    self.stderr
                        .extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Some(Event::End { protocol, .. }) => self.end(protocol, emit)?,
            }
        }
        Ok(used)
    }

    fn stdout(&mut self, bytes: &[u8], emit: &mut impl FnMut(&[u8])) -> Result<(), TranslateError> {
        let rest = match &mut self.body {
            Body::Head(parser) => {
                let Some((head, used)) = parser.feed(bytes).map_err(TranslateError::Head)? else {
                    return Ok(());
                };
                let no_body = self.head_only || head.status == 204 || head.status == 304;
                let mut line = Vec::with_capacity(256);
                line.extend_from_slice(b"HTTP/1.1 ");
                line.extend_from_slice(head.status.to_string().as_bytes());
                line.push(b' ');
                line.extend_from_slice(tern_codec::reason_phrase(head.status).as_bytes());
                line.extend_from_slice(b"\r\n");
                for (name, value) in &head.fields {
                    line.extend_from_slice(name);
                    line.extend_from_slice(b": ");
                    line.extend_from_slice(value);
                    line.extend_from_slice(b"\r\n");
                }
                self.body = match head.content_length {
                    _ if no_body => Body::Dropped,
                    Some(n) => Body::Length(n),
                    None => {
                        line.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                        Body::Chunked
                    }
                };
                line.extend_from_slice(b"\r\n");
                match self.body {
                    Body::Dropped | Body::Length(0) => self.held = line,
                    _ => emit(&line),
                }
                &bytes[used..]
            }
            _ => bytes,
        };
        self.body_bytes(rest, emit)
    }

    fn body_bytes(
        &mut self,
        bytes: &[u8],
        emit: &mut impl FnMut(&[u8]),
    ) -> Result<(), TranslateError> {
        if bytes.is_empty() {
            return Ok(());
        }
        match &mut self.body {
            Body::Head(_) | Body::Dropped => {}
            Body::Length(left) => {
                if bytes.len() as u64 > *left {
                    return Err(TranslateError::Length);
                }
                *left -= bytes.len() as u64;
                if *left == 0 {
                    self.held.extend_from_slice(bytes);
                } else {
                    emit(bytes);
                }
            }
            Body::Chunked => {
                emit(format!("{:x}\r\n", bytes.len()).as_bytes());
                emit(bytes);
                emit(b"\r\n");
            }
        }
        Ok(())
    }

    fn end(
        &mut self,
        protocol: ProtocolStatus,
        emit: &mut impl FnMut(&[u8]),
    ) -> Result<(), TranslateError> {
        self.done = true;
        match (&self.body, protocol) {
            (Body::Head(_), ProtocolStatus::Overloaded | ProtocolStatus::CantMpxConn) => {
                Err(TranslateError::Overloaded)
            }
            (Body::Head(_), _) => Err(TranslateError::NoAnswer),
            (Body::Length(left), _) if *left > 0 => Err(TranslateError::Length),
            (Body::Chunked, _) => {
                emit(b"0\r\n\r\n");
                Ok(())
            }
            _ => {
                emit(&std::mem::take(&mut self.held));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![1, kind, 0, 1];
        out.extend_from_slice(&(content.len() as u16).to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(content);
        out
    }

    fn end(protocol: u8) -> Vec<u8> {
        record(3, &[0, 0, 0, 0, protocol, 0, 0, 0])
    }

    fn translate(wire: &[u8], head_only: bool) -> Result<Vec<u8>, TranslateError> {
        translate_in(wire, head_only, wire.len())
    }

    fn translate_in(wire: &[u8], head_only: bool, step: usize) -> Result<Vec<u8>, TranslateError> {
        let mut t = Http1Answer::new(1, head_only);
        let mut out = Vec::new();
        for piece in wire.chunks(step) {
            t.feed(piece, &mut |b| out.extend_from_slice(b))?;
        }
        assert!(t.is_done());
        Ok(out)
    }

    #[test]
    fn an_unsized_answer_is_chunked_and_ended() {
        let mut wire = record(
            6,
            b"Content-Type: text/html\r\nX-Powered-By: PHP\r\n\r\n<p>",
        );
        wire.extend(record(7, b"PHP Warning: x"));
        wire.extend(record(6, b"hi</p>"));
        wire.extend(record(6, b""));
        wire.extend(end(0));
        let out = translate(&wire, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Powered-By: PHP\r\n\
             Transfer-Encoding: chunked\r\n\r\n3\r\n<p>\r\n6\r\nhi</p>\r\n0\r\n\r\n"
        );
        // In small pieces: smaller chunks, the same answer.
        let out = translate_in(&wire, false, 5).unwrap();
        let (head, body) = out.split_at(memchr::memmem::find(&out, b"\r\n\r\n").unwrap() + 4);
        assert!(head.ends_with(b"Transfer-Encoding: chunked\r\n\r\n"));
        let mut dec = tern_codec::ChunkedDecoder::new(u64::MAX);
        let mut got = Vec::new();
        let mut rest = body;
        loop {
            let step = dec.decode(rest).unwrap();
            got.extend_from_slice(step.data);
            rest = &rest[step.consumed..];
            if step.done {
                break;
            }
        }
        assert_eq!((got.as_slice(), rest), (&b"<p>hi</p>"[..], &b""[..]));
    }

    #[test]
    fn a_sized_answer_passes_as_it_is_and_must_match_its_length() {
        let mut wire = record(6, b"Status: 201 Created\r\nContent-Length: 4\r\n\r\nbody");
        wire.extend(end(0));
        assert_eq!(
            translate(&wire, false).unwrap(),
            b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nbody"
        );
        let mut short = record(6, b"Content-Length: 5\r\n\r\nbody");
        short.extend(end(0));
        assert_eq!(
            translate(&short, false).unwrap_err(),
            TranslateError::Length
        );
        let mut long = record(6, b"Content-Length: 3\r\n\r\nbody");
        long.extend(end(0));
        assert_eq!(translate(&long, false).unwrap_err(), TranslateError::Length);
    }

    #[test]
    fn head_204_and_304_answers_carry_no_body() {
        let mut wire = record(6, b"Content-Type: text/plain\r\n\r\nignored");
        wire.extend(end(0));
        assert_eq!(
            translate(&wire, true).unwrap(),
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
        );
        let mut wire = record(6, b"Status: 304 Not Modified\r\n\r\n");
        wire.extend(end(0));
        assert_eq!(
            translate(&wire, false).unwrap(),
            b"HTTP/1.1 304 Not Modified\r\n\r\n"
        );
    }

    #[test]
    fn an_end_without_an_answer_says_why() {
        assert_eq!(
            translate(&end(2), false).unwrap_err(),
            TranslateError::Overloaded
        );
        assert_eq!(
            translate(&end(0), false).unwrap_err(),
            TranslateError::NoAnswer
        );
        let mut wire = record(6, b"Content-Type: te");
        wire.extend(end(0));
        assert_eq!(
            translate(&wire, false).unwrap_err(),
            TranslateError::NoAnswer
        );
    }

    #[test]
    fn stderr_is_kept_for_the_log_but_bounded() {
        let mut wire = Vec::new();
        for _ in 0..10 {
            wire.extend(record(7, &[b'e'; 500]));
        }
        wire.extend(record(6, b"Content-Length: 0\r\n\r\n"));
        wire.extend(end(0));
        let mut t = Http1Answer::new(1, false);
        t.feed(&wire, &mut |_| {}).unwrap();
        assert_eq!(t.take_stderr().len(), MAX_STDERR);
    }

    #[test]
    fn the_answer_ends_only_with_end_request() {
        let mut t = Http1Answer::new(1, false);
        let mut out = Vec::new();
        t.feed(&record(6, b"Content-Length: 4\r\n\r\nbo"), &mut |b| {
            out.extend_from_slice(b)
        })
        .unwrap();
        t.feed(&record(6, b"dy"), &mut |b| out.extend_from_slice(b))
            .unwrap();
        assert_eq!(out, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbo");
        t.feed(&end(0), &mut |b| out.extend_from_slice(b)).unwrap();
        assert!(out.ends_with(b"body"));
        let mut t = Http1Answer::new(1, true);
        let mut out = Vec::new();
        t.feed(&record(6, b"X: y\r\n\r\n"), &mut |b| {
            out.extend_from_slice(b)
        })
        .unwrap();
        assert!(out.is_empty(), "a bodiless head waits for the end");
        t.feed(&end(0), &mut |b| out.extend_from_slice(b)).unwrap();
        assert_eq!(out, b"HTTP/1.1 200 OK\r\nX: y\r\n\r\n");
    }

    #[test]
    fn bytes_after_the_end_are_left_to_the_caller() {
        let mut wire = record(6, b"Content-Length: 0\r\n\r\n");
        wire.extend(end(0));
        let n = wire.len();
        wire.extend_from_slice(b"junk");
        let mut t = Http1Answer::new(1, false);
        assert_eq!(t.feed(&wire, &mut |_| {}).unwrap(), n);
    }
}
