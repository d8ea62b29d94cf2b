//! The HPACK encoder (RFC 7541 §3, §6): fields in, header block bytes out.
//!
//! Choices: an exact match in the static or dynamic table is sent as an index; otherwise a
//! literal, with the name as an index when either table has it (the static one preferred: its
//! indexes are small and it costs no scan), and each string Huffman-coded when that is
//! shorter. The caller picks the indexing of literals per field.

use super::table::{static_find, DynTable};
use super::{huffman, DEFAULT_TABLE_SIZE};

/// How a literal field is treated by the dynamic tables (RFC 7541 §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Indexing {
    /// Added to both dynamic tables: for values likely to repeat on the connection.
    Incremental,
    /// Not added: for values unlikely to repeat.
    Without,
    /// Not added, and intermediaries must not add it either (§7.1.3): for secrets such as
    /// short cookies or authorization values. Never sent as an index, even on an exact match.
    Never,
}

/// HPACK encoding state for one connection (one direction).
pub struct Encoder {
    table: DynTable,
    /// Smallest maximum table size since the last block, when it changed (§4.2: the next
    /// block must signal it, then the current one if larger).
    pending_min: Option<usize>,
    /// Off only in tests, to reproduce the RFC's plain-string examples.
    huffman: bool,
    /// Counts changes to the table's contents or size: a block encoded while it did not
    /// move refers only to entries that are still where they were, so it can be sent again.
    generation: u64,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new()
    }
}

impl Encoder {
    /// Starts with the RFC default table size 4096 and uses at most
    /// `min(peer's SETTINGS_HEADER_TABLE_SIZE, 4096)`.
    pub fn new() -> Encoder {
        Encoder {
            table: DynTable::new(DEFAULT_TABLE_SIZE),
            pending_min: None,
            huffman: true,
            generation: 0,
        }
    }

    /// The peer's SETTINGS_HEADER_TABLE_SIZE changed: shrinks the table now if needed, and the
    /// next block starts with a dynamic table size update if the size we use changed. We never
    /// go above 4096, which bounds the table's memory and scan cost whatever the peer allows.
    pub fn set_peer_max_table_size(&mut self, n: usize) {
        let size = n.min(DEFAULT_TABLE_SIZE);
        if size == self.table.max_size() {
            return;
        }
        self.pending_min = Some(self.pending_min.map_or(size, |m| m.min(size)));
        self.generation += 1;
        self.table.set_max_size(size);
    }

    /// Call once at the start of each header block: emits a pending size update.
    pub fn begin_block(&mut self, out: &mut Vec<u8>) {
        if let Some(min) = self.pending_min.take() {
            self.generation += 1;
            let size = self.table.max_size();
            if min < size {
                write_int(out, 0x20, 5, min);
            }
            write_int(out, 0x20, 5, size);
        }
    }

    /// `:status`: indexed when the static table has it (200, 204, 206, 304, 400, 404, 500),
    /// else a literal without indexing under static name index 8. Not indexed because other
    /// codes are rarer: an entry would cost a table scan on every response and push out
    /// entries that repeat more (server, content-type), to save 3 bytes when it is reused.
    pub fn encode_status(&mut self, status: u16, out: &mut Vec<u8>) {
        let index = match status {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => {
                out.push(0x08);
                let mut digits = [0u8; 5];
                let mut n = status;
                let mut i = digits.len();
                loop {
                    i -= 1;
                    digits[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                self.write_string(out, &digits[i..]);
                return;
            }
        };
        out.push(0x80 | index);
    }

    /// One field; `name` is already lowercase. An exact match in the static or dynamic table
    /// is sent as an index (except with [`Indexing::Never`]); otherwise a literal, with a name
    /// index when either table has the name, and each string Huffman-coded when shorter.
    /// [`Indexing::Incremental`] literals are added to the dynamic table (evicting the oldest
    /// entries; an entry bigger than the table empties it and is not added).
    pub fn encode(&mut self, name: &[u8], value: &[u8], indexing: Indexing, out: &mut Vec<u8>) {
        let (static_name, static_exact) = static_find(name, value);
        if indexing != Indexing::Never {
            if let Some(i) = static_exact {
                write_int(out, 0x80, 7, i);
                return;
            }
        }
        // The dynamic table is only scanned when it could change the representation.
        let (dyn_exact, dyn_name) =
            if self.table.len() == 0 || (indexing == Indexing::Never && static_name.is_some()) {
                (None, None)
            } else {
                self.table.find(name, value)
            };
        if indexing != Indexing::Never {
            if let Some(i) = dyn_exact {
                write_int(out, 0x80, 7, 62 + i);
                return;
            }
        }
        let (flags, prefix) = match indexing {
            Indexing::Incremental => (0x40, 6),
            Indexing::Without => (0x00, 4),
            Indexing::Never => (0x10, 4),
        };
        match static_name.or(dyn_name.map(|i| 62 + i)) {
            Some(i) => write_int(out, flags, prefix, i),
            None => {
                out.push(flags);
                self.write_string(out, name);
            }
        }
        self.write_string(out, value);
        if indexing == Indexing::Incremental {
            self.table.insert(name, value);
            self.generation += 1;
        }
    }

    /// Changes whenever the dynamic table does (see the field).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Current dynamic table size in bytes (§4.1).
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// §5.2: Huffman-coded when strictly shorter. Codes first and measures after (one pass
    /// over the string instead of two), assuming the usual 1-byte length prefix.
    #[inline]
    fn write_string(&self, out: &mut Vec<u8>, s: &[u8]) {
        if self.huffman {
            let at = out.len();
            out.push(0x80);
            huffman::encode(s, out);
            let len = out.len() - at - 1;
            if len < 127 && len < s.len() {
                out[at] = 0x80 | len as u8;
                return;
            }
            if len < s.len() {
                let mut prefix = [0u8; 11];
                let n = int_bytes(&mut prefix, 0x80, 7, len);
                out.splice(at..at + 1, prefix[..n].iter().copied());
                return;
            }
            out.truncate(at);
        }
        write_int(out, 0, 7, s.len());
        out.extend_from_slice(s);
    }

    #[cfg(test)]
    fn set_huffman(&mut self, on: bool) {
        self.huffman = on;
    }
}

/// §5.1: `value` with an N-bit prefix; `flags` holds the first byte's other bits.
#[inline]
fn write_int(out: &mut Vec<u8>, flags: u8, prefix_bits: u32, value: usize) {
    let mask = (1usize << prefix_bits) - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    let mut buf = [0u8; 11];
    let n = int_bytes(&mut buf, flags, prefix_bits, value);
    out.extend_from_slice(&buf[..n]);
}

/// [`write_int`] into `buf` (11 bytes hold any `usize`); returns the length.
fn int_bytes(buf: &mut [u8; 11], flags: u8, prefix_bits: u32, value: usize) -> usize {
    let mask = (1usize << prefix_bits) - 1;
    if value < mask {
        buf[0] = flags | value as u8;
        return 1;
    }
    buf[0] = flags | mask as u8;
    let mut v = value - mask;
    let mut n = 1;
    while v >= 128 {
        buf[n] = 0x80 | (v & 0x7f) as u8;
        v >>= 7;
        n += 1;
    }
    buf[n] = v as u8;
    n + 1
}

#[cfg(test)]
mod tests {
    use super::super::decoder::tests::{
        decode_all, fields, hex, Fields, C3, C4, C5, C6, REQUESTS, REQUEST_TABLE_SIZES, RESPONSES,
        RESPONSE_TABLE_SIZES,
    };
    use super::super::{DecodeError, Decoder};
    use super::*;
    use proptest::prelude::*;

    fn encode_block(e: &mut Encoder, list: &[(&str, &str)], indexing: Indexing) -> Vec<u8> {
        let mut out = Vec::new();
        e.begin_block(&mut out);
        for (n, v) in list {
            e.encode(n.as_bytes(), v.as_bytes(), indexing, &mut out);
        }
        out
    }

    #[test]
    fn integers() {
        // RFC 7541 C.1.
        let mut out = Vec::new();
        write_int(&mut out, 0, 5, 10);
        assert_eq!(out, [0b01010]);
        out.clear();
        write_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [0b11111, 0b10011010, 0b00001010]);
        out.clear();
        write_int(&mut out, 0, 8, 42);
        assert_eq!(out, [42]);
        out.clear();
        write_int(&mut out, 0x20, 5, 31);
        assert_eq!(out, [0x3f, 0x00]);
        out.clear();
        write_int(&mut out, 0x80, 7, usize::MAX);
        assert_eq!(out.len(), 11);
    }

    /// C.3 and C.4 with incremental indexing give the RFC's bytes exactly; C.5 and C.6 too,
    /// with the table limited to 256 (the RFC leaves out the size update that sets it).
    #[test]
    fn rfc_examples_exact_bytes() {
        for (blocks, huffman) in [(C3, false), (C4, true)] {
            let mut e = Encoder::new();
            e.set_huffman(huffman);
            let mut d = Decoder::new(4096);
            for i in 0..3 {
                let out = encode_block(&mut e, REQUESTS[i], Indexing::Incremental);
                assert_eq!(out, hex(blocks[i]), "request {i}, huffman {huffman}");
                assert_eq!(decode_all(&mut d, &out).unwrap(), fields(REQUESTS[i]));
                assert_eq!(e.table_size(), REQUEST_TABLE_SIZES[i]);
                assert_eq!(d.table_size(), REQUEST_TABLE_SIZES[i]);
            }
        }
        for (blocks, huffman) in [(C5, false), (C6, true)] {
            let mut e = Encoder::new();
            e.set_huffman(huffman);
            e.set_peer_max_table_size(256);
            let mut d = Decoder::new(4096);
            for i in 0..3 {
                let out = encode_block(&mut e, RESPONSES[i], Indexing::Incremental);
                let body = if i == 0 {
                    // 256 = 31 + 225: 3f e1 01.
                    assert_eq!(out[..3], [0x3f, 0xe1, 0x01]);
                    &out[3..]
                } else {
                    &out[..]
                };
                // "307" Huffman-codes to 3 bytes, no shorter: we send it plain, the RFC coded.
                let want = if huffman && i == 1 {
                    hex(C5[1])
                } else {
                    hex(blocks[i])
                };
                assert_eq!(body, want, "response {i}, huffman {huffman}");
                assert_eq!(decode_all(&mut d, &out).unwrap(), fields(RESPONSES[i]));
                assert_eq!(e.table_size(), RESPONSE_TABLE_SIZES[i]);
                assert_eq!(d.table_size(), RESPONSE_TABLE_SIZES[i]);
            }
        }
    }

    /// Every indexing mode round-trips through the decoder on the RFC's field lists.
    #[test]
    fn rfc_lists_round_trip() {
        for indexing in [Indexing::Incremental, Indexing::Without, Indexing::Never] {
            for (lists, table) in [(REQUESTS, 4096), (RESPONSES, 256)] {
                let mut e = Encoder::new();
                e.set_peer_max_table_size(table);
                let mut d = Decoder::new(4096);
                for list in lists {
                    let out = encode_block(&mut e, list, indexing);
                    assert_eq!(decode_all(&mut d, &out).unwrap(), fields(list));
                    assert_eq!(e.table_size(), d.table_size());
                    if indexing != Indexing::Incremental {
                        assert_eq!(e.table_size(), 0);
                    }
                }
            }
        }
    }

    #[test]
    fn never_indexed_is_never_an_index() {
        let mut e = Encoder::new();
        let mut out = Vec::new();
        e.encode(b":method", b"GET", Indexing::Never, &mut out);
        assert_eq!(out, [0x12, 0x03, b'G', b'E', b'T']);
        out.clear();
        e.encode(b"x-secret", b"s", Indexing::Incremental, &mut out);
        out.clear();
        e.encode(b"x-secret", b"s", Indexing::Never, &mut out);
        // Name from the dynamic table (62 = 15 + 47), value literal.
        assert_eq!(out, [0x1f, 0x2f, 0x01, b's']);
        out.clear();
        e.encode(b"x-secret", b"s", Indexing::Without, &mut out);
        assert_eq!(out, [0xbe]);
    }

    #[test]
    fn status() {
        let mut d = Decoder::new(4096);
        for status in [
            200u16, 204, 206, 304, 400, 404, 500, 100, 301, 302, 307, 403, 503, 0, 9, 65535,
        ] {
            let mut e = Encoder::new();
            let mut out = Vec::new();
            e.encode_status(status, &mut out);
            if [200, 204, 206, 304, 400, 404, 500].contains(&status) {
                assert_eq!(out.len(), 1);
            }
            let got = decode_all(&mut d, &out).unwrap();
            assert_eq!(got, fields(&[(":status", &status.to_string())]));
            assert_eq!(e.table_size(), 0);
        }
        let mut out = Vec::new();
        Encoder::new().encode_status(302, &mut out);
        assert_eq!(out, hex("08 82 6402"));
    }

    #[test]
    fn size_updates() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        let big = [("x-a", "1".repeat(100)), ("x-b", "2".repeat(100))];
        let list: Vec<(&str, &str)> = big.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let out = encode_block(&mut e, &list, Indexing::Incremental);
        decode_all(&mut d, &out).unwrap();
        assert_eq!(e.table_size(), 2 * 135);
        // No change, no update.
        e.set_peer_max_table_size(65536);
        let mut out = Vec::new();
        e.begin_block(&mut out);
        assert!(out.is_empty());
        // Shrinking evicts now and is signalled once, in the next block.
        e.set_peer_max_table_size(200);
        assert_eq!(e.table_size(), 135);
        let out = encode_block(&mut e, &[("x-b", &"2".repeat(100))], Indexing::Incremental);
        assert_eq!(out, [0x3f, 0xa9, 0x01, 0xbe]); // 200 = 31 + 169; then index 62
        assert_eq!(
            decode_all(&mut d, &out).unwrap(),
            fields(&[("x-b", &"2".repeat(100))])
        );
        assert_eq!(d.table_size(), 135);
        let mut out = Vec::new();
        e.begin_block(&mut out);
        assert!(out.is_empty());
        // Down then up between blocks: the minimum, then the final size (§4.2).
        e.set_peer_max_table_size(0);
        e.set_peer_max_table_size(8192);
        assert_eq!(e.table_size(), 0);
        let out = encode_block(&mut e, &list, Indexing::Incremental);
        assert_eq!(out[..4], [0x20, 0x3f, 0xe1, 0x1f]);
        decode_all(&mut d, &out).unwrap();
        assert_eq!((e.table_size(), d.table_size()), (270, 270));
        // The decoder refuses an update above its limit.
        let mut small = Decoder::new(100);
        let mut e = Encoder::new();
        e.set_peer_max_table_size(50);
        e.set_peer_max_table_size(4000);
        let out = encode_block(&mut e, &[], Indexing::Incremental);
        assert_eq!(
            small.decode(&out, 1000, |_, _| Ok(())).unwrap_err(),
            DecodeError::SizeUpdateTooLarge
        );
    }

    #[test]
    fn long_strings() {
        // Huffman lengths around the 1-byte prefix limit (127), and plain ones.
        let mut d = Decoder::new(4096);
        for n in [0, 1, 100, 126, 127, 128, 202, 203, 204, 205, 1000, 20000] {
            let text = "abcde".repeat(n)[..n].to_string();
            let upper = "\x01".repeat(n); // 28-bit codes: plain is shorter
            let mut e = Encoder::new();
            let out = encode_block(
                &mut e,
                &[("x-t", &text), ("x-u", &upper)],
                Indexing::Without,
            );
            let got = decode_all(&mut d, &out).unwrap();
            assert_eq!(got, fields(&[("x-t", &text), ("x-u", &upper)]), "{n}");
        }
    }

    #[test]
    fn entry_bigger_than_the_table() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        let v = "v".repeat(5000);
        let out = encode_block(
            &mut e,
            &[("a", "b"), ("x-big", &v), ("a", "b")],
            Indexing::Incremental,
        );
        // The big entry empties the table and is not stored, so the third field is a literal.
        assert_eq!(
            decode_all(&mut d, &out).unwrap(),
            fields(&[("a", "b"), ("x-big", &v), ("a", "b")])
        );
        assert_eq!((e.table_size(), d.table_size()), (34, 34));
    }

    proptest! {
        #[test]
        fn round_trip(
            blocks in proptest::collection::vec(
                proptest::collection::vec(
                    (
                        prop_oneof![
                            Just(b":path".to_vec()),
                            Just(b"cookie".to_vec()),
                            Just(b"accept".to_vec()),
                            Just(b"x-a".to_vec()),
                            proptest::collection::vec(any::<u8>(), 0..12),
                        ],
                        prop_oneof![
                            Just(b"/".to_vec()),
                            Just(b"".to_vec()),
                            Just(b"same".to_vec()),
                            proptest::collection::vec(any::<u8>(), 0..300),
                        ],
                        0u8..3,
                    ),
                    0..12,
                ),
                1..8,
            ),
            table in prop_oneof![Just(4096usize), Just(0), Just(64), Just(300), 0usize..5000],
        ) {
            let mut e = Encoder::new();
            e.set_peer_max_table_size(table);
            let mut d = Decoder::new(4096);
            for block in blocks {
                let mut out = Vec::new();
                e.begin_block(&mut out);
                let mut want = Fields::new();
                for (n, v, k) in block {
                    let indexing = [Indexing::Incremental, Indexing::Without, Indexing::Never][k as usize];
                    e.encode(&n, &v, indexing, &mut out);
                    want.push((n, v));
                }
                prop_assert_eq!(decode_all(&mut d, &out).unwrap(), want);
                prop_assert_eq!(e.table_size(), d.table_size());
            }
        }
    }

    /// Best-of-30 average over 20 000 runs, in ns: other load on the machine only slows runs.
    fn min_ns(mut f: impl FnMut()) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..30 {
            let n = 20_000;
            let t = std::time::Instant::now();
            for _ in 0..n {
                f();
            }
            best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
        }
        best
    }

    /// Rough timings: `cargo test --release -p tern-http2 --lib hpack -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn timing() {
        use std::hint::black_box;
        let request: &[(&str, &str)] = &[
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "www.example.com"),
            (":path", "/assets/app.min.js?v=3f2a9c"),
            (
                "user-agent",
                "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
            ),
            (
                "accept",
                "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            ),
            ("accept-encoding", "gzip, deflate, br, zstd"),
            ("accept-language", "en-US,en;q=0.5"),
        ];
        let mut e = Encoder::new();
        let first = encode_block(&mut e, request, Indexing::Incremental);
        let second = encode_block(&mut e, request, Indexing::Incremental);
        let plain = {
            let mut e = Encoder::new();
            e.set_huffman(false);
            encode_block(&mut e, request, Indexing::Without)
        };
        for (what, block) in [
            ("literals, Huffman, incremental", &first),
            ("literals, plain, without indexing", &plain),
            ("repeat, all indexed", &second),
        ] {
            // Warm: the first block's entries are in the table, as on a live connection (the
            // literal block keeps inserting and evicting).
            let mut d = Decoder::new(4096);
            d.decode(&first, usize::MAX, |_, _| Ok(())).unwrap();
            let ns = min_ns(|| {
                let r = d.decode(black_box(block), usize::MAX, |a, b| {
                    black_box((a, b));
                    Ok(())
                });
                black_box(r.unwrap());
            });
            println!(
                "decode 8-field request, {what}: {} bytes, {ns:.0} ns",
                block.len()
            );
        }
        let mut out = Vec::with_capacity(512);
        let ns = min_ns(|| {
            let mut e = Encoder::new();
            out.clear();
            for (k, v) in request {
                e.encode(k.as_bytes(), v.as_bytes(), Indexing::Incremental, &mut out);
            }
            black_box(&out);
        });
        println!("encode the same request, fresh encoder: {ns:.0} ns");
        let response: &[(&str, &str)] = &[
            ("content-type", "text/html; charset=utf-8"),
            ("content-length", "5120"),
            ("server", "tern"),
        ];
        let mut e = Encoder::new();
        encode_block(&mut e, response, Indexing::Incremental);
        let ns = min_ns(|| {
            out.clear();
            e.encode_status(200, &mut out);
            for (k, v) in response {
                e.encode(k.as_bytes(), v.as_bytes(), Indexing::Incremental, &mut out);
            }
            black_box(&out);
        });
        println!("encode a repeated 4-field response (all indexed): {ns:.0} ns");
    }
}
