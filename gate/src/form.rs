//! `application/x-www-form-urlencoded` bodies and query strings: the few fields the gate's
//! forms and links carry, decoded on demand.

use std::borrow::Cow;

use percent_encoding::{percent_decode, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// The first value of `name` in `pairs` (`a=1&b=2`), `+` and percent escapes decoded; `None`
/// when absent or not UTF-8.
pub fn value<'a>(pairs: &'a [u8], name: &str) -> Option<Cow<'a, str>> {
    for pair in pairs.split(|&b| b == b'&') {
        let (key, raw) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        if decode(key).as_deref() == Some(name) {
            return decode(raw);
        }
    }
    None
}

fn decode(raw: &[u8]) -> Option<Cow<'_, str>> {
    if !raw.iter().any(|&b| b == b'+' || b == b'%') {
        return std::str::from_utf8(raw).ok().map(Cow::Borrowed);
    }
    let spaced: Vec<u8> = raw
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    let bytes: Vec<u8> = percent_decode(&spaced).collect();
    String::from_utf8(bytes).ok().map(Cow::Owned)
}

/// Everything but unreserved characters and `/` is escaped: a path stays readable in a
/// query string, and nothing in it can end the parameter.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `s` escaped for use as one query-string value.
pub fn encode(s: &str) -> String {
    utf8_percent_encode(s, QUERY_VALUE).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_found_and_decoded() {
        let body = b"user=al+ice&password=p%40ss%26word&return=%2Fa%3Fb%3D1&empty=&flag";
        assert_eq!(value(body, "user").as_deref(), Some("al ice"));
        assert_eq!(value(body, "password").as_deref(), Some("p@ss&word"));
        assert_eq!(value(body, "return").as_deref(), Some("/a?b=1"));
        assert_eq!(value(body, "empty").as_deref(), Some(""));
        assert_eq!(value(body, "flag").as_deref(), Some(""));
        assert_eq!(value(body, "missing"), None);
        assert_eq!(value(b"x=%ff", "x"), None, "not UTF-8");
        assert_eq!(value(b"a=1&a=2", "a").as_deref(), Some("1"));
    }

    #[test]
    fn encoding_round_trips() {
        for s in ["/a?b=1&c=d e", "/ü/%20", "/"] {
            let q = format!("return={}", encode(s));
            assert_eq!(value(q.as_bytes(), "return").as_deref(), Some(s));
        }
        assert_eq!(encode("/docs/a b"), "/docs/a%20b");
    }
}
