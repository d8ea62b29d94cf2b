//! The relay's side of an [`AnswerTee`](crate::AnswerTee) (a cache fill): the hooks
//! `answer.rs` calls where the answer's head, body and end go to the client. A copy is only
//! ever dropped here, never allowed to change or delay what the client gets.

use super::Relay;
use crate::exchange::ConnCx;
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
        if !sized || !tee.head(head, content_length, date, cx.clock.unix_secs()) {
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
