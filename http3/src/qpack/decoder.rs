//! A field section (RFC 9204 §4.5) decoded with the static table only.

use tern_http2::hpack::huffman;

use super::static_table::STATIC;
use super::{read_int, FIELD_OVERHEAD};

/// What a decoded section came to (the fields went to the callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The section passed `max_size`: fields from that one on were not handed over.
    pub too_large: bool,
    /// The callback refused a field: later ones were decoded (to check the encoding) but not
    /// handed over.
    pub rejected: bool,
}

/// Decodes `block` (a HEADERS payload), calling `each(name, value)` per field line until it
/// returns `Err` or the section passes `max_size` (names + values + 32 each). `scratch` holds
/// Huffman-decoded strings between calls (kept for reuse). Err: the section is not valid QPACK
/// for a decoder without a dynamic table (QPACK_DECOMPRESSION_FAILED).
pub fn decode_section(
    block: &[u8],
    max_size: usize,
    scratch: &mut (Vec<u8>, Vec<u8>),
    mut each: impl FnMut(&[u8], &[u8]) -> Result<(), ()>,
) -> Result<Decoded, &'static str> {
    let mut pos = 0;
    // Section prefix: Required Insert Count (8-bit prefix), then sign + Delta Base (7 bits).
    let required = read_int(block, &mut pos, 8).ok_or("truncated section prefix")?;
    if required != 0 {
        return Err("reference to the dynamic table (Required Insert Count)");
    }
    // With no dynamic table the base means nothing, but it must be there and well formed.
    read_int(block, &mut pos, 7).ok_or("truncated section prefix")?;
    let mut decoded = Decoded {
        too_large: false,
        rejected: false,
    };
    let mut size = 0usize;
    let (name_buf, value_buf) = scratch;
    while pos < block.len() {
        let first = block[pos];
        let (name, value): (&[u8], &[u8]) = if first & 0x80 != 0 {
            // Indexed field line: 1 T index(6).
            if first & 0x40 == 0 {
                return Err("dynamic table index");
            }
            let i = read_int(block, &mut pos, 6).ok_or("truncated index")?;
            let &(n, v) = STATIC.get(i as usize).ok_or("static index out of range")?;
            (n, v)
        } else if first & 0x40 != 0 {
            // Literal with name reference: 0 1 N T index(4), then the value.
            if first & 0x10 == 0 {
                return Err("dynamic table name reference");
            }
            let i = read_int(block, &mut pos, 4).ok_or("truncated index")?;
            let &(n, _) = STATIC.get(i as usize).ok_or("static index out of range")?;
            let v = read_string(block, &mut pos, 7, value_buf)?;
            (n, v)
        } else if first & 0x20 != 0 {
            // Literal with literal name: 0 0 1 N H len(3), name, then the value.
            let n = read_string(block, &mut pos, 3, name_buf)?;
            let v = read_string(block, &mut pos, 7, value_buf)?;
            (n, v)
        } else {
            // 0001: indexed post-base; 0000: literal with post-base name reference. Both name
            // dynamic entries.
            return Err("post-base reference to the dynamic table");
        };
        if decoded.too_large || decoded.rejected {
            continue;
        }
        size += name.len() + value.len() + FIELD_OVERHEAD;
        if size > max_size {
            decoded.too_large = true;
        } else if each(name, value).is_err() {
            decoded.rejected = true;
        }
    }
    Ok(decoded)
}

/// Reads a string whose H bit sits just above an `bits`-bit length prefix. Literal bytes are
/// borrowed from `block`; Huffman-coded ones are decoded into `buf`.
fn read_string<'a>(
    block: &'a [u8],
    pos: &mut usize,
    bits: u32,
    buf: &'a mut Vec<u8>,
) -> Result<&'a [u8], &'static str> {
    let huffman_coded = block.get(*pos).ok_or("truncated string")? & (1 << bits) != 0;
    let len = read_int(block, pos, bits).ok_or("truncated string length")?;
    let end = pos
        .checked_add(usize::try_from(len).map_err(|_| "string too long")?)
        .filter(|&e| e <= block.len())
        .ok_or("string longer than the section")?;
    let raw = &block[*pos..end];
    *pos = end;
    if !huffman_coded {
        return Ok(raw);
    }
    buf.clear();
    huffman::decode(raw, buf).map_err(|_| "bad Huffman string")?;
    Ok(buf)
}
