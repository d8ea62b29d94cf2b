//! The one view of a request path that every later decision uses: the site's route, the
//! gate's rules, the static file, and the request line a proxy sends upstream.
//!
//! The canonical form is the path normalised as RFC 3986 §6.2.2 describes and nothing more:
//! percent-encoded unreserved characters decoded (`/%61dmin` is `/admin`), other escapes kept
//! with upper-case hex, `.` and `..` segments resolved and empty segments merged (`//a/./b/..`
//! is `/a/`). It is still percent-encoded, so an upstream that decodes it and one that does
//! not both read the same segments tern decided on: what is left encoded can no longer make a
//! separator, a dot segment or another escape.
//!
//! What two readers could split differently is refused (400) rather than guessed at:
//! - an encoded `/` or `\` (`%2F`, `%5C`): nginx and many frameworks decode `%2F` into a
//!   separator, others keep it inside a segment; a raw `\` is a separator on some servers.
//!   A proxy route may take `%2F` (`allow_encoded_slash`): [`canonical_path_opaque_slash`]
//!   keeps it as an escape inside its segment, [`decoded`] never decodes it, so the route,
//!   the gate and the upstream's request line all read one segment where the client wrote
//!   `%2F`;
//! - an encoded control byte (`%00`–`%1F`, `%7F`): NUL truncates file names in C, CR/LF end
//!   up in headers when an app echoes the path;
//! - an encoded `%` that spells another escape (`%2561`): an upstream that decodes twice reads
//!   `/a`, tern would have read `/%61`;
//! - a `;` (path parameters): Tomcat and other servlet containers drop `;...` from each
//!   segment (`/admin;x/` is `/admin/`, `/..;/` is `/../`) while nginx, tern and most apps
//!   keep it, so no choice tern makes here is safe for every upstream. Send it as `%3B`;
//! - a raw `#`: a fragment is never sent (tern's own parser refuses one in the target), but
//!   nginx ends the path there, so the gate must not judge `/private#/../x` as `/x` for it;
//! - `..` above the root, a malformed escape.
//!
//! Paths that are not origin-form (`*` for OPTIONS, the authority of CONNECT) are left alone;
//! no route matches them.

use std::borrow::Cow;

use crate::body::hex_value as hex;

/// Why a path has no canonical form. Always answered 400 ([`crate::RequestError::BadPath`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// `%` not followed by two hex digits.
    BadEscape,
    /// `%2F`: refused unless the route it reaches takes it (see
    /// [`canonical_path_opaque_slash`]).
    EncodedSlash,
    /// `%5C` or a raw `\`.
    EncodedSeparator,
    /// `%00`–`%1F` or `%7F`.
    EncodedControl,
    /// `%25` followed by two hex digits.
    DoubleEncoding,
    /// A `;` anywhere in the path.
    PathParameter,
    /// `..` that climbs above the root.
    AboveRoot,
    /// A raw `#`.
    Fragment,
}

/// The canonical form of `raw` (a request path, still percent-encoded; see the module doc).
///
/// A path that is already canonical (no `%`, `\`, `;`, `#`, `//` or `/.`) is borrowed: no
/// allocation on the common path, one table lookup per byte.
pub fn canonical_path(raw: &str) -> Result<Cow<'_, str>, PathError> {
    let b = raw.as_bytes();
    if b.first() != Some(&b'/') {
        return Ok(Cow::Borrowed(raw));
    }
    let mut i = 0;
    while i < b.len() {
        if SPECIAL[b[i] as usize] && (b[i] != b'/' || matches!(b.get(i + 1), Some(b'/' | b'.'))) {
            return canonical_slow(b, false).map(Cow::Owned);
        }
        i += 1;
    }
    Ok(Cow::Borrowed(raw))
}

/// As [`canonical_path`], but an encoded slash is kept as the escape `%2F` (upper case)
/// inside its segment rather than refused: it never separates segments, takes no part in
/// dot segments (`/a%2F..` is one segment `a%2F..`), and [`decoded`] leaves it encoded, so
/// every decision reads the segment the client wrote. For the routes that take it only
/// (`allow_encoded_slash`); every other consumer uses [`canonical_path`], which refuses it.
pub fn canonical_path_opaque_slash(raw: &str) -> Result<Cow<'_, str>, PathError> {
    match canonical_path(raw) {
        Err(PathError::EncodedSlash) => canonical_slow(raw.as_bytes(), true).map(Cow::Owned),
        other => other,
    }
}

/// Whether a canonical path holds an encoded slash (only [`canonical_path_opaque_slash`]
/// leaves one).
pub fn has_encoded_slash(canonical: &str) -> bool {
    memchr::memmem::find(canonical.as_bytes(), b"%2F").is_some()
}

/// Bytes the fast check stops at: `%`, `\`, `;`, `#`, NUL and `/` (only when a `/` or `.`
/// follows).
static SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'%' as usize] = true;
    t[b'\\' as usize] = true;
    t[b';' as usize] = true;
    t[b'#' as usize] = true;
    t[0] = true;
    t[b'/' as usize] = true;
    t
};

/// `opaque_slash`: `%2F` is kept as an escape (see [`canonical_path_opaque_slash`]).
fn canonical_slow(b: &[u8], opaque_slash: bool) -> Result<String, PathError> {
    // 1. Escapes: unreserved characters decoded (so `%2e` takes part in dot segments below,
    //    as nginx resolves it), the rest kept in upper case or refused.
    let mut dec = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hi = b.get(i + 1).copied().and_then(hex);
                let lo = b.get(i + 2).copied().and_then(hex);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(PathError::BadEscape);
                };
                let v = hi << 4 | lo;
                if is_unreserved(v) {
                    dec.push(v);
                } else if v == b'/' && !opaque_slash {
                    return Err(PathError::EncodedSlash);
                } else if v == b'\\' {
                    return Err(PathError::EncodedSeparator);
                } else if v < 0x20 || v == 0x7f {
                    return Err(PathError::EncodedControl);
                } else {
                    dec.extend_from_slice(&[b'%', HEX_UPPER[hi as usize], HEX_UPPER[lo as usize]]);
                }
                i += 3;
            }
            b'\\' => return Err(PathError::EncodedSeparator),
            b';' => return Err(PathError::PathParameter),
            b'#' => return Err(PathError::Fragment),
            0 => return Err(PathError::EncodedControl),
            c => {
                dec.push(c);
                i += 1;
            }
        }
    }

    // An escaped `%` followed by two hex digits decodes into another escape: an upstream
    // that decodes twice would read what tern never judged. Checked on the decoded bytes,
    // since `%25a%32` spells `%25a2` once `%32` is decoded.
    if dec
        .windows(5)
        .any(|w| w[..3] == *b"%25" && hex(w[3]).is_some() && hex(w[4]).is_some())
    {
        return Err(PathError::DoubleEncoding);
    }

    // 2. Segments (RFC 3986 §5.2.4, with empty segments merged). `out` has no trailing slash
    //    while it is built; a final `/`, `.` or `..` makes the result name a directory.
    let mut out = Vec::with_capacity(dec.len());
    out.push(b'/');
    let mut dir = false;
    for seg in dec[1..].split(|&c| c == b'/') {
        match seg {
            b"" | b"." => dir = true,
            b".." => {
                if out.len() == 1 {
                    return Err(PathError::AboveRoot);
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
    // Only ASCII was decoded and whole escapes were kept, so multi-byte characters the raw
    // path held are intact: the bytes are still UTF-8.
    String::from_utf8(out).map_err(|_| PathError::BadEscape)
}

/// The bytes a canonical path spells, every escape decoded but `%2F`: what a file name or a
/// policy rule is compared with. Safe on a canonical path only, where no escape can decode
/// into a separator, a dot segment or another escape; an encoded slash (a route that takes
/// it) stays `%2F`, one character of its segment, as the route was chosen on.
pub fn decoded(canonical: &str) -> Cow<'_, [u8]> {
    let b = canonical.as_bytes();
    if memchr::memchr(b'%', b).is_none() {
        return Cow::Borrowed(b);
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let (Some(hi), Some(lo)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) {
                let v = hi << 4 | lo;
                if v == b'/' {
                    out.extend_from_slice(b"%2F");
                } else {
                    out.push(v);
                }
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    Cow::Owned(out)
}

/// Whether `path` is `prefix` or lies below it, on a segment boundary. A trailing slash on the
/// prefix is ignored, so `/admin` and `/admin/` both cover `/admin`, `/admin/` and `/admin/x`,
/// and neither covers `/administrator` or `/admin.bak`; `/` covers every origin-form path.
/// Works on canonical paths and on their decoded bytes alike (routes and the gate compare
/// decoded ones, so every spelling of a name matches).
pub fn path_under(prefix: impl AsRef<[u8]>, path: impl AsRef<[u8]>) -> bool {
    let mut prefix = prefix.as_ref();
    while let [rest @ .., b'/'] = prefix {
        prefix = rest;
    }
    match path.as_ref().strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest[0] == b'/',
        None => false,
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// RFC 3986 §2.3.
fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(raw: &str) -> Result<String, PathError> {
        canonical_path(raw).map(Cow::into_owned)
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        for p in [
            "/",
            "/index.html",
            "/a/b/c.js",
            "/dir/",
            "/a.b/c..d",
            "/a-b_c~",
            "/€",
            "*",
        ] {
            assert!(matches!(canonical_path(p), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_dots_resolved() {
        assert_eq!(c("/%61dmin").unwrap(), "/admin");
        assert_eq!(c("//admin").unwrap(), "/admin");
        assert_eq!(c("/./admin").unwrap(), "/admin");
        assert_eq!(c("/x/../admin").unwrap(), "/admin");
        assert_eq!(c("/x/%2e%2E/admin/").unwrap(), "/admin/");
        assert_eq!(c("/a/b/..").unwrap(), "/a/");
        assert_eq!(c("/a/.").unwrap(), "/a/");
        assert_eq!(c("/.").unwrap(), "/");
        assert_eq!(c("//").unwrap(), "/");
        assert_eq!(c("/.well-known/%2e%2e/secret").unwrap(), "/secret");
        assert_eq!(c("/.env").unwrap(), "/.env");
    }

    #[test]
    fn other_escapes_stay_encoded_in_upper_case() {
        assert_eq!(c("/a%20b").unwrap(), "/a%20b");
        assert_eq!(c("/%e2%82%ac").unwrap(), "/%E2%82%AC");
        assert_eq!(c("/a%2bb").unwrap(), "/a%2Bb");
        assert_eq!(c("/q%3Fx%23y").unwrap(), "/q%3Fx%23y");
        assert_eq!(c("/100%25").unwrap(), "/100%25");
        assert_eq!(c("/100%25x").unwrap(), "/100%25x");
        assert_eq!(c("/%3B").unwrap(), "/%3B");
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        use PathError::*;
        for (p, e) in [
            ("/admin%2Fsecret.txt", EncodedSlash),
            ("/.well-known/..%2Fsecret", EncodedSlash),
            ("/robots.txt%2F..%2Fsecret", EncodedSlash),
            ("/a%2fb", EncodedSlash),
            ("/a%5cb", EncodedSeparator),
            ("/a\\b", EncodedSeparator),
            ("/a%00.png", EncodedControl),
            ("/a%0d%0aX: y", EncodedControl),
            ("/a%7f", EncodedControl),
            ("/%2561dmin", DoubleEncoding),
            ("/e/ea%25a%32-2", DoubleEncoding),
            ("/%25%34%31", DoubleEncoding),
            ("/admin;x", PathParameter),
            ("/..;/admin", PathParameter),
            ("/private/p.txt#/../../index.html", Fragment),
            ("/app/private#x", Fragment),
            ("/../etc/passwd", AboveRoot),
            ("/%2e%2e/admin", AboveRoot),
            ("/a/../../x", AboveRoot),
            ("/a%", BadEscape),
            ("/a%0", BadEscape),
            ("/a%zz", BadEscape),
        ] {
            assert_eq!(c(p), Err(e), "{p}");
        }
    }

    #[test]
    fn an_opaque_slash_stays_one_escape_of_its_segment() {
        let o = |raw| canonical_path_opaque_slash(raw).map(Cow::into_owned);
        assert_eq!(o("/api/a%2fb").unwrap(), "/api/a%2Fb");
        assert_eq!(o("/api/a%2Fb/%61").unwrap(), "/api/a%2Fb/a");
        // Never a separator, so never part of a dot segment either.
        assert_eq!(
            o("/api/x/..%2F..%2Fadmin").unwrap(),
            "/api/x/..%2F..%2Fadmin"
        );
        assert_eq!(o("/api/%2F/").unwrap(), "/api/%2F/");
        assert_eq!(o("/a/b/../c%2Fd").unwrap(), "/a/c%2Fd");
        // Borrowed when nothing changes; everything else refused as before.
        assert!(matches!(
            canonical_path_opaque_slash("/a/b"),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(o("/a%2Fb%5Cc"), Err(PathError::EncodedSeparator));
        assert_eq!(o("/a%2F%00"), Err(PathError::EncodedControl));
        assert_eq!(o("/a%2F%252F"), Err(PathError::DoubleEncoding));
        assert_eq!(o("/a%2F/../../x"), Err(PathError::AboveRoot));
        assert!(has_encoded_slash(&o("/a%2fb").unwrap()));
        assert!(!has_encoded_slash("/a/b%20c"));
        // Decoding keeps it, so a prefix `/api/a` is not a parent of `/api/a%2Fb`.
        let p = o("/api/a%2Fb%20c").unwrap();
        assert_eq!(&*decoded(&p), b"/api/a%2Fb c");
        assert!(!path_under("/api/a", &*decoded(&p)));
        assert!(path_under("/api", &*decoded(&p)));
    }

    #[test]
    fn decoding_a_canonical_path() {
        assert_eq!(&*decoded("/a%20b/%E2%82%AC"), "/a b/€".as_bytes());
        assert_eq!(&*decoded("/100%25"), b"/100%");
        assert!(matches!(decoded("/plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(path_under("/admin", "/admin"));
        assert!(path_under("/admin", "/admin/"));
        assert!(path_under("/admin/", "/admin"));
        assert!(path_under("/admin/", "/admin/x"));
        assert!(!path_under("/admin", "/administrator"));
        assert!(!path_under("/robots.txt", "/robots.txt.bak"));
        assert!(path_under("/", "/anything"));
        assert!(path_under("", "/anything"));
        assert!(!path_under("/", "*"));
    }

    proptest::proptest! {
        /// Whatever the input, a canonical path starts with one `/`, has no empty, `.` or `..`
        /// segment even after decoding, no `;`, and is its own canonical form.
        #[test]
        fn canonical_is_a_fixed_point(raw in "/[a-z.%/2eEfF5cC0;\\\\]{0,24}") {
            if let Ok(p) = canonical_path(&raw) {
                proptest::prop_assert!(p.starts_with('/'));
                let dec = decoded(&p);
                proptest::prop_assert!(memchr::memmem::find(&dec, b"//").is_none());
                for seg in dec[1..].split(|&c| c == b'/') {
                    proptest::prop_assert!(seg != b"." && seg != b"..", "{:?}", p);
                }
                proptest::prop_assert!(!p.contains(';') && !p.contains('\\'));
                proptest::prop_assert_eq!(canonical_path(&p).unwrap(), p.clone());
            }
        }

        /// The same with encoded slashes kept: still a fixed point, and decoding it keeps
        /// each `%2F` whole, so its segments are those of the canonical form.
        #[test]
        fn opaque_slashes_are_a_fixed_point(raw in "/[a-z.%/2eEfF5cC0;\\\\]{0,24}") {
            if let Ok(p) = canonical_path_opaque_slash(&raw) {
                proptest::prop_assert!(p.starts_with('/'));
                let dec = decoded(&p);
                proptest::prop_assert_eq!(
                    dec.iter().filter(|&&c| c == b'/').count(),
                    p.bytes().filter(|&c| c == b'/').count()
                );
                for seg in dec[1..].split(|&c| c == b'/') {
                    proptest::prop_assert!(seg != b"." && seg != b"..", "{:?}", p);
                }
                proptest::prop_assert_eq!(canonical_path_opaque_slash(&p).unwrap(), p.clone());
                proptest::prop_assert_eq!(canonical_path(&p).is_ok(), !has_encoded_slash(&p));
            }
        }
    }
}
