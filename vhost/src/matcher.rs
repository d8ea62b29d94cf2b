//! What a route asks of a request beyond its path prefix: methods, header values, query
//! parameters, and a path pattern (a glob, or an anchored regular expression). All of it is
//! checked and compiled when the table is built; per request a matcher reads the head the
//! codec parsed, and a pattern runs on the `regex` crate's engines, which take time linear
//! in the path whatever the pattern (no backtracking).

use regex::bytes::{Regex, RegexBuilder};
use tern_server::{Method, RequestHead};

/// The most compiled memory a route's pattern may take (a pattern past it is refused):
/// enough for any sane path pattern, and a bound on what a config can make tern build.
const PATTERN_SIZE_LIMIT: usize = 256 * 1024;
/// The longest pattern text.
const PATTERN_MAX_LEN: usize = 1024;

/// A route's matchers as the config gives them.
#[derive(Debug, Clone, Default)]
pub struct MatchSpec {
    /// Method tokens (`GET` also takes `HEAD`); empty: any method.
    pub methods: Vec<String>,
    /// `(name, value)`: the field is present with this value (any of its lines, compared
    /// exactly after trimming), or present at all for `*`.
    pub headers: Vec<(String, String)>,
    /// `(name, value)`: a query parameter, percent-decoded, with this value, or present at
    /// all for `*`.
    pub query: Vec<(String, String)>,
    /// A glob on the decoded path: `*` within a segment, `**` across segments, `?` one
    /// character.
    pub path_glob: Option<String>,
    /// A regular expression on the decoded path, anchored at both ends (`^...$`).
    pub path_regex: Option<String>,
    /// `(name, pattern)`: the field is present and one of its lines (trimmed) matches the
    /// anchored regular expression, whole.
    pub header_patterns: Vec<(String, String)>,
}

/// Checks matchers as the site table will build them.
pub fn check_matchers(spec: &MatchSpec) -> Result<(), String> {
    Matchers::new(spec).map(|_| ())
}

/// Compiled matchers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Matchers {
    methods: u16,
    other_methods: Vec<String>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    query: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    pattern: Option<Regex>,
    header_patterns: Vec<(String, Regex)>,
}

fn method_bit(m: Method) -> u16 {
    1 << (m as u16)
}

/// Compiles a path pattern (one of `glob`, `regex`); the error says what is wrong with it.
pub fn compile_pattern(glob: Option<&str>, regex: Option<&str>) -> Result<Option<Regex>, String> {
    let source = match (glob, regex) {
        (Some(_), Some(_)) => return Err("give path_glob or path_regex, not both".into()),
        (None, None) => return Ok(None),
        (Some(g), None) => glob_to_regex(g)?,
        (None, Some(r)) => return compile_anchored("path_regex", r).map(Some),
    };
    compile_limited(&source, "the path pattern").map(Some)
}

/// Compiles an anchored pattern (`key` names it in errors): it must start with `^` (after
/// flag groups such as `(?i)`, which may come before or after the anchor) and end with `$`
/// (or `\z`), and it must match the whole text: it is compiled inside `^(?:...)$`, so an
/// alternation such as `^/a|/b$` cannot match `/b` at the end of any text.
pub fn compile_anchored(key: &str, pattern: &str) -> Result<Regex, String> {
    let mut rest = pattern;
    // Leading flag groups: `(?i)`, `(?ix)`, `(?-u)`; never a group with a `:`.
    while let Some(after) = rest.strip_prefix("(?") {
        match after.find(')') {
            Some(end)
                if end > 0
                    && after[..end]
                        .bytes()
                        .all(|b| b.is_ascii_alphabetic() || b == b'-') =>
            {
                rest = &after[end + 1..];
            }
            _ => break,
        }
    }
    if !rest.starts_with('^')
        || !(pattern.ends_with('$') || pattern.ends_with("\\z"))
        || pattern.ends_with("\\$")
    {
        return Err(format!(
            "{key} {pattern:?} must be anchored: start with ^ (flags such as (?i) may come \
             before or after it) and end with $ (a pattern that may match anywhere is an easy \
             mistake that widens a route)"
        ));
    }
    compile_limited(&format!("^(?:{pattern})$"), &format!("{key} {pattern:?}"))
}

fn compile_limited(source: &str, what: &str) -> Result<Regex, String> {
    if source.len() > PATTERN_MAX_LEN {
        return Err(format!(
            "{what} is longer than {PATTERN_MAX_LEN} characters"
        ));
    }
    RegexBuilder::new(source)
        .size_limit(PATTERN_SIZE_LIMIT)
        .dfa_size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => {
                format!("{what} compiles too large (over {PATTERN_SIZE_LIMIT} bytes): simplify it")
            }
            e => format!("{what} does not compile: {e}"),
        })
}

/// A glob as an anchored regex on the whole path: `*` stays within a segment (but a leading
/// one takes any path), `**` crosses segments, `?` is one character other than `/`,
/// everything else is itself.
fn glob_to_regex(glob: &str) -> Result<String, String> {
    if glob.is_empty() {
        return Err("path_glob is empty".into());
    }
    if !glob.starts_with('/') && !glob.starts_with('*') {
        return Err(format!(
            "path_glob {glob:?} must start with / or * (it matches the whole path)"
        ));
    }
    let mut out = String::from("^");
    // A leading `*` stands for any path up to what follows (`*.php`, as in Caddy's path
    // matcher); elsewhere `*` keeps to its segment.
    let glob = match glob.strip_prefix('*') {
        Some(rest) if !rest.starts_with('*') => {
            out.push_str(".*");
            rest
        }
        _ => glob,
    };
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                out.push_str(".*");
            }
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            c => out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
    }
    out.push('$');
    Ok(out)
}

impl Matchers {
    pub(crate) fn new(spec: &MatchSpec) -> Result<Matchers, String> {
        let mut m = Matchers::default();
        for token in &spec.methods {
            if !tern_server::is_token(token.as_bytes())
                || token.bytes().any(|b| b.is_ascii_lowercase())
            {
                return Err(format!(
                    "method {token:?} is not an upper-case method token"
                ));
            }
            match Method::from_token(token) {
                Method::Other => m.other_methods.push(token.clone()),
                Method::Get => m.methods |= method_bit(Method::Get) | method_bit(Method::Head),
                known => m.methods |= method_bit(known),
            }
        }
        for (name, value) in &spec.headers {
            if !tern_server::is_token(name.as_bytes()) {
                return Err(format!("header {name:?} is not a field name"));
            }
            if value.bytes().any(|b| b.is_ascii_control()) {
                return Err(format!("header {name}: the value holds control characters"));
            }
            let value = (value != "*").then(|| value.trim().as_bytes().to_vec());
            m.headers.push((name.clone(), value));
        }
        for (name, value) in &spec.query {
            if name.is_empty() {
                return Err("a query matcher needs a parameter name".into());
            }
            let value = (value != "*").then(|| value.as_bytes().to_vec());
            m.query.push((name.as_bytes().to_vec(), value));
        }
        m.pattern = compile_pattern(spec.path_glob.as_deref(), spec.path_regex.as_deref())?;
        for (name, pattern) in &spec.header_patterns {
            if !tern_server::is_token(name.as_bytes()) {
                return Err(format!("header {name:?} is not a field name"));
            }
            let re = compile_anchored(&format!("the pattern of header {name}"), pattern)?;
            m.header_patterns.push((name.clone(), re));
        }
        Ok(m)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.methods == 0
            && self.other_methods.is_empty()
            && self.headers.is_empty()
            && self.query.is_empty()
            && self.pattern.is_none()
            && self.header_patterns.is_empty()
    }

    pub(crate) fn pattern(&self) -> Option<&Regex> {
        self.pattern.as_ref()
    }

    /// Groups of the pattern (for `$1`..`$9` in a rewrite).
    pub(crate) fn capture_count(&self) -> u8 {
        self.pattern
            .as_ref()
            .map_or(0, |p| (p.captures_len() - 1).min(9) as u8)
    }

    /// Whether the request meets every matcher; `decoded` is its decoded canonical path.
    pub(crate) fn matches(&self, head: &RequestHead<'_>, decoded: &[u8]) -> bool {
        if (self.methods != 0 || !self.other_methods.is_empty())
            && self.methods & method_bit(head.method) == 0
            && !(head.method == Method::Other
                && self.other_methods.iter().any(|m| m == head.method_str))
        {
            return false;
        }
        for (name, want) in &self.headers {
            let mut values = head.header_all(name);
            let found = match want {
                None => values.next().is_some(),
                Some(want) => values.any(|v| tern_server::trim_ows(v) == want.as_slice()),
            };
            if !found {
                return false;
            }
        }
        for (name, want) in &self.query {
            if !query_has(head.query.unwrap_or(""), name, want.as_deref()) {
                return false;
            }
        }
        for (name, re) in &self.header_patterns {
            if !head
                .header_all(name)
                .any(|v| re.is_match(tern_server::trim_ows(v)))
            {
                return false;
            }
        }
        match &self.pattern {
            Some(p) => p.is_match(decoded),
            None => true,
        }
    }
}

/// Whether `query` has parameter `name` (with `value`, when given), both compared
/// percent-decoded (`+` as a space, as forms send them).
fn query_has(query: &str, name: &[u8], value: Option<&[u8]>) -> bool {
    query.split('&').any(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        decoded_eq(k.as_bytes(), name) && value.is_none_or(|want| decoded_eq(v.as_bytes(), want))
    })
}

/// `raw` percent-decoded equals `want`, without allocating.
fn decoded_eq(raw: &[u8], want: &[u8]) -> bool {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let (mut i, mut j) = (0, 0);
    while i < raw.len() {
        let byte = match raw[i] {
            b'%' if i + 2 < raw.len() => match (hex(raw[i + 1]), hex(raw[i + 2])) {
                (Some(h), Some(l)) => {
                    i += 2;
                    h << 4 | l
                }
                _ => b'%',
            },
            b'+' => b' ',
            b => b,
        };
        i += 1;
        if want.get(j) != Some(&byte) {
            return false;
        }
        j += 1;
    }
    j == want.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_matches(spec: &MatchSpec, raw: &str) -> bool {
        let m = Matchers::new(spec).unwrap();
        tern_server::testing::with_request(
            raw.as_bytes(),
            "127.0.0.1:1".parse().unwrap(),
            false,
            |req| {
                let decoded = tern_server::decoded_path(req.path());
                m.matches(req.head, &decoded)
            },
        )
    }

    #[test]
    fn methods_match_and_get_takes_head() {
        let spec = MatchSpec {
            methods: vec!["GET".into(), "PROPFIND".into()],
            ..Default::default()
        };
        assert!(head_matches(&spec, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(head_matches(&spec, "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(head_matches(
            &spec,
            "PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n"
        ));
        assert!(!head_matches(
            &spec,
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(!head_matches(&spec, "MKCOL / HTTP/1.1\r\nHost: a\r\n\r\n"));
        for bad in ["get", "", "G T"] {
            let spec = MatchSpec {
                methods: vec![bad.into()],
                ..Default::default()
            };
            assert!(Matchers::new(&spec).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers_and_query_parameters_match_by_value_or_presence() {
        let spec = MatchSpec {
            headers: vec![
                ("X-Api".into(), "2".into()),
                ("Authorization".into(), "*".into()),
            ],
            query: vec![
                ("format".into(), "json x".into()),
                ("debug".into(), "*".into()),
            ],
            ..Default::default()
        };
        let ok = "GET /?a=1&format=json+x&debug HTTP/1.1\r\nHost: a\r\nX-Api: 1\r\nx-api:  2 \r\nAuthorization: x\r\n\r\n";
        assert!(head_matches(&spec, ok));
        assert!(head_matches(&spec, &ok.replace("json+x", "json%20x")));
        assert!(head_matches(&spec, &ok.replace("format", "f%6Frmat")));
        assert!(!head_matches(&spec, &ok.replace("json+x", "json")));
        assert!(!head_matches(&spec, &ok.replace("&debug", "")));
        assert!(!head_matches(&spec, &ok.replace("x-api:  2", "x-api: 3")));
        assert!(!head_matches(
            &spec,
            &ok.replace("Authorization: x\r\n", "")
        ));
        assert!(!head_matches(
            &spec,
            &ok.replace("?a=1&format=json+x&debug", "")
        ));
    }

    #[test]
    fn decoding_compares_exactly() {
        assert!(decoded_eq(b"a%2Fb", b"a/b"));
        assert!(decoded_eq(b"%", b"%"));
        assert!(decoded_eq(b"a%2", b"a%2"));
        assert!(decoded_eq(b"%zz", b"%zz"));
        assert!(!decoded_eq(b"ab", b"abc"));
        assert!(!decoded_eq(b"abc", b"ab"));
    }

    #[test]
    fn globs_and_regexes_match_the_whole_decoded_path() {
        let glob = |g: &str, path: &str| {
            compile_pattern(Some(g), None)
                .unwrap()
                .unwrap()
                .is_match(path.as_bytes())
        };
        assert!(glob("*.php", "/index.php"));
        assert!(!glob("/*.php", "/a/index.php"), "* stays in its segment");
        assert!(glob("/**.php", "/a/b/index.php"));
        assert!(glob("/img/?.png", "/img/a.png"));
        assert!(!glob("/img/?.png", "/img/ab.png"));
        assert!(!glob("/a.b", "/axb"), "a dot is a dot");
        assert!(glob("/café/*", "/café/x"));
        let re = compile_pattern(None, Some(r"^/u/([0-9]+)$"))
            .unwrap()
            .unwrap();
        assert!(re.is_match(b"/u/42"));
        assert!(!re.is_match(b"/u/42/x"));
    }

    /// Flags may come before the anchor as well as after it (`(?i)^…$` was refused while
    /// `^(?i)…$` worked), and an alternation cannot unanchor a pattern: `^/a|/b$` used to
    /// match any path ending in `/b`.
    #[test]
    fn flags_may_precede_the_anchor_and_a_pattern_matches_whole() {
        let re = |r: &str| compile_pattern(None, Some(r)).unwrap().unwrap();
        for r in [r"(?i)^/admin$", r"^(?i)/admin$", r"(?i)(?x)^ /admin $"] {
            assert!(re(r).is_match(b"/ADMIN"), "{r}");
            assert!(!re(r).is_match(b"/ADMIN/x"), "{r}");
        }
        let alt = re(r"^/a|/b$");
        assert!(alt.is_match(b"/a") && alt.is_match(b"/b"));
        assert!(
            !alt.is_match(b"/x/b") && !alt.is_match(b"/a/x"),
            "whole path only"
        );
        assert_eq!(re(r"^/u/([0-9]+)$").captures_len(), 2, "no group added");
        for bad in [r"(?i)/admin$", r"(?i:^/admin)$", r"(?)^/a$"] {
            let e = compile_pattern(None, Some(bad)).unwrap_err();
            assert!(e.contains("must be anchored"), "{bad}: {e}");
        }
    }

    #[test]
    fn header_patterns_match_a_whole_line_of_the_field() {
        let spec = MatchSpec {
            header_patterns: vec![("User-Agent".into(), r"^DavClnt.*$".into())],
            ..Default::default()
        };
        let ua = |v: &str| format!("GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: {v}\r\n\r\n");
        assert!(head_matches(&spec, &ua("DavClnt/1.0")));
        assert!(head_matches(&spec, &ua("  DavClnt  ")), "trimmed");
        assert!(!head_matches(&spec, &ua("Mozilla DavClnt")), "anchored");
        assert!(
            !head_matches(&spec, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            "absent"
        );
        let accept = MatchSpec {
            header_patterns: vec![("Accept".into(), r"(?i)^.*\btext/html\b.*$".into())],
            ..Default::default()
        };
        let two_lines =
            "GET / HTTP/1.1\r\nHost: a\r\nAccept: image/png\r\nAccept: TEXT/HTML;q=0.9\r\n\r\n";
        assert!(head_matches(&accept, two_lines), "any line of the field");
        for (name, pattern, want) in [
            ("User Agent", "^x$", "not a field name"),
            ("User-Agent", "DavClnt", "must be anchored"),
            ("User-Agent", "^(x$", "does not compile"),
        ] {
            let spec = MatchSpec {
                header_patterns: vec![(name.into(), pattern.into())],
                ..Default::default()
            };
            let e = Matchers::new(&spec).unwrap_err();
            assert!(e.contains(want), "{name} {pattern}: {e}");
        }
    }

    #[test]
    fn unanchored_huge_and_broken_patterns_are_refused() {
        for (glob, re, want) in [
            (None, Some(r"/u/[0-9]+"), "must be anchored"),
            (None, Some(r"^/u/[0-9]+"), "must be anchored"),
            (None, Some(r"/u$"), "must be anchored"),
            (None, Some(r"^/u\$"), "must be anchored"),
            (None, Some(r"^(a$"), "does not compile"),
            (None, Some(r"^\w{1000}\w{1000}$"), "compiles too large"),
            (Some("x*"), None, "must start with"),
            (Some("/a"), Some("^/a$"), "not both"),
        ] {
            let e = compile_pattern(glob, re).unwrap_err();
            assert!(e.contains(want), "{glob:?} {re:?}: {e}");
        }
        let long = format!("^/{}$", "a".repeat(2000));
        assert!(compile_pattern(None, Some(&long))
            .unwrap_err()
            .contains("longer than"));
    }
}
