//! A request its app hands back: the app's answer names another path of the site
//! (`X-Accel-Redirect: /protected/report.pdf` where the route follows it, or a status the
//! route's `reroute_status` names), and the client gets the answer for that path instead, as
//! nginx's `X-Accel-Redirect` and `proxy_intercept_errors` with `error_page 404 = /path` do.
//!
//! The design, in three steps, all on the worker and without a new state:
//!
//! 1. **Judged on the head.** [`Relay::hand_back`] runs from `take_head` once the app's head
//!    is in, after a retried status went on to the next server and before anything of the
//!    answer reaches the client. The app's body is dropped: read past when it came whole with
//!    the head (the connection may then go back to the pool), else the connection is closed
//!    with it unread.
//! 2. **Answered by the route's site.** The original request is gone by now (the relay holds
//!    only the bytes it sends upstream), so the route that forwarded left a closure beside its
//!    `Forward` ([`crate::Handback`], through `HandlerContext::hand_back`), owning the parsed
//!    head it was given. Called
//!    through [`exchange::rerun`], it rebuilds that head with the new path and query (GET, HEAD
//!    staying HEAD) and routes it on the same site, where internal routes answer it; the
//!    handler runs as any exchange's does (its own context, under `catch_unwind`, compressed,
//!    counted and edited as its route says).
//! 3. **Delivered by what it answered.** A whole answer (a file included) goes out through the
//!    sink's [`Sink::whole`], the protocol's own path for a handler's answer, and this relay
//!    ends. A `Forward` (an internal proxy or PHP route) starts this relay over in place with
//!    the new request, exactly as a retry goes to another server: the old connection is let
//!    go first (pooled if its answer was read whole), then the new route's servers are
//!    connected. No request body goes to the new route; one the client is still sending is
//!    left unread and the connection closes after the answer.
//!
//! Which of the app's fields carry over to the final answer follows nginx (see [`carried`]).

use std::sync::Arc;

use tern_codec::{ResponseBody, UpstreamHead};
use tern_runtime::ratelog;

use super::{Relay, RelayStart};
use crate::compression::Choice;
use crate::exchange::{self, ConnCx, Outcome, Sink};
use crate::handler::{Handback, Handoff, Reply};
use crate::response::Response;
use crate::upstream::{handoff_target, Forward, UpstreamOutcome};

/// The app's fields that go on to the final answer of an `X-Accel-Redirect`: those nginx
/// copies before it follows the header. In `src/http/ngx_http_upstream.c`, the
/// `ngx_http_upstream_headers_in` table marks them with its last column (`redirect`), and
/// `ngx_http_upstream_process_headers` runs their copy handlers when `X-Accel-Redirect` is
/// there, then makes the internal redirect: `Content-Type`, `Set-Cookie`,
/// `Content-Disposition`, `Cache-Control`, `Expires`, `Accept-Ranges`. Every other field of
/// the app's answer is dropped with it.
const CARRIED_ON_ACCEL: &[&str] = &[
    "content-type",
    "set-cookie",
    "content-disposition",
    "cache-control",
    "expires",
    "accept-ranges",
];

impl Relay {
    /// Hands the request back to its route when the app's answer asks for it and the route
    /// takes it (see the module doc): a status in its `reroute_status` first (nginx
    /// intercepts before it looks at `X-Accel-Redirect`), then `X-Accel-Redirect` where
    /// `x_accel_redirect` is on. Returns the bytes of `data` used (the head, and the body if it
    /// came whole), or `None`: the answer goes to the client as it is.
    pub(super) fn hand_back(
        &mut self,
        head: &UpstreamHead<'_>,
        data: &[u8],
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> Option<usize> {
        let handback = self.handback.as_deref()?;
        let (target, carry, why): (&[u8], Carried, &str) = match handback
            .reroute_status
            .iter()
            .find(|(status, _)| *status == head.status)
        {
            Some((_, path)) => (path.as_bytes(), carried(head, false), "reroute_status"),
            None if handback.x_accel_redirect => {
                let value = field(head, "x-accel-redirect")?;
                (value, carried(head, true), "X-Accel-Redirect")
            }
            None => return None,
        };
        let target = handoff_target(target).map(|(p, q)| (p.into_owned(), q.map(str::to_owned)));
        // The app's answer ends here for the client: its body is read past when it is all in
        // `data` (the connection stays in step), else dropped with the connection.
        let rest = (data.len() - head.head_len) as u64;
        // A FastCGI answer that ended (`END_REQUEST`) is all in `data`, whatever its framing.
        let ended = self.fastcgi.as_ref().is_some_and(|f| f.ended_cleanly());
        let (used, whole) = match head.body {
            ResponseBody::None => (head.head_len, true),
            ResponseBody::Length(n) if rest >= n => (head.head_len + n as usize, true),
            _ => (data.len(), ended),
        };
        self.upstream_keep = head.keep_alive && whole && !self.fwd.upgrade;
        let (path, query) = match target {
            Ok(t) => t,
            Err(e) => {
                if ratelog::admit("handoff_target", cx.clock.now_ms()) {
                    let value = String::from_utf8_lossy(target_text(head, why));
                    tracing::warn!(upstream = %self.addr(), "the app's {why} {value:?} names no path tern can route ({e}); answered 502");
                }
                // The app's mistake, not its server's failure: its health is not blamed.
                self.outcome = UpstreamOutcome::Abandoned;
                self.upstream_keep = false;
                self.answer_own(
                    502,
                    "bad gateway: the app handed the request to a path that cannot be routed\n",
                    sink,
                    cx,
                );
                return Some(used);
            }
        };
        let reenter = self.handback.take()?.reenter;
        let to = Handoff {
            path: &path,
            query: query.as_deref(),
            unix_secs: cx.clock.unix_secs(),
            now_ms: cx.clock.now_ms(),
        };
        let carry = Arc::new(carry);
        let onto = |reply: &mut Reply| carry.onto(reply);
        let who = (self.conn, self.exchange);
        match exchange::rerun(reenter, &to, &onto, who, &mut self.tally, cx) {
            Outcome::Respond(r) => self.answer_whole(r, sink, cx),
            Outcome::Forward(fwd, compress, handback) => {
                self.start_over(fwd, compress, handback, sink, cx)
            }
            Outcome::Deferred => {
                // Its reply would come through the inbox to an exchange no table awaits.
                if ratelog::admit("handoff_deferred", cx.clock.now_ms()) {
                    tracing::error!(path = %path, "a handed-back request reached a route that answers later, which a hand-off cannot wait for; answered 500");
                }
                self.outcome = UpstreamOutcome::Abandoned;
                self.answer_own(500, "internal error\n", sink, cx);
            }
            Outcome::Drop => {
                // The route closes the connection without an answer (far over a rate limit).
                self.close_client = true;
                sink.reset();
                self.handed_back(cx);
            }
        }
        Some(used)
    }

    /// The final answer, whole, in place of the app's.
    pub(super) fn answer_whole(&mut self, r: Response, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        // A request body still coming from the client is left unread.
        self.close_client |= self.client_body.is_some();
        self.status = r.status;
        self.head_sent = true;
        if let Some(log) = self.log.as_mut() {
            log.cache = r.cache_outcome;
        }
        sink.whole(r, self.tally, self.close_client, self.log.take(), cx);
        self.handed_back(cx);
    }

    /// The app's exchange is over, well (it answered), and the client's answer given by
    /// another (the sink counted and logged it).
    fn handed_back(&mut self, cx: &mut ConnCx<'_>) {
        self.log_fastcgi_stderr(cx);
        self.encoder = None;
        self.outcome = UpstreamOutcome::Ok;
        self.phase = super::Phase::Done;
        self.deadline_ms = u64::MAX;
    }

    /// This relay becomes the relay of the route's new `Forward`, its log line and row of
    /// counters kept; the connection still attached is let go first.
    fn start_over(
        &mut self,
        mut fwd: Box<Forward>,
        compress: Option<Choice>,
        handback: Option<Box<Handback>>,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) {
        fwd.upgrade = false;
        let keep = self.attached && self.reusable();
        let close_client = self.close_client || self.client_body.is_some();
        self.log_fastcgi_stderr(cx);
        if let Some(f) = self.fastcgi.as_mut() {
            f.recycle(cx.buffers);
        }
        let start = RelayStart {
            fwd,
            compress,
            head_only: self.head_only,
            handshake_is_ours: false,
            body: &[],
            streamed: None,
            log: self.log.take(),
            tally: self.tally,
            conn: self.conn,
            exchange: self.exchange,
            handback,
        };
        let attached = self.attached;
        *self = Relay::start(start, sink, cx);
        self.attached = attached;
        self.close_client |= close_client;
        if attached {
            self.held_over = Some(keep);
        }
    }
}

/// The first value of the answer's field `name`.
fn field<'h>(head: &UpstreamHead<'h>, name: &str) -> Option<&'h [u8]> {
    head.headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

/// What the app named, for the log line of a target refused.
fn target_text<'h>(head: &UpstreamHead<'h>, why: &str) -> &'h [u8] {
    if why == "X-Accel-Redirect" {
        field(head, "x-accel-redirect").unwrap_or_default()
    } else {
        b""
    }
}

/// The app's fields that go on to the final answer: on `X-Accel-Redirect` those nginx copies
/// ([`CARRIED_ON_ACCEL`]); on a status the route reroutes, only a 401's `WWW-Authenticate`, as
/// nginx's `ngx_http_upstream_intercept_errors` copies it (the app's other fields describe an
/// answer the client never gets).
fn carried(head: &UpstreamHead<'_>, accel: bool) -> Carried {
    let wanted = |name: &str| {
        if accel {
            CARRIED_ON_ACCEL
                .iter()
                .any(|c| name.eq_ignore_ascii_case(c))
        } else {
            head.status == 401 && name.eq_ignore_ascii_case("www-authenticate")
        }
    };
    Carried(
        head.headers
            .iter()
            .filter(|h| wanted(h.name))
            .map(|h| (h.name.into(), h.value.into()))
            .collect(),
    )
}

/// Fields of the app's answer that go on to the final one.
struct Carried(Vec<(Box<str>, Box<[u8]>)>);

impl Carried {
    /// Puts the fields on an answer that is not an error (an error's own body is not what they
    /// describe). `over`: they replace the answer's fields of their names (a file or a fixed
    /// answer tern makes: the app said what the file is, as nginx's static module keeps the
    /// app's `Content-Type`); else they go only where the answer has none of the name (an
    /// upstream describes its own answer, as nginx takes the last upstream's `Content-Type`).
    /// `Set-Cookie` is added beside the answer's own either way.
    fn apply(&self, r: &mut Response, over: bool) {
        if r.status >= 400 {
            return;
        }
        let cookie = |name: &str| name.eq_ignore_ascii_case("set-cookie");
        let mut skip: Vec<&str> = Vec::new();
        for (name, _) in &self.0 {
            if cookie(name) {
                continue;
            }
            if over {
                r.remove_header(name);
            } else if r.header(name).is_some() {
                skip.push(name);
            }
        }
        for (name, value) in &self.0 {
            if skip.iter().any(|s| s.eq_ignore_ascii_case(name)) {
                continue;
            }
            // From the upstream parser: a token name and a value without CR, LF or NUL.
            r.push_parsed_header(name, value);
        }
    }

    /// Puts the fields on the final reply: now on an answer, or on a forwarded one's head
    /// when it comes (after the route's own edits).
    fn onto(self: &Arc<Self>, reply: &mut Reply) {
        if self.0.is_empty() {
            return;
        }
        match reply {
            Reply::Now(r) => self.apply(r, true),
            Reply::Forward(fwd) => {
                let edit = fwd.edit.take();
                let carried = self.clone();
                fwd.edit = Some(Arc::new(move |r: &mut Response| {
                    if let Some(edit) = &edit {
                        edit(r);
                    }
                    carried.apply(r, false);
                }));
            }
            _ => {}
        }
    }
}
