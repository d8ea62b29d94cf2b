//! Plaintext handshake messages (a ClientHello, a TLS 1.2 ClientKeyExchange) gathered out of
//! records of any size and framed again for rustls, each message in records of at most
//! [`MAX_PLAINTEXT`] that end where it ends.
//!
//! Why: rustls joins a message's fragments where they were read, so every record of a
//! message stays in the read buffer, headers included, until the message is whole. A 64 KB
//! ClientHello sent in 1-byte records would need 384 KB of buffer. Gathered here, a message
//! takes its own size plus 5 bytes a record, however it was cut, and the records it came in
//! are consumed as they arrive. RFC 8446 §5.1 and RFC 5246 §6.2.1 let a handshake message be
//! cut anywhere, so what rustls sees is the same stream of messages.

use crate::record::{content, HEADER, MAX_PLAINTEXT};

/// The largest handshake message rustls accepts (its deframer's limit).
pub const MAX_HANDSHAKE_MESSAGE: usize = 0xffff;
/// A handshake message's header: type and 24-bit length.
const MESSAGE_HEADER: usize = 4;

/// The message announced a length larger than [`MAX_HANDSHAKE_MESSAGE`].
#[derive(Debug, PartialEq, Eq)]
pub struct TooLarge;

#[derive(Default)]
pub struct Gathered {
    /// Records made: those of whole messages (the first `ready` bytes), then the one being
    /// filled.
    records: Vec<u8>,
    ready: usize,
    /// Where the record being filled starts in `records`.
    open: Option<usize>,
    /// The header of the message under way, as much of it as has come.
    header: [u8; MESSAGE_HEADER],
    header_len: usize,
    /// Body bytes of the message under way still to come.
    body_left: usize,
    /// The record version the message under way came with (given to its records).
    version: [u8; 2],
}

impl Gathered {
    /// Nothing gathered: no part of a message waits, no record is ready.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.header_len == 0
    }

    /// The records of whole messages, for rustls.
    pub fn ready_mut(&mut self) -> &mut [u8] {
        &mut self.records[..self.ready]
    }

    pub fn has_ready(&self) -> bool {
        self.ready > 0
    }

    /// rustls is done with the first `n` ready bytes.
    pub fn discard(&mut self, n: usize) {
        let n = n.min(self.ready);
        self.records.drain(..n);
        self.ready -= n;
        self.open = self.open.map(|at| at - n);
        if self.records.is_empty() {
            // A 64 KB message's records are not kept for the rest of the connection.
            self.records = Vec::new();
        }
    }

    /// Takes the payload of one plaintext handshake record (its header's `version`).
    pub fn push(&mut self, version: [u8; 2], mut payload: &[u8]) -> Result<(), TooLarge> {
        while !payload.is_empty() {
            if self.header_len < MESSAGE_HEADER {
                if self.header_len == 0 {
                    self.version = version;
                }
                let n = (MESSAGE_HEADER - self.header_len).min(payload.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&payload[..n]);
                self.header_len += n;
                self.append(&payload[..n]);
                payload = &payload[n..];
                if self.header_len < MESSAGE_HEADER {
                    continue;
                }
                let [_, a, b, c] = self.header;
                self.body_left = u32::from_be_bytes([0, a, b, c]) as usize;
                if self.body_left > MAX_HANDSHAKE_MESSAGE {
                    return Err(TooLarge);
                }
            } else {
                let n = self.body_left.min(payload.len());
                self.append(&payload[..n]);
                payload = &payload[n..];
                self.body_left -= n;
            }
            if self.body_left == 0 {
                // The message is whole: its last record ends with it.
                self.close_record();
                self.ready = self.records.len();
                self.header_len = 0;
            }
        }
        Ok(())
    }

    fn append(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = match self.open {
                Some(at) => MAX_PLAINTEXT - (self.records.len() - at - HEADER),
                None => 0,
            };
            if room == 0 {
                self.close_record();
                self.open = Some(self.records.len());
                let [v0, v1] = self.version;
                self.records
                    .extend_from_slice(&[content::HANDSHAKE, v0, v1, 0, 0]);
                continue;
            }
            let n = room.min(bytes.len());
            self.records.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
    }

    fn close_record(&mut self) {
        if let Some(at) = self.open.take() {
            let len = (self.records.len() - at - HEADER) as u16;
            self.records[at + 3..at + HEADER].copy_from_slice(&len.to_be_bytes());
        }
    }
}

/// The payload is one or more whole handshake messages (rustls can take its record as it is).
pub fn whole_messages(payload: &[u8]) -> bool {
    let mut at = 0;
    while at < payload.len() {
        let Some(&[_, a, b, c]) = payload.get(at..at + MESSAGE_HEADER) else {
            return false;
        };
        at += MESSAGE_HEADER + u32::from_be_bytes([0, a, b, c]) as usize;
    }
    at == payload.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records `gathered` has ready, as (version, payload) each.
    fn records(gathered: &mut Gathered) -> Vec<([u8; 2], Vec<u8>)> {
        let mut out = Vec::new();
        let ready = gathered.ready_mut().to_vec();
        let mut at = 0;
        while at < ready.len() {
            let len = u16::from_be_bytes([ready[at + 3], ready[at + 4]]) as usize;
            assert_eq!(ready[at], content::HANDSHAKE);
            out.push((
                [ready[at + 1], ready[at + 2]],
                ready[at + 5..at + 5 + len].to_vec(),
            ));
            at += 5 + len;
        }
        out
    }

    #[test]
    fn a_message_in_one_byte_pieces_comes_out_in_full_records_ending_with_it() {
        let mut message = vec![1, 0, 0xa0, 0x00];
        message.extend((0..0xa000u32).map(|i| i as u8));
        let mut g = Gathered::default();
        for (i, byte) in message.iter().enumerate() {
            assert!(!g.has_ready(), "ready only when whole ({i})");
            g.push([3, 1], std::slice::from_ref(byte)).unwrap();
        }
        let got = records(&mut g);
        let sizes: Vec<usize> = got.iter().map(|(_, p)| p.len()).collect();
        assert_eq!(
            sizes,
            [MAX_PLAINTEXT, MAX_PLAINTEXT, 4 + 0xa000 - 2 * MAX_PLAINTEXT]
        );
        let joined: Vec<u8> = got.iter().flat_map(|(_, p)| p.clone()).collect();
        assert!(joined == message && got.iter().all(|(v, _)| *v == [3, 1]));
        g.discard(g.ready);
        assert!(g.is_empty());
    }

    #[test]
    fn messages_sharing_a_record_are_split_at_their_ends() {
        let mut g = Gathered::default();
        // A whole message and the first half of the next, then its second half.
        g.push([3, 3], &[16, 0, 0, 2, 7, 7, 20, 0, 0, 3, 1])
            .unwrap();
        assert_eq!(records(&mut g), [([3, 3], vec![16, 0, 0, 2, 7, 7])]);
        g.discard(11);
        assert!(!g.is_empty() && !g.has_ready(), "half a message waits");
        g.push([3, 3], &[2, 3]).unwrap();
        assert_eq!(records(&mut g), [([3, 3], vec![20, 0, 0, 3, 1, 2, 3])]);
    }

    #[test]
    fn a_message_over_the_limit_is_refused_by_its_header() {
        let mut g = Gathered::default();
        g.push([3, 1], &[1, 0, 0xff]).unwrap();
        assert_eq!(g.push([3, 1], &[0xff]), Ok(()), "0xffff is allowed");
        let mut g = Gathered::default();
        assert_eq!(g.push([3, 1], &[1, 1, 0, 0]), Err(TooLarge));
    }

    #[test]
    fn whole_messages_are_recognised() {
        assert!(whole_messages(&[1, 0, 0, 1, 9, 2, 0, 0, 0]));
        assert!(!whole_messages(&[1, 0, 0, 2, 9]));
        assert!(!whole_messages(&[1, 0, 0]));
    }
}
