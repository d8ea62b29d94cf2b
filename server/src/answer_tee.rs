//! A copy of a relayed answer taken as the relay writes it: how a shared cache (the proxy
//! app's, `tern_cache`) fills an entry without a second request to the app. The handler puts
//! an [`AnswerTee`] in its [`Forward`](crate::upstream::Forward); the relay hands it the
//! answer's head (the upstream's fields as the client gets them, before the route's edits and
//! before compression), the body bytes as they are decoded, and tells it when the body came
//! whole. Whatever the tee says, the client's answer is not changed or held back: a tee that
//! wants no more (not cacheable, over its size) is dropped and the relay goes on.

use crate::response::Response;

/// Takes a copy of one relayed answer.
pub trait AnswerTee: Send {
    /// The answer's status and fields (`head`: the upstream's fields the client may see,
    /// before the route's edits; its body is empty) and its declared length. `unix_secs`: the
    /// worker's clock; `date`: the upstream's `Date`, which `head` leaves out (the client gets
    /// tern's), for the answer's age (RFC 9111 §4.2.3). False: nothing of this answer is
    /// wanted.
    fn head(
        &mut self,
        head: &Response,
        content_length: Option<u64>,
        date: Option<&[u8]>,
        unix_secs: u64,
    ) -> bool;

    /// Body bytes as decoded from the upstream's framing. False: no more is wanted (the copy
    /// is abandoned).
    fn body(&mut self, data: &[u8]) -> bool;

    /// The body came whole (the framing said where it ended).
    fn end(self: Box<Self>, unix_secs: u64);
}
