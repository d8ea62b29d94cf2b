use std::collections::HashMap;
use std::sync::Arc;

use tern_codec::Method;

use crate::handler::{Handler, HandlerContext, Reply, Request};
use crate::response::Response;

/// Methods a route answers, as a bit set (HEAD is implied by GET).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct MethodSet(u16);

fn bit(m: Method) -> u16 {
    1 << (m as u16)
}

const METHOD_NAMES: [(Method, &str); 9] = [
    (Method::Get, "GET"),
    (Method::Head, "HEAD"),
    (Method::Post, "POST"),
    (Method::Put, "PUT"),
    (Method::Delete, "DELETE"),
    (Method::Options, "OPTIONS"),
    (Method::Patch, "PATCH"),
    (Method::Trace, "TRACE"),
    (Method::Connect, "CONNECT"),
];

/// The handlers registered for one path (or prefix), one per method.
#[derive(Clone, Default)]
struct Route {
    methods: MethodSet,
    handlers: Vec<(Method, Arc<dyn Handler>)>,
}

impl Route {
    fn add(&mut self, method: Method, handler: Arc<dyn Handler>) {
        self.methods.0 |= bit(method);
        if method == Method::Get {
            self.methods.0 |= bit(Method::Head);
        }
        self.handlers.retain(|(m, _)| *m != method);
        self.handlers.push((method, handler));
    }

    fn find(&self, method: Method) -> Option<&Arc<dyn Handler>> {
        let lookup = if method == Method::Head && !self.has_explicit(Method::Head) {
            Method::Get
        } else {
            method
        };
        self.handlers
            .iter()
            .find(|(m, _)| *m == lookup)
            .map(|(_, h)| h)
    }

    fn has_explicit(&self, method: Method) -> bool {
        self.handlers.iter().any(|(m, _)| *m == method)
    }

    fn allow_header(&self) -> String {
        METHOD_NAMES
            .iter()
            .filter(|(m, _)| self.methods.0 & bit(*m) != 0)
            .map(|(_, name)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where a request goes.
pub enum RouteMatch<'r> {
    Handler(&'r Arc<dyn Handler>),
    /// The path exists but not for this method: answer 405 with this `Allow` value.
    MethodNotAllowed(&'r str),
    NotFound,
    /// A path with an encoded slash and no fallback to judge it: 400.
    BadPath,
}

/// Maps method + path to handlers: exact paths first, then the longest matching prefix, then
/// the fallback (typically static files). Paths are matched as sent (still percent-encoded).
#[derive(Default)]
pub struct Router {
    exact: HashMap<String, (Route, String)>,
    /// Sorted longest first so the most specific prefix wins.
    prefixes: Vec<(String, Route, String)>,
    fallback: Option<Arc<dyn Handler>>,
}

impl Router {
    pub fn new() -> Router {
        Router::default()
    }

    /// Routes `method path` (exact match) to `handler`.
    pub fn route(mut self, method: Method, path: &str, handler: impl Handler) -> Router {
        let entry = self.exact.entry(path.to_string()).or_default();
        entry.0.add(method, Arc::new(handler));
        entry.1 = entry.0.allow_header();
        self
    }

    /// Routes every path starting with `prefix` for `method` to `handler`.
    pub fn prefix(mut self, method: Method, prefix: &str, handler: impl Handler) -> Router {
        let handler: Arc<dyn Handler> = Arc::new(handler);
        match self.prefixes.iter_mut().find(|(p, _, _)| p == prefix) {
            Some((_, route, allow)) => {
                route.add(method, handler);
                *allow = route.allow_header();
            }
            None => {
                let mut route = Route::default();
                route.add(method, handler);
                let allow = route.allow_header();
                self.prefixes.push((prefix.to_string(), route, allow));
                self.prefixes
                    .sort_by_key(|(p, _, _)| std::cmp::Reverse(p.len()));
            }
        }
        self
    }

    pub fn get(self, path: &str, handler: impl Handler) -> Router {
        self.route(Method::Get, path, handler)
    }

    pub fn post(self, path: &str, handler: impl Handler) -> Router {
        self.route(Method::Post, path, handler)
    }

    /// Handles everything no route matched, whatever the method (it answers 405 itself).
    pub fn fallback(mut self, handler: impl Handler) -> Router {
        self.fallback = Some(Arc::new(handler));
        self
    }

    pub fn find(&self, method: Method, path: &str) -> RouteMatch<'_> {
        // A path the codec kept an encoded slash in (`Limits::allow_encoded_slash`) is for
        // the fallback alone, which refuses it itself wherever it is not taken (a site's
        // route with `allow_encoded_slash`); the router's own routes never take it.
        if tern_codec::has_encoded_slash(path) {
            return match &self.fallback {
                Some(h) => RouteMatch::Handler(h),
                None => RouteMatch::BadPath,
            };
        }
        if !self.exact.is_empty() {
            if let Some((route, allow)) = self.exact.get(path) {
                return match route.find(method) {
                    Some(h) => RouteMatch::Handler(h),
                    None => RouteMatch::MethodNotAllowed(allow),
                };
            }
        }
        for (prefix, route, allow) in &self.prefixes {
            if path.starts_with(prefix.as_str()) {
                return match route.find(method) {
                    Some(h) => RouteMatch::Handler(h),
                    None => RouteMatch::MethodNotAllowed(allow),
                };
            }
        }
        match &self.fallback {
            Some(h) => RouteMatch::Handler(h),
            None => RouteMatch::NotFound,
        }
    }
}

/// What a path with no canonical form for the route it reaches gets (as the codec's 400).
pub fn bad_path() -> Response {
    Response::text(400, "path cannot be normalised safely\n")
}

/// A router is itself a handler, so a whole app (its routes and fallback) can be mounted
/// behind another dispatcher, such as a site table that first chooses by Host.
impl Handler for Router {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        match self.find(req.method(), req.path()) {
            RouteMatch::Handler(h) => h.handle(req, cx),
            RouteMatch::MethodNotAllowed(allow) => Response::text(405, "method not allowed\n")
                .with_header("Allow", allow)
                .into(),
            RouteMatch::NotFound => Response::text(404, "not found\n").into(),
            RouteMatch::BadPath => bad_path().into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16) -> impl Handler {
        move |_: &Request<'_>, _: &mut HandlerContext<'_>| Reply::Now(Response::new(status))
    }

    fn status_of(m: RouteMatch<'_>) -> String {
        match m {
            RouteMatch::Handler(_) => "handler".into(),
            RouteMatch::MethodNotAllowed(allow) => format!("405 {allow}"),
            RouteMatch::NotFound => "404".into(),
            RouteMatch::BadPath => "400".into(),
        }
    }

    #[test]
    fn an_encoded_slash_reaches_the_fallback_alone() {
        let with_fallback = || {
            Router::new()
                .prefix(Method::Get, "/claim/", answer(201))
                .fallback(answer(299))
        };
        let without = || Router::new().prefix(Method::Get, "/claim/", answer(201));
        let mut config = crate::ServerConfig::default();
        config.limits.allow_encoded_slash = true;
        for (router, path, want) in [
            (with_fallback(), "/claim/a%2Fb", "299"),
            (without(), "/claim/a%2fb", "400"),
            (without(), "/claim/a/b", "201"),
        ] {
            let mut c =
                crate::testing::MemoryConn::with_config(router, config.clone(), None).unwrap();
            c.feed(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
            let out = String::from_utf8(c.take_output()).unwrap();
            assert_eq!(&out[9..12], want, "{path}: {out}");
        }
    }

    #[test]
    fn exact_then_longest_prefix_then_fallback() {
        let r = Router::new()
            .get("/ip", answer(200))
            .prefix(Method::Get, "/claim/", answer(201))
            .prefix(Method::Get, "/claim/special/", answer(202))
            .fallback(answer(404));
        assert_eq!(status_of(r.find(Method::Get, "/ip")), "handler");
        assert_eq!(status_of(r.find(Method::Head, "/ip")), "handler");
        assert_eq!(status_of(r.find(Method::Post, "/ip")), "405 GET, HEAD");
        assert_eq!(
            status_of(r.find(Method::Delete, "/claim/x")),
            "405 GET, HEAD"
        );
        assert_eq!(status_of(r.find(Method::Get, "/other")), "handler");
        assert_eq!(r.prefixes[0].0, "/claim/special/");
    }

    #[test]
    fn no_fallback_means_not_found() {
        let r = Router::new().post("/form", answer(200));
        assert_eq!(status_of(r.find(Method::Get, "/nope")), "404");
        assert_eq!(status_of(r.find(Method::Get, "/form")), "405 POST");
    }
}
