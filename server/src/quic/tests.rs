//! HTTP/3 end to end on the manual clock: the worker's real QUIC side (`QuicSide`, made by
//! `adopt_datagrams` as on a running server) over a UDP socket in memory, and clients on
//! quinn-proto's client (`test_client.rs`). The network between may lose, reorder and
//! re-address datagrams; time moves only to the next timer of either side, so loss recovery,
//! idle timeouts and the handshake's timers take no waiting.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn_proto::{ApplicationClose, ConnectionError};
use tern_runtime::io::{Direction, Reorder};

use super::test_client::Net;
use crate::bans::{BanConfig, Bans};
use crate::config::ServerConfig;
use crate::handler::{Pending, Reply};
use crate::memory_worker::MemoryWorker;
use crate::response::Response;
use crate::router::Router;
use crate::static_files::{StaticFiles, StaticOptions};
use crate::stats::Counter;

const SECOND: Duration = Duration::from_secs(1);
const IDLE: Duration = Duration::from_secs(10);
const HELLO: &[u8] = b"hello over QUIC\n";
/// Larger than what the static files keep in memory: sent from the file, in pieces, over
/// many round trips.
const BIG_LEN: usize = 200 * 1024;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn server() -> SocketAddr {
    addr("192.0.2.1:443")
}

fn client() -> SocketAddr {
    addr("198.51.100.7:50000")
}

fn config() -> ServerConfig {
    ServerConfig {
        idle_timeout: IDLE,
        ..ServerConfig::default()
    }
}

/// Bytes that tell their offset: a piece delivered twice or out of place shows.
fn big_body() -> Vec<u8> {
    (0..BIG_LEN).map(|i| (i % 251) as u8).collect()
}

/// A static site (`/hello.txt`, `/big.bin`) in a fresh folder.
fn site() -> (tempfile::TempDir, Router) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), HELLO).unwrap();
    std::fs::write(dir.path().join("big.bin"), big_body()).unwrap();
    let files = StaticFiles::new(StaticOptions::new(dir.path())).unwrap();
    (dir, Router::new().fallback(files))
}

/// A worker serving `router` over HTTP/3 with a self-signed certificate, and the network
/// to it.
fn net(router: Router, config: ServerConfig) -> Net {
    net_with_bans(router, config, None)
}

/// As [`net`], the worker consulting `bans` (as a server with bans on does).
fn net_with_bans(router: Router, config: ServerConfig, bans: Option<Arc<Bans>>) -> Net {
    let tls = Arc::new(
        tern_tls::TlsAcceptor::new(&tern_tls::TlsOptions {
            self_signed: true,
            ..Default::default()
        })
        .unwrap(),
    );
    let fingerprint = tls.self_signed_fingerprint().unwrap().to_string();
    let (w, peer) = MemoryWorker::with_http3(router, config, bans, tls, server());
    Net::new(w, peer, server(), &fingerprint)
}

/// Client `c` asks for `path` and the network runs until the answer is whole.
fn fetch(net: &mut Net, c: usize, path: &str) -> super::test_client::Answer {
    let n = net.clients[c].get(path);
    net.run_until(60 * SECOND, |net| net.clients[c].answer(n).is_some());
    net.clients[c].answer(n).unwrap()
}

/// The client closes its connection and the network runs until the worker forgot it.
fn close(net: &mut Net, c: usize) {
    let now = net.now();
    net.clients[c].close(now);
    net.run_until(60 * SECOND, |net| net.w.connections() == 0);
}

/// The handshake, then a small file and a large one (read from disk in pieces) on the same
/// connection; nothing lost on a perfect network.
#[test]
fn static_files_are_served_over_http3_after_the_handshake() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    let c = net.connect(client());
    let hello = fetch(&mut net, c, "/hello.txt");
    assert_eq!(hello.status, 200);
    assert_eq!(hello.body, HELLO);
    assert_eq!(hello.field("content-length"), Some("16"));
    let big = fetch(&mut net, c, "/big.bin");
    assert_eq!(big.status, 200);
    assert!(
        big.body == big_body(),
        "{} bytes, not the file",
        big.body.len()
    );
    let missing = fetch(&mut net, c, "/nothing-here");
    assert_eq!(missing.status, 404);

    let w = &net.w;
    assert_eq!(w.counter(Counter::QuicAccepted), 1);
    assert_eq!(w.counter(Counter::Http3Connections), 1);
    assert_eq!(w.counter(Counter::Requests), 3);
    assert_eq!(w.counter(Counter::QuicRetries), 0);
    assert!(w.counter(Counter::QuicBytesOut) > BIG_LEN as u64);
    assert_eq!(w.connections(), 1);
    close(&mut net, c);
    assert_eq!(net.w.counter(Counter::QuicClosed), 1);
    assert_eq!(
        net.w.counter(Counter::QuicLostPackets),
        0,
        "nothing was lost"
    );
    assert_eq!(net.w.counter(Counter::QuicHandshakesFailed), 0);
}

/// A third of the datagrams lost each way, and the rest reordered: the handshake and the
/// large file still complete, byte for byte, on one connection, and the server counts the
/// packets it had to send again.
#[test]
fn a_lossy_reordering_network_still_gets_the_whole_file() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    for way in [Direction::ToWorker, Direction::FromWorker] {
        net.peer.drop_every(way, 3);
    }
    net.peer.reorder(Direction::ToWorker, Reorder::PairsSwapped);
    net.peer.reorder(Direction::FromWorker, Reorder::Reversed);
    let c = net.connect(client());
    let big = fetch(&mut net, c, "/big.bin");
    assert_eq!(big.status, 200);
    assert!(
        big.body == big_body(),
        "{} bytes, not the file",
        big.body.len()
    );
    let client_lost = net.clients[c].conn.stats().path.lost_packets;
    assert!(client_lost > 0, "the client's packets were lost too");

    close(&mut net, c);
    let w = &net.w;
    assert_eq!(
        w.counter(Counter::QuicAccepted),
        1,
        "one connection throughout"
    );
    assert_eq!(w.counter(Counter::Http3Connections), 1);
    assert_eq!(w.counter(Counter::QuicClosed), 1);
    let lost = w.counter(Counter::QuicLostPackets);
    let sent = w.counter(Counter::QuicDatagramsOut);
    assert!(
        lost >= sent / 10,
        "{lost} packets lost of {sent} datagrams sent"
    );
}

/// A lost answer is sent again when the probe timeout (PTO) says, to the millisecond: the
/// connection's timers run on their own µs deadlines, not on the worker's 100 ms ticks. On
/// this network the round trip is zero, so the PTO is the 1 ms timer granularity plus the
/// client's 25 ms ACK delay: each answer arrives within 30 ms of its request.
#[test]
fn a_lost_answer_is_sent_again_at_the_probe_timeout_not_a_wheel_tick() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    let c = net.connect(client());
    assert_eq!(fetch(&mut net, c, "/hello.txt").status, 200);
    for _ in 0..5 {
        // The wheel's ticks would fall anywhere in this PTO's window: move off a tick.
        let start = net.w.now_ms() + 37;
        net.run_to_ms(start);
        net.peer.drop_next(Direction::FromWorker, 1);
        let answer = fetch(&mut net, c, "/hello.txt");
        assert_eq!(answer.body, HELLO);
        let took = net.w.now_ms() - start;
        assert!(
            (20..=30).contains(&took),
            "answered {took} ms after the request"
        );
    }
}

/// With the heap of timers made again from the connections' armed times at nearly every
/// arm, loss recovery (every third datagram lost) and the idle timeout still run on time:
/// no timer is lost in the rebuilding.
#[test]
fn timers_survive_the_heap_being_made_again() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    net.w.set_quic_stale_timers(0);
    net.peer.drop_every(Direction::FromWorker, 3);
    let c = net.connect(client());
    let big = fetch(&mut net, c, "/big.bin");
    assert!(
        big.body == big_body(),
        "{} bytes, not the file",
        big.body.len()
    );
    net.peer.drop_every(Direction::FromWorker, 0);
    let answered = net.w.now_ms();
    net.run_until(2 * IDLE, |net| net.w.connections() == 0);
    let closed_after = net.w.now_ms() - answered;
    assert!(
        (IDLE.as_millis() as u64..=IDLE.as_millis() as u64 + 200).contains(&closed_after),
        "closed {closed_after} ms after the answer"
    );
}

/// After its first answer the client's NAT gives it a new address: its next request comes
/// from there, the server validates the new path (a PATH_CHALLENGE the client answers) and
/// answers there, on the same connection.
#[test]
fn a_client_behind_a_rebinding_nat_is_answered_at_its_new_address() {
    let (_dir, router) = site();
    // Who the handlers (and the access log, and forwarded headers) see as the client.
    let router = router.get(
        "/peer",
        |req: &crate::handler::Request<'_>, _: &mut crate::handler::HandlerContext<'_>| {
            let peer = req.peer.to_string().into_bytes();
            Reply::Now(Response::new(200).with_body(crate::response::Body::Owned(peer)))
        },
    );
    let mut net = net(router, config());
    let c = net.connect(client());
    assert_eq!(fetch(&mut net, c, "/hello.txt").body, HELLO);
    assert_eq!(net.clients[c].received_rebound, 0);
    assert_eq!(
        fetch(&mut net, c, "/peer").body,
        client().to_string().as_bytes()
    );

    let rebound = addr("203.0.113.9:61000");
    net.rebind(c, rebound);
    let again = fetch(&mut net, c, "/hello.txt");
    assert_eq!(again.status, 200);
    assert_eq!(again.body, HELLO);
    assert!(
        net.clients[c].received_rebound > 0,
        "answered at the new address"
    );
    assert_eq!(
        fetch(&mut net, c, "/peer").body,
        rebound.to_string().as_bytes()
    );
    net.run_until(SECOND, |net| {
        net.clients[c].conn.stats().frame_tx.path_response > 0
    });
    assert!(net.clients[c].conn.stats().frame_rx.path_challenge > 0);

    // Long past the path validation's timers: had the new path failed it, the server would
    // have gone back to the old address, which leads nowhere now, and this would never be
    // answered.
    let later = net.w.now_ms() + 5_000;
    net.run_to_ms(later);
    let received = net.clients[c].received_rebound;
    let third = fetch(&mut net, c, "/hello.txt");
    assert_eq!((third.status, &third.body[..]), (200, HELLO));
    assert!(net.clients[c].received_rebound > received);
    assert_eq!(
        net.w.counter(Counter::QuicAccepted),
        1,
        "the same connection"
    );
    assert_eq!(net.w.counter(Counter::Requests), 5);
    assert_eq!(net.w.connections(), 1);
}

/// As above, but the new address is banned (banned after the connection was accepted from
/// the old one, before the move): the first packets from there close the connection
/// (CONNECTION_CLOSE with H3_NO_ERROR, "address banned", sent to the new address), and the
/// request they carry is never served. Beside it, a client of the same worker moving to an
/// address that is not banned is followed and served as before.
#[test]
fn a_client_rebound_to_a_banned_address_is_closed_there_unserved() {
    let (_dir, router) = site();
    let bans = Arc::new(Bans::new(BanConfig::default()));
    let mut net = net_with_bans(router, config(), Some(bans.clone()));
    let c = net.connect(client());
    assert_eq!(fetch(&mut net, c, "/hello.txt").body, HELLO);
    let other = net.connect(addr("198.51.100.8:50000"));
    assert_eq!(fetch(&mut net, other, "/hello.txt").body, HELLO);
    assert_eq!(net.w.counter(Counter::Requests), 2);
    assert_eq!(net.w.connections(), 2);

    let banned = addr("203.0.113.66:62000");
    assert!(bans.ban(banned.ip()).is_some());
    net.rebind(c, banned);
    let n = net.clients[c].get("/hello.txt");
    net.run_until(10 * SECOND, |net| net.clients[c].lost.is_some());
    match &net.clients[c].lost {
        Some(ConnectionError::ApplicationClosed(ApplicationClose { error_code, reason })) => {
            assert_eq!(
                error_code.into_inner(),
                tern_http3::ErrorCode::NoError.code()
            );
            assert_eq!(&reason[..], b"address banned");
        }
        lost => panic!("not closed by the server: {lost:?}"),
    }
    assert!(
        net.clients[c].received_rebound > 0,
        "the close went to the new address"
    );
    assert!(
        net.clients[c].answer(n).is_none(),
        "served from a banned address"
    );
    assert_eq!(net.clients[c].received(n), 0);
    assert_eq!(net.w.counter(Counter::QuicRefusedBanned), 1);
    assert_eq!(
        net.w.counter(Counter::Requests),
        2,
        "nothing served from there"
    );
    net.run_until(10 * SECOND, |net| net.w.connections() == 1);

    // The control: a move to an address nobody banned is followed, on the same connection.
    let free = addr("203.0.113.9:61000");
    net.rebind(other, free);
    let again = fetch(&mut net, other, "/hello.txt");
    assert_eq!((again.status, &again.body[..]), (200, HELLO));
    assert!(net.clients[other].received_rebound > 0);
    assert!(net.clients[other].lost.is_none());
    assert_eq!(net.w.counter(Counter::QuicRefusedBanned), 1);
    assert_eq!(net.w.counter(Counter::QuicAccepted), 2);
    assert_eq!(net.w.counter(Counter::Requests), 3);
    assert_eq!(net.w.connections(), 1);
}

/// With the worker at its Retry threshold (one handshake in progress, begun by a first
/// flight from an address that never answers), a new client is sent a Retry, comes back
/// with its token, is accepted and served. The abandoned handshake ends at the idle timeout.
#[test]
fn past_the_retry_threshold_a_new_client_proves_its_address_first() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    net.w.set_quic_retry_above(1);
    net.spoof(addr("198.51.100.66:4444"));
    assert_eq!(net.w.counter(Counter::QuicAccepted), 1);
    assert_eq!(
        net.w.counter(Counter::QuicRetries),
        0,
        "below the threshold"
    );
    assert_eq!(net.w.connections(), 1);

    let c = net.connect(client());
    let hello = fetch(&mut net, c, "/hello.txt");
    assert_eq!(hello.status, 200);
    assert_eq!(hello.body, HELLO);
    let w = &net.w;
    assert_eq!(w.counter(Counter::QuicRetries), 1);
    assert_eq!(
        w.counter(Counter::QuicAccepted),
        2,
        "accepted with its token"
    );
    assert_eq!(w.counter(Counter::Http3Connections), 1);

    net.run_until(2 * IDLE, |net| {
        net.w.counter(Counter::QuicHandshakesFailed) == 1
    });
    assert_eq!(net.w.counter(Counter::Http3Connections), 1);
}

/// A connection left alone is closed at the idle timeout, silently, and forgotten; not
/// before. Only the manual clock moves.
#[test]
fn an_idle_connection_is_closed_and_forgotten_at_the_idle_timeout() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    let c = net.connect(client());
    assert_eq!(fetch(&mut net, c, "/hello.txt").status, 200);
    let answered = net.w.now_ms();
    let almost = answered + IDLE.as_millis() as u64 - 100;
    net.run_to_ms(almost);
    assert_eq!(net.w.connections(), 1, "not idle for long enough");
    assert!(net.clients[c].lost.is_none());

    net.run_until(IDLE, |net| net.w.connections() == 0);
    let closed_after = net.w.now_ms() - answered;
    assert!(
        (10_000..=10_200).contains(&closed_after),
        "closed {closed_after} ms after the answer"
    );
    assert_eq!(net.w.counter(Counter::QuicClosed), 1);
    assert_eq!(net.w.counter(Counter::QuicHandshakesFailed), 0);
    net.run_until(SECOND, |net| net.clients[c].lost.is_some());
    assert_eq!(net.clients[c].lost, Some(ConnectionError::TimedOut));
}

type Parked = Arc<Mutex<Vec<Pending>>>;

/// `/later` is answered when the test says; anything else at once.
fn deferring(parked: Parked) -> Router {
    Router::new().fallback(
        move |req: &crate::Request<'_>, cx: &mut crate::HandlerContext<'_>| {
            if req.path() == "/later" {
                parked.lock().unwrap().push(cx.defer());
                Reply::Later
            } else {
                Reply::Now(Response::text(200, "now"))
            }
        },
    )
}

/// Shutdown: the connection hears GOAWAY at once but stays open for the request it has
/// under way, gets its answer, and is then closed with H3_NO_ERROR. A client that arrives
/// while the worker drains is refused.
#[test]
fn shutdown_says_goaway_and_closes_once_the_request_is_answered() {
    let parked = Parked::default();
    let mut net = net(deferring(parked.clone()), config());
    let c = net.connect(client());
    let n = net.clients[c].get("/later");
    net.run_until(10 * SECOND, |_| parked.lock().unwrap().len() == 1);

    net.w.drain();
    net.run_until(10 * SECOND, |net| net.clients[c].goaway().is_some());
    assert_eq!(
        net.clients[c].goaway(),
        Some(4),
        "request stream 0 is processed"
    );
    assert_eq!(net.w.connections(), 1, "open for its request");
    assert!(net.clients[c].lost.is_none());

    let late = net.connect(addr("198.51.100.8:50000"));
    net.run_until(10 * SECOND, |net| net.clients[late].lost.is_some());
    assert!(
        matches!(
            net.clients[late].lost,
            Some(ConnectionError::ConnectionClosed(_))
        ),
        "{:?}",
        net.clients[late].lost
    );
    assert_eq!(net.w.counter(Counter::QuicRefusedLimit), 1);

    let pending = parked.lock().unwrap().pop().unwrap();
    assert!(pending.complete(Response::text(200, "later")).is_ok());
    net.run_until(10 * SECOND, |net| {
        net.w.connections() == 0 && net.clients[c].lost.is_some()
    });
    let answer = net.clients[c]
        .answer(n)
        .unwrap_or_else(|| panic!("not answered before the close: {:?}", net.clients[c].lost));
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, b"later");
    match &net.clients[c].lost {
        Some(ConnectionError::ApplicationClosed(close)) => {
            let no_error = tern_http3::ErrorCode::NoError.code();
            assert_eq!(close.error_code.into_inner(), no_error);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(net.w.counter(Counter::QuicClosed), 1);
}

/// A client that stops reading an answer (STOP_SENDING) has its stream reset, as RFC 9000
/// §3.5 asks, and that stream's unsent bytes no longer hold a draining connection open.
#[test]
fn an_answer_the_client_stops_is_reset_and_does_not_hold_up_shutdown() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    let c = net.connect(client());
    let n = net.clients[c].get("/big.bin");
    net.run_until(10 * SECOND, |net| net.clients[c].received(n) > 0);
    net.clients[c].stop(n);
    net.run_until(SECOND, |net| {
        net.clients[c].conn.stats().frame_rx.reset_stream > 0
    });
    assert!(
        net.clients[c].received(n) < BIG_LEN,
        "stopped before the end"
    );

    // Well within the idle timeout, which would close it anyway.
    net.w.drain();
    net.run_until(SECOND, |net| net.w.connections() == 0);
    match &net.clients[c].lost {
        Some(ConnectionError::ApplicationClosed(close)) => {
            let no_error = tern_http3::ErrorCode::NoError.code();
            assert_eq!(close.error_code.into_inner(), no_error);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(net.w.counter(Counter::QuicClosed), 1);
}

/// A request the client abandons before its end (RESET_STREAM) has the server reset its
/// side of the stream too, so that the stream does not hold a draining connection open.
#[test]
fn a_request_the_client_cancels_is_reset_and_does_not_hold_up_shutdown() {
    let (_dir, router) = site();
    let mut net = net(router, config());
    let c = net.connect(client());
    net.run_until(10 * SECOND, |net| net.clients[c].connected);
    let n = net.clients[c].begin("/hello.txt");
    net.settle();
    net.clients[c].cancel(n);
    net.run_until(SECOND, |net| {
        net.clients[c].conn.stats().frame_rx.reset_stream > 0
    });
    assert!(net.clients[c].answer(n).is_none());
    assert_eq!(net.w.counter(Counter::Requests), 0, "never dispatched");

    net.w.drain();
    net.run_until(SECOND, |net| net.w.connections() == 0);
    assert!(matches!(
        net.clients[c].lost,
        Some(ConnectionError::ApplicationClosed(_))
    ));
    assert_eq!(net.w.counter(Counter::QuicClosed), 1);
}

/// A handler's `Reply::Drop` closes the HTTP/3 connection at once with H3_EXCESSIVE_LOAD
/// and nothing for that request; the connection is forgotten after its closing period.
#[test]
fn a_dropped_request_closes_the_connection_without_an_answer() {
    let router = Router::new().fallback(
        |req: &crate::Request<'_>, _: &mut crate::HandlerContext<'_>| {
            if req.path() == "/drop" {
                Reply::Drop
            } else {
                Reply::Now(Response::text(200, "kept"))
            }
        },
    );
    let mut net = net(router, config());
    let c = net.connect(client());
    assert_eq!(fetch(&mut net, c, "/kept").body, b"kept");
    let n = net.clients[c].get("/drop");
    net.run_until(SECOND, |net| net.clients[c].lost.is_some());
    assert!(net.clients[c].answer(n).is_none());
    match &net.clients[c].lost {
        Some(ConnectionError::ApplicationClosed(close)) => {
            let excessive_load = tern_http3::ErrorCode::ExcessiveLoad.code();
            assert_eq!(close.error_code.into_inner(), excessive_load);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(net.w.counter(Counter::ConnectionsDropped), 1);
    net.run_until(SECOND, |net| net.w.connections() == 0);
    assert_eq!(net.w.counter(Counter::QuicClosed), 1);
}
