//! Requests an app hands back to its route (`X-Accel-Redirect`, a status in the route's
//! `reroute_status`; the relay's side is `server/src/conn/relay/handoff.rs`): the route keeps
//! the request it forwarded ([`Held`], its parsed head owned), and its site answers it again
//! with the path the app named, as a rewrite would route it (internal routes included), GET
//! unless it was HEAD, with no body. Everything else of the head stays as the client sent it
//! and the codec read it: Host (so the site), cookies, `Range`, `Accept-Encoding`, the target
//! the access log and `REQUEST_URI` name.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use tern_server::{
    BodyKind, Handback, Handoff, Method, Reenter, Request, RequestHead, RequestId, Rerun, Response,
    Version,
};

use crate::{answer_on, own_answer, BuiltSite, MAX_REROUTES};

/// What a route does with its app's answers, from [`crate::RouteOptions`].
pub(crate) struct Policy {
    pub x_accel_redirect: bool,
    pub reroute_status: Arc<[(u16, Box<str>)]>,
}

/// Checks a `reroute_status` entry: an answer status an app may give (300-599, as nginx
/// intercepts only those) and a path of the site, with an optional query.
pub fn check_reroute_status(status: u16, target: &str) -> Result<(), String> {
    if !(300..=599).contains(&status) {
        return Err(format!(
            "reroute_status: {status} is not a status that can be rerouted (300-599)"
        ));
    }
    tern_server::upstream::handoff_target(target.as_bytes())
        .map(|_| ())
        .map_err(|e| format!("reroute_status: {status} = {target:?}: {e}"))
}

impl Policy {
    /// The route's hand-back for one forwarded request: `site`'s routes answer it again, as
    /// re-routing number `hops + 1`.
    pub(crate) fn handback(
        &self,
        site: &Arc<BuiltSite>,
        req: &Request<'_>,
        request_id: Option<RequestId>,
        hops: u8,
    ) -> Box<Handback> {
        let held = Held::new(req, request_id);
        let site = site.clone();
        let reenter: Reenter = Box::new(move |to: &Handoff<'_>, run: &mut dyn Rerun| {
            held.with_request(to, |req| {
                let answer = |req: &Request<'_>, cx: &mut tern_server::HandlerContext<'_>| {
                    // What `SiteTable::answer` sets up before the site's routes see a request.
                    cx.log_to(site.log);
                    cx.count_as(site.counted_as);
                    if site.compress.is_some() {
                        cx.compress_with(site.compress.clone());
                    }
                    if let Some(id) = held.request_id {
                        cx.set_request_id(id);
                    }
                    if hops >= MAX_REROUTES {
                        let cycle = Response::text(500, "internal redirection cycle\n");
                        return own_answer(&site, None, cycle, req, cx);
                    }
                    answer_on(&site, req, cx, hops + 1)
                };
                run.answer(req, &answer);
            })
        });
        Box::new(Handback {
            x_accel_redirect: self.x_accel_redirect,
            reroute_status: self.reroute_status.clone(),
            reenter,
        })
    }
}

/// A forwarded request's head, owned (its fields without the body's framing: the request
/// handed back has none), and who sent it.
struct Held {
    head_only: bool,
    target: Box<str>,
    version: Version,
    keep_alive: bool,
    /// Host, or HTTP/2's `:authority`.
    host: Option<Box<[u8]>>,
    fields: Vec<(Box<str>, Box<[u8]>)>,
    /// Which of `fields` the codec took for the head's `accept`, `accept_encoding`,
    /// `if_none_match`, `if_modified_since`, `range`, `if_range`, `referer`, `user_agent`.
    picked: [Option<u16>; 8],
    peer: SocketAddr,
    secure: bool,
    local_port: u16,
    request_id: Option<RequestId>,
}

/// Fields that frame a request body: the request handed back has none.
const BODY_FIELDS: &[&str] = &["content-length", "transfer-encoding", "expect"];

impl Held {
    fn new(req: &Request<'_>, request_id: Option<RequestId>) -> Held {
        let head = req.head;
        let kept: Vec<&httparse::Header<'_>> = head
            .headers
            .iter()
            .filter(|h| !BODY_FIELDS.iter().any(|n| h.name.eq_ignore_ascii_case(n)))
            .collect();
        // The field a head's value was found in (the same slice), by its place in `kept`.
        let place = |value: Option<&[u8]>| -> Option<u16> {
            let value = value?;
            let i = kept.iter().position(|h| std::ptr::eq(h.value, value))?;
            u16::try_from(i).ok()
        };
        let picked = [
            place(head.accept),
            place(head.accept_encoding),
            place(head.if_none_match),
            place(head.if_modified_since),
            place(head.range),
            place(head.if_range),
            place(head.referer),
            place(head.user_agent),
        ];
        Held {
            head_only: head.method == Method::Head,
            target: head.target.into(),
            version: head.version,
            keep_alive: head.keep_alive,
            host: head.host.map(Into::into),
            fields: kept
                .iter()
                .map(|h| (h.name.into(), h.value.into()))
                .collect(),
            picked,
            peer: req.peer,
            secure: req.secure,
            local_port: req.local_port,
            request_id,
        }
    }

    /// The request again, with the path and query the app named, for `f`.
    fn with_request<R>(&self, to: &Handoff<'_>, f: impl FnOnce(&Request<'_>) -> R) -> R {
        let headers: Vec<httparse::Header<'_>> = self
            .fields
            .iter()
            .map(|(name, value)| httparse::Header { name, value })
            .collect();
        let pick = |i: usize| self.picked[i].map(|at| headers[usize::from(at)].value);
        let (method, method_str) = if self.head_only {
            (Method::Head, "HEAD")
        } else {
            (Method::Get, "GET")
        };
        let head = RequestHead {
            method,
            method_str,
            target: &self.target,
            path: Cow::Borrowed(to.path),
            query: to.query,
            version: self.version,
            head_len: 0,
            body: BodyKind::None,
            keep_alive: self.keep_alive,
            expect_continue: false,
            host: self.host.as_deref(),
            accept: pick(0),
            accept_encoding: pick(1),
            if_none_match: pick(2),
            if_modified_since: pick(3),
            range: pick(4),
            if_range: pick(5),
            referer: pick(6),
            user_agent: pick(7),
            headers: &headers,
            protocol: None,
        };
        let req = Request {
            head: &head,
            body: &[],
            peer: self.peer,
            secure: self.secure,
            local_port: self.local_port,
            unix_secs: to.unix_secs,
            now_ms: to.now_ms,
        };
        f(&req)
    }
}
