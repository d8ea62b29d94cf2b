//! Session tokens: the value of a gate cookie, signed, holding everything a check needs.
//!
//! Layout before base64url: `2 | kid u32 | issued u64 | expires u64 | realm version u32 |
//! prefix family u8 | prefix 16 bytes | ua_hash u64 | proof kind u8 | proof strength u8 |
//! realm len u8 | realm | user len u8 | user | tag 16`, integers big-endian. A challenge pass
//! has realm "". Version 1 tokens (no user agent, no proof) are refused as malformed: their
//! holders prove themselves once more.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::keyring::{Keyring, MacError, Purpose, TAG_LEN};
use crate::prefix::Prefix;

const VERSION: u8 = 2;
/// Longest realm or user name a token carries.
pub const MAX_NAME: usize = 64;
const FIXED: usize = 1 + 4 + 8 + 8 + 4 + 1 + 16 + 8 + 2;
/// Largest decoded token.
pub const MAX_TOKEN: usize = FIXED + 2 + 2 * MAX_NAME + TAG_LEN;

/// What a client did to earn its session, so that it settles only rules that ask no more:
/// time-lock < proof of work < password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// Waited out a time-lock of this many seconds.
    TimeLock { seconds: u8 },
    /// Did a proof of work of this many leading zero bits (a challenge, or a realm's guest
    /// login).
    Work { bits: u8 },
    /// Gave a realm's password.
    Password,
}

impl Proof {
    fn encode(self) -> [u8; 2] {
        match self {
            Proof::TimeLock { seconds } => [1, seconds],
            Proof::Work { bits } => [2, bits],
            Proof::Password => [3, 0],
        }
    }

    fn decode(b: [u8; 2]) -> Option<Proof> {
        match b {
            [1, seconds] => Some(Proof::TimeLock { seconds }),
            [2, bits] => Some(Proof::Work { bits }),
            [3, 0] => Some(Proof::Password),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session<'a> {
    pub realm: &'a str,
    pub user: &'a str,
    pub issued: u64,
    pub expires: u64,
    pub realm_version: u32,
    pub prefix: Prefix,
    /// The user agent it was issued to ([`crate::pow::ua_hash`]).
    pub ua_hash: u64,
    pub proof: Proof,
    /// The key that signed it (ignored by `issue`, which uses the current key).
    pub kid: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    Malformed,
    TooLong,
    UnknownKey,
    BadMac,
    Expired,
}

fn valid_name(s: &str) -> bool {
    s.len() <= MAX_NAME && !s.chars().any(char::is_control)
}

/// Signs a session with the keyring's current key.
pub fn issue(keyring: &Keyring, s: &Session<'_>) -> Result<String, TokenError> {
    if !valid_name(s.realm) || !valid_name(s.user) {
        return Err(TokenError::TooLong);
    }
    let signer = keyring.signer();
    let mut out = Vec::with_capacity(MAX_TOKEN);
    out.push(VERSION);
    out.extend_from_slice(&signer.kid().to_be_bytes());
    out.extend_from_slice(&s.issued.to_be_bytes());
    out.extend_from_slice(&s.expires.to_be_bytes());
    out.extend_from_slice(&s.realm_version.to_be_bytes());
    out.push(s.prefix.family);
    out.extend_from_slice(&s.prefix.bytes);
    out.extend_from_slice(&s.ua_hash.to_be_bytes());
    out.extend_from_slice(&s.proof.encode());
    out.push(s.realm.len() as u8);
    out.extend_from_slice(s.realm.as_bytes());
    out.push(s.user.len() as u8);
    out.extend_from_slice(s.user.as_bytes());
    let tag = signer.sign(Purpose::Session, &out);
    out.extend_from_slice(&tag);
    Ok(URL_SAFE_NO_PAD.encode(out))
}

/// Checks a token (the cookie's value): decoded into `buf`, one MAC, then expiry. Allocates
/// nothing. The caller checks the realm's version and the client's network.
pub fn verify<'b>(
    keyring: &Keyring,
    token: &[u8],
    buf: &'b mut [u8; MAX_TOKEN],
    now: u64,
) -> Result<Session<'b>, TokenError> {
    if token.len() > MAX_TOKEN.div_ceil(3) * 4 {
        return Err(TokenError::TooLong);
    }
    let n = URL_SAFE_NO_PAD
        .decode_slice(token, buf)
        .map_err(|_| TokenError::Malformed)?;
    let raw = &buf[..n];
    if n < FIXED + 2 + TAG_LEN || raw[0] != VERSION {
        return Err(TokenError::Malformed);
    }
    let (body, tag) = raw.split_at(n - TAG_LEN);
    let u32_at = |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_be_bytes(body[i..i + 8].try_into().unwrap());
    let kid = u32_at(1);
    keyring
        .verify(Purpose::Session, kid, body, tag)
        .map_err(|e| match e {
            MacError::UnknownKey => TokenError::UnknownKey,
            MacError::BadMac => TokenError::BadMac,
        })?;
    // Signed by us: the lengths below hold, but are checked anyway (a bug must not panic).
    let realm_len = body[FIXED] as usize;
    let user_at = FIXED + 1 + realm_len;
    if user_at >= body.len() {
        return Err(TokenError::Malformed);
    }
    let user_len = body[user_at] as usize;
    if user_at + 1 + user_len != body.len() {
        return Err(TokenError::Malformed);
    }
    let realm =
        std::str::from_utf8(&body[FIXED + 1..user_at]).map_err(|_| TokenError::Malformed)?;
    let user = std::str::from_utf8(&body[user_at + 1..]).map_err(|_| TokenError::Malformed)?;
    let mut prefix = Prefix {
        family: body[25],
        bytes: [0; 16],
    };
    prefix.bytes.copy_from_slice(&body[26..42]);
    let proof = Proof::decode([body[50], body[51]]).ok_or(TokenError::Malformed)?;
    let session = Session {
        realm,
        user,
        issued: u64_at(5),
        expires: u64_at(13),
        realm_version: u32_at(21),
        prefix,
        ua_hash: u64_at(42),
        proof,
        kid,
    };
    if now >= session.expires {
        return Err(TokenError::Expired);
    }
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::from_keys(vec![(5, 100, [9; 32])])
    }

    fn session() -> Session<'static> {
        Session {
            realm: "staff",
            user: "alice",
            issued: 1000,
            expires: 2000,
            realm_version: 42,
            prefix: Prefix::of("192.0.2.1".parse().unwrap(), 24, 48),
            ua_hash: 0x0123_4567_89ab_cdef,
            proof: Proof::Work { bits: 16 },
            kid: 0,
        }
    }

    #[test]
    fn every_proof_round_trips() {
        let mut buf = [0u8; MAX_TOKEN];
        for proof in [
            Proof::TimeLock { seconds: 3 },
            Proof::Work { bits: 20 },
            Proof::Password,
        ] {
            let t = issue(&ring(), &Session { proof, ..session() }).unwrap();
            assert_eq!(
                verify(&ring(), t.as_bytes(), &mut buf, 1500).unwrap().proof,
                proof
            );
        }
    }

    #[test]
    fn tokens_of_the_first_layout_are_refused() {
        // Version 1 carried no user agent and no proof: a time-lock pass and a proof of work
        // looked alike. Even correctly signed, one is malformed now.
        let s = session();
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&5u32.to_be_bytes());
        v1.extend_from_slice(&s.issued.to_be_bytes());
        v1.extend_from_slice(&s.expires.to_be_bytes());
        v1.extend_from_slice(&s.realm_version.to_be_bytes());
        v1.push(s.prefix.family);
        v1.extend_from_slice(&s.prefix.bytes);
        v1.push(s.realm.len() as u8);
        v1.extend_from_slice(s.realm.as_bytes());
        v1.push(s.user.len() as u8);
        v1.extend_from_slice(s.user.as_bytes());
        let (_, tag) = ring().sign(Purpose::Session, &v1);
        v1.extend_from_slice(&tag);
        let mut buf = [0u8; MAX_TOKEN];
        assert_eq!(
            verify(
                &ring(),
                URL_SAFE_NO_PAD.encode(&v1).as_bytes(),
                &mut buf,
                1500
            ),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn round_trip() {
        let t = issue(&ring(), &session()).unwrap();
        let mut buf = [0u8; MAX_TOKEN];
        let s = verify(&ring(), t.as_bytes(), &mut buf, 1500).unwrap();
        assert_eq!(
            s,
            Session {
                kid: 5,
                ..session()
            }
        );
        assert!(t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }

    #[test]
    fn every_failure_is_told_apart() {
        let t = issue(&ring(), &session()).unwrap();
        let mut buf = [0u8; MAX_TOKEN];
        assert_eq!(
            verify(&ring(), t.as_bytes(), &mut buf, 2000),
            Err(TokenError::Expired)
        );
        // Any altered byte of the payload breaks the MAC.
        let mut raw = URL_SAFE_NO_PAD.decode(&t).unwrap();
        for i in [6, 14, 22, 30, 45, 50, 51, 53, raw.len() - 1] {
            raw[i] ^= 1;
            let forged = URL_SAFE_NO_PAD.encode(&raw);
            assert_eq!(
                verify(&ring(), forged.as_bytes(), &mut buf, 1500),
                Err(TokenError::BadMac),
                "byte {i}"
            );
            raw[i] ^= 1;
        }
        // Another key id: unknown; another keyring: bad MAC.
        raw[4] ^= 1;
        assert_eq!(
            verify(
                &ring(),
                URL_SAFE_NO_PAD.encode(&raw).as_bytes(),
                &mut buf,
                1500
            ),
            Err(TokenError::UnknownKey)
        );
        let other = Keyring::from_keys(vec![(5, 100, [8; 32])]);
        assert_eq!(
            verify(&other, t.as_bytes(), &mut buf, 1500),
            Err(TokenError::BadMac)
        );
        // A key rotated out of the ring.
        let later = Keyring::from_keys(vec![(6, 200, [7; 32])]);
        assert_eq!(
            verify(&later, t.as_bytes(), &mut buf, 1500),
            Err(TokenError::UnknownKey)
        );
        assert_eq!(
            verify(&ring(), b"***", &mut buf, 1500),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            verify(&ring(), b"", &mut buf, 1500),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            verify(&ring(), &[b'A'; 400], &mut buf, 1500),
            Err(TokenError::TooLong)
        );
        // A challenge's MAC over the same bytes is not a session's.
        let body = &URL_SAFE_NO_PAD.decode(&t).unwrap()[..raw.len() - TAG_LEN];
        let (_, tag) = ring().sign(Purpose::Challenge, body);
        let mut cross = body.to_vec();
        cross.extend_from_slice(&tag);
        assert_eq!(
            verify(
                &ring(),
                URL_SAFE_NO_PAD.encode(&cross).as_bytes(),
                &mut buf,
                1500
            ),
            Err(TokenError::BadMac)
        );
    }

    #[test]
    fn names_are_bounded() {
        let long = "x".repeat(65);
        let s = Session {
            user: &long,
            ..session()
        };
        assert_eq!(issue(&ring(), &s), Err(TokenError::TooLong));
        let s = Session {
            user: "a\nb",
            ..session()
        };
        assert_eq!(issue(&ring(), &s), Err(TokenError::TooLong));
        let max = "y".repeat(64);
        let s = Session {
            user: &max,
            realm: &max,
            ..session()
        };
        let t = issue(&ring(), &s).unwrap();
        let mut buf = [0u8; MAX_TOKEN];
        assert_eq!(
            verify(&ring(), t.as_bytes(), &mut buf, 1500).unwrap().user,
            max
        );
    }
}
