use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tern_codec::RequestError;

pub use crate::handler::SiteSlot;

/// Every counter a worker keeps besides the answers (counted per site, [`SiteSlot`]).
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
    /// Requests sent to the next server after a connect failure.
    UpstreamRetriesConnect,
    /// Idempotent requests sent to the next server after a 502, 503 or 504 answer.
    UpstreamRetriesStatus,
    /// WebSocket tunnels through the reverse proxy (an upstream's `101`), by the client's
    /// protocol: an HTTP/1.1 upgrade or an HTTP/2 extended CONNECT (RFC 8441); and those that
    /// ended (both protocols).
    WebsocketTunnelsOpenedHttp1,
    WebsocketTunnelsOpenedHttp2,
    WebsocketTunnelsClosed,
    /// TLS handshakes with upstream servers that succeeded.
    UpstreamTlsHandshakes,
    /// TLS handshakes with upstream servers that failed, by cause (`Counter::upstream_tls_failure`).
    UpstreamTlsFailUnknownCa,
    UpstreamTlsFailNameMismatch,
    UpstreamTlsFailExpired,
    UpstreamTlsFailOther,
    /// Answers compressed on the fly, by coding (`Counter::compressed`).
    CompressedGzip,
    CompressedBr,
    CompressedZstd,
    /// Body bytes those answers had before compression, by coding.
    CompressInGzip,
    CompressInBr,
    CompressInZstd,
    /// Bytes they had after, by coding.
    CompressOutGzip,
    CompressOutBr,
    CompressOutZstd,
    /// Requests a route's `rate_limit` refused (429).
    RateLimited,
    /// Answers whose encoder failed (out of memory): cut short, or sent uncompressed when
    /// nothing had gone out yet.
    CompressionFailures,
}

impl Counter {
    pub const ALL: [Counter; 55] = [
        Counter::ConnectionsAccepted,
        Counter::ConnectionsClosed,
        Counter::ConnectionsRefused,
        Counter::ConnectionsDropped,
        Counter::Requests,
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
        Counter::UpstreamRetriesConnect,
        Counter::UpstreamRetriesStatus,
        Counter::WebsocketTunnelsOpenedHttp1,
        Counter::WebsocketTunnelsOpenedHttp2,
        Counter::WebsocketTunnelsClosed,
        Counter::UpstreamTlsHandshakes,
        Counter::UpstreamTlsFailUnknownCa,
        Counter::UpstreamTlsFailNameMismatch,
        Counter::UpstreamTlsFailExpired,
        Counter::UpstreamTlsFailOther,
        Counter::CompressedGzip,
        Counter::CompressedBr,
        Counter::CompressedZstd,
        Counter::CompressInGzip,
        Counter::CompressInBr,
        Counter::CompressInZstd,
        Counter::CompressOutGzip,
        Counter::CompressOutBr,
        Counter::CompressOutZstd,
        Counter::RateLimited,
        Counter::CompressionFailures,
    ];

    /// The counters of one coding: answers, bytes in, bytes out.
    pub fn compressed(encoding: tern_compress::Encoding) -> [Counter; 3] {
        use tern_compress::Encoding;
        match encoding {
            Encoding::Gzip => [
                Counter::CompressedGzip,
                Counter::CompressInGzip,
                Counter::CompressOutGzip,
            ],
            Encoding::Br => [
                Counter::CompressedBr,
                Counter::CompressInBr,
                Counter::CompressOutBr,
            ],
            Encoding::Zstd => [
                Counter::CompressedZstd,
                Counter::CompressInZstd,
                Counter::CompressOutZstd,
            ],
        }
    }

    /// The metric's name: several counters share one, told apart by [`Counter::label`]
    /// (a cause, a kind of timeout). Prometheus's page adds `_total`.
    pub fn name(self) -> &'static str {
        match self {
            Counter::ConnectionsAccepted => "connections_accepted",
            Counter::ConnectionsClosed => "connections_closed",
            Counter::ConnectionsRefused => "connections_refused",
            Counter::ConnectionsDropped => "connections_dropped",
            Counter::Requests => "requests",
            Counter::TimeoutHeader
            | Counter::TimeoutBody
            | Counter::TimeoutIdle
            | Counter::TimeoutWrite => "timeouts",
            Counter::HandlerPanics => "handler_panics",
            Counter::IoErrors => "io_errors",
            Counter::TlsHandshakes => "tls_handshakes",
            Counter::TlsFailedPlainHttp
            | Counter::TlsFailedTimeout
            | Counter::TlsFailedBadRecord
            | Counter::TlsFailedNoSharedParams
            | Counter::TlsFailedPeerAlert
            | Counter::TlsFailedClosed
            | Counter::TlsFailedOther => "tls_handshake_failures",
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
            Counter::UpstreamRetries
            | Counter::UpstreamRetriesConnect
            | Counter::UpstreamRetriesStatus => "upstream_retries",
            Counter::WebsocketTunnelsOpenedHttp1 | Counter::WebsocketTunnelsOpenedHttp2 => {
                "websocket_tunnels_opened"
            }
            Counter::WebsocketTunnelsClosed => "websocket_tunnels_closed",
            Counter::UpstreamTlsHandshakes => "upstream_tls_handshakes",
            Counter::UpstreamTlsFailUnknownCa
            | Counter::UpstreamTlsFailNameMismatch
            | Counter::UpstreamTlsFailExpired
            | Counter::UpstreamTlsFailOther => "upstream_tls_failures",
            Counter::CompressedGzip | Counter::CompressedBr | Counter::CompressedZstd => {
                "compressed_answers"
            }
            Counter::CompressInGzip | Counter::CompressInBr | Counter::CompressInZstd => {
                "compression_bytes_in"
            }
            Counter::CompressOutGzip | Counter::CompressOutBr | Counter::CompressOutZstd => {
                "compression_bytes_out"
            }
            Counter::RateLimited => "rate_limited",
            Counter::CompressionFailures => "compression_failures",
        }
    }

    /// The failure counter for a cause named by `tern_tls::upstream::failure_cause`.
    pub fn upstream_tls_failure(cause: &str) -> Counter {
        match cause {
            "unknown_ca" => Counter::UpstreamTlsFailUnknownCa,
            "name_mismatch" => Counter::UpstreamTlsFailNameMismatch,
            "expired" => Counter::UpstreamTlsFailExpired,
            _ => Counter::UpstreamTlsFailOther,
        }
    }

    /// The label that tells this counter from the others of its [`Counter::name`].
    pub fn label(self) -> Option<(&'static str, &'static str)> {
        let (key, value) = match self {
            Counter::TimeoutHeader => ("kind", "header"),
            Counter::TimeoutBody => ("kind", "body"),
            Counter::TimeoutIdle => ("kind", "idle"),
            Counter::TimeoutWrite => ("kind", "write"),
            Counter::TlsFailedPlainHttp => ("cause", "plain_http"),
            Counter::TlsFailedTimeout => ("cause", "timeout"),
            Counter::TlsFailedBadRecord => ("cause", "bad_record"),
            Counter::TlsFailedNoSharedParams => ("cause", "no_shared_params"),
            Counter::TlsFailedPeerAlert => ("cause", "peer_alert"),
            Counter::TlsFailedClosed => ("cause", "closed"),
            Counter::TlsFailedOther => ("cause", "other"),
            Counter::UpstreamRetries => ("cause", "stale_connection"),
            Counter::UpstreamRetriesConnect => ("cause", "connect"),
            Counter::UpstreamRetriesStatus => ("cause", "status"),
            Counter::UpstreamTlsFailUnknownCa => ("cause", "unknown_ca"),
            Counter::UpstreamTlsFailNameMismatch => ("cause", "name_mismatch"),
            Counter::UpstreamTlsFailExpired => ("cause", "expired"),
            Counter::UpstreamTlsFailOther => ("cause", "other"),
            Counter::WebsocketTunnelsOpenedHttp1 => ("protocol", "http1"),
            Counter::WebsocketTunnelsOpenedHttp2 => ("protocol", "http2"),
            Counter::CompressedGzip | Counter::CompressInGzip | Counter::CompressOutGzip => {
                ("encoding", "gzip")
            }
            Counter::CompressedBr | Counter::CompressInBr | Counter::CompressOutBr => {
                ("encoding", "br")
            }
            Counter::CompressedZstd | Counter::CompressInZstd | Counter::CompressOutZstd => {
                ("encoding", "zstd")
            }
            _ => return None,
        };
        Some((key, value))
    }

    /// The help line of the counter's name (the same for every label).
    pub fn help(self) -> &'static str {
        match self {
            Counter::ConnectionsAccepted => "TCP connections accepted",
            Counter::ConnectionsClosed => "TCP connections closed",
            Counter::ConnectionsRefused => "connections closed at once at the connection limit",
            Counter::ConnectionsDropped => "connections closed without an answer by a handler",
            Counter::Requests => "requests whose head was parsed",
            Counter::TimeoutHeader
            | Counter::TimeoutBody
            | Counter::TimeoutIdle
            | Counter::TimeoutWrite => {
                "connections closed by a timeout: slow request head or body, idle keep-alive, \
                 a client that stopped reading (write)"
            }
            Counter::HandlerPanics => "handler panics answered with 500",
            Counter::IoErrors => "socket read/write errors",
            Counter::TlsHandshakes => "TLS handshakes completed",
            Counter::TlsFailedPlainHttp
            | Counter::TlsFailedTimeout
            | Counter::TlsFailedBadRecord
            | Counter::TlsFailedNoSharedParams
            | Counter::TlsFailedPeerAlert
            | Counter::TlsFailedClosed
            | Counter::TlsFailedOther => "TLS sessions that failed, by cause",
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
            Counter::UpstreamRetries
            | Counter::UpstreamRetriesConnect
            | Counter::UpstreamRetriesStatus => {
                "requests sent again: on a new connection after a dead pooled one \
                 (stale_connection), to the next server after a connect failure (connect) or \
                 a 502/503/504 answer (status)"
            }
            Counter::WebsocketTunnelsOpenedHttp1 | Counter::WebsocketTunnelsOpenedHttp2 => {
                "WebSocket tunnels opened to upstreams, by the client's protocol: an HTTP/1.1 \
                 upgrade (http1) or an HTTP/2 extended CONNECT (http2)"
            }
            Counter::WebsocketTunnelsClosed => "WebSocket tunnels to upstreams that ended",
            Counter::UpstreamTlsHandshakes => "TLS handshakes with upstream servers",
            Counter::UpstreamTlsFailUnknownCa
            | Counter::UpstreamTlsFailNameMismatch
            | Counter::UpstreamTlsFailExpired
            | Counter::UpstreamTlsFailOther => {
                "failed TLS handshakes with upstream servers, by cause (a certificate from an \
                 unknown CA, for another name, expired; other)"
            }
            Counter::CompressedGzip | Counter::CompressedBr | Counter::CompressedZstd => {
                "answers compressed on the fly, by coding"
            }
            Counter::CompressInGzip | Counter::CompressInBr | Counter::CompressInZstd => {
                "body bytes of answers compressed on the fly, before compression"
            }
            Counter::CompressOutGzip | Counter::CompressOutBr | Counter::CompressOutZstd => {
                "body bytes of answers compressed on the fly, after compression"
            }
            Counter::RateLimited => "requests a route's rate_limit refused with 429",
            Counter::CompressionFailures => {
                "answers whose encoder failed (out of memory): cut short, or sent as they are"
            }
        }
    }
}

const N_COUNTERS: usize = Counter::ALL.len();
const N_BAD: usize = RequestError::ALL.len();

/// How many sites get figures of their own (answers by class, a duration histogram): a row
/// each in every worker's block, fixed at start so the request path never allocates. Slot 0
/// is for answers no site took (a server without sites, bad input, a misdirected host);
/// sites past the last slot share it ([`OTHER_SITES`]), which bounds the label's values.
pub const MAX_SITES: usize = 64;

/// The name the last slot reports when more than `MAX_SITES - 2` sites were named.
pub const OTHER_SITES: &str = "_other";

/// The upper bounds of the request-duration histogram's buckets: microseconds, and the same
/// in seconds as Prometheus's `le` label shows it. One more bucket counts the rest (`+Inf`).
pub const DURATION_BOUNDS: [(u64, &str); 16] = [
    (100, "0.0001"),
    (250, "0.00025"),
    (500, "0.0005"),
    (1_000, "0.001"),
    (2_500, "0.0025"),
    (5_000, "0.005"),
    (10_000, "0.01"),
    (25_000, "0.025"),
    (50_000, "0.05"),
    (100_000, "0.1"),
    (250_000, "0.25"),
    (500_000, "0.5"),
    (1_000_000, "1"),
    (2_500_000, "2.5"),
    (5_000_000, "5"),
    (10_000_000, "10"),
];

/// Buckets of the duration histogram: one per bound, and `+Inf`.
pub const DURATION_BUCKETS: usize = DURATION_BOUNDS.len() + 1;

/// Answers are counted by class: 1xx to 5xx.
pub const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// What an answer is counted under: its site, and when its request was complete (the
/// worker clock's microseconds), for the duration histogram. One word (the site in the top
/// 16 bits, 48 bits of microseconds: 8.9 years of uptime), since every connection's state
/// carries one and an idle connection must stay small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally(u64);

const START_BITS: u32 = 48;
const START_MASK: u64 = (1 << START_BITS) - 1;

impl Tally {
    pub fn starting(start_us: u64) -> Tally {
        Tally::new(SiteSlot::NONE, start_us)
    }

    pub fn new(site: SiteSlot, start_us: u64) -> Tally {
        Tally(u64::from(site.0) << START_BITS | (start_us & START_MASK))
    }

    pub fn site(self) -> SiteSlot {
        SiteSlot((self.0 >> START_BITS) as u16)
    }

    pub fn start_us(self) -> u64 {
        self.0 & START_MASK
    }

    pub fn set_site(&mut self, site: SiteSlot) {
        *self = Tally::new(site, self.start_us());
    }
}

/// One site's figures in one worker's block.
struct SiteRow {
    classes: [AtomicU64; STATUS_CLASSES.len()],
    buckets: [AtomicU64; DURATION_BUCKETS],
    sum_us: AtomicU64,
}

impl SiteRow {
    fn new() -> SiteRow {
        SiteRow {
            classes: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

/// One worker's counters, alone on its cache lines so workers never contend. Each worker is the
/// only writer of its block, so increments are a plain load + store (no locked instruction);
/// readers sum all blocks with relaxed loads.
#[repr(align(128))]
pub struct WorkerStats {
    counters: [AtomicU64; N_COUNTERS],
    bad_requests: [AtomicU64; N_BAD],
    sites: [SiteRow; MAX_SITES],
}

impl WorkerStats {
    fn new() -> WorkerStats {
        WorkerStats {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            bad_requests: std::array::from_fn(|_| AtomicU64::new(0)),
            sites: std::array::from_fn(|_| SiteRow::new()),
        }
    }

    #[inline]
    pub fn bump(&self, c: Counter) {
        bump(&self.counters[c as usize]);
    }

    /// `n` at once (single writer, like `bump`).
    #[inline]
    pub fn add(&self, c: Counter, n: u64) {
        add(&self.counters[c as usize], n);
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

    /// An answer with `status` went out at `now_us` (the worker clock's microseconds): its
    /// class and its duration are counted in its site's row. Three single-writer increments.
    #[inline]
    pub(crate) fn answered(&self, status: u16, tally: Tally, now_us: u64) {
        let row = &self.sites[tally.site().index(MAX_SITES)];
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        bump(&row.classes[class]);
        let us = (now_us & START_MASK).saturating_sub(tally.start_us());
        bump(&row.buckets[duration_bucket(us)]);
        add(&row.sum_us, us);
    }
}

/// The bucket of a duration: the first whose bound it does not exceed. Most answers are
/// quick, so a scan from the smallest bound ends after a few compares.
#[inline]
fn duration_bucket(us: u64) -> usize {
    DURATION_BOUNDS
        .iter()
        .position(|&(bound, _)| us <= bound)
        .unwrap_or(DURATION_BOUNDS.len())
}

#[inline]
fn bump(a: &AtomicU64) {
    add(a, 1);
}

#[inline]
fn add(a: &AtomicU64, n: u64) {
    // Single writer: load + store is enough and avoids a locked read-modify-write.
    a.store(a.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// All workers' counters; cheap to clone, summed on demand for /statusz and /metrics.
#[derive(Clone)]
pub struct Stats {
    workers: Arc<[WorkerStats]>,
    /// The sites' names by slot (slot 0, no site, is ""), in the order they were first
    /// named; only start-up, reloads and the pages take the lock.
    sites: Arc<Mutex<Vec<String>>>,
}

/// One site's figures summed over the workers.
#[derive(Debug, Clone)]
pub struct SiteFigures {
    /// "" for answers no site took.
    pub name: String,
    /// Answers by class ([`STATUS_CLASSES`]).
    pub responses: [u64; STATUS_CLASSES.len()],
    /// Answers by duration: bucket i holds those above bound i - 1 up to bound i
    /// ([`DURATION_BOUNDS`]), the last those above every bound. Not cumulative.
    pub buckets: [u64; DURATION_BUCKETS],
    /// The durations' sum in microseconds.
    pub sum_us: u64,
}

/// A point-in-time sum over all workers.
#[derive(Debug, Clone)]
pub struct StatsSnapshot {
    pub counters: [u64; N_COUNTERS],
    pub bad_requests: [u64; N_BAD],
    /// Slot 0 (no site) first, then every site named so far, in slot order.
    pub sites: Vec<SiteFigures>,
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

    /// Answers of status class `class` (1 to 5) over every site.
    pub fn responses(&self, class: usize) -> u64 {
        self.sites.iter().map(|s| s.responses[class - 1]).sum()
    }
}

impl Stats {
    pub fn new(workers: usize) -> Stats {
        Stats {
            // One block more than workers: `aux`, for a thread that is not a worker.
            workers: (0..workers.max(1) + 1)
                .map(|_| WorkerStats::new())
                .collect(),
            sites: Arc::new(Mutex::new(vec![String::new()])),
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

    /// The slot of the site called `name`: the one it had if it was named before (a reload
    /// keeps a site's figures), else the next free one; once all are taken, the shared last
    /// one, reported as [`OTHER_SITES`]. Not for the request path (it takes a lock).
    pub fn site(&self, name: &str) -> SiteSlot {
        let mut names = self.sites.lock().unwrap_or_else(|p| p.into_inner());
        let index = match names.iter().position(|n| n == name) {
            Some(i) => i,
            _ if names.len() < MAX_SITES - 1 => {
                names.push(name.to_owned());
                names.len() - 1
            }
            _ => {
                if names.len() < MAX_SITES {
                    names.push(OTHER_SITES.to_owned());
                }
                MAX_SITES - 1
            }
        };
        SiteSlot(index as u16)
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let names = self.sites.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut s = StatsSnapshot {
            counters: [0; N_COUNTERS],
            bad_requests: [0; N_BAD],
            sites: names
                .into_iter()
                .map(|name| SiteFigures {
                    name,
                    responses: [0; STATUS_CLASSES.len()],
                    buckets: [0; DURATION_BUCKETS],
                    sum_us: 0,
                })
                .collect(),
        };
        for w in self.workers.iter() {
            for (sum, c) in s.counters.iter_mut().zip(&w.counters) {
                *sum += c.load(Ordering::Relaxed);
            }
            for (sum, c) in s.bad_requests.iter_mut().zip(&w.bad_requests) {
                *sum += c.load(Ordering::Relaxed);
            }
            for (figures, row) in s.sites.iter_mut().zip(&w.sites) {
                for (sum, c) in figures.responses.iter_mut().zip(&row.classes) {
                    *sum += c.load(Ordering::Relaxed);
                }
                for (sum, c) in figures.buckets.iter_mut().zip(&row.buckets) {
                    *sum += c.load(Ordering::Relaxed);
                }
                figures.sum_us += row.sum_us.load(Ordering::Relaxed);
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
        stats.worker(1).answered(404, Tally::starting(0), 10);
        stats.worker(1).bad_request(RequestError::BareLf);
        stats.aux().bump_shared(Counter::Requests);
        let s = stats.snapshot();
        assert_eq!(s.get(Counter::Requests), 3);
        assert_eq!(s.responses(4), 1);
        assert_eq!(s.responses(2), 0);
        assert_eq!(s.bad(RequestError::BareLf), 1);
    }

    #[test]
    fn answers_are_counted_per_site_with_their_duration() {
        let stats = Stats::new(2);
        let a = stats.site("a");
        let b = stats.site("b");
        assert_eq!(stats.site("a"), a, "a site named again keeps its slot");
        let at = Tally::new;
        stats.worker(0).answered(200, at(a, 1_000), 1_050); // 50 µs: the first bucket
        stats.worker(1).answered(200, at(a, 1_000), 1_100); // on the bound: still the first
        stats.worker(1).answered(503, at(a, 0), 20_000_000); // past every bound
        stats.worker(0).answered(301, at(b, 0), 3_000); // 3 ms: (2.5 ms, 5 ms]
        stats.worker(0).answered(400, Tally::starting(0), 0);
        let s = stats.snapshot();
        let names: Vec<&str> = s.sites.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["", "a", "b"]);
        let (none, a, b) = (&s.sites[0], &s.sites[1], &s.sites[2]);
        assert_eq!(a.responses, [0, 2, 0, 0, 1]);
        assert_eq!(a.buckets[0], 2);
        assert_eq!(a.buckets[DURATION_BUCKETS - 1], 1);
        assert_eq!(a.buckets.iter().sum::<u64>(), 3);
        assert_eq!(a.sum_us, 50 + 100 + 20_000_000);
        assert_eq!(b.responses, [0, 0, 1, 0, 0]);
        assert_eq!(b.buckets[5], 1);
        assert_eq!(none.responses, [0, 0, 0, 1, 0]);
        assert_eq!(s.responses(2), 2);
    }

    #[test]
    fn a_tally_keeps_its_site_and_start() {
        let mut t = Tally::new(SiteSlot(63), START_MASK);
        assert_eq!((t.site(), t.start_us()), (SiteSlot(63), START_MASK));
        t.set_site(SiteSlot(5));
        assert_eq!((t.site(), t.start_us()), (SiteSlot(5), START_MASK));
        assert_eq!(Tally::starting(42).site(), SiteSlot::NONE);
        assert_eq!(std::mem::size_of::<Tally>(), 8);
    }

    #[test]
    fn odd_statuses_fall_into_the_nearest_class() {
        let stats = Stats::new(1);
        stats.worker(0).answered(99, Tally::starting(0), 0);
        stats.worker(0).answered(600, Tally::starting(0), 0);
        let s = stats.snapshot();
        assert_eq!(s.sites[0].responses, [1, 0, 0, 0, 1]);
    }

    #[test]
    fn site_slots_are_bounded_and_the_rest_share_one() {
        let stats = Stats::new(1);
        let slots: Vec<SiteSlot> = (0..MAX_SITES + 10)
            .map(|i| stats.site(&format!("site{i}")))
            .collect();
        let other = SiteSlot((MAX_SITES - 1) as u16);
        assert_eq!(slots[MAX_SITES - 3], SiteSlot((MAX_SITES - 2) as u16));
        assert!(slots[MAX_SITES - 2..].iter().all(|&s| s == other));
        stats.worker(0).answered(200, Tally::new(other, 0), 0);
        let s = stats.snapshot();
        assert_eq!(s.sites.len(), MAX_SITES);
        assert_eq!(s.sites[MAX_SITES - 1].name, OTHER_SITES);
        assert_eq!(s.sites[MAX_SITES - 1].responses[1], 1);
    }

    #[test]
    fn bounds_rise_and_their_labels_say_the_same_in_seconds() {
        for pair in DURATION_BOUNDS.windows(2) {
            assert!(pair[0].0 < pair[1].0);
        }
        for (us, le) in DURATION_BOUNDS {
            assert_eq!(le.parse::<f64>().unwrap(), us as f64 / 1e6, "{le}");
        }
        assert_eq!(duration_bucket(0), 0);
        assert_eq!(duration_bucket(101), 1);
        assert_eq!(duration_bucket(10_000_000), DURATION_BOUNDS.len() - 1);
        assert_eq!(duration_bucket(10_000_001), DURATION_BOUNDS.len());
    }

    /// Counts the allocations of the thread that asks for it, so that the request path's
    /// share of the counting can be shown to allocate nothing.
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        pub struct Counting;

        thread_local! {
            pub static ALLOCATIONS: Cell<Option<u64>> = const { Cell::new(None) };
        }

        // SAFETY: every call is forwarded unchanged to the system allocator; counting is a
        // side effect on a const-initialised thread-local (no allocation, no destructor).
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let _ = ALLOCATIONS.try_with(|c| c.set(c.get().map(|n| n + 1)));
                // SAFETY: the caller's layout contract is passed on as is.
                unsafe { System.alloc(layout) }
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: `ptr` came from `System.alloc` above with this layout.
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        #[global_allocator]
        static GLOBAL: Counting = Counting;
    }

    #[test]
    fn counting_an_answer_allocates_nothing() {
        let stats = Stats::new(2);
        let site = stats.site("blog");
        let worker = stats.worker(1);
        counting::ALLOCATIONS.with(|c| c.set(Some(0)));
        drop(std::hint::black_box(Box::new(7u64)));
        let control = counting::ALLOCATIONS.with(|c| c.replace(Some(0)));
        assert_eq!(
            control,
            Some(1),
            "the allocator counts this thread's allocations"
        );
        for i in 0..10_000u64 {
            let status = [200, 304, 404, 503][i as usize % 4];
            worker.answered(status, Tally::new(site, i), i * 3);
        }
        let allocations = counting::ALLOCATIONS.with(|c| c.replace(None));
        assert_eq!(allocations, Some(0));
        assert_eq!(
            stats.snapshot().sites[1].buckets.iter().sum::<u64>(),
            10_000
        );
    }

    #[test]
    fn worker_blocks_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<WorkerStats>() >= 128);
        assert_eq!(std::mem::size_of::<WorkerStats>() % 128, 0);
    }
}
