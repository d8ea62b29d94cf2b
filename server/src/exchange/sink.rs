//! Where an exchange's answer goes when it comes in pieces (an upstream's answer through the
//! relay, `conn/relay/`), framed by the client's protocol: HTTP/1.1 bytes (`conn/http1.rs`:
//! chunking, `Connection`, 1xx, the 101 tunnel), or HTTP/2 and HTTP/3 frames, made from the
//! answer one shared sink holds for their stream (`conn/relay/held.rs`). The relay speaks only
//! to this, so a new protocol gets proxying by implementing it. A protocol lends a sink for
//! one exchange at a time, so its calls carry no exchange id.

use super::context::ConnCx;
use crate::access_log::SavedEntry;
use crate::response::Response;
use crate::stats::Tally;

pub(crate) trait Sink {
    /// How many more body bytes the client side takes now (0: none until the client reads).
    fn room(&self) -> usize;

    /// Streaming-encoder state the connection's other exchanges hold now (HTTP/2: its other
    /// streams, see `compression::CONN_ENCODER_BUDGET`). HTTP/1.1 runs one exchange at a time.
    fn encoders_held(&self) -> usize {
        0
    }

    /// The answer's head (`r`: status and end-to-end fields). `len`: its body's length, if
    /// known; `body`: a body follows (false: none, or a HEAD answer); `close`: the client's
    /// connection cannot carry another exchange after this one.
    fn head(&mut self, r: Response, len: Option<u64>, body: bool, close: bool, cx: &mut ConnCx<'_>);

    /// An interim answer (1xx other than 100), for a protocol that passes them on.
    fn interim(&mut self, r: &Response, cx: &mut ConnCx<'_>);

    /// The upstream switched protocols: the exchange is a tunnel from now on. `r`: the
    /// end-to-end fields it sent; `upgrade`: its `Upgrade` field. Returns the status the
    /// client was answered with (HTTP/1.1: 101; HTTP/2's extended CONNECT: 200).
    fn tunnel(&mut self, r: Response, upgrade: Option<&[u8]>, cx: &mut ConnCx<'_>) -> u16;

    /// Body bytes (or a tunnel's), as many as [`Sink::room`] allowed or fewer.
    fn data(&mut self, bytes: &[u8], cx: &mut ConnCx<'_>);

    /// The body is complete.
    fn end(&mut self, cx: &mut ConnCx<'_>);

    /// The answer broke after its head went out: it can never be completed honestly
    /// (HTTP/1.1 closes the connection after what is queued; HTTP/2 resets the stream).
    fn reset(&mut self);

    /// A whole answer in place of the upstream's, nothing of which went out (a route's
    /// answer to a request its app handed back, `conn/relay/handoff.rs`), with a body of any
    /// kind (a file goes by `sendfile`): sent, counted under `tally` and logged (`log`: the
    /// request's part of its line) as a handler's answer is. `close`: the client's connection
    /// cannot carry another exchange after it.
    fn whole(
        &mut self,
        r: Response,
        tally: Tally,
        close: bool,
        log: Option<Box<SavedEntry>>,
        cx: &mut ConnCx<'_>,
    );
}
