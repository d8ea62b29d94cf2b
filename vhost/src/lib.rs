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
mod tests;
