//! One exchange, whatever the protocol: route the request, run the handler (a panic answers
//! 500 and the worker lives on), and say what the protocol must do with the outcome.

use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tern_codec::RequestHead;
use tern_runtime::ratelog;

use crate::conn::ConnCx;
use crate::handler::{HandlerContext, LogTarget, Reply, Request};
use crate::response::Response;
use crate::router::RouteMatch;
use crate::stats::Counter;

/// What became of a request.
pub(crate) enum Outcome {
    /// Answer this now.
    Respond(Response),
    /// The handler took a `Pending`: the answer comes later through the worker's inbox.
    Deferred,
    /// Close the connection without an answer.
    Drop,
    /// Relay the exchange to an upstream server.
    Forward(Box<crate::upstream::Forward>),
}

/// Whether the handler of this request takes its body as a stream (it is dispatched on the
/// head, and the body follows through a relay) rather than whole.
pub(crate) fn streams_body(head: &RequestHead<'_>, cx: &ConnCx<'_>) -> bool {
    match cx.shared.router.find(head.method, &head.path) {
        RouteMatch::Handler(h) => h.streams_body(head),
        _ => false,
    }
}

/// Where the request came from, for the handler and for pending replies.
pub(crate) struct Origin {
    pub peer: SocketAddr,
    pub secure: bool,
    pub conn: u64,
    pub seq: u32,
}

/// Runs the exchange; the handler's choice of access log goes into `entry`.
pub(crate) fn run(
    head: &RequestHead<'_>,
    body: &[u8],
    from: Origin,
    entry: Option<&mut crate::access_log::LogEntry<'_>>,
    cx: &mut ConnCx<'_>,
) -> Outcome {
    let handler = match cx.shared.router.find(head.method, &head.path) {
        RouteMatch::Handler(h) => h,
        RouteMatch::MethodNotAllowed(allow) => {
            let r = Response::text(405, "method not allowed\n").with_header("Allow", allow);
            return Outcome::Respond(r);
        }
        RouteMatch::NotFound => return Outcome::Respond(Response::text(404, "not found\n")),
    };
    let req = Request {
        head,
        body,
        peer: from.peer,
        secure: from.secure,
        unix_secs: cx.clock.unix_secs(),
        now_ms: cx.clock.now_ms(),
    };
    let mut hcx = HandlerContext {
        inbox: cx.inbox,
        conn: from.conn,
        seq: from.seq,
        deferred: false,
        worker_id: cx.worker_id,
        log: LogTarget::DEFAULT,
        identity: None,
    };
    let result = catch_unwind(AssertUnwindSafe(|| handler.handle(&req, &mut hcx)));
    if let Some(entry) = entry {
        entry.target = hcx.log;
    }
    match result {
        Ok(Reply::Now(response)) => Outcome::Respond(response),
        Ok(Reply::Later) if hcx.deferred => Outcome::Deferred,
        Ok(Reply::Forward(fwd)) => Outcome::Forward(fwd),
        Ok(Reply::Drop) => {
            cx.stats.bump(Counter::ConnectionsDropped);
            crate::bans::record(cx, from.peer.ip(), crate::bans::BanCause::Dropped);
            Outcome::Drop
        }
        Ok(Reply::Later) => {
            if ratelog::admit("handler_later_without_defer", cx.clock.now_ms()) {
                tracing::error!(path = &*head.path, "handler returned Later without defer()");
            }
            Outcome::Respond(Response::text(500, "internal error\n").close())
        }
        Err(_) => {
            cx.stats.bump(Counter::HandlerPanics);
            if ratelog::admit("handler_panic", cx.clock.now_ms()) {
                let peer = from.peer;
                tracing::error!(path = &*head.path, %peer, "handler panicked; answered 500");
            }
            Outcome::Respond(Response::text(500, "internal error\n").close())
        }
    }
}

/// The answer of a redirect-only listener (`--redirect-http`): 308 to the same host and path
/// on https. A Host that is not a plain host name or address is refused, so nothing a client
/// sends can shape the Location beyond the path.
pub(crate) fn redirect_to_https(head: &RequestHead<'_>, https_port: u16) -> Response {
    let Some(host) = head
        .header("host")
        .and_then(|h| std::str::from_utf8(h).ok())
    else {
        return Response::text(400, "a Host header is required\n");
    };
    // The host without its port; an IPv6 literal keeps its brackets.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or("", |i| &host[..i + 2]),
        None => host.split(':').next().unwrap_or(""),
    };
    let valid = !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'));
    if !valid {
        return Response::text(400, "bad Host header\n");
    }
    let mut location = String::with_capacity(name.len() + head.target.len() + 16);
    location.push_str("https://");
    location.push_str(name);
    if https_port != 443 {
        location.push(':');
        location.push_str(itoa::Buffer::new().format(https_port));
    }
    // Path and query, not the raw target: an absolute-form target names its own host.
    location.push_str(&head.path);
    if let Some(q) = head.query {
        location.push('?');
        location.push_str(q);
    }
    Response::text(308, "this site is served over https\n").with_header("Location", &location)
}
