//! A `redirect` route: an answer that sends the client elsewhere.

use super::file::RouteFile;
use super::plan::RouteKind;
use super::problems::Problems;
use super::route::{kind_keys, KindKey};

/// The keys of a redirect route besides `redirect`.
pub(super) const KEYS: &[KindKey] = kind_keys![keep_path, status];

const REDIRECT_STATUSES: [u16; 5] = [301, 302, 303, 307, 308];

pub(super) fn check_redirect(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let target = route.redirect.as_ref()?;
    let mut ok = true;
    let t = target.get_ref();
    let scheme_or_path =
        t.starts_with("https://") || t.starts_with("http://") || t.starts_with('/');
    if !scheme_or_path || t.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        p.at(
            target.span().start,
            format!("redirect target {t:?} must be an http:// or https:// URL or a path starting with /, without spaces"),
        );
        ok = false;
    }
    let status = route.status.as_ref().map_or(308, |s| *s.get_ref());
    if !REDIRECT_STATUSES.contains(&status) {
        let at = route
            .status
            .as_ref()
            .map_or(target.span().start, |s| s.span().start);
        p.at(
            at,
            format!("status {status} is not a redirect (301, 302, 303, 307 or 308)"),
        );
        ok = false;
    }
    ok.then(|| RouteKind::Redirect {
        status,
        target: t.clone(),
        keep_path: route.keep_path.as_ref().is_none_or(|v| *v.get_ref()),
    })
}
