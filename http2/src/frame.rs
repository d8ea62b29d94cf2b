//! HTTP/2 frames (RFC 9113 §4, §6): the 9-byte header, types, flags, error codes, and
//! writers that append whole frames to a caller's buffer.

/// What a client sends first on every HTTP/2 connection (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADER_LEN: usize = 9;
/// The frame size every peer must accept (SETTINGS_MAX_FRAME_SIZE's initial value).
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;
pub const MAX_FRAME_SIZE_LIMIT: u32 = (1 << 24) - 1;
pub const DEFAULT_WINDOW: u32 = 65_535;
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
    /// RFC 9218 §7.1.
    pub const PRIORITY_UPDATE: u8 = 0x10;
}

pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    /// RFC 8441 §3: extended CONNECT (`:protocol`, WebSocket over HTTP/2) is accepted.
    pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
    /// RFC 9218 §2.1: we do not use RFC 7540 priorities (PRIORITY frames are ignored).
    pub const NO_RFC7540_PRIORITIES: u16 = 0x9;
}

/// Error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    NoError = 0x0,
    Protocol = 0x1,
    Internal = 0x2,
    FlowControl = 0x3,
    SettingsTimeout = 0x4,
    StreamClosed = 0x5,
    FrameSize = 0x6,
    RefusedStream = 0x7,
    Cancel = 0x8,
    Compression = 0x9,
    Connect = 0xa,
    EnhanceYourCalm = 0xb,
    InadequateSecurity = 0xc,
    Http11Required = 0xd,
}

impl ErrorCode {
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NoError => "NO_ERROR",
            ErrorCode::Protocol => "PROTOCOL_ERROR",
            ErrorCode::Internal => "INTERNAL_ERROR",
            ErrorCode::FlowControl => "FLOW_CONTROL_ERROR",
            ErrorCode::SettingsTimeout => "SETTINGS_TIMEOUT",
            ErrorCode::StreamClosed => "STREAM_CLOSED",
            ErrorCode::FrameSize => "FRAME_SIZE_ERROR",
            ErrorCode::RefusedStream => "REFUSED_STREAM",
            ErrorCode::Cancel => "CANCEL",
            ErrorCode::Compression => "COMPRESSION_ERROR",
            ErrorCode::Connect => "CONNECT_ERROR",
            ErrorCode::EnhanceYourCalm => "ENHANCE_YOUR_CALM",
            ErrorCode::InadequateSecurity => "INADEQUATE_SECURITY",
            ErrorCode::Http11Required => "HTTP_1_1_REQUIRED",
        }
    }
}

/// A frame's 9-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    /// The reserved bit is dropped (RFC 9113 §4.1: ignored on receipt).
    pub stream: u32,
}

impl FrameHeader {
    pub fn parse(b: &[u8; HEADER_LEN]) -> FrameHeader {
        FrameHeader {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// A frame header as bytes. `len` must fit 24 bits (callers keep frames under the peer's
/// SETTINGS_MAX_FRAME_SIZE).
pub fn header_bytes(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_FRAME_SIZE_LIMIT as usize);
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

/// Appends a frame header.
pub fn write_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&header_bytes(len, kind, flags, stream));
}

/// The header of a DATA frame, as bytes (for output queued beside a body it does not copy).
pub fn data_header(len: usize, end_stream: bool, stream: u32) -> [u8; HEADER_LEN] {
    let flags = if end_stream { flag::END_STREAM } else { 0 };
    header_bytes(len, kind::DATA, flags, stream)
}

pub fn write_settings(out: &mut Vec<u8>, settings: &[(u16, u32)]) {
    write_header(out, settings.len() * 6, kind::SETTINGS, 0, 0);
    for &(id, value) in settings {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_settings_ack(out: &mut Vec<u8>) {
    write_header(out, 0, kind::SETTINGS, flag::ACK, 0);
}

pub fn write_ping_ack(out: &mut Vec<u8>, payload: &[u8; 8]) {
    write_header(out, 8, kind::PING, flag::ACK, 0);
    out.extend_from_slice(payload);
}

pub fn write_goaway(out: &mut Vec<u8>, last_stream: u32, code: ErrorCode) {
    write_header(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&last_stream.to_be_bytes());
    out.extend_from_slice(&(code as u32).to_be_bytes());
}

pub fn write_rst_stream(out: &mut Vec<u8>, stream: u32, code: ErrorCode) {
    write_header(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&(code as u32).to_be_bytes());
}

pub fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    debug_assert!(increment > 0 && increment <= MAX_WINDOW as u32);
    write_header(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&increment.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let mut out = Vec::new();
        write_header(
            &mut out,
            16_384,
            kind::HEADERS,
            flag::END_HEADERS,
            0x7fff_ffff,
        );
        let h = FrameHeader::parse(out[..9].try_into().unwrap());
        assert_eq!(h.len, 16_384);
        assert_eq!(h.kind, kind::HEADERS);
        assert!(h.has(flag::END_HEADERS));
        assert_eq!(h.stream, 0x7fff_ffff);
        assert_eq!(data_header(5, true, 3), {
            let mut v = Vec::new();
            write_header(&mut v, 5, kind::DATA, flag::END_STREAM, 3);
            <[u8; 9]>::try_from(v).unwrap()
        });
    }

    #[test]
    fn reserved_bit_is_ignored() {
        let h = FrameHeader::parse(&[0, 0, 0, 0, 0, 0x80, 0, 0, 1]);
        assert_eq!(h.stream, 1);
    }

    #[test]
    fn control_frames_have_their_rfc_layout() {
        let mut out = Vec::new();
        write_goaway(&mut out, 7, ErrorCode::EnhanceYourCalm);
        assert_eq!(out, [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0xb]);
        out.clear();
        write_window_update(&mut out, 1, 1 << 20);
        assert_eq!(out, [0, 0, 4, 8, 0, 0, 0, 0, 1, 0, 0x10, 0, 0]);
        out.clear();
        write_settings(&mut out, &[(setting::MAX_CONCURRENT_STREAMS, 100)]);
        assert_eq!(out, [0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]);
    }
}
