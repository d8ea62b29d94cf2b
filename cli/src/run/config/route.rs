//! One route: its kind (the key that names it) and the keys that go with the kind, its
//! `name`, and the options every kind takes (matchers, `try_files`, `max_body`,
//! `rate_limit`, `gate`, compression, header edits). Each kind's own checks are in its module.

use std::collections::BTreeMap;
use std::path::Path;

use super::compress::{check_compress_keys, check_compress_off, compress_policy};
use super::file::{RouteFile, RunFile, SiteFile};
use super::headers::check_headers;
use super::plan::{AppPlan, RouteKind, RouteOptionsPlan, RoutePlan};
use super::problems::{at, Problems};
use super::rate_limit::check_rate_limit;
use super::{app, cache, counters, fastcgi, files, proxy, redirect, respond, rewrite};

/// A key that only some route kinds take: its name, and where a route gives it.
pub(super) struct KindKey {
    pub name: &'static str,
    pub at: fn(&RouteFile) -> Option<usize>,
}

/// `kind_keys![a, b]`: the [`KindKey`]s of the [`RouteFile`] fields `a` and `b` (each key is
/// named as its field).
macro_rules! kind_keys {
    ($($key:ident),* $(,)?) => {
        &[$($crate::run::config::route::KindKey {
            name: stringify!($key),
            at: |route| $crate::run::config::problems::at(&route.$key),
        }),*]
    };
}
pub(super) use kind_keys;

/// Each kind and the keys it takes besides the one that names it, from the kinds' modules:
/// a key some kind takes is refused on a route of any kind that does not list it.
const KINDS: [(&str, &[&[KindKey]]); 8] = [
    ("static", &[files::KEYS]),
    (
        "fastcgi",
        &[
            files::KEYS,
            fastcgi::KEYS,
            proxy::UPSTREAM_KEYS,
            proxy::ANSWER_KEYS,
            cache::KEYS,
        ],
    ),
    (
        "proxy",
        &[
            proxy::KEYS,
            proxy::UPSTREAM_KEYS,
            proxy::ANSWER_KEYS,
            cache::KEYS,
        ],
    ),
    ("redirect", &[redirect::KEYS]),
    ("respond", &[respond::KEYS]),
    ("app", &[app::KEYS]),
    ("counters", &[counters::KEYS]),
    ("rewrite", &[]),
];

/// The server's `max_body` when neither file nor flag gives one (as `tern serve`).
const DEFAULT_MAX_BODY: u64 = 1024 * 1024;

/// A site's routes, each checked, with the line of each (its `path`); a route with problems is
/// left out. `site_compress`: the site's compression keys are usable.
pub(super) fn check_routes(
    site: &SiteFile,
    file: &RunFile,
    dir: &Path,
    site_compress: bool,
    p: &mut Problems<'_>,
    app: &mut Option<(AppPlan, usize)>,
) -> Vec<(usize, RoutePlan)> {
    // stored prefix → (line, the route has matchers beyond its path)
    let mut prefixes: BTreeMap<String, (usize, bool)> = BTreeMap::new();
    // route label → (line, given as a `name`)
    let mut labels: BTreeMap<String, (usize, bool)> = BTreeMap::new();
    let mut routes = Vec::new();
    for route in &site.route {
        let path_at = route.path.span().start;
        let prefix = route.path.get_ref();
        let mut options = check_route_options(route, file, p);
        let route_compress = check_compress_keys(route.compress_keys(), p);
        if site_compress && route_compress {
            let policy = compress_policy(route.compress_keys(), site.compress_keys());
            check_compress_off(route.compress_keys(), policy.is_some(), p);
            if let Some(o) = options.as_mut() {
                o.compress = policy;
            }
        }
        let has_matchers = [
            at(&route.methods),
            at(&route.match_headers),
            at(&route.match_query),
            at(&route.match_headers_regex),
            at(&route.path_glob),
            at(&route.path_regex),
        ]
        .iter()
        .any(Option::is_some);
        if !prefix.starts_with('/') {
            p.at(path_at, format!("path {prefix:?} must start with /"));
        } else if prefix
            .bytes()
            .any(|b| b.is_ascii_control() || b == b' ' || b == b'?' || b == b'#')
        {
            p.at(
                path_at,
                format!("path {prefix:?} must be a plain path (no spaces, ? or #)"),
            );
        } else {
            let stored = prefix.trim_end_matches('/').to_string();
            match prefixes.get(&stored) {
                Some((line, false)) => p.at(
                    path_at,
                    format!(
                        "path {prefix:?} is already routed on this site (line {line}) by a \
                         route with no other matcher, which takes every request first"
                    ),
                ),
                Some(_) if has_matchers => {}
                _ => {
                    prefixes.insert(stored, (p.line(path_at), has_matchers));
                }
            }
        }
        let label = check_route_name(route, &mut labels, p);
        let guarded = route.gate.as_ref().is_some_and(|g| *g.get_ref());
        if let (Some(g), true) = (&route.gate, guarded) {
            if file.gate.is_none() {
                p.at(
                    g.span().start,
                    "gate = true needs a gate config: add gate = \"gate.toml\" at the top",
                );
            }
        }
        if let Some(kind) = check_route(route, dir, p, app) {
            if guarded
                && !matches!(
                    kind,
                    RouteKind::Static(_)
                        | RouteKind::App
                        | RouteKind::Proxy(_)
                        | RouteKind::FastCgi { .. }
                )
            {
                p.at(path_at, "gate = true is for static, app and proxy routes");
            }
            let headers = check_headers(route.header_keys(), p);
            let cache = cache::check_cache(route, file, p);
            if let Some(options) = options {
                routes.push((
                    p.line(path_at),
                    RoutePlan {
                        prefix: prefix.clone(),
                        label,
                        kind,
                        headers,
                        guarded,
                        options,
                        cache,
                    },
                ));
            }
        }
    }
    routes
}

/// The longest route `name`: a label value of every series of the route.
const MAX_ROUTE_NAME: usize = 64;

/// A route's label (its `name`, or its path as written), checked: a name is 1 to
/// [`MAX_ROUTE_NAME`] of `A-Z a-z 0-9 _ . : / -`, not the shared row's `_other`, and no two
/// routes of a site have one label unless both go by their path (routes of one path told
/// apart by matchers share their series then, by choice). `labels`: the site's so far.
fn check_route_name(
    route: &RouteFile,
    labels: &mut BTreeMap<String, (usize, bool)>,
    p: &mut Problems<'_>,
) -> String {
    let (label, at, named) = match &route.name {
        Some(name) => (name.get_ref().clone(), name.span().start, true),
        None => (route.path.get_ref().clone(), route.path.span().start, false),
    };
    if named {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_.:/-".contains(c);
        if label.is_empty() || label.len() > MAX_ROUTE_NAME {
            p.at(
                at,
                format!("route name {label:?} must be 1 to {MAX_ROUTE_NAME} characters"),
            );
            return label;
        }
        if let Some(c) = label.chars().find(|&c| !allowed(c)) {
            p.at(
                at,
                format!(
                    "route name {label:?} has {c:?}: use A-Z a-z 0-9 and _ . : / - (it is a \
                     label value on /metrics)"
                ),
            );
            return label;
        }
        if label == tern_server::OTHER {
            p.at(
                at,
                format!("route name {label:?} is what /metrics calls the routes past its bound"),
            );
            return label;
        }
    }
    match labels.get(&label) {
        Some(&(line, earlier_named)) if named || earlier_named => {
            let what = if named { "name" } else { "path" };
            let other = if earlier_named { "name" } else { "path" };
            p.at(
                at,
                format!(
                    "route {what} {label:?} is the {other} of another route of this site (line \
                     {line}): their figures on /metrics would be one series; give one a name \
                     of its own"
                ),
            );
        }
        Some(_) => {}
        None => {
            labels.insert(label.clone(), (p.line(at), named));
        }
    }
    label
}

/// The route's kind, with its own keys checked; `None` when it has problems.
fn check_route(
    route: &RouteFile,
    dir: &Path,
    p: &mut Problems<'_>,
    app: &mut Option<(AppPlan, usize)>,
) -> Option<RouteKind> {
    let path_at = route.path.span().start;
    let kinds: Vec<(&str, usize)> = [
        ("static", at(&route.static_root)),
        ("redirect", at(&route.redirect)),
        ("respond", at(&route.respond)),
        ("app", at(&route.app)),
        ("proxy", at(&route.proxy)),
        ("counters", at(&route.counters)),
        ("rewrite", at(&route.rewrite)),
    ]
    .into_iter()
    .filter_map(|(k, at)| at.map(|at| (k, at)))
    .collect();
    // `fastcgi` goes with `static` (the document root): a route of its own kind.
    let fastcgi = route.fastcgi.as_ref().map(|f| f.span().start);
    let kind = match kinds.as_slice() {
        [("static", _)] if fastcgi.is_some() => "fastcgi",
        [] if fastcgi.is_some() => {
            p.at(
                fastcgi.unwrap_or(path_at),
                "`fastcgi` needs `static`: the folder its scripts (and the other files) are in",
            );
            return None;
        }
        [] => {
            p.at(
                path_at,
                "a route needs one of `static`, `redirect`, `respond`, `app`, `proxy`, `counters` or `rewrite`",
            );
            return None;
        }
        [(one, _)] => *one,
        [(first, _), (second, at), ..] => {
            p.at(
                *at,
                format!("a route has one kind, but both `{first}` and `{second}` are given"),
            );
            return None;
        }
    };
    // Keys that belong to one kind or two; any other kind must not have them.
    let (_, takes) = KINDS.iter().find(|(name, _)| *name == kind)?;
    let takes = |key: &KindKey| {
        takes
            .iter()
            .any(|list| list.iter().any(|k| k.name == key.name))
    };
    // Keys of other kinds, in the order the file gives them.
    let mut refused: Vec<(usize, &str)> = KINDS
        .iter()
        .flat_map(|(_, lists)| lists.iter().copied().flatten())
        .filter(|key| !takes(key))
        .filter_map(|key| (key.at)(route).map(|at| (at, key.name)))
        .collect();
    refused.sort_unstable();
    refused.dedup();
    for (at, key) in &refused {
        p.at(*at, format!("`{key}` does not apply to a {kind} route"));
    }
    let kind = match kind {
        "static" => files::check_static(route, dir, p),
        "redirect" => redirect::check_redirect(route, p),
        "respond" => respond::check_respond(route, p),
        "proxy" => proxy::check_proxy(route, dir, p),
        "fastcgi" => fastcgi::check_fastcgi(route, dir, p),
        "counters" => counters::check_counters(route, p),
        "rewrite" => rewrite::check_rewrite_kind(route, p),
        _ => app::check_app(route, dir, p, app),
    };
    kind.filter(|_| refused.is_empty())
}

/// Matchers, `try_files`, `strip_prefix`, `max_body` and `rate_limit`; `None` when one is
/// unusable (each problem recorded).
fn check_route_options(
    route: &RouteFile,
    file: &RunFile,
    p: &mut Problems<'_>,
) -> Option<RouteOptionsPlan> {
    let mut ok = true;
    let mut plan = RouteOptionsPlan::default();
    let path_at = route.path.span().start;
    if let Some(m) = &route.methods {
        plan.matchers.methods = m.get_ref().clone();
    }
    if let Some(h) = &route.match_headers {
        plan.matchers.headers = h.get_ref().clone().into_iter().collect();
    }
    if let Some(q) = &route.match_query {
        plan.matchers.query = q.get_ref().clone().into_iter().collect();
    }
    plan.matchers.path_glob = route.path_glob.as_ref().map(|g| g.get_ref().clone());
    plan.matchers.path_regex = route.path_regex.as_ref().map(|r| r.get_ref().clone());
    // The same checks the site table makes, here with the key's line.
    if let Err(e) = tern_vhost::compile_pattern(
        plan.matchers.path_glob.as_deref(),
        plan.matchers.path_regex.as_deref(),
    ) {
        let at = at(&route.path_regex)
            .or(at(&route.path_glob))
            .unwrap_or(path_at);
        p.at(at, e);
        ok = false;
    }
    if let Some(h) = &route.match_headers_regex {
        for (name, pattern) in h.get_ref() {
            let one = tern_vhost::MatchSpec {
                header_patterns: vec![(name.clone(), pattern.clone())],
                ..Default::default()
            };
            match tern_vhost::check_matchers(&one) {
                Ok(()) => plan
                    .matchers
                    .header_patterns
                    .push((name.clone(), pattern.clone())),
                Err(e) => {
                    p.at(h.span().start, format!("match_headers_regex: {e}"));
                    ok = false;
                }
            }
        }
    }
    let only = |m: &tern_vhost::MatchSpec| tern_vhost::MatchSpec {
        path_glob: None,
        path_regex: None,
        header_patterns: Vec::new(),
        ..m.clone()
    };
    if let Err(e) = tern_vhost::check_matchers(&only(&plan.matchers)) {
        let at = at(&route.methods)
            .or(at(&route.match_headers))
            .or(at(&route.match_query))
            .unwrap_or(path_at);
        p.at(at, e);
        ok = false;
    }
    if let Some(list) = &route.try_files {
        match tern_vhost::check_try_files(list.get_ref()) {
            Ok(()) => plan.try_files = list.get_ref().clone(),
            Err(e) => {
                p.at(list.span().start, e);
                ok = false;
            }
        }
    }
    plan.strip_prefix = route.strip_prefix.as_ref().is_some_and(|v| *v.get_ref());
    plan.allow_encoded_slash = route
        .allow_encoded_slash
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    plan.internal = route.internal.as_ref().is_some_and(|v| *v.get_ref());
    plan.x_accel_redirect = route
        .x_accel_redirect
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    if let Some(table) = &route.reroute_status {
        for (code, target) in table.get_ref() {
            let checked = code
                .parse::<u16>()
                .map_err(|_| format!("reroute_status: {code:?} is not a status"))
                .and_then(|status| {
                    tern_vhost::check_reroute_status(status, target).map(|()| status)
                });
            match checked {
                Ok(status) => plan.reroute_status.push((status, target.clone())),
                Err(e) => {
                    p.at(table.span().start, e);
                    ok = false;
                }
            }
        }
    }
    if let Some(max) = &route.max_body {
        let server = file.server_keys().max_body.unwrap_or(DEFAULT_MAX_BODY);
        if *max.get_ref() > server && route.proxy.is_none() {
            p.at(
                max.span().start,
                format!(
                    "max_body {} is above the server's max_body {server}: only a proxy route \
                     (which streams bodies) may take more than the server does",
                    max.get_ref()
                ),
            );
            ok = false;
        }
        plan.max_body = Some(*max.get_ref());
    }
    if let Some(limit) = &route.rate_limit {
        match check_rate_limit(limit, route, p) {
            Some(limit) => plan.rate_limit = Some(limit),
            None => ok = false,
        }
    }
    ok.then_some(plan)
}

/// `internal = true` on a route nothing of its site can route a request to: no rewrite, no
/// `try_files` fallback, no app that hands requests back (`x_accel_redirect`,
/// `reroute_status`). Every request would get 404 there.
pub(super) fn check_internal(routes: &[RouteFile], p: &mut Problems<'_>) {
    let reroutes = routes.iter().any(|r| {
        r.rewrite.is_some()
            || r.try_files.is_some()
            || r.x_accel_redirect.as_ref().is_some_and(|v| *v.get_ref())
            || r.reroute_status.is_some()
    });
    if reroutes {
        return;
    }
    for route in routes {
        if let Some(key) = route.internal.as_ref().filter(|v| *v.get_ref()) {
            p.at(
                key.span().start,
                "internal = true: nothing on this site routes a request here (a rewrite, a \
                 try_files fallback, x_accel_redirect or reroute_status on a proxy or PHP \
                 route), so every request would get 404",
            );
        }
    }
}

/// `allow_encoded_slash`: the route is chosen and judged with `%2F` inside its segment,
/// while the upstream (or anything behind it) may decode it into a separator. That is one
/// view only if nothing beneath the route's prefix could decide otherwise on the decoded
/// path: no narrower route of the site, no path pattern on a route of its prefix, and no
/// gate (whose rules, in their own file, may name paths beneath it).
pub(super) fn check_encoded_slash(routes: &[RouteFile], p: &mut Problems<'_>) {
    // The stored form the site table compares: canonical, decoded, no trailing slash.
    let stored = |r: &RouteFile| -> Option<Vec<u8>> {
        let canonical = tern_server::canonical_path(r.path.get_ref()).ok()?;
        let decoded = tern_server::decoded_path(&canonical);
        let mut d: &[u8] = &decoded;
        while let [rest @ .., b'/'] = d {
            d = rest;
        }
        Some(d.to_vec())
    };
    for route in routes {
        let Some(key) = &route.allow_encoded_slash else {
            continue;
        };
        if !*key.get_ref() {
            continue;
        }
        let at = key.span().start;
        let Some(mine) = stored(route) else {
            continue; // its path is refused on its own line
        };
        if route.gate.as_ref().is_some_and(|g| *g.get_ref()) {
            p.at(
                at,
                "allow_encoded_slash cannot go with gate = true: the gate's rules name paths \
                 an upstream that decodes %2F could read differently",
            );
        }
        for other in routes {
            let Some(theirs) = stored(other) else {
                continue;
            };
            let line = p.line(other.path.span().start);
            if theirs != mine && tern_server::path_under(&mine, &theirs) {
                p.at(
                    at,
                    format!(
                        "allow_encoded_slash: route {:?} (line {line}) lies beneath this one: \
                         a path with %2F decoded could be its, so the two cannot be told apart \
                         on one view of the path",
                        other.path.get_ref()
                    ),
                );
            } else if theirs == mine && (other.path_regex.is_some() || other.path_glob.is_some()) {
                p.at(
                    at,
                    format!(
                        "allow_encoded_slash: a path pattern on route {:?} (line {line}) could \
                         match a path with %2F decoded differently",
                        other.path.get_ref()
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::RouteKind;
    use super::super::{
        parse,
        testing::{dir, problems},
    };

    #[test]
    fn routes_are_labelled_by_name_or_path_and_bad_names_refused_with_their_line() {
        let d = dir();
        let ok = "[[site]]\nname = \"a\"\nhosts = [\"a.test\"]\n\
                  [[site.route]]\npath = \"/api\"\nmethods = [\"POST\"]\nrespond = \"y\"\nname = \"api.write:v2/x-y_z\"\n\
                  [[site.route]]\npath = \"/api/\"\nrespond = \"x\"\n\
                  [[site.route]]\npath = \"/\"\nrespond = \"z\"\n\
                  [[site]]\nname = \"b\"\nhosts = [\"b.test\"]\n\
                  [[site.route]]\npath = \"/\"\nrespond = \"z\"\nname = \"api.write:v2/x-y_z\"\n";
        let c = parse(ok, d.path()).unwrap();
        let labels: Vec<&str> = c.sites[0].routes.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["api.write:v2/x-y_z", "/api/", "/"],
            "or the path as written"
        );
        assert_eq!(
            c.sites[1].routes[0].label, "api.write:v2/x-y_z",
            "names are per site"
        );
        let route = |extra: &str| {
            format!(
                "[[site]]\nname = \"a\"\nhosts = [\"a.test\"]\n\
                 [[site.route]]\npath = \"/x\"\nrespond = \"x\"\nname = \"first\"\n\
                 [[site.route]]\npath = \"/\"\nrespond = \"y\"\n{extra}\n"
            )
        };
        let long = "n".repeat(65);
        for (extra, want) in [
            ("name = \"a b\"", "line 11: route name \"a b\" has ' '"),
            ("name = \"café\"", "line 11: route name \"café\" has 'é'"),
            (
                "name = \"a{x=\\\"\"",
                "line 11: route name \"a{x=\\\"\" has '{'",
            ),
            (
                "name = \"\"",
                "line 11: route name \"\" must be 1 to 64 characters",
            ),
            (&format!("name = \"{long}\""), "must be 1 to 64 characters"),
            (
                "name = \"_other\"",
                "line 11: route name \"_other\" is what /metrics calls",
            ),
            (
                "name = \"first\"",
                "line 11: route name \"first\" is the name of another route of this site (line 7)",
            ),
        ] {
            let e = problems(&route(extra));
            assert_eq!(e.len(), 1, "{extra}: {e:?}");
            assert!(
                e[0].starts_with(want) || e[0].contains(want),
                "{extra}: {e:?}"
            );
        }
        // A name that is an earlier unnamed route's path; a named route's path is free.
        let e = problems(&route("name = \"/x\"").replace("name = \"first\"\n", ""));
        assert_eq!(
            e,
            [
                "line 10: route name \"/x\" is the path of another route of this site (line 5): \
              their figures on /metrics would be one series; give one a name of its own"
            ]
        );
        parse(&route("name = \"/x\""), d.path()).unwrap();
        // An unnamed route whose path is an earlier route's name.
        let text = route("")
            .replace("name = \"first\"", "name = \"/y\"")
            .replace("path = \"/\"", "path = \"/y\"");
        assert_eq!(
            problems(&text),
            [
                "line 9: route path \"/y\" is the name of another route of this site (line 7): \
              their figures on /metrics would be one series; give one a name of its own"
            ]
        );
    }

    #[test]
    fn keys_of_other_kinds_are_refused_in_the_order_of_the_file() {
        let route = "[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\n";
        let e = problems(&format!(
            "{route}respond = \"x\"\nretries = 2\nkeep_path = true\nproxy_host = \"h\"\nstatus = 200\n"
        ));
        assert_eq!(
            e,
            [
                "line 7: `retries` does not apply to a respond route",
                "line 8: `keep_path` does not apply to a respond route",
                "line 9: `proxy_host` does not apply to a respond route",
            ]
        );
        // A PHP route takes a static route's keys and its servers' (as a proxy's), but not the
        // keys of a proxy alone.
        let e = problems(&format!(
            "{route}static = \"site\"\nfastcgi = \"127.0.0.1:9000\"\ncache_control = \"no-cache\"\n\
             retries = 1\nindex = \"index.php\"\nstrip_prefix = true\n"
        ));
        assert_eq!(
            e,
            ["line 11: `strip_prefix` does not apply to a fastcgi route"]
        );
    }

    #[test]
    fn routing_keys_become_a_plan() {
        let d = dir();
        std::fs::write(d.path().join("404.html"), "<h1>lost</h1>").unwrap();
        let text = r#"
[[site]]
name = "app"
default = true
request_id = true
request_id_trusted = "10.0.0.0/8"
error_pages = { 404 = "404.html" }

[[site.route]]
path = "/"
static = "site"
try_files = ["$uri", "$uri/index.html", "/index.html"]
add_headers = { "X-Request-Id" = "$request_id" }

[[site.route]]
path = "/api"
proxy = "127.0.0.1:9"
strip_prefix = true
max_body = 10000000
rate_limit = { per_second = 5, burst = 10 }
add_request_headers = { "X-Real-IP" = "$client", "X-Scheme" = "$scheme" }
remove_request_headers = ["Cookie"]

[[site.route]]
path = "/u"
path_regex = "^/u/([0-9]+)$"
methods = ["GET"]
match_headers = { "Accept" = "*" }
match_query = { "v" = "2" }
match_headers_regex = { "User-Agent" = '(?i)^DavClnt.*$' }
rewrite = "/api/users/$1"
"#;
        let c = parse(text, d.path()).unwrap();
        assert_eq!(
            c.sites[0].routes[2].options.matchers.header_patterns,
            [("User-Agent".to_string(), "(?i)^DavClnt.*$".to_string())]
        );
        let site = &c.sites[0];
        assert!(site.request_ids.is_some());
        assert_eq!(site.error_pages[0].status, 404);
        assert_eq!(site.error_pages[0].content_type, "text/html; charset=utf-8");
        assert_eq!(site.routes[0].options.try_files.len(), 3);
        let api = &site.routes[1];
        assert!(api.options.strip_prefix);
        assert_eq!(api.options.max_body, Some(10_000_000));
        assert_eq!(api.options.rate_limit.as_ref().unwrap().burst, 10);
        match &api.kind {
            RouteKind::Proxy(plan) => {
                assert_eq!(plan.options.request_headers.set.len(), 2);
                assert_eq!(plan.options.request_headers.remove, ["Cookie"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&site.routes[2].kind, RouteKind::Rewrite(t) if t == "/api/users/$1"));
        assert_eq!(site.routes[2].options.matchers.methods, ["GET"]);
    }

    #[test]
    fn routing_keys_are_refused_with_their_lines() {
        let text = r#"[[site]]
name = "a"
default = true
error_pages = { 200 = "x.html", 500 = "missing.html" }
request_id_trusted = "10.0.0.0/8"
[[site.route]]
path = "/"
static = "site"
try_files = ["$uri", "$uri"]
add_headers = { "X-Id" = "$request_id", "X-Bad" = "$remote_addr" }
max_body = 99999999
[[site.route]]
path = "/p"
proxy = "127.0.0.1:9"
path_regex = "/p/.*"
add_request_headers = { "Host" = "x" }
rate_limit = { per_second = 0 }
[[site.route]]
path = "/r"
respond = "x"
strip_prefix = true
[[site.route]]
path = "/a"
rewrite = "/b"
[[site.route]]
path = "/b"
rewrite = "/a/x"
[[site.route]]
path = "/m"
methods = ["get"]
respond = "x"
[[site.route]]
path = "/m"
respond = "y"
[[site.route]]
path = "/m"
respond = "z"
[[site.route]]
path = "/c"
rewrite = "/c/$2"
path_regex = "^/c/(.*)$"
[[site.route]]
path = "/h"
respond = "x"
match_headers_regex = { "User-Agent" = "DavClnt" }
"#;
        let e = problems(text);
        let want = [
            "line 4: error_pages: \"200\" is not an error status",
            "line 4: error page ",
            "line 5: request_id_trusted needs request_id = true",
            "line 9: try_files fallback \"$uri\" routes the request to itself",
            "line 10: add_headers: X-Bad: \"$remote_addr\": unknown variable $remote_addr",
            "line 10: add_headers: $request_id needs request_id = true",
            "line 11: max_body 99999999 is above the server's max_body",
            "line 15: path_regex \"/p/.*\" must be anchored",
            "line 16: add_request_headers: \"Host\" is set with proxy_host",
            "line 17: rate_limit: per_second and burst must be at least 1",
            "line 21: `strip_prefix` does not apply to a respond route",
            "line 23: rewrite loop: line 23 -> line 26 -> line 23",
            "line 30: method \"get\" is not an upper-case method token",
            "line 36: path \"/m\" is already routed on this site (line 33) by a route with no other matcher",
            "line 40: rewrite: \"/c/$2\": $2 names no group",
            "line 45: match_headers_regex: the pattern of header User-Agent \"DavClnt\" must be anchored",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }

    #[test]
    fn internal_routes_and_hand_backs_are_checked_with_their_lines() {
        let d = dir();
        let good = r#"[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
proxy = "127.0.0.1:9"
x_accel_redirect = true
reroute_status = { 404 = "/fallback?from=app", 502 = "/down" }
[[site.route]]
path = "/protected/"
static = "site"
internal = true
"#;
        let c = parse(good, d.path()).unwrap();
        let app = &c.sites[0].routes[0].options;
        assert!(app.x_accel_redirect && !app.internal);
        assert_eq!(
            app.reroute_status,
            [
                (404, "/fallback?from=app".to_string()),
                (502, "/down".to_string())
            ]
        );
        assert!(c.sites[0].routes[1].options.internal);
        let text = r#"[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
static = "site"
x_accel_redirect = true
[[site.route]]
path = "/p"
proxy = "127.0.0.1:9"
reroute_status = { 200 = "/x", abc = "/y", 404 = "y", 410 = "/a/../../b" }
[[site.route]]
path = "/r"
respond = "x"
reroute_status = { 404 = "/x" }
[[site]]
name = "b"
hosts = ["b.test"]
[[site.route]]
path = "/hidden"
respond = "x"
internal = true
"#;
        let e = problems(text);
        let want = [
            "line 7: `x_accel_redirect` does not apply to a static route",
            "line 11: reroute_status: 200 is not a status that can be rerouted (300-599)",
            "line 11: reroute_status: 404 = \"y\": a path starting with / is needed",
            "line 11: reroute_status: 410 = \"/a/../../b\": the path has no canonical form",
            "line 11: reroute_status: \"abc\" is not a status",
            "line 15: `reroute_status` does not apply to a respond route",
            "line 22: internal = true: nothing on this site routes a request here",
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
