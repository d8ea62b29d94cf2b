//! The `tern run --config FILE` file: server settings, `[tls]` (as for `tern serve`), and
//! `[[site]]` entries with their `[[site.route]]`s. `examples/tern.toml` shows every key.
//!
//! Checking collects every problem it can find (not just the first), each as
//! `config FILE: line N: what`, so `tern run --check` lists them all. Only a TOML syntax or
//! type error stops early, since the rest of the file cannot be read past it.
//!
//! `file.rs` is the schema, `plan.rs` what a checked file becomes. This module walks the
//! sites; `route.rs` checks a route and hands its kind to the kind's module (`files.rs`
//! for `static`, `redirect.rs`, `respond.rs`, `app.rs`, `proxy.rs`, `fastcgi.rs`,
//! `counters.rs`, `rewrite.rs`), each of which lists the keys it takes. A new key of one
//! kind goes in `file.rs` and in that kind's module.

mod app;
mod cache;
mod compress;
mod counters;
mod fastcgi;
mod file;
mod files;
mod headers;
mod plan;
mod problems;
mod proxy;
mod rate_limit;
mod redirect;
mod respond;
mod rewrite;
mod route;
mod server;
mod site;

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::describe;
pub use cache::CachePlan;
use compress::{check_compress_keys, compress_policy, CompressKeys};
use file::RunFile;
use headers::check_headers;
pub use plan::{AppPlan, RouteKind, RoutePlan, RunConfig, SiteLog, SitePlan};
use problems::Problems;

/// Reads and checks a file; every problem as `config FILE: line N: what`.
pub fn load(path: &Path) -> Result<RunConfig, Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("config {}: cannot read: {e}", path.display())])?;
    let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    parse(&text, &dir).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| format!("config {}: {p}", path.display()))
            .collect()
    })
}

/// Parses and checks file text; relative paths are taken from `dir`.
pub fn parse(text: &str, dir: &Path) -> Result<RunConfig, Vec<String>> {
    let file: RunFile = toml::from_str(text).map_err(|e| vec![describe(text, &e)])?;
    let mut p = Problems::new(text);
    server::check_server_keys(&file, &mut p);
    let control_group = server::check_control_group(&file, &mut p);
    if file.site.is_empty() {
        p.list
            .push("no [[site]]: the file serves nothing (see examples/tern.toml)".into());
    }
    let mut sites = Vec::new();
    let mut default_site: Option<(usize, String, usize)> = None;
    // name → line; host → (site name, line)
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut hosts: BTreeMap<String, (String, usize)> = BTreeMap::new();
    let mut app: Option<(AppPlan, usize)> = None;
    cache::check_unused(&file, &mut p);
    for (index, site) in file.site.iter().enumerate() {
        let name = site.name.get_ref().clone();
        let name_at = site.name.span().start;
        if name.trim().is_empty() {
            p.at(name_at, "a site's name must not be empty");
        } else if let Some(line) = names.get(&name) {
            p.at(
                name_at,
                format!("site name {name:?} is already used (line {line})"),
            );
        } else {
            names.insert(name.clone(), p.line(name_at));
        }
        let mut patterns = Vec::new();
        for host in &site.hosts {
            match tern_vhost::normalize_pattern(host.get_ref()) {
                Err(e) => p.at(host.span().start, format!("host {:?} {e}", host.get_ref())),
                Ok(pattern) => match hosts.get(&pattern) {
                    Some((other, line)) => p.at(
                        host.span().start,
                        format!("host {pattern} is already taken by site {other:?} (line {line})"),
                    ),
                    None => {
                        hosts.insert(pattern.clone(), (name.clone(), p.line(host.span().start)));
                        patterns.push(pattern);
                    }
                },
            }
        }
        let is_default = site.default.as_ref().is_some_and(|d| *d.get_ref());
        if is_default {
            let at = site.default.as_ref().map_or(name_at, |d| d.span().start);
            match &default_site {
                Some((_, other, line)) => p.at(
                    at,
                    format!("two default sites: {other:?} (line {line}) and {name:?}"),
                ),
                None => default_site = Some((index, name.clone(), p.line(at))),
            }
        }
        if site.hosts.is_empty() && !is_default {
            p.at(
                name_at,
                format!("site {name:?} has no hosts and is not the default: nothing chooses it"),
            );
        }
        if site.route.is_empty() {
            p.at(name_at, format!("site {name:?} has no [[site.route]]"));
        }
        let site_compress = check_compress_keys(site.compress_keys(), &mut p);
        let site_policy = compress_policy(site.compress_keys(), CompressKeys::default());
        let routes = route::check_routes(site, &file, dir, site_compress, &mut p, &mut app);
        site::check_request_id_uses(site, &mut p);
        rewrite::check_loops(&routes, &mut p);
        route::check_encoded_slash(&site.route, &mut p);
        route::check_internal(&site.route, &mut p);
        let routes: Vec<RoutePlan> = routes.into_iter().map(|(_, r)| r).collect();
        let error_pages = site::check_error_pages(site, dir, &mut p);
        let request_ids = site::check_request_ids(site, &mut p);
        let log = site::check_log(site, dir, &mut p);
        let headers = check_headers(site.header_keys(), &mut p);
        sites.push(SitePlan {
            name,
            hosts: patterns,
            routes,
            log,
            error_pages,
            request_ids,
            compress: site_policy.filter(|_| site_compress),
            headers,
        });
    }
    if !p.list.is_empty() {
        return Err(p.list);
    }
    Ok(RunConfig {
        file,
        dir: dir.to_path_buf(),
        sites,
        default_site: default_site.map(|(i, _, _)| i),
        app: app.map(|(a, _)| a),
        control_group,
    })
}

#[cfg(test)]
mod testing {
    use super::parse;

    /// A folder with `site/` (a static root) for the checks that look at the disk.
    pub(super) fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("site")).unwrap();
        std::fs::write(d.path().join("file.txt"), "x").unwrap();
        d
    }

    pub(super) fn problems(text: &str) -> Vec<String> {
        let d = dir();
        parse(text, d.path()).unwrap_err()
    }
}

#[cfg(test)]
mod tests {
    use super::plan::{AppPlan, RouteKind};
    use super::testing::{dir, problems};
    use super::*;
    use crate::common::CommonArgs;

    const GOOD: &str = r#"
listen = "127.0.0.1:0"
workers = 2

[[site]]
name = "main"
hosts = ["Example.org", "www.example.org"]
default = true

[[site.route]]
path = "/"
static = "site"
cache_control = "public, max-age=60"
add_headers = { "Strict-Transport-Security" = "max-age=63072000", "Cache-Control" = "no-cache" }
remove_headers = ["ETag"]

[[site.route]]
path = "/old/"
redirect = "https://example.org/new"
status = 301
keep_path = false

[[site.route]]
path = "/health"
respond = "ok\n"

[[site]]
name = "wild"
hosts = ["*.example.org"]

[[site.route]]
path = "/"
redirect = "https://example.org"

[[site]]
name = "game"
hosts = ["games.test"]

[[site.route]]
path = "/"
app = "ipv4-games"
data = "data"
"#;

    #[test]
    fn a_good_file_becomes_a_plan() {
        let d = dir();
        let c = parse(GOOD, d.path()).unwrap();
        assert_eq!(c.sites.len(), 3);
        assert_eq!(c.route_count(), 5);
        assert_eq!(c.default_site, Some(0));
        assert_eq!(c.sites[0].hosts, ["example.org", "www.example.org"]);
        assert_eq!(c.sites[1].hosts, ["*.example.org"]);
        match &c.sites[0].routes[0].kind {
            RouteKind::Static(o) => {
                assert_eq!(o.root, d.path().join("site"));
                assert_eq!(o.cache_control.as_deref(), Some("public, max-age=60"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            c.sites[0].routes[0].headers.set,
            [
                ("Cache-Control".to_string(), "no-cache".to_string()),
                (
                    "Strict-Transport-Security".to_string(),
                    "max-age=63072000".to_string()
                )
            ]
        );
        assert_eq!(c.sites[0].routes[0].headers.remove, ["ETag"]);
        assert!(matches!(
            &c.sites[0].routes[1].kind,
            RouteKind::Redirect { status: 301, keep_path: false, target } if target == "https://example.org/new"
        ));
        assert!(matches!(
            &c.sites[0].routes[2].kind,
            RouteKind::Respond { status: 200, body, content_type } if body == "ok\n" && content_type.starts_with("text/plain")
        ));
        assert!(matches!(
            &c.sites[1].routes[0].kind,
            RouteKind::Redirect {
                status: 308,
                keep_path: true,
                ..
            }
        ));
        assert_eq!(
            c.app,
            Some(AppPlan {
                data: Some(d.path().join("data")),
                store: None,
                pages: tern_ipv4_games::bundled_site()
            })
        );
        let common = c.common(&CommonArgs::default());
        assert_eq!(common.workers, Some(2));
        assert_eq!(common.listen, Some("127.0.0.1:0".parse().unwrap()));
    }

    #[test]
    fn every_problem_is_listed_with_its_line() {
        let text = r#"[[site]]
name = "a"
hosts = ["a.test", "*example.org", "b.test:8080"]
default = true
[[site.route]]
path = "/"
static = "missing"
[[site.route]]
path = "app"
respond = "x"
[[site]]
name = "a"
hosts = ["A.test"]
default = true
[[site.route]]
path = "/r"
redirect = "https://a.test"
status = 200
[[site.route]]
path = "/r/"
respond = "gone"
status = 204
[[site.route]]
path = "/p"
proxy = "https://:3000"
[[site.route]]
path = "/s"
static = "site"
status = 200
[[site.route]]
path = "/h"
respond = "x"
add_headers = { "Content-Length" = "3", "X Bad" = "1" }
remove_headers = ["Date"]
[[site.route]]
path = "/two"
static = "site"
redirect = "/"
[[site]]
name = "lonely"
[[site]]
name = "file"
hosts = ["f.test"]
[[site.route]]
path = "/"
static = "file.txt"
"#;
        let e = problems(text);
        let want = [
            "line 3: host \"*example.org\" is a bad wildcard",
            "line 3: host \"b.test:8080\" names a port",
            "line 7: static root ",
            "line 9: path \"app\" must start with /",
            "line 12: site name \"a\" is already used (line 2)",
            "line 13: host a.test is already taken by site \"a\" (line 3)",
            "line 14: two default sites: \"a\" (line 4) and \"a\"",
            "line 18: status 200 is not a redirect",
            "line 20: path \"/r/\" is already routed on this site (line 16)",
            "line 22: status 204 has no body",
            "line 25: upstream \"https://:3000\": give https://host:port",
            "line 29: `status` does not apply to a static route",
            "line 33: add_headers: \"Content-Length\" is written by the connection",
            "line 33: add_headers: \"X Bad\" is not a header name",
            "line 34: remove_headers: \"Date\" is written by the connection",
            "line 38: a route has one kind, but both `static` and `redirect` are given",
            "line 40: site \"lonely\" has no hosts and is not the default",
            "line 40: site \"lonely\" has no [[site.route]]",
            "line 46: static root ",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
        assert!(
            e.iter().any(|p| p.ends_with("file.txt is not a folder")),
            "{e:#?}"
        );
    }
}
