//! The relay's side of an [`AnswerTee`](crate::AnswerTee) (a cache fill): the hooks
//! `answer.rs` calls where the answer's head, body and end go to the client. A copy is only
//! ever dropped here, never allowed to change or delay what the client gets. And the side of
//! a [`Hold`](crate::Hold) (a miss waiting for another's fill): asked in the wait phase.

use tern_codec::{ResponseBody, UpstreamHead};

use super::Relay;
use crate::answer_tee::HoldStep;
use crate::compression;
use crate::exchange::{ConnCx, Sink};
use crate::response::Response;

impl Relay {
    /// The answer's head, before the route's edits (`date`: the upstream's). `sized`: its framing tells where the body
    /// ends (a length or chunks); a body that ends with the connection cannot be told from a
    /// cut one, so it is never copied.
    pub(super) fn tee_head(
        &mut self,
        head: &Response,
        content_length: Option<u64>,
        sized: bool,
        date: Option<&[u8]>,
        cx: &ConnCx<'_>,
    ) {
        let Some(tee) = self.fwd.tee.as_mut() else {
            return;
        };
        if !sized {
            tee.unsized_body();
            self.fwd.tee = None;
        } else if !tee.head(head, content_length, date, cx.clock.unix_secs()) {
            self.fwd.tee = None;
        }
    }

    /// Body bytes as decoded, before compression.
    pub(super) fn tee_body(&mut self, data: &[u8]) {
        if let Some(tee) = self.fwd.tee.as_mut() {
            if !tee.body(data) {
                self.fwd.tee = None;
            }
        }
    }

    /// The exchange ended; `whole`: the upstream's answer came complete.
    pub(super) fn tee_end(&mut self, whole: bool, cx: &ConnCx<'_>) {
        if let Some(tee) = self.fwd.tee.take() {
            if whole {
                tee.end(cx.clock.unix_secs());
            }
        }
    }
}

impl Relay {
    /// The wait phase ended: a held request asks its hold what now (wait on, go, or take
    /// an answer in place of the upstream's); any other goes.
    pub(super) fn unhold(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) {
        let Some(hold) = self.fwd.hold.as_mut() else {
            return self.begin(sink, cx);
        };
        let now = cx.clock.now_ms();
        match hold.poll(cx.clock.unix_secs(), now) {
            HoldStep::Wait(at) => self.deadline_ms = at.max(now + 1),
            HoldStep::Go(tee) => {
                self.fwd.hold = None;
                if tee.is_some() {
                    self.fwd.tee = tee;
                }
                self.begin(sink, cx);
            }
            HoldStep::Answer(mut r) => {
                self.fwd.hold = None;
                // No upstream was asked: nothing of it is copied.
                self.fwd.tee = None;
                if let Some(edit) = &self.fwd.edit {
                    edit(&mut r);
                }
                if let Some(choice) = &self.compress {
                    compression::fixed(&mut r, choice, cx.stats);
                }
                self.answer_whole(r, sink, cx);
            }
        }
    }
}

impl Relay {
    /// The app failed before anything went to the client: the fallback's answer, if it
    /// has one, goes in place of tern's own error (true).
    pub(super) fn fall_back(&mut self, sink: &mut impl Sink, cx: &mut ConnCx<'_>) -> bool {
        let Some(mut r) = self
            .fwd
            .fallback
            .as_mut()
            .and_then(|f| f.answer(cx.clock.unix_secs()))
        else {
            return false;
        };
        self.fwd.fallback = None;
        self.fwd.tee = None;
        if let Some(edit) = &self.fwd.edit {
            edit(&mut r);
        }
        if let Some(choice) = &self.compress {
            compression::fixed(&mut r, choice, cx.stats);
        }
        self.answer_whole(r, sink, cx);
        true
    }

    /// The app answered 5xx (`head`, at the start of `data`): the fallback's answer goes in
    /// its place, if it has one; the app's body is read past when it came whole with the head
    /// (its connection stays in step), else dropped with the connection. Returns the bytes
    /// used, or None: the app's answer goes on.
    pub(super) fn fall_back_on(
        &mut self,
        head: &UpstreamHead<'_>,
        data: &[u8],
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> Option<usize> {
        self.fwd.fallback.as_ref()?;
        let rest = (data.len() - head.head_len) as u64;
        let ended = self.fastcgi.as_ref().is_some_and(|f| f.ended_cleanly());
        let (used, whole) = match head.body {
            ResponseBody::None => (head.head_len, true),
            ResponseBody::Length(n) if rest >= n => (head.head_len + n as usize, true),
            _ => (data.len(), ended),
        };
        if !self.fall_back(sink, cx) {
            return None;
        }
        self.upstream_keep = head.keep_alive && whole && !self.fwd.upgrade;
        Some(used)
    }
}

impl Relay {
    /// The app's 304 (`head`, its fields in `r`) to a refresh the tee asked for: the tee's
    /// whole answer goes in its place, if it has one. Returns the bytes used (a 304 has no
    /// body), or None: the 304 goes on.
    pub(super) fn revalidated(
        &mut self,
        head: &UpstreamHead<'_>,
        r: &Response,
        sink: &mut impl Sink,
        cx: &mut ConnCx<'_>,
    ) -> Option<usize> {
        let tee = self.fwd.tee.as_mut()?;
        let date = head
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("date"))
            .map(|h| h.value);
        let mut answer = tee.not_modified(r, date, cx.clock.unix_secs())?;
        self.fwd.tee = None;
        self.fwd.fallback = None;
        self.upstream_keep = head.keep_alive && !self.fwd.upgrade;
        if let Some(edit) = &self.fwd.edit {
            edit(&mut answer);
        }
        if let Some(choice) = &self.compress {
            compression::fixed(&mut answer, choice, cx.stats);
        }
        self.answer_whole(answer, sink, cx);
        Some(head.head_len)
    }
}
