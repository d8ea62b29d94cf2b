use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tern_codec::RequestError;

/// Every counter a worker keeps. Names double as metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    ConnectionsAccepted,
    ConnectionsClosed,
    /// Accepted and closed at once because the worker was at its connection limit.
    ConnectionsRefused,
    /// Closed without an answer by a handler (`Reply::Drop`), e.g. far over a rate limit.
    ConnectionsDropped,
    Requests,
    Responses1xx,
    Responses2xx,
    Responses3xx,
    Responses4xx,
    Responses5xx,
    TimeoutHeader,
    TimeoutBody,
    TimeoutIdle,
    TimeoutWrite,
    HandlerPanics,
    /// Read or write errors from the socket (resets, broken pipes).
    IoErrors,
    /// TLS handshakes completed.
    TlsHandshakes,
    /// Plain HTTP sent to a TLS port (answered 400 in plain HTTP).
    TlsFailedPlainHttp,
    /// Handshakes not completed within the header timeout.
    TlsFailedTimeout,
    /// Garbage, truncated or unexpected records, bad MACs, protocol violations.
    TlsFailedBadRecord,
    /// No protocol version, cipher suite, group or signature scheme in common.
    TlsFailedNoSharedParams,
    /// The client sent a fatal alert (e.g. it does not trust the certificate).
    TlsFailedPeerAlert,
    /// The client closed the connection in the middle of the handshake.
    TlsFailedClosed,
    TlsFailedOther,
    /// Connections that spoke HTTP/2 (ALPN h2, or the preface on a plain port).
    Http2Connections,
    /// HTTP/2 streams we reset for the peer's fault (malformed fields, flow control, ...).
    Http2StreamErrors,
    /// HTTP/2 connections closed with a GOAWAY error for the peer's fault.
    Http2ConnectionErrors,
    /// HTTP/2 connections closed with ENHANCE_YOUR_CALM (rapid reset, floods).
    Http2Floods,
    /// Closed at accept, before any read, because the peer is banned (`bans.rs`).
    ConnectionsBanned,
    /// Bans added (slowloris strikes, or a handler's `Reply::Drop`).
    BansAdded,
    /// Bans the nftables set (`--ban-nft-set`) did not get: its queue was full, or nft
    /// failed or was gone.
    BanNftFailures,
    /// Access-log lines written to the file.
    AccessLogLines,
    /// Access-log lines lost: the writer fell behind (the queue was full), or the write
    /// failed (a full disk).
    AccessLogLinesDropped,
    /// Reverse proxy: new connections to upstream servers.
    UpstreamConnects,
    /// Requests sent on a pooled upstream connection.
    UpstreamReuses,
    /// Upstream connections that could not be made (refused, unreachable, timed out).
    UpstreamConnectFailures,
    /// Upstream exchanges that failed: no answer, a malformed or cut-short answer, 502/504.
    UpstreamFailures,
    /// Upstream connect, first-byte or idle timeouts.
    UpstreamTimeouts,
    /// Idempotent requests sent again after a pooled connection turned out dead.
    UpstreamRetries,
}

impl Counter {
    pub const ALL: [Counter; 39] = [
        Counter::ConnectionsAccepted,
        Counter::ConnectionsClosed,
        Counter::ConnectionsRefused,
        Counter::ConnectionsDropped,
        Counter::Requests,
        Counter::Responses1xx,
        Counter::Responses2xx,
        Counter::Responses3xx,
        Counter::Responses4xx,
        Counter::Responses5xx,
        Counter::TimeoutHeader,
        Counter::TimeoutBody,
        Counter::TimeoutIdle,
        Counter::TimeoutWrite,
        Counter::HandlerPanics,
        Counter::IoErrors,
        Counter::TlsHandshakes,
        Counter::TlsFailedPlainHttp,
        Counter::TlsFailedTimeout,
        Counter::TlsFailedBadRecord,
        Counter::TlsFailedNoSharedParams,
        Counter::TlsFailedPeerAlert,
        Counter::TlsFailedClosed,
        Counter::TlsFailedOther,
        Counter::Http2Connections,
        Counter::Http2StreamErrors,
        Counter::Http2ConnectionErrors,
        Counter::Http2Floods,
        Counter::ConnectionsBanned,
        Counter::BansAdded,
        Counter::BanNftFailures,
        Counter::AccessLogLines,
        Counter::AccessLogLinesDropped,
        Counter::UpstreamConnects,
        Counter::UpstreamReuses,
        Counter::UpstreamConnectFailures,
        Counter::UpstreamFailures,
        Counter::UpstreamTimeouts,
        Counter::UpstreamRetries,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::ConnectionsAccepted => "connections_accepted",
            Counter::ConnectionsClosed => "connections_closed",
            Counter::ConnectionsRefused => "connections_refused",
            Counter::ConnectionsDropped => "connections_dropped",
            Counter::Requests => "requests",
            Counter::Responses1xx => "responses_1xx",
            Counter::Responses2xx => "responses_2xx",
            Counter::Responses3xx => "responses_3xx",
            Counter::Responses4xx => "responses_4xx",
            Counter::Responses5xx => "responses_5xx",
            Counter::TimeoutHeader => "timeouts_header",
            Counter::TimeoutBody => "timeouts_body",
            Counter::TimeoutIdle => "timeouts_idle",
            Counter::TimeoutWrite => "timeouts_write",
            Counter::HandlerPanics => "handler_panics",
            Counter::IoErrors => "io_errors",
            Counter::TlsHandshakes => "tls_handshakes",
            Counter::TlsFailedPlainHttp => "tls_handshake_failures_plain_http",
            Counter::TlsFailedTimeout => "tls_handshake_failures_timeout",
            Counter::TlsFailedBadRecord => "tls_handshake_failures_bad_record",
            Counter::TlsFailedNoSharedParams => "tls_handshake_failures_no_shared_params",
            Counter::TlsFailedPeerAlert => "tls_handshake_failures_peer_alert",
            Counter::TlsFailedClosed => "tls_handshake_failures_closed",
            Counter::TlsFailedOther => "tls_handshake_failures_other",
            Counter::Http2Connections => "http2_connections",
            Counter::Http2StreamErrors => "http2_stream_errors",
            Counter::Http2ConnectionErrors => "http2_connection_errors",
            Counter::Http2Floods => "http2_floods",
            Counter::ConnectionsBanned => "connections_banned",
            Counter::BansAdded => "bans_added",
            Counter::BanNftFailures => "ban_nft_failures",
            Counter::AccessLogLines => "access_log_lines",
            Counter::AccessLogLinesDropped => "access_log_lines_dropped",
            Counter::UpstreamConnects => "upstream_connects",
            Counter::UpstreamReuses => "upstream_reuses",
            Counter::UpstreamConnectFailures => "upstream_connect_failures",
            Counter::UpstreamFailures => "upstream_failures",
            Counter::UpstreamTimeouts => "upstream_timeouts",
            Counter::UpstreamRetries => "upstream_retries",
        }
    }

    pub fn help(self) -> &'static str {
        match self {
            Counter::ConnectionsAccepted => "TCP connections accepted",
            Counter::ConnectionsClosed => "TCP connections closed",
            Counter::ConnectionsRefused => "connections closed at once at the connection limit",
            Counter::ConnectionsDropped => "connections closed without an answer by a handler",
            Counter::Requests => "requests whose head was parsed",
            Counter::Responses1xx => "1xx responses",
            Counter::Responses2xx => "2xx responses",
            Counter::Responses3xx => "3xx responses",
            Counter::Responses4xx => "4xx responses",
            Counter::Responses5xx => "5xx responses",
            Counter::TimeoutHeader => "connections cut off for a slow request head",
            Counter::TimeoutBody => "connections cut off for a slow request body",
            Counter::TimeoutIdle => "idle keep-alive connections closed",
            Counter::TimeoutWrite => "connections closed because the client stopped reading",
            Counter::HandlerPanics => "handler panics answered with 500",
            Counter::IoErrors => "socket read/write errors",
            Counter::TlsHandshakes => "TLS handshakes completed",
            Counter::TlsFailedPlainHttp => "plain HTTP requests on a TLS port (answered 400)",
            Counter::TlsFailedTimeout => "TLS handshakes cut off by the header timeout",
            Counter::TlsFailedBadRecord => "TLS sessions failed on bad or unexpected records",
            Counter::TlsFailedNoSharedParams => {
                "TLS handshakes with no version, suite or group in common"
            }
            Counter::TlsFailedPeerAlert => "TLS sessions ended by a fatal alert from the client",
            Counter::TlsFailedClosed => "TLS handshakes the client abandoned (connection closed)",
            Counter::TlsFailedOther => "TLS sessions failed for another reason",
            Counter::Http2Connections => "connections that spoke HTTP/2",
            Counter::Http2StreamErrors => "HTTP/2 streams reset for a peer's protocol error",
            Counter::Http2ConnectionErrors => "HTTP/2 connections closed for a protocol error",
            Counter::Http2Floods => {
                "HTTP/2 connections closed for rapid reset or control-frame floods"
            }
            Counter::ConnectionsBanned => "connections from banned peers closed at accept",
            Counter::BansAdded => "peers banned (slow request heads, or dropped by a handler)",
            Counter::BanNftFailures => "bans the nftables set did not get (queue full, nft error)",
            Counter::AccessLogLines => "access-log lines written",
            Counter::AccessLogLinesDropped => {
                "access-log lines dropped (writer behind, or the write failed)"
            }
            Counter::UpstreamConnects => "new connections to upstream servers",
            Counter::UpstreamReuses => "requests sent on a pooled upstream connection",
            Counter::UpstreamConnectFailures => "upstream connections that could not be made",
            Counter::UpstreamFailures => "upstream exchanges that failed (502, 504, cut short)",
            Counter::UpstreamTimeouts => "upstream connect, first-byte or idle timeouts",
            Counter::UpstreamRetries => "idempotent requests resent after a dead pooled connection",
        }
    }
}

const N_COUNTERS: usize = Counter::ALL.len();
const N_BAD: usize = RequestError::ALL.len();

/// One worker's counters, alone on its cache lines so workers never contend. Each worker is the
/// only writer of its block, so increments are a plain load + store (no locked instruction);
/// readers sum all blocks with relaxed loads.
#[repr(align(128))]
pub struct WorkerStats {
    counters: [AtomicU64; N_COUNTERS],
    bad_requests: [AtomicU64; N_BAD],
}

impl WorkerStats {
    fn new() -> WorkerStats {
        WorkerStats {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            bad_requests: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    #[inline]
    pub fn bump(&self, c: Counter) {
        bump(&self.counters[c as usize]);
    }

    /// For a block more than one thread writes (`Stats::aux`): a locked add.
    pub fn bump_shared(&self, c: Counter) {
        self.add_shared(c, 1);
    }

    /// `n` at once, for a block more than one thread writes (`Stats::aux`).
    pub fn add_shared(&self, c: Counter, n: u64) {
        self.counters[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub fn bad_request(&self, e: RequestError) {
        bump(&self.bad_requests[e.index()]);
    }

    #[inline]
    pub fn response(&self, status: u16) {
        let c = match status {
            100..=199 => Counter::Responses1xx,
            200..=299 => Counter::Responses2xx,
            300..=399 => Counter::Responses3xx,
            400..=499 => Counter::Responses4xx,
            _ => Counter::Responses5xx,
        };
        self.bump(c);
    }
}

#[inline]
fn bump(a: &AtomicU64) {
    // Single writer: load + store is enough and avoids a locked read-modify-write.
    a.store(a.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// All workers' counters; cheap to clone, summed on demand for /statusz and /metrics.
#[derive(Clone)]
pub struct Stats {
    workers: Arc<[WorkerStats]>,
}

/// A point-in-time sum over all workers.
#[derive(Debug, Clone)]
pub struct StatsSnapshot {
    pub counters: [u64; N_COUNTERS],
    pub bad_requests: [u64; N_BAD],
}

impl StatsSnapshot {
    pub fn get(&self, c: Counter) -> u64 {
        self.counters[c as usize]
    }

    pub fn bad(&self, e: RequestError) -> u64 {
        self.bad_requests[e.index()]
    }

    pub fn open_connections(&self) -> u64 {
        self.get(Counter::ConnectionsAccepted)
            .saturating_sub(self.get(Counter::ConnectionsClosed))
    }
}

impl Stats {
    pub fn new(workers: usize) -> Stats {
        Stats {
            // One block more than workers: `aux`, for a thread that is not a worker.
            workers: (0..workers.max(1) + 1)
                .map(|_| WorkerStats::new())
                .collect(),
        }
    }

    /// The block for threads that are not workers (the nftables ban feeder); they count
    /// with `bump_shared`, since there may be several.
    pub fn aux(&self) -> &WorkerStats {
        &self.workers[self.workers.len() - 1]
    }

    pub fn worker(&self, id: usize) -> &WorkerStats {
        &self.workers[id]
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot {
            counters: [0; N_COUNTERS],
            bad_requests: [0; N_BAD],
        };
        for w in self.workers.iter() {
            for (sum, c) in s.counters.iter_mut().zip(&w.counters) {
                *sum += c.load(Ordering::Relaxed);
            }
            for (sum, c) in s.bad_requests.iter_mut().zip(&w.bad_requests) {
                *sum += c.load(Ordering::Relaxed);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_sums_workers() {
        let stats = Stats::new(3);
        stats.worker(0).bump(Counter::Requests);
        stats.worker(2).bump(Counter::Requests);
        stats.worker(1).response(404);
        stats.worker(1).bad_request(RequestError::BareLf);
        stats.aux().bump_shared(Counter::Requests);
        let s = stats.snapshot();
        assert_eq!(s.get(Counter::Requests), 3);
        assert_eq!(s.get(Counter::Responses4xx), 1);
        assert_eq!(s.bad(RequestError::BareLf), 1);
    }

    #[test]
    fn worker_blocks_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<WorkerStats>() >= 128);
        assert_eq!(std::mem::size_of::<WorkerStats>() % 128, 0);
    }
}
