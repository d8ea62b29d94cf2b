//! Answers encoded with the static table and literals: never a dynamic reference, so the
//! section prefix is always two zero bytes and the peer never blocks.

use tern_http2::hpack::huffman;

use super::static_table::{find, STATIC};
use super::write_int;

/// Starts a field section: Required Insert Count 0, Delta Base 0.
pub fn begin_section(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0]);
}

/// Appends `:status` (indexed when the static table has the code).
pub fn encode_status(status: u16, out: &mut Vec<u8>) {
    let mut digits = [0u8; 3];
    let s = status.clamp(100, 999);
    digits[0] = b'0' + (s / 100) as u8;
    digits[1] = b'0' + (s / 10 % 10) as u8;
    digits[2] = b'0' + (s % 10) as u8;
    encode_field(b":status", &digits, false, out);
}

/// Appends one field line. `name` must be lowercase. `sensitive`: the N bit (RFC 9204
/// §4.5.4), asking intermediaries never to put the field in a dynamic table.
pub fn encode_field(name: &[u8], value: &[u8], sensitive: bool, out: &mut Vec<u8>) {
    let (exact, by_name) = find(name, value);
    match (exact, by_name) {
        // 1 T=1 index(6).
        (Some(i), _) if !sensitive => write_int(out, 0xc0, 6, i as u64),
        // 0 1 N T=1 index(4), value.
        (_, Some(i)) => {
            debug_assert_eq!(STATIC[i].0, name);
            let n_bit = if sensitive { 0x20 } else { 0 };
            write_int(out, 0x50 | n_bit, 4, i as u64);
            write_string(value, 7, 0, out);
        }
        // 0 0 1 N H len(3), name, value.
        (_, None) => {
            let n_bit = if sensitive { 0x10 } else { 0 };
            write_string(name, 3, 0x20 | n_bit, out);
            write_string(value, 7, 0, out);
        }
    }
}

/// A string with the H bit just above a `bits`-bit length prefix; `flags` are the bits of
/// the first byte above the H bit. Huffman-coded when that is shorter.
fn write_string(s: &[u8], bits: u32, flags: u8, out: &mut Vec<u8>) {
    let coded = huffman::encoded_len(s);
    if coded < s.len() {
        write_int(out, flags | (1 << bits), bits, coded as u64);
        huffman::encode(s, out);
    } else {
        write_int(out, flags, bits, s.len() as u64);
        out.extend_from_slice(s);
    }
}
