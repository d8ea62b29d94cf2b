//! Handshake messages a client sends on an established session, read across records (a
//! message may span records, RFC 8446 §5.1): TLS 1.3's KeyUpdate, and under TLS 1.2 a
//! ClientHello asking to renegotiate, skipped whole and declined. Anything else is refused
//! with the alert the RFCs name.

use crate::record::RecordError;

const CLIENT_HELLO: u8 = 1;
const KEY_UPDATE: u8 = 24;
/// A handshake message's header: type and 24-bit length.
const MESSAGE_HEADER: usize = 4;
/// The largest renegotiating ClientHello skipped (rustls's limit on a handshake message).
const MAX_SKIPPED: usize = 0xffff;

/// What a complete message asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    /// The client changed its key; `also_ours` asks for ours to change too.
    KeyUpdate { also_ours: bool },
    /// A TLS 1.2 client asked to renegotiate (declined with a warning, RFC 5246 §7.2.2).
    Renegotiation,
}

#[derive(Default)]
pub struct PostHandshake {
    header: [u8; MESSAGE_HEADER],
    header_len: usize,
    body_left: usize,
    /// The KeyUpdate's request_update byte, once read.
    request: Option<u8>,
}

impl PostHandshake {
    /// Part of a message has come: until it is whole, only handshake records may follow.
    pub fn is_partial(&self) -> bool {
        self.header_len > 0
    }

    /// Reads the payload of one handshake record. A message must end its record (a KeyUpdate
    /// comes before a key change, RFC 8446 §5.1; a ClientHello waits for an answer), so a
    /// record completes at most one.
    pub fn read(
        &mut self,
        tls13: bool,
        mut payload: &[u8],
    ) -> Result<Option<Message>, RecordError> {
        if payload.is_empty() {
            // Zero-length handshake fragments are forbidden (RFC 8446 §5.1).
            return Err(RecordError::Unexpected);
        }
        while !payload.is_empty() {
            if self.header_len < MESSAGE_HEADER {
                let n = (MESSAGE_HEADER - self.header_len).min(payload.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&payload[..n]);
                self.header_len += n;
                payload = &payload[n..];
                let expected = if tls13 { KEY_UPDATE } else { CLIENT_HELLO };
                if self.header[0] != expected {
                    return Err(RecordError::Unexpected);
                }
                if self.header_len < MESSAGE_HEADER {
                    continue;
                }
                let [_, a, b, c] = self.header;
                self.body_left = u32::from_be_bytes([0, a, b, c]) as usize;
                let length_fits = match tls13 {
                    // KeyUpdate's body is its one request_update byte (RFC 8446 §4.6.3).
                    true => self.body_left == 1,
                    false => self.body_left <= MAX_SKIPPED,
                };
                if !length_fits {
                    return Err(RecordError::Decode);
                }
            } else {
                let n = self.body_left.min(payload.len());
                if tls13 {
                    self.request = Some(payload[0]);
                }
                self.body_left -= n;
                payload = &payload[n..];
            }
            if self.body_left > 0 {
                continue;
            }
            if !payload.is_empty() {
                // Not aligned with the record's end.
                return Err(RecordError::Unexpected);
            }
            self.header_len = 0;
            return match self.request.take() {
                _ if !tls13 => Ok(Some(Message::Renegotiation)),
                Some(request @ (0 | 1)) => Ok(Some(Message::KeyUpdate {
                    also_ours: request == 1,
                })),
                _ => Err(RecordError::IllegalParameter),
            };
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(tls13: bool, records: &[&[u8]]) -> Result<Vec<Message>, RecordError> {
        let mut reader = PostHandshake::default();
        let mut got = Vec::new();
        for record in records {
            got.extend(reader.read(tls13, record)?);
        }
        assert!(!reader.is_partial(), "a whole message was read");
        Ok(got)
    }

    #[test]
    fn a_key_update_is_read_however_it_is_cut() {
        let message = [24, 0, 0, 1, 1];
        for cut in 1..message.len() {
            let (a, b) = message.split_at(cut);
            assert_eq!(
                read_all(true, &[a, b]),
                Ok(vec![Message::KeyUpdate { also_ours: true }]),
                "cut at {cut}"
            );
        }
        let bytes: Vec<[u8; 1]> = [24, 0, 0, 1, 0].map(|b| [b]).to_vec();
        let records: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
        assert_eq!(
            read_all(true, &records),
            Ok(vec![Message::KeyUpdate { also_ours: false }])
        );
    }

    #[test]
    fn malformed_key_updates_get_the_alerts_rfc_8446_names() {
        let mut r = PostHandshake::default();
        assert_eq!(
            r.read(true, &[24, 0, 0, 1, 2]),
            Err(RecordError::IllegalParameter)
        );
        let mut r = PostHandshake::default();
        assert_eq!(r.read(true, &[24, 0, 0, 0]), Err(RecordError::Decode));
        let mut r = PostHandshake::default();
        assert_eq!(r.read(true, &[24, 0, 0, 2, 1, 0]), Err(RecordError::Decode));
        let mut r = PostHandshake::default();
        assert_eq!(
            r.read(true, &[24, 0, 0, 1, 0, 24]),
            Err(RecordError::Unexpected),
            "another message after a KeyUpdate in its record"
        );
        let mut r = PostHandshake::default();
        assert_eq!(
            r.read(true, &[4, 0]),
            Err(RecordError::Unexpected),
            "NewSessionTicket"
        );
        let mut r = PostHandshake::default();
        assert_eq!(r.read(true, &[]), Err(RecordError::Unexpected));
    }

    #[test]
    fn a_renegotiating_client_hello_is_skipped_across_records() {
        let mut hello = vec![1, 0, 0x30, 0];
        hello.resize(4 + 0x3000, 7);
        let pieces: Vec<&[u8]> = hello.chunks(1000).collect();
        assert_eq!(read_all(false, &pieces), Ok(vec![Message::Renegotiation]));
        let mut r = PostHandshake::default();
        assert_eq!(
            r.read(false, &[20, 0, 0, 12]),
            Err(RecordError::Unexpected),
            "a Finished out of place"
        );
    }
}
