//! tern-vhost: several sites behind one server (layer 5 of DESIGN.md: "a site, chosen by
//! Host/SNI, is a list of routes").
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

mod host;
mod route;

use std::sync::Arc;

use arc_swap::ArcSwap;
use tern_server::{
    Handler, HandlerContext, LogTarget, Reply, Request, RequestHead, Response, SiteSlot,
};

pub use host::{normalize_pattern, PatternError};
pub use route::{Action, Fixed, HeaderEdits, Redirect};

use host::HostTable;
use route::BuiltRoute;

/// One route of a site.
pub struct Route {
    /// A path prefix starting with `/`; matched on segment boundaries, a trailing slash
    /// ignored.
    pub prefix: String,
    pub action: Action,
    pub headers: HeaderEdits,
}

/// One site: the host patterns that choose it and its routes.
pub struct Site {
    pub name: String,
    /// Normalised patterns (see [`normalize_pattern`]).
    pub hosts: Vec<String>,
    pub routes: Vec<Route>,
    /// The access log its requests' lines go to.
    pub log: LogTarget,
    /// Where its answers are counted (`Stats::site`), for /metrics' `site` label.
    pub counted_as: SiteSlot,
}

struct BuiltSite {
    name: String,
    log: LogTarget,
    counted_as: SiteSlot,
    /// Longest prefix first, so the first match is the most specific.
    routes: Vec<BuiltRoute>,
}

/// Every site, prebuilt for matching.
pub struct SiteTable {
    hosts: HostTable,
    sites: Vec<BuiltSite>,
    /// The site for a Host no site names (and for requests without one); `None`: 421.
    default: Option<usize>,
}

impl SiteTable {
    /// Builds the table; `default` indexes `sites`. Errors name the site: a host claimed
    /// twice, a pattern that is not normalised, a prefix not starting with `/` or given twice.
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
            let mut routes: Vec<BuiltRoute> = Vec::with_capacity(site.routes.len());
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
                let route = BuiltRoute::new(&decoded, r.action, &r.headers);
                if routes.iter().any(|other| other.prefix == route.prefix) {
                    return Err(format!(
                        "site {}: prefix {} is given twice",
                        site.name, r.prefix
                    ));
                }
                routes.push(route);
            }
            // Stable: equal lengths cannot both match one path, so order among them is moot.
            routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
            built.push(BuiltSite {
                name: site.name,
                log: site.log,
                counted_as: site.counted_as,
                routes,
            });
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

    fn site_for(&self, host: Option<&[u8]>) -> Option<&BuiltSite> {
        let index = host.and_then(|h| self.hosts.find(h)).or(self.default)?;
        self.sites.get(index)
    }

    /// The prefix (stored form: decoded, `/` as "") of the route a path takes on a site.
    pub fn route_prefix(&self, host: Option<&[u8]>, path: &str) -> Option<String> {
        let site = self.site_for(host)?;
        route_for(site, path).map(|r| String::from_utf8_lossy(&r.prefix).into_owned())
    }

    /// Whether the route this head takes streams request bodies (a proxy route).
    fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        self.site_for(head.host)
            .and_then(|site| route_for(site, &head.path))
            .is_some_and(|route| route.streams_body(head))
    }

    fn answer(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        let Some(site) = self.site_for(req.head.host) else {
            return Response::text(421, "misdirected request: no site here for this host\n").into();
        };
        cx.log_to(site.log);
        cx.count_as(site.counted_as);
        match route_for(site, req.path()) {
            Some(route) => route.answer(req, cx),
            None => Response::text(404, "not found\n").into(),
        }
    }
}

/// The route for a canonical path ([`RequestHead::path`]): the same value the gate judges,
/// the static handler opens and the proxy forwards, so no spelling of a path can reach a
/// route other than the one its segments name.
fn route_for<'s>(site: &'s BuiltSite, path: &str) -> Option<&'s BuiltRoute> {
    // Compared decoded (safe on a canonical path: no escape can become a separator), so a
    // prefix matches every spelling of its name; borrowed unless the path holds a `%`.
    let decoded = tern_server::decoded_path(path);
    site.routes
        .iter()
        .find(|r| tern_server::path_under(&r.prefix, &*decoded))
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
            counted_as: SiteSlot::NONE,
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
}
