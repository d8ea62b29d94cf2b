//! QPACK (RFC 9204) without a dynamic table.
//!
//! tern advertises `SETTINGS_QPACK_MAX_TABLE_CAPACITY = 0` and `SETTINGS_QPACK_BLOCKED_STREAMS
//! = 0` (RFC 9204 §5), so a client may only use the static table and literals. Why: no
//! dynamic-table state per connection (nothing to size, evict or attack through the encoder
//! stream), no stream ever waits for encoder-stream instructions (no blocked streams, no
//! timers for them), and the decoder is a pure function of one field section. quiche, the h3
//! crate and quic-go make the same choice. The cost: request heads are larger from clients
//! that would have used a dynamic table (they must not when its capacity is 0), and answers
//! gain nothing from repeated fields across requests.
//!
//! - [`decode_section`]: a HEADERS payload into fields; any reference to the dynamic table
//!   (a non-zero Required Insert Count, a dynamic or post-base index) is
//!   QPACK_DECOMPRESSION_FAILED.
//! - [`Encoder`] functions: answers from the static table and literals, Huffman-coded when
//!   shorter (the code is HPACK's, RFC 9204 §4.1.2, shared with `tern_http2::hpack::huffman`).
//! - [`EncodedLines`]: a connection's answer field lines, each coded once.
//! - [`EncoderStream`] / [`DecoderStream`]: the peer's instruction streams, which with a
//!   capacity of 0 may carry only "capacity 0" and Stream Cancellations.

mod decoder;
mod encoder;
mod lines;
mod static_table;
mod streams;

pub use decoder::{decode_section, Decoded};
pub use encoder::{begin_section, encode_field, encode_status};
pub use lines::EncodedLines;
pub use static_table::STATIC;
pub use streams::{DecoderStream, EncoderStream};

/// RFC 9204 §3.2.1 (as RFC 7541 §4.1): an entry's size is name + value + 32; the field
/// section size limit (SETTINGS_MAX_FIELD_SECTION_SIZE) counts fields the same way.
pub const FIELD_OVERHEAD: usize = 32;

/// Most bytes of a prefixed integer we read: 62 bits need 1 + 9 bytes.
const MAX_INT_BYTES: usize = 10;

/// Reads a prefixed integer (RFC 7541 §5.1) whose prefix is the low `bits` bits of
/// `buf[*pos]`, advancing `pos`. `None`: truncated or above 2^62.
fn read_int(buf: &[u8], pos: &mut usize, bits: u32) -> Option<u64> {
    let mask = ((1u16 << bits) - 1) as u8;
    let mut value = u64::from(*buf.get(*pos)? & mask);
    *pos += 1;
    if value < u64::from(mask) {
        return Some(value);
    }
    let mut shift = 0;
    for n in 1..MAX_INT_BYTES {
        let b = *buf.get(*pos)?;
        *pos += 1;
        value = value.checked_add(u64::from(b & 0x7f) << shift)?;
        if b & 0x80 == 0 {
            return (value <= crate::varint::MAX).then_some(value);
        }
        shift += 7;
        if n == MAX_INT_BYTES - 1 {
            break;
        }
    }
    None
}

/// Appends a prefixed integer: `flags` are the bits of the first byte above the prefix.
fn write_int(out: &mut Vec<u8>, flags: u8, bits: u32, mut value: u64) {
    let mask = ((1u16 << bits) - 1) as u64;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    value -= mask;
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixed_integers() {
        // RFC 7541 C.1: 10 in a 5-bit prefix, 1337 in a 5-bit prefix, 42 in 8 bits.
        for (value, bits, bytes) in [
            (10u64, 5, &[0x0a][..]),
            (1337, 5, &[0x1f, 0x9a, 0x0a][..]),
            (42, 8, &[0x2a][..]),
        ] {
            let mut out = Vec::new();
            write_int(&mut out, 0, bits, value);
            assert_eq!(out, bytes);
            let mut pos = 0;
            assert_eq!(read_int(bytes, &mut pos, bits), Some(value));
            assert_eq!(pos, bytes.len());
        }
        let mut pos = 0;
        assert_eq!(read_int(&[0x1f, 0x9a], &mut pos, 5), None, "truncated");
        let mut pos = 0;
        let long = [
            0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(read_int(&long, &mut pos, 5), None, "too long");
    }

    #[test]
    fn static_table_spot_checks() {
        assert_eq!(STATIC.len(), 99);
        assert_eq!(STATIC[17], (&b":method"[..], &b"GET"[..]));
        assert_eq!(STATIC[25], (&b":status"[..], &b"200"[..]));
        assert_eq!(STATIC[71], (&b":status"[..], &b"500"[..]));
        assert_eq!(STATIC[98], (&b"x-frame-options"[..], &b"sameorigin"[..]));
    }
}
