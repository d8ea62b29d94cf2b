//! Request path → cache key: percent-decoding and normalisation, refusing anything that could
//! name a file other than the one the segments spell out.
//!
//! The key is the decoded path with `.`/`..`/empty segments resolved. It always starts with `/`
//! and ends with `/` when the request names a directory (a trailing slash, or a final `.`/`..`
//! segment). It never contains NUL, a backslash, an empty segment or a `.`/`..` segment, so
//! `key[1..]` is a safe relative path to hand to `openat2`.

use std::borrow::Cow;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathError {
    /// Malformed or hostile: bad `%xx`, NUL, backslash, encoded slash, `..` above the root.
    BadRequest,
    /// A dotfile while dotfiles are not served.
    NotFound,
}

/// Decodes and normalises `raw` (the request path, still percent-encoded).
///
/// The common case (no `%`, `\`, `//` or `/.`) is already normal and borrows `raw`: no
/// allocation on the hot path.
pub(crate) fn normalize(raw: &str, serve_dotfiles: bool) -> Result<Cow<'_, [u8]>, PathError> {
    let b = raw.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(PathError::BadRequest);
    }
    // Fast check: one table lookup per byte; only `/` needs a look at its successor.
    let mut i = 0;
    while i < b.len() {
        if SPECIAL[b[i] as usize] && (b[i] != b'/' || matches!(b.get(i + 1), Some(b'/' | b'.'))) {
            return normalize_slow(b, serve_dotfiles).map(Cow::Owned);
        }
        i += 1;
    }
    Ok(Cow::Borrowed(b))
}

/// [`normalize`] for the fuzz target (`fuzz/fuzz_targets/path_normalize.rs`); not an API.
/// The error is the status the static handler answers: 400 (hostile or malformed) or 404 (a
/// dotfile while dotfiles are off).
#[doc(hidden)]
pub fn normalize_path(raw: &str, serve_dotfiles: bool) -> Result<Cow<'_, [u8]>, u16> {
    normalize(raw, serve_dotfiles).map_err(|e| match e {
        PathError::BadRequest => 400,
        PathError::NotFound => 404,
    })
}

/// Bytes the fast check stops at: `%`, `\`, NUL and `/`.
static SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'%' as usize] = true;
    t[b'\\' as usize] = true;
    t[0] = true;
    t[b'/' as usize] = true;
    t
};

fn normalize_slow(b: &[u8], serve_dotfiles: bool) -> Result<Vec<u8>, PathError> {
    // 1. Percent-decode. An encoded `/` must never become a separator and an encoded `\` or
    //    NUL is as hostile as a raw one.
    let mut dec = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hi = b.get(i + 1).and_then(|&c| hex(c));
                let lo = b.get(i + 2).and_then(|&c| hex(c));
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(PathError::BadRequest);
                };
                let v = hi << 4 | lo;
                if v == b'/' || v == b'\\' || v == 0 {
                    return Err(PathError::BadRequest);
                }
                dec.push(v);
                i += 3;
            }
            b'\\' | 0 => return Err(PathError::BadRequest),
            c => {
                dec.push(c);
                i += 1;
            }
        }
    }

    // 2. Resolve segments. `out` has no trailing slash while it is being built.
    let mut out = Vec::with_capacity(dec.len() + 1);
    out.push(b'/');
    let mut dir = false;
    for seg in dec[1..].split(|&c| c == b'/') {
        match seg {
            b"" | b"." => dir = true,
            b".." => {
                if out.len() == 1 {
                    return Err(PathError::BadRequest);
                }
                let cut = out.iter().rposition(|&c| c == b'/').unwrap_or(0);
                out.truncate(cut.max(1));
                dir = true;
            }
            _ => {
                if out.len() > 1 {
                    out.push(b'/');
                }
                out.extend_from_slice(seg);
                dir = false;
            }
        }
    }
    if dir && out.len() > 1 {
        out.push(b'/');
    }
    if !serve_dotfiles && memchr::memmem::find(&out, b"/.").is_some() {
        return Err(PathError::NotFound);
    }
    Ok(out)
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Everything but unreserved characters and `/` is escaped in a Location we build.
const LOCATION_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// The Location for a directory requested without its trailing slash: built from the
/// normalised key (so it starts with exactly one `/` and can never become a protocol-relative
/// `//host` redirect), re-encoded, plus the original query.
pub(crate) fn directory_location(key: &[u8], query: Option<&str>) -> Vec<u8> {
    let mut loc = Vec::with_capacity(key.len() + 2 + query.map_or(0, |q| q.len() + 1));
    for part in percent_encoding::percent_encode(key, LOCATION_SET) {
        loc.extend_from_slice(part.as_bytes());
    }
    loc.push(b'/');
    if let Some(q) = query {
        loc.push(b'?');
        loc.extend_from_slice(q.as_bytes());
    }
    loc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(raw: &str) -> Result<String, PathError> {
        normalize(raw, false).map(|k| String::from_utf8(k.into_owned()).unwrap())
    }

    #[test]
    fn clean_paths_borrow() {
        for p in [
            "/",
            "/index.html",
            "/a/b/c.js",
            "/dir/",
            "/a.b/c..d",
            "/a-b_c~",
        ] {
            assert!(matches!(normalize(p, false), Ok(Cow::Borrowed(_))), "{p}");
            assert_eq!(n(p).unwrap(), p);
        }
    }

    #[test]
    fn decodes_and_normalises() {
        assert_eq!(n("/a%20b.txt").unwrap(), "/a b.txt");
        assert_eq!(n("/%E2%82%AC").unwrap(), "/\u{20ac}");
        assert_eq!(n("/a//b").unwrap(), "/a/b");
        assert_eq!(n("/a/./b").unwrap(), "/a/b");
        assert_eq!(n("/a/b/../c").unwrap(), "/a/c");
        assert_eq!(n("/a/%2e%2E/c").unwrap(), "/c");
        assert_eq!(n("/a/b/..").unwrap(), "/a/");
        assert_eq!(n("/a/.").unwrap(), "/a/");
        assert_eq!(n("/a/..").unwrap(), "/");
        assert_eq!(n("/.").unwrap(), "/");
        assert_eq!(n("//").unwrap(), "/");
        assert_eq!(n("/a%2Fb").unwrap_err(), PathError::BadRequest);
    }

    #[test]
    fn traversal_is_refused() {
        for p in [
            "/../etc/passwd",
            "/..",
            "/%2e%2e/",
            "/%2e%2e/etc/passwd",
            "/a/%2e%2e/%2e%2e/x",
            "/a/../../x",
            "/..%2f..%2fetc/passwd",
            "/a%2f..%2f..%2fx",
            "/%2F",
            "/a%5c..%5cb",
            "/a\\..\\b",
            "/a\\b",
            "/a%00.html",
            "/a%0",
            "/a%zz",
            "/a%",
            "relative",
            "",
        ] {
            assert_eq!(n(p), Err(PathError::BadRequest), "{p}");
        }
    }

    #[test]
    fn dotfiles() {
        for p in [
            "/.env",
            "/.git/config",
            "/a/.hidden",
            "/a/%2ehtaccess",
            "/.well-known/x",
        ] {
            assert_eq!(n(p), Err(PathError::NotFound), "{p}");
            assert!(normalize(p, true).is_ok(), "{p}");
        }
        // A dot segment that normalises away is not a dotfile.
        assert_eq!(n("/.git/..").unwrap(), "/");
        assert_eq!(
            String::from_utf8(normalize("/.env", true).unwrap().into_owned()).unwrap(),
            "/.env"
        );
    }

    proptest::proptest! {
        #[test]
        fn keys_are_always_normal(
            raw in "/[a-z.%/2eEfF5cC0\\\\]{0,24}",
            dot in proptest::bool::ANY,
        ) {
            if let Ok(key) = normalize(&raw, dot) {
                proptest::prop_assert!(key.starts_with(b"/"));
                proptest::prop_assert!(!key.contains(&0) && !key.contains(&b'\\'));
                proptest::prop_assert!(memchr::memmem::find(&key, b"//").is_none());
                for seg in key[1..].split(|&c| c == b'/') {
                    proptest::prop_assert!(seg != b"." && seg != b"..", "{:?}", key);
                    proptest::prop_assert!(dot || !seg.starts_with(b"."), "{:?}", key);
                }
            }
        }
    }

    #[test]
    fn location_is_reencoded_and_never_protocol_relative() {
        assert_eq!(directory_location(b"/docs", None), b"/docs/");
        assert_eq!(directory_location(b"/a b", Some("x=1&y")), b"/a%20b/?x=1&y");
        let key = normalize("//evil.example", false).unwrap();
        let loc = directory_location(&key, None);
        assert_eq!(loc, b"/evil.example/");
        assert_eq!(
            directory_location("/\u{20ac}".as_bytes(), None),
            b"/%E2%82%AC/"
        );
    }
}
