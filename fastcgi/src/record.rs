//! The record layer: every message is an 8-byte header (version 1, type, request id, content
//! length, padding length, reserved), its content (at most 65 535 bytes) and padding.

/// The length of a record header.
pub const HEADER_LEN: usize = 8;
/// The most content one record carries.
pub const MAX_CONTENT: usize = u16::MAX as usize;
const VERSION_1: u8 = 1;
/// `FCGI_RESPONDER`: the application answers a request (the role PHP-FPM plays).
const ROLE_RESPONDER: u16 = 1;
/// `FCGI_KEEP_CONN`: the application keeps the connection open after the request.
const FLAG_KEEP_CONN: u8 = 1;

/// The record types of FastCGI 1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordType {
    BeginRequest,
    AbortRequest,
    EndRequest,
    Params,
    Stdin,
    Stdout,
    Stderr,
    Data,
    GetValues,
    GetValuesResult,
    UnknownType,
    /// A type this version does not define.
    Other(u8),
}

impl RecordType {
    pub fn from_byte(b: u8) -> RecordType {
        match b {
            1 => RecordType::BeginRequest,
            2 => RecordType::AbortRequest,
            3 => RecordType::EndRequest,
            4 => RecordType::Params,
            5 => RecordType::Stdin,
            6 => RecordType::Stdout,
            7 => RecordType::Stderr,
            8 => RecordType::Data,
            9 => RecordType::GetValues,
            10 => RecordType::GetValuesResult,
            11 => RecordType::UnknownType,
            other => RecordType::Other(other),
        }
    }

    pub fn to_byte(self) -> u8 {
        match self {
            RecordType::BeginRequest => 1,
            RecordType::AbortRequest => 2,
            RecordType::EndRequest => 3,
            RecordType::Params => 4,
            RecordType::Stdin => 5,
            RecordType::Stdout => 6,
            RecordType::Stderr => 7,
            RecordType::Data => 8,
            RecordType::GetValues => 9,
            RecordType::GetValuesResult => 10,
            RecordType::UnknownType => 11,
            RecordType::Other(b) => b,
        }
    }
}

/// A record header as read from the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub kind: RecordType,
    pub request_id: u16,
    pub content_len: u16,
    pub padding_len: u8,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        Header {
            version: b[0],
            kind: RecordType::from_byte(b[1]),
            request_id: u16::from_be_bytes([b[2], b[3]]),
            content_len: u16::from_be_bytes([b[4], b[5]]),
            padding_len: b[6],
        }
    }
}

/// Appends one record header for `content_len` bytes of content and no padding.
fn put_header(out: &mut Vec<u8>, kind: RecordType, request_id: u16, content_len: usize) {
    debug_assert!(content_len <= MAX_CONTENT);
    let [id_hi, id_lo] = request_id.to_be_bytes();
    let [len_hi, len_lo] = (content_len as u16).to_be_bytes();
    out.extend_from_slice(&[
        VERSION_1,
        kind.to_byte(),
        id_hi,
        id_lo,
        len_hi,
        len_lo,
        0,
        0,
    ]);
}

/// Appends `BEGIN_REQUEST` in the responder role; with `keep_conn` the application keeps the
/// connection for the next request (pooled), else it closes it after this one.
pub fn begin_request(out: &mut Vec<u8>, request_id: u16, keep_conn: bool) {
    put_header(out, RecordType::BeginRequest, request_id, 8);
    let [role_hi, role_lo] = ROLE_RESPONDER.to_be_bytes();
    let flags = if keep_conn { FLAG_KEEP_CONN } else { 0 };
    out.extend_from_slice(&[role_hi, role_lo, flags, 0, 0, 0, 0, 0]);
}

/// Appends `data` as records of `kind`, each at most [`MAX_CONTENT`] bytes. Empty `data`
/// appends the one empty record that ends the stream.
pub(crate) fn stream(out: &mut Vec<u8>, kind: RecordType, request_id: u16, data: &[u8]) {
    if data.is_empty() {
        put_header(out, kind, request_id, 0);
        return;
    }
    out.reserve(data.len() + data.len().div_ceil(MAX_CONTENT) * HEADER_LEN);
    for piece in data.chunks(MAX_CONTENT) {
        put_header(out, kind, request_id, piece.len());
        out.extend_from_slice(piece);
    }
}

/// Appends request body bytes as `STDIN` records; empty `data` ends the body (every request
/// ends its `STDIN`, even one without a body).
pub fn stdin(out: &mut Vec<u8>, request_id: u16, data: &[u8]) {
    stream(out, RecordType::Stdin, request_id, data);
}

/// Appends `ABORT_REQUEST`: the client went away; the application should stop.
pub fn abort_request(out: &mut Vec<u8>, request_id: u16) {
    put_header(out, RecordType::AbortRequest, request_id, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_request_is_the_responder_role_with_the_keep_flag() {
        let mut out = Vec::new();
        begin_request(&mut out, 1, true);
        assert_eq!(
            out,
            [1, 1, 0, 1, 0, 8, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
            "header, then role 1, flags 1, 5 reserved"
        );
        out.clear();
        begin_request(&mut out, 0x0102, false);
        assert_eq!(&out[2..4], &[1, 2]);
        assert_eq!(out[10], 0);
    }

    #[test]
    fn a_long_stream_is_split_at_the_record_limit_and_an_empty_one_ends_it() {
        let data = vec![7u8; MAX_CONTENT + 10];
        let mut out = Vec::new();
        stdin(&mut out, 1, &data);
        stdin(&mut out, 1, &[]);
        let first = Header::parse(out[..8].try_into().unwrap());
        assert_eq!(first.kind, RecordType::Stdin);
        assert_eq!(first.content_len as usize, MAX_CONTENT);
        let at = HEADER_LEN + MAX_CONTENT;
        let second = Header::parse(out[at..at + 8].try_into().unwrap());
        assert_eq!(second.content_len, 10);
        let end = Header::parse(out[out.len() - 8..].try_into().unwrap());
        assert_eq!(end.content_len, 0);
        assert_eq!(out.len(), 3 * HEADER_LEN + data.len());
    }

    #[test]
    fn every_type_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(RecordType::from_byte(b).to_byte(), b);
        }
    }
}
