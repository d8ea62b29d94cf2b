//! tern-vhost: several sites behind one server (an app of layer 5 in ARCHITECTURE.md's map:
//! "a site, chosen by Host/SNI, is a list of routes").
//!
//! A [`SiteTable`] is built once from [`Site`]s (and rebuilt whole on reload); [`Sites`] is the
//! handler the server's router falls back to, holding the table behind an `ArcSwap` so a
//! reload replaces every site at once while requests in flight finish on the table they
//! started with.
//!
//! Per request: one `ArcSwap` load, the Host (or HTTP/2 `:authority`, which the codec puts in
//! the same place) lowercased into a stack buffer and looked up in two hash maps (exact
//! names, then the one-label wildcard of its parent), then the site's routes scanned longest
//! prefix first on segment boundaries. Nothing is allocated to choose; only the answer is.
//!
//! Site choice uses the Host the client sent, not the TLS SNI: the certificate was chosen by
//! SNI (`tern-tls`), and a browser sends the same name in both. A client that sends a
//! different Host inside a TLS session gets the site of that Host, as with nginx and Caddy's
//! defaults.
//!
//! This crate uses only tern-server's public API (handlers, responses, static files), like
//! the apps beside it.

mod handback;
mod headers;
mod host;
mod matcher;
mod route;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use tern_server::upstream::ResponseEdit;
use tern_server::{
    AnswerRow, Body, Handler, HandlerContext, LogTarget, Reply, Request, RequestHead, RequestId,
    Response,
};
use tern_services::template::Values;
use tern_services::TrustedProxies;

pub use handback::check_reroute_status;
pub use headers::{check_header_value, check_type_pattern, parse_expires, Expires, HeaderEdits};
pub use host::{normalize_pattern, PatternError};
pub use matcher::{check_matchers, compile_pattern, MatchSpec};
pub use route::{check_rewrite, check_try_files, Action, Fixed, Redirect, RouteOptions};

use host::HostTable;
use route::{Admission, BuiltAction, BuiltRoute, Fallback};

/// Internal re-routings (rewrites, `try_files` fallbacks, an app's hand-backs) one request
/// may take; past them it is answered 500, as nginx answers a rewrite cycle.
pub const MAX_REROUTES: u8 = 4;

/// One route of a site.
pub struct Route {
    /// A path prefix starting with `/`; matched on segment boundaries, a trailing slash
    /// ignored.
    pub prefix: String,
    pub action: Action,
    /// Its own header edits, over its site's ([`Site::headers`]).
    pub headers: HeaderEdits,
    pub options: RouteOptions,
}

/// A site's own page for an error status tern answers itself.
#[derive(Debug, Clone)]
pub struct ErrorPage {
    pub status: u16,
    pub body: Bytes,
    pub content_type: String,
}

/// One site: the host patterns that choose it and its routes.
pub struct Site {
    pub name: String,
    /// Normalised patterns (see [`normalize_pattern`]).
    pub hosts: Vec<String>,
    pub routes: Vec<Route>,
    /// The access log its requests' lines go to.
    pub log: LogTarget,
    /// Where its answers no route took are counted (`Stats::site`), for /metrics' `site`
    /// label; each route has its own row ([`RouteOptions::counted_as`]).
    pub counted_as: AnswerRow,
    pub error_pages: Vec<ErrorPage>,
    /// Requests get an id (`X-Request-Id`); a peer in the list may bring its own.
    pub request_ids: Option<TrustedProxies>,
    /// On-the-fly compression of answers no route took (404s, 421s are not the site's);
    /// each route has its own ([`RouteOptions::compress`]).
    pub compress: Option<Arc<tern_compress::Policy>>,
    /// Header edits on every answer of the site: its routes' (each route's own edits over
    /// them) and those no route took.
    pub headers: HeaderEdits,
}

struct BuiltSite {
    name: String,
    log: LogTarget,
    counted_as: AnswerRow,
    /// In the order given: among routes of one prefix, the first whose matchers pass wins.
    routes: Vec<BuiltRoute>,
    /// Stored prefix → its routes (indexes into `routes`), so finding the route costs one
    /// hash lookup per segment of the path, however many routes the site has.
    by_prefix: HashMap<Box<[u8]>, Vec<u32>, foldhash::fast::RandomState>,
    longest_prefix: usize,
    error_pages: Arc<ErrorPages>,
    /// The same pages for the answers the relay makes itself (502, 503, 504) on this site's
    /// proxied exchanges; `None` when the site has none.
    relay_error_pages: Option<ResponseEdit>,
    request_ids: Option<TrustedProxies>,
    compress: Option<Arc<tern_compress::Policy>>,
    /// The site's own header edits, for the answers no route took.
    edits: headers::BuiltEdits,
}

/// A site's error pages: status, body, its `Content-Type` line.
struct ErrorPages(Vec<(u16, Bytes, Vec<u8>)>);

/// Every site, prebuilt for matching.
pub struct SiteTable {
    hosts: HostTable,
    /// Shared: a request its app hands back is answered by its site, held by the relay
    /// until then (a reload meanwhile does not change the site it is answered on).
    sites: Vec<Arc<BuiltSite>>,
    /// The site for a Host no site names (and for requests without one); `None`: 421.
    default: Option<usize>,
}

impl SiteTable {
    /// Builds the table; `default` indexes `sites`. Errors name the site: a host claimed
    /// twice, a pattern that is not normalised, a prefix not starting with `/`, a route that
    /// an earlier one of the same prefix always takes first, a matcher or value that does
    /// not compile.
    pub fn new(sites: Vec<Site>, default: Option<usize>) -> Result<SiteTable, String> {
        if let Some(d) = default {
            if d >= sites.len() {
                return Err(format!("default site {d} does not exist"));
            }
        }
        let mut hosts = HostTable::default();
        let mut built = Vec::with_capacity(sites.len());
        for (i, site) in sites.into_iter().enumerate() {
            for pattern in &site.hosts {
                if normalize_pattern(pattern).as_deref() != Ok(pattern.as_str()) {
                    return Err(format!(
                        "site {}: host {pattern:?} is not normalised",
                        site.name
                    ));
                }
                if !hosts.insert(pattern, i) {
                    return Err(format!(
                        "site {}: host {pattern} belongs to another site",
                        site.name
                    ));
                }
            }
            let pages = Arc::new(ErrorPages(
                site.error_pages
                    .into_iter()
                    .map(|p| {
                        let line = format!("Content-Type: {}\r\n", p.content_type).into_bytes();
                        (p.status, p.body, line)
                    })
                    .collect(),
            ));
            let relay_error_pages = (!pages.0.is_empty()).then(|| {
                let pages = pages.clone();
                let edit: ResponseEdit = Arc::new(move |r: &mut Response| pages.apply(r));
                edit
            });
            let site_edits = headers::BuiltEdits::new(&site.headers)
                .map_err(|e| format!("site {}: {e}", site.name))?;
            let mut routes: Vec<BuiltRoute> = Vec::with_capacity(site.routes.len());
            let mut by_prefix: HashMap<Box<[u8]>, Vec<u32>, foldhash::fast::RandomState> =
                HashMap::default();
            for r in site.routes {
                if !r.prefix.starts_with('/') {
                    return Err(format!(
                        "site {}: prefix {:?} must start with /",
                        site.name, r.prefix
                    ));
                }
                // Stored decoded and canonical, as paths are compared: `/a+b` and `/a%2Bb`,
                // `/café` and `/caf%C3%A9` are one route whichever way a client spells it.
                let canonical = tern_server::canonical_path(&r.prefix).map_err(|e| {
                    format!(
                        "site {}: prefix {:?} has no canonical form ({e:?}); no request could \
                         be matched with it safely",
                        site.name, r.prefix
                    )
                })?;
                let decoded = tern_server::decoded_path(&canonical);
                let route = BuiltRoute::new(
                    &decoded,
                    r.action,
                    &r.headers.over(&site.headers),
                    r.options,
                    relay_error_pages.as_ref(),
                )
                .map_err(|e| format!("site {}: route {}: {e}", site.name, r.prefix))?;
                let same = by_prefix.entry(route.prefix.clone().into()).or_default();
                if let Some(&earlier) = same
                    .iter()
                    .find(|&&j| routes[j as usize].matchers.is_empty())
                {
                    let _ = earlier;
                    return Err(format!(
                        "site {}: prefix {} is given twice (the earlier route has no other \
                         matcher, so this one could never be chosen)",
                        site.name, r.prefix
                    ));
                }
                same.push(routes.len() as u32);
                routes.push(route);
            }
            let longest_prefix = routes.iter().map(|r| r.prefix.len()).max().unwrap_or(0);
            built.push(Arc::new(BuiltSite {
                name: site.name,
                log: site.log,
                counted_as: site.counted_as,
                routes,
                by_prefix,
                longest_prefix,
                relay_error_pages,
                error_pages: pages,
                request_ids: site.request_ids,
                compress: site.compress,
                edits: site_edits,
            }));
        }
        Ok(SiteTable {
            hosts,
            sites: built,
            default,
        })
    }

    pub fn site_count(&self) -> usize {
        self.sites.len()
    }

    pub fn route_count(&self) -> usize {
        self.sites.iter().map(|s| s.routes.len()).sum()
    }

    /// The name of the site a Host value chooses (for tests and diagnostics).
    pub fn site_name(&self, host: Option<&[u8]>) -> Option<&str> {
        self.site_for(host).map(|s| s.name.as_str())
    }

    fn site_for(&self, host: Option<&[u8]>) -> Option<&Arc<BuiltSite>> {
        let index = host.and_then(|h| self.hosts.find(h)).or(self.default)?;
        self.sites.get(index)
    }

    /// The prefix (stored form: decoded, `/` as "") of the route a request head takes on
    /// its site, before any rewrite (for tests, diagnostics and benchmarks).
    pub fn route_of(&self, head: &RequestHead<'_>) -> Option<&[u8]> {
        let site = self.site_for(head.host)?;
        let decoded = tern_server::decoded_path(&head.path);
        route_for(site, head, &decoded).map(|r| r.prefix.as_slice())
    }

    /// Whether the route this head ends at, after its rewrites, streams request bodies (a
    /// proxy route). A `try_files` fallback is not followed: its route gets the body whole.
    fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        let Some(site) = self.site_for(head.host) else {
            return false;
        };
        let mut current: Option<RequestHead<'_>> = None;
        for _ in 0..=MAX_REROUTES {
            let h = current.as_ref().unwrap_or(head);
            let decoded = tern_server::decoded_path(&h.path);
            let Some(route) = route_for(site, h, &decoded) else {
                return false;
            };
            if route.internal && current.is_none() {
                return false; // answered 404 without its body
            }
            match &route.action {
                BuiltAction::Rewrite(target) => match rewritten(route, target, h, &decoded) {
                    Some(path) => current = Some(head.with_path(Cow::Owned(path))),
                    None => return false,
                },
                _ => return route.streams_body(h),
            }
        }
        false
    }

    fn answer(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        let Some(site) = self.site_for(req.head.host) else {
            return Response::text(421, "misdirected request: no site here for this host\n").into();
        };
        cx.log_to(site.log);
        cx.count_as(site.counted_as);
        if site.compress.is_some() {
            cx.compress_with(site.compress.clone());
        }
        if let Some(trusted) = &site.request_ids {
            let from_proxy = trusted
                .is_trusted(req.peer.ip())
                .then(|| req.header("x-request-id").and_then(RequestId::parse))
                .flatten();
            cx.set_request_id(from_proxy.unwrap_or_else(RequestId::generate));
        }
        answer_on(site, req, cx, 0)
    }
}

/// The route for a request on a site: the longest prefix on a segment boundary of its
/// canonical path ([`RequestHead::path`], the same value the gate judges, the static
/// handler opens and the proxy forwards), and among that prefix's routes the first whose
/// matchers pass. `decoded`: the path decoded (safe on a canonical path: no escape can
/// become a separator), so a prefix matches every spelling of its name.
fn route_for<'s>(
    site: &'s BuiltSite,
    head: &RequestHead<'_>,
    decoded: &[u8],
) -> Option<&'s BuiltRoute> {
    if decoded.first() != Some(&b'/') {
        return None; // `*`, an authority: under no route
    }
    let mut end = decoded.len();
    loop {
        if end <= site.longest_prefix {
            if let Some(list) = site.by_prefix.get(&decoded[..end]) {
                for &i in list {
                    let route = &site.routes[i as usize];
                    if route.matchers.matches(head, decoded) {
                        return Some(route);
                    }
                }
            }
        }
        if end == 0 {
            return None;
        }
        end = memchr::memrchr(b'/', &decoded[..end]).unwrap_or(0);
    }
}

/// Answers a request on its site; `hops`: internal re-routings so far. The answer comes
/// back finished: the site's error page in place of tern's own body (a fixed route's is its
/// own), then the header edits of the route that answered, or the site's when none did.
fn answer_on(
    site: &Arc<BuiltSite>,
    req: &Request<'_>,
    cx: &mut HandlerContext<'_>,
    hops: u8,
) -> Reply {
    let decoded = tern_server::decoded_path(req.path());
    let route = route_for(site, req.head, &decoded);
    // An internal route answers only what tern routed again itself: to the client it is not
    // there (nginx's `internal`: 404), whatever else its path would have matched.
    let route = match route {
        Some(route) if route.internal && hops == 0 => None,
        route => route,
    };
    let Some(route) = route else {
        if tern_server::has_encoded_slash(req.path()) {
            cx.count_refusal(tern_server::Refusal::BadPath);
            return own_answer(site, None, bad_path_answer(), req, cx);
        }
        return own_answer(site, None, Response::text(404, "not found\n"), req, cx);
    };
    // An encoded slash (the codec kept it opaque) goes only where a route takes it; the
    // route was chosen with it inside its segment, as the gate judges and the proxy sends it.
    if !route.allow_encoded_slash && tern_server::has_encoded_slash(req.path()) {
        cx.count_refusal(tern_server::Refusal::BadPath);
        return own_answer(site, Some(route), bad_path_answer(), req, cx);
    }
    // The route that answers counts the answer: after a rewrite or a fallback, the last.
    cx.count_as(route.counted_as.unwrap_or(site.counted_as));
    if route.redirect_bare_prefix && *decoded == *route.prefix {
        let mut location = String::with_capacity(req.path().len() + 1);
        location.push_str(req.path());
        location.push('/');
        if let Some(q) = req.query() {
            location.push('?');
            location.push_str(q);
        }
        let moved = Response::text(301, "moved permanently\n").with_header("Location", &location);
        return own_answer(site, Some(route), moved, req, cx);
    }
    if route.compress.is_some() || site.compress.is_some() {
        cx.compress_with(route.compress.clone());
    }
    match route.admit(req, cx.worker_id) {
        Admission::Refuse(r, why) => {
            cx.count_refusal(why);
            own_answer(site, Some(route), r, req, cx)
        }
        Admission::Pass => answer_by(site, route, req, cx, &decoded, hops),
        Admission::PassAfter(ms) => {
            let mut reply = answer_by(site, route, req, cx, &decoded, hops);
            // Held on the connection's timer until its turn: only what goes to an upstream
            // (a proxy or PHP route; --check allows a queue nowhere else) is worth holding.
            if let Reply::Forward(fwd) = &mut reply {
                fwd.not_before_ms = fwd.not_before_ms.max(req.now_ms + ms);
            }
            reply
        }
    }
}

/// What `route` answers, once its limits let the request through.
fn answer_by(
    site: &Arc<BuiltSite>,
    route: &BuiltRoute,
    req: &Request<'_>,
    cx: &mut HandlerContext<'_>,
    decoded: &[u8],
    hops: u8,
) -> Reply {
    let mut reply = match &route.action {
        BuiltAction::Rewrite(target) => {
            return match rewritten(route, target, req.head, decoded) {
                Some(path) => reroute(site, route, req, cx, path, hops),
                None => own_answer(site, Some(route), bad_path_answer(), req, cx),
            };
        }
        BuiltAction::Handler(handler) => {
            if let Some(tf) = &route.try_files {
                match try_files(site, route, tf, handler.as_ref(), req, cx, hops) {
                    Tried::Reply(r) => r,
                    Tried::Rerouted(r) => return r,
                }
            } else {
                handler.handle(req, cx)
            }
        }
        _ => Reply::Now(route.answer_plain(req).expect("a plain route answers")),
    };
    if let Reply::Now(r) = &mut reply {
        if !route.is_fixed() {
            site.error_pages.apply(r);
        }
    }
    let id = cx.request_id().copied();
    let values = answer_values(req, id.as_ref());
    route.edit_reply(
        &mut reply,
        &values,
        req.unix_secs,
        site.relay_error_pages.as_ref(),
    );
    if let (Reply::Forward(_), Some(policy)) = (&reply, &route.handback) {
        cx.hand_back(policy.handback(site, req, id, hops));
    }
    reply
}

/// One of tern's own answers on a site (no route, a refusal, a path with no canonical form, a
/// re-routing cycle): the site's error page for its status, then the header edits of
/// `route` (the site's own when no route took the request), which every answer gets.
fn own_answer(
    site: &BuiltSite,
    route: Option<&BuiltRoute>,
    mut response: Response,
    req: &Request<'_>,
    cx: &HandlerContext<'_>,
) -> Reply {
    site.error_pages.apply(&mut response);
    let id = cx.request_id().copied();
    let values = answer_values(req, id.as_ref());
    match route {
        Some(route) => route.edit_own(&mut response, &values, req.unix_secs),
        None => site.edits.apply(&mut response, &values, req.unix_secs),
    }
    response.into()
}

/// What header values may name, for this request.
fn answer_values<'a>(req: &'a Request<'_>, id: Option<&'a RequestId>) -> Values<'a> {
    Values {
        client: req.peer.ip(),
        secure: req.secure,
        host: req.head.host.unwrap_or(b""),
        request_id: id.map(RequestId::as_str),
        uri: req.path(),
        captures: &[],
    }
}

enum Tried {
    /// A candidate's answer (or the `=CODE` fallback).
    Reply(Reply),
    /// The fallback path's answer, finished by the route it reached.
    Rerouted(Reply),
}

/// `try_files`: each candidate's answer is the handler's for that path, the first that is
/// not 404 wins (the handler runs at most once per candidate: linear in the list).
///
/// As nginx's: a candidate without a trailing slash names a file, so a folder's redirect to
/// its slashed form means "not here". A folder candidate (`$uri/`) that is not the path
/// asked for (`/wp-admin/` for `/wp-admin`) stands for the folder without its slash, as
/// nginx's `try_files` sets `$uri` to it: when that is a folder, the handler's redirect to
/// the slashed form (with the query) is the answer, so the folder's page (its `index.php`)
/// never runs under a path its relative links would break on.
fn try_files(
    site: &Arc<BuiltSite>,
    route: &BuiltRoute,
    tf: &route::TryFiles,
    handler: &dyn Handler,
    req: &Request<'_>,
    cx: &mut HandlerContext<'_>,
    hops: u8,
) -> Tried {
    let mut buf = Vec::new();
    // The previous candidate's path and, if it was a folder, the redirect it got: the
    // folder candidate after `$uri` asks about the same path, and gets its answer without a
    // second lookup.
    let mut previous: Option<(String, Option<Reply>)> = None;
    for candidate in &tf.candidates {
        buf.clear();
        candidate.render(&mut buf, &path_values(req.path()));
        let Some(path) = canonical_owned(&buf) else {
            continue;
        };
        let file_only = !path.ends_with('/');
        let path = if !file_only && path != req.path() {
            let folder = &path[..path.len() - 1];
            let redirect = match previous.take() {
                Some((asked, redirect)) if asked == folder => redirect,
                _ => {
                    let head = req.head.with_path(Cow::Owned(folder.to_string()));
                    let reply = handler.handle(&with_head(req, &head), cx);
                    matches!(&reply, Reply::Now(r) if r.status == 301).then_some(reply)
                }
            };
            match redirect {
                Some(reply) => return Tried::Reply(reply),
                None => continue,
            }
        } else if previous.as_ref().is_some_and(|(asked, _)| *asked == path) {
            continue; // `$uri/` for `/a/` is `$uri` again: missing again
        } else {
            path
        };
        let head = req.head.with_path(Cow::Owned(path));
        let reply = handler.handle(&with_head(req, &head), cx);
        let folder = matches!(&reply, Reply::Now(r) if file_only && r.status == 301);
        let missing = folder || matches!(&reply, Reply::Now(r) if r.status == 404);
        if !missing {
            return Tried::Reply(reply);
        }
        previous = Some((head.path.into_owned(), folder.then_some(reply)));
    }
    match &tf.fallback {
        Fallback::Status(code) => Tried::Reply(Response::text(*code, status_text(*code)).into()),
        Fallback::Path(t) => {
            buf.clear();
            t.render(&mut buf, &path_values(req.path()));
            match canonical_owned(&buf) {
                Some(path) => Tried::Rerouted(reroute(site, route, req, cx, path, hops)),
                None => Tried::Reply(bad_path()),
            }
        }
    }
}

/// Routes the request again on its site with `path` (canonical); `from`: the route that
/// sends it on.
fn reroute(
    site: &Arc<BuiltSite>,
    from: &BuiltRoute,
    req: &Request<'_>,
    cx: &mut HandlerContext<'_>,
    path: String,
    hops: u8,
) -> Reply {
    if hops >= MAX_REROUTES {
        let cycle = Response::text(500, "internal redirection cycle\n");
        return own_answer(site, Some(from), cycle, req, cx);
    }
    let head = req.head.with_path(Cow::Owned(path));
    answer_on(site, &with_head(req, &head), cx, hops + 1)
}

/// The same request with another head (a new path).
fn with_head<'r>(req: &Request<'r>, head: &'r RequestHead<'r>) -> Request<'r> {
    Request {
        head,
        body: req.body,
        peer: req.peer,
        secure: req.secure,
        local_port: req.local_port,
        unix_secs: req.unix_secs,
        now_ms: req.now_ms,
    }
}

fn path_values(uri: &str) -> Values<'_> {
    Values {
        client: std::net::Ipv4Addr::UNSPECIFIED.into(),
        secure: false,
        host: b"",
        request_id: None,
        uri,
        captures: &[],
    }
}

/// A rewrite's new path, canonical; None if it has no canonical form.
fn rewritten(
    route: &BuiltRoute,
    target: &tern_services::template::Template,
    head: &RequestHead<'_>,
    decoded: &[u8],
) -> Option<String> {
    // Captures come from the decoded path: they are escaped again before the result is
    // canonicalised, so a `%` or `?` the client encoded can never become an escape or a
    // query here (no double decoding).
    let escaped: Vec<Vec<u8>> = match route.matchers.pattern() {
        Some(p) if target_uses_captures(target) => match p.captures(decoded) {
            Some(caps) => caps
                .iter()
                .skip(1)
                .map(|c| escape_capture(c.map_or(&b""[..], |m| m.as_bytes())))
                .collect(),
            None => Vec::new(),
        },
        _ => Vec::new(),
    };
    let refs: Vec<&[u8]> = escaped.iter().map(Vec::as_slice).collect();
    let mut out = Vec::with_capacity(head.path.len() + 32);
    target.render(
        &mut out,
        &Values {
            captures: &refs,
            ..path_values(&head.path)
        },
    );
    canonical_owned(&out)
}

fn target_uses_captures(t: &tern_services::template::Template) -> bool {
    (1..=9).any(|n| t.uses(tern_services::template::Var::Capture(n)))
}

/// Bytes of a decoded path piece, escaped so that the canonical form reads them back as
/// they were: `%`, `?`, `#`, `;`, `\`, spaces and controls (a `/` stays a separator: a
/// canonical path has no encoded one to begin with).
fn escape_capture(bytes: &[u8]) -> Vec<u8> {
    use percent_encoding::{percent_encode, AsciiSet, CONTROLS};
    const SET: &AsciiSet = &CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'?')
        .add(b';')
        .add(b'\\')
        .add(b'<')
        .add(b'>')
        .add(b'`')
        .add(b'{')
        .add(b'}');
    percent_encode(bytes, SET).to_string().into_bytes()
}

/// The canonical form of a path built here, owned; None if it has none (answered 400).
fn canonical_owned(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    if !text.starts_with('/') {
        return None;
    }
    tern_server::canonical_path(text).ok().map(Cow::into_owned)
}

/// A route's handler that sees the path without the route's prefix (`strip_prefix`, nginx's
/// `location /api/ { proxy_pass http://app/; }`, Caddy's `handle_path`): `/api/users` →
/// `/users`. `tern run` puts it inside the gate's guard, around the proxy: the route and the
/// gate judge the path the client asked for (gate rules are written in the site's paths,
/// one space for every route), and only what is forwarded is cut, from that same canonical
/// path.
pub struct StripPrefix {
    /// Bytes of the route's stored prefix, decoded (as `BuiltRoute::prefix`).
    decoded_len: usize,
    inner: Arc<dyn Handler>,
}

impl StripPrefix {
    /// `prefix`: the route's `path` as configured.
    pub fn new(prefix: &str, inner: Arc<dyn Handler>) -> Result<StripPrefix, String> {
        let canonical = tern_server::canonical_path(prefix)
            .map_err(|e| format!("prefix {prefix:?} has no canonical form ({e:?})"))?;
        let decoded = tern_server::decoded_path(&canonical);
        Ok(StripPrefix {
            decoded_len: route::stored_prefix(&decoded).len(),
            inner,
        })
    }
}

impl Handler for StripPrefix {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        let Some(path) = stripped(req.path(), self.decoded_len) else {
            return bad_path();
        };
        let head = req.head.with_path(path);
        self.inner.handle(&with_head(req, &head), cx)
    }

    fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        self.inner.streams_body(head)
    }
}

/// The canonical path without the route's prefix (`decoded_len` bytes of it decoded):
/// `/api/users` → `/users`, `/api` → `/`. The prefix ends on a segment boundary, so what is
/// left is canonical too; it is checked again all the same.
fn stripped(path: &str, decoded_len: usize) -> Option<Cow<'_, str>> {
    let b = path.as_bytes();
    let (mut i, mut n) = (0, 0);
    while n < decoded_len && i < b.len() {
        i += if b[i] == b'%' { 3 } else { 1 };
        n += 1;
    }
    let rest = path.get(i..)?;
    if rest.is_empty() {
        return Some(Cow::Borrowed("/"));
    }
    if !rest.starts_with('/') {
        return None;
    }
    // An encoded slash is here only if the route took it (see `answer_on`): kept as it was.
    match tern_server::canonical_path_opaque_slash(rest) {
        Ok(canonical) if canonical == rest => Some(Cow::Borrowed(rest)),
        _ => None,
    }
}

fn bad_path() -> Reply {
    bad_path_answer().into()
}

fn bad_path_answer() -> Response {
    Response::text(400, "path cannot be normalised safely\n")
}

fn status_text(code: u16) -> &'static str {
    match code {
        403 => "forbidden\n",
        404 => "not found\n",
        410 => "gone\n",
        _ if code >= 500 => "error\n",
        _ => "refused\n",
    }
}

impl ErrorPages {
    /// Puts the page for this status in place of tern's short body; the status and the
    /// other fields stay.
    fn apply(&self, response: &mut Response) {
        let Some((_, body, type_line)) = self
            .0
            .iter()
            .find(|(status, _, _)| *status == response.status)
        else {
            return;
        };
        for name in [
            "content-type",
            "content-encoding",
            "etag",
            "last-modified",
            "vary",
            "accept-ranges",
            "content-range",
        ] {
            response.remove_header(name);
        }
        response.body = Body::Shared(body.clone());
        response.push_raw_headers(type_line);
    }
}

/// The handler in front of every site: the current table, replaced whole by [`Sites::swap`].
#[derive(Clone)]
pub struct Sites(Arc<ArcSwap<SiteTable>>);

impl Sites {
    pub fn new(table: SiteTable) -> Sites {
        Sites(Arc::new(ArcSwap::from_pointee(table)))
    }

    /// Puts a new table in force for every later request; requests under way finish on the
    /// table they started with.
    pub fn swap(&self, table: SiteTable) {
        self.0.store(Arc::new(table));
    }

    pub fn current(&self) -> Arc<SiteTable> {
        self.0.load_full()
    }
}

impl Handler for Sites {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        self.0.load().answer(req, cx)
    }

    fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        self.0.load().streams_body(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(body: &'static str) -> Action {
        Action::Fixed(Fixed {
            status: 200,
            body: bytes::Bytes::from_static(body.as_bytes()),
            content_type: "text/plain".into(),
        })
    }

    fn route(prefix: &str) -> Route {
        Route {
            prefix: prefix.into(),
            action: fixed("x"),
            headers: HeaderEdits::default(),
            options: RouteOptions::default(),
        }
    }

    fn site(name: &str, hosts: &[&str], prefixes: &[&str]) -> Site {
        Site {
            name: name.into(),
            hosts: hosts
                .iter()
                .map(|h| normalize_pattern(h).unwrap())
                .collect(),
            routes: prefixes.iter().map(|p| route(p)).collect(),
            log: LogTarget::DEFAULT,
            counted_as: AnswerRow::NONE,
            error_pages: Vec::new(),
            request_ids: None,
            compress: None,
            headers: HeaderEdits::default(),
        }
    }

    impl SiteTable {
        /// The stored prefix of the route `GET path` on `host` takes.
        fn route_prefix(&self, host: Option<&[u8]>, path: &str) -> Option<String> {
            let host = host.map_or(String::new(), |h| {
                format!("Host: {}\r\n", String::from_utf8_lossy(h))
            });
            let raw = format!("GET {path} HTTP/1.1\r\n{host}\r\n");
            tern_server::testing::with_request(
                raw.as_bytes(),
                "127.0.0.1:1".parse().unwrap(),
                false,
                |req| {
                    self.route_of(req.head)
                        .map(|p| String::from_utf8_lossy(p).into_owned())
                },
            )
        }
    }

    #[test]
    fn hosts_choose_sites_and_unknown_hosts_get_the_default_or_nothing() {
        let sites = || {
            vec![
                site("main", &["example.org"], &["/"]),
                site("wild", &["*.example.org"], &["/"]),
                site("other", &["other.test"], &["/"]),
            ]
        };
        let t = SiteTable::new(sites(), None).unwrap();
        assert_eq!(t.site_name(Some(b"Example.org:8080")), Some("main"));
        assert_eq!(t.site_name(Some(b"x.example.org")), Some("wild"));
        assert_eq!(t.site_name(Some(b"other.test")), Some("other"));
        assert_eq!(t.site_name(Some(b"nobody.test")), None);
        assert_eq!(t.site_name(None), None);
        let t = SiteTable::new(sites(), Some(2)).unwrap();
        assert_eq!(t.site_name(Some(b"nobody.test")), Some("other"));
        assert_eq!(t.site_name(None), Some("other"));
        assert_eq!(t.site_name(Some(b"example.org")), Some("main"));
    }

    #[test]
    fn the_longest_prefix_wins_on_segment_boundaries() {
        let t = SiteTable::new(
            vec![site(
                "s",
                &["s.test"],
                &["/", "/app", "/app/admin/", "/apple"],
            )],
            None,
        )
        .unwrap();
        let at = |path| t.route_prefix(Some(b"s.test"), path);
        assert_eq!(at("/").as_deref(), Some(""));
        assert_eq!(at("/index.html").as_deref(), Some(""));
        assert_eq!(at("/app").as_deref(), Some("/app"));
        assert_eq!(at("/app/x").as_deref(), Some("/app"));
        assert_eq!(at("/app/admin").as_deref(), Some("/app/admin"));
        assert_eq!(at("/app/admin/users").as_deref(), Some("/app/admin"));
        assert_eq!(at("/app/administrator").as_deref(), Some("/app"));
        assert_eq!(at("/apple").as_deref(), Some("/apple"));
        assert_eq!(at("/apples").as_deref(), Some(""));
        let t = SiteTable::new(vec![site("s", &["s.test"], &["/docs"])], None).unwrap();
        assert_eq!(t.route_prefix(Some(b"s.test"), "/doc"), None::<String>);
    }

    /// The adversarial pass: a route written `/a+b` or `/café` took only that spelling, so
    /// `/a%2Bb` or `/caf%C3%A9` reached the route below it. Prefixes and paths are compared
    /// decoded, and a prefix with no canonical form is refused.
    #[test]
    fn every_spelling_of_a_name_takes_its_route() {
        let t = SiteTable::new(
            vec![site(
                "s",
                &["s.test"],
                &["/", "/a+b", "/café", "/caf%C3%A9x", "/Special:Login"],
            )],
            None,
        )
        .unwrap();
        let at = |path: &str| t.route_prefix(Some(b"s.test"), path);
        for (path, want) in [
            ("/a+b", "/a+b"),
            ("/a%2Bb/x", "/a+b"),
            ("/a%2bb", "/a+b"),
            ("/café", "/café"),
            ("/caf%C3%A9", "/café"),
            ("/caféx", "/caféx"),
            ("/Special%3ALogin", "/Special:Login"),
            ("/ab", ""),
        ] {
            assert_eq!(at(path).as_deref(), Some(want), "{path}");
        }
        for bad in ["/a;b", "/a%2Fb", "/../a", "/a#b"] {
            let e = SiteTable::new(vec![site("s", &["s.test"], &[bad])], None)
                .err()
                .unwrap_or_else(|| panic!("{bad} was accepted"));
            assert!(e.contains("no canonical form"), "{e}");
        }
    }

    #[test]
    fn bad_tables_are_refused() {
        let e = SiteTable::new(
            vec![
                site("a", &["x.test"], &["/"]),
                site("b", &["X.test"], &["/"]),
            ],
            None,
        )
        .err()
        .unwrap();
        assert!(e.contains("belongs to another site"), "{e}");
        let e = SiteTable::new(vec![site("a", &["x.test"], &["/a", "/a/"])], None)
            .err()
            .unwrap();
        assert!(e.contains("given twice"), "{e}");
        let e = SiteTable::new(vec![site("a", &["x.test"], &["a"])], None)
            .err()
            .unwrap();
        assert!(e.contains("must start with /"), "{e}");
        let mut s = site("a", &[], &["/"]);
        s.hosts.push("UPPER.test".into());
        assert!(SiteTable::new(vec![s], None).is_err());
        assert!(SiteTable::new(vec![site("a", &[], &["/"])], Some(1)).is_err());
    }
    // Behaviour through a real connection (the codec's parse, the site table, the handler).

    /// Answers `200 <path it saw>`, or 404 for paths under `/missing` and `/spa/deep`.
    fn stripped_echo(prefix: &str) -> Action {
        let Action::Handler(echo) = echo() else {
            unreachable!()
        };
        Action::Handler(Arc::new(StripPrefix::new(prefix, echo).unwrap()))
    }

    fn echo() -> Action {
        Action::Handler(Arc::new(
            |req: &Request<'_>, cx: &mut HandlerContext<'_>| -> Reply {
                let path = req.path();
                if path.starts_with("/missing") || path.starts_with("/spa/deep") {
                    return Response::text(404, "not found\n").into();
                }
                let id = cx
                    .request_id()
                    .map_or(String::new(), |i| format!(" id={}", i.as_str()));
                let body = format!("saw {path}{id}");
                Response::new(200)
                    .with_body(Body::Shared(Bytes::from(body.into_bytes())))
                    .into()
            },
        ))
    }

    fn with(prefix: &str, action: Action, options: RouteOptions) -> Route {
        Route {
            prefix: prefix.into(),
            action,
            headers: HeaderEdits::default(),
            options,
        }
    }

    fn serve(
        routes: Vec<Route>,
        tweak: impl FnOnce(&mut Site),
    ) -> tern_server::testing::MemoryConn {
        let mut s = Site {
            routes,
            ..site("s", &["s.test"], &[])
        };
        tweak(&mut s);
        let table = SiteTable::new(vec![s], Some(0)).unwrap();
        let router = tern_server::Router::new().fallback(Sites::new(table));
        tern_server::testing::MemoryConn::new(router, None).unwrap()
    }

    /// Status and raw answer text of one request.
    fn ask(conn: &mut tern_server::testing::MemoryConn, request: &str) -> (u16, String) {
        conn.feed(request.as_bytes());
        let out = conn.take_output();
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text[9..12].parse().unwrap();
        (status, text)
    }

    fn get(path: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: s.test\r\n\r\n")
    }

    #[test]
    fn matchers_choose_among_routes_of_one_prefix_in_order() {
        let mut c = serve(
            vec![
                with(
                    "/api",
                    fixed("posts"),
                    RouteOptions {
                        matchers: MatchSpec {
                            methods: vec!["POST".into()],
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                with(
                    "/api",
                    fixed("v2"),
                    RouteOptions {
                        matchers: MatchSpec {
                            headers: vec![("X-Version".into(), "2".into())],
                            query: vec![("v".into(), "*".into())],
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                with(
                    "/",
                    fixed("user"),
                    RouteOptions {
                        matchers: MatchSpec {
                            path_regex: Some("^/u/[0-9]+$".into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                with("/api", fixed("api"), RouteOptions::default()),
            ],
            |_| {},
        );
        let body = |t: String| t.rsplit("\r\n\r\n").next().unwrap().to_string();
        assert_eq!(
            body(
                ask(
                    &mut c,
                    "POST /api/x HTTP/1.1\r\nHost: s.test\r\nContent-Length: 0\r\n\r\n"
                )
                .1
            ),
            "posts"
        );
        assert_eq!(
            body(
                ask(
                    &mut c,
                    "GET /api/x?v HTTP/1.1\r\nHost: s.test\r\nX-Version: 2\r\n\r\n"
                )
                .1
            ),
            "v2"
        );
        assert_eq!(
            body(
                ask(
                    &mut c,
                    "GET /api/x HTTP/1.1\r\nHost: s.test\r\nX-Version: 2\r\n\r\n"
                )
                .1
            ),
            "api"
        );
        assert_eq!(body(ask(&mut c, &get("/u/42")).1), "user");
        assert_eq!(ask(&mut c, &get("/u/42x")).0, 404, "no route at / takes it");
        assert_eq!(
            ask(&mut c, &get("/%75/42")).1.rsplit("\r\n\r\n").next(),
            Some("user")
        );
    }

    #[test]
    fn answers_are_counted_in_the_row_of_the_route_that_answered() {
        let stats = tern_server::Stats::new(1);
        let site = stats.site("s");
        let counted = |label: &str| RouteOptions {
            counted_as: Some(stats.route(site, label)),
            ..Default::default()
        };
        let routes = vec![
            with("/a", fixed("a"), counted("/a")),
            with("/b", fixed("b"), counted("posts")),
            with("/old", Action::Rewrite("/b".into()), counted("/old")),
            // A route without a row of its own counts in its site's.
            with("/c", fixed("c"), RouteOptions::default()),
        ];
        let mut c = serve(routes, |s| s.counted_as = site).with_stats(stats.clone());
        assert_eq!(ask(&mut c, &get("/a/x")).0, 200);
        assert_eq!(ask(&mut c, &get("/b")).0, 200);
        assert_eq!(ask(&mut c, &get("/old")).0, 200, "rewritten to /b");
        assert_eq!(ask(&mut c, &get("/c")).0, 200);
        assert_eq!(ask(&mut c, &get("/nothing")).0, 404);
        let s = stats.snapshot();
        let twos = |route: &str| s.answers_of("s", route).unwrap().responses[1];
        assert_eq!(twos("/a"), 1);
        assert_eq!(
            twos("posts"),
            2,
            "the route a rewrite ends at counts its answer"
        );
        assert_eq!(twos("/old"), 0);
        let own = s.answers_of("s", "").unwrap();
        assert_eq!(
            own.responses,
            [0, 1, 0, 1, 0],
            "/c, and the 404 of no route"
        );
        assert_eq!(s.answers_of("", "").unwrap().responses, [0; 5]);
    }

    #[test]
    fn a_route_shadowed_by_an_earlier_one_is_refused() {
        let s = Site {
            routes: vec![
                with("/a", fixed("x"), RouteOptions::default()),
                with(
                    "/a/",
                    fixed("y"),
                    RouteOptions {
                        matchers: MatchSpec {
                            methods: vec!["GET".into()],
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
            ],
            ..site("s", &[], &[])
        };
        let e = SiteTable::new(vec![s], Some(0)).err().unwrap();
        assert!(e.contains("could never be chosen"), "{e}");
    }

    #[test]
    fn rewrites_and_stripped_prefixes_give_the_handler_a_new_canonical_path() {
        let mut c = serve(
            vec![
                with(
                    "/old",
                    Action::Rewrite("/new/$1".into()),
                    RouteOptions {
                        matchers: MatchSpec {
                            path_regex: Some("^/old/(.*)$".into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                with(
                    "/loop",
                    Action::Rewrite("/loop/x".into()),
                    RouteOptions::default(),
                ),
                with("/api", stripped_echo("/api"), RouteOptions::default()),
                with("/café", stripped_echo("/café"), RouteOptions::default()),
                with("/", echo(), RouteOptions::default()),
            ],
            |_| {},
        );
        let body = |c: &mut tern_server::testing::MemoryConn, p: &str| {
            ask(c, &get(p))
                .1
                .rsplit("\r\n\r\n")
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(body(&mut c, "/old/a/b?q=1"), "saw /new/a/b");
        // A capture holding an encoded `%` or `?` stays encoded: no second decoding.
        assert_eq!(body(&mut c, "/old/a%25x"), "saw /new/a%25x");
        assert_eq!(body(&mut c, "/old/a%3Fb"), "saw /new/a%3Fb");
        assert_eq!(
            body(&mut c, "/old/%2e%2e/x"),
            "saw /x",
            "dot segments are resolved first"
        );
        assert_eq!(ask(&mut c, &get("/loop")).0, 500, "a cycle ends");
        assert_eq!(body(&mut c, "/api/users/1"), "saw /users/1");
        assert_eq!(body(&mut c, "/api"), "saw /");
        assert_eq!(body(&mut c, "/api/"), "saw /");
        assert_eq!(body(&mut c, "//api//x/./y/../z"), "saw /x/z");
        assert_eq!(body(&mut c, "/%61pi/x"), "saw /x");
        assert_eq!(body(&mut c, "/apix"), "saw /apix", "not under /api");
        assert_eq!(
            body(&mut c, "/caf%C3%A9/%C3%A9t%C3%A9"),
            "saw /%C3%A9t%C3%A9"
        );
        assert_eq!(body(&mut c, "/café/x"), "saw /x");
        assert_eq!(
            ask(&mut c, &get("/api/a%2Fb")).0,
            400,
            "refused before any route"
        );
    }

    /// `%2F` reaches a route that takes it, opaque inside its segment: chosen, cut and
    /// handed on as sent; every other route (and no route) refuses it with 400.
    #[test]
    fn an_encoded_slash_reaches_only_the_routes_that_take_it() {
        let takes = RouteOptions {
            allow_encoded_slash: true,
            ..Default::default()
        };
        let routes = vec![
            with("/api", stripped_echo("/api"), takes),
            with(
                "/raw",
                echo(),
                RouteOptions {
                    allow_encoded_slash: true,
                    ..Default::default()
                },
            ),
            with("/other", echo(), RouteOptions::default()),
        ];
        let table = SiteTable::new(
            vec![Site {
                routes,
                ..site("s", &["s.test"], &[])
            }],
            None,
        )
        .unwrap();
        let router = tern_server::Router::new().fallback(Sites::new(table));
        let mut config = tern_server::ServerConfig::default();
        config.limits.allow_encoded_slash = true;
        let mut c = tern_server::testing::MemoryConn::with_config(router, config, None).unwrap();
        for (path, want) in [
            ("/api/a%2fb/c", "200 saw /a%2Fb/c"),
            ("/api/..%2F..%2Fother", "200 saw /..%2F..%2Fother"),
            (
                "/raw/x%2F..%2F..%2Fother",
                "200 saw /raw/x%2F..%2F..%2Fother",
            ),
            ("/api/x/../y%2Fz", "200 saw /y%2Fz"),
            ("/other/a%2Fb", "400"),
            // Chosen on the segment as written: `api%2Fx` is no route's.
            ("/api%2Fx", "400"),
            ("/nowhere/a%2Fb", "400"),
            ("/nowhere/a", "404"),
            ("/api/a%5Cb", "400"),
        ] {
            let (status, text) = ask(&mut c, &get(path));
            let body = text.rsplit("\r\n\r\n").next().unwrap();
            let got = if status == 200 {
                format!("200 {body}")
            } else {
                status.to_string()
            };
            assert_eq!(got, want, "{path}");
        }
    }

    /// nginx's rule for a proxy `location /app/`: the bare `/app` is redirected to the
    /// folder (query kept) rather than handed to the app; a route written without the
    /// slash, or without the option, takes `/app` itself.
    #[test]
    fn a_route_written_with_its_slash_redirects_the_bare_prefix() {
        let bare = RouteOptions {
            redirect_bare_prefix: true,
            ..Default::default()
        };
        let routes = vec![
            with("/app/", echo(), bare),
            with(
                "/plain",
                echo(),
                RouteOptions {
                    redirect_bare_prefix: true,
                    ..Default::default()
                },
            ),
            with("/other/", echo(), RouteOptions::default()),
        ];
        let mut c = serve(routes, |_| {});
        let (status, text) = ask(&mut c, &get("/app?x=1&y=%20"));
        assert_eq!(status, 301, "{text}");
        assert!(text.contains("\r\nLocation: /app/?x=1&y=%20\r\n"), "{text}");
        let (status, text) = ask(&mut c, &get("/%61pp"));
        assert_eq!(status, 301, "any spelling of the prefix: {text}");
        assert!(text.contains("\r\nLocation: /app/\r\n"), "{text}");
        for path in ["/app/", "/app/x", "/plain", "/other"] {
            assert_eq!(ask(&mut c, &get(path)).0, 200, "{path}");
        }
        assert_eq!(ask(&mut c, &get("/apple")).0, 404);
    }

    #[test]
    fn try_files_takes_the_first_candidate_found_then_the_fallback() {
        let tf = |list: &[&str]| RouteOptions {
            try_files: list.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let mut c = serve(
            vec![
                with(
                    "/spa",
                    echo(),
                    tf(&["$uri", "$uri/index.html", "/spa/index.html"]),
                ),
                with("/missing", echo(), tf(&["$uri", "=410"])),
                with("/missing/loop", echo(), tf(&["$uri", "/missing/loop/x"])),
                with("/", echo(), RouteOptions::default()),
            ],
            |_| {},
        );
        let body = |c: &mut tern_server::testing::MemoryConn, p: &str| {
            ask(c, &get(p))
                .1
                .rsplit("\r\n\r\n")
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(body(&mut c, "/spa/app.js"), "saw /spa/app.js");
        assert_eq!(body(&mut c, "/spa/deep/link"), "saw /spa/index.html");
        assert_eq!(ask(&mut c, &get("/missing/x")).0, 410);
        assert_eq!(
            ask(&mut c, &get("/missing/loop/y")).0,
            500,
            "a fallback cycle ends"
        );
    }

    /// A folder asked for without its slash is redirected to it, as nginx's `try_files $uri
    /// $uri/` and a static route do, instead of its page answering under the bare name
    /// (WordPress's `/wp-admin`); each candidate still costs at most one lookup.
    #[test]
    fn try_files_redirects_a_folder_to_its_slashed_path() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static LOOKUPS: AtomicUsize = AtomicUsize::new(0);
        // Files as a static route answers: `/docs` and `/empty` are folders (301 to the
        // slashed path with the query), `/docs/` has an index, `/empty/` none.
        let files = Action::Handler(Arc::new(
            |req: &Request<'_>, _cx: &mut HandlerContext<'_>| -> Reply {
                LOOKUPS.fetch_add(1, Ordering::Relaxed);
                let path = req.path();
                match path {
                    "/docs" | "/empty" => {
                        let mut r = Response::text(301, "moved\n");
                        let query = req.query().map_or(String::new(), |q| format!("?{q}"));
                        r.push_header("Location", format!("{path}/{query}").as_bytes());
                        r.into()
                    }
                    "/docs/" | "/index.php" | "/a.txt" => {
                        let body = format!("saw {path}");
                        Response::new(200)
                            .with_body(Body::Shared(Bytes::from(body.into_bytes())))
                            .into()
                    }
                    _ => Response::text(404, "not found\n").into(),
                }
            },
        ));
        let mut c = serve(
            vec![with(
                "/",
                files,
                RouteOptions {
                    try_files: vec!["$uri".into(), "$uri/".into(), "/index.php".into()],
                    ..Default::default()
                },
            )],
            |_| {},
        );
        let (status, text) = ask(&mut c, &get("/docs?lang=en"));
        assert_eq!(status, 301, "{text}");
        assert!(text.contains("Location: /docs/?lang=en\r\n"), "{text}");
        // A folder with nothing to show is redirected too (nginx checks that it exists).
        assert_eq!(ask(&mut c, &get("/empty")).0, 301);
        // With its slash the folder answers; without one, a file is a file.
        assert!(ask(&mut c, &get("/docs/")).1.ends_with("saw /docs/"));
        assert!(ask(&mut c, &get("/a.txt")).1.ends_with("saw /a.txt"));
        // No file, no folder: the fallback, after one lookup for `$uri` and `$uri/` both.
        LOOKUPS.store(0, Ordering::Relaxed);
        assert!(ask(&mut c, &get("/articles/42"))
            .1
            .ends_with("saw /index.php"));
        assert_eq!(
            LOOKUPS.load(Ordering::Relaxed),
            2,
            "$uri, then the fallback"
        );
        LOOKUPS.store(0, Ordering::Relaxed);
        assert_eq!(ask(&mut c, &get("/docs")).0, 301);
        assert_eq!(LOOKUPS.load(Ordering::Relaxed), 1, "the redirect is $uri's");
        LOOKUPS.store(0, Ordering::Relaxed);
        assert!(ask(&mut c, &get("/articles/42/"))
            .1
            .ends_with("saw /index.php"));
        assert_eq!(
            LOOKUPS.load(Ordering::Relaxed),
            2,
            "$uri/ is $uri: asked once"
        );
    }

    #[test]
    fn error_pages_replace_tern_s_own_answers_only() {
        let mut c = serve(
            vec![
                with(
                    "/gone",
                    Action::Fixed(Fixed {
                        status: 404,
                        body: Bytes::from_static(b"mine"),
                        content_type: "text/plain".into(),
                    }),
                    RouteOptions::default(),
                ),
                with(
                    "/small",
                    echo(),
                    RouteOptions {
                        max_body: Some(4),
                        ..Default::default()
                    },
                ),
            ],
            |s| {
                s.error_pages = vec![
                    ErrorPage {
                        status: 404,
                        body: Bytes::from_static(b"<h1>lost</h1>"),
                        content_type: "text/html".into(),
                    },
                    ErrorPage {
                        status: 413,
                        body: Bytes::from_static(b"<h1>too big</h1>"),
                        content_type: "text/html".into(),
                    },
                ]
            },
        );
        let (status, text) = ask(&mut c, &get("/nowhere"));
        assert_eq!(status, 404);
        assert!(
            text.contains("Content-Type: text/html\r\n") && text.ends_with("<h1>lost</h1>"),
            "{text}"
        );
        assert!(
            ask(&mut c, &get("/gone")).1.ends_with("mine"),
            "a fixed route's body is its own"
        );
        let (status, text) = ask(
            &mut c,
            "POST /small HTTP/1.1\r\nHost: s.test\r\nContent-Length: 5\r\n\r\nhello",
        );
        assert_eq!(status, 413);
        assert!(text.ends_with("<h1>too big</h1>"), "{text}");
        assert_eq!(
            c.stats()
                .snapshot()
                .bad(tern_server::RequestError::BodyTooLarge),
            1,
            "a route's own body limit counts as the server's does"
        );
        let (status, _) = ask(
            &mut c,
            "POST /small HTTP/1.1\r\nHost: s.test\r\nContent-Length: 4\r\n\r\nhell",
        );
        assert_eq!(status, 200);
    }

    #[test]
    fn rate_limits_answer_429_with_retry_after() {
        let limiter = tern_services::PrefixLimiter::new(
            tern_services::RateLimitConfig {
                per_second: 1,
                burst: 2,
                buckets: 64,
                ..Default::default()
            },
            1,
        );
        let mut c = serve(
            vec![with(
                "/",
                echo(),
                RouteOptions {
                    rate_limit: Some(Arc::new(limiter)),
                    ..Default::default()
                },
            )],
            |_| {},
        );
        assert_eq!(ask(&mut c, &get("/a")).0, 200);
        assert_eq!(ask(&mut c, &get("/a")).0, 200);
        let (status, text) = ask(&mut c, &get("/a"));
        assert_eq!(status, 429);
        assert!(text.contains("Retry-After: 3\r\n"), "{text}");
        assert_eq!(
            c.stats().snapshot().get(tern_server::Counter::RateLimited),
            1
        );
    }

    /// Site-wide edits reach every answer of the site, tern's own included (no route, a
    /// refusal, an error page: nginx's `add_header ... always`), and a route's own go over
    /// them; fields by type follow the answer's final type (an error page's).
    #[test]
    fn site_headers_reach_every_answer_and_routes_override_them() {
        let limiter = tern_services::PrefixLimiter::new(
            tern_services::RateLimitConfig {
                per_second: 1,
                burst: 1,
                buckets: 64,
                ..Default::default()
            },
            1,
        );
        let mut own = with("/own", echo(), RouteOptions::default());
        own.headers = HeaderEdits {
            set: vec![("x-frame-options".into(), "SAMEORIGIN".into())],
            remove: vec!["X-Robots-Tag".into()],
            ..Default::default()
        };
        let routes = vec![
            own,
            with(
                "/limited",
                echo(),
                RouteOptions {
                    rate_limit: Some(Arc::new(limiter)),
                    ..Default::default()
                },
            ),
            with("/missing", echo(), RouteOptions::default()),
        ];
        let mut c = serve(routes, |s| {
            s.headers = HeaderEdits {
                set: vec![
                    ("X-Frame-Options".into(), "DENY".into()),
                    ("X-Robots-Tag".into(), "noindex".into()),
                ],
                by_type: vec![(
                    "text/html".into(),
                    vec![(
                        "Content-Security-Policy".into(),
                        "default-src 'none'".into(),
                    )],
                )],
                expires: vec![("*".into(), Expires::Max)],
                ..Default::default()
            };
            s.error_pages = vec![ErrorPage {
                status: 404,
                body: Bytes::from_static(b"<h1>lost</h1>"),
                content_type: "text/html".into(),
            }];
        });
        let (status, text) = ask(&mut c, &get("/nowhere"));
        assert_eq!(status, 404);
        assert!(
            text.contains("X-Frame-Options: DENY\r\n")
                && text.contains("X-Robots-Tag: noindex\r\n")
                && text.contains("Content-Security-Policy: default-src 'none'\r\n"),
            "no route: the site's edits, by the page's type: {text}"
        );
        assert!(
            !text.contains("Expires"),
            "an error is never made cacheable: {text}"
        );
        let (status, text) = ask(&mut c, &get("/missing/x"));
        assert_eq!(status, 404);
        assert!(text.contains("X-Frame-Options: DENY\r\n"), "{text}");
        let (_, text) = ask(&mut c, &get("/own"));
        assert!(text.contains("x-frame-options: SAMEORIGIN\r\n"), "{text}");
        assert!(
            !text.contains("DENY") && !text.contains("X-Robots-Tag"),
            "the route's own over the site's: {text}"
        );
        assert!(text.contains("Expires: Thu, 31 Dec 2037"), "{text}");
        assert_eq!(ask(&mut c, &get("/limited")).0, 200);
        let (status, text) = ask(&mut c, &get("/limited"));
        assert_eq!(status, 429);
        assert!(
            text.contains("X-Frame-Options: DENY\r\n"),
            "a refusal too: {text}"
        );
    }

    #[test]
    fn request_ids_are_made_or_taken_from_a_trusted_proxy() {
        let mut routes = vec![with("/", echo(), RouteOptions::default())];
        routes[0]
            .headers
            .set
            .push(("X-Request-Id".into(), "$request_id".into()));
        routes[0]
            .headers
            .set
            .push(("X-Seen".into(), "$scheme://$host $client".into()));
        let mut c = serve(routes, |s| {
            s.request_ids = Some(TrustedProxies::parse("192.0.2.0/24").unwrap())
        });
        // MemoryConn's peer is 192.0.2.1: trusted.
        let (_, text) = ask(
            &mut c,
            "GET / HTTP/1.1\r\nHost: S.test:81\r\nX-Request-Id: from-lb-1\r\n\r\n",
        );
        assert!(text.contains("X-Request-Id: from-lb-1\r\n"), "{text}");
        assert!(
            text.contains("X-Seen: http://s.test 192.0.2.1\r\n"),
            "{text}"
        );
        assert!(text.ends_with("saw / id=from-lb-1"), "{text}");
        let (_, text) = ask(
            &mut c,
            "GET / HTTP/1.1\r\nHost: s.test\r\nX-Request-Id: bad id\r\n\r\n",
        );
        let id = text
            .split("X-Request-Id: ")
            .nth(1)
            .unwrap()
            .split("\r\n")
            .next()
            .unwrap();
        assert_eq!(id.len(), 32, "{text}");
        let mut c = serve(vec![with("/", echo(), RouteOptions::default())], |s| {
            s.request_ids = Some(TrustedProxies::default())
        });
        let (_, text) = ask(
            &mut c,
            "GET / HTTP/1.1\r\nHost: s.test\r\nX-Request-Id: from-client\r\n\r\n",
        );
        assert!(
            !text.contains("from-client"),
            "an untrusted peer's id is replaced: {text}"
        );
    }

    // Internal routes and the hand-back of proxied requests (`handback.rs`), through a real
    // connection and a relay to an upstream the test plays.

    /// A route forwarding to the test's upstream (`tern_server::testing::MemoryUpstream`) its
    /// path and query as routed, as the proxy does.
    fn forward() -> Action {
        let up = Arc::new(tern_server::testing::MemoryUpstream::default());
        Action::Handler(Arc::new(
            move |req: &Request<'_>, _: &mut HandlerContext<'_>| -> Reply {
                let query = req.query().map_or(String::new(), |q| format!("?{q}"));
                let head = format!(
                    "{} {}{query} HTTP/1.1\r\nHost: upstream\r\n",
                    req.head.method_str,
                    req.path()
                );
                Reply::Forward(Box::new(tern_server::Forward {
                    upstreams: up.clone(),
                    head: head.into_bytes(),
                    idempotent: true,
                    upgrade: false,
                    edit: None,
                    own_answers: None,
                    max_body: u64::MAX,
                    wire: Default::default(),
                    not_before_ms: 0,
                    tee: None,
                    hold: None,
                    fallback: None,
                }))
            },
        ))
    }

    fn internal() -> RouteOptions {
        RouteOptions {
            internal: true,
            ..Default::default()
        }
    }

    /// Requests the relay sent upstream, by their request lines (the tests' bodies, lower
    /// case, may come right before one).
    fn request_lines(sent: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(sent)
            .split("\r\n")
            .filter(|l| l.ends_with(" HTTP/1.1"))
            .map(|l| l[l.find(|c: char| c.is_ascii_uppercase()).unwrap_or(0)..].to_string())
            .collect()
    }

    /// An internal route is not there for a client (404 as if no route took the path, its
    /// body, even one a proxy route would stream, read as usual so the connection goes on),
    /// but a rewrite or a `try_files` fallback reaches it.
    #[test]
    fn internal_routes_answer_only_what_tern_routes_again() {
        let tf = RouteOptions {
            try_files: vec!["$uri".into(), "/protected/fallback".into()],
            ..Default::default()
        };
        let mut c = serve(
            vec![
                with("/protected", fixed("secret"), internal()),
                with("/internal-api", forward(), internal()),
                with(
                    "/old",
                    Action::Rewrite("/protected/x".into()),
                    RouteOptions::default(),
                ),
                with("/spa", echo(), tf),
                with("/", fixed("public"), RouteOptions::default()),
            ],
            |_| {},
        );
        let (status, text) = ask(&mut c, &get("/protected/x"));
        assert_eq!(status, 404, "{text}");
        assert!(
            !text.contains("secret") && !text.contains("public"),
            "{text}"
        );
        let (status, text) = ask(
            &mut c,
            "POST /internal-api/x HTTP/1.1\r\nHost: s.test\r\nContent-Length: 3\r\n\r\nabc",
        );
        assert_eq!(status, 404, "{text}");
        assert_eq!(c.upstream_connections(), 0, "nothing reached the app");
        assert!(!c.is_closed(), "its body was read: the connection goes on");
        assert!(ask(&mut c, &get("/old")).1.ends_with("secret"), "a rewrite");
        assert!(
            ask(&mut c, &get("/spa/deep/x")).1.ends_with("secret"),
            "a fallback"
        );
        assert!(ask(&mut c, &get("/spa/app.js"))
            .1
            .ends_with("saw /spa/app.js"));
        assert!(ask(&mut c, &get("/other")).1.ends_with("public"));
    }

    /// The app's `X-Accel-Redirect` is followed on its site: to an internal fixed route, and
    /// to an internal proxy route (a second relay, the first connection reused), each counted
    /// in the row of the route that answered, with that route's header edits and the app's
    /// fields nginx carries over; a status in `reroute_status` is answered by its path (with
    /// that answer's own status); a route that does not follow the header passes the answer
    /// on without it.
    #[test]
    fn an_app_hands_requests_back_to_its_site() {
        let stats = tern_server::Stats::new(1);
        let site = stats.site("s");
        let counted = |label: &str, internal: bool| RouteOptions {
            counted_as: Some(stats.route(site, label)),
            internal,
            ..Default::default()
        };
        let app = RouteOptions {
            x_accel_redirect: true,
            reroute_status: vec![(404, "/protected/missing?from=app".into())],
            ..counted("app", false)
        };
        let mut edits = HeaderEdits::default();
        edits.set.push(("X-Served-By".into(), "protected".into()));
        let mut files = with("/protected", fixed("secret"), counted("files", true));
        files.headers = edits;
        let mut c = serve(
            vec![
                with("/app", forward(), app),
                files,
                with("/internal-api", forward(), counted("api", true)),
                with("/plain", forward(), RouteOptions::default()),
            ],
            |s| s.counted_as = site,
        )
        .with_stats(stats.clone());
        let accel = |to: &str| {
            format!(
                "HTTP/1.1 200 OK\r\nX-Accel-Redirect: {to}\r\nContent-Disposition: attachment\r\n\
                 Content-Type: application/pdf\r\nX-App: 1\r\nContent-Length: 3\r\n\r\napp"
            )
        };
        c.feed(get("/app/download").as_bytes());
        let sent = c.upstream_answers(&[accel("/protected/report.pdf").as_bytes()], 4096, false);
        assert_eq!(request_lines(&sent), ["GET /app/download HTTP/1.1"]);
        let text = String::from_utf8_lossy(&c.take_output()).into_owned();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nsecret"), "{text}");
        assert!(
            text.contains("\r\nContent-Type: application/pdf\r\n"),
            "{text}"
        );
        assert!(
            text.contains("\r\nContent-Disposition: attachment\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nX-Served-By: protected\r\n"), "{text}");
        assert!(
            !text.contains("X-App") && !text.contains("X-Accel"),
            "{text}"
        );

        c.feed(get("/app/data?q=1").as_bytes());
        let second = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndata";
        let sent = c.upstream_answers(
            &[accel("/internal-api/v1?k=2").as_bytes(), second],
            4096,
            false,
        );
        assert_eq!(
            request_lines(&sent),
            [
                "GET /app/data?q=1 HTTP/1.1",
                "GET /internal-api/v1?k=2 HTTP/1.1"
            ],
            "the handed-back request goes out as the path and query the app named"
        );
        assert_eq!(c.upstream_connections(), 1, "on the pooled connection");
        let text = String::from_utf8_lossy(&c.take_output()).into_owned();
        assert!(text.ends_with("\r\n\r\ndata"), "{text}");

        // A POST is handed back as a GET without its body, a HEAD as a HEAD; the fields of the
        // client's head go with them.
        c.feed(b"POST /app/form HTTP/1.1\r\nHost: s.test\r\nContent-Length: 3\r\n\r\nabc");
        let second = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let sent = c.upstream_answers(&[accel("/internal-api/p").as_bytes(), second], 4096, false);
        assert_eq!(
            request_lines(&sent),
            ["POST /app/form HTTP/1.1", "GET /internal-api/p HTTP/1.1"]
        );
        assert!(String::from_utf8_lossy(&c.take_output()).ends_with("\r\n\r\nok"));
        c.feed(b"HEAD /app/h HTTP/1.1\r\nHost: s.test\r\n\r\n");
        let sent = c.upstream_answers(&[accel("/internal-api/h").as_bytes(), second], 4096, false);
        assert_eq!(
            request_lines(&sent),
            ["HEAD /app/h HTTP/1.1", "HEAD /internal-api/h HTTP/1.1"]
        );
        let text = String::from_utf8_lossy(&c.take_output()).into_owned();
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\n") && text.ends_with("\r\n\r\n"),
            "{text}"
        );

        c.feed(get("/app/gone").as_bytes());
        c.upstream_answers(
            &[b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"],
            4096,
            false,
        );
        let text = String::from_utf8_lossy(&c.take_output()).into_owned();
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\n"),
            "the fallback's status: {text}"
        );
        assert!(text.ends_with("secret"), "{text}");

        c.feed(get("/plain").as_bytes());
        c.upstream_answers(&[accel("/protected/x").as_bytes()], 4096, false);
        let text = String::from_utf8_lossy(&c.take_output()).into_owned();
        assert!(
            text.ends_with("\r\n\r\napp"),
            "the app's own answer: {text}"
        );
        assert!(
            !text.contains("X-Accel"),
            "never sent to the client: {text}"
        );
        assert!(text.contains("X-App: 1"), "{text}");

        let s = stats.snapshot();
        let twos = |route: &str| s.answers_of("s", route).unwrap().responses[1];
        assert_eq!(twos("files"), 2, "the report and the 404's fallback");
        assert_eq!(twos("api"), 3, "the data, the POST and the HEAD");
        assert_eq!(twos("app"), 0, "answered by the routes it handed back to");
    }

    /// An app that keeps handing the request back ends, as a rewrite cycle does, with a 500
    /// after [`MAX_REROUTES`] hand-backs; an app that names a path with no canonical form gets
    /// a 502.
    #[test]
    fn hand_backs_are_bounded_and_checked() {
        let follows = RouteOptions {
            x_accel_redirect: true,
            ..Default::default()
        };
        let mut c = serve(
            vec![
                with("/app", forward(), follows),
                with(
                    "/loop",
                    forward(),
                    RouteOptions {
                        x_accel_redirect: true,
                        ..internal()
                    },
                ),
            ],
            |_| {},
        );
        let again = b"HTTP/1.1 200 OK\r\nX-Accel-Redirect: /loop\r\nContent-Length: 0\r\n\r\n";
        c.feed(get("/app").as_bytes());
        let sent = c.upstream_answers(&[&again[..]; 8], 4096, false);
        let lines = request_lines(&sent);
        assert_eq!(lines.len(), 1 + usize::from(MAX_REROUTES), "{lines:?}");
        let text = String::from_utf8_lossy(&c.take_output()).into_owned();
        assert!(text.starts_with("HTTP/1.1 500 "), "{text}");
        assert!(text.contains("internal redirection cycle"), "{text}");

        c.feed(get("/app").as_bytes());
        c.upstream_answers(
            &[b"HTTP/1.1 200 OK\r\nX-Accel-Redirect: /a/%2e%2e/%2e%2e/x\r\nContent-Length: 0\r\n\r\n"],
            4096,
            false,
        );
        let text = String::from_utf8_lossy(&c.take_output()).into_owned();
        assert!(text.starts_with("HTTP/1.1 502 "), "{text}");
    }

    #[test]
    fn reroute_status_entries_are_checked() {
        assert!(check_reroute_status(404, "/fallback?x=1").is_ok());
        for (status, target, want) in [
            (200, "/x", "not a status that can be rerouted"),
            (404, "fallback", "a path starting with /"),
            (404, "/a/../../x", "no canonical form"),
            (502, "/a b", "spaces"),
        ] {
            let e = check_reroute_status(status, target).unwrap_err();
            assert!(e.contains(want), "{status} {target}: {e}");
        }
        let bad = Site {
            routes: vec![with(
                "/",
                forward(),
                RouteOptions {
                    reroute_status: vec![(404, "x".into())],
                    ..Default::default()
                },
            )],
            ..site("s", &[], &[])
        };
        let e = SiteTable::new(vec![bad], None).err().unwrap();
        assert!(e.contains("reroute_status"), "{e}");
    }
}
