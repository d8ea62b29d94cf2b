//! A route: a path prefix, what answers under it, and the header edits applied to its answers.

use std::sync::Arc;

use bytes::Bytes;
use tern_server::upstream::ResponseEdit;
use tern_server::{Body, Handler, HandlerContext, Reply, Request, RequestHead, Response};

/// What answers the requests a route matches.
pub enum Action {
    /// A handler: static files, or a mounted app's router. It sees the full path (a static
    /// root under `/docs` is looked up as `ROOT/docs/...`, like nginx's `root`).
    Handler(Arc<dyn Handler>),
    Redirect(Redirect),
    Fixed(Fixed),
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

/// Headers set on (replacing any of the same name) or removed from a route's answers.
#[derive(Debug, Default, Clone)]
pub struct HeaderEdits {
    /// `(name, value)`, in order.
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
}

/// One route as the site table holds it: everything prebuilt, nothing formatted per request.
pub(crate) struct BuiltRoute {
    /// Decoded canonical form, without a trailing slash; `/` is stored as the empty string
    /// (it matches every path).
    pub prefix: Vec<u8>,
    action: BuiltAction,
    /// Names to drop before `set_lines` are added (the removed ones and the set ones).
    drop: Vec<String>,
    /// `Name: value\r\n` lines, serialised once.
    set_lines: Arc<Vec<u8>>,
    /// The same edits for a proxied answer, whose head the relay builds later.
    forward_edit: Option<ResponseEdit>,
}

enum BuiltAction {
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
}

/// The prefix as stored: no trailing slash (`/app/` is `/app`), and `/` as "".
pub(crate) fn stored_prefix(prefix: &[u8]) -> &[u8] {
    let mut p = prefix;
    while let [rest @ .., b'/'] = p {
        p = rest;
    }
    p
}

impl BuiltRoute {
    /// `prefix`: the decoded canonical form of the configured path.
    pub(crate) fn new(prefix: &[u8], action: Action, edits: &HeaderEdits) -> BuiltRoute {
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
        };
        let mut drop = edits.remove.clone();
        let mut set_lines = Vec::new();
        for (name, value) in &edits.set {
            drop.push(name.clone());
            set_lines.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        let set_lines = Arc::new(set_lines);
        let forward_edit: Option<ResponseEdit> = if drop.is_empty() && set_lines.is_empty() {
            None
        } else {
            let (drop, lines) = (drop.clone(), set_lines.clone());
            Some(Arc::new(move |r: &mut Response| edit(r, &drop, &lines)))
        };
        BuiltRoute {
            prefix: stored_prefix(prefix).to_vec(),
            action,
            drop,
            set_lines,
            forward_edit,
        }
    }

    pub(crate) fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        matches!(&self.action, BuiltAction::Handler(h) if h.streams_body(head))
    }

    pub(crate) fn answer(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        let mut reply = match &self.action {
            BuiltAction::Handler(h) => h.handle(req, cx),
            BuiltAction::Redirect {
                status,
                target,
                keep_path,
            } => Reply::Now(redirect(*status, target, *keep_path, req)),
            BuiltAction::Fixed {
                status,
                body,
                content_type_line,
            } => {
                let mut r = Response::new(*status).with_body(Body::Shared(body.clone()));
                r.push_raw_headers(content_type_line);
                Reply::Now(r)
            }
        };
        // A deferred answer (the game's claims) is completed elsewhere and is not edited; a
        // forwarded one is edited by the relay when its head arrives.
        match &mut reply {
            Reply::Now(response) => edit(response, &self.drop, &self.set_lines),
            Reply::Forward(fwd) => fwd.edit = self.forward_edit.clone(),
            _ => {}
        }
        reply
    }
}

fn edit(response: &mut Response, drop: &[String], set_lines: &[u8]) {
    for name in drop {
        response.remove_header(name);
    }
    response.push_raw_headers(set_lines);
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
}
