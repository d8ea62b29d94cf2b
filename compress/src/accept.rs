//! Accept-Encoding (RFC 9110 §12.5.3): one pass over the field, q-values in thousandths, no
//! allocation. Whatever the bytes, the answer is one of the offered codings or identity:
//! garbage is skipped, a malformed q-value counts as 0 (not acceptable).

use crate::Encoding;

/// The coding to send: the offered coding with the highest q (ties go to the earlier one in
/// `offered`, the server's preference), or `None` for identity. A coding not mentioned takes
/// the q of `*`, if any. Identity not mentioned (and no `*`) is the fallback that loses to
/// any coding with q > 0; mentioned, it wins over codings with a lower q. When nothing
/// acceptable is offered the answer is still identity (§12.5.3 allows ignoring the field
/// rather than answering 406), so `identity;q=0` alone changes nothing.
pub fn negotiate(accept_encoding: Option<&[u8]>, offered: &[Encoding]) -> Option<Encoding> {
    let header = accept_encoding?;
    if offered.is_empty() {
        return None;
    }
    // q in thousandths; None = not mentioned. Slots: gzip, br, zstd (Encoding::index).
    let mut codings: [Option<u16>; 3] = [None; 3];
    let (mut identity, mut star) = (None, None);
    let h = header;
    let n = h.len();
    let mut i = 0;
    while i < n {
        while i < n && CLASS[h[i] as usize] == SEP {
            i += 1;
        }
        let start = i;
        while i < n && CLASS[h[i] as usize] == TOKEN {
            i += 1;
        }
        let coding = &h[start..i];
        // Parameters up to the next comma; only `q` matters (RFC 9110 §12.4.2).
        let mut q = 1000u16;
        while i < n && h[i] != b',' {
            if h[i] != b';' {
                i += 1;
                continue;
            }
            i += 1;
            while i < n && (h[i] == b' ' || h[i] == b'\t') {
                i += 1;
            }
            if i + 1 < n && h[i] | 0x20 == b'q' && h[i + 1] == b'=' {
                i += 2;
                let value = i;
                while i < n && CLASS[h[i] as usize] == TOKEN {
                    i += 1;
                }
                q = parse_q(&h[value..i]).unwrap_or(0);
            }
        }
        let slot = match coding.len() {
            1 if coding[0] == b'*' => &mut star,
            2 if coding.eq_ignore_ascii_case(b"br") => &mut codings[Encoding::Br.index()],
            4 if coding.eq_ignore_ascii_case(b"gzip") => &mut codings[Encoding::Gzip.index()],
            4 if coding.eq_ignore_ascii_case(b"zstd") => &mut codings[Encoding::Zstd.index()],
            6 if coding.eq_ignore_ascii_case(b"x-gzip") => &mut codings[Encoding::Gzip.index()],
            8 if coding.eq_ignore_ascii_case(b"identity") => &mut identity,
            _ => continue,
        };
        // A coding listed twice keeps its highest q.
        *slot = Some(slot.map_or(q, |old: u16| old.max(q)));
    }
    let mut best: Option<(Encoding, u16)> = None;
    for &e in offered {
        let q = codings[e.index()].or(star).unwrap_or(0);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((e, q));
        }
    }
    let (coding, q) = best?;
    // A tie with an identity the client named goes to the coding (smaller answer).
    let identity_q = identity.or(star).unwrap_or(0);
    (q >= identity_q).then_some(coding)
}

const TOKEN: u8 = 0;
/// OWS and `,`: skipped before a coding.
const SEP: u8 = 1;
/// `;`: starts a parameter.
const SEMI: u8 = 2;

/// Byte classes for the scanner.
static CLASS: [u8; 256] = {
    let mut t = [TOKEN; 256];
    t[b' ' as usize] = SEP;
    t[b'\t' as usize] = SEP;
    t[b',' as usize] = SEP;
    t[b';' as usize] = SEMI;
    t
};

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`, in thousandths.
fn parse_q(s: &[u8]) -> Option<u16> {
    match s {
        [b'1'] | [b'1', b'.'] => Some(1000),
        [b'1', b'.', rest @ ..] if rest.len() <= 3 && rest.iter().all(|&c| c == b'0') => Some(1000),
        [b'0'] | [b'0', b'.'] => Some(0),
        [b'0', b'.', rest @ ..] if rest.len() <= 3 && rest.iter().all(u8::is_ascii_digit) => {
            let mut v = 0u16;
            for i in 0..3 {
                v = v * 10 + rest.get(i).map_or(0, |&c| u16::from(c - b'0'));
            }
            Some(v)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Encoding::{Br, Gzip, Zstd};

    const SERVER: [Encoding; 3] = [Zstd, Br, Gzip];

    fn n(h: &str) -> Option<Encoding> {
        negotiate(Some(h.as_bytes()), &SERVER)
    }

    #[test]
    fn server_preference_breaks_ties() {
        assert_eq!(n("gzip, deflate, br, zstd"), Some(Zstd));
        assert_eq!(n("gzip, deflate, br"), Some(Br));
        assert_eq!(n("gzip"), Some(Gzip));
        assert_eq!(negotiate(Some(b"gzip, br, zstd"), &[Gzip, Br]), Some(Gzip));
        assert_eq!(negotiate(Some(b"gzip, br, zstd"), &[Br, Gzip]), Some(Br));
        assert_eq!(n("*"), Some(Zstd));
    }

    #[test]
    fn q_values_win_over_preference() {
        assert_eq!(n("zstd;q=0.5, gzip"), Some(Gzip));
        assert_eq!(n("zstd;q=0.5, br;q=0.6, gzip;q=0.1"), Some(Br));
        assert_eq!(n("zstd;q=0, br;q=0, gzip;q=0.001"), Some(Gzip));
        assert_eq!(n("*;q=0.5, br;q=0.9"), Some(Br));
        assert_eq!(n("*;q=0.5, zstd;q=0.1"), Some(Br));
        assert_eq!(n("gzip;q=1.0, br;q=1"), Some(Br));
        // Listed twice: the higher q counts.
        assert_eq!(n("gzip;q=0, gzip;q=0.2"), Some(Gzip));
    }

    #[test]
    fn identity() {
        assert_eq!(negotiate(None, &SERVER), None);
        assert_eq!(n(""), None);
        assert_eq!(n("identity"), None);
        assert_eq!(n("identity, gzip;q=0.5"), None);
        assert_eq!(n("identity;q=0.5, gzip;q=0.5"), Some(Gzip));
        assert_eq!(n("identity;q=0, gzip;q=0.1"), Some(Gzip));
        // Nothing acceptable: identity all the same (no 406).
        assert_eq!(n("identity;q=0"), None);
        assert_eq!(n("*;q=0"), None);
        assert_eq!(n("gzip;q=0, br;q=0, zstd;q=0"), None);
        assert_eq!(n("deflate, compress"), None);
        assert_eq!(negotiate(Some(b"gzip"), &[]), None);
    }

    #[test]
    fn spelling_is_tolerated() {
        assert_eq!(n("GZIP"), Some(Gzip));
        assert_eq!(n("ZStd"), Some(Zstd));
        assert_eq!(n("x-gzip"), Some(Gzip));
        assert_eq!(n("gzip ; q=0.8 , br ; Q=0.9"), Some(Br));
        assert_eq!(n("\tgzip;q=0.5,,, ,br;q=0.4"), Some(Gzip));
        assert_eq!(n("gzip;level=9;q=0.3, br;q=0.2"), Some(Gzip));
        // A malformed q is 0: not acceptable.
        assert_eq!(n("gzip;q=bogus, br;q=0"), None);
        assert_eq!(n("gzip;q=1.5"), None);
        assert_eq!(n("gzip;q=0.1234"), None);
        assert_eq!(n(";;;q=,=,"), None);
        assert_eq!(n("gzipx, brr, zstd2"), None);
    }

    #[test]
    fn q_syntax() {
        assert_eq!(parse_q(b"1"), Some(1000));
        assert_eq!(parse_q(b"1.000"), Some(1000));
        assert_eq!(parse_q(b"0.5"), Some(500));
        assert_eq!(parse_q(b"0.123"), Some(123));
        assert_eq!(parse_q(b"0"), Some(0));
        assert_eq!(parse_q(b"0.1234"), None);
        assert_eq!(parse_q(b"1.5"), None);
        assert_eq!(parse_q(b"2"), None);
        assert_eq!(parse_q(b""), None);
    }

    #[test]
    fn any_bytes_give_an_offered_coding_or_identity() {
        // A deterministic sweep over short byte strings built from the field's alphabet
        // and some garbage: never a panic, never a coding that was not offered.
        let alphabet: &[u8] = b"gzipbrtdq=.,; *01\xff\x00";
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 24) as usize;
            let field: Vec<u8> = (0..len)
                .map(|i| alphabet[((seed >> (i % 8 * 8)) as usize + i) % alphabet.len()])
                .collect();
            let offered = [Br, Gzip];
            if let Some(e) = negotiate(Some(&field), &offered) {
                assert!(offered.contains(&e), "{field:?}");
            }
        }
    }
}
