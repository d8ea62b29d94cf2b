//! A `respond` route: a fixed answer.

use super::file::RouteFile;
use super::plan::RouteKind;
use super::problems::Problems;
use super::route::{kind_keys, KindKey};

/// The keys of a respond route besides `respond`.
pub(super) const KEYS: &[KindKey] = kind_keys![content_type, status];

pub(super) fn check_respond(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let body = route.respond.as_ref()?;
    let mut ok = true;
    let status = route.status.as_ref().map_or(200, |s| *s.get_ref());
    let status_at = route
        .status
        .as_ref()
        .map_or(body.span().start, |s| s.span().start);
    if !(200..=599).contains(&status) {
        p.at(
            status_at,
            format!("status {status} is not a final HTTP status (200 to 599)"),
        );
        ok = false;
    } else if matches!(status, 204 | 304) && !body.get_ref().is_empty() {
        p.at(
            status_at,
            format!("status {status} has no body: give respond = \"\""),
        );
        ok = false;
    }
    let content_type = route
        .content_type
        .as_ref()
        .map_or("text/plain; charset=utf-8".to_string(), |v| {
            v.get_ref().clone()
        });
    if content_type.is_empty() || content_type.bytes().any(|b| b.is_ascii_control()) {
        let at = route
            .content_type
            .as_ref()
            .map_or(body.span().start, |v| v.span().start);
        p.at(
            at,
            "content_type must be non-empty, without control characters",
        );
        ok = false;
    }
    ok.then(|| RouteKind::Respond {
        status,
        body: body.get_ref().clone(),
        content_type,
    })
}
