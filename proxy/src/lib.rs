//! tern-proxy: the reverse proxy, as an app on the server's public API.
//!
//! A [`Proxy`] is a handler: for each request it chooses nothing itself but writes the head
//! the upstream will see ([`head`]: hop-by-hop fields and the client's claims about itself
//! removed, `X-Forwarded-*` and `Forwarded` set, `X-Auth-User`/`-Realm` from the guard) and answers `Reply::Forward` with its [`UpstreamGroup`]
//! ([`group`]: which server, round-robin or least connections, skipping those that failed
//! recently). The server's worker then relays the exchange on its own upstream connections
//! (`tern_server::upstream`): no other thread and no lock on the way.

pub mod cache;
pub mod fastcgi;
pub mod group;
pub mod head;
pub mod health;

use std::sync::Arc;

use tern_server::{
    Forward, Handler, HandlerContext, Method, Reply, Request, RequestHead, Response,
};

pub use group::{Balance, GroupOptions, HealthCheck, UpstreamGroup, UpstreamServer};
pub use head::{ProxyOptions, RequestEdits};

/// A proxy route's handler.
pub struct Proxy {
    group: Arc<UpstreamGroup>,
    options: ProxyOptions,
    cache: Option<cache::RouteCache>,
}

impl Proxy {
    pub fn new(group: Arc<UpstreamGroup>, options: ProxyOptions) -> Proxy {
        Proxy {
            group,
            options,
            cache: None,
        }
    }

    /// Answers from and fills a shared cache (`cache/`).
    pub fn with_cache(mut self, cache: cache::RouteCache) -> Proxy {
        self.cache = Some(cache);
        self
    }

    pub fn group(&self) -> &Arc<UpstreamGroup> {
        &self.group
    }
}

impl Handler for Proxy {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        // TRACE would echo the client's cookies and credentials back from the app; CONNECT
        // (authority-form, so no route's path matches it anyway) could turn a pooled
        // connection into a tunnel. nginx refuses both too.
        if matches!(req.method(), Method::Trace | Method::Connect) {
            return Response::text(405, "method not allowed\n").into();
        }
        let f = match &self.cache {
            None => cache::Forwarding::plain(),
            Some(c) => match c.lookup(req, &head::key_host(req), &[], cx) {
                cache::Lookup::Hit(answer) => return Reply::Now(answer),
                cache::Lookup::Forward(f) => f,
            },
        };
        let mut built = match (&self.cache, f.keyed) {
            (Some(c), true) => {
                let query = tern_cache::policy::keyed_query(&c.rules().key_query, req.query());
                let keyed = head::Keyed {
                    query: query.as_deref(),
                    fields: &c.rules().key_headers,
                };
                head::build_keyed(req, &self.options, cx.request_id(), &keyed)
            }
            _ => head::build(req, &self.options, cx.identity(), cx.request_id()),
        };
        built.head.extend_from_slice(&f.validators);
        Reply::Forward(Box::new(Forward {
            upstreams: self.group.clone(),
            head: built.head,
            idempotent: matches!(
                req.method(),
                Method::Get | Method::Head | Method::Put | Method::Delete | Method::Options
            ),
            upgrade: built.upgrade,
            not_before_ms: f.not_before_ms(req.now_ms),
            edit: f.edit,
            own_answers: None,
            max_body: u64::MAX,
            wire: tern_server::UpstreamWire::Http1,
            tee: f.tee,
            hold: f.hold,
            fallback: f.fallback,
        }))
    }

    /// Bodies stream through to the upstream, whatever their size.
    fn streams_body(&self, _head: &RequestHead<'_>) -> bool {
        true
    }
}
