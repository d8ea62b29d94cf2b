//! HTTP/3 frames (RFC 9114 §7), stream types (§6.2), settings (§7.2.4.1) and error codes
//! (§8.1, RFC 9204 §6). A frame is `type (varint) length (varint) payload`.

use crate::varint;

/// Frame types (§7.2, §11.2.1).
pub mod kind {
    pub const DATA: u64 = 0x00;
    pub const HEADERS: u64 = 0x01;
    pub const CANCEL_PUSH: u64 = 0x03;
    pub const SETTINGS: u64 = 0x04;
    pub const PUSH_PROMISE: u64 = 0x05;
    pub const GOAWAY: u64 = 0x07;
    pub const MAX_PUSH_ID: u64 = 0x0d;

    /// HTTP/2 frame types with no HTTP/3 meaning (PRIORITY, PING, WINDOW_UPDATE,
    /// CONTINUATION): reserved, and an error wherever they arrive (§7.2.8).
    pub fn is_http2_only(kind: u64) -> bool {
        matches!(kind, 0x02 | 0x06 | 0x08 | 0x09)
    }
}

/// Unidirectional stream types (§6.2, RFC 9204 §4.2).
pub mod stream_type {
    pub const CONTROL: u64 = 0x00;
    pub const PUSH: u64 = 0x01;
    pub const QPACK_ENCODER: u64 = 0x02;
    pub const QPACK_DECODER: u64 = 0x03;
}

/// Setting identifiers (§7.2.4.1, RFC 9204 §5, RFC 9220 §3).
pub mod setting {
    pub const QPACK_MAX_TABLE_CAPACITY: u64 = 0x01;
    pub const MAX_FIELD_SECTION_SIZE: u64 = 0x06;
    pub const QPACK_BLOCKED_STREAMS: u64 = 0x07;
    pub const ENABLE_CONNECT_PROTOCOL: u64 = 0x08;
    pub const H3_DATAGRAM: u64 = 0x33;

    /// HTTP/2 settings with no HTTP/3 counterpart: receiving one is H3_SETTINGS_ERROR.
    pub fn is_http2_only(id: u64) -> bool {
        matches!(id, 0x00 | 0x02 | 0x03 | 0x04 | 0x05)
    }
}

/// HTTP/3 and QPACK error codes: for a connection close or a stream reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    NoError,
    GeneralProtocol,
    Internal,
    StreamCreation,
    ClosedCriticalStream,
    FrameUnexpected,
    Frame,
    ExcessiveLoad,
    Id,
    Settings,
    MissingSettings,
    RequestRejected,
    RequestCancelled,
    RequestIncomplete,
    Message,
    Connect,
    VersionFallback,
    QpackDecompressionFailed,
    QpackEncoderStream,
    QpackDecoderStream,
}

impl ErrorCode {
    /// The code on the wire (CONNECTION_CLOSE of type 0x1d, RESET_STREAM, STOP_SENDING).
    pub fn code(self) -> u64 {
        match self {
            ErrorCode::NoError => 0x0100,
            ErrorCode::GeneralProtocol => 0x0101,
            ErrorCode::Internal => 0x0102,
            ErrorCode::StreamCreation => 0x0103,
            ErrorCode::ClosedCriticalStream => 0x0104,
            ErrorCode::FrameUnexpected => 0x0105,
            ErrorCode::Frame => 0x0106,
            ErrorCode::ExcessiveLoad => 0x0107,
            ErrorCode::Id => 0x0108,
            ErrorCode::Settings => 0x0109,
            ErrorCode::MissingSettings => 0x010a,
            ErrorCode::RequestRejected => 0x010b,
            ErrorCode::RequestCancelled => 0x010c,
            ErrorCode::RequestIncomplete => 0x010d,
            ErrorCode::Message => 0x010e,
            ErrorCode::Connect => 0x010f,
            ErrorCode::VersionFallback => 0x0110,
            ErrorCode::QpackDecompressionFailed => 0x0200,
            ErrorCode::QpackEncoderStream => 0x0201,
            ErrorCode::QpackDecoderStream => 0x0202,
        }
    }
}

/// The longest frame header: two 8-byte varints.
pub const MAX_HEADER_LEN: usize = 2 * varint::MAX_LEN;

/// Reads a frame header (type, payload length, bytes taken), or `None` if `buf` ends inside it.
pub fn parse_header(buf: &[u8]) -> Option<(u64, u64, usize)> {
    let (kind, a) = varint::decode(buf)?;
    let (len, b) = varint::decode(&buf[a..])?;
    Some((kind, len, a + b))
}

/// Appends a frame header.
pub fn write_header(out: &mut Vec<u8>, kind: u64, len: u64) {
    varint::encode(kind, out);
    varint::encode(len, out);
}

/// A DATA frame's header for `len` payload bytes, for callers that write the payload
/// themselves: `h[..n]` of the returned `(h, n)`.
pub fn data_header(len: usize) -> ([u8; MAX_HEADER_LEN], usize) {
    let mut v = Vec::with_capacity(MAX_HEADER_LEN);
    write_header(&mut v, kind::DATA, len as u64);
    let mut h = [0; MAX_HEADER_LEN];
    h[..v.len()].copy_from_slice(&v);
    (h, v.len())
}

/// Appends a SETTINGS frame.
pub fn write_settings(out: &mut Vec<u8>, settings: &[(u64, u64)]) {
    let len: usize = settings
        .iter()
        .map(|&(id, v)| varint::len(id) + varint::len(v))
        .sum();
    write_header(out, kind::SETTINGS, len as u64);
    for &(id, v) in settings {
        varint::encode(id, out);
        varint::encode(v, out);
    }
}

/// Appends a GOAWAY frame naming `id` (the first request stream not processed).
pub fn write_goaway(out: &mut Vec<u8>, id: u64) {
    write_header(out, kind::GOAWAY, varint::len(id) as u64);
    varint::encode(id, out);
}

/// Reads a payload that must be exactly one varint (GOAWAY, MAX_PUSH_ID, CANCEL_PUSH).
pub fn single_varint(payload: &[u8]) -> Option<u64> {
    match varint::decode(payload) {
        Some((v, n)) if n == payload.len() => Some(v),
        _ => None,
    }
}
