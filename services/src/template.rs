//! Values with variables, for header edits, rewrites and `try_files` (`tern run`'s config):
//! `$client`, `$scheme`, `$host`, `$request_id`, `$uri`, and `$1`..`$9` (a path pattern's
//! captures); `${name}` where a letter follows; `$$` is a `$`. Parsed once when the file is
//! read, each caller saying which variables make sense where, so an unknown or misplaced
//! one is a config error, never a surprise per request. Rendering appends to a buffer: one
//! pass over the parts, no formatter.

use std::net::IpAddr;

/// A variable a template may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// The peer's address (IPv6 without brackets), as nginx's `$remote_addr`.
    Client,
    /// `http` or `https`.
    Scheme,
    /// The Host the site was chosen by: lower case, without port or trailing dot.
    Host,
    /// The request's id (a site with `request_id = true`).
    RequestId,
    /// The canonical path (after any rewrite so far), still percent-encoded.
    Uri,
    /// A capture group of the route's path pattern, 1 to 9.
    Capture(u8),
}

impl Var {
    fn name(self) -> String {
        match self {
            Var::Client => "$client".into(),
            Var::Scheme => "$scheme".into(),
            Var::Host => "$host".into(),
            Var::RequestId => "$request_id".into(),
            Var::Uri => "$uri".into(),
            Var::Capture(n) => format!("${n}"),
        }
    }
}

/// The variables of header values.
pub const HEADER_VARS: &[Var] = &[Var::Client, Var::Scheme, Var::Host, Var::RequestId];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Var(Var),
}

/// A parsed value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// What the variables stand for in one request.
pub struct Values<'a> {
    pub client: IpAddr,
    pub secure: bool,
    /// The request's Host value as sent (normalised when rendered).
    pub host: &'a [u8],
    pub request_id: Option<&'a str>,
    pub uri: &'a str,
    /// The path pattern's groups, `captures[0]` being `$1`; a group that took no part is
    /// empty.
    pub captures: &'a [&'a [u8]],
}

impl Template {
    /// Parses `text`, allowing the variables in `allowed` (and `$1`..`$max_capture`).
    pub fn parse(text: &str, allowed: &[Var], max_capture: u8) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            literal.push_str(&rest[..at]);
            rest = &rest[at + 1..];
            if let Some(after) = rest.strip_prefix('$') {
                literal.push('$');
                rest = after;
                continue;
            }
            let (name, after) = if let Some(braced) = rest.strip_prefix('{') {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("{text:?}: `${{` without its `}}`"))?;
                (&braced[..end], &braced[end + 1..])
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                // `$1x` is `$1` then `x`: captures are one digit.
                let end = if rest.starts_with(|c: char| c.is_ascii_digit()) {
                    1.min(rest.len())
                } else {
                    end
                };
                (&rest[..end], &rest[end..])
            };
            let var = match name {
                "client" => Var::Client,
                "scheme" => Var::Scheme,
                "host" => Var::Host,
                "request_id" => Var::RequestId,
                "uri" => Var::Uri,
                d if d.len() == 1 && d.as_bytes()[0].is_ascii_digit() && d != "0" => {
                    Var::Capture(d.as_bytes()[0] - b'0')
                }
                "" => {
                    return Err(format!(
                        "{text:?}: a lone `$` (write `$$` for a dollar sign)"
                    ))
                }
                other => {
                    return Err(format!(
                        "{text:?}: unknown variable ${other} (known here: {})",
                        known(allowed, max_capture)
                    ))
                }
            };
            let ok = match var {
                Var::Capture(n) => n <= max_capture,
                v => allowed.contains(&v),
            };
            if !ok {
                return Err(match var {
                    Var::Capture(n) => format!(
                        "{text:?}: ${n} names no group of the route's path pattern (it has {max_capture})"
                    ),
                    v => format!(
                        "{text:?}: {} has no meaning here (known here: {})",
                        v.name(),
                        known(allowed, max_capture)
                    ),
                });
            }
            if !literal.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut literal)));
            }
            parts.push(Part::Var(var));
            rest = after;
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The text, when it holds no variable.
    pub fn as_literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Text(t)] => Some(t),
            _ => None,
        }
    }

    pub fn uses(&self, var: Var) -> bool {
        self.parts.contains(&Part::Var(var))
    }

    pub fn has_vars(&self) -> bool {
        self.as_literal().is_none()
    }

    pub fn render(&self, out: &mut Vec<u8>, v: &Values<'_>) {
        for part in &self.parts {
            match part {
                Part::Text(t) => out.extend_from_slice(t.as_bytes()),
                Part::Var(Var::Client) => push_ip(out, v.client.to_canonical()),
                Part::Var(Var::Scheme) => {
                    out.extend_from_slice(if v.secure { b"https" } else { b"http" })
                }
                Part::Var(Var::Host) => push_host(out, v.host),
                Part::Var(Var::RequestId) => {
                    out.extend_from_slice(v.request_id.unwrap_or("").as_bytes())
                }
                Part::Var(Var::Uri) => out.extend_from_slice(v.uri.as_bytes()),
                Part::Var(Var::Capture(n)) => {
                    if let Some(c) = v.captures.get(usize::from(*n) - 1) {
                        out.extend_from_slice(c);
                    }
                }
            }
        }
    }
}

fn known(allowed: &[Var], max_capture: u8) -> String {
    let mut names: Vec<String> = allowed.iter().map(|v| v.name()).collect();
    if max_capture > 0 {
        names.push(format!("$1..${max_capture}"));
    }
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    use std::io::Write;
    let _ = write!(out, "{ip}");
}

/// A Host value (which the codec has checked) lower-cased, without port and trailing dot.
fn push_host(out: &mut Vec<u8>, host: &[u8]) {
    let name = if host.first() == Some(&b'[') {
        match host.iter().position(|&b| b == b']') {
            Some(end) => &host[..=end],
            None => host,
        }
    } else {
        match host.iter().position(|&b| b == b':') {
            Some(colon) => &host[..colon],
            None => host,
        }
    };
    let name = name.strip_suffix(b".").unwrap_or(name);
    let start = out.len();
    out.extend_from_slice(name);
    out[start..].make_ascii_lowercase();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values<'a>(captures: &'a [&'a [u8]]) -> Values<'a> {
        Values {
            client: "::ffff:192.0.2.7".parse().unwrap(),
            secure: true,
            host: b"WWW.Example.org.:8443",
            request_id: Some("abc"),
            uri: "/a%20b/c",
            captures,
        }
    }

    fn render(text: &str, allowed: &[Var], max: u8) -> String {
        let t = Template::parse(text, allowed, max).unwrap();
        let mut out = Vec::new();
        t.render(&mut out, &values(&[b"one", b"two"]));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn variables_render_their_values() {
        assert_eq!(
            render("$client|$scheme|$host|$request_id", HEADER_VARS, 0),
            "192.0.2.7|https|www.example.org|abc"
        );
        assert_eq!(
            render("${uri}x/index.html", &[Var::Uri], 0),
            "/a%20b/cx/index.html"
        );
        assert_eq!(render("/p/$2/$1x", &[], 2), "/p/two/onex");
        assert_eq!(
            render("cost: 5$$ (${scheme})", HEADER_VARS, 0),
            "cost: 5$ (https)"
        );
        assert_eq!(render("plain", &[], 0), "plain");
        let t = Template::parse("no vars", HEADER_VARS, 0).unwrap();
        assert_eq!(t.as_literal(), Some("no vars"));
        assert!(Template::parse("$uri", &[Var::Uri], 0)
            .unwrap()
            .uses(Var::Uri));
    }

    #[test]
    fn unknown_misplaced_and_broken_variables_are_refused() {
        let err =
            |text: &str, allowed: &[Var], max: u8| Template::parse(text, allowed, max).unwrap_err();
        assert!(err("$remote_addr", HEADER_VARS, 0).contains("unknown variable $remote_addr"));
        assert!(err("$uri", HEADER_VARS, 0).contains("$uri has no meaning here"));
        assert!(err("$3", &[Var::Uri], 2).contains("$3 names no group"));
        assert!(err("$0", &[Var::Uri], 2).contains("unknown variable $0"));
        assert!(err("a $", HEADER_VARS, 0).contains("lone `$`"));
        assert!(err("${host", HEADER_VARS, 0).contains("without its"));
    }

    #[test]
    fn hosts_render_as_the_site_matched_them() {
        for (host, want) in [
            (&b"Example.ORG"[..], "example.org"),
            (b"example.org.:80", "example.org"),
            (b"[::1]:8080", "[::1]"),
            (b"", ""),
        ] {
            let mut out = Vec::new();
            push_host(&mut out, host);
            assert_eq!(out, want.as_bytes());
        }
    }
}
