//! One exchange, whatever the protocol: [`dispatch`] begins its access-log entry, gives the
//! server's own answers (ACME, the https redirect), routes the request and runs the handler (a
//! panic answers 500 and the worker lives on), and says what the protocol must do with the
//! outcome. Written once for HTTP/1.1 and HTTP/2 (and any protocol after them): a protocol
//! parses, calls [`dispatch`], parks deferred replies in [`Awaiting`], and takes a relayed
//! answer through its [`Sink`]. The context a connection runs with ([`ConnCx`], what it
//! borrows of its worker) is defined in this layer (`context.rs`), below the connection, so
//! that nothing under the worker names the worker.

mod awaiting;
mod context;
mod sink;

use std::panic::{catch_unwind, AssertUnwindSafe};

use tern_codec::{Method, RequestError, RequestHead};
use tern_runtime::ratelog;

use crate::access_log::LogEntry;
use crate::bans::BanCause;
use crate::compression::{self, Choice};
use crate::fault;
use crate::handler::{
    ExchangeId, Handback, HandlerContext, Handoff, LogTarget, Reenter, Refusal, Reply, Request,
    Rerun,
};
use crate::response::{Body, Response};
use crate::router::RouteMatch;
use crate::stats::{AnswerRow, Counter, Tally};
use crate::upstream::Forward;

pub(crate) use awaiting::Awaiting;
pub(crate) use context::{ConnCx, DateLine, Facts, Link, WorkerClock};
pub(crate) use sink::Sink;

/// What became of a request.
pub(crate) enum Outcome {
    /// Answer this now.
    Respond(Response),
    /// The handler took a `Pending`: the answer comes later through the worker's inbox.
    Deferred,
    /// Close the connection without an answer.
    Drop,
    /// Relay the exchange to an upstream server, its answer compressed by the choice; the
    /// route's hand-back, if its app may hand the request back.
    Forward(Box<Forward>, Option<Choice>, Option<Box<Handback>>),
}

/// Whether the handler of this request takes its body as a stream (it is dispatched on the
/// head, and the body follows through a relay) rather than whole.
pub(crate) fn streams_body(head: &RequestHead<'_>, cx: &ConnCx<'_>) -> bool {
    match cx.router.find(head.method, &head.path) {
        RouteMatch::Handler(h) => h.streams_body(head),
        _ => false,
    }
}

/// One request, whatever its protocol, from its parsed head to what becomes of it: its
/// access-log entry begun in `entry` (borrowing the request's head: a protocol that keeps it
/// past the head saves it, see [`Awaiting::park`]), the server's own answers before any route
/// sees it, then its route's handler (which picks the log, the row it is counted in
/// (`facts.tally`), and whether its answer is compressed). The entry is written in place, not
/// returned beside the outcome: the pair is 250 bytes, copied twice per request.
pub(crate) fn dispatch<'h>(
    head: &RequestHead<'h>,
    body: &[u8],
    link: &Link,
    facts: &mut Facts,
    entry: &mut Option<LogEntry<'h>>,
    cx: &mut ConnCx<'_>,
) -> Outcome {
    if let Some(log) = cx.access_log.as_ref() {
        *entry = Some(log.entry(head, link.peer, cx.clock.now_us()));
    }
    fault::before_routing(&head.path);
    match before_routing(head, link.secure, link.redirect_to_https, cx) {
        Some(response) => Outcome::Respond(response),
        None => run(head, body, link, facts, entry.as_mut(), cx),
    }
}

/// Runs the exchange's handler; its choice of access log goes into `entry`, its choice of
/// row to count the answer in (site, route) into `facts.tally`.
fn run(
    head: &RequestHead<'_>,
    body: &[u8],
    link: &Link,
    facts: &mut Facts,
    entry: Option<&mut LogEntry<'_>>,
    cx: &mut ConnCx<'_>,
) -> Outcome {
    let handler = match cx.router.find(head.method, &head.path) {
        RouteMatch::Handler(h) => h,
        RouteMatch::MethodNotAllowed(allow) => {
            let r = Response::text(405, "method not allowed\n").with_header("Allow", allow);
            return Outcome::Respond(r);
        }
        RouteMatch::NotFound => return Outcome::Respond(Response::text(404, "not found\n")),
        RouteMatch::BadPath => {
            cx.stats.bad_request(RequestError::BadPath);
            return Outcome::Respond(crate::router::bad_path());
        }
    };
    let req = Request {
        head,
        body,
        peer: link.peer,
        secure: link.secure,
        local_port: link.local_port,
        unix_secs: cx.clock.unix_secs(),
        now_ms: cx.clock.now_ms(),
    };
    let answer = |req: &Request<'_>, hcx: &mut HandlerContext<'_>| handler.handle(req, hcx);
    let ran = Ran {
        conn: link.key,
        id: facts.id,
        tally: &mut facts.tally,
        entry,
    };
    answer_with(&answer, &req, ran, cx)
}

/// Who a handler runs for, and where what it chose goes.
struct Ran<'a, 'e> {
    /// The connection's key and the exchange's id, for a reply it defers.
    conn: u64,
    id: ExchangeId,
    /// Takes the row its answer is counted in (site, route).
    tally: &'a mut Tally,
    /// Takes its choice of access log and the request's id.
    entry: Option<&'a mut LogEntry<'e>>,
}

/// Runs a handler (`answer`) on `req` with a fresh context (a panic answers 500), counts a
/// limit's refusal, and says what the protocol must do with its reply (a `Now` answer
/// compressed here, as the handler's route asked).
fn answer_with(
    answer: &impl Fn(&Request<'_>, &mut HandlerContext<'_>) -> Reply,
    req: &Request<'_>,
    ran: Ran<'_, '_>,
    cx: &mut ConnCx<'_>,
) -> Outcome {
    let head = req.head;
    let mut hcx = HandlerContext {
        inbox: cx.inbox,
        conn: ran.conn,
        exchange: ran.id,
        deferred: false,
        worker_id: cx.worker_id,
        log: LogTarget::DEFAULT,
        counted_as: AnswerRow::NONE,
        identity: None,
        request_id: None,
        compress: None,
        refused: None,
        handback: None,
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        fault::in_handler(&req.head.path);
        answer(req, &mut hcx)
    }));
    ran.tally.set_row(hcx.counted_as);
    match hcx.refused {
        Some(Refusal::RateLimited) => cx.stats.bump(Counter::RateLimited),
        Some(Refusal::BodyTooLarge) => cx.stats.bad_request(RequestError::BodyTooLarge),
        Some(Refusal::BadPath) => cx.stats.bad_request(RequestError::BadPath),
        None => {}
    }
    let mut entry = ran.entry;
    if let Some(entry) = entry.as_deref_mut() {
        entry.target = hcx.log;
        entry.request_id = hcx.request_id;
    }
    let choice = hcx.compress.take().map(|policy| Choice::new(policy, head));
    match result {
        Ok(Reply::Now(mut response)) => {
            if let Some(entry) = entry {
                entry.cache = response.cache_outcome;
            }
            if let Some(choice) = &choice {
                compression::fixed(&mut response, choice, cx.stats);
            }
            Outcome::Respond(response)
        }
        Ok(Reply::Later) if hcx.deferred => Outcome::Deferred,
        Ok(Reply::Forward(fwd)) => Outcome::Forward(fwd, choice, hcx.handback.take()),
        Ok(Reply::Drop) => {
            cx.stats.bump(Counter::ConnectionsDropped);
            cx.record_ban(req.peer.ip(), BanCause::Dropped);
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
                let peer = req.peer;
                tracing::error!(path = &*head.path, %peer, "handler panicked; answered 500");
            }
            Outcome::Respond(Response::text(500, "internal error\n").close())
        }
    }
}

/// A request its app handed back (`conn/relay/handoff.rs`): `reenter`, made by the route that
/// forwarded it, builds the request again with the path and query of `to` and has it answered
/// here as any exchange's handler is (exchange `id` of connection `conn`; its row goes into
/// `tally`), `carry` editing the reply before it is compressed (the app's fields that go on to
/// the final answer). A route that never asks for an answer gets a 500.
pub(crate) fn rerun(
    reenter: Reenter,
    to: &Handoff<'_>,
    carry: &dyn Fn(&mut Reply),
    (conn, id): (u64, ExchangeId),
    tally: &mut Tally,
    cx: &mut ConnCx<'_>,
) -> Outcome {
    struct Runner<'r, 'c> {
        conn: u64,
        id: ExchangeId,
        tally: &'r mut Tally,
        carry: &'r dyn Fn(&mut Reply),
        cx: &'r mut ConnCx<'c>,
        outcome: Option<Outcome>,
    }
    impl Rerun for Runner<'_, '_> {
        fn answer(
            &mut self,
            req: &Request<'_>,
            handler: &dyn Fn(&Request<'_>, &mut HandlerContext<'_>) -> Reply,
        ) {
            let carry = self.carry;
            let answer = |req: &Request<'_>, hcx: &mut HandlerContext<'_>| {
                let mut reply = handler(req, hcx);
                carry(&mut reply);
                reply
            };
            let ran = Ran {
                conn: self.conn,
                id: self.id,
                tally: self.tally,
                entry: None,
            };
            self.outcome = Some(answer_with(&answer, req, ran, self.cx));
        }
    }
    let mut runner = Runner {
        conn,
        id,
        tally,
        carry,
        cx,
        outcome: None,
    };
    reenter(to, &mut runner);
    runner
        .outcome
        .unwrap_or_else(|| Outcome::Respond(Response::text(500, "internal error\n")))
}

/// The answer the server gives itself before any route sees the request, whatever the
/// protocol: on a plain listener, an ACME HTTP-01 challenge first (the CA follows redirects,
/// but only to ports 80 and 443), then the redirect of a redirect-only listener
/// (`redirect`: its https port).
fn before_routing(
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
    redirect.map(|port| redirect_to_https(head, port, &cx.config.redirect_http))
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

/// The answer of a redirect-only listener (`--redirect-http`): `settings.status` (308 unless
/// set) to the same path on https, at the host `settings` names for the request's host, or
/// its own. A Host that is not a plain host name or address is refused, so nothing a client
/// sends can shape the Location beyond the path.
fn redirect_to_https(
    head: &RequestHead<'_>,
    https_port: u16,
    settings: &crate::config::RedirectHttp,
) -> Response {
    let host = head
        .header("host")
        .and_then(|h| std::str::from_utf8(h).ok());
    // The host without its port; an IPv6 literal keeps its brackets.
    let name = host.map(|host| match host.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or("", |i| &host[..i + 2]),
        None => host.split(':').next().unwrap_or(""),
    });
    let valid = |name: &str| {
        !name.is_empty()
            && name.len() <= 255
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'))
    };
    let target = match name {
        Some(name) if !valid(name) => return Response::text(400, "bad Host header\n"),
        Some(name) => settings
            .target_for(name)
            .map_or((name, true), |t| (t, false)),
        None => match settings.any.as_deref() {
            Some(t) => (t, false),
            None => return Response::text(400, "a Host header is required\n"),
        },
    };
    let (name, own) = target;
    let mut location = String::with_capacity(name.len() + head.target.len() + 16);
    location.push_str("https://");
    location.push_str(name);
    // A configured target that names its port keeps it (a port forwarded elsewhere).
    let has_port = !own && name.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']'));
    if https_port != 443 && !has_port {
        location.push(':');
        location.push_str(itoa::Buffer::new().format(https_port));
    }
    // Path and query, not the raw target: an absolute-form target names its own host.
    location.push_str(&head.path);
    if let Some(q) = head.query {
        location.push('?');
        location.push_str(q);
    }
    Response::text(settings.status, "this site is served over https\n")
        .with_header("Location", &location)
}
