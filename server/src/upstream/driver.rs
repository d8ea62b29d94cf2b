//! Drives a client connection that is relaying an exchange: the client socket through the
//! ordinary driver (`crate::driver`), and the upstream connection here, in turns, until
//! neither side can move. The relay itself (`conn/http1/relay.rs`) does no I/O; this is the
//! only code that connects, reads and writes upstream sockets.

use std::io;

use mio::Registry;

use super::pool::UpstreamConns;
use super::UpstreamOutcome;
use crate::conn::{ConnCx, RelayNeed, Status};
use crate::stats::Counter;
use crate::worker::Entry;

/// Rounds of client-then-upstream work per call before yielding to other connections (a
/// fast download through the proxy must not hold the worker).
const MAX_ROUNDS: usize = 64;

/// The worker's upstream side, lent to a connection's turn.
pub(crate) struct UpstreamCx<'a> {
    pub conns: &'a mut UpstreamConns,
    pub registry: &'a Registry,
}

/// Drives the connection's client side, and, while it relays, its upstream side too.
pub(crate) fn drive(
    e: &mut Entry,
    up: &mut UpstreamCx<'_>,
    readable: bool,
    fin: bool,
    cx: &mut ConnCx<'_>,
) -> Status {
    let mut status = crate::driver::drive(&mut e.conn, &mut e.sock, readable, fin, cx);
    if e.upstream.is_none() && !e.conn.in_relay() {
        return status; // the common case: one check
    }
    let mut rounds = 0;
    while status != Status::Close {
        if !step(e, up, cx) {
            break;
        }
        status = crate::driver::drive(&mut e.conn, &mut e.sock, false, false, cx);
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

/// The client connection is closing: its upstream connection (if any) is closed too; what
/// it was relaying cannot be finished.
pub(crate) fn abandon(e: &mut Entry, up: &mut UpstreamCx<'_>, cx: &ConnCx<'_>) {
    if let Some(key) = e.upstream.take() {
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

/// One pass over what the relay needs. True if anything moved (the client side may then
/// have output to send or input to take).
fn step(e: &mut Entry, up: &mut UpstreamCx<'_>, cx: &mut ConnCx<'_>) -> bool {
    let mut progressed = false;
    loop {
        match e.conn.relay_need() {
            RelayNeed::Nothing => return progressed,
            RelayNeed::Release { keep, outcome } => {
                if let Some(key) = e.upstream.take() {
                    let now = cx.clock.now_ms();
                    if let Some(c) = up.conns.get_mut(key) {
                        c.set.end(cx.worker_id, c.server, outcome, now);
                    }
                    if keep {
                        up.conns.release(key, now);
                    } else {
                        up.conns.close(key);
                    }
                }
                e.conn.relay_released(cx);
            }
            RelayNeed::Connect { server, fresh } => {
                let Some(set) = e.conn.relay_upstreams() else {
                    return progressed;
                };
                set.begin(cx.worker_id, server);
                let now = cx.clock.now_ms();
                let pooled = if fresh {
                    None
                } else {
                    up.conns
                        .take_idle(set.pool_key(), server, e.conn.key(), now)
                };
                if let Some(key) = pooled {
                    cx.stats.bump(Counter::UpstreamReuses);
                    e.upstream = Some(key);
                    e.conn.relay_attached(true, true, cx);
                } else {
                    match up.conns.connect(&set, server, e.conn.key(), up.registry) {
                        Ok(key) => {
                            cx.stats.bump(Counter::UpstreamConnects);
                            e.upstream = Some(key);
                            e.conn.relay_attached(false, false, cx);
                        }
                        Err(_) => {
                            set.end(cx.worker_id, server, UpstreamOutcome::Failed, now);
                            e.conn.relay_connect_failed(cx);
                        }
                    }
                }
            }
            RelayNeed::Connecting => {
                let Some(c) = e.upstream.and_then(|k| up.conns.get_mut(k)) else {
                    return progressed;
                };
                match c.poll_connected() {
                    Ok(true) => e.conn.relay_connected(cx),
                    Ok(false) => return progressed,
                    Err(_) => e.conn.relay_connect_failed(cx),
                }
            }
            RelayNeed::Io => {
                if !io(e, up, cx) {
                    return progressed;
                }
            }
        }
        progressed = true;
    }
}

/// Sends what the relay has for the upstream and reads what it will take. True if
/// anything moved.
fn io(e: &mut Entry, up: &mut UpstreamCx<'_>, cx: &mut ConnCx<'_>) -> bool {
    let Some(c) = e.upstream.and_then(|k| up.conns.get_mut(k)) else {
        return false;
    };
    let mut moved = false;
    loop {
        let buf = e.conn.relay_send_buf();
        if buf.is_empty() {
            break;
        }
        match c.stream.write(buf) {
            Ok(0) => {
                e.conn.relay_closed(true, cx);
                return true;
            }
            Ok(n) => {
                e.conn.relay_sent(n, cx);
                moved = true;
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                e.conn.relay_closed(true, cx);
                return true;
            }
        }
    }
    if c.may_read {
        let buf = e.conn.relay_recv_buf(cx);
        if !buf.is_empty() {
            let want = buf.len();
            match c.stream.read(buf) {
                Ok(0) => {
                    c.may_read = false;
                    e.conn.relay_closed(false, cx);
                    moved = true;
                }
                Ok(n) => {
                    if n < want && !c.fin {
                        c.may_read = false;
                    }
                    e.conn.relay_recv(n, cx);
                    moved = true;
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => c.may_read = false,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => moved = true,
                Err(_) => {
                    c.may_read = false;
                    e.conn.relay_closed(true, cx);
                    moved = true;
                }
            }
        }
    }
    moved
}
