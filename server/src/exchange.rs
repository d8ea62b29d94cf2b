//! One exchange, whatever the protocol: route the request, run the handler (a panic answers
//! 500 and the worker lives on), and say what the protocol must do with the outcome. Also the
//! context a connection runs with ([`ConnCx`]): what it borrows of its worker, defined here,
//! below the connection, so that nothing under the worker names the worker.

use std::net::{IpAddr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tern_codec::{Method, RequestError, RequestHead};
use tern_runtime::{ratelog, BufPool, Clock, InboxSender};

use crate::access_log::{LogEntry, WorkerLog};
use crate::bans::{self, BanCause, Bans};
use crate::compression::{self, Choice};
use crate::config::ServerConfig;
use crate::handler::{HandlerContext, LogTarget, Refusal, Reply, Request, WorkerMessage};
use crate::response::{Body, Response};
use crate::router::{RouteMatch, Router};
use crate::stats::{AnswerRow, Counter, Tally, WorkerStats};
use crate::upstream::Forward;

/// Borrowed worker state a connection needs while it runs (the worker builds one per event).
pub(crate) struct ConnCx<'a> {
    pub router: &'a Router,
    /// Automatic HTTPS: HTTP-01 answers on plain listeners (`None` without ACME).
    pub acme: Option<&'a tern_tls::AcmeCerts>,
    /// Where strikes and dropped connections add bans (`Server::with_bans`).
    pub bans: Option<&'a Bans>,
    /// `Strict-Transport-Security: ...\r\n`, for answers over TLS (`--hsts`).
    pub hsts_line: Option<&'a [u8]>,
    /// The worker's settings in force (timeouts, limits; changed by reloads between turns).
    pub config: &'a ServerConfig,
    pub stats: &'a WorkerStats,
    pub clock: &'a Clock,
    pub buffers: &'a mut BufPool,
    /// The worker's buffer for file bytes on their way into TLS.
    pub scratch: &'a mut Vec<u8>,
    /// The worker's access log, if there is one: every answer is recorded there.
    pub access_log: Option<&'a mut WorkerLog>,
    pub inbox: &'a InboxSender<WorkerMessage>,
    pub worker_id: usize,
    /// A stop was requested: no answer keeps its connection alive.
    pub stopping: bool,
    pub draining: bool,
    /// The worker is near its connection limit: answer, but do not keep alive.
    pub near_limit: bool,
}

impl ConnCx<'_> {
    /// An answer with `status` is complete: its class and its duration are counted (one
    /// clock read, the same vDSO call as an access log's duration).
    #[inline]
    pub fn answered(&self, status: u16, tally: Tally) {
        self.stats.answered(status, tally, self.clock.precise_us());
    }

    /// A strike (slow request head) or a dropped connection from `ip`: may add a ban.
    pub fn record_ban(&self, ip: IpAddr, cause: BanCause) {
        if let Some(bans) = self.bans {
            bans::record(bans, self.stats, self.clock, ip, cause);
        }
    }
}

/// What became of a request.
pub(crate) enum Outcome {
    /// Answer this now.
    Respond(Response),
    /// The handler took a `Pending`: the answer comes later through the worker's inbox.
    Deferred,
    /// Close the connection without an answer.
    Drop,
    /// Relay the exchange to an upstream server, its answer compressed by the choice.
    Forward(Box<Forward>, Option<Choice>),
}

/// Whether the handler of this request takes its body as a stream (it is dispatched on the
/// head, and the body follows through a relay) rather than whole.
pub(crate) fn streams_body(head: &RequestHead<'_>, cx: &ConnCx<'_>) -> bool {
    match cx.router.find(head.method, &head.path) {
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

/// Runs the exchange; the handler's choice of access log goes into `entry`, its choice of
/// row to count the answer in (site, route) into `tally`.
pub(crate) fn run(
    head: &RequestHead<'_>,
    body: &[u8],
    from: Origin,
    entry: Option<&mut LogEntry<'_>>,
    tally: &mut Tally,
    cx: &mut ConnCx<'_>,
) -> Outcome {
    let handler = match cx.router.find(head.method, &head.path) {
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
        counted_as: AnswerRow::NONE,
        identity: None,
        request_id: None,
        compress: None,
        refused: None,
    };
    let result = catch_unwind(AssertUnwindSafe(|| handler.handle(&req, &mut hcx)));
    tally.set_row(hcx.counted_as);
    match hcx.refused {
        Some(Refusal::RateLimited) => cx.stats.bump(Counter::RateLimited),
        Some(Refusal::BodyTooLarge) => cx.stats.bad_request(RequestError::BodyTooLarge),
        None => {}
    }
    if let Some(entry) = entry {
        entry.target = hcx.log;
        entry.request_id = hcx.request_id;
    }
    let choice = hcx.compress.take().map(|policy| Choice::new(policy, head));
    match result {
        Ok(Reply::Now(mut response)) => {
            if let Some(choice) = &choice {
                compression::fixed(&mut response, choice, cx.stats);
            }
            Outcome::Respond(response)
        }
        Ok(Reply::Later) if hcx.deferred => Outcome::Deferred,
        Ok(Reply::Forward(fwd)) => Outcome::Forward(fwd, choice),
        Ok(Reply::Drop) => {
            cx.stats.bump(Counter::ConnectionsDropped);
            cx.record_ban(from.peer.ip(), BanCause::Dropped);
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

/// The answer the server gives itself before any route sees the request, whatever the
/// protocol: on a plain listener, an ACME HTTP-01 challenge first (the CA follows redirects,
/// but only to ports 80 and 443), then the redirect of a redirect-only listener
/// (`redirect`: its https port).
pub(crate) fn before_routing(
    head: &RequestHead<'_>,
    secure: bool,
    redirect: Option<u16>,
    cx: &ConnCx<'_>,
) -> Option<Response> {
    if !secure {
        if let Some(response) = acme_http01(head, cx) {
            return Some(response);
        }
    }
    redirect.map(|port| redirect_to_https(head, port))
}

/// RFC 8555 §8.3: `GET /.well-known/acme-challenge/TOKEN` on plain HTTP answers the key
/// authorization while the ACME helper's validation is under way, for any Host.
fn acme_http01(head: &RequestHead<'_>, cx: &ConnCx<'_>) -> Option<Response> {
    let acme = cx.acme?;
    let token = head.path.strip_prefix("/.well-known/acme-challenge/")?;
    if !matches!(head.method, Method::Get | Method::Head) {
        return None;
    }
    let key_authorization = acme.http01(token)?;
    Some(
        Response::new(200)
            .with_header("Content-Type", "application/octet-stream")
            .with_body(Body::Owned(key_authorization.as_bytes().to_vec())),
    )
}

/// The answer of a redirect-only listener (`--redirect-http`): 308 to the same host and path
/// on https. A Host that is not a plain host name or address is refused, so nothing a client
/// sends can shape the Location beyond the path.
fn redirect_to_https(head: &RequestHead<'_>, https_port: u16) -> Response {
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
