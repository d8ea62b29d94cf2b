//! Canonical request path → cache key (the file's path below the root, decoded).
//!
//! The codec already put the path in canonical form ([`tern_codec::canonical_path`]): dot and
//! empty segments resolved, anything ambiguous refused. This module only decodes what is left
//! escaped and applies the dotfile rule, so the file opened is the one the route and the gate
//! judged. The key always starts with `/` and ends with `/` when the request names a
//! directory. It never contains NUL, a backslash, an empty segment or a `.`/`..` segment, so
//! `key[1..]` is a safe relative path to hand to `openat2`.

use std::borrow::Cow;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use tern_codec::{canonical_path, decoded_path};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathError {
    /// Not a canonical path (only a head built by hand, not by the codec, can hold one).
    BadRequest,
    /// A dotfile while dotfiles are not served.
    NotFound,
}

/// The key for `path`, a canonical request path ([`crate::Request::path`]).
///
/// The common case (nothing escaped) borrows `path`: no allocation, and one pass that finds
/// dotfiles and what only a head built by hand, not by the codec, could hold (NUL, `\\`,
/// `//`, a `.` or `..` segment), which must never reach the file system.
pub(crate) fn file_key(path: &str, serve_dotfiles: bool) -> Result<Cow<'_, [u8]>, PathError> {
    let key = decoded_path(path);
    check_key(&key, serve_dotfiles)?;
    Ok(key)
}

/// The rules a decoded path below the root must pass, whoever opens its file (the static
/// files, or a FastCGI server given a script's name): none of what only a head built by
/// hand could hold (NUL, `\\`, `//`, a `.` or `..` segment: 400), and no dotfile while
/// dotfiles are off (404).
pub(crate) fn check_key(key: &[u8], serve_dotfiles: bool) -> Result<(), PathError> {
    if !key.starts_with(b"/") {
        return Err(PathError::BadRequest);
    }
    let mut dotfile = false;
    let mut prev = 0u8;
    for (i, &c) in key.iter().enumerate() {
        match c {
            0 | b'\\' => return Err(PathError::BadRequest),
            b'/' if prev == b'/' => return Err(PathError::BadRequest),
            b'.' if prev == b'/' => {
                let seg = key[i..].split(|&c| c == b'/').next().unwrap_or_default();
                if seg == b"." || seg == b".." {
                    return Err(PathError::BadRequest);
                }
                dotfile = true;
            }
            _ => {}
        }
        prev = c;
    }
    if dotfile && !serve_dotfiles {
        return Err(PathError::NotFound);
    }
    Ok(())
}

/// The codec's canonical form, then [`file_key`]: from a raw request path to the file a
/// request names, for the fuzz target (`fuzz/fuzz_targets/path_normalize.rs`); not an API.
/// The error is the status a client gets: 400 (no canonical form) or 404 (a dotfile while
/// dotfiles are off).
#[doc(hidden)]
pub fn normalize_path(raw: &str, serve_dotfiles: bool) -> Result<Vec<u8>, u16> {
    let canonical = canonical_path(raw).map_err(|_| 400u16)?;
    if !canonical.starts_with('/') {
        return Err(400);
    }
    file_key(&canonical, serve_dotfiles)
        .map(Cow::into_owned)
        .map_err(|e| match e {
            PathError::BadRequest => 400,
            PathError::NotFound => 404,
        })
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

    /// From a raw path, as a request goes: the codec's canonical form, then the key.
    fn key(raw: &str, dot: bool) -> Result<Vec<u8>, PathError> {
        let canonical = canonical_path(raw).map_err(|_| PathError::BadRequest)?;
        file_key(&canonical, dot).map(Cow::into_owned)
    }

    fn n(raw: &str) -> Result<String, PathError> {
        key(raw, false).map(|k| String::from_utf8(k).unwrap())
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
            assert!(matches!(file_key(p, false), Ok(Cow::Borrowed(_))), "{p}");
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
        assert_eq!(n("/100%25").unwrap(), "/100%");
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
            "/..;/x",
            "relative",
            "",
        ] {
            assert_eq!(n(p), Err(PathError::BadRequest), "{p}");
        }
    }

    #[test]
    fn a_head_not_made_by_the_codec_cannot_traverse() {
        for p in ["/../x", "/a/./b", "/a/../../x", "/a//b", "/a\\b", "/a\0b"] {
            assert_eq!(file_key(p, true), Err(PathError::BadRequest), "{p:?}");
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
            assert!(key(p, true).is_ok(), "{p}");
        }
        // A dot segment that normalises away is not a dotfile.
        assert_eq!(n("/.git/..").unwrap(), "/");
        assert_eq!(key("/.env", true).unwrap(), b"/.env");
    }

    proptest::proptest! {
        #[test]
        fn keys_are_always_normal(
            raw in "/[a-z.%/2eEfF5cC0;\\\\]{0,24}",
            dot in proptest::bool::ANY,
        ) {
            if let Ok(key) = key(&raw, dot) {
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
        let key = key("//evil.example", false).unwrap();
        let loc = directory_location(&key, None);
        assert_eq!(loc, b"/evil.example/");
        assert_eq!(
            directory_location("/\u{20ac}".as_bytes(), None),
            b"/%E2%82%AC/"
        );
    }
}
