//! The HPACK decoder (RFC 7541 §3, §6): header block in, `(name, value)` pairs out.
//!
//! Fields are handed to a callback as slices of the block, of the static or dynamic table, or
//! of one scratch buffer holding the Huffman-decoded name and value of the current field, so
//! decoding allocates nothing per field once the scratch buffer and the table have grown.

use super::table::{DynTable, STATIC_TABLE};
use super::{huffman, ENTRY_OVERHEAD};

/// Why a header block could not be decoded. Each one is an HTTP/2 COMPRESSION_ERROR: the
/// dynamic table may now be out of step with the peer's, so the connection cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The block ends inside a representation.
    Truncated,
    /// An integer longer than 5 continuation bytes or above `u32::MAX`.
    IntegerOverflow,
    /// Index 0, or past the end of the dynamic table.
    BadIndex,
    /// Invalid Huffman string: EOS inside it, padding over 7 bits or not all ones.
    BadHuffman,
    /// A dynamic table size update above our SETTINGS_HEADER_TABLE_SIZE.
    SizeUpdateTooLarge,
    /// A dynamic table size update after a field (§4.2: only at the start of a block).
    SizeUpdateNotAtStart,
    /// A string literal longer than the rest of the block.
    StringTooLong,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeError::Truncated => "HPACK block truncated",
            DecodeError::IntegerOverflow => "HPACK integer overflow",
            DecodeError::BadIndex => "HPACK index out of range",
            DecodeError::BadHuffman => "invalid HPACK Huffman string",
            DecodeError::SizeUpdateTooLarge => "HPACK table size update above the limit",
            DecodeError::SizeUpdateNotAtStart => "HPACK table size update after a field",
            DecodeError::StringTooLong => "HPACK string longer than the block",
        })
    }
}

impl std::error::Error for DecodeError {}

/// What a decoded block came to (the fields themselves went to the callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The list size passed `max_list_size`; fields from that one on were not emitted.
    pub too_large: bool,
    /// The callback refused a field; later fields were not emitted.
    pub rejected: bool,
    /// Sum of name + value + 32 over all fields of the block (saturating).
    pub list_size: usize,
}

/// Where a decoded string lives until the field is emitted.
#[derive(Clone, Copy)]
enum Str {
    Static(&'static [u8]),
    /// Range of the block.
    Block(usize, usize),
    /// Range of the scratch buffer.
    Scratch(usize, usize),
    /// The name of dynamic entry `i`.
    DynName(usize),
}

/// HPACK decoding state for one connection (one direction).
pub struct Decoder {
    table: DynTable,
    max_table_size: usize,
    /// Huffman-decoded strings of the current field. Its length only grows (zero-filled once),
    /// the part in use is tracked separately.
    scratch: Vec<u8>,
}

/// A scratch buffer grown past this by one big block is freed after it, so that a connection
/// does not keep it for its lifetime.
const SCRATCH_KEEP: usize = 16 * 1024;

impl Decoder {
    /// `max_table_size`: our SETTINGS_HEADER_TABLE_SIZE (the most a size update may ask for).
    /// Default use: 4096.
    pub fn new(max_table_size: usize) -> Decoder {
        Decoder {
            table: DynTable::new(max_table_size),
            max_table_size,
            scratch: Vec::new(),
        }
    }

    /// Frees the Huffman scratch buffer (the connection is idle).
    pub fn release_scratch(&mut self) {
        self.scratch = Vec::new();
    }

    /// Current dynamic table size in bytes (§4.1).
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Decodes one complete header block (HEADERS + CONTINUATION payloads joined by the
    /// caller), calling `emit(name, value)` for each field in order.
    ///
    /// The whole block is always processed so that the dynamic table stays in step with the
    /// peer's. Once the list size (sum of name + value + 32) exceeds `max_list_size`, `emit` is
    /// no longer called and the result has `too_large`; once `emit` returns `Err(())`, it is
    /// not called again and the result has `rejected`. Never panics; allocates at most
    /// O(block length + table size).
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list_size: usize,
        mut emit: impl FnMut(&[u8], &[u8]) -> Result<(), ()>,
    ) -> Result<Decoded, DecodeError> {
        let Decoder {
            table,
            max_table_size,
            scratch,
        } = self;
        let mut out = Decoded {
            too_large: false,
            rejected: false,
            list_size: 0,
        };
        let mut deliver = |name: &[u8], value: &[u8]| {
            out.list_size = out
                .list_size
                .saturating_add(name.len() + value.len() + ENTRY_OVERHEAD);
            if out.list_size > max_list_size {
                out.too_large = true;
            }
            if !out.too_large && !out.rejected && emit(name, value).is_err() {
                out.rejected = true;
            }
        };
        let mut pos = 0;
        let mut field_seen = false;
        while let Some(&b) = block.get(pos) {
            if b & 0x80 != 0 {
                // §6.1 indexed field.
                let index = read_int(block, &mut pos, 7)?;
                field_seen = true;
                if let Some((name, value)) = STATIC_TABLE.get(index.wrapping_sub(1)) {
                    deliver(name, value);
                } else {
                    let (name, value) = table
                        .get(index.wrapping_sub(62))
                        .ok_or(DecodeError::BadIndex)?;
                    deliver(name, value);
                }
            } else if b & 0xe0 == 0x20 {
                // §6.3 dynamic table size update.
                if field_seen {
                    return Err(DecodeError::SizeUpdateNotAtStart);
                }
                let size = read_int(block, &mut pos, 5)?;
                if size > *max_table_size {
                    return Err(DecodeError::SizeUpdateTooLarge);
                }
                table.set_max_size(size);
            } else {
                // §6.2 literal: 01 incremental indexing (6-bit index), 0000 without indexing,
                // 0001 never indexed (4-bit index; the two only differ for intermediaries).
                let incremental = b & 0x40 != 0;
                let index = read_int(block, &mut pos, if incremental { 6 } else { 4 })?;
                field_seen = true;
                let mut used = 0;
                let name = if index == 0 {
                    read_string(block, &mut pos, scratch, &mut used)?
                } else if let Some((name, _)) = STATIC_TABLE.get(index - 1) {
                    Str::Static(name)
                } else {
                    let i = index - 62;
                    let (name, _) = table.get(i).ok_or(DecodeError::BadIndex)?;
                    if incremental {
                        // Inserting may evict and overwrite the entry the name comes from
                        // (§4.4), so keep a copy.
                        used = name.len();
                        if scratch.len() < used {
                            scratch.resize(used, 0);
                        }
                        scratch[..used].copy_from_slice(name);
                        Str::Scratch(0, used)
                    } else {
                        Str::DynName(i)
                    }
                };
                let value = read_string(block, &mut pos, scratch, &mut used)?;
                if incremental {
                    let name = resolve(name, block, scratch, None);
                    let value = resolve(value, block, scratch, None);
                    table.insert(name, value);
                    deliver(name, value);
                } else {
                    let t = Some(&*table);
                    deliver(
                        resolve(name, block, scratch, t),
                        resolve(value, block, scratch, t),
                    );
                }
            }
        }
        if scratch.len() > SCRATCH_KEEP {
            *scratch = Vec::new();
        }
        Ok(out)
    }
}

/// The bytes of a decoded string. `table` is only needed (and only given) for `DynName`.
#[inline]
fn resolve<'a>(
    s: Str,
    block: &'a [u8],
    scratch: &'a [u8],
    table: Option<&'a DynTable>,
) -> &'a [u8] {
    match s {
        Str::Static(b) => b,
        Str::Block(a, z) => &block[a..z],
        Str::Scratch(a, z) => &scratch[a..z],
        Str::DynName(i) => table.and_then(|t| t.get(i)).map_or(&[][..], |(n, _)| n),
    }
}

/// §5.1: an integer with an N-bit prefix, starting in `block[*pos]`.
#[inline]
fn read_int(block: &[u8], pos: &mut usize, prefix_bits: u32) -> Result<usize, DecodeError> {
    let mask = (1u8 << prefix_bits) - 1;
    let first = *block.get(*pos).ok_or(DecodeError::Truncated)? & mask;
    *pos += 1;
    if first < mask {
        return Ok(usize::from(first));
    }
    let mut value = u64::from(mask);
    let mut shift = 0;
    loop {
        let b = *block.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        value += u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        // Five continuation bytes carry 35 bits: past that, only overlong zero padding or
        // values no field size or table size could need.
        if shift > 28 {
            return Err(DecodeError::IntegerOverflow);
        }
    }
    if value > u64::from(u32::MAX) {
        return Err(DecodeError::IntegerOverflow);
    }
    Ok(value as usize)
}

/// §5.2: a string literal; Huffman-coded ones are decoded into `scratch` after its first
/// `used` bytes (which then count them too).
#[inline]
fn read_string(
    block: &[u8],
    pos: &mut usize,
    scratch: &mut Vec<u8>,
    used: &mut usize,
) -> Result<Str, DecodeError> {
    let huffman = *block.get(*pos).ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let len = read_int(block, pos, 7)?;
    let start = *pos;
    if len > block.len() - start {
        return Err(DecodeError::StringTooLong);
    }
    let end = start + len;
    *pos = end;
    if !huffman {
        return Ok(Str::Block(start, end));
    }
    let need = *used + huffman::decode_bound(len);
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    let a = *used;
    *used += huffman::decode_into(&block[start..end], &mut scratch[a..])?;
    Ok(Str::Scratch(a, *used))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    pub(crate) type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    pub(crate) fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Fields, DecodeError> {
        let mut v = Vec::new();
        let r = d.decode(block, usize::MAX, |n, val| {
            v.push((n.to_vec(), val.to_vec()));
            Ok(())
        })?;
        assert!(!r.too_large && !r.rejected);
        let expect: usize = v.iter().map(|(n, val)| n.len() + val.len() + 32).sum();
        assert_eq!(r.list_size, expect);
        Ok(v)
    }

    pub(crate) fn fields(list: &[(&str, &str)]) -> Fields {
        list.iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    /// The dynamic table, newest first.
    fn dyn_entries(d: &Decoder) -> Vec<(String, String)> {
        (0..d.table.len())
            .map(|i| {
                let (n, v) = d.table.get(i).unwrap();
                (
                    String::from_utf8(n.to_vec()).unwrap(),
                    String::from_utf8(v.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    fn owned(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    // RFC 7541 C.2: independent representations (a fresh decoder each).
    #[test]
    fn c2_field_representations() {
        let cases: [(&str, (&str, &str), usize); 4] = [
            (
                "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
                ("custom-key", "custom-header"),
                55,
            ),
            (
                "040c 2f73 616d 706c 652f 7061 7468",
                (":path", "/sample/path"),
                0,
            ),
            (
                "1008 7061 7373 776f 7264 0673 6563 7265 74",
                ("password", "secret"),
                0,
            ),
            ("82", (":method", "GET"), 0),
        ];
        for (h, field, size) in cases {
            let mut d = Decoder::new(4096);
            assert_eq!(decode_all(&mut d, &hex(h)).unwrap(), fields(&[field]));
            assert_eq!(d.table_size(), size);
        }
    }

    /// C.3 (plain) and C.4 (Huffman): three requests on one connection.
    pub(crate) const C3: [&str; 3] = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    pub(crate) const C4: [&str; 3] = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];
    pub(crate) const REQUESTS: [&[(&str, &str)]; 3] = [
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ],
    ];
    pub(crate) const REQUEST_TABLE_SIZES: [usize; 3] = [57, 110, 164];

    fn request_tables() -> [Vec<(String, String)>; 3] {
        [
            owned(&[(":authority", "www.example.com")]),
            owned(&[
                ("cache-control", "no-cache"),
                (":authority", "www.example.com"),
            ]),
            owned(&[
                ("custom-key", "custom-value"),
                ("cache-control", "no-cache"),
                (":authority", "www.example.com"),
            ]),
        ]
    }

    #[test]
    fn c3_c4_requests() {
        for blocks in [C3, C4] {
            let mut d = Decoder::new(4096);
            let tables = request_tables();
            for i in 0..3 {
                assert_eq!(
                    decode_all(&mut d, &hex(blocks[i])).unwrap(),
                    fields(REQUESTS[i])
                );
                assert_eq!(d.table_size(), REQUEST_TABLE_SIZES[i]);
                assert_eq!(dyn_entries(&d), tables[i]);
            }
        }
    }

    /// C.5 (plain) and C.6 (Huffman): three responses, table limited to 256 bytes.
    pub(crate) const C5: [&str; 3] = [
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
         2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
         6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
         54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
         5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
         3d31",
    ];
    pub(crate) const C6: [&str; 3] = [
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 \
         2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab \
         77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f \
         9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ];
    pub(crate) const RESPONSES: [&[(&str, &str)]; 3] = [
        &[
            (":status", "302"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("location", "https://www.example.com"),
        ],
        &[
            (":status", "307"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("location", "https://www.example.com"),
        ],
        &[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", "https://www.example.com"),
            ("content-encoding", "gzip"),
            (
                "set-cookie",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ],
    ];
    pub(crate) const RESPONSE_TABLE_SIZES: [usize; 3] = [222, 222, 215];

    fn response_tables() -> [Vec<(String, String)>; 3] {
        [
            owned(&[
                ("location", "https://www.example.com"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("cache-control", "private"),
                (":status", "302"),
            ]),
            owned(&[
                (":status", "307"),
                ("location", "https://www.example.com"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("cache-control", "private"),
            ]),
            owned(&[
                (
                    "set-cookie",
                    "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
                ),
                ("content-encoding", "gzip"),
                ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ]),
        ]
    }

    #[test]
    fn c5_c6_responses_with_eviction() {
        for blocks in [C5, C6] {
            let mut d = Decoder::new(256);
            let tables = response_tables();
            for i in 0..3 {
                assert_eq!(
                    decode_all(&mut d, &hex(blocks[i])).unwrap(),
                    fields(RESPONSES[i])
                );
                assert_eq!(d.table_size(), RESPONSE_TABLE_SIZES[i]);
                assert_eq!(dyn_entries(&d), tables[i]);
            }
        }
    }

    #[test]
    fn errors() {
        let err =
            |max_table: usize, h: &[u8]| Decoder::new(max_table).decode(h, 1 << 20, |_, _| Ok(()));
        let e = |h: &[u8]| err(4096, h).unwrap_err();
        // Truncated: inside an integer, before a string, inside the name/value header.
        assert_eq!(e(&[0xff]), DecodeError::Truncated);
        assert_eq!(e(&[0xff, 0x80]), DecodeError::Truncated);
        assert_eq!(e(&[0x40]), DecodeError::Truncated);
        assert_eq!(e(&[0x40, 0x01, b'a']), DecodeError::Truncated);
        assert_eq!(e(&[0x04]), DecodeError::Truncated);
        assert_eq!(e(&[0x3f]), DecodeError::Truncated);
        // IntegerOverflow: six continuation bytes; and a value above u32::MAX.
        assert_eq!(
            e(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]),
            DecodeError::IntegerOverflow
        );
        assert_eq!(
            e(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
            DecodeError::IntegerOverflow
        );
        assert_eq!(
            e(&[0x0f, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            DecodeError::IntegerOverflow
        );
        // Five bytes within u32 range are fine as an integer (then the index is bad).
        assert_eq!(
            e(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x01]),
            DecodeError::BadIndex
        );
        // BadIndex: 0, past the static table with an empty dynamic table, literal name index.
        assert_eq!(e(&[0x80]), DecodeError::BadIndex);
        assert_eq!(e(&[0xbe]), DecodeError::BadIndex);
        assert_eq!(e(&[0x7e, 0x00]), DecodeError::BadIndex);
        assert_eq!(e(&[0x0f, 0x2f, 0x00]), DecodeError::BadIndex);
        assert_eq!(e(&[0x1f, 0x2f, 0x00]), DecodeError::BadIndex);
        // BadHuffman: EOS in a string, bad padding.
        assert_eq!(
            e(&[0x04, 0x84, 0xff, 0xff, 0xff, 0xff]),
            DecodeError::BadHuffman
        );
        assert_eq!(e(&[0x04, 0x81, 0x18]), DecodeError::BadHuffman);
        assert_eq!(e(&[0x04, 0x82, 0x1f, 0xff]), DecodeError::BadHuffman);
        assert_eq!(e(&[0x00, 0x81, 0x18, 0x00]), DecodeError::BadHuffman);
        // SizeUpdateTooLarge.
        assert_eq!(
            err(100, &[0x3f, 0x46]).unwrap_err(),
            DecodeError::SizeUpdateTooLarge
        );
        assert_eq!(
            err(100, &[0x3f, 0x45]).unwrap(),
            Decoded {
                too_large: false,
                rejected: false,
                list_size: 0
            }
        );
        // SizeUpdateNotAtStart: after an indexed field, after a literal.
        assert_eq!(e(&[0x82, 0x20]), DecodeError::SizeUpdateNotAtStart);
        assert_eq!(e(&[0x04, 0x00, 0x20]), DecodeError::SizeUpdateNotAtStart);
        // StringTooLong.
        assert_eq!(e(&[0x04, 0x02, b'a']), DecodeError::StringTooLong);
        assert_eq!(
            e(&[0x00, 0x7f, 0xff, 0xff, 0xff, 0x0f]),
            DecodeError::StringTooLong
        );
        assert_eq!(e(&[0x40, 0x01, b'a', 0x01]), DecodeError::StringTooLong);
    }

    #[test]
    fn size_updates() {
        let mut d = Decoder::new(4096);
        decode_all(&mut d, &hex(C3[0])).unwrap();
        assert_eq!(d.table_size(), 57);
        // Several updates at the start are allowed; going to 0 empties the table.
        assert_eq!(
            decode_all(&mut d, &[0x20, 0x3f, 0xe1, 0x1f, 0x82]).unwrap(),
            fields(&[(":method", "GET")])
        );
        assert_eq!(d.table_size(), 0);
        assert_eq!(
            d.decode(&[0xbe], 1000, |_, _| Ok(())).unwrap_err(),
            DecodeError::BadIndex
        );
        // An update to 4096 (the limit) is allowed.
        decode_all(&mut d, &[0x3f, 0xe1, 0x1f]).unwrap();
        // A smaller table evicts as it shrinks.
        let mut d = Decoder::new(4096);
        for b in C3 {
            decode_all(&mut d, &hex(b)).unwrap();
        }
        assert_eq!(d.table_size(), 164);
        // 3f 5a = 31 + 90 = 121 < 164: evicts ":authority" (the oldest, 57).
        decode_all(&mut d, &[0x3f, 0x5a]).unwrap();
        assert_eq!(d.table_size(), 107);
        assert_eq!(
            dyn_entries(&d),
            owned(&[
                ("custom-key", "custom-value"),
                ("cache-control", "no-cache")
            ])
        );
    }

    #[test]
    fn literal_name_from_an_evicted_entry() {
        // The table holds one entry; a literal with incremental indexing takes its name from it
        // (index 62) and, being as big, evicts it while being inserted (§4.4).
        let mut d = Decoder::new(4096);
        decode_all(&mut d, &[0x3f, 0x21]).unwrap(); // max 64
        decode_all(
            &mut d,
            &[
                0x40, 0x04, b'n', b'a', b'm', b'e', 0x05, b'v', b'a', b'l', b'u', b'1',
            ],
        )
        .unwrap();
        assert_eq!(d.table_size(), 41);
        let got = decode_all(&mut d, &[0x7e, 0x05, b'v', b'a', b'l', b'u', b'2']).unwrap();
        assert_eq!(got, fields(&[("name", "valu2")]));
        assert_eq!(dyn_entries(&d), owned(&[("name", "valu2")]));
    }

    #[test]
    fn too_large_keeps_the_table_in_sync() {
        let mut d = Decoder::new(4096);
        let mut seen = Vec::new();
        // C.3.3's fields take 42 + 44 + 48 + 57 + 54 bytes of list; the limit of 100 is passed
        // at the third.
        decode_all(&mut d, &hex(C3[0])).unwrap();
        decode_all(&mut d, &hex(C3[1])).unwrap();
        let r = d
            .decode(&hex(C3[2]), 100, |n, v| {
                seen.push((n.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
        assert!(r.too_large && !r.rejected);
        assert_eq!(r.list_size, 42 + 44 + 48 + 57 + 54);
        // Only the fields before the limit was passed.
        assert_eq!(seen, fields(&REQUESTS[2][..2]));
        // custom-key: custom-value was still inserted: a block referring to it decodes.
        assert_eq!(d.table_size(), 164);
        assert_eq!(
            decode_all(&mut d, &[0xbe]).unwrap(),
            fields(&[("custom-key", "custom-value")])
        );
        // A block of only inserts while over the limit from the start.
        let mut d = Decoder::new(4096);
        let r = d
            .decode(&hex(C4[0]), 0, |_, _| panic!("emit called over the limit"))
            .unwrap();
        assert!(r.too_large);
        assert_eq!(
            decode_all(&mut d, &hex(C4[1])).unwrap(),
            fields(REQUESTS[1])
        );
    }

    #[test]
    fn rejected_keeps_the_table_in_sync() {
        let mut d = Decoder::new(4096);
        let mut calls = 0;
        let r = d
            .decode(&hex(C5[0]), usize::MAX, |_, _| {
                calls += 1;
                Err(())
            })
            .unwrap();
        assert!(r.rejected && !r.too_large);
        assert_eq!(calls, 1);
        assert_eq!(d.table_size(), 222);
        assert_eq!(
            decode_all(&mut d, &hex(C5[1])).unwrap(),
            fields(RESPONSES[1])
        );
    }

    #[test]
    fn never_indexed_and_without_indexing_leave_the_table() {
        let mut d = Decoder::new(4096);
        decode_all(&mut d, &hex(C3[0])).unwrap();
        // Without / never indexed, name from the dynamic table (index 62).
        let got = decode_all(&mut d, &[0x0f, 0x2f, 0x01, b'x', 0x1f, 0x2f, 0x01, b'y']).unwrap();
        assert_eq!(got, fields(&[(":authority", "x"), (":authority", "y")]));
        assert_eq!(d.table_size(), 57);
    }

    /// §5.1 integer, for building blocks by hand.
    fn int(flags: u8, prefix_bits: u32, v: usize) -> Vec<u8> {
        let mask = (1usize << prefix_bits) - 1;
        if v < mask {
            return vec![flags | v as u8];
        }
        let mut out = vec![flags | mask as u8];
        let mut v = v - mask;
        while v >= 128 {
            out.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    #[test]
    fn big_table_wraps_around() {
        // A 100 000-byte table (ring over 64 KiB, past the up-front reservation), filled and
        // cycled several times; every live entry stays readable.
        let mut d = Decoder::new(100_000);
        decode_all(&mut d, &int(0x20, 5, 100_000)).unwrap();
        for i in 0..5000usize {
            let value = format!("{i:0>width$}", width = 20 + (i * 7) % 90);
            let mut block = vec![0x40, 0x03, b'x', b'-', b'a', value.len() as u8];
            block.extend_from_slice(value.as_bytes());
            decode_all(&mut d, &block).unwrap();
            assert!(d.table_size() <= 100_000);
            // The newest and the oldest entries.
            let got = decode_all(&mut d, &[0xbe]).unwrap();
            assert_eq!(got, fields(&[("x-a", &value)]));
            let oldest = 62 + d.table.len() - 1;
            let got = decode_all(&mut d, &int(0x80, 7, oldest)).unwrap();
            assert_eq!(got[0].0, b"x-a");
            let n: usize = got[0].1.iter().take_while(|&&c| c == b'0').count();
            let j: usize = std::str::from_utf8(&got[0].1[n..])
                .unwrap_or("0")
                .parse()
                .unwrap_or(0);
            assert_eq!(j, i + 1 - d.table.len());
        }
        assert!(d.table_size() > 90_000);
        let past = int(0x80, 7, 62 + d.table.len());
        assert_eq!(decode_all(&mut d, &past), Err(DecodeError::BadIndex));
    }

    #[test]
    fn empty_block() {
        let mut d = Decoder::new(4096);
        assert_eq!(decode_all(&mut d, &[]).unwrap(), Fields::new());
    }

    proptest! {
        #[test]
        fn never_panics(blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6)) {
            let mut d = Decoder::new(256);
            for b in blocks {
                let mut total = 0;
                match d.decode(&b, 300, |n, v| { total += n.len() + v.len() + 32; Ok(()) }) {
                    Ok(r) => prop_assert!(total <= 300 && r.list_size >= total),
                    Err(_) => break,
                }
                prop_assert!(d.table_size() <= 256);
            }
        }

        /// Valid-looking input: mostly well-formed representations from a small alphabet.
        #[test]
        fn never_panics_structured(ops in proptest::collection::vec((0u8..6, 0usize..80, "[a-c]{0,5}", any::<bool>()), 0..40)) {
            let mut block = Vec::new();
            for (kind, idx, s, huff) in ops {
                let lit = |block: &mut Vec<u8>, s: &str| {
                    if huff {
                        let mut h = Vec::new();
                        huffman::encode(s.as_bytes(), &mut h);
                        block.push(0x80 | h.len() as u8);
                        block.extend_from_slice(&h);
                    } else {
                        block.push(s.len() as u8);
                        block.extend_from_slice(s.as_bytes());
                    }
                };
                match kind {
                    0 => block.push(0x80 | idx as u8),
                    1 => { block.push(0x40 | (idx % 64) as u8); if idx % 64 == 0 { lit(&mut block, &s) } lit(&mut block, &s) }
                    2 => { block.push((idx % 16) as u8); if idx % 16 == 0 { lit(&mut block, &s) } lit(&mut block, &s) }
                    3 => { block.push(0x10 | (idx % 16) as u8); if idx % 16 == 0 { lit(&mut block, &s) } lit(&mut block, &s) }
                    4 => block.push(0x20 | (idx % 32) as u8),
                    _ => block.push(idx as u8),
                }
            }
            let mut d = Decoder::new(4096);
            let _ = d.decode(&block, 1000, |_, _| Ok(()));
        }
    }
}
