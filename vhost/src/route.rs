//! A route: a path prefix and its matchers, what answers under it, and what is done on the
//! way (limits, a rewrite, `try_files`, a stripped prefix, header edits on the answer).

use std::sync::Arc;

use bytes::Bytes;
use tern_server::upstream::ResponseEdit;
use tern_server::{AnswerRow, Body, Handler, Request, RequestHead, Response};
use tern_services::template::{Template, Values, Var};
use tern_services::{PrefixLimiter, RateVerdict};

use crate::handback::{check_reroute_status, Policy};
use crate::headers::{chain, BuiltEdits, HeaderEdits};
use crate::matcher::{MatchSpec, Matchers};

/// What answers the requests a route matches.
pub enum Action {
    /// A handler: static files, or a mounted app's router. It sees the full path (a static
    /// root under `/docs` is looked up as `ROOT/docs/...`, like nginx's `root`), or the path
    /// without the prefix when wrapped in [`crate::StripPrefix`].
    Handler(Arc<dyn Handler>),
    Redirect(Redirect),
    Fixed(Fixed),
    /// An internal rewrite: the request is routed again on its site with this path
    /// (`$uri`, `$1`..`$9` from the route's path pattern); the query stays.
    Rewrite(String),
}

/// A redirect to `target`, with the request's path and query appended when `keep_path`.
pub struct Redirect {
    pub status: u16,
    pub target: String,
    pub keep_path: bool,
}

/// The same answer to every request.
pub struct Fixed {
    pub status: u16,
    pub body: Bytes,
    pub content_type: String,
}

/// A route's matchers and what it does on the way to its action.
#[derive(Default)]
pub struct RouteOptions {
    pub matchers: MatchSpec,
    /// `try_files` for a handler route: candidates (`$uri`, `$uri/index.html`, `/x`) tried
    /// in order, the first the handler does not answer 404 wins; the last entry is the
    /// fallback, a path routed again on the site, or `=CODE`.
    pub try_files: Vec<String>,
    /// The most request body this route takes (413 past it).
    pub max_body: Option<u64>,
    /// Token buckets by client network: 429 with `Retry-After` when empty.
    pub rate_limit: Option<Arc<PrefixLimiter>>,
    /// On-the-fly compression of the route's answers (fixed and proxied; `None`: off).
    pub compress: Option<Arc<tern_compress::Policy>>,
    /// The row of figures its answers are counted in (`Stats::route`); `None`: its site's.
    pub counted_as: Option<AnswerRow>,
    /// Takes paths with an encoded slash (`%2F`), kept opaque inside its segment: chosen,
    /// judged and forwarded as sent (canonical). Every other route refuses them with 400.
    /// `tern run --check` allows it on proxy routes with no narrower route or gate beneath.
    pub allow_encoded_slash: bool,
    /// The bare prefix (`/app` for a route written `/app/`) is answered `301` to the prefix
    /// with its slash and the query, as nginx does for a proxy or FastCGI `location` whose
    /// prefix ends in `/`: an app served under a folder gets only paths inside it, and its
    /// relative links resolve. Set by `tern run` for such routes.
    pub redirect_bare_prefix: bool,
    /// Answers only requests tern routes again itself (a rewrite, a `try_files` fallback, an
    /// app's hand-back), as nginx's `internal` locations; a client's request that lands on it
    /// gets 404, as if no route were there.
    pub internal: bool,
    /// A proxy or PHP route: its app's `X-Accel-Redirect: /path[?query]` answers the request
    /// with that path of the site instead (see `handback.rs`).
    pub x_accel_redirect: bool,
    /// A proxy or PHP route: its app's answers with these statuses are replaced by the answer
    /// for the path (nginx's `proxy_intercept_errors on; error_page 404 = /path`).
    pub reroute_status: Vec<(u16, String)>,
}

/// How `try_files` ends when no candidate is there.
pub(crate) enum Fallback {
    /// Route again with this path.
    Path(Template),
    Status(u16),
}

pub(crate) struct TryFiles {
    pub candidates: Vec<Template>,
    pub fallback: Fallback,
}

/// Checks a `try_files` list: at least a candidate and a fallback, candidates paths with
/// `$uri`, the fallback a path or `=CODE` (400-599), and never `$uri` alone (the request
/// would be routed to itself).
pub fn check_try_files(list: &[String]) -> Result<(), String> {
    parse_try_files(list).map(|_| ())
}

pub(crate) fn parse_try_files(list: &[String]) -> Result<TryFiles, String> {
    let [candidates @ .., last] = list else {
        return Err("try_files is empty".into());
    };
    if candidates.is_empty() {
        return Err(
            "try_files needs at least one candidate and a fallback (e.g. [\"$uri\", \"/index.html\"])"
                .into(),
        );
    }
    let path = |entry: &String| -> Result<Template, String> {
        if !entry.starts_with('/') && !entry.starts_with("$uri") && !entry.starts_with("${uri}") {
            return Err(format!(
                "try_files entry {entry:?} must be a path (start with / or $uri)"
            ));
        }
        if entry.contains(['?', '#']) {
            return Err(format!(
                "try_files entry {entry:?} must be a plain path (no ? or #)"
            ));
        }
        Template::parse(entry, &[Var::Uri], 0).map_err(|e| format!("try_files: {e}"))
    };
    let candidates = candidates.iter().map(path).collect::<Result<Vec<_>, _>>()?;
    let fallback = match last.strip_prefix('=') {
        Some(code) => match code.parse::<u16>() {
            Ok(c) if (400..=599).contains(&c) => Fallback::Status(c),
            _ => {
                return Err(format!(
                    "try_files fallback {last:?}: =CODE takes a status 400-599"
                ))
            }
        },
        None => {
            let t = path(last)?;
            if matches!(last.as_str(), "$uri" | "${uri}" | "$uri/" | "${uri}/") {
                return Err(format!(
                    "try_files fallback {last:?} routes the request to itself (a fallback loop)"
                ));
            }
            Fallback::Path(t)
        }
    };
    Ok(TryFiles {
        candidates,
        fallback,
    })
}

/// Checks a rewrite target for a route whose pattern has `captures` groups.
pub fn check_rewrite(target: &str, captures: u8) -> Result<(), String> {
    parse_rewrite(target, captures).map(|_| ())
}

fn parse_rewrite(target: &str, captures: u8) -> Result<Template, String> {
    if !target.starts_with('/') && !target.starts_with('$') {
        return Err(format!("rewrite {target:?} must be a path (start with /)"));
    }
    if target.contains(['?', '#']) {
        return Err(format!(
            "rewrite {target:?} must be a plain path (no ? or #: the query is kept)"
        ));
    }
    if matches!(target, "$uri" | "${uri}") {
        return Err("rewrite \"$uri\" routes the request to itself (a rewrite loop)".into());
    }
    Template::parse(target, &[Var::Uri], captures).map_err(|e| format!("rewrite: {e}"))
}

/// One route as the site table holds it: everything prebuilt, nothing formatted per request
/// unless a header value holds a variable.
pub(crate) struct BuiltRoute {
    /// Decoded canonical form, without a trailing slash; `/` is stored as the empty string
    /// (it matches every path).
    pub prefix: Vec<u8>,
    pub matchers: Matchers,
    pub action: BuiltAction,
    pub try_files: Option<TryFiles>,
    pub max_body: Option<u64>,
    pub rate_limit: Option<Arc<PrefixLimiter>>,
    pub compress: Option<Arc<tern_compress::Policy>>,
    pub counted_as: Option<AnswerRow>,
    pub allow_encoded_slash: bool,
    /// See [`RouteOptions::redirect_bare_prefix`].
    pub redirect_bare_prefix: bool,
    /// See [`RouteOptions::internal`].
    pub internal: bool,
    /// What it does with its app's answers that hand the request back (`None`: nothing).
    pub handback: Option<Policy>,
    /// Its header edits (its site's with its own over them).
    edits: BuiltEdits,
    /// What the relay does to its own answers for this route (502, 503, 504, 413) when the
    /// edits hold no variable: the site's error page, then the edits.
    own_answers: Option<ResponseEdit>,
}

pub(crate) enum BuiltAction {
    Handler(Arc<dyn Handler>),
    Redirect {
        status: u16,
        target: String,
        keep_path: bool,
    },
    Fixed {
        status: u16,
        body: Bytes,
        content_type_line: Vec<u8>,
    },
    Rewrite(Template),
}

/// The prefix as stored: no trailing slash (`/app/` is `/app`), and `/` as "".
pub(crate) fn stored_prefix(prefix: &[u8]) -> &[u8] {
    let mut p = prefix;
    while let [rest @ .., b'/'] = p {
        p = rest;
    }
    p
}

/// What a route decided before its action runs.
pub(crate) enum Admission {
    Pass,
    /// Passes, to be sent on after this many milliseconds (its turn in a rate limit's queue).
    PassAfter(u64),
    /// The answer, and why (to be counted).
    Refuse(Response, tern_server::Refusal),
}

impl BuiltRoute {
    /// `prefix`: the decoded canonical form of the configured path; `edits`: the route's
    /// over its site's; `pages`: the site's error pages for the relay's own answers.
    pub(crate) fn new(
        prefix: &[u8],
        action: Action,
        edits: &HeaderEdits,
        options: RouteOptions,
        pages: Option<&ResponseEdit>,
    ) -> Result<BuiltRoute, String> {
        let matchers = Matchers::new(&options.matchers)?;
        let action = match action {
            Action::Handler(h) => BuiltAction::Handler(h),
            Action::Redirect(r) => BuiltAction::Redirect {
                status: r.status,
                // The kept path starts with '/': one slash between them, not two.
                target: if r.keep_path {
                    r.target.trim_end_matches('/').to_string()
                } else {
                    r.target
                },
                keep_path: r.keep_path,
            },
            Action::Fixed(f) => BuiltAction::Fixed {
                status: f.status,
                body: f.body,
                content_type_line: format!("Content-Type: {}\r\n", f.content_type).into_bytes(),
            },
            Action::Rewrite(target) => {
                BuiltAction::Rewrite(parse_rewrite(&target, matchers.capture_count())?)
            }
        };
        let try_files = if options.try_files.is_empty() {
            None
        } else if !matches!(action, BuiltAction::Handler(_)) {
            return Err("try_files is for routes with a handler (static files)".into());
        } else {
            Some(parse_try_files(&options.try_files)?)
        };
        for (status, target) in &options.reroute_status {
            check_reroute_status(*status, target)?;
        }
        let handback =
            (options.x_accel_redirect || !options.reroute_status.is_empty()).then(|| Policy {
                x_accel_redirect: options.x_accel_redirect,
                reroute_status: options
                    .reroute_status
                    .iter()
                    .map(|(status, target)| (*status, target.as_str().into()))
                    .collect(),
            });
        let edits = BuiltEdits::new(edits)?;
        let own_answers = if edits.has_templates() {
            None
        } else {
            chain(pages, edits.forward_edit(&crate::path_values("")))
        };
        Ok(BuiltRoute {
            prefix: stored_prefix(prefix).to_vec(),
            matchers,
            action,
            try_files,
            max_body: options.max_body,
            rate_limit: options.rate_limit,
            compress: options.compress,
            counted_as: options.counted_as,
            allow_encoded_slash: options.allow_encoded_slash,
            redirect_bare_prefix: options.redirect_bare_prefix
                && prefix.ends_with(b"/")
                && !stored_prefix(prefix).is_empty(),
            internal: options.internal,
            handback,
            edits,
            own_answers,
        })
    }

    pub(crate) fn is_fixed(&self) -> bool {
        matches!(self.action, BuiltAction::Fixed { .. })
    }

    /// The route's limits: its rate (by client network) and its body size.
    pub(crate) fn admit(&self, req: &Request<'_>, worker: usize) -> Admission {
        let mut after_ms = 0;
        if let Some(limiter) = &self.rate_limit {
            let client = limiter.client_of(req.peer, req.head);
            let verdict = limiter.judge(worker, client, req.unix_secs);
            if let RateVerdict::Reject | RateVerdict::Drop = verdict {
                let mut secs = itoa::Buffer::new();
                let r = Response::text(429, "too many requests\n")
                    .with_header("Retry-After", secs.format(limiter.retry_after_secs()));
                // Far over: the connection goes too, so a flood costs one answer per
                // connection.
                let r = if verdict == RateVerdict::Drop {
                    r.close()
                } else {
                    r
                };
                return Admission::Refuse(r, tern_server::Refusal::RateLimited);
            }
            if let RateVerdict::Delay(ms) = verdict {
                after_ms = ms;
            }
        }
        if let Some(max) = self.max_body {
            let declared = match req.head.body {
                tern_server::BodyKind::Length(n) => n,
                _ => 0,
            };
            if declared > max || req.body.len() as u64 > max {
                return Admission::Refuse(
                    Response::text(413, "request body too large\n"),
                    tern_server::Refusal::BodyTooLarge,
                );
            }
        }
        if after_ms > 0 {
            Admission::PassAfter(after_ms)
        } else {
            Admission::Pass
        }
    }

    /// Whether the handler takes the body as a stream (a proxy route).
    pub(crate) fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        matches!(&self.action, BuiltAction::Handler(h) if h.streams_body(head))
    }

    /// The answer of a redirect or fixed route.
    pub(crate) fn answer_plain(&self, req: &Request<'_>) -> Option<Response> {
        match &self.action {
            BuiltAction::Redirect {
                status,
                target,
                keep_path,
            } => Some(redirect(*status, target, *keep_path, req)),
            BuiltAction::Fixed {
                status,
                body,
                content_type_line,
            } => {
                let mut r = Response::new(*status).with_body(Body::Shared(body.clone()));
                r.push_raw_headers(content_type_line);
                Some(r)
            }
            _ => None,
        }
    }

    /// Applies the route's header edits to an answer now (`unix_secs`: the request's clock,
    /// for `Expires`), or hands them to the relay for a forwarded one, with the site's error
    /// pages (`pages`) before them on the relay's own answers; values with variables are
    /// rendered now (the relay has no request).
    pub(crate) fn edit_reply(
        &self,
        reply: &mut tern_server::Reply,
        values: &Values<'_>,
        unix_secs: u64,
        pages: Option<&ResponseEdit>,
    ) {
        match reply {
            tern_server::Reply::Now(response) => self.edits.apply(response, values, unix_secs),
            tern_server::Reply::Forward(fwd) => {
                if let Some(max) = self.max_body {
                    fwd.max_body = max;
                }
                // The handler's own edit (a cache's Cache-Status) first, then the route's.
                fwd.edit = chain(fwd.edit.as_ref(), self.edits.forward_edit(values));
                fwd.own_answers = if self.edits.has_templates() {
                    chain(pages, fwd.edit.clone())
                } else {
                    self.own_answers.clone()
                };
            }
            // A deferred answer (the game's claims) is completed elsewhere and not edited.
            _ => {}
        }
    }

    /// Applies the route's header edits to one of tern's own answers for it (a refusal, a
    /// path with no canonical form): every answer gets them, whatever its status.
    pub(crate) fn edit_own(&self, response: &mut Response, values: &Values<'_>, unix_secs: u64) {
        self.edits.apply(response, values, unix_secs);
    }
}

fn redirect(status: u16, target: &str, keep_path: bool, req: &Request<'_>) -> Response {
    let mut location = String::with_capacity(target.len() + req.path().len() + 64);
    location.push_str(target);
    if keep_path {
        location.push_str(req.path());
        if let Some(q) = req.query() {
            location.push('?');
            location.push_str(q);
        }
    }
    Response::text(status, "redirecting\n").with_header("Location", &location)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_server::path_under as under;

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(under(stored_prefix(b"/app"), "/app"));
        assert!(under(stored_prefix(b"/app"), "/app/"));
        assert!(under(stored_prefix(b"/app"), "/app/x/y"));
        assert!(!under(stored_prefix(b"/app"), "/apple"));
        assert!(!under(stored_prefix(b"/app"), "/ap"));
        assert!(!under(stored_prefix(b"/app"), "/"));
        assert!(
            under(stored_prefix(b"/app/"), "/app"),
            "a trailing slash is ignored"
        );
        assert!(under(stored_prefix(b"/app/"), "/app/x"));
        assert!(!under(stored_prefix(b"/app/"), "/apple"));
        for path in ["/", "/x", "/apple/pie"] {
            assert!(under(stored_prefix(b"/"), path), "{path}");
        }
        assert!(
            !under(stored_prefix(b"/"), "*"),
            "OPTIONS * is under no route"
        );
    }

    #[test]
    fn try_files_lists_are_checked() {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_try_files(&list(&["$uri", "$uri/index.html", "/index.html"])).is_ok());
        assert!(check_try_files(&list(&["$uri", "=404"])).is_ok());
        for (bad, want) in [
            (&["/index.html"][..], "at least one candidate"),
            (&[], "is empty"),
            (&["$uri", "$uri"], "a fallback loop"),
            (&["$uri", "${uri}/"], "a fallback loop"),
            (&["$uri", "=200"], "status 400-599"),
            (&["$args", "/x"], "must be a path"),
            (&["$uri", "/x?y"], "plain path"),
            (&["$uri$host", "/x"], "no meaning here"),
            (&["$uri", "/$foo"], "unknown variable $foo"),
        ] {
            let e = check_try_files(&list(bad)).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    #[test]
    fn rewrites_are_checked() {
        assert!(check_rewrite("/p/$1", 1).is_ok());
        assert!(check_rewrite("/index.php$uri", 0).is_ok());
        assert!(check_rewrite("$uri", 0).unwrap_err().contains("loop"));
        assert!(check_rewrite("/p/$2", 1)
            .unwrap_err()
            .contains("names no group"));
        assert!(check_rewrite("x", 0)
            .unwrap_err()
            .contains("must be a path"));
        assert!(check_rewrite("/x?a=1", 0)
            .unwrap_err()
            .contains("plain path"));
        assert!(check_rewrite("/$client", 0)
            .unwrap_err()
            .contains("no meaning here"));
    }
}
