//! QUIC variable-length integers (RFC 9000 §16): the two top bits of the first byte give the
//! length (1, 2, 4 or 8 bytes), the rest is the value, big-endian, up to 2^62 - 1.

/// The largest value a varint holds.
pub const MAX: u64 = (1 << 62) - 1;

/// The longest encoding.
pub const MAX_LEN: usize = 8;

/// Reads a varint at the start of `buf`: the value and the bytes it took, or `None` if `buf`
/// ends inside it.
pub fn decode(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    let len = 1usize << (first >> 6);
    let bytes = buf.get(..len)?;
    let mut value = u64::from(first & 0x3f);
    for &b in &bytes[1..] {
        value = (value << 8) | u64::from(b);
    }
    Some((value, len))
}

/// The length of `value`'s shortest encoding.
pub fn len(value: u64) -> usize {
    match value {
        0..=0x3f => 1,
        0x40..=0x3fff => 2,
        0x4000..=0x3fff_ffff => 4,
        _ => 8,
    }
}

/// Appends `value` (at most [`MAX`]) in its shortest encoding.
pub fn encode(value: u64, out: &mut Vec<u8>) {
    debug_assert!(value <= MAX);
    match len(value) {
        1 => out.push(value as u8),
        2 => out.extend_from_slice(&(value as u16 | 0x4000).to_be_bytes()),
        4 => out.extend_from_slice(&(value as u32 | 0x8000_0000).to_be_bytes()),
        _ => out.extend_from_slice(&(value | 0xc000_0000_0000_0000).to_be_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_9000_examples() {
        // Appendix A.1's examples.
        let cases: [(&[u8], u64); 4] = [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, value) in cases {
            assert_eq!(decode(bytes), Some((value, bytes.len())));
            let mut out = Vec::new();
            encode(value, &mut out);
            assert_eq!(out, bytes);
        }
        // A non-minimal encoding is still the same value (RFC 9000 §16).
        assert_eq!(decode(&[0x40, 0x25]), Some((37, 2)));
        assert_eq!(decode(&[0x9d, 0x7f, 0x3e]), None);
        assert_eq!(decode(&[]), None);
    }
}
