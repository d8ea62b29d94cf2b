//! The application's records for one request, read as they arrive: a record's content is
//! handed on in whatever pieces the transport delivers, so a large answer is never held whole.

use crate::record::{Header, RecordType, HEADER_LEN};

/// What the application reported at the end of a request (`FCGI_END_REQUEST`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolStatus {
    RequestComplete,
    /// The application takes one request per connection at a time.
    CantMpxConn,
    /// Out of workers or memory: worth another server, or a 503.
    Overloaded,
    UnknownRole,
    Other(u8),
}

impl ProtocolStatus {
    fn from_byte(b: u8) -> ProtocolStatus {
        match b {
            0 => ProtocolStatus::RequestComplete,
            1 => ProtocolStatus::CantMpxConn,
            2 => ProtocolStatus::Overloaded,
            3 => ProtocolStatus::UnknownRole,
            other => ProtocolStatus::Other(other),
        }
    }
}

/// One step of the answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// Bytes of the CGI answer (head, then body).
    Stdout(&'a [u8]),
    /// Bytes of the application's error stream (PHP notices): for the log, never the client.
    Stderr(&'a [u8]),
    /// The request is over; nothing more belongs to it.
    End {
        app_status: u32,
        protocol: ProtocolStatus,
    },
}

/// The application broke the protocol; the answer cannot be trusted (a 502, and the
/// connection is not reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerError {
    Version(u8),
    /// A record for another request (tern sends one request per connection at a time).
    RequestId(u16),
    /// A record type an application does not send to a responder's client.
    Unexpected(u8),
    /// `END_REQUEST` with a body other than 8 bytes.
    BadEnd,
}

impl AnswerError {
    pub fn message(self) -> &'static str {
        match self {
            AnswerError::Version(_) => "FastCGI record of an unknown version",
            AnswerError::RequestId(_) => "FastCGI record for another request",
            AnswerError::Unexpected(_) => "unexpected FastCGI record type",
            AnswerError::BadEnd => "malformed FastCGI END_REQUEST",
        }
    }
}

#[derive(Debug)]
enum State {
    /// Reading a record header; `have` bytes of it so far.
    Header {
        buf: [u8; HEADER_LEN],
        have: usize,
    },
    /// Inside a `STDOUT`/`STDERR` record's content.
    Content {
        stdout: bool,
        left: usize,
        padding: usize,
    },
    /// Inside `END_REQUEST`'s 8-byte body.
    End {
        buf: [u8; 8],
        have: usize,
        padding: usize,
    },
    Padding {
        left: usize,
    },
    /// `END_REQUEST` was read (and its padding skipped).
    Done,
}

/// Reads the records of one request.
#[derive(Debug)]
pub struct AnswerReader {
    request_id: u16,
    state: State,
    /// `END_REQUEST` was seen; its padding may still follow.
    ended: bool,
}

impl AnswerReader {
    pub fn new(request_id: u16) -> AnswerReader {
        AnswerReader {
            request_id,
            state: State::Header {
                buf: [0; HEADER_LEN],
                have: 0,
            },
            ended: false,
        }
    }

    /// True once `END_REQUEST` and its padding have been read: bytes after that belong to no
    /// request (the caller treats them as a broken connection).
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Reads from `input`; returns how much it took and at most one event, which borrows
    /// `input`. Call again with the rest until it takes nothing.
    pub fn feed<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Option<Event<'a>>), AnswerError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match &mut self.state {
                State::Done => return Ok((used, None)),
                _ if rest.is_empty() => return Ok((used, None)),
                State::Header { buf, have } => {
                    let take = (HEADER_LEN - *have).min(rest.len());
                    buf[*have..*have + take].copy_from_slice(&rest[..take]);
                    *have += take;
                    used += take;
                    if *have == HEADER_LEN {
                        let header = Header::parse(buf);
                        self.state = self.after_header(header)?;
                    }
                }
                State::Content {
                    stdout,
                    left,
                    padding,
                } => {
                    let take = (*left).min(rest.len());
                    let piece = &rest[..take];
                    let stdout = *stdout;
                    *left -= take;
                    used += take;
                    if *left == 0 {
                        self.state = State::Padding { left: *padding };
                    }
                    let event = if stdout {
                        Event::Stdout(piece)
                    } else {
                        Event::Stderr(piece)
                    };
                    return Ok((used, Some(event)));
                }
                State::End { buf, have, padding } => {
                    let take = (8 - *have).min(rest.len());
                    buf[*have..*have + take].copy_from_slice(&rest[..take]);
                    *have += take;
                    used += take;
                    if *have == 8 {
                        let app_status = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
                        let protocol = ProtocolStatus::from_byte(buf[4]);
                        self.ended = true;
                        self.state = State::Padding { left: *padding };
                        self.settle_padding();
                        return Ok((
                            used,
                            Some(Event::End {
                                app_status,
                                protocol,
                            }),
                        ));
                    }
                }
                State::Padding { left } => {
                    let take = (*left).min(rest.len());
                    *left -= take;
                    used += take;
                    self.settle_padding();
                }
            }
        }
    }

    /// After padding (or none): the next header, or done after `END_REQUEST`.
    fn settle_padding(&mut self) {
        if let State::Padding { left: 0 } = self.state {
            self.state = if self.ended {
                State::Done
            } else {
                State::Header {
                    buf: [0; HEADER_LEN],
                    have: 0,
                }
            };
        }
    }

    fn after_header(&self, h: Header) -> Result<State, AnswerError> {
        if h.version != 1 {
            return Err(AnswerError::Version(h.version));
        }
        if h.request_id != self.request_id {
            return Err(AnswerError::RequestId(h.request_id));
        }
        let padding = h.padding_len as usize;
        let content = h.content_len as usize;
        Ok(match h.kind {
            RecordType::Stdout | RecordType::Stderr if content == 0 => {
                // The empty record that ends a stream: nothing to hand on.
                State::Padding { left: padding }
            }
            RecordType::Stdout | RecordType::Stderr => State::Content {
                stdout: h.kind == RecordType::Stdout,
                left: content,
                padding,
            },
            RecordType::EndRequest if content == 8 => State::End {
                buf: [0; 8],
                have: 0,
                padding,
            },
            RecordType::EndRequest => return Err(AnswerError::BadEnd),
            other => return Err(AnswerError::Unexpected(other.to_byte())),
        })
        .map(|state| match state {
            State::Padding { left: 0 } => State::Header {
                buf: [0; HEADER_LEN],
                have: 0,
            },
            state => state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, id: u16, content: &[u8], padding: u8) -> Vec<u8> {
        let mut out = vec![1, kind];
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&(content.len() as u16).to_be_bytes());
        out.extend_from_slice(&[padding, 0]);
        out.extend_from_slice(content);
        out.extend(std::iter::repeat_n(0xEE, padding as usize));
        out
    }

    fn answer() -> Vec<u8> {
        let mut wire = record(
            6,
            1,
            b"Status: 200 OK\r\nContent-Type: text/plain\r\n\r\nhel",
            5,
        );
        wire.extend(record(7, 1, b"PHP Notice: x", 3));
        wire.extend(record(6, 1, b"lo", 0));
        wire.extend(record(6, 1, b"", 0));
        wire.extend(record(3, 1, &[0, 0, 0, 7, 0, 0, 0, 0], 0));
        wire
    }

    /// Reads `wire` delivered in pieces of `step` bytes; returns stdout, stderr and the end.
    fn read_in_steps(
        wire: &[u8],
        step: usize,
    ) -> (Vec<u8>, Vec<u8>, Option<(u32, ProtocolStatus)>) {
        let mut r = AnswerReader::new(1);
        let (mut out, mut err, mut end) = (Vec::new(), Vec::new(), None);
        for piece in wire.chunks(step) {
            let mut rest = piece;
            loop {
                let (n, event) = r.feed(rest).unwrap();
                rest = &rest[n..];
                match event {
                    Some(Event::Stdout(b)) => out.extend_from_slice(b),
                    Some(Event::Stderr(b)) => err.extend_from_slice(b),
                    Some(Event::End {
                        app_status,
                        protocol,
                    }) => end = Some((app_status, protocol)),
                    None => break,
                }
            }
            assert!(rest.is_empty() || r.is_done());
        }
        assert!(r.is_done());
        (out, err, end)
    }

    #[test]
    fn an_answer_reads_the_same_in_any_pieces() {
        let wire = answer();
        for step in [1, 2, 3, 7, 8, 9, 64, wire.len()] {
            let (out, err, end) = read_in_steps(&wire, step);
            assert_eq!(
                out, b"Status: 200 OK\r\nContent-Type: text/plain\r\n\r\nhello",
                "step {step}"
            );
            assert_eq!(err, b"PHP Notice: x");
            assert_eq!(end, Some((7, ProtocolStatus::RequestComplete)));
        }
    }

    #[test]
    fn content_is_handed_on_before_its_record_is_complete() {
        let wire = record(6, 1, &[b'x'; 1000], 0);
        let mut r = AnswerReader::new(1);
        let (n, ev) = r.feed(&wire[..8 + 10]).unwrap();
        assert_eq!((n, ev), (18, Some(Event::Stdout(&[b'x'; 10][..]))));
    }

    #[test]
    fn protocol_violations_are_errors() {
        let mut r = AnswerReader::new(1);
        let mut bad = record(6, 1, b"x", 0);
        bad[0] = 2;
        assert_eq!(r.feed(&bad).unwrap_err(), AnswerError::Version(2));
        let mut r = AnswerReader::new(1);
        assert_eq!(
            r.feed(&record(6, 2, b"x", 0)).unwrap_err(),
            AnswerError::RequestId(2)
        );
        let mut r = AnswerReader::new(1);
        assert_eq!(
            r.feed(&record(10, 1, b"", 0)).unwrap_err(),
            AnswerError::Unexpected(10)
        );
        let mut r = AnswerReader::new(1);
        assert_eq!(
            r.feed(&record(3, 1, &[0; 4], 0)).unwrap_err(),
            AnswerError::BadEnd
        );
    }

    #[test]
    fn overloaded_is_reported_and_nothing_is_read_past_the_end() {
        let mut wire = record(3, 1, &[0, 0, 0, 0, 2, 0, 0, 0], 2);
        wire.extend_from_slice(b"trailing");
        let mut r = AnswerReader::new(1);
        let (n, ev) = r.feed(&wire).unwrap();
        assert_eq!(
            ev,
            Some(Event::End {
                app_status: 0,
                protocol: ProtocolStatus::Overloaded
            })
        );
        assert_eq!(n, 8 + 8);
        let (m, ev) = r.feed(&wire[n..]).unwrap();
        assert_eq!((m, ev), (2, None), "the padding, then nothing past the end");
        assert!(r.is_done());
        assert_eq!(r.feed(b"more").unwrap(), (0, None));
    }
}
