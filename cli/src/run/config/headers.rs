//! Header edits: `add_headers` and `remove_headers` (a site's, on every answer, and a
//! route's over them), `headers_by_type` and `expires` (by content type), and a proxy's
//! `add_request_headers` and `remove_request_headers`.

use std::collections::BTreeMap;

use tern_vhost::HeaderEdits;
use toml::Spanned;

use super::file::{ExpiresByType, ExpiresValue, HeadersByType, RouteFile, SiteFile};
use super::problems::Problems;

/// One level's header keys (a site's or a route's).
pub(super) struct HeaderKeys<'a> {
    add_headers: &'a Option<Spanned<BTreeMap<String, String>>>,
    remove_headers: &'a Option<Spanned<Vec<String>>>,
    headers_by_type: &'a Option<Spanned<HeadersByType>>,
    expires: &'a Option<Spanned<ExpiresByType>>,
}

impl SiteFile {
    pub(super) fn header_keys(&self) -> HeaderKeys<'_> {
        HeaderKeys {
            add_headers: &self.add_headers,
            remove_headers: &self.remove_headers,
            headers_by_type: &self.headers_by_type,
            expires: &self.expires,
        }
    }
}

impl RouteFile {
    pub(super) fn header_keys(&self) -> HeaderKeys<'_> {
        HeaderKeys {
            add_headers: &self.add_headers,
            remove_headers: &self.remove_headers,
            headers_by_type: &self.headers_by_type,
            expires: &self.expires,
        }
    }
}

/// Fields the connection writes itself; a route can neither set nor remove them.
const CONNECTION_FIELDS: [&str; 8] = [
    "connection",
    "content-length",
    "date",
    "keep-alive",
    "server",
    "transfer-encoding",
    "upgrade",
    "proxy-connection",
];

/// `add_headers`, `remove_headers`, `headers_by_type` and `expires` (a site's or a route's),
/// checked; problems are recorded, bad entries left out.
pub(super) fn check_headers(keys: HeaderKeys<'_>, p: &mut Problems<'_>) -> HeaderEdits {
    let (set, remove) = check_edits(
        ("add_headers", keys.add_headers),
        ("remove_headers", keys.remove_headers),
        p,
    );
    let mut edits = HeaderEdits {
        set: set.into_iter().map(|(n, v, _)| (n, v)).collect(),
        remove,
        ..HeaderEdits::default()
    };
    // A pattern is named once per key, whatever its case.
    let pattern_ok =
        |key: &str, pattern: &str, seen: &mut Vec<String>, at: usize, p: &mut Problems<'_>| {
            if let Err(e) = tern_vhost::check_type_pattern(pattern) {
                p.at(at, format!("{key}: {e}"));
                return false;
            }
            let lower = pattern.to_ascii_lowercase();
            if seen.contains(&lower) {
                p.at(at, format!("{key}: content type {pattern} is given twice"));
                return false;
            }
            seen.push(lower);
            true
        };
    if let Some(table) = keys.headers_by_type {
        let at = table.span().start;
        let mut seen = Vec::new();
        for (pattern, fields) in table.get_ref() {
            if !pattern_ok("headers_by_type", pattern, &mut seen, at, p) {
                continue;
            }
            let mut list = Vec::new();
            for (name, value) in fields {
                if let Some(why) = bad_field_name(name, false) {
                    p.at(at, format!("headers_by_type: {pattern}: {name:?} {why}"));
                    continue;
                }
                if value
                    .bytes()
                    .any(|b| (b.is_ascii_control() && b != b'\t') || b == 0x7f)
                {
                    p.at(
                        at,
                        format!("headers_by_type: {pattern}: the value of {name} must not hold control characters"),
                    );
                    continue;
                }
                match tern_vhost::check_header_value(value) {
                    Ok(t) if t.as_literal().is_some() => list.push((name.clone(), value.clone())),
                    Ok(_) => p.at(
                        at,
                        format!("headers_by_type: {pattern}: {name}: values by content type are literal (no $variables; $$ is a $)"),
                    ),
                    Err(e) => p.at(at, format!("headers_by_type: {pattern}: {name}: {e}")),
                }
            }
            edits.by_type.push((pattern.clone(), list));
        }
    }
    if let Some(table) = keys.expires {
        let at = table.span().start;
        let mut seen = Vec::new();
        for (pattern, value) in table.get_ref() {
            if !pattern_ok("expires", pattern, &mut seen, at, p) {
                continue;
            }
            let rule = match value {
                ExpiresValue::Secs(n) => tern_vhost::parse_expires(&n.to_string()),
                ExpiresValue::Text(t) => tern_vhost::parse_expires(t),
            };
            match rule {
                Ok(rule) => edits.expires.push((pattern.clone(), rule)),
                Err(e) => p.at(at, format!("expires: {pattern}: {e}")),
            }
        }
    }
    edits
}

/// A pair of set/remove keys: names, values without control characters, variables known.
#[allow(clippy::type_complexity)]
pub(super) fn check_edits(
    (add_key, add): (&str, &Option<Spanned<BTreeMap<String, String>>>),
    (remove_key, remove): (&str, &Option<Spanned<Vec<String>>>),
    p: &mut Problems<'_>,
) -> (
    Vec<(String, String, tern_services::template::Template)>,
    Vec<String>,
) {
    let upstream = add_key == "add_request_headers";
    let mut set = Vec::new();
    let mut removed = Vec::new();
    if let Some(add) = add {
        for (name, value) in add.get_ref() {
            if let Some(why) = bad_field_name(name, upstream) {
                p.at(add.span().start, format!("{add_key}: {name:?} {why}"));
            } else if value
                .bytes()
                .any(|b| (b.is_ascii_control() && b != b'\t') || b == 0x7f)
            {
                p.at(
                    add.span().start,
                    format!("{add_key}: the value of {name} must not hold control characters"),
                );
            } else {
                match tern_vhost::check_header_value(value) {
                    Ok(t) => set.push((name.clone(), value.clone(), t)),
                    Err(e) => p.at(add.span().start, format!("{add_key}: {name}: {e}")),
                }
            }
        }
    }
    if let Some(remove) = remove {
        for name in remove.get_ref() {
            match bad_field_name(name, upstream) {
                Some(why) => p.at(remove.span().start, format!("{remove_key}: {name:?} {why}")),
                None => removed.push(name.clone()),
            }
        }
    }
    (set, removed)
}

/// Why a route may not edit this field (`upstream`: of the request an app gets).
fn bad_field_name(name: &str, upstream: bool) -> Option<&'static str> {
    if !tern_server::is_token(name.as_bytes()) {
        return Some("is not a header name");
    }
    let lower = name.to_ascii_lowercase();
    if upstream && lower == "host" {
        return Some("is set with proxy_host");
    }
    if upstream && lower.contains('_') {
        return Some(
            "has an underscore, which CGI-style apps read as a dash (tern drops such names)",
        );
    }
    CONNECTION_FIELDS
        .contains(&lower.as_str())
        .then_some("is written by the connection, not by a route")
}

#[cfg(test)]
mod tests {
    use super::super::{
        parse,
        testing::{dir, problems},
    };

    #[test]
    fn header_keys_of_sites_and_routes_become_a_plan_or_are_refused() {
        let good = r#"[[site]]
name = "a"
default = true
add_headers = { X-Frame-Options = "DENY" }
remove_headers = ["X-Powered-By"]
headers_by_type = { "text/html" = { Content-Security-Policy = "default-src 'self'" } }
expires = { "text/html" = "epoch", "image/*" = "30d", "font/woff2" = 3600, "*" = "off" }
[[site.route]]
path = "/"
static = "site"
expires = { "image/svg+xml" = "max" }
"#;
        let d = dir();
        let c = parse(good, d.path()).unwrap();
        let site = &c.sites[0].headers;
        assert_eq!(site.set, [("X-Frame-Options".into(), "DENY".into())]);
        assert_eq!(site.remove, ["X-Powered-By"]);
        assert_eq!(site.by_type[0].0, "text/html");
        let rules: Vec<(&str, tern_vhost::Expires)> =
            site.expires.iter().map(|(p, e)| (p.as_str(), *e)).collect();
        assert_eq!(
            rules,
            [
                ("*", tern_vhost::Expires::Off),
                ("font/woff2", tern_vhost::Expires::After(3600)),
                ("image/*", tern_vhost::Expires::After(30 * 86_400)),
                ("text/html", tern_vhost::Expires::Epoch),
            ]
        );
        assert_eq!(
            c.sites[0].routes[0].headers.expires,
            [("image/svg+xml".into(), tern_vhost::Expires::Max)]
        );
        let bad = r#"[[site]]
name = "a"
default = true
add_headers = { X-Id = "$request_id", Date = "x" }
headers_by_type = { "text" = { X = "1" }, "text/html" = { X-Host = "$host", Server = "x" } }
expires = { "image/*" = "1d", "Image/*" = "2d", "text/css" = "20y", "text/js" = "forever" }
[[site.route]]
path = "/"
static = "site"
expires = { "text/html; charset=utf-8" = "max" }
headers_by_type = { "*" = { X-Ok = "1" }, "*/*" = { X = "1" } }
"#;
        let e = problems(bad);
        let want = [
            "line 4: add_headers: \"Date\" is written by the connection",
            "line 4: add_headers: $request_id needs request_id = true",
            "line 5: headers_by_type: content type \"text\": give \"type/subtype\"",
            "line 5: headers_by_type: text/html: X-Host: values by content type are literal",
            "line 5: headers_by_type: text/html: \"Server\" is written by the connection",
            "line 6: expires: content type image/* is given twice",
            "line 6: expires: text/js: expires \"forever\": give \"off\"",
            "line 6: expires: text/css: expires \"20y\" is longer than ten years",
            "line 10: expires: content type \"text/html; charset=utf-8\": give",
            "line 11: headers_by_type: content type \"*/*\": give",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }
}
