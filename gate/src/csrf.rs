//! Login and logout forms are protected twice: the browser must say the post came from this
//! site (`Sec-Fetch-Site`, else `Origin`), and the form must carry a token this gate signed for
//! the client's network in the last two hours. Stateless: nothing is stored per form.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::keyring::{Keyring, Purpose, TAG_LEN};
use crate::prefix::Prefix;

const VERSION: u8 = 1;
const BODY: usize = 1 + 4 + 8 + 1 + 16;
/// How long a form stays valid.
pub const LIFETIME_SECS: u64 = 2 * 3600;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsrfError {
    Malformed,
    BadMac,
    Expired,
    WrongPrefix,
}

pub fn issue(keyring: &Keyring, prefix: Prefix, now: u64) -> String {
    let signer = keyring.signer();
    let mut raw = [0u8; BODY + TAG_LEN];
    raw[0] = VERSION;
    raw[1..5].copy_from_slice(&signer.kid().to_be_bytes());
    raw[5..13].copy_from_slice(&(now + LIFETIME_SECS).to_be_bytes());
    raw[13] = prefix.family;
    raw[14..30].copy_from_slice(&prefix.bytes);
    let tag = signer.sign(Purpose::Csrf, &raw[..BODY]);
    raw[BODY..].copy_from_slice(&tag);
    URL_SAFE_NO_PAD.encode(raw)
}

pub fn verify(keyring: &Keyring, token: &str, prefix: Prefix, now: u64) -> Result<(), CsrfError> {
    let mut raw = [0u8; BODY + TAG_LEN + 2];
    let n = URL_SAFE_NO_PAD
        .decode_slice(token, &mut raw)
        .map_err(|_| CsrfError::Malformed)?;
    if n != BODY + TAG_LEN || raw[0] != VERSION {
        return Err(CsrfError::Malformed);
    }
    let kid = u32::from_be_bytes(raw[1..5].try_into().unwrap());
    keyring
        .verify(Purpose::Csrf, kid, &raw[..BODY], &raw[BODY..n])
        .map_err(|_| CsrfError::BadMac)?;
    if now >= u64::from_be_bytes(raw[5..13].try_into().unwrap()) {
        return Err(CsrfError::Expired);
    }
    if raw[13] != prefix.family || raw[14..30] != prefix.bytes {
        return Err(CsrfError::WrongPrefix);
    }
    Ok(())
}

/// Whether a form post came from this site. `Sec-Fetch-Site` (every current browser sends it)
/// must be `same-origin`, or `none` (typed or bookmarked); without it, `Origin` must name this
/// host; without either (old clients, scripts) the signed token alone decides.
pub fn same_origin(
    origin: Option<&[u8]>,
    sec_fetch_site: Option<&[u8]>,
    host: Option<&[u8]>,
) -> bool {
    if let Some(site) = sec_fetch_site {
        return site.eq_ignore_ascii_case(b"same-origin") || site.eq_ignore_ascii_case(b"none");
    }
    let Some(origin) = origin else {
        return true;
    };
    let Some(authority) = origin
        .strip_prefix(b"https://")
        .or_else(|| origin.strip_prefix(b"http://"))
    else {
        // "null" (a sandboxed frame, a redirect chain) and other schemes.
        return false;
    };
    host.is_some_and(|h| h.eq_ignore_ascii_case(authority))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::from_keys(vec![(1, 1, [3; 32])])
    }

    #[test]
    fn tokens_are_bound_to_the_network_and_expire() {
        let net = Prefix::of("192.0.2.1".parse().unwrap(), 24, 48);
        let other = Prefix::of("198.51.100.1".parse().unwrap(), 24, 48);
        let t = issue(&ring(), net, 1000);
        assert_eq!(verify(&ring(), &t, net, 1000 + LIFETIME_SECS - 1), Ok(()));
        assert_eq!(
            verify(&ring(), &t, net, 1000 + LIFETIME_SECS),
            Err(CsrfError::Expired)
        );
        assert_eq!(
            verify(&ring(), &t, other, 1001),
            Err(CsrfError::WrongPrefix)
        );
        let foreign = Keyring::from_keys(vec![(1, 1, [4; 32])]);
        assert_eq!(verify(&foreign, &t, net, 1001), Err(CsrfError::BadMac));
        assert_eq!(
            verify(&ring(), "forged", net, 1001),
            Err(CsrfError::Malformed)
        );
        assert_eq!(verify(&ring(), "", net, 1001), Err(CsrfError::Malformed));
    }

    #[test]
    fn origin_truth_table() {
        let host = Some(&b"example.org"[..]);
        assert!(same_origin(None, Some(b"same-origin"), host));
        assert!(same_origin(None, Some(b"none"), host));
        assert!(!same_origin(None, Some(b"cross-site"), host));
        assert!(!same_origin(
            Some(b"https://example.org"),
            Some(b"same-site"),
            host
        ));
        assert!(same_origin(Some(b"https://example.org"), None, host));
        assert!(same_origin(Some(b"http://EXAMPLE.org"), None, host));
        assert!(!same_origin(Some(b"https://evil.example"), None, host));
        assert!(!same_origin(Some(b"https://example.org.evil"), None, host));
        assert!(!same_origin(Some(b"null"), None, host));
        assert!(!same_origin(Some(b"https://example.org"), None, None));
        assert!(
            same_origin(None, None, host),
            "old clients: the token decides"
        );
        assert!(same_origin(
            Some(b"http://127.0.0.1:8080"),
            None,
            Some(b"127.0.0.1:8080")
        ));
    }
}
