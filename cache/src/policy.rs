//! The rules of a shared cache (RFC 9111), on heads: whether a request may be answered from
//! the cache (or must go to the app untouched), whether an answer may be stored and for how
//! long, and how old a stored answer is. Pure: fields in, verdicts out, no clock of its own.
//!
//! tern's stance is Varnish's, not nginx's: a request that carries credentials (a gate
//! identity, `Authorization`, a cookie the route does not list as harmless) bypasses the
//! cache both ways; an answer is stored only when it says how long it stays fresh (or the
//! route gives a lifetime for its status), never with `Set-Cookie`, `private`, `no-store`,
//! `no-cache`, `Vary: *` or a range, and heuristic freshness (RFC 9111 §4.2.2) is never used.
//! Error answers other than 404/410 are never stored (CPDoS: an error one client provoked
//! must not be served to the others).

/// A header field as a name and a value (one line; a repeated field is several).
pub type Field<'a> = (&'a str, &'a [u8]);

/// The values of every `name` line, in order.
pub fn values<'a>(fields: &'a [Field<'a>], name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    fields
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| *v)
}

fn has(fields: &[Field<'_>], name: &str) -> bool {
    fields.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// Which part of the query enters the key (and so reaches the app: a parameter left out of
/// the key is also left out of the request a fill sends, or it would be an unkeyed input).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeyQuery {
    /// The query as it came.
    #[default]
    All,
    /// No query: `/p?x=1` and `/p` are one entry, and the app sees `/p`.
    None,
    /// The parameters sorted, so `?a=1&b=2` and `?b=2&a=1` are one entry.
    Sorted,
    /// Only these parameters (by name, in the order they came).
    Only(Vec<String>),
}

/// A cookie name, or a prefix when it ends in `*` (`wordpress_logged_in_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookiePattern(String);

impl CookiePattern {
    pub fn new(pattern: &str) -> CookiePattern {
        CookiePattern(pattern.to_owned())
    }

    pub fn matches(&self, name: &[u8]) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix.as_bytes()),
            None => name == self.0.as_bytes(),
        }
    }
}

/// Which cookies send a request past the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CookieRule {
    /// Any cookie but these (analytics cookies the app never reads).
    AllBut(Vec<CookiePattern>),
    /// Only these (a session cookie): other cookies are not sent to the app on a cached
    /// request either, since they are not in the key.
    Only(Vec<CookiePattern>),
}

impl Default for CookieRule {
    fn default() -> Self {
        CookieRule::AllBut(Vec::new())
    }
}

impl CookieRule {
    /// Whether a `Cookie` field's value holds a cookie that bypasses the cache.
    pub fn bypasses(&self, cookie: &[u8]) -> bool {
        cookie.split(|&b| b == b';').any(|crumb| {
            let name = crumb.split(|&b| b == b'=').next().unwrap_or_default();
            let name = name.trim_ascii();
            if name.is_empty() {
                return false;
            }
            match self {
                CookieRule::AllBut(harmless) => !harmless.iter().any(|p| p.matches(name)),
                CookieRule::Only(listed) => listed.iter().any(|p| p.matches(name)),
            }
        })
    }
}

/// A route's cache rules (its config, checked by `tern run --check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub key_query: KeyQuery,
    /// Request fields that enter the key (lower case); the only client fields a fill sends.
    pub key_headers: Vec<String>,
    /// Lifetimes (seconds) by status for answers that give none (nginx's
    /// `proxy_cache_valid`); never for a status that is not storable.
    pub valid: Vec<(u16, u64)>,
    pub cookies: CookieRule,
    /// RFC 9111 §3.5: requests with `Authorization` may be answered from and fill the cache
    /// (the answer must still say `public`, `s-maxage` or `must-revalidate`). Off: they
    /// bypass it.
    pub cache_authorized: bool,
    /// The largest body stored (bytes).
    pub max_object: u64,
    /// Seconds past its lifetime an entry may still answer while one request refreshes it
    /// (nginx's `proxy_cache_use_stale updating`, bounded), and when the app fails (`error
    /// timeout http_5xx`); an answer's own RFC 5861 `stale-while-revalidate` and
    /// `stale-if-error` may give longer. Never for an answer that says `must-revalidate`,
    /// `proxy-revalidate` or `s-maxage` (§4.2.4).
    pub stale_while_updating: u64,
    pub stale_if_error: u64,
    /// The route's `valid` lifetimes replace what the answer says of its own (nginx's
    /// `proxy_ignore_headers Cache-Control Expires`): its `Cache-Control` (`no-store`,
    /// `private` and `no-cache` included) and `Expires` are not read. `Set-Cookie`, `Vary: *`,
    /// ranges, credentials and sizes still keep an answer out.
    pub override_headers: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            key_query: KeyQuery::All,
            key_headers: Vec::new(),
            valid: Vec::new(),
            cookies: CookieRule::default(),
            cache_authorized: false,
            max_object: 1 << 20,
            stale_while_updating: 0,
            stale_if_error: 0,
            override_headers: false,
        }
    }
}

/// What the cache makes of a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodClass {
    /// GET and HEAD: answered from one entry (a HEAD gets the GET's head).
    Read,
    /// POST, PUT, DELETE, PATCH: a success invalidates the target (RFC 9111 §4.4).
    Unsafe,
    /// Anything else (OPTIONS...): neither looked up nor stored.
    Other,
}

/// What the handler knows of a request when it decides.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub method: MethodClass,
    pub fields: &'a [Field<'a>],
    /// It has a body (a GET with a body is a "fat GET": never cached).
    pub has_body: bool,
    /// A guard in front let it through as someone.
    pub identity: bool,
}

/// Why a request went past the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    Method,
    Body,
    Authorization,
    Identity,
    Cookie,
    /// A protocol switch (a WebSocket handshake): its answer is the app's to that
    /// handshake, never a page, and its key fields are ones the key does not hold.
    Upgrade,
}

impl Bypass {
    pub const ALL: [Bypass; 6] = [
        Bypass::Method,
        Bypass::Body,
        Bypass::Authorization,
        Bypass::Identity,
        Bypass::Cookie,
        Bypass::Upgrade,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bypass::Method => "method",
            Bypass::Body => "body",
            Bypass::Authorization => "authorization",
            Bypass::Identity => "identity",
            Bypass::Cookie => "cookie",
            Bypass::Upgrade => "upgrade",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestVerdict {
    /// Look it up; on a miss the answer may fill the entry.
    Lookup,
    /// Straight to the app, as if the route had no cache, and nothing stored.
    Bypass(Bypass),
    /// An unsafe method: to the app as usual; its success invalidates the target.
    Invalidate,
}

/// Whether a request may be answered from (and fill) the cache.
pub fn judge_request(rules: &Rules, req: &RequestFacts<'_>) -> RequestVerdict {
    match req.method {
        MethodClass::Read => {}
        MethodClass::Unsafe => return RequestVerdict::Invalidate,
        MethodClass::Other => return RequestVerdict::Bypass(Bypass::Method),
    }
    if req.has_body {
        return RequestVerdict::Bypass(Bypass::Body);
    }
    if has(req.fields, "upgrade") {
        return RequestVerdict::Bypass(Bypass::Upgrade);
    }
    // The gate's identity reaches the app as X-Auth-User: a page made for one account.
    if req.identity {
        return RequestVerdict::Bypass(Bypass::Identity);
    }
    if !rules.cache_authorized && has(req.fields, "authorization") {
        return RequestVerdict::Bypass(Bypass::Authorization);
    }
    if values(req.fields, "cookie").any(|c| rules.cookies.bypasses(c)) {
        return RequestVerdict::Bypass(Bypass::Cookie);
    }
    RequestVerdict::Lookup
}

/// Why an answer was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uncacheable {
    /// A status never stored (errors but 404/410, 206, 304, interim) or one stored only
    /// with explicit freshness that it lacked.
    Status,
    NoStore,
    Private,
    /// `no-cache`: every reuse would need a revalidation first.
    NoCache,
    SetCookie,
    VaryStar,
    /// `Content-Range`: part of a representation.
    Partial,
    /// No lifetime of its own and none configured for its status, or stale already.
    NoFreshness,
    /// Over the route's largest object.
    TooLarge,
    /// An answer to a request with `Authorization` without `public`, `s-maxage` or
    /// `must-revalidate` (RFC 9111 §3.5).
    Authorization,
}

impl Uncacheable {
    pub const ALL: [Uncacheable; 10] = [
        Uncacheable::Status,
        Uncacheable::NoStore,
        Uncacheable::Private,
        Uncacheable::NoCache,
        Uncacheable::SetCookie,
        Uncacheable::VaryStar,
        Uncacheable::Partial,
        Uncacheable::NoFreshness,
        Uncacheable::TooLarge,
        Uncacheable::Authorization,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Uncacheable::Status => "status",
            Uncacheable::NoStore => "no_store",
            Uncacheable::Private => "private",
            Uncacheable::NoCache => "no_cache",
            Uncacheable::SetCookie => "set_cookie",
            Uncacheable::VaryStar => "vary_star",
            Uncacheable::Partial => "partial",
            Uncacheable::NoFreshness => "no_freshness",
            Uncacheable::TooLarge => "too_large",
            Uncacheable::Authorization => "authorization",
        }
    }
}

/// How long a stored answer stays fresh, and how old it was when it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Freshness lifetime, seconds (§4.2.1).
    pub lifetime: u64,
    /// Its age when it came (§4.2.3: the larger of its `Age` and `now − Date`).
    pub initial_age: u64,
    /// When it was stored (Unix seconds, the worker's clock).
    pub stored_at: u64,
    /// `must-revalidate`, `proxy-revalidate` or `s-maxage`: never served stale (§4.2.4).
    pub no_stale: bool,
    /// RFC 5861's `stale-while-revalidate` and `stale-if-error`, seconds.
    pub stale_while_revalidate: u64,
    pub stale_if_error: u64,
}

impl Freshness {
    /// Its current age (§4.2.3), what `Age` says on a hit.
    pub fn age(&self, now: u64) -> u64 {
        self.initial_age + now.saturating_sub(self.stored_at)
    }

    pub fn is_fresh(&self, now: u64) -> bool {
        self.age(now) < self.lifetime
    }

    /// Seconds past its lifetime (0 while fresh).
    pub fn staleness(&self, now: u64) -> u64 {
        self.age(now).saturating_sub(self.lifetime)
    }

    /// Stale, but still to be served while one request refreshes it (the route's window or
    /// the answer's `stale-while-revalidate`, whichever is longer).
    pub fn serves_while_updating(&self, rules: &Rules, now: u64) -> bool {
        let window = rules.stale_while_updating.max(self.stale_while_revalidate);
        window > 0 && !self.no_stale && !self.is_fresh(now) && self.staleness(now) <= window
    }

    /// Stale, but still to be served when the app fails.
    pub fn serves_on_error(&self, rules: &Rules, now: u64) -> bool {
        let window = rules.stale_if_error.max(self.stale_if_error);
        window > 0 && !self.no_stale && !self.is_fresh(now) && self.staleness(now) <= window
    }

    /// Worth keeping: fresh, or stale within a window it may still be served in.
    pub fn worth_keeping(&self, rules: &Rules, now: u64) -> bool {
        self.is_fresh(now)
            || self.serves_while_updating(rules, now)
            || self.serves_on_error(rules, now)
    }
}

/// Statuses stored when their lifetime comes from the answer or the route: the final
/// statuses RFC 9110 §15.1 calls heuristically cacheable, less the errors but 404 and 410,
/// and less 206 (only whole representations are stored).
const STORABLE: &[u16] = &[200, 203, 204, 300, 301, 308, 404, 410];
/// Stored only when the answer itself gives a lifetime.
const STORABLE_IF_EXPLICIT: &[u16] = &[302, 307];

/// The answer's `Cache-Control` directives a shared cache acts on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Directives {
    no_store: bool,
    no_cache: bool,
    private: bool,
    public: bool,
    must_revalidate: bool,
    proxy_revalidate: bool,
    /// `Some(None)`: present but invalid or repeated, so the answer counts as stale
    /// (§4.2.1, §1.2.2).
    max_age: Option<Option<u64>>,
    s_maxage: Option<Option<u64>>,
    stale_while_revalidate: u64,
    stale_if_error: u64,
}

fn parse_seconds(v: Option<&[u8]>) -> Option<u64> {
    let v = v?;
    let v = v
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
        .unwrap_or(v);
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Larger than any lifetime that matters (§1.2.2: at least 2^31 must be understood).
    Some(
        std::str::from_utf8(v)
            .ok()?
            .parse::<u64>()
            .unwrap_or(u64::MAX)
            .min(1 << 31),
    )
}

/// Splits a list on commas outside quoted strings.
fn split_list(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut quoted = false;
    let mut escaped = false;
    v.split(move |&b| {
        if escaped {
            escaped = false;
            return false;
        }
        match b {
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b',' if !quoted => return true,
            _ => {}
        }
        false
    })
    .map(<[u8]>::trim_ascii)
    .filter(|d| !d.is_empty())
}

fn directives(fields: &[Field<'_>]) -> Directives {
    let mut d = Directives::default();
    let once = |slot: &mut Option<Option<u64>>, v: Option<&[u8]>| {
        *slot = match slot {
            None => Some(parse_seconds(v)),
            Some(_) => Some(None),
        };
    };
    for value in values(fields, "cache-control") {
        for directive in split_list(value) {
            let (name, arg) = match directive.iter().position(|&b| b == b'=') {
                Some(i) => (
                    directive[..i].trim_ascii(),
                    Some(directive[i + 1..].trim_ascii()),
                ),
                None => (directive, None),
            };
            let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
            // `private="f"` and `no-cache="f"` (only the named fields are personal) are taken
            // whole: storing the rest would need the fields removed, which nobody relies on.
            if is("no-store") {
                d.no_store = true;
            } else if is("no-cache") {
                d.no_cache = true;
            } else if is("private") {
                d.private = true;
            } else if is("public") {
                d.public = true;
            } else if is("must-revalidate") {
                d.must_revalidate = true;
            } else if is("proxy-revalidate") {
                d.proxy_revalidate = true;
            } else if is("max-age") {
                once(&mut d.max_age, arg);
            } else if is("s-maxage") {
                once(&mut d.s_maxage, arg);
            } else if is("stale-while-revalidate") {
                d.stale_while_revalidate = parse_seconds(arg).unwrap_or(0);
            } else if is("stale-if-error") {
                d.stale_if_error = parse_seconds(arg).unwrap_or(0);
            }
        }
    }
    d
}

fn http_date(v: &[u8]) -> Option<u64> {
    let t = httpdate::parse_http_date(std::str::from_utf8(v).ok()?.trim()).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs())
}

/// The one value of a field that must appear once; None if absent, `Some(None)` if repeated.
fn single<'a>(fields: &'a [Field<'a>], name: &'a str) -> Option<Option<&'a [u8]>> {
    let mut it = values(fields, name);
    let first = it.next()?;
    Some(if it.next().is_some() {
        None
    } else {
        Some(first)
    })
}

/// The freshness lifetime the answer gives itself (§4.2.1): `s-maxage`, else `max-age`, else
/// `Expires − Date`. None: it gives none. `Some(0)`: stale at once (an invalid or repeated
/// value counts so).
fn explicit_lifetime(d: &Directives, fields: &[Field<'_>], now: u64) -> Option<u64> {
    if let Some(s) = d.s_maxage {
        return Some(s.unwrap_or(0));
    }
    if let Some(m) = d.max_age {
        return Some(m.unwrap_or(0));
    }
    let expires = single(fields, "expires")?;
    let Some(expires) = expires.and_then(http_date) else {
        return Some(0);
    };
    let date = single(fields, "date")
        .flatten()
        .and_then(http_date)
        .unwrap_or(now);
    Some(expires.saturating_sub(date))
}

/// What the handler knows of an answer when the relay passes it on.
#[derive(Debug, Clone, Copy)]
pub struct AnswerFacts<'a> {
    pub status: u16,
    /// The upstream's fields as the client would get them, before the route's own edits.
    pub fields: &'a [Field<'a>],
    /// Its declared length, if any (a chunked body is held to the limit as it comes).
    pub content_length: Option<u64>,
    /// The request carried `Authorization` (so the route lets such requests in).
    pub authorized: bool,
    /// Unix seconds, the worker's clock.
    pub now: u64,
}

/// Whether an answer may be stored, and its freshness if so.
pub fn judge_answer(rules: &Rules, answer: &AnswerFacts<'_>) -> Result<Freshness, Uncacheable> {
    let fields = answer.fields;
    let d = match rules.override_headers {
        true => Directives::default(),
        false => directives(fields),
    };
    if d.no_store {
        return Err(Uncacheable::NoStore);
    }
    if d.private {
        return Err(Uncacheable::Private);
    }
    if answer.status == 206 || has(fields, "content-range") {
        return Err(Uncacheable::Partial);
    }
    let explicit = match rules.override_headers {
        true => None,
        false => explicit_lifetime(&d, fields, answer.now),
    };
    let storable = STORABLE.contains(&answer.status)
        || STORABLE_IF_EXPLICIT.contains(&answer.status) && explicit.is_some();
    if !storable {
        return Err(Uncacheable::Status);
    }
    if d.no_cache {
        return Err(Uncacheable::NoCache);
    }
    if has(fields, "set-cookie") {
        return Err(Uncacheable::SetCookie);
    }
    if values(fields, "vary").any(|v| split_list(v).any(|n| n == b"*")) {
        return Err(Uncacheable::VaryStar);
    }
    if answer.authorized && !(d.public || d.s_maxage.is_some() || d.must_revalidate) {
        return Err(Uncacheable::Authorization);
    }
    if answer.content_length.is_some_and(|n| n > rules.max_object) {
        return Err(Uncacheable::TooLarge);
    }
    let lifetime = match explicit {
        Some(l) => l,
        // The route's lifetime for its status; never a heuristic one.
        None => rules
            .valid
            .iter()
            .find(|(s, _)| *s == answer.status)
            .map(|(_, l)| *l)
            .ok_or(Uncacheable::NoFreshness)?,
    };
    let age_field = single(fields, "age")
        .flatten()
        .and_then(|v| parse_seconds(Some(v.trim_ascii())))
        .unwrap_or(0);
    let apparent = single(fields, "date")
        .flatten()
        .and_then(http_date)
        .map_or(0, |date| answer.now.saturating_sub(date));
    let freshness = Freshness {
        lifetime,
        initial_age: age_field.max(apparent),
        stored_at: answer.now,
        no_stale: d.must_revalidate || d.proxy_revalidate || d.s_maxage.is_some(),
        stale_while_revalidate: d.stale_while_revalidate,
        stale_if_error: d.stale_if_error,
    };
    if !freshness.is_fresh(answer.now) {
        return Err(Uncacheable::NoFreshness);
    }
    Ok(freshness)
}

/// A success to an unsafe method invalidates its target (§4.4): a non-error status.
pub fn invalidates(status: u16) -> bool {
    (200..400).contains(&status)
}

/// The query as the key holds it and the app gets it on a cached request. None: no query.
pub fn keyed_query<'a>(
    rule: &KeyQuery,
    query: Option<&'a str>,
) -> Option<std::borrow::Cow<'a, str>> {
    use std::borrow::Cow;
    let q = query?;
    match rule {
        KeyQuery::All => Some(Cow::Borrowed(q)),
        KeyQuery::None => None,
        KeyQuery::Sorted => {
            let mut params: Vec<&str> = q.split('&').filter(|p| !p.is_empty()).collect();
            params.sort_unstable();
            (!params.is_empty()).then(|| Cow::Owned(params.join("&")))
        }
        KeyQuery::Only(names) => {
            let kept: Vec<&str> = q
                .split('&')
                .filter(|p| {
                    let name = p.split('=').next().unwrap_or_default();
                    names.iter().any(|n| n == name)
                })
                .collect();
            (!kept.is_empty()).then(|| Cow::Owned(kept.join("&")))
        }
    }
}

/// `If-None-Match` (a list, or `*`) names `etag`, by weak comparison (RFC 9110 §13.1.2).
pub fn none_match_hits(header: &[u8], etag: &[u8]) -> bool {
    let bare = |t: &[u8]| t.strip_prefix(b"W/").unwrap_or(t).to_vec();
    let etag = bare(etag.trim_ascii());
    split_list(header).any(|t| t == b"*" || bare(t) == etag)
}

/// `If-Modified-Since` is no earlier than the entry's `Last-Modified` (RFC 9110 §13.1.3).
pub fn not_modified_since(since: &[u8], last_modified: &[u8]) -> bool {
    match (http_date(since), http_date(last_modified)) {
        (Some(since), Some(lm)) => lm <= since,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn date(secs: u64) -> String {
        httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
    }

    fn answer(
        rules: &Rules,
        status: u16,
        fields: &[(&str, &str)],
    ) -> Result<Freshness, Uncacheable> {
        let fields: Vec<Field<'_>> = fields.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        judge_answer(
            rules,
            &AnswerFacts {
                status,
                fields: &fields,
                content_length: Some(10),
                authorized: false,
                now: NOW,
            },
        )
    }

    fn lifetime(status: u16, fields: &[(&str, &str)]) -> Result<u64, Uncacheable> {
        answer(&Rules::default(), status, fields).map(|f| f.lifetime)
    }

    fn request(rules: &Rules, method: MethodClass, fields: &[(&str, &str)]) -> RequestVerdict {
        let fields: Vec<Field<'_>> = fields.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        judge_request(
            rules,
            &RequestFacts {
                method,
                fields: &fields,
                has_body: false,
                identity: false,
            },
        )
    }

    #[test]
    fn s_maxage_wins_over_max_age_which_wins_over_expires() {
        let expires = date(NOW + 500);
        let now = date(NOW);
        let all = [
            ("Cache-Control", "max-age=60, s-maxage=120"),
            ("Expires", expires.as_str()),
            ("Date", now.as_str()),
        ];
        assert_eq!(lifetime(200, &all), Ok(120));
        assert_eq!(lifetime(200, &[("Cache-Control", "max-age=60")]), Ok(60));
        assert_eq!(
            lifetime(200, &[("Cache-Control", "max-age=60"), all[1], all[2]]),
            Ok(60)
        );
        assert_eq!(lifetime(200, &all[1..]), Ok(500));
        // Expires without Date counts from now.
        assert_eq!(lifetime(200, &all[1..2]), Ok(500));
    }

    #[test]
    fn invalid_or_repeated_lifetimes_count_as_stale() {
        for cc in [
            "max-age=abc",
            "max-age=",
            "max-age=-5",
            "max-age=5, max-age=10",
            "max-age=0",
        ] {
            assert_eq!(
                lifetime(200, &[("Cache-Control", cc)]),
                Err(Uncacheable::NoFreshness),
                "{cc}"
            );
        }
        assert_eq!(
            lifetime(200, &[("Expires", "0")]),
            Err(Uncacheable::NoFreshness)
        );
        let past = date(NOW - 10);
        assert_eq!(
            lifetime(200, &[("Expires", past.as_str())]),
            Err(Uncacheable::NoFreshness)
        );
        // Quoted seconds are tolerated (§5.2: senders must not, recipients should accept).
        assert_eq!(
            lifetime(200, &[("Cache-Control", "max-age=\"30\"")]),
            Ok(30)
        );
        assert_eq!(lifetime(200, &[("cache-control", "Max-Age=30")]), Ok(30));
    }

    #[test]
    fn heuristic_freshness_is_never_used() {
        let lm = date(NOW - 86_400 * 10);
        assert_eq!(
            lifetime(200, &[("Last-Modified", lm.as_str())]),
            Err(Uncacheable::NoFreshness)
        );
        // The route's lifetime for the status, when the answer gives none.
        let rules = Rules {
            valid: vec![(200, 600), (404, 60)],
            ..Rules::default()
        };
        assert_eq!(answer(&rules, 200, &[]).map(|f| f.lifetime), Ok(600));
        assert_eq!(answer(&rules, 404, &[]).map(|f| f.lifetime), Ok(60));
        assert_eq!(answer(&rules, 410, &[]), Err(Uncacheable::NoFreshness));
        // The answer's own word wins over the route's.
        assert_eq!(
            answer(&rules, 200, &[("Cache-Control", "max-age=5")]).map(|f| f.lifetime),
            Ok(5)
        );
    }

    #[test]
    fn never_stored() {
        let cc = |v| ("Cache-Control", v);
        let fresh = cc("max-age=60");
        assert_eq!(
            lifetime(200, &[cc("no-store, max-age=60")]),
            Err(Uncacheable::NoStore)
        );
        assert_eq!(
            lifetime(200, &[cc("private, max-age=60")]),
            Err(Uncacheable::Private)
        );
        assert_eq!(
            lifetime(200, &[cc("private=\"x\", max-age=60")]),
            Err(Uncacheable::Private)
        );
        assert_eq!(lifetime(200, &[cc("PRIVATE")]), Err(Uncacheable::Private));
        assert_eq!(
            lifetime(200, &[cc("no-cache, max-age=60")]),
            Err(Uncacheable::NoCache)
        );
        assert_eq!(
            lifetime(200, &[fresh, ("Set-Cookie", "s=1")]),
            Err(Uncacheable::SetCookie)
        );
        assert_eq!(
            lifetime(200, &[fresh, ("Vary", "Accept, *")]),
            Err(Uncacheable::VaryStar)
        );
        assert_eq!(lifetime(206, &[fresh]), Err(Uncacheable::Partial));
        assert_eq!(
            lifetime(200, &[fresh, ("Content-Range", "bytes 0-1/5")]),
            Err(Uncacheable::Partial)
        );
        // A directive inside a quoted string is not one.
        assert_eq!(
            lifetime(200, &[cc("max-age=60, ext=\"private, no-store\"")]),
            Ok(60)
        );
    }

    #[test]
    fn errors_are_not_stored_whatever_they_say() {
        for status in [
            400, 401, 403, 405, 413, 414, 431, 500, 501, 502, 503, 504, 304, 100,
        ] {
            assert_eq!(
                lifetime(status, &[("Cache-Control", "public, max-age=600")]),
                Err(Uncacheable::Status),
                "{status}"
            );
        }
        for status in [200, 203, 204, 300, 301, 308, 404, 410] {
            assert_eq!(
                lifetime(status, &[("Cache-Control", "max-age=6")]),
                Ok(6),
                "{status}"
            );
        }
        // 302/307 only with a lifetime of their own, never from the route's.
        assert_eq!(lifetime(302, &[("Cache-Control", "max-age=6")]), Ok(6));
        let rules = Rules {
            valid: vec![(302, 600)],
            ..Rules::default()
        };
        assert_eq!(answer(&rules, 302, &[]), Err(Uncacheable::Status));
    }

    #[test]
    fn over_the_largest_object() {
        let rules = Rules {
            max_object: 9,
            ..Rules::default()
        };
        assert_eq!(
            answer(&rules, 200, &[("Cache-Control", "max-age=6")]),
            Err(Uncacheable::TooLarge)
        );
    }

    #[test]
    fn age_counts_from_the_age_field_or_the_date_whichever_is_older() {
        let now = date(NOW - 20);
        let f = answer(
            &Rules::default(),
            200,
            &[
                ("Cache-Control", "max-age=60"),
                ("Age", "5"),
                ("Date", &now),
            ],
        )
        .unwrap();
        assert_eq!(f.initial_age, 20);
        assert_eq!(f.age(NOW + 10), 30);
        assert!(f.is_fresh(NOW + 39));
        assert!(!f.is_fresh(NOW + 40));
        assert_eq!(f.staleness(NOW + 45), 5);
        let f = answer(
            &Rules::default(),
            200,
            &[("Cache-Control", "max-age=60"), ("Age", "30")],
        )
        .unwrap();
        assert_eq!(f.initial_age, 30);
        // Older than its lifetime already: not stored.
        assert_eq!(
            lifetime(200, &[("Cache-Control", "max-age=60"), ("Age", "60")]),
            Err(Uncacheable::NoFreshness)
        );
        // A date in the future makes it no younger than 0.
        let later = date(NOW + 100);
        assert_eq!(
            answer(
                &Rules::default(),
                200,
                &[("Cache-Control", "max-age=60"), ("Date", &later)]
            )
            .unwrap()
            .initial_age,
            0
        );
    }

    #[test]
    fn stale_windows_come_from_the_route_or_the_answer_and_never_past_must_revalidate() {
        let f = |cc: &str| answer(&Rules::default(), 200, &[("cache-control", cc)]).unwrap();
        let route = Rules {
            stale_while_updating: 10,
            stale_if_error: 100,
            ..Rules::default()
        };
        let none = Rules::default();
        let plain = f("max-age=60");
        assert!(!plain.serves_while_updating(&route, NOW + 59), "fresh");
        assert!(plain.serves_while_updating(&route, NOW + 70));
        assert!(!plain.serves_while_updating(&route, NOW + 71));
        assert!(!plain.serves_while_updating(&none, NOW + 61));
        assert!(plain.serves_on_error(&route, NOW + 160));
        assert!(!plain.serves_on_error(&route, NOW + 161));
        assert!(plain.worth_keeping(&route, NOW + 160));
        assert!(!plain.worth_keeping(&route, NOW + 161));
        assert!(!plain.worth_keeping(&none, NOW + 60));
        // The answer's own windows, when longer.
        let own = f("max-age=60, stale-while-revalidate=30, stale-if-error=600");
        assert!(own.serves_while_updating(&route, NOW + 90));
        assert!(own.serves_while_updating(&none, NOW + 90));
        assert!(own.serves_on_error(&none, NOW + 660));
        // Never past must-revalidate, whatever the route says.
        for cc in [
            "max-age=60, must-revalidate",
            "s-maxage=60, stale-if-error=600",
        ] {
            let strict = f(cc);
            assert!(!strict.serves_while_updating(&route, NOW + 61), "{cc}");
            assert!(!strict.serves_on_error(&route, NOW + 61), "{cc}");
        }
    }

    #[test]
    fn stale_rules() {
        let f = answer(
            &Rules::default(),
            200,
            &[(
                "Cache-Control",
                "max-age=60, stale-while-revalidate=30, stale-if-error=600",
            )],
        )
        .unwrap();
        assert_eq!(
            (f.stale_while_revalidate, f.stale_if_error, f.no_stale),
            (30, 600, false)
        );
        for cc in [
            "max-age=60, must-revalidate",
            "max-age=60, proxy-revalidate",
            "s-maxage=60",
        ] {
            assert!(
                answer(&Rules::default(), 200, &[("Cache-Control", cc)])
                    .unwrap()
                    .no_stale,
                "{cc}"
            );
        }
    }

    #[test]
    fn authorized_answers_need_a_shared_word() {
        let rules = Rules {
            cache_authorized: true,
            ..Rules::default()
        };
        let judge = |cc: &str| {
            let fields = [("Cache-Control", cc.as_bytes())];
            judge_answer(
                &rules,
                &AnswerFacts {
                    status: 200,
                    fields: &fields,
                    content_length: None,
                    authorized: true,
                    now: NOW,
                },
            )
            .map(|f| f.lifetime)
        };
        assert_eq!(judge("max-age=60"), Err(Uncacheable::Authorization));
        assert_eq!(judge("public, max-age=60"), Ok(60));
        assert_eq!(judge("s-maxage=60"), Ok(60));
        assert_eq!(judge("must-revalidate, max-age=60"), Ok(60));
    }

    #[test]
    fn requests_with_credentials_bypass() {
        let rules = Rules::default();
        assert_eq!(
            request(&rules, MethodClass::Read, &[("Accept", "*/*")]),
            RequestVerdict::Lookup
        );
        assert_eq!(
            request(
                &rules,
                MethodClass::Read,
                &[("authorization", "Basic eA==")]
            ),
            RequestVerdict::Bypass(Bypass::Authorization)
        );
        assert_eq!(
            request(&rules, MethodClass::Read, &[("Cookie", "a=1")]),
            RequestVerdict::Bypass(Bypass::Cookie)
        );
        assert_eq!(
            request(&rules, MethodClass::Unsafe, &[]),
            RequestVerdict::Invalidate
        );
        assert_eq!(
            request(&rules, MethodClass::Other, &[]),
            RequestVerdict::Bypass(Bypass::Method)
        );
        let fields = [("Accept", &b"*/*"[..])];
        let facts = RequestFacts {
            method: MethodClass::Read,
            fields: &fields,
            has_body: true,
            identity: false,
        };
        assert_eq!(
            judge_request(&rules, &facts),
            RequestVerdict::Bypass(Bypass::Body)
        );
        let facts = RequestFacts {
            has_body: false,
            identity: true,
            ..facts
        };
        assert_eq!(
            judge_request(&rules, &facts),
            RequestVerdict::Bypass(Bypass::Identity)
        );
        // Even where Authorization may be cached, an identity may not.
        let open = Rules {
            cache_authorized: true,
            ..Rules::default()
        };
        assert_eq!(
            judge_request(&open, &facts),
            RequestVerdict::Bypass(Bypass::Identity)
        );
        assert_eq!(
            request(&open, MethodClass::Read, &[("Authorization", "Bearer x")]),
            RequestVerdict::Lookup
        );
        // A WebSocket handshake (any protocol switch) goes past: its answer is no page.
        let ws = [("Connection", "Upgrade"), ("Upgrade", "websocket")];
        assert_eq!(
            request(&Rules::default(), MethodClass::Read, &ws),
            RequestVerdict::Bypass(Bypass::Upgrade)
        );
    }

    #[test]
    fn cookie_rules() {
        let analytics = CookieRule::AllBut(vec![
            CookiePattern::new("_ga*"),
            CookiePattern::new("consent"),
        ]);
        assert!(!analytics.bypasses(b"_ga=1; _gat_x=2; consent=yes"));
        assert!(analytics.bypasses(b"_ga=1; session=abc"));
        assert!(!analytics.bypasses(b" ; "));
        let sessions = CookieRule::Only(vec![CookiePattern::new("wordpress_logged_in_*")]);
        assert!(!sessions.bypasses(b"_ga=1; theme=dark"));
        assert!(sessions.bypasses(b"theme=dark; wordpress_logged_in_abc=u"));
        assert!(!sessions.bypasses(b"wordpress_logged_in=u"));
    }

    #[test]
    fn query_in_the_key() {
        let q = Some("b=2&a=1&utm_source=x");
        assert_eq!(keyed_query(&KeyQuery::All, q).as_deref(), q);
        assert_eq!(keyed_query(&KeyQuery::None, q), None);
        assert_eq!(
            keyed_query(&KeyQuery::Sorted, q).as_deref(),
            Some("a=1&b=2&utm_source=x")
        );
        let only = KeyQuery::Only(vec!["a".into(), "b".into()]);
        assert_eq!(keyed_query(&only, q).as_deref(), Some("b=2&a=1"));
        assert_eq!(keyed_query(&only, Some("utm=1")), None);
        assert_eq!(keyed_query(&KeyQuery::All, None), None);
    }

    #[test]
    fn validators() {
        assert!(none_match_hits(b"\"a\", W/\"b\"", b"\"b\""));
        assert!(none_match_hits(b"*", b"\"x\""));
        assert!(none_match_hits(b"W/\"x\"", b"\"x\""));
        assert!(!none_match_hits(b"\"a\"", b"\"b\""));
        let lm = date(NOW);
        assert!(not_modified_since(date(NOW).as_bytes(), lm.as_bytes()));
        assert!(not_modified_since(date(NOW + 1).as_bytes(), lm.as_bytes()));
        assert!(!not_modified_since(date(NOW - 1).as_bytes(), lm.as_bytes()));
        assert!(!not_modified_since(b"junk", lm.as_bytes()));
    }

    #[test]
    fn unsafe_successes_invalidate() {
        assert!(invalidates(200) && invalidates(303) && invalidates(204));
        assert!(!invalidates(404) && !invalidates(500));
    }

    #[test]
    fn an_override_takes_the_routes_lifetimes_over_the_answers_own() {
        let rules = Rules {
            valid: vec![(200, 300)],
            override_headers: true,
            ..Rules::default()
        };
        // PHP's session_cache_limiter("nocache"), WordPress's logged-out pages.
        let php = [
            ("cache-control", "no-store, no-cache, must-revalidate"),
            ("pragma", "no-cache"),
            ("expires", "Thu, 19 Nov 1981 08:52:00 GMT"),
        ];
        let f = answer(&rules, 200, &php).unwrap();
        assert_eq!((f.lifetime, f.no_stale), (300, false));
        assert_eq!(
            answer(&rules, 200, &[("cache-control", "private, max-age=9")])
                .unwrap()
                .lifetime,
            300
        );
        assert_eq!(
            answer(&rules, 200, &[("cache-control", "max-age=9999")])
                .unwrap()
                .lifetime,
            300
        );
        // What still keeps an answer out.
        assert_eq!(
            answer(&rules, 200, &[("set-cookie", "s=1")]),
            Err(Uncacheable::SetCookie)
        );
        assert_eq!(
            answer(&rules, 200, &[("vary", "*")]),
            Err(Uncacheable::VaryStar)
        );
        assert_eq!(
            answer(&rules, 404, &php),
            Err(Uncacheable::NoFreshness),
            "no lifetime for 404"
        );
        assert_eq!(answer(&rules, 500, &[]), Err(Uncacheable::Status));
        // Without the override the same answer is refused.
        let plain = Rules {
            override_headers: false,
            ..rules
        };
        assert_eq!(answer(&plain, 200, &php), Err(Uncacheable::NoStore));
    }
}
