//! WebSocket over HTTP/2 (RFC 8441) relayed to an HTTP/1.1 upstream: the upstream gets the
//! RFC 6455 §4.1 handshake an HTTP/1.1 client would send, with a key of our own (HTTP/2
//! clients send none), and its `101` is believed only with the `Sec-WebSocket-Accept` that
//! key calls for (§4.2.2): an upstream that did not understand the handshake, or a stale
//! answer on the connection, never becomes a tunnel the client takes for a WebSocket.

use aws_lc_rs::digest::{digest, SHA1_FOR_LEGACY_USE_ONLY};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// The GUID RFC 6455 §1.3 appends to a key.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A handshake sent upstream, waiting for its `101`.
pub(crate) struct Handshake {
    /// The `Sec-WebSocket-Accept` value the key calls for.
    accept: String,
}

impl Handshake {
    /// Appends `Sec-WebSocket-Key` (16 fresh random bytes, base64) to `head`, the request's
    /// field lines. None if the system has no random numbers to give.
    pub fn start(head: &mut Vec<u8>) -> Option<Handshake> {
        let mut nonce = [0u8; 16];
        aws_lc_rs::rand::fill(&mut nonce).ok()?;
        let key = STANDARD.encode(nonce);
        head.extend_from_slice(b"Sec-WebSocket-Key: ");
        head.extend_from_slice(key.as_bytes());
        head.extend_from_slice(b"\r\n");
        Some(Handshake {
            accept: accept_for(key.as_bytes()),
        })
    }

    /// Whether a `101`'s fields complete this handshake: `Upgrade: websocket` and the
    /// accept value of our key (`fields`: name and value of each).
    pub fn completed_by<'f>(&self, fields: impl Iterator<Item = (&'f str, &'f [u8])>) -> bool {
        let (mut upgrade, mut accept) = (false, false);
        for (name, value) in fields {
            let value = value.trim_ascii();
            if name.eq_ignore_ascii_case("upgrade") {
                upgrade = value.eq_ignore_ascii_case(b"websocket");
            } else if name.eq_ignore_ascii_case("sec-websocket-accept") {
                accept = value == self.accept.as_bytes();
            }
        }
        upgrade && accept
    }
}

/// `base64(SHA-1(key + GUID))` (RFC 6455 §4.2.2).
fn accept_for(key: &[u8]) -> String {
    let mut input = Vec::with_capacity(key.len() + GUID.len());
    input.extend_from_slice(key);
    input.extend_from_slice(GUID);
    STANDARD.encode(digest(&SHA1_FOR_LEGACY_USE_ONLY, &input).as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_value_is_rfc_6455s() {
        // The example of RFC 6455 §1.3.
        assert_eq!(
            accept_for(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn each_handshake_has_a_fresh_key_and_checks_its_answer() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let ha = Handshake::start(&mut a).unwrap();
        let hb = Handshake::start(&mut b).unwrap();
        assert_ne!(a, b);
        let line = std::str::from_utf8(&a).unwrap();
        let key = line
            .strip_prefix("Sec-WebSocket-Key: ")
            .and_then(|l| l.strip_suffix("\r\n"))
            .unwrap();
        assert_eq!(STANDARD.decode(key).unwrap().len(), 16);
        let accept = accept_for(key.as_bytes());
        let fields = |accept: &'static str| {
            [
                ("Upgrade", &b"WebSocket"[..]),
                ("Sec-WebSocket-Accept", accept.as_bytes()),
            ]
        };
        let good: &'static str = Box::leak(accept.into_boxed_str());
        assert!(ha.completed_by(fields(good).into_iter()));
        assert!(!hb.completed_by(fields(good).into_iter()), "another key's");
        assert!(!ha.completed_by(fields("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=").into_iter()));
        assert!(!ha.completed_by([("Sec-WebSocket-Accept", good.as_bytes())].into_iter()));
    }
}
