//! tern-proxy: the reverse proxy, as an app on the server's public API.
//!
//! A [`Proxy`] is a handler: for each request it chooses nothing itself but writes the head
//! the upstream will see ([`head`]: hop-by-hop fields and the client's claims about itself
//! removed, `X-Forwarded-*` and `Forwarded` set, `X-Auth-User`/`-Realm` from the guard) and answers `Reply::Forward` with its [`UpstreamGroup`]
//! ([`group`]: which server, round-robin or least connections, skipping those that failed
//! recently). The server's worker then relays the exchange on its own upstream connections
//! (`tern_server::upstream`): no other thread and no lock on the way.

pub mod fastcgi;
pub mod group;
pub mod head;
pub mod health;

use std::sync::Arc;

use tern_server::{
    Forward, Handler, HandlerContext, Method, Reply, Request, RequestHead, Response,
};
use tern_services::TrustedProxies;

pub use group::{Balance, GroupOptions, UpstreamGroup, UpstreamServer};
pub use health::HealthCheck;

/// How a proxy route rewrites requests.
#[derive(Debug, Clone, Default)]
pub struct ProxyOptions {
    /// The Host the upstream sees; None: the client's own.
    pub host: Option<String>,
    /// Peers whose `X-Forwarded-*`/`Forwarded` fields are extended rather than replaced.
    pub trusted: TrustedProxies,
    /// The gate's cookie name, when a gate runs on this server: its session cookies
    /// (`NAME`, `NAME.realm`, `__Host-` ones) are kept from the app, which has no use for
    /// them and could leak them (a log of request headers).
    pub gate_cookie: Option<String>,
    /// Edits of the request head the app gets (`add_request_headers`,
    /// `remove_request_headers`), after tern's own fields.
    pub request_headers: RequestEdits,
}

/// Fields set on (replacing any of the same name, the client's or tern's forwarding ones)
/// or removed from the request an app gets; values may hold `$client`, `$scheme`, `$host`,
/// `$request_id`.
#[derive(Debug, Clone, Default)]
pub struct RequestEdits {
    pub set: Vec<(String, tern_services::template::Template)>,
    pub remove: Vec<String>,
}

impl RequestEdits {
    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }

    /// Whether the field `name` is dropped for an edit.
    fn replaces(&self, name: &str) -> bool {
        self.remove.iter().any(|n| n.eq_ignore_ascii_case(name))
            || self.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// A proxy route's handler.
pub struct Proxy {
    group: Arc<UpstreamGroup>,
    options: ProxyOptions,
}

impl Proxy {
    pub fn new(group: Arc<UpstreamGroup>, options: ProxyOptions) -> Proxy {
        Proxy { group, options }
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
        let built = head::build(req, &self.options, cx.identity(), cx.request_id());
        Reply::Forward(Box::new(Forward {
            upstreams: self.group.clone(),
            head: built.head,
            idempotent: matches!(
                req.method(),
                Method::Get | Method::Head | Method::Put | Method::Delete | Method::Options
            ),
            upgrade: built.upgrade,
            edit: None,
            own_answers: None,
            max_body: u64::MAX,
            wire: tern_server::UpstreamWire::Http1,
            not_before_ms: 0,
        }))
    }

    /// Bodies stream through to the upstream, whatever their size.
    fn streams_body(&self, _head: &RequestHead<'_>) -> bool {
        true
    }
}
