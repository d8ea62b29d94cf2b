//! A `rewrite` route: the request routed again on its site with another path; and the
//! loops rewrites could make.

use super::file::RouteFile;
use super::plan::{RouteKind, RoutePlan};
use super::problems::Problems;

pub(super) fn check_rewrite_kind(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let target = route.rewrite.as_ref()?;
    let captures = tern_vhost::compile_pattern(
        route.path_glob.as_ref().map(|g| g.get_ref().as_str()),
        route.path_regex.as_ref().map(|r| r.get_ref().as_str()),
    )
    .ok()
    .flatten()
    .map_or(0, |re| (re.captures_len() - 1).min(9) as u8);
    match tern_vhost::check_rewrite(target.get_ref(), captures) {
        Ok(()) => Some(RouteKind::Rewrite(target.get_ref().clone())),
        Err(e) => {
            p.at(target.span().start, e);
            None
        }
    }
}

/// Rewrites that lead back to themselves through literal targets (`/a` → `/b` → `/a`): each
/// would end in 500 at every request, so the file is refused.
pub(super) fn check_loops(routes: &[(usize, RoutePlan)], p: &mut Problems<'_>) {
    // The route a literal path takes by its prefix (the first of the longest prefix: the
    // one a request without other distinguishing traits gets).
    let target_of = |path: &str| -> Option<usize> {
        let canonical = tern_server::canonical_path(path).ok()?;
        let mut best: Option<(usize, usize)> = None;
        for (i, (_, r)) in routes.iter().enumerate() {
            let stored = r.prefix.trim_end_matches('/');
            if tern_server::path_under(stored, canonical.as_ref())
                && best.is_none_or(|(_, len)| stored.len() > len)
            {
                best = Some((i, stored.len()));
            }
        }
        best.map(|(i, _)| i)
    };
    for (start, (line, route)) in routes.iter().enumerate() {
        let RouteKind::Rewrite(target) = &route.kind else {
            continue;
        };
        if target.contains('$') {
            continue;
        }
        let mut chain = vec![*line];
        let mut members = vec![start];
        let mut next = target_of(target);
        while let Some(i) = next {
            let (l, r) = &routes[i];
            let RouteKind::Rewrite(t) = &r.kind else {
                break;
            };
            if i == start {
                if members.iter().any(|&m| m < start) {
                    break; // reported from its first route
                }
                let lines: Vec<String> = chain.iter().map(|l| format!("line {l}")).collect();
                p.list.push(format!(
                    "line {line}: rewrite loop: {} -> line {line}: a request would be routed in \
                     circles",
                    lines.join(" -> ")
                ));
                break;
            }
            if chain.contains(l) || t.contains('$') {
                break;
            }
            chain.push(*l);
            members.push(i);
            next = target_of(t);
        }
    }
}
