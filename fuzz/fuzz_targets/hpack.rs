//! HPACK (tern-http2). The first byte picks the mode.
//!
//! Even: the rest is several header blocks, separated by the bytes `fe ff`, decoded in turn by
//! one Decoder (table and list limits from the first byte) until one fails. Checks the list
//! size limit, the table size limit, that a second decoder whose callback refuses a field stays
//! in step with the first, and that every fully decoded block re-encodes and decodes to the same
//! fields.
//!
//! Odd: the rest is a list of fields, `[control, name length, value length, name, value]`
//! each, encoded by one Encoder and decoded by one Decoder: the fields must come back unchanged
//! and both tables must have the same size. Control: bits 0-1 indexing, bit 2 starts a new
//! block, bit 3 sets the peer's table size to 16 × the name length first. The rest is also
//! Huffman round-tripped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_http2::hpack::{huffman, Decoder, Encoder, Indexing};

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn blocks(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.windows(2).position(|w| w == [0xfe, 0xff]) {
            Some(i) => {
                rest = Some(&r[i + 2..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

fn decode_mode(mode: u8, data: &[u8]) {
    let max_table = [0, 64, 256, 4096][usize::from(mode >> 1) & 3];
    let max_list = [0, 100, 1000, 1 << 20][usize::from(mode >> 3) & 3];
    let reject_at = usize::from(mode >> 5);
    let mut dec = Decoder::new(max_table);
    let mut picky = Decoder::new(max_table);
    for block in blocks(data) {
        let mut got: Fields = Vec::new();
        let r = dec.decode(block, max_list, |n, v| {
            got.push((n.to_vec(), v.to_vec()));
            Ok(())
        });
        let mut calls = 0;
        let p = picky.decode(block, max_list, |_, _| {
            calls += 1;
            if calls > reject_at {
                Err(())
            } else {
                Ok(())
            }
        });
        let r = match (r, p) {
            (Ok(r), Ok(p)) => {
                assert_eq!(r.list_size, p.list_size);
                assert_eq!(r.too_large, p.too_large);
                assert!(!r.rejected);
                assert!(calls <= reject_at + 1);
                assert_eq!(p.rejected, calls > reject_at);
                r
            }
            (Err(a), Err(b)) => {
                assert_eq!(a, b);
                return;
            }
            (r, p) => panic!("decoders disagree: {r:?} / {p:?}"),
        };
        assert_eq!(dec.table_size(), picky.table_size());
        assert!(dec.table_size() <= max_table);
        let emitted: usize = got.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
        assert!(emitted <= max_list && emitted <= r.list_size);
        if r.too_large {
            assert!(r.list_size > max_list);
            continue;
        }
        assert_eq!(emitted, r.list_size);
        // Whatever decoded re-encodes (fresh tables) to the same list.
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.begin_block(&mut out);
        for (i, (n, v)) in got.iter().enumerate() {
            let indexing = [Indexing::Incremental, Indexing::Without, Indexing::Never][i % 3];
            enc.encode(n, v, indexing, &mut out);
        }
        let mut again: Fields = Vec::new();
        Decoder::new(4096)
            .decode(&out, usize::MAX, |n, v| {
                again.push((n.to_vec(), v.to_vec()));
                Ok(())
            })
            .expect("re-encoded block decodes");
        assert_eq!(again, got);
    }
}

fn round_trip_mode(data: &[u8]) {
    let mut h = Vec::new();
    huffman::encode(data, &mut h);
    assert_eq!(h.len(), huffman::encoded_len(data));
    let mut back = Vec::new();
    huffman::decode(&h, &mut back).expect("own Huffman output decodes");
    assert_eq!(back, data);

    let mut enc = Encoder::new();
    let mut dec = Decoder::new(4096);
    let mut out = Vec::new();
    let mut want: Fields = Vec::new();
    let mut flush = |enc: &mut Encoder, out: &mut Vec<u8>, want: &mut Fields| {
        let mut got: Fields = Vec::new();
        let r = dec
            .decode(out, usize::MAX, |n, v| {
                got.push((n.to_vec(), v.to_vec()));
                Ok(())
            })
            .expect("encoder output decodes");
        assert!(!r.too_large && !r.rejected);
        assert_eq!(&got, want);
        assert_eq!(enc.table_size(), dec.table_size());
        out.clear();
        want.clear();
    };
    enc.begin_block(&mut out);
    let mut rest = data;
    while let [ctrl, nlen, vlen, tail @ ..] = rest {
        let (nlen, vlen) = (usize::from(*nlen), usize::from(*vlen));
        if tail.len() < nlen + vlen {
            break;
        }
        let (name, tail) = tail.split_at(nlen);
        let (value, tail) = tail.split_at(vlen);
        rest = tail;
        if ctrl & 4 != 0 {
            flush(&mut enc, &mut out, &mut want);
            if ctrl & 8 != 0 {
                enc.set_peer_max_table_size(nlen * 16);
            }
            enc.begin_block(&mut out);
        }
        let indexing = [
            Indexing::Incremental,
            Indexing::Without,
            Indexing::Never,
            Indexing::Incremental,
        ][usize::from(ctrl & 3)];
        enc.encode(name, value, indexing, &mut out);
        want.push((name.to_vec(), value.to_vec()));
    }
    flush(&mut enc, &mut out, &mut want);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        decode_mode(mode, rest);
    } else {
        round_trip_mode(rest);
    }
});
