//! A `static` route: files under a folder.

use std::path::Path;

use tern_server::static_files::StaticOptions;

use super::file::RouteFile;
use super::plan::RouteKind;
use super::problems::Problems;
use super::route::{kind_keys, KindKey};

/// The keys of a static route besides `static` (a PHP route has them too).
pub(super) const KEYS: &[KindKey] =
    kind_keys![try_files, serve_dotfiles, cache_control, max_cached_size];

pub(super) fn check_static(
    route: &RouteFile,
    dir: &Path,
    p: &mut Problems<'_>,
) -> Option<RouteKind> {
    let root_value = route.static_root.as_ref()?;
    let root = dir.join(root_value.get_ref());
    let mut ok = true;
    match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            p.at(
                root_value.span().start,
                format!("static root {} is not a folder", root.display()),
            );
            ok = false;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            p.at(
                root_value.span().start,
                format!("static root {} does not exist", root.display()),
            );
            ok = false;
        }
        Err(e) => {
            p.at(
                root_value.span().start,
                format!("static root {}: {e}", root.display()),
            );
            ok = false;
        }
    }
    if let Some(cc) = &route.cache_control {
        if cc.get_ref().bytes().any(|b| b.is_ascii_control()) {
            p.at(
                cc.span().start,
                "cache_control must not hold control characters",
            );
            ok = false;
        }
    }
    let defaults = StaticOptions::default();
    ok.then(|| {
        RouteKind::Static(StaticOptions {
            root,
            serve_dotfiles: route.serve_dotfiles.as_ref().is_some_and(|v| *v.get_ref()),
            cache_control: route.cache_control.as_ref().map(|v| v.get_ref().clone()),
            max_cached_size: route
                .max_cached_size
                .as_ref()
                .map_or(defaults.max_cached_size, |v| *v.get_ref()),
            ..defaults
        })
    })
}
