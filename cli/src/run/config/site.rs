//! A site's own keys beyond its name and hosts: `error_pages`, `request_id` (and the
//! `$request_id` its header edits may use), and `access_log`.

use std::path::Path;

use crate::common::LogFormatArg;

use super::file::SiteFile;
use super::plan::SiteLog;
use super::problems::Problems;

/// The largest error page (they are held in memory).
const MAX_ERROR_PAGE: u64 = 1 << 20;

pub(super) fn check_error_pages(
    site: &SiteFile,
    dir: &Path,
    p: &mut Problems<'_>,
) -> Vec<tern_vhost::ErrorPage> {
    let Some(pages) = &site.error_pages else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (code, file) in pages.get_ref() {
        let status = match code.parse::<u16>() {
            Ok(s) if (400..=599).contains(&s) => s,
            _ => {
                p.at(
                    pages.span().start,
                    format!("error_pages: {code:?} is not an error status (400-599)"),
                );
                continue;
            }
        };
        let path = dir.join(file.get_ref());
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() && m.len() <= MAX_ERROR_PAGE => match std::fs::read(&path) {
                Ok(body) => out.push(tern_vhost::ErrorPage {
                    status,
                    body: bytes::Bytes::from(body),
                    content_type: content_type_of(&path),
                }),
                Err(e) => p.at(
                    file.span().start,
                    format!("error page {}: {e}", path.display()),
                ),
            },
            Ok(m) if m.is_file() => p.at(
                file.span().start,
                format!(
                    "error page {} is over {MAX_ERROR_PAGE} bytes",
                    path.display()
                ),
            ),
            Ok(_) => p.at(
                file.span().start,
                format!("error page {} is not a file", path.display()),
            ),
            Err(e) => p.at(
                file.span().start,
                format!("error page {}: {e}", path.display()),
            ),
        }
    }
    out
}

fn content_type_of(path: &Path) -> String {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html" | "htm") => "text/html; charset=utf-8".into(),
        Some("txt") => "text/plain; charset=utf-8".into(),
        Some("json") => "application/json".into(),
        Some("xml") => "application/xml".into(),
        _ => "application/octet-stream".into(),
    }
}

pub(super) fn check_request_ids(
    site: &SiteFile,
    p: &mut Problems<'_>,
) -> Option<tern_services::TrustedProxies> {
    let on = site.request_id.as_ref().is_some_and(|r| *r.get_ref());
    let trusted = match &site.request_id_trusted {
        None => tern_services::TrustedProxies::default(),
        Some(t) if !on => {
            p.at(t.span().start, "request_id_trusted needs request_id = true");
            return None;
        }
        Some(t) => match tern_services::TrustedProxies::parse(t.get_ref()) {
            Ok(list) => list,
            Err(e) => {
                p.at(t.span().start, format!("request_id_trusted: {e}"));
                return None;
            }
        },
    };
    on.then_some(trusted)
}

/// `$request_id` in the header edits of the site or its routes needs `request_id = true`.
pub(super) fn check_request_id_uses(site: &SiteFile, p: &mut Problems<'_>) {
    if site.request_id.as_ref().is_some_and(|r| *r.get_ref()) {
        return;
    }
    let site_keys = [("add_headers", &site.add_headers)];
    let route_keys = site.route.iter().flat_map(|route| {
        [
            ("add_headers", &route.add_headers),
            ("add_request_headers", &route.add_request_headers),
        ]
    });
    for (key, value) in site_keys.into_iter().chain(route_keys) {
        if let Some(v) = value {
            if v.get_ref()
                .values()
                .any(|v| v.contains("$request_id") || v.contains("${request_id}"))
            {
                p.at(
                    v.span().start,
                    format!("{key}: $request_id needs request_id = true on the site"),
                );
            }
        }
    }
}

/// Where the site's access-log lines go: `access_log` (a file of its own, or "off") with
/// `access_log_format`, else the server's log.
pub(super) fn check_log(site: &SiteFile, dir: &Path, p: &mut Problems<'_>) -> SiteLog {
    let log = match &site.access_log {
        None => SiteLog::Shared,
        Some(v) if v.get_ref() == "off" => SiteLog::Off,
        Some(v) if v.get_ref().trim().is_empty() => {
            p.at(v.span().start, "access_log must be a file or \"off\"");
            SiteLog::Off
        }
        Some(v) => SiteLog::Own(
            dir.join(v.get_ref()),
            site.access_log_format
                .as_ref()
                .map_or(LogFormatArg::Combined, |f| *f.get_ref()),
        ),
    };
    if let (Some(f), false) = (&site.access_log_format, matches!(log, SiteLog::Own(..))) {
        p.at(
            f.span().start,
            "access_log_format is for a site with its own access_log file",
        );
    }
    log
}
