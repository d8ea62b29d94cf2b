//! Player names: 1–40 bytes of ASCII letters, digits and `@/:.^+!-_*`, percent-decoded from
//! the path or query. A literal `+` is refused (in a query it means a space); send `%2B`.

pub const MAX_LEN: usize = 40;

/// Why a name was refused; the text is the 400 body.
pub const INVALID: &str = "invalid name: use 1-40 of A-Z a-z 0-9 and @/:.^+!-_* (send + as %2B)\n";

fn allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"@/:.^+!-_*".contains(&b)
}

/// Decodes and checks a raw (still percent-encoded) name.
pub fn parse(raw: &str) -> Option<String> {
    let raw = raw.as_bytes();
    if raw.is_empty() || raw.len() > MAX_LEN * 3 {
        return None;
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = match raw[i] {
            b'%' => {
                let hex = raw.get(i + 1..i + 3)?;
                let s = std::str::from_utf8(hex).ok()?;
                i += 3;
                u8::from_str_radix(s, 16).ok()?
            }
            b'+' => return None,
            b => {
                i += 1;
                b
            }
        };
        if !allowed(b) {
            return None;
        }
        out.push(b);
    }
    if out.is_empty() || out.len() > MAX_LEN {
        return None;
    }
    // Every allowed byte is ASCII.
    String::from_utf8(out).ok()
}

/// The raw `name` parameter of a query string (`a=1&name=x`), if present.
pub fn from_query(query: &str) -> Option<&str> {
    query.split('&').find_map(|pair| pair.strip_prefix("name="))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_charset() {
        assert_eq!(parse("alice").as_deref(), Some("alice"));
        assert_eq!(
            parse("a@b/c:d.e^f!g-h_i*j").as_deref(),
            Some("a@b/c:d.e^f!g-h_i*j")
        );
        assert_eq!(parse("x%2By").as_deref(), Some("x+y"));
        assert_eq!(parse("%41").as_deref(), Some("A"));
        assert_eq!(parse(&"a".repeat(40)).as_deref(), Some(&*"a".repeat(40)));
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "", "x+y", "a b", "a%20b", "%", "%4", "%zz", "ümlaut", "%C3%BC", "<script>", "a\"b",
            "a%00", "a'b", "a,b", "a;b", "a&b", "a=b", "a#b", "a?b", "a~b", "a%7E",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse(&"a".repeat(41)), None);
        assert_eq!(parse(&"%41".repeat(41)), None);
    }

    #[test]
    fn query_parameter() {
        assert_eq!(from_query("name=bob"), Some("bob"));
        assert_eq!(from_query("x=1&name=bob&y=2"), Some("bob"));
        assert_eq!(from_query("nickname=bob"), None);
        assert_eq!(from_query("name="), Some(""));
    }
}
