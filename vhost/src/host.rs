//! Host names: normalising the request's `Host` (or HTTP/2 `:authority`) without copying to
//! the heap, and the prebuilt table that maps it to a site.

use std::collections::HashMap;

/// The longest DNS name (RFC 1035); longer Host values can match no site.
const MAX_NAME: usize = 253;

/// Exact names and one-label wildcards, built once per site table.
#[derive(Debug, Default)]
pub(crate) struct HostTable {
    /// `example.org` → site index.
    exact: HashMap<Box<[u8]>, usize>,
    /// `*.example.org` is stored as `example.org`.
    wildcard: HashMap<Box<[u8]>, usize>,
}

/// Why a host pattern cannot be used (the caller adds where it came from).
#[derive(Debug, PartialEq, Eq)]
pub enum PatternError {
    Empty,
    HasPort,
    BadWildcard,
    BadName,
}

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PatternError::Empty => "is empty",
            PatternError::HasPort => "names a port: hosts match whatever port was used, leave it out",
            PatternError::BadWildcard => {
                "is a bad wildcard: only a whole first label is allowed, as in *.example.org (one label)"
            }
            PatternError::BadName => {
                "is not a host name (letters, digits, '-' and '_' in dot-separated labels of at most 63, or an [IPv6] literal)"
            }
        })
    }
}

/// A host pattern of the config, checked and lowercased: `example.org`, `*.example.org`,
/// `127.0.0.1` or `[::1]`. A trailing dot is dropped (`example.org.` is the same name).
pub fn normalize_pattern(pattern: &str) -> Result<String, PatternError> {
    let p = pattern
        .strip_suffix('.')
        .unwrap_or(pattern)
        .to_ascii_lowercase();
    if p.is_empty() {
        return Err(PatternError::Empty);
    }
    if p.starts_with('[') {
        let inner = p.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
        return match inner {
            Some(a)
                if !a.is_empty()
                    && a.bytes()
                        .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') =>
            {
                Ok(p)
            }
            _ if p.contains("]:") => Err(PatternError::HasPort),
            _ => Err(PatternError::BadName),
        };
    }
    if p.contains(':') {
        return Err(PatternError::HasPort);
    }
    let name = match p.strip_prefix("*.") {
        Some(rest) => rest,
        None => &p,
    };
    if name.contains('*') {
        return Err(PatternError::BadWildcard);
    }
    if name.len() > MAX_NAME || !name.split('.').all(valid_label) {
        return Err(PatternError::BadName);
    }
    Ok(p)
}

fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

impl HostTable {
    /// Adds a normalised pattern (see [`normalize_pattern`]); false if it is already taken.
    pub(crate) fn insert(&mut self, pattern: &str, site: usize) -> bool {
        let (map, key) = match pattern.strip_prefix("*.") {
            Some(rest) => (&mut self.wildcard, rest),
            None => (&mut self.exact, pattern),
        };
        let key: Box<[u8]> = key.as_bytes().into();
        if map.contains_key(&key) {
            return false;
        }
        map.insert(key, site);
        true
    }

    /// The site for a request's Host value: exact name first, then the wildcard of its parent
    /// (one label only: `*.example.org` matches `a.example.org`, not `a.b.example.org` nor
    /// `example.org`). Case-insensitive, port ignored; no heap allocation.
    pub(crate) fn find(&self, host: &[u8]) -> Option<usize> {
        let name = strip_port(host);
        let name = name.strip_suffix(b".").unwrap_or(name);
        if name.is_empty() || name.len() > MAX_NAME {
            return None;
        }
        let mut buf = [0u8; MAX_NAME];
        let lower = &mut buf[..name.len()];
        lower.copy_from_slice(name);
        lower.make_ascii_lowercase();
        if let Some(&site) = self.exact.get(&*lower) {
            return Some(site);
        }
        if self.wildcard.is_empty() || lower[0] == b'[' {
            return None;
        }
        let dot = lower.iter().position(|&b| b == b'.')?;
        if dot == 0 {
            return None;
        }
        self.wildcard.get(&lower[dot + 1..]).copied()
    }
}

/// `name:port` → `name`; `[v6]:port` → `[v6]`. The codec has already refused Host values
/// that are not `host[:port]`.
fn strip_port(host: &[u8]) -> &[u8] {
    if host.first() == Some(&b'[') {
        return match host.iter().position(|&b| b == b']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.iter().position(|&b| b == b':') {
        Some(colon) => &host[..colon],
        None => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(patterns: &[&str]) -> HostTable {
        let mut t = HostTable::default();
        for (i, p) in patterns.iter().enumerate() {
            assert!(t.insert(&normalize_pattern(p).unwrap(), i), "{p}");
        }
        t
    }

    #[test]
    fn exact_names_ignore_case_port_and_a_trailing_dot() {
        let t = table(&["example.org", "127.0.0.1", "[::1]"]);
        for host in [
            "example.org",
            "EXAMPLE.Org",
            "example.org:8443",
            "example.org.",
            "Example.ORG.:80",
        ] {
            assert_eq!(t.find(host.as_bytes()), Some(0), "{host}");
        }
        assert_eq!(t.find(b"127.0.0.1:8080"), Some(1));
        assert_eq!(t.find(b"[::1]:8080"), Some(2));
        assert_eq!(t.find(b"[::1]"), Some(2));
        for host in [
            "example.com",
            "www.example.org",
            "example.org.evil",
            "",
            ":80",
            ".",
        ] {
            assert_eq!(t.find(host.as_bytes()), None, "{host}");
        }
        assert_eq!(t.find("a".repeat(300).as_bytes()), None);
    }

    #[test]
    fn a_wildcard_matches_one_label_and_exact_names_win() {
        let t = table(&["*.example.org", "www.example.org"]);
        assert_eq!(t.find(b"a.example.org"), Some(0));
        assert_eq!(t.find(b"A-1.Example.org:81"), Some(0));
        assert_eq!(t.find(b"www.example.org"), Some(1));
        assert_eq!(t.find(b"WWW.example.org"), Some(1));
        assert_eq!(t.find(b"example.org"), None, "the wildcard needs a label");
        assert_eq!(t.find(b"a.b.example.org"), None, "one label only");
        assert_eq!(t.find(b".example.org"), None);
        assert_eq!(t.find(b"aexample.org"), None);
    }

    #[test]
    fn duplicates_are_refused() {
        let mut t = table(&["example.org", "*.example.org"]);
        assert!(!t.insert("example.org", 5));
        assert!(!t.insert("*.example.org", 5));
        assert!(t.insert("*.www.example.org", 5));
    }

    #[test]
    fn patterns_are_checked() {
        assert_eq!(normalize_pattern("Example.ORG.").unwrap(), "example.org");
        assert_eq!(normalize_pattern("*.Example.org").unwrap(), "*.example.org");
        assert_eq!(normalize_pattern("[::1]").unwrap(), "[::1]");
        assert_eq!(normalize_pattern(""), Err(PatternError::Empty));
        assert_eq!(
            normalize_pattern("example.org:8080"),
            Err(PatternError::HasPort)
        );
        assert_eq!(normalize_pattern("[::1]:80"), Err(PatternError::HasPort));
        for bad in [
            "*example.org",
            "a.*.org",
            "*.*.org",
            "*",
            "w*.example.org",
            "*.a*b.org",
        ] {
            assert_eq!(
                normalize_pattern(bad),
                Err(PatternError::BadWildcard),
                "{bad}"
            );
        }
        for bad in [
            "exa mple.org",
            "a..b",
            "-a.org",
            "a-.org",
            "a/b",
            "ex@mple.org",
            &"a".repeat(64),
        ] {
            assert_eq!(normalize_pattern(bad), Err(PatternError::BadName), "{bad}");
        }
    }
}
