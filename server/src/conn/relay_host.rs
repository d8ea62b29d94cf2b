//! The surface a client connection that relays exchanges shows the driver
//! (`driver/relay.rs`) and a relay's upstream half (`upstream.rs`): a TCP connection's
//! (`Conn`, `relays.rs`) and an HTTP/3 connection's (`quic/conn/relays.rs`) alike.

use std::sync::Arc;

use super::relay::RelayNeed;
use crate::exchange::ConnCx;
use crate::handler::ExchangeId;
use crate::upstream::Upstreams;

/// A client connection whose exchanges are relayed to upstream servers, as the driver
/// (`driver/relay.rs`) and a relay's upstream half (`upstream.rs`) reach it: each call names a
/// relay by its exchange's id.
pub(crate) trait RelayHost {
    /// The connection's key in its worker (upstream connections name their owner by it).
    fn key(&self) -> u64;
    /// Exchanges are being relayed.
    fn in_relay(&self) -> bool;
    /// The ids of the relays under way, appended to `into`.
    fn relay_ids(&self, into: &mut Vec<ExchangeId>);
    fn relay_need(&self, id: ExchangeId) -> RelayNeed;
    fn relay_upstreams(&self, id: ExchangeId) -> Option<Arc<dyn Upstreams>>;
    fn relay_attached(&mut self, id: ExchangeId, reused: bool, connected: bool, cx: &ConnCx<'_>);
    fn relay_connected(&mut self, id: ExchangeId, cx: &ConnCx<'_>);
    /// The upstream connection was detached: unless another try follows, the exchange is over.
    fn relay_released(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>);
    /// What `relay_send_buf` gave was handed to a backend whose send completes later.
    fn relay_seal(&mut self, id: ExchangeId);
    fn relay_send_buf(&self, id: ExchangeId) -> &[u8];
    fn relay_sent(&mut self, id: ExchangeId, n: usize, cx: &ConnCx<'_>);
    /// Where to read the upstream's bytes: as much as the client side has room for (empty:
    /// nothing now).
    fn relay_recv_buf(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) -> &mut [u8];
    fn relay_recv(&mut self, id: ExchangeId, n: usize, cx: &mut ConnCx<'_>);
    /// The upstream closed (`error`: the connection failed).
    fn relay_closed(&mut self, id: ExchangeId, error: bool, cx: &mut ConnCx<'_>);
    fn relay_connect_failed(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>);
    /// A tunnel's client ended its side: the upstream connection's write side is due to be
    /// shut.
    fn relay_wants_shutdown(&self, id: ExchangeId) -> bool;
    fn relay_shut_down(&mut self, id: ExchangeId);
    /// The connection is closing: its relays end unfinished (counted; their upstream
    /// connections are closed by the driver).
    fn abandon_relays(&mut self, cx: &ConnCx<'_>);
}
