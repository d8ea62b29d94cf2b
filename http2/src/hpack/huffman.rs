//! The HPACK Huffman code (RFC 7541 §5.2, Appendix B): encoder, encoded length, and a
//! table-driven decoder.
//!
//! The decoder looks at the next 12 bits of input at a time: one 4096-entry table gives the one
//! or two whole codes they start with (typical header text is 5- and 6-bit codes, so usually
//! two symbols per lookup). Codes longer than 12 bits (control characters, bytes ≥ 0x80 and a
//! few rare punctuation marks) are resolved with the canonical-code limits (the Appendix B
//! code is canonical: codes of one length are consecutive and ordered by symbol, which a test
//! checks), a short loop only rare bytes reach. The tables are built at compile time from
//! [`CODES`].

use super::DecodeError;

/// Appendix B, indexed by symbol (256 is EOS): the code, right-aligned, and its length in bits.
#[rustfmt::skip]
const CODES: [(u32, u8); 257] = [
    // 0..=31: control characters.
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),
    (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),
    (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),
    // 32..=63: ' ' ! " # $ % & ' ( ) * + , - . / 0 1 2 3 4 5 6 7 8 9 : ; < = > ?
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),
    (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),
    (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),
    // 64..=95: @ A..Z [ \ ] ^ _
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),
    (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),
    (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),
    (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    // 96..=127: ` a..z { | } ~ DEL
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),
    (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),
    (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),
    (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),
    // 128..=255.
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),
    (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),
    (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),
    (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),
    (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),
    (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),
    (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),
    (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),
    (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
    // 256: EOS. Never valid inside a string (§5.2); its prefix is the padding.
    (0x3fffffff, 30),
];

const EOS: u16 = 256;
/// The longest code, in bits: the decoder's look-ahead window.
const MAX_LEN: u32 = 30;

/// Bits of look-ahead of the main decoding table.
const PEEK: u32 = 12;

/// Codes of up to `PEEK` bits by their `PEEK`-bit prefix: `len << 9 | symbol`, 0 for longer
/// codes. Only used to build [`PAIRS`].
const SINGLE: [u16; 1 << PEEK] = build_single();

const fn build_single() -> [u16; 1 << PEEK] {
    let mut t = [0u16; 1 << PEEK];
    let mut sym = 0;
    while sym < 257 {
        let (code, len) = CODES[sym];
        if len as u32 <= PEEK {
            let base = (code << (PEEK - len as u32)) as usize;
            let mut j = 0;
            while j < 1 << (PEEK - len as u32) {
                t[base + j] = ((len as u16) << 9) | sym as u16;
                j += 1;
            }
        }
        sym += 1;
    }
    t
}

/// The main decoding table, by the next `PEEK` bits: the one or two whole codes they start
/// with. Bits 0..8 both codes' length, 8..16 first symbol, 16..24 second symbol, 24..26 how
/// many symbols (0: the first code is longer than `PEEK` bits), 26..31 first code's length.
/// Two symbols per lookup halve the loop's dependency chain (load, then shift by its length;
/// the length sits in the low bits so the shift needs no extraction): typical header text is
/// mostly 5- and 6-bit codes.
static PAIRS: [u32; 1 << PEEK] = build_pairs();

const fn build_pairs() -> [u32; 1 << PEEK] {
    let mut t = [0u32; 1 << PEEK];
    let mut i = 0;
    while i < 1 << PEEK {
        let first = SINGLE[i];
        if first != 0 {
            let l1 = (first >> 9) as u32;
            let s1 = (first & 0xff) as u32;
            let mut e = l1 | (s1 << 8) | (1 << 24) | (l1 << 26);
            // The bits after the first code, left-aligned: a second code if it fits.
            let rest = (i << l1) & ((1 << PEEK) - 1);
            let second = SINGLE[rest];
            let l2 = (second >> 9) as u32;
            if second != 0 && l1 + l2 <= PEEK {
                let s2 = (second & 0xff) as u32;
                e = (l1 + l2) | (s1 << 8) | (s2 << 16) | (2 << 24) | (l1 << 26);
            }
            t[i] = e;
        }
        i += 1;
    }
    t
}

/// Canonical-code tables for the long path, indexed by length: codes of length `l` are
/// `first[l]..limit[l]`, their symbols `sorted[offset[l]..]` in code order.
struct Canonical {
    first: [u32; 31],
    limit: [u32; 31],
    offset: [u16; 31],
    sorted: [u16; 257],
}

static CANON: Canonical = build_canonical();

const fn build_canonical() -> Canonical {
    let mut count = [0u32; 31];
    let mut sym = 0;
    while sym < 257 {
        count[CODES[sym].1 as usize] += 1;
        sym += 1;
    }
    let mut c = Canonical {
        first: [0; 31],
        limit: [0; 31],
        offset: [0; 31],
        sorted: [0; 257],
    };
    let mut code = 0u32;
    let mut k = 0usize;
    let mut len = 1;
    while len <= MAX_LEN as usize {
        code = (code + count[len - 1]) << 1;
        c.first[len] = code;
        c.limit[len] = code + count[len];
        c.offset[len] = k as u16;
        let mut sym = 0;
        while sym < 257 {
            if CODES[sym].1 as usize == len {
                c.sorted[k] = sym as u16;
                k += 1;
            }
            sym += 1;
        }
        len += 1;
    }
    c
}

/// Resolves the code at the top of a 30-bit window: (symbol, length).
#[inline(always)]
fn lookup(window: u32) -> (u16, u32) {
    let e = PAIRS[(window >> (MAX_LEN - PEEK)) as usize];
    if e != 0 {
        return (((e >> 8) & 0xff) as u16, e >> 26);
    }
    long_lookup(window)
}

#[cold]
fn long_lookup(window: u32) -> (u16, u32) {
    let mut len = PEEK + 1;
    while len <= MAX_LEN {
        let c = window >> (MAX_LEN - len);
        let l = len as usize;
        if c < CANON.limit[l] {
            let i = usize::from(CANON.offset[l]) + (c.wrapping_sub(CANON.first[l])) as usize;
            return (CANON.sorted.get(i).copied().unwrap_or(EOS), len);
        }
        len += 1;
    }
    // Unreachable: the code is complete, every 30-bit window starts with some code.
    (EOS, MAX_LEN)
}

/// Appends the Huffman coding of `src` to `out`, padded with the EOS prefix (all ones).
pub fn encode(src: &[u8], out: &mut Vec<u8>) {
    out.reserve(src.len());
    // Bits waiting to be written sit in the low `bits` bits of `acc`; at most 31 + 30.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in src {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        if bits >= 32 {
            bits -= 32;
            out.extend_from_slice(&((acc >> bits) as u32).to_be_bytes());
        }
    }
    while bits >= 8 {
        bits -= 8;
        out.push((acc >> bits) as u8);
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
}

/// The length in bytes of `src` Huffman-coded (padding included).
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| usize::from(CODES[b as usize].1)).sum();
    bits.div_ceil(8)
}

/// Appends the decoding of `src` to `out`. Errors (all [`DecodeError::BadHuffman`]): the EOS
/// symbol inside the string, padding longer than 7 bits, padding that is not all ones (§5.2).
pub fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let start = out.len();
    out.resize(start + decode_bound(src.len()), 0);
    match decode_into(src, &mut out[start..]) {
        Ok(n) => {
            out.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// The room [`decode_into`] needs for `n` coded bytes: every code is at least 5 bits long, and
/// symbols are stored two bytes at a time.
pub(crate) fn decode_bound(n: usize) -> usize {
    n * 8 / 5 + 2
}

/// Decodes `src` into the start of `buf`, which must hold [`decode_bound`] bytes (the decoder
/// reuses one zeroed buffer rather than growing and zeroing a `Vec` per string). Returns the
/// decoded length.
pub(crate) fn decode_into(src: &[u8], buf: &mut [u8]) -> Result<usize, DecodeError> {
    let mut o = 0;
    // Pending bits are the top `bits` bits of `acc`. Below them may sit a copy of the start
    // of byte `src[pos]` (from the word-wide refill); it is ORed in again at the same place,
    // and never read before then.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    let mut pos = 0;
    loop {
        if let Some(word) = src.get(pos..pos + 8) {
            let word = u64::from_be_bytes(word.try_into().unwrap_or([0; 8]));
            acc |= word >> bits;
            let take = (63 - bits) / 8;
            pos += take as usize;
            bits += take * 8;
        } else {
            while bits <= 56 {
                let Some(&b) = src.get(pos) else { break };
                acc |= u64::from(b) << (56 - bits);
                bits += 8;
                pos += 1;
            }
        }
        // Codes of up to PEEK bits need only that many real bits; longer ones need the whole
        // window (or the end of the input, handled below).
        while bits >= PEEK {
            let e = PAIRS[(acc >> (64 - PEEK)) as usize];
            if e != 0 {
                buf[o..o + 2].copy_from_slice(&((e >> 8) as u16).to_le_bytes());
                o += ((e >> 24) & 3) as usize;
                acc = acc.wrapping_shl(e);
                bits -= e & 0xff;
                continue;
            }
            if bits < MAX_LEN {
                break;
            }
            let (sym, len) = long_lookup((acc >> (64 - MAX_LEN)) as u32);
            if sym == EOS {
                return Err(DecodeError::BadHuffman);
            }
            buf[o] = sym as u8;
            o += 1;
            acc <<= len;
            bits -= len;
        }
        if pos >= src.len() {
            break;
        }
    }
    // The input is used up: fewer than 30 bits remain (under 12, or a long code's start). Fill the window with ones (the EOS
    // prefix) and accept codes that end within the real bits; what is left must be padding.
    while bits > 0 {
        let real = (acc >> (64 - MAX_LEN)) as u32 & !((1u32 << (MAX_LEN - bits)) - 1);
        let window = real | ((1u32 << (MAX_LEN - bits)) - 1);
        let (sym, len) = lookup(window);
        if len > bits {
            // Ones all the way (the real bits included) and less than a byte of them.
            if bits <= 7 && window == (1 << MAX_LEN) - 1 {
                break;
            }
            return Err(DecodeError::BadHuffman);
        }
        // EOS is 30 bits long, more than remain here, so `sym` is a byte.
        buf[o] = sym as u8;
        o += 1;
        acc <<= len;
        bits -= len;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn dec(src: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::new();
        decode(src, &mut out).map(|()| out)
    }

    #[test]
    fn code_table_is_canonical_and_complete() {
        // Kraft sum exactly 1: a complete prefix code.
        let kraft: u64 = CODES.iter().map(|&(_, len)| 1u64 << (30 - len)).sum();
        assert_eq!(kraft, 1 << 30);
        // Each symbol's code is the canonical one for its length and rank (so a typo in the
        // table cannot hide behind a self-consistent decoder).
        for (sym, &(code, len)) in CODES.iter().enumerate() {
            assert!(code < 1 << len, "symbol {sym}");
            let l = len as usize;
            let rank = CANON.sorted[CANON.offset[l] as usize..]
                .iter()
                .position(|&s| s as usize == sym)
                .unwrap() as u32;
            assert_eq!(code, CANON.first[l] + rank, "symbol {sym}");
            assert!(code < CANON.limit[l]);
        }
    }

    #[test]
    fn every_symbol_round_trips() {
        for b in 0..=255u8 {
            for n in [1usize, 2, 3, 7, 8] {
                let src = vec![b; n];
                let mut enc = Vec::new();
                encode(&src, &mut enc);
                assert_eq!(enc.len(), encoded_len(&src));
                assert_eq!(dec(&enc).unwrap(), src, "byte {b} x{n}");
            }
        }
        // Every pair, also after a prefix that shifts it across the refill boundaries.
        let mut enc = Vec::new();
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                for prefix in [&b""[..], b"abc", b"0123456789"] {
                    let mut src = prefix.to_vec();
                    src.extend_from_slice(&[a, b, a]);
                    enc.clear();
                    encode(&src, &mut enc);
                    assert_eq!(dec(&enc).unwrap(), src);
                }
            }
        }
    }

    #[test]
    fn rfc_examples() {
        // RFC 7541 C.4 and C.6.
        for (h, s) in [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            ("6402", "302"),
            ("640e ff", "307"),
            ("aec3 771a 4b", "private"),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:22 GMT",
            ),
            (
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
                "https://www.example.com",
            ),
            ("9bd9 ab", "gzip"),
            (
                "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 \
                 3160 65c0 03ed 4ee5 b106 3d50 07",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ] {
            assert_eq!(dec(&hex(h)).unwrap(), s.as_bytes(), "{s}");
            let mut enc = Vec::new();
            encode(s.as_bytes(), &mut enc);
            assert_eq!(enc, hex(h), "{s}");
            assert_eq!(encoded_len(s.as_bytes()), enc.len());
        }
    }

    #[test]
    fn empty() {
        assert_eq!(dec(&[]).unwrap(), b"");
        assert_eq!(encoded_len(b""), 0);
        let mut out = Vec::new();
        encode(b"", &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn eos_in_string_is_an_error() {
        // EOS alone (30 ones + 2 padding ones).
        assert_eq!(dec(&[0xff, 0xff, 0xff, 0xff]), Err(DecodeError::BadHuffman));
        // 'a' (00011) then EOS: 5 + 30 bits, padded with ones.
        let mut v = Vec::new();
        let bits: u64 = (0b00011 << 30) | 0x3fff_ffff;
        let total = 35 + 5; // padded to 40 bits with ones
        let word = (bits << 5) | 0b11111;
        for i in (0..total / 8).rev() {
            v.push((word >> (i * 8)) as u8);
        }
        assert_eq!(dec(&v), Err(DecodeError::BadHuffman));
        // EOS followed by more data.
        assert_eq!(
            dec(&[0xff, 0xff, 0xff, 0xfc, 0x00]),
            Err(DecodeError::BadHuffman)
        );
    }

    #[test]
    fn bad_padding_is_an_error() {
        // 'a' = 00011 then padding 000 (not all ones).
        assert_eq!(dec(&[0b0001_1000]), Err(DecodeError::BadHuffman));
        // 'a' + 111 is fine.
        assert_eq!(dec(&[0b0001_1111]).unwrap(), b"a");
        // A whole byte of ones as padding: more than 7 bits.
        assert_eq!(dec(&[0b0001_1111, 0xff]), Err(DecodeError::BadHuffman));
        assert_eq!(dec(&[0xff]), Err(DecodeError::BadHuffman));
        // Padding that is an incomplete non-EOS code prefix: 'a' then 0 (part of a 5-bit code).
        assert_eq!(dec(&[0b0001_1011]), Err(DecodeError::BadHuffman));
        // A 10-bit code cut short after 8 bits.
        assert_eq!(dec(&[0xfe]), Err(DecodeError::BadHuffman));
        // Symbol 0 (13 bits) then 000, then 111.
        assert_eq!(dec(&[0xff, 0xc0]), Err(DecodeError::BadHuffman));
        assert_eq!(dec(&[0xff, 0xc7]).unwrap(), [0]);
    }

    proptest! {
        #[test]
        fn round_trip(src in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut enc = Vec::new();
            encode(&src, &mut enc);
            prop_assert_eq!(enc.len(), encoded_len(&src));
            prop_assert_eq!(dec(&enc).unwrap(), src);
        }

        #[test]
        fn round_trip_text(src in "[ -~]{0,200}") {
            let mut enc = Vec::new();
            encode(src.as_bytes(), &mut enc);
            prop_assert_eq!(dec(&enc).unwrap(), src.as_bytes());
        }

        #[test]
        fn decode_never_panics(src in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut out = Vec::new();
            if decode(&src, &mut out).is_ok() {
                // Whatever decodes must re-encode to the same bytes: the code is prefix-free
                // and padding is canonical (all ones, < 8 bits).
                let mut enc = Vec::new();
                encode(&out, &mut enc);
                prop_assert_eq!(enc, src);
            }
        }
    }
}
