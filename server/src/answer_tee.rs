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

    /// The answer's body ends only with the upstream's connection, so a cut one could not
    /// be told from a whole one: nothing of it is copied (`head` is not called). The tee is
    /// dropped after.
    fn unsized_body(&mut self) {}

    /// Body bytes as decoded from the upstream's framing. False: no more is wanted (the copy
    /// is abandoned).
    fn body(&mut self, data: &[u8]) -> bool;

    /// The body came whole (the framing said where it ended).
    fn end(self: Box<Self>, unix_secs: u64);

    /// The app answered 304 to a conditional request the handler made for the copy (a
    /// stale entry's refresh): the whole answer the client gets in its place, if the tee has
    /// one (`head`: the 304's fields, as in [`AnswerTee::head`]). None: the 304 goes on as
    /// any answer.
    fn not_modified(
        &mut self,
        _head: &Response,
        _date: Option<&[u8]>,
        _unix_secs: u64,
    ) -> Option<Response> {
        None
    }
}

/// A forwarded request that waits before it goes: a cache miss whose key another request is
/// filling now waits for that fill (coalescing). The relay holds the exchange in its wait
/// phase (the one [`Forward::not_before_ms`](crate::upstream::Forward) starts: nothing sent,
/// no worker held, other exchanges of the connection going on) and asks again each time the
/// instant it was given passes; on the connection's worker, so an answer's counts are that
/// worker's.
pub trait Hold: Send {
    /// The wait is over or its instant came (`now_ms`: the worker's monotonic clock,
    /// `unix_secs`: its wall clock).
    fn poll(&mut self, unix_secs: u64, now_ms: u64) -> HoldStep;
}

/// What a held request does next.
pub enum HoldStep {
    /// Asked again at this instant (the worker's clock, ms).
    Wait(u64),
    /// Goes to the upstream now, with a copy of its answer for a fill if it took the fill
    /// over.
    Go(Option<Box<dyn AnswerTee>>),
    /// Answered with this in place of the upstream's (edited and compressed as the route
    /// says for the upstream's, counted and logged as a handler's answer).
    Answer(Response),
}

/// An answer in place of the app's when the app fails: a 5xx from it, or none at all (no
/// connection, a timeout, a broken answer) before anything went to the client. A shared
/// cache's stale entry (RFC 5861 `stale-if-error`).
pub trait Fallback: Send {
    /// The answer to give, if there is one still (`unix_secs`: the worker's clock); edited
    /// and compressed as the upstream's would have been.
    fn answer(&mut self, unix_secs: u64) -> Option<Response>;
}
