//! Coalescing on the real worker with sockets in memory and its manual clock: many
//! clients of one worker miss one key together; the upstream the test plays says how
//! often it was asked.
use super::*;
use crate::{GroupOptions, Proxy, ProxyOptions, UpstreamGroup, UpstreamServer};
use std::net::SocketAddr;
use tern_server::testing::{MemoryAddr, MemoryPeer, MemoryWorker};
use tern_server::{Router, ServerConfig, UpstreamAddr};

const GET: &[u8] = b"GET /a HTTP/1.1\r\nHost: one.test\r\n\r\n";
const CACHEABLE: &[u8] =
    b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nETag: \"v1\"\r\nContent-Length: 4\r\n\r\nbody";
const CLIENTS: usize = 200;

struct Harness {
    w: MemoryWorker,
    addr: MemoryAddr,
    counts: Arc<Counts>,
    store: Arc<Store>,
}

fn harness(lock: Duration) -> Harness {
    harness_with(
        lock,
        Rules {
            max_object: 64 * 1024,
            ..Rules::default()
        },
    )
}

fn harness_with(lock: Duration, rules: Rules) -> Harness {
    let sock = SocketAddr::from(([127, 0, 0, 1], 9));
    let group = UpstreamGroup::new(
        GroupOptions {
            servers: vec![UpstreamServer::new(UpstreamAddr::Tcp(sock))],
            ..GroupOptions::default()
        },
        1,
    );
    let store = Arc::new(Store::new(1 << 20, 64 * 1024));
    let counts = Arc::new(Counts::new(1));
    let cache = RouteCache::new(
        store.clone(),
        counts.clone(),
        rules,
        "one /".into(),
        true,
        lock,
    );
    let proxy = Proxy::new(Arc::new(group), ProxyOptions::default()).with_cache(cache);
    let mut w = MemoryWorker::new(Router::new().fallback(proxy), ServerConfig::default(), None);
    let addr = MemoryAddr::Tcp(sock);
    w.io().listen(addr.clone());
    Harness {
        w,
        addr,
        counts,
        store,
    }
}

impl Harness {
    /// Upstream connections the worker opened since the last call.
    fn upstreams(&mut self) -> Vec<MemoryPeer> {
        std::iter::from_fn(|| self.w.io().accept(&self.addr)).collect()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Clients that missed together, each answered once `answered` says so.
fn clients(h: &mut Harness, n: usize, request: &[u8]) -> Vec<MemoryPeer> {
    (0..n).map(|_| h.w.connect(request)).collect()
}

#[test]
fn concurrent_misses_wait_for_one_fill_and_are_answered_from_it() {
    let mut h = harness(Duration::from_secs(5));
    let clients = clients(&mut h, CLIENTS, GET);
    let ups = h.upstreams();
    assert_eq!(ups.len(), 1, "one request reached the app");
    assert!(text(&ups[0].read()).starts_with("GET /a HTTP/1.1\r\n"));
    assert!(
        clients[1..].iter().all(|c| c.read().is_empty()),
        "they wait"
    );
    ups[0].write(CACHEABLE);
    h.w.settle();
    let first = text(&clients[0].read());
    assert!(first.contains("Cache-Status: tern; fwd=miss"), "{first}");
    // The fill's end woke them: answered in the same settling, no timer needed.
    for c in &clients[1..] {
        let out = text(&c.read());
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nbody"), "{out}");
        assert!(
            out.contains("Cache-Status: tern; hit; detail=coalesced"),
            "{out}"
        );
        assert!(out.contains("Age: 0\r\n"), "{out}");
    }
    assert!(h.upstreams().is_empty());
    assert_eq!(h.counts.total(Count::Coalesced), CLIENTS as u64 - 1);
    assert_eq!(h.counts.total(Count::Waited), CLIENTS as u64 - 1);
    assert_eq!(h.counts.total(Count::Miss), 1);
    assert_eq!(h.counts.total(Count::Stored), 1);
    assert!(h.store.flights().is_empty());
}

#[test]
fn a_waiter_s_validators_and_a_head_are_answered_from_the_fill() {
    let mut h = harness(Duration::from_secs(5));
    let leader = h.w.connect(GET);
    let conditional =
        h.w.connect(b"GET /a HTTP/1.1\r\nHost: one.test\r\nIf-None-Match: \"v1\"\r\n\r\n");
    let head = h.w.connect(b"HEAD /a HTTP/1.1\r\nHost: one.test\r\n\r\n");
    let ups = h.upstreams();
    assert_eq!(ups.len(), 1);
    ups[0].write(CACHEABLE);
    h.w.advance(Duration::from_millis(100));
    assert!(text(&leader.read()).ends_with("body"));
    let out = text(&conditional.read());
    assert!(out.starts_with("HTTP/1.1 304 "), "{out}");
    let out = text(&head.read());
    assert!(
        out.starts_with("HTTP/1.1 200 ") && out.contains("Content-Length: 4"),
        "{out}"
    );
    assert!(out.ends_with("\r\n\r\n"), "no body: {out}");
    assert_eq!(h.counts.total(Count::Coalesced), 2);
}

#[test]
fn a_head_alone_leads_no_fill() {
    let mut h = harness(Duration::from_secs(5));
    let _a = h.w.connect(b"HEAD /a HTTP/1.1\r\nHost: one.test\r\n\r\n");
    let _b = h.w.connect(b"HEAD /a HTTP/1.1\r\nHost: one.test\r\n\r\n");
    assert_eq!(h.upstreams().len(), 2, "both go: neither fills");
    assert!(h.store.flights().is_empty());
}

#[test]
fn after_the_lock_time_waiters_go_to_the_app_themselves() {
    let mut h = harness(Duration::from_millis(1000));
    let clients = clients(&mut h, 20, GET);
    let leader = h.upstreams();
    assert_eq!(leader.len(), 1);
    h.w.advance(Duration::from_millis(900));
    assert!(h.upstreams().is_empty(), "still within the lock time");
    h.w.advance(Duration::from_millis(200));
    let own = h.upstreams();
    assert_eq!(own.len(), 19, "each waiter went itself");
    assert_eq!(h.counts.total(Count::LockTimeout), 19);
    for up in &own {
        assert!(text(&up.read()).starts_with("GET /a "));
        up.write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 3\r\n\r\nown");
    }
    h.w.settle();
    for c in &clients[1..] {
        let out = text(&c.read());
        assert!(out.ends_with("own") && out.contains("fwd=miss"), "{out}");
    }
    // Their answers were not stored (they were not the fill), the leader's still may be.
    assert_eq!(h.counts.total(Count::Stored), 0);
    assert!(
        !h.store.flights().is_empty(),
        "the leader's fill is still under way"
    );
    leader[0].write(CACHEABLE);
    h.w.settle();
    assert!(text(&clients[0].read()).ends_with("body"));
    assert_eq!(h.counts.total(Count::Stored), 1);
    assert!(h.store.flights().is_empty());
}

#[test]
fn an_answer_not_stored_sends_the_waiters_to_the_app() {
    for (answer, why) in [
        (
            &b"HTTP/1.1 200 OK\r\nCache-Control: private, max-age=60\r\nContent-Length: 2\r\n\r\nme"[..],
            "private",
        ),
        (
            b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nConnection: close\r\n\r\nuntil close",
            "no length",
        ),
    ] {
        let mut h = harness(Duration::from_secs(5));
        let clients = clients(&mut h, 10, GET);
        let leader = h.upstreams();
        assert_eq!(leader.len(), 1);
        leader[0].write(answer);
        leader[0].shutdown();
        h.w.advance(Duration::from_millis(100));
        assert!(h.store.flights().is_empty(), "{why}");
        let own = h.upstreams();
        assert_eq!(own.len(), 9, "{why}: each waiter goes to the app");
        assert_eq!(h.counts.total(Count::Coalesced), 0);
        for up in &own {
            up.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nown");
        }
        h.w.settle();
        assert!(clients[1..].iter().all(|c| text(&c.read()).ends_with("own")), "{why}");
        assert!(h.store.flights().is_empty());
    }
}

#[test]
fn a_failed_fill_is_taken_over_by_one_waiter() {
    let mut h = harness(Duration::from_secs(5));
    let clients = clients(&mut h, 10, GET);
    let leader = h.upstreams();
    assert_eq!(leader.len(), 1);
    // The app closes without answering: the leader's client gets tern's 502.
    leader[0].shutdown();
    h.w.settle();
    assert!(text(&clients[0].read()).starts_with("HTTP/1.1 502 "));
    h.w.advance(Duration::from_millis(100));
    let next = h.upstreams();
    assert_eq!(next.len(), 1, "one waiter took the fill over");
    assert_eq!(h.store.flights().len(), 1);
    next[0].write(CACHEABLE);
    h.w.advance(Duration::from_millis(200));
    for c in &clients[1..] {
        let out = text(&c.read());
        assert!(
            out.starts_with("HTTP/1.1 200 ") && out.ends_with("body"),
            "{out}"
        );
    }
    assert_eq!(h.counts.total(Count::Coalesced), 8);
    assert_eq!(h.counts.total(Count::Stored), 1);
    assert!(h.store.flights().is_empty());
}

#[test]
fn no_lock_time_no_waiting() {
    let mut h = harness(Duration::ZERO);
    let _clients = clients(&mut h, 5, GET);
    assert_eq!(h.upstreams().len(), 5);
    assert!(h.store.flights().is_empty());
}

/// Fresh for a second.
const BRIEF: &[u8] = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\nContent-Length: 3\r\n\r\nold";
const NEW: &[u8] = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 3\r\n\r\nnew";

/// A harness whose entry for /a (BRIEF) went stale 2 s ago.
fn stale(rules: Rules) -> Harness {
    let mut h = harness_with(Duration::from_secs(5), rules);
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(BRIEF);
    h.w.settle();
    assert!(text(&c.read()).ends_with("old"));
    up[0].shutdown();
    h.w.advance(Duration::from_secs(3));
    h
}

#[test]
fn a_stale_entry_answers_at_once_while_one_request_refreshes_it() {
    let mut h = stale(Rules {
        stale_while_updating: 10,
        ..Rules::default()
    });
    let refresher = h.w.connect(GET);
    let ups = h.upstreams();
    assert_eq!(ups.len(), 1, "one refresh");
    let others = clients(&mut h, 20, GET);
    for c in &others {
        let out = text(&c.read());
        assert!(out.ends_with("old"), "answered at once: {out}");
        assert!(
            out.contains("Cache-Status: tern; hit; detail=stale"),
            "{out}"
        );
        assert!(out.contains("Age: 3\r\n"), "{out}");
    }
    assert!(h.upstreams().is_empty());
    ups[0].write(NEW);
    h.w.settle();
    let out = text(&refresher.read());
    assert!(
        out.ends_with("new") && out.contains("tern; fwd=stale"),
        "{out}"
    );
    let next = h.w.connect(GET);
    let out = text(&next.read());
    assert!(
        out.ends_with("new") && out.contains("Cache-Status: tern; hit\r\n"),
        "{out}"
    );
    assert_eq!(h.counts.total(Count::StaleUpdating), 20);
    assert!(h.store.flights().is_empty());
}

#[test]
fn past_its_window_a_stale_entry_is_not_served() {
    let mut h = stale(Rules {
        stale_while_updating: 1,
        ..Rules::default()
    });
    let _refresher = h.w.connect(GET);
    assert_eq!(h.upstreams().len(), 1);
    assert!(h.store.is_empty(), "dropped: stale past every window");
    let waiter = h.w.connect(GET);
    assert!(
        waiter.read().is_empty(),
        "waits for the fill, no stale answer"
    );
    assert_eq!(h.counts.total(Count::StaleUpdating), 0);
}

#[test]
fn a_stale_entry_answers_when_the_app_fails_within_its_window() {
    let mut h = stale(Rules {
        stale_if_error: 60,
        ..Rules::default()
    });
    // A 5xx from the app.
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy");
    h.w.settle();
    let out = text(&c.read());
    assert!(
        out.starts_with("HTTP/1.1 200 ") && out.ends_with("old"),
        "{out}"
    );
    assert!(
        out.contains("tern; fwd=stale; detail=stale-if-error"),
        "{out}"
    );
    assert!(!up[0].closed_by_worker(), "the 503 was read whole: pooled");
    // No answer at all: tern's 502 is replaced too.
    let c = h.w.connect(GET);
    up[0].read();
    up[0].shutdown();
    h.w.settle();
    // (A pooled connection that closed unasked is retried once on a new one.)
    for fresh in h.upstreams() {
        fresh.shutdown();
    }
    h.w.settle();
    let out = text(&c.read());
    assert!(
        out.starts_with("HTTP/1.1 200 ") && out.ends_with("old"),
        "{out}"
    );
    assert_eq!(h.counts.total(Count::StaleError), 2);
    // Past the window the app's failure is the answer.
    h.w.advance(Duration::from_secs(60));
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy");
    h.w.settle();
    assert!(text(&c.read()).starts_with("HTTP/1.1 503 "));
    assert!(h.store.flights().is_empty());
}

#[test]
fn must_revalidate_is_never_served_stale() {
    let mut h = harness_with(
        Duration::from_secs(5),
        Rules {
            stale_while_updating: 60,
            stale_if_error: 60,
            ..Rules::default()
        },
    );
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1, must-revalidate\r\nContent-Length: 3\r\n\r\nold");
    h.w.settle();
    assert!(text(&c.read()).ends_with("old"));
    h.w.advance(Duration::from_secs(3));
    let c = h.w.connect(GET);
    up[0].read();
    up[0].write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy");
    h.w.settle();
    assert!(text(&c.read()).starts_with("HTTP/1.1 503 "));
}

#[test]
fn the_answer_s_own_stale_while_revalidate_is_honoured() {
    let mut h = harness(Duration::from_secs(5));
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1, stale-while-revalidate=30\r\nContent-Length: 3\r\n\r\nold");
    h.w.settle();
    assert!(text(&c.read()).ends_with("old"));
    h.w.advance(Duration::from_secs(3));
    let _refresher = h.w.connect(GET);
    let other = h.w.connect(GET);
    assert!(text(&other.read()).ends_with("old"), "served stale at once");
    assert_eq!(h.counts.total(Count::StaleUpdating), 1);
}

#[test]
fn a_stale_entry_with_validators_is_revalidated_and_a_304_refreshes_it() {
    let mut h = harness(Duration::from_secs(5));
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\nETag: \"v1\"\r\nLast-Modified: Sat, 01 Jan 2028 00:00:00 GMT\r\nX-Version: 1\r\nContent-Length: 3\r\n\r\nold");
    h.w.settle();
    assert!(text(&c.read()).ends_with("old"));
    h.w.advance(Duration::from_secs(3));
    assert_eq!(
        h.store.len(),
        1,
        "kept past its lifetime: it can be revalidated"
    );
    let c = h.w.connect(GET);
    let asked = text(&up[0].read());
    assert!(asked.contains("If-None-Match: \"v1\"\r\n"), "{asked}");
    assert!(
        asked.contains("If-Modified-Since: Sat, 01 Jan 2028 00:00:00 GMT\r\n"),
        "{asked}"
    );
    up[0].write(b"HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=60\r\nETag: \"v1\"\r\nX-Version: 2\r\n\r\n");
    h.w.settle();
    let out = text(&c.read());
    assert!(
        out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("old"),
        "{out}"
    );
    assert!(
        out.contains("Cache-Status: tern; fwd=stale; fwd-status=304"),
        "{out}"
    );
    assert!(
        out.contains("X-Version: 2") && !out.contains("X-Version: 1"),
        "{out}"
    );
    assert!(!up[0].closed_by_worker(), "the 304's connection is pooled");
    // Fresh again, with the 304's fields.
    h.w.advance(Duration::from_secs(3));
    let c = h.w.connect(GET);
    let out = text(&c.read());
    assert!(
        out.contains("Cache-Status: tern; hit\r\n") && out.ends_with("old"),
        "{out}"
    );
    assert!(
        out.contains("Cache-Control: max-age=60") && out.contains("X-Version: 2"),
        "{out}"
    );
    assert!(h.upstreams().is_empty());
    assert_eq!(h.counts.total(Count::Revalidated), 1);
    assert!(h.store.flights().is_empty());
}

#[test]
fn a_new_answer_to_a_conditional_refresh_replaces_the_entry() {
    let mut h = harness(Duration::from_secs(5));
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\nETag: \"v1\"\r\nContent-Length: 3\r\n\r\nold");
    h.w.settle();
    c.read();
    h.w.advance(Duration::from_secs(3));
    let c = h.w.connect(GET);
    assert!(text(&up[0].read()).contains("If-None-Match: \"v1\""));
    up[0].write(NEW);
    h.w.settle();
    assert!(text(&c.read()).ends_with("new"));
    assert!(
        text(&h.w.connect(GET).read()).ends_with("new"),
        "a hit on the new one"
    );
    assert_eq!(h.counts.total(Count::Revalidated), 0);
}

#[test]
fn an_app_s_own_cache_status_is_kept_beside_tern_s() {
    let mut h = harness(Duration::from_secs(5));
    let c = h.w.connect(GET);
    let up = h.upstreams();
    up[0].write(b"HTTP/1.1 200 OK\r\nCache-Status: app-cache; hit\r\nContent-Length: 2\r\n\r\nok");
    h.w.settle();
    let out = text(&c.read());
    assert!(out.contains("Cache-Status: app-cache; hit\r\n"), "{out}");
    assert!(out.contains("Cache-Status: tern; fwd=miss\r\n"), "{out}");
}

/// An HTTP/2 frame: length, type, flags, stream, payload.
fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([ty, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// A GET of /a on stream 1, every field a literal without indexing (RFC 7541 §6.2.2).
fn h2_get() -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "one.test"),
        (":path", "/a"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend(name.as_bytes());
        block.push(value.len() as u8);
        block.extend(value.as_bytes());
    }
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(4, 0, 0, &[])); // SETTINGS
    hello.extend(frame(1, 0x4 | 0x1, 1, &block)); // HEADERS, END_HEADERS | END_STREAM
    hello
}

#[test]
fn a_fill_whose_client_left_is_taken_over_by_one_waiter() {
    let mut h = harness(Duration::from_secs(5));
    let leader = h.w.connect(&h2_get());
    let waiters = clients(&mut h, 5, GET);
    let ups = h.upstreams();
    assert_eq!(ups.len(), 1);
    // The leader's client cancels its stream (RST_STREAM, CANCEL): its relay ends.
    leader.write(&frame(3, 0, 1, &8u32.to_be_bytes()));
    h.w.settle();
    assert!(ups[0].closed_by_worker(), "the fill's upstream is let go");
    h.w.advance(Duration::from_millis(100));
    let next = h.upstreams();
    assert_eq!(next.len(), 1, "one waiter took the fill over");
    next[0].write(CACHEABLE);
    h.w.advance(Duration::from_millis(200));
    for c in &waiters {
        assert!(text(&c.read()).ends_with("body"));
    }
    assert_eq!(h.counts.total(Count::Coalesced), 4);
    assert!(h.store.flights().is_empty());
}
