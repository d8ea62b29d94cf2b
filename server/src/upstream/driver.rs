//! Drives a client connection that is relaying an exchange: the client socket through the
//! ordinary driver (`crate::driver`), and the upstream connection here, in turns, until
//! neither side can move. The relay itself (`conn/relay.rs`) does no I/O; this is the
//! only code that connects, reads and writes upstream sockets.

use std::io;

use tern_runtime::ratelog;

use super::pool::{tls_failure, UpstreamConns};
use super::UpstreamOutcome;
use crate::conn::{RelayNeed, Status};
use tern_runtime::io::Io;

use crate::driver::Entry;
use crate::exchange::ConnCx;
use crate::stats::UpstreamCounter;

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
    pub ids: &'a mut Vec<u32>,
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
        if !step(e, up, cx) {
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
pub(crate) fn abandon<I: Io>(e: &mut Entry<I>, up: &mut Sockets<'_, I>, cx: &ConnCx<'_>) {
    e.conn.abandon_relays(cx);
    for (_, key) in e.upstreams.drain(..) {
        if let Some(c) = up.conns.get_mut(key) {
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

/// One pass over what the connection's relays need. True if anything moved (the client side
/// may then have output to send or input to take).
fn step<I: Io>(e: &mut Entry<I>, up: &mut Sockets<'_, I>, cx: &mut ConnCx<'_>) -> bool {
    let mut progressed = false;
    let mut ids = std::mem::take(up.ids);
    loop {
        ids.clear();
        e.conn.relay_ids(&mut ids);
        let mut moved = false;
        for &id in &ids {
            moved |= step_one(e, up, id, cx);
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
fn attached<I: Io>(e: &Entry<I>, id: u32) -> Option<u64> {
    e.upstreams.iter().find(|(i, _)| *i == id).map(|(_, k)| *k)
}

/// What one relay needs, until it needs nothing that can be done now.
fn step_one<I: Io>(
    e: &mut Entry<I>,
    up: &mut Sockets<'_, I>,
    id: u32,
    cx: &mut ConnCx<'_>,
) -> bool {
    let mut progressed = false;
    loop {
        match e.conn.relay_need(id) {
            RelayNeed::Nothing => return progressed,
            RelayNeed::Release { keep, outcome } => {
                if let Some(i) = e.upstreams.iter().position(|(i, _)| *i == id) {
                    let (_, key) = e.upstreams.swap_remove(i);
                    let now = cx.clock.now_ms();
                    if let Some(c) = up.conns.get_mut(key) {
                        c.set.end(cx.worker_id, c.server, outcome, now);
                    }
                    if keep {
                        up.conns.release(key, up.io, now);
                    } else {
                        up.conns.close(key);
                    }
                }
                e.conn.relay_released(id, cx);
            }
            RelayNeed::Connect { server, fresh } => {
                if e.upstreams.len() >= MAX_UPSTREAMS_PER_CONN {
                    // Waits: a release by another of this connection's relays moves the step
                    // loop on, and this one is asked again.
                    return progressed;
                }
                let Some(set) = e.conn.relay_upstreams(id) else {
                    return progressed;
                };
                set.begin(cx.worker_id, server);
                let now = cx.clock.now_ms();
                let owner = e.conn.key();
                let pooled = if fresh {
                    None
                } else {
                    up.conns.take_idle(set.pool_key(), server, owner, now)
                };
                if let Some(key) = pooled {
                    cx.stats
                        .bump_upstream(set.counted_as(), UpstreamCounter::Reuses);
                    e.upstreams.push((id, key));
                    e.conn.relay_attached(id, true, true, cx);
                } else {
                    match up.conns.connect(&set, server, owner, up.io) {
                        Ok(key) => {
                            cx.stats
                                .bump_upstream(set.counted_as(), UpstreamCounter::Connects);
                            e.upstreams.push((id, key));
                            e.conn.relay_attached(id, false, false, cx);
                        }
                        Err(_) => {
                            set.end(cx.worker_id, server, UpstreamOutcome::Failed, now);
                            e.conn.relay_connect_failed(id, cx);
                        }
                    }
                }
            }
            RelayNeed::Connecting => {
                let Some(c) = attached(e, id).and_then(|k| up.conns.get_mut(k)) else {
                    return progressed;
                };
                match c.poll_connected(up.io) {
                    Ok(true) => {
                        if c.stream.is_tls() {
                            let row = c.set.counted_as();
                            cx.stats.bump_upstream(row, UpstreamCounter::TlsHandshakes);
                        }
                        e.conn.relay_connected(id, cx)
                    }
                    Ok(false) => return progressed,
                    Err(err) => {
                        if let Some(tls) = tls_failure(&err) {
                            let cause = tern_tls::upstream::failure_cause(tls);
                            let failed = UpstreamCounter::tls_failure(cause);
                            cx.stats.bump_upstream(c.set.counted_as(), failed);
                            if ratelog::admit("upstream_tls_failure", cx.clock.now_ms()) {
                                let addr = c.set.addr(c.server).to_string();
                                tracing::warn!(upstream = %addr, cause, error = %tls, "TLS handshake with the upstream failed");
                            }
                        }
                        e.conn.relay_connect_failed(id, cx)
                    }
                }
            }
            RelayNeed::Io => {
                if !io(e, up, id, cx) {
                    return progressed;
                }
            }
        }
        progressed = true;
    }
}

/// Sends what the relay has for the upstream and reads what it will take. True if
/// anything moved.
fn io<I: Io>(e: &mut Entry<I>, up: &mut Sockets<'_, I>, id: u32, cx: &mut ConnCx<'_>) -> bool {
    let Some(c) = attached(e, id).and_then(|k| up.conns.get_mut(k)) else {
        return false;
    };
    let mut moved = false;
    if c.stream.flush_pending(up.io).is_err() {
        e.conn.relay_closed(id, true, cx);
        return true;
    }
    loop {
        let buf = e.conn.relay_send_buf(id);
        if buf.is_empty() {
            break;
        }
        match c.stream.write(up.io, buf) {
            Ok(0) => {
                e.conn.relay_closed(id, true, cx);
                return true;
            }
            Ok(n) => {
                e.conn.relay_sent(id, n, cx);
                moved = true;
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                e.conn.relay_closed(id, true, cx);
                return true;
            }
        }
    }
    if e.conn.relay_wants_shutdown(id) {
        // An HTTP/2 WebSocket's END_STREAM: the upstream reads its end, and may still answer.
        let _ = c.stream.shutdown_write(up.io);
        e.conn.relay_shut_down(id);
        moved = true;
    }
    if c.may_read {
        let buf = e.conn.relay_recv_buf(id, cx);
        if !buf.is_empty() {
            let want = buf.len();
            match c.stream.read(up.io, buf) {
                Ok(0) => {
                    c.may_read = false;
                    e.conn.relay_closed(id, false, cx);
                    moved = true;
                }
                Ok(n) => {
                    if n < want && !c.fin && !c.stream.holds_more() {
                        c.may_read = false;
                    }
                    e.conn.relay_recv(id, n, cx);
                    moved = true;
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => c.may_read = false,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => moved = true,
                Err(_) => {
                    c.may_read = false;
                    e.conn.relay_closed(id, true, cx);
                    moved = true;
                }
            }
        }
    }
    moved
}
