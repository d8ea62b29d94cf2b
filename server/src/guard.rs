//! Guards: a check that stands in front of a handler and decides, before it runs, whether the
//! request may reach it (the gateway's allow / deny / challenge / login-required), and as
//! whom ([`Identity`]).

use std::sync::Arc;

use crate::handler::{Handler, HandlerContext, Reply, Request};
use crate::identity::Identity;

/// What a guard decided about one request.
pub enum Verdict {
    /// Let the request through to the guarded handler.
    Pass,
    /// Let it through as this account: the handler finds it in
    /// [`HandlerContext::identity`] (the reverse proxy names it to the app).
    PassAs(Identity),
    /// Answer in the handler's place (a deny page, a challenge, a login form, or a pending
    /// reply the guard deferred itself).
    Answer(Reply),
}

/// A check run before a handler, on the worker: it must be cheap and never block (anything
/// slow goes through `cx.defer()`, as in a handler).
pub trait Guard: Send + Sync + 'static {
    fn check(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Verdict;
}

/// A handler behind a guard; itself a handler, so it can stand for a route, a whole router
/// (a site) or a fallback.
pub struct Guarded<H> {
    guard: Arc<dyn Guard>,
    inner: H,
}

impl<H: Handler> Guarded<H> {
    pub fn new(guard: Arc<dyn Guard>, inner: H) -> Guarded<H> {
        Guarded { guard, inner }
    }
}

impl<H: Handler> Handler for Guarded<H> {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        match self.guard.check(req, cx) {
            Verdict::Pass => self.inner.handle(req, cx),
            Verdict::PassAs(identity) => {
                cx.identity = Some(identity);
                self.inner.handle(req, cx)
            }
            Verdict::Answer(reply) => reply,
        }
    }

    /// A guarded proxy route still streams: the guard runs on the head, before any body.
    fn streams_body(&self, head: &tern_codec::RequestHead<'_>) -> bool {
        self.inner.streams_body(head)
    }
}
