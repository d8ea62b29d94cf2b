//! Which server a relay's request goes to: the first the group picks, and the next after one
//! failed it (a failed connect, a pooled connection closed before it answered, a status the
//! route retries), as far as the route's `RetryPolicy` allows: its tries, its time budget, and
//! whether the request may be sent again at all.

use tern_runtime::ratelog;

use super::{Phase, Relay, UpBody};
use crate::exchange::{ConnCx, Sink};
use crate::stats::UpstreamCounter;
use crate::upstream::UpstreamOutcome;

impl Relay {
    /// Picks the first server, or answers 503 when there is none to try.
    pub(super) fn begin(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        self.first_try_ms = cx.clock.now_ms();
        self.pick(cx);
        if self.server.is_none() {
            cx.stats
                .bump_upstream(self.counted_as, UpstreamCounter::Failures);
            if self.fall_back(sink, cx) {
                return;
            }
            self.answer_own(503, "no upstream server is available\n", sink, cx);
        }
    }

    fn pick(&mut self, cx: &mut ConnCx<'_>) {
        let now = cx.clock.now_ms();
        self.server = self.fwd.upstreams.pick(cx.worker_id, now, self.tried);
        self.phase = Phase::Connect;
        self.deadline_ms = u64::MAX;
    }

    /// The server the request goes on to after the current one failed it, if the tries and
    /// the time budget allow one and a server is left; the current one counts as tried.
    fn next_server(&mut self, cx: &ConnCx<'_>) -> Option<usize> {
        if let Some(s) = self.server {
            if s < 64 {
                self.tried |= 1 << s;
            }
        }
        let policy = self.fwd.upstreams.retry();
        let now = cx.clock.now_ms();
        let spent = now.saturating_sub(self.first_try_ms);
        if self.retries >= policy.retries
            || policy.budget.is_some_and(|b| spent >= b.as_millis() as u64)
        {
            return None;
        }
        let next = self.fwd.upstreams.pick(cx.worker_id, now, self.tried)?;
        self.retries += 1;
        Some(next)
    }

    /// The upstream answered a status the route retries (502, 503, 504 as its policy says):
    /// the request goes to the next server if it may be sent again and one is left, and this
    /// answer is dropped (true). Checked before the answer's head goes to the client.
    pub(super) fn retried_on_status(&mut self, status: u16, cx: &mut ConnCx<'_>) -> bool {
        if !self.fwd.upstreams.retry().retries_on(status) || !self.may_retry_on_status() {
            return false;
        }
        let Some(next) = self.next_server(cx) else {
            return false;
        };
        cx.stats
            .bump_upstream(self.counted_as, UpstreamCounter::RetriesStatus);
        if ratelog::admit("upstream_retry_status", cx.clock.now_ms()) {
            tracing::info!(upstream = %self.addr(), status, "upstream answered a retried status; request sent to the next server");
        }
        self.server = Some(next);
        self.restart(false);
        self.outcome = UpstreamOutcome::Failed;
        self.got_bytes = false;
        self.upstream_keep = false;
        true
    }

    /// The whole request is still at hand (no streamed body), nothing has come back, and the
    /// method may be repeated.
    pub(super) fn may_retry(&self) -> bool {
        self.fwd.idempotent
            && self.reused
            && !self.got_bytes
            && !self.retry
            && self.client_body.is_none()
    }

    /// A 502/503/504 answer may send this request to another server: the route asks for it,
    /// the method may be repeated, and the whole request is still at hand (its body came
    /// with its head). Checked before the answer's head goes to the client.
    pub(super) fn may_retry_on_status(&self) -> bool {
        self.fwd.idempotent
            && self.whole_request
            && !self.fwd.upgrade
            && self.fwd.upstreams.retry().retries_on_any()
    }

    /// Back to connecting, sending the request again from the start (`fresh`: not pooled).
    pub(super) fn restart(&mut self, fresh: bool) {
        self.retry = fresh;
        self.to_up.rewind();
        self.phase = Phase::Connect;
        self.outcome = UpstreamOutcome::Abandoned;
        self.deadline_ms = u64::MAX;
        self.up_body = UpBody::Head;
        if let Some(b) = self.from_up.as_mut() {
            b.consume(b.len());
        }
        if let Some(f) = self.fastcgi.as_mut() {
            f.reset();
        }
    }

    pub fn connect_failed(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        cx.stats
            .bump_upstream(self.counted_as, UpstreamCounter::ConnectFailures);
        if let Some(s) = self.server {
            if ratelog::admit("upstream_connect", cx.clock.now_ms()) {
                let addr = self.fwd.upstreams.addr(s);
                tracing::warn!(upstream = %addr, "cannot connect to upstream");
            }
        }
        // Nothing of the request reached a server: another one may take it.
        self.outcome = UpstreamOutcome::Failed;
        self.to_up.rewind();
        self.retry = false;
        let next = self.next_server(cx);
        self.phase = Phase::Connect;
        self.deadline_ms = u64::MAX;
        self.server = next;
        if next.is_some() {
            cx.stats
                .bump_upstream(self.counted_as, UpstreamCounter::RetriesConnect);
        } else {
            self.phase = Phase::Exchange;
            self.answer_own(
                502,
                "bad gateway: no upstream server could be reached\n",
                sink,
                cx,
            );
        }
    }
}
