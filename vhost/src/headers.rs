//! Header edits on answers: fields set or removed on every answer whatever its status (tern's
//! own refusals and errors too, as nginx's `add_header ... always`), fields chosen by the
//! answer's content type (nginx's `map $sent_http_content_type`), and `Expires` with
//! `Cache-Control` by content type (nginx's `expires`, on the statuses nginx gives it to).
//! A site has edits of its own; each route's are its site's with the route's over them.

use std::sync::Arc;

use tern_server::upstream::ResponseEdit;
use tern_server::Response;
use tern_services::template::{Template, Values, HEADER_VARS};

/// Headers set on (replacing any of the same name) or removed from answers. `set` values may
/// hold `$client`, `$scheme`, `$host`, `$request_id`; the values by type are literal.
#[derive(Debug, Default, Clone)]
pub struct HeaderEdits {
    /// `(name, value)`, in order.
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
    /// Fields set on answers of a content type: `(type pattern, [(name, value)])`; for an
    /// answer the most specific pattern that matches wins (`text/html`, then `text/*`,
    /// then `*`).
    pub by_type: Vec<(String, Vec<(String, String)>)>,
    /// `Expires` and `Cache-Control` by content type (the most specific pattern wins).
    pub expires: Vec<(String, Expires)>,
}

/// An `expires` rule, as nginx's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expires {
    /// Leave the answer's own fields (a narrower type's way out of a wider rule).
    Off,
    /// `Expires` in 1970, `Cache-Control: no-cache`.
    Epoch,
    /// `Expires` in 2037, `Cache-Control: max-age=315360000` (ten years).
    Max,
    /// `Expires` this many seconds after the answer, `Cache-Control: max-age=N`.
    After(u64),
}

/// The statuses `expires` applies to (nginx's list): errors are never made cacheable.
const EXPIRES_STATUSES: [u16; 10] = [200, 201, 204, 206, 301, 302, 303, 304, 307, 308];
const EPOCH_LINES: &[u8] = b"Expires: Thu, 01 Jan 1970 00:00:01 GMT\r\nCache-Control: no-cache\r\n";
const MAX_LINES: &[u8] =
    b"Expires: Thu, 31 Dec 2037 23:55:55 GMT\r\nCache-Control: max-age=315360000\r\n";
/// The longest `expires` duration (ten years, `max`'s).
const MAX_EXPIRES_SECS: u64 = 315_360_000;

/// Reads an `expires` value: `off`, `epoch`, `max`, or a duration: a number of seconds, or a
/// number followed by `s`, `m` (minutes), `h`, `d`, `w`, `M` (30 days) or `y` (365 days), as
/// nginx counts them; at most ten years.
pub fn parse_expires(text: &str) -> Result<Expires, String> {
    let t = text.trim();
    match t {
        "off" => return Ok(Expires::Off),
        "epoch" => return Ok(Expires::Epoch),
        "max" => return Ok(Expires::Max),
        _ => {}
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let unit = match &t[digits..] {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        "M" => 30 * 86_400,
        "y" => 365 * 86_400,
        _ => 0,
    };
    let secs = t[..digits]
        .parse::<u64>()
        .ok()
        .filter(|_| unit != 0)
        .and_then(|n| n.checked_mul(unit));
    match secs {
        Some(s) if s <= MAX_EXPIRES_SECS => Ok(Expires::After(s)),
        Some(_) => Err(format!(
            "expires {text:?} is longer than ten years (use \"max\")"
        )),
        None => Err(format!(
            "expires {text:?}: give \"off\", \"epoch\", \"max\" or a duration (\"3600\", \"30m\", \"12h\", \"7d\", \"1M\", \"1y\")"
        )),
    }
}

/// A content-type pattern: `*`, `type/*` or `type/subtype`, compared without parameters and
/// case-insensitively.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TypePattern {
    Any,
    /// The part before the `/` (`image`).
    Family(String),
    Exact(String),
}

/// Checks a content-type pattern.
pub fn check_type_pattern(pattern: &str) -> Result<(), String> {
    TypePattern::parse(pattern).map(|_| ())
}

impl TypePattern {
    fn parse(text: &str) -> Result<TypePattern, String> {
        if text == "*" {
            return Ok(TypePattern::Any);
        }
        let bad = || {
            format!(
                "content type {text:?}: give \"type/subtype\", \"type/*\" or \"*\" (no parameters)"
            )
        };
        let (family, sub) = text.split_once('/').ok_or_else(bad)?;
        if !tern_server::is_token(family.as_bytes()) || family.contains('*') {
            return Err(bad());
        }
        if sub == "*" {
            return Ok(TypePattern::Family(family.to_ascii_lowercase()));
        }
        if !tern_server::is_token(sub.as_bytes()) || sub.contains('*') {
            return Err(bad());
        }
        Ok(TypePattern::Exact(text.to_ascii_lowercase()))
    }

    /// Higher is narrower: the narrowest pattern that matches wins.
    fn rank(&self) -> u8 {
        match self {
            TypePattern::Exact(_) => 2,
            TypePattern::Family(_) => 1,
            TypePattern::Any => 0,
        }
    }

    /// `media`: the answer's media type, without parameters (maybe empty: no Content-Type).
    fn matches(&self, media: &[u8]) -> bool {
        match self {
            TypePattern::Any => true,
            TypePattern::Exact(t) => media.eq_ignore_ascii_case(t.as_bytes()),
            TypePattern::Family(f) => {
                media.len() > f.len()
                    && media[f.len()] == b'/'
                    && media[..f.len()].eq_ignore_ascii_case(f.as_bytes())
            }
        }
    }
}

fn same_name(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

impl HeaderEdits {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.remove.is_empty()
            && self.by_type.is_empty()
            && self.expires.is_empty()
    }

    /// These edits (a route's) over `site`'s: the site's fields the route neither sets nor
    /// removes, then the route's; by type, the route's fields over the site's for the same
    /// pattern; `expires` per pattern the route's where it names one.
    pub fn over(&self, site: &HeaderEdits) -> HeaderEdits {
        let mine = |name: &str| {
            self.set.iter().any(|(n, _)| same_name(n, name))
                || self.remove.iter().any(|n| same_name(n, name))
        };
        let mut set: Vec<(String, String)> =
            site.set.iter().filter(|(n, _)| !mine(n)).cloned().collect();
        set.extend(self.set.iter().cloned());
        let mut remove: Vec<String> = site
            .remove
            .iter()
            .filter(|n| !self.set.iter().any(|(s, _)| same_name(s, n)))
            .cloned()
            .collect();
        remove.extend(self.remove.iter().cloned());
        let mut by_type: Vec<(String, Vec<(String, String)>)> = Vec::new();
        for (pattern, fields) in &site.by_type {
            let own = self
                .by_type
                .iter()
                .find(|(p, _)| same_name(p, pattern))
                .map(|(_, f)| f.as_slice())
                .unwrap_or_default();
            let mut merged: Vec<(String, String)> = fields
                .iter()
                .filter(|(n, _)| !own.iter().any(|(o, _)| same_name(o, n)))
                .cloned()
                .collect();
            merged.extend(own.iter().cloned());
            by_type.push((pattern.clone(), merged));
        }
        for (pattern, fields) in &self.by_type {
            if !by_type.iter().any(|(p, _)| same_name(p, pattern)) {
                by_type.push((pattern.clone(), fields.clone()));
            }
        }
        let mut expires: Vec<(String, Expires)> = site
            .expires
            .iter()
            .filter(|(p, _)| !self.expires.iter().any(|(o, _)| same_name(o, p)))
            .cloned()
            .collect();
        expires.extend(self.expires.iter().cloned());
        HeaderEdits {
            set,
            remove,
            by_type,
            expires,
        }
    }
}

/// Checks a header value's variables (answers and requests alike).
pub fn check_header_value(value: &str) -> Result<Template, String> {
    Template::parse(value, HEADER_VARS, 0)
}

/// Edits by content type, each list narrowest pattern first.
struct Typed {
    /// Pattern, names to drop, `Name: value\r\n` lines.
    fields: Vec<(TypePattern, Vec<String>, Vec<u8>)>,
    expires: Vec<(TypePattern, Expires)>,
}

impl Typed {
    fn apply(&self, r: &mut Response, unix_secs: impl FnOnce() -> u64) {
        let (fields, rule) = {
            let media = media_type(r.header("content-type").unwrap_or_default());
            let fields = self.fields.iter().find(|(p, _, _)| p.matches(media));
            let rule = EXPIRES_STATUSES
                .contains(&r.status)
                .then(|| self.expires.iter().find(|(p, _)| p.matches(media)))
                .flatten();
            (fields, rule.map(|(_, rule)| *rule))
        };
        if let Some((_, drop, lines)) = fields {
            for name in drop {
                r.remove_header(name);
            }
            r.push_raw_headers(lines);
        }
        let lines: std::borrow::Cow<'_, [u8]> = match rule {
            None | Some(Expires::Off) => return,
            Some(Expires::Epoch) => EPOCH_LINES.into(),
            Some(Expires::Max) => MAX_LINES.into(),
            Some(Expires::After(secs)) => {
                let when =
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs() + secs);
                format!(
                    "Expires: {}\r\nCache-Control: max-age={secs}\r\n",
                    httpdate::fmt_http_date(when)
                )
                .into_bytes()
                .into()
            }
        };
        r.remove_header("expires");
        r.remove_header("cache-control");
        r.push_raw_headers(&lines);
    }
}

/// A Content-Type value's media type: before any parameter, trimmed.
fn media_type(value: &[u8]) -> &[u8] {
    let end = memchr::memchr(b';', value).unwrap_or(value.len());
    tern_server::trim_ows(&value[..end])
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Literal edits, the part applied the same way to every answer.
struct Literal {
    /// Names to drop before the set lines are added (the removed ones and the set ones).
    drop: Vec<String>,
    /// `Name: value\r\n` lines without variables, serialised once.
    lines: Vec<u8>,
    typed: Option<Typed>,
}

impl Literal {
    fn apply(&self, r: &mut Response, extra_lines: &[u8], unix_secs: impl FnOnce() -> u64) {
        for name in &self.drop {
            r.remove_header(name);
        }
        r.push_raw_headers(&self.lines);
        r.push_raw_headers(extra_lines);
        if let Some(typed) = &self.typed {
            typed.apply(r, unix_secs);
        }
    }
}

/// Edits built once for the table: literal lines serialised, patterns parsed, values with
/// variables kept to render per answer.
pub(crate) struct BuiltEdits {
    literal: Arc<Literal>,
    /// Values with variables, rendered per answer.
    templates: Vec<(String, Template)>,
    /// The literal edits for a forwarded answer, whose head the relay builds later; `None`
    /// when there is nothing to do.
    forward: Option<ResponseEdit>,
}

impl BuiltEdits {
    pub(crate) fn new(edits: &HeaderEdits) -> Result<BuiltEdits, String> {
        let mut drop = edits.remove.clone();
        let mut lines = Vec::new();
        let mut templates = Vec::new();
        for (name, value) in &edits.set {
            drop.push(name.clone());
            let t = check_header_value(value).map_err(|e| format!("header {name}: {e}"))?;
            match t.as_literal() {
                Some(text) => lines.extend_from_slice(format!("{name}: {text}\r\n").as_bytes()),
                None => templates.push((name.clone(), t)),
            }
        }
        let mut fields = Vec::new();
        for (pattern, list) in &edits.by_type {
            let p = TypePattern::parse(pattern)?;
            let mut drop = Vec::new();
            let mut lines = Vec::new();
            for (name, value) in list {
                let t = check_header_value(value)
                    .map_err(|e| format!("header {name} for {pattern}: {e}"))?;
                let Some(text) = t.as_literal() else {
                    return Err(format!(
                        "header {name} for {pattern}: values by content type are literal (no $variables)"
                    ));
                };
                drop.push(name.clone());
                lines.extend_from_slice(format!("{name}: {text}\r\n").as_bytes());
            }
            fields.push((p, drop, lines));
        }
        let mut expires = Vec::new();
        for (pattern, rule) in &edits.expires {
            expires.push((TypePattern::parse(pattern)?, *rule));
        }
        once_each(fields.iter().map(|f| &f.0))?;
        once_each(expires.iter().map(|e| &e.0))?;
        // Stable: among equals the order given, which the check above makes irrelevant.
        fields.sort_by_key(|f| std::cmp::Reverse(f.0.rank()));
        expires.sort_by_key(|e| std::cmp::Reverse(e.0.rank()));
        let typed =
            (!fields.is_empty() || !expires.is_empty()).then_some(Typed { fields, expires });
        let nothing = drop.is_empty() && lines.is_empty() && typed.is_none();
        let literal = Arc::new(Literal { drop, lines, typed });
        let forward = (!nothing).then(|| {
            let literal = literal.clone();
            let edit: ResponseEdit =
                Arc::new(move |r: &mut Response| literal.apply(r, &[], now_secs));
            edit
        });
        Ok(BuiltEdits {
            literal,
            templates,
            forward,
        })
    }

    /// Whether some edit holds a variable (rendered per answer).
    pub(crate) fn has_templates(&self) -> bool {
        !self.templates.is_empty()
    }

    /// Edits an answer made now; `unix_secs`: the request's clock.
    pub(crate) fn apply(&self, r: &mut Response, values: &Values<'_>, unix_secs: u64) {
        if self.templates.is_empty() {
            self.literal.apply(r, &[], || unix_secs);
        } else {
            self.literal.apply(r, &self.rendered(values), || unix_secs);
        }
    }

    /// The edit for a forwarded answer (applied by the relay to the upstream's head and to
    /// its own answers): shared when literal, made for this request when a value holds a
    /// variable (the relay has no request to render it from).
    pub(crate) fn forward_edit(&self, values: &Values<'_>) -> Option<ResponseEdit> {
        if self.templates.is_empty() {
            return self.forward.clone();
        }
        let (literal, extra) = (self.literal.clone(), self.rendered(values));
        Some(Arc::new(move |r: &mut Response| {
            literal.apply(r, &extra, now_secs)
        }))
    }

    fn rendered(&self, values: &Values<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, t) in &self.templates {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            t.render(&mut out, values);
            out.extend_from_slice(b"\r\n");
        }
        out
    }
}

/// Two spellings of one content type in one list would leave the choice to their order.
fn once_each<'p>(patterns: impl Iterator<Item = &'p TypePattern>) -> Result<(), String> {
    let mut seen: Vec<&TypePattern> = Vec::new();
    for p in patterns {
        if seen.contains(&p) {
            let name = match p {
                TypePattern::Any => "*".to_string(),
                TypePattern::Family(f) => format!("{f}/*"),
                TypePattern::Exact(t) => t.clone(),
            };
            return Err(format!("content type {name} is given twice"));
        }
        seen.push(p);
    }
    Ok(())
}

/// `first` then `then` (either may be absent).
pub(crate) fn chain(
    first: Option<&ResponseEdit>,
    then: Option<ResponseEdit>,
) -> Option<ResponseEdit> {
    match (first, then) {
        (None, then) => then,
        (Some(f), None) => Some(f.clone()),
        (Some(f), Some(t)) => {
            let f = f.clone();
            Some(Arc::new(move |r: &mut Response| {
                f(r);
                t(r);
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, content_type: &str) -> Response {
        let mut r = Response::new(status);
        if !content_type.is_empty() {
            r.push_header("Content-Type", content_type.as_bytes());
        }
        r.push_header("Cache-Control", b"private");
        r
    }

    fn text(r: &Response) -> String {
        String::from_utf8_lossy(r.headers()).into_owned()
    }

    fn built(edits: &HeaderEdits) -> BuiltEdits {
        BuiltEdits::new(edits).unwrap()
    }

    fn values() -> Values<'static> {
        Values {
            client: std::net::Ipv4Addr::LOCALHOST.into(),
            secure: true,
            host: b"example.org",
            request_id: None,
            uri: "/",
            captures: &[],
        }
    }

    #[test]
    fn expires_values_are_read_as_nginx_writes_them() {
        assert_eq!(parse_expires("off"), Ok(Expires::Off));
        assert_eq!(parse_expires("epoch"), Ok(Expires::Epoch));
        assert_eq!(parse_expires("max"), Ok(Expires::Max));
        assert_eq!(parse_expires("3600"), Ok(Expires::After(3600)));
        assert_eq!(parse_expires("30m"), Ok(Expires::After(1800)));
        assert_eq!(parse_expires("7d"), Ok(Expires::After(604_800)));
        assert_eq!(parse_expires("1y"), Ok(Expires::After(31_536_000)));
        assert_eq!(parse_expires("1M"), Ok(Expires::After(2_592_000)));
        for bad in ["", "d", "7x", "-1", "1.5h", "11y", "99999999999999999999"] {
            assert!(parse_expires(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_narrowest_type_wins_and_expires_skips_errors() {
        let edits = HeaderEdits {
            by_type: vec![
                ("*".into(), vec![("X-Any".into(), "1".into())]),
                ("text/*".into(), vec![("X-Text".into(), "1".into())]),
                ("text/html".into(), vec![("X-Html".into(), "1".into())]),
            ],
            expires: vec![
                ("image/*".into(), Expires::Max),
                ("text/html".into(), Expires::Epoch),
                ("text/css".into(), Expires::After(60)),
                ("image/svg+xml".into(), Expires::Off),
            ],
            ..Default::default()
        };
        let b = built(&edits);
        let edited = |status: u16, ct: &str| {
            let mut r = answer(status, ct);
            b.apply(&mut r, &values(), 784_111_777);
            text(&r)
        };
        let html = edited(200, "Text/HTML; charset=utf-8");
        assert!(
            html.contains("X-Html: 1\r\n") && !html.contains("X-Text"),
            "{html}"
        );
        assert!(
            html.contains("Expires: Thu, 01 Jan 1970 00:00:01 GMT\r\nCache-Control: no-cache\r\n")
                && !html.contains("private"),
            "{html}"
        );
        let css = edited(304, "text/css");
        assert!(css.contains("X-Text: 1\r\n"), "{css}");
        assert!(
            css.contains("Expires: Sun, 06 Nov 1994 08:50:37 GMT\r\nCache-Control: max-age=60\r\n"),
            "{css}"
        );
        let png = edited(200, "image/png");
        assert!(
            png.contains("X-Any: 1\r\nExpires: Thu, 31 Dec 2037"),
            "{png}"
        );
        let svg = edited(200, "image/svg+xml");
        assert!(
            svg.contains("Cache-Control: private") && !svg.contains("Expires"),
            "{svg}"
        );
        let missing = edited(404, "text/html");
        assert!(
            missing.contains("X-Html: 1")
                && missing.contains("Cache-Control: private")
                && !missing.contains("Expires"),
            "an error is never made cacheable: {missing}"
        );
        assert!(edited(200, "").contains("X-Any: 1"), "no type: only *");
        assert!(
            !edited(200, "textual/x").contains("X-Text"),
            "text/* is not textual/*"
        );
    }

    #[test]
    fn a_route_s_edits_go_over_its_site_s() {
        let site = HeaderEdits {
            set: vec![
                ("X-Frame-Options".into(), "DENY".into()),
                ("Referrer-Policy".into(), "no-referrer".into()),
                ("X-Robots-Tag".into(), "noindex".into()),
            ],
            remove: vec!["X-Powered-By".into(), "Server-Timing".into()],
            by_type: vec![(
                "text/html".into(),
                vec![
                    (
                        "Content-Security-Policy".into(),
                        "default-src 'self'".into(),
                    ),
                    ("X-A".into(), "site".into()),
                ],
            )],
            expires: vec![
                ("image/*".into(), Expires::Max),
                ("text/css".into(), Expires::Max),
            ],
        };
        let route = HeaderEdits {
            set: vec![
                ("x-frame-options".into(), "SAMEORIGIN".into()),
                ("Server-Timing".into(), "app".into()),
            ],
            remove: vec!["x-robots-tag".into()],
            by_type: vec![("text/html".into(), vec![("x-a".into(), "route".into())])],
            expires: vec![("image/*".into(), Expires::Off)],
        };
        let m = route.over(&site);
        assert_eq!(
            m.set,
            [
                ("Referrer-Policy".to_string(), "no-referrer".to_string()),
                ("x-frame-options".into(), "SAMEORIGIN".into()),
                ("Server-Timing".into(), "app".into()),
            ]
        );
        assert_eq!(m.remove, ["X-Powered-By", "x-robots-tag"]);
        assert_eq!(
            m.by_type[0].1,
            [
                (
                    "Content-Security-Policy".to_string(),
                    "default-src 'self'".to_string()
                ),
                ("x-a".into(), "route".into()),
            ]
        );
        assert_eq!(
            m.expires,
            [
                ("text/css".to_string(), Expires::Max),
                ("image/*".into(), Expires::Off)
            ]
        );
        let mut r = answer(200, "text/html");
        r.push_header("X-Powered-By", b"PHP");
        r.push_header("X-Robots-Tag", b"all");
        built(&m).apply(&mut r, &values(), 0);
        let t = text(&r);
        for (want, yes) in [
            ("X-Powered-By", false),
            ("X-Robots-Tag", false),
            ("Referrer-Policy: no-referrer\r\n", true),
            ("x-frame-options: SAMEORIGIN\r\n", true),
            ("x-a: route\r\n", true),
            ("X-A: site", false),
        ] {
            assert_eq!(t.contains(want), yes, "{want}: {t}");
        }
    }

    #[test]
    fn bad_patterns_and_variables_by_type_are_refused() {
        for (pattern, value, want) in [
            ("text", "x", "give \"type/subtype\""),
            ("*/html", "x", "give \"type/subtype\""),
            ("text/ht*", "x", "give \"type/subtype\""),
            ("text/html; charset=utf-8", "x", "give \"type/subtype\""),
            ("text/html", "$host", "literal"),
        ] {
            let edits = HeaderEdits {
                by_type: vec![(pattern.into(), vec![("X".into(), value.into())])],
                ..Default::default()
            };
            let e = BuiltEdits::new(&edits).err().unwrap();
            assert!(e.contains(want), "{pattern} {value}: {e}");
        }
        let twice = HeaderEdits {
            expires: vec![
                ("Text/HTML".into(), Expires::Max),
                ("text/html".into(), Expires::Off),
            ],
            ..Default::default()
        };
        assert!(BuiltEdits::new(&twice).err().unwrap().contains("twice"));
    }
}
