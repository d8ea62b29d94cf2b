//! Conditional requests (RFC 9110 §13): If-None-Match, If-Modified-Since, If-Range.

/// If-None-Match: `*` or a list of entity tags, compared weakly (a `W/` prefix on either side is
/// ignored). `etag` is ours, quoted.
pub(crate) fn none_match_hits(header: &[u8], etag: &[u8]) -> bool {
    let mut s = header;
    loop {
        while let [b' ' | b'\t' | b',', rest @ ..] = s {
            s = rest;
        }
        if s.is_empty() {
            return false;
        }
        if s[0] == b'*' {
            return true;
        }
        if let [b'W', b'/', rest @ ..] = s {
            s = rest;
        }
        if s.first() == Some(&b'"') {
            // A quoted tag: up to the closing quote (etagc never contains one).
            match memchr::memchr(b'"', &s[1..]) {
                Some(close) => {
                    let tag = &s[..close + 2];
                    if tag == etag {
                        return true;
                    }
                    s = &s[close + 2..];
                }
                None => return false,
            }
        } else {
            // Garbage element (an unquoted tag): skip to the next comma.
            match memchr::memchr(b',', s) {
                Some(c) => s = &s[c..],
                None => return false,
            }
        }
    }
}

/// If-Modified-Since: true when the file has not changed since the given date. An exact copy of
/// our Last-Modified (what browsers send back) is recognised without parsing the date.
pub(crate) fn not_modified_since(header: &[u8], last_modified: &[u8], mtime_secs: u64) -> bool {
    let h = tern_codec::trim_ows(header);
    if h == last_modified {
        return true;
    }
    match parse_http_date(h) {
        Some(since) => mtime_secs <= since,
        None => false,
    }
}

/// If-Range: true when the range may be served. An entity tag must match the identity
/// representation's tag strongly (a weak tag never does); a date must equal Last-Modified.
pub(crate) fn if_range_allows(
    header: &[u8],
    identity_etag: &[u8],
    last_modified: &[u8],
    mtime_secs: u64,
) -> bool {
    let h = tern_codec::trim_ows(header);
    if h.starts_with(b"W/") {
        return false;
    }
    if h.first() == Some(&b'"') {
        return h == identity_etag;
    }
    h == last_modified || parse_http_date(h) == Some(mtime_secs)
}

fn parse_http_date(b: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(b).ok()?;
    let t = httpdate::parse_http_date(s).ok()?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &[u8] = b"\"5f1a-3b9-1c\"";

    #[test]
    fn if_none_match_lists() {
        assert!(none_match_hits(b"\"5f1a-3b9-1c\"", TAG));
        assert!(none_match_hits(b"W/\"5f1a-3b9-1c\"", TAG));
        assert!(none_match_hits(b"\"a\", \"5f1a-3b9-1c\"", TAG));
        assert!(none_match_hits(b"\"a\",W/\"5f1a-3b9-1c\" ,\"b\"", TAG));
        assert!(none_match_hits(b"*", TAG));
        assert!(none_match_hits(b" * ", TAG));
        assert!(!none_match_hits(b"\"5f1a-3b9-1c-gz\"", TAG));
        assert!(!none_match_hits(b"\"a\", \"b\"", TAG));
        assert!(!none_match_hits(b"5f1a-3b9-1c", TAG));
        assert!(!none_match_hits(b"\"5f1a-3b9-1c", TAG));
        assert!(!none_match_hits(b"", TAG));
        assert!(none_match_hits(b"junk, \"5f1a-3b9-1c\"", TAG));
    }

    #[test]
    fn if_modified_since() {
        let lm = b"Sun, 06 Nov 1994 08:49:37 GMT";
        let t = 784111777;
        assert!(not_modified_since(lm, lm, t));
        assert!(not_modified_since(b"Sun, 06 Nov 1994 08:49:38 GMT", lm, t));
        assert!(!not_modified_since(b"Sun, 06 Nov 1994 08:49:36 GMT", lm, t));
        assert!(not_modified_since(b"Sunday, 06-Nov-94 08:49:37 GMT", lm, t));
        assert!(!not_modified_since(b"yesterday", lm, t));
    }

    #[test]
    fn if_range() {
        let lm = b"Sun, 06 Nov 1994 08:49:37 GMT";
        let t = 784111777;
        assert!(if_range_allows(TAG, TAG, lm, t));
        assert!(!if_range_allows(b"W/\"5f1a-3b9-1c\"", TAG, lm, t));
        assert!(!if_range_allows(b"\"other\"", TAG, lm, t));
        assert!(if_range_allows(lm, TAG, lm, t));
        assert!(!if_range_allows(
            b"Sun, 06 Nov 1994 08:49:38 GMT",
            TAG,
            lm,
            t
        ));
        assert!(!if_range_allows(b"nonsense", TAG, lm, t));
    }
}
