//! Where a login or a passed challenge may send the browser: back to a path of this site,
//! never elsewhere (the open redirects of Anubis and swad's unchecked `rdr`).

/// `s` if it is a relative path of this site: one leading `/` (not `//`, not `/\`), no
/// backslash, no control character or space, no encoded slash or backslash right after the
/// first `/`, at most 2048 bytes. Anything else (`http://…`, `javascript:…`, `//evil`) is
/// refused, and the caller goes to `/`.
pub fn safe_return_path(s: &str) -> Option<&str> {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 2048 || b[0] != b'/' {
        return None;
    }
    if b.len() > 1 && (b[1] == b'/' || b[1] == b'\\') {
        return None;
    }
    if b.iter().any(|&c| c == b'\\' || c <= b' ' || c == 0x7f) {
        return None;
    }
    // Some servers and frameworks decode before resolving: refuse what decodes to `//`.
    let lower = |i: usize| b.get(i).map(u8::to_ascii_lowercase);
    if lower(1) == Some(b'%') && lower(2) == Some(b'2') && lower(3) == Some(b'f')
        || lower(1) == Some(b'%') && lower(2) == Some(b'5') && lower(3) == Some(b'c')
    {
        return None;
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_of_this_site_pass() {
        for ok in [
            "/",
            "/a",
            "/a/b?c=d&e=//f",
            "/docs/a%20b",
            "/x#frag",
            "/:colon",
            "/a//b",
        ] {
            assert_eq!(safe_return_path(ok), Some(ok), "{ok:?}");
        }
        for bad in [
            "",
            "//evil.example",
            "///evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "\\/evil.example",
            "javascript:alert(1)",
            "JaVaScRiPt:alert(1)",
            "http://evil.example/",
            "https://evil.example/",
            "evil.example",
            "/\t/evil.example",
            "/ /evil",
            "/a\nLocation: x",
            "/a\r\n",
            "/%2f%2fevil.example",
            "/%2F/evil.example",
            "/%5cevil.example",
            "/a\\b",
            "data:text/html,x",
        ] {
            assert_eq!(safe_return_path(bad), None, "{bad:?}");
        }
        assert!(safe_return_path(&format!("/{}", "a".repeat(2047))).is_some());
        assert_eq!(safe_return_path(&format!("/{}", "a".repeat(2048))), None);
    }
}
