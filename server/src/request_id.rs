//! A request's id (`X-Request-Id`): made here, or taken from a trusted proxy by the layer that
//! knows which peers to trust. A handler sets it on its context; the access log writes it and
//! the reverse proxy forwards it. Fixed size and `Copy`, so a log entry holding one still
//! costs no allocation.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};

/// The longest id kept from a proxy in front (longer ones are replaced by a new id).
pub const MAX_REQUEST_ID: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestId {
    bytes: [u8; MAX_REQUEST_ID],
    len: u8,
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

thread_local! {
    /// wyrand state per thread, seeded from the process's random hasher keys: ids need to be
    /// unique and not guessable in advance, not cryptographic.
    static STATE: Cell<u64> = Cell::new(
        std::collections::hash_map::RandomState::new().build_hasher().finish() | 1,
    );
}

fn next_u64() -> u64 {
    STATE.with(|s| {
        let x = s.get().wrapping_add(0xa076_1d64_78bd_642f);
        s.set(x);
        let t = u128::from(x) * u128::from(x ^ 0xe703_7ed1_a0b4_28db);
        (t as u64) ^ ((t >> 64) as u64)
    })
}

impl RequestId {
    /// A new id: 128 random bits as 32 lower-case hex digits (the form of nginx's
    /// `$request_id`).
    pub fn generate() -> RequestId {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut bytes = [0u8; MAX_REQUEST_ID];
        let (a, b) = (next_u64(), next_u64());
        for (i, byte) in a.to_be_bytes().iter().chain(&b.to_be_bytes()).enumerate() {
            bytes[2 * i] = HEX[usize::from(byte >> 4)];
            bytes[2 * i + 1] = HEX[usize::from(byte & 15)];
        }
        RequestId { bytes, len: 32 }
    }

    /// An id a proxy in front sent, if it is one: 1 to 64 of `A-Z a-z 0-9 - _ . :`, so it
    /// is safe in a header line, a log line and JSON as it is.
    pub fn parse(value: &[u8]) -> Option<RequestId> {
        let ok = !value.is_empty()
            && value.len() <= MAX_REQUEST_ID
            && value
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if !ok {
            return None;
        }
        let mut bytes = [0u8; MAX_REQUEST_ID];
        bytes[..value.len()].copy_from_slice(value);
        Some(RequestId {
            bytes,
            len: value.len() as u8,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (see `generate` and `parse`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_32_hex_digits_and_differ() {
        let a = RequestId::generate();
        let b = RequestId::generate();
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        let other = std::thread::spawn(RequestId::generate).join().unwrap();
        assert_ne!(a, other);
    }

    #[test]
    fn only_plain_ids_are_taken_from_a_proxy() {
        assert_eq!(
            RequestId::parse(b"abc-123_x.y:z").unwrap().as_str(),
            "abc-123_x.y:z"
        );
        for bad in [
            &b""[..],
            b"a b",
            b"a\r\nX: y",
            b"\"q\"",
            b"caf\xc3\xa9",
            &[b'a'; 65],
        ] {
            assert!(RequestId::parse(bad).is_none(), "{bad:?}");
        }
        assert!(RequestId::parse(&[b'a'; 64]).is_some());
    }
}
