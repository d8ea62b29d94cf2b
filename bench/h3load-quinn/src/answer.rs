//! An answer read from its request stream as it arrives, in whatever pieces QUIC hands over:
//! the HEADERS frame's `:status` decoded, the DATA frames' payload counted and dropped, any
//! other frame (trailers, unknown types) skipped.

use tern_http3::frame::{self, kind, MAX_HEADER_LEN};
use tern_http3::qpack;

/// A HEADERS payload longer than this is a broken server, not a benchmark.
const MAX_HEAD: u64 = 64 << 10;

#[derive(Default)]
pub struct AnswerReader {
    /// A frame header split between pieces, or the HEADERS payload gathered so far.
    partial: Vec<u8>,
    /// The HEADERS payload's length while it is gathered in `partial`.
    head_len: Option<usize>,
    /// Payload bytes of the current DATA (counted) or other frame (skipped) still to come.
    skip: u64,
    in_data: bool,
    scratch: (Vec<u8>, Vec<u8>),
    pub status: Option<u16>,
    /// DATA payload bytes so far.
    pub body: u64,
}

impl AnswerReader {
    /// Reads the next piece of the stream. Err: not an HTTP/3 answer.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), &'static str> {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len() as u64);
                if self.in_data {
                    self.body += n;
                }
                self.skip -= n;
                data = &data[n as usize..];
                continue;
            }
            if let Some(want) = self.head_len {
                let n = (want - self.partial.len()).min(data.len());
                self.partial.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.partial.len() == want {
                    self.decode_head()?;
                }
                continue;
            }
            let Some((ty, len, used)) = self.frame_header(data)? else {
                return Ok(()); // the rest of the header is in the next piece
            };
            data = &data[used..];
            match ty {
                kind::HEADERS if self.status.is_none() => {
                    if len == 0 || len > MAX_HEAD {
                        return Err("a HEADERS frame of no length or too long");
                    }
                    self.head_len = Some(len as usize);
                }
                kind::DATA if self.status.is_none() => return Err("DATA before HEADERS"),
                _ => {
                    self.in_data = ty == kind::DATA;
                    self.skip = len;
                }
            }
        }
        Ok(())
    }

    /// The stream ended: Ok when it ended after a whole answer.
    pub fn finish(&self) -> Result<(), &'static str> {
        match self.status {
            None => Err("the stream ended before the answer's head"),
            Some(_) if self.skip > 0 || !self.partial.is_empty() => {
                Err("the stream ended inside a frame")
            }
            Some(_) => Ok(()),
        }
    }

    /// A frame header from `partial` and the start of `data`: (type, length, bytes of `data`
    /// used), or None when `data` ends before the header does (kept in `partial`).
    fn frame_header(&mut self, data: &[u8]) -> Result<Option<(u64, u64, usize)>, &'static str> {
        if self.partial.is_empty() {
            if let Some(header) = frame::parse_header(data) {
                return Ok(Some(header));
            }
            self.partial.extend_from_slice(data);
            return Ok(None);
        }
        let had = self.partial.len();
        let take = data.len().min(MAX_HEADER_LEN - had);
        self.partial.extend_from_slice(&data[..take]);
        match frame::parse_header(&self.partial) {
            Some((ty, len, at)) => {
                self.partial.clear();
                Ok(Some((ty, len, at - had)))
            }
            None if self.partial.len() >= MAX_HEADER_LEN => Err("a malformed frame header"),
            None => Ok(None),
        }
    }

    fn decode_head(&mut self) -> Result<(), &'static str> {
        let mut status = None;
        qpack::decode_section(&self.partial, usize::MAX, &mut self.scratch, |n, v| {
            if n == b":status" {
                status = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok());
            }
            Ok(())
        })?;
        self.status = Some(status.ok_or("an answer without :status")?);
        self.partial.clear();
        self.head_len = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as a server writes it: HEADERS (`:status` and a field), an unknown frame,
    /// DATA in two frames.
    fn answer(status: u16, body: &[u8]) -> Vec<u8> {
        let mut section = Vec::new();
        qpack::begin_section(&mut section);
        qpack::encode_status(status, &mut section);
        qpack::encode_field(b"content-type", b"text/plain", false, &mut section);
        let mut out = Vec::new();
        frame::write_header(&mut out, kind::HEADERS, section.len() as u64);
        out.extend(section);
        frame::write_header(&mut out, 0x21, 3); // a reserved type: skipped
        out.extend(b"xyz");
        let (a, b) = body.split_at(body.len() / 2);
        for part in [a, b] {
            frame::write_header(&mut out, kind::DATA, part.len() as u64);
            out.extend(part);
        }
        out
    }

    #[test]
    fn an_answer_in_any_pieces_reads_alike() {
        let body = vec![7u8; 1000];
        let bytes = answer(200, &body);
        for piece in [1, 2, 3, 7, 100, bytes.len()] {
            let mut r = AnswerReader::default();
            for chunk in bytes.chunks(piece) {
                r.feed(chunk).unwrap();
            }
            r.finish().unwrap();
            assert_eq!((r.status, r.body), (Some(200), 1000), "pieces of {piece}");
        }
    }

    #[test]
    fn a_cut_or_headless_answer_is_refused() {
        let bytes = answer(404, b"gone");
        let mut r = AnswerReader::default();
        r.feed(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(r.status, Some(404));
        assert!(r.finish().is_err(), "ended inside the last DATA frame");

        let mut data_first = Vec::new();
        frame::write_header(&mut data_first, kind::DATA, 1);
        data_first.push(0);
        assert!(AnswerReader::default().feed(&data_first).is_err());
        assert!(AnswerReader::default().finish().is_err());
    }
}
