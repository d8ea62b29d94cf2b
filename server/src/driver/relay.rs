//! Drives a client connection that is relaying exchanges: its client socket and the upstream
//! sockets of its relays, in turns, until neither side can move. Every socket goes through
//! the one socket loop (`driver::pump`): the client's with its `Conn`, an upstream's with the
//! relay's upstream half (`conn::upstream::UpstreamView`) or, for a TLS handshake and the
//! look before pooling, its TLS session alone (`TlsRecords`). What is left here is the
//! relays' bookkeeping: connecting, taking from and giving back to the pool
//! (`driver/pool.rs`), counting, and the order of turns.

use tern_runtime::io::{Io, Waiting};
use tern_runtime::ratelog;

use super::pool::{UpConn, UpstreamConns};
use super::{pump, Entry};
use crate::conn::upstream::{Handshake, TlsRecords, UpstreamView};
use crate::conn::{RelayHost, RelayNeed, Status};
use crate::exchange::ConnCx;
use crate::handler::ExchangeId;
use crate::stats::UpstreamCounter;
use crate::upstream::UpstreamOutcome;

/// Rounds of client-then-upstream work per call before yielding to other connections (a
/// fast download through the proxy must not hold the worker).
const MAX_ROUNDS: usize = 64;
/// Upstream connections one client connection may hold at once. An HTTP/2 client may open
/// a hundred streams on one TCP connection; one upstream connection (and its buffers) each
/// would let it multiply its weight on the upstream by as much. Further streams wait for a
/// connection to be released (browsers hold six per host over HTTP/1.1 for the same reason).
pub(crate) const MAX_UPSTREAMS_PER_CONN: usize = 16;

/// The worker's sockets, lent to a connection's turn: the backend, and the upstream side.
pub(crate) struct Sockets<'a, I: Io> {
    pub io: &'a mut I,
    pub conns: &'a mut UpstreamConns<I>,
    /// Scratch for the relay ids of a connection.
    pub ids: &'a mut Vec<ExchangeId>,
}

/// Drives the connection's client side, and, while it relays, its upstream side too.
pub(crate) fn drive<I: Io>(
    e: &mut Entry<I>,
    up: &mut Sockets<'_, I>,
    readable: bool,
    fin: bool,
    cx: &mut ConnCx<'_>,
) -> Status {
    let mut status = crate::driver::drive(&mut e.conn, &mut e.sock, up.io, readable, fin, cx);
    if e.upstreams.is_empty() && !e.conn.in_relay() {
        return status; // the common case: one check
    }
    let mut rounds = 0;
    while status != Status::Close {
        if !step(&mut e.conn, &mut e.upstreams, up, cx) {
            break;
        }
        status = crate::driver::drive(&mut e.conn, &mut e.sock, up.io, false, false, cx);
        rounds += 1;
        if rounds == MAX_ROUNDS && status == Status::Open {
            status = Status::Yielded;
            break;
        }
    }
    if status == Status::Close {
        abandon(e, up, cx);
    }
    status
}

/// The client connection is closing: its upstream connections (if any) are closed too; what
/// they were relaying cannot be finished.
pub(crate) fn abandon<I: Io>(e: &mut Entry<I>, up: &mut Sockets<'_, I>, cx: &mut ConnCx<'_>) {
    abandon_host(&mut e.conn, &mut e.upstreams, up, cx);
}

/// [`abandon`] for any connection that relays (`upstreams`: its relays' upstream connections).
pub(crate) fn abandon_host<I: Io, H: RelayHost>(
    host: &mut H,
    upstreams: &mut Vec<(ExchangeId, u64)>,
    up: &mut Sockets<'_, I>,
    cx: &mut ConnCx<'_>,
) {
    host.abandon_relays(cx);
    for (_, key) in upstreams.drain(..) {
        if let Some(c) = up.conns.get_mut(key) {
            c.release_buffers(cx.buffers);
            c.set.end(
                cx.worker_id,
                c.server,
                UpstreamOutcome::Abandoned,
                cx.clock.now_ms(),
            );
        }
        up.conns.close(key);
    }
}

/// One pass over what the connection's relays need (`upstreams`: the upstream connection
/// each relay has). True if anything moved (the client side may then have output to send or
/// input to take).
pub(crate) fn step<I: Io, H: RelayHost>(
    host: &mut H,
    upstreams: &mut Vec<(ExchangeId, u64)>,
    up: &mut Sockets<'_, I>,
    cx: &mut ConnCx<'_>,
) -> bool {
    let mut progressed = false;
    let mut ids = std::mem::take(up.ids);
    loop {
        ids.clear();
        host.relay_ids(&mut ids);
        let mut moved = false;
        for &id in &ids {
            moved |= step_one(host, upstreams, up, id, cx);
        }
        if !moved {
            break;
        }
        progressed = true;
    }
    *up.ids = ids;
    progressed
}

/// The upstream connection relay `id` has.
fn attached(upstreams: &[(ExchangeId, u64)], id: ExchangeId) -> Option<u64> {
    upstreams.iter().find(|(i, _)| *i == id).map(|(_, k)| *k)
}

/// What one relay needs, until it needs nothing that can be done now.
fn step_one<I: Io, H: RelayHost>(
    host: &mut H,
    upstreams: &mut Vec<(ExchangeId, u64)>,
    up: &mut Sockets<'_, I>,
    id: ExchangeId,
    cx: &mut ConnCx<'_>,
) -> bool {
    let mut progressed = false;
    loop {
        match host.relay_need(id) {
            RelayNeed::Nothing => return progressed,
            RelayNeed::Release { keep, outcome } => {
                if let Some(i) = upstreams.iter().position(|(i, _)| *i == id) {
                    let (_, key) = upstreams.swap_remove(i);
                    let now = cx.clock.now_ms();
                    let mut waiting = Waiting::Closed;
                    if let Some(c) = up.conns.get_mut(key) {
                        c.set.end(cx.worker_id, c.server, outcome, now);
                        if keep {
                            waiting = look_before_pooling(c, up.io, cx);
                        }
                        c.release_buffers(cx.buffers);
                    }
                    if keep {
                        up.conns.release(key, waiting, now);
                    } else {
                        up.conns.close(key);
                    }
                }
                host.relay_released(id, cx);
            }
            RelayNeed::Connect { server, fresh } => {
                if upstreams.len() >= MAX_UPSTREAMS_PER_CONN {
                    // Waits: a release by another of this connection's relays moves the step
                    // loop on, and this one is asked again.
                    return progressed;
                }
                let Some(set) = host.relay_upstreams(id) else {
                    return progressed;
                };
                set.begin(cx.worker_id, server);
                let now = cx.clock.now_ms();
                let owner = host.key();
                let pooled = if fresh {
                    None
                } else {
                    up.conns
                        .take_idle(set.pool_key(), server, owner, up.io, now)
                };
                if let Some(key) = pooled {
                    cx.stats
                        .bump_upstream(set.counted_as(), UpstreamCounter::Reuses);
                    upstreams.push((id, key));
                    host.relay_attached(id, true, true, cx);
                } else {
                    match up.conns.connect(&set, server, owner, up.io) {
                        Ok(key) => {
                            cx.stats
                                .bump_upstream(set.counted_as(), UpstreamCounter::Connects);
                            upstreams.push((id, key));
                            host.relay_attached(id, false, false, cx);
                        }
                        Err(_) => {
                            set.end(cx.worker_id, server, UpstreamOutcome::Failed, now);
                            host.relay_connect_failed(id, cx);
                        }
                    }
                }
            }
            RelayNeed::Connecting => {
                let Some(c) = attached(upstreams, id).and_then(|k| up.conns.get_mut(k)) else {
                    return progressed;
                };
                match c.poll_connected(up.io) {
                    Ok(false) => return progressed,
                    Err(_) => host.relay_connect_failed(id, cx),
                    Ok(true) => match handshake(c, up.io, cx) {
                        Handshake::Pending => return progressed,
                        Handshake::Done => host.relay_connected(id, cx),
                        Handshake::Failed(_) => host.relay_connect_failed(id, cx),
                    },
                }
            }
            RelayNeed::Io => {
                let Some(c) = attached(upstreams, id).and_then(|k| up.conns.get_mut(k)) else {
                    return progressed;
                };
                let mut view = UpstreamView::new(host, id, c.tls.as_deref_mut());
                // The loop runs until the upstream socket or the relay can go no further
                // (the relay's own budget bounds what it reads: its client's output).
                pump(&mut view, &mut c.sock, up.io, cx, usize::MAX);
                let moved = view.moved();
                // A tunnel may stay quiet for long: it holds no empty buffer meanwhile.
                c.release_buffers(cx.buffers);
                if !moved {
                    return progressed;
                }
                if matches!(host.relay_need(id), RelayNeed::Io) {
                    // Blocked for now: the client side moves next (or an event comes).
                    return true;
                }
            }
        }
        progressed = true;
    }
}

/// A connection just made: its TLS handshake, through the socket loop (done at once for
/// one without TLS). A failed one is counted by cause and logged (rate-limited).
fn handshake<I: Io>(c: &mut UpConn<I>, io: &mut I, cx: &mut ConnCx<'_>) -> Handshake {
    let Some(tls) = c.tls.as_deref_mut() else {
        return Handshake::Done;
    };
    let mut records = TlsRecords::handshake(tls);
    pump(&mut records, &mut c.sock, io, cx, usize::MAX);
    let state = records.handshake_state();
    c.release_buffers(cx.buffers);
    let row = c.set.counted_as();
    match &state {
        Handshake::Done => cx.stats.bump_upstream(row, UpstreamCounter::TlsHandshakes),
        Handshake::Failed(Some(tls)) => {
            let cause = tern_tls::upstream::failure_cause(tls);
            cx.stats
                .bump_upstream(row, UpstreamCounter::tls_failure(cause));
            if ratelog::admit("upstream_tls_failure", cx.clock.now_ms()) {
                let addr = c.set.addr(c.server).to_string();
                tracing::warn!(upstream = %addr, cause, error = %tls, "TLS handshake with the upstream failed");
            }
        }
        Handshake::Failed(None) | Handshake::Pending => {}
    }
    state
}

/// What waits in an upstream connection whose exchange ended cleanly, before it goes back
/// to the pool. A connection between exchanges must hold nothing: bytes there are an answer
/// to no request of ours (a stray answer, or the answer to a request smuggled in a body the
/// server did not read as one), and the next request sent on it would be answered with them.
/// A short read after the last readiness event proved the socket empty, and anything since
/// is a new event (edge-triggered), seen while it is idle (which closes it). Otherwise (the
/// answer ended exactly where a read buffer did) bytes may be there with no event to come:
/// look, without taking them; over TLS, read the records that came, which may carry no data
/// (a late session ticket), and see what the session holds.
fn look_before_pooling<I: Io>(c: &mut UpConn<I>, io: &mut I, cx: &mut ConnCx<'_>) -> Waiting {
    let unread = c.sock.may_read() || c.sock.peer_fin();
    match c.tls.as_deref_mut() {
        None if unread => io.peek(&mut c.sock.sock),
        None => Waiting::Nothing,
        Some(tls) => {
            if unread {
                pump(&mut TlsRecords::look(tls), &mut c.sock, io, cx, usize::MAX);
            }
            tls.waiting()
        }
    }
}
