//! From a raw request path to the file it names (`tern_server::static_files::normalize_path`:
//! the codec's canonical form, then the static handler's key) on arbitrary request paths. The
//! first byte's low bit says whether dotfiles are served; the rest is the path (lossily made
//! UTF-8, as the codec only hands over `&str` targets). The canonical form itself is checked
//! too: it is a fixed point (allocation-free unless it holds an escape or a dotfile), and
//! decoding it gives the key.
//!
//! Checked: it never panics; an accepted key starts with exactly one `/`, never holds NUL, a
//! backslash, an empty, `.` or `..` segment (so `key[1..]` is a safe relative path), nor a
//! dot-segment when dotfiles are off; the verdict agrees with a simple reference model;
//! switching dotfiles on only ever turns a 404 into a key; and normalising a key again gives the
//! key back (when it is still a valid, %-free path), via the allocation-free fast path.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tern_server::static_files::normalize_path;
use tern_server::{canonical_path, decoded_path};

/// Straightforward reference: decode everything, then resolve segments on a stack.
fn model(raw: &[u8], dotfiles: bool) -> Result<Vec<u8>, u16> {
    if raw.first() != Some(&b'/') {
        return Err(400);
    }
    let mut dec = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let c = raw[i];
        if c == b'%' {
            let hex = |j: usize| {
                raw.get(j)
                    .and_then(|&h| (h as char).to_digit(16))
                    .map(|d| d as u8)
            };
            let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                return Err(400);
            };
            let v = hi * 16 + lo;
            // Refused: encoded separators and control bytes, and `%25` that spells another
            // escape (it would decode twice).
            if v == b'/' || v == b'\\' || v < 0x20 || v == 0x7f {
                return Err(400);
            }
            dec.push(v);
            i += 3;
        } else if c == b'\\' || c == 0 || c == b';' || c == b'#' {
            return Err(400);
        } else {
            dec.push(c);
            i += 1;
        }
    }
    // `%25` + two hex digits once decoded: an escape an upstream could decode again. The
    // model decodes everything, so it looks for `%` + two hex digits among the decoded bytes
    // wherever the `%` itself came from an escape.
    if escaped_percent_spells_escape(raw) {
        return Err(400);
    }
    let mut stack: Vec<&[u8]> = Vec::new();
    let mut dir = false;
    for seg in dec[1..].split(|&c| c == b'/') {
        match seg {
            b"" | b"." => dir = true,
            b".." => {
                if stack.pop().is_none() {
                    return Err(400);
                }
                dir = true;
            }
            s => {
                stack.push(s);
                dir = false;
            }
        }
    }
    if !dotfiles && stack.iter().any(|s| s.starts_with(b".")) {
        return Err(404);
    }
    let mut out = b"/".to_vec();
    out.extend_from_slice(&stack.join(&b'/'));
    if dir && !stack.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

/// Whether decoding only the unreserved escapes of `raw` leaves `%25` followed by two hex
/// digits (checked independently of the codec's single pass).
fn escaped_percent_spells_escape(raw: &[u8]) -> bool {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(hi), Some(lo)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                let v = hi * 16 + lo;
                if v.is_ascii_alphanumeric() || b"-._~".contains(&v) {
                    out.push(v);
                } else {
                    out.push(b'%');
                    out.extend_from_slice(&raw[i + 1..i + 3].to_ascii_uppercase());
                }
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    out.windows(5)
        .any(|w| w[..3] == *b"%25" && w[3].is_ascii_hexdigit() && w[4].is_ascii_hexdigit())
}

fn check_key(key: &[u8], dotfiles: bool, raw: &str) {
    assert!(key.starts_with(b"/"), "{raw:?} -> {key:?}: not rooted");
    assert!(
        !key.starts_with(b"//"),
        "{raw:?} -> {key:?}: protocol-relative"
    );
    assert!(!key.contains(&0), "{raw:?} -> {key:?}: NUL");
    assert!(!key.contains(&b'\\'), "{raw:?} -> {key:?}: backslash");
    let body = &key[1..];
    let body = body.strip_suffix(b"/").unwrap_or(body);
    if body.is_empty() {
        return;
    }
    for seg in body.split(|&c| c == b'/') {
        assert!(!seg.is_empty(), "{raw:?} -> {key:?}: empty segment");
        assert!(
            seg != b"." && seg != b"..",
            "{raw:?} -> {key:?}: dot segment"
        );
        assert!(
            dotfiles || !seg.starts_with(b"."),
            "{raw:?} -> {key:?}: dotfile served with dotfiles off"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let dotfiles = flags & 1 == 1;
    let raw = String::from_utf8_lossy(rest);
    let raw: &str = &raw;

    let got = normalize_path(raw, dotfiles);
    let want = model(raw.as_bytes(), dotfiles);
    assert_eq!(
        got.as_deref().map_err(|&e| e),
        want.as_deref().map_err(|&e| e),
        "{raw:?} (dotfiles {dotfiles}) disagrees with the model"
    );

    if let Ok(key) = &got {
        check_key(key, dotfiles, raw);
    }

    // The canonical form is its own canonical form, borrowed the second time, and decoding it
    // gives the key (or a dotfile refused with dotfiles off).
    if let Ok(canonical) = canonical_path(raw) {
        if canonical.starts_with('/') {
            let again = canonical_path(&canonical).expect("a canonical path stays valid");
            assert_eq!(again, canonical, "{raw:?}: not a fixed point");
            // Only a segment starting with a dot (a dotfile) or an escape sends a canonical
            // path down the slow path again.
            if !canonical.contains("/.") && !canonical.contains('%') {
                assert!(matches!(again, Cow::Borrowed(_)), "{raw:?}: slow path");
            }
            if let Ok(key) = &got {
                assert_eq!(&decoded_path(&canonical)[..], &key[..], "{raw:?}");
            }
        }
    } else {
        assert_eq!(got, Err(400), "{raw:?}: refused by the codec, so 400");
    }

    // Dotfiles only decide between 404 and serving; they never change a 400 or a key.
    let other = normalize_path(raw, !dotfiles);
    let (off, on) = if dotfiles {
        (&other, &got)
    } else {
        (&got, &other)
    };
    match (off, on) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{raw:?}"),
        (Err(400), Err(400)) => {}
        (Err(404), Ok(_)) => {}
        (a, b) => panic!("{raw:?}: dotfiles off {a:?}, on {b:?}"),
    }
});
