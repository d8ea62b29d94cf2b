//! Field lines encoded before, kept by what they encode. Without a dynamic table, a field
//! costs the same literal, Huffman coding and all, in every answer, and most of an answer's
//! fields repeat from one answer to the next on a connection (`server`, `content-type`,
//! `etag`, `alt-svc`, the second's `date`): measured on h3-small, encoding answer heads was a
//! tenth of tern's CPU, Huffman coding the most of it. From a connection's second answer on,
//! each line is coded once here and copied after. Nothing is shared between connections,
//! so no entry can say anything about another connection's answers.

use super::encoder::encode_field;

/// Direct-mapped: a line's slot is its hash's; a new line takes the slot of the one before.
const SLOTS: usize = 32;
/// Longer fields are coded each time (rare: a long `set-cookie`, a `link` list).
const MAX_KEY: usize = 255;

#[derive(Default)]
struct Slot {
    hash: u64,
    name_len: u8,
    value_len: u8,
    /// The name, the value, then their line as coded.
    bytes: Vec<u8>,
}

/// One connection's coded lines. Kept only from a connection's second answer on: one that
/// makes a single request (most idle ones) holds nothing.
#[derive(Default)]
pub struct EncodedLines {
    slots: Vec<Slot>,
    answers: u8,
}

impl EncodedLines {
    /// An answer's head is about to be encoded.
    pub fn answer_begins(&mut self) {
        self.answers = self.answers.saturating_add(1);
    }

    /// Appends the field line of `name` (lowercase) and `value` to `out`: the same bytes as
    /// [`encode_field`] without the N bit, coded only the first time.
    pub fn encode(&mut self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        if name.len() > MAX_KEY || value.len() > MAX_KEY || self.answers < 2 {
            return encode_field(name, value, false, out);
        }
        if self.slots.is_empty() {
            self.slots.resize_with(SLOTS, Slot::default);
        }
        let hash = hash(name, value);
        let slot = &mut self.slots[(hash as usize) % SLOTS];
        let (n, v) = (name.len(), value.len());
        if slot.hash == hash
            && usize::from(slot.name_len) == n
            && usize::from(slot.value_len) == v
            && slot.bytes[..n] == *name
            && slot.bytes[n..n + v] == *value
        {
            out.extend_from_slice(&slot.bytes[n + v..]);
            return;
        }
        let start = out.len();
        encode_field(name, value, false, out);
        slot.hash = hash;
        slot.name_len = n as u8;
        slot.value_len = v as u8;
        slot.bytes.clear();
        slot.bytes.extend_from_slice(name);
        slot.bytes.extend_from_slice(value);
        slot.bytes.extend_from_slice(&out[start..]);
    }
}

/// A fixed-seed foldhash of the name and the value (each with its length, so where the name
/// ends counts): a slot's bytes are compared in full anyway.
fn hash(name: &[u8], value: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coded(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_field(name, value, false, &mut out);
        out
    }

    #[test]
    fn a_line_reads_as_the_encoder_writes_it_first_time_and_after() {
        let mut lines = EncodedLines::default();
        lines.answer_begins();
        let mut out = Vec::new();
        lines.encode(b"server", b"tern", &mut out);
        assert_eq!(out, coded(b"server", b"tern"));
        assert!(lines.slots.is_empty(), "nothing kept for a first answer");
        lines.answer_begins();
        let fields: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
            .map(|i| {
                let name = [&b"x-field-"[..], (i % 7).to_string().as_bytes()].concat();
                (name, format!("value number {}", i % 53).into_bytes())
            })
            .chain([
                (b"content-type".to_vec(), b"text/html".to_vec()),
                (b"server".to_vec(), b"tern".to_vec()),
                (b"etag".to_vec(), vec![b'e'; 255]),
                (b"link".to_vec(), vec![b'l'; 256]),
            ])
            .collect();
        for round in 0..3 {
            for (name, value) in &fields {
                let mut out = b"before".to_vec();
                lines.encode(name, value, &mut out);
                assert_eq!(out[..6], *b"before");
                assert_eq!(out[6..], coded(name, value), "round {round}");
            }
        }
    }

    #[test]
    fn lines_that_share_a_slot_are_told_apart() {
        // Two fields whose name and value meet at another place: the same bytes in all but
        // where the name ends.
        let mut lines = EncodedLines::default();
        lines.answer_begins();
        lines.answer_begins();
        for _ in 0..2 {
            let mut a = Vec::new();
            lines.encode(b"ab", b"c", &mut a);
            let mut b = Vec::new();
            lines.encode(b"a", b"bc", &mut b);
            assert_eq!(a, coded(b"ab", b"c"));
            assert_eq!(b, coded(b"a", b"bc"));
        }
    }
}
