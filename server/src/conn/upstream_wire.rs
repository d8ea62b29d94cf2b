//! What goes over an upstream connection: HTTP/1.1, or FastCGI (PHP-FPM). A FastCGI
//! request's body goes out as `STDIN` records, and its answer is re-expressed as HTTP/1.1 as
//! it arrives (`tern_fastcgi::Http1Answer`), so the relay judges, re-frames and pools both on
//! one path rather than two that could disagree.

use tern_fastcgi::{Http1Answer, TranslateError};
use tern_runtime::{BufPool, ReadBuf};

/// How request body bytes are framed for the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyFraming {
    /// As they are (the head declared the length).
    Plain,
    /// HTTP/1.1 chunks, ended by the last chunk.
    Chunked,
    /// FastCGI `STDIN` records, ended by an empty one.
    FastCgi,
}

impl BodyFraming {
    pub fn push(self, to_up: &mut Vec<u8>, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        match self {
            BodyFraming::Plain => to_up.extend_from_slice(data),
            BodyFraming::Chunked => {
                let mut size = [0; 18];
                to_up.extend_from_slice(chunk_size_line(data.len(), &mut size));
                to_up.extend_from_slice(data);
                to_up.extend_from_slice(b"\r\n");
            }
            BodyFraming::FastCgi => {
                tern_fastcgi::stdin(to_up, tern_fastcgi::REQUEST_ID, data);
            }
        }
    }

    /// What ends the body.
    pub fn finish(self, to_up: &mut Vec<u8>) {
        match self {
            BodyFraming::Plain => {}
            BodyFraming::Chunked => to_up.extend_from_slice(b"0\r\n\r\n"),
            BodyFraming::FastCgi => tern_fastcgi::stdin(to_up, tern_fastcgi::REQUEST_ID, &[]),
        }
    }
}

/// The FastCGI side of one attempt: the application's records as read, and the HTTP/1.1
/// answer they make, appended to the relay's answer buffer.
pub(super) struct FastCgiAnswer {
    answer: Http1Answer,
    head_only: bool,
    /// Records read but not yet re-expressed (pooled; absent between reads).
    raw: Option<ReadBuf>,
    /// Bytes came after `END_REQUEST`: the connection is out of step.
    leftover: bool,
}

impl FastCgiAnswer {
    pub fn new(head_only: bool) -> FastCgiAnswer {
        FastCgiAnswer {
            answer: Http1Answer::new(tern_fastcgi::REQUEST_ID, head_only),
            head_only,
            raw: None,
            leftover: false,
        }
    }

    /// A new attempt (another connection): nothing of the last one counts.
    pub fn reset(&mut self) {
        self.answer = Http1Answer::new(tern_fastcgi::REQUEST_ID, self.head_only);
        self.leftover = false;
        if let Some(b) = self.raw.as_mut() {
            b.consume(b.len());
        }
    }

    /// Where to read the application's records: at most `max` bytes.
    pub fn recv_buf(&mut self, max: usize, pool: &mut BufPool) -> &mut [u8] {
        let raw = self.raw.get_or_insert_with(|| pool.take_read());
        let spare = raw.spare_mut();
        let n = spare.len().min(max);
        &mut spare[..n]
    }

    /// `n` bytes were read into `recv_buf`: what they complete goes into `http`.
    pub fn filled(&mut self, n: usize, http: &mut ReadBuf) -> Result<(), TranslateError> {
        let Some(raw) = self.raw.as_mut() else {
            return Ok(());
        };
        raw.filled(n);
        let used = self
            .answer
            .feed(raw.data(), &mut |bytes| append(http, bytes))?;
        raw.consume(used);
        if self.answer.is_done() && !raw.is_empty() {
            self.leftover = true;
            raw.consume(raw.len());
        }
        Ok(())
    }

    /// The answer ended with `END_REQUEST` and nothing followed it: the connection can
    /// carry the next request.
    pub fn ended_cleanly(&self) -> bool {
        self.answer.is_done() && !self.leftover
    }

    /// The start of what the application wrote to its error stream, for the log.
    pub fn take_stderr(&mut self) -> Vec<u8> {
        self.answer.take_stderr()
    }

    pub fn recycle(&mut self, pool: &mut BufPool) {
        if let Some(b) = self.raw.take() {
            pool.give_read(b);
        }
    }
}

/// Appends `bytes` to the data of `buf`, growing it if they do not fit.
fn append(buf: &mut ReadBuf, bytes: &[u8]) {
    buf.compact();
    if buf.capacity() - buf.len() < bytes.len() {
        buf.grow_to(buf.len() + bytes.len());
    }
    buf.spare_mut()[..bytes.len()].copy_from_slice(bytes);
    buf.filled(bytes.len());
}

/// `n` in hex and CRLF: a chunk's size line.
pub(super) fn chunk_size_line(n: usize, buf: &mut [u8; 18]) -> &[u8] {
    let mut i = 16;
    let mut v = n;
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[v & 15];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    buf[16] = b'\r';
    buf[17] = b'\n';
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_framed_for_their_wire() {
        let mut out = Vec::new();
        BodyFraming::Chunked.push(&mut out, b"abc");
        BodyFraming::Chunked.finish(&mut out);
        assert_eq!(out, b"3\r\nabc\r\n0\r\n\r\n");
        out.clear();
        BodyFraming::FastCgi.push(&mut out, b"abc");
        BodyFraming::FastCgi.finish(&mut out);
        assert_eq!(
            out,
            [1, 5, 0, 1, 0, 3, 0, 0, b'a', b'b', b'c', 1, 5, 0, 1, 0, 0, 0, 0]
        );
        out.clear();
        BodyFraming::Plain.push(&mut out, b"abc");
        BodyFraming::Plain.finish(&mut out);
        assert_eq!(out, b"abc");
    }

    #[test]
    fn records_read_in_pieces_become_an_http_answer_that_grows_its_buffer() {
        let mut pool = BufPool::new(64, 64, 4);
        let mut http = pool.take_read();
        let mut a = FastCgiAnswer::new(false);
        let mut wire = vec![1, 6, 0, 1, 0, 0, 0, 0];
        let content = [b"Content-Type: text/plain\r\n\r\n".as_slice(), &[b'x'; 200]].concat();
        wire[4..6].copy_from_slice(&(content.len() as u16).to_be_bytes());
        wire.extend_from_slice(&content);
        wire.extend_from_slice(&[1, 3, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        wire.extend_from_slice(b"late");
        let mut rest = &wire[..];
        while !rest.is_empty() {
            let buf = a.recv_buf(rest.len(), &mut pool);
            let n = buf.len().min(rest.len());
            buf[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            a.filled(n, &mut http).unwrap();
        }
        let text = String::from_utf8_lossy(http.data()).into_owned();
        assert!(
            text.starts_with(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("\r\n0\r\n\r\n"), "{text}");
        assert!(!a.ended_cleanly(), "bytes after the end");
    }
}
