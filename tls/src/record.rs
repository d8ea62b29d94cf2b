//! The record layer of an established session: TLS 1.3 and 1.2 records sealed and opened in
//! place, in the connection's own buffers. rustls runs the handshake and keeps the key
//! schedule (its `KernelConnection`, made for kTLS); this file does what kTLS would do in the
//! kernel, with aws-lc-rs's AEADs.
//!
//! Why by hand: rustls 0.23 copies every record it encrypts twice and allocates one buffer
//! per record, through its unbuffered API too (0.23.46: `write_fragments` copies what
//! `encrypt_outgoing` allocated), and decrypted data goes through a `Vec` per record. Here
//! a file's bytes are read straight into the record they are sealed in, memory is copied
//! once, and received records are opened where they were read. This machine has no kTLS.
//!
//! The constructions (nonce, additional data, inner content type) are RFC 8446 §5.2-5.3 for
//! TLS 1.3, RFC 5288 §3 (AES-GCM) and RFC 7905 §2 (ChaCha20-Poly1305) for TLS 1.2.

use std::ops::Range;

use aws_lc_rs::aead::{
    self, Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305,
    NONCE_LEN,
};
use rustls::ConnectionTrafficSecrets;

/// A record's header: content type, legacy version, length.
pub const HEADER: usize = 5;
/// The most plaintext one record carries (RFC 8446 §5.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;
const TAG: usize = 16;
/// TLS 1.2's explicit part of the AES-GCM nonce, sent in each record.
const EXPLICIT_NONCE: usize = 8;
const TLS13_MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
const TLS12_MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 2048;
/// The longest record a peer may send, header included.
pub const MAX_RECORD: usize = HEADER + TLS12_MAX_CIPHERTEXT;
/// The legacy record version every record carries after the handshake.
const VERSION: [u8; 2] = [3, 3];

/// Content types (RFC 8446 §5.1).
pub mod content {
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    pub const ALERT: u8 = 21;
    pub const HANDSHAKE: u8 = 22;
    pub const APPLICATION_DATA: u8 = 23;
}

/// Alert descriptions this layer sends (RFC 8446 §6).
pub mod alert {
    pub const CLOSE_NOTIFY: u8 = 0;
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    pub const BAD_RECORD_MAC: u8 = 20;
    pub const RECORD_OVERFLOW: u8 = 22;
    pub const ILLEGAL_PARAMETER: u8 = 47;
    pub const DECODE_ERROR: u8 = 50;
    pub const NO_RENEGOTIATION: u8 = 100;
}

/// Alert levels (RFC 5246 §7.2).
pub mod level {
    pub const WARNING: u8 = 1;
    pub const FATAL: u8 = 2;
}

/// The record protection a session negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    Tls13,
    Tls12Gcm,
    Tls12ChaCha,
}

/// Why a record could not be opened; each is the alert the peer is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// Longer than the protocol allows.
    Overflow,
    /// The tag did not verify (wrong key, altered or truncated record).
    BadMac,
    /// A content type or message not allowed here.
    Unexpected,
    /// Too short to be a record of this protection, or a message of the wrong length.
    Decode,
    /// A field holds a value the protocol does not allow.
    IllegalParameter,
}

impl RecordError {
    pub fn alert(self) -> u8 {
        match self {
            RecordError::Overflow => alert::RECORD_OVERFLOW,
            RecordError::BadMac => alert::BAD_RECORD_MAC,
            RecordError::Unexpected => alert::UNEXPECTED_MESSAGE,
            RecordError::Decode => alert::DECODE_ERROR,
            RecordError::IllegalParameter => alert::ILLEGAL_PARAMETER,
        }
    }
}

/// A record opened in place: its content type and where its plaintext now is.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    pub content_type: u8,
    pub payload: Range<usize>,
}

/// One direction's key, the IV its nonces are made from, and the next sequence number.
struct Keys {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Keys {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> Result<Keys, UnsupportedSuite> {
        let (algorithm, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => return Err(UnsupportedSuite),
        };
        let key = UnboundKey::new(algorithm, key.as_ref()).map_err(|_| UnsupportedSuite)?;
        Ok(Keys {
            key: LessSafeKey::new(key),
            iv: iv.as_ref().try_into().map_err(|_| UnsupportedSuite)?,
            seq,
        })
    }

    /// The IV with the sequence number XORed into its last 8 bytes, the nonce of every
    /// construction here but TLS 1.2 AES-GCM's receiving side.
    fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// Encrypts `in_out` in place; the tag is returned, not appended.
    fn seal(&self, nonce: [u8; NONCE_LEN], aad: &[u8], in_out: &mut [u8]) -> aead::Tag {
        self.key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            .expect("sealing fits the record")
    }

    /// Decrypts `in_out` (ciphertext, then tag) in place: the plaintext part.
    fn open<'a>(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &'a mut [u8],
    ) -> Result<&'a mut [u8], RecordError> {
        self.key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            .map_err(|_| RecordError::BadMac)
    }
}

/// The negotiated cipher suite is not one this layer implements (cannot happen with
/// [`crate::crypto_provider`]'s suites).
#[derive(Debug)]
pub struct UnsupportedSuite;

/// TLS 1.2's additional data: sequence number, content type, version, plaintext length.
fn tls12_aad(seq: u64, content_type: u8, len: usize) -> [u8; 13] {
    let mut aad = [0u8; 13];
    aad[..8].copy_from_slice(&seq.to_be_bytes());
    aad[8] = content_type;
    aad[9..11].copy_from_slice(&VERSION);
    aad[11..].copy_from_slice(&(len as u16).to_be_bytes());
    aad
}

fn header(content_type: u8, len: usize) -> [u8; HEADER] {
    let len = (len as u16).to_be_bytes();
    [content_type, VERSION[0], VERSION[1], len[0], len[1]]
}

/// The length of the record at the front of `bytes` (header included), once its header is
/// there.
pub fn record_len(bytes: &[u8]) -> Option<usize> {
    match bytes {
        [_, _, _, hi, lo, ..] => Some(HEADER + u16::from_be_bytes([*hi, *lo]) as usize),
        _ => None,
    }
}

/// Both directions' protection of one established session.
pub struct RecordLayer {
    protection: Protection,
    tx: Keys,
    rx: Keys,
    /// Records sealed under one key before it must change (the suite's confidentiality
    /// limit): TLS 1.3 then updates its key, TLS 1.2 must close.
    tx_limit: u64,
}

impl RecordLayer {
    pub fn new(
        protection: Protection,
        tx: (u64, ConnectionTrafficSecrets),
        rx: (u64, ConnectionTrafficSecrets),
        tx_limit: u64,
    ) -> Result<RecordLayer, UnsupportedSuite> {
        Ok(RecordLayer {
            protection,
            tx: Keys::new(tx)?,
            rx: Keys::new(rx)?,
            tx_limit,
        })
    }

    pub fn protection(&self) -> Protection {
        self.protection
    }

    /// Bytes of a sealed record before its plaintext.
    pub fn front(&self) -> usize {
        match self.protection {
            Protection::Tls12Gcm => HEADER + EXPLICIT_NONCE,
            Protection::Tls13 | Protection::Tls12ChaCha => HEADER,
        }
    }

    /// Bytes of a sealed record after its plaintext (TLS 1.3's inner content type, the tag).
    pub fn back(&self) -> usize {
        match self.protection {
            Protection::Tls13 => 1 + TAG,
            Protection::Tls12Gcm | Protection::Tls12ChaCha => TAG,
        }
    }

    /// The sending key has sealed as many records as it safely may.
    pub fn tx_exhausted(&self) -> bool {
        self.tx.seq >= self.tx_limit
    }

    /// The next record is the last the sending key may seal: TLS 1.3 seals its key update
    /// with it and changes keys.
    pub fn tx_update_due(&self) -> bool {
        self.tx.seq.saturating_add(1) >= self.tx_limit
    }

    pub fn set_tx(
        &mut self,
        secrets: (u64, ConnectionTrafficSecrets),
    ) -> Result<(), UnsupportedSuite> {
        self.tx = Keys::new(secrets)?;
        Ok(())
    }

    pub fn set_rx(
        &mut self,
        secrets: (u64, ConnectionTrafficSecrets),
    ) -> Result<(), UnsupportedSuite> {
        self.rx = Keys::new(secrets)?;
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn set_tx_limit(&mut self, limit: u64) {
        self.tx_limit = limit;
    }

    /// Seals the record laid out at the start of `record`: [`Self::front`] bytes of room,
    /// `len` bytes of plaintext (at most [`MAX_PLAINTEXT`]), then room for [`Self::back`].
    /// Returns the record's length.
    pub fn seal(&mut self, content_type: u8, record: &mut [u8], len: usize) -> usize {
        debug_assert!(len <= MAX_PLAINTEXT && !self.tx_exhausted());
        let front = self.front();
        let nonce = self.tx.nonce();
        // What is encrypted (`body` bytes from `front`), the type the header shows, and the
        // additional data: TLS 1.3 hides the real type inside and authenticates the header;
        // TLS 1.2 authenticates sequence number, type, version and length.
        let (outer_type, body) = match self.protection {
            Protection::Tls13 => {
                record[front + len] = content_type;
                (content::APPLICATION_DATA, len + 1)
            }
            Protection::Tls12Gcm | Protection::Tls12ChaCha => {
                if self.protection == Protection::Tls12Gcm {
                    // The explicit nonce is the sequence-derived part, unique per record.
                    record[HEADER..front].copy_from_slice(&nonce[4..]);
                }
                (content_type, len)
            }
        };
        let record_len = front + body + TAG;
        let head = header(outer_type, record_len - HEADER);
        record[..HEADER].copy_from_slice(&head);
        let tls12;
        let aad: &[u8] = match self.protection {
            Protection::Tls13 => &head,
            Protection::Tls12Gcm | Protection::Tls12ChaCha => {
                tls12 = tls12_aad(self.tx.seq, content_type, len);
                &tls12
            }
        };
        let tag = self.tx.seal(nonce, aad, &mut record[front..front + body]);
        record[front + body..record_len].copy_from_slice(tag.as_ref());
        self.tx.seq += 1;
        record_len
    }

    /// Seals `bytes` (a control message: an alert, a key update) as one record appended to
    /// `out`.
    pub fn seal_to(&mut self, content_type: u8, bytes: &[u8], out: &mut Vec<u8>) {
        let at = out.len();
        let front = self.front();
        out.resize(at + front + bytes.len() + self.back(), 0);
        out[at + front..at + front + bytes.len()].copy_from_slice(bytes);
        let len = self.seal(content_type, &mut out[at..], bytes.len());
        out.truncate(at + len);
    }

    /// Opens the one whole record `record` in place.
    pub fn open(&mut self, record: &mut [u8]) -> Result<Opened, RecordError> {
        let content_type = record[0];
        let body = record.len() - HEADER;
        let opened = match self.protection {
            Protection::Tls13 => {
                // After the handshake every record is protected and says "data" outside.
                if content_type != content::APPLICATION_DATA {
                    return Err(RecordError::Unexpected);
                }
                if body > TLS13_MAX_CIPHERTEXT {
                    return Err(RecordError::Overflow);
                }
                if body < 1 + TAG {
                    return Err(RecordError::Decode);
                }
                let (head, body) = record.split_at_mut(HEADER);
                let inner = self.rx.open(self.rx.nonce(), head, body)?;
                if inner.len() > MAX_PLAINTEXT + 1 {
                    return Err(RecordError::Overflow);
                }
                // Padding is zeros after the real content type (RFC 8446 §5.4).
                let Some(end) = inner.iter().rposition(|&b| b != 0) else {
                    return Err(RecordError::Unexpected);
                };
                Opened {
                    content_type: inner[end],
                    payload: HEADER..HEADER + end,
                }
            }
            Protection::Tls12Gcm | Protection::Tls12ChaCha => {
                if !matches!(
                    content_type,
                    content::ALERT | content::HANDSHAKE | content::APPLICATION_DATA
                ) {
                    return Err(RecordError::Unexpected);
                }
                if body > TLS12_MAX_CIPHERTEXT {
                    return Err(RecordError::Overflow);
                }
                let front = self.front();
                if record.len() < front + TAG {
                    return Err(RecordError::Decode);
                }
                let len = record.len() - front - TAG;
                let nonce = match self.protection {
                    Protection::Tls12Gcm => {
                        let mut nonce = self.rx.iv;
                        nonce[4..].copy_from_slice(&record[HEADER..front]);
                        nonce
                    }
                    _ => self.rx.nonce(),
                };
                let aad = tls12_aad(self.rx.seq, content_type, len);
                self.rx.open(nonce, &aad, &mut record[front..])?;
                if len > MAX_PLAINTEXT {
                    return Err(RecordError::Overflow);
                }
                Opened {
                    content_type,
                    payload: front..front + len,
                }
            }
        };
        // A sequence number never wraps: past 2^64 - 1 records the connection is refused.
        self.rx.seq = self.rx.seq.checked_add(1).ok_or(RecordError::Overflow)?;
        Ok(opened)
    }
}

#[cfg(test)]
mod tests {
    use rustls::crypto::cipher::{AeadKey, Iv};

    use super::*;

    fn secrets(protection: Protection, key_byte: u8) -> ConnectionTrafficSecrets {
        let iv = Iv::new([key_byte ^ 0x5a; NONCE_LEN]);
        match protection {
            Protection::Tls12ChaCha => ConnectionTrafficSecrets::Chacha20Poly1305 {
                key: AeadKey::from([key_byte; 32]),
                iv,
            },
            _ => ConnectionTrafficSecrets::Aes256Gcm {
                key: AeadKey::from([key_byte; 32]),
                iv,
            },
        }
    }

    /// Two ends whose keys mirror each other.
    fn pair(protection: Protection) -> (RecordLayer, RecordLayer) {
        let a = RecordLayer::new(
            protection,
            (0, secrets(protection, 1)),
            (0, secrets(protection, 2)),
            u64::MAX,
        )
        .unwrap();
        let b = RecordLayer::new(
            protection,
            (0, secrets(protection, 2)),
            (0, secrets(protection, 1)),
            u64::MAX,
        )
        .unwrap();
        (a, b)
    }

    const ALL: [Protection; 3] = [
        Protection::Tls13,
        Protection::Tls12Gcm,
        Protection::Tls12ChaCha,
    ];

    #[test]
    fn what_one_end_seals_the_other_opens_in_order() {
        for p in ALL {
            let (mut a, mut b) = pair(p);
            let mut wire = Vec::new();
            for (i, msg) in [&b"first"[..], b"", &[7u8; MAX_PLAINTEXT][..]]
                .iter()
                .enumerate()
            {
                let at = wire.len();
                a.seal_to(content::APPLICATION_DATA, msg, &mut wire);
                assert_eq!(record_len(&wire[at..]), Some(wire.len() - at), "{p:?} {i}");
            }
            let mut at = 0;
            for msg in [&b"first"[..], b"", &[7u8; MAX_PLAINTEXT][..]] {
                let len = record_len(&wire[at..]).unwrap();
                let record = &mut wire[at..at + len];
                let opened = b.open(record).unwrap();
                assert_eq!(opened.content_type, content::APPLICATION_DATA);
                assert_eq!(&record[opened.payload], msg, "{p:?}");
                at += len;
            }
        }
    }

    #[test]
    fn an_altered_replayed_or_reordered_record_fails_its_tag() {
        for p in ALL {
            let (mut a, mut b) = pair(p);
            let mut one = Vec::new();
            a.seal_to(content::APPLICATION_DATA, b"one", &mut one);
            let mut two = Vec::new();
            a.seal_to(content::APPLICATION_DATA, b"two", &mut two);
            // Reordered: the second record first.
            assert_eq!(b.open(&mut two.clone()), Err(RecordError::BadMac), "{p:?}");
            let mut b = pair(p).1;
            let mut altered = one.clone();
            let last = altered.len() - 1;
            altered[last] ^= 1;
            assert_eq!(b.open(&mut altered), Err(RecordError::BadMac), "{p:?}");
            let mut b = pair(p).1;
            assert!(b.open(&mut one.clone()).is_ok());
            // Replayed: the same record again.
            assert_eq!(b.open(&mut one), Err(RecordError::BadMac), "{p:?}");
        }
    }

    #[test]
    fn short_long_and_wrongly_typed_records_are_refused() {
        for p in ALL {
            let (_, mut b) = pair(p);
            let mut short = header(content::APPLICATION_DATA, 4).to_vec();
            short.extend_from_slice(&[0; 4]);
            assert_eq!(b.open(&mut short), Err(RecordError::Decode), "{p:?}");
            let mut long = header(content::APPLICATION_DATA, TLS12_MAX_CIPHERTEXT + 1).to_vec();
            long.resize(HEADER + TLS12_MAX_CIPHERTEXT + 1, 0);
            assert_eq!(b.open(&mut long), Err(RecordError::Overflow), "{p:?}");
            let mut ccs = header(content::CHANGE_CIPHER_SPEC, 1).to_vec();
            ccs.push(1);
            assert_eq!(b.open(&mut ccs), Err(RecordError::Unexpected), "{p:?}");
        }
    }

    #[test]
    fn tls13_hides_the_content_type_and_strips_padding() {
        let (mut a, mut b) = pair(Protection::Tls13);
        let mut wire = Vec::new();
        a.seal_to(content::ALERT, &[1, 0], &mut wire);
        assert_eq!(
            wire[0],
            content::APPLICATION_DATA,
            "the outer type says data"
        );
        let opened = b.open(&mut wire).unwrap();
        assert_eq!(opened.content_type, content::ALERT);
        assert_eq!(&wire[opened.payload], &[1, 0]);
    }

    #[test]
    fn a_key_is_exhausted_at_its_limit() {
        let (mut a, _) = pair(Protection::Tls13);
        a.set_tx_limit(2);
        let mut wire = Vec::new();
        a.seal_to(content::APPLICATION_DATA, b"x", &mut wire);
        assert!(!a.tx_exhausted());
        a.seal_to(content::APPLICATION_DATA, b"y", &mut wire);
        assert!(a.tx_exhausted());
        a.set_tx((0, secrets(Protection::Tls13, 9))).unwrap();
        assert!(!a.tx_exhausted(), "a new key starts again");
    }
}
