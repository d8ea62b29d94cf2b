//! `static` with `fastcgi`: a folder's files, and its `*.php` scripts run on FastCGI
//! servers (PHP-FPM).

use std::path::Path;

use super::file::{Names, RouteFile};
use super::files::check_static;
use super::plan::RouteKind;
use super::problems::Problems;
use super::proxy::check_proxy;
use super::route::{kind_keys, KindKey};

/// The keys of a PHP route besides `static` and `fastcgi` (it takes a static route's keys,
/// and [`super::proxy::UPSTREAM_KEYS`] for its FastCGI servers, too).
pub(super) const KEYS: &[KindKey] = kind_keys![fastcgi, index, fastcgi_params];

/// `static` and `fastcgi`: the root's files, and its scripts on the FastCGI servers (checked
/// as a proxy's upstreams are).
pub(super) fn check_fastcgi(
    route: &RouteFile,
    dir: &Path,
    p: &mut Problems<'_>,
) -> Option<RouteKind> {
    let files = check_static(route, dir, p);
    let upstream = check_proxy(route, dir, p);
    let index = match &route.index {
        None => Some(tern_proxy::fastcgi::Index::default()),
        Some(i) => {
            let list = match i.get_ref() {
                Names::One(one) => std::slice::from_ref(one),
                Names::Many(many) => many.as_slice(),
            };
            tern_proxy::fastcgi::check_index(list)
                .map_err(|e| p.at(i.span().start, e))
                .ok()
        }
    };
    let mut params = Vec::new();
    let mut params_ok = true;
    if let Some(table) = &route.fastcgi_params {
        if table.get_ref().len() > tern_proxy::fastcgi::MAX_PARAMS {
            p.at(
                table.span().start,
                format!(
                    "fastcgi_params: at most {} parameters",
                    tern_proxy::fastcgi::MAX_PARAMS
                ),
            );
            params_ok = false;
        }
        for (name, value) in table.get_ref() {
            match tern_proxy::fastcgi::check_param(name, value.get_ref()) {
                Ok(param) => params.push(param),
                Err(e) => {
                    p.at(value.span().start, e);
                    params_ok = false;
                }
            }
        }
    }
    match (files?, upstream?, index?) {
        (RouteKind::Static(files), RouteKind::Proxy(upstream), index) if params_ok => {
            Some(RouteKind::FastCgi {
                files,
                upstream,
                index,
                params,
            })
        }
        _ => None,
    }
}
