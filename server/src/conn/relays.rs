//! The relays of a connection as the driver reaches them (`driver/relay.rs`, and the
//! upstream half of a relay, `upstream.rs`): the upstream side's counterparts of the socket
//! methods, one surface whatever the protocol. Each call names a relay by its exchange's id
//! (a stream id on HTTP/2) and is written once here, over the protocol's [`Relays`]
//! (`relay/mod.rs`): HTTP/1.1 keeps one slot, HTTP/2 one per relayed stream. A call finds the
//! relay's slot, hands the relay its event with the sink its answer goes through, and lets the
//! protocol send what came of it ([`Relays::flush`]).
//!
//! Borrows: the slot and its sink are lent by the protocol (`Conn::http`) while the sink may
//! also borrow the connection's output and link beside it (HTTP/1.1 writes its answer there
//! at once); the protocol is matched once per call (`forward!`, `protocol.rs`), and the body
//! is compiled for each protocol, so the sink is called directly, not through a vtable.
//!
//! A new protocol over TCP implements `Relays` and gets its arm in `forward!`; a new relay
//! event is one method here (and the relay's own), plus a `Relays` method only if protocols
//! differ in it. A connection that is not a `Conn` (HTTP/3's, `quic/`) implements
//! [`RelayHost`], the surface the driver and the upstream half use, itself.

use std::sync::Arc;

use super::protocol::{forward, Protocol};
use super::relay::{Relay, RelayNeed, Relays};
use super::relay_host::RelayHost;
use super::types::Timeout;
use super::Conn;
use crate::exchange::{ConnCx, Sink};
use crate::handler::ExchangeId;
use crate::upstream::Upstreams;

impl Conn {
    fn relay(&self, id: ExchangeId) -> Option<&Relay> {
        forward!(&self.http, r => {
            let i = r.slot(id)?;
            Some(r.relay(i))
        })
    }

    fn relay_mut(&mut self, id: ExchangeId) -> Option<&mut Relay> {
        forward!(&mut self.http, r => {
            let i = r.slot(id)?;
            Some(r.relay_mut(i))
        })
    }
}

impl RelayHost for Conn {
    fn key(&self) -> u64 {
        self.link.key
    }

    /// Exchanges are being relayed to upstream servers (see `relay/mod.rs`): the HTTP/1.1
    /// exchange in progress, or HTTP/2 streams.
    fn in_relay(&self) -> bool {
        forward!(&self.http, r => r.count() > 0)
    }

    fn relay_ids(&self, into: &mut Vec<ExchangeId>) {
        forward!(&self.http, r => into.extend((0..r.count()).map(|i| r.id(i))))
    }

    fn relay_need(&self, id: ExchangeId) -> RelayNeed {
        self.relay(id).map_or(RelayNeed::Nothing, Relay::need)
    }

    fn relay_upstreams(&self, id: ExchangeId) -> Option<Arc<dyn Upstreams>> {
        self.relay(id).map(|r| r.upstreams().clone())
    }

    fn relay_attached(&mut self, id: ExchangeId, reused: bool, connected: bool, cx: &ConnCx<'_>) {
        if let Some(r) = self.relay_mut(id) {
            r.attached(reused, connected, cx);
        }
    }

    fn relay_connected(&mut self, id: ExchangeId, cx: &ConnCx<'_>) {
        if let Some(r) = self.relay_mut(id) {
            r.now_connected(cx);
        }
    }

    /// The upstream connection was detached: unless another try follows, the exchange is over
    /// (HTTP/1.1 reads the next request; an HTTP/2 relay stays until its answer is sent).
    fn relay_released(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) {
        forward!(&mut self.http, r => {
            if let Some(i) = r.slot(id) {
                let over = r.relay_mut(i).released(cx);
                r.released(i, over);
            }
        })
    }

    /// What `relay_send_buf` gave was handed to a backend whose send completes later.
    fn relay_seal(&mut self, id: ExchangeId) {
        if let Some(r) = self.relay_mut(id) {
            r.seal_send();
        }
    }

    fn relay_send_buf(&self, id: ExchangeId) -> &[u8] {
        self.relay(id).map_or(&[][..], Relay::send_buf)
    }

    fn relay_sent(&mut self, id: ExchangeId, n: usize, cx: &ConnCx<'_>) {
        if let Some(r) = self.relay_mut(id) {
            r.sent(n, cx);
        }
    }

    /// Where to read the upstream's bytes: as much as the client side has room for (empty:
    /// nothing now).
    fn relay_recv_buf(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) -> &mut [u8] {
        forward!(&mut self.http, r => match r.slot(id) {
            Some(i) => {
                let (relay, sink) = r.parts(i, &mut self.out, &self.link);
                let room = sink.room();
                relay.recv_buf(room, cx)
            }
            None => &mut [],
        })
    }

    fn relay_recv(&mut self, id: ExchangeId, n: usize, cx: &mut ConnCx<'_>) {
        forward!(&mut self.http, r => {
            if let Some(i) = r.slot(id) {
                let (relay, mut sink) = r.parts(i, &mut self.out, &self.link);
                relay.recv(n, &mut sink, cx);
            }
            r.flush(true, &mut self.out, &self.link, cx);
        })
    }

    /// The upstream closed (`error`: the connection failed).
    fn relay_closed(&mut self, id: ExchangeId, error: bool, cx: &mut ConnCx<'_>) {
        forward!(&mut self.http, r => {
            if let Some(i) = r.slot(id) {
                let (relay, mut sink) = r.parts(i, &mut self.out, &self.link);
                relay.closed(error, &mut sink, cx);
            }
            r.flush(false, &mut self.out, &self.link, cx);
        })
    }

    fn relay_connect_failed(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) {
        forward!(&mut self.http, r => {
            if let Some(i) = r.slot(id) {
                let (relay, mut sink) = r.parts(i, &mut self.out, &self.link);
                relay.connect_failed(&mut sink, cx);
            }
            r.flush(false, &mut self.out, &self.link, cx);
        })
    }

    /// A tunnel's client ended its side: the upstream connection's write side is due to be
    /// shut (HTTP/2 WebSocket; an HTTP/1.1 client's close ends its connection instead).
    fn relay_wants_shutdown(&self, id: ExchangeId) -> bool {
        self.relay(id).is_some_and(Relay::wants_shutdown)
    }

    fn relay_shut_down(&mut self, id: ExchangeId) {
        if let Some(r) = self.relay_mut(id) {
            r.shut_down();
        }
    }

    fn abandon_relays(&mut self, cx: &ConnCx<'_>) {
        forward!(&mut self.http, r => r.abandon_all(cx))
    }
}

impl Conn {
    /// A held relay's hold may answer now (its waker rang): it is asked at once, as when its
    /// timer fires. False: no relay of that id is held (it went on, or ended, since).
    pub fn relay_wake(&mut self, id: ExchangeId, cx: &mut ConnCx<'_>) -> bool {
        forward!(&mut self.http, r => {
            let Some(i) = r.slot(id) else { return false };
            if !r.relay(i).is_held() {
                return false;
            }
            let (relay, mut sink) = r.parts(i, &mut self.out, &self.link);
            let room = sink.room() > 0;
            relay.timed_out(room, &mut sink, cx);
            r.flush(false, &mut self.out, &self.link, cx);
            true
        })
    }

    /// The deadline passed: if it was a relay's, the relays due handle it (trying another
    /// server, answering 504, or ending an answer its client stopped taking) and the
    /// connection goes on (true). False: it is a timeout of the connection's, for
    /// [`Conn::time_out`] (an HTTP/1.1 answer its client stopped taking ends the connection
    /// that way).
    pub fn relay_timed_out(&mut self, cx: &mut ConnCx<'_>) -> bool {
        if self.next_deadline(cx).1 != Timeout::Upstream {
            return false;
        }
        let now = cx.clock.now_ms();
        forward!(&mut self.http, r => {
            let one = r.one_exchange();
            let mut ends_connection = false;
            for i in 0..r.count() {
                if !one && r.relay(i).deadline() > now {
                    continue;
                }
                let (relay, mut sink) = r.parts(i, &mut self.out, &self.link);
                let room = sink.room() > 0;
                relay.timed_out(room, &mut sink, cx);
                ends_connection |= one && relay.client_stalled();
            }
            r.flush(false, &mut self.out, &self.link, cx);
            !ends_connection
        })
    }
}
